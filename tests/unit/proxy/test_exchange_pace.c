/* proxy/exchange_pace.c: the pacing stages driven one by one, without a
 * process, a socket or a wall clock: a fake exchange on a real policy state,
 * and `now` chosen by the test. What the driver would do with each verdict
 * (arm the timer at wake_at, wake the stage with WOKE_TIMER or WOKE_EVENT)
 * the test does by hand. */
#include <criterion/criterion.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <string.h>

#include "config/config.h"
#include "proxy/exchange.h"
#include "proxy/exchange_internal.h"
#include "proxy/runtime.h"
#include "proxy/server.h"

#define MS 1000000ull
#define T0 (1000ull * 1000 * MS)

static const char yaml[] =
    "upstreams: { up: { url: http://127.0.0.1:9000 } }\n"
    "policies:\n"
    "  slow: { rate: 1/s, burst: 1, max_wait: 5s }\n"
    "  short: { rate: 1/s, burst: 1, max_wait: 1500ms }\n"
    "  one: { concurrency: 1, max_wait: 2s }\n"
    "  tenant: { rate: 1/s, burst: 1, max_wait: 5s, partition: { header: X-T, max: 1 } }\n"
    "routes:\n"
    "  - { prefix: /slow, upstream: up, policy: slow }\n"
    "  - { prefix: /short, upstream: up, policy: short }\n"
    "  - { prefix: /one, upstream: up, policy: one }\n"
    "  - { prefix: /t, upstream: up, policy: tenant }\n";

static struct sc_config *cfg;
static struct runtime rt;
static struct loop w;

static void setup(void)
{
    struct sc_errors errs = {0};

    cr_assert_eq(evthread_use_pthreads(), 0);
    cr_assert_eq(config_load_string("t.yaml", yaml, strlen(yaml), &cfg, &errs), 0);
    sc_errors_free(&errs);
    memset(&rt, 0, sizeof rt);
    rt.cfg = cfg;
    cr_assert_eq(pacing_init(&rt.pacing, cfg, NULL), 0);
    memset(&w, 0, sizeof w);
    exchange_loop_init(&w); /* as loop_init does */
    w.base = event_base_new();
    cr_assert_not_null(w.base);
}

static void teardown(void)
{
    pacing_free(&rt.pacing);
    config_free(cfg);
    event_base_free(w.base);
    exchange_loop_clear(&w);
}

TestSuite(pace, .init = setup, .fini = teardown);

/* A fresh exchange on route r, attempt 1, about to enter stage `state`. */
static void fake(struct exchange *ex, size_t r)
{
    memset(ex, 0, sizeof *ex);
    ex->loop = &w;
    ex->rt = &rt;
    ex->cfg = cfg;
    ex->route = &cfg->routes[r];
    ex->pol = &cfg->policies[ex->route->policy];
    ex->attempt = 1;
    ex->woke = WOKE_FIRST;
}

/* What the exchange's release would free. */
static void done(struct exchange *ex)
{
    if (ex->slot.granted_ev)
        event_free(ex->slot.granted_ev);
    ex->slot.granted_ev = NULL;
}

static enum ex_verdict run(enum ex_verdict (*stage)(struct exchange *, uint64_t),
                           struct exchange *ex, enum ex_woke woke, uint64_t now)
{
    ex->woke = woke;
    ex->wake_at = 0;
    return stage(ex, now);
}

Test(pace, permit_waits_in_arrival_order_and_never_early)
{
    struct exchange a, b;

    fake(&a, 0);
    fake(&b, 0);
    cr_expect_eq(run(stage_permit, &a, WOKE_FIRST, T0), EXV_NEXT, "the burst of 1");
    cr_expect_eq(run(stage_permit, &b, WOKE_FIRST, T0), EXV_WAIT);
    cr_expect_eq(b.wake_at, T0 + 1000 * MS, "the next permit, 1 s later");
    /* a timer that fires early is sent back to sleep until the moment */
    cr_expect_eq(run(stage_permit, &b, WOKE_TIMER, T0 + 999 * MS), EXV_WAIT);
    cr_expect_eq(b.wake_at, T0 + 1000 * MS);
    cr_expect_eq(run(stage_permit, &b, WOKE_TIMER, T0 + 1000 * MS), EXV_NEXT);
}

