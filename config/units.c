/* The value syntaxes of sidecar.yaml (docs/contract.md §2). Numbers are read by
 * hand rather than with strtod/strtoull: those accept signs, blanks, hex,
 * exponents, "inf" and "nan", none of which belong in a config value. */
#include "config/units.h"
#include "config/config_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct unit {
    const char *suffix;
    uint64_t mult;
    bool whole;      /* the number must have no fraction */
};

static const struct unit duration_units[] = {
    {"ms", 1, false},       {"s", 1000, false},         {"m", 60000, false},
    {"h", 3600000, false},  {"d", 86400000, false},     {NULL, 0, false},
};

/* k/K and KB/MB/GB are powers of ten, as their SI names say; KiB/MiB/GiB are
 * powers of two. Multipliers stay <= 2^30 so a 9-digit fraction times the
 * multiplier fits in 64 bits. */
static const struct unit size_units[] = {
    {"", 1, true},          {"B", 1, true},
    {"KiB", 1u << 10, false}, {"MiB", 1u << 20, false}, {"GiB", 1u << 30, false},
    {"k", 1000, false},     {"K", 1000, false},       {"kB", 1000, false},
    {"KB", 1000, false},    {"MB", 1000000, false},   {"GB", 1000000000, false},
    {NULL, 0, false},
};

static const struct unit rate_units[] = {
    {"/s", 1, false}, {"/m", 60, false}, {"/h", 3600, false},
    {"/d", 86400, false}, {NULL, 0, false},
};

#define RATE_MIN 1e-6   /* slower than this, a GCRA interval overflows soon */
#define RATE_MAX 1e9    /* faster, the interval is below a nanosecond */

static int fail(char *why, size_t wlen, int rc, const char *msg)
{
    if (why && wlen)
        snprintf(why, wlen, "%s", msg);
    return rc;
}

/* A decimal as written: whole part and at most 9 fractional digits (further
 * digits are below every unit's resolution and are dropped). */
struct decimal {
    uint64_t whole;
    uint64_t frac;
    uint64_t scale;  /* 10^(fractional digits kept) */
};

static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* Reads [0-9]+(\.[0-9]+)? at *p and advances it. -EINVAL when there is no
 * number there, -ERANGE when the whole part overflows 64 bits. */
static int read_decimal(const char **p, struct decimal *d)
{
    const char *s = *p;

    *d = (struct decimal){0, 0, 1};
    if (!is_digit(*s))
        return -EINVAL;
    for (; is_digit(*s); s++)
        if (__builtin_mul_overflow(d->whole, 10, &d->whole) ||
            __builtin_add_overflow(d->whole, (uint64_t)(*s - '0'), &d->whole))
            return -ERANGE;
    if (*s == '.') {
        if (!is_digit(*++s))
            return -EINVAL;
        for (; is_digit(*s); s++) {
            if (d->scale < 1000000000) {
                d->frac = d->frac * 10 + (uint64_t)(*s - '0');
                d->scale *= 10;
            }
        }
    }
    *p = s;
    return 0;
}

/* whole * mult + frac * mult / scale, rounded to the nearest unit. */
static int scale_decimal(const struct decimal *d, uint64_t mult, uint64_t *out)
{
    uint64_t w, f;

    if (__builtin_mul_overflow(d->whole, mult, &w))
        return -ERANGE;
    f = (d->frac * mult + d->scale / 2) / d->scale;
    if (__builtin_add_overflow(w, f, out))
        return -ERANGE;
    return 0;
}

static const struct unit *find_unit(const struct unit *units, const char *s)
{
    for (; units->suffix; units++)
        if (strcmp(units->suffix, s) == 0)
            return units;
    return NULL;
}

/* Number + unit suffix -> integer in base units. */
static int parse_scaled(const char *s, const struct unit *units,
                        uint64_t *out, const char *expect,
                        char *why, size_t wlen)
{
    const struct unit *u;
    struct decimal d;
    const char *p = s;
    int rc;

    if (!s)
        return fail(why, wlen, -EINVAL, expect);
    rc = read_decimal(&p, &d);
    if (rc == -ERANGE)
        return fail(why, wlen, rc, "too large");
    if (rc)
        return fail(why, wlen, rc, expect);
    u = find_unit(units, p);
    if (!u || (u->whole && d.scale > 1))
        return fail(why, wlen, -EINVAL, expect);
    if (scale_decimal(&d, u->mult, out))
        return fail(why, wlen, -ERANGE, "too large");
    return 0;
}

/* The duration unit at *p, longest suffix first ("ms" before "m"; the
 * table lists it first), advancing *p past it. NULL when none is there. */
static const struct unit *read_duration_unit(const char **p)
{
    for (const struct unit *u = duration_units; u->suffix; u++) {
        size_t n = strlen(u->suffix);

        if (strncmp(*p, u->suffix, n) == 0) {
            *p += n;
            return u;
        }
    }
    return NULL;
}

