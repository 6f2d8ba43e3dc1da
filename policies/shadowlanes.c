/* The virtual lane clocks of a shadow policy (shadowlanes.h). */
#include "policies/shadowlanes.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>

int shadow_lanes_init(struct shadow_lanes *s, const struct sc_lane *cfg, size_t n)
{
    s->n = 0;
    s->tat = NULL;
    s->share_bp = NULL;
    if (n == 0)
        return -EINVAL;
    s->tat = calloc(n, sizeof *s->tat);
    s->share_bp = calloc(n, sizeof *s->share_bp);
    if (!s->tat || !s->share_bp)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        double bp = round(cfg[i].share * 100);

        /* A share is in (0, 100 %] (the config check): never a zero divisor. */
        s->share_bp[i] = bp < 1 ? 1 : bp > 10000 ? 10000 : (uint32_t)bp;
    }
    s->n = (uint32_t)n;
    return 0;
}

void shadow_lanes_free(struct shadow_lanes *s)
{
    free(s->tat);
    free(s->share_bp);
    s->tat = NULL;
    s->share_bp = NULL;
    s->n = 0;
}

/* The shares of lane and of the other lanes still busy at now. */
static uint64_t busy_shares(const struct shadow_lanes *s, uint32_t lane, uint64_t now)
{
    uint64_t sum = s->share_bp[lane];

    for (uint32_t j = 0; j < s->n; j++)
        if (j != lane && s->tat[j] > now)
            sum += s->share_bp[j];
    return sum;
}

/* x * num / den without overflow for the magnitudes here (ns, basis points). */
static uint64_t scale(uint64_t x, uint64_t num, uint64_t den)
{
    return (uint64_t)((unsigned __int128)x * num / den);
}

enum shadow_lane_verdict shadow_lanes_reserve(struct shadow_lanes *s, uint32_t lane,
                                              uint64_t now, uint64_t interval_ns,
                                              uint64_t tau_ns, uint64_t max_wait_ns,
                                              uint64_t not_before, uint64_t *wait_ns)
{
    uint64_t sum, inc, tau, tat, start;

    if (lane >= s->n)
        lane = s->n - 1;
    sum = busy_shares(s, lane, now);
    inc = scale(interval_ns, sum, s->share_bp[lane]);
    tau = scale(tau_ns, s->share_bp[lane], sum);
    tat = s->tat[lane] > now ? s->tat[lane] : now;
    start = tat > now + tau ? tat - tau : now;
    if (not_before > start)
        start = not_before;
    *wait_ns = start - now;
    if (*wait_ns > max_wait_ns)
        return SL_REFUSED;
    /* After a pause the lane restarts from its end, as the bucket does. */
    s->tat[lane] = (start > tat ? start : tat) + inc;
    return *wait_ns ? SL_WAIT : SL_GO;
}
