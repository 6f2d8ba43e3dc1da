/* proxy/exchange/stage_lanes.c: the lane row (the route's lane, the lane
 * header's, a 400 naming the lanes, the lane's max_wait) and the granted
 * permit row on a fake clock, on the policies' real pacing state: a token
 * and nobody waiting goes at once, the first waiter keeps the timer, a
 * grant wakes the waiter it goes to, a lane's max_wait refuses at once or
 * at its end, a leaving keeper hands the timer on. */
#include "unit/proxy/exchange/fixture.h"

static const char yaml[] =
    "upstreams: { up: { url: http://127.0.0.1:9000 } }\n"
    "policies:\n"
    "  p:\n"
    "    rate: 1/s\n"
    "    max_wait: 10s\n"
    "    lanes:\n"
    "      - { name: interactive, share: 30%, max_wait: 1500ms }\n"
    "      - { name: batch, share: 70% }\n"
    "routes:\n"
    "  - { prefix: /click, upstream: up, policy: p, lane: interactive }\n"
    "  - { prefix: /sync, upstream: up, policy: p }\n";

static void up(void)
{
    fixture_up(yaml);
}

TestSuite(lanes, .init = up, .fini = fixture_down);

static const struct ex_stage *const rows[] = {&stage_lane, &stage_permit_lanes};

/* The lane row, then the permit row's first run, at now. */
static enum ex_verdict arrive(struct exchange *ex, size_t route, uint64_t now)
{
    fake(ex, route);
    cr_assert_eq(run(&stage_lane, ex, WOKE_FIRST, now), EXV_NEXT);
    return run(&stage_permit_lanes, ex, WOKE_FIRST, now);
}

static void done(struct exchange *ex)
{
    release(ex, REL_ANSWER, rows, 2);
    release(ex, REL_END, rows, 2);
}

Test(lanes, the_route_the_header_or_a_400)
{
    struct exchange ex;

    fake(&ex, 1);
    cr_expect_eq(run(&stage_lane, &ex, WOKE_FIRST, T0), EXV_NEXT);
    cr_expect(ex.has_lane);
    cr_expect_eq(ex.lane, 1, "a route without a lane: the policy's last");
    cr_expect_eq(ex.max_wait_ns, 10000 * MS, "the batch lane: the policy's max_wait");
    fake(&ex, 1);
    ex.lane_value = " interactive\t";
    cr_expect_eq(run(&stage_lane, &ex, WOKE_FIRST, T0), EXV_NEXT);
    cr_expect_eq(ex.lane, 0);
    cr_expect_eq(ex.max_wait_ns, 1500 * MS, "the lane's own max_wait");
    fake(&ex, 0);
    ex.lane_value = "urgent";
    cr_expect_eq(run(&stage_lane, &ex, WOKE_FIRST, T0), EXV_ANSWER);
    cr_expect_eq(ex.status, 400);
    cr_expect_eq(ex.outcome, OUT_REJECTED);
    cr_expect(strstr(ex.detail, "interactive, batch") && strstr(ex.detail, "urgent"),
              "%s", ex.detail);
}

Test(lanes, a_grant_wakes_the_waiter_it_goes_to)
{
    struct exchange a, keeper, other;

    cr_expect_eq(arrive(&a, 1, T0), EXV_NEXT, "a token and nobody waiting");
    cr_expect_eq(arrive(&keeper, 1, T0), EXV_WAIT);
    cr_expect_eq(keeper.wake_at, T0 + 1000 * MS, "the keeper's timer: the next token");
    cr_expect_eq(arrive(&other, 0, T0 + MS), EXV_WAIT);
    cr_expect_eq(other.wake_at, other.wait_deadline_ns, "only its deadline");
    /* The keeper's round: the interactive lane's turn comes first. */
    cr_expect_eq(run(&stage_permit_lanes, &keeper, WOKE_TIMER, T0 + 1000 * MS), EXV_WAIT);
    cr_expect(other.pwait.granted, "granted to the interactive waiter");
    cr_expect_eq(run(&stage_permit_lanes, &other, WOKE_EVENT, T0 + 1000 * MS), EXV_NEXT);
    cr_expect_eq(other.permit_wait_ns, 999 * MS);
    cr_expect_eq(run(&stage_permit_lanes, &keeper, WOKE_TIMER, T0 + 2000 * MS), EXV_NEXT);
    done(&a);
    done(&keeper);
    done(&other);
}

