/* A verification of an unknown outcome on one loop (verification.h): a
 * timer moves it through policies/verify.h's schedule, each lookup is an
 * exchange it owns running the policy's plain plan, and each result is
 * written to the store for the very lease it was started for (the store
 * drops it otherwise). Its store steps (the claim, then one result) are
 * calls on the loop, one at a time: RocksDB answers them at once; on Redis
 * each is a round trip that blocks nothing, and a verification whose work
 * is done waits for its last write before it is freed. The request that
 * starts one is answered with its deadline while the claim is on its way:
 * a claim refused (another sidecar's came first, the lease ended) only
 * drops this verification. */
#include "proxy/server/verification.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "obs/log.h"
#include "policies/verify.h"
#include "proxy/app.h"
#include "proxy/exchange/driver.h"
#include "proxy/runtime.h"
#include "proxy/server/server.h"
#include "util/clock.h"

struct verification {
    struct loop *w;
    struct runtime *rt;         /* a reference: the config it runs on */
    const struct sc_policy *pol;
    long policy;                /* its index in rt->cfg */
    size_t upstream;            /* the upstream the lease's request went to */
    char key[256];
    uint64_t fence;             /* the lease's (store_record.lease) */
    char *target;               /* the lookup's, base path and {key} filled */
    struct verify v;            /* its schedule, on the monotonic clock (ms) */
    struct event *timer;
    struct exchange *ex;        /* the lookup out, or NULL */
    bool lookup_ended;          /* its answer is decided, to be read */
    struct store_call call;     /* its store step in flight */
    bool calling;               /* ... that call is in flight */
    enum verify_state writing;  /* ... a result (VERIFY_NONE: the claim) */
    bool ended;                 /* done: freed once that call completes */
    TAILQ_ENTRY(verification) link;
};

static void on_timer(evutil_socket_t fd, short what, void *arg);

static uint64_t mono_ms(void)
{
    return clock_mono_ns() / NS_PER_MS;
}

static void arm(struct verification *vf, uint64_t at_ms)
{
    uint64_t now = mono_ms();
    struct timeval tv = clock_ns_to_tv(at_ms > now ? (at_ms - now) * NS_PER_MS : 0);

    evtimer_del(vf->timer);
    evtimer_add(vf->timer, &tv);
}

/* ---- the lookup: a request sluice makes itself ----------------------------- */

/* The driver suspends and resumes it like a worker's; nothing to watch,
 * no worker headers to forward. The answer is read on the next timer
 * pass, outside the driver's and the upstream client's calls. */
static void lookup_suspend(struct exchange *ex)
{
}

static void lookup_resume(struct exchange *ex)
{
    struct verification *vf = ex->owner_arg;

    vf->lookup_ended = true;
    arm(vf, 0);
}

static int lookup_client_fd(struct exchange *ex)
{
    return -1;
}

static void lookup_headers(struct exchange *ex, ex_header_fn fn, void *arg)
{
}

static const struct ex_owner lookup_owner = {
    .suspend = lookup_suspend,
    .resume = lookup_resume,
    .client_fd = lookup_client_fd,
    .headers = lookup_headers,
};

static void lookup_free(struct verification *vf)
{
    if (!vf->ex)
        return;
    ex_release_all(vf->ex);
    free(vf->ex);
    vf->ex = NULL;
    vf->lookup_ended = false;
}

/* The lookup as a request of the policy: its plain plan (permit, slot,
 * send check, upstream, feedback, body), ending by end_ms: its wait for a
 * permit and a slot and its upstream timeout are what is left until then. */
