/* A lease's verification mark (docs/contract.md §11), the same for every
 * backend: claimed once, completed from a lookup, released, failed, only
 * ever for the lease it was started for. Included by test_store_verify.c
 * (RocksDB) and test_store_redis.c (Redis, so fleet-wide) after they define
 * SCOPE, LEASE, TTL, st, err, t0, VERIFY_FP (a fingerprint) and
 * VERIFY_SUITE (a suite that opens st around each test). A .h, not a .c:
 * tests/CMakeLists.txt makes a test of every .c under unit/. */
#ifndef SLUICE_TESTS_UNIT_STORE_VERIFY_CASES_H
#define SLUICE_TESTS_UNIT_STORE_VERIFY_CASES_H

#include <unistd.h>

#include <event2/event.h>

enum { NONE = 0, PENDING, FOUND, ABSENT, FAILED }; /* enum verify_state */

static uint64_t vtake(const char *key, uint64_t now)
{
    struct store_acquire_out out;

    cr_assert_eq(store_acquire(st, SCOPE, key, VERIFY_FP, now, LEASE, TTL, &out, &err),
                 0, "%s", err.text);
    cr_assert_eq(out.claim, STORE_ACQUIRED);
    return out.lease;
}

static struct store_record vget(const char *key, uint64_t now)
{
    struct store_record rec;

    cr_assert_eq(store_get(st, SCOPE, key, now, &rec, &err), 0, "%s", err.text);
    return rec;
}

Test(VERIFY_SUITE, claim_once_then_found_completes_verified)
{
    uint64_t lease = vtake("k1", t0);
    struct store_header h[] = {{"Content-Type", "application/json"}};
    struct store_acquire_out out;
    struct store_record rec;

    cr_assert_eq(store_verify_claim(st, SCOPE, "k1", lease, t0 + 1, t0 + 9000,
                                    false, &err), 0, "%s", err.text);
    rec = vget("k1", t0 + 2);
    cr_expect_eq(rec.verify, PENDING);
    cr_expect_eq(rec.verify_deadline_ms, t0 + 9000);
    store_record_clear(&rec);
    /* At most one verification of a lease at a time. */
    cr_expect_eq(store_verify_claim(st, SCOPE, "k1", lease, t0 + 3, t0 + 9000,
                                    false, &err), -EALREADY);
    cr_assert_eq(store_verify_found(st, SCOPE, "k1", lease, t0 + 10, TTL, 200, h,
                                    1, (const uint8_t *)"{\"id\":7}", 8, false,
                                    &err), 0, "%s", err.text);
    rec = vget("k1", t0 + 11);
    cr_expect_eq(rec.state, STORE_COMPLETED);
    cr_expect_eq(rec.status, 200);
    cr_expect(rec.verified);
    cr_expect_eq(rec.verify, FOUND);
    cr_expect_eq(rec.attempt, 1, "the lookup adds no attempt");
    cr_expect_eq(rec.completed_ms, t0 + 10);
    cr_expect_eq(rec.expires_ms, t0 + 10 + TTL, "ttl counts from the lookup");
    cr_assert_eq(rec.body_len, 8);
    cr_expect_arr_eq(rec.body, "{\"id\":7}", 8);
    cr_assert_eq(rec.n_headers, 1);
    cr_expect_str_eq(rec.headers[0].value, "application/json");
    store_record_clear(&rec);
    /* A later request is replayed. */
    cr_assert_eq(store_acquire(st, SCOPE, "k1", VERIFY_FP, t0 + 12, LEASE, TTL, &out, &err), 0);
    cr_expect_eq(out.claim, STORE_DONE);
    cr_expect(out.rec.verified);
    store_record_clear(&out.rec);
    /* Done: nothing more to apply. */
    cr_expect_eq(store_verify_absent(st, SCOPE, "k1", lease, t0 + 13, TTL, &err),
                 -EALREADY);
}

