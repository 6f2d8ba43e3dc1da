#include "policies/breaker.h"

/* Past this many doublings the pause is max_pause whatever it is. */
#define BREAKER_MAX_DOUBLINGS 20

uint64_t breaker_note(const struct sc_breaker *b, struct breaker_state *s,
                      bool failed, bool paused_now)
{
    uint32_t opens;
    uint64_t pause_ms;

    if (!b->enabled)
        return 0;
    if (!failed) {
        /* Read first: a store on every success would bounce the line
         * between threads for nothing. */
        if (atomic_load(&s->fail_streak) || atomic_load(&s->opens)) {
            atomic_store(&s->fail_streak, 0);
            atomic_store(&s->opens, 0);
        }
        return 0;
    }
    if (atomic_fetch_add(&s->fail_streak, 1) + 1 < b->failures || paused_now)
        return 0;
    opens = atomic_fetch_add(&s->opens, 1);
    pause_ms = opens < BREAKER_MAX_DOUBLINGS ? b->pause_ms << opens : b->max_pause_ms;
    return pause_ms > b->max_pause_ms ? b->max_pause_ms : pause_ms;
}
