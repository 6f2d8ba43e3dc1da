/* Pacing and instructions (docs/contract.md §4 and §5) through the real sluice to
 * the real stub, which records when each request arrived. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/wait.h>

#include "integration/harness.h"

static struct h_stub stub;
static struct h_sluice sl;

static void stop(void)
{
    h_sluice_cleanup(&sl);
    h_stub_stop(&stub);
}

/* Starts the stub and sluice with `policies` and one route per line of
 * `routes` (each "prefix policy"). */
static void start(const char *policies, const char *routes)
{
    char *cfg;

    cr_assert_eq(h_stub_start(&stub, NULL), 0);
    cr_assert(asprintf(&cfg,
        "log: {level: info, access: true}\n"
        "upstreams: {stub: {url: http://127.0.0.1:%d, max_connections: 256}}\n"
        "policies:\n%s"
        "routes:\n%s", stub.port, policies, routes) > 0);
    cr_assert_eq(h_sluice_start(&sl, cfg), 0, "sluice did not start");
    free(cfg);
}

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

static json_t *stub_json(const char *path)
{
    struct h_resp r;
    json_t *j;

    cr_assert_eq(h_http(stub.port, "GET", path, NULL, NULL, 0, &r), 0);
    j = json_loads(r.body, 0, NULL);
    cr_assert_not_null(j, "stub %s: %s", path, r.body);
    h_resp_free(&r);
    return j;
}

static json_t *body_json(const struct h_resp *r)
{
    json_t *j = json_loads(r->body ? r->body : "", 0, NULL);
    cr_assert_not_null(j, "body is not JSON: %s", r->body);
    return j;
}

static const char *jstr(json_t *j, const char *k)
{
    const char *s = json_string_value(json_object_get(j, k));
    return s ? s : "(absent)";
}

static long long jint(json_t *j, const char *k)
{
    json_t *v = json_object_get(j, k);
    return v ? json_integer_value(v) : -1;
}

/* ---- exactness under load ----------------------------------------------- */

struct load {
    long long until_ms;
    atomic_int ok, other;
};

static void *client(void *arg)
{
    struct load *l = arg;

    while (now_ms() < l->until_ms) {
        struct h_resp r;
        if (h_http(sl.port, "POST", "/paced/x", NULL, "j", 1, &r) == 0 &&
            r.status == 200)
            atomic_fetch_add(&l->ok, 1);
        else
            atomic_fetch_add(&l->other, 1);
        h_resp_free(&r);
    }
    return NULL;
}

static void *warm_one(void *arg)
{
    struct h_resp r;

    (void)arg;
    h_http(sl.port, "GET", "/warm", "X-Stub-Delay-Ms: 300\r\n", NULL, 0, &r);
    h_resp_free(&r);
    return NULL;
}

static void warm_pool(void)
{
    pthread_t t[64];
    struct h_resp r;

    for (int i = 0; i < 64; i++)
        pthread_create(&t[i], NULL, warm_one, NULL);
    for (int i = 0; i < 64; i++)
        pthread_join(t[i], NULL);
    cr_assert_eq(h_http(stub.port, "POST", "/_stub/reset", NULL, "", 0, &r), 0);
    h_resp_free(&r);
}

/* 64 clients on 2 sluice threads for 3 s against 10/s burst 5: in no window
 * do more than burst + rate * t requests start, and the rate is reached.
 * The stub timestamps arrivals after connect, loopback and scheduling on a
 * 2-core machine shared with 64 client threads (under ASan too), which can
 * bunch two arrivals by tens of ms; windows get 0.6 T = 60 ms of slack, still
 * short of the whole T = 100 ms an extra start would need. */
Test(pacing, bucket_is_exact_under_64_clients, .fini = stop, .timeout = 60)
{
    const double rate = 10, burst = 5;
    static long long at[4096];
    struct load l = {.until_ms = now_ms() + 3000};
    pthread_t t[64];
    json_t *arr;
    size_t n;

    start("  paced: {rate: 10/s, burst: 5, max_wait: 10s}\n",
          "  - {prefix: /paced, upstream: stub, policy: paced}\n"
          "  - {prefix: /warm, upstream: stub}\n");
    /* Warm the keep-alive pool, so connects do not delay the first writes:
     * the bound holds where sluice sends, and the stub sees it after TCP. */
    warm_pool();
    l.until_ms = now_ms() + 3000;
    for (int i = 0; i < 64; i++)
        pthread_create(&t[i], NULL, client, &l);
    for (int i = 0; i < 64; i++)
        pthread_join(t[i], NULL);
    arr = stub_json("/_stub/arrivals");
    n = json_array_size(arr);
    cr_assert_gt(n, 25, "only %zu arrivals", n);
    cr_assert_lt(n, 4096);
    for (size_t i = 0; i < n; i++)
        at[i] = json_integer_value(json_array_get(arr, i));
    json_decref(arr);
    /* Every window [at[i], at[j]]: starts <= burst + rate * t. */
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n && j < i + 400; j++) {
            double t_s = (double)(at[j] - at[i]) / 1e9 + 0.6 / rate;
            double allowed = burst + rate * t_s;
            cr_assert_leq((double)(j - i + 1), allowed,
                          "%zu starts in %.4f s (allowed %.2f)", j - i + 1, t_s, allowed);
        }
    {
        double span = (double)(at[n - 1] - at[0]) / 1e9;
        double achieved = (double)(n - (size_t)burst) / span;
        cr_expect_geq(achieved, 0.95 * rate, "achieved %.2f/s of %.0f/s", achieved, rate);
    }
    cr_expect_eq(l.other, 0, "%d requests were not 200", l.other);
}

