/* The idempotency stages of an exchange:
 *   key:    key checked, fingerprint taken;
 *   lookup: the store read (replay, 422, lease_held), then an in-memory
 *           claim while pacing;
 *   lease:  the durable lease, taken atomically in the store as it forwards;
 *   commit: completed (before the worker sees it), released (a known,
 *           retryable result), or kept (unknown outcome) until expiry.
 * Lookup, lease and commit are store calls: each stage starts its call
 * and, when the backend answers later (Redis), waits for the completion or
 * the store's timeout, whichever comes first. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <event2/buffer.h>

#include "policies/idemkey.h"
#include "proxy/app.h"
#include "proxy/exchange_internal.h"
#include "obs/log.h"
#include "proxy/server.h"
#include "util/clock.h"

static const char *scope(const struct exchange *ex)
{
    return ex->pol->name;
}

static void count_store_error(struct exchange *ex)
{
    struct app *app = ex->loop->app;

    metrics_add(&app->metrics.shards[ex->loop->idx], ex->rt->ids.store_errors, 1);
}

static void store_failed(struct exchange *ex, const char *what,
                         const struct sc_error *err)
{
    count_store_error(ex);
    log_error("policy %s: idempotency store %s failed: %s", scope(ex), what,
              err->text);
    ex_instruct(ex, OUT_REQUEUE, R_STORE_UNAVAILABLE, 1000,
                ex->attempt ? ex->attempt - 1 : 0, 0);
}

static void lease_held(struct exchange *ex, uint64_t remaining_ms)
{
    ex_instruct(ex, OUT_REQUEUE, R_LEASE_HELD, remaining_ms ? remaining_ms : 1,
                ex->attempt ? ex->attempt - 1 : 0, 0);
}

static void mismatch(struct exchange *ex)
{
    ex_refuse(ex, 422, OUT_REJECTED, R_KEY_REUSED,
              "%s %s was used for a different request "
              "(method, path or body differ)", ex->pol->idem.header, ex->key);
}

/* ---- arrival ------------------------------------------------------------ */

static bool applies(const struct exchange *ex)
{
    return ex->pol->idem.enabled &&
           (ex->pol->idem.methods & sc_method_bit(ex->method));
}

/* Key and fingerprint; false when the request was refused. */
static bool read_key(struct exchange *ex)
{
    const char *raw = ex->key; /* the policy's key header, read on arrival */
    char why[128];
    size_t blen = ex->body ? evbuffer_get_length(ex->body) : 0;

    if (!raw) {
        if (!ex->pol->idem.required)
            return true;
        ex_refuse(ex, 400, OUT_REJECTED, R_MALFORMED_REQUEST,
                  "%s %s needs an %s header (policy %s)", ex->method,
                  ex->route->prefix, ex->pol->idem.header, scope(ex));
        return false;
    }
    if (idem_key_parse(raw, ex->key_buf, why, sizeof why) != 0) {
        ex_refuse(ex, 400, OUT_REJECTED, R_MALFORMED_REQUEST, "invalid %s: %s",
                  ex->pol->idem.header, why);
        return false;
    }
    ex->key = ex->key_buf;
    ex->idem = true;
    idem_fingerprint(ex->pol->idem.fingerprint, ex->method, ex->target,
                     blen ? evbuffer_pullup(ex->body, -1) : NULL, blen, ex->fp);
    return true;
}

static int start_get(struct exchange *ex)
{
    return store_get_async(ex->loop->store, ex->scall, scope(ex), ex->key,
                           clock_wall_ms());
}

/* What the store already knows; false when that answers the request. */
static bool looked_up(struct exchange *ex)
{
    uint64_t now = clock_wall_ms();
    struct store_record *rec = &ex->replay;
    int rc = ex->scall->rc;

    if (rc == -ENOENT)
        return true;
    if (rc != 0) {
        store_failed(ex, "read", &ex->scall->err);
        return false;
    }
    *rec = ex->scall->rec; /* the exchange owns it now */
    memset(&ex->scall->rec, 0, sizeof ex->scall->rec);
    if (memcmp(rec->fingerprint, ex->fp, STORE_FP_LEN) != 0) {
        mismatch(ex);
        return false;
    }
    if (rec->state == STORE_COMPLETED) {
        ex->kind = ANSWER_REPLAY;
        return false;
    }
    /* The attempt count survives redeliveries: it is the store's. */
    ex->attempt = rec->attempt + 1;
    if (rec->lease_expires_ms > now) {
        lease_held(ex, rec->lease_expires_ms - now);
        return false;
    }
    store_record_clear(rec); /* released or expired lease: may take over */
    return true;
}

