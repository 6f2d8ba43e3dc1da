#include "policies/headers.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

static const char *const fixed_hop[] = {
    "Connection", "Keep-Alive", "TE", "Trailer", "Transfer-Encoding",
    "Upgrade", NULL,
};

static bool is_tchar(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c >= '0' && c <= '9') || strchr("!#$%&'*+-.^_`|~", c);
}

bool hdr_valid_name(const char *name)
{
    if (!name || !*name)
        return false;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        if (!is_tchar(*p))
            return false;
    return true;
}

bool hdr_valid_value(const char *value)
{
    return value && !strpbrk(value, "\r\n");
}

void hdr_conn_tokens_add(struct hdr_conn_tokens *t, const char *value)
{
    size_t used = 0;

    for (size_t i = 0; i < t->n; i++)
        used += strlen(t->name[i]) + 1;
    while (*value && t->n < HDR_MAX_CONN_TOKENS) {
        size_t skip = strspn(value, " \t,");
        size_t len;

        value += skip;
        len = strcspn(value, " \t,");
        if (len == 0)
            break;
        if (used + len + 1 > sizeof t->buf)
            break;
        memcpy(t->buf + used, value, len);
        t->buf[used + len] = '\0';
        t->name[t->n++] = t->buf + used;
        used += len + 1;
        value += len;
    }
}

bool hdr_is_hop_by_hop(const char *name, const struct hdr_conn_tokens *t)
{
    for (size_t i = 0; fixed_hop[i]; i++)
        if (strcasecmp(name, fixed_hop[i]) == 0)
            return true;
    if (strncasecmp(name, "Proxy-", 6) == 0)
        return true;
    for (size_t i = 0; t && i < t->n; i++)
        if (strcasecmp(name, t->name[i]) == 0)
            return true;
    return false;
}

bool hdr_skip_request(const char *name, const struct hdr_conn_tokens *t)
{
    return hdr_is_hop_by_hop(name, t) || strcasecmp(name, "Host") == 0 ||
           strcasecmp(name, "Content-Length") == 0 ||
           strncasecmp(name, "Sluice-", 7) == 0;
}

bool hdr_skip_response(const char *name, const struct hdr_conn_tokens *t)
{
    return hdr_is_hop_by_hop(name, t) ||
           strcasecmp(name, "Content-Length") == 0;
}
