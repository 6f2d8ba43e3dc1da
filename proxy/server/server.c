#include "proxy/server/server.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <event2/dns.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <microhttpd.h>

#include "proxy/app.h"
#include "proxy/server/mhd_request.h"
#include "proxy/server/verification.h"
#include "obs/log.h"
#include "policies/problem.h"
#include "proxy/runtime.h"
#include "proxy/upstream/upstream.h"
#include "store/store.h"
#include "util/clock.h"
#include "util/rand.h"

/* Idle keep-alive connections from workers are closed after this, like
 * nginx's keepalive_timeout default. Suspended requests are not affected. */
#define WORKER_IDLE_TIMEOUT_S 75

/* Out of file descriptors, a listener stays readable and accept() fails at
 * once: retried at every loop pass, it spins (a core per loop and a log
 * line per failure). Accepting pauses this long instead, as nginx's
 * ngx_disable_accept_events does; the backlog holds the connections. */
#define ACCEPT_PAUSE_MS 100
/* Worker connections never take the last descriptors below RLIMIT_NOFILE:
 * the admin port (probes), upstream connections and the store need some. */
#define FD_HEADROOM 16
/* Descriptors sluice holds besides worker and upstream connections (the
 * store's files, the loops' epoll and event fds, the listeners, the log):
 * about 30 with two loops; counted when the limit is checked at start. */
#define FD_OWN 64
/* A limit raised to the hard one stops here: the kernel's default ceiling
 * (fs.nr_open), and more than any config here uses. */
#define FD_RAISE_MAX ((rlim_t)1 << 20)
/* A refusal repeated (EMFILE, no headroom) is logged once a second. */
#define REPEAT_LOG_NS 1000000000ull

/* ---- listening socket --------------------------------------------------- */

int server_listen(const struct sc_addr *addr, int backlog, struct sc_error *err)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    char port[8];
    int fd = -1, one = 1, rc;

    snprintf(port, sizeof port, "%u", addr->port);
    rc = getaddrinfo(addr->host, port, &hints, &res);
    if (rc != 0) {
        sc_error_set(err, "cannot resolve %s: %s", addr->host, gai_strerror(rc));
        return -EINVAL;
    }
    fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        goto fail;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, backlog) != 0)
        goto fail;
    freeaddrinfo(res);
    return fd;
fail:
    rc = -errno;
    sc_error_set(err, "cannot listen on %s:%u: %s", addr->host, addr->port,
                 strerror(errno));
    if (fd >= 0)
        close(fd);
    freeaddrinfo(res);
    return rc;
}

/* ---- joining MHD and libevent ------------------------------------------- */

static void mhd_run(struct loop *w)
{
    MHD_UNSIGNED_LONG_LONG ms;

    w->mhd_runs++;
    MHD_run(w->mhd);
    /* MHD's timeout covers idle connections and pending work; re-arm after
     * every run (0 ms, "run again at once", is common under load). */
    if (MHD_get_timeout(w->mhd, &ms) == MHD_YES) {
        struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
        evtimer_add(w->mhd_timer_ev, &tv);
    } else {
        evtimer_del(w->mhd_timer_ev);
    }
}

static void on_mhd_ready(evutil_socket_t fd, short what, void *arg)
{
    mhd_run(arg);
}

void loop_kick(struct loop *w)
{
    /* One MHD_run per loop pass serves every resume made during it. */
    event_active(w->mhd_read_ev, EV_READ, 0);
}

static void refuse_library_answer(struct loop *w, unsigned status, const char *message);

static void mhd_logger(void *cls, const char *fmt, va_list ap)
{
    struct loop *w = cls;
    char msg[512];
    va_list args;

    /* MHD says so each time it is about to send an error answer of its own
     * (an HTML page without Sluice-Outcome), on the loop's thread, before
     * it writes a byte of it: the notice that lets sluice answer instead. */
    static const char error_notice[] = "Error processing request (HTTP response code is %u ('%s'))";

    if (strncmp(fmt, error_notice, sizeof error_notice - 1) == 0) {
        unsigned status;
        const char *message;

        w->mhd_error_run = w->mhd_runs;
        va_copy(args, ap);
        status = va_arg(args, unsigned);
        message = va_arg(args, const char *);
        va_end(args);
        refuse_library_answer(w, status, message ? message : "");
    }
    vsnprintf(msg, sizeof msg, fmt, ap);
    msg[strcspn(msg, "\n")] = '\0';
    log_debug("http server: %s", msg);
}

/* ---- the request head clock (limits.header_timeout) ---------------------- */

/* One per worker connection, MHD's socket context. MHD's own connection
 * timeout restarts with every byte, so a head sent a byte at a time would
 * hold a connection for ever; this clock does not restart. */
