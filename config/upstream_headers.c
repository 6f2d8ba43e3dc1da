/* An upstream's `headers` (docs/contract.md §3): which names an operator may
 * set on every request to the partner, and which values. The loader's
 * CT_HEADERS type reads the mapping and asks here about each entry. */
#include "config/config.h"
#include "config/config_internal.h"
#include "config/load_internal.h"

#include <string.h>
#include <strings.h>

/* Headers sluice itself owns on the upstream connection. Proxy-* are
 * hop-by-hop: Proxy-Authorization comes from the `proxy` URL's userinfo, and
 * one set here would reach the partner through a tunnel. */
static bool reserved(const char *name)
{
    static const char *const owned[] = {
        "Host", "Content-Length", "Transfer-Encoding", "Connection",
        "Keep-Alive", "TE", "Trailer", "Upgrade", NULL,
    };
    const char *const *o;

    if (!strncasecmp(name, "Proxy-", 6))
        return true;
    for (o = owned; *o; o++)
        if (!strcasecmp(*o, name))
            return true;
    return false;
}

const char *config_header_name_problem(const char *name)
{
    if (reserved(name))
        return "reserved";
    return units_is_token(name) ? NULL : "invalid";
}

const char *config_header_value_problem(const char *value)
{
    /* A CR or LF would end the header line and start another one: header
     * injection into every request. */
    return strpbrk(value, "\r\n") ? "a header value must not contain CR or LF" : NULL;
}
