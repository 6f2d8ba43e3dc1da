/* libmicrohttpd's calls for one worker request, and the request's owner
 * for the driver: the exchange is made when the request line is in (the
 * raw target is only to be had then), checked at the first handler call,
 * given its plan when routed, run by the driver once the body is in, and
 * freed at MHD's completion notice, where its record goes to obs/. */
#define _GNU_SOURCE
#include "proxy/server/mhd_request.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "obs/log.h"
#include "obs/request.h"
#include "policies/route.h"
#include "proxy/app.h"
#include "proxy/server/mhd_internal.h"
#include "proxy/runtime.h"
#include "proxy/server/server.h"
#include "util/clock.h"

/* ---- the owner ------------------------------------------------------------ */

static struct loop *mhd_loop(const struct exchange *ex)
{
    return ex->owner_arg;
}

/* MHD stops calling us until the resume; the drain deadline finds the
 * request on the loop's list. */
static void owner_suspend(struct exchange *ex)
{
    TAILQ_INSERT_TAIL(&mhd_loop(ex)->waiting, ex, link);
    MHD_suspend_connection(ex->mc);
}

/* MHD_resume_connection does not wake an external-epoll loop: the kick
 * makes MHD run on this loop pass. */
static void owner_resume(struct exchange *ex)
{
    TAILQ_REMOVE(&mhd_loop(ex)->waiting, ex, link);
    MHD_resume_connection(ex->mc);
    loop_kick(mhd_loop(ex));
}

static int owner_client_fd(struct exchange *ex)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(ex->mc, MHD_CONNECTION_INFO_CONNECTION_FD);

    return ci ? ci->connect_fd : -1;
}

struct header_walk {
    ex_header_fn fn;
    void *arg;
};

static enum MHD_Result each_header(void *cls, enum MHD_ValueKind kind,
                                   const char *key, const char *value)
{
    struct header_walk *w = cls;

    w->fn(w->arg, key, value);
    return MHD_YES;
}

static void owner_headers(struct exchange *ex, ex_header_fn fn, void *arg)
{
    struct header_walk w = {fn, arg};

    MHD_get_connection_values(ex->mc, MHD_HEADER_KIND, each_header, &w);
}

static const struct ex_owner mhd_owner = {
    .suspend = owner_suspend,
    .resume = owner_resume,
    .client_fd = owner_client_fd,
    .headers = owner_headers,
};

/* ---- allocation ----------------------------------------------------------- */

void *exchange_uri_log(void *cls, const char *uri, struct MHD_Connection *c)
{
    struct loop *w = cls;
    struct exchange *ex;

    /* First: MHD's completion notice follows every call here, and the
     * connection's count of open requests must see both. */
    srv_conn_head_begun(c);
    ex = freelist_take(&w->spare_ex);
    if (!ex)
        return NULL;
    ex->env = &w->env;
    ex->owner = &mhd_owner;
    ex->owner_arg = w;
    ex->mc = c;
    ex->rt = loop_runtime(w);
    ex->cfg = ex->rt->cfg;
    ex->ids = &ex->rt->ids;
    ex->t0_ns = clock_mono_ns();
    ex->t0_wall_ms = clock_wall_ms();
    mhd_take_target(ex, uri);
    atomic_fetch_add(&w->app->inflight, 1);
    return ex;
}

/* What the request holds is its rows' to give back (the driver walks them);
 * the request itself, its body and its answer's record are the owner's. */
static void exchange_free(struct exchange *ex)
{
    struct loop *w = mhd_loop(ex);

    if (ex->suspended) /* a daemon stopped early */
        TAILQ_REMOVE(&w->waiting, ex, link);
    ex_release_all(ex);
    store_record_clear(&ex->replay);
    if (ex->body)
        evbuffer_free(ex->body);
    atomic_fetch_sub(&w->app->inflight, 1);
    runtime_put(ex->rt);
    free(ex->target);
    freelist_give(&w->spare_ex, ex);
}

/* Enough for the requests a loop starts and ends between two passes of a
 * busy loop; a burst beyond it allocates as before. */
#define EX_SPARES 64

void exchange_loop_init(struct loop *w)
{
    freelist_init(&w->spare_ex, sizeof (struct exchange), EX_SPARES);
    freelist_init(&w->spare_call, sizeof (struct store_call), EX_SPARES);
}

void exchange_loop_clear(struct loop *w)
{
    freelist_clear(&w->spare_ex);
    freelist_clear(&w->spare_call);
}

/* ---- routing -------------------------------------------------------------- */

/* The header that carries the job's key: the policy's, else the usual one,
 * so that log lines of one job correlate even without idempotency. */
static const char *key_header(const struct sc_policy *p)
{
    return p->idem.enabled && p->idem.header ? p->idem.header : "Idempotency-Key";
}

/* Keyed: a method the policy keys, and a key sent or required (a request
 * without one under required: false runs the plain plan). */
