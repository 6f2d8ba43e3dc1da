/* policies/http_head.c: the strict checks of a request head (RFC 9112
 * sections 2-7): what a proxy must refuse rather than forward. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "policies/http_head.h"

static int check(const char *raw)
{
    struct sc_error err = {0};
    int rc = http_head_parse_check(raw, strlen(raw), &err);

    if (rc != 0)
        cr_expect(err.text[0], "a refusal says why");
    return rc;
}

/* raw with an embedded NUL at the position of '@'. */
static int check_nul(const char *raw)
{
    char buf[512];
    struct sc_error err = {0};
    size_t n = strlen(raw);

    cr_assert_lt(n, sizeof buf);
    memcpy(buf, raw, n);
    for (size_t i = 0; i < n; i++)
        if (buf[i] == '@')
            buf[i] = '\0';
    return http_head_parse_check(buf, n, &err);
}

#define OK_HEAD(extra) "GET /x HTTP/1.1\r\nHost: a\r\n" extra "\r\n"

Test(http_head, a_plain_request_passes)
{
    cr_expect_eq(check(OK_HEAD("")), 0);
    cr_expect_eq(check("POST /x?q=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n"), 0);
    cr_expect_eq(check("GET http://h.example/x HTTP/1.1\r\nHost: a\r\n\r\n"), 0);
    cr_expect_eq(check("GET /x HTTP/1.0\r\n\r\n"), 0, "HTTP/1.0 needs no Host");
    cr_expect_eq(check("GET /x HTTP/1.1\nHost: a\n\n"), 0, "bare LF line ends");
    cr_expect_eq(check(OK_HEAD("X-A: v\tw  \r\n")), 0, "tabs and OWS");
    cr_expect_eq(check(OK_HEAD("X-Utf8: caf\xc3\xa9\r\n")), 0, "obs-text");
    cr_expect_eq(check(OK_HEAD("Transfer-Encoding: Chunked\r\n")), 0);
}

Test(http_head, request_line_shape)
{
    cr_expect_eq(check("GARBAGE\r\n\r\n"), -EINVAL);
    cr_expect_eq(check("GET\r\n\r\n"), -EINVAL);
    cr_expect_eq(check("GET /x\r\n\r\n"), -EINVAL);
    cr_expect_eq(check("GET  /x HTTP/1.1\r\nHost: a\r\n\r\n"), -EINVAL);
    cr_expect_eq(check("GET /x  HTTP/1.1\r\nHost: a\r\n\r\n"), -EINVAL);
    cr_expect_eq(check("GET /a b HTTP/1.1\r\nHost: a\r\n\r\n"), -EINVAL);
    cr_expect_eq(check("GET /x HTTP/2.0\r\nHost: a\r\n\r\n"), -EINVAL);
    cr_expect_eq(check("GET /x http/1.1\r\nHost: a\r\n\r\n"), -EINVAL);
    cr_expect_eq(check("GET /x HTTP/1.1"), -EINVAL, "no line end");
    cr_expect_eq(check("GET /x HTTP/1.1\r\nHost: a\r\n"), -EINVAL, "no empty line");
}

Test(http_head, method_must_be_a_token)
{
    cr_expect(http_method_is_token("PROPFIND", 8));
    cr_expect(http_method_is_token("X-M!#$%&'*+.^_`|~", 17));
    cr_expect_not(http_method_is_token("G(T", 3));
    cr_expect_not(http_method_is_token("GE T", 4));
    cr_expect_not(http_method_is_token("", 0));
    cr_expect_not(http_method_is_token("G\x80T", 3));
    cr_expect_eq(check("G(T /x HTTP/1.1\r\nHost: a\r\n\r\n"), -EINVAL);
    cr_expect_eq(check_nul("G@T /x HTTP/1.1\r\nHost: a\r\n\r\n"), -EINVAL);
}

