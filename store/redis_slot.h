/* Redis Cluster's pure parts (docs/reference/fleet.md, "Redis Cluster"):
 * the slot of a key, the slot map as CLUSTER SLOTS answers it, and the
 * redirections MOVED and ASK. No I/O: unit-tested on their own. Internal to
 * store/. */
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
