/* Egress essentials through the real binary: mutual TLS against a stub that
 * requires a client certificate (CAs made by the openssl command at test
 * time), the egress proxy (tests/stub/fwdproxy.c) for https through a
 * CONNECT tunnel and http in absolute form, with its credentials and its
 * failures, what else a proxy may answer to CONNECT, a route's own
 * timeout, and the access log's upstream_status, bytes_in and bytes_out. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "integration/harness.h"
#include "support/testutil.h"

static struct h_stub stub, tls_stub, fwd;
static struct h_sluice sl;
static char *pki;

/* A server CA and a certificate it signs for 127.0.0.1 and localhost; a
 * client CA and a client certificate it signs; another CA and a client
 * certificate that one signs. */
static void make_pki(void)
{
    pki = tu_mkdtemp("egress-pki");
    cr_assert_not_null(pki);
    cr_assert_eq(h_sh(
        "cd %s && "
        "mk_ca() { openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
        "-keyout $1.key -out $1.pem -days 2 -subj /CN=$1 >/dev/null 2>&1; } && "
        "mk_cert() { openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
        "-keyout $1.key -out $1.csr -subj /CN=$3 >/dev/null 2>&1 && printf \"$4\" > $1.ext && "
        "openssl x509 -req -in $1.csr -CA $2.pem -CAkey $2.key -CAcreateserial -out $1.pem "
        "-days 2 -extfile $1.ext >/dev/null 2>&1; } && "
        "mk_ca server-ca && mk_ca client-ca && mk_ca other-ca && "
        "mk_cert server server-ca localhost 'subjectAltName=DNS:localhost,IP:127.0.0.1' && "
        "mk_cert client client-ca sluice-client 'extendedKeyUsage=clientAuth' && "
        "mk_cert intruder other-ca sluice-client 'extendedKeyUsage=clientAuth'",
        pki), 0, "openssl failed");
}

static void stop_all(void)
{
    h_sluice_cleanup(&sl);
    h_stub_stop(&fwd);
    h_stub_stop(&tls_stub);
    h_stub_stop(&stub);
    if (pki) {
        tu_rm_rf(pki);
        free(pki);
        pki = NULL;
    }
}

/* The TLS stub, requiring a client certificate of client-ca when asked. */
static void start_tls_stub(bool mutual)
{
    char c[512], k[512], ca[512];
    const char *args[] = {"--tls-cert", c, "--tls-key", k, "--tls-client-ca", ca, NULL};

    snprintf(c, sizeof c, "%s/server.pem", pki);
    snprintf(k, sizeof k, "%s/server.key", pki);
    snprintf(ca, sizeof ca, "%s/client-ca.pem", pki);
    if (!mutual)
        args[4] = NULL;
    cr_assert_eq(h_stub_start(&tls_stub, args), 0, "TLS stub did not start");
}

static int post(const char *target, const char *headers, struct h_resp *r)
{
    return h_http(sl.port, "POST", target, headers, "hello", 5, r);
}

/* Status and whether the body names the reason. */
static void expect(const char *target, int status, const char *reason)
{
    struct h_resp r;

    cr_assert_eq(post(target, NULL, &r), 0);
    cr_expect_eq(r.status, status, "%s: %d %s", target, r.status, r.body ? r.body : "");
    if (reason)
        cr_expect(r.body && strstr(r.body, reason), "%s: %s", target, r.body ? r.body : "");
    else
        cr_expect(r.body_len == 5 && !memcmp(r.body, "hello", 5), "%s: echo", target);
    h_resp_free(&r);
}

/* ---- mutual TLS ----------------------------------------------------------- */

