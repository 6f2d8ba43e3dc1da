/* What a stage's unit test needs and nothing more: a loaded config, the
 * policies' pacing state, an env with a fake clock (the test says what time
 * it is), a fake exchange, and `run`, which does by hand what the driver
 * does with a row: wake it with a reason and read its verdict. No process,
 * socket, app or store unless the test opens one. A .h, not a .c:
 * tests/CMakeLists.txt makes a test of every .c under unit/. */
#ifndef SLUICE_TESTS_UNIT_PROXY_EXCHANGE_FIXTURE_H
#define SLUICE_TESTS_UNIT_PROXY_EXCHANGE_FIXTURE_H

#include <criterion/criterion.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <string.h>

#include "config/config.h"
#include "pacing/claims.h"
#include "pacing/pacing.h"
#include "proxy/exchange/stages.h"

#define MS 1000000ull
#define T0 (1000ull * 1000 * MS)

struct fake_clock {
    uint64_t mono_ns, wall_ms;
};

static uint64_t fake_mono(void *arg)
{
    return ((struct fake_clock *)arg)->mono_ns;
}

static uint64_t fake_wall(void *arg)
{
    return ((struct fake_clock *)arg)->wall_ms;
}

struct fixture {
    struct sc_config *cfg;
    struct pacing pacing;
    struct metrics metrics;
    struct metrics_ids ids;
    struct claims claims;
    atomic_long leases;
    struct freelist calls;
    struct fake_clock now;
    struct ex_clock clock;
    struct ex_env env;
};

static struct fixture fx;

static void fixture_up(const char *yaml)
{
    struct sc_errors errs = {0};

    memset(&fx, 0, sizeof fx);
    cr_assert_eq(evthread_use_pthreads(), 0);
    cr_assert_eq(config_load_string("t.yaml", yaml, strlen(yaml), &fx.cfg, &errs), 0,
                 "%s", errs.n ? errs.v[0].text : "");
    sc_errors_free(&errs);
    cr_assert_eq(pacing_init(&fx.pacing, fx.cfg, NULL), 0);
    cr_assert_eq(metrics_init(&fx.metrics, 1), 0);
    cr_assert_eq(metrics_ids_build(&fx.metrics, fx.cfg, &fx.ids), 0);
    cr_assert_eq(claims_init(&fx.claims), 0);
    freelist_init(&fx.calls, sizeof (struct store_call), 4);
    fx.now = (struct fake_clock){T0, 1700000000000ull};
    fx.clock = (struct ex_clock){fake_mono, fake_wall, &fx.now};
    fx.env = (struct ex_env){
        .clock = &fx.clock,
        .base = event_base_new(),
        .claims = &fx.claims,
        .leases_active = &fx.leases,
        .metrics = &fx.metrics.shards[0],
        .spare_calls = &fx.calls,
    };
    cr_assert_not_null(fx.env.base);
}

static void fixture_down(void)
{
    freelist_clear(&fx.calls);
    claims_free(&fx.claims);
    metrics_ids_free(&fx.ids);
    metrics_free(&fx.metrics);
    pacing_free(&fx.pacing);
    config_free(fx.cfg);
    event_base_free(fx.env.base);
}

/* A fresh exchange on route r, attempt 1, about to enter its first row. */
static __attribute__((unused)) void fake(struct exchange *ex, size_t r)
{
    memset(ex, 0, sizeof *ex);
    ex->env = &fx.env;
    ex->cfg = fx.cfg;
    ex->ids = &fx.ids;
    ex->route = &fx.cfg->routes[r];
    ex->up = ex->route->up;
    ex->pol = ex->route->pol;
    ex->ps = pacing_policy(&fx.pacing, ex->route->policy);
    ex->label = ex->route->name;
    ex->upstream_idx = ex->route->upstream;
    ex->max_wait_ns = ex->pol->max_wait_ms * MS;
    ex->timeout_ms = sc_route_timeout(ex->route, ex->up);
    ex->method = "POST";
    ex->target = "/";
    ex->attempt = 1;
}

/* The driver's part: the row runs at `now` for `woke`. */
static __attribute__((unused)) enum ex_verdict run(const struct ex_stage *row, struct exchange *ex,
                           enum ex_woke woke, uint64_t now)
{
    fx.now.mono_ns = now;
    ex->woke = woke;
    ex->wake_at = 0;
    return row->run(ex, now);
}

/* The driver's release walk, for the rows this test ran, backwards. */
static __attribute__((unused)) void release(struct exchange *ex, enum ex_release how,
                    const struct ex_stage *const *rows, size_t n)
{
    while (n--)
        if (rows[n]->release)
            rows[n]->release(ex, how);
}

#endif
