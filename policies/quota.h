/* Following the quota a partner advertises (a policy's `quota: {follow:
 * true}`, docs/configuration.md): the rules, pure. In: one upstream
 * response's quota headers, the clocks, the policy's requests in flight and
 * its configured numbers. Out: a small state that says, at any moment, the
 * effective rate, the bucket's capacity, when they next change, and how long
 * a number of permits takes to accrue (a coming reset raises the rate).
 *
 * Three header styles, whose items count together:
 *   the draft (draft-ietf-httpapi-ratelimit-headers), two RFC 8941 Lists:
 *     RateLimit-Policy: "name";q=100;w=60     RateLimit: "name";r=40;t=30
 *     (a RateLimit item takes q and w from the policy item of its name);
 *   the older draft: RateLimit-Limit: 100 (a `w` parameter on its first
 *     member gives the window), RateLimit-Remaining: 40, RateLimit-Reset: 30;
 *   the common X-RateLimit-Limit / -Remaining / -Reset, without a window,
 *     Reset a Unix time when above 10^9 (decimals allowed), else seconds.
 * An item needs its remaining r and its reset t; q and w are optional.
 * Anything malformed or absurd (more than 15 digits, a reset or a window
 * beyond QUOTA_MAX_RESET_S, a window of 0, a draft quota whose unit `qu` is
 * not requests) is ignored, alone, and counted.
 *
 * Until an item's moment m (the response's arrival + t) it allows
 * (r - f) / (s - now) permits per second, f being the policy's requests in
 * flight when the response came (its own excluded): what remains, spent
 * evenly by s, which is m - 1 s when the reset is in whole seconds (every
 * style but an X-RateLimit-Reset Unix time with a fraction: it may be up
 * to 1 s after the partner's true reset) and the answer came more than a
 * second before m, else m; from s to m nothing more (the rate is 0 there,
 * as after r = 0: min_rate would start one past what remains; a fleet's
 * bucket holds it as a pause, quota_resume_at); after m, q / w when both
 * are known, else the configured rate. The effective rate is min(rate,
 * max(min_rate, the smallest allowance)) outside such a gap; the capacity
 * min(burst, the smallest r before its moment, q after it when known), at
 * least 1.
 *
 * Top-ups: the bucket is raised to one whole token (tbucket_top_up), when
 * it holds less and no pause runs past that moment, and when the partner
 * allows one there (every item whose moment is later still has r - f > 0,
 * and no item past its moment has a limit q of 0), at two moments of a
 * partner's window:
 *   - at an item's reset moment m: accrual alone would pay for the window's
 *     first token one interval after m, so a window spent out (an r = 0
 *     pause until m) would lose its first permit;
 *   - at an answer that leaves one permit (the smallest r - f of the items
 *     still running is 1): spent evenly until m, the last permit would come
 *     at m itself, and m, counted from the answer's arrival, is after the
 *     partner's reset by the answer's way back at least (by up to 1 s more
 *     with whole seconds), so that permit would fall into the next window
 *     and the window would lose it. It goes at once instead; its own answer
 *     says r = 0 (or r - f reaches 0), so this happens once per window.
 * One token, never a full bucket: after an answer, 1 + (r - f) minus a
 * fraction accrues before m, so at most r - f whole permits start before
 * it, what the partner said remains; at a reset with q and w known, at most
 * q start in [m, m + w). A full bucket (burst) would allow burst - 1 more
 * before any answer says otherwise. So the bound is: in any interval, at
 * most the capacity at its start, plus the effective rate integrated over
 * it, plus one per top-up within it (after its start). Times are
 * nanoseconds of a monotonic clock. */
#ifndef SLUICE_POLICIES_QUOTA_H
#define SLUICE_POLICIES_QUOTA_H

#include <stdbool.h>
#include <stdint.h>

#include "policies/tbucket.h"

#define QUOTA_ITEMS_MAX 8      /* items kept per response; more are ignored */
#define QUOTA_NAME_MAX 24      /* a draft item's name as shown, cut */
#define QUOTA_MAX_RESET_S (400ull * 24 * 3600)  /* beyond: absurd */
#define QUOTA_MAX_NUMBER 999999999999999ull     /* 15 digits, as RFC 8941 */

/* The quota headers of one response; NULL = absent. */
struct quota_headers {
    const char *policy;       /* RateLimit-Policy */
    const char *ratelimit;    /* RateLimit */
    const char *limit;        /* RateLimit-Limit */
    const char *remaining;    /* RateLimit-Remaining */
    const char *reset;        /* RateLimit-Reset */
    const char *x_limit;      /* X-RateLimit-Limit */
    const char *x_remaining;  /* X-RateLimit-Remaining */
    const char *x_reset;      /* X-RateLimit-Reset */
};

/* Fills h by asking get for each header by name (NULL: absent). */
typedef const char *(*quota_header_fn)(void *arg, const char *name);
void quota_headers_get(struct quota_headers *h, quota_header_fn get, void *arg);

