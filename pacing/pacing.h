/* Runtime state of the policies (docs/contract.md §5): one bucket per policy (or
 * per partition), shared by every thread; cooldowns; the concurrency limit
 * with a FIFO of waiters that may sit on any thread's loop. The config stays
 * immutable; this is the mutable part that lives beside it. */
#ifndef SLUICE_PACING_PACING_H
#define SLUICE_PACING_PACING_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>

#include "config/config.h"
#include "policies/breaker.h"
#include "policies/gcra.h"
#include "pacing/permits.h"
#include "policies/shadowlanes.h"

/* Why a bucket is paused, for GET /cooldowns. A pause put back from the
 * store after a restart is `restored`: the store keeps its end, not its
 * cause. */
enum pause_why { PAUSE_NONE = 0, PAUSE_UPSTREAM_429, PAUSE_BREAKER, PAUSE_RESTORED,
                 PAUSE_QUOTA /* an advertised r = 0 (quota.follow) */ };

/* A bucket and the cooldown an upstream imposed on it. `g` reserves start
 * times in arrival order (and decides max_wait); `sent`, with the same
 * numbers, is checked again at the moment a request is really handed to the
 * upstream: timers that fire late and together (a starved CPU) would
 * otherwise send late and on-time requests back to back, and the bound
 * burst + rate x t must hold where requests leave, not only where they are
 * scheduled.
 *
 * A reload that changes the policy's numbers hands the bucket over to the
 * new state's (pacing_commit): its TATs re-rated (gcra_rerate), its pause
 * and holders moved, and every later call on it goes on to `next`, so a
 * request of the old config still paces, pauses and counts where the new
 * one does. A field handed over holds PACING_MOVED (of its width). */
#define PACING_MOVED64 UINT64_MAX
#define PACING_MOVED32 UINT32_MAX

struct bucket {
    struct gcra g;
    struct gcra sent;
    _Atomic uint64_t cooldown_until; /* monotonic ns; 0 = none */
    _Atomic int cooldown_why;        /* enum pause_why of the latest pause */
    _Atomic uint32_t holders;        /* a partition's: requests holding it */
    bool partition;                  /* a partition's (pacing_bucket_put) */
    struct permits *pm;              /* a policy with lanes: permits granted
                                        as they fall due (permits.h), not
                                        reserved on g; else NULL */
    struct bucket_shadow *shadow;    /* with pm: the lane clocks of mode:
                                        shadow (bucket_shadow_reserve) */
    struct bucket *next;             /* where a handed-over one went */
};

/* A request waiting for a concurrency slot. Owned by its waiter, whose
 * on_grant is called (from any thread, under the policy's lock: it must
 * not call into pacing) when the slot is handed over; the exchange's wakes
 * its request on its own loop. */
struct slot_waiter {
    void (*on_grant)(struct slot_waiter *w);
    void *arg;
    bool queued, granted;
    uint32_t lane;                  /* a policy with lanes: the request's */
    TAILQ_ENTRY(slot_waiter) link;  /* a policy without lanes: arrival order */
    struct lane_waiter lw;          /* one with lanes: its lane's queue */
};

struct partition;

/* Refcounted: a reload hands the state of a policy whose numbers did not
 * change to the new config, so its bucket, cooldown and partitions carry on
 * while requests of the old config finish on the same state. One whose
 * numbers changed is made anew and takes the old one over (pacing_commit):
 * bucket levels, pauses, partitions, breaker streak, requests in flight and
 * waiters; the old one then forwards to it (`next`). The numbers are copied
 * in, since the config they came from may go first. */
