/* The configuration model: an immutable object built once from sidecar.yaml
 * (docs/contract.md §2) and shared read-only by every thread. Reload builds a new
 * one and swaps it; requests in flight keep a reference to the one they
 * started with. All durations are milliseconds, sizes bytes, rates per
 * second. Every string is owned by the config and freed by config_free(). */
#ifndef SLUICE_CONFIG_CONFIG_H
#define SLUICE_CONFIG_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/error.h"

/* HTTP methods as a bit mask (routes' and idempotency's `methods`). */
enum sc_method {
    SC_M_GET = 1 << 0,
    SC_M_HEAD = 1 << 1,
    SC_M_POST = 1 << 2,
    SC_M_PUT = 1 << 3,
    SC_M_PATCH = 1 << 4,
    SC_M_DELETE = 1 << 5,
    SC_M_OPTIONS = 1 << 6,
    SC_M_TRACE = 1 << 7,
    SC_M_CONNECT = 1 << 8,
    SC_M_OTHER = 1 << 15, /* any method not named above */
};
#define SC_M_ALL 0xffffu

/* Returns the bit for a method name (case-sensitive, as HTTP says), or
 * SC_M_OTHER for an unknown token. */
unsigned sc_method_bit(const char *name);

/* Where a value came from, for check-time errors reported after parsing
 * (e.g. a lease shorter than a paired upstream's timeout). */
struct sc_pos {
    int line, col;
};

struct sc_addr {
    char *host;     /* numeric or name; IPv6 without brackets */
    uint16_t port;
    struct sc_pos pos;
};

/* A short list of addresses (Redis Sentinels). */
#define SC_ADDR_LIST_MAX 8
struct sc_addr_list {
    struct sc_addr v[SC_ADDR_LIST_MAX];
    uint32_t n;
};

/* store.url, parsed (config_redis_url_parse). */
struct sc_redis_url {
    bool tls;               /* rediss:// */
    const char *host;
    unsigned port;
    const char *user;       /* NULL: the default user (AUTH password) */
    const char *password;   /* NULL: none */
    unsigned db;
};

/* Parses redis[s]://[[user]:password@]host[:port][/db] into *u (port 6379,
 * db 0 when left out; user and password may be %-encoded; rediss: TLS). The
 * strings go into buf (buflen bytes), which must outlive u. 0 or -EINVAL /
 * -ENOSPC with err, whose text never holds the password. */
int config_redis_url_parse(const char *url, struct sc_redis_url *u, char *buf,
                           size_t buflen, struct sc_error *err);

struct sc_header {
    char *name;
    char *value;    /* after ${ENV} substitution */
    bool from_env;  /* the raw value named a variable: a secret to redact */
};

struct sc_tls {
    bool verify;    /* default true */
    char *ca_file;  /* "" = system store */
    char *cert_file; /* client certificate (PEM) for mutual TLS; "" = none */
    char *key_file;  /* its private key (PEM) */
    char *server_name; /* store.tls only: the name checked and sent as SNI;
                          "" = the host connected to */
    struct sc_pos ca_pos, cert_pos, key_pos;
};

struct sc_upstream {
    char *name;
    char *url;          /* as written (after ${ENV}) */
    bool https;
    char *host;         /* from the URL, IPv6 without brackets */
    uint16_t port;      /* explicit or 80/443 */
    char *authority;    /* Host header value: host[:port] as in the URL */
    char *base_path;    /* "" or "/base" without a trailing slash */
    uint64_t connect_timeout_ms; /* default 2s */
    uint64_t timeout_ms;         /* default 30s */
    uint32_t max_connections;    /* default 64 */
    struct sc_tls tls;
    /* Egress proxy, http://[user:pass@]host:port; "" = direct. Parsed by
     * config_proxy_url_parse. */
    char *proxy;
    struct sc_header *headers;
    size_t n_headers;
    struct sc_pos pos, timeout_pos;
};

/* An upstream's `proxy`, parsed (config_proxy_url_parse). */
struct sc_proxy_url {
    const char *host;       /* IPv6 without brackets */
    unsigned port;
    const char *user;       /* NULL: no userinfo; %-escapes decoded */
    const char *password;   /* "" when the userinfo has no ':' */
};

/* Parses http://[user[:password]@]host:port[/] into *p; the strings go into
 * buf (buflen bytes), which must outlive p. The port is required (proxies
 * listen on no one port); https:// (TLS to the proxy itself) is refused.
 * 0 or -EINVAL / -ENOTSUP / -ENOSPC with err, whose text never holds the
 * userinfo. */
int config_proxy_url_parse(const char *url, struct sc_proxy_url *p, char *buf,
                           size_t buflen, struct sc_error *err);

enum sc_jitter { SC_JITTER_FULL = 0, SC_JITTER_EQUAL, SC_JITTER_NONE };

