#include "proxy/pacing.h"
#include "util/hash.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

/* Partitions are few and change rarely compared with requests; one mutex per
 * policy guards them. Buckets themselves are lock-free (GCRA on an atomic). */
struct partition {
    char *name;
    struct bucket b;
    struct partition *next;       /* hash chain */
    TAILQ_ENTRY(partition) lru;
};

static uint32_t ceil_div(uint32_t a, uint32_t b)
{
    return a ? (a + b - 1) / b : 0;
}

/* The numbers this sidecar applies by itself. A policy shared through Redis
 * is paced there; its local bucket and slots are the fallback while Redis
 * does not answer: this sidecar's share of the fleet's numbers (contract
 * §10), so the fleet stays within them even then. */
static void local_numbers(const struct sc_policy *p, uint32_t fleet_size,
                          double *rate, uint32_t *burst, uint32_t *concurrency)
{
    uint32_t n = p->shared == SC_SHARED_REDIS && fleet_size > 1 ? fleet_size : 1;

    *rate = p->rate / n;
    *burst = ceil_div(p->burst, n);
    *concurrency = ceil_div(p->concurrency, n);
}

static struct policy_state *state_new(const struct sc_policy *p,
                                      uint32_t fleet_size)
{
    struct policy_state *ps = calloc(1, sizeof *ps);
    size_t n = 64;

    if (!ps)
        return NULL;
    atomic_store(&ps->refs, 1);
    ps->name = strdup(p->name);
    local_numbers(p, fleet_size, &ps->rate, &ps->burst, &ps->concurrency);
    ps->shared = p->shared == SC_SHARED_REDIS;
    ps->partition_max = p->partition_max;
    ps->has_bucket = p->has_rate;
    if (p->has_rate) {
        struct gcra fleet;

        gcra_init(&ps->bucket.g, ps->rate, ps->burst);
        gcra_init(&ps->bucket.sent, ps->rate, ps->burst);
        /* The fleet's own numbers, undivided, for the bucket in Redis. */
        gcra_init(&fleet, p->rate, p->burst);
        ps->fleet_t_ns = fleet.t_ns;
        ps->fleet_tau_ns = fleet.tau_ns;
    }
    pthread_mutex_init(&ps->mu, NULL);
    TAILQ_INIT(&ps->waiters);
    TAILQ_INIT(&ps->lru);
    if (p->partition_header && p->has_rate) {
        ps->partition_header = strdup(p->partition_header);
        while (n < (size_t)p->partition_max * 2 && n < (1u << 22))
            n <<= 1;
        ps->table = calloc(n, sizeof *ps->table);
        ps->table_size = n;
        if (!ps->table || !ps->partition_header) {
            pacing_state_put(ps);
            return NULL;
        }
    }
    if (!ps->name) {
        pacing_state_put(ps);
        return NULL;
    }
    return ps;
}

static bool same_numbers(const struct policy_state *ps, const struct sc_policy *p,
                         uint32_t fleet_size)
{
    const char *ph = p->has_rate ? p->partition_header : NULL;
    double rate;
    uint32_t burst, concurrency;

    local_numbers(p, fleet_size, &rate, &burst, &concurrency);
    return !strcmp(ps->name, p->name) && ps->has_bucket == p->has_rate &&
           ps->shared == (p->shared == SC_SHARED_REDIS) &&
           (!p->has_rate || (ps->rate == rate && ps->burst == burst)) &&
           ps->concurrency == concurrency &&
           ps->partition_max == p->partition_max &&
           (!ps->partition_header) == (!ph) &&
           (!ph || !strcmp(ps->partition_header, ph));
}

static struct policy_state *reuse(const struct pacing *prev,
                                  const struct sc_policy *p, uint32_t fleet_size)
{
    for (size_t i = 0; prev && i < prev->n; i++)
        if (same_numbers(prev->pol[i], p, fleet_size)) {
            atomic_fetch_add(&prev->pol[i]->refs, 1);
            return prev->pol[i];
        }
    return NULL;
}

int pacing_init(struct pacing *pc, const struct sc_config *cfg,
                const struct pacing *prev)
{
    memset(pc, 0, sizeof *pc);
    uint32_t fleet = cfg->store.fleet_size;

    pc->dflt = state_new(&cfg->default_policy, fleet);
    pc->n = cfg->n_policies;
    pc->pol = calloc(pc->n ? pc->n : 1, sizeof *pc->pol);
    if (!pc->pol || !pc->dflt)
        return -ENOMEM;
    for (size_t i = 0; i < pc->n; i++) {
        pc->pol[i] = reuse(prev, &cfg->policies[i], fleet);
        if (!pc->pol[i] && !(pc->pol[i] = state_new(&cfg->policies[i], fleet)))
            return -ENOMEM;
    }
    return 0;
}

