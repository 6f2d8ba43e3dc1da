/* Pacing stages of an exchange: a permit from the policy's bucket (GCRA:
 * the start time is reserved at once, the driver's timer wakes the request
 * then), a concurrency slot (FIFO across threads), both within max_wait,
 * otherwise requeue / rate_limited (or upstream_cooldown) at once; and the
 * send check, the same bucket's numbers at the moment of sending. */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include <event2/event.h>

#include "proxy/app.h"
#include "proxy/exchange_internal.h"
#include "obs/log.h"
#include "proxy/server.h"
#include "util/clock.h"
#include "util/rand.h"

/* No slot within max_wait: the holders' end is unknown, so the worker comes
 * back after about one upstream round trip. Also the least delay of a
 * request the drain deadline met while it waited. */
#define SLOT_RETRY_MS 1000
/* Fleet slots: how often a request waiting for one asks again (contract
 * §10: at most every 25 ms, never a spin), and how long past its upstream's
 * timeout a dead holder's slot stays taken. */
#define SLOT_POLL_MS 25
#define SLOT_HOLD_MARGIN_MS 5000

static uint32_t attempts_so_far(const struct exchange *ex)
{
    /* This request never reached the upstream: it adds no attempt. */
    return ex->attempt > 0 ? ex->attempt - 1 : 0;
}

/* Told to come back after delay_ms. A wait beyond max_delay is more than
 * the queue can hold: dead_letter / delay_exceeds_max, as for a hint. */
static enum ex_verdict refuse_wait(struct exchange *ex, enum reason r,
                                   uint64_t delay_ms)
{
    if (delay_ms > ex->pol->retry.max_delay_ms)
        ex_instruct(ex, OUT_DEAD_LETTER, R_DELAY_EXCEEDS_MAX, 0,
                    attempts_so_far(ex), 0);
    else
        ex_instruct(ex, OUT_REQUEUE, r, delay_ms ? delay_ms : 1,
                    attempts_so_far(ex), 0);
    ex->rate_headers = true;
    return EXV_ANSWER;
}

/* Refused without waiting: the worker retries once a permit would exist. */
static enum ex_verdict refuse_rate(struct exchange *ex, uint64_t start_ns,
                                   uint64_t now)
{
    uint64_t cd = ex->bucket ? bucket_cooldown(ex->bucket) : 0;
    enum reason r = cd > now ? R_UPSTREAM_COOLDOWN : R_RATE_LIMITED;

    return refuse_wait(ex, r, (start_ns - now + NS_PER_MS - 1) / NS_PER_MS);
}

/* ---- the fleet's bucket (shared: redis) ---------------------------------- */

bool pace_shared(const struct exchange *ex)
{
    return ex->ps && ex->ps->shared && store_shares_buckets(ex->loop->app->store);
}

const char *pace_partition(const struct exchange *ex)
{
    return ex->bucket && ex->bucket->partition ? ex->partition : NULL;
}

bool pace_fuses_lease(struct exchange *ex)
{
    if (!ex->idem || ex->pol->mode == SC_MODE_SHADOW ||
        !store_shares_buckets(ex->loop->app->store))
        return false;
    if (!ex->ps)
        ex->ps = pacing_policy(&ex->rt->pacing, ex->route->policy);
    return ex->ps && ex->ps->has_bucket && ex->ps->shared;
}

static int start_permit(struct exchange *ex)
{
    return store_permit_async(ex->loop->store, ex->scall, ex->pol->name,
                              pace_partition(ex), ex->ps->fleet_t_ns,
                              ex->ps->fleet_tau_ns,
                              ex->pol->max_wait_ms * NS_PER_MS);
}

/* The same permit, with the key's lookup and lease (pace_fuses_lease). */
static int start_permit_lease(struct exchange *ex)
{
    const struct sc_idempotency *id = &ex->pol->idem;
    struct store_bucket_ask b = {
        .partition = pace_partition(ex),
        .t_ns = ex->ps->fleet_t_ns,
        .tau_ns = ex->ps->fleet_tau_ns,
        .max_wait_ns = ex->pol->max_wait_ms * NS_PER_MS,
    };

    return store_permit_lease_async(ex->loop->store, ex->scall, ex->pol->name,
                                    ex->key, ex->fp, clock_wall_ms(),
                                    id->lease_ms, id->ttl_ms, &b);
}

/* While the store does not answer, this sidecar paces alone at its share
 * of the fleet's numbers (its local bucket, pacing.c), and says so. */
