/* `mode: shadow` with lanes and with a followed quota (docs/contract.md §5,
 * §12, §13; docs/design-choices.md): the real sluice forwards every request
 * at once to the real stub, and its shadow counts say what enforcing would
 * have refused: a lane's wait beyond its lane's max_wait (the batch lane's
 * backlog refused, an interactive request not held behind it), and the
 * followed quota's effective rate. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "integration/harness.h"

static struct h_stub stub;
static struct h_sluice sl;

static void stop(void)
{
    h_sluice_cleanup(&sl);
    h_stub_stop(&stub);
}

static void start(const char *const *stub_args, const char *policy)
{
    char *cfg;

    cr_assert_eq(h_stub_start(&stub, stub_args), 0);
    cr_assert(asprintf(&cfg,
        "log: {level: info, access: true}\n"
        "upstreams: {stub: {url: http://127.0.0.1:%d, max_connections: 256}}\n"
        "policies:\n"
        "  p:\n"
        "    mode: shadow\n"
        "%s"
        "routes:\n"
        "  - {name: click, prefix: /click, upstream: stub, policy: p%s}\n"
        "  - {name: sync, prefix: /sync, upstream: stub, policy: p}\n",
        stub.port, policy, strstr(policy, "lanes:") ? ", lane: interactive" : "") > 0);
    cr_assert_eq(h_sluice_start(&sl, cfg), 0, "sluice did not start");
    free(cfg);
}

static long long now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

/* The shadow series of a route: what enforcing would have refused. */
static long long shadow_refused(const char *route)
{
    char want[160];
    struct h_resp r;
    const char *at;
    long long v = -1;

    snprintf(want, sizeof want, "sluice_requests_total{route=\"%s\",outcome=\"requeue\","
             "reason=\"rate_limited\",shadow=\"true\"} ", route);
    cr_assert_eq(h_http(sl.admin_port, "GET", "/metrics", NULL, NULL, 0, &r), 0);
    if ((at = strstr(r.body, want)))
        v = atoll(at + strlen(want));
    h_resp_free(&r);
    cr_assert_geq(v, 0, "no series %s", want);
    return v;
}

struct one {
    const char *target;
    int status;
    long long took_ms;
};

static void *send_one(void *arg)
{
    struct one *o = arg;
    struct h_resp r;
    long long t0 = now_ms();

    o->status = h_http(sl.port, "POST", o->target, NULL, "j", 1, &r) == 0 ? r.status : -1;
    o->took_ms = now_ms() - t0;
    h_resp_free(&r);
    return NULL;
}

/* n requests to target at once; the longest answer's time. */
static long long burst(const char *target, int n, int *not_ok)
{
    pthread_t t[64];
    struct one o[64];
    long long longest = 0;

    cr_assert_leq(n, 64);
    for (int i = 0; i < n; i++) {
        o[i] = (struct one){.target = target};
        pthread_create(&t[i], NULL, send_one, &o[i]);
    }
    for (int i = 0; i < n; i++) {
        pthread_join(t[i], NULL);
        *not_ok += o[i].status != 200;
        longest = o[i].took_ms > longest ? o[i].took_ms : longest;
    }
    return longest;
}

/* 10/s, burst 2. 40 batch requests at once: enforcing, the batch lane
 * alone has the whole rate, so about 12 fit in its 1 s max_wait and 28
 * would have been refused; then 5 interactive at once, while the batch
 * lane's backlog (1.1 s) is still ahead: at 30 % of the rate, 2 fit in
 * its 500 ms, 3 refused, however long the batch queue. Each is sent at
 * once. */
Test(shadow_lanes, nothing_waits_and_the_counts_say_what_each_lane_would_have_refused,
     .fini = stop, .timeout = 30)
{
    int not_ok = 0;
    long long longest, b, i;

    start(NULL,
          "    rate: 10/s\n"
          "    burst: 2\n"
          "    lanes:\n"
          "      - { name: interactive, share: 30%, max_wait: 500ms }\n"
          "      - { name: batch, share: 70%, max_wait: 1s }\n");
    longest = burst("/sync", 40, &not_ok);
    longest += burst("/click", 5, &not_ok);
    b = shadow_refused("sync");
    i = shadow_refused("click");
    cr_log_info("shadow lanes: batch would have refused %lld of 40, interactive %lld of 5; "
                "the two bursts' longest answers took %lld ms together", b, i, longest);
    cr_expect_eq(not_ok, 0, "%d answers not 200", not_ok);
    cr_expect_eq(h_stub_stat(&stub, "accepted"), 45, "everything is forwarded");
    cr_expect_lt(longest, 1000, "the bursts took %lld ms: something waited", longest);
    cr_expect(b >= 20 && b <= 32, "batch: %lld would have been refused", b);
    cr_expect(i >= 2 && i <= 4, "interactive: %lld would have been refused", i);
    usleep(100000);
    cr_expect(h_file_contains(sl.log_path, "\"shadow\":\"rate_limited\""));
    cr_expect(h_file_contains(sl.log_path, "\"shadow\":\"permit_wait\""));
    cr_expect(h_file_contains(sl.log_path, "\"lane\":\"interactive\""));
}

/* The stub allows 20 requests per 10 s window (draft headers); the policy
 * says 100/s, burst 10, max_wait 500 ms. 18 requests one after the other:
 * at 100/s none would have been refused; at the rate the answers advertise
 * (what remains over what is left of the window, the capacity never above
 * what remains), the last five or so would have been. The partner refuses
 * nothing: all 18 fit its quota. */
static long long sequential(bool follow)
{
    const char *args[] = {"--quota", "20", "--quota-window", "10", "--quota-style", "draft",
                          NULL};
    long long t0, refused;
    int not_ok = 0;

    start(args, follow ? "    rate: 100/s\n"
                         "    burst: 10\n"
                         "    max_wait: 500ms\n"
                         "    quota: {follow: true}\n"
                       : "    rate: 100/s\n"
                         "    burst: 10\n"
                         "    max_wait: 500ms\n");
    t0 = now_ms();
    for (int k = 0; k < 18; k++) {
        struct one o = {.target = "/sync"};

        send_one(&o);
        not_ok += o.status != 200;
    }
    refused = shadow_refused("sync");
    cr_log_info("shadow %s: %lld of 18 would have been refused, in %lld ms",
                follow ? "follow" : "without follow", refused, now_ms() - t0);
    cr_expect_eq(not_ok, 0, "%d answers not 200", not_ok);
    cr_expect_eq(h_stub_stat(&stub, "quota_refused"), 0);
    cr_expect_lt(now_ms() - t0, 2000, "the requests waited");
    return refused;
}

Test(shadow_lanes, a_followed_quota_counts_the_effective_rates_refusals, .fini = stop,
     .timeout = 30)
{
    long long refused = sequential(true);

    cr_expect(refused >= 3 && refused <= 8, "%lld would have been refused", refused);
}

/* The same without follow: the configured 100/s would have refused none. */
Test(shadow_lanes, without_follow_the_configured_rate_refuses_none, .fini = stop,
     .timeout = 30)
{
    cr_expect_eq(sequential(false), 0);
}
