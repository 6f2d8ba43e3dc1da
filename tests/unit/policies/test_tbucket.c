/* policies/tbucket.c: the token bucket whose rate and capacity change while
 * it runs, on a fake clock: a full start, pacing, rate changes settling what
 * accrued before them, capacity changes dropping tokens and never adding any,
 * 429s and pauses resuming empty, the predictions, and the bound
 *     permits taken in [a, b] <= capacity(a) + integral of the rate over [a, b]
 * checked by brute force over random schedules of rate and capacity changes
 * with a greedy taker (bounded iterations, seeded). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "policies/tbucket.h"

#define MS 1000000ull
#define SEC 1000000000ull
#define NOW0 (1000ull * SEC)

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

/* Takes every token there is at now; how many. */
static unsigned drain(struct tbucket *b, uint64_t now)
{
    unsigned n = 0;

    while (tbucket_take(b, now))
        n++;
    return n;
}

Test(tbucket, starts_full_then_paces_at_the_rate)
{
    struct tbucket b;
    uint64_t t = NOW0;

    tbucket_init(&b, 10, 5, t);
    cr_expect_eq(drain(&b, t), 5);
    cr_expect_eq(tbucket_next_ns(&b, t), 100 * MS);
    cr_expect_not(tbucket_take(&b, t + 100 * MS - 1));
    cr_expect(tbucket_take(&b, t + 100 * MS));
    /* An hour idle fills it to the capacity, never beyond. */
    cr_expect_eq(drain(&b, t + 3600 * SEC), 5);
    cr_expect_float_eq(tbucket_tokens(&b, t + 3600 * SEC + 250 * MS), 2.5, 1e-9);
}

Test(tbucket, zero_capacity_counts_as_one)
{
    struct tbucket b;

    tbucket_init(&b, 1, 0, NOW0);
    cr_expect_eq(drain(&b, NOW0), 1);
    cr_expect_eq(drain(&b, NOW0 + 10 * SEC), 1);
}

Test(tbucket, a_rate_change_keeps_what_accrued_before_it)
{
    struct tbucket b;
    uint64_t t = NOW0;

    tbucket_init(&b, 10, 100, t);
    drain(&b, t);
    /* 10/s for 0.5 s (5 tokens), then 100/s for 0.1 s (10 more). */
    tbucket_set_rate(&b, t + 500 * MS, 100);
    cr_expect_float_eq(tbucket_tokens(&b, t + 600 * MS), 15.0, 1e-9);
    /* And down again: 1/s for 2 s adds 2. */
    tbucket_set_rate(&b, t + 600 * MS, 1);
    cr_expect_eq(drain(&b, t + 2600 * MS), 17);
    cr_expect_eq(tbucket_next_ns(&b, t + 2600 * MS), SEC);
}

Test(tbucket, fractions_are_carried_across_settles)
{
    struct tbucket b;
    uint64_t t = NOW0, n = 0;

    /* 1/3 per second settled every 7 ms for 30 s: 10 tokens, not fewer for
     * the rounding of each settle. */
    tbucket_init(&b, 1.0 / 3, 1000, t);
    drain(&b, t);
    for (uint64_t dt = 7 * MS; dt <= 30 * SEC; dt += 7 * MS)
        n += tbucket_take(&b, t + dt);
    cr_expect_eq(n + drain(&b, t + 30 * SEC), 9, "9.99.. tokens in 29.995 s");
    cr_expect_eq(drain(&b, t + 30 * SEC + 15 * MS), 1);
}

Test(tbucket, a_lowered_capacity_drops_tokens_a_raised_one_adds_none)
{
    struct tbucket b;
    uint64_t t = NOW0;

    tbucket_init(&b, 10, 20, t);
    tbucket_set_capacity(&b, t, 3);
    cr_expect_float_eq(tbucket_tokens(&b, t), 3.0, 1e-12);
    tbucket_set_capacity(&b, t, 50);
    cr_expect_float_eq(tbucket_tokens(&b, t), 3.0, 1e-12, "raising adds nothing");
    /* Then it fills at the rate up to the new capacity. */
    cr_expect_float_eq(tbucket_tokens(&b, t + 2 * SEC), 23.0, 1e-9);
    cr_expect_eq(drain(&b, t + 60 * SEC), 50);
}

Test(tbucket, a_429_empties_it)
{
    struct tbucket b;

    tbucket_init(&b, 4, 10, NOW0);
    tbucket_empty(&b, NOW0);
    cr_expect_not(tbucket_take(&b, NOW0));
    cr_expect_eq(tbucket_next_ns(&b, NOW0), 250 * MS);
}

