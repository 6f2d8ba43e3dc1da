/* Lanes (docs/contract.md §13) through the real sluice to the real stub: a
 * batch backlog saturating the policy while interactive requests join; the
 * shares, the interactive wait, the bound; the lane header and its 400; a
 * worker leaving its lane; a reload that keeps the waiters. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
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

static const char lanes_policy[] =
    "policies:\n"
    "  p:\n"
    "    rate: 20/s\n"
    "    burst: 2\n"
    "    max_wait: 10s\n"
    "    lanes:\n"
    "      - { name: interactive, share: 30%, max_wait: 2s }\n"
    "      - { name: batch, share: 70%, max_wait: 30s }\n";

static char *config(const char *policies)
{
    char *cfg;

    cr_assert(asprintf(&cfg,
        "log: {level: info, access: true}\n"
        "upstreams: {stub: {url: http://127.0.0.1:%d, max_connections: 256}}\n"
        "%s"
        "routes:\n"
        "  - {prefix: /click, upstream: stub, policy: p, lane: interactive}\n"
        "  - {prefix: /sync, upstream: stub, policy: p}\n", stub.port, policies) > 0);
    return cfg;
}

static void start(const char *policies)
{
    char *cfg;

    cr_assert_eq(h_stub_start(&stub, NULL), 0);
    cfg = config(policies);
    cr_assert_eq(h_sluice_start(&sl, cfg), 0, "sluice did not start");
    free(cfg);
}

static long long now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

/* ---- two lanes under load --------------------------------------------------- */

struct client {
    const char *target;
    const char *headers;
    long long from_ms, until_ms;    /* runs from .. until */
    long long count_from, count_until; /* answers counted in this window */
    int ok, other, counted;
    long long max_wait_ms, waits[256];
    int n_waits;
};

static void *run_client(void *arg)
{
    struct client *c = arg;

    while (now_ms() < c->from_ms)
        usleep(1000);
    while (now_ms() < c->until_ms) {
        struct h_resp r;
        long long t0 = now_ms(), t1;

        if (h_http(sl.port, "POST", c->target, c->headers, "j", 1, &r) == 0 &&
            r.status == 200)
            c->ok++;
        else
            c->other++;
        h_resp_free(&r);
        t1 = now_ms();
        if (t1 - t0 > c->max_wait_ms)
            c->max_wait_ms = t1 - t0;
        if (c->n_waits < 256)
            c->waits[c->n_waits++] = t1 - t0;
        if (t1 >= c->count_from && t1 < c->count_until)
            c->counted++;
    }
    return NULL;
}

static int cmp_ll(const void *a, const void *b)
{
    long long x = *(const long long *)a, y = *(const long long *)b;

    return (x > y) - (x < y);
}

/* 32 batch clients saturate 20/s; 4 interactive clients join after 1.5 s:
 * while both lanes have requests waiting, interactive gets 30 % of the
 * permits (6/s), each interactive request waits about its own lane's queue
 * (4 / 6 s) and not the batch backlog (32 / 20 s, growing), and no window
 * sees more than burst + rate x t starts at the stub. */
