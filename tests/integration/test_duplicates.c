/* idempotency.duplicates: wait (docs/contract.md §6) through the real sluice,
 * a real RocksDB store and the real stub: a duplicate that meets its key in
 * progress waits inside sluice for the holder's answer (the replay), goes on
 * as a first request when the holder's known failure freed the key, and gets
 * lease_held once its max_wait is up; never a second upstream call while
 * the first is out. */
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

static void start(void)
{
    char *cfg;

    cr_assert_eq(h_stub_start(&stub, NULL), 0);
    cr_assert(asprintf(&cfg,
        "upstreams: {stub: {url: http://127.0.0.1:%d}}\n"
        "policies:\n"
        "  w: {max_wait: 3s, idempotency: {duplicates: wait}}\n"
        "  short: {max_wait: 300ms, idempotency: {duplicates: wait}}\n"
        "  r: {max_wait: 3s, idempotency: {}}\n"
        "routes:\n"
        "  - {prefix: /w, upstream: stub, policy: w}\n"
        "  - {prefix: /short, upstream: stub, policy: short}\n"
        "  - {prefix: /r, upstream: stub, policy: r}\n",
        stub.port) > 0);
    cr_assert_eq(h_sluice_start(&sl, cfg), 0, "sluice did not start");
    free(cfg);
}

static void stop(void)
{
    h_sluice_cleanup(&sl);
    h_stub_stop(&stub);
}

TestSuite(dup, .init = start, .fini = stop, .timeout = 60);

struct call {
    const char *target, *key, *extra;
    struct h_resp r;
};

static int post(struct call *c)
{
    char hdr[512];

    snprintf(hdr, sizeof hdr, "Idempotency-Key: %s\r\n%s", c->key,
             c->extra ? c->extra : "");
    return h_http(sl.port, "POST", c->target, hdr, "job-body", 8, &c->r);
}

static void *post_thread(void *arg)
{
    post(arg);
    return NULL;
}

/* Starts the holder's request and returns once it is at the stub. */
static void start_holder(pthread_t *t, struct call *c)
{
    pthread_create(t, NULL, post_thread, c);
    for (int i = 0; i < 200 && h_stub_stat(&stub, "in_flight") < 1; i++)
        usleep(5000);
    cr_assert_eq(h_stub_stat(&stub, "in_flight"), 1, "the holder is at the partner");
}

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

Test(dup, a_duplicate_waits_for_the_holders_answer_and_gets_its_replay)
{
    struct call a = {.target = "/w/jobs", .key = "job-1", .extra = "X-Stub-Delay-Ms: 300\r\n"};
    struct call b = {.target = "/w/jobs", .key = "job-1", .extra = NULL};
    pthread_t t;

    start_holder(&t, &a);
    cr_assert_eq(post(&b), 0);
    pthread_join(t, NULL);
    cr_expect_eq(a.r.status, 200);
    cr_expect_eq(b.r.status, 200, "the duplicate waited: %s", b.r.body);
    cr_expect_str_eq(h_header_str(&b.r, "Sluice-Outcome"), "replayed");
    cr_expect_str_eq(h_header_str(&b.r, "Idempotent-Replayed"), "true");
    cr_expect(a.r.body_len == b.r.body_len && !memcmp(a.r.body, b.r.body, a.r.body_len),
              "the same body");
    cr_expect_str_eq(h_header_str(&b.r, "X-Stub-Seq"), "1");
    cr_expect_eq(h_stub_stat(&stub, "requests"), 1, "one upstream call");
    h_resp_free(&a.r);
    h_resp_free(&b.r);
}

Test(dup, a_holders_known_failure_lets_the_duplicate_go_as_a_first_request)
{
    struct call a = {.target = "/w/jobs", .key = "job-2", .extra = "X-Stub-Delay-Ms: 300\r\nX-Stub-Status: 500\r\n"};
    struct call b = {.target = "/w/jobs", .key = "job-2", .extra = NULL};
    pthread_t t;
    json_t *j;

    start_holder(&t, &a);
    cr_assert_eq(post(&b), 0);
    pthread_join(t, NULL);
    cr_expect_eq(a.r.status, 500, "the holder's 500, passed on and not stored (%s)", a.r.body);
    cr_expect_eq(b.r.status, 200, "the duplicate went on: %s", b.r.body);
    cr_expect_str_eq(h_header_str(&b.r, "Sluice-Outcome"), "ok");
    cr_expect_str_eq(h_header_str(&b.r, "X-Stub-Seq"), "2");
    cr_expect_eq(h_stub_stat(&stub, "requests"), 2);
    cr_expect_eq(h_stub_stat(&stub, "in_flight_max"), 1, "never two at once");
    h_resp_free(&a.r);
    h_resp_free(&b.r);
    cr_assert_eq(h_http(sl.admin_port, "GET", "/idempotency/w/job-2", NULL, NULL, 0, &b.r), 0);
    j = json_loads(b.r.body, 0, NULL);
    cr_expect_eq(json_integer_value(json_object_get(j, "attempt")), 2);
    json_decref(j);
    h_resp_free(&b.r);
}

Test(dup, a_holder_slower_than_max_wait_gets_lease_held)
{
    struct call a = {.target = "/short/jobs", .key = "job-3", .extra = "X-Stub-Delay-Ms: 1500\r\n"};
    struct call b = {.target = "/short/jobs", .key = "job-3", .extra = NULL};
    pthread_t t;
    double t0;
    json_t *j;

    start_holder(&t, &a);
    t0 = now_s();
    cr_assert_eq(post(&b), 0);
    cr_expect_geq(now_s() - t0, 0.28, "it waited its max_wait");
    cr_expect_lt(now_s() - t0, 1.2, "and no longer");
    cr_expect_eq(b.r.status, 409);
    j = json_loads(b.r.body, 0, NULL);
    cr_expect_str_eq(json_string_value(json_object_get(j, "reason")), "lease_held");
    json_decref(j);
    pthread_join(t, NULL);
    cr_expect_eq(a.r.status, 200);
    cr_expect_eq(h_stub_stat(&stub, "requests"), 1);
    h_resp_free(&a.r);
    h_resp_free(&b.r);
}

Test(dup, refuse_still_answers_lease_held_at_once)
{
    struct call a = {.target = "/r/jobs", .key = "job-4", .extra = "X-Stub-Delay-Ms: 500\r\n"};
    struct call b = {.target = "/r/jobs", .key = "job-4", .extra = NULL};
    pthread_t t;
    double t0;

    start_holder(&t, &a);
    t0 = now_s();
    cr_assert_eq(post(&b), 0);
    cr_expect_lt(now_s() - t0, 0.2);
    cr_expect_eq(b.r.status, 409);
    pthread_join(t, NULL);
    h_resp_free(&a.r);
    h_resp_free(&b.r);
}
