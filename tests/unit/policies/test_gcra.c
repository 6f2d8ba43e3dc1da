/* policies/gcra.c: the token bucket as GCRA (docs/contract.md §5) against a fake
 * clock: bursts, pacing in arrival order, max_wait, emptying and cooldowns,
 * the state of new partitions, the exactness bound checked by brute force,
 * and the CAS loop under several threads.
 *
 * The bound. With T = llround(1e9 / rate) ns and tau = (burst - 1) * T, a
 * reservation starts at s_j >= TAT_{j-1} - tau, and TAT_i >= s_i + T, TAT
 * growing by at least T per reservation. So any m starts within a window of
 * length d satisfy, exactly and in integers,
 *     (m - burst) * T <= d.
 * In terms of the configured rate, m <= burst + rate * d / 1e9 + eps with
 *     eps = d * max(0, T_exact - T) / (T * T_exact),  T_exact = 1e9 / rate,
 * i.e. nothing when T was rounded up and, as T >= T_exact - 0.5, at most
 * d * 0.5 / (T_exact * (T_exact - 0.5)) when it was rounded down. So the
 * effective rate exceeds the configured one by a factor of at most about
 * 0.5 / T: one extra start in about 10 years at 3/s, but one per second at
 * 99999/s (T = 10000 for 10000.1 ns) and 11 % at 3e8/s (T = 3 for 3.33 ns).
 * The brute-force check below uses that worst-case eps.
 *
 * A change of numbers (a reload) re-rates the TAT keeping the tokens,
 * clamped to the new burst and never raised, and hands the bucket over:
 * checked on cases, against gcra_available at random, by brute force across
 * the change (windows after it keep the new bound where max_wait is 0, as
 * at the send check; windows across it keep max(b, b') + max(r, r') t), and
 * with threads reserving while the hand-over runs. */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "policies/gcra.h"

#define SEC 1000000000ull
#define NOW0 (1000ull * SEC) /* a monotonic clock that started a while ago */

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

static uint64_t tat(struct gcra *g)
{
    return atomic_load(&g->tat);
}

/* A copy that can be probed without touching the original. */
static void gcra_copy(struct gcra *dst, struct gcra *src)
{
    dst->t_ns = src->t_ns;
    dst->tau_ns = src->tau_ns;
    dst->next = NULL;
    atomic_store(&dst->tat, atomic_load(&src->tat));
}

static uint64_t must_start(struct gcra *g, uint64_t now, uint64_t max_wait)
{
    uint64_t start = 0;

    cr_assert(gcra_reserve(g, now, max_wait, &start),
              "reservation at %llu (max_wait %llu) refused, next at %llu",
              (unsigned long long)now, (unsigned long long)max_wait,
              (unsigned long long)start);
    cr_assert_geq(start, now);
    cr_assert_leq(start - now, max_wait);
    return start;
}

/* A refusal: returns when a permit would be available, and checks that the
 * bucket did not change. */
static uint64_t must_refuse(struct gcra *g, uint64_t now, uint64_t max_wait)
{
    uint64_t before = tat(g), start = 0;

    cr_assert_not(gcra_reserve(g, now, max_wait, &start),
                  "reservation at %llu (max_wait %llu) granted at %llu",
                  (unsigned long long)now, (unsigned long long)max_wait,
                  (unsigned long long)start);
    cr_assert_eq(tat(g), before, "a refusal must change nothing");
    cr_assert_gt(start - now, max_wait);
    return start;
}

/* ---- set-up --------------------------------------------------------------- */

Test(gcra, init_sets_interval_and_tolerance)
{
    struct gcra g;

    gcra_init(&g, 10, 5);
    cr_expect_eq(g.t_ns, 100000000ull);
    cr_expect_eq(g.tau_ns, 400000000ull);
    cr_expect_eq(tat(&g), 0);
    gcra_init(&g, 0.5, 1);
    cr_expect_eq(g.t_ns, 2 * SEC);
    cr_expect_eq(g.tau_ns, 0);
    gcra_init(&g, 3, 2);                /* 333333333.3 rounds up: never faster */
    cr_expect_eq(g.t_ns, 333333334ull);
    cr_expect_eq(g.tau_ns, 333333334ull);
    gcra_init(&g, 7, 1);                /* 142857142.9 rounds up */
    cr_expect_eq(g.t_ns, 142857143ull);
    gcra_init(&g, 1.0 / 60, 1);         /* 1/m */
    cr_expect_eq(g.t_ns, 60 * SEC);
    gcra_init(&g, 1e9, 3);              /* the fastest rate: 1 ns */
    cr_expect_eq(g.t_ns, 1);
    cr_expect_eq(g.tau_ns, 2);
    gcra_init(&g, 5e9, 1);              /* beyond: never 0 */
    cr_expect_eq(g.t_ns, 1);
}

/* ---- bursts and pacing ---------------------------------------------------- */

Test(gcra, full_bucket_allows_burst_then_one_per_t)
{
    struct gcra g;
    const uint64_t T = 100000000ull;
    uint64_t k;

    gcra_init(&g, 10, 5);
    for (k = 0; k < 5; k++)
        cr_expect_eq(must_start(&g, NOW0, 0), NOW0, "start %llu of the burst",
                     (unsigned long long)k);
    cr_expect_eq(must_refuse(&g, NOW0, 0), NOW0 + T);
    cr_expect_eq(must_refuse(&g, NOW0 + T - 1, 0), NOW0 + T);
    /* From then on exactly one start per T, and never a second at once. */
    for (k = 1; k <= 50; k++) {
        uint64_t now = NOW0 + k * T;

        cr_assert_eq(must_start(&g, now, 0), now);
        cr_assert_eq(must_refuse(&g, now, 0), now + T);
        cr_assert_eq(must_refuse(&g, now + T / 2, 0), now + T);
    }
}