Test(lanes, interactive_joins_a_saturating_batch_and_gets_its_share, .fini = stop,
     .timeout = 60)
{
    enum { NB = 32, NI = 4 };
    static struct client b[NB], in[NI];
    static long long at[2048];
    pthread_t tb[NB], ti[NI];
    long long t0, batch_waits[NB * 256];
    int counted_b = 0, counted_i = 0, nbw = 0;
    struct h_resp r;
    json_t *arr;
    size_t n;

    start(lanes_policy);
    t0 = now_ms() + 200;
    for (int i = 0; i < NB; i++) {
        b[i] = (struct client){.target = "/sync", .from_ms = t0, .until_ms = t0 + 5000,
                               .count_from = t0 + 2500, .count_until = t0 + 4500};
        pthread_create(&tb[i], NULL, run_client, &b[i]);
    }
    for (int i = 0; i < NI; i++) {
        in[i] = (struct client){.target = "/click", .from_ms = t0 + 1500,
                                .until_ms = t0 + 4500, .count_from = t0 + 2500,
                                .count_until = t0 + 4500};
        pthread_create(&ti[i], NULL, run_client, &in[i]);
    }
    for (int i = 0; i < NI; i++)
        pthread_join(ti[i], NULL);
    for (int i = 0; i < NB; i++)
        pthread_join(tb[i], NULL);
    for (int i = 0; i < NB; i++) {
        counted_b += b[i].counted;
        cr_expect_eq(b[i].other, 0, "batch client %d: %d not 200", i, b[i].other);
        for (int k = 0; k < b[i].n_waits; k++)
            batch_waits[nbw++] = b[i].waits[k];
    }
    for (int i = 0; i < NI; i++) {
        counted_i += in[i].counted;
        cr_expect_eq(in[i].other, 0, "interactive client %d: %d not 200", i, in[i].other);
        /* 4 in its lane at 6/s: 0.67 s, plus an interval and scheduling. */
        cr_expect_leq(in[i].max_wait_ms, 1100, "interactive waited %lld ms",
                      in[i].max_wait_ms);
    }
    {
        double share = (double)counted_i / (counted_i + counted_b);

        cr_expect(share > 0.25 && share < 0.35, "interactive share %.3f (%d of %d)",
                  share, counted_i, counted_i + counted_b);
        cr_expect_gt(counted_i + counted_b, 34, "only %d permits in 2 s at 20/s",
                     counted_i + counted_b);
    }
    qsort(batch_waits, (size_t)nbw, sizeof *batch_waits, cmp_ll);
    cr_expect_gt(batch_waits[nbw / 2], 1000, "batch median wait %lld ms: no backlog?",
                 batch_waits[nbw / 2]);
    cr_assert_eq(h_http(stub.port, "GET", "/_stub/arrivals", NULL, NULL, 0, &r), 0);
    arr = json_loads(r.body, 0, NULL);
    h_resp_free(&r);
    cr_assert_not_null(arr);
    n = json_array_size(arr);
    cr_assert_lt(n, 2048);
    for (size_t i = 0; i < n; i++)
        at[i] = json_integer_value(json_array_get(arr, i));
    json_decref(arr);
    /* As test_pacing's bound: 0.6 T of slack for the stub's timestamps. */
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n && j < i + 200; j++) {
            double t_s = (double)(at[j] - at[i]) / 1e9 + 0.6 / 20;

            cr_assert_leq((double)(j - i + 1), 2 + 20 * t_s, "%zu starts in %.4f s",
                          j - i + 1, t_s);
        }
    cr_expect(h_file_contains(sl.log_path, "\"lane\":\"interactive\""));
    cr_expect(h_file_contains(sl.log_path, "\"lane\":\"batch\""));
}

/* ---- the lane header ---------------------------------------------------------- */

static bool metrics_have(const char *text)
{
    struct h_resp r;
    bool found;

    cr_assert_eq(h_http(sl.admin_port, "GET", "/metrics", NULL, NULL, 0, &r), 0);
    found = r.body && strstr(r.body, text);
    h_resp_free(&r);
    return found;
}

Test(lanes, the_header_picks_a_lane_and_an_unknown_one_is_a_400, .fini = stop,
     .timeout = 30)
{
    struct h_resp r;
    char *h;

    start(lanes_policy);
    cr_assert_eq(h_http(sl.port, "POST", "/sync", "Sluice-Lane:  interactive \r\n",
                        "a", 1, &r), 0);
    cr_expect_eq(r.status, 200);
    h_resp_free(&r);
    cr_assert_eq(h_http(sl.port, "POST", "/sync", "Sluice-Lane: urgent\r\n", "b", 1, &r), 0);
    cr_expect_eq(r.status, 400);
    h = h_header(&r, "Content-Type");
    cr_expect(h && !strcmp(h, "application/problem+json"), "%s", h ? h : "");
    free(h);
    h = h_header(&r, "Sluice-Outcome");
    cr_expect(h && !strcmp(h, "rejected"));
    free(h);
    cr_expect(r.body && strstr(r.body, "interactive, batch"), "%s", r.body);
    cr_expect(r.body && strstr(r.body, "urgent"), "%s", r.body);
    h_resp_free(&r);
    cr_expect_eq(h_stub_stat(&stub, "requests"), 1, "the 400 reached the stub");
    cr_expect(h_file_contains(sl.log_path, "\"lane\":\"interactive\""));
    cr_expect(metrics_have("sluice_permit_wait_seconds_count{policy=\"p\",lane=\"interactive\"} 1"),
              "the wait is not counted in its lane");
    cr_expect(!metrics_have("sluice_permit_wait_seconds_count{policy=\"p\",lane=\"batch\"} 1"),
              "counted in the route's lane, not the header's");
}

