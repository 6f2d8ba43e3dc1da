/* Time sources. Monotonic time drives timers, buckets and durations; wall
 * time only stamps records and logs. */
#ifndef SLUICE_UTIL_CLOCK_H
#define SLUICE_UTIL_CLOCK_H

#include <stdint.h>
#include <sys/time.h>

#define NS_PER_MS 1000000ull
#define NS_PER_S 1000000000ull

uint64_t clock_mono_ns(void);
uint64_t clock_wall_ms(void);

/* A duration as libevent's timers take it. */
struct timeval clock_ns_to_tv(uint64_t ns);
struct timeval clock_ms_to_tv(uint64_t ms);

#endif
