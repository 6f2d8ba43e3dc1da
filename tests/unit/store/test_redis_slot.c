/* Redis Cluster's pure parts (store/redis_slot.c): the slot of a key with
 * the hash tag rule (against slots Redis itself gives, CLUSTER KEYSLOT),
 * the slot map read from a CLUSTER SLOTS reply, and MOVED / ASK. */
#include <criterion/criterion.h>

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "store/redis_slot.h"

static unsigned slot(const char *k)
{
    return redis_key_slot(k, strlen(k));
}

/* Values from redis-server 7.0's CLUSTER KEYSLOT. */
Test(redis_slot, crc16_as_redis)
{
    cr_expect_eq(slot("foo"), 12182);
    cr_expect_eq(slot("bar"), 5061);
    cr_expect_eq(slot("somekey"), 11058);
    cr_expect_eq(slot("123456789"), 0x31c3 % 16384); /* the CRC16/XMODEM check value */
    cr_expect_eq(slot(""), 0);
}

Test(redis_slot, hash_tag)
{
    cr_expect_eq(slot("sluice:{orders}:k:abc"), 105);
    cr_expect_eq(slot("orders"), 105);
    cr_expect_eq(slot("sluice:{orders}:b"), slot("sluice:{orders}:k:x"));
    /* Only the first {...}; an empty one does not count. */
    cr_expect_eq(slot("a{b}{c}"), slot("b"));
    cr_expect_eq(slot("a{}{c}"), 2440); /* CLUSTER KEYSLOT: the whole key */
    cr_expect_neq(slot("a{}{c}"), slot("c"));
    cr_expect_eq(slot("{b"), redis_key_slot("{b", 2)); /* no closing brace */
    cr_expect_eq(slot("x{user1000}.following"), slot("user1000"));
}

/* Built replies, shaped as hiredis builds them. */
static redisReply *mkint(long long v)
{
    redisReply *r = calloc(1, sizeof *r);

    r->type = REDIS_REPLY_INTEGER;
    r->integer = v;
    return r;
}

static redisReply *mkstr(const char *s)
{
    redisReply *r = calloc(1, sizeof *r);

    r->type = REDIS_REPLY_STRING;
    r->str = strdup(s);
    r->len = strlen(s);
    return r;
}

static redisReply *mkarr(size_t n, ...)
{
    redisReply *r = calloc(1, sizeof *r);
    va_list ap;

    r->type = REDIS_REPLY_ARRAY;
    r->elements = n;
    r->element = calloc(n ? n : 1, sizeof *r->element);
    va_start(ap, n);
    for (size_t i = 0; i < n; i++)
        r->element[i] = va_arg(ap, redisReply *);
    va_end(ap);
    return r;
}

static void rfree(redisReply *r)
{
    for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements; i++)
        rfree(r->element[i]);
    free(r->element);
    free(r->str);
    free(r);
}

struct seen {
    unsigned n, lo[4], hi[4], port[4];
    char host[4][32];
};

static int record(void *arg, unsigned lo, unsigned hi, const char *host,
                  size_t hlen, unsigned port)
{
    struct seen *s = arg;

    s->lo[s->n] = lo;
    s->hi[s->n] = hi;
    s->port[s->n] = port;
    memcpy(s->host[s->n], host, hlen);
    s->host[s->n][hlen] = '\0';
    s->n++;
    return 0;
}

Test(redis_slot, cluster_slots_reply)
{
    redisReply *r = mkarr(2,
        mkarr(4, mkint(0), mkint(8191),
             mkarr(3, mkstr("10.0.0.1"), mkint(7000), mkstr("id1")),
             mkarr(3, mkstr("10.0.0.2"), mkint(7003), mkstr("id4"))),
        mkarr(3, mkint(8192), mkint(16383),
             mkarr(3, mkstr(""), mkint(7001), mkstr("id2"))));
    struct seen s = {0};
    struct sc_error err = {0};

    cr_assert_eq(redis_slots_parse(r, "seed.local", record, &s, &err), 0, "%s", err.text);
    cr_assert_eq(s.n, 2);
    cr_expect_eq(s.lo[0], 0);
    cr_expect_eq(s.hi[0], 8191);
    cr_expect_str_eq(s.host[0], "10.0.0.1"); /* the primary, not its replica */
    cr_expect_eq(s.port[0], 7000);
    cr_expect_eq(s.lo[1], 8192);
    cr_expect_str_eq(s.host[1], "seed.local"); /* "": the node asked */
    cr_expect_eq(s.port[1], 7001);
    rfree(r);
}

Test(redis_slot, malformed_maps_refused)
{
    struct sc_error err = {0};
    struct seen s = {0};
    redisReply *bad_range = mkarr(1, mkarr(3, mkint(10), mkint(5),
                                         mkarr(2, mkstr("h"), mkint(1))));
    redisReply *no_port = mkarr(1, mkarr(3, mkint(0), mkint(5), mkarr(1, mkstr("h"))));
    redisReply *too_high = mkarr(1, mkarr(3, mkint(0), mkint(16384),
                                        mkarr(2, mkstr("h"), mkint(1))));
    redisReply *err_reply = calloc(1, sizeof *err_reply);

    err_reply->type = REDIS_REPLY_ERROR;
    err_reply->str = strdup("ERR This instance has cluster support disabled");
    cr_expect_eq(redis_slots_parse(bad_range, "x", record, &s, &err), -EPROTO);
    cr_expect(strstr(err.text, "range 0"), "%s", err.text);
    cr_expect_eq(redis_slots_parse(no_port, "x", record, &s, &err), -EPROTO);
    cr_expect_eq(redis_slots_parse(too_high, "x", record, &s, &err), -EPROTO);
    cr_expect_eq(redis_slots_parse(err_reply, "x", record, &s, &err), -EPROTO);
    cr_expect(strstr(err.text, "cluster support disabled"), "%s", err.text);
    cr_expect_eq(s.n, 0);
    rfree(bad_range);
    rfree(no_port);
    rfree(too_high);
    rfree(err_reply);
}

static redisReply *mkerr(const char *s)
{
    redisReply *r = mkstr(s);

    r->type = REDIS_REPLY_ERROR;
    return r;
}

Test(redis_slot, redirects)
{
    struct redis_redirect rd;
    redisReply *moved = mkerr("MOVED 3999 127.0.0.1:6381");
    redisReply *ask = mkerr("ASK 12 ::1:7002");
    redisReply *other = mkerr("ERR unknown command");
    redisReply *junk = mkerr("MOVED x 127.0.0.1:1");
    redisReply *busy = mkerr("TRYAGAIN Multiple keys request during rehashing of slot");

    cr_assert(redis_redirect_parse(moved, &rd));
    cr_expect(!rd.ask);
    cr_expect_eq(rd.slot, 3999);
    cr_expect_eq(rd.hlen, 9);
    cr_expect(!strncmp(rd.host, "127.0.0.1", rd.hlen));
    cr_expect_eq(rd.port, 6381);
    cr_assert(redis_redirect_parse(ask, &rd));
    cr_expect(rd.ask);
    cr_expect_eq(rd.slot, 12);
    cr_expect(!strncmp(rd.host, "::1", rd.hlen) && rd.hlen == 3);
    cr_expect_eq(rd.port, 7002);
    cr_expect(!redis_redirect_parse(other, &rd));
    cr_expect(!redis_redirect_parse(junk, &rd));
    cr_expect(redis_reply_cluster_busy(busy));
    cr_expect(!redis_reply_cluster_busy(other));
    rfree(moved);
    rfree(ask);
    rfree(other);
    rfree(junk);
    rfree(busy);
}
