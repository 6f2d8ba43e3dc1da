/* The store's behaviour cases (docs/contract.md §6), the same for every
 * backend: included by each backend's test (test_store.c for RocksDB,
 * test_store_redis.c for Redis) after it defines SCOPE, LEASE, TTL, st, err,
 * t0, fp_a, fp_b, reopen() (close the handle and open it again on the same
 * data) and a suite "store" that opens st around each test. A .h, not a
 * .c: tests/CMakeLists.txt makes a test of every .c under unit/. */
#ifndef SLUICE_TESTS_UNIT_STORE_STORE_CASES_H
#define SLUICE_TESTS_UNIT_STORE_STORE_CASES_H

#include <pthread.h>
/* ---- helpers ---- */

static enum store_claim acquire_ex(const char *key, const uint8_t *fp,
                                   uint64_t now, uint64_t lease, uint64_t ttl,
                                   struct store_acquire_out *out)
{
    int rc = store_acquire(st, SCOPE, key, fp, now, lease, ttl, out, &err);

    cr_assert_eq(rc, 0, "store_acquire %s: %d %s", key, rc, err.text);
    return out->claim;
}

static enum store_claim acquire(const char *key, const uint8_t *fp,
                                uint64_t now, struct store_acquire_out *out)
{
    return acquire_ex(key, fp, now, LEASE, TTL, out);
}

/* The new lease's fence. */
static uint64_t expect_acquired(const char *key, const uint8_t *fp, uint64_t now,
                                uint32_t attempt)
{
    struct store_acquire_out out;

    cr_assert_eq(acquire(key, fp, now, &out), STORE_ACQUIRED, "%s", key);
    cr_expect_eq(out.attempt, attempt, "%s attempt %u", key, out.attempt);
    cr_expect_neq(out.lease, 0, "%s: a lease has a fence", key);
    return out.lease;
}

static void expect_claim(const char *key, const uint8_t *fp, uint64_t now,
                         enum store_claim want)
{
    struct store_acquire_out out;

    cr_expect_eq(acquire(key, fp, now, &out), want, "%s", key);
    store_record_clear(&out.rec);
}

static int get(const char *key, uint64_t now, struct store_record *rec)
{
    return store_get(st, SCOPE, key, now, rec, &err);
}

static const uint8_t BIN_BODY[] = {0, 1, 2, 0, 'x', 0xff, 0, 0x7f, 0};

static struct store_header HDRS[] = {
    {"Content-Type", "application/octet-stream"},
    {"X-Request-Id", "r-42"},
    {"X-Empty", ""},
};

static void complete_bin(const char *key, uint64_t now)
{
    int rc = store_complete(st, SCOPE, key, lease_in(st, SCOPE, key), now, TTL, 201, HDRS, 3, BIN_BODY,
                            sizeof BIN_BODY, false, &err);

    cr_assert_eq(rc, 0, "store_complete: %s", err.text);
}

static void expect_bin_result(const struct store_record *r)
{
    cr_expect_eq(r->state, STORE_COMPLETED);
    cr_expect_eq(r->status, 201);
    cr_assert_eq(r->n_headers, 3);
    for (size_t i = 0; i < 3; i++) {
        cr_expect_str_eq(r->headers[i].name, HDRS[i].name);
        cr_expect_str_eq(r->headers[i].value, HDRS[i].value);
    }
    cr_assert_eq(r->body_len, sizeof BIN_BODY);
    cr_expect_arr_eq(r->body, BIN_BODY, sizeof BIN_BODY);
    cr_expect_not(r->body_omitted);
}

/* ---- absent → acquire → held → complete → done → expired ---- */

Test(store, absent_is_enoent)
{
    struct store_record r;

    cr_expect_eq(get("k", t0, &r), -ENOENT);
    cr_expect_null(r.headers);
}

