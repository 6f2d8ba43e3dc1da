/* The stage interface: what a stage of a request's plan sees and may use.
 *
 * A request runs the plan of its policy (plan.c builds one per policy, and
 * per keyed or plain request, when a config goes into service, as nginx
 * builds its phase handlers): a short array of rows, each a stage that
 * applies to that policy. A stage that does not apply is not in the plan,
 * so no stage asks "do I apply?" of a request. The driver (driver.c) runs
 * the current row until it waits or decides the answer, and is the only
 * one to move on, arm the request's timer, suspend or resume it, and give
 * back what the rows hold (each row's `release`, walked backwards).
 *
 * A stage decides and returns a verdict; it never names another stage,
 * never resumes the request, never frees the exchange. Stages share the
 * exchange's fields (the key a stage checked, the bucket one chose) and the
 * services declared at the end of this file: the answers (verdict.c) and
 * the store calls (store_call.c). They read the time from the driver (`now`)
 * and from ex_wall_ms, and the process only through ex->env, so a stage's
 * unit test needs a fake clock and the few parts that stage uses.
 *
 * How to add a stage:
 *   1. Write its run (and, if it takes something, its release; if it can
 *      wait, its drain) in a file of its own or beside its kin, using only
 *      this header, policies/, pacing/, store/ and obs/.
 *   2. Export its row (`const struct ex_stage stage_NAME`) in stages.h.
 *   3. Put the row in the plans it belongs to in plan.c, where the order
 *      of the rows is written down, and nowhere else.
 *   4. Drive it in a unit test (tests/unit/proxy/exchange/) with a fake
 *      exchange and a fake clock, as the others are. */
#ifndef SLUICE_PROXY_EXCHANGE_STAGE_H
#define SLUICE_PROXY_EXCHANGE_STAGE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>

#include "config/config.h"
#include "obs/metrics.h"
#include "obs/statsd.h"
#include "pacing/claims.h"
#include "pacing/key_waiters.h"
#include "proxy/exchange/env.h"
#include "pacing/pacing.h"
#include "policies/instruction.h"
#include "policies/outcome.h"
#include "proxy/upstream/upstream.h"
#include "store/store.h"
#include "util/freelist.h"

struct evbuffer;
struct event;
struct event_base;
struct exchange;

/* What a stage decides. */
enum ex_verdict {
    EXV_NEXT = 0,   /* done here: the next row */
    EXV_WAIT,       /* until ex->wake_at (when not 0) or an event */
    EXV_ANSWER,     /* the answer is decided (kind, status, outcome...) */
};

/* Why a stage runs: the driver says. */
enum ex_woke { WOKE_FIRST = 0, WOKE_TIMER, WOKE_EVENT };

/* When the driver gives back what a row holds: the answer is decided (a
 * body may still stream: what its flight needs is kept), the streamed body
 * has ended (the flight is over), the streamed body is cut short (the
 * drain deadline: the flight ends now, unfinished), or the request is
 * gone. Each release may run for several of these, in this order, and
 * gives back what it may then. */
enum ex_release { REL_ANSWER = 0, REL_FLIGHT, REL_CUT, REL_END };

/* Row flags, read by the driver. */
#define STAGE_WATCH 0x1u    /* nothing is sent yet: while the row waits, the
                               worker's socket is watched, and a worker who
                               leaves ends the request (499) */
#define STAGE_SETTLES 0x2u  /* writes down the request's outcome: the drain
                               deadline goes on to it after deciding the
                               answer of a row that waited */

/* One row of a plan. */
struct ex_stage {
    const char *name;
    enum ex_verdict (*run)(struct exchange *ex, uint64_t now);
    /* Gives back what run took, as `how` allows; NULL: takes nothing. */
    void (*release)(struct exchange *ex, enum ex_release how);
    /* The drain deadline met the request waiting in this row: decide its
     * answer. NULL: the row is run as if its deadline had come. */
    void (*drain)(struct exchange *ex, uint64_t now);
    unsigned flags;
};

#define EX_PLAN_MAX 14

struct ex_plan {
    const struct ex_stage *row[EX_PLAN_MAX];
    uint8_t n;
};

/* Shadow mode: what enforcing would have done to a request sent at once. */
enum shadow_verdict {
    SHADOW_NONE = 0,
    SHADOW_PERMIT_WAIT,     /* it would have waited for its permit */
    SHADOW_RATE_LIMITED,    /* it would have been refused: rate_limited */
    SHADOW_CONCURRENCY,     /* it would have waited for a slot */
};
/* "permit_wait", "rate_limited", "concurrency", or NULL for none. */
const char *shadow_name(enum shadow_verdict v);