/* ---- leaving a lane, beyond max_wait, reloads --------------------------------- */

/* Sends a request and closes the connection after `ms`, unanswered. */
static void send_and_leave(const char *target, int ms)
{
    char req[256];
    int fd = h_connect(sl.port);

    cr_assert(fd >= 0);
    snprintf(req, sizeof req, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nb",
             target);
    cr_assert_eq(h_send_all(fd, req, strlen(req)), 0);
    usleep((useconds_t)ms * 1000);
    close(fd);
}

static const char slow_policy[] =
    "policies:\n"
    "  p:\n"
    "    rate: 1/s\n"
    "    max_wait: 10s\n"
    "    lanes:\n"
    "      - { name: interactive, share: 50%, max_wait: 1500ms }\n"
    "      - { name: batch, share: 50%, max_wait: 10s }\n";

struct one {
    const char *target;
    int status;
    long long ms;
    char reason[32];
};

static void *send_one(void *arg)
{
    struct one *o = arg;
    struct h_resp r;
    long long t0 = now_ms();
    json_t *j;

    if (h_http(sl.port, "POST", o->target, NULL, "x", 1, &r) == 0) {
        o->status = r.status;
        if (r.status != 200 && (j = json_loads(r.body ? r.body : "", 0, NULL))) {
            snprintf(o->reason, sizeof o->reason, "%s",
                     json_string_value(json_object_get(j, "reason")) ?: "");
            json_decref(j);
        }
    }
    o->ms = now_ms() - t0;
    h_resp_free(&r);
    return NULL;
}

Test(lanes, a_worker_that_leaves_its_lane_is_never_sent, .fini = stop, .timeout = 30)
{
    struct one o = {.target = "/sync"};
    pthread_t t;
    struct h_resp r;

    start(slow_policy);
    cr_assert_eq(h_http(sl.port, "POST", "/sync", NULL, "a", 1, &r), 0);
    cr_expect_eq(r.status, 200);
    h_resp_free(&r);
    send_and_leave("/sync", 300);      /* the keeper leaves */
    pthread_create(&t, NULL, send_one, &o);
    pthread_join(t, NULL);
    cr_expect_eq(o.status, 200, "the next waiter took over the timer");
    cr_expect_lt(o.ms, 1500, "waited %lld ms", o.ms);
    usleep(1200000);
    cr_expect_eq(h_stub_stat(&stub, "requests"), 2, "the abandoned request was sent");
    cr_expect(h_file_contains(sl.log_path, "\"status\":499"));
}

Test(lanes, a_lane_max_wait_refuses_with_the_predicted_delay, .fini = stop, .timeout = 30)
{
    struct one o[3] = {{.target = "/click"}, {.target = "/click"}, {.target = "/click"}};
    pthread_t t[3];
    struct h_resp r;

    start(slow_policy);
    cr_assert_eq(h_http(sl.port, "POST", "/click", NULL, "a", 1, &r), 0);
    h_resp_free(&r);
    /* Interactive alone at 1/s: the 2nd waits 1 s, the 3rd would wait 2 s,
     * beyond its lane's 1.5 s: refused at once. */
    for (int i = 0; i < 3; i++) {
        pthread_create(&t[i], NULL, send_one, &o[i]);
        usleep(100000);
    }
    for (int i = 0; i < 3; i++)
        pthread_join(t[i], NULL);
    cr_expect_eq(o[0].status, 200);
    cr_expect_eq(o[1].status, 429);
    cr_expect_str_eq(o[1].reason, "rate_limited");
    cr_expect_lt(o[1].ms, 300, "refused only after %lld ms", o[1].ms);
    cr_expect_eq(o[2].status, 429);
}

