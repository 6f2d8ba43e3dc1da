/* Redis Cluster's pure parts (docs/reference/fleet.md, "Redis Cluster"):
 * the slot of a key, the slot map as CLUSTER SHARDS or CLUSTER SLOTS
 * answer it, and the redirections MOVED and ASK. No I/O: unit-tested on
 * their own. Internal to store/. */
#ifndef SLUICE_STORE_REDIS_SLOT_H
#define SLUICE_STORE_REDIS_SLOT_H

#include <stdbool.h>
#include <stddef.h>

#include <hiredis/hiredis.h>

#include "util/error.h"

#define REDIS_SLOTS 16384

/* The slot of a key: CRC16 (XMODEM) of its hash tag (what lies between the
 * first '{' and the next '}', when not empty), else of the whole key, mod
 * 16384, as Redis Cluster computes it. */
unsigned redis_key_slot(const char *key, size_t len);

/* One range of a slot map: slots lo..hi served by the primary at host
 * (hlen bytes, not terminated) and port. */
typedef int redis_slots_fn(void *arg, unsigned lo, unsigned hi,
                           const char *host, size_t hlen, unsigned port);

/* Reads a CLUSTER SLOTS reply, calling fn for each range in order (a
 * primary given as "" is the node asked: asked_host). 0, fn's first
 * non-zero return, or -EPROTO with err (a reply of another shape). */
int redis_slots_parse(const redisReply *r, const char *asked_host,
                      redis_slots_fn *fn, void *arg, struct sc_error *err);

/* Reads a CLUSTER SHARDS reply (Redis 7.0 on; RESP2: each map a flat
 * array of name, value) as redis_slots_parse does: fn for each slot range
 * of each shard's primary, at its endpoint (else its ip; "" or "?": the
 * node asked) and its TLS port when tls (else its plain port), or the one
 * port it lists. A shard without a primary or slots is skipped. 0, fn's
 * first non-zero return, or -EPROTO with err. */
int redis_shards_parse(const redisReply *r, const char *asked_host, bool tls,
                       redis_slots_fn *fn, void *arg, struct sc_error *err);

/* Whether r is how a node refuses CLUSTER SHARDS for good: Redis 6 does
 * not know it ("ERR Unknown subcommand"), an ACL user may not run it
 * (NOPERM). CLUSTER SLOTS answers there. */
bool redis_shards_unknown(const redisReply *r);

/* A redirection: "MOVED <slot> <host>:<port>" or "ASK ..." (host may be an
 * IPv6 literal: the port follows the last ':'). */
struct redis_redirect {
    bool ask;
    unsigned slot;
    const char *host;   /* into the reply's text */
    size_t hlen;
    unsigned port;
};

/* Whether r is an error reply that redirects, into *out. */
bool redis_redirect_parse(const redisReply *r, struct redis_redirect *out);

/* Whether r is an error a cluster answers while a slot migrates
 * (TRYAGAIN) or the cluster is down (CLUSTERDOWN). */
bool redis_reply_cluster_busy(const redisReply *r);

#endif
