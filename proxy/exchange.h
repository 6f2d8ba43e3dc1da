/* One worker request and its way through sluice, as a small state machine:
 * headers checked → routed → body read → upstream → answered. The libmicrohttpd
 * callbacks below are the only entry points; each stage either answers at
 * once or suspends the connection until an event resumes it. */
#ifndef SLUICE_PROXY_EXCHANGE_H
#define SLUICE_PROXY_EXCHANGE_H

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

/* Answers every exchange still waiting on the upstream with requeue /
 * connection_lost (the drain deadline passed) and resumes it. */
void exchange_abort_all(struct loop *w);

#endif
