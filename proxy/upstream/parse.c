#include "proxy/upstream/parse.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "policies/headers.h"

/* ---- responses ---------------------------------------------------------- */

/* A header's value offset before its first value byte. */
#define NO_VALUE UINT32_MAX

void up_response_clear(struct up_response *resp)
{
    free(resp->headers);
    free(resp->arena);
    if (resp->body)
        evbuffer_free(resp->body);
    memset(resp, 0, sizeof *resp);
}

const char *up_response_header(const struct up_response *resp,
                               const char *name)
{
    for (size_t i = 0; i < resp->n_headers; i++)
        if (strcasecmp(resp->headers[i].name, name) == 0)
            return resp->headers[i].value;
    return NULL;
}

bool up_response_length(const struct up_response *resp, uint64_t *len)
{
    const char *cl = up_response_header(resp, "Content-Length");
    char *end;

    if (!cl || *cl < '0' || *cl > '9' ||
        up_response_header(resp, "Transfer-Encoding"))
        return false;
    *len = strtoull(cl, &end, 10);
    return *end == '\0';
}

size_t up_response_end_to_end(const struct up_response *resp,
                              const struct up_header **keep)
{
    struct hdr_conn_tokens tok = {0};
    size_t n = 0;

    for (size_t i = 0; i < resp->n_headers; i++)
        if (strcasecmp(resp->headers[i].name, "Connection") == 0)
            hdr_conn_tokens_add(&tok, resp->headers[i].value);
    for (size_t i = 0; i < resp->n_headers; i++) {
        const struct up_header *h = &resp->headers[i];

        /* Sluice-* is sluice's own namespace toward the worker. */
        if (!hdr_skip_response(h->name, &tok) && strncasecmp(h->name, "Sluice-", 7))
            keep[n++] = h;
    }
    return n;
}

/* Interim 1xx heads are forgotten when the final head comes. */
static void response_reset_headers(struct up_response *resp)
{
    resp->n_headers = 0;
    resp->arena_len = 0;
}

/* Appends a string to the arena, NUL-terminated; with cont, it continues
 * the last one (a name or value split across reads is always the last
 * thing appended: http-parser reports a head in order). The arena is
 * bounded by UP_MAX_HEAD_BYTES, which counts more than the NULs take. */
static int arena_append(struct up_response *r, const char *at, size_t len,
                        bool cont)
{
    size_t start = cont && r->arena_len ? r->arena_len - 1 : r->arena_len;

    if (start + len + 1 > r->arena_cap) {
        size_t cap = r->arena_cap ? r->arena_cap : 512;
        char *n;

        while (cap < start + len + 1)
            cap *= 2;
        if (!(n = realloc(r->arena, cap)))
            return -ENOMEM;
        r->arena = n;
        r->arena_cap = cap;
    }
    memcpy(r->arena + start, at, len);
    r->arena[start + len] = '\0';
    r->arena_len = start + len + 1;
    return 0;
}

/* ---- parser callbacks --------------------------------------------------- */

/* A head the worker's connection could not hold: refused whole, so the
 * worker gets a complete error rather than an empty close. */
static int head_too_big(struct up_parse *ps)
{
    ps->req->resp.head_too_big = true;
    return 1;
}

static int on_header_field(http_parser *p, const char *at, size_t len)
{
    struct up_parse *ps = p->data;
    struct up_response *r = &ps->req->resp;

    /* Trailer fields of a chunked body come after the head was taken (and
     * perhaps passed on): they are not the response's headers. Dropped. */
    if (ps->head)
        return 0;
    ps->header_bytes += len;
    if (ps->header_bytes > UP_MAX_HEAD_BYTES)
        return head_too_big(ps);
    if (ps->in_value || r->n_headers == 0) {
        if (r->n_headers == UP_MAX_HEADERS)
            return head_too_big(ps);
        if (r->n_headers == r->cap_headers) {
            size_t cap = r->cap_headers ? r->cap_headers * 2 : 16;
            struct up_header *h = realloc(r->headers, cap * sizeof *h);
            if (!h)
                return 1;
            r->headers = h;
            r->cap_headers = cap;
        }
        r->headers[r->n_headers].name = NULL;
        r->headers[r->n_headers].value = NULL;
        r->headers[r->n_headers].name_at = (uint32_t)r->arena_len;
        r->headers[r->n_headers].value_at = NO_VALUE;
        r->n_headers++;
        ps->header_bytes += 4; /* ": " and CRLF, as the worker will get it */
        ps->in_value = false;
        return arena_append(r, at, len, false) ? 1 : 0;
    }
    return arena_append(r, at, len, true) ? 1 : 0;
}