Test(lanes, a_lane_max_wait_refuses_at_once_or_at_its_end)
{
    struct exchange a, b, c;

    cr_expect_eq(arrive(&a, 0, T0), EXV_NEXT);
    cr_expect_eq(arrive(&b, 0, T0), EXV_WAIT, "1 s away, within 1.5 s");
    cr_expect_eq(arrive(&c, 0, T0), EXV_ANSWER, "2 s away: refused at once");
    cr_expect_eq(c.reason, R_RATE_LIMITED);
    cr_expect_eq(c.instr.delay_ms, 2000, "with the predicted delay");
    /* The bucket pauses: b's permit does not come within its max_wait. */
    bucket_pause(b.bucket, T0 + 100 * MS, T0 + 5000 * MS, PAUSE_UPSTREAM_429);
    cr_expect_eq(run(&stage_permit_lanes, &b, WOKE_TIMER, T0 + 1500 * MS), EXV_ANSWER);
    cr_expect_eq(b.reason, R_UPSTREAM_COOLDOWN);
    cr_expect_geq(b.instr.delay_ms, 3500);
    cr_expect_eq(permits_waiting(b.bucket->pm, 0), 0, "it left its lane");
    done(&a);
    done(&b);
    done(&c);
}

Test(lanes, a_keeper_that_leaves_hands_the_timer_on)
{
    struct exchange a, keeper, next;

    cr_expect_eq(arrive(&a, 1, T0), EXV_NEXT);
    cr_expect_eq(arrive(&keeper, 1, T0), EXV_WAIT);
    cr_expect_eq(arrive(&next, 1, T0), EXV_WAIT);
    cr_expect_not(next.pwait.keeper);
    done(&keeper);   /* its worker went away */
    cr_expect(next.pwait.keeper, "the next waiter keeps the timer");
    cr_expect_eq(run(&stage_permit_lanes, &next, WOKE_EVENT, T0 + 10 * MS), EXV_WAIT);
    cr_expect_eq(next.wake_at, T0 + 1000 * MS);
    cr_expect_eq(run(&stage_permit_lanes, &next, WOKE_TIMER, T0 + 1000 * MS), EXV_NEXT);
    done(&a);
    done(&next);
}

/* ---- permit_shadow_lanes ----------------------------------------------------- */

/* mode: shadow: the lane row, then the shadow row, never wait; what the
 * lane would have done is ex.shadow (its wait, its lane's max_wait's
 * refusal), and the request counts in flight until released. */
static const char shadow_yaml[] =
    "upstreams: { up: { url: http://127.0.0.1:9000 } }\n"
    "policies:\n"
    "  p:\n"
    "    rate: 1/s\n"
    "    mode: shadow\n"
    "    max_wait: 10s\n"
    "    lanes:\n"
    "      - { name: interactive, share: 30%, max_wait: 1500ms }\n"
    "      - { name: batch, share: 70% }\n"
    "routes:\n"
    "  - { prefix: /click, upstream: up, policy: p, lane: interactive }\n"
    "  - { prefix: /sync, upstream: up, policy: p }\n";

static void shadow_up(void)
{
    fixture_up(shadow_yaml);
}

TestSuite(shadow_lanes, .init = shadow_up, .fini = fixture_down);

static const struct ex_stage *const shadow_rows[] = {&stage_lane, &stage_permit_shadow_lanes};

static enum shadow_verdict shadow_arrive(struct exchange *ex, size_t route, uint64_t now)
{
    fake(ex, route);
    cr_assert_eq(run(&stage_lane, ex, WOKE_FIRST, now), EXV_NEXT);
    cr_assert_eq(run(&stage_permit_shadow_lanes, ex, WOKE_FIRST, now), EXV_NEXT,
                 "a shadow request never waits");
    return ex->shadow;
}

static void shadow_done(struct exchange *ex)
{
    release(ex, REL_ANSWER, shadow_rows, 2);
    release(ex, REL_END, shadow_rows, 2);
}

Test(shadow_lanes, each_lane_says_what_enforcing_would_have_done)
{
    struct exchange b[12], i[3];
    int refused = 0;

    /* batch alone at 1/s, burst 1, 10 s: the first at once, 10 waits, the
     * twelfth (11 s) refused */
    for (int k = 0; k < 12; k++) {
        enum shadow_verdict v = shadow_arrive(&b[k], 1, T0);

        cr_expect_eq(v, k == 0 ? SHADOW_NONE : k <= 10 ? SHADOW_PERMIT_WAIT
                                                       : SHADOW_RATE_LIMITED,
                     "batch %d: %d", k, v);
    }
    /* interactive behind that backlog: its own lane's clock, at 30 %: the
     * first at once, the second 3.3 s away (beyond its 1.5 s): refused */
    cr_expect_eq(shadow_arrive(&i[0], 0, T0), SHADOW_NONE);
    for (int k = 1; k < 3; k++)
        refused += shadow_arrive(&i[k], 0, T0) == SHADOW_RATE_LIMITED;
    cr_expect_eq(refused, 2);
    cr_expect(i[0].pm_flight, "counted in flight for the quota row");
    for (int k = 0; k < 12; k++)
        shadow_done(&b[k]);
    for (int k = 0; k < 3; k++)
        shadow_done(&i[k]);
    cr_expect_eq(pacing_policy(&fx.pacing, 0)->bucket.pm->flight, 0,
                 "every release counted its request out");
}
