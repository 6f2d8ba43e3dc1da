/* pacing/permits.c: permits granted when they fall due, among lanes
 * (docs/contract.md §13), on a fake clock. A request that finds a token and
 * nobody waiting goes at once; the others wait in their lanes and one of
 * them, the keeper, is told when the next token is due; its poll hands out
 * what is due, by the lanes' shares, waking each waiter granted and naming
 * a new keeper when it was granted itself or left. Refusals by the
 * predicted wait; pauses; the bound burst + rate x t; a reload's hand-over
 * by lane name. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "pacing/permits.h"

#define SEC 1000000000ull
#define MS 1000000ull
#define NOW0 (1000ull * SEC)
#define N_MAX 512

struct sim {
    struct permits pm;
    struct permit_waiter w[N_MAX];
    int woken[N_MAX];       /* wakes each waiter had */
    uint64_t at[N_MAX];     /* the moment each asked to look again */
    uint64_t granted_at[N_MAX];
    int n;
};

static void on_wake(struct permit_waiter *w)
{
    struct sim *s = w->arg;

    s->woken[w - s->w]++;
}

static struct sc_lane two_lanes[] = {
    {.name = "interactive", .share = 30, .max_wait_ms = 2000},
    {.name = "batch", .share = 70, .max_wait_ms = 30000},
};

static struct sim *sim_new(const struct sc_lane *cfg, size_t n, double rate,
                           uint32_t burst)
{
    struct sim *s = calloc(1, sizeof *s);

    cr_assert_not_null(s);
    cr_assert_eq(permits_init(&s->pm, cfg, n, rate, burst, NOW0), 0);
    return s;
}

static void sim_free(struct sim *s)
{
    permits_free(&s->pm);
    free(s);
}

/* A new request of lane asks at now; returns its index. */
static int ask(struct sim *s, uint32_t lane, uint64_t now, uint64_t max_wait,
               enum permit_ask *r)
{
    int i = s->n++;

    cr_assert_lt(i, N_MAX);
    s->w[i].wake = on_wake;
    s->w[i].arg = s;
    *r = permits_ask(&s->pm, &s->w[i], lane, now, max_wait, &s->at[i]);
    if (*r == PERMIT_GO)
        s->granted_at[i] = now;
    return i;
}

/* The waiter keeping time now, or -1. */
static int keeper(const struct sim *s)
{
    for (int i = 0; i < s->n; i++)
        if (s->w[i].keeper && !s->w[i].granted)
            return i;
    return -1;
}

/* As the exchanges would: every woken waiter polls at now; granted ones
 * note when. */
static void poll_woken(struct sim *s, uint64_t now)
{
    for (int i = 0; i < s->n; i++) {
        if (!s->woken[i])
            continue;
        s->woken[i] = 0;
        if (!s->granted_at[i] &&
            permits_poll(&s->pm, &s->w[i], now, &s->at[i]) == PERMIT_GO)
            s->granted_at[i] = now;
    }
}

/* Runs the keeper's timer until `until`; returns the permits granted. */
static int run_until(struct sim *s, uint64_t until)
{
    int granted = 0, k;

    while ((k = keeper(s)) >= 0 && s->at[k] && s->at[k] <= until) {
        uint64_t now = s->at[k];

        if (permits_poll(&s->pm, &s->w[k], now, &s->at[k]) == PERMIT_GO)
            s->granted_at[k] = now;
        poll_woken(s, now);
    }
    for (int i = 0; i < s->n; i++)
        granted += s->granted_at[i] != 0;
    return granted;
}

