/* GET /policies (docs/contract.md §12, §13) and the effective-rate gauge:
 * what each policy's bucket paces at now, why, what its partner last
 * advertised, and its lanes with their waiting requests. */
#ifndef SLUICE_PROXY_ADMIN_POLICIES_H
#define SLUICE_PROXY_ADMIN_POLICIES_H

#include <stdint.h>
#include <jansson.h>

#include "config/config.h"
#include "pacing/pacing.h"

/* The effective rate of p (permits per second, its state ps) at now: the
 * followed quota's for a policy that follows one, else its rate. */
double admin_policy_rate(const struct sc_policy *p, struct policy_state *ps,
                         uint64_t now);

/* {"policies": {NAME: {...}}} for every policy of cfg (states pc); NULL
 * when out of memory. */
json_t *admin_policies_json(const struct sc_config *cfg, struct pacing *pc,
                            uint64_t now, uint64_t wall_ms);

#endif
