/* The block checks and cross-checks of the config: rules between keys that
 * one row cannot state (cap >= base, a readable CA file, a client
 * certificate with its own key, a lease longer than the timeout of every
 * route it is paired with). The rows of schema.c
 * name them in cfg_block.check; the engine calls one when the file writes
 * its block, after all the block's keys are parsed, so it sees final values,
 * defaults included.
 *
 * A check reports through cfg_err_at/cfg_err_sub at the position of the key the
 * operator should change, and never stops the load: every problem is listed.
 * Kept apart from the schema because these are the rules sluice enforces, and
 * from the engine because the engine knows no key by name. */
#define _GNU_SOURCE
#include "config/config.h"
#include "config/config_internal.h"
#include "config/load_internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

/* A key written with a value: a null one counts as not written. */
static bool given(const yaml_node_t *n)
{
    return n && !cfg_is_null(n);
}

/* Whether a tls block says anything beyond its defaults (a dump of the
 * config, /config, writes the defaults out). */
static bool tls_set(const struct sc_tls *t)
{
    return !t->verify || (t->ca_file && *t->ca_file) || (t->cert_file && *t->cert_file) ||
           (t->key_file && *t->key_file) || (t->server_name && *t->server_name);
}

/* Redis Cluster's rules: a cluster fails over by itself (no sentinels), has
 * only db 0, and nodes are its seeds only (u: the parsed url, or NULL). */
static void check_cluster(struct cfg_loader *lc, const struct sc_config *cfg,
                          yaml_node_t *const *vals, const struct sc_redis_url *u)
{
    if (!cfg->store.cluster) {
        if (cfg->store.nodes.n)
            cfg_err_sub(lc, cfg_pos_of(vals[SK_NODES]), "nodes", "needs cluster: "
                    "true (they are the seed nodes of a Redis Cluster)");
        return;
    }
    if (cfg->store.sentinels.n)
        cfg_err_sub(lc, cfg_pos_of(vals[SK_SENTINELS]), "sentinels", "cannot go "
                "with cluster: true (a Redis Cluster fails over by itself)");
    if (u && u->db != 0)
        cfg_err_sub(lc, cfg_pos_of(vals[SK_URL]), "url", "db must be 0 with "
                "cluster: true (a Redis Cluster has only db 0), not %u", u->db);
}

void cfg_check_store(struct cfg_loader *lc, void *obj,
                 yaml_node_t *const *vals, struct sc_pos where)
{
    const struct sc_config *cfg = obj;
    const char *url = cfg->store.url ? cfg->store.url : "";
    /* An empty value ("master:") loads as NULL, like any string's. */
    const char *master = cfg->store.master ? cfg->store.master : "";
    struct sc_redis_url u;
    struct sc_error err = {0};
    char buf[1024];

    if (cfg->store.sentinels.n && !master[0])
        cfg_err_sub(lc, cfg_pos_of(vals[SK_SENTINELS]), "sentinels", "needs master "
                "(the name Sentinel knows the primary by)");
    if (master[0] && !cfg->store.sentinels.n)
        cfg_err_sub(lc, cfg_pos_of(vals[SK_MASTER]), "master", "needs sentinels (the "
                "addresses to ask for the primary)");
    if (url[0] && config_redis_url_parse(url, &u, buf, sizeof buf, &err) != 0)
        cfg_err_sub(lc, cfg_pos_of(vals[SK_URL]), "url", "%s", err.text);
    else if (url[0] && !u.tls && tls_set(&cfg->store.tls))
        /* Settings that would silently do nothing: the url says plain TCP. */
        cfg_err_sub(lc, cfg_pos_of(vals[SK_TLS]), "tls", "needs a rediss:// url "
                "(url is redis://, plain TCP)");
    if (cfg->store.backend != SC_BACKEND_REDIS)
        return;
    /* Refused here rather than at start, so that --check-config and a reload
     * say it before a deploy does. */
    if (!url[0] && cfg->store.sentinels.n)
        cfg_err_sub(lc, cfg_pos_of(vals[SK_SENTINELS]), "url", "required with "
                "sentinels too: its credentials and db apply to the primary, its "
                "host is a first guess (redis[s]://[[user]:password@]host:port/db)");
    else if (!url[0])
        cfg_err_sub(lc, cfg_pos_of(vals[SK_BACKEND]), "url", "required with backend: "
                "redis (redis[s]://[[user]:password@]host:port/db)");
    if (cfg->store.key_prefix && strpbrk(cfg->store.key_prefix, "{}"))
        /* A brace would move the hash tag off the policy (one slot per policy). */
        cfg_err_sub(lc, cfg_pos_of(vals[SK_KEY_PREFIX]), "key_prefix", "must not contain "
                "'{' or '}' (every key's hash tag is its policy)");
    check_cluster(lc, cfg, vals, url[0] && !err.text[0] ? &u : NULL);
}

