#include "pacing/pacing.h"
#include "obs/log.h"
#include "util/hash.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


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

/* A shadow policy's lane clocks: beside every bucket that grants permits,
 * whatever the mode, so a reload into shadow mode that keeps the numbers
 * (and so the state) has them. */
struct bucket_shadow {
    pthread_mutex_t mu;
    struct shadow_lanes sl;
};

static void shadow_free(struct bucket_shadow *sh)
{
    if (!sh)
        return;
    shadow_lanes_free(&sh->sl);
    pthread_mutex_destroy(&sh->mu);
    free(sh);
}

static struct bucket_shadow *shadow_new(const struct policy_state *ps)
{
    struct bucket_shadow *sh = calloc(1, sizeof *sh);

    if (!sh)
        return NULL;
    pthread_mutex_init(&sh->mu, NULL);
    if (shadow_lanes_init(&sh->sl, ps->lanes, ps->n_lanes) != 0) {
        shadow_free(sh);
        return NULL;
    }
    return sh;
}

static void bucket_fini(struct bucket *b)
{
    if (b->pm)
        permits_free(b->pm);
    free(b->pm);
    b->pm = NULL;
    shadow_free(b->shadow);
    b->shadow = NULL;
}

/* A full bucket of ps's numbers with no pause; with ps's lanes, its permits
 * too. 0 or -ENOMEM. */
static int bucket_init(struct policy_state *ps, struct bucket *b, bool partition)
{
    gcra_init(&b->g, ps->rate, ps->burst);
    gcra_init(&b->sent, ps->rate, ps->burst);
    atomic_store(&b->cooldown_until, 0);
    atomic_store(&b->cooldown_why, PAUSE_NONE);
    atomic_store(&b->holders, 0);
    b->partition = partition;
    b->next = NULL;
    b->pm = NULL;
    b->shadow = NULL;
    if (!ps->lanes)
        return 0;
    if (!(b->shadow = shadow_new(ps)))
        return -ENOMEM;
    /* A fleet's lanes grant at the fleet's numbers, each head then asking
     * the shared bucket (stage_permit_fleet_lanes), so a sidecar alone in
     * the fleet is not held to its fallback share. */
    if (!(b->pm = malloc(sizeof *b->pm)) ||
        permits_init(b->pm, ps->lanes, ps->n_lanes,
                     ps->shared ? ps->fleet_rate : ps->rate,
                     ps->shared ? ps->fleet_burst : ps->burst, 0) != 0) {
        bucket_fini(b);
        return -ENOMEM;
    }
    if (ps->follow)
        permits_follow(b->pm, ps->min_rate);
    if (ps->shared)
        b->pm->flight_scale = ps->fleet_n;
    return 0;
}

static void lanes_copy_free(struct policy_state *ps)
{
    for (size_t i = 0; ps->lanes && i < ps->n_lanes; i++)
        free(ps->lanes[i].name);
    free(ps->lanes);
    ps->lanes = NULL;
}

/* Granted permits: a policy with lanes, or one that follows its quota
 * (which paces as one lane, unless it has lanes): on this sidecar's bucket,
 * or ordering this sidecar's waiters for a fleet's; in shadow mode the
 * same buckets give the effective rate the lane clocks run at. */
static bool grants(const struct sc_policy *p)
{
    return p->has_rate && (p->n_lanes || (p->quota.enabled && p->quota.follow));
}

/* The one lane of a policy that follows its quota without lanes. */
static int lane_implicit(struct policy_state *ps, const struct sc_policy *p)
{
    if (!(ps->lanes = calloc(1, sizeof *ps->lanes)) ||
        !(ps->lanes[0].name = strdup("")))
        return -ENOMEM;
    ps->n_lanes = 1;
    ps->lanes[0].share = 100;
    ps->lanes[0].max_wait_ms = p->max_wait_ms;
    return 0;
}

