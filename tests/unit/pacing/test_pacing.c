/* pacing/pacing.c: the runtime state of policies (docs/contract.md §5).
 * Partitions: one bucket per header value, created full while there is
 * room and empty once creating one costs an eviction, at most `max` live,
 * the least recently used that is neither held nor paused evicted and coming
 * back empty (never full), pointers that stay valid memory. Concurrency
 * slots: FIFO waiters, hand-over by event_active (also from another thread),
 * cancel before and after grant, the lock-free count of policies without a
 * limit. A reload that changes a policy's numbers: the new state takes the
 * old one's over (levels, pauses, partitions, streak, slots, waiters). */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <errno.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "config/config.h"
#include "pacing/pacing.h"

#define SEC 1000000000ull
#define NOW0 (1000ull * SEC)
#define T_10 (SEC / 10) /* 10/s */

/* The grant wakes the waiter's loop, as the exchange's slot row does. */
static void activate(struct slot_waiter *w)
{
    event_active(w->arg, EV_TIMEOUT, 0);
}

static const char yaml[] =
    "upstreams: { up: { url: http://127.0.0.1:9000 } }\n"
    "policies:\n"
    "  tenant: { rate: 10/s, burst: 3, partition: { header: X-Tenant, max: 3 } }\n"
    "  wide: { rate: 10/s, burst: 3, partition: { header: X-Tenant, max: 200 } }\n"
    "  shared: { rate: 10/s, burst: 3 }\n"
    "  slots: { concurrency: 2 }\n"
    "  one: { concurrency: 1 }\n"
    "  free: { max_wait: 1s }\n"
    "  laned: { rate: 10/s, concurrency: 1, lanes: [{ name: interactive, share: 30% },\n"
    "           { name: batch, share: 70% }] }\n"
    "routes:\n"
    "  - { prefix: /a, upstream: up, policy: tenant }\n"
    "  - { prefix: /b, upstream: up, policy: wide }\n"
    "  - { prefix: /c, upstream: up, policy: shared }\n"
    "  - { prefix: /d, upstream: up, policy: slots }\n"
    "  - { prefix: /e, upstream: up, policy: one }\n"
    "  - { prefix: /f, upstream: up, policy: free }\n"
    "  - { prefix: /g, upstream: up, policy: laned }\n"
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

/* The bucket a request of partition `name` holds (until pacing_bucket_put). */
static struct bucket *hold_bucket(struct policy_state *ps, const char *name, uint64_t now)
{
    struct bucket *b = (struct bucket *)1;

    cr_assert_eq(pacing_bucket(ps, name, now, &b), 0, "no bucket for %s", name ? name : "-");
    return b;
}

/* The same for a request that is over at once: the pointer stays valid
 * memory, but no longer keeps the partition from eviction. */
static struct bucket *touch(struct policy_state *ps, const char *name, uint64_t now)
{
    struct bucket *b = hold_bucket(ps, name, now);

    pacing_bucket_put(b);
    return b;
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
    cr_expect_null(touch(pacing_policy(&pc, -1), NULL, NOW0));
    cr_expect_null(touch(policy("slots"), "x", NOW0));
    cr_expect_null(touch(policy("free"), NULL, NOW0));
    /* an unpartitioned policy has one bucket, whatever the header, and it
     * starts full */
    cr_expect_eq(touch(ps, NULL, NOW0), &ps->bucket);
    cr_expect_eq(touch(ps, "a", NOW0), &ps->bucket);
    cr_expect_not(ps->bucket.partition);
    for (int i = 0; i < 3; i++)
        cr_expect(try_now(&ps->bucket, NOW0), "burst start %d", i);
    cr_expect_not(try_now(&ps->bucket, NOW0));
    /* a partitioned policy without the header uses the policy's bucket */
    cr_expect_eq(touch(policy("tenant"), NULL, NOW0), &policy("tenant")->bucket);
    pacing_bucket_put(NULL); /* nothing held: nothing to do */
}

