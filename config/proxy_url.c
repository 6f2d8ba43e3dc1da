/* http://[user[:password]@]host:port, an upstream's `proxy`
 * (docs/contract.md §2, §3): checked when the config loads, read again by
 * the process when it builds the upstream's pools. Errors never quote the
 * URL: its userinfo is a credential. */
#include "config/config.h"
#include "config/config_internal.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "util/hex.h"

#define SCHEME "http://"

/* Copies n bytes at s into the caller's buffer, NUL-terminated; NULL when
 * it is full. */
static char *put(char **p, size_t *left, const char *s, size_t n)
{
    char *start = *p;

    if (n + 1 > *left)
        return NULL;
    memcpy(start, s, n);
    start[n] = '\0';
    *p += n + 1;
    *left -= n + 1;
    return start;
}

/* "user[:password]", n bytes at s. */
static int parse_userinfo(const char *s, size_t n, struct sc_proxy_url *o,
                          char **p, size_t *left, struct sc_error *err)
{
    const char *colon = memchr(s, ':', n);
    size_t ulen = colon ? (size_t)(colon - s) : n;
    char *user = put(p, left, s, ulen);
    char *pw = colon ? put(p, left, colon + 1, n - ulen - 1) : put(p, left, "", 0);

    if (!user || !pw)
        return -ENOSPC;
    if (!hex_unescape(user) || !hex_unescape(pw)) {
        sc_error_set(err, "bad %%-escape in the proxy's user or password");
        return -EINVAL;
    }
    o->user = user;
    o->password = pw;
    return 0;
}

static int parse_hostport(const char *s, size_t n, struct sc_proxy_url *o,
                          char **p, size_t *left, struct sc_error *err)
{
    char why[160], *host = NULL;
    int port, rc;

    rc = units_parse_authority(s, n, &host, &port, why, sizeof why);
    if (rc != 0) {
        sc_error_set(err, "invalid proxy address (%s)", why);
        return -EINVAL;
    }
    if (port <= 0) {
        free(host);
        sc_error_set(err, "the proxy needs a port from 1 to 65535 "
                     "(http://host:port)");
        return -EINVAL;
    }
    o->port = (unsigned)port;
    o->host = put(p, left, host, strlen(host));
    free(host);
    return o->host ? 0 : -ENOSPC;
}

static int parse(const char *url, struct sc_proxy_url *o, char **p,
                 size_t *left, struct sc_error *err)
{
    const char *auth = url + strlen(SCHEME), *at = NULL, *end;
    int rc;

    end = auth + strcspn(auth, "/?#");
    if (*end && strcmp(end, "/") != 0) {
        sc_error_set(err, "a proxy URL has no path, query or fragment "
                     "(http://[user:password@]host:port)");
        return -EINVAL;
    }
    /* The last '@' before the path: a password may hold an '@' itself. */
    for (const char *c = auth; c < end; c++)
        if (*c == '@')
            at = c;
    o->user = o->password = NULL;
    if (at && (rc = parse_userinfo(auth, (size_t)(at - auth), o, p, left,
                                   err)) != 0)
        return rc;
    if (at)
        auth = at + 1;
    return parse_hostport(auth, (size_t)(end - auth), o, p, left, err);
}

int config_proxy_url_parse(const char *url, struct sc_proxy_url *o, char *buf,
                           size_t buflen, struct sc_error *err)
{
    int rc;

    if (!url) {
        sc_error_set(err, "no proxy URL");
        return -EINVAL;
    }
    if (!strncasecmp(url, "https://", 8)) {
        sc_error_set(err, "https:// (TLS to the proxy itself) is not "
                     "supported: use http://host:port; a CONNECT tunnel "
                     "still carries TLS to an https upstream end to end");
        return -ENOTSUP;
    }
    if (strncasecmp(url, SCHEME, strlen(SCHEME)) != 0) {
        sc_error_set(err, "a proxy URL must start with http:// "
                     "(http://[user:password@]host:port)");
        return -EINVAL;
    }
    rc = parse(url, o, &buf, &buflen, err);
    if (rc == -ENOSPC)
        sc_error_set(err, "proxy URL too long (%zu bytes)", strlen(url));
    return rc;
}
