/* The liveness keys' timer (holder_live.h). One blocking command per
 * verifying policy per second, on the main loop (the signals' and the
 * drain's, never a request's), each bounded by store.timeout. */
#include "proxy/holder_live.h"

#include <errno.h>
#include <stdbool.h>

#include <event2/event.h>

#include "obs/log.h"
#include "policies/verify.h"
#include "proxy/app.h"
#include "proxy/runtime.h"
#include "store/store.h"

/* Refreshes the key of each policy of the config at work that verifies.
 * A failure is logged when it starts and when it ends, not every second:
 * past 3 s of them the other sidecars take this one for gone, and its
 * later writes are fenced (contract §10). */
static void refresh(struct app *app)
{
    static bool failing;
    /* A reference: the admin thread's POST /reload may swap app->rt. */
    struct runtime *rt = runtime_acquire(app);
    const struct sc_config *cfg = rt->cfg;
    struct sc_error err = {0};
    bool failed = false;

    for (size_t i = 0; i < cfg->n_policies; i++) {
        const struct sc_policy *p = &cfg->policies[i];

        if (!p->idem.enabled || !p->idem.verify.enabled)
            continue;
        if (store_live_refresh(app->store, p->name, VERIFY_LIVE_TTL_MS, &err) != 0)
            failed = true;
    }
    runtime_put(rt);
    if (failed && !failing)
        log_warn("cannot refresh this sidecar's liveness keys (after %d ms "
                 "without, the fleet verifies its leases): %s",
                 VERIFY_LIVE_TTL_MS, err.text);
    else if (!failed && failing)
        log_info("this sidecar's liveness keys are refreshed again");
    failing = failed;
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    refresh(arg);
}

int holder_live_start(struct app *app, struct sc_error *err)
{
    struct timeval every = {VERIFY_LIVE_REFRESH_MS / 1000,
                            (VERIFY_LIVE_REFRESH_MS % 1000) * 1000};
    /* A store of this process alone (RocksDB) keeps no keys: its leases
     * are all this process's, and those of an ended one are taken up at
     * start-up. A store the fleet shares does. */
    if (!store_shares_buckets(app->store))
        return 0;
    refresh(app);
    app->live_tick = event_new(app->main_base, -1, EV_PERSIST, on_tick, app);
    if (!app->live_tick || event_add(app->live_tick, &every) != 0) {
        sc_error_set(err, "cannot start the liveness keys' timer");
        return -ENOMEM;
    }
    return 0;
}
