/* One Redis connection on a libevent bufferevent, plain or TLS; hiredis only
 * for the protocol (redis_conn.h).
 *
 * The commands in flight are a ring of {callback, argument} that grows by
 * doubling and is never shrunk, and an asynchronous connection's replies
 * are built in an arena of its own (redis_arena.c), emptied after each
 * reply's callback and kept for the next,
 * so a busy connection allocates nothing per command; commands given as
 * argv are written straight into the bufferevent's output in RESP, without
 * an intermediate string.
 *
 * The handshake (AUTH, SELECT, SCRIPT LOAD) is written first, its replies
 * read by this file: a refusal ends the connection with its cause
 * ("AUTH failed: WRONGPASS ..."), so every user of the store reports the
 * same failure the same way. Callers' commands queue behind it.
 *
 * Ending: a failure or redis_conn_close marks the connection closing; the
 * end itself (lost, then NULL to every call in flight, then the frees) runs
 * at once when no callback of this connection is running, else when the
 * outermost one returns, so a callback may close its own connection and
 * still read its reply. */
#include "store/redis_conn.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <openssl/err.h>
#include <openssl/x509.h>

#include "store/redis_arena.h"
#include "util/tls_client.h"

#define RING_MIN 16

enum hello { HELLO_AUTH = 1, HELLO_SELECT, HELLO_SCRIPT };

struct pending {
    redis_conn_reply_fn *fn;
    void *priv;
};

struct redis_conn {
    struct bufferevent *bev;
    redisReader *reader;
    struct redis_conn_events ev;
    struct pending *ring;
    size_t cap, head, n;        /* n in flight from head */
    unsigned hello_left;        /* handshake replies still to come */
    int depth;                  /* callbacks of ours running */
    bool tls, connected, ready, closing, kept;
    bool heap;                  /* replies on the heap (blocking use: kept) */
    redisReplyObjectFunctions *heap_fns; /* hiredis's own */
    struct redis_arena arena;
    int end_rc;
    char why[256];
};

/* ---- the ring of calls in flight ---- */

static int ring_push(struct redis_conn *c, redis_conn_reply_fn *fn, void *priv)
{
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : RING_MIN;
        struct pending *r = malloc(cap * sizeof *r);

        if (!r)
            return -ENOMEM;
        for (size_t i = 0; i < c->n; i++)
            r[i] = c->ring[(c->head + i) % c->cap];
        free(c->ring);
        c->ring = r;
        c->cap = cap;
        c->head = 0;
    }
    c->ring[(c->head + c->n) % c->cap] = (struct pending){fn, priv};
    c->n++;
    return 0;
}

static struct pending ring_pop(struct redis_conn *c)
{
    struct pending p = c->ring[c->head];

    c->head = (c->head + 1) % c->cap;
    c->n--;
    return p;
}

/* ---- ending ---- */

static void end_now(struct redis_conn *c)
{
    c->depth++; /* a callback that closes again, or sends, is refused */
    if (c->ev.lost)
        c->ev.lost(c, c->end_rc, c->why, c->ev.arg);
    while (c->n) {
        struct pending p = ring_pop(c);

        if (p.fn)
            p.fn(c, NULL, p.priv);
    }
    if (c->bev)
        bufferevent_free(c->bev);
    redisReaderFree(c->reader);
    redis_arena_free(&c->arena);
    free(c->ring);
    free(c);
}

static void end_after(struct redis_conn *c)
{
    if (c->closing && c->depth == 0)
        end_now(c);
}

