/* The Redis primary, found and followed through Sentinel (docs/contract.md
 * §10, `store.sentinels` and `store.master`).
 *
 * The address every connection is made to (blocking or per loop) lives in
 * the store under primary_lock with a generation number; connections
 * compare generations to know they are stale. Without sentinels it is the
 * url's and never changes.
 *
 * With sentinels, one thread of ours keeps it current, so no event loop
 * ever waits on a sentinel: it asks `SENTINEL get-master-addr-by-name`
 * of each sentinel in turn (starting with the last one that answered),
 * listens for `+switch-master` on one of them to hear of a failover at
 * once, asks again every POLL_MS in case that notice is lost, and asks at
 * once (at most every REASK_GAP_MS) when a connection to the primary fails
 * or is refused a write. A sentinel that does not answer keeps the address
 * sluice has: the url's host at first, a guess, then the last one named.
 * Sentinels are asked without AUTH; the url's password is the primary's.
 * With a rediss:// url they are reached over TLS, with store.tls.
 *
 * The thread uses the store's blocking connections (redis_conn.c), each
 * call bounded by timeout_ms, and sleeps on the subscription and a pipe
 * that wakes it. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store/store_redis_internal.h"
#include "util/clock.h"

#define POLL_MS 1000
#define REASK_GAP_MS 100
#define MASTER_MAX 128

struct redis_sentinel {
    struct redis_store *st;
    struct store_redis_addr addr[STORE_SENTINELS_MAX];
    char host[STORE_SENTINELS_MAX][REDIS_HOST_MAX];
    unsigned n;
    unsigned first;              /* the one to ask first */
    char master[MASTER_MAX];
    pthread_t thread;
    bool running;
    int wake[2];                 /* written to wake the thread */
    atomic_bool stop, reask;
    struct redis_sync *ask;      /* a question's connection */
    struct redis_sync *sub;      /* subscribed to +switch-master while open */
};

static void on_notice(const redisReply *r, void *arg);

/* ---- the primary's address ---- */

void redis_primary(struct redis_store *st, char host[REDIS_HOST_MAX],
                   unsigned *port, unsigned *gen)
{
    pthread_mutex_lock(&st->primary_lock);
    memcpy(host, st->host, REDIS_HOST_MAX);
    *port = st->port;
    *gen = atomic_load(&st->primary_gen);
    pthread_mutex_unlock(&st->primary_lock);
}

unsigned redis_primary_gen(struct redis_store *st)
{
    return atomic_load(&st->primary_gen);
}

static void primary_set(struct redis_store *st, const char *host, unsigned port)
{
    if (strlen(host) >= REDIS_HOST_MAX || port == 0 || port > 65535)
        return;
    pthread_mutex_lock(&st->primary_lock);
    if (strcmp(st->host, host) != 0 || st->port != port) {
        snprintf(st->host, sizeof st->host, "%s", host);
        st->port = port;
        atomic_fetch_add(&st->primary_gen, 1);
    }
    pthread_mutex_unlock(&st->primary_lock);
}

/* ---- asking a sentinel ---- */

static bool sentinel_connect(struct redis_sentinel *s, struct redis_sync *c,
                             unsigned i)
{
    struct sc_error err;

    return redis_sync_connect(c, s->addr[i].host, s->addr[i].port,
                              &s->st->sentinel_conn, &err) == 0;
}

/* The port of a reply's string element: 0 when it is not one. */
static unsigned port_of(const redisReply *r)
{
    char buf[8], *end;
    unsigned long v;

    if (r->type != REDIS_REPLY_STRING || r->len == 0 || r->len >= sizeof buf)
        return 0;
    memcpy(buf, r->str, r->len);
    buf[r->len] = '\0';
    v = strtoul(buf, &end, 10);
    return *end || v > 65535 ? 0 : (unsigned)v;
}

