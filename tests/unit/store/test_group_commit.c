/* Group commit (store/group_commit.c) with a sync of the test's own that
 * can be held at a gate or made to fail: a call completes on its own loop
 * only after a sync that covers its ticket, never before; a cancelled call
 * never completes; a failed sync fails every call it was to cover and every
 * later one; loop_free and close drop what is still queued (ASan checks
 * that nothing leaks). The real sync (RocksDB's WAL) is in test_store.c. */
#include <criterion/criterion.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include <event2/event.h>

#include "store/group_commit.h"
#include "support/testutil.h"
#include "util/clock.h"

struct fake {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool gate_open;
    bool fail;
    atomic_uint syncs;
    atomic_ulong covered; /* the newest note when the last sync began */
    struct group_commit *gc;
};

static struct fake fk;
static struct sc_error err;

/* Runs on the committer thread: waits at the gate, then "syncs". */
static int fake_sync(void *arg, struct sc_error *e)
{
    struct fake *f = arg;

    pthread_mutex_lock(&f->mu);
    while (!f->gate_open)
        pthread_cond_wait(&f->cv, &f->mu);
    pthread_mutex_unlock(&f->mu);
    atomic_fetch_add(&f->syncs, 1);
    if (f->fail) {
        sc_error_set(e, "store: WAL sync failed: test");
        return -EIO;
    }
    return 0;
}

static void gate(bool open)
{
    pthread_mutex_lock(&fk.mu);
    fk.gate_open = open;
    pthread_cond_broadcast(&fk.cv);
    pthread_mutex_unlock(&fk.mu);
}

static void setup(void)
{
    memset(&fk, 0, sizeof fk);
    pthread_mutex_init(&fk.mu, NULL);
    pthread_cond_init(&fk.cv, NULL);
    cr_assert_eq(group_commit_open(fake_sync, &fk, &fk.gc, &err), 0, "%s",
                 err.text);
}

static void teardown(void)
{
    gate(true); /* a committer held at the gate must see stop */
    group_commit_close(fk.gc);
    pthread_cond_destroy(&fk.cv);
    pthread_mutex_destroy(&fk.mu);
}

TestSuite(group_commit, .init = setup, .fini = teardown, .timeout = 30);

struct loop {
    struct event_base *base;
    struct store_loop *sl;
};

static struct loop loop_new(void)
{
    struct loop l = {event_base_new(), NULL};

    cr_assert_not_null(l.base);
    cr_assert_eq(group_commit_loop_new(fk.gc, NULL, l.base, &l.sl, &err), 0,
                 "%s", err.text);
    return l;
}

static void loop_free(struct loop *l)
{
    group_commit_loop_free(l->sl);
    event_base_free(l->base);
}

/* A wait with its queue entry made just before, as the store makes it. */
static int gc_wait(struct store_loop *sl, struct store_call *c,
                   uint64_t ticket, int rc)
{
    struct gc_node *n = group_commit_node_new();

    cr_assert_not_null(n);
    return group_commit_wait(sl, c, n, ticket, rc);
}

struct waiter {
    atomic_int done;
    unsigned syncs_seen; /* fk.syncs when done ran */
};

static void on_done(struct store_call *c)
{
    struct waiter *w = c->arg;

    w->syncs_seen = atomic_load(&fk.syncs);
    atomic_fetch_add(&w->done, 1);
}

static void call_init(struct store_call *c, struct waiter *w)
{
    memset(c, 0, sizeof *c);
    c->done = on_done;
    c->arg = w;
}

