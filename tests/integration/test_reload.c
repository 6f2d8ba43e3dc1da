/* Live reload (docs/contract.md §1, section 7 POST /reload): a valid file takes
 * effect, an invalid one changes nothing, state of unchanged policies
 * carries over, and requests in flight finish on their config. A policy
 * whose numbers change keeps its state too, in the new numbers (§5
 * "exactly", §4 "any 429 empties the bucket"): the tokens it holds (never
 * raised), its pauses and its partitions', its breaker streak, its requests
 * in flight (counted against the new concurrency) and its waiters. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <dirent.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "integration/harness.h"
#include "support/testutil.h"

static struct h_stub stub;
static struct h_sluice sl;

static char *body_for(const char *policy, const char *routes)
{
    char *b;

    cr_assert(asprintf(&b,
        "upstreams: {stub: {url: http://127.0.0.1:%d}}\n"
        "policies:\n  p: %s\n"
        "routes:\n%s", stub.port, policy, routes) > 0);
    return b;
}

static void start(void)
{
    char *b;

    cr_assert_eq(h_stub_start(&stub, NULL), 0);
    b = body_for("{rate: 0.2/s, burst: 1, max_wait: 0s}",
                 "  - {name: a, prefix: /a, upstream: stub, policy: p}\n"
                 "  - {name: slow, prefix: /slow, upstream: stub}\n");
    cr_assert_eq(h_sluice_start(&sl, b), 0);
    free(b);
}

static void stop(void)
{
    h_sluice_cleanup(&sl);
    h_stub_stop(&stub);
}

TestSuite(reload, .init = start, .fini = stop, .timeout = 60);

static int status_of(int port, const char *method, const char *path)
{
    struct h_resp r;
    int s;

    cr_assert_eq(h_http(port, method, path, NULL, method[0] == 'P' ? "" : NULL, 0, &r), 0);
    s = r.status;
    h_resp_free(&r);
    return s;
}

static int reload(char **body)
{
    struct h_resp r;
    int s;

    cr_assert_eq(h_http(sl.admin_port, "POST", "/reload", NULL, "", 0, &r), 0);
    s = r.status;
    if (body)
        *body = strdup(r.body ? r.body : "");
    h_resp_free(&r);
    return s;
}

static bool metrics_has(const char *line)
{
    struct h_resp r;
    bool found;

    cr_assert_eq(h_http(sl.admin_port, "GET", "/metrics", NULL, NULL, 0, &r), 0);
    found = strstr(r.body, line) != NULL;
    h_resp_free(&r);
    return found;
}

Test(reload, valid_file_takes_effect)
{
    char *b = body_for("{rate: 0.2/s, burst: 1, max_wait: 0s}",
                       "  - {name: a, prefix: /a, upstream: stub, policy: p}\n"
                       "  - {name: b, prefix: /b, upstream: stub}\n"), *msg;

    cr_expect_eq(status_of(sl.port, "GET", "/b"), 404);
    cr_assert_eq(h_sluice_rewrite(&sl, b), 0);
    cr_expect_eq(reload(&msg), 200, "%s", msg);
    cr_expect(strstr(msg, "reloaded") != NULL, "%s", msg);
    free(msg);
    cr_expect_eq(status_of(sl.port, "GET", "/b"), 200);
    cr_expect_eq(status_of(sl.port, "GET", "/slow"), 404, "a route dropped by the reload");
    cr_expect(metrics_has("sluice_config_reloads_total{result=\"ok\"} 1"));
    free(b);
}

Test(reload, invalid_file_changes_nothing)
{
    char *msg;

    cr_assert_eq(h_sluice_rewrite(&sl, "upstreams: {stub: {url: http://127.0.0.1:1, timeout: 5 parsecs}}\n"
                                       "routes: [{prefix: /, upstream: nope}]\n"), 0);
    cr_expect_eq(reload(&msg), 400);
    /* every error, with its position */
    cr_expect(strstr(msg, "sidecar.yaml:") != NULL && strstr(msg, "timeout") != NULL, "%s", msg);
    cr_expect(strstr(msg, "unknown upstream \\\"nope\\\"") != NULL, "%s", msg);
    free(msg);
    cr_expect_eq(status_of(sl.port, "GET", "/slow"), 200, "the running config is kept");
    cr_expect(metrics_has("sluice_config_reloads_total{result=\"error\"} 1"));
    cr_expect(h_file_contains(sl.log_path, "config reload refused"));
}

