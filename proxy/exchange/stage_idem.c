/* The idempotency rows of a keyed request's plan:
 *   key:    the key checked, the fingerprint taken;
 *   lookup: the store read (replay, 422, lease_held), then an in-memory
 *           claim while the request paces;
 *   lease:  the durable lease, taken atomically in the store as it forwards;
 *   commit: completed (before the worker sees it), released (a known,
 *           retryable result), or kept (unknown outcome) until expiry.
 * Lookup, lease and commit are store calls: each row starts its call and,
 * when the backend answers later (Redis), waits for the completion or the
 * store's timeout, whichever comes first. A fleet policy's keyed plan has
 * no lookup or lease row: its permit row takes the lease (stage_permit.c). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "obs/log.h"
#include "policies/idemkey.h"
#include "policies/verify.h"
#include "proxy/exchange/stages.h"

/* ---- key ------------------------------------------------------------------ */

/* The plan is keyed: the method is one the policy keys, and a key came or
 * one is required. */
static enum ex_verdict key_run(struct exchange *ex, uint64_t now)
{
    const struct sc_idempotency *id = &ex->pol->idem;
    const char *raw = ex->key; /* the policy's key header, read on arrival */
    size_t blen = ex->body ? evbuffer_get_length(ex->body) : 0;
    char why[128];

    if (!raw) {
        ex_refuse(ex, 400, OUT_REJECTED, R_MALFORMED_REQUEST,
                  "%s %s needs an %s header (policy %s)", ex->method,
                  ex->route->prefix, id->header, ex->pol->name);
        return EXV_ANSWER;
    }
    if (idem_key_parse(raw, ex->key_buf, why, sizeof why) != 0) {
        ex_refuse(ex, 400, OUT_REJECTED, R_MALFORMED_REQUEST, "invalid %s: %s",
                  id->header, why);
        return EXV_ANSWER;
    }
    ex->key = ex->key_buf;
    ex->idem = true;
    idem_fingerprint(id->fingerprint, ex->method, ex->target,
                     blen ? evbuffer_pullup(ex->body, -1) : NULL, blen, ex->fp);
    return EXV_NEXT;
}

const struct ex_stage stage_key = {
    .name = "key",
    .run = key_run,
    .flags = STAGE_WATCH,
};

/* ---- lookup --------------------------------------------------------------- */

static int start_get(struct exchange *ex)
{
    return store_get_async(ex->env->store, ex->scall, ex->pol->name, ex->key,
                           ex_wall_ms(ex));
}

int ex_start_watch(struct exchange *ex)
{
    return store_watch_async(ex->env->store, ex->scall, ex->pol->name, ex->key,
                             ex_wall_ms(ex));
}

/* What the store already knows; false when that answers the request. */
bool ex_looked_up(struct exchange *ex)
{
    uint64_t now = ex_wall_ms(ex);
    struct store_record *rec = &ex->replay;
    int rc = ex->scall->rc;

    if (rc == -ENOENT)
        return true;
    if (rc != 0) {
        ex_store_failed(ex, "read", &ex->scall->err);
        return false;
    }
    *rec = ex->scall->rec; /* the exchange owns it now */
    memset(&ex->scall->rec, 0, sizeof ex->scall->rec);
    if (memcmp(rec->fingerprint, ex->fp, STORE_FP_LEN) != 0) {
        ex_key_reused(ex);
        return false;
    }
    if (rec->state == STORE_COMPLETED) {
        ex->kind = ANSWER_REPLAY;
        return false;
    }
    /* The attempt count survives redeliveries: it is the store's. */
    ex->attempt = rec->attempt + 1;
    if (rec->lease_expires_ms > now) {
        ex_lease_held_record(ex, rec, now, false);
        return false;
    }
    store_record_clear(rec); /* released or expired lease: may take over */
    return true;
}

/* Fleet mode (contract §11): a lease read by a plain get (this row, or a
 * waiting duplicate's watch) does not say whether the process it names is
 * alive, which the permit-and-lease script tells. When the policy
 * verifies, one more read says it: the holder's liveness key. Once per
 * lease, and again at most once a second while a duplicate waits (a
 * holder may die meanwhile; its key outlives it by up to 3 s anyway). */
#define HOLDER_LOOK_EVERY_NS (1000 * NS_PER_MS)

