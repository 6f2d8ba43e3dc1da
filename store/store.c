/* The store's calls, dispatched to its backend (store_backend.h); the
 * asynchronous ones run at once through the blocking ones when the backend
 * has none of its own. */
#include "store/store.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "store/store_backend.h"
#include "util/rand.h"

uint64_t store_lease_draw(void)
{
    uint64_t v;

    while ((v = rand_u64()) == 0)
        ;
    return v;
}

void store_close(struct store *st)
{
    if (st)
        st->ops->close(st);
}

const char *store_backend_name(const struct store *st)
{
    return st->ops->name;
}

int store_get(struct store *st, const char *scope, const char *key,
              uint64_t now_ms, struct store_record *out, struct sc_error *err)
{
    return st->ops->get(st, scope, key, now_ms, out, err);
}

int store_acquire(struct store *st, const char *scope, const char *key,
                  const uint8_t fp[STORE_FP_LEN], uint64_t now_ms,
                  uint64_t lease_ms, uint64_t ttl_ms,
                  struct store_acquire_out *out, struct sc_error *err)
{
    return st->ops->acquire(st, scope, key, fp, now_ms, lease_ms, ttl_ms, out,
                            err);
}

int store_complete(struct store *st, const char *scope, const char *key,
                   uint64_t lease, uint64_t now_ms, uint64_t ttl_ms, int status,
                   const struct store_header *headers, size_t n_headers,
                   const uint8_t *body, size_t body_len, bool body_omitted,
                   struct sc_error *err)
{
    return st->ops->complete(st, scope, key, lease, now_ms, ttl_ms, status, headers,
                             n_headers, body, body_len, body_omitted, err);
}

int store_release(struct store *st, const char *scope, const char *key,
                  uint32_t attempt, uint64_t lease, uint64_t now_ms,
                  uint64_t ttl_ms, struct sc_error *err)
{
    return st->ops->release(st, scope, key, attempt, lease, now_ms, ttl_ms, err);
}

int store_forget(struct store *st, const char *scope, const char *key,
                 struct sc_error *err)
{
    return st->ops->forget(st, scope, key, err);
}

int store_sweep(struct store *st, uint64_t now_ms, size_t max, size_t *removed,
                struct sc_error *err)
{
    return st->ops->sweep(st, now_ms, max, removed, err);
}

int store_pause_set(struct store *st, const char *scope, uint64_t now_ms,
                    uint64_t until_ms, struct sc_error *err)
{
    return st->ops->pause_set(st, scope, now_ms, until_ms, err);
}

int store_pause_get(struct store *st, const char *scope, uint64_t now_ms,
                    uint64_t *until_ms, struct sc_error *err)
{
    return st->ops->pause_get(st, scope, now_ms, until_ms, err);
}

int store_pause_clear(struct store *st, const char *scope, struct sc_error *err)
{
    return st->ops->pause_clear(st, scope, err);
}

bool store_healthy(struct store *st)
{
    return st->ops->healthy(st);
}

void store_unhealthy_cause(struct store *st, char *buf, size_t len)
{
    if (len)
        buf[0] = '\0';
    if (st && st->ops->cause)
        st->ops->cause(st, buf, len);
}

uint64_t store_count(struct store *st)
{
    return st ? st->ops->count(st) : 0;
}

int store_live_refresh(struct store *st, const char *scope, uint64_t ttl_ms,
                       struct sc_error *err)
{
    if (!st->ops->live) {
        sc_error_set(err, "store %s: keeps no liveness keys", st->ops->name);
        return -EOPNOTSUPP;
    }
    return st->ops->live(st, scope, ttl_ms, err);
}

bool store_loop_holder_other(const struct store_loop *sl, const char *holder)
{
    const struct store *st = sl->st;

    return holder && holder[0] && st->ops->holder_id &&
           strcmp(holder, st->ops->holder_id(st)) != 0;
}

/* ---- verification marks --------------------------------------------------- */