struct conn {
    struct loop *w;
    struct MHD_Connection *mc;
    TAILQ_ENTRY(conn) link;     /* the loop's connections */
    struct event *head_timer;   /* pending while a request head is incomplete */
    struct timeval head_timeout;
    unsigned begun, ended;      /* request lines MHD read; requests it ended */
    uint64_t ended_run;         /* the MHD run in which the last one ended */
    uint64_t quiet_since_ns;    /* accepted, or its last request ended */
    bool head_open;             /* request line read, head not complete */
    bool body_open;             /* head complete, MHD reading the body (chunks) */
    bool timed_out;             /* answered on the socket (a 408, or an answer in
                                 * place of MHD's own): the connection is closing */
};

static struct conn *conn_of(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *i =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);

    return i ? i->socket_context : NULL;
}

/* A problem+json answer written straight to the socket, for the moments
 * MHD offers no way to queue one (no request, or a head still arriving).
 * Nothing else is being written then, and an answer this small fits an
 * empty socket buffer, so one non-blocking send does. */
static void send_raw_problem(int fd, int status, enum reason r, const char *detail)
{
    size_t blen = 0;
    char *body = problem_json(status, r, detail, &blen), head[384];
    int hlen;

    if (!body)
        return;
    /* Every answer carries a request id; the worker's, if any, is in a
     * head nobody read, so this one is made here. */
    hlen = snprintf(head, sizeof head,
                    "HTTP/1.1 %d %s\r\nContent-Type: application/problem+json\r\n"
                    "Sluice-Outcome: rejected\r\nX-Request-Id: %016llx%016llx\r\n"
                    "Connection: close\r\nContent-Length: %zu\r\n\r\n",
                    status, http_status_text(status), (unsigned long long)rand_u64(),
                    (unsigned long long)rand_u64(), blen);
    if (hlen > 0 && (size_t)hlen < sizeof head) {
        struct iovec v[2] = {{head, (size_t)hlen}, {body, blen}};
        struct msghdr m = {.msg_iov = v, .msg_iovlen = 2};
        if (sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT) < 0)
            log_debug("http server: cannot send a %d: %s", status, strerror(errno));
    }
    free(body);
}

static void count_rejected(struct loop *w, enum reason r)
{
    struct runtime *rt = loop_runtime(w);
    const struct metrics_ids *ids = &rt->ids;

    metrics_add(&w->app->metrics.shards[w->idx],
                ids->requests[(ids->n_routes * OUT__COUNT + OUT_REJECTED) * R__COUNT + r], 1);
    runtime_put(rt);
}

static void on_head_timeout(evutil_socket_t fd, short what, void *arg)
{
    struct conn *cn = arg;
    const union MHD_ConnectionInfo *i =
        MHD_get_connection_info(cn->mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    char detail[96];
    long ms = cn->head_timeout.tv_sec * 1000L + cn->head_timeout.tv_usec / 1000;

    cn->timed_out = true;
    if (!i)
        return;
    snprintf(detail, sizeof detail,
             "the request head was not complete within limits.header_timeout (%ld ms)", ms);
    /* MHD may be sending its own error answer to a slow reader: no second
     * answer into the middle of it, only the close. */
    if (!MHD_get_connection_info(cn->mc, MHD_CONNECTION_INFO_HTTP_STATUS))
        send_raw_problem(i->connect_fd, 408, R_TIMEOUT, detail);
    /* MHD has no call to drop a connection: with the socket shut down, its
     * next read sees the end and it closes and forgets the connection. */
    shutdown(i->connect_fd, SHUT_RDWR);
    log_info("request head not complete after %ld ms: 408, connection closed", ms);
    count_rejected(cn->w, R_TIMEOUT);
    loop_kick(cn->w);
}

static struct conn *conn_new(struct loop *w, struct MHD_Connection *c)
{
    struct conn *cn = calloc(1, sizeof *cn);
    struct runtime *rt;
    uint64_t ms;

    if (!cn)
        return NULL;
    cn->w = w;
    cn->mc = c;
    cn->quiet_since_ns = clock_mono_ns();
    cn->head_timer = evtimer_new(w->base, on_head_timeout, cn);
    if (!cn->head_timer) {
        free(cn);
        return NULL;
    }
    /* Read per connection, so a reload applies to the connections after it. */
    rt = loop_runtime(w);
    ms = rt->cfg->limits.header_timeout_ms;
    runtime_put(rt);
    cn->head_timeout.tv_sec = (time_t)(ms / 1000);
    cn->head_timeout.tv_usec = (suseconds_t)(ms % 1000) * 1000;
    /* The first head's clock runs from the accept, as nginx's
     * client_header_timeout: a silent new connection is a slow head too. */
    evtimer_add(cn->head_timer, &cn->head_timeout);
    TAILQ_INSERT_TAIL(&w->conns, cn, link);
    return cn;
}

static void conn_free(struct conn *cn)
{
    if (!cn)
        return;
    TAILQ_REMOVE(&cn->w->conns, cn, link);
    event_free(cn->head_timer);
    free(cn);
}

void srv_conn_head_begun(struct MHD_Connection *c)
{
    struct conn *cn = conn_of(c);

    /* On a reused connection MHD reports nothing before the request line is
     * complete: the clock starts there. A timer add is a heap insert, no
     * system call. */
    if (!cn)
        return;
    cn->begun++;
    cn->head_open = true;
    if (!evtimer_pending(cn->head_timer, NULL))
        evtimer_add(cn->head_timer, &cn->head_timeout);
}

void srv_conn_request_ended(struct MHD_Connection *c)
{
    struct conn *cn = conn_of(c);

    if (!cn)
        return;
    cn->ended++;
    cn->ended_run = cn->w->mhd_runs;
    cn->quiet_since_ns = clock_mono_ns();
    cn->body_open = false;
}

void srv_conn_body_done(struct MHD_Connection *c)
{
    struct conn *cn = conn_of(c);

    if (cn)
        cn->body_open = false;
}

/* True when MHD is closing the connection because it could not read a
 * request line: libmicrohttpd 0.9.75 closes on a line without a space
 * ("GARBAGE", "GET") without a word and tells nobody. What sets that close
 * apart, at its CLOSED notice: no request is open (every line MHD read has
 * ended), the close is not the end of an answer (that ends in the same MHD
 * run), not a 408 of ours, not MHD's own error answer, not a drain, not the
 * idle timeout, and the worker is still there and has sent nothing MHD left
 * unread (a line too long for the pool leaves bytes unread: MHD answers
 * that one itself). */
static bool line_refused(const struct conn *cn, int fd)
{
    const struct loop *w = cn->w;
    char b;

    if (cn->begun != cn->ended || cn->timed_out || atomic_load(&w->app->draining))
        return false;
    if (cn->ended && cn->ended_run == w->mhd_runs)
        return false;
    if (w->mhd_error_run == w->mhd_runs)
        return false;
    if (clock_mono_ns() - cn->quiet_since_ns >= (WORKER_IDLE_TIMEOUT_S - 1) * 1000000000ull)
        return false;
    return recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) < 0 &&
           (errno == EAGAIN || errno == EWOULDBLOCK);
}

