/* The idempotency store (docs/contract.md §6): per (policy, key), a record that is
 * absent, in progress (a lease with its expiry and the attempt count), or
 * completed (status, end-to-end headers, body, times). One interface, two
 * backends behind it (store_backend.h): RocksDB in a local directory
 * (store_rocksdb.c, the default) and Redis shared by a fleet.
 *
 * Two ways to call:
 * - The blocking calls below are thread-safe and short (one point read or
 *   one write); the admin server, start-up and tests use them.
 * - The request path uses the asynchronous calls at the end of this file: a
 *   call, then a completion on the caller's loop, so a loop never waits for
 *   a network round trip or an fsync. RocksDB completes them at once, or
 *   with `sync` after the group commit's WAL sync (group_commit.h).
 * Times are Unix milliseconds passed in by the caller (tests use a fake
 * clock); a backend shared by several hosts may use its own clock for
 * leases instead. Every write is durable before its call completes: it
 * survives a crash of the process, and with `sync` a power loss too. */
#ifndef SLUICE_STORE_STORE_H
#define SLUICE_STORE_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/error.h"

#define STORE_FP_LEN 32 /* SHA-256 */
#define STORE_HOLDER_LEN 32 /* a holder id: 32 hex digits (policies/verify.h) */

enum store_state {
    STORE_IN_PROGRESS = 1, /* lease_expires_ms in the future: held */
    STORE_COMPLETED = 2,
};

struct store_header {
    char *name, *value;
};

struct store_record {
    enum store_state state;
    uint32_t attempt;           /* upstream attempts made so far */
    uint8_t fingerprint[STORE_FP_LEN];
    uint64_t lease;             /* in progress: the lease's fence, a random
                                   number drawn by each acquire, so that no
                                   two leases of a key share it (a takeover,
                                   a key forgotten and taken again); 0 in a
                                   record of an earlier version */
    uint64_t created_ms;        /* first acquire */
    uint64_t lease_expires_ms;  /* in progress; <= now once released */
    uint64_t completed_ms;      /* completed */
    uint64_t expires_ms;        /* when the record stops counting */
    int status;                 /* completed */
    struct store_header *headers;
    size_t n_headers;
    uint8_t *body;
    size_t body_len;
    bool body_omitted;          /* over max_stored_body: status + headers only */
    /* the verification of the current lease's unknown outcome (contract
     * §11), none in a record of an earlier version */
    uint8_t verify;             /* enum verify_state (policies/verify.h) */
    uint64_t verify_deadline_ms;/* pending: its end at the latest (wall) */
    bool verified;              /* completed from a lookup's answer */
    /* fleet mode (contract §11): the process responsible for the lease in
     * progress (its holder, or the verifier that claimed it), as its id;
     * "" when not known (RocksDB, whose leases are all this process's, and
     * records of an earlier version) */
    char holder[STORE_HOLDER_LEN + 1];
    void *block;                /* set by a decode: headers, their strings and
                                 * the body in this one allocation (else each
                                 * is allocated on its own) */
};

/* Frees what the record owns and zeroes it. */
void store_record_clear(struct store_record *rec);

struct store;

/* Opens (creating if missing) the RocksDB store at path. 0 or negative +
 * err. */
int store_open_rocksdb(const char *path, bool sync, struct store **out,
                       struct sc_error *err);
/* A Redis Sentinel's address. */
struct store_redis_addr {
    const char *host;
    unsigned port;
};

#define STORE_SENTINELS_MAX 8

/* With replicas_ack, a completion answers within this many timeout_ms:
 * what is left of a WAIT already in flight, its own WAIT, its reply. */
#define STORE_WAIT_TIMEOUTS 3

/* Where the Redis store lives (docs/contract.md §10). The strings are
 * copied by store_open_redis. With sentinels, host and port are a first
 * guess: the primary is the one the sentinels name for master. */
