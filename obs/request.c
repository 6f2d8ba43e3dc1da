#include "obs/request.h"

#include <stdio.h>
#include <stdlib.h>

#include "obs/log.h"

void metrics_upstream_result(struct metrics_shard *sh, const struct metrics_ids *ids,
                             size_t upstream, enum up_code code, double seconds)
{
#ifndef SLUICE_METRICS_OFF /* a benchmark-only build, to price the metrics */
    metrics_add(sh, ids->up_codes[upstream * UC__COUNT + code], 1);
    metrics_observe(sh, H_DURATION, ids->up_duration[upstream], seconds);
#else
    (void)sh, (void)ids, (void)upstream, (void)code, (void)seconds;
#endif
}

/* Sluice-Enqueued-At: Unix seconds (a fraction allowed). */
static void record_queue_age(const struct obs_request *r, struct metrics_shard *sh,
                             const struct metrics_ids *ids, struct statsd *sd)
{
    char *end, tags[200], route[160];
    double at;

    if (!r->enqueued_at)
        return;
    at = strtod(r->enqueued_at, &end);
    if (end == r->enqueued_at || *end || !(at > 0 && at < 1e11)) {
        metrics_add(sh, ids->queue_age_bad[r->route], 1);
        return;
    }
    at = (double)r->arrival_wall_ms / 1000.0 - at;
    metrics_observe(sh, H_QUEUE_AGE, ids->queue_age[r->route], at > 0 ? at : 0);
    if (sd->fd >= 0) {
        statsd_tag_value(r->route_name, route, sizeof route);
        snprintf(tags, sizeof tags, "route:%s", route);
        statsd_timing(sd, "queue_age", (at > 0 ? at : 0) * 1000, tags);
    }
}

/* StatsD timings, when it is on: the same figures as the histograms. */
static void record_statsd(const struct obs_request *r, struct statsd *sd)
{
    char tags[256], route[160];

    if (sd->fd < 0)
        return;
    statsd_tag_value(r->route_name, route, sizeof route);
    snprintf(tags, sizeof tags, "route:%s", route);
    statsd_timing(sd, "request_duration", (double)r->total_ns / 1e6, tags);
    if (!r->upstream_name)
        return;
    if (r->upstream_timed) {
        snprintf(tags, sizeof tags, "upstream:%s", r->upstream_name);
        statsd_timing(sd, "upstream_duration", (double)r->upstream_ns / 1e6, tags);
    }
    if (r->lane_name && *r->lane_name)
        snprintf(tags, sizeof tags, "policy:%s,lane:%s", r->policy_name, r->lane_name);
    else
        snprintf(tags, sizeof tags, "policy:%s", r->policy_name);
    if (r->sent)
        statsd_timing(sd, "permit_wait", (double)r->permit_wait_ns / 1e6, tags);
    if (r->requeued) {
        snprintf(tags, sizeof tags, "policy:%s,reason:%s", r->policy_name,
                 reason_name(r->reason));
        statsd_timing(sd, "requeue_delay", (double)r->requeue_delay_ms, tags);
    }
}

static void record_metrics(const struct obs_request *r, struct metrics_shard *sh,
                           const struct metrics_ids *ids, struct statsd *sd)
{
    size_t rt = r->route, p = r->policy;

    metrics_add(sh, ids->requests[(rt * OUT__COUNT + r->outcome) * R__COUNT + r->reason], 1);
    metrics_observe(sh, H_DURATION, ids->req_duration[rt * OUT__COUNT + r->outcome],
                    (double)r->total_ns / 1e9);
    record_statsd(r, sd);
    record_queue_age(r, sh, ids, sd);
    if (!r->upstream_name)
        return;
    if (r->shadow_refused)
        metrics_add(sh, ids->shadow[rt], 1);
    if (r->permit_counted)
        metrics_observe(sh, H_PERMIT_WAIT,
                        ids->permit_wait[ids->permit_wait_at[p] + r->lane],
                        (double)r->permit_wait_ns / 1e9);
    if (r->requeued)
        metrics_observe(sh, H_REQUEUE_DELAY, ids->requeue_delay[p * R__COUNT + r->reason],
                        (double)r->requeue_delay_ms / 1000.0);
}

static void log_request(const struct obs_request *r)
{
    struct access_entry e = {
        .route = r->route_name,
        .policy = r->log_policy,
        .method = r->method,
        .target = r->target,
        .status = r->status,
        .outcome = outcome_name(r->outcome),
        .reason = reason_name(r->reason),
        .attempt = r->attempt,
        .permit_wait_ms = (double)r->permit_wait_ns / 1e6,
        .upstream_ms = (double)r->upstream_ns / 1e6,
        .total_ms = (double)r->total_ns / 1e6,
        .key = r->key,
        .shadow = r->shadow,
        .request_id = r->request_id,
        .upstream_status = r->upstream_status,
        .bytes_in = r->bytes_in,
        .bytes_out = r->bytes_out,
        .lane = r->lane_name,
    };

    log_access(&e);
}

void obs_request_done(const struct obs_request *r, struct metrics_shard *sh,
                      const struct metrics_ids *ids, struct statsd *sd,
                      bool access_log)
{
#ifndef SLUICE_METRICS_OFF /* a benchmark-only build, to price the metrics */
    record_metrics(r, sh, ids, sd);
#else
    (void)sh, (void)ids, (void)sd;
#endif
    if (access_log)
        log_request(r);
}
