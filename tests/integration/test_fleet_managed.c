/* Fleet mode on a Redis as managed services run it (docs/contract.md §10,
 * "Managed Redis and Redis Cluster"): real sluices on a real redis-server
 * with an ACL user allowed only what sluice needs, and over TLS only
 * (--port 0, --tls-port) with a CA made by openssl at test time. Each: the
 * fleet works (a key completed on one sidecar is replayed by another, one
 * bucket for both); what is refused (a wrong password, an untrusted chain,
 * a wrong name, a missing client certificate) is visible at /readyz with
 * its cause and never a secret, keyed requests get store_unavailable and
 * nothing is forwarded; fixing the server side brings sluice back without
 * a restart. Every wait is bounded. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "integration/harness.h"
#include "support/redis_server.h"
#include "support/sentinel_server.h"
#include "support/testutil.h"

#define ADMIN_PW "adm1n-pw"
#define ACL_PW "acl-S3cret-pw"
#define WRONG_PW "Wr0ng-S3cret-9"
#define N_SL 2

static struct redis_server rs;
static struct h_stub stub;
static struct h_sluice sl[N_SL + 1];
static char *pki;
static struct sentinel_server sen;

static const char policies[] =
    "policies:\n"
    "  keyed: {rate: 50/s, burst: 10, max_wait: 5s, shared: redis,\n"
    "          idempotency: {required: false, lease: 10s}}\n"
    "  one: {rate: 1/s, burst: 1, max_wait: 100ms, shared: redis}\n"
    "routes:\n"
    "  - {prefix: /k, upstream: stub, policy: keyed}\n"
    "  - {prefix: /o, upstream: stub, policy: one}\n";

static void stop_all(void)
{
    for (int i = 0; i < N_SL + 1; i++)
        h_sluice_cleanup(&sl[i]);
    h_stub_stop(&stub);
    sentinel_server_destroy(&sen);
    redis_server_destroy(&rs);
    if (pki) {
        tu_rm_rf(pki);
        free(pki);
        pki = NULL;
    }
}

/* A sluice on this store block (and the stub); ready: wait for /readyz 200,
 * else only until the admin port answers. */
static int sluice_on(int i, const char *store, bool ready)
{
    char *cfg;
    int rc;

    cr_assert(asprintf(&cfg, "store: {backend: redis, timeout: 1s, fleet_size: 2,\n%s}\n"
                             "upstreams: {stub: {url: http://127.0.0.1:%d, timeout: 5s}}\n%s",
                       store, stub.port, policies) > 0);
    rc = ready ? h_sluice_start(&sl[i], cfg) : h_sluice_spawn(&sl[i], cfg);
    free(cfg);
    return rc;
}

/* The admin path's answer, within 10 s, once its status is want: the body
 * (free it), or NULL. */
static char *admin_when(int i, const char *path, int want)
{
    for (int n = 0; n < 100; n++) {
        struct h_resp r = {0};

        if (h_http(sl[i].admin_port, "GET", path, NULL, NULL, 0, &r) == 0 &&
            r.status == want) {
            char *b = strdup(r.body ? r.body : "");

            h_resp_free(&r);
            return b;
        }
        if (r.status)
            h_resp_free(&r);
        usleep(100 * 1000);
    }
    return NULL;
}

static int post_key(int i, const char *path, const char *key, struct h_resp *r)
{
    char hdr[256];

    snprintf(hdr, sizeof hdr, "Idempotency-Key: %s\r\n", key);
    return h_http(sl[i].port, "POST", path, hdr, "x", 1, r);
}

/* A key completed through sidecar 0 is replayed by sidecar 1: the stub saw
 * it once. */
