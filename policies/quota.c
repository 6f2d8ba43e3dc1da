#include "policies/quota.h"
#include "policies/sfv.h"

#include <ctype.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#define SEC 1000000000ull
#define UNIX_FROM 1000000000ull   /* an X-RateLimit-Reset above: Unix time */

/* ---- header names ---------------------------------------------------- */

void quota_headers_get(struct quota_headers *h, quota_header_fn get, void *arg)
{
    h->policy = get(arg, "RateLimit-Policy");
    h->ratelimit = get(arg, "RateLimit");
    h->limit = get(arg, "RateLimit-Limit");
    h->remaining = get(arg, "RateLimit-Remaining");
    h->reset = get(arg, "RateLimit-Reset");
    h->x_limit = get(arg, "X-RateLimit-Limit");
    h->x_remaining = get(arg, "X-RateLimit-Remaining");
    h->x_reset = get(arg, "X-RateLimit-Reset");
}

/* ---- one response's items -------------------------------------------- */

/* What a response holds while it is read. */
struct parse {
    struct quota_item items[QUOTA_ITEMS_MAX];
    uint32_t n, ignored;
    uint64_t now, now_wall_ms;
};

/* FNV-1a over the style and the name: the same item in the next response
 * has the same id, whatever the length of its name. */
static uint64_t item_id(enum quota_style style, const char *name, size_t len)
{
    uint64_t h = 0xcbf29ce484222325ull ^ (uint64_t)style;

    h *= 0x100000001b3ull;
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)name[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static bool is_ows(char c)
{
    return c == ' ' || c == '\t';
}

/* A whole header value of digits (1 to 15 of them), spaces around allowed;
 * *frac_ms gets the milliseconds of a decimal part when frac_ms is not NULL
 * (then one is allowed). */
static bool parse_count(const char *s, uint64_t *v, uint64_t *frac_ms)
{
    uint64_t x = 0, f = 0, scale = 100;
    int digits = 0;

    while (is_ows(*s))
        s++;
    for (; isdigit((unsigned char)*s); s++, digits++)
        x = digits < 15 ? x * 10 + (uint64_t)(*s - '0') : x;
    if (digits == 0 || digits > 15)
        return false;
    if (*s == '.' && frac_ms) {
        if (!isdigit((unsigned char)*++s))
            return false;
        for (; isdigit((unsigned char)*s); s++, scale /= 10)
            f += (uint64_t)(*s - '0') * scale;
    }
    while (is_ows(*s))
        s++;
    if (*s)
        return false;
    *v = x;
    if (frac_ms)
        *frac_ms = f;
    return true;
}

/* A reset in seconds from the response: its moment, or false when absurd. */
static bool moment_after(const struct parse *p, uint64_t t, uint64_t *moment)
{
    if (t > QUOTA_MAX_RESET_S)
        return false;
    *moment = p->now + t * SEC;
    return true;
}

/* An item with its r and moment: kept when there is room. */
static struct quota_item *add_item(struct parse *p, enum quota_style style,
                                   uint64_t id)
{
    struct quota_item *it;

    if (p->n == QUOTA_ITEMS_MAX) {
        p->ignored++;
        return NULL;
    }
    it = &p->items[p->n++];
    memset(it, 0, sizeof *it);
    it->style = (uint8_t)style;
    it->id = id;
    it->whole_s = true; /* but a Unix time with a fraction (read_x) */
    return it;
}

static bool seen_id(const struct parse *p, uint64_t id)
{
    for (uint32_t i = 0; i < p->n; i++)
        if (p->items[i].id == id)
            return true;
    return false;
}

/* ---- the draft: RateLimit-Policy and RateLimit ------------------------ */

/* One member of either List, as it is read. */
struct draft_member {
    char name[QUOTA_NAME_MAX];
    uint64_t id;
    uint64_t q, w, r, t;
    bool has_q, has_w, has_r, has_t;
    bool bad;                  /* a number or the name is malformed */
    bool other_unit;           /* a policy whose qu is not requests */
};

struct draft_list {
    struct draft_member m[QUOTA_ITEMS_MAX];
    uint32_t n, extra;         /* members kept, members beyond the room */
    bool policy;               /* reading RateLimit-Policy, not RateLimit */
};

static struct draft_member *member_at(struct draft_list *l, size_t item)
{
    return item < QUOTA_ITEMS_MAX && item < l->n ? &l->m[item] : NULL;
}

/* The name as shown: cut to fit (the id tells names apart). */
static void copy_name(char *dst, const char *src, size_t len)
{
    if (len > QUOTA_NAME_MAX - 1)
        len = QUOTA_NAME_MAX - 1;
    memcpy(dst, src, len);
    dst[len] = '\0';
}

static void draft_member(void *arg, size_t item, const struct sfv_value *v)
{
    struct draft_list *l = arg;
    struct draft_member *m;
    char full[256];
    size_t len;

    if (item >= QUOTA_ITEMS_MAX) {
        l->extra++;
        return;
    }
    m = &l->m[l->n++];
    memset(m, 0, sizeof *m);
    if (v->type == SFV_STRING) {
        len = sfv_string_copy(v, full, sizeof full);
        m->id = item_id(QUOTA_DRAFT, full,
                        len < sizeof full ? len : sizeof full - 1);
        copy_name(m->name, full, len < sizeof full ? len : sizeof full - 1);
    } else if (v->type == SFV_TOKEN) {
        m->id = item_id(QUOTA_DRAFT, v->text, v->len);
        copy_name(m->name, v->text, v->len);
    } else {
        m->bad = true;   /* a quota is named by a String (or a Token) */
    }
}

/* A non-negative Integer parameter within bounds, else the member is bad. */
static void take_number(struct draft_member *m, const struct sfv_value *v,
                        uint64_t min, uint64_t max, uint64_t *out, bool *has)
{
    if (v->type != SFV_INTEGER || v->integer < (int64_t)min ||
        (uint64_t)v->integer > max) {
        m->bad = true;
        return;
    }
    *out = (uint64_t)v->integer;
    *has = true;
}

/* qu (the quota unit): only a quota of requests paces requests. */
static bool unit_is_requests(const struct sfv_value *v)
{
    char s[32];

    if (v->type == SFV_TOKEN)
        return v->len == 8 && !memcmp(v->text, "requests", 8);
    return v->type == SFV_STRING && sfv_string_copy(v, s, sizeof s) == 8 &&
           !strcmp(s, "requests");
}

static bool key_is(const char *key, size_t klen, const char *want)
{
    return klen == strlen(want) && !memcmp(key, want, klen);
}

static void draft_param(void *arg, size_t item, const char *key, size_t klen,
                        const struct sfv_value *v)
{
    struct draft_list *l = arg;
    struct draft_member *m = member_at(l, item);

    if (!m)
        return;
    if (l->policy && key_is(key, klen, "q"))
        take_number(m, v, 0, QUOTA_MAX_NUMBER, &m->q, &m->has_q);
    else if (l->policy && key_is(key, klen, "w"))
        take_number(m, v, 1, QUOTA_MAX_RESET_S, &m->w, &m->has_w);
    else if (l->policy && key_is(key, klen, "qu") && !unit_is_requests(v))
        m->other_unit = true;
    else if (!l->policy && key_is(key, klen, "r"))
        take_number(m, v, 0, QUOTA_MAX_NUMBER, &m->r, &m->has_r);
    else if (!l->policy && key_is(key, klen, "t"))
        take_number(m, v, 0, QUOTA_MAX_RESET_S, &m->t, &m->has_t);
}

static const struct sfv_visitor draft_visitor = {draft_member, draft_param,
                                                 NULL};

/* Reads one of the two Lists; false (one ignored header) when it does not
 * parse: then none of its members counts. */
static bool read_draft_list(struct parse *p, const char *v, bool policy,
                            struct draft_list *l)
{
    memset(l, 0, sizeof *l);
    l->policy = policy;
    if (!v)
        return true;
    if (sfv_list_visit(v, &draft_visitor, l) != 0) {
        p->ignored++;
        l->n = 0;
        return false;
    }
    p->ignored += l->extra;
    return true;
}

static const struct draft_member *policy_named(const struct draft_list *pol,
                                               uint64_t id)
{
    for (uint32_t i = 0; i < pol->n; i++)
        if (pol->m[i].id == id)
            return &pol->m[i];
    return NULL;
}

static void add_draft_item(struct parse *p, const struct draft_member *m,
                           const struct draft_list *pol)
{
    const struct draft_member *qm = policy_named(pol, m->id);
    struct quota_item *it;
    uint64_t moment;

    /* r of a quota counted in bytes (qu) says nothing about requests. */
    if (m->bad || !m->has_r || !m->has_t || seen_id(p, m->id) ||
        (qm && qm->other_unit) || !moment_after(p, m->t, &moment)) {
        p->ignored++;
        return;
    }
    if (!(it = add_item(p, QUOTA_DRAFT, m->id)))
        return;
    it->r = m->r;
    it->moment = moment;
    memcpy(it->name, m->name, sizeof it->name);
    /* A malformed policy item is ignored alone: the item counts without a
     * limit and a window. */
    if (qm && !qm->bad) {
        it->q = qm->q;
        it->has_q = qm->has_q;
        it->w = (uint32_t)qm->w;
        it->has_w = qm->has_w;
    }
}

static void read_draft(struct parse *p, const struct quota_headers *h)
{
    struct draft_list pol, rl;

    read_draft_list(p, h->policy, true, &pol);
    for (uint32_t i = 0; i < pol.n; i++)
        p->ignored += pol.m[i].bad;
    if (!read_draft_list(p, h->ratelimit, false, &rl))
        return;
    for (uint32_t i = 0; i < rl.n; i++)
        add_draft_item(p, &rl.m[i], &pol);
    /* A policy item without a RateLimit item has no r or t: nothing to
     * follow, and nothing wrong either. */
}

/* ---- the older draft: RateLimit-Limit / -Remaining / -Reset ------------ */

struct old_limit {
    uint64_t q, w;
    bool has_q, has_w, bad;
};

static void old_member(void *arg, size_t item, const struct sfv_value *v)
{
    struct old_limit *l = arg;

    if (item != 0)
        return;  /* the first member is the quota in force */
    if (v->type == SFV_INTEGER && v->integer >= 0) {
        l->q = (uint64_t)v->integer;
        l->has_q = true;
    } else {
        l->bad = true;
    }
}

static void old_param(void *arg, size_t item, const char *key, size_t klen,
                      const struct sfv_value *v)
{
    struct old_limit *l = arg;

    if (item != 0 || !key_is(key, klen, "w"))
        return;
    if (v->type == SFV_INTEGER && v->integer >= 1 &&
        (uint64_t)v->integer <= QUOTA_MAX_RESET_S) {
        l->w = (uint64_t)v->integer;
        l->has_w = true;
    } else {
        l->bad = true;
    }
}

/* RateLimit-Limit: "100" or "100;w=60" (a List; its first member counts).
 * Optional, so a malformed one is ignored and the item still counts. */
static void read_old_limit(struct parse *p, const char *v, struct old_limit *l)
{
    static const struct sfv_visitor vis = {old_member, old_param, NULL};

    memset(l, 0, sizeof *l);
    if (!v)
        return;
    if (sfv_list_visit(v, &vis, l) != 0 || l->bad || !l->has_q) {
        p->ignored++;
        memset(l, 0, sizeof *l);
    }
}

static void read_old(struct parse *p, const struct quota_headers *h)
{
    struct quota_item *it;
    struct old_limit l;
    uint64_t r, t, moment;

    if (!h->remaining && !h->reset)
        return;
    if (!h->remaining || !h->reset || !parse_count(h->remaining, &r, NULL) ||
        !parse_count(h->reset, &t, NULL) || !moment_after(p, t, &moment)) {
        p->ignored++;
        return;
    }
    read_old_limit(p, h->limit, &l);
    if (!(it = add_item(p, QUOTA_OLD_DRAFT, item_id(QUOTA_OLD_DRAFT, "", 0))))
        return;
    it->r = r;
    it->moment = moment;
    it->q = l.q;
    it->has_q = l.has_q;
    it->w = (uint32_t)l.w;
    it->has_w = l.has_w;
}

/* ---- X-RateLimit-* --------------------------------------------------- */

/* X-RateLimit-Reset: a Unix time above 10^9 (decimals allowed, a time past
 * is now), else whole seconds from the response. *whole: in whole seconds
 * (a Unix time without a fraction, or seconds from the response), so up to
 * 1 s after the partner's true reset. */
static bool x_moment(const struct parse *p, const char *v, uint64_t *moment,
                     bool *whole)
{
    uint64_t s, ms, at_ms;

    if (!parse_count(v, &s, &ms))
        return false;
    *whole = !strchr(v, '.');
    if (s <= UNIX_FROM)
        return ms == 0 && *whole && moment_after(p, s, moment);
    at_ms = s * 1000 + ms;
    if (at_ms <= p->now_wall_ms) {
        *moment = p->now;
        return true;
    }
    if (at_ms - p->now_wall_ms > QUOTA_MAX_RESET_S * 1000)
        return false;
    *moment = p->now + (at_ms - p->now_wall_ms) * 1000000ull;
    return true;
}

static void read_x(struct parse *p, const struct quota_headers *h)
{
    struct quota_item *it;
    uint64_t r, moment, q = 0;
    bool has_q = false, whole = false;

    if (!h->x_remaining && !h->x_reset)
        return;
    if (!h->x_remaining || !h->x_reset ||
        !parse_count(h->x_remaining, &r, NULL) ||
        !x_moment(p, h->x_reset, &moment, &whole)) {
        p->ignored++;
        return;
    }
    if (h->x_limit && !(has_q = parse_count(h->x_limit, &q, NULL)))
        p->ignored++;
    if (!(it = add_item(p, QUOTA_X, item_id(QUOTA_X, "", 0))))
        return;
    it->r = r;
    it->moment = moment;
    it->whole_s = whole;
    it->q = q;
    it->has_q = has_q;
}

/* ---- the state ------------------------------------------------------- */

void quota_init(struct quota *q, double rate, double min_rate, uint32_t burst)
{
    memset(q, 0, sizeof *q);
    q->rate = rate;
    q->min_rate = min_rate < rate ? min_rate : rate;
    q->burst = burst ? burst : 1;
}

static const struct quota_item *kept_item(const struct quota *q, uint64_t id)
{
    for (uint32_t i = 0; i < q->n; i++)
        if (q->items[i].id == id)
            return &q->items[i];
    return NULL;
}

/* Whole seconds make a moment an upper bound: a moment less than 1 s after
 * the kept one is the same window, and the earlier of the two is the truer
 * bound. A kept moment that has passed, or one 1 s or more earlier, ends its
 * window. */
static void same_window(const struct quota *q, struct quota_item *it,
                        uint64_t now)
{
    const struct quota_item *old = kept_item(q, it->id);

    if (old && old->moment > now && it->moment < old->moment + SEC &&
        old->moment < it->moment)
        it->moment = old->moment;
}

/* When what remains is to be spent (rule in quota.h): by the moment, or a
 * second before it when the reset came in whole seconds (every style but a
 * Unix time with a fraction), which may lie up to 1 s after the partner's
 * reset: spent until it, the window's last permits would fall into the
 * next window, which then starts short. A Unix time is named alike by
 * every answer of a window; delta seconds narrow it as answers come
 * (same_window), but a sidecar of a fleet sees few of them. An answer
 * within that last second spends what it says until the moment. */
static uint64_t spend_by(const struct quota_item *it, uint64_t now)
{
    return it->whole_s && it->moment > now + SEC ? it->moment - SEC : it->moment;
}

/* What remains, net of the requests in flight, spent evenly until the
 * item's spend_by. */
static double allowance(const struct quota_item *it, uint64_t now,
                        uint32_t inflight)
{
    uint64_t left = it->r > inflight ? it->r - inflight : 0;

    if (it->spend_by <= now)
        return 0;   /* unused: the item is past its moment already */
    return (double)left * 1e9 / (double)(it->spend_by - now);
}

/* The window's last permit is left (rule in quota.h): the smallest r - f
 * among the items still running is 1, and the partner allows it. */
static bool last_permit(const struct quota *q, uint64_t now, uint32_t inflight)
{
    uint64_t least = UINT64_MAX;

    for (uint32_t i = 0; i < q->n; i++) {
        const struct quota_item *it = &q->items[i];
        uint64_t left = it->r > inflight ? it->r - inflight : 0;

        if (it->moment > now && left < least)
            least = left;
    }
    return least == 1 && quota_reset_tops_up(q, now);
}

void quota_update(struct quota *q, const struct quota_headers *h, uint64_t now,
                  uint64_t now_wall_ms, uint32_t inflight,
                  struct quota_result *res)
{
    struct parse p = {.now = now, .now_wall_ms = now_wall_ms};

    read_draft(&p, h);
    read_old(&p, h);
    read_x(&p, h);
    res->items = p.n;
    res->ignored = p.ignored;
    res->pause_until = 0;
    res->top_up = false;
    if (p.n == 0)
        return;
    for (uint32_t i = 0; i < p.n; i++) {
        struct quota_item *it = &p.items[i];

        same_window(q, it, now);
        it->spend_by = spend_by(it, now);
        it->allow = allowance(it, now, inflight);
        if (it->r == 0 && it->moment > now && it->moment > res->pause_until)
            res->pause_until = it->moment;
    }
    memcpy(q->items, p.items, p.n * sizeof p.items[0]);
    q->n = p.n;
    q->at = now;
    q->at_wall_ms = now_wall_ms;
    res->top_up = last_permit(q, now, inflight);
}

/* ---- queries --------------------------------------------------------- */

/* Spent at t: past the item's spend_by, before its reset (rule in quota.h). */
static bool spent_at(const struct quota_item *it, uint64_t t)
{
    return it->spend_by <= t && t < it->moment;
}

static double item_allows(const struct quota *q, const struct quota_item *it,
                          uint64_t t)
{
    if (t < it->spend_by)
        return it->allow;
    if (t < it->moment)
        return 0;   /* spent: nothing more until the reset */
    if (it->has_q && it->has_w)
        return (double)it->q / (double)it->w;
    return q->rate;
}

double quota_rate(const struct quota *q, uint64_t t)
{
    double least = q->rate;

    for (uint32_t i = 0; i < q->n; i++) {
        const struct quota_item *it = &q->items[i];
        double a = item_allows(q, it, t);

        /* Spent by spend_by: nothing until the reset, as after r = 0 (not
         * min_rate, which would start one more there, past what remains). */
        if (spent_at(it, t))
            return 0;
        if (a < least)
            least = a;
    }
    if (least < q->min_rate)
        least = q->min_rate;
    return least < q->rate ? least : q->rate;
}

uint32_t quota_capacity(const struct quota *q, uint64_t t)
{
    uint64_t cap = q->burst;

    for (uint32_t i = 0; i < q->n; i++) {
        const struct quota_item *it = &q->items[i];

        if (t < it->moment && it->r < cap)
            cap = it->r;
        else if (t >= it->moment && it->has_q && it->q < cap)
            cap = it->q;
    }
    return cap ? (uint32_t)cap : 1;
}

bool quota_limits(const struct quota *q, uint64_t t)
{
    return quota_rate(q, t) < q->rate;
}

uint64_t quota_next_change(const struct quota *q, uint64_t t)
{
    uint64_t next = UINT64_MAX;

    for (uint32_t i = 0; i < q->n; i++) {
        const struct quota_item *it = &q->items[i];

        if (it->spend_by > t && it->spend_by < next)
            next = it->spend_by;
        if (it->moment > t && it->moment < next)
            next = it->moment;
    }
    return next;
}

uint64_t quota_resume_at(const struct quota *q, uint64_t t)
{
    /* Each pass moves t past one more item's gap, or ends. */
    for (uint32_t pass = 0; pass <= q->n; pass++) {
        uint64_t to = t;

        for (uint32_t i = 0; i < q->n; i++) {
            const struct quota_item *it = &q->items[i];

            if (spent_at(it, t) && it->moment > to)
                to = it->moment;
        }
        if (to == t)
            break;
        t = to;
    }
    return t;
}

uint64_t quota_wall_ms_at(const struct quota *q, uint64_t t)
{
    if (!q->at_wall_ms)
        return 0;
    if (t >= q->at)
        return q->at_wall_ms + (t - q->at) / 1000000ull;
    return q->at_wall_ms - (q->at - t) / 1000000ull;
}

uint64_t quota_news_wall_ms(const struct quota *q, uint64_t now)
{
    uint64_t news = q->at_wall_ms;

    for (uint32_t i = 0; i < q->n; i++) {
        uint64_t m = q->items[i].moment;
        uint64_t at = quota_wall_ms_at(q, m);

        if (m > q->at && m <= now && at > news)
            news = at;
    }
    return news;
}

bool quota_reset_tops_up(const struct quota *q, uint64_t m)
{
    for (uint32_t i = 0; i < q->n; i++) {
        const struct quota_item *it = &q->items[i];

        /* Another window still running with nothing left net of those in
         * flight, or a limit of 0 from here on: the partner allows none. */
        if (it->moment > m ? !(item_allows(q, it, m) > 0) : it->has_q && it->q == 0)
            return false;
    }
    return true;
}

/* A top-up at a reset, for a prediction in which waiters take each whole
 * token as it comes: the bucket then holds only a fraction there, which
 * becomes one token, so the need falls to the whole tokens below it. */
static double topped_up(double need)
{
    double whole = ceil(need / (double)TB_ONE - 1e-6);

    return whole > 1 ? (whole - 1) * (double)TB_ONE : 0;
}

static bool is_moment(const struct quota *q, uint64_t t)
{
    for (uint32_t i = 0; i < q->n; i++)
        if (q->items[i].moment == t)
            return true;
    return false;
}

uint64_t quota_accrue_ns(const void *arg, uint64_t from, bool pause_end,
                         uint64_t nano_tokens)
{
    const struct quota *q = arg;
    uint64_t t = from;
    double need = (double)nano_tokens;

    /* A pause that ends at a reset (an r = 0 until it): its top-up is
     * still to come. Otherwise the bucket was synced up to from. */
    if (pause_end && is_moment(q, from) && quota_reset_tops_up(q, from))
        need = topped_up(need);

    /* At most one segment per item, then the rate holds for good. */
    for (uint32_t i = 0; i <= QUOTA_ITEMS_MAX; i++) {
        uint64_t next = quota_next_change(q, t), in_seg;
        double rate = quota_rate(q, t);

        if (need <= 0)
            return t - from;
        in_seg = tbucket_accrue_at(rate, (uint64_t)ceil(need));
        if (next == UINT64_MAX || in_seg <= next - t)
            return in_seg == UINT64_MAX || in_seg > UINT64_MAX - (t - from)
                       ? UINT64_MAX
                       : t - from + in_seg;
        need -= rate * (double)(next - t);   /* nano-tokens in the segment */
        t = next;
        if (quota_reset_tops_up(q, t))
            need = topped_up(need);
    }
    return need <= 0 ? t - from : UINT64_MAX;
}

static void apply_at(const struct quota *q, struct tbucket *b, uint64_t t)
{
    tbucket_set_rate(b, t, quota_rate(q, t));
    tbucket_set_capacity(b, t, quota_capacity(q, t));
}

void quota_bucket_sync(const struct quota *q, struct tbucket *b, uint64_t now)
{
    uint64_t t = b->last, m;

    while ((m = quota_next_change(q, t)) <= now) {
        apply_at(q, b, m);
        if (quota_reset_tops_up(q, m))
            tbucket_top_up(b, m);
        t = m;
    }
    apply_at(q, b, now);
}
