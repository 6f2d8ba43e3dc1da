#include "proxy/admin_policies.h"

#include "proxy/app.h"

/* The policy's own bucket's permits, wherever a reload moved them; NULL
 * for a policy paced by GCRA alone. Partitions follow their own quotas:
 * this is the unpartitioned bucket's view. */
static struct permits *permits_of(struct policy_state *ps)
{
    ps = pacing_live(ps);
    return ps->has_bucket ? ps->bucket.pm : NULL;
}

double admin_policy_rate(const struct sc_policy *p, struct policy_state *ps,
                         uint64_t now)
{
    struct permits *pm = permits_of(ps);
    struct permits_view v;

    if (!pm || !pm->follow)
        return p->rate;
    permits_view(pm, now, &v);
    return v.rate;
}

static json_t *num_or_null(bool known, double v)
{
    return known ? json_real(v) : json_null();
}

static json_t *item_json(const struct quota_item *it, uint64_t at)
{
    json_t *o = json_object();

    json_object_set_new(o, "name", it->style == QUOTA_DRAFT ? json_string(it->name)
                                                             : json_null());
    json_object_set_new(o, "limit", it->has_q ? json_integer((json_int_t)it->q)
                                              : json_null());
    json_object_set_new(o, "window", it->has_w ? json_integer(it->w) : json_null());
    json_object_set_new(o, "remaining", json_integer((json_int_t)it->r));
    json_object_set_new(o, "reset", json_real(it->moment > at ? (double)(it->moment - at) / 1e9
                                                              : 0));
    return o;
}

/* null until a response of the policy carried quota items. */
static json_t *advertised_json(const struct quota *q)
{
    json_t *o, *items;

    if (!q->n)
        return json_null();
    o = json_object();
    items = json_array();
    json_object_set_new(o, "at", json_real((double)q->at_wall_ms / 1000));
    for (uint32_t i = 0; i < q->n; i++)
        json_array_append_new(items, item_json(&q->items[i], q->at));
    json_object_set_new(o, "items", items);
    return o;
}

static json_t *lanes_json(const struct sc_policy *p, struct permits *pm)
{
    json_t *arr = json_array();

    for (size_t i = 0; i < p->n_lanes; i++) {
        json_t *l = json_object();

        json_object_set_new(l, "name", json_string(p->lanes[i].name));
        json_object_set_new(l, "share", json_real(p->lanes[i].share));
        json_object_set_new(l, "max_wait", json_real((double)p->lanes[i].max_wait_ms / 1000));
        json_object_set_new(l, "waiting",
                            json_integer(pm ? permits_waiting(pm, (uint32_t)i) : 0));
        json_array_append_new(arr, l);
    }
    return arr;
}

/* Partitions shown at most: the table may hold thousands. */
#define PARTITIONS_SHOWN 32

/* Each live partition's own followed numbers, most recently used first. */
static json_t *partitions_json(struct policy_state *ps, uint64_t now, size_t *live)
{
    static _Thread_local struct partition_view views[PARTITIONS_SHOWN];
    size_t n = pacing_partition_views(ps, now, views, PARTITIONS_SHOWN, live);
    json_t *arr = json_array();

    for (size_t i = 0; i < n; i++) {
        const struct permits_view *v = &views[i].v;
        json_t *o = json_object();

        json_object_set_new(o, "name", json_string(views[i].name));
        json_object_set_new(o, "effective_rate", json_real(v->rate));
        json_object_set_new(o, "effective_burst", json_integer(v->capacity));
        json_object_set_new(o, "source", json_string(v->limited ? "partner" : "config"));
        json_object_set_new(o, "advertised", advertised_json(&v->quota));
        json_array_append_new(arr, o);
    }
    return arr;
}

static json_t *policy_json(const struct sc_policy *p, struct policy_state *ps,
                           uint64_t now)
{
    struct permits *pm = permits_of(ps);
    struct permits_view v = {.rate = p->rate, .capacity = p->burst};
    bool follow = p->quota.enabled && p->quota.follow;
    json_t *o = json_object();

    if (pm)
        permits_view(pm, now, &v);
    json_object_set_new(o, "rate", num_or_null(p->has_rate, p->rate));
    json_object_set_new(o, "effective_rate", num_or_null(p->has_rate, v.rate));
    json_object_set_new(o, "burst", p->has_rate ? json_integer(p->burst) : json_null());
    json_object_set_new(o, "effective_burst",
                        p->has_rate ? json_integer(v.capacity) : json_null());
    json_object_set_new(o, "source", json_string(v.limited ? "partner" : "config"));
    json_object_set_new(o, "follow", json_boolean(follow));
    json_object_set_new(o, "min_rate", num_or_null(follow, p->quota.min_rate));
    json_object_set_new(o, "advertised", pm && pm->follow ? advertised_json(&v.quota)
                                                          : json_null());
    if (p->n_lanes)
        json_object_set_new(o, "lanes", lanes_json(p, pm));
    if (pm && p->partition_header) {
        size_t live = 0;

        json_object_set_new(o, "partitions", partitions_json(ps, now, &live));
        json_object_set_new(o, "partitions_live", json_integer((json_int_t)live));
    }
    return o;
}

json_t *admin_policies_json(const struct sc_config *cfg, struct pacing *pc,
                            uint64_t now, uint64_t wall_ms)
{
    json_t *root = json_object(), *all = json_object();

    (void)wall_ms;
    if (!root || !all) {
        json_decref(root);
        json_decref(all);
        return NULL;
    }
    for (size_t i = 0; i < cfg->n_policies; i++)
        json_object_set_new(all, cfg->policies[i].name,
                            policy_json(&cfg->policies[i], pc->pol[i], now));
    json_object_set_new(root, "policies", all);
    return root;
}
