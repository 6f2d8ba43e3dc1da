/* Group commit (group_commit.h). One mutex guards the queue of waiting
 * calls, every loop's list of calls ready to complete, and the sequence
 * numbers; nobody holds it across a sync. The committer thread never touches
 * a store_call: it moves nodes, and each loop completes its own calls, so a
 * loop may cancel a call (even one on its stack) at any moment. */
#define _GNU_SOURCE
#include "store/group_commit.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/queue.h>
#include <unistd.h>

#include <event2/event.h>

struct gc_loop;

/* A call waiting for its ticket, on the queue, then on its loop's list. */
struct gc_node {
    TAILQ_ENTRY(gc_node) link;
    struct store_call *c;
    struct gc_loop *loop;
    uint64_t ticket;
    int rc;         /* the call's result, reported once durable */
    bool ready;     /* on loop->ready, not on the queue */
    bool failed;    /* the sync that was to cover it failed */
};

TAILQ_HEAD(gc_list, gc_node);

struct gc_loop {
    struct store_loop base; /* first: what callers hold */
    struct group_commit *gc;
    struct event *ev;       /* efd readable: ready has calls */
    int efd;
    struct gc_list ready;   /* covered (or failed), to complete here */
};

struct group_commit {
    group_commit_sync_fn sync;
    void *arg;
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    _Atomic uint64_t written; /* the newest write's number */
    uint64_t synced;          /* durable up to here */
    bool stop;
    bool broken;              /* a sync failed: nothing newer is durable */
    char failure[sizeof ((struct sc_error *)0)->text];
    struct gc_list queue;     /* waiting for a sync */
    uint64_t n_syncs, n_calls;
};

/* ---- lists (under mu) ---- */

static struct gc_list *list_of(struct gc_node *n)
{
    return n->ready ? &n->loop->ready : &n->loop->gc->queue;
}

/* ---- the committer thread ---- */

/* Hands n to its loop; the loop is woken when its list was empty (else a
 * wake-up is pending already: the loop empties the list on each). */
static void hand_over(struct group_commit *gc, struct gc_node *n, bool failed)
{
    struct gc_loop *gl = n->loop;
    uint64_t one = 1;
    bool was_empty = TAILQ_EMPTY(&gl->ready);

    TAILQ_REMOVE(&gc->queue, n, link);
    n->ready = true;
    n->failed = failed;
    TAILQ_INSERT_TAIL(&gl->ready, n, link);
    if (was_empty && write(gl->efd, &one, sizeof one) < 0) {
        /* Only EAGAIN is possible (the counter near its limit): the loop
         * has a wake-up pending already. */
    }
}

/* After a sync: calls it covers go to their loops; after a failed one,
 * every waiting call fails. */
static void settle(struct group_commit *gc)
{
    struct gc_node *n = TAILQ_FIRST(&gc->queue), *next;

    for (; n; n = next) {
        next = TAILQ_NEXT(n, link);
        if (gc->broken || n->ticket <= gc->synced)
            hand_over(gc, n, gc->broken && n->ticket > gc->synced);
    }
}

static void *committer(void *arg)
{
    struct group_commit *gc = arg;
    struct sc_error err;
    uint64_t target;
    int rc;

    pthread_mutex_lock(&gc->mu);
    for (;;) {
        while (!gc->stop &&
               (gc->broken || atomic_load(&gc->written) <= gc->synced))
            pthread_cond_wait(&gc->cv, &gc->mu);
        if (gc->stop)
            break;
        /* Every write numbered up to target returned before this load, so
         * the sync below covers it. */
        target = atomic_load(&gc->written);
        pthread_mutex_unlock(&gc->mu);
        memset(&err, 0, sizeof err);
        rc = gc->sync(gc->arg, &err);
        pthread_mutex_lock(&gc->mu);
        gc->n_syncs++;
        if (rc) {
            gc->broken = true;
            snprintf(gc->failure, sizeof gc->failure, "%s", err.text);
        } else if (target > gc->synced)
            gc->synced = target;
        settle(gc);
    }
    pthread_mutex_unlock(&gc->mu);
    return NULL;
}

int group_commit_open(group_commit_sync_fn sync, void *arg,
                      struct group_commit **out, struct sc_error *err)
{
    struct group_commit *gc = calloc(1, sizeof *gc);

    *out = NULL;
    if (!gc) {
        sc_error_set(err, "store: out of memory");
        return -ENOMEM;
    }
    gc->sync = sync;
    gc->arg = arg;
    pthread_mutex_init(&gc->mu, NULL);
    TAILQ_INIT(&gc->queue);
    pthread_cond_init(&gc->cv, NULL);
    if (pthread_create(&gc->thread, NULL, committer, gc) != 0) {
        sc_error_set(err, "store: cannot start the group commit thread");
        group_commit_close(gc);
        return -EAGAIN;
    }
    gc->started = true;
    *out = gc;
    return 0;
}

void group_commit_close(struct group_commit *gc)
{
    struct gc_node *n;

    if (!gc)
        return;
    if (gc->started) {
        pthread_mutex_lock(&gc->mu);
        gc->stop = true;
        pthread_cond_signal(&gc->cv);
        pthread_mutex_unlock(&gc->mu);
        pthread_join(gc->thread, NULL);
    }
    /* Empty when every loop was freed first, as it must be. */
    while ((n = TAILQ_FIRST(&gc->queue)) != NULL) {
        TAILQ_REMOVE(&gc->queue, n, link);
        n->c->pending = NULL;
        free(n);
    }
    pthread_cond_destroy(&gc->cv);
    pthread_mutex_destroy(&gc->mu);
    free(gc);
}

