/* Strict HTTP/1.1 on the worker side: malformed heads are refused with a
 * problem+json 400 and the connection closed, nothing reaching the upstream;
 * routes match the normalised path; a head that trickles in gets 408. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
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

    cr_assert_eq(h_stub_start(&stub, NULL), 0);
    cr_assert(asprintf(&cfg,
        "limits: {header_timeout: 2s}\n"
        "upstreams: {stub: {url: http://127.0.0.1:%d}}\n"
        "policies: {keyed: {idempotency: {required: true}}}\n"
        "routes:\n"
        "  - {prefix: /v1/sync, upstream: stub, policy: keyed}\n"
        "  - {prefix: /v1, upstream: stub}\n",
        stub.port) > 0);
    cr_assert_eq(h_sluice_start(&sl, cfg), 0);
    free(cfg);
}

static void stop(void)
{
    h_sluice_cleanup(&sl);
    h_stub_stop(&stub);
}

TestSuite(malformed, .init = start, .fini = stop, .timeout = 60);

/* h_http_raw reads until the server closes: a response that came back at
 * all was followed by a close (or the 10 s read limit, which the elapsed
 * time shows). */
static void send_raw(const char *req, size_t len, struct h_resp *r, long *ms)
{
    struct timespec a, b;

    clock_gettime(CLOCK_MONOTONIC, &a);
    cr_assert_eq(h_http_raw(sl.port, req, len, r), 0, "no HTTP response at all");
    clock_gettime(CLOCK_MONOTONIC, &b);
    *ms = (b.tv_sec - a.tv_sec) * 1000 + (b.tv_nsec - a.tv_nsec) / 1000000;
}

static void expect_problem(const struct h_resp *r, int status, long ms)
{
    char *o = h_header(r, "Sluice-Outcome"), *ct = h_header(r, "Content-Type");
    char *conn = h_header(r, "Connection");

    cr_expect_eq(r->status, status, "status %d, want %d", r->status, status);
    cr_expect(o && strcmp(o, "rejected") == 0, "outcome %s", o ? o : "(none)");
    cr_expect(ct && strcmp(ct, "application/problem+json") == 0, "type %s", ct ? ct : "");
    cr_expect(conn && strcmp(conn, "close") == 0, "Connection %s", conn ? conn : "(none)");
    cr_expect(r->body && strstr(r->body, "\"status\":") && strstr(r->body, "\"reason\":"),
              "body %s", r->body ? r->body : "");
    cr_expect_lt(ms, 5000, "the connection was closed after the answer (%ld ms)", ms);
    free(o);
    free(ct);
    free(conn);
}

/* One malformed request: a problem 400, a close, and the stub saw nothing. */
static void expect_refused_n(const char *req, size_t len)
{
    struct h_resp r;
    long ms;

    send_raw(req, len, &r, &ms);
    expect_problem(&r, 400, ms);
    cr_expect(strstr(r.body, "malformed_request"), "body %s", r.body);
    h_resp_free(&r);
    cr_expect_eq(h_stub_stat(&stub, "requests"), 0, "nothing reaches the upstream");
}

static void expect_refused(const char *req)
{
    expect_refused_n(req, strlen(req));
}

Test(malformed, whitespace_before_the_colon)
{
    expect_refused("POST /v1/x HTTP/1.1\r\nHost: x\r\nContent-Length : 0\r\n\r\n");
}

Test(malformed, header_name_not_a_token)
{
    expect_refused("GET /v1/x HTTP/1.1\r\nHost: x\r\nBad Name: v\r\n\r\n");
}

Test(malformed, obsolete_line_folding)
{
    struct h_resp r;
    long ms;
    const char *req = "GET /v1/x HTTP/1.1\r\nHost: x\r\nX-Fold: a\r\n Content-Length: 5\r\n\r\n";

    expect_refused(req);
    send_raw(req, strlen(req), &r, &ms);
    cr_expect(strstr(r.body, "folding"), "body %s", r.body);
    h_resp_free(&r);
}

