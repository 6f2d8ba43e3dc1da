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

/* Collects datagrams for up to `ms`, until `want` is seen. */
static char *collect(const char *want, int ms, size_t *max_dgram)
{
    size_t cap = 1 << 20, len = 0;
    char *all = calloc(1, cap);

    *max_dgram = 0;
    for (int waited = 0; waited < ms && !strstr(all, want); waited += 100) {
        struct pollfd p = {udp, POLLIN, 0};
        while (poll(&p, 1, 100) == 1) {
            char buf[65536];
            ssize_t n = recv(udp, buf, sizeof buf, 0);
            if (n <= 0)
                break;
            if ((size_t)n > *max_dgram)
                *max_dgram = (size_t)n;
            if (len + (size_t)n + 2 < cap) {
                memcpy(all + len, buf, (size_t)n);
                len += (size_t)n;
                all[len++] = '\n';
            }
        }
    }
    return all;
}

Test(statsd, counters_and_timings_are_pushed)
{
    size_t max_dgram;
    char *all;

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
    all = collect("no such line: collect for the whole time", 2500, &max_dgram);
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
    cr_expect_leq(max_dgram, 1432);
    free(all);
}

Test(statsd, many_lines_are_split_into_small_datagrams)
{
    size_t max_dgram;
    char *all;

    for (int i = 0; i < 60; i++) {
        struct h_resp r;
        cr_assert_eq(h_http(sl.port, "GET", "/s", NULL, NULL, 0, &r), 0);
        h_resp_free(&r);
    }
    {
        struct h_resp r;
        cr_assert_eq(h_http(sl.port, "POST", "/k", "Idempotency-Key: sd-1\r\n", "x", 1, &r), 0);
        h_resp_free(&r);
    }
    all = collect("no such line: collect for the whole time", 2500, &max_dgram);
    cr_expect_eq(sum_counter(all, "sluice.requests:", "route:s,outcome:ok,reason:none"), 60);
    cr_expect_gt(max_dgram, 500, "datagrams are filled, not one line each");
    cr_expect_leq(max_dgram, 1432);
    free(all);
}
