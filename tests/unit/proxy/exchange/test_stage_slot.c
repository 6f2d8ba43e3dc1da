/* proxy/exchange/stage_slot.c: the slot row on a fake clock: granted at
 * once or on a release, refused at max_wait, a grant that races the timer
 * kept, a request that leaves the queue gives everything back, and a slot
 * kept while the answer's body streams, given back when its flight ends. */
#include "unit/proxy/exchange/fixture.h"

static const char yaml[] =
    "upstreams: { up: { url: http://127.0.0.1:9000 } }\n"
    "policies:\n"
    "  one: { concurrency: 1, max_wait: 2s }\n"
    "routes:\n"
    "  - { prefix: /one, upstream: up, policy: one }\n"
    "  - { prefix: /free, upstream: up }\n";

static void up(void)
{
    fixture_up(yaml);
}

TestSuite(slot, .init = up, .fini = fixture_down);

static const struct ex_stage *const rows[] = {&stage_slot};

static void give_back(struct exchange *ex)
{
    release(ex, REL_END, rows, 1);
}

/* What the driver does when the grant's event fires: the loop runs it. */
static void deliver(void)
{
    event_base_loop(fx.env.base, EVLOOP_NONBLOCK);
}

static uint32_t inflight(void)
{
    return pacing_inflight(pacing_policy(&fx.pacing, 0));
}

Test(slot, granted_on_a_release_or_refused_at_max_wait)
{
    struct exchange a, b, c;

    fake(&a, 0);
    fake(&b, 0);
    fake(&c, 0);
    cr_assert_eq(run(&stage_slot, &a, WOKE_FIRST, T0), EXV_NEXT);
    cr_expect(a.has_slot);
    cr_assert_eq(run(&stage_slot, &b, WOKE_FIRST, T0), EXV_WAIT);
    cr_expect_eq(b.wake_at, T0 + 2000 * MS, "woken at max_wait at the latest");
    give_back(&a); /* hands the slot to b */
    deliver();
    cr_expect_eq(run(&stage_slot, &b, WOKE_EVENT, T0 + 10 * MS), EXV_NEXT);
    cr_expect(b.has_slot);
    cr_expect_eq(b.permit_wait_ns, 10 * MS);
    /* c waits, and max_wait passes with b still holding the slot */
    cr_assert_eq(run(&stage_slot, &c, WOKE_FIRST, T0), EXV_WAIT);
    cr_expect_eq(run(&stage_slot, &c, WOKE_TIMER, T0 + 2000 * MS), EXV_ANSWER);
    cr_expect_eq(c.reason, R_RATE_LIMITED);
    cr_expect(!c.has_slot);
    give_back(&b);
    give_back(&c);
    cr_expect_eq(inflight(), 0, "every slot came back");
}

/* A grant that races the max_wait timer still counts: the slot is the
 * request's, never lost. */
Test(slot, a_grant_racing_the_timer_is_kept)
{
    struct exchange a, b;

    fake(&a, 0);
    fake(&b, 0);
    cr_assert_eq(run(&stage_slot, &a, WOKE_FIRST, T0), EXV_NEXT);
    cr_assert_eq(run(&stage_slot, &b, WOKE_FIRST, T0), EXV_WAIT);
    give_back(&a);
    cr_expect_eq(run(&stage_slot, &b, WOKE_TIMER, T0 + 2000 * MS), EXV_NEXT);
    cr_expect(b.has_slot);
    give_back(&b);
    deliver(); /* the grant's event was dropped with b: nothing runs */
    cr_expect_eq(inflight(), 0);
}

/* A worker leaving while queued for a slot: the release path takes it out
 * of the queue, and a slot granted meanwhile goes back. */
Test(slot, leaving_the_queue_gives_everything_back)
{
    struct exchange a, b;

    fake(&a, 0);
    fake(&b, 0);
    cr_assert_eq(run(&stage_slot, &a, WOKE_FIRST, T0), EXV_NEXT);
    cr_assert_eq(run(&stage_slot, &b, WOKE_FIRST, T0), EXV_WAIT);
    give_back(&a); /* granted to b, b not yet woken */
    give_back(&b); /* b leaves: the slot it was granted goes back */
    cr_expect_eq(inflight(), 0);
}

/* The answer is decided with its body still coming: the slot stays taken
 * until the flight ends (REL_FLIGHT), not when the answer is queued. */
Test(slot, a_streamed_body_keeps_its_slot_until_its_end)
{
    struct exchange a;

    fake(&a, 0);
    cr_assert_eq(run(&stage_slot, &a, WOKE_FIRST, T0), EXV_NEXT);
    a.streaming = true;
    release(&a, REL_ANSWER, rows, 1);
    cr_expect_eq(inflight(), 1, "in flight while the body streams");
    a.up_done = true;
    release(&a, REL_FLIGHT, rows, 1);
    cr_expect_eq(inflight(), 0, "given back at the body's end");
    give_back(&a);
    cr_expect_eq(inflight(), 0, "once");
}

/* A policy without a limit only counts, for the gauge. */
Test(slot, no_limit_only_counts)
{
    struct exchange a, b;

    fake(&a, 1);
    fake(&b, 1);
    cr_expect_eq(run(&stage_slot, &a, WOKE_FIRST, T0), EXV_NEXT);
    cr_expect_eq(run(&stage_slot, &b, WOKE_FIRST, T0), EXV_NEXT);
    cr_expect_eq(pacing_inflight(pacing_policy(&fx.pacing, -1)), 2);
    give_back(&a);
    give_back(&b);
    cr_expect_eq(pacing_inflight(pacing_policy(&fx.pacing, -1)), 0);
}
