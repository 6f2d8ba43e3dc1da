#include "policies/http_head.h"

#include <ctype.h>
#include <errno.h>
#include <string.h>
#include <strings.h>

#define MAX_FIELDS 256
#define MAX_LENGTH_DIGITS 18 /* fits an int64 with room: no overflow games */

/* RFC 9110 5.6.2 tchar. */
static bool is_tchar(unsigned char c)
{
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
        (c >= '0' && c <= '9'))
        return true;
    return c && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

static bool is_token(const char *s, size_t n)
{
    if (n == 0)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!is_tchar((unsigned char)s[i]))
            return false;
    return true;
}

bool http_method_is_token(const char *s, size_t n)
{
    return is_token(s, n);
}

bool http_header_name_valid(const char *s, size_t n)
{
    return is_token(s, n);
}

bool http_header_value_valid(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if ((c < 0x20 && c != '\t') || c == 0x7f)
            return false;
    }
    return true;
}

/* Visible ASCII only: a space, a control character or a raw non-ASCII
 * byte in a target is read differently by different parsers. */
static bool target_chars_valid(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c <= 0x20 || c >= 0x7f)
            return false;
    }
    return true;
}

static size_t scheme_len(const char *s, size_t n)
{
    if (n >= 7 && strncasecmp(s, "http://", 7) == 0)
        return 7;
    if (n >= 8 && strncasecmp(s, "https://", 8) == 0)
        return 8;
    return 0;
}

enum http_target_form http_target_form(const char *s, size_t n)
{
    size_t k;

    if (n == 0 || !target_chars_valid(s, n))
        return HTTP_TARGET_INVALID;
    if (s[0] == '/')
        return HTTP_TARGET_ORIGIN;
    k = scheme_len(s, n);
    /* An absolute-form target needs an authority ("http:///x" has none). */
    if (k && k < n && s[k] != '/' && s[k] != '?')
        return HTTP_TARGET_ABSOLUTE;
    return HTTP_TARGET_INVALID;
}

bool http_version_valid(const char *s, size_t n)
{
    return n == 8 && memcmp(s, "HTTP/1.", 7) == 0 && s[7] >= '0' && s[7] <= '9';
}

static bool name_is(const struct http_field *f, const char *name)
{
    size_t n = strlen(name);
    return f->name_len == n && strncasecmp(f->name, name, n) == 0;
}

/* Content-Length = 1*DIGIT; a sign, a list or spaces inside are refused
 * (a "+5" or "5, 6" is exactly where parsers disagree). */
