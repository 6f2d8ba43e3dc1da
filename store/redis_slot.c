/* Redis Cluster's pure parts (redis_slot.h). */
#include "store/redis_slot.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* CRC16/XMODEM (polynomial 0x1021, initial 0), bit by bit: a key is short
 * and hashed once per command, so a table would buy nothing measurable. */
static unsigned crc16(const char *p, size_t len)
{
    unsigned crc = 0;

    for (size_t i = 0; i < len; i++) {
        crc ^= (unsigned)(unsigned char)p[i] << 8;
        for (int b = 0; b < 8; b++)
            crc = crc & 0x8000 ? (crc << 1) ^ 0x1021 : crc << 1;
        crc &= 0xffff;
    }
    return crc;
}

unsigned redis_key_slot(const char *key, size_t len)
{
    const char *open = memchr(key, '{', len), *close;

    if (open) {
        size_t rest = len - (size_t)(open - key) - 1;

        close = memchr(open + 1, '}', rest);
        if (close && close > open + 1)
            return crc16(open + 1, (size_t)(close - open - 1)) % REDIS_SLOTS;
    }
    return crc16(key, len) % REDIS_SLOTS;
}

static bool int_in(long long v, long long lo, long long hi)
{
    return v >= lo && v <= hi;
}

/* One element of CLUSTER SLOTS: [lo, hi, [host, port, id...], replicas...]. */
static int parse_range(const redisReply *e, const char *asked_host,
                       redis_slots_fn *fn, void *arg)
{
    const redisReply *p;
    const char *host;
    size_t hlen;

    if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
        e->element[0]->type != REDIS_REPLY_INTEGER ||
        e->element[1]->type != REDIS_REPLY_INTEGER ||
        !int_in(e->element[0]->integer, 0, REDIS_SLOTS - 1) ||
        !int_in(e->element[1]->integer, e->element[0]->integer, REDIS_SLOTS - 1))
        return -EPROTO;
    p = e->element[2];
    if (p->type != REDIS_REPLY_ARRAY || p->elements < 2 ||
        p->element[0]->type != REDIS_REPLY_STRING ||
        p->element[1]->type != REDIS_REPLY_INTEGER ||
        !int_in(p->element[1]->integer, 1, 65535))
        return -EPROTO;
    host = p->element[0]->str;
    hlen = p->element[0]->len;
    if (hlen == 0 || (hlen == 1 && host[0] == '?')) {
        /* The node asked does not know its own address: it is that one. */
        host = asked_host;
        hlen = strlen(asked_host);
    }
    return fn(arg, (unsigned)e->element[0]->integer,
              (unsigned)e->element[1]->integer, host, hlen,
              (unsigned)p->element[1]->integer);
}

int redis_slots_parse(const redisReply *r, const char *asked_host,
                      redis_slots_fn *fn, void *arg, struct sc_error *err)
{
    int rc;

    if (r->type == REDIS_REPLY_ERROR) {
        sc_error_set(err, "CLUSTER SLOTS failed: %s", r->str);
        return -EPROTO;
    }
    if (r->type != REDIS_REPLY_ARRAY) {
        sc_error_set(err, "CLUSTER SLOTS: not an array");
        return -EPROTO;
    }
    for (size_t i = 0; i < r->elements; i++) {
        if ((rc = parse_range(r->element[i], asked_host, fn, arg)) == -EPROTO) {
            sc_error_set(err, "CLUSTER SLOTS: range %zu is malformed", i);
            return rc;
        }
        if (rc)
            return rc;
    }
    return 0;
}

/* ---- CLUSTER SHARDS (Redis 7.0 on) ---- */

/* A RESP2 map is a flat array of name, value, ...: the value of name, or
 * NULL. */
static const redisReply *field(const redisReply *m, const char *name)
{
    size_t n = strlen(name);

    for (size_t i = 0; i + 1 < m->elements; i += 2) {
        const redisReply *k = m->element[i];

        if (k->type == REDIS_REPLY_STRING && k->len == n && !memcmp(k->str, name, n))
            return m->element[i + 1];
    }
    return NULL;
}

static bool is_str(const redisReply *r, const char *s)
{
    return r && r->type == REDIS_REPLY_STRING && r->len == strlen(s) &&
           !memcmp(r->str, s, r->len);
}

static bool is_map(const redisReply *r)
{
    return r && r->type == REDIS_REPLY_ARRAY && r->elements % 2 == 0;
}

/* The shard's primary (role "master"), or NULL: none at this moment (a
 * failover under way), so its slots stay unknown until the next read. */
static const redisReply *shard_primary(const redisReply *nodes)
{
    for (size_t i = 0; i < nodes->elements; i++)
        if (is_map(nodes->element[i]) && is_str(field(nodes->element[i], "role"), "master"))
            return nodes->element[i];
    return NULL;
}

/* The port sluice's connections reach: the TLS one over TLS, else the
 * plain one (a node lists the ports it has: "port", "tls-port"). */