static void expect_replay_across(const char *key)
{
    struct h_resp r;

    cr_assert_eq(post_key(0, "/k/pay", key, &r), 0);
    cr_expect_eq(r.status, 200, "%s", r.body ? r.body : "");
    h_resp_free(&r);
    cr_assert_eq(post_key(1, "/k/pay", key, &r), 0);
    cr_expect_eq(r.status, 200, "%s", r.body ? r.body : "");
    h_resp_free(&r);
    cr_expect_eq(h_stub_key_stat(&stub, key, "side_effects"), 1, "replayed, not sent again");
}

/* One bucket for both sidecars: its one permit spent on sidecar 0 leaves
 * none for sidecar 1 (a wait of ~1 s over max_wait: refused). */
static void expect_one_bucket(void)
{
    struct h_resp r;

    cr_assert_eq(h_http(sl[0].port, "GET", "/o/a", NULL, NULL, 0, &r), 0);
    cr_expect_eq(r.status, 200);
    h_resp_free(&r);
    cr_assert_eq(h_http(sl[1].port, "GET", "/o/b", NULL, NULL, 0, &r), 0);
    cr_expect_eq(r.status, 429, "the other sidecar's permit was shared: %d", r.status);
    cr_expect(r.body && strstr(r.body, "rate_limited"), "%s", r.body ? r.body : "");
    h_resp_free(&r);
}

/* Sidecar i cannot use the store: /readyz names cause (and no secret), the
 * store is down in /metrics, a keyed request is requeued, nothing sent. */
static void expect_refused(int i, const char *cause, const char *secret)
{
    char *body = admin_when(i, "/readyz", 503), *m;
    long long before = h_stub_stat(&stub, "requests");
    struct h_resp r;

    cr_assert(body, "/readyz never answered 503");
    cr_expect(strstr(body, "\"store_unavailable\""), "%s", body);
    cr_expect(strstr(body, cause), "the cause (%s) is not named: %s", cause, body);
    if (secret)
        cr_expect_null(strstr(body, secret), "the secret is shown: %s", body);
    free(body);
    m = admin_when(i, "/metrics", 200);
    cr_expect(m && strstr(m, "\nsluice_store_up 0\n"), "sluice_store_up is not 0");
    free(m);
    cr_assert_eq(post_key(i, "/k/pay", "refused-key", &r), 0);
    cr_expect_eq(r.status, 503);
    cr_expect(r.body && strstr(r.body, "store_unavailable"), "%s", r.body ? r.body : "");
    h_resp_free(&r);
    cr_expect_eq(h_stub_stat(&stub, "requests"), before, "nothing forwarded");
    if (secret)
        cr_expect_not(h_file_contains(sl[i].log_path, secret), "the secret is logged");
}

/* ---- ACL users ---- */

static void acl_start(void)
{
    cr_assert_eq(redis_server_start(&rs, 0, ADMIN_PW), 0, "redis-server did not start");
    /* Only what sluice sends, and what its scripts call, on its keys. */
    cr_assert(redis_server_cmd(&rs, "ACL SETUSER sluice on >" ACL_PW " resetkeys ~sluice:* "
                                    "resetchannels -@all +ping +evalsha +script|load"));
    cr_assert(redis_server_cmd(&rs, "ACL SETUSER sluice +get +set +del +exists +dbsize +wait "
                                    "+time +hmget +pexpire +pttl +zadd +zrem"));
    cr_assert(redis_server_cmd(&rs, "ACL SETUSER sluice +zcard +zremrangebyscore +zscore"));
    cr_assert_eq(h_stub_start(&stub, NULL), 0, "the stub did not start");
}

TestSuite(managed_acl, .init = acl_start, .fini = stop_all, .timeout = 120);

Test(managed_acl, an_acl_user_with_only_what_sluice_needs_serves_the_fleet)
{
    char store[256];

    snprintf(store, sizeof store, "url: \"redis://sluice:%s@127.0.0.1:%u/0\"", ACL_PW, rs.port);
    for (int i = 0; i < N_SL; i++)
        cr_assert_eq(sluice_on(i, store, true), 0, "sluice %d is not ready", i);
    expect_replay_across("acl-key-1");
    expect_one_bucket();
}