Test(pacing_partitions, one_bucket_per_value)
{
    struct policy_state *ps = policy("wide");
    struct bucket *a = touch(ps, "acme", NOW0);
    struct bucket *b = touch(ps, "globex", NOW0);

    cr_assert_not_null(a);
    cr_assert_not_null(b);
    cr_expect_neq(a, b);
    cr_expect_neq(a, &ps->bucket);
    cr_expect(a->partition);
    cr_expect_eq(touch(ps, "acme", NOW0 + 5), a);
    cr_expect_eq(touch(ps, "globex", NOW0 + 5), b);
    /* values are compared exactly */
    cr_expect_neq(touch(ps, "Acme", NOW0), a);
    cr_expect_neq(touch(ps, "acme ", NOW0), a);
    cr_expect_neq(touch(ps, "", NOW0), a);
    cr_expect_eq(touch(ps, "", NOW0), touch(ps, "", NOW0));
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
        seen[i] = touch(ps, name, NOW0);
        cr_assert_not_null(seen[i]);
        for (int k = 0; k < i; k++)
            cr_assert_neq(seen[i], seen[k], "%s shares a bucket with tenant-%d", name, k);
    }
    cr_expect_eq(ps->n_parts, 200);
    for (int i = 199; i >= 0; i--) {
        snprintf(name, sizeof name, "tenant-%d", i);
        cr_assert_eq(touch(ps, name, NOW0), seen[i], "%s moved", name);
    }
    cr_expect_eq(ps->n_parts, 200);
}

/* pacing.h: "created full while there is room; beyond `max` the least
 * recently used ... is recycled, and the new one starts empty". */
Test(pacing_partitions, new_partitions_start_full_while_there_is_room)
{
    struct policy_state *ps = policy("tenant"); /* burst 3, max 3 */
    const char *names[] = {"a", "b", "c"};
    struct bucket *d;
    uint64_t start = 0, next = 0;

    for (int i = 0; i < 3; i++) {
        struct bucket *b = touch(ps, names[i], NOW0);

        cr_assert_not_null(b);
        cr_expect_eq(atomic_load(&b->cooldown_until), 0);
        cr_expect_eq(gcra_available(&b->g, NOW0, NULL), 3, "%s", names[i]);
        for (int k = 0; k < 3; k++)
            cr_expect(try_now(b, NOW0), "%s: burst start %d", names[i], k);
        cr_expect_not(try_now(b, NOW0));
    }
    /* The table is full: the next new one costs an eviction and starts
     * empty, so its first reservation with max_wait 0 fails. */
    d = touch(ps, "d", NOW0);
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

/* A pause that is over leaves nothing behind in the next tenant of the
 * recycled memory. */
Test(pacing_partitions, recycled_partition_has_no_cooldown)
{
    struct policy_state *ps = policy("tenant");
    struct bucket *a = touch(ps, "a", NOW0), *d;

    touch(ps, "b", NOW0);
    touch(ps, "c", NOW0);
    bucket_pause(a, NOW0, NOW0 + SEC, PAUSE_UPSTREAM_429);
    d = touch(ps, "d", NOW0 + 2 * SEC); /* a's pause is over: a goes */
    cr_expect_eq(d, a, "the least recently used was not the one recycled");
    cr_expect_eq(atomic_load(&d->cooldown_until), 0);
    cr_expect(try_now(d, NOW0 + 2 * SEC + T_10), "the evicted one's pause leaked into d");
}

/* Finding: a tenant's 429 Retry-After was lost when more tenants than max
 * came, and its recycled memory paused whoever got it next. A paused
 * partition is kept until its pause ends; the others take free ones. */
Test(pacing_partitions, paused_partitions_are_never_evicted)
{
    struct policy_state *ps = policy("tenant"); /* max 3 */
    struct bucket *a = touch(ps, "a", NOW0), *b, *d;
    char name[16];

    bucket_pause(a, NOW0, NOW0 + 30 * SEC, PAUSE_UPSTREAM_429);
    b = touch(ps, "b", NOW0);
    touch(ps, "c", NOW0);
    /* a is the least recently used, but paused: b goes, then c, then d... */
    d = touch(ps, "d", NOW0 + SEC);
    cr_expect_eq(d, b);
    for (int i = 0; i < 50; i++) {
        snprintf(name, sizeof name, "n-%d", i);
        cr_assert_neq(touch(ps, name, NOW0 + SEC), a, "%s took paused a's memory", name);
    }
    cr_expect_eq(ps->n_parts, 3);
    cr_expect_eq(touch(ps, "a", NOW0 + 2 * SEC), a, "a is still a");
    cr_expect_eq(bucket_cooldown(a), NOW0 + 30 * SEC);
    cr_expect_not(try_now(a, NOW0 + 2 * SEC));
    /* its pause over, a is a partition like any other */
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "m-%d", i);
        touch(ps, name, NOW0 + 31 * SEC);
    }
    cr_expect_eq(touch(ps, "m-2", NOW0 + 31 * SEC), a, "a, free again, was not evicted in its turn");
    cr_expect_eq(bucket_cooldown(a), 0);
    cr_expect_eq(ps->n_parts, 3);
}

/* A request holding a partition (in flight, or waiting for its permit)
 * keeps it from eviction: its pointer always names its own tenant. */