Test(store, first_acquire_writes_attempt_1)
{
    struct store_acquire_out out;
    struct store_record r;

    cr_assert_eq(acquire("k", fp_a, t0, &out), STORE_ACQUIRED);
    cr_expect_eq(out.attempt, 1);
    cr_expect_null(out.rec.headers);
    cr_assert_eq(get("k", t0, &r), 0, "%s", err.text);
    cr_expect_eq(r.state, STORE_IN_PROGRESS);
    cr_expect_eq(r.attempt, 1);
    cr_expect_arr_eq(r.fingerprint, fp_a, STORE_FP_LEN);
    cr_expect_eq(r.created_ms, t0);
    cr_expect_eq(r.lease_expires_ms, t0 + LEASE);
    cr_expect_eq(r.expires_ms, t0 + LEASE + TTL);
    cr_expect_eq(r.n_headers, 0);
    cr_expect_eq(r.body_len, 0);
    store_record_clear(&r);
}

Test(store, second_acquirer_is_held_for_the_remaining_lease)
{
    struct store_acquire_out out;

    expect_acquired("k", fp_a, t0, 1);
    cr_assert_eq(acquire("k", fp_a, t0, &out), STORE_HELD);
    cr_expect_eq(out.remaining_ms, LEASE);
    cr_assert_eq(acquire("k", fp_a, t0 + 10000, &out), STORE_HELD);
    cr_expect_eq(out.remaining_ms, LEASE - 10000);
    cr_assert_eq(acquire("k", fp_a, t0 + LEASE - 1, &out), STORE_HELD);
    cr_expect_eq(out.remaining_ms, 1);
    cr_expect_eq(out.attempt, 0);
}

Test(store, complete_then_get_is_byte_exact)
{
    struct store_record r;

    expect_acquired("k", fp_a, t0, 1);
    complete_bin("k", t0 + 500);
    cr_assert_eq(get("k", t0 + 600, &r), 0, "%s", err.text);
    expect_bin_result(&r);
    cr_expect_eq(r.attempt, 1);
    cr_expect_arr_eq(r.fingerprint, fp_a, STORE_FP_LEN);
    cr_expect_eq(r.created_ms, t0);
    cr_expect_eq(r.completed_ms, t0 + 500);
    cr_expect_eq(r.expires_ms, t0 + 500 + TTL);
    store_record_clear(&r);
}

Test(store, empty_body)
{
    struct store_record r;

    expect_acquired("k", fp_a, t0, 1);
    cr_assert_eq(store_complete(st, SCOPE, "k", lease_in(st, SCOPE, "k"), t0, TTL, 204, NULL, 0, NULL, 0,
                                false, &err), 0, "%s", err.text);
    cr_assert_eq(get("k", t0, &r), 0, "%s", err.text);
    cr_expect_eq(r.status, 204);
    cr_expect_eq(r.n_headers, 0);
    cr_expect_eq(r.body_len, 0);
    cr_expect_not(r.body_omitted);
    store_record_clear(&r);
}

Test(store, body_omitted_keeps_status_and_headers_only)
{
    static const uint8_t big[] = "far too large";
    struct store_record r;

    expect_acquired("k", fp_a, t0, 1);
    cr_assert_eq(store_complete(st, SCOPE, "k", lease_in(st, SCOPE, "k"), t0, TTL, 200, HDRS, 2, big,
                                sizeof big, true, &err), 0, "%s", err.text);
    cr_assert_eq(get("k", t0, &r), 0, "%s", err.text);
    cr_expect_eq(r.status, 200);
    cr_expect_eq(r.n_headers, 2);
    cr_expect(r.body_omitted);
    cr_expect_eq(r.body_len, 0);
    cr_expect_null(r.body);
    store_record_clear(&r);
}

Test(store, acquire_after_complete_is_done_with_the_record)
{
    struct store_acquire_out out;

    expect_acquired("k", fp_a, t0, 1);
    complete_bin("k", t0 + 100);
    cr_assert_eq(acquire("k", fp_a, t0 + 200, &out), STORE_DONE);
    expect_bin_result(&out.rec);
    cr_expect_eq(out.rec.attempt, 1);
    store_record_clear(&out.rec);
}

