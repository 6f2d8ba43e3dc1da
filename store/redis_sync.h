/* Blocking use of a Redis connection (redis_conn.h): a private event base
 * run until the reply or the timeout, for the admin server's and start-up's
 * calls and the Sentinel thread. Not thread-safe: one user at a time.
 * Internal to store/. */
#ifndef SLUICE_STORE_REDIS_SYNC_H
#define SLUICE_STORE_REDIS_SYNC_H

#include <stdbool.h>
#include <stdint.h>

#include "store/redis_conn.h"

struct redis_sync;

/* A blocking connection's state (its own event base), not yet connected.
 * push, if any, gets replies no command waits for. NULL: out of memory. */
struct redis_sync *redis_sync_new(uint64_t timeout_ms,
                                  void (*push)(const redisReply *r, void *arg),
                                  void *arg);
void redis_sync_free(struct redis_sync *s);

/* Connects (dropping any connection it had) and runs the handshake, all
 * within the timeout. 0, or -ENOTCONN ("cannot connect: ..."), -EACCES
 * ("AUTH failed: ..."), -EIO, -ETIMEDOUT with err. */
int redis_sync_connect(struct redis_sync *s, const char *host, unsigned port,
                       const struct redis_conn_opts *o, struct sc_error *err);

/* Whether it has a connection that is still open (what the server sent
 * meanwhile is read first: a close, a subscription's messages). */
bool redis_sync_open(struct redis_sync *s);

void redis_sync_drop(struct redis_sync *s);

/* One command, answered within the timeout: 0 and *out (free it), or
 * -ETIMEDOUT ("no reply within N ms") / -EIO / -ENOTCONN with err, and the
 * connection dropped. An error reply is a reply (0). */
int redis_sync_command(struct redis_sync *s, int argc, const char **argv,
                       const size_t *len, redisReply **out,
                       struct sc_error *err);

/* Waits up to ms for a pushed reply (handed to push) or for wake_fd (-1:
 * none) to be readable; returns early on either. */
void redis_sync_wait(struct redis_sync *s, uint64_t ms, int wake_fd);

#endif
