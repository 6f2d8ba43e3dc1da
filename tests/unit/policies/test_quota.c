/* policies/quota.c: following the quota a partner advertises, on a fake
 * clock. What is read (three header styles, counted together), what an item
 * needs and what is ignored alone (malformed, absurd), reset moments and
 * "the same window", the effective rate within [min_rate, rate] net of the
 * requests in flight, the capacity, r = 0 as a pause, the rise of the rate at
 * a coming reset in predictions, and a bucket that follows it all exactly. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>

#include "policies/quota.h"
#include "policies/tbucket.h"

#define MS 1000000ull
#define SEC 1000000000ull
#define NOW0 (1000ull * SEC)            /* monotonic */
#define WALL0 1767225600000ull          /* 2026-01-01T00:00:00Z, Unix ms */

static struct quota q;

static void setup(void)
{
    quota_init(&q, 100, 1, 50);    /* rate 100/s, min_rate 1/s, burst 50 */
}

static struct quota_result feed(uint64_t now, struct quota_headers h,
                                uint32_t inflight)
{
    struct quota_result res;

    quota_update(&q, &h, now, WALL0 + (now - NOW0) / MS, inflight, &res);
    return res;
}

#define DRAFT(pol, rl) ((struct quota_headers){.policy = (pol), .ratelimit = (rl)})
#define OLD(l, r, t) ((struct quota_headers){.limit = (l), .remaining = (r), .reset = (t)})
#define XRL(l, r, t) ((struct quota_headers){.x_limit = (l), .x_remaining = (r), .x_reset = (t)})

TestSuite(quota, .init = setup);

/* ---- what is read ------------------------------------------------------------ */

Test(quota, nothing_advertised_is_the_configured_rate)
{
    struct quota_result res = feed(NOW0, (struct quota_headers){0}, 0);

    cr_expect_eq(res.items, 0);
    cr_expect_eq(res.ignored, 0);
    cr_expect_float_eq(quota_rate(&q, NOW0), 100.0, 1e-9);
    cr_expect_eq(quota_capacity(&q, NOW0), 50);
    cr_expect_not(quota_limits(&q, NOW0));
    cr_expect_eq(quota_next_change(&q, NOW0), UINT64_MAX);
}

Test(quota, the_draft_matches_policy_items_by_name)
{
    struct quota_result res = feed(NOW0, DRAFT("\"burst\";q=100;w=60, \"day\";q=5000;w=86400",
                                               "\"day\";r=4000;t=40000, \"burst\";r=40;t=20"), 0);

    cr_assert_eq(res.items, 2);
    cr_expect_eq(res.ignored, 0);
    cr_assert_eq(q.n, 2);
    cr_expect_str_eq(q.items[0].name, "day");
    cr_expect_eq(q.items[0].q, 5000);
    cr_expect_eq(q.items[0].w, 86400);
    cr_expect_eq(q.items[0].r, 4000);
    cr_expect_eq(q.items[0].moment, NOW0 + 40000 * SEC);
    cr_expect_str_eq(q.items[1].name, "burst");
    cr_expect_eq(q.items[1].q, 100);
    cr_expect_eq(q.items[1].w, 60);
    cr_expect_eq(q.at, NOW0);
    cr_expect_eq(q.at_wall_ms, WALL0);
    /* burst allows 40 / 20 s = 2/s, day 4000 / 40000 s = 0.1/s: the day
     * governs, but never below min_rate (1/s). */
    cr_expect_float_eq(quota_rate(&q, NOW0), 1.0, 1e-9);
    cr_expect(quota_limits(&q, NOW0));
}

Test(quota, a_ratelimit_item_without_its_policy_has_no_limit_or_window)
{
    feed(NOW0, DRAFT(NULL, "tok;r=10;t=5"), 0);
    cr_assert_eq(q.n, 1);
    cr_expect_str_eq(q.items[0].name, "tok", "a Token names it too");
    cr_expect_not(q.items[0].has_q);
    cr_expect_not(q.items[0].has_w);
    cr_expect_float_eq(quota_rate(&q, NOW0), 2.5, 1e-9,
                       "spent by 1 s before its reset (whole seconds)");
    cr_expect_float_eq(quota_rate(&q, NOW0 + 5 * SEC), 100.0, 1e-9,
                       "after its reset, without q and w: the configured rate");
}

Test(quota, the_older_draft_is_one_item_with_an_optional_window)
{
    struct quota_result res = feed(NOW0, OLD("100;w=60", "30", "11"), 0);

    cr_assert_eq(res.items, 1);
    cr_expect_eq(q.items[0].style, QUOTA_OLD_DRAFT);
    cr_expect_str_eq(q.items[0].name, "");
    cr_expect_eq(q.items[0].q, 100);
    cr_expect_eq(q.items[0].w, 60);
    cr_expect_float_eq(quota_rate(&q, NOW0), 3.0, 1e-9, "30 by 1 s before its reset");
    cr_expect_float_eq(quota_rate(&q, NOW0 + 11 * SEC), 100.0 / 60, 1e-9, "q / w");
    feed(NOW0, OLD("100", "30", "10"), 0);
    cr_expect(q.items[0].has_q);
    cr_expect_not(q.items[0].has_w);
}