/* The policy's lanes, names and all: the config may go before the state. */
static int lanes_copy(struct policy_state *ps, const struct sc_policy *p)
{
    if (!grants(p))
        return 0;
    ps->follow = p->quota.enabled && p->quota.follow;
    ps->min_rate = p->quota.min_rate;
    if (!p->n_lanes)
        return lane_implicit(ps, p);
    if (!(ps->lanes = calloc(p->n_lanes, sizeof *ps->lanes)))
        return -ENOMEM;
    ps->n_lanes = p->n_lanes;
    for (size_t i = 0; i < p->n_lanes; i++) {
        ps->lanes[i] = p->lanes[i];
        ps->lanes[i].name = strdup(p->lanes[i].name ? p->lanes[i].name : "");
        if (!ps->lanes[i].name)
            return -ENOMEM;
    }
    return 0;
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
    pthread_mutex_init(&ps->mu, NULL);
    TAILQ_INIT(&ps->waiters);
    TAILQ_INIT(&ps->lru);
    if (lanes_copy(ps, p) != 0 ||
        (ps->lanes && (lanes_init(&ps->slot_lanes, ps->lanes, ps->n_lanes) != 0 ||
                       lanes_init(&ps->turn_lanes, ps->lanes, ps->n_lanes) != 0))) {
        pacing_state_put(ps);
        return NULL;
    }
    ps->fleet_rate = p->rate;
    ps->fleet_burst = p->burst;
    ps->fleet_n = ps->shared && fleet_size > 1 ? fleet_size : 1;
    if (p->has_rate) {
        struct gcra fleet;

        if (bucket_init(ps, &ps->bucket, false) != 0) {
            pacing_state_put(ps);
            return NULL;
        }
        /* The fleet's own numbers, undivided, for the bucket in Redis. */
        gcra_init(&fleet, p->rate, p->burst);
        ps->fleet_t_ns = fleet.t_ns;
        ps->fleet_tau_ns = fleet.tau_ns;
    }
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

/* The lanes' names, shares and waits: a change makes a new state, which
 * takes the waiters over lane by name. */
static bool same_lanes(const struct policy_state *ps, const struct sc_policy *p)
{
    size_t n = grants(p) ? p->n_lanes : 0;

    if (grants(p) != (ps->lanes != NULL) ||
        ps->follow != (p->quota.enabled && p->quota.follow) ||
        (ps->follow && ps->min_rate != p->quota.min_rate))
        return false;
    if (ps->lanes && !n) /* the one lane of a quota */
        return ps->lanes[0].max_wait_ms == p->max_wait_ms;
    if (ps->n_lanes != n)
        return false;
    for (size_t i = 0; i < n; i++)
        if (strcmp(ps->lanes[i].name, p->lanes[i].name ? p->lanes[i].name : "") ||
            ps->lanes[i].share != p->lanes[i].share ||
            ps->lanes[i].max_wait_ms != p->lanes[i].max_wait_ms)
            return false;
    return true;
}

static bool same_numbers(const struct policy_state *ps, const struct sc_policy *p,
                         uint32_t fleet_size)
{
    const char *ph = p->has_rate ? p->partition_header : NULL;
    double rate;
    uint32_t burst, concurrency;

    local_numbers(p, fleet_size, &rate, &burst, &concurrency);
    return !strcmp(ps->name, p->name) && ps->has_bucket == p->has_rate &&
           same_lanes(ps, p) &&
           ps->shared == (p->shared == SC_SHARED_REDIS) &&
           (!p->has_rate || (ps->rate == rate && ps->burst == burst &&
                             ps->fleet_rate == p->rate &&
                             ps->fleet_burst == p->burst)) &&
           ps->concurrency == concurrency &&
           ps->partition_max == p->partition_max &&
           (!ps->partition_header) == (!ph) &&
           (!ph || !strcmp(ps->partition_header, ph));
}

/* prev's state of the policy called p->name, or NULL. */
static struct policy_state *prev_state(const struct pacing *prev,
                                       const struct sc_policy *p)
{
    for (size_t i = 0; prev && i < prev->n; i++)
        if (!strcmp(prev->pol[i]->name, p->name))
            return prev->pol[i];
    return NULL;
}

/* old itself when p's numbers are old's, else a new state that will take
 * old (may be NULL) over. */
static struct policy_state *state_for(const struct sc_policy *p,
                                      uint32_t fleet_size,
                                      struct policy_state *old)
{
    struct policy_state *ps;

    if (old && same_numbers(old, p, fleet_size)) {
        atomic_fetch_add(&old->refs, 1);
        return old;
    }
    if ((ps = state_new(p, fleet_size)))
        ps->takes_over = old;
    return ps;
}

int pacing_init(struct pacing *pc, const struct sc_config *cfg,
                const struct pacing *prev)
{
    memset(pc, 0, sizeof *pc);
    uint32_t fleet = cfg->store.fleet_size;

    pc->dflt = state_for(&cfg->default_policy, fleet, prev ? prev->dflt : NULL);
    pc->n = cfg->n_policies;
    pc->pol = calloc(pc->n ? pc->n : 1, sizeof *pc->pol);
    if (!pc->pol || !pc->dflt)
        return -ENOMEM;
    for (size_t i = 0; i < pc->n; i++) {
        pc->pol[i] = state_for(&cfg->policies[i], fleet,
                               prev_state(prev, &cfg->policies[i]));
        if (!pc->pol[i])
            return -ENOMEM;
    }
    return 0;
}

void pacing_state_put(struct policy_state *ps)
{
    struct policy_state *next;
    struct partition *p;

    if (!ps || atomic_fetch_sub(&ps->refs, 1) != 1)
        return;
    next = atomic_load(&ps->next);
    while ((p = TAILQ_FIRST(&ps->lru))) {
        TAILQ_REMOVE(&ps->lru, p, lru);
        bucket_fini(&p->b);
        free(p->name);
        free(p);
    }
    bucket_fini(&ps->bucket);
    lanes_free(&ps->slot_lanes);
    lanes_free(&ps->turn_lanes);
    lanes_copy_free(ps);
    free(ps->table);
    free(ps->name);
    free(ps->partition_header);
    pthread_mutex_destroy(&ps->mu);
    free(ps);
    pacing_state_put(next);
}

void pacing_free(struct pacing *pc)
{
    for (size_t i = 0; pc->pol && i < pc->n; i++)
        pacing_state_put(pc->pol[i]);
    free(pc->pol);
    pacing_state_put(pc->dflt);
    memset(pc, 0, sizeof *pc);
}

struct policy_state *pacing_live(struct policy_state *ps)
{
    struct policy_state *next;

    while ((next = atomic_load(&ps->next)))
        ps = next;
    return ps;
}

struct breaker_state *pacing_breaker(struct policy_state *ps)
{
    return &pacing_live(ps)->breaker;
}

/* The live state of ps, locked. Only ever one lock at a time: a hand-over,
 * which takes two, holds the old state's until it is complete. */
static struct policy_state *lock_live(struct policy_state *ps)
{
    struct policy_state *next;

    for (;;) {
        pthread_mutex_lock(&ps->mu);
        if (!(next = atomic_load(&ps->next)))
            return ps;
        pthread_mutex_unlock(&ps->mu);
        ps = next;
    }
}

/* ---- pauses --------------------------------------------------------------- */

/* The bucket that holds b's pause now, with its end in *until. */
static struct bucket *pause_home(const struct bucket *b, uint64_t *until)
{
    while ((*until = atomic_load(&b->cooldown_until)) == PACING_MOVED64)
        b = b->next;
    return (struct bucket *)b;
}

uint64_t bucket_cooldown(const struct bucket *b)
{
    uint64_t until;

    pause_home(b, &until);
    return until;
}

/* The clock of the pause goes first, then the TAT: a request that reads the
 * pause while TAT does not hold it yet only waits again, never sends early.
 * The TAT is reached through b's own gcra, which follows its own hand-over. */
void bucket_pause(struct bucket *b, uint64_t now, uint64_t until,
                  enum pause_why why)
{
    uint64_t cur;
    struct bucket *h = pause_home(b, &cur);

    for (;;) {
        if (cur == PACING_MOVED64) {
            h = pause_home(h, &cur);
        } else if (cur >= until) {
            break;
        } else if (atomic_compare_exchange_weak(&h->cooldown_until, &cur, until)) {
            atomic_store(&h->cooldown_why, (int)why);
            break;
        }
    }
    gcra_empty(&b->g, now);
    gcra_pause_until(&b->g, until);
    if (h->pm)
        permits_pause(h->pm, now, until);
}

uint32_t bucket_available(struct bucket *b, uint64_t now, uint64_t *next_ns)
{
    uint64_t until;
    struct bucket *h = pause_home(b, &until);

    if (h->pm)
        return permits_available(h->pm, now, next_ns);
    return gcra_available(&b->g, now, next_ns);
}

void bucket_empty(struct bucket *b, uint64_t now)
{
    uint64_t until;
    struct bucket *h = pause_home(b, &until);

    gcra_empty(&b->g, now);
    if (h->pm)
        permits_empty(h->pm, now);
}

const char *pause_why_name(enum pause_why why)
{
    switch (why) {
    case PAUSE_UPSTREAM_429: return "upstream_429";
    case PAUSE_BREAKER: return "breaker";
    case PAUSE_RESTORED: return "restored";
    case PAUSE_QUOTA: return "quota";
    default: return "unknown";
    }
}

static void report_pause(struct bucket *b, uint64_t now, const char *partition,
                         pause_fn fn, void *arg)
{
    uint64_t until;
    struct bucket *h = pause_home(b, &until);

    if (until > now)
        fn(arg, partition, until, (enum pause_why)atomic_load(&h->cooldown_why));
}

void pacing_pauses(struct policy_state *ps, uint64_t now, pause_fn fn, void *arg)
{
    struct partition *p;

    ps = pacing_live(ps);
    if (!ps->has_bucket)
        return;
    report_pause(&ps->bucket, now, NULL, fn, arg);
    ps = lock_live(ps);
    TAILQ_FOREACH(p, &ps->lru, lru)
        report_pause(&p->b, now, p->name, fn, arg);
    pthread_mutex_unlock(&ps->mu);
}

size_t pacing_partition_views(struct policy_state *ps, uint64_t now,
                              struct partition_view *out, size_t max, size_t *live)
{
    struct partition *p;
    size_t n = 0;

    ps = lock_live(ps);
    if (live)
        *live = ps->n_parts;
    /* The LRU's head is the most recently used. A bucket's permits lock
     * inside the policy's lock, never the reverse. */
    TAILQ_FOREACH(p, &ps->lru, lru) {
        if (n == max)
            break;
        if (!p->b.pm)
            continue;
        snprintf(out[n].name, sizeof out[n].name, "%s", p->name);
        permits_view(p->b.pm, now, &out[n].v);
        n++;
    }
    pthread_mutex_unlock(&ps->mu);
    return n;
}

/* The clock of the pause goes first: a request that reads it as over while
 * TAT still holds the pause only waits, never sends early. */
static bool bucket_resume(struct bucket *b, uint64_t now)
{
    uint64_t until;
    struct bucket *h = pause_home(b, &until);

    while (!atomic_compare_exchange_weak(&h->cooldown_until, &until, 0))
        if (until == PACING_MOVED64)
            h = pause_home(h, &until);
    if (until <= now)
        return false;
    gcra_resume(&b->g, now);
    if (h->pm)
        permits_resume(h->pm, now);
    return true;
}

size_t pacing_resume(struct policy_state *ps, uint64_t now)
{
    struct partition *p;
    size_t n;

    ps = pacing_live(ps);
    if (!ps->has_bucket)
        return 0;
    n = bucket_resume(&ps->bucket, now);
    ps = lock_live(ps);
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

static void chain_add(struct policy_state *ps, struct partition *p)
{
    size_t slot = hash_str(HASH_INIT, p->name) & (ps->table_size - 1);

    p->next = ps->table[slot];
    ps->table[slot] = p;
}

/* Held by a request (which may still meet a 429 for it) or paused: the
 * partition is its tenant's until both are over. */
static bool pinned(const struct partition *p, uint64_t now)
{
    return atomic_load(&p->b.holders) > 0 || bucket_cooldown(&p->b) > now;
}

/* The least recently used partition neither held nor paused, taken out of
 * the table and the LRU, or NULL when there is none. Those passed over go to
 * the front: a run of them is walked once, not at every eviction. */
static struct partition *evict_lru(struct policy_state *ps, uint64_t now)
{
    for (size_t i = 0; i < ps->n_parts; i++) {
        struct partition *v = TAILQ_LAST(&ps->lru, partition_lru_head);

        TAILQ_REMOVE(&ps->lru, v, lru);
        if (!pinned(v, now)) {
            chain_remove(ps, v);
            return v;
        }
        TAILQ_INSERT_HEAD(&ps->lru, v, lru);
    }
    return NULL;
}

/* A partition for a name the table lacks, out of the table: made while there
 * is room (full, like the policy's bucket), else recycled from evict_lru
 * (empty: an evicted partition that comes back is never full, so churning
 * names cannot grant bursts). -EBUSY: none free; -ENOMEM. */
static int partition_new(struct policy_state *ps, const char *name,
                         uint64_t now, struct partition **out)
{
    bool evicted = ps->n_parts >= ps->partition_max;
    char *n = strdup(name);
    struct partition *p = NULL;

    if (n && evicted)
        p = evict_lru(ps, now);
    else if (n && (p = calloc(1, sizeof *p)))
        ps->n_parts++;
    if (!p) {
        free(n);
        return n && evicted ? -EBUSY : -ENOMEM;
    }
    free(p->name);
    p->name = n;
    bucket_fini(&p->b);
    if (bucket_init(ps, &p->b, true) != 0) {
        /* Out of memory: out of the table (an evicted one was counted, a
         * new one just was); the request shares the policy's bucket. */
        free(p->name);
        free(p);
        ps->n_parts--;
        return -ENOMEM;
    }
    if (evicted) {
        gcra_set_empty(&p->b.g, now);
        gcra_set_empty(&p->b.sent, now);
        if (p->b.pm)
            permits_set_empty(p->b.pm, now);
    }
    *out = p;
    return 0;
}

/* Refusing new partitions is logged as it starts and ends, not per request
 * (each refusal is counted as rate_limited). */
static void note_room(struct policy_state *ps, bool room)
{
    if (room != ps->parts_full)
        return;
    ps->parts_full = !room;
    if (!room)
        log_warn("policy %s: all %zu partitions are held by requests in flight "
                 "or paused: a new %s value is requeued (rate_limited)",
                 ps->name, ps->n_parts, ps->partition_header);
    else
        log_info("policy %s: room for new partitions again", ps->name);
}

static int partition_get(struct policy_state *ps, const char *name,
                         uint64_t now, struct bucket **out)
{
    size_t slot = hash_str(HASH_INIT, name) & (ps->table_size - 1);
    struct partition *p;
    int rc = 0;

    for (p = ps->table[slot]; p && strcmp(p->name, name) != 0; p = p->next)
        ;
    if (p)
        TAILQ_REMOVE(&ps->lru, p, lru);
    else if ((rc = partition_new(ps, name, now, &p)) == 0)
        chain_add(ps, p);
    note_room(ps, rc != -EBUSY);
    if (rc == -ENOMEM) {
        *out = &ps->bucket; /* out of memory: share the policy's bucket */
        return 0;
    }
    if (rc != 0)
        return rc;
    TAILQ_INSERT_HEAD(&ps->lru, p, lru);
    atomic_fetch_add(&p->b.holders, 1);
    *out = &p->b;
    return 0;
}

int pacing_bucket(struct policy_state *ps, const char *partition, uint64_t now,
                  struct bucket **b)
{
    struct policy_state *next;
    int rc = 0;

    *b = NULL;
    if (!ps->has_bucket)
        return 0;
    if (!ps->table || !partition) {
        *b = &ps->bucket;
        return 0;
    }
    pthread_mutex_lock(&ps->mu);
    if (!(next = atomic_load(&ps->next)))
        rc = partition_get(ps, partition, now, b);
    pthread_mutex_unlock(&ps->mu);
    /* Handed over by a reload: the partitions live on in the new state. */
    return next ? pacing_bucket(next, partition, now, b) : rc;
}

void pacing_bucket_put(struct bucket *b)
{
    uint32_t n;

    if (!b || !b->partition)
        return;
    for (n = atomic_load(&b->holders);;) {
        if (n == PACING_MOVED32) {
            b = b->next;
            n = atomic_load(&b->holders);
        } else if (atomic_compare_exchange_weak(&b->holders, &n, n - 1)) {
            return;
        }
    }
}

/* ---- concurrency -------------------------------------------------------- */

/* The lock-free count of a policy without a limit; false when the count was
 * handed over (then the caller goes through the lock to the new state). */
static bool count_unlocked(struct policy_state *ps, int delta)
{
    uint32_t n = atomic_load(&ps->inflight);

    while (n != PACING_MOVED32)
        if (atomic_compare_exchange_weak(&ps->inflight, &n, n + (uint32_t)delta))
            return true;
    return false;
}

/* The slot waiters, under ps->mu: in arrival order, or, for a policy with
 * lanes, in their lanes, each slot going to the lane the stride scheduler
 * picks (policies/lanes.h), so that slots follow the shares as permits do. */
#define slot_waiter_of(l) \
    ((struct slot_waiter *)((char *)(l) - offsetof(struct slot_waiter, lw)))

static bool waiters_empty(const struct policy_state *ps)
{
    return ps->lanes ? lanes_idle(&ps->slot_lanes) : TAILQ_EMPTY(&ps->waiters);
}

static void waiters_push(struct policy_state *ps, struct slot_waiter *w)
{
    if (ps->lanes)
        lanes_push(&ps->slot_lanes, &w->lw,
                   w->lane < ps->n_lanes ? w->lane : (uint32_t)ps->n_lanes - 1);
    else
        TAILQ_INSERT_TAIL(&ps->waiters, w, link);
}

static void waiters_remove(struct policy_state *ps, struct slot_waiter *w)
{
    if (ps->lanes)
        lanes_remove(&ps->slot_lanes, &w->lw);
    else
        TAILQ_REMOVE(&ps->waiters, w, link);
}

static struct slot_waiter *waiters_pop(struct policy_state *ps)
{
    struct lane_waiter *lw;
    struct slot_waiter *w;

    if (ps->lanes)
        return (lw = lanes_pop(&ps->slot_lanes)) ? slot_waiter_of(lw) : NULL;
    if ((w = TAILQ_FIRST(&ps->waiters)))
        TAILQ_REMOVE(&ps->waiters, w, link);
    return w;
}

/* Under ps->mu. A lowered limit grants nobody until enough slots are back. */
static void grant_while_room(struct policy_state *ps)
{
    struct slot_waiter *w;

    while (!waiters_empty(ps) &&
           (ps->concurrency == 0 || atomic_load(&ps->inflight) < ps->concurrency)) {
        w = waiters_pop(ps);
        w->queued = false;
        w->granted = true;
        atomic_fetch_add(&ps->inflight, 1);
        w->on_grant(w);
    }
}

static bool slot_get(struct policy_state *ps, struct slot_waiter *w)
{
    bool got;

    /* Without a limit the count is only for the gauge: no lock on the hot path. */
    if (ps->concurrency == 0 && count_unlocked(ps, 1))
        return true;
    ps = lock_live(ps);
    got = ps->concurrency == 0 ||
          (atomic_load(&ps->inflight) < ps->concurrency && waiters_empty(ps));
    if (got) {
        atomic_fetch_add(&ps->inflight, 1);
    } else if (w) {
        w->queued = true;
        w->granted = false;
        waiters_push(ps, w);
    }
    pthread_mutex_unlock(&ps->mu);
    return got;
}

bool pacing_slot_acquire(struct policy_state *ps, struct slot_waiter *w)
{
    return slot_get(ps, w);
}

bool pacing_slot_take(struct policy_state *ps)
{
    return slot_get(ps, NULL);
}

/* A waiter queued before a reload was moved to the new state's queue:
 * it is looked for there. */
bool pacing_slot_cancel(struct policy_state *ps, struct slot_waiter *w)
{
    bool removed = false;

    ps = lock_live(ps);
    if (w->queued) {
        waiters_remove(ps, w);
        w->queued = false;
        removed = true;
    }
    pthread_mutex_unlock(&ps->mu);
    return removed;
}

void pacing_slot_release(struct policy_state *ps)
{
    if (ps->concurrency == 0 && count_unlocked(ps, -1))
        return;
    ps = lock_live(ps);
    atomic_fetch_sub(&ps->inflight, 1);
    grant_while_room(ps);
    pthread_mutex_unlock(&ps->mu);
}

uint32_t pacing_inflight(struct policy_state *ps)
{
    uint32_t n = atomic_load(&pacing_live(ps)->inflight);

    if (n != PACING_MOVED32)
        return n;
    ps = lock_live(ps); /* a hand-over under way: complete once locked */
    n = atomic_load(&ps->inflight);
    pthread_mutex_unlock(&ps->mu);
    return n;
}

void pacing_slot_count(struct policy_state *ps)
{
    if (count_unlocked(ps, 1))
        return;
    ps = lock_live(ps);
    atomic_fetch_add(&ps->inflight, 1);
    pthread_mutex_unlock(&ps->mu);
}

/* ---- the turn to ask the fleet for a slot ---------------------------------- */

#define turn_lane(ps, w) ((w)->lane < (ps)->n_lanes ? (w)->lane : (uint32_t)(ps)->n_lanes - 1)

bool pacing_turn_take(struct policy_state *ps, struct slot_waiter *w)
{
    bool got;

    ps = lock_live(ps);
    got = !ps->lanes || (!ps->turn_held && lanes_idle(&ps->turn_lanes));
    if (got && ps->lanes) {
        ps->turn_held = true;
    } else if (!got) {
        w->queued = true;
        w->granted = false;
        lanes_push(&ps->turn_lanes, &w->lw, turn_lane(ps, w));
    }
    pthread_mutex_unlock(&ps->mu);
    return got;
}

bool pacing_turn_cancel(struct policy_state *ps, struct slot_waiter *w)
{
    bool removed = false;

    ps = lock_live(ps);
    if (w->queued) {
        lanes_remove(&ps->turn_lanes, &w->lw);
        w->queued = false;
        removed = true;
    }
    pthread_mutex_unlock(&ps->mu);
    return removed;
}

/* Under ps->mu: the turn to the waiter the shares pick, or free. */
static void turn_pass(struct policy_state *ps)
{
    struct lane_waiter *lw = ps->lanes ? lanes_pop(&ps->turn_lanes) : NULL;
    struct slot_waiter *w;

    ps->turn_held = lw != NULL;
    if (!lw)
        return;
    w = slot_waiter_of(lw);
    w->queued = false;
    w->granted = true;
    w->on_grant(w);
}

void pacing_turn_give(struct policy_state *ps)
{
    ps = lock_live(ps);
    turn_pass(ps);
    pthread_mutex_unlock(&ps->mu);
}

/* ---- shadow mode's lanes -------------------------------------------------- */

enum shadow_lane_verdict bucket_shadow_reserve(struct bucket *b, uint32_t lane,
                                               uint64_t now, uint64_t max_wait_ns,
                                               uint32_t share_n, uint64_t *wait_ns)
{
    struct permits_view v;
    enum shadow_lane_verdict r;
    double interval;
    uint64_t t, until = bucket_cooldown(b);

    permits_view(b->pm, now, &v);
    interval = v.rate > 0 ? 1e9 * (share_n ? share_n : 1) / v.rate : 1e9;
    t = interval < 1 ? 1 : (uint64_t)interval;
    pthread_mutex_lock(&b->shadow->mu);
    r = shadow_lanes_reserve(&b->shadow->sl, lane, now, t,
                             (uint64_t)(v.capacity ? v.capacity - 1 : 0) * t,
                             max_wait_ns, until > now ? until : 0, wait_ns);
    pthread_mutex_unlock(&b->shadow->mu);
    return r;
}

/* ---- a reload's hand-over -------------------------------------------------- */

/* b's pause, then its TATs, go to `to`, each sealed in b as it goes: a pause
 * that lands later lands on `to`, and the TAT is re-rated knowing every
 * pause that landed before. */
static void bucket_hand_over(struct bucket *b, struct bucket *to, uint64_t now)
{
    uint64_t until = atomic_load(&b->cooldown_until), next_ns = 0;
    /* A policy that gains lanes or quota.follow: its granted permits start
     * at the level its GCRA had, not full (a burst the bound never had). */
    uint32_t level = !b->pm && to->pm ? gcra_available(&b->g, now, &next_ns) : 0;

    if (!b->pm && to->pm)
        permits_set_level(to->pm, now, level, next_ns);
    b->next = to;
    do {
        atomic_store(&to->cooldown_until, until);
        atomic_store(&to->cooldown_why, atomic_load(&b->cooldown_why));
    } while (!atomic_compare_exchange_weak(&b->cooldown_until, &until,
                                           PACING_MOVED64));
    gcra_hand_over(&b->g, &to->g, now, &to->cooldown_until);
    gcra_hand_over(&b->sent, &to->sent, now, NULL);
    if (b->pm && to->pm && permits_hand_over(b->pm, to->pm, now) != 0)
        log_warn("out of memory: a bucket's waiting requests stay on the old "
                 "lanes (the send check still bounds what leaves)");
    else if (to->pm && until > now && until != PACING_MOVED64)
        permits_pause(to->pm, now, until);
}

/* After bucket_hand_over: the requests holding b now hold `to`, and give it
 * back there. */
static void holders_hand_over(struct bucket *b, struct bucket *to)
{
    uint32_t n = atomic_load(&b->holders);

    do
        atomic_store(&to->holders, n);
    while (!atomic_compare_exchange_weak(&b->holders, &n, PACING_MOVED32));
}

/* Most recently used first, as many as the new max holds, and beyond it
 * every one held or paused (neither is ever dropped); the rest stay behind,
 * so they come back empty, as after an eviction. */
static void partitions_hand_over(struct policy_state *old,
                                 struct policy_state *ps, uint64_t now)
{
    struct partition *p, *q;
    size_t lost = 0;

    TAILQ_FOREACH(p, &old->lru, lru) {
        if (ps->n_parts >= ps->partition_max && !pinned(p, now))
            continue;
        if (!(q = calloc(1, sizeof *q)) || !(q->name = strdup(p->name))) {
            free(q);
            lost++;
            continue;
        }
        if (bucket_init(ps, &q->b, true) != 0) {
            free(q->name);
            free(q);
            lost++;
            continue;
        }
        bucket_hand_over(&p->b, &q->b, now);
        holders_hand_over(&p->b, &q->b);
        chain_add(ps, q);
        TAILQ_INSERT_TAIL(&ps->lru, q, lru);
        ps->n_parts++;
    }
    if (lost)
        log_warn("policy %s: out of memory: %zu partitions keep the old numbers",
                 ps->name, lost);
}

/* A slot waiter's lane in the new state: the lane of the same name, else
 * the last (the default of routes that name none). */
static uint32_t slot_lane_in(const struct policy_state *old,
                             const struct policy_state *ps, uint32_t lane)
{
    if (!ps->lanes)
        return 0;
    for (size_t j = 0; old->lanes && lane < old->n_lanes && j < ps->n_lanes; j++)
        if (!strcmp(old->lanes[lane].name, ps->lanes[j].name))
            return (uint32_t)j;
    return (uint32_t)ps->n_lanes - 1;
}

/* Under both locks: the turn's holder (a request of either config) gives it
 * back to ps; its waiters keep their order there, lane by name, or, when ps
 * has no lanes, all have it at once. */
static void turns_hand_over(struct policy_state *old, struct policy_state *ps)
{
    struct lane_waiter *lw;
    struct slot_waiter *w;

    if (!old->lanes)
        return;
    ps->turn_held = ps->lanes && old->turn_held;
    while ((lw = lanes_pop(&old->turn_lanes))) {
        w = slot_waiter_of(lw);
        if (ps->lanes) {
            w->lane = slot_lane_in(old, ps, w->lane);
            lanes_push(&ps->turn_lanes, &w->lw, turn_lane(ps, w));
            continue;
        }
        w->queued = false;
        w->granted = true;
        w->on_grant(w);
    }
    if (ps->lanes && !ps->turn_held)
        turn_pass(ps);
}

/* Under both locks: waiters keep their order and are granted as far as the
 * new limit allows; in-flight requests count against it. */
static void slots_hand_over(struct policy_state *old, struct policy_state *ps)
{
    struct slot_waiter *w;

    atomic_store(&ps->inflight, atomic_exchange(&old->inflight, PACING_MOVED32));
    while ((w = waiters_pop(old))) {
        w->lane = slot_lane_in(old, ps, w->lane);
        waiters_push(ps, w);
    }
    grant_while_room(ps);
    turns_hand_over(old, ps);
}

/* ps is not reachable yet but through old's forwarding, so nothing sees it
 * half made: old->next, which sends callers to ps directly, comes last. A
 * breaker result noted on old while this runs may miss the copy. */
static void hand_over(struct policy_state *old, struct policy_state *ps,
                      uint64_t now)
{
    pthread_mutex_lock(&old->mu);
    pthread_mutex_lock(&ps->mu);
    if (old->has_bucket && ps->has_bucket)
        bucket_hand_over(&old->bucket, &ps->bucket, now);
    if (old->table && ps->table &&
        !strcmp(old->partition_header, ps->partition_header))
        partitions_hand_over(old, ps, now);
    slots_hand_over(old, ps);
    atomic_store(&ps->breaker.fail_streak, atomic_load(&old->breaker.fail_streak));
    atomic_store(&ps->breaker.opens, atomic_load(&old->breaker.opens));
    if (old->shared && ps->shared)
        atomic_store(&ps->fallback, atomic_load(&old->fallback));
    atomic_fetch_add(&ps->refs, 1);
    atomic_store(&old->next, ps);
    pthread_mutex_unlock(&ps->mu);
    pthread_mutex_unlock(&old->mu);
}

void pacing_commit(struct pacing *pc, uint64_t now)
{
    for (size_t i = 0; i <= pc->n; i++) {
        struct policy_state *ps = i < pc->n ? pc->pol[i] : pc->dflt;

        if (ps->takes_over)
            hand_over(ps->takes_over, ps, now);
        ps->takes_over = NULL;
    }
}
