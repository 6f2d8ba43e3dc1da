/* Shared buckets and slots on Redis (contract §10, `shared: redis`): the
 * commands that call their scripts (whose sources are with the others, in
 * redis_scripts.c) and the reading of their replies.
 *
 * A bucket is one string per (policy, partition), `<prefix>{<policy>}:b` or
 * `<prefix>{<policy>}:b:<partition>`: "tat:pu", the GCRA's theoretical
 * arrival time and the end of a pause, both in microseconds of Redis's own
 * clock (TIME), so sidecars whose clocks disagree still share one
 * timeline; one GET and one SET (its expiry with it) per permit.
 * Microseconds since the epoch (~1.8e15) are exact in Lua's doubles,
 * nanoseconds would not be; they are written with %.0f, never tostring
 * (which rounds to 14 digits). An absent key is a full bucket, so each
 * expires once its bucket would be full again and its pause over. A policy
 * that follows its partner's quota keeps there too the numbers the newest
 * advertised quota gives (qt, qtau, µs) and when that was advertised (qa,
 * Unix ms), as "tat:pu:qt:qtau:qa", and when the quota's window resets
 * next, the numbers after that (":qr:qn:qntau:qra"): each permit carries
 * its sidecar's, the script keeps the newer and steps to the numbers after
 * the reset once it has passed. An earlier release kept the same fields in
 * a hash: the scripts read one and replace it by the string at their next
 * write.
 *
 * The fleet's slots of a policy are one sorted set, `<prefix>{<policy>}:s`,
 * of holders scored by when their hold runs out (ms of Redis's clock): a
 * holder that dies frees its slot then, and every take first drops the
 * holders whose time is up. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "store/store_redis_internal.h"
#include "util/hash.h"

/* Longer partition values are named by their 64-bit hash: keys stay short;
 * two such values sharing a bucket by accident is a 2^-64 event, and would
 * only pace them together. */
#define PARTITION_NAME_MAX 128

/* A bucket's key (kind 'b'), or its set of requests in flight ('f'). */
static void partition_key(const struct redis_store *st, const char *scope, char kind,
                          const char *partition, char out[REDIS_KEY_MAX])
{
    if (!partition)
        snprintf(out, REDIS_KEY_MAX, "%s{%s}:%c", st->prefix, scope, kind);
    else if (strlen(partition) <= PARTITION_NAME_MAX)
        snprintf(out, REDIS_KEY_MAX, "%s{%s}:%c:%s", st->prefix, scope, kind,
                 partition);
    else
        snprintf(out, REDIS_KEY_MAX, "%s{%s}:%c:#%016llx", st->prefix, scope, kind,
                 (unsigned long long)hash_str(HASH_INIT, partition));
}

void redis_bucket_key(const struct redis_store *st, const char *scope,
                      const char *partition, char out[REDIS_KEY_MAX])
{
    partition_key(st, scope, 'b', partition, out);
}

static void num(struct rcmd *cmd, int i, uint64_t v)
{
    snprintf(cmd->num[i], sizeof cmd->num[i], "%llu", (unsigned long long)v);
    redis_arg_str(cmd, cmd->num[i]);
}

void redis_bucket_args(struct rcmd *cmd, uint64_t t_ns, uint64_t tau_ns,
                       uint64_t wait_ns)
{
    num(cmd, 0, t_ns / 1000);
    num(cmd, 1, tau_ns / 1000);
    num(cmd, 2, wait_ns / 1000);
}

static void build_bucket(struct redis_store *st, enum store_op op,
                         const struct store_args *a, struct rcmd *cmd)
{
    redis_bucket_key(st, a->scope, a->partition, cmd->key);
    if (op == STORE_OP_PERMIT && a->seen_ms && a->flight)
        partition_key(st, a->scope, 'f', a->partition, cmd->key2);
    snprintf(cmd->info.name, sizeof cmd->info.name, "%s/(bucket)", a->scope);
    redis_evalsha(cmd, op == STORE_OP_PERMIT ? SCRIPT_PERMIT
                                             : SCRIPT_BUCKET_PAUSE);
    redis_bucket_args(cmd, a->t_ns, a->tau_ns,
                      op == STORE_OP_PERMIT ? a->max_wait_ns : a->pause_ns);
    /* A followed quota's numbers come with when they were advertised,
     * and with their next change (0 0 0 0: none known). */
    if (op == STORE_OP_PERMIT && a->seen_ms) {
        num(cmd, 3, a->seen_ms);
        num(cmd, 4, a->reset_in_ns / 1000);
        num(cmd, 5, a->next_t_ns / 1000);
        num(cmd, 6, a->next_tau_ns / 1000);
        num(cmd, 7, a->reset_ms);
        num(cmd, 8, a->top_up);
        /* Without a set of requests in flight its three arguments are
         * empty: the quiet times come after them. */
        redis_arg_str(cmd, a->flight ? a->flight : "");
        num(cmd, 9, a->flight ? a->hold_ms : 0);
        num(cmd, 10, a->flight ? a->top_up_f : 0);
        /* Rounded up: a quiet time never ends a hair early. */
        num(cmd, 11, (a->next_quiet_ns + 999) / 1000);
        num(cmd, 12, (a->quiet_ns + 999) / 1000);
    }
}