Test(quota, x_reset_is_a_unix_time_above_1e9_else_seconds)
{
    feed(NOW0, XRL("5000", "4999", "1767225660"), 0);   /* WALL0 + 60 s */
    cr_assert_eq(q.n, 1);
    cr_expect_eq(q.items[0].style, QUOTA_X);
    cr_expect_eq(q.items[0].moment, NOW0 + 60 * SEC);
    cr_expect_eq(q.items[0].q, 5000);
    cr_expect_not(q.items[0].has_w, "the X- style has no window");
    feed(NOW0, XRL(NULL, "10", "1767225600.250"), 0);   /* a fraction after now */
    cr_expect_eq(q.items[0].moment, NOW0 + 250 * MS);
    feed(NOW0, XRL(NULL, "10", "30"), 0);
    cr_expect_eq(q.items[0].moment, NOW0 + 30 * SEC, "seconds");
    /* 10^9 itself is not above 10^9: seconds, 31 years: absurd, ignored. */
    cr_expect_eq(feed(NOW0, XRL(NULL, "10", "1000000000"), 0).items, 0);
    cr_expect_eq(q.items[0].moment, NOW0 + 30 * SEC, "the state is kept");
}

Test(quota, a_unix_time_in_the_past_is_now)
{
    feed(NOW0, XRL("100", "0", "1767225000"), 0);
    cr_assert_eq(q.n, 1);
    cr_expect_eq(q.items[0].moment, NOW0);
    cr_expect_float_eq(quota_rate(&q, NOW0), 100.0, 1e-9, "past its moment");
}

Test(quota, every_style_present_counts_and_the_most_restrictive_governs)
{
    struct quota_headers h = {
        .policy = "\"a\";q=1000;w=3600", .ratelimit = "\"a\";r=500;t=101",
        .limit = "60", .remaining = "30", .reset = "11",
        .x_limit = "10", .x_remaining = "8", .x_reset = "3",
    };
    struct quota_result res = feed(NOW0, h, 0);

    cr_expect_eq(res.items, 3);
    /* Each spent by 1 s before its reset: a 5/s, older draft 3/s, X 4/s. */
    cr_expect_float_eq(quota_rate(&q, NOW0), 3.0, 1e-9);
    /* After 3 s the X item has reset (to the configured rate: no window). */
    cr_expect_float_eq(quota_rate(&q, NOW0 + 3 * SEC), 3.0, 1e-9);
    cr_expect_float_eq(quota_rate(&q, NOW0 + 11 * SEC), 5.0, 1e-9);
    /* After 101 s, a allows q / w = 0.28/s: below min_rate (1/s). */
    cr_expect_float_eq(quota_rate(&q, NOW0 + 101 * SEC), 1.0, 1e-9);
}

static const char *const header_names[] = {
    "RateLimit-Policy", "RateLimit", "RateLimit-Limit", "RateLimit-Remaining",
    "RateLimit-Reset", "X-RateLimit-Limit", "X-RateLimit-Remaining",
    "X-RateLimit-Reset",
};

/* Answers each name with the entry of header_names it equals. */
static const char *by_name(void *arg, const char *name)
{
    for (size_t i = 0; i < 8; i++)
        if (!strcmp(header_names[i], name))
            return header_names[i];
    return NULL;
}

Test(quota, each_field_is_read_from_its_header)
{
    struct quota_headers h;

    quota_headers_get(&h, by_name, NULL);
    cr_expect_eq(h.policy, header_names[0]);
    cr_expect_eq(h.ratelimit, header_names[1]);
    cr_expect_eq(h.limit, header_names[2]);
    cr_expect_eq(h.remaining, header_names[3]);
    cr_expect_eq(h.reset, header_names[4]);
    cr_expect_eq(h.x_limit, header_names[5]);
    cr_expect_eq(h.x_remaining, header_names[6]);
    cr_expect_eq(h.x_reset, header_names[7]);
}

/* ---- what an item needs; what is ignored, alone ------------------------------ */

Test(quota, an_item_needs_r_and_t)
{
    struct quota_result res;

    res = feed(NOW0, DRAFT(NULL, "\"a\";r=5, \"b\";t=5, \"c\";r=5;t=5"), 0);
    cr_expect_eq(res.items, 1);
    cr_expect_eq(res.ignored, 2);
    cr_expect_str_eq(q.items[0].name, "c");
    res = feed(NOW0, OLD("100", "5", NULL), 0);
    cr_expect_eq(res.items, 0);
    cr_expect_eq(res.ignored, 1);
    res = feed(NOW0, XRL("100", NULL, "5"), 0);
    cr_expect_eq(res.items, 0);
    cr_expect_eq(res.ignored, 1);
    cr_expect_str_eq(q.items[0].name, "c", "no item: the state is unchanged");
}

Test(quota, a_header_that_does_not_parse_is_ignored_alone)
{
    struct quota_headers h = {
        .policy = "\"a\";q=10;w=10,", .ratelimit = "\"a\";r=5;t=5",   /* trailing comma */
        .remaining = "3", .reset = "3",
    };
    struct quota_result res = feed(NOW0, h, 0);

    cr_expect_eq(res.items, 2);
    cr_expect_eq(res.ignored, 1);
    cr_expect_not(q.items[0].has_q, "its policy did not parse");
    h.ratelimit = "\"a\";r=5;t=5 garbage";
    res = feed(NOW0, h, 0);
    cr_expect_eq(res.items, 1, "the older draft still counts");
    cr_expect_eq(q.items[0].style, QUOTA_OLD_DRAFT);
    /* A malformed limit leaves the item without one. */
    res = feed(NOW0, OLD("lots", "3", "3"), 0);
    cr_expect_eq(res.items, 1);
    cr_expect_eq(res.ignored, 1);
    cr_expect_not(q.items[0].has_q);
}