enum quota_style { QUOTA_DRAFT = 0, QUOTA_OLD_DRAFT, QUOTA_X };

struct quota_item {
    uint64_t id;              /* style and name: the same item in another
                                 response */
    uint64_t q, r;            /* limit (when has_q), remaining */
    uint64_t moment;          /* its reset, ns */
    uint64_t spend_by;        /* what remains is spent by then, ns: moment,
                                 or 1 s before it (whole_s) */
    double allow;             /* permits per second it allows before
                                 spend_by (none from there to moment) */
    uint32_t w;               /* window, seconds (when has_w) */
    uint8_t style;            /* enum quota_style */
    bool has_q, has_w;
    bool whole_s;             /* its reset in whole seconds */
    char name[QUOTA_NAME_MAX]; /* the draft's name (cut); "" in other styles */
};

/* One policy's (or one partition's) advertised state. No allocation. */
struct quota {
    double rate, min_rate;    /* configured: the ceiling and the floor */
    uint32_t burst;
    uint32_t n;               /* items; 0 = nothing advertised (yet) */
    uint64_t at;              /* ns: the latest response with items */
    uint64_t at_wall_ms;      /* the same, Unix ms, for GET /policies */
    struct quota_item items[QUOTA_ITEMS_MAX];
};

/* What one response did. */
struct quota_result {
    uint32_t items;           /* items read (0: the state is unchanged) */
    uint32_t ignored;         /* items and headers ignored as malformed or
                                 absurd: count and log them */
    uint64_t pause_until;     /* an item with r = 0: pause the policy until
                                 then, ns (the caller caps it by max_delay);
                                 0 = no pause */
    bool top_up;              /* one permit left: top the bucket up to one
                                 token now (tbucket_top_up, rule above) */
};

/* Nothing advertised: the rate is rate. min_rate <= rate, burst >= 1. */
void quota_init(struct quota *q, double rate, double min_rate, uint32_t burst);

/* Reads one response (arrived at now, now_wall_ms) of the policy, whatever
 * its status; with at least one item its items replace the state, keeping
 * per item the earlier moment of one window (the same item naming a moment
 * less than 1 s after the kept one, before that one has passed). inflight:
 * the policy's requests sent upstream and not answered, this one excluded.
 * Call quota_bucket_sync before and after, so that the bucket accrued at
 * the old numbers until now. */
void quota_update(struct quota *q, const struct quota_headers *h, uint64_t now,
                  uint64_t now_wall_ms, uint32_t inflight,
                  struct quota_result *res);

/* The effective rate at t (permits per second), within [min_rate, rate]. */
double quota_rate(const struct quota *q, uint64_t t);

/* The bucket's capacity at t: 1 .. burst. */
uint32_t quota_capacity(const struct quota *q, uint64_t t);

/* True while advertised numbers hold the rate below the configured one
 * (GET /policies' `source: partner`). */
bool quota_limits(const struct quota *q, uint64_t t);

/* The first moment after t at which the rate or the capacity changes (an
 * item's reset); UINT64_MAX when none is coming. */
uint64_t quota_next_change(const struct quota *q, uint64_t t);

/* t, or when t lies where an item's remaining permits are spent already
 * (after its spend_by, before its reset: the rate is 0 there), the first
 * moment after t that no item holds so: when permits may start again. */
uint64_t quota_resume_at(const struct quota *q, uint64_t t);

/* The Unix ms of the newest news in q at now: its latest response with
 * items, or a reset moment passed since (which changes the numbers as an
 * answer does); 0 while nothing was advertised. A fleet's bucket keeps the
 * numbers of the newest news any sidecar had. */
uint64_t quota_news_wall_ms(const struct quota *q, uint64_t now);

/* The Unix ms of the monotonic moment t, by q's latest response with
 * items (0 while nothing was advertised). */
uint64_t quota_wall_ms_at(const struct quota *q, uint64_t t);

/* True when the bucket may be topped up to one token at the reset moment
 * m (the rule above): no item after m is spent, none past it has q = 0. */
bool quota_reset_tops_up(const struct quota *q, uint64_t m);

/* ns from `from` (no pause running after it) in which nano_tokens come to
 * waiters that take each whole token as it comes: accrual at the effective
 * rate, its changes at coming resets included, and each reset's top-up; a
 * tbucket_accrue_fn for tbucket_wait_ns, arg a const struct quota *. */
uint64_t quota_accrue_ns(const void *q, uint64_t from, bool pause_end,
                         uint64_t nano_tokens);

/* Brings b's rate and capacity to the quota's up to now, changing them at
 * each reset passed since b was last settled, and topping b up there as the
 * rule above says, so that b accrued exactly the effective rate in between. */
void quota_bucket_sync(const struct quota *q, struct tbucket *b, uint64_t now);

#endif
