/* The store's byte formats (store/record.h): keys, the v2 encoding, v1
 * decoding, and refusal of every malformed value without reading past it. */
#include <criterion/criterion.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "store/record.h"
#include "unit/store/blob.h"

static struct sc_error err;

static const uint8_t BODY[] = {'a', 0, 'b', 0, 0, 0xff, 'z'};

static struct store_record sample(void)
{
    static struct store_header h[] = {
        {"Content-Type", "application/octet-stream"},
        {"X-Empty", ""},
    };
    struct store_record r = {
        .state = STORE_COMPLETED,
        .attempt = 7,
        .created_ms = 1700000000000ull,
        .lease_expires_ms = 1700000001000ull,
        .completed_ms = 1700000002000ull,
        .expires_ms = UINT64_MAX - 1,
        .lease = 0x0123456789abcdefull,
        .status = 201,
        .headers = h,
        .n_headers = 2,
        .body = (uint8_t *)BODY,
        .body_len = sizeof BODY,
    };

    for (int i = 0; i < STORE_FP_LEN; i++)
        r.fingerprint[i] = (uint8_t)(i * 7 + 1);
    return r;
}

static void expect_same(const struct store_record *a,
                        const struct store_record *b)
{
    cr_expect_eq(a->state, b->state);
    cr_expect_eq(a->attempt, b->attempt);
    cr_expect_arr_eq(a->fingerprint, b->fingerprint, STORE_FP_LEN);
    cr_expect_eq(a->created_ms, b->created_ms);
    cr_expect_eq(a->lease_expires_ms, b->lease_expires_ms);
    cr_expect_eq(a->completed_ms, b->completed_ms);
    cr_expect_eq(a->expires_ms, b->expires_ms);
    cr_expect_eq(a->lease, b->lease);
    cr_expect_eq(a->status, b->status);
    cr_assert_eq(a->n_headers, b->n_headers);
    for (size_t i = 0; i < a->n_headers; i++) {
        cr_expect_str_eq(a->headers[i].name, b->headers[i].name);
        cr_expect_str_eq(a->headers[i].value, b->headers[i].value);
    }
    cr_assert_eq(a->body_len, b->body_len);
    if (a->body_len)
        cr_expect_arr_eq(a->body, b->body, a->body_len);
    cr_expect_eq(a->body_omitted, b->body_omitted);
}

/* Encodes r; the buffer is malloc'ed at the exact size so ASan catches any
 * read past its end. */
static uint8_t *encode(const struct store_record *r, size_t *len)
{
    uint8_t *buf;

    cr_assert_eq(record_encode(r, &buf, len, &err), 0, "%s", err.text);
    return buf;
}

/* Decodes a private exact-size copy of buf[0..len). */
static int decode(const uint8_t *buf, size_t len, struct store_record *r)
{
    uint8_t *copy = malloc(len ? len : 1);
    int rc;

    memcpy(copy, buf, len);
    err.text[0] = '\0';
    rc = record_decode(copy, len, r, &err);
    free(copy);
    return rc;
}

Test(record, key_layout)
{
    struct record_key k;

    cr_assert_eq(record_key_make(&k, "pay-ments_1.v2", "order 42", &err), 0);
    cr_assert_eq(k.len, 14 + 1 + 8);
    cr_expect_arr_eq(k.buf, "pay-ments_1.v2\0order 42", k.len);
}

Test(record, key_limits)
{
    struct record_key k;
    char key[300], scope[80];

    memset(key, 'k', sizeof key);
    key[255] = '\0';
    cr_expect_eq(record_key_make(&k, "p", key, &err), 0);
    key[255] = 'k';
    key[256] = '\0';
    cr_expect_eq(record_key_make(&k, "p", key, &err), -EINVAL);
    cr_expect(strstr(err.text, "1 to 255"), "%s", err.text);
    memset(scope, 's', sizeof scope);
    scope[64] = '\0';
    cr_expect_eq(record_key_make(&k, scope, "k", &err), 0);
    scope[64] = 's';
    scope[65] = '\0';
    cr_expect_eq(record_key_make(&k, scope, "k", &err), -EINVAL);
}

