/* proxy/exchange/stage_permit.c: the permit rows driven one by one on a
 * fake clock, on the policies' real pacing state: arrival order, never
 * early, rate_limited at once beyond max_wait, a cooldown that starts while
 * a request waits, the send check, a partition held until the request's
 * end, shadow mode. */
#include "unit/proxy/exchange/fixture.h"

static const char yaml[] =
    "upstreams: { up: { url: http://127.0.0.1:9000 } }\n"
    "policies:\n"
    "  slow: { rate: 1/s, burst: 1, max_wait: 5s }\n"
    "  short: { rate: 1/s, burst: 1, max_wait: 1500ms }\n"
    "  tenants: { rate: 1/s, burst: 1, partition: { header: X-Tenant, max: 1 } }\n"
    "  shadow: { rate: 1/s, burst: 1, max_wait: 1s, mode: shadow }\n"
    "routes:\n"
    "  - { prefix: /slow, upstream: up, policy: slow }\n"
    "  - { prefix: /short, upstream: up, policy: short }\n"
    "  - { prefix: /tenants, upstream: up, policy: tenants }\n"
    "  - { prefix: /shadow, upstream: up, policy: shadow }\n";

static void up(void)
{
    fixture_up(yaml);
}

TestSuite(permit, .init = up, .fini = fixture_down);

static const struct ex_stage *const permit_rows[] = {&stage_permit};

static void done(struct exchange *ex)
{
    release(ex, REL_END, permit_rows, 1);
}

Test(permit, waits_in_arrival_order_and_never_early)
{
    struct exchange a, b;

    fake(&a, 0);
    fake(&b, 0);
    cr_expect_eq(run(&stage_permit, &a, WOKE_FIRST, T0), EXV_NEXT, "the burst of 1");
    cr_expect_eq(run(&stage_permit, &b, WOKE_FIRST, T0), EXV_WAIT);
    cr_expect_eq(b.wake_at, T0 + 1000 * MS, "the next permit, 1 s later");
    /* a timer that fires early is sent back to sleep until the moment */
    cr_expect_eq(run(&stage_permit, &b, WOKE_TIMER, T0 + 999 * MS), EXV_WAIT);
    cr_expect_eq(b.wake_at, T0 + 1000 * MS);
    cr_expect_eq(run(&stage_permit, &b, WOKE_TIMER, T0 + 1000 * MS), EXV_NEXT);
    done(&a);
    done(&b);
}

Test(permit, no_permit_within_max_wait_is_rate_limited_at_once)
{
    struct exchange ex[7];

    for (int i = 0; i < 6; i++) {
        fake(&ex[i], 0);
        cr_assert_neq(run(&stage_permit, &ex[i], WOKE_FIRST, T0), EXV_ANSWER, "%d", i);
    }
    fake(&ex[6], 0);
    cr_assert_eq(run(&stage_permit, &ex[6], WOKE_FIRST, T0), EXV_ANSWER);
    cr_expect_eq(ex[6].outcome, OUT_REQUEUE);
    cr_expect_eq(ex[6].reason, R_RATE_LIMITED);
    cr_expect_eq(ex[6].instr.delay_ms, 6000, "until a permit would exist");
    cr_expect_eq(ex[6].instr.attempt, 0, "nothing sent: no attempt");
    cr_expect(ex[6].rate_headers, "RateLimit headers describe the bucket");
    for (int i = 0; i < 7; i++)
        done(&ex[i]);
}

/* A cooldown that starts while a request waits for its permit: the
 * reservation predates the upstream's 429, so it waits again, past the
 * pause, or is told upstream_cooldown when max_wait cannot cover it. */
Test(permit, a_cooldown_starting_during_the_wait)
{
    struct exchange first, waits, short1, short2;

    fake(&first, 0);
    fake(&waits, 0);
    cr_assert_eq(run(&stage_permit, &first, WOKE_FIRST, T0), EXV_NEXT);
    cr_assert_eq(run(&stage_permit, &waits, WOKE_FIRST, T0), EXV_WAIT);
    bucket_pause(waits.bucket, T0 + 100 * MS, T0 + 3000 * MS, PAUSE_UPSTREAM_429);
    cr_assert_eq(run(&stage_permit, &waits, WOKE_TIMER, T0 + 1000 * MS), EXV_WAIT);
    cr_expect_geq(waits.wake_at, T0 + 3000 * MS, "not inside the pause: %llu",
                  (unsigned long long)(waits.wake_at - T0) / MS);
    cr_expect_eq(run(&stage_permit, &waits, WOKE_TIMER, waits.wake_at), EXV_NEXT);

    fake(&short1, 1);
    fake(&short2, 1);
    cr_assert_eq(run(&stage_permit, &short1, WOKE_FIRST, T0), EXV_NEXT);
    cr_assert_eq(run(&stage_permit, &short2, WOKE_FIRST, T0), EXV_WAIT);
    bucket_pause(short2.bucket, T0 + 100 * MS, T0 + 3000 * MS, PAUSE_UPSTREAM_429);
    cr_assert_eq(run(&stage_permit, &short2, WOKE_TIMER, T0 + 1000 * MS), EXV_ANSWER);
    cr_expect_eq(short2.reason, R_UPSTREAM_COOLDOWN);
    cr_expect_geq(short2.instr.delay_ms, 2000);
    done(&first);
    done(&waits);
    done(&short1);
    done(&short2);
}

