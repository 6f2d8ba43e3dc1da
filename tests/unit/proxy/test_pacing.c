/* proxy/pacing.c: the runtime state of policies (docs/contract.md §5).
 * Partitions: one bucket per header value, created full while there is
 * room and empty once creating one costs an eviction, at most `max` live,
 * the least recently used evicted and coming back empty (never full),
 * pointers that stay valid memory. Concurrency slots: FIFO waiters, hand-over by
 * event_active (also from another thread), cancel before and after grant,
 * the lock-free count of policies without a limit. */
#include <criterion/criterion.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "config/config.h"
#include "proxy/pacing.h"

#define SEC 1000000000ull
#define NOW0 (1000ull * SEC)
#define T_10 (SEC / 10) /* 10/s */

static const char yaml[] =
    "upstreams: { up: { url: http://127.0.0.1:9000 } }\n"
    "policies:\n"
    "  tenant: { rate: 10/s, burst: 3, partition: { header: X-Tenant, max: 3 } }\n"
    "  wide: { rate: 10/s, burst: 3, partition: { header: X-Tenant, max: 200 } }\n"
    "  shared: { rate: 10/s, burst: 3 }\n"
    "  slots: { concurrency: 2 }\n"
    "  one: { concurrency: 1 }\n"
    "  free: { max_wait: 1s }\n"
    "routes:\n"
    "  - { prefix: /a, upstream: up, policy: tenant }\n"
    "  - { prefix: /b, upstream: up, policy: wide }\n"
    "  - { prefix: /c, upstream: up, policy: shared }\n"
    "  - { prefix: /d, upstream: up, policy: slots }\n"
    "  - { prefix: /e, upstream: up, policy: one }\n"
    "  - { prefix: /f, upstream: up, policy: free }\n"
    "  - { prefix: /, upstream: up }\n";

static struct sc_config *cfg;
static struct pacing pc;

static void setup(void)
{
    struct sc_errors errs = {0};

    /* pacing hands slots over across threads: libevent must lock */
    cr_assert_eq(evthread_use_pthreads(), 0);
    cr_assert_eq(config_load_string("t.yaml", yaml, strlen(yaml), &cfg, &errs), 0,
                 "config refused");
    sc_errors_free(&errs);
    cr_assert_eq(pacing_init(&pc, cfg, NULL), 0);
}

static void teardown(void)
{
    pacing_free(&pc);
    config_free(cfg);
    libevent_global_shutdown();
}

TestSuite(pacing_partitions, .init = setup, .fini = teardown);
TestSuite(pacing_slots, .init = setup, .fini = teardown);

static struct policy_state *policy(const char *name)
{
    long i = config_policy_index(cfg, name);

    cr_assert_geq(i, 0, "no policy %s", name);
    return pacing_policy(&pc, i);
}

static bool try_now(struct bucket *b, uint64_t now)
{
    uint64_t start;

    return gcra_reserve(&b->g, now, 0, &start);
}

/* ---- partitions -------------------------------------------------------------- */

Test(pacing_partitions, policies_and_the_default)
{
    struct policy_state *ps = policy("shared");

    cr_expect_eq(pacing_policy(&pc, -1), pc.dflt);
    cr_expect_eq(pacing_policy(&pc, (long)cfg->n_policies), pc.dflt);
    cr_expect_eq(pacing_policy(&pc, 1000), pc.dflt);
    cr_expect_str_eq(ps->name, "shared");
    /* no rate: no bucket, partition or not */
    cr_expect_null(pacing_bucket(pacing_policy(&pc, -1), NULL, NOW0));
    cr_expect_null(pacing_bucket(policy("slots"), "x", NOW0));
    cr_expect_null(pacing_bucket(policy("free"), NULL, NOW0));
    /* an unpartitioned policy has one bucket, whatever the header, and it
     * starts full */
    cr_expect_eq(pacing_bucket(ps, NULL, NOW0), &ps->bucket);
    cr_expect_eq(pacing_bucket(ps, "a", NOW0), &ps->bucket);
    for (int i = 0; i < 3; i++)
        cr_expect(try_now(&ps->bucket, NOW0), "burst start %d", i);
    cr_expect_not(try_now(&ps->bucket, NOW0));
    /* a partitioned policy without the header uses the policy's bucket */
    cr_expect_eq(pacing_bucket(policy("tenant"), NULL, NOW0), &policy("tenant")->bucket);
}

