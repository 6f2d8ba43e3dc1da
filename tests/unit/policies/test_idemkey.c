/* Idempotency keys and fingerprints (docs/contract.md §6). */
#include <criterion/criterion.h>
#include <string.h>

#include "config/config.h"
#include "policies/idemkey.h"

static int parse(const char *raw, char *out)
{
    char why[128];
    return idem_key_parse(raw, out, why, sizeof why);
}

Test(idemkey, plain_keys)
{
    char out[IDEM_KEY_MAX + 1], k255[256];

    cr_expect_eq(parse("course-1842:roster-sync:2026-09-03", out), 0);
    cr_expect_str_eq(out, "course-1842:roster-sync:2026-09-03");
    cr_expect_eq(parse("a", out), 0);
    cr_expect_eq(parse("!~", out), 0);
    memset(k255, 'k', 255);
    k255[255] = '\0';
    cr_expect_eq(parse(k255, out), 0);
    cr_expect_eq(strlen(out), 255);
}

Test(idemkey, invalid_plain_keys)
{
    static const char *const bad[] = {"", "has space", "tab\there", "\x7f", "caf\xc3\xa9"};
    char out[IDEM_KEY_MAX + 1], k256[257];

    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_expect_neq(parse(bad[i], out), 0, "accepted <%s>", bad[i]);
    memset(k256, 'k', 256);
    k256[256] = '\0';
    cr_expect_neq(parse(k256, out), 0);
}

Test(idemkey, structured_field_strings)
{
    char out[IDEM_KEY_MAX + 1];

    cr_expect_eq(parse("\"abc\"", out), 0);
    cr_expect_str_eq(out, "abc");
    cr_expect_eq(parse("\"with space\"", out), 0);
    cr_expect_str_eq(out, "with space");
    cr_expect_eq(parse("\"q\\\"b\\\\\"", out), 0);
    cr_expect_str_eq(out, "q\"b\\");
    cr_expect_neq(parse("\"\"", out), 0, "empty");
    cr_expect_neq(parse("\"open", out), 0, "unterminated");
    cr_expect_neq(parse("\"a\"b", out), 0, "text after");
    cr_expect_neq(parse("\"a\\nb\"", out), 0, "bad escape");
    cr_expect_neq(parse("\"tab\there\"", out), 0, "control char");
}

Test(idemkey, fingerprint_parts)
{
    uint8_t a[32], b[32], c[32];
    unsigned all = SC_FP_METHOD | SC_FP_PATH | SC_FP_BODY;

    idem_fingerprint(all, "POST", "/x?a=1", "body", 4, a);
    idem_fingerprint(all, "POST", "/x?a=1", "body", 4, b);
    cr_expect_eq(memcmp(a, b, 32), 0, "deterministic");
    idem_fingerprint(all, "POST", "/x?a=2", "body", 4, c);
    cr_expect_neq(memcmp(a, c, 32), 0, "query is part of the path");
    idem_fingerprint(all, "PUT", "/x?a=1", "body", 4, c);
    cr_expect_neq(memcmp(a, c, 32), 0, "method");
    idem_fingerprint(all, "POST", "/x?a=1", "bodz", 4, c);
    cr_expect_neq(memcmp(a, c, 32), 0, "body");
    /* Parts cannot run into each other. */
    idem_fingerprint(all, "POS", "T/x?a=1", "body", 4, c);
    cr_expect_neq(memcmp(a, c, 32), 0, "boundaries");
    /* Only the named parts count. */
    idem_fingerprint(SC_FP_METHOD | SC_FP_PATH, "POST", "/x", "one", 3, a);
    idem_fingerprint(SC_FP_METHOD | SC_FP_PATH, "POST", "/x", "two", 3, b);
    cr_expect_eq(memcmp(a, b, 32), 0, "body not in the fingerprint");
}