Test(gcra, burst_of_one_paces_from_the_first_request)
{
    struct gcra g;

    gcra_init(&g, 4, 1);
    cr_expect_eq(must_start(&g, NOW0, 0), NOW0);
    cr_expect_eq(must_refuse(&g, NOW0, 0), NOW0 + SEC / 4);
    cr_expect_eq(must_start(&g, NOW0 + SEC / 4, 0), NOW0 + SEC / 4);
}

Test(gcra, waiting_reservations_are_t_apart_in_arrival_order)
{
    struct gcra g;
    const uint64_t T = 100000000ull;
    uint64_t k, now = NOW0;

    gcra_init(&g, 10, 3);
    for (k = 0; k < 3; k++)
        cr_expect_eq(must_start(&g, NOW0, 0), NOW0);
    /* Arrivals a little apart, all well within one T of each other's
     * arrivals: each gets the next slot, in the order it arrived. */
    for (k = 1; k <= 20; k++) {
        now += 1000 * k;
        cr_assert_eq(must_start(&g, now, 10 * SEC), NOW0 + k * T,
                     "waiter %llu", (unsigned long long)k);
    }
    cr_expect_eq(tat(&g), NOW0 + 23 * T);
}

Test(gcra, beyond_max_wait_fails_changes_nothing_and_reports_when)
{
    struct gcra g;
    const uint64_t T = 100000000ull;

    gcra_init(&g, 10, 1);
    cr_expect_eq(must_start(&g, NOW0, 0), NOW0);
    cr_expect_eq(must_refuse(&g, NOW0, T - 1), NOW0 + T);
    cr_expect_eq(must_refuse(&g, NOW0, 0), NOW0 + T);
    /* max_wait is inclusive: exactly T of waiting is allowed. */
    cr_expect_eq(must_start(&g, NOW0, T), NOW0 + T);
    cr_expect_eq(must_refuse(&g, NOW0, T), NOW0 + 2 * T);
    cr_expect_eq(must_refuse(&g, NOW0 + T / 2, T), NOW0 + 2 * T);
    cr_expect_eq(must_start(&g, NOW0 + T, T), NOW0 + 2 * T);
    /* Many refusals in a row leave the queue exactly where it was. */
    for (int i = 0; i < 100; i++)
        cr_assert_eq(must_refuse(&g, NOW0 + T, T / 2), NOW0 + 3 * T);
    cr_expect_eq(must_start(&g, NOW0 + T, 5 * T), NOW0 + 3 * T);
}

Test(gcra, huge_gap_refills_to_burst_and_no_more)
{
    struct gcra g;
    const uint64_t T = 100000000ull, days = 3ull * 86400 * SEC;
    uint64_t next = 1, now;

    gcra_init(&g, 10, 4);
    for (int i = 0; i < 30; i++)
        must_start(&g, NOW0, 10 * SEC); /* the bucket owes 2.6 s */
    now = NOW0 + days;
    cr_expect_eq(gcra_available(&g, now, &next), 4);
    cr_expect_eq(next, 0);
    for (int i = 0; i < 4; i++)
        cr_expect_eq(must_start(&g, now, 0), now);
    cr_expect_eq(must_refuse(&g, now, 0), now + T);
    /* And again after an even larger jump (months). */
    now += 100 * days;
    cr_expect_eq(gcra_available(&g, now, NULL), 4);
    for (int i = 0; i < 4; i++)
        cr_expect_eq(must_start(&g, now, 0), now);
    cr_expect_eq(must_refuse(&g, now, 0), now + T);
}

/* ---- emptying, cooldowns, partitions --------------------------------------- */

Test(gcra, empty_makes_the_next_start_wait_t)
{
    struct gcra g;
    const uint64_t T = 100000000ull;

    gcra_init(&g, 10, 5);
    gcra_empty(&g, NOW0);
    cr_expect_eq(gcra_available(&g, NOW0, NULL), 0);
    cr_expect_eq(must_refuse(&g, NOW0, T - 1), NOW0 + T);
    cr_expect_eq(must_start(&g, NOW0, T), NOW0 + T);
    cr_expect_eq(must_start(&g, NOW0, 10 * T), NOW0 + 2 * T);
    /* Emptying a bucket already owing more moves nothing back. */
    gcra_empty(&g, NOW0);
    cr_expect_eq(must_start(&g, NOW0, 10 * T), NOW0 + 3 * T);
    /* Emptying later, on a bucket that refilled: the next start is now + T,
     * not a burst. */
    gcra_empty(&g, NOW0 + 60 * SEC);
    cr_expect_eq(must_refuse(&g, NOW0 + 60 * SEC, 0), NOW0 + 60 * SEC + T);
    cr_expect_eq(must_start(&g, NOW0 + 60 * SEC + T, 0), NOW0 + 60 * SEC + T);
    cr_expect_eq(must_refuse(&g, NOW0 + 60 * SEC + T, 0), NOW0 + 60 * SEC + 2 * T);
}