static void start_mtls(void)
{
    char *cfg;

    make_pki();
    start_tls_stub(true);
    cr_assert(asprintf(&cfg,
        "upstreams:\n"
        "  right: {url: https://localhost:%d, tls: {ca_file: %s/server-ca.pem,\n"
        "          cert_file: %s/client.pem, key_file: %s/client.key}}\n"
        "  none: {url: https://localhost:%d, tls: {ca_file: %s/server-ca.pem}}\n"
        "  other: {url: https://127.0.0.1:%d, tls: {ca_file: %s/server-ca.pem,\n"
        "          cert_file: %s/intruder.pem, key_file: %s/intruder.key}}\n"
        "policies:\n"
        "  noretry: {retry: {on: [429]}}\n"
        "routes:\n"
        "  - {prefix: /right, upstream: right}\n"
        "  - {prefix: /none, upstream: none, policy: noretry}\n"
        "  - {prefix: /other, upstream: other, policy: noretry}\n",
        tls_stub.port, pki, pki, pki, tls_stub.port, pki, tls_stub.port, pki, pki, pki) > 0);
    cr_assert_eq(h_sluice_start(&sl, cfg), 0, "sluice did not start");
    free(cfg);
}

TestSuite(mtls, .init = start_mtls, .fini = stop_all, .timeout = 60);

Test(mtls, the_right_pair_passes)
{
    expect("/right/a", 200, NULL);
    expect("/right/b", 200, NULL);
}

/* Refused in the handshake (with TLS 1.3, by an alert after ours ended):
 * nothing reached the partner, so it is a connect_error. */
Test(mtls, no_certificate_is_connect_error)
{
    expect("/none/a", 502, "\"reason\":\"connect_error\"");
}

Test(mtls, another_cas_certificate_is_connect_error)
{
    expect("/other/a", 502, "\"reason\":\"connect_error\"");
}

/* A reload that changes nothing keeps serving with the same pair. */
Test(mtls, survives_a_reload)
{
    struct h_resp r;

    expect("/right/a", 200, NULL);
    cr_assert_eq(h_http(sl.admin_port, "POST", "/reload", NULL, NULL, 0, &r), 0);
    cr_expect_eq(r.status, 200, "%s", r.body ? r.body : "");
    h_resp_free(&r);
    expect("/right/b", 200, NULL);
}

/* The files changed under the same names (a rotated certificate): the
 * reload loads them; here the new pair is another CA's, so the partner
 * refuses it from then on. */
Test(mtls, a_reload_loads_a_rotated_pair)
{
    struct h_resp r;

    expect("/right/a", 200, NULL);
    cr_assert_eq(h_sh("cd %s && cp intruder.pem client.pem && cp intruder.key client.key",
                      pki), 0);
    cr_assert_eq(h_http(sl.admin_port, "POST", "/reload", NULL, NULL, 0, &r), 0);
    cr_expect_eq(r.status, 200, "%s", r.body ? r.body : "");
    h_resp_free(&r);
    cr_assert_eq(post("/right/b", NULL, &r), 0);
    cr_expect_eq(r.status, 503, "%d %s", r.status, r.body ? r.body : "");
    cr_expect(r.body && strstr(r.body, "\"reason\":\"connect_error\""), "%s",
              r.body ? r.body : "");
    h_resp_free(&r);
}

/* ---- the egress proxy ------------------------------------------------------ */

#define PROXY_USER "egress"
#define PROXY_PASS "s3cret-pr0xy"

/* The value of one /metrics line (name and labels as rendered), -1 absent. */
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

