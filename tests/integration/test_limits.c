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