Test(reload, listen_change_needs_a_restart)
{
    char *b, *msg;
    int other = h_free_port();

    cr_assert(asprintf(&b,
        "listen: 127.0.0.1:%d\nadmin: 127.0.0.1:%d\nthreads: 2\nstore: {path: %s/data}\n"
        "upstreams: {stub: {url: http://127.0.0.1:%d}}\n"
        "routes: [{prefix: /, upstream: stub}]\n",
        other, sl.admin_port, sl.dir, stub.port) > 0);
    free(tu_write_file(sl.dir, "sidecar.yaml", b));
    free(b);
    cr_expect_eq(reload(&msg), 400);
    cr_expect(strstr(msg, "listen changed") != NULL && strstr(msg, "restart") != NULL, "%s", msg);
    free(msg);
    cr_expect_eq(status_of(sl.port, "GET", "/slow"), 200);
}

Test(reload, sighup_reloads)
{
    char *b = body_for("{rate: 0.2/s, burst: 1, max_wait: 0s}",
                       "  - {name: c, prefix: /c, upstream: stub}\n");

    cr_assert_eq(h_sluice_rewrite(&sl, b), 0);
    kill(sl.pid, SIGHUP);
    for (int i = 0; i < 100 && status_of(sl.port, "GET", "/c") != 200; i++)
        usleep(20000);
    cr_expect_eq(status_of(sl.port, "GET", "/c"), 200);
    free(b);
}

Test(reload, unchanged_policy_keeps_its_bucket)
{
    char *b = body_for("{rate: 0.2/s, burst: 1, max_wait: 0s}",
                       "  - {name: a, prefix: /a, upstream: stub, policy: p}\n"
                       "  - {name: extra, prefix: /extra, upstream: stub}\n");
    char *c = body_for("{rate: 0.5/s, burst: 1, max_wait: 0s}",
                       "  - {name: a, prefix: /a, upstream: stub, policy: p}\n");

    cr_expect_eq(status_of(sl.port, "POST", "/a"), 200);
    cr_expect_eq(status_of(sl.port, "POST", "/a"), 429, "bucket spent");
    cr_assert_eq(h_sluice_rewrite(&sl, b), 0);
    cr_assert_eq(reload(NULL), 200);
    cr_expect_eq(status_of(sl.port, "POST", "/a"), 429, "same numbers: still spent");
    cr_assert_eq(h_sluice_rewrite(&sl, c), 0);
    cr_assert_eq(reload(NULL), 200);
    cr_expect_eq(status_of(sl.port, "POST", "/a"), 429,
                 "new numbers: still spent (a reload raises no tokens)");
    free(b);
    free(c);
}

static void *slow(void *arg)
{
    struct h_resp r;
    long ok = h_http(sl.port, "GET", "/slow", "X-Stub-Delay-Ms: 600\r\n", NULL, 0, &r) == 0 &&
              r.status == 200;

    (void)arg;
    h_resp_free(&r);
    return (void *)ok;
}

Test(reload, in_flight_requests_finish_on_their_config)
{
    char *b = body_for("{rate: 0.2/s, burst: 1, max_wait: 0s}",
                       "  - {name: a, prefix: /a, upstream: stub, policy: p}\n");
    pthread_t t;
    void *ok;

    pthread_create(&t, NULL, slow, NULL);
    usleep(150000);
    cr_assert_eq(h_sluice_rewrite(&sl, b), 0);
    cr_assert_eq(reload(NULL), 200);
    cr_expect_eq(status_of(sl.port, "GET", "/slow"), 404, "the new config has no /slow");
    pthread_join(t, &ok);
    cr_expect(ok != NULL, "the request that started on the old config completed");
    free(b);
}

/* ---- new numbers: the state carries on in them ---------------------------- */

static long long now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

/* The first config's policy p and route /a, with a policy q given here on
 * route /q; reloaded, which must succeed. */
static void reload_q(const char *q)
{
    char *b, *msg;

    cr_assert(asprintf(&b,
        "upstreams: {stub: {url: http://127.0.0.1:%d}}\n"
        "policies:\n  p: {rate: 0.2/s, burst: 1, max_wait: 0s}\n  q: %s\n"
        "routes:\n"
        "  - {name: a, prefix: /a, upstream: stub, policy: p}\n"
        "  - {name: q, prefix: /q, upstream: stub, policy: q}\n", stub.port, q) > 0);
    cr_assert_eq(h_sluice_rewrite(&sl, b), 0);
    cr_assert_eq(reload(&msg), 200, "%s", msg);
    free(msg);
    free(b);
}

