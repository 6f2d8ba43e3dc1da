/* The end of a lease, announced (docs/reference/fleet.md, "Waiting
 * duplicates"): one thread of ours, with its own event loop, keeps the
 * subscribed connections (redis_conn.c) to the policies' channels
 * <prefix>{<scope>}:done and hands every key published there to the
 * caller's done, which wakes the key's waiters on their loops.
 *
 * One connection on a single Redis (SUBSCRIBE: a managed Redis 6 has no
 * sharded pub/sub), made to the primary of now and made again when the
 * sentinels name another; on a Redis Cluster one per primary that owns a
 * channel's slot (SSUBSCRIBE, Redis 7), the owners read from the slot map
 * (redis_cluster.c) every TICK_MS, a channel moved to another primary
 * subscribed there, and a channel Redis unsubscribes (its slot moved) or
 * redirects planned again. A lost connection is made again after
 * BACKOFF_MIN_MS, doubling up to BACKOFF_MAX_MS, as the loops' are.
 *
 * A subscribed connection mixes confirmations and messages with the
 * replies to its commands (RESP2 has no push type), so every reply, a
 * command's or not, is read by what it says, never by its place. A
 * channel counts as listened to (store_notified) only from its
 * confirmation until its connection goes: until then waiters poll. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "store/redis_slot.h"
#include "store/store_redis_internal.h"
#include "util/clock.h"

#define TICK_MS 100
#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 5000

struct chan {
    char name[REDIS_KEY_MAX];       /* <prefix>{<scope>}:done */
    char scope[RECORD_SCOPE_MAX + 1];
    int node;                       /* subscribed (or to be) there; -1: to plan */
    bool confirmed;                 /* Redis confirmed it on that node's connection */
};

/* One subscribed connection: per node on a cluster, else only [0]. */
struct sub {
    struct redis_notify *n;
    int node;
    struct redis_conn *c;           /* NULL while down */
    unsigned gen;                   /* single Redis: the primary's generation */
    unsigned backoff_ms;
    uint64_t retry_ns;              /* the next attempt, while down */
};

struct redis_notify {
    struct redis_store *st;
    pthread_mutex_t lock;           /* guards chans, n_chans, set_gen */
    pthread_mutex_t cb_lock;        /* held while done runs: a new set
                                       waits for the one running */
    struct chan *chans;
    size_t n_chans;
    unsigned set_gen, applied_gen;  /* a new set to subscribe to */
    store_done_fn *done;
    void *arg;
    atomic_uint_fast64_t notices;
    atomic_bool stop;
    struct redis_conn_opts opts;    /* the store's, without scripts */
    struct event_base *base;
    struct event *tick;
    pthread_t thread;
    struct sub sub[REDIS_NODES_MAX];
};

static bool sharded(const struct redis_notify *n)
{
    return n->st->cluster != NULL;
}

/* Under lock. */
static struct chan *chan_named(struct redis_notify *n, const char *name, size_t len)
{
    for (size_t i = 0; i < n->n_chans; i++)
        if (strlen(n->chans[i].name) == len && !memcmp(n->chans[i].name, name, len))
            return &n->chans[i];
    return NULL;
}

/* Under lock: the channels of s's node are no longer listened to. */
static void unconfirm(struct sub *s)
{
    for (size_t i = 0; i < s->n->n_chans; i++)
        if (s->n->chans[i].node == s->node)
            s->n->chans[i].confirmed = false;
}

static void sub_down(struct sub *s)
{
    uint64_t now = clock_mono_ns();

    s->c = NULL;
    s->retry_ns = now + (uint64_t)s->backoff_ms * NS_PER_MS;
    s->backoff_ms = s->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS
                                                       : s->backoff_ms * 2;
    pthread_mutex_lock(&s->n->lock);
    unconfirm(s);
    pthread_mutex_unlock(&s->n->lock);
}

/* Closed by us: its lost callback will find it is not s's any more. */
static void sub_close(struct sub *s)
{
    struct redis_conn *c = s->c;

    if (!c)
        return;
    s->c = NULL;
    pthread_mutex_lock(&s->n->lock);
    unconfirm(s);
    pthread_mutex_unlock(&s->n->lock);
    redis_conn_close(c);
}

static bool is_str(const redisReply *r, size_t i)
{
    return r->elements > i && r->element[i]->type == REDIS_REPLY_STRING;
}