static bool claim(struct exchange *ex)
{
    uint64_t now = clock_mono_ns(), remaining;
    uint64_t deadline = now + ex->pol->max_wait_ms * NS_PER_MS;

    if (claims_take(&ex->loop->app->claims, scope(ex), ex->key, now, deadline,
                    sc_route_timeout(ex->route, ex->up) * NS_PER_MS, &remaining)) {
        ex->claimed = true;
        return true;
    }
    lease_held(ex, (remaining + NS_PER_MS - 1) / NS_PER_MS);
    return false;
}

enum ex_verdict stage_key(struct exchange *ex, uint64_t now)
{
    if (!applies(ex))
        return EXV_NEXT;
    return read_key(ex) ? EXV_NEXT : EXV_ANSWER;
}

enum ex_verdict stage_lookup(struct exchange *ex, uint64_t now)
{
    enum ex_verdict v;

    /* With the fleet's bucket the permit's script reads the record too. */
    if (!ex->idem || pace_fuses_lease(ex))
        return EXV_NEXT;
    if ((v = ex_store_wait(ex, now, start_get, ex->woke == WOKE_FIRST, ST_GET)) != EXV_NEXT)
        return v;
    return looked_up(ex) && claim(ex) ? EXV_NEXT : EXV_ANSWER;
}

/* ---- forwarding --------------------------------------------------------- */

static int start_acquire(struct exchange *ex)
{
    const struct sc_idempotency *id = &ex->pol->idem;

    return store_acquire_async(ex->loop->store, ex->scall, scope(ex), ex->key,
                               ex->fp, clock_wall_ms(), id->lease_ms,
                               id->ttl_ms);
}

static bool took_lease(struct exchange *ex)
{
    struct store_acquire_out *out = &ex->scall->acq;
    const struct sc_idempotency *id = &ex->pol->idem;

    if (ex->scall->rc != 0) {
        store_failed(ex, "lease", &ex->scall->err);
        return false;
    }
    switch (out->claim) {
    case STORE_ACQUIRED:
        ex->attempt = out->attempt;
        ex->lease = out->lease;
        ex->leased = true;
        atomic_fetch_add(&ex->loop->app->leases_active, 1);
        if (ex->claimed)
            claims_forwarded(&ex->loop->app->claims, scope(ex), ex->key,
                             clock_mono_ns() + id->lease_ms * NS_PER_MS);
        return true;
    case STORE_HELD:
        lease_held(ex, out->remaining_ms);
        return false;
    case STORE_DONE:
        ex->replay = out->rec; /* the exchange owns it now */
        memset(&out->rec, 0, sizeof out->rec);
        ex->kind = ANSWER_REPLAY;
        return false;
    default:
        mismatch(ex);
        return false;
    }
}

bool idem_lease_with_permit(struct exchange *ex)
{
    if (ex->scall->rc == 0 && ex->scall->acq.claim == STORE_FREE) {
        ex->attempt = ex->scall->acq.attempt;
        return true;
    }
    if (!took_lease(ex))
        return false;
    ex->lease_with_permit = true;
    return true;
}

enum ex_verdict stage_lease(struct exchange *ex, uint64_t now)
{
    enum ex_verdict v;

    if (!ex->idem || ex->leased)
        return EXV_NEXT;
    if ((v = ex_store_wait(ex, now, start_acquire, ex->woke == WOKE_FIRST, ST_ACQUIRE)) != EXV_NEXT)
        return v;
    return took_lease(ex) ? EXV_NEXT : EXV_ANSWER;
}

/* ---- result ------------------------------------------------------------- */

bool ex_idem_replayable(const struct exchange *ex)
{
    return ex->kind == ANSWER_UPSTREAM &&
           sc_idem_replays_status(&ex->pol->idem, ex->status) &&
           !sc_retry_on_status(&ex->pol->retry, ex->status);
}

/* The end-to-end headers, as the worker gets them: the request's own
 * X-Request-Id in place of any the upstream sent, so a replay carries the
 * id of the request that reached the partner. h has room for one more. */
static size_t stored_headers(struct exchange *ex, const struct up_response *r,
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
    rc = store_complete_async(ex->loop->store, ex->scall, scope(ex), ex->key,
                              ex->lease, clock_wall_ms(), ex->pol->idem.ttl_ms, r->status,
                              h, stored_headers(ex, r, h),
                              blen ? evbuffer_pullup(r->body, -1) : NULL, blen,
                              omit);
    free(h);
    return rc;
}

