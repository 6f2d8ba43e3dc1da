/* The upstream rows: the request as sent, until its head (or a failure)
 * decides what the answer means for the worker: pass it through, or turn
 * a retryable one into a requeue / dead-letter instruction; then its body:
 * held (to store it under the key, or to send a small one whole), passed on
 * as it comes, or read and dropped so the connection can be reused. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <event2/buffer.h>

#include "obs/log.h"
#include "obs/request.h"
#include "policies/backoff.h"
#include "policies/headers.h"
#include "policies/route.h"
#include "proxy/exchange/stages.h"
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

static void collect_conn_tokens(void *arg, const char *key, const char *value)
{
    struct wire_ctx *w = arg;

    if (value && strcasecmp(key, "Connection") == 0)
        hdr_conn_tokens_add(&w->tok, value);
}

static void copy_header(void *arg, const char *key, const char *value)
{
    struct wire_ctx *w = arg;

    /* Expect: the body is already here, a 100-continue would be noise.
     * Configured headers replace the worker's. */
    if (hdr_skip_request(key, &w->tok) || strcasecmp(key, "Expect") == 0 ||
        strcasecmp(key, EX_REQUEST_ID_HEADER) == 0 || configured_header(w->up, key))
        return;
    if (add_field(w->out, key, value ? value : "") != 0)
        w->rc = -ENOMEM;
}

static bool method_has_body(const char *m)
{
    return !strcmp(m, "POST") || !strcmp(m, "PUT") || !strcmp(m, "PATCH");
}

static int build_wire(struct exchange *ex)
{
    struct wire_ctx w = {.up = ex->up};
    size_t blen = ex->body ? evbuffer_get_length(ex->body) : 0;
    char *target = ex->upstream_target ? strdup(ex->upstream_target)
                                       : route_upstream_target(ex->route, ex->up, ex->target);
    const struct up_proxy *px = ex->http_proxy;
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
    ex->owner->headers(ex, collect_conn_tokens, &w);
    ex->owner->headers(ex, copy_header, &w);
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

/* policies/outcome.h decides; the answer follows (ex_answer_outcome), and
 * what it tells the policy waits in ex->ov for the feedback row. */
static void classify(struct exchange *ex)
{
    outcome_classify(&ex->pol->retry, &ex->oin, &ex->ov);
    ex_answer_outcome(ex);
    ex->classified = true;
}

static void classify_response(struct exchange *ex)
{
    const struct up_response *r = &ex->ureq.resp;

    ex->oin = (struct outcome_input){
        .transport = OT_ANSWERED,
        .status = r->status,
        .attempt = ex->attempt,
        .rnd = rand_u64(),
    };
    ex->oin.has_hint = hint_pick(up_response_header(r, "Retry-After"),
                                 up_response_header(r, "RateLimit"),
                                 up_response_header(r, "X-RateLimit-Reset"),
                                 ex_wall_ms(ex), &ex->oin.hint_ms);
    classify(ex);
}

static void classify_failure(struct exchange *ex)
{
    const struct up_response *r = &ex->ureq.resp;
    static const enum outcome_transport transport[] = {
        [UP_CONNECT_ERROR] = OT_CONNECT_ERROR,
        [UP_CONNECTION_LOST] = OT_CONNECTION_LOST,
        [UP_TIMEOUT] = OT_TIMEOUT,
    };

    ex->oin = (struct outcome_input){
        .transport = transport[r->result],
        .status = r->status,
        .head_too_big = r->head_too_big,
        .attempt = ex->attempt,
        .rnd = rand_u64(),
    };
    log_warn("route %s: upstream %s: %s", ex->label, ex->up->name,
             r->detail);
    classify(ex);
}

/* The code label of sluice_upstream_responses_total. */
static enum up_code up_code_of(const struct up_response *r)
{
    static const enum up_code failures[] = {
        [UP_CONNECT_ERROR] = UC_CONNECT_ERROR,
        [UP_CONNECTION_LOST] = UC_CONNECTION_LOST,
        [UP_TIMEOUT] = UC_TIMEOUT,
    };

    if (r->result != UP_OK)
        return failures[r->result];
    if (r->status == 429)
        return UC_429;
    return r->status >= 500 ? UC_5XX : r->status >= 400 ? UC_4XX
           : r->status >= 300 ? UC_3XX : UC_2XX;
}

/* sluice_upstream_responses_total and the upstream timing, counted as soon
 * as the upstream's result is known (a scrape right after sees it). */
static void count_result(const struct exchange *ex)
{
    const struct up_request *u = &ex->ureq;

    if (!u->done_ns || !u->sent_ns)
        return;
    metrics_upstream_result(ex->env->metrics, ex->ids, ex->upstream_idx,
                            up_code_of(&u->resp),
                            (double)(u->done_ns - u->sent_ns) / 1e9);
}

/* ---- the upstream client's callbacks -------------------------------------- */

static void on_upstream_progress(struct up_request *req, void *arg)
{
    ex_wake(arg);
}

static void on_upstream_done(struct up_request *req, void *arg)
{
    struct exchange *ex = arg;

    ex->up_done = true;
    count_result(ex);
    if (ex->streaming && req->resp.result != UP_OK)
        log_warn("route %s: upstream %s: response body cut short: %s",
                 ex->label, ex->up->name, req->resp.detail);
    ex_wake(ex);
}

/* ---- the head ------------------------------------------------------------- */

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
    ex->ureq.timeout_ms = ex->timeout_ms;
    ex->ureq.done = on_upstream_done;
    ex->ureq.progress = on_upstream_progress;
    ex->ureq.arg = ex;
    if (up_pool_send(ex->pool, &ex->ureq) != 0)
        return not_sent(ex, "cannot queue the upstream request");
    ex->sent = true;
    return EXV_WAIT;
}