Test(gcra, pause_until_resumes_empty_never_with_a_burst)
{
    struct gcra g;
    const uint64_t T = 100000000ull, u = NOW0 + 5 * SEC;

    gcra_init(&g, 10, 5);
    gcra_pause_until(&g, u);
    cr_expect_eq(must_refuse(&g, NOW0, SEC), u);
    cr_expect_eq(must_start(&g, NOW0, 10 * SEC), u);
    cr_expect_eq(must_start(&g, NOW0 + SEC, 10 * SEC), u + T);
    cr_expect_eq(must_start(&g, NOW0 + 2 * SEC, 10 * SEC), u + 2 * T);

    /* Arriving exactly at `until`: one start then, the next one T later. */
    gcra_init(&g, 10, 5);
    gcra_pause_until(&g, u);
    cr_expect_eq(must_start(&g, u, 0), u);
    cr_expect_eq(must_refuse(&g, u, 0), u + T);
    cr_expect_eq(must_start(&g, u + T, 0), u + T);
    cr_expect_eq(must_refuse(&g, u + T, 0), u + 2 * T);
}

Test(gcra, pause_until_never_moves_tat_backward)
{
    struct gcra g;
    const uint64_t T = 100000000ull;
    uint64_t before;

    gcra_init(&g, 10, 5);
    gcra_pause_until(&g, NOW0 + 10 * SEC);
    before = tat(&g);
    gcra_pause_until(&g, NOW0 + 5 * SEC);
    cr_expect_eq(tat(&g), before);
    gcra_pause_until(&g, 0);
    cr_expect_eq(tat(&g), before);
    cr_expect_eq(must_start(&g, NOW0, 20 * SEC), NOW0 + 10 * SEC);

    /* Reservations already queued past `until` keep their places. */
    gcra_init(&g, 10, 1);
    for (int i = 0; i < 30; i++)
        must_start(&g, NOW0, 10 * SEC);
    before = tat(&g);
    gcra_pause_until(&g, NOW0 + SEC);
    cr_expect_eq(tat(&g), before);
    cr_expect_eq(must_start(&g, NOW0, 10 * SEC), NOW0 + 30 * T);
    /* A later pause does move it forward. */
    gcra_pause_until(&g, NOW0 + 8 * SEC);
    cr_expect_eq(must_start(&g, NOW0, 10 * SEC), NOW0 + 8 * SEC);
}

Test(gcra, set_empty_puts_a_new_partition_state)
{
    struct gcra g;
    const uint64_t T = 250000000ull;
    uint64_t next = 0;

    gcra_init(&g, 4, 10);
    gcra_set_empty(&g, NOW0);
    cr_expect_eq(gcra_available(&g, NOW0, &next), 0);
    cr_expect_eq(next, T);
    cr_expect_eq(must_refuse(&g, NOW0, 0), NOW0 + T);
    cr_expect_eq(must_start(&g, NOW0 + T, 0), NOW0 + T);
    cr_expect_eq(must_refuse(&g, NOW0 + T, 0), NOW0 + 2 * T);
    /* It puts the state whatever was there: a recycled bucket owing a
     * minute starts as a new one. */
    for (int i = 0; i < 240; i++)
        must_start(&g, NOW0 + T, 100 * SEC);
    gcra_set_empty(&g, NOW0 + 2 * SEC);
    cr_expect_eq(must_refuse(&g, NOW0 + 2 * SEC, 0), NOW0 + 2 * SEC + T);
    cr_expect_eq(must_start(&g, NOW0 + 2 * SEC, T), NOW0 + 2 * SEC + T);
    /* An empty bucket refills at rate, to burst. */
    cr_expect_eq(gcra_available(&g, NOW0 + 2 * SEC + 2 * T - 1, NULL), 0);
    cr_expect_eq(gcra_available(&g, NOW0 + 2 * SEC + 2 * T, NULL), 1);
    cr_expect_eq(gcra_available(&g, NOW0 + 2 * SEC + 3 * T, NULL), 2);
    cr_expect_eq(gcra_available(&g, NOW0 + 3 * SEC, NULL), 3);
    cr_expect_eq(gcra_available(&g, NOW0 + 60 * SEC, NULL), 10);
}

/* ---- available ------------------------------------------------------------ */

Test(gcra, available_counts_tokens_and_next_time)
{
    struct gcra g;
    const uint64_t T = 100000000ull;
    uint64_t next = 12345;

    gcra_init(&g, 10, 4);
    cr_expect_eq(gcra_available(&g, NOW0, &next), 4);
    cr_expect_eq(next, 0);
    must_start(&g, NOW0, 0);
    cr_expect_eq(gcra_available(&g, NOW0, &next), 3);
    must_start(&g, NOW0, 0);
    must_start(&g, NOW0, 0);
    cr_expect_eq(gcra_available(&g, NOW0, &next), 1);
    must_start(&g, NOW0, 0);
    cr_expect_eq(gcra_available(&g, NOW0, &next), 0);
    cr_expect_eq(next, T);
    cr_expect_eq(gcra_available(&g, NOW0 + T / 2, &next), 0);
    cr_expect_eq(next, T / 2);
    cr_expect_eq(gcra_available(&g, NOW0 + T - 1, &next), 0);
    cr_expect_eq(next, 1);
    next = 12345;
    cr_expect_eq(gcra_available(&g, NOW0 + T, &next), 1);
    cr_expect_eq(next, 0);
    cr_expect_eq(gcra_available(&g, NOW0 + 2 * T + T / 2, NULL), 2); /* floored */
    cr_expect_eq(gcra_available(&g, NOW0 + 4 * T - 1, NULL), 3);
    cr_expect_eq(gcra_available(&g, NOW0 + 4 * T, NULL), 4);
    cr_expect_eq(gcra_available(&g, NOW0 + 400 * T, NULL), 4);
    /* Waiters queued into the future: 0 and the time to their end. */
    for (int i = 0; i < 4; i++)
        must_start(&g, NOW0 + 4 * T, 0);
    must_start(&g, NOW0 + 4 * T, 10 * T);
    must_start(&g, NOW0 + 4 * T, 10 * T);
    cr_expect_eq(gcra_available(&g, NOW0 + 4 * T, &next), 0);
    cr_expect_eq(next, 3 * T);
    /* Reading it changes nothing. */
    cr_expect_eq(must_refuse(&g, NOW0 + 4 * T, 3 * T - 1), NOW0 + 7 * T);
}

