/* policies/backoff.c: the delay rules of docs/contract.md §4. Reset hints in
 * every form (Retry-After delta-seconds and the three HTTP-date forms, the
 * draft RateLimit header's t=, X-RateLimit-Reset), their malformed variants,
 * backoff with each jitter, the hint's jitter, and backoff_retry_decide's edges. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "policies/backoff.h"
#include "config/config.h"

/* Sun, 06 Nov 1994 08:49:37 GMT, the example date of RFC 9110. */
#define RFC_DATE_S 784111777ull
#define RFC_DATE_MS (RFC_DATE_S * 1000)
#define DAY_MS (86400ull * 1000)
#define SENTINEL 0xdeadbeefull

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t retry_after_ok(const char *v, uint64_t now_wall_ms)
{
    uint64_t d = SENTINEL;
    int rc = hint_retry_after(v, now_wall_ms, &d);

    cr_assert_eq(rc, 0, "Retry-After \"%s\" refused (%d)", v, rc);
    cr_assert_neq(d, SENTINEL);
    return d;
}

static struct sc_retry retry(uint64_t base, double mult, uint64_t cap,
                             enum sc_jitter jitter)
{
    struct sc_retry r;

    memset(&r, 0, sizeof r);
    r.base_ms = base;
    r.multiplier = mult;
    r.cap_ms = cap;
    r.max_attempts = 8;
    r.max_delay_ms = 7 * DAY_MS;
    r.jitter = jitter;
    return r;
}

/* ---- Retry-After ------------------------------------------------------------ */

Test(retry_after, delta_seconds)
{
    cr_expect_eq(retry_after_ok("120", RFC_DATE_MS), 120000);
    cr_expect_eq(retry_after_ok("0", RFC_DATE_MS), 0);
    cr_expect_eq(retry_after_ok("1", RFC_DATE_MS), 1000);
    cr_expect_eq(retry_after_ok("  5", RFC_DATE_MS), 5000);
    cr_expect_eq(retry_after_ok("\t5", RFC_DATE_MS), 5000);
    cr_expect_eq(retry_after_ok("5 ", RFC_DATE_MS), 5000);
    cr_expect_eq(retry_after_ok("007", RFC_DATE_MS), 7000);
    cr_expect_eq(retry_after_ok("604800", RFC_DATE_MS), 604800000);
    /* delta-seconds does not depend on the wall clock */
    cr_expect_eq(retry_after_ok("30", 0), 30000);
}

Test(retry_after, every_http_date_form)
{
    static const char *const forms[] = {
        "Sun, 06 Nov 1994 08:49:37 GMT",  /* IMF-fixdate */
        "Sunday, 06-Nov-94 08:49:37 GMT", /* RFC 850 */
        "Sun Nov  6 08:49:37 1994",       /* asctime, single-digit day */
        "  Sun, 06 Nov 1994 08:49:37 GMT",
        "Sun, 06 Nov 1994 08:49:37 GMT ",
    };

    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
        /* in the future: the exact distance, to the millisecond */
        cr_expect_eq(retry_after_ok(forms[i], RFC_DATE_MS - 60000), 60000, "%s", forms[i]);
        cr_expect_eq(retry_after_ok(forms[i], RFC_DATE_MS - 1), 1, "%s", forms[i]);
        cr_expect_eq(retry_after_ok(forms[i], RFC_DATE_MS - 3 * DAY_MS - 250),
                     3 * DAY_MS + 250, "%s", forms[i]);
        /* now or in the past: 0 */
        cr_expect_eq(retry_after_ok(forms[i], RFC_DATE_MS), 0, "%s", forms[i]);
        cr_expect_eq(retry_after_ok(forms[i], RFC_DATE_MS + 1), 0, "%s", forms[i]);
        cr_expect_eq(retry_after_ok(forms[i], RFC_DATE_MS + 365 * DAY_MS), 0, "%s", forms[i]);
    }
}

