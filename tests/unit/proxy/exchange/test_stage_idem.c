/* proxy/exchange/stage_idem.c: the key, lookup, lease and commit rows
 * driven one by one on a fake clock, on a real RocksDB store in a temp dir
 * (the one part these rows exist to call): a lease kept on a timeout holds
 * off a duplicate until it expires and is then taken over; a known,
 * retryable result frees the key at once; a completed one is replayed; a
 * request that leaves without a commit frees the key when nothing was
 * sent; a key the request lacks, or a bad one, is refused. */
#include <event2/buffer.h>
#include <stdlib.h>

#include "support/testutil.h"
#include "unit/proxy/exchange/fixture.h"

#define LEASE_MS 300

static const char yaml[] =
    "upstreams: { up: { url: http://127.0.0.1:9000, timeout: 100ms } }\n"
    "policies:\n"
    "  keyed: { idempotency: { lease: 300ms } }\n"
    "  waits: { max_wait: 100ms, idempotency: { lease: 300ms, duplicates: wait } }\n"
    "  verifies:\n"
    "    idempotency: { lease: 30s, verify: { path: \"/v/{key}\", after: 500ms } }\n"
    "routes:\n"
    "  - { prefix: /k, upstream: up, policy: keyed }\n"
    "  - { prefix: /w, upstream: up, policy: waits }\n"
    "  - { prefix: /v, upstream: up, policy: verifies }\n";

static struct store *st;
static char *dir;

static void up(void)
{
    struct sc_error err = {0};

    fixture_up(yaml);
    dir = tu_mkdtemp("idem");
    cr_assert_eq(store_open_rocksdb(dir, false, &st, &err), 0, "%s", err.text);
    cr_assert_eq(store_loop_new(st, fx.env.base, &fx.env.store, &err), 0, "%s", err.text);
}

static void down(void)
{
    store_loop_free(fx.env.store);
    store_close(st);
    tu_rm_rf(dir);
    free(dir);
    fixture_down();
}

TestSuite(idem, .init = up, .fini = down);

static const struct ex_stage *const rows[] = {&stage_key, &stage_lookup, &stage_lease,
                                              &stage_commit};

static void keyed_on(struct exchange *ex, size_t route, const char *key)
{
    fake(ex, route);
    ex->target = route == 0 ? "/k/x" : route == 1 ? "/w/x" : "/v/x";
    ex->key = key;
}

static void keyed(struct exchange *ex, const char *key)
{
    keyed_on(ex, 0, key);
}

/* Arrival: the key, then the store's lookup and the claim. */
static enum ex_verdict arrive(struct exchange *ex)
{
    cr_assert_eq(run(&stage_key, ex, WOKE_FIRST, fx.now.mono_ns), EXV_NEXT,
                 "key: %d %s", ex->status, ex->detail);
    return run(&stage_lookup, ex, WOKE_FIRST, fx.now.mono_ns);
}

/* Arrival and lease, as the driver would run them for a request sent. */
static void send_one(struct exchange *ex)
{
    cr_assert_eq(arrive(ex), EXV_NEXT, "lookup: %d %s", ex->status, ex->detail);
    cr_assert_eq(run(&stage_lease, ex, WOKE_FIRST, fx.now.mono_ns), EXV_NEXT,
                 "lease: %d", ex->status);
    cr_assert(ex->leased);
    ex->sent = true;
}

/* The upstream's result, as the upstream rows leave it. */
static void result(struct exchange *ex, enum up_result r, int status)
{
    ex->ureq.resp.result = r;
    ex->ureq.resp.status = status;
    ex->up_done = true;
    ex->classified = true;
    if (r == UP_OK && status < 400) {
        ex->kind = ANSWER_UPSTREAM;
        ex->status = status;
    } else {
        ex_instruct(ex, OUT_REQUEUE, r == UP_TIMEOUT ? R_TIMEOUT : R_UPSTREAM_5XX,
                    1000, ex->attempt, status);
    }
}