Test(record, key_refusals)
{
    struct record_key k;

    cr_expect_eq(record_key_make(&k, "", "k", &err), -EINVAL);
    cr_expect_eq(record_key_make(&k, "a/b", "k", &err), -EINVAL);
    cr_expect(strstr(err.text, "a/b"), "%s", err.text);
    cr_expect_eq(record_key_make(&k, "a b", "k", &err), -EINVAL);
    cr_expect_eq(record_key_make(&k, "p", "", &err), -EINVAL);
    cr_expect_eq(record_key_make(&k, "p", "a\tb", &err), -EINVAL);
    cr_expect_eq(record_key_make(&k, "p", "a\x7f", &err), -EINVAL);
    cr_expect_eq(record_key_make(&k, "p", "caf\xc3\xa9", &err), -EINVAL);
    cr_expect_eq(record_key_make(&k, NULL, "k", &err), -EINVAL);
    cr_expect_eq(record_key_make(&k, "p", NULL, &err), -EINVAL);
}

Test(record, v3_round_trip)
{
    struct store_record in = sample(), out;
    size_t len;
    uint8_t *buf = encode(&in, &len);

    cr_expect_eq(buf[0], 3, "a record without a verification mark is written as v3");
    cr_assert_eq(decode(buf, len, &out), 0, "%s", err.text);
    expect_same(&out, &in);
    store_record_clear(&out);
    free(buf);
}

/* A mark's deadline without the mark (a damaged value, found by
 * fuzz_record) is kept: v4, read back the same, not dropped into v3. */
Test(record, a_deadline_without_a_mark_is_kept)
{
    struct store_record in = sample(), out;
    size_t len;
    uint8_t *buf;

    in.verify_deadline_ms = 46;
    buf = encode(&in, &len);
    cr_expect_eq(buf[0], 4);
    cr_assert_eq(decode(buf, len, &out), 0, "%s", err.text);
    cr_expect_eq(out.verify, 0);
    cr_expect_eq(out.verify_deadline_ms, 46);
    store_record_clear(&out);
    free(buf);
}

/* The documented layout up to the headers; v2 has no lease. */
static void blob_head(struct blob *x, unsigned version,
                      const struct store_record *in)
{
    blob_le(x, version, 1);
    blob_le(x, 2, 1);
    blob_le(x, 0, 1); /* flags */
    blob_le(x, in->attempt, 4);
    blob_le(x, in->expires_ms, 8);
    blob_le(x, in->created_ms, 8);
    blob_le(x, in->lease_expires_ms, 8);
    blob_le(x, in->completed_ms, 8);
    blob_raw(x, in->fingerprint, STORE_FP_LEN);
    if (version >= 3)
        blob_le(x, in->lease, 8);
    blob_le(x, 201, 2);
    blob_le(x, 1, 4);
    blob_str(x, "Content-Type", 12);
    blob_str(x, "application/octet-stream", 24);
    blob_str(x, BODY, sizeof BODY);
}

Test(record, v3_layout_is_the_documented_one)
{
    struct store_record in = sample();
    struct blob x = {.n = 0};
    size_t len;
    uint8_t *buf;

    in.n_headers = 1;
    blob_head(&x, 3, &in);
    buf = encode(&in, &len);
    cr_assert_eq(len, x.n);
    cr_expect_arr_eq(buf, x.b, len);
    free(buf);
}

/* A record of the previous release reads as it was, with no fence. */
Test(record, v2_is_read_without_a_lease)
{
    struct store_record in = sample(), out;
    struct blob x = {.n = 0};

    in.n_headers = 1;
    blob_head(&x, 2, &in);
    cr_assert_eq(decode(x.b, x.n, &out), 0, "%s", err.text);
    in.lease = 0;
    expect_same(&out, &in);
    store_record_clear(&out);
}

