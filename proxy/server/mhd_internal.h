/* The worker's side of an exchange: libmicrohttpd's calls (mhd_request.c), the
 * checks of what it hands over (mhd_checks.c), the answers made into its
 * responses (mhd_answer.c) and a passed-through body (mhd_stream.c). This
 * side owns the request (struct ex_owner) and runs its plan through the
 * driver; the rows never see libmicrohttpd. */
#ifndef SLUICE_PROXY_SERVER_MHD_INTERNAL_H
#define SLUICE_PROXY_SERVER_MHD_INTERNAL_H

#include <microhttpd.h>

#include "proxy/exchange/driver.h"
#include "proxy/exchange/stage.h"

/* mhd_checks.c */
/* Sets ex->target: origin-form, the path normalised, so that the route,
 * the fingerprint and the forwarded target all see the same path. */
void mhd_take_target(struct exchange *ex, const char *uri);
/* The head as received, the limits, the route (route: mhd_route), the
 * fields read once: false when refused (the answer is on ex). */
bool mhd_check_request(struct exchange *ex, const char *url, const char *version,
                       bool (*route)(struct exchange *ex));
/* Sluice-Attempt: the worker's own count when there is no key. */
bool mhd_read_attempt(struct exchange *ex);
/* A chunked body's chunk line before the piece at data, given in the
 * loop's MHD run `run`: -EINVAL (with err) when malformed, -EPROTO when it
 * cannot be seen, 0. */
int mhd_check_chunk_line(struct exchange *ex, const char *data, uint64_t run,
                         struct sc_error *err);

/* mhd_answer.c */
enum MHD_Result mhd_answer(struct exchange *ex);
/* The decided answer queued, unless the worker left meanwhile. */
enum MHD_Result mhd_answer_ready(struct exchange *ex);
/* A malformed request: answered, then the connection is closed. */
enum MHD_Result mhd_answer_malformed(struct exchange *ex);

/* mhd_stream.c */
/* The worker's response for ANSWER_UPSTREAM: from memory when the body is
 * all here, else read from the upstream as it arrives. NULL on failure. */
struct MHD_Response *mhd_stream_response(struct exchange *ex);
/* An answer of this status to this request has no body: HEAD, 1xx, 204, 304. */
bool mhd_answer_bodiless(const struct exchange *ex, int status);
/* The response for such an answer: the given Content-Length (the one the
 * upstream sent), or no framing header at all and the connection closed
 * after it (a 204 has none and keeps it); never chunked. reader is never
 * called. */
struct MHD_Response *mhd_bodiless_response(int status, bool has_length, uint64_t length,
                                           MHD_ContentReaderCallback reader, void *cls);

#endif
