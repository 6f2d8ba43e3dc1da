/* A TLS client's context and per-connection settings, shared by every TLS
 * client sluice has: the upstream client (proxy/upstream/tls.c) and the
 * Redis store's connections (store/redis_conn.c), so that verification,
 * client certificates and SNI behave alike everywhere. */
#ifndef SLUICE_UTIL_TLS_CLIENT_H
#define SLUICE_UTIL_TLS_CLIENT_H

#include <stdbool.h>

#include <openssl/ssl.h>

#include "util/error.h"

struct tls_client_files {
    bool verify;           /* chain and name checked */
    const char *ca_file;   /* NULL or "": the system store */
    const char *cert_file; /* NULL or "": no client certificate */
    const char *key_file;  /* its private key (PEM), with cert_file */
};

/* A TLS 1.2+ client context; who prefixes messages ("upstream x",
 * "store"). NULL with err when a file cannot be used. */
SSL_CTX *tls_client_ctx_new(const struct tls_client_files *f, const char *who,
                            struct sc_error *err);

/* Sets up one connection's SSL for host: SNI for a name, and (with verify)
 * the name or the IP literal checked against the certificate. */
void tls_client_ssl_host(SSL *ssl, const char *host, bool verify);

/* Whether host is an IPv4 or IPv6 literal (never sent as SNI). */
bool tls_is_ip_literal(const char *host);

#endif
