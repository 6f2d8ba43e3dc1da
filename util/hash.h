/* One hash for sluice's tables and lock stripes: FNV-1a, 64-bit. Not for
 * anything an attacker must not steer (keys come from workers, who are
 * trusted callers, and tables bound their chains). */
#ifndef SLUICE_UTIL_HASH_H
#define SLUICE_UTIL_HASH_H

#include <stddef.h>
#include <stdint.h>

#define HASH_INIT 0xcbf29ce484222325ull /* the FNV offset basis */

/* Continues hash h over len bytes of p (start with HASH_INIT). */
static inline uint64_t hash_bytes(uint64_t h, const void *p, size_t len)
{
    const unsigned char *b = p;

    for (size_t i = 0; i < len; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* Continues hash h over a NUL-terminated string. */
static inline uint64_t hash_str(uint64_t h, const char *s)
{
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

#endif
