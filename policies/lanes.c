#include "policies/lanes.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The stride of a 100 % lane is 2^20; of a 0.01 % lane, 10000 times that.
 * Integer strides round a share by less than 1e-5 of itself. */
#define STRIDE1 (10000ull << 20)
/* Passes are renumbered from the pass last served once it passes this, so
 * they never wrap (it takes over 4e8 permits of the smallest share). */
#define PASS_RENUMBER (1ull << 62)

static uint32_t share_bp(double share)
{
    long bp = lround(share * 100);

    return bp < 1 ? 1 : bp > 10000 ? 10000 : (uint32_t)bp;
}

int lanes_init(struct lanes *l, const struct sc_lane *cfg, size_t n)
{
    memset(l, 0, sizeof *l);
    if (n == 0 || n > UINT32_MAX)
        return -EINVAL;
    l->v = calloc(n, sizeof *l->v);
    if (!l->v)
        return -ENOMEM;
    l->n = (uint32_t)n;
    for (size_t i = 0; i < n; i++) {
        struct lane *ln = &l->v[i];

        TAILQ_INIT(&ln->queue);
        ln->share_bp = share_bp(cfg[i].share);
        ln->stride = STRIDE1 / ln->share_bp;
        ln->max_wait_ns = cfg[i].max_wait_ms * 1000000ull;
    }
    return 0;
}

void lanes_free(struct lanes *l)
{
    free(l->v);
    memset(l, 0, sizeof *l);
}

static bool is_ows(char c)
{
    return c == ' ' || c == '\t';
}

long lanes_find(const struct sc_policy *p, const char *value)
{
    size_t len;

    if (!value)
        return -1;
    while (is_ows(*value))
        value++;
    for (len = strlen(value); len && is_ows(value[len - 1]); len--)
        ;
    for (size_t i = 0; i < p->n_lanes; i++) {
        const char *name = p->lanes[i].name;

        if (name && strlen(name) == len && !memcmp(name, value, len))
            return (long)i;
    }
    return -1;
}

const char *lanes_describe(const struct sc_policy *p, char *buf, size_t len)
{
    size_t used = 0;

    if (len)
        buf[0] = '\0';
    for (size_t i = 0; i < p->n_lanes && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%s", i ? ", " : "",
                                 p->lanes[i].name ? p->lanes[i].name : "");
    return buf;
}

/* The pass of a lane that has waiters, or would have with one more. */
static uint64_t pass_of(const struct lanes *l, const struct lane *ln)
{
    return ln->waiting || ln->pass > l->vtime ? ln->pass : l->vtime;
}

void lanes_push(struct lanes *l, struct lane_waiter *w, uint32_t lane)
{
    struct lane *ln = &l->v[lane];

    /* No credit for the time it was empty. */
    ln->pass = pass_of(l, ln);
    w->lane = lane;
    w->queued = true;
    TAILQ_INSERT_TAIL(&ln->queue, w, link);
    ln->waiting++;
    l->waiting++;
}

bool lanes_remove(struct lanes *l, struct lane_waiter *w)
{
    struct lane *ln;

    if (!w->queued)
        return false;
    ln = &l->v[w->lane];
    TAILQ_REMOVE(&ln->queue, w, link);
    w->queued = false;
    ln->waiting--;
    l->waiting--;
    return true;
}

/* The lane with waiters whose pass is least, the earlier on a tie; -1. */
static long next_lane(const struct lanes *l)
{
    long best = -1;

    for (uint32_t i = 0; i < l->n; i++)
        if (l->v[i].waiting &&
            (best < 0 || l->v[i].pass < l->v[best].pass))
            best = (long)i;
    return best;
}

/* Every pass counted from the one last served, which non-empty lanes never
 * lie below; an empty lane's older pass becomes 0, as it would become the
 * pass last served when it fills anyway. */
static void renumber(struct lanes *l)
{
    uint64_t base = l->vtime;

    for (uint32_t i = 0; i < l->n; i++)
        l->v[i].pass = l->v[i].pass > base ? l->v[i].pass - base : 0;
    l->vtime = 0;
}

struct lane_waiter *lanes_pop(struct lanes *l)
{
    long i = next_lane(l);
    struct lane *ln;
    struct lane_waiter *w;

    if (i < 0)
        return NULL;
    ln = &l->v[i];
    w = TAILQ_FIRST(&ln->queue);
    lanes_remove(l, w);
    l->vtime = ln->pass;
    ln->pass += ln->stride;
    ln->granted++;
    if (l->vtime > PASS_RENUMBER)
        renumber(l);
    return w;
}

typedef unsigned __int128 u128;

/* Permits lane j (which has waiters, pass pj) gets before pass P is served
 * in lane `lane`: its passes pj, pj + s, ... below P, or up to P when it
 * wins the tie (an earlier lane). 128 bits: P may lie far ahead. */
static u128 served_before(const struct lane *ln, uint64_t pj, u128 p,
                          bool wins_tie)
{
    if (wins_tie)
        return p >= pj ? (p - pj) / ln->stride + 1 : 0;
    return p > pj ? (p - pj - 1) / ln->stride + 1 : 0;
}

uint64_t lanes_permits_until(const struct lanes *l, uint32_t lane)
{
    const struct lane *mine = &l->v[lane];
    uint64_t ahead = mine->waiting;
    u128 p, n;

    /* The newcomer is served at its lane's (ahead + 1)-th turn. */
    p = (u128)pass_of(l, mine) + (u128)ahead * mine->stride;
    n = (u128)ahead + 1;
    for (uint32_t j = 0; j < l->n; j++)
        if (j != lane && l->v[j].waiting)
            n += served_before(&l->v[j], l->v[j].pass, p, j < lane);
    return n > UINT64_MAX ? UINT64_MAX : (uint64_t)n;
}

uint64_t lanes_predict_ns(const struct lanes *l, uint32_t lane,
                          const struct tbucket *b, uint64_t now,
                          tbucket_accrue_fn fn, const void *arg)
{
    return tbucket_wait_ns(b, now, lanes_permits_until(l, lane), fn, arg);
}

bool lanes_try_now(const struct lanes *l, struct tbucket *b, uint64_t now)
{
    return lanes_idle(l) && tbucket_take(b, now);
}

struct lane_waiter *lanes_grant(struct lanes *l, struct tbucket *b,
                                uint64_t now)
{
    if (lanes_idle(l) || !tbucket_take(b, now))
        return NULL;
    return lanes_pop(l);
}
