/* policies/verify.c: the rules of docs/contract.md §11, on a fake clock (every
 * time is a number the test picks). */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "policies/verify.h"

static void status_set(uint64_t *set, int s)
{
    set[s / 64] |= UINT64_C(1) << (s % 64);
}

/* The contract's example block: found [200], absent [404], after 1s, 3. */
static struct sc_verify example(void)
{
    struct sc_verify v = {.enabled = true, .method = SC_M_GET,
                          .after_ms = 1000, .attempts = 3};

    status_set(v.found, 200);
    status_set(v.absent, 404);
    return v;
}

static struct verify_lease lease(const char *holder, uint32_t attempt,
                                 uint64_t expires_ms)
{
    struct verify_lease l = {.attempt = attempt, .expires_ms = expires_ms};

    snprintf(l.holder, sizeof l.holder, "%s", holder);
    return l;
}

/* ---- names and ids ------------------------------------------------------ */

Test(verify, state_names_are_the_admin_fields)
{
    cr_expect_null(verify_state_name(VERIFY_NONE), "never verified: no field");
    cr_expect_str_eq(verify_state_name(VERIFY_PENDING), "pending");
    cr_expect_str_eq(verify_state_name(VERIFY_FOUND), "found");
    cr_expect_str_eq(verify_state_name(VERIFY_ABSENT), "absent");
    cr_expect_str_eq(verify_state_name(VERIFY_FAILED), "failed");
    cr_expect_null(verify_state_name((enum verify_state)99));
    cr_expect_str_eq(verify_class_name(VC_FOUND), "found");
    cr_expect_str_eq(verify_class_name(VC_ABSENT), "absent");
    cr_expect_str_eq(verify_class_name(VC_OTHER), "other");
}

Test(verify, holder_ids_are_32_hex_digits)
{
    uint8_t rnd[16];
    char id[VERIFY_HOLDER_LEN + 1];

    for (int i = 0; i < 16; i++)
        rnd[i] = (uint8_t)(i * 17 + 0x0f);
    memset(id, '!', sizeof id);
    verify_holder_format(rnd, id);
    cr_expect_str_eq(id, "0f2031425364758697a8b9cadbecfd0e");
    cr_expect_eq(strlen(id), VERIFY_HOLDER_LEN);
}

/* ---- the lookup's target ------------------------------------------------ */

static char *target(const char *base, const char *path, const char *key)
{
    size_t n = verify_target_size(base, path, key);
    char *out = malloc(n);

    cr_assert_not_null(out);
    cr_assert_eq(verify_target(base, path, key, out, n), 0);
    cr_expect_eq(strlen(out) + 1, n, "the size is exact for %s", out);
    return out;
}

Test(verify, target_is_base_path_plus_path_with_the_key)
{
    char *t = target("/base", "/v1/orders?client_ref={key}", "course-1842");

    cr_expect_str_eq(t, "/base/v1/orders?client_ref=course-1842");
    free(t);
    t = target("", "/v1/orders/{key}", "k1");
    cr_expect_str_eq(t, "/v1/orders/k1", "no base path");
    free(t);
    t = target("/b", "/o/{key}?also={key}&x={key}", "a b");
    cr_expect_str_eq(t, "/b/o/a%20b?also=a%20b&x=a%20b", "every {key}");
    free(t);
    t = target("/b", "/o?ref={key}{key}", "k");
    cr_expect_str_eq(t, "/b/o?ref=kk", "adjacent placeholders");
    free(t);
}

