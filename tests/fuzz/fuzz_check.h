/* What the fuzz targets share: an invariant check that stops the run with a
 * message libFuzzer keeps next to the crashing input, and a copy of the
 * input as a C string for parsers that take one. */
#ifndef SLUICE_TESTS_FUZZ_FUZZ_CHECK_H
#define SLUICE_TESTS_FUZZ_FUZZ_CHECK_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* abort(): libFuzzer saves the input as crash-<sha1> and stops. */
#define FUZZ_CHECK(cond, ...)                                              \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "%s:%d: invariant failed: %s: ", __FILE__,     \
                    __LINE__, #cond);                                      \
            fprintf(stderr, __VA_ARGS__);                                  \
            fputc('\n', stderr);                                           \
            abort();                                                       \
        }                                                                  \
    } while (0)

/* data[0..size) NUL-terminated in an owned exact-size buffer (free()), so
 * ASan sees a read past the terminator; NULL when out of memory. */
static inline char *fuzz_strndup(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);

    if (s) {
        memcpy(s, data, size);
        s[size] = '\0';
    }
    return s;
}

#endif
