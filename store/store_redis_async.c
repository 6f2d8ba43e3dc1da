/* The Redis backend's asynchronous calls (store.h, store_backend.h): one
 * connection (redis_conn.c) per event loop (two with replicas_ack), on that loop's event_base,
 * shared by every exchange on the loop (their commands are pipelined on it
 * and answered in order).
 *
 * Connection: AUTH, SELECT and SCRIPT LOAD are sent right after connecting
 * (redis_conn.c), ahead of any call, so calls may be issued while it
 * connects: Redis answers them in order, after the handshake. The
 * connection has no timeouts of its own, so a watchdog timer bounds every
 * reply and the connect (TLS handshake and AUTH included): a call not
 * answered within timeout_ms completes with -ETIMEDOUT (a completion with
 * replicas_ack: STORE_WAIT_TIMEOUTS of them), so a caller never waits
 * longer; the connection itself is given up only when its oldest reply is
 * DROP_TIMEOUTS late. Until then a reply that comes after its call gave up
 * is still read, and a lease it granted is given back at once (uncounted:
 * nothing was sent), instead of blocking the key until the lease expires.
 * Once the connection is lost (a closed socket, a failed handshake, that
 * long a stall), every call in flight completes with the error and new
 * calls fail at once (-ENOTCONN) until a new connection is made: tries
 * after 100 ms, doubling up to 5 s, on the same loop.
 *
 * Each call in flight is a small struct req of ours (the connection's
 * callback argument): cancelling clears its call pointer, so a reply that
 * comes later is read and dropped; the connection runs every callback
 * exactly once, with a NULL reply when it goes, and that is where a req is
 * freed.
 *
 * A keyed request's lookup, permit and lease, and a completion, wait for
 * the end of the loop's pass (an event made active by the first of them),
 * where those of one bucket or slot go as one script call (redis_join.h),
 * a struct join the callback argument, whose reply's parts go to each
 * req's callback as if each had gone alone; a call cancelled by then is
 * not sent.
 *
 * With sentinels (redis_sentinel.c) the address connected to is the one
 * they name now: a lost connection or a write refused as READONLY (a
 * demoted primary) asks them again and reconnects with the same backoff;
 * a call started after they named another primary moves the loop there at
 * once (the old connection's calls in flight end with an error).
 *
 * On a Redis Cluster (redis_cluster.c) a loop keeps one connection (two
 * with replicas_ack) per node, made on first use, and each call goes to the
 * owner of its key's slot in the map; a MOVED moves the slot in the map and
 * sends the command there, an ASK sends ASKING and the command there (at
 * most REDIRECTS_MAX of them), each with a new deadline; TRYAGAIN and
 * CLUSTERDOWN wait TRYAGAIN_MS on the loop's list and go again to the owner
 * of then, while the call's deadline allows. A lost connection to a node
 * has the map read again; nothing here waits for it.
 *
 * With replicas_ack, a completion is followed in the pipeline by WAIT
 * (bounded by timeout_ms) and completes only once WAIT answers; fewer
 * replicas than asked is not a failure of the call (replication_short).
 * Redis holds a client's commands while its WAIT runs, so completions go
 * on a second connection of the loop (commit), where WAIT holds up only
 * other completions; one WAIT covers every completion sent while another
 * runs, so a loop with no replica in reach still completes any number of
 * them per two timeouts.
 *
 * A host name is resolved with a blocking getaddrinfo: give the url an IP
 * address or a name the host resolves locally (a Kubernetes Service's name
 * is answered by the node's resolver) to keep reconnects short. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#include <event2/event.h>

#include "store/redis_join.h"
#include "store/redis_slot.h"
#include "store/store_redis_internal.h"
#include "util/clock.h"
#include "util/freelist.h"

#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 5000
/* A reply this many timeouts late gives the connection up. Well above
 * STORE_WAIT_TIMEOUTS, and long enough for Redis's short stalls (a fork
 * for a snapshot, a slow command) to end without a reconnect. */
#define DROP_TIMEOUTS 10
/* A call's command fits in its req up to this (a completion with a body
 * takes a buffer of its own); reqs are kept by their loop for reuse. */
#define REQ_CMD_INLINE 512
#define REQS_KEPT 256
/* A command follows at most this many MOVED/ASK before its error counts. */
#define REDIRECTS_MAX 3
/* Leases taken on a loop, remembered until their completion (a power of
 * two; a lease whose slot was taken since completes with one more write). */
#define LEASE_HINTS 1024
/* TRYAGAIN (a multi-key script while its slot migrates) and CLUSTERDOWN:
 * sent again this much later, while its call's deadline allows. */
#define TRYAGAIN_MS 10
/* Joined calls kept for reuse (one per bucket or slot per pass is the
 * common case). */
#define JOINS_KEPT 16

enum conn_state {
    CONN_DOWN,       /* no connection; retry is armed */
    CONN_CONNECTING, /* connecting or in the handshake */
    CONN_READY,
};

struct req;

struct rloop;

/* One connection of a loop, and the calls in flight on it. */
struct rconn {
    struct rloop *loop;         /* NULL: not in use yet (a cluster node) */
    int node;                   /* cluster: its index in the node table */
    struct redis_store *st;
    struct redis_conn *ac;      /* NULL while down */
    unsigned gen;               /* the primary's generation ac was made to */
    struct redis_conn *old;     /* left for another primary: freed by reap */
    struct event *reap;
    uint64_t wait_seq;          /* of the last WAIT sent */
    uint64_t wait_busy;         /* the WAIT in flight on ac; 0: none */
    bool wait_owed;             /* completions sent since: one WAIT for
                                   them all when wait_busy answers */
    enum conn_state state;
    uint64_t ready_by_ns;       /* the connection attempt's deadline */
    unsigned backoff_ms;        /* before the next attempt */
    struct event *retry;        /* the next connection attempt */
    struct event *watchdog;     /* replies and connects that take too long */
    TAILQ_HEAD(, req) reqs;     /* in flight, oldest first */
    TAILQ_HEAD(, req) pend;     /* calls that may join (among reqs), not
                                   sent yet: flush sends them */
    struct event *flush;        /* at the end of the loop's pass */
    int down_rc;                /* what calls lost with the connection get */
    char why[200];              /* why it is down */
};

