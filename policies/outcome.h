/* Outcome classification (docs/contract.md §4 and §5): what an upstream's
 * answer, or its failure to answer, means for the worker: pass it through,
 * requeue the job, dead-letter it, or refuse with a problem; and what it
 * tells the policy (a cooldown to start, a success or failure for the
 * breaker). Pure: the exchange's upstream stage applies the verdict. */
#ifndef SLUICE_POLICIES_OUTCOME_H
#define SLUICE_POLICIES_OUTCOME_H

#include <stdbool.h>
#include <stdint.h>

#include "config/config.h"
#include "policies/problem.h"

/* How the upstream exchange ended, as the upstream client reports it. */
enum outcome_transport {
    OT_ANSWERED = 0,        /* a status line and head arrived */
    OT_CONNECT_ERROR,       /* nothing was sent */
    OT_CONNECTION_LOST,     /* sent, then closed, reset or garbled */
    OT_TIMEOUT,             /* sent, no whole answer in time */
    OT__COUNT
};

struct outcome_input {
    enum outcome_transport transport;
    int status;             /* the upstream's status; 0 if none arrived */
    bool head_too_big;      /* the upstream answered with a head over the limit */
    bool has_hint;          /* a reset hint (Retry-After, RateLimit, ...) */
    uint64_t hint_ms;
    uint32_t attempt;       /* this attempt, 1-based */
    uint64_t rnd;           /* uniform 64-bit random number for the jitter */
};

enum outcome_action {
    OA_PASS = 0,            /* the upstream's answer goes to the worker */
    OA_REQUEUE,             /* an instruction: come back after delay_ms */
    OA_DEAD_LETTER,         /* an instruction: stop retrying */
    OA_REFUSE,              /* a problem+json with status */
};

enum outcome_breaker { OB_NONE = 0, OB_SUCCESS, OB_FAILURE };

struct outcome_verdict {
    enum outcome_action action;
    enum outcome outcome;
    enum reason reason;         /* R_NONE when passed through */
    int status;                 /* OA_PASS: the upstream's; OA_REFUSE: ours */
    uint64_t delay_ms;          /* OA_REQUEUE */
    bool cool_down;             /* a 429: empty or pause the bucket */
    enum outcome_breaker breaker;
};

void outcome_classify(const struct sc_retry *retry,
                      const struct outcome_input *in,
                      struct outcome_verdict *v);

/* Whether an upstream answer of this status passed to the worker is stored
 * for replay under the request's key: in replay_statuses, not in retry.on. */
bool outcome_replayable(const struct sc_policy *p, int status);

#endif
