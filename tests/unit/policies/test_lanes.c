/* policies/lanes.c: the lane scheduler on a fake clock. Shares among lanes
 * with waiters (30/70 gives 3 and 7 of every 10 within one), work
 * conservation, starvation freedom (a 1 % lane is served), arrival order in
 * a lane, no credit while empty, removal of any waiter, the prediction of a
 * newcomer's permits checked against what the scheduler then does, the wait
 * and max_wait per lane, and a run on a token bucket that keeps its bound. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "policies/lanes.h"
#include "policies/tbucket.h"

#define MS 1000000ull
#define SEC 1000000000ull
#define NOW0 (1000ull * SEC)
#define POOL 4096

static struct lanes l;
static struct lane_waiter pool[POOL];
static size_t used;

static void make(const double *shares, size_t n)
{
    struct sc_lane cfg[16];

    memset(cfg, 0, sizeof cfg);
    for (size_t i = 0; i < n; i++) {
        cfg[i].share = shares[i];
        cfg[i].max_wait_ms = 1000 * (i + 1);
    }
    cr_assert_eq(lanes_init(&l, cfg, n), 0);
    used = 0;
}

static void teardown(void)
{
    lanes_free(&l);
}

TestSuite(lanes, .fini = teardown);

static struct lane_waiter *push(uint32_t lane)
{
    cr_assert_lt(used, POOL);
    lanes_push(&l, &pool[used], lane);
    return &pool[used++];
}

static void push_n(uint32_t lane, size_t n)
{
    while (n--)
        push(lane);
}

/* The lane of the next permit, -1 when nobody waits. */
static int pop_lane(void)
{
    struct lane_waiter *w = lanes_pop(&l);

    if (!w)
        return -1;
    cr_expect_not(w->queued);
    return (int)w->lane;
}

Test(lanes, shares_hold_in_every_ten_permits)
{
    static const double s[] = {30, 70};
    int window[10] = {0}, got[2] = {0};

    make(s, 2);
    push_n(0, 500);
    push_n(1, 1500);
    for (int i = 0; i < 1000; i++) {
        int lane = pop_lane();
        int in_window = 0;

        cr_assert_geq(lane, 0);
        got[lane]++;
        window[i % 10] = lane == 0;
        for (int k = 0; k < 10; k++)
            in_window += window[k];
        if (i >= 9)
            cr_assert(in_window >= 2 && in_window <= 4,
                      "permits %d..%d: %d of 10 to the 30 %% lane", i - 9, i,
                      in_window);
    }
    cr_expect(got[0] >= 299 && got[0] <= 301, "%d of 1000", got[0]);
    cr_expect_eq(l.v[0].granted, (uint64_t)got[0]);
    cr_expect_eq(lanes_waiting(&l, 0), 500 - (uint32_t)got[0]);
}

Test(lanes, shares_are_among_the_lanes_with_waiters)
{
    static const double s[] = {20, 30, 50};
    int got[3] = {0};

    make(s, 3);
    /* The 50 % lane has nobody: 20 and 30 share as 2 to 3. */
    push_n(0, 300);
    push_n(1, 300);
    for (int i = 0; i < 500; i++)
        got[pop_lane()]++;
    cr_expect(got[0] >= 199 && got[0] <= 201, "%d", got[0]);
    cr_expect(got[1] >= 299 && got[1] <= 301, "%d", got[1]);
}

Test(lanes, a_lane_alone_gets_every_permit)
{
    static const double s[] = {10, 90};

    make(s, 2);
    push_n(0, 50);
    for (int i = 0; i < 50; i++)
        cr_assert_eq(pop_lane(), 0);
    cr_expect_eq(pop_lane(), -1);
    cr_expect(lanes_idle(&l));
}

Test(lanes, a_one_percent_lane_is_served_once_per_hundred)
{
    static const double s[] = {1, 99};
    int last = -1, served = 0;

    make(s, 2);
    push_n(1, 3000);
    push_n(0, 20);
    for (int i = 0; i < 2000; i++) {
        if (pop_lane() != 0)
            continue;
        if (last >= 0)
            cr_expect(i - last >= 99 && i - last <= 101, "gap %d", i - last);
        else
            cr_expect_leq(i, 100, "first served at permit %d", i);
        last = i;
        served++;
    }
    cr_expect(served >= 19 && served <= 21, "%d", served);
}

