/* The rows of a policy with lanes (docs/contract.md §13).
 *
 * lane: the request's lane is its route's (default: the policy's last),
 * unless the policy's lane header names another; a header that names no
 * lane is a 400 listing them, before any key is claimed or permit taken.
 * The lane's max_wait becomes the request's.
 *
 * permit_lanes: instead of a start reserved at arrival (stage_permit.c's
 * GCRA), a permit granted when it falls due (pacing/permits.h): at once
 * when a token is there and nobody waits, else the request waits in its
 * lane until a grant round hands it one, or its predicted wait is refused
 * at once, or its max_wait ends the wait with the delay predicted then. */
#include <event2/event.h>

#include "policies/lanes.h"
#include "proxy/exchange/stages.h"

/* ---- lane ------------------------------------------------------------------- */

static enum ex_verdict lane_run(struct exchange *ex, uint64_t now)
{
    const struct sc_policy *p = ex->pol;
    long i = ex->route && ex->route->lane_index >= 0 ? ex->route->lane_index
                                                    : (long)p->n_lanes - 1;
    char names[160];

    (void)now;
    if (ex->lane_value && (i = lanes_find(p, ex->lane_value)) < 0) {
        ex_refuse(ex, 400, OUT_REJECTED, R_MALFORMED_REQUEST,
                  "%s: \"%.40s\" names no lane of policy %s (its lanes: %s)",
                  p->lane_header, ex->lane_value, p->name,
                  lanes_describe(p, names, sizeof names));
        return EXV_ANSWER;
    }
    ex->has_lane = true;
    ex->lane = (uint32_t)i;
    ex->max_wait_ns = p->lanes[i].max_wait_ms * NS_PER_MS;
    return EXV_NEXT;
}

const struct ex_stage stage_lane = {
    .name = "lane",
    .run = lane_run,
    .flags = STAGE_WATCH,
};

/* ---- permit_lanes ------------------------------------------------------------ */

/* From the thread whose round granted the permit (or named this request
 * keeper), under the permits' lock. */
static void on_permit(struct permit_waiter *w)
{
    struct exchange *ex = w->arg;

    event_active(ex->permit_ev, EV_TIMEOUT, 0);
}

/* No wake-up of ours may run once the row is left: one that came with a
 * grant the timer saw first is dropped. */
static void stop_waiting(struct exchange *ex)
{
    ex->permit_waiting = false;
    event_del(ex->permit_ev);
}

static enum ex_verdict granted(struct exchange *ex, uint64_t now)
{
    stop_waiting(ex);
    ex->pm_flight = true;
    ex->permit_at = now;
    /* The slot before it included: the whole wait inside sluice. */
    ex->permit_wait_ns = now - ex->wait_start_ns;
    return EXV_NEXT;
}

/* Until the round it keeps time for (at), else its deadline. */
static enum ex_verdict wait_lane(struct exchange *ex, uint64_t at)
{
    ex->permit_waiting = true;
    ex->wake_at = at && at < ex->wait_deadline_ns ? at : ex->wait_deadline_ns;
    return EXV_WAIT;
}

static enum ex_verdict ask(struct exchange *ex, uint64_t now)
{
    uint64_t at = 0, left;

    if (!ex->permit_ev &&
        !(ex->permit_ev = event_new(ex->env->base, -1, 0, ex_event_cb, ex))) {
        ex_refuse(ex, 500, OUT_REJECTED, R_INTERNAL, "out of memory");
        return EXV_ANSWER;
    }
    if (!ex_take_bucket(ex, now))
        return EXV_ANSWER;
    ex->pwait.wake = on_permit;
    ex->pwait.arg = ex;
    left = ex->wait_deadline_ns > now ? ex->wait_deadline_ns - now : 0;
    switch (permits_ask(ex->bucket->pm, &ex->pwait, ex->lane, now, left, &at)) {
    case PERMIT_GO:
        return granted(ex, now);
    case PERMIT_REFUSED:
        return ex_refuse_rate(ex, now + at, now);
    default:
        return wait_lane(ex, at);
    }
}

