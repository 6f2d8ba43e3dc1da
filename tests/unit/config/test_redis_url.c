/* config/redis_url.c: store.url, with its defaults and its refusals (no TLS
 * in this build, no user names but default, no password in a message). */
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
    cr_expect_str_eq(o.host, "10.0.0.5");
    cr_assert_eq(config_redis_url_parse("redis://[::1]:6390/1", &o, buf, sizeof buf, &e), 0);
    cr_expect_str_eq(o.host, "::1");
    cr_expect_eq(o.port, 6390);
    cr_expect_eq(o.db, 1);
    cr_assert_eq(config_redis_url_parse("redis://:a@b@h:1/0", &o, buf, sizeof buf, &e), 0);
    cr_expect_str_eq(o.password, "a@b");
    cr_expect_str_eq(o.host, "h");
}

Test(redis_url, refusals)
{
    struct sc_redis_url o = {0};
    struct sc_error e;
    char buf[256], tiny[4];

    cr_expect_eq(config_redis_url_parse("rediss://h:6379/0", &o, buf, sizeof buf, &e), -ENOTSUP);
    cr_expect(strstr(e.text, "no TLS"), "%s", e.text);
    cr_expect_eq(config_redis_url_parse("http://h", &o, buf, sizeof buf, &e), -EINVAL);
    cr_expect_eq(config_redis_url_parse("redis://h:0", &o, buf, sizeof buf, &e), -EINVAL);
    cr_expect_eq(config_redis_url_parse("redis://h:70000", &o, buf, sizeof buf, &e), -EINVAL);
    cr_expect_eq(config_redis_url_parse("redis://h:63x9", &o, buf, sizeof buf, &e), -EINVAL);
    cr_expect_eq(config_redis_url_parse("redis://h/db", &o, buf, sizeof buf, &e), -EINVAL);
    cr_expect(strstr(e.text, "database number"), "%s", e.text);
    cr_expect_eq(config_redis_url_parse("redis://:6379", &o, buf, sizeof buf, &e), -EINVAL);
    cr_expect_eq(config_redis_url_parse("redis://alice:pw@h", &o, buf, sizeof buf, &e), -EINVAL);
    cr_expect(strstr(e.text, "user names"), "%s", e.text);
    cr_expect(!strstr(e.text, "pw"), "no password in messages: %s", e.text);
    cr_expect_eq(config_redis_url_parse("redis://:p%zz@h", &o, buf, sizeof buf, &e), -EINVAL);
    cr_expect_eq(config_redis_url_parse("redis://[::1", &o, buf, sizeof buf, &e), -EINVAL);
    cr_expect_eq(config_redis_url_parse("redis://longhostname", &o, tiny, sizeof tiny, &e), -ENOSPC);
}
