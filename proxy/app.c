#define _GNU_SOURCE
#include "proxy/app.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/thread.h>

#include "proxy/admin.h"
#include "proxy/dup_notice.h"
#include "proxy/holder_live.h"
#include "proxy/server/mhd_request.h"
#include "proxy/server/verification.h"
#include "proxy/notify.h"
#include "obs/log.h"
#include "proxy/upstream/upstream.h"
#include "proxy/version.h"
#include "store/store.h"
#include "util/clock.h"

/* How often the main loop looks at the in-flight count while draining, and
 * how long aborted requests get to have their answers written. */
#define DRAIN_TICK_MS 20
#define ABORT_GRACE_NS (2000ull * 1000 * 1000)

static unsigned resolve_threads(uint32_t threads)
{
    long n = threads ? (long)threads : sysconf(_SC_NPROCESSORS_ONLN);

    return n > 0 ? (unsigned)n : 1;
}

/* Copies a list of addresses (the sentinels', the cluster's seeds), their
 * hosts owned by to. */
static int fixed_addrs(struct sc_addr_list *to, const struct sc_addr_list *l)
{
    for (uint32_t i = 0; i < l->n; i++) {
        to->v[i] = l->v[i];
        if (!(to->v[i].host = strdup(l->v[i].host)))
            return -ENOMEM;
        to->n = i + 1;
    }
    return 0;
}

static char *dup_or_empty(const char *s)
{
    return strdup(s ? s : "");
}

/* store.tls, its strings owned by f. */
static int fixed_tls(struct sc_tls *t, const struct sc_tls *from)
{
    t->verify = from->verify;
    t->ca_file = dup_or_empty(from->ca_file);
    t->cert_file = dup_or_empty(from->cert_file);
    t->key_file = dup_or_empty(from->key_file);
    t->server_name = dup_or_empty(from->server_name);
    return t->ca_file && t->cert_file && t->key_file && t->server_name ? 0 : -ENOMEM;
}

static void tls_free(struct sc_tls *t)
{
    free(t->ca_file);
    free(t->cert_file);
    free(t->key_file);
    free(t->server_name);
}

static bool str_eq(const char *a, const char *b)
{
    return !strcmp(a ? a : "", b ? b : "");
}

static bool tls_eq(const struct sc_tls *a, const struct sc_tls *b)
{
    return a->verify == b->verify && str_eq(a->ca_file, b->ca_file) &&
           str_eq(a->cert_file, b->cert_file) && str_eq(a->key_file, b->key_file) &&
           str_eq(a->server_name, b->server_name);
}

static int fixed_init(struct app_fixed *f, const struct sc_config *cfg)
{
    f->file = strdup(cfg->file ? cfg->file : "");
    f->listen = cfg->listen;
    f->listen.host = strdup(cfg->listen.host);
    f->admin = cfg->admin;
    f->admin.host = strdup(cfg->admin.host);
    f->threads = cfg->threads;
    f->max_header = cfg->limits.max_header;
    f->max_connections = cfg->limits.max_connections;
    f->store_path = strdup(cfg->store.path);
    f->store_sync = cfg->store.sync;
    f->backend = cfg->store.backend;
    /* RocksDB answers at once, or with sync after its group commit's fsync
     * (a local disk: waiting longer would not make it durable sooner): only
     * a network store needs a deadline. */
    f->store_timeout_ms = cfg->store.backend == SC_BACKEND_REDIS
                              ? cfg->store.timeout_ms : 0;
    f->store_url = strdup(cfg->store.url ? cfg->store.url : "");
    f->store_prefix = strdup(cfg->store.key_prefix ? cfg->store.key_prefix : "");
    f->fleet_size = cfg->store.fleet_size;
    f->store_master = strdup(cfg->store.master ? cfg->store.master : "");
    f->replicas_ack = cfg->store.replicas_ack;
    f->cluster = cfg->store.cluster;
    f->statsd = strdup(cfg->metrics.statsd ? cfg->metrics.statsd : "");
    return f->file && f->listen.host && f->admin.host && f->store_path &&
                   f->statsd && f->store_url && f->store_prefix &&
                   f->store_master &&
                   fixed_addrs(&f->sentinels, &cfg->store.sentinels) == 0 &&
                   fixed_addrs(&f->nodes, &cfg->store.nodes) == 0 &&
                   fixed_tls(&f->store_tls, &cfg->store.tls) == 0
               ? 0 : -ENOMEM;
}

