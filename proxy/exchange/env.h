/* What the rows of a request's plan may use of the process (stage.h): one
 * per event loop, owned by the loop (server.c), borrowed by its requests. */
#ifndef SLUICE_PROXY_EXCHANGE_ENV_H
#define SLUICE_PROXY_EXCHANGE_ENV_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

struct claims;
struct event_base;
struct exchange;
struct freelist;
struct key_waiters;
struct metrics_shard;
struct statsd;
struct store_loop;

/* The clock stages read (tests give a fake one). */
struct ex_clock {
    uint64_t (*mono_ns)(void *arg);
    uint64_t (*wall_ms)(void *arg);
    void *arg;
};

/* What stages may use of the process: one per event loop, set up by its
 * owner (the server) and borrowed by every exchange of the loop. */
struct ex_env {
    const struct ex_clock *clock;
    struct event_base *base;        /* events a stage registers */
    struct store_loop *store;       /* the store's calls from this loop */
    bool store_shares;              /* it shares buckets and slots (Redis) */
    uint64_t store_timeout_ms;      /* one store call; 0: no limit */
    uint32_t replicas_ack;          /* a completion also waits for replicas */
    struct claims *claims;          /* keys waiting for their permit */
    struct key_waiters *dup_waiters; /* this loop's duplicates waiting for a
                                       fleet's lease, woken by the store's
                                       notices; NULL: none (they poll) */
    atomic_long *leases_active;     /* durable leases held, for the gauge */
    struct metrics_shard *metrics;  /* this loop's shard */
    struct statsd *statsd;          /* fd -1: off */
    struct freelist *spare_calls;   /* store calls kept for reuse */
    /* Starts the background verification of the unknown outcome of ex,
     * which holds its key's lease (docs/contract.md §11): its deadline D,
     * wall clock ms, or 0 when none started (the lease then waits out its
     * expiry, as without verify). NULL: the process verifies nothing. */
    uint64_t (*verify_begin)(void *arg, struct exchange *ex);
    /* Fleet mode: ex met the lease `fence` of its key, ending at
     * expires_ms (wall), whose holder (or, with again, whose pending
     * verification's verifier) is gone: claims that lease and verifies it
     * in the background with ex's upstream and T. D as verify_begin's, 0
     * when none started (the lease ends before a lookup could go). NULL:
     * never. */
    uint64_t (*verify_take_up)(void *arg, struct exchange *ex, uint64_t fence,
                               uint64_t expires_ms, bool again);
    void *verify_arg;
};

/* The process's clocks (util/clock.h), for an env outside tests. */
extern const struct ex_clock ex_system_clock;

#endif
