/* Pacing stages of an exchange: a permit from the policy's bucket (GCRA:
 * the start time is reserved at once, the driver's timer wakes the request
 * then), a concurrency slot (FIFO across threads), both within max_wait,
 * otherwise requeue / rate_limited (or upstream_cooldown) at once; and the
 * send check, the same bucket's numbers at the moment of sending. */
#include <stdio.h>
#include <string.h>

#include <event2/event.h>

#include "proxy/app.h"
#include "proxy/exchange_internal.h"
#include "obs/log.h"
#include "proxy/server.h"
#include "util/clock.h"

/* No slot within max_wait: the holders' end is unknown, so the worker comes
 * back after about one upstream round trip. Also the least delay of a
 * request the drain deadline met while it waited. */
#define SLOT_RETRY_MS 1000

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
    uint64_t cd = ex->bucket ? atomic_load(&ex->bucket->cooldown_until) : 0;
    enum reason r = cd > now ? R_UPSTREAM_COOLDOWN : R_RATE_LIMITED;

    return refuse_wait(ex, r, (start_ns - now + NS_PER_MS - 1) / NS_PER_MS);
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

static enum ex_verdict first_permit(struct exchange *ex, uint64_t now)
{
    uint64_t start;

    ex->ps = pacing_policy(&ex->rt->pacing, ex->route->policy);
    ex->wait_start_ns = now;
    ex->wait_deadline_ns = now + ex->pol->max_wait_ms * NS_PER_MS;
    ex->bucket = pacing_bucket(ex->ps, ex->partition, now);
    if (!ex->bucket)
        return EXV_NEXT;
    if (ex->pol->mode == SC_MODE_SHADOW) {
        shadow_permit(ex, now);
        return EXV_NEXT;
    }
    if (!gcra_reserve(&ex->bucket->g, now, ex->pol->max_wait_ms * NS_PER_MS,
                      &start))
        return refuse_rate(ex, start, now);
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
    uint64_t until = atomic_load(&ex->bucket->cooldown_until), start;
    uint64_t left = ex->wait_deadline_ns > now ? ex->wait_deadline_ns - now : 0;

    if (now < ex->permit_at) {
        ex->wake_at = ex->permit_at;
        return EXV_WAIT;
    }
    /* A reservation made after the pause already lies beyond it. */
    if (until <= now || ex->permit_at >= until)
        return EXV_NEXT;
    if (!gcra_reserve(&ex->bucket->g, now, left, &start))
        return refuse_wait(ex, R_UPSTREAM_COOLDOWN,
                           (start - now + NS_PER_MS - 1) / NS_PER_MS);
    ex->permit_at = start;
    ex->wake_at = start;
    return EXV_WAIT;
}

enum ex_verdict stage_permit(struct exchange *ex, uint64_t now)
{
    return ex->woke == WOKE_FIRST ? first_permit(ex, now) : permit_due(ex, now);
}

/* ---- slots -------------------------------------------------------------- */

static enum ex_verdict got_slot(struct exchange *ex, uint64_t now)
{
    ex->has_slot = true;
    ex->got_slot = true;
    ex->permit_wait_ns = now - ex->wait_start_ns;
    return EXV_NEXT;
}

static enum ex_verdict first_slot(struct exchange *ex, uint64_t now)
{
    if (ex->pol->mode == SC_MODE_SHADOW || ex->pol->concurrency == 0) {
        /* Counted for the gauge, never waited on. */
        if (ex->pol->concurrency && pacing_inflight(ex->ps) >= ex->pol->concurrency)
            ex->shadow = ex->shadow ? ex->shadow : SHADOW_CONCURRENCY;
        atomic_fetch_add(&ex->ps->inflight, 1);
        return got_slot(ex, now);
    }
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
    ex_instruct(ex, OUT_REQUEUE, R_RATE_LIMITED, SLOT_RETRY_MS, attempts_so_far(ex), 0);
    ex->rate_headers = ex->bucket != NULL;
    return EXV_ANSWER;
}

enum ex_verdict stage_slot(struct exchange *ex, uint64_t now)
{
    return ex->woke == WOKE_FIRST ? first_slot(ex, now) : slot_woken(ex, now);
}

void pace_release_slot(struct exchange *ex)
{
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

/* ---- the moment of sending ---------------------------------------------- */

/* Timers that fire late and together (a starved CPU) would send late and
 * on-time requests back to back: the bound burst + rate x t is checked
 * again where requests leave, holding the slot meanwhile. */
enum ex_verdict stage_send_check(struct exchange *ex, uint64_t now)
{
    uint64_t at;

    if (!ex->bucket || ex->pol->mode == SC_MODE_SHADOW ||
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
