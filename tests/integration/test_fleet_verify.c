/* Fleet mode (docs/contract.md §10) settling unknown outcomes (§11) and
 * duplicates that wait (§6): two real sluices on one real redis-server in
 * front of one real stub playing a partner that ignores Idempotency-Key but
 * offers a lookup (--lookup). An unknown outcome through sidecar A is
 * verified by A, and sidecar B sees its mark and then its result: the
 * replay (found) or the key freed (absent). A duplicate sent to B while the
 * key is in progress on A waits for A's record instead of bouncing: one
 * upstream call and the same body for both; A's known failure lets it go
 * as a first request; a holder slower than max_wait leaves it lease_held.
 * And a sidecar killed (-9) while its request is at the partner: once its
 * liveness key lapses (3 s), a duplicate through the other sidecar starts
 * the verification of its lease there. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "integration/harness.h"
#include "support/redis_server.h"

#define FLEET 2

static struct redis_server rs;
static struct h_stub stub;
static struct h_sluice sl[FLEET];

/* T = 300 ms, after = 400 ms, 2 attempts: D = 1400 ms. */
#define CONFIG                                                                 \
    "store: {backend: redis, url: \"redis://127.0.0.1:%u/0\", timeout: 500ms,\n" \
    "        fleet_size: 2}\n"                                                  \
    "upstreams: {quick: {url: http://127.0.0.1:%d, timeout: 300ms},\n"         \
    "            slow: {url: http://127.0.0.1:%d, timeout: 5s}}\n"             \
    "policies:\n"                                                             \
    "  v:\n"                                                                  \
    "    rate: 50/s\n"                                                        \
    "    shared: redis\n"                                                     \
    "    retry: {base: 10ms}\n"                                              \
    "    idempotency:\n"                                                      \
    "      lease: 30s\n"                                                      \
    "      verify: {path: \"/lookup?client_ref={key}\", after: 400ms, attempts: 2}\n" \
    "  vs:\n"                                                                 \
    "    rate: 50/s\n"                                                        \
    "    shared: redis\n"                                                     \
    "    idempotency:\n"                                                      \
    "      lease: 30s\n"                                                      \
    "      verify: {path: \"/lookup?client_ref={key}\", after: 300ms, attempts: 2}\n" \
    "  vl:\n"                                                                 \
    "    rate: 50/s\n"                                                        \
    "    shared: local\n"                                                     \
    "    idempotency:\n"                                                      \
    "      lease: 30s\n"                                                      \
    "      verify: {path: \"/lookup?client_ref={key}\", after: 300ms, attempts: 2}\n" \
    "  vw:\n"                                                                 \
    "    rate: 50/s\n"                                                        \
    "    max_wait: 10s\n"                                                     \
    "    idempotency:\n"                                                      \
    "      lease: 30s\n"                                                      \
    "      duplicates: wait\n"                                                \
    "      verify: {path: \"/lookup?client_ref={key}\", after: 300ms, attempts: 2}\n" \
    "  w: {rate: 50/s, shared: redis, max_wait: 3s,\n"                        \
    "      idempotency: {lease: 30s, duplicates: wait}}\n"                    \
    "  short: {rate: 50/s, shared: redis, max_wait: 300ms,\n"                 \
    "          idempotency: {lease: 30s, duplicates: wait}}\n"                \
    "routes:\n"                                                               \
    "  - {prefix: /v, upstream: quick, policy: v}\n"                          \
    "  - {prefix: /vs, upstream: slow, policy: vs}\n"                         \
    "  - {prefix: /vl, upstream: slow, policy: vl}\n"                         \
    "  - {prefix: /vw, upstream: slow, policy: vw}\n"                         \
    "  - {prefix: /w, upstream: slow, policy: w}\n"                           \
    "  - {prefix: /short, upstream: slow, policy: short}\n"

static void stop(void)
{
    for (int i = 0; i < FLEET; i++)
        h_sluice_cleanup(&sl[i]);
    h_stub_stop(&stub);
    redis_server_destroy(&rs);
}

