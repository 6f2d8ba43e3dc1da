#include "pacing/claims.h"
#include "util/hash.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct claim {
    char *scope, *key;
    uint64_t busy_until_ns;     /* when the holder is done at the latest */
    struct claim *next;
};

#define CLAIMS_INITIAL 1024

/* The scope and the key, apart (a separator no key holds). */
static uint64_t hash2(const char *a, const char *b)
{
    return hash_str(hash_bytes(hash_str(HASH_INIT, a), "\xff", 1), b);
}

int claims_init(struct claims *c)
{
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    c->size = CLAIMS_INITIAL;
    c->table = calloc(c->size, sizeof *c->table);
    return c->table ? 0 : -ENOMEM;
}

void claims_free(struct claims *c)
{
    for (size_t i = 0; c->table && i < c->size; i++)
        while (c->table[i]) {
            struct claim *n = c->table[i]->next;
            free(c->table[i]->scope);
            free(c->table[i]->key);
            free(c->table[i]);
            c->table[i] = n;
        }
    free(c->table);
    pthread_mutex_destroy(&c->mu);
    memset(c, 0, sizeof *c);
}

static struct claim **find(struct claims *c, const char *scope, const char *key)
{
    struct claim **pp = &c->table[hash2(scope, key) & (c->size - 1)];

    while (*pp && (strcmp((*pp)->key, key) || strcmp((*pp)->scope, scope)))
        pp = &(*pp)->next;
    return pp;
}

/* Keeps chains short as in-flight keys grow; claims are few (in flight only). */
static void grow(struct claims *c)
{
    size_t n = c->size * 2;
    struct claim **t = calloc(n, sizeof *t);

    if (!t)
        return;
    for (size_t i = 0; i < c->size; i++)
        while (c->table[i]) {
            struct claim *e = c->table[i];
            size_t s = hash2(e->scope, e->key) & (n - 1);
            c->table[i] = e->next;
            e->next = t[s];
            t[s] = e;
        }
    free(c->table);
    c->table = t;
    c->size = n;
}

bool claims_take(struct claims *c, const char *scope, const char *key,
                 uint64_t now_ns, uint64_t wait_deadline_ns, uint64_t timeout_ns,
                 uint64_t *remaining_ns)
{
    struct claim **pp, *e;
    bool ok = true;

    pthread_mutex_lock(&c->mu);
    pp = find(c, scope, key);
    if (*pp) {
        *remaining_ns = (*pp)->busy_until_ns > now_ns ? (*pp)->busy_until_ns - now_ns : 0;
        ok = false;
    } else if ((e = calloc(1, sizeof *e)) && (e->scope = strdup(scope)) &&
               (e->key = strdup(key))) {
        e->busy_until_ns = wait_deadline_ns + timeout_ns;
        *pp = e;
        if (++c->count > c->size)
            grow(c);
    } else {
        /* Out of memory: refuse rather than risk a duplicate. */
        if (e) {
            free(e->scope);
            free(e);
        }
        *remaining_ns = timeout_ns;
        ok = false;
    }
    pthread_mutex_unlock(&c->mu);
    return ok;
}

void claims_forwarded(struct claims *c, const char *scope, const char *key,
                      uint64_t lease_end_ns)
{
    struct claim **pp;

    pthread_mutex_lock(&c->mu);
    pp = find(c, scope, key);
    if (*pp)
        (*pp)->busy_until_ns = lease_end_ns;
    pthread_mutex_unlock(&c->mu);
}

void claims_drop(struct claims *c, const char *scope, const char *key)
{
    struct claim **pp, *e;

    pthread_mutex_lock(&c->mu);
    pp = find(c, scope, key);
    if ((e = *pp)) {
        *pp = e->next;
        c->count--;
        free(e->scope);
        free(e->key);
        free(e);
    }
    pthread_mutex_unlock(&c->mu);
}
