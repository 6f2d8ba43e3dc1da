/* The config model's small queries and its destructor. config_free walks the
 * schema tables (config_internal.h), so it frees exactly what the loader may
 * have allocated, also in a half-built config after a failed load. */
#include "config/config.h"
#include "config/config_internal.h"

#include <stdlib.h>
#include <string.h>

const struct cfg_name cfg_method_names[] = {
    {"GET", SC_M_GET},         {"HEAD", SC_M_HEAD},   {"POST", SC_M_POST},
    {"PUT", SC_M_PUT},         {"PATCH", SC_M_PATCH}, {"DELETE", SC_M_DELETE},
    {"OPTIONS", SC_M_OPTIONS}, {"TRACE", SC_M_TRACE}, {"CONNECT", SC_M_CONNECT},
    {"OTHER", SC_M_OTHER},     {NULL, 0},
};

unsigned sc_method_bit(const char *name)
{
    const struct cfg_name *m;

    if (!name)
        return SC_M_OTHER;
    /* "OTHER" is the JSON view's name for the bit, not a method. */
    for (m = cfg_method_names; m->value != SC_M_OTHER; m++)
        if (strcmp(m->name, name) == 0)
            return (unsigned)m->value;
    return SC_M_OTHER;
}

bool sc_retry_on_status(const struct sc_retry *r, int status)
{
    return r && cfg_bit_test(r->on_status, status);
}

bool sc_idem_replays_status(const struct sc_idempotency *i, int status)
{
    return i && cfg_bit_test(i->replay_status, status);
}

bool sc_verify_found(const struct sc_verify *v, int status)
{
    return v && cfg_bit_test(v->found, status);
}

bool sc_verify_absent(const struct sc_verify *v, int status)
{
    return v && cfg_bit_test(v->absent, status);
}

const struct sc_upstream *config_upstream(const struct sc_config *cfg,
                                          const char *name)
{
    size_t i;

    if (!cfg || !name)
        return NULL;
    for (i = 0; i < cfg->n_upstreams; i++)
        if (cfg->upstreams[i].name && strcmp(cfg->upstreams[i].name, name) == 0)
            return &cfg->upstreams[i];
    return NULL;
}

long config_policy_index(const struct sc_config *cfg, const char *name)
{
    size_t i;

    if (!cfg || !name)
        return -1;
    for (i = 0; i < cfg->n_policies; i++)
        if (cfg->policies[i].name && strcmp(cfg->policies[i].name, name) == 0)
            return (long)i;
    return -1;
}

static void free_array(const struct cfg_key *k, void *obj)
{
    void **arr = CFG_FIELD(obj, k->off);
    size_t *n = CFG_FIELD(obj, k->n_off);
    const struct cfg_block *b = k->block;
    size_t i;

    for (i = 0; *arr && i < *n; i++) {
        void *elem = (char *)*arr + i * b->size;
        if (b->name_off)
            free(*(char **)CFG_FIELD(elem, b->name_off - 1));
        cfg_free_block(b, elem);
    }
    free(*arr);
    *arr = NULL;
    *n = 0;
}

static void free_headers(const struct cfg_key *k, void *obj)
{
    struct sc_header **hs = CFG_FIELD(obj, k->off);
    size_t *n = CFG_FIELD(obj, k->n_off);
    size_t i;

    for (i = 0; *hs && i < *n; i++) {
        free((*hs)[i].name);
        free((*hs)[i].value);
    }
    free(*hs);
    *hs = NULL;
    *n = 0;
}

static void free_url(struct sc_upstream *u)
{
    free(u->url);
    free(u->host);
    free(u->authority);
    free(u->base_path);
    u->url = u->host = u->authority = u->base_path = NULL;
}

void cfg_free_block(const struct cfg_block *b, void *obj)
{
    size_t i;

    for (i = 0; i < b->n_keys; i++) {
        const struct cfg_key *k = &b->keys[i];
        void *f = CFG_FIELD(obj, k->off);

        switch (k->type) {
        case CT_STRING:
            free(*(char **)f);
            *(char **)f = NULL;
            break;
        case CT_ADDR:
            free(((struct sc_addr *)f)->host);
            ((struct sc_addr *)f)->host = NULL;
            break;
        case CT_ADDRS:
            for (uint32_t j = 0; j < ((struct sc_addr_list *)f)->n; j++)
                free(((struct sc_addr_list *)f)->v[j].host);
            ((struct sc_addr_list *)f)->n = 0;
            break;
        case CT_URL:
            free_url(f);
            break;
        case CT_HEADERS:
            free_headers(k, obj);
            break;
        case CT_BLOCK:
            cfg_free_block(k->block, f);
            break;
        case CT_NAMED:
        case CT_LIST:
            free_array(k, obj);
            break;
        default:
            break;
        }
    }
}

void cfg_config_free(struct sc_config *cfg, const struct cfg_block *root,
                     const struct cfg_block *policy)
{
    if (!cfg)
        return;
    cfg_free_block(root, cfg);
    cfg_free_block(policy, &cfg->default_policy);
    free(cfg->default_policy.name);
    free(cfg->file);
    free(cfg);
}

void config_resolve(struct sc_config *cfg)
{
    for (size_t i = 0; i < cfg->n_routes; i++) {
        struct sc_route *r = &cfg->routes[i];

        r->up = &cfg->upstreams[r->upstream];
        r->pol = r->policy >= 0 ? &cfg->policies[r->policy] : &cfg->default_policy;
    }
}
