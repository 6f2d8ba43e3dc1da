/* Fleet mode's waiting duplicates end on a notice (docs/contract.md §6,
 * docs/reference/fleet.md "Waiting duplicates"): two real sluices on one
 * real redis-server in front of one real stub. A duplicate sent to sidecar
 * B while the key is in progress on sidecar A is answered within a few ms
 * of A's answer (the publish of A's completion wakes it), not at B's next
 * 25 ms look; with B's subscription killed (CLIENT KILL TYPE pubsub) the
 * duplicates still end (the fallback's polling) and the subscription comes
 * back; a known failure of A (its 500 releases the key) wakes the waiter,
 * which goes first; a reload subscribes to a new policy's channel. Both
 * the fleet's keyed plan (permit_lease, shared: redis) and the
 * lookup-and-lease plan on the Redis store (no shared bucket) are driven. */
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
#define HOLD_MS 150

static struct redis_server rs;
static struct h_stub stub;
static struct h_sluice sl[FLEET];

#define CONFIG_HEAD                                                            \
    "store: {backend: redis, url: \"redis://127.0.0.1:%u/0\", timeout: 500ms,\n" \
    "        fleet_size: 2}\n"                                                  \
    "upstreams: {slow: {url: http://127.0.0.1:%d, timeout: 5s}}\n"             \
    "policies:\n"                                                             \
    "  w: {rate: 500/s, burst: 50, shared: redis, max_wait: 3s,\n"            \
    "      idempotency: {lease: 30s, duplicates: wait}}\n"                    \
    "  l: {rate: 500/s, burst: 50, max_wait: 3s,\n"                           \
    "      idempotency: {lease: 30s, duplicates: wait}}\n"
#define CONFIG_ROUTES                                                          \
    "routes:\n"                                                               \
    "  - {prefix: /w, upstream: slow, policy: w}\n"                           \
    "  - {prefix: /l, upstream: slow, policy: l}\n"
#define CONFIG CONFIG_HEAD CONFIG_ROUTES
/* ... and a third policy that waits, for a reload. */
#define CONFIG_N                                                               \
    CONFIG_HEAD                                                                \
    "  n: {rate: 500/s, max_wait: 3s,\n"                                      \
    "      idempotency: {lease: 30s, duplicates: wait}}\n"                    \
    CONFIG_ROUTES                                                              \
    "  - {prefix: /n, upstream: slow, policy: n}\n"

static void stop(void)
{
    for (int i = 0; i < FLEET; i++)
        h_sluice_cleanup(&sl[i]);
    h_stub_stop(&stub);
    redis_server_destroy(&rs);
}

/* The subscribers of a policy's channel, as Redis counts them. */
static int subscribers(const char *policy)
{
    char cmd[256];
    FILE *p;
    int n = -1;

    snprintf(cmd, sizeof cmd,
             "redis-cli -p %u PUBSUB NUMSUB 'sluice:{%s}:done' | tail -1", rs.port,
             policy);
    if ((p = popen(cmd, "r")) != NULL) {
        if (fscanf(p, "%d", &n) != 1)
            n = -1;
        pclose(p);
    }
    return n;
}

/* Until both sidecars listen for both policies (at most 5 s). */
static bool await_subscribed(void)
{
    for (int i = 0; i < 100; i++) {
        if (subscribers("w") == FLEET && subscribers("l") == FLEET)
            return true;
        usleep(50 * 1000);
    }
    return false;
}

static void start(void)
{
    char *cfg;

    cr_assert_eq(redis_server_start(&rs, 0, NULL), 0, "redis-server did not start");
    if (h_stub_start(&stub, NULL) != 0) {
        redis_server_destroy(&rs);
        cr_assert_fail("the stub did not start");
    }
    cr_assert(asprintf(&cfg, CONFIG, rs.port, stub.port) > 0);
    for (int i = 0; i < FLEET; i++)
        if (h_sluice_start(&sl[i], cfg) != 0) {
            free(cfg);
            stop(); /* an assert in .init skips .fini */
            cr_assert_fail("sluice %d did not start", i);
        }
    free(cfg);
    if (!await_subscribed()) {
        stop();
        cr_assert_fail("the sidecars did not subscribe to their channels");
    }
}

