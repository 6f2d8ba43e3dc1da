#include "proxy/admin.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <errno.h>
#include <stdio.h>

#include <jansson.h>
#include <microhttpd.h>
#include <openssl/evp.h>

#include "proxy/app.h"
#include "policies/gcra.h"
#include "proxy/metrics.h"
#include "proxy/pacing.h"
#include "proxy/server.h"
#include "store/store.h"
#include "util/clock.h"

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

static enum MHD_Result get_config(struct app *app, struct MHD_Connection *c)
{
    struct runtime *rt = runtime_acquire(app);
    char *json = config_to_json(rt->cfg);

    runtime_put(rt);
    if (!json)
        return reply(c, 500, "text/plain", "out of memory\n", false);
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
        return reply(c, 404, "text/plain", "use /idempotency/{policy}/{key}\n", false);
    memcpy(policy, rest, (size_t)(slash - rest));
    policy[slash - rest] = '\0';
    if (!known_policy(app, policy))
        return reply(c, 404, "text/plain", "no such policy\n", false);
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
                        : reply(c, 500, "text/plain", "out of memory\n", false);
        }
    }
    if (rc == -ENOENT)
        return reply(c, 404, "application/json", "{\"error\":\"no record\"}\n", false);
    return reply(c, 503, "text/plain", "idempotency store unavailable\n", false);
}

/* ---- /metrics ----------------------------------------------------------- */

static void gauge_head(FILE *f, const char *name, const char *help)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s gauge\n", name, help, name);
}

/* Gauges are read at scrape time from the live state, not recorded. */
static void policy_gauges(FILE *f, struct runtime *rt)
{
    const struct sc_config *cfg = rt->cfg;
    struct pacing *pc = &rt->pacing;
    uint64_t now = clock_mono_ns();

    gauge_head(f, "sluice_bucket_tokens", "Permits available now in the policy's bucket.");
    for (size_t i = 0; i < cfg->n_policies; i++)
        if (pc->pol[i]->has_bucket)
            fprintf(f, "sluice_bucket_tokens{policy=\"%s\"} %u\n", cfg->policies[i].name,
                    gcra_available(&pc->pol[i]->bucket.g, now, NULL));
    gauge_head(f, "sluice_inflight", "Requests of the policy in flight upstream.");
    for (size_t i = 0; i <= cfg->n_policies; i++) {
        struct policy_state *ps = pacing_policy(pc, i < cfg->n_policies ? (long)i : -1);
        fprintf(f, "sluice_inflight{policy=\"%s\"} %u\n",
                i < cfg->n_policies ? cfg->policies[i].name : "default", pacing_inflight(ps));
    }
    gauge_head(f, "sluice_cooldown_seconds", "Seconds left of the cooldown an upstream imposed.");
    for (size_t i = 0; i < cfg->n_policies; i++) {
        uint64_t until = atomic_load(&pc->pol[i]->bucket.cooldown_until);
        if (pc->pol[i]->has_bucket)
            fprintf(f, "sluice_cooldown_seconds{policy=\"%s\"} %.3f\n", cfg->policies[i].name,
                    until > now ? (double)(until - now) / 1e9 : 0.0);
    }
}

static char *gauges(struct app *app)
{
    struct runtime *rt;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);

    if (!f)
        return NULL;
    rt = runtime_acquire(app);
    policy_gauges(f, rt);
    runtime_put(rt);
    gauge_head(f, "sluice_leases_active", "Durable idempotency leases held by requests in flight.");
    fprintf(f, "sluice_leases_active %ld\n", atomic_load(&app->leases_active));
    gauge_head(f, "sluice_store_records", "Records in the idempotency store (estimate).");
    fprintf(f, "sluice_store_records %llu\n", (unsigned long long)store_count(app->store));
    gauge_head(f, "sluice_connections", "Open worker connections.");
    fprintf(f, "sluice_connections %ld\n", atomic_load(&app->conns));
    gauge_head(f, "sluice_ready", "1 when /readyz answers 200.");
    fprintf(f, "sluice_ready %d\n", atomic_load(&app->ready) && !atomic_load(&app->draining) &&
                                     store_healthy(app->store));
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
        return reply(c, 500, "text/plain", "out of memory\n", false);
    return reply(c, 200, "text/plain; version=0.0.4; charset=utf-8", text, true);
}

/* ---- /reload ------------------------------------------------------------ */

static enum MHD_Result post_reload(struct app *app, struct MHD_Connection *c)
{
    char *msg = NULL;
    int rc = app_reload(app, &msg);

    if (!msg)
        return reply(c, 500, "text/plain", "out of memory\n", false);
    return reply(c, rc == 0 ? 200 : 400, "text/plain", msg, true);
}

static enum MHD_Result route_admin(struct app *app, struct MHD_Connection *c,
                                   const char *url, const char *method)
{
    bool get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;

    if (strcmp(url, "/healthz") == 0 && get)
        return reply(c, 200, "text/plain", "ok\n", false);
    if (strcmp(url, "/readyz") == 0 && get) {
        if (atomic_load(&app->ready) && !atomic_load(&app->draining) &&
            store_healthy(app->store))
            return reply(c, 200, "text/plain", "ready\n", false);
        return reply(c, 503, "text/plain",
                     atomic_load(&app->draining) ? "draining\n"
                     : !store_healthy(app->store) ? "idempotency store failing: see the log\n"
                     : "not ready\n", false);
    }
    if (strcmp(url, "/config") == 0 && get)
        return get_config(app, c);
    if (strcmp(url, "/metrics") == 0 && get)
        return get_metrics(app, c);
    if (strcmp(url, "/reload") == 0 && !strcmp(method, "POST"))
        return post_reload(app, c);
    if (strncmp(url, "/idempotency/", 13) == 0 && (get || !strcmp(method, "DELETE")))
        return idempotency(app, c, url + 13, !get);
    if (!strcmp(url, "/healthz") || !strcmp(url, "/readyz") ||
        !strcmp(url, "/config"))
        return reply(c, 405, "text/plain", "method not allowed\n", false);
    return reply(c, 404, "text/plain", "not found\n", false);
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

struct MHD_Daemon *admin_start(struct app *app, struct sc_error *err)
{
    struct MHD_Daemon *d;
    int fd = server_listen(&app->fixed.admin, 64, err);

    if (fd < 0)
        return NULL;
    d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL, 0,
                         NULL, NULL, on_admin, app,
                         MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd,
                         MHD_OPTION_CONNECTION_LIMIT, 64u,
                         MHD_OPTION_CONNECTION_TIMEOUT, 30u,
                         MHD_OPTION_END);
    if (!d) {
        sc_error_set(err, "cannot start the admin server on %s:%u",
                     app->fixed.admin.host, app->fixed.admin.port);
        close(fd);
    }
    return d;
}

void admin_stop(struct MHD_Daemon *d)
{
    if (d)
        MHD_stop_daemon(d);
}
