/* The upstream stage of an exchange: the request as sent, and what its
 * answer means for the worker: pass it through, or turn a retryable one into
 * a requeue / dead-letter instruction, with cooldowns for 429s and the
 * breaker's streak. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <event2/buffer.h>

#include "policies/backoff.h"
#include "policies/breaker.h"
#include "policies/outcome.h"
#include "policies/route.h"
#include "proxy/app.h"
#include "proxy/exchange_internal.h"
#include "policies/headers.h"
#include "obs/log.h"
#include "proxy/server.h"
#include "store/store.h"
#include "util/clock.h"
#include "util/rand.h"

/* ---- the request as sent ------------------------------------------------ */

struct wire_ctx {
    struct evbuffer *out;
    const struct sc_upstream *up;
    struct hdr_conn_tokens tok;
    int rc;
};

/* "name: value\r\n" in four plain appends: evbuffer_add_printf went through
 * vfprintf for every field (about 1,000 instructions each). */
static int add_field(struct evbuffer *out, const char *name, const char *value)
{
    return evbuffer_add(out, name, strlen(name)) | evbuffer_add(out, ": ", 2) |
           evbuffer_add(out, value, strlen(value)) | evbuffer_add(out, "\r\n", 2);
}

static bool configured_header(const struct sc_upstream *up, const char *name)
{
    for (size_t i = 0; i < up->n_headers; i++)
        if (strcasecmp(up->headers[i].name, name) == 0)
            return true;
    return false;
}

static enum MHD_Result collect_conn_tokens(void *cls, enum MHD_ValueKind kind,
                                           const char *key, const char *value)
{
    struct wire_ctx *w = cls;

    if (value && strcasecmp(key, "Connection") == 0)
        hdr_conn_tokens_add(&w->tok, value);
    return MHD_YES;
}

static enum MHD_Result copy_header(void *cls, enum MHD_ValueKind kind,
                                   const char *key, const char *value)
{
    struct wire_ctx *w = cls;

    /* Expect: the body is already here, a 100-continue would be noise.
     * Configured headers replace the worker's. */
    if (hdr_skip_request(key, &w->tok) || strcasecmp(key, "Expect") == 0 ||
        strcasecmp(key, EX_REQUEST_ID_HEADER) == 0 || configured_header(w->up, key))
        return MHD_YES;
    if (add_field(w->out, key, value ? value : "") != 0)
        w->rc = -ENOMEM;
    return MHD_YES;
}

static bool method_has_body(const char *m)
{
    return !strcmp(m, "POST") || !strcmp(m, "PUT") || !strcmp(m, "PATCH");
}

static int build_wire(struct exchange *ex)
{
    struct wire_ctx w = {.up = ex->up};
    size_t blen = ex->body ? evbuffer_get_length(ex->body) : 0;
    char *target = route_upstream_target(ex->route, ex->up, ex->target);
    const struct up_proxy *px = ex->up->https ? NULL
                                : ex->rt->proxies[ex->route->upstream];
    int rc = -ENOMEM;

    w.out = evbuffer_new();
    if (!target || !w.out)
        goto out;
    /* Through an egress proxy, an http upstream gets absolute-form requests
     * (an https one is reached through a tunnel, in origin-form). */
    evbuffer_add(w.out, ex->method, strlen(ex->method));
    evbuffer_add(w.out, " ", 1);
    if (px) {
        evbuffer_add(w.out, "http://", 7);
        evbuffer_add(w.out, ex->up->authority, strlen(ex->up->authority));
    }
    evbuffer_add(w.out, target, strlen(target));
    evbuffer_add(w.out, " HTTP/1.1\r\n", 11);
    w.rc |= add_field(w.out, "Host", ex->up->authority);
    if (px && px->authorization)
        w.rc |= add_field(w.out, "Proxy-Authorization", px->authorization);
    MHD_get_connection_values(ex->mc, MHD_HEADER_KIND, collect_conn_tokens, &w);
    MHD_get_connection_values(ex->mc, MHD_HEADER_KIND, copy_header, &w);
    /* The worker's id when usable, else the one sluice made (ex_request_id). */
    w.rc |= add_field(w.out, EX_REQUEST_ID_HEADER, ex_request_id(ex));
    for (size_t i = 0; i < ex->up->n_headers; i++)
        w.rc |= add_field(w.out, ex->up->headers[i].name, ex->up->headers[i].value);
    if (blen || method_has_body(ex->method))
        evbuffer_add_printf(w.out, "Content-Length: %zu\r\n", blen);
    w.rc |= evbuffer_add(w.out, "\r\n", 2);
    if (blen)
        evbuffer_add_buffer(w.out, ex->body);
    if (w.rc == 0) {
        ex->ureq.wire = w.out;
        w.out = NULL;
        rc = 0;
    }
out:
    if (w.out)
        evbuffer_free(w.out);
    free(target);
    return rc;
}

/* ---- what the result means ---------------------------------------------- */

