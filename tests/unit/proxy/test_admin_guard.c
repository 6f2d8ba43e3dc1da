/* Who may send the admin requests that change state: loopback peers, or
 * anyone with the bearer token once admin_token is set. Addresses are built
 * by hand, so the network case needs no network. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

#include "proxy/admin_guard.h"

static struct sockaddr_storage addr(const char *text)
{
    struct sockaddr_storage ss;

    memset(&ss, 0, sizeof ss);
    if (strchr(text, ':')) {
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
        s6->sin6_family = AF_INET6;
        cr_assert_eq(inet_pton(AF_INET6, text, &s6->sin6_addr), 1, "%s", text);
    } else {
        struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
        s4->sin_family = AF_INET;
        cr_assert_eq(inet_pton(AF_INET, text, &s4->sin_addr), 1, "%s", text);
    }
    return ss;
}

static bool loopback(const char *text)
{
    struct sockaddr_storage ss = addr(text);

    return admin_peer_loopback((const struct sockaddr *)&ss);
}

static enum admin_access access_of(const char *text, const char *auth, const char *token)
{
    struct sockaddr_storage ss = addr(text);

    return admin_peer_trusted((const struct sockaddr *)&ss, auth, token);
}

Test(admin_guard, loopback_addresses)
{
    cr_expect(loopback("127.0.0.1"));
    cr_expect(loopback("127.8.9.10"), "all of 127.0.0.0/8");
    cr_expect(loopback("::1"));
    cr_expect(loopback("::ffff:127.0.0.1"), "IPv4-mapped loopback");
    cr_expect(loopback("::ffff:127.200.0.1"));
}

Test(admin_guard, other_addresses)
{
    cr_expect_not(loopback("10.0.0.1"));
    cr_expect_not(loopback("192.0.2.1"));
    cr_expect_not(loopback("128.0.0.1"));
    cr_expect_not(loopback("0.0.0.0"));
    cr_expect_not(loopback("::"));
    cr_expect_not(loopback("::2"));
    cr_expect_not(loopback("2001:db8::1"));
    cr_expect_not(loopback("::ffff:10.0.0.1"), "IPv4-mapped, not loopback");
    cr_expect_not(loopback("::127.0.0.1"), "IPv4-compatible is not mapped");
    cr_expect_not(loopback("fe80::1"));
    cr_expect_not(admin_peer_loopback(NULL));
}

Test(admin_guard, without_token_only_loopback)
{
    cr_expect_eq(access_of("127.0.0.1", NULL, ""), ADMIN_ALLOWED);
    cr_expect_eq(access_of("::1", NULL, NULL), ADMIN_ALLOWED);
    cr_expect_eq(access_of("::ffff:127.0.0.1", NULL, ""), ADMIN_ALLOWED);
    cr_expect_eq(access_of("10.0.0.1", NULL, ""), ADMIN_NOT_LOOPBACK);
    cr_expect_eq(access_of("192.0.2.1", "Bearer anything", ""), ADMIN_NOT_LOOPBACK,
                 "a token sent while none is configured opens nothing");
    cr_expect_eq(admin_peer_trusted(NULL, NULL, ""), ADMIN_NOT_LOOPBACK);
}

Test(admin_guard, with_token_everyone_needs_it)
{
    const char *tok = "s3cr3t-token";

    cr_expect_eq(access_of("127.0.0.1", NULL, tok), ADMIN_TOKEN_MISSING,
                 "loopback included");
    cr_expect_eq(access_of("10.0.0.1", NULL, tok), ADMIN_TOKEN_MISSING);
    cr_expect_eq(access_of("10.0.0.1", "Bearer s3cr3t-token", tok), ADMIN_ALLOWED);
    cr_expect_eq(access_of("192.0.2.1", "bearer  s3cr3t-token", tok), ADMIN_ALLOWED,
                 "scheme is case-insensitive");
    cr_expect_eq(access_of("::1", "Bearer s3cr3t-token", tok), ADMIN_ALLOWED);
    cr_expect_eq(access_of("127.0.0.1", "Bearer s3cr3t-toke", tok), ADMIN_TOKEN_WRONG);
    cr_expect_eq(access_of("127.0.0.1", "Bearer s3cr3t-token2", tok), ADMIN_TOKEN_WRONG);
    cr_expect_eq(access_of("127.0.0.1", "Bearer ", tok), ADMIN_TOKEN_WRONG);
    cr_expect_eq(access_of("127.0.0.1", "Basic czNjcjN0LXRva2Vu", tok), ADMIN_TOKEN_MISSING);
    cr_expect_eq(access_of("127.0.0.1", "s3cr3t-token", tok), ADMIN_TOKEN_MISSING);
}

Test(admin_guard, reasons_are_one_line)
{
    for (int a = ADMIN_NOT_LOOPBACK; a <= ADMIN_TOKEN_WRONG; a++) {
        const char *why = admin_access_why((enum admin_access)a);
        cr_expect(why && *why && !strpbrk(why, "\r\n\""), "%d", a);
    }
}
