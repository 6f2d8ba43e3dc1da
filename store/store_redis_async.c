/* The Redis backend's asynchronous calls (store.h, store_backend.h): one
 * hiredis connection per event loop, attached to that loop's event_base,
 * shared by every exchange on the loop (their commands are pipelined on it
 * and answered in order).
 *
 * Connection: AUTH, SELECT and SCRIPT LOAD are sent right after connecting,
 * ahead of any call, so calls may be issued while it connects: Redis answers
 * them in order, after the handshake. Once it is lost (a closed socket, a
 * failed handshake, or no answer within timeout_ms: hiredis 0.14 has no
 * timeouts of its own, so a watchdog timer bounds every reply and the
 * connect), every call in flight completes with the error and new calls
 * fail at once (-ENOTCONN) until a new connection is made: tries after
 * 100 ms, doubling up to 5 s, on the same loop. A caller never waits
 * longer than timeout_ms for an answer.
 *
 * Each call in flight is a small struct req of ours (hiredis's privdata):
 * cancelling clears its call pointer, so a reply that comes later is read
 * and dropped; hiredis runs every callback exactly once, with a NULL reply
 * when the connection goes, and that is where a req is freed.
 *
 * hiredis 0.14 resolves a host name with a blocking getaddrinfo: give the
 * url an IP address or a name the host resolves locally (a Kubernetes
 * Service's name is answered by the node's resolver) to keep reconnects
 * short. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>
#include <hiredis/async.h>
#include <hiredis/adapters/libevent.h>

#include "store/store_redis_internal.h"
#include "util/clock.h"

#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 5000

enum conn_state {
    CONN_DOWN,       /* no connection; retry is armed */
    CONN_CONNECTING, /* connecting or in the handshake */
    CONN_READY,
};

struct req;

struct rloop {
    struct store_loop base;     /* first: the generic part */
    struct redis_store *st;
    redisAsyncContext *ac;      /* NULL while down */
    enum conn_state state;
    int handshake_sent, handshake_left;
    uint64_t ready_by_ns;       /* the connection attempt's deadline */
    unsigned backoff_ms;        /* before the next attempt */
    struct event *retry;        /* the next connection attempt */
    struct event *watchdog;     /* replies and connects that take too long */
    struct req *head, *tail;    /* in flight, oldest first */
    bool freeing;               /* in loop_free: no completion runs */
    int down_rc;                /* what calls lost with the connection get */
    char why[200];              /* why it is down */
};

struct req {
    struct rloop *rl;
    struct store_call *call;    /* NULL once cancelled */
    struct req *prev, *next;
    struct rcmd_info info;
    uint64_t deadline_ns;
    char *cmd;                  /* the formatted command, kept for a retry */
    int cmd_len;
    bool retried;               /* sent again after NOSCRIPT */
};

static void rl_connect(struct rloop *rl);

static struct rloop *rloop_of(struct store_loop *sl)
{
    return (struct rloop *)sl;
}

static uint64_t timeout_ns(const struct rloop *rl)
{
    return rl->st->timeout_ms * NS_PER_MS;
}

/* ---- the in-flight list (for the watchdog) ---- */

static void link_req(struct rloop *rl, struct req *q)
{
    q->prev = rl->tail;
    if (rl->tail)
        rl->tail->next = q;
    else
        rl->head = q;
    rl->tail = q;
}

static void unlink_req(struct rloop *rl, struct req *q)
{
    if (q->prev)
        q->prev->next = q->next;
    else
        rl->head = q->next;
    if (q->next)
        q->next->prev = q->prev;
    else
        rl->tail = q->prev;
}

/* Armed for the earliest deadline: the connection attempt's, or the oldest
 * call's (calls are issued, hence due, in list order). */
static void arm_watchdog(struct rloop *rl)
{
    uint64_t due = UINT64_MAX, now = clock_mono_ns();
    struct timeval tv;

    if (rl->state == CONN_CONNECTING)
        due = rl->ready_by_ns;
    if (rl->head && rl->head->deadline_ns < due)
        due = rl->head->deadline_ns;
    if (due == UINT64_MAX) {
        evtimer_del(rl->watchdog);
        return;
    }
    tv = clock_ns_to_tv(due > now ? due - now : 0);
    evtimer_add(rl->watchdog, &tv);
}

