/* What lanes and a followed quota would have done to a request that a
 * shadow policy (`mode: shadow`, docs/contract.md §5) forwards at once:
 * nothing waits, so the lane queues enforce would have built exist only
 * here, as a virtual clock per lane. Pure: no clock of its own, no locks
 * (the caller holds its bucket's), no allocation after init.
 *
 * Each lane has a TAT (theoretical arrival time, as GCRA's): a request of
 * lane i would have started at max(now, TAT_i - tau_i) and moves TAT_i on
 * by one permit interval at i's share among the lanes whose TAT is still
 * ahead (busy: they would have had requests waiting), i.e. interval x S /
 * share_i, S the shares of the busy lanes and i's together. So a lane alone
 * gets the whole rate (work-conserving, as the stride scheduler of
 * policies/lanes.h), lanes that are all busy get their shares, and a
 * lane's wait depends on its own backlog, not on the others'. tau_i is the
 * policy's burst tolerance at the same share. A start beyond the lane's
 * max_wait is what enforce would have refused (requeue / rate_limited);
 * refused requests move no clock, as a refused GCRA reservation does.
 *
 * It is an estimate of the enforcing scheduler, not a replay of it: the
 * stride scheduler hands out whole permits in turn, this clock slices the
 * rate; the two agree on each lane's throughput and on which lane would
 * have waited, to about one permit interval. The interval is the
 * effective rate's (a followed quota's, policies/quota.h) at each request,
 * so a partner's lowered quota shows as refusals here too. */
#ifndef SLUICE_POLICIES_SHADOWLANES_H
#define SLUICE_POLICIES_SHADOWLANES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"

struct shadow_lanes {
    uint64_t *tat;          /* per lane, monotonic ns; 0: never used */
    uint32_t *share_bp;     /* the share in hundredths of a percent */
    uint32_t n;
};

/* What enforcing would have done. */
enum shadow_lane_verdict {
    SL_GO = 0,      /* sent at once */
    SL_WAIT,        /* sent after *wait_ns in its lane */
    SL_REFUSED,     /* refused: its wait, *wait_ns, beyond its max_wait */
};

/* The lanes cfg[0..n) (their shares), all idle. 0, -EINVAL (no lane) or
 * -ENOMEM; shadow_lanes_free in any case. */
int shadow_lanes_init(struct shadow_lanes *s, const struct sc_lane *cfg, size_t n);
void shadow_lanes_free(struct shadow_lanes *s);

/* A request of `lane` (< n) at now, at a permit every interval_ns (> 0)
 * with a burst tolerance of tau_ns ((capacity - 1) x interval), that may
 * wait max_wait_ns; not before not_before (a pause's end; 0: none). */
enum shadow_lane_verdict shadow_lanes_reserve(struct shadow_lanes *s, uint32_t lane,
                                              uint64_t now, uint64_t interval_ns,
                                              uint64_t tau_ns, uint64_t max_wait_ns,
                                              uint64_t not_before, uint64_t *wait_ns);

#endif
