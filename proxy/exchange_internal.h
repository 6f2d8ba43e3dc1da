/* The exchange's insides, shared by its files:
 *   exchange.c           MHD entry points, request checks, answers, logging
 *   exchange_driver.c    the driver: the only writer of the state; it runs
 *                        the stages, owns the timer, suspend/resume, the
 *                        watch on the worker's socket and the release path
 *   exchange_idem.c      stages: key on arrival, lease, commit
 *   exchange_pace.c      stages: permit, slot, send check
 *   exchange_store.c     store calls a stage waits for
 *   exchange_upstream.c  stage: upstream (the request as sent, what its
 *                        answer means)
 *   exchange_stream.c    the upstream's body on its way to the worker
 * A stage decides and returns a verdict (go on, wait, answer); it never
 * calls another stage, never resumes the connection, never frees. */
#ifndef SLUICE_PROXY_EXCHANGE_INTERNAL_H
#define SLUICE_PROXY_EXCHANGE_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>

#include <event2/util.h>

#include <microhttpd.h>

#include "config/config.h"
#include "policies/http_head.h"
#include "policies/instruction.h"
#include "proxy/pacing.h"
#include "policies/problem.h"
#include "proxy/upstream.h"
#include "obs/metrics.h"
#include "store/store.h"

struct loop;
struct evbuffer;
struct event;

enum ex_state {
    EX_HEADERS = 0, /* first call: headers are in, body not yet */
    EX_BODY,        /* collecting the body */
    EX_REFUSED,     /* answer decided, body discarded */
    /* the driver's stages, in order; the connection is suspended while
     * one waits */
    EX_KEY,         /* idempotency on arrival: the key and its fingerprint */
    EX_LOOKUP,      /* the store read: replay, 422, lease_held; then a claim */
    EX_PERMIT,      /* the bucket's permit */
    EX_SLOT,        /* a concurrency slot */
    EX_SEND_CHECK,  /* the send-side bucket, at the moment of sending */
    EX_LEASE,       /* the durable lease */
    EX_UPSTREAM,    /* the upstream request, until its answer is known */
    EX_COMMIT,      /* the key's record written before the worker sees it */
    EX_READY,       /* resumed with an answer to queue */
    EX_ANSWERED,    /* queued (a streamed body may still flow) */
};

/* What a stage decides. */
enum ex_verdict {
    EXV_NEXT = 0,   /* done here: the next stage */
    EXV_WAIT,       /* until ex->wake_at (when not 0) or an event */
    EXV_ANSWER,     /* the answer is decided (kind, status, outcome...) */
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

/* Why a stage runs: the driver says. */
enum ex_woke { WOKE_FIRST = 0, WOKE_TIMER, WOKE_EVENT };

/* What the answer is made of. */
enum ex_kind { ANSWER_PROBLEM = 0, ANSWER_UPSTREAM, ANSWER_INSTRUCTION, ANSWER_REPLAY };

struct exchange {
    struct loop *loop;       /* the event loop the request lives on */
    struct MHD_Connection *mc;
    struct runtime *rt;     /* the config this request started on (a ref) */
    const struct sc_config *cfg;
    enum ex_state state;    /* written by exchange_driver.c only */
    enum ex_woke woke;      /* why the current stage runs */
    uint64_t wake_at;       /* EXV_WAIT: monotonic ns to be woken at, 0 none */
    bool suspended;
    char *target;           /* raw origin-form target, query included */
    const char *method;     /* MHD's, valid until completion */
    const struct sc_route *route;
    const struct sc_upstream *up;
    const struct sc_policy *pol;
    struct evbuffer *body;
    uint32_t attempt;       /* this request's attempt number, 1-based */
    const char *key;        /* idempotency key (parsed) or header value or NULL */
    const char *partition;  /* the policy's partition header value, or NULL */
    char request_id[EX_REQUEST_ID_MAX + 1]; /* "" until ex_request_id */

    /* idempotency */
    bool idem;              /* the policy's idempotency applies, key valid */
    bool claimed;           /* holds the in-memory claim */
    bool leased;            /* holds the durable lease */
    uint64_t lease;         /* its fence (store_acquire_out.lease) */
    bool lease_with_permit; /* the lease came with the fleet's permit
                               (pace_fuses_lease): unsent, it is given back
                               uncounted */
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

