/* Lanes (a policy's `lanes`, docs/configuration.md): the requests waiting
 * for the policy's permits in several queues, each with a share of the
 * permits while it has requests waiting. Pure: no clock of its own, no
 * locks (the caller holds the policy's), no allocation per request (the
 * waiter nodes are the caller's, intrusive).
 *
 * Which lane's head gets the next permit is stride scheduling: each lane
 * has a stride inversely proportional to its share and a pass; the permit
 * goes to the lane with waiters whose pass is least (ties: the earlier
 * lane), and that lane's pass grows by its stride. So among the lanes with
 * waiters each gets permits in proportion to its share (30 % and 70 %: 3
 * and 7 of every 10, interleaved, never 7 in a row), a lane alone gets
 * every one (work-conserving), and a 1 % lane is served once per about 100
 * permits whatever the others hold (no starvation). A lane that becomes
 * non-empty takes the pass max(its own, the pass last served): it gains no
 * credit while empty, and a lane served a moment ago that empties and fills
 * again keeps the stride it owes. Chosen over deficit round robin, which
 * gives the same long-run shares but serves each lane's quantum in a burst
 * (an interactive request waits behind 7 batch permits), and whose position
 * of a newcomer is not one formula: here the permits until a newcomer is
 * served follow from the passes (lanes_permits_until). */
#ifndef SLUICE_POLICIES_LANES_H
#define SLUICE_POLICIES_LANES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>

#include "config/config.h"
#include "policies/tbucket.h"

/* A request waiting in a lane; owned by the request, valid while queued. */
struct lane_waiter {
    TAILQ_ENTRY(lane_waiter) link;
    uint32_t lane;
    bool queued;
};

struct lane {
    TAILQ_HEAD(lane_queue, lane_waiter) queue;   /* arrival order */
    uint64_t stride, pass;
    uint64_t max_wait_ns;
    uint32_t share_bp;      /* the share in hundredths of a percent */
    uint32_t waiting;
    uint64_t granted;       /* permits given to this lane so far */
};

struct lanes {
    struct lane *v;
    uint32_t n;
    uint32_t waiting;       /* in every lane together */
    uint64_t vtime;         /* the pass last served */
};

/* Lanes as cfg[0..n) says (shares, max_waits), all empty. 0, -EINVAL (no
 * lane) or -ENOMEM; lanes_free in any case. */
int lanes_init(struct lanes *l, const struct sc_lane *cfg, size_t n);
void lanes_free(struct lanes *l);

/* The lane a request's lane header names: value trimmed of spaces and tabs,
 * then compared exactly with the policy's lane names. -1 when it names none
 * (a 400 listing them, lanes_describe). */
long lanes_find(const struct sc_policy *p, const char *value);

/* "interactive, batch": the policy's lane names, for that 400's detail.
 * Returns buf (cut to len). */
const char *lanes_describe(const struct sc_policy *p, char *buf, size_t len);

/* Nobody waits in any lane. */
static inline bool lanes_idle(const struct lanes *l)
{
    return l->waiting == 0;
}

/* Queues w at the tail of lane (< l->n). */
void lanes_push(struct lanes *l, struct lane_waiter *w, uint32_t lane);

/* Takes w out of its lane (its worker went away, its max_wait is up); false
 * when it was not queued (already granted). */
bool lanes_remove(struct lanes *l, struct lane_waiter *w);

/* Dequeues the waiter that gets the next permit; NULL when none waits. */
struct lane_waiter *lanes_pop(struct lanes *l);

/* The permits the policy's bucket must yield, from now, until a request
 * joining lane now would get its own (included), if the lanes that have
 * waiters keep having them and nobody leaves: its position in its lane and
 * its lane's share among the lanes with waiters, to the permit. */
uint64_t lanes_permits_until(const struct lanes *l, uint32_t lane);

/* The wait of a request joining lane now: lanes_permits_until permits from
 * bucket b (its tokens, then its rate, or fn's outlook: quota_accrue_ns
 * for a policy that follows a quota). Compare with lanes_max_wait_ns. */
uint64_t lanes_predict_ns(const struct lanes *l, uint32_t lane,
                          const struct tbucket *b, uint64_t now,
                          tbucket_accrue_fn fn, const void *arg);

static inline uint64_t lanes_max_wait_ns(const struct lanes *l, uint32_t lane)
{
    return l->v[lane].max_wait_ns;
}

static inline uint32_t lanes_waiting(const struct lanes *l, uint32_t lane)
{
    return l->v[lane].waiting;
}

/* A request that finds a token and nobody waiting goes at once: true when
 * it took the token. Otherwise it joins its lane (lanes_push). */
bool lanes_try_now(const struct lanes *l, struct tbucket *b, uint64_t now);

/* The next waiter to wake with a permit: a token taken from b at now and
 * the waiter it goes to, dequeued. NULL when nobody waits or no token is
 * there (then the next one is tbucket_next_ns away). */
struct lane_waiter *lanes_grant(struct lanes *l, struct tbucket *b,
                                uint64_t now);

#endif
