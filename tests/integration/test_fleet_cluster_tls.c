/* Fleet mode on a Redis Cluster as managed services run one (docs/contract.md
 * §10, "Managed Redis and Redis Cluster"): six real redis-servers, TLS only
 * (--port 0 --tls-port, --tls-cluster yes, --tls-replication yes, a CA made
 * by openssl at test time), made a cluster of three primaries with a
 * replica each by redis-cli --tls --cluster create, and an ACL user on
 * every node allowed only what sluice needs (docs/reference/fleet.md's
 * list). Two real sluices, each given one seed and a rediss:// url with
 * that user: replay across sidecars, the shared bound, a policy's records
 * on its slot's primary, the map read with CLUSTER SHARDS (CLUSTER SLOTS
 * once the user may not run SHARDS); then a CLUSTER FAILOVER of that primary with
 * requests flowing, followed without a restart, no key twice upstream and
 * every completion replayed. Every wait is bounded; servers are stopped by
 * their pid. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "integration/harness.h"
#include "support/redis_server.h"
#include "support/testutil.h"

#define NODES 6
#define PAIR 2
#define ADMIN_PW "adm1n-pw"
#define ACL_PW "acl-S3cret-pw"
#define OUT_MAX 16384

static struct redis_server srv[NODES];
static struct h_stub stub;
static struct h_sluice sl[PAIR];
static char *pki;
/* Two policy names whose tags land on different primaries (srv indexes). */
static char pol[2][16];
static int owner[2];

static uint64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void stop_all(void)
{
    for (int i = 0; i < PAIR; i++)
        h_sluice_cleanup(&sl[i]);
    h_stub_stop(&stub);
    for (int i = 0; i < NODES; i++)
        redis_server_destroy(&srv[i]);
    if (pki) {
        tu_rm_rf(pki);
        free(pki);
        pki = NULL;
    }
}

/* A command on srv[i] through redis-cli over TLS as the default user (cmd
 * goes through the shell: quote what it must not read): its whole output
 * into out, true if redis-cli exited 0. */
static bool cli(int i, const char *cmd, char *out, size_t len)
{
    char line[4096];
    size_t n = 0;
    FILE *p;

    snprintf(line, sizeof line,
             "redis-cli --tls --cacert %s/ca.pem --cert %s/client.pem --key %s/client.key "
             "-h 127.0.0.1 -p %u --no-auth-warning -a " ADMIN_PW " %s 2>&1",
             pki, pki, pki, srv[i].port, cmd);
    if (!(p = popen(line, "r")))
        return false;
    while (n + 1 < len && fgets(out + n, (int)(len - n), p))
        n += strlen(out + n);
    out[n] = '\0';
    while (fgets(line, sizeof line, p))
        ;
    return pclose(p) == 0;
}

static bool cli_has(int i, const char *cmd, const char *text)
{
    static char out[OUT_MAX];

    return cli(i, cmd, out, sizeof out) && strstr(out, text);
}

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
        "openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr -subj /CN=admin >/dev/null 2>&1 && "
        "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem -days 2 >/dev/null 2>&1 && "
        "chmod 644 *.key",
        pki), 0, "openssl failed");
}

/* The ACL user of docs/reference/fleet.md, with a cluster's own commands;
 * ACLs are per node, so on each. */
static void acl_user(int i)
{
    cr_assert(cli_has(i, "ACL SETUSER sluice on '>" ACL_PW "' resetkeys '~sluice:*' "
                         "resetchannels -@all +ping +evalsha '+script|load' +get +set +del "
                         "+dbsize +wait +time +hmget +hset +pexpire +pexpireat +pttl +zadd "
                         "+zrem +zcard +zremrangebyscore +zscore '+cluster|shards' "
                         "'+cluster|slots' +asking", "OK"), "ACL SETUSER on node %d", i);
}

static bool all_ok(unsigned ms)
{
    for (uint64_t t0 = now_ms(); now_ms() - t0 < ms; tu_sleep_ms(100)) {
        bool ok = true;

        for (int i = 0; ok && i < NODES; i++)
            ok = cli_has(i, "CLUSTER INFO", "cluster_state:ok");
        if (ok)
            return true;
    }
    return false;
}

