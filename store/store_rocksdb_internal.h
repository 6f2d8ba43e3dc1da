/* Extras of the RocksDB store that are not part of the store interface:
 * maintenance hooks for tests and operators. */
#ifndef SLUICE_STORE_STORE_ROCKSDB_INTERNAL_H
#define SLUICE_STORE_STORE_ROCKSDB_INTERNAL_H

#include <stdint.h>

#include "store/store.h"

/* Flushes and compacts the whole key range now, so the expiry compaction
 * filter runs over every record (it reads the wall clock, not a fake one). */
void store_rocksdb_compact(struct store *st);

/* With sync: WAL syncs made by the group commit, and asynchronous calls it
 * completed so far (both 0 without sync). */
void store_rocksdb_group_stats(struct store *st, uint64_t *syncs,
                               uint64_t *calls);

#endif