static void start_proxy_suite(void)
{
    const char *fargs[] = {"--auth", PROXY_USER ":" PROXY_PASS, NULL};
    char *cfg, proxy[128];
    int dead = h_free_port();

    make_pki();
    start_tls_stub(false);
    cr_assert_eq(h_stub_start(&stub, NULL), 0);
    cr_assert_eq(h_fwdproxy_start(&fwd, fargs), 0, "sluice-fwdproxy did not start");
    /* As operators write it: from the environment. */
    snprintf(proxy, sizeof proxy, "http://" PROXY_USER ":" PROXY_PASS "@127.0.0.1:%d", fwd.port);
    setenv("SLUICE_T_EGRESS_PROXY", proxy, 1);
    /* One loop: one pool, so keep-alive reuse is what the counts show. */
    cr_assert(asprintf(&cfg,
        "threads: 1\n"
        "upstreams:\n"
        "  secure: {url: https://localhost:%d/api, tls: {ca_file: %s/server-ca.pem},\n"
        "           proxy: \"${SLUICE_T_EGRESS_PROXY}\"}\n"
        "  plain: {url: http://127.0.0.1:%d/base, proxy: \"${SLUICE_T_EGRESS_PROXY}\"}\n"
        "  badauth: {url: https://localhost:%d, tls: {ca_file: %s/server-ca.pem},\n"
        "            proxy: \"http://" PROXY_USER ":wrong@127.0.0.1:%d\"}\n"
        "  noauth: {url: http://127.0.0.1:%d, proxy: \"http://127.0.0.1:%d\"}\n"
        "  deadproxy: {url: https://localhost:%d, tls: {ca_file: %s/server-ca.pem},\n"
        "              proxy: \"http://127.0.0.1:%d\", connect_timeout: 1s}\n"
        "policies:\n"
        "  noretry: {retry: {on: [429]}}\n"
        "routes:\n"
        "  - {prefix: /secure, upstream: secure, strip_prefix: /secure}\n"
        "  - {prefix: /plain, upstream: plain, strip_prefix: /plain}\n"
        "  - {prefix: /badauth, upstream: badauth, policy: noretry}\n"
        "  - {prefix: /noauth, upstream: noauth, policy: noretry}\n"
        "  - {prefix: /deadproxy, upstream: deadproxy, policy: noretry}\n",
        tls_stub.port, pki, stub.port, tls_stub.port, pki, fwd.port, stub.port, fwd.port,
        tls_stub.port, pki, dead) > 0);
    cr_assert_eq(h_sluice_start(&sl, cfg), 0, "sluice did not start");
    free(cfg);
}

TestSuite(proxy, .init = start_proxy_suite, .fini = stop_all, .timeout = 60);

/* One tunnel, kept alive and reused like a direct connection; TLS inside
 * it is with the partner (verified by server-ca, name localhost). */
Test(proxy, https_through_one_tunnel)
{
    struct h_resp r;
    char *target;

    for (int i = 0; i < 4; i++) {
        cr_assert_eq(post("/secure/x?i=1", NULL, &r), 0);
        cr_expect_eq(r.status, 200, "request %d: %d %s", i, r.status, r.body ? r.body : "");
        target = h_header(&r, "X-Stub-Target");
        cr_expect(target && !strcmp(target, "/api/x?i=1"), "origin-form inside the tunnel: %s",
                  target ? target : "(none)");
        free(target);
        h_resp_free(&r);
    }
    cr_expect_eq(h_stub_stat(&fwd, "tunnels"), 1, "the tunnel is reused");
    /* Through the tunnel: one TCP connect (to the proxy), one handshake. */
    cr_expect_eq(metric("sluice_upstream_tls_handshake_duration_seconds_count"
                        "{upstream=\"secure\"}"), 1);
    cr_expect_eq(metric("sluice_upstream_connections_open{upstream=\"secure\"}"), 1);
}

Test(proxy, http_in_absolute_form)
{
    struct h_resp r;
    char *target, want[128];

    snprintf(want, sizeof want, "http://127.0.0.1:%d/base/y", stub.port);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(post("/plain/y", NULL, &r), 0);
        cr_expect_eq(r.status, 200, "%d %s", r.status, r.body ? r.body : "");
        target = h_header(&r, "X-Stub-Target");
        cr_expect(target && !strcmp(target, want), "absolute form: %s", target ? target : "");
        free(target);
        h_resp_free(&r);
    }
    cr_expect_eq(h_stub_stat(&fwd, "forwarded"), 1, "one kept-alive connection, not %lld",
                 h_stub_stat(&fwd, "forwarded"));
    cr_expect_eq(h_stub_stat(&fwd, "refused"), 0, "the credentials were right");
}

