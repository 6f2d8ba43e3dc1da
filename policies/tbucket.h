/* A token bucket whose rate and capacity may change while it runs, for
 * permits granted when they are used rather than reserved at arrival: a
 * policy that follows its partner's quota (policies/quota.h) grants each
 * permit at the rate in force when it is granted, and lanes
 * (policies/lanes.h) hand each permit to a lane as it falls due.
 *
 * GCRA (policies/gcra.h) reserves a start time per request on one atomic,
 * which is exact for a fixed rate but cannot re-time reservations already
 * handed out when the rate changes. This bucket keeps tokens instead, in
 * nano-tokens, and its rate in Q32.32 nano-tokens per nanosecond rounded
 * down, carrying the remainder of every accrual: in any interval the
 * permits taken number at most the capacity at its start plus the rate
 * integrated over it, plus one per top-up within it (a followed partner's
 * reset, tbucket_top_up), exactly: tokens never exceed the capacity, nothing
 * but accrual and top-ups adds them, accrual never outruns the rate, and a
 * top-up adds one token at most.
 *
 * Pure and unsynchronised: the caller holds the policy's lock. Times are
 * nanoseconds of a monotonic clock; a `now` older than the last one the
 * bucket saw counts as that one. */
#ifndef SLUICE_POLICIES_TBUCKET_H
#define SLUICE_POLICIES_TBUCKET_H

#include <stdbool.h>
#include <stdint.h>

#define TB_ONE 1000000000ull    /* nano-tokens in a token */

struct tbucket {
    uint64_t tokens;        /* nano-tokens at `last`, <= cap */
    uint32_t frac;          /* below a nano-token, Q0.32, carried */
    uint64_t last;          /* ns: when tokens were last settled */
    uint64_t rate_q;        /* nano-tokens per ns, Q32.32 (tokens/s * 2^32) */
    uint64_t cap;           /* nano-tokens, >= TB_ONE */
    uint64_t paused_until;  /* ns; nothing accrues before it; 0 = none */
    double rate;            /* tokens per second, as last set */
};

/* A full bucket at now. rate in (0, 1e9] tokens per second (clamped into
 * it), capacity >= 1 (0 counts as 1). */
void tbucket_init(struct tbucket *b, double rate, uint32_t capacity,
                  uint64_t now);

/* From now on, accrues at rate; what accrued before now did so at the old
 * one. */
void tbucket_set_rate(struct tbucket *b, uint64_t now, double rate);

/* From now on, holds at most capacity (>= 1) tokens: tokens above a lowered
 * capacity are dropped; a raised one adds none. */
void tbucket_set_capacity(struct tbucket *b, uint64_t now, uint32_t capacity);

/* A reload: b (its own rate and capacity) takes over `from`'s level at now,
 * clamped to b's capacity (never raised), and its running pause. */
void tbucket_carry(struct tbucket *b, const struct tbucket *from, uint64_t now);

/* A reload from a GCRA bucket (policies/gcra.h): b holds `whole` tokens at
 * now (clamped to its capacity, fractions dropped), or, with none, its next
 * whole token no earlier than next_ns from now; what b held is dropped. */
void tbucket_set_level(struct tbucket *b, uint64_t now, uint32_t whole,
                       uint64_t next_ns);

/* Takes one token at now: true when there was a whole one. */
bool tbucket_take(struct tbucket *b, uint64_t now);

/* Tokens held at now (fractional), for gauges and RateLimit headers. */
double tbucket_tokens(const struct tbucket *b, uint64_t now);

/* ns from now until a whole token is there (0: one is), if none is taken
 * meanwhile and the rate stays. */
uint64_t tbucket_next_ns(const struct tbucket *b, uint64_t now);

/* Empties the bucket at now (any 429): the next token is 1 / rate away. */
void tbucket_empty(struct tbucket *b, uint64_t now);

/* Empties the bucket and accrues nothing before until (a reset hint, a
 * breaker's pause, an advertised r = 0): it resumes empty, so requests
 * restart at the rate, never with a burst. A later moment than a running
 * pause's replaces it, an earlier one does not. */
void tbucket_pause_until(struct tbucket *b, uint64_t now, uint64_t until);

/* A partner's window starts again at now (policies/quota.h): the bucket
 * holds at least one whole token, unless a pause runs beyond now. Tokens
 * it already held are kept, never more added: the top-up is the reset's
 * first permit, which accrual would have paid for one interval later. */
void tbucket_top_up(struct tbucket *b, uint64_t now);

/* Ends a running pause at now (an operator's override); still empty. */
void tbucket_resume(struct tbucket *b, uint64_t now);

/* The time (ns, from `from`) in which nano_tokens accrue when the rate may
 * change, e.g. at a partner's coming reset (quota_accrue_ns). pause_end:
 * from is the end of a pause, later than the bucket was last settled, so
 * what happens at from itself (a reset's top-up) is still to come. */
typedef uint64_t (*tbucket_accrue_fn)(const void *arg, uint64_t from,
                                      bool pause_end, uint64_t nano_tokens);

/* ns from now until n permits (n >= 1) could have been granted, if no
 * other is taken meanwhile: what the bucket holds now, then accrual (after
 * a running pause) at the bucket's rate, or as fn says when fn is not NULL.
 * The capacity does not bind: waiting requests take each token as it comes.
 * UINT64_MAX when it would never be. */
uint64_t tbucket_wait_ns(const struct tbucket *b, uint64_t now, uint64_t n,
                         tbucket_accrue_fn fn, const void *arg);

/* ns in which nano_tokens accrue at a fixed rate (tokens per second, > 0);
 * UINT64_MAX when never. What tbucket_wait_ns uses without fn. */
uint64_t tbucket_accrue_at(double rate, uint64_t nano_tokens);

#endif
