/* A lease's verification mark in the RocksDB store (docs/contract.md §11):
 * claimed once, completed from a lookup, released, failed, only ever for
 * the lease it was started for; and the leases in progress listed for
 * start-up. A real RocksDB in a temp dir, a fake clock from the real one. */
#include <criterion/criterion.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/store.h"
#include "support/testutil.h"
#include "util/clock.h"

#define SCOPE "payments"
#define LEASE 60000ull
#define TTL 86400000ull

enum { NONE = 0, PENDING, FOUND, ABSENT, FAILED }; /* enum verify_state */

static char *dir;
static struct store *st;
static struct sc_error err;
static uint64_t t0;
static uint8_t fp[STORE_FP_LEN];

static void setup(void)
{
    dir = tu_mkdtemp("store-verify");
    cr_assert_not_null(dir);
    t0 = clock_wall_ms();
    memset(fp, 0xaa, sizeof fp);
    cr_assert_eq(store_open_rocksdb(dir, false, &st, &err), 0, "%s", err.text);
}

static void teardown(void)
{
    store_close(st);
    tu_rm_rf(dir);
    free(dir);
}

TestSuite(verify_store, .init = setup, .fini = teardown);

static uint64_t take(const char *key, uint64_t now)
{
    struct store_acquire_out out;

    cr_assert_eq(store_acquire(st, SCOPE, key, fp, now, LEASE, TTL, &out, &err),
                 0, "%s", err.text);
    cr_assert_eq(out.claim, STORE_ACQUIRED);
    return out.lease;
}

static struct store_record get(const char *key, uint64_t now)
{
    struct store_record rec;

    cr_assert_eq(store_get(st, SCOPE, key, now, &rec, &err), 0, "%s", err.text);
    return rec;
}

Test(verify_store, claim_once_then_found_completes_verified)
{
    uint64_t lease = take("k1", t0);
    struct store_header h[] = {{"Content-Type", "application/json"}};
    struct store_acquire_out out;
    struct store_record rec;

    cr_assert_eq(store_verify_claim(st, SCOPE, "k1", lease, t0 + 1, t0 + 9000,
                                    false, &err), 0, "%s", err.text);
    rec = get("k1", t0 + 2);
    cr_expect_eq(rec.verify, PENDING);
    cr_expect_eq(rec.verify_deadline_ms, t0 + 9000);
    store_record_clear(&rec);
    /* At most one verification of a lease at a time. */
    cr_expect_eq(store_verify_claim(st, SCOPE, "k1", lease, t0 + 3, t0 + 9000,
                                    false, &err), -EALREADY);
    cr_assert_eq(store_verify_found(st, SCOPE, "k1", lease, t0 + 10, TTL, 200, h,
                                    1, (const uint8_t *)"{\"id\":7}", 8, false,
                                    &err), 0, "%s", err.text);
    rec = get("k1", t0 + 11);
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
    cr_assert_eq(store_acquire(st, SCOPE, "k1", fp, t0 + 12, LEASE, TTL, &out, &err), 0);
    cr_expect_eq(out.claim, STORE_DONE);
    cr_expect(out.rec.verified);
    store_record_clear(&out.rec);
    /* Done: nothing more to apply. */
    cr_expect_eq(store_verify_absent(st, SCOPE, "k1", lease, t0 + 13, TTL, &err),
                 -EALREADY);
}

Test(verify_store, absent_releases_the_lease_at_once)
{
    uint64_t lease = take("k2", t0);
    struct store_acquire_out out;
    struct store_record rec;

    cr_assert_eq(store_verify_claim(st, SCOPE, "k2", lease, t0, t0 + 5000, false,
                                    &err), 0, "%s", err.text);
    cr_assert_eq(store_verify_absent(st, SCOPE, "k2", lease, t0 + 100, TTL, &err),
                 0, "%s", err.text);
    rec = get("k2", t0 + 101);
    cr_expect_eq(rec.state, STORE_IN_PROGRESS);
    cr_expect_eq(rec.verify, ABSENT);
    cr_expect_eq(rec.lease_expires_ms, t0 + 100, "released now, not at expiry");
    store_record_clear(&rec);
    /* The next request goes as a first request would, attempt count kept,
     * and its new lease carries no mark. */
    cr_assert_eq(store_acquire(st, SCOPE, "k2", fp, t0 + 200, LEASE, TTL, &out, &err), 0);
    cr_expect_eq(out.claim, STORE_ACQUIRED);
    cr_expect_eq(out.attempt, 2);
    rec = get("k2", t0 + 201);
    cr_expect_eq(rec.verify, NONE);
    store_record_clear(&rec);
}

