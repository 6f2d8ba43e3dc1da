/* The driver: one function advances a request through its stages (as
 * nginx's phase runner does), and is the only writer of its state. A stage
 * decides and returns a verdict; the driver does the moving: it arms the one
 * timer, watches the worker's socket while the request waits, suspends and
 * resumes the connection, and gives back what the request holds, in reverse
 * order of taking, on every way out (answer, worker gone, drain deadline,
 * allocation failure), so that no exit can forget a release.
 *
 *   body in -> key -> lookup -> permit -> slot -> send check -> lease
 *           -> upstream -> commit -> answer (a streamed body keeps flowing
 *           after it)
 * Waits: a moment (a permit), a slot's grant, a store call's completion
 * (lookup, lease, commit: at once on RocksDB, a round trip on Redis), the
 * upstream's progress.
 */
#include <errno.h>
#include <sys/socket.h>

#include <event2/event.h>

#include "proxy/app.h"
#include "proxy/exchange_internal.h"
#include "obs/log.h"
#include "proxy/server.h"
#include "util/clock.h"

typedef enum ex_verdict (*stage_fn)(struct exchange *ex, uint64_t now);

static const stage_fn stages[] = {
    [EX_KEY] = stage_key,
    [EX_LOOKUP] = stage_lookup,
    [EX_PERMIT] = stage_permit,
    [EX_SLOT] = stage_slot,
    [EX_SEND_CHECK] = stage_send_check,
    [EX_LEASE] = stage_lease,
    [EX_UPSTREAM] = stage_upstream,
    [EX_COMMIT] = stage_commit,
};

static void on_timer(evutil_socket_t fd, short what, void *arg);
static void watch_client(struct exchange *ex);

/* ---- suspend and resume ------------------------------------------------- */

static void suspend(struct exchange *ex)
{
    if (ex->suspended)
        return;
    ex->suspended = true;
    TAILQ_INSERT_TAIL(&ex->loop->waiting, ex, link);
    MHD_suspend_connection(ex->mc);
}

/* MHD_resume_connection does not wake an external-epoll loop: the kick
 * makes MHD run on this loop pass. */
static void resume(struct exchange *ex)
{
    if (!ex->suspended)
        return;
    TAILQ_REMOVE(&ex->loop->waiting, ex, link);
    ex->suspended = false;
    MHD_resume_connection(ex->mc);
    loop_kick(ex->loop);
}

/* ---- the release path ----------------------------------------------------- */

static void release_timer(struct exchange *ex)
{
    if (ex->timer && evtimer_pending(ex->timer, NULL))
        evtimer_del(ex->timer);
}

static void release_client_watch(struct exchange *ex)
{
    if (ex->client_ev)
        event_del(ex->client_ev);
}

/* Nobody will read the rest of this upstream answer. */
static void release_upstream(struct exchange *ex)
{
    if (ex->ureq.pool && !ex->up_done) {
        up_request_cancel(&ex->ureq);
        ex->up_done = true;
        if (!ex->ureq.resp.result)
            ex->ureq.resp.result = UP_CONNECTION_LOST;
    }
}

/* Gives back, in reverse order of taking, what the exchange holds: once
 * its answer is decided, and at its end (all). Until the end, a body still
 * streaming keeps its upstream request and its concurrency slot (the
 * request is in flight until its last byte). */
static void release(struct exchange *ex, bool all)
{
    bool keep_flight = !all && ex->streaming && !ex->up_done;

    ex_store_cancel(ex);
    if (!keep_flight)
        release_upstream(ex);
    release_timer(ex);
    release_client_watch(ex);
    if (!keep_flight)
        pace_release_slot(ex);
    idem_release_lease(ex);
    idem_unclaim(ex);
    if (all)
        pace_release_bucket(ex);
}

void ex_release_all(struct exchange *ex)
{
    if (ex->suspended) { /* a daemon stopped early */
        TAILQ_REMOVE(&ex->loop->waiting, ex, link);
        ex->suspended = false;
    }
    release(ex, true);
}

/* ---- the driver ----------------------------------------------------------- */

static void answer_now(struct exchange *ex)
{
    /* Decided at the upstream's head: the body follows as it comes. */
    if (ex->kind == ANSWER_UPSTREAM && !ex->up_done) {
        ex->streaming = true;
        ex->ureq.hold_max = UP_STREAM_HOLD;
        ex->ureq.discard = false;
    }
    release(ex, false);
    ex->state = EX_READY;
    resume(ex);
}

static bool arm_timer(struct exchange *ex, uint64_t at, uint64_t now)
{
    struct timeval tv = clock_ns_to_tv(at > now ? at - now : 0);

    if (!ex->timer && !(ex->timer = evtimer_new(ex->loop->base, on_timer, ex)))
        return false;
    return evtimer_add(ex->timer, &tv) == 0;
}

/* A wait: the timer when the stage named a moment; before anything is sent
 * the worker's socket is watched too, so a worker that leaves is noticed. */
static bool wait_for(struct exchange *ex, uint64_t now)
{
    if (ex->wake_at && !arm_timer(ex, ex->wake_at, now))
        return false;
    if (ex->state < EX_LEASE)
        watch_client(ex);
    return true;
}

