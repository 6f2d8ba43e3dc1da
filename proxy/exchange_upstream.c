/* The upstream stage of an exchange: the request as sent (SPEC section 3),
 * and what the result means for the worker (SPEC section 4): pass the answer
 * through, or turn a retryable one into a requeue / dead-letter instruction,
 * with cooldowns for 429s. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <event2/buffer.h>

#include "policies/backoff.h"
#include "policies/route.h"
#include "proxy/app.h"
#include "proxy/exchange_internal.h"
#include "proxy/headers.h"
#include "proxy/log.h"
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
        configured_header(w->up, key))
        return MHD_YES;
    if (evbuffer_add_printf(w->out, "%s: %s\r\n", key, value ? value : "") < 0)
        w->rc = -1;
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
    int rc = -1;

    w.out = evbuffer_new();
    if (!target || !w.out)
        goto out;
    evbuffer_add_printf(w.out, "%s %s HTTP/1.1\r\nHost: %s\r\n", ex->method,
                        target, ex->up->authority);
    MHD_get_connection_values(ex->mc, MHD_HEADER_KIND, collect_conn_tokens, &w);
    MHD_get_connection_values(ex->mc, MHD_HEADER_KIND, copy_header, &w);
    for (size_t i = 0; i < ex->up->n_headers; i++)
        evbuffer_add_printf(w.out, "%s: %s\r\n", ex->up->headers[i].name,
                            ex->up->headers[i].value);
    if (blen || method_has_body(ex->method))
        evbuffer_add_printf(w.out, "Content-Length: %zu\r\n", blen);
    evbuffer_add(w.out, "\r\n", 2);
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

/* A retryable failure becomes an instruction: requeue with a delay, or
 * dead_letter when the budget is spent or the upstream's hint is too far. */
static void retryable(struct exchange *ex, enum reason r, int status,
                      bool has_hint, uint64_t hint_ms)
{
    const struct sc_retry *rt = &ex->pol->retry;
    uint64_t delay = 0;
    enum retry_verdict v =
        retry_decide(rt, ex->attempt, has_hint, hint_ms, rand_u64(), &delay);

    if (v == RETRY_REQUEUE)
        ex_instruct(ex, OUT_REQUEUE, r, delay, ex->attempt, status);
    else
        ex_instruct(ex, OUT_DEAD_LETTER,
                    v == RETRY_DELAY_EXCEEDS_MAX ? R_DELAY_EXCEEDS_MAX : r, 0,
                    ex->attempt, status);
}

/* A policy's own cooldown is written to the store, so a restart inside it
 * (a crash, a deploy) does not send into a partner that asked for quiet.
 * Partitions' cooldowns live in memory only. */
static void persist_pause(struct exchange *ex, uint64_t hint_ms)
{
    struct sc_error err = {0};
    uint64_t now = clock_wall_ms();

    if (!ex->ps || ex->bucket != &ex->ps->bucket)
        return;
    if (store_pause_set(ex->w->app->store, ex->pol->name, now, now + hint_ms,
                        &err) != 0)
        log_warn("policy %s: cooldown not kept across restarts: %s",
                 ex->pol->name, err.text);
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
        return;
    }
    if (hint_ms > ex->pol->retry.max_delay_ms)
        hint_ms = ex->pol->retry.max_delay_ms;
    bucket_pause(ex->bucket, now, now + hint_ms * 1000000ull, PAUSE_UPSTREAM_429);
    persist_pause(ex, hint_ms);
    log_info("policy %s: upstream %s asked for %llu ms of cooldown",
             ex->pol->name, ex->up->name, (unsigned long long)hint_ms);
}

/* The breaker (a policy's `breaker` block): a streak of upstream failures
 * pauses the bucket the way a partner's Retry-After does, so that while the
 * upstream is down requests wait or are requeued as upstream_cooldown,
 * spending no attempt, instead of each failing on its own and burning its
 * budget. The first request after a pause is the probe: if it fails too, the
 * next pause is twice as long, up to max_pause. Any answer below 500 (a 429
 * included: the upstream is up) closes it. A failure of a request sent
 * before the pause began does not extend it. */
