/* What the Redis backend's blocking side (store_redis.c) shares with its
 * asynchronous side (store_redis_async.c): the store, commands built from a
 * call's arguments, and the reading of their replies, so that both sides
 * answer exactly alike. Internal to store/. */
#ifndef SLUICE_STORE_STORE_REDIS_INTERNAL_H
#define SLUICE_STORE_STORE_REDIS_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include <hiredis/hiredis.h>

#include "store/record.h"
#include "store/redis_conn.h"
#include "store/redis_sync.h"
#include "store/redis_scripts.h"
#include "store/store_backend.h"

#define REDIS_PREFIX_MAX 64
#define REDIS_HOST_MAX 256
/* prefix ":{" scope "}:k:" key */
#define REDIS_KEY_MAX (REDIS_PREFIX_MAX + 2 + RECORD_SCOPE_MAX + 4 + RECORD_KEY_MAX + 1)
#define REDIS_ADDR_MAX (REDIS_HOST_MAX + 8)
#define REDIS_HOLDER_LEN 32          /* policies/verify.h VERIFY_HOLDER_LEN */

/* Nodes of a Redis Cluster sluice keeps track of (seeds and primaries). */
#define REDIS_NODES_MAX 64

struct redis_sentinel;
struct redis_cluster;
struct redis_notify;

struct redis_store {
    struct store base;           /* first: the interface (store_backend.h) */
    pthread_mutex_t primary_lock; /* guards host and port */
    char host[REDIS_HOST_MAX];   /* the primary: the url's, or the sentinels' */
    unsigned port;
    atomic_uint primary_gen;     /* bumped when host:port change */
    struct redis_sentinel *sentinel; /* NULL: no sentinels */
    struct redis_cluster *cluster; /* NULL: not a Redis Cluster */
    struct redis_notify *notify; /* NULL: no channel listened to yet */
    struct redis_sync *node_sync[REDIS_NODES_MAX]; /* cluster: the blocking
                                    connection per node, under lock */
    unsigned replicas_ack;       /* WAIT for them after a completion */
    char *user;                  /* NULL: the default user */
    char *password;              /* NULL: none */
    char *server_name;           /* tls.server_name; NULL: the host */
    SSL_CTX *tls;                /* NULL: plain TCP */
    unsigned db;
    const char *scripts[SCRIPT_COUNT]; /* loaded on every new connection */
    struct redis_conn_opts conn;  /* every connection to the primary */
    struct redis_conn_opts sentinel_conn; /* to the sentinels: TLS, no AUTH */
    uint64_t timeout_ms;
    char prefix[REDIS_PREFIX_MAX + 2]; /* with its trailing ':' */
    char holder[REDIS_HOLDER_LEN + 1]; /* this process's id (contract §11),
                                          drawn at open: named by the leases
                                          it takes and its liveness keys */
    char addr[REDIS_ADDR_MAX];   /* "host:port" or "master NAME", for
                                    messages: fixed at open */
    pthread_mutex_t lock;        /* guards sync, ctx_gen, cause */
    struct redis_sync *sync;     /* the blocking connection */
    unsigned ctx_gen;            /* the primary's generation it was made to */
    atomic_bool healthy;         /* the last blocking command worked */
    char cause[256];             /* why it did not: for /readyz, no secret */
};

/* What a reply is read against: kept by an asynchronous call in flight,
 * after the command's own buffers are gone. */
struct rcmd_info {
    enum store_op op;
    int script;                  /* enum redis_script, or -1: a plain command */
    uint64_t now_ms;
    uint32_t attempt;            /* release */
    uint64_t ttl_ms;             /* acquire, permit_lease: a late grant's
                                    release keeps the count that long */
    struct {                     /* permit_lease: the lease a fresh key
                                    gets (attempt 1, created now_ms), which
                                    its answer does not carry back */
        uint64_t lease, lease_expires_ms;
        uint8_t fp[STORE_FP_LEN];
    } fresh;
    /* "scope/key", for messages, and read back to give a late grant back
     * (a scope has no '/') */
    char name[RECORD_SCOPE_MAX + 1 + RECORD_KEY_MAX + 1];
};

/* The longest: a followed quota's permit, EVALSHA sha 2 key key2 and 12
 * arguments (17). */
#define RCMD_ARGS 24
/* A lease's record (130 bytes) and a small result fit. */
#define RCMD_BLOB_INLINE 1024

/* One command, as argv for hiredis. argv points into the struct itself (or
 * its blob): build it in place, use it there, then rcmd_free. */