struct policy_state {
    atomic_long refs;
    char *name;
    double rate;
    uint32_t burst, concurrency, partition_max;
    char *partition_header;       /* NULL = not partitioned */
    bool has_bucket;
    struct sc_lane *lanes;        /* a copy of the policy's (names too), or
                                     NULL: its buckets grant permits as they
                                     fall due (struct bucket's pm) */
    size_t n_lanes;               /* a policy that follows its quota
                                     without lanes has one, named "" */
    bool follow;                  /* quota.follow: the rate is the partner's */
    double min_rate;              /* quota.min_rate */
    bool shared;                  /* shared: redis: the numbers above are
                                     this sidecar's fallback share */
    atomic_bool fallback;         /* shared, and the fleet's bucket or
                                     slots did not answer: local numbers */
    uint64_t fleet_t_ns, fleet_tau_ns; /* shared: the fleet's bucket, as the
                                     policy states it (policies/gcra.h) */
    double fleet_rate;            /* shared: the fleet's numbers, undivided:
                                     a fleet's lanes order this sidecar's */
    uint32_t fleet_burst;         /* waiters at them (contract §13) */
    uint32_t fleet_n;             /* shared: the fleet's size; else 1 */
    struct bucket bucket;         /* unpartitioned */
    pthread_mutex_t mu;           /* slots and partitions */
    _Atomic uint32_t inflight;
    struct breaker_state breaker;
    TAILQ_HEAD(slot_waiters, slot_waiter) waiters;
    struct lanes slot_lanes;      /* with `lanes`: the slot waiters, whose
                                     slots follow the shares as permits do */
    struct lanes turn_lanes;      /* with lanes and the fleet's slots: the
                                     requests waiting for their turn to ask
                                     the fleet for a slot (pacing_turn_take) */
    bool turn_held;               /* a request of ps has the turn */
    struct partition **table;     /* partitions: hash table + LRU */
    size_t table_size, n_parts;
    TAILQ_HEAD(partition_lru_head, partition) lru;
    bool parts_full;              /* under mu: a new partition found none
                                     free (logged when it starts and ends) */
    struct policy_state *_Atomic next; /* handed over to (a reference) */
    struct policy_state *takes_over;   /* until pacing_commit: the previous
                                     config's state of this policy */
};

struct pacing {
    struct policy_state **pol;    /* one per config policy */
    size_t n;
    struct policy_state *dflt;    /* the default policy */
};

/* States for cfg's policies (and its default policy); those whose name and
 * numbers (rate, burst, concurrency, partition) match a policy of prev (may
 * be NULL) are shared with it rather than made anew. A new one for a name
 * prev knows takes prev's over at pacing_commit. */
int pacing_init(struct pacing *pc, const struct sc_config *cfg,
                const struct pacing *prev);
/* The config is going into service: each new state takes over the state of
 * the same policy in prev (kept alive by the caller until then), with the
 * tokens it holds (clamped to the new burst, never raised), its pauses,
 * partitions, breaker streak, requests in flight (which count against the
 * new concurrency) and waiters (granted as the new limit allows). */
void pacing_commit(struct pacing *pc, uint64_t now);
void pacing_free(struct pacing *pc);
void pacing_state_put(struct policy_state *ps);

/* The state that carries ps on now: ps, or the one a reload handed it to. */
struct policy_state *pacing_live(struct policy_state *ps);

/* The breaker's streak of ps's policy, where it is counted now. */
struct breaker_state *pacing_breaker(struct policy_state *ps);

/* An upstream asked for nothing before `until` (monotonic ns): the bucket is
 * emptied and paused until then, so it resumes empty. A later moment wins
 * over an earlier one, and so does its `why`. */
void bucket_pause(struct bucket *b, uint64_t now, uint64_t until,
                  enum pause_why why);

/* Whole permits b could give at now, and the ns until the next when none
 * (next_ns may be NULL): its granted permits' tokens, or its GCRA's. */
uint32_t bucket_available(struct bucket *b, uint64_t now, uint64_t *next_ns);

/* Any 429: the bucket is emptied at now (its permits' too). */
void bucket_empty(struct bucket *b, uint64_t now);

/* The end of b's pause (0: none), wherever a reload moved it. */
uint64_t bucket_cooldown(const struct bucket *b);

/* "upstream_429", "breaker", "restored" or "quota". */
const char *pause_why_name(enum pause_why why);

/* Calls fn for each pause of ps still running at now (monotonic ns): the
 * policy's own bucket (partition NULL), then its partitions'. Partitions are
 * walked under the policy's lock: fn must not call into pacing. */
typedef void (*pause_fn)(void *arg, const char *partition, uint64_t until,
                         enum pause_why why);
