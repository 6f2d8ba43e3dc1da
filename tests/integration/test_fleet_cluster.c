/* Fleet mode on a Redis Cluster (docs/contract.md §10, "Managed Redis and
 * Redis Cluster"): three real primaries, each with a real replica, and two
 * real sluices given one seed each, in front of one real stub. Policies
 * whose hash tags land on different primaries: each policy's records live
 * on the owner of its slot; the shared bucket's bound, replay across
 * sidecars and a single side effect for concurrent duplicates hold per
 * policy; a slot moved between primaries with requests flowing (ASK while
 * it migrates, MOVED after) and a primary failed over (CLUSTER FAILOVER,
 * then kill -9 of a primary and its replica's promotion) are followed
 * without restarting sluice, and no key reaches the upstream twice nor
 * loses its completion. While a primary is down, its policies answer
 * store_unavailable and the others go on; /readyz and sluice_store_up say
 * so. Every wait is bounded; servers are stopped by their pid. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "integration/harness.h"
#include "support/cluster_server.h"

#define PAIR 2
#define CANDIDATES 12

static struct cluster_server cl;
static struct h_stub stub;
static struct h_sluice sl[PAIR];
/* Two policy names whose tags land on different primaries. */
static char pol[2][16];
static int owner[2];

static void pair_stop(void)
{
    for (int i = 0; i < PAIR; i++)
        h_sluice_cleanup(&sl[i]);
    h_stub_stop(&stub);
    cluster_server_destroy(&cl);
}

static void pick_policies(void)
{
    char name[16];
    int first = -1;

    for (int i = 0; i < CANDIDATES; i++) {
        int o;

        snprintf(name, sizeof name, "p%d", i);
        o = cluster_server_owner(&cl, name);
        if (o < 0)
            continue;
        if (first < 0) {
            first = o;
            snprintf(pol[0], sizeof pol[0], "%s", name);
            owner[0] = o;
        } else if (o != first) {
            snprintf(pol[1], sizeof pol[1], "%s", name);
            owner[1] = o;
            return;
        }
    }
    pair_stop();
    cr_assert_fail("no two policy names on different primaries");
}

static const char *store_extra = "";

static void start_pair(void)
{
    char *cfg;

    cr_assert_eq(cluster_server_start(&cl, 3, true), 0,
                 "the redis cluster did not start");
    pick_policies();
    if (h_stub_start(&stub, NULL) != 0) {
        pair_stop();
        cr_assert_fail("the stub did not start");
    }
    /* Each sidecar knows one seed: the rest comes from the slot map. */
    for (int i = 0; i < PAIR; i++) {
        cr_assert(asprintf(&cfg,
            "store: {backend: redis, url: \"redis://127.0.0.1:%u/0\", cluster: true,\n"
            "        nodes: [\"127.0.0.1:%u\"], timeout: 500ms, fleet_size: %d%s}\n"
            "upstreams: {stub: {url: http://127.0.0.1:%d, timeout: 5s}}\n"
            "policies:\n"
            "  %s: {rate: 20/s, burst: 2, max_wait: 30s, shared: redis,\n"
            "        idempotency: {required: false, lease: 10s}}\n"
            "  %s: {rate: 200/s, burst: 50, max_wait: 30s, shared: redis,\n"
            "        idempotency: {required: false, lease: 10s}}\n"
            "  w: {rate: 200/s, burst: 50, max_wait: 5s, shared: redis,\n"
            "      idempotency: {required: false, lease: 10s, duplicates: wait}}\n"
            "routes:\n"
            "  - {prefix: /a, upstream: stub, policy: %s}\n"
            "  - {prefix: /b, upstream: stub, policy: %s}\n"
            "  - {prefix: /w, upstream: stub, policy: w}\n",
            cl.srv[i].port, cl.srv[i + 1].port, PAIR, store_extra, stub.port, pol[0], pol[1],
            pol[0], pol[1]) > 0);
        if (h_sluice_start(&sl[i], cfg) != 0) {
            free(cfg);
            pair_stop();
            cr_assert_fail("sluice %d did not start", i);
        }
        free(cfg);
    }
}

