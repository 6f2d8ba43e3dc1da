/* Response bodies stream: a body of any size passes with memory bounded per
 * connection, the worker sees the first bytes before the upstream sends the
 * last, a body cut short stays visibly short, and a keyed answer is
 * committed before the worker sees it (whole when it fits max_stored_body,
 * status and headers only when not). Also the orderings around an answer:
 * a retry made at once never meets its own claim, and the upstream's
 * response is counted before the worker has the answer. Upstreams: the stub,
 * and a raw socket server in this file for answers the stub cannot give. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "integration/harness.h"
#include "support/testutil.h"

static struct h_stub stub;
static struct h_sluice sl;

/* ---- a raw upstream --------------------------------------------------- */

enum raw_mode { RAW_SLOW, RAW_TRUNCATED, RAW_101, RAW_ENDLESS, RAW_CANNED };

static struct {
    int lfd, port;
    pthread_t tid;
    atomic_int stop;
    enum raw_mode mode;
    atomic_int gate;          /* RAW_SLOW: the test lets the rest go */
    atomic_int peer_gone;     /* RAW_ENDLESS: a send failed: sluice let go */
    const char *canned;       /* RAW_CANNED: the whole answer, as is */
} raw;

static long ms_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void read_head(int fd)
{
    char buf[8192];
    size_t got = 0;

    while (got < sizeof buf - 1) {
        ssize_t n = recv(fd, buf + got, sizeof buf - 1 - got, 0);
        if (n <= 0)
            return;
        got += (size_t)n;
        buf[got] = '\0';
        if (strstr(buf, "\r\n\r\n"))
            return;
    }
}

static void send_str(int fd, const char *s)
{
    h_send_all(fd, s, strlen(s));
}

/* A body longer than what sluice holds before answering: the first 70,000
 * bytes, then nothing until the test opens the gate, then the rest. */
#define SLOW_FIRST 70000
#define SLOW_REST 30000

static void serve_slow(int fd)
{
    static char chunk[SLOW_FIRST];
    long deadline = ms_now() + 5000;

    memset(chunk, 'h', sizeof chunk);
    send_str(fd, "HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n");
    h_send_all(fd, chunk, SLOW_FIRST);
    while (!atomic_load(&raw.gate) && ms_now() < deadline)
        usleep(5000);
    memset(chunk, 'w', SLOW_REST);
    h_send_all(fd, chunk, SLOW_REST);
}

static void serve_truncated(int fd)
{
    static char chunk[100000];

    memset(chunk, 'a', sizeof chunk);
    send_str(fd, "HTTP/1.1 200 OK\r\nContent-Length: 300000\r\n\r\n");
    h_send_all(fd, chunk, sizeof chunk);
    usleep(100000);
}

static void serve_101(int fd)
{
    send_str(fd, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n"
                 "Upgrade: websocket\r\n\r\n");
    usleep(300000);
}

