/* The answers a row decides, in one place: a problem, an instruction, what
 * a key's record or the upstream's classified result means for the worker.
 * Rows call these and return EXV_ANSWER; the owner turns the decided answer
 * into bytes (mhd.c). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "obs/log.h"
#include "policies/verify.h"
#include "proxy/exchange/stage.h"
#include "util/clock.h"
#include "util/rand.h"

void ex_refuse(struct exchange *ex, int status, enum outcome o, enum reason r,
               const char *fmt, ...)
{
    va_list ap;

    ex->kind = ANSWER_PROBLEM;
    ex->status = status;
    ex->outcome = o;
    ex->reason = r;
    va_start(ap, fmt);
    vsnprintf(ex->detail, sizeof ex->detail, fmt, ap);
    va_end(ap);
}

void ex_instruct(struct exchange *ex, enum outcome o, enum reason r,
                 uint64_t delay_ms, uint32_t attempt, int upstream_status)
{
    struct instruction *in = &ex->instr;

    ex->kind = ANSWER_INSTRUCTION;
    ex->outcome = o;
    ex->reason = r;
    ex->status = instruction_status(r);
    in->outcome = o;
    in->reason = r;
    in->delay_ms = delay_ms ? delay_ms : 1;
    in->attempt = attempt;
    in->max_attempts = ex->pol->retry.max_attempts;
    in->key = ex->key;
    in->upstream_status = upstream_status;
    in->verify_pending = false;
}

uint32_t ex_attempts_so_far(const struct exchange *ex)
{
    /* This request never reached the upstream: it adds no attempt. */
    return ex->attempt > 0 ? ex->attempt - 1 : 0;
}

enum ex_verdict ex_refuse_wait(struct exchange *ex, enum reason r, uint64_t delay_ms)
{
    if (delay_ms > ex->pol->retry.max_delay_ms)
        ex_instruct(ex, OUT_DEAD_LETTER, R_DELAY_EXCEEDS_MAX, 0,
                    ex_attempts_so_far(ex), 0);
    else
        ex_instruct(ex, OUT_REQUEUE, r, delay_ms ? delay_ms : 1,
                    ex_attempts_so_far(ex), 0);
    ex->rate_headers = true;
    return EXV_ANSWER;
}

void ex_drain_unsent(struct exchange *ex, uint64_t now)
{
    uint64_t left = ex->wait_deadline_ns > now ? ex->wait_deadline_ns - now : 0;

    ex_instruct(ex, OUT_REQUEUE, R_RATE_LIMITED,
                left / NS_PER_MS > EX_SLOT_RETRY_MS ? left / NS_PER_MS : EX_SLOT_RETRY_MS,
                ex_attempts_so_far(ex), 0);
}

/* ---- the key's record ----------------------------------------------------- */

void ex_count_store_error(struct exchange *ex)
{
    metrics_add(ex->env->metrics, ex->ids->store_errors, 1);
}

void ex_store_failed(struct exchange *ex, const char *what, const struct sc_error *err)
{
    ex_count_store_error(ex);
    log_error("policy %s: idempotency store %s failed: %s", ex->pol->name, what,
              err->text);
    ex_instruct(ex, OUT_REQUEUE, R_STORE_UNAVAILABLE, 1000, ex_attempts_so_far(ex), 0);
}

void ex_lease_held(struct exchange *ex, uint64_t remaining_ms)
{
    ex_instruct(ex, OUT_REQUEUE, R_LEASE_HELD, remaining_ms ? remaining_ms : 1,
                ex_attempts_so_far(ex), 0);
}

/* A held lease with its verification mark (contract §11): a pending mark
 * answers what remains of D with "verify": "pending"; a lease whose holder
 * (or verifier) is gone has its verification started here, with this
 * request's upstream and T, when the policy verifies (fence names the
 * lease; 0: none to take up). */
static void lease_held_marked(struct exchange *ex, const struct verify_lease_view *l,
                              uint64_t fence, uint64_t now_ms)
{
    uint64_t delay_ms = 1, deadline = 0;
    enum verify_action a = verify_on_lease(l, now_ms, &delay_ms);

    if (a == VA_START && fence && ex->env->verify_take_up)
        deadline = ex->env->verify_take_up(ex->env->verify_arg, ex, fence,
                                           l->expires_ms,
                                           l->state == VERIFY_PENDING);
    if (deadline) {
        a = VA_PENDING;
        delay_ms = deadline > now_ms ? deadline - now_ms : 1;
    } else if (a == VA_START) {
        /* Claimed by another sidecar first, or not startable: as held. */
        a = VA_HELD;
        delay_ms = l->expires_ms > now_ms ? l->expires_ms - now_ms : 1;
    }
    ex_lease_held(ex, delay_ms);
    ex->instr.verify_pending = a == VA_PENDING;
}

/* A held lease as the verification's rules see it (policies/verify.h):
 * its mark, the mark's deadline and its end, wall ms; holder_gone: its
 * holder (or verifier) has no liveness key. */
static struct verify_lease_view held_view(const struct exchange *ex, uint8_t verify,
                                          uint64_t deadline_ms, uint64_t expires_ms,
                                          bool holder_gone)
{
    return (struct verify_lease_view){
        .verify_enabled = ex->pol->idem.verify.enabled,
        .upstream_known = true,
        .holder_alive = !holder_gone,
        .state = (enum verify_state)verify,
        .verifier_alive = !holder_gone,
        .deadline_ms = deadline_ms,
        .expires_ms = expires_ms,
    };
}