static int lookup_send(struct verification *vf, uint64_t end_ms)
{
    struct runtime *rt = vf->rt;
    const struct sc_upstream *up = &rt->cfg->upstreams[vf->upstream];
    uint64_t left = end_ms > mono_ms() ? end_ms - mono_ms() : 1;
    struct exchange *ex = calloc(1, sizeof *ex);

    if (!ex)
        return -ENOMEM;
    ex->env = &vf->w->env;
    ex->owner = &lookup_owner;
    ex->owner_arg = vf;
    ex->rt = rt;
    ex->cfg = rt->cfg;
    ex->ids = &rt->ids;
    ex->method = vf->pol->idem.verify.method == SC_M_HEAD ? "HEAD" : "GET";
    ex->up = up;
    ex->pol = vf->pol;
    ex->ps = pacing_policy(&rt->pacing, vf->policy);
    ex->label = vf->pol->name;
    ex->upstream_idx = vf->upstream;
    ex->max_wait_ns = left * NS_PER_MS;
    ex->timeout_ms = left;
    ex->upstream_target = vf->target;
    ex->pool = rt->pools[vf->w->idx][vf->upstream];
    ex->http_proxy = up->https ? NULL : rt->proxies[vf->upstream];
    ex->t0_ns = clock_mono_ns();
    ex->t0_wall_ms = clock_wall_ms();
    ex->plan = ex_plan_for(runtime_plans(rt, vf->policy), false);
    vf->ex = ex;
    ex_start(ex);
    if (ex->phase == PH_READY && !ex->suspended)
        vf->lookup_ended = true; /* answered at once (refused a permit) */
    return 0;
}

/* The lookup's status: 0 without an answer (a transport failure, no permit
 * or slot in time). */
static int lookup_status(const struct exchange *ex)
{
    const struct up_response *r = &ex->ureq.resp;

    return ex->phase >= PH_READY && ex->sent && r->result == UP_OK &&
                   r->status >= 100 ? r->status : 0;
}

/* Its own access-log line: no key, no query; the key's hash. */
static void lookup_log(const struct verification *vf, int status,
                       enum verify_class c)
{
    const struct exchange *ex = vf->ex;
    const struct up_request *u = &ex->ureq;
    struct lookup_entry e = {
        .request_id = ex->request_id[0] ? ex->request_id : NULL,
        .policy = vf->pol->name,
        .upstream = ex->up->name,
        .method = ex->method,
        .base_path = ex->up->base_path ? ex->up->base_path : "",
        .path = vf->pol->idem.verify.path,
        .upstream_status = status,
        .result = verify_class_name(c),
        .permit_wait_ms = (double)ex->permit_wait_ns / 1e6,
        .upstream_ms = u->done_ns > u->sent_ns && u->sent_ns
                           ? (double)(u->done_ns - u->sent_ns) / 1e6 : 0,
        .key = vf->key,
    };

    if (vf->rt->cfg->log.access)
        log_lookup(&e);
}

/* ---- results ---------------------------------------------------------------- */

static void count(struct verification *vf, enum verify_state result)
{
    uint32_t slot = metrics_verification_slot(&vf->rt->ids, (size_t)vf->policy, result);

    if (slot != UINT32_MAX)
        metrics_add(vf->w->env.metrics, slot, 1);
}

/* A store step's answer: applied (counted), or dropped because the lease
 * it was for has ended (expired and taken over, forgotten, completed). */
static void applied(struct verification *vf, enum verify_state result, int rc,
                    const struct sc_error *err)
{
    if (rc == 0) {
        count(vf, result);
        log_info("policy %s: verification of a key %s", vf->pol->name,
                 result == VERIFY_FOUND    ? "found the operation: its record is completed"
                 : result == VERIFY_ABSENT ? "found no operation: its lease is released"
                                           : "failed: its lease waits out its expiry");
    } else if (rc == -ENOENT || rc == -ESTALE || rc == -EALREADY)
        log_info("policy %s: a verification's result is dropped: its lease "
                 "has ended", vf->pol->name);
    else
        log_error("policy %s: cannot store a verification's result: %s",
                  vf->pol->name, err->text);
}

static void on_step_done(struct store_call *c);

/* Starts the call a step made (rc: its start's answer) as the one in
 * flight; a result answered at once (RocksDB) is applied here. */
static void step_started(struct verification *vf, enum verify_state writing, int rc)
{
    if (rc == -EINPROGRESS) {
        vf->calling = true;
        vf->writing = writing;
    } else if (writing != VERIFY_NONE) {
        applied(vf, writing, rc, &vf->call.err);
    }
}

static struct store_call *step_call(struct verification *vf)
{
    memset(&vf->call, 0, sizeof vf->call);
    vf->call.done = on_step_done;
    vf->call.arg = vf;
    return &vf->call;
}

