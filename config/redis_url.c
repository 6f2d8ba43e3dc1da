/* redis[s]://[[user]:password@]host[:port][/db], the config's store.url
 * (docs/contract.md §10): checked when the config loads, read again by
 * the process when it opens the Redis store. rediss:// is TLS; a user is a
 * Redis 6+ ACL user (AUTH user password). */
#include "config/config.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/hex.h"

#define DEFAULT_PORT 6379
#define SCHEME "redis://"
#define TLS_SCHEME "rediss://"

/* Appends bytes to the caller's buffer, NUL-terminated. */
struct out {
    char *p;
    size_t left;
};

static char *put(struct out *o, const char *s, size_t n)
{
    char *start = o->p;

    if (n + 1 > o->left)
        return NULL;
    memcpy(o->p, s, n);
    o->p[n] = '\0';
    o->p += n + 1;
    o->left -= n + 1;
    return start;
}

/* A %-decoded part of the userinfo into out: 0, -ENOSPC, or -EINVAL. */
static int put_decoded(struct out *out, const char *s, size_t n,
                       const char *what, const char **dst, struct sc_error *err)
{
    char *v = put(out, s, n);

    if (!v)
        return -ENOSPC;
    if (!hex_unescape(v)) {
        sc_error_set(err, "bad %%-escape in the %s", what);
        return -EINVAL;
    }
    *dst = *v ? v : NULL;
    return 0;
}

/* "user:password", ":password" (the default user) or "default:password"
 * before '@'. A user needs a password: Redis's AUTH takes both. */
static int parse_userinfo(const char *s, size_t n, struct sc_redis_url *o,
                          struct out *out, struct sc_error *err)
{
    const char *colon = memchr(s, ':', n);
    int rc;

    if (!colon) {
        sc_error_set(err, "write the credentials as redis://user:password@host "
                     "or redis://:password@host (the default user)");
        return -EINVAL;
    }
    o->user = NULL;
    if ((rc = put_decoded(out, s, (size_t)(colon - s), "user name", &o->user, err)) ||
        (rc = put_decoded(out, colon + 1, n - (size_t)(colon + 1 - s), "password",
                          &o->password, err)))
        return rc;
    if (o->user && !o->password) {
        sc_error_set(err, "user \"%s\" needs a password (redis://user:password@host)",
                     o->user);
        return -EINVAL;
    }
    return 0;
}

/* A decimal in [min, max] made of the n bytes at s. */
static bool number(const char *s, size_t n, unsigned long min,
                   unsigned long max, unsigned *v)
{
    unsigned long x = 0;

    if (n == 0 || n > 10)
        return false;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        x = x * 10 + (unsigned long)(s[i] - '0');
    }
    if (x < min || x > max)
        return false;
    *v = (unsigned)x;
    return true;
}

/* host[:port] or [v6]:port, n bytes at s. */
static int parse_hostport(const char *s, size_t n, struct sc_redis_url *o,
                          struct out *out, struct sc_error *err)
{
    const char *end = s + n, *host = s, *hend, *port = NULL;

    if (n && s[0] == '[') {
        host = s + 1;
        if (!(hend = memchr(s, ']', n)))
            goto bad;
        if (hend + 1 < end && hend[1] != ':')
            goto bad;
        port = hend + 1 < end ? hend + 2 : NULL;
    } else {
        hend = memchr(s, ':', n);
        port = hend ? hend + 1 : NULL;
        if (!hend)
            hend = end;
    }
    if (hend == host)
        goto bad;
    o->port = DEFAULT_PORT;
    if (port && !number(port, (size_t)(end - port), 1, 65535, &o->port)) {
        sc_error_set(err, "port must be 1 to 65535");
        return -EINVAL;
    }
    if (!(o->host = put(out, host, (size_t)(hend - host))))
        return -ENOSPC;
    return 0;
bad:
    sc_error_set(err, "a host is required "
                 "(redis[s]://[[user]:password@]host:port/db)");
    return -EINVAL;
}

static int parse_db(const char *path, struct sc_redis_url *o,
                    struct sc_error *err)
{
    o->db = 0;
    if (!*path || !strcmp(path, "/"))
        return 0;
    if (!number(path + 1, strlen(path + 1), 0, 1u << 20, &o->db)) {
        sc_error_set(err, "\"%s\" is not a database "
                     "number (redis://host:port/db)", path);
        return -EINVAL;
    }
    return 0;
}

static int parse(const char *auth, struct sc_redis_url *o, struct out *out,
                 struct sc_error *err)
{
    const char *at, *path;
    int rc;

    path = strchr(auth, '/');
    if (!path)
        path = auth + strlen(auth);
    /* The last '@' before the path: a password may hold an '@' itself. */
    at = NULL;
    for (const char *p = auth; p < path; p++)
        if (*p == '@')
            at = p;
    o->password = o->user = NULL;
    if (at && (rc = parse_userinfo(auth, (size_t)(at - auth), o, out, err)) != 0)
        return rc;
    if (at)
        auth = at + 1;
    if ((rc = parse_hostport(auth, (size_t)(path - auth), o, out, err)) != 0)
        return rc;
    return parse_db(path, o, err);
}

int config_redis_url_parse(const char *url, struct sc_redis_url *o,
                          char *buf, size_t buflen, struct sc_error *err)
{
    struct out out = {buf, buflen};
    int rc;

    if (!url) {
        sc_error_set(err, "a NULL url");
        return -EINVAL;
    }
    o->tls = !strncmp(url, TLS_SCHEME, strlen(TLS_SCHEME));
    if (!o->tls && strncmp(url, SCHEME, strlen(SCHEME)) != 0) {
        /* Not echoed: it may hold a password. */
        sc_error_set(err, "a redis url must start with redis:// or rediss:// (TLS)");
        return -EINVAL;
    }
    rc = parse(url + strlen(o->tls ? TLS_SCHEME : SCHEME), o, &out, err);
    if (rc == -ENOSPC)
        sc_error_set(err, "redis url too long (%zu bytes)", strlen(url));
    return rc;
}