static int verify_step(struct store *st, const char *scope, const char *key,
                       const struct store_verify_args *a, struct sc_error *err)
{
    if (!st->ops->verify) {
        sc_error_set(err, "store %s: verification of unknown outcomes is not "
                     "supported", st->ops->name);
        return -EOPNOTSUPP;
    }
    return st->ops->verify(st, scope, key, a, err);
}

/* Each step's arguments, for its blocking call and its call on a loop. */
static struct store_verify_args claim_args(uint64_t lease, uint64_t now_ms,
                                           uint64_t deadline_ms, bool again)
{
    return (struct store_verify_args){.step = STORE_VERIFY_CLAIM, .lease = lease,
                                      .now_ms = now_ms, .deadline_ms = deadline_ms,
                                      .again = again};
}

static struct store_verify_args found_args(uint64_t lease, uint64_t now_ms,
                                           uint64_t ttl_ms,
                                           const struct store_record *result)
{
    return (struct store_verify_args){.step = STORE_VERIFY_FOUND, .lease = lease,
                                      .now_ms = now_ms, .ttl_ms = ttl_ms,
                                      .result = result};
}

static struct store_verify_args absent_args(uint64_t lease, uint64_t now_ms,
                                            uint64_t ttl_ms)
{
    return (struct store_verify_args){.step = STORE_VERIFY_ABSENT, .lease = lease,
                                      .now_ms = now_ms, .ttl_ms = ttl_ms};
}

static struct store_verify_args failed_args(uint64_t lease, uint64_t now_ms)
{
    return (struct store_verify_args){.step = STORE_VERIFY_FAILED, .lease = lease,
                                      .now_ms = now_ms};
}

int store_verify_claim(struct store *st, const char *scope, const char *key,
                       uint64_t lease, uint64_t now_ms, uint64_t deadline_ms,
                       bool again, struct sc_error *err)
{
    struct store_verify_args a = claim_args(lease, now_ms, deadline_ms, again);

    return verify_step(st, scope, key, &a, err);
}

/* A lookup's answer as found's result: borrowed for encoding only (the
 * blocking call and a call's start copy it), never cleared. */
static struct store_record found_result(int status, const struct store_header *headers,
                                        size_t n_headers, const uint8_t *body,
                                        size_t body_len, bool body_omitted)
{
    return (struct store_record){
        .status = status,
        .headers = (struct store_header *)headers,
        .n_headers = n_headers,
        .body = body_omitted ? NULL : (uint8_t *)body,
        .body_len = body_omitted ? 0 : body_len,
        .body_omitted = body_omitted,
    };
}

int store_verify_found(struct store *st, const char *scope, const char *key,
                       uint64_t lease, uint64_t now_ms, uint64_t ttl_ms,
                       int status, const struct store_header *headers,
                       size_t n_headers, const uint8_t *body, size_t body_len,
                       bool body_omitted, struct sc_error *err)
{
    struct store_record result = found_result(status, headers, n_headers, body,
                                              body_len, body_omitted);
    struct store_verify_args a = found_args(lease, now_ms, ttl_ms, &result);

    return verify_step(st, scope, key, &a, err);
}

int store_verify_absent(struct store *st, const char *scope, const char *key,
                        uint64_t lease, uint64_t now_ms, uint64_t ttl_ms,
                        struct sc_error *err)
{
    struct store_verify_args a = absent_args(lease, now_ms, ttl_ms);

    return verify_step(st, scope, key, &a, err);
}

int store_verify_failed(struct store *st, const char *scope, const char *key,
                        uint64_t lease, uint64_t now_ms, struct sc_error *err)
{
    struct store_verify_args a = failed_args(lease, now_ms);

    return verify_step(st, scope, key, &a, err);
}

int store_leases_each(struct store *st, uint64_t now_ms, store_lease_fn fn,
                      void *arg, struct sc_error *err)
{
    if (!st->ops->leases_each) {
        sc_error_set(err, "store %s: cannot list the leases in progress",
                     st->ops->name);
        return -EOPNOTSUPP;
    }
    return st->ops->leases_each(st, now_ms, fn, arg, err);
}

/* ---- asynchronous calls ------------------------------------------------- */

int store_loop_new(struct store *st, struct event_base *base,
                   struct store_loop **out, struct sc_error *err)
{
    struct store_loop *sl;

