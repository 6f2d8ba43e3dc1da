/* RFC 8941 Structured Field Values, as far as sluice reads them: a List of
 * Items with their Parameters (the draft RateLimit and RateLimit-Policy
 * headers are two). Pure. */
#ifndef SLUICE_POLICIES_SFV_H
#define SLUICE_POLICIES_SFV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One parameter of item number `item` (0-based): its key, and its value when
 * that is an Integer. Called once more per item with key NULL after its
 * last parameter. */
typedef void (*sfv_param_fn)(void *arg, size_t item, const char *key,
                             size_t klen, bool is_int, int64_t value);

/* Walks a List (RFC 8941 section 4.2.1). 0, or -EINVAL when v is not a
 * valid List: fn may then have been called for the items before the fault,
 * so a caller that wants all or nothing decides only on 0. */
int sfv_list_walk(const char *v, sfv_param_fn fn, void *arg);

enum sfv_type {
    SFV_INTEGER,
    SFV_DECIMAL,
    SFV_STRING,
    SFV_TOKEN,
    SFV_BYTES,
    SFV_BOOLEAN,
    SFV_INNER_LIST,   /* a member only: its text is the whole (...) */
    SFV_BARE_KEY,     /* a parameter without "=value": Boolean true */
};

/* A bare item as written in the field value (text points into it). */
struct sfv_value {
    enum sfv_type type;
    const char *text;   /* a String with its quotes and escapes */
    size_t len;
    int64_t integer;    /* SFV_INTEGER; a Boolean's 0 or 1 */
};

/* What sfv_list_visit tells, per member in order: member (its bare item),
 * then param for each of its parameters, then end. Any may be NULL. */
struct sfv_visitor {
    void (*member)(void *arg, size_t item, const struct sfv_value *v);
    void (*param)(void *arg, size_t item, const char *key, size_t klen,
                  const struct sfv_value *v);
    void (*end)(void *arg, size_t item);
};

/* Walks a List like sfv_list_walk, with every bare item's type and text;
 * the same 0 / -EINVAL, with the same caveat. */
int sfv_list_visit(const char *v, const struct sfv_visitor *vis, void *arg);

/* The characters of a String value (escapes undone) into buf, NUL-ended,
 * cut to len - 1; returns the whole length, which may exceed it. 0 for a
 * value that is not a String. */
size_t sfv_string_copy(const struct sfv_value *v, char *buf, size_t len);

#endif
