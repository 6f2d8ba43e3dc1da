#define _GNU_SOURCE
#include "proxy/admin.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <jansson.h>
#include <microhttpd.h>
#include <openssl/evp.h>

#include "proxy/admin_guard.h"
#include "proxy/admin_policies.h"
#include "proxy/app.h"
#include "obs/log.h"
#include "policies/gcra.h"
#include "policies/verify.h"
#include "obs/metrics.h"
#include "obs/process.h"
#include "pacing/pacing.h"
#include "proxy/server/server.h"
#include "proxy/version.h"
#include "store/store.h"
#include "util/clock.h"
#include "util/json_escape.h"

static enum MHD_Result reply(struct MHD_Connection *c, unsigned status,
                             const char *type, char *body, bool owned)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(
        strlen(body), body, owned ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    enum MHD_Result rc;

    if (!r) {
        if (owned)
            free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    MHD_add_response_header(r, "Cache-Control", "no-store");
    rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

/* Every error answer is JSON, {"error": TEXT}, like the 403s and the 404 of
 * a missing record: a script reading the admin port parses one format. */
static enum MHD_Result reply_error(struct MHD_Connection *c, unsigned status,
                                   const char *text)
{
    json_t *j = json_pack("{ss}", "error", text);
    char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
    char *line = NULL;

    json_decref(j);
    if (body && asprintf(&line, "%s\n", body) < 0)
        line = NULL;
    free(body);
    if (!line)
        return reply(c, status, "application/json", "{\"error\":\"out of memory\"}\n", false);
    return reply(c, status, "application/json", line, true);
}

static enum MHD_Result get_config(struct app *app, struct MHD_Connection *c)
{
    struct runtime *rt = runtime_acquire(app);
    char *json = config_to_json(rt->cfg);

    runtime_put(rt);
    if (!json)
        return reply_error(c, 500, "out of memory");
    return reply(c, 200, "application/json", json, true);
}

/* ---- /idempotency/{policy}/{key} ---------------------------------------- */

static char *hex(const uint8_t *p, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", p[i]);
    return out;
}

static json_t *record_json(const struct store_record *r, bool body)
{
    char fp[2 * STORE_FP_LEN + 1];
    json_t *j = json_object();

    json_object_set_new(j, "state", json_string(r->state == STORE_COMPLETED
                                                    ? "completed" : "in_progress"));
    json_object_set_new(j, "attempt", json_integer(r->attempt));
    if (r->state == STORE_COMPLETED) {
        json_object_set_new(j, "status", json_integer(r->status));
        json_object_set_new(j, "completed_at", json_integer((json_int_t)(r->completed_ms / 1000)));
        if (r->body_omitted)
            json_object_set_new(j, "body_omitted", json_true());
    } else {
        json_object_set_new(j, "lease_expires_at",
                            json_integer((json_int_t)(r->lease_expires_ms / 1000)));
    }
    json_object_set_new(j, "created_at", json_integer((json_int_t)(r->created_ms / 1000)));
    json_object_set_new(j, "expires_at", json_integer((json_int_t)(r->expires_ms / 1000)));
    json_object_set_new(j, "fingerprint", json_string(hex(r->fingerprint, STORE_FP_LEN, fp)));
    /* Only once a verification of the current lease started (§11). */
    if (verify_state_name(r->verify))
        json_object_set_new(j, "verify", json_string(verify_state_name(r->verify)));
    if (r->verified)
        json_object_set_new(j, "verified", json_true());
    if (body && r->state == STORE_COMPLETED) {
        char *b64 = malloc(4 * ((r->body_len + 2) / 3) + 1);
        if (b64) {
            EVP_EncodeBlock((unsigned char *)b64, r->body, (int)r->body_len);
            json_object_set_new(j, "body_base64", json_string(b64));
            free(b64);
        }
    }
    return j;
}

static bool known_policy(struct app *app, const char *name)
{
    struct runtime *rt = runtime_acquire(app);
    bool known = config_policy_index(rt->cfg, name) >= 0;

    runtime_put(rt);
    return known;
}

static enum MHD_Result idempotency(struct app *app, struct MHD_Connection *c,
                                   const char *rest, bool del)
{
    const char *slash = strchr(rest, '/');
    char policy[128], *json;
    struct store_record rec = {0};
    struct sc_error err = {0};
    uint64_t now = clock_wall_ms();
    const char *body = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "body");
    int rc;

    if (!slash || slash == rest || !slash[1] || (size_t)(slash - rest) >= sizeof policy)
        return reply_error(c, 404, "use /idempotency/{policy}/{key}");
    memcpy(policy, rest, (size_t)(slash - rest));
    policy[slash - rest] = '\0';
    if (!known_policy(app, policy))
        return reply_error(c, 404, "no such policy");
    if (del) {
        rc = store_forget(app->store, policy, slash + 1, &err);
        if (rc == 0)
            return reply(c, 200, "application/json", "{\"forgotten\":true}\n", false);
    } else {
        rc = store_get(app->store, policy, slash + 1, now, &rec, &err);
        if (rc == 0) {
            json_t *j = record_json(&rec, body && strcmp(body, "1") == 0);
            json = json_dumps(j, JSON_COMPACT);
            json_decref(j);
            store_record_clear(&rec);
            return json ? reply(c, 200, "application/json", json, true)
                        : reply_error(c, 500, "out of memory");
        }
    }
    if (rc == -ENOENT)
        return reply(c, 404, "application/json", "{\"error\":\"no record\"}\n", false);
    return reply_error(c, 503, "idempotency store unavailable");
}

/* ---- /metrics ----------------------------------------------------------- */

static void gauge_head(FILE *f, const char *name, const char *help)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s gauge\n", name, help, name);
}