Test(lanes, arrival_order_within_a_lane)
{
    static const double s[] = {50, 50};
    struct lane_waiter *a, *b, *c;

    make(s, 2);
    a = push(1);
    push(0);
    b = push(1);
    c = push(1);
    cr_expect_eq(lanes_pop(&l)->lane, 0, "a tie goes to the earlier lane");
    cr_expect_eq(lanes_pop(&l), a);
    cr_expect_eq(lanes_pop(&l), b);
    cr_expect_eq(lanes_pop(&l), c);
    cr_expect_null(lanes_pop(&l));
}

/* A lane empty while the others were served gains nothing for it: when it
 * fills, it gets its share from then on, not a burst. */
Test(lanes, no_credit_while_empty)
{
    static const double s[] = {50, 50};
    int got0 = 0;

    make(s, 2);
    push_n(1, 1200);
    for (int i = 0; i < 1000; i++)
        cr_assert_eq(pop_lane(), 1);
    push_n(0, 100);
    for (int i = 0; i < 20; i++)
        got0 += pop_lane() == 0;
    cr_expect(got0 >= 9 && got0 <= 11, "%d of 20", got0);
}

/* A lane served a moment ago that empties and fills again at once keeps the
 * stride it owes: one request at a time gets no more than its share. */
Test(lanes, refilling_at_once_does_not_jump_the_queue)
{
    static const double s[] = {25, 75};
    int got0 = 0;

    make(s, 2);
    push_n(1, 1000);
    push(0);
    for (int i = 0; i < 400; i++) {
        if (pop_lane() == 0) {
            got0++;
            push(0);
        }
    }
    cr_expect(got0 >= 99 && got0 <= 101, "%d of 400", got0);
}

Test(lanes, any_waiter_may_leave)
{
    static const double s[] = {50, 50};
    struct lane_waiter *a, *b, *c;

    make(s, 2);
    a = push(0);
    b = push(0);
    c = push(0);
    cr_expect(lanes_remove(&l, b));
    cr_expect_not(b->queued);
    cr_expect_not(lanes_remove(&l, b), "gone already");
    cr_expect_eq(lanes_waiting(&l, 0), 2);
    cr_expect_eq(l.waiting, 2);
    cr_expect_eq(lanes_pop(&l), a);
    cr_expect_not(lanes_remove(&l, a), "granted: not queued");
    cr_expect(lanes_remove(&l, c));
    cr_expect(lanes_idle(&l));
    cr_expect_null(lanes_pop(&l));
}

/* ---- predictions -------------------------------------------------------------- */

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The prediction is exact while the lanes with waiters keep having them:
 * random shares, backlogs and histories, then a newcomer; the scheduler
 * serves it at the permit predicted. */
Test(lanes, the_predicted_permits_are_the_ones_served)
{
    unsigned checked = 0;

    for (uint64_t run = 0; run < 200; run++) {
        uint64_t seed = 0x1a4e5 + run;
        uint32_t n = 2 + (uint32_t)(splitmix(&seed) % 3), lane;
        uint64_t left = 10000, predicted, k = 0;
        struct lane_waiter *me;
        struct sc_lane cfg[4];

        memset(cfg, 0, sizeof cfg);
        for (uint32_t i = 0; i < n; i++) {
            uint64_t bp = i + 1 == n ? left
                                     : 1 + splitmix(&seed) % (left - (n - i - 1));
            cfg[i].share = (double)bp / 100;
            left -= bp;
        }
        cr_assert_eq(lanes_init(&l, cfg, n), 0);
        used = 0;
        /* A history: some lanes backlogged, some served a while. */
        for (uint32_t i = 0; i < n; i++)
            if (splitmix(&seed) % 3)
                push_n(i, 900 / n);
        for (uint64_t i = splitmix(&seed) % 200; i > 0 && !lanes_idle(&l); i--)
            lanes_pop(&l);
        lane = (uint32_t)(splitmix(&seed) % n);
        predicted = lanes_permits_until(&l, lane);
        me = push(lane);
        while (me->queued) {
            struct lane_waiter *w = lanes_pop(&l);

            cr_assert_not_null(w);
            k++;
            if (w != me && w->lane != lane && lanes_waiting(&l, w->lane) == 0)
                break;   /* a lane ran dry: the prediction's premise ends */
        }
        checked += !me->queued;
        if (!me->queued)
            cr_assert_eq(k, predicted, "run %llu: served at permit %llu, "
                         "predicted %llu", (unsigned long long)run,
                         (unsigned long long)k, (unsigned long long)predicted);
        lanes_free(&l);
    }
    cr_expect_gt(checked, 100, "most runs end with the newcomer served");
}

