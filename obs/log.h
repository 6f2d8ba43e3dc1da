/* Logging: one JSON object per line on stderr, so operational messages and
 * the access log (docs/contract.md §9) go through the same pipeline. Each line is
 * written with one write(2), so lines from different threads never mix. */
#ifndef SLUICE_OBS_LOG_H
#define SLUICE_OBS_LOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"

void log_set_level(enum sc_log_level level);
bool log_enabled(enum sc_log_level level);

void log_msg(enum sc_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define log_error(...) log_msg(SC_LOG_ERROR, __VA_ARGS__)
#define log_warn(...) log_msg(SC_LOG_WARN, __VA_ARGS__)
#define log_info(...) log_msg(SC_LOG_INFO, __VA_ARGS__)
#define log_debug(...) log_msg(SC_LOG_DEBUG, __VA_ARGS__)

struct access_entry {
    const char *route;      /* "none" when no route matched */
    const char *policy;     /* "" when none */
    const char *method;
    const char *target;     /* raw target; the query is cut off when logged */
    int status;
    const char *outcome;
    const char *reason;     /* "none" when there is none */
    unsigned attempt;
    double permit_wait_ms, upstream_ms, total_ms;
    const char *key;        /* idempotency key or NULL; only a hash is logged */
    const char *shadow;     /* shadow mode: what enforce would have done */
    const char *request_id; /* X-Request-Id, as echoed; NULL when none */
    int upstream_status;    /* the upstream's status line; 0: none received */
    uint64_t bytes_in;      /* request body bytes read from the worker */
    uint64_t bytes_out;     /* response body bytes given to the worker */
    const char *lane;       /* the request's lane; "" for a policy without */
};

void log_access(const struct access_entry *e);

/* One lookup of a verification (docs/contract.md §11): a line of its own, with
 * "type": "lookup" and "verify": true, beside the requests' lines (the caller
 * writes it when log.access is on, as for those). Its path is the configured
 * one, `{key}` unreplaced and without the query: the line never holds the
 * key, only its hash. */
struct lookup_entry {
    const char *request_id; /* the lookup's own X-Request-Id */
    const char *policy;
    const char *upstream;
    const char *method;     /* GET or HEAD */
    const char *base_path;  /* the upstream's, "" when none */
    const char *path;       /* verify.path as configured */
    int upstream_status;    /* 0: no response (null in the line) */
    const char *result;     /* found, absent or other (verify_class_name) */
    double permit_wait_ms, upstream_ms;
    const char *key;        /* the idempotency key; only its hash is logged */
};

void log_lookup(const struct lookup_entry *e);

#endif
