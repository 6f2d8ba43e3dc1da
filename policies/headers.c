#include "policies/headers.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

/* Names are compared by length first, then case-insensitively: most names
 * on a request differ in length from every name looked for, so the usual
 * header costs a strlen and a few integer compares instead of a dozen
 * strcasecmp (about 75 per proxied request before). */
struct hdr_name {
    const char *s;
    size_t len;
};

#define HDR_NAME(lit) { lit, sizeof lit - 1 }

static const struct hdr_name fixed_hop[] = {
    HDR_NAME("TE"), HDR_NAME("Trailer"), HDR_NAME("Upgrade"),
    HDR_NAME("Connection"), HDR_NAME("Keep-Alive"),
    HDR_NAME("Transfer-Encoding"),
};

static bool name_is(const char *name, size_t len, const char *lit, size_t lit_len)
{
    return len == lit_len && strncasecmp(name, lit, len) == 0;
}

static bool has_prefix(const char *name, size_t len, const char *lit, size_t lit_len)
{
    return len >= lit_len && strncasecmp(name, lit, lit_len) == 0;
}

static bool hop_by_hop_n(const char *name, size_t len,
                         const struct hdr_conn_tokens *t)
{
    for (size_t i = 0; i < sizeof fixed_hop / sizeof fixed_hop[0]; i++)
        if (name_is(name, len, fixed_hop[i].s, fixed_hop[i].len))
            return true;
    if (has_prefix(name, len, "Proxy-", 6))
        return true;
    for (size_t i = 0; t && i < t->n; i++)
        if (name_is(name, len, t->name[i], strlen(t->name[i])))
            return true;
    return false;
}

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
    return hop_by_hop_n(name, strlen(name), t);
}

bool hdr_skip_request(const char *name, const struct hdr_conn_tokens *t)
{
    size_t len = strlen(name);

    return hop_by_hop_n(name, len, t) || name_is(name, len, "Host", 4) ||
           name_is(name, len, "Content-Length", 14) ||
           has_prefix(name, len, "Sluice-", 7);
}

bool hdr_skip_response(const char *name, const struct hdr_conn_tokens *t)
{
    size_t len = strlen(name);

    return hop_by_hop_n(name, len, t) || name_is(name, len, "Content-Length", 14);
}
