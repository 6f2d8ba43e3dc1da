/* The slot rows: a concurrency slot of the policy (FIFO across threads; a
 * grant wakes the request, max_wait ends its wait), or of the fleet's
 * (shared: redis: asked of the store, asked again every 15-25 ms while
 * none is free, this sidecar's share of the limit while the store does not
 * answer). Every plan has one: it counts the requests in flight for the
 * gauge, and a policy without a limit waits for nothing there (unless a
 * reload has given it one since). A slot is held until the upstream's
 * answer has come whole: a streamed body keeps it to its last byte. */
#include <stdio.h>

#include <event2/event.h>

#include "obs/log.h"
#include "proxy/exchange/stages.h"
#include "util/rand.h"

/* Fleet slots: how often a request waiting for one asks again (contract
 * §10: at most every 25 ms, never a spin), and how long past its upstream's
 * timeout a dead holder's slot stays taken. */
#define SLOT_POLL_MS 25
#define SLOT_HOLD_MARGIN_MS 5000

/* The next ask, 15 to 25 ms away at random. A fixed period locks in phase
 * with the releases: a slot held for a multiple of it is freed just before
 * the poll of the sidecar that took it, which takes it again, and another
 * sidecar's asker starves (measured: 1.5 s without a slot, its turn's
 * waiters behind it, with 100 ms answers and a 25 ms period). */
static uint64_t poll_ns(void)
{
    uint64_t lo = (SLOT_POLL_MS - 10) * NS_PER_MS;

    return lo + rand_u64() % (10 * NS_PER_MS + 1);
}

static enum ex_verdict got_slot(struct exchange *ex, uint64_t now)
{
    ex->has_slot = true;
    ex->got_slot = true;
    ex->permit_wait_ns = now - ex->wait_start_ns;
    return EXV_NEXT;
}

static enum ex_verdict no_slot(struct exchange *ex)
{
    ex_instruct(ex, OUT_REQUEUE, R_RATE_LIMITED, EX_SLOT_RETRY_MS,
                ex_attempts_so_far(ex), 0);
    ex->rate_headers = ex->bucket != NULL;
    return EXV_ANSWER;
}

/* From the thread that freed the slot, under the policy's lock. */
static void on_grant(struct slot_waiter *w)
{
    struct exchange *ex = w->arg;

    event_active(ex->slot_ev, EV_TIMEOUT, 0);
}

static enum ex_verdict local_slot(struct exchange *ex, uint64_t now)
{
    if (!ex->slot_ev &&
        !(ex->slot_ev = event_new(ex->env->base, -1, 0, ex_event_cb, ex))) {
        ex_refuse(ex, 500, OUT_REJECTED, R_INTERNAL, "out of memory");
        return EXV_ANSWER;
    }
    ex->slot.on_grant = on_grant;
    ex->slot.arg = ex;
    ex->slot.lane = ex->has_lane ? ex->lane : 0; /* slots follow the lanes' shares */
    if (pacing_slot_acquire(ex->ps, &ex->slot))
        return got_slot(ex, now);
    ex->slot_waiting = true;
    ex->wake_at = ex->wait_deadline_ns > now ? ex->wait_deadline_ns : now;
    return EXV_WAIT;
}

/* Woken by the grant, or by max_wait's end: a grant that raced the timer
 * still counts. */
static enum ex_verdict slot_woken(struct exchange *ex, uint64_t now)
{
    ex->slot_waiting = false;
    /* Still queued: not granted (the grant takes it out of the queue). */
    if (!pacing_slot_cancel(ex->ps, &ex->slot)) {
        event_del(ex->slot_ev); /* a pending activation is ours */
        return got_slot(ex, now);
    }
    return no_slot(ex);
}

static enum ex_verdict first_slot(struct exchange *ex, uint64_t now)
{
    ex_begin_wait(ex, now);
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
    return local_slot(ex, now);
}

static enum ex_verdict slot_run(struct exchange *ex, uint64_t now)
{
    return ex->woke == WOKE_FIRST ? first_slot(ex, now) : slot_woken(ex, now);
}

