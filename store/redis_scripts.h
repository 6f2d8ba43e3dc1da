/* The Redis backend's server-side scripts (store_redis.c): every
 * read-modify-write of a record, pause, shared bucket or slot set is one
 * Lua script, so Redis runs it
 * atomically against every other sidecar of the fleet. Internal to store/. */
#ifndef SLUICE_STORE_REDIS_SCRIPTS_H
#define SLUICE_STORE_REDIS_SCRIPTS_H

#include <stddef.h>

enum redis_script {
    SCRIPT_ACQUIRE,
    SCRIPT_COMPLETE,
    SCRIPT_RELEASE,
    SCRIPT_PAUSE_SET,
    /* shared buckets and slots (their commands: redis_bucket.c) */
    SCRIPT_PERMIT,
    SCRIPT_PERMIT_LEASE, /* a keyed request's lookup, permit and lease */
    SCRIPT_BUCKET_PAUSE,
    SCRIPT_SLOT_TAKE,
    SCRIPT_FLIGHT_END,   /* a followed quota's request out of flight */
    /* a lease's verification mark (redis_verify.c) */
    SCRIPT_VERIFY_CLAIM,
    SCRIPT_VERIFY_FOUND,
    SCRIPT_VERIFY_ABSENT,
    SCRIPT_VERIFY_FAILED,
    /* a waiting duplicate's look, marking the lease (fleet notices) */
    SCRIPT_WATCH,
    SCRIPT_COUNT,
};

#define SCRIPT_SHA_LEN 40

/* The script's source, as SCRIPT LOAD takes it. */
const char *redis_script_body(enum redis_script s);

/* Its SHA-1 in hex, the name EVALSHA calls it by: computed here, so a
 * connection can call it before (or without) seeing SCRIPT LOAD's answer. */
const char *redis_script_sha(enum redis_script s);

#endif
