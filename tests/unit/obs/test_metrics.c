/* obs/metrics.c: sluice_verifications_total{policy, result} (docs/contract.md
 * §8, §11): declared, listed at zero for the policies that verify, counted
 * through the slot metrics_verification_slot names. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "obs/metrics.h"

static const char yaml[] =
    "upstreams: {u: {url: http://127.0.0.1:9}}\n"
    "policies:\n"
    "  checked: {idempotency: {verify: {path: \"/o?ref={key}\"}}}\n"
    "  keyed: {idempotency: {}}\n"
    "  plain: {rate: 1/s}\n"
    "routes: [{prefix: /, upstream: u, policy: checked}]\n";

static struct metrics m;
static struct metrics_ids ids;
static struct sc_config *cfg;

static void setup(void)
{
    struct sc_errors errs = {0};

    char first[512] = "";
    int rc = config_load_string("t.yaml", yaml, strlen(yaml), &cfg, &errs);

    if (errs.n)
        sc_error_format(&errs.v[0], first, sizeof first);
    sc_errors_free(&errs);
    cr_assert_eq(rc, 0, "%s", first);
    cr_assert_eq(metrics_init(&m, 2), 0);
    cr_assert_eq(metrics_ids_build(&m, cfg, &ids), 0);
}

static void teardown(void)
{
    metrics_ids_free(&ids);
    metrics_free(&m);
    config_free(cfg);
}

TestSuite(metrics, .init = setup, .fini = teardown);

static bool has_line(const char *text, const char *line)
{
    size_t n = strlen(line);

    for (const char *p = text; (p = strstr(p, line)); p += n)
        if ((p == text || p[-1] == '\n') && p[n] == '\n')
            return true;
    return false;
}

Test(metrics, verifications_are_declared_and_listed_at_zero)
{
    char *text = metrics_render(&m, NULL);

    cr_assert_not_null(text);
    cr_expect(has_line(text, "# TYPE sluice_verifications_total counter"));
    cr_expect_not_null(strstr(text, "# HELP sluice_verifications_total "));
    for (const char *const *r = (const char *const[]){"found", "absent", "failed", NULL};
         *r; r++) {
        char line[128];

        snprintf(line, sizeof line,
                 "sluice_verifications_total{policy=\"checked\",result=\"%s\"} 0", *r);
        cr_expect(has_line(text, line), "%s", line);
    }
    cr_expect_null(strstr(text, "sluice_verifications_total{policy=\"keyed\""),
                   "a policy without verify never counts one");
    cr_expect_null(strstr(text, "sluice_verifications_total{policy=\"plain\""));
    cr_expect_null(strstr(text, "sluice_verifications_total{policy=\"default\""));
    cr_expect_null(strstr(text, "result=\"pending\""), "only ended ones count");
    free(text);
}

Test(metrics, verification_slots_count_by_policy_and_result)
{
    uint32_t found = metrics_verification_slot(&ids, 0, VERIFY_FOUND);
    uint32_t failed = metrics_verification_slot(&ids, 0, VERIFY_FAILED);
    char *text;

    cr_assert_neq(found, UINT32_MAX);
    cr_expect_neq(found, failed);
    cr_expect_neq(metrics_verification_slot(&ids, 0, VERIFY_ABSENT), found);
    cr_expect_eq(metrics_verification_slot(&ids, 0, VERIFY_PENDING), UINT32_MAX);
    cr_expect_eq(metrics_verification_slot(&ids, 0, VERIFY_NONE), UINT32_MAX);
    cr_expect_eq(metrics_verification_slot(&ids, 3, VERIFY_FOUND), UINT32_MAX,
                 "no such policy");
    metrics_add(&m.shards[0], found, 2);
    metrics_add(&m.shards[1], found, 1);
    metrics_add(&m.shards[1], failed, 1);
    metrics_add(&m.shards[0], metrics_verification_slot(&ids, 1, VERIFY_ABSENT), 1);
    text = metrics_render(&m, NULL);
    cr_expect(has_line(text, "sluice_verifications_total{policy=\"checked\",result=\"found\"} 3"),
              "shards summed");
    cr_expect(has_line(text, "sluice_verifications_total{policy=\"checked\",result=\"failed\"} 1"));
    cr_expect(has_line(text, "sluice_verifications_total{policy=\"checked\",result=\"absent\"} 0"));
    cr_expect(has_line(text, "sluice_verifications_total{policy=\"keyed\",result=\"absent\"} 1"),
              "a counted series shows, listed or not");
    free(text);
}

/* A reload builds the ids again: the same series, so counts survive. */
Test(metrics, a_reload_keeps_the_counts)
{
    struct metrics_ids again;
    uint32_t slot = metrics_verification_slot(&ids, 0, VERIFY_ABSENT);

    metrics_add(&m.shards[0], slot, 4);
    cr_assert_eq(metrics_ids_build(&m, cfg, &again), 0);
    cr_expect_eq(metrics_verification_slot(&again, 0, VERIFY_ABSENT), slot);
    cr_expect_eq(metrics_sum(&m, slot), 4);
    metrics_ids_free(&again);
}
