/* Keyed requests' commands joined into one script call (store/redis_join.c):
 * what may join, the joined command, byte for byte, and its reply cut back
 * into each request's answer. */
#define _GNU_SOURCE /* memmem */
#include <criterion/criterion.h>
#include <string.h>

#include "store/redis_conn.h"
#include "store/redis_join.h"

/* A keyed request's command as redis_cmd.c lays it out, formatted. */
struct fmt {
    char buf[512];
    size_t len;
};

static struct fmt keyed(const char *bucket, const char *record, const char *max_wait,
                        const char *rec)
{
    const char *argv[] = {"EVALSHA", "0123456789abcdef0123456789abcdef01234567", "2",
                          bucket, record, "100000", "0", max_wait, "sidecar-a",
                          "sluice:{p}:live:", rec, "1700000000000"};
    size_t len[12];
    struct fmt f;

    for (int i = 0; i < 12; i++)
        len[i] = strlen(argv[i]);
    len[10] = 12; /* a record holds NULs and CRLFs */
    f.len = redis_format_argv(f.buf, sizeof f.buf, 12, argv, len);
    cr_assert_leq(f.len, sizeof f.buf);
    return f;
}

Test(redis_join, requests_of_one_bucket_and_numbers_fit)
{
    struct fmt a = keyed("sluice:{p}:b", "sluice:{p}:k:1", "5000", "R-0001\0\r\nrec");
    struct fmt b = keyed("sluice:{p}:b", "sluice:{p}:k:2", "5000", "R-0002\0\r\nrec");
    struct fmt other = keyed("sluice:{p}:b:tenant", "sluice:{p}:k:3", "5000", "R-0003\0\r\nrec");
    struct fmt wait = keyed("sluice:{p}:b", "sluice:{p}:k:4", "0", "R-0004\0\r\nrec");

    cr_expect(redis_join_fits(&REDIS_JOIN_PERMIT_LEASE, a.buf, a.len, b.buf, b.len));
    cr_expect(redis_join_fits(&REDIS_JOIN_PERMIT_LEASE, a.buf, a.len, a.buf, a.len), "a duplicate key fits too");
    cr_expect_not(redis_join_fits(&REDIS_JOIN_PERMIT_LEASE, a.buf, a.len, other.buf, other.len), "another bucket");
    cr_expect_not(redis_join_fits(&REDIS_JOIN_PERMIT_LEASE, a.buf, a.len, wait.buf, wait.len), "another max_wait");
}

Test(redis_join, other_commands_never_fit)
{
    struct fmt a = keyed("sluice:{p}:b", "sluice:{p}:k:1", "5000", "R-0001\0\r\nrec");
    const char *get[] = {"GET", "sluice:{p}:k:1"};
    size_t get_len[] = {3, 14};
    char g[64];
    size_t gn = redis_format_argv(g, sizeof g, 2, get, get_len);
    const char *cmd[] = {a.buf};
    size_t len[] = {a.len};

    cr_expect_not(redis_join_fits(&REDIS_JOIN_PERMIT_LEASE, a.buf, a.len, g, gn));
    cr_expect_not(redis_join_fits(&REDIS_JOIN_PERMIT_LEASE, g, gn, a.buf, a.len));
    for (size_t cut = 0; cut < a.len; cut++) {
        len[0] = cut;
        cr_assert_eq(redis_join(&REDIS_JOIN_PERMIT_LEASE, NULL, 0, cmd, len, 1), 0, "cut at %zu: refused", cut);
        cr_assert_not(redis_join_fits(&REDIS_JOIN_PERMIT_LEASE, a.buf, cut, a.buf, a.len));
    }
    len[0] = a.len;
    cr_expect_eq(redis_join(&REDIS_JOIN_PERMIT_LEASE, NULL, 0, cmd, len, 0), 0);
    cr_expect_eq(redis_join(&REDIS_JOIN_PERMIT_LEASE, NULL, 0, cmd, len, REDIS_JOIN_MAX + 1), 0);
}

/* Three requests: the bucket once, the records in order, the shared
 * numbers once, then each request's own two, as one RESP command. */