Test(retry_after, dates_in_this_century)
{
    /* Thu, 01 Jan 2026 00:00:00 GMT = 1767225600; RFC 850's two-digit year
     * 26 is 2026, not 1926. */
    const uint64_t at = 1767225600ull * 1000, now = at - 90500;

    cr_expect_eq(retry_after_ok("Thu, 01 Jan 2026 00:00:00 GMT", now), 90500);
    cr_expect_eq(retry_after_ok("Thursday, 01-Jan-26 00:00:00 GMT", now), 90500);
    cr_expect_eq(retry_after_ok("Thu Jan  1 00:00:00 2026", now), 90500);
    /* Two-digit days and the end of a leap year. */
    cr_expect_eq(retry_after_ok("Sun, 31 Dec 2028 23:59:59 GMT", 1861919999000ull - 1000), 1000);
    cr_expect_eq(retry_after_ok("Sun Dec 31 23:59:59 2028", 1861919999000ull - 1000), 1000);
}

Test(retry_after, malformed_values_are_refused)
{
    static const char *const bad[] = {
        "", " ", "\t", "-1", "+5", "1.5", "1e3", "0x10", "abc", "soon",
        "5x", "5 x", "5, 60", "5;x", "5s",
        "Sun, 06 Nov 1994",                    /* no time */
        "Sun, 06 Nov 1994 08:49:37",           /* no zone */
        "Sun 06 Nov 1994 08:49:37 GMT",        /* weekday without its comma */
        "Xyz, 06 Nov 1994 08:49:37 GMT",       /* no such weekday */
        "Sun, 06 Nov 1994 08:49:37 UTC",       /* only GMT */
        "Sun, 06 Nov 1994 08:49:37 +0000",
        "Sun, 06 Nov 1994 08:49:37 GMTx",      /* trailing junk */
        "Sun, 06 Nov 1994 08:49:37 GMT junk",
        "Sun, 06 Nov 94 08:49:37 GMT",         /* two-digit year in IMF-fixdate */
        "Sunday, 06-Nov-1994 08:49:37 GMT",    /* four-digit year in RFC 850 */
        "Sun Nov  6 08:49:37 1994 GMT",        /* asctime has no zone */
        "Sun, 32 Nov 1994 08:49:37 GMT",       /* day out of range */
        "Sun, 06 Nov 1994 25:49:37 GMT",       /* hour out of range */
        "Sun, 06 Foo 1994 08:49:37 GMT",       /* no such month */
        "1994-11-06T08:49:37Z",                /* ISO 8601 is not an HTTP-date */
    };

    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t d = SENTINEL;
        int rc = hint_retry_after(bad[i], RFC_DATE_MS, &d);

        cr_expect_eq(rc, -EINVAL, "Retry-After \"%s\" accepted as %llu ms", bad[i],
                     (unsigned long long)d);
    }
}

Test(retry_after, huge_values_do_not_overflow)
{
    static const char *const huge[] = {
        "604801",                        /* just beyond 7 days */
        "4294967296",                    /* 2^32 */
        "18446744073709551616",          /* 2^64: would wrap to 0 */
        "18446744073709551",             /* * 1000 would wrap */
        "99999999999999999999999999999999999999",
    };
    uint64_t prev = 0;

    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
        uint64_t d = retry_after_ok(huge[i], RFC_DATE_MS);

        cr_expect_gt(d, 7 * DAY_MS, "\"%s\" gave %llu ms", huge[i], (unsigned long long)d);
        cr_expect_geq(d, prev, "\"%s\" gave less than a smaller value", huge[i]);
        cr_expect_lt(d, UINT64_MAX / 4, "\"%s\" must leave room to add jitter", huge[i]);
        prev = d;
    }
}

/* ---- RateLimit: t= ------------------------------------------------------------ */

Test(ratelimit_t, reads_the_t_parameter)
{
    uint64_t d = SENTINEL;

    cr_expect_eq(hint_ratelimit_t("\"default\";r=0;t=5", &d), 0);
    cr_expect_eq(d, 5000);
    cr_expect_eq(hint_ratelimit_t("\"default\";r=0;t=0", &d), 0);
    cr_expect_eq(d, 0);
    cr_expect_eq(hint_ratelimit_t("\"p\";t=7;r=0", &d), 0);
    cr_expect_eq(d, 7000);
    cr_expect_eq(hint_ratelimit_t("\"p\";r=0; t=9", &d), 0);
    cr_expect_eq(d, 9000);
    /* any bare item names the policy; an inner list too */
    cr_expect_eq(hint_ratelimit_t("default;r=0;t=3", &d), 0);
    cr_expect_eq(d, 3000);
    cr_expect_eq(hint_ratelimit_t("(a b);r=0;t=4", &d), 0);
    cr_expect_eq(d, 4000);
}

