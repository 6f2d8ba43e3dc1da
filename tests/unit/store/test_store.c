/* The idempotency store (docs/contract.md §6) on a real RocksDB in a temp dir,
 * driven by a fake clock. The clock starts at the real wall clock so the
 * expiry compaction filter (which reads the real one) keeps live records. */
#include <criterion/criterion.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <rocksdb/c.h>

#include "store/record.h"
#include "store/store.h"
#include "store/store_rocksdb_internal.h"
#include "support/testutil.h"
#include "unit/store/lease.h"
#include "unit/store/blob.h"
#include "util/clock.h"

#define SCOPE "payments"
#define LEASE 60000ull     /* 1 min */
#define TTL 86400000ull    /* 24 h */

static char *dir;
static struct store *st;
static struct sc_error err;
static uint64_t t0;
static uint8_t fp_a[STORE_FP_LEN], fp_b[STORE_FP_LEN];

static void open_store(bool sync)
{
    int rc = store_open_rocksdb(dir, sync, &st, &err);

    cr_assert_eq(rc, 0, "store_open: %s", err.text);
}

static void reopen(void)
{
    store_close(st);
    st = NULL;
    open_store(false);
}

static void setup(void)
{
    dir = tu_mkdtemp("store");
    cr_assert_not_null(dir);
    t0 = clock_wall_ms();
    memset(fp_a, 0xaa, sizeof fp_a);
    memset(fp_b, 0xbb, sizeof fp_b);
    open_store(false);
}

static void teardown(void)
{
    store_close(st);
    st = NULL;
    tu_rm_rf(dir);
    free(dir);
}

TestSuite(store, .init = setup, .fini = teardown);

#include "unit/store/store_cases.h"

/* ---- RocksDB only: durability ---- */

Test(store, reopen_after_many_writes)
{
    char key[32];

    /* Enough to spill the 4 MiB write buffer into table files. */
    static uint8_t body[16384];
    for (size_t i = 0; i < sizeof body; i++)
        body[i] = (uint8_t)(i * 31);
    for (int i = 0; i < 400; i++) {
        snprintf(key, sizeof key, "k%04d", i);
        expect_acquired(key, fp_a, t0, 1);
        cr_assert_eq(store_complete(st, SCOPE, key, lease_in(st, SCOPE, key), t0, TTL, 200, NULL, 0,
                                    body, sizeof body, false, &err), 0);
    }
    reopen();
    for (int i = 0; i < 400; i += 7) {
        struct store_record r;

        snprintf(key, sizeof key, "k%04d", i);
        cr_assert_eq(get(key, t0, &r), 0, "%s: %s", key, err.text);
        cr_assert_eq(r.body_len, sizeof body);
        cr_expect_arr_eq(r.body, body, sizeof body);
        store_record_clear(&r);
    }
}

Test(store, sync_mode)
{
    struct store_record r;

    store_close(st);
    st = NULL;
    open_store(true);
    expect_acquired("k", fp_a, t0, 1);
    complete_bin("k", t0);
    cr_assert_eq(get("k", t0, &r), 0);
    expect_bin_result(&r);
    store_record_clear(&r);
    cr_expect_eq(store_forget(st, SCOPE, "k", &err), 0);
    expect_acquired("k", fp_a, t0, 1);
    store_close(st);
    st = NULL;
    open_store(true);
    expect_claim("k", fp_a, t0, STORE_HELD);
}

Test(store, second_open_in_this_process_fails_clearly)
{
    struct store *again = (struct store *)1;
    int rc = store_open_rocksdb(dir, false, &again, &err);

    cr_expect_eq(rc, -EBUSY, "%d %s", rc, err.text);
    cr_expect_null(again);
    cr_expect(strstr(err.text, dir), "%s", err.text);
    cr_expect(strstr(err.text, "in use by this process already"), "%s",
              err.text);
    /* the first handle still works */
    expect_acquired("k", fp_a, t0, 1);
}

Test(store, open_refuses_an_empty_path)
{
    struct store *s;

    cr_expect_eq(store_open_rocksdb("", false, &s, &err), -EINVAL);
    cr_expect_null(s);
}

