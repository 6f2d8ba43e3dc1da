/* Settling unknown outcomes (docs/contract.md §11) through the real sluice,
 * a real RocksDB store and the real stub playing a partner that ignores
 * Idempotency-Key but offers a lookup by the client's reference (--lookup):
 * a request that executes and then loses its connection, one lost before
 * it executes, one stalled past the timeout, lookups answered 200 / 404 /
 * 500; each outcome seen through the worker's answers, the admin record,
 * the metrics and the access log. And start-up: a lease left by a killed
 * sluice is verified right after the restart. */
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

/* T = 300 ms, after = 400 ms, 2 attempts: D = 2 x (400 + 300) = 1400 ms,
 * above the 1 s floor of a backoff. */
#define CONFIG                                                                 \
    "upstreams: {stub: {url: http://127.0.0.1:%d, timeout: %s}}\n"           \
    "policies:\n"                                                             \
    "  p:\n"                                                                  \
    "    retry: {base: 10ms}\n"                                              \
    "    idempotency:\n"                                                      \
    "      lease: 30s\n"                                                      \
    "      verify: {path: \"/lookup?client_ref={key}\", after: 400ms, attempts: 2}\n" \
    "routes:\n"                                                               \
    "  - {prefix: /p, upstream: stub, policy: p}\n"

static void start_timeout(const char *timeout)
{
    const char *args[] = {"--lookup", "/lookup?client_ref=", NULL};
    char *cfg;

    cr_assert_eq(h_stub_start(&stub, args), 0);
    cr_assert(asprintf(&cfg, CONFIG, stub.port, timeout) > 0);
    cr_assert_eq(h_sluice_start(&sl, cfg), 0, "sluice did not start");
    free(cfg);
}

static void start(void)
{
    start_timeout("300ms");
}

static void stop(void)
{
    h_sluice_cleanup(&sl);
    h_stub_stop(&stub);
}

