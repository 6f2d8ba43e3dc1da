#include "store/record.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define FLAG_BODY_OMITTED 0x01u
#define FLAG_VERIFIED 0x02u     /* v4 only */
/* A duplicate waits for the lease to end (set by a Redis fleet's watch
 * script, record.h): publish the key's end, on the sharded channel with
 * the second bit. Only Redis writes them; every version may carry them. */
#define FLAG_WAITED 0x04u
#define FLAG_WAITED_SHARDED 0x08u
#define FLAGS_WAITED (FLAG_WAITED | FLAG_WAITED_SHARDED)
#define FLAGS_V3 (FLAG_BODY_OMITTED | FLAGS_WAITED)
#define FLAGS_V4 (FLAG_BODY_OMITTED | FLAG_VERIFIED | FLAGS_WAITED)

/* Sizes of the parts of a v3 value (see record.h); v4 adds the mark and
 * its deadline, v5 the holder. */
#define FIXED_V3 (1 + 1 + 1 + 4 + 8 * 4 + STORE_FP_LEN + 8 + 2 + 4)
#define MARK_V4 (1 + 8)
#define HOLDER_V5 STORE_HOLDER_LEN
#define HEADER_MIN 8 /* two u32 lengths */
#define STATUS_MAX 999

void store_record_clear(struct store_record *rec)
{
    if (!rec)
        return;
    if (rec->block) {
        free(rec->block);
        memset(rec, 0, sizeof *rec);
        return;
    }
    for (size_t i = 0; i < rec->n_headers; i++) {
        free(rec->headers[i].name);
        free(rec->headers[i].value);
    }
    free(rec->headers);
    free(rec->body);
    memset(rec, 0, sizeof *rec);
}

/* ---- keys ---- */

static bool scope_char(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
}

static int check_scope(const char *scope, size_t n, struct sc_error *err)
{
    if (n == 0 || n > RECORD_SCOPE_MAX) {
        sc_error_set(err, "store: scope must be 1 to %d characters, got %zu",
                     RECORD_SCOPE_MAX, n);
        return -EINVAL;
    }
    for (size_t i = 0; i < n; i++)
        if (!scope_char((unsigned char)scope[i])) {
            sc_error_set(err, "store: scope \"%s\" holds a character other "
                         "than letters, digits, \"-_.\"", scope);
            return -EINVAL;
        }
    return 0;
}

static int check_key(const char *key, size_t n, struct sc_error *err)
{
    if (n == 0 || n > RECORD_KEY_MAX) {
        sc_error_set(err, "store: key must be 1 to %d characters, got %zu",
                     RECORD_KEY_MAX, n);
        return -EINVAL;
    }
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)key[i] < 0x20 || (unsigned char)key[i] > 0x7e) {
            sc_error_set(err, "store: key holds a non-printable character at "
                         "position %zu", i + 1);
            return -EINVAL;
        }
    return 0;
}

int record_key_make(struct record_key *k, const char *scope, const char *key,
                    struct sc_error *err)
{
    size_t ns, nk;
    int rc;

    if (!scope || !key) {
        sc_error_set(err, "store: scope and key are required");
        return -EINVAL;
    }
    /* strnlen: an overlong argument is refused without reading all of it. */
    ns = strnlen(scope, RECORD_SCOPE_MAX + 1);
    nk = strnlen(key, RECORD_KEY_MAX + 1);
    if ((rc = check_scope(scope, ns, err)) != 0 ||
        (rc = check_key(key, nk, err)) != 0)
        return rc;
    memcpy(k->buf, scope, ns);
    k->buf[ns] = '\0';
    memcpy(k->buf + ns + 1, key, nk);
    k->len = ns + 1 + nk;
    return 0;
}

/* ---- writing ---- */

static uint8_t *put_u8(uint8_t *p, uint8_t v)
{
    *p = v;
    return p + 1;
}

static uint8_t *put_le(uint8_t *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (uint8_t)(v >> (8 * i));
    return p + bytes;
}

static uint8_t *put_blob(uint8_t *p, const void *b, size_t n)
{
    p = put_le(p, n, 4);
    if (n)
        memcpy(p, b, n);
    return p + n;
}

/* The version a record is written in: the oldest that holds it. A record
 * without a verification mark (or its deadline) or a holder is written as
 * v3, which earlier releases read. */
