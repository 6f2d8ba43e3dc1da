/* Blocks kept for reuse (freelist.h). */
#include "util/freelist.h"

#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#define FL_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FL_ASAN 1
#endif
#endif

#ifdef FL_ASAN
#include <sanitizer/asan_interface.h>
#define FL_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define FL_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define FL_POISON(p, n) ((void)(p), (void)(n))
#define FL_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

void freelist_init(struct freelist *fl, size_t size, unsigned max)
{
    fl->head = NULL;
    fl->size = size < sizeof (void *) ? sizeof (void *) : size;
    fl->n = 0;
    fl->max = max;
}

void *freelist_take(struct freelist *fl)
{
    void *p = fl->head;

    /* Never initialised (all zero): no block rather than one too small,
     * so the caller's out-of-memory path shows the mistake. */
    if (!fl->size)
        return NULL;
    if (!p)
        return calloc(1, fl->size);
    FL_UNPOISON(p, fl->size);
    memcpy(&fl->head, p, sizeof (void *));
    fl->n--;
    memset(p, 0, fl->size);
    return p;
}

void freelist_give(struct freelist *fl, void *p)
{
    if (!p)
        return;
    if (fl->n >= fl->max) {
        free(p);
        return;
    }
    memcpy(p, &fl->head, sizeof (void *));
    FL_POISON(p, fl->size);
    fl->head = p;
    fl->n++;
}

void freelist_clear(struct freelist *fl)
{
    while (fl->head) {
        void *p = fl->head;

        FL_UNPOISON(p, fl->size);
        memcpy(&fl->head, p, sizeof (void *));
        free(p);
    }
    fl->n = 0;
}
