/* The schema of sidecar.yaml: one cfg_key row per key (type, field, default
 * and bounds in the config's own syntax), grouped into cfg_blocks, up to
 * cfg_root_block for the whole file. The engine (load_engine.c) parses by
 * these rows, config_json.c shows them and config_model.c frees them, so a
 * key added here needs no code elsewhere unless it needs a new rule.
 *
 * Also here: the per-key string validators the rows name (a predicate with
 * the reason, for the message) and the *_present helpers of the JSON view.
 * The rules between keys are the block checks of checks.c.
 *
 * Row order is parse order, and it decides dependencies whatever order the
 * file uses: store before policies (shared: redis), upstreams and policies
 * before routes (routes name them). Blocks whose check reads vals[] lay out
 * their rows by the indices of load_internal.h. */
#define _GNU_SOURCE
#include "config/config.h"
#include "config/config_internal.h"
#include "config/load_internal.h"
#include "config/units.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* CT_ENUM stores through an int *. */
_Static_assert(sizeof(enum sc_jitter) == sizeof(int), "enums stored as int");
_Static_assert(sizeof(enum sc_mode) == sizeof(int), "enums stored as int");
_Static_assert(sizeof(enum sc_shared) == sizeof(int), "enums stored as int");
_Static_assert(sizeof(enum sc_backend) == sizeof(int), "enums stored as int");
_Static_assert(sizeof(enum sc_log_level) == sizeof(int), "enums stored as int");
_Static_assert(sizeof(enum sc_duplicates) == sizeof(int), "enums stored as int");
_Static_assert(sizeof(enum sc_method) == sizeof(int), "enums stored as int");

/* ---- string validators ----------------------------------------------- */

static bool valid_nonempty(const char *s, char *why, size_t wlen)
{
    if (*s)
        return true;
    snprintf(why, wlen, "must not be empty");
    return false;
}

static bool valid_token(const char *s, char *why, size_t wlen)
{
    if (units_is_token(s))
        return true;
    snprintf(why, wlen, "expected a header name such as Idempotency-Key");
    return false;
}

static bool valid_prefix(const char *s, char *why, size_t wlen)
{
    const char *p;

    if (s[0] != '/') {
        snprintf(why, wlen, "a prefix must start with \"/\"");
        return false;
    }
    for (p = s; *p; p++) {
        if (*p == '?' || *p == '#' || (unsigned char)*p <= 0x20 ||
            (unsigned char)*p >= 0x7f) {
            snprintf(why, wlen, "a prefix is a path: no query, fragment, "
                     "spaces or control characters");
            return false;
        }
    }
    return true;
}

static bool valid_statsd(const char *s, char *why, size_t wlen)
{
    char *host = NULL;
    uint16_t port = 0;
    int rc;

    if (!*s)
        return true;
    rc = units_parse_hostport(s, &host, &port, NULL, 0);
    free(host);
    if (rc == 0 && port != 0)
        return true;
    snprintf(why, wlen, "expected host:port with a port from 1 to 65535, or "
             "\"\" for off");
    return false;
}

/* The token travels in an Authorization header after "Bearer ": a space or
 * a control character could never be sent back intact. */
static bool valid_admin_token(const char *s, char *why, size_t wlen)
{
    for (; *s; s++)
        if ((unsigned char)*s <= ' ' || *s == 0x7f) {
            snprintf(why, wlen, "a bearer token has no spaces or control "
                     "characters");
            return false;
        }
    return true;
}

/* The proxy URL carries credentials: the reason is given, never the value
 * (text_string does not echo a secret). */
static bool valid_proxy(const char *s, char *why, size_t wlen)
{
    struct sc_proxy_url p;
    struct sc_error err = {0};
    char buf[1024];

    if (!*s || config_proxy_url_parse(s, &p, buf, sizeof buf, &err) == 0)
        return true;
    snprintf(why, wlen, "%s", err.text);
    return false;
}

/* A lane's name is a metrics label value and what a worker sends in the
 * lane header (compared exactly after trimming): no spaces, nothing to
 * escape. */
static bool valid_lane_name(const char *s, char *why, size_t wlen)
{
    size_t n = strlen(s);

    if (n > 0 && n <= 64 &&
        strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                  "0123456789-_.") == n)
        return true;
    snprintf(why, wlen, "use 1 to 64 letters, digits, \"-\", \"_\" and "
             "\".\"");
    return false;
}

