/* http(s)://host[:port][/base], an upstream's `url` (docs/contract.md §2,
 * §3): the host and port to connect to, the authority for Host, and the base
 * path kept in front of every forwarded path. Checked when the config loads;
 * the loader's CT_URL type calls it. */
#define _GNU_SOURCE
#include "config/config.h"
#include "config/config_internal.h"
#include "config/load_internal.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static int url_fail(char *why, size_t wlen, const char *msg)
{
    snprintf(why, wlen, "%s", msg);
    return -EINVAL;
}

/* The base path is sent as written in every request line: printable ASCII,
 * and no query or fragment, which would land in the middle of the path. */
static int url_check_path(const char *path, char *why, size_t wlen)
{
    const char *p;

    if (path[strcspn(path, "?#")])
        return url_fail(why, wlen, "a query or fragment is not allowed");
    for (p = path; *p; p++)
        if ((unsigned char)*p <= 0x20 || (unsigned char)*p >= 0x7f)
            return url_fail(why, wlen, "invalid character in the path");
    return 0;
}

int config_upstream_url_parse(const char *s, struct sc_upstream *u, char *why,
                              size_t wlen)
{
    bool https = !strncasecmp(s, "https://", 8);
    const char *auth = s + (https ? 8 : 7), *path;
    size_t alen, plen;
    char *host = NULL;
    int port;

    if (!https && strncasecmp(s, "http://", 7))
        return url_fail(why, wlen, "expected http:// or https://");
    alen = strcspn(auth, "/?#");
    /* Userinfo would be sent nowhere (HTTP has no place for it) and
     * shown in /config: a token belongs in a redacted header. */
    if (memchr(auth, '@', alen))
        return url_fail(why, wlen, "credentials in the URL are not "
                        "supported; set an Authorization header instead");
    if (alen == 0)
        return url_fail(why, wlen, "missing host");
    path = auth + alen;
    if (url_check_path(path, why, wlen) ||
        units_parse_authority(auth, alen, &host, &port, why, wlen))
        return -EINVAL;
    if (port == 0) {
        free(host);
        return url_fail(why, wlen, "port 0 is not a port to connect to");
    }
    for (plen = strlen(path); plen && path[plen - 1] == '/'; plen--)
        ;
    u->https = https;
    u->host = host;
    u->port = (uint16_t)(port > 0 ? port : https ? 443 : 80);
    u->url = strdup(s);
    u->authority = strndup(auth, alen);
    u->base_path = strndup(path, plen);
    return 0;
}