Test(http_head, target_forms)
{
    cr_expect_eq(http_target_form("/x", 2), HTTP_TARGET_ORIGIN);
    cr_expect_eq(http_target_form("http://h/x", 10), HTTP_TARGET_ABSOLUTE);
    cr_expect_eq(http_target_form("HTTPS://h", 9), HTTP_TARGET_ABSOLUTE);
    cr_expect_eq(http_target_form("v1/x", 4), HTTP_TARGET_INVALID);
    cr_expect_eq(http_target_form("*", 1), HTTP_TARGET_INVALID);
    cr_expect_eq(http_target_form("h.example:443", 13), HTTP_TARGET_INVALID);
    cr_expect_eq(http_target_form("http:///x", 9), HTTP_TARGET_INVALID);
    cr_expect_eq(http_target_form("ftp://h/x", 9), HTTP_TARGET_INVALID);
    cr_expect_eq(http_target_form("/a\x7f", 3), HTTP_TARGET_INVALID);
    cr_expect_eq(http_target_form("/caf\xc3\xa9", 6), HTTP_TARGET_INVALID);
    cr_expect_eq(http_target_form("", 0), HTTP_TARGET_INVALID);
    cr_expect_eq(check("GET v1/x HTTP/1.1\r\nHost: a\r\n\r\n"), -EINVAL);
    cr_expect_eq(check_nul("GET /a@b HTTP/1.1\r\nHost: a\r\n\r\n"), -EINVAL);
}

Test(http_head, field_names_are_tokens)
{
    cr_expect(http_header_name_valid("X-Request-Id", 12));
    cr_expect_not(http_header_name_valid("Bad Name", 8));
    cr_expect_not(http_header_name_valid("Content-Length ", 15));
    cr_expect_not(http_header_name_valid("", 0));
    cr_expect_eq(check(OK_HEAD("Content-Length : 0\r\n")), -EINVAL);
    cr_expect_eq(check(OK_HEAD("Bad Name: v\r\n")), -EINVAL);
    cr_expect_eq(check(OK_HEAD(": v\r\n")), -EINVAL);
    cr_expect_eq(check(OK_HEAD("No colon\r\n")), -EINVAL);
}

Test(http_head, folding_is_refused)
{
    struct sc_error err = {0};
    const char *raw = OK_HEAD("X-Fold: a\r\n Content-Length: 5\r\n");
    /* what a gluing parser leaves of a folded line */
    struct http_field f = {"X-FoldContent-Length: 5", 23, "a", 1};
    struct http_field host = {"Host", 4, "a", 1};
    struct http_field fields[] = {host, f};
    struct http_head h = {"GET", 3, "/x", 2, "HTTP/1.1", 8, fields, 2};

    cr_expect_eq(http_head_parse_check(raw, strlen(raw), &err), -EINVAL);
    cr_expect(strstr(err.text, "folding"), "%s", err.text);
    cr_expect_eq(check(OK_HEAD("X-A: a\r\n\tb\r\n")), -EINVAL);
    memset(&err, 0, sizeof err);
    cr_expect_eq(http_head_check(&h, &err), -EINVAL);
    cr_expect(strstr(err.text, "folding"), "%s", err.text);
}

Test(http_head, values_without_nul_cr_lf_or_controls)
{
    cr_expect(http_header_value_valid("a b\tc", 5));
    cr_expect_not(http_header_value_valid("a\0b", 3));
    cr_expect_not(http_header_value_valid("a\rb", 3));
    cr_expect_not(http_header_value_valid("a\nb", 3));
    cr_expect_not(http_header_value_valid("a\x01", 2));
    cr_expect_not(http_header_value_valid("a\x7f", 2));
    cr_expect_eq(check(OK_HEAD("X-A: a\rb\r\n")), -EINVAL);
    cr_expect_eq(check_nul(OK_HEAD("X-A: ab@cd\r\n")), -EINVAL);
}

Test(http_head, framing)
{
    cr_expect_eq(check(OK_HEAD("Content-Length: +5\r\n")), -EINVAL);
    cr_expect_eq(check(OK_HEAD("Content-Length: -1\r\n")), -EINVAL);
    cr_expect_eq(check(OK_HEAD("Content-Length: 5,5\r\n")), -EINVAL);
    cr_expect_eq(check(OK_HEAD("Content-Length: 0x5\r\n")), -EINVAL);
    cr_expect_eq(check(OK_HEAD("Content-Length: \r\n")), -EINVAL);
    cr_expect_eq(check(OK_HEAD("Content-Length: 1234567890123456789\r\n")), -EINVAL);
    cr_expect_eq(check(OK_HEAD("Content-Length: 5\r\nContent-Length: 6\r\n")), -EINVAL);
    cr_expect_eq(check(OK_HEAD("Content-Length: 5\r\nContent-Length: 5\r\n")), -EINVAL,
                 "one Content-Length field, even repeated with the same value");
    cr_expect_eq(check(OK_HEAD("Content-Length: 5\r\nTransfer-Encoding: chunked\r\n")),
                 -EINVAL);
    cr_expect_eq(check(OK_HEAD("Transfer-Encoding: gzip, chunked\r\n")), -EINVAL);
    cr_expect_eq(check(OK_HEAD("Transfer-Encoding: chunked\r\n"
                               "Transfer-Encoding: chunked\r\n")), -EINVAL);
}