TestSuite(fleet_notify, .init = start, .fini = stop, .timeout = 90);

struct call {
    int sidecar;
    char target[64], key[64];
    const char *extra;
    struct h_resp r;
    double done_ms;              /* monotonic, when its answer was in */
};

static double mono_ms(void)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static void *post_thread(void *arg)
{
    struct call *c = arg;
    char hdr[512];

    snprintf(hdr, sizeof hdr, "Idempotency-Key: %s\r\n%s", c->key,
             c->extra ? c->extra : "");
    h_http(sl[c->sidecar].port, "POST", c->target, hdr, "{\"qty\":1}", 9, &c->r);
    c->done_ms = mono_ms();
    return NULL;
}

/* The holder's request through A, at the stub for hold ms (and answered
 * status), and a duplicate through B sent once the holder is there, then
 * given time to settle into its wait. Both answered on return. */
static void pair(struct call *a, struct call *b, const char *policy,
                 const char *key, int status)
{
    static char extra[2][128];
    pthread_t ta, tb;
    long long before = h_stub_stat(&stub, "requests");

    memset(a, 0, sizeof *a);
    memset(b, 0, sizeof *b);
    snprintf(extra[0], sizeof extra[0],
             "X-Stub-Delay-Ms: %d\r\nX-Stub-Status: %d\r\n", HOLD_MS, status);
    *a = (struct call){.sidecar = 0, .extra = extra[0]};
    *b = (struct call){.sidecar = 1};
    snprintf(a->target, sizeof a->target, "/%s/jobs", policy);
    snprintf(b->target, sizeof b->target, "/%s/jobs", policy);
    snprintf(a->key, sizeof a->key, "%s", key);
    snprintf(b->key, sizeof b->key, "%s", key);
    pthread_create(&ta, NULL, post_thread, a);
    for (int i = 0; i < 400 && h_stub_stat(&stub, "requests") <= before; i++)
        usleep(1000);
    cr_assert_gt(h_stub_stat(&stub, "requests"), before, "the holder is at the partner");
    pthread_create(&tb, NULL, post_thread, b);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
}

/* sluice_store_notifications_total of sidecar i. */
static long long notices(int i)
{
    struct h_resp r = {0};
    long long n = -1;
    const char *p;

    if (h_http(sl[i].admin_port, "GET", "/metrics", "", NULL, 0, &r) == 0 && r.body &&
        (p = strstr(r.body, "\nsluice_store_notifications_total ")))
        n = atoll(p + strlen("\nsluice_store_notifications_total "));
    h_resp_free(&r);
    return n;
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;

    return a < b ? -1 : a > b;
}

#define KEYS 20

/* Over KEYS keys, how long after the holder's answer the duplicate's came
 * (ms; negative: before it): the median, and the largest into *worst.
 * Every duplicate is a replay of the holder's one upstream call. */
static double replay_lag(const char *policy, double *worst)
{
    double lag[KEYS];
    struct call a, b;
    char key[64];

    for (int i = 0; i < KEYS; i++) {
        snprintf(key, sizeof key, "fn-%s-%d", policy, i);
        pair(&a, &b, policy, key, 200);
        cr_expect_eq(a.r.status, 200, "%s: %s", key, a.r.body);
        cr_expect_eq(b.r.status, 200, "%s: the duplicate waited: %s", key, b.r.body);
        cr_expect_str_eq(h_header_str(&b.r, "Sluice-Outcome"), "replayed", "%s", key);
        cr_expect_eq(h_stub_key_stat(&stub, key, "side_effects"), 1, "%s: one call", key);
        lag[i] = b.done_ms - a.done_ms;
        h_resp_free(&a.r);
        h_resp_free(&b.r);
    }
    qsort(lag, KEYS, sizeof *lag, cmp_double);
    *worst = lag[KEYS - 1];
    return (lag[KEYS / 2 - 1] + lag[KEYS / 2]) / 2;
}

/* The fallback alone looks every 25 ms: its lag is spread over 0..25 ms
 * (median about 12.5). With the notice it is a publish and one look, about
 * a millisecond on loopback: well under 10 ms even on a loaded machine. */
