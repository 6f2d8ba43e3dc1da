/* Outcome classification: what each upstream answer or failure becomes for
 * the worker and for the policy (cooldown, breaker), with the attempt budget
 * and the reset hint's limit. */
#include <criterion/criterion.h>
#include <string.h>

#include "policies/outcome.h"

#define DAY_MS (24ull * 3600 * 1000)

static void on(struct sc_retry *r, int status)
{
    r->on_status[status / 64] |= 1ull << (status % 64);
}

/* The defaults of docs/contract.md: on 429, 5xx and every transport error,
 * 8 attempts, no jitter here so delays can be checked exactly. */
static struct sc_retry defaults(void)
{
    struct sc_retry r;

    memset(&r, 0, sizeof r);
    on(&r, 429);
    for (int s = 500; s < 600; s++)
        on(&r, s);
    r.on_transport = SC_T_CONNECT_ERROR | SC_T_CONNECTION_LOST | SC_T_TIMEOUT;
    r.base_ms = 1000;
    r.multiplier = 2;
    r.cap_ms = 6 * 3600 * 1000;
    r.max_attempts = 8;
    r.max_delay_ms = 7 * DAY_MS;
    r.jitter = SC_JITTER_NONE;
    return r;
}

static struct outcome_verdict classify(const struct sc_retry *r,
                                       struct outcome_input in)
{
    struct outcome_verdict v;

    if (!in.attempt)
        in.attempt = 1;
    outcome_classify(r, &in, &v);
    return v;
}

Test(outcome, success_passes_and_tells_the_breaker)
{
    struct sc_retry r = defaults();
    struct outcome_verdict v = classify(&r, (struct outcome_input){.status = 201});

    cr_expect_eq(v.action, OA_PASS);
    cr_expect_eq(v.outcome, OUT_OK);
    cr_expect_eq(v.status, 201);
    cr_expect_eq(v.reason, R_NONE);
    cr_expect_eq(v.breaker, OB_SUCCESS);
    cr_expect_not(v.cool_down);
}

Test(outcome, client_errors_pass_as_permanent)
{
    struct sc_retry r = defaults();
    struct outcome_verdict v = classify(&r, (struct outcome_input){.status = 404});

    cr_expect_eq(v.action, OA_PASS);
    cr_expect_eq(v.outcome, OUT_PERMANENT_ERROR);
    cr_expect_eq(v.breaker, OB_SUCCESS, "a 4xx is the partner working");
}

Test(outcome, a_429_requeues_after_its_hint_and_cools_the_policy)
{
    struct sc_retry r = defaults();
    struct outcome_verdict v = classify(&r, (struct outcome_input){
        .status = 429, .has_hint = true, .hint_ms = 30000, .rnd = 0});

    cr_expect_eq(v.action, OA_REQUEUE);
    cr_expect_eq(v.outcome, OUT_REQUEUE);
    cr_expect_eq(v.reason, R_UPSTREAM_429);
    cr_expect_geq(v.delay_ms, 30000);
    cr_expect_leq(v.delay_ms, 33000, "hint plus at most 10 %%");
    cr_expect(v.cool_down);
    cr_expect_eq(v.breaker, OB_SUCCESS);
}

Test(outcome, a_5xx_backs_off_by_attempt_and_counts_as_a_failure)
{
    struct sc_retry r = defaults();
    struct outcome_verdict v1 = classify(&r, (struct outcome_input){.status = 503, .attempt = 1});
    struct outcome_verdict v3 = classify(&r, (struct outcome_input){.status = 503, .attempt = 3});

    cr_expect_eq(v1.action, OA_REQUEUE);
    cr_expect_eq(v1.reason, R_UPSTREAM_5XX);
    cr_expect_eq(v1.delay_ms, 1000);
    cr_expect_eq(v3.delay_ms, 4000);
    cr_expect_eq(v1.breaker, OB_FAILURE);
    cr_expect_not(v1.cool_down);
}

