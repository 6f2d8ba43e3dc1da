/* Path normalisation for routing and forwarding (RFC 3986 section 6.2.2):
 * percent-encoded unreserved characters are decoded and dot-segments are
 * removed, so that "/v1/x/../sync", "/v1/./sync" and "/v1/%73ync" all match
 * the route of "/v1/sync". Pure: no I/O, no server library. */
#ifndef SLUICE_POLICIES_PATH_H
#define SLUICE_POLICIES_PATH_H

#include <stddef.h>

#include "util/error.h"

/* Normalises the path of an origin-form target ("/..." with an optional
 * "?query", which is kept byte for byte). Escapes of other characters
 * (%2F, %20, ...) stay as they were sent. On success *out is an owned
 * string (free()) and 0 is returned; -EINVAL (err set) for a target that
 * does not start with "/", a malformed escape, or a path whose ".."
 * segments climb above the root; -ENOMEM. */
int path_normalise(const char *target, size_t len, char **out,
                   struct sc_error *err);

#endif
