/* The per-loop registry of requests waiting for another's lease on their
 * key: a notice wakes exactly that key's waiters. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "pacing/key_waiters.h"

static struct key_waiters t;

struct waiter {
    struct key_waiter w;
    int woken;
};

static void on_wake(struct key_waiter *w)
{
    ((struct waiter *)w->arg)->woken++;
}

static void waiter_init(struct waiter *x)
{
    memset(x, 0, sizeof *x);
    x->w.wake = on_wake;
    x->w.arg = x;
}

static void setup(void)
{
    key_waiters_init(&t);
}

static void teardown(void)
{
    key_waiters_destroy(&t);
}

TestSuite(key_waiters, .init = setup, .fini = teardown);

Test(key_waiters, many_waiters_of_one_key_all_woken)
{
    struct waiter x[50];

    for (int i = 0; i < 50; i++) {
        waiter_init(&x[i]);
        key_waiters_add(&t, &x[i].w, "pay", "k1");
    }
    cr_expect_eq(key_waiters_count(&t), 50);
    cr_expect_eq(key_waiters_wake(&t, "pay", "k1"), 50);
    for (int i = 0; i < 50; i++)
        cr_expect_eq(x[i].woken, 1, "waiter %d woken once", i);
    /* They stay until they leave: a second notice wakes them again. */
    cr_expect_eq(key_waiters_wake(&t, "pay", "k1"), 50);
    for (int i = 0; i < 50; i++)
        key_waiters_remove(&t, &x[i].w);
    cr_expect_eq(key_waiters_count(&t), 0);
}

Test(key_waiters, two_keys_and_two_scopes_apart)
{
    struct waiter a, b, c, d;

    waiter_init(&a), waiter_init(&b), waiter_init(&c), waiter_init(&d);
    key_waiters_add(&t, &a.w, "pay", "k1");
    key_waiters_add(&t, &b.w, "pay", "k2");
    key_waiters_add(&t, &c.w, "ship", "k1");
    /* ("pa", "yk1") must not be ("pay", "k1"). */
    key_waiters_add(&t, &d.w, "pa", "yk1");
    cr_expect_eq(key_waiters_wake(&t, "pay", "k1"), 1);
    cr_expect_eq(a.woken, 1);
    cr_expect_eq(b.woken + c.woken + d.woken, 0);
    cr_expect_eq(key_waiters_wake(&t, "pay", "k2"), 1);
    cr_expect_eq(b.woken, 1);
    cr_expect_eq(key_waiters_wake(&t, "pay", "nobody"), 0);
    cr_expect_eq(a.woken + c.woken + d.woken, 1);
    key_waiters_remove(&t, &a.w), key_waiters_remove(&t, &b.w);
    key_waiters_remove(&t, &c.w), key_waiters_remove(&t, &d.w);
}

Test(key_waiters, a_waiter_that_left_is_not_woken)
{
    struct waiter a, b;

    waiter_init(&a), waiter_init(&b);
    key_waiters_add(&t, &a.w, "pay", "k1");
    key_waiters_add(&t, &b.w, "pay", "k1");
    key_waiters_add(&t, &a.w, "pay", "k1"); /* in already: nothing */
    cr_expect_eq(key_waiters_count(&t), 2);
    key_waiters_remove(&t, &a.w);
    key_waiters_remove(&t, &a.w); /* out already: nothing */
    cr_expect_eq(key_waiters_wake(&t, "pay", "k1"), 1);
    cr_expect_eq(a.woken, 0);
    cr_expect_eq(b.woken, 1);
    key_waiters_remove(&t, &b.w);
    cr_expect_eq(key_waiters_wake(&t, "pay", "k1"), 0);
    cr_expect_eq(key_waiters_count(&t), 0);
}

/* Many keys share the 256 buckets: each notice still finds only its key. */
Test(key_waiters, colliding_buckets_hold_their_own_keys)
{
    static struct waiter x[2000];
    static char keys[2000][16];

    for (int i = 0; i < 2000; i++) {
        waiter_init(&x[i]);
        snprintf(keys[i], sizeof keys[i], "key-%d", i);
        key_waiters_add(&t, &x[i].w, "pay", keys[i]);
    }
    for (int i = 0; i < 2000; i += 3)
        cr_expect_eq(key_waiters_wake(&t, "pay", keys[i]), 1, "%s", keys[i]);
    for (int i = 0; i < 2000; i++) {
        cr_expect_eq(x[i].woken, i % 3 == 0, "%s", keys[i]);
        key_waiters_remove(&t, &x[i].w);
    }
}

/* The subscriber's thread wakes while the loop adds and removes. */
static void *waker(void *arg)
{
    for (int i = 0; i < 20000; i++)
        key_waiters_wake(&t, "pay", "hot");
    return NULL;
}

Test(key_waiters, wakes_from_another_thread_while_waiters_come_and_go)
{
    struct waiter x[8];
    pthread_t th;

    for (int i = 0; i < 8; i++)
        waiter_init(&x[i]);
    cr_assert_eq(pthread_create(&th, NULL, waker, NULL), 0);
    for (int round = 0; round < 20000; round++) {
        struct waiter *w = &x[round % 8];

        if (w->w.in)
            key_waiters_remove(&t, &w->w);
        else
            key_waiters_add(&t, &w->w, "pay", "hot");
    }
    pthread_join(th, NULL);
    for (int i = 0; i < 8; i++)
        key_waiters_remove(&t, &x[i].w);
    cr_expect_eq(key_waiters_count(&t), 0);
}