/* Sends until sluice stops reading and closes (at most 5 s). */
static void serve_endless(int fd)
{
    static char chunk[65536];
    long deadline = ms_now() + 5000;

    memset(chunk, 'e', sizeof chunk);
    send_str(fd, "HTTP/1.1 200 OK\r\nContent-Length: 1073741824\r\n\r\n");
    while (ms_now() < deadline) {
        struct pollfd p = {fd, POLLOUT, 0};
        if (poll(&p, 1, 100) <= 0)
            continue;
        if (send(fd, chunk, sizeof chunk, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 &&
            errno != EAGAIN) {
            atomic_store(&raw.peer_gone, 1);
            return;
        }
    }
}

static void *raw_main(void *arg)
{
    while (!atomic_load(&raw.stop)) {
        struct pollfd p = {raw.lfd, POLLIN, 0};
        int fd;

        if (poll(&p, 1, 100) <= 0)
            continue;
        fd = accept(raw.lfd, NULL, NULL);
        if (fd < 0)
            continue;
        read_head(fd);
        switch (raw.mode) {
        case RAW_SLOW: serve_slow(fd); break;
        case RAW_TRUNCATED: serve_truncated(fd); break;
        case RAW_101: serve_101(fd); break;
        case RAW_ENDLESS: serve_endless(fd); break;
        case RAW_CANNED: send_str(fd, raw.canned); usleep(100000); break;
        }
        close(fd);
    }
    return NULL;
}

static void raw_start(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET};
    socklen_t len = sizeof a;

    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    raw.lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert(raw.lfd >= 0);
    cr_assert_eq(bind(raw.lfd, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(listen(raw.lfd, 16), 0);
    cr_assert_eq(getsockname(raw.lfd, (struct sockaddr *)&a, &len), 0);
    raw.port = ntohs(a.sin_port);
    atomic_store(&raw.stop, 0);
    cr_assert_eq(pthread_create(&raw.tid, NULL, raw_main, NULL), 0);
}

static void raw_stop(void)
{
    atomic_store(&raw.stop, 1);
    pthread_join(raw.tid, NULL);
    close(raw.lfd);
}

/* ---- set-up ------------------------------------------------------------ */

static void start(void)
{
    char *cfg;

    cr_assert_eq(h_stub_start(&stub, NULL), 0);
    raw_start();
    cr_assert(asprintf(&cfg,
        "threads: 1\n"
        "upstreams:\n"
        "  stub: {url: http://127.0.0.1:%d, timeout: 20s}\n"
        "  raw: {url: http://127.0.0.1:%d, timeout: 10s, max_connections: 1}\n"
        "policies:\n"
        "  keyed:\n"
        "    idempotency: {max_stored_body: 4KiB, lease: 30s}\n"
        "routes:\n"
        "  - {prefix: /keyed, upstream: stub, policy: keyed}\n"
        "  - {prefix: /raw, upstream: raw}\n"
        "  - {prefix: /, upstream: stub}\n",
        stub.port, raw.port) > 0);
    cr_assert_eq(h_sluice_start(&sl, cfg), 0);
    free(cfg);
}

static void stop(void)
{
    h_sluice_cleanup(&sl);
    raw_stop();
    h_stub_stop(&stub);
}

TestSuite(streaming, .init = start, .fini = stop, .timeout = 120);

/* ---- a worker that counts instead of keeping ---------------------------- */

struct counted {
    int status;
    long long content_length;   /* -1: none */
    long long body;             /* bytes after the head */
};

/* Sends a GET with extra headers and reads the answer to the end (close),
 * counting the body; false on a socket failure or a missing head. */
static bool get_counted(const char *target, const char *headers,
                        struct counted *c)
{
    char req[1024], buf[65536], head[8192];
    size_t hl = 0;
    bool in_body = false;
    long deadline = ms_now() + 60000;
    int fd = h_connect(sl.port);

    memset(c, 0, sizeof *c);
    c->content_length = -1;
    if (fd < 0)
        return false;
    snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: x\r\n%sConnection: close\r\n\r\n",
             target, headers ? headers : "");
    h_send_all(fd, req, strlen(req));
    while (ms_now() < deadline) {
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n <= 0)
            break;
        if (in_body) {
            c->body += n;
            continue;
        }
        size_t take = (size_t)n < sizeof head - 1 - hl ? (size_t)n : sizeof head - 1 - hl;
        memcpy(head + hl, buf, take);
        hl += take;
        head[hl] = '\0';
        char *eoh = strstr(head, "\r\n\r\n");
        if (eoh) {
            size_t used = (size_t)(eoh + 4 - head) - (hl - take);
            char *cl = strcasestr(head, "\r\nContent-Length:");
            in_body = true;
            c->status = atoi(head + 9);
            if (cl && cl < eoh)
                c->content_length = atoll(cl + 17);
            c->body += n - (ssize_t)used;
        }
    }
    close(fd);
    return in_body;
}

static long vm_hwm_kb(pid_t pid)
{
    char path[64], line[256];
    long kb = -1;
    FILE *f;

    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    f = fopen(path, "r");
    if (!f)
        return -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %ld kB", &kb) == 1)
            break;
    fclose(f);
    return kb;
}

/* ---- size --------------------------------------------------------------- */

/* 14 MiB and more used to abort the process (the whole body was kept and
 * handed to libmicrohttpd as one vector of chains). */
