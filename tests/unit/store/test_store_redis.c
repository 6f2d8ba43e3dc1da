/* The idempotency store on a real redis-server (tests/support/redis_server.c,
 * one per test, on loopback): the behaviour cases every backend shares
 * (store_cases.h), then what is Redis's own: a fleet of handles on one
 * Redis, lost scripts, the asynchronous calls on an event loop, a Redis that
 * stops, stalls or restarts, a password and a db. Every wait is bounded. */
#include <criterion/criterion.h>

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>
#include <hiredis/hiredis.h>

#include "store/record.h"
#include "store/store.h"
#include "support/redis_server.h"
#include "support/testutil.h"
#include "unit/store/lease.h"
#include "util/clock.h"

#define SCOPE "payments"
#define LEASE 60000ull     /* 1 min */
#define TTL 86400000ull    /* 24 h */
#define TIMEOUT_MS 2000    /* generous: the test machine is shared */
#define WAIT_MS 10000      /* the longest any test waits for anything */

static struct redis_server srv;
static struct store *st;
static struct sc_error err;
static uint64_t t0;
static uint8_t fp_a[STORE_FP_LEN], fp_b[STORE_FP_LEN];

static struct store *open_with(const char *password, unsigned db,
                               uint64_t timeout_ms, const char *prefix)
{
    struct store_redis_opts o = {.host = "127.0.0.1", .port = srv.port,
                                 .password = password, .db = db,
                                 .timeout_ms = timeout_ms, .prefix = prefix};
    struct store *s = NULL;
    int rc = store_open_redis(&o, &s, &err);

    cr_assert_eq(rc, 0, "store_open_redis: %s", err.text);
    return s;
}

static struct store *open_second(void)
{
    return open_with(NULL, 0, TIMEOUT_MS, NULL);
}

static void reopen(void)
{
    store_close(st);
    st = open_second();
}

static void setup(void)
{
    cr_assert_eq(redis_server_start(&srv, 0, NULL), 0, "redis-server did not start");
    t0 = clock_wall_ms();
    memset(fp_a, 0xaa, sizeof fp_a);
    memset(fp_b, 0xbb, sizeof fp_b);
    st = open_second();
}

static void teardown(void)
{
    store_close(st);
    st = NULL;
    redis_server_destroy(&srv);
}

TestSuite(store, .init = setup, .fini = teardown);

#include "unit/store/store_cases.h"

/* ---- a direct connection, to look at what the store wrote ---- */

static redisReply *raw(const char *fmt, ...)
{
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", (int)srv.port, tv);
    redisReply *r;
    va_list ap;

    cr_assert(c && !c->err, "connect");
    if (srv.password[0])
        freeReplyObject(redisCommand(c, "AUTH %s", srv.password));
    va_start(ap, fmt);
    r = redisvCommand(c, fmt, ap);
    va_end(ap);
    redisFree(c);
    cr_assert_not_null(r);
    return r;
}

static long long raw_int(const char *fmt, const char *arg)
{
    redisReply *r = raw(fmt, arg);
    long long v = r->type == REDIS_REPLY_INTEGER ? r->integer : -999;

    freeReplyObject(r);
    return v;
}

Test(store, keys_carry_the_scope_as_a_hash_tag_and_a_ttl)
{
    long long pttl;

    expect_acquired("order 42", fp_a, t0, 1);
    cr_assert_eq(store_pause_set(st, SCOPE, t0, t0 + 5000, &err), 0, "%s", err.text);
    cr_expect_eq(raw_int("EXISTS %s", "sluice:{payments}:k:order 42"), 1);
    cr_expect_eq(raw_int("EXISTS %s", "sluice:{payments}:pause"), 1);
    pttl = raw_int("PTTL %s", "sluice:{payments}:k:order 42");
    cr_expect(pttl > (long long)(LEASE + TTL) - 60000 &&
              pttl <= (long long)(LEASE + TTL), "pttl %lld", pttl);
    pttl = raw_int("PTTL %s", "sluice:{payments}:pause");
    cr_expect(pttl > 0 && pttl <= 5000, "pttl %lld", pttl);
}

/* Past what PEXPIREAT takes, a record is kept without a TTL. */
Test(store, saturated_expiry_keeps_the_record_without_a_ttl)
{
    struct store_acquire_out out;
    struct store_record r;

    cr_assert_eq(acquire_ex("k", fp_a, t0, LEASE, UINT64_MAX, &out), STORE_ACQUIRED);
    cr_expect_eq(raw_int("PTTL %s", "sluice:{payments}:k:k"), -1);
    cr_assert_eq(get("k", t0, &r), 0, "%s", err.text);
    cr_expect_eq(r.expires_ms, UINT64_MAX);
    store_record_clear(&r);
    expect_claim("k", fp_a, t0 + 1, STORE_HELD);
    cr_assert_eq(store_release(st, SCOPE, "k", 1, lease_in(st, SCOPE, "k"), t0 + 2, UINT64_MAX, &err), 0, "%s", err.text);
    expect_acquired("k", fp_a, t0 + 3, 2);
}

Test(store, prefix_with_or_without_its_colon)
{
    struct store *a = open_with(NULL, 0, TIMEOUT_MS, "fleet-a:");
    struct store *b = open_with(NULL, 0, TIMEOUT_MS, "fleet-a");
    struct store_acquire_out out;

    cr_assert_eq(store_acquire(a, SCOPE, "k", fp_a, t0, LEASE, TTL, &out, &err), 0);
    cr_expect_eq(out.claim, STORE_ACQUIRED);
    cr_assert_eq(store_acquire(b, SCOPE, "k", fp_a, t0, LEASE, TTL, &out, &err), 0);
    cr_expect_eq(out.claim, STORE_HELD, "one prefix, one key");
    cr_expect_eq(raw_int("EXISTS %s", "fleet-a:{payments}:k:k"), 1);
    expect_acquired("k", fp_a, t0, 1); /* the default prefix is apart */
    store_close(a);
    store_close(b);
}

Test(store, open_refuses_bad_options)
{
    struct store_redis_opts o = {.host = "127.0.0.1", .port = 0};
    struct store *s = (struct store *)1;

    cr_expect_eq(store_open_redis(&o, &s, &err), -EINVAL);
    cr_expect_null(s);
    o.port = srv.port;
    o.prefix = "a{b}";
    cr_expect_eq(store_open_redis(&o, &s, &err), -EINVAL);
    cr_expect(strstr(err.text, "braces"), "%s", err.text);
    o.prefix = NULL;
    o.host = "";
    cr_expect_eq(store_open_redis(&o, &s, &err), -EINVAL);
}

Test(store, backend_name_sweep_and_count)
{
    size_t removed = 7;

    cr_expect_str_eq(store_backend_name(st), "redis");
    cr_expect_eq(store_count(st), 0);
    expect_acquired("a", fp_a, t0, 1);
    expect_acquired("b", fp_a, t0, 1);
    /* An estimate (DBSIZE): a lease is one key, its holder inside it. */
    cr_expect_eq(store_count(st), 2);
    cr_expect_eq(store_sweep(st, t0 + 2 * TTL, 100, &removed, &err), 0);
    cr_expect_eq(removed, 0, "Redis expires records itself");
    cr_expect(store_healthy(st));
}

Test(store, unreadable_values_are_errors_and_can_be_forgotten)
{
    static const char v9[] = "\x09\x02\x00 a future version, long enough to be read as a record; more bytes";
    struct store_acquire_out out;
    struct store_record r;
    redisReply *x = raw("SET sluice:{payments}:k:future %b", v9, sizeof v9 - 1);

    freeReplyObject(x);
    cr_expect_eq(get("future", t0, &r), -EPROTO);
    cr_expect(strstr(err.text, "version 9"), "%s", err.text);
    cr_expect(strstr(err.text, "payments/future"), "%s", err.text);
    cr_expect_eq(store_acquire(st, SCOPE, "future", fp_a, t0, LEASE, TTL,
                               &out, &err), -EPROTO);
    cr_expect_eq(store_complete(st, SCOPE, "future", lease_in(st, SCOPE, "future"), t0, TTL, 200, NULL, 0,
                                NULL, 0, false, &err), -EPROTO);
    cr_expect_eq(store_release(st, SCOPE, "future", 1, lease_in(st, SCOPE, "future"), t0, TTL, &err), -EPROTO);
    x = raw("SET sluice:{payments}:k:short %b", "\x02\x01", (size_t)2);
    freeReplyObject(x);
    cr_expect_eq(store_acquire(st, SCOPE, "short", fp_a, t0, LEASE, TTL,
                               &out, &err), -EBADMSG, "%s", err.text);
    cr_expect_eq(store_forget(st, SCOPE, "future", &err), 0);
    expect_acquired("future", fp_a, t0, 1);
}

/* ---- a fleet: several handles (sidecars) on one Redis ---- */

Test(store, fence_holds_across_sidecars)
{
    struct store *other = open_second();
    struct store_acquire_out out;
    uint64_t first = expect_acquired("k", fp_a, t0, 1);

    cr_assert_eq(store_acquire(other, SCOPE, "k", fp_a, t0 + 1, LEASE, TTL, &out, &err), 0);
    cr_expect_eq(out.claim, STORE_HELD);
    cr_expect_eq(out.remaining_ms, LEASE - 1);
    /* The first holder outlives its lease; the other sidecar takes over. */
    cr_assert_eq(store_acquire(other, SCOPE, "k", fp_a, t0 + LEASE, LEASE, TTL, &out, &err), 0);
    cr_assert_eq(out.claim, STORE_ACQUIRED);
    cr_expect_eq(out.attempt, 2);
    cr_expect_eq(store_release(st, SCOPE, "k", 1, first, t0 + LEASE + 1, TTL, &err), -ESTALE);
    cr_expect(strstr(err.text, "another lease holds it (attempt 2)"), "%s", err.text);
    cr_expect_eq(store_complete(st, SCOPE, "k", first, t0 + LEASE + 1, TTL, 200, NULL,
                                0, NULL, 0, false, &err), -ESTALE);
    expect_claim("k", fp_a, t0 + LEASE + 2, STORE_HELD);
    cr_expect_eq(store_release(other, SCOPE, "k", 2, out.lease, t0 + LEASE + 3, TTL, &err), 0, "%s", err.text);
    expect_acquired("k", fp_a, t0 + LEASE + 3, 3);
    store_close(other);
}

Test(store, completed_records_replay_across_sidecars)
{
    struct store *other = open_second();
    struct store_acquire_out out;
    struct store_record r;

    expect_acquired("k", fp_a, t0, 1);
    complete_bin("k", t0 + 10);
    cr_assert_eq(store_acquire(other, SCOPE, "k", fp_a, t0 + 20, LEASE, TTL, &out, &err), 0);
    cr_assert_eq(out.claim, STORE_DONE);
    expect_bin_result(&out.rec);
    cr_expect_eq(out.rec.completed_ms, t0 + 10);
    store_record_clear(&out.rec);
    cr_assert_eq(store_acquire(other, SCOPE, "k", fp_b, t0 + 20, LEASE, TTL, &out, &err), 0);
    cr_expect_eq(out.claim, STORE_MISMATCH);
    cr_assert_eq(store_get(other, SCOPE, "k", t0 + 30, &r, &err), 0);
    expect_bin_result(&r);
    store_record_clear(&r);
    cr_expect_eq(store_complete(other, SCOPE, "k", lease_in(other, SCOPE, "k"), t0 + 40, TTL, 500, NULL, 0,
                                NULL, 0, false, &err), -EALREADY);
    store_close(other);
}