Test(store, open_failure_names_the_path)
{
    struct store *s;
    char *file = tu_write_file(dir, "plain", "x");

    /* A regular file where the directory should be. */
    cr_expect_lt(store_open_rocksdb(file, false, &s, &err), 0);
    cr_expect_null(s);
    cr_expect(strstr(err.text, file), "%s", err.text);
    free(file);
}


/* A child process holds the store; this one (which has not touched RocksDB
 * before forking, so the child inherits no RocksDB threads) must be
 * refused. */
Test(store_lock, second_open_in_another_process_fails_clearly)
{
    char *path = tu_mkdtemp("store-lock");
    int ready[2], done[2];
    struct store *s;
    char c = 0;
    pid_t pid;
    int status, rc;

    cr_assert_not_null(path);
    cr_assert_eq(pipe(ready), 0);
    cr_assert_eq(pipe(done), 0);
    pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        struct sc_error e;
        struct store *held;

        c = store_open_rocksdb(path, false, &held, &e) == 0 ? 'y' : 'n';
        if (write(ready[1], &c, 1) != 1 || read(done[0], &c, 1) != 1)
            _exit(2);
        store_close(held);
        _exit(0);
    }
    cr_assert_eq(read(ready[0], &c, 1), 1);
    cr_assert_eq(c, 'y', "the child could not open the store");
    rc = store_open_rocksdb(path, false, &s, &err);
    cr_expect_eq(rc, -EBUSY, "%d %s", rc, err.text);
    cr_expect(strstr(err.text, "in use by another process"), "%s", err.text);
    cr_expect(strstr(err.text, path), "%s", err.text);
    cr_assert_eq(write(done[1], &c, 1), 1);
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    /* released with the child */
    cr_assert_eq(store_open_rocksdb(path, false, &s, &err), 0, "%s", err.text);
    store_close(s);
    tu_rm_rf(path);
    free(path);
}

/* ---- raw database access ---- */

/* Writes a raw value under (SCOPE, key) with the store shut, as an older
 * release or a damaged disk would have left it. */
static void raw_put(const char *key, const void *val, size_t len)
{
    rocksdb_options_t *o = rocksdb_options_create();
    rocksdb_writeoptions_t *wo = rocksdb_writeoptions_create();
    struct record_key k;
    char *msg = NULL;
    rocksdb_t *db;

    store_close(st);
    st = NULL;
    db = rocksdb_open(o, dir, &msg);
    cr_assert_null(msg, "%s", msg);
    cr_assert_eq(record_key_make(&k, SCOPE, key, &err), 0);
    rocksdb_put(db, wo, k.buf, k.len, val, len, &msg);
    cr_assert_null(msg, "%s", msg);
    rocksdb_close(db);
    rocksdb_writeoptions_destroy(wo);
    rocksdb_options_destroy(o);
    open_store(false);
}

/* The first byte of the raw value stored under (SCOPE, key). */
static int raw_version(const char *key)
{
    rocksdb_options_t *o = rocksdb_options_create();
    rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
    struct record_key k;
    char *msg = NULL, *val;
    rocksdb_t *db;
    size_t len;
    int v;

    store_close(st);
    st = NULL;
    db = rocksdb_open(o, dir, &msg);
    cr_assert_null(msg, "%s", msg);
    cr_assert_eq(record_key_make(&k, SCOPE, key, &err), 0);
    val = rocksdb_get(db, ro, k.buf, k.len, &len, &msg);
    cr_assert_not_null(val);
    v = (unsigned char)val[0];
    rocksdb_free(val);
    rocksdb_close(db);
    rocksdb_readoptions_destroy(ro);
    rocksdb_options_destroy(o);
    open_store(false);
    return v;
}

/* ---- expiry reclaim ---- */

static void make_sweep_set(int n)
{
    char key[32];

    /* Even keys expire at t0 + 2; odd ones live on. */
    for (int i = 0; i < n; i++) {
        struct store_acquire_out out;
        bool live = i % 2;

        snprintf(key, sizeof key, "k%04d", i);
        cr_assert_eq(acquire_ex(key, fp_a, t0, live ? LEASE : 1,
                                live ? TTL : 1, &out), STORE_ACQUIRED);
    }
}