/* RFC 9112 6.1: HTTP/1.0 has no chunked coding; such a message's framing is
 * faulty. */
Test(http_head, transfer_encoding_in_http_1_0)
{
    cr_expect_eq(check("POST /x HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"), -EINVAL);
    cr_expect_eq(check("POST /x HTTP/1.0\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"),
                 -EINVAL);
    cr_expect_eq(check("POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"), 0);
}

Test(http_head, host_rules)
{
    cr_expect_eq(check("GET /x HTTP/1.1\r\n\r\n"), -EINVAL);
    cr_expect_eq(check(OK_HEAD("Host: b\r\n")), -EINVAL);
    cr_expect_eq(check("GET /x HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n"), -EINVAL);
}

Test(http_head, many_fields)
{
    char raw[8192];
    size_t n = (size_t)sprintf(raw, "GET /x HTTP/1.1\r\nHost: a\r\n");

    for (int i = 0; i < 300; i++)
        n += (size_t)sprintf(raw + n, "X-%d: v\r\n", i);
    strcpy(raw + n, "\r\n");
    cr_expect_eq(check(raw), -E2BIG);
}

/* ---- chunked bodies ------------------------------------------------------ */

static int gap(const char *g, bool crlf_optional)
{
    struct sc_error err = {0};
    int rc = http_chunk_gap_check(g, strlen(g), crlf_optional, &err);

    if (rc == -EINVAL)
        cr_expect(err.text[0], "a refusal says why");
    return rc;
}

Test(http_chunks, extensions)
{
    cr_expect(http_chunk_ext_valid("", 0));
    cr_expect(http_chunk_ext_valid(";a", 2));
    cr_expect(http_chunk_ext_valid(";a=b;c", 6));
    cr_expect(http_chunk_ext_valid(" ; a = b ", 9), "BWS around ; and =");
    cr_expect(http_chunk_ext_valid(";a=\"x y\\\"z\"", 11), "a quoted value");
    cr_expect(!http_chunk_ext_valid(";\x01\x02", 3), "control characters");
    cr_expect(!http_chunk_ext_valid(";;;=", 4), "empty names");
    cr_expect(!http_chunk_ext_valid(";", 1), "an empty name");
    cr_expect(!http_chunk_ext_valid(";a=", 3), "an empty value");
    cr_expect(!http_chunk_ext_valid(";a b", 4), "two tokens");
    cr_expect(!http_chunk_ext_valid(";a\rb", 4), "a bare CR");
    cr_expect(!http_chunk_ext_valid(";a=\"open", 8), "an unterminated quote");
    cr_expect(!http_chunk_ext_valid("x", 1), "not after a semicolon");
}

/* The framing between pieces of data, as the server library leaves it. */
Test(http_chunks, the_framing_before_a_piece)
{
    cr_expect_eq(gap("", false), 0, "more data of the same chunk");
    cr_expect_eq(gap("5;a=b\r\n", true), 0, "a first line");
    cr_expect_eq(gap("\r\n6\r\n", false), 0, "the CRLF after a chunk, then a line");
    cr_expect_eq(gap("\n3\n", false), 0, "bare LFs");
    cr_expect_eq(gap("1F;x=\"a b\"\r\n", true), 0);
}

Test(http_chunks, a_bad_extension_is_refused)
{
    cr_expect_eq(gap("5;\x01\x02\r\n", true), -EINVAL);
    cr_expect_eq(gap("5;;;=\r\n", true), -EINVAL);
    cr_expect_eq(gap("\r\n3;a b\r\n", false), -EINVAL, "on a later chunk");
    cr_expect_eq(gap("\r\n3;a\rb\r\n", false), -EINVAL, "a bare CR inside");
}

/* Bytes that are not framing tell that the caller's view is off: no refusal. */
Test(http_chunks, what_is_not_framing_says_nothing)
{
    cr_expect_eq(gap("hello", true), -EPROTO);
    cr_expect_eq(gap("5;a\r\n", false), -EPROTO, "no CRLF where one must be");
    cr_expect_eq(gap("\r\n;a\r\n", false), -EPROTO, "no size");
    cr_expect_eq(gap("\r\n5;a", false), -EPROTO, "not ending the line");
}
