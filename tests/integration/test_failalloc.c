/* Allocation failure on the request path, one allocation at a time (the
 * SLUICE_FAILALLOC build, which the sanitizer build is): for every N along a
 * request's way, its Nth allocation of sluice's own fails. Each such request
 * is answered or closed, sluice keeps serving, and afterwards no slot and no
 * lease is left held and no record is left in progress (except where the
 * failure hit the commit itself: then the lease stays until it expires, by
 * design, so that a duplicate cannot repeat a side effect that happened).
 * The keyed walk runs again with store.sync (the group commit's queue).
 * In other builds the header is ignored and the test is skipped. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "integration/harness.h"
#include "support/testutil.h"

#define MAX_N 600
#define FIRED "failalloc: the armed allocation failed"

static struct h_stub stub;
static struct h_sluice sl;

/* sync: the store's writes go through its group commit (one queue entry
 * per call, made before the write). */
static void start_with(bool sync)
{
    char *cfg, *store = NULL;

#ifndef SLUICE_FAILALLOC_BUILD
    cr_skip_test("not a SLUICE_FAILALLOC build");
#endif
    sl.dir = tu_mkdtemp("failalloc");
    cr_assert_not_null(sl.dir);
    cr_assert(asprintf(&store, "store: {path: %s/data, sync: %s}\n", sl.dir,
                       sync ? "true" : "false") > 0);
    cr_assert_eq(h_stub_start(&stub, NULL), 0);
    cr_assert(asprintf(&cfg,
        "%s"
        "threads: 1\n"
        "log: {level: info, access: true}\n"
        "upstreams: {stub: {url: http://127.0.0.1:%d, timeout: 5s}}\n"
        "policies:\n"
        "  keyed:\n"
        "    rate: 1000/s\n"
        "    burst: 10\n"
        "    concurrency: 4\n"
        "    idempotency: {lease: 30s}\n"
        "routes:\n"
        "  - {prefix: /k, upstream: stub, policy: keyed}\n"
        "  - {prefix: /, upstream: stub}\n", store, stub.port) > 0);
    cr_assert_eq(h_sluice_start(&sl, cfg), 0);
    free(cfg);
    free(store);
}

static void start(void)
{
    start_with(false);
}

static void start_sync(void)
{
    start_with(true);
}

static void stop(void)
{
    h_sluice_cleanup(&sl);
    h_stub_stop(&stub);
}

TestSuite(failalloc, .init = start, .fini = stop, .timeout = 280);
TestSuite(failalloc_sync, .init = start_sync, .fini = stop, .timeout = 280);

/* How many times the log says an armed allocation failed. */
static int fired_count(void)
{
    size_t len = 0;
    char *log = tu_read_file(sl.log_path, &len);
    int n = 0;

    for (const char *p = log; p && (p = strstr(p, FIRED)); p += sizeof FIRED - 1)
        n++;
    free(log);
    return n;
}

static char *admin_get(const char *path)
{
    struct h_resp r;
    char *body;

    cr_assert_eq(h_http(sl.admin_port, "GET", path, NULL, NULL, 0, &r), 0, "%s", path);
    body = strdup(r.body ? r.body : "");
    h_resp_free(&r);
    return body;
}

/* Nothing held once the request is over. A record may stay in progress
 * only where the outcome is unknown and the worker was told so (requeue /
 * connection_lost, delayed past the lease), or the commit itself failed. */
static void expect_released(long n, const char *key, const char *answer)
{
    char *m = admin_get("/metrics"), path[128];
    char *rec;
    const char *exp;
    bool held;

    cr_expect(strstr(m, "\nsluice_leases_active 0\n"), "N=%ld: a lease is still active", n);
    cr_expect(strstr(m, "sluice_inflight{policy=\"keyed\"} 0\n"),
              "N=%ld: a slot is still held", n);
    free(m);
    if (!key)
        return;
    snprintf(path, sizeof path, "/idempotency/keyed/%s", key);
    rec = admin_get(path);
    /* a released lease is a record in progress whose lease has ended */
    exp = strstr(rec, "\"lease_expires_at\":");
    held = strstr(rec, "\"in_progress\"") && exp && atoll(exp + 19) > (long long)time(NULL);

    if (held)
        cr_expect(strstr(answer, "\"reason\":\"connection_lost\"") ||
                  h_file_contains(sl.log_path, "cannot store the completed result"),
                  "N=%ld: %s left in progress: %s; the worker got: %s", n, key, rec,
                  answer);
    free(rec);
}

/* Sends the request with its Nth allocation failing; false once a request
 * went through without reaching its Nth allocation. */
static bool one(long n, bool keyed)
{
    char hdr[160], key[32];
    struct h_resp r;
    int before = fired_count(), after = before;
    char answer[512] = "(closed)";

    snprintf(key, sizeof key, "fa-%ld", n);
    if (keyed)
        snprintf(hdr, sizeof hdr, "X-Sluice-Failalloc: %ld\r\nIdempotency-Key: %s\r\n", n, key);
    else
        snprintf(hdr, sizeof hdr, "X-Sluice-Failalloc: %ld\r\n", n);
    /* answered, or closed: both are fine, a hang or a crash is not */
    if (h_http(sl.port, "POST", keyed ? "/k/x" : "/p/x", hdr, "body", 4, &r) == 0) {
        cr_expect(r.status >= 200 && r.status < 600, "N=%ld: status %d", n, r.status);
        snprintf(answer, sizeof answer, "%d %s", r.status, r.body ? r.body : "");
    }
    h_resp_free(&r);
    cr_assert(kill(sl.pid, 0) == 0, "N=%ld: sluice died", n);
    for (int i = 0; i < 20 && after == before; i++) {
        usleep(10000);
        after = fired_count();
    }
    expect_released(n, keyed ? key : NULL, answer);
    return after > before;
}

static void walk(bool keyed)
{
    long n = 1;
    struct h_resp r;

    while (n <= MAX_N && one(n, keyed))
        n++;
    cr_expect_gt(n, 10, "only %ld allocations on the way: is the hook there?", n - 1);
    cr_expect_leq(n, MAX_N, "more than %d allocations", MAX_N);
    cr_log_info("%s request: %ld allocations failed one by one", keyed ? "keyed" : "plain",
                n - 1);
    /* and it still serves */
    cr_assert_eq(h_http(sl.port, "POST", "/k/x", "Idempotency-Key: after\r\n", "b", 1, &r), 0);
    cr_expect_eq(r.status, 200);
    h_resp_free(&r);
}

Test(failalloc, keyed_request)
{
    walk(true);
}

Test(failalloc, plain_request)
{
    walk(false);
}

Test(failalloc_sync, keyed_request)
{
    walk(true);
}