/* ---- max_wait ----------------------------------------------------------- */

Test(pacing, beyond_max_wait_is_requeued_at_once, .fini = stop, .timeout = 30)
{
    struct h_resp r;
    json_t *j;
    long long t0;
    char *h;

    start("  slow: {rate: 1/s, burst: 1, max_wait: 500ms}\n",
          "  - {prefix: /slow, upstream: stub, policy: slow}\n");
    cr_assert_eq(h_http(sl.port, "POST", "/slow", NULL, "1", 1, &r), 0);
    cr_expect_eq(r.status, 200);
    h_resp_free(&r);
    t0 = now_ms();
    cr_assert_eq(h_http(sl.port, "POST", "/slow", "Sluice-Attempt: 3\r\n", "2", 1, &r), 0);
    cr_expect_lt(now_ms() - t0, 400, "refused only after waiting");
    cr_expect_eq(r.status, 429);
    h = h_header(&r, "Sluice-Outcome");
    cr_expect_str_eq(h, "requeue");
    free(h);
    j = body_json(&r);
    cr_expect_str_eq(jstr(j, "action"), "requeue");
    cr_expect_str_eq(jstr(j, "reason"), "rate_limited");
    /* The time until a permit: about a second. */
    cr_expect(jint(j, "delay_ms") > 500 && jint(j, "delay_ms") <= 1000, "%lld", jint(j, "delay_ms"));
    cr_expect_eq(jint(j, "delay_seconds"), 1);
    /* Did not reach the upstream: the count so far, not this one. */
    cr_expect_eq(jint(j, "attempt"), 2);
    json_decref(j);
    h = h_header(&r, "Retry-After");
    cr_expect_str_eq(h, "1");
    free(h);
    h = h_header(&r, "RateLimit-Policy");
    cr_expect(h && strstr(h, "\"slow\";q="), "RateLimit-Policy %s", h ? h : "");
    free(h);
    h = h_header(&r, "RateLimit");
    cr_expect(h && strstr(h, "\"slow\";r=0;t=1"), "RateLimit %s", h ? h : "");
    free(h);
    h_resp_free(&r);
    cr_expect_eq(h_stub_stat(&stub, "requests"), 1, "the refused request reached the stub");
}

Test(pacing, within_max_wait_waits_in_order, .fini = stop, .timeout = 30)
{
    struct h_resp r;
    long long t0 = 0;

    start("  w: {rate: 5/s, burst: 1, max_wait: 2s}\n",
          "  - {prefix: /w, upstream: stub, policy: w}\n");
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(h_http(sl.port, "GET", "/w", NULL, NULL, 0, &r), 0);
        cr_expect_eq(r.status, 200, "request %d: %d", i, r.status);
        h_resp_free(&r);
        if (i == 0)
            t0 = now_ms();
    }
    /* Three more after the first, 200 ms apart. */
    cr_expect_geq(now_ms() - t0, 550);
}

/* ---- concurrency -------------------------------------------------------- */

static void *slow_client(void *arg)
{
    struct h_resp r;
    long ok = h_http(sl.port, "GET", "/c", "X-Stub-Delay-Ms: 200\r\n", NULL, 0, &r) == 0 &&
              r.status == 200;
    h_resp_free(&r);
    (void)arg;
    return (void *)ok;
}

Test(pacing, concurrency_bound_seen_at_stub, .fini = stop, .timeout = 30)
{
    pthread_t t[8];
    void *ok;

    start("  c: {concurrency: 2, max_wait: 5s}\n",
          "  - {prefix: /c, upstream: stub, policy: c}\n");
    for (int i = 0; i < 8; i++)
        pthread_create(&t[i], NULL, slow_client, NULL);
    for (int i = 0; i < 8; i++) {
        pthread_join(t[i], &ok);
        cr_expect(ok != NULL, "client %d failed", i);
    }
    cr_expect_eq(h_stub_stat(&stub, "in_flight_max"), 2);
    cr_expect_eq(h_stub_stat(&stub, "requests"), 8);
}

