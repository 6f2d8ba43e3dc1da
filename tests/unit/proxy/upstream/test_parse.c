/* proxy/upstream/parse.c: responses that end at their head (RFC 9112 6.3).
 * An answer to HEAD, a 1xx, a 204 and a 304 have no body whatever their
 * Content-Length or Transfer-Encoding say; read as if one followed, the
 * exchange would wait for bytes that never come (the route's timeout). */
#include <criterion/criterion.h>
#include <string.h>

#include <event2/buffer.h>

#include "proxy/upstream/parse.h"

struct parsed {
    struct up_request req;
    struct up_parse ps;
    size_t consumed;
};

static void parse(struct parsed *p, const char *raw, bool head)
{
    memset(p, 0, sizeof *p);
    p->req.resp.body = evbuffer_new();
    cr_assert(p->req.resp.body);
    p->req.no_body = head;
    up_parse_start(&p->ps, &p->req, false);
    p->consumed = up_parse_feed(&p->ps, raw, strlen(raw));
}

static void done(struct parsed *p)
{
    up_response_clear(&p->req.resp);
}

Test(upstream_parse, a_304_with_a_length_ends_at_its_head)
{
    static const char raw[] = "HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\nETag: \"a\"\r\n\r\n";
    struct parsed p;

    parse(&p, raw, false);
    cr_expect(p.ps.complete, "complete without a body");
    cr_expect_eq(p.req.resp.status, 304);
    cr_expect_eq(evbuffer_get_length(p.req.resp.body), 0);
    cr_expect_eq(p.consumed, sizeof raw - 1);
    cr_expect(up_parse_keep_alive(&p.ps), "the connection can carry the next request");
    done(&p);
}

Test(upstream_parse, a_304_or_204_said_to_be_chunked_ends_at_its_head)
{
    static const char *const raws[] = {
        "HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n",
        "HTTP/1.1 204 No Content\r\nTransfer-Encoding: chunked\r\n\r\n",
        "HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n",
    };

    for (size_t i = 0; i < sizeof raws / sizeof *raws; i++) {
        struct parsed p;

        parse(&p, raws[i], false);
        cr_expect(p.ps.complete, "case %zu", i);
        cr_expect_eq(p.consumed, strlen(raws[i]), "case %zu", i);
        done(&p);
    }
}

/* What follows a bodiless response is the next response, not its body. */
Test(upstream_parse, the_bytes_after_a_304_are_not_its_body)
{
    static const char raw[] = "HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\nHTTP/";
    struct parsed p;

    parse(&p, raw, false);
    cr_expect(p.ps.complete);
    cr_expect_eq(p.consumed, sizeof raw - 1 - 5, "stopped at the next response");
    cr_expect_eq(evbuffer_get_length(p.req.resp.body), 0);
    done(&p);
}

Test(upstream_parse, an_interim_answer_with_a_length_has_no_body)
{
    static const char raw[] = "HTTP/1.1 103 Early Hints\r\nContent-Length: 5\r\n\r\n"
                              "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
    struct parsed p;

    parse(&p, raw, false);
    cr_expect(p.ps.complete);
    cr_expect_eq(p.req.resp.status, 200);
    cr_expect_eq(evbuffer_get_length(p.req.resp.body), 2);
    cr_expect_eq(p.req.resp.n_headers, 1, "the 103's fields are forgotten");
    done(&p);
}

Test(upstream_parse, a_head_answer_ends_at_its_head)
{
    static const char *const raws[] = {
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n",
    };

    for (size_t i = 0; i < sizeof raws / sizeof *raws; i++) {
        struct parsed p;

        parse(&p, raws[i], true);
        cr_expect(p.ps.complete, "case %zu", i);
        cr_expect_eq(evbuffer_get_length(p.req.resp.body), 0, "case %zu", i);
        done(&p);
    }
}

Test(upstream_parse, a_200_with_a_length_still_waits_for_its_body)
{
    struct parsed p;

    parse(&p, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab", false);
    cr_expect(!p.ps.complete, "three body bytes to come");
    cr_expect_eq(evbuffer_get_length(p.req.resp.body), 2);
    done(&p);
}