static void expect_notified_lag(const char *policy)
{
    long long before = notices(1);
    double worst, median = replay_lag(policy, &worst);
    long long got = notices(1) - before;

    cr_log_info("policy %s: duplicate's answer after the holder's: median %.2f ms, "
                "worst %.2f ms; %lld notices on B", policy, median, worst, got);
    cr_expect_lt(median, 10.0, "median lag %.2f ms: not woken by the notice", median);
    cr_expect_geq(got, KEYS, "B was told of each key's end (%lld)", got);
}

Test(fleet_notify, a_duplicate_on_the_fleets_plan_is_replayed_at_the_holders_completion)
{
    expect_notified_lag("w");
}

Test(fleet_notify, a_duplicate_on_the_lookup_plan_is_replayed_at_the_holders_completion)
{
    expect_notified_lag("l");
}

Test(fleet_notify, a_known_failure_wakes_the_waiter_which_goes_first)
{
    long long before = notices(1);
    struct call a, b;

    pair(&a, &b, "w", "fn-release", 500);
    cr_expect_eq(a.r.status, 500, "%s", a.r.body);
    cr_expect_eq(b.r.status, 200, "the duplicate went on: %s", b.r.body);
    cr_expect_str_eq(h_header_str(&b.r, "Sluice-Outcome"), "ok");
    cr_expect_eq(h_stub_stat(&stub, "in_flight_max"), 1, "never two at once");
    cr_expect_geq(notices(1) - before, 1, "the release was announced");
    cr_log_info("after the release: the waiter's answer %.2f ms after the holder's",
                b.done_ms - a.done_ms);
    h_resp_free(&a.r);
    h_resp_free(&b.r);
}

/* A reload that adds a policy with duplicates: wait subscribes to its
 * channel too, and to the others still. */
Test(fleet_notify, a_reload_subscribes_to_the_new_set)
{
    char *cfg;
    struct h_resp r = {0};

    cr_assert_eq(subscribers("n"), 0);
    cr_assert(asprintf(&cfg, CONFIG_N, rs.port, stub.port) > 0);
    cr_assert_eq(h_sluice_rewrite(&sl[1], cfg), 0);
    free(cfg);
    cr_assert_eq(h_http(sl[1].admin_port, "POST", "/reload", NULL, "", 0, &r), 0);
    cr_expect_eq(r.status, 200, "%s", r.body);
    h_resp_free(&r);
    for (int i = 0; i < 100 && subscribers("n") != 1; i++)
        usleep(50 * 1000);
    cr_expect_eq(subscribers("n"), 1, "sidecar 1 listens for the new policy");
    cr_expect_eq(subscribers("w"), FLEET, "and still for the others");
    cr_expect_eq(subscribers("l"), FLEET);
}

Test(fleet_notify, with_the_subscriber_killed_waiters_poll_and_it_comes_back)
{
    struct call a, b;
    long long before;
    bool back;

    cr_assert(redis_server_cmd(&rs, "CLIENT KILL TYPE pubsub"));
    /* Right away, before any resubscribes: the fallback ends the wait. */
    pair(&a, &b, "w", "fn-killed", 200);
    cr_expect_eq(b.r.status, 200, "the duplicate waited: %s", b.r.body);
    cr_expect_str_eq(h_header_str(&b.r, "Sluice-Outcome"), "replayed");
    cr_expect_eq(h_stub_key_stat(&stub, "fn-killed", "side_effects"), 1);
    h_resp_free(&a.r);
    h_resp_free(&b.r);
    back = await_subscribed();
    cr_assert(back, "the sidecars subscribed again (w: %d, l: %d)", subscribers("w"),
              subscribers("l"));
    /* Waiters count on the notices again once the subscription is confirmed. */
    usleep(300 * 1000);
    before = notices(1);
    pair(&a, &b, "w", "fn-back", 200);
    cr_expect_eq(b.r.status, 200, "%s", b.r.body);
    cr_expect_str_eq(h_header_str(&b.r, "Sluice-Outcome"), "replayed");
    cr_expect_geq(notices(1) - before, 1, "notified again after the reconnect");
    h_resp_free(&a.r);
    h_resp_free(&b.r);
}
