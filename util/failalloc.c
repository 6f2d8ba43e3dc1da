#define _GNU_SOURCE
#include "util/failalloc.h"

#ifdef SLUICE_FAILALLOC

/* The real ones here (the header may have been forced in before). */
#undef malloc
#undef calloc
#undef realloc
#undef strdup
#undef strndup
#undef asprintf
#undef vasprintf

static _Thread_local long countdown;
static _Thread_local int fired;

void failalloc_arm(long nth)
{
    countdown = nth > 0 ? nth : 0;
    fired = 0;
}

int failalloc_fired(void)
{
    return fired;
}

/* True when this allocation is the one to fail. */
static int fail_now(void)
{
    if (countdown <= 0 || --countdown > 0)
        return 0;
    fired = 1;
    return 1;
}

void *failalloc_malloc(size_t n)
{
    return fail_now() ? NULL : malloc(n);
}

void *failalloc_calloc(size_t n, size_t size)
{
    return fail_now() ? NULL : calloc(n, size);
}

void *failalloc_realloc(void *p, size_t n)
{
    return fail_now() ? NULL : realloc(p, n);
}

char *failalloc_strdup(const char *s)
{
    return fail_now() ? NULL : strdup(s);
}

char *failalloc_strndup(const char *s, size_t n)
{
    return fail_now() ? NULL : strndup(s, n);
}

int failalloc_vasprintf(char **out, const char *fmt, va_list ap)
{
    if (fail_now())
        return -1;
    return vasprintf(out, fmt, ap);
}

int failalloc_asprintf(char **out, const char *fmt, ...)
{
    va_list ap;
    int rc;

    va_start(ap, fmt);
    rc = failalloc_vasprintf(out, fmt, ap);
    va_end(ap);
    return rc;
}

#endif
