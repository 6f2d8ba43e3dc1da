/* policies/route.c: the routing rules of docs/contract.md §2 (`routes`) and the
 * target sent upstream (strip_prefix under the base path). */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "policies/route.h"

static struct sc_config *load(const char *yaml)
{
    struct sc_errors errs = {0};
    struct sc_config *cfg = NULL;
    char line[1024];
    int rc = config_load_string("route.yaml", yaml, strlen(yaml), &cfg, &errs);

    if (rc != 0 && errs.n) {
        sc_error_format(&errs.v[0], line, sizeof line);
        cr_log_error("%s", line);
    }
    sc_errors_free(&errs);
    cr_assert_eq(rc, 0, "test config must load");
    return cfg;
}

/* The name of the route for target and method, or "-" for none. */
static const char *match(const struct sc_config *cfg, const char *target,
                         const char *method)
{
    const struct sc_route *r = route_match(cfg, target, sc_method_bit(method));

    return r ? r->name : "-";
}

static const char ROUTES[] =
    "upstreams:\n"
    "  up: { url: http://127.0.0.1:9000 }\n"
    "routes:\n"
    "  - { name: root, prefix: /, upstream: up }\n"
    "  - { name: v1, prefix: /v1, upstream: up }\n"
    "  - { name: sync, prefix: /v1/sync, upstream: up }\n"
    "  - { name: sync-again, prefix: /v1/sync, upstream: up }\n"
    "  - { name: sync-post, prefix: /v1/sync/jobs, methods: [POST], upstream: up }\n"
    "  - { name: dir, prefix: /v2/, upstream: up }\n"
    "  - { name: ext, prefix: /dav, methods: [PROPFIND], upstream: up }\n";

Test(route_match, longest_prefix_wins)
{
    struct sc_config *cfg = load(ROUTES);

    cr_expect_str_eq(match(cfg, "/v1/sync/x", "GET"), "sync");
    cr_expect_str_eq(match(cfg, "/v1/other", "GET"), "v1");
    cr_expect_str_eq(match(cfg, "/v1", "GET"), "v1");
    cr_expect_str_eq(match(cfg, "/elsewhere", "GET"), "root");
    config_free(cfg);
}

Test(route_match, first_of_equal_prefixes_wins)
{
    struct sc_config *cfg = load(ROUTES);

    cr_expect_str_eq(match(cfg, "/v1/sync", "GET"), "sync");
    cr_expect_str_eq(match(cfg, "/v1/sync/a/b", "DELETE"), "sync");
    config_free(cfg);
}

Test(route_match, boundary_is_slash_query_or_end)
{
    struct sc_config *cfg = load(ROUTES);

    cr_expect_str_eq(match(cfg, "/v1/sync?x=1", "GET"), "sync");
    cr_expect_str_eq(match(cfg, "/v1/sync/", "GET"), "sync");
    /* /v1/syncx is not under /v1/sync: the next shorter prefix takes it */
    cr_expect_str_eq(match(cfg, "/v1/syncx", "GET"), "v1");
    cr_expect_str_eq(match(cfg, "/v1x", "GET"), "root");
    cr_expect_str_eq(match(cfg, "/v1?q=/v1/sync", "GET"), "v1");
    config_free(cfg);
}

Test(route_match, prefix_ending_in_slash_matches_everything_under_it)
{
    struct sc_config *cfg = load(ROUTES);

    cr_expect_str_eq(match(cfg, "/v2/anything", "GET"), "dir");
    cr_expect_str_eq(match(cfg, "/v2/", "GET"), "dir");
    cr_expect_str_eq(match(cfg, "/v2/?x", "GET"), "dir");
    cr_expect_str_eq(match(cfg, "/v2x/a", "GET"), "root");
    /* "/v2" is not under "/v2/" */
    cr_expect_str_eq(match(cfg, "/v2", "GET"), "root");
    cr_expect_str_eq(match(cfg, "/", "GET"), "root");
    cr_expect_str_eq(match(cfg, "/?x=1", "GET"), "root");
    config_free(cfg);
}

Test(route_match, methods_filter_falls_through_to_shorter_prefixes)
{
    struct sc_config *cfg = load(ROUTES);

    cr_expect_str_eq(match(cfg, "/v1/sync/jobs", "POST"), "sync-post");
    cr_expect_str_eq(match(cfg, "/v1/sync/jobs", "GET"), "sync");
    cr_expect_str_eq(match(cfg, "/v1/sync/jobs/7", "PUT"), "sync");
    /* extension methods share the OTHER bit */
    cr_expect_str_eq(match(cfg, "/dav/x", "PROPFIND"), "ext");
    cr_expect_str_eq(match(cfg, "/dav/x", "GET"), "root");
    config_free(cfg);
}