/* Runs stages from the current one until one waits or the answer is
 * decided. The only place that moves ex->state between stages. */
static void drive(struct exchange *ex)
{
    for (;;) {
        uint64_t now = clock_mono_ns();
        enum ex_verdict v;

        ex->wake_at = 0;
        v = stages[ex->state](ex, now);
        ex->woke = WOKE_FIRST;
        if (v == EXV_NEXT) {
            release_timer(ex); /* a deadline of the stage left behind */
            ex->state++;
            if (ex->state == EX_LEASE)
                release_client_watch(ex); /* from here it is sent */
            if (ex->state == EX_READY) {
                answer_now(ex);
                return;
            }
            continue;
        }
        if (v == EXV_WAIT && wait_for(ex, now)) {
            suspend(ex); /* MHD stops calling us until the resume */
            return;
        }
        if (v == EXV_WAIT)
            ex_refuse(ex, 500, OUT_REJECTED, R_INTERNAL, "out of memory");
        answer_now(ex);
        return;
    }
}

/* Not suspended up front: an answer known at once (a replay from RocksDB,
 * a refusal) is queued in the same MHD call, which saves the suspend and
 * resume (two epoll_ctl on MHD's set, a read that finds nothing and a loop
 * pass): a replay went from 5.1 to 3 syscalls. The first wait suspends. */
void ex_start(struct exchange *ex)
{
    ex->state = EX_KEY;
    ex->woke = WOKE_FIRST;
    drive(ex);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    struct exchange *ex = arg;

    if (ex->state < EX_KEY || ex->state >= EX_READY)
        return;
    ex->woke = WOKE_TIMER;
    drive(ex);
}

void ex_wake(struct exchange *ex)
{
    if (ex->state >= EX_READY) {
        /* The answer is out; the body streams. Its end frees the slot. */
        if (ex->up_done)
            pace_release_slot(ex);
        if (ex->reader_waiting) {
            ex->reader_waiting = false;
            resume(ex);
        }
        return;
    }
    if (ex->state < EX_KEY)
        return;
    ex->woke = WOKE_EVENT;
    drive(ex);
}

void ex_event_cb(evutil_socket_t fd, short what, void *arg)
{
    ex_wake(arg);
}

void ex_reader_wait(struct exchange *ex)
{
    ex->reader_waiting = true;
    suspend(ex);
}

/* ---- MHD phases ------------------------------------------------------------ */

void ex_set_body(struct exchange *ex)
{
    ex->state = EX_BODY;
}

void ex_set_refused(struct exchange *ex)
{
    ex->state = EX_REFUSED;
}

void ex_set_answered(struct exchange *ex)
{
    ex->state = EX_ANSWERED;
}

/* ---- the worker leaving while its request waits ----------------------------- */

/* Nothing else reads a suspended connection (MHD does not watch it), so a
 * worker that gave up would otherwise have its request sent later, and
 * without a key its retry would be a second side effect (nginx: 499). */
static void on_client_readable(evutil_socket_t fd, short what, void *arg)
{
    struct exchange *ex = arg;
    char c;
    ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);

    if (n > 0 || ex->state >= EX_LEASE)
        return; /* a pipelined request: the worker is there; stop watching */
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        event_add(ex->client_ev, NULL);
        return;
    }
    ex->kind = ANSWER_PROBLEM;
    ex->status = 499;
    ex->outcome = OUT_ABANDONED;
    ex->reason = R_CLIENT_CLOSED;
    log_debug("route %s: the worker closed its connection while its request "
              "waited: dropped, nothing sent", ex->route->name);
    answer_now(ex);
}

static void watch_client(struct exchange *ex)
{
    const union MHD_ConnectionInfo *ci;

    if (!ex->client_ev) {
        ci = MHD_get_connection_info(ex->mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (!ci)
            return;
        ex->client_ev = event_new(ex->loop->base, ci->connect_fd, EV_READ,
                                  on_client_readable, ex);
        if (!ex->client_ev)
            return; /* not watched: the request goes on as before */
    }
    if (!event_pending(ex->client_ev, EV_READ, NULL))
        event_add(ex->client_ev, NULL);
}

/* ---- the drain deadline ----------------------------------------------------- */

void exchange_abort_all(struct loop *w)
{
    struct exchange *ex;

    /* Each exchange leaves the list as it is resumed. */
    while ((ex = TAILQ_FIRST(&w->waiting))) {
        if (ex->state >= EX_READY) {
            /* A reader waiting for a body that will not come now. */
            release_upstream(ex);
            log_warn("route %s: response body cut short by the drain deadline",
                     ex->route->name);
            ex_wake(ex);
            continue;
        }
        if (ex->state == EX_COMMIT) {
            /* The answer is known; only its store write is awaited: given
             * up, as at its deadline (the lease then expires). */
            ex->woke = WOKE_TIMER;
            drive(ex);
            continue;
        }
        if (ex->state == EX_UPSTREAM)
            upstream_drain_answer(ex);
        else
            pace_drain_answer(ex, clock_mono_ns());
        release_upstream(ex);
        ex->state = EX_COMMIT;
        ex->woke = WOKE_FIRST;
        drive(ex);
    }
}