static void start(void)
{
    const char *args[] = {"--lookup", "/lookup?client_ref=", NULL};
    char *cfg;

    cr_assert_eq(redis_server_start(&rs, 0, NULL), 0, "redis-server did not start");
    if (h_stub_start(&stub, args) != 0) {
        redis_server_destroy(&rs);
        cr_assert_fail("the stub did not start");
    }
    cr_assert(asprintf(&cfg, CONFIG, rs.port, stub.port, stub.port) > 0);
    for (int i = 0; i < FLEET; i++)
        if (h_sluice_start(&sl[i], cfg) != 0) {
            free(cfg);
            stop(); /* an assert in .init skips .fini */
            cr_assert_fail("sluice %d did not start", i);
        }
    free(cfg);
}

TestSuite(fleet_verify, .init = start, .fini = stop, .timeout = 60);

struct call {
    int sidecar;
    const char *target, *key, *extra;
    struct h_resp r;
};

#define CALL(i, t, k, x) {.sidecar = (i), .target = (t), .key = (k), .extra = (x)}

static int post(struct call *c)
{
    char hdr[512];

    snprintf(hdr, sizeof hdr, "Idempotency-Key: %s\r\n%s", c->key,
             c->extra ? c->extra : "");
    return h_http(sl[c->sidecar].port, "POST", c->target, hdr, "{\"qty\":1}", 9,
                  &c->r);
}

static void *post_thread(void *arg)
{
    post(arg);
    return NULL;
}

/* Starts the holder's request and returns once it is at the stub. */
static void start_holder(pthread_t *t, struct call *c)
{
    pthread_create(t, NULL, post_thread, c);
    for (int i = 0; i < 200 && h_stub_stat(&stub, "in_flight") < 1; i++)
        usleep(5000);
    cr_assert_eq(h_stub_stat(&stub, "in_flight"), 1, "the holder is at the partner");
}

static json_t *body_json(const struct h_resp *r)
{
    json_t *j = json_loads(r->body ? r->body : "", 0, NULL);

    cr_assert_not_null(j, "not JSON: %s", r->body);
    return j;
}

static const char *jstr(json_t *j, const char *k)
{
    const char *v = json_string_value(json_object_get(j, k));

    return v ? v : "(none)";
}

/* The admin record of key on sidecar i, or NULL when there is none. */
static json_t *record(int i, const char *policy, const char *key)
{
    char path[256];
    struct h_resp r;
    json_t *j = NULL;

    snprintf(path, sizeof path, "/idempotency/%s/%s", policy, key);
    cr_assert_eq(h_http(sl[i].admin_port, "GET", path, NULL, NULL, 0, &r), 0);
    if (r.status == 200)
        j = body_json(&r);
    h_resp_free(&r);
    return j;
}

/* Waits (up to 5 s) for the record's "verify", seen through sidecar i. */
static json_t *await_verify_of(int i, const char *policy, const char *key,
                               const char *want)
{
    for (int n = 0; n < 250; n++) {
        json_t *j = record(i, policy, key);

        if (j && !strcmp(jstr(j, "verify"), want))
            return j;
        json_decref(j);
        usleep(20000);
    }
    cr_assert_fail("%s: verify never became %s", key, want);
    return NULL;
}

static json_t *await_verify(int i, const char *key, const char *want)
{
    return await_verify_of(i, "v", key, want);
}

/* The answer to the unknown outcome: requeue at once with D (1400 ms), not
 * the lease (30 s), "verify": "pending". */
static void expect_pending_requeue(const struct h_resp *r, const char *reason)
{
    json_t *j = body_json(r);

    cr_expect_eq(r->status, 503, "%s", r->body);
    cr_expect_str_eq(jstr(j, "reason"), reason);
    cr_expect_str_eq(jstr(j, "verify"), "pending");
    cr_expect_leq(json_integer_value(json_object_get(j, "delay_ms")), 1400, "%s", r->body);
    cr_expect_geq(json_integer_value(json_object_get(j, "delay_ms")), 1200, "%s", r->body);
    json_decref(j);
}