Test(record, empty_and_omitted_bodies)
{
    struct store_record in = sample(), out;
    size_t len;
    uint8_t *buf;

    in.body = NULL;
    in.body_len = 0;
    buf = encode(&in, &len);
    cr_assert_eq(decode(buf, len, &out), 0, "%s", err.text);
    expect_same(&out, &in);
    cr_expect_null(out.body);
    store_record_clear(&out);
    free(buf);

    /* An omitted body is not stored even when one is passed. */
    in = sample();
    in.body_omitted = true;
    buf = encode(&in, &len);
    cr_assert_eq(decode(buf, len, &out), 0, "%s", err.text);
    cr_expect(out.body_omitted);
    cr_expect_eq(out.body_len, 0);
    cr_expect_null(out.body);
    cr_expect_eq(out.n_headers, 2);
    store_record_clear(&out);
    free(buf);
}

Test(record, in_progress_without_headers)
{
    struct store_record in = {.state = STORE_IN_PROGRESS, .attempt = 1,
                              .lease_expires_ms = 5, .expires_ms = 9}, out;
    size_t len;
    uint8_t *buf = encode(&in, &len);

    cr_assert_eq(decode(buf, len, &out), 0, "%s", err.text);
    expect_same(&out, &in);
    cr_expect_null(out.headers);
    store_record_clear(&out);
    free(buf);
}

Test(record, v1_is_read)
{
    struct store_record out;
    struct blob x;

    blob_v1_completed(&x, 123456789, 0x5a);
    cr_assert_eq(decode(x.b, x.n, &out), 0, "%s", err.text);
    cr_expect_eq(out.state, STORE_COMPLETED);
    cr_expect_eq(out.attempt, 3);
    cr_expect_eq(out.expires_ms, 123456789);
    cr_expect_eq(out.created_ms, 1000);
    cr_expect_eq(out.lease_expires_ms, 2000);
    cr_expect_eq(out.completed_ms, 3000);
    for (int i = 0; i < STORE_FP_LEN; i++)
        cr_expect_eq(out.fingerprint[i], 0x5a);
    cr_expect_eq(out.status, 201);
    cr_assert_eq(out.n_headers, 2);
    cr_expect_str_eq(out.headers[0].name, "Content-Type");
    cr_expect_str_eq(out.headers[0].value, "application/json");
    cr_expect_str_eq(out.headers[1].name, "Location");
    cr_expect_str_eq(out.headers[1].value, "/orders/42");
    cr_assert_eq(out.body_len, V1_BODY_LEN);
    cr_expect_arr_eq(out.body, V1_BODY, V1_BODY_LEN);
    cr_expect_not(out.body_omitted);
    store_record_clear(&out);
}

Test(record, every_truncation_is_refused)
{
    struct store_record in = sample(), out;
    struct blob x;
    size_t len;
    uint8_t *buf = encode(&in, &len);

    for (size_t n = 0; n < len; n++) {
        cr_expect_eq(decode(buf, n, &out), -EBADMSG, "prefix %zu", n);
        cr_expect_null(out.headers);
        cr_expect_null(out.body);
    }
    free(buf);
    blob_v1_completed(&x, 1, 1);
    for (size_t n = 0; n < x.n; n++)
        cr_expect_eq(decode(x.b, n, &out), -EBADMSG, "v1 prefix %zu", n);
}

Test(record, trailing_bytes_are_refused)
{
    struct store_record in = sample(), out;
    size_t len;
    uint8_t *buf = encode(&in, &len), *more = malloc(len + 1);

    memcpy(more, buf, len);
    more[len] = 0;
    cr_expect_eq(decode(more, len + 1, &out), -EBADMSG);
    cr_expect(strstr(err.text, "trailing"), "%s", err.text);
    free(more);
    free(buf);
}

Test(record, unknown_versions_are_eproto)
{
    struct store_record out;
    uint8_t v[] = {0, 2, 0, 0, 0, 0};

    cr_expect_eq(decode(v, sizeof v, &out), -EPROTO);
    v[0] = 6;
    cr_expect_eq(decode(v, sizeof v, &out), -EPROTO);
    cr_expect(strstr(err.text, "version 6"), "%s", err.text);
    v[0] = 255;
    cr_expect_eq(decode(v, 1, &out), -EPROTO);
}

/* Patches one byte of a valid v3 value and expects a refusal. */
static void expect_bad_at(size_t off, uint8_t value, const char *why)
{
    struct store_record in = sample(), out;
    size_t len;
    uint8_t *buf = encode(&in, &len);

    buf[off] = value;
    cr_expect_eq(decode(buf, len, &out), -EBADMSG, "%s", why);
    cr_expect(strstr(err.text, why), "%s: %s", why, err.text);
    free(buf);
}