TestSuite(cluster, .init = start_pair, .fini = pair_stop, .timeout = 180);

static void start_pair_ack(void)
{
    store_extra = ", replicas_ack: 1";
    start_pair();
}

TestSuite(cluster_ack, .init = start_pair_ack, .fini = pair_stop, .timeout = 120);

static uint64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* POST path with key through sluice i; the status (0: no answer), and
 * whether it was a replay. */
static int post_key(int i, const char *path, const char *key, bool *replayed)
{
    struct h_resp r;
    char hdr[256], *v;
    int status;

    snprintf(hdr, sizeof hdr, "Idempotency-Key: %s\r\n", key);
    if (h_http(sl[i].port, "POST", path, hdr, "x", 1, &r) != 0)
        return 0;
    status = r.status;
    v = h_header(&r, "Idempotent-Replayed");
    if (replayed)
        *replayed = v && !strcmp(v, "true");
    free(v);
    h_resp_free(&r);
    return status;
}

static bool body_has(int port, const char *path, const char *text)
{
    struct h_resp r = {0};
    bool has = h_http(port, "GET", path, NULL, NULL, 0, &r) == 0 && r.body &&
               strstr(r.body, text);

    if (r.status)
        h_resp_free(&r);
    return has;
}

/* Whether key `sluice:{policy}:k:key` is stored on srv[i] (a primary or a
 * replica). */