static int node_port(const redisReply *node, bool tls, unsigned *port)
{
    const redisReply *plain = field(node, "port"), *sec = field(node, "tls-port");
    const redisReply *p = tls ? (sec ? sec : plain) : (plain ? plain : sec);

    if (!p || p->type != REDIS_REPLY_INTEGER || !int_in(p->integer, 1, 65535))
        return -EPROTO;
    *port = (unsigned)p->integer;
    return 0;
}

/* The node's endpoint as Redis prefers it (cluster-preferred-endpoint-type),
 * else its ip; "" or "?" (not known to itself): the node asked. */
static int node_host(const redisReply *node, const char *asked_host,
                     const char **host, size_t *hlen)
{
    const redisReply *h = field(node, "endpoint");

    if (!h)
        h = field(node, "ip");
    if (!h || h->type != REDIS_REPLY_STRING)
        return -EPROTO;
    *host = h->str;
    *hlen = h->len;
    if (*hlen == 0 || (*hlen == 1 && **host == '?')) {
        *host = asked_host;
        *hlen = strlen(asked_host);
    }
    return 0;
}

/* One shard: ["slots", [lo, hi, lo, hi, ...], "nodes", [node map, ...]]. */
static int parse_shard(const redisReply *s, const char *asked_host, bool tls,
                       redis_slots_fn *fn, void *arg)
{
    const redisReply *slots, *nodes, *primary;
    const char *host;
    size_t hlen;
    unsigned port;
    int rc;

    if (!is_map(s) || !(slots = field(s, "slots")) || !(nodes = field(s, "nodes")) ||
        slots->type != REDIS_REPLY_ARRAY || slots->elements % 2 ||
        nodes->type != REDIS_REPLY_ARRAY)
        return -EPROTO;
    if (slots->elements == 0 || !(primary = shard_primary(nodes)))
        return 0;
    if (node_host(primary, asked_host, &host, &hlen) || node_port(primary, tls, &port))
        return -EPROTO;
    for (size_t i = 0; i < slots->elements; i += 2) {
        const redisReply *lo = slots->element[i], *hi = slots->element[i + 1];

        if (lo->type != REDIS_REPLY_INTEGER || hi->type != REDIS_REPLY_INTEGER ||
            !int_in(lo->integer, 0, REDIS_SLOTS - 1) ||
            !int_in(hi->integer, lo->integer, REDIS_SLOTS - 1))
            return -EPROTO;
        if ((rc = fn(arg, (unsigned)lo->integer, (unsigned)hi->integer, host, hlen, port)))
            return rc;
    }
    return 0;
}

int redis_shards_parse(const redisReply *r, const char *asked_host, bool tls,
                       redis_slots_fn *fn, void *arg, struct sc_error *err)
{
    int rc;

    if (r->type == REDIS_REPLY_ERROR) {
        sc_error_set(err, "CLUSTER SHARDS failed: %s", r->str);
        return -EPROTO;
    }
    if (r->type != REDIS_REPLY_ARRAY) {
        sc_error_set(err, "CLUSTER SHARDS: not an array");
        return -EPROTO;
    }
    for (size_t i = 0; i < r->elements; i++) {
        if ((rc = parse_shard(r->element[i], asked_host, tls, fn, arg)) == -EPROTO) {
            sc_error_set(err, "CLUSTER SHARDS: shard %zu is malformed", i);
            return rc;
        }
        if (rc)
            return rc;
    }
    return 0;
}

bool redis_shards_unknown(const redisReply *r)
{
    return r->type == REDIS_REPLY_ERROR &&
           (!strncmp(r->str, "ERR", 3) || !strncmp(r->str, "NOPERM", 6));
}

bool redis_redirect_parse(const redisReply *r, struct redis_redirect *out)
{
    const char *p, *colon;
    char *end;
    unsigned long v;

    if (r->type != REDIS_REPLY_ERROR)
        return false;
    if (!strncmp(r->str, "MOVED ", 6))
        out->ask = false, p = r->str + 6;
    else if (!strncmp(r->str, "ASK ", 4))
        out->ask = true, p = r->str + 4;
    else
        return false;
    v = strtoul(p, &end, 10);
    if (end == p || *end != ' ' || v >= REDIS_SLOTS)
        return false;
    out->slot = (unsigned)v;
    p = end + 1;
    if (!(colon = strrchr(p, ':')) || colon == p)
        return false;
    v = strtoul(colon + 1, &end, 10);
    if (end == colon + 1 || *end || v == 0 || v > 65535)
        return false;
    out->host = p;
    out->hlen = (size_t)(colon - p);
    out->port = (unsigned)v;
    return true;
}

bool redis_reply_cluster_busy(const redisReply *r)
{
    return r->type == REDIS_REPLY_ERROR &&
           (!strncmp(r->str, "TRYAGAIN", 8) || !strncmp(r->str, "CLUSTERDOWN", 11));
}