Test(fleet_verify, executed_then_dropped_on_one_sidecar_is_replayed_verified_by_another)
{
    struct call a = CALL(0, "/v/orders", "fv-found", "X-Stub-Drop: before\r\n");
    struct call b = CALL(1, "/v/orders", "fv-found", NULL);
    json_t *j;

    cr_assert_eq(post(&a), 0);
    expect_pending_requeue(&a.r, "connection_lost");
    /* Through the other sidecar, while the lookup is due: lease_held with
     * what remains of D, the mark read from Redis. */
    cr_assert_eq(post(&b), 0);
    cr_expect_eq(b.r.status, 409, "%s", b.r.body);
    j = body_json(&b.r);
    cr_expect_str_eq(jstr(j, "reason"), "lease_held");
    cr_expect_str_eq(jstr(j, "verify"), "pending");
    cr_expect_leq(json_integer_value(json_object_get(j, "delay_ms")), 1400, "%s", b.r.body);
    json_decref(j);
    h_resp_free(&b.r);

    j = await_verify(1, "fv-found", "found");
    cr_expect_str_eq(jstr(j, "state"), "completed");
    cr_expect(json_is_true(json_object_get(j, "verified")));
    cr_expect_eq(json_integer_value(json_object_get(j, "attempt")), 1);
    json_decref(j);
    cr_assert_eq(post(&b), 0);
    cr_expect_eq(b.r.status, 200, "%s", b.r.body);
    cr_expect_str_eq(h_header_str(&b.r, "Sluice-Outcome"), "replayed");
    cr_expect_str_eq(h_header_str(&b.r, "Sluice-Verified"), "true");
    cr_expect(b.r.body && !strcmp(b.r.body, "{\"qty\":1}"), "%s", b.r.body);
    cr_expect_eq(h_stub_key_stat(&stub, "fv-found", "side_effects"), 1);
    cr_expect_eq(h_stub_stat(&stub, "lookups"), 1, "one verification for the fleet");
    h_resp_free(&a.r);
    h_resp_free(&b.r);
}

Test(fleet_verify, dropped_before_executing_is_absent_and_another_sidecar_goes_at_once)
{
    struct call a = CALL(0, "/v/orders", "fv-absent", "X-Stub-Drop: unexecuted\r\n");
    struct call b = CALL(1, "/v/orders", "fv-absent", NULL);
    json_t *j;

    cr_assert_eq(post(&a), 0);
    expect_pending_requeue(&a.r, "connection_lost");
    j = await_verify(1, "fv-absent", "absent");
    json_decref(j);
    cr_assert_eq(post(&b), 0);
    cr_expect_eq(b.r.status, 200, "forwarded now, not after the lease: %s", b.r.body);
    cr_expect_str_eq(h_header_str(&b.r, "Sluice-Outcome"), "ok");
    cr_expect_str_eq(h_header_str(&b.r, "Sluice-Verified"), "(none)");
    cr_expect_eq(h_stub_key_stat(&stub, "fv-absent", "side_effects"), 1);
    j = record(0, "v", "fv-absent");
    cr_expect_eq(json_integer_value(json_object_get(j, "attempt")), 2);
    json_decref(j);
    h_resp_free(&a.r);
    h_resp_free(&b.r);
}

Test(fleet_verify, stalled_past_the_timeout_is_found)
{
    struct call a = CALL(0, "/v/orders", "fv-stall", "X-Stub-Delay-Ms: 1500\r\n");
    struct call b = CALL(1, "/v/orders", "fv-stall", NULL);

    cr_assert_eq(post(&a), 0);
    expect_pending_requeue(&a.r, "timeout");
    json_decref(await_verify(1, "fv-stall", "found"));
    cr_assert_eq(post(&b), 0);
    cr_expect_eq(b.r.status, 200, "%s", b.r.body);
    cr_expect_str_eq(h_header_str(&b.r, "Sluice-Verified"), "true");
    cr_expect_eq(h_stub_key_stat(&stub, "fv-stall", "side_effects"), 1);
    h_resp_free(&a.r);
    h_resp_free(&b.r);
}