Test(pacing_partitions, held_partitions_are_never_evicted)
{
    struct policy_state *ps = policy("tenant"); /* max 3 */
    struct bucket *a = hold_bucket(ps, "a", NOW0), *a2, *b;
    char name[16];

    touch(ps, "b", NOW0);
    touch(ps, "c", NOW0);
    for (int i = 0; i < 20; i++) {
        snprintf(name, sizeof name, "n-%d", i);
        cr_assert_neq(touch(ps, name, NOW0 + (uint64_t)i), a, "%s took held a's memory", name);
    }
    /* a second request of a holds it too: one put is not enough */
    a2 = hold_bucket(ps, "a", NOW0 + 100);
    cr_expect_eq(a2, a);
    cr_expect_eq(atomic_load(&a->holders), 2);
    pacing_bucket_put(a);
    for (int i = 20; i < 40; i++) {
        snprintf(name, sizeof name, "n-%d", i);
        cr_assert_neq(touch(ps, name, NOW0 + 200), a, "%s took held a's memory", name);
    }
    pacing_bucket_put(a2);
    cr_expect_eq(atomic_load(&a->holders), 0);
    /* free now: the next new names evict it in its turn */
    b = NULL;
    for (int i = 40; i < 43 && b != a; i++) {
        snprintf(name, sizeof name, "n-%d", i);
        b = touch(ps, name, NOW0 + 300);
    }
    cr_expect_eq(b, a, "a free partition was never evicted");
}

/* Every partition held or paused and the table full: no bucket (-EBUSY),
 * and no partition changes hands; room comes back as they end. */
Test(pacing_partitions, none_free_is_busy_until_one_is)
{
    struct policy_state *ps = policy("tenant"); /* max 3 */
    struct bucket *a = hold_bucket(ps, "a", NOW0), *b = hold_bucket(ps, "b", NOW0);
    struct bucket *c = touch(ps, "c", NOW0), *x = (struct bucket *)1;

    bucket_pause(c, NOW0, NOW0 + 5 * SEC, PAUSE_BREAKER);
    cr_expect_eq(pacing_bucket(ps, "x", NOW0 + SEC, &x), -EBUSY);
    cr_expect_null(x);
    cr_expect(ps->parts_full);
    cr_expect_eq(pacing_bucket(ps, "y", NOW0 + SEC, &x), -EBUSY);
    cr_expect_eq(ps->n_parts, 3);
    /* those it has still work */
    cr_expect_eq(touch(ps, "a", NOW0 + SEC), a);
    cr_expect_eq(touch(ps, "c", NOW0 + SEC), c);
    /* the pause ends: c is free, and x's request holds it */
    x = hold_bucket(ps, "x", NOW0 + 6 * SEC);
    cr_expect_eq(x, c);
    cr_expect_not(ps->parts_full);
    cr_expect_eq(pacing_bucket(ps, "y", NOW0 + 6 * SEC, &x), -EBUSY, "a, b, x held");
    pacing_bucket_put(b);
    cr_expect_eq(touch(ps, "y", NOW0 + 6 * SEC), b);
    pacing_bucket_put(a);
    pacing_bucket_put(c);
}