/* Transport failures that retry.on may name, as bits. */
enum sc_transport {
    SC_T_CONNECT_ERROR = 1 << 0,
    SC_T_CONNECTION_LOST = 1 << 1,
    SC_T_TIMEOUT = 1 << 2,
};

struct sc_retry {
    uint64_t on_status[10];   /* bit set of statuses 0..599 listed in `on` */
    unsigned on_transport;    /* SC_T_* bits */
    uint64_t base_ms;         /* default 1s */
    double multiplier;        /* default 2 */
    uint64_t cap_ms;          /* default 6h */
    uint32_t max_attempts;    /* default 8 */
    uint64_t max_delay_ms;    /* default 7d, at most 7d */
    enum sc_jitter jitter;    /* default full */
};

/* True when retry.on lists this status. */
bool sc_retry_on_status(const struct sc_retry *r, int status);

enum sc_fp_part { SC_FP_METHOD = 1 << 0, SC_FP_PATH = 1 << 1, SC_FP_BODY = 1 << 2 };

/* What a request that meets a key in progress does (docs/contract.md §6). */
enum sc_duplicates {
    SC_DUP_REFUSE = 0,        /* requeue / lease_held at once */
    SC_DUP_WAIT,              /* wait within max_wait for the holder's answer */
};

/* idempotency.verify (docs/contract.md §11): the partner's lookup of an
 * operation by the client's reference, made after an unknown outcome to
 * settle the key's lease sooner than its expiry. */
struct sc_verify {
    bool enabled;             /* the block is present */
    enum sc_method method;    /* SC_M_GET (default) or SC_M_HEAD */
    char *path;               /* required: starts with "/", holds "{key}" */
    uint64_t found[10];       /* bit set of statuses; default 200 */
    uint64_t absent[10];      /* default 404; never shares one with found */
    uint64_t after_ms;        /* default 1s */
    uint32_t attempts;        /* default 3, >= 1 */
    struct sc_pos pos;
};

/* True when the lookup's status is listed in found / absent. */
bool sc_verify_found(const struct sc_verify *v, int status);
bool sc_verify_absent(const struct sc_verify *v, int status);

struct sc_idempotency {
    bool enabled;             /* the block is present */
    char *header;             /* default Idempotency-Key */
    unsigned methods;         /* default POST PUT PATCH DELETE */
    bool required;            /* default true */
    uint64_t ttl_ms;          /* default 24h */
    uint64_t lease_ms;        /* default 60s */
    unsigned fingerprint;     /* SC_FP_* bits; default all three */
    uint64_t replay_status[10]; /* bit set of statuses; default 2xx and 4xx */
    uint64_t max_stored_body; /* default 1MiB */
    enum sc_duplicates duplicates; /* default refuse */
    struct sc_verify verify;
    struct sc_pos pos, lease_pos;
};

bool sc_idem_replays_status(const struct sc_idempotency *i, int status);

enum sc_mode { SC_MODE_ENFORCE = 0, SC_MODE_SHADOW };
enum sc_shared { SC_SHARED_LOCAL = 0, SC_SHARED_REDIS };

/* A policy's breaker (an extension of docs/contract.md §4's cooldown): after
 * `failures` upstream failures in a row (5xx, connect errors, lost
 * connections, timeouts) the policy's bucket pauses for `pause`, doubling
 * while the probe after each pause fails, up to `max_pause`. */
struct sc_breaker {
    bool enabled;             /* the block is present */
    uint32_t failures;        /* default 5, >= 1 */
    uint64_t pause_ms;        /* default 1s */
    uint64_t max_pause_ms;    /* default 1m, >= pause, <= 1h */
    struct sc_pos pos;
};

/* A policy's `quota` (policies/quota.h): pace to the quota the partner
 * advertises in its responses, never above `rate`. */
struct sc_quota {
    bool enabled;             /* the block is present */
    bool follow;              /* default false */
    double min_rate;          /* per second; default rate / 100 (set by the
                                 policy's check, once its rate is known) */
    struct sc_pos pos, min_rate_pos; /* min_rate_pos.line 0: defaulted */
};

/* One of a policy's `lanes` (policies/lanes.h): a queue of waiting requests
 * with a share of the permits while it has any. */
struct sc_lane {
    char *name;
    double share;             /* percent, 0 < share <= 100; a policy's add up
                                 to 100 */
    uint64_t max_wait_ms;     /* default: the policy's max_wait */
    struct sc_pos pos, name_pos, share_pos, max_wait_pos;
};

