/* The process: config, TLS contexts, the listening socket, the worker
 * threads, the admin listener, and the drain sequence of docs/contract.md §1. */
#ifndef SLUICE_PROXY_APP_H
#define SLUICE_PROXY_APP_H

#include <stdatomic.h>
#include <pthread.h>
#include <stdbool.h>

#include <openssl/ssl.h>

#include "config/config.h"
#include "pacing/claims.h"
#include "obs/metrics.h"
#include "pacing/pacing.h"
#include "proxy/runtime.h"
#include "proxy/server/server.h"
#include "util/error.h"

struct MHD_Daemon;
struct event_base;
struct event;

/* What a reload cannot change: it is bound or sized at start. */
struct app_fixed {
    char *file;                 /* the config file, reread on reload */
    struct sc_addr listen, admin;
    uint32_t threads;
    uint64_t max_header;        /* sizes the per-connection memory pool */
    uint32_t max_connections;
    char *store_path;
    bool store_sync;
    uint64_t store_timeout_ms;  /* one store round trip; 0: no limit */
    enum sc_backend backend;
    char *store_url;            /* redis */
    char *store_prefix;         /* redis: key_prefix */
    struct sc_addr_list sentinels; /* redis: hosts owned */
    char *store_master;         /* redis: with sentinels */
    bool cluster;               /* redis: Redis Cluster */
    struct sc_addr_list nodes;  /* redis cluster: seed nodes, hosts owned */
    struct sc_tls store_tls;    /* rediss: its strings owned */
    uint32_t replicas_ack;      /* redis */
    uint32_t fleet_size;        /* sizes the shared policies' fallback */
    char *statsd;               /* "" = off */
};

struct app {
    struct app_fixed fixed;
    pthread_mutex_t rt_mu;      /* guards the rt pointer swap */
    struct runtime *rt;         /* current config at work; see runtime.h */
    pthread_mutex_t reload_mu;  /* one reload at a time (SIGHUP, /reload) */
    atomic_bool loops_stopped;  /* runtimes are then freed in place */
    struct store *store;        /* idempotency records */
    struct claims claims;       /* keys claimed by requests not yet forwarded */
    struct event *sweep_ev;     /* reclaims expired records, off the loops */
    atomic_long leases_active;  /* durable leases held by requests in flight */
    struct metrics metrics;     /* shard i: loop i; the last: main and admin */
    atomic_int listen_fd;       /* closed by the last loop to quiesce */
    atomic_uint quiesced;
    struct loop *loops;         /* the event loops, n_loops of them */
    unsigned n_loops;
    struct MHD_Daemon *admin;
    struct event_base *main_base;
    struct event *sig_term, *sig_int, *sig_hup, *drain_tick;
    struct event *watchdog;     /* systemd WATCHDOG=1 pings; NULL when off */
    struct event *live_tick;    /* fleet: liveness keys (holder_live.h) */
    atomic_bool ready;          /* config loaded, store open, accepting */
    atomic_bool last_reload_ok; /* the last load (start, reload) succeeded */
    _Atomic uint64_t last_reload_ok_ms; /* wall time of the last that did */
    atomic_bool draining;
    atomic_long inflight;       /* requests between arrival and completion */
    atomic_long conns;          /* open worker connections */
    long fd_limit;              /* RLIMIT_NOFILE in force (server_fd_limit) */
    uint64_t drain_deadline_ns;
    bool aborted;               /* the drain deadline passed */
    uint64_t abort_ns;
};

/* Builds the process from a loaded config (takes ownership of cfg): binds
 * the listeners and starts the threads. 0 or negative + err. */
int app_start(struct app *app, struct sc_config *cfg, struct sc_error *err);

/* Runs the main loop (signals, drain) until the process should exit. */
int app_run(struct app *app);

/* Begins the drain: stop accepting, let in-flight finish. Thread-safe. */
void app_begin_drain(struct app *app);

/* Rereads the config file and swaps it in (SIGHUP, POST /reload). On
 * success returns 0 and a one-line summary in msg; otherwise a negative code
 * and every error, one per line, in msg (owned, free()). An invalid file, or
 * one that changes what only a restart can change, changes nothing. */
int app_reload(struct app *app, char **msg);

/* The first request loop that has not turned for LOOP_STALL_MS (its index,
 * and in *ms how long since it last did), or -1 when every loop turns: what
 * /healthz and the systemd watchdog answer on. Thread-safe. */
long app_stalled_loop(struct app *app, uint64_t *ms);

void app_free(struct app *app);

#endif
