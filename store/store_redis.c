/* The idempotency store on Redis (store.h, docs/contract.md §10): one Redis
 * shared by a fleet of sidecars, with RocksDB's semantics (store_rocksdb.c).
 *
 * Keys: <prefix>:{<scope>}:k:<key> holds a record as record.h's binary value
 * (the same bytes RocksDB stores); <prefix>:{<scope>}:pause holds a pause as
 * decimal ms. The scope is a hash tag, so a policy's keys share one Redis
 * Cluster slot. Every read-modify-write is one Lua script (redis_scripts.c),
 * atomic in Redis whatever the number of sidecars.
 *
 * Clocks: times are the callers' (now_ms), as for RocksDB, so the hosts of a
 * fleet need synchronised clocks: a sidecar whose clock runs d ms behind
 * another's sees that one's leases last d ms longer (and the reverse).
 * Expiry is Redis's own: each write sets the key's expiry (PXAT) at the
 * record's expires_ms, so Redis drops what has expired by its clock (sweep
 * has nothing to do), while reads still judge liveness by the caller's
 * now_ms. The scripts use SET's PXAT, GET and KEEPTTL: Redis 6.2 or later.
 *
 * Durability: a script's reply means Redis has applied the write; that it
 * survives a crash of Redis is Redis's persistence (AOF) and replication,
 * configured on the server.
 *
 * Here: opening, the blocking calls (one connection, a mutex around it, for
 * the admin server, start-up and tests), the commands and the reading of
 * replies. The asynchronous calls are in store_redis_async.c; the primary's
 * address, found and followed through Sentinel, in redis_sentinel.c; a Redis
 * Cluster's slot map in redis_cluster.c (then the blocking calls keep one
 * connection per node and follow MOVED, ASK and TRYAGAIN themselves, and the
 * store's health is the cluster thread's). The
 * blocking calls never WAIT for replicas (replicas_ack is the request
 * path's: store_complete_async). */
#include "store/store.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store/redis_slot.h"
#include "store/store_redis_internal.h"
#include "util/clock.h"
#include "util/tls_client.h"

#define DEFAULT_TIMEOUT_MS 100
#define DEFAULT_PREFIX "sluice"

static const struct store_ops redis_ops;

static struct redis_store *rs(struct store *base)
{
    return (struct redis_store *)base;
}

/* ---- the blocking connection ---- */

/* Why the store is not healthy, for /readyz (redis_conn's texts and Redis's
 * error replies never hold the password). Under st->lock. */
static void set_cause(struct redis_store *st, const char *why)
{
    snprintf(st->cause, sizeof st->cause, "%.*s", (int)sizeof st->cause - 1, why);
}

/* The connection broke or timed out (dropped by redis_sync): the next call
 * connects again. */
static int conn_broken(struct redis_store *st, int rc, const char *what,
                       const struct sc_error *e, struct sc_error *err)
{
    sc_error_set(err, "store: redis at %s: %s: %s", st->addr, what, e->text);
    redis_sentinel_reask(st);
    return rc;
}

/* One command on the connection s (held under st->lock); NULL when the
 * connection broke (dropped, err set). */
static redisReply *command(struct redis_store *st, struct redis_sync *s,
                           int argc, const char **argv, const size_t *len,
                           const char *what, int *rc, struct sc_error *err)
{
    struct sc_error e;
    redisReply *r;
    int c = redis_sync_command(s, argc, argv, len, &r, &e);

    if (c != 0) {
        *rc = conn_broken(st, c, what, &e, err);
        redis_cluster_reask(st);
    }
    return c ? NULL : r;
}

/* Connects to the primary of now, with the handshake (redis_conn.c). A
 * refused handshake (credentials, a db) is not a reason to ask the
 * sentinels again; an unreachable server is. */
