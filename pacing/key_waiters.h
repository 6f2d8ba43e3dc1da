/* The requests of one event loop that wait for another's lease on their key
 * (duplicates: wait in fleet mode, docs/contract.md §6), by (scope, key), so
 * that the store's notice that a key's lease has ended wakes exactly that
 * key's waiters. One per loop; the loop adds and removes its own waiters,
 * the store's subscriber thread wakes them: a mutex guards the table, and
 * a waiter's wake runs under it (it must only post an event to the
 * waiter's loop). */
#ifndef SLUICE_PACING_KEY_WAITERS_H
#define SLUICE_PACING_KEY_WAITERS_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>

#define KEY_WAITERS_BUCKETS 256u

/* One waiting request, embedded in it. scope and key are borrowed: they
 * must stay unchanged while the waiter is in a table. */
struct key_waiter {
    LIST_ENTRY(key_waiter) link;
    const char *scope, *key;
    uint32_t hash;
    bool in;                    /* in a table */
    void (*wake)(struct key_waiter *w); /* under the table's lock */
    void *arg;
};

LIST_HEAD(key_waiter_list, key_waiter);

struct key_waiters {
    pthread_mutex_t mu;
    struct key_waiter_list bucket[KEY_WAITERS_BUCKETS];
    size_t count;
};

void key_waiters_init(struct key_waiters *t);
/* The table must be empty (every waiter removed). */
void key_waiters_destroy(struct key_waiters *t);

/* Adds w (wake and arg set) for (scope, key); nothing if it is in already. */
void key_waiters_add(struct key_waiters *t, struct key_waiter *w,
                     const char *scope, const char *key);
/* Removes w; nothing if it is not in. Once it returns, w's wake does not
 * run (it may have run just before). */
void key_waiters_remove(struct key_waiters *t, struct key_waiter *w);

/* Wakes every waiter of (scope, key), which stay in the table (each leaves
 * when its request stops waiting); the number woken. Any thread. */
size_t key_waiters_wake(struct key_waiters *t, const char *scope,
                        const char *key);

/* The waiters in the table now. */
size_t key_waiters_count(struct key_waiters *t);

#endif
