#include "util/hex.h"

bool hex_unescape(char *s)
{
    char *w = s;

    for (const char *r = s; *r; r++) {
        int hi, lo;

        if (*r != '%') {
            *w++ = *r;
            continue;
        }
        if ((hi = hex_digit(r[1])) < 0 || (lo = hex_digit(r[2])) < 0 ||
            (hi == 0 && lo == 0))
            return false;
        *w++ = (char)(hi * 16 + lo);
        r += 2;
    }
    *w = '\0';
    return true;
}
