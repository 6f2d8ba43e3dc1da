/* A request's record at its end, and what is fed from it: the counters and
 * histograms of docs/contract.md §8, the StatsD timings and the access-log
 * line of §9. The request's owner builds it once, when the request is over;
 * nothing else reads the request for the metrics or the log. */
#ifndef SLUICE_OBS_REQUEST_H
#define SLUICE_OBS_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "obs/metrics.h"
#include "obs/statsd.h"
#include "policies/problem.h"

struct obs_request {
    size_t route;               /* the config's route index; ids->n_routes: none */
    size_t policy;              /* its policy's index; ids->n_policies: default */
    const char *route_name;     /* "none" when no route matched */
    const char *policy_name;    /* the policy's ("default" for the default one) */
    const char *log_policy;     /* as logged: "" for the default policy */
    const char *upstream_name;  /* NULL when no route matched */
    const char *method;         /* "-" when unknown */
    const char *target;         /* raw; the log cuts the query off */
    const char *key;            /* idempotency key or NULL (only its hash is logged) */
    const char *request_id;
    const char *shadow;         /* shadow mode: what enforce would have done, or NULL */
    bool shadow_refused;        /* ... it would have been rate_limited */
    int status;
    int upstream_status;        /* 0: no status line received */
    enum outcome outcome;
    enum reason reason;
    unsigned attempt;           /* as the answer told it */
    bool permit_counted;        /* its permit wait is observed */
    uint64_t permit_wait_ns;
    uint32_t lane;              /* its index in the policy's lanes (0: none) */
    const char *lane_name;      /* "" for a policy without lanes */
    bool sent;                  /* it was handed to the upstream */
    bool upstream_timed;        /* sent and done: upstream_ns holds */
    uint64_t upstream_ns;
    uint64_t total_ns;
    uint64_t bytes_in, bytes_out;
    bool requeued;              /* a requeue instruction ... */
    uint64_t requeue_delay_ms;  /* ... of this delay */
    const char *enqueued_at;    /* Sluice-Enqueued-At as sent, or NULL */
    uint64_t arrival_wall_ms;
};

/* Counts the request in sh (the loop's shard) and sd (fd -1: off), and,
 * with access_log, writes its line. */
void obs_request_done(const struct obs_request *r, struct metrics_shard *sh,
                      const struct metrics_ids *ids, struct statsd *sd,
                      bool access_log);

/* The upstream's result, counted as soon as it is known (a scrape right
 * after sees it): sluice_upstream_responses_total and its duration. */
void metrics_upstream_result(struct metrics_shard *sh, const struct metrics_ids *ids,
                             size_t upstream, enum up_code code, double seconds);

#endif