static int post(const char *key, const char *extra, struct h_resp *r)
{
    char hdr[512];

    snprintf(hdr, sizeof hdr, "Idempotency-Key: %s\r\n%s", key, extra ? extra : "");
    return h_http(sl.port, "POST", "/p/orders", hdr, "{\"qty\":1}", 9, r);
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

static void expect_header(const struct h_resp *r, const char *name, const char *want)
{
    char *v = h_header(r, name);

    if (want)
        cr_expect(v && !strcmp(v, want), "%s: %s, want %s", name, v ? v : "(none)", want);
    else
        cr_expect_null(v, "%s should be absent, is %s", name, v);
    free(v);
}

/* The admin record of key, or NULL when there is none. */
static json_t *record(const char *key)
{
    char path[256];
    struct h_resp r;
    json_t *j = NULL;

    snprintf(path, sizeof path, "/idempotency/p/%s", key);
    cr_assert_eq(h_http(sl.admin_port, "GET", path, NULL, NULL, 0, &r), 0);
    if (r.status == 200)
        j = body_json(&r);
    h_resp_free(&r);
    return j;
}

/* Waits (up to 5 s) for the record's "verify" to become want. */
static json_t *await_verify(const char *key, const char *want)
{
    for (int i = 0; i < 250; i++) {
        json_t *j = record(key);

        if (j && !strcmp(jstr(j, "verify"), want))
            return j;
        json_decref(j);
        usleep(20000);
    }
    cr_assert_fail("%s: verify never became %s", key, want);
    return NULL;
}

static double metric(const char *series)
{
    struct h_resp r;
    double v = -1;
    size_t n = strlen(series);

    cr_assert_eq(h_http(sl.admin_port, "GET", "/metrics", NULL, NULL, 0, &r), 0);
    for (const char *p = r.body; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (!strncmp(p, series, n) && p[n] == ' ')
            v = strtod(p + n + 1, NULL);
    h_resp_free(&r);
    return v;
}

#define VERIFICATIONS(result) \
    "sluice_verifications_total{policy=\"p\",result=\"" result "\"}"

/* The first answer to an unknown outcome: requeue at once, the delay the
 * verification's D (1400 ms here), not the lease (30 s). */
static void expect_pending_requeue(const struct h_resp *r, const char *reason)
{
    json_t *j = body_json(r);

    cr_expect_eq(r->status, 503);
    cr_expect_str_eq(jstr(j, "action"), "requeue");
    cr_expect_str_eq(jstr(j, "reason"), reason);
    cr_expect_str_eq(jstr(j, "verify"), "pending");
    cr_expect_leq(json_integer_value(json_object_get(j, "delay_ms")), 1400,
                  "the delay is D, not the lease: %s", r->body);
    cr_expect_geq(json_integer_value(json_object_get(j, "delay_ms")), 1200, "%s", r->body);
    json_decref(j);
}

TestSuite(verify, .init = start, .fini = stop, .timeout = 60);

Test(verify, executed_then_dropped_is_found_and_replayed_verified)
{
    struct h_resp r;
    json_t *j;

    cr_assert_eq(post("k-found", "X-Stub-Drop: before\r\n", &r), 0);
    expect_pending_requeue(&r, "connection_lost");
    h_resp_free(&r);
    /* A duplicate while the lookup is due: lease_held, what remains of D,
     * still pending. */
    cr_assert_eq(post("k-found", NULL, &r), 0);
    cr_expect_eq(r.status, 409);
    j = body_json(&r);
    cr_expect_str_eq(jstr(j, "reason"), "lease_held");
    cr_expect_str_eq(jstr(j, "verify"), "pending");
    cr_expect_leq(json_integer_value(json_object_get(j, "delay_ms")), 1400);
    json_decref(j);
    h_resp_free(&r);

    j = await_verify("k-found", "found");
    cr_expect_str_eq(jstr(j, "state"), "completed");
    cr_expect(json_is_true(json_object_get(j, "verified")));
    cr_expect_eq(json_integer_value(json_object_get(j, "status")), 200);
    cr_expect_eq(json_integer_value(json_object_get(j, "attempt")), 1,
                 "the lookup adds no attempt");
    json_decref(j);

    cr_assert_eq(post("k-found", NULL, &r), 0);
    cr_expect_eq(r.status, 200);
    expect_header(&r, "Sluice-Outcome", "replayed");
    expect_header(&r, "Idempotent-Replayed", "true");
    expect_header(&r, "Sluice-Verified", "true");
    expect_header(&r, "X-Stub-Lookup", "found");
    cr_expect(r.body && !strcmp(r.body, "{\"qty\":1}"), "the partner's answer: %s", r.body);
    h_resp_free(&r);

    cr_expect_eq(h_stub_key_stat(&stub, "k-found", "side_effects"), 1);
    cr_expect_eq(h_stub_stat(&stub, "lookups"), 1);
    cr_expect_eq(metric(VERIFICATIONS("found")), 1);
    cr_expect_eq(metric(VERIFICATIONS("absent")), 0);
    cr_expect(h_file_contains(sl.log_path, "\"verify\":true"), "the lookup's log line");
    cr_expect(h_file_contains(sl.log_path, "\"result\":\"found\""));
    cr_expect_not(h_file_contains(sl.log_path, "client_ref=k-found"),
                  "the log never holds the key");
}

Test(verify, dropped_before_executing_is_absent_and_freed_at_once)
{
    struct h_resp r;
    json_t *j;

    cr_assert_eq(post("k-absent", "X-Stub-Drop: unexecuted\r\n", &r), 0);
    expect_pending_requeue(&r, "connection_lost");
    h_resp_free(&r);
    j = await_verify("k-absent", "absent");
    cr_expect_str_eq(jstr(j, "state"), "in_progress");
    cr_expect_null(json_object_get(j, "verified"));
    json_decref(j);
    /* The redelivery goes as a first request would: forwarded now, not
     * after the 30 s lease. */
    cr_assert_eq(post("k-absent", NULL, &r), 0);
    cr_expect_eq(r.status, 200);
    expect_header(&r, "Sluice-Outcome", "ok");
    expect_header(&r, "Sluice-Verified", NULL);
    h_resp_free(&r);
    cr_expect_eq(h_stub_key_stat(&stub, "k-absent", "side_effects"), 1);
    j = record("k-absent");
    cr_expect_str_eq(jstr(j, "state"), "completed");
    cr_expect_eq(json_integer_value(json_object_get(j, "attempt")), 2);
    cr_expect_null(json_object_get(j, "verify"), "a new lease, never verified");
    json_decref(j);
    cr_expect_eq(metric(VERIFICATIONS("absent")), 1);
    cr_expect(h_file_contains(sl.log_path, "\"result\":\"absent\""));
}

Test(verify, stalled_past_the_timeout_is_found)
{
    struct h_resp r;
    json_t *j;

    cr_assert_eq(post("k-stall", "X-Stub-Delay-Ms: 1500\r\n", &r), 0);
    expect_pending_requeue(&r, "timeout");
    h_resp_free(&r);
    j = await_verify("k-stall", "found");
    json_decref(j);
    cr_assert_eq(post("k-stall", NULL, &r), 0);
    cr_expect_eq(r.status, 200);
    expect_header(&r, "Sluice-Verified", "true");
    h_resp_free(&r);
    cr_expect_eq(h_stub_key_stat(&stub, "k-stall", "side_effects"), 1);
}

Test(verify, lookups_answered_500_fail_and_the_lease_waits_out_its_expiry)
{
    struct h_resp r;
    json_t *j;

    cr_assert_eq(h_http(stub.port, "POST", "/_stub/lookup-script", NULL, "500\n500\n",
                        8, &r), 0);
    h_resp_free(&r);
    cr_assert_eq(post("k-fail", "X-Stub-Drop: before\r\n", &r), 0);
    expect_pending_requeue(&r, "connection_lost");
    h_resp_free(&r);
    j = await_verify("k-fail", "failed");
    cr_expect_str_eq(jstr(j, "state"), "in_progress");
    json_decref(j);
    cr_expect_eq(h_stub_stat(&stub, "lookups"), 2, "attempts: 2");
    cr_assert_eq(post("k-fail", NULL, &r), 0);
    cr_expect_eq(r.status, 409);
    j = body_json(&r);
    cr_expect_str_eq(jstr(j, "reason"), "lease_held");
    cr_expect_null(json_object_get(j, "verify"), "no verification runs any more");
    cr_expect_geq(json_integer_value(json_object_get(j, "delay_ms")), 25000,
                  "as without verify: the lease's remaining time");
    json_decref(j);
    h_resp_free(&r);
    cr_expect_eq(h_stub_key_stat(&stub, "k-fail", "side_effects"), 1);
    cr_expect_eq(metric(VERIFICATIONS("failed")), 1);
    cr_expect_eq(metric(VERIFICATIONS("found")), 0);
}

/* ---- start-up: a lease whose holder was killed ---------------------------- */

static void *in_flight(void *arg)
{
    struct h_resp r;

    post(arg, (const char *)arg == (const char *)"k-restart-absent"
                  ? "X-Stub-Delay-Ms: 2000\r\nX-Stub-Drop: unexecuted\r\n"
                  : "X-Stub-Delay-Ms: 2000\r\n", &r);
    h_resp_free(&r);
    return NULL;
}

/* Sends key's request (stalled 2 s at the stub, T = 5 s), kills sluice -9
 * while it is there, and restarts it on the same store. */
static void kill_in_flight_and_restart(const char *key)
{
    pthread_t t;

    pthread_create(&t, NULL, in_flight, (void *)key);
    for (int i = 0; i < 100 && h_stub_stat(&stub, "in_flight") < 1; i++)
        usleep(10000);
    cr_assert_eq(h_stub_stat(&stub, "in_flight"), 1, "the request is at the partner");
    kill(sl.pid, SIGKILL);
    waitpid(sl.pid, NULL, 0);
    sl.pid = 0;
    pthread_join(t, NULL);
    cr_assert_eq(h_sluice_start_raw(&sl, NULL, sl.port, sl.admin_port), 0,
                 "sluice did not restart on the same store");
}

static void start_slow(void)
{
    start_timeout("5s");
}

TestSuite(verify_restart, .init = start_slow, .fini = stop, .timeout = 60);

Test(verify_restart, a_killed_holders_lease_is_found_after_the_restart)
{
    struct h_resp r;
    json_t *j;

    kill_in_flight_and_restart("k-restart-found");
    j = await_verify("k-restart-found", "found");
    cr_expect(json_is_true(json_object_get(j, "verified")));
    json_decref(j);
    cr_assert_eq(post("k-restart-found", NULL, &r), 0);
    cr_expect_eq(r.status, 200);
    expect_header(&r, "Sluice-Outcome", "replayed");
    expect_header(&r, "Sluice-Verified", "true");
    h_resp_free(&r);
    cr_expect_eq(h_stub_key_stat(&stub, "k-restart-found", "side_effects"), 1);
    cr_expect_eq(metric(VERIFICATIONS("found")), 1);
}

Test(verify_restart, a_killed_holders_lease_is_freed_when_absent)
{
    struct h_resp r;

    kill_in_flight_and_restart("k-restart-absent");
    json_decref(await_verify("k-restart-absent", "absent"));
    cr_assert_eq(post("k-restart-absent", NULL, &r), 0);
    cr_expect_eq(r.status, 200, "forwarded at once, not after the 30 s lease");
    expect_header(&r, "Sluice-Outcome", "ok");
    h_resp_free(&r);
    cr_expect_eq(h_stub_key_stat(&stub, "k-restart-absent", "side_effects"), 1);
}