static int connect_blocking(struct redis_store *st, struct sc_error *err)
{
    char host[REDIS_HOST_MAX];
    unsigned port;
    struct sc_error e;
    int rc;

    redis_primary(st, host, &port, &st->ctx_gen);
    rc = redis_sync_connect(st->sync, host, port, &st->conn, &e);
    if (rc == 0)
        return 0;
    sc_error_set(err, "store: redis at %s: %s", st->addr, e.text);
    if (rc == -ENOTCONN || rc == -ETIMEDOUT)
        redis_sentinel_reask(st);
    return rc;
}

/* An idle request/response connection has nothing to read: if Redis closed
 * it (a restart, a timeout on its side), a command sent there would fail
 * for nothing. One made to a primary the sentinels no longer name is stale
 * too. */
static bool stale(struct redis_store *st)
{
    return st->ctx_gen != redis_primary_gen(st) || !redis_sync_open(st->sync);
}

/* A write refused by a demoted primary: the next command connects to the
 * one the sentinels name. */
static void check_readonly(struct redis_store *st, const redisReply *r)
{
    if (!redis_reply_readonly(r))
        return;
    redis_sync_drop(st->sync);
    redis_sentinel_reask(st);
}

/* The command on s, loading the script again when Redis has lost it. */
static redisReply *exec_on(struct redis_store *st, struct redis_sync *s,
                           int argc, const char **argv, const size_t *len,
                           int script, int *rc, struct sc_error *err)
{
    redisReply *r = command(st, s, argc, argv, len, argv[0], rc, err);

    if (r && script >= 0 && redis_reply_noscript(r)) {
        const char *load[] = {"SCRIPT", "LOAD", redis_script_body(script)};
        size_t load_len[] = {6, 4, strlen(load[2])};
        redisReply *l = command(st, s, 3, load, load_len, "SCRIPT LOAD", rc, err);

        freeReplyObject(r);
        if (!l)
            return NULL;
        freeReplyObject(l);
        r = command(st, s, argc, argv, len, argv[0], rc, err);
    }
    return r;
}

/* The blocking connection to cluster node i, connected. */
static struct redis_sync *node_sync(struct redis_store *st, int i, int *rc,
                                    struct sc_error *err)
{
    char host[REDIS_HOST_MAX];
    unsigned port;
    struct sc_error e;

    if (!st->node_sync[i] &&
        !(st->node_sync[i] = redis_sync_new(st->timeout_ms, NULL, NULL))) {
        sc_error_set(err, "store: out of memory");
        *rc = -ENOMEM;
        return NULL;
    }
    if (redis_sync_open(st->node_sync[i]))
        return st->node_sync[i];
    redis_cluster_addr(st, i, host, &port);
    if ((*rc = redis_sync_connect(st->node_sync[i], host, port, &st->conn, &e)) == 0)
        return st->node_sync[i];
    sc_error_set(err, "store: redis cluster node %s:%u: %s", host, port, e.text);
    redis_cluster_reask(st);
    return NULL;
}

/* A redirection in r: the node it names (MOVED also moves the slot in the
 * map), or a negative code with err. r is freed. */
static int redirected(struct redis_store *st, redisReply *r, bool *asking,
                      struct sc_error *err)
{
    struct redis_redirect rd;
    int node;

    redis_redirect_parse(r, &rd);
    node = redis_cluster_node(st, rd.host, rd.hlen, rd.port);
    if (node < 0)
        sc_error_set(err, "store: redis cluster: cannot follow \"%s\"", r->str);
    else if (!rd.ask)
        redis_cluster_moved(st, rd.slot, node);
    *asking = rd.ask;
    freeReplyObject(r);
    return node < 0 ? -EIO : node;
}

/* ASKING before a command sent where an ASK pointed. */
static bool send_asking(struct redis_store *st, struct redis_sync *s, int *rc,
                        struct sc_error *err)
{
    const char *argv[] = {"ASKING"};
    size_t len[] = {6};
    redisReply *r = command(st, s, 1, argv, len, "ASKING", rc, err);

    freeReplyObject(r);
    return r != NULL;
}