static bool holder_unknown(const struct exchange *ex, uint64_t now)
{
    const struct store_record *rec = &ex->replay;

    if (ex->kind != ANSWER_INSTRUCTION || ex->reason != R_LEASE_HELD ||
        !ex->pol->idem.verify.enabled || rec->state != STORE_IN_PROGRESS ||
        !rec->lease || !store_loop_holder_other(ex->env->store, rec->holder))
        return false;
    return rec->lease != ex->holder_fence ||
           now - ex->holder_looked_ns >= HOLDER_LOOK_EVERY_NS;
}

static int start_holder_look(struct exchange *ex)
{
    return store_holder_look_async(ex->env->store, ex->scall, ex->pol->name,
                                   ex->replay.holder);
}

/* Looks at the liveness key of the holder of ex->replay (held, its answer
 * lease_held): gone, the answer is made again as for a dead holder, which
 * starts the lease's verification. A failed look keeps the answer: the
 * holder is taken for alive, as without the look. */
static enum ex_verdict holder_look(struct exchange *ex, uint64_t now)
{
    bool first = !ex->holder_looking;
    enum ex_verdict v;

    ex->holder_looking = true;
    v = ex_store_wait(ex, now, start_holder_look, first, ST_GET);
    if (v != EXV_NEXT)
        return v;
    ex->holder_looking = false;
    ex->holder_fence = ex->replay.lease;
    ex->holder_looked_ns = now;
    if (ex->scall->rc == 0 && ex->scall->acq.holder_gone)
        ex_lease_held_record(ex, &ex->replay, ex_wall_ms(ex), true);
    else if (ex->scall->rc != 0)
        log_warn("policy %s: cannot tell whether a lease's holder is alive "
                 "(taken for alive): %s", ex->pol->name, ex->scall->err.text);
    return EXV_NEXT;
}

enum ex_verdict ex_not_free(struct exchange *ex, uint64_t now)
{
    enum ex_verdict v;

    if ((ex->holder_looking || holder_unknown(ex, now)) &&
        (v = holder_look(ex, now)) != EXV_NEXT)
        return v;
    return ex_wait_for_holder(ex, now, true, ex->replay.lease) ? EXV_WAIT
                                                                : EXV_ANSWER;
}

static bool claim(struct exchange *ex, uint64_t now)
{
    uint64_t remaining, deadline = now + ex->max_wait_ns;

    if (claims_take(ex->env->claims, ex->pol->name, ex->key, now, deadline,
                    ex->timeout_ms * NS_PER_MS, &remaining)) {
        ex->claimed = true;
        return true;
    }
    ex_lease_held(ex, (remaining + NS_PER_MS - 1) / NS_PER_MS);
    return false;
}

/* duplicates: wait (contract §6): a key in progress (a lease, or a claim
 * waiting for its permit) is looked at again instead of answered, 2 ms
 * after the first look and then twice as long each time, up to 25 ms
 * apart, until it is completed (the replay), free (a first request), or the
 * policy's max_wait, counted from the first look and shared with the
 * permit's wait, is up (lease_held as with refuse). Polling the store: the
 * holder's record is visible to every loop (and, on Redis, to every
 * sidecar of the fleet) the moment it is written.
 *
 * In fleet mode, while the store announces the end of the policy's leases
 * (store_notified), a lease held in the store is waited for on the loop's
 * registry of waiters instead: the request joins it, then watches the key
 * (a look that marks the lease, so that whoever ends it publishes the key;
 * joined first, so no notice can come between the mark and the joining),
 * and looks again when the notice wakes it, or every 25 ms as the fallback
 * for a lost one. A lease taken over by another holder (a new fence) is
 * watched again: its record carries no mark. */
#define DUP_POLL_FIRST_NS (2 * NS_PER_MS)
#define DUP_POLL_MAX_NS (25 * NS_PER_MS)

/* From the store's thread, under the registry's lock: only the event. */
static void on_dup_notice_posted(struct key_waiter *w)
{
    struct exchange *ex = w->arg;

    event_active(ex->dup_ev, EV_TIMEOUT, 0);
}

/* On the loop: a look in flight now may have missed this end, so the
 * next wait looks again at once. */
static void on_dup_notice(evutil_socket_t fd, short what, void *arg)
{
    struct exchange *ex = arg;

    ex->dup_noticed = true;
    ex_wake(ex);
}

/* Joins the loop's waiters for the key: false when it cannot (no
 * registry, no memory), and the request polls. */
