/* The idempotency store on RocksDB (store.h). One key per (scope, key); the
 * value is a versioned record (record.h). Read-modify-write calls are made
 * atomic by striped in-process mutexes: RocksDB's LOCK file admits a single
 * process per directory, so no other writer can exist. */
#include "store/store.h"
#include "util/hash.h"
#include "util/rand.h"

#include <errno.h>
#include <stdio.h>
#include <sys/statvfs.h>
#include <time.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <rocksdb/c.h>

#include "store/group_commit.h"
#include "store/record.h"
#include "store/store_backend.h"
#include "store/store_rocksdb_internal.h"
#include "util/clock.h"

#define MIB ((size_t)1 << 20)
#define STRIPES 64
/* A small footprint: the store holds ttl's worth of small records and is
 * read by point lookups; it is no cache. */
#define WRITE_BUFFER_SIZE (4 * MIB)
#define MAX_WRITE_BUFFERS 2
#define BLOCK_CACHE_SIZE (8 * MIB)
#define MAX_OPEN_FILES 256
#define BLOOM_BITS_PER_KEY 10 /* most acquires look up a key that is absent */
#define INFO_LOG_SIZE (1 * MIB)
#define INFO_LOGS_KEPT 3
/* A sweep examines at most this many records per record it may delete, so
 * a store full of live records costs a bounded scan, not a full one. */
#define SWEEP_SCAN_FACTOR 16
#define CURSOR_MAX (sizeof ((struct record_key *)0)->buf + 1)

struct rocks_store {
    struct store base;                  /* first: the interface (store_backend.h) */
    rocksdb_t *db;
    rocksdb_options_t *opts;
    rocksdb_compactionfilter_t *filter; /* opts points at it: outlives db */
    rocksdb_writeoptions_t *wo;         /* the caller's durability */
    rocksdb_writeoptions_t *wo_sweep;   /* WAL, never fsync (see sweep_one) */
    /* sync mode: the asynchronous calls write with wo_group (no fsync) and
     * wait for the group commit's sync (group_commit.h) */
    rocksdb_writeoptions_t *wo_group;
    struct group_commit *gc;
    uint64_t stripe_seq[STRIPES];       /* under the stripe: its last grouped write */
    rocksdb_readoptions_t *ro;
    rocksdb_readoptions_t *ro_scan;     /* sweeps leave the cache to lookups */
    pthread_mutex_t stripes[STRIPES];
    pthread_mutex_t sweep_lock;         /* guards cursor */
    char cursor[CURSOR_MAX];            /* where the next sweep starts */
    size_t cursor_len;                  /* 0: at the beginning */
    atomic_bool failed;                 /* a write failed: see write_refused */
    char *path;
    _Atomic uint64_t space_checked_ms;  /* when free space was last read */
    _Atomic uint64_t space_free;        /* bytes free then */
    char failure[256];                  /* the first failure, for messages */
};

static const struct store_ops rocks_ops, rocks_sync_ops;
static int blocking_run(struct rocks_store *st, enum store_op op,
                        const struct store_args *a, void *out,
                        struct sc_error *err);
static int sync_wal(void *arg, struct sc_error *err);
static void rocks_close(struct store *base);

static struct rocks_store *rocks(struct store *base)
{
    return (struct rocks_store *)base;
}

/* ---- small helpers ---- */

