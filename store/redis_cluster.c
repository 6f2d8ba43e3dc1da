/* Redis Cluster (docs/contract.md §10, `store.cluster` and `store.nodes`):
 * the slot map every connection routes by, kept current by one thread of
 * ours so that no event loop ever waits for the slot map.
 *
 * Nodes are a table that only grows (the seeds first, then each primary a
 * map or a redirection names), so a node's index is stable and the loops
 * keep one connection per index; a node that leaves the cluster just owns
 * no slot any more. The map is one atomic 16-bit owner per slot (index + 1;
 * 0: unknown), read without a lock on every command and written by the
 * thread (a whole refresh) and by MOVED (one slot, at once).
 *
 * The thread reads the map (CLUSTER SHARDS, or CLUSTER SLOTS from a node
 * that refuses SHARDS) from the node that answered last, else from each
 * known node in turn, every POLL_MS and at once (at most every
 * REASK_GAP_MS) when a loop lost a primary or was redirected; then it PINGs
 * every primary of the map through connections of its own (AUTH and the
 * scripts included), so the store's health and its cause name the first
 * primary that does not answer. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store/redis_slot.h"
#include "store/store_redis_internal.h"
#include "util/clock.h"

#define POLL_MS 1000
#define REASK_GAP_MS 100

struct cluster_node {
    char host[REDIS_HOST_MAX];
    unsigned port;
};

struct redis_cluster {
    struct redis_store *st;
    pthread_mutex_t lock;        /* guards adding nodes, cause */
    struct cluster_node node[REDIS_NODES_MAX];
    atomic_uint n_nodes;         /* published after the node is written */
    _Atomic uint16_t owner[REDIS_SLOTS]; /* node index + 1; 0: unknown */
    atomic_bool healthy;
    char cause[256];
    unsigned first;              /* the node to ask first */
    struct redis_sync *ask[REDIS_NODES_MAX]; /* the thread's, per node */
    bool slots_only[REDIS_NODES_MAX]; /* the thread's: refused CLUSTER SHARDS */
    pthread_t thread;
    bool running;
    int wake[2];
    atomic_bool stop, reask;
};

/* ---- the node table and the map ---- */

int redis_cluster_node(struct redis_store *st, const char *host, size_t hlen,
                       unsigned port)
{
    struct redis_cluster *cl = st->cluster;
    unsigned n;
    int found = -ENOSPC;

    if (hlen >= REDIS_HOST_MAX)
        return -EINVAL;
    pthread_mutex_lock(&cl->lock);
    n = atomic_load(&cl->n_nodes);
    for (unsigned i = 0; i < n; i++)
        if (cl->node[i].port == port && strlen(cl->node[i].host) == hlen &&
            !memcmp(cl->node[i].host, host, hlen)) {
            found = (int)i;
            break;
        }
    if (found < 0 && n < REDIS_NODES_MAX) {
        memcpy(cl->node[n].host, host, hlen);
        cl->node[n].host[hlen] = '\0';
        cl->node[n].port = port;
        atomic_store(&cl->n_nodes, n + 1);
        found = (int)n;
    }
    pthread_mutex_unlock(&cl->lock);
    return found;
}

void redis_cluster_addr(const struct redis_store *st, int node,
                        char host[REDIS_HOST_MAX], unsigned *port)
{
    /* Written once, before n_nodes counted it: no lock needed. */
    memcpy(host, st->cluster->node[node].host, REDIS_HOST_MAX);
    *port = st->cluster->node[node].port;
}

int redis_cluster_owner(const struct redis_store *st, unsigned slot)
{
    return (int)atomic_load_explicit(&st->cluster->owner[slot % REDIS_SLOTS],
                                     memory_order_relaxed) - 1;
}

void redis_cluster_moved(struct redis_store *st, unsigned slot, int node)
{
    atomic_store_explicit(&st->cluster->owner[slot % REDIS_SLOTS],
                          (uint16_t)(node + 1), memory_order_relaxed);
    redis_cluster_reask(st);
}

void redis_cluster_reask(struct redis_store *st)
{
    struct redis_cluster *cl = st->cluster;

    if (!cl || atomic_exchange(&cl->reask, true))
        return;
    if (write(cl->wake[1], "r", 1) < 0) {
        /* Full pipe: the thread has a wake-up pending anyway. */
    }
}

bool redis_cluster_healthy(struct redis_store *st, char *cause, size_t len)
{
    struct redis_cluster *cl = st->cluster;
    bool ok = atomic_load(&cl->healthy);

    if (!ok && cause) {
        pthread_mutex_lock(&cl->lock);
        snprintf(cause, len, "%s", cl->cause);
        pthread_mutex_unlock(&cl->lock);
    }
    return ok;
}