Test(proxy, wrong_credentials_are_connect_error)
{
    expect("/badauth/a", 502, "\"reason\":\"connect_error\"");
    expect("/noauth/a", 502, "\"reason\":\"connect_error\"");
    cr_expect_eq(h_stub_stat(&fwd, "refused"), 2);
    cr_expect_eq(h_stub_stat(&stub, "requests"), 0);
    /* The tunnel was refused: a failure of the proxy phase, after a TCP
     * connection to the proxy that was timed. */
    cr_expect_eq(metric("sluice_upstream_connect_failures_total"
                        "{upstream=\"badauth\",phase=\"proxy\"}"), 1);
    cr_expect_eq(metric("sluice_upstream_connect_duration_seconds_count"
                        "{upstream=\"badauth\"}"), 1);
    cr_expect_eq(metric("sluice_upstream_tls_handshake_duration_seconds_count"
                        "{upstream=\"badauth\"}"), -1);
}

Test(proxy, refused_proxy_is_connect_error)
{
    expect("/deadproxy/a", 502, "\"reason\":\"connect_error\"");
    cr_expect_eq(metric("sluice_upstream_connect_failures_total"
                        "{upstream=\"deadproxy\",phase=\"connect\"}"), 1);
    cr_expect_eq(metric("sluice_upstream_connect_failures_total"
                        "{upstream=\"deadproxy\",phase=\"proxy\"}"), 0);
}

/* ---- what else a proxy may answer to CONNECT -------------------------------- */

/* A proxy that answers each CONNECT with the next of these, then closes: a
 * refusal with a head and a body, something that is not HTTP at all, and a
 * 2xx followed by bytes the partner cannot have sent yet (no tunnel). Every
 * one is a connect_error: nothing reached the partner. */
static const char *const odd_answers[] = {
    "HTTP/1.1 403 Forbidden\r\nContent-Length: 9\r\n\r\nforbidden",
    "SSH-2.0-OpenSSH_9.2\r\n\r\n",
    "HTTP/1.1 200 Connection established\r\n\r\nearly",
};
#define N_ODD (sizeof odd_answers / sizeof odd_answers[0])
#define ODD_WAIT_MS 10000 /* the longest the proxy waits for anything */

static int odd_fd = -1;
static pthread_t odd_thread;
static bool odd_running;

static bool readable(int fd)
{
    struct pollfd p = {fd, POLLIN, 0};

    return poll(&p, 1, ODD_WAIT_MS) == 1;
}

/* Reads the CONNECT head (bounded), answers, and waits for sluice to
 * close. */
static void odd_answer(int c, const char *answer)
{
    char buf[2048];
    size_t got = 0;
    ssize_t n;

    while (got < sizeof buf - 1 && readable(c) &&
           (n = recv(c, buf + got, sizeof buf - 1 - got, 0)) > 0) {
        got += (size_t)n;
        buf[got] = '\0';
        if (strstr(buf, "\r\n\r\n"))
            break;
    }
    if (send(c, answer, strlen(answer), MSG_NOSIGNAL) < 0)
        return;
    while (readable(c) && recv(c, buf, sizeof buf, 0) > 0)
        ;
}

static void *odd_proxy(void *arg)
{
    for (size_t i = 0; i < N_ODD && readable(odd_fd); i++) {
        int c = accept(odd_fd, NULL, NULL);

        if (c < 0)
            break;
        odd_answer(c, odd_answers[i]);
        close(c);
    }
    return NULL;
}

