/* The RocksDB store with sync (store/store_rocksdb.c, store/group_commit.c):
 * the asynchronous calls of the request path, on real event loops and a
 * real RocksDB in a temp dir. Their answers are the blocking calls'; each
 * completes on its loop after the WAL sync that covers it (a read of a
 * record too); calls from two loops share syncs, and everything answered is
 * there after the store is closed and opened again. */
#include <criterion/criterion.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "store/store.h"
#include "store/store_rocksdb_internal.h"
#include "support/testutil.h"
#include "unit/store/lease.h"
#include "util/clock.h"

#define SCOPE "payments"
#define LEASE 60000ull
#define TTL 86400000ull

static char *dir;
static struct store *st;
static struct sc_error err;
static uint64_t t0;
static uint8_t fp_a[STORE_FP_LEN];

static void open_store(bool sync)
{
    cr_assert_eq(store_open_rocksdb(dir, sync, &st, &err), 0, "%s", err.text);
}

static void setup(void)
{
    dir = tu_mkdtemp("store-sync");
    cr_assert_not_null(dir);
    t0 = clock_wall_ms();
    memset(fp_a, 0xaa, sizeof fp_a);
    open_store(true);
}

static void teardown(void)
{
    store_close(st);
    st = NULL;
    tu_rm_rf(dir);
    free(dir);
}

TestSuite(store_sync, .init = setup, .fini = teardown, .timeout = 60);

struct loop {
    struct event_base *base;
    struct store_loop *sl;
    int done;
    uint64_t syncs_seen; /* the store's syncs when the last done ran */
};

static struct loop loop_new(void)
{
    struct loop l = {event_base_new(), NULL, 0, 0};

    cr_assert_not_null(l.base);
    cr_assert_eq(store_loop_new(st, l.base, &l.sl, &err), 0, "%s", err.text);
    return l;
}

static void loop_free(struct loop *l)
{
    store_loop_free(l->sl);
    event_base_free(l->base);
}

static uint64_t syncs(void)
{
    uint64_t s, c;

    store_rocksdb_group_stats(st, &s, &c);
    return s;
}

static void on_done(struct store_call *c)
{
    struct loop *l = c->arg;

    l->syncs_seen = syncs();
    l->done++;
}

static void call_init(struct store_call *c, struct loop *l)
{
    memset(c, 0, sizeof *c);
    c->done = on_done;
    c->arg = l;
}

