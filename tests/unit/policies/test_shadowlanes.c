/* policies/shadowlanes.c: what a shadow policy's lanes would have done, on
 * a fake clock: a lane alone is a GCRA at the whole rate (its burst at
 * once, then one per interval), lanes that are all busy are served at their
 * shares, a lane's wait does not depend on another lane's backlog, a wait
 * beyond max_wait is a refusal that moves no clock, a pause delays every
 * lane to its end, and a lowered rate (a followed quota) lengthens waits. */
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#include "policies/shadowlanes.h"

#define MS 1000000ull
#define SEC 1000000000ull
#define NOW0 (1000ull * SEC)
#define T (100 * MS)       /* 10/s */

static struct shadow_lanes s;

static void make(const double *shares, size_t n)
{
    struct sc_lane cfg[8];

    memset(cfg, 0, sizeof cfg);
    for (size_t i = 0; i < n; i++)
        cfg[i].share = shares[i];
    cr_assert_eq(shadow_lanes_init(&s, cfg, n), 0);
}

static void teardown(void)
{
    shadow_lanes_free(&s);
}

TestSuite(shadowlanes, .fini = teardown);

Test(shadowlanes, no_lane_is_refused)
{
    cr_assert_eq(shadow_lanes_init(&s, NULL, 0), -EINVAL);
}

Test(shadowlanes, a_lane_alone_is_a_gcra_at_the_whole_rate)
{
    const double one[] = {100};
    uint64_t w;

    make(one, 1);
    /* burst 3: three at once, then one per interval */
    for (int i = 0; i < 3; i++)
        cr_assert_eq(shadow_lanes_reserve(&s, 0, NOW0, T, 2 * T, 10 * SEC, 0, &w), SL_GO);
    for (int i = 1; i <= 5; i++) {
        cr_assert_eq(shadow_lanes_reserve(&s, 0, NOW0, T, 2 * T, 10 * SEC, 0, &w), SL_WAIT);
        cr_assert_eq(w, (uint64_t)i * T, "request %d would wait %llu", i,
                     (unsigned long long)w);
    }
    /* one interval later the next waits one interval less than it would have */
    cr_assert_eq(shadow_lanes_reserve(&s, 0, NOW0 + T, T, 2 * T, 10 * SEC, 0, &w), SL_WAIT);
    cr_assert_eq(w, 5 * T);
}

Test(shadowlanes, a_wait_beyond_max_wait_is_refused_and_moves_no_clock)
{
    const double one[] = {100};
    uint64_t w;

    make(one, 1);
    for (int i = 0; i < 3; i++)
        shadow_lanes_reserve(&s, 0, NOW0, T, 0, 250 * MS, 0, &w);
    /* waits 0, T, 2T admitted; the fourth would wait 3T > 250 ms */
    cr_assert_eq(shadow_lanes_reserve(&s, 0, NOW0, T, 0, 250 * MS, 0, &w), SL_REFUSED);
    cr_assert_eq(w, 3 * T);
    cr_assert_eq(shadow_lanes_reserve(&s, 0, NOW0, T, 0, 250 * MS, 0, &w), SL_REFUSED);
    cr_assert_eq(w, 3 * T, "a refusal moved the clock: %llu", (unsigned long long)w);
}

/* 30 % / 70 %, both with a backlog: the 30 % lane's clock moves by T/0.3
 * per request, the 70 % lane's by T/0.7; over a second of backlog each is
 * served at its share of 10/s. */
Test(shadowlanes, busy_lanes_are_served_at_their_shares)
{
    const double two[] = {30, 70};
    uint64_t w;
    int i_in = 0, b_in = 0;

    make(two, 2);
    for (int k = 0; k < 100; k++) {
        if (shadow_lanes_reserve(&s, 0, NOW0, T, 0, 1 * SEC, 0, &w) != SL_REFUSED)
            i_in++;
        if (shadow_lanes_reserve(&s, 1, NOW0, T, 0, 1 * SEC, 0, &w) != SL_REFUSED)
            b_in++;
    }
    /* within a wait of 1 s: about 3 of the interactive lane, 7 of the batch */
    cr_assert(i_in >= 3 && i_in <= 5, "interactive admitted %d", i_in);
    cr_assert(b_in >= 7 && b_in <= 9, "batch admitted %d", b_in);
}

/* A batch backlog of 5 s: a request joining the idle interactive lane waits
 * about one of its own intervals, not the batch's 5 s. */
Test(shadowlanes, a_lane_waits_for_its_own_backlog_not_the_others)
{
    const double two[] = {30, 70};
    uint64_t w;

    make(two, 2);
    for (int k = 0; k < 50; k++)
        cr_assert_neq(shadow_lanes_reserve(&s, 1, NOW0, T, 0, 30 * SEC, 0, &w), SL_REFUSED);
    cr_assert_geq(w, 4 * SEC, "the batch lane's last would wait %llu",
                  (unsigned long long)w);
    cr_assert_eq(shadow_lanes_reserve(&s, 0, NOW0, T, 0, 2 * SEC, 0, &w), SL_GO);
    cr_assert_eq(shadow_lanes_reserve(&s, 0, NOW0, T, 0, 2 * SEC, 0, &w), SL_WAIT);
    cr_assert_leq(w, T * 100 / 30 + 1, "the second interactive would wait %llu",
                  (unsigned long long)w);
}

Test(shadowlanes, an_idle_lane_gains_no_credit)
{
    const double two[] = {50, 50};
    uint64_t w;

    make(two, 2);
    cr_assert_eq(shadow_lanes_reserve(&s, 0, NOW0, T, 0, SEC, 0, &w), SL_GO);
    /* long after, the lane starts from now, with no stored permits */
    cr_assert_eq(shadow_lanes_reserve(&s, 0, NOW0 + 10 * SEC, T, 0, SEC, 0, &w), SL_GO);
    cr_assert_eq(shadow_lanes_reserve(&s, 0, NOW0 + 10 * SEC, T, 0, SEC, 0, &w), SL_WAIT);
    cr_assert_eq(w, T, "alone, the lane has the whole rate: %llu", (unsigned long long)w);
}

Test(shadowlanes, a_pause_delays_every_lane_to_its_end)
{
    const double two[] = {50, 50};
    uint64_t w;

    make(two, 2);
    cr_assert_eq(shadow_lanes_reserve(&s, 1, NOW0, T, 0, SEC, NOW0 + 400 * MS, &w), SL_WAIT);
    cr_assert_eq(w, 400 * MS);
    cr_assert_eq(shadow_lanes_reserve(&s, 0, NOW0, T, 0, 300 * MS, NOW0 + 400 * MS, &w),
                 SL_REFUSED);
    cr_assert_eq(w, 400 * MS);
}

/* A followed quota: the same backlog at a tenth of the rate waits ten times
 * as long, and what fitted in max_wait no longer does. */
Test(shadowlanes, a_lowered_rate_lengthens_the_waits)
{
    const double one[] = {100};
    uint64_t w;

    make(one, 1);
    for (int k = 0; k < 5; k++)
        cr_assert_neq(shadow_lanes_reserve(&s, 0, NOW0, T, 0, SEC, 0, &w), SL_REFUSED);
    cr_assert_eq(w, 4 * T);
    cr_assert_eq(shadow_lanes_reserve(&s, 0, NOW0, 10 * T, 0, SEC, 0, &w), SL_WAIT);
    cr_assert_eq(w, 5 * T);
    cr_assert_eq(shadow_lanes_reserve(&s, 0, NOW0, 10 * T, 0, SEC, 0, &w), SL_REFUSED);
    cr_assert_eq(w, 15 * T);
}
