/* Stored idempotency records (store/record.h) from arbitrary bytes, as a
 * damaged or foreign database would hand them over: a value either decodes
 * into a record the encoder writes back byte for byte (v3; a v1 or v2 value
 * comes back as the same record in v3), or is refused with a message and leaves
 * the record zeroed. */
#include <errno.h>
#include <stdbool.h>
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

static void check_decoded(const uint8_t *data, size_t size,
                          const struct store_record *rec)
{
    struct store_record again;
    struct sc_error err = {0};
    uint64_t expires = 0;
    uint8_t *enc = NULL;
    size_t len = 0;

    FUZZ_CHECK(rec->state == STORE_IN_PROGRESS || rec->state == STORE_COMPLETED,
               "state %d", rec->state);
    FUZZ_CHECK(rec->status >= 0 && rec->status <= 999, "status %d",
               rec->status);
    FUZZ_CHECK(!rec->body_omitted || !rec->body_len, "omitted body stored");
    FUZZ_CHECK(record_peek_expiry(data, size, &expires) == 0 &&
                   expires == rec->expires_ms, "peek disagrees with decode");

    FUZZ_CHECK(record_encode(rec, &enc, &len, &err) == 0,
               "a decoded record does not encode: %s", err.text);
    /* v2 lacks the lease (8 bytes), v1 the flags byte too; a record
     * without a verification mark is written as v3, one with a mark as v4
     * (9 bytes more). */
    if (data[0] == 3 || (data[0] == RECORD_VERSION &&
                         (rec->verify || rec->verified)))
        FUZZ_CHECK(len == size && !memcmp(enc, data, size),
                   "v%u value not written back as read", data[0]);
    else if (data[0] == RECORD_VERSION)
        FUZZ_CHECK(len + 9 == size, "an unmarked v4 value of %zu bytes is "
                   "%zu in v3", size, len);
    else
        FUZZ_CHECK(len == size + (data[0] == 2 ? 8 : 9),
                   "v%u value of %zu bytes is %zu in v3", data[0], size, len);
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