    /* pacing */
    struct policy_state *ps;
    struct bucket *bucket;
    struct event *timer;    /* the driver's one timer */
    struct slot_waiter slot;
    bool has_slot;
    bool slot_waiting;      /* queued for a slot (slot.queued is the lock's) */
    bool got_slot;          /* permit and slot were had (permit_wait_ns is set) */
    uint64_t wait_start_ns, wait_deadline_ns, permit_wait_ns;
    uint64_t permit_at;     /* reserved start (monotonic ns) */
    bool asking;            /* a shared bucket or slot call is in flight */
    bool shared_permit;     /* the fleet's bucket granted the permit */
    bool shared_slot;       /* holds a fleet-wide slot */
    bool slot_polling;      /* waits to ask the fleet for a slot again */
    char holder[40];        /* this request's name as a fleet slot holder */
    enum shadow_verdict shadow; /* mode: shadow: what enforce would have done */

    /* the answer */
    enum ex_kind kind;
    int status;
    enum outcome outcome;
    enum reason reason;
    char detail[192];
    struct instruction instr;
    bool rate_headers;      /* add RateLimit-Policy / RateLimit */
    struct up_request ureq;
    bool classified;        /* the upstream's head decided the answer */
    bool settled;           /* the key's record is written (complete/release) */
    bool streaming;         /* the body is passed on as it arrives */
    bool up_done;           /* ureq's done ran: resp.result is final */
    bool sent;              /* handed to the upstream pool */
    bool reader_waiting;    /* suspended by the body reader for more bytes */
    struct event *client_ev; /* the worker's socket, watched while we wait */
    uint64_t t0_ns;
    uint64_t t0_wall_ms;
    uint64_t bytes_in;      /* request body bytes read from the worker */
    uint64_t bytes_out;     /* response body bytes handed to MHD */
    TAILQ_ENTRY(exchange) link;