void pacing_pauses(struct policy_state *ps, uint64_t now, pause_fn fn, void *arg);

/* What GET /policies shows of one live partition of a policy whose
 * buckets grant permits (lanes, quota.follow): its name (cut) and its
 * bucket's view (permits.h). */
#define PACING_PART_NAME_MAX 64
struct partition_view {
    char name[PACING_PART_NAME_MAX];
    struct permits_view v;
};

/* Up to max of ps's live partitions, most recently used first, into out;
 * returns how many were written, and *live (may be NULL) how many there
 * are. None for a policy paced by GCRA alone. */
size_t pacing_partition_views(struct policy_state *ps, uint64_t now,
                              struct partition_view *out, size_t max, size_t *live);

/* Ends every pause of ps (its bucket's and its partitions') at now; each
 * resumes empty. Returns how many were running. */
size_t pacing_resume(struct policy_state *ps, uint64_t now);

/* The state for a route's policy index (-1 = default). */
struct policy_state *pacing_policy(struct pacing *pc, long idx);

/* The bucket a request uses, in *b: its partition's when the policy is
 * partitioned (created full while there is room; beyond `max` the least
 * recently used that is neither held nor paused is recycled, and the new one
 * starts empty), else the policy's; NULL when the policy has no bucket. A
 * partition is held until pacing_bucket_put: while held or paused it is never
 * evicted, so a late 429 pauses the partition it was sent for. -EBUSY: the
 * table is full and every partition in it is held or paused (no bucket). */
int pacing_bucket(struct policy_state *ps, const char *partition, uint64_t now,
                  struct bucket **b);
/* Gives back what pacing_bucket handed out (b may be NULL). */
void pacing_bucket_put(struct bucket *b);

/* Concurrency: true when a slot was taken at once (or there is no limit).
 * Otherwise w is queued (FIFO) and its on_grant runs when a slot is handed
 * over. */
bool pacing_slot_acquire(struct policy_state *ps, struct slot_waiter *w);
/* The same without queueing: false when no slot is free now. */
bool pacing_slot_take(struct policy_state *ps);
/* Takes w out of the queue; false when it was granted meanwhile (then the
 * slot is the caller's and must be released). */
bool pacing_slot_cancel(struct policy_state *ps, struct slot_waiter *w);
/* Frees a slot, handing it to the oldest waiter if the limit allows. */
void pacing_slot_release(struct policy_state *ps);
uint32_t pacing_inflight(struct policy_state *ps);
/* The fleet's slots of a policy with lanes (or a followed quota): one
 * request at a time per policy asks the fleet for a slot, and the turn
 * passes to the waiter the lanes' shares pick (policies/lanes.h), so the
 * fleet's slots this sidecar gets follow its shares. true: w has the turn
 * now. Otherwise w is queued in w->lane and its on_grant runs (under the
 * policy's lock, from any thread) when the turn is handed to it. Without
 * lanes in ps (a reload took them away) every request has it at once. */
bool pacing_turn_take(struct policy_state *ps, struct slot_waiter *w);
/* Takes w out of the turn's queue; false when it was handed the turn
 * meanwhile (then the turn is the caller's to give). */
bool pacing_turn_cancel(struct policy_state *ps, struct slot_waiter *w);
/* The holder is done asking: the turn goes to the next waiter. */
void pacing_turn_give(struct policy_state *ps);

/* Shadow mode with lanes or a followed quota: what the request's lane would
 * have done at now (policies/shadowlanes.h) at b's effective rate divided
 * by share_n (a fleet's size: this sidecar's share; else 1), not before b's
 * pause ends, within max_wait_ns. b must grant permits (b->pm). */
enum shadow_lane_verdict bucket_shadow_reserve(struct bucket *b, uint32_t lane,
                                               uint64_t now, uint64_t max_wait_ns,
                                               uint32_t share_n, uint64_t *wait_ns);

/* Counts one request in flight that waits for no local slot (shadow mode, a
 * fleet slot), for the gauge and against the local limit; given back with
 * pacing_slot_release. */
void pacing_slot_count(struct policy_state *ps);

#endif
