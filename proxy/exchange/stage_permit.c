/* The permit rows: a start from the policy's bucket (GCRA: the start time
 * is reserved at once, the driver's timer wakes the request then), within
 * max_wait, otherwise requeue / rate_limited (or upstream_cooldown) at once;
 * in shadow mode only counted; for `shared: redis` asked of the fleet's
 * bucket in the store (with the key's lookup and lease in the same call
 * for a keyed request); and the send check, the same bucket's numbers at
 * the moment of sending. */
#include <stdio.h>
#include <string.h>

#include "obs/log.h"
#include "proxy/exchange/stages.h"
#include "util/rand.h"

/* A followed quota's request whose sidecar dies leaves the fleet's count
 * of requests in flight this long after its upstream timeout. */
#define FLIGHT_HOLD_MARGIN_MS 5000

/* Refused without waiting: the worker retries once a permit would exist. */
enum ex_verdict ex_refuse_rate(struct exchange *ex, uint64_t start_ns,
                               uint64_t now)
{
    uint64_t cd = bucket_cooldown(ex->bucket);
    enum reason r = cd > now ? R_UPSTREAM_COOLDOWN : R_RATE_LIMITED;

    return ex_refuse_wait(ex, r, (start_ns - now + NS_PER_MS - 1) / NS_PER_MS);
}

/* Every partition of the policy is held by a request in flight or paused,
 * and the table is full: a new value has no bucket to pace on. As for a
 * slot, when one comes free is unknown: back after about a round trip. */
static enum ex_verdict no_partition(struct exchange *ex)
{
    ex_instruct(ex, OUT_REQUEUE, R_RATE_LIMITED, EX_SLOT_RETRY_MS,
                ex_attempts_so_far(ex), 0);
    return EXV_ANSWER;
}

/* The request's bucket (its partition's, held until its end); false when
 * no partition is free, and that answers the request. */
bool ex_take_bucket(struct exchange *ex, uint64_t now)
{
    ex_begin_wait(ex, now);
    if (pacing_bucket(ex->ps, ex->partition, now, &ex->bucket) == 0)
        return true;
    no_partition(ex);
    return false;
}

/* A partition is held until the request ends: a 429 met late still pauses
 * it, and the answer's RateLimit headers read it. */
void ex_bucket_release(struct exchange *ex, enum ex_release how)
{
    if (how != REL_END)
        return;
    pacing_bucket_put(ex->bucket);
    ex->bucket = NULL;
}

static enum ex_verdict local_permit(struct exchange *ex, uint64_t now)
{
    uint64_t start;

    if (!gcra_reserve(&ex->bucket->g, now, ex->max_wait_ns,
                      &start))
        return ex_refuse_rate(ex, start, now);
    ex->permit_at = start;
    if (start <= now)
        return EXV_NEXT;
    ex->wake_at = start;
    return EXV_WAIT;
}

/* The timer: never before the reserved moment (libevent's cached clock may
 * fire a little early, and exactness must not depend on timer precision).
 * A cooldown that began while this request waited came after its
 * reservation: it waits again, after the cooldown, if max_wait allows. */
static enum ex_verdict permit_due(struct exchange *ex, uint64_t now)
{
    uint64_t until = bucket_cooldown(ex->bucket), start;
    uint64_t left = ex->wait_deadline_ns > now ? ex->wait_deadline_ns - now : 0;

    if (now < ex->permit_at) {
        ex->wake_at = ex->permit_at;
        return EXV_WAIT;
    }
    /* A reservation made after the pause already lies beyond it. */
    if (until <= now || ex->permit_at >= until)
        return EXV_NEXT;
    /* The fleet's bucket reserved this start; the pause is this sidecar's
     * news (its own 429), passed on to the fleet: come back after it. */
    if (ex->shared_permit)
        return ex_refuse_wait(ex, R_UPSTREAM_COOLDOWN,
                              (until - now + NS_PER_MS - 1) / NS_PER_MS);
    if (!gcra_reserve(&ex->bucket->g, now, left, &start))
        return ex_refuse_wait(ex, R_UPSTREAM_COOLDOWN,
                              (start - now + NS_PER_MS - 1) / NS_PER_MS);
    ex->permit_at = start;
    ex->wake_at = start;
    return EXV_WAIT;
}

