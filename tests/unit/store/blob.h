/* Hand-written record values for the store tests: little-endian integers
 * and length-prefixed bytes laid out as record.h documents, built without
 * record.c so the tests check the format, not the code against itself. */
#ifndef SLUICE_TESTS_UNIT_STORE_BLOB_H
#define SLUICE_TESTS_UNIT_STORE_BLOB_H

#include <stdint.h>
#include <string.h>

struct blob {
    uint8_t b[4096];
    size_t n;
};

static inline void blob_le(struct blob *x, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        x->b[x->n++] = (uint8_t)(v >> (8 * i));
}

static inline void blob_raw(struct blob *x, const void *p, size_t n)
{
    memcpy(x->b + x->n, p, n);
    x->n += n;
}

/* A u32 length, then the bytes. */
static inline void blob_str(struct blob *x, const void *p, size_t n)
{
    blob_le(x, n, 4);
    blob_raw(x, p, n);
}

#define V1_BODY "{\"id\":42}\0tail"
#define V1_BODY_LEN (sizeof V1_BODY - 1)

/* The v1 (previous release) value of a completed record: no flags byte.
 * attempt 3, expires `expires`, created 1000, lease 2000, completed 3000,
 * fingerprint all `fp`, status 201, two headers, a body holding a NUL. */
static inline void blob_v1_completed(struct blob *x, uint64_t expires,
                                     uint8_t fp)
{
    uint8_t f[32];

    memset(f, fp, sizeof f);
    x->n = 0;
    blob_le(x, 1, 1);        /* version */
    blob_le(x, 2, 1);        /* state: completed */
    blob_le(x, 3, 4);        /* attempt */
    blob_le(x, expires, 8);
    blob_le(x, 1000, 8);     /* created */
    blob_le(x, 2000, 8);     /* lease expires */
    blob_le(x, 3000, 8);     /* completed */
    blob_raw(x, f, sizeof f);
    blob_le(x, 201, 2);      /* status */
    blob_le(x, 2, 4);        /* headers */
    blob_str(x, "Content-Type", 12);
    blob_str(x, "application/json", 16);
    blob_str(x, "Location", 8);
    blob_str(x, "/orders/42", 10);
    blob_str(x, V1_BODY, V1_BODY_LEN);
}

/* The v1 value of an in-progress record: attempt 2, lease until `lease`. */
static inline void blob_v1_in_progress(struct blob *x, uint64_t lease,
                                       uint64_t expires, uint8_t fp)
{
    uint8_t f[32];

    memset(f, fp, sizeof f);
    x->n = 0;
    blob_le(x, 1, 1);
    blob_le(x, 1, 1);        /* state: in progress */
    blob_le(x, 2, 4);
    blob_le(x, expires, 8);
    blob_le(x, 500, 8);      /* created */
    blob_le(x, lease, 8);
    blob_le(x, 0, 8);
    blob_raw(x, f, sizeof f);
    blob_le(x, 0, 2);
    blob_le(x, 0, 4);
    blob_str(x, "", 0);
}

#endif