/* verify.path: the lookup's target under the upstream's base path. It goes
 * on a request line as written, so it must be a URI path (and query) there;
 * a brace other than {key}'s is a placeholder sluice would send literally. */
static bool valid_verify_path(const char *s, char *why, size_t wlen)
{
    const char *p;

    if (s[0] != '/') {
        snprintf(why, wlen, "a lookup path must start with \"/\": it goes "
                 "under the upstream's base path");
        return false;
    }
    if (!strstr(s, "{key}")) {
        snprintf(why, wlen, "a lookup path must contain {key}, where the "
                 "idempotency key goes");
        return false;
    }
    for (p = s; *p; p++) {
        if (!strncmp(p, "{key}", 5)) {
            p += 4;
        } else if (*p == '{' || *p == '}') {
            snprintf(why, wlen, "only {key} may stand in braces");
            return false;
        } else if (*p == '#' || (unsigned char)*p <= 0x20 ||
                   (unsigned char)*p >= 0x7f) {
            snprintf(why, wlen, "a lookup path has no fragment, spaces, "
                     "control characters or non-ASCII bytes; percent-encode "
                     "them");
            return false;
        }
    }
    return true;
}

/* ---- the schema ------------------------------------------------------ */

#define KEYS(a) .keys = (a), .n_keys = sizeof(a) / sizeof((a)[0])
#define FITS(a) _Static_assert(sizeof(a) / sizeof((a)[0]) <= CFG_MAX_KEYS, \
                               #a " has too many keys")

static const struct cfg_name backend_names[] = {
    {"rocksdb", SC_BACKEND_ROCKSDB}, {"redis", SC_BACKEND_REDIS}, {NULL, 0}};
static const struct cfg_name level_names[] = {
    {"error", SC_LOG_ERROR}, {"warn", SC_LOG_WARN}, {"info", SC_LOG_INFO},
    {"debug", SC_LOG_DEBUG}, {NULL, 0}};
static const struct cfg_name jitter_names[] = {
    {"full", SC_JITTER_FULL}, {"equal", SC_JITTER_EQUAL},
    {"none", SC_JITTER_NONE}, {NULL, 0}};
static const struct cfg_name mode_names[] = {
    {"enforce", SC_MODE_ENFORCE}, {"shadow", SC_MODE_SHADOW}, {NULL, 0}};
static const struct cfg_name shared_names[] = {
    {"local", SC_SHARED_LOCAL}, {"redis", SC_SHARED_REDIS}, {NULL, 0}};
static const struct cfg_name duplicates_names[] = {
    {"refuse", SC_DUP_REFUSE}, {"wait", SC_DUP_WAIT}, {NULL, 0}};
/* A lookup has no body to send: only the safe methods that read one. */
static const struct cfg_name verify_method_names[] = {
    {"GET", SC_M_GET}, {"HEAD", SC_M_HEAD}, {NULL, 0}};
static const struct cfg_name fp_names[] = {
    {"method", SC_FP_METHOD}, {"path", SC_FP_PATH}, {"body", SC_FP_BODY},
    {NULL, 0}};

#define CF(field) offsetof(struct sc_config, field)

/* The rows an upstream's tls block and store.tls share. */
#define TLS_ROWS \
    [TK_VERIFY] = {"verify", CT_BOOL, offsetof(struct sc_tls, verify), \
                   .def = "true"}, \
    [TK_CA_FILE] = {"ca_file", CT_STRING, offsetof(struct sc_tls, ca_file), \
                    .def = "", \
                    .pos_off = CFG_OPT(offsetof(struct sc_tls, ca_pos))}, \
    [TK_CERT_FILE] = {"cert_file", CT_STRING, \
                      offsetof(struct sc_tls, cert_file), .def = "", \
                      .pos_off = CFG_OPT(offsetof(struct sc_tls, cert_pos))}, \
    [TK_KEY_FILE] = {"key_file", CT_STRING, offsetof(struct sc_tls, key_file), \
                     .def = "", \
                     .pos_off = CFG_OPT(offsetof(struct sc_tls, key_pos))},

/* store.tls: the upstream's rows and server_name (a Redis reached by IP, or
 * through a tunnel, whose certificate names something else). */
static const struct cfg_key store_tls_keys[] = {
    TLS_ROWS
    [TK_SERVER_NAME] = {"server_name", CT_STRING,
                        offsetof(struct sc_tls, server_name), .def = ""},
};
static const struct cfg_block store_tls_block = {"tls", KEYS(store_tls_keys),
                                                 .check = cfg_check_tls};

