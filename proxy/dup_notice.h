/* Fleet mode's waiting duplicates (docs/contract.md §6): the store listens
 * for the end of the leases of every policy with `duplicates: wait`, and
 * each announced key wakes its waiters on every loop (loops_wake_key). */
#ifndef SLUICE_PROXY_DUP_NOTICE_H
#define SLUICE_PROXY_DUP_NOTICE_H

#include "util/error.h"

struct app;
struct sc_config;

/* The store listens for cfg's policies from now on (at start-up, after a
 * reload): a failure is logged and the waiters poll, as without. Nothing
 * on a store without announcements (RocksDB). */
void dup_notice_follow(struct app *app, const struct sc_config *cfg);

/* Before the loops go: no announcement reaches them any more. */
void dup_notice_stop(struct app *app);

#endif
