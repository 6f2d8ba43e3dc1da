/* The worker-facing server: `threads` event loops, each a libevent
 * event_base driving its own libmicrohttpd daemon in external-epoll mode on a
 * listening socket they share. Requests suspend their MHD connection while
 * they wait (for the upstream, later for a permit) and resume it when the
 * answer is ready, so no thread ever blocks on a request. */
#ifndef SLUICE_PROXY_SERVER_SERVER_H
#define SLUICE_PROXY_SERVER_SERVER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>

#include "config/config.h"
#include "obs/statsd.h"
#include "policies/problem.h"
#include "proxy/exchange/env.h"
#include "util/error.h"
#include "pacing/key_waiters.h"
#include "util/freelist.h"

struct app;
struct exchange;
struct event;
struct event_base;
struct evdns_base;
struct MHD_Daemon;
struct up_pool;
struct evconnlistener;

TAILQ_HEAD(exchange_list, exchange);

/* One event-loop thread. Everything in it is touched only by its thread,
 * except the command events, which other threads may activate. */
struct conn;
struct loop {
    unsigned idx;
    struct app *app;
    struct event_base *base;
    struct evdns_base *dns;
    struct MHD_Daemon *mhd;
    struct evconnlistener *listener; /* on the shared listening socket */
    struct statsd statsd;       /* fd -1 when metrics.statsd is off */
    struct store_loop *store;   /* the store's calls from this loop */
    struct event *mhd_read_ev;  /* MHD's epoll fd became readable */
    struct event *mhd_timer_ev; /* MHD_get_timeout() expired */
    struct event *quiesce_ev;   /* command: stop accepting */
    struct event *abort_ev;     /* command: answer what is still in flight */
    struct event *runtime_ev;   /* command: take the runtime a reload made */
    struct event *accept_resume_ev; /* out of descriptors: accept again after a pause */
    struct runtime *rt;         /* the loop's current config (a ref); its own */
    _Atomic(struct runtime *) next_rt; /* handed over by a reload (a ref) */
    struct exchange_list waiting; /* exchanges suspended on the upstream */
    TAILQ_HEAD(, verification) verifications; /* running here (verification.c) */
    pthread_t tid;
    uint64_t mhd_runs;          /* MHD_run calls so far */
    uint64_t mhd_error_run;     /* the run in which MHD last answered an error itself */
    struct freelist spare_ex;   /* freed exchanges, for the next requests */
    struct freelist spare_call; /* and their store calls */
    struct ex_env env;          /* what its requests' rows may use */
    struct key_waiters dup_waiters; /* its duplicates waiting for a fleet's
                                   lease; woken from the store's thread */
    TAILQ_HEAD(, conn) conns;   /* its worker connections (server.c's struct conn) */
    struct event *beat_ev;      /* every LOOP_BEAT_MS: the loop still turns */
    _Atomic uint64_t beat_ns;   /* monotonic time of its last beat */
    atomic_bool beating;        /* the thread runs the loop */
    bool started;
};

/* A loop beats every LOOP_BEAT_MS; one that has not beaten for LOOP_STALL_MS
 * is wedged (a blocking call, a log pipe nobody reads, a bug): /healthz fails
 * and the systemd watchdog is no longer pinged, so the process is restarted.
 * No request work blocks a loop, so 10 s is far beyond a busy loop's pass. */
#define LOOP_BEAT_MS 1000
#define LOOP_STALL_MS 10000

/* How long (ms) since w last beat; 0 while it beats on time or does not
 * run. Thread-safe. */
uint64_t loop_stalled_ms(const struct loop *w, uint64_t now_ns);

/* Creates worker w (loop, MHD daemon on listen_fd, pools); does not start
 * its thread. 0 or negative + err. */
int loop_init(struct loop *w, struct app *app, unsigned idx,
                int listen_fd, struct sc_error *err);
int loop_start(struct loop *w, struct sc_error *err);
/* Asks the thread to stop its loop and waits for it. */
void loop_join(struct loop *w);
/* Stops accepting and the MHD daemon (completing what it still holds). */
void loop_stop_daemon(struct loop *w);
/* All of the above, then frees the loop. */
void loop_stop(struct loop *w);

/* Makes MHD process pending work on the next loop pass: needed after
 * MHD_resume_connection, which does not wake an external-epoll loop. */
void loop_kick(struct loop *w);

/* The store announced that a lease of (scope, key) ended: wakes that
 * key's waiting duplicates of every loop, each on its own loop. From the
 * store's thread (store_done_fn, arg: the app). */
void loops_wake_key(void *app, const char *scope, const char *key);

/* The request head clock of a worker connection (limits.header_timeout):
 * srv_conn_head_begun starts it when a request line arrives on a reused
 * connection (a new connection's runs from its accept); srv_conn_head_done stops
 * it when the head is complete, and is false when it already ran out (the
 * connection got a 408 and is closing). Loop thread only. */
struct MHD_Connection;
void srv_conn_head_begun(struct MHD_Connection *c);
bool srv_conn_head_done(struct MHD_Connection *c);
/* A request of the connection has ended (MHD's completion notice): with
 * srv_conn_head_begun's count, tells the close of a connection between
 * requests, where MHD refuses a request line without a word. */
void srv_conn_request_ended(struct MHD_Connection *c);
/* The request's body is read (its last handler call), or will not be (it
 * was answered before): MHD parses no more chunks of it. */
void srv_conn_body_done(struct MHD_Connection *c);

/* The loop's current runtime, with a reference taken for the caller; on
 * the loop's thread only. No lock: a reload hands each loop its runtime
 * (loop_set_runtime), and the loop takes it at its next request or
 * command, whichever comes first. */
struct runtime *loop_runtime(struct loop *w);
/* Thread-safe: gives w a reference to rt as its next runtime. */
void loop_set_runtime(struct loop *w, struct runtime *rt);
/* After the loop stopped: drops the loop's references. */
void loop_drop_runtime(struct loop *w);

/* Thread-safe commands for the drain sequence. */
void loop_quiesce(struct loop *w);
void loop_abort_inflight(struct loop *w);

/* At start-up: raises the soft RLIMIT_NOFILE toward the hard limit and
 * warns when it stays below what the config's connection limits and
 * upstream pools can hold open. Returns the limit in force (LONG_MAX: none
 * or unknown), which the accept path keeps headroom below. */
struct sc_config;
long server_fd_limit(const struct sc_config *cfg, unsigned n_loops);

/* Opens, binds and listens on addr (non-blocking). fd or negative + err. */
int server_listen(const struct sc_addr *addr, int backlog,
                  struct sc_error *err);

#endif
