/* One error convention for all of sluice: functions return 0 or a negative
 * errno-style code, and put a human message in a struct sc_error the caller
 * passes in (like jansson's json_error_t). file/line/col are set only when the
 * error comes from a config file; line 0 means "no position". */
#ifndef SLUICE_UTIL_ERROR_H
#define SLUICE_UTIL_ERROR_H

#include <stddef.h>

#define SC_ERROR_TEXT_MAX 512
#define SC_ERROR_FILE_MAX 256

struct sc_error {
    char file[SC_ERROR_FILE_MAX];
    int line;                   /* 1-based; 0 = no position */
    int col;                    /* 1-based */
    char text[SC_ERROR_TEXT_MAX];
};

/* A growable list of errors, for loaders that report every problem at once. */
struct sc_errors {
    struct sc_error *v;
    size_t n, cap;
};

void sc_error_set(struct sc_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void sc_error_at(struct sc_error *err, const char *file, int line, int col,
                 const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* Formats "FILE:LINE:COL: text" (or just text without a position) into buf. */
void sc_error_format(const struct sc_error *err, char *buf, size_t len);

/* Appends an error; returns -ENOMEM when the list cannot grow. */
int sc_errors_add(struct sc_errors *errs, const char *file, int line, int col,
                  const char *fmt, ...) __attribute__((format(printf, 5, 6)));
void sc_errors_free(struct sc_errors *errs);

#endif
