#define _GNU_SOURCE
#include "proxy/exchange.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "policies/route.h"
#include "proxy/app.h"
#include "proxy/exchange_internal.h"
#include "proxy/headers.h"
#include "proxy/log.h"
#include "proxy/problem.h"
#include "proxy/server.h"
#include "proxy/upstream.h"
#include "util/clock.h"

/* ---- allocation --------------------------------------------------------- */

/* RFC 9112 3.2.2: a server accepts absolute-form; only its path matters to
 * us, since the destination always comes from the config. */
static const char *origin_form(const char *uri)
{
    const char *p;

    if (strncasecmp(uri, "http://", 7) != 0 &&
        strncasecmp(uri, "https://", 8) != 0)
        return uri;
    p = strstr(uri, "://") + 3;
    p += strcspn(p, "/?");
    return p;
}

void *exchange_uri_log(void *cls, const char *uri, struct MHD_Connection *c)
{
    struct worker *w = cls;
    struct exchange *ex = calloc(1, sizeof *ex);
    const char *o = origin_form(uri ? uri : "");

    if (!ex)
        return NULL;
    ex->w = w;
    ex->mc = c;
    ex->rt = runtime_acquire(w->app);
    ex->cfg = ex->rt->cfg;
    ex->t0_ns = clock_mono_ns();
    ex->t0_wall_ms = clock_wall_ms();
    /* "" and "?q" have an empty path, which HTTP says is "/". */
    if (*o == '\0' || *o == '?') {
        if (asprintf(&ex->target, "/%s", o) < 0)
            ex->target = NULL;
    } else {
        ex->target = strdup(o);
    }
    atomic_fetch_add(&w->app->inflight, 1);
    return ex;
}

static void exchange_free(struct exchange *ex)
{
    /* Only a suspended exchange can still wait on something; MHD completes
     * none of those, but a daemon stopped early would. */
    if (ex->suspended) {
        TAILQ_REMOVE(&ex->w->waiting, ex, link);
        if (ex->state == EX_UPSTREAM)
            up_request_cancel(&ex->ureq);
        if (ex->state == EX_SLOT)
            pacing_slot_cancel(ex->ps, &ex->slot);
    }
    ex_pace_release(ex);
    ex_idem_done(ex);
    if (ex->timer)
        event_free(ex->timer);
    if (ex->slot.granted_ev)
        event_free(ex->slot.granted_ev);
    up_response_clear(&ex->ureq.resp);
    if (ex->ureq.wire)
        evbuffer_free(ex->ureq.wire);
    if (ex->body)
        evbuffer_free(ex->body);
    atomic_fetch_sub(&ex->w->app->inflight, 1);
    runtime_put(ex->rt);
    free(ex->target);
    free(ex);
}

/* ---- answers ------------------------------------------------------------ */

void ex_refuse(struct exchange *ex, int status, enum outcome o, enum reason r,
               const char *fmt, ...)
{
    va_list ap;

    ex->kind = ANSWER_PROBLEM;
    ex->status = status;
    ex->outcome = o;
    ex->reason = r;
    va_start(ap, fmt);
    vsnprintf(ex->detail, sizeof ex->detail, fmt, ap);
    va_end(ap);
}

static enum MHD_Result queue(struct exchange *ex, struct MHD_Response *resp)
{
    enum MHD_Result rc;

    if (!resp)
        return MHD_NO;
    MHD_add_response_header(resp, "Sluice-Outcome", outcome_name(ex->outcome));
    rc = MHD_queue_response(ex->mc, (unsigned)ex->status, resp);
    MHD_destroy_response(resp);
    ex->state = EX_ANSWERED;
    return rc;
}

/* A response owning a malloc'd JSON body (freed with it); NULL on failure,
 * the body then freed here. */
static struct MHD_Response *json_response(char *body, size_t len, const char *type)
{
    struct MHD_Response *resp;

    if (!body)
        return NULL;
    resp = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(body);
        return NULL;
    }
    MHD_add_response_header(resp, "Content-Type", type);
    return resp;
}

static enum MHD_Result answer_problem(struct exchange *ex)
{
    size_t len = 0;
    char *body = problem_json(ex->status, ex->reason, ex->detail, &len);

    return queue(ex, json_response(body, len, "application/problem+json"));
}

static void add_upstream_headers(struct MHD_Response *resp,
                                 const struct up_response *ur)
{
    const struct up_header *keep[UP_MAX_HEADERS];
    size_t n = up_response_end_to_end(ur, keep);

    for (size_t i = 0; i < n; i++)
        MHD_add_response_header(resp, keep[i]->name, keep[i]->value);
}