/* What the driver gives back once the answer is out, and at the end. */
static void finish(struct exchange *ex)
{
    ex_store_cancel(ex);
    release(ex, REL_ANSWER, rows, 4);
    release(ex, REL_END, rows, 4);
    if (ex->scall)
        freelist_give(&fx.calls, ex->scall);
    ex->scall = NULL;
    up_response_clear(&ex->ureq.resp);
    store_record_clear(&ex->replay);
}

static void advance_ms(uint64_t ms)
{
    fx.now.mono_ns += ms * MS;
    fx.now.wall_ms += ms;
}

Test(idem, a_lease_kept_on_a_timeout_holds_then_is_taken_over)
{
    struct exchange first, dup, later;

    keyed(&first, "k-timeout");
    send_one(&first);
    result(&first, UP_TIMEOUT, 0);
    cr_assert_eq(run(&stage_commit, &first, WOKE_FIRST, fx.now.mono_ns), EXV_NEXT);
    cr_expect(first.settled);
    cr_expect_geq(first.instr.delay_ms, LEASE_MS, "the job waits out the lease");
    finish(&first);

    keyed(&dup, "k-timeout");
    cr_assert_eq(arrive(&dup), EXV_ANSWER, "the lease holds off a duplicate");
    cr_expect_eq(dup.reason, R_LEASE_HELD);
    cr_expect_eq(dup.instr.attempt, 1, "one attempt so far");
    cr_expect_leq(dup.instr.delay_ms, LEASE_MS);
    finish(&dup);

    advance_ms(LEASE_MS + 1); /* the fake clock: no sleeping */
    keyed(&later, "k-timeout");
    send_one(&later);
    cr_expect_eq(later.attempt, 2, "the store counts the attempts");
    finish(&later);
}

Test(idem, a_known_retryable_result_frees_the_key_at_once)
{
    struct exchange first, retry;

    keyed(&first, "k-503");
    send_one(&first);
    result(&first, UP_OK, 503);
    cr_assert_eq(run(&stage_commit, &first, WOKE_FIRST, fx.now.mono_ns), EXV_NEXT);
    cr_expect_eq(first.commit, COMMIT_RELEASE);
    finish(&first);

    keyed(&retry, "k-503");
    send_one(&retry); /* no lease_held: it may go at once */
    cr_expect_eq(retry.attempt, 2);
    finish(&retry);
}

Test(idem, a_completed_result_is_replayed)
{
    struct exchange first, dup;

    keyed(&first, "k-ok");
    send_one(&first);
    first.ureq.resp.body = evbuffer_new();
    evbuffer_add(first.ureq.resp.body, "done", 4);
    result(&first, UP_OK, 201);
    cr_assert_eq(run(&stage_commit, &first, WOKE_FIRST, fx.now.mono_ns), EXV_NEXT);
    cr_expect_eq(first.commit, COMMIT_COMPLETE);
    finish(&first);

    advance_ms(10);
    keyed(&dup, "k-ok");
    cr_assert_eq(arrive(&dup), EXV_ANSWER);
    cr_expect_eq(dup.kind, ANSWER_REPLAY);
    cr_expect_eq(dup.replay.status, 201);
    cr_expect_eq(dup.replay.body_len, 4);
    finish(&dup);
}

/* A concurrent duplicate meets the first one's in-memory claim while that
 * waits for its permit; a request that leaves before anything was sent
 * (the worker gone) frees the key for the next. */
