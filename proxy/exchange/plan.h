/* The plans of a config's policies: built once when the config goes into
 * service (runtime.c), read by every request of it. */
#ifndef SLUICE_PROXY_EXCHANGE_PLAN_H
#define SLUICE_PROXY_EXCHANGE_PLAN_H

#include <stdbool.h>

#include "config/config.h"
#include "proxy/exchange/stage.h"

/* A policy's two plans: for a keyed request (its method one the policy
 * keys, and a key sent or required) and for any other. */
struct ex_plans {
    struct ex_plan keyed, plain;
};

/* The rows of p's plans, in order. store_shares: the store shares buckets
 * and slots (fleet mode), so `shared: redis` pacing goes through it. */
void ex_plans_build(const struct sc_policy *p, bool store_shares,
                    struct ex_plans *out);

/* A request's plan. */
static inline const struct ex_plan *ex_plan_for(const struct ex_plans *ps, bool keyed)
{
    return keyed ? &ps->keyed : &ps->plain;
}

#endif