Test(store, lost_scripts_are_loaded_again)
{
    struct store_acquire_out out;

    expect_acquired("a", fp_a, t0, 1);
    cr_assert(redis_server_cmd(&srv, "SCRIPT FLUSH"));
    expect_acquired("b", fp_a, t0, 1);
    cr_assert(redis_server_cmd(&srv, "SCRIPT FLUSH"));
    cr_assert_eq(store_release(st, SCOPE, "b", 1, lease_in(st, SCOPE, "b"), t0, TTL, &err), 0, "%s", err.text);
    cr_assert(redis_server_cmd(&srv, "SCRIPT FLUSH"));
    complete_bin("a", t0);
    cr_assert(redis_server_cmd(&srv, "SCRIPT FLUSH"));
    cr_assert_eq(store_pause_set(st, SCOPE, t0, t0 + 100, &err), 0, "%s", err.text);
    cr_assert_eq(acquire("a", fp_a, t0, &out), STORE_DONE);
    store_record_clear(&out.rec);
    cr_expect(store_healthy(st));
}

/* ---- asynchronous calls on an event loop ---- */

struct waiter {
    int done;           /* completions seen */
    int in_start;       /* set around a start: done must not run then */
    int done_in_start;
};

static void on_done(struct store_call *c)
{
    struct waiter *w = c->arg;

    w->done++;
    if (w->in_start)
        w->done_in_start++;
}

static void tick(evutil_socket_t fd, short what, void *arg)
{
}

/* Runs base until w has seen n completions or ms have passed; true if it
 * has. A 10 ms tick bounds each turn of the loop. */
static bool run_until(struct event_base *base, struct waiter *w, int n, unsigned ms)
{
    struct event *ev = event_new(base, -1, EV_PERSIST, tick, NULL);
    struct timeval tv = {0, 10000};
    uint64_t end = clock_mono_ns() + (uint64_t)ms * NS_PER_MS;

    event_add(ev, &tv);
    while (w->done < n && clock_mono_ns() < end)
        event_base_loop(base, EVLOOP_ONCE);
    event_free(ev);
    return w->done >= n;
}

static void run_for(struct event_base *base, unsigned ms)
{
    struct waiter never = {0};

    run_until(base, &never, 1, ms);
}

struct aloop {
    struct event_base *base;
    struct store_loop *sl;
};

static struct aloop aloop_new(struct store *s)
{
    struct aloop a = {event_base_new(), NULL};

    cr_assert_not_null(a.base);
    cr_assert_eq(store_loop_new(s, a.base, &a.sl, &err), 0, "%s", err.text);
    return a;
}

static void aloop_free(struct aloop *a)
{
    store_loop_free(a->sl);
    event_base_free(a->base);
}

static void call_init(struct store_call *c, struct waiter *w)
{
    memset(c, 0, sizeof *c);
    c->done = on_done;
    c->arg = w;
}

static int start_acquire(struct aloop *a, struct store_call *c, struct waiter *w,
                         const char *key, uint64_t now)
{
    int rc;

    call_init(c, w);
    w->in_start = 1;
    rc = store_acquire_async(a->sl, c, SCOPE, key, fp_a, now, LEASE, TTL);
    w->in_start = 0;
    return rc;
}

Test(store, async_calls_complete_on_the_loop)
{
    struct aloop a = aloop_new(st);
    struct waiter w = {0};
    struct store_call c;
    uint64_t until;

    cr_assert_eq(start_acquire(&a, &c, &w, "k", t0), -EINPROGRESS, "%s", c.err.text);
    cr_expect(store_call_pending(&c));
    cr_expect_eq(w.done, 0);
    cr_assert(run_until(a.base, &w, 1, WAIT_MS));
    cr_expect_eq(w.done_in_start, 0);
    cr_expect_not(store_call_pending(&c));
    cr_assert_eq(c.rc, 0, "%s", c.err.text);
    cr_expect_eq(c.acq.claim, STORE_ACQUIRED);
    cr_expect_eq(c.acq.attempt, 1);

    call_init(&c, &w);
    cr_assert_eq(store_complete_async(a.sl, &c, SCOPE, "k", lease_in(st, SCOPE, "k"), t0 + 5, TTL, 201, HDRS, 3,
                                      BIN_BODY, sizeof BIN_BODY, false), -EINPROGRESS);
    cr_assert(run_until(a.base, &w, 2, WAIT_MS));
    cr_assert_eq(c.rc, 0, "%s", c.err.text);

    call_init(&c, &w);
    cr_assert_eq(store_get_async(a.sl, &c, SCOPE, "k", t0 + 6), -EINPROGRESS);
    cr_assert(run_until(a.base, &w, 3, WAIT_MS));
    cr_assert_eq(c.rc, 0, "%s", c.err.text);
    expect_bin_result(&c.rec);
    cr_expect_eq(c.rec.completed_ms, t0 + 5);
    store_record_clear(&c.rec);

    cr_assert_eq(start_acquire(&a, &c, &w, "k", t0 + 7), -EINPROGRESS);
    cr_assert(run_until(a.base, &w, 4, WAIT_MS));
    cr_assert_eq(c.rc, 0);
    cr_expect_eq(c.acq.claim, STORE_DONE);
    expect_bin_result(&c.acq.rec);
    store_record_clear(&c.acq.rec);

    call_init(&c, &w);
    cr_assert_eq(store_release_async(a.sl, &c, SCOPE, "k", 1, lease_in(st, SCOPE, "k"), t0 + 8, TTL), -EINPROGRESS);
    cr_assert(run_until(a.base, &w, 5, WAIT_MS));
    cr_expect_eq(c.rc, -EALREADY, "%s", c.err.text);

    call_init(&c, &w);
    cr_assert_eq(store_pause_set_async(a.sl, &c, SCOPE, t0, t0 + 5000), -EINPROGRESS);
    cr_assert(run_until(a.base, &w, 6, WAIT_MS));
    cr_assert_eq(c.rc, 0, "%s", c.err.text);
    cr_assert_eq(store_pause_get(st, SCOPE, t0, &until, &err), 0);
    cr_expect_eq(until, t0 + 5000);

    /* A bad key fails at once, before Redis. */
    call_init(&c, &w);
    cr_expect_eq(store_get_async(a.sl, &c, SCOPE, "", t0), -EINVAL);
    cr_expect_not(store_call_pending(&c));
    cr_expect_eq(w.done_in_start, 0);
    aloop_free(&a);
}

#define PIPELINED 64

/* Many exchanges' calls share the loop's one connection; one key's racers
 * still get exactly one lease. */
Test(store, async_calls_pipeline_on_one_connection)
{
    struct aloop a = aloop_new(st);
    static struct store_call calls[PIPELINED];
    struct waiter w = {0};
    int acquired = 0, held = 0;
    char key[32];

    for (int i = 0; i < PIPELINED; i++) {
        snprintf(key, sizeof key, i % 2 ? "same" : "k%d", i);
        cr_assert_eq(start_acquire(&a, &calls[i], &w, key, t0), -EINPROGRESS);
    }
    cr_assert(run_until(a.base, &w, PIPELINED, WAIT_MS));
    for (int i = 0; i < PIPELINED; i++) {
        cr_assert_eq(calls[i].rc, 0, "%s", calls[i].err.text);
        if (i % 2 == 0)
            cr_expect_eq(calls[i].acq.claim, STORE_ACQUIRED);
        else {
            acquired += calls[i].acq.claim == STORE_ACQUIRED;
            held += calls[i].acq.claim == STORE_HELD;
        }
    }
    cr_expect_eq(acquired, 1);
    cr_expect_eq(held, PIPELINED / 2 - 1);
    {
        /* The store's blocking connection, the loop's, and this one. */
        redisReply *r = raw("CLIENT LIST");
        int n = 0;

        for (const char *p = r->str; p && (p = strchr(p, '\n')); p++)
            n++;
        cr_expect_eq(n, 3, "%s", r->str);
        freeReplyObject(r);
    }
    aloop_free(&a);
}

Test(store, async_scripts_are_loaded_again)
{
    struct aloop a = aloop_new(st);
    struct waiter w = {0};
    struct store_call c;

    cr_assert_eq(start_acquire(&a, &c, &w, "a", t0), -EINPROGRESS);
    cr_assert(run_until(a.base, &w, 1, WAIT_MS));
    cr_assert_eq(c.rc, 0, "%s", c.err.text);
    cr_assert(redis_server_cmd(&srv, "SCRIPT FLUSH"));
    cr_assert_eq(start_acquire(&a, &c, &w, "b", t0), -EINPROGRESS);
    cr_assert(run_until(a.base, &w, 2, WAIT_MS));
    cr_assert_eq(c.rc, 0, "%s", c.err.text);
    cr_expect_eq(c.acq.claim, STORE_ACQUIRED);
    aloop_free(&a);
}

Test(store, cancelled_call_never_completes)
{
    struct aloop a = aloop_new(st);
    struct waiter w = {0}, w2 = {0};
    struct store_call c, c2;
    struct store_record r;

    cr_assert_eq(start_acquire(&a, &c, &w, "k", t0), -EINPROGRESS);
    store_call_cancel(&c);
    cr_expect_not(store_call_pending(&c));
    /* Replies come in order: once the next call is answered, the cancelled
     * one's reply has been read (and dropped). */
    cr_assert_eq(start_acquire(&a, &c2, &w2, "other", t0), -EINPROGRESS);
    cr_assert(run_until(a.base, &w2, 1, WAIT_MS));
    run_for(a.base, 50);
    cr_expect_eq(w.done, 0);
    /* Its write may still have happened: here it did. */
    cr_expect_eq(get("k", t0, &r), 0);
    store_record_clear(&r);
    store_call_cancel(&c); /* nothing in flight: nothing to do */
    aloop_free(&a);
}

Test(store, loop_free_cancels_what_is_in_flight)
{
    struct aloop a = aloop_new(st);
    struct waiter w = {0};
    struct store_call c[3];

    for (int i = 0; i < 3; i++)
        cr_assert_eq(start_acquire(&a, &c[i], &w, "k", t0), -EINPROGRESS);
    store_loop_free(a.sl);
    for (int i = 0; i < 3; i++)
        cr_expect_not(store_call_pending(&c[i]));
    cr_expect_eq(w.done, 0);
    event_base_free(a.base);
}

/* ---- Redis stopped, stalled, restarted ---- */