Test(pacing, no_slot_within_max_wait_is_rate_limited, .fini = stop, .timeout = 30)
{
    pthread_t t;
    struct h_resp r;
    json_t *j;

    start("  c: {concurrency: 1, max_wait: 100ms}\n",
          "  - {prefix: /c, upstream: stub, policy: c}\n");
    pthread_create(&t, NULL, slow_client, NULL);
    usleep(50000);
    cr_assert_eq(h_http(sl.port, "GET", "/c", NULL, NULL, 0, &r), 0);
    cr_expect_eq(r.status, 429);
    j = body_json(&r);
    cr_expect_str_eq(jstr(j, "reason"), "rate_limited");
    json_decref(j);
    h_resp_free(&r);
    pthread_join(t, NULL);
}

/* ---- cooldown ----------------------------------------------------------- */

struct burst_arg {
    int status;
    char reason[32];
};

static void *burst_client(void *arg)
{
    struct burst_arg *a = arg;
    struct h_resp r;

    if (h_http(sl.port, "POST", "/cool", NULL, "b", 1, &r) == 0) {
        json_t *j = json_loads(r.body, 0, NULL);
        a->status = r.status;
        snprintf(a->reason, sizeof a->reason, "%s/%lld", j ? jstr(j, "reason") : "-",
                 j ? jint(j, "delay_ms") : -1);
        json_decref(j);
    }
    h_resp_free(&r);
    return NULL;
}

/* Five requests get 429 + Retry-After: 2 at once (the stub holds each 429
 * for 300 ms, so all ten clients are in sluice by then): one cooldown; the
 * five waiting for permits reach the stub only after it ends, at rate. */
Test(pacing, retry_after_burst_is_one_cooldown, .fini = stop, .timeout = 30)
{
    struct h_resp r;
    struct burst_arg a[10] = {0};
    pthread_t t[10];
    json_t *arr;
    int n429 = 0, n200 = 0;

    const char *script = "429 300 retry-after=2\n429 300 retry-after=2\n"
                         "429 300 retry-after=2\n429 300 retry-after=2\n"
                         "429 300 retry-after=2\n";

    start("  cool: {rate: 2/s, burst: 5, max_wait: 6s, retry: {on: [429]}}\n",
          "  - {prefix: /cool, upstream: stub, policy: cool}\n");
    cr_assert_eq(h_http(stub.port, "POST", "/_stub/script", NULL, script,
                        strlen(script), &r), 0);
    cr_assert_eq(r.status, 200, "%s", r.body);
    h_resp_free(&r);
    for (int i = 0; i < 10; i++)
        pthread_create(&t[i], NULL, burst_client, &a[i]);
    for (int i = 0; i < 10; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < 10; i++) {
        if (a[i].status == 429 && !strncmp(a[i].reason, "upstream_429", 12))
            n429++;
        else if (a[i].status == 200)
            n200++;
    }
    cr_expect_eq(n429, 5, "upstream_429 answers: %d", n429);
    cr_expect_eq(n200, 5, "200 answers after the cooldown: %d", n200);
    for (int i = 0; i < 10 && n200 != 5; i++)
        cr_log_warn("client %d: %d %s", i, a[i].status, a[i].reason);
    arr = stub_json("/_stub/arrivals");
    cr_assert_eq(json_array_size(arr), 10);
    for (size_t i = 5; i < 10; i++) {
        long long ns = json_integer_value(json_array_get(arr, i));
        /* The cooldown ends 300 ms + 2 s after the first arrival. */
        cr_expect_geq(ns, 2250000000LL, "arrival %zu at %lld ms, inside the cooldown",
                      i, ns / 1000000);
        if (i > 5)
            cr_expect_geq(ns - json_integer_value(json_array_get(arr, i - 1)),
                          450000000LL, "no burst after the cooldown");
    }
    json_decref(arr);
}

Test(pacing, cooldown_refuses_what_cannot_wait, .fini = stop, .timeout = 30)
{
    struct h_resp r;
    json_t *j;

    start("  cool: {rate: 100/s, burst: 10, max_wait: 500ms, retry: {on: [429]}}\n",
          "  - {prefix: /cool, upstream: stub, policy: cool}\n");
    cr_assert_eq(h_http(sl.port, "POST", "/cool", "X-Stub-Status: 429\r\nX-Stub-Retry-After: 3\r\n",
                        "a", 1, &r), 0);
    cr_expect_eq(r.status, 429);
    j = body_json(&r);
    cr_expect_str_eq(jstr(j, "reason"), "upstream_429");
    cr_expect_eq(jint(j, "upstream_status"), 429);
    cr_expect_geq(jint(j, "delay_ms"), 3000);
    cr_expect_leq(jint(j, "delay_ms"), 4000);
    json_decref(j);
    h_resp_free(&r);
    cr_assert_eq(h_http(sl.port, "POST", "/cool", NULL, "b", 1, &r), 0);
    cr_expect_eq(r.status, 429);
    j = body_json(&r);
    cr_expect_str_eq(jstr(j, "reason"), "upstream_cooldown");
    cr_expect(jint(j, "delay_ms") > 2000 && jint(j, "delay_ms") <= 3000, "%lld", jint(j, "delay_ms"));
    json_decref(j);
    h_resp_free(&r);
    cr_expect_eq(h_stub_stat(&stub, "requests"), 1);
}