Test(pace, no_permit_within_max_wait_is_rate_limited_at_once)
{
    struct exchange ex[7];

    for (int i = 0; i < 6; i++) {
        fake(&ex[i], 0);
        cr_assert_neq(run(stage_permit, &ex[i], WOKE_FIRST, T0), EXV_ANSWER, "%d", i);
    }
    fake(&ex[6], 0);
    cr_assert_eq(run(stage_permit, &ex[6], WOKE_FIRST, T0), EXV_ANSWER);
    cr_expect_eq(ex[6].outcome, OUT_REQUEUE);
    cr_expect_eq(ex[6].reason, R_RATE_LIMITED);
    cr_expect_eq(ex[6].instr.delay_ms, 6000, "until a permit would exist");
    cr_expect_eq(ex[6].instr.attempt, 0, "nothing sent: no attempt");
}

/* A cooldown that starts while a request waits for its permit: the
 * reservation predates the upstream's 429, so it waits again, past the
 * pause, or is told upstream_cooldown when max_wait cannot cover it. */
Test(pace, cooldown_starting_during_the_wait)
{
    struct exchange first, waits, short1, short2;

    fake(&first, 0);
    fake(&waits, 0);
    cr_assert_eq(run(stage_permit, &first, WOKE_FIRST, T0), EXV_NEXT);
    cr_assert_eq(run(stage_permit, &waits, WOKE_FIRST, T0), EXV_WAIT);
    bucket_pause(waits.bucket, T0 + 100 * MS, T0 + 3000 * MS, PAUSE_UPSTREAM_429);
    cr_assert_eq(run(stage_permit, &waits, WOKE_TIMER, T0 + 1000 * MS), EXV_WAIT);
    cr_expect_geq(waits.wake_at, T0 + 3000 * MS, "not inside the pause: %llu",
                  (unsigned long long)(waits.wake_at - T0) / MS);
    cr_expect_eq(run(stage_permit, &waits, WOKE_TIMER, waits.wake_at), EXV_NEXT);

    fake(&short1, 1);
    fake(&short2, 1);
    cr_assert_eq(run(stage_permit, &short1, WOKE_FIRST, T0), EXV_NEXT);
    cr_assert_eq(run(stage_permit, &short2, WOKE_FIRST, T0), EXV_WAIT);
    bucket_pause(short2.bucket, T0 + 100 * MS, T0 + 3000 * MS, PAUSE_UPSTREAM_429);
    cr_assert_eq(run(stage_permit, &short2, WOKE_TIMER, T0 + 1000 * MS), EXV_ANSWER);
    cr_expect_eq(short2.reason, R_UPSTREAM_COOLDOWN);
    cr_expect_geq(short2.instr.delay_ms, 2000);
}

Test(pace, slot_granted_or_refused_at_max_wait)
{
    struct exchange a, b, c;

    fake(&a, 2);
    fake(&b, 2);
    fake(&c, 2);
    cr_assert_eq(run(stage_permit, &a, WOKE_FIRST, T0), EXV_NEXT, "no bucket");
    cr_assert_eq(run(stage_slot, &a, WOKE_FIRST, T0), EXV_NEXT);
    cr_expect(a.has_slot);
    cr_assert_eq(run(stage_permit, &b, WOKE_FIRST, T0), EXV_NEXT);
    cr_assert_eq(run(stage_slot, &b, WOKE_FIRST, T0), EXV_WAIT);
    cr_expect_eq(b.wake_at, T0 + 2000 * MS, "woken at max_wait at the latest");
    pace_release_slot(&a); /* hands the slot to b */
    cr_expect_eq(run(stage_slot, &b, WOKE_EVENT, T0 + 10 * MS), EXV_NEXT);
    cr_expect(b.has_slot);
    cr_expect_eq(b.permit_wait_ns, 10 * MS);
    /* c waits, and max_wait passes with b still holding the slot */
    cr_assert_eq(run(stage_permit, &c, WOKE_FIRST, T0), EXV_NEXT);
    cr_assert_eq(run(stage_slot, &c, WOKE_FIRST, T0), EXV_WAIT);
    cr_expect_eq(run(stage_slot, &c, WOKE_TIMER, T0 + 2000 * MS), EXV_ANSWER);
    cr_expect_eq(c.reason, R_RATE_LIMITED);
    cr_expect(!c.has_slot);
    pace_release_slot(&b);
    cr_expect_eq(pacing_inflight(rt.pacing.pol[2]), 0, "every slot came back");
    done(&a);
    done(&b);
    done(&c);
}

/* A grant that races the max_wait timer still counts: the slot is the
 * request's, never lost. */