/* A key published on one of our channels: handed on, outside the lock. */
static void on_message(struct sub *s, const redisReply *ch, const redisReply *key)
{
    struct redis_notify *n = s->n;
    char scope[RECORD_SCOPE_MAX + 1], k[RECORD_KEY_MAX + 1];
    struct chan *c;

    if (key->len > RECORD_KEY_MAX)
        return;
    memcpy(k, key->str, key->len);
    k[key->len] = '\0';
    pthread_mutex_lock(&n->cb_lock);
    pthread_mutex_lock(&n->lock);
    c = chan_named(n, ch->str, ch->len);
    if (c)
        memcpy(scope, c->scope, sizeof scope);
    pthread_mutex_unlock(&n->lock);
    if (c) {
        atomic_fetch_add(&n->notices, 1);
        n->done(n->arg, scope, k);
    }
    pthread_mutex_unlock(&n->cb_lock);
}

/* (s)subscribe confirms a channel on s; sunsubscribe (a slot moved away)
 * ends it there: it is planned again, after a fresh look at the map. */
static void on_subscription(struct sub *s, const redisReply *ch, bool on)
{
    struct chan *c;

    pthread_mutex_lock(&s->n->lock);
    c = chan_named(s->n, ch->str, ch->len);
    if (c && c->node == s->node)
        c->confirmed = on;
    if (c && !on && c->node == s->node)
        c->node = -1;
    pthread_mutex_unlock(&s->n->lock);
    if (on)
        s->backoff_ms = BACKOFF_MIN_MS;
    else
        redis_cluster_reask(s->n->st);
}

/* An error to a subscription: on a cluster a MOVED names the slot's
 * owner (the map learns it) and every channel of s is planned again; any
 * other (an ACL without the channel, a Redis too old for SSUBSCRIBE) ends
 * the connection, made again after the backoff, never in a spin. */
static void on_refused(struct sub *s, const redisReply *r)
{
    struct redis_redirect rd;
    struct redis_conn *c = s->c;
    int node;

    if (!sharded(s->n) || !redis_redirect_parse(r, &rd) || rd.ask) {
        sub_down(s);
        redis_conn_close(c);
        return;
    }
    if ((node = redis_cluster_node(s->n->st, rd.host, rd.hlen, rd.port)) >= 0)
        redis_cluster_moved(s->n->st, rd.slot, node);
    pthread_mutex_lock(&s->n->lock);
    for (size_t i = 0; i < s->n->n_chans; i++)
        if (s->n->chans[i].node == s->node && !s->n->chans[i].confirmed)
            s->n->chans[i].node = -1;
    pthread_mutex_unlock(&s->n->lock);
}

/* Every reply, a command's or not, read by what it says. */
static void on_pubsub(struct sub *s, const redisReply *r)
{
    const char *kind;

    if (r->type == REDIS_REPLY_ERROR) {
        on_refused(s, r);
        return;
    }
    if (r->type != REDIS_REPLY_ARRAY || !is_str(r, 0) || !is_str(r, 1))
        return;
    kind = r->element[0]->str;
    if ((!strcmp(kind, "message") || !strcmp(kind, "smessage")) && is_str(r, 2))
        on_message(s, r->element[1], r->element[2]);
    else if (!strcmp(kind, "subscribe") || !strcmp(kind, "ssubscribe"))
        on_subscription(s, r->element[1], true);
    else if (!strcmp(kind, "sunsubscribe") || !strcmp(kind, "unsubscribe"))
        on_subscription(s, r->element[1], false);
}

static void on_reply(struct redis_conn *c, redisReply *r, void *priv)
{
    struct sub *s = priv;

    if (r && c == s->c)
        on_pubsub(s, r);
}

static void on_push(struct redis_conn *c, redisReply *r, void *arg)
{
    on_reply(c, r, arg);
}

static void on_lost(struct redis_conn *c, int rc, const char *why, void *arg)
{
    struct sub *s = arg;

    if (c != s->c)
        return; /* closed by us, already replaced */
    sub_down(s);
    redis_sentinel_reask(s->n->st);
    redis_cluster_reask(s->n->st);
}

/* Sends the (S)SUBSCRIBE of one channel, or of all of s's on a single
 * Redis (one command: no message can come before its first confirmation). */
static void subscribe(struct sub *s, const char *const *names, size_t k)
{
    const char *argv[1 + 64];
    size_t len[1 + 64];

    while (k) {
        size_t m = sharded(s->n) ? 1 : k > 64 ? 64 : k;

        argv[0] = sharded(s->n) ? "SSUBSCRIBE" : "SUBSCRIBE";
        len[0] = strlen(argv[0]);
        for (size_t i = 0; i < m; i++) {
            argv[1 + i] = names[i];
            len[1 + i] = strlen(names[i]);
        }
        if (redis_conn_send_argv(s->c, (int)(1 + m), argv, len, on_reply, s) != 0)
            return; /* closing: its lost callback follows */
        names += m;
        k -= m;
    }
}

