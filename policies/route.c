/* Route matching and the upstream target (route.h). Linear over the routes:
 * a sidecar has a handful, and a scan keeps "first of equal prefixes wins"
 * obvious. */
#include "policies/route.h"

#include <stdlib.h>
#include <string.h>

/* Length of the path part of a request target (up to the query). */
static size_t path_len(const char *target)
{
    return strcspn(target, "?#");
}

/* A prefix matches the path itself, the path followed by "/" (or the query,
 * which path_len already cut off), or anything under it when it ends in "/". */
static bool prefix_matches(const char *prefix, const char *target, size_t plen)
{
    size_t n = strlen(prefix);

    if (n == 0 || n > plen || memcmp(prefix, target, n) != 0)
        return false;
    return n == plen || prefix[n - 1] == '/' || target[n] == '/';
}

const struct sc_route *route_match(const struct sc_config *cfg,
                                   const char *target, unsigned method_bit)
{
    const struct sc_route *best = NULL;
    size_t i, plen, best_len = 0;

    if (!cfg || !target)
        return NULL;
    plen = path_len(target);
    for (i = 0; i < cfg->n_routes; i++) {
        const struct sc_route *r = &cfg->routes[i];
        size_t n;

        if (!r->prefix || !(r->methods & method_bit) ||
            !prefix_matches(r->prefix, target, plen))
            continue;
        n = strlen(r->prefix);
        if (!best || n > best_len) {   /* strict: the first of equals stays */
            best = r;
            best_len = n;
        }
    }
    return best;
}

char *route_upstream_target(const struct sc_route *route,
                            const struct sc_upstream *up, const char *target)
{
    const char *base = up && up->base_path ? up->base_path : "";
    const char *strip = route && route->strip_prefix ? route->strip_prefix : "";
    const char *rest = target ? target : "";
    size_t sl = strlen(strip), bl = strlen(base), rl;
    bool slash;
    char *out;

    if (sl && strncmp(rest, strip, sl) == 0)
        rest += sl;
    /* What remains must start the path with "/": nothing left, a query right
     * after the stripped prefix, or a strip that ended with "/". */
    slash = rest[0] != '/';
    rl = strlen(rest);
    out = malloc(bl + slash + rl + 1);
    if (!out)
        return NULL;
    memcpy(out, base, bl);
    if (slash)
        out[bl] = '/';
    memcpy(out + bl + slash, rest, rl + 1);
    return out;
}