static void fall_back(struct exchange *ex)
{
    if (!atomic_exchange(&ex->ps->fallback, true))
        log_warn("policy %s: shared bucket unreachable (%s): pacing locally "
                 "at its share of the fleet's rate", ex->pol->name,
                 ex->scall->err.text);
}

static enum ex_verdict local_permit(struct exchange *ex, uint64_t now);

/* The fleet's bucket answered: wait for the start it reserved, or go back
 * to the queue; no answer: the local fallback decides, except for a keyed
 * request, which the store's failure answers (nothing is forwarded). */
static enum ex_verdict shared_answer(struct exchange *ex, uint64_t now)
{
    bool fused = pace_fuses_lease(ex);
    enum ex_verdict v = ex_store_wait(ex, now,
                                      fused ? start_permit_lease : start_permit,
                                      ex->woke == WOKE_FIRST,
                                      fused ? ST_PERMIT_LEASE : ST_PERMIT);
    const struct store_permit *pm;

    if (v != EXV_NEXT)
        return v;
    pm = &ex->scall->permit;
    ex->asking = false;
    if (fused && !idem_lease_with_permit(ex))
        return EXV_ANSWER;
    if (ex->scall->rc != 0) {
        fall_back(ex);
        return local_permit(ex, now);
    }
    if (atomic_exchange(&ex->ps->fallback, false))
        log_info("policy %s: shared bucket reachable again", ex->pol->name);
    if (!pm->granted)
        return refuse_wait(ex, pm->paused ? R_UPSTREAM_COOLDOWN : R_RATE_LIMITED,
                           (pm->wait_ns + NS_PER_MS - 1) / NS_PER_MS);
    ex->shared_permit = true;
    ex->permit_at = now + pm->wait_ns;
    if (pm->wait_ns == 0)
        return EXV_NEXT;
    ex->wake_at = ex->permit_at;
    return EXV_WAIT;
}

/* ---- permits ------------------------------------------------------------ */

/* Shadow mode: reserve as enforce would (so the bucket tracks real demand)
 * but forward at once, remembering what enforce would have done. */
static void shadow_permit(struct exchange *ex, uint64_t now)
{
    uint64_t start;

    if (!gcra_reserve(&ex->bucket->g, now, ex->pol->max_wait_ms * NS_PER_MS,
                      &start))
        ex->shadow = SHADOW_RATE_LIMITED;
    else if (start > now)
        ex->shadow = SHADOW_PERMIT_WAIT;
}

static enum ex_verdict local_permit(struct exchange *ex, uint64_t now)
{
    uint64_t start;

    if (!gcra_reserve(&ex->bucket->g, now, ex->pol->max_wait_ms * NS_PER_MS,
                      &start))
        return refuse_rate(ex, start, now);
    ex->permit_at = start;
    if (start <= now)
        return EXV_NEXT;
    ex->wake_at = start;
    return EXV_WAIT;
}

/* Every partition of the policy is held by a request in flight or paused,
 * and the table is full: a new value has no bucket to pace on. As for a
 * slot, when one comes free is unknown: back after about a round trip. */
static enum ex_verdict no_partition(struct exchange *ex)
{
    ex_instruct(ex, OUT_REQUEUE, R_RATE_LIMITED, SLOT_RETRY_MS, attempts_so_far(ex), 0);
    return EXV_ANSWER;
}

static enum ex_verdict first_permit(struct exchange *ex, uint64_t now)
{
    ex->ps = pacing_policy(&ex->rt->pacing, ex->route->policy);
    ex->wait_start_ns = now;
    ex->wait_deadline_ns = now + ex->pol->max_wait_ms * NS_PER_MS;
    if (pacing_bucket(ex->ps, ex->partition, now, &ex->bucket) != 0)
        return no_partition(ex);
    if (!ex->bucket)
        return EXV_NEXT;
    if (ex->pol->mode == SC_MODE_SHADOW) {
        shadow_permit(ex, now);
        return EXV_NEXT;
    }
    if (pace_shared(ex)) {
        ex->asking = true;
        return shared_answer(ex, now);
    }
    return local_permit(ex, now);
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
        return refuse_wait(ex, R_UPSTREAM_COOLDOWN,
                           (until - now + NS_PER_MS - 1) / NS_PER_MS);
    if (!gcra_reserve(&ex->bucket->g, now, left, &start))
        return refuse_wait(ex, R_UPSTREAM_COOLDOWN,
                           (start - now + NS_PER_MS - 1) / NS_PER_MS);
    ex->permit_at = start;
    ex->wake_at = start;
    return EXV_WAIT;
}

