/* Permits granted when they fall due (a policy's `lanes`, docs/contract.md
 * §13), rather than reserved at arrival as GCRA does (pacing.h): one per
 * bucket (the policy's, or a partition's) of a policy with lanes, behind a
 * lock of its own, shared by every loop.
 *
 * A request that finds a token and nobody waiting goes at once. Otherwise
 * it waits in its lane (policies/lanes.h), and each token the bucket
 * (policies/tbucket.h) yields goes, in a grant round, to the lane the
 * stride scheduler picks, to that lane's oldest waiter. No thread sleeps
 * and no timer runs per policy: one of the waiters is the *keeper*, whose
 * own timer is set for the moment the next token falls due; its wake-up
 * runs the round, which wakes each waiter it grants (their `wake`, from
 * any thread) and, when the keeper itself was granted or left, names
 * another waiter keeper and wakes it to take the timer on. So a permit
 * costs one lock and one wake-up, whatever the number of waiters.
 *
 * A policy that follows its partner's quota (`quota: {follow: true}`,
 * §12) paces the same way, with one lane when it has none: the bucket's
 * rate and capacity follow policies/quota.c, which every answer of the
 * policy feeds (permits_answered), so each permit is granted at the rate
 * in force when it is granted.
 *
 * A reload that changes the policy's numbers or lanes hands the state over
 * (permits_hand_over): the tokens (clamped to the new burst), the pause and
 * the waiters, each to the lane of the same name (else the last lane), in
 * their order; calls on the old state go on to the new one. */
#ifndef SLUICE_PACING_PERMITS_H
#define SLUICE_PACING_PERMITS_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"
#include "policies/lanes.h"
#include "policies/quota.h"
#include "policies/tbucket.h"

/* A request waiting for its permit; owned by the request. `wake` runs under
 * the permits' lock, from any thread, when the waiter was granted or made
 * keeper: it must not call back into the permits (the exchange's
 * event_active()s its event). */
struct permit_waiter {
    struct lane_waiter lw;
    void (*wake)(struct permit_waiter *w);
    void *arg;
    bool granted;       /* the permit is its own */
    bool keeper;        /* its timer runs the next round */
};

struct permits {
    pthread_mutex_t mu;
    struct tbucket tb;
    struct lanes lanes;
    struct permit_waiter *keeper;
    const struct sc_lane *cfg;  /* the policy state's copy: names */
    struct permits *next;       /* handed over to (a reload); under mu */
    uint32_t *lane_map;         /* with next: this lane index -> next's */
    bool follow;                /* the rate follows `quota` */
    struct quota quota;
    uint32_t flight;            /* granted and not answered yet */
    uint32_t held;              /* of those, waiting for a start the fleet's
                                   bucket reserved: not sent upstream yet, so
                                   not among the f of the quota's rule */
    uint64_t top_up_ms;         /* the Unix ms of the latest answer that
                                   topped the bucket up (one permit left) */
    uint32_t top_up_f;          /* the fleet's requests in flight it was read
                                   with */
    uint32_t flight_scale;      /* a fleet's (0 or 1: this sidecar's): the
                                   fleet's requests in flight are counted as
                                   this sidecar's times the fleet's size,
                                   since the others' are not seen here */
};

/* What GET /policies shows of one bucket. */
struct permits_view {
    double rate;                /* effective, permits per second */
    uint32_t capacity;          /* effective burst */
    bool limited;               /* advertised numbers hold the rate down */
    struct quota quota;         /* a copy: what was advertised */
    uint64_t top_up_ms;         /* permits.top_up_ms ... */
    uint32_t top_up_f;          /* ... and top_up_f */
};

/* What an ask or a poll found. */
enum permit_ask {
    PERMIT_GO = 0,      /* the permit is the request's */
    PERMIT_WAIT,        /* it waits in its lane */
    PERMIT_REFUSED,     /* its predicted wait exceeds what it may wait */
};

/* A full bucket of rate and burst at now, lanes as cfg[0..n) says (cfg
 * must outlive pm). 0 or -ENOMEM; permits_free in any case. */
