/* The worker's request as libmicrohttpd hands it over, checked before
 * anything else runs: the request-target (origin-form, the path normalised),
 * the head as received (RFC 9112: anything a next hop could read
 * differently is refused), the limits, the fields sluice reads one value of,
 * the chunk lines of a chunked body, the worker's own attempt count. A
 * refusal is recorded on the exchange (ex_refuse) and answered by mhd.c. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "policies/http_head.h"
#include "policies/path.h"
#include "proxy/server/mhd_internal.h"

/* RFC 9112 3.2.2: a server accepts absolute-form; only its path matters to
 * us, since the destination always comes from the config. */
static const char *origin_form(const char *uri)
{
    const char *p;

    if (strncasecmp(uri, "http://", 7) != 0 &&
        strncasecmp(uri, "https://", 8) != 0)
        return uri;
    p = strstr(uri, "://") + 3;
    p += strcspn(p, "/?");
    return p;
}

/* libmicrohttpd passes the target cut at its first NUL. In its buffer the
 * target ends with one NUL (the space it replaced) before "HTTP/1.x" and
 * the NUL of the line end; anything else there means a NUL inside the
 * target. Reading stops at the first mismatch, so never past the line. */
static bool target_is_whole(const char *uri, size_t len)
{
    static const char version[] = "HTTP/1.";
    const char *v = uri + len + 1;

    for (size_t i = 0; i < sizeof version - 1; i++)
        if (v[i] != version[i])
            return false;
    return v[7] >= '0' && v[7] <= '9' && v[8] == '\0';
}

/* A refusal is recorded on ex and answered at the first handler call, the
 * first moment libmicrohttpd lets us answer. */
void mhd_take_target(struct exchange *ex, const char *uri)
{
    struct sc_error err = {0};
    size_t len = uri ? strlen(uri) : 0;
    const char *o;
    char *path = NULL;
    int rc;

    if (!uri || !target_is_whole(uri, len) ||
        http_target_form(uri, len) == HTTP_TARGET_INVALID) {
        ex->target = strdup(uri ? uri : "");
        ex_refuse(ex, 400, OUT_REJECTED, R_MALFORMED_REQUEST,
                  "the request-target is neither origin-form nor absolute-form");
        return;
    }
    o = origin_form(uri);
    /* "" and "?q" have an empty path, which HTTP says is "/". */
    if ((*o == '\0' || *o == '?') && asprintf(&path, "/%s", o) < 0)
        return; /* target NULL: out of memory */
    if (path)
        o = path;
    rc = path_normalise(o, strlen(o), &ex->target, &err);
    if (rc == -EINVAL) {
        ex->target = strdup(o);
        ex_refuse(ex, 400, OUT_REJECTED, R_MALFORMED_REQUEST, "%s", err.text);
    }
    free(path);
}

/* ---- header checks ------------------------------------------------------ */

#define FIELDS_ON_STACK 64

struct field_list {
    struct http_field *v;
    size_t n, cap;
    size_t head_size;       /* the head as received (MHD's count), 0 unknown */
};

static enum MHD_Result collect_field(void *cls, enum MHD_ValueKind kind,
                                     const char *key, const char *value)
{
    struct field_list *l = cls;
    struct http_field *f;

    if (l->n == l->cap) /* counted just before: cannot happen */
        return MHD_NO;
    f = &l->v[l->n++];
    f->name = key;
    f->name_len = strlen(key);
    f->value = value ? value : "";
    f->value_len = value ? strlen(value) : 0;
    return MHD_YES;
}

/* The request's header fields in order: in stack when they fit, else in
 * a malloc'd array (the caller frees l->v when it is not stack). */
static int collect_fields(struct exchange *ex, struct http_field *stack,
                          struct field_list *l)
{
    int n = MHD_get_connection_values(ex->mc, MHD_HEADER_KIND, NULL, NULL);
    const union MHD_ConnectionInfo *hs =
        MHD_get_connection_info(ex->mc, MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE);

    l->head_size = hs ? hs->header_size : 0;
    l->v = stack;
    l->cap = FIELDS_ON_STACK;
    if (n > FIELDS_ON_STACK) {
        l->v = malloc((size_t)n * sizeof *l->v);
        if (!l->v)
            return -ENOMEM;
        l->cap = (size_t)n;
    }
    MHD_get_connection_values(ex->mc, MHD_HEADER_KIND, collect_field, l);
    return 0;
}

