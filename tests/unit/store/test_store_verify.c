/* A lease's verification mark in the RocksDB store (docs/contract.md §11):
 * claimed once, completed from a lookup, released, failed, only ever for
 * the lease it was started for; and the leases in progress listed for
 * start-up. A real RocksDB in a temp dir, a fake clock from the real one. */
#include <criterion/criterion.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/store.h"
#include "support/testutil.h"
#include "util/clock.h"

#define SCOPE "payments"
#define LEASE 60000ull
#define TTL 86400000ull

static char *dir;
static struct store *st;
static struct sc_error err;
static uint64_t t0;
static uint8_t fp[STORE_FP_LEN];

static void setup(void)
{
    dir = tu_mkdtemp("store-verify");
    cr_assert_not_null(dir);
    t0 = clock_wall_ms();
    memset(fp, 0xaa, sizeof fp);
    cr_assert_eq(store_open_rocksdb(dir, false, &st, &err), 0, "%s", err.text);
}

static void teardown(void)
{
    store_close(st);
    tu_rm_rf(dir);
    free(dir);
}

TestSuite(verify_store, .init = setup, .fini = teardown);

/* RocksDB's leases are all this process's: no liveness keys. */
Test(verify_store, rocksdb_keeps_no_liveness_keys)
{
    cr_expect_eq(store_live_refresh(st, SCOPE, 3000, &err), -EOPNOTSUPP);
}

#define VERIFY_SUITE verify_store
#define VERIFY_FP fp
#include "unit/store/verify_cases.h"

struct seen {
    int n;
    char keys[8][32];
    uint8_t marks[8];
};

static int collect(void *arg, const char *scope, const char *key,
                   const struct store_record *rec)
{
    struct seen *s = arg;

    cr_expect_str_eq(scope, SCOPE);
    if (s->n < 8) {
        snprintf(s->keys[s->n], sizeof s->keys[0], "%s", key);
        s->marks[s->n] = rec->verify;
    }
    s->n++;
    return 0;
}

Test(verify_store, leases_each_lists_only_leases_in_progress)
{
    struct store_acquire_out out;
    struct seen s = {0};
    uint64_t l;

    vtake("live-a", t0);
    l = vtake("live-b", t0);
    cr_assert_eq(store_verify_claim(st, SCOPE, "live-b", l, t0, t0 + 5000, false,
                                    &err), 0);
    l = vtake("done", t0);
    cr_assert_eq(store_complete(st, SCOPE, "done", l, t0, TTL, 200, NULL, 0, NULL,
                                0, false, &err), 0);
    l = vtake("released", t0);
    cr_assert_eq(store_release(st, SCOPE, "released", 1, l, t0, TTL, &err), 0);
    cr_assert_eq(store_acquire(st, SCOPE, "short", fp, t0, 10, TTL, &out, &err), 0);
    cr_assert_eq(store_pause_set(st, SCOPE, t0, t0 + LEASE, &err), 0);
    cr_assert_eq(store_leases_each(st, t0 + 100, collect, &s, &err), 0, "%s",
                 err.text);
    cr_assert_eq(s.n, 2, "the two live leases, not the completed, released, "
                 "expired ones nor the pause (%d)", s.n);
    cr_expect_str_eq(s.keys[0], "live-a");
    cr_expect_eq(s.marks[0], NONE);
    cr_expect_str_eq(s.keys[1], "live-b");
    cr_expect_eq(s.marks[1], PENDING);
}

Test(verify_store, marks_survive_a_reopen)
{
    uint64_t lease = vtake("k7", t0);
    struct store_record rec;

    cr_assert_eq(store_verify_claim(st, SCOPE, "k7", lease, t0, t0 + 5000, false,
                                    &err), 0);
    store_close(st);
    cr_assert_eq(store_open_rocksdb(dir, false, &st, &err), 0, "%s", err.text);
    rec = vget("k7", t0 + 1);
    cr_expect_eq(rec.verify, PENDING);
    store_record_clear(&rec);
}
