/* policies/sfv.c: the RFC 8941 List visitor under the quota headers
 * (RateLimit-Policy, RateLimit): each member's bare item with its type and
 * text, its parameters with theirs, in order; Strings unescaped; a List that
 * does not parse refused. (The older walker is tested through the reset
 * hints, test_backoff.c.) */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "policies/sfv.h"

/* Everything the visitor said, as one line: "m0:T:text p0:key=T:text e0". */
struct log {
    char s[1024];
    size_t n;
};

static const char type_char[] = "IDSTXBLK";

/* "m0:T:text " for a member, "p0:key=T:text " for a parameter. */
static void say(struct log *l, char what, size_t item, const char *key,
                size_t klen, const struct sfv_value *v)
{
    l->n += (size_t)snprintf(l->s + l->n, sizeof l->s - l->n, "%c%zu%s%.*s%s%c:%.*s ",
                             what, item, key ? ":" : "", (int)klen, key ? key : "",
                             key ? "=" : ":", type_char[v->type], (int)v->len,
                             v->text ? v->text : "");
}

static void on_member(void *arg, size_t item, const struct sfv_value *v)
{
    say(arg, 'm', item, NULL, 0, v);
}

static void on_param(void *arg, size_t item, const char *key, size_t klen,
                     const struct sfv_value *v)
{
    say(arg, 'p', item, key, klen, v);
}

static void on_end(void *arg, size_t item)
{
    struct log *l = arg;

    l->n += (size_t)snprintf(l->s + l->n, sizeof l->s - l->n, "e%zu ", item);
}

static const struct sfv_visitor vis = {on_member, on_param, on_end};

static int visit(const char *v, struct log *l)
{
    memset(l, 0, sizeof *l);
    return sfv_list_visit(v, &vis, l);
}

Test(sfv, members_and_parameters_with_types_and_texts)
{
    struct log l;

    cr_assert_eq(visit("\"burst\";q=100;w=1, \"day\";q=1000;w=86400", &l), 0);
    cr_expect_str_eq(l.s, "m0:S:\"burst\" p0:q=I:100 p0:w=I:1 e0 "
                          "m1:S:\"day\" p1:q=I:1000 p1:w=I:86400 e1 ");
    cr_assert_eq(visit("tok;r=0.5;t=-3;x;y=?1;z=:YQ==:, 7", &l), 0);
    cr_expect_str_eq(l.s, "m0:T:tok p0:r=D:0.5 p0:t=I:-3 p0:x=K: p0:y=B:?1 "
                          "p0:z=X::YQ==: e0 m1:I:7 e1 ");
}

Test(sfv, inner_lists_are_one_member)
{
    struct log l;

    cr_assert_eq(visit("(\"a\" b;c=1);q=5, d", &l), 0);
    cr_expect_str_eq(l.s, "m0:L:(\"a\" b;c=1) p0:q=I:5 e0 m1:T:d e1 ");
}

static void keep_integer(void *arg, size_t item, const char *key, size_t klen,
                         const struct sfv_value *v)
{
    *(int64_t *)arg = v->type == SFV_INTEGER ? v->integer : -1;
}

Test(sfv, integers_carry_their_value_up_to_15_digits)
{
    struct sfv_visitor v = {NULL, keep_integer, NULL};
    int64_t got = 0;
    struct log l;

    cr_assert_eq(sfv_list_visit("x;r=999999999999999", &v, &got), 0);
    cr_expect_eq(got, 999999999999999);
    cr_assert_eq(sfv_list_visit("x;r=-42", &v, &got), 0);
    cr_expect_eq(got, -42);
    cr_assert_eq(sfv_list_visit("x;r=4.2", &v, &got), 0);
    cr_expect_eq(got, -1, "a Decimal is no Integer");
    cr_expect_eq(visit("x;r=1000000000000000", &l), -EINVAL, "16 digits");
}

Test(sfv, strings_are_unescaped)
{
    struct sfv_value v = {SFV_STRING, "\"a\\\"b\\\\c\"", 9, 0};
    char buf[16];

    cr_expect_eq(sfv_string_copy(&v, buf, sizeof buf), 5);
    cr_expect_str_eq(buf, "a\"b\\c");
    cr_expect_eq(sfv_string_copy(&v, buf, 3), 5, "the whole length");
    cr_expect_str_eq(buf, "a\"");
    v.type = SFV_TOKEN;
    cr_expect_eq(sfv_string_copy(&v, buf, sizeof buf), 0);
    cr_expect_str_eq(buf, "");
}

Test(sfv, malformed_lists_are_refused)
{
    static const char *const bad[] = {
        "a,", "a,,b", "\"unterminated", "a;R=1", "a;r=", "(a", "(a b", "1.2345",
        "1234567890123.1", "a b", ";r=1", "\"\x01\"", "?2",
    };
    struct log l;

    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_expect_eq(visit(bad[i], &l), -EINVAL, "\"%s\"", bad[i]);
    cr_expect_eq(visit("", &l), 0, "an empty List");
    cr_expect_eq(visit("   ", &l), 0);
    cr_expect_str_eq(l.s, "");
}

/* The older walker is the visitor underneath: same items, same values. */
static void count_param(void *arg, size_t item, const char *key, size_t klen,
                        bool is_int, int64_t value)
{
    int64_t *sum = arg;

    if (key && is_int)
        *sum += value;
}

Test(sfv, the_walker_agrees)
{
    int64_t sum = 0;

    cr_expect_eq(sfv_list_walk("a;r=1;t=2, b;r=3;x=0.5;y", count_param, &sum), 0);
    cr_expect_eq(sum, 6);
}
