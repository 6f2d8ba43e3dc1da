/* The store's Redis connection layer (store/redis_conn.c) on a real
 * redis-server: a deep pipeline answered in order, a connection closed from
 * inside its own callback, calls in flight when Redis goes, the handshake's
 * refusal with its cause, and the blocking calls' timeout. Every wait is
 * bounded. */
#include <criterion/criterion.h>

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include <event2/event.h>

#include "store/redis_conn.h"
#include "store/redis_sync.h"
#include "support/redis_server.h"
#include "support/testutil.h"
#include "util/clock.h"

#define WAIT_MS 10000
#define N_PIPELINE 2000

static struct redis_server srv;
static struct event_base *base;

static void setup(void)
{
    cr_assert_eq(redis_server_start(&srv, 0, NULL), 0, "redis-server");
    cr_assert(base = event_base_new());
}

static void teardown(void)
{
    event_base_free(base);
    redis_server_destroy(&srv);
}

TestSuite(redis_conn, .init = setup, .fini = teardown, .timeout = 60);

struct seen {
    int n, nulls, lost, lost_rc, ready;
    long long last;
    bool in_order;
    char why[256];
    struct redis_conn *close_at; /* closed from inside the reply n == 10 */
};

static void on_lost(struct redis_conn *c, int rc, const char *why, void *arg)
{
    struct seen *s = arg;

    s->lost++;
    s->lost_rc = rc;
    snprintf(s->why, sizeof s->why, "%s", why);
}

static void on_ready(struct redis_conn *c, void *arg)
{
    ((struct seen *)arg)->ready++;
}

static void on_incr(struct redis_conn *c, redisReply *r, void *arg)
{
    struct seen *s = arg;

    if (!r) {
        s->nulls++;
        return;
    }
    s->n++;
    if (r->type != REDIS_REPLY_INTEGER || r->integer != s->last + 1)
        s->in_order = false;
    s->last = r->integer;
    if (s->close_at && s->n == 10) {
        redis_conn_close(c);
        /* The reply stays readable until this callback returns. */
        cr_expect_eq(r->integer, s->last);
    }
}

static void run_until(int *counter, int want)
{
    uint64_t end = clock_mono_ns() + (uint64_t)WAIT_MS * NS_PER_MS;

    while (*counter < want && clock_mono_ns() < end)
        event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK), tu_sleep_ms(1);
}

static struct redis_conn *open_conn(struct seen *s,
                                    const struct redis_conn_opts *o)
{
    struct redis_conn_events ev = {on_ready, on_lost, NULL, s};
    struct redis_conn *c;
    struct sc_error err;

    cr_assert_eq(redis_conn_open(base, "127.0.0.1", srv.port, o, &ev, &c, &err), 0,
                 "%s", err.text);
    return c;
}

static void send_incr(struct redis_conn *c, struct seen *s)
{
    const char *argv[] = {"INCR", "n"};
    size_t len[] = {4, 1};

    cr_assert_eq(redis_conn_send_argv(c, 2, argv, len, on_incr, s), 0);
}

Test(redis_conn, a_deep_pipeline_is_answered_in_order)
{
    struct redis_conn_opts o = {0};
    struct seen s = {.in_order = true};
    struct redis_conn *c = open_conn(&s, &o);

    /* Sent before the connection is up: queued behind the handshake. */
    for (int i = 0; i < N_PIPELINE; i++)
        send_incr(c, &s);
    run_until(&s.n, N_PIPELINE);
    cr_expect_eq(s.n, N_PIPELINE);
    cr_expect(s.in_order, "replies out of order (last %lld)", s.last);
    cr_expect_eq(s.ready, 1);
    cr_expect(redis_conn_ready(c));
    redis_conn_close(c);
    cr_expect_eq(s.lost, 1, "lost is told once, on close too");
    cr_expect_eq(s.lost_rc, 0);
}

Test(redis_conn, closing_inside_a_callback_ends_the_rest_with_null)
{
    struct redis_conn_opts o = {0};
    struct seen s = {.in_order = true, .close_at = (void *)1};
    struct redis_conn *c = open_conn(&s, &o);

    for (int i = 0; i < 100; i++)
        send_incr(c, &s);
    run_until(&s.lost, 1);
    cr_expect_eq(s.n, 10);
    cr_expect_eq(s.nulls, 90, "every call in flight completes once");
}

Test(redis_conn, a_server_that_goes_ends_calls_in_flight)
{
    struct redis_conn_opts o = {0};
    struct seen s = {.in_order = true};
    struct redis_conn *c = open_conn(&s, &o);

    send_incr(c, &s);
    run_until(&s.n, 1);
    cr_assert_eq(kill(srv.pid, SIGSTOP), 0);
    for (int i = 0; i < 5; i++)
        send_incr(c, &s);
    redis_server_kill(&srv);
    run_until(&s.lost, 1);
    cr_expect_eq(s.lost, 1);
    cr_expect_eq(s.lost_rc, -EIO, "%d %s", s.lost_rc, s.why);
    cr_expect_eq(s.nulls, 5);
}