Test(store, sweep_removes_only_expired_bounded_and_resumes)
{
    size_t total = 0, removed;
    int calls = 0;
    char key[32];

    make_sweep_set(1000);
    while (total < 500 && calls < 50) {
        cr_assert_eq(store_sweep(st, t0 + 10, 100, &removed, &err), 0, "%s",
                     err.text);
        cr_assert_leq(removed, 100);
        total += removed;
        calls++;
    }
    cr_expect_eq(total, 500);
    cr_expect_eq(calls, 5, "every call but the last removes its max");
    cr_assert_eq(store_sweep(st, t0 + 10, 100, &removed, &err), 0);
    cr_expect_eq(removed, 0);
    /* Read with the old clock: the expired ones are physically gone, the
     * live ones all there. */
    for (int i = 0; i < 1000; i++) {
        struct store_record r;
        int rc;

        snprintf(key, sizeof key, "k%04d", i);
        rc = get(key, t0, &r);
        cr_expect_eq(rc, i % 2 ? 0 : -ENOENT, "%s", key);
        store_record_clear(&r);
    }
}

Test(store, sweep_spares_what_has_not_expired)
{
    size_t removed;

    make_sweep_set(10);
    /* expires_ms < now is required: at t0 + 2 nothing is past it yet */
    cr_assert_eq(store_sweep(st, t0 + 2, 100, &removed, &err), 0);
    cr_expect_eq(removed, 0);
    cr_assert_eq(store_sweep(st, t0 + 3, 100, &removed, &err), 0);
    cr_expect_eq(removed, 5);
    cr_assert_eq(store_sweep(st, t0 + 3, 0, &removed, &err), 0);
    cr_expect_eq(removed, 0);
}

Test(store, sweep_wraps_around)
{
    struct store_acquire_out out;
    size_t removed, total = 0;

    make_sweep_set(20); /* 10 expired, k0000..k0018 */
    cr_assert_eq(store_sweep(st, t0 + 10, 3, &removed, &err), 0);
    cr_expect_eq(removed, 3);
    /* New expired records before and after the cursor. */
    acquire_ex("a-first", fp_a, t0, 1, 1, &out);
    acquire_ex("z-last", fp_a, t0, 1, 1, &out);
    cr_assert_eq(store_sweep(st, t0 + 10, 100, &removed, &err), 0);
    cr_expect_eq(removed, 9, "one lap from the cursor takes all the rest");
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(store_sweep(st, t0 + 10, 100, &removed, &err), 0);
        total += removed;
    }
    cr_expect_eq(total, 0);
    cr_expect_eq(get("a-first", t0, &(struct store_record){0}), -ENOENT);
}

Test(store, sweep_scan_is_bounded_too)
{
    struct store_acquire_out out;
    size_t removed = 0;
    char key[32];
    int calls = 0;

    /* 400 live records before one expired one: a sweep allowed 1 deletion
     * examines 16 records, so it takes many calls, none of them long. */
    for (int i = 0; i < 400; i++) {
        snprintf(key, sizeof key, "k%04d", i);
        expect_acquired(key, fp_a, t0, 1);
    }
    acquire_ex("z", fp_a, t0, 1, 1, &out);
    while (removed == 0 && calls < 100) {
        cr_assert_eq(store_sweep(st, t0 + 10, 1, &removed, &err), 0);
        calls++;
    }
    cr_expect_eq(removed, 1);
    cr_expect_eq(calls, 401 / 16 + 1, "calls %d", calls);
}

Test(store, sweep_skips_unreadable_values)
{
    size_t removed;

    make_sweep_set(4);
    raw_put("junk", "\x09zz", 3);
    cr_assert_eq(store_sweep(st, UINT64_MAX, 100, &removed, &err), 0);
    cr_expect_eq(removed, 4);
    /* still there for an operator to look at and forget */
    cr_expect_eq(store_forget(st, SCOPE, "junk", &err), 0);
}

