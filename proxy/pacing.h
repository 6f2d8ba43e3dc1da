/* Runtime state of the policies (docs/contract.md §5): one bucket per policy (or
 * per partition), shared by every thread; cooldowns; the concurrency limit
 * with a FIFO of waiters that may sit on any thread's loop. The config stays
 * immutable; this is the mutable part that lives beside it. */
#ifndef SLUICE_PROXY_PACING_H
#define SLUICE_PROXY_PACING_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>

#include "config/config.h"
#include "policies/breaker.h"
#include "policies/gcra.h"

struct event;

/* Why a bucket is paused, for GET /cooldowns. A pause put back from the
 * store after a restart is `restored`: the store keeps its end, not its
 * cause. */
enum pause_why { PAUSE_NONE = 0, PAUSE_UPSTREAM_429, PAUSE_BREAKER, PAUSE_RESTORED };

/* A bucket and the cooldown an upstream imposed on it. `g` reserves start
 * times in arrival order (and decides max_wait); `sent`, with the same
 * numbers, is checked again at the moment a request is really handed to the
 * upstream: timers that fire late and together (a starved CPU) would
 * otherwise send late and on-time requests back to back, and the bound
 * burst + rate x t must hold where requests leave, not only where they are
 * scheduled. */
struct bucket {
    struct gcra g;
    struct gcra sent;
    _Atomic uint64_t cooldown_until; /* monotonic ns; 0 = none */
    _Atomic int cooldown_why;        /* enum pause_why of the latest pause */
};

/* A request waiting for a concurrency slot. Owned by its exchange; the
 * event lives on the exchange's loop and is activated (from any thread) when
 * the slot is granted. */
struct slot_waiter {
    struct event *granted_ev;
    bool queued, granted;
    TAILQ_ENTRY(slot_waiter) link;
};

struct partition;

/* Refcounted: a reload hands the state of a policy whose numbers did not
 * change to the new config, so its bucket, cooldown and partitions carry on
 * while requests of the old config finish on the same state. The numbers
 * are copied in, since the config they came from may go first. */
struct policy_state {
    atomic_long refs;
    char *name;
    double rate;
    uint32_t burst, concurrency, partition_max;
    char *partition_header;       /* NULL = not partitioned */
    bool has_bucket;
    bool shared;                  /* shared: redis: the numbers above are
                                     this sidecar's fallback share */
    atomic_bool fallback;         /* shared, and the fleet's bucket or
                                     slots did not answer: local numbers */
    uint64_t fleet_t_ns, fleet_tau_ns; /* shared: the fleet's bucket, as the
                                     policy states it (policies/gcra.h) */
    struct bucket bucket;         /* unpartitioned */
    pthread_mutex_t mu;           /* slots and partitions */
    _Atomic uint32_t inflight;
    struct breaker_state breaker;
    TAILQ_HEAD(slot_waiters, slot_waiter) waiters;
    struct partition **table;     /* partitions: hash table + LRU */
    size_t table_size, n_parts;
    TAILQ_HEAD(partition_lru_head, partition) lru;
};

struct pacing {
    struct policy_state **pol;    /* one per config policy */
    size_t n;
    struct policy_state *dflt;    /* the default policy */
};

/* States for cfg's policies; those whose name and numbers (rate, burst,
 * concurrency, partition) match a policy of prev (may be NULL) are shared
 * with it rather than made anew. */
int pacing_init(struct pacing *pc, const struct sc_config *cfg,
                const struct pacing *prev);
void pacing_free(struct pacing *pc);
void pacing_state_put(struct policy_state *ps);

/* An upstream asked for nothing before `until` (monotonic ns): the bucket is
 * emptied and paused until then, so it resumes empty. A later moment wins
 * over an earlier one, and so does its `why`. */
void bucket_pause(struct bucket *b, uint64_t now, uint64_t until,
                  enum pause_why why);

/* "upstream_429", "breaker" or "restored". */
const char *pause_why_name(enum pause_why why);

/* Calls fn for each pause of ps still running at now (monotonic ns): the
 * policy's own bucket (partition NULL), then its partitions'. Partitions are
 * walked under the policy's lock: fn must not call into pacing. */
typedef void (*pause_fn)(void *arg, const char *partition, uint64_t until,
                         enum pause_why why);
void pacing_pauses(struct policy_state *ps, uint64_t now, pause_fn fn, void *arg);

/* Ends every pause of ps (its bucket's and its partitions') at now; each
 * resumes empty. Returns how many were running. */
size_t pacing_resume(struct policy_state *ps, uint64_t now);

/* The state for a route's policy index (-1 = default). */
struct policy_state *pacing_policy(struct pacing *pc, long idx);

/* The bucket a request uses: its partition's when the policy is partitioned
 * (created full while there is room; beyond `max` the least recently used is
 * evicted and the new one starts empty), else the policy's. NULL when the policy has no bucket. The pointer stays
 * valid until pacing_free (evicted partitions are recycled, never freed). */
struct bucket *pacing_bucket(struct policy_state *ps, const char *partition,
                             uint64_t now);

/* Concurrency: true when a slot was taken at once (or there is no limit).
 * Otherwise w is queued (FIFO) and its event fires when a slot is handed
 * over. */
bool pacing_slot_acquire(struct policy_state *ps, struct slot_waiter *w);
/* Takes w out of the queue; false when it was granted meanwhile (then the
 * slot is the caller's and must be released). */
bool pacing_slot_cancel(struct policy_state *ps, struct slot_waiter *w);
/* Frees a slot, handing it to the oldest waiter if any. */
void pacing_slot_release(struct policy_state *ps);
uint32_t pacing_inflight(struct policy_state *ps);

#endif