void pacing_state_put(struct policy_state *ps)
{
    struct partition *p;

    if (!ps || atomic_fetch_sub(&ps->refs, 1) != 1)
        return;
    while ((p = TAILQ_FIRST(&ps->lru))) {
        TAILQ_REMOVE(&ps->lru, p, lru);
        free(p->name);
        free(p);
    }
    free(ps->table);
    free(ps->name);
    free(ps->partition_header);
    pthread_mutex_destroy(&ps->mu);
    free(ps);
}

void pacing_free(struct pacing *pc)
{
    for (size_t i = 0; pc->pol && i < pc->n; i++)
        pacing_state_put(pc->pol[i]);
    free(pc->pol);
    pacing_state_put(pc->dflt);
    memset(pc, 0, sizeof *pc);
}

void bucket_pause(struct bucket *b, uint64_t now, uint64_t until,
                  enum pause_why why)
{
    uint64_t cur = atomic_load(&b->cooldown_until);

    gcra_empty(&b->g, now);
    gcra_pause_until(&b->g, until);
    while (cur < until) {
        if (atomic_compare_exchange_weak(&b->cooldown_until, &cur, until)) {
            atomic_store(&b->cooldown_why, (int)why);
            break;
        }
    }
}

const char *pause_why_name(enum pause_why why)
{
    switch (why) {
    case PAUSE_UPSTREAM_429: return "upstream_429";
    case PAUSE_BREAKER: return "breaker";
    case PAUSE_RESTORED: return "restored";
    default: return "unknown";
    }
}

static void report_pause(struct bucket *b, uint64_t now, const char *partition,
                         pause_fn fn, void *arg)
{
    uint64_t until = atomic_load(&b->cooldown_until);

    if (until > now)
        fn(arg, partition, until, (enum pause_why)atomic_load(&b->cooldown_why));
}

void pacing_pauses(struct policy_state *ps, uint64_t now, pause_fn fn, void *arg)
{
    struct partition *p;

    if (!ps->has_bucket)
        return;
    report_pause(&ps->bucket, now, NULL, fn, arg);
    pthread_mutex_lock(&ps->mu);
    TAILQ_FOREACH(p, &ps->lru, lru)
        report_pause(&p->b, now, p->name, fn, arg);
    pthread_mutex_unlock(&ps->mu);
}

/* The clock of the pause goes first: a request that reads it as over while
 * TAT still holds the pause only waits, never sends early. */
static bool bucket_resume(struct bucket *b, uint64_t now)
{
    uint64_t until = atomic_exchange(&b->cooldown_until, 0);

    if (until <= now)
        return false;
    gcra_resume(&b->g, now);
    return true;
}

size_t pacing_resume(struct policy_state *ps, uint64_t now)
{
    struct partition *p;
    size_t n;

    if (!ps->has_bucket)
        return 0;
    n = bucket_resume(&ps->bucket, now);
    pthread_mutex_lock(&ps->mu);
    TAILQ_FOREACH(p, &ps->lru, lru)
        n += bucket_resume(&p->b, now);
    pthread_mutex_unlock(&ps->mu);
    return n;
}

struct policy_state *pacing_policy(struct pacing *pc, long idx)
{
    return idx >= 0 && (size_t)idx < pc->n ? pc->pol[idx] : pc->dflt;
}

/* ---- partitions --------------------------------------------------------- */

static void chain_remove(struct policy_state *ps, struct partition *victim)
{
    struct partition **pp =
        &ps->table[hash_str(HASH_INIT, victim->name) & (ps->table_size - 1)];

    while (*pp && *pp != victim)
        pp = &(*pp)->next;
    if (*pp)
        *pp = victim->next;
}

/* Reuses the least recently used partition, so eviction allocates nothing
 * and bucket pointers handed out earlier stay valid memory. */
static struct partition *evict_lru(struct policy_state *ps, const char *name)
{
    struct partition *v = TAILQ_LAST(&ps->lru, partition_lru_head);
    char *n = strdup(name);

