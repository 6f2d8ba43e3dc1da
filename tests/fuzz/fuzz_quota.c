/* The quota rules of policies/quota.h (and the RFC 8941 List visitor under
 * them, policies/sfv.h). The input is up to eight NUL-separated header
 * values, in the order of struct quota_headers (RateLimit-Policy,
 * RateLimit, RateLimit-Limit, -Remaining, -Reset, X-RateLimit-Limit,
 * -Remaining, -Reset; a missing one is an absent header); bytes after an
 * eighth NUL choose the configured numbers within the config's bounds, the
 * requests in flight and the time of a second response with the same
 * headers (the same-window rule). */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "fuzz_check.h"
#include "policies/quota.h"
#include "policies/tbucket.h"

#define SEC 1000000000ull
#define NOW 1000000000000000ull        /* ns of a monotonic clock */
#define WALL 1767225600000ull          /* Unix ms */
#define N_HEADERS 8

static uint64_t take(const uint8_t **p, size_t *n, int bytes)
{
    uint64_t v = 0;

    for (int i = 0; i < bytes && *n; i++, (*p)++, (*n)--)
        v |= (uint64_t)**p << (8 * i);
    return v;
}

/* Numbers a loaded config could hold: rate 0.001/s .. 100000/s, min_rate
 * in (0, rate], burst 1 .. 1000. */
struct conf {
    double rate, min_rate;
    uint32_t burst, inflight;
    uint64_t later;   /* ns after the first response, the second comes */
};

static struct conf conf_from(const uint8_t *p, size_t n)
{
    struct conf c;

    c.rate = (double)(take(&p, &n, 4) % 100000000 + 1) / 1000.0;
    c.min_rate = c.rate * (double)(take(&p, &n, 2) % 1000 + 1) / 1000.0;
    c.burst = (uint32_t)(take(&p, &n, 2) % 1000) + 1;
    c.inflight = (uint32_t)take(&p, &n, 2);
    c.later = take(&p, &n, 4) * 1000000ull;   /* up to ~50 days */
    return c;
}

static void check_item(const struct quota_item *it, uint64_t now)
{
    FUZZ_CHECK(memchr(it->name, '\0', sizeof it->name), "name not ended");
    FUZZ_CHECK(it->style <= QUOTA_X, "style %u", it->style);
    FUZZ_CHECK(it->style == QUOTA_DRAFT || !it->name[0], "a name in style %u",
               it->style);
    FUZZ_CHECK(it->r <= QUOTA_MAX_NUMBER, "r %llu", (unsigned long long)it->r);
    FUZZ_CHECK(!it->has_q || it->q <= QUOTA_MAX_NUMBER, "q %llu",
               (unsigned long long)it->q);
    FUZZ_CHECK(!it->has_w || (it->w >= 1 && it->w <= QUOTA_MAX_RESET_S),
               "w %u", it->w);
    FUZZ_CHECK(!it->has_w || it->style != QUOTA_X, "a window in the X- style");
    FUZZ_CHECK(it->moment >= now && it->moment <= now + QUOTA_MAX_RESET_S * SEC,
               "moment %lld ns away", (long long)(it->moment - now));
    FUZZ_CHECK(isfinite(it->allow) && it->allow >= 0, "allow %g", it->allow);
}

static void check_result(const struct quota *q, const struct quota_result *res,
                         uint64_t now, uint64_t before_at)
{
    bool paused = false;

    FUZZ_CHECK(res->items <= QUOTA_ITEMS_MAX, "%u items", res->items);
    if (!res->items) {
        FUZZ_CHECK(res->pause_until == 0, "a pause without items");
        FUZZ_CHECK(q->at == before_at, "the state changed without items");
        return;
    }
    FUZZ_CHECK(q->n == res->items && q->at == now, "n %u, items %u", q->n,
               res->items);
    for (uint32_t i = 0; i < q->n; i++) {
        check_item(&q->items[i], now);
        paused |= q->items[i].r == 0 && q->items[i].moment == res->pause_until;
    }
    FUZZ_CHECK(res->pause_until == 0 || (res->pause_until > now && paused),
               "pause until %llu", (unsigned long long)res->pause_until);
}