/* The send check: the same numbers at the moment of sending. */
Test(permit, the_send_check_holds_late_timers_to_the_rate)
{
    struct exchange a, b, c;

    fake(&a, 0);
    fake(&b, 0);
    cr_assert_eq(run(&stage_permit, &a, WOKE_FIRST, T0), EXV_NEXT);
    cr_assert_eq(run(&stage_send_check, &a, WOKE_FIRST, T0), EXV_NEXT);
    cr_assert_eq(run(&stage_permit, &b, WOKE_FIRST, T0), EXV_WAIT);
    /* b leaves 1 s after a, as its permit says */
    cr_expect_eq(run(&stage_send_check, &b, WOKE_FIRST, T0 + 1000 * MS), EXV_NEXT);
    /* a third one whose timer fired late and together with b's (a starved
     * loop) would leave right behind it: it waits for the send-side bucket */
    fake(&c, 0);
    c.bucket = b.bucket;
    cr_expect_eq(run(&stage_send_check, &c, WOKE_FIRST, T0 + 1200 * MS), EXV_WAIT);
    cr_expect_eq(c.wake_at, T0 + 2000 * MS);
    c.bucket = NULL;
    done(&a);
    done(&b);
}

/* The permit holds the request's partition until the request's end (a 429
 * met late still pauses it): the only one is not another tenant's while
 * held, a new tenant is requeued meanwhile, and takes it once it is back.
 * Released at the answer it is still held; only at the end is it given. */
Test(permit, a_partition_is_held_until_the_request_ends)
{
    struct exchange a, b, c;

    fake(&a, 2);
    fake(&b, 2);
    a.partition = "acme";
    b.partition = "globex";
    cr_assert_eq(run(&stage_permit, &a, WOKE_FIRST, T0), EXV_NEXT);
    cr_expect(a.bucket->partition);
    cr_assert_eq(run(&stage_permit, &b, WOKE_FIRST, T0), EXV_ANSWER);
    cr_expect_eq(b.outcome, OUT_REQUEUE);
    cr_expect_eq(b.reason, R_RATE_LIMITED);
    cr_expect_null(b.bucket);
    done(&b); /* holds nothing: a no-op */
    release(&a, REL_ANSWER, permit_rows, 1);
    cr_expect_not_null(a.bucket, "held past the answer");
    done(&a);
    cr_expect_null(a.bucket);
    fake(&c, 2);
    c.partition = "globex";
    cr_expect_neq(run(&stage_permit, &c, WOKE_FIRST, T0 + 1000 * MS), EXV_ANSWER,
                  "the slot is free again");
    done(&c);
}

/* Shadow mode reserves as enforce would, but never waits or refuses:
 * what enforce would have done is remembered for the metrics. */
Test(permit, shadow_mode_forwards_at_once_and_remembers)
{
    static const struct ex_stage *const rows[] = {&stage_permit_shadow};
    struct exchange ex[3];

    for (int i = 0; i < 3; i++) {
        fake(&ex[i], 3);
        cr_expect_eq(run(&stage_permit_shadow, &ex[i], WOKE_FIRST, T0), EXV_NEXT);
    }
    cr_expect_eq(ex[0].shadow, SHADOW_NONE);
    cr_expect_eq(ex[1].shadow, SHADOW_PERMIT_WAIT);
    cr_expect_eq(ex[2].shadow, SHADOW_RATE_LIMITED, "beyond max_wait");
    for (int i = 0; i < 3; i++)
        release(&ex[i], REL_END, rows, 1);
}

/* The drain deadline meets a request waiting for its permit: requeued with
 * what was left of its wait, spending no attempt. */
Test(permit, the_drain_answer_of_a_waiting_request)
{
    struct exchange a, b;

    fake(&a, 0);
    fake(&b, 0);
    run(&stage_permit, &a, WOKE_FIRST, T0);
    cr_assert_eq(run(&stage_permit, &b, WOKE_FIRST, T0), EXV_WAIT);
    stage_permit.drain(&b, T0 + 500 * MS);
    cr_expect_eq(b.outcome, OUT_REQUEUE);
    cr_expect_eq(b.reason, R_RATE_LIMITED);
    cr_expect_eq(b.instr.delay_ms, 4500, "max_wait's rest");
    cr_expect_eq(b.instr.attempt, 0);
    done(&a);
    done(&b);
}
