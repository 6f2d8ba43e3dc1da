/* policies/breaker.c: the streak that opens the breaker, the probe whose
 * failure doubles the next pause up to max_pause, the success that closes
 * it, and failures during a pause that do not extend it. */
#include <criterion/criterion.h>

#include "policies/breaker.h"

static const struct sc_breaker b = {
    .enabled = true, .failures = 3, .pause_ms = 1000, .max_pause_ms = 5000,
};

Test(breaker, a_streak_opens_it)
{
    struct breaker_state s = {0};

    cr_expect_eq(breaker_note(&b, &s, true, false), 0);
    cr_expect_eq(breaker_note(&b, &s, true, false), 0);
    cr_expect_eq(breaker_note(&b, &s, true, false), 1000, "the third failure in a row");
}

Test(breaker, a_success_breaks_the_streak)
{
    struct breaker_state s = {0};

    breaker_note(&b, &s, true, false);
    breaker_note(&b, &s, true, false);
    cr_expect_eq(breaker_note(&b, &s, false, false), 0);
    cr_expect_eq(breaker_note(&b, &s, true, false), 0);
    cr_expect_eq(breaker_note(&b, &s, true, false), 0);
    cr_expect_eq(breaker_note(&b, &s, true, false), 1000);
}

/* After a pause the next request is the probe: its failure opens the
 * breaker again at once, for twice as long, up to max_pause. */
Test(breaker, failed_probes_double_the_pause_up_to_max)
{
    struct breaker_state s = {0};
    static const uint64_t want[] = {2000, 4000, 5000, 5000};

    for (int i = 0; i < 3; i++)
        breaker_note(&b, &s, true, false);
    for (size_t i = 0; i < 4; i++)
        cr_expect_eq(breaker_note(&b, &s, true, false), want[i], "probe %zu", i);
    /* an answer below 500 closes it: the next streak starts from pause */
    cr_expect_eq(breaker_note(&b, &s, false, false), 0);
    for (int i = 0; i < 2; i++)
        cr_expect_eq(breaker_note(&b, &s, true, false), 0);
    cr_expect_eq(breaker_note(&b, &s, true, false), 1000);
}

/* Requests sent before the pause began fail during it: they do not extend
 * it, nor double the next one. */
Test(breaker, failures_during_a_pause_do_not_extend_it)
{
    struct breaker_state s = {0};

    for (int i = 0; i < 3; i++)
        breaker_note(&b, &s, true, false);
    for (int i = 0; i < 5; i++)
        cr_expect_eq(breaker_note(&b, &s, true, true), 0);
    cr_expect_eq(breaker_note(&b, &s, true, false), 2000, "the probe after it");
}

Test(breaker, no_block_no_breaker)
{
    struct sc_breaker off = {0};
    struct breaker_state s = {0};

    for (int i = 0; i < 10; i++)
        cr_expect_eq(breaker_note(&off, &s, true, false), 0);
}

/* Doubling never overflows: far past max_pause it stays at max_pause. */
Test(breaker, many_failed_probes_stay_at_max)
{
    struct sc_breaker big = {.enabled = true, .failures = 1, .pause_ms = 3600000,
                             .max_pause_ms = 3600000};
    struct breaker_state s = {0};

    for (int i = 0; i < 100; i++)
        cr_expect_eq(breaker_note(&big, &s, true, false), 3600000, "at %d", i);
}