/* gcra_available(now) is exactly how many max_wait=0 reservations would
 * succeed at now, and next_ns is when the first refusal would be served. */
Test(gcra, available_agrees_with_reserve)
{
    static const struct { double rate; uint32_t burst; } cfg[] = {
        {10, 1}, {10, 7}, {3, 5}, {0.5, 3}, {1000, 100},
    };
    uint64_t seed = 42;

    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        struct gcra g, probe;
        uint64_t now = NOW0, T;

        gcra_init(&g, cfg[c].rate, cfg[c].burst);
        T = g.t_ns;
        for (int i = 0; i < 400; i++) {
            uint64_t next, start, n = 0;
            uint32_t avail;

            now += below(&seed, 2 * T);
            if (below(&seed, 2))
                gcra_reserve(&g, now, below(&seed, 3 * T), &start);
            avail = gcra_available(&g, now, &next);
            gcra_copy(&probe, &g);
            while (gcra_reserve(&probe, now, 0, &start))
                n++;
            cr_assert_eq(avail, n, "config %zu step %d: available %u, reservable %llu",
                         c, i, avail, (unsigned long long)n);
            cr_assert_leq(avail, cfg[c].burst);
            if (avail == 0)
                cr_assert_eq(now + next, start, "next_ns must be when a permit is");
            else
                cr_assert_eq(next, 0);
        }
    }
}

/* ---- exactness by brute force --------------------------------------------- */

struct arrival_stats {
    size_t ok, refused, delayed, tight;
};

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Every window [s_i, s_j] of the sorted starts holds j - i + 1 starts. */
static void check_windows(const uint64_t *s, size_t n, double rate,
                          uint32_t burst, uint64_t T)
{
    /* The rate bound's slack comes from rounding T to the nearest ns, so it
     * is computed from that (T >= T_exact - 0.5), not from the bucket's T. */
    double t_exact = 1e9 / rate;
    double slack_per_ns = t_exact > 0.5 ? 0.5 / (t_exact * (t_exact - 0.5)) : 0;

    for (size_t i = 0; i < n; i++)
        for (size_t j = i; j < n; j++) {
            uint64_t count = j - i + 1, d = s[j] - s[i];
            double bound = burst + rate * (double)d / 1e9 +
                           (double)d * slack_per_ns + 1e-6;

            if (count > burst)
                cr_assert_leq((count - burst) * T, d,
                              "rate %g burst %u: %llu starts within %llu ns",
                              rate, burst, (unsigned long long)count,
                              (unsigned long long)d);
            cr_assert_leq((double)count, bound,
                          "rate %g burst %u: %llu starts within %llu ns > %.9f",
                          rate, burst, (unsigned long long)count,
                          (unsigned long long)d, bound);
        }
}

/* Drives `n` random arrivals through one bucket. With `disorder`, clock
 * readings may run up to 3 T backward (threads reading the clock before
 * winning the CAS in another order): the bound must hold all the same. */
static void drive(double rate, uint32_t burst, uint64_t seed, size_t n,
                  bool disorder, struct arrival_stats *st)
{
    struct gcra g, before;
    uint64_t *starts = calloc(n, sizeof *starts), T, clock = NOW0, last = 0;
    size_t m = 0;

    cr_assert_not_null(starts);
    memset(st, 0, sizeof *st);
    gcra_init(&g, rate, burst);
    T = g.t_ns;
    for (size_t k = 0; k < n; k++) {
        uint64_t r = below(&seed, 100), now, max_wait, start = 0;
        bool ok;

        /* Busy phases arrive about 8 times faster than T, which drains the
         * bucket and builds a queue; idle gaps (about one per burst + 10
         * arrivals) refill it partly or fully. */
        if (below(&seed, burst + 10) == 0)
            clock += below(&seed, 2 * T * burst + T);
        else if (r < 50)
            clock += below(&seed, T / 2 + 1);
        now = disorder ? clock - below(&seed, 3 * T) : clock;
        r = below(&seed, 100);
        max_wait = r < 25 ? 0 : r < 75 ? below(&seed, 4 * T) : below(&seed, 4 * T * burst);
        gcra_copy(&before, &g);
        ok = gcra_reserve(&g, now, max_wait, &start);
        cr_assert_geq(start, now);
        if (!ok) {
            cr_assert_gt(start - now, max_wait);
            cr_assert_eq(tat(&g), tat(&before), "a refusal changed the bucket");
            st->refused++;
            continue;
        }
        cr_assert_leq(start - now, max_wait);
        if (!disorder) {
            cr_assert_geq(start, last, "starts must follow arrival order");
            last = start;
            /* Work-conserving: a start that waits is as early as the bound
             * allows, i.e. some earlier start makes the window tight. */
            if (start > now) {
                bool tight = false;

                st->delayed++;
                for (size_t i = m; i-- > 0 && !tight;)
                    tight = (m - i + 1 >= burst) &&
                            (m - i + 1 - burst) * T == start - starts[i];
                cr_assert(tight, "rate %g burst %u: start %zu waits longer than needed",
                          rate, burst, m);
                st->tight++;
            }
        }
        starts[m++] = start;
    }
    st->ok = m;
    if (disorder)
        qsort(starts, m, sizeof *starts, cmp_u64);
    check_windows(starts, m, rate, burst, T);
    free(starts);
}

