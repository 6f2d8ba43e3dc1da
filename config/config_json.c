/* config_to_json: the effective config for GET /config. It walks the same
 * schema rows as the loader, so every key appears, defaults included, in
 * the order of docs/contract.md §2, written in the config's own syntax:
 *
 *   durations  strings in the largest exact unit: "30s", "250ms", "7d", "0s"
 *   sizes      strings in the largest exact binary unit: "8MiB", "512"
 *   rates      strings: "10/s", "20/m"
 *   shares     strings: "30%"
 *   addresses  "127.0.0.1:8080", "[::1]:9901"
 *   counts, multiplier, booleans: JSON numbers and booleans; enums: names
 *   null       an absent optional block (idempotency, partition), no rate, a
 *              route without a methods filter, a route on the default policy
 *
 * One form for all values, and the one operators write, so the JSON can be
 * compared with sidecar.yaml by eye and, being YAML too, loads back as a
 * config. Secrets: every upstream header value is "<redacted>", and so is
 * the password in store.url (redis://user:<redacted>@host) and in an
 * upstream's proxy (http://user:<redacted>@host:port), and so is a
 * non-empty admin_token. */
#define _GNU_SOURCE
#include "config/config.h"
#include "config/config_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REDACTED "<redacted>"

typedef json_t *(*emit_fn)(const struct cfg_key *k, const void *obj,
                           const struct sc_config *cfg);

static json_t *emit_object(const struct cfg_block *b, const void *obj,
                           const struct sc_config *cfg);

/* The URL with the password of its userinfo replaced (the whole userinfo
 * when it has no user part, as in redis://secret@host). */
static char *redact_url(const char *url)
{
    const char *start = strstr(url, "://"), *end, *at, *colon;
    char *out;

    if (!start)
        return strdup(url);
    start += 3;
    end = start + strcspn(start, "/?#");
    at = memrchr(start, '@', (size_t)(end - start));
    if (!at)
        return strdup(url);
    colon = memchr(start, ':', (size_t)(at - start));
    start = colon ? colon + 1 : start;
    if (asprintf(&out, "%.*s" REDACTED "%s", (int)(start - url), url, at) < 0)
        return NULL;
    return out;
}

static json_t *emit_string(const struct cfg_key *k, const void *obj,
                           const struct sc_config *cfg)
{
    const char *s = *(char *const *)CFG_CFIELD(obj, k->off);
    char *red;
    json_t *j;

    if (!s)
        return json_null();
    if (k->secret == CFG_PUBLIC || (k->secret == CFG_SECRET_WHOLE && !*s))
        return json_string(s);
    if (k->secret == CFG_SECRET_WHOLE)
        return json_string(REDACTED);
    red = redact_url(s);
    j = red ? json_string(red) : NULL;
    free(red);
    return j;
}

static json_t *emit_bool(const struct cfg_key *k, const void *obj,
                         const struct sc_config *cfg)
{
    return json_boolean(*(const bool *)CFG_CFIELD(obj, k->off));
}

static json_t *emit_u32(const struct cfg_key *k, const void *obj,
                        const struct sc_config *cfg)
{
    return json_integer(*(const uint32_t *)CFG_CFIELD(obj, k->off));
}

static json_t *emit_double(const struct cfg_key *k, const void *obj,
                           const struct sc_config *cfg)
{
    return json_real(*(const double *)CFG_CFIELD(obj, k->off));
}

static json_t *emit_duration(const struct cfg_key *k, const void *obj,
                             const struct sc_config *cfg)
{
    char buf[32];

    if (k->flag_off && !*(const bool *)CFG_CFIELD(obj, k->flag_off - 1))
        return json_null();
    units_format_duration(*(const uint64_t *)CFG_CFIELD(obj, k->off), buf,
                          sizeof buf);
    return json_string(buf);
}

static json_t *emit_size(const struct cfg_key *k, const void *obj,
                         const struct sc_config *cfg)
{
    char buf[32];

    units_format_size(*(const uint64_t *)CFG_CFIELD(obj, k->off), buf,
                      sizeof buf);
    return json_string(buf);
}

static json_t *emit_rate(const struct cfg_key *k, const void *obj,
                         const struct sc_config *cfg)
{
    char buf[64];

    if (k->flag_off && !*(const bool *)CFG_CFIELD(obj, k->flag_off - 1))
        return json_null();
    units_format_rate(*(const double *)CFG_CFIELD(obj, k->off), buf, sizeof buf);
    return json_string(buf);
}

static json_t *emit_enum(const struct cfg_key *k, const void *obj,
                         const struct sc_config *cfg)
{
    int v = *(const int *)CFG_CFIELD(obj, k->off);
    const struct cfg_name *n;

    for (n = k->names; n->name; n++)
        if (n->value == v)
            return json_string(n->name);
    return json_integer(v);
}