/* libmicrohttpd cuts a value at its first NUL (strlen) and glues a folded
 * line onto the field before it. Its read buffer holds the head in order,
 * each line end overwritten with NULs, so the bytes up to the next field's
 * name (or the head's end) are what was really sent: each value is widened
 * to them, and the checks then see the NUL or the fold. A field outside
 * that layout (MHD moved a folded one) is left as it is. */
static void widen_to_raw(struct field_list *l, const char *head, const char *end)
{
    for (size_t i = 0; i < l->n; i++) {
        struct http_field *f = &l->v[i];
        const char *next = i + 1 < l->n ? l->v[i + 1].name : end;
        size_t span, strip = i + 1 < l->n ? 2 : 4; /* line end (+ empty line) */

        if (f->value < head || next > end || next <= f->value + f->value_len)
            continue;
        span = (size_t)(next - f->value);
        while (strip-- && span > f->value_len && f->value[span - 1] == '\0')
            span--;
        f->value_len = span;
    }
}

/* A line end (now a NUL) followed by a space or a tab. */
static bool has_fold(const struct field_list *l)
{
    for (size_t i = 0; i < l->n; i++)
        for (size_t k = 0; k + 1 < l->v[i].value_len; k++)
            if (l->v[i].value[k] == '\0' &&
                (l->v[i].value[k + 1] == ' ' || l->v[i].value[k + 1] == '\t'))
                return true;
    return false;
}

/* The request line and the fields as received (RFC 9112): anything a next
 * hop could read differently is refused with 400 before routing. */
static bool check_head(struct exchange *ex, const char *url, const char *version,
                       struct field_list *l)
{
    struct sc_error err = {0};
    size_t mlen = strlen(ex->method);
    struct http_head h = {ex->method, mlen, ex->target, strlen(ex->target),
                          version, strlen(version), l->v, l->n};

    /* MHD skips extra spaces and cuts the method at a NUL: exactly one byte
     * (the space it overwrote) lies between the method and the target. */
    if (url != ex->method + mlen + 1) {
        ex_refuse(ex, 400, OUT_REJECTED, R_MALFORMED_REQUEST,
                  "the request line is not \"method SP target SP version\"");
        return false;
    }
    if (l->head_size)
        widen_to_raw(l, ex->method, ex->method + l->head_size);
    if (has_fold(l)) {
        ex_refuse(ex, 400, OUT_REJECTED, R_MALFORMED_REQUEST, "obsolete line folding");
        return false;
    }
    if (http_head_check(&h, &err) != 0) {
        ex_refuse(ex, 400, OUT_REJECTED, R_MALFORMED_REQUEST, "%s", err.text);
        return false;
    }
    return true;
}

/* limits.max_header (431) and, by the announced length, max_body (413);
 * the fields passed check_head, so a Content-Length is digits only. */
/* A chunked body's chunk lines are checked as it arrives (on_body_data):
 * where in MHD's buffer they start. */
static void note_chunked(struct exchange *ex, const struct field_list *l)
{
    for (size_t i = 0; i < l->n && l->head_size; i++)
        if (strcasecmp(l->v[i].name, "Transfer-Encoding") == 0) {
            ex->chunked = true;
            ex->raw_body = ex->method + l->head_size;
            return;
        }
}

static bool check_limits(struct exchange *ex, const struct field_list *l)
{
    const struct sc_config *cfg = ex->cfg;
    size_t bytes = strlen(ex->method) + strlen(ex->target) + 12;
    unsigned long long cl = 0;

    for (size_t i = 0; i < l->n; i++) {
        bytes += l->v[i].name_len + l->v[i].value_len + 4;
        if (strcasecmp(l->v[i].name, "Content-Length") == 0)
            cl = strtoull(l->v[i].value, NULL, 10);
    }
    /* The head as received, whitespace MHD trimmed included. */
    if (l->head_size > bytes)
        bytes = l->head_size;
    if (bytes > cfg->limits.max_header) {
        ex_refuse(ex, 431, OUT_REJECTED, R_HEADERS_TOO_LARGE,
               "request headers of %zu bytes exceed limits.max_header (%llu)",
               bytes, (unsigned long long)cfg->limits.max_header);
        return false;
    }
    if (cl > cfg->limits.max_body) {
        ex_refuse(ex, 413, OUT_REJECTED, R_BODY_TOO_LARGE,
               "request body of %llu bytes exceeds limits.max_body (%llu)", cl,
               (unsigned long long)cfg->limits.max_body);
        return false;
    }
    return true;
}