Test(pacing_partitions, one_bucket_per_value)
{
    struct policy_state *ps = policy("wide");
    struct bucket *a = pacing_bucket(ps, "acme", NOW0);
    struct bucket *b = pacing_bucket(ps, "globex", NOW0);

    cr_assert_not_null(a);
    cr_assert_not_null(b);
    cr_expect_neq(a, b);
    cr_expect_neq(a, &ps->bucket);
    cr_expect_eq(pacing_bucket(ps, "acme", NOW0 + 5), a);
    cr_expect_eq(pacing_bucket(ps, "globex", NOW0 + 5), b);
    /* values are compared exactly */
    cr_expect_neq(pacing_bucket(ps, "Acme", NOW0), a);
    cr_expect_neq(pacing_bucket(ps, "acme ", NOW0), a);
    cr_expect_neq(pacing_bucket(ps, "", NOW0), a);
    cr_expect_eq(pacing_bucket(ps, "", NOW0), pacing_bucket(ps, "", NOW0));
    /* the buckets are independent: draining one leaves the other alone */
    for (int i = 0; i < 3; i++)
        cr_expect(try_now(a, NOW0));
    cr_expect_not(try_now(a, NOW0));
    cr_expect(try_now(b, NOW0));
    cr_expect_eq(gcra_available(&b->g, NOW0, NULL), 2);
}

Test(pacing_partitions, many_values_with_colliding_chains)
{
    struct policy_state *ps = policy("wide");
    struct bucket *seen[200];
    char name[32];

    /* 200 values in a table of a few hundred slots: chains form */
    for (int i = 0; i < 200; i++) {
        snprintf(name, sizeof name, "tenant-%d", i);
        seen[i] = pacing_bucket(ps, name, NOW0);
        cr_assert_not_null(seen[i]);
        for (int k = 0; k < i; k++)
            cr_assert_neq(seen[i], seen[k], "%s shares a bucket with tenant-%d", name, k);
    }
    cr_expect_eq(ps->n_parts, 200);
    for (int i = 199; i >= 0; i--) {
        snprintf(name, sizeof name, "tenant-%d", i);
        cr_assert_eq(pacing_bucket(ps, name, NOW0), seen[i], "%s moved", name);
    }
    cr_expect_eq(ps->n_parts, 200);
}

/* pacing.h: "created full while there is room; beyond `max` the least
 * recently used is evicted and the new one starts empty". */
Test(pacing_partitions, new_partitions_start_full_while_there_is_room)
{
    struct policy_state *ps = policy("tenant"); /* burst 3, max 3 */
    const char *names[] = {"a", "b", "c"};
    struct bucket *d;
    uint64_t start = 0, next = 0;

    for (int i = 0; i < 3; i++) {
        struct bucket *b = pacing_bucket(ps, names[i], NOW0);

        cr_assert_not_null(b);
        cr_expect_eq(atomic_load(&b->cooldown_until), 0);
        cr_expect_eq(gcra_available(&b->g, NOW0, NULL), 3, "%s", names[i]);
        for (int k = 0; k < 3; k++)
            cr_expect(try_now(b, NOW0), "%s: burst start %d", names[i], k);
        cr_expect_not(try_now(b, NOW0));
    }
    /* The table is full: the next new one costs an eviction and starts
     * empty, so its first reservation with max_wait 0 fails. */
    d = pacing_bucket(ps, "d", NOW0);
    cr_assert_not_null(d);
    cr_expect_not(gcra_reserve(&d->g, NOW0, 0, &start), "a partition made by eviction was full");
    cr_expect_eq(start, NOW0 + T_10);
    cr_expect_eq(gcra_available(&d->g, NOW0, &next), 0);
    cr_expect_eq(next, T_10);
    cr_expect_eq(atomic_load(&d->cooldown_until), 0);
    /* it fills at rate, to burst, like any bucket */
    cr_expect(try_now(d, NOW0 + T_10));
    cr_expect_not(try_now(d, NOW0 + T_10));
    cr_expect_eq(gcra_available(&d->g, NOW0 + 60 * SEC, NULL), 3);
}