Test(permits, a_token_and_nobody_waiting_goes_at_once_else_the_first_keeps_time)
{
    struct sim *s = sim_new(two_lanes, 2, 10, 1);
    enum permit_ask r;
    int a, b;

    ask(s, 1, NOW0, 30 * SEC, &r);
    cr_expect_eq(r, PERMIT_GO);
    a = ask(s, 1, NOW0, 30 * SEC, &r);
    cr_expect_eq(r, PERMIT_WAIT);
    cr_expect(s->w[a].keeper, "the first waiter keeps time");
    cr_expect_eq(s->at[a], NOW0 + SEC / 10, "the next token is 100 ms away");
    b = ask(s, 0, NOW0, 30 * SEC, &r);
    cr_expect_eq(r, PERMIT_WAIT);
    cr_expect_not(s->w[b].keeper);
    cr_expect_eq(s->at[b], 0, "only its deadline wakes it");
    /* Even with a token there, nobody overtakes those waiting. */
    cr_expect_eq(run_until(s, NOW0 + SEC / 10), 2);
    sim_free(s);
}

Test(permits, lanes_with_waiters_share_the_permits_as_configured)
{
    struct sim *s = sim_new(two_lanes, 2, 50, 1);
    enum permit_ask r;
    int by_lane[2] = {0, 0};
    int first[2] = {0, 0};

    for (int i = 0; i < 200; i++)
        ask(s, (uint32_t)(i & 1), NOW0, 3600 * SEC, &r);
    /* 100 permits at 50/s: 2 s. Both lanes keep waiters throughout. */
    run_until(s, NOW0 + 2 * SEC);
    for (int i = 0; i < s->n; i++)
        if (s->granted_at[i] && s->granted_at[i] > NOW0)
            by_lane[s->w[i].lw.lane]++;
        else if (s->granted_at[i])
            first[s->w[i].lw.lane]++;
    cr_expect_eq(first[0] + first[1], 1, "the burst went at once");
    cr_expect_eq(by_lane[0] + by_lane[1], 100, "%d + %d", by_lane[0], by_lane[1]);
    cr_expect(by_lane[0] >= 29 && by_lane[0] <= 31, "interactive got %d of 100",
              by_lane[0]);
    sim_free(s);
}

Test(permits, a_lane_alone_gets_every_permit_and_the_bound_holds)
{
    struct sim *s = sim_new(two_lanes, 2, 20, 5);
    enum permit_ask r;
    uint64_t t[N_MAX];
    int n = 0;

    for (int i = 0; i < 300; i++)
        ask(s, 1, NOW0, 3600 * SEC, &r);
    run_until(s, NOW0 + 10 * SEC);
    for (int i = 0; i < s->n; i++)
        if (s->granted_at[i])
            t[n++] = s->granted_at[i];
    /* 5 at once, then 20/s for 10 s: work-conserving, every permit used. */
    cr_expect_eq(n, 5 + 200, "granted %d", n);
    for (int i = 0; i < n; i++)
        for (int j = i; j < n; j++)
            cr_assert_leq((double)(j - i + 1),
                          5 + 20 * (double)(t[j] - t[i]) / SEC + 1e-9,
                          "%d permits in %llu ns", j - i + 1,
                          (unsigned long long)(t[j] - t[i]));
    sim_free(s);
}

Test(permits, arrival_order_within_a_lane)
{
    struct sim *s = sim_new(two_lanes, 2, 10, 1);
    enum permit_ask r;

    ask(s, 0, NOW0, 30 * SEC, &r);
    for (int i = 0; i < 20; i++)
        ask(s, 0, NOW0 + (uint64_t)i, 30 * SEC, &r);
    run_until(s, NOW0 + 3 * SEC);
    for (int i = 2; i < s->n; i++)
        cr_expect_gt(s->granted_at[i], s->granted_at[i - 1], "waiter %d", i);
    sim_free(s);
}

Test(permits, a_small_lane_is_not_starved)
{
    static struct sc_lane lanes[] = {
        {.name = "rare", .share = 1, .max_wait_ms = 3600000},
        {.name = "bulk", .share = 99, .max_wait_ms = 3600000},
    };
    struct sim *s = sim_new(lanes, 2, 100, 1);
    enum permit_ask r;
    int rare;

    ask(s, 1, NOW0, 3600 * SEC, &r);
    for (int i = 0; i < 400; i++)
        ask(s, 1, NOW0, 3600 * SEC, &r);
    rare = ask(s, 0, NOW0, 3600 * SEC, &r);
    run_until(s, NOW0 + 3 * SEC);
    cr_expect_neq(s->granted_at[rare], 0, "the 1 %% lane's request was served");
    cr_expect_leq(s->granted_at[rare], NOW0 + 101 * SEC / 100 + SEC / 100,
                  "within about 100 permits: %llu ms",
                  (unsigned long long)((s->granted_at[rare] - NOW0) / MS));
    sim_free(s);
}