/* ---- this sidecar's bucket ------------------------------------------------ */

static enum ex_verdict permit_run(struct exchange *ex, uint64_t now)
{
    if (ex->woke != WOKE_FIRST)
        return permit_due(ex, now);
    if (!ex_take_bucket(ex, now))
        return EXV_ANSWER;
    return local_permit(ex, now);
}

const struct ex_stage stage_permit = {
    .name = "permit",
    .run = permit_run,
    .release = ex_bucket_release,
    .drain = ex_drain_unsent,
    .flags = STAGE_WATCH,
};

/* Shadow mode: reserve as enforce would (so the bucket tracks real demand)
 * but forward at once, remembering what enforce would have done. */
static enum ex_verdict shadow_run(struct exchange *ex, uint64_t now)
{
    uint64_t start;

    if (!ex_take_bucket(ex, now))
        return EXV_ANSWER;
    if (!gcra_reserve(&ex->bucket->g, now, ex->max_wait_ns,
                      &start))
        ex->shadow = SHADOW_RATE_LIMITED;
    else if (start > now)
        ex->shadow = SHADOW_PERMIT_WAIT;
    return EXV_NEXT;
}

const struct ex_stage stage_permit_shadow = {
    .name = "permit_shadow",
    .run = shadow_run,
    .release = ex_bucket_release,
    .flags = STAGE_WATCH,
};

/* ---- the fleet's bucket (shared: redis) ----------------------------------- */

const char *ex_partition(const struct exchange *ex)
{
    return ex->bucket && ex->bucket->partition ? ex->partition : NULL;
}

static int start_permit(struct exchange *ex)
{
    return store_permit_async(ex->env->store, ex->scall, ex->pol->name,
                              ex_partition(ex), ex->ps->fleet_t_ns,
                              ex->ps->fleet_tau_ns, ex->max_wait_ns);
}

/* The same permit, with the key's lookup and lease (contract §10). */
static int start_permit_lease(struct exchange *ex)
{
    const struct sc_idempotency *id = &ex->pol->idem;
    uint64_t now = ex->env->clock->mono_ns(ex->env->clock->arg);
    struct store_bucket_ask b = {
        .partition = ex_partition(ex),
        .t_ns = ex->ps->fleet_t_ns,
        .tau_ns = ex->ps->fleet_tau_ns,
        /* After a wait for a holder (duplicates: wait), what is left. */
        .max_wait_ns = !ex->wait_start_ns ? ex->max_wait_ns
                       : ex->wait_deadline_ns > now ? ex->wait_deadline_ns - now
                                                    : 0,
    };

    return store_permit_lease_async(ex->env->store, ex->scall, ex->pol->name,
                                    ex->key, ex->fp, ex_wall_ms(ex), id->lease_ms,
                                    id->ttl_ms, &b);
}

/* While the store does not answer, this sidecar paces alone at its share
 * of the fleet's numbers (its local bucket), and says so. */
static void fall_back(struct exchange *ex)
{
    if (!atomic_exchange(&ex->ps->fallback, true))
        log_warn("policy %s: shared bucket unreachable (%s): pacing locally "
                 "at its share of the fleet's rate", ex->pol->name,
                 ex->scall->err.text);
}

/* The fleet's bucket answered (ex->scall): wait for the start it reserved,
 * or go back to the queue; no answer: the local fallback decides. */
static enum ex_verdict fleet_answered(struct exchange *ex, uint64_t now)
{
    const struct store_permit *pm = &ex->scall->permit;

    if (ex->scall->rc != 0) {
        fall_back(ex);
        return local_permit(ex, now);
    }
    if (atomic_exchange(&ex->ps->fallback, false))
        log_info("policy %s: shared bucket reachable again", ex->pol->name);
    if (!pm->granted)
        return ex_refuse_wait(ex, pm->paused ? R_UPSTREAM_COOLDOWN : R_RATE_LIMITED,
                              (pm->wait_ns + NS_PER_MS - 1) / NS_PER_MS);
    ex->shared_permit = true;
    ex->permit_at = now + pm->wait_ns;
    if (pm->wait_ns == 0)
        return EXV_NEXT;
    ex->wake_at = ex->permit_at;
    return EXV_WAIT;
}

