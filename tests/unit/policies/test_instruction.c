/* proxy/instruction.c: requeue and dead-letter instructions (docs/contract.md
 * §4): the status of every reason, delay_seconds' rounding, and JSON bodies
 * that carry exactly the contract's fields. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "policies/instruction.h"
#include "policies/problem.h"

/* Builds, parses and checks the body's basic shape; the caller decrefs. */
static json_t *body_of(const struct instruction *in)
{
    size_t len = 0;
    char *body = instruction_json(in, &len);
    json_error_t err;
    json_t *j;

    cr_assert_not_null(body);
    cr_assert_eq(len, strlen(body), "*len must be the body's length");
    j = json_loadb(body, len, JSON_REJECT_DUPLICATES, &err);
    cr_assert_not_null(j, "invalid JSON (%s): %s", err.text, body);
    cr_assert(json_is_object(j));
    free(body);
    return j;
}

/* The object has exactly these members (a NULL-terminated list). */
static void expect_members(json_t *j, const char *const *names)
{
    size_t n = 0;

    for (; names[n]; n++)
        cr_expect_not_null(json_object_get(j, names[n]), "member %s missing", names[n]);
    cr_expect_eq(json_object_size(j), n, "%zu members, want %zu: %s", json_object_size(j), n,
                 json_dumps(j, JSON_COMPACT));
}

static json_int_t int_of(json_t *j, const char *name)
{
    json_t *v = json_object_get(j, name);

    cr_assert(json_is_integer(v), "%s must be an integer", name);
    return json_integer_value(v);
}

static const char *str_of(json_t *j, const char *name)
{
    json_t *v = json_object_get(j, name);

    cr_assert(json_is_string(v), "%s must be a string", name);
    return json_string_value(v);
}

/* ---- status --------------------------------------------------------------- */

Test(instruction, status_of_every_reason)
{
    for (int r = 0; r < R__COUNT; r++) {
        int want = 429;

        switch ((enum reason)r) {
        case R_LEASE_HELD:
            want = 409;
            break;
        case R_UPSTREAM_5XX:
        case R_CONNECT_ERROR:
        case R_CONNECTION_LOST:
        case R_TIMEOUT:
        case R_STORE_UNAVAILABLE:
            want = 503;
            break;
        default:
            break;
        }
        cr_expect_eq(instruction_status((enum reason)r), want, "reason %s",
                     reason_name((enum reason)r));
    }
    /* spelled out for the ones the contract names */
    cr_expect_eq(instruction_status(R_RATE_LIMITED), 429);
    cr_expect_eq(instruction_status(R_UPSTREAM_COOLDOWN), 429);
    cr_expect_eq(instruction_status(R_UPSTREAM_429), 429);
    cr_expect_eq(instruction_status(R_DELAY_EXCEEDS_MAX), 429);
    cr_expect_eq(instruction_status(R_LEASE_HELD), 409);
    cr_expect_eq(instruction_status(R_TIMEOUT), 503);
}

/* ---- delay_seconds ---------------------------------------------------------- */

Test(instruction, delay_seconds_rounds_up_to_at_least_1)
{
    cr_expect_eq(instruction_delay_seconds(0), 1);
    cr_expect_eq(instruction_delay_seconds(1), 1);
    cr_expect_eq(instruction_delay_seconds(999), 1);
    cr_expect_eq(instruction_delay_seconds(1000), 1);
    cr_expect_eq(instruction_delay_seconds(1001), 2);
    cr_expect_eq(instruction_delay_seconds(1999), 2);
    cr_expect_eq(instruction_delay_seconds(2000), 2);
    cr_expect_eq(instruction_delay_seconds(16250), 17);
    cr_expect_eq(instruction_delay_seconds(604800000), 604800);    /* max_delay */
    cr_expect_eq(instruction_delay_seconds(604799001), 604800);
}

/* ---- bodies ----------------------------------------------------------------- */