static void set_health(struct redis_cluster *cl, bool ok, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void set_health(struct redis_cluster *cl, bool ok, const char *fmt, ...)
{
    va_list ap;

    pthread_mutex_lock(&cl->lock);
    va_start(ap, fmt);
    vsnprintf(cl->cause, sizeof cl->cause, fmt, ap);
    va_end(ap);
    pthread_mutex_unlock(&cl->lock);
    atomic_store(&cl->healthy, ok);
}

/* ---- reading the map ---- */

struct fresh {
    struct redis_cluster *cl;
    uint16_t owner[REDIS_SLOTS];
};

static int put_range(void *arg, unsigned lo, unsigned hi, const char *host,
                     size_t hlen, unsigned port)
{
    struct fresh *f = arg;
    int node = redis_cluster_node(f->cl->st, host, hlen, port);

    if (node < 0)
        return node;
    for (unsigned s = lo; s <= hi; s++)
        f->owner[s] = (uint16_t)(node + 1);
    return 0;
}

/* A blocking connection of the thread's to a node, connected. */
static struct redis_sync *node_conn(struct redis_cluster *cl, unsigned i,
                                    struct sc_error *err)
{
    char host[REDIS_HOST_MAX];
    unsigned port;

    if (!cl->ask[i] && !(cl->ask[i] = redis_sync_new(cl->st->timeout_ms, NULL, NULL))) {
        sc_error_set(err, "out of memory");
        return NULL;
    }
    if (redis_sync_open(cl->ask[i]))
        return cl->ask[i];
    redis_cluster_addr(cl->st, (int)i, host, &port);
    return redis_sync_connect(cl->ask[i], host, port, &cl->st->conn, err) == 0
               ? cl->ask[i] : NULL;
}

/* A command to node i: 0 and *out (free it), or a negative code, err. */
static int node_command(struct redis_cluster *cl, unsigned i, int argc,
                        const char **argv, const size_t *len,
                        redisReply **out, struct sc_error *err)
{
    struct redis_sync *s = node_conn(cl, i, err);

    *out = NULL;
    return s ? redis_sync_command(s, argc, argv, len, out, err) : -ENOTCONN;
}

/* The map as node i answers it, into f: CLUSTER SHARDS (Redis 7.0 on, where
 * CLUSTER SLOTS is deprecated), else CLUSTER SLOTS (Redis 6, or a user not
 * allowed SHARDS), which the node is asked from then on. 0 or a negative
 * code, err. */
static int ask_map(struct redis_cluster *cl, unsigned i, struct fresh *f,
                   struct sc_error *err)
{
    const char *shards[] = {"CLUSTER", "SHARDS"}, *slots[] = {"CLUSTER", "SLOTS"};
    size_t shards_len[] = {7, 6}, slots_len[] = {7, 5};
    bool use_shards = !cl->slots_only[i];
    redisReply *r;
    int rc = node_command(cl, i, 2, use_shards ? shards : slots,
                          use_shards ? shards_len : slots_len, &r, err);

    if (rc)
        return rc;
    if (use_shards && redis_shards_unknown(r)) {
        freeReplyObject(r);
        cl->slots_only[i] = true;
        return ask_map(cl, i, f, err);
    }
    memset(f->owner, 0, sizeof f->owner);
    rc = use_shards ? redis_shards_parse(r, cl->node[i].host, cl->st->tls != NULL,
                                         put_range, f, err)
                    : redis_slots_parse(r, cl->node[i].host, put_range, f, err);
    freeReplyObject(r);
    return rc;
}

/* The map from node i, published. 0 or a negative code, err. */
static int read_map(struct redis_cluster *cl, unsigned i, struct fresh *f,
                    struct sc_error *err)
{
    int rc = ask_map(cl, i, f, err);

    if (rc)
        return rc;
    for (unsigned s = 0; s < REDIS_SLOTS; s++)
        atomic_store_explicit(&cl->owner[s], f->owner[s], memory_order_relaxed);
    return 0;
}

/* From the node that answered last, else each in turn. */
static int refresh(struct redis_cluster *cl, struct fresh *f,
                   struct sc_error *err)
{
    unsigned n = atomic_load(&cl->n_nodes);

    for (unsigned k = 0; k < n; k++) {
        unsigned i = (cl->first + k) % n;

        if (read_map(cl, i, f, err) == 0) {
            cl->first = i;
            return 0;
        }
    }
    return -ENOTCONN;
}

/* Every primary of the map answers a PING (through the handshake: TLS,
 * AUTH, the scripts): the store's health, and else its cause. */
static void check_primaries(struct redis_cluster *cl, const struct fresh *f)
{
    const char *argv[] = {"PING"};
    size_t len[] = {4};
    bool owns[REDIS_NODES_MAX] = {false};
    unsigned missing = 0;
    struct sc_error err;
    redisReply *r;

    for (unsigned s = 0; s < REDIS_SLOTS; s++) {
        if (f->owner[s])
            owns[f->owner[s] - 1] = true;
        else
            missing++;
    }
    for (unsigned i = 0; i < REDIS_NODES_MAX; i++) {
        if (!owns[i])
            continue;
        if (node_command(cl, i, 1, argv, len, &r, &err) != 0) {
            set_health(cl, false, "redis cluster node %s:%u: %s",
                       cl->node[i].host, cl->node[i].port, err.text);
            return;
        }
        freeReplyObject(r);
    }
    if (missing)
        set_health(cl, false, "redis cluster: %u slots have no primary", missing);
    else
        set_health(cl, true, "%s", "");
}

static void round_once(struct redis_cluster *cl, struct fresh *f)
{
    struct sc_error err;

    if (refresh(cl, f, &err) != 0)
        set_health(cl, false, "redis cluster: no node answered the slot map "
                   "(last: %s)", err.text);
    else
        check_primaries(cl, f);
}

/* ---- the thread ---- */

static void drain_wake(struct redis_cluster *cl)
{
    char buf[64];

    while (read(cl->wake[0], buf, sizeof buf) > 0)
        ;
}

static void *follow(void *arg)
{
    struct redis_cluster *cl = arg;
    struct fresh *f = malloc(sizeof *f);
    uint64_t asked = clock_mono_ns() / NS_PER_MS;

    if (!f)
        return NULL;
    f->cl = cl;
    while (!atomic_load(&cl->stop)) {
        uint64_t now = clock_mono_ns() / NS_PER_MS, since = now - asked;
        struct pollfd p = {.fd = cl->wake[0], .events = POLLIN};

        if (since >= POLL_MS ||
            (since >= REASK_GAP_MS && atomic_exchange(&cl->reask, false))) {
            round_once(cl, f);
            asked = now;
            continue;
        }
        poll(&p, 1, (int)(atomic_load(&cl->reask) && since < REASK_GAP_MS
                              ? REASK_GAP_MS - since : POLL_MS - since));
        drain_wake(cl);
    }
    free(f);
    return NULL;
}

/* ---- start and stop ---- */

static int add_seeds(struct redis_store *st, const struct store_redis_opts *o,
                     struct sc_error *err)
{
    if (redis_cluster_node(st, o->host, strlen(o->host), o->port) < 0)
        goto bad;
    for (unsigned i = 0; i < o->n_nodes; i++)
        if (redis_cluster_node(st, o->nodes[i].host, strlen(o->nodes[i].host),
                               o->nodes[i].port) < 0)
            goto bad;
    return 0;
bad:
    sc_error_set(err, "store: redis cluster: at most %d nodes, each host under "
                 "%d characters", REDIS_NODES_MAX, REDIS_HOST_MAX);
    return -EINVAL;
}

int redis_cluster_start(struct redis_store *st, const struct store_redis_opts *o,
                        struct sc_error *err)
{
    struct redis_cluster *cl;
    struct fresh *f;
    int rc;

    if (!o->cluster)
        return 0;
    if (!(cl = calloc(1, sizeof *cl))) {
        sc_error_set(err, "store: out of memory");
        return -ENOMEM;
    }
    cl->st = st;
    cl->wake[0] = cl->wake[1] = -1;
    pthread_mutex_init(&cl->lock, NULL);
    st->cluster = cl;
    if ((rc = add_seeds(st, o, err)) != 0)
        return rc;
    if (pipe2(cl->wake, O_NONBLOCK | O_CLOEXEC) != 0) {
        sc_error_set(err, "store: cannot make a pipe: %s", strerror(errno));
        return -errno;
    }
    /* Before any loop connects: a healthy cluster starts routed. */
    if ((f = malloc(sizeof *f))) {
        f->cl = cl;
        round_once(cl, f);
        free(f);
    }
    if ((rc = pthread_create(&cl->thread, NULL, follow, cl)) != 0) {
        sc_error_set(err, "store: cannot start the cluster thread: %s",
                     strerror(rc));
        return -rc;
    }
    cl->running = true;
    return 0;
}

void redis_cluster_stop(struct redis_store *st)
{
    struct redis_cluster *cl = st->cluster;

    if (!cl)
        return;
    if (cl->running) {
        atomic_store(&cl->stop, true);
        if (write(cl->wake[1], "s", 1) < 0) {
            /* Full pipe: it wakes anyway. */
        }
        pthread_join(cl->thread, NULL);
    }
    for (unsigned i = 0; i < REDIS_NODES_MAX; i++)
        redis_sync_free(cl->ask[i]);
    if (cl->wake[0] >= 0)
        close(cl->wake[0]);
    if (cl->wake[1] >= 0)
        close(cl->wake[1]);
    pthread_mutex_destroy(&cl->lock);
    free(cl);
    st->cluster = NULL;
}
