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
