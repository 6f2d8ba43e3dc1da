/* Data-driven invalid configs: each tests/config/invalid/NAME/ holds an
 * input.yaml and, in `error`, the exact first error the loader must report
 * for it, as "input.yaml:LINE:COL: text". Adding a case is adding a
 * directory. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "support/testutil.h"

#define CASES SLUICE_SOURCE_DIR "/tests/config/invalid"

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The case directory names, sorted so failures read in a stable order. */
static char **list_cases(size_t *n)
{
    DIR *d = opendir(CASES);
    struct dirent *e;
    char **names = NULL;

    cr_assert_not_null(d, "cannot open %s", CASES);
    *n = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        names = realloc(names, (*n + 1) * sizeof *names);
        cr_assert_not_null(names);
        names[(*n)++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, *n, sizeof *names, by_name);
    return names;
}

static char *case_file(const char *name, const char *file, size_t *len)
{
    char path[1024];

    snprintf(path, sizeof path, "%s/%s/%s", CASES, name, file);
    return tu_read_file(path, len);
}

/* Loads one case; true when its first error is the expected one. */
static bool check_case(const char *name)
{
    struct sc_errors errs = {0};
    struct sc_config *cfg = NULL;
    char *input, *expected, got[1024] = "(no error)";
    size_t len;
    bool ok;
    int rc;

    input = case_file(name, "input.yaml", &len);
    expected = case_file(name, "error", NULL);
    cr_assert_not_null(input, "%s: no input.yaml", name);
    cr_assert_not_null(expected, "%s: no error file", name);
    expected[strcspn(expected, "\r\n")] = '\0';

    rc = config_load_string("input.yaml", input, len, &cfg, &errs);
    if (errs.n)
        sc_error_format(&errs.v[0], got, sizeof got);
    ok = rc < 0 && cfg == NULL && strcmp(got, expected) == 0;
    cr_expect(rc < 0, "%s: loaded, but must be refused", name);
    cr_expect_null(cfg, "%s: *out must be NULL on failure", name);
    cr_expect_str_eq(got, expected, "%s: first error differs", name);
    config_free(cfg);
    sc_errors_free(&errs);
    free(input);
    free(expected);
    return ok;
}

Test(config_invalid, every_case_reports_its_first_error)
{
    size_t n, i, failed = 0;
    char **names;

    /* the env-unset case relies on this variable being unset */
    unsetenv("SLUICE_TEST_SURELY_UNSET_VARIABLE_7F3A");
    names = list_cases(&n);
    cr_expect_geq(n, 30, "only %zu invalid-config cases", n);
    for (i = 0; i < n; i++) {
        if (!check_case(names[i]))
            failed++;
        free(names[i]);
    }
    free(names);
    cr_expect_eq(failed, 0, "%zu of %zu cases failed", failed, n);
}
