/* Bounded text building and JSON string escaping, for the log lines, the
 * problem bodies and the instructions, which are written into fixed buffers
 * on the request path without an allocation. */
#include "util/json_escape.h"

#include <stdio.h>
#include <string.h>

void json_text_put(char *buf, size_t len, size_t *pos, const char *s)
{
    size_t n = strlen(s);

    if (*pos + n >= len)
        n = *pos < len ? len - *pos - 1 : 0;
    memcpy(buf + *pos, s, n);
    *pos += n;
    buf[*pos] = '\0';
}

/* Length of a valid UTF-8 sequence at p (2 to 4), or 0. */
static size_t utf8_len(const unsigned char *p, size_t left)
{
    size_t n = p[0] >= 0xf0 && p[0] <= 0xf4 ? 4 : p[0] >= 0xe0 ? 3
             : p[0] >= 0xc2 && p[0] <= 0xdf ? 2 : 0;

    if (n == 0 || n > left)
        return 0;
    for (size_t i = 1; i < n; i++)
        if ((p[i] & 0xc0) != 0x80)
            return 0;
    /* No overlong forms, no surrogates, nothing above U+10FFFF. */
    if ((p[0] == 0xe0 && p[1] < 0xa0) || (p[0] == 0xed && p[1] > 0x9f) ||
        (p[0] == 0xf0 && p[1] < 0x90) || (p[0] == 0xf4 && p[1] > 0x8f))
        return 0;
    return n;
}

void json_escape_append(char *buf, size_t len, size_t *pos, const char *s,
                        size_t slen)
{
    char esc[8];

    json_text_put(buf, len, pos, "\"");
    for (size_t i = 0; i < slen && *pos + 8 < len; i++) {
        unsigned char c = (unsigned char)s[i];
        size_t u = c >= 0x80 ? utf8_len((const unsigned char *)s + i, slen - i) : 0;

        if (u) {
            /* Valid UTF-8 passes through; stray bytes become U+FFFD below,
             * so the line stays valid JSON whatever the input was. */
            memcpy(esc, s + i, u);
            esc[u] = '\0';
            i += u - 1;
        } else if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            esc[2] = '\0';
        } else if (c >= 0x80) {
            snprintf(esc, sizeof esc, "\\ufffd");
        } else if (c < 0x20 || c == 0x7f) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
        } else {
            esc[0] = (char)c;
            esc[1] = '\0';
        }
        json_text_put(buf, len, pos, esc);
    }
    json_text_put(buf, len, pos, "\"");
}

