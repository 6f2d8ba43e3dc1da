#define _GNU_SOURCE
#include "obs/metrics.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* ---- bucket bounds (seconds) -------------------------------------------- */

static const double b_duration[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                    0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
static const double b_permit[] = {0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2,
                                  5, 10, 30, 60, 120, 300};
static const double b_store[] = {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025,
                                 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5};
static const double b_connect[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                   0.1, 0.25, 0.5, 1, 2.5, 5, 10};
static const double b_days[] = {1, 5, 10, 30, 60, 300, 900, 1800, 3600, 21600,
                                86400, 259200, 604800};

static const struct {
    const double *b;
    size_t n;
} bounds[H__COUNT] = {
    [H_DURATION] = {b_duration, sizeof b_duration / sizeof *b_duration},
    [H_PERMIT_WAIT] = {b_permit, sizeof b_permit / sizeof *b_permit},
    [H_QUEUE_AGE] = {b_days, sizeof b_days / sizeof *b_days},
    [H_REQUEUE_DELAY] = {b_days, sizeof b_days / sizeof *b_days},
    [H_STORE] = {b_store, sizeof b_store / sizeof *b_store},
    [H_CONNECT] = {b_connect, sizeof b_connect / sizeof *b_connect},
};

static const char *const store_op_names[ST__COUNT] = {
    [ST_GET] = "get", [ST_ACQUIRE] = "acquire", [ST_COMPLETE] = "complete",
    [ST_RELEASE] = "release", [ST_PERMIT] = "permit", [ST_SLOT] = "slot",
    [ST_PERMIT_LEASE] = "permit_lease", [ST_FLIGHT_END] = "flight_end",
};

const char *store_op_name(enum store_timed_op op)
{
    return op < ST__COUNT ? store_op_names[op] : "?";
}

/* A histogram takes n buckets + the +Inf bucket + count + sum (in µs, so it
 * stays an integer an atomic can add). */
static size_t hist_slots(enum hist_kind k)
{
    return bounds[k].n + 3;
}

/* ---- the registry ------------------------------------------------------- */

enum series_type { S_COUNTER = 0, S_HIST, S_GAUGE };

struct series {
    const char *name;       /* static */
    char *labels;           /* rendered label set, owned: route="sync",... */
    enum series_type type;
    enum hist_kind hk;
    uint32_t slot;
    bool zero;              /* counter listed at zero (see render_family) */
};

struct family {
    const char *name, *type, *help;
};

static const struct family families[] = {
    {"sluice_requests_total", "counter", "Requests answered, by route, Sluice-Outcome and reason."},
    {"sluice_upstream_responses_total", "counter", "Upstream answers and transport failures, by class."},
    {"sluice_request_duration_seconds", "histogram", "Time from request arrival to answer."},
    {"sluice_permit_wait_seconds", "histogram", "Time spent waiting for a permit and a concurrency slot."},
    {"sluice_upstream_duration_seconds", "histogram", "Time from sending upstream to the whole response."},
    {"sluice_queue_age_seconds", "histogram", "Age of the job from Sluice-Enqueued-At to its arrival at sluice."},
    {"sluice_queue_age_invalid_total", "counter", "Requests whose Sluice-Enqueued-At was malformed (ignored)."},
    {"sluice_requeue_delay_seconds", "histogram", "Delays handed to workers in requeue instructions."},
    {"sluice_verifications_total", "counter", "Verifications of unknown outcomes by a lookup, by policy and how they ended (found, absent, failed)."},
    {"sluice_config_reloads_total", "counter", "Config reloads, by result."},
    {"sluice_store_errors_total", "counter", "Idempotency store operations that failed."},
    {"sluice_store_commit_failures_total", "counter", "Completed results that could not be stored after the upstream answered (the worker still got the answer)."},
    {"sluice_store_replication_timeouts_total", "counter", "Completions stored on the Redis primary that fewer than store.replicas_ack replicas confirmed within store.timeout (answered anyway)."},
    {"sluice_store_duration_seconds", "histogram", "Store calls a request waited for, from start to completion (RocksDB: at once; Redis: a round trip), by operation."},
    {"sluice_connections_refused_total", "counter", "Worker connections closed at once over limits.max_connections, or when fewer than 16 file descriptors were left below RLIMIT_NOFILE."},
    {"sluice_accept_paused_total", "counter", "Times a loop found no file descriptor for a worker connection (EMFILE, ENFILE, or only one of the last 16) and stopped accepting for 100 ms."},
    {"sluice_upstream_connections_open", "gauge", "Connections to the upstream open now (pooled, in use or being set up), all loops."},
    {"sluice_upstream_connections_idle", "gauge", "Of those, kept alive idle in the pool for the next request."},
    {"sluice_upstream_connect_duration_seconds", "histogram", "Time to a TCP connection to the upstream (or its egress proxy), name lookup included."},
    {"sluice_upstream_tls_handshake_duration_seconds", "histogram", "Time of the TLS handshake with the upstream."},
    {"sluice_upstream_connect_failures_total", "counter", "Upstream connections that failed before a request could be sent, by phase: connect, proxy (the egress proxy's CONNECT), tls."},
};

static const char *const up_phase_names[UPH__COUNT] = {
    [UPH_CONNECT] = "connect", [UPH_PROXY] = "proxy", [UPH_TLS] = "tls",
};

int metrics_init(struct metrics *m, unsigned n_shards)
{
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    m->n_shards = n_shards > METRICS_MAX_SHARDS ? METRICS_MAX_SHARDS : n_shards;
    return 0;
}

void metrics_free(struct metrics *m)
{
    for (size_t i = 0; i < m->n_series; i++)
        free(m->series[i].labels);
    free(m->series);
    for (unsigned s = 0; s < m->n_shards; s++)
        for (size_t c = 0; c < m->n_chunks; c++)
            free((void *)m->shards[s].chunks[c]);
    pthread_mutex_destroy(&m->mu);
    memset(m, 0, sizeof *m);
}

/* Makes sure every shard has room for `slots` slots. Chunks are added, never
 * moved, so a thread writing an older slot is never disturbed. */
static int ensure_slots(struct metrics *m, size_t slots)
{
    while (m->n_chunks * METRICS_CHUNK < slots) {
        if (m->n_chunks == METRICS_MAX_CHUNKS)
            return -ENOSPC;
        for (unsigned s = 0; s < m->n_shards; s++) {
            void *c = calloc(METRICS_CHUNK, sizeof(_Atomic uint64_t));
            if (!c)
                return -ENOMEM;
            m->shards[s].chunks[m->n_chunks] = c;
        }
        m->n_chunks++;
    }
    return 0;
}

static long find(struct metrics *m, const char *name, const char *labels)
{
    for (size_t i = 0; i < m->n_series; i++)
        if (strcmp(m->series[i].name, name) == 0 &&
            strcmp(m->series[i].labels, labels) == 0)
            return (long)m->series[i].slot;
    return -1;
}

/* The slot of (name, labels), registering it when new; -ENOMEM when it
 * cannot grow. */
static long slot_of(struct metrics *m, const char *name, const char *labels,
                    enum series_type t, enum hist_kind hk, bool zero)
{
    long slot = find(m, name, labels);
    size_t need = t == S_HIST ? hist_slots(hk) : 1;
    struct series *s;

    if (slot >= 0) {
        /* Once listed at zero, always: a series never vanishes. */
        for (size_t i = 0; zero && i < m->n_series; i++)
            if (m->series[i].slot == (uint32_t)slot)
                m->series[i].zero = true;
        return slot;
    }
    if (m->n_series == m->cap_series) {
        size_t cap = m->cap_series ? m->cap_series * 2 : 256;
        struct series *n = realloc(m->series, cap * sizeof *n);
        if (!n)
            return -ENOMEM;
        m->series = n;
        m->cap_series = cap;
    }
    if (ensure_slots(m, m->n_slots + need) != 0)
        return -ENOMEM;
    s = &m->series[m->n_series];
    s->labels = strdup(labels);
    if (!s->labels)
        return -ENOMEM;
    s->name = name;
    s->type = t;
    s->hk = hk;
    s->zero = zero;
    s->slot = (uint32_t)m->n_slots;
    m->n_slots += need;
    m->n_series++;
    return s->slot;
}

/* ---- ids for a config --------------------------------------------------- */

static const char *up_code_names[UC__COUNT] = {
    "2xx", "3xx", "4xx", "429", "5xx", "connect_error", "connection_lost", "timeout",
};

struct build {
    struct metrics *m;
    const struct sc_config *cfg;
    struct metrics_ids *ids;
    char *labels;       /* the label set being registered (owned) */
    bool zero;          /* counters registered next are listed at zero */
    int rc;
};

/* Sets the label set of the series registered next. */
static void setl(struct build *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void setl(struct build *b, const char *fmt, ...)
{
    va_list ap;

    free(b->labels);
    va_start(ap, fmt);
    if (vasprintf(&b->labels, fmt, ap) < 0)
        b->labels = NULL;
    va_end(ap);
}

/* A label value as the text format wants it: backslash, double quote and
 * line feed escaped (route names are free text, and default to the prefix,
 * which may hold both). Owned; NULL when out of memory. */
static char *label_value(const char *s)
{
    char *out = malloc(2 * strlen(s) + 1), *o = out;

    if (!out)
        return NULL;
    for (; *s; s++) {
        if (*s == '\\' || *s == '"' || *s == '\n')
            *o++ = '\\';
        *o++ = *s == '\n' ? 'n' : *s;
    }
    *o = '\0';
    return out;
}

static uint32_t reg(struct build *b, const char *name, enum series_type t,
                    enum hist_kind hk)
{
    long s = b->labels ? slot_of(b->m, name, b->labels, t, hk, b->zero) : -1;

    if (s < 0) {
        b->rc = -ENOMEM;
        return 0;
    }
    return (uint32_t)s;
}

static const char *route_label(const struct sc_config *cfg, size_t r)
{
    return r < cfg->n_routes ? cfg->routes[r].name : "none";
}

static const char *policy_label(const struct sc_config *cfg, size_t p)
{
    return p < cfg->n_policies ? cfg->policies[p].name : "default";
}

/* Listed at zero: the pairs a route can be counted with. Requests that
 * matched no route (route="none") can only have been rejected, and only
 * those can be rejected for no_route. */
static bool request_pair_listed(bool no_route, int o, int rs)
{
    if (!outcome_reason_known(o, rs))
        return false;
    return no_route ? o == OUT_REJECTED : rs != R_NO_ROUTE;
}

/* The shadow series only moves for a policy in mode: shadow. */
static bool route_is_shadow(const struct sc_config *cfg, size_t r)
{
    long p = r < cfg->n_routes ? cfg->routes[r].policy : -1;

    return p >= 0 && cfg->policies[p].mode == SC_MODE_SHADOW;
}

static void build_routes(struct build *b)
{
    const struct sc_config *cfg = b->cfg;

    for (size_t r = 0; r <= cfg->n_routes && b->rc == 0; r++) {
        char *rl = label_value(route_label(cfg, r));

        if (!rl) {
            b->rc = -ENOMEM;
            break;
        }

        for (int o = 0; o < OUT__COUNT; o++)
            for (int rs = 0; rs < R__COUNT; rs++) {
                setl(b, "route=\"%s\",outcome=\"%s\",reason=\"%s\"", rl,
                     outcome_name(o), reason_name(rs));
                b->zero = request_pair_listed(r == cfg->n_routes, o, rs);
                b->ids->requests[(r * OUT__COUNT + o) * R__COUNT + rs] =
                    reg(b, "sluice_requests_total", S_COUNTER, 0);
            }
        setl(b, "route=\"%s\",outcome=\"requeue\",reason=\"rate_limited\",shadow=\"true\"", rl);
        b->zero = route_is_shadow(cfg, r);
        b->ids->shadow[r] = reg(b, "sluice_requests_total", S_COUNTER, 0);
        for (int o = 0; o < OUT__COUNT; o++) {
            setl(b, "route=\"%s\",outcome=\"%s\"", rl, outcome_name(o));
            b->ids->req_duration[r * OUT__COUNT + o] =
                reg(b, "sluice_request_duration_seconds", S_HIST, H_DURATION);
        }
        b->zero = r < cfg->n_routes;   /* route="none" carries no queue age */
        setl(b, "route=\"%s\"", rl);
        b->ids->queue_age[r] = reg(b, "sluice_queue_age_seconds", S_HIST, H_QUEUE_AGE);
        b->ids->queue_age_bad[r] = reg(b, "sluice_queue_age_invalid_total", S_COUNTER, 0);
        free(rl);
    }
}

static void build_policies(struct build *b)
{
    const struct sc_config *cfg = b->cfg;

    for (size_t p = 0; p <= cfg->n_policies; p++) {
        const char *pl = policy_label(cfg, p);

        size_t nl = p < cfg->n_policies ? cfg->policies[p].n_lanes : 0;

        for (size_t l = 0; l < (nl ? nl : 1); l++) {
            setl(b, "policy=\"%s\",lane=\"%s\"", pl,
                 nl ? cfg->policies[p].lanes[l].name : "");
            b->ids->permit_wait[b->ids->permit_wait_at[p] + l] =
                reg(b, "sluice_permit_wait_seconds", S_HIST, H_PERMIT_WAIT);
        }
        for (int rs = 0; rs < R__COUNT; rs++) {
            setl(b, "policy=\"%s\",reason=\"%s\"", pl, reason_name(rs));
            b->ids->requeue_delay[p * R__COUNT + rs] =
                reg(b, "sluice_requeue_delay_seconds", S_HIST, H_REQUEUE_DELAY);
        }
    }
}

/* The results a verification ends with, in the order of the ids. */
static const enum verify_state verify_results[] = {
    VERIFY_FOUND, VERIFY_ABSENT, VERIFY_FAILED};
#define N_VERIFY_RESULTS (sizeof verify_results / sizeof *verify_results)

/* Listed at zero only for policies that verify: the others never count. */
static void build_verifications(struct build *b)
{
    const struct sc_config *cfg = b->cfg;

    for (size_t p = 0; p < cfg->n_policies; p++) {
        b->zero = cfg->policies[p].idem.enabled &&
                  cfg->policies[p].idem.verify.enabled;
        for (size_t r = 0; r < N_VERIFY_RESULTS; r++) {
            setl(b, "policy=\"%s\",result=\"%s\"", policy_label(cfg, p),
                 verify_state_name(verify_results[r]));
            b->ids->verifications[p * N_VERIFY_RESULTS + r] =
                reg(b, "sluice_verifications_total", S_COUNTER, 0);
        }
    }
}

uint32_t metrics_verification_slot(const struct metrics_ids *ids, size_t policy,
                                   enum verify_state result)
{
    for (size_t r = 0; policy < ids->n_policies && r < N_VERIFY_RESULTS; r++)
        if (verify_results[r] == result)
            return ids->verifications[policy * N_VERIFY_RESULTS + r];
    return UINT32_MAX;
}

static void build_upstreams(struct build *b)
{
    const struct sc_config *cfg = b->cfg;

    b->zero = true;   /* every class can happen to every upstream */
    for (size_t u = 0; u < cfg->n_upstreams; u++) {
        for (int c = 0; c < UC__COUNT; c++) {
            setl(b, "upstream=\"%s\",code=\"%s\"", cfg->upstreams[u].name,
                 up_code_names[c]);
            b->ids->up_codes[u * UC__COUNT + c] =
                reg(b, "sluice_upstream_responses_total", S_COUNTER, 0);
        }
        setl(b, "upstream=\"%s\"", cfg->upstreams[u].name);
        b->ids->up_duration[u] = reg(b, "sluice_upstream_duration_seconds", S_HIST, H_DURATION);
        b->ids->up_open[u] = reg(b, "sluice_upstream_connections_open", S_GAUGE, 0);
        b->ids->up_idle[u] = reg(b, "sluice_upstream_connections_idle", S_GAUGE, 0);
        b->ids->up_connect[u] =
            reg(b, "sluice_upstream_connect_duration_seconds", S_HIST, H_CONNECT);
        b->ids->up_tls[u] =
            reg(b, "sluice_upstream_tls_handshake_duration_seconds", S_HIST, H_CONNECT);
        for (int ph = 0; ph < UPH__COUNT; ph++) {
            setl(b, "upstream=\"%s\",phase=\"%s\"", cfg->upstreams[u].name,
                 up_phase_names[ph]);
            b->ids->up_connect_fail[u * UPH__COUNT + ph] =
                reg(b, "sluice_upstream_connect_failures_total", S_COUNTER, 0);
        }
    }
}

static void build_process(struct build *b)
{
    b->zero = true;
    setl(b, "result=\"ok\"");
    b->ids->reloads_ok = reg(b, "sluice_config_reloads_total", S_COUNTER, 0);
    setl(b, "result=\"error\"");
    b->ids->reloads_error = reg(b, "sluice_config_reloads_total", S_COUNTER, 0);
    setl(b, "%s", "");
    b->ids->store_errors = reg(b, "sluice_store_errors_total", S_COUNTER, 0);
    b->ids->commit_failures = reg(b, "sluice_store_commit_failures_total", S_COUNTER, 0);
    b->ids->replication_timeouts =
        reg(b, "sluice_store_replication_timeouts_total", S_COUNTER, 0);
    b->ids->conns_refused = reg(b, "sluice_connections_refused_total", S_COUNTER, 0);
    b->ids->accept_paused = reg(b, "sluice_accept_paused_total", S_COUNTER, 0);
    for (int op = 0; op < ST__COUNT; op++) {
        setl(b, "op=\"%s\"", store_op_names[op]);
        b->ids->store_duration[op] =
            reg(b, "sluice_store_duration_seconds", S_HIST, H_STORE);
    }
}

static int ids_alloc(struct metrics_ids *ids, const struct sc_config *cfg)
{
    size_t r = cfg->n_routes + 1, p = cfg->n_policies + 1, u = cfg->n_upstreams;
    size_t lanes = 0;

    memset(ids, 0, sizeof *ids);
    ids->n_routes = cfg->n_routes;
    ids->n_policies = cfg->n_policies;
    ids->n_upstreams = u;
    ids->requests = calloc(r * OUT__COUNT * R__COUNT, sizeof(uint32_t));
    ids->shadow = calloc(r, sizeof(uint32_t));
    ids->req_duration = calloc(r * OUT__COUNT, sizeof(uint32_t));
    ids->queue_age = calloc(r, sizeof(uint32_t));
    ids->queue_age_bad = calloc(r, sizeof(uint32_t));
    ids->permit_wait_at = calloc(p, sizeof(size_t));
    for (size_t i = 0; ids->permit_wait_at && i < p; i++) {
        size_t nl = i < cfg->n_policies ? cfg->policies[i].n_lanes : 0;

        ids->permit_wait_at[i] = lanes;
        lanes += nl ? nl : 1;
    }
    ids->permit_wait = calloc(lanes ? lanes : 1, sizeof(uint32_t));
    ids->requeue_delay = calloc(p * R__COUNT, sizeof(uint32_t));
    ids->verifications = calloc(p * N_VERIFY_RESULTS, sizeof(uint32_t));
    ids->up_codes = calloc(u * UC__COUNT + 1, sizeof(uint32_t));
    ids->up_duration = calloc(u + 1, sizeof(uint32_t));
    ids->up_open = calloc(u + 1, sizeof(uint32_t));
    ids->up_idle = calloc(u + 1, sizeof(uint32_t));
    ids->up_connect = calloc(u + 1, sizeof(uint32_t));
    ids->up_tls = calloc(u + 1, sizeof(uint32_t));
    ids->up_connect_fail = calloc(u * UPH__COUNT + 1, sizeof(uint32_t));
    return ids->requests && ids->shadow && ids->req_duration && ids->queue_age &&
                   ids->queue_age_bad && ids->permit_wait && ids->permit_wait_at &&
                   ids->requeue_delay &&
                   ids->verifications && ids->up_codes && ids->up_duration && ids->up_open &&
                   ids->up_idle && ids->up_connect && ids->up_tls && ids->up_connect_fail
               ? 0 : -ENOMEM;
}

void metrics_ids_free(struct metrics_ids *ids)
{
    free(ids->requests);
    free(ids->shadow);
    free(ids->req_duration);
    free(ids->queue_age);
    free(ids->queue_age_bad);
    free(ids->permit_wait);
    free(ids->permit_wait_at);
    free(ids->requeue_delay);
    free(ids->verifications);
    free(ids->up_codes);
    free(ids->up_duration);
    free(ids->up_open);
    free(ids->up_idle);
    free(ids->up_connect);
    free(ids->up_tls);
    free(ids->up_connect_fail);
    memset(ids, 0, sizeof *ids);
}

int metrics_ids_build(struct metrics *m, const struct sc_config *cfg,
                      struct metrics_ids *ids)
{
    struct build b = {.m = m, .cfg = cfg, .ids = ids};

    if (ids_alloc(ids, cfg) != 0) {
        metrics_ids_free(ids);
        return -ENOMEM;
    }
    pthread_mutex_lock(&m->mu);
    build_routes(&b);
    build_policies(&b);
    build_verifications(&b);
    build_upstreams(&b);
    build_process(&b);
    pthread_mutex_unlock(&m->mu);
    free(b.labels);
    if (b.rc != 0)
        metrics_ids_free(ids);
    return b.rc;
}

/* ---- recording ---------------------------------------------------------- */

void metrics_observe(struct metrics_shard *s, enum hist_kind k, uint32_t base,
                     double value)
{
    size_t i = 0, n = bounds[k].n;

    /* The first bucket whose bound holds the value; +Inf is index n. */
    while (i < n && value > bounds[k].b[i])
        i++;
    metrics_add(s, base + (uint32_t)i, 1);
    metrics_add(s, base + (uint32_t)n + 1, 1);
    metrics_add(s, base + (uint32_t)n + 2,
                value > 0 ? (uint64_t)(value * 1e6 + 0.5) : 0);
}

/* ---- StatsD deltas ------------------------------------------------------- */

int metrics_counter_deltas(struct metrics *m, unsigned shard, bool wait, uint64_t **last,
                           size_t *n_last, metrics_delta_fn fn, void *arg)
{
    struct metrics_shard *sh = &m->shards[shard];

    if (wait)
        pthread_mutex_lock(&m->mu);
    else if (pthread_mutex_trylock(&m->mu) != 0)
        return -EBUSY;
    if (*n_last < m->n_slots) {
        uint64_t *n = realloc(*last, m->n_slots * sizeof *n);
        if (!n) {
            pthread_mutex_unlock(&m->mu);
            return -ENOMEM;
        }
        memset(n + *n_last, 0, (m->n_slots - *n_last) * sizeof *n);
        *last = n;
        *n_last = m->n_slots;
    }
    for (size_t i = 0; i < m->n_series; i++) {
        const struct series *s = &m->series[i];
        uint64_t v;

        if (s->type != S_COUNTER)
            continue;
        v = atomic_load_explicit(&sh->chunks[s->slot / METRICS_CHUNK][s->slot % METRICS_CHUNK],
                                 memory_order_relaxed);
        if (v > (*last)[s->slot]) {
            fn(arg, s->name, s->labels, v - (*last)[s->slot]);
            (*last)[s->slot] = v;
        }
    }
    pthread_mutex_unlock(&m->mu);
    return 0;
}

/* ---- rendering ---------------------------------------------------------- */

uint64_t metrics_sum(struct metrics *m, uint32_t slot)
{
    uint64_t sum = 0;

    for (unsigned s = 0; s < m->n_shards; s++)
        sum += atomic_load_explicit(&m->shards[s].chunks[slot / METRICS_CHUNK][slot % METRICS_CHUNK],
                                    memory_order_relaxed);
    return sum;
}

static void render_hist(FILE *f, struct metrics *m, const struct series *s)
{
    size_t n = bounds[s->hk].n;
    uint64_t cum = 0, count = metrics_sum(m, s->slot + (uint32_t)n + 1);
    const char *sep = s->labels[0] ? "," : "";

    if (count == 0)
        return;
    for (size_t i = 0; i <= n; i++) {
        cum += metrics_sum(m, s->slot + (uint32_t)i);
        if (i < n)
            fprintf(f, "%s_bucket{%s%sle=\"%g\"} %llu\n", s->name, s->labels, sep,
                    bounds[s->hk].b[i], (unsigned long long)cum);
        else
            fprintf(f, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", s->name, s->labels, sep,
                    (unsigned long long)cum);
    }
    fprintf(f, "%s_sum{%s} %.6f\n", s->name, s->labels,
            (double)metrics_sum(m, s->slot + (uint32_t)n + 2) / 1e6);
    fprintf(f, "%s_count{%s} %llu\n", s->name, s->labels, (unsigned long long)count);
}

static void render_family(FILE *f, struct metrics *m, const struct family *fam)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", fam->name, fam->help, fam->name,
            fam->type);
    for (size_t i = 0; i < m->n_series; i++) {
        const struct series *s = &m->series[i];
        uint64_t v;

        if (strcmp(s->name, fam->name) != 0)
            continue;
        if (s->type == S_HIST) {
            render_hist(f, m, s);
            continue;
        }
        if (s->type == S_GAUGE) {
            fprintf(f, "%s{%s} %lld\n", s->name, s->labels,
                    (long long)(int64_t)metrics_sum(m, s->slot));
            continue;
        }
        /* Counters of known label sets are listed at zero (the Prometheus
         * client convention), so increase() sees their first event and
         * alerts need no "unless ... offset" for a series that appears at
         * 1. Pairs sluice never answers with (most of the outcome x reason
         * grid) are left out while zero: they could never move. */
        v = metrics_sum(m, s->slot);
        if (v || s->zero)
            fprintf(f, "%s%s%s%s %llu\n", s->name, s->labels[0] ? "{" : "",
                    s->labels, s->labels[0] ? "}" : "", (unsigned long long)v);
    }
}

char *metrics_render(struct metrics *m, const char *extra)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);

    if (!f)
        return NULL;
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; i < sizeof families / sizeof *families; i++)
        render_family(f, m, &families[i]);
    pthread_mutex_unlock(&m->mu);
    if (extra)
        fputs(extra, f);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}