/* The local slot, once the flight is over (or was never started). */
static void give_local_slot(struct exchange *ex)
{
    if (ex->slot_waiting && !pacing_slot_cancel(ex->ps, &ex->slot)) {
        /* Granted in the meantime: ours to give back, and its pending
         * activation must not run after us. */
        ex->has_slot = true;
        event_del(ex->slot_ev);
    }
    ex->slot_waiting = false;
    if (ex->has_slot) {
        ex->has_slot = false;
        pacing_slot_release(ex->ps);
    }
}

/* A streamed body keeps its slot until its last byte (REL_FLIGHT). */
static bool in_flight(const struct exchange *ex, enum ex_release how)
{
    return how == REL_ANSWER && ex->streaming && !ex->up_done;
}

static void free_grant_event(struct exchange *ex, enum ex_release how)
{
    if (how == REL_END && ex->slot_ev) {
        event_free(ex->slot_ev);
        ex->slot_ev = NULL;
    }
}

static void slot_release(struct exchange *ex, enum ex_release how)
{
    if (!in_flight(ex, how))
        give_local_slot(ex);
    free_grant_event(ex, how);
}

const struct ex_stage stage_slot = {
    .name = "slot",
    .run = slot_run,
    .release = slot_release,
    .drain = ex_drain_unsent,
    .flags = STAGE_WATCH,
};

/* ---- the fleet's slots (shared: redis) ------------------------------------ */

/* A holder that dies gives its slot back after its request's timeout (the
 * route's, else the upstream's) and a margin. */
static int start_slot(struct exchange *ex)
{
    return store_slot_take_async(ex->env->store, ex->scall, ex->pol->name,
                                 ex->holder, ex->pol->concurrency,
                                 ex->timeout_ms + SLOT_HOLD_MARGIN_MS);
}

static void fall_back(struct exchange *ex)
{
    if (!atomic_exchange(&ex->ps->fallback, true))
        log_warn("policy %s: shared bucket unreachable (%s): pacing locally "
                 "at its share of the fleet's rate", ex->pol->name,
                 ex->scall->err.text);
}

/* Asked of the store; none free: asked again every 15 to 25 ms until
 * max_wait; no answer: this sidecar's own slots. */
static enum ex_verdict shared_slot(struct exchange *ex, uint64_t now, bool first)
{
    enum ex_verdict v = ex_store_wait(ex, now, start_slot, first, ST_SLOT);
    uint64_t next = now + poll_ns();

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

static void name_holder(struct exchange *ex)
{
    snprintf(ex->holder, sizeof ex->holder, "%016llx%016llx",
             (unsigned long long)rand_u64(), (unsigned long long)rand_u64());
}

static enum ex_verdict slot_fleet_run(struct exchange *ex, uint64_t now)
{
    if (ex->woke == WOKE_FIRST) {
        ex_begin_wait(ex, now);
        name_holder(ex);
        return shared_slot(ex, now, true);
    }
    if (ex->asking || ex->slot_polling)
        return shared_slot(ex, now, ex->slot_polling);
    return slot_woken(ex, now); /* waiting on the local fallback */
}

/* Gives a fleet slot back without waiting; also when its grant may be in
 * flight (a holder that was never granted is a no-op to remove). Its local
 * count goes back with has_slot, like a local slot's: once. */
static void give_shared_slot(struct exchange *ex)
{
    struct store_call c = {0};

    if (!ex->holder[0])
        return;
    ex_store_detach(&c, store_slot_give_async(ex->env->store, &c,
                                              ex->pol->name, ex->holder));
    ex->holder[0] = '\0';
    ex->shared_slot = false;
}

static void slot_fleet_release(struct exchange *ex, enum ex_release how)
{
    if (!in_flight(ex, how)) {
        give_shared_slot(ex);
        give_local_slot(ex);
    }
    free_grant_event(ex, how);
}

const struct ex_stage stage_slot_fleet = {
    .name = "slot_fleet",
    .run = slot_fleet_run,
    .release = slot_fleet_release,
    .drain = ex_drain_unsent,
    .flags = STAGE_WATCH,
};

/* ---- the fleet's slots, by this sidecar's lanes --------------------------- */

/* A fleet's slots for a policy with lanes (or a followed quota), before
 * its lane's permit: the requests waiting for one queue in their lanes on
 * this sidecar, and only the one the shares pick has the turn to ask the fleet
 * (and poll it every 15 to 25 ms); once it has a slot, or its wait ends,
 * or the store does not answer (this sidecar's own slots, as slot_fleet),
 * the turn goes to the next. So an interactive request waits for the head
 * before it, not behind a batch backlog, as for the fleet's permits. */

static void give_turn(struct exchange *ex)
{
    if (!ex->has_turn)
        return;
    ex->has_turn = false;
    pacing_turn_give(ex->ps);
}

/* The turn's ask is over (answered: a slot, none within max_wait, or the
 * fallback) unless it asks or polls still. */
static enum ex_verdict turn_slot(struct exchange *ex, uint64_t now, bool first)
{
    enum ex_verdict v;