/* Gauges are read at scrape time from the live state, not recorded. */
static void policy_gauges(FILE *f, struct runtime *rt, bool store_up)
{
    const struct sc_config *cfg = rt->cfg;
    struct pacing *pc = &rt->pacing;
    uint64_t now = clock_mono_ns();

    gauge_head(f, "sluice_bucket_tokens", "Permits available now in the policy's bucket.");
    for (size_t i = 0; i < cfg->n_policies; i++)
        if (pc->pol[i]->has_bucket)
            fprintf(f, "sluice_bucket_tokens{policy=\"%s\"} %u\n", cfg->policies[i].name,
                    bucket_available(&pc->pol[i]->bucket, now, NULL));
    /* Beside the tokens, what they are out of: a panel or an alert reads
     * "tokens / burst" without the config at hand. */
    gauge_head(f, "sluice_bucket_rate", "The policy's configured rate, in permits per second "
               "(for a shared policy, the fleet's).");
    for (size_t i = 0; i < cfg->n_policies; i++)
        if (cfg->policies[i].has_rate)
            fprintf(f, "sluice_bucket_rate{policy=\"%s\"} %.17g\n", cfg->policies[i].name,
                    cfg->policies[i].rate);
    gauge_head(f, "sluice_policy_rate", "The policy's effective rate in permits per second: "
               "its rate, or what its partner's advertised quota allows (quota.follow).");
    for (size_t i = 0; i < cfg->n_policies; i++)
        if (cfg->policies[i].has_rate)
            fprintf(f, "sluice_policy_rate{policy=\"%s\"} %.17g\n", cfg->policies[i].name,
                    admin_policy_rate(&cfg->policies[i], pc->pol[i], now));
    gauge_head(f, "sluice_bucket_burst", "The policy's configured burst: the most permits its "
               "bucket holds.");
    for (size_t i = 0; i < cfg->n_policies; i++)
        if (cfg->policies[i].has_rate)
            fprintf(f, "sluice_bucket_burst{policy=\"%s\"} %u\n", cfg->policies[i].name,
                    cfg->policies[i].burst);
    gauge_head(f, "sluice_inflight", "Requests of the policy in flight upstream.");
    for (size_t i = 0; i <= cfg->n_policies; i++) {
        struct policy_state *ps = pacing_policy(pc, i < cfg->n_policies ? (long)i : -1);
        fprintf(f, "sluice_inflight{policy=\"%s\"} %u\n",
                i < cfg->n_policies ? cfg->policies[i].name : "default", pacing_inflight(ps));
    }
    /* Redis down is every shared policy's fallback at once, whether or not a
     * request has met it yet: an alert on this gauge must not wait for one. */
    gauge_head(f, "sluice_bucket_fallback",
               "1 while a shared policy paces locally because Redis does not answer.");
    for (size_t i = 0; i < cfg->n_policies; i++)
        if (pc->pol[i]->shared)
            fprintf(f, "sluice_bucket_fallback{policy=\"%s\"} %d\n", cfg->policies[i].name,
                    !store_up || atomic_load(&pc->pol[i]->fallback) ? 1 : 0);
    gauge_head(f, "sluice_cooldown_seconds", "Seconds left of the cooldown an upstream imposed.");
    for (size_t i = 0; i < cfg->n_policies; i++) {
        uint64_t until = bucket_cooldown(&pc->pol[i]->bucket);
        if (pc->pol[i]->has_bucket)
            fprintf(f, "sluice_cooldown_seconds{policy=\"%s\"} %.3f\n", cfg->policies[i].name,
                    until > now ? (double)(until - now) / 1e9 : 0.0);
    }
}

