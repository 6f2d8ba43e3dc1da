/* In-memory claims on idempotency keys (docs/contract.md §6): between a request's
 * arrival and its forwarding (while it waits for a permit and a slot) its
 * claim lives only here, shared by every thread, and ends with the process:
 * nothing was sent, so nothing durable is left behind. */
#ifndef SLUICE_PACING_CLAIMS_H
#define SLUICE_PACING_CLAIMS_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct claim;

struct claims {
    pthread_mutex_t mu;
    struct claim **table;
    size_t size, count;
};

int claims_init(struct claims *c);
void claims_free(struct claims *c);

/* Claims (scope, key) until claims_drop. The holder may wait until
 * wait_deadline_ns, then take up to timeout_ns upstream (monotonic ns).
 * Returns false when another exchange holds it, with *remaining_ns the time
 * the holder may still take. */
bool claims_take(struct claims *c, const char *scope, const char *key,
                 uint64_t now_ns, uint64_t wait_deadline_ns, uint64_t timeout_ns,
                 uint64_t *remaining_ns);

/* The holder was forwarded: from now on it may take until lease_end_ns. */
void claims_forwarded(struct claims *c, const char *scope, const char *key,
                      uint64_t lease_end_ns);

void claims_drop(struct claims *c, const char *scope, const char *key);

#endif