Test(streaming, large_bodies_pass_whole)
{
    static const long long sizes[] = {16LL << 20, 64LL << 20};
    struct counted c;
    struct h_resp r;

    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        char hdr[64];
        snprintf(hdr, sizeof hdr, "X-Stub-Body-Size: %lld\r\n", sizes[i]);
        cr_assert(get_counted("/big", hdr, &c));
        cr_expect_eq(c.status, 200);
        cr_expect_eq(c.content_length, sizes[i], "Content-Length %lld", c.content_length);
        cr_expect_eq(c.body, sizes[i], "got %lld of %lld bytes", c.body, sizes[i]);
    }
    /* chunked from the upstream: passed on chunked */
    cr_assert_eq(h_http(sl.port, "GET", "/big",
                        "X-Stub-Chunked: 1\r\nX-Stub-Body-Size: 8388608\r\n",
                        NULL, 0, &r), 0);
    cr_expect_eq(r.status, 200);
    cr_expect_eq(r.body_len, 8388608u, "chunked body of %zu bytes", r.body_len);
    h_resp_free(&r);
    cr_assert_eq(h_http(sl.admin_port, "GET", "/healthz", NULL, NULL, 0, &r), 0);
    cr_expect_eq(r.status, 200, "sluice still serves");
    h_resp_free(&r);
}

/* A 512 MiB body with the whole process under 48 MiB of peak RSS. Sanitizer
 * builds keep freed memory in quarantine, so the bound is for plain builds;
 * they still pass the body. */
Test(streaming, memory_is_bounded_per_connection)
{
    const long long size = 512LL << 20;
    struct counted c;
    long hwm;

    cr_assert(get_counted("/big", "X-Stub-Body-Size: 536870912\r\n", &c));
    cr_expect_eq(c.status, 200);
    cr_expect_eq(c.body, size, "got %lld bytes", c.body);
    hwm = vm_hwm_kb(sl.pid);
    cr_assert(hwm > 0);
#if !defined(__SANITIZE_ADDRESS__)
    cr_expect_lt(hwm, 48 * 1024, "peak RSS %ld kB", hwm);
#endif
}

/* The worker has the first part while the upstream holds back the rest. */
Test(streaming, first_bytes_arrive_before_the_last_are_sent)
{
    static char buf[200000];
    size_t got = 0;
    long deadline = ms_now() + 5000;
    int fd = h_connect(sl.port);
    const char *req = "GET /raw/slow HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    char *body = NULL;

    raw.mode = RAW_SLOW;
    atomic_store(&raw.gate, 0);
    cr_assert(fd >= 0);
    h_send_all(fd, req, strlen(req));
    /* all the first part, before the gate opens */
    while (ms_now() < deadline) {
        ssize_t n = recv(fd, buf + got, sizeof buf - 1 - got, MSG_DONTWAIT);
        if (n > 0)
            got += (size_t)n;
        else
            usleep(5000);
        buf[got] = '\0';
        body = strstr(buf, "\r\n\r\n");
        if (body && got - (size_t)(body + 4 - buf) >= SLOW_FIRST)
            break;
    }
    cr_assert(body, "no head before the upstream finished");
    cr_assert_eq(got - (size_t)(body + 4 - buf), SLOW_FIRST,
                 "%zu body bytes before the rest was sent", got - (size_t)(body + 4 - buf));
    atomic_store(&raw.gate, 1);
    while (ms_now() < deadline && got < sizeof buf - 1) {
        ssize_t n = recv(fd, buf + got, sizeof buf - 1 - got, 0);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    close(fd);
    body = strstr(buf, "\r\n\r\n");
    cr_expect_eq(got - (size_t)(body + 4 - buf), 100000u, "whole body: %zu",
                 got - (size_t)(body + 4 - buf));
}

/* An upstream that breaks off after the head: the worker's response is
 * visibly short (fewer bytes than its Content-Length, then a close). */
Test(streaming, body_cut_short_stays_short)
{
    struct counted c;

    raw.mode = RAW_TRUNCATED;
    cr_assert(get_counted("/raw/cut", NULL, &c));
    cr_expect_eq(c.status, 200);
    cr_expect_eq(c.content_length, 300000);
    cr_expect_lt(c.body, 300000, "got %lld bytes", c.body);
}

/* A worker that leaves mid-body: sluice stops reading from the upstream and
 * closes that connection instead of draining a gigabyte for nobody. */
Test(streaming, worker_leaving_mid_body_frees_the_upstream)
{
    char buf[65536];
    long got = 0, deadline = ms_now() + 5000;
    const char *req = "GET /raw/endless HTTP/1.1\r\nHost: x\r\n\r\n";
    struct h_resp r;
    int fd = h_connect(sl.port);

    raw.mode = RAW_ENDLESS;
    atomic_store(&raw.peer_gone, 0);
    cr_assert(fd >= 0);
    h_send_all(fd, req, strlen(req));
    while (got < 1000000 && ms_now() < deadline) {
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n <= 0)
            break;
        got += n;
    }
    cr_assert_geq(got, 1000000, "only %ld bytes before the close", got);
    close(fd);
    while (!atomic_load(&raw.peer_gone) && ms_now() < deadline)
        usleep(10000);
    cr_expect(atomic_load(&raw.peer_gone), "sluice kept the upstream connection");
    cr_assert_eq(h_http(sl.admin_port, "GET", "/healthz", NULL, NULL, 0, &r), 0);
    cr_expect_eq(r.status, 200);
    h_resp_free(&r);
}

