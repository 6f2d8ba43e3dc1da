#define _GNU_SOURCE
#include "policies/verify.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

static const char *const state_names[] = {
    [VERIFY_NONE] = NULL,         [VERIFY_PENDING] = "pending",
    [VERIFY_FOUND] = "found",     [VERIFY_ABSENT] = "absent",
    [VERIFY_FAILED] = "failed",
};

const char *verify_state_name(enum verify_state s)
{
    return (unsigned)s < sizeof state_names / sizeof *state_names
               ? state_names[s]
               : NULL;
}

void verify_holder_format(const uint8_t rnd[16],
                          char out[VERIFY_HOLDER_LEN + 1])
{
    static const char hex[] = "0123456789abcdef";

    for (int i = 0; i < 16; i++) {
        out[2 * i] = hex[rnd[i] >> 4];
        out[2 * i + 1] = hex[rnd[i] & 15];
    }
    out[VERIFY_HOLDER_LEN] = '\0';
}

bool verify_applies(const struct verify_lease *started,
                    const struct verify_lease *current, uint64_t now_ms)
{
    /* The expiry is part of the identity: a takeover, or a new first
     * request after DELETE, by the same process at the same attempt number
     * still makes a lease with another expiry. */
    return current && !strcmp(started->holder, current->holder) &&
           started->attempt == current->attempt &&
           started->expires_ms == current->expires_ms &&
           now_ms < current->expires_ms;
}

bool verify_on_outcome(const struct sc_idempotency *idem,
                       enum outcome_transport t, bool holds_lease)
{
    return idem && idem->enabled && idem->verify.enabled && holds_lease &&
           (t == OT_TIMEOUT || t == OT_CONNECTION_LOST);
}

static uint64_t until(uint64_t at_ms, uint64_t now_ms)
{
    return at_ms > now_ms ? at_ms - now_ms : 1;
}

/* Nobody settles this lease but its expiry. */
static bool verify_never(const struct verify_lease_view *l)
{
    return !l->verify_enabled || !l->upstream_known ||
           l->state == VERIFY_FAILED || l->state == VERIFY_FOUND ||
           l->state == VERIFY_ABSENT;
}

/* A pending verification whose verifier is gone, or a lease whose holder is
 * gone before anyone verified it, is verified again here. */
static bool verify_orphaned(const struct verify_lease_view *l)
{
    return l->state == VERIFY_PENDING ? !l->verifier_alive : !l->holder_alive;
}

enum verify_action verify_on_lease(const struct verify_lease_view *l,
                                   uint64_t now_ms, uint64_t *delay_ms)
{
    enum verify_action a = VA_HELD;
    uint64_t d = until(l->expires_ms, now_ms);

    if (!verify_never(l) && verify_orphaned(l)) {
        a = VA_START;
        d = 0;
    } else if (!verify_never(l) && l->state == VERIFY_PENDING &&
               now_ms < l->deadline_ms) {
        a = VA_PENDING;
        d = until(l->deadline_ms, now_ms);
    }
    if (delay_ms)
        *delay_ms = d;
    return a;
}

bool verify_live_expired(uint64_t last_refresh_ms, uint64_t now_ms)
{
    return now_ms >= last_refresh_ms + VERIFY_LIVE_TTL_MS;
}

/* ---- the lookup --------------------------------------------------------- */