Test(malformed, nul_in_a_header_value)
{
    static const char req[] = "GET /v1/x HTTP/1.1\r\nHost: x\r\nX-A: ab\0cd\r\n\r\n";

    expect_refused_n(req, sizeof req - 1);
}

Test(malformed, cr_in_a_header_value)
{
    expect_refused("GET /v1/x HTTP/1.1\r\nHost: x\r\nX-A: a\rb\r\n\r\n");
}

Test(malformed, method_not_a_token)
{
    expect_refused("G(T /v1/x HTTP/1.1\r\nHost: x\r\n\r\n");
}

Test(malformed, nul_in_the_method_or_target)
{
    static const char m[] = "G\0T /v1/x HTTP/1.1\r\nHost: x\r\n\r\n";
    static const char t[] = "GET /v1/x\0y HTTP/1.1\r\nHost: x\r\n\r\n";

    expect_refused_n(m, sizeof m - 1);
    expect_refused_n(t, sizeof t - 1);
}

Test(malformed, target_neither_origin_nor_absolute_form)
{
    expect_refused("GET v1/x HTTP/1.1\r\nHost: x\r\n\r\n");
    expect_refused("OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n");
    expect_refused("GET /v1/a b HTTP/1.1\r\nHost: x\r\n\r\n");
}

Test(malformed, request_line_with_extra_spaces)
{
    expect_refused("GET  /v1/x HTTP/1.1\r\nHost: x\r\n\r\n");
}

Test(malformed, missing_or_double_host)
{
    expect_refused("GET /v1/x HTTP/1.1\r\n\r\n");
    expect_refused("GET /v1/x HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n");
}

