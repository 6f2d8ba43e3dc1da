/* StatsD push (docs/contract.md §8): the same counters and timings as /metrics,
 * as DogStatsD lines over UDP, in datagrams of at most 1432 bytes, flushed
 * at least once a second. One sender per event loop, never blocking: a
 * datagram the socket cannot take at once is dropped and counted. */
#ifndef SLUICE_OBS_STATSD_H
#define SLUICE_OBS_STATSD_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "util/error.h"

#define STATSD_DATAGRAM_MAX 1432

struct metrics;
struct event_base;
struct event;

struct statsd {
    int fd;
    struct sockaddr_storage addr;
    socklen_t alen;
    char buf[STATSD_DATAGRAM_MAX];
    size_t len;
    uint64_t *last;          /* counters already sent, by metrics slot */
    size_t n_last;
    struct metrics *m;
    unsigned shard;
    struct event *timer;
    uint64_t sent, dropped;
};

/* Opens a sender to host:port driven by base, flushing every second the
 * counter deltas of `shard` and the buffered timings. 0 or negative + err. */
int statsd_open(struct statsd *s, const char *hostport, struct event_base *base,
                struct metrics *m, unsigned shard, struct sc_error *err);
void statsd_close(struct statsd *s);

/* One timing in milliseconds; tags "k:v,k:v". */
void statsd_timing(struct statsd *s, const char *name, double ms,
                   const char *tags);

/* Copies a tag value with the characters DogStatsD reserves (, | # :) and
 * quotes, backslashes and newlines replaced by '_'. */
void statsd_tag_value(const char *in, char *out, size_t len);

/* Sends counter deltas and whatever is buffered now. */
void statsd_flush(struct statsd *s);

/* Appends one line, sending the datagram first when the line would not fit
 * (exposed for tests). */
void statsd_line(struct statsd *s, const char *line, size_t len);

#endif