/* Found: the record completes from the lookup's answer, as a response is
 * stored (a body over max_stored_body, or not read whole, is omitted);
 * the call copies what it writes as it starts. */
static void store_found(struct verification *vf)
{
    struct exchange *ex = vf->ex;
    const struct up_response *r = &ex->ureq.resp;
    size_t blen = r->body ? evbuffer_get_length(r->body) : 0;
    bool omit = !ex->up_done || blen > vf->pol->idem.max_stored_body;
    struct store_header *h = calloc(r->n_headers + 1, sizeof *h);
    int rc;

    if (!h) {
        sc_error_set(&vf->call.err, "out of memory");
        applied(vf, VERIFY_FOUND, -ENOMEM, &vf->call.err);
        return;
    }
    rc = store_verify_found_async(vf->w->env.store, step_call(vf), vf->pol->name,
                                  vf->key, vf->fence, clock_wall_ms(),
                                  vf->pol->idem.ttl_ms, r->status, h,
                                  ex_stored_headers(ex, r, h),
                                  omit || !blen ? NULL : evbuffer_pullup(r->body, -1),
                                  omit ? 0 : blen, omit);
    free(h);
    step_started(vf, VERIFY_FOUND, rc);
}

/* The lookup's answer is in (or it was cut at its end): read, logged,
 * found written at once (the answer is at hand only now). */
static void lookup_read(struct verification *vf)
{
    int status = lookup_status(vf->ex);
    enum verify_class c = verify_classify(&vf->pol->idem.verify, status);

    lookup_log(vf, status, c);
    if (verify_lookup_done(&vf->v, c, mono_ms()) == VERIFY_FOUND)
        store_found(vf);
    lookup_free(vf);
}

static void verification_free(struct verification *vf)
{
    store_call_cancel(&vf->call); /* at shutdown: its answer is not awaited */
    lookup_free(vf);
    if (vf->timer)
        event_free(vf->timer);
    TAILQ_REMOVE(&vf->w->verifications, vf, link);
    runtime_put(vf->rt);
    free(vf->target);
    free(vf);
}

/* Freed now, or once its call in flight (the last result) completes. */
static void end(struct verification *vf)
{
    if (vf->calling) {
        vf->ended = true;
        evtimer_del(vf->timer);
        return;
    }
    verification_free(vf);
}

/* The verification ended: absent and failed are written here (found was,
 * with its answer, and may still be on its way). */
static void finish(struct verification *vf)
{
    struct store_loop *sl = vf->w->env.store;
    uint64_t now = clock_wall_ms();

    if (!vf->calling && vf->v.state == VERIFY_ABSENT)
        step_started(vf, VERIFY_ABSENT,
                     store_verify_absent_async(sl, step_call(vf), vf->pol->name,
                                               vf->key, vf->fence, now,
                                               vf->pol->idem.ttl_ms));
    else if (!vf->calling && vf->v.state == VERIFY_FAILED)
        step_started(vf, VERIFY_FAILED,
                     store_verify_failed_async(sl, step_call(vf), vf->pol->name,
                                               vf->key, vf->fence, now));
    end(vf);
}

/* Moves the verification as far as it can go now. */
static void advance(struct verification *vf)
{
    for (;;) {
        struct verify_step s;

        if (vf->lookup_ended)
            lookup_read(vf);
        s = verify_next(&vf->v, mono_ms());
        switch (s.kind) {
        case VSTEP_WAIT:
            arm(vf, s.at_ms);
            return;
        case VSTEP_LOOKUP:
            if (lookup_send(vf, s.at_ms) != 0) {
                verify_lookup_done(&vf->v, VC_OTHER, mono_ms());
                continue;
            }
            if (vf->lookup_ended)
                continue;
            arm(vf, s.at_ms);
            return;
        case VSTEP_BUSY:
            if (!vf->lookup_ended && mono_ms() < s.at_ms) {
                arm(vf, s.at_ms);
                return;
            }
            /* Past its end: cut, a failed lookup. */
            vf->lookup_ended = true;
            continue;
        case VSTEP_DONE:
            finish(vf);
            return;
        }
    }
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    advance(arg);
}