/* A partner's Retry-After outlives a crash of sluice: the restarted process
 * refuses what cannot wait and sends nothing before the moment named. */
Test(pacing, cooldown_survives_kill9, .fini = stop, .timeout = 30)
{
    struct h_resp r;
    json_t *j;

    start("  cool: {rate: 100/s, burst: 10, max_wait: 500ms, retry: {on: [429]}}\n",
          "  - {prefix: /cool, upstream: stub, policy: cool}\n");
    cr_assert_eq(h_http(sl.port, "POST", "/cool", "X-Stub-Status: 429\r\nX-Stub-Retry-After: 4\r\n",
                        "a", 1, &r), 0);
    cr_expect_eq(r.status, 429);
    h_resp_free(&r);
    kill(sl.pid, SIGKILL);
    waitpid(sl.pid, NULL, 0);
    sl.pid = 0;
    cr_assert_eq(h_sluice_start_raw(&sl, NULL, sl.port, sl.admin_port), 0,
                 "sluice did not restart on the same store");
    cr_assert_eq(h_http(sl.port, "POST", "/cool", NULL, "b", 1, &r), 0);
    cr_expect_eq(r.status, 429);
    j = body_json(&r);
    cr_expect_str_eq(jstr(j, "reason"), "upstream_cooldown");
    cr_expect(jint(j, "delay_ms") > 1000 && jint(j, "delay_ms") <= 4000, "%lld",
              jint(j, "delay_ms"));
    json_decref(j);
    h_resp_free(&r);
    cr_expect_eq(h_stub_stat(&stub, "requests"), 1, "the restarted sluice sent into the cooldown");
}

/* An absurd Retry-After (a century) dead-letters the job that met it and
 * pauses the policy for max_delay at most, also after a restart; a refusal
 * that would have to wait longer than max_delay is a dead letter too. */
Test(pacing, absurd_hint_is_capped_by_max_delay, .fini = stop, .timeout = 30)
{
    struct h_resp r;
    json_t *j;

    start("  cool: {rate: 100/s, burst: 10, max_wait: 500ms,"
          " retry: {on: [429], max_delay: 1h}}\n",
          "  - {prefix: /cool, upstream: stub, policy: cool}\n");
    cr_assert_eq(h_http(sl.port, "POST", "/cool",
                        "X-Stub-Status: 429\r\nX-Stub-Retry-After: 99999999999999999999\r\n",
                        "a", 1, &r), 0);
    j = body_json(&r);
    cr_expect_str_eq(jstr(j, "action"), "dead_letter");
    cr_expect_str_eq(jstr(j, "reason"), "delay_exceeds_max");
    json_decref(j);
    h_resp_free(&r);
    for (int round = 0; round < 2; round++) {
        cr_assert_eq(h_http(sl.port, "POST", "/cool", NULL, "b", 1, &r), 0);
        j = body_json(&r);
        cr_expect_str_eq(jstr(j, "reason"), "upstream_cooldown", "round %d", round);
        cr_expect(jint(j, "delay_ms") > 3500000 && jint(j, "delay_ms") <= 3600000,
                  "round %d: delay %lld ms, not capped at max_delay", round,
                  jint(j, "delay_ms"));
        json_decref(j);
        h_resp_free(&r);
        if (round == 0) { /* the capped pause is what the store keeps */
            kill(sl.pid, SIGKILL);
            waitpid(sl.pid, NULL, 0);
            sl.pid = 0;
            cr_assert_eq(h_sluice_start_raw(&sl, NULL, sl.port, sl.admin_port), 0);
        }
    }
    cr_expect_eq(h_stub_stat(&stub, "requests"), 1);
}

/* RateLimit parsed as an RFC 8941 List: the daily quota with 900 left says
 * nothing about this 429; the exhausted per-second one pauses for 1 s. */
Test(pacing, ratelimit_hint_from_exhausted_quota_only, .fini = stop, .timeout = 30)
{
    struct h_resp r;
    json_t *j;

    start("  cool: {rate: 100/s, burst: 10, max_wait: 3s, retry: {on: [429]}}\n",
          "  - {prefix: /cool, upstream: stub, policy: cool}\n");
    cr_assert_eq(h_http(sl.port, "POST", "/cool",
                        "X-Stub-Status: 429\r\nX-Stub-Set-Header: RateLimit: "
                        "\"day\";r=900;t=50000, \"sec\";r=0;t=1\r\n", "a", 1, &r), 0);
    j = body_json(&r);
    cr_expect_str_eq(jstr(j, "reason"), "upstream_429");
    cr_expect(jint(j, "delay_ms") >= 1000 && jint(j, "delay_ms") <= 2000, "delay %lld",
              jint(j, "delay_ms"));
    json_decref(j);
    h_resp_free(&r);
    /* waits out the 1 s pause within max_wait, then passes */
    cr_assert_eq(h_http(sl.port, "POST", "/cool", NULL, "b", 1, &r), 0);
    cr_expect_eq(r.status, 200, "%s", r.body);
    h_resp_free(&r);
    cr_expect_eq(h_stub_stat(&stub, "requests"), 2);
}