static const struct cfg_key store_keys[] = {
    [SK_BACKEND] = {"backend", CT_ENUM, CF(store.backend), .def = "rocksdb",
                    .names = backend_names},
    [SK_PATH] = {"path", CT_STRING, CF(store.path), .def = "./data",
                 .valid = valid_nonempty},
    /* true: every write is fsynced before its call completes (survives a
     * power loss); the request path's writes share one fsync (group commit,
     * store/group_commit.h), admin writes sync each. */
    [SK_SYNC] = {"sync", CT_BOOL, CF(store.sync), .def = "false"},
    [SK_URL] = {"url", CT_STRING, CF(store.url), .def = "",
                .secret = CFG_SECRET_URL}, /* checked by cfg_check_store */
    [SK_KEY_PREFIX] = {"key_prefix", CT_STRING, CF(store.key_prefix),
                       .def = "sluice:"},
    [SK_FLEET_SIZE] = {"fleet_size", CT_U32, CF(store.fleet_size), .def = "1",
                       .min = "1"},
    [SK_TIMEOUT] = {"timeout", CT_DURATION, CF(store.timeout_ms),
                    .def = "100ms", .min = "1ms", .max = "60s"},
    [SK_SENTINELS] = {"sentinels", CT_ADDRS, CF(store.sentinels)},
    [SK_MASTER] = {"master", CT_STRING, CF(store.master), .def = ""},
    [SK_REPLICAS_ACK] = {"replicas_ack", CT_U32, CF(store.replicas_ack),
                         .def = "0", .max = "16"},
    [SK_TLS] = {"tls", CT_BLOCK, CF(store.tls), .block = &store_tls_block},
    /* Redis Cluster: the url's host:port and nodes are seeds (checked by
     * cfg_check_store). */
    [SK_CLUSTER] = {"cluster", CT_BOOL, CF(store.cluster), .def = "false"},
    [SK_NODES] = {"nodes", CT_ADDRS, CF(store.nodes)},
};
FITS(store_keys);
static const struct cfg_block store_block = {"store", KEYS(store_keys),
                                             .check = cfg_check_store};

static const struct cfg_key limits_keys[] = {
    {"max_body", CT_SIZE, CF(limits.max_body), .def = "8MiB"},
    {"max_header", CT_SIZE, CF(limits.max_header), .def = "16KiB",
     .min = "1KiB", .max = "1MiB"},
    {"max_connections", CT_U32, CF(limits.max_connections), .def = "4096",
     .min = "1"},
    /* A head that trickles in (slowloris) holds a connection and its pool;
     * 0 would turn the defence off, so it is refused. */
    {"header_timeout", CT_DURATION, CF(limits.header_timeout_ms), .def = "10s",
     .min = "1ms"},
    {"drain_timeout", CT_DURATION, CF(limits.drain_timeout_ms), .def = "10s"},
};
FITS(limits_keys);
static const struct cfg_block limits_block = {"limits", KEYS(limits_keys)};

static const struct cfg_key log_keys[] = {
    {"level", CT_ENUM, CF(log.level), .def = "info", .names = level_names},
    {"access", CT_BOOL, CF(log.access), .def = "true"},
};
static const struct cfg_block log_block = {"log", KEYS(log_keys)};

static const struct cfg_key metrics_keys[] = {
    {"statsd", CT_STRING, CF(metrics.statsd), .def = "",
     .valid = valid_statsd},
};
static const struct cfg_block metrics_block = {"metrics", KEYS(metrics_keys)};

#define CU(field) offsetof(struct sc_upstream, field)

static const struct cfg_key tls_keys[] = {
    TLS_ROWS
};
static const struct cfg_block tls_block = {"tls", KEYS(tls_keys),
                                           .check = cfg_check_tls};


static const struct cfg_key upstream_keys[] = {
    {"url", CT_URL, 0, .required = true},
    {"connect_timeout", CT_DURATION, CU(connect_timeout_ms), .def = "2s",
     .min = "1ms"},
    {"timeout", CT_DURATION, CU(timeout_ms), .def = "30s", .min = "1ms",
     .pos_off = CFG_OPT(CU(timeout_pos))},
    {"max_connections", CT_U32, CU(max_connections), .def = "64", .min = "1"},
    {"tls", CT_BLOCK, CU(tls), .block = &tls_block},
    {"proxy", CT_STRING, CU(proxy), .def = "", .valid = valid_proxy,
     .secret = CFG_SECRET_URL},
    {"headers", CT_HEADERS, CU(headers), .n_off = CU(n_headers)},
};
FITS(upstream_keys);
static const struct cfg_block upstream_block = {
    "upstream", KEYS(upstream_keys), .size = sizeof(struct sc_upstream),
    .name_off = CFG_OPT(CU(name)), .pos_off = CFG_OPT(CU(pos))};