static enum ex_verdict fleet_run(struct exchange *ex, uint64_t now)
{
    enum ex_verdict v;

    if (ex->woke == WOKE_FIRST) {
        if (!ex_take_bucket(ex, now))
            return EXV_ANSWER;
        ex->asking = true;
    }
    if (!ex->asking)
        return permit_due(ex, now);
    v = ex_store_wait(ex, now, start_permit, ex->woke == WOKE_FIRST, ST_PERMIT);
    if (v != EXV_NEXT)
        return v;
    ex->asking = false;
    return fleet_answered(ex, now);
}

const struct ex_stage stage_permit_fleet = {
    .name = "permit_fleet",
    .run = fleet_run,
    .release = ex_bucket_release,
    .drain = ex_drain_unsent,
    .flags = STAGE_WATCH,
};

/* Where what remains of a window is spent before its reset (quota.h),
 * nothing starts until the reset: a quiet time in the fleet's bucket, not
 * a rate of 0 (no GCRA numbers say that) nor min_rate (one more start
 * there, past what remains). The numbers sent are those after it. */
static void follow_numbers(const struct quota *q, uint64_t t, uint64_t *t_ns,
                           uint64_t *tau_ns, uint64_t *quiet_ns)
{
    uint64_t from = quota_resume_at(q, t);

    gcra_numbers(quota_rate(q, from), quota_capacity(q, from), t_ns, tau_ns);
    *quiet_ns = from - t;
}

/* A fleet's lanes (contract §13): permit_lanes picked this request, by
 * the shares, among this sidecar's waiters, and holds the bucket; it now
 * asks the fleet's bucket for its start, within what is left of its lane's
 * max_wait. While that start is ahead, this sidecar's lanes grant nothing
 * (its permits pause until it), so each sidecar keeps about one request
 * reserved in Redis and the order stays in its lanes: a request joining an
 * urgent lane waits for the head before it, not for a queue in Redis. */
/* A followed quota (contract §12): this sidecar's numbers, as its permits
 * follow what it read, and when that was advertised, or when a reset it
 * knows of passed since (then its numbers are the window's after it, newer
 * than any answer of the window before); and the next reset it knows of,
 * with the numbers after it. The fleet's bucket paces to the newest any
 * sidecar saw, and past their reset to the numbers after it. */
static int start_permit_follow(struct exchange *ex)
{
    struct permits_view v;
    struct store_follow f = {0};
    uint64_t m, now = ex->env->clock->mono_ns(ex->env->clock->arg);

    permits_view(ex->bucket->pm, now, &v);
    /* As a local bucket's numbers: never a hair faster than followed. */
    gcra_numbers(v.rate, v.capacity, &f.t_ns, &f.tau_ns);
    if (quota_resume_at(&v.quota, now) > now)
        follow_numbers(&v.quota, now, &f.t_ns, &f.tau_ns, &f.quiet_ns);
    f.seen_ms = quota_news_wall_ms(&v.quota, now);
    m = quota_next_change(&v.quota, now + f.quiet_ns);
    if (f.seen_ms && m != UINT64_MAX) {
        f.reset_in_ns = m - now;
        follow_numbers(&v.quota, m, &f.next_t_ns, &f.next_tau_ns, &f.next_quiet_ns);
        f.reset_ms = quota_wall_ms_at(&v.quota, m);
    }
    f.top_up = v.top_up_ms && v.top_up_ms == f.seen_ms;
    f.top_up_f = v.top_up_f;
    /* Granted, it counts among the fleet's requests in flight (the f of
     * the rule) until stage_quota reads its answer, or it leaves. */
    if (!ex->flight[0])
        snprintf(ex->flight, sizeof ex->flight, "%016llx%016llx",
                 (unsigned long long)rand_u64(), (unsigned long long)rand_u64());
    f.flight = ex->flight;
    f.hold_ms = ex->timeout_ms + FLIGHT_HOLD_MARGIN_MS;
    return store_permit_follow_async(ex->env->store, ex->scall, ex->pol->name,
                                     ex_partition(ex), &f, ex->max_wait_ns);
}

/* Until its start comes, a granted request is not sent: not in flight
 * for a followed quota (its f counts requests sent upstream). */