/* The longest X-Request-Id taken from a worker; a longer or odd one is
 * replaced by one sluice makes (32 hex digits). */
#define EX_REQUEST_ID_MAX 128
#define EX_REQUEST_ID_HEADER "X-Request-Id"

/* A body up to this size goes out whole, from memory, with its head. */
#define EX_WHOLE_MAX_BYTES ((size_t)64 * 1024)

/* What the answer is made of. */
enum ex_kind { ANSWER_PROBLEM = 0, ANSWER_UPSTREAM, ANSWER_INSTRUCTION, ANSWER_REPLAY };

/* Where the request is: read by libmicrohttpd's calls (mhd.c), moved by
 * the driver while the plan runs. */
enum ex_phase {
    PH_HEADERS = 0, /* first call: headers are in, body not yet */
    PH_BODY,        /* collecting the body */
    PH_REFUSED,     /* answer decided, body discarded */
    PH_PLAN,        /* the plan runs (ex->at is the row) */
    PH_READY,       /* the answer is decided, to be queued */
    PH_ANSWERED,    /* queued (a streamed body may still flow) */
};

/* Who carries the request for the driver: the worker's connection
 * (mhd.c), or a request sluice makes itself. */
typedef void (*ex_header_fn)(void *arg, const char *name, const char *value);
struct ex_owner {
    void (*suspend)(struct exchange *ex);   /* the request waits */
    void (*resume)(struct exchange *ex);    /* its answer is ready */
    int (*client_fd)(struct exchange *ex);  /* to watch while it waits; -1 */
    /* The request's header fields, in order, to forward (none for a
     * request sluice makes itself). */
    void (*headers)(struct exchange *ex, ex_header_fn fn, void *arg);
};

struct exchange {
    const struct ex_env *env;
    const struct ex_owner *owner;
    void *owner_arg;            /* the owner's own (mhd.c: the loop) */
    struct MHD_Connection *mc;  /* NULL for a request sluice makes */
    const struct ex_plan *plan;
    enum ex_phase phase;        /* while PH_PLAN, written by the driver */
    uint8_t at;                 /* the current row */
    uint8_t reached;            /* rows entered: released backwards */
    enum ex_woke woke;          /* why the current row runs */
    uint64_t wake_at;           /* EXV_WAIT: monotonic ns to be woken at, 0 none */
    bool suspended;

    /* the request, as read on arrival (stages see plain fields) */
    struct runtime *rt;         /* the config this request started on (a ref) */
    const struct sc_config *cfg;
    const struct metrics_ids *ids; /* the runtime's metric ids */
    char *target;               /* raw origin-form target, query included */
    const char *method;         /* valid until completion */
    const struct sc_route *route;
    const struct sc_upstream *up;
    const struct sc_policy *pol;
    struct policy_state *ps;    /* the policy's pacing state */
    const char *label;          /* for logs: the route's name */
    size_t upstream_idx;        /* ex->up's index in the config */
    uint64_t max_wait_ns;       /* the longest its permit and slot may take */
    uint64_t timeout_ms;        /* its upstream timeout (the route's, else
                                   the upstream's) */
    const char *upstream_target; /* the target to send as is, or NULL: the
                                   route's mapping of ex->target */
    struct up_pool *pool;       /* this loop's pool for the upstream */
    const struct up_proxy *http_proxy; /* an http upstream's egress proxy */
    struct evbuffer *body;
    uint32_t attempt;           /* this request's attempt number, 1-based */
    const char *key;            /* idempotency key (parsed) or header value or NULL */
    const char *partition;      /* the policy's partition header value, or NULL */
    const char *lane_value;     /* the policy's lane_header value, or NULL */
    const char *worker_id;      /* the worker's X-Request-Id, or NULL */
    char request_id[EX_REQUEST_ID_MAX + 1]; /* "" until ex_request_id */