static void cluster_create(void)
{
    char cmd[1024];
    int n;

    make_pki();
    for (int i = 0; i < NODES; i++) {
        srv[i].cluster = true;
        srv[i].tls_dir = pki;
        cr_assert_eq(redis_server_start(&srv[i], 0, ADMIN_PW), 0,
                     "redis-server %d (TLS, cluster) did not start", i);
        acl_user(i);
    }
    n = snprintf(cmd, sizeof cmd, "--cluster create");
    for (int i = 0; i < NODES; i++)
        n += snprintf(cmd + n, sizeof cmd - (size_t)n, " 127.0.0.1:%u", srv[i].port);
    snprintf(cmd + n, sizeof cmd - (size_t)n, " --cluster-replicas 1 --cluster-yes");
    cr_assert(cli_has(0, cmd, "All 16384 slots covered"), "redis-cli --cluster create failed");
    cr_assert(all_ok(20000), "cluster_state did not become ok");
}

/* ---- the cluster's view, from CLUSTER NODES ---- */

/* The srv index of the node on port, or -1. */
static int by_port(unsigned port)
{
    for (int i = 0; i < NODES; i++)
        if (srv[i].port == port)
            return i;
    return -1;
}

/* The line of CLUSTER NODES (asked of srv[ask]) whose field matches: the
 * primary serving slot (want_slot >= 0), or the replica of the primary
 * with id master. The node's srv index, or -1; its id into id. */
