/* proxy/exchange_idem.c: the key, lease and commit stages driven one by
 * one on a real RocksDB store in a temp dir, without a process or a socket:
 * a lease kept on a timeout holds off a duplicate until it expires and is
 * then taken over; a known, retryable result frees the key at once; a
 * completed one is replayed; a request that leaves without a commit frees
 * the key when nothing was sent. */
#include <criterion/criterion.h>
#include <event2/buffer.h>
#include <string.h>
#include <unistd.h>

#include "config/config.h"
#include "proxy/app.h"
#include "proxy/exchange.h"
#include "proxy/exchange_internal.h"
#include "store/store.h"
#include "support/testutil.h"

#define LEASE_MS 300

static const char yaml[] =
    "upstreams: { up: { url: http://127.0.0.1:9000, timeout: 100ms } }\n"
    "policies:\n"
    "  keyed: { idempotency: { lease: 300ms } }\n"
    "routes:\n"
    "  - { prefix: /k, upstream: up, policy: keyed }\n";

static struct sc_config *cfg;
static struct runtime rt;
static struct app app;
static struct loop lp;
static char *dir;

static void setup(void)
{
    struct sc_errors errs = {0};
    struct sc_error err = {0};

    cr_assert_eq(config_load_string("t.yaml", yaml, strlen(yaml), &cfg, &errs), 0);
    sc_errors_free(&errs);
    memset(&rt, 0, sizeof rt);
    rt.cfg = cfg;
    memset(&app, 0, sizeof app);
    dir = tu_mkdtemp("idem");
    cr_assert_eq(store_open_rocksdb(dir, false, &app.store, &err), 0, "%s", err.text);
    cr_assert_eq(claims_init(&app.claims), 0);
    cr_assert_eq(metrics_init(&app.metrics, 1), 0);
    cr_assert_eq(metrics_ids_build(&app.metrics, cfg, &rt.ids), 0);
    memset(&lp, 0, sizeof lp);
    exchange_loop_init(&lp); /* as loop_init does: the spare store calls */
    lp.app = &app;
    cr_assert_eq(store_loop_new(app.store, NULL, &lp.store, &err), 0, "%s", err.text);
}

static void teardown(void)
{
    claims_free(&app.claims);
    store_loop_free(lp.store);
    exchange_loop_clear(&lp);
    store_close(app.store);
    metrics_ids_free(&rt.ids);
    metrics_free(&app.metrics);
    tu_rm_rf(dir);
    free(dir);
    config_free(cfg);
}

TestSuite(idem, .init = setup, .fini = teardown);

static void fake(struct exchange *ex, const char *key)
{
    memset(ex, 0, sizeof *ex);
    ex->loop = &lp;
    ex->rt = &rt;
    ex->cfg = cfg;
    ex->route = &cfg->routes[0];
    ex->up = ex->route->up;
    ex->pol = ex->route->pol;
    ex->method = "POST";
    ex->target = "/k/x";
    ex->key = key;
    ex->attempt = 1;
}

/* Arrival: the key, then the store's lookup and the claim. */
static enum ex_verdict arrive(struct exchange *ex)
{
    cr_assert_eq(stage_key(ex, 0), EXV_NEXT, "key: %d %s", ex->status, ex->detail);
    return stage_lookup(ex, 0);
}

/* Arrival and lease, as the driver would run them for a request sent. */
static void send_one(struct exchange *ex)
{
    cr_assert_eq(stage_key(ex, 0), EXV_NEXT, "arrival: %d %s", ex->status, ex->detail);
    cr_assert_eq(stage_lookup(ex, 0), EXV_NEXT, "lookup: %d %s", ex->status, ex->detail);
    cr_assert_eq(stage_lease(ex, 0), EXV_NEXT, "lease: %d", ex->status);
    cr_assert(ex->leased);
    ex->sent = true;
}

