/* The admin listener through the real binary: method rules (404, 405 with
 * Allow, the index at /), the guard on requests that change state (loopback
 * without admin_token, the bearer token from everyone with it), cooldowns
 * listed and ended by an operator for good (the store forgets them too), and
 * probes answered while hundreds of idle connections are held open. The
 * non-loopback side of the guard is unit-tested (tests/unit/proxy/
 * test_admin_guard.c): every address here is loopback. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <jansson.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "integration/harness.h"

#define TOKEN "it-admin-token-4f2a"

static struct h_stub stub;
static struct h_sluice sl;

static const char POLICIES[] =
    "policies:\n"
    "  cool: {rate: 100/s, burst: 10, max_wait: 500ms, retry: {on: [429]}}\n"
    "  part: {rate: 100/s, burst: 10, max_wait: 100ms, retry: {on: [429]},\n"
    "         partition: {header: X-Tenant}}\n"
    "  brk: {rate: 100/s, burst: 10, max_wait: 100ms, retry: {on: [503]},\n"
    "        breaker: {failures: 1, pause: 20s, max_pause: 20s}}\n"
    "  idem: {idempotency: {required: false}}\n"
    "routes:\n"
    "  - {prefix: /cool, upstream: stub, policy: cool}\n"
    "  - {prefix: /part, upstream: stub, policy: part}\n"
    "  - {prefix: /brk, upstream: stub, policy: brk}\n"
    "  - {prefix: /idem, upstream: stub, policy: idem}\n";

/* Starts the stub and sluice; `top` goes in front (e.g. an admin_token). */
static void start_with(const char *top)
{
    char *cfg;

    cr_assert_eq(h_stub_start(&stub, NULL), 0);
    cr_assert(asprintf(&cfg, "%s"
        "upstreams: {stub: {url: http://127.0.0.1:%d}}\n%s", top, stub.port,
        POLICIES) > 0);
    cr_assert_eq(h_sluice_start(&sl, cfg), 0, "sluice did not start");
    free(cfg);
}

static void start(void)
{
    start_with("");
}

static void stop(void)
{
    h_sluice_cleanup(&sl);
    h_stub_stop(&stub);
}

static long long now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

/* An admin request; returns the status (the response is freed). */
static int admin(const char *method, const char *target, const char *headers)
{
    struct h_resp r;
    int status;

    cr_assert_eq(h_http(sl.admin_port, method, target, headers, NULL, 0, &r), 0,
                 "%s %s: no answer", method, target);
    status = r.status;
    h_resp_free(&r);
    return status;
}

static json_t *admin_json(const char *method, const char *target, int want)
{
    struct h_resp r;
    json_t *j;

    cr_assert_eq(h_http(sl.admin_port, method, target, NULL, NULL, 0, &r), 0);
    cr_assert_eq(r.status, want, "%s %s: %d %s", method, target, r.status, r.body);
    j = json_loads(r.body ? r.body : "", 0, NULL);
    cr_assert_not_null(j, "%s %s: not JSON: %s", method, target, r.body);
    h_resp_free(&r);
    return j;
}

static void expect_405(const char *method, const char *target, const char *allow)
{
    struct h_resp r;
    char *got;

    cr_assert_eq(h_http(sl.admin_port, method, target, NULL, NULL, 0, &r), 0);
    cr_expect_eq(r.status, 405, "%s %s: %d", method, target, r.status);
    got = h_header(&r, "Allow");
    cr_expect_str_eq(got ? got : "(none)", allow, "%s %s", method, target);
    free(got);
    h_resp_free(&r);
}

/* ---- method rules ------------------------------------------------------- */

TestSuite(admin, .init = start, .fini = stop, .timeout = 60);

Test(admin, index_lists_every_endpoint)
{
    static const char *const listed[] = {
        "GET    /healthz", "GET    /readyz", "GET    /config", "GET    /metrics",
        "POST   /reload", "GET    /idempotency/{policy}/{key}",
        "DELETE /idempotency/{policy}/{key}", "GET    /cooldowns ",
        "DELETE /cooldowns/{policy}",
    };
    struct h_resp r;

    cr_assert_eq(h_http(sl.admin_port, "GET", "/", NULL, NULL, 0, &r), 0);
    cr_expect_eq(r.status, 200);
    for (size_t i = 0; i < sizeof listed / sizeof *listed; i++)
        cr_expect_not_null(strstr(r.body, listed[i]), "%s missing from:\n%s", listed[i], r.body);
    h_resp_free(&r);
}