    /* idempotency */
    bool idem;                  /* the key is valid: the request is keyed */
    bool claimed;               /* holds the in-memory claim */
    bool leased;                /* holds the durable lease */
    uint64_t lease;             /* its fence (store_acquire_out.lease) */
    uint64_t lease_expires_ms;  /* ... and its end (wall ms) */
    bool lease_with_permit;     /* the lease came with the fleet's permit:
                                   unsent, it is given back uncounted */
    char key_buf[256];
    uint8_t fp[STORE_FP_LEN];
    struct store_record replay; /* ANSWER_REPLAY */
    struct store_call *scall;   /* the store call a stage waits for: made
                                   at the first (unkeyed, unshared requests
                                   never pay for its size) */
    uint64_t store_deadline;    /* monotonic ns: the call counts as failed */
    uint64_t store_started;     /* monotonic ns: when the call began */
    enum ex_commit { COMMIT_NONE = 0, COMMIT_KEEP, COMMIT_COMPLETE,
                     COMMIT_COMPLETE_HEAD, COMMIT_RELEASE } commit;
    bool settled;               /* the key's record is written (complete/release) */
    bool dup_waiting;           /* duplicates: wait: to look at the key again */
    uint64_t dup_poll_ns;       /* ... after this long (2 ms doubling to 25) */
    /* ... or, fleet mode with the store's notices up, when the holder's
     * lease ends (and every 25 ms as the fallback): */
    struct key_waiter dup_kw;   /* in env->dup_waiters while it waits */
    struct event *dup_ev;       /* the notice, on this loop */
    bool dup_noticed;           /* a notice came since the last look began */
    bool dup_watch;             /* the next look is a watch: marks the lease */
    bool dup_looking;           /* permit_lease: that watch is in flight */
    bool dup_marked;            /* a watch marked the lease of dup_fence */
    uint64_t dup_fence;
    /* A held lease read by a plain get, naming another holder: its
     * liveness key looked at (ex_not_free), once per lease and then at
     * most once a second while a duplicate waits. */
    bool holder_looking;        /* that read is in flight */
    uint64_t holder_fence;      /* the lease last looked at */
    uint64_t holder_looked_ns;  /* ... when (monotonic) */

    /* pacing */
    struct bucket *bucket;
    struct event *timer;        /* the driver's one timer */
    struct slot_waiter slot;
    struct event *slot_ev;      /* the slot's grant, on this loop */
    bool has_slot;
    bool slot_waiting;          /* queued for a slot (slot.queued is the lock's) */
    bool got_slot;              /* permit and slot were had (permit_wait_ns is set) */
    uint64_t wait_start_ns, wait_deadline_ns, permit_wait_ns;
    uint64_t permit_at;         /* reserved start (monotonic ns) */
    uint64_t due_at;            /* a followed quota's fleet permit: ask the
                                   fleet's bucket again then (0: not so) */
    char flight[40];            /* its name in the fleet's set of the
                                   bucket's requests in flight ... */
    bool flight_listed;         /* ... where its granted permit put it */
    bool asking;                /* a shared bucket or slot call is in flight */
    bool shared_permit;         /* the fleet's bucket granted the permit */
    bool shared_slot;           /* holds a fleet-wide slot */
    bool slot_polling;          /* waits to ask the fleet for a slot again */
    char holder[40];            /* this request's name as a fleet slot holder */
    bool turn_waiting;          /* with lanes: queued for the turn to ask
                                   the fleet for a slot (slot.queued is the
                                   lock's) */
    bool has_turn;              /* ... and has it: asks, or polls */
    enum shadow_verdict shadow; /* mode: shadow: what enforce would have done */
    bool has_lane;              /* a policy with lanes: `lane` is chosen */
    uint32_t lane;              /* its index in pol->lanes */
    struct permit_waiter pwait; /* waits in its lane for a granted permit */
    struct event *permit_ev;    /* the grant (or the keeper's role), on this loop */
    bool permit_waiting;        /* pwait is queued (or granted unseen) */
    bool pm_flight;             /* granted by bucket->pm, not answered yet */
    bool pm_held;               /* and waiting for the fleet's start
                                   (permits_hold) */

    /* the upstream */
    struct up_request ureq;
    struct outcome_verdict ov;  /* what the upstream's answer means */
    struct outcome_input oin;   /* what it was decided from */
    bool classified;            /* ov is decided (the head, or a failure) */
    bool sent;                  /* handed to the upstream pool */
    bool up_done;               /* ureq's done ran: resp.result is final */
    bool streaming;             /* the body is passed on as it arrives */

    /* the answer */
    enum ex_kind kind;
    int status;
    enum outcome outcome;
    enum reason reason;
    char detail[192];
    struct instruction instr;
    bool rate_headers;          /* add RateLimit-Policy / RateLimit */

    /* the worker's side (mhd.c, stream.c) */
    bool reader_waiting;        /* suspended by the body reader for more bytes */
    struct event *client_ev;    /* the worker's socket, watched while we wait */
    uint64_t t0_ns;
    uint64_t t0_wall_ms;
    uint64_t bytes_in;          /* request body bytes read from the worker */
    uint64_t bytes_out;         /* response body bytes handed to MHD */
    TAILQ_ENTRY(exchange) link;
    /* a chunked body's framing, followed in MHD's read buffer (mhd.c) */
    bool chunked;
    const char *raw_body;       /* where that buffer starts: the head's end */
    const char *raw_next;       /* the end of the last piece of data MHD gave */
    uint64_t raw_run;           /* the MHD run that gave it */
};

