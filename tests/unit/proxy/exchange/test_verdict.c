/* proxy/exchange/verdict.c: what a request that meets a held lease is
 * told (docs/contract.md §11), from the store's answer HELD alone, on a
 * fake clock: the lease's remaining time while its holder lives; what
 * remains of D and "verify": "pending" while a verification runs; and, in
 * fleet mode, the verification of a lease whose holder (or verifier) is
 * gone started here, for that lease, then answered as pending; never
 * without `verify`, and as held when another sidecar claimed it first. */
#include "unit/proxy/exchange/fixture.h"

static const char yaml[] =
    "upstreams: { up: { url: http://127.0.0.1:9000, timeout: 100ms } }\n"
    "policies:\n"
    "  keyed: { idempotency: { lease: 30s } }\n"
    "  verifies:\n"
    "    idempotency: { lease: 30s, verify: { path: \"/v/{key}\", after: 500ms } }\n"
    "routes:\n"
    "  - { prefix: /k, upstream: up, policy: keyed }\n"
    "  - { prefix: /v, upstream: up, policy: verifies }\n";

enum { NONE = 0, PENDING = 1 }; /* enum verify_state */

static void up(void)
{
    fixture_up(yaml);
}

TestSuite(verdict, .init = up, .fini = fixture_down);

static struct {
    int calls;
    uint64_t fence, deadline, expires_ms;
    bool again;
} took;

static uint64_t fake_take_up(void *arg, struct exchange *ex, uint64_t fence,
                             uint64_t expires_ms, bool again)
{
    took.calls++;
    took.fence = fence;
    took.expires_ms = expires_ms;
    took.again = again;
    return took.deadline;
}

/* ex_take_lease on a HELD answer of route r's policy. */
static void meet_held(struct exchange *ex, struct store_call *c, size_t r,
                      const struct store_acquire_out *held)
{
    fake(ex, r);
    ex->key = "k";
    memset(c, 0, sizeof *c);
    c->acq = *held;
    c->acq.claim = STORE_HELD;
    ex->scall = c;
    fx.env.verify_take_up = fake_take_up;
    cr_assert_not(ex_take_lease(ex));
    cr_assert_eq(ex->reason, R_LEASE_HELD);
    ex->scall = NULL;
}

Test(verdict, a_live_holders_lease_is_held_for_its_remaining_time)
{
    struct exchange ex;
    struct store_call c;

    meet_held(&ex, &c, 1, &(struct store_acquire_out){.remaining_ms = 20000, .lease = 7});
    cr_expect_eq(ex.instr.delay_ms, 20000);
    cr_expect_not(ex.instr.verify_pending);
    cr_expect_eq(took.calls, 0, "a live holder's lease is not verified");
}

Test(verdict, a_pending_verification_answers_what_remains_of_d)
{
    struct exchange ex;
    struct store_call c;

    meet_held(&ex, &c, 1, &(struct store_acquire_out){
        .remaining_ms = 20000, .lease = 7, .verify = PENDING,
        .verify_deadline_ms = fx.now.wall_ms + 1200});
    cr_expect_eq(ex.instr.delay_ms, 1200);
    cr_expect(ex.instr.verify_pending);
    cr_expect_eq(took.calls, 0, "its verifier is alive: nothing to take up");
}

Test(verdict, a_gone_holders_lease_is_verified_here)
{
    struct exchange ex;
    struct store_call c;

    took.deadline = fx.now.wall_ms + 1500;
    meet_held(&ex, &c, 1, &(struct store_acquire_out){
        .remaining_ms = 20000, .lease = 42, .holder_gone = true});
    cr_expect_eq(took.calls, 1);
    cr_expect_eq(took.fence, 42, "the held lease, not the request's own");
    cr_expect_eq(took.expires_ms, fx.now.wall_ms + 20000, "the held lease's end");
    cr_expect_not(took.again);
    cr_expect_eq(ex.instr.delay_ms, 1500, "D, not the lease's 20 s");
    cr_expect(ex.instr.verify_pending);
}

Test(verdict, a_gone_verifiers_pending_mark_is_taken_up_again)
{
    struct exchange ex;
    struct store_call c;

    took.deadline = fx.now.wall_ms + 900;
    meet_held(&ex, &c, 1, &(struct store_acquire_out){
        .remaining_ms = 20000, .lease = 42, .holder_gone = true, .verify = PENDING,
        .verify_deadline_ms = fx.now.wall_ms + 5000});
    cr_expect_eq(took.calls, 1);
    cr_expect(took.again, "a pending mark whose verifier is gone");
    cr_expect_eq(ex.instr.delay_ms, 900);
}

Test(verdict, a_claim_lost_to_another_sidecar_answers_the_lease)
{
    struct exchange ex;
    struct store_call c;

    took.deadline = 0;
    meet_held(&ex, &c, 1, &(struct store_acquire_out){
        .remaining_ms = 20000, .lease = 42, .holder_gone = true});
    cr_expect_eq(took.calls, 1);
    cr_expect_eq(ex.instr.delay_ms, 20000);
    cr_expect_not(ex.instr.verify_pending);
}

Test(verdict, without_verify_a_gone_holders_lease_waits_for_its_expiry)
{
    struct exchange ex;
    struct store_call c;

    took.deadline = fx.now.wall_ms + 1500;
    meet_held(&ex, &c, 0, &(struct store_acquire_out){
        .remaining_ms = 20000, .lease = 42, .holder_gone = true});
    cr_expect_eq(took.calls, 0);
    cr_expect_eq(ex.instr.delay_ms, 20000);
    cr_expect_not(ex.instr.verify_pending);
}