static int find_node(int ask, int want_slot, const char *master, char id[64])
{
    static char out[OUT_MAX];
    char *save = NULL;

    if (!cli(ask, "CLUSTER NODES", out, sizeof out))
        return -1;
    for (char *l = strtok_r(out, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        char nid[64], addr[128], flags[128], mid[64];
        unsigned port;
        int used = 0, lo, hi;
        const char *colon;

        if (sscanf(l, "%63s %127s %127s %63s %*s %*s %*s %*s%n", nid, addr, flags, mid,
                   &used) != 4 || strstr(flags, "fail"))
            continue;
        addr[strcspn(addr, "@")] = '\0'; /* ip:port@bus-port */
        if (!(colon = strrchr(addr, ':')) || sscanf(colon + 1, "%u", &port) != 1)
            continue;
        if (master && strstr(flags, "slave") && !strcmp(mid, master)) {
            snprintf(id, 64, "%s", nid);
            return by_port(port);
        }
        for (const char *p = l + used; want_slot >= 0 && strstr(flags, "master") && *p;) {
            int k = 0;

            hi = -1;
            if (sscanf(p, " %d-%d%n", &lo, &hi, &k) == 2 || sscanf(p, " %d%n", &lo, &k) == 1) {
                if (want_slot >= lo && want_slot <= (hi < 0 ? lo : hi)) {
                    snprintf(id, 64, "%s", nid);
                    return by_port(port);
                }
                p += k;
            } else {
                p += strcspn(p + 1, " ") + 1; /* [slot->-id]: a migration */
            }
        }
    }
    return -1;
}

static int keyslot(const char *key)
{
    char cmd[128], out[64];

    snprintf(cmd, sizeof cmd, "CLUSTER KEYSLOT %s", key);
    return cli(0, cmd, out, sizeof out) ? atoi(out) : -1;
}

static int owner_of(const char *key)
{
    char id[64];

    return find_node(0, keyslot(key), NULL, id);
}

static void pick_policies(void)
{
    char name[16];

    owner[0] = owner[1] = -1;
    for (int i = 0; i < 12 && owner[1] < 0; i++) {
        int o;

        snprintf(name, sizeof name, "p%d", i);
        if ((o = owner_of(name)) < 0)
            continue;
        if (owner[0] < 0 || o != owner[0]) {
            int k = owner[0] < 0 ? 0 : 1;

            snprintf(pol[k], sizeof pol[k], "%s", name);
            owner[k] = o;
        }
    }
    cr_assert_geq(owner[1], 0, "no two policy names on different primaries");
}

static void start_pair(void)
{
    char *cfg;

    cluster_create();
    pick_policies();
    cr_assert_eq(h_stub_start(&stub, NULL), 0, "the stub did not start");
    /* Each sidecar knows one seed: the rest comes from the slot map. */
    for (int i = 0; i < PAIR; i++) {
        cr_assert(asprintf(&cfg,
            "store: {backend: redis, url: \"rediss://sluice:%s@127.0.0.1:%u/0\", cluster: true,\n"
            "        tls: {ca_file: %s/ca.pem}, timeout: 1s, fleet_size: %d}\n"
            "upstreams: {stub: {url: http://127.0.0.1:%d, timeout: 5s}}\n"
            "policies:\n"
            "  %s: {rate: 1/s, burst: 1, max_wait: 100ms, shared: redis}\n"
            "  %s: {rate: 200/s, burst: 50, max_wait: 30s, shared: redis,\n"
            "        idempotency: {required: false, lease: 10s}}\n"
            "routes:\n"
            "  - {prefix: /a, upstream: stub, policy: %s}\n"
            "  - {prefix: /b, upstream: stub, policy: %s}\n",
            ACL_PW, srv[i * 3].port, pki, PAIR, stub.port, pol[0], pol[1], pol[0],
            pol[1]) > 0);
        cr_assert_eq(h_sluice_start(&sl[i], cfg), 0, "sluice %d is not ready", i);
        free(cfg);
    }
}

TestSuite(cluster_tls, .init = start_pair, .fini = stop_all, .timeout = 150);

/* ---- requests ---- */

static int post_key(int i, const char *path, const char *key, bool *replayed)
{
    struct h_resp r;
    char hdr[256], *v;
    int status;

    snprintf(hdr, sizeof hdr, "Idempotency-Key: %s\r\n", key);
    if (h_http(sl[i].port, "POST", path, hdr, "x", 1, &r) != 0)
        return 0;
    status = r.status;
    v = h_header(&r, "Idempotent-Replayed");
    if (replayed)
        *replayed = v && !strcmp(v, "true");
    free(v);
    h_resp_free(&r);
    return status;
}

static int get(int i, const char *path)
{
    struct h_resp r;
    int status;

    if (h_http(sl[i].port, "GET", path, NULL, NULL, 0, &r) != 0)
        return 0;
    status = r.status;
    h_resp_free(&r);
    return status;
}

/* Whether the record of key (policy pol[1]) is on srv[i], a primary. */
static bool stored_on(int i, const char *key)
{
    char cmd[256], out[64];

    snprintf(cmd, sizeof cmd, "EXISTS sluice:{%s}:k:%s", pol[1], key);
    return cli(i, cmd, out, sizeof out) && atoi(out) == 1;
}

/* The calls of a command (INFO commandstats' name, e.g. "cluster|shards")
 * over every live node. */
static long long calls(const char *cmd)
{
    static char out[OUT_MAX];
    char needle[64];
    long long sum = 0;
    const char *p;

    snprintf(needle, sizeof needle, "cmdstat_%s:calls=", cmd);
    for (int i = 0; i < NODES; i++)
        if (srv[i].pid && cli(i, "INFO commandstats", out, sizeof out) &&
            (p = strstr(out, needle)))
            sum += atoll(p + strlen(needle));
    return sum;
}

Test(cluster_tls, replay_across_sidecars_and_one_bound_over_tls_with_an_acl_user)
{
    bool replayed = false;

    cr_expect_eq(post_key(0, "/b/orders", "tls-replay", &replayed), 200);
    cr_expect(!replayed);
    cr_expect_eq(post_key(1, "/b/orders", "tls-replay", &replayed), 200);
    cr_expect(replayed, "replayed by the other sidecar");
    cr_expect_eq(h_stub_key_stat(&stub, "tls-replay", "side_effects"), 1);
    cr_expect(stored_on(owner[1], "tls-replay"), "on the primary of its slot");
    cr_expect(!stored_on(owner[0], "tls-replay"), "and not on the other");
    /* The other policy's bucket (1/s, burst 1) on another primary, shared:
     * its permit spent on sidecar 0 leaves none for sidecar 1. */
    cr_expect_eq(get(0, "/a/x"), 200);
    cr_expect_eq(get(1, "/a/y"), 429, "the bucket is the fleet's");
    /* Redis 7: the map is read with CLUSTER SHARDS. */
    cr_expect_gt(calls("cluster|shards"), 0, "CLUSTER SHARDS was never asked");
}

/* A user not allowed CLUSTER SHARDS (NOPERM): the map is read with CLUSTER
 * SLOTS from then on, and the fleet goes on. */
Test(cluster_tls, a_user_refused_cluster_shards_is_served_by_cluster_slots)
{
    long long before = calls("cluster|slots");
    bool replayed = false;

    for (int i = 0; i < NODES; i++)
        cr_assert(cli_has(i, "ACL SETUSER sluice '-cluster|shards'", "OK"));
    tu_sleep_ms(2500); /* two rounds of the map's thread (every second) */
    cr_expect_gt(calls("cluster|slots"), before, "CLUSTER SLOTS was not asked instead");
    cr_expect_eq(post_key(0, "/b/orders", "tls-slots", &replayed), 200);
    cr_expect_eq(post_key(1, "/b/orders", "tls-slots", &replayed), 200);
    cr_expect(replayed, "replayed by the other sidecar");
    cr_expect_eq(h_stub_key_stat(&stub, "tls-slots", "side_effects"), 1);
}

/* Keyed requests one after another, alternating sidecars, until stop. */
struct flow {
    atomic_bool stop;
    int n, ok, unavailable, other;
    bool acked[2000]; /* answered 200 */
};

static void *flow_run(void *arg)
{
    struct flow *f = arg;
    char key[48];

    while (!atomic_load(&f->stop) && f->n < 2000) {
        int s;

        snprintf(key, sizeof key, "tls-fo-%d", f->n);
        s = post_key(f->n % PAIR, "/b/orders", key, NULL);
        f->n++;
        if (s == 200 && f->n - 1 < (int)(sizeof f->acked / sizeof f->acked[0]))
            f->acked[f->n - 1] = true;
        if (s == 200)
            f->ok++;
        else if (s == 503)
            f->unavailable++;
        else
            f->other++;
        tu_sleep_ms(5);
    }
    return NULL;
}

Test(cluster_tls, a_failover_is_followed_without_a_restart)
{
    char pid[64], rid[64];
    int slot = keyslot(pol[1]), primary, replica, twice = 0, lost = 0, s = 0;
    struct flow f = {0};
    pthread_t t;
    uint64_t t0;

    cr_assert_geq(slot, 0);
    cr_assert_geq(primary = find_node(0, slot, NULL, pid), 0);
    cr_assert_geq(replica = find_node(0, -1, pid, rid), 0, "no replica of %s", pid);
    t0 = now_ms();
    while (!cli_has(replica, "INFO replication", "master_link_status:up") &&
           now_ms() - t0 < 10000)
        tu_sleep_ms(100);
    pthread_create(&t, NULL, flow_run, &f);
    tu_sleep_ms(500);
    cr_assert(cli_has(replica, "CLUSTER FAILOVER", "OK"), "CLUSTER FAILOVER refused");
    t0 = now_ms();
    while (find_node(0, slot, NULL, pid) != replica && now_ms() - t0 < 15000)
        tu_sleep_ms(100);
    cr_expect_eq(find_node(0, slot, NULL, pid), replica, "the replica was not promoted");
    cr_expect(all_ok(10000));
    tu_sleep_ms(1500);
    atomic_store(&f.stop, true);
    pthread_join(t, NULL);
    cr_log_info("failover over TLS: %d requests, %d answered 200, %d store_unavailable",
                f.n, f.ok, f.unavailable);
    cr_expect_gt(f.ok, 50, "%d of %d answered 200", f.ok, f.n);
    cr_expect_eq(f.other, 0, "%d answers neither 200 nor 503", f.other);
    for (int i = 0; i < f.n; i++) {
        char key[48];
        bool replayed = false;
        long long fx;

        snprintf(key, sizeof key, "tls-fo-%d", i);
        if ((fx = h_stub_key_stat(&stub, key, "side_effects")) > 1)
            twice++;
        /* Only an answered result is promised: a request answered 503
         * (the store lost mid-failover) may have reached the partner
         * and keeps its lease until it expires. */
        if (fx == 1 && i < 2000 && f.acked[i] && (post_key((i + 1) % PAIR, "/b/orders", key, &replayed) != 200 ||
                        !replayed))
            lost++;
    }
    cr_expect_eq(twice, 0, "%d keys reached the upstream twice", twice);
    cr_expect_eq(lost, 0, "%d completions not replayed", lost);
    /* A new key after the failover: on the promoted node. */
    for (t0 = now_ms(); s != 200 && now_ms() - t0 < 5000; tu_sleep_ms(100))
        s = post_key(0, "/b/orders", "tls-after", NULL);
    cr_expect_eq(s, 200);
    cr_expect(stored_on(replica, "tls-after"), "the promoted replica took the write");
}
