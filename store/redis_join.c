/* Requests' commands joined into one script call (redis_join.h). The
 * commands are ours (redis_cmd.c, formatted by redis_format_argv), so
 * reading them back is splitting RESP bulks; anything else is refused,
 * never guessed at. */
#include "store/redis_join.h"

#include <stdio.h>
#include <string.h>

/* A verdict (a one-letter string) at el[0]: its letter, else 0. */
static char verdict(redisReply *const *el)
{
    const redisReply *v = el[0];

    return v->type == REDIS_REPLY_STRING && v->len == 1 ? v->str[0] : 0;
}

/* n elements when that many are left; else 0. */
static size_t have(size_t n, size_t left)
{
    return n <= left ? n : 0;
}

/* PERMIT_LEASE (redis_scripts.c): a fresh key's wait alone, or a verdict
 * and its fields. */
static size_t permit_lease_len(redisReply *const *el, size_t left)
{
    if (el[0]->type == REDIS_REPLY_INTEGER)
        return 1;
    switch (verdict(el)) {
    case 'M':
        return 1;
    case 'D':
    case 'X':
        return have(2, left);
    case 'A':
    case 'H':
        return have(3, left);
    case 'R':
        return have(4, left);
    default:
        return 0;
    }
}

/* COMPLETE: 'O', 'N', 'E', or 'S' or 'X' and the value. */
static size_t complete_len(redisReply *const *el, size_t left)
{
    switch (verdict(el)) {
    case 'O':
    case 'N':
    case 'E':
        return 1;
    case 'S':
    case 'X':
        return have(2, left);
    default:
        return 0;
    }
}

const struct redis_join_layout REDIS_JOIN_PERMIT_LEASE = {1, 1, 5, 2,
                                                          permit_lease_len};
const struct redis_join_layout REDIS_JOIN_COMPLETE = {0, 1, 0, 2, complete_len};

/* EVALSHA, the sha, the key count. */
#define HEAD_PARTS 3
/* The most parts a command of any layout has. */
#define PARTS_MAX 16

/* One bulk as formatted: raw from its '$' through its closing CRLF, and
 * its data. */
struct span {
    const char *raw, *data;
    size_t raw_len, len;
};

/* A command of a layout, split. */
struct split {
    struct span part[PARTS_MAX];
    unsigned keys, args; /* the key and argument counts */
};

/* The next bulk at *p (before end), or false. */
static bool bulk(const char **p, const char *end, struct span *out)
{
    const char *s = *p, *q = s;
    size_t n = 0;

    if (q >= end || *q++ != '$' || q >= end || *q < '0' || *q > '9')
        return false;
    while (q < end && *q >= '0' && *q <= '9') {
        n = n * 10 + (size_t)(*q++ - '0');
        if (n > (size_t)(end - s))
            return false;
    }
    if (end - q < 2 || q[0] != '\r' || q[1] != '\n')
        return false;
    q += 2;
    if ((size_t)(end - q) < n + 2 || q[n] != '\r' || q[n + 1] != '\n')
        return false;
    *out = (struct span){s, q, (size_t)(q + n + 2 - s), n};
    *p = q + n + 2;
    return true;
}

/* cmd, a command of layout l for one request, split; false when it is
 * not one. */
static bool split(const struct redis_join_layout *l, const char *cmd,
                  size_t len, struct split *sp)
{
    const char *p = cmd, *end = cmd + len;
    unsigned parts;
    char head[16], nkeys[16];
    int hn, kn;

    sp->keys = l->shared_keys + l->own_keys;
    sp->args = l->shared_args + l->own_args;
    parts = HEAD_PARTS + sp->keys + sp->args;
    if (parts > PARTS_MAX)
        return false;
    hn = snprintf(head, sizeof head, "*%u\r\n", parts);
    kn = snprintf(nkeys, sizeof nkeys, "%u", sp->keys);
    if (len < (size_t)hn || memcmp(p, head, (size_t)hn) != 0)
        return false;
    p += hn;
    for (unsigned i = 0; i < parts; i++)
        if (!bulk(&p, end, &sp->part[i]))
            return false;
    return p == end && sp->part[2].len == (size_t)kn &&
           memcmp(sp->part[2].data, nkeys, (size_t)kn) == 0;
}

static bool same(const struct span *x, const struct span *y)
{
    return x->len == y->len && memcmp(x->data, y->data, x->len) == 0;
}

/* A key's hash tag as Redis Cluster reads it: between its first '{' and
 * the first '}' after it, when that is not empty; else the whole key. */
