/* The TLS client context of an https upstream: peer verification (ca_file or
 * the system store) and, for partners that require mutual TLS, the client
 * certificate and key (util/tls_client.c, shared with the Redis store's
 * connections). Made once per config; a reload that changes none of
 * its settings or files keeps the context it had (up_tls_source). */
#include "proxy/upstream/upstream.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "util/tls_client.h"

SSL_CTX *up_tls_ctx_new(const struct sc_upstream *u, struct sc_error *err)
{
    struct tls_client_files f = {u->tls.verify, u->tls.ca_file,
                                 u->tls.cert_file, u->tls.key_file};
    char who[256];

    snprintf(who, sizeof who, "upstream %s", u->name);
    return tls_client_ctx_new(&f, who, err);
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