Test(instruction, requeue_body_is_the_spec_example)
{
    static const char spec[] =
        "{\"action\": \"requeue\", \"reason\": \"upstream_429\", \"delay_seconds\": 17, "
        "\"delay_ms\": 16250, \"attempt\": 3, \"max_attempts\": 8, "
        "\"idempotency_key\": \"course-1842:roster-sync:2026-09-03\", \"upstream_status\": 429}";
    struct instruction in = {
        .outcome = OUT_REQUEUE, .reason = R_UPSTREAM_429, .delay_ms = 16250,
        .attempt = 3, .max_attempts = 8, .key = "course-1842:roster-sync:2026-09-03",
        .upstream_status = 429,
    };
    json_t *j = body_of(&in), *want = json_loads(spec, 0, NULL);

    cr_assert_not_null(want);
    cr_expect(json_equal(j, want), "got %s", json_dumps(j, JSON_COMPACT));
    json_decref(want);
    json_decref(j);
}

Test(instruction, requeue_without_key_or_status)
{
    static const char *const members[] = {"action", "reason", "delay_seconds", "delay_ms",
                                          "attempt", "max_attempts", NULL};
    struct instruction in = {
        .outcome = OUT_REQUEUE, .reason = R_RATE_LIMITED, .delay_ms = 1001,
        .attempt = 0, .max_attempts = 8,
    };
    json_t *j = body_of(&in);

    expect_members(j, members);
    cr_expect_str_eq(str_of(j, "action"), "requeue");
    cr_expect_str_eq(str_of(j, "reason"), "rate_limited");
    cr_expect_eq(int_of(j, "delay_seconds"), 2);
    cr_expect_eq(int_of(j, "delay_ms"), 1001);
    cr_expect_eq(int_of(j, "attempt"), 0);
    cr_expect_eq(int_of(j, "max_attempts"), 8);
    json_decref(j);
}

Test(instruction, requeue_delay_is_at_least_1ms)
{
    struct instruction in = {.outcome = OUT_REQUEUE, .reason = R_UPSTREAM_5XX,
                             .delay_ms = 0, .attempt = 1, .max_attempts = 3,
                             .upstream_status = 503};
    json_t *j = body_of(&in);

    cr_expect_eq(int_of(j, "delay_ms"), 1);
    cr_expect_eq(int_of(j, "delay_seconds"), 1);
    cr_expect_eq(int_of(j, "upstream_status"), 503);
    json_decref(j);

    in.delay_ms = 604800000; /* max_delay: no overflow, exact */
    j = body_of(&in);
    cr_expect_eq(int_of(j, "delay_ms"), 604800000);
    cr_expect_eq(int_of(j, "delay_seconds"), 604800);
    json_decref(j);
}

Test(instruction, dead_letter_has_no_delay)
{
    static const char *const members[] = {"action", "reason", "attempt", "max_attempts",
                                          "idempotency_key", "upstream_status", NULL};
    static const char *const bare[] = {"action", "reason", "attempt", "max_attempts", NULL};
    struct instruction in = {
        .outcome = OUT_DEAD_LETTER, .reason = R_UPSTREAM_5XX, .delay_ms = 5000,
        .attempt = 8, .max_attempts = 8, .key = "k-1", .upstream_status = 502,
    };
    json_t *j = body_of(&in);

    expect_members(j, members);
    cr_expect_str_eq(str_of(j, "action"), "dead_letter");
    cr_expect_str_eq(str_of(j, "reason"), "upstream_5xx");
    cr_expect_null(json_object_get(j, "delay_seconds"));
    cr_expect_null(json_object_get(j, "delay_ms"));
    cr_expect_eq(int_of(j, "attempt"), 8);
    cr_expect_eq(int_of(j, "max_attempts"), 8);
    cr_expect_str_eq(str_of(j, "idempotency_key"), "k-1");
    cr_expect_eq(int_of(j, "upstream_status"), 502);
    json_decref(j);

    in.reason = R_DELAY_EXCEEDS_MAX;
    in.attempt = 2;
    in.key = NULL;
    in.upstream_status = 0;
    j = body_of(&in);
    expect_members(j, bare);
    cr_expect_str_eq(str_of(j, "reason"), "delay_exceeds_max");
    cr_expect_eq(int_of(j, "attempt"), 2);
    json_decref(j);
}