/* Only exhausted quotas (r=0) explain a 429: a daily budget with quota left
 * next to an empty per-second one must not pause the policy for the day. */
Test(ratelimit_t, only_exhausted_items_count)
{
    uint64_t d = SENTINEL;

    cr_expect_eq(hint_ratelimit_t("\"day\";r=900;t=50000, \"sec\";r=0;t=1", &d), 0);
    cr_expect_eq(d, 1000);
    cr_expect_eq(hint_ratelimit_t("\"a\";r=0;t=5, \"b\";r=1;t=30", &d), 0);
    cr_expect_eq(d, 5000);
    cr_expect_eq(hint_ratelimit_t("\"a\";r=0;t=5,\"b\";r=0;t=12,\"c\";r=3;t=1", &d), 0);
    cr_expect_eq(d, 12000);
    /* an item whose t= is not an Integer says nothing; the others count */
    cr_expect_eq(hint_ratelimit_t("\"a\";r=0;t=abc, \"b\";r=0;t=4", &d), 0);
    cr_expect_eq(d, 4000);
    /* "t=" inside a quoted policy name is not a parameter */
    cr_expect_eq(hint_ratelimit_t("\"t=9\";r=0;t=5", &d), 0);
    cr_expect_eq(d, 5000);
}

Test(ratelimit_t, without_an_exhausted_t_is_refused)
{
    static const char *const bad[] = {
        "limit=10, remaining=0, reset=5", /* the older draft: no t= */
        "xt=5",                           /* not a parameter named t */
        "t=3",                            /* not a List item with parameters */
        "\"default\";r=0;at=5",
        "\"default\";r=0",
        "\"default\";t=5",                /* no r: not known to be exhausted */
        "\"day\";r=900;t=50000",          /* quota left */
        "\"default\";r=0;t=",
        "\"default\";r=0;t=-1",
        "\"default\";r=0;t=5x",
        "\"default\";r=0;t=1.5",
        "\"default\";r=0;t=5,",           /* a trailing comma */
        "\"default\";r=0;t=5 \"b\"",      /* two items without a comma */
        "\"unterminated;r=0;t=5",
        "\"a\";R=0;t=5",                  /* keys are lowercase */
        "",
    };

    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t d = SENTINEL;

        cr_expect_eq(hint_ratelimit_t(bad[i], &d), -EINVAL, "\"%s\" accepted as %llu",
                     bad[i], (unsigned long long)d);
    }
}

/* Found by tests/fuzz/fuzz_hints: an Inner List cut short used to send
 * the walker through a NULL pointer (an upstream could crash sluice). */
Test(ratelimit_t, unfinished_inner_list_is_refused)
{
    static const char *const bad[] = {"(", "( ", "(!", "(a;", "(a;=", "(\"x",
                                      "\"p\";r=0;t=1, (", "(a b"};

    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t d = SENTINEL;

        cr_expect_eq(hint_ratelimit_t(bad[i], &d), -EINVAL, "\"%s\" accepted", bad[i]);
    }
}

Test(ratelimit_t, huge_t_does_not_overflow)
{
    uint64_t d = 0;

    /* RFC 8941 Integers have at most 15 digits */
    cr_assert_eq(hint_ratelimit_t("\"a\";r=0;t=999999999999999", &d), 0);
    cr_expect_gt(d, 7 * DAY_MS);
    cr_expect_lt(d, UINT64_MAX / 4);
    cr_expect_eq(hint_ratelimit_t("\"a\";r=0;t=18446744073709551616", &d), -EINVAL);
}

/* ---- X-RateLimit-Reset -------------------------------------------------------- */