Test(fleet_verify, a_duplicate_on_another_sidecar_waits_for_the_holders_replay)
{
    struct call a = CALL(0, "/w/jobs", "fw-1", "X-Stub-Delay-Ms: 300\r\n");
    struct call b = CALL(1, "/w/jobs", "fw-1", NULL);
    pthread_t t;

    start_holder(&t, &a);
    cr_assert_eq(post(&b), 0);
    pthread_join(t, NULL);
    cr_expect_eq(a.r.status, 200);
    cr_expect_eq(b.r.status, 200, "the duplicate waited: %s", b.r.body);
    cr_expect_str_eq(h_header_str(&b.r, "Sluice-Outcome"), "replayed");
    cr_expect(a.r.body_len == b.r.body_len && !memcmp(a.r.body, b.r.body, a.r.body_len),
              "the same body");
    cr_expect_eq(h_stub_key_stat(&stub, "fw-1", "side_effects"), 1, "one upstream call");
    h_resp_free(&a.r);
    h_resp_free(&b.r);
}

Test(fleet_verify, a_holders_known_failure_lets_the_waiter_go_first)
{
    struct call a = CALL(0, "/w/jobs", "fw-2", "X-Stub-Delay-Ms: 300\r\nX-Stub-Status: 500\r\n");
    struct call b = CALL(1, "/w/jobs", "fw-2", NULL);
    pthread_t t;

    start_holder(&t, &a);
    cr_assert_eq(post(&b), 0);
    pthread_join(t, NULL);
    cr_expect_eq(a.r.status, 500, "%s", a.r.body);
    cr_expect_eq(b.r.status, 200, "the duplicate went on: %s", b.r.body);
    cr_expect_str_eq(h_header_str(&b.r, "Sluice-Outcome"), "ok");
    cr_expect_eq(h_stub_stat(&stub, "in_flight_max"), 1, "never two at once");
    h_resp_free(&a.r);
    h_resp_free(&b.r);
}

Test(fleet_verify, a_holder_slower_than_max_wait_leaves_the_duplicate_lease_held)
{
    struct call a = CALL(0, "/short/jobs", "fw-3", "X-Stub-Delay-Ms: 1500\r\n");
    struct call b = CALL(1, "/short/jobs", "fw-3", NULL);
    pthread_t t;
    json_t *j;

    start_holder(&t, &a);
    cr_assert_eq(post(&b), 0);
    cr_expect_eq(b.r.status, 409, "%s", b.r.body);
    j = body_json(&b.r);
    cr_expect_str_eq(jstr(j, "reason"), "lease_held");
    json_decref(j);
    pthread_join(t, NULL);
    cr_expect_eq(a.r.status, 200);
    cr_expect_eq(h_stub_key_stat(&stub, "fw-3", "side_effects"), 1);
    h_resp_free(&a.r);
    h_resp_free(&b.r);
}

/* Kills sidecar 0 while its request for key is at the partner, then sends
 * the key through sidecar 1 until an answer says the verification is
 * pending there (its holder's liveness key lapsed): the seconds it took. */
