/* Idempotency (docs/contract.md §6) through the real sluice, a real RocksDB store
 * in a temp dir and the real stub, which counts side effects per key. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "integration/harness.h"

static struct h_stub stub;
static struct h_sluice sl;
static char *cfg_text;

static void stop(void)
{
    h_sluice_cleanup(&sl);
    h_stub_stop(&stub);
    free(cfg_text);
    cfg_text = NULL;
}

static void start_with(const char *idem, const char *up_extra, const char *pol_extra)
{
    cr_assert_eq(h_stub_start(&stub, NULL), 0);
    cr_assert(asprintf(&cfg_text,
        "upstreams: {stub: {url: http://127.0.0.1:%d%s}}\n"
        "policies:\n"
        "  p: {idempotency: %s%s}\n"
        "routes:\n"
        "  - {prefix: /p, upstream: stub, policy: p}\n",
        stub.port, up_extra, idem, pol_extra) > 0);
    cr_assert_eq(h_sluice_start(&sl, cfg_text), 0, "sluice did not start");
}

static void start_default(void)
{
    start_with("{}", "", "");
}

static long long side_effects(const char *key)
{
    return h_stub_key_stat(&stub, key, "side_effects");
}

static int post(const char *key, const char *extra, const char *body,
                struct h_resp *r)
{
    char hdr[1024];

    snprintf(hdr, sizeof hdr, "%s%s%s%s", key ? "Idempotency-Key: " : "",
             key ? key : "", key ? "\r\n" : "", extra ? extra : "");
    return h_http(sl.port, "POST", "/p/items?x=1", hdr, body, strlen(body), r);
}

static void expect_header(const struct h_resp *r, const char *name, const char *want)
{
    char *v = h_header(r, name);

    if (want)
        cr_expect(v && strcmp(v, want) == 0, "%s: %s, want %s", name, v ? v : "(none)", want);
    else
        cr_expect_null(v, "%s should be absent, is %s", name, v);
    free(v);
}

static json_t *body_json(const struct h_resp *r)
{
    json_t *j = json_loads(r->body ? r->body : "", 0, NULL);
    cr_assert_not_null(j, "not JSON: %s", r->body);
    return j;
}

TestSuite(idem, .init = start_default, .fini = stop, .timeout = 60);

Test(idem, replay_is_byte_exact_and_takes_no_upstream_call)
{
    struct h_resp a, b;

    cr_assert_eq(post("order-1", "X-Stub-Status: 201\r\nX-Stub-Set-Header: X-Order: 17\r\n"
                      "X-Request-Id: first-try\r\n", "{\"qty\":3}\x01\x02", &a), 0);
    cr_expect_eq(a.status, 201);
    expect_header(&a, "X-Request-Id", "first-try");
    expect_header(&a, "Sluice-Outcome", "ok");
    expect_header(&a, "Idempotent-Replayed", NULL);
    cr_assert_eq(post("order-1", "X-Stub-Status: 201\r\nX-Stub-Set-Header: X-Order: 17\r\n"
                      "X-Request-Id: second-try\r\n", "{\"qty\":3}\x01\x02", &b), 0);
    cr_expect_eq(b.status, 201);
    cr_expect_eq(b.body_len, a.body_len);
    cr_expect(a.body_len == b.body_len && memcmp(a.body, b.body, a.body_len) == 0);
    expect_header(&b, "Sluice-Outcome", "replayed");
    expect_header(&b, "Idempotent-Replayed", "true");
    expect_header(&b, "X-Order", "17");
    expect_header(&b, "X-Stub-Seq", "1");
    /* The stored response: the id of the request that reached the partner. */
    expect_header(&b, "X-Request-Id", "first-try");
    cr_expect_eq(h_stub_stat(&stub, "requests"), 1);
    cr_expect_eq(side_effects("order-1"), 1);
    h_resp_free(&a);
    h_resp_free(&b);
}

/* A replay answers with the stored id (of the request that reached the
 * partner) and logs its own. */
Test(idem, a_replay_carries_the_stored_id_and_logs_its_own)
{
    struct h_resp r;

    cr_assert_eq(post("k-ids", "X-Request-Id: first-try\r\n", "{}", &r), 0);
    cr_expect_eq(r.status, 200);
    h_resp_free(&r);
    cr_assert_eq(post("k-ids", "X-Request-Id: second-try\r\n", "{}", &r), 0);
    expect_header(&r, "Sluice-Outcome", "replayed");
    expect_header(&r, "X-Request-Id", "first-try");
    h_resp_free(&r);
    for (int i = 0; i < 100 && !h_file_contains(sl.log_path, "\"request_id\":\"second-try\""); i++)
        usleep(20 * 1000);
    cr_expect(h_file_contains(sl.log_path, "\"request_id\":\"second-try\""),
              "the replay's own id is in its access-log line");
}

