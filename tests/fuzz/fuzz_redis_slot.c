/* A Redis Cluster's slot map (store/redis_slot.c) from arbitrary bytes, as
 * a node that is broken, foreign or not a cluster would answer: hiredis's
 * reader turns the bytes into a reply (what sluice's connections do), and
 * CLUSTER SHARDS's and CLUSTER SLOTS's readers either hand over ranges of
 * whole slots with a host and a port, or refuse with a message; a
 * redirection and the slot of a key are read from the same bytes, and so
 * is a joined script call's reply (store/redis_join.c), which is cut into
 * whole answers, each its own elements of the reply, or refused. */
#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "fuzz_check.h"
#include "store/redis_join.h"
#include "store/redis_slot.h"

#define ASKED "seed.local"

struct seen {
    unsigned ranges;
};

static int check_range(void *arg, unsigned lo, unsigned hi, const char *host,
                       size_t hlen, unsigned port)
{
    struct seen *s = arg;

    FUZZ_CHECK(lo <= hi && hi < REDIS_SLOTS, "range %u..%u", lo, hi);
    FUZZ_CHECK(port >= 1 && port <= 65535, "port %u", port);
    FUZZ_CHECK(host && hlen > 0, "an empty host");
    FUZZ_CHECK(hlen != 1 || host[0] != '?', "\"?\" is the node asked");
    s->ranges++;
    return 0;
}

static void check_map(const redisReply *r, bool tls)
{
    struct sc_error err;
    struct seen s;
    int rc;

    memset(&err, 0, sizeof err);
    s.ranges = 0;
    rc = redis_shards_parse(r, ASKED, tls, check_range, &s, &err);
    FUZZ_CHECK(rc == 0 || (rc == -EPROTO && err.text[0]), "shards: %d", rc);
    FUZZ_CHECK(rc != 0 || r->type == REDIS_REPLY_ARRAY, "a map from a non-array");
    memset(&err, 0, sizeof err);
    s.ranges = 0;
    rc = redis_slots_parse(r, ASKED, check_range, &s, &err);
    FUZZ_CHECK(rc == 0 || (rc == -EPROTO && err.text[0]), "slots: %d", rc);
    FUZZ_CHECK(!redis_shards_unknown(r) || r->type == REDIS_REPLY_ERROR,
               "only an error reply sends sluice to CLUSTER SLOTS");
}

static void check_redirect(const redisReply *r)
{
    struct redis_redirect rd;

    if (!redis_redirect_parse(r, &rd))
        return;
    FUZZ_CHECK(r->type == REDIS_REPLY_ERROR, "a redirection from a non-error");
    FUZZ_CHECK(rd.slot < REDIS_SLOTS && rd.port >= 1 && rd.port <= 65535,
               "slot %u port %u", rd.slot, rd.port);
    FUZZ_CHECK(rd.hlen > 0 && rd.host >= r->str && rd.host + rd.hlen <= r->str + r->len,
               "the host lies outside the reply");
}

static void check_join(const redisReply *r)
{
    const struct redis_join_layout *l[] = {&REDIS_JOIN_PERMIT_LEASE, &REDIS_JOIN_COMPLETE};
    redisReply part[4];

    for (unsigned k = 0; k < 2; k++)
        for (unsigned n = 1; n <= 4; n++) {
            size_t at = 0;

            if (!redis_join_split(l[k], r, n, part))
                continue;
            FUZZ_CHECK(r->type == REDIS_REPLY_ARRAY, "answers from a non-array");
            for (unsigned i = 0; i < n; i++) {
                FUZZ_CHECK(part[i].type == REDIS_REPLY_ARRAY && part[i].elements >= 1,
                           "an empty answer");
                FUZZ_CHECK(part[i].element == r->element + at, "answers out of order");
                at += part[i].elements;
            }
            FUZZ_CHECK(at == r->elements, "%zu of %zu elements in answers", at, r->elements);
        }
}

/* hiredis 0.14 allocates an aggregate's element array as its header
 * declares, before any element arrives (no maxelements until 1.0): a
 * header of 10^9 elements is hiredis's out-of-memory, not ours. Inputs that
 * hold a length above 65536 anywhere are skipped. */
static bool lengths_bounded(const uint8_t *data, size_t size)
{
    for (size_t i = 0; i < size; i++) {
        unsigned long v = 0;

        if (data[i] != '*' && data[i] != '$')
            continue;
        for (size_t j = i + 1; j < size && data[j] >= '0' && data[j] <= '9'; j++)
            if ((v = v * 10 + (data[j] - '0')) > 65536)
                return false;
    }
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    redisReader *rd;
    void *reply = NULL;

    FUZZ_CHECK(redis_key_slot((const char *)data, size) < REDIS_SLOTS, "slot");
    if (size < 1 || !lengths_bounded(data, size) || !(rd = redisReaderCreate()))
        return 0;
    /* The first byte: over TLS or not (which port a node's map gives). */
    if (redisReaderFeed(rd, (const char *)data + 1, size - 1) == REDIS_OK &&
        redisReaderGetReply(rd, &reply) == REDIS_OK && reply) {
        check_map(reply, data[0] & 1);
        check_redirect(reply);
        check_join(reply);
        freeReplyObject(reply);
    }
    redisReaderFree(rd);
    return 0;
}