static void free_evbuffer(void *cls)
{
    evbuffer_free(cls);
}

/* The body goes out from the evbuffer's own chains (no copy into one block:
 * it measurably cost larger answers); the response frees the evbuffer. */
static struct MHD_Response *response_from_evbuffer(struct evbuffer *body)
{
    int n = evbuffer_peek(body, -1, NULL, NULL, 0);
    struct evbuffer_iovec small[16], *v = small;
    struct MHD_IoVec mv[16], *m = mv;
    struct MHD_Response *resp = NULL;

    if (n > 16) {
        v = malloc((size_t)n * sizeof *v);
        m = malloc((size_t)n * sizeof *m);
        if (!v || !m)
            goto out;
    }
    n = evbuffer_peek(body, -1, NULL, v, n);
    for (int i = 0; i < n; i++) {
        m[i].iov_base = v[i].iov_base;
        m[i].iov_len = v[i].iov_len;
    }
    /* MHD copies the vector itself, not the data. */
    resp = MHD_create_response_from_iovec(m, (unsigned)n, free_evbuffer, body);
out:
    if (v != small)
        free(v);
    if (m != mv)
        free(m);
    return resp;
}

static enum MHD_Result answer_upstream(struct exchange *ex)
{
    struct up_response *ur = &ex->ureq.resp;
    struct MHD_Response *resp = response_from_evbuffer(ur->body);

    if (!resp)
        return MHD_NO;
    ur->body = NULL; /* the response owns it now */
    add_upstream_headers(resp, ur);
    return queue(ex, resp);
}

void ex_instruct(struct exchange *ex, enum outcome o, enum reason r,
                 uint64_t delay_ms, uint32_t attempt, int upstream_status)
{
    struct instruction *in = &ex->instr;

    ex->kind = ANSWER_INSTRUCTION;
    ex->outcome = o;
    ex->reason = r;
    ex->status = instruction_status(r);
    in->outcome = o;
    in->reason = r;
    in->delay_ms = delay_ms ? delay_ms : 1;
    in->attempt = attempt;
    in->max_attempts = ex->pol->retry.max_attempts;
    in->key = ex->key;
    in->upstream_status = upstream_status;
}

static enum MHD_Result answer_instruction(struct exchange *ex)
{
    size_t len = 0;
    char *body = instruction_json(&ex->instr, &len), num[32];
    struct MHD_Response *resp = json_response(body, len, "application/json");

    if (!resp)
        return MHD_NO;
    if (ex->outcome == OUT_REQUEUE) {
        snprintf(num, sizeof num, "%llu", (unsigned long long)
                 instruction_delay_seconds(ex->instr.delay_ms));
        MHD_add_response_header(resp, "Retry-After", num);
    }
    if (ex->rate_headers && ex->bucket) {
        char pol[160], st[160];
        ex_rate_headers(ex, pol, sizeof pol, st, sizeof st);
        MHD_add_response_header(resp, "RateLimit-Policy", pol);
        MHD_add_response_header(resp, "RateLimit", st);
    }
    return queue(ex, resp);
}

/* A stored result, byte for byte, with no permit and no upstream call. A
 * replayed failure (4xx) stays permanent_error: "replayed" always means
 * "this already succeeded: ack it". */
static enum MHD_Result answer_replay(struct exchange *ex)
{
    const struct store_record *rec = &ex->replay;
    struct MHD_Response *resp = MHD_create_response_from_buffer(
        rec->body_len, rec->body, MHD_RESPMEM_MUST_COPY);

    if (!resp)
        return MHD_NO;
    for (size_t i = 0; i < rec->n_headers; i++)
        MHD_add_response_header(resp, rec->headers[i].name, rec->headers[i].value);
    MHD_add_response_header(resp, "Idempotent-Replayed", "true");
    if (rec->body_omitted)
        MHD_add_response_header(resp, "Sluice-Body-Omitted", "true");
    ex->status = rec->status;
    ex->outcome = rec->status < 400 ? OUT_REPLAYED : OUT_PERMANENT_ERROR;
    ex->reason = R_NONE;
    return queue(ex, resp);
}

static enum MHD_Result answer(struct exchange *ex)
{
    switch (ex->kind) {
    case ANSWER_REPLAY:
        return answer_replay(ex);
    case ANSWER_UPSTREAM:
        return answer_upstream(ex);
    case ANSWER_INSTRUCTION:
        return answer_instruction(ex);
    default:
        return answer_problem(ex);
    }
}

