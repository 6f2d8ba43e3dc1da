/* Forwarding as docs/contract.md §3 says, through the real sluice to the real stub:
 * byte-exact round trips, routing, strip_prefix and base paths, header rules. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "integration/harness.h"

static struct h_stub stub;
static struct h_sluice sl;

static void start(void)
{
    char *cfg;

    setenv("IT_PARTNER_TOKEN", "s3cret-token", 1);
    cr_assert_eq(h_stub_start(&stub, NULL), 0, "stub did not start");
    cr_assert(asprintf(&cfg,
        "limits: {max_body: 1MiB}\n"
        "upstreams:\n"
        "  stub:\n"
        "    url: http://127.0.0.1:%d\n"
        "    headers: {Authorization: \"Bearer ${IT_PARTNER_TOKEN}\", X-Team: grading}\n"
        "  based:\n"
        "    url: http://127.0.0.1:%d/base/v2/\n"
        "routes:\n"
        "  - {name: sync, prefix: /v1/sync, upstream: stub}\n"
        "  - {name: posts-only, prefix: /v1/jobs, methods: [POST], upstream: stub}\n"
        "  - {name: stripped, prefix: /api/, strip_prefix: /api, upstream: based}\n"
        "  - {name: whole, prefix: /whole, strip_prefix: /whole, upstream: based}\n"
        "  - {name: first, prefix: /dup, upstream: stub}\n"
        "  - {name: second, prefix: /dup, upstream: based}\n",
        stub.port, stub.port) > 0);
    cr_assert_eq(h_sluice_start(&sl, cfg), 0, "sluice did not start");
    free(cfg);
}

static void stop(void)
{
    h_sluice_cleanup(&sl);
    h_stub_stop(&stub);
}

TestSuite(forwarding, .init = start, .fini = stop, .timeout = 60);

static void expect_header(const struct h_resp *r, const char *name,
                          const char *want)
{
    char *v = h_header(r, name);

    cr_expect(v != NULL, "header %s missing", name);
    if (v)
        cr_expect_str_eq(v, want, "header %s", name);
    free(v);
}

static void round_trip(const char *method, size_t size)
{
    struct h_resp r;
    char *body = malloc(size + 1);

    /* Every byte value, NUL included, must come back unchanged. */
    for (size_t i = 0; i < size; i++)
        body[i] = (char)(i * 7 + 3);
    cr_assert_eq(h_http(sl.port, method, "/v1/sync/item?x=1&y=%20", NULL,
                        body, size, &r), 0);
    cr_expect_eq(r.status, 200, "%s %zu: status %d", method, size, r.status);
    cr_expect_eq(r.body_len, size, "%s %zu: body %zu", method, size, r.body_len);
    cr_expect(r.body_len == size && memcmp(r.body, body, size) == 0,
              "%s %zu: body differs", method, size);
    expect_header(&r, "X-Stub-Method", method);
    expect_header(&r, "X-Stub-Target", "/v1/sync/item?x=1&y=%20");
    expect_header(&r, "Sluice-Outcome", "ok");
    h_resp_free(&r);
    free(body);
}

Test(forwarding, byte_exact_round_trips)
{
    static const char *const methods[] = {"POST", "PUT", "DELETE", "PATCH"};
    static const size_t sizes[] = {0, 1, 4096, 65537, 1024 * 1024};

    for (size_t m = 0; m < 4; m++)
        for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
            round_trip(methods[m], sizes[s]);
}

Test(forwarding, get_without_body)
{
    struct h_resp r;

    cr_assert_eq(h_http(sl.port, "GET", "/v1/sync", NULL, NULL, 0, &r), 0);
    cr_expect_eq(r.status, 200);
    cr_expect_eq(r.body_len, 0);
    expect_header(&r, "X-Stub-Method", "GET");
    expect_header(&r, "X-Stub-Target", "/v1/sync");
    h_resp_free(&r);
}

Test(forwarding, upstream_status_and_outcome)
{
    struct h_resp r;

    cr_assert_eq(h_http(sl.port, "GET", "/v1/sync", "X-Stub-Status: 404\r\n",
                        NULL, 0, &r), 0);
    cr_expect_eq(r.status, 404);
    expect_header(&r, "Sluice-Outcome", "permanent_error");
    h_resp_free(&r);
    cr_assert_eq(h_http(sl.port, "GET", "/v1/sync", "X-Stub-Status: 201\r\n",
                        NULL, 0, &r), 0);
    cr_expect_eq(r.status, 201);
    expect_header(&r, "Sluice-Outcome", "ok");
    h_resp_free(&r);
}

