/* The upstream side: failures told apart (connect error, lost connection,
 * timeout), the keep-alive pool's limit, and HTTPS verification with a CA and
 * certificates made at test time by the openssl command. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <stdbool.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "integration/harness.h"
#include "support/testutil.h"

static struct h_stub stub;
static struct h_sluice sl;

static void stop(void)
{
    h_sluice_cleanup(&sl);
    h_stub_stop(&stub);
}

static void start_plain(void)
{
    char *cfg;
    int dead = h_free_port();

    cr_assert_eq(h_stub_start(&stub, NULL), 0);
    cr_assert(asprintf(&cfg,
        "threads: 1\n"
        "upstreams:\n"
        "  stub: {url: http://127.0.0.1:%d, timeout: 500ms, connect_timeout: 500ms}\n"
        "  one: {url: http://127.0.0.1:%d, max_connections: 1}\n"
        "  dead: {url: http://127.0.0.1:%d, connect_timeout: 1s}\n"
        "policies:\n"
        "  noretry: {retry: {on: [429]}}\n"
        "routes:\n"
        "  - {prefix: /stub, upstream: stub}\n"
        "  - {prefix: /perm, upstream: stub, policy: noretry}\n"
        "  - {prefix: /one, upstream: one}\n"
        "  - {prefix: /dead, upstream: dead}\n"
        "  - {prefix: /permdead, upstream: dead, policy: noretry}\n",
        stub.port, stub.port, dead) > 0);
    cr_assert_eq(h_sluice_start(&sl, cfg), 0);
    free(cfg);
}

TestSuite(upstream, .init = start_plain, .fini = stop, .timeout = 60);

/* Transport failures in retry.on (the default) are requeue instructions;
 * left out of it they are permanent 502/504 problems. */
static void expect_failure(const char *target, const char *headers, int status,
                           const char *reason)
{
    struct h_resp r;
    char want[64], *o;
    bool perm = strncmp(target, "/perm", 5) == 0;

    cr_assert_eq(h_http(sl.port, "POST", target, headers, "x", 1, &r), 0);
    cr_expect_eq(r.status, status, "%s: status %d", target, r.status);
    snprintf(want, sizeof want, "\"reason\":\"%s\"", reason);
    cr_expect(r.body && strstr(r.body, want), "%s: body %s", target, r.body);
    o = h_header(&r, "Sluice-Outcome");
    cr_expect(o && strcmp(o, perm ? "permanent_error" : "requeue") == 0,
              "%s: outcome %s", target, o ? o : "(none)");
    free(o);
    if (!perm)
        cr_expect(strstr(r.body, "\"action\":\"requeue\"") != NULL, "%s", r.body);
    h_resp_free(&r);
}

Test(upstream, down_is_connect_error)
{
    expect_failure("/dead/x", NULL, 503, "connect_error");
    expect_failure("/permdead/x", NULL, 502, "connect_error");
}

Test(upstream, slow_is_timeout)
{
    struct timespec a, b;

    clock_gettime(CLOCK_MONOTONIC, &a);
    expect_failure("/stub/x", "X-Stub-Delay-Ms: 3000\r\n", 503, "timeout");
    expect_failure("/perm/x", "X-Stub-Delay-Ms: 3000\r\n", 504, "timeout");
    clock_gettime(CLOCK_MONOTONIC, &b);
    /* Answered at the 500 ms timeout, not after the stub's 3 s. */
    cr_expect_lt(b.tv_sec - a.tv_sec, 3);
}

Test(upstream, dropped_is_connection_lost)
{
    expect_failure("/stub/x", "X-Stub-Drop: before\r\n", 503, "connection_lost");
    expect_failure("/perm/x", "X-Stub-Drop: mid\r\n", 502, "connection_lost");
}

Test(upstream, garbage_is_connection_lost)
{
    expect_failure("/perm/x", "X-Stub-Garbage: 1\r\n", 502, "connection_lost");
}

Test(upstream, works_after_failures)
{
    struct h_resp r;

    expect_failure("/perm/x", "X-Stub-Drop: before\r\n", 502, "connection_lost");
    cr_assert_eq(h_http(sl.port, "GET", "/stub/ok", NULL, NULL, 0, &r), 0);
    cr_expect_eq(r.status, 200);
    h_resp_free(&r);
}

static void *slow_request(void *arg)
{
    struct h_resp r;
    long ok = h_http(sl.port, "GET", "/one/slow", "X-Stub-Delay-Ms: 200\r\n",
                     NULL, 0, &r) == 0 && r.status == 200;

    h_resp_free(&r);
    return (void *)ok;
}

/* max_connections: 1 → the stub never sees two requests at once. */
Test(upstream, pool_limit_is_honoured)
{
    pthread_t t[4];
    void *ok;

    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, slow_request, NULL);
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], &ok);
        cr_expect(ok != NULL, "request %d failed", i);
    }
    cr_expect_eq(h_stub_stat(&stub, "in_flight_max"), 1);
}

/* ---- HTTPS -------------------------------------------------------------- */

static char *pki;