/* A policy's own cooldown is written to the store, so a restart inside it
 * (a crash, a deploy) does not send into a partner that asked for quiet.
 * Partitions' cooldowns live in memory only. Nobody waits for the write: a
 * failure the store reports at once is logged, a later one is not. */
static void persist_pause(struct exchange *ex, uint64_t hint_ms)
{
    struct store_call c = {0};
    uint64_t now = clock_wall_ms();
    int rc;

    if (!ex->ps || !ex->bucket || ex->bucket->partition)
        return;
    rc = store_pause_set_async(ex->loop->store, &c, ex->pol->name, now,
                               now + hint_ms);
    ex_store_detach(&c, rc);
    if (rc != 0 && rc != -EINPROGRESS)
        log_warn("policy %s: cooldown not kept across restarts: %s",
                 ex->pol->name, c.err.text);
}

/* A shared policy's fleet hears it too (shared: redis), without waiting:
 * pause_ms 0 empties the fleet's bucket, more pauses the whole policy. A
 * failure leaves the other sidecars to meet their own 429s. */
static void tell_fleet(struct exchange *ex, uint64_t pause_ms)
{
    struct store_call c = {0};

    if (!pace_shared(ex))
        return;
    ex_store_detach(&c, store_bucket_pause_async(
                            ex->loop->store, &c, ex->pol->name, pace_partition(ex),
                            ex->ps->fleet_t_ns, ex->ps->fleet_tau_ns,
                            pause_ms * NS_PER_MS));
}

/* Any 429 empties the bucket; one with a reset hint pauses it until then,
 * max_delay at most: a partner's absurd hint (a century) must not silence a
 * policy beyond what any job could wait. The job that met such a hint is
 * dead-lettered (retry_decide). */
static void cool_down(struct exchange *ex, bool has_hint, uint64_t hint_ms)
{
    uint64_t now = clock_mono_ns();

    if (!ex->bucket)
        return;
    if (!has_hint || hint_ms == 0) {
        gcra_empty(&ex->bucket->g, now);
        tell_fleet(ex, 0);
        return;
    }
    if (hint_ms > ex->pol->retry.max_delay_ms)
        hint_ms = ex->pol->retry.max_delay_ms;
    bucket_pause(ex->bucket, now, now + hint_ms * NS_PER_MS, PAUSE_UPSTREAM_429);
    persist_pause(ex, hint_ms);
    tell_fleet(ex, hint_ms);
    log_info("policy %s: upstream %s asked for %llu ms of cooldown",
             ex->pol->name, ex->up->name, (unsigned long long)hint_ms);
}

/* The breaker (a policy's `breaker` block; the rule: policies/breaker.h):
 * its pause is the bucket's, like a partner's Retry-After. */
static void note_breaker(struct exchange *ex, bool failed)
{
    uint64_t now = clock_mono_ns(), pause_ms;

    if (!ex->pol->breaker.enabled || !ex->bucket || !ex->ps)
        return;
    pause_ms = breaker_note(&ex->pol->breaker, pacing_breaker(ex->ps), failed,
                            bucket_cooldown(ex->bucket) > now);
    if (!pause_ms)
        return;
    bucket_pause(ex->bucket, now, now + pause_ms * NS_PER_MS, PAUSE_BREAKER);
    persist_pause(ex, pause_ms);
    tell_fleet(ex, pause_ms);
    log_warn("policy %s: %u failures in a row from upstream %s: paused for %llu ms",
             ex->pol->name, (unsigned)atomic_load(&pacing_breaker(ex->ps)->fail_streak),
             ex->up->name, (unsigned long long)pause_ms);
}

/* The verdict of policies/outcome.h, applied: the policy hears of a 429 and
 * of the breaker's streak, then the exchange gets its answer. */
static void apply(struct exchange *ex, const struct outcome_input *in)
{
    const struct up_response *r = &ex->ureq.resp;
    struct outcome_verdict v;

    outcome_classify(&ex->pol->retry, in, &v);
    if (v.cool_down)
        cool_down(ex, in->has_hint, in->hint_ms);
    if (v.breaker != OB_NONE)
        note_breaker(ex, v.breaker == OB_FAILURE);
    switch (v.action) {
    case OA_PASS:
        ex->kind = ANSWER_UPSTREAM;
        ex->status = v.status;
        ex->reason = R_NONE;
        ex->outcome = v.outcome;
        break;
    case OA_REQUEUE:
    case OA_DEAD_LETTER:
        ex_instruct(ex, v.outcome, v.reason, v.delay_ms, ex->attempt,
                    in->status);
        break;
    case OA_REFUSE:
        ex_refuse(ex, v.status, v.outcome, v.reason, "upstream %s: %s",
                  ex->up->name, r->detail);
        break;
    }
    ex->classified = true;
}

static void classify_response(struct exchange *ex)
{
    const struct up_response *r = &ex->ureq.resp;
    struct outcome_input in = {
        .transport = OT_ANSWERED,
        .status = r->status,
        .attempt = ex->attempt,
        .rnd = rand_u64(),
    };

    in.has_hint = hint_pick(up_response_header(r, "Retry-After"),
                            up_response_header(r, "RateLimit"),
                            up_response_header(r, "X-RateLimit-Reset"),
                            clock_wall_ms(), &in.hint_ms);
    apply(ex, &in);
}