    /* Named when it first asks: one refused in the queue gives nothing back. */
    if (!ex->holder[0])
        name_holder(ex);
    v = shared_slot(ex, now, first);

    if (!ex->asking && !ex->slot_polling)
        give_turn(ex);
    return v;
}

static enum ex_verdict turn_first(struct exchange *ex, uint64_t now)
{
    ex_begin_wait(ex, now);
    if (!ex->slot_ev &&
        !(ex->slot_ev = event_new(ex->env->base, -1, 0, ex_event_cb, ex))) {
        ex_refuse(ex, 500, OUT_REJECTED, R_INTERNAL, "out of memory");
        return EXV_ANSWER;
    }
    ex->slot.on_grant = on_grant;
    ex->slot.arg = ex;
    ex->slot.lane = ex->has_lane ? ex->lane : 0;
    if (pacing_turn_take(ex->ps, &ex->slot)) {
        ex->has_turn = true;
        return turn_slot(ex, now, true);
    }
    ex->turn_waiting = true;
    ex->wake_at = ex->wait_deadline_ns > now ? ex->wait_deadline_ns : now;
    return EXV_WAIT;
}

/* Woken in the turn's queue: handed the turn, or max_wait's end (a hand
 * that raced the timer still counts). */
static enum ex_verdict turn_woken(struct exchange *ex, uint64_t now)
{
    ex->turn_waiting = false;
    if (pacing_turn_cancel(ex->ps, &ex->slot))
        return no_slot(ex);
    event_del(ex->slot_ev); /* a pending activation is ours */
    ex->has_turn = true;
    return turn_slot(ex, now, true);
}

static enum ex_verdict slot_fleet_lanes_run(struct exchange *ex, uint64_t now)
{
    if (ex->woke == WOKE_FIRST)
        return turn_first(ex, now);
    if (ex->turn_waiting)
        return turn_woken(ex, now);
    if (ex->asking || ex->slot_polling)
        return turn_slot(ex, now, ex->slot_polling);
    return slot_woken(ex, now); /* waiting on the local fallback */
}

/* Out of the turn's queue, or the turn passed on, before the slot goes. */
static void leave_turn(struct exchange *ex)
{
    if (ex->turn_waiting) {
        ex->turn_waiting = false;
        if (!pacing_turn_cancel(ex->ps, &ex->slot)) {
            event_del(ex->slot_ev);
            ex->has_turn = true;
        }
    }
    give_turn(ex);
}

static void slot_fleet_lanes_release(struct exchange *ex, enum ex_release how)
{
    if (!in_flight(ex, how)) {
        leave_turn(ex);
        give_shared_slot(ex);
        give_local_slot(ex);
    }
    free_grant_event(ex, how);
}

const struct ex_stage stage_slot_fleet_lanes = {
    .name = "slot_fleet_lanes",
    .run = slot_fleet_lanes_run,
    .release = slot_fleet_lanes_release,
    .drain = ex_drain_unsent,
    .flags = STAGE_WATCH,
};
