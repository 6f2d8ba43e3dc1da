/* One Redis connection, the only kind the store makes (docs/reference/fleet.md,
 * "Connections"): hiredis only reads replies (its redisReader); the bytes
 * move on a libevent bufferevent, plain or OpenSSL (util/tls_client.h), so
 * the loops' connections, the blocking calls and the Sentinel thread share
 * one place for connecting, TLS, AUTH (an ACL user or the default one),
 * SELECT, loading scripts and pipelining. Internal to store/.
 *
 * Asynchronous use (redis_conn_open): commands may be sent at once, before
 * the connection is up; they are written after the handshake and answered
 * in order, each callback run exactly once (with NULL when the connection
 * ends first). The caller bounds waits with its own timers. Blocking use:
 * redis_sync.h. */
#ifndef SLUICE_STORE_REDIS_CONN_H
#define SLUICE_STORE_REDIS_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/event.h>
#include <hiredis/hiredis.h>
#include <openssl/ssl.h>

#include "util/error.h"

/* What every connection to one kind of server is made with; the strings
 * and the context must outlive the connections. */
struct redis_conn_opts {
    SSL_CTX *tls;               /* NULL: plain TCP */
    bool verify;                /* the server's name (or IP) is checked */
    const char *server_name;    /* NULL or "": the host connected to */
    const char *user;           /* NULL: AUTH <password> (the default user) */
    const char *password;       /* NULL: no AUTH */
    unsigned db;                /* SELECTed when not 0 */
    const char *const *preload; /* SCRIPT LOAD of each, in the handshake */
    unsigned n_preload;
};

struct redis_conn;

/* A reply, or NULL when the connection ended before it came. The reply is
 * freed when the callback returns, unless it calls redis_conn_keep. */
typedef void redis_conn_reply_fn(struct redis_conn *c, redisReply *r,
                                 void *priv);

struct redis_conn_events {
    /* The handshake is done (AUTH, SELECT, scripts): optional. */
    void (*ready)(struct redis_conn *c, void *arg);
    /* The connection ends: once, before the calls in flight get NULL.
     * rc: -ENOTCONN (could not connect: TCP or TLS), -EACCES (credentials
     * refused), -EIO (lost, or a handshake command failed), -EPROTO, or 0
     * (closed by redis_conn_close). why never holds a secret. */
    void (*lost)(struct redis_conn *c, int rc, const char *why, void *arg);
    /* A reply no command waits for (a subscription's message): optional. */
    void (*push)(struct redis_conn *c, redisReply *r, void *arg);
    void *arg;
};

/* Starts connecting to host:port on base and sends the handshake. 0, or a
 * negative code with err when it cannot even start (no callback runs). */
int redis_conn_open(struct event_base *base, const char *host, unsigned port,
                    const struct redis_conn_opts *o,
                    const struct redis_conn_events *ev,
                    struct redis_conn **out, struct sc_error *err);

/* Queues a command (formatted, or as argv; fn may be NULL: the reply is
 * dropped). 0, or -ENOTCONN once the connection is closing, -ENOMEM. */
int redis_conn_send(struct redis_conn *c, const char *cmd, size_t len,
                    redis_conn_reply_fn *fn, void *priv);
int redis_conn_send_argv(struct redis_conn *c, int argc, const char **argv,
                         const size_t *len, redis_conn_reply_fn *fn,
                         void *priv);

/* Formats argv as one RESP command into buf (cap bytes) when it fits;
 * returns its length either way, so a caller may size a buffer and call
 * again. */
size_t redis_format_argv(char *buf, size_t cap, int argc, const char **argv,
                         const size_t *len);

/* Replies on the heap, as hiredis makes them, instead of the connection's
 * arena, so that redis_conn_keep may keep them: for blocking use
 * (redis_sync.c), before any reply is read. */
void redis_conn_heap_replies(struct redis_conn *c);

/* Inside a reply callback of a connection with heap replies: the reply is
 * the callback's to free. */
void redis_conn_keep(struct redis_conn *c);

/* Whether the handshake is done and the connection not closing. */
bool redis_conn_ready(const struct redis_conn *c);

/* Why it ended (or "" while it has not). */
const char *redis_conn_why(const struct redis_conn *c);

/* Closes it: lost (rc 0), then every call in flight gets NULL. From inside
 * one of its callbacks this happens when that callback returns (its reply
 * stays readable until then). c is gone afterwards. */
void redis_conn_close(struct redis_conn *c);

#endif