Test(record, corrupt_fields_are_refused)
{
    size_t status = 1 + 1 + 1 + 4 + 32 + STORE_FP_LEN + 8; /* after the lease */
    size_t n_headers = status + 2;
    size_t name_byte = n_headers + 4 + 4;

    expect_bad_at(1, 0, "unknown state");
    expect_bad_at(1, 3, "unknown state");
    expect_bad_at(2, 0x02, "unknown flags");
    expect_bad_at(2, 0x81, "unknown flags");
    expect_bad_at(status + 1, 0x04, "status out of range"); /* 201 + 1024 */
    expect_bad_at(n_headers + 3, 0x40, "header count");
    expect_bad_at(name_byte, 0, "NUL in a header");
    /* A header length pointing past the end. */
    expect_bad_at(n_headers + 4 + 3, 0x10, "truncated header");
}

/* Bits 2 and 3 (a duplicate waits: publish the key's end) are set by a
 * Redis fleet's scripts on any record with a flags byte; C reads past
 * them, and 0x10 and up stay refused. */
Test(record, waited_flags_are_read_past)
{
    struct store_record in = sample(), out;
    size_t len;
    uint8_t *buf = encode(&in, &len);

    for (uint8_t f = 0x04; f <= 0x0c; f += 0x04) {
        buf[2] = f;
        cr_expect_eq(decode(buf, len, &out), 0, "flags 0x%02x: %s", f, err.text);
        cr_expect_eq(out.status, in.status);
        cr_expect_not(out.body_omitted);
        store_record_clear(&out);
    }
    free(buf);
    expect_bad_at(2, 0x10, "unknown flags");
}

Test(record, omitted_flag_with_a_body_is_refused)
{
    expect_bad_at(2, 0x01, "marked omitted");
}

Test(record, bit_flips_never_crash)
{
    struct store_record in = sample(), out;
    size_t len;
    uint8_t *buf = encode(&in, &len);

    for (size_t i = 0; i < len; i++)
        for (int bit = 0; bit < 8; bit++) {
            int rc;

            buf[i] ^= (uint8_t)(1u << bit);
            rc = decode(buf, len, &out);
            cr_expect(rc == 0 || rc == -EBADMSG || rc == -EPROTO,
                      "byte %zu bit %d: %d", i, bit, rc);
            store_record_clear(&out);
            buf[i] ^= (uint8_t)(1u << bit);
        }
    free(buf);
}

Test(record, encode_refuses_out_of_range)
{
    struct store_record r = sample();
    struct store_header h = {"X", NULL};
    uint8_t *buf;
    size_t len;

    r.status = 1000;
    cr_expect_eq(record_encode(&r, &buf, &len, &err), -EINVAL);
    cr_expect_null(buf);
    r = sample();
    r.status = -1;
    cr_expect_eq(record_encode(&r, &buf, &len, &err), -EINVAL);
    r = sample();
    r.state = 0;
    cr_expect_eq(record_encode(&r, &buf, &len, &err), -EINVAL);
    r = sample();
    r.headers = &h;
    r.n_headers = 1;
    cr_expect_eq(record_encode(&r, &buf, &len, &err), -EINVAL);
    r = sample();
    r.body = NULL;
    cr_expect_eq(record_encode(&r, &buf, &len, &err), -EINVAL);
}

Test(record, peek_expiry)
{
    struct store_record in = sample();
    struct blob x;
    uint64_t e = 0;
    size_t len;
    uint8_t *buf = encode(&in, &len);

    cr_expect_eq(record_peek_expiry(buf, len, &e), 0);
    cr_expect_eq(e, in.expires_ms);
    cr_expect_eq(record_peek_expiry(buf, 15, &e), 0);
    cr_expect_eq(record_peek_expiry(buf, 14, &e), -EBADMSG);
    cr_expect_eq(record_peek_expiry(buf, 0, &e), -EBADMSG);
    buf[0] = 9;
    cr_expect_eq(record_peek_expiry(buf, len, &e), -EPROTO);
    free(buf);
    blob_v1_completed(&x, 987654321, 0);
    cr_expect_eq(record_peek_expiry(x.b, x.n, &e), 0);
    cr_expect_eq(e, 987654321);
    cr_expect_eq(record_peek_expiry(x.b, 13, &e), -EBADMSG);
}

