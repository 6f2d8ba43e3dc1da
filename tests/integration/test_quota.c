/* Following the partner's quota (docs/contract.md §12) through the real
 * sluice to the real stub advertising a fixed-window quota (--quota) in
 * each header style: sluice's rate is 10 x the quota, yet the partner
 * refuses (almost) nothing and most of the quota is used; GET /policies and
 * sluice_policy_rate show the followed rate. */
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

static struct h_stub stub;
static struct h_sluice sl;

static void stop(void)
{
    h_sluice_cleanup(&sl);
    h_stub_stop(&stub);
}

static long long now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

/* The stub allows 20 requests per 2 s window (10/s) in `style`; sluice's
 * policy says 100/s burst 10. */
static void start(const char *style, bool follow)
{
    const char *args[] = {"--quota", "20", "--quota-window", "2", "--quota-style", style,
                          NULL};
    char *cfg;

    cr_assert_eq(h_stub_start(&stub, args), 0);
    cr_assert(asprintf(&cfg,
        "log: {level: info, access: false}\n"
        "upstreams: {stub: {url: http://127.0.0.1:%d, max_connections: 64}}\n"
        "policies:\n"
        "  p:\n"
        "    rate: 100/s\n"
        "    burst: 10\n"
        "    max_wait: 10s\n"
        "%s"
        "routes:\n"
        "  - {prefix: /, upstream: stub, policy: p}\n", stub.port,
        follow ? "    quota: {follow: true, min_rate: 0.5/s}\n" : "") > 0);
    cr_assert_eq(h_sluice_start(&sl, cfg), 0, "sluice did not start");
    free(cfg);
}

struct load {
    long long until_ms;
    int ok, refused, other;
};

static void *client(void *arg)
{
    struct load *l = arg;

    while (now_ms() < l->until_ms) {
        struct h_resp r;

        if (h_http(sl.port, "GET", "/w", NULL, NULL, 0, &r) == 0 && r.status == 200)
            __atomic_add_fetch(&l->ok, 1, __ATOMIC_RELAXED);
        else if (r.status == 429)
            __atomic_add_fetch(&l->refused, 1, __ATOMIC_RELAXED);
        else
            __atomic_add_fetch(&l->other, 1, __ATOMIC_RELAXED);
        h_resp_free(&r);
    }
    return NULL;
}

/* 16 clients for 5 s: about 3 windows of 20. */
static void run_load(struct load *l)
{
    pthread_t t[16];

    l->until_ms = now_ms() + 5000;
    for (int i = 0; i < 16; i++)
        pthread_create(&t[i], NULL, client, l);
    for (int i = 0; i < 16; i++)
        pthread_join(t[i], NULL);
}

static json_t *admin_json(const char *path)
{
    struct h_resp r;
    json_t *j;

    cr_assert_eq(h_http(sl.admin_port, "GET", path, NULL, NULL, 0, &r), 0);
    cr_assert_eq(r.status, 200, "%s: %d", path, r.status);
    j = json_loads(r.body, 0, NULL);
    cr_assert_not_null(j, "%s: %s", path, r.body);
    h_resp_free(&r);
    return j;
}

/* min_used: at least this many of the about 60-80 the quota allows; the
 * X- style's reset is whole Unix seconds, which moves a 2 s window's end by
 * up to a second, so it gets a lower floor (0.81 of the quota in quota.sh). */
static void follows(const char *style, long long min_used)
{
    struct load l = {0};
    long long refused, accepted;
    json_t *j, *p;
    struct h_resp r;

    start(style, true);
    run_load(&l);
    refused = h_stub_stat(&stub, "quota_refused");
    accepted = h_stub_stat(&stub, "accepted");
    /* The first responses teach sluice the quota: nothing is refused. */
    cr_expect_leq(refused, 1, "%s: the partner refused %lld", style, refused);
    /* 5 s spans 3 windows and part of a 4th: at most 80, at least 60 whole. */
    cr_expect_geq(accepted, min_used, "%s: only %lld of the quota used", style, accepted);
    cr_expect_eq(l.other, 0, "%s: %d answers neither 200 nor 429", style, l.other);
    j = admin_json("/policies");
    p = json_object_get(json_object_get(j, "policies"), "p");
    cr_assert_not_null(p);
    cr_expect(json_is_true(json_object_get(p, "follow")));
    cr_expect_eq(json_real_value(json_object_get(p, "rate")), 100);
    cr_expect_lt(json_number_value(json_object_get(p, "effective_rate")), 100,
                 "%s: the rate followed nothing", style);
    cr_expect_str_eq(json_string_value(json_object_get(p, "source")), "partner");
    cr_expect_eq(json_array_size(json_object_get(json_object_get(p, "advertised"), "items")),
                 1, "%s: advertised %s", style, json_dumps(p, 0));
    json_decref(j);
    cr_assert_eq(h_http(sl.admin_port, "GET", "/metrics", NULL, NULL, 0, &r), 0);
    cr_expect(r.body && strstr(r.body, "sluice_policy_rate{policy=\"p\"} "));
    cr_expect(!(r.body && strstr(r.body, "sluice_policy_rate{policy=\"p\"} 100\n")),
              "the gauge shows the configured rate");
    h_resp_free(&r);
}

