/* Fast per-thread pseudo-random numbers for jitter (not for secrets). */
#ifndef SLUICE_UTIL_RAND_H
#define SLUICE_UTIL_RAND_H

#include <stdint.h>

uint64_t rand_u64(void);

#endif