/* A file the process must read: false, with the error at pos, when it
 * cannot (or it is a directory, which fopen would take). */
static bool readable(struct cfg_loader *lc, const char *path,
                     struct sc_pos pos, const char *key)
{
    struct stat st;
    FILE *f = fopen(path, "r");
    bool ok = f != NULL;

    if (!f)
        cfg_err_sub(lc, pos, key, "cannot read \"%s\": %s", path, strerror(errno));
    else if (fstat(fileno(f), &st) == 0 && !S_ISREG(st.st_mode)) {
        cfg_err_sub(lc, pos, key, "\"%s\" is not a regular file", path);
        ok = false;
    }
    if (f)
        fclose(f);
    return ok;
}

/* Never a prompt on the terminal for an encrypted key: refused instead. */
static int no_passphrase(char *buf, int size, int rwflag, void *u)
{
    return -1;
}

/* The first certificate and the first private key of PEM files; NULL when
 * there is none. */
static X509 *read_cert(const char *path)
{
    FILE *f = fopen(path, "r");
    X509 *x = f ? PEM_read_X509(f, NULL, no_passphrase, NULL) : NULL;

    if (f)
        fclose(f);
    return x;
}

static EVP_PKEY *read_key(const char *path)
{
    FILE *f = fopen(path, "r");
    EVP_PKEY *k = f ? PEM_read_PrivateKey(f, NULL, no_passphrase, NULL) : NULL;

    if (f)
        fclose(f);
    return k;
}

/* The client certificate and its key, read as the process will: both PEM,
 * and the key the certificate's. */
static void check_client_pair(struct cfg_loader *lc, const struct sc_tls *tls)
{
    X509 *cert = read_cert(tls->cert_file);
    EVP_PKEY *key = read_key(tls->key_file);

    if (!cert)
        cfg_err_sub(lc, tls->cert_pos, "cert_file", "\"%s\" holds no PEM "
                "certificate", tls->cert_file);
    if (!key)
        cfg_err_sub(lc, tls->key_pos, "key_file", "\"%s\" holds no PEM private "
                "key (an encrypted key is not supported)", tls->key_file);
    if (cert && key && X509_check_private_key(cert, key) != 1)
        cfg_err_sub(lc, tls->key_pos, "key_file", "\"%s\" is not the private key "
                "of cert_file \"%s\"", tls->key_file, tls->cert_file);
    ERR_clear_error();
    X509_free(cert);
    EVP_PKEY_free(key);
}

void cfg_check_tls(struct cfg_loader *lc, void *obj,
               yaml_node_t *const *vals, struct sc_pos where)
{
    const struct sc_tls *tls = obj;
    bool cert = tls->cert_file && *tls->cert_file;
    bool key = tls->key_file && *tls->key_file;
    bool cert_ok, key_ok;

    if (tls->ca_file && *tls->ca_file)
        readable(lc, tls->ca_file, tls->ca_pos, "ca_file");
    if (cert && !key)
        cfg_err_sub(lc, tls->cert_pos, "cert_file", "needs key_file (the "
                "certificate's private key)");
    if (key && !cert)
        cfg_err_sub(lc, tls->key_pos, "key_file", "needs cert_file (the client "
                "certificate)");
    if (!cert || !key)
        return;
    /* Both read, each reported: an operator fixes them in one go. */
    cert_ok = readable(lc, tls->cert_file, tls->cert_pos, "cert_file");
    key_ok = readable(lc, tls->key_file, tls->key_pos, "key_file");
    if (cert_ok && key_ok)
        check_client_pair(lc, tls);
}