static void make_pki(void)
{
    pki = tu_mkdtemp("pki");
    cr_assert_not_null(pki);
    /* A CA, a server cert it signs (localhost + 127.0.0.1), a cert it signs
     * for another name, and a self-signed cert for the right name. */
    cr_assert_eq(h_sh(
        "cd %s && "
        "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj /CN=test-ca >/dev/null 2>&1 && "
        "openssl req -newkey rsa:2048 -nodes -keyout good.key -out good.csr -subj /CN=localhost >/dev/null 2>&1 && "
        "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1' > good.ext && "
        "openssl x509 -req -in good.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out good.pem -days 2 -extfile good.ext >/dev/null 2>&1 && "
        "openssl req -newkey rsa:2048 -nodes -keyout other.key -out other.csr -subj /CN=other.example >/dev/null 2>&1 && "
        "printf 'subjectAltName=DNS:other.example' > other.ext && "
        "openssl x509 -req -in other.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out other.pem -days 2 -extfile other.ext >/dev/null 2>&1 && "
        "openssl req -x509 -newkey rsa:2048 -nodes -keyout self.key -out self.pem -days 2 -subj /CN=localhost "
        "-addext subjectAltName=DNS:localhost,IP:127.0.0.1 >/dev/null 2>&1",
        pki), 0, "openssl failed");
}

static void start_tls(const char *cert, const char *host, const char *tls)
{
    char c[512], k[512], *cfg;
    const char *args[] = {"--tls-cert", c, "--tls-key", k, NULL};

    snprintf(c, sizeof c, "%s/%s.pem", pki, cert);
    snprintf(k, sizeof k, "%s/%s.key", pki, cert);
    cr_assert_eq(h_stub_start(&stub, args), 0, "TLS stub did not start");
    cr_assert(asprintf(&cfg,
        "upstreams:\n"
        "  secure: {url: https://%s:%d/api, tls: %s}\n"
        "routes: [{prefix: /, upstream: secure}]\n",
        host, stub.port, tls) > 0);
    cr_assert_eq(h_sluice_start(&sl, cfg), 0, "sluice did not start");
    free(cfg);
}

static void tls_fini(void)
{
    stop();
    tu_rm_rf(pki);
    free(pki);
}

TestSuite(tls, .init = make_pki, .fini = tls_fini, .timeout = 60);

static char *ca_opt(void)
{
    static char buf[600];
    snprintf(buf, sizeof buf, "{verify: true, ca_file: \"%s/ca.pem\"}", pki);
    return buf;
}

static int get_status(char **body)
{
    struct h_resp r;
    int s;

    cr_assert_eq(h_http(sl.port, "POST", "/hello", NULL, "tls!", 4, &r), 0);
    s = r.status;
    if (body)
        *body = strdup(r.body ? r.body : "");
    h_resp_free(&r);
    return s;
}

/* One line of /metrics: the value of `series` (name and labels as
 * rendered), or -1 when absent. */
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

Test(tls, good_certificate_by_ip)
{
    char *body;

    start_tls("good", "127.0.0.1", ca_opt());
    cr_expect_eq(get_status(&body), 200);
    cr_expect_str_eq(body, "tls!");
    free(body);
    /* One connection, its connect and its handshake timed, kept idle. */
    cr_expect_eq(metric("sluice_upstream_connect_duration_seconds_count{upstream=\"secure\"}"), 1);
    cr_expect_eq(metric("sluice_upstream_tls_handshake_duration_seconds_count"
                        "{upstream=\"secure\"}"), 1);
    cr_expect_eq(metric("sluice_upstream_connections_open{upstream=\"secure\"}"), 1);
    cr_expect_eq(metric("sluice_upstream_connections_idle{upstream=\"secure\"}"), 1);
    cr_expect_eq(metric("sluice_upstream_connect_failures_total"
                        "{upstream=\"secure\",phase=\"tls\"}"), 0);
}

Test(tls, good_certificate_by_name_with_sni)
{
    start_tls("good", "localhost", ca_opt());
    cr_expect_eq(get_status(NULL), 200);
}

Test(tls, wrong_name_is_refused)
{
    char *body;

    start_tls("other", "127.0.0.1", ca_opt());
    cr_expect_eq(get_status(&body), 503);
    cr_expect(strstr(body, "connect_error") != NULL, "%s", body);
    free(body);
    /* The TCP connection came up; the handshake is what failed. */
    cr_expect_eq(metric("sluice_upstream_connect_failures_total"
                        "{upstream=\"secure\",phase=\"tls\"}"), 1);
    cr_expect_eq(metric("sluice_upstream_connect_failures_total"
                        "{upstream=\"secure\",phase=\"connect\"}"), 0);
    cr_expect_eq(metric("sluice_upstream_connect_duration_seconds_count{upstream=\"secure\"}"), 1);
    cr_expect_eq(metric("sluice_upstream_connections_open{upstream=\"secure\"}"), 0);
}

Test(tls, untrusted_self_signed_is_refused)
{
    start_tls("self", "127.0.0.1", ca_opt());
    cr_expect_eq(get_status(NULL), 503);
}

Test(tls, system_store_does_not_trust_test_ca)
{
    start_tls("good", "127.0.0.1", "{verify: true}");
    cr_expect_eq(get_status(NULL), 503);
}

Test(tls, verify_false_accepts_anything)
{
    start_tls("self", "127.0.0.1", "{verify: false}");
    cr_expect_eq(get_status(NULL), 200);
}