/* One sentinel's answer for master: 0 (the primary set), or -1. */
static int ask_one(struct redis_sentinel *s, unsigned i)
{
    const char *argv[] = {"SENTINEL", "get-master-addr-by-name", s->master};
    size_t len[] = {8, 23, strlen(s->master)};
    struct sc_error err;
    redisReply *r = NULL;
    int rc = -1;

    if (!sentinel_connect(s, s->ask, i))
        return -1;
    redis_sync_command(s->ask, 3, argv, len, &r, &err);
    if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
        r->element[0]->type == REDIS_REPLY_STRING &&
        r->element[0]->len < REDIS_HOST_MAX && port_of(r->element[1])) {
        primary_set(s->st, r->element[0]->str, port_of(r->element[1]));
        rc = 0;
    }
    freeReplyObject(r);
    redis_sync_drop(s->ask);
    return rc;
}

/* Each sentinel in turn until one names the primary; that one is asked
 * first next time. -1 when none could. */
static int ask_all(struct redis_sentinel *s)
{
    for (unsigned k = 0; k < s->n; k++) {
        unsigned i = (s->first + k) % s->n;

        if (ask_one(s, i) == 0) {
            s->first = i;
            return 0;
        }
    }
    return -1;
}

/* ---- the +switch-master subscription ---- */

static bool sub_live(struct redis_sentinel *s)
{
    return redis_sync_open(s->sub);
}

/* On the sentinel that answered last; the notice's channel is the same on
 * every sentinel. No subscription (polling only) when it fails. */
static void sub_open(struct redis_sentinel *s)
{
    const char *argv[] = {"SUBSCRIBE", "+switch-master"};
    size_t len[] = {9, 14};
    struct sc_error err;
    redisReply *r = NULL;

    if (!sentinel_connect(s, s->sub, s->first))
        return;
    redis_sync_command(s->sub, 2, argv, len, &r, &err);
    if (!r || r->type != REDIS_REPLY_ARRAY)
        redis_sync_drop(s->sub);
    freeReplyObject(r);
}

/* "+switch-master <master> <old-ip> <old-port> <new-ip> <new-port>" */
static void on_notice(const redisReply *r, void *arg)
{
    struct redis_sentinel *s = arg;
    char text[REDIS_HOST_MAX * 2 + MASTER_MAX + 32], *save = NULL, *w[5];
    const redisReply *msg;
    int n = 0;
    char *end;
    unsigned long port;

    if (r->type != REDIS_REPLY_ARRAY || r->elements != 3)
        return;
    msg = r->element[2];
    if (msg->type != REDIS_REPLY_STRING || msg->len >= sizeof text)
        return;
    memcpy(text, msg->str, msg->len);
    text[msg->len] = '\0';
    for (char *t = strtok_r(text, " ", &save); t && n < 5;
         t = strtok_r(NULL, " ", &save))
        w[n++] = t;
    if (n < 5 || strcmp(w[0], s->master) != 0)
        return;
    port = strtoul(w[4], &end, 10);
    if (!*end)
        primary_set(s->st, w[3], (unsigned)port);
}

/* ---- the thread ---- */

static void drain_wake(struct redis_sentinel *s)
{
    char buf[64];

    while (read(s->wake[0], buf, sizeof buf) > 0)
        ;
}

/* Sleeps until a notice (read on the way: on_notice), a wake-up, or ms. */
static void wait_for(struct redis_sentinel *s, uint64_t ms)
{
    struct pollfd p = {.fd = s->wake[0], .events = POLLIN};

    if (sub_live(s))
        redis_sync_wait(s->sub, ms, s->wake[0]);
    else
        poll(&p, 1, (int)ms);
    drain_wake(s);
}