static void breaker_note(struct exchange *ex, bool failed)
{
    const struct sc_breaker *b = &ex->pol->breaker;
    struct policy_state *ps = ex->ps;
    uint64_t now, pause_ms;
    uint32_t opens;

    if (!b->enabled || !ex->bucket || !ps)
        return;
    if (!failed) {
        /* Read first: a store on every success would bounce the line
         * between threads for nothing. */
        if (atomic_load(&ps->fail_streak) || atomic_load(&ps->opens)) {
            atomic_store(&ps->fail_streak, 0);
            atomic_store(&ps->opens, 0);
        }
        return;
    }
    if (atomic_fetch_add(&ps->fail_streak, 1) + 1 < b->failures)
        return;
    now = clock_mono_ns();
    if (atomic_load(&ex->bucket->cooldown_until) > now)
        return;
    opens = atomic_fetch_add(&ps->opens, 1);
    pause_ms = opens < 20 ? b->pause_ms << opens : b->max_pause_ms;
    if (pause_ms > b->max_pause_ms)
        pause_ms = b->max_pause_ms;
    bucket_pause(ex->bucket, now, now + pause_ms * 1000000ull, PAUSE_BREAKER);
    persist_pause(ex, pause_ms);
    log_warn("policy %s: %u failures in a row from upstream %s: paused for %llu ms",
             ex->pol->name, (unsigned)atomic_load(&ps->fail_streak), ex->up->name,
             (unsigned long long)pause_ms);
}

static void classify_response(struct exchange *ex)
{
    const struct up_response *r = &ex->ureq.resp;
    int s = r->status;
    uint64_t hint = 0;
    bool has_hint = hint_pick(up_response_header(r, "Retry-After"),
                              up_response_header(r, "RateLimit"),
                              up_response_header(r, "X-RateLimit-Reset"),
                              clock_wall_ms(), &hint);

    if (s == 429)
        cool_down(ex, has_hint, hint);
    breaker_note(ex, s >= 500);
    if (sc_retry_on_status(&ex->pol->retry, s)) {
        retryable(ex, s == 429 ? R_UPSTREAM_429 : R_UPSTREAM_5XX, s, has_hint,
                  hint);
        return;
    }
    ex->kind = ANSWER_UPSTREAM;
    ex->status = s;
    ex->reason = R_NONE;
    ex->outcome = s < 400 ? OUT_OK : OUT_PERMANENT_ERROR;
}

static void classify_failure(struct exchange *ex)
{
    const struct up_response *r = &ex->ureq.resp;
    static const struct {
        enum reason reason;
        unsigned bit;
        int status;
    } map[] = {
        [UP_CONNECT_ERROR] = {R_CONNECT_ERROR, SC_T_CONNECT_ERROR, 502},
        [UP_CONNECTION_LOST] = {R_CONNECTION_LOST, SC_T_CONNECTION_LOST, 502},
        [UP_TIMEOUT] = {R_TIMEOUT, SC_T_TIMEOUT, 504},
    };
    enum reason reason = map[r->result].reason;

    log_warn("route %s: upstream %s: %s", ex->route->name, ex->up->name,
             r->detail);
    if (r->head_too_big) {
        /* The upstream worked and will answer the same way again: passing
         * the job back would only repeat the side effect. As nginx's "upstream
         * sent too big header": 502. The lease stays (the outcome is not
         * known to the worker). */
        ex_refuse(ex, 502, OUT_PERMANENT_ERROR, R_CONNECTION_LOST,
                  "upstream %s: %s", ex->up->name, r->detail);
        return;
    }
    breaker_note(ex, true);
    if (ex->pol->retry.on_transport & map[r->result].bit) {
        retryable(ex, reason, r->status, false, 0);
        return;
    }
    ex_refuse(ex, map[r->result].status, OUT_PERMANENT_ERROR, reason,
              "upstream %s: %s", ex->up->name, r->detail);
}

/* ---- the answer on its way ---------------------------------------------- */

/* From here the worker's response is queued while the body still arrives. */
static void start_stream(struct exchange *ex)
{
    ex->streaming = true;
    ex->ureq.hold_max = UP_STREAM_HOLD;
    ex_finish(ex);
}

/* A keyed answer to store: the body is held up to max_stored_body so the
 * record can have it; a longer one is stored without it and streamed. */