    if (!v || !n) {
        free(n);
        return NULL;
    }
    chain_remove(ps, v);
    TAILQ_REMOVE(&ps->lru, v, lru);
    free(v->name);
    v->name = n;
    return v;
}

static struct partition *partition_new(struct policy_state *ps, const char *name,
                                       bool *evicted)
{
    struct partition *p;

    *evicted = ps->n_parts >= ps->partition_max;
    if (*evicted)
        return evict_lru(ps, name);
    p = calloc(1, sizeof *p);
    if (!p || !(p->name = strdup(name))) {
        free(p);
        return NULL;
    }
    ps->n_parts++;
    return p;
}

static struct bucket *partition_get(struct policy_state *ps, const char *name,
                                    uint64_t now)
{
    size_t slot = hash_str(HASH_INIT, name) & (ps->table_size - 1);
    struct partition *p;
    bool evicted;

    for (p = ps->table[slot]; p; p = p->next)
        if (strcmp(p->name, name) == 0) {
            TAILQ_REMOVE(&ps->lru, p, lru);
            TAILQ_INSERT_HEAD(&ps->lru, p, lru);
            return &p->b;
        }
    p = partition_new(ps, name, &evicted);
    if (!p)
        return &ps->bucket; /* out of memory: share the policy's bucket */
    /* A partition made while there is room starts full, like the policy's
     * bucket. Once the table is full (it never shrinks), every new one costs
     * an eviction and starts empty: an evicted partition that comes back is
     * never full, so churning names cannot grant bursts. */
    gcra_init(&p->b.g, ps->rate, ps->burst);
    gcra_init(&p->b.sent, ps->rate, ps->burst);
    if (evicted) {
        gcra_set_empty(&p->b.g, now);
        gcra_set_empty(&p->b.sent, now);
    }
    atomic_store(&p->b.cooldown_until, 0);
    atomic_store(&p->b.cooldown_why, PAUSE_NONE);
    p->next = ps->table[slot];
    ps->table[slot] = p;
    TAILQ_INSERT_HEAD(&ps->lru, p, lru);
    return &p->b;
}

struct bucket *pacing_bucket(struct policy_state *ps, const char *partition,
                             uint64_t now)
{
    struct bucket *b;

    if (!ps->has_bucket)
        return NULL;
    if (!ps->table || !partition)
        return &ps->bucket;
    pthread_mutex_lock(&ps->mu);
    b = partition_get(ps, partition, now);
    pthread_mutex_unlock(&ps->mu);
    return b;
}

/* ---- concurrency -------------------------------------------------------- */

bool pacing_slot_acquire(struct policy_state *ps, struct slot_waiter *w)
{
    bool got = false;

    /* Without a limit the count is only for the gauge: no lock on the hot path. */
    if (ps->concurrency == 0) {
        atomic_fetch_add(&ps->inflight, 1);
        return true;
    }
    pthread_mutex_lock(&ps->mu);
    if (atomic_load(&ps->inflight) < ps->concurrency &&
        TAILQ_EMPTY(&ps->waiters)) {
        atomic_fetch_add(&ps->inflight, 1);
        got = true;
    } else {
        w->queued = true;
        w->granted = false;
        TAILQ_INSERT_TAIL(&ps->waiters, w, link);
    }
    pthread_mutex_unlock(&ps->mu);
    return got;
}

bool pacing_slot_cancel(struct policy_state *ps, struct slot_waiter *w)
{
    bool removed = false;

    pthread_mutex_lock(&ps->mu);
    if (w->queued) {
        TAILQ_REMOVE(&ps->waiters, w, link);
        w->queued = false;
        removed = true;
    }
    pthread_mutex_unlock(&ps->mu);
    return removed;
}

void pacing_slot_release(struct policy_state *ps)
{
    struct slot_waiter *w;

    if (ps->concurrency == 0) {
        atomic_fetch_sub(&ps->inflight, 1);
        return;
    }
    pthread_mutex_lock(&ps->mu);
    w = TAILQ_FIRST(&ps->waiters);
    if (w) {
        /* The slot passes to the oldest waiter: inflight stays as it is. */
        TAILQ_REMOVE(&ps->waiters, w, link);
        w->queued = false;
        w->granted = true;
        event_active(w->granted_ev, EV_TIMEOUT, 0);
    } else {
        atomic_fetch_sub(&ps->inflight, 1);
    }
    pthread_mutex_unlock(&ps->mu);
}

uint32_t pacing_inflight(struct policy_state *ps)
{
    return atomic_load(&ps->inflight);
}