/* ---- losing the connection ---- */

/* The connection is gone (hiredis frees it, or conn_drop does): new calls
 * fail at once, and a new attempt is scheduled. */
static void conn_lost(struct rloop *rl, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void conn_lost(struct rloop *rl, int rc, const char *fmt, ...)
{
    struct timeval tv = clock_ms_to_tv(rl->backoff_ms);
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(rl->why, sizeof rl->why, fmt, ap);
    va_end(ap);
    rl->ac = NULL;
    rl->state = CONN_DOWN;
    rl->down_rc = rc;
    if (rl->freeing)
        return;
    evtimer_add(rl->retry, &tv);
    rl->backoff_ms = rl->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS
                                                         : rl->backoff_ms * 2;
}

/* Closes the connection on our side: the calls in flight complete (with
 * rl->why) from inside redisAsyncFree, or right after the callback that
 * called this returns. */
static void conn_drop(struct rloop *rl, int rc, const char *why)
{
    redisAsyncContext *ac = rl->ac;

    conn_lost(rl, rc, "%s", why);
    if (ac)
        redisAsyncFree(ac);
}

static const char *ac_reason(const redisAsyncContext *ac)
{
    return ac->errstr && ac->errstr[0] ? ac->errstr : "connection closed";
}

static void on_connect(const redisAsyncContext *ac, int status)
{
    struct rloop *rl = ac->data;

    /* On failure hiredis frees ac once this returns. */
    if (status != REDIS_OK && rl->ac == ac)
        conn_lost(rl, -ENOTCONN, "cannot connect: %s", ac_reason(ac));
}

static void on_disconnect(const redisAsyncContext *ac, int status)
{
    struct rloop *rl = ac->data;

    if (rl->ac == ac)
        conn_lost(rl, -EIO, "%s", ac_reason(ac));
}

static void on_watchdog(evutil_socket_t fd, short what, void *arg)
{
    struct rloop *rl = arg;
    uint64_t now = clock_mono_ns();
    char why[96];

    if (rl->state == CONN_CONNECTING && now >= rl->ready_by_ns) {
        snprintf(why, sizeof why, "no answer within %llu ms of connecting",
                 (unsigned long long)rl->st->timeout_ms);
        conn_drop(rl, -ETIMEDOUT, why);
    } else if (rl->ac && rl->head && now >= rl->head->deadline_ns) {
        snprintf(why, sizeof why, "no reply within %llu ms",
                 (unsigned long long)rl->st->timeout_ms);
        conn_drop(rl, -ETIMEDOUT, why);
    }
    arm_watchdog(rl);
}

static void on_retry(evutil_socket_t fd, short what, void *arg)
{
    rl_connect(arg);
}

/* ---- connecting ---- */

/* The handshake's replies come first and in order: the last one makes the
 * connection ready; an error reply (a wrong password, a bad db) drops it. */
static void on_handshake(redisAsyncContext *ac, void *reply, void *priv)
{
    struct rloop *rl = priv;
    redisReply *r = reply;
    const char *argv[3];
    size_t len[3];
    char db[16], why[160];

    if (rl->ac != ac)
        return; /* an old connection, or loop_free */
    if (!r) {
        conn_lost(rl, -EIO, "%s", ac_reason(ac));
        return;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        redis_handshake_cmd(rl->st, rl->handshake_sent - rl->handshake_left,
                            argv, len, db, sizeof db);
        snprintf(why, sizeof why, "%s failed: %s", argv[0], r->str);
        conn_drop(rl, -EIO, why);
        return;
    }
    if (--rl->handshake_left == 0) {
        rl->state = CONN_READY;
        rl->backoff_ms = BACKOFF_MIN_MS;
        arm_watchdog(rl);
    }
}

static void send_handshake(struct rloop *rl)
{
    const char *argv[3];
    size_t len[3];
    char db[16];
    int argc;

    rl->handshake_sent = 0;
    while ((argc = redis_handshake_cmd(rl->st, rl->handshake_sent, argv, len,
                                       db, sizeof db)) > 0) {
        redisAsyncCommandArgv(rl->ac, on_handshake, rl, argc, argv, len);
        rl->handshake_sent++;
    }
    rl->handshake_left = rl->handshake_sent;
}

static void rl_connect(struct rloop *rl)
{
    struct redis_store *st = rl->st;
    redisAsyncContext *ac = redisAsyncConnect(st->host, (int)st->port);

    if (!ac || ac->err) {
        conn_lost(rl, -ENOTCONN, "cannot connect: %s",
                  ac ? ac_reason(ac) : "out of memory");
        if (ac)
            redisAsyncFree(ac);
        return;
    }
    ac->data = rl;
    if (redisLibeventAttach(ac, rl->base.base) != REDIS_OK) {
        conn_lost(rl, -ENOMEM, "cannot watch the connection");
        redisAsyncFree(ac);
        return;
    }
    redisAsyncSetConnectCallback(ac, on_connect);
    redisAsyncSetDisconnectCallback(ac, on_disconnect);
    rl->ac = ac;
    rl->state = CONN_CONNECTING;
    rl->ready_by_ns = clock_mono_ns() + timeout_ns(rl);
    send_handshake(rl);
    arm_watchdog(rl);
}

/* ---- calls ---- */

static void req_free(struct req *q)
{
    redisFreeCommand(q->cmd);
    free(q);
}

/* The call's completion, from its reply (NULL: the connection went). */
static void finish(struct req *q, const redisReply *r)
{
    struct rloop *rl = q->rl;
    struct store_call *c = q->call;
    const struct rcmd_info *info = &q->info;

    unlink_req(rl, q);
    if (!c || rl->freeing) {
        /* Cancelled; or the loop is going: no completion runs. */
        if (c)
            c->pending = NULL;
        req_free(q);
        return;
    }
    if (r)
        c->rc = rcmd_result(rl->st, info, r,
                            &(struct rcmd_out){
                                .rec = info->op == STORE_OP_GET ? &c->rec : NULL,
                                .acq = info->op == STORE_OP_ACQUIRE ? &c->acq : NULL,
                                .permit = &c->permit,
                                .slot = &c->slot,
                            },
                            &c->err);
    else {
        sc_error_set(&c->err, "store: redis at %s: %s: %s", rl->st->addr,
                     info->name, rl->why);
        c->rc = rl->down_rc;
    }
    req_free(q);
    c->pending = NULL;
    c->done(c);
}

static void on_reply(redisAsyncContext *ac, void *reply, void *priv);

/* After NOSCRIPT (a restarted or failed-over Redis, SCRIPT FLUSH): the
 * script is loaded again and the call sent again behind it, once. */
static bool resend(redisAsyncContext *ac, struct req *q)
{
    const char *body = redis_script_body((enum redis_script)q->info.script);
    const char *argv[] = {"SCRIPT", "LOAD", body};
    size_t len[] = {6, 4, strlen(body)};

    q->retried = true;
    return redisAsyncCommandArgv(ac, NULL, NULL, 3, argv, len) == REDIS_OK &&
           redisAsyncFormattedCommand(ac, on_reply, q, q->cmd,
                                      (size_t)q->cmd_len) == REDIS_OK;
}

static void on_reply(redisAsyncContext *ac, void *reply, void *priv)
{
    struct req *q = priv;
    struct rloop *rl = q->rl;

    if (!reply && rl->ac == ac)
        conn_lost(rl, -EIO, "%s", ac_reason(ac)); /* hiredis frees ac */
    if (reply && q->info.script >= 0 && !q->retried && rl->ac == ac &&
        redis_reply_noscript(reply) && resend(ac, q))
        return;
    finish(q, reply);
}

/* The call's command, formatted once (kept for a retry). 0 or -EINVAL /
 * -ENOMEM with err. */
static int req_new(struct rloop *rl, enum store_op op,
                   const struct store_args *a, struct req **out,
                   struct sc_error *err)
{
    struct req *q = calloc(1, sizeof *q);
    struct rcmd cmd;
    int rc;

    *out = NULL;
    if (!q) {
        sc_error_set(err, "store: out of memory");
        return -ENOMEM;
    }
    if ((rc = rcmd_build(rl->st, op, a, &cmd, err)) == 0) {
        q->cmd_len = redisFormatCommandArgv(&q->cmd, cmd.argc, cmd.argv, cmd.len);
        if (q->cmd_len < 0) {
            sc_error_set(err, "store: out of memory");
            rc = -ENOMEM;
        }
    }
    q->info = cmd.info;
    rcmd_free(&cmd);
    if (rc) {
        free(q);
        return rc;
    }
    q->rl = rl;
    *out = q;
    return 0;
}

int redis_start(struct store_loop *sl, struct store_call *c, enum store_op op,
                const struct store_args *a)
{
    struct rloop *rl = rloop_of(sl);
    struct req *q;
    int rc;

    memset(&c->rec, 0, sizeof c->rec);
    memset(&c->acq, 0, sizeof c->acq);
    memset(&c->permit, 0, sizeof c->permit);
    memset(&c->slot, 0, sizeof c->slot);
    /* Built first: a bad key is -EINVAL whether Redis is there or not. */
    if ((rc = req_new(rl, op, a, &q, &c->err)) != 0)
        return rc;
    if (!rl->ac) {
        req_free(q);
        sc_error_set(&c->err, "store: redis at %s: not connected: %s",
                     rl->st->addr, rl->why);
        return -ENOTCONN;
    }
    if (redisAsyncFormattedCommand(rl->ac, on_reply, q, q->cmd,
                                   (size_t)q->cmd_len) != REDIS_OK) {
        req_free(q);
        sc_error_set(&c->err, "store: redis at %s: not connected: closing",
                     rl->st->addr);
        return -ENOTCONN;
    }
    q->deadline_ns = clock_mono_ns() + timeout_ns(rl);
    q->call = c;
    c->pending = q;
    link_req(rl, q);
    if (q == rl->head)
        arm_watchdog(rl);
    return -EINPROGRESS;
}

void redis_cancel(struct store_call *c)
{
    struct req *q = c->pending;

    q->call = NULL; /* its reply is read and dropped */
}

/* ---- the loop's state ---- */

int redis_loop_new(struct store *st, struct event_base *base,
                   struct store_loop **out, struct sc_error *err)
{
    struct rloop *rl = calloc(1, sizeof *rl);

    *out = NULL;
    if (!rl)
        goto nomem;
    rl->base.st = st;
    rl->base.base = base;
    rl->st = (struct redis_store *)st;
    rl->backoff_ms = BACKOFF_MIN_MS;
    rl->retry = evtimer_new(base, on_retry, rl);
    rl->watchdog = evtimer_new(base, on_watchdog, rl);
    if (!rl->retry || !rl->watchdog) {
        redis_loop_free(&rl->base);
        goto nomem;
    }
    /* Not a failure when Redis is down: calls fail until it is back. */
    rl_connect(rl);
    *out = &rl->base;
    return 0;
nomem:
    sc_error_set(err, "store: out of memory");
    return -ENOMEM;
}

/* Calls still in flight are cancelled (their done never runs). Not from
 * inside a completion of this loop. */
void redis_loop_free(struct store_loop *sl)
{
    struct rloop *rl = rloop_of(sl);
    redisAsyncContext *ac = rl->ac;

    rl->freeing = true;
    rl->ac = NULL;
    if (ac)
        redisAsyncFree(ac); /* runs every callback, with NULL replies */
    while (rl->head)
        finish(rl->head, NULL);
    if (rl->retry)
        event_free(rl->retry);
    if (rl->watchdog)
        event_free(rl->watchdog);
    free(rl);
}