static void fixed_free(struct app_fixed *f)
{
    free(f->file);
    free(f->listen.host);
    free(f->admin.host);
    free(f->store_path);
    free(f->store_url);
    free(f->store_prefix);
    free(f->store_master);
    tls_free(&f->store_tls);
    for (uint32_t i = 0; i < f->sentinels.n; i++)
        free(f->sentinels.v[i].host);
    for (uint32_t i = 0; i < f->nodes.n; i++)
        free(f->nodes.v[i].host);
    free(f->statsd);
    memset(f, 0, sizeof *f);
}

static int loops_init(struct app *app, struct sc_error *err)
{
    int rc;

    app->loops = calloc(app->n_loops, sizeof *app->loops);
    if (!app->loops) {
        sc_error_set(err, "out of memory");
        return -ENOMEM;
    }
    for (unsigned i = 0; i < app->n_loops; i++) {
        rc = loop_init(&app->loops[i], app, i, app->listen_fd, err);
        if (rc != 0)
            return rc;
    }
    return 0;
}

static int loops_start(struct app *app, struct sc_error *err)
{
    for (unsigned i = 0; i < app->n_loops; i++) {
        int rc = loop_start(&app->loops[i], err);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* ---- the idempotency store ---------------------------------------------- */

/* 200 records every 100 ms: the same 2000/s as one big call a second, in
 * bursts of ~1.5 ms instead of ~15 ms (a store of 10^6 live keys makes a
 * call scan 16 x max records), which showed as a p99 tail on 2 cores. */
#define SWEEP_EVERY_MS 100
#define SWEEP_MAX 200

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

/* The fleet's store: reachable or not, it opens (a fleet may start before
 * its Redis); /readyz says whether it answers. */
static int open_redis(struct app *app, struct sc_error *err)
{
    const struct app_fixed *f = &app->fixed;
    struct store_redis_addr sentinels[SC_ADDR_LIST_MAX];
    struct store_redis_addr nodes[SC_ADDR_LIST_MAX];
    struct sc_redis_url u;
    struct store_redis_opts o;
    char buf[1024];
    int rc = config_redis_url_parse(f->store_url, &u, buf, sizeof buf, err);

    if (rc != 0)
        return rc;
    for (uint32_t i = 0; i < f->sentinels.n; i++)
        sentinels[i] = (struct store_redis_addr){f->sentinels.v[i].host,
                                                 f->sentinels.v[i].port};
    for (uint32_t i = 0; i < f->nodes.n; i++)
        nodes[i] = (struct store_redis_addr){f->nodes.v[i].host, f->nodes.v[i].port};
    o = (struct store_redis_opts){
        .host = u.host, .port = u.port, .user = u.user, .password = u.password,
        .db = u.db, .tls = u.tls, .tls_verify = f->store_tls.verify,
        .tls_ca_file = f->store_tls.ca_file, .tls_cert_file = f->store_tls.cert_file,
        .tls_key_file = f->store_tls.key_file,
        .tls_server_name = f->store_tls.server_name,
        .timeout_ms = f->store_timeout_ms, .prefix = f->store_prefix,
        .sentinels = sentinels, .n_sentinels = f->sentinels.n,
        .master = f->store_master, .replicas_ack = f->replicas_ack,
        .cluster = f->cluster, .nodes = nodes, .n_nodes = f->nodes.n,
    };
    return store_open_redis(&o, &app->store, err);
}

static int store_init(struct app *app, struct sc_error *err)
{
    struct timeval tv = clock_ms_to_tv(SWEEP_EVERY_MS);
    int rc;

    if (app->fixed.backend == SC_BACKEND_REDIS)
        rc = open_redis(app, err);
    else
        rc = store_open_rocksdb(app->fixed.store_path, app->fixed.store_sync,
                                &app->store, err);
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

/* ---- signals and the drain ---------------------------------------------- */

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
                 "answering them requeue",
                 atomic_load(&app->inflight));
        app->aborted = true;
        app->abort_ns = now;
        for (unsigned i = 0; i < app->n_loops; i++)
            loop_abort_inflight(&app->loops[i]);
    } else if (app->aborted && now - app->abort_ns > ABORT_GRACE_NS) {
        event_base_loopbreak(app->main_base);
        return;
    }
    evtimer_add(app->drain_tick, &tv);
}