/* The channels planned on s's node, not yet confirmed, into names (their
 * copies in buf). */
static size_t pending_names(struct sub *s, char (*buf)[REDIS_KEY_MAX],
                            const char **names, size_t cap)
{
    size_t k = 0;

    pthread_mutex_lock(&s->n->lock);
    for (size_t i = 0; i < s->n->n_chans && k < cap; i++)
        if (s->n->chans[i].node == s->node && !s->n->chans[i].confirmed) {
            memcpy(buf[k], s->n->chans[i].name, REDIS_KEY_MAX);
            names[k] = buf[k];
            k++;
        }
    pthread_mutex_unlock(&s->n->lock);
    return k;
}

#define SUBSCRIBE_MAX 256

static void subscribe_pending(struct sub *s)
{
    static char buf[SUBSCRIBE_MAX][REDIS_KEY_MAX]; /* the thread's only */
    const char *names[SUBSCRIBE_MAX];
    size_t k = pending_names(s, buf, names, SUBSCRIBE_MAX);

    if (k)
        subscribe(s, names, k);
}

static void sub_open(struct sub *s)
{
    struct redis_notify *n = s->n;
    struct redis_conn_events ev = {.lost = on_lost, .push = on_push, .arg = s};
    char host[REDIS_HOST_MAX];
    unsigned port;
    struct sc_error err;

    if (sharded(n))
        redis_cluster_addr(n->st, s->node, host, &port);
    else
        redis_primary(n->st, host, &port, &s->gen);
    if (redis_conn_open(n->base, host, port, &n->opts, &ev, &s->c, &err) != 0) {
        sub_down(s);
        return;
    }
    subscribe_pending(s);
}

/* Under lock: where each channel belongs now; a channel whose owner
 * changed is unconfirmed there and subscribed anew (resend). used: the
 * nodes with channels. */
static void plan(struct redis_notify *n, bool used[REDIS_NODES_MAX],
                 bool resend[REDIS_NODES_MAX])
{
    for (size_t i = 0; i < n->n_chans; i++) {
        struct chan *c = &n->chans[i];
        int owner = sharded(n) ? redis_cluster_owner(n->st, redis_key_slot(c->name,
                                                                      strlen(c->name)))
                               : 0;

        if (owner < 0)
            continue; /* unknown: the cluster thread is asked already */
        if (owner != c->node) {
            c->node = owner;
            c->confirmed = false;
            resend[owner] = true;
        }
        used[owner] = true;
    }
}

static void tick_subs(struct redis_notify *n)
{
    bool used[REDIS_NODES_MAX] = {0}, resend[REDIS_NODES_MAX] = {0}, fresh;
    uint64_t now = clock_mono_ns();

    pthread_mutex_lock(&n->lock);
    fresh = n->set_gen != n->applied_gen;
    n->applied_gen = n->set_gen;
    plan(n, used, resend);
    pthread_mutex_unlock(&n->lock);
    for (int i = 0; i < REDIS_NODES_MAX; i++) {
        struct sub *s = &n->sub[i];

        /* A new set, a primary that moved, or a node without channels:
         * closed (a new set is subscribed afresh, whole). */
        if (s->c && (fresh || !used[i] ||
                     (!sharded(n) && s->gen != redis_primary_gen(n->st))))
            sub_close(s);
        if (!used[i])
            continue;
        if (!s->c && now >= s->retry_ns)
            sub_open(s);
        else if (s->c && resend[i])
            subscribe_pending(s);
    }
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    struct redis_notify *n = arg;

    if (atomic_load(&n->stop)) {
        for (int i = 0; i < REDIS_NODES_MAX; i++)
            sub_close(&n->sub[i]);
        event_base_loopbreak(n->base);
        return;
    }
    tick_subs(n);
}

static void *follow(void *arg)
{
    struct redis_notify *n = arg;

    tick_subs(n); /* subscribed at once, not a tick after start-up */
    event_base_loop(n->base, EVLOOP_NO_EXIT_ON_EMPTY);
    return NULL;
}

static void notify_free(struct redis_notify *n)
{
    if (n->tick)
        event_free(n->tick);
    if (n->base)
        event_base_free(n->base);
    pthread_mutex_destroy(&n->lock);
    pthread_mutex_destroy(&n->cb_lock);
    free(n->chans);
    free(n);
}