Test(instruction, upstream_status_only_when_received)
{
    struct instruction in = {.outcome = OUT_REQUEUE, .reason = R_CONNECT_ERROR,
                             .delay_ms = 2000, .attempt = 1, .max_attempts = 8};
    json_t *j = body_of(&in);

    cr_expect_null(json_object_get(j, "upstream_status"));
    cr_expect_null(json_object_get(j, "idempotency_key"));
    json_decref(j);
    in.reason = R_UPSTREAM_429;
    in.upstream_status = 429;
    j = body_of(&in);
    cr_expect_eq(int_of(j, "upstream_status"), 429);
    json_decref(j);
}

Test(instruction, key_is_escaped)
{
    static const char *const keys[] = {
        "a\"b",
        "back\\slash",
        "\"\\\"\\",
        "tab\there\nnew\rline\x01\x1f\x7f",
        "caf\xc3\xa9 \xe2\x9c\x93",          /* UTF-8 passes through */
        "",
        "}\",\"action\":\"ok",                /* no injection */
    };

    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        struct instruction in = {.outcome = i % 2 ? OUT_DEAD_LETTER : OUT_REQUEUE,
                                 .reason = R_LEASE_HELD, .delay_ms = 1500,
                                 .attempt = 2, .max_attempts = 8, .key = keys[i]};
        json_t *j = body_of(&in);

        cr_expect_str_eq(str_of(j, "idempotency_key"), keys[i], "key %zu", i);
        cr_expect_str_eq(str_of(j, "action"), i % 2 ? "dead_letter" : "requeue");
        cr_expect_eq(json_object_size(j), i % 2 ? 5 : 7, "key %zu", i);
        json_decref(j);
    }
}

Test(instruction, long_keys_of_escapes_fit)
{
    static const char fill[] = {'"', '\\', '\x01', 'x'};

    for (size_t f = 0; f < sizeof fill; f++) {
        size_t n = 5000;
        char *key = malloc(n + 1);
        struct instruction in = {.outcome = OUT_REQUEUE, .reason = R_UPSTREAM_429,
                                 .delay_ms = 16250, .attempt = 4294967295u,
                                 .max_attempts = 4294967295u, .key = key,
                                 .upstream_status = 429};
        json_t *j;

        cr_assert_not_null(key);
        memset(key, fill[f], n);
        key[n] = '\0';
        j = body_of(&in);
        cr_expect_str_eq(str_of(j, "idempotency_key"), key, "fill %zu truncated", f);
        cr_expect_eq(int_of(j, "attempt"), 4294967295ll);
        cr_expect_eq(int_of(j, "max_attempts"), 4294967295ll);
        cr_expect_eq(int_of(j, "upstream_status"), 429);
        json_decref(j);
        free(key);
    }
}

Test(instruction, every_reason_names_itself)
{
    for (int r = R_UPSTREAM_429; r < R__COUNT; r++) {
        struct instruction in = {.outcome = OUT_REQUEUE, .reason = (enum reason)r,
                                 .delay_ms = 1, .attempt = 1, .max_attempts = 2};
        json_t *j = body_of(&in);

        cr_expect_str_eq(str_of(j, "reason"), reason_name((enum reason)r));
        json_decref(j);
    }
}

Test(instruction, len_may_be_null)
{
    struct instruction in = {.outcome = OUT_DEAD_LETTER, .reason = R_TIMEOUT,
                             .attempt = 3, .max_attempts = 3};
    char *body = instruction_json(&in, NULL);

    cr_assert_not_null(body);
    cr_expect_str_eq(body, "{\"action\":\"dead_letter\",\"reason\":\"timeout\","
                           "\"attempt\":3,\"max_attempts\":3}");
    free(body);
}
