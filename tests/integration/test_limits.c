/* Limits on what workers send (docs/contract.md §2, `limits`) and robustness:
 * every refusal is a problem+json with Sluice-Outcome: rejected, and nothing
 * a client sends brings the server down. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "integration/harness.h"

static struct h_stub stub;
static struct h_sluice sl;

static void start_with(int max_connections)
{
    char *cfg;

    cr_assert_eq(h_stub_start(&stub, NULL), 0);
    cr_assert(asprintf(&cfg,
        "limits: {max_body: 64KiB, max_header: 2KiB, max_connections: %d}\n"
        "upstreams: {stub: {url: http://127.0.0.1:%d}}\n"
        "routes: [{prefix: /, upstream: stub}]\n",
        max_connections, stub.port) > 0);
    cr_assert_eq(h_sluice_start(&sl, cfg), 0);
    free(cfg);
}

static void start(void)
{
    start_with(4096);
}

static void start_small(void)
{
    start_with(16);
}

static void stop(void)
{
    h_sluice_cleanup(&sl);
    h_stub_stop(&stub);
}

TestSuite(limits, .init = start, .fini = stop, .timeout = 120);
TestSuite(connections, .init = start_small, .fini = stop, .timeout = 60);

static void expect_rejected(const struct h_resp *r, int status, const char *reason)
{
    char *o = h_header(r, "Sluice-Outcome"), *ct = h_header(r, "Content-Type");
    char want[64];

    cr_expect_eq(r->status, status, "status %d, want %d", r->status, status);
    cr_expect(o && strcmp(o, "rejected") == 0, "outcome %s", o ? o : "(none)");
    cr_expect(ct && strcmp(ct, "application/problem+json") == 0, "type %s", ct ? ct : "");
    snprintf(want, sizeof want, "\"reason\":\"%s\"", reason);
    cr_expect(r->body && strstr(r->body, want), "body %s", r->body ? r->body : "");
    free(o);
    free(ct);
}

static bool still_serving(void)
{
    struct h_resp r;
    bool ok = h_http(sl.port, "GET", "/alive", NULL, NULL, 0, &r) == 0 &&
              r.status == 200;
    h_resp_free(&r);
    return ok;
}

Test(limits, body_at_limit_passes)
{
    size_t n = 64 * 1024;
    char *body = calloc(1, n);
    struct h_resp r;

    cr_assert_eq(h_http(sl.port, "POST", "/x", NULL, body, n, &r), 0);
    cr_expect_eq(r.status, 200);
    cr_expect_eq(r.body_len, n);
    h_resp_free(&r);
    free(body);
}

Test(limits, body_over_limit_by_length_is_413)
{
    size_t n = 64 * 1024 + 1;
    char *body = calloc(1, n);
    struct h_resp r;

    cr_assert_eq(h_http(sl.port, "POST", "/x", NULL, body, n, &r), 0);
    expect_rejected(&r, 413, "body_too_large");
    h_resp_free(&r);
    free(body);
    cr_expect(still_serving());
}

Test(limits, chunked_body_over_limit_is_413)
{
    char *req, chunk[8192 + 16];
    size_t len = 0, cap = 200 * 1024;
    struct h_resp r;

    req = malloc(cap);
    len = (size_t)sprintf(req, "POST /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                               "Transfer-Encoding: chunked\r\n\r\n");
    memset(chunk, 'a', sizeof chunk);
    for (int i = 0; i < 10; i++) {
        len += (size_t)sprintf(req + len, "2000\r\n");
        memcpy(req + len, chunk, 8192);
        len += 8192;
        len += (size_t)sprintf(req + len, "\r\n");
    }
    len += (size_t)sprintf(req + len, "0\r\n\r\n");
    cr_assert_eq(h_http_raw(sl.port, req, len, &r), 0);
    expect_rejected(&r, 413, "body_too_large");
    h_resp_free(&r);
    free(req);
}

Test(limits, headers_over_limit_are_431)
{
    char hdr[3000];
    struct h_resp r;

    memset(hdr, 'h', sizeof hdr);
    memcpy(hdr, "X-Big: ", 7);
    strcpy(hdr + 2500, "\r\n");
    cr_assert_eq(h_http(sl.port, "GET", "/x", hdr, NULL, 0, &r), 0);
    cr_expect_eq(r.status, 431);
    h_resp_free(&r);
    cr_expect(still_serving());
}

Test(limits, headers_just_over_limit_get_our_431)
{
    char hdr[2100];
    struct h_resp r;

    memset(hdr, 'h', sizeof hdr);
    memcpy(hdr, "X-Big: ", 7);
    strcpy(hdr + 2060, "\r\n");
    cr_assert_eq(h_http(sl.port, "GET", "/x", hdr, NULL, 0, &r), 0);
    expect_rejected(&r, 431, "headers_too_large");
    h_resp_free(&r);
}

Test(limits, length_and_chunked_together_is_400)
{
    const char *req = "POST /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                      "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
                      "5\r\nhello\r\n0\r\n\r\n";
    struct h_resp r;

    cr_assert_eq(h_http_raw(sl.port, req, strlen(req), &r), 0);
    cr_expect_eq(r.status, 400);
    h_resp_free(&r);
    cr_expect(still_serving());
}

Test(limits, two_different_lengths_is_400)
{
    const char *req = "POST /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                      "Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello!";
    struct h_resp r;

    cr_assert_eq(h_http_raw(sl.port, req, strlen(req), &r), 0);
    cr_expect_eq(r.status, 400);
    h_resp_free(&r);
}

Test(limits, malformed_request_line_is_400)
{
    static const char *const bad[] = {
        "GARBAGE\r\n\r\n",
        "GET /x HTTP/9.9\r\nHost: x\r\n\r\n",
        "GET /x HTTP/1.1\r\nBad Header Without Colon\r\n\r\n",
        "GET /x HTTP/1.1\r\nContent-Length: abc\r\nConnection: close\r\n\r\n",
    };

    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        struct h_resp r;
        int rc = h_http_raw(sl.port, bad[i], strlen(bad[i]), &r);
        /* Either a 4xx/5xx answer or a closed connection; never a 200. */
        cr_expect(rc != 0 || (r.status >= 400 && r.status < 600),
                  "case %zu answered %d", i, r.status);
        h_resp_free(&r);
    }
    cr_expect(still_serving());
}