Test(admin, wrong_method_is_405_with_allow)
{
    expect_405("POST", "/healthz", "GET, HEAD");
    expect_405("DELETE", "/config", "GET, HEAD");
    expect_405("POST", "/", "GET, HEAD");
    expect_405("GET", "/reload", "POST");
    expect_405("HEAD", "/reload", "POST");
    expect_405("PUT", "/idempotency/idem/k", "GET, HEAD, DELETE");
    expect_405("POST", "/cooldowns", "GET, HEAD");
    expect_405("GET", "/cooldowns/cool", "DELETE");
}

Test(admin, unknown_path_is_404)
{
    cr_expect_eq(admin("GET", "/nope", NULL), 404);
    cr_expect_eq(admin("GET", "/healthzz", NULL), 404);
    cr_expect_eq(admin("POST", "/nope", NULL), 404);
    cr_expect_eq(admin("DELETE", "/cooldowns/no-such-policy", NULL), 404);
    cr_expect_eq(admin("GET", "/idempotency/no-such-policy/k", NULL), 404);
    cr_expect_eq(admin("HEAD", "/healthz", NULL), 200);
}

/* Every error answer is {"error": TEXT} with a JSON Content-Type, so a
 * script parses one format whatever went wrong. */
Test(admin, errors_are_json_everywhere)
{
    static const char *const cases[][3] = {
        {"GET", "/nope", "404"},
        {"GET", "/idempotency/no-such-policy/k", "404"},
        {"DELETE", "/idempotency/no-such-policy/k", "404"},
        {"GET", "/idempotency/idem", "404"},
        {"GET", "/idempotency/idem/k", "404"},
        {"DELETE", "/cooldowns/no-such-policy", "404"},
        {"POST", "/healthz", "405"},
        {"GET", "/reload", "405"},
    };

    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *m = cases[i][0], *t = cases[i][1];
        struct h_resp r;
        json_t *j;
        char *ct;

        cr_assert_eq(h_http(sl.admin_port, m, t, NULL, NULL, 0, &r), 0);
        cr_expect_eq(r.status, atoi(cases[i][2]), "%s %s: %d", m, t, r.status);
        ct = h_header(&r, "Content-Type");
        cr_expect_str_eq(ct ? ct : "(none)", "application/json", "%s %s", m, t);
        j = json_loads(r.body ? r.body : "", 0, NULL);
        cr_expect(j && json_is_string(json_object_get(j, "error")), "%s %s: %s", m, t, r.body);
        json_decref(j);
        free(ct);
        h_resp_free(&r);
    }
}

/* POST /reload answers JSON too: the summary, or every error of the file. */
Test(admin, reload_answers_json)
{
    json_t *j = admin_json("POST", "/reload", 200), *errs;

    cr_expect(json_is_true(json_object_get(j, "reloaded")));
    cr_expect(strstr(json_string_value(json_object_get(j, "summary")), ": reloaded (1 upstreams, "
                                                                       "4 policies, 4 routes)"));
    json_decref(j);
    cr_assert_eq(h_sluice_rewrite(&sl, "upstreams: {stub: {url: http://127.0.0.1:1, timeout: 3x}}\n"
                                       "routes: [{prefix: /, upstream: nope}]\n"), 0);
    j = admin_json("POST", "/reload", 400);
    errs = json_object_get(j, "errors");
    cr_expect(json_is_false(json_object_get(j, "reloaded")));
    cr_expect(json_is_string(json_object_get(j, "error")));
    cr_expect_eq(json_array_size(errs), 2, "%s", json_dumps(j, 0));
    cr_expect(strstr(json_string_value(json_array_get(errs, 0)), "sidecar.yaml:") != NULL &&
              strstr(json_string_value(json_array_get(errs, 0)), ": upstreams.stub.timeout: ")
                  != NULL, "%s", json_string_value(json_array_get(errs, 0)));
    json_decref(j);
}

/* Without admin_token, a loopback peer may do everything. */
Test(admin, loopback_without_token_may_change_state)
{
    cr_expect_eq(admin("GET", "/idempotency/idem/k?body=1", NULL), 404, "absent, not 403");
    cr_expect_eq(admin("DELETE", "/idempotency/idem/k", NULL), 404, "absent, not 403");
    cr_expect_eq(admin("DELETE", "/cooldowns/cool", NULL), 200);
    cr_expect_eq(admin("POST", "/reload", NULL), 200);
}

