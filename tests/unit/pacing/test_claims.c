/* In-memory claims on idempotency keys. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#include "pacing/claims.h"

static struct claims c;

static void setup(void)
{
    cr_assert_eq(claims_init(&c), 0);
}

static void teardown(void)
{
    claims_free(&c);
}

TestSuite(claims, .init = setup, .fini = teardown);

Test(claims, one_holder_per_key_and_scope)
{
    uint64_t rem = 0;

    cr_expect(claims_take(&c, "p", "k", 1000, 3000, 5000, &rem));
    cr_expect_not(claims_take(&c, "p", "k", 2000, 4000, 5000, &rem));
    /* The holder may wait until 3000 and then take 5000 upstream. */
    cr_expect_eq(rem, 6000);
    cr_expect(claims_take(&c, "q", "k", 2000, 4000, 5000, &rem), "other scope");
    cr_expect(claims_take(&c, "p", "k2", 2000, 4000, 5000, &rem), "other key");
    claims_forwarded(&c, "p", "k", 10000);
    cr_expect_not(claims_take(&c, "p", "k", 4000, 4000, 5000, &rem));
    cr_expect_eq(rem, 6000, "the lease's end once forwarded");
    claims_drop(&c, "p", "k");
    cr_expect(claims_take(&c, "p", "k", 5000, 5000, 5000, &rem), "dropped");
}

Test(claims, many_keys_grow_the_table)
{
    char key[32];
    uint64_t rem;

    for (int i = 0; i < 5000; i++) {
        snprintf(key, sizeof key, "key-%d", i);
        cr_assert(claims_take(&c, "p", key, 0, 0, 0, &rem));
    }
    for (int i = 0; i < 5000; i += 7) {
        snprintf(key, sizeof key, "key-%d", i);
        cr_assert_not(claims_take(&c, "p", key, 0, 0, 0, &rem));
    }
    for (int i = 0; i < 5000; i++) {
        snprintf(key, sizeof key, "key-%d", i);
        claims_drop(&c, "p", key);
    }
    cr_expect_eq(c.count, 0);
}

static atomic_int winners;

static void *racer(void *arg)
{
    uint64_t rem;

    (void)arg;
    if (claims_take(&c, "p", "contended", 0, 0, 0, &rem))
        atomic_fetch_add(&winners, 1);
    return NULL;
}

Test(claims, exactly_one_winner_across_threads)
{
    pthread_t t[16];

    atomic_store(&winners, 0);
    for (int i = 0; i < 16; i++)
        pthread_create(&t[i], NULL, racer, NULL);
    for (int i = 0; i < 16; i++)
        pthread_join(t[i], NULL);
    cr_expect_eq(atomic_load(&winners), 1);
}