Test(tbucket, a_pause_accrues_nothing_and_resumes_empty)
{
    struct tbucket b;
    uint64_t t = NOW0;

    tbucket_init(&b, 10, 10, t);
    tbucket_pause_until(&b, t, t + 5 * SEC);
    cr_expect_not(tbucket_take(&b, t + 5 * SEC), "resumes empty, no burst");
    cr_expect_eq(tbucket_next_ns(&b, t), 5 * SEC + 100 * MS);
    cr_expect_eq(tbucket_next_ns(&b, t + 5 * SEC), 100 * MS);
    cr_expect(tbucket_take(&b, t + 5100 * MS));
    /* An earlier moment does not shorten a running pause; a later one
     * lengthens it. */
    tbucket_pause_until(&b, t + 6 * SEC, t + 20 * SEC);
    tbucket_pause_until(&b, t + 7 * SEC, t + 10 * SEC);
    cr_expect_eq(b.paused_until, t + 20 * SEC);
    cr_expect_float_eq(tbucket_tokens(&b, t + 20 * SEC), 0.0, 1e-12);
    cr_expect_float_eq(tbucket_tokens(&b, t + 21 * SEC), 10.0, 1e-9);
}

Test(tbucket, resume_ends_a_pause_now_still_empty)
{
    struct tbucket b;
    uint64_t t = NOW0;

    tbucket_init(&b, 10, 10, t);
    tbucket_pause_until(&b, t, t + 3600 * SEC);
    tbucket_resume(&b, t + SEC);
    cr_expect_not(tbucket_take(&b, t + SEC));
    cr_expect_eq(tbucket_next_ns(&b, t + SEC), 100 * MS);
}

Test(tbucket, a_clock_older_than_the_last_seen_changes_nothing)
{
    struct tbucket b;
    uint64_t t = NOW0;

    tbucket_init(&b, 10, 1, t);
    cr_expect(tbucket_take(&b, t + SEC));
    cr_expect_not(tbucket_take(&b, t + 900 * MS), "no token from the past");
    cr_expect_eq(tbucket_next_ns(&b, t + 900 * MS), 200 * MS);
    cr_expect(tbucket_take(&b, t + 1100 * MS));
}

static uint64_t says_pause_end(const void *arg, uint64_t from, bool pause_end,
                               uint64_t nano)
{
    (void)arg;
    (void)from;
    (void)nano;
    return pause_end ? 1 : 2;
}

static uint64_t double_rate(const void *arg, uint64_t from, bool pause_end,
                            uint64_t nano)
{
    (void)pause_end;
    /* 10/s until the moment in *arg, then 20/s. */
    uint64_t m = *(const uint64_t *)arg;
    uint64_t before = m > from ? (m - from) * 10 : 0;   /* nano-tokens */

    if (nano <= before)
        return (nano + 9) / 10;
    return (m > from ? m - from : 0) + (nano - before + 19) / 20;
}

Test(tbucket, wait_counts_held_tokens_pauses_and_the_outlook)
{
    struct tbucket b;
    uint64_t t = NOW0, m = NOW0 + SEC;

    tbucket_init(&b, 10, 4, t);
    cr_expect_eq(tbucket_wait_ns(&b, t, 4, NULL, NULL), 0);
    cr_expect_eq(tbucket_wait_ns(&b, t, 5, NULL, NULL), 100 * MS);
    /* The capacity does not bind a prediction: the tokens are taken as they
     * come. */
    cr_expect_eq(tbucket_wait_ns(&b, t, 24, NULL, NULL), 2 * SEC);
    /* With a rise to 20/s in 1 s: 10 tokens in the first second, 10 more in
     * the next half. */
    cr_expect_eq(tbucket_wait_ns(&b, t, 24, double_rate, &m), 1500 * MS);
    tbucket_pause_until(&b, t, t + 3 * SEC);
    cr_expect_eq(tbucket_wait_ns(&b, t, 2, NULL, NULL), 3200 * MS);
    cr_expect_eq(tbucket_accrue_at(10, 3 * TB_ONE), 300 * MS);
    cr_expect_eq(tbucket_accrue_at(0, TB_ONE), UINT64_MAX);
    cr_expect_eq(tbucket_wait_ns(&b, t, UINT64_MAX / 2, NULL, NULL), UINT64_MAX);
    /* The fn is told when accrual starts at a pause's end still to come (a
     * reset's top-up there has not happened). */
    cr_expect_eq(tbucket_wait_ns(&b, t, 1, says_pause_end, NULL), 3 * SEC + 1);
    cr_expect_eq(tbucket_wait_ns(&b, t + 3 * SEC, 1, says_pause_end, NULL), 2);
}