/* Runs l until want calls are done or ms passed; whether they were. */
static bool run_until(struct loop *l, struct waiter *w, int want, unsigned ms)
{
    uint64_t end = clock_mono_ns() + (uint64_t)ms * NS_PER_MS;

    while (atomic_load(&w->done) < want && clock_mono_ns() < end)
        event_base_loop(l->base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    return atomic_load(&w->done) >= want;
}

Test(group_commit, done_runs_only_after_the_covering_sync)
{
    struct loop l = loop_new();
    struct waiter w = {0};
    struct store_call c;
    uint64_t t;

    call_init(&c, &w);
    t = group_commit_note(fk.gc);
    cr_assert_eq(gc_wait(l.sl, &c, t, 0), -EINPROGRESS);
    cr_assert(c.pending);
    /* The sync is held: 100 ms of loop turns and no completion. */
    cr_assert_not(run_until(&l, &w, 1, 100));
    cr_assert_eq(atomic_load(&fk.syncs), 0);
    gate(true);
    cr_assert(run_until(&l, &w, 1, 5000));
    cr_expect_geq(w.syncs_seen, 1);
    cr_expect_eq(c.rc, 0);
    cr_expect_null(c.pending);
    loop_free(&l);
}

Test(group_commit, a_durable_ticket_answers_at_once_with_the_result)
{
    struct loop l = loop_new();
    struct waiter w = {0};
    struct store_call c;
    uint64_t t;

    gate(true);
    call_init(&c, &w);
    t = group_commit_note(fk.gc);
    cr_assert_eq(gc_wait(l.sl, &c, t, 0), -EINPROGRESS);
    cr_assert(run_until(&l, &w, 1, 5000));
    /* t is durable now, and so is 0 (nothing written): no wait. */
    cr_expect_eq(gc_wait(l.sl, &c, t, -EALREADY), -EALREADY);
    cr_expect_eq(gc_wait(l.sl, &c, 0, 0), 0);
    cr_expect_null(c.pending);
    cr_expect_eq(atomic_load(&w.done), 1);
    loop_free(&l);
}

/* Two loops on two threads, each with many calls queued at once: every
 * one completes on its own loop, and syncs are shared. */
#define PER_THREAD 500

struct worker {
    struct loop l;
    struct waiter w;
    struct store_call calls[PER_THREAD];
    pthread_t self, ran_on[PER_THREAD];
    bool ok;
};

static void on_done_thread(struct store_call *c)
{
    struct worker *k = c->arg;

    k->ran_on[c - k->calls] = pthread_self();
    atomic_fetch_add(&k->w.done, 1);
}

static void *worker_run(void *arg)
{
    struct worker *k = arg;
    int rc;

    k->self = pthread_self();
    for (int i = 0; i < PER_THREAD; i++) {
        memset(&k->calls[i], 0, sizeof k->calls[i]);
        k->calls[i].done = on_done_thread;
        k->calls[i].arg = k;
        rc = gc_wait(k->l.sl, &k->calls[i], group_commit_note(fk.gc),
                               0);
        if (rc == 0) { /* synced already by a sync for an earlier call */
            k->calls[i].rc = 0;
            on_done_thread(&k->calls[i]);
        } else if (rc != -EINPROGRESS)
            return NULL;
    }
    k->ok = run_until(&k->l, &k->w, PER_THREAD, 10000);
    return NULL;
}

Test(group_commit, calls_from_two_loops_all_complete_on_their_own_loop)
{
    static struct worker ks[2];
    uint64_t syncs, calls;

    gate(true);
    for (int i = 0; i < 2; i++) {
        memset(&ks[i], 0, sizeof ks[i]);
        ks[i].l = loop_new();
    }
    for (int i = 0; i < 2; i++)
        cr_assert_eq(pthread_create(&ks[i].self, NULL, worker_run, &ks[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(ks[i].self, NULL);
    for (int i = 0; i < 2; i++) {
        cr_assert(ks[i].ok, "loop %d: %d of %d done", i,
                  atomic_load(&ks[i].w.done), PER_THREAD);
        for (int j = 0; j < PER_THREAD; j++) {
            cr_assert(pthread_equal(ks[i].ran_on[j], ks[i].self));
            cr_assert_eq(ks[i].calls[j].rc, 0);
        }
        loop_free(&ks[i].l);
    }
    group_commit_stats(fk.gc, &syncs, &calls);
    /* Some calls find their write synced already (an earlier call's sync
     * covered it): they answer at once and are not counted. */
    cr_expect_leq(calls, 2 * PER_THREAD);
    cr_expect_lt(syncs, 2 * PER_THREAD, "%llu syncs for %d writes: not grouped",
                 (unsigned long long)syncs, 2 * PER_THREAD);
}

Test(group_commit, a_cancelled_call_never_completes)
{
    struct loop l = loop_new();
    struct waiter w = {0}, w2 = {0};
    struct store_call c, c2;

    call_init(&c, &w);
    call_init(&c2, &w2);
    cr_assert_eq(gc_wait(l.sl, &c, group_commit_note(fk.gc), 0),
                 -EINPROGRESS);
    cr_assert_eq(gc_wait(l.sl, &c2, group_commit_note(fk.gc), 0),
                 -EINPROGRESS);
    group_commit_cancel(&c);
    c.pending = NULL; /* as store_call_cancel does */
    gate(true);
    cr_assert(run_until(&l, &w2, 1, 5000));
    /* c2 came after c, so c's sync has run too: still no completion. */
    cr_assert_not(run_until(&l, &w, 1, 50));
    loop_free(&l);
}

static uint64_t stats_syncs(void)
{
    uint64_t syncs, calls;

    group_commit_stats(fk.gc, &syncs, &calls);
    return syncs;
}

Test(group_commit, loop_free_drops_queued_and_ready_calls)
{
    struct loop l = loop_new();
    struct waiter w = {0};
    struct store_call queued, ready;

    call_init(&queued, &w);
    call_init(&ready, &w);
    cr_assert_eq(gc_wait(l.sl, &ready, group_commit_note(fk.gc), 0),
                 -EINPROGRESS);
    gate(true);
    /* Let the committer hand it over (its count of syncs moves with the
     * hand-over, under one lock), without running the loop. */
    for (int i = 0; i < 5000 && stats_syncs() == 0; i++)
        tu_sleep_ms(1);
    cr_assert_geq(stats_syncs(), 1);
    gate(false);
    cr_assert_eq(gc_wait(l.sl, &queued, group_commit_note(fk.gc), 0),
                 -EINPROGRESS);
    loop_free(&l);
    cr_expect_null(queued.pending);
    cr_expect_null(ready.pending);
    cr_expect_eq(atomic_load(&w.done), 0);
}

Test(group_commit, a_failed_sync_fails_its_calls_and_every_later_one)
{
    struct loop l = loop_new();
    struct waiter w = {0};
    struct store_call c, later;

    fk.fail = true;
    call_init(&c, &w);
    c.acq.rec.body = malloc(8); /* a replay's record: cleared on failure */
    c.acq.rec.body_len = 8;
    cr_assert_eq(gc_wait(l.sl, &c, group_commit_note(fk.gc), 0),
                 -EINPROGRESS);
    gate(true);
    cr_assert(run_until(&l, &w, 1, 5000));
    cr_expect_eq(c.rc, -EIO);
    cr_expect(strstr(c.err.text, "WAL sync failed"), "%s", c.err.text);
    cr_expect_null(c.acq.rec.body);
    /* Nothing newer than the last good sync is durable, ever. */
    call_init(&later, &w);
    cr_expect_eq(gc_wait(l.sl, &later, group_commit_note(fk.gc), 0),
                 -EIO);
    cr_expect_eq(later.rc, -EIO);
    cr_expect(strstr(later.err.text, "WAL sync failed"), "%s", later.err.text);
    loop_free(&l);
}
