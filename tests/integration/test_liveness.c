/* /healthz as a liveness probe (docs/reference/admin.md): 200 while every
 * request loop turns, 503 once one has not for LOOP_STALL_MS, 200 again when
 * it turns; and the systemd watchdog, whose pings stop then too. The loop is wedged the way a real one gets wedged: its access log
 * goes to a pipe nobody reads (a stalled log collector), so its next write(2)
 * blocks. Nothing in sluice is faked. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <jansson.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "integration/harness.h"

#define STALL_MS 10000 /* proxy/server.h LOOP_STALL_MS */

static struct h_stub stub;
static struct h_sluice sl;
static int log_fd = -1, nfd = -1;
static pthread_t drainer;
static atomic_bool draining_done;
static bool drainer_started;

static long now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

/* Reads sluice's log until it closes its end: the loop unblocks, and the
 * drain at the end finds a reader too. */
static void *drain_forever(void *arg)
{
    (void)arg;
    while (!atomic_load(&draining_done)) {
        struct pollfd p = {.fd = log_fd, .events = POLLIN};

        poll(&p, 1, 100);
        if (h_log_pipe_drain(log_fd) < 0 && sl.pid <= 0)
            break;
    }
    return NULL;
}

static void start_draining(void)
{
    cr_assert_eq(pthread_create(&drainer, NULL, drain_forever, NULL), 0);
    drainer_started = true;
}

static void stop(void)
{
    if (!drainer_started && log_fd >= 0)
        start_draining();
    h_sluice_cleanup(&sl);
    atomic_store(&draining_done, true);
    if (drainer_started)
        pthread_join(drainer, NULL);
    if (log_fd >= 0)
        close(log_fd);
    if (nfd >= 0)
        close(nfd);
    h_stub_stop(&stub);
}

/* /healthz's status, and its body in *body (owned) when asked. */
static int healthz(char **body)
{
    struct h_resp r;
    int status;

    cr_assert_eq(h_http(sl.admin_port, "GET", "/healthz", NULL, NULL, 0, &r), 0,
                 "/healthz did not answer: the admin listener must not wait for a loop");
    status = r.status;
    if (body)
        *body = strdup(r.body ? r.body : "");
    h_resp_free(&r);
    return status;
}

/* Requests whose access-log lines overflow the pipe: the loop blocks in the
 * write of one of them. The connections stay open, unanswered. */
static void wedge_the_loop(int *fds, int n)
{
    static const char req[] = "GET /x HTTP/1.1\r\nHost: a\r\n\r\n";

    for (int i = 0; i < n; i++) {
        fds[i] = h_connect(sl.port);
        cr_assert_geq(fds[i], 0);
        cr_assert_eq(h_send_all(fds[i], req, sizeof req - 1), 0);
    }
}

Test(liveness, healthz_fails_while_a_loop_is_wedged, .fini = stop, .timeout = 90)
{
    char *cfg, *body = NULL;
    int fds[64];
    long t0, stalled_at = -1, back_at = -1;
    json_t *j;

    cr_assert_eq(h_stub_start(&stub, NULL), 0);
    log_fd = h_log_pipe(&sl, 4096);
    cr_assert_geq(log_fd, 0);
    cr_assert(asprintf(&cfg, "threads: 1\nupstreams: {a: {url: http://127.0.0.1:%d}}\n"
                             "routes: [{prefix: /, upstream: a}]\n", stub.port) > 0);
    cr_assert_eq(h_sluice_spawn(&sl, cfg), 0);
    free(cfg);
    /* Its start-up lines are read; from here on nobody reads. */
    for (t0 = now_ms(); h_sluice_wait_ready(&sl) != 0 && now_ms() - t0 < 10000;)
        h_log_pipe_drain(log_fd);
    h_log_pipe_drain(log_fd);
    cr_assert_eq(healthz(NULL), 200, "a loop that turns is healthy");

    wedge_the_loop(fds, 64);
    t0 = now_ms();
    while (now_ms() - t0 < STALL_MS + 8000) {
        if (healthz(stalled_at < 0 ? &body : NULL) == 503) {
            stalled_at = now_ms();
            break;
        }
        free(body);
        body = NULL;
        usleep(250000);
    }
    cr_assert_geq(stalled_at, 0, "/healthz still 200 %ld ms after the loop wedged",
                  now_ms() - t0);
    /* Not before the bound: a slow pass is not a wedge. */
    cr_expect_geq(stalled_at - t0, STALL_MS - 1500, "503 after %ld ms", stalled_at - t0);
    j = json_loads(body, 0, NULL);
    cr_assert_not_null(j, "%s", body);
    cr_expect_str_eq(json_string_value(json_object_get(j, "reason")), "loop_stalled");
    cr_expect_eq(json_integer_value(json_object_get(j, "loop")), 0);
    cr_expect_geq(json_integer_value(json_object_get(j, "stalled_ms")), STALL_MS);
    json_decref(j);
    free(body);

    /* The collector catches up: the loop turns again, and so says /healthz. */
    start_draining();
    t0 = now_ms();
    while (now_ms() - t0 < 5000) {
        if (healthz(NULL) == 200) {
            back_at = now_ms();
            break;
        }
        usleep(100000);
    }
    cr_expect_geq(back_at, 0, "/healthz not 200 again 5 s after the log was read");
    for (int i = 0; i < 64; i++)
        close(fds[i]);
}