/* ---- starting one ----------------------------------------------------------- */

struct lease_facts {
    long policy;
    size_t upstream;
    uint64_t timeout_ms;        /* T */
    const char *key;
    uint64_t fence;
    uint32_t attempt;
    uint64_t expires_ms;        /* the lease's expiry, wall clock */
    bool again;                 /* start-up: a pending mark is taken up */
};

static struct verification *verification_new(struct loop *w, struct runtime *rt,
                                             const struct lease_facts *f)
{
    const struct sc_policy *pol = &rt->cfg->policies[f->policy];
    const struct sc_upstream *up = &rt->cfg->upstreams[f->upstream];
    const char *base = up->base_path ? up->base_path : "";
    size_t tlen = verify_target_size(base, pol->idem.verify.path, f->key);
    struct verification *vf = calloc(1, sizeof *vf);

    if (!vf || strlen(f->key) >= sizeof vf->key || !(vf->target = malloc(tlen)) ||
        !(vf->timer = evtimer_new(w->base, on_timer, vf))) {
        if (vf)
            free(vf->target);
        free(vf);
        return NULL;
    }
    verify_target(base, pol->idem.verify.path, f->key, vf->target, tlen);
    vf->w = w;
    vf->pol = pol;
    vf->policy = f->policy;
    vf->upstream = f->upstream;
    vf->fence = f->fence;
    strcpy(vf->key, f->key);
    return vf;
}

/* The claim's answer: refused, the verification is dropped (another
 * sidecar's claim came first, or the lease has ended); else its schedule
 * runs. */
static void claimed(struct verification *vf, int rc, const struct sc_error *err)
{
    if (rc != 0) {
        if (rc != -EALREADY && rc != -ESTALE && rc != -ENOENT)
            log_error("policy %s: cannot start a verification: %s",
                      vf->pol->name, err->text);
        verification_free(vf);
    } else if (vf->v.state == VERIFY_FAILED) {
        /* The lease ends before a first lookup could go: its expiry
         * settles it, as without verify. */
        finish(vf);
    } else {
        arm(vf, vf->v.due_ms);
    }
}

static void on_step_done(struct store_call *c)
{
    struct verification *vf = c->arg;
    enum verify_state wrote = vf->writing;

    vf->calling = false;
    vf->writing = VERIFY_NONE;
    if (wrote == VERIFY_NONE) {
        claimed(vf, c->rc, &c->err);
        return;
    }
    applied(vf, wrote, c->rc, &c->err);
    if (vf->ended)
        verification_free(vf);
}

/* Claims the lease and starts its verification on w: D (wall ms), or 0.
 * Takes a reference on rt for the verification's life. */
static uint64_t start(struct loop *w, struct runtime *rt, const struct lease_facts *f)
{
    const struct sc_policy *pol = &rt->cfg->policies[f->policy];
    uint64_t now_wall = clock_wall_ms(), now = mono_ms(), deadline;
    struct verify_lease lease = {.attempt = f->attempt, .expires_ms = f->expires_ms};
    struct verify_params p;
    struct verification *vf;
    bool failed;
    int rc;

    if (f->expires_ms <= now_wall || !(vf = verification_new(w, rt, f)))
        return 0;
    verify_params_set(&p, &pol->idem.verify, f->timeout_ms);
    verify_start(&vf->v, &p, &lease, f->expires_ms - now_wall, now);
    deadline = now_wall + (vf->v.deadline_ms - now);
    failed = vf->v.state == VERIFY_FAILED;
    atomic_fetch_add(&rt->refs, 1); /* held until verification_free */
    vf->rt = rt;
    TAILQ_INSERT_TAIL(&w->verifications, vf, link);
    rc = store_verify_claim_async(w->env.store, step_call(vf), pol->name, f->key,
                                  f->fence, now_wall, deadline, f->again);
    if (rc == -EINPROGRESS) {
        step_started(vf, VERIFY_NONE, rc);
        return failed ? 0 : deadline;
    }
    claimed(vf, rc, &vf->call.err); /* may free vf */
    return rc == 0 && !failed ? deadline : 0;
}

/* The verification of ex's key's lease `fence`, ending at expires_ms
 * (wall), with ex's upstream and T. */
