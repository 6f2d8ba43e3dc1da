/* Fleet mode's liveness keys (docs/contract.md §11): while this process
 * runs, its liveness key of every policy that verifies is refreshed every
 * second and lapses 3 s after the last refresh, so that the other sidecars
 * can tell that a lease it holds (or a verification it runs) has lost its
 * owner and settle it by a lookup instead of waiting out its expiry. */
#ifndef SLUICE_PROXY_HOLDER_LIVE_H
#define SLUICE_PROXY_HOLDER_LIVE_H

#include "util/error.h"

struct app;

/* With a store that keeps liveness keys (Redis): refreshes them once now,
 * before the loops serve, then from a timer on the main loop (app->live_tick,
 * freed by app_free). Nothing on RocksDB. 0, or -ENOMEM with err. */
int holder_live_start(struct app *app, struct sc_error *err);

#endif