/* Runs l until it has seen n completions or ms passed; whether it has. */
static bool run_until(struct loop *l, int n, unsigned ms)
{
    uint64_t end = clock_mono_ns() + (uint64_t)ms * NS_PER_MS;

    while (l->done < n && clock_mono_ns() < end)
        event_base_loop(l->base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    return l->done >= n;
}

/* The call's result, waiting for it when it is in progress. */
static int finish(struct loop *l, struct store_call *c, int rc)
{
    int before = l->done;

    if (rc != -EINPROGRESS)
        return rc;
    cr_assert(run_until(l, before + 1, 5000), "no completion");
    return c->rc;
}

Test(store_sync, async_answers_are_the_blocking_ones)
{
    struct loop l = loop_new();
    struct store_call c;

    call_init(&c, &l);
    cr_assert_eq(finish(&l, &c, store_acquire_async(l.sl, &c, SCOPE, "k", fp_a,
                                                    t0, LEASE, TTL)), 0, "%s",
                 c.err.text);
    cr_expect_eq(c.acq.claim, STORE_ACQUIRED);
    cr_expect_eq(c.acq.attempt, 1);
    cr_expect_eq(finish(&l, &c, store_acquire_async(l.sl, &c, SCOPE, "k", fp_a,
                                                    t0 + 1, LEASE, TTL)), 0);
    cr_expect_eq(c.acq.claim, STORE_HELD);
    cr_expect_eq(finish(&l, &c, store_complete_async(l.sl, &c, SCOPE, "k", lease_in(st, SCOPE, "k"), t0 + 2,
                                                     TTL, 201, NULL, 0,
                                                     (const uint8_t *)"ok", 2,
                                                     false)), 0, "%s", c.err.text);
    cr_expect_eq(finish(&l, &c, store_get_async(l.sl, &c, SCOPE, "k", t0 + 3)), 0);
    cr_expect_eq(c.rec.state, STORE_COMPLETED);
    cr_expect_eq(c.rec.status, 201);
    cr_expect_eq(c.rec.body_len, 2);
    store_record_clear(&c.rec);
    cr_expect_eq(finish(&l, &c, store_release_async(l.sl, &c, SCOPE, "k", 1, lease_in(st, SCOPE, "k"),
                                                    t0 + 4, TTL)), -EALREADY);
    cr_expect_eq(finish(&l, &c, store_pause_set_async(l.sl, &c, SCOPE, t0,
                                                      t0 + 60000)), 0);
    /* An absent key rests on no record: answered at once. */
    cr_expect_eq(store_get_async(l.sl, &c, SCOPE, "absent", t0), -ENOENT);
    cr_expect_eq(store_release_async(l.sl, &c, SCOPE, "absent", 1, lease_in(st, SCOPE, "absent"), t0, TTL),
                 -ENOENT);
    cr_expect_eq(store_permit_async(l.sl, &c, SCOPE, NULL, 1, 1, 1), -EOPNOTSUPP);
    loop_free(&l);
}

/* The lease is written but not synced when the acquire returns: a read of
 * it waits for the sync too, so its answer never comes before one. */
Test(store_sync, a_read_of_an_unsynced_record_waits_for_the_sync)
{
    struct loop l = loop_new();
    struct store_call acq, rd;
    int rc;

    call_init(&acq, &l);
    call_init(&rd, &l);
    cr_assert_eq(syncs(), 0);
    rc = store_acquire_async(l.sl, &acq, SCOPE, "k", fp_a, t0, LEASE, TTL);
    cr_assert_eq(rc, -EINPROGRESS, "a write is never answered at once");
    rc = store_get_async(l.sl, &rd, SCOPE, "k", t0);
    if (rc == 0)
        cr_assert_geq(syncs(), 1, "a record answered before any sync");
    else
        cr_assert_eq(rc, -EINPROGRESS);
    cr_assert(run_until(&l, rc == 0 ? 1 : 2, 5000));
    cr_expect_geq(l.syncs_seen, 1);
    cr_expect_eq(acq.rc, 0);
    cr_expect_eq(acq.acq.claim, STORE_ACQUIRED);
    cr_expect_eq(rd.rc, 0);
    cr_expect_eq(rd.rec.state, STORE_IN_PROGRESS);
    store_record_clear(&rd.rec);
    loop_free(&l);
}

Test(store_sync, a_cancelled_call_never_completes_and_its_write_stays)
{
    struct loop l = loop_new();
    struct store_call c, after;
    struct store_record r;

    call_init(&c, &l);
    call_init(&after, &l);
    cr_assert_eq(store_acquire_async(l.sl, &c, SCOPE, "k", fp_a, t0, LEASE, TTL),
                 -EINPROGRESS);
    store_call_cancel(&c);
    cr_expect_not(store_call_pending(&c));
    /* A later call's completion means c's sync has run as well. */
    cr_assert_eq(finish(&l, &after, store_acquire_async(l.sl, &after, SCOPE,
                                                        "k2", fp_a, t0, LEASE,
                                                        TTL)), 0);
    cr_expect_eq(l.done, 1);
    cr_expect_eq(store_get(st, SCOPE, "k", t0, &r, &err), 0);
    cr_expect_eq(r.state, STORE_IN_PROGRESS);
    store_record_clear(&r);
    loop_free(&l);
}

Test(store_sync, loop_free_with_calls_in_flight_completes_none)
{
    struct loop l = loop_new();
    struct store_call c[8];
    char key[16];

    for (int i = 0; i < 8; i++) {
        call_init(&c[i], &l);
        snprintf(key, sizeof key, "k%d", i);
        cr_assert_eq(store_acquire_async(l.sl, &c[i], SCOPE, key, fp_a, t0,
                                         LEASE, TTL), -EINPROGRESS);
    }
    loop_free(&l); /* ASan: nothing queued leaks, nothing runs after */
    for (int i = 0; i < 8; i++)
        cr_expect_not(store_call_pending(&c[i]));
    cr_expect_eq(l.done, 0);
}

/* ---- many calls from two loops, then a reopen ---- */

#define KEYS 300

struct worker {
    struct loop l;
    int id;
    struct store_call calls[KEYS];
    bool ok;
    pthread_t th;
};

/* Leases then completes KEYS fresh keys, each phase all in flight at once. */
static bool worker_phase(struct worker *k, bool complete)
{
    char key[32];
    int at_once = 0, rc;

    k->l.done = 0;
    for (int i = 0; i < KEYS; i++) {
        call_init(&k->calls[i], &k->l);
        snprintf(key, sizeof key, "w%d-%d", k->id, i);
        rc = complete ? store_complete_async(k->l.sl, &k->calls[i], SCOPE, key, lease_in(st, SCOPE, key),
                                             t0, TTL, 200, NULL, 0,
                                             (const uint8_t *)key, strlen(key),
                                             false)
                      : store_acquire_async(k->l.sl, &k->calls[i], SCOPE, key,
                                            fp_a, t0, LEASE, TTL);
        if (rc == 0)
            at_once++;
        else if (rc != -EINPROGRESS)
            return false;
    }
    if (!run_until(&k->l, KEYS - at_once, 10000))
        return false;
    for (int i = 0; i < KEYS; i++)
        if (k->calls[i].rc != 0)
            return false;
    return true;
}

static void *worker_run(void *arg)
{
    struct worker *k = arg;

    k->ok = worker_phase(k, false) && worker_phase(k, true);
    return NULL;
}

Test(store_sync, calls_from_two_loops_share_syncs_and_survive_a_reopen)
{
    static struct worker ks[2];
    struct store_record r;
    uint64_t n_syncs, n_calls;
    char key[32];

    for (int i = 0; i < 2; i++) {
        memset(&ks[i], 0, sizeof ks[i]);
        ks[i].id = i;
        ks[i].l = loop_new();
    }
    for (int i = 0; i < 2; i++)
        cr_assert_eq(pthread_create(&ks[i].th, NULL, worker_run, &ks[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(ks[i].th, NULL);
    store_rocksdb_group_stats(st, &n_syncs, &n_calls);
    for (int i = 0; i < 2; i++) {
        cr_assert(ks[i].ok, "loop %d failed", i);
        loop_free(&ks[i].l);
    }
    cr_expect_lt(n_syncs, 4 * KEYS, "%llu syncs for %d writes: not grouped",
                 (unsigned long long)n_syncs, 4 * KEYS);
    store_close(st);
    st = NULL;
    open_store(false);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < KEYS; j++) {
            snprintf(key, sizeof key, "w%d-%d", i, j);
            cr_assert_eq(store_get(st, SCOPE, key, t0, &r, &err), 0, "%s", key);
            cr_assert_eq(r.state, STORE_COMPLETED, "%s", key);
            cr_assert_eq(r.body_len, strlen(key));
            cr_assert_arr_eq(r.body, key, r.body_len);
            store_record_clear(&r);
        }
}