Test(store, redis_stopped_fails_fast_and_clearly)
{
    struct aloop a = aloop_new(st);
    struct waiter w = {0};
    struct store_call c;
    struct store_record r;
    char where[64];
    int rc;

    expect_acquired("k", fp_a, t0, 1);
    cr_assert_eq(start_acquire(&a, &c, &w, "warm", t0), -EINPROGRESS);
    cr_assert(run_until(a.base, &w, 1, WAIT_MS));
    redis_server_stop(&srv);
    snprintf(where, sizeof where, "redis at 127.0.0.1:%u", srv.port);

    /* blocking: an error naming the server, and unhealthy */
    cr_expect_lt(store_get(st, SCOPE, "k", t0, &r, &err), 0);
    cr_expect(strstr(err.text, where), "%s", err.text);
    cr_expect_not(store_healthy(st));

    /* async: fails at once, or completes with an error, promptly */
    rc = start_acquire(&a, &c, &w, "k2", t0);
    if (rc == -EINPROGRESS) {
        cr_assert(run_until(a.base, &w, 2, WAIT_MS), "no completion");
        rc = c.rc;
    }
    cr_expect_lt(rc, 0);
    cr_expect(strstr(c.err.text, where), "%s", c.err.text);
    /* Once the loop knows, a call fails at once. */
    run_for(a.base, 50);
    rc = start_acquire(&a, &c, &w, "k3", t0);
    cr_expect_eq(rc, -ENOTCONN, "%d %s", rc, c.err.text);
    cr_expect(strstr(c.err.text, "not connected"), "%s", c.err.text);
    cr_expect_eq(w.done_in_start, 0);
    aloop_free(&a);
}

Test(store, redis_restarted_is_used_again)
{
    struct aloop a = aloop_new(st);
    struct waiter w = {0};
    struct store_call c;
    uint64_t end;
    bool ok = false;

    expect_acquired("k", fp_a, t0, 1);
    redis_server_stop(&srv);
    run_for(a.base, 300); /* a few failed attempts: the backoff grows */
    cr_expect_not(store_healthy(st));
    cr_assert_eq(redis_server_start(&srv, srv.port, NULL), 0, "restart");
    /* The loop's next attempt comes within its backoff (well under 5 s). */
    end = clock_mono_ns() + (uint64_t)WAIT_MS * NS_PER_MS;
    while (!ok && clock_mono_ns() < end) {
        int rc = start_acquire(&a, &c, &w, "after", t0);

        if (rc == -EINPROGRESS) {
            int before = w.done;

            cr_assert(run_until(a.base, &w, before + 1, WAIT_MS));
            rc = c.rc;
        }
        ok = rc == 0;
        if (!ok)
            run_for(a.base, 50);
    }
    cr_assert(ok, "the loop did not reconnect: %s", c.err.text);
    cr_expect_eq(c.acq.claim, STORE_ACQUIRED, "a new, empty Redis");
    cr_expect(store_healthy(st), "back once a command works");
    expect_claim("after", fp_a, t0, STORE_HELD);
    aloop_free(&a);
}

Test(store, stalled_redis_times_out)
{
    struct store *fast = open_with(NULL, 0, 200, NULL);
    struct aloop a = aloop_new(fast);
    struct waiter w = {0};
    struct store_call c;
    struct store_record r;
    uint64_t start;

    cr_assert_eq(start_acquire(&a, &c, &w, "warm", t0), -EINPROGRESS);
    cr_assert(run_until(a.base, &w, 1, WAIT_MS));
    cr_assert_eq(c.rc, 0, "%s", c.err.text);
    cr_assert_eq(kill(srv.pid, SIGSTOP), 0);
    start = clock_mono_ns();
    cr_assert_eq(start_acquire(&a, &c, &w, "k", t0), -EINPROGRESS);
    cr_assert(run_until(a.base, &w, 2, WAIT_MS));
    cr_expect_eq(c.rc, -ETIMEDOUT, "%d %s", c.rc, c.err.text);
    cr_expect(strstr(c.err.text, "no reply within 200 ms"), "%s", c.err.text);
    cr_expect_lt(clock_mono_ns() - start, 2000 * NS_PER_MS);
    cr_expect_eq(store_get(fast, SCOPE, "k", t0, &r, &err), -ETIMEDOUT);
    cr_expect(strstr(err.text, "no reply within 200 ms"), "%s", err.text);
    cr_assert_eq(kill(srv.pid, SIGCONT), 0);
    aloop_free(&a);
    store_close(fast);
}

Test(store, store_opens_while_redis_is_down)
{
    struct store *later;
    struct store_record r;

    redis_server_stop(&srv);
    later = open_second();
    cr_expect_not(store_healthy(later));
    cr_expect_eq(store_get(later, SCOPE, "k", t0, &r, &err), -ENOTCONN);
    cr_expect(strstr(err.text, "cannot connect"), "%s", err.text);
    cr_assert_eq(redis_server_start(&srv, srv.port, NULL), 0, "restart");
    cr_expect(store_healthy(later));
    cr_expect_eq(store_get(later, SCOPE, "k", t0, &r, &err), -ENOENT);
    store_close(later);
}

/* ---- a password and a db ---- */

Test(store_auth, password_and_db)
{
    struct redis_server s = {0};
    struct store_redis_opts o = {.host = "127.0.0.1", .password = "s3cret",
                                 .db = 3, .timeout_ms = TIMEOUT_MS};
    struct store *good, *bad;
    struct store_acquire_out out;
    struct sc_error e;

    cr_assert_eq(redis_server_start(&s, 0, "s3cret"), 0);
    t0 = clock_wall_ms(); /* this suite has no setup */
    o.port = s.port;
    cr_assert_eq(store_open_redis(&o, &good, &e), 0, "%s", e.text);
    cr_expect(store_healthy(good));
    cr_assert_eq(store_acquire(good, SCOPE, "k", fp_a, t0, LEASE, TTL, &out, &e), 0, "%s", e.text);
    cr_expect_eq(out.claim, STORE_ACQUIRED);
    cr_expect(redis_server_cmd(&s, "SELECT 3"));
    {
        struct timeval tv = {2, 0};
        redisContext *c = redisConnectWithTimeout("127.0.0.1", (int)s.port, tv);
        redisReply *r;

        cr_assert(c && !c->err);
        freeReplyObject(redisCommand(c, "AUTH s3cret"));
        r = redisCommand(c, "EXISTS sluice:{payments}:k:k");
        cr_expect_eq(r->integer, 0, "not in db 0");
        freeReplyObject(r);
        freeReplyObject(redisCommand(c, "SELECT 3"));
        r = redisCommand(c, "EXISTS sluice:{payments}:k:k");
        cr_expect_eq(r->integer, 1, "in db 3");
        freeReplyObject(r);
        redisFree(c);
    }
    o.password = "wrong";
    cr_assert_eq(store_open_redis(&o, &bad, &e), 0, "%s", e.text);
    cr_expect_not(store_healthy(bad));
    cr_expect_lt(store_acquire(bad, SCOPE, "k", fp_a, t0, LEASE, TTL, &out, &e), 0);
    cr_expect(strstr(e.text, "AUTH failed"), "%s", e.text);
    {
        struct aloop a = aloop_new(bad);
        struct waiter w = {0};
        struct store_call c;
        int rc = start_acquire(&a, &c, &w, "k", t0);

        if (rc == -EINPROGRESS) {
            cr_assert(run_until(a.base, &w, 1, WAIT_MS));
            rc = c.rc;
        }
        cr_expect_lt(rc, 0);
        cr_expect(strstr(c.err.text, "AUTH failed") || strstr(c.err.text, "not connected"),
                  "%s", c.err.text);
        aloop_free(&a);
    }
    store_close(bad);
    store_close(good);
    redis_server_destroy(&s);
}

/* ---- a keyed request's lookup, permit and lease in one call ---- */

#define T_NS (10 * NS_PER_S) /* one per 10 s, burst 1 (tau 0): a wait is
                               never over before the test looks */

static uint64_t pl_now; /* the sidecar's clock for permit_lease calls */

/* One permit_lease call on key with max_wait_ms, run to its completion. */
static struct store_call permit_lease(struct aloop *a, struct waiter *w,
                                      const char *key, const uint8_t *fp,
                                      unsigned max_wait_ms)
{
    struct store_bucket_ask b = {.t_ns = T_NS, .max_wait_ns = max_wait_ms * NS_PER_MS};
    struct store_call c;
    int n = w->done + 1;

    call_init(&c, w);
    cr_assert_eq(store_permit_lease_async(a->sl, &c, SCOPE, key, fp,
                                          pl_now ? pl_now : t0, LEASE, TTL, &b),
                 -EINPROGRESS, "%s", c.err.text);
    cr_assert(run_until(a->base, w, n, WAIT_MS));
    cr_assert_eq(c.rc, 0, "%s", c.err.text);
    return c;
}

static struct store_record stored(const char *key)
{
    struct store_record rec;

    cr_assert_eq(store_get(st, SCOPE, key, t0, &rec, &err), 0, "%s", err.text);
    return rec;
}

Test(store, permit_lease_takes_both_or_neither)
{
    struct aloop a = aloop_new(st);
    struct waiter w = {0};
    struct store_call c;
    struct store_record rec;

    /* A new key: the bucket's permit at once, and the lease, which
     * covers the longest wait for the permit as well as the lease. */
    c = permit_lease(&a, &w, "a", fp_a, 1000);
    cr_expect_eq(c.acq.claim, STORE_ACQUIRED);
    cr_expect_eq(c.acq.attempt, 1);
    cr_expect(c.permit.granted);
    cr_expect_eq(c.permit.wait_ns, 0);
    rec = stored("a");
    cr_expect_eq(rec.state, STORE_IN_PROGRESS);
    cr_expect_eq(rec.lease_expires_ms, t0 + LEASE + 1000);
    /* The answer does not carry a fresh key's lease back: it is the one
     * sent, exactly what Redis holds. */
    cr_expect_eq(c.acq.lease, rec.lease);
    cr_expect_eq(c.acq.lease_expires_ms, rec.lease_expires_ms);
    store_record_clear(&rec);

    /* Its duplicate: lease_held, and no permit spent on it... */
    c = permit_lease(&a, &w, "a", fp_a, 1000);
    cr_expect_eq(c.acq.claim, STORE_HELD);
    cr_expect_eq(c.acq.remaining_ms, LEASE + 1000);
    cr_expect_not(c.permit.granted);
    /* ...so the next key waits one interval, not two. */
    c = permit_lease(&a, &w, "b", fp_a, 60000);
    cr_expect_eq(c.acq.claim, STORE_ACQUIRED);
    cr_expect(c.permit.granted);
    cr_expect(c.permit.wait_ns > T_NS / 2 && c.permit.wait_ns <= T_NS, "%llu",
              (unsigned long long)c.permit.wait_ns);

    /* No permit within max_wait: nothing taken, the key stays free. */
    c = permit_lease(&a, &w, "c", fp_a, 0);
    cr_expect_eq(c.acq.claim, STORE_FREE);
    cr_expect_eq(c.acq.attempt, 1);
    cr_expect_not(c.permit.granted);
    cr_expect(c.permit.wait_ns > 0);
    cr_expect_eq(store_get(st, SCOPE, "c", t0, &rec, &err), -ENOENT);

    /* Another request under the same key, and a stored result: answered
     * from the record. */
    c = permit_lease(&a, &w, "a", fp_b, 1000);
    cr_expect_eq(c.acq.claim, STORE_MISMATCH);
    cr_assert_eq(store_complete(st, SCOPE, "a", lease_in(st, SCOPE, "a"), t0 + 1, TTL, 201, HDRS, 3,
                                BIN_BODY, sizeof BIN_BODY, false, &err), 0, "%s", err.text);
    c = permit_lease(&a, &w, "a", fp_a, 1000);
    cr_expect_eq(c.acq.claim, STORE_DONE);
    expect_bin_result(&c.acq.rec);
    store_record_clear(&c.acq.rec);
    aloop_free(&a);
}

