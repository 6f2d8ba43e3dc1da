/* obs/log.c: the line of a verification's lookup (docs/contract.md §11), read
 * back from stderr as JSON. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <jansson.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "obs/log.h"

/* Runs fn with stderr sent to a file; returns what it wrote (owned). */
static char *captured(void (*fn)(const struct lookup_entry *),
                      const struct lookup_entry *e)
{
    char path[] = "/tmp/sluice-test-log-XXXXXX", *text;
    int fd = mkstemp(path), saved = dup(STDERR_FILENO);
    FILE *f;
    size_t cap = 0;

    cr_assert(fd >= 0 && saved >= 0);
    cr_assert_eq(dup2(fd, STDERR_FILENO), STDERR_FILENO);
    fn(e);
    cr_assert_eq(dup2(saved, STDERR_FILENO), STDERR_FILENO);
    close(saved);
    close(fd);
    f = fopen(path, "r");
    cr_assert_not_null(f);
    text = NULL;
    cr_assert(getdelim(&text, &cap, '\0', f) > 0);
    fclose(f);
    unlink(path);
    return text;
}

static json_t *one_line(const char *text)
{
    json_error_t jerr;
    json_t *j;

    cr_assert_eq(strchr(text, '\n'), text + strlen(text) - 1, "one line: %s", text);
    j = json_loads(text, 0, &jerr);
    cr_assert_not_null(j, "%s: %s", jerr.text, text);
    return j;
}

static const char *str(json_t *j, const char *k)
{
    return json_string_value(json_object_get(j, k));
}

static void hash16(const char *key, char out[17])
{
    unsigned char md[SHA256_DIGEST_LENGTH];

    SHA256((const unsigned char *)key, strlen(key), md);
    for (int i = 0; i < 8; i++)
        sprintf(out + 2 * i, "%02x", md[i]);
}

#define KEY "course-1842:roster-sync:2026-09-03"

Test(log, a_lookup_line_has_its_fields_and_never_the_key)
{
    struct lookup_entry e = {
        .request_id = "5f1d0c9e2b7a4c3d8e6f0a1b2c3d4e5f", .policy = "partner-writes",
        .upstream = "partner", .method = "GET", .base_path = "/base",
        .path = "/v1/orders/{key}?client_ref={key}", .upstream_status = 200,
        .result = "found", .permit_wait_ms = 1.25, .upstream_ms = 12.5, .key = KEY};
    char *text = captured(log_lookup, &e), want[17];
    json_t *j = one_line(text);
    const char *order[] = {"time", "type", "verify", "request_id", "policy", "upstream",
                           "method", "path", "upstream_status", "result",
                           "permit_wait_ms", "upstream_ms", "key_hash"};
    const char *p = text;

    cr_expect_str_eq(str(j, "type"), "lookup");
    cr_expect(json_is_true(json_object_get(j, "verify")));
    cr_expect_str_eq(str(j, "request_id"), "5f1d0c9e2b7a4c3d8e6f0a1b2c3d4e5f");
    cr_expect_str_eq(str(j, "policy"), "partner-writes");
    cr_expect_str_eq(str(j, "upstream"), "partner");
    cr_expect_str_eq(str(j, "method"), "GET");
    cr_expect_str_eq(str(j, "path"), "/base/v1/orders/{key}",
                     "configured, without the query");
    cr_expect_eq(json_integer_value(json_object_get(j, "upstream_status")), 200);
    cr_expect_str_eq(str(j, "result"), "found");
    cr_expect_float_eq(json_number_value(json_object_get(j, "permit_wait_ms")), 1.25, 1e-9);
    cr_expect_float_eq(json_number_value(json_object_get(j, "upstream_ms")), 12.5, 1e-9);
    hash16(KEY, want);
    cr_expect_str_eq(str(j, "key_hash"), want);
    cr_expect_eq(json_object_size(j), sizeof order / sizeof *order, "%s", text);
    for (size_t i = 0; i < sizeof order / sizeof *order; i++) {
        char field[64];

        snprintf(field, sizeof field, "\"%s\":", order[i]);
        p = strstr(p, field);
        cr_expect_not_null(p, "%s missing or out of order: %s", order[i], text);
        if (!p)
            break;
    }
    cr_expect_null(strstr(text, "course-1842"), "the key: %s", text);
    cr_expect_null(strstr(text, "client_ref"), "the query: %s", text);
    json_decref(j);
    free(text);
}

Test(log, a_lookup_without_a_response_logs_null)
{
    struct lookup_entry e = {
        .policy = "p", .upstream = "u", .method = "HEAD", .base_path = "",
        .path = "/o?ref={key}", .upstream_status = 0, .result = "other", .key = NULL};
    char *text = captured(log_lookup, &e);
    json_t *j = one_line(text);

    cr_expect(json_is_null(json_object_get(j, "upstream_status")), "%s", text);
    cr_expect_str_eq(str(j, "path"), "/o");
    cr_expect_str_eq(str(j, "method"), "HEAD");
    cr_expect_str_eq(str(j, "result"), "other");
    cr_expect_null(json_object_get(j, "request_id"), "none given");
    cr_expect_null(json_object_get(j, "key_hash"), "no key");
    cr_expect_eq(json_number_value(json_object_get(j, "upstream_ms")), 0);
    json_decref(j);
    free(text);
}

/* Names come from the config, which allows what JSON must escape. */
Test(log, a_lookup_line_escapes_and_stays_bounded)
{
    static char path[4000];
    struct lookup_entry e = {
        .policy = "a\"b", .upstream = "u\\v", .method = "GET", .base_path = "/b",
        .path = path, .upstream_status = 503, .result = "other", .key = "k"};
    char *text;
    json_t *j;

    memset(path, 'x', sizeof path - 1);
    path[0] = '/';
    text = captured(log_lookup, &e);
    j = one_line(text);
    cr_expect_str_eq(str(j, "policy"), "a\"b");
    cr_expect_str_eq(str(j, "upstream"), "u\\v");
    cr_expect_lt(strlen(str(j, "path")), 1024, "truncated, still one JSON line");
    cr_expect_str_eq(str(j, "result"), "other");
    json_decref(j);
    free(text);
}
