/* The egress proxy of an upstream (docs/contract.md §3): its address and
 * credentials, parsed once per config, and the CONNECT tunnel an https
 * connection goes through. The tunnel is set up on a plain socket to the
 * proxy; once the proxy answers 2xx, an OpenSSL filter bufferevent wraps
 * that socket, so the TLS session (SNI, verification, client certificate) is
 * with the partner, end to end, and the connection is pooled like a direct
 * one. Whatever goes wrong before that (the proxy refuses the connection or
 * the tunnel, asks for credentials, hangs up) is a connect_error: nothing
 * reached the partner. */
#include "proxy/upstream/upstream.h"
#include "proxy/upstream/internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/dns.h>
#include <event2/event.h>
#include <http_parser.h>
#include <openssl/evp.h>

/* The most a proxy's answer to CONNECT may take before its blank line. */
#define TUNNEL_HEAD_MAX 8192

/* ---- the proxy's address and credentials ------------------------------ */

/* "Basic " + base64(user ":" password), RFC 7617. */
static char *basic_credentials(const char *user, const char *password)
{
    size_t n = strlen(user) + 1 + strlen(password);
    char *plain = malloc(n + 1), *out = malloc(6 + 4 * ((n + 2) / 3) + 1);

    if (!plain || !out) {
        free(plain);
        free(out);
        return NULL;
    }
    snprintf(plain, n + 1, "%s:%s", user, password);
    memcpy(out, "Basic ", 6);
    EVP_EncodeBlock((unsigned char *)out + 6, (const unsigned char *)plain,
                    (int)n);
    /* The password does not outlive its use. */
    OPENSSL_cleanse(plain, n);
    free(plain);
    return out;
}

struct up_proxy *up_proxy_new(const struct sc_upstream *u, struct sc_error *err)
{
    struct sc_proxy_url url;
    struct up_proxy *p;
    char buf[1024];

    err->text[0] = '\0';
    if (!u->proxy || !u->proxy[0])
        return NULL;
    if (config_proxy_url_parse(u->proxy, &url, buf, sizeof buf, err) != 0)
        return NULL;
    p = calloc(1, sizeof *p);
    if (p && (p->host = strdup(url.host)) && url.user)
        p->authorization = basic_credentials(url.user, url.password);
    OPENSSL_cleanse(buf, sizeof buf);
    if (!p || !p->host || (url.user && !p->authorization)) {
        up_proxy_free(p);
        sc_error_set(err, "out of memory");
        return NULL;
    }
    p->port = (uint16_t)url.port;
    return p;
}

void up_proxy_free(struct up_proxy *p)
{
    if (!p)
        return;
    free(p->host);
    if (p->authorization)
        OPENSSL_cleanse(p->authorization, strlen(p->authorization));
    free(p->authorization);
    free(p);
}

/* ---- the tunnel --------------------------------------------------------- */

/* "host:port" as CONNECT names it: IPv6 in brackets, the port always. */
static void tunnel_target(const struct sc_upstream *u, char *buf, size_t len)
{
    bool v6 = strchr(u->host, ':') != NULL;

    snprintf(buf, len, "%s%s%s:%u", v6 ? "[" : "", u->host, v6 ? "]" : "",
             (unsigned)u->port);
}

static int send_connect(struct up_conn *c)
{
    const struct up_proxy *px = c->pool->proxy;
    struct evbuffer *out = bufferevent_get_output(c->bev);
    char target[300];

    tunnel_target(c->pool->u, target, sizeof target);
    if (evbuffer_add_printf(out, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n", target,
                            target) < 0 ||
        (px->authorization &&
         evbuffer_add_printf(out, "Proxy-Authorization: %s\r\n",
                             px->authorization) < 0) ||
        evbuffer_add(out, "\r\n", 2) != 0)
        return -ENOMEM;
    return bufferevent_enable(c->bev, EV_READ | EV_WRITE) != 0 ? -EIO : 0;
}

__attribute__((format(printf, 2, 3)))
static void tunnel_fail(struct up_conn *c, const char *fmt, ...)
{
    char why[192];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    up_conn_fail(c, UP_CONNECT_ERROR, why);
}

/* The tunnel is up: TLS with the partner over it, then the request. */
static void tunnel_wrap(struct up_conn *c)
{
    SSL *ssl = up_tls_new(c);
    struct bufferevent *tls;

    if (!ssl) {
        tunnel_fail(c, "%s", "cannot start TLS through the egress proxy");
        return;
    }
    tls = bufferevent_openssl_filter_new(c->pool->base, c->bev, ssl,
                                         BUFFEREVENT_SSL_CONNECTING,
                                         BEV_OPT_CLOSE_ON_FREE);
    if (!tls) {
        SSL_free(ssl);
        tunnel_fail(c, "%s", "cannot start TLS through the egress proxy");
        return;
    }
    /* The filter owns the socket's bufferevent from here. */
    c->bev = tls;
    c->tunnelling = false;
    bufferevent_openssl_set_allow_dirty_shutdown(tls, 1);
    bufferevent_setcb(tls, up_conn_on_read, up_conn_on_write, up_conn_on_event, c);
    if (bufferevent_enable(tls, EV_READ | EV_WRITE) != 0 ||
        (c->req && up_conn_write_request(c) != 0))
        tunnel_fail(c, "%s", "cannot write to the egress proxy's tunnel");
}