Test(permits, interactive_waits_for_its_own_lane_not_the_batch_backlog)
{
    struct sim *s = sim_new(two_lanes, 2, 50, 1);
    enum permit_ask r;
    int first;

    for (int i = 0; i < 128; i++)
        ask(s, 1, NOW0, 3600 * SEC, &r);
    run_until(s, NOW0 + SEC);
    first = ask(s, 0, NOW0 + SEC, 2 * SEC, &r);
    cr_expect_eq(r, PERMIT_WAIT);
    run_until(s, NOW0 + 2 * SEC);
    /* About one permit interval of its lane: 1 / (0.3 x 50) = 67 ms. */
    cr_expect_leq(s->granted_at[first] - (NOW0 + SEC), 2 * SEC / 15 + 20 * MS,
                  "waited %llu ms", (unsigned long long)((s->granted_at[first] -
                                                          NOW0 - SEC) / MS));
    sim_free(s);
}

Test(permits, a_predicted_wait_beyond_max_wait_is_refused_with_it)
{
    struct sim *s = sim_new(two_lanes, 2, 10, 1);
    enum permit_ask r;
    int last;

    ask(s, 1, NOW0, 30 * SEC, &r);
    for (int i = 0; i < 9; i++)
        ask(s, 1, NOW0, 30 * SEC, &r);
    /* 9 ahead, alone in its lane: its own is the 10th token, 1 s away. */
    last = ask(s, 1, NOW0, 900 * MS, &r);
    cr_expect_eq(r, PERMIT_REFUSED);
    cr_expect_eq(s->at[last], SEC, "predicted %llu ns", (unsigned long long)s->at[last]);
    cr_expect_not(s->w[last].lw.queued, "a refused request does not wait");
    last = ask(s, 1, NOW0, SEC, &r);
    cr_expect_eq(r, PERMIT_WAIT);
    sim_free(s);
}

Test(permits, a_keeper_that_leaves_names_another)
{
    struct sim *s = sim_new(two_lanes, 2, 10, 1);
    enum permit_ask r;
    uint64_t delay = 0;
    int a, b;

    ask(s, 0, NOW0, 30 * SEC, &r);
    a = ask(s, 0, NOW0, 30 * SEC, &r);
    b = ask(s, 1, NOW0, 30 * SEC, &r);
    cr_assert(s->w[a].keeper);
    cr_expect(permits_leave(&s->pm, &s->w[a], NOW0 + MS, &delay));
    cr_expect(s->w[b].keeper, "the other waiter keeps time now");
    cr_expect_eq(s->woken[b], 1, "and was woken to arm its timer");
    cr_expect_gt(delay, 0);
    poll_woken(s, NOW0 + MS);
    cr_expect_eq(s->at[b], NOW0 + SEC / 10);
    cr_expect_eq(run_until(s, NOW0 + SEC), 2);
    cr_expect_not(permits_leave(&s->pm, &s->w[b], NOW0 + SEC, NULL),
                  "granted: nothing to leave");
    sim_free(s);
}

Test(permits, a_pause_holds_every_lane_and_resumes_empty)
{
    struct sim *s = sim_new(two_lanes, 2, 10, 5);
    enum permit_ask r;
    int a;

    permits_pause(&s->pm, NOW0, NOW0 + 2 * SEC);
    a = ask(s, 0, NOW0, 30 * SEC, &r);
    cr_expect_eq(r, PERMIT_WAIT, "nothing before the pause's end");
    cr_expect_eq(s->at[a], NOW0 + 2 * SEC + SEC / 10, "one interval after it");
    ask(s, 1, NOW0, 30 * SEC, &r);
    cr_expect_eq(run_until(s, NOW0 + 2 * SEC + SEC / 10 - 1), 0);
    cr_expect_eq(run_until(s, NOW0 + 2 * SEC + SEC / 10), 1, "resumes empty: one");
    cr_expect_eq(permits_available(&s->pm, NOW0 + 2 * SEC + SEC / 10, NULL), 0);
    sim_free(s);
}