/* A sum of parts, each a number and a unit, as Go's time.ParseDuration and
 * Prometheus write them ("1m30s", "1h5m", "2s500ms"). Units must get smaller
 * from left to right, each at most once, and only the last part may have a
 * fraction: "30m1h", "1s1s" and "1.5h30m" are typos more often than not. */
int units_parse_duration(const char *s, uint64_t *ms, char *why, size_t wlen)
{
    static const char expect[] = "expected a number followed by ms, s, m, h or d";
    uint64_t total = 0, prev_mult = UINT64_MAX, v;
    const char *p = s;
    bool fraction = false;

    if (s && strcmp(s, "0") == 0) {
        *ms = 0;
        return 0;
    }
    if (!s || !*s)
        return fail(why, wlen, -EINVAL, expect);
    while (*p) {
        const struct unit *u;
        struct decimal d;
        int rc = read_decimal(&p, &d);

        if (rc == -ERANGE)
            return fail(why, wlen, rc, "too large");
        if (rc || !(u = read_duration_unit(&p)))
            return fail(why, wlen, -EINVAL, expect);
        if (u->mult >= prev_mult)
            return fail(why, wlen, -EINVAL, "units must get smaller from left to "
                        "right, each at most once, as in 1h30m");
        if (fraction)
            return fail(why, wlen, -EINVAL, "only the last part may have a "
                        "fraction, as in 1m30.5s");
        if (scale_decimal(&d, u->mult, &v) || __builtin_add_overflow(total, v, &total))
            return fail(why, wlen, -ERANGE, "too large");
        fraction = d.scale > 1;
        prev_mult = u->mult;
    }
    *ms = total;
    return 0;
}

int units_parse_size(const char *s, uint64_t *bytes, char *why, size_t wlen)
{
    uint64_t v;
    int rc;

    rc = parse_scaled(s, size_units, &v,
                      "expected a whole number of bytes, or a number "
                      "followed by KiB, MiB, GiB, KB, MB or GB",
                      why, wlen);
    if (rc == 0)
        *bytes = v;
    return rc;
}

int units_parse_rate(const char *s, double *per_sec, char *why, size_t wlen)
{
    static const char expect[] =
        "expected a number of events per s, m, h or d, such as 10/s";
    const struct unit *u;
    struct decimal d;
    const char *p = s;
    double v;
    int rc;

    if (!s)
        return fail(why, wlen, -EINVAL, expect);
    if (*p == '-' && is_digit(p[1]))
        return fail(why, wlen, -ERANGE, "must be greater than 0");
    rc = read_decimal(&p, &d);
    if (rc == -ERANGE)
        return fail(why, wlen, rc, "too large: the fastest rate is "
                    "1000000000/s");
    if (rc || !(u = find_unit(rate_units, p)))
        return fail(why, wlen, -EINVAL, expect);
    v = ((double)d.whole + (double)d.frac / (double)d.scale) / (double)u->mult;
    if (v <= 0)
        return fail(why, wlen, -ERANGE, "must be greater than 0");
    if (v < RATE_MIN)
        return fail(why, wlen, -ERANGE,
                    "too small: the slowest rate is 0.000001/s");
    if (v > RATE_MAX)
        return fail(why, wlen, -ERANGE,
                    "too large: the fastest rate is 1000000000/s");
    *per_sec = v;
    return 0;
}

static bool is_name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c) ||
           c == '-' || c == '.' || c == '_';
}

/* A DNS name or dotted IPv4 (which then must be a valid one), or, when v6,
 * the inside of [brackets]. */
static int check_host(const char *h, bool v6, char *why, size_t wlen)
{
    unsigned char addr[16];
    bool dotted = true;
    size_t i;

    if (v6)
        return inet_pton(AF_INET6, h, addr) == 1
                   ? 0
                   : fail(why, wlen, -EINVAL, "invalid IPv6 address");
    if (!*h || strlen(h) > 253)
        return fail(why, wlen, -EINVAL, "expected a host name or address");
    for (i = 0; h[i]; i++) {
        if (!is_name_char(h[i]))
            return fail(why, wlen, -EINVAL,
                        "invalid character in host name");
        if (!is_digit(h[i]) && h[i] != '.')
            dotted = false;
    }
    if (dotted && inet_pton(AF_INET, h, addr) != 1)
        return fail(why, wlen, -EINVAL, "invalid IPv4 address");
    return 0;
}

static int parse_port(const char *s, size_t n, int *port, char *why,
                      size_t wlen)
{
    long v = 0;
    size_t i;

    if (n == 0 || n > 5)
        return fail(why, wlen, -EINVAL, "expected a port from 0 to 65535");
    for (i = 0; i < n; i++) {
        if (!is_digit(s[i]))
            return fail(why, wlen, -EINVAL,
                        "expected a port from 0 to 65535");
        v = v * 10 + (s[i] - '0');
    }
    if (v > 65535)
        return fail(why, wlen, -ERANGE, "port above 65535");
    *port = (int)v;
    return 0;
}