/* ---- the token ---------------------------------------------------------- */

Test(admin_token, loopback_needs_it_too, .fini = stop, .timeout = 60)
{
    static const char *const guarded[][2] = {
        {"POST", "/reload"}, {"DELETE", "/cooldowns/cool"},
        {"DELETE", "/idempotency/idem/k"}, {"GET", "/idempotency/idem/k?body=1"},
    };
    const char *right = "Authorization: Bearer " TOKEN "\r\n";
    const char *wrong = "Authorization: Bearer " TOKEN "x\r\n";
    struct h_resp r;
    json_t *cfg;

    start_with("admin_token: " TOKEN "\n");
    for (size_t i = 0; i < sizeof guarded / sizeof *guarded; i++) {
        const char *m = guarded[i][0], *t = guarded[i][1];
        cr_expect_eq(admin(m, t, NULL), 403, "%s %s without the token", m, t);
        cr_expect_eq(admin(m, t, wrong), 403, "%s %s with a wrong token", m, t);
        cr_expect_neq(admin(m, t, right), 403, "%s %s with the token", m, t);
    }
    cr_expect_eq(admin("POST", "/reload", right), 200);
    cr_expect_eq(admin("GET", "/idempotency/idem/k", NULL), 404, "no body: not guarded");
    cr_expect_eq(admin("GET", "/cooldowns", NULL), 200, "reads are not guarded");

    cr_assert_eq(h_http(sl.admin_port, "POST", "/reload", NULL, NULL, 0, &r), 0);
    cr_expect_eq(r.status, 403);
    cr_expect_not_null(strstr(r.body, "admin_token"), "the 403 says why: %s", r.body);
    cr_expect_null(strstr(r.body, TOKEN));
    h_resp_free(&r);
    cr_expect(h_file_contains(sl.log_path, "refused"), "refusals are logged");

    cr_assert_eq(h_http(sl.admin_port, "GET", "/config", NULL, NULL, 0, &r), 0);
    cr_expect_eq(r.status, 200);
    cr_expect_null(strstr(r.body, TOKEN), "GET /config shows the token: %s", r.body);
    h_resp_free(&r);
    cfg = admin_json("GET", "/config", 200);
    cr_expect_str_eq(json_string_value(json_object_get(cfg, "admin_token")), "<redacted>");
    json_decref(cfg);
}

/* ---- cooldowns ---------------------------------------------------------- */

static int send_to(const char *path, const char *headers)
{
    struct h_resp r;
    int status;

    cr_assert_eq(h_http(sl.port, "POST", path, headers, "x", 1, &r), 0);
    status = r.status;
    h_resp_free(&r);
    return status;
}

/* The entry of /cooldowns for policy (and partition, or NULL), or NULL. */
static json_t *pause_of(json_t *list, const char *policy, const char *partition)
{
    json_t *arr = json_object_get(list, "cooldowns"), *e;
    size_t i;

    cr_assert(json_is_array(arr));
    json_array_foreach(arr, i, e) {
        const char *p = json_string_value(json_object_get(e, "policy"));
        const char *part = json_string_value(json_object_get(e, "partition"));
        if (p && !strcmp(p, policy) &&
            (partition ? part && !strcmp(part, partition) : !part))
            return e;
    }
    return NULL;
}

static void expect_pause(json_t *list, const char *policy, const char *partition,
                         const char *why, long long min_ms, long long max_ms)
{
    json_t *e = pause_of(list, policy, partition);
    long long left, until;

    cr_assert_not_null(e, "no pause for %s/%s", policy, partition ? partition : "-");
    left = json_integer_value(json_object_get(e, "remaining_ms"));
    until = json_integer_value(json_object_get(e, "until"));
    cr_expect_str_eq(json_string_value(json_object_get(e, "why")), why, "%s", policy);
    cr_expect(left >= min_ms && left <= max_ms, "%s: remaining_ms %lld", policy, left);
    cr_expect(llabs(until - ((long long)time(NULL) + left / 1000)) <= 2,
              "%s: until %lld is not now + remaining", policy, until);
}