Test(forwarding, no_route_is_404_problem)
{
    struct h_resp r;

    cr_assert_eq(h_http(sl.port, "GET", "/v1/syncx", NULL, NULL, 0, &r), 0);
    cr_expect_eq(r.status, 404);
    expect_header(&r, "Sluice-Outcome", "rejected");
    expect_header(&r, "Content-Type", "application/problem+json");
    cr_expect(strstr(r.body, "\"reason\":\"no_route\"") != NULL, "%s", r.body);
    h_resp_free(&r);
}

Test(forwarding, prefix_boundaries)
{
    static const struct { const char *target; int status; } cases[] = {
        {"/v1/sync", 200}, {"/v1/sync/", 200}, {"/v1/sync?a=b", 200},
        {"/v1/sync/a/b", 200}, {"/v1/syncx", 404}, {"/v1/syn", 404},
        {"/", 404}, {"/api", 404}, {"/api/", 200}, {"/api/x", 200},
    };

    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct h_resp r;
        cr_assert_eq(h_http(sl.port, "GET", cases[i].target, NULL, NULL, 0, &r), 0);
        cr_expect_eq(r.status, cases[i].status, "%s: %d", cases[i].target, r.status);
        h_resp_free(&r);
    }
}

Test(forwarding, methods_filter)
{
    struct h_resp r;

    cr_assert_eq(h_http(sl.port, "GET", "/v1/jobs", NULL, NULL, 0, &r), 0);
    cr_expect_eq(r.status, 404);
    h_resp_free(&r);
    cr_assert_eq(h_http(sl.port, "POST", "/v1/jobs", NULL, "x", 1, &r), 0);
    cr_expect_eq(r.status, 200);
    h_resp_free(&r);
}

Test(forwarding, strip_prefix_and_base_path)
{
    static const struct { const char *in, *out; } cases[] = {
        {"/api/users?id=7", "/base/v2/users?id=7"},
        {"/api/", "/base/v2/"},
        {"/whole", "/base/v2/"},
        {"/whole?q=1", "/base/v2/?q=1"},
        {"/whole/deep/er", "/base/v2/deep/er"},
    };

    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct h_resp r;
        cr_assert_eq(h_http(sl.port, "GET", cases[i].in, NULL, NULL, 0, &r), 0);
        cr_expect_eq(r.status, 200, "%s", cases[i].in);
        expect_header(&r, "X-Stub-Target", cases[i].out);
        h_resp_free(&r);
    }
}

Test(forwarding, first_of_equal_prefixes_wins)
{
    struct h_resp r;

    cr_assert_eq(h_http(sl.port, "GET", "/dup/x", NULL, NULL, 0, &r), 0);
    expect_header(&r, "X-Stub-Target", "/dup/x");
    h_resp_free(&r);
}

Test(forwarding, host_and_absolute_form_never_choose_destination)
{
    struct h_resp r;
    char want[64];
    const char *req = "GET http://evil.example:1/v1/sync?z=9 HTTP/1.1\r\n"
                      "Host: evil.example:1\r\nConnection: close\r\n\r\n";

    snprintf(want, sizeof want, "127.0.0.1:%d", stub.port);
    cr_assert_eq(h_http_raw(sl.port, req, strlen(req), &r), 0);
    cr_expect_eq(r.status, 200);
    expect_header(&r, "X-Stub-Host", want);
    expect_header(&r, "X-Stub-Target", "/v1/sync?z=9");
    h_resp_free(&r);
}