static bool unreserved(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
           (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_' ||
           c == '~';
}

static size_t encoded_len(const char *key)
{
    size_t n = 0;

    for (; *key; key++)
        n += unreserved((unsigned char)*key) ? 1 : 3;
    return n;
}

static size_t count_keys(const char *path)
{
    size_t n = 0;

    for (const char *p = path; (p = strstr(p, "{key}")); p += 5)
        n++;
    return n;
}

size_t verify_target_size(const char *base_path, const char *path,
                          const char *key)
{
    size_t keys = count_keys(path);

    return strlen(base_path) + strlen(path) - 5 * keys +
           keys * encoded_len(key) + 1;
}

static char *put_key(char *o, const char *key)
{
    static const char hex[] = "0123456789ABCDEF";

    for (; *key; key++) {
        unsigned char c = (unsigned char)*key;

        if (unreserved(c)) {
            *o++ = (char)c;
            continue;
        }
        *o++ = '%';
        *o++ = hex[c >> 4];
        *o++ = hex[c & 15];
    }
    return o;
}

int verify_target(const char *base_path, const char *path, const char *key,
                  char *out, size_t len)
{
    char *o = out;
    const char *p = path, *k;

    if (len < verify_target_size(base_path, path, key)) {
        if (len)
            out[0] = '\0';
        return -ENOSPC;
    }
    o = stpcpy(o, base_path);
    while ((k = strstr(p, "{key}"))) {
        memcpy(o, p, (size_t)(k - p));
        o = put_key(o + (k - p), key);
        p = k + 5;
    }
    strcpy(o, p);
    return 0;
}

enum verify_class verify_classify(const struct sc_verify *cfg, int status)
{
    if (status == 0 || status == 429)
        return VC_OTHER;
    if (sc_verify_found(cfg, status))
        return VC_FOUND;
    if (sc_verify_absent(cfg, status))
        return VC_ABSENT;
    return VC_OTHER;
}

const char *verify_class_name(enum verify_class c)
{
    return c == VC_FOUND ? "found" : c == VC_ABSENT ? "absent" : "other";
}

/* ---- a verification's life ---------------------------------------------- */

void verify_params_set(struct verify_params *p, const struct sc_verify *cfg,
                       uint64_t timeout_ms)
{
    p->attempts = cfg->attempts ? cfg->attempts : 1;
    p->after_ms = cfg->after_ms;
    p->timeout_ms = timeout_ms;
}

static uint64_t sat_add(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

uint64_t verify_budget_ms(const struct verify_params *p,
                          uint64_t lease_remaining_ms)
{
    uint64_t one = sat_add(p->after_ms, p->timeout_ms), all;

    all = one && p->attempts > UINT64_MAX / one ? UINT64_MAX
                                                : one * p->attempts;
    return all < lease_remaining_ms ? all : lease_remaining_ms;
}

enum verify_state verify_start(struct verify *v, const struct verify_params *p,
                               const struct verify_lease *lease,
                               uint64_t lease_remaining_ms, uint64_t now_ms)
{
    memset(v, 0, sizeof *v);
    v->lease = *lease;
    v->p = *p;
    v->deadline_ms = sat_add(now_ms, verify_budget_ms(p, lease_remaining_ms));
    v->due_ms = sat_add(now_ms, p->after_ms);
    /* A lookup that could only go once the lease is over would settle
     * nothing: the lease's expiry decides instead. */
    v->state = v->due_ms < v->deadline_ms ? VERIFY_PENDING : VERIFY_FAILED;
    return v->state;
}

static uint64_t min_u64(uint64_t a, uint64_t b)
{
    return a < b ? a : b;
}

struct verify_step verify_next(struct verify *v, uint64_t now_ms)
{
    if (v->state != VERIFY_PENDING)
        return (struct verify_step){VSTEP_DONE, 0};
    if (v->in_flight)
        return (struct verify_step){VSTEP_BUSY, v->lookup_end_ms};
    if (now_ms >= v->deadline_ms) {
        /* Only a caller far behind its timers gets here. */
        v->state = VERIFY_FAILED;
        return (struct verify_step){VSTEP_DONE, 0};
    }
    if (now_ms < v->due_ms)
        return (struct verify_step){VSTEP_WAIT, v->due_ms};
    v->in_flight = true;
    v->sent++;
    v->lookup_end_ms = min_u64(sat_add(now_ms, v->p.timeout_ms), v->deadline_ms);
    return (struct verify_step){VSTEP_LOOKUP, v->lookup_end_ms};
}

enum verify_state verify_lookup_done(struct verify *v, enum verify_class c,
                                     uint64_t now_ms)
{
    if (v->state != VERIFY_PENDING || !v->in_flight)
        return v->state;
    v->in_flight = false;
    if (c == VC_FOUND)
        v->state = VERIFY_FOUND;
    else if (c == VC_ABSENT)
        v->state = VERIFY_ABSENT;
    else {
        v->due_ms = sat_add(now_ms, v->p.after_ms);
        if (v->sent >= v->p.attempts || v->due_ms >= v->deadline_ms)
            v->state = VERIFY_FAILED;
    }
    return v->state;
}

/* ---- what workers are told meanwhile ------------------------------------ */

uint64_t verify_held_delay_ms(uint64_t deadline_ms, uint64_t now_ms)
{
    return until(deadline_ms, now_ms);
}

uint64_t verify_requeue_delay_ms(uint64_t deadline_ms, uint64_t now_ms,
                                 uint64_t backoff_ms)
{
    uint64_t d = until(deadline_ms, now_ms);

    return d > backoff_ms ? d : backoff_ms;
}
