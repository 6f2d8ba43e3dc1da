/* What sluice tells the worker: the Sluice-Outcome values and reasons of
 * docs/contract.md §4, and RFC 9457 problem+json bodies for sluice's own refusals. */
#ifndef SLUICE_POLICIES_PROBLEM_H
#define SLUICE_POLICIES_PROBLEM_H

#include <stdbool.h>
#include <stddef.h>

enum outcome {
    OUT_OK = 0,
    OUT_PERMANENT_ERROR,
    OUT_REPLAYED,
    OUT_REQUEUE,
    OUT_DEAD_LETTER,
    OUT_REJECTED,
    OUT_ABANDONED,      /* the worker left while its request waited: no answer */
    OUT__COUNT
};

/* Fixed set: reasons are metric labels, so nothing here comes from input. */
enum reason {
    R_NONE = 0,
    /* rejected */
    R_NO_ROUTE,
    R_BODY_TOO_LARGE,
    R_HEADERS_TOO_LARGE,
    R_MALFORMED_REQUEST,
    R_KEY_REUSED,       /* 422: the key came with another method, path or body */
    /* upstream failures */
    R_UPSTREAM_429,
    R_UPSTREAM_5XX,
    R_CONNECT_ERROR,
    R_CONNECTION_LOST,
    R_TIMEOUT,
    /* decided by sluice */
    R_RATE_LIMITED,
    R_UPSTREAM_COOLDOWN,
    R_LEASE_HELD,
    R_STORE_UNAVAILABLE,
    R_DELAY_EXCEEDS_MAX,
    R_CLIENT_CLOSED,    /* abandoned: logged as status 499, as nginx does */
    R_INTERNAL,         /* sluice itself failed (out of memory): 500 */
    R__COUNT
};

const char *outcome_name(enum outcome o);
const char *reason_name(enum reason r);

/* True when sluice can answer with this outcome for this reason: the label
 * pairs /metrics lists at zero, so alert rules see a series before its
 * first event. */
bool outcome_reason_known(enum outcome o, enum reason r);

/* Builds an application/problem+json body (owned, free()): type about:blank,
 * title from the status, the detail text, and a "reason" member. *len gets
 * its length. NULL on allocation failure. */
char *problem_json(int status, enum reason r, const char *detail, size_t *len);

/* The standard reason phrase for a status ("Unknown" for others). */
const char *http_status_text(int status);

#endif