Test(pacing_partitions, lru_eviction_and_evicted_come_back_empty)
{
    struct policy_state *ps = policy("tenant"); /* max 3 */
    struct bucket *a, *b, *c, *d, *b2;
    const uint64_t later = NOW0 + 60 * SEC;

    a = touch(ps, "a", NOW0);
    b = touch(ps, "b", NOW0);
    c = touch(ps, "c", NOW0);
    cr_expect_eq(ps->n_parts, 3);
    /* a minute later all three have refilled to burst */
    cr_expect_eq(gcra_available(&b->g, later, NULL), 3);
    /* a and c are used again: b is the least recently used */
    cr_expect_eq(touch(ps, "a", later), a);
    cr_expect_eq(touch(ps, "c", later), c);
    cr_expect(try_now(a, later));                 /* a: 2 tokens left */
    d = touch(ps, "d", later);
    cr_expect_eq(ps->n_parts, 3, "at most max live partitions");
    /* a and c survived with their state */
    cr_expect_eq(touch(ps, "a", later), a);
    cr_expect_eq(touch(ps, "c", later), c);
    cr_expect_eq(gcra_available(&a->g, later, NULL), 2);
    cr_expect_eq(gcra_available(&c->g, later, NULL), 3);
    /* d is new: empty */
    cr_expect_not(try_now(d, later));
    /* b comes back (evicting d, now the least recently used): empty, not the
     * full bucket it was when it left */
    b2 = touch(ps, "b", later);
    cr_expect_eq(ps->n_parts, 3);
    cr_expect_eq(gcra_available(&b2->g, later, NULL), 0, "an evicted partition came back full");
    cr_expect_not(try_now(b2, later));
    cr_expect(try_now(b2, later + T_10));
    /* d was evicted by b: it too comes back empty */
    cr_expect_eq(touch(ps, "a", later), a);
    cr_expect_eq(touch(ps, "c", later), c);
    d = touch(ps, "d", later + 120 * SEC);
    cr_expect_not(try_now(d, later + 120 * SEC));
    /* and b, back once more (evicting a this time), is empty again */
    cr_expect_eq(gcra_available(&touch(ps, "b", later + 120 * SEC)->g,
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
        old[i] = touch(ps, name, NOW0);
    }
    /* churn through many more values than max */
    for (int i = 0; i < 100; i++) {
        snprintf(name, sizeof name, "new-%d", i);
        cr_assert_not_null(touch(ps, name, NOW0 + (uint64_t)i));
        cr_assert_leq(ps->n_parts, 3);
    }
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "new-%d", 97 + i);
        live[i] = touch(ps, name, NOW0 + 200);
    }
    /* A pointer kept past its put still reads and writes valid memory (ASan
     * would say otherwise): evicted partitions are recycled, never freed. */
    for (int i = 0; i < 3; i++) {
        bool found = false;

        gcra_reserve(&old[i]->g, NOW0 + 300, 10 * SEC, &start);
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
    wt->w.arg = event_new(base, -1, 0, on_granted, wt);
    wt->w.on_grant = activate;
    cr_assert_not_null(wt->w.arg);
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
        event_free(w[i].w.arg);
    event_base_free(base);
}

static int grant_seq;

static void note_grant(struct slot_waiter *w)
{
    *(int *)w->arg = ++grant_seq;
}

/* A policy with lanes hands its slots out by the lanes' shares, as its
 * permits: interactive requests queued behind ten batch ones get 3 of
 * every 10 slots, the first at once, not after the ten. */
Test(pacing_slots, slots_follow_the_lanes_shares)
{
    struct policy_state *ps = policy("laned");
    struct slot_waiter w[13];
    int order[13] = {0};

    grant_seq = 0;
    cr_expect(pacing_slot_acquire(ps, &(struct slot_waiter){0}));
    for (int i = 0; i < 13; i++) {
        w[i] = (struct slot_waiter){.on_grant = note_grant, .arg = &order[i],
                                    .lane = i < 10 ? 1 : 0};
        cr_expect_not(pacing_slot_acquire(ps, &w[i]));
    }
    cr_expect(pacing_slot_cancel(ps, &w[5]), "a batch waiter leaves its lane");
    for (int i = 0; i < 12; i++)
        pacing_slot_release(ps);
    cr_expect_eq(order[10], 1, "interactive went first (%d)", order[10]);
    cr_expect_leq(order[12], 8, "the third interactive was granted %dth", order[12]);
    for (int i = 1; i < 10; i++)
        if (i != 5 && i - 1 != 5)
            cr_expect_gt(order[i], order[i - 1], "batch in arrival order");
    cr_expect_eq(order[5], 0, "the one that left got nothing");
    pacing_slot_release(ps);
    cr_expect_eq(pacing_inflight(ps), 0);
}

/* The turn to ask the fleet for a slot (a fleet's lanes): one holder at a
 * time; it passes by the lanes' shares (interactive behind ten batch
 * waiters has it first), in arrival order within a lane; a waiter that
 * leaves gets nothing, one handed the turn meanwhile cannot cancel; the
 * last give frees it, and the next asker has it at once. */
