/* One Redis connection on a libevent bufferevent, plain or TLS; hiredis only
 * for the protocol (redis_conn.h).
 *
 * The commands in flight are a ring of {callback, argument} that grows by
 * doubling and is never shrunk, and an asynchronous connection's replies
 * are built in an arena of its own (hiredis's reader takes the object
 * functions), emptied after each reply's callback and kept for the next,
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

#include "util/tls_client.h"

#define RING_MIN 16
#define ARENA_CHUNK 4096
/* A chunk made for one large reply (a record's body) is not kept. */
#define ARENA_KEEP_MAX (64 * 1024)

enum hello { HELLO_AUTH = 1, HELLO_SELECT, HELLO_SCRIPT };

struct pending {
    redis_conn_reply_fn *fn;
    void *priv;
};

/* Bump allocation for one reply at a time; chunks kept across replies. */
struct arena_chunk {
    struct arena_chunk *next;
    size_t cap, used;
    max_align_t data[];
};

struct arena {
    struct arena_chunk *first, *cur;
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
    struct arena arena;
    int end_rc;
    char why[256];
};

/* ---- the replies' arena ---- */

static void *arena_alloc(struct arena *a, size_t n)
{
    struct arena_chunk *c = a->cur;

    n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    while (c && c->cap - c->used < n)
        c = c->next;
    if (!c) {
        size_t cap = n > ARENA_CHUNK ? n : ARENA_CHUNK;

        if (!(c = malloc(sizeof *c + cap)))
            return NULL;
        *c = (struct arena_chunk){.next = NULL, .cap = cap};
        /* Appended: the chunks before keep what this reply holds. */
        if (a->cur) {
            c->next = a->cur->next;
            a->cur->next = c;
        } else {
            c->next = a->first;
            a->first = c;
        }
    }
    a->cur = c;
    c->used += n;
    return (char *)c->data + c->used - n;
}

/* After a reply's callback: every chunk empty again, large ones freed. */
static void arena_reset(struct arena *a)
{
    struct arena_chunk **p = &a->first;

    while (*p) {
        struct arena_chunk *c = *p;

        if (c->cap > ARENA_KEEP_MAX) {
            *p = c->next;
            free(c);
            continue;
        }
        c->used = 0;
        p = &c->next;
    }
    a->cur = a->first;
}

static void arena_free(struct arena *a)
{
    while (a->first) {
        struct arena_chunk *c = a->first;

        a->first = c->next;
        free(c);
    }
    a->cur = NULL;
}

/* hiredis's reader builds replies with these: the same redisReply shapes
 * as its own, from the connection's arena (the root task's privdata). */
static redisReply *reply_new(const redisReadTask *t, int type)
{
    const redisReadTask *root = t;
    struct redis_conn *c;
    redisReply *r;

    while (root->parent)
        root = root->parent;
    c = root->privdata;
    if (!(r = arena_alloc(&c->arena, sizeof *r)))
        return NULL;
    memset(r, 0, sizeof *r);
    r->type = type;
    if (t->parent) {
        redisReply *parent = t->parent->obj;

        parent->element[t->idx] = r;
    }
    return r;
}

static struct redis_conn *task_conn(const redisReadTask *t)
{
    while (t->parent)
        t = t->parent;
    return t->privdata;
}

static void *arena_string(const redisReadTask *t, char *s, size_t len)
{
    char *copy = arena_alloc(&task_conn(t)->arena, len + 1);
    redisReply *r;

    if (!copy || !(r = reply_new(t, t->type)))
        return NULL;
    memcpy(copy, s, len);
    copy[len] = '\0';
    r->str = copy;
    r->len = len;
    return r;
}

static void *arena_array(const redisReadTask *t, int n)
{
    redisReply **el = NULL;
    redisReply *r;

    if (n > 0 && !(el = arena_alloc(&task_conn(t)->arena, (size_t)n * sizeof *el)))
        return NULL;
    if (!(r = reply_new(t, REDIS_REPLY_ARRAY)))
        return NULL;
    if (n > 0)
        memset(el, 0, (size_t)n * sizeof *el);
    r->elements = n > 0 ? (size_t)n : 0;
    r->element = el;
    return r;
}

static void *arena_integer(const redisReadTask *t, long long v)
{
    redisReply *r = reply_new(t, REDIS_REPLY_INTEGER);

    if (r)
        r->integer = v;
    return r;
}

static void *arena_nil(const redisReadTask *t)
{
    return reply_new(t, REDIS_REPLY_NIL);
}

static void arena_nofree(void *obj)
{
    (void)obj; /* the arena is emptied after the reply's callback */
}

static redisReplyObjectFunctions arena_fns = {
    arena_string, arena_array, arena_integer, arena_nil, arena_nofree,
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
    arena_free(&c->arena);
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
        arena_reset(&c->arena);
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
    c->reader->fn = &arena_fns;
    c->reader->privdata = c;
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

/* Blocking use keeps replies past their callback: hiredis's own objects. */
static void use_heap(struct redis_conn *c)
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

/* ---- blocking use ---- */

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
    use_heap(s->c); /* before any reply: none is read until the base runs */
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
