#define _GNU_SOURCE
#include "proxy/exchange.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "policies/http_head.h"
#include "policies/path.h"
#include "policies/route.h"
#include "proxy/app.h"
#include "proxy/exchange_internal.h"
#include "policies/headers.h"
#include "obs/log.h"
#include "policies/problem.h"
#include "proxy/server.h"
#include "proxy/upstream.h"
#include "util/clock.h"
#include "util/rand.h"

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

/* libmicrohttpd passes the target cut at its first NUL. In its buffer the
 * target ends with one NUL (the space it replaced) before "HTTP/1.x" and
 * the NUL of the line end; anything else there means a NUL inside the
 * target. Reading stops at the first mismatch, so never past the line. */
static bool target_is_whole(const char *uri, size_t len)
{
    static const char version[] = "HTTP/1.";
    const char *v = uri + len + 1;

    for (size_t i = 0; i < sizeof version - 1; i++)
        if (v[i] != version[i])
            return false;
    return v[7] >= '0' && v[7] <= '9' && v[8] == '\0';
}

/* Sets ex->target: origin-form, the path normalised, so that the route, the
 * fingerprint and the forwarded target all see the same path. A refusal is
 * recorded on ex and answered at the first handler call, the first moment
 * libmicrohttpd lets us answer. */
static void take_target(struct exchange *ex, const char *uri)
{
    struct sc_error err = {0};
    size_t len = uri ? strlen(uri) : 0;
    const char *o;
    char *path = NULL;
    int rc;

    if (!uri || !target_is_whole(uri, len) ||
        http_target_form(uri, len) == HTTP_TARGET_INVALID) {
        ex->target = strdup(uri ? uri : "");
        ex_refuse(ex, 400, OUT_REJECTED, R_MALFORMED_REQUEST,
                  "the request-target is neither origin-form nor absolute-form");
        return;
    }
    o = origin_form(uri);
    /* "" and "?q" have an empty path, which HTTP says is "/". */
    if ((*o == '\0' || *o == '?') && asprintf(&path, "/%s", o) < 0)
        return; /* target NULL: out of memory */
    if (path)
        o = path;
    rc = path_normalise(o, strlen(o), &ex->target, &err);
    if (rc == -EINVAL) {
        ex->target = strdup(o);
        ex_refuse(ex, 400, OUT_REJECTED, R_MALFORMED_REQUEST, "%s", err.text);
    }
    free(path);
}

void *exchange_uri_log(void *cls, const char *uri, struct MHD_Connection *c)
{
    struct loop *w = cls;
    struct exchange *ex;

    /* First: MHD's completion notice follows every call here, and the
     * connection's count of open requests must see both. */
    conn_head_begun(c);
    ex = freelist_take(&w->spare_ex);
    if (!ex)
        return NULL;
    ex->loop = w;
    ex->mc = c;
    ex->rt = loop_runtime(w);
    ex->cfg = ex->rt->cfg;
    ex->t0_ns = clock_mono_ns();
    ex->t0_wall_ms = clock_wall_ms();
    take_target(ex, uri);
    atomic_fetch_add(&w->app->inflight, 1);
    return ex;
}

