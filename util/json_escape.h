/* Bounded text building and JSON string escaping into fixed buffers. */
#ifndef SLUICE_UTIL_JSON_ESCAPE_H
#define SLUICE_UTIL_JSON_ESCAPE_H

#include <stddef.h>

/* Appends s at *pos, truncating so buf (len bytes) stays NUL-terminated. */
void json_text_put(char *buf, size_t len, size_t *pos, const char *s);

/* Appends s as a JSON string (with quotes) to buf at *pos, escaping what JSON
 * requires (valid UTF-8 passes, stray bytes become U+FFFD); stops short of
 * len. */
void json_escape_append(char *buf, size_t len, size_t *pos, const char *s,
                        size_t slen);

#endif