static bool keyed(const struct exchange *ex)
{
    const struct sc_idempotency *id = &ex->pol->idem;

    return id->enabled && (id->methods & sc_method_bit(ex->method)) &&
           (ex->key || id->required);
}

/* The route the target matches, and what the request runs on it (policy,
 * plan, pacing state, pool): false when refused (404). The request's facts
 * the rows need are read from MHD once: the rows see plain fields (and
 * tests can set them). */
static bool mhd_route(struct exchange *ex)
{
    struct loop *w = mhd_loop(ex);
    const struct sc_route *r;

    r = ex->route = route_match(ex->cfg, ex->target, sc_method_bit(ex->method));
    if (!r) {
        ex_refuse(ex, 404, OUT_REJECTED, R_NO_ROUTE, "no route for %s %.*s",
                  ex->method, (int)strcspn(ex->target, "?"), ex->target);
        return false;
    }
    ex->up = r->up;
    ex->pol = r->pol;
    ex->label = r->name;
    ex->upstream_idx = r->upstream;
    ex->max_wait_ns = ex->pol->max_wait_ms * NS_PER_MS;
    ex->timeout_ms = sc_route_timeout(r, ex->up);
    ex->ps = pacing_policy(&ex->rt->pacing, r->policy);
    ex->pool = ex->rt->pools[w->idx][r->upstream];
    ex->http_proxy = ex->up->https ? NULL : ex->rt->proxies[r->upstream];
    ex->key = MHD_lookup_connection_value(ex->mc, MHD_HEADER_KIND, key_header(ex->pol));
    if (ex->pol->n_lanes && ex->pol->lane_header)
        ex->lane_value = MHD_lookup_connection_value(ex->mc, MHD_HEADER_KIND,
                                                     ex->pol->lane_header);
    if (ex->pol->partition_header)
        ex->partition = MHD_lookup_connection_value(ex->mc, MHD_HEADER_KIND,
                                                    ex->pol->partition_header);
    ex->plan = ex_plan_for(runtime_plans(ex->rt, r->policy), keyed(ex));
    return true;
}

/* ---- the MHD handler ------------------------------------------------------ */

/* The body is in: the plan runs. An answer it decides at once goes out in
 * this call; otherwise the connection stays suspended until one is ready,
 * whichever row produces it, and MHD calls again. */
static enum MHD_Result forward(struct exchange *ex)
{
    ex_start(ex);
    if (ex->phase == PH_READY && !ex->suspended)
        return mhd_answer_ready(ex);
    return MHD_YES;
}

static enum MHD_Result on_first_call(struct exchange *ex, const char *url,
                                     const char *version)
{
    if (!srv_conn_head_done(ex->mc))
        return MHD_NO; /* too late: answered 408, the connection is closing */
    /* Echoed on every answer, refusals included. */
    ex->worker_id = MHD_lookup_connection_value(ex->mc, MHD_HEADER_KIND,
                                                EX_REQUEST_ID_HEADER);
#ifdef SLUICE_FAILALLOC
    failalloc_arm(atol(MHD_lookup_connection_value(ex->mc, MHD_HEADER_KIND,
                                                   "X-Sluice-Failalloc") ?: "0"));
#endif
    if (!ex->status && !ex->target)
        ex_refuse(ex, 500, OUT_REJECTED, R_INTERNAL, "out of memory");
    if (!ex->status && mhd_check_request(ex, url, version, mhd_route)) {
        ex->phase = PH_BODY;
        return MHD_YES;
    }
    /* Refused before the body: answer now; MHD then closes the connection
     * rather than reading a body nobody wants. */
    srv_conn_body_done(ex->mc);
    return ex->reason == R_MALFORMED_REQUEST ? mhd_answer_malformed(ex) : mhd_answer(ex);
}

static void refuse_body(struct exchange *ex, int status, enum reason r,
                        const char *detail)
{
    ex_refuse(ex, status, OUT_REJECTED, r, "%s", detail);
    ex->phase = PH_REFUSED;
}

static void on_body_data(struct exchange *ex, const char *data, size_t len)
{
    struct sc_error err = {0};
    char why[128];

    if (ex->phase != PH_BODY)
        return;
    if (ex->chunked) {
        if (mhd_check_chunk_line(ex, data, mhd_loop(ex)->mhd_runs, &err) == -EINVAL) {
            refuse_body(ex, 400, R_MALFORMED_REQUEST, err.text);
            return;
        }
        ex->raw_next = data + len;
        ex->raw_run = mhd_loop(ex)->mhd_runs;
    }
    if (!ex->body && !(ex->body = evbuffer_new())) {
        refuse_body(ex, 500, R_INTERNAL, "out of memory");
        return;
    }
    if (evbuffer_get_length(ex->body) + len > ex->cfg->limits.max_body) {
        snprintf(why, sizeof why, "request body exceeds limits.max_body (%llu)",
                 (unsigned long long)ex->cfg->limits.max_body);
        refuse_body(ex, 413, R_BODY_TOO_LARGE, why);
        return;
    }
    evbuffer_add(ex->body, data, len);
    ex->bytes_in += len;
}

