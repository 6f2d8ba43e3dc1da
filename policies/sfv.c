#include "policies/sfv.h"

#include <ctype.h>
#include <errno.h>
#include <string.h>

/* RFC 8941 caps Integers at 15 digits; Decimals at 12 + 3. */
#define SFV_INT_DIGITS 15

static const char *skip_sp(const char *p)
{
    while (*p == ' ')
        p++;
    return p;
}

static const char *skip_ows(const char *p)
{
    while (*p == ' ' || *p == '\t')
        p++;
    return p;
}

static bool is_tchar(int c)
{
    return isalnum(c) || (c && strchr("!#$%&'*+-.^_`|~", c));
}

/* Integer or Decimal (4.2.4). *is_int tells which; a Decimal's value is not
 * kept. NULL when malformed. */
static const char *parse_number(const char *p, bool *is_int, int64_t *out)
{
    int64_t v = 0;
    int sign = 1, digits = 0;

    if (*p == '-') {
        sign = -1;
        p++;
    }
    if (!isdigit((unsigned char)*p))
        return NULL;
    for (; isdigit((unsigned char)*p); p++) {
        if (++digits > SFV_INT_DIGITS)
            return NULL;
        v = v * 10 + (*p - '0');
    }
    *is_int = *p != '.';
    *out = sign * v;
    if (*is_int)
        return p;
    if (digits > 12 || !isdigit((unsigned char)*++p))
        return NULL;
    for (digits = 0; isdigit((unsigned char)*p); p++)
        if (++digits > 3)
            return NULL;
    return p;
}

static const char *parse_string(const char *p)
{
    for (p++; *p != '"'; p++) {
        if (*p == '\\' && (p[1] == '"' || p[1] == '\\'))
            p++;
        else if (*p == '\\' || *p < 0x20 || *p > 0x7e)
            return NULL;
    }
    return p + 1;
}

static const char *parse_bytes(const char *p)
{
    for (p++; *p != ':'; p++)
        if (!isalnum((unsigned char)*p) && *p != '+' && *p != '/' && *p != '=')
            return NULL;
    return p + 1;
}

/* A Bare Item (4.2.3.1); for an Integer *is_int and *v are set. */
static const char *parse_bare(const char *p, bool *is_int, int64_t *v)
{
    *is_int = false;
    if (*p == '-' || isdigit((unsigned char)*p))
        return parse_number(p, is_int, v);
    if (*p == '"')
        return parse_string(p);
    if (*p == ':')
        return parse_bytes(p);
    if (*p == '?')
        return p[1] == '0' || p[1] == '1' ? p + 2 : NULL;
    if (!isalpha((unsigned char)*p) && *p != '*')
        return NULL;
    while (is_tchar((unsigned char)*p) || *p == ':' || *p == '/')
        p++;
    return p;
}

static const char *parse_key(const char *p)
{
    if (!islower((unsigned char)*p) && *p != '*')
        return NULL;
    while (islower((unsigned char)*p) || isdigit((unsigned char)*p) ||
           (*p && strchr("_-.*", *p)))
        p++;
    return p;
}

/* Parameters (4.2.3.2), each told to fn, then the item's end. */
static const char *parse_params(const char *p, size_t item, sfv_param_fn fn,
                                void *arg)
{
    while (p && *p == ';') {
        const char *key = skip_sp(p + 1), *end = parse_key(key);
        bool is_int = false;
        int64_t v = 0;

        if (!end)
            return NULL;
        p = end;
        if (*p == '=')
            p = parse_bare(p + 1, &is_int, &v);
        if (p)
            fn(arg, item, key, (size_t)(end - key), is_int, v);
    }
    if (p)
        fn(arg, item, NULL, 0, false, 0);
    return p;
}

/* An inner item's parameters: not ours to report. */
static const char *skip_inner_params(const char *p)
{
    bool is_int;
    int64_t v;

    while (p && *p == ';') {
        p = parse_key(skip_sp(p + 1));
        if (p && *p == '=')
            p = parse_bare(p + 1, &is_int, &v);
    }
    return p;
}

/* An Item, or an Inner List with its parameters (4.2.1.1). */
static const char *parse_member(const char *p, size_t item, sfv_param_fn fn,
                                void *arg)
{
    bool is_int;
    int64_t v;

    if (*p != '(')
        return parse_params(parse_bare(p, &is_int, &v), item, fn, arg);
    for (p = skip_sp(p + 1); p && *p != ')'; p = skip_sp(p)) {
        p = skip_inner_params(parse_bare(p, &is_int, &v));
        if (!p || (*p != ' ' && *p != ')'))
            return NULL;
    }
    return p ? parse_params(p + 1, item, fn, arg) : NULL;
}

int sfv_list_walk(const char *v, sfv_param_fn fn, void *arg)
{
    const char *p = skip_sp(v);
    size_t item = 0;

    if (!*p)
        return 0; /* an empty List */
    for (;;) {
        p = parse_member(p, item++, fn, arg);
        if (!p)
            return -EINVAL;
        p = skip_ows(p);
        if (!*p)
            return 0;
        if (*p != ',')
            return -EINVAL;
        p = skip_ows(p + 1);
        if (!*p)
            return -EINVAL; /* a trailing comma */
    }
}
