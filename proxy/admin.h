/* The admin listener, never on the worker port: health, readiness, the
 * effective config, metrics, reload, idempotency records and cooldowns (GET /
 * lists them). It runs its own small thread, so a scrape or a slow admin
 * client never touches the request loops; requests that change state are
 * guarded (admin_guard.h). */
#ifndef SLUICE_PROXY_ADMIN_H
#define SLUICE_PROXY_ADMIN_H

#include "util/error.h"

struct app;
struct MHD_Daemon;

/* Starts the admin server on app->cfg->admin into *out. 0, or a negative
 * code and err. */
int admin_start(struct app *app, struct MHD_Daemon **out, struct sc_error *err);
void admin_stop(struct MHD_Daemon *d);

#endif