enum MHD_Result exchange_access(void *cls, struct MHD_Connection *c,
                                const char *url, const char *method,
                                const char *version, const char *upload_data,
                                size_t *upload_data_size, void **con_cls)
{
    struct exchange *ex = *con_cls;

    if (!ex)
        return MHD_NO;
    switch (ex->phase) {
    case PH_HEADERS:
        ex->method = method;
        return on_first_call(ex, url, version);
    case PH_BODY:
    case PH_REFUSED:
        if (*upload_data_size) {
            on_body_data(ex, upload_data, *upload_data_size);
            *upload_data_size = 0;
            return MHD_YES;
        }
        srv_conn_body_done(c);
        if (ex->phase == PH_REFUSED || !mhd_read_attempt(ex))
            return ex->reason == R_MALFORMED_REQUEST ? mhd_answer_malformed(ex)
                                                     : mhd_answer(ex);
        return forward(ex);
    case PH_READY:
        return mhd_answer_ready(ex);
    default:
        return MHD_NO;
    }
}

/* ---- completion ----------------------------------------------------------- */

/* The request's record, as obs/ takes it. */
static void record(struct exchange *ex, struct obs_request *r)
{
    const struct up_request *u = &ex->ureq;
    bool routed = ex->route != NULL;

    r->route = routed ? (size_t)(ex->route - ex->cfg->routes) : ex->ids->n_routes;
    r->policy = routed && ex->route->policy >= 0 ? (size_t)ex->route->policy
                                                 : ex->ids->n_policies;
    r->route_name = routed ? ex->route->name : "none";
    r->policy_name = routed ? ex->pol->name : "";
    r->log_policy = routed && ex->pol != &ex->cfg->default_policy ? ex->pol->name : "";
    r->upstream_name = routed ? ex->up->name : NULL;
    r->method = ex->method ? ex->method : "-";
    r->target = ex->target ? ex->target : "";
    r->key = ex->key;
    /* Every line has one: a replay's own (its answer carries the stored
     * one), an abandoned request's too. */
    r->request_id = ex_request_id(ex);
    r->shadow = shadow_name(ex->shadow);
    r->shadow_refused = ex->shadow == SHADOW_RATE_LIMITED;
    r->status = ex->status;
    r->upstream_status = u->resp.status;
    r->outcome = ex->outcome;
    r->reason = ex->reason;
    /* An instruction's attempt is what its body told the worker (attempts
     * so far, for answers that reached no upstream). */
    r->attempt = ex->kind == ANSWER_INSTRUCTION ? ex->instr.attempt
                 : ex->attempt ? ex->attempt : 1;
    r->permit_counted = ex->got_slot || u->sent_ns;
    r->permit_wait_ns = ex->permit_wait_ns;
    r->lane = ex->has_lane ? ex->lane : 0;
    r->lane_name = ex->has_lane ? ex->pol->lanes[ex->lane].name : "";
    r->sent = u->sent_ns != 0;
    r->upstream_timed = u->done_ns && u->sent_ns;
    r->upstream_ns = u->done_ns > u->sent_ns ? u->done_ns - u->sent_ns : 0;
    r->total_ns = clock_mono_ns() - ex->t0_ns;
    r->bytes_in = ex->bytes_in;
    /* MHD sends no body with these, whatever the response holds. */
    r->bytes_out = mhd_answer_bodiless(ex, ex->status) ? 0 : ex->bytes_out;
    r->requeued = ex->kind == ANSWER_INSTRUCTION && ex->outcome == OUT_REQUEUE;
    r->requeue_delay_ms = ex->instr.delay_ms;
    r->enqueued_at = ex->mc ? MHD_lookup_connection_value(ex->mc, MHD_HEADER_KIND,
                                                          "Sluice-Enqueued-At")
                            : NULL;
    r->arrival_wall_ms = ex->t0_wall_ms;
}

void exchange_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                        enum MHD_RequestTerminationCode toe)
{
    struct exchange *ex = *con_cls;
    struct obs_request r;

    srv_conn_request_ended(c);
    if (!ex)
        return;
    /* An abandoned request may be closed by MHD before it calls back. */
    if (ex->phase == PH_ANSWERED || ex->outcome == OUT_ABANDONED) {
        record(ex, &r);
        obs_request_done(&r, ex->env->metrics, ex->ids, ex->env->statsd,
                         ex->cfg->log.access);
    }
    exchange_free(ex);
    *con_cls = NULL;
#ifdef SLUICE_FAILALLOC
    if (failalloc_fired())
        log_warn("failalloc: the armed allocation failed during this request");
    failalloc_arm(0);
#endif
}

/* ---- the drain deadline ----------------------------------------------------- */

void exchange_abort_all(struct loop *w)
{
    struct exchange *ex;

    /* Each exchange leaves the list as it is resumed; one whose answer must
     * still wait for a store write comes back once, and its second drain
     * gives that wait up. */
    while ((ex = TAILQ_FIRST(&w->waiting)))
        ex_drain(ex);
}
