/* problem+json bodies, outcome and reason names, and JSON escaping. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "util/json_escape.h"
#include "policies/problem.h"

Test(problem, body_is_valid_rfc9457_json)
{
    size_t len;
    char *body = problem_json(404, R_NO_ROUTE, "no route for GET /x\"y\n\x01", &len);
    json_error_t err;
    json_t *j = json_loadb(body, len, 0, &err);

    cr_assert_not_null(j, "invalid JSON: %s: %s", err.text, body);
    cr_expect_str_eq(json_string_value(json_object_get(j, "type")), "about:blank");
    cr_expect_str_eq(json_string_value(json_object_get(j, "title")), "Not Found");
    cr_expect_eq(json_integer_value(json_object_get(j, "status")), 404);
    cr_expect_str_eq(json_string_value(json_object_get(j, "reason")), "no_route");
    cr_expect_str_eq(json_string_value(json_object_get(j, "detail")),
                     "no route for GET /x\"y\n\x01");
    json_decref(j);
    free(body);
}

Test(problem, names_are_the_contract)
{
    cr_expect_str_eq(outcome_name(OUT_OK), "ok");
    cr_expect_str_eq(outcome_name(OUT_PERMANENT_ERROR), "permanent_error");
    cr_expect_str_eq(outcome_name(OUT_REPLAYED), "replayed");
    cr_expect_str_eq(outcome_name(OUT_REQUEUE), "requeue");
    cr_expect_str_eq(outcome_name(OUT_DEAD_LETTER), "dead_letter");
    cr_expect_str_eq(outcome_name(OUT_REJECTED), "rejected");
    cr_expect_str_eq(reason_name(R_CONNECT_ERROR), "connect_error");
    cr_expect_str_eq(reason_name(R_CONNECTION_LOST), "connection_lost");
    cr_expect_str_eq(reason_name(R_TIMEOUT), "timeout");
    cr_expect_str_eq(reason_name(R__COUNT), "unknown");
}

Test(problem, json_escape_is_bounded)
{
    char buf[16];
    size_t pos = 0;

    json_escape_append(buf, sizeof buf, &pos, "\"\"\"\"\"\"\"\"\"\"\"\"", 12);
    cr_expect_lt(pos, sizeof buf);
    cr_expect_eq(buf[pos], '\0');
}

/* The pairs /metrics lists at zero: every pair the contract names, and none
 * that sluice never answers (a zero series that can never move is noise). */
Test(problem, known_outcome_reason_pairs)
{
    static const struct {
        enum outcome o;
        enum reason r;
    } yes[] = {
        {OUT_OK, R_NONE}, {OUT_REPLAYED, R_NONE}, {OUT_PERMANENT_ERROR, R_NONE},
        {OUT_PERMANENT_ERROR, R_TIMEOUT}, {OUT_REQUEUE, R_UPSTREAM_429},
        {OUT_REQUEUE, R_RATE_LIMITED}, {OUT_REQUEUE, R_LEASE_HELD},
        {OUT_REQUEUE, R_STORE_UNAVAILABLE}, {OUT_DEAD_LETTER, R_UPSTREAM_5XX},
        {OUT_DEAD_LETTER, R_DELAY_EXCEEDS_MAX}, {OUT_REJECTED, R_NO_ROUTE},
        {OUT_REJECTED, R_TIMEOUT}, {OUT_REJECTED, R_INTERNAL}, {OUT_REJECTED, R_KEY_REUSED},
        {OUT_ABANDONED, R_CLIENT_CLOSED},
    }, no[] = {
        {OUT_OK, R_UPSTREAM_429}, {OUT_REQUEUE, R_NONE}, {OUT_DEAD_LETTER, R_LEASE_HELD},
        {OUT_REJECTED, R_NONE}, {OUT_ABANDONED, R_NONE}, {OUT_REPLAYED, R_TIMEOUT},
        {OUT__COUNT, R_NONE}, {OUT_OK, R__COUNT},
    };
    int every_outcome[OUT__COUNT] = {0};

    for (size_t i = 0; i < sizeof yes / sizeof *yes; i++)
        cr_expect(outcome_reason_known(yes[i].o, yes[i].r), "%s/%s",
                  outcome_name(yes[i].o), reason_name(yes[i].r));
    for (size_t i = 0; i < sizeof no / sizeof *no; i++)
        cr_expect(!outcome_reason_known(no[i].o, no[i].r), "%s/%s",
                  outcome_name(no[i].o), reason_name(no[i].r));
    /* Every outcome has at least one reason. */
    for (int o = 0; o < OUT__COUNT; o++)
        for (int r = 0; r < R__COUNT; r++)
            every_outcome[o] += outcome_reason_known(o, r);
    for (int o = 0; o < OUT__COUNT; o++)
        cr_expect_gt(every_outcome[o], 0, "%s", outcome_name(o));
}
