#include "proxy/app.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/thread.h>

#include "proxy/admin.h"
#include "proxy/exchange.h"
#include "proxy/log.h"
#include "proxy/upstream.h"
#include "store/store.h"
#include "util/clock.h"

/* How often the main loop looks at the in-flight count while draining, and
 * how long aborted requests get to have their answers written. */
#define DRAIN_TICK_MS 20
#define ABORT_GRACE_NS (2000ull * 1000 * 1000)

static unsigned resolve_threads(const struct sc_config *cfg)
{
    long n = cfg->threads ? (long)cfg->threads : sysconf(_SC_NPROCESSORS_ONLN);

    return n > 0 ? (unsigned)n : 1;
}

static int tls_init(struct app *app, struct sc_error *err)
{
    const struct sc_config *cfg = app->cfg;

    app->tls = calloc(cfg->n_upstreams ? cfg->n_upstreams : 1, sizeof *app->tls);
    if (!app->tls) {
        sc_error_set(err, "out of memory");
        return -ENOMEM;
    }
    for (size_t i = 0; i < cfg->n_upstreams; i++) {
        if (!cfg->upstreams[i].https)
            continue;
        app->tls[i] = up_tls_ctx_new(&cfg->upstreams[i], err);
        if (!app->tls[i])
            return -EINVAL;
    }
    return 0;
}