/* A cooldown does not survive eviction into the next holder of the struct. */
Test(pacing_partitions, recycled_partition_has_no_cooldown)
{
    struct policy_state *ps = policy("tenant");
    struct bucket *a = pacing_bucket(ps, "a", NOW0), *d;

    pacing_bucket(ps, "b", NOW0);
    pacing_bucket(ps, "c", NOW0);
    atomic_store(&a->cooldown_until, NOW0 + 3600 * SEC);
    gcra_pause_until(&a->g, NOW0 + 3600 * SEC);
    d = pacing_bucket(ps, "d", NOW0 + SEC); /* evicts a */
    cr_expect_eq(atomic_load(&d->cooldown_until), 0);
    cr_expect(try_now(d, NOW0 + SEC + T_10), "the evicted one's pause leaked into d");
}

Test(pacing_partitions, lru_eviction_and_evicted_come_back_empty)
{
    struct policy_state *ps = policy("tenant"); /* max 3 */
    struct bucket *a, *b, *c, *d, *b2;
    const uint64_t later = NOW0 + 60 * SEC;

    a = pacing_bucket(ps, "a", NOW0);
    b = pacing_bucket(ps, "b", NOW0);
    c = pacing_bucket(ps, "c", NOW0);
    cr_expect_eq(ps->n_parts, 3);
    /* a minute later all three have refilled to burst */
    cr_expect_eq(gcra_available(&b->g, later, NULL), 3);
    /* a and c are used again: b is the least recently used */
    cr_expect_eq(pacing_bucket(ps, "a", later), a);
    cr_expect_eq(pacing_bucket(ps, "c", later), c);
    cr_expect(try_now(a, later));                 /* a: 2 tokens left */
    d = pacing_bucket(ps, "d", later);
    cr_expect_eq(ps->n_parts, 3, "at most max live partitions");
    /* a and c survived with their state */
    cr_expect_eq(pacing_bucket(ps, "a", later), a);
    cr_expect_eq(pacing_bucket(ps, "c", later), c);
    cr_expect_eq(gcra_available(&a->g, later, NULL), 2);
    cr_expect_eq(gcra_available(&c->g, later, NULL), 3);
    /* d is new: empty */
    cr_expect_not(try_now(d, later));
    /* b comes back (evicting d, now the least recently used): empty, not the
     * full bucket it was when it left */
    b2 = pacing_bucket(ps, "b", later);
    cr_expect_eq(ps->n_parts, 3);
    cr_expect_eq(gcra_available(&b2->g, later, NULL), 0, "an evicted partition came back full");
    cr_expect_not(try_now(b2, later));
    cr_expect(try_now(b2, later + T_10));
    /* d was evicted by b: it too comes back empty */
    cr_expect_eq(pacing_bucket(ps, "a", later), a);
    cr_expect_eq(pacing_bucket(ps, "c", later), c);
    d = pacing_bucket(ps, "d", later + 120 * SEC);
    cr_expect_not(try_now(d, later + 120 * SEC));
    /* and b, back once more (evicting a this time), is empty again */
    cr_expect_eq(gcra_available(&pacing_bucket(ps, "b", later + 120 * SEC)->g,
                                later + 120 * SEC, NULL), 0);
}

Test(pacing_partitions, evicted_pointers_stay_valid_memory)
{
    struct policy_state *ps = policy("tenant"); /* max 3 */
    struct bucket *old[3], *live[3];
    char name[16];
    uint64_t start;

    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "old-%d", i);
        old[i] = pacing_bucket(ps, name, NOW0);
    }
    /* churn through many more values than max */
    for (int i = 0; i < 100; i++) {
        snprintf(name, sizeof name, "new-%d", i);
        cr_assert_not_null(pacing_bucket(ps, name, NOW0 + (uint64_t)i));
        cr_assert_leq(ps->n_parts, 3);
    }
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "new-%d", 97 + i);
        live[i] = pacing_bucket(ps, name, NOW0 + 200);
    }
    /* A request still holding an evicted pointer reads and writes valid
     * memory (ASan would say otherwise): evicted partitions are recycled,
     * so the pointer is one of the live buckets. */
    for (int i = 0; i < 3; i++) {
        bool found = false;

        gcra_reserve(&old[i]->g, NOW0 + 300, 10 * SEC, &start);
        atomic_store(&old[i]->cooldown_until, 0);
        for (int k = 0; k < 3; k++)
            found |= old[i] == live[k];
        cr_expect(found, "old-%d's bucket is neither live nor a recycled one", i);
    }
}

