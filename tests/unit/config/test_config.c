#define _GNU_SOURCE
/* policies/config_*.c: loading sidecar.yaml (docs/contract.md §2): defaults,
 * the full example, ${ENV}, error reporting, the JSON view and its
 * redaction. Invalid configs one by one live in test_config_invalid.c. */
#include <criterion/criterion.h>
#include <errno.h>
#include <jansson.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "support/testutil.h"

#define MINIMAL                                  \
    "upstreams:\n"                               \
    "  up: { url: http://127.0.0.1:9000 }\n"     \
    "routes:\n"                                  \
    "  - { prefix: /, upstream: up }\n"

static void log_errors(const struct sc_errors *errs)
{
    char line[1024];
    size_t i;

    for (i = 0; i < errs->n; i++) {
        sc_error_format(&errs->v[i], line, sizeof line);
        cr_log_error("%s", line);
    }
}

static struct sc_config *load_ok(const char *yaml)
{
    struct sc_errors errs = {0};
    struct sc_config *cfg = NULL;
    int rc = config_load_string("test.yaml", yaml, strlen(yaml), &cfg, &errs);

    log_errors(&errs);
    cr_assert_eq(rc, 0, "config must load");
    cr_assert_not_null(cfg);
    cr_assert_eq(errs.n, 0);
    sc_errors_free(&errs);
    return cfg;
}

/* Loads a config that must fail; returns its errors formatted, one a line
 * (owned). */
static char *load_fail(const char *yaml, size_t *n_errors)
{
    struct sc_errors errs = {0};
    struct sc_config *cfg = (struct sc_config *)1;
    char line[1024], *all = NULL;
    size_t i, len = 0;
    int rc = config_load_string("test.yaml", yaml, strlen(yaml), &cfg, &errs);

    cr_assert(rc < 0, "config must be refused");
    cr_assert_null(cfg, "*out must be NULL on failure");
    cr_assert(errs.n > 0);
    for (i = 0; i < errs.n; i++) {
        sc_error_format(&errs.v[i], line, sizeof line);
        all = realloc(all, len + strlen(line) + 2);
        cr_assert_not_null(all);
        len += (size_t)sprintf(all + len, "%s\n", line);
    }
    if (n_errors)
        *n_errors = errs.n;
    sc_errors_free(&errs);
    return all;
}

/* The first error of a refused config. */
static void expect_first_error(const char *yaml, const char *expected)
{
    char *all = load_fail(yaml, NULL);

    cr_expect(strncmp(all, expected, strlen(expected)) == 0 &&
              all[strlen(expected)] == '\n',
              "expected\n  %s\ngot\n  %s", expected, all);
    free(all);
}

/* ---- defaults ------------------------------------------------------------ */

Test(config_defaults, minimal_config_gets_spec_defaults)
{
    struct sc_config *cfg = load_ok(MINIMAL);
    const struct sc_upstream *u = &cfg->upstreams[0];

    cr_expect_str_eq(cfg->file, "test.yaml");
    cr_expect_str_eq(cfg->admin_token, "");
    cr_expect_str_eq(cfg->listen.host, "127.0.0.1");
    cr_expect_eq(cfg->listen.port, 8080);
    cr_expect_str_eq(cfg->admin.host, "127.0.0.1");
    cr_expect_eq(cfg->admin.port, 9901);
    cr_expect_eq(cfg->threads, 0);
    cr_expect_eq(cfg->store.backend, SC_BACKEND_ROCKSDB);
    cr_expect_str_eq(cfg->store.path, "./data");
    cr_expect_eq(cfg->store.sync, false);
    cr_expect_str_eq(cfg->store.url, "");
    cr_expect_str_eq(cfg->store.key_prefix, "sluice:");
    cr_expect_eq(cfg->store.fleet_size, 1);
    cr_expect_eq(cfg->limits.max_body, 8u << 20);
    cr_expect_eq(cfg->limits.max_header, 16u << 10);
    cr_expect_eq(cfg->limits.max_connections, 4096);
    cr_expect_eq(cfg->limits.header_timeout_ms, 10000);
    cr_expect_eq(cfg->limits.drain_timeout_ms, 10000);
    cr_expect_eq(cfg->log.level, SC_LOG_INFO);
    cr_expect_eq(cfg->log.access, true);
    cr_expect_str_eq(cfg->metrics.statsd, "");

    cr_assert_eq(cfg->n_upstreams, 1);
    cr_expect_str_eq(u->name, "up");
    cr_expect_str_eq(u->url, "http://127.0.0.1:9000");
    cr_expect_eq(u->https, false);
    cr_expect_str_eq(u->host, "127.0.0.1");
    cr_expect_eq(u->port, 9000);
    cr_expect_str_eq(u->authority, "127.0.0.1:9000");
    cr_expect_str_eq(u->base_path, "");
    cr_expect_eq(u->connect_timeout_ms, 2000);
    cr_expect_eq(u->timeout_ms, 30000);
    cr_expect_eq(u->max_connections, 64);
    cr_expect_eq(u->tls.verify, true);
    cr_expect_str_eq(u->tls.ca_file, "");
    cr_expect_eq(u->n_headers, 0);

    cr_expect_eq(cfg->n_policies, 0);
    cr_assert_eq(cfg->n_routes, 1);
    cr_expect_str_eq(cfg->routes[0].name, "/");
    cr_expect_str_eq(cfg->routes[0].prefix, "/");
    cr_expect_eq(cfg->routes[0].methods, SC_M_ALL);
    cr_expect_eq(cfg->routes[0].upstream, 0);
    cr_expect_eq(cfg->routes[0].policy, -1);
    cr_expect_str_eq(cfg->routes[0].strip_prefix, "");
    config_free(cfg);
}

static void expect_default_retry(const struct sc_retry *r)
{
    static const int on[] = {429, 502, 503, 504};
    int s, n = 0;

    for (s = 0; s < 640; s++)
        n += sc_retry_on_status(r, s);
    cr_expect_eq(n, 4);
    for (s = 0; s < 4; s++)
        cr_expect(sc_retry_on_status(r, on[s]), "%d", on[s]);
    cr_expect_eq(r->on_transport,
                 SC_T_CONNECT_ERROR | SC_T_CONNECTION_LOST | SC_T_TIMEOUT);
    cr_expect_eq(r->base_ms, 1000);
    cr_expect_eq(r->multiplier, 2.0);
    cr_expect_eq(r->cap_ms, 6ull * 3600 * 1000);
    cr_expect_eq(r->max_attempts, 8);
    cr_expect_eq(r->max_delay_ms, 7ull * 86400 * 1000);
    cr_expect_eq(r->jitter, SC_JITTER_FULL);
}

static void expect_default_idem_values(const struct sc_idempotency *i)
{
    int s;

    cr_expect_str_eq(i->header, "Idempotency-Key");
    cr_expect_eq(i->methods, SC_M_POST | SC_M_PUT | SC_M_PATCH | SC_M_DELETE);
    cr_expect_eq(i->required, true);
    cr_expect_eq(i->ttl_ms, 86400000);
    cr_expect_eq(i->lease_ms, 60000);
    cr_expect_eq(i->fingerprint, SC_FP_METHOD | SC_FP_PATH | SC_FP_BODY);
    for (s = 100; s < 600; s++)
        cr_expect_eq(sc_idem_replays_status(i, s), s / 100 == 2 || s / 100 == 4,
                     "%d", s);
    cr_expect_eq(i->max_stored_body, 1u << 20);
    cr_expect_eq(i->duplicates, SC_DUP_REFUSE);
    /* verify's defaults, whether or not the block is given */
    cr_expect_eq(i->verify.method, SC_M_GET);
    for (s = 100; s < 600; s++) {
        cr_expect_eq(sc_verify_found(&i->verify, s), s == 200, "%d", s);
        cr_expect_eq(sc_verify_absent(&i->verify, s), s == 404, "%d", s);
    }
    cr_expect_eq(i->verify.after_ms, 1000);
    cr_expect_eq(i->verify.attempts, 3);
}

Test(config_defaults, default_policy)
{
    struct sc_config *cfg = load_ok(MINIMAL);
    const struct sc_policy *p = &cfg->default_policy;

    cr_expect_str_eq(p->name, "default");
    cr_expect_eq(p->has_rate, false);
    cr_expect_eq(p->burst, 1);
    cr_expect_eq(p->max_wait_ms, 2000);
    cr_expect_eq(p->concurrency, 0);
    cr_expect_eq(p->mode, SC_MODE_ENFORCE);
    cr_expect_null(p->partition_header);
    cr_expect_eq(p->partition_max, 10000);
    cr_expect_eq(p->shared, SC_SHARED_LOCAL);
    expect_default_retry(&p->retry);
    cr_expect_eq(p->idem.enabled, false);
    /* disabled, but filled so that nothing reads a NULL */
    expect_default_idem_values(&p->idem);
    config_free(cfg);
}

/* Routes point at their upstream and policy once loaded: the default
 * policy when they name none, never a NULL or an index to check. */