/* Which build answers, as the Prometheus convention has it (a gauge at 1
 * whose labels are the facts), to join on in queries and to see a rollout. */
static void build_info(FILE *f)
{
    gauge_head(f, "sluice_build_info", "The running build: version and git revision.");
    fprintf(f, "sluice_build_info{version=\"%s\",revision=\"%s\"} 1\n", version_sluice(),
            version_revision());
}

/* A scrape that cannot read /proc still serves sluice's own families. */
static void process_families(FILE *f)
{
    struct sc_error err = {0};

    if (process_metrics_write(f, &err) != 0)
        log_debug("metrics: process families left out: %s", err.text);
}

static char *gauges(struct app *app)
{
    struct runtime *rt;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    bool store_up;

    if (!f)
        return NULL;
    /* Read once: every gauge of one scrape tells the same story. */
    store_up = store_healthy(app->store);
    build_info(f);
    process_families(f);
    rt = runtime_acquire(app);
    policy_gauges(f, rt, store_up);
    runtime_put(rt);
    /* As Prometheus exports its own (prometheus_config_last_reload_*): an
     * alert on "== 0" catches a refused file, which the counter only shows
     * as a rate. */
    gauge_head(f, "sluice_config_last_reload_successful",
               "1 when the last config load (start or reload) succeeded, 0 when refused.");
    fprintf(f, "sluice_config_last_reload_successful %d\n",
            atomic_load(&app->last_reload_ok) ? 1 : 0);
    gauge_head(f, "sluice_config_last_reload_success_timestamp_seconds",
               "Unix time of the last config load that succeeded.");
    fprintf(f, "sluice_config_last_reload_success_timestamp_seconds %.3f\n",
            (double)atomic_load(&app->last_reload_ok_ms) / 1000.0);
    gauge_head(f, "sluice_leases_active", "Durable idempotency leases held by requests in flight.");
    fprintf(f, "sluice_leases_active %ld\n", atomic_load(&app->leases_active));
    gauge_head(f, "sluice_store_up", "1 while the idempotency store answers and accepts writes.");
    fprintf(f, "sluice_store_up %d\n", store_up ? 1 : 0);
    /* Read from the store's subscriber, as a gauge is: a counter all the
     * same (it only grows). */
    fprintf(f, "# HELP sluice_store_notifications_total Ends of leases the fleet's "
               "store announced to this process (duplicates: wait).\n"
               "# TYPE sluice_store_notifications_total counter\n"
               "sluice_store_notifications_total %llu\n",
            (unsigned long long)store_notices(app->store));
    gauge_head(f, "sluice_store_records", "Records in the idempotency store (estimate).");
    fprintf(f, "sluice_store_records %llu\n", (unsigned long long)store_count(app->store));
    gauge_head(f, "sluice_connections", "Open worker connections.");
    fprintf(f, "sluice_connections %ld\n", atomic_load(&app->conns));
    gauge_head(f, "sluice_ready", "1 when /readyz answers 200.");
    fprintf(f, "sluice_ready %d\n", atomic_load(&app->ready) && !atomic_load(&app->draining) &&
                                     store_up);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

static enum MHD_Result get_metrics(struct app *app, struct MHD_Connection *c)
{
    char *g = gauges(app), *text = metrics_render(&app->metrics, g);

    free(g);
    if (!text)
        return reply_error(c, 500, "out of memory");
    return reply(c, 200, "text/plain; version=0.0.4; charset=utf-8", text, true);
}

/* ---- /reload ------------------------------------------------------------ */

/* {"reloaded": true, "summary": LINE}, or {"reloaded": false, "error": ...,
 * "errors": [LINE, ...]} with each problem as FILE:LINE:COL: message. */
static char *reload_json(int rc, const char *msg)
{
    json_t *j = json_object(), *lines = json_array();
    const char *p = msg, *nl;
    char *text, *out = NULL;

    for (; *p; p = *nl ? nl + 1 : nl) {
        nl = p + strcspn(p, "\n");
        if (nl > p)
            json_array_append_new(lines, json_stringn(p, (size_t)(nl - p)));
    }
    json_object_set_new(j, "reloaded", json_boolean(rc == 0));
    if (rc == 0) {
        json_object_set_new(j, "summary", json_array_size(lines)
                                              ? json_incref(json_array_get(lines, 0))
                                              : json_string(""));
    } else {
        json_object_set_new(j, "error", json_string("config refused: the running config "
                                                    "is kept"));
        json_object_set(j, "errors", lines);
    }
    json_decref(lines);
    text = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (text && asprintf(&out, "%s\n", text) < 0)
        out = NULL;
    free(text);
    return out;
}

static enum MHD_Result post_reload(struct app *app, struct MHD_Connection *c)
{
    char *msg = NULL, *json;
    int rc = app_reload(app, &msg);

    json = msg ? reload_json(rc, msg) : NULL;
    free(msg);
    if (!json)
        return reply_error(c, 500, "out of memory");
    return reply(c, rc == 0 ? 200 : 400, "application/json", json, true);
}

/* ---- /cooldowns ----------------------------------------------------------- */

struct pause_list {
    json_t *arr;
    const char *policy;
    uint64_t mono_ns, wall_ms;
};

/* One running pause: `until` in Unix seconds rounded up (never before the
 * real end), `remaining_ms` rounded up too. */
static void add_pause(void *arg, const char *partition, uint64_t until,
                      enum pause_why why)
{
    struct pause_list *pl = arg;
    uint64_t left_ms = (until - pl->mono_ns + 999999) / 1000000;
    json_t *o = json_object();

    json_object_set_new(o, "policy", json_string(pl->policy));
    if (partition)
        json_object_set_new(o, "partition", json_string(partition));
    json_object_set_new(o, "until", json_integer((json_int_t)((pl->wall_ms + left_ms + 999) / 1000)));
    json_object_set_new(o, "remaining_ms", json_integer((json_int_t)left_ms));
    json_object_set_new(o, "why", json_string(pause_why_name(why)));
    json_array_append_new(pl->arr, o);
}

static enum MHD_Result get_cooldowns(struct app *app, struct MHD_Connection *c)
{
    struct runtime *rt = runtime_acquire(app);
    struct pause_list pl = {json_array(), NULL, clock_mono_ns(), clock_wall_ms()};
    json_t *root = json_object();
    char *text;

    for (size_t i = 0; i < rt->cfg->n_policies; i++) {
        pl.policy = rt->cfg->policies[i].name;
        pacing_pauses(rt->pacing.pol[i], pl.mono_ns, add_pause, &pl);
    }
    runtime_put(rt);
    json_object_set_new(root, "cooldowns", pl.arr);
    text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!text)
        return reply_error(c, 500, "out of memory");
    return reply(c, 200, "application/json", text, true);
}

