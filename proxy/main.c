/* sluice's command line (docs/contract.md §1). The only place that prints to
 * stdout or decides the exit status. */
#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
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
            "usage: sluice [-c FILE]                 run (FILE: $SLUICE_CONFIG, then ./sidecar.yaml)\n"
            "       sluice [-c FILE] -t | -T         check the config that would run (-T: and print it)\n"
            "       sluice --check-config [FILE]     check FILE (default: as -t); errors as FILE:LINE:COL: message\n"
            "       sluice -V | --version | -h | --help\n");
}

/* One line per option; the details are in the documents it names. */
static void help(FILE *f)
{
    usage(f);
    fprintf(f,
            "\n"
            "options:\n"
            "  -c, --config FILE         the config file (default: $SLUICE_CONFIG, then ./sidecar.yaml)\n"
            "  -t                        check the config and exit: 0 valid, 1 invalid\n"
            "  -T                        as -t, then print the effective config as JSON on stdout\n"
            "                            (secrets redacted, as GET /config); the verdict goes to stderr\n"
            "      --check-config [FILE] as -t, on FILE when given\n"
            "  -V, --version             version, git revision, build type, linked library versions\n"
            "  -h, --help                this text\n"
            "\n"
            "signals: SIGHUP reloads FILE; SIGTERM/SIGINT drain (limits.drain_timeout) and exit 0\n"
            "admin (the config's admin address): /healthz /readyz /metrics /config POST /reload\n"
            "\n"
            "docs: README.md (first steps), docs/operating.md (running and operating),\n"
            "      docs/contract.md (command line, config, headers, metrics), docs/runbook.md\n"
            "      (alerts) in the source tree\n");
}

static void print_errors(const struct sc_errors *errs)
{
    char line[SC_ERROR_TEXT_MAX + SC_ERROR_FILE_MAX + 32];

    for (size_t i = 0; i < errs->n; i++) {
        sc_error_format(&errs->v[i], line, sizeof line);
        fprintf(stderr, "%s\n", line);
    }
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

/* -t, -T and --check-config: the verdict on stdout, or with -T on stderr so
 * that stdout is the effective config alone (sluice -T | jq). */
static int check_config(const char *path, bool dump)
{
    struct sc_errors errs = {0};
    struct sc_config *cfg = NULL;
    int rc = config_load_file(path, &cfg, &errs);
    char *json = NULL;

    if (rc != 0) {
        print_errors(&errs);
        sc_errors_free(&errs);
        if (rc == -ENOENT)
            hint_missing(path);
        return 1;
    }
    fprintf(dump ? stderr : stdout, "%s: ok (%zu upstreams, %zu policies, %zu routes)\n",
            path, cfg->n_upstreams, cfg->n_policies, cfg->n_routes);
    if (dump && (json = config_to_json(cfg)) != NULL)
        printf("%s\n", json);
    rc = dump && !json ? 1 : 0;
    if (rc)
        fprintf(stderr, "sluice: out of memory printing the config\n");
    free(json);
    config_free(cfg);
    return rc;
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

enum cli_mode { CLI_RUN = 0, CLI_CHECK, CLI_DUMP, CLI_VERSION, CLI_HELP };

struct cli {
    enum cli_mode mode;
    const char *file;       /* -c, or --check-config's FILE */
};

/* One mode per invocation: "-t -V" is a mistake worth saying, not a guess. */
static int set_mode(struct cli *cl, enum cli_mode m, const char *opt)
{
    if (cl->mode != CLI_RUN && cl->mode != m) {
        fprintf(stderr, "sluice: %s cannot be combined with another mode option\n", opt);
        return -EINVAL;
    }
    cl->mode = m;
    return 0;
}

/* Every argument is an option or --check-config's one FILE: anything else is
 * an error (exit 2), never silently ignored. */
static int parse_args(int argc, char **argv, struct cli *cl)
{
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},
        {"check-config", no_argument, NULL, 'k'},
        {"version", no_argument, NULL, 'V'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    bool positional_file = false;
    int c, rc = 0;

    while (rc == 0 && (c = getopt_long(argc, argv, "c:htTVv", opts, NULL)) != -1) {
        switch (c) {
        case 'c':
            cl->file = optarg;
            break;
        case 'k':
            rc = set_mode(cl, CLI_CHECK, "--check-config");
            positional_file = true;
            break;
        case 't':
            rc = set_mode(cl, CLI_CHECK, "-t");
            break;
        case 'T':
            rc = set_mode(cl, CLI_DUMP, "-T");
            break;
        case 'V':
        case 'v': /* kept: -v printed the version before -V did */
            rc = set_mode(cl, CLI_VERSION, "-V");
            break;
        case 'h':
            rc = set_mode(cl, CLI_HELP, "-h");
            break;
        default:
            rc = -EINVAL;
        }
    }
    if (rc == 0 && positional_file && optind < argc && !cl->file) {
        cl->file = argv[optind++];
        config_origin = "--check-config";
    }
    if (rc == 0 && positional_file && optind < argc) {
        fprintf(stderr, "sluice: --check-config %s and -c %s both name a config file\n",
                argv[optind], cl->file);
        rc = -EINVAL;
    }
    if (rc == 0 && optind < argc) {
        fprintf(stderr, "sluice: unexpected argument '%s'\n", argv[optind]);
        rc = -EINVAL;
    }
    return rc;
}

int main(int argc, char **argv)
{
    struct cli cl = {0};

#ifdef SLUICE_FAILALLOC
    /* The allocation-failure build: libevent's and jansson's allocations on
     * a request's way count too (before any of their calls). */
    event_set_mem_functions(failalloc_malloc, failalloc_realloc, free);
    json_set_alloc_funcs(failalloc_malloc, free);
#endif
    if (parse_args(argc, argv, &cl) != 0) {
        usage(stderr);
        return 2;
    }
    switch (cl.mode) {
    case CLI_VERSION:
        return version_report(stdout) == 0 ? 0 : 1;
    case CLI_HELP:
        help(stdout);
        return 0;
    case CLI_CHECK:
    case CLI_DUMP:
        return check_config(cl.file ? cl.file : default_config(), cl.mode == CLI_DUMP);
    default:
        return run(cl.file ? cl.file : default_config());
    }
}