Test(store, compaction_filter_drops_records_expired_by_the_real_clock)
{
    struct store_acquire_out out;
    struct store_record r;
    char key[32];

    /* Stamped long ago (fake clock 1000): expired for the real clock. */
    for (int i = 0; i < 50; i++) {
        snprintf(key, sizeof key, "old%02d", i);
        cr_assert_eq(acquire_ex(key, fp_a, 1000, 10, 10, &out),
                     STORE_ACQUIRED);
        snprintf(key, sizeof key, "new%02d", i);
        expect_acquired(key, fp_a, t0, 1);
    }
    store_rocksdb_compact(st);
    /* Read at fake time 0, when neither had expired: only the filter can
     * have removed the old ones. */
    for (int i = 0; i < 50; i++) {
        snprintf(key, sizeof key, "old%02d", i);
        cr_expect_eq(get(key, 0, &r), -ENOENT, "%s", key);
        snprintf(key, sizeof key, "new%02d", i);
        cr_expect_eq(get(key, 0, &r), 0, "%s", key);
        store_record_clear(&r);
    }
}

Test(store, count_estimates_live_records)
{
    size_t removed;
    uint64_t n;

    cr_expect_eq(store_count(st), 0);
    make_sweep_set(100);
    cr_expect_eq(store_count(st), 100);
    cr_assert_eq(store_sweep(st, t0 + 10, 1000, &removed, &err), 0);
    n = store_count(st);
    cr_expect(n >= 40 && n <= 60, "estimate %lu", (unsigned long)n);
    cr_expect_eq(store_count(NULL), 0);
}

/* ---- stored formats ---- */

Test(store, v1_completed_record_is_read)
{
    struct store_acquire_out out;
    struct store_record r;
    struct blob x;

    blob_v1_completed(&x, t0 + TTL, 0xaa);
    raw_put("old", x.b, x.n);
    cr_assert_eq(get("old", t0, &r), 0, "%s", err.text);
    cr_expect_eq(r.state, STORE_COMPLETED);
    cr_expect_eq(r.attempt, 3);
    cr_expect_eq(r.status, 201);
    cr_expect_eq(r.created_ms, 1000);
    cr_expect_eq(r.completed_ms, 3000);
    cr_expect_eq(r.expires_ms, t0 + TTL);
    cr_assert_eq(r.n_headers, 2);
    cr_expect_str_eq(r.headers[1].name, "Location");
    cr_expect_str_eq(r.headers[1].value, "/orders/42");
    cr_assert_eq(r.body_len, V1_BODY_LEN);
    cr_expect_arr_eq(r.body, V1_BODY, V1_BODY_LEN);
    cr_expect_not(r.body_omitted);
    store_record_clear(&r);
    cr_assert_eq(acquire("old", fp_a, t0, &out), STORE_DONE);
    cr_expect_eq(out.rec.status, 201);
    store_record_clear(&out.rec);
    expect_claim("old", fp_b, t0, STORE_MISMATCH);
    cr_expect_eq(get("old", t0 + TTL, &r), -ENOENT);
}

Test(store, v1_in_progress_record_is_taken_over_and_rewritten_as_v3)
{
    struct store_acquire_out out;
    struct store_record r;
    struct blob x;

    blob_v1_in_progress(&x, t0 + 100, t0 + 100 + TTL, 0xaa);
    raw_put("old", x.b, x.n);
    cr_assert_eq(acquire("old", fp_a, t0, &out), STORE_HELD);
    cr_expect_eq(out.remaining_ms, 100);
    expect_acquired("old", fp_a, t0 + 100, 3);
    cr_expect_eq(raw_version("old"), 3);
    cr_assert_eq(get("old", t0 + 100, &r), 0);
    cr_expect_eq(r.created_ms, 500);
    cr_expect_eq(r.attempt, 3);
    store_record_clear(&r);
}