void ex_lease_held_record(struct exchange *ex, const struct store_record *rec,
                          uint64_t now_ms, bool holder_gone)
{
    /* Read from the store (the lookup row): its holder is taken for alive
     * until a look at its liveness key says otherwise (ex_not_free in
     * stage_idem.c). With RocksDB every holder is this process (a lease
     * of an ended one was taken up at start-up). */
    struct verify_lease_view l = held_view(ex, rec->verify, rec->verify_deadline_ms,
                                           rec->lease_expires_ms, holder_gone);

    lease_held_marked(ex, &l, holder_gone ? rec->lease : 0, now_ms);
}

/* The acquire's (or permit_lease's) answer HELD. */
static void lease_held_acquire(struct exchange *ex, const struct store_acquire_out *out)
{
    uint64_t wall = ex_wall_ms(ex);
    struct verify_lease_view l = held_view(ex, out->verify, out->verify_deadline_ms,
                                           wall + out->remaining_ms, out->holder_gone);

    lease_held_marked(ex, &l, out->lease, wall);
}

void ex_key_reused(struct exchange *ex)
{
    ex_refuse(ex, 422, OUT_REJECTED, R_KEY_REUSED,
              "%s %s was used for a different request "
              "(method, path or body differ)", ex->pol->idem.header, ex->key);
}

bool ex_take_lease(struct exchange *ex)
{
    struct store_acquire_out *out = &ex->scall->acq;
    const struct sc_idempotency *id = &ex->pol->idem;
    uint64_t now = ex->env->clock->mono_ns(ex->env->clock->arg);

    if (ex->scall->rc != 0) {
        ex_store_failed(ex, "lease", &ex->scall->err);
        return false;
    }
    switch (out->claim) {
    case STORE_ACQUIRED:
        ex->attempt = out->attempt;
        ex->lease = out->lease;
        ex->lease_expires_ms = out->lease_expires_ms;
        ex->leased = true;
        atomic_fetch_add(ex->env->leases_active, 1);
        if (ex->claimed)
            claims_forwarded(ex->env->claims, ex->pol->name, ex->key,
                             now + id->lease_ms * NS_PER_MS);
        return true;
    case STORE_HELD:
        lease_held_acquire(ex, out);
        return false;
    case STORE_DONE:
        ex->replay = out->rec; /* the exchange owns it now */
        memset(&out->rec, 0, sizeof out->rec);
        ex->kind = ANSWER_REPLAY;
        return false;
    default:
        ex_key_reused(ex);
        return false;
    }
}

/* ---- the upstream's answer -------------------------------------------------- */

void ex_answer_outcome(struct exchange *ex)
{
    const struct outcome_verdict *v = &ex->ov;

    switch (v->action) {
    case OA_PASS:
        ex->kind = ANSWER_UPSTREAM;
        ex->status = v->status;
        ex->reason = R_NONE;
        ex->outcome = v->outcome;
        break;
    case OA_REQUEUE:
    case OA_DEAD_LETTER:
        ex_instruct(ex, v->outcome, v->reason, v->delay_ms, ex->attempt,
                    ex->oin.status);
        break;
    case OA_REFUSE:
        ex_refuse(ex, v->status, v->outcome, v->reason, "upstream %s: %s",
                  ex->up->name, ex->ureq.resp.detail);
        break;
    }
}

/* ---- ids and headers ---------------------------------------------------------- */

/* 1 to EX_REQUEST_ID_MAX visible ASCII characters: it is logged and sent
 * on, so nothing that could break a header or a log line. */
static bool request_id_usable(const char *v)
{
    size_t n = v ? strlen(v) : 0;

    if (n == 0 || n > EX_REQUEST_ID_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if (v[i] <= 0x20 || v[i] >= 0x7f)
            return false;
    return true;
}

/* 16 lower-case hex digits of v at out (no NUL): snprintf's "%016llx"
 * twice cost about 2,000 instructions per request. */
static void hex16(char *out, uint64_t v)
{
    static const char digits[] = "0123456789abcdef";

    for (int i = 15; i >= 0; i--, v >>= 4)
        out[i] = digits[v & 0xf];
}

const char *ex_request_id(struct exchange *ex)
{
    if (ex->request_id[0])
        return ex->request_id;
    if (request_id_usable(ex->worker_id))
        snprintf(ex->request_id, sizeof ex->request_id, "%s", ex->worker_id);
    else {
        _Static_assert(EX_REQUEST_ID_MAX >= 32, "a made id takes 32 digits");
        hex16(ex->request_id, rand_u64());
        hex16(ex->request_id + 16, rand_u64());
        ex->request_id[32] = '\0';
    }
    return ex->request_id;
}

void ex_rate_headers(const struct exchange *ex, char *policy, size_t plen,
                     char *state, size_t slen)
{
    const struct sc_policy *p = ex->pol;
    uint64_t next_ns = 0;
    /* The quota of a one-second window (longer for slow rates), as the
     * draft's q;w describe: what can start in any window of w seconds. */
    double w = p->rate >= 1 ? 1 : 1 / p->rate;
    unsigned long q = (unsigned long)(p->burst + p->rate * w);
    uint32_t r = bucket_available(ex->bucket,
                                  ex->env->clock->mono_ns(ex->env->clock->arg), &next_ns);
    unsigned long long t = (next_ns + NS_PER_S - 1) / NS_PER_S;

    snprintf(policy, plen, "\"%s\";q=%lu;w=%.0f", p->name, q, w);
    snprintf(state, slen, "\"%s\";r=%u;t=%llu", p->name, r, t);
}

const char *shadow_name(enum shadow_verdict v)
{
    static const char *const names[] = {
        [SHADOW_PERMIT_WAIT] = "permit_wait",
        [SHADOW_RATE_LIMITED] = "rate_limited",
        [SHADOW_CONCURRENCY] = "concurrency",
    };

    return v > SHADOW_NONE && v <= SHADOW_CONCURRENCY ? names[v] : NULL;
}