static const struct {
    double rate;
    uint32_t burst;
} exact_cfg[] = {
    {10, 1}, {10, 10}, {3, 4},       /* T rounded down */
    {7, 3},                          /* T rounded up */
    {0.5, 2}, {1000, 50}, {123456.7, 17}, {1e9, 5},
    {3e8, 3},                        /* T = 3 ns for 3.33 ns: eps matters */
};

Test(gcra, no_window_exceeds_burst_plus_rate_t)
{
    for (size_t c = 0; c < sizeof exact_cfg / sizeof exact_cfg[0]; c++) {
        struct arrival_stats st;

        drive(exact_cfg[c].rate, exact_cfg[c].burst, 1000 + c, 5000, false, &st);
        /* The sequence must exercise all three paths. */
        cr_expect_gt(st.refused, 100, "config %zu: %zu refusals", c, st.refused);
        cr_expect_gt(st.ok, 1000, "config %zu: %zu starts", c, st.ok);
        cr_expect_gt(st.delayed, 100, "config %zu: %zu delayed", c, st.delayed);
    }
}

Test(gcra, bound_holds_with_clock_readings_out_of_order)
{
    for (size_t c = 0; c < sizeof exact_cfg / sizeof exact_cfg[0]; c++) {
        struct arrival_stats st;

        drive(exact_cfg[c].rate, exact_cfg[c].burst, 2000 + c, 5000, true, &st);
        cr_expect_gt(st.ok, 1000, "config %zu: %zu starts", c, st.ok);
    }
}

Test(gcra, fractional_rates)
{
    struct gcra g;

    gcra_init(&g, 0.5, 1);
    cr_expect_eq(must_start(&g, NOW0, 0), NOW0);
    cr_expect_eq(must_refuse(&g, NOW0 + 2 * SEC - 1, 0), NOW0 + 2 * SEC);
    cr_expect_eq(must_start(&g, NOW0 + SEC, SEC), NOW0 + 2 * SEC);
    cr_expect_eq(must_start(&g, NOW0 + SEC, 3 * SEC), NOW0 + 4 * SEC);
    cr_expect_eq(gcra_available(&g, NOW0 + 100 * SEC, NULL), 1);

    gcra_init(&g, 0.5, 3);
    for (int i = 0; i < 3; i++)
        cr_expect_eq(must_start(&g, NOW0, 0), NOW0);
    cr_expect_eq(must_refuse(&g, NOW0, SEC), NOW0 + 2 * SEC);
    cr_expect_eq(gcra_available(&g, NOW0 + 3 * SEC, NULL), 1);
    cr_expect_eq(gcra_available(&g, NOW0 + 4 * SEC, NULL), 2);
    cr_expect_eq(gcra_available(&g, NOW0 + 6 * SEC, NULL), 3);

    gcra_init(&g, 0.1, 1);              /* 6/m */
    cr_expect_eq(must_start(&g, NOW0, 0), NOW0);
    cr_expect_eq(must_refuse(&g, NOW0, 9 * SEC), NOW0 + 10 * SEC);
}

/* ---- a change of numbers -------------------------------------------------- */

/* g's state carried into a bucket of `rate`, `burst` at now, as the reload
 * does (paused_until 0: none). */
static void rerated(struct gcra *to, struct gcra *g, double rate, uint32_t burst,
                    uint64_t now, uint64_t paused_until)
{
    gcra_init(to, rate, burst);
    atomic_store(&to->tat, gcra_rerate(tat(g), g, to, now, paused_until));
}

Test(gcra, rerate_keeps_tokens_clamped_never_raised)
{
    struct gcra g, h;
    uint64_t next;

    /* full: the new burst if smaller, the old one if larger (then it fills
     * at the new rate, one per T') */
    gcra_init(&g, 10, 10);
    rerated(&h, &g, 10, 3, NOW0, 0);
    cr_expect_eq(gcra_available(&h, NOW0, NULL), 3);
    gcra_init(&g, 10, 3);
    rerated(&h, &g, 20, 10, NOW0, 0);
    cr_expect_eq(gcra_available(&h, NOW0, NULL), 3, "a reload granted a burst");
    cr_expect_eq(gcra_available(&h, NOW0 + 50000000ull, NULL), 4);
    cr_expect_eq(gcra_available(&h, NOW0 + 60 * SEC, NULL), 10);
    /* partly used: 3 of 5 left at 10/s; at 20/s still 3; burst 2: 2 */
    gcra_init(&g, 10, 5);
    for (int i = 0; i < 2; i++)
        must_start(&g, NOW0, 0);
    rerated(&h, &g, 20, 5, NOW0, 0);
    cr_expect_eq(gcra_available(&h, NOW0, NULL), 3);
    rerated(&h, &g, 10, 2, NOW0, 0);
    cr_expect_eq(gcra_available(&h, NOW0, NULL), 2);
    /* the numbers: 5/s burst 10 spent, a 429 (empty), 4/s: nothing
     * now, the next start one T' = 250 ms later */
    gcra_init(&g, 5, 10);
    for (int i = 0; i < 10; i++)
        must_start(&g, NOW0, 0);
    gcra_empty(&g, NOW0);
    rerated(&h, &g, 4, 10, NOW0, 0);
    cr_expect_eq(gcra_available(&h, NOW0, &next), 0);
    cr_expect_eq(next, 250000000ull);
    cr_expect_eq(must_refuse(&h, NOW0 + 10, 0), NOW0 + 250000000ull);
    /* the same numbers: the same state */
    rerated(&h, &g, 5, 10, NOW0, 0);
    cr_expect_eq(tat(&h), tat(&g));
}