struct store_redis_opts {
    const char *host;
    unsigned port;
    const struct store_redis_addr *sentinels; /* asked in turn, without AUTH */
    unsigned n_sentinels;                     /* 0: host is the primary */
    const char *master;                       /* with sentinels */
    unsigned replicas_ack; /* > 0: a completion WAITs for that many replicas */
    bool cluster;         /* Redis Cluster: host:port and nodes are seeds */
    const struct store_redis_addr *nodes; /* more seeds (with cluster) */
    unsigned n_nodes;
    const char *user;     /* NULL: AUTH <password> (the default user) */
    const char *password; /* NULL: none (no AUTH) */
    unsigned db;          /* SELECTed when not 0 */
    bool tls;             /* rediss://: every connection, sentinels too */
    bool tls_verify;      /* chain and name checked */
    const char *tls_ca_file, *tls_cert_file, *tls_key_file; /* NULL or "" */
    const char *tls_server_name; /* NULL or "": the host connected to */
    uint64_t timeout_ms;  /* connect and per-command; 0: 100 ms */
    const char *prefix;   /* key prefix; NULL or "": "sluice" */
};

/* Opens the Redis store of a fleet: records, leases and pauses shared by
 * every sidecar pointed at the same Redis and prefix. An unreachable Redis
 * is not an error here (a fleet may start before its Redis): the store is
 * unhealthy until a command works. 0 or negative + err (bad options). */
int store_open_redis(const struct store_redis_opts *o, struct store **out,
                     struct sc_error *err);

/* Flushes and closes; NULL is fine. */
void store_close(struct store *st);

/* The record, if it still counts at now_ms. 0 and *out filled; -ENOENT when
 * absent or expired; another negative code (with err) when the store failed. */
int store_get(struct store *st, const char *scope, const char *key,
              uint64_t now_ms, struct store_record *out, struct sc_error *err);

enum store_claim {
    STORE_ACQUIRED = 0,   /* a new lease is ours; *attempt = this attempt */
    STORE_HELD,           /* another live lease; *remaining_ms until expiry */
    STORE_DONE,           /* completed and live: *rec filled for replay */
    STORE_MISMATCH,       /* same key, different fingerprint */
    STORE_FREE,           /* permit_lease: takeable, but the permit was
                             refused, so nothing was taken; *attempt = the
                             attempt it would have been */
};

struct store_acquire_out {
    enum store_claim claim;
    uint32_t attempt;        /* ACQUIRED: the attempt this one is (1-based) */
    uint64_t lease;          /* ACQUIRED: the new lease's fence, which its
                                complete or release must name; HELD: the
                                held lease's (to verify it) */
    uint64_t lease_expires_ms; /* ACQUIRED: the new lease's end (wall ms) */
    uint64_t remaining_ms;   /* HELD */
    uint8_t verify;          /* HELD: the lease's verification mark (enum
                                verify_state), so that a duplicate is told
                                "verify": "pending" */
    uint64_t verify_deadline_ms; /* HELD and pending: its end (wall) */
    bool holder_gone;        /* HELD, fleet mode: the process responsible
                                for the lease (its holder, or its pending
                                verification's verifier) has no liveness
                                key (contract §11); always false on RocksDB,
                                whose holders are this process */
    struct store_record rec; /* DONE (owned by the caller: clear it) */
};

/* Atomically takes the key's lease for lease_ms: when the record is absent,
 * expired, released or its lease has expired (a takeover), writes an
 * in-progress record with attempt + 1, keeping created_ms, and answers
 * ACQUIRED. The record then expires at lease expiry + ttl_ms (an attempt
 * count outlives its lease by ttl). Checks the fingerprint first. */
int store_acquire(struct store *st, const char *scope, const char *key,
                  const uint8_t fp[STORE_FP_LEN], uint64_t now_ms,
                  uint64_t lease_ms, uint64_t ttl_ms,
                  struct store_acquire_out *out, struct sc_error *err);

/* Makes the record completed: status, headers, body (or body_omitted),
 * completed_ms = now_ms, expires_ms = now_ms + ttl_ms; attempt and
 * fingerprint kept. Fenced: only the holder of the lease named `lease`
 * (store_acquire_out.lease) may complete it; -ESTALE (with err) when another
 * lease holds the key (a takeover after expiry, the key forgotten and taken
 * again), -EALREADY when completed, -ENOENT when absent. */
int store_complete(struct store *st, const char *scope, const char *key,
                   uint64_t lease, uint64_t now_ms, uint64_t ttl_ms, int status,
                   const struct store_header *headers, size_t n_headers,
                   const uint8_t *body, size_t body_len, bool body_omitted,
                   struct sc_error *err);

/* Ends the lease `lease` of `attempt` early (a known, retryable result):
 * lease_expires_ms = now, the attempt count is kept until now + ttl_ms.
 * -ENOENT when absent; -EALREADY when completed; -ESTALE (with err) when
 * another lease holds the key (a takeover, or the key forgotten and taken
 * again): a holder that outlived its lease must not end its successor's. */
