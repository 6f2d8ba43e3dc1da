#include "proxy/dup_notice.h"

#include <stdlib.h>

#include "config/config.h"
#include "obs/log.h"
#include "proxy/app.h"
#include "proxy/server/server.h"
#include "store/store.h"

void dup_notice_follow(struct app *app, const struct sc_config *cfg)
{
    const char **scopes = calloc(cfg->n_policies ? cfg->n_policies : 1, sizeof *scopes);
    struct sc_error err = {0};
    size_t n = 0;

    if (!scopes) {
        log_warn("duplicates: wait: out of memory; waiting duplicates poll the store");
        return;
    }
    for (size_t i = 0; i < cfg->n_policies; i++) {
        const struct sc_policy *p = &cfg->policies[i];

        if (p->idem.enabled && p->idem.duplicates == SC_DUP_WAIT)
            scopes[n++] = p->name;
    }
    if (store_notify_set(app->store, scopes, n, loops_wake_key, app, &err) != 0)
        log_warn("duplicates: wait: the end of leases is not listened for (%s); "
                 "waiting duplicates poll the store", err.text);
    free(scopes);
}

void dup_notice_stop(struct app *app)
{
    struct sc_error err = {0};

    if (app->store)
        store_notify_set(app->store, NULL, 0, loops_wake_key, app, &err);
}
