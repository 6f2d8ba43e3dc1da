/* obs/statsd.c: a loop's counter deltas reach the socket even when the
 * registry is held at its tick. Every loop ticks once a second from the
 * same start, so two loops' flushes met each time and the one that found
 * the registry held skipped its counters at every tick; a busy flush is now
 * tried again 10 ms later. A real UDP socket on loopback, a real loop. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <event2/event.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "config/config.h"
#include "obs/metrics.h"
#include "obs/statsd.h"

static const char yaml[] =
    "upstreams: {u: {url: http://127.0.0.1:9}}\n"
    "policies: {checked: {idempotency: {verify: {path: \"/o?ref={key}\"}}}}\n"
    "routes: [{prefix: /, upstream: u, policy: checked}]\n";

static struct metrics m;
static struct metrics_ids ids;
static struct sc_config *cfg;
static struct event_base *base;
static int udp = -1;
static char target[64];

static void setup(void)
{
    struct sc_errors errs = {0};
    struct sockaddr_in a = {.sin_family = AF_INET};
    socklen_t len = sizeof a;

    cr_assert_eq(config_load_string("t.yaml", yaml, strlen(yaml), &cfg, &errs), 0);
    sc_errors_free(&errs);
    cr_assert_eq(metrics_init(&m, 2), 0);
    cr_assert_eq(metrics_ids_build(&m, cfg, &ids), 0);
    cr_assert_not_null(base = event_base_new());
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    udp = socket(AF_INET, SOCK_DGRAM, 0);
    cr_assert(udp >= 0 && bind(udp, (struct sockaddr *)&a, sizeof a) == 0);
    cr_assert_eq(getsockname(udp, (struct sockaddr *)&a, &len), 0);
    snprintf(target, sizeof target, "127.0.0.1:%d", ntohs(a.sin_port));
}

static void teardown(void)
{
    close(udp);
    event_base_free(base);
    metrics_ids_free(&ids);
    metrics_free(&m);
    config_free(cfg);
}

TestSuite(statsd, .init = setup, .fini = teardown, .timeout = 20);

static void run_for(int ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};

    event_base_loopexit(base, &tv);
    event_base_dispatch(base);
}

/* What the socket holds now, datagrams joined by newlines. */
static size_t received(char *out, size_t cap)
{
    struct pollfd p = {udp, POLLIN, 0};
    size_t len = 0;

    out[0] = '\0';
    while (poll(&p, 1, 0) == 1 && len + 2 < cap) {
        ssize_t n = recv(udp, out + len, cap - len - 2, 0);
        if (n <= 0)
            break;
        len += (size_t)n;
        out[len++] = '\n';
        out[len] = '\0';
    }
    return len;
}

Test(statsd, a_tick_that_finds_the_registry_held_tries_again_soon)
{
    const char line[] = "sluice.verifications:3|c|#policy:checked,result:found";
    struct statsd s;
    struct sc_error err = {0};
    char got[8192];

    cr_assert_eq(statsd_open(&s, target, base, &m, 1, &err), 0);
    metrics_add(&m.shards[1], metrics_verification_slot(&ids, 0, VERIFY_FOUND), 3);
    pthread_mutex_lock(&m.mu); /* another loop's flush, a scrape */
    run_for(1100);
    received(got, sizeof got);
    cr_expect_null(strstr(got, "sluice.verifications:"), "nothing while held: %s", got);
    pthread_mutex_unlock(&m.mu);
    run_for(100); /* well before the next second */
    received(got, sizeof got);
    cr_expect_not_null(strstr(got, line), "the counter went out within 100 ms: [%s]", got);
    run_for(1100);
    received(got, sizeof got);
    cr_expect_null(strstr(got, "sluice.verifications:"), "sent once, as a delta: %s", got);
    statsd_close(&s);
}

/* Closing waits for the registry: the last counts are sent, not skipped. */
Test(statsd, closing_sends_the_last_counts)
{
    struct statsd s;
    struct sc_error err = {0};
    char got[8192];

    cr_assert_eq(statsd_open(&s, target, base, &m, 0, &err), 0);
    metrics_add(&m.shards[0], metrics_verification_slot(&ids, 0, VERIFY_ABSENT), 2);
    statsd_close(&s);
    received(got, sizeof got);
    cr_expect_not_null(strstr(got, "sluice.verifications:2|c|#policy:checked,result:absent"),
                       "[%s]", got);
}