#define REDIRECTS_MAX 3

/* On a cluster: the command goes to the owner of key's slot (node when key
 * is NULL), following MOVED and ASK a few times. */
static redisReply *route_once(struct redis_store *st, const char *key, int node,
                               int argc, const char **argv, const size_t *len,
                               int script, int *rc, struct sc_error *err)
{
    unsigned slot = key ? redis_key_slot(key, strlen(key)) : 0;
    struct redis_redirect rd;
    struct redis_sync *s;
    bool asking = false;
    redisReply *r = NULL;

    if (key)
        node = redis_cluster_owner(st, slot);
    for (int hop = 0; hop <= REDIRECTS_MAX; hop++) {
        if (node < 0) {
            sc_error_set(err, "store: redis cluster: slot %u has no known "
                         "primary", slot);
            *rc = -ENOTCONN;
            redis_cluster_reask(st);
            return NULL;
        }
        if (!(s = node_sync(st, node, rc, err)) ||
            (asking && !send_asking(st, s, rc, err)) ||
            !(r = exec_on(st, s, argc, argv, len, script, rc, err)))
            return NULL;
        if (!redis_redirect_parse(r, &rd))
            return r;
        if (hop == REDIRECTS_MAX)
            break;
        if ((node = redirected(st, r, &asking, err)) < 0) {
            *rc = node;
            return NULL;
        }
    }
    return r; /* still a redirection: an error reply */
}

#define TRYAGAIN_MS 10

/* route_once, and again TRYAGAIN_MS later after TRYAGAIN or CLUSTERDOWN
 * (a slot migrating, a failover under way) while within the timeout. */
static redisReply *run_cluster(struct redis_store *st, const char *key, int node,
                               int argc, const char **argv, const size_t *len,
                               int script, int *rc, struct sc_error *err)
{
    uint64_t until = clock_mono_ns() + st->timeout_ms * NS_PER_MS;
    redisReply *r;

    while ((r = route_once(st, key, node, argc, argv, len, script, rc, err)) &&
           redis_reply_cluster_busy(r) &&
           clock_mono_ns() + TRYAGAIN_MS * NS_PER_MS < until) {
        freeReplyObject(r);
        usleep(TRYAGAIN_MS * 1000); /* a blocking call: the admin's, start-up's */
    }
    return r;
}

/* Runs one command, connecting first when there is no connection, and
 * loading the script again when Redis has lost it. *out: the reply (free
 * it), NULL when rc < 0. Records whether the command worked (healthy).
 * key routes it on a cluster (NULL: node). */
static int run_locked(struct redis_store *st, const char *key, int node,
                      int argc, const char **argv, const size_t *len,
                      int script, redisReply **out, struct sc_error *err)
{
    redisReply *r = NULL;
    int rc = 0;

    if (st->cluster) {
        *out = r = run_cluster(st, key, node, argc, argv, len, script, &rc, err);
        return r ? 0 : rc;
    }
    if (stale(st) && (rc = connect_blocking(st, err)) != 0)
        goto out;
    if (!(r = exec_on(st, st->sync, argc, argv, len, script, &rc, err)))
        goto out;
    check_readonly(st, r);
out:
    atomic_store(&st->healthy, r && r->type != REDIS_REPLY_ERROR);
    if (!r)
        set_cause(st, err->text);
    else if (r->type == REDIS_REPLY_ERROR)
        set_cause(st, r->str);
    *out = r;
    return r ? 0 : rc;
}

static int run(struct redis_store *st, const char *key, int argc,
               const char **argv, const size_t *len, int script,
               redisReply **out, struct sc_error *err)
{
    int rc;

    pthread_mutex_lock(&st->lock);
    rc = run_locked(st, key, 0, argc, argv, len, script, out, err);
    pthread_mutex_unlock(&st->lock);
    return rc;
}