enum { CONN_MAIN, CONN_COMMIT };

struct rloop {
    struct store_loop base;     /* first: the generic part */
    /* Per node (a cluster's; else only [0], the primary): main; commit:
     * completions with WAIT. A cluster node's are set up on first use. */
    struct rconn conn[REDIS_NODES_MAX][2];
    unsigned n_conn;            /* 2 with replicas_ack, else 1 */
    bool freeing;               /* in loop_free: no completion runs */
    struct freelist reqs;       /* spare reqs: none allocated per call */
    struct freelist joins;      /* spare struct joins */
    char *jbuf;                 /* a joined call's command, grown as */
    size_t jcap;                /*   needed, kept for the next */
    TAILQ_HEAD(, req) later;    /* cluster: TRYAGAIN / CLUSTERDOWN, sent
                                   again when again fires */
    struct event *again;
    /* by fence: a completion names its lease, and the fence is random */
    struct redis_lease_hint hints[LEASE_HINTS];
};

struct req {
    struct rloop *loop;         /* whose freelist it goes back to */
    struct rconn *cn;
    struct store_call *call;    /* NULL once cancelled */
    TAILQ_ENTRY(req) link;
    struct rcmd_info info;
    uint64_t deadline_ns;       /* its call gets -ETIMEDOUT then */
    uint64_t drop_ns;           /* the connection is given up then */
    bool timed_out;             /* past deadline_ns: its call has gone */
    char *cmd;                  /* the formatted command, kept for a retry:
                                   cmd_inline, or its own buffer */
    size_t cmd_len;
    bool retried;               /* sent again after NOSCRIPT */
    unsigned hops;              /* MOVED/ASK followed */
    unsigned slot;              /* its key's cluster slot */
    struct redis_conn *ac;      /* sent on */
    uint64_t wait_seq;          /* the WAIT that covers it; 0: none */
    bool filled;                /* its call has the command's result */
    bool pending;               /* in its connection's pend, not sent */
    TAILQ_ENTRY(req) plink;
    char cmd_inline[REQ_CMD_INLINE];
};

/* A joined call (redis_join.h): its members, in the order of the reply's
 * parts. */
struct join {
    struct rloop *loop;
    unsigned n;
    struct req *m[REDIS_JOIN_MAX];
};

static void conn_connect(struct rconn *cn);
static void settle_waiters(struct rconn *cn, const struct redis_conn *ac,
                           uint64_t seq, const redisReply *r);

static struct rloop *rloop_of(struct store_loop *sl)
{
    return (struct rloop *)sl;
}

static uint64_t timeout_ns(const struct rconn *cn)
{
    return cn->st->timeout_ms * NS_PER_MS;
}

/* The oldest call not yet timed out (calls are issued, hence due, in list
 * order; the timed-out ones wait at the front for their replies). */
static struct req *first_due(const struct rconn *cn)
{
    struct req *q = TAILQ_FIRST(&cn->reqs);

    while (q && q->timed_out)
        q = TAILQ_NEXT(q, link);
    return q;
}

/* Armed for the earliest deadline: the connection attempt's, the oldest
 * call's, or the oldest reply's drop. */
static void arm_watchdog(struct rconn *cn)
{
    uint64_t due = UINT64_MAX, now = clock_mono_ns();
    struct req *q = first_due(cn);
    struct timeval tv;

    if (cn->state == CONN_CONNECTING)
        due = cn->ready_by_ns;
    if (q && q->deadline_ns < due)
        due = q->deadline_ns;
    if (!TAILQ_EMPTY(&cn->reqs) && TAILQ_FIRST(&cn->reqs)->drop_ns < due)
        due = TAILQ_FIRST(&cn->reqs)->drop_ns;
    if (due == UINT64_MAX) {
        evtimer_del(cn->watchdog);
        return;
    }
    tv = clock_ns_to_tv(due > now ? due - now : 0);
    evtimer_add(cn->watchdog, &tv);
}

/* ---- losing the connection ---- */

/* The connection is gone (it ended, or conn_drop closed it): new calls
 * fail at once, and a new attempt is scheduled. */