/* Huge, negative, non-integer, overflowing, zero windows, far resets: each
 * refused alone, the others of the response kept. */
Test(quota, absurd_values_are_ignored)
{
    static const char *const bad_rl[] = {
        "\"a\";r=-1;t=5", "\"a\";r=1.5;t=5", "\"a\";r=5;t=-1", "\"a\";r=5;t=2.5",
        "\"a\";r=5;t=34560001", "\"a\";r=\"5\";t=5", "\"a\";r=?1;t=5", "5;r=5;t=5",
    };
    static const char *const bad_count[] = {
        "-1", "1.5", "1e3", "", " ", "0x10", "+5", "1000000000000000", "5 5", "5,6",
        "99999999999999999999999999",
    };
    struct quota_result res;

    for (size_t i = 0; i < sizeof bad_rl / sizeof *bad_rl; i++) {
        res = feed(NOW0, DRAFT(NULL, bad_rl[i]), 0);
        cr_expect_eq(res.items, 0, "%s", bad_rl[i]);
        cr_expect_eq(res.ignored, 1, "%s", bad_rl[i]);
    }
    /* RFC 8941 Integers have at most 15 digits: 16 make the List malformed. */
    res = feed(NOW0, DRAFT(NULL, "\"a\";r=1000000000000000;t=5"), 0);
    cr_expect_eq(res.items, 0);
    for (size_t i = 0; i < sizeof bad_count / sizeof *bad_count; i++) {
        res = feed(NOW0, OLD(NULL, bad_count[i], "5"), 0);
        cr_expect_eq(res.items, 0, "remaining \"%s\"", bad_count[i]);
        res = feed(NOW0, OLD(NULL, "5", bad_count[i]), 0);
        cr_expect_eq(res.items, 0, "reset \"%s\"", bad_count[i]);
        res = feed(NOW0, XRL(NULL, bad_count[i], "5"), 0);
        cr_expect_eq(res.items, 0, "x remaining \"%s\"", bad_count[i]);
    }
    cr_expect_eq(feed(NOW0, XRL(NULL, "5", "5.5"), 0).items, 0,
                 "decimals only in a Unix time");
    cr_expect_eq(feed(NOW0, XRL(NULL, "5", "1767225600."), 0).items, 0);
    cr_expect_eq(feed(NOW0, XRL(NULL, "5", "9999999999"), 0).items, 0,
                 "a Unix time beyond 400 days from now");
    cr_expect_eq(feed(NOW0, OLD("100;w=0", "5", "5"), 0).ignored, 1, "w = 0");
    cr_expect_eq(feed(NOW0, XRL(NULL, " 7 ", "\t5"), 0).items, 1, "spaces around");
    cr_expect_eq(q.items[0].r, 7);
    cr_expect_eq(feed(NOW0, OLD(NULL, "999999999999999", "34560000"), 0).items, 1,
                 "15 digits and 400 days are still in bounds");
}

Test(quota, a_bad_policy_item_leaves_its_item_without_limit_and_window)
{
    struct quota_result res = feed(NOW0, DRAFT("\"a\";q=-5;w=10, \"b\";q=10;w=0",
                                               "\"a\";r=5;t=5, \"b\";r=5;t=5"), 0);

    cr_expect_eq(res.items, 2);
    cr_expect_eq(res.ignored, 2);
    cr_expect_not(q.items[0].has_q);
    cr_expect_not(q.items[1].has_w);
}

Test(quota, a_quota_of_bytes_says_nothing_about_requests)
{
    struct quota_result res = feed(NOW0, DRAFT("\"b\";q=1000000;w=60;qu=\"content-bytes\", "
                                               "\"r\";q=100;w=60;qu=\"requests\"",
                                               "\"b\";r=10;t=60, \"r\";r=50;t=60"), 0);

    cr_expect_eq(res.items, 1);
    cr_expect_eq(res.ignored, 1);
    cr_expect_str_eq(q.items[0].name, "r");
}

Test(quota, beyond_eight_items_the_rest_is_ignored)
{
    struct quota_result res = feed(NOW0, DRAFT(NULL,
        "a;r=1;t=9, b;r=1;t=9, c;r=1;t=9, d;r=1;t=9, e;r=1;t=9, f;r=1;t=9, "
        "g;r=1;t=9, h;r=1;t=9, i;r=1;t=9, j;r=1;t=9"), 0);

    cr_expect_eq(res.items, QUOTA_ITEMS_MAX);
    cr_expect_eq(res.ignored, 2);
}

Test(quota, a_repeated_name_counts_once)
{
    struct quota_result res = feed(NOW0, DRAFT(NULL, "a;r=9;t=9, a;r=1;t=9"), 0);

    cr_expect_eq(res.items, 1);
    cr_expect_eq(res.ignored, 1);
    cr_expect_eq(q.items[0].r, 9, "the first");
}

Test(quota, long_names_are_cut_for_show_but_told_apart)
{
    struct quota_result res = feed(NOW0, DRAFT(NULL,
        "\"a-very-long-quota-name-number-1\";r=1;t=9, "
        "\"a-very-long-quota-name-number-2\";r=2;t=9"), 0);

    cr_expect_eq(res.items, 2);
    cr_expect_str_eq(q.items[0].name, "a-very-long-quota-name-");
    cr_expect_neq(q.items[0].id, q.items[1].id);
}

/* ---- reset moments and the same window -------------------------------------- */