/* ---- slots ------------------------------------------------------------------ */

struct waiter {
    struct slot_waiter w;
    int fired;
    int order;          /* the place in which it fired */
    int *counter;
    struct event_base *base;
};

static void on_granted(evutil_socket_t fd, short what, void *arg)
{
    struct waiter *wt = arg;

    wt->fired++;
    wt->order = ++*wt->counter;
}

static void waiter_init(struct waiter *wt, struct event_base *base, int *counter)
{
    memset(wt, 0, sizeof *wt);
    wt->counter = counter;
    wt->base = base;
    wt->w.granted_ev = event_new(base, -1, 0, on_granted, wt);
    cr_assert_not_null(wt->w.granted_ev);
}

static void run_pending(struct event_base *base)
{
    event_base_loop(base, EVLOOP_NONBLOCK);
}

Test(pacing_slots, two_slots_then_fifo_hand_over)
{
    struct policy_state *ps = policy("slots"); /* concurrency 2 */
    struct event_base *base = event_base_new();
    struct waiter w[5];
    int counter = 0;

    cr_assert_not_null(base);
    for (int i = 0; i < 5; i++)
        waiter_init(&w[i], base, &counter);
    cr_expect(pacing_slot_acquire(ps, &w[0].w));
    cr_expect(pacing_slot_acquire(ps, &w[1].w));
    cr_expect_eq(pacing_inflight(ps), 2);
    cr_expect_not(pacing_slot_acquire(ps, &w[2].w), "the third must queue");
    cr_expect_not(pacing_slot_acquire(ps, &w[3].w));
    cr_expect_not(pacing_slot_acquire(ps, &w[4].w));
    cr_expect(w[2].w.queued);
    cr_expect_not(w[2].w.granted);
    cr_expect_eq(pacing_inflight(ps), 2, "waiters hold no slot");
    run_pending(base);
    cr_expect_eq(counter, 0, "nothing granted yet");

    /* one release: the oldest waiter gets the slot, inflight stays 2 */
    pacing_slot_release(ps);
    cr_expect_eq(pacing_inflight(ps), 2);
    cr_expect(w[2].w.granted);
    cr_expect_not(w[2].w.queued);
    cr_expect(w[3].w.queued);
    run_pending(base);
    cr_expect_eq(w[2].fired, 1, "the oldest waiter's event must fire");
    cr_expect_eq(w[3].fired, 0);
    cr_expect_eq(w[4].fired, 0);

    /* two more: in arrival order */
    pacing_slot_release(ps);
    pacing_slot_release(ps);
    run_pending(base);
    cr_expect_eq(w[3].fired, 1);
    cr_expect_eq(w[4].fired, 1);
    cr_expect_eq(w[2].order, 1);
    cr_expect_eq(w[3].order, 2);
    cr_expect_eq(w[4].order, 3);
    cr_expect_eq(pacing_inflight(ps), 2);

    /* no waiters left: releases count down */
    pacing_slot_release(ps);
    cr_expect_eq(pacing_inflight(ps), 1);
    pacing_slot_release(ps);
    cr_expect_eq(pacing_inflight(ps), 0);
    run_pending(base);
    cr_expect_eq(counter, 3, "no spurious grants");
    /* and the slots are free again */
    cr_expect(pacing_slot_acquire(ps, &w[0].w));
    cr_expect(pacing_slot_acquire(ps, &w[1].w));
    cr_expect_not(pacing_slot_acquire(ps, &w[2].w));
    cr_expect(pacing_slot_cancel(ps, &w[2].w));

    for (int i = 0; i < 5; i++)
        event_free(w[i].w.granted_ev);
    event_base_free(base);
}

