/* What a config becomes when it runs: TLS contexts, policy states, metric
 * ids and upstream pools (one set per event loop). Refcounted: every request
 * holds the runtime it started on until it completes, so a reload swaps in a
 * new one while requests in flight finish on the old (docs/contract.md §1). */
#ifndef SLUICE_PROXY_RUNTIME_H
#define SLUICE_PROXY_RUNTIME_H

#include <stdatomic.h>
#include <stdbool.h>

#include <openssl/ssl.h>

#include "config/config.h"
#include "obs/metrics.h"
#include "pacing/pacing.h"
#include "proxy/exchange/plan.h"
#include "util/error.h"

struct app;
struct up_pool;
struct up_proxy;

struct runtime {
    atomic_long refs;
    struct app *app;
    struct sc_config *cfg;      /* owned */
    SSL_CTX **tls;              /* per upstream; NULL for http */
    char **tls_src;             /* what each was made from (up_tls_source) */
    struct up_proxy **proxies;  /* per upstream; NULL: direct */
    struct pacing pacing;
    struct ex_plans *plans;     /* per policy, the default policy's last */
    struct metrics_ids ids;
    struct up_pool ***pools;    /* [loop][upstream] */
    unsigned n_loops;
    atomic_uint loops_done;     /* pools freed on their own loops */
};

/* Builds a runtime for cfg (taking ownership of it), carrying policy states
 * over from prev (may be NULL). Pools are created for every loop of app.
 * 0, or negative + err (cfg is then freed). */
int runtime_new(struct app *app, struct sc_config *cfg,
                const struct runtime *prev, struct runtime **out,
                struct sc_error *err);

/* The plans of a route's policy index (-1: the default policy). */
static inline const struct ex_plans *runtime_plans(const struct runtime *rt, long policy)
{
    return &rt->plans[policy >= 0 ? (size_t)policy : rt->cfg->n_policies];
}

/* The current runtime with a reference taken; thread-safe. */
struct runtime *runtime_acquire(struct app *app);
void runtime_put(struct runtime *rt);

/* Frees at once, from the calling thread: only when no loop runs. */
void runtime_free_now(struct runtime *rt);

#endif