/* A lease taken with its permit, given back before anything was sent,
 * spends none of the job's attempts; fenced like any release. */
Test(store, release_unsent_gives_the_attempt_back)
{
    struct aloop a = aloop_new(st);
    struct waiter w = {0};
    struct store_call c;
    struct store_record rec;
    uint64_t first;

    c = permit_lease(&a, &w, "k", fp_a, 1000);
    cr_assert_eq(c.acq.claim, STORE_ACQUIRED);
    first = c.acq.lease;
    cr_assert_eq(store_release(st, SCOPE, "k", 1, first, t0 + 1, TTL, &err), 0, "%s", err.text);
    pl_now = t0 + 1;
    c = permit_lease(&a, &w, "k", fp_a, 60000); /* a takeover: attempt 2 */
    cr_assert_eq(c.acq.claim, STORE_ACQUIRED);
    cr_assert_eq(c.acq.attempt, 2);

    call_init(&c, &w);
    cr_assert_eq(store_release_unsent_async(a.sl, &c, SCOPE, "k", 1, first, t0 + 2, TTL),
                 -EINPROGRESS);
    cr_assert(run_until(a.base, &w, w.done + 1, WAIT_MS));
    cr_expect_eq(c.rc, -ESTALE, "another attempt's lease is not ours to end");

    call_init(&c, &w);
    cr_assert_eq(store_release_unsent_async(a.sl, &c, SCOPE, "k", 2, lease_in(st, SCOPE, "k"), t0 + 2, TTL),
                 -EINPROGRESS);
    cr_assert(run_until(a.base, &w, w.done + 1, WAIT_MS));
    cr_assert_eq(c.rc, 0, "%s", c.err.text);
    rec = stored("k");
    cr_expect_eq(rec.attempt, 1);
    cr_expect_eq(rec.lease_expires_ms, t0 + 2);
    cr_expect_eq(rec.created_ms, t0);
    store_record_clear(&rec);

    /* Free again, as the next attempt; refused now, it says so. */
    pl_now = t0 + 3;
    c = permit_lease(&a, &w, "k", fp_a, 0);
    cr_expect_eq(c.acq.claim, STORE_FREE);
    cr_expect_eq(c.acq.attempt, 2);
    aloop_free(&a);
}

/* Redis's count of EVALSHA calls so far. */
static long long evalsha_calls(void)
{
    redisReply *r = raw("INFO commandstats");
    const char *p = r->type == REDIS_REPLY_STRING ? strstr(r->str, "cmdstat_evalsha:calls=") : NULL;
    long long n = p ? atoll(p + strlen("cmdstat_evalsha:calls=")) : 0;

    freeReplyObject(r);
    return n;
}

/* The keyed requests a loop starts in one pass go as one script call per
 * bucket (redis_join.h), each answered as if it had gone alone after
 * those before it: the permits are counted in order, a duplicate of an
 * earlier one in the same call meets its lease and spends no permit, a
 * request of another bucket (a partition) or asking another max_wait goes
 * in a call of its own, and one cancelled before the pass ended is never
 * sent. */
Test(store, keyed_requests_of_one_pass_go_as_one_call)
{
    struct aloop a = aloop_new(st);
    struct store_bucket_ask b = {.t_ns = T_NS, .max_wait_ns = 25 * NS_PER_S};
    struct store_bucket_ask other = b, nowait = b;
    const char *keys[] = {"j1", "j2", "j1", "j3", "j4", "p1", "w1", "gone"};
    const struct store_bucket_ask *asks[] = {&b, &b, &b, &b, &b, &other, &nowait, &b};
    struct waiter w = {0};
    struct store_call c[8];
    struct store_record rec;
    long long before;

    other.partition = "tenant-2";
    nowait.max_wait_ns = 0;
    c[0] = permit_lease(&a, &w, "warm", fp_a, 0); /* connected, scripts in */
    pl_now = t0;
    /* The bucket starts empty for the calls below: "warm" took the one
     * token, so the first of them waits one interval. */
    before = evalsha_calls();
    for (int i = 0; i < 8; i++) {
        call_init(&c[i], &w);
        cr_assert_eq(store_permit_lease_async(a.sl, &c[i], SCOPE, keys[i], fp_a, t0, LEASE,
                                              TTL, asks[i]), -EINPROGRESS, "%s", c[i].err.text);
    }
    store_call_cancel(&c[7]);
    cr_assert(run_until(a.base, &w, w.done + 7, WAIT_MS));
    for (int i = 0; i < 7; i++)
        cr_assert_eq(c[i].rc, 0, "%s: %s", keys[i], c[i].err.text);
    cr_expect_eq(evalsha_calls() - before, 3, "one call for the bucket's five, one each for "
                 "the partition's and the other max_wait's");

    cr_expect_eq(c[0].acq.claim, STORE_ACQUIRED);
    cr_expect(c[0].permit.granted);
    cr_expect(c[0].permit.wait_ns > T_NS / 2 && c[0].permit.wait_ns <= T_NS);
    cr_expect_eq(c[1].acq.claim, STORE_ACQUIRED);
    cr_expect(c[1].permit.granted);
    cr_expect(c[1].permit.wait_ns > T_NS + T_NS / 2 && c[1].permit.wait_ns <= 2 * T_NS,
              "the second waits behind the first: %llu", (unsigned long long)c[1].permit.wait_ns);
    cr_expect_eq(c[2].acq.claim, STORE_HELD, "j1's duplicate meets the lease taken before it");
    cr_expect_not(c[2].permit.granted);
    for (int i = 3; i < 5; i++) {
        cr_expect_eq(c[i].acq.claim, STORE_FREE, "%s: beyond max_wait", keys[i]);
        cr_expect_not(c[i].permit.granted);
        cr_expect(c[i].permit.wait_ns > b.max_wait_ns);
        cr_expect_eq(store_get(st, SCOPE, keys[i], t0, &rec, &err), -ENOENT);
    }
    cr_expect_eq(c[5].acq.claim, STORE_ACQUIRED, "the partition's own bucket is full");
    cr_expect_eq(c[5].permit.wait_ns, 0);
    cr_expect_eq(c[6].acq.claim, STORE_FREE, "no wait allowed, none free");
    cr_expect_eq(store_get(st, SCOPE, "gone", t0, &rec, &err), -ENOENT,
                 "the cancelled call was never sent");
    aloop_free(&a);
}

/* Every kind of answer in one joined call, each of its own length in the
 * call's flat reply, reaches its own request: a fresh key's lease, a
 * stored result (replayed), another request's key (mismatch), a released
 * lease taken over (attempt 2), a live lease (held), and a fresh key
 * after them all. */
Test(store, each_answer_of_a_joined_call_is_its_own_request_s)
{
    struct aloop a = aloop_new(st);
    struct store_bucket_ask b = {.t_ns = 1000, .max_wait_ns = 60 * NS_PER_S};
    const char *keys[] = {"m1", "m-done", "m-other", "m-over", "m-held", "m2"};
    const uint8_t *fps[] = {fp_a, fp_a, fp_a, fp_a, fp_a, fp_a};
    struct waiter w = {0};
    struct store_call c[6];
    struct store_acquire_out out;
    long long before;

    cr_assert_eq(store_acquire(st, SCOPE, "m-done", fp_a, t0, LEASE, TTL, &out, &err), 0,
                 "%s", err.text);
    cr_assert_eq(store_complete(st, SCOPE, "m-done", out.lease, t0 + 1, TTL, 201, HDRS, 3,
                                BIN_BODY, sizeof BIN_BODY, false, &err), 0, "%s", err.text);
    cr_assert_eq(store_acquire(st, SCOPE, "m-other", fp_b, t0, LEASE, TTL, &out, &err), 0,
                 "%s", err.text);
    cr_assert_eq(store_acquire(st, SCOPE, "m-over", fp_a, t0, LEASE, TTL, &out, &err), 0,
                 "%s", err.text);
    cr_assert_eq(store_release(st, SCOPE, "m-over", 1, out.lease, t0 + 1, TTL, &err), 0,
                 "%s", err.text);
    cr_assert_eq(store_acquire(st, SCOPE, "m-held", fp_a, t0, LEASE, TTL, &out, &err), 0,
                 "%s", err.text);
    c[0] = permit_lease(&a, &w, "warm", fp_a, 0); /* connected, scripts in */
    pl_now = t0 + 2;
    before = evalsha_calls();
    for (int i = 0; i < 6; i++) {
        call_init(&c[i], &w);
        cr_assert_eq(store_permit_lease_async(a.sl, &c[i], SCOPE, keys[i], fps[i], pl_now,
                                              LEASE, TTL, &b), -EINPROGRESS, "%s", c[i].err.text);
    }
    cr_assert(run_until(a.base, &w, w.done + 6, WAIT_MS));
    pl_now = 0;
    cr_expect_eq(evalsha_calls() - before, 1, "one call for all six");
    for (int i = 0; i < 6; i++)
        cr_assert_eq(c[i].rc, 0, "%s: %s", keys[i], c[i].err.text);
    cr_expect_eq(c[0].acq.claim, STORE_ACQUIRED);
    cr_expect_eq(c[0].acq.attempt, 1);
    cr_expect(c[0].permit.granted);
    cr_expect_eq(c[1].acq.claim, STORE_DONE);
    expect_bin_result(&c[1].acq.rec);
    store_record_clear(&c[1].acq.rec);
    cr_expect_not(c[1].permit.granted, "a replay spends no permit");
    cr_expect_eq(c[2].acq.claim, STORE_MISMATCH);
    cr_expect_eq(c[3].acq.claim, STORE_ACQUIRED);
    cr_expect_eq(c[3].acq.attempt, 2, "taken over: the next attempt");
    cr_expect(c[3].permit.granted);
    cr_expect_eq(c[3].acq.lease, lease_in(st, SCOPE, "m-over"));
    cr_expect_eq(c[4].acq.claim, STORE_HELD);
    cr_expect_eq(c[4].acq.lease, out.lease);
    cr_expect_eq(c[5].acq.claim, STORE_ACQUIRED);
    cr_expect_eq(c[5].acq.attempt, 1);
    cr_expect(c[5].permit.granted);
    cr_expect(c[5].permit.wait_ns > c[3].permit.wait_ns, "m2 waits behind m-over's permit");
    cr_expect_eq(c[5].acq.lease, lease_in(st, SCOPE, "m2"));
    aloop_free(&a);
}

/* The completions a loop starts in one pass go as one script call per
 * slot, each answered as if it had gone alone: the results are stored
 * (and replayed), a stale fence is refused with the record kept as it
 * was, a key with no record is refused and left absent, a second result
 * for a key completed earlier in the same call is refused and the first
 * stays; another policy's key (another hash tag, another slot on a
 * Cluster) goes in a call of its own. */