static int odd_listen(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;

    odd_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(odd_fd, 0);
    cr_assert_eq(bind(odd_fd, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(listen(odd_fd, 8), 0);
    cr_assert_eq(getsockname(odd_fd, (struct sockaddr *)&a, &len), 0);
    return ntohs(a.sin_port);
}

static void start_odd_suite(void)
{
    char *cfg;
    int port = odd_listen();

    make_pki();
    start_tls_stub(false);
    cr_assert_eq(pthread_create(&odd_thread, NULL, odd_proxy, NULL), 0);
    odd_running = true;
    cr_assert(asprintf(&cfg,
        "threads: 1\n"
        "upstreams:\n"
        "  odd: {url: https://localhost:%d, tls: {ca_file: %s/server-ca.pem},\n"
        "        proxy: \"http://127.0.0.1:%d\", connect_timeout: 5s}\n"
        "policies:\n"
        "  noretry: {retry: {on: [429]}}\n"
        "routes:\n"
        "  - {prefix: /odd, upstream: odd, policy: noretry}\n",
        tls_stub.port, pki, port) > 0);
    cr_assert_eq(h_sluice_start(&sl, cfg), 0, "sluice did not start");
    free(cfg);
}

static void stop_odd_suite(void)
{
    h_sluice_cleanup(&sl); /* sluice gone: the proxy's reads end */
    if (odd_running)
        pthread_join(odd_thread, NULL);
    odd_running = false;
    if (odd_fd >= 0)
        close(odd_fd);
    odd_fd = -1;
    stop_all();
}

TestSuite(connect_answer, .init = start_odd_suite, .fini = stop_odd_suite, .timeout = 60);

Test(connect_answer, anything_but_a_bare_2xx_is_connect_error)
{
    for (size_t i = 0; i < N_ODD; i++)
        expect("/odd/a", 502, "\"reason\":\"connect_error\"");
    cr_expect(h_file_contains(sl.log_path, "egress proxy refused the tunnel: HTTP/1.1 403 "
                                           "Forbidden"), "the proxy's status line is logged");
    cr_expect(h_file_contains(sl.log_path, "egress proxy refused the tunnel: SSH-2.0"),
              "an answer that is not HTTP is a refusal");
}

/* The credentials are never shown: not in GET /config, not in the log. */
Test(proxy, credentials_stay_secret)
{
    struct h_resp r;

    expect("/badauth/a", 502, "connect_error");
    cr_assert_eq(h_http(sl.admin_port, "GET", "/config", NULL, NULL, 0, &r), 0);
    cr_expect_eq(r.status, 200);
    cr_expect(r.body && !strstr(r.body, PROXY_PASS) && !strstr(r.body, ":wrong@"),
              "%s", r.body ? r.body : "");
    cr_expect(r.body && strstr(r.body, "http://" PROXY_USER ":<redacted>@127.0.0.1:"),
              "%s", r.body ? r.body : "");
    h_resp_free(&r);
    cr_expect(!h_file_contains(sl.log_path, PROXY_PASS));
    cr_expect(!h_file_contains(sl.log_path, "ZWdyZXNz"), "no base64 credentials logged");
}

/* ---- a route's timeout, and the access log ---------------------------------- */

static void start_plain(void)
{
    char *cfg;

    cr_assert_eq(h_stub_start(&stub, NULL), 0);
    cr_assert(asprintf(&cfg,
        "upstreams:\n"
        "  stub: {url: http://127.0.0.1:%d, timeout: 5s}\n"
        "policies:\n"
        "  noretry: {retry: {on: [429]}}\n"
        "routes:\n"
        "  - {prefix: /quick, upstream: stub, timeout: 300ms, policy: noretry}\n"
        "  - {prefix: /, upstream: stub}\n",
        stub.port) > 0);
    cr_assert_eq(h_sluice_start(&sl, cfg), 0);
    free(cfg);
}

TestSuite(route, .init = start_plain, .fini = stop_all, .timeout = 60);

static double elapsed_s(const struct timespec *a)
{
    struct timespec b;

    clock_gettime(CLOCK_MONOTONIC, &b);
    return (double)(b.tv_sec - a->tv_sec) + (double)(b.tv_nsec - a->tv_nsec) / 1e9;
}

Test(route, its_timeout_fires_before_the_upstreams)
{
    struct timespec t0;
    struct h_resp r;

    clock_gettime(CLOCK_MONOTONIC, &t0);
    cr_assert_eq(post("/quick/x", "X-Stub-Delay-Ms: 2000\r\n", &r), 0);
    cr_expect_eq(r.status, 504, "%d %s", r.status, r.body ? r.body : "");
    cr_expect(r.body && strstr(r.body, "\"reason\":\"timeout\""), "%s", r.body ? r.body : "");
    cr_expect_lt(elapsed_s(&t0), 1.5, "the route's 300ms, not the upstream's 5s");
    h_resp_free(&r);
    /* Elsewhere the upstream's 5s still applies. */
    cr_assert_eq(post("/other", "X-Stub-Delay-Ms: 600\r\n", &r), 0);
    cr_expect_eq(r.status, 200);
    h_resp_free(&r);
}

/* The access-log line carrying this request id, parsed; NULL after 3 s. */
static json_t *log_line(const char *id)
{
    for (int i = 0; i < 150; i++) {
        char *text = tu_read_file(sl.log_path, NULL), *line, *save = NULL;
        json_t *found = NULL;

        for (line = text ? strtok_r(text, "\n", &save) : NULL; line && !found;
             line = strtok_r(NULL, "\n", &save))
            if (strstr(line, id) && strstr(line, "\"type\":\"access\""))
                found = json_loads(line, 0, NULL);
        free(text);
        if (found)
            return found;
        usleep(20000);
    }
    return NULL;
}

static long long field(json_t *j, const char *name)
{
    json_t *v = json_object_get(j, name);

    return json_is_integer(v) ? json_integer_value(v) : -1;
}

Test(route, access_log_has_upstream_status_and_bytes)
{
    struct h_resp r;
    json_t *j;

    /* Echoed: 5 bytes in, 5 out. */
    cr_assert_eq(post("/a", "X-Request-Id: egress-log-1\r\n", &r), 0);
    cr_expect_eq(r.status, 200);
    h_resp_free(&r);
    cr_assert_not_null(j = log_line("egress-log-1"));
    cr_expect_eq(field(j, "upstream_status"), 200);
    cr_expect_eq(field(j, "bytes_in"), 5);
    cr_expect_eq(field(j, "bytes_out"), 5);
    json_decref(j);

    /* A 429 turned into an instruction: the upstream's status, the
     * instruction's body out. */
    cr_assert_eq(post("/a", "X-Request-Id: egress-log-2\r\nX-Stub-Status: 429\r\n", &r), 0);
    cr_expect_eq(r.status, 429, "%d %s", r.status, r.body ? r.body : "");
    cr_assert_not_null(j = log_line("egress-log-2"));
    cr_expect_eq(field(j, "status"), 429);
    cr_expect_eq(field(j, "upstream_status"), 429);
    cr_expect_eq(field(j, "bytes_out"), (long long)r.body_len);
    json_decref(j);
    h_resp_free(&r);

    /* A streamed body of 300000 bytes and a HEAD. */
    cr_assert_eq(h_http(sl.port, "GET", "/big", "X-Request-Id: egress-log-3\r\n"
                        "X-Stub-Body-Size: 300000\r\n", NULL, 0, &r), 0);
    cr_expect_eq(r.body_len, 300000);
    h_resp_free(&r);
    cr_assert_not_null(j = log_line("egress-log-3"));
    cr_expect_eq(field(j, "bytes_in"), 0);
    cr_expect_eq(field(j, "bytes_out"), 300000);
    json_decref(j);
    cr_assert_eq(h_http(sl.port, "HEAD", "/big", "X-Request-Id: egress-log-4\r\n"
                        "X-Stub-Body-Size: 300\r\n", NULL, 0, &r), 0);
    h_resp_free(&r);
    cr_assert_not_null(j = log_line("egress-log-4"));
    cr_expect_eq(field(j, "upstream_status"), 200);
    cr_expect_eq(field(j, "bytes_out"), 0);
    json_decref(j);
}

/* Nothing reached an upstream: no upstream_status at all. */
Test(route, no_upstream_no_upstream_status)
{
    struct h_resp r;
    json_t *j;

    cr_assert_eq(post("/quick/x", "X-Request-Id: egress-log-5\r\nX-Stub-Drop: before\r\n", &r), 0);
    h_resp_free(&r);
    cr_assert_not_null(j = log_line("egress-log-5"));
    cr_expect_null(json_object_get(j, "upstream_status"));
    cr_expect_eq(field(j, "bytes_in"), 5);
    json_decref(j);
}