static void answer_refused_line(struct conn *cn)
{
    const union MHD_ConnectionInfo *i =
        MHD_get_connection_info(cn->mc, MHD_CONNECTION_INFO_CONNECTION_FD);

    if (!i || !line_refused(cn, i->connect_fd))
        return;
    send_raw_problem(i->connect_fd, 400, R_MALFORMED_REQUEST,
                     "the request line is not \"method SP target SP version\"");
    log_info("a request line without a target or version: 400, connection closed");
    count_rejected(cn->w, R_MALFORMED_REQUEST);
}

bool srv_conn_head_done(struct MHD_Connection *c)
{
    struct conn *cn = conn_of(c);

    if (!cn)
        return true;
    cn->head_open = false;
    cn->body_open = true;
    evtimer_del(cn->head_timer);
    return !cn->timed_out;
}

/* ---- answering in place of libmicrohttpd ---------------------------------- */

/* Where in a request MHD found the error it is about to answer (its page's
 * text tells), hence which connections could have sent it. */
enum lib_phase {
    LP_LINE = 1,    /* between requests: a request line (version, length) */
    LP_HEAD = 2,    /* a head being read: a header line, Content-Length */
    LP_BODY = 4,    /* a body being read: chunk lines, trailers */
};

struct lib_error {
    const char *marker;     /* in MHD's page for it (libmicrohttpd 0.9.75) */
    unsigned mhd_status;    /* 0: any */
    unsigned phases;
    int status;
    enum reason reason;
    const char *detail;
};

/* First match wins. */
static const struct lib_error lib_errors[] = {
    {"chunked encoding", 0, LP_BODY, 400, R_MALFORMED_REQUEST,
     "a malformed chunked body (a chunk size that is not hexadecimal digits, or no CRLF after "
     "a chunk)"},
    {"chunk size", 0, LP_BODY, 413, R_BODY_TOO_LARGE, "a chunk size too large to read"},
    {"too large value for", 0, LP_HEAD, 413, R_BODY_TOO_LARGE,
     "the Content-Length is too large to read"},
    {"wrong value for", 0, LP_HEAD, 400, R_MALFORMED_REQUEST, "invalid Content-Length"},
    {"HTTP version", 0, LP_LINE, 505, R_MALFORMED_REQUEST, "the version is not HTTP/1.x"},
    {"too big", 414, LP_LINE, 431, R_HEADERS_TOO_LARGE, "the request line is too long"},
    {"too big", 0, LP_HEAD, 431, R_HEADERS_TOO_LARGE, "the request head is too large"},
    {"", 400, LP_LINE | LP_HEAD | LP_BODY, 400, R_MALFORMED_REQUEST,
     "a malformed request line or header line (the version is not \"HTTP/1.x\" in capitals, "
     "or a line has no colon)"},
};

static const struct lib_error *lib_error_of(unsigned status, const char *message)
{
    for (size_t i = 0; i < sizeof lib_errors / sizeof *lib_errors; i++) {
        const struct lib_error *e = &lib_errors[i];

        if (strstr(message, e->marker) && (!e->mhd_status || e->mhd_status == status))
            return e;
    }
    return NULL;
}