static double kill_holder_then_await_pending(const char *target, const char *key,
                                             const char *extra)
{
    struct call a = CALL(0, target, key, extra);
    struct call b = CALL(1, target, key, NULL);
    struct timespec t0, t1;
    pthread_t t;
    bool pending = false, held_first = false;

    start_holder(&t, &a);
    kill(sl[0].pid, SIGKILL);
    pthread_join(t, NULL);
    h_resp_free(&a.r);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < 100 && !pending; i++) {
        json_t *j;

        cr_assert_eq(post(&b), 0);
        cr_assert_eq(b.r.status, 409, "held until verified: %s", b.r.body);
        j = body_json(&b.r);
        pending = !strcmp(jstr(j, "verify"), "pending");
        if (!pending)
            held_first = true;
        json_decref(j);
        h_resp_free(&b.r);
        if (!pending)
            usleep(100 * 1000);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    cr_assert(pending, "the dead holder's lease was never verified");
    cr_expect(held_first, "a live holder's lease is not verified: only once its key lapsed");
    return (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
}

/* The request through sidecar 0 reached the partner and sidecar 0 was
 * killed: sidecar 1 verifies its lease, finds the operation, and replays
 * it (one side effect). */
static void expect_found_by_another(const char *target, const char *policy,
                                    const char *key)
{
    struct call b = CALL(1, target, key, NULL);
    double took = kill_holder_then_await_pending(target, key, "X-Stub-Delay-Ms: 8000\r\n");
    json_t *j;

    cr_expect_leq(took, 4.5, "taken up once the key lapsed (3 s): %.2f s", took);
    j = await_verify_of(1, policy, key, "found");
    cr_expect(json_is_true(json_object_get(j, "verified")));
    json_decref(j);
    cr_assert_eq(post(&b), 0);
    cr_expect_eq(b.r.status, 200, "%s", b.r.body);
    cr_expect_str_eq(h_header_str(&b.r, "Sluice-Verified"), "true");
    cr_expect_str_eq(h_header_str(&b.r, "Sluice-Outcome"), "replayed");
    cr_expect_eq(h_stub_key_stat(&stub, key, "side_effects"), 1);
    h_resp_free(&b.r);
}

Test(fleet_verify, a_killed_sidecars_executed_request_is_found_by_another)
{
    expect_found_by_another("/vs/orders", "vs", "fk-found");
}

Test(fleet_verify, a_killed_sidecars_unexecuted_request_is_absent_and_goes_first)
{
    struct call b = CALL(1, "/vs/orders", "fk-absent", NULL);

    kill_holder_then_await_pending("/vs/orders", "fk-absent",
                                   "X-Stub-Delay-Ms: 8000\r\nX-Stub-Drop: unexecuted\r\n");
    json_decref(await_verify_of(1, "vs", "fk-absent", "absent"));
    cr_assert_eq(post(&b), 0);
    cr_expect_eq(b.r.status, 200, "forwarded as a first request: %s", b.r.body);
    cr_expect_str_eq(h_header_str(&b.r, "Sluice-Outcome"), "ok");
    cr_expect_eq(h_stub_key_stat(&stub, "fk-absent", "side_effects"), 1);
    h_resp_free(&b.r);
}

/* A policy paced by each sidecar (shared: local) keeps its records in the
 * fleet's Redis but has no permit script: its lookup is a plain read, and
 * the holder's liveness key is looked at on its own. */
Test(fleet_verify, a_killed_sidecars_request_on_a_locally_paced_policy_is_found_by_another)
{
    expect_found_by_another("/vl/orders", "vl", "fl-found");
}

/* A duplicate already waiting on sidecar 1 (duplicates: wait) when the
 * holder's sidecar is killed: its looks see the holder gone once the key
 * lapses, start the verification, and it is answered the verified replay
 * within its max_wait, without a second call to the partner. */
Test(fleet_verify, a_waiting_duplicate_settles_a_holder_killed_while_it_waits)
{
    struct call a = CALL(0, "/vw/orders", "fw-kill", "X-Stub-Delay-Ms: 8000\r\n");
    struct call b = CALL(1, "/vw/orders", "fw-kill", NULL);
    struct timespec t0, t1;
    pthread_t ta, tb;
    double took;

    start_holder(&ta, &a);
    cr_assert_eq(pthread_create(&tb, NULL, post_thread, &b), 0);
    usleep(300 * 1000); /* the duplicate is waiting */
    clock_gettime(CLOCK_MONOTONIC, &t0);
    kill(sl[0].pid, SIGKILL);
    pthread_join(ta, NULL);
    h_resp_free(&a.r);
    pthread_join(tb, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    took = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
    cr_expect_eq(b.r.status, 200, "%s", b.r.body);
    cr_expect_str_eq(h_header_str(&b.r, "Sluice-Verified"), "true");
    cr_expect_str_eq(h_header_str(&b.r, "Sluice-Outcome"), "replayed");
    cr_expect_leq(took, 6.0, "settled after the key lapsed (3 s), not max_wait: %.2f s",
                  took);
    cr_expect_eq(h_stub_key_stat(&stub, "fw-kill", "side_effects"), 1);
    cr_expect_eq(h_stub_key_stat(&stub, "fw-kill", "calls"), 1,
                 "the waiting duplicate never reached the partner");
    h_resp_free(&b.r);
}