Test(forwarding, request_header_rules)
{
    struct h_resp r;

    cr_assert_eq(h_http(sl.port, "POST", "/v1/sync",
                        "X-Stub-Echo: json\r\n"
                        "Keep-Alive: timeout=5\r\n"
                        "Proxy-Authorization: Basic Zm9v\r\n"
                        "TE: trailers\r\n"
                        "Upgrade: h2c\r\n"
                        "X-Hop: 1\r\n"
                        "Connection: X-Hop, Upgrade\r\n"
                        "Sluice-Attempt: 3\r\n"
                        "Sluice-Enqueued-At: 1700000000\r\n"
                        "Idempotency-Key: job-42\r\n"
                        "Authorization: Bearer worker-own\r\n"
                        "X-End-To-End: kept\r\n",
                        "{}", 2, &r), 0);
    cr_assert_eq(r.status, 200, "%s", r.body);
    /* The stub echoes the headers it received as JSON pairs. */
    cr_expect(strstr(r.body, "\"Keep-Alive\"") == NULL, "%s", r.body);
    cr_expect(strstr(r.body, "Proxy-Authorization") == NULL, "%s", r.body);
    cr_expect(strstr(r.body, "\"TE\"") == NULL, "%s", r.body);
    cr_expect(strstr(r.body, "\"Upgrade\"") == NULL, "%s", r.body);
    cr_expect(strstr(r.body, "X-Hop") == NULL, "%s", r.body);
    cr_expect(strstr(r.body, "Sluice-") == NULL, "%s", r.body);
    cr_expect(strstr(r.body, "[\"Idempotency-Key\",\"job-42\"]") != NULL, "%s", r.body);
    cr_expect(strstr(r.body, "[\"X-End-To-End\",\"kept\"]") != NULL, "%s", r.body);
    /* Configured headers replace the worker's and carry ${ENV} values. */
    cr_expect(strstr(r.body, "Bearer s3cret-token") != NULL, "%s", r.body);
    cr_expect(strstr(r.body, "worker-own") == NULL, "%s", r.body);
    cr_expect(strstr(r.body, "[\"X-Team\",\"grading\"]") != NULL, "%s", r.body);
    h_resp_free(&r);
}

Test(forwarding, response_hop_by_hop_dropped)
{
    struct h_resp r;
    char *v;

    cr_assert_eq(h_http(sl.port, "GET", "/v1/sync",
                        "X-Stub-Set-Header: Proxy-Authenticate: Basic\r\n"
                        "X-Stub-Set-Header: Keep-Alive: timeout=9\r\n"
                        "X-Stub-Set-Header: Upgrade: h2c\r\n"
                        "X-Stub-Set-Header: Trailer: X-Sum\r\n"
                        "X-Stub-Set-Header: X-Kept: yes\r\n",
                        NULL, 0, &r), 0);
    cr_assert_eq(r.status, 200);
    cr_expect_null(v = h_header(&r, "Proxy-Authenticate"));
    free(v);
    cr_expect_null(v = h_header(&r, "Keep-Alive"));
    free(v);
    cr_expect_null(v = h_header(&r, "Upgrade"));
    free(v);
    cr_expect_null(v = h_header(&r, "Trailer"));
    free(v);
    expect_header(&r, "X-Kept", "yes");
    h_resp_free(&r);
}

Test(forwarding, chunked_upstream_response)
{
    struct h_resp r;

    cr_assert_eq(h_http(sl.port, "POST", "/v1/sync", "X-Stub-Chunked: 1\r\n",
                        "chunky body", 11, &r), 0);
    cr_expect_eq(r.status, 200);
    cr_expect_eq(r.body_len, 11);
    cr_expect(memcmp(r.body, "chunky body", 11) == 0);
    h_resp_free(&r);
}

Test(forwarding, chunked_request_body)
{
    struct h_resp r;
    const char *req = "POST /v1/sync HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                      "Transfer-Encoding: chunked\r\n\r\n"
                      "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n";

    cr_assert_eq(h_http_raw(sl.port, req, strlen(req), &r), 0);
    cr_expect_eq(r.status, 200);
    cr_expect_eq(r.body_len, 11);
    cr_expect(memcmp(r.body, "hello world", 11) == 0, "%s", r.body);
    h_resp_free(&r);
}

/* ---- answers without a body (RFC 9112 6.3) -------------------------------- */

/* Sends req on one connection and reads every byte until the server closes
 * (5 s at most); *ms is how long that took. */