static bool in_phase(const struct conn *cn, unsigned phases)
{
    if (cn->timed_out)
        return false;
    return ((phases & LP_LINE) && !cn->head_open && !cn->body_open &&
            cn->begun == cn->ended) ||
           ((phases & LP_HEAD) && cn->head_open) || ((phases & LP_BODY) && cn->body_open);
}

/* Data arrived within this long counts as what MHD is reading now; up to
 * LATE_READ_MS (a loaded machine) if no other connection had any nearly as
 * late. */
#define JUST_READ_MS 10
#define LATE_READ_MS 200
/* Past this many candidates, the kernel is not asked about each. */
#define MAX_NARROWED 256

/* MHD parses what it has just read, so the connection it is refusing has
 * had data a moment ago and none left unread; a connection idle since its
 * last answer has not, one MHD has yet to read this pass still holds its
 * bytes, and one whose request ended in this pass had a request to read.
 * How long ago it had data (ms), or UINT32_MAX when it cannot be the one.
 * Asked of the kernel only when more than one connection could be it. */
static uint32_t input_age_ms(const struct conn *cn)
{
    const union MHD_ConnectionInfo *i =
        MHD_get_connection_info(cn->mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    struct tcp_info ti;
    socklen_t len = sizeof ti;
    int unread = 0;

    if (!i || (cn->ended && cn->ended_run == cn->w->mhd_runs))
        return UINT32_MAX;
    if (ioctl(i->connect_fd, FIONREAD, &unread) != 0 || unread > 0)
        return UINT32_MAX;
    if (getsockopt(i->connect_fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0)
        return UINT32_MAX;
    return ti.tcpi_last_data_recv;
}

/* The connection MHD is refusing, or NULL when no single one can be told:
 * MHD's notice names none. Among the loop's connections, those in the
 * phase the error belongs to; of several, the one that just had input:
 * the only one within JUST_READ_MS, or else one within LATE_READ_MS whose
 * input is the latest by more than JUST_READ_MS (a loaded machine can take longer than
 * that between the read and the parse; one CI run fell back to MHD's page
 * so while the other connections had been idle for 50 ms). */
static struct conn *refused_conn(struct loop *w, unsigned phases)
{
    struct conn *cn, *found = NULL;
    uint32_t best = UINT32_MAX, second = UINT32_MAX;
    size_t n = 0, recent = 0;

    TAILQ_FOREACH(cn, &w->conns, link)
        if (in_phase(cn, phases) && n++ == 0)
            found = cn;
    if (n <= 1)
        return found;
    if (n > MAX_NARROWED)
        return NULL;
    found = NULL;
    TAILQ_FOREACH(cn, &w->conns, link) {
        uint32_t age = in_phase(cn, phases) ? input_age_ms(cn) : UINT32_MAX;

        if (age == UINT32_MAX)
            continue;
        recent += age <= JUST_READ_MS;
        if (age < best) {
            second = best;
            best = age;
            found = cn;
        } else if (age < second) {
            second = age;
        }
    }
    if (!found)
        return NULL;
    if (best <= JUST_READ_MS && recent == 1)
        return found;
    return best <= LATE_READ_MS && second != UINT32_MAX && second - best > JUST_READ_MS
               ? found
               : NULL;
}

/* MHD is about to answer an error itself, in HTML and without
 * Sluice-Outcome. sluice's problem answer goes out first, then the socket
 * is shut down, so that MHD's own write fails and it closes the
 * connection. Without a single connection to blame, MHD's answer stands
 * (logged: the worker gets a 4xx, without the contract's headers). */
static void refuse_library_answer(struct loop *w, unsigned status, const char *message)
{
    const struct lib_error *e = lib_error_of(status, message);
    const union MHD_ConnectionInfo *i;
    struct conn *cn;

    if (!e)
        return; /* not a request's fault (500s of internal-thread modes) */
    cn = refused_conn(w, e->phases);
    /* An answer already queued (MHD then only closes): nothing may cut in. */
    if (cn && MHD_get_connection_info(cn->mc, MHD_CONNECTION_INFO_HTTP_STATUS))
        return;
    i = cn ? MHD_get_connection_info(cn->mc, MHD_CONNECTION_INFO_CONNECTION_FD) : NULL;
    if (!i) {
        log_info("the http server answered %u itself (%s): more than one connection could "
                 "have sent the request", status, e->detail);
        return;
    }
    send_raw_problem(i->connect_fd, e->status, e->reason, e->detail);
    shutdown(i->connect_fd, SHUT_RDWR);
    cn->timed_out = true; /* closing, answered: no other answer may follow */
    log_info("%s: %d, connection closed", e->detail, e->status);
    count_rejected(w, e->reason);
}

/* Counts worker connections for max_connections (the accept path adds,
 * the close takes away) and gives each its head clock. */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_ctx,
                          enum MHD_ConnectionNotificationCode code)
{
    struct loop *w = cls;

    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        *socket_ctx = conn_new(w, c);
        /* Without it the connection still works, only without the clock. */
        if (!*socket_ctx)
            log_warn("out of memory: a worker connection runs without header_timeout");
        return;
    }
    if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        if (*socket_ctx)
            answer_refused_line(*socket_ctx);
        conn_free(*socket_ctx);
        *socket_ctx = NULL;
        atomic_fetch_sub(&w->app->conns, 1);
    }
}

