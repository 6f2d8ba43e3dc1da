/* Requeue and dead-letter instructions (docs/contract.md §4): the status, the
 * headers and the JSON body a worker hands to its queue. */
#ifndef SLUICE_POLICIES_INSTRUCTION_H
#define SLUICE_POLICIES_INSTRUCTION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "policies/problem.h"

struct instruction {
    enum outcome outcome;   /* OUT_REQUEUE or OUT_DEAD_LETTER */
    enum reason reason;
    uint64_t delay_ms;      /* requeue only; >= 1 */
    uint32_t attempt, max_attempts;
    const char *key;        /* idempotency key, NULL when unknown */
    int upstream_status;    /* 0 when no status line was received */
    bool verify_pending;    /* the key's verification runs (contract §11):
                               "verify": "pending" in the body */
};

/* 409 for lease_held; 503 for upstream_5xx, connect_error, connection_lost,
 * timeout, store_unavailable; else 429. */
int instruction_status(enum reason r);

/* delay_ms rounded up to whole seconds, at least 1. */
uint64_t instruction_delay_seconds(uint64_t delay_ms);

/* The JSON body (owned, free()); NULL on allocation failure. */
char *instruction_json(const struct instruction *in, size_t *len);

#endif
