/* Settling unknown outcomes (docs/contract.md §11): the rules that need no
 * I/O. After a timeout or a lost connection nobody knows whether the partner
 * performed the operation behind a key; with idempotency.verify sluice asks
 * it, by a lookup of the operation by the key, and settles the key's lease by
 * the answer instead of waiting out its expiry.
 *
 * This module says when a verification starts, what its lookups are (the
 * target, when each goes, by when each must end), what each answer means, how
 * a verification ends, whether its result may still be applied, and what
 * workers are told meanwhile. The request path sends the lookups and answers
 * the workers; the store keeps each lease's mark (enum verify_state) and
 * claims a verification atomically. Pure: every time is an argument. */
#ifndef SLUICE_POLICIES_VERIFY_H
#define SLUICE_POLICIES_VERIFY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"
#include "policies/outcome.h"

/* Where the verification of a key's current lease stands: the mark a lease
 * record carries, and the "verify" field of GET /idempotency/{policy}/{key}. */
enum verify_state {
    VERIFY_NONE = 0,    /* never started for this lease: no "verify" field */
    VERIFY_PENDING,     /* lookups under way; the lease is kept */
    VERIFY_FOUND,       /* it happened: the record completed from a lookup */
    VERIFY_ABSENT,      /* it did not: the lease was released */
    VERIFY_FAILED,      /* no answer in `attempts` lookups: the lease waits
                           out its expiry and is never verified again */
};

/* "pending", "found", "absent", "failed"; NULL for VERIFY_NONE (and for a
 * value out of range). */
const char *verify_state_name(enum verify_state s);

/* ---- the lease a verification is for ---------------------------------- */

/* A holder id: 128 random bits as lowercase hex, one per sluice process. */
#define VERIFY_HOLDER_LEN 32

/* Writes the id of 16 random bytes into out (NUL-terminated). */
void verify_holder_format(const uint8_t rnd[16],
                          char out[VERIFY_HOLDER_LEN + 1]);

/* What identifies one lease of a key: a later acquire (a takeover after
 * expiry, or a new first request after DELETE) makes another. */
struct verify_lease {
    char holder[VERIFY_HOLDER_LEN + 1]; /* the process that took it */
    uint32_t attempt;                   /* the attempt it was taken for */
    uint64_t expires_ms;                /* its expiry, wall clock; a
                                           verification never extends it */
};

/* True when a verification's result may be applied: `current` is the key's
 * lease as the store holds it now (NULL when the record is absent, completed
 * or released), the very lease `started` names, and not expired at now_ms
 * (wall clock). Otherwise the result is dropped, and not counted. */
bool verify_applies(const struct verify_lease *started,
                    const struct verify_lease *current, uint64_t now_ms);

/* ---- when a verification starts --------------------------------------- */

/* (a) The request holding the key's lease ended in an unknown outcome:
 * true when its policy verifies and the outcome is a timeout or a lost
 * connection (whether or not retry.on lists it). */
bool verify_on_outcome(const struct sc_idempotency *idem,
                       enum outcome_transport t, bool holds_lease);

/* (b) An unexpired lease that a request meets, or that the store holds when
 * sluice starts (RocksDB: every holder has ended then). Times are the
 * record's, wall clock. */
struct verify_lease_view {
    bool verify_enabled;      /* its policy has verify in the running config */
    bool upstream_known;      /* the upstream it was forwarded to is configured */
    bool holder_alive;        /* fleet: the holder's liveness key exists;
                                 RocksDB at start-up: false */
    enum verify_state state;  /* the lease's mark */
    bool verifier_alive;      /* PENDING: the verifier's liveness key exists */
    uint64_t deadline_ms;     /* PENDING: when it ends at the latest */
    uint64_t expires_ms;      /* the lease's expiry */
};

enum verify_action {
    VA_HELD = 0,    /* as without verify: lease_held, the lease's remaining
                       time as the delay, no "verify" field */
    VA_PENDING,     /* a verification runs: lease_held, what remains of its D
                       as the delay, "verify": "pending" */
    VA_START,       /* start one here (claimed atomically in the record),
                       then answer as VA_PENDING with its D */
};

/* What the lease calls for at now_ms; *delay_ms (may be NULL) gets the
 * delay of VA_HELD and VA_PENDING (at least 1 ms), 0 for VA_START. A failed
 * verification is never started again, nor one whose upstream is gone; a
 * pending one past its deadline is taken for ended (VA_HELD). */
enum verify_action verify_on_lease(const struct verify_lease_view *l,
                                   uint64_t now_ms, uint64_t *delay_ms);

/* Fleet mode's liveness keys: refreshed this often, gone this long after
 * the last refresh. */
#define VERIFY_LIVE_REFRESH_MS 1000
#define VERIFY_LIVE_TTL_MS 3000

/* True when a sidecar whose liveness key was last refreshed at
 * last_refresh_ms is taken for gone at now_ms (by the others, and so by
 * itself: its later writes are fenced). */
