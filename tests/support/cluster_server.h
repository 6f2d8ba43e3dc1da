/* A real Redis Cluster for tests: N primaries, each with one replica, on
 * 127.0.0.1 (tests/support/redis_server.h with cluster mode), the slots
 * split evenly between the primaries; built with CLUSTER ADDSLOTSRANGE,
 * MEET and REPLICATE (redis-cli --cluster create wants 3 primaries at
 * least, and a 1- or 2-primary cluster is measured too). Every wait is
 * bounded; servers are stopped by their pid. */
#ifndef SLUICE_TESTS_SUPPORT_CLUSTER_SERVER_H
#define SLUICE_TESTS_SUPPORT_CLUSTER_SERVER_H

#include <stdbool.h>

#include "support/redis_server.h"

#define CLUSTER_PRIMARIES_MAX 3

struct cluster_server {
    unsigned n;                 /* primaries at the start */
    unsigned replicas;          /* 0 or 1 each */
    /* [0..n-1] the primaries at the start, [n..2n-1] their replicas */
    struct redis_server srv[2 * CLUSTER_PRIMARIES_MAX];
};

/* Starts n primaries (and a replica each when replicas) and waits (at most
 * 20 s) for cluster_state:ok on every node. 0 or -1 (stopped again). */
int cluster_server_start(struct cluster_server *c, unsigned n, bool replicas);

void cluster_server_destroy(struct cluster_server *c);

/* The index in srv of the server that is a primary owning key's slot now,
 * or -1 (asked of every live server in turn). */
int cluster_server_owner(const struct cluster_server *c, const char *key);

/* The slot of key, as Redis computes it (CLUSTER KEYSLOT), or -1. */
int cluster_server_keyslot(const struct cluster_server *c, const char *key);

/* Moves slot from srv[from] to srv[to] as resharding does: IMPORTING on to,
 * MIGRATING on from, MIGRATE of its keys (pausing pause_ms between the
 * keys' batches, so that commands meet the slot half moved), then NODE on
 * every primary. true when done. */
bool cluster_server_move_slot(const struct cluster_server *c, unsigned slot,
                              int from, int to, unsigned pause_ms);

/* CLUSTER FAILOVER on srv[replica] (a graceful one), and waits (at most
 * ms) until it is a primary and the cluster is ok. */
bool cluster_server_failover(const struct cluster_server *c, int replica,
                             unsigned ms);

/* Waits (at most ms) for cluster_state:ok on every live server. */
bool cluster_server_wait_ok(const struct cluster_server *c, unsigned ms);

#endif