int store_release(struct store *st, const char *scope, const char *key,
                  uint32_t attempt, uint64_t lease, uint64_t now_ms, uint64_t ttl_ms,
                  struct sc_error *err);

/* Deletes the record (an operator unblocks a key). -ENOENT when absent. */
int store_forget(struct store *st, const char *scope, const char *key,
                 struct sc_error *err);

/* Deletes at most max records whose expires_ms < now_ms, resuming where the
 * previous call stopped (bounded work per call, never a stall). *removed
 * gets the count. */
int store_sweep(struct store *st, uint64_t now_ms, size_t max, size_t *removed,
                struct sc_error *err);

/* A policy's pause that must outlive the process: an upstream asked the
 * policy (scope) to send nothing before until_ms (a 429 with a reset hint,
 * docs/contract.md §4, "Cooldown"). Kept beside the records under a key that no
 * idempotency key can take, and reclaimed like a record once it has passed.
 * A later moment replaces an earlier one, never the reverse. */
int store_pause_set(struct store *st, const char *scope, uint64_t now_ms,
                    uint64_t until_ms, struct sc_error *err);

/* 0 and *until_ms when scope's pause still runs at now_ms; -ENOENT when it
 * has none (err untouched); another negative code with err on a failure. */
int store_pause_get(struct store *st, const char *scope, uint64_t now_ms,
                    uint64_t *until_ms, struct sc_error *err);

/* Deletes scope's pause (an operator ended it: a restart must not bring it
 * back). -ENOENT when there is none; another negative code with err. */
int store_pause_clear(struct store *st, const char *scope, struct sc_error *err);

/* False once a write has failed (a full disk, an I/O error): from then on
 * every write is refused until the process restarts; reads still work. */
bool store_healthy(struct store *st);
/* Why the store was last found unhealthy ("" when it says nothing), into
 * buf: for /readyz, never holding a secret. */
void store_unhealthy_cause(struct store *st, char *buf, size_t len);

/* Live records, estimated (for the sluice_store_records gauge). */
uint64_t store_count(struct store *st);

/* The backend's name ("rocksdb", "redis"), for logs and /readyz. */
const char *store_backend_name(const struct store *st);

/* ---- settling an unknown outcome (docs/contract.md §11) ------------------ */

/* A lease's verification mark moves NONE -> PENDING (claimed) -> FOUND
 * (completed from the lookup), ABSENT (released) or FAILED (kept until it
 * expires). Each call below acts only on the lease named `lease` (its fence)
 * while it is still in progress at now_ms: -ENOENT when the record is
 * absent or expired, -EALREADY when it is completed or its mark does not
 * allow the step, -ESTALE (with err) when another lease holds the key or
 * the lease has expired; another negative code (with err) when the store
 * failed. A backend that cannot keep marks (Redis, for now) answers
 * -EOPNOTSUPP. Blocking calls, one short read-modify-write each. */

/* Marks the lease PENDING until deadline_ms (wall clock): only when its mark
 * is NONE, or, with again, PENDING (a verification whose verifier ended:
 * start-up); so at most one verification of a lease runs at a time. */
int store_verify_claim(struct store *st, const char *scope, const char *key,
                       uint64_t lease, uint64_t now_ms, uint64_t deadline_ms,
                       bool again, struct sc_error *err);

/* The lookup found the operation: the PENDING lease's record becomes
 * completed as store_complete makes it, marked FOUND and verified. */
int store_verify_found(struct store *st, const char *scope, const char *key,
                       uint64_t lease, uint64_t now_ms, uint64_t ttl_ms,
                       int status, const struct store_header *headers,
                       size_t n_headers, const uint8_t *body, size_t body_len,
                       bool body_omitted, struct sc_error *err);

/* It did not happen: the PENDING lease is released as store_release does
 * (the attempt count kept until now + ttl_ms), marked ABSENT. */
int store_verify_absent(struct store *st, const char *scope, const char *key,
                        uint64_t lease, uint64_t now_ms, uint64_t ttl_ms,
                        struct sc_error *err);

/* No answer in its lookups: the PENDING lease is marked FAILED and kept
 * until it expires; it is never verified again. */