Test(store, unknown_version_is_eproto_everywhere)
{
    static const uint8_t v9[] = {9, 2, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    struct store_acquire_out out;
    struct store_record r;

    raw_put("future", v9, sizeof v9);
    cr_expect_eq(get("future", t0, &r), -EPROTO);
    cr_expect(strstr(err.text, "version 9"), "%s", err.text);
    cr_expect(strstr(err.text, "future"), "%s", err.text);
    cr_expect_null(r.headers);
    cr_expect_eq(store_acquire(st, SCOPE, "future", fp_a, t0, LEASE, TTL,
                               &out, &err), -EPROTO);
    cr_expect_eq(store_complete(st, SCOPE, "future", lease_in(st, SCOPE, "future"), t0, TTL, 200, NULL, 0,
                                NULL, 0, false, &err), -EPROTO);
    cr_expect_eq(store_release(st, SCOPE, "future", 1, lease_in(st, SCOPE, "future"), t0, TTL, &err), -EPROTO);
    /* The way out: an operator forgets the key. */
    cr_expect_eq(store_forget(st, SCOPE, "future", &err), 0);
    expect_acquired("future", fp_a, t0, 1);
}

Test(store, corrupt_values_are_errors)
{
    struct store_record r;
    struct blob x;

    raw_put("empty", "", 0);
    cr_expect_eq(get("empty", t0, &r), -EBADMSG);
    cr_expect(strstr(err.text, "corrupt"), "%s", err.text);
    blob_v1_completed(&x, t0 + TTL, 0xaa);
    raw_put("cut", x.b, x.n - 1);
    cr_expect_eq(get("cut", t0, &r), -EBADMSG);
    cr_expect(strstr(err.text, "truncated"), "%s", err.text);
    x.b[1] = 7; /* state */
    raw_put("state", x.b, x.n);
    cr_expect_eq(get("state", t0, &r), -EBADMSG);
    cr_expect_null(r.body);
}



Test(store, pause_is_swept_like_a_record)
{
    uint64_t until;
    size_t removed;

    cr_assert_eq(store_pause_set(st, SCOPE, t0, t0 + 5000, &err), 0);
    /* Swept like a record once it has passed. */
    cr_assert_eq(store_sweep(st, t0 + 6000, 100, &removed, &err), 0);
    cr_expect_eq(removed, 1);
    cr_expect_eq(store_pause_get(st, SCOPE, t0, &until, &err), -ENOENT);
}


struct sweeper {
    atomic_bool stop;
    uint64_t now;
    int rc;
};

static void *sweep_loop(void *arg)
{
    struct sweeper *s = arg;
    struct sc_error e;
    size_t removed;

    while (!atomic_load(&s->stop) && s->rc == 0)
        s->rc = store_sweep(st, s->now, 1000, &removed, &e);
    return NULL;
}

/* The sweeper scans a snapshot; a key re-acquired after the snapshot must
 * survive it (sweep_one reads the key again under its stripe). */
Test(store, sweep_never_deletes_a_record_acquired_meanwhile)
{
    struct sweeper s = {.now = t0 + 10};
    char key[32];
    pthread_t th;

    for (int round = 0; round < 20; round++) {
        for (int i = 0; i < 300; i++) {
            struct store_acquire_out out;

            snprintf(key, sizeof key, "r%02d-%04d", round, i);
            acquire_ex(key, fp_a, t0, 1, 1, &out); /* expires at t0 + 2 */
        }
        atomic_store(&s.stop, false);
        cr_assert_eq(pthread_create(&th, NULL, sweep_loop, &s), 0);
        for (int i = 299; i >= 0; i--) {
            snprintf(key, sizeof key, "r%02d-%04d", round, i);
            /* Expired, hence new: attempt 1 whether or not swept yet. */
            expect_acquired(key, fp_a, t0 + 10, 1);
        }
        atomic_store(&s.stop, true);
        pthread_join(th, NULL);
        cr_assert_eq(s.rc, 0);
        for (int i = 0; i < 300; i++) {
            struct store_record r;

            snprintf(key, sizeof key, "r%02d-%04d", round, i);
            cr_assert_eq(get(key, t0 + 10, &r), 0, "%s was swept", key);
            store_record_clear(&r);
        }
    }
}