Test(x_ratelimit_reset, seconds_and_unix_time)
{
    const uint64_t now = 1700000000000ull; /* 2023-11-14 */
    uint64_t d = SENTINEL;

    cr_expect_eq(hint_x_ratelimit_reset("30", now, &d), 0);
    cr_expect_eq(d, 30000);
    cr_expect_eq(hint_x_ratelimit_reset("0", now, &d), 0);
    cr_expect_eq(d, 0);
    /* 10^9 itself is still seconds; above it, Unix time */
    cr_expect_eq(hint_x_ratelimit_reset("1000000000", now, &d), 0);
    cr_expect_eq(d, 1000000000ull * 1000);
    cr_expect_eq(hint_x_ratelimit_reset("1700000010", now, &d), 0);
    cr_expect_eq(d, 10000);
    cr_expect_eq(hint_x_ratelimit_reset("1700000010", now + 500, &d), 0);
    cr_expect_eq(d, 9500);
    cr_expect_eq(hint_x_ratelimit_reset(" 1700000010", now, &d), 0);
    cr_expect_eq(d, 10000);
    /* a Unix time in the past is 0 */
    cr_expect_eq(hint_x_ratelimit_reset("1000000001", now, &d), 0);
    cr_expect_eq(d, 0);
    cr_expect_eq(hint_x_ratelimit_reset("1700000000", now, &d), 0);
    cr_expect_eq(d, 0);
    /* huge: far in the future, never wrapped */
    cr_expect_eq(hint_x_ratelimit_reset("99999999999999999999999", now, &d), 0);
    cr_expect_gt(d, 7 * DAY_MS);
}

Test(x_ratelimit_reset, malformed_values_are_refused)
{
    static const char *const bad[] = {"", "-5", "1.5", "abc", "1700000010x", "5 x", "5, 6"};

    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t d = SENTINEL;

        cr_expect_eq(hint_x_ratelimit_reset(bad[i], 1700000000000ull, &d), -EINVAL,
                     "\"%s\" accepted as %llu", bad[i], (unsigned long long)d);
    }
}

/* ---- hint_pick ---------------------------------------------------------------- */

Test(hint_pick, retry_after_first_then_ratelimit_then_x_reset)
{
    const uint64_t now = 1700000000000ull;
    uint64_t d = SENTINEL;

    cr_expect(hint_pick("10", "\"p\";r=0;t=20", "30", now, &d));
    cr_expect_eq(d, 10000);
    cr_expect(hint_pick(NULL, "\"p\";r=0;t=20", "30", now, &d));
    cr_expect_eq(d, 20000);
    cr_expect(hint_pick(NULL, NULL, "30", now, &d));
    cr_expect_eq(d, 30000);
    cr_expect(hint_pick(NULL, NULL, "1700000040", now, &d));
    cr_expect_eq(d, 40000);
    /* a valid 0 is a hint, and still takes precedence */
    cr_expect(hint_pick("0", "\"p\";r=0;t=20", "30", now, &d));
    cr_expect_eq(d, 0);
    /* so is a date already past */
    cr_expect(hint_pick("Sun, 06 Nov 1994 08:49:37 GMT", "\"p\";r=0;t=20", NULL, now, &d));
    cr_expect_eq(d, 0);
    /* an HTTP-date relative to the wall clock passed in */
    cr_expect(hint_pick("Sun, 06 Nov 1994 08:49:37 GMT", NULL, NULL, RFC_DATE_MS - 4000, &d));
    cr_expect_eq(d, 4000);
}

Test(hint_pick, malformed_hints_are_skipped)
{
    const uint64_t now = 1700000000000ull;
    uint64_t d = SENTINEL;

    cr_expect(hint_pick("soon", "\"p\";r=0;t=20", "30", now, &d));
    cr_expect_eq(d, 20000);
    cr_expect(hint_pick("5x", "limit=10, remaining=0, reset=5", "30", now, &d));
    cr_expect_eq(d, 30000);
    cr_expect(hint_pick("", "xt=5", " 45", now, &d));
    cr_expect_eq(d, 45000);
    d = SENTINEL;
    cr_expect_not(hint_pick("soon", "xt=5", "later", now, &d));
    cr_expect_not(hint_pick(NULL, NULL, NULL, now, &d));
    cr_expect_not(hint_pick("", "", "", now, &d));
}

/* ---- backoff ------------------------------------------------------------------ */

/* min(cap, base * mult^(k-1)) in integers, saturating, then >= 1 s. */
static uint64_t expected_none(uint64_t base, uint64_t mult, uint64_t cap, uint32_t k)
{
    uint64_t d = base;

    for (uint32_t i = 1; i < k && d < cap; i++)
        d = d > cap / mult ? cap : d * mult;
    if (d > cap)
        d = cap;
    return d < 1000 ? 1000 : d;
}