int store_verify_failed(struct store *st, const char *scope, const char *key,
                        uint64_t lease, uint64_t now_ms, struct sc_error *err);

/* Calls fn for every lease in progress at now_ms (unexpired, neither
 * released nor completed), rec decoded (borrowed for the call). fn returns
 * 0 to go on, anything else to stop (returned). For start-up: with RocksDB
 * each of them belongs to a process that ended. */
typedef int (*store_lease_fn)(void *arg, const char *scope, const char *key,
                              const struct store_record *rec);
int store_leases_each(struct store *st, uint64_t now_ms, store_lease_fn fn,
                      void *arg, struct sc_error *err);

/* Fleet mode (contract §11): each process has a random holder id, which
 * the leases it takes (and the verifications it claims) name; a lease
 * whose holder has no liveness key is reported HELD with holder_gone.
 * Sets this process's liveness key of scope (a policy) for ttl_ms; call it
 * more often than that. -EOPNOTSUPP on a backend whose leases are all this
 * process's (RocksDB). Blocking: one short command. */
int store_live_refresh(struct store *st, const char *scope, uint64_t ttl_ms,
                       struct sc_error *err);

/* ---- asynchronous calls: the request path -------------------------------- */

struct event_base;

/* A backend's state on one event loop (its connection there). One per loop,
 * used only from that loop's thread. */
struct store_loop;

int store_loop_new(struct store *st, struct event_base *base,
                   struct store_loop **out, struct sc_error *err);
/* Cancels what is still in flight on it (no completion runs). NULL is fine. */
void store_loop_free(struct store_loop *sl);

/* A shared bucket's answer (GCRA on the backend's clock). */
struct store_permit {
    bool granted;           /* reserved: start after wait_ns */
    bool paused;            /* refused: the policy is paused (a cooldown) */
    uint64_t wait_ns;       /* granted: until the start; refused: until a
                               permit (or the pause's end) */
    uint32_t flight;        /* flight_end: the fleet's requests of the
                               bucket sent and not answered, this one out */
};

/* A fleet-wide concurrency slot. */
struct store_slot {
    bool granted;
};

/* One call in flight, owned by the caller (an exchange), which sets done and
 * arg, and reads rc, err and the result once it has completed. */
struct store_call {
    void (*done)(struct store_call *c);
    void *arg;
    int rc;                         /* as the blocking call would return */
    struct sc_error err;
    struct store_record rec;        /* get: the record (clear it after) */
    struct store_acquire_out acq;   /* acquire (acq.rec: clear it after) */
    struct store_permit permit;     /* permit */
    struct store_slot slot;         /* slot_take */
    bool replication_short;         /* complete with replicas_ack: written,
                                       but fewer replicas confirmed it
                                       within the timeout */
    struct store_loop *loop;        /* where it was issued */
    void *pending;                  /* the backend's, while in flight */
};

/* Each call returns 0 when it completed at once (c->rc holds the result;
 * done does not run), or -EINPROGRESS: done runs later on sl's loop, never
 * from inside the call. The arguments are copied: they need not outlive the
 * call. Anything else is a failure to start, reported in c->rc as well. */
int store_get_async(struct store_loop *sl, struct store_call *c,
                    const char *scope, const char *key, uint64_t now_ms);
int store_acquire_async(struct store_loop *sl, struct store_call *c,
                        const char *scope, const char *key,
                        const uint8_t fp[STORE_FP_LEN], uint64_t now_ms,
                        uint64_t lease_ms, uint64_t ttl_ms);
int store_complete_async(struct store_loop *sl, struct store_call *c,
                         const char *scope, const char *key, uint64_t lease,
                         uint64_t now_ms,
                         uint64_t ttl_ms, int status,
                         const struct store_header *headers, size_t n_headers,
                         const uint8_t *body, size_t body_len,
                         bool body_omitted);
int store_release_async(struct store_loop *sl, struct store_call *c,
                        const char *scope, const char *key, uint32_t attempt,
                        uint64_t lease, uint64_t now_ms, uint64_t ttl_ms);
int store_pause_set_async(struct store_loop *sl, struct store_call *c,
                          const char *scope, uint64_t now_ms,
                          uint64_t until_ms);

/* ---- the end of a lease, announced (duplicates: wait in fleet mode) ------- */

/* A duplicate's look at a key it waits for (contract §6): as
 * store_get_async, and, while the record's lease is live, marked so that
 * whoever ends that lease (a completion, a release, a verification's
 * result) announces it. A backend without announcements reads only. */
