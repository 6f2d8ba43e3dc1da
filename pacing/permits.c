#include "pacing/permits.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define waiter_of(l) \
    ((struct permit_waiter *)((char *)(l) - offsetof(struct permit_waiter, lw)))

int permits_init(struct permits *pm, const struct sc_lane *cfg, size_t n,
                 double rate, uint32_t burst, uint64_t now)
{
    memset(pm, 0, sizeof *pm);
    pthread_mutex_init(&pm->mu, NULL);
    tbucket_init(&pm->tb, rate, burst, now);
    pm->cfg = cfg;
    return lanes_init(&pm->lanes, cfg, n) == 0 ? 0 : -ENOMEM;
}

void permits_follow(struct permits *pm, double min_rate)
{
    pm->follow = true;
    quota_init(&pm->quota, pm->tb.rate, min_rate,
               (uint32_t)(pm->tb.cap / TB_ONE));
}

void permits_free(struct permits *pm)
{
    lanes_free(&pm->lanes);
    free(pm->lane_map);
    pthread_mutex_destroy(&pm->mu);
    memset(pm, 0, sizeof *pm);
}

void permits_set_level(struct permits *pm, uint64_t now, uint32_t whole,
                       uint64_t next_ns)
{
    pthread_mutex_lock(&pm->mu);
    tbucket_set_level(&pm->tb, now, whole, next_ns);
    pthread_mutex_unlock(&pm->mu);
}

void permits_set_empty(struct permits *pm, uint64_t now)
{
    pthread_mutex_lock(&pm->mu);
    tbucket_empty(&pm->tb, now);
    pthread_mutex_unlock(&pm->mu);
}

/* The state that carries pm on, locked, with *lane (may be NULL) mapped
 * into it. One lock at a time: a hand-over holds both while it moves. */
static struct permits *lock_live(struct permits *pm, uint32_t *lane)
{
    for (;;) {
        struct permits *next;

        pthread_mutex_lock(&pm->mu);
        if (!(next = pm->next))
            return pm;
        if (lane)
            *lane = pm->lane_map[*lane];
        pthread_mutex_unlock(&pm->mu);
        pm = next;
    }
}

/* Under mu: the bucket's rate and capacity as the advertised quota says
 * at now (a reset passed raises them), before anything reads the bucket. */
static void sync_quota(struct permits *pm, uint64_t now)
{
    if (pm->follow)
        quota_bucket_sync(&pm->quota, &pm->tb, now);
}

/* Under mu: ns until n permits could be had, the quota's coming resets
 * counted. */
static uint64_t predict(const struct permits *pm, uint32_t lane, uint64_t now)
{
    return lanes_predict_ns(&pm->lanes, lane, &pm->tb, now,
                            pm->follow ? quota_accrue_ns : NULL, &pm->quota);
}

/* Under mu. A waiter to keep time when none does: the head of the first
 * lane with waiters (any waiter would do: the keeper only runs rounds). */
static struct permit_waiter *any_waiter(const struct permits *pm)
{
    for (uint32_t i = 0; i < pm->lanes.n; i++)
        if (pm->lanes.v[i].waiting)
            return waiter_of(TAILQ_FIRST(&pm->lanes.v[i].queue));
    return NULL;
}

/* Under mu: every token due now goes to the waiter the lanes pick; a
 * keeper is named if waiters remain without one. self (may be NULL) is the
 * caller's own waiter: it learns from the flags, it is not woken. */
static void grant_round(struct permits *pm, uint64_t now,
                        struct permit_waiter *self)
{
    struct lane_waiter *lw;
    struct permit_waiter *w;

    while ((lw = lanes_grant(&pm->lanes, &pm->tb, now))) {
        w = waiter_of(lw);
        w->granted = true;
        pm->flight++;
        if (w == pm->keeper) {
            pm->keeper = NULL;
            w->keeper = false;
        }
        if (w != self)
            w->wake(w);
    }
    if (pm->keeper || !(w = any_waiter(pm)))
        return;
    pm->keeper = w;
    w->keeper = true;
    if (w != self)
        w->wake(w);
}

/* Under mu: when a waiting w looks again. The keeper at the next token
 * (a pause included); the others only at their deadline. */
static uint64_t look_again(const struct permits *pm,
                           const struct permit_waiter *w, uint64_t now)
{
    uint64_t ns;

    if (!w->keeper)
        return 0;
    ns = tbucket_wait_ns(&pm->tb, now, 1, pm->follow ? quota_accrue_ns : NULL,
                         &pm->quota);
    return ns > UINT64_MAX - now ? UINT64_MAX : now + (ns ? ns : 1);
}

