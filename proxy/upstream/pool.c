#include "proxy/upstream/upstream.h"
#include "proxy/upstream/internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/dns.h>
#include <event2/event.h>
#include <openssl/err.h>
#include <openssl/x509v3.h>

#include "obs/metrics.h"
#include "util/clock.h"
#include "util/tls_client.h"

static int conn_start(struct up_conn *c, struct up_request *req);
static void req_finish(struct up_request *req, enum up_result r,
                       const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* ---- TLS ---------------------------------------------------------------- */

/* ---- connection metrics -------------------------------------------------- */

static void pool_gauge(const struct up_pool *pool, uint32_t slot, int64_t d)
{
    if (pool->m.shard)
        metrics_gauge_add(pool->m.shard, slot, d);
}

static void conn_observe(const struct up_conn *c, uint32_t base, uint64_t from_ns)
{
    if (c->pool->m.shard)
        metrics_observe(c->pool->m.shard, H_CONNECT, base,
                        (double)(clock_mono_ns() - from_ns) / 1e9);
}

void up_conn_tcp_up(struct up_conn *c)
{
    if (c->tcp_ns)
        return;
    conn_observe(c, c->pool->m.connect, c->dial_ns);
    c->tcp_ns = clock_mono_ns();
}

/* The bufferevent's CONNECTED: for TLS, the handshake is done. */
static void conn_established(struct up_conn *c)
{
    if (c->established)
        return;
    c->established = true;
    up_conn_tcp_up(c);
    if (c->tls_ns)
        conn_observe(c, c->pool->m.tls, c->tls_ns);
}

/* A connection that failed before a request could go: counted by where. */
static void conn_setup_failed(const struct up_conn *c)
{
    enum up_phase ph = c->tls_ns ? UPH_TLS
                       : c->pool->proxy && c->tcp_ns ? UPH_PROXY : UPH_CONNECT;

    if (!c->established && c->pool->m.shard)
        metrics_add(c->pool->m.shard, c->pool->m.failures[ph], 1);
}

/* OpenSSL starts the handshake once the TCP connection is up: that moment
 * ends the connect and begins the TLS time. Only the first start counts
 * (TLS 1.3 session tickets come as handshake messages later). */
static void tls_info(const SSL *ssl, int where, int ret)
{
    struct up_conn *c = SSL_get_app_data(ssl);

    (void)ret;
    if (!c || !(where & SSL_CB_HANDSHAKE_START) || c->tls_ns)
        return;
    up_conn_tcp_up(c);
    c->tls_ns = clock_mono_ns();
}

/* Verification of the name (or IP) and SNI, per connection. */
SSL *up_tls_new(struct up_conn *c)
{
    struct up_pool *pool = c->pool;
    SSL *ssl = SSL_new(pool->ssl_ctx);
    const char *host = pool->u->host;

    if (!ssl)
        return NULL;
    SSL_set_app_data(ssl, c);
    SSL_set_info_callback(ssl, tls_info);
    tls_client_ssl_host(ssl, host, pool->u->tls.verify);
    return ssl;
}

/* ---- pool bookkeeping --------------------------------------------------- */

struct up_pool *up_pool_new(struct event_base *base, struct evdns_base *dns,
                            const struct sc_upstream *u, SSL_CTX *ssl_ctx,
                            const struct up_proxy *proxy, uint32_t max_conns,
                            const struct up_pool_metrics *m)
{
    struct up_pool *pool = calloc(1, sizeof *pool);

    if (!pool)
        return NULL;
    if (m)
        pool->m = *m;
    pool->base = base;
    pool->dns = dns;
    pool->u = u;
    pool->ssl_ctx = ssl_ctx;
    pool->proxy = proxy;
    pool->max_conns = max_conns ? max_conns : 1;
    TAILQ_INIT(&pool->idle);
    TAILQ_INIT(&pool->busy);
    TAILQ_INIT(&pool->waiting);
    return pool;
}

void up_pool_free(struct up_pool *pool)
{
    struct up_conn *c;
    struct up_request *req;

    if (!pool)
        return;
    while ((req = TAILQ_FIRST(&pool->waiting)))
        up_request_cancel(req);
    while ((c = TAILQ_FIRST(&pool->busy))) {
        if (c->req)
            up_request_cancel(c->req);
        else
            up_conn_free(c);
    }
    while ((c = TAILQ_FIRST(&pool->idle)))
        up_conn_free(c);
    free(pool);
}

size_t up_pool_conns(const struct up_pool *pool)
{
    return pool->n_conns;
}

size_t up_pool_idle(const struct up_pool *pool)
{
    return pool->n_idle;
}

static void conn_unlink(struct up_conn *c)
{
    if (c->state == C_IDLE) {
        TAILQ_REMOVE(&c->pool->idle, c, link);
        c->pool->n_idle--;
        pool_gauge(c->pool, c->pool->m.idle, -1);
    } else {
        TAILQ_REMOVE(&c->pool->busy, c, link);
    }
}

void up_conn_free(struct up_conn *c)
{
    if (c->freed) /* inside a callback of this connection's: it must know */
        *c->freed = true;
    conn_unlink(c);
    c->pool->n_conns--;
    pool_gauge(c->pool, c->pool->m.open, -1);
    if (c->connect_timer)
        event_free(c->connect_timer);
    if (c->rd)
        event_free(c->rd);
    if (c->bev)
        bufferevent_free(c->bev);
    free(c);
}

/* ---- request completion ------------------------------------------------- */

static void req_stop_timer(struct up_request *req)
{
    if (req->timer) {
        event_free(req->timer);
        req->timer = NULL;
    }
}

/* Detaches the request from pool and connection, then reports. The
 * connection (if any) must already be recycled or freed by the caller. */
static void req_finish(struct up_request *req, enum up_result r,
                       const char *fmt, ...)
{
    va_list ap;

    req_stop_timer(req);
    if (req->waiting) {
        TAILQ_REMOVE(&req->pool->waiting, req, wait_link);
        req->waiting = false;
    }
    req->conn = NULL;
    req->resp.result = r;
    if (fmt) {
        va_start(ap, fmt);
        vsnprintf(req->resp.detail, sizeof req->resp.detail, fmt, ap);
        va_end(ap);
    }
    req->done_ns = clock_mono_ns();
    req->done(req, req->arg);
}

/* Hands a free connection to the oldest waiting request, or parks it. */
static void conn_release(struct up_conn *c)
{
    struct up_pool *pool = c->pool;
    struct up_request *next = TAILQ_FIRST(&pool->waiting);

    c->req = NULL;
    if (next) {
        TAILQ_REMOVE(&pool->waiting, next, wait_link);
        next->waiting = false;
        req_stop_timer(next);
        if (conn_start(c, next) != 0)
            up_conn_fail(c, UP_CONNECT_ERROR, "cannot queue the request");
        return;
    }
    TAILQ_REMOVE(&pool->busy, c, link);
    c->state = C_IDLE;
    TAILQ_INSERT_HEAD(&pool->idle, c, link);
    pool->n_idle++;
    pool_gauge(pool, pool->m.idle, 1);
}

/* A connection failed: the request learns how, the connection goes. */
void up_conn_fail(struct up_conn *c, enum up_result r, const char *detail)
{
    struct up_request *req = c->req;

    conn_setup_failed(c);
    up_conn_free(c);
    if (req)
        req_finish(req, r, "%s", detail);
}

static void conn_done_ok(struct up_conn *c)
{
    struct up_request *req = c->req;
    bool keep = up_parse_keep_alive(&c->parse) && !c->leftover &&
                evbuffer_get_length(bufferevent_get_input(c->bev)) == 0;

    if (keep)
        conn_release(c);
    else
        up_conn_free(c);
    req_finish(req, UP_OK, NULL);
}

/* ---- bufferevent callbacks ---------------------------------------------- */

/* Calls the request's progress, guarded: false when the callback ended the
 * request (cancelled it, freeing this connection), which the caller must
 * then not touch again. */
static bool tell_progress(struct up_conn *c, struct up_request *req)
{
    bool freed = false;

    c->freed = &freed;
    req->progress(req, req->arg);
    if (freed)
        return false;
    c->freed = NULL;
    return true;
}

/* Tells a streaming caller what this read brought, and stops reading while
 * its body holds hold_max. The caller may set discard on the head, or end
 * the request: false then, and c is gone. */
static bool report_progress(struct up_conn *c, size_t before)
{
    struct up_request *req = c->req;
    struct evbuffer *body = req->resp.body;
    bool news = !c->parse.complete && evbuffer_get_length(body) > before;

    if (!req->progress)
        return true;
    if (c->parse.head && !c->head_told)
        c->head_told = news = true;
    if (news) {
        if (!tell_progress(c, req))
            return false;
        if (req->discard) /* decided on the head: what came with it goes */
            evbuffer_drain(body, evbuffer_get_length(body));
    }
    if (!c->parse.complete && req->hold_max &&
        evbuffer_get_length(body) >= req->hold_max) {
        c->paused = true;
        if (c->rd)
            event_del(c->rd);
        else
            bufferevent_disable(c->bev, EV_READ);
    }
    return true;
}

/* Bytes that are not a response we can pass on: the connection goes. */
static void parse_failed(struct up_conn *c)
{
    char why[160];

    if (c->parse.proxy_refused) {
        up_conn_fail(c, UP_CONNECT_ERROR, "egress proxy answered 407 "
                  "(Proxy Authentication Required)");
        return;
    }
    if (c->req->resp.head_too_big)
        snprintf(why, sizeof why, "response head over %d bytes or %d "
                 "headers", UP_MAX_HEAD_BYTES, UP_MAX_HEADERS);
    else
        snprintf(why, sizeof why, "invalid response from upstream: %s",
                 up_parse_error(&c->parse));
    up_conn_fail(c, UP_CONNECTION_LOST, why);
}

/* What one read brought, parsed; then progress, or the end. */
static void parse_bytes(struct up_conn *c, const char *at, size_t len)
{
    size_t before = evbuffer_get_length(c->req->resp.body);
    size_t n = up_parse_feed(&c->parse, at, len);

    if (up_parse_failed(&c->parse)) {
        parse_failed(c);
        return;
    }
    c->leftover = n < len;
    if (report_progress(c, before) && c->parse.complete)
        conn_done_ok(c);
}

static void parse_input(struct up_conn *c)
{
    struct evbuffer *in = bufferevent_get_input(c->bev);
    size_t before = evbuffer_get_length(c->req->resp.body);

    while (evbuffer_get_length(in) > 0 && !c->parse.complete) {
        struct evbuffer_iovec v;
        size_t n;

        if (evbuffer_peek(in, -1, NULL, &v, 1) < 1)
            break;
        n = up_parse_feed(&c->parse, v.iov_base, v.iov_len);
        evbuffer_drain(in, c->parse.complete ? n : v.iov_len);
        if (up_parse_failed(&c->parse)) {
            parse_failed(c);
            return;
        }
    }
    if (report_progress(c, before) && c->parse.complete)
        conn_done_ok(c);
}

/* One read of a plain connection's socket, straight into the parser.
 * libevent's own reads ask FIONREAD first and take at most 4 KiB each: an
 * ioctl per read, and two reads for a 4 KiB body with its head. Level-
 * triggered, so what does not fit comes at the next loop pass. */
static void conn_read_direct(evutil_socket_t fd, short what, void *arg)
{
    struct up_conn *c = arg;
    char buf[UP_READ_BYTES];
    ssize_t n = recv(fd, buf, sizeof buf, 0);

    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    if (n <= 0) {
        up_conn_on_event(c->bev, BEV_EVENT_READING |
                      (n == 0 ? BEV_EVENT_EOF : BEV_EVENT_ERROR), c);
        return;
    }
    if (!c->req) {
        up_conn_free(c); /* bytes on an idle connection answer nothing we asked */
        return;
    }
    c->answered = true;
    parse_bytes(c, buf, (size_t)n);
}

/* A plain, established connection with nothing buffered is read directly
 * from here on: the event stays registered between requests, as the
 * bufferevent's did. True when c is read that way. */
static bool read_direct(struct up_conn *c)
{
    evutil_socket_t fd;

    if (c->rd)
        return true;
    if (c->pool->ssl_ctx || c->tunnelling || !c->connected ||
        evbuffer_get_length(bufferevent_get_input(c->bev)) != 0 ||
        (fd = bufferevent_getfd(c->bev)) < 0)
        return false;
    c->rd = event_new(c->pool->base, fd, EV_READ | EV_PERSIST,
                      conn_read_direct, c);
    if (!c->rd)
        return false;
    if (event_add(c->rd, NULL) != 0) {
        event_free(c->rd);
        c->rd = NULL;
        return false;
    }
    bufferevent_disable(c->bev, EV_READ);
    return true;
}

void up_request_read_more(struct up_request *req)
{
    struct up_conn *c = req->conn;

    if (!c || !c->paused ||
        evbuffer_get_length(req->resp.body) >= req->hold_max / 2)
        return;
    c->paused = false;
    if (c->rd ? event_add(c->rd, NULL) != 0 : bufferevent_enable(c->bev, EV_READ) != 0)
        up_conn_fail(c, UP_CONNECTION_LOST, "cannot read from the upstream");
}

void up_conn_on_read(struct bufferevent *bev, void *arg)
{
    struct up_conn *c = arg;

    if (!c->req) {
        /* Bytes on an idle connection answer nothing we asked: drop it. */
        up_conn_free(c);
        return;
    }
    c->answered = true;
    parse_input(c);
}

void up_conn_on_write(struct bufferevent *bev, void *arg)
{
    struct up_conn *c = arg;

    if (c->req && evbuffer_get_length(bufferevent_get_output(bev)) == 0)
        c->sent = true;
}

static void describe_error(struct up_conn *c, short what, unsigned long ssl_err,
                           char *buf, size_t len)
{
    int dns_err = bufferevent_socket_get_dns_error(c->bev);

    if (ssl_err) {
        char e[128];
        ERR_error_string_n(ssl_err, e, sizeof e);
        snprintf(buf, len, "TLS: %s", e);
    } else if (dns_err) {
        snprintf(buf, len, "cannot resolve %s: %s", c->pool->proxy
                 ? c->pool->proxy->host : c->pool->u->host,
                 evutil_gai_strerror(dns_err));
    } else if (what & BEV_EVENT_EOF) {
        snprintf(buf, len, "upstream closed the connection");
    } else {
        int e = EVUTIL_SOCKET_ERROR();
        snprintf(buf, len, "%s", e ? evutil_socket_error_to_string(e)
                                   : "connection failed");
    }
}

/* With TLS 1.3 the client's handshake ends before the server has checked
 * the client's certificate, so the request may leave before a partner that
 * refuses ours (none, expired, another CA's) says so with an alert. Its TLS
 * layer refused the connection: the request never reached the partner's
 * application, and the outcome is a connect_error, as with TLS 1.2. */
static bool handshake_refused(const struct up_conn *c, unsigned long ssl_err)
{
    static const int alerts[] = {
        SSL_AD_HANDSHAKE_FAILURE, SSL_AD_BAD_CERTIFICATE,
        SSL_AD_UNSUPPORTED_CERTIFICATE, SSL_AD_CERTIFICATE_REVOKED,
        SSL_AD_CERTIFICATE_EXPIRED, SSL_AD_CERTIFICATE_UNKNOWN,
        SSL_AD_UNKNOWN_CA, SSL_AD_ACCESS_DENIED, SSL_AD_CERTIFICATE_REQUIRED,
    };
    int reason = ERR_GET_REASON(ssl_err) - SSL_AD_REASON_OFFSET;

    if (!ssl_err || c->answered || ERR_GET_LIB(ssl_err) != ERR_LIB_SSL)
        return false;
    for (size_t i = 0; i < sizeof alerts / sizeof alerts[0]; i++)
        if (reason == alerts[i])
            return true;
    return false;
}

void up_conn_on_event(struct bufferevent *bev, short what, void *arg)
{
    struct up_conn *c = arg;
    unsigned long ssl_err;
    char why[192];

    if (what & BEV_EVENT_CONNECTED)
        conn_established(c);
    if (c->in_setup) {
        c->setup_failed = !(what & BEV_EVENT_CONNECTED);
        c->connected = !c->setup_failed;
        return;
    }
    if (what & BEV_EVENT_CONNECTED) {
        c->connected = true;
        if (c->connect_timer)
            event_del(c->connect_timer);
        return;
    }
    if (!c->req) {
        up_conn_free(c);
        return;
    }
    if (c->sent && (what & BEV_EVENT_EOF)) {
        /* A body delimited by the close is complete at EOF. */
        up_parse_eof(&c->parse);
        if (c->parse.complete) {
            conn_done_ok(c);
            return;
        }
    }
    ssl_err = c->pool->ssl_ctx ? bufferevent_get_openssl_error(c->bev) : 0;
    describe_error(c, what, ssl_err, why, sizeof why);
    up_conn_fail(c, c->connected && c->sent && !handshake_refused(c, ssl_err)
                 ? UP_CONNECTION_LOST : UP_CONNECT_ERROR, why);
}

static void on_connect_timeout(evutil_socket_t fd, short what, void *arg)
{
    struct up_conn *c = arg;
    char why[96];

    snprintf(why, sizeof why, "no connection within connect_timeout (%llu ms)",
             (unsigned long long)c->pool->u->connect_timeout_ms);
    up_conn_fail(c, UP_CONNECT_ERROR, why);
}

/* ---- dispatch ----------------------------------------------------------- */

/* The route's timeout when the caller set one, else the upstream's. */
static uint64_t req_timeout_ms(const struct up_request *req)
{
    return req->timeout_ms ? req->timeout_ms : req->pool->u->timeout_ms;
}

static void on_request_timeout(evutil_socket_t fd, short what, void *arg)
{
    struct up_request *req = arg;
    struct up_conn *c = req->conn;

    if (req->waiting) {
        req_finish(req, UP_CONNECT_ERROR,
                   "no free upstream connection within connect_timeout "
                   "(max_connections %u)", req->pool->max_conns);
        return;
    }
    if (c && !c->connected) {
        up_conn_fail(c, UP_CONNECT_ERROR, "connect timed out");
        return;
    }
    if (!c) {
        /* up_pool_send could not open a connection: reported from here so
         * that done never runs inside up_pool_send. */
        req_finish(req, UP_CONNECT_ERROR, "cannot open a connection to %s",
                   req->pool->u->authority);
        return;
    }
    up_conn_free(c);
    req_finish(req, UP_TIMEOUT, "no whole response within timeout (%llu ms)",
               (unsigned long long)req_timeout_ms(req));
}

static int req_arm_timer(struct up_request *req, uint64_t ms)
{
    struct timeval tv = clock_ms_to_tv(ms);

    req_stop_timer(req);
    req->timer = evtimer_new(req->pool->base, on_request_timeout, req);
    if (!req->timer)
        return -ENOMEM;
    return evtimer_add(req->timer, &tv);
}

/* On a plain connection that is already established and idle, the request is
 * written at once: most requests fit the socket buffer whole, and writing
 * them here saves switching write-watching on and off (two epoll_ctl calls)
 * and a loop iteration per request. What does not fit, or meets an error,
 * stays in wire for the bufferevent, which writes the rest or reports the
 * error through on_event as before. */
static void write_now(struct up_conn *c, struct evbuffer *wire)
{
    evutil_socket_t fd;

    if (c->pool->ssl_ctx || !c->connected ||
        evbuffer_get_length(bufferevent_get_output(c->bev)) != 0 ||
        (fd = bufferevent_getfd(c->bev)) < 0)
        return;
    while (evbuffer_get_length(wire) > 0 && evbuffer_write(wire, fd) > 0)
        ;
    if (evbuffer_get_length(wire) == 0)
        c->sent = true;
}

/* Puts a request on a connection: parser reset, bytes written or queued,
 * timer armed. 0, or -1 when it could not be queued (the caller decides how
 * that is reported). */
static int conn_start(struct up_conn *c, struct up_request *req)
{
    c->req = req;
    c->state = C_BUSY;
    c->sent = false;
    c->head_told = false;
    c->paused = false;
    c->answered = false;
    c->leftover = false;
    req->conn = c;
    /* Plain http through a proxy: a 407 is the proxy's, not the partner's. */
    up_parse_start(&c->parse, req, c->pool->proxy && !c->pool->ssl_ctx);
    if (req_arm_timer(req, req_timeout_ms(req)) != 0)
        return -ENOMEM;
    /* Through a tunnel not yet up, the request waits for it (up_tunnel_open). */
    return c->tunnelling ? 0 : up_conn_write_request(c);
}

int up_conn_write_request(struct up_conn *c)
{
    struct up_request *req = c->req;
    short bev_read = read_direct(c) ? 0 : EV_READ;

    write_now(c, req->wire);
    if (c->sent)
        return bev_read && bufferevent_enable(c->bev, EV_READ) != 0 ? -EIO : 0;
    if (bufferevent_write_buffer(c->bev, req->wire) != 0 ||
        bufferevent_enable(c->bev, bev_read | EV_WRITE) != 0)
        return -ENOMEM;
    return 0;
}

static struct bufferevent *bev_new(struct up_conn *c)
{
    struct up_pool *pool = c->pool;
    SSL *ssl;
    struct bufferevent *bev;

    if (!pool->ssl_ctx)
        return bufferevent_socket_new(pool->base, -1, BEV_OPT_CLOSE_ON_FREE);
    ssl = up_tls_new(c);
    if (!ssl)
        return NULL;
    bev = bufferevent_openssl_socket_new(pool->base, -1, ssl,
                                         BUFFEREVENT_SSL_CONNECTING,
                                         BEV_OPT_CLOSE_ON_FREE);
    if (!bev) {
        SSL_free(ssl);
        return NULL;
    }
    /* Many servers close without close_notify; the framing tells us whether
     * the response was whole, so a dirty shutdown is not an error here. */
    bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
    return bev;
}

/* Direct, or to the proxy for an http upstream (absolute-form requests). */
static int conn_dial(struct up_conn *c)
{
    const struct up_pool *pool = c->pool;
    const char *host = pool->proxy ? pool->proxy->host : pool->u->host;
    int port = pool->proxy ? pool->proxy->port : pool->u->port;

    bufferevent_setcb(c->bev, up_conn_on_read, up_conn_on_write, up_conn_on_event, c);
    return bufferevent_socket_connect_hostname(c->bev, pool->dns, AF_UNSPEC,
                                               host, port) != 0 ||
                   c->setup_failed ? -1 : 0;
}

static struct up_conn *conn_new(struct up_pool *pool)
{
    struct up_conn *c = calloc(1, sizeof *c);
    struct timeval tv = clock_ms_to_tv(pool->u->connect_timeout_ms);

    if (!c)
        return NULL;
    c->pool = pool;
    c->state = C_CONNECTING;
    c->dial_ns = clock_mono_ns();
    TAILQ_INSERT_TAIL(&pool->busy, c, link);
    pool->n_conns++;
    pool_gauge(pool, pool->m.open, 1);
    c->connect_timer = evtimer_new(pool->base, on_connect_timeout, c);
    if (!c->connect_timer)
        goto fail;
    /* libevent may report a failure (no descriptor, no memory, a connect
     * refused at once) from inside the call: on_event must not free c then. */
    c->in_setup = true;
    if (pool->proxy && pool->ssl_ctx) {
        if (up_tunnel_open(c) != 0)
            goto fail;
    } else if (!(c->bev = bev_new(c)) || conn_dial(c) != 0)
        goto fail;
    c->in_setup = false;
    if (!c->connected)
        evtimer_add(c->connect_timer, &tv);
    return c;
fail:
    if (c->setup_failed)
        conn_setup_failed(c);
    up_conn_free(c);
    return NULL;
}

/* A request that could not be put on a connection: nothing was sent, and
 * the timer reports it from the loop, so done never runs in up_pool_send. */
static int fail_later(struct up_request *req, struct up_conn *c)
{
    if (c) {
        c->req = NULL;
        up_conn_free(c);
    }
    req->conn = NULL;
    return req_arm_timer(req, 0);
}

int up_pool_send(struct up_pool *pool, struct up_request *req)
{
    struct up_conn *c;

    req->pool = pool;
    req->conn = NULL;
    req->waiting = false;
    req->timer = NULL;
    memset(&req->resp, 0, sizeof req->resp);
    req->resp.body = evbuffer_new();
    if (!req->resp.body)
        return -ENOMEM;
    req->sent_ns = clock_mono_ns();
    c = TAILQ_FIRST(&pool->idle);
    if (c) {
        TAILQ_REMOVE(&pool->idle, c, link);
        pool->n_idle--;
        pool_gauge(pool, pool->m.idle, -1);
        c->state = C_BUSY;
        TAILQ_INSERT_TAIL(&pool->busy, c, link);
        return conn_start(c, req) == 0 ? 0 : fail_later(req, c);
    }
    if (pool->n_conns < pool->max_conns) {
        c = conn_new(pool);
        if (!c)
            return fail_later(req, NULL);
        return conn_start(c, req) == 0 ? 0 : fail_later(req, c);
    }
    if (req_arm_timer(req, pool->u->connect_timeout_ms) != 0)
        return -ENOMEM; /* not queued: nothing refers to req */
    req->waiting = true;
    TAILQ_INSERT_TAIL(&pool->waiting, req, wait_link);
    return 0;
}

void up_request_cancel(struct up_request *req)
{
    req_stop_timer(req);
    if (req->waiting) {
        TAILQ_REMOVE(&req->pool->waiting, req, wait_link);
        req->waiting = false;
    }
    if (req->conn) {
        req->conn->req = NULL;
        up_conn_free(req->conn);
        req->conn = NULL;
    }
}