static struct MHD_Daemon *mhd_start(struct loop *w)
{
    const struct app_fixed *cfg = &w->app->fixed;
    /* The pool holds the request head, the body read buffer and the
     * response head: sized above max_header so that our own check answers
     * 431, not MHD's, and with room for the largest upstream head we pass
     * on, so an answer is never lost for want of memory (an empty close
     * after the upstream did the work). */
    size_t pool = (size_t)cfg->max_header + UP_MAX_HEAD_BYTES + 8192;

    return MHD_start_daemon(
        /* TURBO: besides reading and writing before asking epoll, MHD then
         * closes a connection without shutting it down first, so that
         * answer_refused_line can still write to it at the CLOSED notice. */
        MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_NO_LISTEN_SOCKET |
            MHD_USE_ERROR_LOG | MHD_USE_TURBO, 0, NULL, NULL, exchange_access, w,
        MHD_OPTION_URI_LOG_CALLBACK, exchange_uri_log, w,
        MHD_OPTION_NOTIFY_COMPLETED, exchange_completed, w,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, w,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, pool,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)cfg->max_connections,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)WORKER_IDLE_TIMEOUT_S,
        /* Not 1: at 1 MHD closes on a space in the target without a word
         * and answers a missing Host itself in HTML; sluice checks both,
         * stricter, and answers with a problem (exchange.c, check_head). */
        MHD_OPTION_STRICT_FOR_CLIENT, 0,
        MHD_OPTION_EXTERNAL_LOGGER, mhd_logger, w,
        MHD_OPTION_END);
}

/* ---- the loop's runtime --------------------------------------------------- */

static void take_next_runtime(struct loop *w)
{
    struct runtime *next, *old;

    if (!atomic_load_explicit(&w->next_rt, memory_order_acquire))
        return;
    next = atomic_exchange(&w->next_rt, NULL);
    if (!next)
        return;
    old = w->rt;
    w->rt = next;
    runtime_put(old); /* requests still on it keep it alive */
}

struct runtime *loop_runtime(struct loop *w)
{
    take_next_runtime(w);
    atomic_fetch_add(&w->rt->refs, 1);
    return w->rt;
}

void loop_set_runtime(struct loop *w, struct runtime *rt)
{
    struct runtime *stale;

    if (rt)
        atomic_fetch_add(&rt->refs, 1);
    stale = atomic_exchange(&w->next_rt, rt);
    runtime_put(stale); /* two reloads before the loop took the first */
    if (w->runtime_ev)
        event_active(w->runtime_ev, EV_TIMEOUT, 0);
}

void loop_drop_runtime(struct loop *w)
{
    runtime_put(atomic_exchange(&w->next_rt, NULL));
    runtime_put(w->rt);
    w->rt = NULL;
}

/* An idle loop lets go of the old runtime (and its pools) at once. */
static void on_runtime(evutil_socket_t fd, short what, void *arg)
{
    take_next_runtime(arg);
}

/* ---- commands from other threads ---------------------------------------- */

static void on_quiesce(evutil_socket_t fd, short what, void *arg)
{
    struct loop *w = arg;

    /* Stop accepting. The last loop to let go closes the socket, so new
     * connections are refused by the kernel rather than left in a backlog
     * nobody reads; closing earlier could pull the fd from under a loop. */
    evconnlistener_disable(w->listener);
    evtimer_del(w->accept_resume_ev); /* a pause must not enable it again */
    if (atomic_fetch_add(&w->app->quiesced, 1) + 1 == w->app->n_loops) {
        int lfd = atomic_exchange(&w->app->listen_fd, -1);
        if (lfd >= 0)
            close(lfd);
    }
}

/* ---- file descriptors ----------------------------------------------------- */

/* What the config can hold open at once: every worker connection, every
 * upstream pool full (each loop's share rounded up), and sluice's own. */
static uint64_t fds_needed(const struct sc_config *cfg, unsigned n_loops)
{
    uint64_t n = (uint64_t)cfg->limits.max_connections + FD_OWN + FD_HEADROOM;

    for (size_t i = 0; i < cfg->n_upstreams; i++)
        n += (uint64_t)(cfg->upstreams[i].max_connections + n_loops - 1) / n_loops * n_loops;
    return n;
}

