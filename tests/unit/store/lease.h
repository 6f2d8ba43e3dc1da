/* The fence of a key's lease as stored (store_record.lease), for store tests
 * that complete or release a lease they took earlier without keeping what
 * store_acquire answered. 0 when there is no record. */
#ifndef SLUICE_TESTS_UNIT_STORE_LEASE_H
#define SLUICE_TESTS_UNIT_STORE_LEASE_H

#include <stdint.h>

#include "store/store.h"

static inline uint64_t lease_in(struct store *s, const char *scope,
                                const char *key)
{
    struct store_record r;
    struct sc_error e;
    uint64_t lease = 0;

    /* now 0: any record still stored counts */
    if (store_get(s, scope, key, 0, &r, &e) == 0)
        lease = r.lease;
    store_record_clear(&r);
    return lease;
}

#endif
