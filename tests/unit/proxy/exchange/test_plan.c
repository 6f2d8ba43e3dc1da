/* proxy/exchange/plan.c: each policy's plans hold the rows it needs, in
 * order, and no others. */
#include "proxy/exchange/plan.h"
#include "unit/proxy/exchange/fixture.h"

static const char yaml[] =
    "upstreams: { up: { url: http://127.0.0.1:9000 } }\n"
    "store: { backend: redis, url: \"redis://127.0.0.1:1/0\" }\n"
    "policies:\n"
    "  paced: { rate: 10/s, idempotency: {} }\n"
    "  shadow: { rate: 10/s, mode: shadow, idempotency: {} }\n"
    "  fleet: { rate: 10/s, concurrency: 2, shared: redis, idempotency: {} }\n"
    "  keys: { idempotency: {} }\n"
    "  laned: { rate: 10/s, idempotency: {}, lanes: [{ name: a, share: 50% },\n"
    "           { name: b, share: 50% }] }\n"
    "  quota: { rate: 10/s, quota: { follow: true } }\n"
    "  fleetlanes: { rate: 10/s, shared: redis, idempotency: {},\n"
    "                lanes: [{ name: a, share: 50% }, { name: b, share: 50% }] }\n"
    "  fleetslots: { rate: 10/s, shared: redis, concurrency: 2, idempotency: {},\n"
    "                quota: { follow: true },\n"
    "                lanes: [{ name: a, share: 50% }, { name: b, share: 50% }] }\n"
    "  followslots: { rate: 10/s, shared: redis, concurrency: 2, quota: { follow: true } }\n"
    "  shadowlanes: { rate: 10/s, mode: shadow, concurrency: 2, idempotency: {},\n"
    "                 quota: { follow: true },\n"
    "                 lanes: [{ name: a, share: 50% }, { name: b, share: 50% }] }\n"
    "  shadowfollow: { rate: 10/s, mode: shadow, shared: redis, quota: { follow: true } }\n"
    "routes: [{ prefix: /, upstream: up }]\n";

static void up(void)
{
    fixture_up(yaml);
}

TestSuite(plan, .init = up, .fini = fixture_down);

static void expect_rows(const struct ex_plan *p, const char *want)
{
    char got[256] = "";

    for (size_t i = 0; i < p->n; i++) {
        strcat(got, p->row[i]->name);
        strcat(got, i + 1 < p->n ? " " : "");
    }
    cr_expect_str_eq(got, want);
}

static const struct sc_policy *policy(const char *name)
{
    for (size_t i = 0; i < fx.cfg->n_policies; i++)
        if (!strcmp(fx.cfg->policies[i].name, name))
            return &fx.cfg->policies[i];
    cr_assert_fail("no policy %s", name);
    return NULL;
}

Test(plan, a_paced_keyed_policy)
{
    struct ex_plans ps;

    ex_plans_build(policy("paced"), false, &ps);
    expect_rows(&ps.plain, "permit slot send_check upstream feedback upstream_body");
    expect_rows(&ps.keyed, "key lookup permit slot send_check lease upstream feedback "
                           "upstream_body commit");
}

Test(plan, shadow_mode_counts_and_never_checks_at_sending)
{
    struct ex_plans ps;

    ex_plans_build(policy("shadow"), false, &ps);
    expect_rows(&ps.plain, "permit_shadow slot upstream feedback upstream_body");
}

/* The fleet's permit carries the key's lookup and lease: no rows of their
 * own. On a store that cannot share, the same policy paces locally. */
Test(plan, a_fleet_policy)
{
    struct ex_plans ps;

    ex_plans_build(policy("fleet"), true, &ps);
    expect_rows(&ps.plain, "permit_fleet slot_fleet send_check upstream feedback_fleet "
                           "upstream_body");
    expect_rows(&ps.keyed, "key permit_lease slot_fleet send_check upstream "
                           "feedback_fleet upstream_body commit");
    ex_plans_build(policy("fleet"), false, &ps);
    expect_rows(&ps.plain, "permit slot send_check upstream feedback upstream_body");
}