Test(permits, a_resume_wakes_the_keeper)
{
    struct sim *s = sim_new(two_lanes, 2, 10, 1);
    enum permit_ask r;
    int a;

    permits_pause(&s->pm, NOW0, NOW0 + 60 * SEC);
    a = ask(s, 0, NOW0, 90 * SEC, &r);
    permits_resume(&s->pm, NOW0 + SEC);
    cr_expect_eq(s->woken[a], 1);
    poll_woken(s, NOW0 + SEC);
    cr_expect_eq(s->at[a], NOW0 + SEC + SEC / 10);
    sim_free(s);
}

Test(permits, a_reload_hands_waiters_over_by_lane_name)
{
    static struct sc_lane renamed[] = {
        {.name = "batch", .share = 50, .max_wait_ms = 30000},
        {.name = "other", .share = 50, .max_wait_ms = 30000},
    };
    struct sim *s = sim_new(two_lanes, 2, 10, 3);
    struct permits to;
    enum permit_ask r;
    int a, b;

    ask(s, 0, NOW0, 30 * SEC, &r);
    ask(s, 0, NOW0, 30 * SEC, &r);
    ask(s, 0, NOW0, 30 * SEC, &r);
    a = ask(s, 0, NOW0, 30 * SEC, &r);
    b = ask(s, 1, NOW0, 30 * SEC, &r);
    cr_assert_eq(permits_init(&to, renamed, 2, 5, 1, NOW0), 0);
    cr_assert_eq(permits_hand_over(&s->pm, &to, NOW0), 0);
    cr_expect_eq(s->w[b].lw.lane, 0, "batch keeps its name");
    cr_expect_eq(s->w[a].lw.lane, 1, "interactive is gone: the last lane");
    cr_expect_eq(permits_waiting(&to, 0), 1);
    cr_expect_eq(permits_waiting(&to, 1), 1);
    cr_expect_eq(permits_waiting(&s->pm, 1), 1, "asked of the old: the new's");
    cr_expect_eq(permits_available(&to, NOW0, NULL), 0, "no token came with it");
    /* A keeper in the new state, at the new rate (5/s). */
    poll_woken(s, NOW0);
    cr_expect(s->w[a].keeper || s->w[b].keeper);
    cr_expect_eq(s->at[s->w[a].keeper ? a : b], NOW0 + SEC / 5);
    cr_expect(permits_leave(&s->pm, &s->w[a], NOW0, NULL), "left where it is now");
    cr_expect_eq(permits_waiting(&to, 1), 0);
    permits_free(&to);
    sim_free(s);
}

/* quota: {follow: true}: what an answer advertises sets the rate permits
 * are granted at, net of those granted and not answered; the reset raises
 * it back. */
Test(permits, an_advertised_quota_sets_the_rate_net_of_those_in_flight)
{
    static struct sc_lane one[] = {{.name = "", .share = 100, .max_wait_ms = 60000}};
    struct sim *s = sim_new(one, 1, 100, 10);
    struct quota_headers h = {.x_limit = "100", .x_remaining = "7", .x_reset = "11"};
    struct quota_result res = {0};
    struct permits_view v;
    enum permit_ask r;

    permits_follow(&s->pm, 0.1);
    for (int i = 0; i < 3; i++)
        ask(s, 0, NOW0, SEC, &r);
    cr_expect_eq(s->pm.flight, 3);
    /* One answered: 2 still in flight, 7 remain: (7 - 2) / 10 s (by 1 s
     * before the reset: whole seconds). */
    permits_answered(&s->pm, &h, NOW0, 1767225600000ull, -1, &res);
    cr_expect_eq(res.items, 1);
    permits_view(&s->pm, NOW0, &v);
    cr_expect_float_eq(v.rate, 0.5, 1e-9, "rate %g", v.rate);
    cr_expect(v.limited);
    cr_expect_eq(v.capacity, 7, "the bucket holds no more than remains");
    permits_view(&s->pm, NOW0 + 12 * SEC, &v);
    cr_expect_float_eq(v.rate, 100, 1e-9, "after the reset: the configured rate");
    sim_free(s);
}