Test(store, completions_of_one_pass_go_as_one_call)
{
    struct aloop a = aloop_new(st);
    const char *keys[] = {"c1", "c2", "c3", "c1", "none", "c4"};
    const char *scopes[] = {SCOPE, SCOPE, SCOPE, SCOPE, SCOPE, "orders"};
    uint64_t lease[6];
    struct waiter w = {0};
    struct store_call c[6];
    struct store_record rec;
    struct store_acquire_out out;
    long long before;

    for (int i = 0; i < 6; i++) {
        if (i == 3 || i == 4)
            continue;
        cr_assert_eq(store_acquire(st, scopes[i], keys[i], fp_a, t0, LEASE, TTL, &out, &err), 0,
                     "%s", err.text);
        lease[i] = out.lease;
    }
    lease[3] = lease[0]; /* c1 again, after its own completion */
    lease[4] = 12345;
    lease[2] ^= 1; /* not c3's lease */
    c[0] = permit_lease(&a, &w, "warm", fp_a, 0); /* connected, scripts in */
    before = evalsha_calls();
    for (int i = 0; i < 6; i++) {
        call_init(&c[i], &w);
        cr_assert_eq(store_complete_async(a.sl, &c[i], scopes[i], keys[i], lease[i], t0 + 1, TTL,
                                          201, HDRS, 3, BIN_BODY, sizeof BIN_BODY, false),
                     -EINPROGRESS, "%s", c[i].err.text);
    }
    cr_assert(run_until(a.base, &w, w.done + 6, WAIT_MS));
    cr_expect_eq(evalsha_calls() - before, 2, "one call for payments' five, one for orders'");
    cr_expect_eq(c[0].rc, 0, "%s", c[0].err.text);
    cr_expect_eq(c[1].rc, 0, "%s", c[1].err.text);
    cr_expect_eq(c[2].rc, -ESTALE, "%d %s", c[2].rc, c[2].err.text);
    cr_expect_eq(c[3].rc, -EALREADY, "%d %s", c[3].rc, c[3].err.text);
    cr_expect_eq(c[4].rc, -ENOENT, "%d %s", c[4].rc, c[4].err.text);
    cr_expect_eq(c[5].rc, 0, "%s", c[5].err.text);
    for (int i = 0; i < 6; i++) {
        int rc = store_get(st, scopes[i], keys[i], t0 + 2, &rec, &err);

        if (i == 4) {
            cr_expect_eq(rc, -ENOENT, "no record was made for %s", keys[i]);
            continue;
        }
        cr_assert_eq(rc, 0, "%s: %s", keys[i], err.text);
        if (i == 2) {
            cr_expect_eq(rec.state, STORE_IN_PROGRESS, "c3 kept its lease");
        } else {
            cr_expect_eq(rec.state, STORE_COMPLETED, "%s", keys[i]);
            expect_bin_result(&rec);
        }
        store_record_clear(&rec);
    }
    aloop_free(&a);
}

/* An error of a whole joined call goes to each request in it: after
 * SCRIPT FLUSH the joined call meets NOSCRIPT, and each request goes
 * again alone (its script loaded again) and is answered as it would have
 * been; with Redis gone, each fails with the store's reason. */
Test(store, a_joined_call_s_error_is_each_request_s)
{
    struct aloop a = aloop_new(st);
    struct store_bucket_ask b = {.t_ns = 1000, .max_wait_ns = 60 * NS_PER_S};
    const char *keys[] = {"e1", "e2", "e1"};
    struct waiter w = {0};
    struct store_call c[3];

    c[0] = permit_lease(&a, &w, "warm", fp_a, 0); /* connected, scripts in */
    cr_assert(redis_server_cmd(&srv, "SCRIPT FLUSH"));
    for (int i = 0; i < 3; i++) {
        call_init(&c[i], &w);
        cr_assert_eq(store_permit_lease_async(a.sl, &c[i], SCOPE, keys[i], fp_a, t0, LEASE,
                                              TTL, &b), -EINPROGRESS, "%s", c[i].err.text);
    }
    cr_assert(run_until(a.base, &w, w.done + 3, WAIT_MS));
    for (int i = 0; i < 3; i++)
        cr_assert_eq(c[i].rc, 0, "%s: %s", keys[i], c[i].err.text);
    cr_expect_eq(c[0].acq.claim, STORE_ACQUIRED);
    cr_expect_eq(c[1].acq.claim, STORE_ACQUIRED);
    cr_expect_eq(c[2].acq.claim, STORE_HELD, "e1's duplicate, sent again after e1");

    redis_server_stop(&srv);
    {
        int want = w.done;

        for (int i = 0; i < 3; i++) {
            char key[16];
            int rc;

            snprintf(key, sizeof key, "down%d", i);
            call_init(&c[i], &w);
            rc = store_permit_lease_async(a.sl, &c[i], SCOPE, key, fp_a, t0, LEASE, TTL, &b);
            if (rc == -EINPROGRESS)
                want++;
            else
                c[i].rc = rc; /* refused at once: the connection is known gone */
        }
        cr_assert(run_until(a.base, &w, want, WAIT_MS));
    }
    for (int i = 0; i < 3; i++) {
        cr_expect_lt(c[i].rc, 0, "call %d", i);
        cr_expect(strstr(c[i].err.text, "redis at"), "%s", c[i].err.text);
    }
    cr_assert_eq(redis_server_start(&srv, srv.port, NULL), 0, "restart");
    aloop_free(&a);
}

/* RocksDB shares no buckets: the call is refused at once, clearly. */
Test(store, permit_lease_needs_a_shared_store)
{
    char dir[] = "/tmp/sluice-pl-XXXXXX";
    struct store *rocks = NULL;
    struct aloop a;
    struct store_call c = {0};
    struct store_bucket_ask b = {.t_ns = T_NS};

    cr_assert_not_null(mkdtemp(dir));
    cr_assert_eq(store_open_rocksdb(dir, false, &rocks, &err), 0, "%s", err.text);
    a = aloop_new(rocks);
    cr_expect_eq(store_permit_lease_async(a.sl, &c, SCOPE, "k", fp_a, t0, LEASE,
                                          TTL, &b), -EOPNOTSUPP);
    cr_expect(strstr(c.err.text, "no shared buckets"), "%s", c.err.text);
    cr_expect_eq(store_release_unsent_async(a.sl, &c, SCOPE, "k", 1, lease_in(st, SCOPE, "k"), t0, TTL),
                 -EOPNOTSUPP);
    aloop_free(&a);
    store_close(rocks);
    tu_rm_rf(dir);
}

/* Redis stalls past the calls' timeout, then answers: the calls have
 * completed with -ETIMEDOUT (their requests were answered
 * store_unavailable and sent nothing), so the leases Redis granted them
 * late are given back at once, uncounted, on the same connection, not
 * left to block their keys for the whole lease. */
Test(store, a_lease_granted_after_its_call_gave_up_is_given_back)
{
    struct store *fast = open_with(NULL, 0, 200, NULL);
    struct aloop a = aloop_new(fast);
    struct store_bucket_ask b = {.t_ns = T_NS, .max_wait_ns = 60 * NS_PER_S};
    const char *keys[] = {"late-acquire", "late-permit-lease"};
    struct waiter w = {0};
    struct store_call c[2];
    struct store_record rec;
    uint64_t start;

    cr_assert_eq(start_acquire(&a, &c[0], &w, "warm", t0), -EINPROGRESS);
    cr_assert(run_until(a.base, &w, 1, WAIT_MS));
    cr_assert_eq(c[0].rc, 0, "%s", c[0].err.text);
    cr_assert_eq(kill(srv.pid, SIGSTOP), 0);
    start = clock_mono_ns();
    cr_assert_eq(start_acquire(&a, &c[0], &w, keys[0], t0), -EINPROGRESS);
    call_init(&c[1], &w);
    cr_assert_eq(store_permit_lease_async(a.sl, &c[1], SCOPE, keys[1], fp_a, t0, LEASE,
                                          TTL, &b), -EINPROGRESS);
    cr_assert(run_until(a.base, &w, 3, WAIT_MS));
    for (int i = 0; i < 2; i++) {
        cr_expect_eq(c[i].rc, -ETIMEDOUT, "%s: %d %s", keys[i], c[i].rc, c[i].err.text);
        cr_expect(strstr(c[i].err.text, "no reply within 200 ms"), "%s", c[i].err.text);
    }
    cr_expect_lt(clock_mono_ns() - start, 1000 * NS_PER_MS, "the calls waited past their timeout");
    cr_assert_eq(kill(srv.pid, SIGCONT), 0);
    run_for(a.base, 500); /* the late replies, and the releases they cause */
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(store_get(fast, SCOPE, keys[i], t0, &rec, &err), 0, "%s: %s", keys[i],
                     err.text);
        cr_expect_eq(rec.state, STORE_IN_PROGRESS);
        cr_expect_eq(rec.attempt, 0, "%s: the attempt that never went out is not counted",
                     keys[i]);
        cr_expect_leq(rec.lease_expires_ms, clock_wall_ms(), "%s: still leased", keys[i]);
        store_record_clear(&rec);
    }
    /* The same connection goes on: the stall cost no reconnect. */
    cr_assert_eq(start_acquire(&a, &c[0], &w, keys[0], clock_wall_ms()), -EINPROGRESS);
    cr_assert(run_until(a.base, &w, 4, WAIT_MS));
    cr_assert_eq(c[0].rc, 0, "%s", c[0].err.text);
    cr_expect_eq(c[0].acq.claim, STORE_ACQUIRED);
    cr_expect_eq(c[0].acq.attempt, 1);
    aloop_free(&a);
    store_close(fast);
}

/* Fleet mode does not verify unknown outcomes yet (--check-config refuses
 * idempotency.verify with store.backend: redis): its calls say so. */
/* The verification cases, against the real redis-server: the marks are
 * scripts, so a claim is atomic fleet-wide. */
#define VERIFY_SUITE store
#define VERIFY_FP fp_a
#include "unit/store/verify_cases.h"

/* Two sidecars race to claim one lease's verification: exactly one wins;
 * the other's result steps are refused, the winner's apply. */
Test(store, verify_claim_is_won_by_one_sidecar)
{
    struct store *other = open_second();
    struct store_acquire_out out;
    struct store_record rec;

    cr_assert_eq(store_acquire(st, SCOPE, "race", fp_a, t0, LEASE, TTL, &out,
                               &err), 0, "%s", err.text);
    cr_assert_eq(store_verify_claim(other, SCOPE, "race", out.lease, t0 + 1,
                                    t0 + 5000, false, &err), 0, "%s", err.text);
    cr_expect_eq(store_verify_claim(st, SCOPE, "race", out.lease, t0 + 2,
                                    t0 + 5000, false, &err), -EALREADY);
    cr_assert_eq(store_verify_absent(other, SCOPE, "race", out.lease, t0 + 3, TTL,
                                     &err), 0, "%s", err.text);
    cr_expect_eq(store_verify_failed(st, SCOPE, "race", out.lease, t0 + 4, &err),
                 -ESTALE, "released: a second verifier cannot fail it");
    cr_assert_eq(store_get(st, SCOPE, "race", t0 + 5, &rec, &err), 0);
    cr_expect_eq(rec.verify, ABSENT);
    store_record_clear(&rec);
    store_close(other);
}

/* Holders (contract §11): a held lease is reported with whether the
 * process responsible for it (the one that took it, then the one verifying
 * it) still has its liveness key. */
static struct store_acquire_out held_by(struct store *s, const char *key)
{
    struct store_acquire_out out;

    cr_assert_eq(store_acquire(s, SCOPE, key, fp_a, t0 + 1, LEASE, TTL, &out,
                               &err), 0, "%s", err.text);
    cr_assert_eq(out.claim, STORE_HELD);
    return out;
}

