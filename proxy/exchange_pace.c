/* Pacing stages of an exchange (SPEC section 5): a permit from the policy's
 * bucket (GCRA: the start time is reserved at once, a timer wakes the
 * request then), then a concurrency slot (FIFO across threads), both within
 * max_wait; otherwise requeue / rate_limited (or upstream_cooldown) at once. */
#include <stdio.h>
#include <string.h>

#include <event2/event.h>

#include "proxy/app.h"
#include "proxy/exchange_internal.h"
#include "proxy/log.h"
#include "proxy/server.h"
#include "util/clock.h"

#define NS_PER_MS 1000000ull

static struct timeval ns_to_tv(uint64_t ns)
{
    struct timeval tv = {(time_t)(ns / 1000000000ull),
                         (suseconds_t)((ns % 1000000000ull) / 1000)};
    return tv;
}

static uint32_t attempts_so_far(const struct exchange *ex)
{
    /* This request never reached the upstream: it adds no attempt. */
    return ex->attempt > 0 ? ex->attempt - 1 : 0;
}

/* Told to come back after delay_ms. A wait beyond max_delay is more than
 * the queue can hold: dead_letter / delay_exceeds_max, as for a hint. */
static void refuse_wait(struct exchange *ex, enum reason r, uint64_t delay_ms)
{
    if (delay_ms > ex->pol->retry.max_delay_ms)
        ex_instruct(ex, OUT_DEAD_LETTER, R_DELAY_EXCEEDS_MAX, 0,
                    attempts_so_far(ex), 0);
    else
        ex_instruct(ex, OUT_REQUEUE, r, delay_ms ? delay_ms : 1,
                    attempts_so_far(ex), 0);
    ex->rate_headers = true;
}

/* Refused without waiting: the worker retries once a permit would exist. */
static void refuse_rate(struct exchange *ex, uint64_t start_ns, uint64_t now)
{
    uint64_t cd = ex->bucket ? atomic_load(&ex->bucket->cooldown_until) : 0;
    enum reason r = cd > now ? R_UPSTREAM_COOLDOWN : R_RATE_LIMITED;

    refuse_wait(ex, r, (start_ns - now + NS_PER_MS - 1) / NS_PER_MS);
}

/* ---- slots -------------------------------------------------------------- */

static void got_slot(struct exchange *ex)
{
    uint64_t now = clock_mono_ns();

    ex->has_slot = true;
    ex->permit_wait_ns = now - ex->wait_start_ns;
    if (ex->timer)
        event_del(ex->timer);
    ex_send_upstream(ex);
}

static void on_slot_granted(evutil_socket_t fd, short what, void *arg)
{
    struct exchange *ex = arg;

    if (ex->state == EX_SLOT)
        got_slot(ex);
    else /* answered meanwhile: the slot is ours, released at the end */
        ex->has_slot = true;
}

static void on_slot_timeout(evutil_socket_t fd, short what, void *arg)
{
    struct exchange *ex = arg;

    if (!pacing_slot_cancel(ex->ps, &ex->slot))
        return; /* granted meanwhile: on_slot_granted runs next */
    /* No slot within max_wait; the slot's holders have no known end, so the
     * worker retries after about one upstream round trip at most. */
    ex_instruct(ex, OUT_REQUEUE, R_RATE_LIMITED, 1000, attempts_so_far(ex), 0);
    ex->rate_headers = ex->bucket != NULL;
    ex_finish(ex);
}

