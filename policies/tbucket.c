#include "policies/tbucket.h"

#include <math.h>
#include <stddef.h>

typedef unsigned __int128 u128;

#define RATE_MAX 1e9    /* tokens per second: config/units.c's fastest rate */

/* floor(rate * 2^32): never above the rate, so accrual never outruns it. At
 * least 1, so that even an absurdly slow rate keeps the arithmetic finite. */
static uint64_t rate_q_of(double rate)
{
    double q;

    if (!(rate > 0))
        return 1;
    if (rate > RATE_MAX)
        rate = RATE_MAX;
    q = floor(rate * 4294967296.0);
    return q < 1 ? 1 : (uint64_t)q;
}

static uint64_t cap_of(uint32_t capacity)
{
    return (uint64_t)(capacity ? capacity : 1) * TB_ONE;
}

/* The bucket's tokens and carried fraction at now, without changing it. */
struct settled {
    uint64_t tokens;
    uint32_t frac;
};

static struct settled settle_at(const struct tbucket *b, uint64_t now)
{
    struct settled s = {b->tokens, b->frac};
    uint64_t from = b->last > b->paused_until ? b->last : b->paused_until;
    u128 acc, room;

    if (now <= from || s.tokens >= b->cap)
        return s;
    acc = (u128)b->rate_q * (now - from) + s.frac;
    room = (u128)(b->cap - s.tokens) << 32;
    if (acc >= room) {
        /* Full: what would accrue beyond the capacity is lost, fraction
         * included. */
        s.tokens = b->cap;
        s.frac = 0;
        return s;
    }
    s.tokens += (uint64_t)(acc >> 32);
    s.frac = (uint32_t)acc;
    return s;
}

/* Brings the state to now; a now in the past counts as the last one seen. */
static void settle(struct tbucket *b, uint64_t now)
{
    struct settled s;

    if (now <= b->last)
        return;
    s = settle_at(b, now);
    b->tokens = s.tokens;
    b->frac = s.frac;
    b->last = now;
}

void tbucket_init(struct tbucket *b, double rate, uint32_t capacity,
                  uint64_t now)
{
    b->cap = cap_of(capacity);
    b->tokens = b->cap;
    b->frac = 0;
    b->last = now;
    b->paused_until = 0;
    b->rate = rate;
    b->rate_q = rate_q_of(rate);
}

void tbucket_set_rate(struct tbucket *b, uint64_t now, double rate)
{
    settle(b, now);
    b->rate = rate;
    b->rate_q = rate_q_of(rate);
}

void tbucket_set_capacity(struct tbucket *b, uint64_t now, uint32_t capacity)
{
    settle(b, now);
    b->cap = cap_of(capacity);
    if (b->tokens >= b->cap) {
        b->tokens = b->cap;
        b->frac = 0;
    }
}

void tbucket_carry(struct tbucket *b, const struct tbucket *from, uint64_t now)
{
    struct settled s = settle_at(from, now > from->last ? now : from->last);

    settle(b, now);
    b->tokens = s.tokens < b->cap ? s.tokens : b->cap;
    b->frac = 0;
    if (from->paused_until > b->paused_until)
        b->paused_until = from->paused_until;
}

void tbucket_set_level(struct tbucket *b, uint64_t now, uint32_t whole,
                       uint64_t next_ns)
{
    uint64_t one = tbucket_accrue_at(b->rate, TB_ONE), acc;

    settle(b, now);
    b->frac = 0;
    b->tokens = (uint64_t)whole * TB_ONE < b->cap ? (uint64_t)whole * TB_ONE : b->cap;
    if (whole || !next_ns)
        return;
    if (next_ns >= one) {
        /* Nothing accrues until one token's time before the next. */
        if (now + (next_ns - one) > b->paused_until)
            b->paused_until = now + (next_ns - one);
        return;
    }
    /* Part of a token already: what next_ns accrues is missing, rounded up. */
    acc = (uint64_t)(((u128)b->rate_q * next_ns + 0xffffffffu) >> 32);
    b->tokens = acc < TB_ONE ? TB_ONE - acc : 0;
}

bool tbucket_take(struct tbucket *b, uint64_t now)
{
    settle(b, now);
    if (b->tokens < TB_ONE)
        return false;
    b->tokens -= TB_ONE;
    return true;
}

double tbucket_tokens(const struct tbucket *b, uint64_t now)
{
    struct settled s = settle_at(b, now > b->last ? now : b->last);

    return (double)s.tokens / (double)TB_ONE;
}

/* ns in which `need` nano-tokens accrue at rate_q with `frac` carried. */
static uint64_t accrue_q(uint64_t rate_q, uint64_t need, uint32_t frac)
{
    u128 want = (u128)need << 32, t;

    if (want <= frac)
        return 0;
    t = (want - frac + rate_q - 1) / rate_q;
    return t > UINT64_MAX ? UINT64_MAX : (uint64_t)t;
}

uint64_t tbucket_accrue_at(double rate, uint64_t nano_tokens)
{
    if (!(rate > 0))
        return UINT64_MAX;
    return accrue_q(rate_q_of(rate), nano_tokens, 0);
}

static uint64_t add_sat(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

uint64_t tbucket_wait_ns(const struct tbucket *b, uint64_t now, uint64_t n,
                         tbucket_accrue_fn fn, const void *arg)
{
    uint64_t at = now > b->last ? now : b->last;
    struct settled s = settle_at(b, at);
    uint64_t from = at > b->paused_until ? at : b->paused_until;
    uint64_t need, wait;

    if (n > UINT64_MAX / TB_ONE)
        return UINT64_MAX;
    if (s.tokens >= n * TB_ONE)
        return 0;
    need = n * TB_ONE - s.tokens;
    wait = fn ? fn(arg, from, from > at, need) : accrue_q(b->rate_q, need, s.frac);
    return add_sat(from - now, wait);
}

uint64_t tbucket_next_ns(const struct tbucket *b, uint64_t now)
{
    return tbucket_wait_ns(b, now, 1, NULL, NULL);
}

void tbucket_empty(struct tbucket *b, uint64_t now)
{
    settle(b, now);
    b->tokens = 0;
    b->frac = 0;
}

void tbucket_pause_until(struct tbucket *b, uint64_t now, uint64_t until)
{
    tbucket_empty(b, now);
    if (until > b->paused_until)
        b->paused_until = until;
}

void tbucket_top_up(struct tbucket *b, uint64_t now)
{
    settle(b, now);
    if (b->paused_until > b->last || b->tokens >= TB_ONE)
        return;
    /* The capacity is never below one token. */
    b->tokens = TB_ONE;
    b->frac = 0;
}

void tbucket_resume(struct tbucket *b, uint64_t now)
{
    settle(b, now);
    if (b->paused_until > b->last)
        b->paused_until = b->last;
}