Test(VERIFY_SUITE, absent_releases_the_lease_at_once)
{
    uint64_t lease = vtake("k2", t0);
    struct store_acquire_out out;
    struct store_record rec;

    cr_assert_eq(store_verify_claim(st, SCOPE, "k2", lease, t0, t0 + 5000, false,
                                    &err), 0, "%s", err.text);
    cr_assert_eq(store_verify_absent(st, SCOPE, "k2", lease, t0 + 100, TTL, &err),
                 0, "%s", err.text);
    rec = vget("k2", t0 + 101);
    cr_expect_eq(rec.state, STORE_IN_PROGRESS);
    cr_expect_eq(rec.verify, ABSENT);
    cr_expect_eq(rec.lease_expires_ms, t0 + 100, "released now, not at expiry");
    store_record_clear(&rec);
    /* The next request goes as a first request would, attempt count kept,
     * and its new lease carries no mark. */
    cr_assert_eq(store_acquire(st, SCOPE, "k2", VERIFY_FP, t0 + 200, LEASE, TTL, &out, &err), 0);
    cr_expect_eq(out.claim, STORE_ACQUIRED);
    cr_expect_eq(out.attempt, 2);
    rec = vget("k2", t0 + 201);
    cr_expect_eq(rec.verify, NONE);
    store_record_clear(&rec);
}

Test(VERIFY_SUITE, failed_keeps_the_lease_and_is_never_claimed_again)
{
    uint64_t lease = vtake("k3", t0);
    struct store_acquire_out out;
    struct store_record rec;

    cr_assert_eq(store_verify_claim(st, SCOPE, "k3", lease, t0, t0 + 5000, false,
                                    &err), 0);
    cr_assert_eq(store_verify_failed(st, SCOPE, "k3", lease, t0 + 5000, &err), 0,
                 "%s", err.text);
    rec = vget("k3", t0 + 5001);
    cr_expect_eq(rec.verify, FAILED);
    cr_expect_eq(rec.lease_expires_ms, t0 + LEASE, "kept until its expiry");
    store_record_clear(&rec);
    cr_expect_eq(store_verify_claim(st, SCOPE, "k3", lease, t0 + 6000, t0 + 9000,
                                    true, &err), -EALREADY,
                 "a failed verification is not made again, not even at start-up");
    cr_assert_eq(store_acquire(st, SCOPE, "k3", VERIFY_FP, t0 + 6000, LEASE, TTL, &out, &err), 0);
    cr_expect_eq(out.claim, STORE_HELD);
}

Test(VERIFY_SUITE, results_apply_only_to_their_lease)
{
    uint64_t lease = vtake("k4", t0), other;

    cr_expect_eq(store_verify_claim(st, SCOPE, "nope", lease, t0, t0 + 1, false,
                                    &err), -ENOENT);
    cr_expect_eq(store_verify_claim(st, SCOPE, "k4", lease + 1, t0, t0 + 1, false,
                                    &err), -ESTALE);
    cr_assert_eq(store_verify_claim(st, SCOPE, "k4", lease, t0, t0 + 5000, false,
                                    &err), 0);
    /* The lease expires and is taken over: the old verification's answer is
     * dropped, whatever it says. */
    other = vtake("k4", t0 + LEASE);
    cr_expect_neq(other, lease);
    cr_expect_eq(store_verify_found(st, SCOPE, "k4", lease, t0 + LEASE + 1, TTL,
                                    200, NULL, 0, NULL, 0, false, &err), -ESTALE);
    cr_expect_eq(store_verify_absent(st, SCOPE, "k4", lease, t0 + LEASE + 1, TTL,
                                     &err), -ESTALE);
    /* Past its expiry, the lease is not settled by a late answer either. */
    vtake("k5", t0);
    {
        struct store_record rec = vget("k5", t0);
        uint64_t l5 = rec.lease;

        store_record_clear(&rec);
        cr_assert_eq(store_verify_claim(st, SCOPE, "k5", l5, t0, t0 + 5000, false,
                                        &err), 0);
        cr_expect_eq(store_verify_failed(st, SCOPE, "k5", l5, t0 + LEASE, &err),
                     -ESTALE);
    }
    /* Unclaimed: a result needs a pending mark. */
    cr_expect_eq(store_verify_absent(st, SCOPE, "k4", other, t0 + LEASE + 2, TTL,
                                     &err), -EALREADY);
}