long server_fd_limit(const struct sc_config *cfg, unsigned n_loops)
{
    struct rlimit rl;
    uint64_t need = fds_needed(cfg, n_loops);

    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return LONG_MAX; /* unknown: no headroom kept */
    /* The soft limit is often 1024 (select()'s ceiling, kept by systemd and
     * shells) under a far higher hard one; sluice uses epoll only. */
    if (rl.rlim_cur < rl.rlim_max && rl.rlim_cur < FD_RAISE_MAX) {
        rlim_t from = rl.rlim_cur;

        rl.rlim_cur = rl.rlim_max < FD_RAISE_MAX ? rl.rlim_max : FD_RAISE_MAX;
        if (setrlimit(RLIMIT_NOFILE, &rl) == 0)
            log_info("file descriptors: RLIMIT_NOFILE raised from %llu to %llu",
                     (unsigned long long)from, (unsigned long long)rl.rlim_cur);
        else
            rl.rlim_cur = from;
    }
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need)
        log_warn("file descriptors: RLIMIT_NOFILE is %llu (hard limit %llu), below the %llu "
                 "that limits.max_connections (%u), the upstream pools and sluice's own need: "
                 "worker connections beyond it are closed at once; raise the limit "
                 "(LimitNOFILE=, ulimit -n) or lower the connection limits",
                 (unsigned long long)rl.rlim_cur, (unsigned long long)rl.rlim_max,
                 (unsigned long long)need, cfg->limits.max_connections);
    return rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > LONG_MAX ? LONG_MAX
                                                                  : (long)rl.rlim_cur;
}

/* A refusal that can repeat thousands of times a second, logged once a
 * second for the whole process (every loop counts into it) with how many
 * happened since its last line. */
struct repeat_log {
    _Atomic uint64_t last_ns, count;
};

static struct repeat_log accept_log, headroom_log;

/* Counts one more; true when it is time for a line (the first, then at
 * most one a second), *count then holds how many since the last line. */
static bool repeat_due(struct repeat_log *r, uint64_t *count)
{
    uint64_t now = clock_mono_ns(), last = atomic_load(&r->last_ns);

    atomic_fetch_add(&r->count, 1);
    if (last && now - last < REPEAT_LOG_NS)
        return false;
    if (!atomic_compare_exchange_strong(&r->last_ns, &last, now))
        return false; /* another loop writes this second's line */
    *count = atomic_exchange(&r->count, 0);
    return true;
}

/* ---- accepting ---------------------------------------------------------- */

static void count_refused(struct loop *w)
{
    struct runtime *rt = loop_runtime(w);

    metrics_add(&w->app->metrics.shards[w->idx], rt->ids.conns_refused, 1);
    runtime_put(rt);
}

static void count_accept_paused(struct loop *w)
{
    struct runtime *rt = loop_runtime(w);

    metrics_add(&w->app->metrics.shards[w->idx], rt->ids.accept_paused, 1);
    runtime_put(rt);
}

/* A connection that took one of the last FD_HEADROOM descriptors: every
 * lower one is in use (the kernel hands out the lowest free), so taking it
 * would leave the admin port, the upstream pools and the store nothing. */
static bool fd_headroom_gone(const struct loop *w, evutil_socket_t fd)
{
    return (long)fd >= w->app->fd_limit - FD_HEADROOM;
}

/* Accepting stops for ACCEPT_PAUSE_MS: the listener would be readable again
 * at once, and the backlog holds what comes meanwhile. */
static void pause_accepting(struct loop *w)
{
    struct timeval tv = {0, ACCEPT_PAUSE_MS * 1000};

    evconnlistener_disable(w->listener);
    evtimer_add(w->accept_resume_ev, &tv);
    count_accept_paused(w);
}

/* The connection is closed and accepting pauses: each refusal frees the
 * descriptor it took, so the next accept() would get that same one and be
 * refused too, and a whole backlog could be closed in the microseconds
 * before another thread frees the lower descriptors it is closing. */
static void refuse_no_headroom(struct loop *w, evutil_socket_t fd)
{
    uint64_t n;

    close(fd);
    count_refused(w);
    pause_accepting(w);
    if (repeat_due(&headroom_log, &n))
        log_warn("worker connections closed at once: fewer than %d file descriptors left "
                 "below RLIMIT_NOFILE (%ld) (%llu since the last line)", FD_HEADROOM,
                 w->app->fd_limit, (unsigned long long)n);
}

/* sluice accepts by itself (MHD has no listening socket) so that a connection
 * beyond max_connections is closed at once, as the contract says, instead of
 * waiting in the backlog while MHD stops accepting. */
static void on_accept(struct evconnlistener *l, evutil_socket_t fd,
                      struct sockaddr *addr, int len, void *arg)
{
    struct loop *w = arg;
    long max = (long)w->app->fixed.max_connections;

    if (fd_headroom_gone(w, fd)) {
        refuse_no_headroom(w, fd);
        return;
    }
    if (atomic_fetch_add(&w->app->conns, 1) >= max) {
        atomic_fetch_sub(&w->app->conns, 1);
        count_refused(w);
        close(fd);
        return;
    }
    /* On failure MHD closes the socket itself; no CLOSED notice follows. */
    if (MHD_add_connection(w->mhd, fd, addr, (socklen_t)len) != MHD_YES) {
        atomic_fetch_sub(&w->app->conns, 1);
        return;
    }
    loop_kick(w);
}