static unsigned version_of(const struct store_record *rec)
{
    if (rec->holder[0])
        return 5;
    return rec->verify != 0 || rec->verified || rec->verify_deadline_ms ? 4 : 3;
}

static size_t fixed_size(unsigned version)
{
    return FIXED_V3 + (version >= 4 ? MARK_V4 : 0) +
           (version >= 5 ? HOLDER_V5 : 0);
}

/* The encoded size, or 0 when a field does not fit the layout. */
static size_t encoded_size(const struct store_record *rec, const char **why)
{
    size_t size = fixed_size(version_of(rec)) + 4;
    size_t body = rec->body_omitted ? 0 : rec->body_len;

    if (rec->n_headers > UINT32_MAX || body > UINT32_MAX) {
        *why = "too many headers or body too large";
        return 0;
    }
    for (size_t i = 0; i < rec->n_headers; i++) {
        const struct store_header *h = &rec->headers[i];
        size_t nn, nv;

        if (!h->name || !h->value) {
            *why = "header without name or value";
            return 0;
        }
        nn = strlen(h->name);
        nv = strlen(h->value);
        if (nn > UINT32_MAX || nv > UINT32_MAX) {
            *why = "header too large";
            return 0;
        }
        size += HEADER_MIN + nn + nv;
    }
    return size + body;
}

static int check_encodable(const struct store_record *rec, const char **why)
{
    if (rec->state != STORE_IN_PROGRESS && rec->state != STORE_COMPLETED)
        *why = "unknown state";
    else if (rec->status < 0 || rec->status > STATUS_MAX)
        *why = "status out of range";
    else if (rec->n_headers && !rec->headers)
        *why = "headers missing";
    else if (!rec->body_omitted && rec->body_len && !rec->body)
        *why = "body missing";
    else if (rec->verify > RECORD_VERIFY_MAX)
        *why = "verification mark out of range";
    else if (memchr(rec->holder, '\0', sizeof rec->holder) == NULL)
        *why = "holder id not terminated";
    else
        return 0;
    return -EINVAL;
}

static void write_value(uint8_t *p, const struct store_record *rec)
{
    size_t body_len = rec->body_omitted ? 0 : rec->body_len;
    unsigned version = version_of(rec);

    p = put_u8(p, (uint8_t)version);
    p = put_u8(p, (uint8_t)rec->state);
    p = put_u8(p, (rec->body_omitted ? FLAG_BODY_OMITTED : 0) |
                      (rec->verified ? FLAG_VERIFIED : 0));
    p = put_le(p, rec->attempt, 4);
    p = put_le(p, rec->expires_ms, 8);
    p = put_le(p, rec->created_ms, 8);
    p = put_le(p, rec->lease_expires_ms, 8);
    p = put_le(p, rec->completed_ms, 8);
    memcpy(p, rec->fingerprint, STORE_FP_LEN);
    p += STORE_FP_LEN;
    p = put_le(p, rec->lease, 8);
    if (version >= 4) {
        p = put_u8(p, rec->verify);
        p = put_le(p, rec->verify_deadline_ms, 8);
    }
    if (version >= 5) {
        /* the id, NUL-padded to its field */
        memset(p, 0, HOLDER_V5);
        memcpy(p, rec->holder, strlen(rec->holder));
        p += HOLDER_V5;
    }
    p = put_le(p, (uint64_t)rec->status, 2);
    p = put_le(p, rec->n_headers, 4);
    for (size_t i = 0; i < rec->n_headers; i++) {
        const struct store_header *h = &rec->headers[i];

        p = put_blob(p, h->name, strlen(h->name));
        p = put_blob(p, h->value, strlen(h->value));
    }
    put_blob(p, rec->body, body_len);
}

int record_encode_to(const struct store_record *rec, uint8_t *buf, size_t cap,
                     size_t *out_len, struct sc_error *err)
{
    const char *why = NULL;
    size_t size = 0;

    *out_len = 0;
    if (check_encodable(rec, &why) != 0 ||
        (size = encoded_size(rec, &why)) == 0) {
        sc_error_set(err, "store: cannot encode record: %s", why);
        return -EINVAL;
    }
    *out_len = size;
    if (size <= cap)
        write_value(buf, rec);
    return 0;
}