Test(store, completed_record_expires_after_ttl_then_key_is_new)
{
    struct store_acquire_out out;
    struct store_record r;
    uint64_t done = t0 + 100;

    expect_acquired("k", fp_a, t0, 1);
    complete_bin("k", done);
    cr_assert_eq(acquire("k", fp_a, done + TTL - 1, &out), STORE_DONE);
    store_record_clear(&out.rec);
    cr_expect_eq(get("k", done + TTL - 1, &r), 0);
    store_record_clear(&r);
    cr_expect_eq(get("k", done + TTL, &r), -ENOENT);
    /* An expired record no longer counts: a different request may use the
     * key, and the attempt count starts over. */
    cr_assert_eq(acquire("k", fp_b, done + TTL, &out), STORE_ACQUIRED);
    cr_expect_eq(out.attempt, 1);
    cr_assert_eq(get("k", done + TTL, &r), 0);
    cr_expect_eq(r.created_ms, done + TTL);
    cr_expect_arr_eq(r.fingerprint, fp_b, STORE_FP_LEN);
    store_record_clear(&r);
}

/* ---- release and takeover ---- */

Test(store, release_then_acquire_is_attempt_2)
{
    struct store_record r;

    expect_acquired("k", fp_a, t0, 1);
    cr_assert_eq(store_release(st, SCOPE, "k", 1, lease_in(st, SCOPE, "k"), t0 + 50, TTL, &err), 0, "%s",
                 err.text);
    cr_assert_eq(get("k", t0 + 50, &r), 0);
    cr_expect_eq(r.state, STORE_IN_PROGRESS);
    cr_expect_eq(r.attempt, 1);
    cr_expect_eq(r.lease_expires_ms, t0 + 50);
    cr_expect_eq(r.expires_ms, t0 + 50 + TTL);
    store_record_clear(&r);
    expect_acquired("k", fp_a, t0 + 50, 2);
    expect_claim("k", fp_a, t0 + 60, STORE_HELD);
    cr_assert_eq(get("k", t0 + 60, &r), 0);
    cr_expect_eq(r.created_ms, t0);
    store_record_clear(&r);
}

Test(store, released_count_lasts_ttl)
{
    expect_acquired("k", fp_a, t0, 1);
    cr_assert_eq(store_release(st, SCOPE, "k", 1, lease_in(st, SCOPE, "k"), t0, 1000, &err), 0);
    expect_acquired("k", fp_a, t0 + 999, 2);
    cr_assert_eq(store_release(st, SCOPE, "k", 2, lease_in(st, SCOPE, "k"), t0 + 999, 1000, &err), 0);
    expect_acquired("k", fp_a, t0 + 999 + 1000, 1);
}

Test(store, lapsed_lease_is_taken_over_as_attempt_2)
{
    struct store_record r;

    expect_acquired("k", fp_a, t0, 1);
    expect_claim("k", fp_a, t0 + LEASE - 1, STORE_HELD);
    expect_acquired("k", fp_a, t0 + LEASE, 2);
    cr_assert_eq(get("k", t0 + LEASE, &r), 0);
    cr_expect_eq(r.lease_expires_ms, t0 + 2 * LEASE);
    cr_expect_eq(r.created_ms, t0);
    store_record_clear(&r);
    expect_acquired("k", fp_a, t0 + 5 * LEASE, 3);
}

/* A holder that outlived its lease cannot end its successor's: releasing
 * with the old lease is refused and the successor still holds the key. */
Test(store, late_holder_cannot_release_the_successors_lease)
{
    struct store_acquire_out out;
    uint64_t first = expect_acquired("k", fp_a, t0, 1);
    uint64_t second = expect_acquired("k", fp_a, t0 + LEASE, 2);

    cr_expect_neq(first, second);
    cr_expect_eq(store_release(st, SCOPE, "k", 1, first, t0 + LEASE + 1, TTL, &err), -ESTALE);
    cr_expect(strstr(err.text, "another lease holds it (attempt 2)") != NULL, "%s", err.text);
    cr_expect_eq(acquire("k", fp_a, t0 + LEASE + 2, &out), STORE_HELD);
    cr_expect_eq(store_release(st, SCOPE, "k", 2, second, t0 + LEASE + 3, TTL, &err), 0);
    expect_acquired("k", fp_a, t0 + LEASE + 3, 3);
}