Test(permits, an_advertised_zero_asks_for_a_pause_until_the_reset)
{
    static struct sc_lane one[] = {{.name = "", .share = 100, .max_wait_ms = 60000}};
    struct sim *s = sim_new(one, 1, 100, 10);
    struct quota_headers h = {.ratelimit = "\"day\";r=0;t=30"};
    struct quota_result res = {0};
    enum permit_ask r;

    permits_follow(&s->pm, 1);
    ask(s, 0, NOW0, SEC, &r);
    permits_answered(&s->pm, &h, NOW0, 1767225600000ull, -1, &res);
    cr_expect_eq(res.pause_until, NOW0 + 30 * SEC);
    cr_expect_eq(s->pm.flight, 0);
    sim_free(s);
}

/* A window spent out: the waiter keeping time is told to look again at the
 * reset, and is granted there, not one interval (w / q) later. */
Test(permits, after_an_advertised_zero_the_first_permit_is_at_the_reset)
{
    static struct sc_lane one[] = {{.name = "", .share = 100, .max_wait_ms = 60000}};
    struct sim *s = sim_new(one, 1, 100, 10);
    struct quota_headers h = {.policy = "\"w\";q=20;w=2", .ratelimit = "\"w\";r=0;t=1"};
    struct quota_result res = {0};
    enum permit_ask r;
    int a;

    permits_follow(&s->pm, 1);
    ask(s, 0, NOW0, SEC, &r);
    cr_assert_eq(r, PERMIT_GO);
    permits_answered(&s->pm, &h, NOW0, 1767225600000ull, -1, &res);
    cr_assert_eq(res.pause_until, NOW0 + SEC);
    permits_pause(&s->pm, NOW0, res.pause_until);
    a = ask(s, 0, NOW0 + 10 * MS, 5 * SEC, &r);
    cr_assert_eq(r, PERMIT_WAIT);
    cr_expect(s->w[a].keeper);
    cr_expect_eq(s->at[a], NOW0 + SEC, "look again at the reset");
    cr_expect_eq(run_until(s, NOW0 + SEC), 2, "granted at the reset");
    cr_expect_eq(s->granted_at[a], NOW0 + SEC);
    sim_free(s);
}

/* A fleet's granted request waiting for its reserved start is not sent yet:
 * not among the f of the rule (times the fleet's size). */
Test(permits, a_held_permit_is_not_in_flight_for_the_quota)
{
    static struct sc_lane one[] = {{.name = "", .share = 100, .max_wait_ms = 60000}};
    struct sim *s = sim_new(one, 1, 100, 10);
    struct quota_headers h = {.x_limit = "100", .x_remaining = "9", .x_reset = "11"};
    struct quota_result res = {0};
    struct permits_view v;
    enum permit_ask r;

    permits_follow(&s->pm, 0.1);
    s->pm.flight_scale = 2;
    for (int i = 0; i < 3; i++)
        ask(s, 0, NOW0, SEC, &r);
    permits_hold(&s->pm, true);   /* one of them waits for the fleet */
    /* One answered: 2 in flight, 1 of them held: f = 1 x 2; (9 - 2) / 10 s. */
    permits_answered(&s->pm, &h, NOW0, 1767225600000ull, -1, &res);
    permits_view(&s->pm, NOW0, &v);
    cr_expect_float_eq(v.rate, 0.7, 1e-9, "rate %g", v.rate);
    permits_hold(&s->pm, false);
    permits_answered(&s->pm, &h, NOW0, 1767225600000ull, -1, &res);
    permits_view(&s->pm, NOW0, &v);
    cr_expect_float_eq(v.rate, 0.7, 1e-9, "1 in flight x 2: (9 - 2) / 10 s");
    cr_expect_eq(s->pm.held, 0);
    sim_free(s);
}