/* Starts reserved beyond the bucket (requests waiting for their permit)
 * keep their count: the next one comes after them, at the new spacing. */
Test(gcra, rerate_keeps_reservations_ahead)
{
    struct gcra g, h;

    gcra_init(&g, 10, 2);
    must_start(&g, NOW0, 0);
    must_start(&g, NOW0, 0);
    for (int i = 1; i <= 4; i++)
        cr_assert_eq(must_start(&g, NOW0, SEC), NOW0 + (uint64_t)i * 100000000ull);
    /* 6 starts used of a burst of 2: -4 tokens, the next free start when 5
     * have come back, 5 T = 500 ms. At 1/s burst 2: 5 s. */
    cr_expect_eq(must_refuse(&g, NOW0, 0), NOW0 + 500000000ull);
    rerated(&h, &g, 1, 2, NOW0, 0);
    cr_expect_eq(must_refuse(&h, NOW0, 0), NOW0 + 5 * SEC);
    /* At 100/s that would be 50 ms, before the reserved ones (the last at
     * 400 ms) have started: the next is a T' after that one. */
    rerated(&h, &g, 100, 2, NOW0, 0);
    cr_expect_eq(must_refuse(&h, NOW0, 0), NOW0 + 410000000ull);
}

/* A running pause keeps its end whatever the rate, the bucket resumes
 * empty then (one start), and starts reserved after it keep their count. */
Test(gcra, rerate_keeps_a_pause_to_its_end)
{
    const uint64_t until = NOW0 + 10 * SEC;
    struct gcra g, h;

    gcra_init(&g, 10, 5);
    gcra_empty(&g, NOW0);
    gcra_pause_until(&g, until);
    rerated(&h, &g, 1, 3, NOW0, until);
    cr_expect_eq(must_refuse(&h, NOW0 + SEC, 0), until);
    cr_expect_eq(gcra_available(&h, until, NULL), 1);
    rerated(&h, &g, 1000, 50, NOW0, until);
    cr_expect_eq(must_refuse(&h, NOW0 + SEC, 0), until, "a faster rate shortened the pause");
    cr_expect_eq(gcra_available(&h, until, NULL), 1);
    /* two reserved after the pause: at 1/s, the next after them */
    must_start(&g, NOW0, 20 * SEC);
    must_start(&g, NOW0, 20 * SEC);
    rerated(&h, &g, 1, 3, NOW0, until);
    cr_expect_eq(must_refuse(&h, NOW0, 0), until + 2 * SEC);
    /* a pause over is no pause */
    rerated(&h, &g, 1, 3, until + 60 * SEC, until);
    cr_expect_eq(gcra_available(&h, until + 60 * SEC, NULL), 3);
}

/* At random: the tokens after a change are never more than before nor
 * more than the new burst, and never fewer than both allow by more than
 * the rounding of one token. */
Test(gcra, rerate_never_raises_tokens_at_random)
{
    static const double rates[] = {0.5, 3, 7, 10, 1000, 123456.7};
    uint64_t seed = 7;

    for (int i = 0; i < 5000; i++) {
        struct gcra g, h;
        double r = rates[below(&seed, 6)], r2 = rates[below(&seed, 6)];
        uint32_t b = 1 + (uint32_t)below(&seed, 20), b2 = 1 + (uint32_t)below(&seed, 20);
        uint64_t now = NOW0, start, before, after, want;

        gcra_init(&g, r, b);
        for (uint64_t n = below(&seed, 3 * b); n > 0; n--) {
            now += below(&seed, g.t_ns);
            gcra_reserve(&g, now, below(&seed, 2 * b * g.t_ns), &start);
        }
        rerated(&h, &g, r2, b2, now, 0);
        before = gcra_available(&g, now, NULL);
        after = gcra_available(&h, now, NULL);
        want = before < b2 ? before : b2;
        cr_assert_leq(after, want, "%g/%u -> %g/%u: %llu tokens became %llu", r, b, r2,
                      b2, (unsigned long long)before, (unsigned long long)after);
        cr_assert_geq(after + 1, want, "%g/%u -> %g/%u: %llu tokens became %llu", r, b,
                      r2, b2, (unsigned long long)before, (unsigned long long)after);
    }
}

Test(gcra, rerate_saturates_below_moved)
{
    struct gcra g, h;

    gcra_init(&g, 1e9, 1);
    atomic_store(&g.tat, NOW0 + 3600 * SEC);
    rerated(&h, &g, 1e-6, 1, NOW0, 0);
    cr_expect_eq(tat(&h), GCRA_MOVED - 1);
}