/* quota (docs/configuration.md): min_rate defaults to rate / 100, which no
 * row can say, and never exceeds the rate it is a floor under. */
static void check_quota(struct cfg_loader *lc, struct sc_policy *p)
{
    struct sc_quota *q = &p->quota;
    char min[64], rate[64];

    if (!q->min_rate_pos.line)
        q->min_rate = p->has_rate ? p->rate / 100 : 0;
    if (!q->enabled)
        return;
    if (!p->has_rate) {
        cfg_err_at(lc, q->pos, "%s.quota: needs a rate: the advertised quota "
               "paces the policy's bucket, never above its rate", lc->path);
        return;
    }
    if (q->min_rate <= p->rate)
        return;
    units_format_rate(q->min_rate, min, sizeof min);
    units_format_rate(p->rate, rate, sizeof rate);
    cfg_err_at(lc, q->min_rate_pos, "%s.quota.min_rate: %s is above the policy's "
           "rate (%s)", lc->path, min, rate);
}

/* The first lane before i named like lane i, or NULL. */
static const struct sc_lane *lane_named_before(const struct sc_policy *p,
                                               size_t i)
{
    for (size_t j = 0; j < i; j++)
        if (p->lanes[j].name && !strcmp(p->lanes[j].name, p->lanes[i].name))
            return &p->lanes[j];
    return NULL;
}

/* The shares add up to 100 %, give or take the binary rounding of decimal
 * ones (33.3 + 33.3 + 33.4). */
static void check_shares(struct cfg_loader *lc, const struct sc_policy *p,
                         struct sc_pos at)
{
    double sum = 0;

    for (size_t i = 0; i < p->n_lanes; i++) {
        if (p->lanes[i].share <= 0)
            return; /* not parsed: its error is given already */
        sum += p->lanes[i].share;
    }
    if (sum < 100 - 1e-9 || sum > 100 + 1e-9)
        cfg_err_at(lc, at, "%s.lanes: the shares add up to %.10g%%, not 100%%",
               lc->path, sum);
}

/* lanes (docs/configuration.md): they divide the permits of the policy's
 * bucket, so they need one; names are unique; max_wait defaults to the
 * policy's. */
static void check_lanes(struct cfg_loader *lc, struct sc_policy *p)
{
    const struct sc_lane *first;
    size_t i;

    if (!p->n_lanes)
        return;
    if (!p->has_rate) {
        cfg_err_at(lc, p->lanes_pos, "%s.lanes: needs a rate: lanes share the "
               "permits of the policy's bucket", lc->path);
        return;
    }
    for (i = 0; i < p->n_lanes; i++) {
        struct sc_lane *l = &p->lanes[i];

        if (!l->max_wait_pos.line)
            l->max_wait_ms = p->max_wait_ms;
        if (l->name && (first = lane_named_before(p, i)))
            cfg_err_at(lc, l->name_pos, "%s.lanes[%zu].name: duplicate lane \"%s\" "
                   "(first given at line %d)", lc->path, i, l->name,
                   first->name_pos.line);
    }
    check_shares(lc, p, p->lanes_pos);
}

void cfg_check_policy(struct cfg_loader *lc, void *obj,
                  yaml_node_t *const *vals, struct sc_pos where)
{
    struct sc_policy *p = obj;

    if (p->name && !strcmp(p->name, "default"))
        cfg_err_at(lc, where, "%s: the name \"default\" is reserved for routes "
               "without a policy", lc->path);
    if (p->shared == SC_SHARED_REDIS &&
        lc->cfg->store.backend != SC_BACKEND_REDIS)
        cfg_err_sub(lc, cfg_pos_of(vals[PK_SHARED]), "shared", "\"redis\" needs "
                "store.backend: redis (there is no Redis to share through)");
    if (p->breaker.enabled && !p->has_rate)
        cfg_err_at(lc, p->breaker.pos, "%s.breaker: needs a rate: the breaker pauses "
               "the policy's bucket", lc->path);
    check_quota(lc, p);
    check_lanes(lc, p);
}