/* The store first: if it cannot forget the pause, nothing changes and the
 * operator can retry, rather than a pause ended now coming back at the next
 * restart. */
static enum MHD_Result delete_cooldown(struct app *app, struct MHD_Connection *c,
                                       const char *policy)
{
    struct runtime *rt = runtime_acquire(app);
    long idx = config_policy_index(rt->cfg, policy);
    struct sc_error err = {0};
    size_t ended;
    char *text;
    int rc;

    if (idx < 0) {
        runtime_put(rt);
        return reply(c, 404, "application/json", "{\"error\":\"no such policy\"}\n", false);
    }
    rc = store_pause_clear(app->store, policy, &err);
    if (rc != 0 && rc != -ENOENT) {
        runtime_put(rt);
        log_warn("admin: cooldown of policy %s not ended: %s", policy, err.text);
        return reply(c, 503, "application/json",
                     "{\"error\":\"idempotency store unavailable: nothing changed\"}\n", false);
    }
    ended = pacing_resume(rt->pacing.pol[idx], clock_mono_ns());
    runtime_put(rt);
    log_info("admin: cooldown of policy %s ended by an operator (%zu pauses running)",
             policy, ended);
    if (asprintf(&text, "{\"policy\":\"%s\",\"ended\":%zu}\n", policy, ended) < 0)
        return reply_error(c, 500, "out of memory");
    return reply(c, 200, "application/json", text, true);
}

