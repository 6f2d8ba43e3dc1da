/* Redis Cluster's pure parts (store/redis_slot.c): the slot of a key with
 * the hash tag rule (against slots Redis itself gives, CLUSTER KEYSLOT),
 * the slot map read from a CLUSTER SLOTS or a CLUSTER SHARDS reply (built
 * by hand, read by hiredis from replies redis-server 7.0 sent, recorded in
 * resp/, and asked of a real redis-server here), and MOVED / ASK. */
#include <criterion/criterion.h>

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/redis_slot.h"
#include "support/redis_server.h"

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

#define SEEN_MAX 8

struct seen {
    unsigned n, lo[SEEN_MAX], hi[SEEN_MAX], port[SEEN_MAX];
    char host[SEEN_MAX][32];
};

static int record(void *arg, unsigned lo, unsigned hi, const char *host,
                  size_t hlen, unsigned port)
{
    struct seen *s = arg;

    cr_assert_lt(s->n, SEEN_MAX);
    cr_assert_lt(hlen, sizeof s->host[0]);

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

/* ---- replies as hiredis reads them off the wire ---- */

/* resp/NAME read by hiredis's reader: the one reply it holds. */
static redisReply *resp_file(const char *name)
{
    char path[512], buf[8192];
    FILE *f;
    size_t n;
    redisReader *rd = redisReaderCreate();
    void *r = NULL;

    snprintf(path, sizeof path, "%s/tests/unit/store/resp/%s", SLUICE_SOURCE_DIR, name);
    cr_assert((f = fopen(path, "rb")), "cannot open %s", path);
    n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    cr_assert(n > 0 && n < sizeof buf);
    cr_assert_eq(redisReaderFeed(rd, buf, n), REDIS_OK);
    cr_assert_eq(redisReaderGetReply(rd, &r), REDIS_OK);
    cr_assert(r, "%s holds no complete reply", name);
    redisReaderFree(rd);
    return r;
}

/* The owner's port of every slot, by the ranges seen (0: none). */
static void owners(const struct seen *s, unsigned *port_of)
{
    memset(port_of, 0, REDIS_SLOTS * sizeof *port_of);
    for (unsigned i = 0; i < s->n; i++)
        for (unsigned slot = s->lo[i]; slot <= s->hi[i]; slot++)
            port_of[slot] = s->port[i];
}

/* A 3-primary cluster with a replica each (redis-cli --cluster create),
 * as redis-server 7.0.15 answered: the same map both ways, the primaries
 * only (each shard lists its replica after its primary). */
Test(redis_slot, shards_and_slots_of_redis_7_agree)
{
    redisReply *shards = resp_file("shards-7.0.resp"), *slots = resp_file("slots-7.0.resp");
    static unsigned a[REDIS_SLOTS], b[REDIS_SLOTS];
    struct seen s1 = {0}, s2 = {0};
    struct sc_error err = {0};

    cr_assert_eq(redis_shards_parse(shards, "seed", false, record, &s1, &err), 0, "%s", err.text);
    cr_assert_eq(redis_slots_parse(slots, "seed", record, &s2, &err), 0, "%s", err.text);
    cr_expect_eq(s1.n, 3);
    cr_expect_eq(s1.lo[0], 10923);
    cr_expect_eq(s1.hi[0], 16383);
    cr_expect_eq(s1.port[0], 23924); /* the primary, not 23487, its replica */
    cr_expect_str_eq(s1.host[0], "127.0.0.1");
    owners(&s1, a);
    owners(&s2, b);
    cr_expect_eq(memcmp(a, b, sizeof a), 0, "CLUSTER SHARDS and CLUSTER SLOTS differ");
    for (unsigned slot = 0; slot < REDIS_SLOTS; slot++)
        cr_assert_neq(a[slot], 0, "slot %u has no owner", slot);
    freeReplyObject(shards);
    freeReplyObject(slots);
}

/* --port 0 --tls-port --tls-cluster yes: a node lists only its tls-port,
 * which sluice takes over TLS, and without TLS too (the only one). */
Test(redis_slot, a_tls_only_cluster_lists_its_tls_ports)
{
    redisReply *r = resp_file("shards-7.0-tls.resp");
    struct seen s = {0}, plain = {0};
    struct sc_error err = {0};

    cr_assert_eq(redis_shards_parse(r, "seed", true, record, &s, &err), 0, "%s", err.text);
    cr_assert_eq(s.n, 3);
    cr_expect_eq(s.port[0], 21639);
    cr_expect_eq(s.port[1], 26894);
    cr_expect_eq(s.port[2], 24624);
    cr_expect_eq(s.lo[2], 0);
    cr_expect_eq(s.hi[2], 5460);
    cr_assert_eq(redis_shards_parse(r, "seed", false, record, &plain, &err), 0, "%s", err.text);
    cr_expect_eq(plain.port[0], 21639);
    freeReplyObject(r);
}

/* Both ports listed: the TLS one over TLS, the plain one otherwise; the
 * endpoint (a hostname) over the ip, "?" meaning the node asked; a primary
 * with two ranges; a shard with no primary (a failover under way) and one
 * with no slots skipped. */
Test(redis_slot, shards_port_by_connection_endpoint_and_gaps)
{
    redisReply *r = resp_file("shards-both-ports.resp");
    struct seen t = {0}, p = {0};
    struct sc_error err = {0};

    cr_assert_eq(redis_shards_parse(r, "seed.local", true, record, &t, &err), 0, "%s", err.text);
    cr_assert_eq(redis_shards_parse(r, "seed.local", false, record, &p, &err), 0, "%s", err.text);
    cr_assert_eq(t.n, 3);
    cr_expect_eq(t.lo[0], 0);
    cr_expect_eq(t.hi[0], 99);
    cr_expect_eq(t.lo[1], 200);
    cr_expect_eq(t.hi[1], 8191);
    cr_expect_str_eq(t.host[0], "redis-0.cache");
    cr_expect_str_eq(t.host[1], "redis-0.cache");
    cr_expect_eq(t.port[0], 6380);
    cr_expect_eq(p.port[0], 6379);
    cr_expect_eq(t.lo[2], 8192); /* slots 100..199 have no primary: not listed */
    cr_expect_str_eq(t.host[2], "seed.local");
    freeReplyObject(r);
}

/* Redis 6.2 does not know CLUSTER SHARDS: its error is one sluice asks
 * CLUSTER SLOTS after, and its CLUSTER SLOTS (replicas listed) is read. */
Test(redis_slot, redis_6_answers_cluster_slots_only)
{
    redisReply *no = resp_file("shards-6.2.resp"), *slots = resp_file("slots-6.2.resp");
    redisReply *busy = mkerr("LOADING Redis is loading the dataset in memory");
    redisReply *noperm = mkerr("NOPERM this user has no permissions to run the 'cluster|shards' command");
    struct seen s = {0};
    struct sc_error err = {0};

    cr_expect(redis_shards_unknown(no));
    cr_expect(redis_shards_unknown(noperm));
    cr_expect(!redis_shards_unknown(busy), "a transient error is not a Redis 6");
    cr_expect(!redis_shards_unknown(slots));
    cr_expect_eq(redis_shards_parse(no, "x", false, record, &s, &err), -EPROTO);
    cr_expect(strstr(err.text, "Unknown subcommand"), "%s", err.text);
    cr_assert_eq(redis_slots_parse(slots, "x", record, &s, &err), 0, "%s", err.text);
    cr_assert_eq(s.n, 2);
    cr_expect_str_eq(s.host[0], "10.0.1.1");
    cr_expect_str_eq(s.host[1], "10.0.1.2");
    cr_expect_eq(s.hi[1], 16383);
    freeReplyObject(no);
    freeReplyObject(slots);
    rfree(busy);
    rfree(noperm);
}

Test(redis_slot, malformed_shards_refused)
{
    struct sc_error err = {0};
    struct seen s = {0};
    redisReply *node = mkarr(6, mkstr("port"), mkint(7000), mkstr("ip"), mkstr("h"),
                             mkstr("role"), mkstr("master"));
    redisReply *odd_slots = mkarr(1, mkarr(4, mkstr("slots"), mkarr(1, mkint(0)),
                                           mkstr("nodes"), mkarr(1, node)));
    redisReply *no_port = mkarr(1, mkarr(4, mkstr("slots"), mkarr(2, mkint(0), mkint(9)),
                                         mkstr("nodes"),
                                         mkarr(1, mkarr(4, mkstr("ip"), mkstr("h"),
                                                        mkstr("role"), mkstr("master")))));
    redisReply *backwards = mkarr(1, mkarr(4, mkstr("slots"), mkarr(2, mkint(9), mkint(3)),
                                           mkstr("nodes"),
                                           mkarr(1, mkarr(6, mkstr("port"), mkint(1),
                                                          mkstr("ip"), mkstr("h"),
                                                          mkstr("role"), mkstr("master")))));
    redisReply *no_nodes = mkarr(1, mkarr(2, mkstr("slots"), mkarr(0)));
    redisReply *not_array = mkint(3);

    cr_expect_eq(redis_shards_parse(odd_slots, "x", false, record, &s, &err), -EPROTO);
    cr_expect(strstr(err.text, "shard 0"), "%s", err.text);
    cr_expect_eq(redis_shards_parse(no_port, "x", false, record, &s, &err), -EPROTO);
    cr_expect_eq(redis_shards_parse(backwards, "x", false, record, &s, &err), -EPROTO);
    cr_expect_eq(redis_shards_parse(no_nodes, "x", false, record, &s, &err), -EPROTO);
    cr_expect_eq(redis_shards_parse(not_array, "x", false, record, &s, &err), -EPROTO);
    cr_expect_eq(s.n, 0);
    rfree(odd_slots);
    rfree(no_port);
    rfree(backwards);
    rfree(no_nodes);
    rfree(not_array);
}

/* ---- a real redis-server 7.0, asked here ---- */

static redisReply *ask(const struct redis_server *rs, const char *cmd)
{
    redisContext *c = redisConnect("127.0.0.1", (int)rs->port);
    redisReply *r;

    cr_assert(c && !c->err, "cannot connect to redis-server");
    r = redisCommand(c, cmd);
    redisFree(c);
    cr_assert(r, "no reply to %s", cmd);
    return r;
}

/* A cluster node owning three ranges with gaps: its own CLUSTER SHARDS and
 * CLUSTER SLOTS give the same map (the node, which does not know its own
 * address before it meets another, as the node asked). */
Test(redis_slot, a_real_nodes_shards_and_slots_agree)
{
    struct redis_server rs = {.cluster = true};
    static unsigned a[REDIS_SLOTS], b[REDIS_SLOTS];
    struct seen s1 = {0}, s2 = {0};
    struct sc_error err = {0};
    redisReply *shards, *slots;

    cr_assert_eq(redis_server_start(&rs, 0, NULL), 0, "redis-server did not start");
    cr_assert(redis_server_cmd(&rs, "CLUSTER ADDSLOTSRANGE 0 99 1000 4999 16000 16383"));
    shards = ask(&rs, "CLUSTER SHARDS");
    slots = ask(&rs, "CLUSTER SLOTS");
    cr_assert_eq(redis_shards_parse(shards, "127.0.0.1", false, record, &s1, &err), 0, "%s", err.text);
    cr_assert_eq(redis_slots_parse(slots, "127.0.0.1", record, &s2, &err), 0, "%s", err.text);
    cr_expect_eq(s1.n, 3);
    cr_expect_eq(s1.port[0], rs.port);
    cr_expect_str_eq(s1.host[0], "127.0.0.1");
    owners(&s1, a);
    owners(&s2, b);
    cr_expect_eq(memcmp(a, b, sizeof a), 0, "CLUSTER SHARDS and CLUSTER SLOTS differ");
    cr_expect_eq(a[99], rs.port);
    cr_expect_eq(a[100], 0);
    cr_expect_eq(a[16383], rs.port);
    freeReplyObject(shards);
    freeReplyObject(slots);
    redis_server_destroy(&rs);
}