int record_encode(const struct store_record *rec, uint8_t **out,
                  size_t *out_len, struct sc_error *err)
{
    uint8_t *buf;
    size_t size;
    int rc = record_encode_to(rec, NULL, 0, &size, err);

    *out = NULL;
    *out_len = 0;
    if (rc)
        return rc;
    buf = malloc(size);
    if (!buf) {
        sc_error_set(err, "store: out of memory encoding a record");
        return -ENOMEM;
    }
    write_value(buf, rec);
    *out = buf;
    *out_len = size;
    return 0;
}

/* ---- reading ---- */

/* A bounds-checked cursor: every read fails rather than pass the end. */
struct rd {
    const uint8_t *p;
    size_t left;
    uint8_t *tail;      /* where the next decoded string or body goes */
};

static bool get_le(struct rd *r, int bytes, uint64_t *v)
{
    if (r->left < (size_t)bytes)
        return false;
    *v = 0;
    for (int i = 0; i < bytes; i++)
        *v |= (uint64_t)r->p[i] << (8 * i);
    r->p += bytes;
    r->left -= (size_t)bytes;
    return true;
}

static bool get_bytes(struct rd *r, size_t n, const uint8_t **b)
{
    if (r->left < n)
        return false;
    *b = r->p;
    r->p += n;
    r->left -= n;
    return true;
}

/* A u32 length then that many bytes. */
static bool get_blob(struct rd *r, const uint8_t **b, size_t *n)
{
    uint64_t len;

    if (!get_le(r, 4, &len) || !get_bytes(r, (size_t)len, b))
        return false;
    *n = (size_t)len;
    return true;
}

static int bad(struct sc_error *err, const char *what)
{
    sc_error_set(err, "corrupt record: %s", what);
    return -EBADMSG;
}

/* v4's verification mark and its deadline; none before. */
static bool read_mark(struct rd *r, unsigned version, struct store_record *rec)
{
    uint64_t mark = 0;

    if (version < 4)
        return true;
    if (!get_le(r, 1, &mark) || !get_le(r, 8, &rec->verify_deadline_ms))
        return false;
    rec->verify = (uint8_t)mark;
    return true;
}

/* v5's holder: printable up to its NUL padding, NUL to the end of the
 * field; none before. */
static int read_holder(struct rd *r, unsigned version, struct store_record *rec,
                       struct sc_error *err)
{
    const uint8_t *h;
    size_t n = 0;

    if (version < 5)
        return 0;
    if (!get_bytes(r, HOLDER_V5, &h))
        return bad(err, "truncated");
    while (n < HOLDER_V5 && h[n] > 0x20 && h[n] < 0x7f)
        n++;
    for (size_t i = n; i < HOLDER_V5; i++)
        if (h[i] != 0)
            return bad(err, "holder id not printable");
    memcpy(rec->holder, h, n);
    rec->holder[n] = '\0';
    return 0;
}

/* Everything before the headers; v1 lacks the flags byte, v1 and v2 the
 * lease's fence (read as 0: no fence), v1 to v3 the verification mark
 * (none), v1 to v4 the holder (not known). */
static int read_fixed(struct rd *r, unsigned version, struct store_record *rec,
                      struct sc_error *err)
{
    uint64_t state, flags = 0, attempt, status;
    const uint8_t *fp;
    int rc;

    if (!get_le(r, 1, &state) || (version >= 2 && !get_le(r, 1, &flags)) ||
        !get_le(r, 4, &attempt) || !get_le(r, 8, &rec->expires_ms) ||
        !get_le(r, 8, &rec->created_ms) ||
        !get_le(r, 8, &rec->lease_expires_ms) ||
        !get_le(r, 8, &rec->completed_ms) ||
        !get_bytes(r, STORE_FP_LEN, &fp) ||
        (version >= 3 && !get_le(r, 8, &rec->lease)) ||
        !read_mark(r, version, rec))
        return bad(err, "truncated");
    if ((rc = read_holder(r, version, rec, err)) != 0)
        return rc;
    if (!get_le(r, 2, &status))
        return bad(err, "truncated");
    if (state != STORE_IN_PROGRESS && state != STORE_COMPLETED)
        return bad(err, "unknown state");
    if (flags & ~(uint64_t)(version >= 4 ? FLAGS_V4 : FLAGS_V3))
        return bad(err, "unknown flags");
    if (rec->verify > RECORD_VERIFY_MAX)
        return bad(err, "unknown verification mark");
    if (status > STATUS_MAX)
        return bad(err, "status out of range");
    rec->state = (enum store_state)state;
    rec->body_omitted = flags & FLAG_BODY_OMITTED;
    rec->verified = flags & FLAG_VERIFIED;
    rec->attempt = (uint32_t)attempt;
    memcpy(rec->fingerprint, fp, STORE_FP_LEN);
    rec->status = (int)status;
    return 0;
}