Test(record, clear_zeroes_and_takes_null)
{
    struct store_record r = {.attempt = 3};

    r.body = malloc(4);
    r.body_len = 4;
    r.headers = calloc(1, sizeof *r.headers);
    r.headers[0].name = strdup("a");
    r.headers[0].value = strdup("b");
    r.n_headers = 1;
    store_record_clear(&r);
    cr_expect_null(r.body);
    cr_expect_null(r.headers);
    cr_expect_eq(r.attempt, 0);
    store_record_clear(NULL);
}

/* ---- v4: the verification mark (docs/contract.md §11) ---- */

Test(record, v4_round_trip_with_a_mark)
{
    struct store_record in = sample(), out;
    size_t len3, len4;
    uint8_t *buf3 = encode(&in, &len3), *buf4;

    in.verify = 2; /* VERIFY_FOUND */
    in.verified = true;
    in.verify_deadline_ms = 1700000009000ull;
    buf4 = encode(&in, &len4);
    cr_expect_eq(buf4[0], 4);
    cr_expect_eq(len4, len3 + 9, "the mark and its deadline take 9 bytes");
    cr_assert_eq(decode(buf4, len4, &out), 0, "%s", err.text);
    expect_same(&in, &out);
    cr_expect_eq(out.verify, 2);
    cr_expect(out.verified);
    cr_expect_eq(out.verify_deadline_ms, 1700000009000ull);
    store_record_clear(&out);
    /* An unmarked record decodes with no mark. */
    cr_assert_eq(decode(buf3, len3, &out), 0, "%s", err.text);
    cr_expect_eq(out.verify, 0);
    cr_expect_not(out.verified);
    store_record_clear(&out);
    free(buf3);
    free(buf4);
}

Test(record, v4_pending_in_progress)
{
    struct store_record in = sample(), out;
    uint64_t expires;
    size_t len;
    uint8_t *buf;

    in.state = STORE_IN_PROGRESS;
    in.status = 0;
    in.n_headers = 0;
    in.body_len = 0;
    in.verify = 1; /* VERIFY_PENDING */
    in.verify_deadline_ms = 1700000005000ull;
    buf = encode(&in, &len);
    cr_expect_eq(buf[0], 4);
    cr_assert_eq(decode(buf, len, &out), 0, "%s", err.text);
    cr_expect_eq(out.verify, 1);
    cr_expect_not(out.verified);
    cr_expect_eq(out.verify_deadline_ms, 1700000005000ull);
    cr_expect_eq(record_peek_expiry(buf, len, &expires), 0);
    cr_expect_eq(expires, in.expires_ms, "expires_ms stays at its offset");
    store_record_clear(&out);
    free(buf);
}

Test(record, v4_refusals)
{
    struct store_record in = sample(), out;
    size_t len;
    uint8_t *buf;

    in.verify = 5;
    cr_expect_eq(record_encode(&in, &buf, &len, &err), -EINVAL);
    cr_expect(strstr(err.text, "verification mark"), "%s", err.text);
    in.verify = 4;
    buf = encode(&in, &len);
    /* offset of the mark: version, state, flags, attempt, four times,
     * fingerprint, fence */
    buf[1 + 1 + 1 + 4 + 32 + STORE_FP_LEN + 8] = 9;
    cr_expect_eq(decode(buf, len, &out), -EBADMSG);
    cr_expect(strstr(err.text, "verification mark"), "%s", err.text);
    buf[1 + 1 + 1 + 4 + 32 + STORE_FP_LEN + 8] = 4;
    buf[2] |= 0x10; /* an unknown flag (0x04, 0x08: a duplicate waits) */
    cr_expect_eq(decode(buf, len, &out), -EBADMSG);
    buf[2] = 0x02;  /* verified in a v3 value: unknown there */
    buf[0] = 3;
    cr_expect_neq(decode(buf, len, &out), 0);
    free(buf);
}

