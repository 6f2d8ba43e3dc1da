/* Requests' commands joined into one script call (internal to the Redis
 * backend). Much of what a script call costs Redis is the call itself (a
 * fresh keyed request alone 12 µs, 4 µs each when 14 are joined:
 * tests/bench/README.md), so the scripts a keyed request runs, its
 * lookup, permit and lease (PERMIT_LEASE) and its completion (COMPLETE,
 * redis_scripts.c), serve any number of requests at once, and the
 * commands one loop issues in a pass (store_redis_async.c) go as one call
 * per script and bucket or slot.
 *
 * A script's command for one request (redis_cmd.c) is EVALSHA <sha>
 * <nkeys> <keys> <args>, its keys and its arguments each the shared ones
 * first (the same in every command a call joins), then the request's
 * own; n commands whose shared parts are the same and whose own keys have
 * the same hash tag (one Cluster slot) make one call of the shared parts
 * once and each one's own after them, keys then arguments, in order,
 * whose reply is each request's answer, in the same order, one after
 * another in one flat array (redis_scripts.c: no table per request),
 * which redis_join_split cuts back into one reply per request. */
#ifndef SLUICE_STORE_REDIS_JOIN_H
#define SLUICE_STORE_REDIS_JOIN_H

#include <stdbool.h>
#include <stddef.h>

#include <hiredis/hiredis.h>

/* At most this many requests in one call. */
#define REDIS_JOIN_MAX 32

/* How a script's command for one request lays its keys and arguments
 * out, and how long its answer is: the elements of the answer at el[0],
 * of the left there; 0 when el[0] starts none. */
struct redis_join_layout {
    unsigned shared_keys, own_keys, shared_args, own_args;
    size_t (*answer_len)(redisReply *const *el, size_t left);
};

/* <bucket> <record> <T> <tau> <max_wait> <id> <live> <new record> <PXAT> */
extern const struct redis_join_layout REDIS_JOIN_PERMIT_LEASE;
/* <record> <completed record> <PXAT> */
extern const struct redis_join_layout REDIS_JOIN_COMPLETE;

/* Whether b (a formatted command, RESP) may join a call led by a: both
 * are commands of layout l with the same shared parts and slot. */
bool redis_join_fits(const struct redis_join_layout *l, const char *a,
                     size_t alen, const char *b, size_t blen);

/* Writes the call joining the n commands cmd[i] of layout l (each fits
 * with cmd[0], 1 <= n <= REDIS_JOIN_MAX) into out, cap bytes, and returns
 * its length; when that is more than cap, out holds no usable command:
 * call again with a buffer that large. 0: a command is not of layout l. */
size_t redis_join(const struct redis_join_layout *l, char *out, size_t cap,
                  const char *const cmd[], const size_t len[], unsigned n);

/* Cuts r, the reply of a script of layout l to n requests (n answers, a
 * call alone's too), into part[0..n), each an array of one answer's
 * elements, r's own (they live as long as r). false: r is not n answers
 * (an error, say), and part holds nothing to read. */
bool redis_join_split(const struct redis_join_layout *l, const redisReply *r,
                      unsigned n, redisReply part[]);

#endif