Test(config_defaults, routes_are_resolved)
{
    static const char yaml[] =
        "upstreams: { a: { url: http://127.0.0.1:1 }, b: { url: http://127.0.0.1:2 } }\n"
        "policies: { p: { rate: 1/s } }\n"
        "routes:\n"
        "  - { prefix: /x, upstream: b, policy: p }\n"
        "  - { prefix: /, upstream: a }\n";
    struct sc_config *cfg = load_ok(yaml);

    cr_expect_eq(cfg->routes[0].up, &cfg->upstreams[1]);
    cr_expect_eq(cfg->routes[0].pol, &cfg->policies[0]);
    cr_expect_eq(cfg->routes[1].up, &cfg->upstreams[0]);
    cr_expect_eq(cfg->routes[1].pol, &cfg->default_policy);
    config_free(cfg);
}

Test(config_defaults, empty_policy_and_idempotency_block)
{
    struct sc_config *cfg = load_ok(
        "upstreams: { up: { url: http://h } }\n"
        "policies:\n"
        "  p: {}\n"
        "  q:\n"
        "    idempotency: {}\n"
        "routes: [ { prefix: /p, upstream: up, policy: p },\n"
        "          { prefix: /q, upstream: up, policy: q } ]\n");

    cr_assert_eq(cfg->n_policies, 2);
    cr_expect_eq(cfg->policies[0].burst, 1);
    cr_expect_eq(cfg->policies[0].idem.enabled, false);
    expect_default_retry(&cfg->policies[0].retry);
    cr_expect_eq(cfg->policies[1].idem.enabled, true);
    expect_default_idem_values(&cfg->policies[1].idem);
    cr_expect_eq(cfg->policies[1].idem.pos.line, 5);
    cr_expect_eq(cfg->policies[1].idem.pos.col, 5);
    cr_expect_eq(cfg->policies[1].idem.lease_pos.line, 0);
    cr_expect_eq(cfg->policies[1].idem.verify.enabled, false);
    cr_expect_null(cfg->policies[1].idem.verify.path);
    cr_expect_eq(cfg->routes[0].policy, 0);
    cr_expect_eq(cfg->routes[1].policy, 1);
    config_free(cfg);
}

Test(config_defaults, null_values_mean_not_given)
{
    struct sc_config *cfg = load_ok(
        "listen:\n"
        "limits:\n"
        "policies:\n"
        "  p:\n"
        "    burst: ~\n"
        "    idempotency: null\n"
        "upstreams: { up: { url: http://h, headers: } }\n"
        "routes: [ { prefix: /, upstream: up, policy: p, methods: } ]\n");

    cr_expect_eq(cfg->listen.port, 8080);
    cr_expect_eq(cfg->limits.max_connections, 4096);
    cr_expect_eq(cfg->policies[0].burst, 1);
    cr_expect_eq(cfg->policies[0].idem.enabled, false);
    cr_expect_eq(cfg->routes[0].methods, SC_M_ALL);
    config_free(cfg);
}

/* Found by fuzzing: an empty store.master read through a NULL pointer in
 * the store's checks. It is "not given", and the checks still apply. */
Test(config_defaults, an_empty_master_is_not_given)
{
    struct sc_config *cfg = load_ok(
        "store:\n"
        "  master:\n"
        "upstreams: { up: { url: http://h } }\n"
        "routes: [ { prefix: /, upstream: up } ]\n");
    size_t n = 0;
    char *errs;

    config_free(cfg);
    errs = load_fail(
        "store:\n"
        "  backend: redis\n"
        "  url: redis://127.0.0.1:6379/0\n"
        "  master:\n"
        "  sentinels: [127.0.0.1:26379]\n"
        "upstreams: { up: { url: http://h } }\n"
        "routes: [ { prefix: /, upstream: up } ]\n", &n);
    cr_expect(strstr(errs, "needs master"), "%s", errs);
    free(errs);
}

/* ---- the full example -------------------------------------------------------- */

static struct sc_config *load_file_ok(const char *path)
{
    struct sc_errors errs = {0};
    struct sc_config *cfg = NULL;
    int rc = config_load_file(path, &cfg, &errs);

    log_errors(&errs);
    cr_assert_eq(rc, 0, "%s must load", path);
    sc_errors_free(&errs);
    return cfg;
}

Test(config_full, spec_example_loads)
{
    struct sc_config *cfg;
    const struct sc_upstream *u;
    const struct sc_policy *p;
    const struct sc_route *r;

    setenv("PARTNER_TOKEN", "s3cr3t-token", 1);
    cfg = load_file_ok(SLUICE_SOURCE_DIR "/tests/config/valid/full.yaml");
    cr_expect_str_eq(cfg->file, SLUICE_SOURCE_DIR "/tests/config/valid/full.yaml");

    u = config_upstream(cfg, "partner");
    cr_assert_not_null(u);
    cr_expect_eq(u->https, true);
    cr_expect_str_eq(u->host, "api.partner.example");
    cr_expect_eq(u->port, 443);
    cr_expect_str_eq(u->authority, "api.partner.example");
    cr_expect_str_eq(u->base_path, "/base");
    cr_expect_eq(u->timeout_ms, 30000);
    cr_expect_eq(u->timeout_pos.line, 24);
    cr_assert_eq(u->n_headers, 1);
    cr_expect_str_eq(u->headers[0].name, "Authorization");
    cr_expect_str_eq(u->headers[0].value, "Bearer s3cr3t-token");
    cr_expect_eq(u->headers[0].from_env, true);
    cr_expect_str_eq(u->tls.cert_file, "");
    cr_expect_str_eq(u->tls.key_file, "");
    cr_expect_str_eq(u->proxy, "");

    cr_assert_eq(config_policy_index(cfg, "partner-writes"), 0);
    p = &cfg->policies[0];
    cr_expect_eq(p->has_rate, true);
    cr_expect_eq(p->rate, 10.0);
    cr_expect_eq(p->burst, 10);
    cr_expect_eq(p->max_wait_ms, 2000);
    cr_expect_eq(p->concurrency, 8);
    expect_default_retry(&p->retry);
    cr_expect_eq(p->idem.enabled, true);
    expect_default_idem_values(&p->idem);
    cr_expect_eq(p->idem.lease_pos.line, 50);
    cr_expect_eq(p->idem.verify.enabled, true);
    cr_expect_str_eq(p->idem.verify.path, "/v1/orders?client_ref={key}");
    cr_expect_eq(p->idem.verify.pos.line, 56);

    cr_assert_eq(cfg->n_routes, 1);
    r = &cfg->routes[0];
    cr_expect_str_eq(r->name, "sync");
    cr_expect_str_eq(r->prefix, "/v1/sync");
    cr_expect_eq(r->methods, SC_M_POST);
    cr_expect_eq(r->upstream, 0);
    cr_expect_eq(r->policy, 0);
    cr_expect_str_eq(r->strip_prefix, "");
    cr_expect_eq(r->has_timeout, false, "timeout: \"\" leaves the upstream's");
    cr_expect_eq(sc_route_timeout(r, u), 30000);
    config_free(cfg);
}

Test(config_full, spec_example_needs_its_variable)
{
    char *src = tu_read_file(SLUICE_SOURCE_DIR "/tests/config/valid/full.yaml", NULL);
    char *all;

    cr_assert_not_null(src);
    unsetenv("PARTNER_TOKEN");
    all = load_fail(src, NULL);
    cr_expect_str_eq(all, "test.yaml:29:22: upstreams.partner.headers.Authorization: "
                     "environment variable \"PARTNER_TOKEN\" is not set\n");
    free(all);
    free(src);
}

/* ---- sidecar.yaml ------------------------------------------------------------ */

Test(config_sidecar, default_config_loads)
{
    struct sc_config *cfg = load_file_ok(SLUICE_SOURCE_DIR "/sidecar.yaml");

    cr_expect_str_eq(cfg->listen.host, "127.0.0.1");
    cr_expect_eq(cfg->listen.port, 8080);
    cr_expect_eq(cfg->admin.port, 9901);
    cr_expect_str_eq(cfg->store.path, "./data");
    cr_assert_not_null(config_upstream(cfg, "demo"));
    cr_expect_eq(config_upstream(cfg, "demo")->port, 9000);
    cr_assert_eq(cfg->n_routes, 1);
    cr_expect_str_eq(cfg->routes[0].name, "demo");
    cr_expect_str_eq(cfg->routes[0].prefix, "/");
    /* The demo policy the tour of scripts/demo.sh relies on (scripts/tour.sh):
     * 2/s, burst 2, a wait of 1 s at most, the default retry block, keys
     * optional. */
    cr_assert_eq(cfg->n_policies, 1);
    cr_expect_eq(cfg->routes[0].policy, 0);
    cr_expect_str_eq(cfg->policies[0].name, "demo");
    cr_expect(cfg->policies[0].has_rate);
    cr_expect_float_eq(cfg->policies[0].rate, 2.0, 1e-9);
    cr_expect_eq(cfg->policies[0].burst, 2);
    cr_expect_eq(cfg->policies[0].max_wait_ms, 1000);
    cr_expect_eq(cfg->policies[0].retry.max_attempts, 8);
    cr_expect(sc_retry_on_status(&cfg->policies[0].retry, 429));
    cr_expect(sc_retry_on_status(&cfg->policies[0].retry, 503));
    cr_expect_eq(cfg->policies[0].idem.enabled, true);
    cr_expect_eq(cfg->policies[0].idem.required, false);
    cr_expect_eq(cfg->policies[0].idem.duplicates, SC_DUP_REFUSE);
    cr_expect_eq(cfg->policies[0].idem.verify.enabled, false);
    config_free(cfg);
}