int permits_init(struct permits *pm, const struct sc_lane *cfg, size_t n,
                 double rate, uint32_t burst, uint64_t now);
/* From now on the rate follows what the partner advertises, within
 * [min_rate, rate]. Before the permits are shared. */
void permits_follow(struct permits *pm, double min_rate);

/* A request sent without a permit (a shadow policy's: it did not wait) is
 * in flight as a granted one is, until permits_answered. */
void permits_flying(struct permits *pm);

/* A request granted by these permits was answered (its head read, or its
 * failure, or it left unsent): it is no longer in flight. With h (a
 * response's quota headers; NULL: none to read) and a policy that follows
 * its quota, the advertised numbers are read at now (wall_ms, the Unix
 * time) into the rate, with fleet_flight the fleet's requests in flight
 * (the f of the rule; -1: unknown, so this sidecar's times flight_scale);
 * res (may be NULL) says what they did. */
void permits_answered(struct permits *pm, const struct quota_headers *h,
                      uint64_t now, uint64_t wall_ms, int64_t fleet_flight,
                      struct quota_result *res);

/* A granted request waits (hold) for the start the fleet's bucket
 * reserved, or that wait ended (!hold): sent upstream or leaving. Call
 * each once per request, the end before permits_answered. */
void permits_hold(struct permits *pm, bool hold);

/* The bucket's effective numbers and what was advertised, at now. */
void permits_view(struct permits *pm, uint64_t now, struct permits_view *v);
void permits_free(struct permits *pm);

/* A reload from a policy paced by GCRA: the level it had (tbucket_set_level). */
void permits_set_level(struct permits *pm, uint64_t now, uint32_t whole,
                       uint64_t next_ns);

/* An evicted partition's bucket comes back empty, never full. */
void permits_set_empty(struct permits *pm, uint64_t now);

/* A request of `lane` asks at now, and may wait max_wait_ns. GO: it took a
 * token. WAIT: w is queued; *at is when to look again (the next round's
 * moment when w keeps time, else 0: only its own deadline). REFUSED: *at
 * is the predicted wait (ns) from now. */
enum permit_ask permits_ask(struct permits *pm, struct permit_waiter *w,
                            uint32_t lane, uint64_t now, uint64_t max_wait_ns,
                            uint64_t *at);

/* w woke (its timer or its wake): GO when granted; else WAIT, and *at as
 * permits_ask's (a keeper runs the round first). */
enum permit_ask permits_poll(struct permits *pm, struct permit_waiter *w,
                             uint64_t now, uint64_t *at);

/* w gives up (its max_wait, its worker gone, the drain): false when it was
 * granted meanwhile (the permit is spent). *delay_ns (may be NULL): the
 * wait predicted now for a request of its lane. */
bool permits_leave(struct permits *pm, struct permit_waiter *w, uint64_t now,
                   uint64_t *delay_ns);

/* The bucket's feedback (pacing.c's bucket_empty, bucket_pause,
 * bucket_resume): emptied at now; paused until `until`; a pause ended. A
 * pause or a resume wakes the keeper, whose moment has moved. */
void permits_empty(struct permits *pm, uint64_t now);
void permits_pause(struct permits *pm, uint64_t now, uint64_t until);
void permits_resume(struct permits *pm, uint64_t now);

/* Whole tokens at now and the ns until the next when none (RateLimit
 * headers, gauges). */
uint32_t permits_available(struct permits *pm, uint64_t now, uint64_t *next_ns);

/* Requests waiting in lane i (< n) now, for GET /policies. */
uint32_t permits_waiting(struct permits *pm, uint32_t lane);

/* A reload: `to` (not reachable by another thread yet) takes pm's tokens
 * (clamped to its capacity, never raised), pause and waiters; every later
 * call on pm goes on to `to`. 0 or -ENOMEM (then nothing moved: pm goes on
 * alone, and the send check still bounds what leaves). */
int permits_hand_over(struct permits *pm, struct permits *to, uint64_t now);

#endif