Test(verify_store, failed_keeps_the_lease_and_is_never_claimed_again)
{
    uint64_t lease = take("k3", t0);
    struct store_acquire_out out;
    struct store_record rec;

    cr_assert_eq(store_verify_claim(st, SCOPE, "k3", lease, t0, t0 + 5000, false,
                                    &err), 0);
    cr_assert_eq(store_verify_failed(st, SCOPE, "k3", lease, t0 + 5000, &err), 0,
                 "%s", err.text);
    rec = get("k3", t0 + 5001);
    cr_expect_eq(rec.verify, FAILED);
    cr_expect_eq(rec.lease_expires_ms, t0 + LEASE, "kept until its expiry");
    store_record_clear(&rec);
    cr_expect_eq(store_verify_claim(st, SCOPE, "k3", lease, t0 + 6000, t0 + 9000,
                                    true, &err), -EALREADY,
                 "a failed verification is not made again, not even at start-up");
    cr_assert_eq(store_acquire(st, SCOPE, "k3", fp, t0 + 6000, LEASE, TTL, &out, &err), 0);
    cr_expect_eq(out.claim, STORE_HELD);
}

Test(verify_store, results_apply_only_to_their_lease)
{
    uint64_t lease = take("k4", t0), other;

    cr_expect_eq(store_verify_claim(st, SCOPE, "nope", lease, t0, t0 + 1, false,
                                    &err), -ENOENT);
    cr_expect_eq(store_verify_claim(st, SCOPE, "k4", lease + 1, t0, t0 + 1, false,
                                    &err), -ESTALE);
    cr_assert_eq(store_verify_claim(st, SCOPE, "k4", lease, t0, t0 + 5000, false,
                                    &err), 0);
    /* The lease expires and is taken over: the old verification's answer is
     * dropped, whatever it says. */
    other = take("k4", t0 + LEASE);
    cr_expect_neq(other, lease);
    cr_expect_eq(store_verify_found(st, SCOPE, "k4", lease, t0 + LEASE + 1, TTL,
                                    200, NULL, 0, NULL, 0, false, &err), -ESTALE);
    cr_expect_eq(store_verify_absent(st, SCOPE, "k4", lease, t0 + LEASE + 1, TTL,
                                     &err), -ESTALE);
    /* Past its expiry, the lease is not settled by a late answer either. */
    take("k5", t0);
    {
        struct store_record rec = get("k5", t0);
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

Test(verify_store, a_pending_mark_is_claimed_again_at_start_up)
{
    uint64_t lease = take("k6", t0);

    cr_assert_eq(store_verify_claim(st, SCOPE, "k6", lease, t0, t0 + 5000, false,
                                    &err), 0);
    cr_expect_eq(store_verify_claim(st, SCOPE, "k6", lease, t0 + 1, t0 + 7000,
                                    false, &err), -EALREADY);
    cr_expect_eq(store_verify_claim(st, SCOPE, "k6", lease, t0 + 1, t0 + 7000,
                                    true, &err), 0, "%s", err.text);
}

struct seen {
    int n;
    char keys[8][32];
    uint8_t marks[8];
};

static int collect(void *arg, const char *scope, const char *key,
                   const struct store_record *rec)
{
    struct seen *s = arg;

    cr_expect_str_eq(scope, SCOPE);
    if (s->n < 8) {
        snprintf(s->keys[s->n], sizeof s->keys[0], "%s", key);
        s->marks[s->n] = rec->verify;
    }
    s->n++;
    return 0;
}

Test(verify_store, leases_each_lists_only_leases_in_progress)
{
    struct store_acquire_out out;
    struct seen s = {0};
    uint64_t l;

    take("live-a", t0);
    l = take("live-b", t0);
    cr_assert_eq(store_verify_claim(st, SCOPE, "live-b", l, t0, t0 + 5000, false,
                                    &err), 0);
    l = take("done", t0);
    cr_assert_eq(store_complete(st, SCOPE, "done", l, t0, TTL, 200, NULL, 0, NULL,
                                0, false, &err), 0);
    l = take("released", t0);
    cr_assert_eq(store_release(st, SCOPE, "released", 1, l, t0, TTL, &err), 0);
    cr_assert_eq(store_acquire(st, SCOPE, "short", fp, t0, 10, TTL, &out, &err), 0);
    cr_assert_eq(store_pause_set(st, SCOPE, t0, t0 + LEASE, &err), 0);
    cr_assert_eq(store_leases_each(st, t0 + 100, collect, &s, &err), 0, "%s",
                 err.text);
    cr_assert_eq(s.n, 2, "the two live leases, not the completed, released, "
                 "expired ones nor the pause (%d)", s.n);
    cr_expect_str_eq(s.keys[0], "live-a");
    cr_expect_eq(s.marks[0], NONE);
    cr_expect_str_eq(s.keys[1], "live-b");
    cr_expect_eq(s.marks[1], PENDING);
}

Test(verify_store, marks_survive_a_reopen)
{
    uint64_t lease = take("k7", t0);
    struct store_record rec;

    cr_assert_eq(store_verify_claim(st, SCOPE, "k7", lease, t0, t0 + 5000, false,
                                    &err), 0);
    store_close(st);
    cr_assert_eq(store_open_rocksdb(dir, false, &st, &err), 0, "%s", err.text);
    rec = get("k7", t0 + 1);
    cr_expect_eq(rec.verify, PENDING);
    store_record_clear(&rec);
}
