/* The byte formats of the idempotency store, apart from any database: the
 * record key (scope, '\0', key) and the versioned record value. Internal to
 * store/; store.h is the public interface.
 *
 * Value layout, all integers little-endian:
 *
 *   v3                                 v2, v1 (earlier releases)
 *   u8   version = 3                   u8   version = 2 (1)
 *   u8   state (1 in progress,         u8   state
 *             2 completed)
 *   u8   flags (bit 0 body_omitted;    u8   flags (v1: none, body_omitted
 *             2, 3 a duplicate waits,             false; v2: bits 2, 3
 *             others must be 0)                   as v3)
 *   u32  attempt                       u32  attempt
 *   u64  expires_ms                    u64  expires_ms
 *   u64  created_ms                    u64  created_ms
 *   u64  lease_expires_ms              u64  lease_expires_ms
 *   u64  completed_ms                  u64  completed_ms
 *   u8[32] fingerprint                 u8[32] fingerprint
 *   u64  lease (the lease's fence)     -    (no fence: lease 0)
 *   u16  status (0 while in progress)  u16  status
 *   u32  n_headers                     u32  n_headers
 *   n × { u32 len, name bytes,         (same)
 *         u32 len, value bytes }
 *   u32  body_len, body bytes          u32  body_len, body bytes
 *
 * v4 (current) is v3 with a verification of an unknown outcome
 * (docs/contract.md §11): flags bit 1 is `verified` (completed from a
 * lookup), and right after the fence come
 *   u8   verify (enum verify_state: 0 none, 1 pending, 2 found, 3 absent,
 *        4 failed)
 *   u64  verify_deadline_ms (pending: when the verification ends at the
 *        latest, wall clock)
 * v5 is v4 with the process responsible for the lease in fleet mode (its
 * holder, or the verifier that claimed it; contract §11) right after the
 * deadline, so a lease is one Redis key and one write:
 *   u8[32] holder (ASCII, NUL-padded; all NUL: not known)
 * record_encode picks the oldest version that holds a record: one without
 * a holder or a mark (or a mark's deadline) is still v3, so earlier
 * releases read every such record (RocksDB's and every completed one among
 * them); a marked one is v4, a lease named by its holder v5 (a Redis
 * fleet's scripts read all of them: redis_scripts.c).
 * In every version with a flags byte, bits 2 and 3 say that a duplicate
 * waits for the lease to end (a Redis fleet, docs/reference/fleet.md,
 * "Waiting duplicates"): the script that ends it publishes the key, on
 * the policy's sharded channel when bit 3 is set, else on its plain one.
 * Only the Redis scripts set them (SETRANGE on the flags byte, which keeps
 * the TTL); C never writes them and reads past them.
 *
 * expires_ms sits at a fixed offset right after the small fields so the
 * compaction filter and the sweeper read it without decoding the rest. The
 * value ends exactly after the body: trailing bytes mean corruption. */
#ifndef SLUICE_STORE_RECORD_H
#define SLUICE_STORE_RECORD_H

#include <stdint.h>

#include "store/store.h"

#define RECORD_VERSION 5
#define RECORD_VERIFY_MAX 4  /* VERIFY_FAILED (policies/verify.h) */
#define RECORD_SCOPE_MAX 64  /* policy names (load_engine.c valid_name) */
#define RECORD_KEY_MAX 255   /* docs/contract.md §6, policies/idemkey.h */

/* A database key: scope, '\0', key. '\0' occurs in neither, so no two
 * (scope, key) pairs share an encoding and a scope's keys sort together. */
struct record_key {
    size_t len;
    char buf[RECORD_SCOPE_MAX + 1 + RECORD_KEY_MAX];
};

/* Builds k from a scope (1..64 of letters, digits, "-_.") and a key (1..255
 * printable ASCII, space included: an unquoted Structured-Field string may
 * hold one). 0, or -EINVAL with err. */
int record_key_make(struct record_key *k, const char *scope, const char *key,
                    struct sc_error *err);

/* Encodes rec in the oldest version that holds it (v3; v4 with a
 * verification mark; v5 with a holder) into a malloc'ed buffer (*out,
 * free()). 0, -EINVAL (a field out of range, with err) or -ENOMEM. */
int record_encode(const struct store_record *rec, uint8_t **out,
                  size_t *out_len, struct sc_error *err);

/* The same into buf when it holds cap bytes, without allocating: *out_len
 * gets the size in any case (more than cap: nothing written, call again
 * with a larger buffer). 0 or -EINVAL with err. */
int record_encode_to(const struct store_record *rec, uint8_t *buf, size_t cap,
                     size_t *out_len, struct sc_error *err);

/* Decodes any known version into rec (owned by the caller: clear it).
 * 0; -EPROTO for an unknown version, -EBADMSG for a truncated or corrupt
 * value, -ENOMEM; rec is left zeroed on failure. Reads only buf[0..len).
 * The message names no key: the caller, who knows it, adds it. */
int record_decode(const uint8_t *buf, size_t len, struct store_record *rec,
                  struct sc_error *err);

/* Reads expires_ms alone. 0, or -EPROTO / -EBADMSG as record_decode. */
int record_peek_expiry(const uint8_t *buf, size_t len, uint64_t *expires_ms);

#endif