enum permit_ask permits_ask(struct permits *pm, struct permit_waiter *w,
                            uint32_t lane, uint64_t now, uint64_t max_wait_ns,
                            uint64_t *at)
{
    enum permit_ask r = PERMIT_WAIT;

    pm = lock_live(pm, &lane);
    sync_quota(pm, now);
    w->granted = w->keeper = false;
    if (lanes_try_now(&pm->lanes, &pm->tb, now)) {
        r = PERMIT_GO;
        pm->flight++;
    } else if ((*at = predict(pm, lane, now)) > max_wait_ns) {
        r = PERMIT_REFUSED;
    } else {
        lanes_push(&pm->lanes, &w->lw, lane);
        /* A token already due (a keeper late) is handed out now. */
        grant_round(pm, now, w);
        if (w->granted)
            r = PERMIT_GO;
        else
            *at = look_again(pm, w, now);
    }
    pthread_mutex_unlock(&pm->mu);
    return r;
}

enum permit_ask permits_poll(struct permits *pm, struct permit_waiter *w,
                             uint64_t now, uint64_t *at)
{
    enum permit_ask r = PERMIT_GO;

    pm = lock_live(pm, NULL);
    sync_quota(pm, now);
    if (!w->granted && w->keeper)
        grant_round(pm, now, w);
    if (!w->granted) {
        r = PERMIT_WAIT;
        *at = look_again(pm, w, now);
    }
    pthread_mutex_unlock(&pm->mu);
    return r;
}

bool permits_leave(struct permits *pm, struct permit_waiter *w, uint64_t now,
                   uint64_t *delay_ns)
{
    bool left;
    uint32_t lane = w->lw.lane;

    pm = lock_live(pm, NULL);
    sync_quota(pm, now);
    left = lanes_remove(&pm->lanes, &w->lw);
    if (left && w->keeper) {
        /* Somebody else keeps time now. */
        pm->keeper = NULL;
        w->keeper = false;
        grant_round(pm, now, NULL);
    }
    if (delay_ns)
        *delay_ns = predict(pm, lane, now);
    pthread_mutex_unlock(&pm->mu);
    return left;
}

void permits_empty(struct permits *pm, uint64_t now)
{
    pm = lock_live(pm, NULL);
    sync_quota(pm, now);
    tbucket_empty(&pm->tb, now);
    pthread_mutex_unlock(&pm->mu);
}

/* Under mu: the keeper's moment moved. */
static void wake_keeper(struct permits *pm)
{
    if (pm->keeper)
        pm->keeper->wake(pm->keeper);
}

void permits_pause(struct permits *pm, uint64_t now, uint64_t until)
{
    pm = lock_live(pm, NULL);
    sync_quota(pm, now);
    tbucket_pause_until(&pm->tb, now, until);
    wake_keeper(pm);
    pthread_mutex_unlock(&pm->mu);
}

void permits_resume(struct permits *pm, uint64_t now)
{
    pm = lock_live(pm, NULL);
    sync_quota(pm, now);
    tbucket_resume(&pm->tb, now);
    wake_keeper(pm);
    pthread_mutex_unlock(&pm->mu);
}

uint32_t permits_available(struct permits *pm, uint64_t now, uint64_t *next_ns)
{
    double t;

    pm = lock_live(pm, NULL);
    sync_quota(pm, now);
    t = tbucket_tokens(&pm->tb, now);
    if (next_ns)
        *next_ns = t >= 1 ? 0 : tbucket_next_ns(&pm->tb, now);
    pthread_mutex_unlock(&pm->mu);
    return t >= UINT32_MAX ? UINT32_MAX : (uint32_t)t;
}

uint32_t permits_waiting(struct permits *pm, uint32_t lane)
{
    uint32_t n;

    pm = lock_live(pm, &lane);
    n = lane < pm->lanes.n ? lanes_waiting(&pm->lanes, lane) : 0;
    pthread_mutex_unlock(&pm->mu);
    return n;
}

/* pm's lane i in to: the lane of the same name, else to's last. */
static uint32_t map_lane(const struct permits *pm, const struct permits *to,
                         uint32_t i)
{
    const char *name = pm->cfg[i].name;

    for (uint32_t j = 0; name && j < to->lanes.n; j++)
        if (to->cfg[j].name && !strcmp(to->cfg[j].name, name))
            return j;
    return to->lanes.n - 1;
}