static uint64_t add_sat(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

/* FNV-1a over the whole database key. */
static size_t stripe_index(const char *k, size_t len)
{
    return hash_bytes(HASH_INIT, k, len) % STRIPES;
}

static pthread_mutex_t *stripe_of(struct rocks_store *st, const char *k, size_t len)
{
    return &st->stripes[stripe_index(k, len)];
}

/* Reports a RocksDB failure on k and frees RocksDB's message. */
static int db_error(struct sc_error *err, const char *op,
                    const struct record_key *k, char *msg)
{
    size_t ns = strlen(k->buf);

    sc_error_set(err, "store: %s %s/%.*s failed: %s", op, k->buf,
                 (int)(k->len - ns - 1), k->buf + ns + 1, msg);
    rocksdb_free(msg);
    return -EIO;
}

/* A message about the record at k, naming it as scope/key. */
static void key_error(struct sc_error *err, const struct record_key *k,
                      const char *what)
{
    size_t ns = strlen(k->buf);

    sc_error_set(err, "store: %s/%.*s: %s", k->buf, (int)(k->len - ns - 1),
                 k->buf + ns + 1, what);
}

/* ---- records in the database ---- */

/* The raw stored value (rocksdb_free it); -ENOENT when there is none. */
static int db_get(struct rocks_store *st, const char *k, size_t klen, char **val,
                  size_t *len, char **msg)
{
    *msg = NULL;
    *val = rocksdb_get(st->db, st->ro, k, klen, len, msg);
    if (*msg)
        return -EIO;
    return *val ? 0 : -ENOENT;
}

/* The decoded record at k, whether it still counts or not. */
static int load(struct rocks_store *st, const struct record_key *k,
                struct store_record *rec, struct sc_error *err)
{
    struct sc_error derr;
    char *val, *msg;
    size_t len;
    int rc;

    memset(rec, 0, sizeof *rec);
    rc = db_get(st, k->buf, k->len, &val, &len, &msg);
    if (rc == -EIO)
        return db_error(err, "read", k, msg);
    if (rc)
        return rc;
    rc = record_decode((const uint8_t *)val, len, rec, &derr);
    if (rc)
        key_error(err, k, derr.text);
    rocksdb_free(val);
    return rc;
}

/* As load, but a record that no longer counts at now is absent. */
static int load_live(struct rocks_store *st, const struct record_key *k,
                     uint64_t now_ms, struct store_record *rec,
                     struct sc_error *err)
{
    int rc = load(st, k, rec, err);

    if (rc == 0 && rec->expires_ms <= now_ms) {
        store_record_clear(rec);
        return -ENOENT;
    }
    return rc;
}

/* After one failed write (a full disk, an I/O error) RocksDB's writer is in
 * an error state, and writing again trips an assertion in Debian's build
 * (WritableFileWriter, "sync_without_flush_called_"), killing the process.
 * So the first failure is sticky: later writes are refused here with the
 * original reason, the store reports itself unhealthy (/readyz), and a
 * restart, after the operator has made room, clears it. */
static bool write_refused(struct rocks_store *st, const struct record_key *k,
                          struct sc_error *err)
{
    if (!atomic_load(&st->failed))
        return false;
    key_error(err, k, st->failure);
    return true;
}

static int write_failed(struct rocks_store *st, struct sc_error *err, const char *op,
                        const struct record_key *k, char *msg)
{
    if (!atomic_exchange(&st->failed, true))
        snprintf(st->failure, sizeof st->failure,
                 "writes refused since a %s failed: %s", op, msg);
    return db_error(err, op, k, msg);
}

/* Free space below this is left to RocksDB: its preallocated WAL files,
 * memtable flushes and compactions (which briefly need their inputs' size
 * again) must always fit, or a full disk reaches RocksDB's writer (see
 * write_refused). */
#define SPACE_RESERVE ((uint64_t)64 << 20)
#define SPACE_CHECK_MS 100

static uint64_t mono_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Refuses a write while the disk is nearly full; looks at most every 100 ms,
 * so the cost is one statvfs per interval, not per write. Not sticky: once
 * room is made, writes go on. */
static bool low_space(struct rocks_store *st, const struct record_key *k,
                      struct sc_error *err)
{
    uint64_t now = mono_ms(), free_b;
    struct statvfs v;

    if (now - atomic_load(&st->space_checked_ms) >= SPACE_CHECK_MS &&
        statvfs(st->path, &v) == 0) {
        atomic_store(&st->space_free, (uint64_t)v.f_bavail * v.f_frsize);
        atomic_store(&st->space_checked_ms, now);
    }
    free_b = atomic_load(&st->space_free);
    if (free_b >= SPACE_RESERVE)
        return false;
    key_error(err, k, free_b < (1u << 20) ? "the disk is full"
                                          : "less than 64 MiB free on the store's disk");
    return true;
}

static bool rocks_healthy(struct store *base)
{
    struct rocks_store *st = rocks(base);
    return st && !atomic_load(&st->failed);
}

/* Writes rec with wo: st->wo (the caller's durability, the blocking calls)
 * or st->wo_group (not synced yet: the write's number goes to its stripe,
 * for the group commit). Called with k's stripe held. */
static int save(struct rocks_store *st, const struct record_key *k,
                const struct store_record *rec,
                const rocksdb_writeoptions_t *wo, struct sc_error *err)
{
    char *msg = NULL;
    uint8_t *buf;
    size_t len;
    int rc;

    if (write_refused(st, k, err) || low_space(st, k, err))
        return -ENOSPC;
    if ((rc = record_encode(rec, &buf, &len, err)) != 0)
        return rc;
    rocksdb_put(st->db, wo, k->buf, k->len, (const char *)buf, len, &msg);
    free(buf);
    if (msg)
        return write_failed(st, err, "write", k, msg);
    if (wo == st->wo_group)
        st->stripe_seq[stripe_index(k->buf, k->len)] = group_commit_note(st->gc);
    /* Until the next look at the disk, count what this write will take (in
     * the WAL, then in a table file), so a burst cannot run past the reserve. */
    {
        uint64_t cur = atomic_load(&st->space_free), use = 2 * (uint64_t)len;
        while (!atomic_compare_exchange_weak(&st->space_free, &cur,
                                             cur > use ? cur - use : 0))
            ;
    }
    return 0;
}

/* ---- open and close ---- */

/* Runs in RocksDB's background threads, so it reads the real clock. Values
 * it cannot read are kept: dropping them is an operator's call. */
static unsigned char expiry_filter(void *state, int level, const char *key,
                                   size_t key_len, const char *val,
                                   size_t val_len, char **new_val,
                                   size_t *new_len, unsigned char *changed)
{
    uint64_t expires;

    return record_peek_expiry((const uint8_t *)val, val_len, &expires) == 0 &&
           expires < clock_wall_ms();
}

static const char *expiry_filter_name(void *state)
{
    return "sluice.expiry";
}

static void expiry_filter_destroy(void *state)
{
}

static rocksdb_block_based_table_options_t *table_options(void)
{
    rocksdb_block_based_table_options_t *t = rocksdb_block_based_options_create();
    rocksdb_cache_t *cache = rocksdb_cache_create_lru(BLOCK_CACHE_SIZE);

    /* Both calls share ownership: the table options keep what they need. */
    rocksdb_block_based_options_set_block_cache(t, cache);
    rocksdb_cache_destroy(cache);
    rocksdb_block_based_options_set_filter_policy(
        t, rocksdb_filterpolicy_create_bloom_full(BLOOM_BITS_PER_KEY));
    return t;
}

static void make_options(struct rocks_store *st, bool sync)
{
    rocksdb_options_t *o = rocksdb_options_create();
    rocksdb_block_based_table_options_t *t = table_options();

    rocksdb_options_set_create_if_missing(o, 1);
    rocksdb_options_set_write_buffer_size(o, WRITE_BUFFER_SIZE);
    rocksdb_options_set_max_write_buffer_number(o, MAX_WRITE_BUFFERS);
    rocksdb_options_set_max_open_files(o, MAX_OPEN_FILES);
    /* Bodies are mostly text (JSON); LZ4 halves them at little CPU cost and
     * Debian's librocksdb links liblz4. open_db falls back to none. */
    rocksdb_options_set_compression(o, rocksdb_lz4_compression);
    rocksdb_options_set_max_log_file_size(o, INFO_LOG_SIZE);
    rocksdb_options_set_keep_log_file_num(o, INFO_LOGS_KEPT);
    rocksdb_options_set_block_based_table_factory(o, t);
    rocksdb_block_based_options_destroy(t);
    st->filter = rocksdb_compactionfilter_create(
        NULL, expiry_filter_destroy, expiry_filter, expiry_filter_name);
    rocksdb_options_set_compaction_filter(o, st->filter);
    st->opts = o;

    /* The WAL stays on in both modes: without sync a write is in the OS
     * before the call returns, so a kill -9 loses nothing acknowledged. */
    st->wo = rocksdb_writeoptions_create();
    rocksdb_writeoptions_set_sync(st->wo, sync);
    st->wo_sweep = rocksdb_writeoptions_create();
    st->ro = rocksdb_readoptions_create();
    st->ro_scan = rocksdb_readoptions_create();
    rocksdb_readoptions_set_fill_cache(st->ro_scan, 0);
}

static int open_error(const char *path, const char *msg, struct sc_error *err)
{
    /* RocksDB names its LOCK file whether another process holds it or this
     * one has the directory open already ("lock hold by current process"). */
    if (strstr(msg, "/LOCK")) {
        sc_error_set(err, "store: %s is in use by %s; a store directory serves "
                     "one sluice at a time (%s)", path,
                     strstr(msg, "current process") ? "this process already"
                                                    : "another process",
                     msg);
        return -EBUSY;
    }
    sc_error_set(err, "store: cannot open %s: %s", path, msg);
    return -EIO;
}

static int open_db(struct rocks_store *st, const char *path, struct sc_error *err)
{
    char *msg = NULL;
    int rc;

    st->db = rocksdb_open(st->opts, path, &msg);
    if (msg && strstr(msg, "not linked with the binary")) {
        /* A RocksDB built without LZ4: run uncompressed rather than not. */
        rocksdb_free(msg);
        msg = NULL;
        rocksdb_options_set_compression(st->opts, rocksdb_no_compression);
        st->db = rocksdb_open(st->opts, path, &msg);
    }
    if (!msg)
        return 0;
    st->db = NULL;
    rc = open_error(path, msg, err);
    rocksdb_free(msg);
    return rc;
}

int store_open_rocksdb(const char *path, bool sync, struct store **out,
               struct sc_error *err)
{
    struct rocks_store *st;
    int rc;

    *out = NULL;
    if (!path || !*path) {
        sc_error_set(err, "store: a path is required");
        return -EINVAL;
    }
    st = calloc(1, sizeof *st);
    if (!st) {
        sc_error_set(err, "store: out of memory");
        return -ENOMEM;
    }
    st->base.ops = &rocks_ops;
    for (size_t i = 0; i < STRIPES; i++)
        pthread_mutex_init(&st->stripes[i], NULL);
    pthread_mutex_init(&st->sweep_lock, NULL);
    make_options(st, sync);
    st->path = strdup(path);
    atomic_store(&st->space_free, UINT64_MAX);
    if (!st->path) {
        rc = -ENOMEM;
        sc_error_set(err, "store: out of memory");
        goto fail;
    }
    if ((rc = open_db(st, path, err)) != 0)
        goto fail;
    if (sync) {
        /* The request path's writes wait for a shared sync (group_commit.h)
         * instead of each syncing on its loop. */
        st->wo_group = rocksdb_writeoptions_create();
        if ((rc = group_commit_open(sync_wal, st, &st->gc, err)) != 0)
            goto fail;
        st->base.ops = &rocks_sync_ops;
    }
    *out = &st->base;
    return 0;
fail:
    rocks_close(&st->base);
    return rc;
}

static void rocks_close(struct store *base)
{
    struct rocks_store *st = rocks(base);

    if (!st)
        return;
    /* Its loops are gone (each cancelled its calls): nothing waits. */
    group_commit_close(st->gc);
    if (st->db && !atomic_load(&st->failed)) {
        rocksdb_flushoptions_t *fo = rocksdb_flushoptions_create();
        char *msg = NULL;

        /* Not needed for durability (the WAL has every write); it spares
         * the next open a WAL replay. A failure leaves the WAL to do that. */
        rocksdb_flushoptions_set_wait(fo, 1);
        rocksdb_flush(st->db, fo, &msg);
        rocksdb_free(msg);
        rocksdb_flushoptions_destroy(fo);
    }
    /* After a failed write no flush is tried (see write_refused); the WAL
     * holds what was acknowledged. */
    if (st->db)
        rocksdb_close(st->db);
    rocksdb_readoptions_destroy(st->ro_scan);
    rocksdb_readoptions_destroy(st->ro);
    rocksdb_writeoptions_destroy(st->wo_sweep);
    if (st->wo_group)
        rocksdb_writeoptions_destroy(st->wo_group);
    rocksdb_writeoptions_destroy(st->wo);
    rocksdb_options_destroy(st->opts);
    free(st->path);
    rocksdb_compactionfilter_destroy(st->filter);
    for (size_t i = 0; i < STRIPES; i++)
        pthread_mutex_destroy(&st->stripes[i]);
    pthread_mutex_destroy(&st->sweep_lock);
    free(st);
}

void store_rocksdb_compact(struct store *base)
{
    struct rocks_store *st = rocks(base);

    rocksdb_compact_range(st->db, NULL, 0, NULL, 0);
}

static uint64_t rocks_count(struct store *base)
{
    struct rocks_store *st = rocks(base);
    uint64_t n = 0;

    if (!st || rocksdb_property_int(st->db, "rocksdb.estimate-num-keys", &n))
        return 0;
    return n;
}

/* ---- reading ---- */

static int rocks_get(struct store *base, const char *scope, const char *key,
              uint64_t now_ms, struct store_record *out, struct sc_error *err)
{
    struct rocks_store *st = rocks(base);
    struct record_key k;
    int rc;

    memset(out, 0, sizeof *out);
    if ((rc = record_key_make(&k, scope, key, err)) != 0)
        return rc;
    /* A point read sees a whole write or none: no lock needed. */
    return load_live(st, &k, now_ms, out, err);
}

/* ---- acquire ---- */

/* What an acquirer gets, given a record that counts. ACQUIRED is a takeover
 * of a released or lapsed lease, or a new key (see acquire_locked). */
static enum store_claim judge(const struct store_record *rec,
                              const uint8_t fp[STORE_FP_LEN], uint64_t now_ms)
{
    if (memcmp(rec->fingerprint, fp, STORE_FP_LEN) != 0)
        return STORE_MISMATCH;
    if (rec->state == STORE_COMPLETED)
        return STORE_DONE;
    return rec->lease_expires_ms > now_ms ? STORE_HELD : STORE_ACQUIRED;
}

static int take_lease(struct rocks_store *st, const struct record_key *k,
                      const struct store_record *cur, uint64_t now_ms,
                      uint64_t lease_ms, uint64_t ttl_ms,
                      struct store_acquire_out *out,
                      const rocksdb_writeoptions_t *wo, struct sc_error *err)
{
    struct store_record next = {
        .state = STORE_IN_PROGRESS,
        .attempt = cur->attempt < UINT32_MAX ? cur->attempt + 1 : UINT32_MAX,
        .created_ms = cur->created_ms,
        .lease_expires_ms = add_sat(now_ms, lease_ms),
        .lease = store_lease_draw(),
    };
    int rc;

    memcpy(next.fingerprint, cur->fingerprint, STORE_FP_LEN);
    /* The attempt count outlives the lease by ttl. */
    next.expires_ms = add_sat(next.lease_expires_ms, ttl_ms);
    if ((rc = save(st, k, &next, wo, err)) == 0) {
        out->attempt = next.attempt;
        out->lease = next.lease;
        out->lease_expires_ms = next.lease_expires_ms;
    }
    return rc;
}

/* Called with k's stripe held, so the read and the write below are one
 * step for every other caller of this key. */
static int acquire_locked(struct rocks_store *st, const struct record_key *k,
                          const uint8_t fp[STORE_FP_LEN], uint64_t now_ms,
                          uint64_t lease_ms, uint64_t ttl_ms,
                          struct store_acquire_out *out,
                          const rocksdb_writeoptions_t *wo, struct sc_error *err)
{
    struct store_record cur;
    int rc = load_live(st, k, now_ms, &cur, err);

    if (rc == -ENOENT) {
        /* Absent or expired: a new key, with no attempt made yet. Once a
         * record expires its attempt count is gone too. */
        cur.state = STORE_IN_PROGRESS;
        cur.created_ms = now_ms;
        memcpy(cur.fingerprint, fp, STORE_FP_LEN);
        rc = 0;
    }
    if (rc)
        return rc;
    out->claim = judge(&cur, fp, now_ms);
    if (out->claim == STORE_ACQUIRED)
        rc = take_lease(st, k, &cur, now_ms, lease_ms, ttl_ms, out, wo, err);
    else if (out->claim == STORE_HELD) {
        out->remaining_ms = cur.lease_expires_ms - now_ms;
        out->verify = cur.verify;
        out->verify_deadline_ms = cur.verify_deadline_ms;
        out->lease = cur.lease;
    } else if (out->claim == STORE_DONE) {
        out->rec = cur; /* ownership moves to the caller */
        memset(&cur, 0, sizeof cur);
    }
    store_record_clear(&cur);
    return rc;
}

static int rocks_acquire(struct store *base, const char *scope, const char *key,
                  const uint8_t fp[STORE_FP_LEN], uint64_t now_ms,
                  uint64_t lease_ms, uint64_t ttl_ms,
                  struct store_acquire_out *out, struct sc_error *err)
{
    struct store_args a = {.scope = scope, .key = key, .fp = fp,
                           .now_ms = now_ms, .lease_ms = lease_ms,
                           .ttl_ms = ttl_ms};

    memset(out, 0, sizeof *out);
    return blocking_run(rocks(base), STORE_OP_ACQUIRE, &a, out, err);
}

/* ---- complete, release, forget ---- */

/* The first result stays: a worker may have seen it, and a replay must
 * answer the same (a late holder whose lease lapsed ends here). */
static int refuse_completed(const struct store_record *cur,
                            const struct record_key *k, struct sc_error *err)
{
    if (cur->state != STORE_COMPLETED)
        return 0;
    key_error(err, k, "already completed; the stored result stays");
    return -EALREADY;
}

/* Only the lease's own holder may end it: one that outlived its lease
 * (a stalled loop) finds another's there, or the key forgotten by an
 * operator and taken again, whose attempt count restarted. */
static int refuse_other_lease(const struct store_record *cur, uint64_t lease,
                              const struct record_key *k, struct sc_error *err)
{
    char why[96];

    if (cur->lease == lease && lease != 0)
        return 0;
    snprintf(why, sizeof why, "another lease holds it (attempt %u)",
             (unsigned)cur->attempt);
    key_error(err, k, why);
    return -ESTALE;
}

static int complete_locked(struct rocks_store *st, const struct record_key *k,
                           uint64_t lease, uint64_t now_ms, uint64_t ttl_ms,
                           const struct store_record *result,
                           const rocksdb_writeoptions_t *wo,
                           struct sc_error *err)
{
    struct store_record cur, done = *result;
    int rc = load_live(st, k, now_ms, &cur, err);

    /* Unlike release, a completion with no record is a failure: the result
     * cannot be kept, so it comes with a message. */
    if (rc == -ENOENT)
        key_error(err, k, "no live record to complete");
    if (rc || (rc = refuse_completed(&cur, k, err)) != 0 ||
        (rc = refuse_other_lease(&cur, lease, k, err)) != 0)
        goto out;
    done.state = STORE_COMPLETED;
    done.lease = cur.lease;
    done.attempt = cur.attempt;
    memcpy(done.fingerprint, cur.fingerprint, STORE_FP_LEN);
    done.created_ms = cur.created_ms;
    done.lease_expires_ms = now_ms; /* the lease ends with the result */
    done.completed_ms = now_ms;
    done.expires_ms = add_sat(now_ms, ttl_ms);
    rc = save(st, k, &done, wo, err);
out:
    store_record_clear(&cur);
    return rc;
}

/* Borrows the caller's headers and body for encoding only; never cleared,
 * so the casts drop const without writing through it. */
static struct store_record borrowed_result(int status,
                                           const struct store_header *headers,
                                           size_t n_headers, const uint8_t *body,
                                           size_t body_len, bool body_omitted)
{
    struct store_record result = {
        .status = status,
        .headers = (struct store_header *)headers,
        .n_headers = n_headers,
        .body = body_omitted ? NULL : (uint8_t *)body,
        .body_len = body_omitted ? 0 : body_len,
        .body_omitted = body_omitted,
    };

    return result;
}

static int rocks_complete(struct store *base, const char *scope, const char *key,
                   uint64_t lease, uint64_t now_ms, uint64_t ttl_ms, int status,
                   const struct store_header *headers, size_t n_headers,
                   const uint8_t *body, size_t body_len, bool body_omitted,
                   struct sc_error *err)
{
    struct store_args a = {.scope = scope, .key = key, .lease = lease,
                           .now_ms = now_ms, .ttl_ms = ttl_ms, .status = status,
                           .headers = headers, .n_headers = n_headers,
                           .body = body, .body_len = body_len,
                           .body_omitted = body_omitted};

    return blocking_run(rocks(base), STORE_OP_COMPLETE, &a, NULL, err);
}

static int release_locked(struct rocks_store *st, const struct record_key *k,
                          uint64_t lease, uint64_t now_ms,
                          uint64_t ttl_ms, const rocksdb_writeoptions_t *wo,
                          struct sc_error *err)
{
    struct store_record cur;
    int rc = load_live(st, k, now_ms, &cur, err);

    /* -ENOENT is an answer, not a failure: err stays as it was, as for
     * store_get (the proxy logs only failures that come with a message). */
    if (rc || (rc = refuse_completed(&cur, k, err)) != 0 ||
        (rc = refuse_other_lease(&cur, lease, k, err)) != 0)
        goto out;
    cur.lease_expires_ms = now_ms;
    cur.expires_ms = add_sat(now_ms, ttl_ms);
    rc = save(st, k, &cur, wo, err);
out:
    store_record_clear(&cur);
    return rc;
}

static int rocks_release(struct store *base, const char *scope, const char *key,
                  uint32_t attempt, uint64_t lease, uint64_t now_ms,
                  uint64_t ttl_ms, struct sc_error *err)
{
    struct store_args a = {.scope = scope, .key = key, .attempt = attempt,
                           .lease = lease, .now_ms = now_ms, .ttl_ms = ttl_ms};

    return blocking_run(rocks(base), STORE_OP_RELEASE, &a, NULL, err);
}

/* Deletes whatever is stored, expired or unreadable alike: forget takes no
 * clock, and it is how an operator clears a record that fails to decode. */
static int forget_locked(struct rocks_store *st, const struct record_key *k,
                         struct sc_error *err)
{
    char *val, *msg;
    size_t len;
    int rc = db_get(st, k->buf, k->len, &val, &len, &msg);

    if (rc == -EIO)
        return db_error(err, "read", k, msg);
    if (rc == -ENOENT)
        return rc; /* an answer: err untouched, as in release */
    rocksdb_free(val);
    if (write_refused(st, k, err))
        return -EIO;
    rocksdb_delete(st->db, st->wo, k->buf, k->len, &msg);
    return msg ? write_failed(st, err, "delete", k, msg) : 0;
}

static int rocks_forget(struct store *base, const char *scope, const char *key,
                 struct sc_error *err)
{
    struct rocks_store *st = rocks(base);
    pthread_mutex_t *lock;
    struct record_key k;
    int rc;

    if ((rc = record_key_make(&k, scope, key, err)) != 0)
        return rc;
    lock = stripe_of(st, k.buf, k.len);
    pthread_mutex_lock(lock);
    rc = forget_locked(st, &k, err);
    pthread_mutex_unlock(lock);
    return rc;
}

/* ---- pauses ---- */

/* scope, '\0', then '\1' and "pause": an idempotency key is printable
 * ASCII, so none starts with '\1'. */
static int pause_key(struct record_key *k, const char *scope,
                     struct sc_error *err)
{
    static const char tag[] = "\1pause";
    int rc = record_key_make(k, scope, "-", err); /* checks the scope */

    if (rc)
        return rc;
    memcpy(k->buf + k->len - 1, tag, sizeof tag - 1);
    k->len += sizeof tag - 2;
    return 0;
}

static int pause_set_locked(struct rocks_store *st, const struct record_key *k,
                            uint64_t now_ms, uint64_t until_ms,
                            const rocksdb_writeoptions_t *wo,
                            struct sc_error *err)
{
    struct store_record rec;
    int rc = load_live(st, k, now_ms, &rec, err);

    if (rc && rc != -ENOENT)
        return rc;
    if (rc == 0 && rec.expires_ms >= until_ms) {
        store_record_clear(&rec);
        return 0;
    }
    store_record_clear(&rec);
    rec.state = STORE_COMPLETED;
    rec.status = 429;
    rec.created_ms = rec.completed_ms = now_ms;
    rec.expires_ms = until_ms;
    return save(st, k, &rec, wo, err);
}

static int rocks_pause_set(struct store *base, const char *scope, uint64_t now_ms,
                    uint64_t until_ms, struct sc_error *err)
{
    struct store_args a = {.scope = scope, .now_ms = now_ms,
                           .until_ms = until_ms};

    return blocking_run(rocks(base), STORE_OP_PAUSE_SET, &a, NULL, err);
}

static int rocks_pause_get(struct store *base, const char *scope, uint64_t now_ms,
                    uint64_t *until_ms, struct sc_error *err)
{
    struct rocks_store *st = rocks(base);
    struct store_record rec;
    struct record_key k;
    int rc;

    if ((rc = pause_key(&k, scope, err)) != 0)
        return rc;
    if ((rc = load_live(st, &k, now_ms, &rec, err)) != 0)
        return rc;
    *until_ms = rec.expires_ms;
    store_record_clear(&rec);
    return 0;
}

static int rocks_pause_clear(struct store *base, const char *scope, struct sc_error *err)
{
    struct rocks_store *st = rocks(base);
    pthread_mutex_t *lock;
    struct record_key k;
    int rc;

    if ((rc = pause_key(&k, scope, err)) != 0)
        return rc;
    lock = stripe_of(st, k.buf, k.len);
    pthread_mutex_lock(lock);
    rc = forget_locked(st, &k, err);
    pthread_mutex_unlock(lock);
    return rc;
}

/* ---- sweep ---- */

struct sweep {
    uint64_t now_ms;
    size_t max;     /* deletions allowed */
    size_t removed;
    size_t budget;  /* records left to examine */
};

static bool expired_value(const char *val, size_t len, uint64_t now_ms)
{
    uint64_t expires;

    return record_peek_expiry((const uint8_t *)val, len, &expires) == 0 &&
           expires < now_ms;
}

/* The iterator's view is a snapshot: an acquire may have rewritten the key
 * since, so it is read again under the key's stripe before deleting. Not
 * synced even in sync mode: a delete lost to a power cut leaves a record
 * that is still expired and is swept again. */
static int sweep_one(struct rocks_store *st, const char *key, size_t klen,
                     struct sweep *sw, struct sc_error *err)
{
    pthread_mutex_t *lock = stripe_of(st, key, klen);
    char *val = NULL, *msg = NULL;
    size_t len;
    int rc;

    pthread_mutex_lock(lock);
    rc = db_get(st, key, klen, &val, &len, &msg);
    if (rc == 0 && expired_value(val, len, sw->now_ms) && !atomic_load(&st->failed)) {
        rocksdb_delete(st->db, st->wo_sweep, key, klen, &msg);
        if (!msg)
            sw->removed++;
        else if (!atomic_exchange(&st->failed, true))
            snprintf(st->failure, sizeof st->failure,
                     "writes refused since a sweep delete failed: %s", msg);
    }
    pthread_mutex_unlock(lock);
    rocksdb_free(val);
    if (!msg)
        return 0;
    sc_error_set(err, "store: sweep failed: %s", msg);
    rocksdb_free(msg);
    return -EIO;
}

/* The cursor is the key's successor in byte order (the key with '\0'
 * appended), so seeking to it resumes just after the key. */
static void set_cursor(struct rocks_store *st, const char *key, size_t klen)
{
    if (klen > CURSOR_MAX - 1)
        klen = CURSOR_MAX - 1; /* never for record_key keys */
    memcpy(st->cursor, key, klen);
    st->cursor[klen] = '\0';
    st->cursor_len = klen + 1;
}

static int key_cmp(const char *a, size_t alen, const char *b, size_t blen)
{
    int c = memcmp(a, b, alen < blen ? alen : blen);

    return c ? c : (alen > blen) - (alen < blen);
}

/* Examines records from the iterator's position until the end, a key at or
 * past stop (when stop_len), or a limit. 1 at the end, 0 when stopped. */
static int sweep_run(struct rocks_store *st, rocksdb_iterator_t *it,
                     struct sweep *sw, const char *stop, size_t stop_len,
                     struct sc_error *err)
{
    char *msg = NULL;

    for (; rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t klen, vlen;
        const char *key = rocksdb_iter_key(it, &klen);
        const char *val = rocksdb_iter_value(it, &vlen);
        int rc;

        if ((stop_len && key_cmp(key, klen, stop, stop_len) >= 0) ||
            sw->removed == sw->max || sw->budget == 0)
            return 0;
        sw->budget--;
        set_cursor(st, key, klen);
        if (expired_value(val, vlen, sw->now_ms) &&
            (rc = sweep_one(st, key, klen, sw, err)) != 0)
            return rc;
    }
    rocksdb_iter_get_error(it, &msg);
    if (!msg)
        return 1;
    sc_error_set(err, "store: sweep failed: %s", msg);
    rocksdb_free(msg);
    return -EIO;
}

/* From the cursor to the end, then around from the beginning up to where
 * this call started: at most one lap per call. */
static int sweep_lap(struct rocks_store *st, rocksdb_iterator_t *it,
                     struct sweep *sw, struct sc_error *err)
{
    char start[CURSOR_MAX];
    size_t start_len = st->cursor_len;
    int rc;

    memcpy(start, st->cursor, start_len);
    if (start_len)
        rocksdb_iter_seek(it, start, start_len);
    else
        rocksdb_iter_seek_to_first(it);
    rc = sweep_run(st, it, sw, NULL, 0, err);
    if (rc == 1) {
        st->cursor_len = 0;
        if (start_len) {
            rocksdb_iter_seek_to_first(it);
            rc = sweep_run(st, it, sw, start, start_len, err);
            if (rc == 1)
                st->cursor_len = 0;
        }
    }
    return rc < 0 ? rc : 0;
}

static int rocks_sweep(struct store *base, uint64_t now_ms, size_t max, size_t *removed,
                struct sc_error *err)
{
    struct rocks_store *st = rocks(base);
    struct sweep sw = {
        .now_ms = now_ms,
        .max = max,
        .budget = max > SIZE_MAX / SWEEP_SCAN_FACTOR ? SIZE_MAX
                                                     : max * SWEEP_SCAN_FACTOR,
    };
    rocksdb_iterator_t *it;
    int rc;

    *removed = 0;
    if (max == 0)
        return 0;
    pthread_mutex_lock(&st->sweep_lock);
    it = rocksdb_create_iterator(st->db, st->ro_scan);
    rc = sweep_lap(st, it, &sw, err);
    rocksdb_iter_destroy(it);
    pthread_mutex_unlock(&st->sweep_lock);
    *removed = sw.removed;
    return rc;
}

/* ---- verification marks (contract §11) ---- */

#define MARK_NONE 0     /* enum verify_state (policies/verify.h) */
#define MARK_PENDING 1
#define MARK_FOUND 2
#define MARK_ABSENT 3
#define MARK_FAILED 4

/* The lease a step is for, still in progress: else the step is dropped. */
static int verify_target_lease(const struct store_record *cur,
                               const struct store_verify_args *a,
                               const struct record_key *k, struct sc_error *err)
{
    if (cur->state == STORE_COMPLETED)
        return -EALREADY;
    if (cur->lease != a->lease || a->lease == 0) {
        key_error(err, k, "another lease holds it");
        return -ESTALE;
    }
    if (cur->lease_expires_ms <= a->now_ms) {
        key_error(err, k, "its lease has ended");
        return -ESTALE;
    }
    return 0;
}

/* A claim moves NONE (or, again, a PENDING left by an ended process) to
 * PENDING; every other step needs PENDING. */
static bool verify_step_allowed(const struct store_record *cur,
                                const struct store_verify_args *a)
{
    if (a->step == STORE_VERIFY_CLAIM)
        return cur->verify == MARK_NONE || (a->again && cur->verify == MARK_PENDING);
    return cur->verify == MARK_PENDING;
}

/* The record as the step leaves it, into cur (whose headers and body, none
 * while in progress, are replaced by the result's for FOUND). */
static void verify_apply(struct store_record *cur, const struct store_verify_args *a)
{
    switch (a->step) {
    case STORE_VERIFY_CLAIM:
        cur->verify = MARK_PENDING;
        cur->verify_deadline_ms = a->deadline_ms;
        break;
    case STORE_VERIFY_FOUND:
        cur->state = STORE_COMPLETED;
        cur->status = a->result->status;
        cur->headers = a->result->headers;
        cur->n_headers = a->result->n_headers;
        cur->body = a->result->body;
        cur->body_len = a->result->body_len;
        cur->body_omitted = a->result->body_omitted;
        cur->lease_expires_ms = cur->completed_ms = a->now_ms;
        cur->expires_ms = add_sat(a->now_ms, a->ttl_ms);
        cur->verify = MARK_FOUND;
        cur->verified = true;
        break;
    case STORE_VERIFY_ABSENT:
        cur->lease_expires_ms = a->now_ms;
        cur->expires_ms = add_sat(a->now_ms, a->ttl_ms);
        cur->verify = MARK_ABSENT;
        break;
    default: /* STORE_VERIFY_FAILED */
        cur->verify = MARK_FAILED;
        break;
    }
}

static int verify_locked(struct rocks_store *st, const struct record_key *k,
                         const struct store_verify_args *a, struct sc_error *err)
{
    struct store_record cur;
    int rc = load_live(st, k, a->now_ms, &cur, err);

    if (rc || (rc = verify_target_lease(&cur, a, k, err)) != 0)
        goto out;
    if (!verify_step_allowed(&cur, a)) {
        rc = -EALREADY;
        goto out;
    }
    /* In progress, so cur owns no headers or body: FOUND borrows the
     * result's for the write, and they are detached before the clear. */
    verify_apply(&cur, a);
    rc = save(st, k, &cur, st->wo, err);
    if (a->step == STORE_VERIFY_FOUND) {
        cur.headers = NULL;
        cur.n_headers = 0;
        cur.body = NULL;
        cur.body_len = 0;
    }
out:
    store_record_clear(&cur);
    return rc;
}

static int rocks_verify(struct store *base, const char *scope, const char *key,
                        const struct store_verify_args *a, struct sc_error *err)
{
    struct rocks_store *st = rocks(base);
    pthread_mutex_t *lock;
    struct record_key k;
    int rc;

    if ((rc = record_key_make(&k, scope, key, err)) != 0)
        return rc;
    lock = stripe_of(st, k.buf, k.len);
    pthread_mutex_lock(lock);
    rc = verify_locked(st, &k, a, err);
    pthread_mutex_unlock(lock);
    return rc;
}

/* One database entry: fn's when it is a lease in progress. Pauses (a key
 * starting with '\1') and values that do not decode are skipped. */
static int lease_entry(const char *dbkey, size_t klen, const char *val,
                       size_t vlen, uint64_t now_ms, store_lease_fn fn,
                       void *arg)
{
    char scope[RECORD_SCOPE_MAX + 1], key[RECORD_KEY_MAX + 1];
    size_t ns = strnlen(dbkey, klen);
    struct store_record rec;
    struct sc_error derr;
    int rc = 0;

    if (ns == 0 || ns > RECORD_SCOPE_MAX || klen - ns - 1 == 0 ||
        klen - ns - 1 > RECORD_KEY_MAX || dbkey[ns + 1] == '\1')
        return 0;
    if (record_decode((const uint8_t *)val, vlen, &rec, &derr) != 0)
        return 0;
    if (rec.state == STORE_IN_PROGRESS && rec.lease_expires_ms > now_ms &&
        rec.expires_ms > now_ms) {
        memcpy(scope, dbkey, ns);
        scope[ns] = '\0';
        memcpy(key, dbkey + ns + 1, klen - ns - 1);
        key[klen - ns - 1] = '\0';
        rc = fn(arg, scope, key, &rec);
    }
    store_record_clear(&rec);
    return rc;
}

/* A full scan: run once at start-up, before any request. */
static int rocks_leases_each(struct store *base, uint64_t now_ms,
                             store_lease_fn fn, void *arg, struct sc_error *err)
{
    struct rocks_store *st = rocks(base);
    rocksdb_iterator_t *it = rocksdb_create_iterator(st->db, st->ro_scan);
    char *msg = NULL;
    int rc = 0;

    for (rocksdb_iter_seek_to_first(it); rc == 0 && rocksdb_iter_valid(it);
         rocksdb_iter_next(it)) {
        size_t klen, vlen;
        const char *k = rocksdb_iter_key(it, &klen);
        const char *v = rocksdb_iter_value(it, &vlen);

        rc = lease_entry(k, klen, v, vlen, now_ms, fn, arg);
    }
    rocksdb_iter_get_error(it, &msg);
    rocksdb_iter_destroy(it);
    if (msg) {
        sc_error_set(err, "store: listing the leases failed: %s", msg);
        rocksdb_free(msg);
        return -EIO;
    }
    return rc;
}

/* ---- sync mode: the asynchronous calls, group-committed ---- */

/* The committer thread's sync: the WAL of every write so far, fsynced once.
 * Not after a failed write: RocksDB's writer is in an error state then (see
 * write_refused), and the calls waiting fail with the first failure. */
static int sync_wal(void *arg, struct sc_error *err)
{
    struct rocks_store *st = arg;
    char *msg = NULL;

    if (atomic_load(&st->failed)) {
        sc_error_set(err, "store: %s", st->failure);
        return -EIO;
    }
    rocksdb_flush_wal(st->db, 1, &msg);
    if (!msg)
        return 0;
    if (!atomic_exchange(&st->failed, true))
        snprintf(st->failure, sizeof st->failure,
                 "writes refused since a WAL sync failed: %s", msg);
    sc_error_set(err, "store: WAL sync failed: %s", msg);
    rocksdb_free(msg);
    return -EIO;
}

/* One call under k's stripe, so its read and its write are one step for
 * every other caller of the key; writes go out with wo: synced each for the
 * blocking calls (st->wo), unsynced for the group commit (st->wo_group).
 * out is a GET's record or an ACQUIRE's answer, zeroed first. */
static int run_locked(struct rocks_store *st, const struct record_key *k,
                      enum store_op op, const struct store_args *a,
                      const rocksdb_writeoptions_t *wo, void *out,
                      struct sc_error *err)
{
    struct store_record result;

    switch (op) {
    case STORE_OP_GET:
        memset(out, 0, sizeof(struct store_record));
        return load_live(st, k, a->now_ms, out, err);
    case STORE_OP_ACQUIRE:
        memset(out, 0, sizeof(struct store_acquire_out));
        return acquire_locked(st, k, a->fp, a->now_ms, a->lease_ms, a->ttl_ms,
                              out, wo, err);
    case STORE_OP_COMPLETE:
        result = borrowed_result(a->status, a->headers, a->n_headers, a->body,
                                 a->body_len, a->body_omitted);
        return complete_locked(st, k, a->lease, a->now_ms, a->ttl_ms, &result,
                               wo, err);
    case STORE_OP_RELEASE:
        return release_locked(st, k, a->lease, a->now_ms, a->ttl_ms, wo, err);
    default: /* STORE_OP_PAUSE_SET */
        return pause_set_locked(st, k, a->now_ms, a->until_ms, wo, err);
    }
}

/* The database key a call is about: a pause's, or a record's. */
static int op_key(struct record_key *k, enum store_op op,
                  const struct store_args *a, struct sc_error *err)
{
    return op == STORE_OP_PAUSE_SET ? pause_key(k, a->scope, err)
                                    : record_key_make(k, a->scope, a->key, err);
}

/* The blocking calls (admin, start-up, tests, and every call of a store
 * without sync): decided, written and synced before they return. */
static int blocking_run(struct rocks_store *st, enum store_op op,
                        const struct store_args *a, void *out,
                        struct sc_error *err)
{
    struct record_key k;
    size_t idx;
    int rc;

    if ((rc = op_key(&k, op, a, err)) != 0)
        return rc;
    idx = stripe_index(k.buf, k.len);
    pthread_mutex_lock(&st->stripes[idx]);
    rc = run_locked(st, &k, op, a, st->wo, out, err);
    pthread_mutex_unlock(&st->stripes[idx]);
    return rc;
}

/* Results that rest on a record (written now, or read): the worker may act
 * on them only once that record is durable. An absent key and a failure
 * rest on nothing. */
static bool rests_on_record(int rc)
{
    return rc == 0 || rc == -EALREADY || rc == -ESTALE;
}

/* Decides and writes at once under the key's stripe, as the blocking calls
 * do, then waits for the sync that covers the stripe's last grouped write:
 * its own, or the one behind a record it read (a record may be visible
 * before it is durable). */
static int rocks_start(struct store_loop *sl, struct store_call *c,
                       enum store_op op, const struct store_args *a)
{
    struct rocks_store *st = rocks(sl->st);
    struct gc_node *n;
    struct record_key k;
    uint64_t ticket;
    size_t idx;
    int rc;

    if (op > STORE_OP_PAUSE_SET) {
        sc_error_set(&c->err, "store rocksdb: no shared buckets or slots");
        return -EOPNOTSUPP;
    }
    if ((rc = op_key(&k, op, a, &c->err)) != 0)
        return rc;
    if (!(n = group_commit_node_new())) {
        sc_error_set(&c->err, "store: out of memory");
        return -ENOMEM;
    }
    idx = stripe_index(k.buf, k.len);
    pthread_mutex_lock(&st->stripes[idx]);
    rc = run_locked(st, &k, op, a, st->wo_group,
                    op == STORE_OP_GET ? (void *)&c->rec : (void *)&c->acq,
                    &c->err);
    ticket = st->stripe_seq[idx];
    pthread_mutex_unlock(&st->stripes[idx]);
    if (!rests_on_record(rc))
        ticket = 0; /* nothing to wait for: answered at once */
    return group_commit_wait(sl, c, n, ticket, rc);
}

static int rocks_loop_new(struct store *base, struct event_base *ev,
                          struct store_loop **out, struct sc_error *err)
{
    return group_commit_loop_new(rocks(base)->gc, base, ev, out, err);
}

void store_rocksdb_group_stats(struct store *base, uint64_t *syncs,
                               uint64_t *calls)
{
    struct rocks_store *st = rocks(base);

    *syncs = *calls = 0;
    if (st->gc)
        group_commit_stats(st->gc, syncs, calls);
}

#define ROCKS_BLOCKING_OPS \
    .name = "rocksdb", \
    .close = rocks_close, \
    .get = rocks_get, \
    .acquire = rocks_acquire, \
    .complete = rocks_complete, \
    .release = rocks_release, \
    .forget = rocks_forget, \
    .sweep = rocks_sweep, \
    .pause_set = rocks_pause_set, \
    .pause_get = rocks_pause_get, \
    .pause_clear = rocks_pause_clear, \
    .healthy = rocks_healthy, \
    .count = rocks_count, \
    .verify = rocks_verify, \
    .leases_each = rocks_leases_each

/* Without sync every call completes before it returns: the generic
 * asynchronous calls (store.c) run these at once, with no per-loop state. */
static const struct store_ops rocks_ops = {
    ROCKS_BLOCKING_OPS,
};

/* With sync the request path's calls complete after the group commit's
 * sync; the blocking calls (admin, start-up, tests) still sync each write. */
static const struct store_ops rocks_sync_ops = {
    ROCKS_BLOCKING_OPS,
    .loop_new = rocks_loop_new,
    .loop_free = group_commit_loop_free,
    .start = rocks_start,
    .cancel = group_commit_cancel,
};