/* A stored header name or value as a C string in the record's block: NUL
 * inside means corruption, since the caller would silently see a shorter
 * string. */
static int read_string(struct rd *r, char **out, struct sc_error *err)
{
    const uint8_t *b;
    size_t n;

    if (!get_blob(r, &b, &n))
        return bad(err, "truncated header");
    if (memchr(b, '\0', n))
        return bad(err, "NUL in a header");
    *out = (char *)r->tail;
    memcpy(*out, b, n);
    (*out)[n] = '\0';
    r->tail += n + 1;
    return 0;
}

static int read_headers(struct rd *r, struct store_record *rec,
                        struct sc_error *err)
{
    uint64_t n;
    int rc;

    if (!get_le(r, 4, &n))
        return bad(err, "truncated");
    if (n == 0)
        return 0;
    /* Bound the count by the bytes left before allocating for it. */
    if (n > r->left / HEADER_MIN)
        return bad(err, "header count exceeds the value");
    /* One block for the array, the strings and the body (a replay costs one
     * allocation, not two per header): each string takes its bytes and a
     * NUL where the value spent a 4-byte length, so what is left of the
     * value bounds the rest. */
    rec->block = malloc((size_t)n * sizeof *rec->headers + r->left);
    if (!rec->block) {
        sc_error_set(err, "out of memory decoding a record");
        return -ENOMEM;
    }
    rec->headers = rec->block;
    memset(rec->headers, 0, (size_t)n * sizeof *rec->headers);
    r->tail = (uint8_t *)(rec->headers + n);
    /* A failure below leaves nothing but the block to free. */
    for (size_t i = 0; i < n; i++) {
        struct store_header *h = &rec->headers[i];

        if ((rc = read_string(r, &h->name, err)) != 0 ||
            (rc = read_string(r, &h->value, err)) != 0)
            return rc;
    }
    rec->n_headers = n;
    return 0;
}

static int read_body(struct rd *r, struct store_record *rec,
                     struct sc_error *err)
{
    const uint8_t *b;
    size_t n;

    if (!get_blob(r, &b, &n))
        return bad(err, "truncated body");
    if (rec->body_omitted && n)
        return bad(err, "body stored although marked omitted");
    if (r->left)
        return bad(err, "trailing bytes");
    if (n == 0)
        return 0;
    rec->body = rec->block ? r->tail : malloc(n);
    if (!rec->body) {
        sc_error_set(err, "out of memory decoding a record");
        return -ENOMEM;
    }
    memcpy(rec->body, b, n);
    rec->body_len = n;
    return 0;
}

static int read_version(struct rd *r, unsigned *version, struct sc_error *err)
{
    uint64_t v;

    if (!get_le(r, 1, &v))
        return bad(err, "empty value");
    if (v < 1 || v > RECORD_VERSION) {
        sc_error_set(err, "record version %u is unknown (this build "
                     "reads versions 1 to %d)", (unsigned)v, RECORD_VERSION);
        return -EPROTO;
    }
    *version = (unsigned)v;
    return 0;
}

int record_decode(const uint8_t *buf, size_t len, struct store_record *rec,
                  struct sc_error *err)
{
    struct rd r = {.p = buf, .left = len};
    unsigned version;
    int rc;

    memset(rec, 0, sizeof *rec);
    if ((rc = read_version(&r, &version, err)) != 0 ||
        (rc = read_fixed(&r, version, rec, err)) != 0 ||
        (rc = read_headers(&r, rec, err)) != 0 ||
        (rc = read_body(&r, rec, err)) != 0)
        goto fail;
    return 0;
fail:
    store_record_clear(rec);
    return rc;
}

int record_peek_expiry(const uint8_t *buf, size_t len, uint64_t *expires_ms)
{
    struct rd r = {.p = buf, .left = len};
    unsigned version;
    uint64_t skip;

    if (read_version(&r, &version, NULL) != 0)
        return len ? -EPROTO : -EBADMSG;
    /* state, flags (v2 only), attempt */
    if (!get_le(&r, 1, &skip) || (version >= 2 && !get_le(&r, 1, &skip)) ||
        !get_le(&r, 4, &skip) || !get_le(&r, 8, expires_ms))
        return -EBADMSG;
    return 0;
}