Test(managed_acl, a_refused_password_is_visible_and_its_fix_is_followed)
{
    char store[256], *body;
    struct h_resp r;

    snprintf(store, sizeof store, "url: \"redis://sluice:%s@127.0.0.1:%u/0\"", WRONG_PW, rs.port);
    cr_assert_eq(sluice_on(0, store, false), 0);
    expect_refused(0, "authentication failed: AUTH failed: WRONGPASS", WRONG_PW);
    /* The server side fixed (the user's password is this one too): back
     * without a restart. */
    cr_assert(redis_server_cmd(&rs, "ACL SETUSER sluice >" WRONG_PW));
    body = admin_when(0, "/readyz", 200);
    cr_expect(body, "not ready again within 10 s");
    free(body);
    /* Each loop's own connection retries with its backoff (at most 5 s). */
    for (int n = 0;; n++) {
        cr_assert_eq(post_key(0, "/k/pay", "acl-after-fix", &r), 0);
        if (r.status == 200 || n >= 100)
            break;
        h_resp_free(&r);
        usleep(100 * 1000);
    }
    cr_expect_eq(r.status, 200, "%s", r.body ? r.body : "");
    h_resp_free(&r);
}

Test(managed_acl, a_user_denied_a_command_sluice_needs_is_an_authentication_failure)
{
    char store[256];

    cr_assert(redis_server_cmd(&rs, "ACL SETUSER sluice -script|load"));
    snprintf(store, sizeof store, "url: \"redis://sluice:%s@127.0.0.1:%u/0\"", ACL_PW, rs.port);
    cr_assert_eq(sluice_on(0, store, false), 0);
    expect_refused(0, "authentication failed: SCRIPT LOAD failed: NOPERM", ACL_PW);
}

/* ---- TLS ---- */

/* A CA, the server's certificate (redis.test and 127.0.0.1), a client
 * certificate, and another CA that signed none of them. */
static void make_pki(void)
{
    pki = tu_mkdtemp("pki");
    cr_assert(pki);
    cr_assert_eq(h_sh(
        "cd %s && "
        "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj /CN=redis-test-ca >/dev/null 2>&1 && "
        "openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=redis.test >/dev/null 2>&1 && "
        "printf 'subjectAltName=DNS:redis.test,IP:127.0.0.1' > server.ext && "
        "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2 -extfile server.ext >/dev/null 2>&1 && "
        "openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr -subj /CN=sluice >/dev/null 2>&1 && "
        "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem -days 2 >/dev/null 2>&1 && "
        "openssl req -x509 -newkey rsa:2048 -nodes -keyout other-ca.key -out other-ca.pem -days 2 -subj /CN=other-ca >/dev/null 2>&1 && "
        "chmod 644 *.key",
        pki), 0, "openssl failed");
}

static void tls_start_with(bool auth_clients)
{
    make_pki();
    rs.tls_dir = pki;
    rs.tls_auth_clients = auth_clients;
    cr_assert_eq(redis_server_start(&rs, 0, NULL), 0, "redis-server (TLS) did not start");
    cr_assert_eq(h_stub_start(&stub, NULL), 0, "the stub did not start");
}

static void tls_start(void)
{
    tls_start_with(false);
}

static void mtls_start(void)
{
    tls_start_with(true);
}

TestSuite(managed_tls, .init = tls_start, .fini = stop_all, .timeout = 120);
TestSuite(managed_mtls, .init = mtls_start, .fini = stop_all, .timeout = 120);

static void tls_store(char *buf, size_t len, const char *host, const char *tls)
{
    snprintf(buf, len, "url: \"rediss://%s:%u/0\", tls: {%s}", host, rs.port, tls);
}

