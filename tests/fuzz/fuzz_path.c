/* Path normalisation (policies/path.h) on arbitrary request-targets, given
 * as a length without a terminator: a path that normalises starts with "/",
 * holds no dot-segment and no escape of an unreserved character, keeps its
 * query byte for byte and normalises to itself; a refusal says why. */
#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "fuzz_check.h"
#include "policies/path.h"

static int hex(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c = (char)(c | 0x20);
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

static bool unreserved(int c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
           (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_' ||
           c == '~';
}

static bool seg_is(const char *s, size_t n, const char *what)
{
    return n == strlen(what) && !memcmp(s, what, n);
}

/* The normalised path part, out[0..n). */
static void check_path(const char *out, size_t n)
{
    FUZZ_CHECK(n >= 1 && out[0] == '/', "\"%s\" does not start with /", out);
    for (size_t i = 1, end; i <= n; i = end + 1) {
        for (end = i; end < n && out[end] != '/'; end++)
            ;
        FUZZ_CHECK(!seg_is(out + i, end - i, ".") &&
                       !seg_is(out + i, end - i, ".."),
                   "dot-segment left in \"%s\"", out);
    }
    for (size_t i = 0; i < n; i++) {
        if (out[i] != '%')
            continue;
        FUZZ_CHECK(i + 2 < n, "truncated escape in \"%s\"", out);
        FUZZ_CHECK(hex(out[i + 1]) >= 0 && hex(out[i + 2]) >= 0 &&
                       !unreserved(hex(out[i + 1]) * 16 + hex(out[i + 2])),
                   "escape %.3s left in \"%s\"", out + i, out);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* An exact copy: the API takes a length, so ASan sees any read past it. */
    char *target = malloc(size ? size : 1), *out = NULL, *again = NULL;
    struct sc_error err = {0};
    const char *q;
    size_t plen, olen;
    int rc;

    if (!target)
        return 0;
    memcpy(target, data, size);
    rc = path_normalise(target, size, &out, &err);
    if (rc != 0) {
        FUZZ_CHECK(rc == -EINVAL || rc == -ENOMEM, "rc %d", rc);
        FUZZ_CHECK(!out && err.text[0], "refused without a message");
        goto done;
    }
    /* A NUL never reaches it (the proxy passes C strings, http_head.h
     * refuses one in a target): the checks below read out as a string. */
    if (memchr(target, '\0', size))
        goto done;
    q = memchr(target, '?', size);
    plen = q ? (size_t)(q - target) : size;
    olen = strcspn(out, "?");
    check_path(out, olen);
    FUZZ_CHECK(olen <= plen, "the path grew: \"%s\"", out);
    FUZZ_CHECK(strlen(out) - olen == size - plen &&
                   !memcmp(out + olen, target + plen, size - plen),
               "the query changed: \"%s\"", out);
    FUZZ_CHECK(path_normalise(out, strlen(out), &again, &err) == 0 &&
                   !strcmp(again, out),
               "\"%s\" normalises to \"%s\"", out, again ? again : err.text);
    free(again);
done:
    free(out);
    free(target);
    return 0;
}