struct rcmd {
    struct rcmd_info info;
    int argc;
    const char *argv[RCMD_ARGS];
    size_t len[RCMD_ARGS];
    char key[REDIS_KEY_MAX];
    char key2[REDIS_KEY_MAX];    /* a script's second key, or "" */
    char key3[REDIS_KEY_MAX];    /* its third (after key2), or "" */
    uint8_t now[8], expires[8], lease[8], kept_attempt[4];
    char at[24], now_dec[24], until_dec[24];
    char live[REDIS_KEY_MAX];    /* acquire: the prefix of liveness keys */
    char num[13][24];             /* decimal arguments of bucket scripts */
    uint8_t blob_inline[RCMD_BLOB_INLINE]; /* an encoded record */
    uint8_t *blob;               /* one too large for it (owned), or NULL */
};

/* Builds the command of one operation (the five asynchronous ones), after
 * the same key checks as RocksDB. 0 or -EINVAL / -ENOMEM with err. */
int rcmd_build(struct redis_store *st, enum store_op op,
               const struct store_args *a, struct rcmd *cmd,
               struct sc_error *err);
void rcmd_free(struct rcmd *cmd);

/* A lease as it was taken (its record's attempt, created_ms and
 * fingerprint), kept by the loop that took it so that its completion
 * writes the record in one command (COMPLETE in redis_scripts.c). */
struct redis_lease_hint {
    uint64_t lease;                  /* the fence; 0: none */
    uint64_t created_ms;
    uint32_t attempt;
    uint8_t fp[STORE_FP_LEN];
};

/* Where a reply's result goes: what the operation fills (the others may
 * be NULL). */
struct rcmd_out {
    struct store_record *rec;        /* get */
    struct store_acquire_out *acq;   /* acquire, permit_lease */
    struct store_permit *permit;     /* permit, permit_lease */
    struct store_slot *slot;         /* slot_take */
    struct redis_lease_hint *hint;   /* acquire, permit_lease: the lease
                                        taken (lease 0 when none) */
};

/* Reads r, the reply to a command built as info says, into what the
 * blocking call returns: 0 or a negative code with err, and out's part for
 * the operation filled. r must not be an error reply of the connection
 * (see redis_reply_error). */
int rcmd_result(const struct redis_store *st, const struct rcmd_info *info,
                const redisReply *r, const struct rcmd_out *out,
                struct sc_error *err);

/* A verification step's command and the reading of its reply
 * (redis_verify.c): 0 or a negative code as store.h's store_verify_*. */
int redis_verify_build(struct redis_store *st, const char *scope,
                       const char *key, const struct store_verify_args *a,
                       struct rcmd *cmd, struct sc_error *err);
int redis_verify_result(const struct redis_store *st,
                        const struct rcmd_info *info, const redisReply *r,
                        struct sc_error *err);

/* Command pieces (redis_cmd.c), for the bucket commands (redis_bucket.c)
 * and the verification's (redis_verify.c). */
void redis_arg(struct rcmd *cmd, const void *p, size_t len);
/* rec encoded (record_encode) as the next argument: 0 or -EINVAL /
 * -ENOMEM with err. */
int redis_arg_record(struct rcmd *cmd, const struct store_record *rec,
                     struct sc_error *err);
void redis_arg_str(struct rcmd *cmd, const char *s);
void redis_evalsha(struct rcmd *cmd, enum redis_script s);

/* Shared buckets and slots (redis_bucket.c): their commands and replies. */
/* The Redis key of the bucket of (scope, partition) into out. */
void redis_bucket_key(const struct redis_store *st, const char *scope,
                      const char *partition, char out[REDIS_KEY_MAX]);
/* A script's bucket numbers: T, tau and the wait (µs) as its arguments. */
void redis_bucket_args(struct rcmd *cmd, uint64_t t_ns, uint64_t tau_ns,
                       uint64_t wait_ns);
/* Whether r's i-th element is an integer, into *v. */
bool redis_int_at(const redisReply *r, size_t i, long long *v);
int redis_bucket_build(struct redis_store *st, enum store_op op,
                       const struct store_args *a, struct rcmd *cmd,
                       struct sc_error *err);
int redis_bucket_result(const struct redis_store *st,
                        const struct rcmd_info *info, const redisReply *r,
                        const struct rcmd_out *out, struct sc_error *err);

/* The Redis keys of a record and of a scope's pause, into cmd->key, with
 * cmd->info.name for messages; after the same checks as RocksDB
 * (record_key_make), so both backends take the same keys. 0 or -EINVAL. */
int redis_record_key(const struct redis_store *st, const char *scope,
                     const char *key, struct rcmd *cmd, struct sc_error *err);
/* Holders (contract §11): the prefix of a scope's liveness keys,
 * "<prefix>{<scope>}:live:", into live; in the record's hash tag, so a
 * script on the record reads them in its Cluster slot (the holder itself
 * is in the record, v5). scope is checked already. */
