/* Header filtering rules of docs/contract.md §3. */
#include <criterion/criterion.h>

#include "policies/headers.h"

Test(headers, fixed_hop_by_hop_set)
{
    static const char *const hop[] = {
        "Connection", "connection", "Keep-Alive", "TE", "Trailer",
        "Transfer-Encoding", "Upgrade", "Proxy-Authorization",
        "Proxy-Authenticate", "proxy-connection",
    };

    for (size_t i = 0; i < sizeof hop / sizeof *hop; i++)
        cr_expect(hdr_is_hop_by_hop(hop[i], NULL), "%s", hop[i]);
    cr_expect_not(hdr_is_hop_by_hop("Trailers", NULL));
    cr_expect_not(hdr_is_hop_by_hop("Content-Type", NULL));
    cr_expect_not(hdr_is_hop_by_hop("Idempotency-Key", NULL));
}

Test(headers, connection_names_more)
{
    struct hdr_conn_tokens t = {0};

    hdr_conn_tokens_add(&t, "close, X-Foo ,  x-bar");
    hdr_conn_tokens_add(&t, "Keep-Alive");
    cr_expect_eq(t.n, 4);
    cr_expect(hdr_is_hop_by_hop("X-Foo", &t));
    cr_expect(hdr_is_hop_by_hop("X-BAR", &t));
    cr_expect_not(hdr_is_hop_by_hop("X-Baz", &t));
}

Test(headers, connection_tokens_are_bounded)
{
    struct hdr_conn_tokens t = {0};
    char big[4096];

    for (size_t i = 0; i < sizeof big - 1; i++)
        big[i] = (i % 10 == 9) ? ',' : 'a';
    big[sizeof big - 1] = '\0';
    hdr_conn_tokens_add(&t, big);
    cr_expect_leq(t.n, HDR_MAX_CONN_TOKENS);
    hdr_conn_tokens_add(&t, "");
    hdr_conn_tokens_add(&t, ",,, ,");
    cr_expect_leq(t.n, HDR_MAX_CONN_TOKENS);
}

Test(headers, request_rules)
{
    cr_expect(hdr_skip_request("Host", NULL));
    cr_expect(hdr_skip_request("Content-Length", NULL));
    cr_expect(hdr_skip_request("Sluice-Attempt", NULL));
    cr_expect(hdr_skip_request("sluice-enqueued-at", NULL));
    cr_expect_not(hdr_skip_request("Idempotency-Key", NULL));
    cr_expect_not(hdr_skip_request("Authorization", NULL));
    cr_expect_not(hdr_skip_request("X-Sluice-Thing", NULL));
}

Test(headers, response_rules)
{
    cr_expect(hdr_skip_response("Content-Length", NULL));
    cr_expect(hdr_skip_response("Transfer-Encoding", NULL));
    cr_expect_not(hdr_skip_response("Retry-After", NULL));
    cr_expect_not(hdr_skip_response("Set-Cookie", NULL));
}

Test(headers, token_and_value_validity)
{
    cr_expect(hdr_valid_name("Idempotency-Key"));
    cr_expect(hdr_valid_name("x!#$%&'*+-.^_`|~9"));
    cr_expect_not(hdr_valid_name(""));
    cr_expect_not(hdr_valid_name("Bad Name"));
    cr_expect_not(hdr_valid_name("Colon:"));
    cr_expect(hdr_valid_value("any value, with commas"));
    cr_expect_not(hdr_valid_value("split\r\nInjected: 1"));
}
