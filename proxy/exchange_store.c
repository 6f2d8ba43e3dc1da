/* Store calls from the stages: one in flight per exchange (ex->scall), its
 * completion a wake like a slot's grant, its deadline the store's timeout.
 * The idempotency stages wait for the records, the pacing stages for a
 * shared bucket or slot. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "proxy/app.h"
#include "proxy/exchange_internal.h"
#include "proxy/server.h"
#include "util/clock.h"

static void on_store_done(struct store_call *c)
{
    ex_wake(c->arg);
}

/* sluice_store_duration_seconds: from the start to the completion (or the
 * store's timeout), per operation; pushed to StatsD like the other timings. */
static void timed(struct exchange *ex, enum store_timed_op op)
{
    uint64_t end = clock_mono_ns();
    struct app *app = ex->loop->app;
    double s = (double)(end - ex->store_started) / 1e9;
    char tags[32];

    metrics_observe(&app->metrics.shards[ex->loop->idx], H_STORE,
                    ex->rt->ids.store_duration[op], s);
    if (ex->loop->statsd.fd >= 0) {
        snprintf(tags, sizeof tags, "op:%s", store_op_name(op));
        statsd_timing(&ex->loop->statsd, "store_duration", s * 1000, tags);
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
    const struct app_fixed *f = &ex->loop->app->fixed;
    /* A completion's WAIT for replicas is not an outage: it has longer. */
    uint64_t timeout_ms = f->store_timeout_ms *
        (op == ST_COMPLETE && f->replicas_ack ? STORE_WAIT_TIMEOUTS : 1);

    if (first && !ex->scall && !(ex->scall = freelist_take(&ex->loop->spare_call))) {
        ex_refuse(ex, 500, OUT_REJECTED, R_INTERNAL, "out of memory");
        return EXV_ANSWER;
    }
    if (first) {
        ex->scall->done = on_store_done;
        ex->scall->arg = ex;
        ex->store_started = clock_mono_ns();
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