/* The upstream's result, as the upstream stage leaves it. */
static void result(struct exchange *ex, enum up_result r, int status)
{
    ex->ureq.resp.result = r;
    ex->ureq.resp.status = status;
    ex->up_done = true;
    ex->classified = true;
    if (r == UP_OK && status < 400) {
        ex->kind = ANSWER_UPSTREAM;
        ex->status = status;
    } else {
        ex_instruct(ex, OUT_REQUEUE, r == UP_TIMEOUT ? R_TIMEOUT : R_UPSTREAM_5XX,
                    1000, ex->attempt, status);
    }
}

/* What the release path does once the answer is out. */
static void finish(struct exchange *ex)
{
    ex_store_cancel(ex);
    free(ex->scall);
    ex->scall = NULL;
    idem_release_lease(ex);
    idem_unclaim(ex);
    up_response_clear(&ex->ureq.resp);
    store_record_clear(&ex->replay);
}

Test(idem, lease_kept_on_a_timeout_then_taken_over)
{
    struct exchange first, dup, later;

    fake(&first, "k-timeout");
    send_one(&first);
    result(&first, UP_TIMEOUT, 0);
    cr_assert_eq(stage_commit(&first, 0), EXV_ANSWER);
    cr_expect_geq(first.instr.delay_ms, LEASE_MS, "the job waits out the lease");
    finish(&first);

    fake(&dup, "k-timeout");
    cr_assert_eq(arrive(&dup), EXV_ANSWER, "the lease holds off a duplicate");
    cr_expect_eq(dup.reason, R_LEASE_HELD);
    cr_expect_eq(dup.instr.attempt, 1, "one attempt so far");
    finish(&dup);

    usleep((LEASE_MS + 50) * 1000);
    fake(&later, "k-timeout");
    send_one(&later);
    cr_expect_eq(later.attempt, 2, "the store counts the attempts");
    finish(&later);
}

Test(idem, known_retryable_result_frees_the_key_at_once)
{
    struct exchange first, retry;

    fake(&first, "k-503");
    send_one(&first);
    result(&first, UP_OK, 503);
    cr_assert_eq(stage_commit(&first, 0), EXV_ANSWER);
    finish(&first);

    fake(&retry, "k-503");
    send_one(&retry); /* no lease_held: it may go at once */
    cr_expect_eq(retry.attempt, 2);
    finish(&retry);
}

Test(idem, completed_result_is_replayed)
{
    struct exchange first, dup;

    fake(&first, "k-ok");
    send_one(&first);
    first.ureq.resp.body = evbuffer_new();
    evbuffer_add(first.ureq.resp.body, "done", 4);
    result(&first, UP_OK, 201);
    cr_assert_eq(stage_commit(&first, 0), EXV_ANSWER);
    finish(&first);

    fake(&dup, "k-ok");
    cr_assert_eq(arrive(&dup), EXV_ANSWER);
    cr_expect_eq(dup.kind, ANSWER_REPLAY);
    cr_expect_eq(dup.replay.status, 201);
    cr_expect_eq(dup.replay.body_len, 4);
    finish(&dup);
}

/* A concurrent duplicate meets the first one's in-memory claim while that
 * waits for its permit; a request that leaves before anything was sent
 * (the worker gone) frees the key for the next. */
Test(idem, claim_then_leaving_unsent_frees_the_key)
{
    struct exchange first, dup, next;

    fake(&first, "k-left");
    cr_assert_eq(arrive(&first), EXV_NEXT);
    fake(&dup, "k-left");
    cr_expect_eq(arrive(&dup), EXV_ANSWER);
    cr_expect_eq(dup.reason, R_LEASE_HELD);
    finish(&dup);
    cr_assert_eq(stage_lease(&first, 0), EXV_NEXT);
    finish(&first); /* left without a commit, nothing sent */
    cr_expect_eq(atomic_load(&app.leases_active), 0);

    fake(&next, "k-left");
    send_one(&next);
    finish(&next);
}