static bool dup_join(struct exchange *ex)
{
    if (ex->dup_kw.in)
        return true;
    if (!ex->env->dup_waiters)
        return false;
    if (!ex->dup_ev &&
        !(ex->dup_ev = event_new(ex->env->base, -1, 0, on_dup_notice, ex)))
        return false;
    ex->dup_kw.wake = on_dup_notice_posted;
    ex->dup_kw.arg = ex;
    key_waiters_add(ex->env->dup_waiters, &ex->dup_kw, ex->pol->name, ex->key);
    return true;
}

void ex_dup_leave(struct exchange *ex)
{
    if (ex->dup_kw.in)
        key_waiters_remove(ex->env->dup_waiters, &ex->dup_kw);
    if (ex->dup_ev)
        event_del(ex->dup_ev); /* a pending notice is ours */
    ex->dup_noticed = ex->dup_watch = ex->dup_looking = ex->dup_marked = false;
}

void ex_dup_release(struct exchange *ex)
{
    ex_dup_leave(ex);
    if (ex->dup_ev)
        event_free(ex->dup_ev);
    ex->dup_ev = NULL;
}

/* The next look's delay with the notices: at once to watch a lease not
 * marked yet (or after a notice during the last look), else the fallback. */
static uint64_t noticed_step(struct exchange *ex, uint64_t fence)
{
    if (ex->dup_watch) { /* this answer came from a watch: marked */
        ex->dup_watch = false;
        ex->dup_marked = true;
        ex->dup_fence = fence;
    }
    if (!ex->dup_marked || ex->dup_fence != fence) {
        ex->dup_watch = true;
        return 0;
    }
    if (ex->dup_noticed)
        return 0;
    return DUP_POLL_MAX_NS;
}

static uint64_t polled_step(struct exchange *ex)
{
    return !ex->dup_poll_ns ? DUP_POLL_FIRST_NS
           : ex->dup_poll_ns * 2 > DUP_POLL_MAX_NS ? DUP_POLL_MAX_NS
                                                   : ex->dup_poll_ns * 2;
}

static bool noticed(struct exchange *ex, bool in_store)
{
    return in_store && ex->env->dup_waiters &&
           store_loop_notified(ex->env->store, ex->pol->name) && dup_join(ex);
}

bool ex_wait_for_holder(struct exchange *ex, uint64_t now, bool in_store,
                        uint64_t fence)
{
    uint64_t step;

    if (ex->pol->idem.duplicates != SC_DUP_WAIT ||
        ex->kind != ANSWER_INSTRUCTION || ex->reason != R_LEASE_HELD) {
        ex_dup_leave(ex);
        return false;
    }
    ex_begin_wait(ex, now);
    if (now >= ex->wait_deadline_ns) {
        ex_dup_leave(ex);
        return false;
    }
    if (noticed(ex, in_store)) {
        step = noticed_step(ex, fence);
    } else {
        ex->dup_watch = ex->dup_marked = false;
        step = polled_step(ex);
        ex->dup_poll_ns = step;
    }
    ex->dup_waiting = true;
    ex->wake_at = now + step < ex->wait_deadline_ns ? now + step : ex->wait_deadline_ns;
    /* Not the answer yet: the next look decides. */
    store_record_clear(&ex->replay);
    ex->kind = ANSWER_PROBLEM;
    ex->status = 0;
    ex->outcome = 0;
    ex->reason = R_NONE;
    memset(&ex->instr, 0, sizeof ex->instr);
    return true;
}

static enum ex_verdict lookup_run(struct exchange *ex, uint64_t now)
{
    bool first = ex->woke == WOKE_FIRST || ex->dup_waiting;
    enum ex_verdict v;

    if (ex->holder_looking)
        return ex_not_free(ex, now);
    if (ex->dup_waiting)
        ex->dup_noticed = false; /* this look sees what the notice told */
    ex->dup_waiting = false;
    v = ex_store_wait(ex, now, ex->dup_watch ? ex_start_watch : start_get, first,
                      ST_GET);
    if (v != EXV_NEXT)
        return v;
    if (!ex_looked_up(ex))
        return ex_not_free(ex, now);
    if (claim(ex, now)) {
        ex_dup_leave(ex);
        return EXV_NEXT;
    }
    return ex_wait_for_holder(ex, now, false, 0) ? EXV_WAIT : EXV_ANSWER;
}