int store_watch_async(struct store_loop *sl, struct store_call *c,
                      const char *scope, const char *key, uint64_t now_ms);

/* Fleet mode (contract §11): whether the liveness key of holder (another
 * process's id, store_loop_holder_other) in scope is gone, in
 * c->acq.holder_gone. One read, no script: what a lease read by a plain
 * get (the lookup row) cannot tell. -EOPNOTSUPP on a backend without
 * liveness keys. */
int store_holder_look_async(struct store_loop *sl, struct store_call *c,
                            const char *scope, const char *holder);

/* The verification steps above, as calls on the loop (c->rc as the
 * blocking ones return): one round trip each on Redis, never a blocked
 * loop; RocksDB answers at once. */
int store_verify_claim_async(struct store_loop *sl, struct store_call *c,
                             const char *scope, const char *key, uint64_t lease,
                             uint64_t now_ms, uint64_t deadline_ms, bool again);
int store_verify_found_async(struct store_loop *sl, struct store_call *c,
                             const char *scope, const char *key, uint64_t lease,
                             uint64_t now_ms, uint64_t ttl_ms, int status,
                             const struct store_header *headers, size_t n_headers,
                             const uint8_t *body, size_t body_len,
                             bool body_omitted);
int store_verify_absent_async(struct store_loop *sl, struct store_call *c,
                              const char *scope, const char *key, uint64_t lease,
                              uint64_t now_ms, uint64_t ttl_ms);
int store_verify_failed_async(struct store_loop *sl, struct store_call *c,
                              const char *scope, const char *key, uint64_t lease,
                              uint64_t now_ms);
/* Whether holder (a record's) names another process than this one: false
 * for "" (not known) and on a backend whose leases are all this
 * process's. */
bool store_loop_holder_other(const struct store_loop *sl, const char *holder);

/* A lease of (scope, key) that a watch marked has ended. From the store's
 * own thread: it must only hand the news on. */
typedef void store_done_fn(void *arg, const char *scope, const char *key);

/* Listens for the announcements of the given scopes (n of them, copied),
 * replacing the set listened to before (n = 0: none), and calls done for
 * each; the listening follows reconnects, failovers and, on a Redis
 * Cluster, the slots' moves. Nothing on a backend without announcements.
 * done and arg must be the same on every call. 0 or -ENOMEM with err. */
int store_notify_set(struct store *st, const char *const *scopes, size_t n,
                     store_done_fn *done, void *arg, struct sc_error *err);

/* Whether the end of scope's leases is announced now (the listening is up
 * and confirmed for it): a waiter may then rely on the announcement, with
 * a slow poll as the fallback for a lost one. Any thread. */
bool store_notified(struct store *st, const char *scope);
/* The same, from a loop's store handle. */
bool store_loop_notified(const struct store_loop *sl, const char *scope);

/* Announcements received so far (every scope), for the metrics. */
uint64_t store_notices(struct store *st);

/* ---- shared buckets and slots: `shared: redis` (contract §10) ----------- */

/* Whether the backend can share buckets and slots between sidecars (Redis
 * can, RocksDB cannot: its calls below fail with -EOPNOTSUPP). */
bool store_shares_buckets(const struct store *st);

/* The bucket of (scope, partition) with emission interval t_ns and
 * tolerance tau_ns (policies/gcra.h): reserves a start no later than
 * max_wait_ns from now, or refuses without reserving; refuses while the
 * policy is paused. partition may be NULL. */
int store_permit_async(struct store_loop *sl, struct store_call *c,
                       const char *scope, const char *partition,
                       uint64_t t_ns, uint64_t tau_ns, uint64_t max_wait_ns);