    if (st->ops->loop_new)
        return st->ops->loop_new(st, base, out, err);
    sl = calloc(1, sizeof *sl);
    if (!sl) {
        sc_error_set(err, "store: out of memory");
        return -ENOMEM;
    }
    sl->st = st;
    sl->base = base;
    *out = sl;
    return 0;
}

void store_loop_free(struct store_loop *sl)
{
    if (!sl)
        return;
    if (sl->st->ops->loop_free)
        sl->st->ops->loop_free(sl);
    else
        free(sl);
}

static int run_now(struct store *st, struct store_call *c, enum store_op op,
                   const struct store_args *a)
{
    switch (op) {
    case STORE_OP_GET:
        return st->ops->get(st, a->scope, a->key, a->now_ms, &c->rec, &c->err);
    case STORE_OP_ACQUIRE:
        return st->ops->acquire(st, a->scope, a->key, a->fp, a->now_ms,
                                a->lease_ms, a->ttl_ms, &c->acq, &c->err);
    case STORE_OP_COMPLETE:
        return st->ops->complete(st, a->scope, a->key, a->lease, a->now_ms,
                                 a->ttl_ms,
                                 a->status, a->headers, a->n_headers, a->body,
                                 a->body_len, a->body_omitted, &c->err);
    case STORE_OP_RELEASE:
        return st->ops->release(st, a->scope, a->key, a->attempt, a->lease,
                                a->now_ms, a->ttl_ms, &c->err);
    case STORE_OP_PAUSE_SET:
        return st->ops->pause_set(st, a->scope, a->now_ms, a->until_ms,
                                  &c->err);
    case STORE_OP_VERIFY:
        return verify_step(st, a->scope, a->key, a->verify, &c->err);
    default:
        sc_error_set(&c->err, "store %s: no shared buckets or slots",
                     st->ops->name);
        return -EOPNOTSUPP;
    }
}

static int start(struct store_loop *sl, struct store_call *c, enum store_op op,
                 const struct store_args *a)
{
    struct store *st = sl->st;

    memset(&c->err, 0, sizeof c->err);
    c->replication_short = false;
    c->loop = sl;
    c->pending = NULL;
    if (st->ops->start)
        c->rc = st->ops->start(sl, c, op, a);
    else
        c->rc = run_now(st, c, op, a);
    return c->rc;
}

int store_get_async(struct store_loop *sl, struct store_call *c,
                    const char *scope, const char *key, uint64_t now_ms)
{
    struct store_args a = {.scope = scope, .key = key, .now_ms = now_ms};

    return start(sl, c, STORE_OP_GET, &a);
}

int store_watch_async(struct store_loop *sl, struct store_call *c,
                      const char *scope, const char *key, uint64_t now_ms)
{
    struct store_args a = {.scope = scope, .key = key, .now_ms = now_ms};

    return start(sl, c, sl->st->ops->notify_set ? STORE_OP_WATCH : STORE_OP_GET, &a);
}

int store_holder_look_async(struct store_loop *sl, struct store_call *c,
                            const char *scope, const char *holder)
{
    struct store_args a = {.scope = scope, .holder = holder};

    return start(sl, c, STORE_OP_HOLDER_LOOK, &a);
}

static int verify_async(struct store_loop *sl, struct store_call *c,
                        const char *scope, const char *key,
                        const struct store_verify_args *va)
{
    struct store_args a = {.scope = scope, .key = key, .now_ms = va->now_ms,
                           .ttl_ms = va->ttl_ms, .verify = va};

    return start(sl, c, STORE_OP_VERIFY, &a);
}

int store_verify_claim_async(struct store_loop *sl, struct store_call *c,
                             const char *scope, const char *key, uint64_t lease,
                             uint64_t now_ms, uint64_t deadline_ms, bool again)
{
    struct store_verify_args a = claim_args(lease, now_ms, deadline_ms, again);

    return verify_async(sl, c, scope, key, &a);
}

