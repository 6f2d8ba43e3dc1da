#include "proxy/runtime.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "proxy/app.h"
#include "proxy/server/server.h"
#include "proxy/upstream/upstream.h"
#include "util/clock.h"

/* prev's context made from the same source, with a reference taken, or
 * NULL. */
static SSL_CTX *tls_kept(const struct runtime *prev, const char *src)
{
    for (size_t j = 0; prev && prev->tls_src && j < prev->cfg->n_upstreams; j++)
        if (prev->tls[j] && prev->tls_src[j] && !strcmp(prev->tls_src[j], src) &&
            SSL_CTX_up_ref(prev->tls[j]) == 1)
            return prev->tls[j];
    return NULL;
}

/* One context per https upstream, loaded once per config: a reload that
 * changes neither its settings nor its files (ca, client certificate, key)
 * keeps the context it had, and with it the key already in memory. */
static int tls_init(struct runtime *rt, const struct runtime *prev,
                    struct sc_error *err)
{
    const struct sc_config *cfg = rt->cfg;
    size_t n = cfg->n_upstreams ? cfg->n_upstreams : 1;
    char src[UP_TLS_SOURCE_MAX];

    rt->tls = calloc(n, sizeof *rt->tls);
    rt->tls_src = calloc(n, sizeof *rt->tls_src);
    if (!rt->tls || !rt->tls_src) {
        sc_error_set(err, "out of memory");
        return -ENOMEM;
    }
    for (size_t i = 0; i < cfg->n_upstreams; i++) {
        if (!cfg->upstreams[i].https)
            continue;
        up_tls_source(&cfg->upstreams[i], src, sizeof src);
        rt->tls[i] = tls_kept(prev, src);
        if (!rt->tls[i])
            rt->tls[i] = up_tls_ctx_new(&cfg->upstreams[i], err);
        if (!rt->tls[i])
            return -EINVAL;
        if (!(rt->tls_src[i] = strdup(src))) {
            sc_error_set(err, "out of memory");
            return -ENOMEM;
        }
    }
    return 0;
}

/* Each upstream's egress proxy, parsed once per config (the config check
 * has already refused a malformed one). */
static int proxies_init(struct runtime *rt, struct sc_error *err)
{
    const struct sc_config *cfg = rt->cfg;

    rt->proxies = calloc(cfg->n_upstreams ? cfg->n_upstreams : 1,
                         sizeof *rt->proxies);
    if (!rt->proxies) {
        sc_error_set(err, "out of memory");
        return -ENOMEM;
    }
    for (size_t i = 0; i < cfg->n_upstreams; i++) {
        rt->proxies[i] = up_proxy_new(&cfg->upstreams[i], err);
        if (!rt->proxies[i] && err->text[0])
            return -EINVAL;
    }
    return 0;
}

/* Pools only allocate here; connections open on first use, on the loop
 * that uses them. */
static int pools_init(struct runtime *rt, struct sc_error *err)
{
    const struct sc_config *cfg = rt->cfg;
    struct app *app = rt->app;

    rt->n_loops = app->n_loops;
    rt->pools = calloc(rt->n_loops, sizeof *rt->pools);
    if (!rt->pools)
        goto nomem;
    for (unsigned w = 0; w < rt->n_loops; w++) {
        rt->pools[w] = calloc(cfg->n_upstreams + 1, sizeof **rt->pools);
        if (!rt->pools[w])
            goto nomem;
        for (size_t i = 0; i < cfg->n_upstreams; i++) {
            const struct sc_upstream *u = &cfg->upstreams[i];
            /* The keep-alive limit is per upstream; each loop gets its share. */
            uint32_t share = (u->max_connections + rt->n_loops - 1) / rt->n_loops;

            struct up_pool_metrics m = {
                &app->metrics.shards[w], rt->ids.up_open[i], rt->ids.up_idle[i],
                rt->ids.up_connect[i], rt->ids.up_tls[i],
                &rt->ids.up_connect_fail[i * UPH__COUNT],
            };

            rt->pools[w][i] = up_pool_new(app->loops[w].base, app->loops[w].dns,
                                          u, rt->tls[i], rt->proxies[i], share, &m);
            if (!rt->pools[w][i])
                goto nomem;
        }
    }
    return 0;
nomem:
    sc_error_set(err, "out of memory creating upstream pools");
    return -ENOMEM;
}

/* Each policy's plans (proxy/exchange/plan.c), the default policy's last:
 * what its requests run, fixed for the config's life. */
static int plans_init(struct runtime *rt)
{
    const struct sc_config *cfg = rt->cfg;
    bool shares = rt->app && rt->app->store && store_shares_buckets(rt->app->store);

    rt->plans = calloc(cfg->n_policies + 1, sizeof *rt->plans);
    if (!rt->plans)
        return -ENOMEM;
    for (size_t i = 0; i < cfg->n_policies; i++)
        ex_plans_build(&cfg->policies[i], shares, &rt->plans[i]);
    ex_plans_build(&cfg->default_policy, shares, &rt->plans[cfg->n_policies]);
    return 0;
}

