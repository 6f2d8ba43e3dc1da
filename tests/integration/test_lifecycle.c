/* The process as an operator meets it: the command line, the admin
 * listener, and the SIGTERM drain of docs/contract.md §1. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "integration/harness.h"
#include "support/testutil.h"

static struct h_stub stub;
static struct h_sluice sl;

static const char *bin(void)
{
    const char *b = getenv("SLUICE_BIN");
    return b ? b : SLUICE_BUILD_DIR "/sluice";
}

static void stop(void)
{
    h_sluice_cleanup(&sl);
    h_stub_stop(&stub);
}

/* ---- command line ------------------------------------------------------- */

Test(cli, version_and_help)
{
    /* One fact a line, as nginx -V: the build, then each library. */
    static const char *const version_lines[] = {
        "^sluice [0-9]+\\.[0-9]+\\.[0-9]+$", "^revision: [^ ]+$",
        "^build type: [A-Za-z]+$", "^  libmicrohttpd [0-9]+\\.[0-9]+",
        "^  libevent [0-9]+\\.[0-9]+", "^  RocksDB [0-9]+\\.[0-9]+\\.[0-9]+ ",
        "^  jansson [0-9]+\\.[0-9]+", "^  libyaml [0-9]+\\.[0-9]+",
        "^  OpenSSL [0-9]+\\.[0-9]+", "^  hiredis [0-9]+\\.[0-9]+\\.[0-9]+ ",
        "^  http-parser [0-9]+\\.[0-9]+\\.[0-9]+$", "^  libsystemd [0-9]+ ",
    };
    static const char *const help_lines[] = {
        "-c, --config FILE", "--check-config [FILE]", "  -t ", "  -T ", "-V, --version",
        "-h, --help",
        "README.md", "docs/contract.md",
    };

    for (size_t i = 0; i < sizeof version_lines / sizeof *version_lines; i++)
        cr_expect_eq(h_sh("%s --version | grep -Eq '%s'", bin(), version_lines[i]), 0,
                      "--version has no line %s", version_lines[i]);
    cr_expect_eq(h_sh("test \"$(%s -V)\" = \"$(%s --version)\"", bin(), bin()), 0);
    for (size_t i = 0; i < sizeof help_lines / sizeof *help_lines; i++)
        cr_expect_eq(h_sh("%s --help | grep -qF -- '%s'", bin(), help_lines[i]), 0,
                      "--help does not mention %s", help_lines[i]);
    cr_expect_neq(h_sh("%s --bogus 2>/dev/null", bin()), 0);
}

/* A missing file says where sluice looked and how to point it elsewhere. */
Test(cli, missing_config_names_both_ways_to_give_one)
{
    char *dir = tu_mkdtemp("cli");

    cr_expect_eq(h_sh("cd %s && env -u SLUICE_CONFIG %s > out 2>&1; test $? = 1", dir, bin()),
                 0);
    cr_expect_eq(h_sh("grep -qF './sidecar.yaml' %s/out", dir), 0);
    cr_expect_eq(h_sh("grep -qF -- '-c FILE' %s/out && grep -qF '$SLUICE_CONFIG' %s/out",
                      dir, dir), 0);
    cr_expect_eq(h_sh("cd %s && SLUICE_CONFIG=%s/nope.yaml %s 2>&1 | "
                      "grep -q 'nope.yaml (\\$SLUICE_CONFIG)'", dir, dir, bin()), 0);
    /* An invalid file is not a missing one: no hint then. */
    cr_expect_eq(h_sh("cd %s && echo 'routes: 5' > bad.yaml && %s -c bad.yaml 2>&1 | "
                      "grep -q SLUICE_CONFIG; test $? = 1", dir, bin()), 0);
    tu_rm_rf(dir);
    free(dir);
}

