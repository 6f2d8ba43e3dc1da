/* Replies built in an arena instead of one malloc per object: hiredis's
 * reader takes the object functions, the arena is emptied once a reply's
 * callback has run, and its chunks are kept for the next one, so a busy
 * connection's replies allocate nothing once warm (redis_conn.c). The
 * replies are hiredis's redisReply shapes, read as usual, never freed with
 * freeReplyObject. Internal to store/. */
#ifndef SLUICE_STORE_REDIS_ARENA_H
#define SLUICE_STORE_REDIS_ARENA_H

#include <stddef.h>

#include <hiredis/hiredis.h>

struct redis_arena_chunk;

struct redis_arena {
    struct redis_arena_chunk *first, *cur;
};

/* r builds its replies in a (r's privdata becomes a). */
void redis_arena_use(struct redis_arena *a, redisReader *r);
/* Every reply built so far is gone; chunks kept (but one made for a
 * single large reply). */
void redis_arena_reset(struct redis_arena *a);
void redis_arena_free(struct redis_arena *a);

#endif