Test(quota, a_later_moment_within_a_second_is_the_same_window)
{
    feed(NOW0, DRAFT(NULL, "a;r=20;t=10"), 0);
    /* 400 ms later, t = 10 again: its moment is 400 ms after the kept one. */
    feed(NOW0 + 400 * MS, DRAFT(NULL, "a;r=19;t=10"), 0);
    cr_expect_eq(q.items[0].moment, NOW0 + 10 * SEC, "the earlier one is kept");
    cr_expect_float_eq(quota_rate(&q, NOW0 + 400 * MS), 19 / 8.6, 1e-9,
                       "by 1 s before the kept moment");
    /* An earlier moment is the earlier one: taken. */
    feed(NOW0 + 1 * SEC, DRAFT(NULL, "a;r=18;t=8"), 0);
    cr_expect_eq(q.items[0].moment, NOW0 + 9 * SEC);
    /* 1 s or more later starts a new window. */
    feed(NOW0 + 2 * SEC, DRAFT(NULL, "a;r=18;t=8"), 0);
    cr_expect_eq(q.items[0].moment, NOW0 + 10 * SEC);
}

Test(quota, a_passed_moment_ends_its_window)
{
    feed(NOW0, XRL(NULL, "5", "10"), 0);
    feed(NOW0 + 10 * SEC, XRL(NULL, "100", "0"), 0);
    cr_expect_eq(q.items[0].moment, NOW0 + 10 * SEC);
    feed(NOW0 + 10 * SEC + 500 * MS, XRL(NULL, "99", "10"), 0);
    cr_expect_eq(q.items[0].moment, NOW0 + 20500 * MS,
                 "the kept moment had passed: a new window, not the same");
}

Test(quota, the_same_item_is_the_same_name_or_style)
{
    feed(NOW0, DRAFT(NULL, "a;r=20;t=10"), 0);
    feed(NOW0 + 500 * MS, DRAFT(NULL, "b;r=20;t=10"), 0);
    cr_expect_eq(q.items[0].moment, NOW0 + 10500 * MS, "another name");
    feed(NOW0, OLD(NULL, "20", "10"), 0);
    feed(NOW0 + 500 * MS, XRL(NULL, "20", "10"), 0);
    cr_expect_eq(q.items[0].moment, NOW0 + 10500 * MS, "another style");
}

/* ---- the effective rate ----------------------------------------------------- */

Test(quota, requests_in_flight_are_spent_already)
{
    feed(NOW0, DRAFT(NULL, "a;r=50;t=11"), 20);
    cr_expect_float_eq(quota_rate(&q, NOW0), 3.0, 1e-9, "(50 - 20) / (11 - 1) s");
    feed(NOW0, DRAFT(NULL, "a;r=50;t=11"), 60);
    cr_expect_float_eq(quota_rate(&q, NOW0), 1.0, 1e-9, "nothing left: min_rate");
}

Test(quota, the_rate_is_fixed_until_a_moment_not_recomputed_as_time_passes)
{
    feed(NOW0, DRAFT(NULL, "a;r=50;t=11"), 0);
    /* (50 - f) / (m - 1 s - now) was computed at the response: 5/s spends
     * it by 1 s before m; recomputing with the same r later would
     * overspend. */
    cr_expect_float_eq(quota_rate(&q, NOW0 + 9 * SEC), 5.0, 1e-9);
    cr_expect_eq(quota_next_change(&q, NOW0), NOW0 + 10 * SEC, "spent");
    cr_expect_float_eq(quota_rate(&q, NOW0 + 10500 * MS), 0.0, 1e-9,
                       "nothing more until its reset, not even min_rate");
    cr_expect_eq(quota_next_change(&q, NOW0 + 10 * SEC), NOW0 + 11 * SEC, "its reset");
    cr_expect_eq(quota_next_change(&q, NOW0 + 11 * SEC), UINT64_MAX);
}

/* Where permits may start again (a fleet's bucket holds a quiet time
 * until then, stage_permit): the reset after a window's spent end; with
 * two windows spent one after the other, the later reset. An answer
 * within the last second spends until its reset: no quiet. */
Test(quota, permits_resume_at_the_reset_after_a_spent_end)
{
    feed(NOW0, DRAFT(NULL, "a;r=50;t=11"), 0);
    cr_expect_eq(quota_resume_at(&q, NOW0 + 9 * SEC), NOW0 + 9 * SEC, "still spending");
    cr_expect_eq(quota_resume_at(&q, NOW0 + 10 * SEC), NOW0 + 11 * SEC, "spent: its reset");
    cr_expect_eq(quota_resume_at(&q, NOW0 + 11 * SEC), NOW0 + 11 * SEC, "reset");
    feed(NOW0, DRAFT(NULL, "a;r=5;t=3, b;r=5;t=4"), 0);
    /* a spent by 2 s, its reset at 3 s; b spent by 3 s, its reset at 4 s. */
    cr_expect_eq(quota_resume_at(&q, NOW0 + 2 * SEC), NOW0 + 4 * SEC, "both, one after the other");
    feed(NOW0, DRAFT(NULL, "a;r=5;t=1"), 0);
    cr_expect_eq(quota_resume_at(&q, NOW0 + 500 * MS), NOW0 + 500 * MS,
                 "an answer in the last second spends until its reset");
}