/* The claim ends with the answer: from then on the lease (or nothing) keeps
 * duplicates off. */
static void lookup_release(struct exchange *ex, enum ex_release how)
{
    ex_dup_release(ex);
    if (ex->claimed)
        claims_drop(ex->env->claims, ex->pol->name, ex->key);
    ex->claimed = false;
}

const struct ex_stage stage_lookup = {
    .name = "lookup",
    .run = lookup_run,
    .release = lookup_release,
    .drain = ex_drain_unsent,
    .flags = STAGE_WATCH,
};

/* ---- lease ---------------------------------------------------------------- */

static int start_acquire(struct exchange *ex)
{
    const struct sc_idempotency *id = &ex->pol->idem;

    return store_acquire_async(ex->env->store, ex->scall, ex->pol->name, ex->key,
                               ex->fp, ex_wall_ms(ex), id->lease_ms, id->ttl_ms);
}

static enum ex_verdict lease_run(struct exchange *ex, uint64_t now)
{
    enum ex_verdict v = ex_store_wait(ex, now, start_acquire, ex->woke == WOKE_FIRST,
                                      ST_ACQUIRE);

    if (v != EXV_NEXT)
        return v;
    return ex_take_lease(ex) ? EXV_NEXT : EXV_ANSWER;
}

static void lease_release(struct exchange *ex, enum ex_release how)
{
    ex_lease_give_back(ex);
}

const struct ex_stage stage_lease = {
    .name = "lease",
    .run = lease_run,
    .release = lease_release,
    .drain = ex_drain_unsent,
};

/* ---- commit --------------------------------------------------------------- */

static bool replayable(const struct exchange *ex)
{
    return ex->kind == ANSWER_UPSTREAM && outcome_replayable(ex->pol, ex->status);
}

/* The end-to-end headers, as the worker gets them: the request's own
 * X-Request-Id in place of any the upstream sent, so a replay carries the
 * id of the request that reached the partner. h has room for one more. */
size_t ex_stored_headers(struct exchange *ex, const struct up_response *r,
                         struct store_header *h)
{
    const struct up_header *keep[UP_MAX_HEADERS];
    size_t n = up_response_end_to_end(r, keep), m = 0;

    for (size_t i = 0; i < n; i++) {
        if (strcasecmp(keep[i]->name, EX_REQUEST_ID_HEADER) == 0)
            continue;
        h[m].name = keep[i]->name;
        h[m].value = keep[i]->value;
        m++;
    }
    h[m].name = EX_REQUEST_ID_HEADER;
    h[m].value = (char *)ex_request_id(ex);
    return m + 1;
}

/* Stores the answer for replay; head-only (a body over max_stored_body, or
 * one still streaming) status and headers only. The backend copies what it
 * needs before the call returns. */
static int start_complete(struct exchange *ex)
{
    const struct up_response *r = &ex->ureq.resp;
    bool omit = ex->commit == COMMIT_COMPLETE_HEAD;
    struct store_header *h = calloc(r->n_headers + 1, sizeof *h);
    size_t blen = omit ? 0 : evbuffer_get_length(r->body);
    int rc;

    if (!h) {
        ex->scall->rc = -ENOMEM;
        sc_error_set(&ex->scall->err, "out of memory");
        return -ENOMEM;
    }
    rc = store_complete_async(ex->env->store, ex->scall, ex->pol->name, ex->key,
                              ex->lease, ex_wall_ms(ex), ex->pol->idem.ttl_ms,
                              r->status, h, ex_stored_headers(ex, r, h),
                              blen ? evbuffer_pullup(r->body, -1) : NULL, blen,
                              omit);
    free(h);
    return rc;
}

static void completed(struct exchange *ex)
{
    struct metrics_shard *sh = ex->env->metrics;

    if (ex->scall->rc == 0 && ex->scall->replication_short) {
        /* Stored on the primary, not yet confirmed by replicas_ack
         * replicas: answered anyway (the side effect happened); a failover
         * now could lose it, which the counter makes visible. */
        metrics_add(sh, ex->ids->replication_timeouts, 1);
        log_debug("policy %s: a completed result is not confirmed by "
                  "store.replicas_ack replicas yet", ex->pol->name);
    }
    if (ex->scall->rc == 0)
        return;
    /* The side effect happened; the worker must still learn the truth.
     * The lease stays, so a duplicate waits for its expiry. Counted
     * apart too: the one store failure that leaves a redelivery risk. */
    ex_count_store_error(ex);
    metrics_add(sh, ex->ids->commit_failures, 1);
    if (ex->scall->rc == -ESTALE) /* fenced: the key is another lease's now */
        log_warn("policy %s: the completed result of a key is not stored: "
                 "this request outlived its lease: %s", ex->pol->name,
                 ex->scall->err.text);
    else
        log_error("policy %s: cannot store the completed result of a key: %s",
                  ex->pol->name, ex->scall->err.text);
}