static void step_slot(struct exchange *ex)
{
    uint64_t now = clock_mono_ns();
    struct timeval tv;

    if (ex->pol->mode == SC_MODE_SHADOW || ex->pol->concurrency == 0 ||
        !ex->slot.granted_ev) {
        /* Counted for the gauge, never waited on. */
        if (ex->pol->concurrency && pacing_inflight(ex->ps) >= ex->pol->concurrency)
            ex->shadow = ex->shadow ? ex->shadow : "concurrency";
        atomic_fetch_add(&ex->ps->inflight, 1);
        got_slot(ex);
        return;
    }
    if (pacing_slot_acquire(ex->ps, &ex->slot)) {
        got_slot(ex);
        return;
    }
    ex->state = EX_SLOT;
    tv = ns_to_tv(ex->wait_deadline_ns > now ? ex->wait_deadline_ns - now : 0);
    evtimer_assign(ex->timer, ex->w->base, on_slot_timeout, ex);
    evtimer_add(ex->timer, &tv);
    ex_watch_client(ex);
}

/* ---- permits ------------------------------------------------------------ */

/* A cooldown that began while this request waited for its permit: the
 * reservation it holds predates the upstream's 429, so it must not go now.
 * It waits again, after the cooldown, if max_wait allows; else it is told. */
static bool cooled_down(struct exchange *ex)
{
    uint64_t now = clock_mono_ns(), start;
    uint64_t until = atomic_load(&ex->bucket->cooldown_until);
    uint64_t left = ex->wait_deadline_ns > now ? ex->wait_deadline_ns - now : 0;
    struct timeval tv;

    /* A reservation made after the pause already lies beyond it. */
    if (until <= now || ex->permit_at >= until)
        return false;
    if (!gcra_reserve(&ex->bucket->g, now, left, &start)) {
        refuse_wait(ex, R_UPSTREAM_COOLDOWN,
                    (start - now + NS_PER_MS - 1) / NS_PER_MS);
        ex_finish(ex);
        return true;
    }
    ex->permit_at = start;
    tv = ns_to_tv(start > now ? start - now : 0);
    evtimer_add(ex->timer, &tv);
    return true;
}

/* Timers may fire a little early (libevent's cached clock): a request never
 * starts before the time its permit was reserved for, or exactness would
 * depend on timer precision. */
static bool too_early(struct exchange *ex)
{
    uint64_t now = clock_mono_ns();
    struct timeval tv;

    if (now >= ex->permit_at)
        return false;
    tv = ns_to_tv(ex->permit_at - now);
    evtimer_add(ex->timer, &tv);
    return true;
}

static void on_permit(evutil_socket_t fd, short what, void *arg)
{
    struct exchange *ex = arg;

    if (!too_early(ex) && !cooled_down(ex))
        step_slot(ex);
}

static const char *partition_of(const struct exchange *ex)
{
    if (!ex->pol->partition_header)
        return NULL;
    return MHD_lookup_connection_value(ex->mc, MHD_HEADER_KIND,
                                       ex->pol->partition_header);
}

/* Only a request that may wait (an enforced bucket or concurrency limit)
 * needs a timer; the others, most pass-through traffic, allocate nothing. */
static bool events_init(struct exchange *ex)
{
    bool enforce = ex->pol->mode != SC_MODE_SHADOW;

    if (enforce && (ex->ps->has_bucket || ex->pol->concurrency) &&
        !(ex->timer = evtimer_new(ex->w->base, on_permit, ex)))
        return false;
    if (enforce && ex->pol->concurrency &&
        !(ex->slot.granted_ev = event_new(ex->w->base, -1, 0, on_slot_granted, ex)))
        return false;
    return true;
}

/* Shadow mode: reserve as enforce would (so the bucket tracks real demand)
 * but forward at once, remembering what enforce would have done. */
static void shadow_permit(struct exchange *ex, uint64_t now)
{
    uint64_t start;

    if (!gcra_reserve(&ex->bucket->g, now, ex->pol->max_wait_ms * NS_PER_MS,
                      &start))
        ex->shadow = "rate_limited";
    else if (start > now)
        ex->shadow = "permit_wait";
}