bool verify_live_expired(uint64_t last_refresh_ms, uint64_t now_ms);

/* ---- the lookup --------------------------------------------------------- */

/* Bytes verify_target needs for base_path + path with every {key} replaced
 * by key percent-encoded, NUL included. */
size_t verify_target_size(const char *base_path, const char *path,
                          const char *key);

/* Writes the lookup's target: base_path ("" or "/base", as the upstream's),
 * then path with every "{key}" replaced by the key (already Structured-Field
 * unquoted) with every byte but ALPHA DIGIT - . _ ~ as %XX, uppercase hex.
 * 0, or -ENOSPC when len is below verify_target_size (out is then ""). */
int verify_target(const char *base_path, const char *path, const char *key,
                  char *out, size_t len);

/* What a lookup's answer means. */
enum verify_class {
    VC_FOUND = 0,   /* in `found`: the operation happened */
    VC_ABSENT,      /* in `absent`: it did not */
    VC_OTHER,       /* anything else: a failed lookup */
};

/* The class of a lookup's status; 0 stands for no answer (a transport
 * failure, no permit or slot in time, past its end). 429 is VC_OTHER
 * whatever the lists say: it answers the lookup, not the question. */
enum verify_class verify_classify(const struct sc_verify *cfg, int status);

/* "found", "absent", "other": the access-log line's `result`. */
const char *verify_class_name(enum verify_class c);

/* ---- a verification's life ---------------------------------------------- */

struct verify_params {
    uint32_t attempts;      /* lookups at most, >= 1 */
    uint64_t after_ms;      /* before the first lookup, and between lookups */
    uint64_t timeout_ms;    /* T: the timeout the lease's request was
                               forwarded with; each lookup ends within it */
};

void verify_params_set(struct verify_params *p, const struct sc_verify *cfg,
                       uint64_t timeout_ms);

/* D = min(attempts x (after + T), the lease's remaining time), saturating. */
uint64_t verify_budget_ms(const struct verify_params *p,
                          uint64_t lease_remaining_ms);

/* One verification. Its times are milliseconds of one clock of the
 * caller's choice (now_ms of every call, deadline_ms); lease times are the
 * record's wall clock. Plain data: copy it, keep it where the driver wants. */
struct verify {
    enum verify_state state;    /* PENDING until it ends */
    struct verify_lease lease;  /* the lease it was started for */
    struct verify_params p;
    uint64_t deadline_ms;       /* start + D: every lookup has ended by then */
    uint64_t due_ms;            /* when the next lookup may go */
    uint64_t lookup_end_ms;     /* the running lookup's end at the latest */
    uint32_t sent;              /* lookups sent so far */
    bool in_flight;             /* a lookup is out */
};

/* Starts a verification of `lease` at now_ms with D from p and the lease's
 * remaining time. Returns its state: PENDING, or FAILED at once when the
 * lease ends before a first lookup could go (`after` from now). */
enum verify_state verify_start(struct verify *v, const struct verify_params *p,
                               const struct verify_lease *lease,
                               uint64_t lease_remaining_ms, uint64_t now_ms);

enum verify_step_kind {
    VSTEP_WAIT = 0,   /* nothing to do before at_ms: call verify_next then */
    VSTEP_LOOKUP,     /* send a lookup now; it must have ended, its wait for
                         a permit and a slot included, by at_ms (else report
                         it as VC_OTHER then) */
    VSTEP_BUSY,       /* a lookup is out, ending by at_ms: wait for it */
    VSTEP_DONE,       /* the state is final */
};

struct verify_step {
    enum verify_step_kind kind;
    uint64_t at_ms;
};

/* What the verification needs at now_ms. The first lookup goes `after`
 * after the start, each further one `after` after the previous ended, at
 * most `attempts` of them, each ending within T and by the deadline. */
struct verify_step verify_next(struct verify *v, uint64_t now_ms);

/* The running lookup ended at now_ms with class c. Returns the state: FOUND
 * or ABSENT at the first such answer; after a failed lookup PENDING while
 * another may go (fewer than `attempts` sent, and one due before the
 * deadline), else FAILED. Without a lookup out it changes nothing. */
enum verify_state verify_lookup_done(struct verify *v, enum verify_class c,
                                     uint64_t now_ms);

/* ---- what workers are told meanwhile ------------------------------------ */

/* The delay of a lease_held answered while a verification is pending: what
 * remains of D at now_ms, at least 1 ms. */
uint64_t verify_held_delay_ms(uint64_t deadline_ms, uint64_t now_ms);

/* The delay of the requeue answering the unknown outcome that started the
 * verification: the larger of what remains of D and the §4 backoff for the
 * attempt (instead of the lease's remaining time), at least 1 ms. Like the
 * lease's remaining time without verify, it is not clamped to max_delay. */
uint64_t verify_requeue_delay_ms(uint64_t deadline_ms, uint64_t now_ms,
                                 uint64_t backoff_ms);

#endif