/* Nor complete it: the successor's answer is the one a replay must give
 * (its worker sees it), and the late one's result is refused, the record
 * left in progress for the successor. */
Test(store, late_holder_cannot_complete_the_successors_lease)
{
    struct store_record r;
    uint64_t first = expect_acquired("k", fp_a, t0, 1);
    uint64_t second = expect_acquired("k", fp_a, t0 + LEASE, 2);

    cr_expect_eq(store_complete(st, SCOPE, "k", first, t0 + LEASE + 1, TTL, 500,
                                NULL, 0, NULL, 0, false, &err), -ESTALE);
    cr_expect(strstr(err.text, "another lease holds it (attempt 2)") != NULL, "%s", err.text);
    cr_assert_eq(get("k", t0 + LEASE + 1, &r), 0);
    cr_expect_eq(r.state, STORE_IN_PROGRESS);
    cr_expect_eq(r.lease, second);
    store_record_clear(&r);
    cr_assert_eq(store_complete(st, SCOPE, "k", second, t0 + LEASE + 2, TTL, 201,
                                NULL, 0, NULL, 0, false, &err), 0, "%s", err.text);
    cr_assert_eq(get("k", t0 + LEASE + 2, &r), 0);
    cr_expect_eq(r.status, 201);
    cr_expect_eq(r.attempt, 2);
    store_record_clear(&r);
}

/* An operator forgets a key and a new request takes it again: its attempt
 * count starts over at 1, so only the fence tells the two leases apart. The
 * old holder can neither release nor complete the new lease. */
Test(store, a_forgotten_key_taken_again_is_fenced_from_its_old_holder)
{
    struct store_record r;
    uint64_t old = expect_acquired("k", fp_a, t0, 1), again;

    cr_assert_eq(store_forget(st, SCOPE, "k", &err), 0, "%s", err.text);
    again = expect_acquired("k", fp_a, t0 + 1, 1);
    cr_expect_neq(old, again);
    cr_expect_eq(store_release(st, SCOPE, "k", 1, old, t0 + 2, TTL, &err), -ESTALE);
    cr_expect_eq(store_complete(st, SCOPE, "k", old, t0 + 2, TTL, 200, NULL, 0,
                                NULL, 0, false, &err), -ESTALE);
    expect_claim("k", fp_a, t0 + 3, STORE_HELD);
    cr_assert_eq(get("k", t0 + 3, &r), 0);
    cr_expect_eq(r.state, STORE_IN_PROGRESS);
    cr_expect_eq(r.lease, again);
    store_record_clear(&r);
}

Test(store, in_progress_record_expires_at_lease_plus_ttl)
{
    struct store_record r;

    expect_acquired("k", fp_a, t0, 1);
    cr_expect_eq(get("k", t0 + LEASE + TTL - 1, &r), 0);
    store_record_clear(&r);
    cr_expect_eq(get("k", t0 + LEASE + TTL, &r), -ENOENT);
    expect_acquired("k", fp_a, t0 + LEASE + TTL, 1);
}

Test(store, mismatch_in_every_state)
{
    uint64_t t = t0;

    /* held */
    expect_acquired("k", fp_a, t, 1);
    expect_claim("k", fp_b, t, STORE_MISMATCH);
    /* lapsed lease: still the same request's key */
    t += LEASE;
    expect_claim("k", fp_b, t, STORE_MISMATCH);
    /* released */
    expect_acquired("k", fp_a, t, 2);
    cr_assert_eq(store_release(st, SCOPE, "k", 2, lease_in(st, SCOPE, "k"), t, TTL, &err), 0);
    expect_claim("k", fp_b, t, STORE_MISMATCH);
    /* completed */
    expect_acquired("k", fp_a, t, 3);
    complete_bin("k", t);
    expect_claim("k", fp_b, t + 1, STORE_MISMATCH);
    expect_claim("k", fp_a, t + 1, STORE_DONE);
    /* a mismatch changes nothing */
    {
        struct store_record r;

        cr_assert_eq(get("k", t + 1, &r), 0);
        cr_expect_eq(r.attempt, 3);
        cr_expect_arr_eq(r.fingerprint, fp_a, STORE_FP_LEN);
        store_record_clear(&r);
    }
    /* expired: absent, so no mismatch */
    expect_acquired("k", fp_b, t + TTL, 1);
}

