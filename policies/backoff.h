/* Delay rules of docs/contract.md §4: reset hints (Retry-After in every RFC 9110
 * form, the draft RateLimit header's t=, X-RateLimit-Reset), bounded
 * exponential backoff with jitter, the clamps and the dead-letter edges.
 * Pure functions: time and randomness come in as arguments. */
#ifndef SLUICE_POLICIES_BACKOFF_H
#define SLUICE_POLICIES_BACKOFF_H

#include <stdbool.h>
#include <stdint.h>

#include "config/config.h"

/* Retry-After: delta-seconds or an HTTP-date (IMF-fixdate, RFC 850,
 * asctime). A date in the past is 0. 0 or -EINVAL for a malformed value. */
int hint_retry_after(const char *v, uint64_t now_wall_ms, uint64_t *delay_ms);

/* The draft RateLimit header, read as an RFC 8941 List: the largest t=
 * (seconds) among the items whose r= is 0, the exhausted quotas. -EINVAL
 * when the List is malformed or no item is exhausted. */
int hint_ratelimit_t(const char *v, uint64_t *delay_ms);

/* X-RateLimit-Reset: Unix seconds when above 10^9, else seconds from now. */
int hint_x_ratelimit_reset(const char *v, uint64_t now_wall_ms,
                           uint64_t *delay_ms);

/* The reset hint of a response: Retry-After first, then RateLimit's t=, then
 * X-RateLimit-Reset; malformed ones are skipped. Any may be NULL. */
bool hint_pick(const char *retry_after, const char *ratelimit,
               const char *x_reset, uint64_t now_wall_ms, uint64_t *delay_ms);

/* min(cap, base * multiplier^(attempt-1)) with the policy's jitter, then at
 * least 1 s; rnd is a uniform 64-bit random number. Not yet clamped to
 * max_delay. */
uint64_t backoff_delay_ms(const struct sc_retry *r, uint32_t attempt,
                          uint64_t rnd);

/* hint + uniform [0, max(1 s, 10 % of hint)]. */
uint64_t hint_delay_ms(uint64_t hint_ms, uint64_t rnd);

enum retry_verdict {
    RETRY_REQUEUE = 0,
    RETRY_DEAD_LETTER,        /* the attempt budget is spent */
    RETRY_DELAY_EXCEEDS_MAX,  /* dead letter: the hint is beyond max_delay */
};

/* Decides what a retryable failure at `attempt` becomes; *delay_ms gets the
 * requeue delay (1 ms .. max_delay) when the verdict is RETRY_REQUEUE. */
enum retry_verdict backoff_retry_decide(const struct sc_retry *r, uint32_t attempt,
                                bool has_hint, uint64_t hint_ms, uint64_t rnd,
                                uint64_t *delay_ms);

#endif
