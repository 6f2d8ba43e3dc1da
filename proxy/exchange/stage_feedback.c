/* The feedback rows: what the upstream's answer tells the policy, applied
 * as soon as its head (or its failure) is known. Any 429 empties the bucket
 * and one with a reset hint pauses it; the breaker counts failures in a row
 * and pauses the policy after `failures` of them. A policy's own pause is
 * written to the store, so a restart inside it does not send into a
 * partner that asked for quiet; a `shared: redis` policy's fleet hears of
 * it too (stage_feedback_fleet). Nothing here is waited for. Only plans of
 * policies with a bucket have these rows. */
#include <errno.h>

#include "obs/log.h"
#include "policies/breaker.h"
#include "proxy/exchange/stages.h"

/* Partitions' cooldowns live in memory only. Nobody waits for the write: a
 * failure the store reports at once is logged, a later one is not. */
static void persist_pause(struct exchange *ex, uint64_t pause_ms)
{
    struct store_call c = {0};
    uint64_t now = ex_wall_ms(ex);
    int rc;

    if (ex->bucket->partition)
        return;
    rc = store_pause_set_async(ex->env->store, &c, ex->pol->name, now, now + pause_ms);
    ex_store_detach(&c, rc);
    if (rc != 0 && rc != -EINPROGRESS)
        log_warn("policy %s: cooldown not kept across restarts: %s",
                 ex->pol->name, c.err.text);
}

/* pause_ms 0 empties the fleet's bucket, more pauses the whole policy. A
 * failure leaves the other sidecars to meet their own 429s. */
static void tell_fleet(struct exchange *ex, uint64_t pause_ms)
{
    struct store_call c = {0};
    const char *partition = ex_partition(ex);

    ex_store_detach(&c, store_bucket_pause_async(ex->env->store, &c, ex->pol->name,
                                                 partition, ex->ps->fleet_t_ns,
                                                 ex->ps->fleet_tau_ns,
                                                 pause_ms * NS_PER_MS));
}

/* Any 429 empties the bucket; one with a reset hint pauses it until then,
 * max_delay at most: a partner's absurd hint (a century) must not silence a
 * policy beyond what any job could wait. The job that met such a hint is
 * dead-lettered (policies/outcome.h). */
static void cool_down(struct exchange *ex, uint64_t now, bool fleet)
{
    uint64_t hint_ms = ex->oin.hint_ms;

    if (!ex->oin.has_hint || hint_ms == 0) {
        bucket_empty(ex->bucket, now);
        if (fleet)
            tell_fleet(ex, 0);
        return;
    }
    if (hint_ms > ex->pol->retry.max_delay_ms)
        hint_ms = ex->pol->retry.max_delay_ms;
    bucket_pause(ex->bucket, now, now + hint_ms * NS_PER_MS, PAUSE_UPSTREAM_429);
    persist_pause(ex, hint_ms);
    if (fleet)
        tell_fleet(ex, hint_ms);
    log_info("policy %s: upstream %s asked for %llu ms of cooldown",
             ex->pol->name, ex->up->name, (unsigned long long)hint_ms);
}

/* The breaker (a policy's `breaker` block; the rule: policies/breaker.h):
 * its pause is the bucket's, like a partner's Retry-After. */
static void note_breaker(struct exchange *ex, uint64_t now, bool failed, bool fleet)
{
    uint64_t pause_ms;

    if (!ex->pol->breaker.enabled)
        return;
    pause_ms = breaker_note(&ex->pol->breaker, pacing_breaker(ex->ps), failed,
                            bucket_cooldown(ex->bucket) > now);
    if (!pause_ms)
        return;
    bucket_pause(ex->bucket, now, now + pause_ms * NS_PER_MS, PAUSE_BREAKER);
    persist_pause(ex, pause_ms);
    if (fleet)
        tell_fleet(ex, pause_ms);
    log_warn("policy %s: %u failures in a row from upstream %s: paused for %llu ms",
             ex->pol->name, (unsigned)atomic_load(&pacing_breaker(ex->ps)->fail_streak),
             ex->up->name, (unsigned long long)pause_ms);
}

static enum ex_verdict feedback(struct exchange *ex, uint64_t now, bool fleet)
{
    if (!ex->bucket) /* a permit row always chose one: a misplaced row does nothing */
        return EXV_NEXT;
    if (ex->ov.cool_down)
        cool_down(ex, now, fleet);
    if (ex->ov.breaker != OB_NONE)
        note_breaker(ex, now, ex->ov.breaker == OB_FAILURE, fleet);
    return EXV_NEXT;
}

static enum ex_verdict feedback_run(struct exchange *ex, uint64_t now)
{
    return feedback(ex, now, false);
}

static enum ex_verdict feedback_fleet_run(struct exchange *ex, uint64_t now)
{
    return feedback(ex, now, true);
}

const struct ex_stage stage_feedback = {
    .name = "feedback",
    .run = feedback_run,
};

const struct ex_stage stage_feedback_fleet = {
    .name = "feedback_fleet",
    .run = feedback_fleet_run,
};
