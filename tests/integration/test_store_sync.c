/* store.sync: true (docs/contract.md §6) through the real sluice, a real
 * RocksDB store in a temp dir and the real stub: the request path's writes
 * are group-committed (one WAL sync for many), and still every answered key
 * replays after a kill -9 and a restart on the same store, and concurrent
 * duplicates reach the upstream once. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "integration/harness.h"
#include "support/testutil.h"

static struct h_stub stub;
static struct h_sluice sl;

static void start(void)
{
    char *cfg;

    sl.dir = tu_mkdtemp("store-sync");
    cr_assert_not_null(sl.dir);
    cr_assert_eq(h_stub_start(&stub, NULL), 0);
    cr_assert(asprintf(&cfg,
        "store: {path: %s/data, sync: true}\n"
        "upstreams: {stub: {url: http://127.0.0.1:%d}}\n"
        "policies:\n  p: {idempotency: {}}\n"
        "routes:\n  - {prefix: /p, upstream: stub, policy: p}\n",
        sl.dir, stub.port) > 0);
    cr_assert_eq(h_sluice_start(&sl, cfg), 0, "sluice did not start");
    free(cfg);
}

static void stop(void)
{
    h_sluice_cleanup(&sl);
    h_stub_stop(&stub);
}

TestSuite(store_sync, .init = start, .fini = stop, .timeout = 120);

static int post(const char *key, const char *extra, struct h_resp *r)
{
    char hdr[256];

    snprintf(hdr, sizeof hdr, "Idempotency-Key: %s\r\n%s", key,
             extra ? extra : "");
    return h_http(sl.port, "POST", "/p/items", hdr, key, strlen(key), r);
}

static char *outcome(const struct h_resp *r)
{
    return h_header(r, "Sluice-Outcome");
}

#define CLIENTS 16
#define PER_CLIENT 16

struct client {
    int id;
    int answered; /* 201 and forwarded */
};

static void *client_run(void *arg)
{
    struct client *c = arg;
    struct h_resp r;
    char key[32], *o;

    for (int i = 0; i < PER_CLIENT; i++) {
        snprintf(key, sizeof key, "sync-%d-%d", c->id, i);
        if (post(key, "X-Stub-Status: 201\r\n", &r) != 0)
            continue;
        o = outcome(&r);
        if (r.status == 201 && o && !strcmp(o, "ok"))
            c->answered++;
        free(o);
        h_resp_free(&r);
    }
    return NULL;
}

/* Every answer a worker saw was durable when it saw it: killed at once
 * after the last, sluice replays them all from the store. */
Test(store_sync, every_answered_key_replays_after_kill9)
{
    struct client cs[CLIENTS];
    pthread_t th[CLIENTS];
    struct h_resp r;
    char key[32], *o;
    int answered = 0;

    for (int i = 0; i < CLIENTS; i++) {
        cs[i] = (struct client){.id = i};
        cr_assert_eq(pthread_create(&th[i], NULL, client_run, &cs[i]), 0);
    }
    for (int i = 0; i < CLIENTS; i++) {
        pthread_join(th[i], NULL);
        answered += cs[i].answered;
    }
    cr_assert_eq(answered, CLIENTS * PER_CLIENT);
    kill(sl.pid, SIGKILL);
    waitpid(sl.pid, NULL, 0);
    sl.pid = 0;
    cr_assert_eq(h_sluice_start_raw(&sl, NULL, sl.port, sl.admin_port), 0,
                 "sluice did not restart on the same store");
    for (int i = 0; i < CLIENTS; i++)
        for (int j = 0; j < PER_CLIENT; j++) {
            snprintf(key, sizeof key, "sync-%d-%d", i, j);
            cr_assert_eq(post(key, NULL, &r), 0);
            o = outcome(&r);
            cr_expect_eq(r.status, 201, "%s: %d", key, r.status);
            cr_expect(o && !strcmp(o, "replayed"), "%s: %s", key, o ? o : "-");
            cr_expect_eq(r.body_len, strlen(key), "%s", key);
            free(o);
            h_resp_free(&r);
        }
    cr_expect_eq(h_stub_stat(&stub, "requests"), CLIENTS * PER_CLIENT,
                 "no key reached the upstream twice");
}

struct racer {
    int status;
    char outcome[32];
};

static void *race(void *arg)
{
    struct racer *rc = arg;
    struct h_resp r;
    char *o;

    if (post("race-key", "X-Stub-Delay-Ms: 200\r\n", &r) == 0) {
        o = outcome(&r);
        rc->status = r.status;
        snprintf(rc->outcome, sizeof rc->outcome, "%s", o ? o : "");
        free(o);
        h_resp_free(&r);
    }
    return NULL;
}

/* Leases and results read while their sync is pending: duplicates wait
 * for it and still see one holder. */
Test(store_sync, concurrent_duplicates_reach_the_upstream_once)
{
    struct racer rc[32] = {0};
    pthread_t t[32];
    int ok = 0, other = 0;

    for (int i = 0; i < 32; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, race, &rc[i]), 0);
    for (int i = 0; i < 32; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < 32; i++) {
        if (rc[i].status == 200 && !strcmp(rc[i].outcome, "ok"))
            ok++;
        else if ((rc[i].status == 409 && !strcmp(rc[i].outcome, "requeue")) ||
                 (rc[i].status == 200 && !strcmp(rc[i].outcome, "replayed")))
            other++;
        else
            cr_log_error("unexpected answer %d %s", rc[i].status, rc[i].outcome);
    }
    cr_expect_eq(ok, 1, "%d requests went through", ok);
    cr_expect_eq(ok + other, 32);
    cr_expect_eq(h_stub_key_stat(&stub, "race-key", "side_effects"), 1);
}
