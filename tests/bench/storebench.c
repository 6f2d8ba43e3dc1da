/* The idempotency store, driven directly through store/store.h (no HTTP):
 * a helper of tests/bench/store.sh, not part of sluice. Built by hand by
 * store.sh against a build directory's libsluice_store.a and
 * libsluice_policies.a (see tests/bench/README.md, "store.sh").
 *
 *   storebench fill DIR SCOPE FIRST COUNT TTL_MS TARGET BODY
 *       completes COUNT records k<FIRST> .. k<FIRST+COUNT-1> in scope SCOPE,
 *       each with store_acquire + store_complete (sync false), so that sluice
 *       replays them for "POST TARGET" with body BODY (the fingerprint is
 *       idem_fingerprint over method, path and body, the policy default).
 *       The stored result looks like what sluice keeps of a stub answer:
 *       200, 5 end-to-end headers, body "xx". Prints "fill ..." with pairs/s.
 *
 *   storebench lease DIR SYNC THREADS SECONDS
 *       acquire + complete pairs on fresh keys (one key space per thread)
 *       for SECONDS, store opened with sync SYNC (0/1). Prints pairs, pairs/s
 *       and the p50 / p99 / max time of one pair.
 *
 *   storebench sweep DIR TTL_MS BATCH
 *       on an existing store (written with ttl TTL_MS, e.g. by fill): measures
 *       it, times 20 sweep calls at the real time (nothing expired: the cost
 *       sluice pays every second), then sweeps it as if TTL_MS + 1 s had passed (store_sweep in
 *       batches of BATCH, as sluice's main loop does once a second, back to
 *       back here) until a batch removes nothing; measures; closes and reopens
 *       (flush); measures; compacts (store_rocksdb_compact); measures. Only the
 *       sweep sees the later time: RocksDB's expiry compaction filter keeps
 *       reading the real clock, so the sweep alone finds the records expired.
 *
 *   storebench compact DIR TTL_MS
 *       on an existing store: measures it, moves the store's clock (which the
 *       compaction filter reads) forward by TTL_MS + 1 s, compacts, measures.
 *       No sweep: the compaction filter alone drops the expired records.
 *
 * Output: one "key=value ..." line per phase on stdout, for store.sh.
 * Sizes: "apparent" = sum of st_size (du -sb), "alloc" = st_blocks * 512
 * (du -s). */
#define _GNU_SOURCE
#include <errno.h>
#include <ftw.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "config/config.h"
#include "policies/idemkey.h"
#include "store/store.h"
#include "store/store_rocksdb_internal.h"
#include "util/clock.h"

#define LEASE_MS 60000ull
#define IDLE_SWEEPS 20

/* The store's clock (util/clock.h), defined here so that util/clock.o is not
 * linked: the compact command moves wall time forward by the ttl instead of
 * waiting for it. The store's RocksDB compaction filter, which runs in
 * RocksDB's threads, reads this clock. */
static _Atomic uint64_t wall_offset_ms;

uint64_t clock_mono_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t clock_wall_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u + wall_offset_ms;
}

static const struct store_header HEADERS[] = {
    {"Content-Type", "application/octet-stream"},
    {"X-Stub-Method", "POST"},
    {"X-Stub-Target", "/replay"},
    {"X-Stub-Host", "127.0.0.1:9000"},
    {"X-Stub-Seq", "123456"},
};
#define N_HEADERS (sizeof HEADERS / sizeof *HEADERS)

static void die(const char *what, const struct sc_error *err)
{
    fprintf(stderr, "storebench: %s: %s\n", what, err ? err->text : strerror(errno));
    exit(1);
}

static double mono_s(void)
{
    return (double)clock_mono_ns() / 1e9;
}

static struct store *open_store(const char *dir, bool sync)
{
    struct sc_error err = {0};
    struct store *st;

    if (store_open_rocksdb(dir, sync, &st, &err) != 0)
        die("open", &err);
    return st;
}

/* One acquire + complete; the fingerprint is fp. */
static void pair(struct store *st, const char *scope, const char *key,
                 const uint8_t fp[STORE_FP_LEN], uint64_t ttl_ms)
{
    struct store_acquire_out out;
    struct sc_error err = {0};
    uint64_t now = clock_wall_ms();

    if (store_acquire(st, scope, key, fp, now, LEASE_MS, ttl_ms, &out, &err) != 0)
        die("acquire", &err);
    if (out.claim != STORE_ACQUIRED) {
        fprintf(stderr, "storebench: %s/%s: not a fresh key (claim %d)\n", scope, key,
                (int)out.claim);
        exit(1);
    }
    if (store_complete(st, scope, key, out.lease, clock_wall_ms(), ttl_ms, 200,
                       HEADERS, N_HEADERS, (const uint8_t *)"xx", 2, false, &err) != 0)
        die("complete", &err);
}