/* sluice never asks for an upgrade: a 101 is a broken answer. */
Test(streaming, upstream_101_is_connection_lost)
{
    struct h_resp r;
    char *o;

    raw.mode = RAW_101;
    cr_assert_eq(h_http(sl.port, "GET", "/raw/up", NULL, NULL, 0, &r), 0);
    cr_expect_eq(r.status, 503);
    o = h_header(&r, "Sluice-Outcome");
    cr_expect(o && strcmp(o, "requeue") == 0, "outcome %s", o ? o : "(none)");
    cr_expect(r.body && strstr(r.body, "\"reason\":\"connection_lost\""), "%s", r.body);
    free(o);
    h_resp_free(&r);
}

/* What an upstream says that the worker's side cannot carry: a status of
 * two digits is a broken answer; header names that are not tokens are
 * dropped (as nginx's ignore_invalid_headers); trailer fields never become
 * headers (the fuzz target fuzz_upstream found all three). */
Test(streaming, upstream_heads_the_worker_could_not_read)
{
    struct h_resp r;
    char *v;

    raw.mode = RAW_CANNED;
    raw.canned = "HTTP/1.1 20 OK\r\nContent-Length: 2\r\n\r\nok";
    cr_assert_eq(h_http(sl.port, "GET", "/raw/up", NULL, NULL, 0, &r), 0);
    cr_expect_eq(r.status, 503, "a two-digit status is broken, not %d", r.status);
    cr_expect(r.body && strstr(r.body, "\"reason\":\"connection_lost\""), "%s", r.body);
    h_resp_free(&r);

    raw.canned = "HTTP/1.1 200 OK\r\nBad Name: x\r\nX-Good: 1\r\n"
                 "Content-Length: 2\r\nConnection: close\r\n\r\nok";
    cr_assert_eq(h_http(sl.port, "GET", "/raw/up", NULL, NULL, 0, &r), 0);
    cr_expect_eq(r.status, 200);
    cr_expect(r.head && !strstr(r.head, "Bad Name"), "%s", r.head);
    v = h_header(&r, "X-Good");
    cr_expect(v && strcmp(v, "1") == 0, "the valid header stays");
    free(v);
    h_resp_free(&r);

    raw.canned = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                 "2\r\nok\r\n0\r\nX-Trailer: t\r\nContent-Length: 999\r\n\r\n";
    cr_assert_eq(h_http(sl.port, "GET", "/raw/up", NULL, NULL, 0, &r), 0);
    cr_expect_eq(r.status, 200);
    /* ": 999", not "999": the made X-Request-Id is random hex and holds
     * "999" in about one run of 140. */
    cr_expect(r.head && !strstr(r.head, "X-Trailer") && !strstr(r.head, ": 999"), "%s", r.head);
    v = h_header(&r, "Content-Length");
    cr_expect(v && strcmp(v, "2") == 0, "Content-Length %s", v ? v : "(none)");
    free(v);
    cr_expect(r.body_len == 2 && r.body && memcmp(r.body, "ok", 2) == 0, "body %zu bytes",
              r.body_len);
    h_resp_free(&r);
}

/* ---- keyed answers ------------------------------------------------------ */

static void keyed(const char *key, const char *extra, struct h_resp *r)
{
    char hdr[256];

    snprintf(hdr, sizeof hdr, "Idempotency-Key: %s\r\n%s", key, extra ? extra : "");
    cr_assert_eq(h_http(sl.port, "POST", "/keyed/x", hdr, "b", 1, r), 0);
}