/* One of the five operations the asynchronous side has too. */
static int run_op(struct redis_store *st, enum store_op op,
                  const struct store_args *a, struct store_record *rec,
                  struct store_acquire_out *acq, struct sc_error *err)
{
    struct rcmd cmd;
    redisReply *r = NULL;
    int rc;

    if (rec)
        memset(rec, 0, sizeof *rec);
    if (acq)
        memset(acq, 0, sizeof *acq);
    if ((rc = rcmd_build(st, op, a, &cmd, err)) == 0 &&
        (rc = run(st, cmd.key, cmd.argc, cmd.argv, cmd.len, cmd.info.script,
                   &r, err)) == 0)
        rc = rcmd_result(st, &cmd.info, r,
                         &(struct rcmd_out){.rec = rec, .acq = acq}, err);
    freeReplyObject(r);
    rcmd_free(&cmd);
    return rc;
}

/* ---- the blocking calls ---- */

static int redis_get(struct store *base, const char *scope, const char *key,
                     uint64_t now_ms, struct store_record *out,
                     struct sc_error *err)
{
    struct store_args a = {.scope = scope, .key = key, .now_ms = now_ms};

    return run_op(rs(base), STORE_OP_GET, &a, out, NULL, err);
}

static int redis_acquire(struct store *base, const char *scope,
                         const char *key, const uint8_t fp[STORE_FP_LEN],
                         uint64_t now_ms, uint64_t lease_ms, uint64_t ttl_ms,
                         struct store_acquire_out *out, struct sc_error *err)
{
    struct store_args a = {.scope = scope, .key = key, .fp = fp,
                           .now_ms = now_ms, .lease_ms = lease_ms,
                           .ttl_ms = ttl_ms};

    return run_op(rs(base), STORE_OP_ACQUIRE, &a, NULL, out, err);
}

static int redis_complete(struct store *base, const char *scope,
                          const char *key, uint64_t lease, uint64_t now_ms,
                          uint64_t ttl_ms, int status,
                          const struct store_header *headers,
                          size_t n_headers, const uint8_t *body,
                          size_t body_len, bool body_omitted,
                          struct sc_error *err)
{
    struct store_args a = {.scope = scope, .key = key, .lease = lease,
                           .now_ms = now_ms,
                           .ttl_ms = ttl_ms, .status = status,
                           .headers = headers, .n_headers = n_headers,
                           .body = body, .body_len = body_len,
                           .body_omitted = body_omitted};

    return run_op(rs(base), STORE_OP_COMPLETE, &a, NULL, NULL, err);
}

static int redis_release(struct store *base, const char *scope,
                         const char *key, uint32_t attempt, uint64_t lease,
                         uint64_t now_ms, uint64_t ttl_ms, struct sc_error *err)
{
    struct store_args a = {.scope = scope, .key = key, .attempt = attempt,
                           .lease = lease,
                           .now_ms = now_ms, .ttl_ms = ttl_ms};

    return run_op(rs(base), STORE_OP_RELEASE, &a, NULL, NULL, err);
}

static int redis_pause_set(struct store *base, const char *scope,
                           uint64_t now_ms, uint64_t until_ms,
                           struct sc_error *err)
{
    struct store_args a = {.scope = scope, .now_ms = now_ms,
                           .until_ms = until_ms};

    return run_op(rs(base), STORE_OP_PAUSE_SET, &a, NULL, NULL, err);
}

/* A step of a lease's verification: one script, fenced to the lease. */
static int redis_verify(struct store *base, const char *scope, const char *key,
                        const struct store_verify_args *a, struct sc_error *err)
{
    struct redis_store *st = rs(base);
    struct rcmd cmd;
    redisReply *r = NULL;
    int rc;

    if ((rc = redis_verify_build(st, scope, key, a, &cmd, err)) == 0 &&
        (rc = run(st, cmd.key, cmd.argc, cmd.argv, cmd.len, cmd.info.script, &r, err)) == 0)
        rc = redis_verify_result(st, &cmd.info, r, err);
    freeReplyObject(r);
    rcmd_free(&cmd);
    return rc;
}

