/* Hex digits and percent-decoding, for paths and the URLs of the config
 * (Redis, egress proxies). */
#ifndef SLUICE_UTIL_HEX_H
#define SLUICE_UTIL_HEX_H

#include <stdbool.h>

/* 0..15, or -1 when c is not a hex digit (either case). */
static inline int hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Decodes %XX escapes of the string in place; false on a malformed
 * escape or a %00 (which would cut the string short). */
bool hex_unescape(char *s);

#endif