static void completed(struct exchange *ex)
{
    struct app *app = ex->loop->app;

    if (ex->scall->rc == 0 && ex->scall->replication_short) {
        /* Stored on the primary, not yet confirmed by replicas_ack
         * replicas: answered anyway (the side effect happened); a failover
         * now could lose it, which the counter makes visible. */
        metrics_add(&app->metrics.shards[ex->loop->idx],
                    ex->rt->ids.replication_timeouts, 1);
        log_debug("policy %s: a completed result is not confirmed by "
                  "store.replicas_ack replicas yet", scope(ex));
    }
    if (ex->scall->rc == 0)
        return;
    /* The side effect happened; the worker must still learn the truth.
     * The lease stays, so a duplicate waits for its expiry. Counted
     * apart too: the one store failure that leaves a redelivery risk. */
    count_store_error(ex);
    metrics_add(&ex->loop->app->metrics.shards[ex->loop->idx], ex->rt->ids.commit_failures, 1);
    if (ex->scall->rc == -ESTALE) /* fenced: the key is another lease's now */
        log_warn("policy %s: the completed result of a key is not stored: "
                 "this request outlived its lease: %s", scope(ex),
                 ex->scall->err.text);
    else
        log_error("policy %s: cannot store the completed result of a key: %s",
                  scope(ex), ex->scall->err.text);
}

static int start_release(struct exchange *ex)
{
    return store_release_async(ex->loop->store, ex->scall, scope(ex), ex->key,
                               ex->attempt, ex->lease, clock_wall_ms(),
                               ex->pol->idem.ttl_ms);
}

static void released(struct exchange *ex, int rc, const struct sc_error *err)
{
    if (rc == -ESTALE) {
        /* This request outlived its lease (a stalled loop) and another took
         * the key over: its lease is not ours to end. */
        log_warn("policy %s: lease not released: %s", scope(ex), err->text);
    } else if (rc != 0 && rc != -ENOENT && rc != -EINPROGRESS) {
        /* -ENOENT: nothing to release (expired and swept): an answer, not
         * a failure. */
        count_store_error(ex);
        log_error("policy %s: cannot release a lease: %s", scope(ex), err->text);
    }
}

/* Unknown outcome: the lease stands until it expires, and the job must
 * not come back before then. */
static void keep(struct exchange *ex)
{
    uint64_t lease_ms = ex->pol->idem.lease_ms;

    if (ex->kind == ANSWER_INSTRUCTION && ex->outcome == OUT_REQUEUE &&
        ex->instr.delay_ms < lease_ms)
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
    if (!ex_idem_replayable(ex))
        return COMMIT_RELEASE;
    if (head_only || evbuffer_get_length(ex->ureq.resp.body) >
                         ex->pol->idem.max_stored_body)
        return COMMIT_COMPLETE_HEAD;
    return COMMIT_COMPLETE;
}

/* Runs when the answer is known: at the upstream's end, or at its head
 * when the body is to stream (stored then without it). The worker sees
 * the answer only once the store has it. */
enum ex_verdict stage_commit(struct exchange *ex, uint64_t now)
{
    enum ex_verdict v;

    if (!ex->leased || ex->settled)
        return EXV_ANSWER;
    if (ex->woke == WOKE_FIRST)
        ex->commit = commit_op(ex);
    if (ex->commit == COMMIT_KEEP) {
        keep(ex);
        ex->settled = true;
        return EXV_ANSWER;
    }
    v = ex_store_wait(ex, now,
                      ex->commit == COMMIT_RELEASE ? start_release : start_complete,
                      ex->woke == WOKE_FIRST,
                      ex->commit == COMMIT_RELEASE ? ST_RELEASE : ST_COMPLETE);
    if (v != EXV_NEXT)
        return v;
    ex->settled = true;
    if (ex->commit == COMMIT_RELEASE)
        released(ex, ex->scall->rc, &ex->scall->err);
    else
        completed(ex);
    return EXV_ANSWER;
}

/* Frees the key of a request that leaves unsent, without waiting: its
 * completion is not awaited (a failure leaves the lease to expire). A
 * lease taken with the fleet's permit, before the request's waits, gives
 * its attempt back too: waiting spends none of a job's attempts. */
static void release_unsent(struct exchange *ex)
{
    struct store_call c = {0};
    int rc = ex->lease_with_permit
        ? store_release_unsent_async(ex->loop->store, &c, scope(ex), ex->key,
                                     ex->attempt, ex->lease, clock_wall_ms(),
                                     ex->pol->idem.ttl_ms)
        : store_release_async(ex->loop->store, &c, scope(ex), ex->key,
                              ex->attempt, ex->lease, clock_wall_ms(),
                              ex->pol->idem.ttl_ms);

    ex_store_detach(&c, rc);
    released(ex, rc, &c.err);
}

void idem_release_lease(struct exchange *ex)
{
    if (!ex->leased)
        return;
    if (!ex->settled) {
        /* Left without a commit (the worker gone, no memory): nothing sent
         * frees the key; something sent may have had its effect. */
        ex->settled = true;
        if (!ex->sent)
            release_unsent(ex);
    }
    ex->leased = false;
    atomic_fetch_sub(&ex->loop->app->leases_active, 1);
}

void idem_unclaim(struct exchange *ex)
{
    if (ex->claimed)
        claims_drop(&ex->loop->app->claims, scope(ex), ex->key);
    ex->claimed = false;
}