Test(quota, never_above_rate_nor_below_min_rate)
{
    feed(NOW0, DRAFT("a;q=100000;w=1", "a;r=100000;t=1"), 0);
    cr_expect_float_eq(quota_rate(&q, NOW0), 100.0, 1e-9);
    cr_expect_float_eq(quota_rate(&q, NOW0 + SEC), 100.0, 1e-9);
    cr_expect_not(quota_limits(&q, NOW0));
    feed(NOW0, DRAFT("a;q=1;w=86400", "a;r=1;t=86400"), 0);
    cr_expect_float_eq(quota_rate(&q, NOW0), 1.0, 1e-9);
    cr_expect(quota_limits(&q, NOW0));
    /* A min_rate above the rate is the rate. */
    quota_init(&q, 10, 20, 5);
    cr_expect_float_eq(quota_rate(&q, NOW0), 10.0, 1e-9);
}

Test(quota, a_response_with_items_replaces_the_state)
{
    feed(NOW0, DRAFT(NULL, "a;r=10;t=10, b;r=5;t=10"), 0);
    feed(NOW0 + SEC, XRL(NULL, "80", "11"), 0);
    cr_assert_eq(q.n, 1, "a and b are gone");
    cr_expect_eq(q.items[0].style, QUOTA_X);
    cr_expect_float_eq(quota_rate(&q, NOW0 + SEC), 8.0, 1e-9);
    /* A response without items changes nothing. */
    feed(NOW0 + 2 * SEC, (struct quota_headers){.x_limit = "5"}, 0);
    cr_expect_eq(q.n, 1);
    cr_expect_eq(q.at, NOW0 + SEC);
}

/* ---- the capacity ------------------------------------------------------------ */

Test(quota, capacity_is_the_smallest_r_then_q_never_below_1)
{
    feed(NOW0, DRAFT("a;q=30;w=60, b;q=100;w=3600", "a;r=7;t=10, b;r=80;t=100"), 0);
    cr_expect_eq(quota_capacity(&q, NOW0), 7);
    cr_expect_eq(quota_capacity(&q, NOW0 + 10 * SEC), 30, "a's q after its reset");
    cr_expect_eq(quota_capacity(&q, NOW0 + 100 * SEC), 30);
    feed(NOW0, DRAFT(NULL, "a;r=1000;t=10"), 0);
    cr_expect_eq(quota_capacity(&q, NOW0), 50, "never above burst");
    cr_expect_eq(quota_capacity(&q, NOW0 + 10 * SEC), 50, "no q: burst");
    feed(NOW0, DRAFT(NULL, "a;r=0;t=10"), 0);
    cr_expect_eq(quota_capacity(&q, NOW0), 1);
    feed(NOW0, DRAFT("a;q=0;w=10", "a;r=0;t=10"), 0);
    cr_expect_eq(quota_capacity(&q, NOW0 + 10 * SEC), 1);
}

/* ---- r = 0 ------------------------------------------------------------------- */

Test(quota, r_0_pauses_until_the_latest_exhausted_moment)
{
    struct quota_result res = feed(NOW0, DRAFT(NULL, "a;r=0;t=5, b;r=0;t=30, c;r=9;t=60"), 0);

    cr_expect_eq(res.pause_until, NOW0 + 30 * SEC);
    res = feed(NOW0, XRL(NULL, "0", "0"), 0);
    cr_expect_eq(res.pause_until, 0, "a reset now pauses nothing");
    res = feed(NOW0, XRL(NULL, "1", "60"), 0);
    cr_expect_eq(res.pause_until, 0);
    /* On any response, and the same window keeps the earlier moment. */
    feed(NOW0, OLD(NULL, "3", "10"), 0);
    res = feed(NOW0 + 300 * MS, OLD(NULL, "0", "10"), 0);
    cr_expect_eq(res.pause_until, NOW0 + 10 * SEC);
}

/* ---- predictions: the rise at a coming reset ---------------------------------- */

Test(quota, accrual_counts_the_rise_at_a_coming_reset)
{
    feed(NOW0, DRAFT("a;q=600;w=60", "a;r=20;t=11"), 0);
    /* 2/s for 10 s, nothing in the last second, then 10/s. */
    cr_expect_eq(quota_accrue_ns(&q, NOW0, false, 10 * TB_ONE), 5 * SEC);
    cr_expect_eq(quota_accrue_ns(&q, NOW0, false, 20 * TB_ONE), 10 * SEC);
    /* The 21st is the reset's top-up, at 11 s: then 9 at 10/s. */
    cr_expect_eq(quota_accrue_ns(&q, NOW0, false, 21 * TB_ONE), 11 * SEC);
    cr_expect_eq(quota_accrue_ns(&q, NOW0, false, 30 * TB_ONE), 11 * SEC + 900 * MS);
    cr_expect_eq(quota_accrue_ns(&q, NOW0 + 8 * SEC, false, 14 * TB_ONE), 3900 * MS);
    cr_expect_eq(quota_accrue_ns(&q, NOW0, false, 0), 0);
}

Test(quota, a_bucket_predicts_with_the_quota)
{
    struct tbucket b;

    feed(NOW0, DRAFT("a;q=600;w=60", "a;r=20;t=11"), 0);
    tbucket_init(&b, 100, 50, NOW0);
    quota_bucket_sync(&q, &b, NOW0);
    cr_expect_float_eq(tbucket_tokens(&b, NOW0), 20.0, 1e-9, "capacity: r");
    /* 20 held, then 2/s until 1 s before the reset, nothing until it,
     * its top-up, then 10/s. */
    cr_expect_eq(tbucket_wait_ns(&b, NOW0, 40, quota_accrue_ns, &q), 10 * SEC);
    cr_expect_eq(tbucket_wait_ns(&b, NOW0, 41, quota_accrue_ns, &q), 11 * SEC);
    cr_expect_eq(tbucket_wait_ns(&b, NOW0, 50, quota_accrue_ns, &q), 11 * SEC + 900 * MS);
    cr_expect_eq(tbucket_wait_ns(&b, NOW0, 40, NULL, NULL), 10 * SEC,
                 "the bucket's own rate (2/s) sees no rise");
    cr_expect_eq(tbucket_wait_ns(&b, NOW0, 50, NULL, NULL), 15 * SEC);
}

