#define _GNU_SOURCE
#include "obs/statsd.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>

#include "config/units.h"
#include "obs/metrics.h"

#define STATSD_RETRY_MS 10

static void send_buf(struct statsd *s)
{
    if (s->len == 0)
        return;
    if (sendto(s->fd, s->buf, s->len, MSG_DONTWAIT, (struct sockaddr *)&s->addr,
               s->alen) < 0)
        s->dropped++;
    else
        s->sent++;
    s->len = 0;
}

void statsd_line(struct statsd *s, const char *line, size_t len)
{
    if (len + 1 > sizeof s->buf)
        return; /* a line longer than a datagram cannot be sent at all */
    if (s->len + len + 1 > sizeof s->buf)
        send_buf(s);
    if (s->len)
        s->buf[s->len++] = '\n';
    memcpy(s->buf + s->len, line, len);
    s->len += len;
}

void statsd_tag_value(const char *in, char *out, size_t len)
{
    size_t i = 0;

    for (; *in && i + 1 < len; in++)
        out[i++] = strchr(",|#:\"\\\n", *in) ? '_' : *in;
    out[i] = '\0';
}

void statsd_timing(struct statsd *s, const char *name, double ms, const char *tags)
{
    char line[512];
    int n;

    if (s->fd < 0)
        return;
    n = snprintf(line, sizeof line, "sluice.%s:%.3f|ms|#%s", name, ms, tags);
    if (n > 0 && (size_t)n < sizeof line)
        statsd_line(s, line, (size_t)n);
}

/* sluice_requests_total + route="a",outcome="ok" → sluice.requests ... #route:a,outcome:ok */
static void counter_line(void *arg, const char *name, const char *labels,
                         uint64_t delta)
{
    struct statsd *s = arg;
    char line[640], tags[512];
    size_t t = 0, nlen = strlen(name);
    int n;

    bool quoted = false;

    /* route="a,b" → route:a_b: DogStatsD gives , | # : a meaning in tags. */
    for (const char *p = labels; *p && t + 2 < sizeof tags; p++) {
        if (*p == '"') {
            quoted = !quoted;
        } else if (quoted && *p == '\\' && p[1]) {
            p++;
            tags[t++] = strchr(",|#:", *p) || *p == 'n' ? '_' : *p;
        } else if (quoted) {
            tags[t++] = strchr(",|#:", *p) ? '_' : *p;
        } else {
            tags[t++] = *p == '=' ? ':' : *p;
        }
    }
    tags[t] = '\0';
    if (nlen > 6 && !strcmp(name + nlen - 6, "_total"))
        nlen -= 6;
    n = snprintf(line, sizeof line, "sluice.%.*s:%llu|c%s%s", (int)nlen - 7,
                 name + 7, (unsigned long long)delta, t ? "|#" : "", tags);
    if (n > 0 && (size_t)n < sizeof line)
        statsd_line(s, line, (size_t)n);
}

/* Counter deltas first, then whatever is buffered. */
static int flush(struct statsd *s, bool wait)
{
    int rc;

    if (s->fd < 0)
        return 0;
    rc = metrics_counter_deltas(s->m, s->shard, wait, &s->last, &s->n_last, counter_line, s);
    send_buf(s);
    return rc;
}

void statsd_flush(struct statsd *s)
{
    flush(s, false);
}

/* Every loop ticks once a second, all started together: with a fixed
 * period their flushes met each time, and the one that found the registry
 * held skipped its counters at every tick (a whole loop's counts never
 * sent, one CI run). Busy, a flush is tried again 10 ms later instead. */
static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    struct statsd *s = arg;
    struct timeval again = {0, STATSD_RETRY_MS * 1000}, next = {1, 0};

    event_add(s->timer, flush(s, false) == -EBUSY ? &again : &next);
}

static int resolve(struct statsd *s, const char *hostport, struct sc_error *err)
{
    struct addrinfo hints = {.ai_socktype = SOCK_DGRAM, .ai_flags = AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    char *host = NULL, port[8], why[128];
    uint16_t p;
    int rc;

    if (units_parse_hostport(hostport, &host, &p, why, sizeof why) != 0) {
        sc_error_set(err, "metrics.statsd: %s", why);
        return -EINVAL;
    }
    snprintf(port, sizeof port, "%u", p);
    rc = getaddrinfo(host, port, &hints, &res);
    free(host);
    if (rc != 0) {
        sc_error_set(err, "metrics.statsd: cannot resolve %s: %s", hostport,
                     gai_strerror(rc));
        return -EINVAL;
    }
    memcpy(&s->addr, res->ai_addr, res->ai_addrlen);
    s->alen = res->ai_addrlen;
    s->fd = socket(res->ai_family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    freeaddrinfo(res);
    if (s->fd < 0) {
        sc_error_set(err, "metrics.statsd: socket: %s", strerror(errno));
        return -errno;
    }
    return 0;
}

int statsd_open(struct statsd *s, const char *hostport, struct event_base *base,
                struct metrics *m, unsigned shard, struct sc_error *err)
{
    struct timeval tv = {1, 0};
    int rc;

    memset(s, 0, sizeof *s);
    s->fd = -1;
    s->m = m;
    s->shard = shard;
    if ((rc = resolve(s, hostport, err)) != 0)
        return rc;
    s->timer = event_new(base, -1, 0, on_tick, s);
    if (!s->timer || event_add(s->timer, &tv) != 0) {
        sc_error_set(err, "metrics.statsd: cannot schedule the flush");
        return -ENOMEM;
    }
    return 0;
}

void statsd_close(struct statsd *s)
{
    if (s->timer) {
        flush(s, true); /* the last counts, even while a scrape renders */
        event_free(s->timer);
    }
    if (s->fd >= 0)
        close(s->fd);
    free(s->last);
    memset(s, 0, sizeof *s);
    s->fd = -1;
}