#define CP(field) offsetof(struct sc_policy, field)
#define CR(field) offsetof(struct sc_retry, field)
#define CI(field) offsetof(struct sc_idempotency, field)
#define CB(field) offsetof(struct sc_breaker, field)

static bool partition_present(const void *obj)
{
    return ((const struct sc_policy *)obj)->partition_header != NULL;
}

static bool idem_present(const void *obj)
{
    return ((const struct sc_idempotency *)obj)->enabled;
}

static const struct cfg_key partition_keys[] = {
    {"header", CT_STRING, CP(partition_header), .required = true,
     .valid = valid_token},
    {"max", CT_U32, CP(partition_max), .def = "10000", .min = "1"},
};
/* partition's keys live flat in struct sc_policy. */
static const struct cfg_block partition_block = {
    "partition", KEYS(partition_keys), .present = partition_present};

static const struct cfg_key retry_keys[] = {
    [RK_ON] = {"on", CT_RETRY_ON, 0,
               .def = "429,502,503,504,connect_error,connection_lost,timeout"},
    [RK_BASE] = {"base", CT_DURATION, CR(base_ms), .def = "1s", .min = "1ms"},
    [RK_MULTIPLIER] = {"multiplier", CT_DOUBLE, CR(multiplier), .def = "2",
                       .min = "1", .max = "1000"},
    [RK_CAP] = {"cap", CT_DURATION, CR(cap_ms), .def = "6h", .min = "1ms"},
    [RK_MAX_ATTEMPTS] = {"max_attempts", CT_U32, CR(max_attempts), .def = "8",
                         .min = "1"},
    [RK_MAX_DELAY] = {"max_delay", CT_DURATION, CR(max_delay_ms), .def = "7d",
                      .min = "1s", .max = "7d"},
    [RK_JITTER] = {"jitter", CT_ENUM, CR(jitter), .def = "full",
                   .names = jitter_names},
};
FITS(retry_keys);
static const struct cfg_block retry_block = {"retry", KEYS(retry_keys),
                                             .check = cfg_check_retry};

static bool breaker_present(const void *obj)
{
    return ((const struct sc_breaker *)obj)->enabled;
}

static const struct cfg_key breaker_keys[] = {
    [BK_FAILURES] = {"failures", CT_U32, CB(failures), .def = "5", .min = "1"},
    [BK_PAUSE] = {"pause", CT_DURATION, CB(pause_ms), .def = "1s", .min = "1ms",
                  .max = "1h"},
    [BK_MAX_PAUSE] = {"max_pause", CT_DURATION, CB(max_pause_ms), .def = "1m",
                      .min = "1ms", .max = "1h"},
};
FITS(breaker_keys);
static const struct cfg_block breaker_block = {
    "breaker", KEYS(breaker_keys), .pos_off = CFG_OPT(CB(pos)),
    .present = breaker_present, .check = cfg_check_breaker};

#define CQ(field) offsetof(struct sc_quota, field)
#define CL(field) offsetof(struct sc_lane, field)

static bool quota_present(const void *obj)
{
    return ((const struct sc_quota *)obj)->enabled;
}

static const struct cfg_key quota_keys[] = {
    [QK_FOLLOW] = {"follow", CT_BOOL, CQ(follow), .def = "false"},
    /* No default row: it is rate / 100, which cfg_check_policy sets once the
     * policy's rate is known. */
    [QK_MIN_RATE] = {"min_rate", CT_RATE, CQ(min_rate),
                     .def_doc = "`rate` / 100",
                     .pos_off = CFG_OPT(CQ(min_rate_pos))},
};
static const struct cfg_block quota_block = {
    "quota", KEYS(quota_keys), .pos_off = CFG_OPT(CQ(pos)),
    .present = quota_present};

