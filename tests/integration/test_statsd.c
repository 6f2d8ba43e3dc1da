/* StatsD push (docs/contract.md §8): DogStatsD lines over UDP to a socket the
 * test binds on loopback, within a second or so, in datagrams <= 1432 bytes. */
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
static int udp = -1;

static void start(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET};
    socklen_t len = sizeof a;
    char *cfg;

    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    udp = socket(AF_INET, SOCK_DGRAM, 0);
    cr_assert(udp >= 0 && bind(udp, (struct sockaddr *)&a, sizeof a) == 0);
    cr_assert_eq(getsockname(udp, (struct sockaddr *)&a, &len), 0);
    cr_assert_eq(h_stub_start(&stub, NULL), 0);
    cr_assert(asprintf(&cfg,
        "metrics: {statsd: \"127.0.0.1:%d\"}\n"
        "upstreams: {stub: {url: http://127.0.0.1:%d}}\n"
        "policies: {k: {idempotency: {}}}\n"
        "routes: [{name: s, prefix: /s, upstream: stub},\n"
        "         {name: k, prefix: /k, upstream: stub, policy: k}]\n",
        ntohs(a.sin_port), stub.port) > 0);
    cr_assert_eq(h_sluice_start(&sl, cfg), 0);
    free(cfg);
}

static void stop(void)
{
    h_sluice_cleanup(&sl);
    h_stub_stop(&stub);
    if (udp >= 0)
        close(udp);
}

TestSuite(statsd, .init = start, .fini = stop, .timeout = 30);

/* Sums N over the lines "PREFIX N|c|#TAGS" (each loop sends its own). */
static long sum_counter(const char *all, const char *prefix, const char *tags)
{
    long sum = 0;
    size_t pl = strlen(prefix);

    for (const char *p = all; (p = strstr(p, prefix)); p += pl) {
        char *end;
        long n = strtol(p + pl, &end, 10);
        const char *eol = strchr(end, '\n');
        if (strncmp(end, "|c|#", 4) == 0 && eol &&
            (size_t)(eol - end - 4) == strlen(tags) && !strncmp(end + 4, tags, strlen(tags)))
            sum += n;
    }
    return sum;
}

/* What the test's socket received so far, each datagram ending in \n. */
struct sink {
    char *all;
    size_t len, cap, max_dgram;
};

static struct sink sink_new(void)
{
    struct sink s = {.cap = 1 << 20};

    s.all = calloc(1, s.cap);
    cr_assert_not_null(s.all);
    return s;
}

/* Reads every datagram waiting, then those arriving within wait_ms. */
static void drain(struct sink *s, int wait_ms)
{
    struct pollfd p = {udp, POLLIN, 0};

    while (poll(&p, 1, wait_ms) == 1) {
        char buf[65536];
        ssize_t n = recv(udp, buf, sizeof buf, 0);
        if (n <= 0)
            break;
        if ((size_t)n > s->max_dgram)
            s->max_dgram = (size_t)n;
        if (s->len + (size_t)n + 2 < s->cap) {
            memcpy(s->all + s->len, buf, (size_t)n);
            s->len += (size_t)n;
            s->all[s->len++] = '\n';
        }
    }
}

/* Collects datagrams for `ms` more: every loop flushes once a second. */
static void collect(struct sink *s, int ms)
{
    for (int waited = 0; waited < ms; waited += 100)
        drain(s, 100);
}

Test(statsd, counters_and_timings_are_pushed)
{
    struct sink s = sink_new();
    const char *all = s.all;

    for (int i = 0; i < 3; i++) {
        struct h_resp r;
        cr_assert_eq(h_http(sl.port, "GET", "/s", "Sluice-Enqueued-At: 1700000000\r\n",
                            NULL, 0, &r), 0);
        h_resp_free(&r);
    }
    {
        struct h_resp r;
        cr_assert_eq(h_http(sl.port, "POST", "/k", "Idempotency-Key: sd-1\r\n", "x", 1, &r), 0);
        h_resp_free(&r);
    }
    collect(&s, 2500);
    cr_expect_eq(sum_counter(all, "sluice.requests:", "route:s,outcome:ok,reason:none"), 3,
                 "%s", all);
    cr_expect_eq(sum_counter(all, "sluice.upstream_responses:", "upstream:stub,code:2xx"), 4,
                 "%s", all);
    cr_expect(strstr(all, "sluice.request_duration:") && strstr(all, "|ms|#route:s"), "%s", all);
    cr_expect(strstr(all, "|ms|#upstream:stub") != NULL, "%s", all);
    cr_expect(strstr(all, "sluice.queue_age:") != NULL, "%s", all);
    /* the store's calls, as sluice_store_duration_seconds{op} */
    cr_expect(strstr(all, "sluice.store_duration:") && strstr(all, "|ms|#op:acquire"), "%s", all);
    cr_expect(strstr(all, "|ms|#op:complete") != NULL, "%s", all);
    cr_expect_leq(s.max_dgram, 1432);
    free(s.all);
}

/* The socket is read between requests: the timings of 60 requests fill
 * more datagrams than a loopback socket's buffer holds while nobody reads
 * (a datagram dropped there took a counter line with it, one CI run). */
Test(statsd, many_lines_are_split_into_small_datagrams)
{
    struct sink s = sink_new();

    for (int i = 0; i < 60; i++) {
        struct h_resp r;
        cr_assert_eq(h_http(sl.port, "GET", "/s", NULL, NULL, 0, &r), 0);
        h_resp_free(&r);
        drain(&s, 0);
    }
    {
        struct h_resp r;
        cr_assert_eq(h_http(sl.port, "POST", "/k", "Idempotency-Key: sd-1\r\n", "x", 1, &r), 0);
        h_resp_free(&r);
    }
    collect(&s, 2500);
    cr_expect_eq(sum_counter(s.all, "sluice.requests:", "route:s,outcome:ok,reason:none"), 60,
                 "%s", s.all);
    cr_expect_gt(s.max_dgram, 500, "datagrams are filled, not one line each");
    cr_expect_leq(s.max_dgram, 1432);
    free(s.all);
}