Test(store, a_held_lease_tells_whether_its_holder_is_gone)
{
    struct store *other = open_second();
    struct store_acquire_out out;
    struct store_record rec;
    char taker[STORE_HOLDER_LEN + 1];
    uint64_t fence;

    cr_assert_eq(store_live_refresh(st, SCOPE, 3000, &err), 0, "%s", err.text);
    cr_assert_eq(store_acquire(st, SCOPE, "hk", fp_a, t0, LEASE, TTL, &out, &err), 0);
    fence = out.lease;
    out = held_by(other, "hk");
    cr_expect_not(out.holder_gone, "its holder refreshes its liveness key");
    cr_expect_eq(out.lease, fence, "the held lease's fence, to verify it");
    cr_assert_eq(store_get(other, SCOPE, "hk", t0 + 1, &rec, &err), 0);
    cr_expect_eq(strlen(rec.holder), 32, "the lease names its holder: %s",
                 rec.holder);
    strcpy(taker, rec.holder);
    store_record_clear(&rec);
    cr_expect_eq(raw_int("EXISTS %s", "sluice:{payments}:h:hk"), 0,
                 "no key of its own: the holder is in the record");
    /* Its holder stops (killed: its key lapses). */
    cr_assert_eq(store_live_refresh(st, SCOPE, 1, &err), 0);
    usleep(20 * 1000);
    cr_expect(held_by(other, "hk").holder_gone);
    cr_expect_not(held_by(st, "hk").holder_gone,
                  "never gone to itself: its requests are still out");
    /* The other sidecar claims the verification: it is responsible now. */
    cr_assert_eq(store_live_refresh(other, SCOPE, 3000, &err), 0);
    cr_assert_eq(store_verify_claim(other, SCOPE, "hk", fence, t0 + 2, t0 + 5000,
                                    false, &err), 0, "%s", err.text);
    out = held_by(st, "hk");
    cr_expect_not(out.holder_gone, "its verifier is alive");
    cr_expect_eq(out.verify, PENDING);
    cr_assert_eq(store_get(st, SCOPE, "hk", t0 + 1, &rec, &err), 0);
    cr_expect(strlen(rec.holder) == 32 && strcmp(rec.holder, taker) != 0,
              "the record names the verifier now: %s", rec.holder);
    store_record_clear(&rec);
    /* ... until the verifier stops too: its pending mark may be taken up. */
    cr_assert_eq(store_live_refresh(other, SCOPE, 1, &err), 0);
    usleep(20 * 1000);
    cr_expect(held_by(st, "hk").holder_gone);
    cr_expect_eq(store_live_refresh(st, "bad scope", 1, &err), -EINVAL);
    store_close(other);
}

/* A lease read by a plain get (a lookup row's) is told about its holder
 * by one more read, of the holder's liveness key: alive while another
 * process refreshes it, gone once it lapses; this process's own id is
 * never another's, and a holder that is not an id is refused before
 * Redis. */
static bool looked_gone(struct aloop *a, struct waiter *w, int n, const char *holder)
{
    struct store_call c;

    call_init(&c, w);
    cr_assert_eq(store_holder_look_async(a->sl, &c, SCOPE, holder), -EINPROGRESS);
    cr_assert(run_until(a->base, w, n, WAIT_MS));
    cr_assert_eq(c.rc, 0, "%s", c.err.text);
    return c.acq.holder_gone;
}

Test(store, a_holders_liveness_is_read_on_its_own)
{
    struct store *other = open_second();
    struct aloop a = aloop_new(other);
    struct waiter w = {0};
    struct store_acquire_out out;
    struct store_record rec;
    struct store_call c;

    cr_assert_eq(store_live_refresh(st, SCOPE, 3000, &err), 0, "%s", err.text);
    cr_assert_eq(store_acquire(st, SCOPE, "lk", fp_a, t0, LEASE, TTL, &out, &err), 0);
    cr_assert_eq(store_get(other, SCOPE, "lk", t0 + 1, &rec, &err), 0);
    cr_expect(store_loop_holder_other(a.sl, rec.holder), "another process's lease");
    cr_expect_not(store_loop_holder_other(a.sl, ""), "a holder not known");
    cr_expect_not(looked_gone(&a, &w, 1, rec.holder), "its holder refreshes its key");
    cr_assert_eq(store_live_refresh(st, SCOPE, 1, &err), 0); /* killed: it lapses */
    usleep(20 * 1000);
    cr_expect(looked_gone(&a, &w, 2, rec.holder));
    store_record_clear(&rec);
    cr_assert_eq(store_get(st, SCOPE, "lk", t0 + 1, &rec, &err), 0);
    {
        struct aloop own = aloop_new(st);

        cr_expect_not(store_loop_holder_other(own.sl, rec.holder),
                      "never another to itself");
        aloop_free(&own);
    }
    store_record_clear(&rec);
    call_init(&c, &w);
    cr_expect_eq(store_holder_look_async(a.sl, &c, SCOPE, "not-an-id\r\nFLUSHALL"),
                 -EINVAL);
    cr_expect_not(store_call_pending(&c));
    aloop_free(&a);
    store_close(other);
}

/* A marked lease is v5 in Redis, keeps its TTL through a claim, and the
 * other scripts (acquire, permit_lease, complete, release) read it. */
Test(store, marked_records_keep_their_ttl_and_are_read_by_every_script)
{
    struct store_acquire_out out;
    long long before, after;
    redisReply *r;

    cr_assert_eq(store_acquire(st, SCOPE, "m", fp_a, t0, LEASE, TTL, &out, &err),
                 0, "%s", err.text);
    before = raw_int("PTTL %s", "sluice:{payments}:k:m");
    cr_assert_eq(store_verify_claim(st, SCOPE, "m", out.lease, t0, t0 + 5000,
                                    false, &err), 0, "%s", err.text);
    after = raw_int("PTTL %s", "sluice:{payments}:k:m");
    cr_expect(after > 0 && after <= before && before - after < 5000,
              "PTTL %lld then %lld", before, after);
    r = raw("GET %s", "sluice:{payments}:k:m");
    cr_assert_eq(r->type, REDIS_REPLY_STRING);
    cr_expect_eq((unsigned char)r->str[0], 5,
                 "a marked lease is version 5 (its holder named)");
    freeReplyObject(r);
    /* A duplicate meets the held lease, and sees its mark. */
    cr_assert_eq(store_acquire(st, SCOPE, "m", fp_a, t0 + 1, LEASE, TTL, &out,
                               &err), 0, "%s", err.text);
    cr_expect_eq(out.claim, STORE_HELD);
    cr_expect_eq(store_acquire(st, SCOPE, "m", fp_b, t0 + 1, LEASE, TTL, &out,
                               &err), 0);
    cr_expect_eq(out.claim, STORE_MISMATCH);
    /* The holder may still complete it (its answer came after all). */
    {
        struct store_record rec;
        uint64_t l = lease_in(st, SCOPE, "m");

        cr_assert_eq(store_complete(st, SCOPE, "m", l, t0 + 2, TTL, 201, NULL, 0,
                                    (const uint8_t *)"ok", 2, false, &err), 0,
                     "%s", err.text);
        cr_assert_eq(store_get(st, SCOPE, "m", t0 + 3, &rec, &err), 0);
        cr_expect_eq(rec.status, 201);
        cr_expect_not(rec.verified);
        store_record_clear(&rec);
    }
}

/* A completion larger than a call's own command buffer (a body of 64 KiB)
 * goes whole, and its lookup's reply, larger than a reply chunk, comes
 * back whole on the loop. */
Test(store, async_large_bodies_go_and_come_back_whole)
{
    struct aloop a = aloop_new(st);
    struct waiter w = {0};
    struct store_call c;
    static uint8_t body[64 * 1024];

    for (size_t i = 0; i < sizeof body; i++)
        body[i] = (uint8_t)(i * 7 + 3);
    cr_assert_eq(start_acquire(&a, &c, &w, "big", t0), -EINPROGRESS, "%s", c.err.text);
    cr_assert(run_until(a.base, &w, 1, WAIT_MS));
    cr_assert_eq(c.rc, 0, "%s", c.err.text);
    call_init(&c, &w);
    cr_assert_eq(store_complete_async(a.sl, &c, SCOPE, "big", lease_in(st, SCOPE, "big"), t0 + 5,
                                      TTL, 200, NULL, 0, body, sizeof body, false), -EINPROGRESS);
    cr_assert(run_until(a.base, &w, 2, WAIT_MS));
    cr_assert_eq(c.rc, 0, "%s", c.err.text);
    for (int i = 0; i < 2; i++) {
        call_init(&c, &w);
        cr_assert_eq(store_get_async(a.sl, &c, SCOPE, "big", t0 + 6), -EINPROGRESS);
        cr_assert(run_until(a.base, &w, 3 + i, WAIT_MS));
        cr_assert_eq(c.rc, 0, "%s", c.err.text);
        cr_expect_eq(c.rec.body_len, sizeof body);
        cr_expect(c.rec.body && !memcmp(c.rec.body, body, sizeof body), "the body changed");
        store_record_clear(&c.rec);
    }
    aloop_free(&a);
}

/* ---- what a keyed request costs Redis, and the forms of earlier
 * releases ---- */

/* Commands Redis ran since CONFIG RESETSTAT (INFO commandstats counts a
 * script's own commands), leaving out the scripts' calls themselves and the
 * statistics' own commands. */
static long long commands_run(void)
{
    static const char *const skip[] = {"evalsha", "eval", "info", "config"};
    redisReply *r = raw("INFO commandstats");
    const char *p = r->str;
    long long n = 0;

    while ((p = strstr(p, "cmdstat_")) != NULL) {
        char name[64];
        long long calls;
        bool counted = true;

        /* a subcommand is "command|sub" (Redis 7) */
        if (sscanf(p, "cmdstat_%63[^:|]%*[^:]:calls=%lld", name, &calls) == 2 ||
            sscanf(p, "cmdstat_%63[^:|]:calls=%lld", name, &calls) == 2) {
            for (size_t i = 0; i < sizeof skip / sizeof *skip; i++)
                counted = counted && strcmp(name, skip[i]) != 0;
            if (counted)
                n += calls;
        }
        p += 8;
    }
    freeReplyObject(r);
    return n;
}

static void complete_on(struct aloop *a, struct waiter *w, const char *key,
                        uint64_t lease, int status)
{
    struct store_call c;
    int n = w->done + 1;

    call_init(&c, w);
    cr_assert_eq(store_complete_async(a->sl, &c, SCOPE, key, lease, t0 + 1, TTL,
                                      status, HDRS, 3, BIN_BODY,
                                      sizeof BIN_BODY, false), -EINPROGRESS);
    cr_assert(run_until(a->base, w, n, WAIT_MS));
    cr_assert_eq(c.rc, 0, "%s", c.err.text);
}

/* A fresh key, its permit granted, completed: five commands in all
 * (TIME, the bucket's GET and SET, the lease's SET NX; the completion's
 * one SET), and the completed record is exactly what two reads would
 * make. */
