/* The YAML config loader (config/config.h) on arbitrary bytes: every
 * input either loads, and then renders as JSON, or comes back as at least
 * one error message; never a crash, a hang or a leak. */
#include <stdlib.h>

#include "config/config.h"
#include "fuzz_check.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    /* The seeds' "${PARTNER_TOKEN}" then loads instead of always failing. */
    setenv("PARTNER_TOKEN", "fuzz-token", 0);
    return 0;
}

static void check_loaded(const struct sc_config *cfg)
{
    char *json = config_to_json(cfg);

    FUZZ_CHECK(json && json[0] == '{', "config_to_json: %s",
               json ? json : "NULL");
    free(json);
    for (size_t i = 0; i < cfg->n_upstreams; i++)
        FUZZ_CHECK(config_upstream(cfg, cfg->upstreams[i].name),
                   "upstream %s not found by name", cfg->upstreams[i].name);
    for (size_t i = 0; i < cfg->n_routes; i++)
        FUZZ_CHECK(cfg->routes[i].upstream < cfg->n_upstreams &&
                       cfg->routes[i].policy < (long)cfg->n_policies,
                   "route %zu points outside the config", i);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct sc_errors errs = {0};
    struct sc_config *cfg = NULL;
    int rc = config_load_string("fuzz.yaml", (const char *)data, size, &cfg,
                                &errs);

    if (rc == 0) {
        FUZZ_CHECK(cfg && errs.n == 0, "success with %zu errors", errs.n);
        check_loaded(cfg);
    } else {
        FUZZ_CHECK(!cfg, "failure %d but a config", rc);
        FUZZ_CHECK(errs.n > 0, "failure %d without a message", rc);
        for (size_t i = 0; i < errs.n; i++)
            FUZZ_CHECK(errs.v[i].text[0], "error %zu is empty", i);
    }
    config_free(cfg);
    sc_errors_free(&errs);
    return 0;
}
