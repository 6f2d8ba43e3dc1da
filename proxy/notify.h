/* The systemd notification protocol (sd_notify(3)) for a Type=notify unit:
 * READY=1 once the store is open and the listeners are up, RELOADING=1 /
 * READY=1 around a reload, STOPPING=1 when the drain begins, and WATCHDOG=1
 * from the main loop. Without $NOTIFY_SOCKET (not under systemd) every call
 * does nothing. */
#ifndef SLUICE_PROXY_NOTIFY_H
#define SLUICE_PROXY_NOTIFY_H

#include <stdbool.h>

#include "util/error.h"

struct event_base;
struct event;

void notify_ready(void);
void notify_reloading(void);
void notify_stopping(void);

/* Whether the process is alive enough to ping the watchdog (arg as given). */
typedef bool (*notify_alive_fn)(void *arg);

/* With WatchdogSec= set on the unit, arms a timer on base that sends
 * WATCHDOG=1 at half the interval, while alive(arg) says so; *ev gets the
 * timer (NULL when the watchdog is off), for the caller to free. Because the
 * timer runs on that loop, a loop that stops turning stops the pings too, and
 * systemd restarts the process. 0 or a negative errno with err filled. */
int notify_watchdog_start(struct event_base *base, struct event **ev,
                          notify_alive_fn alive, void *arg, struct sc_error *err);

#endif