void ex_finish(struct exchange *ex)
{
    if (!ex->suspended) {
        ex->state = EX_READY;
        return;
    }
    TAILQ_REMOVE(&ex->w->waiting, ex, link);
    ex->suspended = false;
    ex->state = EX_READY;
    MHD_resume_connection(ex->mc);
    worker_kick(ex->w);
}

/* ---- header checks ------------------------------------------------------ */

struct header_scan {
    size_t bytes;
    unsigned n_cl, n_te;
    const char *cl;
    bool cl_conflict;
    bool te_bad;
};

static enum MHD_Result scan_header(void *cls, enum MHD_ValueKind kind,
                                   const char *key, const char *value)
{
    struct header_scan *s = cls;

    s->bytes += strlen(key) + (value ? strlen(value) : 0) + 4;
    if (strcasecmp(key, "Content-Length") == 0) {
        if (s->n_cl++ && value && s->cl && strcmp(value, s->cl) != 0)
            s->cl_conflict = true;
        s->cl = value;
    } else if (strcasecmp(key, "Transfer-Encoding") == 0) {
        s->n_te++;
        if (!value || strcasecmp(value, "chunked") != 0)
            s->te_bad = true;
    }
    return MHD_YES;
}

/* Refuses what must not go further; true when the request may proceed. */
static bool check_headers(struct exchange *ex)
{
    struct header_scan s = {0};
    const struct sc_config *cfg = ex->cfg;
    unsigned long long cl;
    char *end;

    MHD_get_connection_values(ex->mc, MHD_HEADER_KIND, scan_header, &s);
    s.bytes += strlen(ex->method) + strlen(ex->target) + 12;
    if (s.bytes > cfg->limits.max_header) {
        ex_refuse(ex, 431, OUT_REJECTED, R_HEADERS_TOO_LARGE,
               "request headers of %zu bytes exceed limits.max_header (%llu)",
               s.bytes, (unsigned long long)cfg->limits.max_header);
        return false;
    }
    if ((s.n_cl && s.n_te) || s.cl_conflict || s.te_bad || s.n_te > 1) {
        ex_refuse(ex, 400, OUT_REJECTED, R_MALFORMED_REQUEST,
               "conflicting or unsupported Content-Length / Transfer-Encoding");
        return false;
    }
    if (!s.cl)
        return true;
    cl = strtoull(s.cl, &end, 10);
    if (*end || !*s.cl || s.cl[0] == '-') {
        ex_refuse(ex, 400, OUT_REJECTED, R_MALFORMED_REQUEST,
               "invalid Content-Length");
        return false;
    }
    if (cl > cfg->limits.max_body) {
        ex_refuse(ex, 413, OUT_REJECTED, R_BODY_TOO_LARGE,
               "request body of %llu bytes exceeds limits.max_body (%llu)", cl,
               (unsigned long long)cfg->limits.max_body);
        return false;
    }
    return true;
}

/* The header that carries the job's key: the policy's, else the usual one,
 * so that log lines of one job correlate even without idempotency. */
static const char *key_header(const struct exchange *ex)
{
    if (ex->pol && ex->pol->idem.enabled && ex->pol->idem.header)
        return ex->pol->idem.header;
    return "Idempotency-Key";
}

static bool check_route(struct exchange *ex)
{
    ex->route = route_match(ex->cfg, ex->target, sc_method_bit(ex->method));
    if (!ex->route) {
        ex_refuse(ex, 404, OUT_REJECTED, R_NO_ROUTE, "no route for %s %.*s",
               ex->method, (int)strcspn(ex->target, "?"), ex->target);
        return false;
    }
    ex->up = &ex->cfg->upstreams[ex->route->upstream];
    ex->pol = ex->route->policy >= 0 ? &ex->cfg->policies[ex->route->policy]
                                     : &ex->cfg->default_policy;
    ex->key = MHD_lookup_connection_value(ex->mc, MHD_HEADER_KIND, key_header(ex));
    return true;
}

/* ---- into the pipeline ------------------------------------------------- */

/* Sluice-Attempt: the worker's own count when there is no idempotency key. */
static bool read_attempt(struct exchange *ex)
{
    const char *v = MHD_lookup_connection_value(ex->mc, MHD_HEADER_KIND,
                                                "Sluice-Attempt");
    char *end;
    unsigned long n;

    ex->attempt = 1;
    if (!v)
        return true;
    n = strtoul(v, &end, 10);
    if (*v < '1' || *v > '9' || *end || n > 1000000) {
        ex_refuse(ex, 400, OUT_REJECTED, R_MALFORMED_REQUEST,
                  "Sluice-Attempt must be a positive integer, got \"%.32s\"", v);
        return false;
    }
    ex->attempt = (uint32_t)n;
    return true;
}

