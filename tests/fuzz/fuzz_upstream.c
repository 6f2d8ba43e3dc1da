/* The upstream response parser (proxy/upstream_parse.h) on arbitrary bytes
 * from an upstream, fed in reads as a connection would. The first byte
 * chooses the request's side: bit 0 a HEAD (no body), bit 1 the body
 * discarded, bit 2 streamed (hold_max), bit 3 plain http through a proxy;
 * its high nibble the size of each read (1 to 16 times 61 bytes, so heads
 * and bodies split at every kind of place). The rest is the response.
 *
 * A response that completes, or fails, must leave what the worker side
 * relies on: a final status (200-999, never 101 or 1xx), header names that
 * are tokens and values without CR, LF or NUL (they go into the worker's
 * response head as they are: anything else would split it), the head
 * within UP_MAX_HEAD_BYTES and UP_MAX_HEADERS, no body for a HEAD, a 204,
 * a 304 or a discarded one (whatever their framing headers say), a body of exactly its Content-Length when it announced
 * one, and end-to-end headers without hop-by-hop or Sluice-* ones. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <event2/buffer.h>

#include "fuzz_check.h"
#include "policies/headers.h"
#include "proxy/upstream/parse.h"

static void check_header(const struct up_header *h)
{
    FUZZ_CHECK(h->name && h->value, "a header without a name or value");
    FUZZ_CHECK(hdr_valid_name(h->name), "name \"%s\" is not a token", h->name);
    FUZZ_CHECK(!strpbrk(h->value, "\r\n"), "CR or LF in the value of %s", h->name);
}

static void check_head(const struct up_response *r)
{
    size_t bytes = 0;

    FUZZ_CHECK(r->status >= 200 && r->status <= 999, "final status %d", r->status);
    FUZZ_CHECK(r->n_headers <= UP_MAX_HEADERS, "%zu headers", r->n_headers);
    for (size_t i = 0; i < r->n_headers; i++) {
        check_header(&r->headers[i]);
        bytes += strlen(r->headers[i].name) + strlen(r->headers[i].value) + 4;
    }
    FUZZ_CHECK(bytes <= UP_MAX_HEAD_BYTES, "a head of %zu bytes was kept", bytes);
}

static void check_end_to_end(const struct up_response *r)
{
    const struct up_header *keep[UP_MAX_HEADERS];
    size_t n = up_response_end_to_end(r, keep);

    FUZZ_CHECK(n <= r->n_headers, "%zu end-to-end of %zu", n, r->n_headers);
    for (size_t i = 0; i < n; i++) {
        FUZZ_CHECK(strncasecmp(keep[i]->name, "Sluice-", 7) != 0 &&
                       strcasecmp(keep[i]->name, "Content-Length") != 0 &&
                       strcasecmp(keep[i]->name, "Connection") != 0 &&
                       strcasecmp(keep[i]->name, "Transfer-Encoding") != 0,
                   "%s passed to the worker", keep[i]->name);
    }
}

static void check_complete(const struct up_request *req)
{
    const struct up_response *r = &req->resp;
    size_t body = evbuffer_get_length(r->body);
    uint64_t cl;

    check_head(r);
    check_end_to_end(r);
    if (req->no_body || req->discard || up_status_bodiless(r->status))
        FUZZ_CHECK(body == 0, "%zu body bytes kept", body);
    else if (up_response_length(r, &cl))
        FUZZ_CHECK(body == cl, "a body of %zu bytes for a Content-Length of %llu", body,
                   (unsigned long long)cl);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct up_request req = {0};
    struct up_parse ps;
    size_t off = 1, step;

    if (size < 1 || !(req.resp.body = evbuffer_new()))
        return 0;
    req.no_body = data[0] & 1;
    req.discard = data[0] & 2;
    req.hold_max = data[0] & 4 ? 65536 : 0;
    step = 61 * (size_t)((data[0] >> 4) + 1);
    up_parse_start(&ps, &req, data[0] & 8);
    /* As parse_input: a read is consumed whole unless the response ended
     * in it; an error ends the connection. */
    while (off < size && !ps.complete && !up_parse_failed(&ps)) {
        size_t len = size - off < step ? size - off : step;
        size_t n = up_parse_feed(&ps, (const char *)data + off, len);

        FUZZ_CHECK(n <= len, "%zu of %zu bytes consumed", n, len);
        off += ps.complete ? n : len;
    }
    if (!ps.complete && !up_parse_failed(&ps))
        up_parse_eof(&ps);
    if (ps.complete)
        check_complete(&req);
    else if (ps.proxy_refused)
        FUZZ_CHECK(ps.via_proxy, "a 407 taken for the proxy's without one");
    if (req.resp.head_too_big)
        FUZZ_CHECK(!ps.complete, "a head too big completed");
    up_response_clear(&req.resp);
    return 0;
}