enum ex_verdict stage_permit(struct exchange *ex, uint64_t now)
{
    if (ex->woke == WOKE_FIRST)
        return first_permit(ex, now);
    return ex->asking ? shared_answer(ex, now) : permit_due(ex, now);
}

/* ---- slots -------------------------------------------------------------- */

static enum ex_verdict got_slot(struct exchange *ex, uint64_t now)
{
    ex->has_slot = true;
    ex->got_slot = true;
    ex->permit_wait_ns = now - ex->wait_start_ns;
    return EXV_NEXT;
}

static enum ex_verdict no_slot(struct exchange *ex)
{
    ex_instruct(ex, OUT_REQUEUE, R_RATE_LIMITED, SLOT_RETRY_MS, attempts_so_far(ex), 0);
    ex->rate_headers = ex->bucket != NULL;
    return EXV_ANSWER;
}

static enum ex_verdict local_slot(struct exchange *ex, uint64_t now)
{
    if (!ex->slot.granted_ev &&
        !(ex->slot.granted_ev = event_new(ex->loop->base, -1, 0, ex_event_cb, ex))) {
        ex_refuse(ex, 500, OUT_REJECTED, R_INTERNAL, "out of memory");
        return EXV_ANSWER;
    }
    if (pacing_slot_acquire(ex->ps, &ex->slot))
        return got_slot(ex, now);
    ex->slot_waiting = true;
    ex->wake_at = ex->wait_deadline_ns > now ? ex->wait_deadline_ns : now;
    return EXV_WAIT;
}

/* A fleet-wide slot (shared: redis): asked of the store; none free, asked
 * again every SLOT_POLL_MS until max_wait; no answer: the local fallback.
 * A holder that dies gives its slot back after its request's timeout (the
 * route's, else the upstream's) and a margin. */
static int start_slot(struct exchange *ex)
{
    return store_slot_take_async(ex->loop->store, ex->scall, ex->pol->name,
                                 ex->holder, ex->pol->concurrency,
                                 sc_route_timeout(ex->route, ex->up) + SLOT_HOLD_MARGIN_MS);
}

static enum ex_verdict shared_slot(struct exchange *ex, uint64_t now, bool first)
{
    enum ex_verdict v = ex_store_wait(ex, now, start_slot, first, ST_SLOT);
    uint64_t next = now + SLOT_POLL_MS * NS_PER_MS;

    ex->slot_polling = false;
    if (v != EXV_NEXT) {
        ex->asking = true;
        return v;
    }
    ex->asking = false;
    if (ex->scall->rc != 0) {
        fall_back(ex);
        return local_slot(ex, now);
    }
    if (ex->scall->slot.granted) {
        ex->shared_slot = true;
        pacing_slot_count(ex->ps);
        return got_slot(ex, now);
    }
    if (now >= ex->wait_deadline_ns)
        return no_slot(ex);
    ex->slot_polling = true;
    ex->wake_at = next < ex->wait_deadline_ns ? next : ex->wait_deadline_ns;
    return EXV_WAIT;
}

static enum ex_verdict first_slot(struct exchange *ex, uint64_t now)
{
    if (ex->pol->mode == SC_MODE_SHADOW) {
        /* Counted for the gauge, never waited on. */
        if (ex->pol->concurrency && pacing_inflight(ex->ps) >= ex->pol->concurrency)
            ex->shadow = ex->shadow ? ex->shadow : SHADOW_CONCURRENCY;
        pacing_slot_count(ex->ps);
        return got_slot(ex, now);
    }
    /* No limit in this config: counted without a lock, unless a reload has
     * given the policy one since; then it waits like the new config's. */
    if (ex->pol->concurrency == 0)
        return pacing_slot_take(ex->ps) ? got_slot(ex, now) : local_slot(ex, now);
    if (pace_shared(ex)) {
        snprintf(ex->holder, sizeof ex->holder, "%016llx%016llx",
                 (unsigned long long)rand_u64(), (unsigned long long)rand_u64());
        return shared_slot(ex, now, true);
    }
    return local_slot(ex, now);
}

/* Woken by the grant, or by max_wait's end: a grant that raced the timer
 * still counts. The slot's holders have no known end, so a worker refused
 * retries after about one upstream round trip at most. */
