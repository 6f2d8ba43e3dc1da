/* The upstream's answer on its way to the worker. A body that is all here
 * when the answer is queued goes out from memory; any other is passed on as
 * it arrives: MHD pulls it through a content reader, which suspends the
 * connection while the upstream has nothing new, and the upstream client
 * stops reading while UP_STREAM_HOLD bytes wait. So a response of any size
 * costs a bounded amount of memory per connection, and a worker sees the
 * first bytes of a long answer without waiting for the last. */
#include <string.h>
#include <strings.h>

#include <event2/buffer.h>

#include "proxy/server/mhd_internal.h"

/* Above this, or spread over more chains, a whole body goes through the
 * reader too: one iovec response per small answer is the cheap path, and
 * libmicrohttpd 0.9.75 aborts when destroying iovec responses of many MiB. */
#define WHOLE_MAX_CHAINS 16
/* What MHD asks the reader for at a time. */
#define READ_BLOCK ((size_t)32 * 1024)

static void add_upstream_headers(struct MHD_Response *resp,
                                 const struct up_response *ur)
{
    const struct up_header *keep[UP_MAX_HEADERS];
    size_t n = up_response_end_to_end(ur, keep);

    /* The request's own id is echoed instead (exchange.c, queue). */
    for (size_t i = 0; i < n; i++)
        if (strcasecmp(keep[i]->name, EX_REQUEST_ID_HEADER) != 0)
            MHD_add_response_header(resp, keep[i]->name, keep[i]->value);
}

static void free_evbuffer(void *cls)
{
    evbuffer_free(cls);
}

/* A small whole body goes out from the evbuffer's own chains (no copy); the
 * response takes the evbuffer. NULL when it is not small or on failure. */
static struct MHD_Response *response_whole(struct up_response *ur)
{
    struct evbuffer_iovec v[WHOLE_MAX_CHAINS];
    struct MHD_IoVec m[WHOLE_MAX_CHAINS];
    struct MHD_Response *resp;
    int n;

    if (evbuffer_get_length(ur->body) > EX_WHOLE_MAX_BYTES)
        return NULL;
    n = evbuffer_peek(ur->body, -1, NULL, v, WHOLE_MAX_CHAINS);
    if (n > WHOLE_MAX_CHAINS)
        return NULL;
    for (int i = 0; i < n; i++) {
        m[i].iov_base = v[i].iov_base;
        m[i].iov_len = v[i].iov_len;
    }
    /* MHD copies the vector itself, not the data. */
    resp = MHD_create_response_from_iovec(m, (unsigned)n, free_evbuffer,
                                          ur->body);
    if (resp)
        ur->body = NULL;
    return resp;
}

/* MHD_ContentReaderCallback: what the upstream brought so far. */
static ssize_t read_body(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct exchange *ex = cls;
    struct evbuffer *body = ex->ureq.resp.body;
    int n;

    if (evbuffer_get_length(body) > 0) {
        n = evbuffer_remove(body, buf, max);
        if (n < 0)
            return MHD_CONTENT_READER_END_WITH_ERROR;
        ex->bytes_out += (uint64_t)n;
        up_request_read_more(&ex->ureq);
        return n;
    }
    if (ex->up_done)
        return ex->ureq.resp.result == UP_OK ? MHD_CONTENT_READER_END_OF_STREAM
                                             : MHD_CONTENT_READER_END_WITH_ERROR;
    /* Nothing yet: MHD would call again at once; sleep until the upstream
     * brings more. */
    ex_reader_wait(ex);
    return 0;
}

/* The length the worker is promised: the upstream's own Content-Length when
 * it framed the body with one (a body cut short is then visible as such),
 * else unknown (chunked to HTTP/1.1 workers). */
static uint64_t promised_length(const struct exchange *ex)
{
    uint64_t n;

    return up_response_length(&ex->ureq.resp, &n) ? n : MHD_SIZE_UNKNOWN;
}

bool mhd_answer_bodiless(const struct exchange *ex, int status)
{
    return up_status_bodiless(status) || (ex->method && strcmp(ex->method, "HEAD") == 0);
}

/* No body follows the head (RFC 9112 6.3), so MHD must frame none. It sends
 * no framing header for a 204, and for a known total it writes that total as
 * Content-Length, the upstream's own value, with no body after it. What it
 * must not do is choose chunked: libmicrohttpd 0.9.75 then writes a last
 * chunk ("0\r\n\r\n") after a HEAD or 304 head, five bytes that a
 * kept-alive worker reads as the start of its next response. Its flag for
 * HTTP/1.0-compatible answers keeps it from chunking; an answer with neither
 * length nor chunks then ends the connection, as HTTP says it must. The
 * upstream's chunked coding is not announced (nothing is sent in it); a
 * Content-Length of 0, which the worker would read as the length of the
 * resource, is never made up. */
struct MHD_Response *mhd_bodiless_response(int status, bool has_length, uint64_t length,
                                          MHD_ContentReaderCallback reader, void *cls)
{
    struct MHD_Response *resp;

    /* A 204 has no framing header at all (MHD drops them): any size will do. */
    if (status == 204)
        has_length = true;
    resp = MHD_create_response_from_callback(has_length ? length : MHD_SIZE_UNKNOWN,
                                             READ_BLOCK, reader, cls, NULL);
    if (resp && !has_length)
        MHD_set_response_options(resp, MHD_RF_HTTP_1_0_COMPATIBLE_STRICT, MHD_RO_END);
    return resp;
}

struct MHD_Response *mhd_stream_response(struct exchange *ex)
{
    struct up_response *ur = &ex->ureq.resp;
    struct MHD_Response *resp = NULL;
    uint64_t n;

    if (mhd_answer_bodiless(ex, ur->status)) {
        /* MHD never calls the reader here: no body is sent. */
        bool has = up_response_length(ur, &n);
        resp = mhd_bodiless_response(ur->status, has, has ? n : 0, read_body, ex);
    } else if (ex->up_done && ur->result == UP_OK) {
        size_t whole = evbuffer_get_length(ur->body);

        if ((resp = response_whole(ur)))
            ex->bytes_out = whole;
    }
    if (!resp)
        resp = MHD_create_response_from_callback(promised_length(ex), READ_BLOCK,
                                                 read_body, ex, NULL);
    if (resp)
        add_upstream_headers(resp, ur);
    return resp;
}