/* The commented-out partner example, uncommented, must load too: an
 * operator will do exactly that. Uncomments "# key: ..." and "# - key: ..."
 * lines, leaving the prose comments; the demo policy stays beside it. */
Test(config_sidecar, commented_example_loads_when_uncommented)
{
    char *src = tu_read_file(SLUICE_SOURCE_DIR "/sidecar.yaml", NULL), *out;
    char *line, *save = NULL, *p;
    regex_t re;
    regmatch_t m[3];
    struct sc_config *cfg;
    size_t n = 0;

    cr_assert_not_null(src);
    out = calloc(1, strlen(src) + 64);   /* a missing final newline is added */
    cr_assert_eq(regcomp(&re, "^( +)# ( *(- )?[A-Za-z_][-A-Za-z0-9_]*:.*)$",
                         REG_EXTENDED), 0);
    for (line = strtok_r(src, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (regexec(&re, line, 3, m, 0) == 0) {
            n++;
            memcpy(out + strlen(out), line, (size_t)m[1].rm_eo);
            p = out + strlen(out);
            sprintf(p, "%s\n", line + m[2].rm_so);
        } else {
            sprintf(out + strlen(out), "%s\n", line);
        }
    }
    regfree(&re);
    cr_expect(n > 40, "only %zu example lines found", n);
    setenv("PARTNER_TOKEN", "x", 1);
    setenv("REDIS_PASSWORD", "x", 1); /* the fleet-mode store keys */
    cfg = load_ok(out);
    cr_expect_eq(cfg->store.backend, SC_BACKEND_ROCKSDB,
                 "the fleet example stays off: fleet mode does not verify yet");
    cr_expect_eq(cfg->n_upstreams, 2);
    cr_expect_eq(cfg->n_policies, 2);
    cr_expect_eq(cfg->n_routes, 2);
    long i = config_policy_index(cfg, "partner-writes");
    cr_assert_geq(i, 0);
    cr_expect_str_eq(cfg->policies[i].partition_header, "X-Tenant");
    cr_expect_eq(cfg->policies[i].idem.enabled, true);
    cr_expect_eq(cfg->policies[i].breaker.enabled, true);
    cr_expect_eq(cfg->policies[i].idem.verify.enabled, true);
    cr_expect_str_eq(cfg->policies[i].idem.verify.path, "/v1/orders?client_ref={key}");
    config_free(cfg);
    free(out);
    free(src);
}

/* ---- values ------------------------------------------------------------------ */

Test(config_values, upstream_urls)
{
    struct sc_config *cfg = load_ok(
        "upstreams:\n"
        "  a: { url: https://api.example/v2/ }\n"
        "  b: { url: \"http://[::1]:8081\" }\n"
        "  c: { url: HTTPS://h.example:8443/ }\n"
        "  d: { url: http://10.0.0.1/x/y//, timeout: 1.5s }\n"
        "routes: [ { prefix: /, upstream: a } ]\n");
    const struct sc_upstream *u = cfg->upstreams;

    cr_expect_eq(u[0].port, 443);
    cr_expect_str_eq(u[0].authority, "api.example");
    cr_expect_str_eq(u[0].base_path, "/v2");
    cr_expect_eq(u[1].https, false);
    cr_expect_str_eq(u[1].host, "::1");
    cr_expect_eq(u[1].port, 8081);
    cr_expect_str_eq(u[1].authority, "[::1]:8081");
    cr_expect_str_eq(u[1].base_path, "");
    cr_expect_eq(u[2].https, true);
    cr_expect_eq(u[2].port, 8443);
    cr_expect_str_eq(u[2].authority, "h.example:8443");
    cr_expect_str_eq(u[2].base_path, "");
    cr_expect_eq(u[3].port, 80);
    cr_expect_str_eq(u[3].base_path, "/x/y");
    cr_expect_eq(u[3].timeout_ms, 1500);
    config_free(cfg);
}

/* Fleet mode: the Redis backend and a policy shared through it load; the
 * keys of the store are there to read, the password kept out of errors. */
Test(config_values, redis_backend_and_shared_policy_load)
{
    struct sc_config *cfg = load_ok(
        "store: { backend: redis, url: \"redis://:pw@10.0.0.5:6379/0\", fleet_size: 4,\n"
        "         timeout: 250ms, key_prefix: \"fleet:\" }\n"
        "upstreams: { up: { url: http://h } }\n"
        "policies:\n"
        "  w: { rate: 100/s, shared: redis }\n"
        "routes: [ { prefix: /, upstream: up, policy: w } ]\n");

    cr_expect_eq(cfg->store.backend, SC_BACKEND_REDIS);
    cr_expect_eq(cfg->store.fleet_size, 4);
    cr_expect_eq(cfg->store.timeout_ms, 250);
    cr_expect_str_eq(cfg->store.key_prefix, "fleet:");
    cr_expect_eq(cfg->policies[0].shared, SC_SHARED_REDIS);
    config_free(cfg);
}

Test(config_values, store_keys_and_shadow_partitioned_policy)
{
    struct sc_config *cfg = load_ok(
        "store: { url: \"redis://:pw@10.0.0.5:6379/0\", fleet_size: 4 }\n"
        "upstreams: { up: { url: http://h } }\n"
        "policies:\n"
        "  w: { rate: 100/s, burst: 20, mode: shadow,\n"
        "       partition: { header: X-Tenant } }\n"
        "routes: [ { prefix: /, upstream: up, policy: w } ]\n");

    cr_expect_eq(cfg->store.backend, SC_BACKEND_ROCKSDB);
    cr_expect_str_eq(cfg->store.url, "redis://:pw@10.0.0.5:6379/0");
    cr_expect_str_eq(cfg->store.key_prefix, "sluice:");
    cr_expect_eq(cfg->store.fleet_size, 4);
    cr_expect_eq(cfg->policies[0].shared, SC_SHARED_LOCAL);
    cr_expect_eq(cfg->policies[0].mode, SC_MODE_SHADOW);
    cr_expect_str_eq(cfg->policies[0].partition_header, "X-Tenant");
    cr_expect_eq(cfg->policies[0].partition_max, 10000);
    cr_expect_eq(cfg->policies[0].rate, 100.0);
    config_free(cfg);
}

/* A compound duration is accepted wherever a duration is, and a bad one is
 * reported at its own line and column. */
Test(config_values, compound_durations)
{
    struct sc_config *cfg = load_ok(
        "limits: { drain_timeout: 1m30s, header_timeout: 2s500ms }\n"
        "upstreams: { up: { url: http://h, timeout: 1m5s, connect_timeout: 1s250ms } }\n"
        "policies:\n"
        "  w: { rate: 1/s, max_wait: 1m0.5s, breaker: { pause: 1s500ms, max_pause: 59m30s },\n"
        "       retry: { base: 1s500ms, cap: 1d12h },\n"
        "       idempotency: { lease: 2m30s, ttl: 1d1h } }\n"
        "routes: [ { prefix: /, upstream: up, policy: w } ]\n");
    const struct sc_policy *p = &cfg->policies[0];

    cr_expect_eq(cfg->limits.drain_timeout_ms, 90000);
    cr_expect_eq(cfg->limits.header_timeout_ms, 2500);
    cr_expect_eq(cfg->upstreams[0].timeout_ms, 65000);
    cr_expect_eq(cfg->upstreams[0].connect_timeout_ms, 1250);
    cr_expect_eq(p->max_wait_ms, 60500);
    cr_expect_eq(p->breaker.pause_ms, 1500);
    cr_expect_eq(p->breaker.max_pause_ms, 3570000);
    cr_expect_eq(p->retry.base_ms, 1500);
    cr_expect_eq(p->retry.cap_ms, 129600000);
    cr_expect_eq(p->idem.lease_ms, 150000);
    cr_expect_eq(p->idem.ttl_ms, 90000000);
    config_free(cfg);

    expect_first_error(
        "upstreams: { up: { url: http://h, timeout: 30s1m } }\n"
        "routes: [ { prefix: /, upstream: up } ]\n",
        "test.yaml:1:44: upstreams.up.timeout: invalid duration \"30s1m\" (units must get "
        "smaller from left to right, each at most once, as in 1h30m)");
}

Test(config_values, lists_and_enums)
{
    struct sc_config *cfg = load_ok(
        "upstreams: { up: { url: http://h, timeout: 5s } }\n"
        "policies:\n"
        "  p:\n"
        "    retry: { on: [500, timeout], jitter: equal, multiplier: 1.5 }\n"
        "    idempotency:\n"
        "      methods: [POST, PURGE]\n"
        "      fingerprint: [body]\n"
        "      replay_statuses: [2xx, 409, 3xx]\n"
        "routes: [ { prefix: /, upstream: up, policy: p, methods: [GET, HEAD, MKCOL] } ]\n");
    const struct sc_policy *p = &cfg->policies[0];

    cr_expect(sc_retry_on_status(&p->retry, 500));
    cr_expect(!sc_retry_on_status(&p->retry, 429));
    cr_expect(!sc_retry_on_status(&p->retry, -1));
    cr_expect(!sc_retry_on_status(&p->retry, 10000));
    cr_expect_eq(p->retry.on_transport, SC_T_TIMEOUT);
    cr_expect_eq(p->retry.jitter, SC_JITTER_EQUAL);
    cr_expect_eq(p->retry.multiplier, 1.5);
    cr_expect_eq(p->idem.methods, SC_M_POST | SC_M_OTHER);
    cr_expect_eq(p->idem.fingerprint, SC_FP_BODY);
    cr_expect(sc_idem_replays_status(&p->idem, 204));
    cr_expect(sc_idem_replays_status(&p->idem, 301));
    cr_expect(sc_idem_replays_status(&p->idem, 409));
    cr_expect(!sc_idem_replays_status(&p->idem, 404));
    cr_expect(!sc_idem_replays_status(&p->idem, 500));
    cr_expect_eq(cfg->routes[0].methods, SC_M_GET | SC_M_HEAD | SC_M_OTHER);
    config_free(cfg);
}

Test(config_values, aliases_are_followed)
{
    struct sc_config *cfg = load_ok(
        "upstreams: { up: { url: http://h } }\n"
        "policies:\n"
        "  a: { retry: &slow { base: 5s, cap: 1h } }\n"
        "  b: { retry: *slow }\n"
        "routes: [ { prefix: /, upstream: up } ]\n");

    cr_expect_eq(cfg->policies[1].retry.base_ms, 5000);
    cr_expect_eq(cfg->policies[1].retry.cap_ms, 3600000);
    config_free(cfg);
}

Test(config_values, lookups)
{
    struct sc_config *cfg = load_ok(
        "upstreams: { a: { url: http://a }, b: { url: http://b } }\n"
        "policies: { x: {}, y: {} }\n"
        "routes: [ { prefix: /, upstream: b, policy: y },\n"
        "          { prefix: /d, upstream: a, policy: default } ]\n");

    cr_expect_eq(config_upstream(cfg, "b"), &cfg->upstreams[1]);
    cr_expect_null(config_upstream(cfg, "c"));
    cr_expect_null(config_upstream(NULL, "a"));
    cr_expect_eq(config_policy_index(cfg, "y"), 1);
    cr_expect_eq(config_policy_index(cfg, "z"), -1);
    cr_expect_eq(config_policy_index(cfg, NULL), -1);
    cr_expect_eq(cfg->routes[0].upstream, 1);
    cr_expect_eq(cfg->routes[0].policy, 1);
    cr_expect_eq(cfg->routes[1].policy, -1);
    config_free(cfg);
}

Test(config_values, method_bits)
{
    cr_expect_eq(sc_method_bit("GET"), SC_M_GET);
    cr_expect_eq(sc_method_bit("CONNECT"), SC_M_CONNECT);
    cr_expect_eq(sc_method_bit("get"), SC_M_OTHER);
    cr_expect_eq(sc_method_bit("PROPFIND"), SC_M_OTHER);
    cr_expect_eq(sc_method_bit(""), SC_M_OTHER);
    cr_expect_eq(sc_method_bit(NULL), SC_M_OTHER);
}

Test(config_values, listeners_may_share_a_port_on_distinct_hosts)
{
    struct sc_config *cfg = load_ok(
        "listen: 127.0.0.1:8080\n"
        "admin: 127.0.0.2:8080\n" MINIMAL);

    cr_expect_str_eq(cfg->admin.host, "127.0.0.2");
    config_free(cfg);
    cfg = load_ok("listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\n" MINIMAL);
    config_free(cfg);
}

/* ---- ${ENV} ------------------------------------------------------------------- */

Test(config_env, substitutes_in_every_string_scalar)
{
    struct sc_config *cfg;

    setenv("SLUICE_T_HOST", "api.example", 1);
    setenv("SLUICE_T_TIMEOUT", "45s", 1);
    setenv("SLUICE_T_A", "A", 1);
    setenv("SLUICE_T_EMPTY", "", 1);
    cfg = load_ok(
        "upstreams:\n"
        "  up:\n"
        "    url: https://${SLUICE_T_HOST}/v1\n"
        "    timeout: ${SLUICE_T_TIMEOUT}\n"
        "    headers:\n"
        "      X-Two: \"${SLUICE_T_A}-${SLUICE_T_A}$ $x {SLUICE_T_A}${SLUICE_T_EMPTY}\"\n"
        "      X-Plain: \"no variables\"\n"
        "routes: [ { prefix: /, upstream: up } ]\n");
    cr_expect_str_eq(cfg->upstreams[0].host, "api.example");
    cr_expect_str_eq(cfg->upstreams[0].url, "https://api.example/v1");
    cr_expect_eq(cfg->upstreams[0].timeout_ms, 45000);
    cr_expect_str_eq(cfg->upstreams[0].headers[0].value, "A-A$ $x {SLUICE_T_A}");
    cr_expect_eq(cfg->upstreams[0].headers[0].from_env, true);
    cr_expect_eq(cfg->upstreams[0].headers[1].from_env, false);
    config_free(cfg);
}

Test(config_env, unset_variable_is_an_error_at_the_scalar)
{
    unsetenv("SLUICE_T_SURELY_UNSET_1");
    expect_first_error(
        "upstreams:\n"
        "  up: { url: \"http://${SLUICE_T_SURELY_UNSET_1}/\" }\n"
        "routes: [ { prefix: /, upstream: up } ]\n",
        "test.yaml:2:14: upstreams.up.url: environment variable "
        "\"SLUICE_T_SURELY_UNSET_1\" is not set");
}

Test(config_env, malformed_references)
{
    expect_first_error("upstreams: { up: { url: \"http://${HOST\" } }\n"
                       "routes: [ { prefix: /, upstream: up } ]\n",
                       "test.yaml:1:25: upstreams.up.url: unterminated \"${\" "
                       "in \"http://${HOST\"");
    expect_first_error("upstreams: { up: { url: \"http://${1X}\" } }\n"
                       "routes: [ { prefix: /, upstream: up } ]\n",
                       "test.yaml:1:25: upstreams.up.url: invalid variable "
                       "name \"${1X}\"");
    expect_first_error("upstreams: { up: { url: \"http://${}\" } }\n"
                       "routes: [ { prefix: /, upstream: up } ]\n",
                       "test.yaml:1:25: upstreams.up.url: invalid variable "
                       "name \"${}\"");
}

/* ${NAME:?} as in sh: an empty value is refused too (an empty secret would
 * otherwise go out as "Bearer "), with the text after "?" as the reason. */
Test(config_env, required_variable_refuses_empty)
{
    struct sc_config *cfg;

    setenv("SLUICE_T_EMPTY", "", 1);
    setenv("SLUICE_T_TOKEN", "tok", 1);
    unsetenv("SLUICE_T_SURELY_UNSET_2");
    expect_first_error(
        "upstreams:\n"
        "  up: { url: \"http://h/\", headers: { Authorization: \"Bearer ${SLUICE_T_EMPTY:?}\" } }\n"
        "routes: [ { prefix: /, upstream: up } ]\n",
        "test.yaml:2:53: upstreams.up.headers.Authorization: environment variable "
        "\"SLUICE_T_EMPTY\" is set but empty, which ${SLUICE_T_EMPTY:?} refuses");
    expect_first_error(
        "upstreams:\n"
        "  up: { url: \"http://h/\", headers: { X-K: \"${SLUICE_T_EMPTY:?the partner key}\" } }\n"
        "routes: [ { prefix: /, upstream: up } ]\n",
        "test.yaml:2:43: upstreams.up.headers.X-K: environment variable "
        "\"SLUICE_T_EMPTY\" is set but empty, which ${SLUICE_T_EMPTY:?} refuses: "
        "the partner key");
    expect_first_error(
        "upstreams:\n"
        "  up: { url: \"http://h/\", headers: { X-K: \"${SLUICE_T_SURELY_UNSET_2:?the key}\" } }\n"
        "routes: [ { prefix: /, upstream: up } ]\n",
        "test.yaml:2:43: upstreams.up.headers.X-K: environment variable "
        "\"SLUICE_T_SURELY_UNSET_2\" is not set: the key");
    /* Set and not empty: expanded as ${NAME}; a plain ${NAME} still takes "". */
    cfg = load_ok(
        "upstreams:\n"
        "  up: { url: \"http://h/\", headers: { A: \"Bearer ${SLUICE_T_TOKEN:?}\", "
        "B: \"x${SLUICE_T_EMPTY}y\" } }\n"
        "routes: [ { prefix: /, upstream: up } ]\n");
    cr_expect_str_eq(cfg->upstreams[0].headers[0].value, "Bearer tok");
    cr_expect_str_eq(cfg->upstreams[0].headers[1].value, "xy");
    config_free(cfg);
}

/* ---- errors ------------------------------------------------------------------- */

/* A value out of bounds is one error: the block check that would compare
 * what was left in its place ("0s is less than pause") stays quiet, and so
 * does the lease check after a lease that did not parse. Two checks' errors
 * at one place still both show. */
Test(config_errors, no_cascade_after_a_bad_value)
{
    size_t n = 0;
    char *all = load_fail(
        "upstreams: { up: { url: \"http://h/\" } }\n"
        "policies:\n"
        "  p:\n"
        "    rate: 1/s\n"
        "    breaker: { pause: 1s, max_pause: 2h }\n"
        "    idempotency: { lease: 5x }\n"
        "routes: [ { prefix: /, upstream: up, policy: p } ]\n", &n);

    cr_expect_eq(n, 2, "%s", all);
    cr_expect_str_eq(all,
        "test.yaml:5:38: policies.p.breaker.max_pause: must be at most 1h, got \"2h\"\n"
        "test.yaml:6:27: policies.p.idempotency.lease: invalid duration \"5x\" (expected a "
        "number followed by ms, s, m, h or d)\n");
    free(all);
}

/* A key of an upstream or a policy written at the level of their names (the
 * block above it lacks an indent) is said to be one, when the entry does not
 * work as a block of its own; a policy may still be called "shared". */
Test(config_errors, block_key_read_as_a_name_gets_an_indentation_hint)
{
    struct sc_config *cfg;
    size_t n = 0;
    char *all = load_fail(
        "upstreams:\n"
        "  up:\n"
        "    url: http://h/\n"
        "  timeout: 5s\n"
        "policies:\n"
        "  p:\n"
        "    rate: 1/s\n"
        "  idempotency:\n"
        "    required: false\n"
        "routes: [ { prefix: /, upstream: up, policy: p } ]\n", &n);

    cr_expect_eq(n, 3, "%s", all);
    cr_expect_str_eq(all,
        "test.yaml:4:3: upstreams: \"timeout\" is a key of an upstream, read here as the "
        "name of one: if it belongs to the upstream above, indent it one level deeper\n"
        "test.yaml:8:3: policies: \"idempotency\" is a key of a policy, read here as the "
        "name of one: if it belongs to the policy above, indent it one level deeper\n"
        "test.yaml:9:5: unknown key \"required\" in policies.idempotency\n");
    free(all);
    cfg = load_ok("upstreams: { up: { url: http://h/ } }\n"
                  "policies: { shared: { concurrency: 2 }, retry: {} }\n"
                  "routes: [ { prefix: /, upstream: up, policy: shared } ]\n");
    cr_expect_eq(cfg->n_policies, 2);
    config_free(cfg);
}

Test(config_errors, every_error_is_collected_and_sorted)
{
    size_t n = 0;
    char *all = load_fail(
        "routes:\n"
        "  - { prefix: /, upstream: nope }\n"
        "threads: 999\n"
        "upstreams:\n"
        "  up: { url: http://h, timeout: 30x, burts: 1 }\n"
        "log: { level: loud }\n", &n);

    cr_expect_eq(n, 5, "%s", all);
    cr_expect_str_eq(all,
        "test.yaml:2:28: routes[0].upstream: unknown upstream \"nope\"\n"
        "test.yaml:3:10: threads: must be at most 256, got \"999\"\n"
        "test.yaml:5:33: upstreams.up.timeout: invalid duration \"30x\" "
        "(expected a number followed by ms, s, m, h or d)\n"
        "test.yaml:5:38: unknown key \"burts\" in upstreams.up\n"
        "test.yaml:6:15: log.level: invalid value \"loud\" (expected error, "
        "warn, info or debug)\n");
    free(all);
}

Test(config_errors, unknown_keys_suggest_the_nearest)
{
    expect_first_error("listn: 127.0.0.1:8080\n" MINIMAL,
                       "test.yaml:1:1: unknown key \"listn\" (did you mean "
                       "\"listen\"?)");
    expect_first_error(MINIMAL "policies: { partner-writes: { burts: 5 } }\n",
                       "test.yaml:5:31: unknown key \"burts\" in "
                       "policies.partner-writes (did you mean \"burst\"?)");
    expect_first_error(MINIMAL "xyzzy: 1\n", "test.yaml:5:1: unknown key \"xyzzy\"");
    expect_first_error(MINIMAL "Threads: 1\n",
                       "test.yaml:5:1: unknown key \"Threads\" (did you mean "
                       "\"threads\"?)");
}

Test(config_errors, out_is_null_and_errs_may_be_null)
{
    struct sc_config *cfg = (struct sc_config *)1;

    cr_expect_eq(config_load_string("x", "threads: -1\n", 12, &cfg, NULL), -EINVAL);
    cr_expect_null(cfg);
    cr_expect_eq(config_load_string("x", MINIMAL, strlen(MINIMAL), &cfg, NULL), 0);
    cr_expect_not_null(cfg);
    config_free(cfg);
    config_free(NULL);
}

Test(config_errors, errors_are_appended_after_the_callers)
{
    struct sc_errors errs = {0};
    struct sc_config *cfg;

    sc_errors_add(&errs, "earlier", 99, 1, "kept first");
    cr_expect(config_load_string("x", "threads: -1\n", 12, &cfg, &errs) < 0);
    /* threads, and the missing upstreams and routes, after the caller's */
    cr_assert_eq(errs.n, 4);
    cr_expect_str_eq(errs.v[0].text, "kept first");
    cr_expect_eq(errs.v[1].line, 1);
    cr_expect_eq(errs.v[1].col, 1);
    cr_expect_eq(errs.v[3].col, 10);
    sc_errors_free(&errs);
}

Test(config_errors, unreadable_file_names_path_and_reason)
{
    struct sc_errors errs = {0};
    struct sc_config *cfg = (struct sc_config *)1;
    char line[512];

    cr_expect_eq(config_load_file("/nonexistent/sluice.yaml", &cfg, &errs), -ENOENT);
    cr_expect_null(cfg);
    cr_assert_eq(errs.n, 1);
    sc_error_format(&errs.v[0], line, sizeof line);
    cr_expect_str_eq(line, "/nonexistent/sluice.yaml: cannot read the "
                     "configuration: No such file or directory");
    sc_errors_free(&errs);
}

Test(config_errors, file_errors_use_the_path)
{
    char *dir = tu_mkdtemp("cfg"), *path;
    struct sc_errors errs = {0};
    struct sc_config *cfg;
    char line[512], want[512];

    path = tu_write_file(dir, "bad.yaml", "threads: many\n" MINIMAL);
    cr_expect_eq(config_load_file(path, &cfg, &errs), -EINVAL);
    cr_assert(errs.n >= 1);
    sc_error_format(&errs.v[0], line, sizeof line);
    snprintf(want, sizeof want, "%s:1:10: threads: invalid number \"many\" "
             "(expected a whole number)", path);
    cr_expect_str_eq(line, want);
    sc_errors_free(&errs);
    free(path);
    tu_rm_rf(dir);
    free(dir);
}

/* ---- JSON --------------------------------------------------------------------- */

static const char REDACT[] =
    "admin_token: \"${SLUICE_T_ADMIN}\"\n"
    "store: { url: \"redis://default:hunter2@10.0.0.5:6379/0\" }\n"
    "upstreams:\n"
    "  up:\n"
    "    url: https://api.example/base\n"
    "    timeout: 250ms\n"
    "    proxy: \"http://egress:pr%40xy-hunter3@10.0.0.9:3128\"\n"
    "    headers:\n"
    "      Authorization: \"Bearer ${SLUICE_T_SECRET}\"\n"
    "      X-Static: plain-value-also-hidden\n"
    "policies:\n"
    "  p: { rate: 600/m, burst: 3, idempotency: { lease: 90s, replay_statuses: [2xx, 409] } }\n"
    "routes:\n"
    "  - { name: r, prefix: /v1, upstream: up, policy: p, methods: [POST] }\n"
    "  - { prefix: /, upstream: up, timeout: 2m }\n";

static json_t *to_json(const struct sc_config *cfg, char **text)
{
    json_error_t jerr;
    json_t *root;

    *text = config_to_json(cfg);
    cr_assert_not_null(*text);
    root = json_loads(*text, 0, &jerr);
    cr_assert_not_null(root, "%s", jerr.text);
    return root;
}

Test(config_json, secrets_are_redacted)
{
    struct sc_config *cfg;
    json_t *root, *h;
    char *text;

    setenv("SLUICE_T_SECRET", "tok-123456", 1);
    setenv("SLUICE_T_ADMIN", "adm-7890abcdef", 1);
    cfg = load_ok(REDACT);
    cr_expect_str_eq(cfg->admin_token, "adm-7890abcdef");
    root = to_json(cfg, &text);
    cr_expect_null(strstr(text, "tok-123456"));
    cr_expect_null(strstr(text, "adm-7890abcdef"));
    cr_expect_str_eq(json_string_value(json_object_get(root, "admin_token")), "<redacted>");
    cr_expect_null(strstr(text, "hunter2"));
    cr_expect_null(strstr(text, "plain-value-also-hidden"));
    h = json_object_get(json_object_get(json_object_get(json_object_get(
            root, "upstreams"), "up"), "headers"), "Authorization");
    cr_expect_str_eq(json_string_value(h), "<redacted>");
    cr_expect_str_eq(json_string_value(json_object_get(json_object_get(root,
                     "store"), "url")), "redis://default:<redacted>@10.0.0.5:6379/0");
    cr_expect_null(strstr(text, "hunter3"));
    cr_expect_str_eq(json_string_value(json_object_get(json_object_get(json_object_get(
                     root, "upstreams"), "up"), "proxy")),
                     "http://egress:<redacted>@10.0.0.9:3128");
    json_decref(root);
    free(text);
    config_free(cfg);
}

Test(config_json, every_key_in_config_syntax)
{
    struct sc_config *cfg;
    json_t *root, *pol, *idem, *r0, *r1;
    char *text;

    setenv("SLUICE_T_SECRET", "x", 1);
    setenv("SLUICE_T_ADMIN", "", 1);
    cfg = load_ok(REDACT);
    root = to_json(cfg, &text);
    cr_expect_str_eq(json_string_value(json_object_get(root, "admin_token")), "",
                     "an empty token shows that it is off");
    cr_expect_str_eq(json_string_value(json_object_get(root, "listen")), "127.0.0.1:8080");
    cr_expect_eq(json_integer_value(json_object_get(root, "threads")), 0);
    cr_expect_str_eq(json_string_value(json_object_get(json_object_get(root,
                     "limits"), "max_body")), "8MiB");
    cr_expect_str_eq(json_string_value(json_object_get(json_object_get(json_object_get(
                     root, "upstreams"), "up"), "timeout")), "250ms");
    pol = json_object_get(json_object_get(root, "policies"), "p");
    cr_expect_str_eq(json_string_value(json_object_get(pol, "rate")), "10/s");
    cr_expect_eq(json_integer_value(json_object_get(pol, "burst")), 3);
    cr_expect(json_is_null(json_object_get(pol, "partition")));
    cr_expect_str_eq(json_string_value(json_object_get(json_object_get(pol,
                     "retry"), "max_delay")), "7d");
    idem = json_object_get(pol, "idempotency");
    cr_expect_str_eq(json_string_value(json_object_get(idem, "lease")), "90s");
    cr_expect_eq(json_array_size(json_object_get(idem, "replay_statuses")), 2);
    cr_expect_eq(json_integer_value(json_array_get(json_object_get(idem,
                 "replay_statuses"), 1)), 409);
    r0 = json_array_get(json_object_get(root, "routes"), 0);
    r1 = json_array_get(json_object_get(root, "routes"), 1);
    cr_expect_str_eq(json_string_value(json_object_get(r0, "policy")), "p");
    cr_expect_str_eq(json_string_value(json_array_get(json_object_get(r0,
                     "methods"), 0)), "POST");
    cr_expect(json_is_null(json_object_get(r1, "policy")));
    cr_expect(json_is_null(json_object_get(r1, "methods")));
    cr_expect_str_eq(json_string_value(json_object_get(r1, "name")), "/");
    cr_expect(json_is_null(json_object_get(r0, "timeout")), "no timeout: null");
    cr_expect_str_eq(json_string_value(json_object_get(r1, "timeout")), "2m");
    cr_expect_eq(json_object_size(root), 11);
    json_decref(root);
    free(text);
    config_free(cfg);
}

Test(config_json, breaker_block_defaults_values_and_json)
{
    struct sc_config *cfg = load_ok(
        "upstreams: {u: {url: http://127.0.0.1:9}}\n"
        "policies:\n"
        "  a: {rate: 10/s, breaker: {}}\n"
        "  b: {rate: 10/s, breaker: {failures: 2, pause: 250ms, max_pause: 10s}}\n"
        "  c: {rate: 10/s}\n"
        "routes: [{prefix: /, upstream: u, policy: a}]\n");
    json_t *root, *ba;
    char *text;

    cr_expect_eq(cfg->policies[0].breaker.enabled, true);
    cr_expect_eq(cfg->policies[0].breaker.failures, 5);
    cr_expect_eq(cfg->policies[0].breaker.pause_ms, 1000);
    cr_expect_eq(cfg->policies[0].breaker.max_pause_ms, 60000);
    cr_expect_eq(cfg->policies[1].breaker.failures, 2);
    cr_expect_eq(cfg->policies[1].breaker.pause_ms, 250);
    cr_expect_eq(cfg->policies[1].breaker.max_pause_ms, 10000);
    cr_expect_eq(cfg->policies[2].breaker.enabled, false);
    cr_expect_eq(cfg->default_policy.breaker.enabled, false);
    root = to_json(cfg, &text);
    ba = json_object_get(json_object_get(json_object_get(root, "policies"), "a"), "breaker");
    cr_expect_eq(json_integer_value(json_object_get(ba, "failures")), 5);
    cr_expect_str_eq(json_string_value(json_object_get(ba, "max_pause")), "1m");
    cr_expect(json_is_null(json_object_get(json_object_get(json_object_get(root,
              "policies"), "c"), "breaker")));
    json_decref(root);
    free(text);
    config_free(cfg);
}

Test(config_json, duplicates_and_verify_values_and_json)
{
    struct sc_config *cfg = load_ok(
        "upstreams: {u: {url: http://127.0.0.1:9}}\n"
        "policies:\n"
        "  a:\n"
        "    idempotency:\n"
        "      duplicates: wait\n"
        "      verify:\n"
        "        method: HEAD\n"
        "        path: /v1/orders/{key}?expand={key}\n"
        "        found: [201, 200]\n"
        "        absent: [404, 410]\n"
        "        after: 250ms\n"
        "        attempts: 5\n"
        "  b: {idempotency: {verify: }}\n"
        "routes: [{prefix: /, upstream: u, policy: a}]\n");
    const struct sc_idempotency *a = &cfg->policies[0].idem, *b = &cfg->policies[1].idem;
    json_t *root, *va, *found;
    char *text;

    cr_expect_eq(a->duplicates, SC_DUP_WAIT);
    cr_expect_eq(a->verify.enabled, true);
    cr_expect_eq(a->verify.method, SC_M_HEAD);
    cr_expect_str_eq(a->verify.path, "/v1/orders/{key}?expand={key}");
    for (int s = 100; s < 600; s++) {
        cr_expect_eq(sc_verify_found(&a->verify, s), s == 200 || s == 201, "%d", s);
        cr_expect_eq(sc_verify_absent(&a->verify, s), s == 404 || s == 410, "%d", s);
    }
    cr_expect_eq(a->verify.after_ms, 250);
    cr_expect_eq(a->verify.attempts, 5);
    cr_expect_eq(a->verify.pos.line, 6);
    cr_expect_eq(b->verify.enabled, false, "verify: with no value is not given");
    cr_expect_eq(b->duplicates, SC_DUP_REFUSE);
    cr_expect_not(sc_verify_found(NULL, 200));

    root = to_json(cfg, &text);
    va = json_object_get(json_object_get(json_object_get(json_object_get(root,
             "policies"), "a"), "idempotency"), "verify");
    cr_expect_str_eq(json_string_value(json_object_get(json_object_get(json_object_get(
                     json_object_get(root, "policies"), "a"), "idempotency"),
                     "duplicates")), "wait");
    cr_expect_str_eq(json_string_value(json_object_get(va, "method")), "HEAD");
    cr_expect_str_eq(json_string_value(json_object_get(va, "path")),
                     "/v1/orders/{key}?expand={key}");
    found = json_object_get(va, "found");
    cr_expect_eq(json_array_size(found), 2);
    cr_expect_eq(json_integer_value(json_array_get(found, 0)), 200, "ascending codes");
    cr_expect_eq(json_integer_value(json_array_get(found, 1)), 201);
    cr_expect_str_eq(json_string_value(json_object_get(va, "after")), "250ms");
    cr_expect_eq(json_integer_value(json_object_get(va, "attempts")), 5);
    cr_expect(json_is_null(json_object_get(json_object_get(json_object_get(json_object_get(
              root, "policies"), "b"), "idempotency"), "verify")));
    json_decref(root);
    free(text);
    config_free(cfg);
}

/* Fleet mode takes both (contract §11, §6): the marks are Redis scripts and
 * a duplicate waits for another sidecar's record. */
Test(config_json, verify_and_duplicates_wait_load_with_the_redis_store)
{
    struct sc_config *cfg = load_ok(
        "store: {backend: redis, url: \"redis://127.0.0.1:6379\"}\n"
        "upstreams: {u: {url: http://127.0.0.1:9}}\n"
        "policies:\n"
        "  a:\n"
        "    rate: 10/s\n"
        "    shared: redis\n"
        "    idempotency:\n"
        "      duplicates: wait\n"
        "      verify: {path: \"/v1/orders?client_ref={key}\"}\n"
        "routes: [{prefix: /, upstream: u, policy: a}]\n");

    cr_expect_eq(cfg->store.backend, SC_BACKEND_REDIS);
    cr_expect_eq(cfg->policies[0].idem.duplicates, SC_DUP_WAIT);
    cr_expect(cfg->policies[0].idem.verify.enabled);
    config_free(cfg);
}

/* Each status is checked: 429 and a shared one, both reported at their
 * elements in one pass. */
Test(config_errors, verify_statuses_reported_together)
{
    size_t n;
    char *all = load_fail(
        "upstreams: {u: {url: http://127.0.0.1:9}}\n"
        "policies:\n"
        "  a:\n"
        "    idempotency:\n"
        "      verify:\n"
        "        path: /o?ref={key}\n"
        "        found: [200, 429, 202]\n"
        "        absent: [202, 404]\n"
        "routes: [{prefix: /, upstream: u, policy: a}]\n", &n);

    cr_expect_eq(n, 2, "%s", all);
    cr_expect_str_eq(all,
        "test.yaml:7:22: policies.a.idempotency.verify.found: 429 cannot be listed: "
        "a 429 says nothing about the operation (the lookup was rate limited, and "
        "counts as failed)\n"
        "test.yaml:8:18: policies.a.idempotency.verify.absent: 202 is also in found: "
        "a lookup's answer cannot mean both\n");
    free(all);
}

/* JSON is YAML: the effective config loads back to the same effective
 * config (redacted values included, as plain strings). */
Test(config_json, loads_back_to_itself)
{
    struct sc_config *a, *b;
    char *ja, *jb;

    setenv("SLUICE_T_SECRET", "x", 1);
    setenv("SLUICE_T_ADMIN", "z", 1);
    setenv("PARTNER_TOKEN", "y", 1);
    a = load_ok(REDACT);
    ja = config_to_json(a);
    b = load_ok(ja);
    jb = config_to_json(b);
    cr_expect_str_eq(ja, jb);
    free(ja);
    free(jb);
    config_free(a);
    config_free(b);

    a = load_file_ok(SLUICE_SOURCE_DIR "/tests/config/valid/full.yaml");
    ja = config_to_json(a);
    b = load_ok(ja);
    jb = config_to_json(b);
    cr_expect_str_eq(ja, jb);
    free(ja);
    free(jb);
    config_free(a);
    config_free(b);
}

Test(config_json, null_config)
{
    cr_expect_null(config_to_json(NULL));
}

/* ---- egress: client certificates, proxies, route timeouts ---------------------- */

/* Two key pairs made by the openssl command in a temp dir: a.pem/a.key and
 * b.pem/b.key (self-signed; the check reads them, it does not verify). */
static char *make_pairs(void)
{
    char *dir = tu_mkdtemp("pairs"), cmd[2048];

    cr_assert_not_null(dir);
    snprintf(cmd, sizeof cmd,
             "cd %s && for n in a b; do openssl req -x509 -newkey ec "
             "-pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout $n.key "
             "-out $n.pem -days 1 -subj /CN=client-$n >/dev/null 2>&1 || exit 1; "
             "done && printf 'not a pem\n' > junk.pem", dir);
    cr_assert_eq(system(cmd), 0, "openssl failed");
    return dir;
}

static char *tls_config(const char *dir, const char *cert, const char *key)
{
    char *yaml;

    cr_assert(asprintf(&yaml,
        "upstreams:\n"
        "  partner:\n"
        "    url: https://api.partner.example\n"
        "    tls:\n"
        "      cert_file: %s/%s\n"
        "      key_file: %s/%s\n"
        "routes: [{prefix: /, upstream: partner}]\n",
        dir, cert, dir, key) > 0);
    return yaml;
}

Test(config_egress, client_pair_loads)
{
    char *dir = make_pairs(), *yaml = tls_config(dir, "a.pem", "a.key"), *want;
    struct sc_config *cfg = load_ok(yaml);

    cr_assert(asprintf(&want, "%s/a.pem", dir) > 0);
    cr_expect_str_eq(cfg->upstreams[0].tls.cert_file, want);
    cr_expect_eq(cfg->upstreams[0].tls.key_pos.line, 6);
    config_free(cfg);
    free(want);
    free(yaml);
    tu_rm_rf(dir);
    free(dir);
}

Test(config_egress, mismatched_pair_is_refused_at_the_key)
{
    char *dir = make_pairs(), *yaml = tls_config(dir, "a.pem", "b.key"), *want;
    char *all = load_fail(yaml, NULL);

    cr_assert(asprintf(&want, "test.yaml:6:17: upstreams.partner.tls.key_file: "
                       "\"%s/b.key\" is not the private key of cert_file "
                       "\"%s/a.pem\"\n", dir, dir) > 0);
    cr_expect_str_eq(all, want);
    free(all);
    free(want);
    free(yaml);
    tu_rm_rf(dir);
    free(dir);
}

Test(config_egress, a_file_that_is_no_pem_is_refused)
{
    char *dir = make_pairs(), *yaml = tls_config(dir, "junk.pem", "junk.pem"), *want;
    char *all = load_fail(yaml, NULL);

    cr_assert(asprintf(&want,
        "test.yaml:5:18: upstreams.partner.tls.cert_file: \"%s/junk.pem\" holds no "
        "PEM certificate\n"
        "test.yaml:6:17: upstreams.partner.tls.key_file: \"%s/junk.pem\" holds no "
        "PEM private key (an encrypted key is not supported)\n", dir, dir) > 0);
    cr_expect_str_eq(all, want);
    free(all);
    free(want);
    free(yaml);
    tu_rm_rf(dir);
    free(dir);
}

Test(config_egress, proxy_url_parts)
{
    struct sc_proxy_url p;
    struct sc_error err = {0};
    char buf[256];

    cr_assert_eq(config_proxy_url_parse("http://us%3Aer:p%40ss:w@[::1]:3128/", &p,
                                        buf, sizeof buf, &err), 0, "%s", err.text);
    cr_expect_str_eq(p.host, "::1");
    cr_expect_eq(p.port, 3128);
    cr_expect_str_eq(p.user, "us:er");
    cr_expect_str_eq(p.password, "p@ss:w");
    cr_assert_eq(config_proxy_url_parse("http://proxy:8080", &p, buf, sizeof buf,
                                        &err), 0);
    cr_expect_null(p.user);
    cr_expect_eq(config_proxy_url_parse("http://u:secret@proxy:8080/x", &p, buf,
                                        sizeof buf, &err), -EINVAL);
    cr_expect_null(strstr(err.text, "secret"), "%s", err.text);
    cr_expect_eq(config_proxy_url_parse("socks5://proxy:1080", &p, buf, sizeof buf,
                                        &err), -EINVAL);
}

Test(config_egress, route_timeout_replaces_the_upstreams)
{
    struct sc_config *cfg = load_ok(
        "upstreams: {u: {url: http://127.0.0.1:9, timeout: 5s}}\n"
        "routes:\n"
        "  - {prefix: /bulk, upstream: u, timeout: 2m}\n"
        "  - {prefix: /small, upstream: u, timeout: 300ms}\n"
        "  - {prefix: /, upstream: u, timeout: \"\"}\n");

    cr_expect_eq(sc_route_timeout(&cfg->routes[0], cfg->routes[0].up), 120000);
    cr_expect_eq(sc_route_timeout(&cfg->routes[1], cfg->routes[1].up), 300);
    cr_expect_eq(cfg->routes[2].has_timeout, false);
    cr_expect_eq(sc_route_timeout(&cfg->routes[2], cfg->routes[2].up), 5000);
    config_free(cfg);
}

/* The lease is checked against each route's own timeout: a short one
 * lets a long lease pass where the upstream's would not, and the reverse. */
Test(config_egress, lease_against_route_timeouts)
{
    char *all;
    struct sc_config *cfg = load_ok(
        "upstreams: {u: {url: http://127.0.0.1:9, timeout: 5m}}\n"
        "policies: {p: {idempotency: {lease: 60s}}}\n"
        "routes: [{prefix: /, upstream: u, policy: p, timeout: 30s}]\n");

    config_free(cfg);
    all = load_fail(
        "upstreams: {u: {url: http://127.0.0.1:9, timeout: 5s}}\n"
        "policies: {p: {idempotency: {}}}\n"
        "routes:\n"
        "  - {prefix: /a, upstream: u, policy: p, timeout: 60s}\n"
        "  - {prefix: /b, upstream: u, policy: p, timeout: 90s}\n"
        "  - {prefix: /c, upstream: u, policy: p}\n", NULL);
    cr_expect_str_eq(all,
        "test.yaml:2:16: policies.p.idempotency: the default lease (1m) must be "
        "longer than the timeout of route \"/a\" (1m); set lease\n"
        "test.yaml:2:16: policies.p.idempotency: the default lease (1m) must be "
        "longer than the timeout of route \"/b\" (90s); set lease\n");
    free(all);
}

/* ---- quota and lanes ---------------------------------------------------------- */

#define QUOTA_LANES SLUICE_SOURCE_DIR "/tests/config/valid/quota-lanes.yaml"

Test(config_quota_lanes, values_and_defaults)
{
    struct sc_config *cfg = load_file_ok(QUOTA_LANES);
    const struct sc_policy *w = &cfg->policies[0], *r = &cfg->policies[1];
    const struct sc_policy *plain = &cfg->policies[2];

    cr_expect(w->quota.enabled);
    cr_expect(w->quota.follow);
    cr_expect_float_eq(w->quota.min_rate, 0.5, 1e-12);
    cr_expect_eq(w->quota.min_rate_pos.line, 13);
    cr_assert_eq(w->n_lanes, 2);
    cr_expect_str_eq(w->lanes[0].name, "interactive");
    cr_expect_float_eq(w->lanes[0].share, 30.0, 1e-12);
    cr_expect_eq(w->lanes[0].max_wait_ms, 2000);
    cr_expect_str_eq(w->lanes[1].name, "batch");
    cr_expect_eq(w->lanes[1].max_wait_ms, 30000);
    cr_expect_str_eq(w->lane_header, "X-Lane");
    cr_expect_eq(w->lanes_pos.line, 14, "the key's line, not its first item's");

    /* quota: {} is present and follows nothing; min_rate is rate / 100. */
    cr_expect(r->quota.enabled);
    cr_expect_not(r->quota.follow);
    cr_expect_float_eq(r->quota.min_rate, 0.1, 1e-12);
    cr_expect_eq(r->quota.min_rate_pos.line, 0);
    cr_assert_eq(r->n_lanes, 2);
    cr_expect_float_eq(r->lanes[0].share, 12.5, 1e-12);
    cr_expect_eq(r->lanes[0].max_wait_ms, 3000, "the policy's max_wait");
    cr_expect_eq(r->lanes[1].max_wait_ms, 3000);
    cr_expect_str_eq(r->lane_header, "Sluice-Lane");

    cr_expect_not(plain->quota.enabled);
    cr_expect_float_eq(plain->quota.min_rate, 0.01, 1e-12, "set for any rate");
    cr_expect_eq(plain->n_lanes, 0);
    cr_expect_null(plain->lanes);
    cr_expect_str_eq(plain->lane_header, "Sluice-Lane");
    cr_expect_not(cfg->default_policy.quota.enabled);
    cr_expect_eq(cfg->default_policy.n_lanes, 0);
    config_free(cfg);
}

/* Lanes and a followed quota with the fleet's slots, and in shadow mode:
 * each loads, nothing refused (docs/contract.md §12, §13). */
#define FLEET_HEAD \
    "store: { backend: redis, url: \"redis://127.0.0.1:6379\" }\n" \
    "upstreams: { partner: { url: \"http://127.0.0.1:9\" } }\n" \
    "routes: [{ prefix: /, upstream: partner, policy: p }]\n"

Test(config_quota_lanes, lanes_and_follow_load_with_the_fleets_slots)
{
    struct sc_config *cfg = load_ok(FLEET_HEAD
        "policies:\n"
        "  p:\n"
        "    rate: 10/s\n"
        "    shared: redis\n"
        "    concurrency: 4\n"
        "    quota: { follow: true }\n"
        "    lanes: [{ name: interactive, share: 30% }, { name: batch, share: 70% }]\n");

    cr_expect_eq(cfg->policies[0].shared, SC_SHARED_REDIS);
    cr_expect_eq(cfg->policies[0].concurrency, 4);
    cr_expect(cfg->policies[0].quota.follow);
    cr_expect_eq(cfg->policies[0].n_lanes, 2);
    config_free(cfg);
    cfg = load_ok(FLEET_HEAD
        "policies: { p: { rate: 10/s, shared: redis, concurrency: 2,\n"
        "                 quota: { follow: true } } }\n");
    cr_expect(cfg->policies[0].quota.follow);
    cr_expect_eq(cfg->policies[0].n_lanes, 0);
    config_free(cfg);
}

Test(config_quota_lanes, lanes_and_follow_load_in_shadow_mode)
{
    struct sc_config *cfg = load_ok(
        "upstreams: { partner: { url: \"http://127.0.0.1:9\" } }\n"
        "routes: [{ prefix: /, upstream: partner, policy: p }]\n"
        "policies:\n"
        "  p:\n"
        "    rate: 10/s\n"
        "    mode: shadow\n"
        "    quota: { follow: true }\n"
        "    lanes: [{ name: interactive, share: 30% }, { name: batch, share: 70% }]\n");

    cr_expect_eq(cfg->policies[0].mode, SC_MODE_SHADOW);
    cr_expect(cfg->policies[0].quota.follow);
    cr_expect_eq(cfg->policies[0].n_lanes, 2);
    config_free(cfg);
}

Test(config_quota_lanes, a_route_lane_is_resolved_or_defaulted)
{
    struct sc_config *cfg = load_file_ok(QUOTA_LANES);
    const struct sc_route *rt = cfg->routes;

    cr_assert_eq(cfg->n_routes, 6);
    cr_expect_str_eq(rt[0].lane, "batch");
    cr_expect_eq(rt[0].lane_index, 1);
    cr_expect_eq(rt[0].lane_pos.line, 31);
    cr_expect_str_eq(rt[1].lane, "interactive");
    cr_expect_eq(rt[1].lane_index, 0);
    cr_expect_str_eq(rt[2].lane, "batch", "default: the policy's last lane");
    cr_expect_eq(rt[2].lane_index, 1);
    cr_expect_str_eq(rt[3].lane, "later");
    cr_expect_eq(rt[3].lane_index, 1);
    cr_expect_null(rt[4].lane, "a policy without lanes: no lane");
    cr_expect_eq(rt[4].lane_index, -1);
    cr_expect_null(rt[5].lane, "lane: \"\" is not given");
    cr_expect_eq(rt[5].lane_index, -1);
    config_free(cfg);
}

Test(config_quota_lanes, json_shows_the_effective_values)
{
    struct sc_config *cfg = load_file_ok(QUOTA_LANES);
    json_t *root, *pols, *w, *r, *lanes, *routes;
    char *text, *again;
    struct sc_config *back;

    root = to_json(cfg, &text);
    pols = json_object_get(root, "policies");
    w = json_object_get(pols, "partner-writes");
    r = json_object_get(pols, "partner-reads");
    cr_expect_eq(json_is_true(json_object_get(json_object_get(w, "quota"), "follow")), true);
    cr_expect_str_eq(json_string_value(json_object_get(json_object_get(w, "quota"),
                     "min_rate")), "0.5/s");
    cr_expect_str_eq(json_string_value(json_object_get(json_object_get(r, "quota"),
                     "min_rate")), "0.1/s");
    cr_expect(json_is_null(json_object_get(json_object_get(pols, "plain"), "quota")));
    lanes = json_object_get(r, "lanes");
    cr_assert_eq(json_array_size(lanes), 2);
    cr_expect_str_eq(json_string_value(json_object_get(json_array_get(lanes, 0),
                     "share")), "12.5%");
    cr_expect_str_eq(json_string_value(json_object_get(json_array_get(lanes, 1),
                     "max_wait")), "3s");
    cr_expect_str_eq(json_string_value(json_object_get(w, "lane_header")), "X-Lane");
    routes = json_object_get(root, "routes");
    cr_expect_str_eq(json_string_value(json_object_get(json_array_get(routes, 2),
                     "lane")), "batch");
    cr_expect(json_is_null(json_object_get(json_array_get(routes, 4), "lane")));
    /* And it loads back to itself, defaults now written out. */
    back = load_ok(text);
    again = config_to_json(back);
    cr_expect_str_eq(again, text);
    free(again);
    config_free(back);
    json_decref(root);
    free(text);
    config_free(cfg);
}

Test(config_quota_lanes, an_empty_lanes_list_is_no_lanes)
{
    struct sc_config *cfg = load_ok(
        "upstreams: {u: {url: http://127.0.0.1:9}}\n"
        "policies: {p: {rate: 1/s, lanes: []}}\n"
        "routes: [{prefix: /, upstream: u, policy: p}]\n");

    cr_expect_eq(cfg->policies[0].n_lanes, 0);
    cr_expect_eq(cfg->routes[0].lane_index, -1);
    config_free(cfg);
}

Test(config_quota_lanes, shares_may_be_decimals_that_add_up)
{
    struct sc_config *cfg = load_ok(
        "upstreams: {u: {url: http://127.0.0.1:9}}\n"
        "policies:\n"
        "  p:\n"
        "    rate: 1/s\n"
        "    lanes: [{name: a, share: 33.3%}, {name: b, share: 33.3%},\n"
        "            {name: c, share: 33.4%}]\n"
        "routes: [{prefix: /, upstream: u, policy: p, lane: a}]\n");

    cr_expect_eq(cfg->policies[0].n_lanes, 3);
    cr_expect_eq(cfg->routes[0].lane_index, 0);
    config_free(cfg);
}

/* Every problem of a lanes block at once, each at its line; a route on an
 * unknown policy says only that, not also that its lane is unknown. */
Test(config_quota_lanes, every_lane_error_is_listed)
{
    char *all = load_fail(
        "upstreams: {u: {url: http://127.0.0.1:9}}\n"
        "policies:\n"
        "  p:\n"
        "    rate: 1/s\n"
        "    lanes:\n"
        "      - {name: a, share: 50%}\n"
        "      - {name: a, share: 40%}\n"
        "routes:\n"
        "  - {prefix: /x, upstream: u, policy: p, lane: c}\n"
        "  - {prefix: /, upstream: u, policy: q, lane: c}\n", NULL);

    cr_expect_str_eq(all,
        "test.yaml:5:5: policies.p.lanes: the shares add up to 90%, not 100%\n"
        "test.yaml:7:16: policies.p.lanes[1].name: duplicate lane \"a\" (first given at line 6)\n"
        "test.yaml:9:48: routes[0].lane: unknown lane \"c\" (the lanes of policy \"p\": a, a)\n"
        "test.yaml:10:38: routes[1].policy: unknown policy \"q\" (did you mean \"p\"?)\n");
    free(all);
}