void redis_live_prefix(const struct redis_store *st, const char *scope,
                       char live[REDIS_KEY_MAX]);

/* The scope (a policy's name) as record_key_make takes it: 0 or -EINVAL. */
int redis_scope_check(const char *scope, struct sc_error *err);
int redis_pause_key(const struct redis_store *st, const char *scope,
                    struct rcmd *cmd, struct sc_error *err);

/* "store: <name>: what" */
void redis_name_error(struct sc_error *err, const struct rcmd_info *info,
                      const char *what);
/* A reply of the wrong shape: -EPROTO with err. */
int redis_unexpected(const struct redis_store *st, const struct rcmd_info *info,
                     struct sc_error *err);

/* Whether r is Redis's "the script is not in my cache" (a restarted or
 * failed-over Redis, or SCRIPT FLUSH): load it again and call again. */
bool redis_reply_noscript(const redisReply *r);

/* Whether r is Redis's "this is a replica" to a write: the primary we
 * talk to was demoted by a failover. */
bool redis_reply_readonly(const redisReply *r);

/* ---- the primary, and Sentinel (redis_sentinel.c) ---- */

/* The primary to connect to now (copied under primary_lock) and its
 * generation: a connection made to an older generation is stale. */
void redis_primary(struct redis_store *st, char host[REDIS_HOST_MAX],
                   unsigned *port, unsigned *gen);
unsigned redis_primary_gen(struct redis_store *st);

/* Asks the sentinels once, blocking (each bounded by timeout_ms), then
 * starts the thread that follows failovers (a +switch-master subscription,
 * a poll every second, and a new question whenever redis_sentinel_reask
 * asks). Nothing without sentinels. 0 or -ENOMEM / an error of
 * pthread_create, with err. */
int redis_sentinel_start(struct redis_store *st,
                         const struct store_redis_opts *o,
                         struct sc_error *err);
void redis_sentinel_stop(struct redis_store *st);

/* A connection to the primary failed or was refused a write (READONLY):
 * asks the sentinels again soon, without waiting for them. Nothing
 * without sentinels; callable from any thread. */
void redis_sentinel_reask(struct redis_store *st);

/* ---- Redis Cluster (redis_cluster.c) ---- */

/* Reads the slot map from the seeds once, blocking (each node bounded by
 * timeout_ms), then starts the thread that keeps it current (every second,
 * and soon after redis_cluster_reask). Nothing without cluster. 0 or a
 * negative code with err. */
int redis_cluster_start(struct redis_store *st, const struct store_redis_opts *o,
                        struct sc_error *err);
void redis_cluster_stop(struct redis_store *st);
/* The node that owns slot now (an index of the node table), or -1. */
int redis_cluster_owner(const struct redis_store *st, unsigned slot);
/* The index of host:port (hlen bytes) in the node table, added when new;
 * -ENOSPC (full) or -EINVAL. Any thread. */
int redis_cluster_node(struct redis_store *st, const char *host, size_t hlen,
                       unsigned port);
void redis_cluster_addr(const struct redis_store *st, int node,
                        char host[REDIS_HOST_MAX], unsigned *port);
/* A MOVED: slot is node's from now on, and the whole map is read again
 * soon. */
void redis_cluster_moved(struct redis_store *st, unsigned slot, int node);
/* A connection to a primary failed: the map is read again soon. Nothing
 * without cluster; any thread. */
void redis_cluster_reask(struct redis_store *st);
/* Whether every primary of the map answered its last PING; else the cause
 * (no secret) into cause. */
bool redis_cluster_healthy(struct redis_store *st, char *cause, size_t len);

/* ---- the end of a lease, announced (redis_notify.c) ---- */

/* Listens to the channels of scopes from now on (store_notify_set),
 * starting the thread on the first call with any. */
int redis_notify_set(struct redis_store *st, const char *const *scopes, size_t n,
                     store_done_fn *done, void *arg, struct sc_error *err);
/* Whether scope's channel is confirmed on a live connection. Any thread. */
bool redis_notified(struct redis_store *st, const char *scope);
uint64_t redis_notices(struct redis_store *st);
/* Stops the thread and closes its connections. */
void redis_notify_stop(struct redis_store *st);

/* The asynchronous side's entries (store_redis_async.c). */
int redis_loop_new(struct store *st, struct event_base *base,
                   struct store_loop **out, struct sc_error *err);
void redis_loop_free(struct store_loop *sl);
int redis_start(struct store_loop *sl, struct store_call *c, enum store_op op,
                const struct store_args *a);
void redis_cancel(struct store_call *c);

#endif