Test(quota, follows_the_draft_headers, .fini = stop, .timeout = 60)
{
    follows("draft", 54);
}

Test(quota, follows_the_older_draft_headers, .fini = stop, .timeout = 60)
{
    follows("old", 54);
}

Test(quota, follows_the_x_ratelimit_headers, .fini = stop, .timeout = 60)
{
    follows("x", 44);
}

/* The same run without quota.follow: each window ends in 429s (each a
 * cooldown from its reset hint, and a requeue for the worker), so the
 * assertions above could fail. */
Test(quota, without_follow_the_partner_refuses, .fini = stop, .timeout = 60)
{
    struct load l = {0};
    json_t *j, *p;

    start("draft", false);
    run_load(&l);
    long long refused = h_stub_stat(&stub, "quota_refused");

    cr_expect_geq(refused, 3, "refused %lld: one 429 a window at least", refused);
    j = admin_json("/policies");
    p = json_object_get(json_object_get(j, "policies"), "p");
    cr_expect_str_eq(json_string_value(json_object_get(p, "source")), "config");
    cr_expect(json_is_null(json_object_get(p, "advertised")));
    cr_expect_eq(json_number_value(json_object_get(p, "effective_rate")), 100);
    json_decref(j);
}

/* A partitioned policy: GET /policies lists each live partition with the
 * numbers its own bucket follows (most recently used first). */
Test(quota, get_policies_shows_each_partition_it_follows, .fini = stop, .timeout = 30)
{
    const char *args[] = {"--quota", "20", "--quota-window", "2", "--quota-style", "draft",
                          NULL};
    const char *tenants[] = {"acme", "globex"};
    json_t *j, *p, *parts, *first;
    struct h_resp r;
    char *cfg, hdr[64];

    cr_assert_eq(h_stub_start(&stub, args), 0);
    cr_assert(asprintf(&cfg,
        "upstreams: {stub: {url: http://127.0.0.1:%d}}\n"
        "policies:\n"
        "  p: {rate: 100/s, burst: 10, max_wait: 10s, quota: {follow: true},\n"
        "      partition: {header: X-Tenant, max: 100}}\n"
        "routes:\n"
        "  - {prefix: /, upstream: stub, policy: p}\n", stub.port) > 0);
    cr_assert_eq(h_sluice_start(&sl, cfg), 0, "sluice did not start");
    free(cfg);
    for (int i = 0; i < 2; i++) {
        snprintf(hdr, sizeof hdr, "X-Tenant: %s\r\n", tenants[i]);
        cr_assert_eq(h_http(sl.port, "GET", "/w", hdr, NULL, 0, &r), 0);
        cr_expect_eq(r.status, 200);
        h_resp_free(&r);
    }
    j = admin_json("/policies");
    p = json_object_get(json_object_get(j, "policies"), "p");
    cr_assert_not_null(p);
    parts = json_object_get(p, "partitions");
    cr_assert(json_is_array(parts), "no partitions: %s", json_dumps(p, 0));
    cr_expect_eq(json_array_size(parts), 2);
    cr_expect_eq(json_integer_value(json_object_get(p, "partitions_live")), 2);
    first = json_array_get(parts, 0);
    cr_expect_str_eq(json_string_value(json_object_get(first, "name")), "globex",
                     "most recently used first");
    for (size_t i = 0; i < json_array_size(parts); i++) {
        json_t *e = json_array_get(parts, i);

        cr_expect_lt(json_number_value(json_object_get(e, "effective_rate")), 100,
                     "partition %zu follows nothing", i);
        cr_expect_str_eq(json_string_value(json_object_get(e, "source")), "partner");
        cr_expect(json_is_object(json_object_get(e, "advertised")));
    }
    json_decref(j);
}