static char *exchange_bytes(const char *req, size_t *len, long *ms)
{
    size_t cap = 65536, got = 0;
    char *buf = malloc(cap);
    int fd = h_connect(sl.port);
    struct timespec a, b;

    cr_assert(buf);
    cr_assert_geq(fd, 0);
    clock_gettime(CLOCK_MONOTONIC, &a);
    cr_assert_eq(h_send_all(fd, req, strlen(req)), 0);
    for (;;) {
        struct pollfd p = {fd, POLLIN, 0};
        ssize_t n;

        if (got + 1 >= cap || poll(&p, 1, 5000) != 1 || (n = recv(fd, buf + got, cap - got - 1, 0)) <= 0)
            break;
        got += (size_t)n;
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    close(fd);
    buf[got] = '\0';
    *len = got;
    *ms = (b.tv_sec - a.tv_sec) * 1000 + (b.tv_nsec - a.tv_nsec) / 1000000;
    return buf;
}

/* The head of the first answer in raw (up to its empty line), as a string. */
static char *first_head(const char *raw, const char **after)
{
    const char *eoh = strstr(raw, "\r\n\r\n");

    cr_assert(eoh, "no whole head: %s", raw);
    *after = eoh + 4;
    return strndup(raw, (size_t)(eoh + 2 - raw));
}

/* A bodiless answer the upstream framed with a length, then a second request
 * on the same connection: the second answer's status line follows the
 * first head at once (no body, no last chunk, no wait for the length). */
static void expect_kept_alive(const char *method, const char *headers, int status,
                              const char *framing)
{
    char *req, *raw, *head;
    const char *after;
    size_t len;
    long ms;

    cr_assert(asprintf(&req, "%s /v1/sync/a HTTP/1.1\r\nHost: x\r\n%s\r\n"
                             "GET /v1/sync/next HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                       method, headers) > 0);
    raw = exchange_bytes(req, &len, &ms);
    head = first_head(raw, &after);
    cr_expect_eq(atoi(head + 9), status, "%s", head);
    if (framing)
        cr_expect(strstr(head, framing), "%s %d: %s", method, status, head);
    else
        cr_expect(!strcasestr(head, "Content-Length:"), "%s %d: %s", method, status, head);
    cr_expect(!strcasestr(head, "Transfer-Encoding:"), "%s %d: %s", method, status, head);
    cr_expect(strncmp(after, "HTTP/1.1 200 ", 13) == 0,
              "%s %d: the next answer must follow the head, got %.40s", method, status, after);
    cr_expect(strstr(after, "X-Stub-Target: /v1/sync/next"), "%.300s", after);
    cr_expect_lt(ms, 3000, "%s %d: answered at once, not after the upstream's timeout (%ld ms)",
                 method, status, ms);
    free(head);
    free(raw);
    free(req);
}

Test(forwarding, bodiless_answers_with_a_length_keep_the_connection)
{
    /* 304 and HEAD: the length a 200 would have, the upstream's own. */
    expect_kept_alive("GET", "X-Stub-Status: 304\r\nX-Stub-Set-Header: Content-Length: 5\r\n",
                      304, "\r\nContent-Length: 5\r\n");
    expect_kept_alive("HEAD", "X-Stub-Body-Size: 1234\r\n", 200, "\r\nContent-Length: 1234\r\n");
    /* A 204 has no framing header, whatever the upstream sent. */
    expect_kept_alive("GET", "X-Stub-Status: 204\r\nX-Stub-Set-Header: Content-Length: 5\r\n",
                      204, NULL);
    cr_expect_eq(h_stub_stat(&stub, "requests"), 6);
}

/* A HEAD or 304 the upstream framed with chunks or nothing: no length is
 * made up (a Content-Length: 0 would tell the worker the resource is
 * empty), nothing follows the head, and the connection ends there. */
Test(forwarding, bodiless_answers_without_a_length_end_at_the_head)
{
    static const struct { const char *method, *headers; int status; } c[] = {
        {"GET", "X-Stub-Status: 304\r\n", 304},
        {"HEAD", "X-Stub-Chunked: 1\r\n", 200},
        {"GET", "X-Stub-Status: 304\r\nX-Stub-Set-Header: Transfer-Encoding: chunked\r\n", 304},
    };

    for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
        char *req, *raw, *head;
        const char *after;
        size_t len;
        long ms;

        cr_assert(asprintf(&req, "%s /v1/sync/a HTTP/1.1\r\nHost: x\r\n%s\r\n",
                           c[i].method, c[i].headers) > 0);
        raw = exchange_bytes(req, &len, &ms);
        head = first_head(raw, &after);
        cr_expect_eq(atoi(head + 9), c[i].status, "case %zu: %s", i, head);
        cr_expect(!strcasestr(head, "Content-Length:"), "case %zu: %s", i, head);
        cr_expect(!strcasestr(head, "Transfer-Encoding:"), "case %zu: %s", i, head);
        cr_expect(strstr(head, "\r\nConnection: close\r\n"), "case %zu: %s", i, head);
        cr_expect_eq(strlen(after), 0, "case %zu: %zu bytes after the head: %s", i,
                     strlen(after), after);
        cr_expect_lt(ms, 3000, "case %zu: %ld ms", i, ms);
        free(head);
        free(raw);
        free(req);
    }
}

Test(forwarding, keep_alive_from_worker)
{
    /* Two requests on one connection, then close: both answered. */
    const char *req = "GET /v1/sync?a HTTP/1.1\r\nHost: x\r\n\r\n"
                      "GET /v1/sync?b HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    struct h_resp r;

    cr_assert_eq(h_http_raw(sl.port, req, strlen(req), &r), 0);
    cr_expect_eq(r.status, 200);
    /* The raw reader parses the first response; the second follows in the body. */
    cr_expect(strstr(r.body, "X-Stub-Target: /v1/sync?b") != NULL, "%s", r.body);
    h_resp_free(&r);
}

Test(forwarding, access_log_line)
{
    struct h_resp r;

    cr_assert_eq(h_http(sl.port, "POST", "/v1/sync/secret-id?token=abc",
                        "Idempotency-Key: my-very-secret-key\r\n", "x", 1, &r), 0);
    h_resp_free(&r);
    /* The log line is written when the exchange completes. */
    for (int i = 0; i < 100 && !h_file_contains(sl.log_path, "\"path\":\"/v1/sync/secret-id\""); i++)
        usleep(10000);
    cr_expect(h_file_contains(sl.log_path, "\"type\":\"access\""));
    cr_expect(h_file_contains(sl.log_path, "\"route\":\"sync\""));
    cr_expect(h_file_contains(sl.log_path, "\"path\":\"/v1/sync/secret-id\""));
    cr_expect(h_file_contains(sl.log_path, "\"outcome\":\"ok\""));
    cr_expect(h_file_contains(sl.log_path, "\"key_hash\":\""));
    cr_expect(!h_file_contains(sl.log_path, "my-very-secret-key"));
    cr_expect(!h_file_contains(sl.log_path, "token=abc"));
}

/* ---- request ids ---------------------------------------------------------- */

static bool is_hex32(const char *s)
{
    return s && strlen(s) == 32 && strspn(s, "0123456789abcdef") == 32;
}

/* X-Request-Id: the worker's is forwarded once and echoed; without one (or
 * with one unfit for a header or a log line) sluice makes one, sends it on
 * and echoes it; tracing headers pass untouched; the access log has it. */
Test(forwarding, request_ids_forwarded_made_echoed_and_logged)
{
    struct h_resp r;
    char *id, want[128];

    cr_assert_eq(h_http(sl.port, "GET", "/v1/sync",
                        "X-Stub-Echo: json\r\nX-Request-Id: job-7-attempt-2\r\n"
                        "traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\n",
                        NULL, 0, &r), 0);
    expect_header(&r, "X-Request-Id", "job-7-attempt-2");
    cr_expect(strstr(r.body, "[\"X-Request-Id\",\"job-7-attempt-2\"]") != NULL, "%s", r.body);
    cr_expect(strstr(strstr(r.body, "X-Request-Id") + 1, "X-Request-Id") == NULL,
              "sent once: %s", r.body);
    cr_expect(strstr(r.body, "[\"traceparent\",\"00-0af7651916cd43dd8448eb211c80319c-"
                             "b7ad6b7169203331-01\"]") != NULL, "%s", r.body);
    h_resp_free(&r);

    cr_assert_eq(h_http(sl.port, "GET", "/v1/sync", "X-Stub-Echo: json\r\n", NULL, 0, &r), 0);
    id = h_header(&r, "X-Request-Id");
    cr_expect(is_hex32(id), "made: %s", id ? id : "(none)");
    snprintf(want, sizeof want, "[\"X-Request-Id\",\"%s\"]", id ? id : "");
    cr_expect(id && strstr(r.body, want) != NULL, "sent on: %s", r.body);
    free(id);
    h_resp_free(&r);

    cr_assert_eq(h_http(sl.port, "GET", "/v1/sync", "X-Request-Id: has\x01control\r\n", NULL, 0,
                        &r), 0);
    id = h_header(&r, "X-Request-Id");
    cr_expect(is_hex32(id), "an unfit id is replaced: %s", id ? id : "(none)");
    free(id);
    h_resp_free(&r);

    /* Rejections carry it too. */
    cr_assert_eq(h_http(sl.port, "GET", "/v1/syncx", "X-Request-Id: lost-route\r\n", NULL, 0,
                        &r), 0);
    cr_expect_eq(r.status, 404);
    expect_header(&r, "X-Request-Id", "lost-route");
    h_resp_free(&r);
    for (int i = 0; i < 100 && !h_file_contains(sl.log_path, "\"request_id\":\"lost-route\""); i++)
        usleep(10 * 1000);
    cr_expect(h_file_contains(sl.log_path, "\"request_id\":\"job-7-attempt-2\""));
    cr_expect(h_file_contains(sl.log_path, "\"request_id\":\"lost-route\""));
}