Test(store, a_fresh_keyed_request_costs_five_commands)
{
    struct aloop a = aloop_new(st);
    struct waiter w = {0};
    struct store_call c;
    struct store_record rec;
    uint64_t lease;

    c = permit_lease(&a, &w, "warm", fp_a, 1000); /* connected, scripts in */
    complete_on(&a, &w, "warm", c.acq.lease, 200);
    freeReplyObject(raw("CONFIG RESETSTAT"));
    c = permit_lease(&a, &w, "fresh", fp_a, 60000);
    cr_assert_eq(c.acq.claim, STORE_ACQUIRED);
    cr_assert(c.permit.granted);
    lease = c.acq.lease;
    complete_on(&a, &w, "fresh", lease, 201);
    cr_expect_eq(commands_run(), 5, "commands per fresh keyed request");
    rec = stored("fresh");
    cr_expect_eq(rec.state, STORE_COMPLETED);
    cr_expect_eq(rec.status, 201);
    cr_expect_eq(rec.attempt, 1);
    cr_expect_eq(rec.created_ms, t0);
    cr_expect_eq(memcmp(rec.fingerprint, fp_a, STORE_FP_LEN), 0);
    cr_expect_str_eq(rec.holder, "", "a result names no holder (version 3)");
    store_record_clear(&rec);
    aloop_free(&a);
}

/* A completion that does not hold the key writes nothing: the value, its
 * expiry, or its absence are as they were. */
Test(store, a_refused_completion_leaves_the_record_as_it_was)
{
    struct store_acquire_out out;
    const char *key = "sluice:{payments}:k:p";
    redisReply *before, *after;
    uint64_t first;
    long long ttl;

    cr_expect_eq(store_complete(st, SCOPE, "none", 42, t0, TTL, 200, NULL, 0,
                                NULL, 0, false, &err), -ENOENT);
    cr_expect_eq(raw_int("EXISTS %s", "sluice:{payments}:k:none"), 0,
                 "no record made where there was none");
    cr_assert_eq(store_acquire(st, SCOPE, "p", fp_a, t0, LEASE, TTL, &out, &err), 0);
    first = out.lease;
    cr_assert_eq(store_acquire(st, SCOPE, "p", fp_a, t0 + LEASE + 1, LEASE, TTL,
                               &out, &err), 0);
    cr_assert_eq(out.claim, STORE_ACQUIRED, "a takeover");
    before = raw("GET %s", key);
    ttl = raw_int("PTTL %s", key);
    cr_expect_eq(store_complete(st, SCOPE, "p", first, t0 + LEASE + 2, TTL, 200,
                                NULL, 0, NULL, 0, false, &err), -ESTALE);
    after = raw("GET %s", key);
    cr_expect(after->len == before->len &&
              memcmp(after->str, before->str, before->len) == 0,
              "the successor's lease is untouched");
    cr_expect(raw_int("PTTL %s", key) > ttl - 5000 &&
              raw_int("PTTL %s", key) <= ttl, "its expiry kept");
    freeReplyObject(before);
    freeReplyObject(after);
    cr_assert_eq(store_complete(st, SCOPE, "p", out.lease, t0 + LEASE + 3, TTL,
                                201, NULL, 0, NULL, 0, false, &err), 0, "%s",
                 err.text);
    before = raw("GET %s", key);
    cr_expect_eq(store_complete(st, SCOPE, "p", out.lease, t0 + LEASE + 4, TTL,
                                500, NULL, 0, NULL, 0, false, &err), -EALREADY);
    after = raw("GET %s", key);
    cr_expect(after->len == before->len &&
              memcmp(after->str, before->str, before->len) == 0,
              "the first result stays");
    freeReplyObject(before);
    freeReplyObject(after);
}

/* A completion that does not know its lease's record (a blocking call)
 * still keeps the stored attempt, creation and fingerprint. */
Test(store, a_completion_keeps_the_stored_attempt_and_creation)
{
    struct store_acquire_out out;
    struct store_record rec;

    cr_assert_eq(store_acquire(st, SCOPE, "t", fp_a, t0, LEASE, TTL, &out, &err), 0);
    cr_assert_eq(store_acquire(st, SCOPE, "t", fp_a, t0 + LEASE + 1, LEASE, TTL,
                               &out, &err), 0);
    cr_assert_eq(out.attempt, 2);
    cr_assert_eq(store_complete(st, SCOPE, "t", out.lease, t0 + LEASE + 2, TTL,
                                201, NULL, 0, NULL, 0, false, &err), 0);
    rec = stored("t");
    cr_expect_eq(rec.attempt, 2);
    cr_expect_eq(rec.created_ms, t0);
    cr_expect_eq(memcmp(rec.fingerprint, fp_a, STORE_FP_LEN), 0);
    store_record_clear(&rec);
}

/* An earlier release kept a bucket as a hash (tat, pu): it is read, so the
 * fleet's pacing carries over, and replaced by the string at the next
 * write. */
Test(store, a_bucket_left_as_a_hash_by_an_earlier_release_is_carried_over)
{
    struct aloop a = aloop_new(st);
    struct waiter w = {0};
    struct store_call c;
    redisReply *r = raw("TIME");
    long long now_us = atoll(r->element[0]->str) * 1000000 +
                       atoll(r->element[1]->str);
    char tat[32];

    freeReplyObject(r);
    snprintf(tat, sizeof tat, "%lld", now_us + 100 * 1000000ll);
    freeReplyObject(raw("HSET sluice:{payments}:b tat %s pu 0", tat));
    c = permit_lease(&a, &w, "h", fp_a, 1000);
    cr_expect_eq(c.acq.claim, STORE_FREE);
    cr_expect(c.permit.wait_ns > 90 * NS_PER_S, "the hash's tat was read: %llu",
              (unsigned long long)c.permit.wait_ns);
    r = raw("TYPE sluice:{payments}:b");
    cr_expect_str_eq(r->str, "hash", "a refused permit writes nothing");
    freeReplyObject(r);
    c = permit_lease(&a, &w, "h", fp_a, 200000);
    cr_expect_eq(c.acq.claim, STORE_ACQUIRED);
    cr_expect(c.permit.wait_ns > 90 * NS_PER_S);
    r = raw("GET sluice:{payments}:b");
    cr_assert_eq(r->type, REDIS_REPLY_STRING, "the string form now");
    cr_expect_eq(atoll(r->str), atoll(tat) + (long long)(T_NS / 1000),
                 "tat moved on by T: %s", r->str);
    freeReplyObject(r);
    cr_expect_gt(raw_int("PTTL %s", "sluice:{payments}:b"), 100000);
    aloop_free(&a);
}

/* One followed-quota permit asked with f's numbers. */
static struct store_call follow_f(struct aloop *a, struct waiter *w,
                                  const struct store_follow *f)
{
    struct store_call c;
    int n = w->done + 1;

    call_init(&c, w);
    cr_assert_eq(store_permit_follow_async(a->sl, &c, SCOPE, NULL, f, 60 * NS_PER_S),
                 -EINPROGRESS, "%s", c.err.text);
    cr_assert(run_until(a->base, w, n, WAIT_MS));
    cr_assert_eq(c.rc, 0, "%s", c.err.text);
    cr_assert(c.permit.granted);
    return c;
}

/* T_ns apart, burst 1, advertised at seen_ms. */
static struct store_call follow(struct aloop *a, struct waiter *w, uint64_t t_ns,
                                uint64_t seen_ms)
{
    return follow_f(a, w, &(struct store_follow){.t_ns = t_ns, .seen_ms = seen_ms});
}

/* The same, with numbers that change to next_t_ns after reset_in_ns. */
static struct store_call follow_reset(struct aloop *a, struct waiter *w, uint64_t t_ns,
                                      uint64_t seen_ms, uint64_t reset_in_ns,
                                      uint64_t next_t_ns)
{
    return follow_f(a, w, &(struct store_follow){
        .t_ns = t_ns, .seen_ms = seen_ms, .reset_in_ns = reset_in_ns,
        .next_t_ns = next_t_ns, .reset_ms = seen_ms + reset_in_ns / NS_PER_MS});
}

/* A capacity that falls drops the tokens above it and no more, as a local
 * bucket's does: 6 of a burst of 10 (100 ms apart) taken at once leave 4;
 * numbers with a capacity of 3 leave 3, so three more go at once and the
 * next 100 ms later. Scaling tat alone kept the 6 taken as a wait against
 * the smaller tolerance: the next start 400 ms away, and at a window's end
 * the permits left fell past its reset. */
Test(store, a_falling_capacity_drops_tokens_and_adds_no_wait)
{
    struct aloop a = aloop_new(st);
    struct waiter w = {0};
    struct store_follow ten = {.t_ns = 100 * NS_PER_MS, .tau_ns = 900 * NS_PER_MS,
                               .seen_ms = 1000};
    struct store_follow three = {.t_ns = 100 * NS_PER_MS, .tau_ns = 200 * NS_PER_MS,
                                 .seen_ms = 2000};
    struct store_call c;

    for (int i = 0; i < 6; i++)
        cr_expect_eq(follow_f(&a, &w, &ten).permit.wait_ns, 0, "burst: %d", i);
    for (int i = 0; i < 3; i++) {
        c = follow_f(&a, &w, &three);
        cr_expect_lt(c.permit.wait_ns, 20 * NS_PER_MS, "three tokens kept, %d: %llu ns", i,
                     (unsigned long long)c.permit.wait_ns);
    }
    c = follow_f(&a, &w, &three);
    cr_expect(c.permit.wait_ns > 60 * NS_PER_MS && c.permit.wait_ns <= 100 * NS_PER_MS,
              "then one per 100 ms: %llu ns", (unsigned long long)c.permit.wait_ns);
    aloop_free(&a);
}

/* Four starts reserved at a quota's low rate (one per 2 s: the end of a
 * window, or min_rate) put the bucket 8 s ahead; the next window's
 * numbers (one per 100 ms) re-time them as four starts of 100 ms, so the
 * fleet's next start is about 400 ms away, not 8 s. Numbers older than
 * the bucket's are paced to the bucket's, and re-time nothing. */
Test(store, newer_quota_numbers_re_time_the_reserved_starts)
{
    struct aloop a = aloop_new(st);
    struct waiter w = {0};
    struct store_call c;

    for (int i = 0; i < 3; i++)
        follow(&a, &w, 2 * NS_PER_S, 1000);
    c = follow(&a, &w, 2 * NS_PER_S, 1000);
    cr_expect_gt(c.permit.wait_ns, 5 * NS_PER_S, "3 starts of 2 s ahead: %llu",
                 (unsigned long long)c.permit.wait_ns);
    c = follow(&a, &w, 100 * NS_PER_MS, 2000);
    cr_expect(c.permit.wait_ns > 300 * NS_PER_MS && c.permit.wait_ns <= 420 * NS_PER_MS,
              "4 starts of 2 s re-timed as 4 of 100 ms: %llu ns",
              (unsigned long long)c.permit.wait_ns);
    c = follow(&a, &w, 2 * NS_PER_S, 1500);
    cr_expect(c.permit.wait_ns > 400 * NS_PER_MS && c.permit.wait_ns <= 520 * NS_PER_MS,
              "older numbers: one more start at the bucket's 100 ms: %llu ns",
              (unsigned long long)c.permit.wait_ns);
    aloop_free(&a);
}

/* A sidecar that has read no answer (its news: none, seen_ms 1) paces to
 * the bucket's numbers, and once their reset has passed, to the numbers
 * after it: the end of a window (one start per 2 s, reset in 300 ms, one
 * per 100 ms after) does not pace the next window for one that joins
 * late. */
