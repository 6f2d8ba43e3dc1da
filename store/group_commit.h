/* Group commit: many writes made durable by one sync, on a thread of its
 * own, so no event loop waits for an fsync (store.sync with RocksDB).
 *
 * A writer appends its write without syncing, then takes a sequence number
 * (group_commit_note); the committer thread reads the newest number, syncs
 * once, and every number up to it is durable. A call waits for a number (its
 * ticket) and is completed on the loop it was issued on once that number is
 * durable, or failed if the sync fails: from a failed sync on, nothing newer
 * than the last good sync is ever reported durable. */
#ifndef SLUICE_STORE_GROUP_COMMIT_H
#define SLUICE_STORE_GROUP_COMMIT_H

#include <stdint.h>

#include "store/store.h"
#include "store/store_backend.h"
#include "util/error.h"

/* Makes everything appended so far durable: 0, or negative with err (the
 * store then refuses writes, see store_healthy). Called on the committer
 * thread only. */
typedef int (*group_commit_sync_fn)(void *arg, struct sc_error *err);

struct group_commit;
struct gc_node;

int group_commit_open(group_commit_sync_fn sync, void *arg,
                      struct group_commit **out, struct sc_error *err);
/* Stops the thread; what is still queued is dropped without completing
 * (its loops are freed first, which cancels it). NULL is fine. */
void group_commit_close(struct group_commit *gc);

/* The number of a write just appended (call it after the write returned). */
uint64_t group_commit_note(struct group_commit *gc);

/* Syncs made and calls they completed, for tests and benchmarks. */
void group_commit_stats(struct group_commit *gc, uint64_t *syncs,
                        uint64_t *calls);

/* Per-loop state: a store_loop (first) plus the wake-up of that loop. */
int group_commit_loop_new(struct group_commit *gc, struct store *st,
                          struct event_base *base, struct store_loop **out,
                          struct sc_error *err);
/* Cancels what it still waits for (no completion runs). Not from inside a
 * completion of this loop. */
void group_commit_loop_free(struct store_loop *sl);

/* A call's place in the queue, made before the call writes, so that no
 * write is ever left unawaited for want of memory. NULL: out of memory. */
struct gc_node *group_commit_node_new(void);

/* The call's result is rc (already in c's result fields); it may be
 * reported once ticket is durable. Takes n (freed unless queued). Returns
 * rc when ticket is durable already, -EINPROGRESS when c->done will run on
 * sl's loop later (c->rc = rc then, or -EIO with c->err if the sync
 * failed), or -EIO with c->err at once when an earlier sync failed. */
int group_commit_wait(struct store_loop *sl, struct store_call *c,
                      struct gc_node *n, uint64_t ticket, int rc);
/* Forgets a waiting call (store_call_cancel). */
void group_commit_cancel(struct store_call *c);

#endif
