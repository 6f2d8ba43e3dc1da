#define _GNU_SOURCE
#include "support/cluster_server.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <sys/socket.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "support/testutil.h"

#define POLL_MS 50

static redisContext *conn(const struct redis_server *rs)
{
    struct timeval tv = {1, 0};
    redisContext *c = rs->pid ? redisConnectWithTimeout("127.0.0.1", (int)rs->port, tv)
                              : NULL;

    if (c && c->err) {
        redisFree(c);
        return NULL;
    }
    if (c)
        redisSetTimeout(c, (struct timeval){5, 0});
    return c;
}

/* One command (printf-style, hiredis's format) on rs; the reply or NULL. */
static redisReply *cmd(const struct redis_server *rs, const char *fmt, ...)
{
    redisContext *c = conn(rs);
    redisReply *r = NULL;
    va_list ap;

    if (!c)
        return NULL;
    va_start(ap, fmt);
    r = redisvCommand(c, fmt, ap);
    va_end(ap);
    redisFree(c);
    return r;
}

static bool cmd_ok(const struct redis_server *rs, const char *fmt, const char *a,
                   const char *b)
{
    redisReply *r = cmd(rs, fmt, a, b);
    bool ok = r && r->type != REDIS_REPLY_ERROR;

    freeReplyObject(r);
    return ok;
}

static bool myid(const struct redis_server *rs, char id[64])
{
    redisReply *r = cmd(rs, "CLUSTER MYID");
    bool ok = r && r->type == REDIS_REPLY_STRING && r->len < 64;

    if (ok)
        memcpy(id, r->str, r->len + 1);
    freeReplyObject(r);
    return ok;
}

static bool info_has(const struct redis_server *rs, const char *text)
{
    redisReply *r = cmd(rs, "CLUSTER INFO");
    bool has = r && r->type == REDIS_REPLY_STRING && strstr(r->str, text);

    freeReplyObject(r);
    return has;
}

bool cluster_server_wait_ok(const struct cluster_server *c, unsigned ms)
{
    unsigned total = c->n * (c->replicas ? 2 : 1);

    for (unsigned waited = 0; waited < ms; waited += POLL_MS) {
        bool ok = true;

        for (unsigned i = 0; ok && i < total; i++)
            if (c->srv[i].pid)
                ok = info_has(&c->srv[i], "cluster_state:ok");
        if (ok)
            return true;
        tu_sleep_ms(POLL_MS);
    }
    return false;
}

static bool slots_assign(const struct cluster_server *c)
{
    for (unsigned i = 0; i < c->n; i++) {
        unsigned lo = 16384 * i / c->n, hi = 16384 * (i + 1) / c->n - 1;
        redisReply *r = cmd(&c->srv[i], "CLUSTER ADDSLOTSRANGE %u %u", lo, hi);
        bool ok = r && r->type != REDIS_REPLY_ERROR;

        freeReplyObject(r);
        if (!ok)
            return false;
    }
    return true;
}

static bool meet_all(const struct cluster_server *c, unsigned total)
{
    for (unsigned i = 1; i < total; i++) {
        redisReply *r = cmd(&c->srv[0], "CLUSTER MEET 127.0.0.1 %u", c->srv[i].port);
        bool ok = r && r->type != REDIS_REPLY_ERROR;

        freeReplyObject(r);
        if (!ok)
            return false;
    }
    for (unsigned waited = 0; waited < 10000; waited += POLL_MS) {
        char want[64];
        bool all = true;

        snprintf(want, sizeof want, "cluster_known_nodes:%u", total);
        for (unsigned i = 0; all && i < total; i++)
            all = info_has(&c->srv[i], want);
        if (all)
            return true;
        tu_sleep_ms(POLL_MS);
    }
    return false;
}

/* A replica may only follow a primary it already knows as one. */
static bool replicate(const struct cluster_server *c)
{
    for (unsigned i = 0; i < c->n; i++) {
        char id[64];
        bool ok = false;

        if (!myid(&c->srv[i], id))
            return false;
        for (unsigned waited = 0; !ok && waited < 10000; waited += POLL_MS) {
            ok = cmd_ok(&c->srv[c->n + i], "CLUSTER REPLICATE %s", id, NULL);
            if (!ok)
                tu_sleep_ms(POLL_MS);
        }
        /* In sync: a replica that never was cannot be promoted. */
        if (!ok || !redis_server_wait_info(&c->srv[c->n + i], "replication",
                                           "master_link_status:up", 10000))
            return false;
    }
    return true;
}

int cluster_server_start(struct cluster_server *c, unsigned n, bool replicas)
{
    unsigned total = n * (replicas ? 2 : 1);
    const char *why = NULL;

    if (n == 0 || n > CLUSTER_PRIMARIES_MAX)
        return -1;
    c->n = n;
    c->replicas = replicas;
    for (unsigned i = 0; i < total; i++) {
        c->srv[i].cluster = true;
        if (redis_server_start(&c->srv[i], redis_server_bus_safe_port(), NULL) != 0)
            goto fail;
    }
    if (!slots_assign(c))
        why = "CLUSTER ADDSLOTSRANGE failed";
    else if (!meet_all(c, total))
        why = "the nodes did not meet";
    else if (replicas && !replicate(c))
        why = "the replicas did not follow their primaries";
    else if (!cluster_server_wait_ok(c, 20000))
        why = "cluster_state did not become ok";
    if (why) {
        fprintf(stderr, "cluster_server: %s (logs in %s, ...)\n", why, c->srv[0].dir);
        goto fail;
    }
    return 0;
fail:
    cluster_server_destroy(c);
    return -1;
}