Test(store, scopes_are_apart)
{
    struct store_acquire_out out;

    expect_acquired("k", fp_a, t0, 1);
    cr_assert_eq(store_acquire(st, "other", "k", fp_b, t0, LEASE, TTL, &out,
                               &err), 0);
    cr_expect_eq(out.claim, STORE_ACQUIRED);
    /* Without the separator, ("payments", "k") and ("payment", "sk") would
     * be one key. */
    cr_assert_eq(store_acquire(st, "payment", "sk", fp_b, t0, LEASE, TTL, &out,
                               &err), 0);
    cr_expect_eq(out.claim, STORE_ACQUIRED);
}

/* ---- complete / release / forget edge cases ---- */

Test(store, complete_absent_is_enoent)
{
    cr_expect_eq(store_complete(st, SCOPE, "k", lease_in(st, SCOPE, "k"), t0, TTL, 200, NULL, 0, NULL, 0,
                                false, &err), -ENOENT);
    cr_expect(strstr(err.text, "no live record"), "%s", err.text);
}

Test(store, complete_after_lapsed_lease_without_takeover)
{
    struct store_record r;

    expect_acquired("k", fp_a, t0, 1);
    complete_bin("k", t0 + 2 * LEASE);
    cr_assert_eq(get("k", t0 + 2 * LEASE, &r), 0);
    expect_bin_result(&r);
    store_record_clear(&r);
}

Test(store, first_result_stays)
{
    struct store_record r;

    expect_acquired("k", fp_a, t0, 1);
    complete_bin("k", t0 + 1);
    cr_expect_eq(store_complete(st, SCOPE, "k", lease_in(st, SCOPE, "k"), t0 + 2, TTL, 500, NULL, 0,
                                NULL, 0, false, &err), -EALREADY);
    cr_expect(strstr(err.text, "already completed"), "%s", err.text);
    cr_assert_eq(get("k", t0 + 3, &r), 0);
    expect_bin_result(&r);
    cr_expect_eq(r.completed_ms, t0 + 1);
    store_record_clear(&r);
}

Test(store, release_absent_is_enoent_and_completed_is_kept)
{
    struct store_record r;

    /* -ENOENT is an answer: err is left alone (the proxy logs only
     * failures that carry a message). */
    err.text[0] = '\0';
    cr_expect_eq(store_release(st, SCOPE, "k", 1, lease_in(st, SCOPE, "k"), t0, TTL, &err), -ENOENT);
    cr_expect_str_empty(err.text);
    cr_expect_eq(store_forget(st, SCOPE, "k", &err), -ENOENT);
    cr_expect_str_empty(err.text);
    cr_expect_eq(store_get(st, SCOPE, "k", t0, &r, &err), -ENOENT);
    cr_expect_str_empty(err.text);
    expect_acquired("k", fp_a, t0, 1);
    complete_bin("k", t0);
    cr_expect_eq(store_release(st, SCOPE, "k", 1, lease_in(st, SCOPE, "k"), t0, TTL, &err), -EALREADY);
    cr_assert_eq(get("k", t0, &r), 0);
    expect_bin_result(&r);
    store_record_clear(&r);
}