static bool length_valid(const char *s, size_t n)
{
    if (n == 0 || n > MAX_LENGTH_DIGITS)
        return false;
    for (size_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9')
            return false;
    return true;
}

struct framing {
    const struct http_field *cl; /* the first Content-Length */
    unsigned n_te, n_host;
};

static int check_field(const struct http_field *f, struct framing *fr,
                       struct sc_error *err)
{
    if (!http_header_name_valid(f->name, f->name_len)) {
        /* A colon inside a name is what a folded line leaves behind in a
         * parser that glues continuation lines onto the name. */
        if (memchr(f->name, ':', f->name_len))
            sc_error_set(err, "obsolete line folding");
        else
            sc_error_set(err, "invalid header name \"%.*s\"",
                         (int)(f->name_len > 40 ? 40 : f->name_len), f->name);
        return -EINVAL;
    }
    if (!http_header_value_valid(f->value, f->value_len)) {
        sc_error_set(err, "NUL, CR, LF or a control character in header %.*s",
                     (int)(f->name_len > 40 ? 40 : f->name_len), f->name);
        return -EINVAL;
    }
    if (name_is(f, "Content-Length")) {
        if (!length_valid(f->value, f->value_len)) {
            sc_error_set(err, "invalid Content-Length");
            return -EINVAL;
        }
        /* Even two equal ones: RFC 9110 8.6 lets a recipient merge them,
         * but a next hop that keeps the first of "5" and "5 " or reads a
         * list differently is where smuggling starts. One field only. */
        if (fr->cl) {
            sc_error_set(err, "more than one Content-Length");
            return -EINVAL;
        }
        fr->cl = f;
    } else if (name_is(f, "Transfer-Encoding")) {
        if (fr->n_te++ || f->value_len != 7 ||
            strncasecmp(f->value, "chunked", 7) != 0) {
            sc_error_set(err, "unsupported Transfer-Encoding");
            return -EINVAL;
        }
    } else if (name_is(f, "Host")) {
        fr->n_host++;
    }
    return 0;
}

static int check_fields(const struct http_head *h, struct sc_error *err)
{
    struct framing fr = {0};
    bool v11 = h->version_len == 8 && h->version[7] != '0';

    for (size_t i = 0; i < h->n_fields; i++)
        if (check_field(&h->fields[i], &fr, err) != 0)
            return -EINVAL;
    if (fr.cl && fr.n_te) {
        sc_error_set(err, "Transfer-Encoding together with Content-Length");
        return -EINVAL;
    }
    /* RFC 9112 6.1: an HTTP/1.0 message with Transfer-Encoding has faulty
     * framing (1.0 has no chunked coding; a 1.0 hop would read the chunk
     * lines as the body). */
    if (fr.n_te && !v11) {
        sc_error_set(err, "Transfer-Encoding in an HTTP/1.0 request");
        return -EINVAL;
    }
    /* RFC 9112 3.2: exactly one Host in HTTP/1.1, never two. */
    if (fr.n_host > 1 || (v11 && fr.n_host == 0)) {
        sc_error_set(err, fr.n_host ? "more than one Host header"
                                    : "HTTP/1.1 request without a Host header");
        return -EINVAL;
    }
    return 0;
}

int http_head_check(const struct http_head *h, struct sc_error *err)
{
    if (!http_method_is_token(h->method, h->method_len)) {
        sc_error_set(err, "the method is not a token");
        return -EINVAL;
    }
    if (http_target_form(h->target, h->target_len) == HTTP_TARGET_INVALID) {
        sc_error_set(err, "the request-target is neither origin-form nor "
                          "absolute-form");
        return -EINVAL;
    }
    if (!http_version_valid(h->version, h->version_len)) {
        sc_error_set(err, "the version is not HTTP/1.x");
        return -EINVAL;
    }
    return check_fields(h, err);
}

/* ---- chunked request bodies ---------------------------------------------- */

static size_t skip_bws(const char *s, size_t n, size_t i)
{
    while (i < n && (s[i] == ' ' || s[i] == '\t'))
        i++;
    return i;
}

static size_t skip_token(const char *s, size_t n, size_t i)
{
    while (i < n && is_tchar((unsigned char)s[i]))
        i++;
    return i;
}

/* RFC 9110 5.6.4: DQUOTE *( qdtext / quoted-pair ) DQUOTE; the index after
 * it, or 0 when s[i..] is not one. */
static size_t skip_quoted(const char *s, size_t n, size_t i)
{
    if (i >= n || s[i] != '"')
        return 0;
    for (i++; i < n; i++) {
        unsigned char c = (unsigned char)s[i];

        if (c == '"')
            return i + 1;
        if (c == '\\' && i + 1 < n)
            c = (unsigned char)s[++i];
        if ((c < 0x20 && c != '\t') || c == 0x7f)
            return 0;
    }
    return 0;
}

bool http_chunk_ext_valid(const char *s, size_t n)
{
    size_t i = skip_bws(s, n, 0), k;

    while (i < n) {
        if (s[i] != ';')
            return false;
        i = skip_bws(s, n, i + 1);
        if ((k = skip_token(s, n, i)) == i)
            return false; /* an empty name */
        i = skip_bws(s, n, k);
        if (i < n && s[i] == '=') {
            i = skip_bws(s, n, i + 1);
            k = skip_token(s, n, i);
            if (k == i && !(k = skip_quoted(s, n, i)))
                return false;
            i = skip_bws(s, n, k);
        }
    }
    return true;
}

/* [ [CR] LF ] 1*HEXDIG: where the extensions start, or 0 when g is not so. */
static size_t chunk_ext_start(const char *g, size_t n, bool crlf_optional)
{
    size_t i = 0, digits;

    if (i < n && g[i] == '\r')
        i++;
    if (i < n && g[i] == '\n')
        i++;
    else if (i || !crlf_optional)
        return 0;
    for (digits = i; i < n && isxdigit((unsigned char)g[i]); i++)
        ;
    return i > digits && i - digits <= 16 ? i : 0;
}

int http_chunk_gap_check(const char *gap, size_t n, bool crlf_optional, struct sc_error *err)
{
    size_t ext, end;

    if (n == 0)
        return 0;
    if (gap[n - 1] != '\n' || !(ext = chunk_ext_start(gap, n, crlf_optional)))
        return -EPROTO;
    end = n - 1;
    if (end > ext && gap[end - 1] == '\r')
        end--;
    if (!http_chunk_ext_valid(gap + ext, end - ext)) {
        sc_error_set(err, "a malformed chunk extension");
        return -EINVAL;
    }
    return 0;
}

/* ---- from raw bytes ----------------------------------------------------- */

/* The next line of raw[*pos..len), without its CRLF or LF; false when no
 * line end is left. */
static bool next_line(const char *raw, size_t len, size_t *pos,
                      const char **line, size_t *n)
{
    const char *lf = memchr(raw + *pos, '\n', len - *pos);

    if (!lf)
        return false;
    *line = raw + *pos;
    *n = (size_t)(lf - *line);
    if (*n && (*line)[*n - 1] == '\r')
        (*n)--;
    *pos = (size_t)(lf - raw) + 1;
    return true;
}

/* "method SP request-target SP HTTP-version", single spaces. */
static int split_request_line(const char *l, size_t n, struct http_head *h,
                              struct sc_error *err)
{
    const char *sp1 = memchr(l, ' ', n), *sp2;

    sp2 = sp1 ? memchr(sp1 + 1, ' ', n - (size_t)(sp1 + 1 - l)) : NULL;
    if (!sp1 || !sp2) {
        sc_error_set(err, "the request line is not \"method target version\"");
        return -EINVAL;
    }
    h->method = l;
    h->method_len = (size_t)(sp1 - l);
    h->target = sp1 + 1;
    h->target_len = (size_t)(sp2 - sp1 - 1);
    h->version = sp2 + 1;
    h->version_len = n - (size_t)(sp2 + 1 - l);
    return 0;
}

static void trim_ows(const char **s, size_t *n)
{
    while (*n && (**s == ' ' || **s == '\t')) {
        (*s)++;
        (*n)--;
    }
    while (*n && ((*s)[*n - 1] == ' ' || (*s)[*n - 1] == '\t'))
        (*n)--;
}

static int split_field(const char *l, size_t n, struct http_field *f,
                       struct sc_error *err)
{
    const char *colon = memchr(l, ':', n);

    if (n && (l[0] == ' ' || l[0] == '\t')) {
        sc_error_set(err, "obsolete line folding");
        return -EINVAL;
    }
    if (!colon) {
        sc_error_set(err, "a header line without a colon");
        return -EINVAL;
    }
    f->name = l;
    f->name_len = (size_t)(colon - l);
    f->value = colon + 1;
    f->value_len = n - f->name_len - 1;
    trim_ows(&f->value, &f->value_len);
    return 0;
}

int http_head_parse_check(const char *raw, size_t len, struct sc_error *err)
{
    struct http_field fields[MAX_FIELDS];
    struct http_head h = {.fields = fields};
    size_t pos = 0, n;
    const char *l;

    if (!next_line(raw, len, &pos, &l, &n)) {
        sc_error_set(err, "no request line");
        return -EINVAL;
    }
    if (split_request_line(l, n, &h, err) != 0)
        return -EINVAL;
    for (;;) {
        if (!next_line(raw, len, &pos, &l, &n)) {
            sc_error_set(err, "the head does not end with an empty line");
            return -EINVAL;
        }
        if (n == 0)
            break;
        if (h.n_fields == MAX_FIELDS) {
            sc_error_set(err, "more than %d header lines", MAX_FIELDS);
            return -E2BIG;
        }
        if (split_field(l, n, &fields[h.n_fields++], err) != 0)
            return -EINVAL;
    }
    return http_head_check(&h, err);
}
