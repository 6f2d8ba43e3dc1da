/* The config schema's types, shared by the loader (load_engine.c, the rows
 * in schema.c, the checks in checks.c), the JSON writer (config_json.c) and
 * config_free (config_model.c). Not for other modules: they see only config.h.
 *
 * Every key is one row of a table: name, type, offset of its field, default
 * and bounds written in the config's own syntax, validator. The loader, the
 * defaults, the JSON view and the destructor all walk the same rows, so a key
 * added to schema.c is parsed, defaulted, shown and freed without further
 * code. */
#ifndef SLUICE_CONFIG_CONFIG_INTERNAL_H
#define SLUICE_CONFIG_CONFIG_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <yaml.h>

#include "config/config.h"

enum cfg_type {
    CT_STRING,       /* char * */
    CT_BOOL,         /* bool */
    CT_U32,          /* uint32_t */
    CT_DOUBLE,       /* double */
    CT_DURATION,     /* uint64_t milliseconds */
    CT_SIZE,         /* uint64_t bytes */
    CT_RATE,         /* double per second */
    CT_ENUM,         /* an enum, names from .names */
    CT_ADDR,         /* struct sc_addr */
    CT_ADDRS,        /* list of host:port -> struct sc_addr_list */
    CT_URL,          /* the whole struct sc_upstream (url, host, port, ...) */
    CT_METHODS,      /* list -> unsigned SC_M_* mask */
    CT_FLAGS,        /* list -> unsigned mask, names from .names */
    CT_STATUSES,     /* list of 2xx..5xx or codes -> uint64_t[10] bit set */
    CT_RETRY_ON,     /* list of codes and transport names -> struct sc_retry */
    CT_CODES,        /* list of status codes only -> uint64_t[10] bit set */
    CT_HEADERS,      /* mapping -> struct sc_header array + count at .n_off */
    CT_BLOCK,        /* nested mapping described by .block */
    CT_NAMED,        /* mapping name -> .block; array + count at .n_off */
    CT_LIST,         /* sequence of .block; array + count at .n_off */
    CT_UPSTREAM_REF, /* size_t index into cfg->upstreams */
    CT_POLICY_REF,   /* long index into cfg->policies, -1 = default policy */
    CT_PERCENT,      /* "30%" -> double percent */
    CT_COUNT
};

struct cfg_name {
    const char *name;
    int value;
};

struct cfg_block;

/* How much of a CT_STRING the JSON view (GET /config) hides. */
enum cfg_secret {
    CFG_PUBLIC = 0,     /* shown as is */
    CFG_SECRET_URL,     /* a URL: the password of its userinfo is redacted */
    CFG_SECRET_WHOLE,   /* redacted whole when not empty ("" shows it is off) */
};

/* Offsets of optional fields are stored plus one, so that 0 (what an omitted
 * designated initializer gives) means "none". */
#define CFG_OPT(off) ((off) + 1)

struct cfg_key {
    const char *name;
    enum cfg_type type;
    size_t off;                   /* field offset in the block's object */
    const char *def;              /* default as config text (lists: comma-
                                     separated); NULL = zero / empty */
    const char *def_doc;          /* a default a check sets (it depends on
                                     another key), as the reference says it */
    const char *min, *max;        /* inclusive bounds as config text */
    const struct cfg_name *names; /* CT_ENUM, CT_FLAGS; NULL-terminated */
    const struct cfg_block *block;
    size_t n_off;                 /* element count of arrays */
    /* CT_STRING: returns false and a reason when s is not acceptable. */
    bool (*valid)(const char *s, char *why, size_t wlen);
    size_t pos_off;               /* CFG_OPT(struct sc_pos) to record */
    size_t flag_off;              /* CFG_OPT(bool) set when the key is given */
    bool required;
    bool nonempty;                /* lists and collections */
    enum cfg_secret secret;       /* CT_STRING: what the JSON view hides */
};

struct cfg_loader;

struct cfg_block {
    const char *what;             /* "upstream", "policy", ... */
    const struct cfg_key *keys;
    size_t n_keys;
    size_t size;                  /* element size in collections */
    size_t name_off;              /* CFG_OPT(char *name) in elements */
    size_t pos_off;               /* CFG_OPT(struct sc_pos) of the block */
    /* Cross-key checks once the keys are parsed; vals[i] is the value node
     * of keys[i] or NULL when the key was not given. */
    void (*check)(struct cfg_loader *lc, void *obj, yaml_node_t *const *vals,
                  struct sc_pos where);
    /* JSON: false when the block is absent as a whole (shown as null). */
    bool (*present)(const void *obj);
};

#define CFG_FIELD(obj, off) ((void *)((char *)(obj) + (off)))
#define CFG_CFIELD(obj, off) ((const void *)((const char *)(obj) + (off)))

extern const struct cfg_block cfg_root_block;   /* struct sc_config */
extern const struct cfg_block cfg_policy_block; /* struct sc_policy */

extern const struct cfg_name cfg_method_names[]; /* SC_M_*, OTHER last */

/* Frees what the rows of b own inside obj (not obj itself). */
void cfg_free_block(const struct cfg_block *b, void *obj);
/* Frees a config made by the rows of root (its default policy by policy's). */
void cfg_config_free(struct sc_config *cfg, const struct cfg_block *root,
                     const struct cfg_block *policy);

/* load_engine.c: the generic engine, on the tables it is given: parses yaml
 * by the rows of root (and fills the default policy by policy's defaults),
 * with every error at its file:line:col. 0 and *out, or -EINVAL (errors in
 * errs), -ENOMEM. The config is not resolved yet (config_resolve). */
int cfg_engine_load(const char *name, const char *yaml, size_t len,
                    const struct cfg_block *root, const struct cfg_block *policy,
                    struct sc_config **out, struct sc_errors *errs);

static inline void cfg_bit_set(uint64_t *set, int status)
{
    set[status / 64] |= UINT64_C(1) << (status % 64);
}

static inline bool cfg_bit_test(const uint64_t *set, int status)
{
    return status >= 0 && status < 640 &&
           (set[status / 64] >> (status % 64)) & 1;
}

/* Writers of the config syntax (units.c): the largest exact unit, so the
 * JSON view and error messages read like the YAML. */
void units_format_duration(uint64_t ms, char *buf, size_t len);
void units_format_size(uint64_t bytes, char *buf, size_t len);
void units_format_rate(double per_sec, char *buf, size_t len);

/* Parses "host", "host:port", "[v6]" or "[v6]:port" (n bytes of s). *port is
 * -1 when absent; an empty port is an error. host is allocated. */
int units_parse_authority(const char *s, size_t n, char **host, int *port,
                          char *why, size_t wlen);

/* True for an RFC 9110 token (methods, header names). */
bool units_is_token(const char *s);

/* Points each route at its upstream and policy (the default one when it
 * names none), once the arrays are final. */
void config_resolve(struct sc_config *cfg);

#endif