static int workers_init(struct app *app, struct sc_error *err)
{
    int rc;

    app->n_workers = resolve_threads(app->cfg);
    app->workers = calloc(app->n_workers, sizeof *app->workers);
    if (!app->workers) {
        sc_error_set(err, "out of memory");
        return -ENOMEM;
    }
    for (unsigned i = 0; i < app->n_workers; i++) {
        rc = worker_init(&app->workers[i], app, i, app->listen_fd, err);
        if (rc != 0)
            return rc;
    }
    for (unsigned i = 0; i < app->n_workers; i++) {
        rc = worker_start(&app->workers[i], err);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* ---- signals and the drain ---------------------------------------------- */

static void stop_listening(struct app *app)
{
    for (unsigned i = 0; i < app->n_workers; i++)
        worker_quiesce(&app->workers[i]);
}

static void on_drain_tick(evutil_socket_t fd, short what, void *arg)
{
    struct app *app = arg;
    uint64_t now = clock_mono_ns();
    struct timeval tv = {0, DRAIN_TICK_MS * 1000};

    if (atomic_load(&app->inflight) == 0) {
        event_base_loopbreak(app->main_base);
        return;
    }
    if (!app->aborted && now >= app->drain_deadline_ns) {
        log_warn("drain_timeout reached with %ld requests in flight: "
                 "answering them requeue/connection_lost",
                 atomic_load(&app->inflight));
        app->aborted = true;
        app->abort_ns = now;
        for (unsigned i = 0; i < app->n_workers; i++)
            worker_abort_inflight(&app->workers[i]);
    } else if (app->aborted && now - app->abort_ns > ABORT_GRACE_NS) {
        event_base_loopbreak(app->main_base);
        return;
    }
    evtimer_add(app->drain_tick, &tv);
}

void app_begin_drain(struct app *app)
{
    struct timeval tv = {0, 0};

    if (atomic_exchange(&app->draining, true))
        return;
    log_info("draining: %ld requests in flight, drain_timeout %llu ms",
             atomic_load(&app->inflight),
             (unsigned long long)app->cfg->limits.drain_timeout_ms);
    app->drain_deadline_ns =
        clock_mono_ns() + app->cfg->limits.drain_timeout_ms * 1000000ull;
    stop_listening(app);
    evtimer_add(app->drain_tick, &tv);
}

static void on_stop_signal(evutil_socket_t sig, short what, void *arg)
{
    app_begin_drain(arg);
}

static void on_hup(evutil_socket_t sig, short what, void *arg)
{
    /* Live reload arrives with the operations work; until then the running
     * config stays, and the operator is told so. */
    log_warn("SIGHUP: live reload is not available in this build; "
             "the running config is kept");
}

static int signals_init(struct app *app, struct sc_error *err)
{
    app->sig_term = evsignal_new(app->main_base, SIGTERM, on_stop_signal, app);
    app->sig_int = evsignal_new(app->main_base, SIGINT, on_stop_signal, app);
    app->sig_hup = evsignal_new(app->main_base, SIGHUP, on_hup, app);
    app->drain_tick = evtimer_new(app->main_base, on_drain_tick, app);
    if (!app->sig_term || !app->sig_int || !app->sig_hup || !app->drain_tick ||
        evsignal_add(app->sig_term, NULL) || evsignal_add(app->sig_int, NULL) ||
        evsignal_add(app->sig_hup, NULL)) {
        sc_error_set(err, "cannot install signal handlers");
        return -EINVAL;
    }
    return 0;
}

/* ---- lifecycle ---------------------------------------------------------- */

/* ---- the idempotency store ---------------------------------------------- */

#define SWEEP_EVERY_MS 1000
#define SWEEP_MAX 2000

/* Bounded work per tick on the main thread: never a stall of the loops. */
static void on_sweep(evutil_socket_t fd, short what, void *arg)
{
    struct app *app = arg;
    struct sc_error err = {0};
    size_t removed = 0;

    if (store_sweep(app->store, clock_wall_ms(), SWEEP_MAX, &removed, &err) != 0)
        log_warn("store sweep: %s", err.text);
    else if (removed)
        log_debug("store sweep: %zu expired records reclaimed", removed);
}

static int store_init(struct app *app, struct sc_error *err)
{
    const struct sc_config *cfg = app->cfg;
    struct timeval tv = {SWEEP_EVERY_MS / 1000, (SWEEP_EVERY_MS % 1000) * 1000};
    int rc;

    if (cfg->store.backend != SC_BACKEND_ROCKSDB) {
        sc_error_set(err, "store.backend redis is not available in this build");
        return -ENOTSUP;
    }
    rc = store_open(cfg->store.path, cfg->store.sync, &app->store, err);
    if (rc != 0)
        return rc;
    if (claims_init(&app->claims) != 0) {
        sc_error_set(err, "out of memory");
        return -ENOMEM;
    }
    app->sweep_ev = event_new(app->main_base, -1, EV_PERSIST, on_sweep, app);
    if (!app->sweep_ev || event_add(app->sweep_ev, &tv) != 0) {
        sc_error_set(err, "cannot schedule the store sweep");
        return -ENOMEM;
    }
    return 0;
}

int app_start(struct app *app, struct sc_config *cfg, struct sc_error *err)
{
    int rc;

    memset(app, 0, sizeof *app);
    app->cfg = cfg;
    app->listen_fd = -1;
    log_set_level(cfg->log.level);
    signal(SIGPIPE, SIG_IGN);
    if (evthread_use_pthreads() != 0) {
        sc_error_set(err, "libevent without thread support");
        return -EINVAL;
    }
    app->main_base = event_base_new();
    if (!app->main_base) {
        sc_error_set(err, "cannot create the main event loop");
        return -ENOMEM;
    }
    if ((rc = signals_init(app, err)) != 0 || (rc = tls_init(app, err)) != 0)
        return rc;
    if (pacing_init(&app->pacing, cfg) != 0) {
        sc_error_set(err, "out of memory");
        return -ENOMEM;
    }
    if ((rc = store_init(app, err)) != 0)
        return rc;
    /* One shard per loop plus one for the main and admin threads. */
    metrics_init(&app->metrics, resolve_threads(cfg) + 1);
    if (metrics_ids_build(&app->metrics, cfg, &app->ids) != 0) {
        sc_error_set(err, "out of memory for metrics");
        return -ENOMEM;
    }
    app->listen_fd = server_listen(&cfg->listen, 1024, err);
    if (app->listen_fd < 0)
        return app->listen_fd;
    if ((rc = workers_init(app, err)) != 0)
        return rc;
    app->admin = admin_start(app, err);
    if (!app->admin)
        return -EINVAL;
    atomic_store(&app->ready, true);
    log_info("sluice %s listening on %s:%u (admin %s:%u), %u threads",
             SLUICE_VERSION, cfg->listen.host, cfg->listen.port,
             cfg->admin.host, cfg->admin.port, app->n_workers);
    return 0;
}

int app_run(struct app *app)
{
    event_base_loop(app->main_base, EVLOOP_NO_EXIT_ON_EMPTY);
    log_info("drained; exiting");
    return 0;
}

static void free_event(struct event *ev)
{
    if (ev)
        event_free(ev);
}

void app_free(struct app *app)
{
    for (unsigned i = 0; app->workers && i < app->n_workers; i++)
        worker_stop(&app->workers[i]);
    free(app->workers);
    admin_stop(app->admin);
    pacing_free(&app->pacing);
    free_event(app->sweep_ev);
    /* After the loops: every answered result is in the store; flush it. */
    store_close(app->store);
    if (app->claims.table)
        claims_free(&app->claims);
    metrics_ids_free(&app->ids);
    if (app->metrics.n_shards)
        metrics_free(&app->metrics);
    if (app->listen_fd >= 0)
        close(atomic_exchange(&app->listen_fd, -1));
    for (size_t i = 0; app->tls && app->cfg && i < app->cfg->n_upstreams; i++)
        if (app->tls[i])
            SSL_CTX_free(app->tls[i]);
    free(app->tls);
    free_event(app->sig_term);
    free_event(app->sig_int);
    free_event(app->sig_hup);
    free_event(app->drain_tick);
    if (app->main_base)
        event_base_free(app->main_base);
    if (app->cfg)
        config_free(app->cfg);
    memset(app, 0, sizeof *app);
    app->listen_fd = -1;
}