Test(lanes, a_newcomer_to_an_empty_lane_is_next_or_nearly)
{
    static const double s[] = {30, 70};

    make(s, 2);
    push_n(1, 100);
    for (int i = 0; i < 10; i++)
        lanes_pop(&l);
    /* The batch lane is mid-way; an interactive request goes at the next
     * permit or the one after (it joins at the pass last served). */
    cr_expect_leq(lanes_permits_until(&l, 0), 2);
    /* A batch newcomer waits behind the 90 batch requests, and the
     * interactive lane has nobody: 91. */
    cr_expect_eq(lanes_permits_until(&l, 1), 91);
    push_n(0, 30);
    /* Now it shares: 91 batch turns take about 91 / 0.7 = 130 permits. */
    cr_expect(lanes_permits_until(&l, 1) >= 129 && lanes_permits_until(&l, 1) <= 131,
              "%llu", (unsigned long long)lanes_permits_until(&l, 1));
}

Test(lanes, the_wait_against_each_lanes_max_wait)
{
    struct sc_lane cfg[2] = {{.share = 30, .max_wait_ms = 2000},
                             {.share = 70, .max_wait_ms = 30000}};
    struct tbucket b;

    cr_assert_eq(lanes_init(&l, cfg, 2), 0);
    used = 0;
    tbucket_init(&b, 10, 1, NOW0);
    tbucket_empty(&b, NOW0);
    push_n(1, 200);
    push_n(0, 5);
    cr_expect_eq(lanes_max_wait_ns(&l, 0), 2 * SEC);
    cr_expect_eq(lanes_max_wait_ns(&l, 1), 30 * SEC);
    /* Interactive newcomer, 6th in its lane: its lane is served first and
     * then once per 1 / 0.3 permits, so 6 + 12 batch permits, 1.8 s at 10/s:
     * within its 2 s (at most (5 + 1) / (0.3 x 10/s) = 2 s, as the contract
     * bounds it). */
    cr_expect_eq(lanes_permits_until(&l, 0), 18);
    cr_expect_eq(lanes_predict_ns(&l, 0, &b, NOW0, NULL, NULL), 1800 * MS);
    cr_expect_leq(lanes_predict_ns(&l, 0, &b, NOW0, NULL, NULL), lanes_max_wait_ns(&l, 0));
    push(0);
    cr_expect_gt(lanes_predict_ns(&l, 0, &b, NOW0, NULL, NULL), lanes_max_wait_ns(&l, 0),
                 "the 7th would wait longer than 2 s");
    /* A batch newcomer, 201st: 201 + 86 interactive permits (the lanes
     * with waiters are taken to keep them), 28.7 s. */
    cr_expect_leq(lanes_predict_ns(&l, 1, &b, NOW0, NULL, NULL), 30 * SEC);
    push_n(1, 10);
    cr_expect_gt(lanes_predict_ns(&l, 1, &b, NOW0, NULL, NULL), 30 * SEC);
    /* Tokens held shorten it: 5 tokens are 5 permits at once. */
    tbucket_init(&b, 10, 5, NOW0);
    cr_expect_eq(lanes_predict_ns(&l, 0, &b, NOW0, NULL, NULL),
                 (lanes_permits_until(&l, 0) - 5) * 100 * MS);
}

/* ---- on a bucket ---------------------------------------------------------------- */