static void hold_for_record(struct exchange *ex)
{
    const char *cl = up_response_header(&ex->ureq.resp, "Content-Length");
    uint64_t max = ex->pol->idem.max_stored_body;

    if (cl && !up_response_header(&ex->ureq.resp, "Transfer-Encoding") &&
        strtoull(cl, NULL, 10) > max) {
        ex_idem_complete_head(ex);
        start_stream(ex);
        return;
    }
    ex->ureq.hold_max = max + 1;
}

/* The head decides the answer. A pass-through answer starts at once unless
 * its record must be written first; an instruction needs no body, which is
 * read and dropped so the connection can be reused. */
static void on_head(struct exchange *ex)
{
    classify_response(ex);
    ex->classified = true;
    if (ex->kind != ANSWER_UPSTREAM) {
        ex->ureq.discard = true;
        return;
    }
    if (ex->leased && ex_idem_replayable(ex)) {
        hold_for_record(ex);
        return;
    }
    ex_idem_result(ex); /* a known answer not to replay: the lease goes */
    start_stream(ex);
}

static void on_upstream_event(struct up_request *req, enum up_event ev,
                              void *arg)
{
    struct exchange *ex = arg;

    if (ev == UP_EV_HEAD) {
        on_head(ex);
    } else if (ex->streaming) {
        ex_stream_wake(ex);
    } else if (ex->classified && ex->kind == ANSWER_UPSTREAM &&
               evbuffer_get_length(req->resp.body) >
                   ex->pol->idem.max_stored_body) {
        ex_idem_complete_head(ex);
        start_stream(ex);
    }
}

/* The result is known: the record is written before the worker sees it. */
static void settle(struct exchange *ex)
{
    if (!ex->classified) {
        if (ex->ureq.resp.result == UP_OK)
            classify_response(ex);
        else
            classify_failure(ex);
    }
    ex_idem_result(ex);
    ex_finish(ex);
}

static void on_upstream_done(struct up_request *req, void *arg)
{
    struct exchange *ex = arg;

    ex->up_done = true;
    ex_pace_release(ex);
    ex_record_upstream(ex);
    if (!ex->streaming) {
        settle(ex);
        return;
    }
    if (req->resp.result != UP_OK)
        log_warn("route %s: upstream %s: response body cut short: %s",
                 ex->route->name, ex->up->name, req->resp.detail);
    ex_stream_wake(ex);
}

/* Nothing could be sent (no memory for the request): a connect_error, with
 * the lease released by the same path as any other. */
static void not_sent(struct exchange *ex, const char *why)
{
    ex->ureq.resp.result = UP_CONNECT_ERROR;
    snprintf(ex->ureq.resp.detail, sizeof ex->ureq.resp.detail, "%s", why);
    ex_pace_release(ex);
    settle(ex);
}

void ex_send_upstream(struct exchange *ex)
{
    if (!ex_pace_may_send(ex))
        return;
    ex_unwatch_client(ex); /* from here the request is sent: no way back */
    if (!ex_idem_lease(ex)) {
        ex_pace_release(ex);
        ex_finish(ex);
        return;
    }
    if (build_wire(ex) != 0) {
        not_sent(ex, "out of memory building the upstream request");
        return;
    }
    ex->ureq.no_body = strcmp(ex->method, "HEAD") == 0;
    ex->ureq.done = on_upstream_done;
    ex->ureq.event = on_upstream_event;
    ex->ureq.arg = ex;
    ex->state = EX_UPSTREAM;
    if (up_pool_send(ex->rt->pools[ex->w->idx][ex->route->upstream], &ex->ureq) != 0)
        not_sent(ex, "cannot queue the upstream request");
}

void ex_upstream_abort(struct exchange *ex)
{
    up_request_cancel(&ex->ureq);
    ex->up_done = true;
    ex_pace_release(ex);
    /* Sent and unanswered: the outcome is unknown, so the job must come
     * back, whatever retry.on says. */
    ex_instruct(ex, OUT_REQUEUE, R_CONNECTION_LOST,
                backoff_delay_ms(&ex->pol->retry, ex->attempt, rand_u64()),
                ex->attempt, 0);
    ex->ureq.resp.result = UP_CONNECTION_LOST; /* the lease must stay */
    ex_idem_result(ex);
    ex_finish(ex);
}
