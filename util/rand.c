#include "util/rand.h"

#include <sys/random.h>
#include <time.h>

/* xorshift64*, seeded per thread from the kernel: jitter must differ between
 * sidecars started together, or a cohort would wake together anyway. */
static _Thread_local uint64_t state;

uint64_t rand_u64(void)
{
    if (state == 0) {
        if (getrandom(&state, sizeof state, 0) != sizeof state || state == 0)
            state = (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull | 1;
    }
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return state * 0x2545f4914f6cdd1dull;
}
