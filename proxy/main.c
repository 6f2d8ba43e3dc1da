/* sluice's command line (docs/contract.md §1). The only place that prints to
 * stdout or decides the exit status. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef SLUICE_FAILALLOC
#include <event2/event.h>
#include <jansson.h>
#endif

#include "config/config.h"
#include "proxy/app.h"
#include "proxy/version.h"
#include "obs/log.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: sluice [-c FILE]             run (FILE: $SLUICE_CONFIG, then ./sidecar.yaml)\n"
            "       sluice --check-config FILE   validate FILE; errors as FILE:LINE:COL: message\n"
            "       sluice --version | --help\n");
}

/* One line per option; the details are in the documents it names. */
static void help(FILE *f)
{
    usage(f);
    fprintf(f,
            "\n"
            "options:\n"
            "  -c, --config FILE         run on FILE (default: $SLUICE_CONFIG, then ./sidecar.yaml)\n"
            "      --check-config FILE   check FILE and exit: 0 valid, 1 invalid\n"
            "  -V, --version             version, git revision, build type, library versions\n"
            "  -h, --help                this text\n"
            "\n"
            "signals: SIGHUP reloads FILE; SIGTERM/SIGINT drain (limits.drain_timeout) and exit 0\n"
            "admin (the config's admin address): /healthz /readyz /metrics /config POST /reload\n"
            "\n"
            "docs: README.md (running and operating), docs/contract.md (command line, config,\n"
            "      headers, metrics), docs/runbook.md (alerts) in the source tree\n");
}

static void print_errors(const struct sc_errors *errs)
{
    char line[SC_ERROR_TEXT_MAX + SC_ERROR_FILE_MAX + 32];

    for (size_t i = 0; i < errs->n; i++) {
        sc_error_format(&errs->v[i], line, sizeof line);
        fprintf(stderr, "%s\n", line);
    }
}

static int check_config(const char *path)
{
    struct sc_errors errs = {0};
    struct sc_config *cfg = NULL;
    int rc = config_load_file(path, &cfg, &errs);

    if (rc != 0) {
        print_errors(&errs);
        sc_errors_free(&errs);
        return 1;
    }
    printf("%s: ok (%zu upstreams, %zu policies, %zu routes)\n", path,
           cfg->n_upstreams, cfg->n_policies, cfg->n_routes);
    config_free(cfg);
    return 0;
}

/* Where the file came from, for the message when it is missing. */
static const char *config_origin = "-c";

static const char *default_config(void)
{
    const char *env = getenv("SLUICE_CONFIG");

    if (env && *env) {
        config_origin = "$SLUICE_CONFIG";
        return env;
    }
    config_origin = "the default";
    return "./sidecar.yaml";
}

/* A missing file is the usual first-run mistake: say where sluice looked
 * and the two ways to point it elsewhere. */
static void hint_missing(const char *path)
{
    fprintf(stderr,
            "sluice: no config file at %s (%s); name one with -c FILE or "
            "$SLUICE_CONFIG (see sluice --help)\n",
            path, config_origin);
}

static int run(const char *path)
{
    struct sc_errors errs = {0};
    struct sc_config *cfg = NULL;
    struct sc_error err = {0};
    struct app app;
    int rc;

    rc = config_load_file(path, &cfg, &errs);
    if (rc != 0) {
        print_errors(&errs);
        sc_errors_free(&errs);
        if (rc == -ENOENT)
            hint_missing(path);
        return 1;
    }
    rc = app_start(&app, cfg, &err);
    if (rc != 0) {
        log_error("cannot start: %s", err.text);
        app_free(&app);
        return 1;
    }
    rc = app_run(&app);
    app_free(&app);
    return rc;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},
        {"check-config", required_argument, NULL, 'k'},
        {"version", no_argument, NULL, 'V'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *path = NULL;
    int c;

#ifdef SLUICE_FAILALLOC
    /* The allocation-failure build: libevent's and jansson's allocations on
     * a request's way count too (before any of their calls). */
    event_set_mem_functions(failalloc_malloc, failalloc_realloc, free);
    json_set_alloc_funcs(failalloc_malloc, free);
#endif
    while ((c = getopt_long(argc, argv, "c:hVv", opts, NULL)) != -1) {
        switch (c) {
        case 'c':
            path = optarg;
            break;
        case 'k':
            return check_config(optarg);
        case 'V':
        case 'v': /* kept: -v printed the version before -V did */
            return version_report(stdout) == 0 ? 0 : 1;
        case 'h':
            help(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "sluice: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    return run(path ? path : default_config());
}