/* ---- routing ------------------------------------------------------------ */

enum { M_GET = 1, M_POST = 2, M_DELETE = 4 };

struct admin_req {
    struct app *app;
    struct MHD_Connection *c;
    const char *rest;    /* the URL after the endpoint's path */
    unsigned method;     /* M_*; 0 for any other method */
};

typedef enum MHD_Result (*endpoint_fn)(struct admin_req *rq);

/* One row per path and method. A path ending in "/" matches everything under
 * it; `guard` says whether the request needs loopback or the token. */
struct endpoint {
    unsigned method;
    const char *path, *usage, *what;
    endpoint_fn fn;
    bool (*guard)(struct admin_req *rq);
};

static bool always(struct admin_req *rq)
{
    return true;
}

/* A stored body may hold what the partner returned to one job: personal
 * data, a token. */
static bool asks_body(struct admin_req *rq)
{
    const char *body = MHD_lookup_connection_value(rq->c, MHD_GET_ARGUMENT_KIND, "body");

    return body && strcmp(body, "1") == 0;
}

static enum MHD_Result ep_index(struct admin_req *rq);

/* A liveness probe: the process answers, and every request loop still turns
 * (a wedged loop holds its workers' requests forever; a restart frees them). */
static enum MHD_Result ep_healthz(struct admin_req *rq)
{
    uint64_t ms = 0;
    long i = app_stalled_loop(rq->app, &ms);
    char *text;

    if (i < 0)
        return reply(rq->c, 200, "text/plain", "ok\n", false);
    if (asprintf(&text, "{\"healthy\": false, \"reason\": \"loop_stalled\", \"loop\": %ld, "
                        "\"stalled_ms\": %llu}\n", i, (unsigned long long)ms) < 0)
        return reply_error(rq->c, 503, "loop_stalled");
    return reply(rq->c, 503, "application/json", text, true);
}

/* {"ready": false, "reason": "store_unavailable", "cause": "..."}: the
 * store's own words (a TLS failure, refused credentials, no answer), never
 * a secret (store_unhealthy_cause). */
static enum MHD_Result store_unready(struct admin_req *rq)
{
    char cause[256], body[640], *owned;
    size_t pos = 0;

    store_unhealthy_cause(rq->app->store, cause, sizeof cause);
    json_text_put(body, sizeof body, &pos, "{\"ready\": false, \"reason\": \"store_unavailable\"");
    if (cause[0]) {
        json_text_put(body, sizeof body, &pos, ", \"cause\": ");
        json_escape_append(body, sizeof body, &pos, cause, strlen(cause));
    }
    json_text_put(body, sizeof body, &pos, "}\n");
    if (!(owned = strdup(body)))
        return reply_error(rq->c, 503, "store_unavailable");
    return reply(rq->c, 503, "application/json", owned, true);
}