Test(redis_join, the_joined_command_byte_for_byte)
{
    struct fmt f[3] = {
        keyed("sluice:{p}:b", "sluice:{p}:k:1", "5000", "R-0001\0\r\nrec"),
        keyed("sluice:{p}:b", "sluice:{p}:k:2", "5000", "R-0002\0\r\nrec"),
        keyed("sluice:{p}:b", "sluice:{p}:k:1", "5000", "R-0003\0\r\nrec"),
    };
    const char *want_argv[] = {
        "EVALSHA", "0123456789abcdef0123456789abcdef01234567", "4", "sluice:{p}:b",
        "sluice:{p}:k:1", "sluice:{p}:k:2", "sluice:{p}:k:1",
        "100000", "0", "5000", "sidecar-a", "sluice:{p}:live:",
        "R-0001\0\r\nrec", "1700000000000",
        "R-0002\0\r\nrec", "1700000000000",
        "R-0003\0\r\nrec", "1700000000000",
    };
    size_t want_len[18];
    const char *cmd[3];
    size_t len[3], n, wn;
    char want[1024], out[1024], small[16];

    for (int i = 0; i < 18; i++)
        want_len[i] = strlen(want_argv[i]);
    want_len[12] = want_len[14] = want_len[16] = 12;
    wn = redis_format_argv(want, sizeof want, 18, want_argv, want_len);
    for (int i = 0; i < 3; i++) {
        cmd[i] = f[i].buf;
        len[i] = f[i].len;
    }
    n = redis_join(&REDIS_JOIN_PERMIT_LEASE, out, sizeof out, cmd, len, 3);
    cr_assert_eq(n, wn);
    cr_expect_eq(memcmp(out, want, n), 0, "%.*s", (int)n, out);
    cr_expect_eq(redis_join(&REDIS_JOIN_PERMIT_LEASE, small, sizeof small, cmd, len, 3), wn,
                 "too small a buffer: the length it needs");
    n = redis_join(&REDIS_JOIN_PERMIT_LEASE, out, sizeof out, cmd, len, 1);
    cr_expect_eq(n, f[0].len, "one request joined alone is its own command");
    cr_expect_eq(memcmp(out, f[0].buf, n), 0);
}

/* Eleven requests: the key count takes two digits. */
Test(redis_join, a_two_digit_key_count)
{
    struct fmt f = keyed("sluice:{p}:b", "sluice:{p}:k:1", "5000", "R-0001\0\r\nrec");
    const char *cmd[11];
    size_t len[11], n;
    static char out[8192];

    for (int i = 0; i < 11; i++) {
        cmd[i] = f.buf;
        len[i] = f.len;
    }
    n = redis_join(&REDIS_JOIN_PERMIT_LEASE, out, sizeof out, cmd, len, 11);
    cr_assert_gt(n, 0);
    cr_assert_leq(n, sizeof out);
    cr_expect_eq(memcmp(out, "*42\r\n", 5), 0, "9 + 3 x 11 arguments");
    cr_expect(memmem(out, n, "$2\r\n12\r\n", 8) != NULL, "12 keys");
}

/* A completion's command: the record's key, then the record, PXAT. */
static struct fmt completion(const char *record, const char *rec)
{
    const char *argv[] = {"EVALSHA", "fedcba9876543210fedcba9876543210fedcba98", "1",
                          record, rec, "0"};
    size_t len[6];
    struct fmt f;

    for (int i = 0; i < 6; i++)
        len[i] = strlen(argv[i]);
    len[4] = 12;
    f.len = redis_format_argv(f.buf, sizeof f.buf, 6, argv, len);
    return f;
}

/* Completions join when their keys share a hash tag (one Cluster slot),
 * whatever else the key holds. */
Test(redis_join, completions_of_one_slot_fit_and_join)
{
    struct fmt f[2] = {completion("sluice:{p}:k:1", "R-0001\0\r\nrec"),
                       completion("sluice:{p}:k:2", "R-0002\0\r\nrec")};
    struct fmt other = completion("sluice:{q}:k:1", "R-0003\0\r\nrec");
    struct fmt keyed_one = keyed("sluice:{p}:b", "sluice:{p}:k:1", "5000", "R-0001\0\r\nrec");
    const char *want_argv[] = {"EVALSHA", "fedcba9876543210fedcba9876543210fedcba98", "2",
                               "sluice:{p}:k:1", "sluice:{p}:k:2",
                               "R-0001\0\r\nrec", "0",
                               "R-0002\0\r\nrec", "0"};
    size_t want_len[9];
    const char *cmd[] = {f[0].buf, f[1].buf};
    size_t len[] = {f[0].len, f[1].len}, n, wn;
    char want[512], out[512];

    cr_expect(redis_join_fits(&REDIS_JOIN_COMPLETE, f[0].buf, f[0].len, f[1].buf, f[1].len));
    cr_expect_not(redis_join_fits(&REDIS_JOIN_COMPLETE, f[0].buf, f[0].len, other.buf,
                                  other.len), "another slot");
    cr_expect_not(redis_join_fits(&REDIS_JOIN_COMPLETE, f[0].buf, f[0].len, keyed_one.buf,
                                  keyed_one.len), "another layout");
    cr_expect_not(redis_join_fits(&REDIS_JOIN_PERMIT_LEASE, f[0].buf, f[0].len, f[1].buf,
                                  f[1].len));
    for (int i = 0; i < 9; i++)
        want_len[i] = strlen(want_argv[i]);
    want_len[5] = want_len[7] = 12;
    wn = redis_format_argv(want, sizeof want, 9, want_argv, want_len);
    n = redis_join(&REDIS_JOIN_COMPLETE, out, sizeof out, cmd, len, 2);
    cr_assert_eq(n, wn);
    cr_expect_eq(memcmp(out, want, n), 0, "%.*s", (int)n, out);
}