/* ---- a reset's first token ----------------------------------------------------- */

/* A window spent out (r = 0) pauses the bucket until its reset; the reset's
 * first permit is there at the reset, not one interval (w / q) after it, and
 * the keeper's prediction says so. */
Test(quota, the_first_token_after_a_reset_is_not_late)
{
    struct quota_result res;
    struct tbucket b;

    quota_init(&q, 100, 1, 10);
    tbucket_init(&b, 100, 10, NOW0);
    res = feed(NOW0, DRAFT("a;q=20;w=2", "a;r=0;t=1"), 0);
    quota_bucket_sync(&q, &b, NOW0);
    cr_assert_eq(res.pause_until, NOW0 + SEC);
    tbucket_pause_until(&b, NOW0, res.pause_until);
    cr_expect_eq(tbucket_wait_ns(&b, NOW0, 1, quota_accrue_ns, &q), SEC);
    cr_expect_eq(tbucket_wait_ns(&b, NOW0, 3, quota_accrue_ns, &q), SEC + 200 * MS,
                 "then q / w = 10/s");
    quota_bucket_sync(&q, &b, NOW0 + SEC - 1);
    cr_expect_not(tbucket_take(&b, NOW0 + SEC - 1));
    quota_bucket_sync(&q, &b, NOW0 + SEC);
    cr_expect(tbucket_take(&b, NOW0 + SEC), "the reset's first permit at the reset");
    cr_expect_not(tbucket_take(&b, NOW0 + SEC), "one token, not a full bucket");
    quota_bucket_sync(&q, &b, NOW0 + SEC + 100 * MS - 1);
    cr_expect_not(tbucket_take(&b, NOW0 + SEC + 100 * MS - 1));
    quota_bucket_sync(&q, &b, NOW0 + SEC + 100 * MS);
    cr_expect(tbucket_take(&b, NOW0 + SEC + 100 * MS));
}

/* No top-up where the partner allows nothing, nor inside another pause. */
Test(quota, a_reset_tops_up_only_what_the_partner_allows)
{
    struct tbucket b;

    quota_init(&q, 100, 1, 10);
    tbucket_init(&b, 100, 10, NOW0);
    /* The day's quota is spent until 5 s: its pause capped (max_delay) at 1 s. */
    feed(NOW0, DRAFT("a;q=20;w=2", "a;r=0;t=1, day;r=0;t=5"), 0);
    quota_bucket_sync(&q, &b, NOW0);
    tbucket_pause_until(&b, NOW0, NOW0 + SEC);
    cr_expect_not(quota_reset_tops_up(&q, NOW0 + SEC));
    quota_bucket_sync(&q, &b, NOW0 + SEC);
    cr_expect_not(tbucket_take(&b, NOW0 + SEC), "day has none left");
    cr_expect_eq(tbucket_wait_ns(&b, NOW0 + SEC, 1, quota_accrue_ns, &q), SEC,
                 "min_rate until day's reset");
    /* A 429's pause beyond the reset: the bucket resumes empty at its end. */
    tbucket_init(&b, 100, 10, NOW0);
    feed(NOW0, DRAFT("a;q=20;w=2", "a;r=0;t=1"), 0);
    quota_bucket_sync(&q, &b, NOW0);
    cr_expect(quota_reset_tops_up(&q, NOW0 + SEC));
    tbucket_pause_until(&b, NOW0, NOW0 + 1500 * MS);
    quota_bucket_sync(&q, &b, NOW0 + 1500 * MS);
    cr_expect_not(tbucket_take(&b, NOW0 + 1500 * MS));
    cr_expect_eq(tbucket_wait_ns(&b, NOW0 + 1500 * MS, 1, quota_accrue_ns, &q), 100 * MS);
    /* A limit of 0 from the reset on. */
    feed(NOW0, DRAFT("a;q=0;w=2", "a;r=0;t=1"), 0);
    cr_expect_not(quota_reset_tops_up(&q, NOW0 + SEC));
}

/* The answer that leaves one permit (the smallest r - f) tops up: that
 * permit goes now, not at the moment, past the partner's reset. */
Test(quota, an_answer_leaving_one_permit_tops_up)
{
    struct quota_result res;

    res = feed(NOW0, DRAFT("a;q=20;w=2", "a;r=1;t=1"), 0);
    cr_expect(res.top_up);
    res = feed(NOW0, DRAFT("a;q=20;w=2", "a;r=3;t=1"), 2);
    cr_expect(res.top_up, "r - f = 1");
    res = feed(NOW0, DRAFT("a;q=20;w=2", "a;r=2;t=1"), 0);
    cr_expect_not(res.top_up, "two left: spent evenly");
    res = feed(NOW0, DRAFT(NULL, "a;r=1;t=1, day;r=0;t=60"), 0);
    cr_expect_not(res.top_up, "another item has none left");
    res = feed(NOW0, DRAFT(NULL, "a;r=1;t=1, day;r=900;t=60"), 0);
    cr_expect(res.top_up, "the smallest counts");
    res = feed(NOW0, XRL("20", "1", "1"), 0);
    cr_expect(res.top_up, "every style");
}