static enum ex_verdict slot_woken(struct exchange *ex, uint64_t now)
{
    ex->slot_waiting = false;
    /* Still queued: not granted (the grant takes it out of the queue). */
    if (!pacing_slot_cancel(ex->ps, &ex->slot)) {
        event_del(ex->slot.granted_ev); /* a pending activation is ours */
        return got_slot(ex, now);
    }
    return no_slot(ex);
}

enum ex_verdict stage_slot(struct exchange *ex, uint64_t now)
{
    if (ex->woke == WOKE_FIRST)
        return first_slot(ex, now);
    if (ex->asking || ex->slot_polling)
        return shared_slot(ex, now, ex->slot_polling);
    return slot_woken(ex, now);
}

/* Gives a fleet slot back without waiting; also when its grant may be in
 * flight (a holder that was never granted is a no-op to remove). Its local
 * count goes back with has_slot, like a local slot's: once. */
static void give_shared_slot(struct exchange *ex)
{
    struct store_call c = {0};

    if (!ex->holder[0])
        return;
    ex_store_detach(&c, store_slot_give_async(ex->loop->store, &c,
                                              ex->pol->name, ex->holder));
    ex->holder[0] = '\0';
    ex->shared_slot = false;
}

void pace_release_slot(struct exchange *ex)
{
    give_shared_slot(ex);
    if (ex->slot_waiting && !pacing_slot_cancel(ex->ps, &ex->slot)) {
        /* Granted in the meantime: ours to give back, and its pending
         * activation must not run after us. */
        ex->has_slot = true;
        event_del(ex->slot.granted_ev);
    }
    ex->slot_waiting = false;
    if (ex->has_slot) {
        ex->has_slot = false;
        pacing_slot_release(ex->ps);
    }
}

void pace_release_bucket(struct exchange *ex)
{
    pacing_bucket_put(ex->bucket);
    ex->bucket = NULL;
}

/* ---- the moment of sending ---------------------------------------------- */

/* Timers that fire late and together (a starved CPU) would send late and
 * on-time requests back to back: the bound burst + rate x t is checked
 * again where requests leave, holding the slot meanwhile. */
enum ex_verdict stage_send_check(struct exchange *ex, uint64_t now)
{
    uint64_t at;

    /* A fleet's permit was timed by Redis for the fleet: this sidecar's
     * share of the rate is no bound on it. */
    if (!ex->bucket || ex->pol->mode == SC_MODE_SHADOW || ex->shared_permit ||
        gcra_reserve(&ex->bucket->sent, now, 0, &at))
        return EXV_NEXT;
    ex->wake_at = at;
    return EXV_WAIT;
}

const char *shadow_name(enum shadow_verdict v)
{
    static const char *const names[] = {
        [SHADOW_PERMIT_WAIT] = "permit_wait",
        [SHADOW_RATE_LIMITED] = "rate_limited",
        [SHADOW_CONCURRENCY] = "concurrency",
    };

    return v > SHADOW_NONE && v <= SHADOW_CONCURRENCY ? names[v] : NULL;
}

/* ---- the drain deadline --------------------------------------------------- */

void pace_drain_answer(struct exchange *ex, uint64_t now)
{
    uint64_t left = ex->wait_deadline_ns > now ? ex->wait_deadline_ns - now : 0;

    /* Nothing was sent: the job can simply come back when sluice does. */
    ex_instruct(ex, OUT_REQUEUE, R_RATE_LIMITED,
                left / NS_PER_MS > SLOT_RETRY_MS ? left / NS_PER_MS : SLOT_RETRY_MS,
                attempts_so_far(ex), 0);
}

void ex_rate_headers(const struct exchange *ex, char *policy, size_t plen,
                     char *state, size_t slen)
{
    const struct sc_policy *p = ex->pol;
    uint64_t next_ns = 0;
    /* The quota of a one-second window (longer for slow rates), as the
     * draft's q;w describe: what can start in any window of w seconds. */
    double w = p->rate >= 1 ? 1 : 1 / p->rate;
    unsigned long q = (unsigned long)(p->burst + p->rate * w);
    uint32_t r = gcra_available(&ex->bucket->g, clock_mono_ns(), &next_ns);
    unsigned long long t = (next_ns + NS_PER_S - 1) / NS_PER_S;

    snprintf(policy, plen, "\"%s\";q=%lu;w=%.0f", p->name, q, w);
    snprintf(state, slen, "\"%s\";r=%u;t=%llu", p->name, r, t);
}
