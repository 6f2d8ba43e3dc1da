/* Stored idempotency records (store/record.h) from arbitrary bytes, as a
 * damaged or foreign database would hand them over: a value either decodes
 * into a record the encoder writes back byte for byte in the oldest
 * version that holds it (v3; v4 with a verification mark or its deadline,
 * v5 with a holder; an older or larger version comes back as the same
 * record in that one), or is refused with a message and leaves the record
 * zeroed. The flags' two "a duplicate waits" bits are Redis's scripts'
 * alone: read past, never written by the encoder. */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"
#include "store/record.h"

static bool is_zero(const void *p, size_t n)
{
    const uint8_t *b = p;

    for (size_t i = 0; i < n; i++)
        if (b[i])
            return false;
    return true;
}

static void check_same(const struct store_record *a,
                       const struct store_record *b)
{
    FUZZ_CHECK(a->state == b->state && a->attempt == b->attempt &&
                   a->created_ms == b->created_ms &&
                   a->lease_expires_ms == b->lease_expires_ms &&
                   a->completed_ms == b->completed_ms &&
                   a->expires_ms == b->expires_ms && a->status == b->status &&
                   a->lease == b->lease &&
                   a->body_omitted == b->body_omitted &&
                   a->verify == b->verify && a->verified == b->verified &&
                   a->verify_deadline_ms == b->verify_deadline_ms &&
                   !strcmp(a->holder, b->holder) &&
                   !memcmp(a->fingerprint, b->fingerprint, STORE_FP_LEN),
               "fixed fields differ after a round trip");
    FUZZ_CHECK(a->n_headers == b->n_headers && a->body_len == b->body_len,
               "%zu/%zu headers, %zu/%zu body bytes", a->n_headers,
               b->n_headers, a->body_len, b->body_len);
    for (size_t i = 0; i < a->n_headers; i++)
        FUZZ_CHECK(!strcmp(a->headers[i].name, b->headers[i].name) &&
                       !strcmp(a->headers[i].value, b->headers[i].value),
                   "header %zu differs", i);
    FUZZ_CHECK(!a->body_len || !memcmp(a->body, b->body, a->body_len),
               "body differs");
}

/* The bytes before the headers in each version (record.h): v1 has no
 * flags byte and no lease, v2 no lease, v4 adds the mark and its
 * deadline, v5 the holder. */
static size_t fixed_size(unsigned v)
{
    size_t v3 = 1 + 1 + 1 + 4 + 8 * 4 + STORE_FP_LEN + 8 + 2 + 4;

    return v == 1 ? v3 - 9 : v == 2 ? v3 - 8 : v3 + (v >= 4 ? 9 : 0) +
           (v >= 5 ? STORE_HOLDER_LEN : 0);
}

/* The version the encoder picks for rec: the oldest that holds it. */
static unsigned written_version(const struct store_record *rec)
{
    if (rec->holder[0])
        return 5;
    return rec->verify || rec->verified || rec->verify_deadline_ms ? 4 : 3;
}

static void check_decoded(const uint8_t *data, size_t size,
                          const struct store_record *rec)
{
    struct store_record again;
    struct sc_error err = {0};
    uint64_t expires = 0;
    uint8_t *enc = NULL;
    size_t len = 0;
    unsigned v = data[0], w = written_version(rec);

    FUZZ_CHECK(rec->state == STORE_IN_PROGRESS || rec->state == STORE_COMPLETED,
               "state %d", rec->state);
    FUZZ_CHECK(rec->status >= 0 && rec->status <= 999, "status %d",
               rec->status);
    FUZZ_CHECK(!rec->body_omitted || !rec->body_len, "omitted body stored");
    FUZZ_CHECK(record_peek_expiry(data, size, &expires) == 0 &&
                   expires == rec->expires_ms, "peek disagrees with decode");

    FUZZ_CHECK(record_encode(rec, &enc, &len, &err) == 0,
               "a decoded record does not encode: %s", err.text);
    FUZZ_CHECK(enc[0] == w, "v%u written for a record of v%u", enc[0], w);
    if (v == w) {
        uint8_t *read = malloc(size);

        FUZZ_CHECK(read != NULL, "out of memory");
        memcpy(read, data, size);
        read[2] &= (uint8_t)~0x0cu; /* the waiting bits: not the encoder's */
        FUZZ_CHECK(len == size && !memcmp(enc, read, size),
                   "v%u value not written back as read", v);
        free(read);
    } else {
        FUZZ_CHECK(len + fixed_size(v) == size + fixed_size(w),
                   "v%u value of %zu bytes is %zu in v%u", v, size, len, w);
    }
    FUZZ_CHECK(record_decode(enc, len, &again, &err) == 0,
               "the encoder's value does not decode: %s", err.text);
    check_same(rec, &again);
    store_record_clear(&again);
    free(enc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct store_record rec;
    struct sc_error err = {0};
    int rc = record_decode(data, size, &rec, &err);

    if (rc == 0) {
        check_decoded(data, size, &rec);
        store_record_clear(&rec);
        return 0;
    }
    FUZZ_CHECK(rc == -EPROTO || rc == -EBADMSG || rc == -ENOMEM, "rc %d", rc);
    FUZZ_CHECK(err.text[0], "refused without a message");
    FUZZ_CHECK(is_zero(&rec, sizeof rec), "record not zeroed on failure");
    return 0;
}
