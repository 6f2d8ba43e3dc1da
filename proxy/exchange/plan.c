/* A policy's plans, row by row: where the order of the stages is written
 * down, and the one place that names them. A request runs
 *
 *   keyed:  key, lookup, permit, slot, send check, lease, upstream,
 *           feedback, upstream body, commit
 *   plain:  permit, slot, send check, upstream, feedback, upstream body
 *
 * with each row present only where the policy needs it: no permit, send
 * check or feedback without a rate; a policy with lanes starts with the
 * lane row and paces with slot, permit_lanes, send check (permits granted
 * as they fall due, among its lanes; for a fleet, permit_fleet_lanes after
 * permit_lanes: the head asks the fleet's bucket), and so does one that
 * follows its partner's quota, whose answers go through the quota row after
 * upstream; for a fleet with `concurrency`, the fleet's slot in the slot's
 * place (slot_fleet_lanes: its askers ordered by the lanes). The shadow permit in shadow mode (permit_shadow_lanes
 * with lanes or a followed quota, which keeps its lane and quota rows: they
 * say what enforcing would have done); the fleet's permit and slot for
 * `shared: redis` on a store that shares them, where a keyed request's
 * lookup and lease ride in its permit's call (permit_lease) and have no
 * rows of their own. A slot row is always there: it counts the requests in
 * flight. */
#include "proxy/exchange/plan.h"

#include "proxy/exchange/stages.h"

static void add(struct ex_plan *pl, const struct ex_stage *row)
{
    if (pl->n < EX_PLAN_MAX)
        pl->row[pl->n++] = row;
}

struct shape {
    bool keyed, rate, shadow, fleet, lanes, grants, follow;
};

static void pacing_rows(struct ex_plan *pl, const struct sc_policy *p,
                        const struct shape *s)
{
    if (s->grants) {
        /* A slot is taken before the request joins its lane (contract
         * §13): a permit granted is sent at once, not held for a slot, and
         * a followed quota's count of requests in flight (its f) holds no
         * request waiting for one. */
        add(pl, s->fleet && p->concurrency ? &stage_slot_fleet_lanes : &stage_slot);
        add(pl, &stage_permit_lanes);
        if (s->fleet)
            add(pl, &stage_permit_fleet_lanes);
        add(pl, &stage_send_check);
        return;
    }
    if (s->rate && s->shadow && (s->lanes || s->follow))
        add(pl, &stage_permit_shadow_lanes);
    else if (s->rate && s->shadow)
        add(pl, &stage_permit_shadow);
    else if (s->rate && s->fleet)
        add(pl, s->keyed ? &stage_permit_lease : &stage_permit_fleet);
    else if (s->rate)
        add(pl, &stage_permit);
    add(pl, s->fleet && !s->shadow && p->concurrency ? &stage_slot_fleet : &stage_slot);
    if (s->rate && !s->shadow)
        add(pl, &stage_send_check);
}

static void build(struct ex_plan *pl, const struct sc_policy *p, const struct shape *s)
{
    /* The fleet's permit takes the key's lease itself, except after lanes:
     * a replay is answered before the request joins a lane. */
    bool lease_rows = s->keyed && !(s->rate && s->fleet && !s->shadow && !s->grants);

    pl->n = 0;
    if (s->lanes)
        add(pl, &stage_lane);
    if (s->keyed)
        add(pl, &stage_key);
    if (lease_rows)
        add(pl, &stage_lookup);
    pacing_rows(pl, p, s);
    if (lease_rows)
        add(pl, &stage_lease);
    add(pl, &stage_upstream);
    if (s->follow)
        add(pl, &stage_quota);
    if (s->rate)
        add(pl, s->fleet ? &stage_feedback_fleet : &stage_feedback);
    add(pl, &stage_upstream_body);
    if (s->keyed)
        add(pl, &stage_commit);
}

void ex_plans_build(const struct sc_policy *p, bool store_shares,
                    struct ex_plans *out)
{
    struct shape s = {
        .rate = p->has_rate,
        .shadow = p->mode == SC_MODE_SHADOW,
        .fleet = p->shared == SC_SHARED_REDIS && store_shares,
    };

    /* Lanes order this sidecar's waiters, of its bucket or the fleet's
     * (store_shares false: no fleet, this sidecar's bucket), and so does a
     * followed quota; in shadow mode nothing waits, and they only say what
     * enforcing would have done. */
    s.lanes = s.rate && p->n_lanes;
    s.follow = s.rate && p->quota.enabled && p->quota.follow;
    s.grants = (s.lanes || s.follow) && !s.shadow;

    build(&out->plain, p, &s);
    s.keyed = p->idem.enabled;
    build(&out->keyed, p, &s);
}