static const struct cfg_key lane_keys[] = {
    [LK_NAME] = {"name", CT_STRING, CL(name), .required = true,
                 .valid = valid_lane_name, .pos_off = CFG_OPT(CL(name_pos))},
    /* Above 0: the lane scheduler counts shares in hundredths of a percent
     * (policies/lanes.h), so its smallest share is the bound. */
    [LK_SHARE] = {"share", CT_PERCENT, CL(share), .required = true,
                  .min = "0.01%", .max = "100%",
                  .pos_off = CFG_OPT(CL(share_pos))},
    /* No default row: the policy's max_wait, set by cfg_check_policy. */
    [LK_MAX_WAIT] = {"max_wait", CT_DURATION, CL(max_wait_ms),
                     .def_doc = "the policy's `max_wait`",
                     .pos_off = CFG_OPT(CL(max_wait_pos))},
};
FITS(lane_keys);
static const struct cfg_block lane_block = {
    "lane", KEYS(lane_keys), .size = sizeof(struct sc_lane),
    .pos_off = CFG_OPT(CL(pos))};

#define CV(field) offsetof(struct sc_verify, field)

static bool verify_present(const void *obj)
{
    return ((const struct sc_verify *)obj)->enabled;
}

static const struct cfg_key verify_keys[] = {
    [VK_METHOD] = {"method", CT_ENUM, CV(method), .def = "GET",
                   .names = verify_method_names},
    [VK_PATH] = {"path", CT_STRING, CV(path), .required = true,
                 .valid = valid_verify_path},
    [VK_FOUND] = {"found", CT_CODES, CV(found), .def = "200", .nonempty = true},
    [VK_ABSENT] = {"absent", CT_CODES, CV(absent), .def = "404",
                   .nonempty = true},
    /* 0 is allowed: a partner that commits before it answers can be asked
     * at once. */
    [VK_AFTER] = {"after", CT_DURATION, CV(after_ms), .def = "1s"},
    [VK_ATTEMPTS] = {"attempts", CT_U32, CV(attempts), .def = "3", .min = "1"},
};
FITS(verify_keys);
static const struct cfg_block verify_block = {
    "verify", KEYS(verify_keys), .pos_off = CFG_OPT(CV(pos)),
    .present = verify_present, .check = cfg_check_verify};

static const struct cfg_key idem_keys[] = {
    [IK_HEADER] = {"header", CT_STRING, CI(header), .def = "Idempotency-Key",
     .valid = valid_token},
    [IK_METHODS] = {"methods", CT_METHODS, CI(methods), .def = "POST,PUT,PATCH,DELETE",
     .nonempty = true},
    [IK_REQUIRED] = {"required", CT_BOOL, CI(required), .def = "true"},
    [IK_TTL] = {"ttl", CT_DURATION, CI(ttl_ms), .def = "24h", .min = "1ms"},
    [IK_LEASE] = {"lease", CT_DURATION, CI(lease_ms), .def = "60s", .min = "1ms",
     .pos_off = CFG_OPT(CI(lease_pos))},
    [IK_FINGERPRINT] = {"fingerprint", CT_FLAGS, CI(fingerprint), .def = "method,path,body",
     .names = fp_names, .nonempty = true},
    [IK_REPLAY_STATUSES] = {"replay_statuses", CT_STATUSES, CI(replay_status), .def = "2xx,4xx"},
    [IK_MAX_STORED_BODY] = {"max_stored_body", CT_SIZE, CI(max_stored_body), .def = "1MiB"},
    [IK_DUPLICATES] = {"duplicates", CT_ENUM, CI(duplicates), .def = "refuse",
     .names = duplicates_names},
    [IK_VERIFY] = {"verify", CT_BLOCK, CI(verify), .block = &verify_block,
     .flag_off = CFG_OPT(CI(verify.enabled))},
};
FITS(idem_keys);
static const struct cfg_block idem_block = {
    "idempotency", KEYS(idem_keys), .pos_off = CFG_OPT(CI(pos)),
    .present = idem_present};