/* ---- the systemd watchdog ------------------------------------------------ */

/* The socket systemd would own ($NOTIFY_SOCKET), as tests/integration/
 * test_notify.c makes it. */
static void notify_socket(void)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};

    nfd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(nfd, 0);
    cr_assert_lt(snprintf(a.sun_path, sizeof a.sun_path, "%s/notify.sock", sl.dir),
                 (int)sizeof a.sun_path);
    cr_assert_eq(bind(nfd, (struct sockaddr *)&a, sizeof a), 0, "bind %s", a.sun_path);
    cr_assert_eq(setenv("NOTIFY_SOCKET", a.sun_path, 1), 0);
}

/* Reads datagrams for ms; the time of the last WATCHDOG=1 among them (-1:
 * none), and how many in *n. */
static long last_ping(long ms, int *n)
{
    long end = now_ms() + ms, last = -1;
    char buf[4096];

    *n = 0;
    while (now_ms() < end) {
        struct pollfd p = {.fd = nfd, .events = POLLIN};
        ssize_t got;

        if (poll(&p, 1, (int)(end - now_ms())) <= 0)
            continue;
        got = recv(nfd, buf, sizeof buf - 1, 0);
        if (got <= 0)
            continue;
        buf[got] = '\0';
        if (strstr(buf, "WATCHDOG=1")) {
            last = now_ms();
            (*n)++;
        }
    }
    return last;
}

Test(liveness, watchdog_pings_stop_while_a_loop_is_wedged, .fini = stop, .timeout = 90)
{
    char *cfg;
    int fds[64], n;
    long t0, last;

    cr_assert_eq(h_stub_start(&stub, NULL), 0);
    log_fd = h_log_pipe(&sl, 4096);
    cr_assert_geq(log_fd, 0);
    notify_socket();
    /* 1 s: a ping every 500 ms. */
    cr_assert_eq(setenv("WATCHDOG_USEC", "1000000", 1), 0);
    cr_assert(asprintf(&cfg, "threads: 1\nupstreams: {a: {url: http://127.0.0.1:%d}}\n"
                             "routes: [{prefix: /, upstream: a}]\n", stub.port) > 0);
    cr_assert_eq(h_sluice_spawn(&sl, cfg), 0);
    free(cfg);
    cr_assert_eq(h_sluice_wait_ready(&sl), 0);
    h_log_pipe_drain(log_fd);
    last_ping(1200, &n);
    cr_assert_geq(n, 1, "no WATCHDOG=1 while healthy");

    wedge_the_loop(fds, 64);
    t0 = now_ms();
    /* Below the bound the main loop pings on: one slow pass is no wedge. */
    last_ping(STALL_MS / 2, &n);
    cr_expect_geq(n, 3, "only %d pings in the %d ms after the wedge", n, STALL_MS / 2);
    /* Past it, they stop. */
    last = last_ping(STALL_MS / 2 + 4000, &n);
    cr_expect(last >= 0 && last - t0 < STALL_MS + 1500,
              "a WATCHDOG=1 %ld ms after the loop wedged (bound %d ms)", last - t0, STALL_MS);
    cr_expect_eq(last_ping(2000, &n), -1, "%d pings while the loop is wedged", n);

    start_draining();
    last_ping(3000, &n);
    cr_expect_geq(n, 2, "pings did not resume once the loop turned (%d)", n);
    for (int i = 0; i < 64; i++)
        close(fds[i]);
}