static void exchange_free(struct exchange *ex)
{
    ex_release_all(ex);
    if (ex->timer)
        event_free(ex->timer);
    if (ex->client_ev)
        event_free(ex->client_ev);
    if (ex->slot.granted_ev)
        event_free(ex->slot.granted_ev);
    store_record_clear(&ex->replay);
    freelist_give(&ex->loop->spare_call, ex->scall);
    up_response_clear(&ex->ureq.resp);
    if (ex->ureq.wire)
        evbuffer_free(ex->ureq.wire);
    if (ex->body)
        evbuffer_free(ex->body);
    atomic_fetch_sub(&ex->loop->app->inflight, 1);
    runtime_put(ex->rt);
    free(ex->target);
    freelist_give(&ex->loop->spare_ex, ex);
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

/* 1 to EX_REQUEST_ID_MAX visible ASCII characters: it is logged and sent
 * on, so nothing that could break a header or a log line. */
static bool request_id_usable(const char *v)
{
    size_t n = v ? strlen(v) : 0;

    if (n == 0 || n > EX_REQUEST_ID_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if (v[i] <= 0x20 || v[i] >= 0x7f)
            return false;
    return true;
}

/* 16 lower-case hex digits of v at out (no NUL): snprintf's "%016llx"
 * twice cost about 2,000 instructions per request. */
static void hex16(char *out, uint64_t v)
{
    static const char digits[] = "0123456789abcdef";

    for (int i = 15; i >= 0; i--, v >>= 4)
        out[i] = digits[v & 0xf];
}

const char *ex_request_id(struct exchange *ex)
{
    const char *v;

    if (ex->request_id[0])
        return ex->request_id;
    v = ex->mc ? MHD_lookup_connection_value(ex->mc, MHD_HEADER_KIND, EX_REQUEST_ID_HEADER)
               : NULL;
    if (request_id_usable(v))
        snprintf(ex->request_id, sizeof ex->request_id, "%s", v);
    else {
        _Static_assert(EX_REQUEST_ID_MAX >= 32, "a made id takes 32 digits");
        hex16(ex->request_id, rand_u64());
        hex16(ex->request_id + 16, rand_u64());
        ex->request_id[32] = '\0';
    }
    return ex->request_id;
}

static enum MHD_Result queue(struct exchange *ex, struct MHD_Response *resp)
{
    enum MHD_Result rc;

    if (!resp)
        return MHD_NO;
    MHD_add_response_header(resp, "Sluice-Outcome", outcome_name(ex->outcome));
    /* A replay is the stored response: it carries the id of the request
     * that reached the partner (stored with it). */
    if (ex->kind != ANSWER_REPLAY)
        MHD_add_response_header(resp, EX_REQUEST_ID_HEADER, ex_request_id(ex));
    rc = MHD_queue_response(ex->mc, (unsigned)ex->status, resp);
    MHD_destroy_response(resp);
    ex_set_answered(ex);
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

    ex->bytes_out = body ? len : 0;
    return queue(ex, json_response(body, len, "application/problem+json"));
}

static enum MHD_Result answer_upstream(struct exchange *ex)
{
    return queue(ex, ex_stream_response(ex));
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
    ex->bytes_out = len;
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

/* For responses MHD sends no body of. */
static ssize_t no_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    return MHD_CONTENT_READER_END_OF_STREAM;
}

/* A stored result, byte for byte, with no permit and no upstream call. A
 * replayed failure (4xx) stays permanent_error: "replayed" always means
 * "this already succeeded: ack it". */
static enum MHD_Result answer_replay(struct exchange *ex)
{
    const struct store_record *rec = &ex->replay;
    struct MHD_Response *resp;

    /* The record keeps no Content-Length: a bodiless answer is not given
     * one of 0 (exchange_stream.c). */
    if (ex_answer_bodiless(ex, rec->status))
        resp = ex_bodiless_response(rec->status, false, 0, no_reader, NULL);
    else
        resp = MHD_create_response_from_buffer(rec->body_len, rec->body,
                                               MHD_RESPMEM_MUST_COPY);
    if (!resp)
        return MHD_NO;
    for (size_t i = 0; i < rec->n_headers; i++)
        MHD_add_response_header(resp, rec->headers[i].name, rec->headers[i].value);
    MHD_add_response_header(resp, "Idempotent-Replayed", "true");
    if (rec->body_omitted)
        MHD_add_response_header(resp, "Sluice-Body-Omitted", "true");
    ex->bytes_out = rec->body_len;
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

/* ---- header checks ------------------------------------------------------ */

#define FIELDS_ON_STACK 64

struct field_list {
    struct http_field *v;
    size_t n, cap;
    size_t head_size;       /* the head as received (MHD's count), 0 unknown */
};

static enum MHD_Result collect_field(void *cls, enum MHD_ValueKind kind,
                                     const char *key, const char *value)
{
    struct field_list *l = cls;
    struct http_field *f;

    if (l->n == l->cap) /* counted just before: cannot happen */
        return MHD_NO;
    f = &l->v[l->n++];
    f->name = key;
    f->name_len = strlen(key);
    f->value = value ? value : "";
    f->value_len = value ? strlen(value) : 0;
    return MHD_YES;
}

/* The request's header fields in order: in stack when they fit, else in
 * a malloc'd array (the caller frees l->v when it is not stack). */
static int collect_fields(struct exchange *ex, struct http_field *stack,
                          struct field_list *l)
{
    int n = MHD_get_connection_values(ex->mc, MHD_HEADER_KIND, NULL, NULL);
    const union MHD_ConnectionInfo *hs =
        MHD_get_connection_info(ex->mc, MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE);

    l->head_size = hs ? hs->header_size : 0;
    l->v = stack;
    l->cap = FIELDS_ON_STACK;
    if (n > FIELDS_ON_STACK) {
        l->v = malloc((size_t)n * sizeof *l->v);
        if (!l->v)
            return -ENOMEM;
        l->cap = (size_t)n;
    }
    MHD_get_connection_values(ex->mc, MHD_HEADER_KIND, collect_field, l);
    return 0;
}

/* libmicrohttpd cuts a value at its first NUL (strlen) and glues a folded
 * line onto the field before it. Its read buffer holds the head in order,
 * each line end overwritten with NULs, so the bytes up to the next field's
 * name (or the head's end) are what was really sent: each value is widened
 * to them, and the checks then see the NUL or the fold. A field outside
 * that layout (MHD moved a folded one) is left as it is. */
static void widen_to_raw(struct field_list *l, const char *head, const char *end)
{
    for (size_t i = 0; i < l->n; i++) {
        struct http_field *f = &l->v[i];
        const char *next = i + 1 < l->n ? l->v[i + 1].name : end;
        size_t span, strip = i + 1 < l->n ? 2 : 4; /* line end (+ empty line) */

        if (f->value < head || next > end || next <= f->value + f->value_len)
            continue;
        span = (size_t)(next - f->value);
        while (strip-- && span > f->value_len && f->value[span - 1] == '\0')
            span--;
        f->value_len = span;
    }
}

/* A line end (now a NUL) followed by a space or a tab. */
static bool has_fold(const struct field_list *l)
{
    for (size_t i = 0; i < l->n; i++)
        for (size_t k = 0; k + 1 < l->v[i].value_len; k++)
            if (l->v[i].value[k] == '\0' &&
                (l->v[i].value[k + 1] == ' ' || l->v[i].value[k + 1] == '\t'))
                return true;
    return false;
}

/* The request line and the fields as received (RFC 9112): anything a next
 * hop could read differently is refused with 400 before routing. */
static bool check_head(struct exchange *ex, const char *url, const char *version,
                       struct field_list *l)
{
    struct sc_error err = {0};
    size_t mlen = strlen(ex->method);
    struct http_head h = {ex->method, mlen, ex->target, strlen(ex->target),
                          version, strlen(version), l->v, l->n};

    /* MHD skips extra spaces and cuts the method at a NUL: exactly one byte
     * (the space it overwrote) lies between the method and the target. */
    if (url != ex->method + mlen + 1) {
        ex_refuse(ex, 400, OUT_REJECTED, R_MALFORMED_REQUEST,
                  "the request line is not \"method SP target SP version\"");
        return false;
    }
    if (l->head_size)
        widen_to_raw(l, ex->method, ex->method + l->head_size);
    if (has_fold(l)) {
        ex_refuse(ex, 400, OUT_REJECTED, R_MALFORMED_REQUEST, "obsolete line folding");
        return false;
    }
    if (http_head_check(&h, &err) != 0) {
        ex_refuse(ex, 400, OUT_REJECTED, R_MALFORMED_REQUEST, "%s", err.text);
        return false;
    }
    return true;
}

/* limits.max_header (431) and, by the announced length, max_body (413);
 * the fields passed check_head, so a Content-Length is digits only. */
/* A chunked body's chunk lines are checked as it arrives (on_body_data):
 * where in MHD's buffer they start. */
static void note_chunked(struct exchange *ex, const struct field_list *l)
{
    for (size_t i = 0; i < l->n && l->head_size; i++)
        if (strcasecmp(l->v[i].name, "Transfer-Encoding") == 0) {
            ex->chunked = true;
            ex->raw_body = ex->method + l->head_size;
            return;
        }
}

static bool check_limits(struct exchange *ex, const struct field_list *l)
{
    const struct sc_config *cfg = ex->cfg;
    size_t bytes = strlen(ex->method) + strlen(ex->target) + 12;
    unsigned long long cl = 0;

    for (size_t i = 0; i < l->n; i++) {
        bytes += l->v[i].name_len + l->v[i].value_len + 4;
        if (strcasecmp(l->v[i].name, "Content-Length") == 0)
            cl = strtoull(l->v[i].value, NULL, 10);
    }
    /* The head as received, whitespace MHD trimmed included. */
    if (l->head_size > bytes)
        bytes = l->head_size;
    if (bytes > cfg->limits.max_header) {
        ex_refuse(ex, 431, OUT_REJECTED, R_HEADERS_TOO_LARGE,
               "request headers of %zu bytes exceed limits.max_header (%llu)",
               bytes, (unsigned long long)cfg->limits.max_header);
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
    ex->up = ex->route->up;
    ex->pol = ex->route->pol;
    /* The request's facts the stages need, read from MHD once: the stages
     * see plain fields (and tests can set them). */
    ex->key = MHD_lookup_connection_value(ex->mc, MHD_HEADER_KIND, key_header(ex));
    if (ex->pol->partition_header)
        ex->partition = MHD_lookup_connection_value(ex->mc, MHD_HEADER_KIND,
                                                    ex->pol->partition_header);
    return true;
}

/* The fields sluice reads one value of (the key, the worker's attempt, the
 * enqueue time) come once: of two, sluice would act on the first while the
 * partner, which gets both, may read the other or a list of both. */
static bool check_single(struct exchange *ex, const struct field_list *l)
{
    const char *names[] = {key_header(ex), "Sluice-Attempt", "Sluice-Enqueued-At"};
    unsigned seen[sizeof names / sizeof *names] = {0};

    for (size_t i = 0; i < l->n; i++) {
        for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
            if (strcasecmp(l->v[i].name, names[k]) != 0)
                continue;
            if (seen[k]++) {
                ex_refuse(ex, 400, OUT_REJECTED, R_MALFORMED_REQUEST,
                          "more than one %s header", names[k]);
                return false;
            }
            break;
        }
    }
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

/* The answer decided: queued, unless the worker left meanwhile. */
static enum MHD_Result answer_ready(struct exchange *ex)
{
    if (ex->outcome == OUT_ABANDONED) {
        ex_set_answered(ex); /* logged and counted, nothing sent */
        return MHD_NO;
    }
    return answer(ex);
}

/* The body is in: the stages run. An answer they decide at once goes out
 * in this call; otherwise the connection stays suspended until one is
 * ready, whichever stage produces it, and MHD calls again. */
static enum MHD_Result forward(struct exchange *ex)
{
    ex_start(ex);
    if (ex->state == EX_READY && !ex->suspended)
        return answer_ready(ex);
    return MHD_YES;
}

/* ---- the MHD handler ---------------------------------------------------- */

/* A malformed request: answered, then the connection is closed, since
 * what follows on it cannot be trusted to start a request. */
static enum MHD_Result answer_malformed(struct exchange *ex)
{
    size_t len = 0;
    char *body = problem_json(ex->status, ex->reason, ex->detail, &len);
    struct MHD_Response *resp = json_response(body, len, "application/problem+json");

    if (resp)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    return queue(ex, resp);
}

static enum MHD_Result on_first_call(struct exchange *ex, const char *url,
                                     const char *version)
{
    struct http_field stack[FIELDS_ON_STACK];
    struct field_list l = {0};
    enum MHD_Result rc;

    if (!conn_head_done(ex->mc))
        return MHD_NO; /* too late: answered 408, the connection is closing */
#ifdef SLUICE_FAILALLOC
    failalloc_arm(atol(MHD_lookup_connection_value(ex->mc, MHD_HEADER_KIND,
                                                   "X-Sluice-Failalloc") ?: "0"));
#endif
    if (!ex->status && !ex->target)
        ex_refuse(ex, 500, OUT_REJECTED, R_INTERNAL, "out of memory");
    if (!ex->status && collect_fields(ex, stack, &l) != 0)
        ex_refuse(ex, 500, OUT_REJECTED, R_INTERNAL, "out of memory");
    if (!ex->status && check_head(ex, url, version, &l) &&
        check_limits(ex, &l) && check_route(ex) && check_single(ex, &l)) {
        note_chunked(ex, &l);
        ex_set_body(ex);
        rc = MHD_YES;
        goto out;
    }
    /* Refused before the body: answer now; MHD then closes the connection
     * rather than reading a body nobody wants. */
    conn_body_done(ex->mc);
    rc = ex->reason == R_MALFORMED_REQUEST ? answer_malformed(ex) : answer(ex);
out:
    if (l.v != stack)
        free(l.v);
    return rc;
}

/* The longest chunk line (extensions, size, line ends) sluice reads; a
 * longer one is refused (RFC 9112 7.1.1 asks servers to bound them). */
#define CHUNK_LINE_MAX 4096

/* The framing bytes [from, data) before a piece, as a chunk line. */
static int check_gap(const char *from, const char *data, bool crlf_optional,
                     struct sc_error *err)
{
    if ((size_t)(data - from) > CHUNK_LINE_MAX) {
        sc_error_set(err, "a chunk line longer than %d bytes", CHUNK_LINE_MAX);
        return -EINVAL;
    }
    return http_chunk_gap_check(from, (size_t)(data - from), crlf_optional, err);
}

/* MHD decodes the chunks itself, accepts any byte in a chunk extension,
 * and hands over only the data: the chunk line it skipped lies in its read
 * buffer just before a piece (libmicrohttpd 0.9.75). Each pass over that
 * buffer starts where the head ended (the buffer grows in place); within a
 * pass the pieces come in order with the framing between them. So the
 * bytes before a piece are those since the end of the one before it, when
 * that was in the same pass (same MHD run; they then begin with the CRLF
 * that ends its chunk), else those from the buffer's start. Only those
 * bytes are read, never past a piece. A line MHD reads at the very end of
 * a read, with no data after it, is overwritten by the next read before a
 * piece shows it: its extensions go unchecked. */
static int check_chunk_line(struct exchange *ex, const char *data, struct sc_error *err)
{
    int rc = -EPROTO;

    if (ex->raw_run == ex->loop->mhd_runs && data >= ex->raw_next)
        rc = check_gap(ex->raw_next, data, false, err);
    /* Not framing from there: this run began a new pass over the buffer. */
    if (rc == -EPROTO && data >= ex->raw_body)
        rc = check_gap(ex->raw_body, data, true, err);
    return rc;
}

static void on_body_data(struct exchange *ex, const char *data, size_t len)
{
    struct sc_error err = {0};

    if (ex->state != EX_BODY)
        return;
    if (ex->chunked) {
        if (check_chunk_line(ex, data, &err) == -EINVAL) {
            ex_refuse(ex, 400, OUT_REJECTED, R_MALFORMED_REQUEST, "%s", err.text);
            ex_set_refused(ex);
            return;
        }
        ex->raw_next = data + len;
        ex->raw_run = ex->loop->mhd_runs;
    }
    if (!ex->body && !(ex->body = evbuffer_new())) {
        ex_refuse(ex, 500, OUT_REJECTED, R_INTERNAL, "out of memory");
        ex_set_refused(ex);
        return;
    }
    if (evbuffer_get_length(ex->body) + len > ex->cfg->limits.max_body) {
        ex_refuse(ex, 413, OUT_REJECTED, R_BODY_TOO_LARGE,
               "request body exceeds limits.max_body (%llu)",
               (unsigned long long)ex->cfg->limits.max_body);
        ex_set_refused(ex);
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
    switch (ex->state) {
    case EX_HEADERS:
        ex->method = method;
        return on_first_call(ex, url, version);
    case EX_BODY:
    case EX_REFUSED:
        if (*upload_data_size) {
            on_body_data(ex, upload_data, *upload_data_size);
            *upload_data_size = 0;
            return MHD_YES;
        }
        conn_body_done(c);
        if (ex->state == EX_REFUSED || !read_attempt(ex))
            return ex->reason == R_MALFORMED_REQUEST ? answer_malformed(ex) : answer(ex);
        return forward(ex);
    case EX_READY:
        return answer_ready(ex);
    default:
        return MHD_NO;
    }
}

/* ---- completion --------------------------------------------------------- */

static void log_exchange(struct exchange *ex)
{
    struct access_entry e = {0};
    uint64_t now = clock_mono_ns();
    const struct up_request *u = &ex->ureq;

    e.route = ex->route ? ex->route->name : "none";
    e.policy = ex->route && ex->pol != &ex->cfg->default_policy ? ex->pol->name : "";
    e.method = ex->method ? ex->method : "-";
    e.target = ex->target ? ex->target : "";
    e.status = ex->status;
    e.outcome = outcome_name(ex->outcome);
    e.reason = reason_name(ex->reason);
    /* An instruction's attempt is what its body told the worker (attempts
     * so far, for answers that reached no upstream). */
    e.attempt = ex->kind == ANSWER_INSTRUCTION ? ex->instr.attempt
                : ex->attempt ? ex->attempt : 1;
    e.permit_wait_ms = (double)ex->permit_wait_ns / 1e6;
    e.shadow = shadow_name(ex->shadow);
    e.upstream_ms = u->done_ns > u->sent_ns ? (double)(u->done_ns - u->sent_ns) / 1e6 : 0;
    e.total_ms = (double)(now - ex->t0_ns) / 1e6;
    e.key = ex->key;
    /* Every line has one: a replay's own (its answer carries the stored
     * one), an abandoned request's too. */
    e.request_id = ex_request_id(ex);
    e.upstream_status = u->resp.status;
    e.bytes_in = ex->bytes_in;
    /* MHD sends no body with these, whatever the response holds. */
    e.bytes_out = ex_answer_bodiless(ex, ex->status) ? 0 : ex->bytes_out;
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
    if (ex->loop->statsd.fd >= 0) {
        char tags[200], route[160];
        statsd_tag_value(ex->route ? ex->route->name : "none", route, sizeof route);
        snprintf(tags, sizeof tags, "route:%s", route);
        statsd_timing(&ex->loop->statsd, "queue_age", (at > 0 ? at : 0) * 1000, tags);
    }
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

void ex_record_upstream(const struct exchange *ex)
{
#ifndef SLUICE_METRICS_OFF /* a benchmark-only build, to price the metrics */
    struct metrics_shard *sh = &ex->loop->app->metrics.shards[ex->loop->idx];
    const struct metrics_ids *ids = &ex->rt->ids;
    const struct up_request *u = &ex->ureq;
    size_t up = ex->route->upstream;

    if (!u->done_ns || !u->sent_ns)
        return;
    metrics_add(sh, ids->up_codes[up * UC__COUNT +
                                  up_code_of(&u->resp)], 1);
    metrics_observe(sh, H_DURATION, ids->up_duration[up],
                    (double)(u->done_ns - u->sent_ns) / 1e9);
#else
    (void)ex;
#endif
}

/* StatsD timings, when it is on: the same figures as the histograms. */
static void record_statsd(const struct exchange *ex, size_t r, double total_s)
{
    struct statsd *sd = &ex->loop->statsd;
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
    struct app *app = ex->loop->app;
    struct metrics_shard *sh = &app->metrics.shards[ex->loop->idx];
    const struct metrics_ids *ids = &ex->rt->ids;
    size_t r = ex->route ? (size_t)(ex->route - ex->cfg->routes) : ids->n_routes;
    size_t p = ex->route && ex->route->policy >= 0 ? (size_t)ex->route->policy
                                                   : ids->n_policies;

    double total_s = (double)(clock_mono_ns() - ex->t0_ns) / 1e9;

    metrics_add(sh, ids->requests[(r * OUT__COUNT + ex->outcome) * R__COUNT + ex->reason], 1);
    metrics_observe(sh, H_DURATION, ids->req_duration[r * OUT__COUNT + ex->outcome], total_s);
    record_statsd(ex, r, total_s);
    record_queue_age(ex, sh, ids, r);
    if (!ex->route)
        return;
    if (ex->shadow == SHADOW_RATE_LIMITED)
        metrics_add(sh, ids->shadow[r], 1);
    if (ex->got_slot || ex->ureq.sent_ns)
        metrics_observe(sh, H_PERMIT_WAIT, ids->permit_wait[p],
                        (double)ex->permit_wait_ns / 1e9);
    if (ex->kind == ANSWER_INSTRUCTION && ex->outcome == OUT_REQUEUE)
        metrics_observe(sh, H_REQUEUE_DELAY, ids->requeue_delay[p * R__COUNT + ex->reason],
                        (double)ex->instr.delay_ms / 1000.0);
}

void exchange_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                        enum MHD_RequestTerminationCode toe)
{
    struct exchange *ex = *con_cls;

    conn_request_ended(c);
    if (!ex)
        return;
    /* An abandoned request may be closed by MHD before it calls back. */
    if (ex->state == EX_ANSWERED || ex->outcome == OUT_ABANDONED) {
#ifndef SLUICE_METRICS_OFF /* a benchmark-only build, to price the metrics */
        record_metrics(ex);
#endif
        if (ex->cfg->log.access)
            log_exchange(ex);
    }
    exchange_free(ex);
    *con_cls = NULL;
#ifdef SLUICE_FAILALLOC
    if (failalloc_fired())
        log_warn("failalloc: the armed allocation failed during this request");
    failalloc_arm(0);
#endif
}
