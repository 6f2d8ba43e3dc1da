/* The upstream client: a keep-alive connection pool per (thread, upstream)
 * on libevent bufferevents (OpenSSL bufferevents for https), responses parsed
 * with http-parser. It tells apart what docs/contract.md §4 needs: a failure before
 * the request was fully sent (connect_error: nothing reached the upstream),
 * a connection lost after it (unknown outcome) and a timeout. */
#ifndef SLUICE_PROXY_UPSTREAM_UPSTREAM_H
#define SLUICE_PROXY_UPSTREAM_UPSTREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>

#include <openssl/ssl.h>

#include "config/config.h"
#include "util/error.h"

struct event_base;
struct evdns_base;
struct evbuffer;
struct event;
struct up_pool;
struct up_conn;

enum up_result {
    UP_OK = 0,              /* a whole response was read */
    UP_CONNECT_ERROR,       /* TCP/TLS failure before the request was sent */
    UP_CONNECTION_LOST,     /* closed, reset or garbled after it was sent */
    UP_TIMEOUT,             /* no whole response within `timeout` */
};

struct up_header {
    char *name, *value;     /* into the response's head arena */
    uint32_t name_at, value_at; /* their offsets there while parsing */
};

/* Most headers one response may carry, and the most bytes of its head
 * (names, values, ": " and CRLF): the worker's connection is sized to hold
 * a request head of limits.max_header and a response head of this. nginx's
 * proxy_buffer_size is 4-8 KiB by default. */
#define UP_MAX_HEADERS 256
#define UP_MAX_HEAD_BYTES (16 * 1024)

struct up_response {
    enum up_result result;
    int status;             /* 0 when no status line was received */
    struct up_header *headers;
    size_t n_headers, cap_headers;
    char *arena;            /* every name and value, NUL-terminated: one
                             * allocation per head instead of two per field */
    size_t arena_len, arena_cap;
    struct evbuffer *body;  /* owned; may be stolen by the caller (set NULL) */
    bool head_too_big;      /* over UP_MAX_HEAD_BYTES or UP_MAX_HEADERS */
    char detail[192];       /* why it failed, for logs and problem bodies */
};

struct up_request;
typedef void (*up_done_cb)(struct up_request *req, void *arg);

/* What a streaming caller hears before `done`: the final response head is
 * in (resp.status > 0), or more body bytes are in resp.body. Runs from the
 * pool's loop; it may change `discard` and `hold_max`, drain resp.body, or
 * end the request (up_request_cancel, then free it): the pool reads nothing
 * of it, nor of its connection, after a callback that did. */
typedef void (*up_progress_cb)(struct up_request *req, void *arg);

/* How much a streamed response may hold before reading from the upstream
 * stops: the body passes through, memory stays bounded per connection. */
#define UP_STREAM_HOLD ((size_t)256 * 1024)

/* One exchange with the upstream. The caller owns the struct, fills the
 * first block and calls up_pool_send(); `done` runs exactly once, from the
 * pool's event loop (never from inside up_pool_send), unless the request is
 * cancelled first. With `progress` set, the head and the body's progress are
 * reported before `done`, so the body can be passed on while it arrives. */
struct up_request {
    struct evbuffer *wire;  /* full request bytes; the pool drains it */
    bool no_body;           /* HEAD: the response carries no body */
    up_done_cb done;
    up_progress_cb progress; /* optional */
    void *arg;
    bool discard;           /* drop body bytes as they arrive */
    size_t hold_max;        /* stop reading while resp.body holds this much;
                             * 0: buffer the whole body (bounded) */
    uint64_t timeout_ms;    /* for the whole response; 0: the upstream's */
    struct up_response resp;
    uint64_t sent_ns, done_ns; /* monotonic: dispatch and completion */

    /* internal */
    struct up_pool *pool;
    struct up_conn *conn;
    struct event *timer;
    bool waiting;           /* queued for a free connection */
    TAILQ_ENTRY(up_request) wait_link;
};