Test(store, forget)
{
    struct store_record r;

    cr_expect_eq(store_forget(st, SCOPE, "k", &err), -ENOENT);
    expect_acquired("k", fp_a, t0, 1);
    cr_expect_eq(store_forget(st, SCOPE, "k", &err), 0, "%s", err.text);
    cr_expect_eq(get("k", t0, &r), -ENOENT);
    cr_expect_eq(store_forget(st, SCOPE, "k", &err), -ENOENT);
    /* completed records too; the key is new afterwards */
    expect_acquired("k", fp_a, t0, 1);
    complete_bin("k", t0);
    cr_expect_eq(store_forget(st, SCOPE, "k", &err), 0);
    expect_acquired("k", fp_b, t0, 1);
}

Test(store, invalid_keys_are_einval)
{
    struct store_acquire_out out;
    struct store_record r;
    char long_key[300];

    memset(long_key, 'x', sizeof long_key);
    long_key[256] = '\0';
    cr_expect_eq(store_acquire(st, SCOPE, long_key, fp_a, t0, LEASE, TTL, &out,
                               &err), -EINVAL);
    cr_expect_eq(store_acquire(st, SCOPE, "", fp_a, t0, LEASE, TTL, &out,
                               &err), -EINVAL);
    cr_expect_eq(store_get(st, "bad/scope", "k", t0, &r, &err), -EINVAL);
    cr_expect(strstr(err.text, "bad/scope"), "%s", err.text);
    cr_expect_eq(store_release(st, SCOPE, "a\nb", 1, lease_in(st, SCOPE, "a\nb"), t0, TTL, &err), -EINVAL);
    cr_expect_eq(store_forget(st, "", "k", &err), -EINVAL);
    long_key[255] = '\0';
    expect_acquired(long_key, fp_a, t0, 1);
    /* An unquoted Structured-Field string may hold a space. */
    expect_acquired("order 42", fp_a, t0, 1);
}

Test(store, complete_refuses_a_bad_status)
{
    expect_acquired("k", fp_a, t0, 1);
    cr_expect_eq(store_complete(st, SCOPE, "k", lease_in(st, SCOPE, "k"), t0, TTL, 1000, NULL, 0, NULL,
                                0, false, &err), -EINVAL);
    expect_claim("k", fp_a, t0, STORE_HELD);
}

/* ---- durability ---- */

Test(store, reopen_keeps_every_record)
{
    struct store_acquire_out out;
    struct store_record r;

    expect_acquired("held", fp_a, t0, 1);
    expect_acquired("done", fp_a, t0, 1);
    complete_bin("done", t0 + 1);
    expect_acquired("released", fp_a, t0, 1);
    cr_assert_eq(store_release(st, SCOPE, "released", 1, lease_in(st, SCOPE, "released"), t0 + 2, TTL, &err), 0);
    reopen();
    cr_assert_eq(acquire("held", fp_a, t0 + 10, &out), STORE_HELD);
    cr_expect_eq(out.remaining_ms, LEASE - 10);
    cr_assert_eq(acquire("done", fp_a, t0 + 10, &out), STORE_DONE);
    expect_bin_result(&out.rec);
    store_record_clear(&out.rec);
    expect_acquired("released", fp_a, t0 + 10, 2);
    cr_assert_eq(get("held", t0 + 10, &r), 0);
    cr_expect_eq(r.lease_expires_ms, t0 + LEASE);
    store_record_clear(&r);
}

Test(store, close_null)
{
    store_close(NULL);
}

/* ---- pauses ---- */