void cfg_check_breaker(struct cfg_loader *lc, void *obj,
                   yaml_node_t *const *vals, struct sc_pos where)
{
    const struct sc_breaker *b = obj;
    char pause[32], max[32];

    if (b->max_pause_ms >= b->pause_ms)
        return;
    units_format_duration(b->pause_ms, pause, sizeof pause);
    units_format_duration(b->max_pause_ms, max, sizeof max);
    if (given(vals[BK_MAX_PAUSE]))
        cfg_err_sub(lc, cfg_pos_of(vals[BK_MAX_PAUSE]), "max_pause", "%s is less than "
                "pause (%s)", max, pause);
    else
        cfg_err_sub(lc, cfg_pos_of(vals[BK_PAUSE]), "pause", "%s is more than max_pause "
                "(%s, the default)", pause, max);
}

void cfg_check_retry(struct cfg_loader *lc, void *obj,
                 yaml_node_t *const *vals, struct sc_pos where)
{
    const struct sc_retry *r = obj;
    char base[32], cap[32];

    if (r->cap_ms >= r->base_ms)
        return;
    units_format_duration(r->base_ms, base, sizeof base);
    units_format_duration(r->cap_ms, cap, sizeof cap);
    if (given(vals[RK_CAP]))
        cfg_err_sub(lc, cfg_pos_of(vals[RK_CAP]), "cap", "%s is less than base (%s)",
                cap, base);
    else
        cfg_err_sub(lc, cfg_pos_of(vals[RK_BASE]), "base", "%s is more than cap "
                "(%s, the default)", base, cap);
}

/* "a, b, c": the policy's lane names, for a message. */
static const char *lane_list(const struct sc_policy *p, char *buf, size_t len)
{
    size_t used = 0;

    buf[0] = '\0';
    for (size_t i = 0; i < p->n_lanes && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%s", i ? ", " : "",
                                 p->lanes[i].name ? p->lanes[i].name : "?");
    return buf;
}

/* The route names a policy that does not exist: that error is given, and
 * its lane cannot be judged. */
static bool policy_unresolved(const struct sc_route *r, const yaml_node_t *at)
{
    const char *s;

    if (!given(at))
        return false;
    if (at->type != YAML_SCALAR_NODE)
        return true;
    s = (const char *)at->data.scalar.value;
    return r->policy < 0 && *s && strcmp(s, "default") != 0;
}

static long lane_index(const struct sc_policy *p, const char *name)
{
    for (size_t i = 0; i < p->n_lanes; i++)
        if (p->lanes[i].name && !strcmp(p->lanes[i].name, name))
            return (long)i;
    return -1;
}

/* A route's lane (docs/configuration.md, lanes): one of its policy's, by name; the
 * policy's last when the route names none. A lane on a policy without lanes
 * is refused rather than ignored: the operator expected a share. */
static void check_route_lane(struct cfg_loader *lc, struct sc_route *r,
                             yaml_node_t *const *vals)
{
    const struct sc_config *cfg = lc->cfg;
    /* An index past the policies: the route's policy value was refused
     * (an error is listed), so there is no lane to check. */
    bool known = r->policy >= 0 && (size_t)r->policy < cfg->n_policies;
    const struct sc_policy *p = known ? &cfg->policies[r->policy] : NULL;
    bool named = r->lane && *r->lane;
    char lanes[512];

    r->lane_index = -1;
    if (policy_unresolved(r, vals[RT_POLICY]) || (r->policy >= 0 && !known))
        return;
    if (p && p->n_lanes && !named) {
        r->lane_index = (long)p->n_lanes - 1;
        if (p->lanes[p->n_lanes - 1].name)
            cfg_set_string(lc, &r->lane, p->lanes[p->n_lanes - 1].name);
    } else if (p && p->n_lanes) {
        r->lane_index = lane_index(p, r->lane);
        if (r->lane_index < 0)
            cfg_err_sub(lc, r->lane_pos, "lane", "unknown lane \"%s\" (the lanes "
                    "of policy \"%s\": %s)", r->lane, p->name,
                    lane_list(p, lanes, sizeof lanes));
    } else if (named && p) {
        cfg_err_sub(lc, r->lane_pos, "lane", "\"%s\" names no lane: policy "
                "\"%s\" has no lanes", r->lane, p->name);
    } else if (named) {
        cfg_err_sub(lc, r->lane_pos, "lane", "\"%s\" names no lane: the route "
                "has no policy, and the default policy has no lanes", r->lane);
    } else {
        free(r->lane);
        r->lane = NULL;
    }
}