static void classify_failure(struct exchange *ex)
{
    const struct up_response *r = &ex->ureq.resp;
    static const enum outcome_transport transport[] = {
        [UP_CONNECT_ERROR] = OT_CONNECT_ERROR,
        [UP_CONNECTION_LOST] = OT_CONNECTION_LOST,
        [UP_TIMEOUT] = OT_TIMEOUT,
    };
    struct outcome_input in = {
        .transport = transport[r->result],
        .status = r->status,
        .head_too_big = r->head_too_big,
        .attempt = ex->attempt,
        .rnd = rand_u64(),
    };

    log_warn("route %s: upstream %s: %s", ex->route->name, ex->up->name,
             r->detail);
    apply(ex, &in);
}

/* ---- the stage ------------------------------------------------------------ */

/* The upstream client's callbacks: the result is counted as soon as it is
 * known, then the driver decides what the wake means. */
static void on_upstream_progress(struct up_request *req, void *arg)
{
    ex_wake(arg);
}

static void on_upstream_done(struct up_request *req, void *arg)
{
    struct exchange *ex = arg;

    ex->up_done = true;
    ex_record_upstream(ex);
    if (ex->streaming && req->resp.result != UP_OK)
        log_warn("route %s: upstream %s: response body cut short: %s",
                 ex->route->name, ex->up->name, req->resp.detail);
    ex_wake(ex);
}

/* Nothing could be sent (no memory for the request): a connect_error, as
 * for any request that reached nothing. */
static enum ex_verdict not_sent(struct exchange *ex, const char *why)
{
    ex->ureq.resp.result = UP_CONNECT_ERROR;
    snprintf(ex->ureq.resp.detail, sizeof ex->ureq.resp.detail, "%s", why);
    ex->up_done = true;
    classify_failure(ex);
    return EXV_NEXT;
}

static enum ex_verdict send_request(struct exchange *ex)
{
    if (build_wire(ex) != 0)
        return not_sent(ex, "out of memory building the upstream request");
    ex->ureq.no_body = strcmp(ex->method, "HEAD") == 0;
    ex->ureq.timeout_ms = sc_route_timeout(ex->route, ex->up);
    ex->ureq.done = on_upstream_done;
    ex->ureq.progress = on_upstream_progress;
    ex->ureq.arg = ex;
    if (up_pool_send(ex->rt->pools[ex->loop->idx][ex->route->upstream], &ex->ureq) != 0)
        return not_sent(ex, "cannot queue the upstream request");
    ex->sent = true;
    return EXV_WAIT;
}

/* The body is held up to max bytes before the answer goes: a keyed answer
 * to store up to max_stored_body (so the record can have it), any other up
 * to EX_WHOLE_MAX_BYTES (a small body, usually read with its head or just
 * after it, then goes out whole with the head, without a streaming reader).
 * A body known to be longer, or found to be, streams: commit, then answer. */
static enum ex_verdict hold_body(struct exchange *ex, uint64_t max)
{
    const struct up_response *r = &ex->ureq.resp;
    uint64_t len;

    if (evbuffer_get_length(r->body) > max ||
        (up_response_length(r, &len) && len > max))
        return EXV_NEXT;
    ex->ureq.hold_max = max + 1;
    return EXV_WAIT;
}

/* The head decides the answer: passed through (its body held or streamed,
 * above), or an instruction, which needs no body: that is read and dropped
 * so the connection can be reused. */
static enum ex_verdict head_in(struct exchange *ex)
{
    if (!ex->classified)
        classify_response(ex);
    if (ex->kind != ANSWER_UPSTREAM) {
        ex->ureq.discard = true;
        return EXV_WAIT;
    }
    if (ex->leased && ex_idem_replayable(ex))
        return hold_body(ex, ex->pol->idem.max_stored_body);
    return hold_body(ex, EX_WHOLE_MAX_BYTES);
}

enum ex_verdict stage_upstream(struct exchange *ex, uint64_t now)
{
    if (ex->woke == WOKE_FIRST)
        return send_request(ex);
    if (ex->up_done) {
        if (!ex->classified && ex->ureq.resp.result == UP_OK)
            classify_response(ex);
        else if (!ex->classified)
            classify_failure(ex);
        return EXV_NEXT;
    }
    if (ex->ureq.resp.status >= 200) /* the head is in */
        return head_in(ex);
    return EXV_WAIT;
}

void upstream_drain_answer(struct exchange *ex)
{
    /* Sent and unanswered: the outcome is unknown, so the job must come
     * back, whatever retry.on says, and its lease stays. */
    ex_instruct(ex, OUT_REQUEUE, R_CONNECTION_LOST,
                backoff_delay_ms(&ex->pol->retry, ex->attempt, rand_u64()),
                ex->attempt, 0);
    ex->ureq.resp.result = UP_CONNECTION_LOST;
    ex->classified = true;
}