Test(backoff, none_jitter_is_bounded_exponential)
{
    static const struct { uint64_t base, mult, cap; } cfg[] = {
        {1000, 2, 6ull * 3600 * 1000},     /* the defaults */
        {100, 3, 10ull * 60 * 1000},       /* starts under the 1 s floor */
        {250, 2, 7 * DAY_MS},
        {5000, 1, 60000},                  /* constant */
        {1000, 10, 1ull << 62},            /* a cap that pow() would pass */
    };

    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        struct sc_retry r = retry(cfg[c].base, (double)cfg[c].mult, cfg[c].cap, SC_JITTER_NONE);

        for (uint32_t k = 1; k <= 40; k++)
            cr_expect_eq(backoff_delay_ms(&r, k, 12345),
                         expected_none(cfg[c].base, cfg[c].mult, cfg[c].cap, k),
                         "config %zu attempt %u", c, k);
    }
}

Test(backoff, none_jitter_edges)
{
    struct sc_retry r = retry(1000, 2, 6ull * 3600 * 1000, SC_JITTER_NONE);

    cr_expect_eq(backoff_delay_ms(&r, 1, 0), 1000);
    cr_expect_eq(backoff_delay_ms(&r, 2, 0), 2000);
    cr_expect_eq(backoff_delay_ms(&r, 15, 0), 16384000);
    cr_expect_eq(backoff_delay_ms(&r, 16, 0), 6ull * 3600 * 1000);
    cr_expect_eq(backoff_delay_ms(&r, 0, 0), 1000, "attempt 0 counts as the first");
    cr_expect_eq(backoff_delay_ms(&r, 2000, 0), 6ull * 3600 * 1000, "2^1999 overflows a double");
    cr_expect_eq(backoff_delay_ms(&r, UINT32_MAX, 0), 6ull * 3600 * 1000);
    /* a fractional multiplier: whole milliseconds */
    r = retry(1000, 1.5, 60000, SC_JITTER_NONE);
    cr_expect_eq(backoff_delay_ms(&r, 1, 0), 1000);
    cr_expect_eq(backoff_delay_ms(&r, 2, 0), 1500);
    cr_expect_eq(backoff_delay_ms(&r, 3, 0), 2250);
    cr_expect_eq(backoff_delay_ms(&r, 4, 0), 3375);
    cr_expect_eq(backoff_delay_ms(&r, 5, 0), 5062);
    /* a cap under 1 s still gives 1 s */
    r = retry(1000, 2, 400, SC_JITTER_NONE);
    cr_expect_eq(backoff_delay_ms(&r, 5, 0), 1000);
}

Test(backoff, full_jitter_is_within_0_d_and_at_least_1s)
{
    struct sc_retry r = retry(1000, 2, 6ull * 3600 * 1000, SC_JITTER_FULL);
    uint64_t seed = 7;

    for (uint32_t k = 1; k <= 40; k++) {
        uint64_t d = expected_none(1000, 2, r.cap_ms, k), lo = UINT64_MAX, hi = 0;
        double sum = 0;
        const int n = 4000;

        for (int i = 0; i < n; i++) {
            uint64_t v = backoff_delay_ms(&r, k, splitmix(&seed));

            cr_assert(v >= 1000 && v <= d, "attempt %u: %llu outside [1000, %llu]", k,
                      (unsigned long long)v, (unsigned long long)d);
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
            sum += (double)v;
        }
        /* and it spreads over the whole range */
        cr_expect_eq(backoff_delay_ms(&r, k, d - 1), d, "attempt %u: d itself is reachable", k);
        cr_expect_eq(backoff_delay_ms(&r, k, 0), 1000, "attempt %u: the floor is reachable", k);
        if (d >= 16000) {
            cr_expect_lt(lo, 1000 + d / 20, "attempt %u: never near the bottom", k);
            cr_expect_gt(hi, d - d / 20, "attempt %u", k);
            cr_expect(sum / n > 0.45 * (double)d && sum / n < 0.55 * (double)d,
                      "attempt %u: mean %.0f for d %llu", k, sum / n, (unsigned long long)d);
        }
    }
}