/* "200" for a 200, else the instruction's reason (or "?"), of a request to
 * /q with extra header lines. */
static void q_says(const char *headers, char *out, size_t len)
{
    struct h_resp r;
    json_t *j, *why;

    cr_assert_eq(h_http(sl.port, "POST", "/q", headers, "j", 1, &r), 0);
    j = r.status == 200 ? NULL : json_loads(r.body ? r.body : "", 0, NULL);
    why = j ? json_object_get(j, "reason") : NULL;
    snprintf(out, len, "%s", r.status == 200 ? "200" : why ? json_string_value(why) : "?");
    json_decref(j);
    h_resp_free(&r);
}

/* The numbers: 5/s burst 10, ten forwarded, the last a 429 (which
 * empties the bucket), a reload to 4/s: ten more at once must not go, only
 * one per 250 ms from the 429 on. */
Test(reload, a_new_rate_keeps_the_bucket_spent)
{
    char why[64];
    long long t0, elapsed;
    int ok = 0;

    reload_q("{rate: 5/s, burst: 10, max_wait: 0s, retry: {on: [429]}}");
    for (int i = 0; i < 9; i++) {
        q_says(NULL, why, sizeof why);
        cr_assert_str_eq(why, "200", "request %d of the burst", i);
    }
    q_says("X-Stub-Status: 429\r\n", why, sizeof why);
    cr_assert_str_eq(why, "upstream_429");
    t0 = now_ms();
    reload_q("{rate: 4/s, burst: 10, max_wait: 0s, retry: {on: [429]}}");
    for (int i = 0; i < 10; i++) {
        q_says(NULL, why, sizeof why);
        ok += !strcmp(why, "200");
    }
    elapsed = now_ms() - t0;
    cr_expect_leq(ok, 1 + elapsed / 250, "%d sent within %lld ms of the 429", ok, elapsed);
    cr_expect_eq(h_stub_stat(&stub, "requests"), 10 + ok);
}

static void *held_q(void *arg)
{
    char why[64];

    q_says("X-Stub-Delay-Ms: 1000\r\n", why, sizeof why);
    return (void *)(long)!strcmp(why, "200");
}

/* Concurrency 2 with 2 in flight, a reload to 3: one more goes, not three. */
Test(reload, a_new_concurrency_counts_the_requests_in_flight)
{
    pthread_t t[5];
    void *ok;

    reload_q("{concurrency: 2, max_wait: 5s}");
    for (int i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, held_q, NULL);
    usleep(300000);
    reload_q("{concurrency: 3, max_wait: 5s}");
    for (int i = 2; i < 5; i++)
        pthread_create(&t[i], NULL, held_q, NULL);
    for (int i = 0; i < 5; i++) {
        pthread_join(t[i], &ok);
        cr_expect(ok != NULL, "request %d was not served", i);
    }
    cr_expect_eq(h_stub_stat(&stub, "in_flight_max"), 3);
    cr_expect_eq(h_stub_stat(&stub, "requests"), 5);
}

struct waited {
    long long done_ms;
    char why[64];
};

static void *waiter_q(void *arg)
{
    struct waited *w = arg;

    q_says(NULL, w->why, sizeof w->why);
    w->done_ms = now_ms();
    return NULL;
}

/* A waiter queued under concurrency 1 behind a request holding its slot
 * for 1.5 s: a reload to 2 grants it at once, not when the holder ends. */
Test(reload, a_waiter_queued_before_a_raised_limit_is_granted_at_once)
{
    struct waited w = {0};
    pthread_t holder, waiter;
    long long t_reload;
    char why[64];

    reload_q("{concurrency: 1, max_wait: 5s}");
    pthread_create(&holder, NULL, held_q, NULL);
    usleep(200000);
    pthread_create(&waiter, NULL, waiter_q, &w);
    usleep(200000);
    t_reload = now_ms();
    reload_q("{concurrency: 2, max_wait: 5s}");
    pthread_join(waiter, NULL);
    cr_expect_str_eq(w.why, "200");
    cr_expect_lt(w.done_ms - t_reload, 400, "granted %lld ms after the reload",
                 w.done_ms - t_reload);
    pthread_join(holder, NULL);
    /* and the counts came back: two at once fit the new limit */
    q_says(NULL, why, sizeof why);
    cr_expect_str_eq(why, "200");
}

