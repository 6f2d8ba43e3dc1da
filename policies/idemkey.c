#include "policies/idemkey.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <openssl/evp.h>

#include "config/config.h"

static int sf_unquote(const char *raw, char *out, char *why, size_t wlen)
{
    size_t n = 0;
    const char *p = raw + 1;

    for (; *p && *p != '"'; p++) {
        unsigned char c = (unsigned char)*p;

        if (c == '\\') {
            p++;
            if (*p != '"' && *p != '\\') {
                snprintf(why, wlen, "invalid escape in quoted key");
                return -EINVAL;
            }
            c = (unsigned char)*p;
        } else if (c < 0x20 || c > 0x7e) {
            snprintf(why, wlen, "quoted key holds a non-printable character");
            return -EINVAL;
        }
        if (n == IDEM_KEY_MAX) {
            snprintf(why, wlen, "key longer than %d characters", IDEM_KEY_MAX);
            return -EINVAL;
        }
        out[n++] = (char)c;
    }
    if (*p != '"' || p[1] != '\0') {
        snprintf(why, wlen, "unterminated quoted key or text after it");
        return -EINVAL;
    }
    if (n == 0) {
        snprintf(why, wlen, "empty key");
        return -EINVAL;
    }
    out[n] = '\0';
    return 0;
}

int idem_key_parse(const char *raw, char out[IDEM_KEY_MAX + 1], char *why,
                   size_t wlen)
{
    size_t n;

    if (raw[0] == '"')
        return sf_unquote(raw, out, why, wlen);
    n = strlen(raw);
    if (n == 0 || n > IDEM_KEY_MAX) {
        snprintf(why, wlen, "key must be 1 to %d characters, got %zu",
                 IDEM_KEY_MAX, n);
        return -EINVAL;
    }
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)raw[i] < 0x21 || (unsigned char)raw[i] > 0x7e) {
            snprintf(why, wlen, "key holds a character that is not visible "
                                "ASCII at position %zu", i + 1);
            return -EINVAL;
        }
    memcpy(out, raw, n + 1);
    return 0;
}

static void part(EVP_MD_CTX *ctx, const void *p, size_t len)
{
    unsigned char be[8];

    for (int i = 0; i < 8; i++)
        be[i] = (unsigned char)((uint64_t)len >> (56 - 8 * i));
    EVP_DigestUpdate(ctx, be, sizeof be);
    if (len)
        EVP_DigestUpdate(ctx, p, len);
}

/* SHA-256 fetched once: with OpenSSL 3, EVP_sha256() in every
 * EVP_DigestInit_ex looks the algorithm up in the provider each time
 * (about half of a fingerprint's 10k instructions). Kept for the process;
 * EVP_sha256() is the fallback when the fetch fails. The digest context is
 * one per thread, kept for its life: a new one per fingerprint was three
 * more allocations per keyed request (OpenSSL 3.0 still makes one in each
 * EVP_DigestInit_ex). */
static EVP_MD *sha256_md;
static pthread_key_t ctx_key;
static bool ctx_key_made;
static pthread_once_t sha256_once = PTHREAD_ONCE_INIT;

static void ctx_free(void *ctx)
{
    EVP_MD_CTX_free(ctx);
}

static void sha256_fetch(void)
{
    sha256_md = EVP_MD_fetch(NULL, "SHA2-256", NULL);
    ctx_key_made = pthread_key_create(&ctx_key, ctx_free) == 0;
}

static const EVP_MD *sha256(void)
{
    pthread_once(&sha256_once, sha256_fetch);
    return sha256_md ? sha256_md : EVP_sha256();
}

/* This thread's context, or a new one the caller frees (*own) when the
 * thread cannot keep one. */
static EVP_MD_CTX *thread_ctx(bool *own)
{
    EVP_MD_CTX *ctx;

    pthread_once(&sha256_once, sha256_fetch);
    *own = !ctx_key_made;
    if (*own)
        return EVP_MD_CTX_new();
    if ((ctx = pthread_getspecific(ctx_key)) != NULL)
        return ctx;
    if ((ctx = EVP_MD_CTX_new()) != NULL && pthread_setspecific(ctx_key, ctx) != 0)
        *own = true;
    return ctx;
}

void idem_fingerprint(unsigned parts, const char *method, const char *target,
                      const void *body, size_t body_len, uint8_t out[32])
{
    bool own;
    EVP_MD_CTX *ctx = thread_ctx(&own);
    unsigned int len = 32;

    if (!ctx) {
        memset(out, 0, 32);
        return;
    }
    EVP_DigestInit_ex(ctx, sha256(), NULL);
    if (parts & SC_FP_METHOD)
        part(ctx, method, strlen(method));
    if (parts & SC_FP_PATH)
        part(ctx, target, strlen(target));
    if (parts & SC_FP_BODY)
        part(ctx, body, body_len);
    EVP_DigestFinal_ex(ctx, out, &len);
    if (own)
        EVP_MD_CTX_free(ctx);
}