Test(pace, grant_racing_the_timer_is_kept)
{
    struct exchange a, b;

    fake(&a, 2);
    fake(&b, 2);
    run(stage_permit, &a, WOKE_FIRST, T0);
    run(stage_permit, &b, WOKE_FIRST, T0);
    cr_assert_eq(run(stage_slot, &a, WOKE_FIRST, T0), EXV_NEXT);
    cr_assert_eq(run(stage_slot, &b, WOKE_FIRST, T0), EXV_WAIT);
    pace_release_slot(&a);
    cr_expect_eq(run(stage_slot, &b, WOKE_TIMER, T0 + 2000 * MS), EXV_NEXT);
    cr_expect(b.has_slot);
    pace_release_slot(&b);
    cr_expect_eq(pacing_inflight(rt.pacing.pol[2]), 0);
    done(&a);
    done(&b);
}

/* A worker leaving while queued for a slot: the release path takes it out
 * of the queue, and a slot granted meanwhile goes back. */
Test(pace, leaving_the_slot_queue_gives_everything_back)
{
    struct exchange a, b;

    fake(&a, 2);
    fake(&b, 2);
    run(stage_permit, &a, WOKE_FIRST, T0);
    run(stage_permit, &b, WOKE_FIRST, T0);
    cr_assert_eq(run(stage_slot, &a, WOKE_FIRST, T0), EXV_NEXT);
    cr_assert_eq(run(stage_slot, &b, WOKE_FIRST, T0), EXV_WAIT);
    pace_release_slot(&a); /* granted to b, b not yet woken */
    pace_release_slot(&b); /* b leaves: the slot it was granted goes back */
    cr_expect_eq(pacing_inflight(rt.pacing.pol[2]), 0);
    done(&a);
    done(&b);
}

/* The send check: the same numbers at the moment of sending. */
Test(pace, send_check_holds_late_timers_to_the_rate)
{
    struct exchange a, b;

    fake(&a, 0);
    fake(&b, 0);
    cr_assert_eq(run(stage_permit, &a, WOKE_FIRST, T0), EXV_NEXT);
    cr_assert_eq(run(stage_send_check, &a, WOKE_FIRST, T0), EXV_NEXT);
    cr_assert_eq(run(stage_permit, &b, WOKE_FIRST, T0), EXV_WAIT);
    /* b leaves 1 s after a, as its permit says */
    cr_expect_eq(run(stage_send_check, &b, WOKE_FIRST, T0 + 1000 * MS), EXV_NEXT);
    /* a third one whose timer fired late and together with b's (a starved
     * loop) would leave right behind it: it waits for the send-side bucket */
    struct exchange c;
    fake(&c, 0);
    c.bucket = b.bucket;
    cr_expect_eq(run(stage_send_check, &c, WOKE_FIRST, T0 + 1200 * MS), EXV_WAIT);
    cr_expect_eq(c.wake_at, T0 + 2000 * MS);
}

/* The permit holds the request's partition until the exchange's end (a 429
 * met late still pauses it): the only one is not another tenant's while
 * held, a new tenant is requeued meanwhile, and takes it once it is back. */
Test(pace, a_partition_is_held_until_the_exchange_ends)
{
    struct exchange a, b;

    fake(&a, 3);
    fake(&b, 3);
    a.partition = "acme";
    b.partition = "globex";
    cr_assert_eq(run(stage_permit, &a, WOKE_FIRST, T0), EXV_NEXT);
    cr_expect(a.bucket->partition);
    cr_expect_str_eq(pace_partition(&a), "acme");
    cr_assert_eq(run(stage_permit, &b, WOKE_FIRST, T0), EXV_ANSWER);
    cr_expect_eq(b.outcome, OUT_REQUEUE);
    cr_expect_eq(b.reason, R_RATE_LIMITED);
    cr_expect_null(b.bucket);
    pace_release_bucket(&b); /* holds nothing: a no-op */
    pace_release_bucket(&a);
    cr_expect_null(a.bucket);
    fake(&b, 3);
    b.partition = "globex";
    cr_expect_eq(run(stage_permit, &b, WOKE_FIRST, T0), EXV_WAIT, "evicted: starts empty");
    pace_release_bucket(&b);
}

Test(pace, drain_answer_is_requeue_without_an_attempt)
{
    struct exchange ex;

    fake(&ex, 0);
    ex.wait_deadline_ns = T0 + 4000 * MS;
    pace_drain_answer(&ex, T0);
    cr_expect_eq(ex.outcome, OUT_REQUEUE);
    cr_expect_eq(ex.reason, R_RATE_LIMITED);
    cr_expect_eq(ex.instr.delay_ms, 4000);
    cr_expect_eq(ex.instr.attempt, 0);
}