/* ---- the driver's services to stages -------------------------------------- */

/* The wall clock, Unix ms. */
static inline uint64_t ex_wall_ms(const struct exchange *ex)
{
    return ex->env->clock->wall_ms(ex->env->clock->arg);
}

/* An event a stage registers wakes the request (arg: the exchange). */
void ex_event_cb(int fd, short what, void *arg);
/* Something the current wait may be for happened (a slot granted, the
 * upstream's head, body or end): the row runs again, or, once the answer
 * is out, the stream moves on. */
void ex_wake(struct exchange *ex);

/* verdict.c: the answers. */
/* The request's X-Request-Id: the worker's when it sent a usable one, else
 * 128 random bits in hex, made once. */
const char *ex_request_id(struct exchange *ex);
void ex_refuse(struct exchange *ex, int status, enum outcome o, enum reason r,
               const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* An instruction answer: requeue (delay_ms) or dead_letter. */
void ex_instruct(struct exchange *ex, enum outcome o, enum reason r,
                 uint64_t delay_ms, uint32_t attempt, int upstream_status);
/* Attempts made so far by a request that reached no upstream. */
uint32_t ex_attempts_so_far(const struct exchange *ex);
/* Told to come back after delay_ms (rate_limited, upstream_cooldown): a
 * wait beyond max_delay is dead_letter / delay_exceeds_max. */
enum ex_verdict ex_refuse_wait(struct exchange *ex, enum reason r, uint64_t delay_ms);
/* The key's record answers the request (a live lease, another request's
 * key, the store failing). */
void ex_lease_held(struct exchange *ex, uint64_t remaining_ms);
/* lease_held for the live lease in rec at now_ms (wall): while its
 * verification is pending, what remains of it as the delay, and
 * "verify": "pending" (contract §11); else the lease's remaining time.
 * holder_gone: its holder (or verifier) has no liveness key, and its
 * verification starts here when the policy verifies. */
void ex_lease_held_record(struct exchange *ex, const struct store_record *rec,
                          uint64_t now_ms, bool holder_gone);
void ex_key_reused(struct exchange *ex);
void ex_store_failed(struct exchange *ex, const char *what, const struct sc_error *err);
/* A store claim's verdict (acquire, permit_lease) applied: true when the
 * lease is now the request's (ex->leased); false when the record answers
 * (a replay, lease_held, 422, store_unavailable). */
bool ex_take_lease(struct exchange *ex);
/* The answer the upstream's classified result gives (ex->ov). */
void ex_answer_outcome(struct exchange *ex);
/* How long a worker refused a slot (or a partition) waits: the holders
 * have no known end, so about one upstream round trip. */
#define EX_SLOT_RETRY_MS 1000
/* The drain deadline met a request that sent nothing: it can simply come
 * back when sluice does (requeue / rate_limited, what was left of its
 * wait, a second at least). */
void ex_drain_unsent(struct exchange *ex, uint64_t now);
/* RateLimit-Policy / RateLimit header values for the exchange's bucket. */
void ex_rate_headers(const struct exchange *ex, char *policy, size_t plen,
                     char *state, size_t slen);

/* store_call.c: a store call a stage waits for, one at a time, in
 * ex->scall. Started by start when `first` (usually the row's first run);
 * EXV_NEXT once its result is there (a timeout is -ETIMEDOUT), else
 * EXV_WAIT for its completion. */
enum ex_verdict ex_store_wait(struct exchange *ex, uint64_t now,
                              int (*start)(struct exchange *ex), bool first,
                              enum store_timed_op op);
/* Releases the call still in flight (its answer is dropped). */
void ex_store_cancel(struct exchange *ex);
/* A write nobody waits for: started into c (rc is what the call returned),
 * left to complete on its own. */
void ex_store_detach(struct store_call *c, int rc);
/* Gives back a lease the commit never wrote off, without waiting: nothing
 * sent frees the key (a lease taken with the fleet's permit gives its
 * attempt back too); something sent keeps it until it expires. */
void ex_lease_give_back(struct exchange *ex);
/* What a release of the key's lease answered, logged (and a failure
 * counted): -ESTALE, another lease holds the key now; -ENOENT, nothing to
 * end. */
void ex_log_release(struct exchange *ex, int rc, const struct sc_error *err);
/* stage_idem.c: the end-to-end headers of r as a record keeps them, the
 * request's own X-Request-Id in place of any the upstream sent; h has room
 * for r->n_headers + 1. Borrowed from r and ex. */
size_t ex_stored_headers(struct exchange *ex, const struct up_response *r,
                         struct store_header *h);
/* verdict.c: a store failure counted (sluice_store_errors_total). */
void ex_count_store_error(struct exchange *ex);

#endif