Test(lanes, a_request_alone_goes_at_once_others_queue)
{
    static const double s[] = {50, 50};
    struct tbucket b;

    make(s, 2);
    tbucket_init(&b, 10, 2, NOW0);
    cr_expect(lanes_try_now(&l, &b, NOW0));
    push(1);
    cr_expect_not(lanes_try_now(&l, &b, NOW0), "a token, but somebody waits");
    cr_expect_not_null(lanes_grant(&l, &b, NOW0), "the waiter gets it");
    cr_expect_null(lanes_grant(&l, &b, NOW0), "nobody waits");
    push(0);
    cr_expect_null(lanes_grant(&l, &b, NOW0), "no token");
    cr_expect_eq(tbucket_next_ns(&b, NOW0), 100 * MS);
    cr_expect_not_null(lanes_grant(&l, &b, NOW0 + 100 * MS));
}

/* 10/s for 60 s, a batch backlog and 8 interactive requests every 5 s:
 * permits are granted as tokens fall due, none is withheld while anyone
 * waits, each interactive burst is served interleaved at its 30 % (8
 * permits over about 8 / 0.3 = 27, never 8 in a row), and the bucket's bound
 * holds over all lanes together. */
Test(lanes, a_run_on_a_bucket)
{
    static const double s[] = {30, 70};
    struct tbucket b;
    uint64_t t, granted = 0, first = 0, inter = 0;

    make(s, 2);
    tbucket_init(&b, 10, 3, NOW0);
    push_n(1, 1000);
    for (t = NOW0; t < NOW0 + 60 * SEC; t += 10 * MS) {
        struct lane_waiter *w;

        if ((t - NOW0) % (5 * SEC) == 0)
            push_n(0, 8);
        while ((w = lanes_grant(&l, &b, t))) {
            granted++;
            if (w->lane != 0)
                continue;
            if (inter++ % 8 == 0)
                first = granted;
            else if (inter % 8 == 0)
                cr_expect(granted - first + 1 >= 23 && granted - first + 1 <= 26,
                          "8 interactive permits over %llu",
                          (unsigned long long)(granted - first + 1));
        }
        cr_assert(lanes_idle(&l) || tbucket_tokens(&b, t) < 1, "work-conserving");
    }
    cr_expect_eq(inter, 12 * 8, "every burst served within its 5 s");
    cr_expect_leq(granted, 3 + 600, "burst + rate x t");
    cr_expect_geq(granted, 600);
}

/* ---- names, limits, renumbering ------------------------------------------------- */

Test(lanes, a_header_names_a_lane_exactly_after_trimming)
{
    struct sc_lane cfg[2] = {{.name = "interactive"}, {.name = "batch"}};
    struct sc_policy p = {.lanes = cfg, .n_lanes = 2};
    char buf[64];

    cr_expect_eq(lanes_find(&p, "batch"), 1);
    cr_expect_eq(lanes_find(&p, " \tinteractive "), 0);
    cr_expect_eq(lanes_find(&p, "Batch"), -1, "exactly: case counts");
    cr_expect_eq(lanes_find(&p, "bat"), -1);
    cr_expect_eq(lanes_find(&p, "batch,interactive"), -1);
    cr_expect_eq(lanes_find(&p, ""), -1);
    cr_expect_eq(lanes_find(&p, NULL), -1);
    cr_expect_str_eq(lanes_describe(&p, buf, sizeof buf), "interactive, batch");
    cr_expect_str_eq(lanes_describe(&p, buf, 8), "interac", "cut to fit");
}

Test(lanes, no_lanes_is_refused)
{
    cr_expect_eq(lanes_init(&l, NULL, 0), -EINVAL);
}

Test(lanes, shares_keep_holding_across_renumbering)
{
    static const double s[] = {30, 70};
    int got0 = 0;

    make(s, 2);
    push_n(0, 300);
    push_n(1, 700);
    /* As if it had run for years: passes just below the renumbering mark. */
    l.vtime = (1ull << 62) - 5;
    l.v[0].pass = l.vtime + 1;
    l.v[1].pass = l.vtime;
    for (int i = 0; i < 1000; i++)
        got0 += pop_lane() == 0;
    cr_expect_lt(l.vtime, 1ull << 40, "renumbered");
    cr_expect(got0 >= 299 && got0 <= 301, "%d", got0);
}
