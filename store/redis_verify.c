/* A lease's verification mark on Redis (store.h store_verify_*, contract
 * §11): one script per step (redis_scripts.c VERIFY_*), each fenced to the
 * lease it names, so a claim is atomic fleet-wide and a late answer never
 * settles a successor's lease. The answers are RocksDB's (store_rocksdb.c). */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "store/store_redis_internal.h"

#define PEXPIREAT_MAX ((uint64_t)1 << 62)
#define MARK_FOUND 2 /* enum verify_state (policies/verify.h) */

static uint64_t add_sat(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static void put_le(uint8_t *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void fmt_at(char out[24], uint64_t expires_ms)
{
    snprintf(out, 24, "%llu",
             (unsigned long long)(expires_ms > PEXPIREAT_MAX ? 0 : expires_ms));
}

/* FOUND's record, encoded as a completion (its attempt, created_ms and
 * fingerprint are the stored record's: the script splices them in). */
static int found_args(struct rcmd *cmd, const struct store_verify_args *a,
                      struct sc_error *err)
{
    const struct store_record *res = a->result;
    struct store_record done = {
        .state = STORE_COMPLETED,
        .lease_expires_ms = a->now_ms,
        .completed_ms = a->now_ms,
        .expires_ms = add_sat(a->now_ms, a->ttl_ms),
        .lease = a->lease,
        .status = res->status,
        .headers = res->headers,
        .n_headers = res->n_headers,
        .body = res->body_omitted ? NULL : res->body,
        .body_len = res->body_omitted ? 0 : res->body_len,
        .body_omitted = res->body_omitted,
        .verify = MARK_FOUND,
        .verified = true,
    };
    int rc = redis_arg_record(cmd, &done, err);

    if (rc)
        return rc;
    fmt_at(cmd->at, done.expires_ms);
    redis_arg_str(cmd, cmd->at);
    return 0;
}

static const enum redis_script SCRIPT_OF[] = {
    [STORE_VERIFY_CLAIM] = SCRIPT_VERIFY_CLAIM,
    [STORE_VERIFY_FOUND] = SCRIPT_VERIFY_FOUND,
    [STORE_VERIFY_ABSENT] = SCRIPT_VERIFY_ABSENT,
    [STORE_VERIFY_FAILED] = SCRIPT_VERIFY_FAILED,
};

int redis_verify_build(struct redis_store *st, const char *scope,
                       const char *key, const struct store_verify_args *a,
                       struct rcmd *cmd, struct sc_error *err)
{
    int rc;

    memset(cmd, 0, sizeof *cmd);
    cmd->info.script = -1;
    cmd->info.now_ms = a->now_ms;
    if ((rc = redis_record_key(st, scope, key, cmd, err)) != 0)
        return rc;
    put_le(cmd->now, a->now_ms, 8);
    put_le(cmd->lease, a->lease, 8);
    redis_evalsha(cmd, SCRIPT_OF[a->step]);
    redis_arg(cmd, cmd->now, 8);
    redis_arg(cmd, cmd->lease, 8);
    switch (a->step) {
    case STORE_VERIFY_CLAIM:
        put_le(cmd->expires, a->deadline_ms, 8);
        redis_arg_str(cmd, a->again ? "1" : "0");
        redis_arg(cmd, cmd->expires, 8);
        redis_arg_str(cmd, st->holder);
        return 0;
    case STORE_VERIFY_FOUND:
        return found_args(cmd, a, err);
    case STORE_VERIFY_ABSENT:
        put_le(cmd->expires, add_sat(a->now_ms, a->ttl_ms), 8);
        fmt_at(cmd->at, add_sat(a->now_ms, a->ttl_ms));
        redis_arg(cmd, cmd->expires, 8);
        redis_arg_str(cmd, cmd->at);
        return 0;
    default:
        return 0;
    }
}

/* 'S': the record another lease holds, for the message. */
static int another_lease(const struct rcmd_info *info, const redisReply *r,
                         struct sc_error *err)
{
    struct store_record rec;
    char why[64] = "another lease holds it";

    if (r->elements > 1 && r->element[1]->type == REDIS_REPLY_STRING &&
        record_decode((const uint8_t *)r->element[1]->str, r->element[1]->len,
                      &rec, NULL) == 0) {
        snprintf(why, sizeof why, "another lease holds it (attempt %u)",
                 (unsigned)rec.attempt);
        store_record_clear(&rec);
    }
    redis_name_error(err, info, why);
    return -ESTALE;
}

int redis_verify_result(const struct redis_store *st,
                        const struct rcmd_info *info, const redisReply *r,
                        struct sc_error *err)
{
    if (r->type == REDIS_REPLY_ERROR) {
        sc_error_set(err, "store: redis at %s: %s: %s", st->addr, info->name,
                     r->str);
        return -EIO;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 1 ||
        r->element[0]->type != REDIS_REPLY_STRING || r->element[0]->len != 1)
        return redis_unexpected(st, info, err);
    switch (r->element[0]->str[0]) {
    case 'O':
        return 0;
    case 'N':
        return -ENOENT;
    case 'E':
    case 'K':
        return -EALREADY;
    case 'S':
        return another_lease(info, r, err);
    case 'L':
        redis_name_error(err, info, "its lease has ended");
        return -ESTALE;
    case 'X':
        redis_name_error(err, info, "a record version the redis backend does "
                         "not read");
        return -EPROTO;
    default:
        return redis_unexpected(st, info, err);
    }
}