/* ---- directory size ---- */

static unsigned long long g_apparent, g_alloc;

static int add_size(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    g_apparent += (unsigned long long)sb->st_size;
    g_alloc += (unsigned long long)sb->st_blocks * 512;
    return 0;
}

static void print_size(const char *phase, const char *dir)
{
    g_apparent = g_alloc = 0;
    if (nftw(dir, add_size, 16, FTW_PHYS) != 0)
        die("nftw", NULL);
    printf("size phase=%s apparent=%llu alloc=%llu\n", phase, g_apparent, g_alloc);
    fflush(stdout);
}

static long hwm_kb(void)
{
    struct rusage ru;

    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

/* ---- fill ---- */

static double fill(struct store *st, const char *scope, unsigned long first,
                   unsigned long count, uint64_t ttl_ms, const uint8_t fp[STORE_FP_LEN])
{
    char key[32];
    double t0 = mono_s();

    for (unsigned long i = first; i < first + count; i++) {
        snprintf(key, sizeof key, "k%lu", i);
        pair(st, scope, key, fp, ttl_ms);
    }
    return mono_s() - t0;
}

static int cmd_fill(int argc, char **argv)
{
    const char *dir = argv[2], *scope = argv[3];
    unsigned long first = strtoul(argv[4], NULL, 10), count = strtoul(argv[5], NULL, 10);
    uint64_t ttl_ms = strtoull(argv[6], NULL, 10);
    uint8_t fp[STORE_FP_LEN];
    struct store *st;
    double secs, tc;

    idem_fingerprint(SC_FP_METHOD | SC_FP_PATH | SC_FP_BODY, "POST", argv[7], argv[8],
                     strlen(argv[8]), fp);
    st = open_store(dir, false);
    secs = fill(st, scope, first, count, ttl_ms, fp);
    tc = mono_s();
    store_close(st); /* flushes the memtable: sluice opens without a WAL replay */
    tc = mono_s() - tc;
    printf("fill count=%lu seconds=%.2f pairs_per_s=%.0f close_s=%.2f hwm_kb=%ld\n", count,
           secs, count / secs, tc, hwm_kb());
    print_size("filled", dir);
    return 0;
}

/* ---- lease ---- */

struct worker {
    pthread_t th;
    struct store *st;
    int id;
    double until;
    unsigned long n, cap;
    uint32_t *lat_us;
};

static void *lease_worker(void *arg)
{
    struct worker *w = arg;
    uint8_t fp[STORE_FP_LEN] = {0};
    char key[48];

    fp[0] = (uint8_t)w->id;
    for (;;) {
        double t0 = mono_s(), dt;

        if (t0 >= w->until)
            break;
        snprintf(key, sizeof key, "t%d-k%lu", w->id, w->n);
        pair(w->st, "lease", key, fp, 3600000);
        dt = (mono_s() - t0) * 1e6;
        if (w->n == w->cap) {
            w->cap = w->cap ? w->cap * 2 : 65536;
            w->lat_us = realloc(w->lat_us, w->cap * sizeof *w->lat_us);
            if (!w->lat_us)
                die("realloc", NULL);
        }
        w->lat_us[w->n++] = dt > 4e9 ? 4000000000u : (uint32_t)dt;
    }
    return NULL;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

    return (x > y) - (x < y);
}

static int cmd_lease(int argc, char **argv)
{
    const char *dir = argv[2];
    bool sync = atoi(argv[3]) != 0;
    int threads = atoi(argv[4]);
    double secs = atof(argv[5]), t0, el;
    struct worker *w = calloc((size_t)threads, sizeof *w);
    struct store *st = open_store(dir, sync);
    unsigned long total = 0, k = 0;
    uint32_t *all;

    if (!w || threads < 1)
        die("threads", NULL);
    t0 = mono_s();
    for (int i = 0; i < threads; i++) {
        w[i] = (struct worker){.st = st, .id = i, .until = t0 + secs};
        if (pthread_create(&w[i].th, NULL, lease_worker, &w[i]) != 0)
            die("pthread_create", NULL);
    }
    for (int i = 0; i < threads; i++) {
        pthread_join(w[i].th, NULL);
        total += w[i].n;
    }
    el = mono_s() - t0;
    all = malloc((total ? total : 1) * sizeof *all);
    if (!all)
        die("malloc", NULL);
    for (int i = 0; i < threads; i++) {
        memcpy(all + k, w[i].lat_us, w[i].n * sizeof *all);
        k += w[i].n;
        free(w[i].lat_us);
    }
    qsort(all, total, sizeof *all, cmp_u32);
    printf("lease sync=%d threads=%d pairs=%lu seconds=%.2f pairs_per_s=%.0f "
           "p50_us=%u p99_us=%u max_us=%u\n",
           sync, threads, total, el, total / el, total ? all[total / 2] : 0,
           total ? all[(size_t)(total * 0.99)] : 0, total ? all[total - 1] : 0);
    free(all);
    free(w);
    store_close(st);
    return 0;
}

/* ---- expiry ---- */

static struct store *reopen(struct store *st, const char *dir, const char *phase)
{
    double t0 = mono_s();

    store_close(st);
    printf("close phase=%s seconds=%.2f\n", phase, mono_s() - t0);
    print_size(phase, dir);
    return open_store(dir, false);
}

static void compact(struct store *st, const char *dir, const char *phase)
{
    double t0 = mono_s();

    store_rocksdb_compact(st);
    printf("compact phase=%s seconds=%.2f\n", phase, mono_s() - t0);
    print_size(phase, dir);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

static int cmd_sweep(int argc, char **argv)
{
    const char *dir = argv[2];
    uint64_t ttl_ms = strtoull(argv[3], NULL, 10);
    size_t batch = strtoul(argv[4], NULL, 10), n = 0, cap = 1024;
    unsigned long removed_total = 0;
    double t0, *bt = malloc(cap * sizeof *bt);
    struct sc_error err = {0};
    struct store *st;

    if (!bt || !batch)
        die("batch", NULL);
    print_size("before_expiry", dir);
    st = open_store(dir, false);
    printf("count phase=before_expiry estimate=%llu\n", (unsigned long long)store_count(st));
    /* What sluice pays every second while nothing has expired: a call scans up to
     * 16 x batch live records and deletes none. */
    for (int i = 0; i < IDLE_SWEEPS; i++) {
        size_t removed = 0;
        double tb = mono_s();

        if (store_sweep(st, clock_wall_ms(), batch, &removed, &err) != 0)
            die("sweep", &err);
        bt[i] = mono_s() - tb;
        if (removed)
            die("idle sweep removed records", NULL);
    }
    qsort(bt, IDLE_SWEEPS, sizeof *bt, cmp_double);
    printf("idle_sweep batch=%zu calls=%d median_ms=%.2f max_ms=%.2f\n", batch, IDLE_SWEEPS,
           bt[IDLE_SWEEPS / 2] * 1e3, bt[IDLE_SWEEPS - 1] * 1e3);
    t0 = mono_s();
    for (;;) {
        size_t removed = 0;
        double tb = mono_s();

        if (store_sweep(st, clock_wall_ms() + ttl_ms + 1000, batch, &removed, &err) != 0)
            die("sweep", &err);
        if (n == cap && !(bt = realloc(bt, (cap *= 2) * sizeof *bt)))
            die("realloc", NULL);
        bt[n++] = mono_s() - tb;
        removed_total += removed;
        if (removed == 0)
            break;
    }
    t0 = mono_s() - t0;
    qsort(bt, n, sizeof *bt, cmp_double);
    printf("sweep batch=%zu removed=%lu batches=%zu seconds=%.2f batch_median_ms=%.2f "
           "batch_p99_ms=%.2f batch_max_ms=%.2f hwm_kb=%ld\n",
           batch, removed_total, n, t0, bt[n / 2] * 1e3, bt[(size_t)(n * 0.99)] * 1e3,
           bt[n - 1] * 1e3, hwm_kb());
    free(bt);
    print_size("swept", dir);
    st = reopen(st, dir, "swept_closed");
    compact(st, dir, "swept_compacted");
    store_close(st);
    print_size("swept_compacted_closed", dir);
    return 0;
}

static int cmd_compact(int argc, char **argv)
{
    const char *dir = argv[2];
    uint64_t ttl_ms = strtoull(argv[3], NULL, 10);
    struct store *st;

    print_size("before_expiry", dir);
    st = open_store(dir, false);
    wall_offset_ms += ttl_ms + 1000; /* every record written so far has expired */
    compact(st, dir, "compacted");
    store_close(st);
    print_size("compacted_closed", dir);
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 9 && strcmp(argv[1], "fill") == 0)
        return cmd_fill(argc, argv);
    if (argc == 6 && strcmp(argv[1], "lease") == 0)
        return cmd_lease(argc, argv);
    if (argc == 5 && strcmp(argv[1], "sweep") == 0)
        return cmd_sweep(argc, argv);
    if (argc == 4 && strcmp(argv[1], "compact") == 0)
        return cmd_compact(argc, argv);
    fprintf(stderr, "usage: storebench fill DIR SCOPE FIRST COUNT TTL_MS TARGET BODY\n"
                    "       storebench lease DIR SYNC THREADS SECONDS\n"
                    "       storebench sweep DIR TTL_MS BATCH\n"
                    "       storebench compact DIR TTL_MS\n");
    return 2;
}
