#include "proxy/pacing.h"

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

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */

    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static void state_init(struct policy_state *ps, const struct sc_policy *p)
{
    memset(ps, 0, sizeof *ps);
    ps->p = p;
    ps->has_bucket = p->has_rate;
    if (p->has_rate)
        gcra_init(&ps->bucket.g, p->rate, p->burst);
    pthread_mutex_init(&ps->mu, NULL);
    TAILQ_INIT(&ps->waiters);
    TAILQ_INIT(&ps->lru);
}

static int table_init(struct policy_state *ps)
{
    size_t n = 64;

    if (!ps->p->partition_header || !ps->has_bucket)
        return 0;
    while (n < (size_t)ps->p->partition_max * 2 && n < (1u << 22))
        n <<= 1;
    ps->table = calloc(n, sizeof *ps->table);
    ps->table_size = n;
    return ps->table ? 0 : -ENOMEM;
}

int pacing_init(struct pacing *pc, const struct sc_config *cfg)
{
    memset(pc, 0, sizeof *pc);
    state_init(&pc->dflt, &cfg->default_policy);
    pc->n = cfg->n_policies;
    pc->pol = calloc(pc->n ? pc->n : 1, sizeof *pc->pol);
    if (!pc->pol)
        return -ENOMEM;
    for (size_t i = 0; i < pc->n; i++) {
        state_init(&pc->pol[i], &cfg->policies[i]);
        if (table_init(&pc->pol[i]) != 0)
            return -ENOMEM;
    }
    return 0;
}

static void state_free(struct policy_state *ps)
{
    struct partition *p;

    while ((p = TAILQ_FIRST(&ps->lru))) {
        TAILQ_REMOVE(&ps->lru, p, lru);
        free(p->name);
        free(p);
    }
    free(ps->table);
    pthread_mutex_destroy(&ps->mu);
}

void pacing_free(struct pacing *pc)
{
    for (size_t i = 0; pc->pol && i < pc->n; i++)
        state_free(&pc->pol[i]);
    free(pc->pol);
    state_free(&pc->dflt);
    memset(pc, 0, sizeof *pc);
}

struct policy_state *pacing_policy(struct pacing *pc, long idx)
{
    return idx >= 0 && (size_t)idx < pc->n ? &pc->pol[idx] : &pc->dflt;
}

/* ---- partitions --------------------------------------------------------- */

static void chain_remove(struct policy_state *ps, struct partition *victim)
{
    struct partition **pp = &ps->table[hash_str(victim->name) & (ps->table_size - 1)];

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

    *evicted = ps->n_parts >= ps->p->partition_max;
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
    size_t slot = hash_str(name) & (ps->table_size - 1);
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
    gcra_init(&p->b.g, ps->p->rate, ps->p->burst);
    if (evicted)
        gcra_set_empty(&p->b.g, now);
    atomic_store(&p->b.cooldown_until, 0);
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
    if (ps->p->concurrency == 0) {
        atomic_fetch_add(&ps->inflight, 1);
        return true;
    }
    pthread_mutex_lock(&ps->mu);
    if (atomic_load(&ps->inflight) < ps->p->concurrency &&
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

    if (ps->p->concurrency == 0) {
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