/* The breaker: three 503s in a row pause the policy; requests meanwhile are
 * requeued as upstream_cooldown (no attempt spent, nothing sent); the probe
 * after the pause fails, so the next pause is twice as long; a success
 * closes it. */
static void expect_reason(const char *headers, int status, const char *reason,
                          long long min_delay, long long max_delay)
{
    struct h_resp r;
    json_t *j;

    cr_assert_eq(h_http(sl.port, "POST", "/brk", headers, "x", 1, &r), 0);
    cr_expect_eq(r.status, status, "%d %s", r.status, r.body);
    if (reason) {
        j = body_json(&r);
        cr_expect_str_eq(jstr(j, "reason"), reason);
        if (min_delay >= 0)
            cr_expect(jint(j, "delay_ms") >= min_delay && jint(j, "delay_ms") <= max_delay,
                      "%s: delay %lld not in [%lld, %lld]", reason, jint(j, "delay_ms"),
                      min_delay, max_delay);
        json_decref(j);
    }
    h_resp_free(&r);
}

Test(pacing, breaker_pauses_after_a_streak_and_doubles, .fini = stop, .timeout = 30)
{
    const char *fail = "X-Stub-Status: 503\r\n";

    start("  brk:\n"
          "    rate: 100/s\n"
          "    burst: 10\n"
          "    max_wait: 0ms\n"
          "    retry: {base: 1s, jitter: none}\n"
          "    breaker: {failures: 3, pause: 600ms, max_pause: 5s}\n",
          "  - {prefix: /brk, upstream: stub, policy: brk}\n");
    for (int i = 0; i < 3; i++)
        expect_reason(fail, 503, "upstream_5xx", -1, -1);
    cr_expect_eq(h_stub_stat(&stub, "requests"), 3);
    expect_reason(NULL, 429, "upstream_cooldown", 300, 600);
    cr_expect_eq(h_stub_stat(&stub, "requests"), 3, "sent during the pause");
    usleep(700 * 1000);
    expect_reason(fail, 503, "upstream_5xx", -1, -1);      /* the probe fails */
    expect_reason(NULL, 429, "upstream_cooldown", 900, 1200);   /* 2 x 600 ms */
    usleep(1300 * 1000);
    expect_reason(NULL, 200, NULL, -1, -1);                /* the probe succeeds */
    expect_reason(fail, 503, "upstream_5xx", -1, -1);      /* a new streak starts at 1 */
    expect_reason(NULL, 200, NULL, -1, -1);
    cr_expect_eq(h_stub_stat(&stub, "requests"), 7);
}

/* ---- instructions ------------------------------------------------------- */

static json_t *post_json(const char *target, const char *headers, int want_status,
                         char **retry_after)
{
    struct h_resp r;
    json_t *j;

    cr_assert_eq(h_http(sl.port, "POST", target, headers, "x", 1, &r), 0);
    cr_expect_eq(r.status, want_status, "%s: %d %s", target, r.status, r.body);
    j = body_json(&r);
    if (retry_after)
        *retry_after = h_header(&r, "Retry-After");
    h_resp_free(&r);
    return j;
}

static void start_instr(void)
{
    start("  fixed: {retry: {base: 2s, multiplier: 2, jitter: none, max_attempts: 5, max_delay: 1h}}\n",
          "  - {prefix: /f, upstream: stub, policy: fixed}\n"
          "  - {prefix: /d, upstream: stub}\n");
}

TestSuite(instructions, .init = start_instr, .fini = stop, .timeout = 30);

Test(instructions, upstream_5xx_backoff_without_jitter)
{
    char *ra;
    json_t *j = post_json("/f", "X-Stub-Status: 503\r\nSluice-Attempt: 3\r\n"
                                "Idempotency-Key: \"quoted\\key\"\r\n", 503, &ra);

    cr_expect_str_eq(jstr(j, "action"), "requeue");
    cr_expect_str_eq(jstr(j, "reason"), "upstream_5xx");
    cr_expect_eq(jint(j, "delay_ms"), 8000);     /* 2 s * 2^(3-1) */
    cr_expect_eq(jint(j, "delay_seconds"), 8);
    cr_expect_eq(jint(j, "attempt"), 3);
    cr_expect_eq(jint(j, "max_attempts"), 5);
    cr_expect_eq(jint(j, "upstream_status"), 503);
    cr_expect_str_eq(jstr(j, "idempotency_key"), "\"quoted\\key\"");
    cr_expect_str_eq(ra, "8");
    free(ra);
    json_decref(j);
}