static void on_accept_resume(evutil_socket_t fd, short what, void *arg)
{
    struct loop *w = arg;

    evconnlistener_enable(w->listener);
}

static void on_accept_error(struct evconnlistener *l, void *arg)
{
    struct loop *w = arg;
    int e = EVUTIL_SOCKET_ERROR();
    uint64_t n;

    if (e != EMFILE && e != ENFILE && e != ENOBUFS && e != ENOMEM) {
        log_warn("accept: %s", evutil_socket_error_to_string(e));
        return;
    }
    /* Out of descriptors (or kernel memory). */
    pause_accepting(w);
    if (repeat_due(&accept_log, &n))
        log_warn("accept: %s: accepting paused for %d ms (%llu pauses since the last line)",
                 evutil_socket_error_to_string(e), ACCEPT_PAUSE_MS, (unsigned long long)n);
}

static void on_abort(evutil_socket_t fd, short what, void *arg)
{
    exchange_abort_all(arg);
}

void loop_quiesce(struct loop *w)
{
    event_active(w->quiesce_ev, EV_TIMEOUT, 0);
}

void loop_abort_inflight(struct loop *w)
{
    event_active(w->abort_ev, EV_TIMEOUT, 0);
}

/* ---- lifecycle ---------------------------------------------------------- */

/* ---- liveness ------------------------------------------------------------- */

static void on_beat(evutil_socket_t fd, short what, void *arg)
{
    struct loop *w = arg;

    atomic_store_explicit(&w->beat_ns, clock_mono_ns(), memory_order_relaxed);
}

uint64_t loop_stalled_ms(const struct loop *w, uint64_t now_ns)
{
    uint64_t beat = atomic_load_explicit(&w->beat_ns, memory_order_relaxed);
    uint64_t late = now_ns > beat ? (now_ns - beat) / 1000000 : 0;

    /* A beat is due every LOOP_BEAT_MS: only the time beyond it is late. */
    if (!atomic_load(&w->beating) || late <= LOOP_BEAT_MS)
        return 0;
    return late;
}

static int beat_init(struct loop *w)
{
    struct timeval tv = clock_ms_to_tv(LOOP_BEAT_MS);

    atomic_store(&w->beat_ns, clock_mono_ns());
    w->beat_ev = event_new(w->base, -1, EV_PERSIST, on_beat, w);
    return w->beat_ev && event_add(w->beat_ev, &tv) == 0 ? 0 : -ENOMEM;
}

static int events_init(struct loop *w, struct sc_error *err)
{
    const union MHD_DaemonInfo *info =
        MHD_get_daemon_info(w->mhd, MHD_DAEMON_INFO_EPOLL_FD);

    if (!info) {
        sc_error_set(err, "http server: no epoll fd");
        return -EINVAL;
    }
    w->mhd_read_ev = event_new(w->base, info->epoll_fd, EV_READ | EV_PERSIST,
                               on_mhd_ready, w);
    w->mhd_timer_ev = evtimer_new(w->base, on_mhd_ready, w);
    w->quiesce_ev = event_new(w->base, -1, 0, on_quiesce, w);
    w->abort_ev = event_new(w->base, -1, 0, on_abort, w);
    w->runtime_ev = event_new(w->base, -1, 0, on_runtime, w);
    w->accept_resume_ev = evtimer_new(w->base, on_accept_resume, w);
    if (!w->mhd_read_ev || !w->mhd_timer_ev || !w->quiesce_ev || !w->abort_ev ||
        !w->runtime_ev || !w->accept_resume_ev || beat_init(w) != 0 ||
        event_add(w->mhd_read_ev, NULL) != 0) {
        sc_error_set(err, "cannot create the loop's events");
        return -ENOMEM;
    }
    return 0;
}

static struct event_base *base_new(void)
{
    struct event_config *ec = event_config_new();
    struct event_base *base;

    if (!ec)
        return NULL;
    /* The changelist folds add/del pairs into one epoll_ctl: measurably
     * cheaper per request (measured on a prototype: 32.7 -> 28 us of CPU per proxied request). */
    event_config_set_flag(ec, EVENT_BASE_FLAG_EPOLL_USE_CHANGELIST);
    /* Permits are timed to the millisecond; the coarse clock is ~4 ms. */
    event_config_set_flag(ec, EVENT_BASE_FLAG_PRECISE_TIMER);
    base = event_base_new_with_config(ec);
    event_config_free(ec);
    return base;
}

/* What the rows of this loop's requests may use (proxy/exchange/env.h). */
static void env_init(struct loop *w)
{
    struct app *app = w->app;

    w->env = (struct ex_env){
        .clock = &ex_system_clock,
        .base = w->base,
        .store = w->store,
        .store_shares = store_shares_buckets(app->store),
        .store_timeout_ms = app->fixed.store_timeout_ms,
        .replicas_ack = app->fixed.replicas_ack,
        .claims = &app->claims,
        .dup_waiters = &w->dup_waiters,
        .leases_active = &app->leases_active,
        .metrics = &app->metrics.shards[w->idx],
        .statsd = &w->statsd,
        .spare_calls = &w->spare_call,
        .verify_begin = verification_begin,
        .verify_take_up = verification_take_up,
        .verify_arg = w,
    };
}

