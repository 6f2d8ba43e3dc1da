#include "policies/gcra.h"

#include <math.h>

void gcra_init(struct gcra *g, double rate, uint32_t burst)
{
    double t = 1e9 / rate;

    /* T rounds up, never down: a rounded-down T would run the bucket a hair
     * faster than configured, and the bound must hold exactly. (The small
     * tolerance keeps 1e9/3 from becoming 333333334 by float error alone.) */
    g->t_ns = t < 1 ? 1 : (uint64_t)ceil(t - 1e-6);
    g->tau_ns = (uint64_t)(burst ? burst - 1 : 0) * g->t_ns;
    atomic_store(&g->tat, 0);
}

static uint64_t max_u64(uint64_t a, uint64_t b)
{
    return a > b ? a : b;
}

bool gcra_reserve(struct gcra *g, uint64_t now, uint64_t max_wait_ns,
                  uint64_t *start)
{
    uint64_t tat = atomic_load(&g->tat);

    for (;;) {
        uint64_t base = max_u64(tat, now);
        uint64_t earliest = tat > g->tau_ns ? tat - g->tau_ns : 0;
        uint64_t at = max_u64(earliest, now);

        *start = at;
        if (at - now > max_wait_ns)
            return false;
        /* On failure tat is reloaded and the decision is made again. */
        if (atomic_compare_exchange_weak(&g->tat, &tat, base + g->t_ns))
            return true;
    }
}

static void raise_tat(struct gcra *g, uint64_t want)
{
    uint64_t tat = atomic_load(&g->tat);

    while (tat < want && !atomic_compare_exchange_weak(&g->tat, &tat, want))
        ;
}

void gcra_empty(struct gcra *g, uint64_t now)
{
    raise_tat(g, now + g->t_ns + g->tau_ns);
}

void gcra_pause_until(struct gcra *g, uint64_t until)
{
    raise_tat(g, until + g->tau_ns);
}

void gcra_resume(struct gcra *g, uint64_t now)
{
    uint64_t want = now + g->tau_ns, tat = atomic_load(&g->tat);

    while (tat > want && !atomic_compare_exchange_weak(&g->tat, &tat, want))
        ;
}

void gcra_set_empty(struct gcra *g, uint64_t now)
{
    atomic_store(&g->tat, now + g->t_ns + g->tau_ns);
}

uint32_t gcra_available(const struct gcra *g, uint64_t now, uint64_t *next_ns)
{
    uint64_t tat = atomic_load(&g->tat);
    uint64_t earliest = tat > g->tau_ns ? tat - g->tau_ns : 0;

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
        uint64_t n = 1 + slack / g->t_ns;
        uint64_t burst = g->tau_ns / g->t_ns + 1;
        return (uint32_t)(n > burst ? burst : n);
    }
}