/* ---- v5: the lease's holder (docs/contract.md §11, fleet mode) ---- */

#define HOLDER "0123456789abcdef0123456789abcdef"

/* A lease naming its holder is v5: v4's fields, then the 32-byte id at the
 * offsets the Redis scripts read (89..120, 1-based), status right after. */
Test(record, v5_names_the_holder_where_the_scripts_read_it)
{
    struct store_record in = sample(), out;
    size_t len4, len5;
    uint8_t *buf4, *buf5;

    in.state = STORE_IN_PROGRESS;
    in.status = 0;
    in.n_headers = 0;
    in.body_len = 0;
    in.verify = 1;
    in.verify_deadline_ms = 1700000005000ull;
    buf4 = encode(&in, &len4);
    strcpy(in.holder, HOLDER);
    buf5 = encode(&in, &len5);
    cr_expect_eq(buf5[0], 5);
    cr_expect_eq(len5, len4 + 32, "the holder takes 32 bytes");
    cr_expect_eq(len5, 130, "the scripts' shortest v5");
    cr_expect_arr_eq(buf5 + 88, HOLDER, 32);
    cr_expect_arr_eq(buf5 + 1, buf4 + 1, 87, "v4's fields, unchanged");
    cr_expect_arr_eq(buf5 + 120, buf4 + 88, len4 - 88, "then v4's rest");
    cr_assert_eq(decode(buf5, len5, &out), 0, "%s", err.text);
    cr_expect_str_eq(out.holder, HOLDER);
    cr_expect_eq(out.verify, 1);
    cr_expect_eq(out.lease, in.lease);
    store_record_clear(&out);
    /* v4 (an earlier release's) names none. */
    cr_assert_eq(decode(buf4, len4, &out), 0, "%s", err.text);
    cr_expect_str_eq(out.holder, "");
    store_record_clear(&out);
    free(buf4);
    free(buf5);
}

/* A short id is NUL-padded; the padding must be all NUL and the id
 * printable, or the value is corrupt. */
Test(record, v5_holder_padding_and_refusals)
{
    struct store_record in = sample(), out;
    size_t len;
    uint8_t *buf;

    strcpy(in.holder, "abc");
    buf = encode(&in, &len);
    cr_expect_eq(buf[0], 5);
    cr_expect_eq(buf[88 + 3], 0);
    cr_assert_eq(decode(buf, len, &out), 0, "%s", err.text);
    cr_expect_str_eq(out.holder, "abc");
    expect_same(&in, &out);
    store_record_clear(&out);
    buf[88 + 10] = 'x';
    cr_expect_eq(decode(buf, len, &out), -EBADMSG, "a byte after the padding");
    cr_expect(strstr(err.text, "holder"), "%s", err.text);
    buf[88 + 10] = 0;
    buf[88 + 1] = 0x07;
    cr_expect_eq(decode(buf, len, &out), -EBADMSG, "a control byte in the id");
    cr_expect_eq(decode(buf, 100, &out), -EBADMSG, "truncated in the id");
    free(buf);
}

/* Into a caller's buffer: the same bytes as record_encode, nothing written
 * past cap, and the size said when it does not fit. */
Test(record, encode_to_a_buffer)
{
    struct store_record in = sample();
    uint8_t small[16], big[1024];
    size_t len, n;
    uint8_t *buf;

    strcpy(in.holder, HOLDER);
    buf = encode(&in, &len);
    memset(small, 0x5a, sizeof small);
    cr_assert_eq(record_encode_to(&in, small, sizeof small, &n, &err), 0);
    cr_expect_eq(n, len);
    for (size_t i = 0; i < sizeof small; i++)
        cr_expect_eq(small[i], 0x5a, "nothing written when it does not fit");
    cr_assert_eq(record_encode_to(&in, big, sizeof big, &n, &err), 0);
    cr_expect_eq(n, len);
    cr_expect_arr_eq(big, buf, len);
    free(buf);
    in.status = 1000;
    cr_expect_eq(record_encode_to(&in, big, sizeof big, &n, &err), -EINVAL);
}
