/* Replies built in an arena (redis_arena.h). */
#include "store/redis_arena.h"

#include <stdlib.h>
#include <string.h>

#define ARENA_CHUNK 4096
/* A chunk made for one large reply (a record's body) is not kept. */
#define ARENA_KEEP_MAX (64 * 1024)

/* Bump allocation for one reply at a time; chunks kept across replies. */
struct redis_arena_chunk {
    struct redis_arena_chunk *next;
    size_t cap, used;
    max_align_t data[];
};

static void *arena_alloc(struct redis_arena *a, size_t n)
{
    struct redis_arena_chunk *c = a->cur;

    n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    while (c && c->cap - c->used < n)
        c = c->next;
    if (!c) {
        size_t cap = n > ARENA_CHUNK ? n : ARENA_CHUNK;

        if (!(c = malloc(sizeof *c + cap)))
            return NULL;
        *c = (struct redis_arena_chunk){.next = NULL, .cap = cap};
        /* Appended: the chunks before keep what this reply holds. */
        if (a->cur) {
            c->next = a->cur->next;
            a->cur->next = c;
        } else {
            c->next = a->first;
            a->first = c;
        }
    }
    a->cur = c;
    c->used += n;
    return (char *)c->data + c->used - n;
}

/* After a reply's callback: every chunk empty again, large ones freed. */
void redis_arena_reset(struct redis_arena *a)
{
    struct redis_arena_chunk **p = &a->first;

    while (*p) {
        struct redis_arena_chunk *c = *p;

        if (c->cap > ARENA_KEEP_MAX) {
            *p = c->next;
            free(c);
            continue;
        }
        c->used = 0;
        p = &c->next;
    }
    a->cur = a->first;
}

void redis_arena_free(struct redis_arena *a)
{
    while (a->first) {
        struct redis_arena_chunk *c = a->first;

        a->first = c->next;
        free(c);
    }
    a->cur = NULL;
}

/* The arena of a reply being read: the root task's privdata (hiredis sets
 * only the root's from the reader's). */
static struct redis_arena *task_arena(const redisReadTask *t)
{
    while (t->parent)
        t = t->parent;
    return t->privdata;
}

/* hiredis's reader builds replies with these: the same redisReply shapes
 * as its own, from the arena. */
static redisReply *reply_new(const redisReadTask *t, int type)
{
    redisReply *r;

    if (!(r = arena_alloc(task_arena(t), sizeof *r)))
        return NULL;
    memset(r, 0, sizeof *r);
    r->type = type;
    if (t->parent) {
        redisReply *parent = t->parent->obj;

        parent->element[t->idx] = r;
    }
    return r;
}

static void *arena_string(const redisReadTask *t, char *s, size_t len)
{
    char *copy = arena_alloc(task_arena(t), len + 1);
    redisReply *r;

    if (!copy || !(r = reply_new(t, t->type)))
        return NULL;
    memcpy(copy, s, len);
    copy[len] = '\0';
    r->str = copy;
    r->len = len;
    return r;
}

static void *arena_array(const redisReadTask *t, int n)
{
    redisReply **el = NULL;
    redisReply *r;

    if (n > 0 && !(el = arena_alloc(task_arena(t), (size_t)n * sizeof *el)))
        return NULL;
    if (!(r = reply_new(t, REDIS_REPLY_ARRAY)))
        return NULL;
    if (n > 0)
        memset(el, 0, (size_t)n * sizeof *el);
    r->elements = n > 0 ? (size_t)n : 0;
    r->element = el;
    return r;
}

static void *arena_integer(const redisReadTask *t, long long v)
{
    redisReply *r = reply_new(t, REDIS_REPLY_INTEGER);

    if (r)
        r->integer = v;
    return r;
}

static void *arena_nil(const redisReadTask *t)
{
    return reply_new(t, REDIS_REPLY_NIL);
}

static void arena_nofree(void *obj)
{
    (void)obj; /* the arena is emptied after the reply's callback */
}

static redisReplyObjectFunctions arena_fns = {
    arena_string, arena_array, arena_integer, arena_nil, arena_nofree,
};

void redis_arena_use(struct redis_arena *a, redisReader *r)
{
    r->fn = &arena_fns;
    r->privdata = a;
}