Test(backoff, equal_jitter_is_within_half_d_and_d)
{
    struct sc_retry r = retry(1000, 2, 6ull * 3600 * 1000, SC_JITTER_EQUAL);
    uint64_t seed = 8;

    for (uint32_t k = 1; k <= 40; k++) {
        uint64_t d = expected_none(1000, 2, r.cap_ms, k), lo = UINT64_MAX, hi = 0;
        double sum = 0;
        const int n = 4000;

        for (int i = 0; i < n; i++) {
            uint64_t v = backoff_delay_ms(&r, k, splitmix(&seed));

            cr_assert(2 * v > d && v <= d && v >= 1000, "attempt %u: %llu outside (%llu/2, %llu]",
                      k, (unsigned long long)v, (unsigned long long)d, (unsigned long long)d);
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
            sum += (double)v;
        }
        if (d >= 2000) {
            cr_expect_eq(backoff_delay_ms(&r, k, 0), d / 2 + 1, "attempt %u", k);
            cr_expect_eq(backoff_delay_ms(&r, k, d - d / 2 - 1), d, "attempt %u", k);
        }
        if (d >= 16000) {
            cr_expect_lt(lo, d / 2 + d / 20, "attempt %u", k);
            cr_expect_gt(hi, d - d / 20, "attempt %u", k);
            cr_expect(sum / n > 0.70 * (double)d && sum / n < 0.80 * (double)d,
                      "attempt %u: mean %.0f for d %llu", k, sum / n, (unsigned long long)d);
        }
    }
    /* an odd d: still strictly above half */
    r = retry(3001, 1, 60000, SC_JITTER_EQUAL);
    for (uint64_t rnd = 0; rnd < 3000; rnd++) {
        uint64_t v = backoff_delay_ms(&r, 1, rnd);
        cr_assert(2 * v > 3001 && v <= 3001, "%llu", (unsigned long long)v);
    }
}

Test(backoff, jitter_under_one_second_is_raised_to_it)
{
    struct sc_retry full = retry(100, 2, 60000, SC_JITTER_FULL);
    struct sc_retry equal = retry(100, 2, 60000, SC_JITTER_EQUAL);
    uint64_t seed = 9;

    for (int i = 0; i < 2000; i++) {
        uint64_t rnd = splitmix(&seed);

        cr_assert_eq(backoff_delay_ms(&full, 1, rnd), 1000);
        cr_assert_eq(backoff_delay_ms(&equal, 3, rnd), 1000); /* d = 400 */
        cr_assert_geq(backoff_delay_ms(&full, 5, rnd), 1000);  /* d = 1600 */
        cr_assert_leq(backoff_delay_ms(&full, 5, rnd), 1600);
    }
}

/* ---- the hint's jitter -------------------------------------------------------- */

Test(hint_delay, within_hint_and_hint_plus_max_1s_10pct)
{
    static const uint64_t hints[] = {0, 1, 500, 1000, 9999, 10000, 10010, 16250,
                                     3600000, 604800000};
    uint64_t seed = 10;

    for (size_t h = 0; h < sizeof hints / sizeof hints[0]; h++) {
        uint64_t hint = hints[h], j = hint / 10 > 1000 ? hint / 10 : 1000;
        uint64_t lo = UINT64_MAX, hi = 0;

        cr_expect_eq(hint_delay_ms(hint, 0), hint);
        cr_expect_eq(hint_delay_ms(hint, j), hint + j, "hint %llu", (unsigned long long)hint);
        for (int i = 0; i < 4000; i++) {
            uint64_t v = hint_delay_ms(hint, splitmix(&seed));

            cr_assert(v >= hint && v <= hint + j, "hint %llu: %llu",
                      (unsigned long long)hint, (unsigned long long)v);
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
        }
        cr_expect_lt(lo - hint, j / 10 + 1, "hint %llu: never near the hint", (unsigned long long)hint);
        cr_expect_gt(hi - hint, j - j / 10, "hint %llu: never near the top", (unsigned long long)hint);
    }
}

/* ---- backoff_retry_decide --------------------------------------------------------------- */

static struct sc_retry decide_cfg(void)
{
    struct sc_retry r = retry(1000, 2, 6ull * 3600 * 1000, SC_JITTER_NONE);