static void fleet_hold(struct exchange *ex, bool hold)
{
    if (ex->pm_held == hold || !ex->bucket || !ex->bucket->pm)
        return;
    ex->pm_held = hold;
    permits_hold(ex->bucket->pm, hold);
}

static enum ex_verdict fleet_lanes_answered(struct exchange *ex, uint64_t now)
{
    enum ex_verdict v = fleet_answered(ex, now);

    if (v == EXV_WAIT && ex->shared_permit && ex->bucket->pm) {
        permits_pause(ex->bucket->pm, now, ex->permit_at);
        fleet_hold(ex, true);
    }
    return v;
}

/* A followed quota's rate changes with every answer, and a permit goes at
 * the rate in force when it is granted (contract §12). A start the fleet's
 * bucket reserved ahead keeps the numbers of its ask (the bucket re-times
 * what lies beyond its tat, not the starts it has told), and at a window's
 * end such starts, reserved at a small allowance (min_rate at worst: 2 s
 * a start at 0.5/s), fell past the partner's reset while permits of the
 * window were left, and held their sidecars' lanes into the next. So a
 * follower asks only for a start due within FLEET_DUE_NS; refused, it
 * waits here until the moment the bucket named, holding its sidecar's
 * lanes as a reserved start does, and asks again then, at the numbers of
 * that moment, within its wait's deadline (beyond it: refused with the
 * bucket's wait, as before). */
#define FLEET_DUE_NS (5 * NS_PER_MS)

static uint64_t ask_wait(const struct exchange *ex, uint64_t now)
{
    uint64_t left = ex->wait_deadline_ns > now ? ex->wait_deadline_ns - now : 0;

    return ex->ps->follow && left > FLEET_DUE_NS ? FLEET_DUE_NS : left;
}

static enum ex_verdict follow_answered(struct exchange *ex, uint64_t now)
{
    const struct store_permit *pm = &ex->scall->permit;
    uint64_t at = now + pm->wait_ns;
    enum ex_verdict v;

    if (ex->scall->rc == 0 && pm->granted)
        ex->flight_listed = true;
    if (ex->scall->rc == 0 && !pm->granted && at <= ex->wait_deadline_ns) {
        ex->due_at = ex->wake_at = at;
        permits_pause(ex->bucket->pm, now, at);
        fleet_hold(ex, true);
        return EXV_WAIT;
    }
    v = fleet_lanes_answered(ex, now);
    if (v != EXV_WAIT)
        fleet_hold(ex, false);
    return v;
}

static enum ex_verdict fleet_lanes_run(struct exchange *ex, uint64_t now)
{
    bool first = ex->woke == WOKE_FIRST;
    enum ex_verdict v;

    if (ex->due_at && now < ex->due_at) {
        ex->wake_at = ex->due_at;
        return EXV_WAIT;
    }
    if (ex->due_at) {
        ex->due_at = 0;
        first = true;
    }
    if (first) {
        ex->max_wait_ns = ask_wait(ex, now);
        ex->asking = true;
    }
    if (ex->asking) {
        v = ex_store_wait(ex, now, ex->ps->follow ? start_permit_follow : start_permit,
                          first, ST_PERMIT);
        if (v != EXV_NEXT)
            return v;
        ex->asking = false;
        return ex->ps->follow ? follow_answered(ex, now) : fleet_lanes_answered(ex, now);
    }
    v = permit_due(ex, now);
    if (v != EXV_WAIT)
        fleet_hold(ex, false);
    return v;
}

/* The bucket is permit_lanes' to give back; a request the fleet's count
 * of requests in flight holds and stage_quota did not take out (it left
 * unsent, or failed before its answer was read) leaves it, unawaited (a
 * failure leaves it to its hold). */
static void fleet_lanes_release(struct exchange *ex, enum ex_release how)
{
    struct store_call c = {0};

    if (!ex->flight_listed)
        return;
    ex->flight_listed = false;
    ex_store_detach(&c, store_flight_end_async(ex->env->store, &c, ex->pol->name,
                                               ex_partition(ex), ex->flight));
}

const struct ex_stage stage_permit_fleet_lanes = {
    .name = "permit_fleet_lanes",
    .run = fleet_lanes_run,
    .release = fleet_lanes_release,
    .drain = ex_drain_unsent,
    .flags = STAGE_WATCH,
};

