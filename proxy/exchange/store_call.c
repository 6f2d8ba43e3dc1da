/* Store calls from the rows: one in flight per exchange (ex->scall), its
 * completion a wake like a slot's grant, its deadline the store's timeout.
 * The idempotency rows wait for the records, the pacing rows for a shared
 * bucket or slot. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "obs/log.h"
#include "proxy/exchange/stage.h"
#include "util/clock.h"

static void on_store_done(struct store_call *c)
{
    ex_wake(c->arg);
}

/* sluice_store_duration_seconds: from the start to the completion (or the
 * store's timeout), per operation; pushed to StatsD like the other timings. */
static void timed(struct exchange *ex, enum store_timed_op op)
{
    uint64_t end = ex->env->clock->mono_ns(ex->env->clock->arg);
    double s = (double)(end - ex->store_started) / 1e9;
    char tags[32];

    metrics_observe(ex->env->metrics, H_STORE, ex->ids->store_duration[op], s);
    if (ex->env->statsd && ex->env->statsd->fd >= 0) {
        snprintf(tags, sizeof tags, "op:%s", store_op_name(op));
        statsd_timing(ex->env->statsd, "store_duration", s * 1000, tags);
    }
}

/* Starts the call when asked to (first) and goes on when it completed at
 * once; else waits for its completion, or gives it up at the store's
 * timeout (-ETIMEDOUT, a failure like any other). EXV_NEXT means ex->scall
 * holds the result. */
enum ex_verdict ex_store_wait(struct exchange *ex, uint64_t now,
                              int (*start)(struct exchange *ex), bool first,
                              enum store_timed_op op)
{
    const struct ex_env *env = ex->env;
    /* A completion's WAIT for replicas is not an outage: it has longer. */
    uint64_t timeout_ms = env->store_timeout_ms *
        (op == ST_COMPLETE && env->replicas_ack ? STORE_WAIT_TIMEOUTS : 1);

    if (first && !ex->scall && !(ex->scall = freelist_take(env->spare_calls))) {
        ex_refuse(ex, 500, OUT_REJECTED, R_INTERNAL, "out of memory");
        return EXV_ANSWER;
    }
    if (first) {
        ex->scall->done = on_store_done;
        ex->scall->arg = ex;
        ex->store_started = env->clock->mono_ns(env->clock->arg);
        if (start(ex) != -EINPROGRESS) {
            timed(ex, op);
            return EXV_NEXT;
        }
        ex->store_deadline = timeout_ms ? now + timeout_ms * NS_PER_MS : 0;
        ex->wake_at = ex->store_deadline;
        return EXV_WAIT;
    }
    if (!store_call_pending(ex->scall)) {
        timed(ex, op);
        return EXV_NEXT;
    }
    if (ex->woke == WOKE_TIMER) {
        store_call_cancel(ex->scall);
        ex->scall->rc = -ETIMEDOUT;
        sc_error_set(&ex->scall->err, "no answer within %llu ms",
                     (unsigned long long)timeout_ms);
        timed(ex, op);
        return EXV_NEXT;
    }
    ex->wake_at = ex->store_deadline;
    return EXV_WAIT;
}

void ex_store_cancel(struct exchange *ex)
{
    if (!ex->scall)
        return;
    store_call_cancel(ex->scall);
    store_record_clear(&ex->scall->rec);
    store_record_clear(&ex->scall->acq.rec);
}

void ex_store_detach(struct store_call *c, int rc)
{
    if (rc == -EINPROGRESS)
        store_call_cancel(c);
}

void ex_log_release(struct exchange *ex, int rc, const struct sc_error *err)
{
    if (rc == -ESTALE) {
        /* This request outlived its lease (a stalled loop) and another took
         * the key over: its lease is not ours to end. */
        log_warn("policy %s: lease not released: %s", ex->pol->name, err->text);
    } else if (rc != 0 && rc != -ENOENT && rc != -EINPROGRESS) {
        /* -ENOENT: nothing to release (expired and swept): an answer, not
         * a failure. */
        ex_count_store_error(ex);
        log_error("policy %s: cannot release a lease: %s", ex->pol->name, err->text);
    }
}

/* Frees the key of a request that leaves unsent, without waiting: its
 * completion is not awaited (a failure leaves the lease to expire). A
 * lease taken with the fleet's permit, before the request's waits, gives
 * its attempt back too: waiting spends none of a job's attempts. */
static void release_unsent(struct exchange *ex)
{
    struct store_call c = {0};
    const struct sc_idempotency *id = &ex->pol->idem;
    int rc = ex->lease_with_permit
        ? store_release_unsent_async(ex->env->store, &c, ex->pol->name, ex->key,
                                     ex->attempt, ex->lease, ex_wall_ms(ex),
                                     id->ttl_ms)
        : store_release_async(ex->env->store, &c, ex->pol->name, ex->key,
                              ex->attempt, ex->lease, ex_wall_ms(ex), id->ttl_ms);

    ex_store_detach(&c, rc);
    ex_log_release(ex, rc, &c.err);
}

void ex_lease_give_back(struct exchange *ex)
{
    if (!ex->leased)
        return;
    if (!ex->settled) {
        /* Left without a commit (the worker gone, no memory): nothing sent
         * frees the key; something sent may have had its effect. */
        ex->settled = true;
        if (!ex->sent)
            release_unsent(ex);
    }
    ex->leased = false;
    atomic_fetch_sub(ex->env->leases_active, 1);
}
