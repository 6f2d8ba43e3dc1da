/* The quota row (a policy's `quota: {follow: true}`, docs/contract.md §12):
 * every upstream answer of the policy, whatever its status, is read for the
 * quota headers the partner advertises, which set the rate its permits are
 * granted at (pacing/permits.h, policies/quota.h); an advertised r = 0
 * pauses the policy until its reset, as a 429's reset hint does, capped by
 * max_delay. It also ends the request's count among those in flight (the f
 * of the rule), answered or failed: in fleet mode the fleet's, in Redis,
 * whose answer is the f this answer is read with (one round trip; without
 * it, this sidecar's times fleet_size). Only plans of such policies have
 * it, after the upstream row. */
#include "obs/log.h"
#include "proxy/exchange/stages.h"

static const char *response_header(void *arg, const char *name)
{
    return up_response_header(arg, name);
}

/* The partner said nothing is left before `until`: the policy waits, as
 * for a cooldown, at most max_delay. */
static void quota_pause(struct exchange *ex, uint64_t now, uint64_t until)
{
    uint64_t cap = now + ex->pol->retry.max_delay_ms * NS_PER_MS;

    if (until > cap)
        until = cap;
    bucket_pause(ex->bucket, now, until, PAUSE_QUOTA);
    if (ex->ps->shared && ex->env->store_shares) {
        /* The whole fleet waits (a failure leaves the others to read the
         * r = 0 themselves). */
        struct store_call c = {0};

        ex_store_detach(&c, store_bucket_pause_async(
            ex->env->store, &c, ex->pol->name,
            ex_partition(ex), ex->ps->fleet_t_ns,
            ex->ps->fleet_tau_ns, until - now));
    }
    log_info("policy %s: upstream %s advertised no quota left: paused for %llu ms",
             ex->pol->name, ex->up->name,
             (unsigned long long)((until - now) / NS_PER_MS));
}

static int start_flight_end(struct exchange *ex)
{
    return store_flight_end_async(ex->env->store, ex->scall, ex->pol->name,
                                  ex_partition(ex),
                                  ex->flight);
}

/* Out of the fleet's set of requests in flight: how many it still holds,
 * or -1 (unknown: Redis did not answer). EXV_WAIT while it is asked. */
static enum ex_verdict fleet_flight(struct exchange *ex, uint64_t now, int64_t *f)
{
    enum ex_verdict v = ex_store_wait(ex, now, start_flight_end, ex->woke == WOKE_FIRST,
                                      ST_FLIGHT_END);

    if (v != EXV_NEXT)
        return v;
    ex->flight_listed = false;
    *f = ex->scall->rc == 0 ? (int64_t)ex->scall->permit.flight : -1;
    return EXV_NEXT;
}

static enum ex_verdict quota_run(struct exchange *ex, uint64_t now)
{
    const struct up_response *r = &ex->ureq.resp;
    struct quota_result res = {0};
    struct quota_headers h;
    bool head = r->status > 0;  /* a status line: the headers are there */
    int64_t f = -1;
    enum ex_verdict v;

    if (!ex->pm_flight || !ex->bucket || !ex->bucket->pm)
        return EXV_NEXT;
    if (ex->flight_listed && (v = fleet_flight(ex, now, &f)) != EXV_NEXT)
        return v;
    ex->pm_flight = false;
    if (head)
        quota_headers_get(&h, response_header, (void *)r);
    permits_answered(ex->bucket->pm, head ? &h : NULL, now, ex_wall_ms(ex), f, &res);
    if (res.ignored)
        log_debug("policy %s: %u quota header items from upstream %s ignored "
                  "(malformed or absurd)", ex->pol->name, res.ignored, ex->up->name);
    if (res.pause_until > now)
        quota_pause(ex, now, res.pause_until);
    return EXV_NEXT;
}

const struct ex_stage stage_quota = {
    .name = "quota",
    .run = quota_run,
};