static json_t *emit_addr(const struct cfg_key *k, const void *obj,
                         const struct sc_config *cfg)
{
    const struct sc_addr *a = CFG_CFIELD(obj, k->off);
    bool v6 = a->host && strchr(a->host, ':');
    char buf[300];

    if (!a->host)
        return json_null();
    snprintf(buf, sizeof buf, "%s%s%s:%u", v6 ? "[" : "", a->host,
             v6 ? "]" : "", a->port);
    return json_string(buf);
}

static json_t *emit_addrs(const struct cfg_key *k, const void *obj,
                          const struct sc_config *cfg)
{
    const struct sc_addr_list *l = CFG_CFIELD(obj, k->off);
    json_t *arr = json_array();

    for (uint32_t i = 0; arr && i < l->n; i++) {
        struct cfg_key one = {.off = 0};
        json_t *v = emit_addr(&one, &l->v[i], cfg);

        if (!v || json_array_append_new(arr, v) != 0) {
            json_decref(arr);
            return NULL;
        }
    }
    return arr;
}

static json_t *emit_url(const struct cfg_key *k, const void *obj,
                        const struct sc_config *cfg)
{
    const struct sc_upstream *u = CFG_CFIELD(obj, k->off);

    return u->url ? json_string(u->url) : json_null();
}

/* Appends v (taking it); false when v is NULL or the append fails. */
static bool push(json_t *arr, json_t *v)
{
    return v && json_array_append_new(arr, v) == 0;
}

static json_t *names_array(unsigned mask, const struct cfg_name *names)
{
    json_t *arr = json_array();
    bool ok = arr != NULL;

    for (; ok && names->name; names++)
        if (mask & (unsigned)names->value)
            ok = push(arr, json_string(names->name));
    if (!ok)
        json_decref(arr);
    return ok ? arr : NULL;
}

static json_t *emit_methods(const struct cfg_key *k, const void *obj,
                            const struct sc_config *cfg)
{
    unsigned mask = *(const unsigned *)CFG_CFIELD(obj, k->off);

    if (mask == SC_M_ALL)
        return json_null();
    return names_array(mask, cfg_method_names);
}

static json_t *emit_flags(const struct cfg_key *k, const void *obj,
                          const struct sc_config *cfg)
{
    return names_array(*(const unsigned *)CFG_CFIELD(obj, k->off), k->names);
}

static bool class_full(const uint64_t *set, int c)
{
    int s;

    for (s = c * 100; s < c * 100 + 100; s++)
        if (!cfg_bit_test(set, s))
            return false;
    return true;
}

/* Codes ascending; with classes, a full class of 2xx..5xx as "Nxx". */
static bool push_statuses(json_t *arr, const uint64_t *set, bool classes)
{
    char name[8];
    int c, s;

    for (c = 1; c <= 5; c++) {
        if (classes && c >= 2 && class_full(set, c)) {
            snprintf(name, sizeof name, "%dxx", c);
            if (!push(arr, json_string(name)))
                return false;
            continue;
        }
        for (s = c * 100; s < c * 100 + 100; s++)
            if (cfg_bit_test(set, s) && !push(arr, json_integer(s)))
                return false;
    }
    return true;
}

static json_t *emit_statuses(const struct cfg_key *k, const void *obj,
                             const struct sc_config *cfg)
{
    json_t *arr = json_array();

    if (arr && !push_statuses(arr, CFG_CFIELD(obj, k->off), true)) {
        json_decref(arr);
        return NULL;
    }
    return arr;
}

static json_t *emit_codes(const struct cfg_key *k, const void *obj,
                          const struct sc_config *cfg)
{
    json_t *arr = json_array();

    if (arr && !push_statuses(arr, CFG_CFIELD(obj, k->off), false)) {
        json_decref(arr);
        return NULL;
    }
    return arr;
}

static json_t *emit_retry_on(const struct cfg_key *k, const void *obj,
                             const struct sc_config *cfg)
{
    static const struct cfg_name transports[] = {
        {"connect_error", SC_T_CONNECT_ERROR},
        {"connection_lost", SC_T_CONNECTION_LOST},
        {"timeout", SC_T_TIMEOUT},
        {NULL, 0},
    };
    const struct sc_retry *r = CFG_CFIELD(obj, k->off);
    json_t *arr = json_array(), *names;
    bool ok = arr && push_statuses(arr, r->on_status, false);

    names = ok ? names_array(r->on_transport, transports) : NULL;
    ok = names && json_array_extend(arr, names) == 0;
    json_decref(names);
    if (!ok) {
        json_decref(arr);
        return NULL;
    }
    return arr;
}