Test(malformed, framing_conflicts)
{
    expect_refused("POST /v1/x HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                   "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n");
    expect_refused("POST /v1/x HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                   "Content-Length: 6\r\n\r\nhello!");
}

/* Fields sluice reads one value of: with two, sluice would key, count or
 * time the request by the first while the partner gets both. */
Test(malformed, repeated_single_value_fields)
{
    expect_refused("POST /v1/sync/a HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k1\r\n"
                   "Idempotency-Key: k2\r\nContent-Length: 1\r\n\r\nx");
    expect_refused("POST /v1/sync/a HTTP/1.1\r\nHost: x\r\nidempotency-key: k1\r\n"
                   "Idempotency-Key: k1\r\nContent-Length: 1\r\n\r\nx");
    expect_refused("POST /v1/x HTTP/1.1\r\nHost: x\r\nSluice-Attempt: 1\r\n"
                   "Sluice-Attempt: 2\r\nContent-Length: 1\r\n\r\nx");
    expect_refused("POST /v1/x HTTP/1.1\r\nHost: x\r\nSluice-Enqueued-At: 1700000000\r\n"
                   "Sluice-Enqueued-At: 1700000001\r\nContent-Length: 1\r\n\r\nx");
    expect_refused("POST /v1/x HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n"
                   "Content-Length: 1\r\n\r\nx");
}

/* The second key is never keyed on, nor replayed from the first's record. */
Test(malformed, a_second_key_does_not_reach_a_record)
{
    struct h_resp r;

    cr_assert_eq(h_http(sl.port, "POST", "/v1/sync/a", "Idempotency-Key: k1\r\n", "x", 1, &r), 0);
    cr_expect_eq(r.status, 200);
    h_resp_free(&r);
    cr_assert_eq(h_http(sl.port, "POST", "/v1/sync/a",
                        "Idempotency-Key: k1\r\nIdempotency-Key: k3\r\n", "x", 1, &r), 0);
    cr_expect_eq(r.status, 400, "two keys: %d", r.status);
    cr_expect(r.body && strstr(r.body, "more than one Idempotency-Key"), "%s",
              r.body ? r.body : "");
    h_resp_free(&r);
    cr_expect_eq(h_stub_stat(&stub, "requests"), 1);
}

/* RFC 9112 6.1: HTTP/1.0 has no chunked coding. */
Test(malformed, transfer_encoding_in_http_1_0)
{
    expect_refused("POST /v1/x HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"
                   "5\r\nhello\r\n0\r\n\r\n");
}

/* Chunk extensions are `;name[=value]`, names and values tokens (values
 * also quoted strings): control characters and empty names are refused,
 * before anything is forwarded. */
Test(malformed, malformed_chunk_extensions)
{
    expect_refused("POST /v1/x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                   "5;\x01\x02\r\nhello\r\n0\r\n\r\n");
    expect_refused("POST /v1/x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                   "5;;;=\r\nhello\r\n0\r\n\r\n");
    expect_refused("POST /v1/x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                   "5\r\nhello\r\n3;a b\r\nabc\r\n0\r\n\r\n");
}

/* Sends raw in pieces of step bytes, 20 ms apart, and reads the answer. */
static void send_in_pieces(const char *raw, size_t step, char *out, size_t cap)
{
    size_t len = strlen(raw), got = 0;
    int fd = h_connect(sl.port), one = 1;

    cr_assert_geq(fd, 0);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    for (size_t at = 0; at < len; at += step) {
        cr_assert_eq(h_send_all(fd, raw + at, len - at < step ? len - at : step), 0);
        usleep(20 * 1000);
    }
    for (;;) {
        struct pollfd p = {fd, POLLIN, 0};
        ssize_t n;

        if (got + 1 >= cap || poll(&p, 1, 5000) != 1 || (n = recv(fd, out + got, cap - 1 - got, 0)) <= 0)
            break;
        got += (size_t)n;
    }
    out[got] = '\0';
    close(fd);
}

/* Well-formed extensions pass, whatever reads the body arrives in (the
 * check follows the chunk lines from one read to the next). */
Test(malformed, well_formed_chunk_extensions_pass)
{
    static const char req[] =
        "POST /v1/x HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n"
        "5;a=b;c=\"x \\\" y\"\r\nhello\r\n6;k = v\r\n world\r\n1;t\r\n!\r\n0\r\n\r\n";
    static const size_t steps[] = {sizeof req, 2, 3, 7, 16};
    char out[8192];

    for (size_t i = 0; i < sizeof steps / sizeof *steps; i++) {
        send_in_pieces(req, steps[i], out, sizeof out);
        cr_expect(strncmp(out, "HTTP/1.1 200 ", 13) == 0, "reads of %zu: %.300s", steps[i], out);
        cr_expect(strstr(out, "\r\n\r\nhello world!"), "reads of %zu: %.300s", steps[i], out);
    }
}

/* A bad extension in a later read than the head and the chunks before it. */
Test(malformed, a_bad_chunk_extension_in_a_later_read)
{
    static const char req[] =
        "POST /v1/x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        "5;ok=1\r\nhello\r\n3;\x7f\r\nabc\r\n0\r\n\r\n";
    char out[8192];

    send_in_pieces(req, 70, out, sizeof out);
    cr_expect(strncmp(out, "HTTP/1.1 400 ", 13) == 0, "%.300s", out);
    cr_expect(strstr(out, "Sluice-Outcome: rejected\r\n") && strstr(out, "chunk extension"),
              "%.400s", out);
    cr_expect_eq(h_stub_stat(&stub, "requests"), 0, "nothing reaches the upstream");
}

/* The answer is the only bytes before the close: a second answer (or
 * anything else) after it would make the body longer than announced. */
static void expect_one_answer(const struct h_resp *r)
{
    char *cl = h_header(r, "Content-Length");

    cr_expect(cl && strtoull(cl, NULL, 10) == r->body_len,
              "%zu bytes before the close for a Content-Length of %s: %.200s",
              r->body_len, cl ? cl : "(none)", r->body ? r->body : "");
    free(cl);
}

/* libmicrohttpd 0.9.75 parses Content-Length itself before any callback,
 * queues an HTML answer of its own and then writes its head twice; sluice
 * answers first, with its problem, and MHD's never goes out. */
Test(malformed, a_content_length_the_server_library_cannot_read)
{
    static const struct { const char *cl; int status; const char *reason; } c[] = {
        {"+5", 400, "malformed_request"},
        {"5x", 400, "malformed_request"},
        {"99999999999999999999999", 413, "body_too_large"},
    };

    for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
        char *req;
        struct h_resp r;
        long ms;

        cr_assert(asprintf(&req, "POST /v1/x HTTP/1.1\r\nHost: x\r\n"
                                 "Content-Length: %s\r\n\r\nhello", c[i].cl) > 0);
        send_raw(req, strlen(req), &r, &ms);
        expect_problem(&r, c[i].status, ms);
        cr_expect(strstr(r.body, c[i].reason), "case %zu: %s", i, r.body);
        expect_one_answer(&r);
        h_resp_free(&r);
        free(req);
    }
    cr_expect_eq(h_stub_stat(&stub, "requests"), 0);
}

/* Request lines libmicrohttpd cannot split at all ("GARBAGE", "GET") it
 * closes before any callback, without a word: sluice answers them 400. */
Test(malformed, unsplittable_request_lines_get_400)
{
    expect_refused("GARBAGE\r\n\r\n");
    expect_refused("GET\r\n\r\n");
    expect_refused(" /v1/x HTTP/1.1\r\nHost: x\r\n\r\n");
}

/* Requests libmicrohttpd refuses while parsing, before any callback of
 * sluice's for that part: it was about to answer with an HTML page of its
 * own, without Sluice-Outcome; sluice answers first, with its problem. */
static const char *const library_refusals[] = {
    "GET /v1/x HTTP/1.1\r\nHost: x\r\nBadLine\r\n\r\n",            /* no colon */
    "GET /v1/x http/1.1\r\nHost: x\r\n\r\n",                        /* lowercase version */
    "GET /v1/x\r\nHost: x\r\n\r\n",                                 /* no version */
    "POST /v1/x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    "-5\r\nhello\r\n0\r\n\r\n",                                      /* negative chunk size */
    "POST /v1/x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    "5\r\nhello\r0\r\n\r\n",                                          /* bare CR after the data */
};

Test(malformed, what_the_server_library_refuses_gets_a_problem)
{
    for (size_t i = 0; i < sizeof library_refusals / sizeof *library_refusals; i++) {
        struct h_resp r;
        long ms;

        send_raw(library_refusals[i], strlen(library_refusals[i]), &r, &ms);
        expect_problem(&r, 400, ms);
        cr_expect(strstr(r.body, "malformed_request"), "case %zu: %s", i, r.body);
        expect_one_answer(&r);
        h_resp_free(&r);
    }
    cr_expect_eq(h_stub_stat(&stub, "requests"), 0, "nothing reaches the upstream");
}

/* A version the library does not serve: its 505, as sluice's problem. */
Test(malformed, an_unsupported_version_gets_a_problem_505)
{
    struct h_resp r;
    long ms;
    const char *req = "GET /v1/x HTTP/2.0\r\nHost: x\r\n\r\n";

    send_raw(req, strlen(req), &r, &ms);
    expect_problem(&r, 505, ms);
    expect_one_answer(&r);
    h_resp_free(&r);
}

/* The chunk line that breaks arrives in a later read than the head. */
Test(malformed, a_chunk_line_broken_in_a_later_read_gets_a_problem)
{
    static const char head[] = "POST /v1/x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                               "5\r\nhello";
    static const char rest[] = "\r0\r\n\r\n";
    char buf[4096] = {0};
    size_t got = 0;
    int fd = h_connect(sl.port);

    cr_assert_geq(fd, 0);
    cr_assert_eq(h_send_all(fd, head, sizeof head - 1), 0);
    usleep(150 * 1000);
    cr_assert_eq(h_send_all(fd, rest, sizeof rest - 1), 0);
    for (;;) {
        struct pollfd p = {fd, POLLIN, 0};
        ssize_t n;

        if (poll(&p, 1, 5000) != 1 || (n = recv(fd, buf + got, sizeof buf - 1 - got, 0)) <= 0)
            break;
        got += (size_t)n;
    }
    close(fd);
    cr_expect(strncmp(buf, "HTTP/1.1 400 ", 13) == 0, "%s", buf);
    cr_expect(strstr(buf, "Sluice-Outcome: rejected\r\n"), "%s", buf);
    cr_expect(strstr(buf, "application/problem+json"), "%s", buf);
    cr_expect_eq(h_stub_stat(&stub, "requests"), 0);
}

/* Reads one answer of a kept-alive connection: up to the head's end plus
 * Content-Length bytes (the answers here have one). */
static int read_answer(int fd, char *buf, size_t cap)
{
    size_t got = 0;
    const char *eoh, *cl;

    for (;;) {
        struct pollfd p = {fd, POLLIN, 0};
        ssize_t n;

        buf[got] = '\0';
        if ((eoh = strstr(buf, "\r\n\r\n")) && (cl = strcasestr(buf, "Content-Length:")) &&
            got >= (size_t)(eoh + 4 - buf) + strtoull(cl + 15, NULL, 10))
            return 0;
        if (got + 1 >= cap || poll(&p, 1, 5000) != 1 || (n = recv(fd, buf + got, cap - got - 1, 0)) <= 0)
            return -1;
        got += (size_t)n;
    }
}

/* On a connection kept alive after an answer, a request line without a
 * target gets 400 too (the count of open requests, not the accept, tells
 * that MHD refused a line). */
Test(malformed, an_unsplittable_line_after_a_kept_alive_request_gets_400)
{
    static const char ok[] = "GET /v1/x HTTP/1.1\r\nHost: x\r\n\r\n";
    static const char bad[] = "GARBAGE\r\n\r\n";
    char buf[8192];
    int fd = h_connect(sl.port);

    cr_assert_geq(fd, 0);
    cr_assert_eq(send(fd, ok, sizeof ok - 1, 0), (ssize_t)(sizeof ok - 1));
    cr_assert_eq(read_answer(fd, buf, sizeof buf), 0, "no answer to the first request");
    cr_expect(strncmp(buf, "HTTP/1.1 200", 12) == 0, "%.60s", buf);
    usleep(100 * 1000); /* the bad line in a later read than the answer */
    cr_assert_eq(send(fd, bad, sizeof bad - 1, 0), (ssize_t)(sizeof bad - 1));
    memset(buf, 0, sizeof buf);
    cr_assert_eq(read_answer(fd, buf, sizeof buf), 0, "no answer to the bad line");
    cr_expect(strncmp(buf, "HTTP/1.1 400", 12) == 0, "%.60s", buf);
    cr_expect(strstr(buf, "malformed_request"), "%s", buf);
    close(fd);
    cr_expect_eq(h_stub_stat(&stub, "requests"), 1);
}

/* Other workers' connections are open and idle, kept alive after an
 * answer: the refusal still goes to the connection that sent the bad bytes
 * (it is the one that just had input), never to an idle one, and those
 * serve on. A bad line on a kept-alive connection is answered too. */
Test(malformed, refusals_reach_the_right_one_of_several_connections)
{
    static const char ok[] = "GET /v1/x HTTP/1.1\r\nHost: x\r\n\r\n";
    static const char bad_version[] = "GET /v1/x http/1.1\r\nHost: x\r\n\r\n";
    enum { IDLE = 4 };
    int idle[IDLE];
    char buf[8192];

    for (int i = 0; i < IDLE; i++) {
        idle[i] = h_connect(sl.port);
        cr_assert_geq(idle[i], 0);
        cr_assert_eq(h_send_all(idle[i], ok, sizeof ok - 1), 0);
        cr_assert_eq(read_answer(idle[i], buf, sizeof buf), 0, "no answer on connection %d", i);
    }
    usleep(50 * 1000); /* idle for longer than "just had input" */
    for (size_t i = 0; i < sizeof library_refusals / sizeof *library_refusals; i++) {
        struct h_resp r;
        long ms;

        send_raw(library_refusals[i], strlen(library_refusals[i]), &r, &ms);
        expect_problem(&r, 400, ms);
        h_resp_free(&r);
    }
    cr_assert_eq(h_send_all(idle[0], bad_version, sizeof bad_version - 1), 0);
    memset(buf, 0, sizeof buf);
    cr_expect_eq(read_answer(idle[0], buf, sizeof buf), 0, "no answer on the kept-alive one");
    cr_expect(strncmp(buf, "HTTP/1.1 400", 12) == 0 && strstr(buf, "Sluice-Outcome: rejected"),
              "%.300s", buf);
    for (int i = 1; i < IDLE; i++) {
        memset(buf, 0, sizeof buf);
        cr_assert_eq(h_send_all(idle[i], ok, sizeof ok - 1), 0);
        cr_expect_eq(read_answer(idle[i], buf, sizeof buf), 0, "connection %d is gone", i);
        cr_expect(strncmp(buf, "HTTP/1.1 200", 12) == 0, "connection %d: %.60s", i, buf);
    }
    for (int i = 0; i < IDLE; i++)
        close(idle[i]);
    cr_expect_eq(h_stub_stat(&stub, "requests"), 2 * IDLE - 1);
}

/* The answers that end a connection are the only thing on it: neither a
 * closing answer of ours nor MHD's own error answer (505 to an unknown
 * version) is followed by the 400 for refused lines. */
Test(malformed, an_answer_that_closes_is_the_last_thing_sent)
{
    static const char *const reqs[] = {
        "GET /v1/x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        "GET /v1/x HTTP/1.0\r\n\r\n",
        "GET /v1/x HTTP/9.9\r\nHost: x\r\n\r\n",
    };
    static const int want[] = {200, 200, 505};

    for (size_t i = 0; i < sizeof reqs / sizeof *reqs; i++) {
        struct h_resp r;

        cr_assert_eq(h_http_raw(sl.port, reqs[i], strlen(reqs[i]), &r), 0, "case %zu", i);
        cr_expect_eq(r.status, want[i], "case %zu: %d", i, r.status);
        expect_one_answer(&r);
        h_resp_free(&r);
    }
}

/* ---- path normalisation ------------------------------------------------- */

static void expect_keyed_route(const char *target)
{
    struct h_resp r;

    cr_assert_eq(h_http(sl.port, "POST", target, NULL, "x", 1, &r), 0);
    cr_expect_eq(r.status, 400, "%s: %d, want the keyed route's 400", target, r.status);
    cr_expect(r.body && strstr(r.body, "dempotency"), "%s: body %s", target,
              r.body ? r.body : "");
    h_resp_free(&r);
}

Test(malformed, normalised_paths_reach_the_keyed_route)
{
    expect_keyed_route("/v1/x/../sync/a");
    expect_keyed_route("/v1/./sync/a");
    expect_keyed_route("/v1/%73ync/a");
    expect_keyed_route("/v1/%53ync/../%73ync/a");
    cr_expect_eq(h_stub_stat(&stub, "requests"), 0);
}

Test(malformed, the_normalised_path_is_forwarded)
{
    struct h_resp r;
    char *t;

    cr_assert_eq(h_http(sl.port, "POST", "/v1/x/../%73ync/./a?q=/../%2e", "Idempotency-Key: k1\r\n",
                        "x", 1, &r), 0);
    cr_expect_eq(r.status, 200);
    t = h_header(&r, "X-Stub-Target");
    cr_expect(t && strcmp(t, "/v1/sync/a?q=/../%2e") == 0, "forwarded %s", t ? t : "");
    free(t);
    h_resp_free(&r);
    cr_assert_eq(h_http(sl.port, "GET", "/v1/a%2Fb", NULL, NULL, 0, &r), 0);
    t = h_header(&r, "X-Stub-Target");
    cr_expect(t && strcmp(t, "/v1/a%2Fb") == 0, "reserved escapes stay: %s", t ? t : "");
    free(t);
    h_resp_free(&r);
}

Test(malformed, climbing_above_the_root_is_400)
{
    expect_refused("GET /v1/%2e%2e/../x HTTP/1.1\r\nHost: x\r\n\r\n");
    expect_refused("GET /../v1/x HTTP/1.1\r\nHost: x\r\n\r\n");
    expect_refused("GET http://h/v1/../../x HTTP/1.1\r\nHost: x\r\n\r\n");
}

/* ---- header timeout ----------------------------------------------------- */

/* Sends head one byte a second (each byte would restart an idle timeout)
 * and collects what comes back until the server closes; *ms is when. */
static size_t trickle(const char *head, char *out, size_t cap, long *ms)
{
    int fd = h_connect(sl.port);
    size_t got = 0;
    struct timespec a, b;
    bool closed = false;

    cr_assert_geq(fd, 0);
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (size_t i = 0; head[i] && !closed && i < 10; i++) {
        struct pollfd p = {fd, POLLIN, 0};
        if (send(fd, head + i, 1, MSG_NOSIGNAL) != 1)
            break;
        while (!closed && poll(&p, 1, 1000) == 1) {
            ssize_t n = recv(fd, out + got, cap - 1 - got, 0);
            if (n <= 0)
                closed = true;
            else
                got += (size_t)n;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    *ms = (b.tv_sec - a.tv_sec) * 1000 + (b.tv_nsec - a.tv_nsec) / 1000000;
    out[got] = '\0';
    close(fd);
    cr_expect(closed, "the connection was closed");
    return got;
}

Test(malformed, a_trickled_head_gets_408)
{
    char out[4096];
    long ms;

    trickle("GET /v1/x HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaa", out, sizeof out, &ms);
    cr_expect(strncmp(out, "HTTP/1.1 408 ", 13) == 0, "got %s", out);
    cr_expect(strstr(out, "Sluice-Outcome: rejected\r\n"), "got %s", out);
    cr_expect(strstr(out, "application/problem+json"), "got %s", out);
    cr_expect(strstr(out, "\"status\":408"), "got %s", out);
    cr_expect_geq(ms, 1500, "not before header_timeout (%ld ms)", ms);
    cr_expect_leq(ms, 4500, "soon after header_timeout (%ld ms)", ms);
    cr_expect_eq(h_stub_stat(&stub, "requests"), 0);
}

Test(malformed, a_trickled_request_line_gets_408)
{
    char out[4096];
    long ms;

    trickle("GET /v1/x HTTP/1.1\r\n", out, sizeof out, &ms);
    cr_expect(strncmp(out, "HTTP/1.1 408 ", 13) == 0, "got %s", out);
    cr_expect_leq(ms, 4500, "%ld ms", ms);
    cr_expect_eq(h_stub_stat(&stub, "requests"), 0);
}

Test(malformed, the_server_serves_on_after_refusals)
{
    struct h_resp r;

    expect_refused("G(T /v1/x HTTP/1.1\r\nHost: x\r\n\r\n");
    cr_assert_eq(h_http(sl.port, "GET", "/v1/alive", NULL, NULL, 0, &r), 0);
    cr_expect_eq(r.status, 200);
    h_resp_free(&r);
}