/* A partner with fixed windows of Q per W s (not aligned to the sidecar's
 * clock), its reset in whole seconds rounded up, answering every request
 * LAT after it is sent; the sidecar takes every token as it comes, counts
 * those in flight, tops up as an answer says, pauses at r = 0. The partner
 * never refuses (each window gets at most Q), and from the second window on
 * each gets Q: the window's last permit is not pushed past the reset (the
 * moment is after it by the answer's way back), nor its first one late. */
#define PW_Q 20
#define PW_W 2
#define PW_WINDOWS 12
#define PW_LAT (3 * MS)
#define PW_EPOCH (NOW0 + 370 * MS)

struct pw_sent {
    uint64_t answer_at;
    uint64_t r, t;
    char unix_reset[24];
};

/* The simulation: the partner's answers in the draft's style (t, delta
 * seconds) or the X- style (a Unix time). Fills used[] per window and
 * returns the requests the partner refused. */
static uint64_t partner_windows(bool x_style, uint64_t used[PW_WINDOWS + 1])
{
    static struct pw_sent sent[PW_Q * PW_WINDOWS * 2];
    uint64_t refused = 0, head = 0, tail = 0;
    uint64_t end_all = PW_EPOCH + PW_WINDOWS * PW_W * SEC;
    struct tbucket b;
    char rl[64], rs[24];

    quota_init(&q, 100, 1, 10);
    tbucket_init(&b, 100, 10, NOW0);
    for (uint64_t now = NOW0; now < end_all; now += MS / 4) {
        quota_bucket_sync(&q, &b, now);
        for (; head < tail && sent[head].answer_at <= now; head++) {
            struct quota_result res;
            uint32_t in_flight = (uint32_t)(tail - head - 1);

            snprintf(rl, sizeof rl, "a;r=%llu;t=%llu", (unsigned long long)sent[head].r,
                     (unsigned long long)sent[head].t);
            snprintf(rs, sizeof rs, "%llu", (unsigned long long)sent[head].r);
            res = x_style ? feed(now, XRL("20", rs, sent[head].unix_reset), in_flight)
                          : feed(now, DRAFT("a;q=20;w=2", rl), in_flight);
            quota_bucket_sync(&q, &b, now);
            if (res.top_up)
                tbucket_top_up(&b, now);
            if (res.pause_until > now)
                tbucket_pause_until(&b, now, res.pause_until);
        }
        while (tbucket_take(&b, now)) {
            uint64_t k = now < PW_EPOCH ? 0 : (now - PW_EPOCH) / (PW_W * SEC) + 1;
            uint64_t wend = PW_EPOCH + k * PW_W * SEC;
            uint64_t wend_wall_ms = WALL0 + (wend - NOW0) / MS;

            cr_assert_lt(tail, sizeof sent / sizeof sent[0]);
            if (used[k] >= PW_Q)
                refused++;
            else
                used[k]++;
            sent[tail].answer_at = now + PW_LAT;
            sent[tail].r = PW_Q - used[k];
            sent[tail].t = (wend - now + SEC - 1) / SEC;
            /* The window's end as a Unix time, rounded up (as the stub's). */
            snprintf(sent[tail].unix_reset, sizeof sent[tail].unix_reset, "%llu",
                     (unsigned long long)((wend_wall_ms + 999) / 1000));
            tail++;
        }
    }
    return refused;
}

/* The partner refused none, and from the second window on each got Q. */
static void expect_every_window_full(bool x_style)
{
    uint64_t used[PW_WINDOWS + 1] = {0};

    cr_expect_eq(partner_windows(x_style, used), 0, "the partner refused none");
    for (int k = 2; k <= PW_WINDOWS; k++)
        cr_expect_eq(used[k], PW_Q, "window %d: %llu of %d", k,
                     (unsigned long long)used[k], PW_Q);
}

Test(quota, each_window_gets_the_advertised_limit_and_no_more)
{
    expect_every_window_full(false);
}

/* The same partner in the X- style: its reset a whole Unix second, up to
 * 1 s after the window's end (here 630 ms), the same in every answer of a
 * window, so no answer says more. Spent evenly until that second, the
 * window's last permits would fall into the next one, which then starts
 * short: each window would get about 0.78 of its limit. */
Test(quota, a_whole_second_unix_reset_is_spent_by_its_earliest_moment)
{
    expect_every_window_full(true);
}

/* ---- a bucket that follows --------------------------------------------------- */

Test(quota, the_bucket_accrues_the_effective_rate_exactly)
{
    struct tbucket b;
    uint64_t n = 0;

    tbucket_init(&b, 100, 50, NOW0);
    quota_bucket_sync(&q, &b, NOW0);
    cr_expect_eq(tbucket_take(&b, NOW0), true);
    /* The partner says 10 left for 5 s, then 60 a minute. */
    quota_bucket_sync(&q, &b, NOW0 + SEC);
    feed(NOW0 + SEC, DRAFT("a;q=60;w=60", "a;r=10;t=5"), 0);
    quota_bucket_sync(&q, &b, NOW0 + SEC);
    cr_expect_float_eq(tbucket_tokens(&b, NOW0 + SEC), 10.0, 1e-9, "capacity 10");
    while (tbucket_take(&b, NOW0 + SEC))
        n++;
    cr_expect_eq(n, 10);
    /* Synced only now, 7 s later: 2/s for the 5 s to the reset (10, the
     * capacity then), then 1/s for 2 s under a capacity of 50 = 12. A bucket
     * that took today's numbers for the whole 7 s would hold 7 or 10. */
    quota_bucket_sync(&q, &b, NOW0 + 8 * SEC);
    cr_expect_float_eq(tbucket_tokens(&b, NOW0 + 8 * SEC), 12.0, 1e-6);
    cr_expect_eq(quota_capacity(&q, NOW0 + 8 * SEC), 50, "q = 60, burst 50");
}