Test(instructions, budget_spent_is_dead_letter)
{
    char *ra;
    json_t *j = post_json("/f", "X-Stub-Status: 502\r\nSluice-Attempt: 5\r\n", 503, &ra);

    cr_expect_str_eq(jstr(j, "action"), "dead_letter");
    cr_expect_str_eq(jstr(j, "reason"), "upstream_5xx");
    cr_expect_null(json_object_get(j, "delay_ms"));
    cr_expect_null(json_object_get(j, "delay_seconds"));
    cr_expect_null(ra, "dead_letter carries no Retry-After");
    free(ra);
    json_decref(j);
}

Test(instructions, hint_beyond_max_delay_is_dead_letter)
{
    json_t *j = post_json("/f", "X-Stub-Status: 429\r\nX-Stub-Retry-After: 7200\r\n", 429, NULL);

    cr_expect_str_eq(jstr(j, "action"), "dead_letter");
    cr_expect_str_eq(jstr(j, "reason"), "delay_exceeds_max");
    json_decref(j);
}

Test(instructions, http_date_retry_after)
{
    char date[64], hdr[160];
    time_t t = time(NULL) + 30;
    struct tm tm;
    json_t *j;

    gmtime_r(&t, &tm);
    strftime(date, sizeof date, "%a, %d %b %Y %H:%M:%S GMT", &tm);
    snprintf(hdr, sizeof hdr, "X-Stub-Status: 429\r\nX-Stub-Retry-After: %s\r\n", date);
    j = post_json("/f", hdr, 429, NULL);
    cr_expect_str_eq(jstr(j, "reason"), "upstream_429");
    /* at least the hint (29-30 s), plus at most max(1 s, 10 %) of jitter */
    cr_expect(jint(j, "delay_ms") >= 28000 && jint(j, "delay_ms") <= 34000, "%lld",
              jint(j, "delay_ms"));
    json_decref(j);
}

Test(instructions, status_not_in_retry_on_passes_through)
{
    struct h_resp r;
    char *o;

    cr_assert_eq(h_http(sl.port, "POST", "/f", "X-Stub-Status: 500\r\n", "x", 1, &r), 0);
    cr_expect_eq(r.status, 500);
    o = h_header(&r, "Sluice-Outcome");
    cr_expect_str_eq(o, "permanent_error");
    free(o);
    h_resp_free(&r);
}

Test(instructions, bad_attempt_header_is_400)
{
    struct h_resp r;

    cr_assert_eq(h_http(sl.port, "POST", "/f", "Sluice-Attempt: zero\r\n", "x", 1, &r), 0);
    cr_expect_eq(r.status, 400);
    h_resp_free(&r);
    cr_assert_eq(h_http(sl.port, "POST", "/f", "Sluice-Attempt: 0\r\n", "x", 1, &r), 0);
    cr_expect_eq(r.status, 400);
    h_resp_free(&r);
    cr_expect_eq(h_stub_stat(&stub, "requests"), 0);
}

Test(instructions, default_policy_backoff_is_jittered_and_bounded)
{
    for (int i = 0; i < 5; i++) {
        json_t *j = post_json("/d", "X-Stub-Status: 503\r\n", 503, NULL);
        /* default: base 1 s, full jitter, attempt 1 → (0, 1 s], clamped to >= 1 s */
        cr_expect_eq(jint(j, "delay_ms"), 1000);
        cr_expect_eq(jint(j, "max_attempts"), 8);
        json_decref(j);
    }
}

/* ---- partitions and shadow ---------------------------------------------- */

static int get_status(const char *tenant)
{
    struct h_resp r;
    char hdr[64];
    int s;

    snprintf(hdr, sizeof hdr, "X-Tenant: %s\r\n", tenant);
    cr_assert_eq(h_http(sl.port, "GET", "/t", hdr, NULL, 0, &r), 0);
    s = r.status;
    h_resp_free(&r);
    return s;
}

Test(pacing, partitions_are_isolated_and_evicted_come_back_empty, .fini = stop, .timeout = 30)
{
    start("  t: {rate: 0.1/s, burst: 1, max_wait: 0s, partition: {header: X-Tenant, max: 2}}\n",
          "  - {prefix: /t, upstream: stub, policy: t}\n");
    cr_expect_eq(get_status("a"), 200);
    cr_expect_eq(get_status("a"), 429, "a's bucket is spent");
    cr_expect_eq(get_status("b"), 200, "b has its own bucket");
    cr_expect_eq(get_status("c"), 429, "c evicts a and starts empty");
    cr_expect_eq(get_status("a"), 429, "a comes back empty, not full");
}