static bool stored_on(int i, const char *policy, const char *key)
{
    struct timeval tv = {1, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", (int)cl.srv[i].port, tv);
    redisReply *ro = c && !c->err ? redisCommand(c, "READONLY") : NULL; /* a replica too */
    redisReply *r = c && !c->err
                        ? redisCommand(c, "EXISTS sluice:{%s}:k:%s", policy, key)
                        : NULL;

    freeReplyObject(ro);
    bool yes = r && r->type == REDIS_REPLY_INTEGER && r->integer == 1;

    freeReplyObject(r);
    if (c)
        redisFree(c);
    return yes;
}

Test(cluster, each_policy_on_its_primary_replayed_across_sidecars)
{
    const char *path[2] = {"/a/orders", "/b/orders"};
    bool replayed = false;
    char admin[96];

    cr_assert_neq(owner[0], owner[1]);
    for (int p = 0; p < 2; p++) {
        char key[32];

        snprintf(key, sizeof key, "cl-replay-%d", p);
        cr_expect_eq(post_key(0, path[p], key, &replayed), 200);
        cr_expect(!replayed);
        cr_expect_eq(post_key(1, path[p], key, &replayed), 200);
        cr_expect(replayed, "%s: replayed by the other sidecar", pol[p]);
        cr_expect_eq(h_stub_key_stat(&stub, key, "side_effects"), 1);
        cr_expect(stored_on(owner[p], pol[p], key), "%s's record on the owner of "
                  "its slot (server %d)", pol[p], owner[p]);
        cr_expect(!stored_on(owner[1 - p], pol[p], key), "and not on the other");
        /* The admin's blocking calls are routed by slot too. */
        snprintf(admin, sizeof admin, "/idempotency/%s/%s", pol[p], key);
        cr_expect(body_has(sl[1].admin_port, admin, "\"completed\""),
                  "read through the admin port");
    }
    cr_expect(body_has(sl[0].admin_port, "/readyz", "\"ready\": true"));
}

struct dup {
    int sidecar;
    const char *path, *key;
    int status;
};

static void *send_dup(void *arg)
{
    struct dup *d = arg;

    d->status = post_key(d->sidecar, d->path, d->key, NULL);
    return NULL;
}

#define DUPS 16

Test(cluster, concurrent_duplicates_reach_the_upstream_once_and_the_bound_holds)
{
    pthread_t t[DUPS];
    struct dup d[DUPS];
    char keys[DUPS][32];
    uint64_t t0;

    for (int i = 0; i < DUPS; i++) {
        d[i] = (struct dup){i % PAIR, "/b/orders", "cl-dup", 0};
        pthread_create(&t[i], NULL, send_dup, &d[i]);
    }
    for (int i = 0; i < DUPS; i++)
        pthread_join(t[i], NULL);
    cr_expect_eq(h_stub_key_stat(&stub, "cl-dup", "side_effects"), 1,
                 "one side effect for the fleet");
    /* The shared bucket (20/s, burst 2) over both sidecars: 12 distinct
     * keys start no faster than burst + rate x t. */
    t0 = now_ms();
    for (int i = 0; i < 12; i++) {
        snprintf(keys[i], sizeof keys[i], "cl-rate-%d", i);
        d[i] = (struct dup){i % PAIR, "/a/orders", keys[i], 0};
        pthread_create(&t[i], NULL, send_dup, &d[i]);
    }
    for (int i = 0; i < 12; i++) {
        pthread_join(t[i], NULL);
        cr_expect_eq(d[i].status, 200);
    }
    cr_expect_geq(now_ms() - t0, 450, "12 permits at 20/s with burst 2 take >= 0.5 s "
                  "across the fleet (took %llu ms)", (unsigned long long)(now_ms() - t0));
}

/* Keyed requests sent one after another, alternating sidecars, until stop. */
struct flow {
    const char *path, *prefix;
    atomic_bool stop;
    int n, ok, unavailable, other;
};

static void *flow_run(void *arg)
{
    struct flow *f = arg;
    char key[48];

    while (!atomic_load(&f->stop) && f->n < 2000) {
        int s;

        snprintf(key, sizeof key, "%s-%d", f->prefix, f->n);
        s = post_key(f->n % PAIR, f->path, key, NULL);
        f->n++;
        if (s == 200)
            f->ok++;
        else if (s == 503)
            f->unavailable++;
        else
            f->other++;
        usleep(5 * 1000);
    }
    return NULL;
}

/* No key reached the upstream twice; every one answered 200 is replayed
 * (its completion is not lost); none answered 503 was forwarded. */
static void check_flow(struct flow *f)
{
    int twice = 0, lost = 0;
    char key[48];

    for (int i = 0; i < f->n; i++) {
        long long fx;
        bool replayed = false;
        int s;

        snprintf(key, sizeof key, "%s-%d", f->prefix, i);
        fx = h_stub_key_stat(&stub, key, "side_effects");
        if (fx > 1)
            twice++;
        if (fx == 1) {
            s = post_key((i + 1) % PAIR, f->path, key, &replayed);
            if (s != 200 || !replayed)
                lost++;
        }
    }
    cr_expect_eq(twice, 0, "%d keys reached the upstream twice", twice);
    cr_expect_eq(lost, 0, "%d completions not replayed", lost);
    cr_expect_eq(f->other, 0, "%d answers neither 200 nor 503", f->other);
}

static struct flow *flow_start(pthread_t *t, const char *path, const char *prefix)
{
    struct flow *f = calloc(1, sizeof *f);

    f->path = path;
    f->prefix = prefix;
    pthread_create(t, NULL, flow_run, f);
    return f;
}

static void flow_stop(pthread_t t, struct flow *f)
{
    atomic_store(&f->stop, true);
    pthread_join(t, NULL);
    cr_log_info("%s: %d requests, %d answered 200, %d store_unavailable", f->prefix,
                f->n, f->ok, f->unavailable);
}

Test(cluster, a_slot_moved_mid_run)
{
    int slot = cluster_server_keyslot(&cl, pol[1]);
    int to = owner[0]; /* the other policy's primary */
    pthread_t t;
    struct flow *f;

    cr_assert_geq(slot, 0);
    f = flow_start(&t, "/b/orders", "cl-move");
    usleep(500 * 1000);
    /* Slowly, so that requests meet the slot half moved (ASK). */
    cr_assert(cluster_server_move_slot(&cl, (unsigned)slot, owner[1], to, 20),
              "the slot did not move");
    usleep(1000 * 1000);
    flow_stop(t, f);
    cr_expect_gt(f->ok, 50, "%d of %d answered 200", f->ok, f->n);
    cr_expect_leq(f->unavailable, f->n / 10, "%d of %d store_unavailable",
                  f->unavailable, f->n);
    check_flow(f);
    cr_expect(stored_on(to, pol[1], "cl-move-0"), "the keys moved with the slot");
    free(f);
}

/* The replica of srv[i] (a primary at the start). */
static int replica_of(int i)
{
    return i < (int)cl.n ? i + (int)cl.n : i - (int)cl.n;
}

Test(cluster, a_primary_failed_over_without_a_restart)
{
    int r = replica_of(owner[1]);
    pthread_t t;
    struct flow *f = flow_start(&t, "/b/orders", "cl-fo");

    usleep(500 * 1000);
    cr_assert(cluster_server_failover(&cl, r, 15000), "CLUSTER FAILOVER did not finish");
    usleep(1500 * 1000);
    flow_stop(t, f);
    cr_expect_gt(f->ok, 50, "%d of %d answered 200", f->ok, f->n);
    check_flow(f);
    cr_expect(stored_on(r, pol[1], "cl-fo-0"), "the promoted replica serves the slot");
    free(f);
}

/* The value of a label-less metric on sluice i, or -1. */
static long long metric(int i, const char *name)
{
    struct h_resp r = {0};
    char needle[128];
    const char *p;
    long long v = -1;

    snprintf(needle, sizeof needle, "\n%s ", name);
    if (h_http(sl[i].admin_port, "GET", "/metrics", NULL, NULL, 0, &r) != 0)
        return -1;
    if (r.body && (p = strstr(r.body, needle)))
        v = strtoll(p + strlen(needle), NULL, 10);
    h_resp_free(&r);
    return v;
}

Test(cluster, a_primary_killed_its_policies_wait_the_others_go_on)
{
    char key[48];
    uint64_t t0;
    int s = 0, n = 0;
    bool unavailable = false, ready_down = false;

    uint64_t killed = now_ms();

    redis_server_kill(&cl.srv[owner[1]]);
    /* Until its replica is promoted: pol[1] answers store_unavailable (never
     * forwarded), pol[0] goes on. */
    t0 = now_ms();
    while (now_ms() - t0 < 1500) {
        snprintf(key, sizeof key, "cl-kill-a-%d", n);
        cr_expect_eq(post_key(n % PAIR, "/a/orders", key, NULL), 200,
                     "the other primary's policy goes on");
        snprintf(key, sizeof key, "cl-kill-b-%d", n++);
        if ((s = post_key(0, "/b/orders", key, NULL)) == 503) {
            unavailable = true;
            cr_expect_eq(h_stub_key_stat(&stub, key, "side_effects"), 0);
        }
        if (!ready_down && body_has(sl[0].admin_port, "/readyz", "store_unavailable"))
            ready_down = metric(0, "sluice_store_up") == 0;
        usleep(50 * 1000);
    }
    cr_expect(unavailable, "the killed primary's policy saw store_unavailable");
    cr_expect(ready_down, "/readyz and sluice_store_up said the store is down");
    /* The replica is promoted (node timeout 1 s): followed within 5 s of it. */
    t0 = now_ms();
    for (s = 0; s != 200 && now_ms() - t0 < 15000; usleep(100 * 1000)) {
        snprintf(key, sizeof key, "cl-kill-b-%d", n++);
        s = post_key(1, "/b/orders", key, NULL);
    }
    cr_expect_eq(s, 200, "served again after the promotion, without a restart");
    cr_log_info("served again %llu ms after the kill -9 (node timeout 1 s)",
                (unsigned long long)(now_ms() - killed));
    cr_expect(cluster_server_wait_ok(&cl, 10000));
    t0 = now_ms();
    while (!body_has(sl[0].admin_port, "/readyz", "\"ready\": true") && now_ms() - t0 < 5000)
        usleep(100 * 1000);
    cr_expect(body_has(sl[0].admin_port, "/readyz", "\"ready\": true"), "ready again");
    cr_expect_eq(metric(0, "sluice_store_up"), 1);
}

struct timed_post {
    int sidecar;
    const char *key, *extra;
    int status;
    bool replayed;
    uint64_t done_ms;
};

static void *timed_post(void *arg)
{
    struct timed_post *t = arg;
    struct h_resp r;
    char hdr[256], *v;

    snprintf(hdr, sizeof hdr, "Idempotency-Key: %s\r\n%s", t->key, t->extra ? t->extra : "");
    if (h_http(sl[t->sidecar].port, "POST", "/w/jobs", hdr, "x", 1, &r) == 0) {
        t->status = r.status;
        v = h_header(&r, "Idempotent-Replayed");
        t->replayed = v && !strcmp(v, "true");
        free(v);
        h_resp_free(&r);
    }
    t->done_ms = now_ms();
    return NULL;
}

/* duplicates: wait on a cluster: both sidecars SSUBSCRIBE to the policy's
 * channel on the primary of its slot, and a duplicate through sidecar 1 of
 * a request held through sidecar 0 ends on the SPUBLISH of its completion,
 * not at its 25 ms look: notified once per key, its answer within a few ms
 * of the holder's. */
Test(cluster, a_waiting_duplicate_ends_on_the_sharded_notice)
{
    long long before;
    uint64_t worst = 0;
    char key[32];

    for (int i = 0; i < 100 && metric(1, "sluice_store_notifications_total") < 0; i++)
        usleep(50 * 1000);
    usleep(300 * 1000); /* the subscriptions confirmed (SSUBSCRIBE at start-up) */
    before = metric(1, "sluice_store_notifications_total");
    for (int k = 0; k < 5; k++) {
        struct timed_post a = {.sidecar = 0, .extra = "X-Stub-Delay-Ms: 150\r\n"};
        struct timed_post b = {.sidecar = 1};
        long long seen = h_stub_stat(&stub, "requests");
        pthread_t ta, tb;

        snprintf(key, sizeof key, "cl-wait-%d", k);
        a.key = b.key = key;
        pthread_create(&ta, NULL, timed_post, &a);
        for (int i = 0; i < 400 && h_stub_stat(&stub, "requests") <= seen; i++)
            usleep(1000);
        pthread_create(&tb, NULL, timed_post, &b);
        pthread_join(ta, NULL);
        pthread_join(tb, NULL);
        cr_expect_eq(a.status, 200);
        cr_expect_eq(b.status, 200);
        cr_expect(b.replayed, "%s: the duplicate got the holder's replay", key);
        cr_expect_eq(h_stub_key_stat(&stub, key, "side_effects"), 1);
        if (b.done_ms > a.done_ms && b.done_ms - a.done_ms > worst)
            worst = b.done_ms - a.done_ms;
    }
    cr_expect_geq(metric(1, "sluice_store_notifications_total") - before, 5,
                  "each key's end announced on the sharded channel");
    cr_log_info("cluster: the duplicates' answers at most %llu ms after the holders'",
                (unsigned long long)worst);
}

/* replicas_ack: 1 on a cluster: each completion WAITs on the primary that
 * took it, so its replica has the record when the worker is answered. */
Test(cluster_ack, a_completion_waits_for_the_replica_of_its_primary)
{
    const char *path[2] = {"/a/orders", "/b/orders"};
    char key[32];

    for (int p = 0; p < 2; p++)
        for (int i = 0; i < 5; i++) {
            snprintf(key, sizeof key, "cl-ack-%d-%d", p, i);
            cr_expect_eq(post_key(i % PAIR, path[p], key, NULL), 200);
            cr_expect(stored_on(replica_of(owner[p]), pol[p], key),
                      "%s on the replica of its primary once answered", key);
        }
    for (int i = 0; i < PAIR; i++)
        cr_expect_eq(metric(i, "sluice_store_replication_timeouts_total"), 0,
                     "every completion confirmed by a replica");
}