Test(plan, no_rate_no_pacing_rows)
{
    struct ex_plans ps;

    ex_plans_build(policy("keys"), false, &ps);
    expect_rows(&ps.plain, "slot upstream upstream_body");
    expect_rows(&ps.keyed, "key lookup slot lease upstream upstream_body commit");
    ex_plans_build(&fx.cfg->default_policy, false, &ps);
    expect_rows(&ps.plain, "slot upstream upstream_body");
}

Test(plan, lanes_choose_the_lane_first_and_take_the_slot_before_the_permit)
{
    struct ex_plans ps;

    ex_plans_build(policy("laned"), false, &ps);
    expect_rows(&ps.plain, "lane slot permit_lanes send_check upstream feedback upstream_body");
    expect_rows(&ps.keyed, "lane key lookup slot permit_lanes send_check lease upstream "
                           "feedback upstream_body commit");
}

/* A fleet's lanes order this sidecar's waiters; the head then asks the
 * fleet's bucket. A keyed request looks its key up before it joins a lane
 * (a replay waits for nothing), so the lease has its own row again. */
Test(plan, a_fleet_with_lanes_asks_the_fleet_after_its_lanes)
{
    struct ex_plans ps;

    ex_plans_build(policy("fleetlanes"), true, &ps);
    expect_rows(&ps.plain, "lane slot permit_lanes permit_fleet_lanes send_check upstream "
                           "feedback_fleet upstream_body");
    expect_rows(&ps.keyed, "lane key lookup slot permit_lanes permit_fleet_lanes send_check "
                           "lease upstream feedback_fleet upstream_body commit");
    ex_plans_build(policy("fleetlanes"), false, &ps);
    expect_rows(&ps.plain, "lane slot permit_lanes send_check upstream feedback upstream_body");
}

Test(plan, following_a_quota_grants_permits_and_reads_every_answer)
{
    struct ex_plans ps;

    ex_plans_build(policy("quota"), false, &ps);
    expect_rows(&ps.plain, "slot permit_lanes send_check upstream quota feedback upstream_body");
}

/* A fleet's slots with lanes or a followed quota: taken before the lane,
 * as this sidecar's are, by the request the lanes pick among this
 * sidecar's waiters for one; without the fleet's store, this sidecar's. */
Test(plan, a_fleets_slots_with_lanes_come_before_the_lanes_permit)
{
    struct ex_plans ps;

    ex_plans_build(policy("fleetslots"), true, &ps);
    expect_rows(&ps.plain, "lane slot_fleet_lanes permit_lanes permit_fleet_lanes send_check "
                           "upstream quota feedback_fleet upstream_body");
    expect_rows(&ps.keyed, "lane key lookup slot_fleet_lanes permit_lanes permit_fleet_lanes "
                           "send_check lease upstream quota feedback_fleet upstream_body commit");
    ex_plans_build(policy("followslots"), true, &ps);
    expect_rows(&ps.plain, "slot_fleet_lanes permit_lanes permit_fleet_lanes send_check "
                           "upstream quota feedback_fleet upstream_body");
    ex_plans_build(policy("fleetslots"), false, &ps);
    expect_rows(&ps.plain, "lane slot permit_lanes send_check upstream quota feedback "
                           "upstream_body");
}

/* Shadow mode with lanes or a followed quota: the lane is chosen and the
 * quota read, so the shadow permit can say what they would have done; no
 * row waits or checks at sending. */
Test(plan, shadow_lanes_and_quota_keep_their_rows_and_wait_nowhere)
{
    struct ex_plans ps;

    ex_plans_build(policy("shadowlanes"), false, &ps);
    expect_rows(&ps.plain, "lane permit_shadow_lanes slot upstream quota feedback "
                           "upstream_body");
    expect_rows(&ps.keyed, "lane key lookup permit_shadow_lanes slot lease upstream quota "
                           "feedback upstream_body commit");
    ex_plans_build(policy("shadowfollow"), true, &ps);
    expect_rows(&ps.plain, "permit_shadow_lanes slot upstream quota feedback_fleet "
                           "upstream_body");
}