    r.max_attempts = 5;
    r.max_delay_ms = 60000;
    return r;
}

Test(backoff_retry_decide, dead_letter_when_the_budget_is_spent)
{
    struct sc_retry r = decide_cfg();
    uint64_t d = SENTINEL;

    cr_expect_eq(backoff_retry_decide(&r, 4, false, 0, 0, &d), RETRY_REQUEUE);
    cr_expect_eq(d, 8000);
    cr_expect_eq(backoff_retry_decide(&r, 5, false, 0, 0, &d), RETRY_DEAD_LETTER);
    cr_expect_eq(backoff_retry_decide(&r, 6, false, 0, 0, &d), RETRY_DEAD_LETTER);
    cr_expect_eq(backoff_retry_decide(&r, UINT32_MAX, false, 0, 0, &d), RETRY_DEAD_LETTER);
    /* with a hint too; and the spent budget wins over a too-long hint */
    cr_expect_eq(backoff_retry_decide(&r, 5, true, 1000, 0, &d), RETRY_DEAD_LETTER);
    cr_expect_eq(backoff_retry_decide(&r, 5, true, 10 * DAY_MS, 0, &d), RETRY_DEAD_LETTER);
    r.max_attempts = 1;
    cr_expect_eq(backoff_retry_decide(&r, 1, false, 0, 0, &d), RETRY_DEAD_LETTER);
}

Test(backoff_retry_decide, hint_beyond_max_delay_is_delay_exceeds_max)
{
    struct sc_retry r = decide_cfg();
    uint64_t d = SENTINEL;

    cr_expect_eq(backoff_retry_decide(&r, 1, true, 60001, 0, &d), RETRY_DELAY_EXCEEDS_MAX);
    cr_expect_eq(backoff_retry_decide(&r, 1, true, UINT64_MAX / 2, 0, &d), RETRY_DELAY_EXCEEDS_MAX);
    /* exactly max_delay is allowed, and its jitter clamped */
    cr_expect_eq(backoff_retry_decide(&r, 1, true, 60000, 0, &d), RETRY_REQUEUE);
    cr_expect_eq(d, 60000);
    cr_expect_eq(backoff_retry_decide(&r, 1, true, 60000, 999, &d), RETRY_REQUEUE);
    cr_expect_eq(d, 60000);
    /* the hint replaces the backoff, with its own jitter */
    cr_expect_eq(backoff_retry_decide(&r, 4, true, 2000, 0, &d), RETRY_REQUEUE);
    cr_expect_eq(d, 2000);
    cr_expect_eq(backoff_retry_decide(&r, 4, true, 2000, 700, &d), RETRY_REQUEUE);
    cr_expect_eq(d, 2700);
    cr_expect_eq(backoff_retry_decide(&r, 1, true, 59000, 2000, &d), RETRY_REQUEUE);
    cr_expect_eq(d, 60000, "hint + jitter clamped to max_delay");
    /* a huge hint from a header goes the same way */
    {
        uint64_t hint = 0;

        cr_assert_eq(hint_retry_after("18446744073709551616", 0, &hint), 0);
        cr_expect_eq(backoff_retry_decide(&r, 1, true, hint, 0, &d), RETRY_DELAY_EXCEEDS_MAX);
    }
}

Test(backoff_retry_decide, backoff_is_clamped_to_max_delay)
{
    struct sc_retry r = decide_cfg();
    uint64_t d = SENTINEL;

    r.max_attempts = 100;
    cr_expect_eq(backoff_retry_decide(&r, 6, false, 0, 0, &d), RETRY_REQUEUE);
    cr_expect_eq(d, 32000);
    cr_expect_eq(backoff_retry_decide(&r, 7, false, 0, 0, &d), RETRY_REQUEUE);
    cr_expect_eq(d, 60000);
    cr_expect_eq(backoff_retry_decide(&r, 60, false, 0, 0, &d), RETRY_REQUEUE);
    cr_expect_eq(d, 60000);
    r.jitter = SC_JITTER_FULL;
    cr_expect_eq(backoff_retry_decide(&r, 60, false, 0, UINT64_MAX, &d), RETRY_REQUEUE);
    cr_expect_leq(d, 60000);
    cr_expect_geq(d, 1000);
    /* a max_delay under 1 s wins over the 1 s floor */
    r.max_delay_ms = 500;
    r.jitter = SC_JITTER_NONE;
    cr_expect_eq(backoff_retry_decide(&r, 1, false, 0, 0, &d), RETRY_REQUEUE);
    cr_expect_eq(d, 500);
}

