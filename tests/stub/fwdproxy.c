/* sluice-fwdproxy: a small forward (egress) proxy for the tests, on libevent. It speaks just
 * enough of a proxy's part for sluice's `proxy` to be tested against something real:
 *
 *   CONNECT host:port          a tunnel: 200, then bytes both ways until either side closes
 *   METHOD http://host:port/.. absolute form: a connection to host:port, the head passed on
 *                              without Proxy-Authorization, then bytes both ways
 *   GET /_stub/stats           {"connections":N,"tunnels":N,"forwarded":N,"refused":N}
 *
 * With --auth USER:PASSWORD, the first request of a connection must carry
 * `Proxy-Authorization: Basic base64(USER:PASSWORD)`, else 407 and the connection closes
 * (`refused`). Only a connection's first request is read: after it the proxy passes bytes
 * and looks at nothing (so keep-alive requests ride the same tunnel or upstream connection,
 * which is what `tunnels` and `forwarded` count). A target that cannot be reached gets 502.
 *
 * Startup prints "listening HOST:PORT" once, like sluice-stub; SIGTERM/SIGINT stop it. */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <arpa/inet.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <openssl/evp.h>

#define HEAD_MAX 16384

struct proxy {
    struct event_base *base;
    char *want_auth;        /* "Basic ..." or NULL */
    unsigned long connections, tunnels, forwarded, refused;
    struct side *sides;     /* every open connection, freed at exit */
};

/* A client connection and, once its first request is read, its peer. */
struct side {
    struct proxy *px;
    struct side *prev, *next;
    struct bufferevent *client, *peer;
    struct evbuffer *head;  /* the first request's head, to pass on (absolute form) */
    int first_done;
};

static void side_free(struct side *s)
{
    if (s->prev)
        s->prev->next = s->next;
    else
        s->px->sides = s->next;
    if (s->next)
        s->next->prev = s->prev;
    if (s->client)
        bufferevent_free(s->client);
    if (s->peer)
        bufferevent_free(s->peer);
    if (s->head)
        evbuffer_free(s->head);
    free(s);
}

/* Answers and closes once the answer is out. */
static void on_flushed(struct bufferevent *bev, void *arg)
{
    if (evbuffer_get_length(bufferevent_get_output(bev)) == 0)
        side_free(arg);
}

static void answer_close(struct side *s, const char *status, const char *extra, const char *body)
{
    evbuffer_add_printf(bufferevent_get_output(s->client),
                        "HTTP/1.1 %s\r\n%sContent-Length: %zu\r\nConnection: close\r\n\r\n%s",
                        status, extra, strlen(body), body);
    bufferevent_setcb(s->client, NULL, on_flushed, NULL, s);
    bufferevent_disable(s->client, EV_READ);
}

/* ---- passing bytes ------------------------------------------------------------------------ */

static void pass_read(struct bufferevent *bev, void *arg)
{
    struct side *s = arg;
    struct bufferevent *other = bev == s->client ? s->peer : s->client;

    evbuffer_add_buffer(bufferevent_get_output(other), bufferevent_get_input(bev));
}

static void pass_event(struct bufferevent *bev, short what, void *arg)
{
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR))
        side_free(arg);
}

static void peer_event(struct bufferevent *bev, short what, void *arg)
{
    struct side *s = arg;

    if (!(what & BEV_EVENT_CONNECTED)) {
        bufferevent_free(s->peer);
        s->peer = NULL;
        answer_close(s, "502 Bad Gateway", "", "cannot reach the target\n");
        return;
    }
    if (s->head) { /* absolute form: the head goes first */
        s->px->forwarded++;
        evbuffer_add_buffer(bufferevent_get_output(s->peer), s->head);
    } else {
        s->px->tunnels++;
        evbuffer_add_printf(bufferevent_get_output(s->client),
                            "HTTP/1.1 200 Connection established\r\n\r\n");
    }
    /* What the client sent after its head waits in its input. */
    evbuffer_add_buffer(bufferevent_get_output(s->peer), bufferevent_get_input(s->client));
    bufferevent_setcb(s->client, pass_read, NULL, pass_event, s);
    bufferevent_setcb(s->peer, pass_read, NULL, pass_event, s);
    bufferevent_enable(s->client, EV_READ | EV_WRITE);
    bufferevent_enable(s->peer, EV_READ | EV_WRITE);
}