int store_verify_found_async(struct store_loop *sl, struct store_call *c,
                             const char *scope, const char *key, uint64_t lease,
                             uint64_t now_ms, uint64_t ttl_ms, int status,
                             const struct store_header *headers, size_t n_headers,
                             const uint8_t *body, size_t body_len,
                             bool body_omitted)
{
    struct store_record result = found_result(status, headers, n_headers, body,
                                              body_len, body_omitted);
    struct store_verify_args a = found_args(lease, now_ms, ttl_ms, &result);

    return verify_async(sl, c, scope, key, &a);
}

int store_verify_absent_async(struct store_loop *sl, struct store_call *c,
                              const char *scope, const char *key, uint64_t lease,
                              uint64_t now_ms, uint64_t ttl_ms)
{
    struct store_verify_args a = absent_args(lease, now_ms, ttl_ms);

    return verify_async(sl, c, scope, key, &a);
}

int store_verify_failed_async(struct store_loop *sl, struct store_call *c,
                              const char *scope, const char *key, uint64_t lease,
                              uint64_t now_ms)
{
    struct store_verify_args a = failed_args(lease, now_ms);

    return verify_async(sl, c, scope, key, &a);
}

int store_notify_set(struct store *st, const char *const *scopes, size_t n,
                     store_done_fn *done, void *arg, struct sc_error *err)
{
    return st->ops->notify_set ? st->ops->notify_set(st, scopes, n, done, arg, err)
                               : 0;
}

bool store_notified(struct store *st, const char *scope)
{
    return st->ops->notified && st->ops->notified(st, scope);
}

bool store_loop_notified(const struct store_loop *sl, const char *scope)
{
    return store_notified(sl->st, scope);
}

uint64_t store_notices(struct store *st)
{
    return st->ops->notices ? st->ops->notices(st) : 0;
}

int store_acquire_async(struct store_loop *sl, struct store_call *c,
                        const char *scope, const char *key,
                        const uint8_t fp[STORE_FP_LEN], uint64_t now_ms,
                        uint64_t lease_ms, uint64_t ttl_ms)
{
    struct store_args a = {.scope = scope, .key = key, .fp = fp,
                           .now_ms = now_ms, .lease_ms = lease_ms,
                           .ttl_ms = ttl_ms};

    return start(sl, c, STORE_OP_ACQUIRE, &a);
}

int store_complete_async(struct store_loop *sl, struct store_call *c,
                         const char *scope, const char *key, uint64_t lease,
                         uint64_t now_ms, uint64_t ttl_ms, int status,
                         const struct store_header *headers, size_t n_headers,
                         const uint8_t *body, size_t body_len,
                         bool body_omitted)
{
    struct store_args a = {.scope = scope, .key = key, .lease = lease,
                           .now_ms = now_ms,
                           .ttl_ms = ttl_ms, .status = status,
                           .headers = headers, .n_headers = n_headers,
                           .body = body, .body_len = body_len,
                           .body_omitted = body_omitted};

    return start(sl, c, STORE_OP_COMPLETE, &a);
}

int store_release_async(struct store_loop *sl, struct store_call *c,
                        const char *scope, const char *key, uint32_t attempt,
                        uint64_t lease, uint64_t now_ms, uint64_t ttl_ms)
{
    struct store_args a = {.scope = scope, .key = key, .attempt = attempt,
                           .lease = lease,
                           .now_ms = now_ms, .ttl_ms = ttl_ms};

    return start(sl, c, STORE_OP_RELEASE, &a);
}

int store_pause_set_async(struct store_loop *sl, struct store_call *c,
                          const char *scope, uint64_t now_ms, uint64_t until_ms)
{
    struct store_args a = {.scope = scope, .now_ms = now_ms,
                           .until_ms = until_ms};

    return start(sl, c, STORE_OP_PAUSE_SET, &a);
}

bool store_shares_buckets(const struct store *st)
{
    return st->ops->shares_buckets;
}

int store_permit_async(struct store_loop *sl, struct store_call *c,
                       const char *scope, const char *partition,
                       uint64_t t_ns, uint64_t tau_ns, uint64_t max_wait_ns)
{
    struct store_args a = {.scope = scope, .partition = partition,
                           .t_ns = t_ns, .tau_ns = tau_ns,
                           .max_wait_ns = max_wait_ns};

    return start(sl, c, STORE_OP_PERMIT, &a);
}

