#include "util/error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void set_pos(struct sc_error *err, const char *file, int line, int col)
{
    snprintf(err->file, sizeof err->file, "%s", file ? file : "");
    err->line = line;
    err->col = col;
}

void sc_error_set(struct sc_error *err, const char *fmt, ...)
{
    va_list ap;

    if (!err)
        return;
    set_pos(err, NULL, 0, 0);
    va_start(ap, fmt);
    vsnprintf(err->text, sizeof err->text, fmt, ap);
    va_end(ap);
}

void sc_error_at(struct sc_error *err, const char *file, int line, int col,
                 const char *fmt, ...)
{
    va_list ap;

    if (!err)
        return;
    set_pos(err, file, line, col);
    va_start(ap, fmt);
    vsnprintf(err->text, sizeof err->text, fmt, ap);
    va_end(ap);
}

void sc_error_format(const struct sc_error *err, char *buf, size_t len)
{
    if (err->line > 0)
        snprintf(buf, len, "%s:%d:%d: %s", err->file, err->line, err->col,
                 err->text);
    else if (err->file[0])
        snprintf(buf, len, "%s: %s", err->file, err->text);
    else
        snprintf(buf, len, "%s", err->text);
}

int sc_errors_add(struct sc_errors *errs, const char *file, int line, int col,
                  const char *fmt, ...)
{
    struct sc_error *e;
    va_list ap;

    if (errs->n == errs->cap) {
        size_t cap = errs->cap ? errs->cap * 2 : 8;
        struct sc_error *v = realloc(errs->v, cap * sizeof *v);
        if (!v)
            return -ENOMEM;
        errs->v = v;
        errs->cap = cap;
    }
    e = &errs->v[errs->n++];
    set_pos(e, file, line, col);
    va_start(ap, fmt);
    vsnprintf(e->text, sizeof e->text, fmt, ap);
    va_end(ap);
    return 0;
}

void sc_errors_free(struct sc_errors *errs)
{
    free(errs->v);
    errs->v = NULL;
    errs->n = errs->cap = 0;
}