static void expect_replay(const char *key, const char *extra, size_t body_len,
                          bool omitted)
{
    struct h_resp r;
    char *rep, *om;

    keyed(key, extra, &r);
    rep = h_header(&r, "Idempotent-Replayed");
    om = h_header(&r, "Sluice-Body-Omitted");
    cr_expect_eq(r.status, 200);
    cr_expect(rep && strcmp(rep, "true") == 0, "%s: not a replay", key);
    cr_expect_eq(om != NULL, omitted, "%s: Sluice-Body-Omitted %s", key, om ? om : "-");
    cr_expect_eq(r.body_len, body_len, "%s: replayed %zu bytes", key, r.body_len);
    free(rep);
    free(om);
    h_resp_free(&r);
}

/* Over max_stored_body: streamed to the worker, stored without its body
 * (known from Content-Length at the head, or found out while holding a
 * chunked one), replayed without a second upstream call. Under it: whole. */
Test(streaming, keyed_bodies_over_max_stored_body)
{
    static const char *cases[][2] = {
        {"big-cl", "X-Stub-Body-Size: 1048576\r\n"},
        {"big-chunked", "X-Stub-Body-Size: 1048576\r\nX-Stub-Chunked: 1\r\n"},
    };
    struct h_resp r;

    for (size_t i = 0; i < 2; i++) {
        keyed(cases[i][0], cases[i][1], &r);
        cr_expect_eq(r.status, 200);
        cr_expect_eq(r.body_len, 1048576u, "%s: %zu bytes", cases[i][0], r.body_len);
        h_resp_free(&r);
        expect_replay(cases[i][0], cases[i][1], 0, true);
    }
    keyed("small-chunked", "X-Stub-Body-Size: 3000\r\nX-Stub-Chunked: 1\r\n", &r);
    cr_expect_eq(r.body_len, 3000u);
    h_resp_free(&r);
    expect_replay("small-chunked", "X-Stub-Body-Size: 3000\r\nX-Stub-Chunked: 1\r\n",
                  3000, false);
    cr_expect_eq(h_stub_stat(&stub, "max_per_key"), 1);
    cr_expect_eq(h_stub_stat(&stub, "side_effects"), 3);
}

/* ---- orderings ----------------------------------------------------------- */

/* Two loops: the retry or the scrape may be served by a thread other than
 * the one still finishing the first answer. */
static void start_two_loops(void)
{
    char *cfg;

    cr_assert_eq(h_stub_start(&stub, NULL), 0);
    raw_start();
    cr_assert(asprintf(&cfg,
        "threads: 2\n"
        "upstreams:\n"
        "  stub: {url: http://127.0.0.1:%d}\n"
        "policies:\n"
        "  keyed: {idempotency: {lease: 60s}}\n"
        "routes:\n"
        "  - {prefix: /keyed, upstream: stub, policy: keyed}\n"
        "  - {prefix: /, upstream: stub}\n",
        stub.port) > 0);
    cr_assert_eq(h_sluice_start(&sl, cfg), 0);
    free(cfg);
}

TestSuite(orderings, .init = start_two_loops, .fini = stop, .timeout = 120);

/* After a retryable answer the key is free before the worker reads it, so
 * a retry sent at once proceeds instead of meeting lease_held. */
Test(orderings, retry_at_once_is_not_lease_held)
{
    for (int i = 0; i < 100; i++) {
        char key[32];
        struct h_resp r;

        snprintf(key, sizeof key, "again-%d", i);
        keyed(key, "X-Stub-Status: 503\r\n", &r);
        cr_assert_eq(r.status, 503, "%s: first answer %d", key, r.status);
        h_resp_free(&r);
        keyed(key, NULL, &r);
        cr_assert_eq(r.status, 200, "%s: retry got %d: %s", key, r.status, r.body);
        h_resp_free(&r);
    }
}

static long long upstream_2xx(void)
{
    struct h_resp r;
    const char *p;
    long long v = 0; /* a series at zero may be left out */

    if (h_http(sl.admin_port, "GET", "/metrics", NULL, NULL, 0, &r) != 0)
        return -1;
    p = r.body ? strstr(r.body, "sluice_upstream_responses_total{upstream=\"stub\",code=\"2xx\"} ")
               : NULL;
    if (p)
        v = atoll(strchr(p, '}') + 2);
    h_resp_free(&r);
    return v;
}

