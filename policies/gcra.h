/* The token bucket as GCRA (generic cell rate algorithm) on one atomic 64-bit
 * theoretical arrival time (TAT), in nanoseconds of a monotonic clock.
 *
 * A request may start at max(now, TAT - tau); reserving moves TAT to
 * max(TAT, now) + T. With T = 1/rate and tau = (burst - 1) * T, the starts of
 * any interval of length t number at most burst + rate * t, by construction:
 * no thread sleeps, arrival order is the order of successful CAS, and a
 * reservation that would wait longer than allowed changes nothing. */
#ifndef SLUICE_POLICIES_GCRA_H
#define SLUICE_POLICIES_GCRA_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/* A TAT no clock reaches: the bucket was handed over (gcra_hand_over) and
 * every call goes on to `next`. */
#define GCRA_MOVED UINT64_MAX

struct gcra {
    _Atomic uint64_t tat;   /* ns; 0 = full bucket; GCRA_MOVED: see next */
    uint64_t t_ns;          /* emission interval T = 1e9 / rate */
    uint64_t tau_ns;        /* tolerance (burst - 1) * T */
    struct gcra *next;      /* set before tat becomes GCRA_MOVED */
};

/* The interval T and tolerance tau of rate and burst, as gcra_init sets
 * them (T rounded up; rate <= 0 counts as one per second). */
void gcra_numbers(double rate, uint32_t burst, uint64_t *t_ns, uint64_t *tau_ns);

/* Sets up a full bucket. rate > 0, burst >= 1. */
void gcra_init(struct gcra *g, double rate, uint32_t burst);

/* Reserves one start for a request arriving at now that may wait at most
 * max_wait_ns. On success returns true and the start time in *start (>= now).
 * Otherwise returns false, reserves nothing, and *start is when a permit
 * would be available. */
bool gcra_reserve(struct gcra *g, uint64_t now, uint64_t max_wait_ns,
                  uint64_t *start);

/* Empties the bucket: the next start is no earlier than now + T (any 429). */
void gcra_empty(struct gcra *g, uint64_t now);

/* Pauses until `until`, after which the bucket resumes empty: one start at
 * `until`, then one per T (a 429 with a reset hint). Never moves TAT back. */
void gcra_pause_until(struct gcra *g, uint64_t until);

/* Ends a pause early (an operator's override): the bucket resumes empty as
 * if the pause had ended at `now`, one start at once, then one per T. Only
 * ever moves TAT back; starts already reserved keep their times. */
void gcra_resume(struct gcra *g, uint64_t now);

/* Starts that could begin at once at `now` (the bucket's tokens, floored),
 * and the ns until the next token when that is 0. For RateLimit headers. */
uint32_t gcra_available(const struct gcra *g, uint64_t now, uint64_t *next_ns);

/* Puts the state of an evicted or new partition: empty, never full. */
void gcra_set_empty(struct gcra *g, uint64_t now);

/* The TAT `tat` of a bucket with from's numbers, in to's numbers, at now:
 * the tokens it holds are kept, clamped to to's burst and never raised; a
 * debt beyond the bucket (starts reserved ahead) keeps its count of starts,
 * and no new start comes before T' after the last of them.
 * A pause running until paused_until (> now) keeps its end, and the bucket
 * still resumes empty then. Pure: nothing is read but the arguments. */
uint64_t gcra_rerate(uint64_t tat, const struct gcra *from,
                     const struct gcra *to, uint64_t now, uint64_t paused_until);

/* Hands g over to `to` (its numbers set, and not reachable by any other
 * thread yet), once: to's TAT becomes g's, re-rated (gcra_rerate, with the
 * pause *paused_until, which may be NULL, as it reads at that moment), and
 * every later call on g goes on to `to`.
 * Reservations made on g while this runs are either carried or made on
 * `to`: none is lost, so the bound holds across the change. */
void gcra_hand_over(struct gcra *g, struct gcra *to, uint64_t now,
                    const _Atomic uint64_t *paused_until);

#endif
