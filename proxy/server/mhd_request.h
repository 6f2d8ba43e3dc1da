/* A worker's request on libmicrohttpd's side: the callbacks below are its
 * only entry points. The request is checked and routed here, then runs its
 * policy's plan (proxy/exchange/), suspended while a row waits; its answer
 * is made into MHD's response here. */
#ifndef SLUICE_PROXY_SERVER_MHD_REQUEST_H
#define SLUICE_PROXY_SERVER_MHD_REQUEST_H

#include <microhttpd.h>
#include <stddef.h>

struct loop;

/* MHD_OPTION_URI_LOG_CALLBACK: allocates the exchange with the raw request
 * target (MHD's `url` is decoded and lacks the query). cls is the worker. */
void *exchange_uri_log(void *cls, const char *uri, struct MHD_Connection *c);

/* MHD_AccessHandlerCallback; cls is the worker. */
enum MHD_Result exchange_access(void *cls, struct MHD_Connection *c,
                                const char *url, const char *method,
                                const char *version, const char *upload_data,
                                size_t *upload_data_size, void **con_cls);

/* MHD_OPTION_NOTIFY_COMPLETED: frees the exchange, logs it. */
void exchange_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                        enum MHD_RequestTerminationCode toe);

/* The loop's spare exchanges and store calls (util/freelist.h): set up
 * before its first request, freed after its last. */
void exchange_loop_init(struct loop *w);
void exchange_loop_clear(struct loop *w);

/* The drain deadline passed: every request still waiting is answered (a
 * request sent and unanswered: requeue / connection_lost; one that sent
 * nothing: requeue / rate_limited) and resumed. */
void exchange_abort_all(struct loop *w);

#endif