/* The proxy's answer to CONNECT is read by http-parser like any response
 * (parse.c reads the partner's): only its status matters, and it
 * has no body (RFC 9110 §9.3.6), which the parser cannot know without the
 * request's method, so it is told so. */
static int connect_head_done(http_parser *p)
{
    *(int *)p->data = p->status_code;
    return 1; /* no body */
}

static const http_parser_settings connect_answer_settings = {
    .on_headers_complete = connect_head_done,
};

/* The status of the whole head at the front of in (head_len bytes, its
 * blank line included); 0 when it is not a well-formed response head. */
static int connect_answer_status(struct evbuffer *in, size_t head_len)
{
    const char *head = (const char *)evbuffer_pullup(in, (ev_ssize_t)head_len);
    http_parser parser;
    int status = 0;
    size_t n;

    if (!head)
        return 0;
    http_parser_init(&parser, HTTP_RESPONSE);
    parser.data = &status;
    n = http_parser_execute(&parser, &connect_answer_settings, head, head_len);
    if (HTTP_PARSER_ERRNO(&parser) != HPE_OK || n != head_len)
        return 0;
    return status;
}

static void tunnel_on_read(struct bufferevent *bev, void *arg)
{
    struct up_conn *c = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    struct evbuffer_ptr end = evbuffer_search(in, "\r\n\r\n", 4, NULL);
    char line[64] = "";
    int status;

    if (end.pos < 0) {
        if (evbuffer_get_length(in) > TUNNEL_HEAD_MAX)
            tunnel_fail(c, "%s", "the egress proxy's answer to CONNECT is "
                        "too long");
        return;
    }
    evbuffer_copyout(in, line, sizeof line - 1);
    line[strcspn(line, "\r\n")] = '\0'; /* for messages */
    status = connect_answer_status(in, (size_t)end.pos + 4);
    evbuffer_drain(in, (size_t)end.pos + 4);
    /* The partner speaks first only after our ClientHello: anything here
     * would be read as TLS. A body (a 2xx to CONNECT has none) is no tunnel. */
    if (status >= 200 && status < 300 && evbuffer_get_length(in) == 0)
        tunnel_wrap(c);
    else if (status == 407)
        tunnel_fail(c, "%s", "egress proxy answered 407 (Proxy Authentication "
                    "Required) to CONNECT");
    else
        tunnel_fail(c, "egress proxy refused the tunnel: %.60s", line);
}

static void tunnel_on_event(struct bufferevent *bev, short what, void *arg)
{
    struct up_conn *c = arg;
    int e = EVUTIL_SOCKET_ERROR();
    int dns = bufferevent_socket_get_dns_error(bev);

    if (what & BEV_EVENT_CONNECTED)
        up_conn_tcp_up(c);
    if (c->in_setup) {
        c->setup_failed = !(what & BEV_EVENT_CONNECTED);
        if (!c->setup_failed && send_connect(c) != 0)
            c->setup_failed = true;
        return;
    }
    if (what & BEV_EVENT_CONNECTED) {
        if (send_connect(c) != 0)
            tunnel_fail(c, "%s", "cannot write to the egress proxy");
        return;
    }
    if (dns)
        tunnel_fail(c, "cannot resolve the egress proxy: %s",
                    evutil_gai_strerror(dns));
    else if (what & BEV_EVENT_EOF)
        tunnel_fail(c, "%s", "the egress proxy closed the connection before "
                    "the tunnel was up");
    else
        tunnel_fail(c, "egress proxy: %s", e ? evutil_socket_error_to_string(e)
                                             : "connection failed");
}

int up_tunnel_open(struct up_conn *c)
{
    const struct up_proxy *px = c->pool->proxy;

    c->tunnelling = true;
    c->bev = bufferevent_socket_new(c->pool->base, -1, BEV_OPT_CLOSE_ON_FREE);
    if (!c->bev)
        return -1;
    bufferevent_setcb(c->bev, tunnel_on_read, NULL, tunnel_on_event, c);
    if (bufferevent_socket_connect_hostname(c->bev, c->pool->dns, AF_UNSPEC,
                                            px->host, px->port) != 0 ||
        c->setup_failed)
        return -1;
    return 0;
}