Test(pacing_slots, cancel_before_and_after_grant)
{
    struct policy_state *ps = policy("slots");
    struct event_base *base = event_base_new();
    struct waiter w[5];
    int counter = 0;

    cr_assert_not_null(base);
    for (int i = 0; i < 5; i++)
        waiter_init(&w[i], base, &counter);
    cr_assert(pacing_slot_acquire(ps, &w[0].w));
    cr_assert(pacing_slot_acquire(ps, &w[1].w));
    cr_assert_not(pacing_slot_acquire(ps, &w[2].w));
    cr_assert_not(pacing_slot_acquire(ps, &w[3].w));
    cr_assert_not(pacing_slot_acquire(ps, &w[4].w));

    /* a queued waiter (in the middle) leaves: true, and it is gone */
    cr_expect(pacing_slot_cancel(ps, &w[3].w));
    cr_expect_not(w[3].w.queued);
    cr_expect_not(pacing_slot_cancel(ps, &w[3].w), "a second cancel finds nothing");
    pacing_slot_release(ps);   /* -> w2 */
    pacing_slot_release(ps);   /* -> w4, skipping the cancelled w3 */
    run_pending(base);
    cr_expect_eq(w[2].fired, 1);
    cr_expect_eq(w[3].fired, 0, "a cancelled waiter must never be granted");
    cr_expect_eq(w[4].fired, 1);
    cr_expect_eq(pacing_inflight(ps), 2);

    /* cancel after the grant: false, the slot is the caller's */
    cr_expect_not(pacing_slot_cancel(ps, &w[2].w));
    cr_expect(w[2].w.granted);
    cr_expect_eq(pacing_inflight(ps), 2);
    pacing_slot_release(ps);
    pacing_slot_release(ps);
    cr_expect_eq(pacing_inflight(ps), 0);

    /* the last waiter cancelled: a release just frees the slot */
    cr_assert(pacing_slot_acquire(ps, &w[0].w));
    cr_assert(pacing_slot_acquire(ps, &w[1].w));
    cr_assert_not(pacing_slot_acquire(ps, &w[3].w));
    cr_expect(pacing_slot_cancel(ps, &w[3].w));
    pacing_slot_release(ps);
    cr_expect_eq(pacing_inflight(ps), 1);
    run_pending(base);
    cr_expect_eq(w[3].fired, 0);
    pacing_slot_release(ps);
    cr_expect_eq(pacing_inflight(ps), 0);

    for (int i = 0; i < 5; i++)
        event_free(w[i].w.granted_ev);
    event_base_free(base);
}

Test(pacing_slots, no_limit_counts_inflight)
{
    struct policy_state *ps[] = {policy("free"), policy("shared"), pacing_policy(&pc, -1)};

    for (size_t p = 0; p < sizeof ps / sizeof ps[0]; p++) {
        struct slot_waiter w = {0}; /* never queued: no event needed */

        for (int i = 1; i <= 1000; i++) {
            cr_assert(pacing_slot_acquire(ps[p], &w));
            cr_assert_eq(pacing_inflight(ps[p]), (uint32_t)i);
        }
        cr_expect_not(w.queued);
        for (int i = 999; i >= 0; i--) {
            pacing_slot_release(ps[p]);
            cr_assert_eq(pacing_inflight(ps[p]), (uint32_t)i);
        }
    }
}

/* The hand-over crosses threads: a release on another thread wakes the
 * waiter's loop, which sleeps in event_base_dispatch meanwhile. */
struct releaser {
    struct policy_state *ps;
    int delay_ms;
};

static void *release_later(void *arg)
{
    struct releaser *r = arg;
    struct timespec ts = {0, r->delay_ms * 1000000L};

    nanosleep(&ts, NULL);
    pacing_slot_release(r->ps);
    return NULL;
}

static void on_granted_break(evutil_socket_t fd, short what, void *arg)
{
    struct waiter *wt = arg;

    on_granted(fd, what, arg);
    event_base_loopbreak(wt->base);
}

static void on_guard(evutil_socket_t fd, short what, void *arg)
{
    *(bool *)arg = true;
}

