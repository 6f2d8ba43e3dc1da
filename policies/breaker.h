/* The breaker's rule: a streak of upstream failures pauses the policy the
 * way a partner's Retry-After does, so that while the upstream is down jobs
 * wait or are requeued without spending attempts. The first request after a
 * pause is the probe: if it fails too, the next pause is twice as long, up
 * to max_pause; any answer below 500 (a 429 included: the upstream is up)
 * closes it. Pure: the counters are the caller's (shared by its threads). */
#ifndef SLUICE_POLICIES_BREAKER_H
#define SLUICE_POLICIES_BREAKER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "config/config.h"

struct breaker_state {
    _Atomic uint32_t fail_streak;   /* upstream failures in a row */
    _Atomic uint32_t opens;         /* pauses since the last success */
};

/* Notes one upstream result. Returns the pause to start now in ms, or 0:
 * none (a success, a streak still short, or a pause already running, which
 * a failure of a request sent before it began must not extend). */
uint64_t breaker_note(const struct sc_breaker *b, struct breaker_state *s,
                      bool failed, bool paused_now);

#endif