    /* a chunked body's framing, followed in MHD's read buffer (exchange.c) */
    bool chunked;
    const char *raw_body;   /* where that buffer starts: the head's end */
    const char *raw_next;   /* the end of the last piece of data MHD gave */
    uint64_t raw_run;       /* the MHD run that gave it */
};

/* exchange.c */
/* The request's X-Request-Id: the worker's when it sent a usable one,
 * else 128 random bits in hex, made once. */
const char *ex_request_id(struct exchange *ex);
void ex_refuse(struct exchange *ex, int status, enum outcome o, enum reason r,
               const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* An instruction answer: requeue (delay_ms) or dead_letter. */
void ex_instruct(struct exchange *ex, enum outcome o, enum reason r,
                 uint64_t delay_ms, uint32_t attempt, int upstream_status);
/* sluice_upstream_responses_total and the upstream timing, counted as soon
 * as the upstream's result is known (a scrape right after sees it). */
void ex_record_upstream(const struct exchange *ex);

/* exchange_driver.c */
/* The body is in: the stages run, the connection suspended at the first
 * wait. Returns with ex->state EX_READY and not suspended when the answer
 * was decided without waiting: the caller queues it at once. */
void ex_start(struct exchange *ex);
/* An event the current wait may be for (a slot granted, the upstream's
 * head, body or end): the stage runs again, or, once the answer is out,
 * the stream moves on. */
void ex_wake(struct exchange *ex);
/* libevent callback for events a stage registers (arg: the exchange). */
void ex_event_cb(evutil_socket_t fd, short what, void *arg);
/* MHD phases: the body comes, or a refusal waits for it to end; the
 * response is queued. */
void ex_set_body(struct exchange *ex);
void ex_set_refused(struct exchange *ex);
void ex_set_answered(struct exchange *ex);
/* The body reader has nothing to give: the connection sleeps until the
 * upstream brings more (ex_wake). */
void ex_reader_wait(struct exchange *ex);
/* Everything the exchange still holds, given back (MHD completed it). */
void ex_release_all(struct exchange *ex);

/* exchange_idem.c */
enum ex_verdict stage_key(struct exchange *ex, uint64_t now);
enum ex_verdict stage_lookup(struct exchange *ex, uint64_t now);
enum ex_verdict stage_lease(struct exchange *ex, uint64_t now);
enum ex_verdict stage_commit(struct exchange *ex, uint64_t now);
/* True when the upstream's answer is to be stored for replay. */
bool ex_idem_replayable(const struct exchange *ex);
/* The fleet's answer to a permit asked together with the lease
 * (pace_fuses_lease), in ex->scall: true when the lease is now ours, or
 * when the key is free and only the permit was refused (pacing answers
 * then); false when the key's record answers the request (a replay,
 * lease_held, 422) or the store failed (store_unavailable). */
bool idem_lease_with_permit(struct exchange *ex);
/* Releases: the in-memory claim; a lease never written off by the commit
 * (nothing was sent: released; sent: kept until it expires). */
void idem_unclaim(struct exchange *ex);
void idem_release_lease(struct exchange *ex);

/* exchange_pace.c */
enum ex_verdict stage_permit(struct exchange *ex, uint64_t now);
enum ex_verdict stage_slot(struct exchange *ex, uint64_t now);
enum ex_verdict stage_send_check(struct exchange *ex, uint64_t now);
/* Whether the policy paces through the fleet's bucket (shared: redis on a
 * store that can), and the partition value naming the request's bucket
 * there (NULL: the policy's own). */
bool pace_shared(const struct exchange *ex);
const char *pace_partition(const struct exchange *ex);
/* Whether a keyed request's lookup, permit and lease are one store call
 * (the fleet's bucket with idempotency, contract §10): the lookup stage
 * then leaves its work to the permit stage, and the lease stage has none.
 * Finds ex->ps when not yet set (the lookup stage asks first). */
bool pace_fuses_lease(struct exchange *ex);
/* The drain deadline met a request waiting in a pacing stage: requeue. */
void pace_drain_answer(struct exchange *ex, uint64_t now);
/* Gives back the slot: a wait cancelled, or a held slot released. */
void pace_release_slot(struct exchange *ex);
/* Gives back the bucket (a partition is held until the exchange's end: a
 * 429 met late still pauses it, and the answer's RateLimit reads it). */
void pace_release_bucket(struct exchange *ex);
/* RateLimit-Policy / RateLimit header values for the exchange's policy. */
void ex_rate_headers(const struct exchange *ex, char *policy, size_t plen,
                     char *state, size_t slen);

/* exchange_store.c */
/* Runs a stage's store call in ex->scall: started by start when first
 * (usually the stage's first run); EXV_NEXT once its result is there (a
 * timeout is -ETIMEDOUT), else EXV_WAIT for its completion. */
enum ex_verdict ex_store_wait(struct exchange *ex, uint64_t now,
                              int (*start)(struct exchange *ex), bool first,
                              enum store_timed_op op);
/* Releases the call still in flight (its answer is dropped). */
void ex_store_cancel(struct exchange *ex);
/* A write nobody waits for: started into c (rc is what the call returned),
 * left to complete on its own. */
void ex_store_detach(struct store_call *c, int rc);

/* exchange_upstream.c */
enum ex_verdict stage_upstream(struct exchange *ex, uint64_t now);
/* The drain deadline met a sent request: dropped, requeue (lease kept). */
void upstream_drain_answer(struct exchange *ex);

/* exchange_stream.c */
/* The worker's response for ANSWER_UPSTREAM: from memory when the body is
 * all here, else read from the upstream as it arrives. NULL on failure. */
struct MHD_Response *ex_stream_response(struct exchange *ex);
/* An answer of this status to this request has no body: HEAD, 1xx, 204, 304. */
bool ex_answer_bodiless(const struct exchange *ex, int status);
/* The response for such an answer: the given Content-Length (the one the
 * upstream sent), or no framing header at all and the connection closed
 * after it (a 204 has none and keeps it); never chunked. reader is never
 * called. */
struct MHD_Response *ex_bodiless_response(int status, bool has_length, uint64_t length,
                                          MHD_ContentReaderCallback reader, void *cls);

#endif
