/* The exchange's insides, shared by its files:
 *   exchange.c           MHD entry points, request checks, answers, logging
 *   exchange_pace.c      waiting for a permit and a concurrency slot
 *   exchange_upstream.c  the upstream request and what its result means
 *   exchange_stream.c    the upstream's body on its way to the worker
 * The stages run in order; each either finishes the exchange (ex_finish) or
 * arms a timer / callback and returns. */
#ifndef SLUICE_PROXY_EXCHANGE_INTERNAL_H
#define SLUICE_PROXY_EXCHANGE_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>

#include <microhttpd.h>

#include "policies/config.h"
#include "proxy/instruction.h"
#include "proxy/pacing.h"
#include "proxy/problem.h"
#include "proxy/upstream.h"
#include "store/store.h"

struct worker;
struct evbuffer;
struct event;

enum ex_state {
    EX_HEADERS = 0, /* first call: headers are in, body not yet */
    EX_BODY,        /* collecting the body */
    EX_REFUSED,     /* answer decided, body discarded */
    EX_PERMIT,      /* suspended: waiting for the bucket's permit */
    EX_SLOT,        /* suspended: waiting for a concurrency slot */
    EX_UPSTREAM,    /* suspended: waiting on the upstream */
    EX_READY,       /* resumed with an answer to queue */
    EX_ANSWERED,
};

/* What the answer is made of. */
enum ex_kind { ANSWER_PROBLEM = 0, ANSWER_UPSTREAM, ANSWER_INSTRUCTION, ANSWER_REPLAY };

struct exchange {
    struct worker *w;
    struct MHD_Connection *mc;
    struct runtime *rt;     /* the config this request started on (a ref) */
    const struct sc_config *cfg;
    enum ex_state state;
    bool suspended;
    char *target;           /* raw origin-form target, query included */
    const char *method;     /* MHD's, valid until completion */
    const struct sc_route *route;
    const struct sc_upstream *up;
    const struct sc_policy *pol;
    struct evbuffer *body;
    uint32_t attempt;       /* this request's attempt number, 1-based */
    const char *key;        /* idempotency key (parsed) or header value or NULL */

    /* idempotency */
    bool idem;              /* the policy's idempotency applies, key valid */
    bool claimed;           /* holds the in-memory claim */
    bool leased;            /* holds the durable lease */
    char key_buf[256];
    uint8_t fp[STORE_FP_LEN];
    struct store_record replay; /* ANSWER_REPLAY */

    /* pacing */
    struct policy_state *ps;
    struct bucket *bucket;
    struct event *timer;
    struct slot_waiter slot;
    bool has_slot;
    uint64_t wait_start_ns, wait_deadline_ns, permit_wait_ns;
    uint64_t permit_at;     /* reserved start (monotonic ns) */
    const char *shadow;     /* what enforce would have done, or NULL */

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
    bool reader_waiting;    /* suspended by the body reader for more bytes */
    struct event *client_ev; /* the worker's socket, watched while we wait */
    uint64_t t0_ns;
    uint64_t t0_wall_ms;
    TAILQ_ENTRY(exchange) link;
};

/* exchange.c */
void ex_refuse(struct exchange *ex, int status, enum outcome o, enum reason r,
               const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* An instruction answer: requeue (delay_ms) or dead_letter. */
void ex_instruct(struct exchange *ex, enum outcome o, enum reason r,
                 uint64_t delay_ms, uint32_t attempt, int upstream_status);
/* Resumes the suspended exchange so MHD calls back and the answer goes out. */
void ex_finish(struct exchange *ex);
/* Resumes a suspended connection without changing what it is doing. */
void ex_resume(struct exchange *ex);
/* Suspends the connection until ex_resume / ex_finish. */
void ex_suspend(struct exchange *ex);
/* While the request waits inside sluice (permit, slot, send check), its
 * connection is watched: a worker that closes it abandons the request,
 * which is then never sent. */
void ex_watch_client(struct exchange *ex);
void ex_unwatch_client(struct exchange *ex);
/* sluice_upstream_responses_total and the upstream timing, counted as soon
 * as the upstream's result is known (a scrape right after sees it). */
void ex_record_upstream(const struct exchange *ex);

/* exchange_pace.c */
void ex_pace(struct exchange *ex);          /* bucket, then slot, then upstream */
void ex_pace_release(struct exchange *ex);  /* frees the slot, stops the timer */
/* False when the send-side bucket says "not yet": a timer calls
 * ex_send_upstream again when it will. */
bool ex_pace_may_send(struct exchange *ex);
void ex_pace_abort(struct exchange *ex);    /* drain deadline while waiting */
/* The worker left while the request waited: the wait ends, the slot (if
 * any) goes back, nothing is sent. */
void ex_pace_cancel(struct exchange *ex);
/* RateLimit-Policy / RateLimit header values for the exchange's policy. */
void ex_rate_headers(const struct exchange *ex, char *policy, size_t plen,
                     char *state, size_t slen);

/* exchange_idem.c */
void ex_idem(struct exchange *ex);          /* then ex_pace */
bool ex_idem_lease(struct exchange *ex);    /* false: answered instead */
void ex_idem_result(struct exchange *ex);   /* complete, release or keep */
/* True when the upstream's answer is to be stored for replay. */
bool ex_idem_replayable(const struct exchange *ex);
/* Completes the record with status and headers only (a body over
 * max_stored_body), before the worker sees any of it. */
void ex_idem_complete_head(struct exchange *ex);
void ex_idem_done(struct exchange *ex);     /* drops the claim */
/* Drops the in-memory claim once the answer is decided, before the worker
 * sees it: a worker that retries at once must not meet its own claim. */
void ex_idem_unclaim(struct exchange *ex);

/* exchange_upstream.c */
void ex_send_upstream(struct exchange *ex);
/* The upstream result after a drain abort of a sent request. */
void ex_upstream_abort(struct exchange *ex);

/* exchange_stream.c */
/* The worker's response for ANSWER_UPSTREAM: from memory when the body is
 * all here, else read from the upstream as it arrives. NULL on failure. */
struct MHD_Response *ex_stream_response(struct exchange *ex);
/* The upstream brought more (or ended): wake a reader that waits. */
void ex_stream_wake(struct exchange *ex);
/* Drain deadline: the upstream is dropped, the worker's response ends. */
void ex_stream_abort(struct exchange *ex);

#endif
