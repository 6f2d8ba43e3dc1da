#include "policies/outcome.h"

#include <string.h>

#include "policies/backoff.h"

/* A retryable failure becomes an instruction: requeue with a delay, or
 * dead_letter when the budget is spent or the upstream's hint is too far. */
static void retryable(const struct sc_retry *rt, const struct outcome_input *in,
                      enum reason r, struct outcome_verdict *v)
{
    uint64_t delay = 0;
    enum retry_verdict rv = backoff_retry_decide(rt, in->attempt, in->has_hint,
                                         in->hint_ms, in->rnd, &delay);

    v->reason = r;
    if (rv == RETRY_REQUEUE) {
        v->action = OA_REQUEUE;
        v->outcome = OUT_REQUEUE;
        v->delay_ms = delay;
        return;
    }
    v->action = OA_DEAD_LETTER;
    v->outcome = OUT_DEAD_LETTER;
    if (rv == RETRY_DELAY_EXCEEDS_MAX)
        v->reason = R_DELAY_EXCEEDS_MAX;
}

static void answered(const struct sc_retry *rt, const struct outcome_input *in,
                     struct outcome_verdict *v)
{
    int s = in->status;

    v->cool_down = s == 429;
    v->breaker = s >= 500 ? OB_FAILURE : OB_SUCCESS;
    if (sc_retry_on_status(rt, s)) {
        retryable(rt, in, s == 429 ? R_UPSTREAM_429 : R_UPSTREAM_5XX, v);
        return;
    }
    v->action = OA_PASS;
    v->status = s;
    v->outcome = s < 400 ? OUT_OK : OUT_PERMANENT_ERROR;
}

static void failed(const struct sc_retry *rt, const struct outcome_input *in,
                   struct outcome_verdict *v)
{
    static const struct {
        enum reason reason;
        unsigned bit;
        int status;
    } map[OT__COUNT] = {
        [OT_CONNECT_ERROR] = {R_CONNECT_ERROR, SC_T_CONNECT_ERROR, 502},
        [OT_CONNECTION_LOST] = {R_CONNECTION_LOST, SC_T_CONNECTION_LOST, 502},
        [OT_TIMEOUT] = {R_TIMEOUT, SC_T_TIMEOUT, 504},
    };

    if (in->head_too_big) {
        /* The upstream worked and will answer the same way again: passing
         * the job back would only repeat the side effect. As nginx's
         * "upstream sent too big header": 502, and no word to the breaker
         * (the partner is up). */
        v->action = OA_REFUSE;
        v->outcome = OUT_PERMANENT_ERROR;
        v->reason = R_CONNECTION_LOST;
        v->status = 502;
        return;
    }
    v->breaker = OB_FAILURE;
    if (rt->on_transport & map[in->transport].bit) {
        retryable(rt, in, map[in->transport].reason, v);
        return;
    }
    v->action = OA_REFUSE;
    v->outcome = OUT_PERMANENT_ERROR;
    v->reason = map[in->transport].reason;
    v->status = map[in->transport].status;
}

void outcome_classify(const struct sc_retry *retry,
                      const struct outcome_input *in, struct outcome_verdict *v)
{
    memset(v, 0, sizeof *v);
    if (in->transport == OT_ANSWERED && !in->head_too_big)
        answered(retry, in, v);
    else
        failed(retry, in, v);
}

bool outcome_replayable(const struct sc_policy *p, int status)
{
    return sc_idem_replays_status(&p->idem, status) &&
           !sc_retry_on_status(&p->retry, status);
}