/* The header that carries the job's key: the policy's, else the usual one,
 * so that log lines of one job correlate even without idempotency. */
static const char *key_header(const struct exchange *ex)
{
    if (ex->pol && ex->pol->idem.enabled && ex->pol->idem.header)
        return ex->pol->idem.header;
    return "Idempotency-Key";
}

/* The fields sluice reads one value of (the key, the worker's attempt, the
 * enqueue time) come once: of two, sluice would act on the first while the
 * partner, which gets both, may read the other or a list of both. */
static bool check_single(struct exchange *ex, const struct field_list *l)
{
    const char *names[] = {key_header(ex), "Sluice-Attempt", "Sluice-Enqueued-At"};
    unsigned seen[sizeof names / sizeof *names] = {0};

    for (size_t i = 0; i < l->n; i++) {
        for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
            if (strcasecmp(l->v[i].name, names[k]) != 0)
                continue;
            if (seen[k]++) {
                ex_refuse(ex, 400, OUT_REJECTED, R_MALFORMED_REQUEST,
                          "more than one %s header", names[k]);
                return false;
            }
            break;
        }
    }
    return true;
}

/* The request's head, in order: the limits, the route, the single fields.
 * The fields are in stack when they fit, else in a malloc'd array. */
bool mhd_check_request(struct exchange *ex, const char *url, const char *version,
                       bool (*route)(struct exchange *ex))
{
    struct http_field stack[FIELDS_ON_STACK];
    struct field_list l = {0};
    bool ok = false;

    if (collect_fields(ex, stack, &l) != 0) {
        ex_refuse(ex, 500, OUT_REJECTED, R_INTERNAL, "out of memory");
        return false;
    }
    if (check_head(ex, url, version, &l) && check_limits(ex, &l) &&
        route(ex) && check_single(ex, &l)) {
        note_chunked(ex, &l);
        ok = true;
    }
    if (l.v != stack)
        free(l.v);
    return ok;
}

/* ---- the body ------------------------------------------------------------ */

bool mhd_read_attempt(struct exchange *ex)
{
    const char *v = MHD_lookup_connection_value(ex->mc, MHD_HEADER_KIND,
                                                "Sluice-Attempt");
    char *end;
    unsigned long n;

    ex->attempt = 1;
    if (!v)
        return true;
    n = strtoul(v, &end, 10);
    if (*v < '1' || *v > '9' || *end || n > 1000000) {
        ex_refuse(ex, 400, OUT_REJECTED, R_MALFORMED_REQUEST,
                  "Sluice-Attempt must be a positive integer, got \"%.32s\"", v);
        return false;
    }
    ex->attempt = (uint32_t)n;
    return true;
}

/* The longest chunk line (extensions, size, line ends) sluice reads; a
 * longer one is refused (RFC 9112 7.1.1 asks servers to bound them). */
#define CHUNK_LINE_MAX 4096

/* The framing bytes [from, data) before a piece, as a chunk line. */
static int check_gap(const char *from, const char *data, bool crlf_optional,
                     struct sc_error *err)
{
    if ((size_t)(data - from) > CHUNK_LINE_MAX) {
        sc_error_set(err, "a chunk line longer than %d bytes", CHUNK_LINE_MAX);
        return -EINVAL;
    }
    return http_chunk_gap_check(from, (size_t)(data - from), crlf_optional, err);
}

/* MHD decodes the chunks itself, accepts any byte in a chunk extension,
 * and hands over only the data: the chunk line it skipped lies in its read
 * buffer just before a piece (libmicrohttpd 0.9.75). Each pass over that
 * buffer starts where the head ended (the buffer grows in place); within a
 * pass the pieces come in order with the framing between them. So the
 * bytes before a piece are those since the end of the one before it, when
 * that was in the same pass (same MHD run; they then begin with the CRLF
 * that ends its chunk), else those from the buffer's start. Only those
 * bytes are read, never past a piece. A line MHD reads at the very end of
 * a read, with no data after it, is overwritten by the next read before a
 * piece shows it: its extensions go unchecked. */
int mhd_check_chunk_line(struct exchange *ex, const char *data, uint64_t run,
                         struct sc_error *err)
{
    int rc = -EPROTO;

    if (ex->raw_run == run && data >= ex->raw_next)
        rc = check_gap(ex->raw_next, data, false, err);
    /* Not framing from there: this run began a new pass over the buffer. */
    if (rc == -EPROTO && data >= ex->raw_body)
        rc = check_gap(ex->raw_body, data, true, err);
    return rc;
}

