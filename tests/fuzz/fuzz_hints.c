/* The reset-hint parsers of policies/backoff.h (and the RFC 8941 List walker
 * under RateLimit, policies/sfv.h). The input is up to three NUL-separated
 * header values, Retry-After, RateLimit and X-RateLimit-Reset (a missing one
 * is an absent header); bytes after a third NUL pick a retry block within
 * the config's bounds, for the delay the hint then becomes. */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "fuzz_check.h"
#include "policies/backoff.h"
#include "policies/sfv.h"

#define NOW_MS 1700000000000ull
#define DAY_MS (24ull * 3600 * 1000)
/* 10000-01-01T00:00:00Z: past any HTTP-date (four-digit years). */
#define DELAY_MAX_MS (253402300800ull * 1000)

/* The walker's promises: items in order, each closed once; keys non-empty,
 * inside the value, lowercase as RFC 8941 section 3.1.2 spells them. */
struct walk {
    const char *v;
    size_t len, item;
};

static bool key_char(char c, bool first)
{
    if ((c >= 'a' && c <= 'z') || c == '*')
        return true;
    return !first && ((c >= '0' && c <= '9') || c == '_' || c == '-' ||
                      c == '.');
}

static void on_param(void *arg, size_t item, const char *key, size_t klen,
                     bool is_int, int64_t value)
{
    struct walk *w = arg;

    FUZZ_CHECK(item == w->item, "item %zu after %zu", item, w->item);
    if (!key) {
        w->item++;
        return;
    }
    FUZZ_CHECK(klen > 0 && key >= w->v && key + klen <= w->v + w->len,
               "key outside the value");
    for (size_t i = 0; i < klen; i++)
        FUZZ_CHECK(key_char(key[i], i == 0), "key \"%.*s\"", (int)klen, key);
    FUZZ_CHECK(!is_int || (value > -1000000000000000 &&
                           value < 1000000000000000),
               "integer %lld beyond 15 digits", (long long)value);
}

static void check_walk(const char *v)
{
    struct walk w = {v, strlen(v), 0};

    sfv_list_walk(v, on_param, &w);
}

/* hint_pick is the three parsers in order, the first that succeeds. */
static void check_pick(const char *ra, const char *rl, const char *xr,
                       bool *has, uint64_t *hint)
{
    uint64_t want = 0;
    int rc = -1;

    *has = hint_pick(ra, rl, xr, NOW_MS, hint);
    if (ra)
        rc = hint_retry_after(ra, NOW_MS, &want);
    if (rc != 0 && rl)
        rc = hint_ratelimit_t(rl, &want);
    if (rc != 0 && xr)
        rc = hint_x_ratelimit_reset(xr, NOW_MS, &want);
    FUZZ_CHECK(*has == (rc == 0), "hint_pick %d, parsers %d", *has, rc);
    if (!*has)
        return;
    FUZZ_CHECK(*hint == want, "hint_pick %llu, parser %llu",
               (unsigned long long)*hint, (unsigned long long)want);
    FUZZ_CHECK(*hint <= DELAY_MAX_MS, "delay %llu ms",
               (unsigned long long)*hint);
}

/* Little-endian from the tail, zero once it runs out. */
static uint64_t take(const uint8_t **p, size_t *n, int bytes)
{
    uint64_t v = 0;

    for (int i = 0; i < bytes && *n; i++, (*p)++, (*n)--)
        v |= (uint64_t)**p << (8 * i);
    return v;
}

/* A retry block the config loader would accept (its rows in config/schema.c
 * and cfg_check_retry in config/checks.c: base, cap >= 1 ms, cap >= base,
 * multiplier 1..1000, max_attempts >= 1, max_delay 1 s..7 d). */
static struct sc_retry retry_from(const uint8_t *p, size_t n)
{
    struct sc_retry r = {0};

    r.base_ms = take(&p, &n, 8) % (30 * DAY_MS) + 1;
    r.cap_ms = r.base_ms + take(&p, &n, 8) % (365 * DAY_MS);
    r.multiplier = 1.0 + (double)(take(&p, &n, 4) % 999001) / 1000.0;
    r.max_attempts = (uint32_t)take(&p, &n, 2) + 1;
    r.max_delay_ms = 1000 + take(&p, &n, 8) % (7 * DAY_MS - 999);
    r.jitter = (enum sc_jitter)(take(&p, &n, 1) % 3);
    return r;
}

static void check_decide(const uint8_t *p, size_t n, bool has, uint64_t hint)
{
    struct sc_retry r = retry_from(p, n);
    uint32_t attempt = (uint32_t)take(&p, &n, 2);
    uint64_t rnd = take(&p, &n, 8), d = 0, b;
    enum retry_verdict v;

    b = backoff_delay_ms(&r, attempt, rnd);
    FUZZ_CHECK(b >= 1000 && b <= (r.cap_ms > 1000 ? r.cap_ms : 1000),
               "backoff %llu ms, cap %llu", (unsigned long long)b,
               (unsigned long long)r.cap_ms);
    v = backoff_retry_decide(&r, attempt, has, hint, rnd, &d);
    if (attempt >= r.max_attempts)
        FUZZ_CHECK(v == RETRY_DEAD_LETTER, "verdict %d", v);
    else if (v == RETRY_REQUEUE)
        FUZZ_CHECK(d >= 1 && d <= r.max_delay_ms, "delay %llu ms, max %llu",
                   (unsigned long long)d, (unsigned long long)r.max_delay_ms);
    else
        FUZZ_CHECK(v == RETRY_DELAY_EXCEEDS_MAX && has &&
                       hint > r.max_delay_ms, "verdict %d", v);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *buf = fuzz_strndup(data, size), *part[3] = {0}, *p;
    size_t used = 0;
    bool has;
    uint64_t hint = 0;

    if (!buf)
        return 0;
    /* buf[size] is the terminator: up to three values, then the tail. */
    for (p = buf; used < 3 && p <= buf + size; used++) {
        part[used] = p;
        p += strlen(p) + 1;
    }
    for (size_t i = 0; i < used; i++)
        check_walk(part[i]);
    check_pick(part[0], part[1], part[2], &has, &hint);
    if (p < buf + size)
        check_decide((const uint8_t *)p, (size_t)(buf + size - p), has, hint);
    free(buf);
    return 0;
}