Test(pacing_slots, the_fleets_turn_follows_the_lanes_shares)
{
    struct policy_state *ps = policy("laned");
    struct slot_waiter w[13], first = {0};
    int order[13] = {0};

    grant_seq = 0;
    cr_expect(pacing_turn_take(ps, &first), "nobody holds it: at once");
    for (int i = 0; i < 13; i++) {
        w[i] = (struct slot_waiter){.on_grant = note_grant, .arg = &order[i],
                                    .lane = i < 10 ? 1 : 0};
        cr_expect_not(pacing_turn_take(ps, &w[i]), "held: waiter %d queues", i);
    }
    cr_expect(pacing_turn_cancel(ps, &w[5]), "a batch waiter leaves its lane");
    pacing_turn_give(ps);
    cr_expect_eq(order[10], 1, "interactive has it first (%d)", order[10]);
    cr_expect_not(pacing_turn_cancel(ps, &w[10]), "handed over: not cancelled");
    for (int i = 0; i < 11; i++)
        pacing_turn_give(ps);
    cr_expect_leq(order[12], 8, "the third interactive had it %dth", order[12]);
    for (int i = 1; i < 10; i++)
        if (i != 5 && i - 1 != 5)
            cr_expect_gt(order[i], order[i - 1], "batch in arrival order");
    cr_expect_eq(order[5], 0, "the one that left got nothing");
    pacing_turn_give(ps);
    cr_expect(pacing_turn_take(ps, &first), "free again once the last gave it");
    pacing_turn_give(ps);
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
        event_free(w[i].w.arg);
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
    event_free(w.w.arg);
    w.w.arg = event_new(base, -1, 0, on_granted_break, &w);
    w.w.on_grant = activate;
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
    event_free(holder.w.arg);
    event_free(w.w.arg);
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

static void hold_slot(struct loop *wk)
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

    w.arg = event_new(base, -1, 0, on_guard, &(bool){false});
    w.on_grant = activate;
    for (int i = 0; i < ROUNDS; i++) {
        if (pacing_slot_acquire(wk->ps, &w)) {
            hold_slot(wk);
        } else if (!pacing_slot_cancel(wk->ps, &w)) {
            /* granted between the two calls: the slot is ours */
            wk->granted_late++;
            hold_slot(wk);
        }
    }
    event_free(w.arg);
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
 * makes a new one for the policy whose numbers did (which takes the old one
 * over at pacing_commit: the pacing_reload suite). */
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
    struct bucket *a = touch(ps, "a", NOW0), *b = touch(ps, "b", NOW0);
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
    struct bucket *a = touch(ps, "a", NOW0);
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

/* ---- a reload that changes the numbers --------------------------------------- */

static struct sc_config *cfg2;
static struct pacing next;

static void reload_fini(void)
{
    pacing_free(&next);
    config_free(cfg2);
    cfg2 = NULL;
    teardown();
}

TestSuite(pacing_reload, .init = setup, .fini = reload_fini);

/* A config of `policies` going into service at now after pc's, as
 * runtime_new does it: its states made, then pc's taken over. */
static void reload_to(struct pacing *out, struct sc_config **c, const struct pacing *prev,
                      const char *policies, uint64_t now)
{
    struct sc_errors errs = {0};
    char *y;

    cr_assert(asprintf(&y, "upstreams: {u: {url: http://127.0.0.1:1}}\npolicies:\n%s"
                           "routes: [{prefix: /, upstream: u}]\n", policies) > 0);
    cr_assert_eq(config_load_string("t2.yaml", y, strlen(y), c, &errs), 0, "%s", y);
    sc_errors_free(&errs);
    free(y);
    cr_assert_eq(pacing_init(out, *c, prev), 0);
    pacing_commit(out, now);
}

static struct policy_state *policy2(const char *name)
{
    long i = config_policy_index(cfg2, name);

    cr_assert_geq(i, 0, "no policy %s", name);
    return pacing_policy(&next, i);
}

/* Finding: 10 forwarded, a 429, a reload to new numbers, and 10 more went
 * at once. The tokens carry over, clamped, never raised; and what requests
 * of the old config do afterwards lands on the new bucket. */
Test(pacing_reload, the_bucket_keeps_its_tokens_and_the_old_one_forwards)
{
    struct policy_state *old = policy("shared"), *ps; /* 10/s burst 3 */

    cr_assert(try_now(&old->bucket, NOW0));
    cr_assert(try_now(&old->bucket, NOW0));
    reload_to(&next, &cfg2, &pc, "  shared: {rate: 20/s, burst: 10}\n", NOW0);
    ps = policy2("shared");
    cr_assert_neq(ps, old);
    cr_expect_eq(pacing_live(old), ps);
    cr_expect_eq(gcra_available(&ps->bucket.g, NOW0, NULL), 1, "a reload raised tokens");
    /* a request of the old config reserves through its own pointer */
    cr_expect(try_now(&old->bucket, NOW0));
    cr_expect_eq(gcra_available(&ps->bucket.g, NOW0, NULL), 0, "the old bucket is apart");
    cr_expect_not(try_now(&ps->bucket, NOW0));
    cr_expect_eq(gcra_available(&old->bucket.g, NOW0, NULL), 0);
    /* the send-side bucket too: two sends so far, one token left of 3 */
    cr_expect_eq(gcra_available(&ps->bucket.sent, NOW0, NULL), 3);
    /* then the new rate: 20/s */
    cr_expect(try_now(&ps->bucket, NOW0 + SEC / 20));
}

/* A policy that gains lanes grants permits from a token bucket: it starts
 * at the level the GCRA had (1 of 3 left), not full at its burst of 10. */
Test(pacing_reload, gaining_lanes_keeps_the_gcra_level)
{
    struct policy_state *old = policy("shared"), *ps; /* 10/s burst 3 */

    cr_assert(try_now(&old->bucket, NOW0));
    cr_assert(try_now(&old->bucket, NOW0));
    reload_to(&next, &cfg2, &pc,
              "  shared: {rate: 10/s, burst: 10, lanes: [{name: a, share: 50%},\n"
              "           {name: b, share: 50%}]}\n", NOW0);
    ps = policy2("shared");
    cr_assert_not_null(ps->bucket.pm);
    cr_expect_eq(bucket_available(&ps->bucket, NOW0, NULL), 1, "the level is not carried");
}

/* ... and one that had spent its burst waits for its GCRA's next token. */
Test(pacing_reload, gaining_quota_follow_keeps_an_empty_gcra_empty)
{
    struct policy_state *old = policy("shared"), *ps; /* 10/s burst 3 */
    uint64_t nx = 0;

    for (int i = 0; i < 3; i++)
        cr_assert(try_now(&old->bucket, NOW0));
    reload_to(&next, &cfg2, &pc,
              "  shared: {rate: 10/s, burst: 10, quota: {follow: true}}\n", NOW0);
    ps = policy2("shared");
    cr_assert_not_null(ps->bucket.pm);
    cr_expect_eq(bucket_available(&ps->bucket, NOW0, &nx), 0, "the level is not carried");
    cr_expect(nx >= 99 * SEC / 1000 && nx <= 101 * SEC / 1000, "next token in %llu ns",
              (unsigned long long)nx);
    cr_expect_eq(bucket_available(&ps->bucket, NOW0 + SEC / 10, NULL), 1);
}

Test(pacing_reload, pauses_and_the_breaker_streak_carry_over)
{
    struct policy_state *old = policy("shared"), *ps;
    struct seen s = {0};

    bucket_pause(&old->bucket, NOW0, NOW0 + 30 * SEC, PAUSE_UPSTREAM_429);
    atomic_store(&old->breaker.fail_streak, 2);
    reload_to(&next, &cfg2, &pc, "  shared: {rate: 100/s, burst: 50}\n", NOW0 + SEC);
    ps = policy2("shared");
    cr_expect_eq(bucket_cooldown(&ps->bucket), NOW0 + 30 * SEC);
    cr_expect_eq(bucket_cooldown(&old->bucket), NOW0 + 30 * SEC);
    cr_expect_not(try_now(&ps->bucket, NOW0 + 29 * SEC), "sent inside the pause");
    cr_expect_eq(gcra_available(&ps->bucket.g, NOW0 + 30 * SEC, NULL), 1, "resumes empty");
    cr_expect_eq(atomic_load(&pacing_breaker(old)->fail_streak), 2);
    cr_expect_eq(pacing_breaker(old), &ps->breaker);
    /* a late 429 of the old config pauses the new bucket */
    bucket_pause(&old->bucket, NOW0 + 2 * SEC, NOW0 + 60 * SEC, PAUSE_BREAKER);
    cr_expect_eq(bucket_cooldown(&ps->bucket), NOW0 + 60 * SEC);
    cr_expect_not(try_now(&ps->bucket, NOW0 + 59 * SEC));
    pacing_pauses(old, NOW0 + 2 * SEC, note_pause, &s);
    cr_assert_eq(s.n, 1);
    cr_expect_eq(s.why[0], PAUSE_BREAKER);
    /* and an operator's end of it, asked of either, ends it */
    cr_expect_eq(pacing_resume(old, NOW0 + 3 * SEC), 1);
    cr_expect_eq(bucket_cooldown(&ps->bucket), 0);
    cr_expect(try_now(&ps->bucket, NOW0 + 3 * SEC));
}

/* Partitions go over with their levels, pauses and holders; a partition's
 * old pointer forwards like the policy's bucket. */
Test(pacing_reload, partitions_carry_over_with_levels_pauses_and_holders)
{
    struct policy_state *old = policy("tenant"), *ps; /* 10/s burst 3 max 3 */
    struct bucket *a = touch(old, "a", NOW0), *b = touch(old, "b", NOW0);
    struct bucket *c = hold_bucket(old, "c", NOW0), *a2, *b2, *c2;

    bucket_pause(a, NOW0, NOW0 + 30 * SEC, PAUSE_UPSTREAM_429);
    for (int i = 0; i < 3; i++)
        cr_assert(try_now(b, NOW0));
    reload_to(&next, &cfg2, &pc,
              "  tenant: {rate: 5/s, burst: 3, partition: {header: X-Tenant, max: 3}}\n",
              NOW0 + 1);
    ps = policy2("tenant");
    cr_expect_eq(ps->n_parts, 3);
    a2 = touch(ps, "a", NOW0 + 1);
    b2 = touch(ps, "b", NOW0 + 1);
    cr_expect_eq(bucket_cooldown(a2), NOW0 + 30 * SEC, "a's pause was lost");
    cr_expect_eq(gcra_available(&b2->g, NOW0 + 1, NULL), 0, "b was refilled");
    c2 = touch(ps, "c", NOW0 + 1);
    cr_expect_eq(atomic_load(&c2->holders), 1, "c's request no longer holds it");
    /* the old pointers reach the new partitions */
    cr_expect_not(try_now(a, NOW0 + 2));
    bucket_pause(c, NOW0 + 2, NOW0 + 10 * SEC, PAUSE_UPSTREAM_429);
    cr_expect_eq(bucket_cooldown(c2), NOW0 + 10 * SEC);
    pacing_bucket_put(c);
    cr_expect_eq(atomic_load(&c2->holders), 0);
    /* a request of the old config asking for a partition gets the new one */
    cr_expect_eq(touch(old, "b", NOW0 + 3), b2);
}

/* A lower max keeps every partition held or paused (beyond max, for now);
 * the others left behind come back empty, never full. */
Test(pacing_reload, a_lower_max_keeps_what_is_held_or_paused)
{
    struct policy_state *old = policy("tenant"), *ps;
    struct bucket *a = touch(old, "a", NOW0), *c, *b2;

    touch(old, "b", NOW0);
    c = hold_bucket(old, "c", NOW0);
    bucket_pause(a, NOW0, NOW0 + 30 * SEC, PAUSE_UPSTREAM_429);
    reload_to(&next, &cfg2, &pc,
              "  tenant: {rate: 10/s, burst: 3, partition: {header: X-Tenant, max: 1}}\n",
              NOW0);
    ps = policy2("tenant");
    cr_expect_eq(ps->n_parts, 2, "c (held) and a (paused)");
    cr_expect_eq(bucket_cooldown(touch(ps, "a", NOW0)), NOW0 + 30 * SEC);
    /* b, full when it was left behind, comes back empty: the table is full */
    cr_expect_eq(pacing_bucket(ps, "b", NOW0, &b2), -EBUSY, "a paused, c held");
    pacing_bucket_put(c);
    b2 = touch(ps, "b", NOW0);
    cr_expect_eq(gcra_available(&b2->g, NOW0, NULL), 0, "a left-behind partition came back full");
    cr_expect_eq(ps->n_parts, 2);
}

struct waiter_set {
    struct event_base *base;
    struct waiter w[4];
    int counter;
};

static void waiters_init(struct waiter_set *ws)
{
    ws->base = event_base_new();
    cr_assert_not_null(ws->base);
    ws->counter = 0;
    for (int i = 0; i < 4; i++)
        waiter_init(&ws->w[i], ws->base, &ws->counter);
}

static void waiters_free(struct waiter_set *ws)
{
    for (int i = 0; i < 4; i++)
        event_free(ws->w[i].w.arg);
    event_base_free(ws->base);
}

/* Finding: concurrency 2 with 2 in flight, a reload to 3, and 5 were in
 * flight. The count carries over; waiters move, in order, and the new
 * limit grants them as it allows. */
Test(pacing_reload, slots_in_flight_count_and_waiters_are_granted_by_the_new_limit)
{
    struct policy_state *old = policy("slots"), *ps; /* concurrency 2 */
    struct waiter_set ws;

    waiters_init(&ws);
    cr_assert(pacing_slot_acquire(old, &ws.w[0].w));
    cr_assert(pacing_slot_acquire(old, &ws.w[1].w));
    cr_assert_not(pacing_slot_acquire(old, &ws.w[2].w));
    cr_assert_not(pacing_slot_acquire(old, &ws.w[3].w));
    reload_to(&next, &cfg2, &pc, "  slots: {concurrency: 3}\n", NOW0);
    ps = policy2("slots");
    run_pending(ws.base);
    cr_expect_eq(ws.w[2].fired, 1, "the oldest waiter fits the new limit");
    cr_expect_eq(ws.w[3].fired, 0);
    cr_expect_eq(pacing_inflight(ps), 3);
    cr_expect_eq(pacing_inflight(old), 3, "the old state reads the new count");
    cr_expect_not(pacing_slot_take(ps), "3 in flight: no 4th");
    /* a release of the old config frees a slot of the new: w3 gets it */
    pacing_slot_release(old);
    run_pending(ws.base);
    cr_expect_eq(ws.w[3].fired, 1);
    cr_expect_eq(pacing_inflight(ps), 3);
    for (int i = 0; i < 3; i++)
        pacing_slot_release(i ? ps : old);
    cr_expect_eq(pacing_inflight(ps), 0, "every slot came back");
    waiters_free(&ws);
}

Test(pacing_reload, a_lower_limit_grants_nobody_until_enough_are_back)
{
    struct policy_state *old = policy("slots"), *ps;
    struct waiter_set ws;

    waiters_init(&ws);
    cr_assert(pacing_slot_acquire(old, &ws.w[0].w));
    cr_assert(pacing_slot_acquire(old, &ws.w[1].w));
    cr_assert_not(pacing_slot_acquire(old, &ws.w[2].w));
    cr_assert_not(pacing_slot_acquire(old, &ws.w[3].w));
    reload_to(&next, &cfg2, &pc, "  slots: {concurrency: 1}\n", NOW0);
    ps = policy2("slots");
    /* a waiter of the old config leaves: found in the queue it moved to */
    cr_expect(pacing_slot_cancel(old, &ws.w[3].w));
    pacing_slot_release(old);
    run_pending(ws.base);
    cr_expect_eq(ws.w[2].fired, 0, "granted beyond the new limit");
    cr_expect_eq(pacing_inflight(ps), 1);
    pacing_slot_release(old);
    run_pending(ws.base);
    cr_expect_eq(ws.w[2].fired, 1);
    cr_expect_eq(pacing_inflight(ps), 1);
    pacing_slot_release(ps);
    cr_expect_eq(pacing_inflight(ps), 0);
    cr_expect_eq(ws.w[3].fired, 0);
    waiters_free(&ws);
}

/* Requests counted without a lock (no limit) before a reload that sets
 * one count against it, and their releases wake its waiters. */
Test(pacing_reload, unlimited_requests_count_against_a_new_limit)
{
    struct policy_state *old = policy("free"), *ps; /* no limit */
    struct waiter_set ws;

    waiters_init(&ws);
    cr_assert(pacing_slot_take(old));
    cr_assert(pacing_slot_take(old));
    pacing_slot_count(old); /* a shadow or fleet-slot request */
    reload_to(&next, &cfg2, &pc, "  free: {concurrency: 2, max_wait: 1s}\n", NOW0);
    ps = policy2("free");
    cr_expect_eq(pacing_inflight(ps), 3);
    cr_expect_not(pacing_slot_take(old), "an old request got past the new limit");
    cr_assert_not(pacing_slot_acquire(ps, &ws.w[0].w));
    pacing_slot_release(old);
    run_pending(ws.base);
    cr_expect_eq(ws.w[0].fired, 0, "2 in flight: at the limit");
    pacing_slot_release(old);
    run_pending(ws.base);
    cr_expect_eq(ws.w[0].fired, 1, "the release did not wake the waiter");
    pacing_slot_release(old);
    pacing_slot_release(ps);
    cr_expect_eq(pacing_inflight(ps), 0);
    waiters_free(&ws);
}

/* Two reloads: the first state still reaches the last; and the default
 * policy, unchanged, is kept rather than made anew. */
Test(pacing_reload, a_chain_of_reloads_and_the_default_policy)
{
    struct policy_state *old = policy("shared");
    struct sc_config *cfg3;
    struct pacing third;

    cr_assert(pacing_slot_take(pc.dflt));
    reload_to(&next, &cfg2, &pc, "  shared: {rate: 20/s, burst: 3}\n", NOW0);
    cr_expect_eq(next.dflt, pc.dflt);
    reload_to(&third, &cfg3, &next, "  shared: {rate: 1/s, burst: 2}\n", NOW0);
    cr_expect_eq(pacing_live(old), pacing_policy(&third, 0));
    cr_expect(try_now(&old->bucket, NOW0));
    cr_expect(try_now(&old->bucket, NOW0));
    cr_expect_not(try_now(&pacing_policy(&third, 0)->bucket, NOW0));
    cr_expect(try_now(&old->bucket, NOW0 + SEC));
    cr_expect_eq(pacing_inflight(third.dflt), 1);
    pacing_slot_release(pc.dflt);
    /* the oldest goes first, as when its last request ends */
    pacing_free(&pc);
    cr_expect(try_now(&pacing_policy(&next, 0)->bucket, NOW0 + 2 * SEC));
    pacing_free(&next);
    pacing_free(&third);
    config_free(cfg3);
    cr_assert_eq(pacing_init(&pc, cfg, NULL), 0); /* for the suite's end */
    cr_assert_eq(pacing_init(&next, cfg2, NULL), 0);
}
