#include "proxy/notify.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <event2/event.h>
#include <systemd/sd-daemon.h>

#include "obs/log.h"
#include "util/clock.h"

/* sd_notify() returns 0 without $NOTIFY_SOCKET, so these cost nothing
 * outside systemd. A failure to notify is logged, never fatal: the process
 * serves either way, and systemd reports the missing message itself. */
static void send_state(const char *state)
{
    int rc = sd_notify(0, state);

    if (rc < 0)
        log_warn("systemd notification %s not sent: %s", state, strerror(-rc));
}

void notify_ready(void)
{
    send_state("READY=1\nSTATUS=serving");
}

void notify_reloading(void)
{
    /* MONOTONIC_USEC lets systemd 253+ (Type=notify-reload) match the
     * READY=1 that ends the reload; older managers ignore it. */
    char msg[96];

    snprintf(msg, sizeof msg, "RELOADING=1\nMONOTONIC_USEC=%llu",
             (unsigned long long)(clock_mono_ns() / 1000));
    send_state(msg);
}

void notify_stopping(void)
{
    send_state("STOPPING=1\nSTATUS=draining");
}

struct watchdog {
    notify_alive_fn alive;
    void *arg;
};

static struct watchdog watchdog;

/* A skipped ping is the point: systemd restarts a process whose request
 * loops stopped, not only one whose main loop did. */
static void on_watchdog(evutil_socket_t fd, short what, void *arg)
{
    const struct watchdog *wd = arg;

    if (!wd->alive || wd->alive(wd->arg))
        send_state("WATCHDOG=1");
}

int notify_watchdog_start(struct event_base *base, struct event **ev,
                          notify_alive_fn alive, void *arg, struct sc_error *err)
{
    uint64_t usec = 0;
    struct timeval tv;
    int rc = sd_watchdog_enabled(0, &usec);

    *ev = NULL;
    if (rc < 0) {
        sc_error_set(err, "systemd watchdog: %s", strerror(-rc));
        return rc;
    }
    if (rc == 0 || usec == 0)
        return 0;
    /* Half the interval, as sd_watchdog_enabled(3) advises: one late tick
     * is not yet a missed deadline. */
    usec /= 2;
    tv.tv_sec = (time_t)(usec / 1000000);
    tv.tv_usec = (suseconds_t)(usec % 1000000);
    watchdog.alive = alive;
    watchdog.arg = arg;
    *ev = event_new(base, -1, EV_PERSIST, on_watchdog, &watchdog);
    if (!*ev || event_add(*ev, &tv) != 0) {
        if (*ev)
            event_free(*ev);
        *ev = NULL;
        sc_error_set(err, "cannot schedule the systemd watchdog");
        return -ENOMEM;
    }
    send_state("WATCHDOG=1");
    return 0;
}