/* SET <prefix>{scope}:live:<holder> 1 PX ttl: this process is alive. */
static int redis_live(struct store *base, const char *scope, uint64_t ttl_ms,
                      struct sc_error *err)
{
    struct redis_store *st = rs(base);
    char key[REDIS_KEY_MAX + REDIS_HOLDER_LEN], px[24];
    const char *argv[5];
    size_t len[5];
    redisReply *r = NULL;
    int rc = redis_scope_check(scope, err);

    if (rc)
        return rc;
    redis_live_prefix(st, scope, key);
    strncat(key, st->holder, sizeof key - strlen(key) - 1);
    snprintf(px, sizeof px, "%llu", (unsigned long long)ttl_ms);
    argv[0] = "SET", argv[1] = key, argv[2] = "1", argv[3] = "PX", argv[4] = px;
    for (int i = 0; i < 5; i++)
        len[i] = strlen(argv[i]);
    if ((rc = run(st, key, 5, argv, len, -1, &r, err)) == 0 &&
        r->type == REDIS_REPLY_ERROR) {
        sc_error_set(err, "store: redis at %s: liveness of %s: %s", st->addr,
                     scope, r->str);
        rc = -EIO;
    }
    freeReplyObject(r);
    return rc;
}

/* DEL of a key: 0, or -ENOENT (err untouched) when there was none. */
static int del(struct redis_store *st, struct rcmd *cmd, struct sc_error *err)
{
    const char *argv[] = {"DEL", cmd->key};
    size_t len[] = {3, strlen(cmd->key)};
    redisReply *r;
    int rc = run(st, cmd->key, 2, argv, len, -1, &r, err);

    if (rc)
        return rc;
    if (r->type == REDIS_REPLY_INTEGER)
        rc = r->integer > 0 ? 0 : -ENOENT;
    else if (r->type == REDIS_REPLY_ERROR) {
        sc_error_set(err, "store: redis at %s: %s: %s", st->addr,
                     cmd->info.name, r->str);
        rc = -EIO;
    } else
        rc = redis_unexpected(st, &cmd->info, err);
    freeReplyObject(r);
    return rc;
}

/* Deletes whatever is stored, expired or unreadable alike, as RocksDB. */
static int redis_forget(struct store *base, const char *scope,
                        const char *key, struct sc_error *err)
{
    struct rcmd cmd = {0};
    int rc = redis_record_key(rs(base), scope, key, &cmd, err);

    return rc ? rc : del(rs(base), &cmd, err);
}

static int redis_pause_clear(struct store *base, const char *scope,
                             struct sc_error *err)
{
    struct rcmd cmd = {0};
    int rc = redis_pause_key(rs(base), scope, &cmd, err);

    return rc ? rc : del(rs(base), &cmd, err);
}

static int parse_until(const struct rcmd_info *info, const redisReply *r,
                       uint64_t *until, struct sc_error *err)
{
    char buf[24], *end;

    if (r->type != REDIS_REPLY_STRING || r->len == 0 || r->len >= sizeof buf) {
        redis_name_error(err, info, "the stored pause is not a number");
        return -EBADMSG;
    }
    memcpy(buf, r->str, r->len);
    buf[r->len] = '\0';
    errno = 0;
    *until = strtoull(buf, &end, 10);
    if (*end || errno || buf[0] < '0' || buf[0] > '9') {
        redis_name_error(err, info, "the stored pause is not a number");
        return -EBADMSG;
    }
    return 0;
}

static int redis_pause_get(struct store *base, const char *scope,
                           uint64_t now_ms, uint64_t *until_ms,
                           struct sc_error *err)
{
    struct redis_store *st = rs(base);
    struct rcmd cmd = {0};
    const char *argv[2] = {"GET", cmd.key};
    size_t len[2] = {3, 0};
    redisReply *r;
    uint64_t until;
    int rc;

