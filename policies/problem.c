#include "policies/problem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/json_escape.h"


static const char *const outcome_names[OUT__COUNT] = {
    "ok", "permanent_error", "replayed", "requeue", "dead_letter", "rejected",
    "abandoned",
};

static const char *const reason_names[R__COUNT] = {
    "none", "no_route", "body_too_large", "headers_too_large",
    "malformed_request", "key_reused", "upstream_429", "upstream_5xx", "connect_error",
    "connection_lost", "timeout", "rate_limited", "upstream_cooldown",
    "lease_held", "store_unavailable", "delay_exceeds_max", "client_closed",
    "internal_error",
};

const char *outcome_name(enum outcome o)
{
    return (unsigned)o < OUT__COUNT ? outcome_names[o] : "unknown";
}

const char *reason_name(enum reason r)
{
    return (unsigned)r < R__COUNT ? reason_names[r] : "unknown";
}

/* Which reasons each outcome is given with (docs/contract.md §4), as bits
 * of enum reason. Kept beside the names: a new reason or a new use of one
 * adds its bit here, or its series only appears at its first event. */
#define RB(r) (1u << (r))
#define TRANSPORT (RB(R_CONNECT_ERROR) | RB(R_CONNECTION_LOST) | RB(R_TIMEOUT))
#define UPSTREAM_FAILURES (RB(R_UPSTREAM_429) | RB(R_UPSTREAM_5XX) | TRANSPORT)

static const unsigned outcome_reasons[OUT__COUNT] = {
    [OUT_OK] = RB(R_NONE),
    [OUT_REPLAYED] = RB(R_NONE),
    /* a refused status passes through (none); a transport failure left out
     * of retry.on is a 502/504 */
    [OUT_PERMANENT_ERROR] = RB(R_NONE) | TRANSPORT,
    [OUT_REQUEUE] = UPSTREAM_FAILURES | RB(R_RATE_LIMITED) | RB(R_UPSTREAM_COOLDOWN) |
                    RB(R_LEASE_HELD) | RB(R_STORE_UNAVAILABLE),
    [OUT_DEAD_LETTER] = UPSTREAM_FAILURES | RB(R_DELAY_EXCEEDS_MAX),
    /* timeout: the 408 of limits.header_timeout */
    [OUT_REJECTED] = RB(R_NO_ROUTE) | RB(R_BODY_TOO_LARGE) | RB(R_HEADERS_TOO_LARGE) |
                     RB(R_MALFORMED_REQUEST) | RB(R_KEY_REUSED) | RB(R_TIMEOUT) |
                     RB(R_INTERNAL),
    [OUT_ABANDONED] = RB(R_CLIENT_CLOSED),
};

bool outcome_reason_known(enum outcome o, enum reason r)
{
    return (unsigned)o < OUT__COUNT && (unsigned)r < R__COUNT &&
           (outcome_reasons[o] & RB(r));
}

const char *http_status_text(int status)
{
    switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 413: return "Content Too Large";
    case 422: return "Unprocessable Content";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
    }
}

char *problem_json(int status, enum reason r, const char *detail, size_t *len)
{
    size_t cap = 256 + 2 * strlen(detail) * 3, pos = 0;
    char *buf = malloc(cap);
    int n;

    if (!buf)
        return NULL;
    n = snprintf(buf, cap,
                 "{\"type\":\"about:blank\",\"title\":\"%s\",\"status\":%d,"
                 "\"reason\":\"%s\",\"detail\":",
                 http_status_text(status), status, reason_name(r));
    pos = (size_t)n;
    json_escape_append(buf, cap, &pos, detail, strlen(detail));
    if (pos + 2 < cap) {
        buf[pos++] = '}';
        buf[pos] = '\0';
    }
    if (len)
        *len = pos;
    return buf;
}
