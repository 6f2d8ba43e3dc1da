/* proxy/upstream/pool.c against a partner of the test's own on loopback (a
 * listener on the same event loop that answers with a head and part of a
 * body, then the rest): a progress callback that ends its request (cancel,
 * as the exchange does when the worker's answer is decided and nobody will
 * read on) is never followed by a read of the request or its connection,
 * and done never runs; one that does not end it sees the response whole. */
#include <criterion/criterion.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

#include "proxy/upstream/upstream.h"

static struct event_base *base;
static struct evconnlistener *listener;
static struct sc_upstream up;
static struct up_pool *pool;
static struct bufferevent *served;

/* The partner: at the request's end, a head and half the body; the other
 * half a moment later, so the body arrives in two reads. */
static void on_later(evutil_socket_t fd, short what, void *arg)
{
    if (served)
        bufferevent_write(served, "world", 5);
}

static void on_request(struct bufferevent *bev, void *arg)
{
    struct evbuffer *in = bufferevent_get_input(bev);
    struct timeval tv = {0, 20000};

    if (!evbuffer_search(in, "\r\n\r\n", 4, NULL).pos)
        return;
    evbuffer_drain(in, evbuffer_get_length(in));
    bufferevent_write(bev, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello", 45);
    event_base_once(base, -1, EV_TIMEOUT, on_later, NULL, &tv);
}

static void on_partner_event(struct bufferevent *bev, short what, void *arg)
{
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)) {
        bufferevent_free(bev);
        served = NULL;
    }
}

static void on_accept(struct evconnlistener *l, evutil_socket_t fd,
                      struct sockaddr *sa, int len, void *arg)
{
    served = bufferevent_socket_new(base, fd, BEV_OPT_CLOSE_ON_FREE);
    bufferevent_setcb(served, on_request, NULL, on_partner_event, NULL);
    bufferevent_enable(served, EV_READ | EV_WRITE);
}

static void setup(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET};
    socklen_t alen = sizeof a;
    static char authority[32];

    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    base = event_base_new();
    cr_assert_not_null(base);
    listener = evconnlistener_new_bind(base, on_accept, NULL, LEV_OPT_CLOSE_ON_FREE, 16,
                                       (struct sockaddr *)&a, sizeof a);
    cr_assert_not_null(listener);
    getsockname(evconnlistener_get_fd(listener), (struct sockaddr *)&a, &alen);
    snprintf(authority, sizeof authority, "127.0.0.1:%u", ntohs(a.sin_port));
    up = (struct sc_upstream){.name = "partner", .host = "127.0.0.1",
                              .port = ntohs(a.sin_port), .authority = authority,
                              .base_path = "", .connect_timeout_ms = 1000,
                              .timeout_ms = 2000, .max_connections = 4};
    pool = up_pool_new(base, NULL, &up, NULL, NULL, 4, NULL);
    cr_assert_not_null(pool);
}

static void teardown(void)
{
    up_pool_free(pool);
    if (served)
        bufferevent_free(served);
    served = NULL;
    evconnlistener_free(listener);
    event_base_free(base);
}

TestSuite(pool, .init = setup, .fini = teardown, .timeout = 10);

struct seen {
    int progress, done;
    bool cancel_on_progress;
    struct evbuffer *wire;  /* the request's, kept past its poisoning */
};

static void on_progress(struct up_request *req, void *arg)
{
    struct seen *s = arg;

    s->progress++;
    if (s->cancel_on_progress) {
        s->wire = req->wire;
        up_request_cancel(req);
        /* The owner may free what it owns now: the request is poisoned so
         * that a read of it after this callback is an error. */
        up_response_clear(&req->resp);
        memset(req, 0xa5, sizeof *req);
    }
}

static void on_done(struct up_request *req, void *arg)
{
    ((struct seen *)arg)->done++;
}

static struct up_request *request(struct seen *s)
{
    struct up_request *req = calloc(1, sizeof *req);

    req->wire = evbuffer_new();
    evbuffer_add_printf(req->wire, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", up.authority);
    req->progress = on_progress;
    req->done = on_done;
    req->arg = s;
    req->hold_max = 1 << 20;
    return req;
}

static void run_for_ms(int ms)
{
    struct timeval tv = {0, ms * 1000};

    event_base_loopexit(base, &tv);
    event_base_dispatch(base);
}

Test(pool, a_progress_callback_may_end_its_request)
{
    struct seen s = {.cancel_on_progress = true};
    struct up_request *req = request(&s);

    cr_assert_eq(up_pool_send(pool, req), 0);
    run_for_ms(100);
    cr_expect_eq(s.progress, 1, "told of the head, once");
    cr_expect_eq(s.done, 0, "a cancelled request is never done");
    cr_expect_eq(up_pool_conns(pool), 0, "its connection went with it");
    evbuffer_free(s.wire);
    free(req);
}

Test(pool, a_progress_callback_that_goes_on_sees_the_whole_response)
{
    struct seen s = {0};
    struct up_request *req = request(&s);

    cr_assert_eq(up_pool_send(pool, req), 0);
    run_for_ms(100);
    cr_expect_geq(s.progress, 1);
    cr_expect_eq(s.done, 1);
    cr_expect_eq(req->resp.result, UP_OK);
    cr_expect_eq(req->resp.status, 200);
    cr_expect_eq(evbuffer_get_length(req->resp.body), 10);
    up_response_clear(&req->resp);
    evbuffer_free(req->wire);
    free(req);
}