static void *late_429(void *arg)
{
    q_says("X-Stub-Delay-Ms: 800\r\nX-Stub-Status: 429\r\nX-Stub-Retry-After: 30\r\n",
           arg, 64);
    return NULL;
}

/* A request of the old config meets its 429 after the reload: the policy
 * that runs now is paused, not the state left behind. */
Test(reload, a_late_429_of_the_old_config_pauses_the_new_one)
{
    char late[64] = "", why[64];
    pthread_t t;

    reload_q("{rate: 10/s, burst: 5, max_wait: 0s, retry: {on: [429]}}");
    pthread_create(&t, NULL, late_429, late);
    usleep(300000);
    reload_q("{rate: 20/s, burst: 5, max_wait: 0s, retry: {on: [429]}}");
    pthread_join(t, NULL);
    cr_expect_str_eq(late, "upstream_429");
    q_says(NULL, why, sizeof why);
    cr_expect_str_eq(why, "upstream_cooldown");
    cr_expect_eq(h_stub_stat(&stub, "requests"), 1, "sent inside the partner's cooldown");
}

static void tenant_q(const char *tenant, const char *extra, char *out, size_t len)
{
    char hdr[256];

    snprintf(hdr, sizeof hdr, "X-Tenant: %s\r\n%s", tenant, extra ? extra : "");
    q_says(hdr, out, len);
}

/* Partitions carry over too: a's pause, b's spent bucket; a new tenant
 * still starts full while there is room. */
Test(reload, partitions_keep_their_pauses_and_levels)
{
    char why[64];

    reload_q("{rate: 10/s, burst: 3, max_wait: 0s, retry: {on: [429]},\n"
             "     partition: {header: X-Tenant, max: 10}}");
    tenant_q("a", "X-Stub-Status: 429\r\nX-Stub-Retry-After: 30\r\n", why, sizeof why);
    cr_expect_str_eq(why, "upstream_429");
    for (int i = 0; i < 3; i++) {
        tenant_q("b", NULL, why, sizeof why);
        cr_expect_str_eq(why, "200");
    }
    reload_q("{rate: 2/s, burst: 3, max_wait: 0s, retry: {on: [429]},\n"
             "     partition: {header: X-Tenant, max: 10}}");
    tenant_q("a", NULL, why, sizeof why);
    cr_expect_str_eq(why, "upstream_cooldown", "a's pause was lost");
    tenant_q("b", NULL, why, sizeof why);
    cr_expect_str_eq(why, "rate_limited", "b's bucket was refilled by the reload");
    tenant_q("c", NULL, why, sizeof why);
    cr_expect_str_eq(why, "200");
    cr_expect_eq(h_stub_stat(&stub, "requests"), 5);
}

/* Two failures of three, a reload, the third: the breaker opens. */
Test(reload, the_breaker_streak_carries_over)
{
    char why[64];

    reload_q("{rate: 100/s, burst: 10, max_wait: 0s,\n"
             "     breaker: {failures: 3, pause: 30s, max_pause: 1m}}");
    for (int i = 0; i < 2; i++)
        q_says("X-Stub-Status: 503\r\n", why, sizeof why);
    reload_q("{rate: 50/s, burst: 10, max_wait: 0s,\n"
             "     breaker: {failures: 3, pause: 30s, max_pause: 1m}}");
    q_says("X-Stub-Status: 503\r\n", why, sizeof why);
    q_says(NULL, why, sizeof why);
    cr_expect_str_eq(why, "upstream_cooldown", "the streak started again at 0");
    cr_expect_eq(h_stub_stat(&stub, "requests"), 3);
}

/* Every invalid config of tests/config/invalid, offered as a reload, is
 * refused with 400 and changes nothing. */
Test(reload, every_invalid_case_keeps_serving, .timeout = 120)
{
    const char *base = SLUICE_SOURCE_DIR "/tests/config/invalid";
    DIR *d = opendir(base);
    struct dirent *e;
    int cases = 0;

    cr_assert_not_null(d);
    while ((e = readdir(d))) {
        char path[1024], *text, *msg;

        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "%s/%s/input.yaml", base, e->d_name);
        text = tu_read_file(path, NULL);
        if (!text)
            continue;
        free(tu_write_file(sl.dir, "sidecar.yaml", text));
        free(text);
        cr_expect_eq(reload(&msg), 400, "%s: %s", e->d_name, msg);
        free(msg);
        cases++;
    }
    closedir(d);
    cr_expect_gt(cases, 25);
    cr_expect_eq(status_of(sl.port, "GET", "/slow"), 200, "still serving the first config");
}