uint64_t group_commit_note(struct group_commit *gc)
{
    return atomic_fetch_add(&gc->written, 1) + 1;
}

void group_commit_stats(struct group_commit *gc, uint64_t *syncs,
                        uint64_t *calls)
{
    pthread_mutex_lock(&gc->mu);
    *syncs = gc->n_syncs;
    *calls = gc->n_calls;
    pthread_mutex_unlock(&gc->mu);
}

/* ---- on a loop ---- */

/* No result from a write that may not be durable. */
static int fail_call(struct store_call *c, int rc, const char *why)
{
    store_record_clear(&c->rec);
    store_record_clear(&c->acq.rec);
    c->rc = rc;
    sc_error_set(&c->err, "%s", why);
    return rc;
}

static void complete(struct group_commit *gc, struct gc_node *n)
{
    struct store_call *c = n->c;

    c->pending = NULL;
    if (n->failed)
        fail_call(c, -EIO, gc->failure);
    else
        c->rc = n->rc;
    free(n);
    c->done(c);
}

/* One call at a time, the lock taken for each: a done may cancel another
 * call of this loop, which must then be on a list still. */
static void on_ready(evutil_socket_t fd, short what, void *arg)
{
    struct gc_loop *gl = arg;
    struct group_commit *gc = gl->gc;
    struct gc_node *n;
    uint64_t count;

    if (read(fd, &count, sizeof count) < 0) {
        /* EAGAIN: a spurious wake-up; the list says what there is. */
    }
    for (;;) {
        pthread_mutex_lock(&gc->mu);
        if ((n = TAILQ_FIRST(&gl->ready)) != NULL) {
            TAILQ_REMOVE(&gl->ready, n, link);
            gc->n_calls++;
        }
        pthread_mutex_unlock(&gc->mu);
        if (!n)
            break;
        complete(gc, n);
    }
}

int group_commit_loop_new(struct group_commit *gc, struct store *st,
                          struct event_base *base, struct store_loop **out,
                          struct sc_error *err)
{
    struct gc_loop *gl = calloc(1, sizeof *gl);

    *out = NULL;
    if (!gl) {
        sc_error_set(err, "store: out of memory");
        return -ENOMEM;
    }
    gl->base.st = st;
    gl->base.base = base;
    gl->gc = gc;
    TAILQ_INIT(&gl->ready);
    gl->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (gl->efd < 0)
        goto fail;
    gl->ev = event_new(base, gl->efd, EV_READ | EV_PERSIST, on_ready, gl);
    if (!gl->ev || event_add(gl->ev, NULL) != 0)
        goto fail;
    *out = &gl->base;
    return 0;
fail:
    sc_error_set(err, "store: cannot set up the group commit on a loop");
    group_commit_loop_free(&gl->base);
    return -ENOMEM;
}

/* Drops this loop's nodes from l; the calls stay the callers'. */
static void drop_nodes(struct gc_list *l, struct gc_loop *gl)
{
    struct gc_node *n = TAILQ_FIRST(l), *next;

    for (; n; n = next) {
        next = TAILQ_NEXT(n, link);
        if (n->loop != gl)
            continue;
        TAILQ_REMOVE(l, n, link);
        n->c->pending = NULL;
        free(n);
    }
}

void group_commit_loop_free(struct store_loop *sl)
{
    struct gc_loop *gl = (struct gc_loop *)sl;
    struct group_commit *gc;

    if (!gl)
        return;
    gc = gl->gc;
    pthread_mutex_lock(&gc->mu);
    drop_nodes(&gc->queue, gl);
    drop_nodes(&gl->ready, gl);
    pthread_mutex_unlock(&gc->mu);
    /* From here the committer finds no node of this loop: it never writes
     * to efd again. */
    if (gl->ev)
        event_free(gl->ev);
    if (gl->efd >= 0)
        close(gl->efd);
    free(gl);
}

struct gc_node *group_commit_node_new(void)
{
    return calloc(1, sizeof (struct gc_node));
}

int group_commit_wait(struct store_loop *sl, struct store_call *c,
                      struct gc_node *n, uint64_t ticket, int rc)
{
    struct gc_loop *gl = (struct gc_loop *)sl;
    struct group_commit *gc = gl->gc;
    bool queued = false, broken = false;

    pthread_mutex_lock(&gc->mu);
    if (ticket <= gc->synced) {
        /* durable already (or nothing to wait for): rc and its message
         * stand, a failed write's included */
    } else if (gc->broken) {
        broken = true;
    } else {
        n->c = c;
        n->loop = gl;
        n->ticket = ticket;
        n->rc = rc;
        TAILQ_INSERT_TAIL(&gc->queue, n, link);
        c->pending = n;
        pthread_cond_signal(&gc->cv);
        queued = true;
    }
    pthread_mutex_unlock(&gc->mu);
    if (queued)
        return -EINPROGRESS;
    free(n);
    /* gc->failure is written once, before broken is set under mu */
    return broken ? fail_call(c, -EIO, gc->failure) : rc;
}

void group_commit_cancel(struct store_call *c)
{
    struct gc_node *n = c->pending;
    struct group_commit *gc = n->loop->gc;

    pthread_mutex_lock(&gc->mu);
    TAILQ_REMOVE(list_of(n), n, link);
    pthread_mutex_unlock(&gc->mu);
    free(n);
}