Test(redis_conn, a_refused_password_is_the_cause)
{
    struct redis_conn_opts o = {.user = "nobody", .password = "s3cret-pw"};
    struct seen s = {.in_order = true};

    open_conn(&s, &o);
    run_until(&s.lost, 1);
    cr_expect_eq(s.lost_rc, -EACCES, "%d %s", s.lost_rc, s.why);
    cr_expect(strstr(s.why, "AUTH failed: WRONGPASS"), "%s", s.why);
    cr_expect_null(strstr(s.why, "s3cret-pw"), "the secret is never shown");
    cr_expect_eq(s.ready, 0);
}

Test(redis_conn, a_refused_connection_says_so)
{
    struct redis_conn_opts o = {0};
    struct seen s = {.in_order = true};
    unsigned port = srv.port;

    redis_server_stop(&srv);
    srv.port = port;
    open_conn(&s, &o);
    run_until(&s.lost, 1);
    cr_expect_eq(s.lost_rc, -ENOTCONN, "%d %s", s.lost_rc, s.why);
    cr_expect(strstr(s.why, "cannot connect"), "%s", s.why);
}

Test(redis_conn, blocking_calls_time_out_and_reconnect)
{
    struct redis_conn_opts o = {0};
    struct redis_sync *s = redis_sync_new(200, NULL, NULL);
    const char *argv[] = {"PING"};
    size_t len[] = {4};
    struct sc_error err;
    redisReply *r;
    uint64_t start;

    cr_assert(s);
    cr_assert_eq(redis_sync_connect(s, "127.0.0.1", srv.port, &o, &err), 0, "%s", err.text);
    cr_assert_eq(redis_sync_command(s, 1, argv, len, &r, &err), 0, "%s", err.text);
    cr_expect_str_eq(r->str, "PONG");
    freeReplyObject(r);
    cr_assert_eq(kill(srv.pid, SIGSTOP), 0);
    start = clock_mono_ns();
    cr_expect_eq(redis_sync_command(s, 1, argv, len, &r, &err), -ETIMEDOUT);
    cr_expect(strstr(err.text, "no reply within 200 ms"), "%s", err.text);
    cr_expect_lt(clock_mono_ns() - start, 1000 * NS_PER_MS);
    cr_expect_not(redis_sync_open(s), "dropped after a timeout");
    cr_assert_eq(kill(srv.pid, SIGCONT), 0);
    cr_assert_eq(redis_sync_connect(s, "127.0.0.1", srv.port, &o, &err), 0, "%s", err.text);
    cr_expect_eq(redis_sync_command(s, 1, argv, len, &r, &err), 0, "%s", err.text);
    freeReplyObject(r);
    redis_sync_free(s);
}

struct nested {
    int n;
    bool ok;
    size_t big_len;
};

static void on_nested(struct redis_conn *c, redisReply *r, void *arg)
{
    struct nested *s = arg;

    s->n++;
    s->ok = r && r->type == REDIS_REPLY_ARRAY && r->elements == 3 &&
            r->element[0]->type == REDIS_REPLY_INTEGER && r->element[0]->integer == 1 &&
            r->element[1]->type == REDIS_REPLY_ARRAY && r->element[1]->elements == 2 &&
            r->element[1]->element[1]->type == REDIS_REPLY_STRING &&
            !strcmp(r->element[1]->element[1]->str, "x") &&
            r->element[2]->type == REDIS_REPLY_STRING && r->element[2]->len == 3 &&
            !strcmp(r->element[2]->str, "abc");
}

static void on_big(struct redis_conn *c, redisReply *r, void *arg)
{
    struct nested *s = arg;

    s->n++;
    s->big_len = r && r->type == REDIS_REPLY_STRING ? r->len : 0;
}

/* Replies are built in the connection's arena, emptied after each
 * callback: nested arrays keep their shape, a reply larger than a chunk
 * comes whole, and the replies after it are intact. */
Test(redis_conn, replies_of_every_shape_come_whole)
{
    const char *script[] = {"EVAL", "return {1, {2, 'x'}, 'abc'}", "0"};
    size_t script_len[] = {4, 27, 1};
    const char *big[] = {"GET", "big"};
    size_t big_len[] = {3, 3};
    struct redis_conn_opts o = {0};
    struct seen s = {.in_order = true};
    struct nested ns = {0};
    struct redis_conn *c = open_conn(&s, &o);
    char cmd[64];

    snprintf(cmd, sizeof cmd, "EVAL redis.call('SET','big',string.rep('y',200000)) 0");
    cr_assert(redis_server_cmd(&srv, cmd));
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(redis_conn_send_argv(c, 3, script, script_len, on_nested, &ns), 0);
        cr_assert_eq(redis_conn_send_argv(c, 2, big, big_len, on_big, &ns), 0);
    }
    cr_assert_eq(redis_conn_send_argv(c, 3, script, script_len, on_nested, &ns), 0);
    run_until(&ns.n, 7);
    cr_expect_eq(ns.n, 7);
    cr_expect(ns.ok, "the last nested reply lost its shape");
    cr_expect_eq(ns.big_len, 200000);
    redis_conn_close(c);
}
