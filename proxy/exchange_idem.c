/* The idempotency stages of an exchange:
 *   key:    key checked, fingerprint taken, the store looked up (replay,
 *           422, lease_held), then an in-memory claim while pacing;
 *   lease:  the durable lease, taken atomically in the store as it forwards;
 *   commit: completed (before the worker sees it), released (a known,
 *           retryable result), or kept (unknown outcome) until expiry. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    ex_refuse(ex, 422, OUT_REJECTED, R_MALFORMED_REQUEST,
              "Idempotency-Key %s was used for a different request "
              "(method, path or body differ)", ex->key);
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

/* What the store already knows; false when that answers the request. */
static bool look_up(struct exchange *ex)
{
    struct sc_error err = {0};
    uint64_t now = clock_wall_ms();
    struct store_record *rec = &ex->replay;
    int rc = store_get(ex->loop->app->store, scope(ex), ex->key, now, rec, &err);

    if (rc == -ENOENT)
        return true;
    if (rc != 0) {
        store_failed(ex, "read", &err);
        return false;
    }
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
                    ex->up->timeout_ms * NS_PER_MS, &remaining)) {
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
    if (!read_key(ex) || (ex->idem && (!look_up(ex) || !claim(ex))))
        return EXV_ANSWER;
    return EXV_NEXT;
}

/* ---- forwarding --------------------------------------------------------- */

static bool take_lease(struct exchange *ex)
{
    struct store_acquire_out out = {0};
    struct sc_error err = {0};
    const struct sc_idempotency *id = &ex->pol->idem;
    uint64_t now = clock_wall_ms();
    int rc;

    if (!ex->idem)
        return true;
    rc = store_acquire(ex->loop->app->store, scope(ex), ex->key, ex->fp, now,
                       id->lease_ms, id->ttl_ms, &out, &err);
    if (rc != 0) {
        store_failed(ex, "lease", &err);
        return false;
    }
    switch (out.claim) {
    case STORE_ACQUIRED:
        ex->attempt = out.attempt;
        ex->leased = true;
        atomic_fetch_add(&ex->loop->app->leases_active, 1);
        claims_forwarded(&ex->loop->app->claims, scope(ex), ex->key,
                         clock_mono_ns() + id->lease_ms * NS_PER_MS);
        return true;
    case STORE_HELD:
        lease_held(ex, out.remaining_ms);
        return false;
    case STORE_DONE:
        ex->replay = out.rec;
        ex->kind = ANSWER_REPLAY;
        return false;
    default:
        mismatch(ex);
        return false;
    }
}

enum ex_verdict stage_lease(struct exchange *ex, uint64_t now)
{
    return take_lease(ex) ? EXV_NEXT : EXV_ANSWER;
}

/* ---- result ------------------------------------------------------------- */

bool ex_idem_replayable(const struct exchange *ex)
{
    return ex->kind == ANSWER_UPSTREAM &&
           sc_idem_replays_status(&ex->pol->idem, ex->status) &&
           !sc_retry_on_status(&ex->pol->retry, ex->status);
}

/* The end-to-end headers, as the worker gets them. */
static size_t stored_headers(const struct up_response *r, struct store_header *h)
{
    const struct up_header *keep[UP_MAX_HEADERS];
    size_t n = up_response_end_to_end(r, keep);

    for (size_t i = 0; i < n; i++) {
        h[i].name = keep[i]->name;
        h[i].value = keep[i]->value;
    }
    return n;
}

/* Stores the answer for replay; with omit (a body over max_stored_body)
 * status and headers only. */
static void complete(struct exchange *ex, bool omit)
{
    const struct up_response *r = &ex->ureq.resp;
    struct store_header *h = calloc(r->n_headers + 1, sizeof *h);
    size_t blen = omit ? 0 : evbuffer_get_length(r->body);
    struct sc_error err = {0};
    int rc = -ENOMEM;

    if (h)
        rc = store_complete(ex->loop->app->store, scope(ex), ex->key,
                            clock_wall_ms(), ex->pol->idem.ttl_ms, r->status, h,
                            stored_headers(r, h),
                            blen ? evbuffer_pullup(r->body, -1) : NULL, blen,
                            omit, &err);
    free(h);
    if (rc != 0) {
        /* The side effect happened; the worker must still learn the truth.
         * The lease stays, so a duplicate waits for its expiry. */
        count_store_error(ex);
        log_error("policy %s: cannot store the completed result of a key: %s",
                  scope(ex), rc == -ENOMEM ? "out of memory" : err.text);
    }
}

static void release(struct exchange *ex)
{
    struct sc_error err = {0};
    int rc = store_release(ex->loop->app->store, scope(ex), ex->key, ex->attempt,
                           clock_wall_ms(), ex->pol->idem.ttl_ms, &err);

    if (rc == -ESTALE) {
        /* This request outlived its lease (a stalled loop) and another took
         * the key over: its lease is not ours to end. */
        log_warn("policy %s: lease not released: %s", scope(ex), err.text);
    } else if (rc != 0 && rc != -ENOENT) {
        /* -ENOENT: nothing to release (expired and swept): an answer, not
         * a failure. */
        count_store_error(ex);
        log_error("policy %s: cannot release a lease: %s", scope(ex), err.text);
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

/* Runs when the answer is known: at the upstream's end, or at its head
 * when the body is to stream (stored then without it). */
enum ex_verdict stage_commit(struct exchange *ex, uint64_t now)
{
    bool head_only = !ex->up_done && ex->kind == ANSWER_UPSTREAM;
    enum up_result r = ex->ureq.resp.result;

    if (!ex->leased || ex->settled)
        return EXV_ANSWER;
    ex->settled = true;
    if (!head_only && (r == UP_TIMEOUT || r == UP_CONNECTION_LOST))
        keep(ex);
    else if (ex_idem_replayable(ex))
        complete(ex, head_only || evbuffer_get_length(ex->ureq.resp.body) >
                                      ex->pol->idem.max_stored_body);
    else
        release(ex);
    return EXV_ANSWER;
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
            release(ex);
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