static enum MHD_Result ep_readyz(struct admin_req *rq)
{
    struct app *app = rq->app;

    /* JSON naming the cause, so a probe's log says why (contract §10). */
    if (atomic_load(&app->ready) && !atomic_load(&app->draining) && store_healthy(app->store))
        return reply(rq->c, 200, "application/json", "{\"ready\": true}\n", false);
    if (!atomic_load(&app->draining) && !store_healthy(app->store))
        return store_unready(rq);
    return reply(rq->c, 503, "application/json",
                 atomic_load(&app->draining) ? "{\"ready\": false, \"reason\": \"draining\"}\n"
                     : "{\"ready\": false, \"reason\": \"starting\"}\n",
                 false);
}

static enum MHD_Result ep_config(struct admin_req *rq)
{
    return get_config(rq->app, rq->c);
}

static enum MHD_Result ep_metrics(struct admin_req *rq)
{
    return get_metrics(rq->app, rq->c);
}

static enum MHD_Result ep_reload(struct admin_req *rq)
{
    return post_reload(rq->app, rq->c);
}

static enum MHD_Result ep_idem_get(struct admin_req *rq)
{
    return idempotency(rq->app, rq->c, rq->rest, false);
}

static enum MHD_Result ep_idem_delete(struct admin_req *rq)
{
    return idempotency(rq->app, rq->c, rq->rest, true);
}

static enum MHD_Result ep_cooldowns(struct admin_req *rq)
{
    return get_cooldowns(rq->app, rq->c);
}

static enum MHD_Result ep_policies(struct admin_req *rq)
{
    struct runtime *rt = runtime_acquire(rq->app);
    json_t *root = admin_policies_json(rt->cfg, &rt->pacing, clock_mono_ns(),
                                       clock_wall_ms());
    char *text = root ? json_dumps(root, JSON_COMPACT) : NULL;

    runtime_put(rt);
    json_decref(root);
    if (!text)
        return reply_error(rq->c, 500, "out of memory");
    return reply(rq->c, 200, "application/json", text, true);
}

static enum MHD_Result ep_cooldown_delete(struct admin_req *rq)
{
    return delete_cooldown(rq->app, rq->c, rq->rest);
}

static const struct endpoint endpoints[] = {
    {M_GET, "/", "/", "this list", ep_index, NULL},
    {M_GET, "/healthz", "/healthz", "200 while every request loop turns; 503 when one "
     "has not for 10 s", ep_healthz, NULL},
    {M_GET, "/readyz", "/readyz", "200 once the config is loaded and the store open; "
     "503 while starting, draining or the store is unavailable", ep_readyz, NULL},
    {M_GET, "/config", "/config", "the effective config as JSON, secrets redacted",
     ep_config, NULL},
    {M_GET, "/metrics", "/metrics", "Prometheus text exposition 0.0.4", ep_metrics, NULL},
    {M_POST, "/reload", "/reload", "reread the config file, as SIGHUP", ep_reload, always},
    {M_GET, "/idempotency/", "/idempotency/{policy}/{key}", "a stored record as JSON; "
     "?body=1 adds body_base64 (guarded)", ep_idem_get, asks_body},
    {M_DELETE, "/idempotency/", "/idempotency/{policy}/{key}", "forget a record",
     ep_idem_delete, always},
    {M_GET, "/cooldowns", "/cooldowns", "running pauses of policies and partitions: "
     "until (Unix s), remaining_ms, why", ep_cooldowns, NULL},
    {M_DELETE, "/cooldowns/", "/cooldowns/{policy}", "end a policy's pauses now, "
     "the one kept in the store too", ep_cooldown_delete, always},
    {M_GET, "/policies", "/policies", "each policy's configured and effective rate and "
     "burst, the rate's source, the partner's last advertised quota, its lanes",
     ep_policies, NULL},
};
#define N_ENDPOINTS (sizeof endpoints / sizeof *endpoints)