int runtime_new(struct app *app, struct sc_config *cfg,
                const struct runtime *prev, struct runtime **out,
                struct sc_error *err)
{
    struct runtime *rt = calloc(1, sizeof *rt);
    int rc = -ENOMEM;

    if (!rt) {
        config_free(cfg);
        sc_error_set(err, "out of memory");
        return -ENOMEM;
    }
    atomic_store(&rt->refs, 1);
    rt->app = app;
    rt->cfg = cfg;
    if ((rc = tls_init(rt, prev, err)) != 0 ||
        (rc = proxies_init(rt, err)) != 0)
        goto fail;
    rc = pacing_init(&rt->pacing, cfg, prev ? &prev->pacing : NULL);
    if (rc == 0)
        rc = plans_init(rt);
    if (rc == 0)
        rc = metrics_ids_build(&app->metrics, cfg, &rt->ids);
    if (rc != 0) {
        sc_error_set(err, "out of memory");
        goto fail;
    }
    if ((rc = pools_init(rt, err)) != 0)
        goto fail;
    /* Nothing fails from here: the old states can be taken over. */
    pacing_commit(&rt->pacing, clock_mono_ns());
    *out = rt;
    return 0;
fail:
    runtime_free_now(rt);
    return rc;
}

static void free_loop_pools(struct runtime *rt, unsigned w)
{
    for (size_t i = 0; rt->pools[w] && i < rt->cfg->n_upstreams; i++)
        up_pool_free(rt->pools[w][i]);
    free(rt->pools[w]);
    rt->pools[w] = NULL;
}

void runtime_free_now(struct runtime *rt)
{
    for (unsigned w = 0; rt->pools && w < rt->n_loops; w++)
        free_loop_pools(rt, w);
    free(rt->pools);
    pacing_free(&rt->pacing);
    free(rt->plans);
    metrics_ids_free(&rt->ids);
    for (size_t i = 0; rt->tls && i < rt->cfg->n_upstreams; i++)
        if (rt->tls[i])
            SSL_CTX_free(rt->tls[i]);
    for (size_t i = 0; rt->tls_src && i < rt->cfg->n_upstreams; i++)
        free(rt->tls_src[i]);
    free(rt->tls);
    free(rt->tls_src);
    for (size_t i = 0; rt->proxies && i < rt->cfg->n_upstreams; i++)
        up_proxy_free(rt->proxies[i]);
    free(rt->proxies);
    config_free(rt->cfg);
    free(rt);
}

struct loop_free {
    struct runtime *rt;
    unsigned w;
};

/* Runs on loop w: its pools' connections belong to it. The last loop frees
 * the rest. */
static void on_loop_free(evutil_socket_t fd, short what, void *arg)
{
    struct loop_free *lf = arg;
    struct runtime *rt = lf->rt;

    free_loop_pools(rt, lf->w);
    free(lf);
    if (atomic_fetch_add(&rt->loops_done, 1) + 1 == rt->n_loops) {
        free(rt->pools);
        rt->pools = NULL;
        runtime_free_now(rt);
    }
}

void runtime_put(struct runtime *rt)
{
    struct app *app;
    unsigned n;

    if (!rt || atomic_fetch_sub(&rt->refs, 1) != 1)
        return;
    app = rt->app;
    n = rt->n_loops; /* rt may be gone once the last loop has run its part */
    if (atomic_load(&app->loops_stopped) || n == 0) {
        runtime_free_now(rt);
        return;
    }
    for (unsigned w = 0; w < n; w++) {
        struct loop_free *lf = malloc(sizeof *lf);

        if (lf) {
            /* Filled first: the loop may run it before event_base_once returns. */
            lf->rt = rt;
            lf->w = w;
        }
        if (!lf || event_base_once(app->loops[w].base, -1, EV_TIMEOUT,
                                   on_loop_free, lf, NULL) != 0) {
            /* Cannot post to the loop: free there and then (rare, at exit). */
            free(lf);
            free_loop_pools(rt, w);
            if (atomic_fetch_add(&rt->loops_done, 1) + 1 == n) {
                free(rt->pools);
                rt->pools = NULL;
                runtime_free_now(rt);
            }
        }
    }
}

struct runtime *runtime_acquire(struct app *app)
{
    struct runtime *rt;

    /* A short lock: the swap on reload must not free what a reader is
     * about to take a reference on. */
    pthread_mutex_lock(&app->rt_mu);
    rt = app->rt;
    if (rt)
        atomic_fetch_add(&rt->refs, 1);
    pthread_mutex_unlock(&app->rt_mu);
    return rt;
}
