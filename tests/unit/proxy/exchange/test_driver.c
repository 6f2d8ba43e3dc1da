/* proxy/exchange/driver.c with rows of the test's own: the rows run in
 * order; a wait suspends and a timer resumes; an answer skips the rest;
 * what the rows hold is given back backwards, at the answer and at the end,
 * for the rows entered only; the drain deadline lets the waiting row decide
 * and goes on to the row that settles; the worker's socket is watched only
 * while a row that sent nothing waits. */
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "proxy/exchange/driver.h"
#include "unit/proxy/exchange/fixture.h"

static const char yaml[] =
    "upstreams: { up: { url: http://127.0.0.1:9000 } }\n"
    "routes: [{ prefix: /, upstream: up }]\n";

static void up(void)
{
    fixture_up(yaml);
}

TestSuite(driver, .init = up, .fini = fixture_down);

/* What happened, in order, as text: "A B w+ ..." */
static char trail[512];

static void note(const char *what)
{
    strncat(trail, what, sizeof trail - strlen(trail) - 2);
    strcat(trail, " ");
}

static const char *how_name(enum ex_release how)
{
    static const char *const names[] = {"answer", "flight", "cut", "end"};

    return names[how];
}

#define ROW(NAME)                                                              \
    static void NAME##_release(struct exchange *ex, enum ex_release how)      \
    {                                                                          \
        char s[32];                                                            \
        snprintf(s, sizeof s, "~" #NAME ":%s", how_name(how));                 \
        note(s);                                                               \
    }

ROW(a)
ROW(w)
ROW(z)

static enum ex_verdict a_run(struct exchange *ex, uint64_t now)
{
    note("a");
    return EXV_NEXT;
}

/* Waits 1 ms once, then goes on. */
static enum ex_verdict w_run(struct exchange *ex, uint64_t now)
{
    if (ex->woke == WOKE_FIRST) {
        note("w+");
        ex->wake_at = now + MS;
        return EXV_WAIT;
    }
    note(ex->woke == WOKE_TIMER ? "w:timer" : "w:event");
    return EXV_NEXT;
}

static void w_drain(struct exchange *ex, uint64_t now)
{
    note("w:drain");
    ex_instruct(ex, OUT_REQUEUE, R_RATE_LIMITED, 1000, 0, 0);
}

static enum ex_verdict no_run(struct exchange *ex, uint64_t now)
{
    note("no");
    ex_refuse(ex, 400, OUT_REJECTED, R_MALFORMED_REQUEST, "refused");
    return EXV_ANSWER;
}

static enum ex_verdict z_run(struct exchange *ex, uint64_t now)
{
    note("z");
    return EXV_NEXT;
}

static const struct ex_stage row_a = {"a", a_run, a_release, NULL, STAGE_WATCH};
static const struct ex_stage row_w = {"w", w_run, w_release, w_drain, STAGE_WATCH};
static const struct ex_stage row_w_sent = {"w", w_run, w_release, w_drain, 0};
static const struct ex_stage row_no = {"no", no_run, NULL, NULL, 0};
static const struct ex_stage row_z = {"z", z_run, z_release, NULL, STAGE_SETTLES};

/* The owner: notes its calls; a socketpair stands for the worker. */
static int sock[2] = {-1, -1};
static int fd_asked;

static void o_suspend(struct exchange *ex)
{
    note("suspend");
}

static void o_resume(struct exchange *ex)
{
    note("resume");
}

static int o_fd(struct exchange *ex)
{
    fd_asked++;
    return sock[0];
}

static void o_headers(struct exchange *ex, ex_header_fn fn, void *arg)
{
}

static const struct ex_owner owner = {o_suspend, o_resume, o_fd, o_headers};

static void start(struct exchange *ex, const struct ex_plan *plan)
{
    fake(ex, 0);
    ex->owner = &owner;
    ex->plan = plan;
    trail[0] = '\0';
    fd_asked = 0;
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sock), 0);
    ex_start(ex);
}

static void end(struct exchange *ex)
{
    ex_release_all(ex);
    close(sock[0]);
    close(sock[1]);
}

Test(driver, rows_run_in_order_and_release_backwards)
{
    struct ex_plan plan = {{&row_a, &row_z}, 2};
    struct exchange ex;

    start(&ex, &plan);
    cr_expect_eq(ex.phase, PH_READY);
    cr_expect_not(ex.suspended, "answered without a wait: no suspend");
    cr_expect_str_eq(trail, "a z ~z:answer ~a:answer ");
    trail[0] = '\0';
    end(&ex);
    cr_expect_str_eq(trail, "~z:end ~a:end ");
}

Test(driver, a_wait_suspends_and_its_timer_resumes)
{
    struct ex_plan plan = {{&row_a, &row_w, &row_z}, 3};
    struct exchange ex;

    start(&ex, &plan);
    cr_expect_str_eq(trail, "a w+ suspend ");
    cr_expect(ex.suspended);
    cr_expect_eq(ex.phase, PH_PLAN);
    cr_expect_eq(fd_asked, 1, "the worker is watched while nothing is sent");
    /* The 1 ms timer is libevent's, on its coarse clock (a tick of up to
     * 4 ms): turned until it fires, 1 s at most. */
    for (int i = 0; i < 200 && !strstr(trail, "resume"); i++) {
        usleep(5000);
        event_base_loop(fx.env.base, EVLOOP_NONBLOCK);
    }
    cr_expect_str_eq(trail, "a w+ suspend w:timer z ~z:answer ~w:answer ~a:answer resume ");
    cr_expect_eq(ex.phase, PH_READY);
    end(&ex);
}

Test(driver, an_answer_skips_the_rest_and_releases_only_rows_entered)
{
    struct ex_plan plan = {{&row_a, &row_no, &row_z}, 3};
    struct exchange ex;

    start(&ex, &plan);
    cr_expect_str_eq(trail, "a no ~a:answer ");
    cr_expect_eq(ex.status, 400);
    trail[0] = '\0';
    end(&ex);
    cr_expect_str_eq(trail, "~a:end ");
}

/* The drain deadline: the waiting row decides, the rows between are skipped,
 * the row that settles runs, then the answer. */
Test(driver, the_drain_goes_on_to_the_row_that_settles)
{
    struct ex_plan plan = {{&row_w, &row_a, &row_z}, 3};
    struct exchange ex;

    start(&ex, &plan);
    trail[0] = '\0';
    ex_drain(&ex);
    cr_expect_str_eq(trail, "w:drain z ~z:answer ~a:answer ~w:answer resume ");
    cr_expect_eq(ex.reason, R_RATE_LIMITED);
    end(&ex);
}

/* A row that may have sent something is not watched: a worker that leaves
 * then does not end a request the partner may be acting on. */
Test(driver, a_row_that_sent_is_not_watched)
{
    struct ex_plan plan = {{&row_w_sent}, 1};
    struct exchange ex;

    start(&ex, &plan);
    cr_expect_eq(fd_asked, 0);
    end(&ex);
}

/* A worker leaving while a watched row waits: 499, abandoned, nothing more
 * runs. */
Test(driver, a_worker_leaving_a_watched_wait_abandons_it)
{
    struct ex_plan plan = {{&row_w, &row_z}, 2};
    struct exchange ex;

    start(&ex, &plan);
    close(sock[1]);
    sock[1] = -1;
    event_base_loop(fx.env.base, EVLOOP_NONBLOCK);
    cr_expect_eq(ex.outcome, OUT_ABANDONED);
    cr_expect_eq(ex.status, 499);
    cr_expect_str_eq(trail, "w+ suspend ~w:answer resume ");
    end(&ex);
}
