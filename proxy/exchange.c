#define _GNU_SOURCE
#include "proxy/exchange.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <event2/buffer.h>

#include "policies/route.h"
#include "proxy/app.h"
#include "proxy/headers.h"
#include "proxy/log.h"
#include "proxy/problem.h"
#include "proxy/server.h"
#include "proxy/upstream.h"
#include "util/clock.h"

enum ex_state {
    EX_HEADERS = 0, /* first call: headers are in, body not yet */
    EX_BODY,        /* collecting the body */
    EX_REFUSED,     /* answer decided, body discarded */
    EX_UPSTREAM,    /* suspended, waiting on the upstream */
    EX_READY,       /* resumed with an answer to queue */
    EX_ANSWERED,
};

struct exchange {
    struct worker *w;
    struct MHD_Connection *mc;
    const struct sc_config *cfg;
    enum ex_state state;
    char *target;           /* raw origin-form target, query included */
    const char *method;     /* MHD's, valid until completion */
    const struct sc_route *route;
    const struct sc_upstream *up;
    const struct sc_policy *pol;
    struct evbuffer *body;
    /* the answer */
    int status;
    enum outcome outcome;
    enum reason reason;
    char detail[192];
    bool from_upstream;
    struct up_request ureq;
    uint64_t t0_ns;
    TAILQ_ENTRY(exchange) link;
};

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
    ex->cfg = w->app->cfg;
    ex->t0_ns = clock_mono_ns();
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
    if (ex->state == EX_UPSTREAM) {
        TAILQ_REMOVE(&ex->w->waiting, ex, link);
        up_request_cancel(&ex->ureq);
    }
    up_response_clear(&ex->ureq.resp);
    if (ex->ureq.wire)
        evbuffer_free(ex->ureq.wire);
    if (ex->body)
        evbuffer_free(ex->body);
    atomic_fetch_sub(&ex->w->app->inflight, 1);
    free(ex->target);
    free(ex);
}

/* ---- answers ------------------------------------------------------------ */