Test(cli, check_config_valid_and_invalid)
{
    char *dir = tu_mkdtemp("cli");
    char *good = tu_write_file(dir, "good.yaml",
        "upstreams: {a: {url: http://127.0.0.1:1}}\nroutes: [{prefix: /, upstream: a}]\n");
    char *bad = tu_write_file(dir, "bad.yaml",
        "upstreams: {a: {url: http://127.0.0.1:1, timeout: 3x}}\nroutes: [{prefix: /, upstream: b}]\n");

    cr_expect_eq(h_sh("%s --check-config %s >/dev/null", bin(), good), 0);
    cr_expect_eq(h_sh("%s --check-config %s 2>/dev/null", bin(), bad), 1);
    /* Errors are FILE:LINE:COL: message, one per problem. */
    cr_expect_eq(h_sh("%s --check-config %s 2>&1 | grep -q '^%s:1:[0-9]*: .*timeout'",
                      bin(), bad, bad), 0);
    cr_expect_eq(h_sh("%s --check-config %s 2>&1 | grep -q '^%s:2:[0-9]*: .*\"b\"'",
                      bin(), bad, bad), 0);
    cr_expect_eq(h_sh("%s --check-config %s/missing.yaml 2>/dev/null", bin(), dir), 1);
    /* Running on an invalid file refuses to start. */
    cr_expect_eq(h_sh("%s -c %s 2>/dev/null", bin(), bad), 1);
    tu_rm_rf(dir);
    free(dir);
    free(good);
    free(bad);
}

/* nginx -t / -T: the file that would run (-c, $SLUICE_CONFIG, ./sidecar.yaml)
 * is checked; -T prints it as it would run, secrets redacted, on stdout
 * alone, so that it pipes into jq. */
Test(cli, t_checks_the_config_that_would_run)
{
    char *dir = tu_mkdtemp("cli");
    char *good = tu_write_file(dir, "sidecar.yaml",
        "admin_token: s3cret-token\n"
        "upstreams: {a: {url: http://127.0.0.1:1, headers: {Authorization: Bearer tok3n}}}\n"
        "routes: [{prefix: /, upstream: a}]\n");
    char *bad = tu_write_file(dir, "bad.yaml", "routes: 5\n");

    cr_expect_eq(h_sh("cd %s && env -u SLUICE_CONFIG %s -t > out 2>&1", dir, bin()), 0);
    cr_expect_eq(h_sh("grep -qx './sidecar.yaml: ok (1 upstreams, 0 policies, 1 routes)' "
                      "%s/out", dir), 0);
    cr_expect_eq(h_sh("cd %s && SLUICE_CONFIG=bad.yaml %s -t 2>&1 | grep -q '^bad.yaml:1:'",
                      dir, bin()), 0);
    cr_expect_eq(h_sh("cd %s && SLUICE_CONFIG=bad.yaml %s -t -c sidecar.yaml >/dev/null",
                      dir, bin()), 0, "-c wins over $SLUICE_CONFIG");
    cr_expect_eq(h_sh("cd %s && SLUICE_CONFIG=bad.yaml %s -t 2>/dev/null; test $? = 1",
                      dir, bin()), 0);
    /* --check-config without FILE is -t. */
    cr_expect_eq(h_sh("cd %s && env -u SLUICE_CONFIG %s --check-config >/dev/null", dir, bin()),
                 0);
    cr_expect_eq(h_sh("cd %s && %s --check-config bad.yaml 2>/dev/null; test $? = 1", dir,
                      bin()), 0);
    /* -T: the JSON on stdout, parsed; the verdict on stderr; no secret. */
    cr_expect_eq(h_sh("cd %s && env -u SLUICE_CONFIG %s -T > json 2> verdict", dir, bin()), 0);
    cr_expect_eq(h_sh("cd %s && python3 -c 'import json,sys; c=json.load(open(\"json\")); "
                      "sys.exit(c[\"admin_token\"] != \"<redacted>\" or "
                      "c[\"upstreams\"][\"a\"][\"headers\"][\"Authorization\"] != "
                      "\"<redacted>\" or c[\"limits\"][\"max_body\"] != \"8MiB\")'", dir), 0);
    cr_expect_eq(h_sh("grep -q 's3cret-token\\|tok3n' %s/json; test $? = 1", dir), 0);
    cr_expect_eq(h_sh("grep -qx './sidecar.yaml: ok (1 upstreams, 0 policies, 1 routes)' "
                      "%s/verdict", dir), 0);
    cr_expect_eq(h_sh("cd %s && %s -T -c bad.yaml >json 2>/dev/null; test $? = 1 && test ! -s json",
                      dir, bin()), 0);
    tu_rm_rf(dir);
    free(dir);
    free(good);
    free(bad);
}

/* An argument sluice does not use is a mistake (a second file, a typo of an
 * option's value): exit 2 with the usage, never ignored. */