/* GET /cooldowns: whether a pause of policy t is listed for `partition`. */
static bool partition_paused(const char *partition)
{
    struct h_resp r;
    json_t *j, *arr, *o;
    size_t i;
    bool found = false;

    cr_assert_eq(h_http(sl.admin_port, "GET", "/cooldowns", NULL, NULL, 0, &r), 0);
    j = body_json(&r);
    arr = json_object_get(j, "cooldowns");
    json_array_foreach(arr, i, o)
        found |= !strcmp(jstr(o, "policy"), "t") && !strcmp(jstr(o, "partition"), partition);
    json_decref(j);
    h_resp_free(&r);
    return found;
}

/* The reason of a request of tenant `tenant` with extra headers, or its
 * status when it is not an instruction ("200"). */
static void tenant_says(const char *tenant, const char *headers, char *out, size_t len)
{
    struct h_resp r;
    char hdr[256];
    json_t *j;

    snprintf(hdr, sizeof hdr, "X-Tenant: %s\r\n%s", tenant, headers ? headers : "");
    cr_assert_eq(h_http(sl.port, "GET", "/t", hdr, NULL, 0, &r), 0);
    j = r.status == 200 ? NULL : json_loads(r.body ? r.body : "", 0, NULL);
    snprintf(out, len, "%s", j ? jstr(j, "reason") : r.status == 200 ? "200" : "?");
    json_decref(j);
    h_resp_free(&r);
}

static const char partitioned_cool[] =
    "  t: {rate: 100/s, burst: 10, max_wait: 200ms, retry: {on: [429]},\n"
    "      partition: {header: X-Tenant, max: 2}}\n";

/* Contract §4 cooldown, §5 partition: A's pause outlives the arrival of
 * more tenants than `max` (they take the free partitions, empty: each waits
 * a T for its permit), and A is not sent to before the moment its partner
 * named. */
Test(pacing, a_paused_partition_is_not_evicted, .fini = stop, .timeout = 30)
{
    char why[64];

    start(partitioned_cool, "  - {prefix: /t, upstream: stub, policy: t}\n");
    tenant_says("a", "X-Stub-Status: 429\r\nX-Stub-Retry-After: 30\r\n", why, sizeof why);
    cr_expect_str_eq(why, "upstream_429");
    tenant_says("b", NULL, why, sizeof why);
    cr_expect_str_eq(why, "200");
    usleep(50000); /* b's request is over (its completion ran): b is free */
    tenant_says("c", NULL, why, sizeof why);
    cr_expect_str_eq(why, "200", "c takes b's partition, not paused a's");
    tenant_says("a", NULL, why, sizeof why);
    cr_expect_str_eq(why, "upstream_cooldown", "a's pause was lost to an eviction");
    cr_expect_eq(h_stub_stat(&stub, "requests"), 3, "a was sent to inside its cooldown");
    cr_expect(partition_paused("a"));
    cr_expect_not(partition_paused("c"));
}

static void *late_429(void *arg)
{
    tenant_says("a", "X-Stub-Delay-Ms: 700\r\nX-Stub-Status: 429\r\n"
                     "X-Stub-Retry-After: 30\r\n", arg, 64);
    return NULL;
}

/* A request in flight holds its partition: others arriving meanwhile take
 * free ones, and its late 429 pauses the tenant it was sent for, never one
 * that got the partition's memory since. */
Test(pacing, a_late_429_pauses_the_partition_it_was_sent_for, .fini = stop,
     .timeout = 30)
{
    char late[64] = "", why[64];
    pthread_t t;

    start(partitioned_cool, "  - {prefix: /t, upstream: stub, policy: t}\n");
    pthread_create(&t, NULL, late_429, late);
    usleep(200000);
    tenant_says("b", NULL, why, sizeof why);
    cr_expect_str_eq(why, "200");
    usleep(50000);
    tenant_says("c", NULL, why, sizeof why);
    cr_expect_str_eq(why, "200");
    pthread_join(t, NULL);
    cr_expect_str_eq(late, "upstream_429");
    cr_expect(partition_paused("a"), "the 429 did not pause a");
    cr_expect_not(partition_paused("c"), "a's 429 paused c");
    tenant_says("c", NULL, why, sizeof why);
    cr_expect_str_eq(why, "200", "c was paused by a's partner");
    tenant_says("a", NULL, why, sizeof why);
    cr_expect_str_eq(why, "upstream_cooldown");
    cr_expect_eq(h_stub_stat(&stub, "requests"), 4);
}

/* Every partition held or paused and none free: a new tenant is requeued
 * (rate_limited), sent nothing, and the table keeps its max; logged once. */
