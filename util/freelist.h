/* Blocks of one size kept for reuse by one thread. The exchange and its
 * store call are over glibc's 1 KiB tcache limit: allocated and freed once
 * per request, each such calloc made malloc consolidate its fastbins first
 * (a profile of replays: 2.4 % of their CPU). A loop keeps a few of each
 * instead, as nginx and h2o keep their request objects. Not thread-safe:
 * one owner. Under AddressSanitizer a kept block is poisoned, so a use
 * after its release is still reported. */
#ifndef SLUICE_UTIL_FREELIST_H
#define SLUICE_UTIL_FREELIST_H

#include <stddef.h>

struct freelist {
    void *head;    /* kept blocks, linked through their first word */
    size_t size;   /* of every block, at least sizeof(void *) */
    unsigned n;    /* blocks kept */
    unsigned max;  /* kept at most; the rest are freed */
};

/* An empty list of blocks of size bytes keeping at most max. */
void freelist_init(struct freelist *fl, size_t size, unsigned max);
/* A zeroed block of fl->size bytes, kept or new; NULL when out of memory
 * or when fl was never initialised. */
void *freelist_take(struct freelist *fl);
/* p (from freelist_take, or NULL) kept for the next take, or freed. */
void freelist_give(struct freelist *fl, void *p);
/* Frees every kept block. */
void freelist_clear(struct freelist *fl);

#endif