Test(backoff_retry_decide, delay_is_at_least_1ms)
{
    struct sc_retry r = decide_cfg();
    uint64_t d = SENTINEL;

    cr_expect_eq(backoff_retry_decide(&r, 1, true, 0, 0, &d), RETRY_REQUEUE);
    cr_expect_eq(d, 1, "a hint of 0 without jitter is still 1 ms");
    cr_expect_eq(backoff_retry_decide(&r, 1, true, 0, 500, &d), RETRY_REQUEUE);
    cr_expect_eq(d, 500);
}

Test(backoff_retry_decide, random_inputs_stay_within_the_rules)
{
    uint64_t seed = 11;

    for (int i = 0; i < 20000; i++) {
        struct sc_retry r = retry(1 + splitmix(&seed) % 5000, 1 + (double)(splitmix(&seed) % 40) / 10,
                                  1 + splitmix(&seed) % (DAY_MS), (enum sc_jitter)(splitmix(&seed) % 3));
        uint32_t attempt = (uint32_t)(splitmix(&seed) % 12);
        bool has_hint = splitmix(&seed) % 2;
        uint64_t hint = splitmix(&seed) % (2 * DAY_MS), d = SENTINEL;
        enum retry_verdict v;

        r.max_attempts = 1 + (uint32_t)(splitmix(&seed) % 10);
        r.max_delay_ms = 1 + splitmix(&seed) % (3 * DAY_MS);
        v = backoff_retry_decide(&r, attempt, has_hint, hint, splitmix(&seed), &d);
        if (attempt >= r.max_attempts) {
            cr_assert_eq(v, RETRY_DEAD_LETTER);
        } else if (has_hint && hint > r.max_delay_ms) {
            cr_assert_eq(v, RETRY_DELAY_EXCEEDS_MAX);
        } else {
            uint64_t floor = has_hint ? hint : 1000;

            cr_assert_eq(v, RETRY_REQUEUE);
            cr_assert(d >= 1 && d <= r.max_delay_ms, "delay %llu, max %llu",
                      (unsigned long long)d, (unsigned long long)r.max_delay_ms);
            cr_assert_geq(d, floor < r.max_delay_ms ? (floor ? floor : 1) : r.max_delay_ms);
        }
    }
}

/* The defaults of docs/contract.md §2 (base 1s, x2, cap 6h, 8 attempts, 7d, full)
 * through the config loader. */
Test(backoff_retry_decide, default_retry_block)
{
    static const char yaml[] =
        "upstreams: { up: { url: http://127.0.0.1:9000 } }\n"
        "routes: [ { prefix: /, upstream: up } ]\n";
    struct sc_errors errs = {0};
    struct sc_config *cfg = NULL;
    const struct sc_retry *r;
    uint64_t d = SENTINEL;

    cr_assert_eq(config_load_string("t.yaml", yaml, strlen(yaml), &cfg, &errs), 0);
    r = &cfg->default_policy.retry;
    cr_expect_eq(backoff_retry_decide(r, 8, false, 0, 0, &d), RETRY_DEAD_LETTER);
    cr_expect_eq(backoff_retry_decide(r, 7, false, 0, 63999, &d), RETRY_REQUEUE);
    cr_expect_eq(d, 64000, "attempt 7: full jitter up to 2^6 s");
    cr_expect_eq(backoff_retry_decide(r, 7, false, 0, 64000, &d), RETRY_REQUEUE);
    cr_expect_eq(d, 1000);
    cr_expect_eq(backoff_retry_decide(r, 1, true, 7 * DAY_MS + 1, 0, &d), RETRY_DELAY_EXCEEDS_MAX);
    cr_expect_eq(backoff_retry_decide(r, 1, true, 7 * DAY_MS, 0, &d), RETRY_REQUEUE);
    cr_expect_eq(d, 7 * DAY_MS);
    sc_errors_free(&errs);
    config_free(cfg);
}
