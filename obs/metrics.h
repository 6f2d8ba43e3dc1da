/* Metrics (docs/contract.md §8). Every series is a slot id in a registry shared
 * by the process; each event-loop thread owns a shard of counters indexed by
 * slot id and adds to it without a lock shared with other threads (relaxed
 * atomics on its own cache lines). A scrape sums the shards. Slots are keyed
 * by metric name and label values, so a reload that keeps a route or policy
 * name keeps its series: counters never reset on reload. Labels come only
 * from config names and fixed sets, never from requests. */
#ifndef SLUICE_OBS_METRICS_H
#define SLUICE_OBS_METRICS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"
#include "policies/problem.h"
#include "policies/verify.h"

#define METRICS_MAX_SHARDS 257   /* loops + one for the main/admin threads */
#define METRICS_CHUNK 4096       /* slots per chunk; chunks never move */
#define METRICS_MAX_CHUNKS 256

enum hist_kind {
    H_DURATION = 0,   /* request and upstream durations: 1 ms .. 60 s */
    H_PERMIT_WAIT,    /* 1 ms .. 5 min */
    H_QUEUE_AGE,      /* 1 s .. 7 d */
    H_REQUEUE_DELAY,  /* 1 s .. 7 d */
    H_STORE,          /* a store call: 50 µs .. 5 s */
    H_CONNECT,        /* an upstream connect or TLS handshake: 0.5 ms .. 10 s */
    H__COUNT
};

/* The store calls a request waits for, as sluice_store_duration_seconds'
 * op label. */
enum store_timed_op {
    ST_GET = 0, ST_ACQUIRE, ST_COMPLETE, ST_RELEASE, ST_PERMIT, ST_SLOT,
    ST_PERMIT_LEASE, ST_FLIGHT_END, ST__COUNT
};
/* Its label value: get, acquire, complete, release, permit, slot,
 * permit_lease, flight_end. */
const char *store_op_name(enum store_timed_op op);


/* Upstream response classes of sluice_upstream_responses_total. */
enum up_code {
    UC_2XX = 0, UC_3XX, UC_4XX, UC_429, UC_5XX, UC_CONNECT_ERROR,
    UC_CONNECTION_LOST, UC_TIMEOUT, UC__COUNT
};

/* Where setting up an upstream connection failed, as
 * sluice_upstream_connect_failures_total's phase label: the TCP connect (or
 * the name lookup) to the partner or its egress proxy, the proxy's CONNECT
 * tunnel, the TLS handshake with the partner. */
enum up_phase { UPH_CONNECT = 0, UPH_PROXY, UPH_TLS, UPH__COUNT };

struct metrics_shard {
    _Atomic uint64_t *chunks[METRICS_MAX_CHUNKS];
};

struct series;

struct metrics {
    pthread_mutex_t mu;             /* registry changes and scrapes */
    struct series *series;          /* registry, in slot order */
    size_t n_series, cap_series;
    size_t n_slots;                 /* slots handed out */
    size_t n_chunks;                /* chunks allocated in every shard */
    struct metrics_shard shards[METRICS_MAX_SHARDS];
    unsigned n_shards;
};

/* Slot ids for one config: resolved once at load or reload. */
struct metrics_ids {
    size_t n_routes, n_policies, n_upstreams;
    uint32_t *requests;       /* [(route+1) * OUT__COUNT * R__COUNT], route n = none */
    uint32_t *shadow;         /* [route+1]: shadow rate_limited */
    uint32_t *up_codes;       /* [upstream * UC__COUNT] */
    uint32_t *req_duration;   /* [(route+1) * OUT__COUNT] histogram base */
    uint32_t *queue_age;      /* [route+1] */
    uint32_t *queue_age_bad;  /* [route+1] counter */
    uint32_t *permit_wait;    /* [permit_wait_at[policy] + lane] */
    size_t *permit_wait_at;   /* [policy+1], policy n = default: its first
                                 lane's (a policy without lanes has one,
                                 lane="") */
    uint32_t *up_duration;    /* [upstream] */
    uint32_t *up_open, *up_idle; /* [upstream] gauges: pool connections */
    uint32_t *up_connect, *up_tls; /* [upstream] histogram bases */
    uint32_t *up_connect_fail; /* [upstream * UPH__COUNT] */
    uint32_t *requeue_delay;  /* [(policy+1) * R__COUNT] */
    uint32_t *verifications;  /* [policy * 3]: found, absent, failed; see
                                 metrics_verification_slot */
    uint32_t reloads_ok, reloads_error, store_errors, commit_failures, conns_refused;
    uint32_t accept_paused;
    uint32_t replication_timeouts;
    uint32_t store_duration[ST__COUNT]; /* histogram bases, by op */
};

int metrics_init(struct metrics *m, unsigned n_shards);
void metrics_free(struct metrics *m);

/* Registers (or finds) every series the config can produce. */
int metrics_ids_build(struct metrics *m, const struct sc_config *cfg,
                      struct metrics_ids *ids);
void metrics_ids_free(struct metrics_ids *ids);

/* The sluice_verifications_total{policy, result} series of a verification of
 * cfg->policies[policy] that ended with result (VERIFY_FOUND, _ABSENT or
 * _FAILED); UINT32_MAX for any other state or policy (nothing to count: a
 * verification dropped with its lease is not counted). */
uint32_t metrics_verification_slot(const struct metrics_ids *ids, size_t policy,
                                   enum verify_state result);

/* Hot path: add to a counter / observe a histogram in the caller's shard. */
static inline void metrics_add(struct metrics_shard *s, uint32_t slot, uint64_t v)
{
    atomic_fetch_add_explicit(&s->chunks[slot / METRICS_CHUNK][slot % METRICS_CHUNK],
                              v, memory_order_relaxed);
}
/* A gauge slot moves both ways: its shards sum, modulo 2^64, to the signed
 * value (one shard's share may be negative). */
static inline void metrics_gauge_add(struct metrics_shard *s, uint32_t slot, int64_t d)
{
    metrics_add(s, slot, (uint64_t)d);
}
void metrics_observe(struct metrics_shard *s, enum hist_kind k, uint32_t base,
                     double value);

/* Prometheus text exposition 0.0.4 of every series (owned, free()), with
 * the gauges the caller appends through `extra` (may be NULL). */
char *metrics_render(struct metrics *m, const char *extra);

/* Sum of one slot over all shards. */
uint64_t metrics_sum(struct metrics *m, uint32_t slot);

/* For StatsD: calls fn(arg, name, labels, delta) for every counter of one
 * shard that grew since the last call; *last (grown as needed, owned by the
 * caller) remembers what was reported. Run by the shard's own thread.
 * Without `wait` it reports nothing and returns -EBUSY while another thread
 * holds the registry (a scrape, a registration, another loop's flush), so a
 * loop never waits; -ENOMEM when *last cannot grow; else 0. */
typedef void (*metrics_delta_fn)(void *arg, const char *name,
                                 const char *labels, uint64_t delta);
int metrics_counter_deltas(struct metrics *m, unsigned shard, bool wait, uint64_t **last,
                           size_t *n_last, metrics_delta_fn fn, void *arg);

#endif