Test(outcome, statuses_not_in_retry_on_pass_through)
{
    struct sc_retry r = defaults();
    struct outcome_verdict v;

    memset(r.on_status, 0, sizeof r.on_status);
    v = classify(&r, (struct outcome_input){.status = 503});
    cr_expect_eq(v.action, OA_PASS);
    cr_expect_eq(v.outcome, OUT_PERMANENT_ERROR);
    cr_expect_eq(v.status, 503);
    cr_expect_eq(v.breaker, OB_FAILURE, "the breaker counts it all the same");
    v = classify(&r, (struct outcome_input){.status = 429});
    cr_expect_eq(v.action, OA_PASS);
    cr_expect(v.cool_down, "a 429 still cools the policy");
}

Test(outcome, the_last_attempt_is_dead_lettered)
{
    struct sc_retry r = defaults();
    struct outcome_verdict v = classify(&r, (struct outcome_input){.status = 500, .attempt = 8});

    cr_expect_eq(v.action, OA_DEAD_LETTER);
    cr_expect_eq(v.outcome, OUT_DEAD_LETTER);
    cr_expect_eq(v.reason, R_UPSTREAM_5XX);
    cr_expect_eq(classify(&r, (struct outcome_input){.status = 500, .attempt = 7}).action,
                 OA_REQUEUE);
}

Test(outcome, a_hint_beyond_max_delay_is_dead_lettered)
{
    struct sc_retry r = defaults();
    struct outcome_verdict v;

    r.max_delay_ms = 60000;
    v = classify(&r, (struct outcome_input){.status = 429, .has_hint = true,
                                            .hint_ms = 3600000});
    cr_expect_eq(v.action, OA_DEAD_LETTER);
    cr_expect_eq(v.reason, R_DELAY_EXCEEDS_MAX);
    cr_expect(v.cool_down);
}

Test(outcome, transport_failures_requeue_when_listed)
{
    struct sc_retry r = defaults();
    static const struct {
        enum outcome_transport t;
        enum reason reason;
    } cases[] = {
        {OT_CONNECT_ERROR, R_CONNECT_ERROR},
        {OT_CONNECTION_LOST, R_CONNECTION_LOST},
        {OT_TIMEOUT, R_TIMEOUT},
    };

    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct outcome_verdict v = classify(&r, (struct outcome_input){.transport = cases[i].t});

        cr_expect_eq(v.action, OA_REQUEUE, "case %zu", i);
        cr_expect_eq(v.reason, cases[i].reason, "case %zu", i);
        cr_expect_eq(v.breaker, OB_FAILURE, "case %zu", i);
    }
}

Test(outcome, transport_failures_not_listed_are_refused_with_their_status)
{
    struct sc_retry r = defaults();
    struct outcome_verdict v;

    r.on_transport = 0;
    v = classify(&r, (struct outcome_input){.transport = OT_CONNECT_ERROR});
    cr_expect_eq(v.action, OA_REFUSE);
    cr_expect_eq(v.status, 502);
    cr_expect_eq(v.outcome, OUT_PERMANENT_ERROR);
    v = classify(&r, (struct outcome_input){.transport = OT_TIMEOUT});
    cr_expect_eq(v.status, 504);
    cr_expect_eq(v.reason, R_TIMEOUT);
}

Test(outcome, an_oversized_head_is_refused_without_retry_or_breaker)
{
    struct sc_retry r = defaults();
    struct outcome_verdict v = classify(&r, (struct outcome_input){
        .transport = OT_CONNECTION_LOST, .head_too_big = true});

    cr_expect_eq(v.action, OA_REFUSE, "retrying would repeat the side effect");
    cr_expect_eq(v.status, 502);
    cr_expect_eq(v.reason, R_CONNECTION_LOST);
    cr_expect_eq(v.breaker, OB_NONE);
}