/* After the hand-over every call on the old bucket is the new one's. */
Test(gcra, hand_over_forwards_every_call)
{
    struct gcra g, h, h2;
    uint64_t next;

    gcra_init(&g, 10, 3);
    must_start(&g, NOW0, 0);
    gcra_init(&h, 4, 3);
    gcra_hand_over(&g, &h, NOW0, NULL);
    cr_expect_eq(tat(&g), GCRA_MOVED);
    cr_expect_eq(gcra_available(&g, NOW0, NULL), 2, "read through the old bucket");
    must_start(&g, NOW0, 0);
    must_start(&g, NOW0, 0);
    cr_expect_eq(gcra_available(&h, NOW0, &next), 0, "reserved on the new one");
    cr_expect_eq(next, 250000000ull, "in its numbers");
    gcra_empty(&g, NOW0 + SEC);
    cr_expect_eq(tat(&h), NOW0 + SEC + h.t_ns + h.tau_ns);
    gcra_pause_until(&g, NOW0 + 5 * SEC);
    cr_expect_eq(tat(&h), NOW0 + 5 * SEC + h.tau_ns);
    gcra_resume(&g, NOW0 + 2 * SEC);
    cr_expect_eq(tat(&h), NOW0 + 2 * SEC + h.tau_ns);
    /* a chain: handed over again, the first still reaches the last */
    gcra_init(&h2, 1, 1);
    gcra_hand_over(&h, &h2, NOW0 + 2 * SEC, NULL);
    cr_expect_eq(must_start(&g, NOW0 + 2 * SEC, 10 * SEC), NOW0 + 2 * SEC);
    cr_expect_eq(must_refuse(&g, NOW0 + 2 * SEC, 0), NOW0 + 3 * SEC);
    cr_expect_eq(tat(&h2), NOW0 + 3 * SEC);
}

/* The pause is read when the hand-over lands: one kept elsewhere (the
 * bucket's cooldown) keeps its end. */
Test(gcra, hand_over_reads_the_pause)
{
    _Atomic uint64_t until = NOW0 + 10 * SEC;
    struct gcra g, h;

    gcra_init(&g, 10, 5);
    gcra_pause_until(&g, NOW0 + 10 * SEC);
    gcra_init(&h, 1000, 5);
    gcra_hand_over(&g, &h, NOW0, &until);
    cr_expect_eq(must_refuse(&g, NOW0, 0), NOW0 + 10 * SEC);
}

/* Random arrivals on one bucket, its numbers changed midway: windows after
 * the change keep its bound when every reservation is at now (max_wait 0,
 * as the send check reserves); every window keeps max(b, b') + max(r, r') t
 * whatever the max_wait (the old reservations count and keep their times). */
static void drive_across(double r1, uint32_t b1, double r2, uint32_t b2,
                         uint64_t seed, bool waits)
{
    enum { N = 3000 };
    static uint64_t s[N];
    struct gcra g, h;
    uint64_t clock = NOW0, change = 0;
    size_t m = 0, first_after = 0;
    double rmax = r1 > r2 ? r1 : r2, bmax = b1 > b2 ? b1 : b2;

    gcra_init(&g, r1, b1);
    gcra_init(&h, r2, b2);
    for (size_t k = 0; k < N; k++) {
        uint64_t T = k < N / 2 ? g.t_ns : h.t_ns, start;
        uint64_t max_wait = waits ? below(&seed, 4 * T * (b1 + b2)) : 0;

        if (k == N / 2) {
            change = clock;
            gcra_hand_over(&g, &h, clock, NULL);
            first_after = m;
        }
        clock += below(&seed, 12) == 0 ? below(&seed, 3 * T * bmax) : below(&seed, T / 3 + 1);
        if (gcra_reserve(&g, clock, max_wait, &start))
            s[m++] = start;
    }
    qsort(s, m, sizeof *s, cmp_u64);
    for (size_t i = 0; i < m; i++)
        for (size_t j = i; j < m && j < i + 300; j++) {
            double d = (double)(s[j] - s[i]) / 1e9, count = (double)(j - i + 1);

            cr_assert_leq(count, bmax + rmax * d * (1 + 1e-6) + 1e-6,
                          "%g/%u -> %g/%u: %.0f starts in %.9f s", r1, b1, r2, b2, count, d);
            if (!waits && i >= first_after && s[i] >= change)
                cr_assert_leq(count, b2 + r2 * d * (1 + 1e-6) + 1e-6,
                              "after %g/%u -> %g/%u: %.0f starts in %.9f s", r1, b1, r2,
                              b2, count, d);
        }
    cr_expect_gt(m, 500);
}

Test(gcra, bound_holds_across_a_change_of_numbers)
{
    static const struct { double r1; uint32_t b1; double r2; uint32_t b2; } c[] = {
        {5, 10, 4, 10}, {10, 1, 1, 1}, {1, 1, 10, 1}, {10, 3, 10, 20}, {10, 20, 10, 3},
        {1000, 50, 7, 3}, {7, 3, 1000, 50},
    };

    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        drive_across(c[i].r1, c[i].b1, c[i].r2, c[i].b2, 300 + i, false);
        drive_across(c[i].r1, c[i].b1, c[i].r2, c[i].b2, 400 + i, true);
    }
}

/* ---- threads -------------------------------------------------------------- */

#define N_THREADS 8
#define PER_THREAD 3000

struct racer {
    struct gcra *g;
    pthread_barrier_t *go;
    uint64_t now, seed;
    bool bounded;                 /* random max_wait instead of unbounded */
    uint64_t starts[PER_THREAD];
    size_t n;
};

static void *race(void *arg)
{
    struct racer *r = arg;

    pthread_barrier_wait(r->go);
    for (size_t i = 0; i < PER_THREAD; i++) {
        uint64_t start, max_wait = UINT64_MAX;

        if (r->bounded)
            max_wait = below(&r->seed, 2 * (uint64_t)N_THREADS * PER_THREAD * r->g->t_ns);
        if (gcra_reserve(r->g, r->now, max_wait, &start))
            r->starts[r->n++] = start;
    }
    return NULL;
}