static void *follow(void *arg)
{
    struct redis_sentinel *s = arg;
    uint64_t asked = clock_mono_ns() / NS_PER_MS;

    while (!atomic_load(&s->stop)) {
        uint64_t now = clock_mono_ns() / NS_PER_MS, since = now - asked;

        if (since >= POLL_MS ||
            (since >= REASK_GAP_MS && atomic_exchange(&s->reask, false))) {
            if (ask_all(s) == 0 && !sub_live(s))
                sub_open(s);
            asked = now;
            continue;
        }
        wait_for(s, atomic_load(&s->reask) && since < REASK_GAP_MS
                        ? REASK_GAP_MS - since : POLL_MS - since);
    }
    return NULL;
}

/* ---- start and stop ---- */

static int sentinel_new(const struct store_redis_opts *o,
                        struct redis_sentinel **out, struct sc_error *err)
{
    struct redis_sentinel *s;

    if (o->n_sentinels > STORE_SENTINELS_MAX || !o->master ||
        !*o->master || strlen(o->master) >= MASTER_MAX) {
        sc_error_set(err, "store: sentinels need a master name (under %d "
                     "characters) and at most %d addresses", MASTER_MAX,
                     STORE_SENTINELS_MAX);
        return -EINVAL;
    }
    if (!(s = calloc(1, sizeof *s)) ||
        !(s->ask = redis_sync_new(o->timeout_ms ? o->timeout_ms : 100, NULL, NULL)) ||
        !(s->sub = redis_sync_new(o->timeout_ms ? o->timeout_ms : 100, on_notice, s))) {
        if (s) {
            redis_sync_free(s->ask);
            free(s);
        }
        sc_error_set(err, "store: out of memory");
        return -ENOMEM;
    }
    s->wake[0] = s->wake[1] = -1;
    for (unsigned i = 0; i < o->n_sentinels; i++) {
        snprintf(s->host[i], sizeof s->host[i], "%s", o->sentinels[i].host);
        s->addr[i].host = s->host[i];
        s->addr[i].port = o->sentinels[i].port;
    }
    s->n = o->n_sentinels;
    snprintf(s->master, sizeof s->master, "%s", o->master);
    *out = s;
    return 0;
}

int redis_sentinel_start(struct redis_store *st,
                         const struct store_redis_opts *o,
                         struct sc_error *err)
{
    struct redis_sentinel *s;
    int rc;

    if (o->n_sentinels == 0)
        return 0;
    if ((rc = sentinel_new(o, &s, err)) != 0)
        return rc;
    s->st = st;
    st->sentinel = s;
    if (pipe2(s->wake, O_NONBLOCK | O_CLOEXEC) != 0) {
        sc_error_set(err, "store: cannot make a pipe: %s", strerror(errno));
        return -errno;
    }
    /* Before any connection: a healthy fleet starts on the right primary. */
    if (ask_all(s) == 0)
        sub_open(s);
    if ((rc = pthread_create(&s->thread, NULL, follow, s)) != 0) {
        sc_error_set(err, "store: cannot start the Sentinel thread: %s",
                     strerror(rc));
        return -rc;
    }
    s->running = true;
    return 0;
}

void redis_sentinel_reask(struct redis_store *st)
{
    struct redis_sentinel *s = st->sentinel;

    if (!s || atomic_exchange(&s->reask, true))
        return; /* none, or already asked for */
    if (write(s->wake[1], "r", 1) < 0) {
        /* Full pipe: the thread has a wake-up pending anyway. */
    }
}

void redis_sentinel_stop(struct redis_store *st)
{
    struct redis_sentinel *s = st->sentinel;

    if (!s)
        return;
    if (s->running) {
        atomic_store(&s->stop, true);
        if (write(s->wake[1], "s", 1) < 0) {
            /* Full pipe: it wakes anyway. */
        }
        pthread_join(s->thread, NULL);
    }
    redis_sync_free(s->sub);
    redis_sync_free(s->ask);
    if (s->wake[0] >= 0)
        close(s->wake[0]);
    if (s->wake[1] >= 0)
        close(s->wake[1]);
    free(s);
    st->sentinel = NULL;
}