static void conn_lost(struct rconn *cn, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void conn_lost(struct rconn *cn, int rc, const char *fmt, ...)
{
    struct timeval tv = clock_ms_to_tv(cn->backoff_ms);
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(cn->why, sizeof cn->why, fmt, ap);
    va_end(ap);
    cn->ac = NULL;
    cn->state = CONN_DOWN;
    cn->down_rc = rc;
    if (cn->loop->freeing)
        return;
    redis_sentinel_reask(cn->st);
    redis_cluster_reask(cn->st); /* a failover may have promoted a replica */
    evtimer_add(cn->retry, &tv);
    cn->backoff_ms = cn->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS
                                                         : cn->backoff_ms * 2;
}

/* Closes the connection on our side: the calls in flight complete (with
 * cn->why) from inside redis_conn_close, or right after the callback that
 * called this returns. */
static void conn_drop(struct rconn *cn, int rc, const char *why)
{
    struct redis_conn *ac = cn->ac;

    conn_lost(cn, rc, "%s", why);
    if (ac)
        redis_conn_close(ac);
}

static const char *ac_reason(const struct redis_conn *ac)
{
    const char *why = redis_conn_why(ac);

    return why[0] ? why : "connection closed";
}

/* The connection ended (could not connect, refused the handshake, lost,
 * or closed by us): called before its calls in flight get NULL, and the
 * connection is freed once they have. */
static void on_lost(struct redis_conn *ac, int rc, const char *why, void *arg)
{
    struct rconn *cn = arg;

    if (cn->old == ac)
        cn->old = NULL;
    if (cn->ac == ac)
        conn_lost(cn, rc ? rc : -EIO, "%s", why);
    /* Written, but their WAIT will never answer: not confirmed. */
    settle_waiters(cn, ac, UINT64_MAX, NULL);
}

/* Its call completes now with -ETIMEDOUT (a completion already written
 * and waiting for replicas: with its result, not confirmed); q stays in
 * flight until its reply comes or the connection goes. */
static void time_out(struct rconn *cn, struct req *q)
{
    struct store_call *c = q->call;

    q->timed_out = true;
    if (!c || cn->loop->freeing)
        return;
    if (q->filled)
        c->replication_short = c->rc == 0;
    else {
        c->rc = -ETIMEDOUT;
        sc_error_set(&c->err, "store: redis at %s: %s: no reply within %llu ms",
                     cn->st->addr, q->info.name,
                     (unsigned long long)cn->st->timeout_ms);
    }
    q->call = NULL;
    c->pending = NULL;
    c->done(c); /* may issue calls: they join the list behind */
}

static void on_watchdog(evutil_socket_t fd, short what, void *arg)
{
    struct rconn *cn = arg;
    uint64_t now = clock_mono_ns();
    struct req *q, *next;
    char why[96];

    if (cn->state == CONN_CONNECTING && now >= cn->ready_by_ns) {
        snprintf(why, sizeof why, "no answer within %llu ms of connecting",
                 (unsigned long long)cn->st->timeout_ms);
        conn_drop(cn, -ETIMEDOUT, why);
    } else if (cn->ac && !TAILQ_EMPTY(&cn->reqs) &&
               now >= TAILQ_FIRST(&cn->reqs)->drop_ns) {
        snprintf(why, sizeof why, "no reply within %llu ms",
                 (unsigned long long)cn->st->timeout_ms * DROP_TIMEOUTS);
        conn_drop(cn, -ETIMEDOUT, why);
    } else {
        /* A done may add calls (behind, not yet due); none leaves the
         * list before its reply. */
        for (q = first_due(cn); q && q->deadline_ns <= now; q = next) {
            next = TAILQ_NEXT(q, link);
            time_out(cn, q);
        }
    }
    arm_watchdog(cn);
}

static void on_retry(evutil_socket_t fd, short what, void *arg)
{
    conn_connect(arg);
}

/* ---- connecting ---- */

/* The handshake's replies came (redis_conn.c): the connection is ready. */
static void on_ready(struct redis_conn *ac, void *arg)
{
    struct rconn *cn = arg;

    if (cn->ac != ac)
        return;
    cn->state = CONN_READY;
    cn->backoff_ms = BACKOFF_MIN_MS;
    arm_watchdog(cn);
}

static void conn_connect(struct rconn *cn)
{
    struct redis_conn_events ev = {on_ready, on_lost, NULL, cn};
    char host[REDIS_HOST_MAX];
    unsigned port;
    struct redis_conn *ac;
    struct sc_error err;
    int rc;

    if (cn->st->cluster)
        redis_cluster_addr(cn->st, cn->node, host, &port);
    else
        redis_primary(cn->st, host, &port, &cn->gen);
    rc = redis_conn_open(cn->loop->base.base, host, port, &cn->st->conn, &ev,
                         &ac, &err);
    if (rc != 0) {
        conn_lost(cn, rc, "%s", err.text);
        return;
    }
    cn->ac = ac;
    cn->wait_busy = 0; /* a new connection has no WAIT in flight */
    cn->wait_owed = false;
    cn->state = CONN_CONNECTING;
    cn->ready_by_ns = clock_mono_ns() + timeout_ns(cn);
    arm_watchdog(cn);
}

/* ---- calls ---- */

static void req_free(struct req *q)
{
    if (q->cmd != q->cmd_inline)
        free(q->cmd);
    freelist_give(&q->loop->reqs, q);
}

/* The call's result, from its command's reply (NULL: the connection
 * went). */
static void fill(struct req *q, struct store_call *c, const redisReply *r)
{
    struct rconn *cn = q->cn;
    const struct rcmd_info *info = &q->info;

    struct redis_lease_hint hint = {0};

    q->filled = true;
    if (r && info->op == STORE_OP_VERIFY) {
        c->rc = redis_verify_result(cn->st, info, r, &c->err);
    } else if (r) {
        c->rc = rcmd_result(cn->st, info, r,
                            &(struct rcmd_out){
                                .rec = info->op == STORE_OP_GET ||
                                       info->op == STORE_OP_WATCH ? &c->rec : NULL,
                                .acq = info->op == STORE_OP_ACQUIRE ||
                                       info->op == STORE_OP_PERMIT_LEASE ||
                                       info->op == STORE_OP_HOLDER_LOOK
                                           ? &c->acq : NULL,
                                .permit = &c->permit,
                                .slot = &c->slot,
                                .hint = &hint,
                            },
                            &c->err);
        if (c->rc == 0 && hint.lease)
            q->loop->hints[hint.lease & (LEASE_HINTS - 1)] = hint;
    } else {
        sc_error_set(&c->err, "store: redis at %s: %s: %s", cn->st->addr,
                     info->name, cn->why);
        c->rc = cn->down_rc;
    }
}

/* Ends q: its call's done runs unless it was cancelled or the loop is
 * going; false when it does not (q is freed either way). */
static bool settle(struct req *q)
{
    struct rconn *cn = q->cn;
    struct store_call *c = q->call;

    TAILQ_REMOVE(&cn->reqs, q, link);
    if (q->pending)
        TAILQ_REMOVE(&cn->pend, q, plink);
    req_free(q);
    if (c)
        c->pending = NULL;
    return c && !cn->loop->freeing;
}

/* The call's completion, from its reply (NULL: the connection went). */
static void finish(struct req *q, const redisReply *r)
{
    struct store_call *c = q->call;

    if (c && !q->cn->loop->freeing && !q->filled)
        fill(q, c, r);
    if (settle(q))
        c->done(c);
}

/* A completion's WAIT answered (NULL: the connection went): the call
 * completes with its command's result, and says whether the replicas
 * fell short. */
static void finish_wait(struct req *q, const redisReply *r)
{
    struct store_call *c = q->call;
    long long want = q->cn->st->replicas_ack;

    if (c && !q->cn->loop->freeing)
        c->replication_short = c->rc == 0 &&
            !(r && r->type == REDIS_REPLY_INTEGER && r->integer >= want);
    if (settle(q))
        c->done(c);
}

/* Completes the completions sent on ac that WAIT seq (or an earlier one)
 * covers. Those added meanwhile (by a done) are not filled yet. */
static void settle_waiters(struct rconn *cn, const struct redis_conn *ac,
                           uint64_t seq, const redisReply *r)
{
    struct req *q = TAILQ_FIRST(&cn->reqs), *next;

    for (; q; q = next) {
        next = TAILQ_NEXT(q, link);
        if (q->ac == ac && q->filled && q->wait_seq && q->wait_seq <= seq)
            finish_wait(q, r);
    }
}

static void on_reply(struct redis_conn *ac, redisReply *reply, void *priv);
static bool send_wait(struct rconn *cn);

/* What a WAIT's callback needs: the completions it covers are found by
 * their sequence number (WAIT is sent for several, and its reply may come
 * after a move to another primary). */
struct wait_tag {
    struct rconn *cn;
    uint64_t seq;
};

static void on_wait(struct redis_conn *ac, redisReply *reply, void *priv)
{
    struct wait_tag *t = priv;
    struct rconn *cn = t->cn;
    uint64_t seq = t->seq;

    free(t);
    if (!reply && cn->ac == ac)
        conn_lost(cn, -EIO, "%s", ac_reason(ac)); /* the connection goes */
    if (cn->ac == ac && cn->wait_busy == seq) {
        /* Sent before the completions settle, whose done may send more. */
        cn->wait_busy = 0;
        if (cn->wait_owed)
            send_wait(cn);
    }
    settle_waiters(cn, ac, seq, reply);
}

/* WAIT <replicas_ack> <timeout_ms> on the connection the completions went
 * on (WAIT counts the replicas that have its client's writes so far). */
static bool send_wait(struct rconn *cn)
{
    struct wait_tag *t = malloc(sizeof *t);
    char n[16], ms[24];
    const char *argv[] = {"WAIT", n, ms};
    size_t len[3] = {4};

    if (!t)
        return false;
    *t = (struct wait_tag){cn, cn->wait_seq + 1};
    len[1] = (size_t)snprintf(n, sizeof n, "%u", cn->st->replicas_ack);
    len[2] = (size_t)snprintf(ms, sizeof ms, "%llu",
                              (unsigned long long)cn->st->timeout_ms);
    if (redis_conn_send_argv(cn->ac, 3, argv, len, on_wait, t) != 0) {
        free(t);
        return false;
    }
    cn->wait_seq = t->seq;
    cn->wait_busy = t->seq;
    cn->wait_owed = false;
    return true;
}

/* q's command was just sent: the WAIT that will cover it, sent now when
 * none is in flight, else owed: one WAIT for all of them once the one in
 * flight answers (Redis holds the connection's commands meanwhile
 * anyway). 0 when no WAIT can be sent: q completes with its reply. */
static uint64_t cover(struct rconn *cn)
{
    if (!cn->wait_busy)
        return send_wait(cn) ? cn->wait_seq : 0;
    cn->wait_owed = true;
    return cn->wait_seq + 1;
}

/* After NOSCRIPT (a restarted or failed-over Redis, SCRIPT FLUSH): the
 * script is loaded again and the call sent again behind it, once (covered
 * by a later WAIT: the one it had answers before it is applied). */
static bool resend(struct redis_conn *ac, struct req *q)
{
    const char *body = redis_script_body((enum redis_script)q->info.script);
    const char *argv[] = {"SCRIPT", "LOAD", body};
    size_t len[] = {6, 4, strlen(body)};

    q->retried = true;
    if (redis_conn_send_argv(ac, 3, argv, len, NULL, NULL) != 0 ||
        redis_conn_send(ac, q->cmd, q->cmd_len, on_reply, q) != 0)
        return false;
    if (q->wait_seq)
        q->wait_seq = cover(q->cn);
    return true;
}

/* A lease granted to a call that gave up (its timeout, or its request
 * answered meanwhile) is nobody's: released at once with its attempt
 * uncounted (nothing was sent), fenced like any release, its reply
 * ignored. Without this the key would wait out the whole lease. */
static void give_back_late_lease(struct rconn *cn, const struct req *q,
                                 const redisReply *r)
{
    const char *slash = strchr(q->info.name, '/');
    struct store_acquire_out acq;
    struct store_permit pm;
    char scope[RECORD_SCOPE_MAX + 1];
    struct sc_error err;
    struct rcmd cmd;
    struct store_args a = {0};

    if ((q->info.op != STORE_OP_ACQUIRE && q->info.op != STORE_OP_PERMIT_LEASE) ||
        !slash || slash - q->info.name > RECORD_SCOPE_MAX ||
        rcmd_result(cn->st, &q->info, r,
                    &(struct rcmd_out){.acq = &acq, .permit = &pm}, &err) != 0)
        return;
    store_record_clear(&acq.rec);
    if (acq.claim != STORE_ACQUIRED)
        return;
    snprintf(scope, sizeof scope, "%.*s", (int)(slash - q->info.name),
             q->info.name);
    a.scope = scope;
    a.key = slash + 1;
    a.attempt = acq.attempt;
    a.lease = acq.lease;
    a.now_ms = clock_wall_ms();
    a.ttl_ms = q->info.ttl_ms;
    if (rcmd_build(cn->st, STORE_OP_RELEASE_UNSENT, &a, &cmd, &err) == 0)
        redis_conn_send_argv(cn->ac, cmd.argc, cmd.argv, cmd.len, NULL, NULL);
    rcmd_free(&cmd);
}

static bool redirect(struct rconn *cn, struct req *q, const redisReply *r);
static bool try_later(struct rconn *cn, struct req *q, const redisReply *r);

static void on_reply(struct redis_conn *ac, redisReply *reply, void *priv)
{
    struct req *q = priv;
    struct rconn *cn = q->cn;

    if (!reply && cn->ac == ac)
        conn_lost(cn, -EIO, "%s", ac_reason(ac)); /* the connection goes */
    if (reply && q->info.script >= 0 && !q->retried && cn->ac == ac &&
        redis_reply_noscript(reply) && resend(ac, q))
        return;
    if (reply && q->call && cn->ac == ac && cn->st->cluster &&
        (redirect(cn, q, reply) || try_later(cn, q, reply)))
        return;
    if (reply && !q->call && cn->ac == ac && !cn->loop->freeing)
        give_back_late_lease(cn, q, reply);
    if (reply && cn->ac == ac && redis_reply_readonly(reply))
        /* A demoted primary: reconnect to the one the sentinels name (the
         * reply stays readable until this callback returns). */
        conn_drop(cn, -EIO, "the primary became a replica");
    if (q->wait_seq && reply && q->call && !cn->loop->freeing) {
        fill(q, q->call, reply);
        if (q->call->rc == 0)
            return; /* written: its WAIT completes it (settle_waiters) */
    }
    finish(q, reply);
}

/* ---- calls joined (redis_join.h): keyed requests', completions ---- */

/* q could not be sent: its call (if any) ends with rc, why saying so. */
static void fail_unsent(struct req *q, int rc, const char *why)
{
    if (q->call) {
        q->call->rc = rc;
        sc_error_set(&q->call->err, "store: redis at %s: %s: %s",
                     q->cn->st->addr, q->info.name, why);
        q->filled = true;
    }
    finish(q, NULL);
}

/* The layout of q's command when it may join others (a keyed request's
 * lookup, permit and lease; a completion), else NULL. */
static const struct redis_join_layout *layout_of(const struct req *q)
{
    if (q->info.op == STORE_OP_PERMIT_LEASE)
        return &REDIS_JOIN_PERMIT_LEASE;
    if (q->info.op == STORE_OP_COMPLETE)
        return &REDIS_JOIN_COMPLETE;
    return NULL;
}

/* Whether q, sent, is followed by a WAIT (a completion with
 * replicas_ack): it completes when that answers. */
static bool waits(const struct rconn *cn, const struct req *q)
{
    return q->info.op == STORE_OP_COMPLETE && cn->st->replicas_ack;
}

/* q, a command that may join others, waits for the end of the loop's
 * pass (flush), where those of one bucket or slot go as one call: still
 * one round trip each, and one script call for them all. */
static void pend(struct rconn *cn, struct req *q)
{
    if (TAILQ_EMPTY(&cn->pend))
        event_active(cn->flush, EV_TIMEOUT, 0);
    TAILQ_INSERT_TAIL(&cn->pend, q, plink);
    q->pending = true;
}

/* The joined call's reply: each request's answer to its own on_reply, as
 * if it had gone alone; anything else (an error such as NOSCRIPT or
 * MOVED, which no part of the call ran past; NULL: the connection went)
 * to each of them, which then goes again alone or ends with it. An array
 * that is not one answer per request (never sent by the scripts) ends
 * each with an error: no part of it is anyone's answer. */
static void on_joined(struct redis_conn *ac, redisReply *reply, void *priv)
{
    static char bad[] = "the reply of a joined call is not one answer per "
                        "request";
    struct join *j = priv;
    redisReply part[REDIS_JOIN_MAX];
    redisReply malformed = {.type = REDIS_REPLY_ERROR, .len = sizeof bad - 1,
                            .str = bad};
    bool split = reply && redis_join_split(layout_of(j->m[0]), reply, j->n,
                                           part);
    redisReply *whole = reply && reply->type == REDIS_REPLY_ARRAY ? &malformed
                                                                   : reply;

    for (unsigned i = 0; i < j->n; i++)
        on_reply(ac, split ? &part[i] : whole, j->m[i]);
    freelist_give(&j->loop->joins, j);
}

/* The joined command of j's members in the loop's buffer; its length, 0:
 * none (out of memory). */
static size_t join_format(struct rloop *rl, const struct join *j)
{
    const struct redis_join_layout *l = layout_of(j->m[0]);
    const char *cmd[REDIS_JOIN_MAX];
    size_t len[REDIS_JOIN_MAX], n;

    for (unsigned i = 0; i < j->n; i++) {
        cmd[i] = j->m[i]->cmd;
        len[i] = j->m[i]->cmd_len;
    }
    n = redis_join(l, rl->jbuf, rl->jcap, cmd, len, j->n);
    if (n > rl->jcap) {
        char *b = realloc(rl->jbuf, n);

        if (!b)
            return 0;
        rl->jbuf = b;
        rl->jcap = n;
        n = redis_join(l, rl->jbuf, rl->jcap, cmd, len, j->n);
    }
    return n;
}

/* Sends j's members as one call; false: they go alone. Completions
 * with replicas_ack: one WAIT covers them all. */
static bool send_join(struct rconn *cn, struct join *j)
{
    size_t n = join_format(cn->loop, j);
    uint64_t seq;

    if (!n || redis_conn_send(cn->ac, cn->loop->jbuf, n, on_joined, j) != 0)
        return false;
    seq = waits(cn, j->m[0]) ? cover(cn) : 0;
    for (unsigned i = 0; i < j->n; i++) {
        j->m[i]->ac = cn->ac;
        j->m[i]->wait_seq = seq;
    }
    return true;
}

/* Sends j's members each alone, as any call goes. */
static void send_alone(struct rconn *cn, const struct join *j)
{
    for (unsigned i = 0; i < j->n; i++) {
        struct req *q = j->m[i];

        if (!cn->ac)
            finish(q, NULL); /* lost since it was started: cn->why says how */
        else if (redis_conn_send(cn->ac, q->cmd, q->cmd_len, on_reply, q) != 0)
            fail_unsent(q, -ENOTCONN, "not connected: closing");
        else {
            q->ac = cn->ac;
            if (waits(cn, q))
                q->wait_seq = cover(cn);
        }
    }
}

/* Takes out of pend the first request and those that fit with it (up to
 * REDIS_JOIN_MAX), into j. A request whose call gave up (cancelled) ends
 * here, unsent: no lease is taken only to be given back. */
static void join_collect(struct rconn *cn, struct join *j)
{
    struct req *q = TAILQ_FIRST(&cn->pend), *next, *head = NULL;

    j->n = 0;
    for (; q && j->n < REDIS_JOIN_MAX; q = next) {
        next = TAILQ_NEXT(q, plink);
        if (head && (head->info.op != q->info.op ||
                     !redis_join_fits(layout_of(q), head->cmd, head->cmd_len,
                                      q->cmd, q->cmd_len)))
            continue;
        TAILQ_REMOVE(&cn->pend, q, plink);
        q->pending = false;
        if (!q->call) {
            finish(q, NULL);
            continue;
        }
        head = head ? head : q;
        j->m[j->n++] = q;
    }
}

/* The end of the loop's pass: the pending commands go, joined by script
 * and bucket or slot; alone when only one is there (or out of memory). */
static void on_flush(evutil_socket_t fd, short what, void *arg)
{
    struct rconn *cn = arg;
    struct join spare, *j;

    while (!TAILQ_EMPTY(&cn->pend)) {
        if (!(j = freelist_take(&cn->loop->joins)))
            j = &spare;
        j->loop = cn->loop;
        join_collect(cn, j);
        if (j != &spare && j->n > 1 && cn->ac && send_join(cn, j))
            continue; /* on_joined gives j back */
        send_alone(cn, j);
        if (j != &spare)
            freelist_give(&cn->loop->joins, j);
    }
}

/* The call's command, formatted once (kept for a retry). 0 or -EINVAL /
 * -ENOMEM with err. */
static int req_new(struct rloop *rl, enum store_op op,
                   const struct store_args *a, struct req **out,
                   struct sc_error *err)
{
    struct req *q = freelist_take(&rl->reqs);
    struct redis_store *st = (struct redis_store *)rl->base.st;
    struct rcmd cmd;
    int rc;

    *out = NULL;
    if (!q) {
        sc_error_set(err, "store: out of memory");
        return -ENOMEM;
    }
    q->loop = rl;
    q->cn = NULL; /* routed by the caller */
    q->cmd = q->cmd_inline;
    if (op == STORE_OP_VERIFY) {
        rc = redis_verify_build(st, a->scope, a->key, a->verify, &cmd, err);
        cmd.info.op = op; /* the build starts from a zeroed command */
    } else {
        rc = rcmd_build(st, op, a, &cmd, err);
    }
    if (rc == 0) {
        q->cmd_len = redis_format_argv(q->cmd, sizeof q->cmd_inline, cmd.argc,
                                       cmd.argv, cmd.len);
        if (q->cmd_len > sizeof q->cmd_inline &&
            !(q->cmd = malloc(q->cmd_len))) {
            sc_error_set(err, "store: out of memory");
            rc = -ENOMEM;
        } else if (q->cmd != q->cmd_inline) {
            redis_format_argv(q->cmd, q->cmd_len, cmd.argc, cmd.argv, cmd.len);
        }
        if (st->cluster)
            q->slot = redis_key_slot(cmd.key, strlen(cmd.key));
    }
    q->info = cmd.info;
    rcmd_free(&cmd);
    if (rc) {
        if (!q->cmd)
            q->cmd = q->cmd_inline; /* nothing of its own to free */
        req_free(q);
        return rc;
    }
    *out = q;
    return 0;
}

/* Answered within timeout_ms; a completion with its WAIT within
 * STORE_WAIT_TIMEOUTS of them (what is left of the WAIT in flight, its
 * own, the reply). A connection carries either kind, never both, so
 * deadlines grow in list order and the watchdog looks at the oldest. */
static void set_deadline(struct rconn *cn, struct req *q)
{
    uint64_t now = clock_mono_ns();

    q->deadline_ns = now + timeout_ns(cn) * (waits(cn, q) ? STORE_WAIT_TIMEOUTS : 1);
    q->drop_ns = now + timeout_ns(cn) * DROP_TIMEOUTS;
}

/* ---- following the primary ---- */

/* Frees the connection left for another primary: its calls in flight
 * complete with an error (from inside redis_conn_close). */
static void on_reap(evutil_socket_t fd, short what, void *arg)
{
    struct rconn *cn = arg;
    struct redis_conn *old = cn->old;
    char why[sizeof cn->why];
    int rc = cn->down_rc;

    if (!old)
        return;
    cn->old = NULL;
    memcpy(why, cn->why, sizeof why);
    snprintf(cn->why, sizeof cn->why, "the sentinels named another primary");
    cn->down_rc = -EIO;
    redis_conn_close(old);
    memcpy(cn->why, why, sizeof why);
    cn->down_rc = rc;
}

/* The sentinels name another primary than the one this loop's connection
 * was made to: connect there now. The old connection is freed from the
 * loop (not here, inside a call: its calls' completions must not run
 * inside another's), so one move waits for the previous one's reap. */
static void move(struct rconn *cn)
{
    if (cn->old)
        return;
    if (cn->ac) {
        cn->old = cn->ac;
        cn->ac = NULL;
        event_active(cn->reap, EV_TIMEOUT, 0);
    }
    evtimer_del(cn->retry);
    cn->backoff_ms = BACKOFF_MIN_MS;
    conn_connect(cn);
}

static int conn_init(struct rloop *rl, struct rconn *cn, int node);

/* A completion that WAITs goes on the commit connection, so that WAIT
 * holds up only completions, never a permit or a lease. On a cluster, the
 * connection to node, set up (and connecting) on first use; NULL: out of
 * memory. */
static struct rconn *conn_for(struct rloop *rl, enum store_op op, int node)
{
    unsigned k = op == STORE_OP_COMPLETE && rl->n_conn > CONN_COMMIT
                     ? CONN_COMMIT : CONN_MAIN;
    struct rconn *cn = &rl->conn[node][k];

    if (!cn->loop) {
        if (conn_init(rl, cn, node) != 0)
            return NULL;
        conn_connect(cn);
    }
    return cn;
}

/* MOVED or ASK in r (a cluster): q's command goes to the node named, ASK
 * with ASKING ahead of it; MOVED moves the slot in the map. q joins that
 * connection's calls with a new deadline (a new round trip). false: not a
 * redirection, one too many, or no connection there: q ends with r. */
static bool redirect(struct rconn *cn, struct req *q, const redisReply *r)
{
    static const char *const asking[] = {"ASKING"};
    static const size_t asking_len[] = {6};
    struct redis_redirect rd;
    struct rconn *to;
    int node;

    if (q->hops >= REDIRECTS_MAX || !redis_redirect_parse(r, &rd) ||
        (node = redis_cluster_node(cn->st, rd.host, rd.hlen, rd.port)) < 0)
        return false;
    if (!rd.ask)
        redis_cluster_moved(cn->st, rd.slot, node);
    if (!(to = conn_for(cn->loop, q->info.op, node)) || !to->ac ||
        (rd.ask && redis_conn_send_argv(to->ac, 1, (const char **)asking,
                                        asking_len, NULL, NULL) != 0) ||
        redis_conn_send(to->ac, q->cmd, q->cmd_len, on_reply, q) != 0)
        return false;
    q->hops++;
    TAILQ_REMOVE(&cn->reqs, q, link);
    q->cn = to;
    q->ac = to->ac;
    if (q->wait_seq)
        q->wait_seq = cover(to);
    set_deadline(to, q);
    TAILQ_INSERT_TAIL(&to->reqs, q, link);
    arm_watchdog(to);
    arm_watchdog(cn);
    return true;
}

/* TRYAGAIN or CLUSTERDOWN in r: q waits TRYAGAIN_MS off any connection
 * and is sent again to its slot's owner then (send_later), if its call's
 * deadline is not passed by then; false: it ends with r. */
static bool try_later(struct rconn *cn, struct req *q, const redisReply *r)
{
    struct rloop *rl = cn->loop;
    struct timeval tv = clock_ms_to_tv(TRYAGAIN_MS);

    if (!redis_reply_cluster_busy(r) || q->timed_out ||
        clock_mono_ns() + TRYAGAIN_MS * NS_PER_MS >= q->deadline_ns)
        return false;
    TAILQ_REMOVE(&cn->reqs, q, link);
    TAILQ_INSERT_TAIL(&rl->later, q, link);
    if (!evtimer_pending(rl->again, NULL))
        evtimer_add(rl->again, &tv);
    arm_watchdog(cn);
    return true;
}

static int owner_of(struct redis_store *st, const struct req *q,
                    struct sc_error *err);

/* Sends q again to the owner of its slot (the map may have changed). */
static void send_again(struct rloop *rl, struct req *q)
{
    struct sc_error err;
    int node = owner_of((struct redis_store *)rl->base.st, q, &err);
    struct rconn *to = node >= 0 ? conn_for(rl, q->info.op, node) : NULL;
    uint64_t deadline = q->deadline_ns;

    q->hops = 0;
    if (to)
        q->cn = to; /* else it ends on the connection it came from */
    TAILQ_INSERT_TAIL(&q->cn->reqs, q, link);
    if (!q->call || !to || !to->ac ||
        redis_conn_send(to->ac, q->cmd, q->cmd_len, on_reply, q) != 0) {
        if (!to && q->call) {
            q->call->rc = -ENOTCONN;
            q->call->err = err; /* the slot has no known primary */
            q->filled = true;
            finish(q, NULL);
        } else {
            fail_unsent(q, -ENOTCONN, "the slot's primary is not connected");
        }
        return;
    }
    q->ac = to->ac;
    if (q->wait_seq)
        q->wait_seq = cover(to);
    set_deadline(to, q);
    if (deadline < q->deadline_ns)
        q->deadline_ns = deadline; /* still within its call's time */
    arm_watchdog(to);
}

static void on_again(evutil_socket_t fd, short what, void *arg)
{
    struct rloop *rl = arg;
    struct req *q;

    while ((q = TAILQ_FIRST(&rl->later))) {
        TAILQ_REMOVE(&rl->later, q, link);
        send_again(rl, q);
    }
}

/* The owner of q's slot, or -1 with err (the map is read again). */
static int owner_of(struct redis_store *st, const struct req *q,
                    struct sc_error *err)
{
    int node = redis_cluster_owner(st, q->slot);

    if (node < 0) {
        sc_error_set(err, "store: redis at %s: %s: slot %u has no known "
                     "primary", st->addr, q->info.name, q->slot);
        redis_cluster_reask(st);
    }
    return node;
}

/* A completion of a lease this loop took: a with what the lease was taken
 * with, so the script writes the record in one command; the hint is used
 * up (a fence names one lease). a itself when none is kept. */
static const struct store_args *with_hint(struct rloop *rl, enum store_op op,
                                          const struct store_args *a,
                                          struct store_args *buf)
{
    struct redis_lease_hint *h = &rl->hints[a->lease & (LEASE_HINTS - 1)];

    if (op != STORE_OP_COMPLETE || !a->lease || h->lease != a->lease)
        return a;
    *buf = *a;
    buf->attempt = h->attempt;
    buf->created_ms = h->created_ms;
    buf->fp = h->fp;
    h->lease = 0; /* buf->fp stays readable: the slot is not reused here */
    return buf;
}

int redis_start(struct store_loop *sl, struct store_call *c, enum store_op op,
                const struct store_args *a)
{
    struct rloop *rl = rloop_of(sl);
    struct redis_store *st = (struct redis_store *)sl->st;
    struct store_args hinted;
    struct rconn *cn;
    struct req *q;
    int node, rc;

    memset(&c->rec, 0, sizeof c->rec);
    memset(&c->acq, 0, sizeof c->acq);
    memset(&c->permit, 0, sizeof c->permit);
    memset(&c->slot, 0, sizeof c->slot);
    c->replication_short = false;
    a = with_hint(rl, op, a, &hinted);
    /* Built first: a bad key is -EINVAL whether Redis is there or not. */
    if ((rc = req_new(rl, op, a, &q, &c->err)) != 0)
        return rc;
    if ((node = st->cluster ? owner_of(st, q, &c->err) : 0) < 0 ||
        !(cn = conn_for(rl, op, node))) {
        if (node >= 0)
            sc_error_set(&c->err, "store: out of memory");
        req_free(q);
        return node < 0 ? -ENOTCONN : -ENOMEM;
    }
    q->cn = cn;
    if (!st->cluster && cn->gen != redis_primary_gen(st))
        move(cn);
    if (!cn->ac) {
        req_free(q);
        sc_error_set(&c->err, "store: redis at %s: not connected: %s",
                     cn->st->addr, cn->why);
        return -ENOTCONN;
    }
    if (layout_of(q)) {
        pend(cn, q); /* its WAIT, if any, when it is sent */
    } else if (redis_conn_send(cn->ac, q->cmd, q->cmd_len, on_reply, q) != 0) {
        req_free(q);
        sc_error_set(&c->err, "store: redis at %s: not connected: closing",
                     cn->st->addr);
        return -ENOTCONN;
    }
    q->ac = cn->ac;
    set_deadline(cn, q);
    q->call = c;
    c->pending = q;
    TAILQ_INSERT_TAIL(&cn->reqs, q, link);
    if (first_due(cn) == q) /* the earliest deadline now */
        arm_watchdog(cn);
    return -EINPROGRESS;
}

void redis_cancel(struct store_call *c)
{
    struct req *q = c->pending;

    q->call = NULL; /* its reply is read and dropped */
}

/* ---- the loop's state ---- */

static int conn_init(struct rloop *rl, struct rconn *cn, int node)
{
    struct event_base *base = rl->base.base;

    cn->loop = rl;
    cn->node = node;
    cn->st = (struct redis_store *)rl->base.st;
    TAILQ_INIT(&cn->reqs);
    TAILQ_INIT(&cn->pend);
    cn->backoff_ms = BACKOFF_MIN_MS;
    cn->retry = evtimer_new(base, on_retry, cn);
    cn->watchdog = evtimer_new(base, on_watchdog, cn);
    cn->reap = evtimer_new(base, on_reap, cn);
    cn->flush = event_new(base, -1, 0, on_flush, cn);
    return cn->retry && cn->watchdog && cn->reap && cn->flush ? 0 : -ENOMEM;
}

int redis_loop_new(struct store *st, struct event_base *base,
                   struct store_loop **out, struct sc_error *err)
{
    struct rloop *rl = calloc(1, sizeof *rl);

    *out = NULL;
    if (!rl)
        goto nomem;
    rl->base.st = st;
    rl->base.base = base;
    freelist_init(&rl->reqs, sizeof(struct req), REQS_KEPT);
    freelist_init(&rl->joins, sizeof(struct join), JOINS_KEPT);
    TAILQ_INIT(&rl->later);
    if (!(rl->again = evtimer_new(base, on_again, rl))) {
        free(rl);
        goto nomem;
    }
    rl->n_conn = ((struct redis_store *)st)->replicas_ack ? 2 : 1;
    /* A cluster's connections are made per node on first use. */
    for (unsigned i = 0; !((struct redis_store *)st)->cluster && i < rl->n_conn; i++)
        if (conn_init(rl, &rl->conn[0][i], 0) != 0) {
            redis_loop_free(&rl->base);
            goto nomem;
        }
    /* Not a failure when Redis is down: calls fail until it is back. */
    for (unsigned i = 0; !((struct redis_store *)st)->cluster && i < rl->n_conn; i++)
        conn_connect(&rl->conn[0][i]);
    *out = &rl->base;
    return 0;
nomem:
    sc_error_set(err, "store: out of memory");
    return -ENOMEM;
}

static void conn_free(struct rconn *cn)
{
    struct redis_conn *ac = cn->ac;

    cn->ac = NULL;
    if (cn->flush)
        event_free(cn->flush); /* the pending end below, unsent */
    cn->flush = NULL;
    if (ac)
        redis_conn_close(ac); /* runs every callback, with NULL replies */
    if (cn->old)
        redis_conn_close(cn->old);
    while (!TAILQ_EMPTY(&cn->reqs))
        finish(TAILQ_FIRST(&cn->reqs), NULL);
    if (cn->retry)
        event_free(cn->retry);
    if (cn->watchdog)
        event_free(cn->watchdog);
    if (cn->reap)
        event_free(cn->reap);
}

/* Calls still in flight are cancelled (their done never runs). Not from
 * inside a completion of this loop. */
void redis_loop_free(struct store_loop *sl)
{
    struct rloop *rl = rloop_of(sl);

    rl->freeing = true;
    while (!TAILQ_EMPTY(&rl->later)) {
        struct req *q = TAILQ_FIRST(&rl->later);

        TAILQ_REMOVE(&rl->later, q, link);
        TAILQ_INSERT_TAIL(&q->cn->reqs, q, link); /* finished with its conn */
    }
    if (rl->again)
        event_free(rl->again);
    for (unsigned n = 0; n < REDIS_NODES_MAX; n++)
        for (unsigned i = 0; i < rl->n_conn; i++)
            if (rl->conn[n][i].loop)
                conn_free(&rl->conn[n][i]);
    freelist_clear(&rl->reqs);
    freelist_clear(&rl->joins);
    free(rl->jbuf);
    free(rl);
}