Test(idem, different_request_same_key_is_422)
{
    struct h_resp r;

    cr_assert_eq(post("k422", NULL, "one", &r), 0);
    cr_expect_eq(r.status, 200);
    h_resp_free(&r);
    cr_assert_eq(post("k422", NULL, "two", &r), 0);
    cr_expect_eq(r.status, 422);
    expect_header(&r, "Sluice-Outcome", "rejected");
    cr_expect(r.body && strstr(r.body, "\"reason\":\"key_reused\""), "body %s",
              r.body ? r.body : "(none)");
    h_resp_free(&r);
    cr_expect_eq(h_stub_stat(&stub, "requests"), 1);
}

Test(idem, keys_are_checked)
{
    static const char *const bad[] = {
        "has space", "\"unterminated", "\"bad\\escape\"", "\"\"",
    };
    char longkey[300];
    struct h_resp r;

    cr_assert_eq(post(NULL, NULL, "x", &r), 0);
    cr_expect_eq(r.status, 400, "a missing key where required");
    h_resp_free(&r);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_assert_eq(post(bad[i], NULL, "x", &r), 0);
        cr_expect_eq(r.status, 400, "key <%s>: %d", bad[i], r.status);
        expect_header(&r, "Sluice-Outcome", "rejected");
        h_resp_free(&r);
    }
    memset(longkey, 'k', 256);
    longkey[256] = '\0';
    cr_assert_eq(post(longkey, NULL, "x", &r), 0);
    cr_expect_eq(r.status, 400);
    h_resp_free(&r);
    cr_expect_eq(h_stub_stat(&stub, "requests"), 0);
    /* A Structured-Field string is unquoted: "sf-key" is the key sf-key. */
    cr_assert_eq(post("\"sf-key\"", NULL, "x", &r), 0);
    cr_expect_eq(r.status, 200);
    h_resp_free(&r);
    cr_assert_eq(post("sf-key", NULL, "x", &r), 0);
    expect_header(&r, "Sluice-Outcome", "replayed");
    h_resp_free(&r);
}

Test(idem, get_is_not_keyed)
{
    struct h_resp r;

    cr_assert_eq(h_http(sl.port, "GET", "/p/items", NULL, NULL, 0, &r), 0);
    cr_expect_eq(r.status, 200, "GET is not in idempotency.methods");
    h_resp_free(&r);
}

Test(idem, retryable_5xx_is_not_stored_and_attempts_are_counted)
{
    struct h_resp r;
    json_t *j;

    for (int i = 1; i <= 3; i++) {
        cr_assert_eq(post("k5xx", "X-Stub-Status: 503\r\nSluice-Attempt: 1\r\n", "x", &r), 0);
        cr_expect_eq(r.status, 503);
        j = body_json(&r);
        cr_expect_str_eq(json_string_value(json_object_get(j, "reason")), "upstream_5xx");
        /* The store's count wins over the worker's Sluice-Attempt. */
        cr_expect_eq(json_integer_value(json_object_get(j, "attempt")), i);
        cr_expect_str_eq(json_string_value(json_object_get(j, "idempotency_key")), "k5xx");
        json_decref(j);
        h_resp_free(&r);
    }
    cr_expect_eq(h_stub_stat(&stub, "requests"), 3);
    cr_assert_eq(post("k5xx", NULL, "x", &r), 0);
    cr_expect_eq(r.status, 200);
    h_resp_free(&r);
}

Test(idem, replayed_4xx_stays_permanent_error)
{
    struct h_resp r;

    cr_assert_eq(post("k404", "X-Stub-Status: 404\r\n", "x", &r), 0);
    cr_expect_eq(r.status, 404);
    expect_header(&r, "Sluice-Outcome", "permanent_error");
    h_resp_free(&r);
    cr_assert_eq(post("k404", "X-Stub-Status: 404\r\n", "x", &r), 0);
    cr_expect_eq(r.status, 404);
    expect_header(&r, "Sluice-Outcome", "permanent_error");
    expect_header(&r, "Idempotent-Replayed", "true");
    h_resp_free(&r);
    cr_expect_eq(h_stub_stat(&stub, "requests"), 1);
}

