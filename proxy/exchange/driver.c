/* The driver: one function advances a request through the rows of its plan
 * (as nginx's phase runner does) and is the only writer of where it is. A
 * row decides and returns a verdict; the driver does the moving: it arms
 * the one timer, watches the worker's socket while a row that sent nothing
 * waits, asks the owner to suspend and resume the request, and gives back
 * what the rows hold by walking them backwards (each row's release), on
 * every way out (answer, worker gone, drain deadline, allocation failure),
 * so that no exit can forget a release.
 *
 * Waits: a moment (a permit), a slot's grant, a store call's completion (at
 * once on RocksDB, a round trip on Redis), the upstream's progress. */
#include <errno.h>
#include <sys/socket.h>

#include <event2/event.h>

#include "obs/log.h"
#include "proxy/exchange/driver.h"
#include "util/clock.h"

static void on_timer(evutil_socket_t fd, short what, void *arg);
static void watch_client(struct exchange *ex);

static uint64_t system_mono_ns(void *arg)
{
    return clock_mono_ns();
}

static uint64_t system_wall_ms(void *arg)
{
    return clock_wall_ms();
}

const struct ex_clock ex_system_clock = {system_mono_ns, system_wall_ms, NULL};

static const struct ex_stage *row(const struct exchange *ex)
{
    return ex->at < ex->plan->n ? ex->plan->row[ex->at] : NULL;
}

static uint64_t now_ns(const struct exchange *ex)
{
    return ex->env->clock->mono_ns(ex->env->clock->arg);
}

/* ---- suspend and resume ------------------------------------------------- */

static void suspend(struct exchange *ex)
{
    if (ex->suspended)
        return;
    ex->suspended = true;
    ex->owner->suspend(ex);
}

