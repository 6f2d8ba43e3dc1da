/* Header rules of docs/contract.md §3: hop-by-hop headers are dropped both ways
 * (Connection and the tokens it names, Keep-Alive, Proxy-*, TE, Trailer,
 * Transfer-Encoding, Upgrade); request headers starting with "Sluice-" stay
 * with sluice; Host is always rewritten. */
#ifndef SLUICE_POLICIES_HEADERS_H
#define SLUICE_POLICIES_HEADERS_H

#include <stdbool.h>
#include <stddef.h>

#define HDR_MAX_CONN_TOKENS 16

/* The header names a Connection header lists, which are hop-by-hop too.
 * Names point into the parsed value's copy held in `buf`. */
struct hdr_conn_tokens {
    char buf[256];
    const char *name[HDR_MAX_CONN_TOKENS];
    size_t n;
};

/* Adds the comma-separated tokens of one Connection header value. Tokens
 * beyond the capacity are ignored (they are then forwarded: an attacker
 * gains nothing, since the fixed hop-by-hop set is always dropped). */
void hdr_conn_tokens_add(struct hdr_conn_tokens *t, const char *value);

/* True for the fixed hop-by-hop set and any name listed in t (may be NULL). */
bool hdr_is_hop_by_hop(const char *name, const struct hdr_conn_tokens *t);

/* True when a worker's request header must not go upstream: hop-by-hop,
 * Host, Content-Length (recomputed), or a Sluice-* header. */
bool hdr_skip_request(const char *name, const struct hdr_conn_tokens *t);

/* True when an upstream response header must not go back to the worker:
 * hop-by-hop or Content-Length (the server sets its own). */
bool hdr_skip_response(const char *name, const struct hdr_conn_tokens *t);

/* A header name is an RFC 9110 token; values have no CR, LF or NUL. */
bool hdr_valid_name(const char *name);
bool hdr_valid_value(const char *value);

#endif