Test(managed_tls, a_verified_connection_serves_the_fleet)
{
    char store[1024], tls[512];

    /* One by IP (checked against the IP subjectAltName), one by the name
     * the certificate holds (server_name: checked and sent as SNI). */
    snprintf(tls, sizeof tls, "ca_file: %s/ca.pem", pki);
    tls_store(store, sizeof store, "127.0.0.1", tls);
    cr_assert_eq(sluice_on(0, store, true), 0, "sluice 0 is not ready");
    snprintf(tls, sizeof tls, "ca_file: %s/ca.pem, server_name: redis.test", pki);
    tls_store(store, sizeof store, "127.0.0.1", tls);
    cr_assert_eq(sluice_on(1, store, true), 0, "sluice 1 is not ready");
    expect_replay_across("tls-key-1");
    expect_one_bucket();
}

Test(managed_tls, an_untrusted_chain_is_refused_with_its_cause)
{
    char store[1024], tls[512];

    snprintf(tls, sizeof tls, "ca_file: %s/other-ca.pem", pki);
    tls_store(store, sizeof store, "127.0.0.1", tls);
    cr_assert_eq(sluice_on(0, store, false), 0);
    expect_refused(0, "TLS: certificate verify failed", NULL);
}

Test(managed_tls, a_wrong_name_is_refused_with_its_cause)
{
    char store[1024], tls[512];

    snprintf(tls, sizeof tls, "ca_file: %s/ca.pem, server_name: cache.example", pki);
    tls_store(store, sizeof store, "127.0.0.1", tls);
    cr_assert_eq(sluice_on(0, store, false), 0);
    expect_refused(0, "TLS: certificate verify failed: hostname mismatch", NULL);
}

Test(managed_tls, verify_false_takes_any_certificate)
{
    char store[1024], tls[512];

    snprintf(tls, sizeof tls, "verify: false, server_name: cache.example");
    tls_store(store, sizeof store, "127.0.0.1", tls);
    cr_assert_eq(sluice_on(0, store, true), 0, "not ready without verification");
}

/* The sentinels are asked over TLS too: the url's port has nothing behind
 * it, so only a TLS sentinel naming the primary makes sluice ready. */
Test(managed_tls, sentinels_are_asked_over_tls_too)
{
    char store[2048], *body;
    struct h_resp r;

    sen.tls_dir = pki;
    cr_assert_eq(sentinel_server_start(&sen, "managed", rs.port, NULL), 0,
                 "redis-sentinel (TLS) did not start");
    snprintf(store, sizeof store,
             "url: \"rediss://127.0.0.1:%u/0\", sentinels: [\"127.0.0.1:%u\"], master: managed,\n"
             "tls: {ca_file: %s/ca.pem}", redis_server_free_port(), sen.port, pki);
    cr_assert_eq(sluice_on(0, store, false), 0);
    body = admin_when(0, "/readyz", 200);
    cr_expect(body, "not ready through the TLS sentinel within 10 s");
    free(body);
    cr_assert_eq(post_key(0, "/k/pay", "tls-sentinel-key", &r), 0);
    cr_expect_eq(r.status, 200, "%s", r.body ? r.body : "");
    h_resp_free(&r);
}

Test(managed_mtls, a_required_client_certificate_is_presented)
{
    char store[2048], tls[1024];

    snprintf(tls, sizeof tls, "ca_file: %s/ca.pem, cert_file: %s/client.pem, key_file: %s/client.key",
             pki, pki, pki);
    tls_store(store, sizeof store, "127.0.0.1", tls);
    for (int i = 0; i < N_SL; i++)
        cr_assert_eq(sluice_on(i, store, true), 0, "sluice %d is not ready", i);
    expect_replay_across("mtls-key-1");
    /* Without one: refused by the server, and said so. */
    snprintf(tls, sizeof tls, "ca_file: %s/ca.pem", pki);
    tls_store(store, sizeof store, "127.0.0.1", tls);
    cr_assert_eq(sluice_on(N_SL, store, false), 0);
    expect_refused(N_SL, "TLS: ", NULL);
}