/* The fleet's answer to a permit asked with the lease: true when the lease
 * is now the request's, or when the key is free and only the permit was
 * refused (the permit's answer then says why); false when the key's record
 * answers the request (a replay, lease_held, 422) or the store failed
 * (store_unavailable: a keyed request is never forwarded on the fallback). */
static bool lease_with_permit(struct exchange *ex)
{
    if (ex->scall->rc == 0 && ex->scall->acq.claim == STORE_FREE) {
        ex->attempt = ex->scall->acq.attempt;
        return true;
    }
    if (!ex_take_lease(ex))
        return false;
    ex->lease_with_permit = true;
    return true;
}

/* duplicates: wait with the store's notices (stage_idem.c): the look
 * that marks a held lease is a watch, not the script (which would spend
 * nothing either, but marks nothing); EXV_NEXT when it found the key free,
 * to ask for it at once. */
static enum ex_verdict watch_held(struct exchange *ex, uint64_t now, bool again)
{
    enum ex_verdict v;

    if (ex->holder_looking)
        return ex_not_free(ex, now);
    if (again)
        ex->dup_looking = true;
    v = ex_store_wait(ex, now, ex_start_watch, again, ST_GET);
    if (v != EXV_NEXT)
        return v;
    ex->dup_looking = false;
    if (ex_looked_up(ex))
        return EXV_NEXT;
    return ex_not_free(ex, now);
}

/* One round trip for the key's lookup, the fleet's permit and the lease
 * (instead of three): the lease, taken before the waits, runs max_wait +
 * lease; one that leaves unsent is given back with its attempt uncounted. */
static enum ex_verdict permit_lease_run(struct exchange *ex, uint64_t now)
{
    /* duplicates: wait asks again, a held key spending no permit. */
    bool again = ex->dup_waiting;
    enum ex_verdict v;

    if (ex->woke == WOKE_FIRST) {
        if (!ex_take_bucket(ex, now))
            return EXV_ANSWER;
        ex->asking = true;
    }
    ex->dup_waiting = false;
    if (again)
        ex->dup_noticed = false; /* this look sees what the notice told */
    if ((again && ex->dup_watch) || ex->dup_looking || ex->holder_looking) {
        if ((v = watch_held(ex, now, again)) != EXV_NEXT)
            return v;
        again = true; /* free: asked for at once */
    }
    if (again)
        ex->asking = true;
    if (!ex->asking)
        return permit_due(ex, now);
    v = ex_store_wait(ex, now, start_permit_lease, ex->woke == WOKE_FIRST || again,
                      ST_PERMIT_LEASE);
    if (v != EXV_NEXT)
        return v;
    ex->asking = false;
    if (!lease_with_permit(ex))
        return ex_wait_for_holder(ex, now, true, ex->scall->acq.lease) ? EXV_WAIT
                                                                        : EXV_ANSWER;
    ex_dup_leave(ex);
    return fleet_answered(ex, now);
}

static void permit_lease_release(struct exchange *ex, enum ex_release how)
{
    ex_dup_release(ex);
    ex_lease_give_back(ex);
    ex_bucket_release(ex, how);
}

const struct ex_stage stage_permit_lease = {
    .name = "permit_lease",
    .run = permit_lease_run,
    .release = permit_lease_release,
    .drain = ex_drain_unsent,
    .flags = STAGE_WATCH,
};

/* ---- the moment of sending ------------------------------------------------ */

/* Timers that fire late and together (a starved CPU) would send late and
 * on-time requests back to back: the bound burst + rate x t is checked
 * again where requests leave, holding the slot meanwhile. A fleet's permit
 * was timed by Redis for the fleet: this sidecar's share of the rate is no
 * bound on it. */
static enum ex_verdict send_check_run(struct exchange *ex, uint64_t now)
{
    uint64_t at;

    if (ex->shared_permit || gcra_reserve(&ex->bucket->sent, now, 0, &at))
        return EXV_NEXT;
    ex->wake_at = at;
    return EXV_WAIT;
}

const struct ex_stage stage_send_check = {
    .name = "send_check",
    .run = send_check_run,
    .drain = ex_drain_unsent,
    .flags = STAGE_WATCH,
};