Test(cli, extra_arguments_are_errors)
{
    char *dir = tu_mkdtemp("cli");
    char *good = tu_write_file(dir, "good.yaml",
        "upstreams: {a: {url: http://127.0.0.1:1}}\nroutes: [{prefix: /, upstream: a}]\n");
    static const char *const cases[] = {
        "--check-config good.yaml extra", "-t extra", "-T good.yaml", "-c good.yaml extra",
        "-V extra", "-c good.yaml --check-config good.yaml", "-t -V", "--help -t",
    };

    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        cr_expect_eq(h_sh("cd %s && %s %s >out 2>err; test $? = 2", dir, bin(), cases[i]), 0,
                     "sluice %s: expected exit 2", cases[i]);
        cr_expect_eq(h_sh("grep -q '^usage: sluice' %s/err && test ! -s %s/out", dir, dir), 0,
                     "sluice %s: the usage on stderr, nothing on stdout", cases[i]);
    }
    tu_rm_rf(dir);
    free(dir);
    free(good);
}

Test(cli, default_config_from_environment)
{
    char *dir = tu_mkdtemp("cli");
    char *bad = tu_write_file(dir, "env.yaml", "routes: 5\n");

    /* $SLUICE_CONFIG names the file when -c is absent: its error proves it. */
    cr_expect_eq(h_sh("cd %s && SLUICE_CONFIG=%s %s 2>&1 | grep -q 'env.yaml'",
                      dir, bad, bin()), 0);
    tu_rm_rf(dir);
    free(dir);
    free(bad);
}

Test(cli, busy_port_fails_clearly, .fini = stop)
{
    struct h_sluice second = {0};
    char *cfg;

    cr_assert_eq(h_stub_start(&stub, NULL), 0);
    cr_assert(asprintf(&cfg, "upstreams: {a: {url: http://127.0.0.1:%d}}\n"
                             "routes: [{prefix: /, upstream: a}]\n", stub.port) > 0);
    cr_assert_eq(h_sluice_start(&sl, cfg), 0);
    free(cfg);
    cr_assert(asprintf(&cfg,
        "listen: 127.0.0.1:%d\nadmin: 127.0.0.1:%d\n"
        "upstreams: {a: {url: http://127.0.0.1:%d}}\n"
        "routes: [{prefix: /, upstream: a}]\n",
        sl.port, h_free_port(), stub.port) > 0);
    cr_expect_neq(h_sluice_start_raw(&second, cfg, sl.port, h_free_port()), 0);
    cr_expect(h_file_contains(second.log_path, "cannot listen"));
    h_sluice_cleanup(&second);
    free(cfg);
}

/* ---- admin -------------------------------------------------------------- */

static void start_admin(void)
{
    char *cfg;

    setenv("IT_SECRET", "hunter2-secret", 1);
    cr_assert_eq(h_stub_start(&stub, NULL), 0);
    cr_assert(asprintf(&cfg,
        "upstreams:\n"
        "  partner:\n"
        "    url: http://127.0.0.1:%d\n"
        "    headers: {Authorization: \"Bearer ${IT_SECRET}\", X-Plain: visible-value}\n"
        "policies:\n"
        "  writes: {rate: 5/s, burst: 2}\n"
        "routes: [{prefix: /, upstream: partner, policy: writes}]\n",
        stub.port) > 0);
    cr_assert_eq(h_sluice_start(&sl, cfg), 0);
    free(cfg);
}

TestSuite(admin, .init = start_admin, .fini = stop, .timeout = 30);

Test(admin, health_and_ready)
{
    struct h_resp r;

    cr_assert_eq(h_http(sl.admin_port, "GET", "/healthz", NULL, NULL, 0, &r), 0);
    cr_expect_eq(r.status, 200);
    h_resp_free(&r);
    cr_assert_eq(h_http(sl.admin_port, "GET", "/readyz", NULL, NULL, 0, &r), 0);
    cr_expect_eq(r.status, 200);
    cr_expect(r.body && strstr(r.body, "{\"ready\": true}"), "readyz: %s", r.body ? r.body : "");
    h_resp_free(&r);
    cr_assert_eq(h_http(sl.admin_port, "GET", "/nope", NULL, NULL, 0, &r), 0);
    cr_expect_eq(r.status, 404);
    h_resp_free(&r);
}

