/* Strict request-head checks (policies/http_head.h) on raw bytes, given as a
 * length without a terminator. A head that passes is re-read here by rules
 * of its own: no NUL and no bare CR before the empty line that ends it,
 * never both Content-Length and Transfer-Encoding, and exactly one Host in
 * HTTP/1.1 - what a smuggled request would need to break. A refusal says
 * why. The field predicates get the whole input as one value as well, and
 * the chunk-line check (the framing before a piece of a chunked body) the
 * whole input as that framing. */
#include <errno.h>
#include <stdbool.h>
#include <string.h>
#include <strings.h>

#include "fuzz_check.h"
#include "policies/http_head.h"

struct seen {
    size_t end;           /* just past the empty line */
    unsigned host, cl, te;
    bool v11;
};

static bool starts(const char *l, size_t n, const char *name)
{
    size_t k = strlen(name);
    return n > k && l[k] == ':' && !strncasecmp(l, name, k);
}

/* Line by line as RFC 9112 frames a head: LF ends a line, a CR before it
 * is part of the line end. False when no empty line ends the head. */
static bool scan(const char *raw, size_t len, struct seen *s)
{
    size_t pos = 0, line = 0;

    while (pos < len) {
        const char *l = raw + pos, *lf = memchr(l, '\n', len - pos);
        size_t n;

        if (!lf)
            return false;
        n = (size_t)(lf - l) - (lf > l && lf[-1] == '\r');
        pos = (size_t)(lf - raw) + 1;
        if (line++ == 0) {
            s->v11 = n >= 8 && !memcmp(l + n - 8, "HTTP/1.", 7) &&
                     l[n - 1] != '0';
            continue;
        }
        if (n == 0) {
            s->end = pos;
            return true;
        }
        s->host += starts(l, n, "host");
        s->cl += starts(l, n, "content-length");
        s->te += starts(l, n, "transfer-encoding");
    }
    return false;
}

static void check_accepted(const char *raw, size_t len)
{
    struct seen s = {0};

    FUZZ_CHECK(scan(raw, len, &s), "accepted without an empty line");
    FUZZ_CHECK(!memchr(raw, '\0', s.end), "NUL in an accepted head");
    for (size_t i = 0; i < s.end; i++)
        FUZZ_CHECK(raw[i] != '\r' || (i + 1 < s.end && raw[i + 1] == '\n'),
                   "bare CR at %zu in an accepted head", i);
    FUZZ_CHECK(!(s.cl && s.te), "Content-Length with Transfer-Encoding");
    FUZZ_CHECK(s.host <= 1 && (!s.v11 || s.host == 1), "%u Host lines",
               s.host);
}

/* RFC 9110 5.6.2: a tchar is visible ASCII but no delimiter. */
static bool tchar(char c)
{
    return c > 0x20 && c < 0x7f && !strchr("\"(),/:;<=>?@[\\]{}", c);
}

/* 5.5: field-value bytes are VCHAR, obs-text, SP or HTAB. */
static bool value_byte(unsigned char c)
{
    return c >= 0x20 ? c != 0x7f : c == '\t';
}

static void check_predicates(const char *s, size_t n)
{
    if (http_method_is_token(s, n) || http_header_name_valid(s, n))
        for (size_t i = 0; i < n; i++)
            FUZZ_CHECK(tchar(s[i]), "a token holds 0x%02x",
                       (unsigned char)s[i]);
    if (http_header_value_valid(s, n))
        for (size_t i = 0; i < n; i++)
            FUZZ_CHECK(value_byte((unsigned char)s[i]),
                       "a value holds 0x%02x", (unsigned char)s[i]);
    switch (http_target_form(s, n)) {
    case HTTP_TARGET_ORIGIN:
        FUZZ_CHECK(s[0] == '/', "origin-form without /");
        break;
    case HTTP_TARGET_ABSOLUTE:
        FUZZ_CHECK(!strncasecmp(s, "http://", 7) ||
                       !strncasecmp(s, "https://", 8),
                   "absolute-form without http(s)://");
        break;
    case HTTP_TARGET_INVALID:
        break;
    }
    if (http_version_valid(s, n))
        FUZZ_CHECK(n == 8 && !memcmp(s, "HTTP/1.", 7), "version \"%.*s\"",
                   (int)n, s);
}

/* A chunk line's framing: an accepted one ends with LF, holds no control
 * character but its line ends and tabs, and has no CR or LF inside its
 * extensions; a refusal says why. */
static void check_chunk_gap(const char *s, size_t n)
{
    struct sc_error err = {0};
    int rc = http_chunk_gap_check(s, n, n % 2, &err);

    if (rc == -EINVAL)
        FUZZ_CHECK(err.text[0], "a refused chunk line without a message");
    FUZZ_CHECK(rc == 0 || rc == -EINVAL || rc == -EPROTO, "rc %d", rc);
    if (rc != 0 || n == 0)
        return;
    FUZZ_CHECK(s[n - 1] == '\n', "an accepted chunk line does not end with LF");
    for (size_t i = 0, lf = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        lf += c == '\n';
        FUZZ_CHECK(c >= 0x20 || c == '\t' || c == '\r' || c == '\n', "0x%02x accepted", c);
        FUZZ_CHECK(c != 0x7f, "DEL accepted");
        FUZZ_CHECK(lf <= 2, "more than two line ends in one chunk line");
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* An exact copy: the API takes a length, so ASan sees any read past it. */
    char *raw = malloc(size ? size : 1);
    struct sc_error err = {0};
    int rc;

    if (!raw)
        return 0;
    memcpy(raw, data, size);
    rc = http_head_parse_check(raw, size, &err);
    if (rc == 0)
        check_accepted(raw, size);
    else
        FUZZ_CHECK((rc == -EINVAL || rc == -E2BIG) && err.text[0],
                   "rc %d, message \"%s\"", rc, err.text);
    check_predicates(raw, size);
    check_chunk_gap(raw, size);
    free(raw);
    return 0;
}