Test(VERIFY_SUITE, a_pending_mark_is_claimed_again_at_start_up)
{
    uint64_t lease = vtake("k6", t0);

    cr_assert_eq(store_verify_claim(st, SCOPE, "k6", lease, t0, t0 + 5000, false,
                                    &err), 0);
    cr_expect_eq(store_verify_claim(st, SCOPE, "k6", lease, t0 + 1, t0 + 7000,
                                    false, &err), -EALREADY);
    cr_expect_eq(store_verify_claim(st, SCOPE, "k6", lease, t0 + 1, t0 + 7000,
                                    true, &err), 0, "%s", err.text);
}

/* The same steps as calls on a loop (what a verification makes): RocksDB
 * answers at once, Redis on the loop, never blocking it. */
struct vcall {
    struct store_call c;
    int done;
};

static void vcall_done(struct store_call *c)
{
    ((struct vcall *)c->arg)->done = 1;
}

static struct store_call *vcall(struct vcall *v)
{
    memset(v, 0, sizeof *v);
    v->c.done = vcall_done;
    v->c.arg = v;
    return &v->c;
}

/* The call's result: at once, or once the loop completed it (5 s at most). */
static int vrun(struct event_base *base, struct vcall *v, int rc)
{
    if (rc != -EINPROGRESS)
        return rc;
    for (int i = 0; i < 5000 && !v->done; i++) {
        event_base_loop(base, EVLOOP_NONBLOCK);
        if (!v->done)
            usleep(1000);
    }
    cr_assert(v->done, "the call never completed");
    return v->c.rc;
}

Test(VERIFY_SUITE, each_step_is_also_a_call_on_the_loop)
{
    struct event_base *base = event_base_new();
    uint64_t a = vtake("ka", t0), b = vtake("kb", t0), c = vtake("kc", t0);
    struct store_loop *sl;
    struct store_record rec;
    struct vcall v;

    cr_assert_not_null(base);
    cr_assert_eq(store_loop_new(st, base, &sl, &err), 0, "%s", err.text);
    cr_assert_eq(vrun(base, &v, store_verify_claim_async(sl, vcall(&v), SCOPE, "ka", a,
                                                         t0 + 1, t0 + 9000, false)),
                 0, "%s", v.c.err.text);
    cr_expect_eq(vrun(base, &v, store_verify_claim_async(sl, vcall(&v), SCOPE, "ka", a,
                                                         t0 + 2, t0 + 9000, false)),
                 -EALREADY, "one verification of a lease at a time");
    cr_assert_eq(vrun(base, &v, store_verify_found_async(sl, vcall(&v), SCOPE, "ka", a,
                                                         t0 + 10, TTL, 201, NULL, 0,
                                                         (const uint8_t *)"ok", 2,
                                                         false)),
                 0, "%s", v.c.err.text);
    rec = vget("ka", t0 + 11);
    cr_expect_eq(rec.state, STORE_COMPLETED);
    cr_expect_eq(rec.status, 201);
    cr_expect(rec.verified);
    cr_expect_eq(rec.body_len, 2);
    store_record_clear(&rec);
    cr_assert_eq(vrun(base, &v, store_verify_claim_async(sl, vcall(&v), SCOPE, "kb", b,
                                                         t0, t0 + 5000, false)), 0);
    cr_assert_eq(vrun(base, &v, store_verify_absent_async(sl, vcall(&v), SCOPE, "kb", b,
                                                          t0 + 100, TTL)),
                 0, "%s", v.c.err.text);
    rec = vget("kb", t0 + 101);
    cr_expect_eq(rec.verify, ABSENT);
    cr_expect_eq(rec.lease_expires_ms, t0 + 100);
    store_record_clear(&rec);
    cr_assert_eq(vrun(base, &v, store_verify_claim_async(sl, vcall(&v), SCOPE, "kc", c,
                                                         t0, t0 + 5000, false)), 0);
    cr_assert_eq(vrun(base, &v, store_verify_failed_async(sl, vcall(&v), SCOPE, "kc", c,
                                                          t0 + 5000)),
                 0, "%s", v.c.err.text);
    rec = vget("kc", t0 + 5001);
    cr_expect_eq(rec.verify, FAILED);
    store_record_clear(&rec);
    cr_expect_eq(vrun(base, &v, store_verify_absent_async(sl, vcall(&v), SCOPE, "kc", c + 1,
                                                          t0 + 5002, TTL)),
                 -ESTALE, "another lease's result is dropped");
    store_loop_free(sl);
    event_base_free(base);
}

#endif
