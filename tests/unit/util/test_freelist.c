/* Spare blocks (util/freelist.c): a kept block comes back zeroed, most
 * recently kept first; no more than max are kept, the rest freed; clear
 * frees what is kept (ASan's leak check in the sanitizer build). */
#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

#include "util/freelist.h"

static bool all_zero(const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return false;
    return true;
}

Test(freelist, a_kept_block_comes_back_zeroed)
{
    struct freelist fl;
    unsigned char *a, *b;

    freelist_init(&fl, 1500, 4);
    a = freelist_take(&fl);
    cr_assert_not_null(a);
    cr_assert(all_zero(a, 1500));
    memset(a, 0xab, 1500);
    freelist_give(&fl, a);
    cr_assert_eq(fl.n, 1);
    b = freelist_take(&fl);
    cr_assert_eq(b, a, "the kept block is reused");
    cr_assert(all_zero(b, 1500), "and zeroed, the link word included");
    cr_assert_eq(fl.n, 0);
    freelist_give(&fl, b);
    freelist_clear(&fl);
    cr_assert_eq(fl.n, 0);
    cr_assert_null(fl.head);
}

Test(freelist, keeps_at_most_max_and_the_newest_first)
{
    struct freelist fl;
    void *p[6];

    freelist_init(&fl, 64, 3);
    for (int i = 0; i < 6; i++)
        cr_assert_not_null(p[i] = freelist_take(&fl));
    for (int i = 0; i < 6; i++)
        freelist_give(&fl, p[i]); /* p[3..5] are freed, not kept */
    cr_assert_eq(fl.n, 3);
    cr_assert_eq(freelist_take(&fl), p[2]);
    cr_assert_eq(freelist_take(&fl), p[1]);
    cr_assert_eq(freelist_take(&fl), p[0]);
    cr_assert_eq(fl.n, 0);
    for (int i = 0; i < 3; i++)
        free(p[i]);
}

Test(freelist, nothing_kept_with_max_zero_and_null_is_ignored)
{
    struct freelist fl;
    void *p;

    freelist_init(&fl, 8, 0);
    p = freelist_take(&fl);
    cr_assert_not_null(p);
    freelist_give(&fl, p);
    freelist_give(&fl, NULL);
    cr_assert_eq(fl.n, 0);
    cr_assert_null(fl.head);
}

Test(freelist, an_uninitialised_list_gives_nothing)
{
    struct freelist fl = {0};

    cr_assert_null(freelist_take(&fl), "not a block of 0 bytes");
}

Test(freelist, a_block_holds_at_least_its_link)
{
    struct freelist fl;
    void *p;

    freelist_init(&fl, 1, 2);
    cr_assert_eq(fl.size, sizeof (void *));
    p = freelist_take(&fl);
    freelist_give(&fl, p);
    cr_assert_eq(freelist_take(&fl), p);
    freelist_give(&fl, p);
    freelist_clear(&fl);
}
