/* The decided answer, made into libmicrohttpd's response and queued: a
 * problem+json, an instruction, a replay from the store, or the upstream's
 * own answer (stream.c). Every answer carries Sluice-Outcome and the
 * request's X-Request-Id. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "policies/problem.h"
#include "proxy/server/mhd_internal.h"

static enum MHD_Result queue(struct exchange *ex, struct MHD_Response *resp)
{
    enum MHD_Result rc;

    if (!resp)
        return MHD_NO;
    MHD_add_response_header(resp, "Sluice-Outcome", outcome_name(ex->outcome));
    /* A replay is the stored response: it carries the id of the request
     * that reached the partner (stored with it). */
    if (ex->kind != ANSWER_REPLAY)
        MHD_add_response_header(resp, EX_REQUEST_ID_HEADER, ex_request_id(ex));
    rc = MHD_queue_response(ex->mc, (unsigned)ex->status, resp);
    MHD_destroy_response(resp);
    ex->phase = PH_ANSWERED;
    return rc;
}

/* A response owning a malloc'd JSON body (freed with it); NULL on failure,
 * the body then freed here. */
static struct MHD_Response *json_response(char *body, size_t len, const char *type)
{
    struct MHD_Response *resp;

    if (!body)
        return NULL;
    resp = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(body);
        return NULL;
    }
    MHD_add_response_header(resp, "Content-Type", type);
    return resp;
}

static enum MHD_Result answer_problem(struct exchange *ex)
{
    size_t len = 0;
    char *body = problem_json(ex->status, ex->reason, ex->detail, &len);

    ex->bytes_out = body ? len : 0;
    return queue(ex, json_response(body, len, "application/problem+json"));
}

static enum MHD_Result answer_upstream(struct exchange *ex)
{
    return queue(ex, mhd_stream_response(ex));
}

static enum MHD_Result answer_instruction(struct exchange *ex)
{
    size_t len = 0;
    char *body = instruction_json(&ex->instr, &len), num[32];
    struct MHD_Response *resp = json_response(body, len, "application/json");

    if (!resp)
        return MHD_NO;
    ex->bytes_out = len;
    if (ex->outcome == OUT_REQUEUE) {
        snprintf(num, sizeof num, "%llu", (unsigned long long)
                 instruction_delay_seconds(ex->instr.delay_ms));
        MHD_add_response_header(resp, "Retry-After", num);
    }
    if (ex->rate_headers && ex->bucket) {
        char pol[160], st[160];
        ex_rate_headers(ex, pol, sizeof pol, st, sizeof st);
        MHD_add_response_header(resp, "RateLimit-Policy", pol);
        MHD_add_response_header(resp, "RateLimit", st);
    }
    return queue(ex, resp);
}

/* For responses MHD sends no body of. */
static ssize_t no_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    return MHD_CONTENT_READER_END_OF_STREAM;
}

/* A stored result, byte for byte, with no permit and no upstream call. A
 * replayed failure (4xx) stays permanent_error: "replayed" always means
 * "this already succeeded: ack it". */
static enum MHD_Result answer_replay(struct exchange *ex)
{
    const struct store_record *rec = &ex->replay;
    struct MHD_Response *resp;

    /* The record keeps no Content-Length: a bodiless answer is not given
     * one of 0 (exchange_stream.c). */
    if (mhd_answer_bodiless(ex, rec->status))
        resp = mhd_bodiless_response(rec->status, false, 0, no_reader, NULL);
    else
        resp = MHD_create_response_from_buffer(rec->body_len, rec->body,
                                               MHD_RESPMEM_MUST_COPY);
    if (!resp)
        return MHD_NO;
    for (size_t i = 0; i < rec->n_headers; i++)
        MHD_add_response_header(resp, rec->headers[i].name, rec->headers[i].value);
    MHD_add_response_header(resp, "Idempotent-Replayed", "true");
    if (rec->body_omitted)
        MHD_add_response_header(resp, "Sluice-Body-Omitted", "true");
    if (rec->verified) /* completed from a lookup's answer (contract §11) */
        MHD_add_response_header(resp, "Sluice-Verified", "true");
    ex->bytes_out = rec->body_len;
    ex->status = rec->status;
    ex->outcome = rec->status < 400 ? OUT_REPLAYED : OUT_PERMANENT_ERROR;
    ex->reason = R_NONE;
    return queue(ex, resp);
}

enum MHD_Result mhd_answer(struct exchange *ex)
{
    switch (ex->kind) {
    case ANSWER_REPLAY:
        return answer_replay(ex);
    case ANSWER_UPSTREAM:
        return answer_upstream(ex);
    case ANSWER_INSTRUCTION:
        return answer_instruction(ex);
    default:
        return answer_problem(ex);
    }
}


enum MHD_Result mhd_answer_ready(struct exchange *ex)
{
    if (ex->outcome == OUT_ABANDONED) {
        ex->phase = PH_ANSWERED; /* logged and counted, nothing sent */
        return MHD_NO;
    }
    return mhd_answer(ex);
}

/* What follows a malformed request on its connection cannot be trusted to
 * start a request. */
enum MHD_Result mhd_answer_malformed(struct exchange *ex)
{
    size_t len = 0;
    char *body = problem_json(ex->status, ex->reason, ex->detail, &len);
    struct MHD_Response *resp = json_response(body, len, "application/problem+json");

    if (resp)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    return queue(ex, resp);
}