static json_t *emit_headers(const struct cfg_key *k, const void *obj,
                            const struct sc_config *cfg)
{
    const struct sc_header *hs = *(struct sc_header *const *)CFG_CFIELD(obj, k->off);
    size_t n = *(const size_t *)CFG_CFIELD(obj, k->n_off), i;
    json_t *o = json_object();

    /* Values are never shown: they are credentials more often than not. */
    for (i = 0; o && i < n; i++) {
        if (json_object_set_new(o, hs[i].name, json_string(REDACTED))) {
            json_decref(o);
            return NULL;
        }
    }
    return o;
}

static json_t *emit_block(const struct cfg_key *k, const void *obj,
                          const struct sc_config *cfg)
{
    const void *field = CFG_CFIELD(obj, k->off);

    if (k->block->present && !k->block->present(field))
        return json_null();
    return emit_object(k->block, field, cfg);
}

static const void *elem_at(const struct cfg_key *k, const void *obj, size_t i)
{
    const char *arr = *(const char *const *)CFG_CFIELD(obj, k->off);

    return arr + i * k->block->size;
}

static size_t count_of(const struct cfg_key *k, const void *obj)
{
    return *(const size_t *)CFG_CFIELD(obj, k->n_off);
}

static json_t *emit_named(const struct cfg_key *k, const void *obj,
                          const struct sc_config *cfg)
{
    json_t *o = json_object();
    size_t i, n = count_of(k, obj);

    for (i = 0; o && i < n; i++) {
        const void *e = elem_at(k, obj, i);
        const char *name = *(char *const *)CFG_CFIELD(e, k->block->name_off - 1);
        if (json_object_set_new(o, name, emit_object(k->block, e, cfg))) {
            json_decref(o);
            return NULL;
        }
    }
    return o;
}

static json_t *emit_list(const struct cfg_key *k, const void *obj,
                         const struct sc_config *cfg)
{
    json_t *arr = json_array();
    size_t i, n = count_of(k, obj);

    for (i = 0; arr && i < n; i++) {
        if (!push(arr, emit_object(k->block, elem_at(k, obj, i), cfg))) {
            json_decref(arr);
            return NULL;
        }
    }
    return arr;
}

static json_t *emit_upstream_ref(const struct cfg_key *k, const void *obj,
                                 const struct sc_config *cfg)
{
    size_t i = *(const size_t *)CFG_CFIELD(obj, k->off);

    return i < cfg->n_upstreams ? json_string(cfg->upstreams[i].name)
                                : json_null();
}

static json_t *emit_policy_ref(const struct cfg_key *k, const void *obj,
                               const struct sc_config *cfg)
{
    long i = *(const long *)CFG_CFIELD(obj, k->off);

    return i >= 0 && (size_t)i < cfg->n_policies
               ? json_string(cfg->policies[i].name)
               : json_null();
}

static json_t *emit_percent(const struct cfg_key *k, const void *obj,
                            const struct sc_config *cfg)
{
    char buf[40];

    snprintf(buf, sizeof buf, "%.10g%%", *(const double *)CFG_CFIELD(obj, k->off));
    return json_string(buf);
}

static const emit_fn emitters[CT_COUNT] = {
    [CT_STRING] = emit_string,     [CT_BOOL] = emit_bool,
    [CT_U32] = emit_u32,           [CT_DOUBLE] = emit_double,
    [CT_DURATION] = emit_duration, [CT_SIZE] = emit_size,
    [CT_RATE] = emit_rate,         [CT_ENUM] = emit_enum,
    [CT_ADDR] = emit_addr,         [CT_URL] = emit_url,
    [CT_ADDRS] = emit_addrs,
    [CT_METHODS] = emit_methods,   [CT_FLAGS] = emit_flags,
    [CT_STATUSES] = emit_statuses, [CT_RETRY_ON] = emit_retry_on,
    [CT_CODES] = emit_codes,
    [CT_HEADERS] = emit_headers,   [CT_BLOCK] = emit_block,
    [CT_NAMED] = emit_named,       [CT_LIST] = emit_list,
    [CT_UPSTREAM_REF] = emit_upstream_ref,
    [CT_POLICY_REF] = emit_policy_ref,
    [CT_PERCENT] = emit_percent,
};

/* NULL on allocation failure (jansson reports nothing else here). */
static json_t *emit_object(const struct cfg_block *b, const void *obj,
                           const struct sc_config *cfg)
{
    json_t *o = json_object();
    size_t i;

    for (i = 0; o && i < b->n_keys; i++) {
        const struct cfg_key *k = &b->keys[i];
        if (json_object_set_new(o, k->name, emitters[k->type](k, obj, cfg))) {
            json_decref(o);
            return NULL;
        }
    }
    return o;
}

char *config_to_json(const struct sc_config *cfg)
{
    json_t *root;
    char *text;

    if (!cfg)
        return NULL;
    root = emit_object(&cfg_root_block, cfg, cfg);
    if (!root)
        return NULL;
    text = json_dumps(root, JSON_INDENT(2));
    json_decref(root);
    return text;
}