Test(pacing_slots, hand_over_from_another_thread_wakes_the_loop)
{
    struct policy_state *ps = policy("one"); /* concurrency 1 */
    struct event_base *base = event_base_new();
    struct timeval guard_tv = {5, 0};
    struct releaser rel = {ps, 50};
    struct waiter holder, w;
    struct event *guard;
    bool timed_out = false;
    pthread_t th;
    int counter = 0;

    cr_assert_not_null(base);
    waiter_init(&holder, base, &counter);
    waiter_init(&w, base, &counter);
    event_free(w.w.granted_ev);
    w.w.granted_ev = event_new(base, -1, 0, on_granted_break, &w);
    guard = evtimer_new(base, on_guard, &timed_out);
    evtimer_add(guard, &guard_tv);

    cr_assert(pacing_slot_acquire(ps, &holder.w));
    cr_assert_not(pacing_slot_acquire(ps, &w.w));
    cr_assert_eq(pthread_create(&th, NULL, release_later, &rel), 0);
    event_base_dispatch(base); /* blocks until the grant (or the guard) */
    pthread_join(th, NULL);
    cr_expect_not(timed_out, "the loop was not woken by the cross-thread grant");
    cr_expect_eq(w.fired, 1);
    cr_expect(w.w.granted);
    cr_expect_eq(pacing_inflight(ps), 1, "the slot passed over, not freed");
    pacing_slot_release(ps);
    cr_expect_eq(pacing_inflight(ps), 0);

    event_free(guard);
    event_free(holder.w.granted_ev);
    event_free(w.w.granted_ev);
    event_base_free(base);
}

/* Threads that acquire, queue, cancel or get a hand-over, and release, all
 * at once: the limit is never exceeded and every slot comes back. */
#define N_THREADS 4
#define ROUNDS 3000

static _Atomic int holders, max_holders;

struct loop {
    struct policy_state *ps;
    int granted_late;
};

static void hold(struct loop *wk)
{
    int h = atomic_fetch_add(&holders, 1) + 1, m = atomic_load(&max_holders);

    while (h > m && !atomic_compare_exchange_weak(&max_holders, &m, h))
        ;
    atomic_fetch_sub(&holders, 1);
    pacing_slot_release(wk->ps);
}

static void *work(void *arg)
{
    struct loop *wk = arg;
    struct event_base *base = event_base_new();
    struct slot_waiter w = {0};

    w.granted_ev = event_new(base, -1, 0, on_guard, &(bool){false});
    for (int i = 0; i < ROUNDS; i++) {
        if (pacing_slot_acquire(wk->ps, &w)) {
            hold(wk);
        } else if (!pacing_slot_cancel(wk->ps, &w)) {
            /* granted between the two calls: the slot is ours */
            wk->granted_late++;
            hold(wk);
        }
    }
    event_free(w.granted_ev);
    event_base_free(base);
    return NULL;
}

Test(pacing_slots, threads_never_exceed_the_limit)
{
    struct policy_state *ps = policy("slots");
    struct loop wk[N_THREADS];
    pthread_t th[N_THREADS];

    atomic_store(&holders, 0);
    atomic_store(&max_holders, 0);
    for (int i = 0; i < N_THREADS; i++) {
        wk[i] = (struct loop){ps, 0};
        cr_assert_eq(pthread_create(&th[i], NULL, work, &wk[i]), 0);
    }
    for (int i = 0; i < N_THREADS; i++)
        pthread_join(th[i], NULL);
    cr_expect_leq(atomic_load(&max_holders), 2);
    cr_expect_geq(atomic_load(&max_holders), 1);
    cr_expect_eq(pacing_inflight(ps), 0, "every slot must come back");
    cr_expect(TAILQ_EMPTY(&ps->waiters));
}

/* A reload keeps the state of a policy whose numbers did not change, and
 * starts afresh the one whose numbers did. */
Test(pacing_partitions, reload_carries_unchanged_policies_over)
{
    struct pacing next;
    struct sc_config *cfg2 = NULL;
    struct sc_errors errs = {0};
    const char *yaml2 =
        "upstreams: {u: {url: http://127.0.0.1:1}}\n"
        "policies:\n"
        "  shared: {rate: 10/s, burst: 3}\n"
        "  tenant: {rate: 10/s, burst: 4, partition: {header: X-Tenant, max: 3}}\n"
        "routes: [{prefix: /, upstream: u, policy: shared}]\n";
    struct policy_state *old = pacing_policy(&pc, config_policy_index(cfg, "shared"));

    cr_assert_eq(config_load_string("t.yaml", yaml2, strlen(yaml2), &cfg2, &errs), 0);
    cr_assert_eq(pacing_init(&next, cfg2, &pc), 0);
    cr_expect_eq(pacing_policy(&next, config_policy_index(cfg2, "shared")), old,
                 "unchanged numbers: the same state");
    cr_expect_neq(pacing_policy(&next, config_policy_index(cfg2, "tenant")),
                  pacing_policy(&pc, config_policy_index(cfg, "tenant")),
                  "burst changed: a new state");
    pacing_free(&next);
    config_free(cfg2);
}