struct sc_policy {
    char *name;
    bool has_rate;            /* `rate` given: the policy has a bucket */
    double rate;              /* tokens per second, > 0 */
    uint32_t burst;           /* default 1, >= 1 */
    uint64_t max_wait_ms;     /* default 2s */
    uint32_t concurrency;     /* 0 = no limit */
    enum sc_mode mode;
    char *partition_header;   /* NULL = no partitions */
    uint32_t partition_max;   /* default 10000 */
    enum sc_shared shared;
    struct sc_retry retry;
    struct sc_breaker breaker;
    struct sc_quota quota;
    struct sc_lane *lanes;    /* NULL / 0: no lanes */
    size_t n_lanes;
    struct sc_pos lanes_pos;
    char *lane_header;        /* default Sluice-Lane */
    struct sc_idempotency idem;
    struct sc_pos pos;
};

struct sc_route {
    char *name;               /* metrics label; default the prefix */
    char *prefix;
    unsigned methods;         /* SC_M_ALL when not filtered */
    size_t upstream;          /* index into config->upstreams */
    long policy;              /* index into config->policies, -1 = default */
    /* The same, resolved once the config is loaded: never NULL (the
     * config's default_policy when the route names none). */
    const struct sc_upstream *up;
    const struct sc_policy *pol;
    char *strip_prefix;       /* "" = none */
    bool has_timeout;         /* `timeout` given: it replaces the upstream's */
    uint64_t timeout_ms;
    /* The route's lane: its name (default: the policy's last lane) and its
     * index into pol->lanes; NULL and -1 when the policy has no lanes. */
    char *lane;
    long lane_index;
    struct sc_pos pos, timeout_pos, lane_pos;
};

/* The timeout of a request on route r to upstream u: the route's own when
 * it has one, else the upstream's. */
static inline uint64_t sc_route_timeout(const struct sc_route *r,
                                        const struct sc_upstream *u)
{
    return r->has_timeout ? r->timeout_ms : u->timeout_ms;
}

enum sc_log_level { SC_LOG_ERROR = 0, SC_LOG_WARN, SC_LOG_INFO, SC_LOG_DEBUG };
enum sc_backend { SC_BACKEND_ROCKSDB = 0, SC_BACKEND_REDIS };

struct sc_config {
    char *file;               /* path it was loaded from */
    struct sc_addr listen;    /* default 127.0.0.1:8080 */
    struct sc_addr admin;     /* default 127.0.0.1:9901 */
    /* Bearer token for the admin requests that change state or reveal
     * stored bodies; "" (default): those are served to loopback peers only. */
    char *admin_token;
    uint32_t threads;         /* 0 = one per core (resolved at start) */
    struct {
        enum sc_backend backend;
        char *path;           /* default ./data */
        bool sync;
        char *url;            /* redis */
        char *key_prefix;     /* default "sluice:" */
        uint32_t fleet_size;  /* default 1 */
        uint64_t timeout_ms;  /* redis: one round trip; default 100ms */
        struct sc_addr_list sentinels; /* redis: find the primary through them */
        char *master;         /* redis: the Sentinel master name */
        struct sc_tls tls;    /* rediss: every connection, sentinels too */
        uint32_t replicas_ack; /* redis: WAIT for that many after a completion */
        bool cluster;         /* redis: Redis Cluster; url and nodes are seeds */
        struct sc_addr_list nodes; /* redis cluster: more seed nodes */
    } store;
    struct {
        uint64_t max_body;        /* default 8MiB */
        uint64_t max_header;      /* default 16KiB */
        uint32_t max_connections; /* default 4096 */
        uint64_t header_timeout_ms;/* default 10s: whole request head */
        uint64_t drain_timeout_ms;/* default 10s */
    } limits;
    struct {
        enum sc_log_level level;
        bool access;
    } log;
    struct {
        char *statsd;         /* "" = off */
    } metrics;
    struct sc_upstream *upstreams;
    size_t n_upstreams;
    struct sc_policy *policies;
    size_t n_policies;
    struct sc_route *routes;
    size_t n_routes;
    /* The policy routes without a `policy` use: no bucket, no limit, no
     * idempotency, the default retry block. */
    struct sc_policy default_policy;
};

/* Parses and validates a YAML file. On success returns 0 and an owned config
 * in *out. On failure returns a negative code and fills errs with every
 * problem found, each with file:line:col. */
int config_load_file(const char *path, struct sc_config **out,
                     struct sc_errors *errs);

/* Same, from a buffer; `name` is the file name used in errors. */
int config_load_string(const char *name, const char *yaml, size_t len,
                       struct sc_config **out, struct sc_errors *errs);

void config_free(struct sc_config *cfg);

/* The effective config as a JSON text (owned, free()), with header values
 * and secrets redacted; NULL on allocation failure. */
char *config_to_json(const struct sc_config *cfg);

/* Lookups by name; NULL / -1 when absent. */
const struct sc_upstream *config_upstream(const struct sc_config *cfg,
                                          const char *name);
long config_policy_index(const struct sc_config *cfg, const char *name);

/* The config reference (docs/configuration.md) as a Markdown table written
 * from the schema's rows: each key, its type, default and bounds. Owned,
 * free(); NULL without memory. */
char *config_reference_markdown(void);

#endif