static const struct cfg_key policy_keys[] = {
    [PK_RATE] = {"rate", CT_RATE, CP(rate), .flag_off = CFG_OPT(CP(has_rate))},
    [PK_BURST] = {"burst", CT_U32, CP(burst), .def = "1", .min = "1"},
    [PK_MAX_WAIT] = {"max_wait", CT_DURATION, CP(max_wait_ms), .def = "2s"},
    [PK_CONCURRENCY] = {"concurrency", CT_U32, CP(concurrency), .def = "0"},
    [PK_MODE] = {"mode", CT_ENUM, CP(mode), .def = "enforce",
                 .names = mode_names},
    [PK_PARTITION] = {"partition", CT_BLOCK, 0, .block = &partition_block},
    [PK_SHARED] = {"shared", CT_ENUM, CP(shared), .def = "local",
                   .names = shared_names},
    [PK_RETRY] = {"retry", CT_BLOCK, CP(retry), .block = &retry_block},
    [PK_BREAKER] = {"breaker", CT_BLOCK, CP(breaker), .block = &breaker_block,
                    .flag_off = CFG_OPT(CP(breaker.enabled))},
    [PK_QUOTA] = {"quota", CT_BLOCK, CP(quota), .block = &quota_block,
                  .flag_off = CFG_OPT(CP(quota.enabled))},
    [PK_LANES] = {"lanes", CT_LIST, CP(lanes), .n_off = CP(n_lanes),
                  .block = &lane_block,
                  .pos_off = CFG_OPT(CP(lanes_pos))},
    [PK_LANE_HEADER] = {"lane_header", CT_STRING, CP(lane_header),
                        .def = "Sluice-Lane", .valid = valid_token},
    [PK_IDEMPOTENCY] = {"idempotency", CT_BLOCK, CP(idem), .block = &idem_block,
                        .flag_off = CFG_OPT(CP(idem.enabled))},
};
FITS(policy_keys);
const struct cfg_block cfg_policy_block = {
    "policy", KEYS(policy_keys), .size = sizeof(struct sc_policy),
    .name_off = CFG_OPT(CP(name)), .pos_off = CFG_OPT(CP(pos)),
    .check = cfg_check_policy};

#define CT(field) offsetof(struct sc_route, field)

static const struct cfg_key route_keys[] = {
    [RT_NAME] = {"name", CT_STRING, CT(name)},
    [RT_PREFIX] = {"prefix", CT_STRING, CT(prefix), .required = true,
                   .valid = valid_prefix},
    [RT_METHODS] = {"methods", CT_METHODS, CT(methods), .nonempty = true},
    [RT_UPSTREAM] = {"upstream", CT_UPSTREAM_REF, CT(upstream),
                     .required = true},
    [RT_POLICY] = {"policy", CT_POLICY_REF, CT(policy), .def = ""},
    [RT_STRIP] = {"strip_prefix", CT_STRING, CT(strip_prefix), .def = ""},
    /* No default: the upstream's applies ("" writes the same). */
    [RT_TIMEOUT] = {"timeout", CT_DURATION, CT(timeout_ms), .min = "1ms",
                    .flag_off = CFG_OPT(CT(has_timeout)),
                    .pos_off = CFG_OPT(CT(timeout_pos))},
    /* No default row: the policy's last lane, set by cfg_check_route. */
    [RT_LANE] = {"lane", CT_STRING, CT(lane),
                 .def_doc = "the policy's last lane",
                 .pos_off = CFG_OPT(CT(lane_pos))},
};
FITS(route_keys);
static const struct cfg_block route_block = {
    "route", KEYS(route_keys), .size = sizeof(struct sc_route),
    .pos_off = CFG_OPT(CT(pos)), .check = cfg_check_route};

/* Order matters: see the comment at the top of this file. */
static const struct cfg_key root_keys[] = {
    {"listen", CT_ADDR, CF(listen), .def = "127.0.0.1:8080"},
    {"admin", CT_ADDR, CF(admin), .def = "127.0.0.1:9901"},
    {"admin_token", CT_STRING, CF(admin_token), .def = "",
     .valid = valid_admin_token, .secret = CFG_SECRET_WHOLE},
    {"threads", CT_U32, CF(threads), .def = "0", .max = "256"},
    {"store", CT_BLOCK, 0, .block = &store_block},
    {"limits", CT_BLOCK, 0, .block = &limits_block},
    {"log", CT_BLOCK, 0, .block = &log_block},
    {"metrics", CT_BLOCK, 0, .block = &metrics_block},
    {"upstreams", CT_NAMED, CF(upstreams), .n_off = CF(n_upstreams),
     .block = &upstream_block, .required = true, .nonempty = true},
    {"policies", CT_NAMED, CF(policies), .n_off = CF(n_policies),
     .block = &cfg_policy_block},
    {"routes", CT_LIST, CF(routes), .n_off = CF(n_routes),
     .block = &route_block, .required = true, .nonempty = true},
};
FITS(root_keys);
const struct cfg_block cfg_root_block = {"config", KEYS(root_keys),
                                         .check = cfg_check_root};
