/* Idempotency keys (policies/idemkey.h) from arbitrary header values: a key
 * that parses is 1 to 255 printable ASCII characters (a bare one visible
 * ASCII, exactly as sent), survives re-quoting, and is one the store takes
 * (store/record.h); a refusal always says why. The same bytes then go
 * through the request fingerprint. */
#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "fuzz_check.h"
#include "config/config.h"
#include "policies/idemkey.h"
#include "store/record.h"

static void check_key(const char *raw, const char *key)
{
    size_t n = strlen(key);
    bool quoted = raw[0] == '"';
    struct record_key rk;
    struct sc_error err = {0};

    FUZZ_CHECK(n >= 1 && n <= IDEM_KEY_MAX, "key of %zu characters", n);
    for (size_t i = 0; i < n; i++)
        FUZZ_CHECK(key[i] >= (quoted ? 0x20 : 0x21) && key[i] <= 0x7e,
                   "byte 0x%02x at %zu", (unsigned char)key[i], i);
    if (!quoted)
        FUZZ_CHECK(!strcmp(raw, key), "bare key changed: \"%s\"", key);
    FUZZ_CHECK(record_key_make(&rk, "fuzz", key, &err) == 0,
               "the store refuses \"%s\": %s", key, err.text);
}

/* Quoting the key as RFC 8941 does and parsing it again gives it back. */
static void check_requote(const char *key)
{
    char q[2 * IDEM_KEY_MAX + 3], back[IDEM_KEY_MAX + 1], why[128] = "";
    size_t o = 0;

    q[o++] = '"';
    for (const char *p = key; *p; p++) {
        if (*p == '"' || *p == '\\')
            q[o++] = '\\';
        q[o++] = *p;
    }
    q[o++] = '"';
    q[o] = '\0';
    FUZZ_CHECK(idem_key_parse(q, back, why, sizeof why) == 0,
               "re-quoted key refused: %s", why);
    FUZZ_CHECK(!strcmp(back, key), "\"%s\" came back as \"%s\"", key, back);
}

/* Splitting the same bytes elsewhere between method and target must change
 * the fingerprint: each part is length-prefixed. */
static void check_fingerprint(const char *s, const uint8_t *body, size_t len)
{
    size_t n = strlen(s), k = n / 2;
    char *a, *b;
    uint8_t fa[32], fb[32], fc[32];
    const unsigned all = SC_FP_METHOD | SC_FP_PATH | SC_FP_BODY;

    if (n == 0 || !(a = malloc(2 * (n + 2))))
        return;
    b = a + n + 2;
    memcpy(a, s, k);
    a[k] = '\0';
    memcpy(b, s, k + 1);
    b[k + 1] = '\0';
    idem_fingerprint(all, a, s + k, body, len, fa);
    idem_fingerprint(all, b, s + k + 1, body, len, fb);
    idem_fingerprint(all, a, s + k, body, len, fc);
    FUZZ_CHECK(memcmp(fa, fb, 32) != 0, "split at %zu and %zu collide", k,
               k + 1);
    FUZZ_CHECK(memcmp(fa, fc, 32) == 0, "fingerprint not deterministic");
    free(a);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *raw = fuzz_strndup(data, size);
    char key[IDEM_KEY_MAX + 1], why[128] = "";
    int rc;

    if (!raw)
        return 0;
    rc = idem_key_parse(raw, key, why, sizeof why);
    if (rc == 0) {
        check_key(raw, key);
        check_requote(key);
    } else {
        FUZZ_CHECK(rc == -EINVAL && why[0], "rc %d, why \"%s\"", rc, why);
    }
    /* The whole input, NULs included, is the body. */
    check_fingerprint(raw, data, size);
    free(raw);
    return 0;
}
