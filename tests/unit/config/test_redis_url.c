/* config/redis_url.c: store.url, with its defaults, TLS (rediss://), ACL
 * users, and its refusals (no password in a message). */
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#include "config/config.h"


Test(redis_url, full_and_defaults)
{
    struct sc_redis_url o = {0};
    struct sc_error e;
    char buf[256];

    cr_assert_eq(config_redis_url_parse("redis://:p%40ss@cache.local:6380/2", &o, buf,
                                        sizeof buf, &e), 0, "%s", e.text);
    cr_expect_str_eq(o.host, "cache.local");
    cr_expect_eq(o.port, 6380);
    cr_expect_str_eq(o.password, "p@ss");
    cr_expect_eq(o.db, 2);
    cr_assert_eq(config_redis_url_parse("redis://sluice-redis", &o, buf, sizeof buf, &e), 0);
    cr_expect_str_eq(o.host, "sluice-redis");
    cr_expect_eq(o.port, 6379);
    cr_expect_null(o.password);
    cr_expect_eq(o.db, 0);
    cr_assert_eq(config_redis_url_parse("redis://default:pw@10.0.0.5:7000/", &o, buf,
                                       sizeof buf, &e), 0);
    cr_expect_str_eq(o.password, "pw");
    cr_expect_str_eq(o.user, "default");
    cr_expect_str_eq(o.host, "10.0.0.5");
    cr_expect_not(o.tls);
    cr_assert_eq(config_redis_url_parse("redis://[::1]:6390/1", &o, buf, sizeof buf, &e), 0);
    cr_expect_str_eq(o.host, "::1");
    cr_expect_eq(o.port, 6390);
    cr_expect_eq(o.db, 1);
    cr_assert_eq(config_redis_url_parse("redis://:a@b@h:1/0", &o, buf, sizeof buf, &e), 0);
    cr_expect_str_eq(o.password, "a@b");
    cr_expect_null(o.user);
    cr_expect_str_eq(o.host, "h");
}

Test(redis_url, tls_and_acl_users)
{
    struct sc_redis_url o = {0};
    struct sc_error e;
    char buf[256];

    cr_assert_eq(config_redis_url_parse("rediss://app%2Dw:p%3Aw@cache.example:6380/0", &o,
                                        buf, sizeof buf, &e), 0, "%s", e.text);
    cr_expect(o.tls);
    cr_expect_str_eq(o.user, "app-w");
    cr_expect_str_eq(o.password, "p:w");
    cr_expect_str_eq(o.host, "cache.example");
    cr_expect_eq(o.port, 6380);
    cr_assert_eq(config_redis_url_parse("rediss://10.0.0.9", &o, buf, sizeof buf, &e), 0);
    cr_expect(o.tls);
    cr_expect_null(o.user);
    cr_expect_null(o.password);
    cr_expect_eq(o.port, 6379);
    cr_assert_eq(config_redis_url_parse("redis://alice:pw@h", &o, buf, sizeof buf, &e), 0);
    cr_expect_str_eq(o.user, "alice");
    cr_expect_not(o.tls);
}

Test(redis_url, refusals)
{
    struct sc_redis_url o = {0};
    struct sc_error e;
    char buf[256], tiny[4];

    cr_expect_eq(config_redis_url_parse("http://h", &o, buf, sizeof buf, &e), -EINVAL);
    cr_expect_eq(config_redis_url_parse("redis://h:0", &o, buf, sizeof buf, &e), -EINVAL);
    cr_expect_eq(config_redis_url_parse("redis://h:70000", &o, buf, sizeof buf, &e), -EINVAL);
    cr_expect_eq(config_redis_url_parse("redis://h:63x9", &o, buf, sizeof buf, &e), -EINVAL);
    cr_expect_eq(config_redis_url_parse("redis://h/db", &o, buf, sizeof buf, &e), -EINVAL);
    cr_expect(strstr(e.text, "database number"), "%s", e.text);
    cr_expect_eq(config_redis_url_parse("redis://:6379", &o, buf, sizeof buf, &e), -EINVAL);
    cr_expect_eq(config_redis_url_parse("redis://alice@h", &o, buf, sizeof buf, &e), -EINVAL);
    cr_expect(strstr(e.text, "user:password"), "%s", e.text);
    cr_expect_eq(config_redis_url_parse("redis://alice:@h", &o, buf, sizeof buf, &e), -EINVAL);
    cr_expect(strstr(e.text, "needs a password"), "%s", e.text);
    cr_expect_eq(config_redis_url_parse("redis://al%zz:pw9@h", &o, buf, sizeof buf, &e), -EINVAL);
    cr_expect(!strstr(e.text, "pw9"), "no password in messages: %s", e.text);
    cr_expect_eq(config_redis_url_parse("rediss:/h", &o, buf, sizeof buf, &e), -EINVAL);
    cr_expect_eq(config_redis_url_parse("redis://:p%zz@h", &o, buf, sizeof buf, &e), -EINVAL);
    cr_expect_eq(config_redis_url_parse("redis://[::1", &o, buf, sizeof buf, &e), -EINVAL);
    cr_expect_eq(config_redis_url_parse("redis://longhostname", &o, tiny, sizeof tiny, &e), -ENOSPC);
}