static const char *method_name(unsigned m)
{
    return m == M_GET ? "GET" : m == M_POST ? "POST" : "DELETE";
}

static enum MHD_Result ep_index(struct admin_req *rq)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);

    if (!f)
        return reply_error(rq->c, 500, "out of memory");
    fputs("sluice admin endpoints (* guarded: served on loopback connections only, or\n"
          "  with Authorization: Bearer <admin_token> once admin_token is set)\n\n", f);
    for (size_t i = 0; i < N_ENDPOINTS; i++) {
        const struct endpoint *e = &endpoints[i];
        fprintf(f, "%-6s %-28s %c %s\n", method_name(e->method), e->usage,
                e->guard == always ? '*' : ' ', e->what);
    }
    if (fclose(f) != 0) {
        free(buf);
        return reply_error(rq->c, 500, "out of memory");
    }
    return reply(rq->c, 200, "text/plain; charset=utf-8", buf, true);
}

static unsigned method_bit(const char *m)
{
    if (!strcmp(m, "GET") || !strcmp(m, "HEAD"))
        return M_GET;
    return !strcmp(m, "POST") ? M_POST : !strcmp(m, "DELETE") ? M_DELETE : 0;
}

/* The rest of url after e's path, or NULL when e does not match it. A
 * prefix path ("/x/") also stands for itself without the slash only when
 * no exact row does, which none needs: "/cooldowns" is its own row. */
static const char *match(const struct endpoint *e, const char *url)
{
    size_t n = strlen(e->path);

    if (e->path[n - 1] == '/' && n > 1)
        return strncmp(url, e->path, n) == 0 ? url + n : NULL;
    return strcmp(url, e->path) == 0 ? url + n : NULL;
}

#define NOT_ALLOWED "{\"error\":\"method not allowed (see the Allow header)\"}\n"

static enum MHD_Result not_allowed(struct MHD_Connection *c, unsigned allowed)
{
    static const char *const names[] = {"GET, HEAD", "POST", "DELETE"};
    char allow[32] = "";
    size_t used = 0;
    struct MHD_Response *r;
    enum MHD_Result rc;

    for (unsigned i = 0; i < 3; i++)
        if (allowed & (1u << i))
            used += (size_t)snprintf(allow + used, sizeof allow - used, "%s%s",
                                     used ? ", " : "", names[i]);
    r = MHD_create_response_from_buffer(strlen(NOT_ALLOWED), NOT_ALLOWED,
                                        MHD_RESPMEM_PERSISTENT);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, "Allow", allow);
    MHD_add_response_header(r, "Content-Type", "application/json");
    MHD_add_response_header(r, "Cache-Control", "no-store");
    rc = MHD_queue_response(c, 405, r);
    MHD_destroy_response(r);
    return rc;
}

/* Refusals are logged with the peer: a 403 from the network is either a
 * misconfigured client or someone probing, and both are worth knowing. */
static enum MHD_Result forbidden(struct admin_req *rq, const struct endpoint *e,
                                 enum admin_access a)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(rq->c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    char peer[INET6_ADDRSTRLEN] = "?", *text;
    const struct sockaddr *sa = ci ? ci->client_addr : NULL;

    if (sa && sa->sa_family == AF_INET)
        inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, peer, sizeof peer);
    else if (sa && sa->sa_family == AF_INET6)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, peer, sizeof peer);
    /* The endpoint's usage, not the URL: a decoded URL may hold a newline. */
    log_warn("admin: %s %s from %s refused: %s", method_name(e->method), e->usage, peer,
             admin_access_why(a));
    if (asprintf(&text, "{\"error\":\"forbidden\",\"why\":\"%s\"}\n", admin_access_why(a)) < 0)
        return reply_error(rq->c, 403, "forbidden");
    return reply(rq->c, 403, "application/json", text, true);
}

static enum admin_access check_access(struct admin_req *rq)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(rq->c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    const char *auth = MHD_lookup_connection_value(rq->c, MHD_HEADER_KIND, "Authorization");
    struct runtime *rt = runtime_acquire(rq->app);
    enum admin_access a = admin_peer_trusted(ci ? ci->client_addr : NULL, auth,
                                             rt->cfg->admin_token);

    runtime_put(rt);
    return a;
}