/* The request leaves the bucket's set of requests in flight. */
static void build_flight_end(struct redis_store *st, const struct store_args *a,
                             struct rcmd *cmd)
{
    partition_key(st, a->scope, 'f', a->partition, cmd->key);
    snprintf(cmd->info.name, sizeof cmd->info.name, "%s/(in flight)", a->scope);
    redis_evalsha(cmd, SCRIPT_FLIGHT_END);
    redis_arg_str(cmd, a->flight);
}

static void build_slot(struct redis_store *st, enum store_op op,
                       const struct store_args *a, struct rcmd *cmd)
{
    snprintf(cmd->key, sizeof cmd->key, "%s{%s}:s", st->prefix, a->scope);
    snprintf(cmd->info.name, sizeof cmd->info.name, "%s/(slots)", a->scope);
    if (op == STORE_OP_SLOT_GIVE) {
        redis_arg_str(cmd, "ZREM");
        redis_arg_str(cmd, cmd->key);
        redis_arg_str(cmd, a->holder);
        return;
    }
    redis_evalsha(cmd, SCRIPT_SLOT_TAKE);
    redis_arg_str(cmd, a->holder);
    num(cmd, 0, a->limit);
    num(cmd, 1, a->hold_ms);
}

int redis_bucket_build(struct redis_store *st, enum store_op op,
                       const struct store_args *a, struct rcmd *cmd,
                       struct sc_error *err)
{
    int rc = redis_scope_check(a->scope, err);

    if (rc)
        return rc;
    if (op == STORE_OP_PERMIT || op == STORE_OP_BUCKET_PAUSE)
        build_bucket(st, op, a, cmd);
    else if (op == STORE_OP_FLIGHT_END)
        build_flight_end(st, a, cmd);
    else
        build_slot(st, op, a, cmd);
    return 0;
}

bool redis_int_at(const redisReply *r, size_t i, long long *v)
{
    if (i >= r->elements || r->element[i]->type != REDIS_REPLY_INTEGER)
        return false;
    *v = r->element[i]->integer;
    return true;
}

static int permit_result(const struct redis_store *st,
                         const struct rcmd_info *info, const redisReply *r,
                         struct store_permit *pm, struct sc_error *err)
{
    long long granted, wait_us, paused;

    if (r->type != REDIS_REPLY_ARRAY || !redis_int_at(r, 0, &granted) ||
        !redis_int_at(r, 1, &wait_us) || !redis_int_at(r, 2, &paused) || wait_us < 0)
        return redis_unexpected(st, info, err);
    pm->granted = granted == 1;
    pm->paused = paused == 1;
    pm->wait_ns = (uint64_t)wait_us * 1000;
    return 0;
}

int redis_bucket_result(const struct redis_store *st,
                        const struct rcmd_info *info, const redisReply *r,
                        const struct rcmd_out *out, struct sc_error *err)
{
    if (info->op == STORE_OP_PERMIT) {
        if (!out->permit)
            return redis_unexpected(st, info, err);
        return permit_result(st, info, r, out->permit, err);
    }
    if (r->type != REDIS_REPLY_INTEGER)
        return redis_unexpected(st, info, err);
    if (info->op == STORE_OP_SLOT_TAKE && out->slot)
        out->slot->granted = r->integer == 1;
    if (info->op == STORE_OP_FLIGHT_END && out->permit)
        out->permit->flight = r->integer < 0 ? 0
                              : r->integer > UINT32_MAX ? UINT32_MAX
                                                        : (uint32_t)r->integer;
    return 0;
}