/* Sent: until the head is in (classified), or the exchange ended without
 * one (a failure, classified too). */
static enum ex_verdict upstream_run(struct exchange *ex, uint64_t now)
{
    const struct up_response *r = &ex->ureq.resp;

    if (ex->woke == WOKE_FIRST)
        return send_request(ex);
    if (ex->up_done && r->result != UP_OK) {
        classify_failure(ex);
        return EXV_NEXT;
    }
    if (r->status >= 200 || ex->up_done) { /* the head is in */
        classify_response(ex);
        return EXV_NEXT;
    }
    return EXV_WAIT;
}

/* Nobody will read the rest of this upstream answer. */
static void cancel(struct exchange *ex)
{
    if (ex->ureq.pool && !ex->up_done) {
        up_request_cancel(&ex->ureq);
        ex->up_done = true;
        if (!ex->ureq.resp.result)
            ex->ureq.resp.result = UP_CONNECTION_LOST;
    }
}

/* At the answer, a passed-through body still to come streams: the request
 * keeps its upstream exchange (and its slot) until the body's end. */
static void upstream_release(struct exchange *ex, enum ex_release how)
{
    if (how == REL_ANSWER && ex->kind == ANSWER_UPSTREAM && !ex->up_done) {
        ex->streaming = true;
        ex->ureq.hold_max = UP_STREAM_HOLD;
        ex->ureq.discard = false;
        return;
    }
    if (how == REL_FLIGHT)
        return;
    cancel(ex); /* REL_CUT: the reader then sees the body end, cut short */
    if (how == REL_END) {
        up_response_clear(&ex->ureq.resp);
        if (ex->ureq.wire)
            evbuffer_free(ex->ureq.wire);
        ex->ureq.wire = NULL;
    }
}

/* Sent and unanswered: the outcome is unknown, so the job must come back,
 * whatever retry.on says, and its lease stays. */
static void upstream_drain(struct exchange *ex, uint64_t now)
{
    ex_instruct(ex, OUT_REQUEUE, R_CONNECTION_LOST,
                backoff_delay_ms(&ex->pol->retry, ex->attempt, rand_u64()),
                ex->attempt, 0);
    cancel(ex);
    ex->ureq.resp.result = UP_CONNECTION_LOST;
    ex->classified = true;
}

const struct ex_stage stage_upstream = {
    .name = "upstream",
    .run = upstream_run,
    .release = upstream_release,
    .drain = upstream_drain,
};

/* ---- the body ------------------------------------------------------------- */

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

/* An instruction needs no body: it is read and dropped so the connection
 * can be reused. */
static enum ex_verdict body_run(struct exchange *ex, uint64_t now)
{
    if (ex->up_done)
        return EXV_NEXT;
    if (ex->kind != ANSWER_UPSTREAM) {
        ex->ureq.discard = true;
        return EXV_WAIT;
    }
    if (ex->leased && outcome_replayable(ex->pol, ex->status))
        return hold_body(ex, ex->pol->idem.max_stored_body);
    return hold_body(ex, EX_WHOLE_MAX_BYTES);
}

const struct ex_stage stage_upstream_body = {
    .name = "upstream_body",
    .run = body_run,
    .drain = upstream_drain,
};