    if ((rc = redis_pause_key(st, scope, &cmd, err)) != 0)
        return rc;
    len[1] = strlen(cmd.key);
    if ((rc = run(st, cmd.key, 2, argv, len, -1, &r, err)) != 0)
        return rc;
    if (r->type == REDIS_REPLY_NIL)
        rc = -ENOENT;
    else if (r->type == REDIS_REPLY_ERROR) {
        sc_error_set(err, "store: redis at %s: %s: %s", st->addr,
                     cmd.info.name, r->str);
        rc = -EIO;
    } else if ((rc = parse_until(&cmd.info, r, &until, err)) == 0) {
        if (until > now_ms)
            *until_ms = until;
        else
            rc = -ENOENT;
    }
    freeReplyObject(r);
    return rc;
}

/* Redis expires records itself (PXAT on every write). */
static int redis_sweep(struct store *base, uint64_t now_ms, size_t max,
                       size_t *removed, struct sc_error *err)
{
    *removed = 0;
    return 0;
}

/* An estimate: DBSIZE of the selected database, so it counts pauses,
 * buckets, slots and the liveness keys, records Redis has not reclaimed
 * yet, and any other keys in that database
 * (another prefix, other applications). 0 when Redis cannot answer. */
static uint64_t dbsize(struct redis_store *st, int node)
{
    const char *argv[] = {"DBSIZE"};
    size_t len[] = {6};
    struct sc_error err;
    redisReply *r;
    uint64_t n = 0;

    if (run_locked(st, NULL, node, 1, argv, len, -1, &r, &err) != 0)
        return 0;
    if (r->type == REDIS_REPLY_INTEGER && r->integer > 0)
        n = (uint64_t)r->integer;
    freeReplyObject(r);
    return n;
}

/* On a cluster, the sum over the primaries of the map. */
static uint64_t redis_count(struct store *base)
{
    struct redis_store *st = rs(base);
    bool seen[REDIS_NODES_MAX] = {false};
    uint64_t n = 0;
    int node;

    pthread_mutex_lock(&st->lock);
    if (!st->cluster)
        n = dbsize(st, 0);
    for (unsigned s = 0; st->cluster && s < REDIS_SLOTS; s++)
        if ((node = redis_cluster_owner(st, s)) >= 0 && !seen[node]) {
            seen[node] = true;
            n += dbsize(st, node);
        }
    pthread_mutex_unlock(&st->lock);
    return n;
}

/* Whether the last blocking command worked, and the connection is still
 * open. Otherwise it asks Redis (a PING, bounded by the timeout), so
 * /readyz follows Redis going and coming back without waiting for
 * traffic. */
static bool redis_healthy(struct store *base)
{
    struct redis_store *st = rs(base);
    const char *argv[] = {"PING"};
    size_t len[] = {4};
    struct sc_error err;
    redisReply *r;
    bool ok;

    if (!st)
        return false;
    if (st->cluster)
        return redis_cluster_healthy(st, NULL, 0); /* its thread PINGs */
    pthread_mutex_lock(&st->lock);
    ok = atomic_load(&st->healthy) && !stale(st);
    pthread_mutex_unlock(&st->lock);
    if (ok)
        return true;
    if (run(st, NULL, 1, argv, len, -1, &r, &err) == 0)
        freeReplyObject(r);
    return atomic_load(&st->healthy);
}

/* ---- open and close ---- */

static int check_opts(const struct store_redis_opts *o, struct sc_error *err)
{
    const char *prefix = o->prefix ? o->prefix : "";

    if (!o->host || !*o->host || strlen(o->host) >= REDIS_HOST_MAX) {
        sc_error_set(err, "store: redis needs a host (under %d characters)",
                     REDIS_HOST_MAX);
        return -EINVAL;
    }
    if (o->port == 0 || o->port > 65535) {
        sc_error_set(err, "store: redis port %u is out of range", o->port);
        return -EINVAL;
    }
    if (strlen(prefix) > REDIS_PREFIX_MAX || strpbrk(prefix, "{}")) {
        /* A brace would move the hash tag off the scope. */
        sc_error_set(err, "store: redis key prefix must be at most %d "
                     "characters, without braces", REDIS_PREFIX_MAX);
        return -EINVAL;
    }
    return 0;
}

