#include "proxy/admin.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <microhttpd.h>

#include "proxy/app.h"
#include "proxy/server.h"

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
    char *json = config_to_json(app->cfg);

    if (!json)
        return reply(c, 500, "text/plain", "out of memory\n", false);
    return reply(c, 200, "application/json", json, true);
}

static enum MHD_Result route_admin(struct app *app, struct MHD_Connection *c,
                                   const char *url, const char *method)
{
    bool get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;

    if (strcmp(url, "/healthz") == 0 && get)
        return reply(c, 200, "text/plain", "ok\n", false);
    if (strcmp(url, "/readyz") == 0 && get) {
        if (atomic_load(&app->ready) && !atomic_load(&app->draining))
            return reply(c, 200, "text/plain", "ready\n", false);
        return reply(c, 503, "text/plain",
                     atomic_load(&app->draining) ? "draining\n" : "not ready\n",
                     false);
    }
    if (strcmp(url, "/config") == 0 && get)
        return get_config(app, c);
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
    int fd = server_listen(&app->cfg->admin, 64, err);

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
                     app->cfg->admin.host, app->cfg->admin.port);
        close(fd);
    }
    return d;
}

void admin_stop(struct MHD_Daemon *d)
{
    if (d)
        MHD_stop_daemon(d);
}