Test(idem, admin_get_and_delete)
{
    struct h_resp r;
    json_t *j;

    cr_assert_eq(post("adm-1", "X-Stub-Status: 202\r\n", "payload", &r), 0);
    h_resp_free(&r);
    cr_assert_eq(h_http(sl.admin_port, "GET", "/idempotency/p/adm-1?body=1", NULL, NULL, 0, &r), 0);
    cr_assert_eq(r.status, 200, "%s", r.body);
    j = body_json(&r);
    cr_expect_str_eq(json_string_value(json_object_get(j, "state")), "completed");
    cr_expect_eq(json_integer_value(json_object_get(j, "status")), 202);
    cr_expect_eq(json_integer_value(json_object_get(j, "attempt")), 1);
    cr_expect_str_eq(json_string_value(json_object_get(j, "body_base64")), "cGF5bG9hZA==");
    cr_expect_eq(strlen(json_string_value(json_object_get(j, "fingerprint"))), 64);
    cr_expect_gt(json_integer_value(json_object_get(j, "expires_at")),
                 json_integer_value(json_object_get(j, "completed_at")));
    json_decref(j);
    h_resp_free(&r);
    cr_assert_eq(h_http(sl.admin_port, "DELETE", "/idempotency/p/adm-1", NULL, NULL, 0, &r), 0);
    cr_expect_eq(r.status, 200);
    h_resp_free(&r);
    cr_assert_eq(h_http(sl.admin_port, "GET", "/idempotency/p/adm-1", NULL, NULL, 0, &r), 0);
    cr_expect_eq(r.status, 404);
    h_resp_free(&r);
    cr_assert_eq(h_http(sl.admin_port, "DELETE", "/idempotency/p/adm-1", NULL, NULL, 0, &r), 0);
    cr_expect_eq(r.status, 404);
    h_resp_free(&r);
    /* Forgotten: the next request goes upstream again. */
    cr_assert_eq(post("adm-1", NULL, "payload", &r), 0);
    expect_header(&r, "Sluice-Outcome", "ok");
    h_resp_free(&r);
    cr_expect_eq(side_effects("adm-1"), 2);
}

/* ---- concurrency -------------------------------------------------------- */

struct racer {
    int status;
    char outcome[32];
};

static void *race(void *arg)
{
    struct racer *rc = arg;
    struct h_resp r;

    if (post("race-key", "X-Stub-Delay-Ms: 300\r\n", "same body", &r) == 0) {
        char *o = h_header(&r, "Sluice-Outcome");
        rc->status = r.status;
        snprintf(rc->outcome, sizeof rc->outcome, "%s", o ? o : "");
        free(o);
    }
    h_resp_free(&r);
    return NULL;
}

Test(idem, fifty_concurrent_duplicates_reach_the_upstream_once)
{
    struct racer rc[50] = {0};
    pthread_t t[50];
    int ok = 0, held = 0, replayed = 0;

    for (int i = 0; i < 50; i++)
        pthread_create(&t[i], NULL, race, &rc[i]);
    for (int i = 0; i < 50; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < 50; i++) {
        if (rc[i].status == 200 && !strcmp(rc[i].outcome, "ok"))
            ok++;
        else if (rc[i].status == 409 && !strcmp(rc[i].outcome, "requeue"))
            held++;
        else if (rc[i].status == 200 && !strcmp(rc[i].outcome, "replayed"))
            replayed++;
        else
            cr_log_error("unexpected answer %d %s", rc[i].status, rc[i].outcome);
    }
    cr_expect_eq(ok, 1, "%d requests went through", ok);
    cr_expect_eq(ok + held + replayed, 50);
    cr_expect_eq(side_effects("race-key"), 1);
    cr_expect_eq(h_stub_stat(&stub, "requests"), 1);
}

/* ---- leases ------------------------------------------------------------- */

static void start_short_lease(void)
{
    start_with("{lease: 1s, max_stored_body: 10}", ", timeout: 300ms", "");
}

TestSuite(lease, .init = start_short_lease, .fini = stop, .timeout = 60);

