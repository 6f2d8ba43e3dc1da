/* Lanes in fleet mode (docs/contract.md §13, docs/reference/fleet.md): two
 * real sluices on one real redis-server in front of one real stub. Batch
 * work saturates the fleet's bucket through both; interactive work joins on
 * one. The fleet's bound holds at the stub, and an interactive request
 * waits for its own lane's turn on its sidecar, not for the batch backlog
 * of the fleet; a policy without lanes in the same run shows that backlog. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "integration/harness.h"
#include "support/redis_server.h"

#define FLEET 2

static struct redis_server rs;
static struct h_stub stub;
static struct h_sluice sl[FLEET];

static void stop(void)
{
    for (int i = 0; i < FLEET; i++)
        h_sluice_cleanup(&sl[i]);
    h_stub_stop(&stub);
    redis_server_destroy(&rs);
}

/* 20/s for the fleet; the interactive lane may wait 2 s, batch 30 s. */
static void start(const char *lanes)
{
    char *cfg;

    cr_assert_eq(redis_server_start(&rs, 0, NULL), 0, "redis-server did not start");
    if (h_stub_start(&stub, NULL) != 0) {
        redis_server_destroy(&rs);
        cr_assert_fail("the stub did not start");
    }
    cr_assert(asprintf(&cfg,
        "store: {backend: redis, url: \"redis://127.0.0.1:%u/0\", timeout: 500ms,\n"
        "        fleet_size: %d}\n"
        "upstreams: {stub: {url: http://127.0.0.1:%d, max_connections: 256}}\n"
        "policies:\n"
        "  p:\n"
        "    rate: 20/s\n"
        "    burst: 2\n"
        "    max_wait: 30s\n"
        "    shared: redis\n"
        "%s"
        "routes:\n"
        "  - {prefix: /click, upstream: stub, policy: p%s}\n"
        "  - {prefix: /sync, upstream: stub, policy: p}\n",
        rs.port, FLEET, stub.port, lanes ? lanes : "",
        lanes ? ", lane: interactive" : "") > 0);
    for (int i = 0; i < FLEET; i++)
        if (h_sluice_start(&sl[i], cfg) != 0) {
            free(cfg);
            stop(); /* an assert in the test skips nothing: .fini runs */
            cr_assert_fail("sluice %d did not start", i);
        }
    free(cfg);
}

static long long now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

struct client {
    int port;
    const char *target;
    long long from_ms, until_ms;
    int ok, other;
    long long waits[256];
    int n_waits;
};

static void *run_client(void *arg)
{
    struct client *c = arg;

    while (now_ms() < c->from_ms)
        usleep(1000);
    while (now_ms() < c->until_ms) {
        struct h_resp r;
        long long t0 = now_ms();

        if (h_http(c->port, "POST", c->target, NULL, "j", 1, &r) == 0 &&
            r.status == 200)
            c->ok++;
        else
            c->other++;
        h_resp_free(&r);
        if (c->n_waits < 256)
            c->waits[c->n_waits++] = now_ms() - t0;
    }
    return NULL;
}

static int cmp_ll(const void *a, const void *b)
{
    long long x = *(const long long *)a, y = *(const long long *)b;

    return (x > y) - (x < y);
}

/* The stub's arrivals never exceed burst + rate x t in any window, with
 * 0.6 T of slack for the stub's timestamps (as test_pacing's bound). */
static size_t assert_fleet_bound(void)
{
    static long long at[4096];
    struct h_resp r;
    json_t *arr;
    size_t n;

    cr_assert_eq(h_http(stub.port, "GET", "/_stub/arrivals", NULL, NULL, 0, &r), 0);
    arr = json_loads(r.body, 0, NULL);
    h_resp_free(&r);
    cr_assert_not_null(arr);
    n = json_array_size(arr);
    cr_assert_lt(n, 4096);
    for (size_t i = 0; i < n; i++)
        at[i] = json_integer_value(json_array_get(arr, i));
    json_decref(arr);
    /* The whole run too: its starts within burst + rate x its span. */
    cr_assert(n < 2 || (double)n <= 2 + 20 * ((double)(at[n - 1] - at[0]) / 1e9 + 0.03),
              "%zu starts in %.3f s", n, n ? (double)(at[n - 1] - at[0]) / 1e9 : 0.0);
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n && j < i + 200; j++) {
            double t_s = (double)(at[j] - at[i]) / 1e9 + 0.6 / 20;

            cr_assert_leq((double)(j - i + 1), 2 + 20 * t_s, "%zu starts in %.4f s",
                          j - i + 1, t_s);
        }
    return n;
}

