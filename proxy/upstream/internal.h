/* The upstream client's insides, shared by its files:
 *   pool.c             the pool and its connections
 *   parse.c            the response parser (no I/O: fuzzed on its own)
 *   tls.c              the TLS client context (verification, client
 *                      certificate) and what it is made from
 *   egress.c           the egress proxy: its address and credentials, and
 *                      the CONNECT tunnel an https connection goes through
 * Not for other modules: they see only upstream.h. */
#ifndef SLUICE_PROXY_UPSTREAM_INTERNAL_H
#define SLUICE_PROXY_UPSTREAM_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/queue.h>

#include <http_parser.h>
#include <event2/event.h>
#include <openssl/ssl.h>

#include "proxy/upstream/upstream.h"
#include "proxy/upstream/parse.h"

enum conn_state { C_CONNECTING, C_IDLE, C_BUSY };

struct up_conn {
    struct up_pool *pool;
    struct bufferevent *bev;
    struct event *connect_timer;
    struct up_parse parse;  /* the response of the request on it */
    struct up_request *req;
    enum conn_state state;
    bool connected;
    bool sent;              /* the whole request left our buffer */
    bool head_told;         /* ... and reported (progress) */
    bool paused;            /* reading stopped: the body holds hold_max */
    bool in_setup;          /* inside conn_new: events are noted, not acted on */
    bool setup_failed;
    bool tunnelling;        /* the proxy's CONNECT is not answered yet: the
                             * request waits, bev is the plain socket */
    bool answered;          /* a response byte arrived for the request */
    bool leftover;          /* bytes came after the response: not reusable */
    struct event *rd;       /* plain and established: sluice reads the
                             * socket itself (conn_read_direct), not the
                             * bufferevent */
    uint64_t dial_ns;       /* monotonic: set-up began */
    uint64_t tcp_ns;        /* ... the TCP connection was up (0: not yet) */
    uint64_t tls_ns;        /* ... the TLS handshake began (0: not yet) */
    bool established;       /* set up: a request can be sent */
    bool *freed;            /* while a callback runs: set true by up_conn_free,
                             * so nothing reads the connection after a
                             * callback that ended its request (h2o's
                             * generator_disposed) */
    TAILQ_ENTRY(up_conn) link;
};

TAILQ_HEAD(conn_list, up_conn);
TAILQ_HEAD(req_list, up_request);

struct up_pool {
    struct event_base *base;
    struct evdns_base *dns;
    const struct sc_upstream *u;
    SSL_CTX *ssl_ctx;
    const struct up_proxy *proxy; /* NULL: direct */
    uint32_t max_conns;
    size_t n_conns, n_idle;
    struct up_pool_metrics m;   /* m.shard NULL: not counted */
    struct conn_list idle;      /* most recently used first */
    struct conn_list busy;
    struct req_list waiting;    /* FIFO of requests without a connection */
};

/* pool.c */
void up_conn_free(struct up_conn *c);
/* A connection failed: the request learns how, the connection goes. */
void up_conn_fail(struct up_conn *c, enum up_result r, const char *detail);
/* A TLS session for connection c: SNI and the name (or IP) verified, the
 * handshake timed. */
SSL *up_tls_new(struct up_conn *c);
/* c's TCP connection (to the upstream or its proxy) is up: timed once. */
void up_conn_tcp_up(struct up_conn *c);
/* The bufferevent callbacks of an established connection. */
void up_conn_on_read(struct bufferevent *bev, void *arg);
void up_conn_on_write(struct bufferevent *bev, void *arg);
void up_conn_on_event(struct bufferevent *bev, short what, void *arg);
/* Hands the request's bytes to the connection: 0 or a negative code. */
int up_conn_write_request(struct up_conn *c);

/* egress.c */
/* Opens c->bev to the proxy and starts the CONNECT for an https upstream;
 * once the proxy says 2xx, c->bev becomes a TLS filter over the tunnel and
 * the request waiting on c is written. 0, or -1 (c->setup_failed). */
int up_tunnel_open(struct up_conn *c);

#endif