int loop_init(struct loop *w, struct app *app, unsigned idx,
                int listen_fd, struct sc_error *err)
{
    memset(w, 0, sizeof *w);
    key_waiters_init(&w->dup_waiters);
    exchange_loop_init(w);
    w->statsd.fd = -1;
    w->idx = idx;
    w->app = app;
    TAILQ_INIT(&w->waiting);
    TAILQ_INIT(&w->conns);
    TAILQ_INIT(&w->verifications);
    w->base = base_new();
    if (!w->base) {
        sc_error_set(err, "cannot create an event loop");
        return -ENOMEM;
    }
    /* Resolves upstream host names without blocking; reads resolv.conf. */
    w->dns = evdns_base_new(w->base, EVDNS_BASE_INITIALIZE_NAMESERVERS |
                                         EVDNS_BASE_DISABLE_WHEN_INACTIVE);
    if (!w->dns)
        w->dns = evdns_base_new(w->base, EVDNS_BASE_DISABLE_WHEN_INACTIVE);
    w->mhd = mhd_start(w);
    if (!w->mhd) {
        sc_error_set(err, "cannot start the http server on %s:%u",
                     app->fixed.listen.host, app->fixed.listen.port);
        return -EINVAL;
    }
    if (events_init(w, err) != 0)
        return -ENOMEM;
    if (store_loop_new(app->store, w->base, &w->store, err) != 0)
        return -ENOMEM;
    /* Every loop accepts from the one shared socket; the kernel wakes one
     * or both, and a loser's accept just finds nothing. */
    w->statsd.fd = -1;
    if (app->fixed.statsd[0] &&
        statsd_open(&w->statsd, app->fixed.statsd, w->base, &app->metrics, idx, err) != 0)
        return -EINVAL;
    w->listener = evconnlistener_new(w->base, on_accept, w, 0, -1, listen_fd);
    if (!w->listener) {
        sc_error_set(err, "cannot accept on the listening socket");
        return -ENOMEM;
    }
    evconnlistener_set_error_cb(w->listener, on_accept_error);
    env_init(w);
    mhd_run(w);
    return 0;
}

static void *loop_main(void *arg)
{
    struct loop *w = arg;

    atomic_store(&w->beat_ns, clock_mono_ns());
    atomic_store(&w->beating, true);
    event_base_loop(w->base, EVLOOP_NO_EXIT_ON_EMPTY);
    atomic_store(&w->beating, false);
    return NULL;
}

int loop_start(struct loop *w, struct sc_error *err)
{
    int rc = pthread_create(&w->tid, NULL, loop_main, w);

    if (rc != 0) {
        sc_error_set(err, "cannot start an event-loop thread: %s", strerror(rc));
        return -rc;
    }
    w->started = true;
    return 0;
}

static void free_event(struct event **ev)
{
    if (*ev) {
        event_free(*ev);
        *ev = NULL;
    }
}

void loop_join(struct loop *w)
{
    if (w->started) {
        event_base_loopexit(w->base, NULL);
        pthread_join(w->tid, NULL);
        w->started = false;
    }
}

void loop_stop_daemon(struct loop *w)
{
    /* A verification still pending is made again at the next start. */
    verification_stop_all(w);
    /* Our events on MHD's epoll fd go before MHD closes it. */
    free_event(&w->mhd_read_ev);
    free_event(&w->mhd_timer_ev);
    if (w->listener)
        evconnlistener_free(w->listener);
    w->listener = NULL;
    /* Nothing is suspended any more (the drain answered it all), so MHD may
     * stop: it closes idle keep-alive connections to workers. */
    if (w->mhd)
        MHD_stop_daemon(w->mhd);
    w->mhd = NULL;
    statsd_close(&w->statsd);
    /* Runs what other threads posted before the loop ended (pool frees of
     * an old runtime). */
    if (w->base)
        event_base_loop(w->base, EVLOOP_NONBLOCK);
}

void loop_stop(struct loop *w)
{
    loop_join(w);
    loop_stop_daemon(w);
    /* After the daemon: its exchanges have cancelled their calls. */
    store_loop_free(w->store);
    w->store = NULL;
    free_event(&w->quiesce_ev);
    free_event(&w->abort_ev);
    free_event(&w->runtime_ev);
    free_event(&w->accept_resume_ev);
    free_event(&w->beat_ev);
    if (w->dns)
        evdns_base_free(w->dns, 0);
    w->dns = NULL;
    if (w->base)
        event_base_free(w->base);
    w->base = NULL;
    exchange_loop_clear(w); /* after the daemon and the store: nothing left */
    key_waiters_destroy(&w->dup_waiters);
}

void loops_wake_key(void *arg, const char *scope, const char *key)
{
    struct app *app = arg;

    for (unsigned i = 0; i < app->n_loops; i++)
        key_waiters_wake(&app->loops[i].dup_waiters, scope, key);
}
