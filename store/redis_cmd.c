/* The Redis backend's commands, built from a call's arguments, and the
 * reading of their replies: shared by the blocking calls (store_redis.c)
 * and the asynchronous ones (store_redis_async.c), so both answer alike.
 * Keys and scripts: see store_redis.c and redis_scripts.c. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/store_redis_internal.h"

/* Beyond this PXAT would overflow Redis's arithmetic: such a record (a
 * saturated expiry) is kept without a TTL (COMPLETE's put-back in
 * redis_scripts.c knows the same bound). */
#define PEXPIREAT_MAX ((uint64_t)1 << 62)

static uint64_t add_sat(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static void put_le(uint8_t *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* ---- commands ---- */

void redis_arg(struct rcmd *cmd, const void *p, size_t len)
{
    cmd->argv[cmd->argc] = p;
    cmd->len[cmd->argc++] = len;
}

void redis_arg_str(struct rcmd *cmd, const char *s)
{
    redis_arg(cmd, s, strlen(s));
}

static void fmt_at(char out[24], uint64_t expires_ms)
{
    if (expires_ms > PEXPIREAT_MAX)
        expires_ms = 0;
    snprintf(out, 24, "%llu", (unsigned long long)expires_ms);
}

/* The record's Redis key, after RocksDB's checks of scope and key. */
int redis_record_key(const struct redis_store *st, const char *scope,
                      const char *key, struct rcmd *cmd, struct sc_error *err)
{
    struct record_key k;
    int rc = record_key_make(&k, scope, key, err);

    if (rc)
        return rc;
    snprintf(cmd->key, sizeof cmd->key, "%s{%s}:k:%s", st->prefix, scope, key);
    snprintf(cmd->info.name, sizeof cmd->info.name, "%s/%s", scope, key);
    return 0;
}

int redis_scope_check(const char *scope, struct sc_error *err)
{
    struct record_key k;

    return record_key_make(&k, scope, "-", err); /* checks the scope */
}

int redis_pause_key(const struct redis_store *st, const char *scope,
                     struct rcmd *cmd, struct sc_error *err)
{
    int rc = redis_scope_check(scope, err);

    if (rc)
        return rc;
    snprintf(cmd->key, sizeof cmd->key, "%s{%s}:pause", st->prefix, scope);
    snprintf(cmd->info.name, sizeof cmd->info.name, "%s/(pause)", scope);
    return 0;
}

void redis_live_prefix(const struct redis_store *st, const char *scope,
                       char live[REDIS_KEY_MAX])
{
    snprintf(live, REDIS_KEY_MAX, "%s{%s}:live:", st->prefix, scope);
}

/* EVALSHA <sha> N <key> [<key2> [<key3>]]: the arguments follow. */
void redis_evalsha(struct rcmd *cmd, enum redis_script s)
{
    cmd->info.script = (int)s;
    redis_arg_str(cmd, "EVALSHA");
    redis_arg_str(cmd, redis_script_sha(s));
    redis_arg_str(cmd, cmd->key3[0] ? "3" : cmd->key2[0] ? "2" : "1");
    redis_arg_str(cmd, cmd->key);
    if (cmd->key2[0])
        redis_arg_str(cmd, cmd->key2);
    if (cmd->key3[0])
        redis_arg_str(cmd, cmd->key3);
}

/* Encoded in the command's own buffer, allocated only when it does not
 * fit (a completion with a large body): a lease and a small result cost
 * no allocation. */
int redis_arg_record(struct rcmd *cmd, const struct store_record *rec,
                     struct sc_error *err)
{
    size_t len;
    int rc = record_encode_to(rec, cmd->blob_inline, sizeof cmd->blob_inline,
                              &len, err);

    if (rc)
        return rc;
    if (len <= sizeof cmd->blob_inline) {
        redis_arg(cmd, cmd->blob_inline, len);
        return 0;
    }
    if ((rc = record_encode(rec, &cmd->blob, &len, err)) == 0)
        redis_arg(cmd, cmd->blob, len);
    return rc;
}

/* The record a new key gets, naming this process its holder; a
 * takeover's script keeps the stored created_ms and counts on from the
 * stored attempt. */
static struct store_record fresh_lease(const struct redis_store *st,
                                       const struct store_args *a)
{
    struct store_record fresh = {
        .state = STORE_IN_PROGRESS,
        .attempt = 1,
        .created_ms = a->now_ms,
        .lease_expires_ms = add_sat(a->now_ms, a->lease_ms),
        .lease = store_lease_draw(),
    };

    memcpy(fresh.fingerprint, a->fp, STORE_FP_LEN);
    memcpy(fresh.holder, st->holder, sizeof fresh.holder);
    /* The attempt count outlives the lease by ttl. */
    fresh.expires_ms = add_sat(fresh.lease_expires_ms, a->ttl_ms);
    return fresh;
}

/* The new key's record and its PXAT ms. */
static int lease_args(struct rcmd *cmd, const struct store_record *fresh,
                      struct sc_error *err)
{
    int rc;

    if ((rc = redis_arg_record(cmd, fresh, err)) != 0)
        return rc;
    fmt_at(cmd->at, fresh->expires_ms);
    redis_arg_str(cmd, cmd->at);
    return 0;
}

/* now, fingerprint, the new key's record, its PXAT ms. */
static int claim_args(struct redis_store *st, struct rcmd *cmd,
                      const struct store_args *a, struct sc_error *err)
{
    struct store_record fresh = fresh_lease(st, a);

    redis_arg(cmd, cmd->now, 8);
    redis_arg(cmd, a->fp, STORE_FP_LEN);
    return lease_args(cmd, &fresh, err);
}

/* The claim's arguments, then this process's id and the prefix of
 * liveness keys: the script tells whether a held lease's holder is
 * gone. */
static int build_acquire(struct redis_store *st, struct rcmd *cmd,
                         const struct store_args *a, struct sc_error *err)
{
    int rc;

    redis_live_prefix(st, a->scope, cmd->live);
    redis_evalsha(cmd, SCRIPT_ACQUIRE);
    if ((rc = claim_args(st, cmd, a, err)) != 0)
        return rc;
    redis_arg_str(cmd, st->holder);
    redis_arg_str(cmd, cmd->live);
    return 0;
}

/* The script of a keyed request's lookup, permit and lease serves several
 * requests of one bucket at once (redis_scripts.c), so its keys are the
 * bucket's first, in the record's hash tag, and the record's; its
 * arguments the bucket's numbers, this process's id and the liveness
 * keys' prefix, shared, and then the new key's record and its PXAT
 * (store_redis_async.c joins the commands of one loop by those parts; the
 * script reads now and the fingerprint from the record). A fresh key's
 * answer does not carry its lease back: info keeps it. The lease covers
 * the longest wait for the permit. */
static int build_permit_lease(struct redis_store *st, struct rcmd *cmd,
                              const struct store_args *a, struct sc_error *err)
{
    struct store_args covered = *a;
    struct store_record fresh;

    covered.lease_ms = add_sat(a->lease_ms, (a->max_wait_ns + 999999) / 1000000);
    redis_bucket_key(st, a->scope, a->partition, cmd->key2);
    redis_live_prefix(st, a->scope, cmd->live);
    cmd->info.script = SCRIPT_PERMIT_LEASE;
    redis_arg_str(cmd, "EVALSHA");
    redis_arg_str(cmd, redis_script_sha(SCRIPT_PERMIT_LEASE));
    redis_arg_str(cmd, "2");
    redis_arg_str(cmd, cmd->key2);
    redis_arg_str(cmd, cmd->key);
    redis_bucket_args(cmd, a->t_ns, a->tau_ns, a->max_wait_ns);
    redis_arg_str(cmd, st->holder);
    redis_arg_str(cmd, cmd->live);
    fresh = fresh_lease(st, &covered);
    cmd->info.fresh.lease = fresh.lease;
    cmd->info.fresh.lease_expires_ms = fresh.lease_expires_ms;
    memcpy(cmd->info.fresh.fp, fresh.fingerprint, STORE_FP_LEN);
    return lease_args(cmd, &fresh, err);
}

/* attempt, created_ms and fingerprint as the lease was taken when the
 * caller knows them (a->fp set), else 0: the script checks them against
 * the stored record's and writes those in when they differ; the lease is
 * the fence the script checks. */
static int build_complete(struct rcmd *cmd, const struct store_args *a,
                          struct sc_error *err)
{
    /* Borrows the caller's headers and body for encoding only; never
     * cleared, so the casts drop const without writing through it. */
    struct store_record done = {
        .state = STORE_COMPLETED,
        .lease_expires_ms = a->now_ms, /* the lease ends with the result */
        .completed_ms = a->now_ms,
        .expires_ms = add_sat(a->now_ms, a->ttl_ms),
        .lease = a->lease,
        .status = a->status,
        .headers = (struct store_header *)a->headers,
        .n_headers = a->n_headers,
        .body = a->body_omitted ? NULL : (uint8_t *)a->body,
        .body_len = a->body_omitted ? 0 : a->body_len,
        .body_omitted = a->body_omitted,
    };
    int rc;

    if (a->fp) {
        done.attempt = a->attempt;
        done.created_ms = a->created_ms;
        memcpy(done.fingerprint, a->fp, STORE_FP_LEN);
    }
    redis_evalsha(cmd, SCRIPT_COMPLETE);
    if ((rc = redis_arg_record(cmd, &done, err)) != 0)
        return rc;
    fmt_at(cmd->at, done.expires_ms);
    redis_arg_str(cmd, cmd->at);
    return 0;
}

/* unsent: the attempt count goes back to what it was before this attempt
 * (it never reached the upstream). */
static void build_release(struct rcmd *cmd, const struct store_args *a,
                          bool unsent)
{
    uint64_t expires = add_sat(a->now_ms, a->ttl_ms);

    cmd->info.attempt = a->attempt;
    put_le(cmd->lease, a->lease, 8);
    put_le(cmd->kept_attempt, unsent && a->attempt ? a->attempt - 1 : a->attempt,
           4);
    put_le(cmd->expires, expires, 8);
    fmt_at(cmd->at, expires);
    redis_evalsha(cmd, SCRIPT_RELEASE);
    redis_arg(cmd, cmd->now, 8);
    redis_arg(cmd, cmd->lease, 8);
    redis_arg(cmd, cmd->expires, 8);
    redis_arg_str(cmd, cmd->at);
    redis_arg(cmd, cmd->kept_attempt, 4);
}

/* The mark a waiting duplicate sets (record.h's flags, bits 2 and 3): on a
 * Cluster the end is announced on the sharded channel (SPUBLISH), else on
 * the plain one (a Redis 6 has no sharded pub/sub). */
#define WAITED_PLAIN "4"
#define WAITED_SHARDED "12"

static void build_watch(const struct redis_store *st, struct rcmd *cmd)
{
    redis_evalsha(cmd, SCRIPT_WATCH);
    redis_arg(cmd, cmd->now, 8);
    redis_arg_str(cmd, st->cluster ? WAITED_SHARDED : WAITED_PLAIN);
}

/* EXISTS <prefix>{scope}:live:<holder>: a plain read in the record's hash
 * tag (its slot on a Cluster). The holder comes from a stored record:
 * anything but an id's hex digits is refused, not sent. */
static int build_holder_look(const struct redis_store *st,
                             const struct store_args *a, struct rcmd *cmd,
                             struct sc_error *err)
{
    size_t n = a->holder ? strlen(a->holder) : 0;
    int rc = redis_scope_check(a->scope, err);

    if (rc)
        return rc;
    if (n == 0 || n > REDIS_HOLDER_LEN ||
        strspn(a->holder, "0123456789abcdef") != n) {
        sc_error_set(err, "store: policy %s: a lease's holder is not an id",
                     a->scope);
        return -EINVAL;
    }
    redis_live_prefix(st, a->scope, cmd->key);
    strncat(cmd->key, a->holder, sizeof cmd->key - strlen(cmd->key) - 1);
    snprintf(cmd->info.name, sizeof cmd->info.name, "%s/(holder)", a->scope);
    redis_arg_str(cmd, "EXISTS");
    redis_arg_str(cmd, cmd->key);
    return 0;
}

static void build_pause_set(struct rcmd *cmd, const struct store_args *a)
{
    snprintf(cmd->now_dec, sizeof cmd->now_dec, "%llu",
             (unsigned long long)a->now_ms);
    snprintf(cmd->until_dec, sizeof cmd->until_dec, "%llu",
             (unsigned long long)a->until_ms);
    fmt_at(cmd->at, a->until_ms);
    redis_evalsha(cmd, SCRIPT_PAUSE_SET);
    redis_arg_str(cmd, cmd->now_dec);
    redis_arg_str(cmd, cmd->until_dec);
    redis_arg_str(cmd, cmd->at);
}

int rcmd_build(struct redis_store *st, enum store_op op,
               const struct store_args *a, struct rcmd *cmd,
               struct sc_error *err)
{
    int rc;

    memset(cmd, 0, sizeof *cmd);
    cmd->info.op = op;
    cmd->info.script = -1;
    cmd->info.now_ms = a->now_ms;
    cmd->info.ttl_ms = a->ttl_ms;
    put_le(cmd->now, a->now_ms, 8);
    if (op >= STORE_OP_PERMIT && op <= STORE_OP_FLIGHT_END)
        return redis_bucket_build(st, op, a, cmd, err);
    if (op == STORE_OP_HOLDER_LOOK)
        return build_holder_look(st, a, cmd, err);
    rc = op == STORE_OP_PAUSE_SET ? redis_pause_key(st, a->scope, cmd, err)
                                  : redis_record_key(st, a->scope, a->key, cmd,
                                                     err);
    if (rc)
        return rc;
    switch (op) {
    case STORE_OP_GET:
        redis_arg_str(cmd, "GET");
        redis_arg_str(cmd, cmd->key);
        return 0;
    case STORE_OP_WATCH:
        build_watch(st, cmd);
        return 0;
    case STORE_OP_ACQUIRE:
        return build_acquire(st, cmd, a, err);
    case STORE_OP_PERMIT_LEASE:
        return build_permit_lease(st, cmd, a, err);
    case STORE_OP_COMPLETE:
        return build_complete(cmd, a, err);
    case STORE_OP_RELEASE:
    case STORE_OP_RELEASE_UNSENT:
        build_release(cmd, a, op == STORE_OP_RELEASE_UNSENT);
        return 0;
    case STORE_OP_PAUSE_SET:
        build_pause_set(cmd, a);
        return 0;
    default:
        break;
    }
    sc_error_set(err, "store: unknown operation %d", (int)op);
    return -EINVAL;
}

void rcmd_free(struct rcmd *cmd)
{
    free(cmd->blob); /* NULL unless a record did not fit blob_inline */
    cmd->blob = NULL;
}

/* ---- replies ---- */

bool redis_reply_noscript(const redisReply *r)
{
    return r && r->type == REDIS_REPLY_ERROR && r->str &&
           strncmp(r->str, "NOSCRIPT", 8) == 0;
}

bool redis_reply_readonly(const redisReply *r)
{
    return r && r->type == REDIS_REPLY_ERROR && r->str &&
           strncmp(r->str, "READONLY", 8) == 0;
}

int redis_unexpected(const struct redis_store *st,
                      const struct rcmd_info *info, struct sc_error *err)
{
    sc_error_set(err, "store: redis at %s: %s: unexpected reply", st->addr,
                 info->name);
    return -EPROTO;
}

static int decode_value(const struct rcmd_info *info, const redisReply *v,
                        struct store_record *rec, struct sc_error *err)
{
    struct sc_error derr;
    int rc;

    if (v->type != REDIS_REPLY_STRING) {
        sc_error_set(err, "store: %s: the stored value is not a string",
                     info->name);
        return -EBADMSG;
    }
    rc = record_decode((const uint8_t *)v->str, v->len, rec, &derr);
    if (rc)
        sc_error_set(err, "store: %s: %s", info->name, derr.text);
    return rc;
}

/* A value the scripts cannot work on ('X'): record_decode says why. */
static int unreadable(const struct rcmd_info *info, const redisReply *v,
                      struct sc_error *err)
{
    struct store_record rec;
    int rc = decode_value(info, v, &rec, err);

    if (rc)
        return rc;
    store_record_clear(&rec);
    sc_error_set(err, "store: %s: a record version the redis backend does "
                 "not read (it reads versions 2 to 5)", info->name);
    return -EPROTO;
}

void redis_name_error(struct sc_error *err, const struct rcmd_info *info,
                       const char *what)
{
    sc_error_set(err, "store: %s: %s", info->name, what);
}

static int get_result(const struct redis_store *st,
                      const struct rcmd_info *info, const redisReply *r,
                      struct store_record *rec, struct sc_error *err)
{
    int rc;

    if (r->type == REDIS_REPLY_NIL)
        return -ENOENT;
    if ((rc = decode_value(info, r, rec, err)) != 0)
        return rc;
    if (rec->expires_ms <= info->now_ms) {
        store_record_clear(rec);
        return -ENOENT;
    }
    return 0;
}

/* A held lease's answer: {'H', the record, 1 when its holder is gone}. */
static bool holder_gone(const redisReply *r)
{
    long long gone = 0;

    return r && redis_int_at(r, 2, &gone) && gone == 1;
}

static void lease_hint(const struct store_record *rec,
                       struct redis_lease_hint *hint)
{
    if (!hint)
        return;
    hint->lease = rec->lease;
    hint->attempt = rec->attempt;
    hint->created_ms = rec->created_ms;
    memcpy(hint->fp, rec->fingerprint, STORE_FP_LEN);
}

static int acquire_result(const struct rcmd_info *info, char verdict,
                          const redisReply *r, const redisReply *v,
                          struct store_acquire_out *out,
                          struct redis_lease_hint *hint, struct sc_error *err)
{
    struct store_record rec;
    int rc;

    if (verdict == 'M') {
        out->claim = STORE_MISMATCH;
        return 0;
    }
    if ((rc = decode_value(info, v, &rec, err)) != 0)
        return rc;
    if (verdict == 'A') {
        out->claim = STORE_ACQUIRED;
        out->attempt = rec.attempt;
        out->lease = rec.lease;
        out->lease_expires_ms = rec.lease_expires_ms;
        lease_hint(&rec, hint);
    } else if (verdict == 'H') {
        out->claim = STORE_HELD;
        out->remaining_ms = rec.lease_expires_ms > info->now_ms
                                ? rec.lease_expires_ms - info->now_ms : 0;
        out->verify = rec.verify;
        out->verify_deadline_ms = rec.verify_deadline_ms;
        out->lease = rec.lease;
        out->holder_gone = holder_gone(r);
    } else {
        out->claim = STORE_DONE;
        out->rec = rec; /* ownership moves to the caller */
        return 0;
    }
    store_record_clear(&rec);
    return 0;
}

/* permit_lease's 'R': the key is free but the permit was refused; v is
 * the record as it is, or "" for none. */
static int free_result(const struct rcmd_info *info, const redisReply *v,
                       struct store_acquire_out *out, struct sc_error *err)
{
    struct store_record rec;
    int rc;

    out->claim = STORE_FREE;
    out->attempt = 1;
    if (v->type == REDIS_REPLY_STRING && v->len == 0)
        return 0;
    if ((rc = decode_value(info, v, &rec, err)) != 0)
        return rc;
    out->attempt = rec.attempt < UINT32_MAX ? rec.attempt + 1 : rec.attempt;
    store_record_clear(&rec);
    return 0;
}

/* permit_lease's 'A' for a key nothing held: the lease as sent. */
static void fresh_result(const struct rcmd_info *info,
                         struct store_acquire_out *out,
                         struct redis_lease_hint *hint)
{
    out->claim = STORE_ACQUIRED;
    out->attempt = 1;
    out->lease = info->fresh.lease;
    out->lease_expires_ms = info->fresh.lease_expires_ms;
    if (!hint)
        return;
    hint->lease = info->fresh.lease;
    hint->attempt = 1;
    hint->created_ms = info->now_ms;
    memcpy(hint->fp, info->fresh.fp, STORE_FP_LEN);
}

/* A permit's answer (wait_us >= 0, µs) into p. */
static void permit_answer(struct store_permit *p, bool granted, bool paused,
                          long long wait_us)
{
    p->granted = granted;
    p->paused = paused;
    p->wait_ns = (uint64_t)wait_us * 1000;
}

/* permit_lease's answer for a key nothing held: the permit's wait alone
 * (µs); the lease is the record as sent. */
static int fresh_taken(const struct redis_store *st,
                       const struct rcmd_info *info, long long wait_us,
                       const struct rcmd_out *out, struct sc_error *err)
{
    if (wait_us < 0)
        return redis_unexpected(st, info, err);
    permit_answer(out->permit, true, false, wait_us);
    fresh_result(info, out->acq, out->hint);
    return 0;
}

/* permit_lease: the lease's verdicts as acquire's; 'A' (a key taken over)
 * and 'R' carry the permit's wait (and 'R' whether the policy is
 * paused). */
static int permit_lease_result(const struct redis_store *st,
                               const struct rcmd_info *info, char verdict,
                               const redisReply *r, const struct rcmd_out *out,
                               struct sc_error *err)
{
    const redisReply *v = r->elements > 1 ? r->element[1] : NULL;
    long long wait_us = 0, paused = 0;

    if (verdict == 'M' || (v && memchr("HD", verdict, 2)))
        return acquire_result(info, verdict, r, v, out->acq, NULL, err);
    if (!v || !memchr("AR", verdict, 2) || !redis_int_at(r, 2, &wait_us) ||
        wait_us < 0 || (verdict == 'R' && !redis_int_at(r, 3, &paused)))
        return redis_unexpected(st, info, err);
    permit_answer(out->permit, verdict == 'A', paused == 1, wait_us);
    if (verdict == 'A')
        return acquire_result(info, verdict, r, v, out->acq, out->hint, err);
    return free_result(info, v, out->acq, err);
}

static int stale(const struct rcmd_info *info, const redisReply *v,
                 struct sc_error *err)
{
    struct store_record rec;
    char why[64];
    int rc = decode_value(info, v, &rec, err);

    if (rc)
        return rc;
    snprintf(why, sizeof why, "another lease holds it (attempt %u)",
             (unsigned)rec.attempt);
    store_record_clear(&rec);
    redis_name_error(err, info, why);
    return -ESTALE;
}

/* complete and release: the verdicts that are not about the lease. */
static int write_result(const struct rcmd_info *info, char verdict,
                        const redisReply *v, struct sc_error *err)
{
    switch (verdict) {
    case 'O':
        return 0;
    case 'N':
        /* A completion with no record is a failure (its result is lost);
         * a release finds nothing to end: an answer, err untouched. */
        if (info->op == STORE_OP_COMPLETE)
            redis_name_error(err, info, "no live record to complete");
        return -ENOENT;
    case 'E':
        /* The first result stays: a worker may have seen it. */
        redis_name_error(err, info, "already completed; the stored result stays");
        return -EALREADY;
    default: /* 'S' */
        return stale(info, v, err);
    }
}

/* A script's answer: a verdict letter and, for some, a value. */
static int script_result(const struct redis_store *st,
                         const struct rcmd_info *info, const redisReply *r,
                         const struct rcmd_out *out, struct sc_error *err)
{
    const redisReply *v;
    char verdict;

    /* The scripts that serve several requests at once answer each one's
     * answer in one flat array: a command sent alone gets its one answer,
     * a joined one its part (redis_join_split). */
    if (info->op == STORE_OP_PERMIT_LEASE && out->acq && out->permit &&
        r->type == REDIS_REPLY_ARRAY && r->elements == 1 &&
        r->element[0]->type == REDIS_REPLY_INTEGER)
        return fresh_taken(st, info, r->element[0]->integer, out, err);
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 1 ||
        r->element[0]->type != REDIS_REPLY_STRING || r->element[0]->len != 1)
        return redis_unexpected(st, info, err);
    verdict = r->element[0]->str[0];
    v = r->elements > 1 ? r->element[1] : NULL;
    if (verdict == 'X' && v)
        return unreadable(info, v, err);
    if (info->op == STORE_OP_PERMIT_LEASE && out->acq && out->permit)
        return permit_lease_result(st, info, verdict, r, out, err);
    if (info->op == STORE_OP_ACQUIRE && out->acq) {
        if (verdict == 'M' || (v && memchr("AHD", verdict, 3)))
            return acquire_result(info, verdict, r, v, out->acq, out->hint,
                                  err);
    } else if (info->op != STORE_OP_ACQUIRE) if (memchr("ONE", verdict, 3) || (verdict == 'S' && v))
        return write_result(info, verdict, v, err);
    return redis_unexpected(st, info, err);
}

int rcmd_result(const struct redis_store *st, const struct rcmd_info *info,
                const redisReply *r, const struct rcmd_out *out,
                struct sc_error *err)
{
    struct store_record *rec = out->rec;
    struct store_acquire_out *acq = out->acq;

    if (rec)
        memset(rec, 0, sizeof *rec);
    if (acq)
        memset(acq, 0, sizeof *acq);
    if (r->type == REDIS_REPLY_ERROR) {
        sc_error_set(err, "store: redis at %s: %s: %s", st->addr, info->name,
                     r->str);
        return -EIO;
    }
    switch (info->op) {
    case STORE_OP_GET:
    case STORE_OP_WATCH: /* the value as GET gives it, or nil */
        return get_result(st, info, r, rec, err);
    case STORE_OP_PAUSE_SET:
        return r->type == REDIS_REPLY_INTEGER ? 0 : redis_unexpected(st, info, err);
    case STORE_OP_HOLDER_LOOK:
        if (r->type != REDIS_REPLY_INTEGER || !acq)
            return redis_unexpected(st, info, err);
        acq->holder_gone = r->integer == 0;
        return 0;
    case STORE_OP_PERMIT:
    case STORE_OP_BUCKET_PAUSE:
    case STORE_OP_SLOT_TAKE:
    case STORE_OP_SLOT_GIVE:
    case STORE_OP_FLIGHT_END:
        return redis_bucket_result(st, info, r, out, err);
    default:
        return script_result(st, info, r, out, err);
    }
}
