/* Route matching (docs/contract.md §2, `routes`): the longest matching prefix wins,
 * the first of equal prefixes wins; a prefix matches the path itself, the
 * path followed by "/" or "?", or anything under it when it ends in "/". */
#ifndef SLUICE_POLICIES_ROUTE_H
#define SLUICE_POLICIES_ROUTE_H

#include <stddef.h>

#include "config/config.h"

/* Finds the route for a raw request target (origin-form, query included)
 * and method bit. Returns the route or NULL (404). When a prefix matches but
 * its `methods` filter does not, matching goes on with shorter prefixes. */
const struct sc_route *route_match(const struct sc_config *cfg,
                                   const char *target, unsigned method_bit);

/* Builds the target to send upstream: base_path + (target minus
 * strip_prefix), "/" when nothing remains of the path. Owned string (free()),
 * NULL on allocation failure. */
char *route_upstream_target(const struct sc_route *route,
                            const struct sc_upstream *up, const char *target);

#endif
