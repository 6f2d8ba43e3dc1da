/* Blocking use of a Redis connection (redis_sync.h): the connection of
 * redis_conn.c on an event base of our own, run until the reply, the
 * connection's end or the timeout. */
#include "store/redis_sync.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

struct redis_sync {
    struct event_base *base;
    struct redis_conn *c;
    uint64_t timeout_ms;
    void (*push)(const redisReply *r, void *arg);
    void *push_arg;
    bool ready, lost, got, woke;
    int lost_rc;
    char why[256];
    redisReply *reply;
};

static void sync_ready(struct redis_conn *c, void *arg)
{
    ((struct redis_sync *)arg)->ready = true;
}

static void sync_lost(struct redis_conn *c, int rc, const char *why, void *arg)
{
    struct redis_sync *s = arg;

    s->lost = true;
    s->lost_rc = rc;
    snprintf(s->why, sizeof s->why, "%s", why);
    s->c = NULL;
}

static void sync_push(struct redis_conn *c, redisReply *r, void *arg)
{
    struct redis_sync *s = arg;

    s->woke = true;
    if (s->push)
        s->push(r, s->push_arg);
}

static void sync_reply(struct redis_conn *c, redisReply *r, void *arg)
{
    struct redis_sync *s = arg;

    s->got = true;
    s->reply = r;
    if (r)
        redis_conn_keep(c);
}

struct redis_sync *redis_sync_new(uint64_t timeout_ms,
                                  void (*push)(const redisReply *r, void *arg),
                                  void *arg)
{
    struct redis_sync *s = calloc(1, sizeof *s);

    if (!s)
        return NULL;
    if (!(s->base = event_base_new())) {
        free(s);
        return NULL;
    }
    s->timeout_ms = timeout_ms;
    s->push = push;
    s->push_arg = arg;
    return s;
}

void redis_sync_drop(struct redis_sync *s)
{
    if (s->c)
        redis_conn_close(s->c); /* sync_lost clears s->c */
    s->c = NULL;
}

void redis_sync_free(struct redis_sync *s)
{
    if (!s)
        return;
    redis_sync_drop(s);
    event_base_free(s->base);
    free(s);
}

static void on_wake(evutil_socket_t fd, short what, void *arg)
{
    *(bool *)arg = true;
}

/* Runs the base until *flag, the connection's end, or ms; whether *flag. */
static bool run_until(struct redis_sync *s, bool *flag, uint64_t ms)
{
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    bool expired = false;
    struct event *t = evtimer_new(s->base, on_wake, &expired);

    if (!t)
        return false;
    evtimer_add(t, &tv);
    while (!*flag && !s->lost && !expired)
        event_base_loop(s->base, EVLOOP_ONCE);
    event_free(t);
    return *flag;
}

static const struct redis_conn_events *sync_events(struct redis_sync *s,
                                                   struct redis_conn_events *ev)
{
    *ev = (struct redis_conn_events){sync_ready, sync_lost, sync_push, s};
    return ev;
}

int redis_sync_connect(struct redis_sync *s, const char *host, unsigned port,
                       const struct redis_conn_opts *o, struct sc_error *err)
{
    struct redis_conn_events ev;
    int rc;

    redis_sync_drop(s);
    s->ready = s->lost = false;
    if ((rc = redis_conn_open(s->base, host, port, o, sync_events(s, &ev),
                              &s->c, err)) != 0)
        return rc;
    redis_conn_heap_replies(s->c); /* before any reply: none is read until the base runs */
    if (run_until(s, &s->ready, s->timeout_ms))
        return 0;
    if (s->lost) {
        sc_error_set(err, "%s", s->why);
        return s->lost_rc ? s->lost_rc : -EIO;
    }
    redis_sync_drop(s);
    sc_error_set(err, "cannot connect: no answer within %llu ms",
                 (unsigned long long)s->timeout_ms);
    return -ETIMEDOUT;
}

bool redis_sync_open(struct redis_sync *s)
{
    if (s->c)
        event_base_loop(s->base, EVLOOP_NONBLOCK);
    return s->c != NULL;
}

int redis_sync_command(struct redis_sync *s, int argc, const char **argv,
                       const size_t *len, redisReply **out,
                       struct sc_error *err)
{
    int rc;

    *out = NULL;
    if (!s->c) {
        sc_error_set(err, "not connected");
        return -ENOTCONN;
    }
    s->got = false;
    s->reply = NULL;
    if ((rc = redis_conn_send_argv(s->c, argc, argv, len, sync_reply, s)) != 0) {
        sc_error_set(err, "%s", rc == -ENOMEM ? "out of memory" : "not connected");
        return rc;
    }
    if (run_until(s, &s->got, s->timeout_ms) && s->reply) {
        *out = s->reply;
        return 0;
    }
    if (s->lost) {
        sc_error_set(err, "%s", s->why);
        return -EIO;
    }
    /* Its reply may still come: only a new connection is in step. */
    redis_sync_drop(s);
    sc_error_set(err, "no reply within %llu ms", (unsigned long long)s->timeout_ms);
    return -ETIMEDOUT;
}

void redis_sync_wait(struct redis_sync *s, uint64_t ms, int wake_fd)
{
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    bool woke = false, expired = false;
    struct event *t = evtimer_new(s->base, on_wake, &expired);
    struct event *w = wake_fd >= 0
                          ? event_new(s->base, wake_fd, EV_READ, on_wake, &woke)
                          : NULL;

    if (!t || (wake_fd >= 0 && !w))
        goto out;
    evtimer_add(t, &tv);
    if (w)
        event_add(w, NULL);
    s->woke = false;
    while (!woke && !s->woke && !expired)
        event_base_loop(s->base, EVLOOP_ONCE);
out:
    if (w)
        event_free(w);
    if (t)
        event_free(t);
}