Test(store, past_their_reset_the_bucket_paces_to_the_numbers_after_it)
{
    struct aloop a = aloop_new(st);
    struct waiter w = {0};
    struct store_call c;
    redisReply *r;
    int colons = 0;

    c = follow_reset(&a, &w, 2 * NS_PER_S, 1000, 300 * NS_PER_MS, 100 * NS_PER_MS);
    cr_expect_eq(c.permit.wait_ns, 0);
    c = follow(&a, &w, 2 * NS_PER_S, 1);
    cr_expect_gt(c.permit.wait_ns, 1500 * NS_PER_MS, "paced to the bucket's 2 s: %llu",
                 (unsigned long long)c.permit.wait_ns);
    usleep(350 * 1000);
    c = follow(&a, &w, 2 * NS_PER_S, 1);
    cr_expect_lt(c.permit.wait_ns, 500 * NS_PER_MS,
                 "two starts of 2 s (the one at once, one ahead) re-timed as two of "
                 "100 ms: %llu ns", (unsigned long long)c.permit.wait_ns);
    r = raw("GET sluice:{payments}:b");
    cr_assert_eq(r->type, REDIS_REPLY_STRING);
    for (const char *p = r->str; *p; p++)
        colons += *p == ':';
    cr_expect_eq(colons, 4, "tat:pu:qt:qtau:qa, the reset passed: %s", r->str);
    cr_expect_eq(atoll(strrchr(r->str, ':') + 1), 1300, "the reset's news: %s", r->str);
    freeReplyObject(r);
    aloop_free(&a);
}

/* A permit's start between lo_ms (excluded) and hi_ms from its ask. */
static void expect_start_in(const struct store_call *c, unsigned lo_ms, unsigned hi_ms,
                            const char *what)
{
    cr_expect(c->permit.wait_ns > lo_ms * NS_PER_MS && c->permit.wait_ns <= hi_ms * NS_PER_MS,
              "%s: %llu ns", what, (unsigned long long)c->permit.wait_ns);
}

/* The window's remaining permits spent by a second before its reset
 * (policies/quota.h), the change there starts a quiet time: nothing until
 * the reset, then its numbers from one token (never a burst). Here the
 * change comes after 200 ms and the quiet lasts 300 ms: a sidecar asking
 * within it with no news of its own waits for its end, the next one
 * interval after. */
Test(store, a_spent_window_is_a_quiet_time_until_its_reset)
{
    struct aloop a = aloop_new(st);
    struct waiter w = {0};
    struct store_follow f = {.t_ns = 100 * NS_PER_MS, .tau_ns = 900 * NS_PER_MS,
                             .seen_ms = 1000, .reset_in_ns = 200 * NS_PER_MS,
                             .next_t_ns = 100 * NS_PER_MS, .next_tau_ns = 900 * NS_PER_MS,
                             .next_quiet_ns = 300 * NS_PER_MS, .reset_ms = 1200};
    struct store_call c;

    cr_expect_eq(follow_f(&a, &w, &f).permit.wait_ns, 0, "a full bucket before the change");
    usleep(250 * 1000);
    c = follow(&a, &w, 100 * NS_PER_MS, 1);
    expect_start_in(&c, 200, 260, "quiet until 500 ms, 250 ms in");
    c = follow(&a, &w, 100 * NS_PER_MS, 1);
    expect_start_in(&c, 300, 360, "one token at its end, then one per 100 ms");
    aloop_free(&a);
}

/* A sidecar whose own window is spent says so with its numbers (those
 * after the reset) and the quiet time left: the bucket holds nothing
 * until then. Newer numbers within it re-time only the starts reserved
 * past its end: the one start reserved there (at 100 ms, tolerance
 * 900 ms) becomes one at 400 ms, so the next start is 400 ms after the
 * end. Counted from now instead, the quiet's wait read as six starts of
 * 100 ms became six of 400 ms (2.4 s); left as it was, the old
 * tolerance's excess put it at 1.1 s. */
Test(store, a_quiet_time_keeps_its_end_through_newer_numbers)
{
    struct aloop a = aloop_new(st);
    struct waiter w = {0};
    struct store_follow spent = {.t_ns = 100 * NS_PER_MS, .tau_ns = 900 * NS_PER_MS,
                                 .seen_ms = 1000, .quiet_ns = 500 * NS_PER_MS};
    struct store_follow newer = {.t_ns = 400 * NS_PER_MS, .tau_ns = 400 * NS_PER_MS,
                                 .seen_ms = 2000};
    struct store_call c;

    c = follow_f(&a, &w, &spent);
    expect_start_in(&c, 450, 500, "nothing before the quiet's end");
    c = follow_f(&a, &w, &newer);
    expect_start_in(&c, 850, 900, "the start above took the quiet's end, the next is one "
                                  "new interval (400 ms) after it");
    aloop_free(&a);
}

/* A pause told with the policy's configured numbers (a 429's hint, an
 * advertised r = 0, the breaker: 100/s, burst 10) on a bucket that follows
 * a quota (one per 100 ms, capacity 10) holds the followed starts too:
 * with tat set by the configured tolerance (90 ms), a start by the
 * followed one (900 ms) fell 810 ms inside the pause. */
Test(store, a_pause_holds_a_followed_bucket_by_its_own_numbers)
{
    struct aloop a = aloop_new(st);
    struct waiter w = {0};
    struct store_follow f = {.t_ns = 100 * NS_PER_MS, .tau_ns = 900 * NS_PER_MS,
                             .seen_ms = 1000};
    struct store_call c;
    int n;

    follow_f(&a, &w, &f);
    call_init(&c, &w);
    n = w.done + 1;
    cr_assert_eq(store_bucket_pause_async(a.sl, &c, SCOPE, NULL, 10 * NS_PER_MS,
                                          90 * NS_PER_MS, 500 * NS_PER_MS),
                 -EINPROGRESS, "%s", c.err.text);
    cr_assert(run_until(a.base, &w, n, WAIT_MS));
    cr_assert_eq(c.rc, 0, "%s", c.err.text);
    c = follow_f(&a, &w, &f);
    expect_start_in(&c, 450, 500, "the first start at the pause's end");
    c = follow_f(&a, &w, &f);
    expect_start_in(&c, 550, 600, "then one per 100 ms");
    aloop_free(&a);
}

/* A followed quota's request out of the fleet's set of requests in
 * flight: how many the set still holds. */
static uint32_t flight_end(struct aloop *a, struct waiter *w, const char *name)
{
    struct store_call c;
    int n = w->done + 1;

    call_init(&c, w);
    cr_assert_eq(store_flight_end_async(a->sl, &c, SCOPE, NULL, name), -EINPROGRESS,
                 "%s", c.err.text);
    cr_assert(run_until(a->base, w, n, WAIT_MS));
    cr_assert_eq(c.rc, 0, "%s", c.err.text);
    return c.permit.flight;
}

/* A granted permit puts its request in the bucket's set of requests in
 * flight; its answer takes it out and counts the rest (the fleet's f), and
 * a holder whose hold ran out (its sidecar died) is dropped then. */
Test(store, the_fleets_requests_in_flight_are_counted)
{
    struct aloop a = aloop_new(st);
    struct waiter w = {0};
    struct store_follow f = {.t_ns = NS_PER_MS, .seen_ms = 1000, .hold_ms = 60000};

    f.flight = "aaaa";
    follow_f(&a, &w, &f);
    f.flight = "bbbb";
    follow_f(&a, &w, &f);
    cr_expect_eq(raw_int("ZCARD %s", "sluice:{payments}:f"), 2);
    cr_expect_gt(raw_int("PTTL %s", "sluice:{payments}:f"), 60000, "kept as long as a hold");
    cr_expect_eq(flight_end(&a, &w, "aaaa"), 1, "bbbb is still out");
    freeReplyObject(raw("ZADD sluice:{payments}:f 1 dead"));
    cr_expect_eq(flight_end(&a, &w, "bbbb"), 0, "the dead holder dropped");
    cr_expect_eq(flight_end(&a, &w, "bbbb"), 0, "twice is harmless");
    aloop_free(&a);
}

/* The answer that leaves one permit, newer than the bucket's news, lets
 * that permit go at once (the bucket holds one token), once: the next ask
 * with the same news waits its interval. Not when the set of requests in
 * flight holds more than the answer was read with: a permit granted since
 * took the one left. */
Test(store, the_answer_leaving_one_permit_tops_the_bucket_up_once)
{
    struct aloop a = aloop_new(st);
    struct waiter w = {0};
    struct store_follow f = {.t_ns = NS_PER_S, .seen_ms = 1000, .flight = "aaaa",
                             .hold_ms = 60000};
    struct store_call c;

    follow_f(&a, &w, &f);
    f = (struct store_follow){.t_ns = NS_PER_S, .seen_ms = 2000, .top_up = true,
                              .top_up_f = 1, .flight = "bbbb", .hold_ms = 60000};
    c = follow_f(&a, &w, &f);
    cr_expect_lt(c.permit.wait_ns, 20 * NS_PER_MS, "topped up: %llu ns",
                 (unsigned long long)c.permit.wait_ns);
    f.flight = "cccc";
    c = follow_f(&a, &w, &f);
    cr_expect_gt(c.permit.wait_ns, 900 * NS_PER_MS, "not twice for one answer: %llu ns",
                 (unsigned long long)c.permit.wait_ns);
    /* Newer news, read when one was in flight; three are now. */
    f.seen_ms = 3000;
    f.flight = "dddd";
    c = follow_f(&a, &w, &f);
    cr_expect_gt(c.permit.wait_ns, 900 * NS_PER_MS, "taken since: %llu ns",
                 (unsigned long long)c.permit.wait_ns);
    aloop_free(&a);
}

/* A lease taken by an earlier release names no holder in its record: it
 * counts as held by a live process (nothing is inferred from what is not
 * known), and a verification's claim names its verifier there. */
Test(store, a_lease_of_an_earlier_release_counts_as_held_by_a_live_process)
{
    struct store_record old = {
        .state = STORE_IN_PROGRESS, .attempt = 1, .created_ms = t0,
        .lease_expires_ms = t0 + LEASE, .expires_ms = t0 + LEASE + TTL,
        .lease = 7,
    };
    struct store_acquire_out out;
    struct store_record rec;
    redisReply *r;
    uint8_t *buf;
    size_t len;

    memcpy(old.fingerprint, fp_a, STORE_FP_LEN);
    cr_assert_eq(record_encode(&old, &buf, &len, &err), 0);
    cr_assert_eq(buf[0], 3);
    r = raw("SET sluice:{payments}:k:old %b", buf, len);
    freeReplyObject(r);
    free(buf);
    out = held_by(st, "old");
    cr_expect_not(out.holder_gone, "no liveness key anywhere, yet not gone");
    cr_assert_eq(store_verify_claim(st, SCOPE, "old", 7, t0 + 2, t0 + 5000,
                                    false, &err), 0, "%s", err.text);
    rec = stored("old");
    cr_expect_eq(strlen(rec.holder), STORE_HOLDER_LEN, "the verifier named");
    cr_expect_eq(rec.verify, PENDING);
    store_record_clear(&rec);
}
