/* The TLS client context of an https upstream: peer verification (ca_file or
 * the system store) and, for partners that require mutual TLS, the client
 * certificate and key. Made once per config; a reload that changes none of
 * its settings or files keeps the context it had (up_tls_source). */
#include "proxy/upstream/upstream.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <openssl/err.h>

/* Never a prompt on the terminal for an encrypted key: --check-config
 * refuses one, and a file changed after the check fails here. */
static int no_passphrase(char *buf, int size, int rwflag, void *u)
{
    return -1;
}

static int load_verify(SSL_CTX *ctx, const struct sc_upstream *u,
                       struct sc_error *err)
{
    if (!u->tls.verify) {
        SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
        return 0;
    }
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    if (u->tls.ca_file && u->tls.ca_file[0]) {
        if (SSL_CTX_load_verify_locations(ctx, u->tls.ca_file, NULL) != 1) {
            sc_error_set(err, "upstream %s: cannot load tls.ca_file %s",
                         u->name, u->tls.ca_file);
            return -1;
        }
    } else if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
        sc_error_set(err, "upstream %s: cannot load the system CA store",
                     u->name);
        return -1;
    }
    return 0;
}

/* The certificate chain and its key, presented when the partner asks. */
static int load_client_pair(SSL_CTX *ctx, const struct sc_upstream *u,
                            struct sc_error *err)
{
    const struct sc_tls *t = &u->tls;
    char why[160] = "";

    if (!t->cert_file || !t->cert_file[0])
        return 0;
    SSL_CTX_set_default_passwd_cb(ctx, no_passphrase);
    if (SSL_CTX_use_certificate_chain_file(ctx, t->cert_file) == 1 &&
        SSL_CTX_use_PrivateKey_file(ctx, t->key_file, SSL_FILETYPE_PEM) == 1 &&
        SSL_CTX_check_private_key(ctx) == 1)
        return 0;
    ERR_error_string_n(ERR_peek_last_error(), why, sizeof why);
    sc_error_set(err, "upstream %s: cannot use tls.cert_file %s with "
                 "tls.key_file %s: %s", u->name, t->cert_file, t->key_file, why);
    return -1;
}

SSL_CTX *up_tls_ctx_new(const struct sc_upstream *u, struct sc_error *err)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());

    if (!ctx) {
        sc_error_set(err, "upstream %s: cannot create a TLS context", u->name);
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
    if (load_verify(ctx, u, err) != 0 || load_client_pair(ctx, u, err) != 0) {
        ERR_clear_error();
        SSL_CTX_free(ctx);
        return NULL;
    }
    return ctx;
}

/* ", name=path@dev:ino:size:mtime" for a file, so a file replaced or
 * rewritten in place (a rotated certificate) counts as changed. */
static size_t file_id(char *buf, size_t len, const char *name,
                      const char *path)
{
    struct stat st = {0};
    int n;

    if (!path || !path[0])
        return 0;
    stat(path, &st);
    n = snprintf(buf, len, ", %s=%s@%llu:%llu:%lld:%lld.%09ld", name, path,
                 (unsigned long long)st.st_dev, (unsigned long long)st.st_ino,
                 (long long)st.st_size, (long long)st.st_mtim.tv_sec,
                 st.st_mtim.tv_nsec);
    return n < 0 ? 0 : (size_t)n < len ? (size_t)n : len - 1;
}

void up_tls_source(const struct sc_upstream *u, char *buf, size_t len)
{
    const struct sc_tls *t = &u->tls;
    size_t n;
    int w = snprintf(buf, len, "verify=%d", t->verify);

    if (w < 0 || (size_t)w >= len)
        return;
    n = (size_t)w;
    n += file_id(buf + n, len - n, "ca", t->ca_file);
    n += file_id(buf + n, len - n, "cert", t->cert_file);
    file_id(buf + n, len - n, "key", t->key_file);
}
