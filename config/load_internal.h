/* What the three parts of the config loader share, and nothing else:
 *
 *   load_engine.c  the table-driven engine: walks a document against the
 *                  rows of config_internal.h, reports problems, loads files
 *   schema.c       the rows themselves (every key of sidecar.yaml) and the
 *                  string validators they name
 *   checks.c       the block checks and cross-checks the rows point at
 *   upstream_url.c, upstream_headers.c
 *                  the rules of the two value types that are an upstream's
 *                  own (its url, its headers), which the engine applies
 *
 * The schema and the checks are data and rules about sluice's config; the
 * engine knows neither. They meet here: the loader state the checks report
 * through, the row indices a check reads its block's values by, and the
 * check functions the rows name. config_json.c and config_model.c need none
 * of it (they read only config_internal.h). */
#ifndef SLUICE_CONFIG_LOAD_INTERNAL_H
#define SLUICE_CONFIG_LOAD_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <yaml.h>

#include "config/config.h"
#include "config/config_internal.h"

/* Rows per block: the engine matches a mapping's keys into arrays this
 * long, and schema.c asserts that every table fits. */
#define CFG_MAX_KEYS 16

/* One load in progress. */
struct cfg_loader {
    const char *file;
    yaml_document_t doc;
    bool have_doc;
    struct sc_config *cfg;
    struct sc_errors *errs;
    size_t first_err;      /* errors before this index are the caller's */
    bool oom;
    char path[512];        /* dotted path of the key being parsed */
    char **scratch;        /* expanded scalars, freed with the loader */
    size_t n_scratch, cap_scratch;
    bool in_check;         /* a block check is reporting */
    struct sc_pos *bad;    /* where problems other than checks' were reported */
    size_t n_bad, cap_bad;
};

/* ---- engine helpers (load_engine.c) ----------------------------------- */

/* file:line:col of a node; {0, 0} for NULL (a defaulted key). */
struct sc_pos cfg_pos_of(const yaml_node_t *n);

/* A plain empty, "~" or "null" scalar: YAML's way of writing nothing. */
bool cfg_is_null(const yaml_node_t *n);

/* Replaces *field with a copy of s (lc->oom when it cannot). */
void cfg_set_string(struct cfg_loader *lc, char **field, const char *s);

/* An error at p, text as given. Every error goes through here so that each
 * is one line (control characters escaped). */
__attribute__((format(printf, 3, 4)))
void cfg_err_at(struct cfg_loader *lc, struct sc_pos p, const char *fmt, ...);

/* "PATH: text" at node n: a problem with the value being parsed. */
__attribute__((format(printf, 3, 4)))
void cfg_err_val(struct cfg_loader *lc, const yaml_node_t *n, const char *fmt, ...);

/* "PATH.key: text" at p: a block check about one of the block's keys. */
__attribute__((format(printf, 4, 5)))
void cfg_err_sub(struct cfg_loader *lc, struct sc_pos p, const char *key,
             const char *fmt, ...);

/* ---- row indices ------------------------------------------------------ */

/* A block check reads vals[i], the value node of row i (NULL when the key
 * was not given). schema.c lays the rows out with these as designated
 * initializers, so the two files cannot disagree about the order. */
enum { SK_BACKEND, SK_PATH, SK_SYNC, SK_URL, SK_KEY_PREFIX, SK_FLEET_SIZE,
       SK_TIMEOUT, SK_SENTINELS, SK_MASTER, SK_REPLICAS_ACK, SK_TLS,
       SK_CLUSTER, SK_NODES };
enum { TK_VERIFY, TK_CA_FILE, TK_CERT_FILE, TK_KEY_FILE, TK_SERVER_NAME };
enum { PK_RATE, PK_BURST, PK_MAX_WAIT, PK_CONCURRENCY, PK_MODE, PK_PARTITION,
       PK_SHARED, PK_RETRY, PK_BREAKER, PK_QUOTA, PK_LANES, PK_LANE_HEADER,
       PK_IDEMPOTENCY };
enum { QK_FOLLOW, QK_MIN_RATE };
enum { LK_NAME, LK_SHARE, LK_MAX_WAIT };
enum { BK_FAILURES, BK_PAUSE, BK_MAX_PAUSE };
enum { RK_ON, RK_BASE, RK_MULTIPLIER, RK_CAP, RK_MAX_ATTEMPTS, RK_MAX_DELAY,
       RK_JITTER };
enum { RT_NAME, RT_PREFIX, RT_METHODS, RT_UPSTREAM, RT_POLICY, RT_STRIP,
       RT_TIMEOUT, RT_LANE };
enum { VK_METHOD, VK_PATH, VK_FOUND, VK_ABSENT, VK_AFTER, VK_ATTEMPTS };
enum { IK_HEADER, IK_METHODS, IK_REQUIRED, IK_TTL, IK_LEASE, IK_FINGERPRINT,
       IK_REPLAY_STATUSES, IK_MAX_STORED_BODY, IK_DUPLICATES, IK_VERIFY };

/* ---- an upstream's url and headers (upstream_url.c, upstream_headers.c) */

/* Parses http(s)://host[:port][/base] into u's url, host, port, authority
 * and base_path (allocated; host NULL on failure). 0, or -EINVAL with the
 * reason in why. */
int config_upstream_url_parse(const char *s, struct sc_upstream *u, char *why,
                              size_t wlen);

/* NULL when an upstream may set header `name`; else "reserved" (sluice sets
 * it itself) or "invalid" (not an RFC 9110 token). */
const char *config_header_name_problem(const char *name);

/* NULL when `value` may be sent, else why not. */
const char *config_header_value_problem(const char *value);

/* ---- block checks (checks.c), named by the rows of schema.c ----------- */

/* Each has the signature of cfg_block.check: obj is the parsed block, vals
 * its value nodes by row index, where its position. */
void cfg_check_store(struct cfg_loader *lc, void *obj, yaml_node_t *const *vals,
                 struct sc_pos where);
void cfg_check_tls(struct cfg_loader *lc, void *obj, yaml_node_t *const *vals,
               struct sc_pos where);
void cfg_check_policy(struct cfg_loader *lc, void *obj, yaml_node_t *const *vals,
                  struct sc_pos where);
void cfg_check_breaker(struct cfg_loader *lc, void *obj, yaml_node_t *const *vals,
                   struct sc_pos where);
void cfg_check_retry(struct cfg_loader *lc, void *obj, yaml_node_t *const *vals,
                 struct sc_pos where);
void cfg_check_route(struct cfg_loader *lc, void *obj, yaml_node_t *const *vals,
                 struct sc_pos where);
void cfg_check_verify(struct cfg_loader *lc, void *obj, yaml_node_t *const *vals,
                  struct sc_pos where);
/* The whole config, once every section is parsed: listeners, leases. */
void cfg_check_root(struct cfg_loader *lc, void *obj, yaml_node_t *const *vals,
                struct sc_pos where);

#endif
