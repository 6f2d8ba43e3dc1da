/* The driver of a request's plan, as its owner (mhd.c, or whoever makes a
 * request of its own) calls it. The stages' side is stage.h. */
#ifndef SLUICE_PROXY_EXCHANGE_DRIVER_H
#define SLUICE_PROXY_EXCHANGE_DRIVER_H

#include "proxy/exchange/stage.h"

/* The request is read: its plan runs from the first row, and the owner is
 * asked to suspend it at the first wait. Returns with ex->phase PH_READY
 * and not suspended when the answer was decided without waiting: the
 * caller queues it at once. */
void ex_start(struct exchange *ex);

/* The body reader has nothing to give: the request sleeps until the
 * upstream brings more (ex_wake). */
void ex_reader_wait(struct exchange *ex);

/* The drain deadline met the request: a row still waiting decides its
 * answer (a streamed body is cut short), and the request goes on to be
 * answered. */
void ex_drain(struct exchange *ex);

/* Everything the request still holds is given back, every row's share and
 * the driver's own (its timer, its watch, its store call): at its end. */
void ex_release_all(struct exchange *ex);

#endif