Test(pacing, no_free_partition_requeues_a_new_tenant, .fini = stop, .timeout = 30)
{
    char why[64];

    start(partitioned_cool, "  - {prefix: /t, upstream: stub, policy: t}\n");
    tenant_says("a", "X-Stub-Status: 429\r\nX-Stub-Retry-After: 30\r\n", why, sizeof why);
    tenant_says("b", "X-Stub-Status: 429\r\nX-Stub-Retry-After: 30\r\n", why, sizeof why);
    cr_expect_str_eq(why, "upstream_429");
    tenant_says("c", NULL, why, sizeof why);
    cr_expect_str_eq(why, "rate_limited");
    tenant_says("d", NULL, why, sizeof why);
    cr_expect_str_eq(why, "rate_limited");
    cr_expect_eq(h_stub_stat(&stub, "requests"), 2);
    cr_expect(partition_paused("a") && partition_paused("b"));
    usleep(100000);
    cr_expect(h_file_contains(sl.log_path, "all 2 partitions are held by requests in flight "
                                           "or paused"));
}

Test(pacing, shadow_forwards_everything_and_says_what_enforce_would_do,
     .fini = stop, .timeout = 30)
{
    start("  s: {rate: 1/s, burst: 1, max_wait: 1500ms, mode: shadow}\n",
          "  - {prefix: /s, upstream: stub, policy: s}\n");
    for (int i = 0; i < 5; i++) {
        struct h_resp r;
        cr_assert_eq(h_http(sl.port, "GET", "/s", NULL, NULL, 0, &r), 0);
        cr_expect_eq(r.status, 200);
        h_resp_free(&r);
    }
    cr_expect_eq(h_stub_stat(&stub, "requests"), 5);
    usleep(100000);
    cr_expect(h_file_contains(sl.log_path, "\"shadow\":\"permit_wait\""));
    cr_expect(h_file_contains(sl.log_path, "\"shadow\":\"rate_limited\""));
}

/* ---- a worker that leaves while its request waits ------------------------ */

/* Sends a request and closes the connection after `ms`, unanswered. */
static void send_and_leave(const char *target, const char *headers, int ms)
{
    char req[512];
    int fd = h_connect(sl.port);

    cr_assert(fd >= 0);
    snprintf(req, sizeof req, "POST %s HTTP/1.1\r\nHost: x\r\n%sContent-Length: 1\r\n\r\nb",
             target, headers ? headers : "");
    cr_assert_eq(h_send_all(fd, req, strlen(req)), 0);
    usleep((useconds_t)ms * 1000);
    close(fd);
}

static bool metrics_have(const char *text)
{
    struct h_resp r;
    bool found;

    cr_assert_eq(h_http(sl.admin_port, "GET", "/metrics", NULL, NULL, 0, &r), 0);
    found = r.body && strstr(r.body, text);
    h_resp_free(&r);
    return found;
}

static void *slow_one(void *arg)
{
    struct burst_arg *a = arg;
    struct h_resp r;

    if (h_http(sl.port, "POST", "/one", "X-Stub-Delay-Ms: 1500\r\n", "h", 1, &r) == 0)
        a->status = r.status;
    h_resp_free(&r);
    return NULL;
}

/* Waiting for a permit, then for a slot: the worker closes its connection,
 * and its request is never sent (nginx's 499), whatever comes free later. */
Test(pacing, abandoned_while_waiting_is_never_sent, .fini = stop, .timeout = 30)
{
    struct h_resp r;

    start("  slow: {rate: 1/s, burst: 1, max_wait: 5s}\n"
          "  one: {concurrency: 1, max_wait: 5s}\n",
          "  - {prefix: /slow, upstream: stub, policy: slow}\n"
          "  - {prefix: /one, upstream: stub, policy: one}\n");
    /* the permit: the first request takes the only token */
    cr_assert_eq(h_http(sl.port, "POST", "/slow", NULL, "a", 1, &r), 0);
    cr_expect_eq(r.status, 200);
    h_resp_free(&r);
    send_and_leave("/slow", NULL, 200);
    /* the slot: one request holds it for 1.5 s */
    pthread_t t;
    struct burst_arg a = {0};
    pthread_create(&t, NULL, slow_one, &a);
    usleep(200000);
    send_and_leave("/one", NULL, 200);
    pthread_join(t, NULL);
    cr_expect_eq(a.status, 200);
    usleep(1500000); /* past the permit the abandoned one had reserved */
    cr_expect_eq(h_stub_stat(&stub, "requests"), 2, "an abandoned request was sent");
    cr_expect(h_file_contains(sl.log_path, "\"status\":499,\"outcome\":\"abandoned\","
                                           "\"reason\":\"client_closed\""),
              "not logged as 499");
    cr_expect(metrics_have("route=\"/slow\",outcome=\"abandoned\",reason=\"client_closed\"} 1"),
              "not counted for /slow");
    cr_expect(metrics_have("route=\"/one\",outcome=\"abandoned\",reason=\"client_closed\"} 1"),
              "not counted for /one");
    /* the slot came back: the next request of /one goes through at once */
    cr_assert_eq(h_http(sl.port, "POST", "/one", NULL, "c", 1, &r), 0);
    cr_expect_eq(r.status, 200);
    h_resp_free(&r);
}
