/* RFC 8941 Structured Field Values, as far as sluice reads them: a List of
 * Items with their Parameters (the draft RateLimit header is one). Pure. */
#ifndef SLUICE_POLICIES_SFV_H
#define SLUICE_POLICIES_SFV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One parameter of item number `item` (0-based): its key, and its value when
 * that is an Integer. Called once more per item with key NULL after its
 * last parameter. */
typedef void (*sfv_param_fn)(void *arg, size_t item, const char *key,
                             size_t klen, bool is_int, int64_t value);

/* Walks a List (RFC 8941 section 4.2.1). 0, or -EINVAL when v is not a
 * valid List: fn may then have been called for the items before the fault,
 * so a caller that wants all or nothing decides only on 0. */
int sfv_list_walk(const char *v, sfv_param_fn fn, void *arg);

#endif