/* A reply as hiredis's reader makes it of resp (what Redis would send). */
static redisReply *reply_of(const char *resp)
{
    redisReader *rd = redisReaderCreate();
    void *r = NULL;

    cr_assert(rd);
    cr_assert_eq(redisReaderFeed(rd, resp, strlen(resp)), REDIS_OK);
    cr_assert_eq(redisReaderGetReply(rd, &r), REDIS_OK);
    cr_assert(r, "a whole reply: %s", resp);
    redisReaderFree(rd);
    return r;
}

/* The scripts' flat answers (store/redis_scripts.c), each of its own
 * length, cut where each ends: a fresh key's wait alone, a held lease's
 * verdict, record and holder's state, a mismatch's verdict, a refused
 * permit's four, a takeover's three, a replay's two. */
Test(redis_join, a_keyed_call_s_reply_is_cut_into_each_answer)
{
    redisReply *r = reply_of("*14\r\n:250\r\n$1\r\nH\r\n$3\r\nrec\r\n:0\r\n$1\r\nM\r\n"
                             "$1\r\nR\r\n$0\r\n\r\n:9000\r\n:1\r\n$1\r\nA\r\n$4\r\nrec2\r\n:7\r\n"
                             "$1\r\nD\r\n$4\r\nrec3\r\n");
    redisReply part[6];
    const size_t want[] = {1, 3, 1, 4, 3, 2};

    cr_assert(redis_join_split(&REDIS_JOIN_PERMIT_LEASE, r, 6, part));
    for (int i = 0; i < 6; i++) {
        cr_expect_eq(part[i].type, REDIS_REPLY_ARRAY);
        cr_expect_eq(part[i].elements, want[i], "answer %d", i);
    }
    cr_expect_eq(part[0].element[0]->integer, 250);
    cr_expect_eq(part[1].element[1]->len, 3);
    cr_expect_eq(part[3].element[2]->integer, 9000, "R's wait");
    cr_expect_eq(part[4].element[0]->str[0], 'A');
    cr_expect_eq(part[5].element[1]->len, 4, "D's record");
    freeReplyObject(r);
}

/* Anything but exactly n answers is not cut: fewer or more of them, an
 * answer cut short, a verdict no script answers, an error, a completion's
 * answer read as a keyed one's. */
Test(redis_join, a_reply_that_is_not_n_answers_is_refused)
{
    static const char *const bad[] = {
        "*2\r\n:1\r\n:2\r\n",                      /* two answers, three asked */
        "*4\r\n:1\r\n:2\r\n:3\r\n:4\r\n",           /* four */
        "*4\r\n:1\r\n:2\r\n$1\r\nH\r\n$3\r\nrec\r\n", /* H without its third */
        "*3\r\n:1\r\n$1\r\nZ\r\n:2\r\n",            /* no such verdict */
        "*3\r\n:1\r\n$2\r\nAA\r\n:2\r\n",           /* not one letter */
        "*3\r\n:1\r\n*1\r\n:2\r\n:3\r\n",           /* a table per request */
        "-NOSCRIPT No matching script.\r\n",
    };
    redisReply part[3];

    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        redisReply *r = reply_of(bad[i]);

        cr_expect_not(redis_join_split(&REDIS_JOIN_PERMIT_LEASE, r, 3, part), "%zu", i);
        freeReplyObject(r);
    }
    {
        redisReply *r = reply_of("*3\r\n:1\r\n:2\r\n:3\r\n");

        cr_expect(redis_join_split(&REDIS_JOIN_PERMIT_LEASE, r, 3, part));
        cr_expect_not(redis_join_split(&REDIS_JOIN_COMPLETE, r, 3, part),
                      "a completion answers a letter");
        freeReplyObject(r);
    }
}

/* A completion's answers: written, none, done, and a stale fence's or an
 * unreadable value's two. */
Test(redis_join, a_completion_call_s_reply_is_cut_into_each_answer)
{
    redisReply *r = reply_of("*7\r\n$1\r\nO\r\n$1\r\nS\r\n$3\r\nrec\r\n$1\r\nN\r\n"
                             "$1\r\nE\r\n$1\r\nX\r\n$1\r\n?\r\n");
    redisReply part[5];
    const size_t want[] = {1, 2, 1, 1, 2};

    cr_assert(redis_join_split(&REDIS_JOIN_COMPLETE, r, 5, part));
    for (int i = 0; i < 5; i++)
        cr_expect_eq(part[i].elements, want[i], "answer %d", i);
    cr_expect_eq(part[1].element[1]->len, 3);
    cr_expect_eq(part[4].element[1]->str[0], '?');
    cr_expect_not(redis_join_split(&REDIS_JOIN_COMPLETE, r, 4, part), "one answer left over");
    freeReplyObject(r);
}