/* "sluice" and "sluice:" (docs/contract.md's form) both give "sluice:". */
static void set_prefix(struct redis_store *st, const char *prefix)
{
    size_t n;

    if (!prefix || !*prefix)
        prefix = DEFAULT_PREFIX;
    n = strlen(prefix);
    snprintf(st->prefix, sizeof st->prefix, "%s%s", prefix,
             prefix[n - 1] == ':' ? "" : ":");
}

/* Messages name the url's host, or the master: with sentinels the
 * primary's address changes under them. */
static void set_addr(struct redis_store *st, const struct store_redis_opts *o)
{
    if (o->cluster)
        snprintf(st->addr, sizeof st->addr,
                 strchr(o->host, ':') ? "cluster [%s]:%u" : "cluster %s:%u",
                 o->host, o->port);
    else if (o->n_sentinels)
        snprintf(st->addr, sizeof st->addr, "master %.*s", REDIS_HOST_MAX,
                 o->master ? o->master : "");
    else
        snprintf(st->addr, sizeof st->addr,
                 strchr(o->host, ':') ? "[%s]:%u" : "%s:%u", o->host, o->port);
}

static void redis_close(struct store *base)
{
    struct redis_store *st = rs(base);

    if (!st)
        return;
    redis_notify_stop(st); /* it reads the primary and the slot map */
    redis_sentinel_stop(st);
    redis_cluster_stop(st);
    for (unsigned i = 0; i < REDIS_NODES_MAX; i++)
        redis_sync_free(st->node_sync[i]);
    redis_sync_free(st->sync);
    SSL_CTX_free(st->tls);
    free(st->user);
    free(st->password);
    free(st->server_name);
    pthread_mutex_destroy(&st->lock);
    pthread_mutex_destroy(&st->primary_lock);
    free(st);
}

/* strdup of an optional string: 0, or -ENOMEM. */
static int dup_opt(char **dst, const char *src)
{
    *dst = NULL;
    return src && *src && !(*dst = strdup(src)) ? -ENOMEM : 0;
}

/* The TLS context of every connection the store makes (util/tls_client.c,
 * as the upstream client's): made once, here, so a bad file fails the
 * open. 0 or -EINVAL with err. */
static int tls_setup(struct redis_store *st, const struct store_redis_opts *o,
                     struct sc_error *err)
{
    struct tls_client_files f = {o->tls_verify, o->tls_ca_file,
                                 o->tls_cert_file, o->tls_key_file};

    if (!o->tls)
        return 0;
    return (st->tls = tls_client_ctx_new(&f, "store", err)) ? 0 : -EINVAL;
}

/* What every connection is made with: to the primary the handshake (AUTH,
 * SELECT, the scripts); to the sentinels only TLS (they are asked without
 * AUTH). */
static void conn_opts(struct redis_store *st, const struct store_redis_opts *o)
{
    for (int i = 0; i < SCRIPT_COUNT; i++)
        st->scripts[i] = redis_script_body((enum redis_script)i);
    st->conn = (struct redis_conn_opts){
        .tls = st->tls, .verify = o->tls_verify, .server_name = st->server_name,
        .user = st->user, .password = st->password, .db = st->db,
        .preload = st->scripts, .n_preload = SCRIPT_COUNT,
    };
    st->sentinel_conn = (struct redis_conn_opts){
        .tls = st->tls, .verify = o->tls_verify, .server_name = st->server_name,
    };
}

int store_open_redis(const struct store_redis_opts *o, struct store **out,
                     struct sc_error *err)
{
    struct redis_store *st;
    struct sc_error first;
    int rc;