/* The upstream's response is counted before the worker has the answer. */
Test(orderings, upstream_response_counted_before_the_answer)
{
    long long before = upstream_2xx();

    cr_assert_geq(before, 0);
    for (int i = 1; i <= 100; i++) {
        struct h_resp r;
        cr_assert_eq(h_http(sl.port, "GET", "/count", NULL, NULL, 0, &r), 0);
        h_resp_free(&r);
        cr_assert_eq(upstream_2xx(), before + i, "after request %d", i);
    }
}

/* ---- heads of any allowed size ------------------------------------------ */

/* n headers with values of `len` bytes each, as request lines. */
static char *many_headers(const char *name, int n, int len)
{
    size_t cap = (size_t)n * ((size_t)len + 64) + 1, used = 0;
    char *s = malloc(cap), *value = malloc((size_t)len + 1);

    if (value) {
        memset(value, 'v', (size_t)len);
        value[len] = '\0';
    }
    for (int i = 0; i < n && s && value; i++)
        used += (size_t)snprintf(s + used, cap - used, "%s%d: %s\r\n", name, i, value);
    free(value);
    return s;
}

/* A request head near max_header and a response head near its own limit:
 * both fit, and the answer arrives whole (it used to be an empty close
 * after the upstream had done the work). */
Test(streaming, large_request_and_response_heads_answer_whole)
{
    char *req = many_headers("X-Stub-Set-Header: X-Big-", 70, 200);
    struct h_resp r;
    char *last;

    cr_assert(req);
    cr_assert_eq(h_http(sl.port, "GET", "/heads", req, NULL, 0, &r), 0);
    cr_expect_eq(r.status, 200);
    last = h_header(&r, "X-Big-69");
    cr_expect(last != NULL, "the last of 70 response headers is missing");
    free(last);
    h_resp_free(&r);
    free(req);
}

/* A response head over the limit is refused whole: a 502 problem, never an
 * empty close. */
Test(streaming, too_big_response_head_is_502)
{
    char *req = many_headers("X-Stub-Set-Header: X-Many-", 260, 8);
    struct h_resp r;
    char *o;

    cr_assert(req);
    cr_assert_eq(h_http(sl.port, "GET", "/heads", req, NULL, 0, &r), 0);
    cr_expect_eq(r.status, 502);
    o = h_header(&r, "Sluice-Outcome");
    cr_expect(o && strcmp(o, "permanent_error") == 0, "outcome %s", o ? o : "(none)");
    cr_expect(r.body && strstr(r.body, "response head over"), "%s", r.body);
    free(o);
    h_resp_free(&r);
    free(req);
}

/* Request heads between max_header and the connection's memory get a whole
 * 431 problem (they used to get an empty close). */
Test(streaming, request_heads_over_max_header_get_a_whole_431)
{
    static const int kib[] = {17, 20, 24};

    for (size_t i = 0; i < sizeof kib / sizeof kib[0]; i++) {
        char *req = many_headers("X-Fill-", kib[i] * 1024 / 110, 100);
        struct h_resp r;

        cr_assert(req);
        cr_assert_eq(h_http(sl.port, "GET", "/heads", req, NULL, 0, &r), 0,
                     "%d KiB: no answer", kib[i]);
        cr_expect_eq(r.status, 431, "%d KiB: status %d", kib[i], r.status);
        cr_expect(r.body && strstr(r.body, "headers_too_large"), "%d KiB: %s", kib[i], r.body);
        h_resp_free(&r);
        free(req);
    }
}

/* max_header counts the head as sent: whitespace around values, which the
 * server library trims, counts too. */
Test(streaming, whitespace_counts_toward_max_header)
{
    size_t n = 190, len = 0;
    char *req = malloc(n * 128 + 1);
    struct h_resp r;

    cr_assert(req);
    for (size_t i = 0; i < n; i++)
        len += (size_t)sprintf(req + len, "X-Pad-%zu:%100s\r\n", i, "v");
    cr_assert_eq(h_http(sl.port, "GET", "/heads", req, NULL, 0, &r), 0);
    cr_expect_eq(r.status, 431, "a %zu-byte head of mostly spaces got %d", len, r.status);
    h_resp_free(&r);
    free(req);
}