/* Unknown path: 404. Known path, other method: 405 with Allow. Then the
 * guard, then the endpoint. */
static enum MHD_Result route_admin(struct app *app, struct MHD_Connection *c,
                                   const char *url, const char *method)
{
    struct admin_req rq = {app, c, NULL, method_bit(method)};
    unsigned allowed = 0;
    const struct endpoint *hit = NULL;
    enum admin_access a;

    for (size_t i = 0; i < N_ENDPOINTS && !hit; i++) {
        const char *rest = match(&endpoints[i], url);
        if (!rest)
            continue;
        allowed |= endpoints[i].method;
        if (endpoints[i].method == rq.method) {
            hit = &endpoints[i];
            rq.rest = rest;
        }
    }
    if (!hit)
        return allowed ? not_allowed(c, allowed)
                       : reply_error(c, 404, "not found (GET / lists the endpoints)");
    if (hit->guard && hit->guard(&rq) && (a = check_access(&rq)) != ADMIN_ALLOWED)
        return forbidden(&rq, hit, a);
    return hit->fn(&rq);
}

static enum MHD_Result on_admin(void *cls, struct MHD_Connection *c,
                                const char *url, const char *method,
                                const char *version, const char *upload_data,
                                size_t *upload_data_size, void **con_cls)
{
    static int marker;

    /* Admin requests have no body worth reading; answer on the second call,
     * once MHD has the whole request. */
    if (!*con_cls) {
        *con_cls = &marker;
        return MHD_YES;
    }
    if (*upload_data_size) {
        *upload_data_size = 0;
        return MHD_YES;
    }
    return route_admin(cls, c, url, method);
}

/* ---- the daemon ----------------------------------------------------------- */

/* Idle admin connections must never starve a probe. A thread per connection
 * would cost a stack each for hundreds of sockets doing nothing; instead, as
 * nginx and HAProxy do, one event loop (epoll) holds many connections for
 * the price of a descriptor and a small buffer each, and a short idle
 * timeout (their client_header_timeout / timeout http-request and
 * keep-alive timeouts) reclaims those that sent no complete request or sit
 * idle after one. MHD has a single inactivity timer, so it serves for all:
 * an admin answer is produced at once, so a live client never pauses that
 * long. The limit is high enough for hundreds held open, yet a quarter of
 * the descriptor limit at most, so the admin port cannot eat the workers'. */
#define ADMIN_MAX_CONNS 1024u
#define ADMIN_MIN_CONNS 64u
#define ADMIN_IDLE_TIMEOUT_S 10u
#define ADMIN_BACKLOG 512

static unsigned admin_conn_limit(void)
{
    struct rlimit rl;
    rlim_t quarter;

    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
        return ADMIN_MAX_CONNS;
    quarter = rl.rlim_cur / 4;
    if (quarter < ADMIN_MIN_CONNS)
        return ADMIN_MIN_CONNS;
    return quarter > ADMIN_MAX_CONNS ? ADMIN_MAX_CONNS : (unsigned)quarter;
}

int admin_start(struct app *app, struct MHD_Daemon **out,
                struct sc_error *err)
{
    struct MHD_Daemon *d;
    int fd = server_listen(&app->fixed.admin, ADMIN_BACKLOG, err);

    if (fd < 0)
        return fd;
    d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL, 0,
                         NULL, NULL, on_admin, app,
                         MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd,
                         MHD_OPTION_CONNECTION_LIMIT, admin_conn_limit(),
                         MHD_OPTION_CONNECTION_TIMEOUT, ADMIN_IDLE_TIMEOUT_S,
                         MHD_OPTION_END);
    if (!d) {
        sc_error_set(err, "cannot start the admin server on %s:%u",
                     app->fixed.admin.host, app->fixed.admin.port);
        close(fd);
        return -EIO;
    }
    *out = d;
    return 0;
}

void admin_stop(struct MHD_Daemon *d)
{
    if (d)
        MHD_stop_daemon(d);
}
