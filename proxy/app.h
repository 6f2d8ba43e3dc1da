/* The process: config, TLS contexts, the listening socket, the worker
 * threads, the admin listener, and the drain sequence of SPEC section 1. */
#ifndef SLUICE_PROXY_APP_H
#define SLUICE_PROXY_APP_H

#include <stdatomic.h>
#include <stdbool.h>

#include <openssl/ssl.h>

#include "policies/config.h"
#include "proxy/claims.h"
#include "proxy/metrics.h"
#include "proxy/pacing.h"
#include "proxy/server.h"
#include "util/error.h"

struct MHD_Daemon;
struct event_base;
struct event;

struct app {
    struct sc_config *cfg;      /* owned; immutable while workers run */
    struct pacing pacing;       /* buckets, cooldowns, slots: shared by all loops */
    struct store *store;        /* idempotency records */
    struct claims claims;       /* keys claimed by requests not yet forwarded */
    struct event *sweep_ev;     /* reclaims expired records, off the loops */
    atomic_long store_errors;
    atomic_long leases_active;  /* durable leases held by requests in flight */
    struct metrics metrics;     /* shard i: loop i; the last: main and admin */
    struct metrics_ids ids;
    SSL_CTX **tls;              /* per upstream; NULL for http */
    atomic_int listen_fd;       /* closed by the last loop to quiesce */
    atomic_uint quiesced;
    struct worker *workers;
    unsigned n_workers;
    struct MHD_Daemon *admin;
    struct event_base *main_base;
    struct event *sig_term, *sig_int, *sig_hup, *drain_tick;
    atomic_bool ready;          /* config loaded, store open, accepting */
    atomic_bool draining;
    atomic_long inflight;       /* requests between arrival and completion */
    atomic_long conns;          /* open worker connections */
    atomic_long conns_refused;  /* closed at once: over max_connections */
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

void app_free(struct app *app);

#endif