Test(lanes, a_reload_keeps_the_waiters, .fini = stop, .timeout = 30)
{
    static const char reshared[] =
        "policies:\n"
        "  p:\n"
        "    rate: 2/s\n"
        "    max_wait: 10s\n"
        "    lanes:\n"
        "      - { name: interactive, share: 20%, max_wait: 5s }\n"
        "      - { name: batch, share: 80%, max_wait: 10s }\n";
    struct one o[4];
    pthread_t t[4];
    struct h_resp r;
    char *cfg;

    start(slow_policy);
    cr_assert_eq(h_http(sl.port, "POST", "/sync", NULL, "a", 1, &r), 0);
    h_resp_free(&r);
    for (int i = 0; i < 4; i++) {
        o[i] = (struct one){.target = "/sync"};
        pthread_create(&t[i], NULL, send_one, &o[i]);
    }
    usleep(300000);
    cfg = config(reshared);
    cr_assert_eq(h_sluice_rewrite(&sl, cfg), 0);
    free(cfg);
    cr_assert_eq(h_http(sl.admin_port, "POST", "/reload", NULL, NULL, 0, &r), 0);
    cr_expect_eq(r.status, 200, "%s", r.body);
    h_resp_free(&r);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < 4; i++) {
        cr_expect_eq(o[i].status, 200, "waiter %d: %d %s", i, o[i].status, o[i].reason);
        /* At 1/s they would take 4 s; at the new 2/s about 2. */
        cr_expect_lt(o[i].ms, 3300, "waiter %d waited %lld ms", i, o[i].ms);
    }
    cr_expect_eq(h_stub_stat(&stub, "requests"), 5);
}

/* With concurrency too, a request takes its slot before it joins its lane,
 * and slots follow the lanes' shares: 16 batch clients keep the one slot
 * busy (100 ms a request), an interactive client joining waits about one
 * interactive turn (1 / (0.3 x 10/s)), not the 16 batch requests ahead of it
 * (1.6 s). */
Test(lanes, slots_follow_the_shares_too, .fini = stop, .timeout = 60)
{
    static const char one_slot[] =
        "policies:\n"
        "  p:\n"
        "    rate: 100/s\n"
        "    burst: 10\n"
        "    concurrency: 1\n"
        "    max_wait: 20s\n"
        "    lanes:\n"
        "      - { name: interactive, share: 30%, max_wait: 5s }\n"
        "      - { name: batch, share: 70%, max_wait: 20s }\n";
    enum { NB = 16 };
    static struct client b[NB], in;
    pthread_t tb[NB], ti;
    long long t0;

    start(one_slot);
    t0 = now_ms() + 200;
    for (int i = 0; i < NB; i++) {
        b[i] = (struct client){.target = "/sync", .headers = "X-Stub-Delay-Ms: 100\r\n",
                               .from_ms = t0, .until_ms = t0 + 5000};
        pthread_create(&tb[i], NULL, run_client, &b[i]);
    }
    in = (struct client){.target = "/click", .headers = "X-Stub-Delay-Ms: 100\r\n",
                         .from_ms = t0 + 2000, .until_ms = t0 + 4500};
    pthread_create(&ti, NULL, run_client, &in);
    pthread_join(ti, NULL);
    for (int i = 0; i < NB; i++)
        pthread_join(tb[i], NULL);
    cr_expect_eq(in.other, 0, "%d interactive answers not 200", in.other);
    cr_expect_geq(in.ok, 4, "only %d interactive answers in 2.5 s", in.ok);
    cr_expect_leq(in.max_wait_ms, 900, "interactive waited %lld ms", in.max_wait_ms);
    cr_expect_leq(h_stub_stat(&stub, "in_flight_max"), 1, "the slot was exceeded");
}
