#include "policies/gcra.h"

#include <math.h>
#include <stddef.h>

void gcra_numbers(double rate, uint32_t burst, uint64_t *t_ns, uint64_t *tau_ns)
{
    double t = rate > 0 ? 1e9 / rate : 1e9;

    /* T rounds up, never down: a rounded-down T would run the bucket a hair
     * faster than configured, and the bound must hold exactly. (The small
     * tolerance keeps 1e9/3 from becoming 333333334 by float error alone.) */
    *t_ns = t < 1 ? 1 : (uint64_t)ceil(t - 1e-6);
    *tau_ns = (uint64_t)(burst ? burst - 1 : 0) * *t_ns;
}

void gcra_init(struct gcra *g, double rate, uint32_t burst)
{
    gcra_numbers(rate, burst, &g->t_ns, &g->tau_ns);
    g->next = NULL;
    atomic_store(&g->tat, 0);
}

static uint64_t max_u64(uint64_t a, uint64_t b)
{
    return a > b ? a : b;
}

/* The bucket that holds g's state now (g, or the one it was handed over
 * to), with its TAT in *tat. Const in, mutable out: the caller's own
 * bucket decides whether it may write. */
static struct gcra *live(const struct gcra *g, uint64_t *tat)
{
    while ((*tat = atomic_load(&g->tat)) == GCRA_MOVED)
        g = g->next;
    return (struct gcra *)g;
}

bool gcra_reserve(struct gcra *g, uint64_t now, uint64_t max_wait_ns,
                  uint64_t *start)
{
    uint64_t tat;

    g = live(g, &tat);
    for (;;) {
        uint64_t base = max_u64(tat, now);
        uint64_t earliest = tat > g->tau_ns ? tat - g->tau_ns : 0;
        uint64_t at = max_u64(earliest, now);

        *start = at;
        if (at - now > max_wait_ns)
            return false;
        /* On failure tat is reloaded and the decision is made again (on the
         * next bucket when this one was handed over meanwhile). */
        if (atomic_compare_exchange_weak(&g->tat, &tat, base + g->t_ns))
            return true;
        if (tat == GCRA_MOVED)
            g = live(g, &tat);
    }
}

/* TAT to at least base + tau (+ T with plus_t), in the numbers of the
 * bucket that holds the state when the write lands. */
static void raise_tat(struct gcra *g, uint64_t base, bool plus_t)
{
    uint64_t tat;

    g = live(g, &tat);
    for (;;) {
        uint64_t want = base + g->tau_ns + (plus_t ? g->t_ns : 0);

        if (tat >= want || atomic_compare_exchange_weak(&g->tat, &tat, want))
            return;
        if (tat == GCRA_MOVED)
            g = live(g, &tat);
    }
}

void gcra_empty(struct gcra *g, uint64_t now)
{
    raise_tat(g, now, true);
}

void gcra_pause_until(struct gcra *g, uint64_t until)
{
    raise_tat(g, until, false);
}

void gcra_resume(struct gcra *g, uint64_t now)
{
    uint64_t tat;

    g = live(g, &tat);
    for (;;) {
        uint64_t want = now + g->tau_ns;

        if (tat <= want || atomic_compare_exchange_weak(&g->tat, &tat, want))
            return;
        if (tat == GCRA_MOVED)
            g = live(g, &tat);
    }
}

void gcra_set_empty(struct gcra *g, uint64_t now)
{
    atomic_store(&g->tat, now + g->t_ns + g->tau_ns);
}

uint32_t gcra_available(const struct gcra *g, uint64_t now, uint64_t *next_ns)
{
    uint64_t tat;
    const struct gcra *h = live(g, &tat);
    uint64_t earliest = tat > h->tau_ns ? tat - h->tau_ns : 0;

    if (now < earliest) {
        if (next_ns)
            *next_ns = earliest - now;
        return 0;
    }
    if (next_ns)
        *next_ns = 0;
    /* Tokens: one for `now` itself plus one per T of slack, up to burst. */
    {
        uint64_t slack = now - earliest;
        uint64_t n = 1 + slack / h->t_ns;
        uint64_t burst = h->tau_ns / h->t_ns + 1;
        return (uint32_t)(n > burst ? burst : n);
    }
}

/* ---- a change of numbers ----------------------------------------------- */

/* x * mul / div rounded up, for x of either sign. */
static __int128 scale_up(__int128 x, uint64_t mul, uint64_t div)
{
    __int128 p = x * (__int128)mul;

    return p >= 0 ? (p + (__int128)div - 1) / (__int128)div : -(-p / (__int128)div);
}

/* A debt d = TAT - ref is d / T starts of the bucket used (more than burst:
 * reserved ahead), i.e. burst - d / T tokens. Keeping the tokens, clamped to
 * the new burst b', gives d' = max(0, (d - tau) T' / T + tau'): the wait
 * beyond the tolerance scales with T, the tolerance is the new one. Rounded
 * up, so a fraction of a token is never gained; far debts saturate below
 * GCRA_MOVED. Starts reserved ahead keep their times, though, which a
 * faster rate would let new ones overtake: so the next start also waits for
 * the last of them (at E - T, E = TAT - tau) plus T'. */
uint64_t gcra_rerate(uint64_t tat, const struct gcra *from,
                     const struct gcra *to, uint64_t now, uint64_t paused_until)
{
    bool paused = paused_until > now;
    uint64_t ref = paused ? paused_until : now;
    uint64_t e = tat > from->tau_ns ? tat - from->tau_ns : 0;
    __int128 d = tat > ref ? (__int128)(tat - ref) : 0;
    __int128 d2 = scale_up(d - (__int128)from->tau_ns, to->t_ns, from->t_ns) +
                  (__int128)to->tau_ns;
    __int128 out;

    if (d2 < 0)
        d2 = 0;
    /* Paused: nothing before its end, and then one start, as ever. */
    if (paused && d2 < (__int128)to->tau_ns)
        d2 = to->tau_ns;
    out = (__int128)ref + d2;
    if (e >= ref + from->t_ns) {
        __int128 after_last = (__int128)e - from->t_ns + to->t_ns + to->tau_ns;

        if (out < after_last)
            out = after_last;
    }
    return out >= (__int128)GCRA_MOVED ? GCRA_MOVED - 1 : (uint64_t)out;
}

/* `to` is reachable only through g once the CAS lands, and by then it holds
 * the TAT that the CAS replaced: a reservation that wins on g before is
 * carried, one that loses retries on `to`. The pause is read again at each
 * try: a pause whose raise of g's TAT lands meanwhile fails the CAS, and
 * the next try sees its end. */
void gcra_hand_over(struct gcra *g, struct gcra *to, uint64_t now,
                    const _Atomic uint64_t *paused_until)
{
    uint64_t tat = atomic_load(&g->tat);

    g->next = to;
    do {
        uint64_t until = paused_until ? atomic_load(paused_until) : 0;

        atomic_store(&to->tat, gcra_rerate(tat, g, to, now, until));
    } while (!atomic_compare_exchange_weak(&g->tat, &tat, GCRA_MOVED));
}