int store_permit_follow_async(struct store_loop *sl, struct store_call *c,
                              const char *scope, const char *partition,
                              const struct store_follow *f, uint64_t max_wait_ns)
{
    struct store_args a = {.scope = scope, .partition = partition,
                           .t_ns = f->t_ns, .tau_ns = f->tau_ns,
                           .max_wait_ns = max_wait_ns,
                           .seen_ms = f->seen_ms ? f->seen_ms : 1,
                           .reset_in_ns = f->reset_in_ns,
                           .next_t_ns = f->next_t_ns,
                           .next_tau_ns = f->next_tau_ns,
                           .quiet_ns = f->quiet_ns,
                           .next_quiet_ns = f->next_quiet_ns,
                           .reset_ms = f->reset_ms,
                           .top_up = f->top_up,
                           .top_up_f = f->top_up_f,
                           .flight = f->flight,
                           .hold_ms = f->hold_ms};

    return start(sl, c, STORE_OP_PERMIT, &a);
}

int store_bucket_pause_async(struct store_loop *sl, struct store_call *c,
                             const char *scope, const char *partition,
                             uint64_t t_ns, uint64_t tau_ns, uint64_t pause_ns)
{
    struct store_args a = {.scope = scope, .partition = partition,
                           .t_ns = t_ns, .tau_ns = tau_ns,
                           .pause_ns = pause_ns};

    return start(sl, c, STORE_OP_BUCKET_PAUSE, &a);
}

int store_slot_take_async(struct store_loop *sl, struct store_call *c,
                          const char *scope, const char *holder,
                          uint32_t limit, uint64_t hold_ms)
{
    struct store_args a = {.scope = scope, .holder = holder, .limit = limit,
                           .hold_ms = hold_ms};

    return start(sl, c, STORE_OP_SLOT_TAKE, &a);
}

int store_slot_give_async(struct store_loop *sl, struct store_call *c,
                          const char *scope, const char *holder)
{
    struct store_args a = {.scope = scope, .holder = holder};

    return start(sl, c, STORE_OP_SLOT_GIVE, &a);
}

int store_flight_end_async(struct store_loop *sl, struct store_call *c,
                           const char *scope, const char *partition,
                           const char *flight)
{
    struct store_args a = {.scope = scope, .partition = partition, .flight = flight};

    return start(sl, c, STORE_OP_FLIGHT_END, &a);
}

int store_permit_lease_async(struct store_loop *sl, struct store_call *c,
                             const char *scope, const char *key,
                             const uint8_t fp[STORE_FP_LEN], uint64_t now_ms,
                             uint64_t lease_ms, uint64_t ttl_ms,
                             const struct store_bucket_ask *b)
{
    struct store_args a = {.scope = scope, .key = key, .fp = fp,
                           .now_ms = now_ms, .lease_ms = lease_ms,
                           .ttl_ms = ttl_ms, .partition = b->partition,
                           .t_ns = b->t_ns, .tau_ns = b->tau_ns,
                           .max_wait_ns = b->max_wait_ns};

    return start(sl, c, STORE_OP_PERMIT_LEASE, &a);
}

int store_release_unsent_async(struct store_loop *sl, struct store_call *c,
                               const char *scope, const char *key,
                               uint32_t attempt, uint64_t lease,
                               uint64_t now_ms, uint64_t ttl_ms)
{
    struct store_args a = {.scope = scope, .key = key, .attempt = attempt,
                           .lease = lease,
                           .now_ms = now_ms, .ttl_ms = ttl_ms};

    return start(sl, c, STORE_OP_RELEASE_UNSENT, &a);
}

bool store_call_pending(const struct store_call *c)
{
    return c->pending != NULL;
}

void store_call_cancel(struct store_call *c)
{
    /* Only backends with asynchronous calls leave a call pending. */
    if (!c->pending)
        return;
    c->loop->st->ops->cancel(c);
    c->pending = NULL;
}