static void resume(struct exchange *ex)
{
    if (!ex->suspended)
        return;
    ex->suspended = false;
    ex->owner->resume(ex);
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

/* The rows entered, backwards: each gives back what `how` allows. */
static void release_rows(struct exchange *ex, enum ex_release how)
{
    for (int i = (int)ex->reached - 1; i >= 0; i--)
        if (ex->plan->row[i]->release)
            ex->plan->row[i]->release(ex, how);
}

static void release(struct exchange *ex, enum ex_release how)
{
    ex_store_cancel(ex);
    release_timer(ex);
    release_client_watch(ex);
    release_rows(ex, how);
}

void ex_release_all(struct exchange *ex)
{
    ex->suspended = false; /* an owner that stopped early */
    if (ex->plan)
        release(ex, REL_END);
    if (ex->timer)
        event_free(ex->timer);
    if (ex->client_ev)
        event_free(ex->client_ev);
    ex->timer = ex->client_ev = NULL;
    if (ex->scall) {
        store_record_clear(&ex->scall->rec);
        store_record_clear(&ex->scall->acq.rec);
        freelist_give(ex->env->spare_calls, ex->scall);
        ex->scall = NULL;
    }
}

/* ---- the driver ----------------------------------------------------------- */

static void answer_now(struct exchange *ex)
{
    release(ex, REL_ANSWER);
    ex->phase = PH_READY;
    resume(ex);
}

static bool arm_timer(struct exchange *ex, uint64_t at, uint64_t now)
{
    struct timeval tv = clock_ns_to_tv(at > now ? at - now : 0);

    if (!ex->timer && !(ex->timer = evtimer_new(ex->env->base, on_timer, ex)))
        return false;
    return evtimer_add(ex->timer, &tv) == 0;
}

/* A wait: the timer when the row named a moment; while nothing is sent the
 * worker's socket is watched too, so a worker that leaves is noticed. */
static bool wait_for(struct exchange *ex, uint64_t now)
{
    if (ex->wake_at && !arm_timer(ex, ex->wake_at, now))
        return false;
    if (row(ex)->flags & STAGE_WATCH)
        watch_client(ex);
    return true;
}

/* Moves to the next row; the plan's end is the answer. */
static bool next_row(struct exchange *ex)
{
    release_timer(ex); /* a deadline of the row left behind */
    ex->at++;
    if (!row(ex))
        return false;
    if (!(row(ex)->flags & STAGE_WATCH))
        release_client_watch(ex); /* from here it may be sent */
    return true;
}

/* Runs rows from the current one until one waits or the answer is decided.
 * The only place that moves ex->at. */
static void drive(struct exchange *ex)
{
    for (;;) {
        uint64_t now = now_ns(ex);
        enum ex_verdict v;

        if (!row(ex)) {
            answer_now(ex);
            return;
        }
        if (ex->at >= ex->reached)
            ex->reached = ex->at + 1;
        ex->wake_at = 0;
        v = row(ex)->run(ex, now);
        ex->woke = WOKE_FIRST;
        if (v == EXV_NEXT) {
            if (!next_row(ex)) {
                answer_now(ex);
                return;
            }
            continue;
        }
        if (v == EXV_WAIT && wait_for(ex, now)) {
            suspend(ex); /* the owner stops calling us until the resume */
            return;
        }
        if (v == EXV_WAIT)
            ex_refuse(ex, 500, OUT_REJECTED, R_INTERNAL, "out of memory");
        answer_now(ex);
        return;
    }
}

/* Not suspended up front: an answer known at once (a replay from RocksDB, a
 * refusal) is queued in the same libmicrohttpd call, which saves the
 * suspend and resume (two epoll_ctl on MHD's set, a read that finds nothing
 * and a loop pass): a replay went from 5.1 to 3 syscalls. The first wait
 * suspends. */
void ex_start(struct exchange *ex)
{
    ex->phase = PH_PLAN;
    ex->at = 0;
    ex->woke = WOKE_FIRST;
    drive(ex);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    struct exchange *ex = arg;

    if (ex->phase != PH_PLAN)
        return;
    ex->woke = WOKE_TIMER;
    drive(ex);
}

void ex_wake(struct exchange *ex)
{
    if (ex->phase >= PH_READY) {
        /* The answer is out; the body streams. Its end ends the flight. */
        if (ex->up_done)
            release_rows(ex, REL_FLIGHT);
        if (ex->reader_waiting) {
            ex->reader_waiting = false;
            resume(ex);
        }
        return;
    }
    if (ex->phase != PH_PLAN)
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

/* ---- the worker leaving while its request waits ----------------------------- */

/* Nothing else reads a suspended connection (MHD does not watch it), so a
 * worker that gave up would otherwise have its request sent later, and
 * without a key its retry would be a second side effect (nginx: 499). */
static void on_client_readable(evutil_socket_t fd, short what, void *arg)
{
    struct exchange *ex = arg;
    char c;
    ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);

    if (n > 0 || ex->phase != PH_PLAN || !(row(ex)->flags & STAGE_WATCH))
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
              "waited: dropped, nothing sent", ex->label);
    answer_now(ex);
}

static void watch_client(struct exchange *ex)
{
    int fd;

    if (!ex->client_ev) {
        fd = ex->owner->client_fd(ex);
        if (fd < 0)
            return;
        ex->client_ev = event_new(ex->env->base, fd, EV_READ, on_client_readable, ex);
        if (!ex->client_ev)
            return; /* not watched: the request goes on as before */
    }
    if (!event_pending(ex->client_ev, EV_READ, NULL))
        event_add(ex->client_ev, NULL);
}

/* ---- the drain deadline ----------------------------------------------------- */

/* The row that settles the outcome after the current one, or the end. */
static uint8_t settle_row(const struct exchange *ex)
{
    uint8_t i = (uint8_t)(ex->at + 1);

    while (i < ex->plan->n && !(ex->plan->row[i]->flags & STAGE_SETTLES))
        i++;
    return i;
}

void ex_drain(struct exchange *ex)
{
    const struct ex_stage *r;

    if (ex->phase >= PH_READY) {
        /* A reader waiting for a body that will not come now. */
        release_rows(ex, REL_CUT);
        log_warn("route %s: response body cut short by the drain deadline",
                 ex->label);
        ex_wake(ex);
        return;
    }
    if (ex->phase != PH_PLAN || !(r = row(ex)))
        return;
    if (!r->drain) {
        /* Only its deadline is awaited (a store write): given up now. */
        ex->woke = WOKE_TIMER;
        drive(ex);
        return;
    }
    r->drain(ex, now_ns(ex));
    /* Rows skipped on the way are released with the others: each release
     * gives back only what its row took. */
    ex->at = settle_row(ex);
    ex->woke = WOKE_FIRST;
    drive(ex);
}