Test(route_match, no_match_is_null)
{
    struct sc_config *cfg = load(
        "upstreams: { up: { url: http://h } }\n"
        "routes:\n"
        "  - { prefix: /v1/sync, methods: [POST], upstream: up }\n");

    cr_expect_null(route_match(cfg, "/v1/syncx", SC_M_POST));
    cr_expect_null(route_match(cfg, "/v1/sync", SC_M_GET));
    cr_expect_null(route_match(cfg, "/v1", SC_M_POST));
    cr_expect_not_null(route_match(cfg, "/v1/sync?a", SC_M_POST));
    /* the default name is the prefix */
    cr_expect_str_eq(route_match(cfg, "/v1/sync", SC_M_POST)->name, "/v1/sync");
    config_free(cfg);
}

Test(route_match, odd_targets_do_not_crash)
{
    struct sc_config *cfg = load(ROUTES);

    cr_expect_null(route_match(cfg, "", SC_M_GET));
    cr_expect_null(route_match(cfg, "*", SC_M_OPTIONS));
    cr_expect_null(route_match(cfg, "http://example.com/v1", SC_M_GET));
    cr_expect_null(route_match(cfg, "?x", SC_M_GET));
    cr_expect_null(route_match(cfg, NULL, SC_M_GET));
    cr_expect_null(route_match(NULL, "/", SC_M_GET));
    cr_expect_null(route_match(cfg, "/v1", 0));
    cr_expect_str_eq(match(cfg, "//", "GET"), "root");
    config_free(cfg);
}

static const char TARGETS[] =
    "upstreams:\n"
    "  based: { url: \"https://api.example/base/\" }\n"
    "  bare: { url: http://127.0.0.1:9000 }\n"
    "routes:\n"
    "  - { prefix: /v1, upstream: based, strip_prefix: /v1 }\n"
    "  - { prefix: /v2/, upstream: based, strip_prefix: /v2/ }\n"
    "  - { prefix: /v3, upstream: bare, strip_prefix: /v3 }\n"
    "  - { prefix: /v4, upstream: based }\n"
    "  - { prefix: /v5, upstream: bare }\n";

/* The upstream target for target through the route it matches. */
static char *forward(const struct sc_config *cfg, const char *target)
{
    const struct sc_route *r = route_match(cfg, target, SC_M_GET);

    cr_assert_not_null(r, "%s must match", target);
    return route_upstream_target(r, &cfg->upstreams[r->upstream], target);
}

struct fwd_case {
    const char *in, *out;
};

Test(route_target, strip_prefix_under_base_path)
{
    static const struct fwd_case cases[] = {
        {"/v1/sync?x=1", "/base/sync?x=1"},
        {"/v1/sync/a/b", "/base/sync/a/b"},
        {"/v1", "/base/"},
        {"/v1/", "/base/"},
        {"/v1?x=1", "/base/?x=1"},
        {"/v2/sync", "/base/sync"},        /* a strip ending in "/" */
        {"/v2/", "/base/"},
        {"/v2/?q", "/base/?q"},
        {"/v3", "/"},                      /* nothing remains, no base */
        {"/v3?x=1", "/?x=1"},
        {"/v3/x", "/x"},
        {"/v4/sync?y", "/base/v4/sync?y"}, /* no strip */
        {"/v4", "/base/v4"},
        {"/v5/a?b=c", "/v5/a?b=c"},        /* no strip, no base: unchanged */
    };
    struct sc_config *cfg = load(TARGETS);
    size_t i;

    cr_assert_str_eq(cfg->upstreams[0].base_path, "/base");
    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *t = forward(cfg, cases[i].in);
        cr_expect_str_eq(t, cases[i].out, "%s", cases[i].in);
        free(t);
    }
    config_free(cfg);
}

Test(route_target, tolerates_odd_input)
{
    struct sc_route r = {.strip_prefix = (char *)"/v1"};
    struct sc_upstream up = {.base_path = (char *)""};
    char *t;

    t = route_upstream_target(&r, &up, "");
    cr_expect_str_eq(t, "/");
    free(t);
    t = route_upstream_target(&r, &up, "/other");   /* strip does not apply */
    cr_expect_str_eq(t, "/other");
    free(t);
    t = route_upstream_target(NULL, NULL, NULL);
    cr_expect_str_eq(t, "/");
    free(t);
    t = route_upstream_target(&r, &up, "*");
    cr_expect_str_eq(t, "/*");
    free(t);
}
