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