Test(idem, a_claim_then_leaving_unsent_frees_the_key)
{
    struct exchange first, dup, next;

    keyed(&first, "k-left");
    cr_assert_eq(arrive(&first), EXV_NEXT);
    keyed(&dup, "k-left");
    cr_expect_eq(arrive(&dup), EXV_ANSWER);
    cr_expect_eq(dup.reason, R_LEASE_HELD);
    finish(&dup);
    cr_assert_eq(run(&stage_lease, &first, WOKE_FIRST, fx.now.mono_ns), EXV_NEXT);
    finish(&first); /* left without a commit, nothing sent */
    cr_expect_eq(atomic_load(&fx.leases), 0);

    keyed(&next, "k-left");
    send_one(&next);
    finish(&next);
}

/* A keyed plan runs the key row first: a missing key where it is required,
 * or one that is not a valid key, is refused before anything else. */
Test(idem, a_missing_or_bad_key_is_refused)
{
    struct exchange none, bad;

    keyed(&none, NULL);
    cr_expect_eq(run(&stage_key, &none, WOKE_FIRST, T0), EXV_ANSWER);
    cr_expect_eq(none.status, 400);
    cr_expect(strstr(none.detail, "needs an Idempotency-Key header"), "%s", none.detail);
    keyed(&bad, "");
    cr_expect_eq(run(&stage_key, &bad, WOKE_FIRST, T0), EXV_ANSWER);
    cr_expect_eq(bad.status, 400);
    cr_expect_eq(bad.reason, R_MALFORMED_REQUEST);
}

/* Another request's key: 422, nothing taken. */
Test(idem, the_same_key_for_another_request_is_refused)
{
    struct exchange first, other;

    keyed(&first, "k-reuse");
    send_one(&first);
    first.ureq.resp.body = evbuffer_new();
    result(&first, UP_OK, 200);
    run(&stage_commit, &first, WOKE_FIRST, fx.now.mono_ns);
    finish(&first);
    keyed(&other, "k-reuse");
    other.target = "/k/other";
    cr_expect_eq(arrive(&other), EXV_ANSWER);
    cr_expect_eq(other.status, 422);
    cr_expect_eq(other.reason, R_KEY_REUSED);
    finish(&other);
}

/* ---- duplicates: wait (contract §6) ---------------------------------------- */

Test(idem, a_waiting_duplicate_looks_again_and_gets_the_holders_replay)
{
    struct exchange first, dup;
    uint64_t t0 = fx.now.mono_ns;

    keyed_on(&first, 1, "w-replay");
    send_one(&first);
    keyed_on(&dup, 1, "w-replay");
    cr_assert_eq(arrive(&dup), EXV_WAIT, "it waits instead of lease_held");
    cr_expect_eq(dup.wake_at, t0 + 2 * MS, "first look again after 2 ms");
    cr_expect_eq(dup.kind, ANSWER_PROBLEM, "no answer decided yet");
    cr_assert_eq(run(&stage_lookup, &dup, WOKE_TIMER, t0 + 2 * MS), EXV_WAIT);
    cr_expect_eq(dup.wake_at, t0 + 6 * MS, "then twice as long");

    first.ureq.resp.body = evbuffer_new();
    evbuffer_add(first.ureq.resp.body, "done", 4);
    result(&first, UP_OK, 201);
    cr_assert_eq(run(&stage_commit, &first, WOKE_FIRST, t0 + 5 * MS), EXV_NEXT);
    finish(&first);

    cr_assert_eq(run(&stage_lookup, &dup, WOKE_TIMER, t0 + 6 * MS), EXV_ANSWER);
    cr_expect_eq(dup.kind, ANSWER_REPLAY);
    cr_expect_eq(dup.replay.status, 201);
    finish(&dup);
}

