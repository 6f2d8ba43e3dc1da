/* The fleet's slots with lanes and with a followed quota (docs/contract.md
 * §12, §13, docs/reference/fleet.md): two real sluices on one real
 * redis-server in front of one real stub that answers slowly, so the
 * fleet's `concurrency` is what paces. The stub's own count of requests in
 * flight never passes the fleet's bound; an interactive request on one
 * sidecar gets a slot ahead of the batch backlog of both; a followed quota
 * meets no partner 429 after the first window while the bound holds. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "integration/harness.h"
#include "support/redis_server.h"

#define FLEET 2
#define SLOTS 4

static struct redis_server rs;
static struct h_stub stub;
static struct h_sluice sl[FLEET];
static long long stub_t0;   /* about when the stub started: its windows' origin */

static void stop(void)
{
    for (int i = 0; i < FLEET; i++)
        h_sluice_cleanup(&sl[i]);
    h_stub_stop(&stub);
    redis_server_destroy(&rs);
}

static long long now_ms(void);

/* The stub with args; two sluices on one policy p (body: its keys after
 * `shared: redis` and `concurrency`), /click and /sync routed to it. */
static void start(const char *const *args, const char *policy, const char *click_lane)
{
    char *cfg;

    cr_assert_eq(redis_server_start(&rs, 0, NULL), 0, "redis-server did not start");
    if (h_stub_start(&stub, args) != 0) {
        redis_server_destroy(&rs);
        cr_assert_fail("the stub did not start");
    }
    stub_t0 = now_ms();
    cr_assert(asprintf(&cfg, 
        "log: {level: info, access: false}\n"
        "store: {backend: redis, url: \"redis://127.0.0.1:%u/0\", timeout: 500ms,\n"
        "        fleet_size: %d}\n"
        "upstreams: {stub: {url: http://127.0.0.1:%d, max_connections: 256}}\n"
        "policies:\n"
        "  p:\n"
        "    shared: redis\n"
        "    concurrency: %d\n"
        "%s"
        "routes:\n"
        "  - {prefix: /click, upstream: stub, policy: p%s%s}\n"
        "  - {prefix: /sync, upstream: stub, policy: p}\n",
        rs.port, FLEET, stub.port, SLOTS, policy, click_lane ? ", lane: " : "",
        click_lane ? click_lane : "") > 0);
    for (int i = 0; i < FLEET; i++)
        if (h_sluice_start(&sl[i], cfg) != 0) {
            free(cfg);
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
    int ok, refused, other;
    int late_429;               /* the partner's, after the stub's first window */
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
        int rc = h_http(c->port, "POST", c->target, NULL, "j", 1, &r);

        if (rc == 0 && r.status == 200)
            c->ok++;
        else if (rc == 0 && r.status == 429)
            c->refused++;
        else
            c->other++;
        if (rc == 0 && r.status == 429 && r.body && strstr(r.body, "upstream_429") &&
            now_ms() > stub_t0 + 2000 + 300)
            c->late_429++;
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

/* The clients' waits together, sorted, into w (room for n x 256). */
static int gather(const struct client *c, int n, long long *w)
{
    int k = 0;

    for (int i = 0; i < n; i++)
        for (int j = 0; j < c[i].n_waits; j++)
            w[k++] = c[i].waits[j];
    qsort(w, (size_t)k, sizeof *w, cmp_ll);
    return k;
}

static const char lanes_policy[] =
    "    rate: 500/s\n"
    "    burst: 10\n"
    "    max_wait: 30s\n"
    "    lanes:\n"
    "      - { name: interactive, share: 30%, max_wait: 3s }\n"
    "      - { name: batch, share: 70%, max_wait: 30s }\n";

/* The stub answers after 100 ms: the fleet's 4 slots carry 40/s, the rate
 * (500/s) never binds. 32 batch clients on each sidecar keep about 60
 * requests waiting for a slot (a batch wait near 1.5 s); 2 interactive
 * clients join on sidecar 0 after 1.5 s. Their requests wait for the turn
 * on their sidecar by the lanes' shares (30 % of the ~20 slots/s sidecar 0
 * gets: about 170-330 ms for the first or second in the lane), not for the
 * fleet's batch queue, plus the 100 ms at the stub. */
Test(fleet_slots, lanes_order_the_fleets_slots_and_the_bound_holds, .fini = stop,
     .timeout = 90)
{
    enum { NB = 32, NI = 2 };
    const char *args[] = {"--delay-ms", "100", NULL};
    static struct client b[FLEET * NB], in[NI];
    static long long bw[FLEET * NB * 256], iw[NI * 256];
    pthread_t tb[FLEET * NB], ti[NI];
    long long t0, ib50, ip90, ip99, bp50, inflight_max, accepted;
    int nb, ni, batch_other = 0, inter_bad = 0, by_sidecar[FLEET] = {0};

    start(args, lanes_policy, "interactive");
    t0 = now_ms() + 200;
    for (int i = 0; i < FLEET * NB; i++) {
        b[i] = (struct client){.port = sl[i % FLEET].port, .target = "/sync",
                               .from_ms = t0, .until_ms = t0 + 5000};
        pthread_create(&tb[i], NULL, run_client, &b[i]);
    }
    for (int i = 0; i < NI; i++) {
        in[i] = (struct client){.port = sl[0].port, .target = "/click",
                                .from_ms = t0 + 1500, .until_ms = t0 + 4500};
        pthread_create(&ti[i], NULL, run_client, &in[i]);
    }
    for (int i = 0; i < NI; i++)
        pthread_join(ti[i], NULL);
    for (int i = 0; i < FLEET * NB; i++)
        pthread_join(tb[i], NULL);
    for (int i = 0; i < FLEET * NB; i++) {
        batch_other += b[i].other + b[i].refused;
        by_sidecar[i % FLEET] += b[i].ok;
    }
    for (int i = 0; i < NI; i++)
        inter_bad += in[i].other + in[i].refused;
    nb = gather(b, FLEET * NB, bw);
    ni = gather(in, NI, iw);
    cr_assert_gt(nb, 0);
    cr_assert_gt(ni, 0);
    bp50 = bw[nb / 2];
    ib50 = iw[ni / 2];
    ip90 = iw[(ni * 9) / 10];
    ip99 = iw[(ni * 99) / 100];
    inflight_max = h_stub_stat(&stub, "in_flight_max");
    accepted = h_stub_stat(&stub, "accepted");
    cr_log_info("fleet slots with lanes: interactive p50 %lld ms p90 %lld ms p99 %lld ms "
                "(%d), batch p50 %lld ms (%d; %d and %d through each sidecar), in flight "
                "at the stub at most %lld, %lld accepted", ib50, ip90, ip99, ni, bp50, nb,
                by_sidecar[0], by_sidecar[1], inflight_max, accepted);
    cr_expect_leq(inflight_max, SLOTS, "%lld in flight at the stub", inflight_max);
    cr_expect_eq(batch_other, 0, "%d batch requests not 200", batch_other);
    cr_expect_eq(inter_bad, 0, "%d interactive requests not 200", inter_bad);
    cr_expect_gt(bp50, 1000, "batch median %lld ms: no backlog?", bp50);
    /* Without lanes it would wait about as long as batch does. */
    cr_expect_lt(ib50, bp50 / 2, "interactive p50 %lld ms against batch median %lld ms",
                 ib50, bp50);
    /* The tail: 11-25 interactive requests, whose largest wait is one
     * unlucky stretch of sidecar 0 in the fleet's slot polls (it got
     * 82-116 of ~230 slots in nine runs, the largest wait 0.44-1.2 s; 1.5 s
     * once in CI): p90, the second or third largest, is the steadier bound. */
    cr_expect_lt(ip90, bp50, "interactive p90 %lld ms against batch median %lld ms",
                 ip90, bp50);
    /* Work-conserving: the fleet's slots stay busy (40/s over 5 s). */
    cr_expect_gt(accepted, 120, "only %lld at the stub", accepted);
}

/* The stub allows 20 requests per 2 s window (10/s, draft headers) and
 * answers after 150 ms; the fleet's 4 slots would carry 26/s, its rate
 * 100/s: the quota paces, the slots bound what is in flight. 6 clients on
 * each sidecar for 6 s. */
Test(fleet_slots, a_followed_quota_with_the_fleets_slots, .fini = stop, .timeout = 90)
{
    enum { N = 6 };
    const char *args[] = {"--quota", "20", "--quota-window", "2", "--quota-style", "draft",
                          "--delay-ms", "150", NULL};
    static struct client c[FLEET * N];
    pthread_t t[FLEET * N];
    long long t0, refused, accepted, inflight_max;
    int ok = 0, other = 0, late = 0, bounced = 0;

    start(args,
          "    rate: 100/s\n"
          "    burst: 10\n"
          "    max_wait: 10s\n"
          "    quota: {follow: true, min_rate: 0.5/s}\n", NULL);
    t0 = now_ms() + 200;
    for (int i = 0; i < FLEET * N; i++) {
        c[i] = (struct client){.port = sl[i % FLEET].port, .target = "/sync",
                               .from_ms = t0, .until_ms = t0 + 6000};
        pthread_create(&t[i], NULL, run_client, &c[i]);
    }
    for (int i = 0; i < FLEET * N; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < FLEET * N; i++) {
        ok += c[i].ok;
        other += c[i].other;
        late += c[i].late_429;
        bounced += c[i].refused;
    }
    refused = h_stub_stat(&stub, "quota_refused");
    accepted = h_stub_stat(&stub, "accepted");
    inflight_max = h_stub_stat(&stub, "in_flight_max");
    cr_log_info("fleet slots with a followed quota: accepted %lld, partner refused %lld "
                "(%d after the first window), in flight at the stub at most %lld, %d ok, "
                "%d answered 429", accepted, refused, late, inflight_max, ok, bounced);
    cr_expect_leq(inflight_max, SLOTS, "%lld in flight at the stub", inflight_max);
    /* The first window's answers teach the fleet the quota (the requests
     * in flight before the first answer may meet a refusal then); none
     * after it. */
    cr_expect_eq(late, 0, "the partner refused %d after the first window", late);
    cr_expect_leq(refused, 2 * SLOTS, "the partner refused %lld", refused);
    /* 6 s: 3 windows, at most 60 + a 4th's start; most of the quota used. */
    cr_expect_geq(accepted, 45, "only %lld of the quota used", accepted);
    cr_expect_eq(other, 0, "%d answers neither 200 nor 429", other);
}