/* A followed quota's numbers as one sidecar knows them (contract §12). */
struct store_follow {
    uint64_t t_ns, tau_ns;  /* the interval and tolerance it follows now */
    uint64_t quiet_ns;      /* nothing starts before now + quiet_ns, nor
                               more than one token then: what remains of
                               the window is spent, until its reset (0:
                               none); t_ns, tau_ns are the numbers after */
    uint64_t seen_ms;       /* when they were advertised (Unix ms; 0: no
                               news yet) */
    uint64_t reset_in_ns;   /* when they change next (a reset), from now;
                               0: no change known */
    uint64_t next_t_ns, next_tau_ns; /* the numbers after that reset */
    uint64_t next_quiet_ns; /* that change starts a quiet time this long
                               (what remains spent by then: quiet_ns) */
    uint64_t reset_ms;      /* the reset's Unix ms: the news it is then */
    bool top_up;            /* the answer of seen_ms left one permit: the
                               bucket may give it at once (policies/quota.h),
                               unless its set of requests in flight holds
                               more than top_up_f, the count that answer was
                               read with (another sidecar took that permit) */
    uint32_t top_up_f;
    const char *flight;     /* the request's name in the bucket's set of
                               requests in flight (unique; NULL: none) ... */
    uint64_t hold_ms;       /* ... kept at most this long after its start */
};

/* The same, for a policy that follows its partner's quota: f says what
 * this sidecar read. The bucket keeps the numbers of the newest news any
 * sidecar had, and the numbers after their reset, in its state: a caller
 * whose news is older (or as old, or none) paces to those instead, so
 * every sidecar paces to the latest advertised quota, in the same round
 * trip; past that reset, the bucket's numbers are the ones after it, also
 * for a sidecar that never read the partner's answers. */
int store_permit_follow_async(struct store_loop *sl, struct store_call *c,
                              const char *scope, const char *partition,
                              const struct store_follow *f, uint64_t max_wait_ns);

/* An upstream asked for quiet: pause_ns > 0 pauses the policy that long
 * (a later end replaces an earlier one, never the reverse), 0 empties the
 * bucket of (scope, partition). */
int store_bucket_pause_async(struct store_loop *sl, struct store_call *c,
                             const char *scope, const char *partition,
                             uint64_t t_ns, uint64_t tau_ns, uint64_t pause_ns);

/* One of scope's `limit` fleet-wide slots for holder (unique per request),
 * held at most hold_ms (a holder that dies gives it back then). */
int store_slot_take_async(struct store_loop *sl, struct store_call *c,
                          const char *scope, const char *holder,
                          uint32_t limit, uint64_t hold_ms);
int store_slot_give_async(struct store_loop *sl, struct store_call *c,
                          const char *scope, const char *holder);

/* A request whose permit store_permit_follow_async granted with a flight
 * name is answered, or leaves: out of the fleet's set of the bucket's
 * requests in flight; c->permit.flight is then how many the set still
 * holds (those whose hold ran out dropped), the fleet's f of the quota
 * rule (contract §12). partition may be NULL. */
int store_flight_end_async(struct store_loop *sl, struct store_call *c,
                           const char *scope, const char *partition,
                           const char *flight);

/* A keyed request's lookup, permit and lease in one round trip (contract
 * §10): the bucket of (scope, b->partition) as store_permit_async, and the
 * key as store_acquire_async, atomically. A replay (DONE), a live lease
 * (HELD) or a mismatch answer before the bucket is asked, so a duplicate
 * spends no permit; a refused permit takes nothing (FREE, c->permit says
 * why and how long); otherwise the permit is reserved (c->permit) and the
 * lease taken (ACQUIRED) for max_wait + lease_ms, so that it covers the
 * wait for the permit and a slot. */
struct store_bucket_ask {
    const char *partition;           /* NULL: the policy's own bucket */
    uint64_t t_ns, tau_ns, max_wait_ns;
};
int store_permit_lease_async(struct store_loop *sl, struct store_call *c,
                             const char *scope, const char *key,
                             const uint8_t fp[STORE_FP_LEN], uint64_t now_ms,
                             uint64_t lease_ms, uint64_t ttl_ms,
                             const struct store_bucket_ask *b);

/* Ends a lease taken by store_permit_lease_async that never reached the
 * upstream (refused while it waited, the worker gone): released as
 * store_release_async, and its attempt uncounted, so waiting in the fleet's
 * queue spends none of a job's attempts. Fenced like a release. */
int store_release_unsent_async(struct store_loop *sl, struct store_call *c,
                               const char *scope, const char *key,
                               uint32_t attempt, uint64_t lease, uint64_t now_ms,
                               uint64_t ttl_ms);

/* Whether a call is in flight (issued, -EINPROGRESS, not yet completed). */
bool store_call_pending(const struct store_call *c);

/* Forgets a call in flight: its done will not run and its reply is
 * dropped; a write it carried may still happen. Nothing when none is. */
void store_call_cancel(struct store_call *c);

#endif
