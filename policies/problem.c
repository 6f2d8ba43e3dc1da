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