void cfg_check_route(struct cfg_loader *lc, void *obj,
                 yaml_node_t *const *vals, struct sc_pos where)
{
    struct sc_route *r = obj;
    const char *strip = r->strip_prefix;

    /* No filter means every method, including extension ones. */
    if (!given(vals[RT_METHODS]))
        r->methods = SC_M_ALL;
    if (!given(vals[RT_UPSTREAM]))
        r->upstream = SIZE_MAX;
    if (r->name && !strcmp(r->name, "none"))
        cfg_err_sub(lc, cfg_pos_of(vals[RT_NAME]), "name", "\"none\" is reserved for "
                "requests that match no route");
    if ((!r->name || !*r->name) && r->prefix)
        cfg_set_string(lc, &r->name, r->prefix);
    if (strip && *strip && r->prefix &&
        strncmp(r->prefix, strip, strlen(strip)) != 0)
        cfg_err_sub(lc, cfg_pos_of(vals[RT_STRIP]), "strip_prefix", "\"%s\" is not a "
                "prefix of the route's prefix \"%s\"", strip, r->prefix);
    check_route_lane(lc, r, vals);
}

/* The element of a status list that says `status`, for an error at its
 * line; the list itself when none does (a value from ${ENV}). */
static struct sc_pos status_pos(struct cfg_loader *lc, const yaml_node_t *seq,
                                int status)
{
    yaml_node_item_t *it;
    char want[16]; /* any int */

    snprintf(want, sizeof want, "%d", status);
    if (seq->type != YAML_SEQUENCE_NODE)
        return cfg_pos_of(seq);
    for (it = seq->data.sequence.items.start; it < seq->data.sequence.items.top;
         it++) {
        yaml_node_t *e = yaml_document_get_node(&lc->doc, *it);

        if (e && e->type == YAML_SCALAR_NODE &&
            !strcmp((const char *)e->data.scalar.value, want))
            return cfg_pos_of(e);
    }
    return cfg_pos_of(seq);
}

/* A 429 answers the lookup, not the question: the partner refused to say. */
static void check_verify_429(struct cfg_loader *lc, const struct sc_verify *v,
                             yaml_node_t *const *vals)
{
    if (sc_verify_found(v, 429) && given(vals[VK_FOUND]))
        cfg_err_sub(lc, status_pos(lc, vals[VK_FOUND], 429), "found", "429 cannot "
                "be listed: a 429 says nothing about the operation (the "
                "lookup was rate limited, and counts as failed)");
    if (sc_verify_absent(v, 429) && given(vals[VK_ABSENT]))
        cfg_err_sub(lc, status_pos(lc, vals[VK_ABSENT], 429), "absent", "429 "
                "cannot be listed: a 429 says nothing about the operation (the "
                "lookup was rate limited, and counts as failed)");
}

/* One status cannot mean both; reported where the operator wrote it (absent,
 * unless only found was written). */
static void check_verify_shared(struct cfg_loader *lc,
                                const struct sc_verify *v,
                                yaml_node_t *const *vals)
{
    bool at_absent = given(vals[VK_ABSENT]);

    for (int c = 100; c <= 599; c++) {
        if (!sc_verify_found(v, c) || !sc_verify_absent(v, c) || c == 429)
            continue;
        if (at_absent)
            cfg_err_sub(lc, status_pos(lc, vals[VK_ABSENT], c), "absent", "%d is "
                    "also in found%s: a lookup's answer cannot mean both", c,
                    given(vals[VK_FOUND]) ? "" : " (the default)");
        else
            cfg_err_sub(lc, status_pos(lc, vals[VK_FOUND], c), "found", "%d is "
                    "also in absent (the default): a lookup's answer cannot "
                    "mean both", c);
    }
}

void cfg_check_verify(struct cfg_loader *lc, void *obj,
                  yaml_node_t *const *vals, struct sc_pos where)
{
    const struct sc_verify *v = obj;

    check_verify_429(lc, v, vals);
    check_verify_shared(lc, v, vals);
}

static bool is_wildcard(const char *host)
{
    return !strcmp(host, "0.0.0.0") || !strcmp(host, "::");
}