static int on_header_value(http_parser *p, const char *at, size_t len)
{
    struct up_parse *ps = p->data;
    struct up_response *r = &ps->req->resp;

    if (ps->head)
        return 0; /* a trailer's */
    ps->header_bytes += len;
    if (ps->header_bytes > UP_MAX_HEAD_BYTES)
        return head_too_big(ps);
    if (r->n_headers == 0)
        return 1;
    /* A value goes into the worker's response head as it is: a CR, LF or
     * NUL in it (obsolete folding included) would split or cut that head.
     * The response is broken. */
    if (memchr(at, '\r', len) || memchr(at, '\n', len) || memchr(at, '\0', len))
        return 1;
    ps->in_value = true;
    if (r->headers[r->n_headers - 1].value_at == NO_VALUE) {
        r->headers[r->n_headers - 1].value_at = (uint32_t)r->arena_len;
        return arena_append(r, at, len, false) ? 1 : 0;
    }
    return arena_append(r, at, len, true) ? 1 : 0;
}

/* Header fields whose name is not an RFC 9110 token are dropped, as nginx
 * drops them (ignore_invalid_headers): passed on, they would break the
 * worker's response head; refusing the response for them would fail a job
 * whose side effect happened. */
static void drop_invalid_names(struct up_response *r)
{
    size_t kept = 0;

    for (size_t i = 0; i < r->n_headers; i++)
        if (hdr_valid_name(r->headers[i].name))
            r->headers[kept++] = r->headers[i];
    r->n_headers = kept;
}

/* The fields point into the arena as it is now (it may move while a head
 * is parsed); a field still without a value has an empty one. */
static void point_into_arena(struct up_response *r)
{
    static char empty[1];

    for (size_t i = 0; i < r->n_headers; i++) {
        struct up_header *h = &r->headers[i];

        h->name = r->arena + h->name_at;
        h->value = h->value_at == NO_VALUE ? empty : r->arena + h->value_at;
    }
}

static int on_headers_complete(http_parser *p)
{
    struct up_parse *ps = p->data;
    struct up_response *r = &ps->req->resp;

    point_into_arena(r); /* the head is whole: the arena stops moving */
    drop_invalid_names(r);
    /* Only a proxy asks for proxy credentials: the request stopped there. */
    if (ps->via_proxy && p->status_code == 407) {
        ps->proxy_refused = true;
        return -1;
    }
    /* A status is three digits (RFC 9110 15): http-parser takes "20" too,
     * which no worker's client could read. A broken response. */
    if (p->status_code < 100 || p->status_code > 999)
        return -1;
    r->status = (int)p->status_code;
    /* We never ask for an upgrade: a 101 would hand the worker a connection
     * that no longer speaks HTTP. It is a broken response. */
    if (p->status_code == 101)
        return -1;
    /* RFC 9112 6.3: an answer to HEAD, a 1xx, a 204 and a 304 end at their
     * head whatever Content-Length or Transfer-Encoding say (a 304 carries
     * the length a 200 would have); http-parser would wait for that body
     * unless told there is none (1: skip it). */
    if (p->status_code < 200)
        return 1;
    ps->head = true;
    return ps->req->no_body || up_status_bodiless(r->status) ? 1 : 0;
}

static int on_body(http_parser *p, const char *at, size_t len)
{
    struct up_parse *ps = p->data;
    struct up_request *req = ps->req;

    if (req->discard)
        return 0;
    /* A streamed body is bounded by pausing the reads (parse_input); one
     * held whole is bounded here. */
    if (!req->hold_max &&
        evbuffer_get_length(req->resp.body) + len > UP_MAX_BODY_BYTES)
        return 1;
    return evbuffer_add(req->resp.body, at, len) ? 1 : 0;
}

static int on_message_complete(http_parser *p)
{
    struct up_parse *ps = p->data;
    struct up_response *r = &ps->req->resp;

    /* Interim 1xx answers are not the response: forget them and go on. */
    if (r->status >= 100 && r->status < 200 && r->status != 101) {
        response_reset_headers(r);
        r->status = 0;
        ps->in_value = false;
        ps->header_bytes = 0;
        return 0;
    }
    ps->complete = true;
    http_parser_pause(p, 1);
    return 0;
}

static const http_parser_settings parser_settings = {
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

void up_parse_start(struct up_parse *ps, struct up_request *req, bool via_proxy)
{
    memset(ps, 0, sizeof *ps);
    ps->req = req;
    ps->via_proxy = via_proxy;
    http_parser_init(&ps->parser, HTTP_RESPONSE);
    ps->parser.data = ps;
}

size_t up_parse_feed(struct up_parse *ps, const char *at, size_t len)
{
    size_t n = http_parser_execute(&ps->parser, &parser_settings, at, len);

    /* A head cut short (a failure, a timeout, more to come) still has
     * readable fields. */
    if (!ps->head)
        point_into_arena(&ps->req->resp);
    return n;
}

void up_parse_eof(struct up_parse *ps)
{
    http_parser_execute(&ps->parser, &parser_settings, NULL, 0);
}

bool up_parse_failed(const struct up_parse *ps)
{
    return !ps->complete && HTTP_PARSER_ERRNO(&ps->parser) != HPE_OK;
}

const char *up_parse_error(const struct up_parse *ps)
{
    return http_errno_description(HTTP_PARSER_ERRNO(&ps->parser));
}

bool up_parse_keep_alive(const struct up_parse *ps)
{
    return http_should_keep_alive(&ps->parser);
}