static void connect_peer(struct side *s, const char *host, int port)
{
    s->peer = bufferevent_socket_new(s->px->base, -1, BEV_OPT_CLOSE_ON_FREE);
    bufferevent_setcb(s->peer, NULL, NULL, peer_event, s);
    bufferevent_disable(s->client, EV_READ); /* until the peer is there */
    if (!s->peer || bufferevent_socket_connect_hostname(s->peer, NULL, AF_UNSPEC, host, port) != 0) {
        if (s->peer)
            bufferevent_free(s->peer);
        s->peer = NULL;
        answer_close(s, "502 Bad Gateway", "", "cannot reach the target\n");
    }
}

/* ---- the first request -------------------------------------------------------------------- */

/* "host:port" or "[v6]:port" into host and port; 0 or -1. */
static int split_target(const char *t, size_t n, char *host, size_t hlen, int *port)
{
    const char *colon = memrchr(t, ':', n);
    size_t l;

    if (!colon || colon == t)
        return -1;
    l = (size_t)(colon - t);
    if (t[0] == '[' && l >= 2 && t[l - 1] == ']') {
        t++;
        l -= 2;
    }
    if (l >= hlen)
        return -1;
    memcpy(host, t, l);
    host[l] = '\0';
    *port = atoi(colon + 1);
    return *port > 0 && *port < 65536 ? 0 : -1;
}

/* The value of a header in a head (NUL-terminated text), into buf; 0 when present. */
static int header_value(const char *head, const char *name, char *buf, size_t len)
{
    size_t nl = strlen(name);

    for (const char *l = strstr(head, "\r\n"); l && l[2] != '\r'; l = strstr(l + 2, "\r\n")) {
        const char *v = l + 2, *end;

        if (strncasecmp(v, name, nl) != 0 || v[nl] != ':')
            continue;
        v += nl + 1;
        v += strspn(v, " \t");
        end = strstr(v, "\r\n");
        snprintf(buf, len, "%.*s", (int)(end - v), v);
        return 0;
    }
    return -1;
}

static void send_stats(struct side *s)
{
    char body[256];

    snprintf(body, sizeof body, "{\"connections\":%lu,\"tunnels\":%lu,\"forwarded\":%lu,"
             "\"refused\":%lu}", s->px->connections, s->px->tunnels, s->px->forwarded,
             s->px->refused);
    answer_close(s, "200 OK", "Content-Type: application/json\r\n", body);
}

/* Passes an absolute-form head on without the proxy's credentials. */
static void keep_head(struct side *s, const char *head)
{
    s->head = evbuffer_new();
    for (const char *l = head; *l;) {
        const char *end = strstr(l, "\r\n");
        size_t n = end ? (size_t)(end - l) + 2 : strlen(l);

        if (strncasecmp(l, "Proxy-Authorization:", 20) != 0)
            evbuffer_add(s->head, l, n);
        l += n;
    }
}

static void first_request(struct side *s, const char *head)
{
    char method[16], target[2048], host[512], auth[512];
    int port;

    if (sscanf(head, "%15s %2047s", method, target) != 2) {
        answer_close(s, "400 Bad Request", "", "malformed request\n");
        return;
    }
    if (!strcmp(target, "/_stub/stats")) {
        send_stats(s);
        return;
    }
    if (s->px->want_auth && (header_value(head, "Proxy-Authorization", auth, sizeof auth) != 0 ||
                             strcmp(auth, s->px->want_auth) != 0)) {
        s->px->refused++;
        answer_close(s, "407 Proxy Authentication Required",
                     "Proxy-Authenticate: Basic realm=\"test\"\r\n", "");
        return;
    }
    if (!strcmp(method, "CONNECT") &&
        split_target(target, strlen(target), host, sizeof host, &port) == 0) {
        connect_peer(s, host, port);
        return;
    }
    if (!strncasecmp(target, "http://", 7)) {
        const char *auth_part = target + 7;
        size_t n = strcspn(auth_part, "/?#");

        if (split_target(auth_part, n, host, sizeof host, &port) == 0) {
            keep_head(s, head);
            connect_peer(s, host, port);
            return;
        }
    }
    answer_close(s, "400 Bad Request", "", "not a proxy request\n");
}

