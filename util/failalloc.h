/* Allocation-failure testing (a test build only, SLUICE_FAILALLOC): this
 * header is forced into every sluice source, so their own malloc, calloc,
 * realloc, strdup, strndup and asprintf go through a countdown that a test
 * arms for one request (the X-Sluice-Failalloc request header) and that
 * fails exactly the Nth allocation on that loop thread, as jansson's chaos
 * test does. Libraries' own allocations are left alone. In other builds
 * this header is not included and nothing changes. */
#ifndef SLUICE_UTIL_FAILALLOC_H
#define SLUICE_UTIL_FAILALLOC_H

#ifdef SLUICE_FAILALLOC

/* Forced in ahead of every source: the system headers below must see what
 * the sources ask of them. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Arms the countdown on this thread: the nth allocation from now fails
 * (0 disarms). */
void failalloc_arm(long nth);
/* True once the armed allocation has failed (then disarmed). */
int failalloc_fired(void);

void *failalloc_malloc(size_t n);
void *failalloc_calloc(size_t n, size_t size);
void *failalloc_realloc(void *p, size_t n);
char *failalloc_strdup(const char *s);
char *failalloc_strndup(const char *s, size_t n);
int failalloc_asprintf(char **out, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
int failalloc_vasprintf(char **out, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));

#define malloc(n) failalloc_malloc(n)
#define calloc(n, s) failalloc_calloc(n, s)
#define realloc(p, n) failalloc_realloc(p, n)
#define strdup(s) failalloc_strdup(s)
#define strndup(s, n) failalloc_strndup(s, n)
#define asprintf(...) failalloc_asprintf(__VA_ARGS__)
#define vasprintf(o, f, a) failalloc_vasprintf(o, f, a)

#endif
#endif