    *out = NULL;
    if ((rc = check_opts(o, err)) != 0)
        return rc;
    if (!(st = calloc(1, sizeof *st)))
        goto nomem;
    st->base.ops = &redis_ops;
    pthread_mutex_init(&st->lock, NULL);
    pthread_mutex_init(&st->primary_lock, NULL);
    snprintf(st->host, sizeof st->host, "%s", o->host);
    st->port = o->port;
    st->db = o->db;
    st->replicas_ack = o->replicas_ack;
    st->timeout_ms = o->timeout_ms ? o->timeout_ms : DEFAULT_TIMEOUT_MS;
    /* The holder id of this process: 128 random bits. */
    snprintf(st->holder, sizeof st->holder, "%016llx%016llx",
             (unsigned long long)store_lease_draw(),
             (unsigned long long)store_lease_draw());
    set_prefix(st, o->prefix);
    set_addr(st, o);
    if (dup_opt(&st->user, o->user) || dup_opt(&st->password, o->password) ||
        dup_opt(&st->server_name, o->tls_server_name) ||
        !(st->sync = redis_sync_new(st->timeout_ms, NULL, NULL))) {
        redis_close(&st->base);
        goto nomem;
    }
    if ((rc = tls_setup(st, o, err)) != 0) {
        redis_close(&st->base);
        return rc;
    }
    conn_opts(st, o);
    if ((rc = redis_sentinel_start(st, o, err)) != 0 ||
        (rc = redis_cluster_start(st, o, err)) != 0) {
        redis_close(&st->base);
        return rc;
    }
    if (st->cluster) {
        *out = &st->base; /* its thread read the map and tells health */
        return 0;
    }
    /* A first connection now, so a healthy Redis is ready at once; its
     * failure is the store's health, not the open's. */
    pthread_mutex_lock(&st->lock);
    rc = connect_blocking(st, &first);
    atomic_store(&st->healthy, rc == 0);
    if (rc)
        set_cause(st, first.text);
    pthread_mutex_unlock(&st->lock);
    *out = &st->base;
    return 0;
nomem:
    sc_error_set(err, "store: out of memory");
    return -ENOMEM;
}

static void redis_cause(struct store *base, char *buf, size_t len)
{
    struct redis_store *st = rs(base);

    if (st->cluster) {
        redis_cluster_healthy(st, buf, len);
        return;
    }
    pthread_mutex_lock(&st->lock);
    if (!atomic_load(&st->healthy))
        snprintf(buf, len, "%s", st->cause);
    pthread_mutex_unlock(&st->lock);
}

static int redis_notify_set_op(struct store *base, const char *const *scopes,
                               size_t n, store_done_fn *done, void *arg,
                               struct sc_error *err)
{
    return redis_notify_set(rs(base), scopes, n, done, arg, err);
}

static bool redis_notified_op(struct store *base, const char *scope)
{
    return redis_notified(rs(base), scope);
}

static uint64_t redis_notices_op(struct store *base)
{
    return redis_notices(rs(base));
}

static const char *redis_holder_id(const struct store *base)
{
    return rs((struct store *)base)->holder;
}

static const struct store_ops redis_ops = {
    .name = "redis",
    .close = redis_close,
    .get = redis_get,
    .acquire = redis_acquire,
    .complete = redis_complete,
    .release = redis_release,
    .forget = redis_forget,
    .sweep = redis_sweep,
    .pause_set = redis_pause_set,
    .pause_get = redis_pause_get,
    .pause_clear = redis_pause_clear,
    .healthy = redis_healthy,
    .cause = redis_cause,
    .count = redis_count,
    .verify = redis_verify,
    .live = redis_live,
    .holder_id = redis_holder_id,
    .notify_set = redis_notify_set_op,
    .notified = redis_notified_op,
    .notices = redis_notices_op,
    .loop_new = redis_loop_new,
    .loop_free = redis_loop_free,
    .start = redis_start,
    .cancel = redis_cancel,
    .shares_buckets = true,
};