/* All threads reserve at one shared `now`: the starts must be exactly
 * burst at now, then now + T, now + 2T, ... with no gap and no duplicate,
 * whether or not some reservations are refused along the way. */
static void race_on_one_bucket(bool bounded)
{
    static struct racer r[N_THREADS];
    pthread_t th[N_THREADS];
    pthread_barrier_t go;
    struct gcra g;
    const uint32_t burst = 7;
    uint64_t *all, total = 0;

    gcra_init(&g, 1000, burst);
    pthread_barrier_init(&go, NULL, N_THREADS);
    for (int i = 0; i < N_THREADS; i++) {
        memset(&r[i], 0, sizeof r[i]);
        r[i].g = &g;
        r[i].go = &go;
        r[i].now = NOW0;
        r[i].seed = 77 + (uint64_t)i;
        r[i].bounded = bounded;
        cr_assert_eq(pthread_create(&th[i], NULL, race, &r[i]), 0);
    }
    for (int i = 0; i < N_THREADS; i++) {
        pthread_join(th[i], NULL);
        total += r[i].n;
    }
    pthread_barrier_destroy(&go);
    all = malloc(total * sizeof *all);
    cr_assert_not_null(all);
    total = 0;
    for (int i = 0; i < N_THREADS; i++) {
        /* each thread sees its own starts in increasing order */
        for (size_t k = 1; k < r[i].n; k++)
            cr_assert(r[i].starts[k] > r[i].starts[k - 1] || r[i].starts[k] == NOW0,
                      "thread %d: start %zu not after the previous one", i, k);
        memcpy(all + total, r[i].starts, r[i].n * sizeof *all);
        total += r[i].n;
    }
    if (bounded)
        cr_expect(total > 100 && total < (uint64_t)N_THREADS * PER_THREAD,
                  "bounded waits must both grant and refuse (%llu)",
                  (unsigned long long)total);
    else
        cr_assert_eq(total, (uint64_t)N_THREADS * PER_THREAD);
    qsort(all, total, sizeof *all, cmp_u64);
    for (uint64_t k = 0; k < total; k++) {
        uint64_t want = NOW0 + (k < burst ? 0 : (k - burst + 1) * g.t_ns);

        cr_assert_eq(all[k], want, "start %llu: %llu, want %llu",
                     (unsigned long long)k, (unsigned long long)all[k],
                     (unsigned long long)want);
    }
    cr_expect_eq(tat(&g), NOW0 + total * g.t_ns);
    free(all);
}

/* Races are caught by chance: several rounds make a lost or duplicated
 * update all but certain to show (about 10 ms a round). */
#define ROUNDS 20

Test(gcra_threads, cas_loop_neither_loses_nor_duplicates)
{
    for (int i = 0; i < ROUNDS; i++)
        race_on_one_bucket(false);
}

Test(gcra_threads, refusals_under_contention_leave_no_holes)
{
    for (int i = 0; i < ROUNDS; i++)
        race_on_one_bucket(true);
}

/* A hand-over to the same numbers while threads reserve: every start is
 * on one bucket or the other, and together they are the one sequence, no
 * start lost or given twice. */
struct mover {
    struct gcra *g, *to;
    pthread_barrier_t *go;
};

static void *move_midway(void *arg)
{
    struct mover *mv = arg;

    pthread_barrier_wait(mv->go);
    while (tat(mv->g) < NOW0 + (uint64_t)N_THREADS * PER_THREAD / 2 * mv->g->t_ns)
        ;
    gcra_hand_over(mv->g, mv->to, NOW0, NULL);
    return NULL;
}

Test(gcra_threads, hand_over_under_contention_loses_nothing)
{
    static struct racer r[N_THREADS];
    pthread_t th[N_THREADS + 1];
    pthread_barrier_t go;
    struct gcra g, to;
    struct mover mv = {&g, &to, &go};
    uint64_t *all, total = 0;

    for (int round = 0; round < ROUNDS; round++) {
        gcra_init(&g, 1000, 1);
        gcra_init(&to, 1000, 1);
        atomic_store(&g.tat, NOW0); /* so the mover can tell progress */
        pthread_barrier_init(&go, NULL, N_THREADS + 1);
        for (int i = 0; i < N_THREADS; i++) {
            memset(&r[i], 0, sizeof r[i]);
            r[i] = (struct racer){.g = &g, .go = &go, .now = NOW0};
            cr_assert_eq(pthread_create(&th[i], NULL, race, &r[i]), 0);
        }
        cr_assert_eq(pthread_create(&th[N_THREADS], NULL, move_midway, &mv), 0);
        total = 0;
        for (int i = 0; i <= N_THREADS; i++)
            pthread_join(th[i], NULL);
        pthread_barrier_destroy(&go);
        cr_assert_eq(tat(&g), GCRA_MOVED);
        all = malloc((size_t)N_THREADS * PER_THREAD * sizeof *all);
        cr_assert_not_null(all);
        for (int i = 0; i < N_THREADS; i++) {
            memcpy(all + total, r[i].starts, r[i].n * sizeof *all);
            total += r[i].n;
        }
        cr_assert_eq(total, (uint64_t)N_THREADS * PER_THREAD);
        qsort(all, total, sizeof *all, cmp_u64);
        for (uint64_t k = 0; k < total; k++)
            cr_assert_eq(all[k], NOW0 + k * g.t_ns, "round %d: start %llu", round,
                         (unsigned long long)k);
        cr_expect_eq(tat(&to), NOW0 + total * g.t_ns);
        free(all);
    }
}
