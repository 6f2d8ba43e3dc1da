/* The rows a plan is made of (plan.c puts them in order): each stage's
 * file exports its rows, and only plan.c names them. */
#ifndef SLUICE_PROXY_EXCHANGE_STAGES_H
#define SLUICE_PROXY_EXCHANGE_STAGES_H

#include "proxy/exchange/stage.h"
#include "util/clock.h"

/* stage_idem.c: the key checked and fingerprinted; the store read (a
 * replay, 422, lease_held) then an in-memory claim; the durable lease as
 * it is forwarded; the commit of the outcome before the worker sees it. */
extern const struct ex_stage stage_key, stage_lookup, stage_lease, stage_commit;

/* stage_permit.c: a permit of the policy's bucket (local, shadow, the
 * fleet's, the fleet's with the key's lookup and lease in one call), and
 * the bucket checked again at the moment of sending. */
extern const struct ex_stage stage_permit, stage_permit_shadow, stage_permit_fleet,
    stage_permit_lease, stage_send_check;

/* stage_permit.c: after permit_lanes, for a fleet (`shared: redis`): the
 * head its lanes picked asks the fleet's bucket for its start. */
extern const struct ex_stage stage_permit_fleet_lanes;

/* stage_lanes.c: a policy with lanes: the request's lane (its route's, or
 * the lane header's: 400 when it names none), and a permit granted when it
 * falls due, among the lanes that have requests waiting. */
extern const struct ex_stage stage_lane, stage_permit_lanes;

/* stage_lanes.c: a shadow policy with lanes or a followed quota: forwarded
 * at once, what its lane would have done remembered (ex->shadow). */
extern const struct ex_stage stage_permit_shadow_lanes;

/* stage_quota.c: what an answer of a policy that follows its quota
 * advertises sets the rate its permits are granted at. */
extern const struct ex_stage stage_quota;

/* stage_permit.c's services to the permit rows of other files: the
 * request's bucket (its partition's, held until its end: false when none is
 * free, and the answer is decided), its release, and the refusal of a
 * request whose permit would come at start_ns. */
bool ex_take_bucket(struct exchange *ex, uint64_t now);
/* The request's partition value when its bucket is a partition's (the
 * fleet's keys name it), else NULL. */
const char *ex_partition(const struct exchange *ex);
void ex_bucket_release(struct exchange *ex, enum ex_release how);
enum ex_verdict ex_refuse_rate(struct exchange *ex, uint64_t start_ns, uint64_t now);

/* stage_slot.c: a concurrency slot (this sidecar's, or the fleet's), and
 * the count of requests in flight; for a fleet's lanes, the fleet's slot
 * asked by the request the shares pick among this sidecar's waiters. */
extern const struct ex_stage stage_slot, stage_slot_fleet, stage_slot_fleet_lanes;

/* stage_upstream.c: the request sent, until its head or failure decides
 * the answer; then the body held (to store, or to send whole) or dropped. */
extern const struct ex_stage stage_upstream, stage_upstream_body;

/* stage_feedback.c: what the upstream's answer tells the policy: a 429's
 * cooldown, the breaker's streak. */
extern const struct ex_stage stage_feedback, stage_feedback_fleet;

/* stage_idem.c: duplicates: wait (contract §6). The request was answered
 * lease_held: true when it should instead look at the key again at
 * ex->wake_at (the answer undone, ex->dup_waiting set), within max_wait;
 * false when that answer stands. For every row that meets a held key;
 * in_store: the lease is the store's (its fence: the record's), not an
 * in-memory claim, so its end may be announced (fleet mode): the request
 * then waits for that notice, looking every 25 ms only as the fallback. */
bool ex_wait_for_holder(struct exchange *ex, uint64_t now, bool in_store,
                        uint64_t fence);
/* What a look at the key (ex->scall: a get or a watch) found: true when the
 * key is free; false when it answers the request (a replay, 422, a failed
 * store, or a live lease: lease_held, for ex_wait_for_holder). */
bool ex_looked_up(struct exchange *ex);
/* After ex_looked_up answered: the answer made final (a held lease whose
 * holder is another process looked at first, stage_idem.c), or the wait
 * for the holder; call it again while it answers EXV_WAIT with
 * ex->holder_looking. */
enum ex_verdict ex_not_free(struct exchange *ex, uint64_t now);
/* Starts a watch of the key (store_watch_async) into ex->scall. */
int ex_start_watch(struct exchange *ex);
/* The request stops waiting for a holder: out of the loop's waiters. */
void ex_dup_leave(struct exchange *ex);
/* ... and its notice's event freed (a row's release). */
void ex_dup_release(struct exchange *ex);

/* The wait for a permit and a slot starts at the first row that paces and
 * ends at max_wait; the rows after it count from the same moment. */
static inline void ex_begin_wait(struct exchange *ex, uint64_t now)
{
    if (ex->wait_start_ns)
        return;
    ex->wait_start_ns = now;
    ex->wait_deadline_ns = now + ex->max_wait_ns;
}

#endif
