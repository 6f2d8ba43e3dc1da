#define _GNU_SOURCE
#include "policies/backoff.h"
#include "policies/sfv.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <string.h>
#include <time.h>

/* Seconds beyond this are treated as this: far past any max_delay (7 d), and
 * far from overflowing milliseconds. */
#define HINT_MAX_S (100ull * 365 * 24 * 3600)

static int parse_seconds(const char *s, uint64_t *out)
{
    uint64_t v = 0;

    if (!isdigit((unsigned char)*s))
        return -EINVAL;
    for (; isdigit((unsigned char)*s); s++)
        if (v < HINT_MAX_S)
            v = v * 10 + (uint64_t)(*s - '0');
    if (*s && !isspace((unsigned char)*s) && *s != ',' && *s != ';')
        return -EINVAL;
    *out = v > HINT_MAX_S ? HINT_MAX_S : v;
    return 0;
}

/* A whole header value of delay-seconds: the digits may be followed by
 * whitespace only. parse_seconds alone also stops at ',' ';' or a space,
 * which suits a parameter list but would read "5 x" or "5, 60" as 5. */
static int parse_seconds_value(const char *s, uint64_t *out)
{
    const char *end = s;

    while (isdigit((unsigned char)*end))
        end++;
    while (isspace((unsigned char)*end))
        end++;
    if (*end)
        return -EINVAL;
    return parse_seconds(s, out);
}

static int parse_http_date(const char *v, time_t *out)
{
    static const char *const formats[] = {
        "%a, %d %b %Y %H:%M:%S GMT", /* IMF-fixdate */
        "%A, %d-%b-%y %H:%M:%S GMT", /* RFC 850 */
        "%a %b %e %H:%M:%S %Y",      /* asctime */
    };

    for (size_t i = 0; i < sizeof formats / sizeof *formats; i++) {
        struct tm tm = {0};
        const char *end = strptime(v, formats[i], &tm);

        while (end && isspace((unsigned char)*end))
            end++;
        if (end && *end == '\0') {
            *out = timegm(&tm);
            return *out == (time_t)-1 ? -EINVAL : 0;
        }
    }
    return -EINVAL;
}

static uint64_t until_ms(uint64_t at_s, uint64_t now_wall_ms)
{
    uint64_t at_ms = at_s * 1000;
    return at_ms > now_wall_ms ? at_ms - now_wall_ms : 0;
}

int hint_retry_after(const char *v, uint64_t now_wall_ms, uint64_t *delay_ms)
{
    uint64_t s;
    time_t t;

    while (*v == ' ' || *v == '\t')
        v++;
    if (isdigit((unsigned char)*v)) {
        if (parse_seconds_value(v, &s) != 0)
            return -EINVAL;
        *delay_ms = s * 1000;
        return 0;
    }
    if (parse_http_date(v, &t) != 0 || t < 0)
        return -EINVAL;
    *delay_ms = until_ms((uint64_t)t, now_wall_ms);
    return 0;
}

/* Per item of a RateLimit list: its r (quota left) and t (reset seconds). */
struct rl_scan {
    bool has_r, has_t, found;
    int64_t r, t;
    uint64_t best;
};

static void rl_param(void *arg, size_t item, const char *key, size_t klen,
                     bool is_int, int64_t value)
{
    struct rl_scan *s = arg;

    if (!key) {
        /* Only an exhausted quota explains a 429; one with quota left (a
         * daily budget next to an empty per-second one) says nothing. */
        if (s->has_r && s->r == 0 && s->has_t && s->t >= 0) {
            uint64_t t = (uint64_t)s->t > HINT_MAX_S ? HINT_MAX_S : (uint64_t)s->t;
            s->found = true;
            s->best = t > s->best ? t : s->best;
        }
        s->has_r = s->has_t = false;
        return;
    }
    if (klen == 1 && key[0] == 'r' && is_int) {
        s->has_r = true;
        s->r = value;
    } else if (klen == 1 && key[0] == 't' && is_int) {
        s->has_t = true;
        s->t = value;
    }
}

int hint_ratelimit_t(const char *v, uint64_t *delay_ms)
{
    struct rl_scan s = {0};

    if (sfv_list_walk(v, rl_param, &s) != 0 || !s.found)
        return -EINVAL;
    *delay_ms = s.best * 1000;
    return 0;
}

int hint_x_ratelimit_reset(const char *v, uint64_t now_wall_ms,
                           uint64_t *delay_ms)
{
    uint64_t s;

    while (*v == ' ')
        v++;
    if (parse_seconds_value(v, &s) != 0)
        return -EINVAL;
    *delay_ms = s > 1000000000ull ? until_ms(s, now_wall_ms) : s * 1000;
    return 0;
}

bool hint_pick(const char *retry_after, const char *ratelimit,
               const char *x_reset, uint64_t now_wall_ms, uint64_t *delay_ms)
{
    if (retry_after && hint_retry_after(retry_after, now_wall_ms, delay_ms) == 0)
        return true;
    if (ratelimit && hint_ratelimit_t(ratelimit, delay_ms) == 0)
        return true;
    if (x_reset && hint_x_ratelimit_reset(x_reset, now_wall_ms, delay_ms) == 0)
        return true;
    return false;
}

/* Uniform in [1, n] (n >= 1). */
static uint64_t uniform_1(uint64_t n, uint64_t rnd)
{
    return n ? rnd % n + 1 : 0;
}

uint64_t backoff_delay_ms(const struct sc_retry *r, uint32_t attempt,
                          uint64_t rnd)
{
    double d = (double)r->base_ms *
               pow(r->multiplier, attempt > 0 ? (double)(attempt - 1) : 0.0);
    uint64_t ms = d >= (double)r->cap_ms || !isfinite(d) ? r->cap_ms : (uint64_t)d;

    switch (r->jitter) {
    case SC_JITTER_FULL:
        ms = uniform_1(ms, rnd);
        break;
    case SC_JITTER_EQUAL:
        ms = ms / 2 + uniform_1(ms - ms / 2, rnd);
        break;
    case SC_JITTER_NONE:
        break;
    }
    return ms < 1000 ? 1000 : ms;
}

uint64_t hint_delay_ms(uint64_t hint_ms, uint64_t rnd)
{
    uint64_t j = hint_ms / 10 > 1000 ? hint_ms / 10 : 1000;

    return hint_ms + rnd % (j + 1);
}

enum retry_verdict backoff_retry_decide(const struct sc_retry *r, uint32_t attempt,
                                bool has_hint, uint64_t hint_ms, uint64_t rnd,
                                uint64_t *delay_ms)
{
    uint64_t d;

    if (attempt >= r->max_attempts)
        return RETRY_DEAD_LETTER;
    if (has_hint && hint_ms > r->max_delay_ms)
        return RETRY_DELAY_EXCEEDS_MAX;
    d = has_hint ? hint_delay_ms(hint_ms, rnd) : backoff_delay_ms(r, attempt, rnd);
    if (d > r->max_delay_ms)
        d = r->max_delay_ms;
    *delay_ms = d ? d : 1;
    return RETRY_REQUEUE;
}