static int start_release(struct exchange *ex)
{
    return store_release_async(ex->env->store, ex->scall, ex->pol->name, ex->key,
                               ex->attempt, ex->lease, ex_wall_ms(ex),
                               ex->pol->idem.ttl_ms);
}

/* The verification of this unknown outcome, started in the background
 * when the policy verifies (contract §11): its deadline D (wall ms), 0
 * when none runs. */
static uint64_t verify_begin(struct exchange *ex)
{
    enum outcome_transport t = ex->ureq.resp.result == UP_TIMEOUT ? OT_TIMEOUT
                                                                  : OT_CONNECTION_LOST;

    if (!ex->env->verify_begin || !verify_on_outcome(&ex->pol->idem, t, ex->leased))
        return 0;
    return ex->env->verify_begin(ex->env->verify_arg, ex);
}

/* Unknown outcome: the lease stands until it expires, and the job must
 * not come back before then; unless a verification settles it sooner, and
 * then the job comes back when the verification has ended (D), whatever
 * it found, rather than after the whole lease. */
static void keep(struct exchange *ex)
{
    uint64_t lease_ms = ex->pol->idem.lease_ms;
    uint64_t deadline = verify_begin(ex);
    bool requeue = ex->kind == ANSWER_INSTRUCTION && ex->outcome == OUT_REQUEUE;

    if (deadline) {
        if (requeue)
            ex->instr.delay_ms = verify_requeue_delay_ms(deadline, ex_wall_ms(ex),
                                                         ex->instr.delay_ms);
        ex->instr.verify_pending = ex->kind == ANSWER_INSTRUCTION;
        return;
    }
    if (requeue && ex->instr.delay_ms < lease_ms)
        ex->instr.delay_ms = lease_ms;
}

/* What the commit writes: nothing for an unknown outcome (the lease is
 * kept), the answer for replay, or the key freed for a known, retryable
 * result. */
static enum ex_commit commit_op(struct exchange *ex)
{
    bool head_only = !ex->up_done && ex->kind == ANSWER_UPSTREAM;
    enum up_result r = ex->ureq.resp.result;

    if (!head_only && (r == UP_TIMEOUT || r == UP_CONNECTION_LOST))
        return COMMIT_KEEP;
    if (!replayable(ex))
        return COMMIT_RELEASE;
    if (head_only || evbuffer_get_length(ex->ureq.resp.body) >
                         ex->pol->idem.max_stored_body)
        return COMMIT_COMPLETE_HEAD;
    return COMMIT_COMPLETE;
}

/* Runs when the answer is known: at the upstream's end, or at its head
 * when the body is to stream (stored then without it). The worker sees
 * the answer only once the store has it. */
static enum ex_verdict commit_run(struct exchange *ex, uint64_t now)
{
    enum ex_verdict v;

    if (!ex->leased || ex->settled)
        return EXV_NEXT; /* drained before its lease: nothing to write */
    if (ex->woke == WOKE_FIRST)
        ex->commit = commit_op(ex);
    if (ex->commit == COMMIT_KEEP) {
        keep(ex);
        ex->settled = true;
        return EXV_NEXT;
    }
    v = ex_store_wait(ex, now,
                      ex->commit == COMMIT_RELEASE ? start_release : start_complete,
                      ex->woke == WOKE_FIRST,
                      ex->commit == COMMIT_RELEASE ? ST_RELEASE : ST_COMPLETE);
    if (v != EXV_NEXT)
        return v;
    ex->settled = true;
    if (ex->commit == COMMIT_RELEASE)
        ex_log_release(ex, ex->scall->rc, &ex->scall->err);
    else
        completed(ex);
    return EXV_NEXT;
}

const struct ex_stage stage_commit = {
    .name = "commit",
    .run = commit_run,
    .flags = STAGE_SETTLES,
};