/* tls.c: a TLS client context for an https upstream: peer
 * verification unless tls.verify is false, ca_file or the system store, and
 * the client certificate of tls.cert_file / tls.key_file when given. NULL +
 * err on failure. */
SSL_CTX *up_tls_ctx_new(const struct sc_upstream *u, struct sc_error *err);

/* What u's context is made from, as text: its tls settings and the
 * identity of each file (device, inode, size, mtime). Two equal texts make
 * the same context, so a reload can keep the one it has. */
#define UP_TLS_SOURCE_MAX 2048
void up_tls_source(const struct sc_upstream *u, char *buf, size_t len);

/* egress.c: an upstream's egress proxy, parsed once per config
 * from its `proxy` (docs/contract.md §3). An https upstream is reached
 * through a CONNECT tunnel (TLS end to end with the partner inside it), an
 * http one with absolute-form requests to the proxy. */
struct up_proxy {
    char *host;             /* to dial; IPv6 without brackets */
    uint16_t port;
    char *authorization;    /* Proxy-Authorization value ("Basic ..."), or
                             * NULL without userinfo; never logged */
};

/* NULL with err->text empty when u has no proxy; NULL with a message when
 * it cannot be made. */
struct up_proxy *up_proxy_new(const struct sc_upstream *u, struct sc_error *err);
void up_proxy_free(struct up_proxy *p);

/* Where a pool counts its connections: slots of obs/metrics.h on the shard
 * of the pool's loop (sluice_upstream_connections_open and _idle, the connect
 * and TLS handshake durations, the failures by phase). */
struct metrics_shard;
struct up_pool_metrics {
    struct metrics_shard *shard;    /* NULL: nothing is counted */
    uint32_t open, idle;            /* gauges */
    uint32_t connect, tls;          /* histogram bases (H_CONNECT) */
    const uint32_t *failures;       /* [UPH__COUNT] counters */
};

/* A pool of at most max_conns connections to u, driven by base. ssl_ctx
 * (NULL for http), proxy (NULL: direct) and m's failures are borrowed; m may
 * be NULL. Returns NULL on allocation failure. */
struct up_pool *up_pool_new(struct event_base *base, struct evdns_base *dns,
                            const struct sc_upstream *u, SSL_CTX *ssl_ctx,
                            const struct up_proxy *proxy, uint32_t max_conns,
                            const struct up_pool_metrics *m);
void up_pool_free(struct up_pool *pool);

/* Starts the exchange. Returns 0, or a negative code (done is then not
 * called) when the request cannot even be queued. */
int up_pool_send(struct up_pool *pool, struct up_request *req);

/* Abandons a request whose answer nobody will read: its connection is
 * closed (its response would arrive for no one), done is never called. */
void up_request_cancel(struct up_request *req);

/* The caller took bytes out of resp.body: reading resumes once it holds
 * less than half of hold_max. */
void up_request_read_more(struct up_request *req);

/* Frees what the response owns and zeroes it. */
void up_response_clear(struct up_response *resp);

/* The first header with this name (case-insensitive), or NULL. */
const char *up_response_header(const struct up_response *resp,
                               const char *name);

/* The body length the response announced with Content-Length (digits only,
 * no Transfer-Encoding); false for a chunked or close-delimited body. */
bool up_response_length(const struct up_response *resp, uint64_t *len);

/* The end-to-end headers of a response, as the worker gets them (and as a
 * replay returns them): hop-by-hop ones (with those Connection names),
 * Content-Length and Sluice-* are left out. keep must hold n_headers
 * pointers; returns how many were kept, in order. */
size_t up_response_end_to_end(const struct up_response *resp,
                              const struct up_header **keep);

/* 204 and 304 (and 1xx, never final): a response with no body whatever its
 * framing headers say (RFC 9112 6.3). */
static inline bool up_status_bodiless(int status)
{
    return status < 200 || status == 204 || status == 304;
}

/* Counts for the pool (tests, metrics). */
size_t up_pool_conns(const struct up_pool *pool);
size_t up_pool_idle(const struct up_pool *pool);

#endif