/* 24 batch clients on each sidecar saturate the fleet's 20/s; 2
 * interactive clients join on sidecar 0 after 1.5 s. Interactive's p99
 * wait is measured against the batch median; the interactive max wait is
 * its lane's 2 s (beyond it, refused). Returns the interactive p99 and
 * writes the batch median, the interactive refusals and the permits. */
static long long run(long long *batch_p50, int *refused, int *oks)
{
    enum { NB = 24, NI = 2 };
    static struct client b[FLEET][NB], in[NI];
    static long long bw[FLEET * NB * 256], iw[NI * 256];
    pthread_t tb[FLEET][NB], ti[NI];
    long long t0 = now_ms() + 200;
    int nb = 0, ni = 0;

    *refused = *oks = 0;
    for (int s = 0; s < FLEET; s++)
        for (int i = 0; i < NB; i++) {
            b[s][i] = (struct client){.port = sl[s].port, .target = "/sync",
                                      .from_ms = t0, .until_ms = t0 + 5500};
            pthread_create(&tb[s][i], NULL, run_client, &b[s][i]);
        }
    for (int i = 0; i < NI; i++) {
        in[i] = (struct client){.port = sl[0].port, .target = "/click",
                                .from_ms = t0 + 1500, .until_ms = t0 + 5000};
        pthread_create(&ti[i], NULL, run_client, &in[i]);
    }
    for (int i = 0; i < NI; i++)
        pthread_join(ti[i], NULL);
    for (int s = 0; s < FLEET; s++)
        for (int i = 0; i < NB; i++)
            pthread_join(tb[s][i], NULL);
    for (int s = 0; s < FLEET; s++)
        for (int i = 0; i < NB; i++) {
            cr_expect_eq(b[s][i].other, 0, "batch %d/%d: %d not 200", s, i,
                         b[s][i].other);
            *oks += b[s][i].ok;
            for (int k = 0; k < b[s][i].n_waits; k++)
                bw[nb++] = b[s][i].waits[k];
        }
    for (int i = 0; i < NI; i++) {
        *refused += in[i].other;
        *oks += in[i].ok;
        for (int k = 0; k < in[i].n_waits; k++)
            iw[ni++] = in[i].waits[k];
    }
    cr_assert_gt(nb, 0);
    cr_assert_gt(ni, 0);
    qsort(bw, (size_t)nb, sizeof *bw, cmp_ll);
    qsort(iw, (size_t)ni, sizeof *iw, cmp_ll);
    *batch_p50 = bw[nb / 2];
    return iw[(ni * 99) / 100];
}

static const char lanes[] =
    "    lanes:\n"
    "      - { name: interactive, share: 30%, max_wait: 2s }\n"
    "      - { name: batch, share: 70%, max_wait: 30s }\n";

/* Sidecar 0 gets about half the fleet's permits (10/s), its interactive
 * lane 30 % of those: 2 clients wait about 2 / 3 s each, not the fleet's
 * backlog of 48 batch requests (over 2 s). */
Test(fleet_lanes, interactive_on_one_sidecar_waits_little_and_the_fleet_bound_holds,
     .fini = stop, .timeout = 90)
{
    long long bp50, ip99;
    int refused, oks;
    size_t n;

    start(lanes);
    ip99 = run(&bp50, &refused, &oks);
    cr_expect_gt(bp50, 1500, "batch median wait %lld ms: no backlog?", bp50);
    cr_expect_eq(refused, 0, "%d interactive requests not 200", refused);
    cr_expect_lt(ip99, 1500, "interactive p99 wait %lld ms (batch median %lld)",
                 ip99, bp50);
    n = assert_fleet_bound();
    cr_log_info("lanes: interactive p99 %lld ms, batch p50 %lld ms, %zu starts",
                ip99, bp50, n);
    /* Work-conserving: the fleet's 20/s are used (5.5 s of clients). */
    cr_expect_gt(n, 100, "only %zu starts at the stub", n);
}

/* The same run without lanes: interactive requests queue behind the
 * fleet's batch backlog, so the test above measures the lanes. */
Test(fleet_lanes, without_lanes_interactive_waits_behind_the_backlog, .fini = stop,
     .timeout = 90)
{
    long long bp50, ip99;
    int refused, oks;

    start(NULL);
    ip99 = run(&bp50, &refused, &oks);
    cr_expect_gt(ip99, 1500, "interactive p99 wait %lld ms without lanes", ip99);
    cr_log_info("no lanes: interactive p99 %lld ms, batch p50 %lld ms, %zu starts",
                ip99, bp50, assert_fleet_bound());
}