/* Under both locks: each lane's waiters, in order, to their new lane; the
 * keeper's role is given anew there. */
static void waiters_hand_over(struct permits *pm, struct permits *to,
                              uint64_t now)
{
    struct lane_waiter *lw;

    for (uint32_t i = 0; i < pm->lanes.n; i++)
        while ((lw = TAILQ_FIRST(&pm->lanes.v[i].queue))) {
            lanes_remove(&pm->lanes, lw);
            waiter_of(lw)->keeper = false;
            lanes_push(&to->lanes, lw, pm->lane_map[i]);
        }
    pm->keeper = NULL;
    grant_round(to, now, NULL);
}

int permits_hand_over(struct permits *pm, struct permits *to, uint64_t now)
{
    uint32_t *map = calloc(pm->lanes.n ? pm->lanes.n : 1, sizeof *map);

    if (!map)
        return -ENOMEM;
    pthread_mutex_lock(&pm->mu);
    pthread_mutex_lock(&to->mu);
    pm->lane_map = map;
    for (uint32_t i = 0; i < pm->lanes.n; i++)
        map[i] = map_lane(pm, to, i);
    if (pm->follow && to->follow) {
        /* What the partner said still holds; the ceiling is the new one. */
        memcpy(to->quota.items, pm->quota.items, sizeof pm->quota.items);
        to->quota.n = pm->quota.n;
        to->quota.at = pm->quota.at;
        to->quota.at_wall_ms = pm->quota.at_wall_ms;
        sync_quota(to, now);
    }
    to->flight = pm->flight;
    to->held = pm->held;
    tbucket_carry(&to->tb, &pm->tb, now);
    waiters_hand_over(pm, to, now);
    pm->next = to;
    pthread_mutex_unlock(&to->mu);
    pthread_mutex_unlock(&pm->mu);
    return 0;
}

void permits_flying(struct permits *pm)
{
    pm = lock_live(pm, NULL);
    pm->flight++;
    pthread_mutex_unlock(&pm->mu);
}

void permits_hold(struct permits *pm, bool hold)
{
    pm = lock_live(pm, NULL);
    if (hold)
        pm->held++;
    else if (pm->held)
        pm->held--;
    pthread_mutex_unlock(&pm->mu);
}

void permits_answered(struct permits *pm, const struct quota_headers *h,
                      uint64_t now, uint64_t wall_ms, int64_t fleet_flight,
                      struct quota_result *res)
{
    struct quota_result none;
    uint64_t f;

    pm = lock_live(pm, NULL);
    if (pm->flight)
        pm->flight--;
    if (pm->follow && h) {
        /* The bucket accrued at the old numbers until now. */
        sync_quota(pm, now);
        if (!res)
            res = &none;
        f = fleet_flight >= 0 ? (uint64_t)fleet_flight
            : (uint64_t)(pm->flight > pm->held ? pm->flight - pm->held : 0) *
                  (pm->flight_scale ? pm->flight_scale : 1);
        quota_update(&pm->quota, h, now, wall_ms, f > UINT32_MAX ? UINT32_MAX : (uint32_t)f,
                     res);
        sync_quota(pm, now);
        if (res->top_up) {
            tbucket_top_up(&pm->tb, now);
            /* A fleet's bucket tops up only when the f it came with is
             * the fleet's: beside another sidecar's request in flight,
             * that permit would be refused. */
            if (fleet_flight >= 0) {
                pm->top_up_ms = wall_ms;
                pm->top_up_f = (uint32_t)(f > UINT32_MAX ? UINT32_MAX : f);
            }
        }
        wake_keeper(pm);
    }
    pthread_mutex_unlock(&pm->mu);
}

void permits_view(struct permits *pm, uint64_t now, struct permits_view *v)
{
    pm = lock_live(pm, NULL);
    sync_quota(pm, now);
    v->rate = pm->follow ? quota_rate(&pm->quota, now) : pm->tb.rate;
    v->capacity = (uint32_t)(pm->tb.cap / TB_ONE);
    v->limited = pm->follow && quota_limits(&pm->quota, now);
    v->quota = pm->quota;
    v->top_up_ms = pm->top_up_ms;
    v->top_up_f = pm->top_up_f;
    pthread_mutex_unlock(&pm->mu);
}