static void fail(struct redis_conn *c, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void fail(struct redis_conn *c, int rc, const char *fmt, ...)
{
    va_list ap;

    if (c->closing)
        return;
    va_start(ap, fmt);
    vsnprintf(c->why, sizeof c->why, fmt, ap);
    va_end(ap);
    c->closing = true;
    c->end_rc = rc;
    c->ready = false;
}

void redis_conn_close(struct redis_conn *c)
{
    if (!c || c->closing)
        return;
    if (!c->why[0])
        snprintf(c->why, sizeof c->why, "connection closed");
    c->closing = true;
    c->end_rc = 0;
    c->ready = false;
    end_after(c);
}

/* ---- replies ---- */

static void hello_reply(struct redis_conn *c, redisReply *r, void *priv)
{
    static const char *const name[] = {"", "AUTH", "SELECT", "SCRIPT LOAD"};
    enum hello h = (enum hello)(uintptr_t)priv;

    if (!r || c->closing)
        return;
    if (r->type == REDIS_REPLY_ERROR) {
        bool denied = h == HELLO_AUTH || !strncmp(r->str, "NOPERM", 6) ||
                      !strncmp(r->str, "NOAUTH", 6);

        /* Redis's own text: it names the failure, never the password. */
        fail(c, denied ? -EACCES : -EIO, "%s%s failed: %s",
             denied ? "authentication failed: " : "", name[h], r->str);
        return;
    }
    if (--c->hello_left == 0) {
        c->ready = true;
        if (c->ev.ready)
            c->ev.ready(c, c->ev.arg);
    }
}

static void deliver(struct redis_conn *c, redisReply *r)
{
    c->kept = false;
    if (c->n) {
        struct pending p = ring_pop(c);

        if (p.fn)
            p.fn(c, r, p.priv);
    } else if (c->ev.push) {
        c->ev.push(c, r, c->ev.arg);
    }
    if (!c->heap)
        redis_arena_reset(&c->arena);
    else if (!c->kept)
        freeReplyObject(r);
}

static void feed(struct redis_conn *c, struct evbuffer *in)
{
    struct evbuffer_iovec v[8];
    int n;

    while (!c->closing && (n = evbuffer_peek(in, -1, NULL, v, 8)) > 0) {
        size_t total = 0;

        for (int i = 0; i < n && i < 8; i++) {
            if (redisReaderFeed(c->reader, v[i].iov_base, v[i].iov_len) != REDIS_OK) {
                fail(c, -EPROTO, "protocol error: %s", c->reader->errstr);
                return;
            }
            total += v[i].iov_len;
        }
        evbuffer_drain(in, total);
    }
}

static void on_read(struct bufferevent *bev, void *arg)
{
    struct redis_conn *c = arg;
    void *r;

    c->depth++;
    feed(c, bufferevent_get_input(bev));
    while (!c->closing) {
        if (redisReaderGetReply(c->reader, &r) != REDIS_OK) {
            fail(c, -EPROTO, "protocol error: %s", c->reader->errstr);
            break;
        }
        if (!r)
            break;
        deliver(c, r);
    }
    c->depth--;
    end_after(c);
}

/* ---- connection events ---- */

/* The TLS layer's reason: the verification result when the chain or name
 * failed, else OpenSSL's first error (an alert from the server). */
static bool tls_reason(struct redis_conn *c, char *buf, size_t len)
{
    SSL *ssl = bufferevent_openssl_get_ssl(c->bev);
    unsigned long e = bufferevent_get_openssl_error(c->bev);
    long v = ssl ? SSL_get_verify_result(ssl) : X509_V_OK;
    char text[160];

    if (!c->connected && v != X509_V_OK) {
        snprintf(buf, len, "TLS: certificate verify failed: %s",
                 X509_verify_cert_error_string(v));
        return true;
    }
    if (!e)
        return false;
    ERR_error_string_n(e, text, sizeof text);
    snprintf(buf, len, "TLS: %s", text);
    ERR_clear_error();
    return true;
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
    struct redis_conn *c = arg;
    char tls[200];
    int e;

    c->depth++;
    if (what & BEV_EVENT_CONNECTED) {
        c->connected = true;
        if (c->hello_left == 0 && !c->closing) {
            c->ready = true;
            if (c->ev.ready)
                c->ev.ready(c, c->ev.arg);
        }
    } else if (c->tls && tls_reason(c, tls, sizeof tls)) {
        fail(c, c->connected ? -EIO : -ENOTCONN, "%s%s",
             c->connected ? "" : "cannot connect: ", tls);
    } else if (!c->connected) {
        e = EVUTIL_SOCKET_ERROR();
        fail(c, -ENOTCONN, "cannot connect: %s",
             e ? evutil_socket_error_to_string(e) : "connection failed");
    } else if (what & BEV_EVENT_EOF) {
        fail(c, -EIO, "connection closed by the server");
    } else {
        e = EVUTIL_SOCKET_ERROR();
        fail(c, -EIO, "%s", e ? evutil_socket_error_to_string(e) : "connection lost");
    }
    c->depth--;
    end_after(c);
}

/* ---- opening ---- */

static int send_hello(struct redis_conn *c, const struct redis_conn_opts *o)
{
    char db[16];
    int rc = 0;

    if (o->password) {
        const char *argv[] = {"AUTH", o->user ? o->user : o->password,
                              o->password};
        size_t len[] = {4, strlen(argv[1]), strlen(o->password)};

        rc = redis_conn_send_argv(c, o->user ? 3 : 2, argv, len, hello_reply,
                                  (void *)(uintptr_t)HELLO_AUTH);
        c->hello_left++;
    }
    if (!rc && o->db) {
        const char *argv[] = {"SELECT", db};
        size_t len[] = {6, 0};

        len[1] = (size_t)snprintf(db, sizeof db, "%u", o->db);
        rc = redis_conn_send_argv(c, 2, argv, len, hello_reply,
                                  (void *)(uintptr_t)HELLO_SELECT);
        c->hello_left++;
    }
    for (unsigned i = 0; !rc && i < o->n_preload; i++) {
        const char *argv[] = {"SCRIPT", "LOAD", o->preload[i]};
        size_t len[] = {6, 4, strlen(o->preload[i])};

        rc = redis_conn_send_argv(c, 3, argv, len, hello_reply,
                                  (void *)(uintptr_t)HELLO_SCRIPT);
        c->hello_left++;
    }
    return rc;
}

static struct bufferevent *bev_new(struct event_base *base, const char *host,
                                   const struct redis_conn_opts *o)
{
    const char *name = o->server_name && o->server_name[0] ? o->server_name : host;
    struct bufferevent *bev;
    SSL *ssl;

    if (!o->tls)
        return bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
    if (!(ssl = SSL_new(o->tls)))
        return NULL;
    tls_client_ssl_host(ssl, name, o->verify);
    bev = bufferevent_openssl_socket_new(base, -1, ssl, BUFFEREVENT_SSL_CONNECTING,
                                         BEV_OPT_CLOSE_ON_FREE);
    if (!bev)
        SSL_free(ssl);
    return bev;
}

/* A blocking resolution, as hiredis's was: give the url an IP address or a
 * name the host resolves locally (docs/reference/fleet.md). */
static int dial(struct redis_conn *c, const char *host, unsigned port,
                struct sc_error *err)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *ai = NULL;
    char service[8];
    int one = 1, g, rc;

    snprintf(service, sizeof service, "%u", port);
    if ((g = getaddrinfo(host, service, &hints, &ai)) != 0) {
        sc_error_set(err, "cannot connect: cannot resolve %s: %s", host,
                     gai_strerror(g));
        return -ENOTCONN;
    }
    rc = bufferevent_socket_connect(c->bev, ai->ai_addr, (int)ai->ai_addrlen);
    freeaddrinfo(ai);
    if (rc != 0) {
        sc_error_set(err, "cannot connect: %s",
                     evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
        return -ENOTCONN;
    }
    /* Small commands, answered one by one: never held back by Nagle. */
    setsockopt(bufferevent_getfd(c->bev), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return 0;
}

int redis_conn_open(struct event_base *base, const char *host, unsigned port,
                    const struct redis_conn_opts *o,
                    const struct redis_conn_events *ev,
                    struct redis_conn **out, struct sc_error *err)
{
    struct redis_conn *c = calloc(1, sizeof *c);
    int rc = -ENOMEM;

    *out = NULL;
    if (!c || !(c->reader = redisReaderCreate()) || !(c->bev = bev_new(base, host, o)))
        goto fail;
    c->ev = *ev;
    c->tls = o->tls != NULL;
    c->heap_fns = c->reader->fn;
    redis_arena_use(&c->arena, c->reader);
    bufferevent_setcb(c->bev, on_read, NULL, on_event, c);
    if (bufferevent_enable(c->bev, EV_READ | EV_WRITE) != 0 ||
        send_hello(c, o) != 0)
        goto fail;
    if ((rc = dial(c, host, port, err)) != 0)
        goto out;
    *out = c;
    return 0;
fail:
    sc_error_set(err, "cannot connect: out of memory");
out:
    if (c) {
        if (c->bev)
            bufferevent_free(c->bev);
        redisReaderFree(c->reader);
        free(c->ring);
        free(c);
    }
    return rc;
}

/* ---- sending ---- */

int redis_conn_send(struct redis_conn *c, const char *cmd, size_t len,
                    redis_conn_reply_fn *fn, void *priv)
{
    if (c->closing)
        return -ENOTCONN;
    if (ring_push(c, fn, priv) != 0)
        return -ENOMEM;
    if (bufferevent_write(c->bev, cmd, len) != 0) {
        c->n--;
        return -ENOMEM;
    }
    return 0;
}

size_t redis_format_argv(char *buf, size_t cap, int argc, const char **argv,
                         const size_t *len)
{
    char head[32];
    size_t n = (size_t)snprintf(head, sizeof head, "*%d\r\n", argc), total = n;

    if (total <= cap)
        memcpy(buf, head, n);
    for (int i = 0; i < argc; i++) {
        n = (size_t)snprintf(head, sizeof head, "$%zu\r\n", len[i]);
        if (total + n + len[i] + 2 <= cap) {
            memcpy(buf + total, head, n);
            memcpy(buf + total + n, argv[i], len[i]);
            memcpy(buf + total + n + len[i], "\r\n", 2);
        }
        total += n + len[i] + 2;
    }
    return total;
}

/* "*<argc>\r\n" then "$<len>\r\n<arg>\r\n" for each. */
static int put_argv(struct evbuffer *out, int argc, const char **argv,
                    const size_t *len)
{
    char head[32];
    int n = snprintf(head, sizeof head, "*%d\r\n", argc);

    if (evbuffer_add(out, head, (size_t)n) != 0)
        return -1;
    for (int i = 0; i < argc; i++) {
        n = snprintf(head, sizeof head, "$%zu\r\n", len[i]);
        if (evbuffer_add(out, head, (size_t)n) != 0 ||
            evbuffer_add(out, argv[i], len[i]) != 0 ||
            evbuffer_add(out, "\r\n", 2) != 0)
            return -1;
    }
    return 0;
}

int redis_conn_send_argv(struct redis_conn *c, int argc, const char **argv,
                         const size_t *len, redis_conn_reply_fn *fn,
                         void *priv)
{
    struct evbuffer *out;

    if (c->closing)
        return -ENOTCONN;
    if (ring_push(c, fn, priv) != 0)
        return -ENOMEM;
    out = bufferevent_get_output(c->bev);
    if (put_argv(out, argc, argv, len) != 0) {
        /* A partial command would garble the stream: nothing else goes. */
        c->n--;
        fail(c, -ENOMEM, "out of memory");
        end_after(c);
        return -ENOMEM;
    }
    return 0;
}

void redis_conn_keep(struct redis_conn *c)
{
    c->kept = true;
}

void redis_conn_heap_replies(struct redis_conn *c)
{
    c->heap = true;
    c->reader->fn = c->heap_fns;
    c->reader->privdata = NULL;
}

bool redis_conn_ready(const struct redis_conn *c)
{
    return c && c->ready && !c->closing;
}

const char *redis_conn_why(const struct redis_conn *c)
{
    return c->why;
}

