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

/* Integer or Decimal (4.2.4) into out. NULL when malformed. */
static const char *parse_number(const char *p, struct sfv_value *out)
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
    out->type = *p != '.' ? SFV_INTEGER : SFV_DECIMAL;
    out->integer = sign * v;
    if (out->type == SFV_INTEGER)
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

static const char *parse_token(const char *p)
{
    if (!isalpha((unsigned char)*p) && *p != '*')
        return NULL;
    while (is_tchar((unsigned char)*p) || *p == ':' || *p == '/')
        p++;
    return p;
}

/* The kinds of bare item that need no more than their first character to
 * tell (4.2.3.1). */
static const char *parse_other(const char *p, struct sfv_value *out)
{
    if (*p == '"') {
        out->type = SFV_STRING;
        return parse_string(p);
    }
    if (*p == ':') {
        out->type = SFV_BYTES;
        return parse_bytes(p);
    }
    if (*p == '?') {
        out->type = SFV_BOOLEAN;
        out->integer = p[1] == '1';
        return p[1] == '0' || p[1] == '1' ? p + 2 : NULL;
    }
    out->type = SFV_TOKEN;
    return parse_token(p);
}

/* A Bare Item (4.2.3.1) into out, its text included. */
static const char *parse_bare(const char *p, struct sfv_value *out)
{
    const char *end;

    out->text = p;
    out->integer = 0;
    if (*p == '-' || isdigit((unsigned char)*p))
        end = parse_number(p, out);
    else
        end = parse_other(p, out);
    out->len = end ? (size_t)(end - p) : 0;
    return end;
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

/* Parameters (4.2.3.2), each told to the visitor, then the item's end. */
static const char *parse_params(const char *p, size_t item,
                                const struct sfv_visitor *vis, void *arg)
{
    while (p && *p == ';') {
        const char *key = skip_sp(p + 1), *end = parse_key(key);
        struct sfv_value v = {SFV_BARE_KEY, NULL, 0, 1};

        if (!end)
            return NULL;
        p = end;
        if (*p == '=')
            p = parse_bare(p + 1, &v);
        if (p && vis->param)
            vis->param(arg, item, key, (size_t)(end - key), &v);
    }
    if (p && vis->end)
        vis->end(arg, item);
    return p;
}

/* An inner item's parameters: not ours to report. */
static const char *skip_inner_params(const char *p)
{
    struct sfv_value v;

    while (p && *p == ';') {
        p = parse_key(skip_sp(p + 1));
        if (p && *p == '=')
            p = parse_bare(p + 1, &v);
    }
    return p;
}

static const char *parse_inner_list(const char *p, struct sfv_value *out)
{
    struct sfv_value v;

    out->type = SFV_INNER_LIST;
    out->text = p;
    out->integer = 0;
    for (p = skip_sp(p + 1); p && *p != ')'; p = skip_sp(p)) {
        p = skip_inner_params(parse_bare(p, &v));
        if (!p || (*p != ' ' && *p != ')'))
            return NULL;
    }
    if (!p)
        return NULL;
    out->len = (size_t)(p + 1 - out->text);
    return p + 1;
}

/* An Item, or an Inner List with its parameters (4.2.1.1). */
static const char *parse_member(const char *p, size_t item,
                                const struct sfv_visitor *vis, void *arg)
{
    struct sfv_value v;

    p = *p == '(' ? parse_inner_list(p, &v) : parse_bare(p, &v);
    if (p && vis->member)
        vis->member(arg, item, &v);
    return p ? parse_params(p, item, vis, arg) : NULL;
}

int sfv_list_visit(const char *v, const struct sfv_visitor *vis, void *arg)
{
    const char *p = skip_sp(v);
    size_t item = 0;

    if (!*p)
        return 0; /* an empty List */
    for (;;) {
        p = parse_member(p, item++, vis, arg);
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

/* sfv_list_walk on the visitor: its one callback for parameters and ends. */
struct walk_adapter {
    sfv_param_fn fn;
    void *arg;
};

static void walk_param(void *arg, size_t item, const char *key, size_t klen,
                       const struct sfv_value *v)
{
    const struct walk_adapter *w = arg;

    w->fn(w->arg, item, key, klen, v->type == SFV_INTEGER, v->integer);
}

static void walk_end(void *arg, size_t item)
{
    const struct walk_adapter *w = arg;

    w->fn(w->arg, item, NULL, 0, false, 0);
}

int sfv_list_walk(const char *v, sfv_param_fn fn, void *arg)
{
    static const struct sfv_visitor vis = {NULL, walk_param, walk_end};
    struct walk_adapter w = {fn, arg};

    return sfv_list_visit(v, &vis, &w);
}

size_t sfv_string_copy(const struct sfv_value *v, char *buf, size_t len)
{
    size_t n = 0;

    if (len)
        buf[0] = '\0';
    if (v->type != SFV_STRING || v->len < 2)
        return 0;
    for (size_t i = 1; i + 1 < v->len; i++) {
        if (v->text[i] == '\\')
            i++;
        if (n + 1 < len)
            buf[n] = v->text[i];
        n++;
    }
    if (len)
        buf[n < len ? n : len - 1] = '\0';
    return n;
}
