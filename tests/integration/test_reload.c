/* Live reload (docs/contract.md §1, section 7 POST /reload): a valid file takes
 * effect, an invalid one changes nothing, state of unchanged policies
 * carries over, and requests in flight finish on their config. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
    cr_expect_eq(status_of(sl.port, "POST", "/a"), 200, "new numbers: a new bucket");
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
