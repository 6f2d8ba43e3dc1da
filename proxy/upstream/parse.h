/* The upstream response parser: http-parser's callbacks filling a request's
 * up_response (status, headers, body) within what the worker's side can
 * hold: a head of at most UP_MAX_HEAD_BYTES and UP_MAX_HEADERS fields, and
 * a body held whole (not streamed) of at most UP_MAX_BODY_BYTES. Interim
 * 1xx answers are skipped; a 101 (sluice never asks for an upgrade) is a
 * broken response. No I/O: the connection feeds it what it reads, and the
 * fuzz target feeds it bytes (tests/fuzz/fuzz_upstream.c). Internal to the
 * upstream client. */
#ifndef SLUICE_PROXY_UPSTREAM_PARSE_H
#define SLUICE_PROXY_UPSTREAM_PARSE_H

#include <stdbool.h>
#include <stddef.h>

#include <http_parser.h>

#include "proxy/upstream/upstream.h"

/* Upper bound on what an upstream may make us hold for one response body
 * that is not streamed. */
#define UP_MAX_BODY_BYTES ((size_t)256 * 1024 * 1024)
/* One read from a plain upstream socket: a small response, head and body,
 * in one recv. */
#define UP_READ_BYTES ((size_t)16 * 1024)

struct up_parse {
    http_parser parser;
    struct up_request *req; /* its resp is filled; no_body, discard and
                             * hold_max are read as they are at each call */
    size_t header_bytes;    /* the head as the worker will get it */
    bool in_value;          /* the last callback was a value */
    bool head;              /* the final response head was parsed */
    bool complete;          /* a final response was parsed; parsing stopped */
    bool via_proxy;         /* plain http through a proxy: 407 is the proxy's */
    bool proxy_refused;     /* ... and it answered 407 */
};

/* Ready for the response to req (its resp.body an evbuffer). */
void up_parse_start(struct up_parse *ps, struct up_request *req, bool via_proxy);
/* Parses what arrived; returns the bytes consumed, which is less than len
 * once the response is complete (what follows is not this response's) or
 * on an error. */
size_t up_parse_feed(struct up_parse *ps, const char *at, size_t len);
/* The connection ended: completes a body delimited by the close. */
void up_parse_eof(struct up_parse *ps);
/* True when the bytes are not a response we can pass on (resp.head_too_big
 * or proxy_refused tell two of the causes). */
bool up_parse_failed(const struct up_parse *ps);
const char *up_parse_error(const struct up_parse *ps);
/* The response lets the connection carry another request. */
bool up_parse_keep_alive(const struct up_parse *ps);

#endif