/* Port 0 asks the kernel for a free port, which never collides. */
static bool addrs_overlap(const struct sc_addr *a, const struct sc_addr *b)
{
    if (!a->host || !b->host || a->port != b->port || a->port == 0)
        return false;
    return !strcasecmp(a->host, b->host) || is_wildcard(a->host) ||
           is_wildcard(b->host);
}

static void check_listeners(struct cfg_loader *lc)
{
    const struct sc_addr *l = &lc->cfg->listen, *a = &lc->cfg->admin;
    bool v6l = strchr(l->host ? l->host : "", ':') != NULL;
    bool v6a = strchr(a->host ? a->host : "", ':') != NULL;

    if (!addrs_overlap(l, a))
        return;
    /* Report where the operator wrote something: admin, unless defaulted. */
    cfg_err_at(lc, a->pos.line ? a->pos : l->pos,
           "%s: %s%s%s:%u overlaps %s %s%s%s:%u (the admin listener must not "
           "share the worker port)", a->pos.line ? "admin" : "listen",
           v6a ? "[" : "", a->host, v6a ? "]" : "", a->port,
           a->pos.line ? "listen" : "admin", v6l ? "[" : "", l->host,
           v6l ? "]" : "", l->port);
}

/* A policy's lease must outlast the timeout of every request a route sends
 * with it (the route's own timeout, else its upstream's): otherwise a slow
 * but successful attempt loses its lease and a redelivery runs the side
 * effect twice. */
static bool lease_too_short(const struct sc_config *cfg,
                            const struct sc_route *r)
{
    const struct sc_policy *p;

    /* A route that did not parse (no name yet) pairs nothing. */
    if (!r->name || r->policy < 0 || (size_t)r->policy >= cfg->n_policies ||
        r->upstream >= cfg->n_upstreams)
        return false;
    p = &cfg->policies[r->policy];
    return p->idem.enabled &&
           p->idem.lease_ms <= sc_route_timeout(r, &cfg->upstreams[r->upstream]);
}

/* "the timeout of upstream "u" (30s), which route "r" pairs it with", or
 * the route's own timeout when it has one. */
static void describe_timeout(const struct sc_config *cfg,
                             const struct sc_route *r, char *buf, size_t len)
{
    const struct sc_upstream *u = &cfg->upstreams[r->upstream];
    char t[32];

    units_format_duration(sc_route_timeout(r, u), t, sizeof t);
    if (r->has_timeout)
        snprintf(buf, len, "the timeout of route \"%s\" (%s)", r->name, t);
    else
        snprintf(buf, len, "the timeout of upstream \"%s\" (%s), which route "
                 "\"%s\" pairs it with", u->name, t, r->name);
}

static void report_lease(struct cfg_loader *lc, const struct sc_route *r)
{
    const struct sc_policy *p = &lc->cfg->policies[r->policy];
    char lease[32], timeout[300];

    units_format_duration(p->idem.lease_ms, lease, sizeof lease);
    describe_timeout(lc->cfg, r, timeout, sizeof timeout);
    if (p->idem.lease_pos.line)
        cfg_err_at(lc, p->idem.lease_pos, "policies.%s.idempotency.lease: %s "
               "must be longer than %s", p->name, lease, timeout);
    else
        cfg_err_at(lc, p->idem.pos, "policies.%s.idempotency: the default lease "
               "(%s) must be longer than %s; set lease", p->name, lease,
               timeout);
}

static void check_leases(struct cfg_loader *lc)
{
    const struct sc_config *cfg = lc->cfg;
    size_t i, j;

    for (i = 0; i < cfg->n_routes; i++) {
        const struct sc_route *r = &cfg->routes[i];
        if (!lease_too_short(cfg, r))
            continue;
        /* Once per (policy, upstream) pair; a route's own timeout is its
         * own problem. */
        for (j = 0; !r->has_timeout && j < i; j++)
            if (cfg->routes[j].policy == r->policy &&
                cfg->routes[j].upstream == r->upstream &&
                !cfg->routes[j].has_timeout)
                break;
        if (r->has_timeout || j == i)
            report_lease(lc, r);
    }
}

void cfg_check_root(struct cfg_loader *lc, void *obj,
                yaml_node_t *const *vals, struct sc_pos where)
{
    check_listeners(lc);
    check_leases(lc);
}