void cluster_server_destroy(struct cluster_server *c)
{
    if (getenv("CLUSTER_KEEP"))
        for (unsigned i = 0; i < 2 * CLUSTER_PRIMARIES_MAX; i++)
            redis_server_stop(&c->srv[i]), c->srv[i].dir = NULL;
    for (unsigned i = 0; i < 2 * CLUSTER_PRIMARIES_MAX; i++)
        redis_server_destroy(&c->srv[i]);
}

int cluster_server_keyslot(const struct cluster_server *c, const char *key)
{
    for (unsigned i = 0; i < 2 * CLUSTER_PRIMARIES_MAX; i++) {
        redisReply *r = c->srv[i].pid ? cmd(&c->srv[i], "CLUSTER KEYSLOT %s", key) : NULL;
        int slot = r && r->type == REDIS_REPLY_INTEGER ? (int)r->integer : -1;

        freeReplyObject(r);
        if (slot >= 0)
            return slot;
    }
    return -1;
}

/* Whether rs is the primary that serves slot, by its own CLUSTER SLOTS. */
static bool serves(const struct redis_server *rs, int slot)
{
    redisReply *r = cmd(rs, "CLUSTER SLOTS"), *mine = cmd(rs, "CLUSTER MYID");
    bool yes = false;

    for (size_t i = 0; r && r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
        redisReply *e = r->element[i];

        if (e->elements >= 3 && slot >= e->element[0]->integer &&
            slot <= e->element[1]->integer && e->element[2]->elements >= 3 && mine &&
            mine->type == REDIS_REPLY_STRING &&
            !strcmp(e->element[2]->element[2]->str, mine->str))
            yes = true;
    }
    freeReplyObject(r);
    freeReplyObject(mine);
    return yes;
}

int cluster_server_owner(const struct cluster_server *c, const char *key)
{
    int slot = cluster_server_keyslot(c, key);

    for (unsigned i = 0; slot >= 0 && i < 2 * CLUSTER_PRIMARIES_MAX; i++)
        if (c->srv[i].pid && serves(&c->srv[i], slot))
            return (int)i;
    return -1;
}

/* MIGRATE of the slot's keys from src to dst, a few at a time. */
static bool migrate_keys(const struct redis_server *src, const struct redis_server *dst,
                         unsigned slot, unsigned pause_ms)
{
    for (int round = 0; round < 10000; round++) {
        redisReply *keys = cmd(src, "CLUSTER GETKEYSINSLOT %u 2", slot);
        bool ok = keys && keys->type == REDIS_REPLY_ARRAY;

        if (!ok || keys->elements == 0) {
            freeReplyObject(keys);
            return ok;
        }
        for (size_t i = 0; ok && i < keys->elements; i++) {
            redisReply *r = cmd(src, "MIGRATE 127.0.0.1 %u %b 0 5000", dst->port,
                                keys->element[i]->str, keys->element[i]->len);

            ok = r && r->type != REDIS_REPLY_ERROR;
            freeReplyObject(r);
        }
        freeReplyObject(keys);
        if (!ok)
            return false;
        tu_sleep_ms(pause_ms);
    }
    return false;
}

bool cluster_server_move_slot(const struct cluster_server *c, unsigned slot,
                              int from, int to, unsigned pause_ms)
{
    const struct redis_server *src = &c->srv[from], *dst = &c->srv[to];
    char src_id[64], dst_id[64], s[16];

    snprintf(s, sizeof s, "%u", slot);
    if (!myid(src, src_id) || !myid(dst, dst_id) ||
        !cmd_ok(dst, "CLUSTER SETSLOT %s IMPORTING %s", s, src_id) ||
        !cmd_ok(src, "CLUSTER SETSLOT %s MIGRATING %s", s, dst_id) ||
        !migrate_keys(src, dst, slot, pause_ms))
        return false;
    /* The new owner first, then the old one, then everyone (as redis-cli). */
    if (!cmd_ok(dst, "CLUSTER SETSLOT %s NODE %s", s, dst_id) ||
        !cmd_ok(src, "CLUSTER SETSLOT %s NODE %s", s, dst_id))
        return false;
    for (unsigned i = 0; i < 2 * CLUSTER_PRIMARIES_MAX; i++)
        if (c->srv[i].pid && (int)i != from && (int)i != to)
            cmd_ok(&c->srv[i], "CLUSTER SETSLOT %s NODE %s", s, dst_id);
    return true;
}

bool cluster_server_failover(const struct cluster_server *c, int replica, unsigned ms)
{
    const struct redis_server *rs = &c->srv[replica];

    if (!cmd_ok(rs, "CLUSTER FAILOVER", NULL, NULL))
        return false;
    for (unsigned waited = 0; waited < ms; waited += POLL_MS) {
        redisReply *r = cmd(rs, "ROLE");
        bool primary = r && r->type == REDIS_REPLY_ARRAY && r->elements &&
                       !strcmp(r->element[0]->str, "master");

        freeReplyObject(r);
        if (primary)
            return cluster_server_wait_ok(c, ms);
        tu_sleep_ms(POLL_MS);
    }
    return false;
}
