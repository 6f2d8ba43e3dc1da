/* The systemd notification protocol as a Type=notify unit sees it
 * (sd_notify(3)): the test owns the unix datagram socket that $NOTIFY_SOCKET
 * names, starts the real sluice with it, and reads what arrives: READY=1
 * once the listeners answer, WATCHDOG=1 at half of $WATCHDOG_USEC,
 * RELOADING=1 then READY=1 around a reload, STOPPING=1 on SIGTERM. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "integration/harness.h"
#include "support/testutil.h"

static struct h_stub stub;
static struct h_sluice sl;
static int nfd = -1;

static void stop(void)
{
    h_sluice_cleanup(&sl);
    h_stub_stop(&stub);
    if (nfd >= 0)
        close(nfd);
    nfd = -1;
}

static long now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

/* The socket systemd would own, in sluice's temp dir; $NOTIFY_SOCKET names
 * it for the sluice started next (Criterion runs each test in its own
 * process, so the variable goes no further). */
static void notify_socket(void)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};

    sl.dir = tu_mkdtemp("notify");
    nfd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(nfd, 0);
    cr_assert_lt(snprintf(a.sun_path, sizeof a.sun_path, "%s/notify.sock", sl.dir),
                 (int)sizeof a.sun_path);
    cr_assert_eq(bind(nfd, (struct sockaddr *)&a, sizeof a), 0, "bind %s", a.sun_path);
    cr_assert_eq(setenv("NOTIFY_SOCKET", a.sun_path, 1), 0);
}

/* The next datagram within timeout_ms, NUL-terminated, or NULL. */
static const char *next_msg(int timeout_ms)
{
    static char buf[4096];
    struct pollfd p = {.fd = nfd, .events = POLLIN};
    ssize_t n;

    if (poll(&p, 1, timeout_ms) <= 0)
        return NULL;
    n = recv(nfd, buf, sizeof buf - 1, 0);
    if (n < 0)
        return NULL;
    buf[n] = '\0';
    return buf;
}

/* True when msg holds the assignment as one of its lines. */
static bool has_line(const char *msg, const char *line)
{
    size_t n = strlen(line);

    for (const char *p = msg; p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (!strncmp(p, line, n) && (p[n] == '\n' || p[n] == '\0'))
            return true;
    return false;
}

/* Waits for a datagram holding `line`, skipping WATCHDOG=1 pings; every
 * other message seen on the way is appended to `seen` (may be NULL). */
static bool wait_for(const char *line, int timeout_ms, char *seen, size_t seen_len)
{
    long deadline = now_ms() + timeout_ms;

    while (now_ms() < deadline) {
        const char *m = next_msg((int)(deadline - now_ms()));

        if (!m)
            return false;
        if (has_line(m, line))
            return true;
        if (seen && !has_line(m, "WATCHDOG=1"))
            snprintf(seen + strlen(seen), seen_len - strlen(seen), "[%s]", m);
    }
    return false;
}

static char *route_config(void)
{
    char *cfg;

    cr_assert(asprintf(&cfg, "upstreams: {stub: {url: http://127.0.0.1:%d}}\n"
                             "routes: [{prefix: /, upstream: stub}]\n", stub.port) > 0);
    return cfg;
}

static int get_status(int port, const char *path)
{
    struct h_resp r = {0};
    int status = h_http(port, "GET", path, NULL, NULL, 0, &r) == 0 ? r.status : -1;

    h_resp_free(&r);
    return status;
}

Test(notify, ready_once_listening_and_stopping_on_sigterm, .fini = stop, .timeout = 60)
{
    char seen[1024] = "", *cfg;

    cr_assert_eq(h_stub_start(&stub, NULL), 0);
    notify_socket();
    cfg = route_config();
    cr_assert_eq(h_sluice_spawn(&sl, cfg), 0);
    free(cfg);

    /* Nothing but READY=1 comes first (no reload, no stop). */
    cr_assert(wait_for("READY=1", 10000, seen, sizeof seen), "no READY=1; before it: %s", seen);
    cr_expect_str_empty(seen, "before READY=1: %s", seen);
    /* At READY=1 both listeners answer: the worker port forwards to the
     * stub, the admin port says ready. */
    cr_expect_eq(get_status(sl.port, "/hello"), 200);
    cr_expect_eq(get_status(sl.admin_port, "/readyz"), 200);

    cr_expect_eq(h_sluice_stop(&sl, 20), 0, "exit status");
    cr_expect(wait_for("STOPPING=1", 2000, NULL, 0), "no STOPPING=1 after SIGTERM");
}

Test(notify, reloading_then_ready_around_a_reload, .fini = stop, .timeout = 60)
{
    char *cfg;

    cr_assert_eq(h_stub_start(&stub, NULL), 0);
    notify_socket();
    cfg = route_config();
    cr_assert_eq(h_sluice_spawn(&sl, cfg), 0);
    cr_assert(wait_for("READY=1", 10000, NULL, 0));

    /* A good reload, then a refused one: sluice serves on either way. */
    cr_assert_eq(kill(sl.pid, SIGHUP), 0);
    cr_expect(wait_for("RELOADING=1", 5000, NULL, 0), "no RELOADING=1 on SIGHUP");
    cr_expect(wait_for("READY=1", 5000, NULL, 0), "no READY=1 after the reload");
    cr_assert_eq(h_sluice_rewrite(&sl, "routes: 5\n"), 0);
    cr_assert_eq(kill(sl.pid, SIGHUP), 0);
    cr_expect(wait_for("RELOADING=1", 5000, NULL, 0), "no RELOADING=1 on a refused reload");
    cr_expect(wait_for("READY=1", 5000, NULL, 0), "no READY=1 after a refused reload");
    cr_expect(h_file_contains(sl.log_path, "reload refused"));
    cr_expect_eq(get_status(sl.port, "/hello"), 200);
    free(cfg);
}

Test(notify, watchdog_pings_at_half_the_interval, .fini = stop, .timeout = 60)
{
    long t0;
    int pings = 0;
    char *cfg;

    cr_assert_eq(h_stub_start(&stub, NULL), 0);
    notify_socket();
    /* 400 ms: a ping every 200 ms. */
    cr_assert_eq(setenv("WATCHDOG_USEC", "400000", 1), 0);
    cfg = route_config();
    cr_assert_eq(h_sluice_spawn(&sl, cfg), 0);
    free(cfg);
    cr_assert(wait_for("READY=1", 10000, NULL, 0));
    t0 = now_ms();
    while (now_ms() - t0 < 1100) {
        const char *m = next_msg(300);

        cr_assert_not_null(m, "no message for 300 ms after %d pings", pings);
        pings += has_line(m, "WATCHDOG=1");
    }
    /* 5 expected in 1.1 s; 4 leaves room for a late timer on a busy box. */
    cr_expect_geq(pings, 4, "%d WATCHDOG=1 in 1.1 s", pings);
    cr_expect_leq(pings, 7, "%d WATCHDOG=1 in 1.1 s", pings);
}