Test(admin, config_is_redacted_json)
{
    struct h_resp r;

    cr_assert_eq(h_http(sl.admin_port, "GET", "/config", NULL, NULL, 0, &r), 0);
    cr_expect_eq(r.status, 200);
    cr_expect(strstr(r.body, "\"partner\"") != NULL, "%s", r.body);
    cr_expect(strstr(r.body, "\"writes\"") != NULL, "%s", r.body);
    cr_expect(strstr(r.body, "hunter2") == NULL, "secret leaked: %s", r.body);
    cr_expect(strstr(r.body, "visible-value") == NULL, "header value leaked");
    cr_expect(strstr(r.body, "Authorization") != NULL, "header names are shown");
    h_resp_free(&r);
}

Test(admin, not_on_the_worker_port)
{
    struct h_resp r;

    /* The worker port forwards /healthz to the upstream like any path. */
    cr_assert_eq(h_http(sl.port, "GET", "/healthz", NULL, NULL, 0, &r), 0);
    cr_expect_eq(r.status, 200);
    cr_expect(strstr(r.head, "X-Stub-Target: /healthz") != NULL);
    h_resp_free(&r);
}

/* ---- drain -------------------------------------------------------------- */

static void start_drain(const char *drain)
{
    char *cfg;

    cr_assert_eq(h_stub_start(&stub, NULL), 0);
    cr_assert(asprintf(&cfg,
        "limits: {drain_timeout: %s}\n"
        "upstreams: {a: {url: http://127.0.0.1:%d}}\n"
        "routes: [{prefix: /, upstream: a}]\n", drain, stub.port) > 0);
    cr_assert_eq(h_sluice_start(&sl, cfg), 0);
    free(cfg);
}

struct slow_arg {
    int delay_ms;
    struct h_resp r;
    int rc;
};

static void *slow(void *p)
{
    struct slow_arg *a = p;
    char hdr[64];

    snprintf(hdr, sizeof hdr, "X-Stub-Delay-Ms: %d\r\n", a->delay_ms);
    a->rc = h_http(sl.port, "POST", "/slow", hdr, "job", 3, &a->r);
    return NULL;
}

Test(drain, in_flight_requests_finish, .fini = stop, .timeout = 30)
{
    struct slow_arg a = {.delay_ms = 700};
    pthread_t t;
    struct h_resp r;

    start_drain("10s");
    pthread_create(&t, NULL, slow, &a);
    usleep(200000);
    kill(sl.pid, SIGTERM);
    usleep(100000);
    /* Draining: not ready, and new connections are refused. */
    cr_expect(h_http(sl.admin_port, "GET", "/readyz", NULL, NULL, 0, &r) != 0 ||
              r.status == 503);
    h_resp_free(&r);
    cr_expect_neq(h_http(sl.port, "GET", "/new", NULL, NULL, 0, &r), 0,
                  "a new request was accepted while draining");
    h_resp_free(&r);
    pthread_join(t, NULL);
    cr_expect_eq(a.rc, 0);
    cr_expect_eq(a.r.status, 200);
    cr_expect_str_eq(a.r.body, "job");
    h_resp_free(&a.r);
    cr_expect_eq(h_sluice_stop(&sl, 10), 0, "exit status after drain");
}

Test(drain, deadline_answers_requeue, .fini = stop, .timeout = 30)
{
    struct slow_arg a = {.delay_ms = 5000};
    pthread_t t;
    char *o;

    start_drain("300ms");
    pthread_create(&t, NULL, slow, &a);
    usleep(200000);
    kill(sl.pid, SIGTERM);
    pthread_join(t, NULL);
    cr_expect_eq(a.rc, 0);
    cr_expect_eq(a.r.status, 503);
    o = h_header(&a.r, "Sluice-Outcome");
    cr_expect(o && strcmp(o, "requeue") == 0, "outcome %s", o ? o : "");
    cr_expect(strstr(a.r.body, "connection_lost") != NULL, "%s", a.r.body);
    free(o);
    h_resp_free(&a.r);
    cr_expect_eq(h_sluice_stop(&sl, 10), 0);
}

Test(drain, idle_process_exits_zero, .fini = stop, .timeout = 30)
{
    start_drain("10s");
    cr_expect_eq(h_sluice_stop(&sl, 5), 0);
}