/* Woken by a grant, by the keeper's role, or by its timer (the round it
 * keeps time for, or its max_wait's end). */
static enum ex_verdict woken(struct exchange *ex, uint64_t now)
{
    uint64_t at = 0;

    if (now >= ex->wait_deadline_ns) {
        if (!permits_leave(ex->bucket->pm, &ex->pwait, now, &at))
            return granted(ex, now); /* the grant raced the deadline */
        stop_waiting(ex);
        return ex_refuse_rate(ex, now + at, now);
    }
    if (permits_poll(ex->bucket->pm, &ex->pwait, now, &at) == PERMIT_GO)
        return granted(ex, now);
    return wait_lane(ex, at);
}

static enum ex_verdict permit_lanes_run(struct exchange *ex, uint64_t now)
{
    return ex->woke == WOKE_FIRST ? ask(ex, now) : woken(ex, now);
}

/* A request that leaves its lane (its worker gone, the drain) is taken out
 * of it; a permit granted meanwhile is spent, as a reserved start is. */
static void permit_lanes_release(struct exchange *ex, enum ex_release how)
{
    if (ex->permit_waiting) {
        permits_leave(ex->bucket->pm, &ex->pwait,
                      ex->env->clock->mono_ns(ex->env->clock->arg), NULL);
        stop_waiting(ex);
    }
    if (ex->pm_held) {
        permits_hold(ex->bucket->pm, false);
        ex->pm_held = false;
    }
    if (ex->pm_flight) {
        /* Never sent, or answered without a quota row: out of flight. */
        permits_answered(ex->bucket->pm, NULL,
                         ex->env->clock->mono_ns(ex->env->clock->arg), 0, -1, NULL);
        ex->pm_flight = false;
    }
    if (how == REL_END && ex->permit_ev) {
        event_free(ex->permit_ev);
        ex->permit_ev = NULL;
    }
    ex_bucket_release(ex, how);
}

const struct ex_stage stage_permit_lanes = {
    .name = "permit_lanes",
    .run = permit_lanes_run,
    .release = permit_lanes_release,
    .drain = ex_drain_unsent,
    .flags = STAGE_WATCH,
};

/* ---- permit_shadow_lanes ----------------------------------------------------- */

/* Shadow mode (contract §5): forwarded at once; what its lane would have
 * done (policies/shadowlanes.h) is remembered for the count and the log:
 * a wait in its lane is permit_wait, a wait beyond its lane's max_wait the
 * rate_limited refusal, both at the effective rate (a followed quota's).
 * It is counted in flight, so the quota row reads its answer and counts it
 * out, as a granted permit's. */
static enum ex_verdict shadow_lanes_run(struct exchange *ex, uint64_t now)
{
    uint64_t wait;

    if (!ex_take_bucket(ex, now))
        return EXV_ANSWER;
    if (!ex->bucket->pm)
        return EXV_NEXT; /* a reload gave it a bucket without lanes */
    switch (bucket_shadow_reserve(ex->bucket, ex->has_lane ? ex->lane : 0, now,
                                  ex->max_wait_ns, ex->ps->fleet_n, &wait)) {
    case SL_REFUSED:
        ex->shadow = SHADOW_RATE_LIMITED;
        break;
    case SL_WAIT:
        ex->shadow = SHADOW_PERMIT_WAIT;
        break;
    default:
        break;
    }
    permits_flying(ex->bucket->pm);
    ex->pm_flight = true;
    return EXV_NEXT;
}

static void shadow_lanes_release(struct exchange *ex, enum ex_release how)
{
    if (ex->pm_flight) {
        permits_answered(ex->bucket->pm, NULL,
                         ex->env->clock->mono_ns(ex->env->clock->arg), 0, -1, NULL);
        ex->pm_flight = false;
    }
    ex_bucket_release(ex, how);
}

const struct ex_stage stage_permit_shadow_lanes = {
    .name = "permit_shadow_lanes",
    .run = shadow_lanes_run,
    .release = shadow_lanes_release,
    .flags = STAGE_WATCH,
};