Test(lease, timeout_keeps_the_lease_until_expiry)
{
    struct h_resp r;
    json_t *j;

    cr_assert_eq(post("slow-1", "X-Stub-Delay-Ms: 2000\r\n", "x", &r), 0);
    cr_expect_eq(r.status, 503);
    j = body_json(&r);
    cr_expect_str_eq(json_string_value(json_object_get(j, "reason")), "timeout");
    cr_expect_geq(json_integer_value(json_object_get(j, "delay_ms")), 1000,
                  "an unknown outcome waits out the lease");
    json_decref(j);
    h_resp_free(&r);
    cr_assert_eq(post("slow-1", NULL, "x", &r), 0);
    cr_expect_eq(r.status, 409);
    j = body_json(&r);
    cr_expect_str_eq(json_string_value(json_object_get(j, "reason")), "lease_held");
    cr_expect_eq(json_integer_value(json_object_get(j, "attempt")), 1);
    json_decref(j);
    h_resp_free(&r);
    usleep(1100000);
    cr_assert_eq(post("slow-1", NULL, "x", &r), 0);
    cr_expect_eq(r.status, 200, "the expired lease is taken over");
    h_resp_free(&r);
    cr_assert_eq(h_http(sl.admin_port, "GET", "/idempotency/p/slow-1", NULL, NULL, 0, &r), 0);
    j = body_json(&r);
    cr_expect_eq(json_integer_value(json_object_get(j, "attempt")), 2);
    json_decref(j);
    h_resp_free(&r);
}

Test(lease, large_bodies_are_replayed_without_body)
{
    struct h_resp r;

    cr_assert_eq(post("big-1", "X-Stub-Body-Size: 100\r\n", "x", &r), 0);
    cr_expect_eq(r.body_len, 100);
    h_resp_free(&r);
    cr_assert_eq(post("big-1", "X-Stub-Body-Size: 100\r\n", "x", &r), 0);
    cr_expect_eq(r.status, 200);
    cr_expect_eq(r.body_len, 0);
    expect_header(&r, "Sluice-Body-Omitted", "true");
    expect_header(&r, "Sluice-Outcome", "replayed");
    h_resp_free(&r);
    cr_expect_eq(h_stub_stat(&stub, "requests"), 1);
}

/* ---- crashes ------------------------------------------------------------ */

static void kill9_and_restart(void)
{
    kill(sl.pid, SIGKILL);
    waitpid(sl.pid, NULL, 0);
    sl.pid = 0;
    cr_assert_eq(h_sluice_start_raw(&sl, NULL, sl.port, sl.admin_port), 0,
                 "sluice did not restart on the same store");
}

Test(idem, kill9_after_an_answer_keeps_the_result)
{
    struct h_resp r;

    cr_assert_eq(post("crash-1", "X-Stub-Status: 201\r\n", "x", &r), 0);
    cr_expect_eq(r.status, 201);
    h_resp_free(&r);
    kill9_and_restart();
    cr_assert_eq(post("crash-1", NULL, "x", &r), 0);
    cr_expect_eq(r.status, 201);
    expect_header(&r, "Sluice-Outcome", "replayed");
    h_resp_free(&r);
    cr_expect_eq(side_effects("crash-1"), 1);
}

static void *inflight(void *arg)
{
    struct h_resp r;

    (void)arg;
    post("crash-2", "X-Stub-Delay-Ms: 1500\r\n", "x", &r);
    h_resp_free(&r);
    return NULL;
}

Test(idem, kill9_in_flight_leaves_a_lease_that_is_honoured)
{
    pthread_t t;
    struct h_resp r;
    json_t *j;

    pthread_create(&t, NULL, inflight, NULL);
    usleep(300000);
    kill9_and_restart();
    pthread_join(t, NULL);
    cr_assert_eq(post("crash-2", NULL, "x", &r), 0);
    cr_expect_eq(r.status, 409, "the lease of the in-flight request is honoured");
    j = body_json(&r);
    cr_expect_str_eq(json_string_value(json_object_get(j, "reason")), "lease_held");
    cr_expect_geq(json_integer_value(json_object_get(j, "delay_ms")), 55000,
                  "about the lease's 60 s remain");
    json_decref(j);
    h_resp_free(&r);
    cr_expect_eq(side_effects("crash-2"), 1);
}

/* ---- no permit for replays ---------------------------------------------- */

static void start_paced(void)
{
    start_with("{}", "", ", rate: 0.1/s, burst: 1, max_wait: 0s");
}

TestSuite(paced, .init = start_paced, .fini = stop, .timeout = 30);

Test(paced, replays_take_no_permit)
{
    struct h_resp r;

    cr_assert_eq(post("p-1", NULL, "x", &r), 0);
    cr_expect_eq(r.status, 200);
    h_resp_free(&r);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(post("p-1", NULL, "x", &r), 0);
        expect_header(&r, "Sluice-Outcome", "replayed");
        h_resp_free(&r);
    }
    cr_assert_eq(post("p-2", NULL, "x", &r), 0);
    cr_expect_eq(r.status, 429, "the bucket is spent by p-1 alone");
    h_resp_free(&r);
}
