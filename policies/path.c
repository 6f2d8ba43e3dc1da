#include "policies/path.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "util/hex.h"

/* RFC 3986 section 2.3. */
static bool is_unreserved(int c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
           (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_' ||
           c == '~';
}

/* Copies path[0..n) into dst, decoding escapes of unreserved characters
 * only: decoding "%2F" would create a segment the client did not send.
 * Returns the length written (never more than n), or -EINVAL. */
static long decode_unreserved(const char *path, size_t n, char *dst,
                              struct sc_error *err)
{
    size_t o = 0;

    for (size_t i = 0; i < n; i++) {
        int hi, lo;

        if (path[i] != '%') {
            dst[o++] = path[i];
            continue;
        }
        if (n - i < 3 || (hi = hex_digit(path[i + 1])) < 0 ||
            (lo = hex_digit(path[i + 2])) < 0) {
            sc_error_set(err, "malformed percent-encoding in the path");
            return -EINVAL;
        }
        if (is_unreserved(hi * 16 + lo)) {
            dst[o++] = (char)(hi * 16 + lo);
        } else {
            memcpy(dst + o, path + i, 3); /* kept as sent */
            o += 3;
        }
        i += 2;
    }
    return (long)o;
}

static bool seg_is(const char *s, size_t n, const char *what)
{
    return n == strlen(what) && memcmp(s, what, n) == 0;
}

/* RFC 3986 section 5.2.4 over an absolute path, in place: out never grows
 * past the input. Unlike the RFC, which silently stops ".." at the root,
 * climbing above it is an error: such a path is an attempt, not a typo. */
static long remove_dot_segments(char *p, size_t n, struct sc_error *err)
{
    size_t o = 0, depth = 0, i = 1;

    while (i <= n) {
        size_t end = i;
        bool last;

        while (end < n && p[end] != '/')
            end++;
        last = end >= n;
        if (seg_is(p + i, end - i, ".")) {
            /* dropped; "/a/." keeps its trailing slash */
        } else if (seg_is(p + i, end - i, "..")) {
            if (depth == 0) {
                sc_error_set(err, "the path climbs above the root");
                return -EINVAL;
            }
            while (o > 0 && p[--o] != '/')
                ;
            depth--;
        } else {
            p[o++] = '/';
            memmove(p + o, p + i, end - i);
            o += end - i;
            depth++;
            i = end + 1;
            continue;
        }
        if (last)
            p[o++] = '/';
        i = end + 1;
    }
    return (long)o;
}

int path_normalise(const char *target, size_t len, char **out,
                   struct sc_error *err)
{
    const char *q = memchr(target, '?', len);
    size_t plen = q ? (size_t)(q - target) : len;
    char *buf;
    long n;

    *out = NULL;
    if (plen == 0 || target[0] != '/') {
        sc_error_set(err, "the path does not start with \"/\"");
        return -EINVAL;
    }
    buf = malloc(len + 1);
    if (!buf)
        return -ENOMEM;
    n = decode_unreserved(target, plen, buf, err);
    if (n >= 0)
        n = remove_dot_segments(buf, (size_t)n, err);
    if (n < 0) {
        free(buf);
        return (int)n;
    }
    /* The query goes on untouched: it is the application's business. */
    memcpy(buf + n, target + plen, len - plen);
    buf[(size_t)n + len - plen] = '\0';
    *out = buf;
    return 0;
}