/* The body is in: from here the connection stays suspended until an answer
 * is ready, whichever stage produces it. */
static enum MHD_Result forward(struct exchange *ex)
{
    ex->suspended = true;
    TAILQ_INSERT_TAIL(&ex->w->waiting, ex, link);
    MHD_suspend_connection(ex->mc);
    ex_idem(ex);
    return MHD_YES;
}

/* ---- the MHD handler ---------------------------------------------------- */

static enum MHD_Result on_first_call(struct exchange *ex)
{
    if (!ex->target) {
        ex_refuse(ex, 500, OUT_REJECTED, R_MALFORMED_REQUEST, "out of memory");
        return answer(ex);
    }
    if (check_headers(ex) && check_route(ex)) {
        ex->state = EX_BODY;
        return MHD_YES;
    }
    /* Refused before the body: answer now; MHD then closes the connection
     * rather than reading a body nobody wants. */
    return answer(ex);
}

static void on_body_data(struct exchange *ex, const char *data, size_t len)
{
    if (ex->state != EX_BODY)
        return;
    if (!ex->body && !(ex->body = evbuffer_new())) {
        ex_refuse(ex, 500, OUT_REJECTED, R_MALFORMED_REQUEST, "out of memory");
        ex->state = EX_REFUSED;
        return;
    }
    if (evbuffer_get_length(ex->body) + len > ex->cfg->limits.max_body) {
        ex_refuse(ex, 413, OUT_REJECTED, R_BODY_TOO_LARGE,
               "request body exceeds limits.max_body (%llu)",
               (unsigned long long)ex->cfg->limits.max_body);
        ex->state = EX_REFUSED;
        return;
    }
    evbuffer_add(ex->body, data, len);
}

enum MHD_Result exchange_access(void *cls, struct MHD_Connection *c,
                                const char *url, const char *method,
                                const char *version, const char *upload_data,
                                size_t *upload_data_size, void **con_cls)
{
    struct exchange *ex = *con_cls;

    if (!ex)
        return MHD_NO;
    switch (ex->state) {
    case EX_HEADERS:
        ex->method = method;
        return on_first_call(ex);
    case EX_BODY:
    case EX_REFUSED:
        if (*upload_data_size) {
            on_body_data(ex, upload_data, *upload_data_size);
            *upload_data_size = 0;
            return MHD_YES;
        }
        if (ex->state == EX_REFUSED || !read_attempt(ex))
            return answer(ex);
        return forward(ex);
    case EX_READY:
        return answer(ex);
    default:
        return MHD_NO;
    }
}

/* ---- completion --------------------------------------------------------- */

static void log_exchange(const struct exchange *ex)
{
    struct access_entry e = {0};
    uint64_t now = clock_mono_ns();
    const struct up_request *u = &ex->ureq;

    e.route = ex->route ? ex->route->name : "none";
    e.policy = ex->route && ex->route->policy >= 0 ? ex->pol->name : "";
    e.method = ex->method ? ex->method : "-";
    e.target = ex->target ? ex->target : "";
    e.status = ex->status;
    e.outcome = outcome_name(ex->outcome);
    e.reason = reason_name(ex->reason);
    e.attempt = ex->attempt ? ex->attempt : 1;
    e.permit_wait_ms = (double)ex->permit_wait_ns / 1e6;
    e.shadow = ex->shadow;
    e.upstream_ms = u->done_ns > u->sent_ns ? (double)(u->done_ns - u->sent_ns) / 1e6 : 0;
    e.total_ms = (double)(now - ex->t0_ns) / 1e6;
    e.key = ex->key;
    log_access(&e);
}

/* Sluice-Enqueued-At: Unix seconds (a fraction allowed). */
static void record_queue_age(const struct exchange *ex, struct metrics_shard *sh,
                             const struct metrics_ids *ids, size_t r)
{
    const char *v = MHD_lookup_connection_value(ex->mc, MHD_HEADER_KIND,
                                                "Sluice-Enqueued-At");
    char *end;
    double at;

    if (!v)
        return;
    at = strtod(v, &end);
    if (end == v || *end || !(at > 0 && at < 1e11)) {
        metrics_add(sh, ids->queue_age_bad[r], 1);
        return;
    }
    at = (double)ex->t0_wall_ms / 1000.0 - at;
    metrics_observe(sh, H_QUEUE_AGE, ids->queue_age[r], at > 0 ? at : 0);
    if (ex->w->statsd.fd >= 0) {
        char tags[200], route[160];
        statsd_tag_value(ex->route ? ex->route->name : "none", route, sizeof route);
        snprintf(tags, sizeof tags, "route:%s", route);
        statsd_timing(&ex->w->statsd, "queue_age", (at > 0 ? at : 0) * 1000, tags);
    }
}

