/* Settling an unknown outcome by asking the partner (docs/contract.md §11),
 * with either store: after a keyed request of a policy
 * with idempotency.verify ends in a timeout or a lost connection, its
 * lease is claimed for a verification (PENDING in the store) and, in the
 * background on the request's loop, sluice sends the policy's lookup to
 * the same upstream, `after` apart, up to `attempts` times: each a request
 * sluice makes itself, run through the policy's plain plan (a permit, a
 * slot, the pause, the breaker, like any request), ending within T. The
 * first answer in `found` completes the record from it (verified), one in
 * `absent` releases the lease; otherwise the lease is marked failed and
 * waits out its expiry. In fleet mode a request that meets a lease whose
 * holder is gone starts that lease's verification the same way
 * (verification_take_up).
 *
 * A verification is plain data on its loop: a timer moves it (policies/
 * verify.h says when), a lookup is an exchange it owns. Nothing of it
 * outlives the loop: one pending at shutdown is made again at the next
 * start (start-up takes up every lease left in progress). */
#ifndef SLUICE_PROXY_SERVER_VERIFICATION_H
#define SLUICE_PROXY_SERVER_VERIFICATION_H

#include <stdbool.h>
#include <stdint.h>

struct app;
struct exchange;
struct loop;

/* ex_env.verify_begin (arg: the loop): claims ex's lease and starts its
 * verification on the loop; its deadline D (wall ms), or 0 when none
 * started (the lease ends before a lookup could go, no memory, a claim
 * the store refused at once). The claim is a call on the loop: on Redis
 * D is answered while it is on its way, and a refusal then only drops
 * the verification. */
uint64_t verification_begin(void *loop, struct exchange *ex);

/* ex_env.verify_take_up (arg: the loop): as verification_begin, for the
 * lease `fence` of ex's key, ending at expires_ms (wall), that another,
 * gone, process holds or was verifying (fleet mode): with ex's upstream
 * and T. */
uint64_t verification_take_up(void *loop, struct exchange *ex, uint64_t fence,
                              uint64_t expires_ms, bool again);

/* Start-up, before the loops run (RocksDB: every lease in progress belongs
 * to a process that ended): starts the verification of each lease whose
 * policy verifies in the running config and whose verification has not
 * failed, spread over the loops. Returns how many started. */
unsigned verification_resume_all(struct app *app);

/* Drops what the loop's verifications hold (their lookups cancelled): at
 * shutdown, once the loop no longer runs. */
void verification_stop_all(struct loop *w);

#endif