/* The rule's promises at a moment t. */
static void check_at(const struct quota *q, uint64_t t)
{
    double r = quota_rate(q, t);
    uint32_t cap = quota_capacity(q, t);
    uint64_t next = quota_next_change(q, t);
    uint64_t resume = quota_resume_at(q, t);

    /* 0 exactly where a spent window waits for its reset, and permits go
     * again where that wait ends. */
    FUZZ_CHECK(resume >= t, "resume %llu before %llu", (unsigned long long)resume,
               (unsigned long long)t);
    FUZZ_CHECK(resume > t ? r == 0 : r >= q->min_rate && r <= q->rate,
               "rate %g not in [%g, %g] (resume in %llu ns)", r, q->min_rate, q->rate,
               (unsigned long long)(resume - t));
    FUZZ_CHECK(quota_resume_at(q, resume) == resume, "still waiting where they resume");
    FUZZ_CHECK(cap >= 1 && cap <= q->burst, "capacity %u, burst %u", cap,
               q->burst);
    FUZZ_CHECK(next > t, "next change %llu not after %llu",
               (unsigned long long)next, (unsigned long long)t);
    FUZZ_CHECK(quota_limits(q, t) == (r < q->rate), "limits");
}

/* Reset moments in (from, to]: each may top the bucket up by one token. */
static uint64_t resets_within(const struct quota *q, uint64_t from, uint64_t to)
{
    uint64_t n = 0, t = from;

    while ((t = quota_next_change(q, t)) <= to)
        n++;
    return n;
}

/* Accrual: none for nothing, monotone in the tokens, never faster than the
 * configured rate plus one token per reset passed (the top-ups). */
static void check_accrual(const struct quota *q, uint64_t from)
{
    uint64_t prev = quota_accrue_ns(q, from, false, 0);

    FUZZ_CHECK(prev == 0, "0 tokens take %llu ns", (unsigned long long)prev);
    for (uint64_t k = 1; k <= 64; k *= 4) {
        uint64_t ns = quota_accrue_ns(q, from, false, k * TB_ONE);
        double paid = (double)k;

        if (ns <= UINT64_MAX - from)
            paid -= (double)resets_within(q, from, from + ns);
        FUZZ_CHECK(ns >= prev, "%llu tokens sooner than fewer",
                   (unsigned long long)k);
        FUZZ_CHECK((double)ns + 2 >= paid * 1e9 / q->rate,
                   "%llu tokens in %llu ns at most %g/s", (unsigned long long)k,
                   (unsigned long long)ns, q->rate);
        prev = ns;
    }
}

static void check_bucket(const struct quota *q, struct tbucket *b, uint64_t now)
{
    quota_bucket_sync(q, b, now);
    FUZZ_CHECK(tbucket_tokens(b, now) <= (double)quota_capacity(q, now) + 1e-9,
               "tokens %g above the capacity %u", tbucket_tokens(b, now),
               quota_capacity(q, now));
}

static void check_state(const struct quota *q, struct tbucket *b, uint64_t now)
{
    check_at(q, now);
    for (uint32_t i = 0; i < q->n; i++) {
        check_at(q, q->items[i].moment);
        if (q->items[i].moment > now)
            check_at(q, q->items[i].moment - 1);
    }
    check_accrual(q, now);
    check_bucket(q, b, now);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *buf = fuzz_strndup(data, size), *p;
    const char *part[N_HEADERS] = {0};
    struct quota_headers h;
    struct quota_result res;
    struct quota q;
    struct tbucket b;
    struct conf c;
    size_t used = 0;
    uint64_t at;

    if (!buf)
        return 0;
    for (p = buf; used < N_HEADERS && p <= buf + size; used++) {
        part[used] = p;
        p += strlen(p) + 1;
    }
    c = conf_from(p < buf + size ? (const uint8_t *)p : NULL,
                  p < buf + size ? (size_t)(buf + size - p) : 0);
    h = (struct quota_headers){part[0], part[1], part[2], part[3],
                               part[4], part[5], part[6], part[7]};
    quota_init(&q, c.rate, c.min_rate, c.burst);
    tbucket_init(&b, c.rate, c.burst, NOW);
    quota_update(&q, &h, NOW, WALL, c.inflight, &res);
    check_result(&q, &res, NOW, 0);
    check_state(&q, &b, NOW);
    at = q.at;
    quota_update(&q, &h, NOW + c.later, WALL + c.later / 1000000, c.inflight,
                 &res);
    check_result(&q, &res, NOW + c.later, at);
    check_state(&q, &b, NOW + c.later);
    free(buf);
    return 0;
}