static int notify_new(struct redis_store *st, store_done_fn *done, void *arg,
                      struct sc_error *err)
{
    struct redis_notify *n = calloc(1, sizeof *n);
    struct timeval tv = clock_ms_to_tv(TICK_MS);
    int rc;

    if (!n) {
        sc_error_set(err, "store: out of memory");
        return -ENOMEM;
    }
    pthread_mutex_init(&n->lock, NULL);
    pthread_mutex_init(&n->cb_lock, NULL);
    n->st = st;
    n->done = done;
    n->arg = arg;
    n->opts = st->conn;
    n->opts.preload = NULL; /* a subscriber calls no script */
    n->opts.n_preload = 0;
    for (int i = 0; i < REDIS_NODES_MAX; i++)
        n->sub[i] = (struct sub){.n = n, .node = i, .backoff_ms = BACKOFF_MIN_MS};
    if (!(n->base = event_base_new()) ||
        !(n->tick = event_new(n->base, -1, EV_PERSIST, on_tick, n)) ||
        event_add(n->tick, &tv) != 0) {
        notify_free(n);
        sc_error_set(err, "store: cannot set up the notices' loop");
        return -ENOMEM;
    }
    if ((rc = pthread_create(&n->thread, NULL, follow, n)) != 0) {
        notify_free(n);
        sc_error_set(err, "store: cannot start the notices' thread: %s", strerror(rc));
        return -rc;
    }
    st->notify = n;
    return 0;
}

/* The channels of scopes, planned nowhere yet. */
static struct chan *chans_of(const struct redis_store *st, const char *const *scopes,
                             size_t k)
{
    struct chan *c = calloc(k ? k : 1, sizeof *c);

    for (size_t i = 0; c && i < k; i++) {
        snprintf(c[i].name, sizeof c[i].name, "%s{%s}:done", st->prefix, scopes[i]);
        snprintf(c[i].scope, sizeof c[i].scope, "%s", scopes[i]);
        c[i].node = -1;
    }
    return c;
}

/* Whether the channels listened to are those of scopes already (a reload
 * that leaves them: nothing to subscribe again). */
static bool same_set(struct redis_notify *n, const char *const *scopes, size_t k)
{
    bool same;

    pthread_mutex_lock(&n->lock);
    same = n->n_chans == k;
    for (size_t i = 0; same && i < k; i++)
        same = !strcmp(n->chans[i].scope, scopes[i]);
    pthread_mutex_unlock(&n->lock);
    return same;
}

int redis_notify_set(struct redis_store *st, const char *const *scopes, size_t k,
                     store_done_fn *done, void *arg, struct sc_error *err)
{
    struct chan *c, *old;
    int rc;

    for (size_t i = 0; i < k; i++)
        if ((rc = redis_scope_check(scopes[i], err)) != 0)
            return rc;
    if (!st->notify && k == 0)
        return 0;
    if (!st->notify && (rc = notify_new(st, done, arg, err)) != 0)
        return rc;
    if (same_set(st->notify, scopes, k))
        return 0;
    if (!(c = chans_of(st, scopes, k))) {
        sc_error_set(err, "store: out of memory");
        return -ENOMEM;
    }
    pthread_mutex_lock(&st->notify->lock);
    old = st->notify->chans;
    st->notify->chans = c;
    st->notify->n_chans = k;
    st->notify->set_gen++;
    pthread_mutex_unlock(&st->notify->lock);
    /* Once it returns no done runs for a scope of the old set only (the
     * caller may free what done reaches: app_free's loops). */
    pthread_mutex_lock(&st->notify->cb_lock);
    pthread_mutex_unlock(&st->notify->cb_lock);
    free(old);
    return 0;
}

bool redis_notified(struct redis_store *st, const char *scope)
{
    struct redis_notify *n = st->notify;
    bool up = false;

    if (!n)
        return false;
    pthread_mutex_lock(&n->lock);
    for (size_t i = 0; i < n->n_chans; i++)
        if (!strcmp(n->chans[i].scope, scope)) {
            up = n->chans[i].confirmed;
            break;
        }
    pthread_mutex_unlock(&n->lock);
    return up;
}

uint64_t redis_notices(struct redis_store *st)
{
    return st->notify ? atomic_load(&st->notify->notices) : 0;
}

void redis_notify_stop(struct redis_store *st)
{
    struct redis_notify *n = st->notify;

    if (!n)
        return;
    /* Seen at the next tick (no cross-thread activation: a store opened
     * without libevent's locking still closes safely). */
    atomic_store(&n->stop, true);
    pthread_join(n->thread, NULL);
    notify_free(n);
    st->notify = NULL;
}