Test(quota, a_lower_capacity_drops_tokens_at_the_sync)
{
    struct tbucket b;

    tbucket_init(&b, 100, 50, NOW0);
    feed(NOW0, DRAFT(NULL, "a;r=3;t=60"), 0);
    quota_bucket_sync(&q, &b, NOW0);
    cr_expect_float_eq(tbucket_tokens(&b, NOW0), 3.0, 1e-12);
}

/* ---- the bound with the effective rate, by brute force ------------------------ */

#define RUNS 30
#define STEPS 300
#define MAX_GRANTS 3000

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t below(uint64_t *s, uint64_t n)
{
    return n ? splitmix(s) % n : 0;
}

struct grants {
    double at_int[MAX_GRANTS];   /* the effective rate integrated up to it */
    double cap[MAX_GRANTS];      /* the capacity in force at it */
    uint64_t at_resets[MAX_GRANTS]; /* top-ups possible up to it */
    size_t n;
    double integral;
    uint64_t resets;
    uint64_t t;
};

/* The effective rate integrated from g->t to `to`, piece by piece between
 * the resets the state knows, and those resets counted. */
static void integrate(struct grants *g, uint64_t to)
{
    while (g->t < to) {
        uint64_t next = quota_next_change(&q, g->t);
        uint64_t end = next < to ? next : to;

        g->integral += quota_rate(&q, g->t) * (double)(end - g->t) / 1e9;
        g->resets += next <= to;
        g->t = end;
    }
}

static struct quota_result random_response(uint64_t *seed, uint64_t now)
{
    char pol[128], rl[128];
    uint64_t r = below(seed, 40), t = below(seed, 15), qq = 1 + below(seed, 200);
    uint64_t w = 1 + below(seed, 30);

    snprintf(pol, sizeof pol, "a;q=%llu;w=%llu", (unsigned long long)qq,
             (unsigned long long)w);
    snprintf(rl, sizeof rl, "a;r=%llu;t=%llu, b;r=%llu;t=%llu",
             (unsigned long long)r, (unsigned long long)t,
             (unsigned long long)below(seed, 80), (unsigned long long)below(seed, 30));
    return feed(now, DRAFT(below(seed, 2) ? pol : NULL, rl), (uint32_t)below(seed, 5));
}

Test(quota, the_bound_holds_with_the_effective_rate)
{
    static struct grants g;
    uint64_t total = 0;

    for (uint64_t run = 0; run < RUNS; run++) {
        uint64_t seed = 0xabc000 + run;
        struct tbucket b;

        quota_init(&q, 20 + (double)below(&seed, 100), 0.5, 1 + (uint32_t)below(&seed, 30));
        g.n = 0;
        g.integral = 0;
        g.resets = 0;
        g.t = NOW0;
        tbucket_init(&b, q.rate, q.burst, NOW0);
        for (int s = 0; s < STEPS && g.n < MAX_GRANTS; s++) {
            uint64_t now = g.t + below(&seed, 700 * MS);

            integrate(&g, now);
            quota_bucket_sync(&q, &b, now);
            if (below(&seed, 3) == 0) {
                struct quota_result res = random_response(&seed, now);

                quota_bucket_sync(&q, &b, now);
                if (res.top_up) {
                    tbucket_top_up(&b, now);
                    g.resets++;   /* counted as a reset's */
                }
            }
            while (g.n < MAX_GRANTS && tbucket_take(&b, now)) {
                g.at_int[g.n] = g.integral;
                g.cap[g.n] = quota_capacity(&q, now);
                g.at_resets[g.n] = g.resets;
                g.n++;
            }
        }
        /* Capacity at the first, the rate integrated between, and one per
         * top-up after the first (quota.h). */
        for (size_t i = 0; i < g.n; i++)
            for (size_t j = i; j < g.n; j++) {
                double bound = g.cap[i] + g.at_int[j] - g.at_int[i] +
                               (double)(g.at_resets[j] - g.at_resets[i]);

                if ((double)(j - i + 1) > bound + 1e-6)
                    cr_assert_fail("run %llu: grants %zu..%zu: %zu > %.9f",
                                   (unsigned long long)run, i, j, j - i + 1, bound);
            }
        total += g.n;
    }
    cr_expect_gt(total, RUNS * 100, "real traffic");
}

/* A fleet's bucket keeps the newest numbers: a reset passed is news, as an
 * answer is. */
Test(quota, a_reset_passed_is_news)
{
    cr_expect_eq(quota_news_wall_ms(&q, NOW0), 0, "nothing advertised");
    feed(NOW0, DRAFT("a;q=20;w=2", "a;r=5;t=2, b;r=50;t=7"), 0);
    cr_expect_eq(quota_news_wall_ms(&q, NOW0 + SEC), WALL0, "the answer's time");
    cr_expect_eq(quota_news_wall_ms(&q, NOW0 + 3 * SEC), WALL0 + 2000, "a's reset");
    cr_expect_eq(quota_news_wall_ms(&q, NOW0 + 9 * SEC), WALL0 + 7000, "b's, the latest");
}
