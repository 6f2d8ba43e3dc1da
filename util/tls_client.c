/* The TLS client settings every TLS client of sluice shares (tls_client.h). */
#include "util/tls_client.h"

#include <arpa/inet.h>

#include <openssl/err.h>
#include <openssl/x509v3.h>

/* Never a prompt on the terminal for an encrypted key: --check-config
 * refuses one, and a file changed after the check fails here. */
static int no_passphrase(char *buf, int size, int rwflag, void *u)
{
    (void)buf, (void)size, (void)rwflag, (void)u;
    return -1;
}

static int load_verify(SSL_CTX *ctx, const struct tls_client_files *f,
                       const char *who, struct sc_error *err)
{
    if (!f->verify) {
        SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
        return 0;
    }
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    if (f->ca_file && f->ca_file[0]) {
        if (SSL_CTX_load_verify_locations(ctx, f->ca_file, NULL) != 1) {
            sc_error_set(err, "%s: cannot load tls.ca_file %s", who, f->ca_file);
            return -1;
        }
    } else if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
        sc_error_set(err, "%s: cannot load the system CA store", who);
        return -1;
    }
    return 0;
}

/* The certificate chain and its key, presented when the server asks. */
static int load_client_pair(SSL_CTX *ctx, const struct tls_client_files *f,
                            const char *who, struct sc_error *err)
{
    char why[160] = "";

    if (!f->cert_file || !f->cert_file[0])
        return 0;
    SSL_CTX_set_default_passwd_cb(ctx, no_passphrase);
    if (SSL_CTX_use_certificate_chain_file(ctx, f->cert_file) == 1 &&
        SSL_CTX_use_PrivateKey_file(ctx, f->key_file ? f->key_file : "",
                                    SSL_FILETYPE_PEM) == 1 &&
        SSL_CTX_check_private_key(ctx) == 1)
        return 0;
    ERR_error_string_n(ERR_peek_last_error(), why, sizeof why);
    sc_error_set(err, "%s: cannot use tls.cert_file %s with tls.key_file %s: %s",
                 who, f->cert_file, f->key_file ? f->key_file : "", why);
    return -1;
}

SSL_CTX *tls_client_ctx_new(const struct tls_client_files *f, const char *who,
                            struct sc_error *err)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());

    if (!ctx) {
        sc_error_set(err, "%s: cannot create a TLS context", who);
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
    if (load_verify(ctx, f, who, err) != 0 ||
        load_client_pair(ctx, f, who, err) != 0) {
        ERR_clear_error();
        SSL_CTX_free(ctx);
        return NULL;
    }
    return ctx;
}

bool tls_is_ip_literal(const char *host)
{
    unsigned char buf[16];

    return inet_pton(AF_INET, host, buf) == 1 ||
           inet_pton(AF_INET6, host, buf) == 1;
}

void tls_client_ssl_host(SSL *ssl, const char *host, bool verify)
{
    if (tls_is_ip_literal(host)) {
        if (verify)
            X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), host);
        return;
    }
    SSL_set_tlsext_host_name(ssl, host);
    if (verify)
        SSL_set1_host(ssl, host);
}
