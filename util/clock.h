/* Time sources. Monotonic time drives timers, buckets and durations; wall
 * time only stamps records and logs. */
#ifndef SLUICE_UTIL_CLOCK_H
#define SLUICE_UTIL_CLOCK_H

#include <stdint.h>

uint64_t clock_mono_ns(void);
uint64_t clock_wall_ms(void);

#endif
