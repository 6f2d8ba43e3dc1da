/* What a store backend implements (store.h is what callers see). A backend's
 * own struct starts with struct store, whose ops point at its table.
 *
 * The blocking operations are required. The asynchronous ones are optional:
 * a backend without them (RocksDB without sync, whose calls take
 * microseconds and never wait on a network or a disk) has them run at once
 * by store.c through the blocking ones. A backend with them (Redis; RocksDB
 * with sync, whose calls wait for a shared fsync) completes each call on the
 * loop of the store_loop it was issued on, and owns c->pending while it is
 * in flight. */
#ifndef SLUICE_STORE_STORE_BACKEND_H
#define SLUICE_STORE_STORE_BACKEND_H

#include "store/store.h"

struct store_ops;

/* A new lease's fence (store_record.lease): random and never 0, so that no
 * two leases of a key share one, whatever happened to the key between
 * them. */
uint64_t store_lease_draw(void);

struct store {
    const struct store_ops *ops;
};

/* The generic per-loop state; a backend with asynchronous calls embeds it
 * first in its own. */
struct store_loop {
    struct store *st;
    struct event_base *base;
};

/* Arguments of an asynchronous call, as the caller gave them. */
struct store_args {
    const char *scope, *key;
    const uint8_t *fp;
    uint64_t now_ms, lease_ms, ttl_ms, until_ms;
    uint32_t attempt;
    uint64_t lease;         /* complete, release: the lease's fence */
    uint64_t created_ms;    /* complete: the lease's record's, when fp is
                               set (the backend knows the lease it took) */
    int status;
    const struct store_header *headers;
    size_t n_headers;
    const uint8_t *body;
    size_t body_len;
    bool body_omitted;
    /* buckets and slots */
    const char *partition, *holder;
    const struct store_verify_args *verify; /* verify (declared below) */
    uint64_t t_ns, tau_ns, max_wait_ns, pause_ns, hold_ms;
    uint64_t seen_ms;       /* permit, following a quota: when t, tau were
                               advertised (Unix ms); 0: not following */
    uint64_t reset_in_ns, next_t_ns, next_tau_ns, reset_ms; /* and their
                               next change (struct store_follow) */
    uint64_t quiet_ns, next_quiet_ns; /* (the same) */
    bool top_up;            /* ... and the one permit left of its answer */
    uint32_t top_up_f;
    const char *flight;     /* permit, following a quota: the request's name
                               in the fleet's flight set (hold_ms); and
                               flight_end's */
    uint32_t limit;
};

enum store_op {
    STORE_OP_GET,
    STORE_OP_ACQUIRE,
    STORE_OP_COMPLETE,
    STORE_OP_RELEASE,
    STORE_OP_PAUSE_SET,
    /* only with a backend that shares buckets (start, below) */
    STORE_OP_PERMIT,
    STORE_OP_BUCKET_PAUSE,
    STORE_OP_SLOT_TAKE,
    STORE_OP_SLOT_GIVE,
    STORE_OP_FLIGHT_END,    /* a followed quota's request answered (or gone) */
    STORE_OP_PERMIT_LEASE,
    STORE_OP_RELEASE_UNSENT,
    STORE_OP_WATCH,         /* get, marking a live lease (store_watch_async) */
    STORE_OP_HOLDER_LOOK,   /* is a lease's holder alive (store_holder_look_async) */
    STORE_OP_VERIFY,        /* a verification's step (store_verify_*_async) */
};

/* A step of a lease's verification (store.h, store_verify_*). */
enum store_verify_step {
    STORE_VERIFY_CLAIM,
    STORE_VERIFY_FOUND,
    STORE_VERIFY_ABSENT,
    STORE_VERIFY_FAILED,
};

struct store_verify_args {
    enum store_verify_step step;
    uint64_t lease, now_ms, ttl_ms;
    uint64_t deadline_ms;               /* claim */
    bool again;                         /* claim */
    const struct store_record *result;  /* found: status, headers, body */
};

struct store_ops {
    const char *name;
    void (*close)(struct store *st);
    int (*get)(struct store *st, const char *scope, const char *key,
               uint64_t now_ms, struct store_record *out, struct sc_error *err);
    int (*acquire)(struct store *st, const char *scope, const char *key,
                   const uint8_t fp[STORE_FP_LEN], uint64_t now_ms,
                   uint64_t lease_ms, uint64_t ttl_ms,
                   struct store_acquire_out *out, struct sc_error *err);
    int (*complete)(struct store *st, const char *scope, const char *key,
                    uint64_t lease, uint64_t now_ms, uint64_t ttl_ms, int status,
                    const struct store_header *headers, size_t n_headers,
                    const uint8_t *body, size_t body_len, bool body_omitted,
                    struct sc_error *err);
    int (*release)(struct store *st, const char *scope, const char *key,
                   uint32_t attempt, uint64_t lease, uint64_t now_ms, uint64_t ttl_ms,
                   struct sc_error *err);
    int (*forget)(struct store *st, const char *scope, const char *key,
                  struct sc_error *err);
    int (*sweep)(struct store *st, uint64_t now_ms, size_t max,
                 size_t *removed, struct sc_error *err);
    int (*pause_set)(struct store *st, const char *scope, uint64_t now_ms,
                     uint64_t until_ms, struct sc_error *err);
    int (*pause_get)(struct store *st, const char *scope, uint64_t now_ms,
                     uint64_t *until_ms, struct sc_error *err);
    int (*pause_clear)(struct store *st, const char *scope,
                       struct sc_error *err);
    bool (*healthy)(struct store *st);
    void (*cause)(struct store *st, char *buf, size_t len); /* optional */
    uint64_t (*count)(struct store *st);
    /* Optional: verification marks (store.h); NULL: -EOPNOTSUPP. */
    int (*verify)(struct store *st, const char *scope, const char *key,
                  const struct store_verify_args *a, struct sc_error *err);
    int (*leases_each)(struct store *st, uint64_t now_ms, store_lease_fn fn,
                       void *arg, struct sc_error *err);
    /* Optional: liveness keys (store_live_refresh); NULL: -EOPNOTSUPP. */
    int (*live)(struct store *st, const char *scope, uint64_t ttl_ms,
                struct sc_error *err);
    /* Optional with live: this process's holder id. */
    const char *(*holder_id)(const struct store *st);

    /* Optional: announcements of a lease's end (store_notify_set,
     * store_notified, store_notices); NULL: none, and STORE_OP_WATCH is
     * never started (store.c reads instead). */
    int (*notify_set)(struct store *st, const char *const *scopes, size_t n,
                      store_done_fn *done, void *arg, struct sc_error *err);
    bool (*notified)(struct store *st, const char *scope);
    uint64_t (*notices)(struct store *st);

    /* Optional: asynchronous calls (see above). start returns -EINPROGRESS,
     * or the result when the call completed at once (a failure with
     * c->err). */
    int (*loop_new)(struct store *st, struct event_base *base,
                    struct store_loop **out, struct sc_error *err);
    void (*loop_free)(struct store_loop *sl);
    int (*start)(struct store_loop *sl, struct store_call *c, enum store_op op,
                 const struct store_args *a);
    void (*cancel)(struct store_call *c);
    bool shares_buckets;    /* start takes the bucket and slot ops */
};

#endif