static uint64_t begin_for(struct loop *w, struct exchange *ex, uint64_t fence,
                          uint64_t expires_ms, uint32_t attempt, bool again)
{
    struct lease_facts f = {
        .policy = ex->route ? ex->route->policy : -1,
        .upstream = ex->upstream_idx,
        .timeout_ms = ex->timeout_ms,
        .key = ex->key,
        .fence = fence,
        .attempt = attempt,
        .expires_ms = expires_ms,
        .again = again,
    };

    if (f.policy < 0 || !ex->key || !fence || !expires_ms)
        return 0;
    return start(w, ex->rt, &f);
}

uint64_t verification_begin(void *loop, struct exchange *ex)
{
    return begin_for(loop, ex, ex->lease, ex->lease_expires_ms, ex->attempt, false);
}

uint64_t verification_take_up(void *loop, struct exchange *ex, uint64_t fence,
                              uint64_t expires_ms, bool again)
{
    return begin_for(loop, ex, fence, expires_ms, 0, again);
}

/* ---- start-up --------------------------------------------------------------- */

/* The upstream and T of a policy's lookups when the lease does not say
 * (a record keeps neither): the one upstream its routes go to, with the
 * longest of their timeouts. false when its routes go to several. */
static bool policy_upstream(const struct sc_config *cfg, long policy,
                            size_t *upstream, uint64_t *timeout_ms)
{
    bool found = false;

    *timeout_ms = 0;
    for (size_t i = 0; i < cfg->n_routes; i++) {
        const struct sc_route *r = &cfg->routes[i];
        uint64_t t;

        if (r->policy != policy)
            continue;
        if (found && r->upstream != *upstream)
            return false;
        found = true;
        *upstream = r->upstream;
        t = sc_route_timeout(r, r->up);
        if (t > *timeout_ms)
            *timeout_ms = t;
    }
    return found;
}

struct resume {
    struct app *app;
    unsigned next_loop;
    unsigned started;
};

static int resume_one(void *arg, const char *scope, const char *key,
                      const struct store_record *rec)
{
    struct resume *rs = arg;
    struct runtime *rt = rs->app->rt;
    struct lease_facts f = {
        .policy = config_policy_index(rt->cfg, scope),
        .key = key,
        .fence = rec->lease,
        .attempt = rec->attempt,
        .expires_ms = rec->lease_expires_ms,
        .again = true,
    };
    const struct sc_policy *pol;

    if (f.policy < 0 || rec->verify == VERIFY_FAILED)
        return 0;
    pol = &rt->cfg->policies[f.policy];
    if (!pol->idem.enabled || !pol->idem.verify.enabled)
        return 0;
    if (!policy_upstream(rt->cfg, f.policy, &f.upstream, &f.timeout_ms)) {
        log_warn("policy %s: a lease left in progress is kept until it expires: "
                 "the policy's routes go to several upstreams, and the lease "
                 "does not say which one its request went to", pol->name);
        return 0;
    }
    if (start(&rs->app->loops[rs->next_loop], rt, &f))
        rs->started++;
    rs->next_loop = (rs->next_loop + 1) % rs->app->n_loops;
    return 0;
}

unsigned verification_resume_all(struct app *app)
{
    struct resume rs = {.app = app};
    struct sc_error err = {0};
    bool any = false;

    for (size_t i = 0; i < app->rt->cfg->n_policies; i++)
        any |= app->rt->cfg->policies[i].idem.enabled &&
               app->rt->cfg->policies[i].idem.verify.enabled;
    /* A shared store's leases are not this process's to take up. */
    if (!any || store_shares_buckets(app->store))
        return 0;
    if (store_leases_each(app->store, clock_wall_ms(), resume_one, &rs, &err) != 0)
        log_error("cannot take up the leases left in progress: %s", err.text);
    if (rs.started)
        log_info("verifying %u lease%s left in progress by an earlier run",
                 rs.started, rs.started == 1 ? "" : "s");
    return rs.started;
}

void verification_stop_all(struct loop *w)
{
    struct verification *vf;

    while ((vf = TAILQ_FIRST(&w->verifications)))
        verification_free(vf);
}