/* RFC 3986 unreserved bytes stay; every other byte is %XX, uppercase. */
Test(verify, key_is_percent_encoded_byte_by_byte)
{
    char key[256], want[1024], *t, *w = want;
    int n = 0;

    for (int c = 1; c < 256; c++) {
        bool keep = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
                    (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_' ||
                    c == '~';

        key[n++] = (char)c;
        w += keep ? sprintf(w, "%c", c) : sprintf(w, "%%%02X", c);
    }
    key[n] = '\0';
    t = target("", "/{key}", key);
    cr_expect_eq(strncmp(t, "/", 1), 0);
    cr_expect_str_eq(t + 1, want);
    free(t);
    t = target("", "/{key}", "course-1842:roster-sync:2026-09-03");
    cr_expect_str_eq(t, "/course-1842%3Aroster-sync%3A2026-09-03");
    free(t);
    t = target("", "/{key}", "a/b?c#d%e\"f\xc3\xa9");
    cr_expect_str_eq(t, "/a%2Fb%3Fc%23d%25e%22f%C3%A9", "separators and UTF-8");
    free(t);
}

Test(verify, target_refuses_a_short_buffer)
{
    const char *path = "/o?ref={key}";
    size_t n = verify_target_size("/base", path, "a:b");
    char out[64];

    cr_assert_eq(n, strlen("/base/o?ref=a%3Ab") + 1);
    memset(out, 'x', sizeof out);
    cr_expect_eq(verify_target("/base", path, "a:b", out, n - 1), -ENOSPC);
    cr_expect_str_eq(out, "", "nothing half written");
    cr_expect_eq(verify_target("/base", path, "a:b", NULL, 0), -ENOSPC);
    cr_expect_eq(verify_target("/base", path, "a:b", out, n), 0);
    cr_expect_str_eq(out, "/base/o?ref=a%3Ab");
}

/* ---- what an answer means ----------------------------------------------- */

Test(verify, classify_by_found_and_absent)
{
    struct sc_verify v = example();

    status_set(v.found, 201);
    status_set(v.absent, 410);
    cr_expect_eq(verify_classify(&v, 200), VC_FOUND);
    cr_expect_eq(verify_classify(&v, 201), VC_FOUND);
    cr_expect_eq(verify_classify(&v, 404), VC_ABSENT);
    cr_expect_eq(verify_classify(&v, 410), VC_ABSENT);
    cr_expect_eq(verify_classify(&v, 204), VC_OTHER, "unlisted");
    cr_expect_eq(verify_classify(&v, 500), VC_OTHER);
    cr_expect_eq(verify_classify(&v, 0), VC_OTHER, "no answer");
    cr_expect_eq(verify_classify(&v, 429), VC_OTHER);
    /* The config refuses 429 in the lists; a 429 still means nothing. */
    status_set(v.found, 429);
    cr_expect_eq(verify_classify(&v, 429), VC_OTHER, "429 says nothing");
    status_set(v.absent, 503);
    cr_expect_eq(verify_classify(&v, 503), VC_ABSENT);
}

/* ---- when one starts ---------------------------------------------------- */

Test(verify, starts_on_an_unknown_outcome_of_the_lease_holder)
{
    struct sc_idempotency idem = {.enabled = true, .verify = example()};

    cr_expect(verify_on_outcome(&idem, OT_TIMEOUT, true));
    cr_expect(verify_on_outcome(&idem, OT_CONNECTION_LOST, true));
    cr_expect_not(verify_on_outcome(&idem, OT_CONNECT_ERROR, true),
                  "nothing was sent: the outcome is known");
    cr_expect_not(verify_on_outcome(&idem, OT_ANSWERED, true));
    cr_expect_not(verify_on_outcome(&idem, OT_TIMEOUT, false),
                  "a request that holds no lease (never forwarded)");
    idem.verify.enabled = false;
    cr_expect_not(verify_on_outcome(&idem, OT_TIMEOUT, true), "no verify block");
    idem.verify.enabled = true;
    idem.enabled = false;
    cr_expect_not(verify_on_outcome(&idem, OT_TIMEOUT, true), "no idempotency");
    cr_expect_not(verify_on_outcome(NULL, OT_TIMEOUT, true));
}

static struct verify_lease_view view(enum verify_state s)
{
    return (struct verify_lease_view){
        .verify_enabled = true, .upstream_known = true, .holder_alive = false,
        .state = s, .verifier_alive = false, .deadline_ms = 0,
        .expires_ms = 60000};
}

Test(verify, a_gone_holders_lease_is_verified)
{
    struct verify_lease_view l = view(VERIFY_NONE);
    uint64_t d = 99;

    cr_expect_eq(verify_on_lease(&l, 10000, &d), VA_START);
    cr_expect_eq(d, 0);
    l.holder_alive = true;
    cr_expect_eq(verify_on_lease(&l, 10000, &d), VA_HELD,
                 "the holder is still at it");
    cr_expect_eq(d, 50000, "the lease's remaining time");
    cr_expect_eq(verify_on_lease(&l, 10000, NULL), VA_HELD, "delay optional");
}

/* RocksDB at start-up: every holder and every verifier is gone. */
Test(verify, start_up_verifies_every_lease_but_failed_ones)
{
    struct verify_lease_view l;
    uint64_t d;

    l = view(VERIFY_NONE);
    cr_expect_eq(verify_on_lease(&l, 1000, &d), VA_START);
    l = view(VERIFY_PENDING);
    l.deadline_ms = 5000;
    cr_expect_eq(verify_on_lease(&l, 1000, &d), VA_START,
                 "pending when the last process ended: made again");
    l = view(VERIFY_FAILED);
    cr_expect_eq(verify_on_lease(&l, 1000, &d), VA_HELD, "never again");
    cr_expect_eq(d, 59000);
    l = view(VERIFY_NONE);
    l.upstream_known = false;
    cr_expect_eq(verify_on_lease(&l, 1000, &d), VA_HELD,
                 "its upstream is no longer configured");
    l = view(VERIFY_NONE);
    l.verify_enabled = false;
    cr_expect_eq(verify_on_lease(&l, 1000, &d), VA_HELD, "the policy lost verify");
}

Test(verify, a_running_verification_is_not_started_twice)
{
    struct verify_lease_view l = view(VERIFY_PENDING);
    uint64_t d;

    l.verifier_alive = true;
    l.deadline_ms = 7000;
    cr_expect_eq(verify_on_lease(&l, 1000, &d), VA_PENDING);
    cr_expect_eq(d, 6000, "what remains of D");
    cr_expect_eq(verify_on_lease(&l, 6999, &d), VA_PENDING);
    cr_expect_eq(d, 1);
    cr_expect_eq(verify_on_lease(&l, 7000, &d), VA_HELD,
                 "past its deadline it has ended, whatever the mark says");
    cr_expect_eq(d, 53000);
    l.verifier_alive = false;
    cr_expect_eq(verify_on_lease(&l, 3000, &d), VA_START,
                 "its verifier's liveness key is gone");
    l.holder_alive = true;
    cr_expect_eq(verify_on_lease(&l, 3000, &d), VA_START,
                 "the verifier counts, not the holder");
}

Test(verify, an_expired_lease_is_not_this_modules_business)
{
    struct verify_lease_view l = view(VERIFY_NONE);
    uint64_t d;

    l.holder_alive = true;
    cr_expect_eq(verify_on_lease(&l, 60000, &d), VA_HELD);
    cr_expect_eq(d, 1, "never a zero delay");
}

Test(verify, liveness_keys_expire_3s_after_the_last_refresh)
{
    cr_expect_eq(VERIFY_LIVE_REFRESH_MS, 1000);
    cr_expect_not(verify_live_expired(10000, 12999));
    cr_expect(verify_live_expired(10000, 13000));
    cr_expect_not(verify_live_expired(10000, 9000), "a clock behind");
}

/* ---- applying a result -------------------------------------------------- */

Test(verify, a_result_applies_only_to_its_own_live_lease)
{
    struct verify_lease a = lease("00112233445566778899aabbccddeeff", 2, 60000);
    struct verify_lease cur = a;

    cr_expect(verify_applies(&a, &cur, 59999));
    cr_expect_not(verify_applies(&a, &cur, 60000), "expired: dropped");
    cr_expect_not(verify_applies(&a, NULL, 1000),
                  "forgotten (DELETE), completed or released");
    cur.attempt = 3;
    cr_expect_not(verify_applies(&a, &cur, 1000), "taken over by attempt 3");
    cur = a;
    cur.expires_ms = 90000;
    cr_expect_not(verify_applies(&a, &cur, 1000),
                  "a new lease with the same attempt number (after DELETE)");
    cur = a;
    cur.holder[0] = 'f';
    cr_expect_not(verify_applies(&a, &cur, 1000), "another holder's lease");
}

/* ---- the deadline ------------------------------------------------------- */

Test(verify, deadline_is_attempts_times_after_plus_T_within_the_lease)
{
    struct sc_verify cfg = example();
    struct verify_params p;

    verify_params_set(&p, &cfg, 30000);
    cr_expect_eq(p.attempts, 3);
    cr_expect_eq(p.after_ms, 1000);
    cr_expect_eq(p.timeout_ms, 30000);
    cr_expect_eq(verify_budget_ms(&p, 60000), 60000, "the lease is shorter");
    cr_expect_eq(verify_budget_ms(&p, 120000), 93000, "3 x (1 s + 30 s)");
    cr_expect_eq(verify_budget_ms(&p, 0), 0);
    p = (struct verify_params){.attempts = 4000000000u, .after_ms = UINT64_MAX / 2,
                               .timeout_ms = UINT64_MAX / 2};
    cr_expect_eq(verify_budget_ms(&p, UINT64_MAX), UINT64_MAX, "saturates");
    p = (struct verify_params){.attempts = 2, .after_ms = 0, .timeout_ms = 0};
    cr_expect_eq(verify_budget_ms(&p, 5000), 0);
}

/* ---- a verification's life ---------------------------------------------- */

struct run {
    struct verify v;
    struct verify_params p;
    struct verify_lease l;
};

static void start(struct run *r, uint32_t attempts, uint64_t after,
                  uint64_t T, uint64_t lease_remaining, uint64_t now)
{
    r->p = (struct verify_params){attempts, after, T};
    r->l = lease("00112233445566778899aabbccddeeff", 1, 1767225600000ull);
    cr_assert_eq(verify_start(&r->v, &r->p, &r->l, lease_remaining, now),
                 VERIFY_PENDING);
}

static void expect_step(struct run *r, uint64_t now, enum verify_step_kind k,
                        uint64_t at)
{
    struct verify_step s = verify_next(&r->v, now);

    cr_expect_eq(s.kind, k, "at %llu: step %d, expected %d",
                 (unsigned long long)now, s.kind, k);
    cr_expect_eq(s.at_ms, at, "at %llu: at_ms %llu, expected %llu",
                 (unsigned long long)now, (unsigned long long)s.at_ms,
                 (unsigned long long)at);
}

Test(verify, three_failed_lookups_after_apart_then_failed)
{
    struct run r;

    start(&r, 3, 1000, 30000, 120000, 10000);
    cr_expect_eq(r.v.deadline_ms, 103000, "start + 3 x (1 s + 30 s)");
    cr_expect(verify_applies(&r.l, &r.v.lease, 10000), "it names its lease");
    expect_step(&r, 10000, VSTEP_WAIT, 11000);   /* `after` after the start */
    expect_step(&r, 10999, VSTEP_WAIT, 11000);
    expect_step(&r, 11000, VSTEP_LOOKUP, 41000); /* ends within T */
    expect_step(&r, 11001, VSTEP_BUSY, 41000);
    cr_expect_eq(verify_lookup_done(&r.v, VC_OTHER, 11500), VERIFY_PENDING);
    expect_step(&r, 11500, VSTEP_WAIT, 12500);   /* `after` after it ended */
    expect_step(&r, 12600, VSTEP_LOOKUP, 42600);
    cr_expect_eq(verify_lookup_done(&r.v, VC_OTHER, 42600), VERIFY_PENDING,
                 "a lookup given up at its end is a failed one");
    expect_step(&r, 43600, VSTEP_LOOKUP, 73600);
    cr_expect_eq(r.v.sent, 3);
    cr_expect_eq(verify_lookup_done(&r.v, VC_OTHER, 43700), VERIFY_FAILED);
    expect_step(&r, 50000, VSTEP_DONE, 0);
    cr_expect_eq(r.v.sent, 3, "never more than attempts");
    cr_expect_eq(verify_lookup_done(&r.v, VC_FOUND, 50000), VERIFY_FAILED,
                 "a late answer changes nothing");
}

Test(verify, the_first_found_or_absent_ends_it)
{
    struct run r;

    start(&r, 3, 1000, 30000, 60000, 0);
    expect_step(&r, 1000, VSTEP_LOOKUP, 31000);
    cr_expect_eq(verify_lookup_done(&r.v, VC_OTHER, 1200), VERIFY_PENDING);
    expect_step(&r, 2200, VSTEP_LOOKUP, 32200);
    cr_expect_eq(verify_lookup_done(&r.v, VC_FOUND, 2300), VERIFY_FOUND);
    expect_step(&r, 2300, VSTEP_DONE, 0);

    start(&r, 3, 1000, 30000, 60000, 0);
    expect_step(&r, 1000, VSTEP_LOOKUP, 31000);
    cr_expect_eq(verify_lookup_done(&r.v, VC_ABSENT, 1010), VERIFY_ABSENT);
    expect_step(&r, 1010, VSTEP_DONE, 0);
    cr_expect_eq(r.v.sent, 1);
}

/* D cut short by the lease: lookups end by the deadline, not T after their
 * start, and none is sent that could not go before it. */
Test(verify, a_short_lease_cuts_the_lookups)
{
    struct run r;

    start(&r, 3, 1000, 30000, 2500, 0);
    cr_expect_eq(r.v.deadline_ms, 2500);
    expect_step(&r, 1000, VSTEP_LOOKUP, 2500);
    cr_expect_eq(verify_lookup_done(&r.v, VC_OTHER, 1200), VERIFY_PENDING);
    expect_step(&r, 2200, VSTEP_LOOKUP, 2500);
    cr_expect_eq(verify_lookup_done(&r.v, VC_OTHER, 2500), VERIFY_FAILED,
                 "a third could only go after the deadline");
    cr_expect_eq(r.v.sent, 2);
}

Test(verify, a_lease_ending_before_the_first_lookup_fails_at_once)
{
    struct verify v;
    struct verify_params p = {3, 1000, 30000};
    struct verify_lease l = lease("aa", 1, 5000);

    cr_expect_eq(verify_start(&v, &p, &l, 1000, 4000), VERIFY_FAILED,
                 "the lookup would go when the lease ends");
    cr_expect_eq(verify_next(&v, 4000).kind, VSTEP_DONE);
    cr_expect_eq(verify_start(&v, &p, &l, 1001, 4000), VERIFY_PENDING);
}

Test(verify, after_zero_asks_at_once)
{
    struct run r;

    start(&r, 2, 0, 500, 60000, 100);
    expect_step(&r, 100, VSTEP_LOOKUP, 600);
    cr_expect_eq(verify_lookup_done(&r.v, VC_OTHER, 600), VERIFY_PENDING);
    expect_step(&r, 600, VSTEP_LOOKUP, 1100);
    cr_expect_eq(verify_lookup_done(&r.v, VC_OTHER, 700), VERIFY_FAILED);
}

Test(verify, a_late_caller_fails_at_the_deadline)
{
    struct run r;

    start(&r, 3, 1000, 1000, 60000, 0);
    expect_step(&r, 6000, VSTEP_DONE, 0);
    cr_expect_eq(r.v.state, VERIFY_FAILED);
    cr_expect_eq(r.v.sent, 0);
}

Test(verify, done_without_a_lookup_out_changes_nothing)
{
    struct run r;

    start(&r, 3, 1000, 1000, 60000, 0);
    cr_expect_eq(verify_lookup_done(&r.v, VC_FOUND, 10), VERIFY_PENDING);
    expect_step(&r, 10, VSTEP_WAIT, 1000);
}

/* Any parameters: at most `attempts` lookups, the first `after` after the
 * start, each further one `after` after the previous ended, each ending
 * within T and by the deadline, and the deadline D after the start. */
Test(verify, schedule_invariants_over_random_runs)
{
    unsigned seed = 24;

    for (int run = 0; run < 3000; run++) {
        struct run r;
        uint32_t attempts = 1 + (uint32_t)(rand_r(&seed) % 6);
        uint64_t after = (uint64_t)(rand_r(&seed) % 3000);
        uint64_t T = 1 + (uint64_t)(rand_r(&seed) % 5000);
        uint64_t lease_rem = (uint64_t)(rand_r(&seed) % 40000);
        uint64_t t0 = (uint64_t)(rand_r(&seed) % 100000), now = t0, prev_end = 0;
        struct verify_params p = {attempts, after, T};
        struct verify_lease l = lease("bb", 1, 1);
        uint32_t sent = 0;

        if (verify_start(&r.v, &p, &l, lease_rem, t0) != VERIFY_PENDING) {
            cr_assert(t0 + after >= t0 + verify_budget_ms(&p, lease_rem));
            continue;
        }
        cr_assert_eq(r.v.deadline_ms, t0 + verify_budget_ms(&p, lease_rem));
        for (int guard = 0; guard < 100; guard++) {
            struct verify_step s = verify_next(&r.v, now);
            uint64_t took;

            if (s.kind == VSTEP_DONE)
                break;
            if (s.kind == VSTEP_WAIT) {
                cr_assert_gt(s.at_ms, now);
                now = s.at_ms;
                continue;
            }
            cr_assert_eq(s.kind, VSTEP_LOOKUP);
            sent++;
            cr_assert_geq(now, sent == 1 ? t0 + after : prev_end + after);
            cr_assert_leq(s.at_ms, now + T, "within T");
            cr_assert_leq(s.at_ms, r.v.deadline_ms, "by the deadline");
            took = (uint64_t)(rand_r(&seed) % (s.at_ms - now + 1));
            now += took;
            prev_end = now;
            /* Mostly failures, so that the whole schedule is walked. */
            verify_lookup_done(&r.v, rand_r(&seed) % 10 ? VC_OTHER : VC_FOUND, now);
        }
        cr_assert_neq(r.v.state, VERIFY_PENDING, "run %d ended", run);
        cr_assert_leq(sent, attempts);
        cr_assert(r.v.state != VERIFY_FAILED || sent == attempts ||
                      prev_end + after >= r.v.deadline_ms || sent == 0,
                  "failed early with time and attempts left (run %d)", run);
    }
}

/* ---- what workers are told ---------------------------------------------- */

Test(verify, requeue_delay_is_the_larger_of_D_and_the_backoff)
{
    struct run r;

    start(&r, 3, 1000, 30000, 60000, 5000);
    cr_expect_eq(verify_requeue_delay_ms(r.v.deadline_ms, 5000, 2000), 60000,
                 "D, not the backoff");
    start(&r, 1, 1000, 2000, 60000, 5000);
    cr_expect_eq(verify_requeue_delay_ms(r.v.deadline_ms, 5000, 2000), 3000,
                 "D = 1 x (1 s + 2 s)");
    cr_expect_eq(verify_requeue_delay_ms(r.v.deadline_ms, 5000, 16000), 16000,
                 "the backoff when longer");
    cr_expect_eq(verify_requeue_delay_ms(5000, 5000, 0), 1, "at least 1 ms");
}

Test(verify, lease_held_meanwhile_gets_what_remains_of_D)
{
    struct run r;

    start(&r, 1, 1000, 2000, 60000, 5000);
    cr_expect_eq(verify_held_delay_ms(r.v.deadline_ms, 5000), 3000);
    cr_expect_eq(verify_held_delay_ms(r.v.deadline_ms, 7500), 500);
    cr_expect_eq(verify_held_delay_ms(r.v.deadline_ms, 8000), 1);
    cr_expect_eq(verify_held_delay_ms(r.v.deadline_ms, 9000), 1);
}