Test(tbucket, absurd_rates_are_clamped_not_undefined)
{
    struct tbucket b;

    tbucket_init(&b, 1e300, 1, NOW0);
    drain(&b, NOW0);
    cr_expect_eq(tbucket_next_ns(&b, NOW0), 1, "at most 1e9/s: 1 ns a token");
    tbucket_set_rate(&b, NOW0, NAN);
    cr_expect_eq(drain(&b, NOW0 + 1000 * SEC), 0, "NaN: as slow as can be");
    tbucket_set_rate(&b, NOW0 + 1000 * SEC, -5);
    cr_expect_eq(drain(&b, NOW0 + 2000 * SEC), 0);
}

/* ---- the bound, by brute force ---------------------------------------------- */

#define RUNS 40
#define STEPS 400
#define MAX_GRANTS 4000

/* One run's schedule as the test sees it: the rate in force from each
 * change, the grants with the integral of the rate up to each, and the
 * capacity in force at each grant. */
struct run {
    uint64_t grant_t[MAX_GRANTS];
    double grant_int[MAX_GRANTS];   /* integral of the rate from the start */
    double grant_cap[MAX_GRANTS];   /* capacity at the grant's moment */
    size_t n;
    double integral, rate;
    uint64_t t;
};

static void advance(struct run *r, uint64_t to)
{
    r->integral += r->rate * (double)(to - r->t) / 1e9;
    r->t = to;
}

static void step(struct tbucket *b, struct run *r, uint64_t *seed,
                 uint32_t *cap)
{
    uint64_t kind = below(seed, 10);

    advance(r, r->t + below(seed, 300 * MS));
    if (kind == 0) {
        r->rate = 0.05 + (double)below(seed, 200000) / 100.0;
        tbucket_set_rate(b, r->t, r->rate);
    } else if (kind == 1) {
        *cap = 1 + (uint32_t)below(seed, 40);
        tbucket_set_capacity(b, r->t, *cap);
    } else if (kind == 2) {
        tbucket_empty(b, r->t);
    } else if (kind == 3 && below(seed, 4) == 0) {
        tbucket_pause_until(b, r->t, r->t + below(seed, 2 * SEC));
    }
    /* The greedy taker: every token there is, now. */
    while (r->n < MAX_GRANTS && tbucket_take(b, r->t)) {
        r->grant_t[r->n] = r->t;
        r->grant_int[r->n] = r->integral;
        r->grant_cap[r->n] = *cap;
        r->n++;
    }
}

/* Every window that starts at one grant and ends at a later one: the grants
 * in it against capacity(a) + integral(a..b). Windows starting elsewhere are
 * dominated: moving a to the next grant drops no grant and shrinks the
 * integral, and the capacity bound holds for the capacity at that grant. */
static void check_windows(const struct run *r, uint64_t seed)
{
    for (size_t i = 0; i < r->n; i++) {
        for (size_t j = i; j < r->n; j++) {
            double allowed = r->grant_cap[i] + (r->grant_int[j] - r->grant_int[i]);
            double got = (double)(j - i + 1);

            if (got > allowed + 1e-6)
                cr_assert_fail("seed %llu: %zu..%zu: %.0f permits, bound %.9f",
                         (unsigned long long)seed, i, j, got, allowed);
        }
    }
}

Test(tbucket, the_bound_holds_over_random_rate_and_capacity_changes)
{
    static struct run r;
    uint64_t total = 0;

    for (uint64_t run = 0; run < RUNS; run++) {
        uint64_t seed = 0x5eed0000 + run;
        uint32_t cap = 1 + (uint32_t)below(&seed, 20);
        struct tbucket b;

        r.n = 0;
        r.integral = 0;
        r.rate = 0.5 + (double)below(&seed, 5000) / 100.0;
        r.t = NOW0;
        tbucket_init(&b, r.rate, cap, r.t);
        for (int s = 0; s < STEPS && r.n < MAX_GRANTS; s++)
            step(&b, &r, &seed, &cap);
        check_windows(&r, 0x5eed0000 + run);
        total += r.n;
    }
    /* The check saw real traffic, not an idle bucket. */
    cr_expect_gt(total, RUNS * 100);
}

/* Exact, not just safe: a greedy taker at a fixed rate gets the capacity
 * plus every whole token the rate allows, no fewer. */
Test(tbucket, a_greedy_taker_gets_all_the_rate_allows)
{
    struct tbucket b;
    uint64_t n = 0, t;

    tbucket_init(&b, 7, 3, NOW0);
    for (t = NOW0; t <= NOW0 + 100 * SEC; t += 13 * MS)
        n += drain(&b, t);
    /* 3 + 7/s over the 99.996 s to the last step. */
    cr_expect_eq(n, 3 + (uint64_t)floor(7 * 99.996));
}