void ex_pace(struct exchange *ex)
{
    uint64_t now = clock_mono_ns(), start;
    struct timeval tv;

    ex->ps = pacing_policy(&ex->rt->pacing, ex->route->policy);
    ex->wait_start_ns = now;
    ex->wait_deadline_ns = now + ex->pol->max_wait_ms * NS_PER_MS;
    if (!events_init(ex)) {
        ex_refuse(ex, 500, OUT_REJECTED, R_MALFORMED_REQUEST, "out of memory");
        ex_finish(ex);
        return;
    }
    ex->bucket = pacing_bucket(ex->ps, partition_of(ex), now);
    if (!ex->bucket) {
        step_slot(ex);
        return;
    }
    if (ex->pol->mode == SC_MODE_SHADOW) {
        shadow_permit(ex, now);
        step_slot(ex);
        return;
    }
    if (!gcra_reserve(&ex->bucket->g, now, ex->pol->max_wait_ms * NS_PER_MS,
                      &start)) {
        refuse_rate(ex, start, now);
        ex_finish(ex);
        return;
    }
    ex->permit_at = start;
    if (start <= now) {
        step_slot(ex);
        return;
    }
    ex->state = EX_PERMIT;
    tv = ns_to_tv(start - now);
    evtimer_add(ex->timer, &tv);
    ex_watch_client(ex);
}

/* ---- the moment of sending ---------------------------------------------- */

static void on_send_retry(evutil_socket_t fd, short what, void *arg)
{
    struct exchange *ex = arg;

    ex->state = EX_UPSTREAM;
    ex_send_upstream(ex);
}

bool ex_pace_may_send(struct exchange *ex)
{
    uint64_t now = clock_mono_ns(), at;
    struct timeval tv;

    if (!ex->bucket || ex->pol->mode == SC_MODE_SHADOW ||
        gcra_reserve(&ex->bucket->sent, now, 0, &at))
        return true;
    /* Not yet: wait (holding the slot) until the send-side bucket allows. */
    ex->state = EX_PERMIT;
    tv = ns_to_tv(at - now);
    evtimer_assign(ex->timer, ex->w->base, on_send_retry, ex);
    evtimer_add(ex->timer, &tv);
    ex_watch_client(ex);
    return false;
}

void ex_pace_release(struct exchange *ex)
{
    if (ex->timer && evtimer_pending(ex->timer, NULL))
        event_del(ex->timer);
    if (ex->has_slot) {
        ex->has_slot = false;
        pacing_slot_release(ex->ps);
    }
}

void ex_pace_cancel(struct exchange *ex)
{
    if (ex->state == EX_SLOT && !pacing_slot_cancel(ex->ps, &ex->slot)) {
        /* Granted in the meantime: ours to give back, and its pending
         * activation must not run after us. */
        ex->has_slot = true;
        event_del(ex->slot.granted_ev);
    }
    ex_pace_release(ex);
}

void ex_pace_abort(struct exchange *ex)
{
    uint64_t now = clock_mono_ns();
    uint64_t left = ex->wait_deadline_ns > now ? ex->wait_deadline_ns - now : 0;

    if (ex->state == EX_SLOT && !pacing_slot_cancel(ex->ps, &ex->slot)) {
        /* Granted in the meantime: keep it (released at the end) and drop
         * the pending activation, which would otherwise run after us. */
        ex->has_slot = true;
        event_del(ex->slot.granted_ev);
    }
    if (ex->timer)
        event_del(ex->timer);
    /* Nothing was sent: the job can simply come back when sluice does. */
    ex_instruct(ex, OUT_REQUEUE, R_RATE_LIMITED,
                left / NS_PER_MS > 1000 ? left / NS_PER_MS : 1000,
                attempts_so_far(ex), 0);
    ex_finish(ex);
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
    unsigned long long t = (next_ns + 999999999ull) / 1000000000ull;

    snprintf(policy, plen, "\"%s\";q=%lu;w=%.0f", p->name, q, w);
    snprintf(state, slen, "\"%s\";r=%u;t=%llu", p->name, r, t);
}