/* Splits s[0..n) into host text and port text. */
static int split_authority(const char *s, size_t n, const char **h,
                           size_t *hl, const char **p, size_t *pl, bool *v6,
                           char *why, size_t wlen)
{
    const char *end = s + n, *colon;

    *v6 = n > 0 && s[0] == '[';
    if (*v6) {
        const char *close = memchr(s, ']', n);
        if (!close || (close + 1 < end && close[1] != ':'))
            return fail(why, wlen, -EINVAL, "expected [IPv6] or [IPv6]:port");
        *h = s + 1;
        *hl = (size_t)(close - s - 1);
        colon = close + 1 < end ? close + 1 : NULL;
    } else {
        colon = memchr(s, ':', n);
        if (colon && memchr(colon + 1, ':', (size_t)(end - colon - 1)))
            return fail(why, wlen, -EINVAL,
                        "an IPv6 address needs brackets, as in [::1]:8080");
        *h = s;
        *hl = colon ? (size_t)(colon - s) : n;
    }
    *p = colon ? colon + 1 : NULL;
    *pl = colon ? (size_t)(end - colon - 1) : 0;
    return 0;
}

int units_parse_authority(const char *s, size_t n, char **host, int *port,
                          char *why, size_t wlen)
{
    const char *h, *p;
    size_t hl, pl;
    bool v6;
    char *copy;
    int rc, pt = -1;

    rc = split_authority(s, n, &h, &hl, &p, &pl, &v6, why, wlen);
    if (rc == 0 && p)
        rc = parse_port(p, pl, &pt, why, wlen);
    if (rc)
        return rc;
    copy = strndup(h, hl);
    if (!copy)
        return fail(why, wlen, -ENOMEM, "out of memory");
    rc = check_host(copy, v6, why, wlen);
    if (rc) {
        free(copy);
        return rc;
    }
    *host = copy;
    *port = pt;
    return 0;
}

int units_parse_hostport(const char *s, char **host, uint16_t *port,
                         char *why, size_t wlen)
{
    char *h = NULL;
    int p, rc;

    if (!s || !*s)
        return fail(why, wlen, -EINVAL, "expected host:port or [IPv6]:port");
    rc = units_parse_authority(s, strlen(s), &h, &p, why, wlen);
    if (rc)
        return rc;
    if (p < 0) {
        free(h);
        return fail(why, wlen, -EINVAL, "expected host:port or [IPv6]:port");
    }
    *host = h;
    *port = (uint16_t)p;
    return 0;
}

bool units_is_token(const char *s)
{
    static const char extra[] = "!#$%&'*+-.^_`|~";

    if (!s || !*s)
        return false;
    for (; *s; s++)
        if (!is_name_char(*s) && !strchr(extra, *s))
            return false;
    return true;
}

void units_format_duration(uint64_t ms, char *buf, size_t len)
{
    int i;

    if (ms == 0) {
        snprintf(buf, len, "0s");
        return;
    }
    for (i = 4; i > 0; i--)
        if (ms % duration_units[i].mult == 0)
            break;
    snprintf(buf, len, "%" PRIu64 "%s", ms / duration_units[i].mult,
             duration_units[i].suffix);
}

void units_format_size(uint64_t bytes, char *buf, size_t len)
{
    static const struct unit *const binary[] = {
        &size_units[4], &size_units[3], &size_units[2],
    };
    size_t i;

    for (i = 0; bytes && i < 3; i++) {
        if (bytes % binary[i]->mult == 0) {
            snprintf(buf, len, "%" PRIu64 "%s", bytes / binary[i]->mult,
                     binary[i]->suffix);
            return;
        }
    }
    snprintf(buf, len, "%" PRIu64, bytes);
}

/* Short decimal per second when it reads back exactly ("0.5/s"), else a
 * whole count per larger unit ("20/m"), else all the digits per second. */
void units_format_rate(double per_sec, char *buf, size_t len)
{
    char tmp[64];
    size_t i;

    snprintf(tmp, sizeof tmp, "%.6f", per_sec);
    if (strtod(tmp, NULL) == per_sec) {
        char *end = tmp + strlen(tmp);
        while (end[-1] == '0')
            *--end = '\0';
        if (end[-1] == '.')
            end[-1] = '\0';
        snprintf(buf, len, "%s/s", tmp);
        return;
    }
    for (i = 1; rate_units[i].suffix; i++) {
        double n = per_sec * (double)rate_units[i].mult;
        if (n >= 1 && fabs(n - nearbyint(n)) < 1e-9 * n) {
            snprintf(buf, len, "%.0f%s", nearbyint(n), rate_units[i].suffix);
            return;
        }
    }
    snprintf(buf, len, "%.17g/s", per_sec);
}
