#include "pacing/key_waiters.h"

#include <string.h>

/* FNV-1a over scope, a 0 byte and key: the 0 keeps ("ab", "c") and
 * ("a", "bc") apart, as the store's record keys do. */
static uint32_t hash_of(const char *scope, const char *key)
{
    uint32_t h = 2166136261u;

    for (const char *p = scope; *p; p++)
        h = (h ^ (uint8_t)*p) * 16777619u;
    h *= 16777619u;
    for (const char *p = key; *p; p++)
        h = (h ^ (uint8_t)*p) * 16777619u;
    return h;
}

void key_waiters_init(struct key_waiters *t)
{
    pthread_mutex_init(&t->mu, NULL);
    for (unsigned i = 0; i < KEY_WAITERS_BUCKETS; i++)
        LIST_INIT(&t->bucket[i]);
    t->count = 0;
}

void key_waiters_destroy(struct key_waiters *t)
{
    pthread_mutex_destroy(&t->mu);
}

void key_waiters_add(struct key_waiters *t, struct key_waiter *w,
                     const char *scope, const char *key)
{
    pthread_mutex_lock(&t->mu);
    if (!w->in) {
        w->scope = scope;
        w->key = key;
        w->hash = hash_of(scope, key);
        LIST_INSERT_HEAD(&t->bucket[w->hash % KEY_WAITERS_BUCKETS], w, link);
        w->in = true;
        t->count++;
    }
    pthread_mutex_unlock(&t->mu);
}

void key_waiters_remove(struct key_waiters *t, struct key_waiter *w)
{
    pthread_mutex_lock(&t->mu);
    if (w->in) {
        LIST_REMOVE(w, link);
        w->in = false;
        t->count--;
    }
    pthread_mutex_unlock(&t->mu);
}

size_t key_waiters_wake(struct key_waiters *t, const char *scope,
                        const char *key)
{
    uint32_t h = hash_of(scope, key);
    struct key_waiter *w;
    size_t n = 0;

    pthread_mutex_lock(&t->mu);
    LIST_FOREACH(w, &t->bucket[h % KEY_WAITERS_BUCKETS], link) {
        if (w->hash != h || strcmp(w->key, key) != 0 || strcmp(w->scope, scope) != 0)
            continue;
        w->wake(w);
        n++;
    }
    pthread_mutex_unlock(&t->mu);
    return n;
}

size_t key_waiters_count(struct key_waiters *t)
{
    size_t n;

    pthread_mutex_lock(&t->mu);
    n = t->count;
    pthread_mutex_unlock(&t->mu);
    return n;
}