Test(idem, a_waiting_duplicate_gets_lease_held_at_max_wait)
{
    struct exchange first, dup;
    uint64_t t0 = fx.now.mono_ns, gap = 0, prev = t0;
    enum ex_verdict v;
    int looks = 1;

    keyed_on(&first, 1, "w-slow");
    send_one(&first);
    keyed_on(&dup, 1, "w-slow");
    v = arrive(&dup);
    while (v == EXV_WAIT) {
        cr_assert_gt(dup.wake_at, prev);
        gap = dup.wake_at - prev;
        cr_expect_leq(gap, 25 * MS, "looks at most 25 ms apart");
        prev = dup.wake_at;
        v = run(&stage_lookup, &dup, WOKE_TIMER, dup.wake_at);
        looks++;
        cr_assert_lt(looks, 50);
    }
    cr_expect_eq(v, EXV_ANSWER);
    cr_expect_eq(dup.reason, R_LEASE_HELD);
    cr_expect_eq(prev, t0 + 100 * MS, "the last look is at max_wait");
    cr_expect_leq(looks, 10, "2, 4, 8, 16, then 25 ms apart: %d looks", looks);
    finish(&dup);
    finish(&first);
}

Test(idem, a_waiting_duplicate_goes_on_when_the_holder_frees_the_key)
{
    struct exchange first, dup;
    uint64_t t0 = fx.now.mono_ns;

    keyed_on(&first, 1, "w-free");
    send_one(&first);
    keyed_on(&dup, 1, "w-free");
    cr_assert_eq(arrive(&dup), EXV_WAIT);
    result(&first, UP_OK, 503);
    cr_assert_eq(run(&stage_commit, &first, WOKE_FIRST, t0 + 1 * MS), EXV_NEXT);
    cr_expect_eq(first.commit, COMMIT_RELEASE);
    finish(&first);
    cr_assert_eq(run(&stage_lookup, &dup, WOKE_TIMER, t0 + 2 * MS), EXV_NEXT,
                 "free: on as a first request");
    cr_assert_eq(run(&stage_lease, &dup, WOKE_FIRST, t0 + 2 * MS), EXV_NEXT);
    cr_expect_eq(dup.attempt, 2);
    finish(&dup);
}

/* ---- verify (contract §11): the commit of an unknown outcome --------------- */

static uint64_t fake_deadline;
static int begun;

static uint64_t fake_verify_begin(void *arg, struct exchange *ex)
{
    begun++;
    return fake_deadline;
}

Test(idem, an_unknown_outcome_that_starts_a_verification_is_requeued_for_d)
{
    struct exchange first, dup;

    fx.env.verify_begin = fake_verify_begin;
    fake_deadline = fx.now.wall_ms + 1500;
    keyed_on(&first, 2, "v-1");
    send_one(&first);
    result(&first, UP_TIMEOUT, 0);
    cr_assert_eq(run(&stage_commit, &first, WOKE_FIRST, fx.now.mono_ns), EXV_NEXT);
    cr_expect_eq(begun, 1);
    cr_expect(first.instr.verify_pending);
    cr_expect_eq(first.instr.delay_ms, 1500, "D, not the 30 s lease");
    finish(&first);

    /* Not started (the store refused the claim): the lease, as without. */
    fake_deadline = 0;
    keyed_on(&dup, 2, "v-2");
    send_one(&dup);
    result(&dup, UP_TIMEOUT, 0);
    cr_assert_eq(run(&stage_commit, &dup, WOKE_FIRST, fx.now.mono_ns), EXV_NEXT);
    cr_expect_not(dup.instr.verify_pending);
    cr_expect_geq(dup.instr.delay_ms, 30000);
    finish(&dup);
    fx.env.verify_begin = NULL;
}

Test(idem, a_policy_without_verify_never_starts_one)
{
    struct exchange first;

    fx.env.verify_begin = fake_verify_begin;
    begun = 0;
    fake_deadline = fx.now.wall_ms + 1500;
    keyed(&first, "nv-1");
    send_one(&first);
    result(&first, UP_TIMEOUT, 0);
    cr_assert_eq(run(&stage_commit, &first, WOKE_FIRST, fx.now.mono_ns), EXV_NEXT);
    cr_expect_eq(begun, 0);
    cr_expect_not(first.instr.verify_pending);
    finish(&first);
    fx.env.verify_begin = NULL;
}
