#include "util/clock.h"

#include <time.h>

uint64_t clock_mono_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t clock_wall_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

struct timeval clock_ns_to_tv(uint64_t ns)
{
    struct timeval tv = {(time_t)(ns / NS_PER_S),
                         (suseconds_t)((ns % NS_PER_S) / 1000)};
    return tv;
}

struct timeval clock_ms_to_tv(uint64_t ms)
{
    return clock_ns_to_tv(ms * NS_PER_MS);
}