void app_begin_drain(struct app *app)
{
    struct timeval tv = {0, 0};
    struct runtime *rt;
    uint64_t drain_ms;

    if (atomic_exchange(&app->draining, true))
        return;
    notify_stopping();
    rt = runtime_acquire(app);
    drain_ms = rt->cfg->limits.drain_timeout_ms;
    runtime_put(rt);
    log_info("draining: %ld requests in flight, drain_timeout %llu ms",
             atomic_load(&app->inflight), (unsigned long long)drain_ms);
    app->drain_deadline_ns = clock_mono_ns() + drain_ms * NS_PER_MS;
    for (unsigned i = 0; i < app->n_loops; i++)
        loop_quiesce(&app->loops[i]);
    evtimer_add(app->drain_tick, &tv);
}

static void on_stop_signal(evutil_socket_t sig, short what, void *arg)
{
    app_begin_drain(arg);
}

static void on_hup(evutil_socket_t sig, short what, void *arg)
{
    char *msg = NULL;

    /* app_reload logs the outcome itself. */
    app_reload(arg, &msg);
    free(msg);
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

/* ---- reload ------------------------------------------------------------- */

static bool addr_eq(const struct sc_addr *a, const struct sc_addr *b)
{
    return a->port == b->port && strcmp(a->host, b->host) == 0;
}

static bool addrs_eq(const struct sc_addr_list *a,
                         const struct sc_addr_list *b)
{
    if (a->n != b->n)
        return false;
    for (uint32_t i = 0; i < a->n; i++)
        if (!addr_eq(&a->v[i], &b->v[i]))
            return false;
    return true;
}

/* Keys bound or sized at start: a reload that changes one is refused
 * whole, so nobody believes a change took effect when it did not. */
static int check_fixed(const struct app_fixed *f, const struct sc_config *c,
                       FILE *out)
{
    int bad = 0;

    if (!addr_eq(&f->listen, &c->listen) && ++bad)
        fprintf(out, "%s: listen changed (%s:%u to %s:%u): it needs a restart\n",
                c->file, f->listen.host, f->listen.port, c->listen.host, c->listen.port);
    if (!addr_eq(&f->admin, &c->admin) && ++bad)
        fprintf(out, "%s: admin changed: it needs a restart\n", c->file);
    if (f->threads != c->threads && ++bad)
        fprintf(out, "%s: threads changed: it needs a restart\n", c->file);
    if ((f->max_header != c->limits.max_header ||
         f->max_connections != c->limits.max_connections) && ++bad)
        fprintf(out, "%s: limits.max_header and limits.max_connections need a restart\n",
                c->file);
    if ((strcmp(f->store_path, c->store.path) || f->store_sync != c->store.sync ||
         f->backend != c->store.backend ||
         strcmp(f->store_url, c->store.url ? c->store.url : "") ||
         strcmp(f->store_prefix, c->store.key_prefix ? c->store.key_prefix : "") ||
         f->fleet_size != c->store.fleet_size ||
         !addrs_eq(&f->sentinels, &c->store.sentinels) ||
         f->cluster != c->store.cluster || !addrs_eq(&f->nodes, &c->store.nodes) ||
         strcmp(f->store_master, c->store.master ? c->store.master : "") ||
         f->replicas_ack != c->store.replicas_ack ||
         !tls_eq(&f->store_tls, &c->store.tls) ||
         (f->backend == SC_BACKEND_REDIS && f->store_timeout_ms != c->store.timeout_ms)) &&
        ++bad)
        fprintf(out, "%s: store changed: it needs a restart (the running config is "
                "kept)\n", c->file);
    if (strcmp(f->statsd, c->metrics.statsd ? c->metrics.statsd : "") && ++bad)
        fprintf(out, "%s: metrics.statsd changed: it needs a restart\n", c->file);
    return bad ? -EINVAL : 0;
}

static void print_errors(FILE *out, const struct sc_errors *errs)
{
    char line[SC_ERROR_TEXT_MAX + SC_ERROR_FILE_MAX + 32];

    for (size_t i = 0; i < errs->n; i++) {
        sc_error_format(&errs->v[i], line, sizeof line);
        fprintf(out, "%s\n", line);
    }
}

/* Cooldowns a partner imposed still hold after a restart: each policy's
 * pause kept in the store is put back on its bucket (a bucket already paused
 * is left as it is: it is empty, and the later moment wins). On a reload the
 * new states have taken the running pauses over already (pacing_commit),
 * so the kept one changes nothing there (the later moment wins). */
static void restore_pauses(struct app *app, struct runtime *rt)
{
    struct pacing *pc = &rt->pacing;
    uint64_t wall = clock_wall_ms(), mono = clock_mono_ns();

    for (size_t i = 0; i < pc->n; i++) {
        struct policy_state *ps = pc->pol[i];
        struct sc_error err = {0};
        uint64_t until;
        int rc;

        if (!ps->has_bucket)
            continue;
        rc = store_pause_get(app->store, ps->name, wall, &until, &err);
        /* Kept by an older version or config: never longer than max_delay. */
        if (rc == 0 && until - wall > rt->cfg->policies[i].retry.max_delay_ms)
            until = wall + rt->cfg->policies[i].retry.max_delay_ms;
        if (rc == 0) {
            bucket_pause(&ps->bucket, mono, mono + (until - wall) * NS_PER_MS,
                         PAUSE_RESTORED);
            log_info("policy %s: %llu ms of cooldown restored from the store",
                     ps->name, (unsigned long long)(until - wall));
        } else if (rc != -ENOENT) {
            log_warn("policy %s: cooldown not read from the store: %s", ps->name,
                     err.text);
        }
    }
}

static void swap_in(struct app *app, struct runtime *rt)
{
    struct runtime *old;

    pthread_mutex_lock(&app->rt_mu);
    old = app->rt;
    app->rt = rt;
    pthread_mutex_unlock(&app->rt_mu);
    /* Each loop takes its own reference, without a lock on the way of
     * every request; requests in flight keep the old one alive. */
    for (unsigned i = 0; rt && i < app->n_loops; i++)
        loop_set_runtime(&app->loops[i], rt);
    runtime_put(old);
}

static int reload_locked(struct app *app, FILE *out)
{
    struct sc_errors errs = {0};
    struct sc_config *cfg = NULL;
    struct sc_error err = {0};
    struct runtime *cur, *rt;
    int rc = config_load_file(app->fixed.file, &cfg, &errs);

    if (rc != 0) {
        print_errors(out, &errs);
        sc_errors_free(&errs);
        return rc;
    }
    if ((rc = check_fixed(&app->fixed, cfg, out)) != 0) {
        config_free(cfg);
        return rc;
    }
    cur = runtime_acquire(app);
    rc = runtime_new(app, cfg, cur, &rt, &err);
    runtime_put(cur);
    if (rc != 0) {
        fprintf(out, "%s\n", err.text);
        return rc;
    }
    restore_pauses(app, rt);
    log_set_level(rt->cfg->log.level);
    fprintf(out, "%s: reloaded (%zu upstreams, %zu policies, %zu routes)\n",
            rt->cfg->file, rt->cfg->n_upstreams, rt->cfg->n_policies,
            rt->cfg->n_routes);
    swap_in(app, rt);
    dup_notice_follow(app, rt->cfg);
    return 0;
}

int app_reload(struct app *app, char **msg)
{
    size_t len = 0;
    FILE *out = open_memstream(msg, &len);
    struct metrics_shard *sh = &app->metrics.shards[app->n_loops];
    struct runtime *rt;
    int rc;

    if (!out)
        return -ENOMEM;
    pthread_mutex_lock(&app->reload_mu);
    notify_reloading();
    rc = reload_locked(app, out);
    fclose(out);
    rt = runtime_acquire(app);
    metrics_add(sh, rc == 0 ? rt->ids.reloads_ok : rt->ids.reloads_error, 1);
    atomic_store(&app->last_reload_ok, rc == 0);
    if (rc == 0)
        atomic_store(&app->last_reload_ok_ms, clock_wall_ms());
    runtime_put(rt);
    if (rc == 0)
        log_info("config reloaded: %s", *msg);
    else
        log_error("config reload refused; the running config is kept: %s", *msg);
    /* Ready again either way (a refused reload keeps the running config),
     * once the outcome is logged and counted. */
    notify_ready();
    pthread_mutex_unlock(&app->reload_mu);
    return rc;
}

/* ---- liveness ----------------------------------------------------------- */

long app_stalled_loop(struct app *app, uint64_t *ms)
{
    uint64_t now = clock_mono_ns();

    for (unsigned i = 0; i < app->n_loops; i++) {
        uint64_t late = loop_stalled_ms(&app->loops[i], now);
        if (late >= LOOP_STALL_MS) {
            *ms = late;
            return (long)i;
        }
    }
    return -1;
}

/* Said once per stall, from the main loop, before the pings stop. */
static bool app_alive(void *arg)
{
    static long said = -1;
    struct app *app = arg;
    uint64_t ms = 0;
    long i = app_stalled_loop(app, &ms);

    if (i >= 0 && said != i)
        log_error("event loop %ld has not turned for %llu ms: no more watchdog pings "
                  "(systemd restarts sluice)", i, (unsigned long long)ms);
    said = i;
    return i < 0;
}

/* ---- lifecycle ---------------------------------------------------------- */

static int base_init(struct app *app, struct sc_error *err)
{
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
    return signals_init(app, err);
}

int app_start(struct app *app, struct sc_config *cfg, struct sc_error *err)
{
    int rc;

    memset(app, 0, sizeof *app);
    app->listen_fd = -1;
    pthread_mutex_init(&app->rt_mu, NULL);
    pthread_mutex_init(&app->reload_mu, NULL);
    log_set_level(cfg->log.level);
    if (fixed_init(&app->fixed, cfg) != 0) {
        config_free(cfg);
        sc_error_set(err, "out of memory");
        return -ENOMEM;
    }
    app->n_loops = resolve_threads(cfg->threads);
    /* Before anything is opened: the store's files count too. */
    app->fd_limit = server_fd_limit(cfg, app->n_loops);
    /* One shard per loop plus one for the main and admin threads. */
    metrics_init(&app->metrics, app->n_loops + 1);
    if ((rc = base_init(app, err)) != 0 || (rc = store_init(app, err)) != 0) {
        config_free(cfg);
        return rc;
    }
    app->listen_fd = server_listen(&cfg->listen, 1024, err);
    if (app->listen_fd < 0) {
        config_free(cfg);
        return app->listen_fd;
    }
    if ((rc = loops_init(app, err)) != 0) {
        config_free(cfg);
        return rc;
    }
    if ((rc = runtime_new(app, cfg, NULL, &app->rt, err)) != 0)
        return rc;
    restore_pauses(app, app->rt);
    for (unsigned i = 0; i < app->n_loops; i++)
        app->loops[i].rt = runtime_acquire(app);
    /* Before the loops run: their timers are set from this thread. */
    verification_resume_all(app);
    /* And before they serve: the leases they take name a live holder. */
    if ((rc = holder_live_start(app, err)) != 0)
        return rc;
    dup_notice_follow(app, app->rt->cfg);
    if ((rc = loops_start(app, err)) != 0)
        return rc;
    if ((rc = admin_start(app, &app->admin, err)) != 0)
        return rc;
    /* On the main loop, which also runs the signals and the drain: if it
     * wedges, the pings stop and systemd restarts sluice. */
    if ((rc = notify_watchdog_start(app->main_base, &app->watchdog, app_alive, app, err)) != 0)
        return rc;
    atomic_store(&app->last_reload_ok, true);
    atomic_store(&app->last_reload_ok_ms, clock_wall_ms());
    atomic_store(&app->ready, true);
    log_info("sluice %s (%s) listening on %s:%u (admin %s:%u), %u threads",
             version_sluice(), version_revision(), app->fixed.listen.host,
             app->fixed.listen.port, app->fixed.admin.host, app->fixed.admin.port,
             app->n_loops);
    /* The store is open and both listeners accept: what /readyz says too. */
    notify_ready();
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
    admin_stop(app->admin);
    dup_notice_stop(app); /* the store's thread wakes the loops' waiters */
    /* Loops first, so nothing uses a runtime; from here runtimes are freed
     * in place by whoever drops the last reference. */
    for (unsigned i = 0; app->loops && i < app->n_loops; i++)
        loop_join(&app->loops[i]);
    atomic_store(&app->loops_stopped, true);
    for (unsigned i = 0; app->loops && i < app->n_loops; i++)
        loop_stop_daemon(&app->loops[i]);
    swap_in(app, NULL);
    for (unsigned i = 0; app->loops && i < app->n_loops; i++)
        loop_drop_runtime(&app->loops[i]);
    for (unsigned i = 0; app->loops && i < app->n_loops; i++)
        loop_stop(&app->loops[i]);
    free(app->loops);
    free_event(app->sweep_ev);
    /* After the loops: every answered result is in the store; flush it. */
    store_close(app->store);
    if (app->claims.table)
        claims_free(&app->claims);
    if (app->metrics.n_shards)
        metrics_free(&app->metrics);
    if (app->listen_fd >= 0)
        close(atomic_exchange(&app->listen_fd, -1));
    free_event(app->sig_term);
    free_event(app->sig_int);
    free_event(app->sig_hup);
    free_event(app->drain_tick);
    free_event(app->watchdog);
    free_event(app->live_tick);
    if (app->main_base)
        event_base_free(app->main_base);
    fixed_free(&app->fixed);
    pthread_mutex_destroy(&app->rt_mu);
    pthread_mutex_destroy(&app->reload_mu);
    memset(app, 0, sizeof *app);
    app->listen_fd = -1;
}