static struct span tag(const struct span *k)
{
    const char *o = memchr(k->data, '{', k->len), *c;
    struct span t = *k;

    if (o && (c = memchr(o + 1, '}', (size_t)(k->data + k->len - o - 1))) &&
        c > o + 1) {
        t.data = o + 1;
        t.len = (size_t)(c - o - 1);
    }
    return t;
}

bool redis_join_fits(const struct redis_join_layout *l, const char *a,
                     size_t alen, const char *b, size_t blen)
{
    unsigned own = HEAD_PARTS + l->shared_keys, args;
    struct split x, y;

    if (!split(l, a, alen, &x) || !split(l, b, blen, &y))
        return false;
    args = HEAD_PARTS + x.keys;
    for (unsigned i = 0; i < own; i++) /* EVALSHA, sha, count, shared keys */
        if (!same(&x.part[i], &y.part[i]))
            return false;
    for (unsigned i = own; i < args; i++) { /* own keys: their slot */
        struct span tx = tag(&x.part[i]), ty = tag(&y.part[i]);

        if (!same(&tx, &ty))
            return false;
    }
    for (unsigned i = args; i < args + l->shared_args; i++)
        if (!same(&x.part[i], &y.part[i]))
            return false;
    return true;
}

/* Appends s at *w when it fits before end; counts it either way. */
static void put(char **w, const char *end, size_t *total, const void *s,
                size_t len)
{
    if (*w && (size_t)(end - *w) >= len) {
        memcpy(*w, s, len);
        *w += len;
    } else {
        *w = NULL; /* it does not fit: only counting from here */
    }
    *total += len;
}

/* Parts [from, from + count) of sp. */
static void put_parts(char **w, const char *end, size_t *total,
                      const struct split *sp, unsigned from, unsigned count)
{
    for (unsigned i = from; i < from + count; i++)
        put(w, end, total, sp->part[i].raw, sp->part[i].raw_len);
}

size_t redis_join(const struct redis_join_layout *l, char *out, size_t cap,
                  const char *const cmd[], const size_t len[], unsigned n)
{
    struct split sp[REDIS_JOIN_MAX];
    unsigned keys = l->shared_keys + n * l->own_keys;
    /* where each kind of part starts in a command for one request */
    unsigned at_own_keys = HEAD_PARTS + l->shared_keys;
    unsigned at_shared_args = at_own_keys + l->own_keys;
    unsigned at_own_args = at_shared_args + l->shared_args;
    char head[32], nkeys[32], digits[16];
    char *w = out;
    const char *end = out + cap;
    size_t total = 0;
    int hn, kn, dn;

    if (n < 1 || n > REDIS_JOIN_MAX)
        return 0;
    for (unsigned i = 0; i < n; i++)
        if (!split(l, cmd[i], len[i], &sp[i]))
            return 0;
    hn = snprintf(head, sizeof head, "*%u\r\n",
                  HEAD_PARTS + keys + l->shared_args + n * l->own_args);
    dn = snprintf(digits, sizeof digits, "%u", keys);
    kn = snprintf(nkeys, sizeof nkeys, "$%d\r\n%s\r\n", dn, digits);
    put(&w, end, &total, head, (size_t)hn);
    put_parts(&w, end, &total, &sp[0], 0, 2); /* EVALSHA, sha */
    put(&w, end, &total, nkeys, (size_t)kn);
    put_parts(&w, end, &total, &sp[0], HEAD_PARTS, l->shared_keys);
    for (unsigned i = 0; i < n; i++)
        put_parts(&w, end, &total, &sp[i], at_own_keys, l->own_keys);
    put_parts(&w, end, &total, &sp[0], at_shared_args, l->shared_args);
    for (unsigned i = 0; i < n; i++)
        put_parts(&w, end, &total, &sp[i], at_own_args, l->own_args);
    return total;
}

bool redis_join_split(const struct redis_join_layout *l, const redisReply *r,
                      unsigned n, redisReply part[])
{
    size_t at = 0, len;

    if (r->type != REDIS_REPLY_ARRAY || n < 1 || n > REDIS_JOIN_MAX)
        return false;
    for (unsigned i = 0; i < n; i++) {
        if (at >= r->elements ||
            !(len = l->answer_len(r->element + at, r->elements - at)))
            return false;
        part[i] = (redisReply){.type = REDIS_REPLY_ARRAY,
                               .elements = len,
                               .element = r->element + at};
        at += len;
    }
    return at == r->elements;
}