static void record_upstream(const struct exchange *ex, struct metrics_shard *sh,
                            const struct metrics_ids *ids)
{
    const struct up_request *u = &ex->ureq;
    size_t up = ex->route->upstream;

    if (!u->done_ns || !u->sent_ns)
        return;
    metrics_add(sh, ids->up_codes[up * UC__COUNT +
                                  metrics_up_code(u->resp.result, u->resp.status)], 1);
    metrics_observe(sh, H_DURATION, ids->up_duration[up],
                    (double)(u->done_ns - u->sent_ns) / 1e9);
}

/* StatsD timings, when it is on: the same figures as the histograms. */
static void record_statsd(const struct exchange *ex, size_t r, double total_s)
{
    struct statsd *sd = &ex->w->statsd;
    const struct up_request *u = &ex->ureq;
    char tags[256], route[160];

    if (sd->fd < 0)
        return;
    statsd_tag_value(ex->route ? ex->route->name : "none", route, sizeof route);
    snprintf(tags, sizeof tags, "route:%s", route);
    statsd_timing(sd, "request_duration", total_s * 1000, tags);
    if (!ex->route)
        return;
    if (u->done_ns && u->sent_ns) {
        snprintf(tags, sizeof tags, "upstream:%s", ex->up->name);
        statsd_timing(sd, "upstream_duration", (double)(u->done_ns - u->sent_ns) / 1e6, tags);
    }
    snprintf(tags, sizeof tags, "policy:%s", ex->pol->name);
    if (ex->ureq.sent_ns)
        statsd_timing(sd, "permit_wait", (double)ex->permit_wait_ns / 1e6, tags);
    if (ex->kind == ANSWER_INSTRUCTION && ex->outcome == OUT_REQUEUE) {
        snprintf(tags, sizeof tags, "policy:%s,reason:%s", ex->pol->name,
                 reason_name(ex->reason));
        statsd_timing(sd, "requeue_delay", (double)ex->instr.delay_ms, tags);
    }
    (void)r;
}

__attribute__((unused)) static void record_metrics(const struct exchange *ex)
{
    struct app *app = ex->w->app;
    struct metrics_shard *sh = &app->metrics.shards[ex->w->idx];
    const struct metrics_ids *ids = &ex->rt->ids;
    size_t r = ex->route ? (size_t)(ex->route - ex->cfg->routes) : ids->n_routes;
    size_t p = ex->route && ex->route->policy >= 0 ? (size_t)ex->route->policy
                                                   : ids->n_policies;

    double total_s = (double)(clock_mono_ns() - ex->t0_ns) / 1e9;

    metrics_add(sh, ids->requests[(r * OUT__COUNT + ex->outcome) * R__COUNT + ex->reason], 1);
    metrics_observe(sh, H_DURATION, ids->req_duration[r], total_s);
    record_statsd(ex, r, total_s);
    record_queue_age(ex, sh, ids, r);
    if (!ex->route)
        return;
    if (ex->shadow && !strcmp(ex->shadow, "rate_limited"))
        metrics_add(sh, ids->shadow[r], 1);
    if (ex->has_slot || ex->ureq.sent_ns)
        metrics_observe(sh, H_PERMIT_WAIT, ids->permit_wait[p],
                        (double)ex->permit_wait_ns / 1e9);
    if (ex->kind == ANSWER_INSTRUCTION && ex->outcome == OUT_REQUEUE)
        metrics_observe(sh, H_REQUEUE_DELAY, ids->requeue_delay[p * R__COUNT + ex->reason],
                        (double)ex->instr.delay_ms / 1000.0);
    record_upstream(ex, sh, ids);
}

void exchange_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                        enum MHD_RequestTerminationCode toe)
{
    struct exchange *ex = *con_cls;

    if (!ex)
        return;
    if (ex->state == EX_ANSWERED) {
#ifndef SLUICE_METRICS_OFF /* a benchmark-only build, to price the metrics */
        record_metrics(ex);
#endif
        if (ex->cfg->log.access)
            log_exchange(ex);
    }
    exchange_free(ex);
    *con_cls = NULL;
}

void exchange_abort_all(struct worker *w)
{
    struct exchange *ex;

    /* Each call finishes the exchange, which leaves the list. */
    while ((ex = TAILQ_FIRST(&w->waiting))) {
        if (ex->state == EX_UPSTREAM)
            ex_upstream_abort(ex);
        else
            ex_pace_abort(ex);
    }
}