/* Connections beyond max_connections are closed at once. */
Test(connections, max_connections)
{
    int fds[40], closed = 0;

    for (int i = 0; i < 40; i++)
        fds[i] = h_connect(sl.port);
    usleep(300000);
    for (int i = 0; i < 40; i++) {
        struct pollfd p = {fds[i], POLLIN, 0};
        char c;
        if (fds[i] < 0 || (poll(&p, 1, 50) == 1 && recv(fds[i], &c, 1, 0) <= 0))
            closed++;
    }
    /* 16 allowed (8 per thread on 2 threads): at least 40 - 16 are closed. */
    cr_expect_geq(closed, 40 - 16, "only %d of 40 closed", closed);
    for (int i = 0; i < 40; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    usleep(100000);
    cr_expect(still_serving());
}

/* 200 connections sending junk, half-requests or nothing: the server stays up. */
Test(limits, garbage_connections_leave_the_server_up)
{
    static const char *const junk[] = {
        "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", /* a TLS hello */
        "GET /x HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\npartial",
        "POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        "\r\n\r\n\r\n",
        "GET /x HTTP/1.1\r\n" "X: \x01\x02\x7f\r\n\r\n",
        "",
    };
    int fds[200];

    for (int i = 0; i < 200; i++) {
        const char *j = junk[i % 6];
        fds[i] = h_connect(sl.port);
        if (fds[i] >= 0 && *j)
            send(fds[i], j, strlen(j), MSG_NOSIGNAL);
        if (i % 2 && fds[i] >= 0) {
            close(fds[i]);
            fds[i] = -1;
        }
    }
    cr_expect(still_serving());
    for (int i = 0; i < 200; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    usleep(100000);
    cr_expect(still_serving());
}

/* ---- out of file descriptors ------------------------------------------------ */

/* sluice with RLIMIT_NOFILE 64 (soft and hard: it cannot raise it), on two
 * loops: about 30 descriptors are its own. */
#define FD_LIMIT 64

static void start_few_fds(void)
{
    char *cfg;

    cr_assert_eq(h_stub_start(&stub, NULL), 0);
    cr_assert(asprintf(&cfg, "upstreams: {stub: {url: http://127.0.0.1:%d}}\n"
                             "routes: [{prefix: /, upstream: stub}]\n", stub.port) > 0);
    sl.nofile = FD_LIMIT;
    cr_assert_eq(h_sluice_start(&sl, cfg), 0, "sluice did not start with %d descriptors",
                 FD_LIMIT);
    free(cfg);
}

TestSuite(descriptors, .init = start_few_fds, .fini = stop, .timeout = 60);

static void start_low_soft_limit(void)
{
    sl.nofile_hard = 8192;
    start_few_fds();
}

TestSuite(descriptor_limit, .init = start_low_soft_limit, .fini = stop, .timeout = 60);

/* A soft limit below the hard one (systemd's 1024 under 524288) is raised to
 * it at start-up. */
Test(descriptor_limit, the_soft_limit_is_raised_to_the_hard_one)
{
    char path[64];

    snprintf(path, sizeof path, "/proc/%d/limits", (int)sl.pid);
    cr_expect(h_file_contains(sl.log_path, "RLIMIT_NOFILE raised from 64 to 8192"));
    cr_expect(h_sh("grep -q 'Max open files *8192 *8192' %s", path) == 0,
              "the process runs with 8192 descriptors");
    cr_expect(!h_file_contains(sl.log_path, "RLIMIT_NOFILE is"),
              "no warning: 8192 is enough for this config");
}

/* CPU seconds (user + system) the process has used, in milliseconds. */
static long cpu_ms(pid_t pid)
{
    char path[64], buf[1024], *p;
    unsigned long ut = 0, st = 0;
    FILE *f;

    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    f = fopen(path, "r");
    cr_assert(f, "no %s", path);
    p = fgets(buf, sizeof buf, f);
    fclose(f);
    cr_assert(p && (p = strrchr(buf, ')')), "unreadable %s", path);
    /* After "pid (comm)": state is field 3; utime and stime are 14 and 15. */
    cr_assert_eq(sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st), 2);
    return (long)((ut + st) * 1000 / (unsigned long)sysconf(_SC_CLK_TCK));
}

static size_t log_lines(const char *path, const char *text)
{
    char line[4096];
    size_t n = 0;
    FILE *f = fopen(path, "r");

    cr_assert(f);
    while (fgets(line, sizeof line, f))
        n += strstr(line, text) != NULL;
    fclose(f);
    return n;
}

static bool healthz(void)
{
    struct h_resp r;
    bool ok = h_http(sl.admin_port, "GET", "/healthz", NULL, NULL, 0, &r) == 0 &&
              r.status == 200;

    h_resp_free(&r);
    return ok;
}

/* More worker connections than descriptors: accept() used to fail at once
 * and be retried at every loop pass (5.4 CPU seconds in 3 s, a million log
 * lines, /healthz unanswered). Worker connections now stop short of the
 * last descriptors: the rest are closed at once, counted, logged once a
 * second, and the admin port still answers. */
Test(descriptors, more_connections_than_descriptors_do_not_spin)
{
    enum { N = 80 };
    int fds[N];
    long before, used;
    size_t lines;

    cr_expect(h_file_contains(sl.log_path, "RLIMIT_NOFILE is 64"),
              "the start-up warns that the limit is below what the config needs");
    before = cpu_ms(sl.pid);
    for (int i = 0; i < N; i++)
        fds[i] = h_connect(sl.port);
    sleep(3);
    used = cpu_ms(sl.pid) - before;
    cr_expect_lt(used, 1000, "%ld ms of CPU in 3 s with %d connections", used, N);
    cr_expect(healthz(), "/healthz answers while the worker port is out of descriptors");
    lines = log_lines(sl.log_path, "file descriptors left");
    cr_expect_geq(lines, 1, "the refusals are logged");
    cr_expect_leq(lines, 5, "%zu log lines: once a second at most", lines);
    cr_expect_lt(h_sh("test $(wc -c < %s) -lt 65536", sl.log_path), 1, "the log stays short");
    for (int i = 0; i < N; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    usleep(200000);
    cr_expect(still_serving(), "serving again once the connections are gone");
}

/* Descriptors used up by something else (here: idle admin connections): a
 * worker connection's accept() fails with EMFILE, and accepting pauses
 * 100 ms each time instead of spinning; the connections wait in the
 * backlog and are served once descriptors are free. */
Test(descriptors, accept_out_of_descriptors_pauses)
{
    enum { ADMIN = 48, WORKERS = 4 };
    static const char get[] = "GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    int admin[ADMIN], workers[WORKERS];
    long before, used;
    struct h_resp r;
    char *n;

    for (int i = 0; i < ADMIN; i++)
        admin[i] = h_connect(sl.admin_port);
    usleep(300000); /* the admin thread has taken every descriptor left */
    before = cpu_ms(sl.pid);
    for (int i = 0; i < WORKERS; i++)
        workers[i] = h_connect(sl.port);
    sleep(2);
    used = cpu_ms(sl.pid) - before;
    cr_expect_lt(used, 700, "%ld ms of CPU in 2 s out of descriptors", used);
    cr_expect_leq(log_lines(sl.log_path, "accepting paused"), 3,
                  "logged once a second at most");
    for (int i = 0; i < ADMIN; i++)
        if (admin[i] >= 0)
            close(admin[i]);
    usleep(300000);
    /* The worker connections that waited in the backlog are served. One
     * accepted while the admin thread was still closing its connections
     * may have met a descriptor among the last FD_HEADROOM and been closed
     * at once (descriptors are handed out lowest first, and the first one
     * freed can be a high one): closed, then, never left unanswered. */
    {
        int served = 0;

        for (int i = 0; i < WORKERS; i++) {
            char buf[64] = {0};
            struct pollfd p = {workers[i], POLLIN, 0};
            ssize_t got;

            cr_assert_geq(workers[i], 0);
            if (h_send_all(workers[i], get, strlen(get)) != 0)
                continue; /* closed before the request: refused */
            cr_expect_eq(poll(&p, 1, 3000), 1, "worker %d: neither answered nor closed", i);
            got = recv(workers[i], buf, sizeof buf - 1, 0);
            served += got > 12 && strncmp(buf, "HTTP/1.1 200", 12) == 0;
        }
        cr_expect_geq(served, 1, "a connection that waited in the backlog is served");
    }
    for (int i = 0; i < WORKERS; i++)
        if (workers[i] >= 0)
            close(workers[i]);
    cr_assert_eq(h_http(sl.admin_port, "GET", "/metrics", NULL, NULL, 0, &r), 0);
    n = strstr(r.body ? r.body : "", "\nsluice_accept_paused_total ");
    cr_expect(n && strtoull(n + 28, NULL, 10) >= 1, "the pauses are counted");
    h_resp_free(&r);
}
