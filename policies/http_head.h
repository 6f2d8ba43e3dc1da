/* Strict checks of an HTTP/1.1 request head (RFC 9112 sections 2-7, RFC 9110
 * section 5): what a proxy must refuse rather than pass on, because the
 * next hop might read the same bytes differently (request smuggling).
 * Pure: the proxy feeds it the pieces its server library parsed, a fuzzer
 * feeds it raw bytes through http_head_parse_check. */
#ifndef SLUICE_POLICIES_HTTP_HEAD_H
#define SLUICE_POLICIES_HTTP_HEAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/error.h"

struct http_field {
    const char *name;
    size_t name_len;
    const char *value;      /* without the leading and trailing OWS */
    size_t value_len;       /* every byte received, NULs included */
};

struct http_head {
    const char *method;
    size_t method_len;
    const char *target;     /* the request-target as received */
    size_t target_len;
    const char *version;
    size_t version_len;
    const struct http_field *fields;
    size_t n_fields;
};

enum http_target_form {
    HTTP_TARGET_INVALID = 0,
    HTTP_TARGET_ORIGIN,     /* "/path?query" */
    HTTP_TARGET_ABSOLUTE,   /* "http://authority/path?query" (or https) */
};

/* RFC 9110 5.6.2: 1*tchar. */
bool http_method_is_token(const char *s, size_t n);
/* A field name is a token too (no space before the colon, no folding). */
bool http_header_name_valid(const char *s, size_t n);
/* field-value: VCHAR, obs-text, SP and HTAB only; no NUL, CR, LF or other
 * control character. */
bool http_header_value_valid(const char *s, size_t n);
/* The form of a request-target whose bytes are all visible ASCII; INVALID
 * for anything else (asterisk-form and authority-form included: sluice
 * serves neither OPTIONS * nor CONNECT). */
enum http_target_form http_target_form(const char *s, size_t n);
/* "HTTP/1.x". */
bool http_version_valid(const char *s, size_t n);

/* Checks a whole head: request line, field names and values, and message
 * framing (Content-Length digits only and not conflicting, no
 * Transfer-Encoding with Content-Length, Transfer-Encoding only "chunked"),
 * and the Host rule of RFC 9112 3.2. 0 or -EINVAL with err set. */
int http_head_check(const struct http_head *h, struct sc_error *err);

/* ---- chunked request bodies ---------------------------------------------- */

/* The framing bytes the server library skipped before a piece of a chunked
 * body's data (RFC 9112 7.1): nothing (more data of the same chunk), or a
 * chunk's size line, "1*HEXDIG ext [CR] LF", after the (CR) LF that ends
 * the previous chunk's data (optional with crlf_optional: at the start of
 * the library's buffer, where it may have been consumed before). 0; -EINVAL
 * with err set when the line's extensions are not *( BWS ";" BWS token
 * [ BWS "=" BWS ( token / quoted-string ) ] ) (a control character, an
 * empty name, a stray byte); -EPROTO when the
 * bytes are not framing at all (the caller's view is off: nothing to say
 * about the request). */
int http_chunk_gap_check(const char *gap, size_t n, bool crlf_optional, struct sc_error *err);
/* The extensions of one chunk line, after its size digits up to (not
 * including) its CR LF. */
bool http_chunk_ext_valid(const char *s, size_t n);

/* Splits a raw head (request line, field lines, up to and including the
 * empty line; CRLF or bare LF line ends) and checks it as above; obsolete
 * line folding and lines without a colon are refused here. For fuzzing
 * and tests: the proxy gets the pieces from its server library. 0 or
 * -EINVAL (err set); -E2BIG beyond 256 fields. */
int http_head_parse_check(const char *raw, size_t len, struct sc_error *err);

#endif