Test(admin, cooldowns_list_why_and_partitions)
{
    json_t *list;

    list = admin_json("GET", "/cooldowns", 200);
    cr_expect_eq(json_array_size(json_object_get(list, "cooldowns")), 0);
    json_decref(list);
    cr_expect_eq(send_to("/cool", "X-Stub-Status: 429\r\nX-Stub-Retry-After: 30\r\n"), 429);
    cr_expect_eq(send_to("/part", "X-Tenant: t1\r\nX-Stub-Status: 429\r\n"
                                  "X-Stub-Retry-After: 40\r\n"), 429);
    cr_expect_eq(send_to("/brk", "X-Stub-Status: 503\r\n"), 503);
    list = admin_json("GET", "/cooldowns", 200);
    expect_pause(list, "cool", NULL, "upstream_429", 25000, 30000);
    expect_pause(list, "part", "t1", "upstream_429", 35000, 40000);
    expect_pause(list, "brk", NULL, "breaker", 15000, 20000);
    cr_expect_null(pause_of(list, "part", NULL), "the partition's pause is its own");
    cr_expect_null(pause_of(list, "idem", NULL));
    json_decref(list);

    /* Ending a partitioned policy's pause ends its partitions' too. */
    json_decref(admin_json("DELETE", "/cooldowns/part", 200));
    cr_expect_eq(send_to("/part", "X-Tenant: t1\r\n"), 200);
    list = admin_json("GET", "/cooldowns", 200);
    cr_expect_null(pause_of(list, "part", "t1"));
    cr_expect_not_null(pause_of(list, "cool", NULL), "other policies keep theirs");
    json_decref(list);
}

static void restart(void)
{
    cr_assert_eq(h_sluice_stop(&sl, 10), 0);
    cr_assert_eq(h_sluice_start_raw(&sl, NULL, sl.port, sl.admin_port), 0,
                 "sluice did not restart on the same store");
}

/* A pause kept in the store comes back after a restart (as `restored`);
 * once an operator ends it, requests go through at once, and it stays ended
 * across the next restart. */
Test(admin, ended_cooldown_stays_ended_after_restart)
{
    json_t *list, *j;
    long long t0;

    cr_expect_eq(send_to("/cool", "X-Stub-Status: 429\r\nX-Stub-Retry-After: 60\r\n"), 429);
    cr_expect_eq(send_to("/cool", NULL), 429, "paused");
    restart();
    list = admin_json("GET", "/cooldowns", 200);
    expect_pause(list, "cool", NULL, "restored", 50000, 60000);
    json_decref(list);

    j = admin_json("DELETE", "/cooldowns/cool", 200);
    cr_expect_eq(json_integer_value(json_object_get(j, "ended")), 1);
    json_decref(j);
    t0 = now_ms();
    cr_expect_eq(send_to("/cool", NULL), 200, "the pause is over");
    cr_expect_lt(now_ms() - t0, 1000, "sent at once");
    list = admin_json("GET", "/cooldowns", 200);
    cr_expect_null(pause_of(list, "cool", NULL));
    json_decref(list);

    restart();
    list = admin_json("GET", "/cooldowns", 200);
    cr_expect_null(pause_of(list, "cool", NULL), "the store brought the pause back");
    json_decref(list);
    cr_expect_eq(send_to("/cool", NULL), 200);
    j = admin_json("DELETE", "/cooldowns/cool", 200);
    cr_expect_eq(json_integer_value(json_object_get(j, "ended")), 0, "nothing running");
    json_decref(j);
}

/* ---- many idle connections ---------------------------------------------- */

#define IDLE 300

static int tcp_connect(int port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* Half the connections say nothing, half send the start of a request head
 * and stop (a slow client): neither may keep a probe out. */
Test(admin, idle_connections_do_not_starve_probes)
{
    static const char partial[] = "GET /healthz HTTP/1.1\r\nHost: x\r\n";
    int fds[IDLE], opened = 0, status;
    long long t0, took;

    for (int i = 0; i < IDLE; i++) {
        fds[i] = tcp_connect(sl.admin_port);
        if (fds[i] < 0)
            break;
        opened++;
        if (i % 2 && write(fds[i], partial, sizeof partial - 1) < 0)
            break;
    }
    cr_expect_eq(opened, IDLE, "only %d connections opened", opened);
    usleep(200000); /* let the admin thread accept them all */
    t0 = now_ms();
    status = admin("GET", "/healthz", NULL);
    took = now_ms() - t0;
    for (int i = 0; i < opened; i++)
        close(fds[i]);
    cr_expect_eq(status, 200);
    cr_expect_lt(took, 2000, "/healthz took %lld ms", took);
}