static void client_read(struct bufferevent *bev, void *arg)
{
    struct side *s = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    struct evbuffer_ptr end = evbuffer_search(in, "\r\n\r\n", 4, NULL);
    char *head;

    if (end.pos < 0) {
        if (evbuffer_get_length(in) > HEAD_MAX)
            answer_close(s, "431 Request Header Fields Too Large", "", "");
        return;
    }
    head = malloc((size_t)end.pos + 5);
    if (!head) {
        side_free(s);
        return;
    }
    evbuffer_remove(in, head, (size_t)end.pos + 4);
    head[end.pos + 4] = '\0';
    first_request(s, head);
    free(head);
}

static void on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa,
                      int salen, void *arg)
{
    struct proxy *px = arg;
    struct side *s = calloc(1, sizeof *s);

    if (!s) {
        evutil_closesocket(fd);
        return;
    }
    px->connections++;
    s->px = px;
    s->next = px->sides;
    if (s->next)
        s->next->prev = s;
    px->sides = s;
    s->client = bufferevent_socket_new(px->base, fd, BEV_OPT_CLOSE_ON_FREE);
    if (!s->client) {
        evutil_closesocket(fd);
        side_free(s);
        return;
    }
    bufferevent_setcb(s->client, client_read, NULL, pass_event, s);
    bufferevent_enable(s->client, EV_READ | EV_WRITE);
}

/* ---- setup -------------------------------------------------------------------------------- */

static char *basic(const char *userpass)
{
    size_t n = strlen(userpass);
    char *out = malloc(6 + 4 * ((n + 2) / 3) + 1);

    if (!out)
        return NULL;
    memcpy(out, "Basic ", 6);
    EVP_EncodeBlock((unsigned char *)out + 6, (const unsigned char *)userpass, (int)n);
    return out;
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    event_base_loopbreak(arg);
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"listen", required_argument, NULL, 'l'},
        {"auth", required_argument, NULL, 'a'},
        {NULL, 0, NULL, 0},
    };
    struct proxy px = {0};
    struct sockaddr_in sin = {.sin_family = AF_INET};
    const char *listen_on = "127.0.0.1:0";
    struct evconnlistener *l;
    struct event *sigterm, *sigint;
    socklen_t len = sizeof sin;
    char host[64];
    int ch, port;

    while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (ch == 'l')
            listen_on = optarg;
        else if (ch == 'a')
            px.want_auth = basic(optarg);
        else {
            fputs("usage: sluice-fwdproxy [--listen IPV4:PORT] [--auth USER:PASSWORD]\n", stderr);
            return 2;
        }
    }
    /* IPv4 only: the tests run on 127.0.0.1. */
    if (sscanf(listen_on, "%63[0-9.]:%d", host, &port) != 2 || port < 0 || port > 65535) {
        fprintf(stderr, "sluice-fwdproxy: --listen wants IPV4:PORT\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    if (inet_pton(AF_INET, host, &sin.sin_addr) != 1) {
        fprintf(stderr, "sluice-fwdproxy: --listen wants a numeric IPv4 address\n");
        return 2;
    }
    sin.sin_port = htons((uint16_t)port);
    px.base = event_base_new();
    l = evconnlistener_new_bind(px.base, on_accept, &px, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE,
                                64, (struct sockaddr *)&sin, sizeof sin);
    if (!l) {
        fprintf(stderr, "sluice-fwdproxy: cannot listen on %s: %s\n", listen_on, strerror(errno));
        return 1;
    }
    sigterm = evsignal_new(px.base, SIGTERM, on_signal, px.base);
    sigint = evsignal_new(px.base, SIGINT, on_signal, px.base);
    evsignal_add(sigterm, NULL);
    evsignal_add(sigint, NULL);
    getsockname(evconnlistener_get_fd(l), (struct sockaddr *)&sin, &len);
    printf("listening %s:%u\n", host, ntohs(sin.sin_port));
    fflush(stdout);
    event_base_dispatch(px.base);
    while (px.sides)
        side_free(px.sides);
    evconnlistener_free(l);
    event_free(sigterm);
    event_free(sigint);
    event_base_free(px.base);
    free(px.want_auth);
    return 0;
}