Test(store, pause_set_get_later_wins_and_expires)
{
    uint64_t until = 0;

    cr_expect_eq(store_pause_get(st, SCOPE, t0, &until, &err), -ENOENT);
    cr_assert_eq(store_pause_set(st, SCOPE, t0, t0 + 5000, &err), 0, "%s", err.text);
    cr_assert_eq(store_pause_get(st, SCOPE, t0 + 1, &until, &err), 0);
    cr_expect_eq(until, t0 + 5000);
    /* An earlier moment never shortens a pause; a later one extends it. */
    cr_assert_eq(store_pause_set(st, SCOPE, t0, t0 + 2000, &err), 0);
    cr_assert_eq(store_pause_get(st, SCOPE, t0 + 1, &until, &err), 0);
    cr_expect_eq(until, t0 + 5000);
    cr_assert_eq(store_pause_set(st, SCOPE, t0, t0 + 9000, &err), 0);
    cr_assert_eq(store_pause_get(st, SCOPE, t0 + 1, &until, &err), 0);
    cr_expect_eq(until, t0 + 9000);
    cr_expect_eq(store_pause_get(st, SCOPE, t0 + 9000, &until, &err), -ENOENT);
    cr_expect_eq(store_pause_get(st, "other", t0, &until, &err), -ENOENT);
    reopen();
    cr_assert_eq(store_pause_get(st, SCOPE, t0 + 1, &until, &err), 0, "lost on reopen");
    cr_expect_eq(until, t0 + 9000);
}

/* An operator ended the pause: a reopened store does not bring it back. */
Test(store, pause_cleared_stays_cleared)
{
    uint64_t until;

    cr_expect_eq(store_pause_clear(st, SCOPE, &err), -ENOENT);
    cr_assert_eq(store_pause_set(st, SCOPE, t0, t0 + 5000, &err), 0, "%s", err.text);
    cr_assert_eq(store_pause_set(st, "other", t0, t0 + 5000, &err), 0, "%s", err.text);
    cr_assert_eq(store_pause_clear(st, SCOPE, &err), 0, "%s", err.text);
    cr_expect_eq(store_pause_get(st, SCOPE, t0 + 1, &until, &err), -ENOENT);
    cr_expect_eq(store_pause_clear(st, SCOPE, &err), -ENOENT);
    cr_expect_eq(store_pause_clear(st, "bad scope", &err), -EINVAL);
    reopen();
    cr_expect_eq(store_pause_get(st, SCOPE, t0 + 1, &until, &err), -ENOENT);
    cr_expect_eq(store_pause_get(st, "other", t0 + 1, &until, &err), 0, "only its own");
}

Test(store, pause_is_apart_from_every_idempotency_key)
{
    struct store_record r;

    cr_assert_eq(store_pause_set(st, SCOPE, t0, t0 + 5000, &err), 0);
    cr_expect_eq(get("pause", t0, &r), -ENOENT);
    cr_expect_eq(get("-", t0, &r), -ENOENT);
    cr_expect_eq(store_forget(st, SCOPE, "pause", &err), -ENOENT);
    cr_expect_eq(store_pause_set(st, "bad scope", t0, t0 + 1, &err), -EINVAL);
}

/* ---- concurrency ---- */

#define RACERS 8

struct race {
    pthread_barrier_t *go;
    const char *key;
    struct store_acquire_out out;
    int rc;
};

static void *racer(void *arg)
{
    struct race *r = arg;
    struct sc_error e;

    pthread_barrier_wait(r->go);
    r->rc = store_acquire(st, SCOPE, r->key, fp_a, t0, LEASE, TTL, &r->out, &e);
    return NULL;
}

Test(store, concurrent_acquirers_exactly_one_wins)
{
    for (int round = 0; round < 50; round++) {
        pthread_barrier_t go;
        pthread_t th[RACERS];
        struct race rs[RACERS];
        char key[32];
        int acquired = 0, held = 0;

        snprintf(key, sizeof key, "race-%d", round);
        pthread_barrier_init(&go, NULL, RACERS);
        for (int i = 0; i < RACERS; i++) {
            rs[i] = (struct race){.go = &go, .key = key};
            cr_assert_eq(pthread_create(&th[i], NULL, racer, &rs[i]), 0);
        }
        for (int i = 0; i < RACERS; i++) {
            pthread_join(th[i], NULL);
            cr_assert_eq(rs[i].rc, 0);
            acquired += rs[i].out.claim == STORE_ACQUIRED;
            held += rs[i].out.claim == STORE_HELD;
        }
        pthread_barrier_destroy(&go);
        cr_assert_eq(acquired, 1, "round %d: %d acquired", round, acquired);
        cr_assert_eq(held, RACERS - 1);
    }
}

#endif