static void refuse(struct exchange *ex, int status, enum outcome o,
                   enum reason r, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static void refuse(struct exchange *ex, int status, enum outcome o,
                   enum reason r, const char *fmt, ...)
{
    va_list ap;

    ex->status = status;
    ex->outcome = o;
    ex->reason = r;
    ex->from_upstream = false;
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

static enum MHD_Result answer_problem(struct exchange *ex)
{
    size_t len;
    char *body = problem_json(ex->status, ex->reason, ex->detail, &len);
    struct MHD_Response *resp;

    if (!body)
        return MHD_NO;
    resp = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", "application/problem+json");
    return queue(ex, resp);
}

static void add_upstream_headers(struct MHD_Response *resp,
                                 const struct up_response *ur)
{
    struct hdr_conn_tokens tok = {0};

    for (size_t i = 0; i < ur->n_headers; i++)
        if (strcasecmp(ur->headers[i].name, "Connection") == 0)
            hdr_conn_tokens_add(&tok, ur->headers[i].value);
    for (size_t i = 0; i < ur->n_headers; i++) {
        const struct up_header *h = &ur->headers[i];

        if (hdr_skip_response(h->name, &tok) ||
            strncasecmp(h->name, "Sluice-", 7) == 0)
            continue;
        MHD_add_response_header(resp, h->name, h->value);
    }
}

static void free_evbuffer(void *cls)
{
    evbuffer_free(cls);
}

static enum MHD_Result answer_upstream(struct exchange *ex)
{
    struct up_response *ur = &ex->ureq.resp;
    struct evbuffer *body = ur->body;
    size_t len = evbuffer_get_length(body);
    struct MHD_Response *resp;
    void *data = len ? evbuffer_pullup(body, -1) : NULL;

    resp = MHD_create_response_from_buffer_with_free_callback_cls(
        len, data, free_evbuffer, body);
    if (!resp)
        return MHD_NO;
    ur->body = NULL; /* the response owns it now */
    add_upstream_headers(resp, ur);
    return queue(ex, resp);
}

static enum MHD_Result answer(struct exchange *ex)
{
    return ex->from_upstream ? answer_upstream(ex) : answer_problem(ex);
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
        refuse(ex, 431, OUT_REJECTED, R_HEADERS_TOO_LARGE,
               "request headers of %zu bytes exceed limits.max_header (%llu)",
               s.bytes, (unsigned long long)cfg->limits.max_header);
        return false;
    }
    if ((s.n_cl && s.n_te) || s.cl_conflict || s.te_bad || s.n_te > 1) {
        refuse(ex, 400, OUT_REJECTED, R_MALFORMED_REQUEST,
               "conflicting or unsupported Content-Length / Transfer-Encoding");
        return false;
    }
    if (!s.cl)
        return true;
    cl = strtoull(s.cl, &end, 10);
    if (*end || !*s.cl || s.cl[0] == '-') {
        refuse(ex, 400, OUT_REJECTED, R_MALFORMED_REQUEST,
               "invalid Content-Length");
        return false;
    }
    if (cl > cfg->limits.max_body) {
        refuse(ex, 413, OUT_REJECTED, R_BODY_TOO_LARGE,
               "request body of %llu bytes exceeds limits.max_body (%llu)", cl,
               (unsigned long long)cfg->limits.max_body);
        return false;
    }
    return true;
}

static bool check_route(struct exchange *ex)
{
    ex->route = route_match(ex->cfg, ex->target, sc_method_bit(ex->method));
    if (!ex->route) {
        refuse(ex, 404, OUT_REJECTED, R_NO_ROUTE, "no route for %s %.*s",
               ex->method, (int)strcspn(ex->target, "?"), ex->target);
        return false;
    }
    ex->up = &ex->cfg->upstreams[ex->route->upstream];
    ex->pol = ex->route->policy >= 0 ? &ex->cfg->policies[ex->route->policy]
                                     : &ex->cfg->default_policy;
    return true;
}

/* ---- the upstream request ----------------------------------------------- */

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

    /* Expect: the body is already here, a 100-continue would be noise. */
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

/* Until the pacing issue brings requeue instructions, transport failures are
 * answered as a gateway would: 502 for connect/lost, 504 for a timeout. */
static void map_failure(struct exchange *ex)
{
    const struct up_response *r = &ex->ureq.resp;

    switch (r->result) {
    case UP_CONNECT_ERROR:
        refuse(ex, 502, OUT_PERMANENT_ERROR, R_CONNECT_ERROR,
               "upstream %s: %s", ex->up->name, r->detail);
        break;
    case UP_CONNECTION_LOST:
        refuse(ex, 502, OUT_PERMANENT_ERROR, R_CONNECTION_LOST,
               "upstream %s: %s", ex->up->name, r->detail);
        break;
    default:
        refuse(ex, 504, OUT_PERMANENT_ERROR, R_TIMEOUT, "upstream %s: %s",
               ex->up->name, r->detail);
        break;
    }
}

static void classify_response(struct exchange *ex)
{
    int s = ex->ureq.resp.status;

    ex->status = s;
    ex->from_upstream = true;
    ex->reason = R_NONE;
    ex->outcome = s < 400 ? OUT_OK : OUT_PERMANENT_ERROR;
}

static void resume(struct exchange *ex)
{
    TAILQ_REMOVE(&ex->w->waiting, ex, link);
    ex->state = EX_READY;
    MHD_resume_connection(ex->mc);
    worker_kick(ex->w);
}

static void on_upstream_done(struct up_request *req, void *arg)
{
    struct exchange *ex = arg;

    if (req->resp.result == UP_OK)
        classify_response(ex);
    else
        map_failure(ex);
    if (req->resp.result != UP_OK)
        log_warn("route %s: upstream %s: %s", ex->route->name, ex->up->name,
                 req->resp.detail);
    resume(ex);
}

static enum MHD_Result forward(struct exchange *ex)
{
    if (build_wire(ex) != 0) {
        refuse(ex, 500, OUT_REJECTED, R_MALFORMED_REQUEST,
               "out of memory building the upstream request");
        return answer(ex);
    }
    ex->ureq.no_body = strcmp(ex->method, "HEAD") == 0;
    ex->ureq.done = on_upstream_done;
    ex->ureq.arg = ex;
    ex->state = EX_UPSTREAM;
    TAILQ_INSERT_TAIL(&ex->w->waiting, ex, link);
    MHD_suspend_connection(ex->mc);
    if (up_pool_send(ex->w->pools[ex->route->upstream], &ex->ureq) != 0) {
        refuse(ex, 502, OUT_PERMANENT_ERROR, R_CONNECT_ERROR,
               "cannot queue the upstream request");
        resume(ex);
    }
    return MHD_YES;
}

/* ---- the MHD handler ---------------------------------------------------- */

static enum MHD_Result on_first_call(struct exchange *ex)
{
    if (!ex->target) {
        refuse(ex, 500, OUT_REJECTED, R_MALFORMED_REQUEST, "out of memory");
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
        refuse(ex, 500, OUT_REJECTED, R_MALFORMED_REQUEST, "out of memory");
        ex->state = EX_REFUSED;
        return;
    }
    if (evbuffer_get_length(ex->body) + len > ex->cfg->limits.max_body) {
        refuse(ex, 413, OUT_REJECTED, R_BODY_TOO_LARGE,
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
        return ex->state == EX_REFUSED ? answer(ex) : forward(ex);
    case EX_READY:
        return answer(ex);
    default:
        return MHD_NO;
    }
}

/* ---- completion --------------------------------------------------------- */

/* The header that carries the job's key: the policy's, else the usual one,
 * so that log lines of one job correlate even without idempotency. */
static const char *key_header(const struct exchange *ex)
{
    if (ex->pol && ex->pol->idem.enabled && ex->pol->idem.header)
        return ex->pol->idem.header;
    return "Idempotency-Key";
}

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
    e.attempt = 1;
    e.upstream_ms = u->done_ns > u->sent_ns ? (double)(u->done_ns - u->sent_ns) / 1e6 : 0;
    e.total_ms = (double)(now - ex->t0_ns) / 1e6;
    e.key = MHD_lookup_connection_value(ex->mc, MHD_HEADER_KIND,
                                        key_header(ex));
    log_access(&e);
}

void exchange_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                        enum MHD_RequestTerminationCode toe)
{
    struct exchange *ex = *con_cls;

    if (!ex)
        return;
    if (ex->state == EX_ANSWERED && ex->cfg->log.access)
        log_exchange(ex);
    exchange_free(ex);
    *con_cls = NULL;
}

void exchange_abort_all(struct worker *w)
{
    struct exchange *ex;

    while ((ex = TAILQ_FIRST(&w->waiting))) {
        up_request_cancel(&ex->ureq);
        /* Sent and unanswered: the outcome is unknown to us. */
        refuse(ex, 503, OUT_REQUEUE, R_CONNECTION_LOST,
               "sluice is shutting down; the upstream outcome is unknown");
        resume(ex);
    }
}