/* ---- pauses, as the admin listener reads and ends them ------------------------ */

struct seen {
    int n;
    char part[4][8];
    uint64_t until[4];
    enum pause_why why[4];
};

static void note_pause(void *arg, const char *partition, uint64_t until,
                       enum pause_why why)
{
    struct seen *s = arg;

    cr_assert_lt(s->n, 4);
    snprintf(s->part[s->n], sizeof s->part[0], "%s", partition ? partition : "-");
    s->until[s->n] = until;
    s->why[s->n++] = why;
}

TestSuite(pacing_pauses, .init = setup, .fini = teardown);

Test(pacing_pauses, running_pauses_are_listed_with_their_cause)
{
    struct policy_state *ps = policy("tenant");
    struct bucket *a = pacing_bucket(ps, "a", NOW0), *b = pacing_bucket(ps, "b", NOW0);
    struct seen s = {0};

    bucket_pause(&ps->bucket, NOW0, NOW0 + 5 * SEC, PAUSE_UPSTREAM_429);
    bucket_pause(a, NOW0, NOW0 + 2 * SEC, PAUSE_BREAKER);
    bucket_pause(b, NOW0, NOW0 + SEC, PAUSE_UPSTREAM_429);
    pacing_pauses(ps, NOW0 + SEC, note_pause, &s); /* b's has just ended */
    cr_assert_eq(s.n, 2);
    cr_expect_str_eq(s.part[0], "-");
    cr_expect_eq(s.until[0], NOW0 + 5 * SEC);
    cr_expect_eq(s.why[0], PAUSE_UPSTREAM_429);
    cr_expect_str_eq(s.part[1], "a");
    cr_expect_eq(s.why[1], PAUSE_BREAKER);
    cr_expect_str_eq(pause_why_name(PAUSE_BREAKER), "breaker");
    cr_expect_str_eq(pause_why_name(PAUSE_UPSTREAM_429), "upstream_429");
    /* The later moment wins, and with it its cause. */
    bucket_pause(&ps->bucket, NOW0, NOW0 + 9 * SEC, PAUSE_BREAKER);
    bucket_pause(&ps->bucket, NOW0, NOW0 + 3 * SEC, PAUSE_UPSTREAM_429);
    s.n = 0;
    pacing_pauses(ps, NOW0 + SEC, note_pause, &s);
    cr_expect_eq(s.until[0], NOW0 + 9 * SEC);
    cr_expect_eq(s.why[0], PAUSE_BREAKER);
}

Test(pacing_pauses, resume_ends_them_and_the_bucket_restarts_empty)
{
    struct policy_state *ps = policy("tenant"); /* 10/s burst 3 */
    struct bucket *a = pacing_bucket(ps, "a", NOW0);
    struct seen s = {0};

    bucket_pause(&ps->bucket, NOW0, NOW0 + 60 * SEC, PAUSE_UPSTREAM_429);
    bucket_pause(a, NOW0, NOW0 + 60 * SEC, PAUSE_UPSTREAM_429);
    cr_expect_not(try_now(&ps->bucket, NOW0 + SEC));
    cr_expect_eq(pacing_resume(ps, NOW0 + SEC), 2);
    pacing_pauses(ps, NOW0 + SEC, note_pause, &s);
    cr_expect_eq(s.n, 0);
    cr_expect_eq(atomic_load(&ps->bucket.cooldown_until), 0);
    /* one start at once, then one per T: empty, not full */
    cr_expect(try_now(&ps->bucket, NOW0 + SEC));
    cr_expect_not(try_now(&ps->bucket, NOW0 + SEC));
    cr_expect(try_now(&ps->bucket, NOW0 + SEC + T_10));
    cr_expect(try_now(a, NOW0 + SEC));
    cr_expect_eq(pacing_resume(ps, NOW0 + 2 * SEC), 0, "nothing left to end");
    cr_expect_eq(pacing_resume(policy("slots"), NOW0), 0, "no bucket, no pause");
}
