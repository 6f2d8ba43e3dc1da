/* policies/path.c: routes match the normalised path (percent-encoded
 * unreserved characters decoded, dot-segments removed); a path that climbs
 * above the root is refused. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "policies/path.h"

/* The normalised target, or "ERR" when refused with -EINVAL. */
static char *norm(const char *target)
{
    struct sc_error err = {0};
    char *out = NULL;
    int rc = path_normalise(target, strlen(target), &out, &err);

    if (rc == -EINVAL) {
        cr_expect(err.text[0], "a refusal says why");
        cr_expect_null(out);
        return strdup("ERR");
    }
    cr_assert_eq(rc, 0, "rc %d for %s", rc, target);
    return out;
}

static void expect_norm(const char *target, const char *want)
{
    char *got = norm(target);

    cr_expect_str_eq(got, want, "%s -> %s, want %s", target, got, want);
    free(got);
}

Test(path_normalise, leaves_clean_paths_alone)
{
    expect_norm("/", "/");
    expect_norm("/v1/sync/a", "/v1/sync/a");
    expect_norm("/v1/sync/", "/v1/sync/");
    expect_norm("/a//b", "/a//b");
}

Test(path_normalise, removes_dot_segments)
{
    expect_norm("/v1/x/../sync/a", "/v1/sync/a");
    expect_norm("/v1/./sync/a", "/v1/sync/a");
    expect_norm("/a/b/.", "/a/b/");
    expect_norm("/a/b/..", "/a/");
    expect_norm("/a/..", "/");
    expect_norm("/.", "/");
    expect_norm("/a/./b/../../c", "/c");
    expect_norm("/a//../b", "/a/b");
    expect_norm("/a/...", "/a/...");
    expect_norm("/a/..b/.c", "/a/..b/.c");
}

Test(path_normalise, decodes_unreserved_escapes_only)
{
    expect_norm("/v1/%73ync/a", "/v1/sync/a");
    expect_norm("/v1/%53%59%4e%43", "/v1/SYNC");
    expect_norm("/%7e%2D%5f%2e", "/~-_.");
    /* reserved and other characters stay encoded, as sent */
    expect_norm("/a%2Fb", "/a%2Fb");
    expect_norm("/a%2fb", "/a%2fb");
    expect_norm("/a%20b%3F", "/a%20b%3F");
}

Test(path_normalise, decoded_dots_are_dot_segments)
{
    expect_norm("/v1/%2e/sync", "/v1/sync");
    expect_norm("/v1/x/%2E%2e/sync", "/v1/sync");
}

Test(path_normalise, climbing_above_the_root_is_refused)
{
    expect_norm("/..", "ERR");
    expect_norm("/../x", "ERR");
    expect_norm("/v1/../../x", "ERR");
    expect_norm("/v1/%2e%2e/../x", "ERR");
    expect_norm("/a/b/../../..", "ERR");
}

Test(path_normalise, malformed_escapes_are_refused)
{
    expect_norm("/a%", "ERR");
    expect_norm("/a%2", "ERR");
    expect_norm("/a%zz", "ERR");
    expect_norm("/a%2g/b", "ERR");
}

Test(path_normalise, the_query_is_untouched)
{
    expect_norm("/v1/./x?a=/../b&c=%73", "/v1/x?a=/../b&c=%73");
    expect_norm("/a/..?", "/?");
    /* a bad escape in the query is the application's business */
    expect_norm("/x?%zz", "/x?%zz");
}

Test(path_normalise, needs_a_leading_slash)
{
    expect_norm("v1/x", "ERR");
    expect_norm("", "ERR");
    expect_norm("?q", "ERR");
}

Test(path_normalise, honours_the_length)
{
    struct sc_error err = {0};
    char *out = NULL;

    /* only the first 6 bytes are the target */
    cr_assert_eq(path_normalise("/a/../bXYZ", 7, &out, &err), 0);
    cr_expect_str_eq(out, "/b");
    free(out);
}

/* Found by tests/fuzz/fuzz_path: the '?' was looked for up to a NUL, past
 * len. The target here ends right before an unreadable page. */
Test(path_normalise, reads_no_byte_past_the_length)
{
    static const char t[] = "/a/./b";
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    char *map = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    struct sc_error err = {0};
    char *at, *out = NULL;

    cr_assert_neq(map, MAP_FAILED);
    cr_assert_eq(mprotect(map + page, page, PROT_NONE), 0);
    at = map + page - (sizeof t - 1);
    memcpy(at, t, sizeof t - 1); /* no terminator */
    cr_assert_eq(path_normalise(at, sizeof t - 1, &out, &err), 0);
    cr_expect_str_eq(out, "/a/b");
    free(out);
    munmap(map, 2 * page);
}
