/* Metrics (docs/contract.md §7 and §8) as Prometheus meets them: the exposition
 * of GET /metrics on the admin listener after traffic that makes every
 * family speak, label discipline against hostile requests, and the shipped
 * Grafana dashboard and Prometheus rules (deploy/) checked against the live
 * output and with promtool (from Debian's prometheus package, which
 * scripts/deps.sh installs). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "integration/harness.h"
#include "support/testutil.h"

#define DASHBOARD SLUICE_SOURCE_DIR "/deploy/grafana/sluice.json"
#define RULES SLUICE_SOURCE_DIR "/deploy/prometheus/sluice-rules.yaml"
#define RULES_TEST SLUICE_SOURCE_DIR "/deploy/prometheus/sluice-rules.test.yaml"
#define RUNBOOK SLUICE_SOURCE_DIR "/docs/runbook.md"

#define MAX_CONNS 8

static struct h_stub stub;
static struct h_sluice sl;

/* A route name with both characters the text format must escape. */
#define WEIRD_ROUTE "we\"ird\\route"

static void start(void)
{
    char *cfg;
    int dead = h_free_port(); /* bound, released: nothing listens there */

    cr_assert_eq(h_stub_start(&stub, NULL), 0);
    cr_assert(asprintf(&cfg,
        "limits: {max_connections: %d}\n"
        "upstreams:\n"
        "  stub: {url: http://127.0.0.1:%d, timeout: 5s}\n"
        "  dead: {url: http://127.0.0.1:%d, connect_timeout: 1s, timeout: 2s}\n"
        "policies:\n"
        "  open: {retry: {max_attempts: 3}, idempotency: {required: false,\n"
        "         verify: {path: \"/lookup?ref={key}\"}}}\n"
        "  slow: {rate: 1/m, burst: 1, max_wait: 10ms}\n"
        "  cool: {rate: 50/s, burst: 5, max_wait: 10ms}\n"
        "routes:\n"
        "  - {name: sync, prefix: /v1/sync, upstream: stub, policy: open}\n"
        "  - {name: paced, prefix: /v1/paced, upstream: stub, policy: slow}\n"
        "  - {name: cool, prefix: /v1/cool, upstream: stub, policy: cool}\n"
        "  - {name: gone, prefix: /v1/gone, upstream: dead}\n"
        "  - {name: '" WEIRD_ROUTE "', prefix: /v1/weird, upstream: stub}\n",
        MAX_CONNS, stub.port, dead) > 0);
    cr_assert_eq(h_sluice_start(&sl, cfg), 0, "sluice did not start");
    free(cfg);
}

static void stop(void)
{
    h_sluice_cleanup(&sl);
    h_stub_stop(&stub);
}

TestSuite(metrics, .init = start, .fini = stop, .timeout = 90);

/* ---- the exposition, parsed --------------------------------------------- */

struct label {
    char *name, *value;     /* value unescaped */
};

struct sample {
    char *name;
    struct label l[8];
    int nl;
    double v;
    char *key;              /* name{labels} as written: duplicate check */
    int line;
};

struct family {
    char *name, *type;
    bool help;
};

struct expo {
    struct sample *s;
    size_t n, cap;
    struct family f[64];
    size_t nf;
    char err[2048];         /* the first problems found, one a line */
    int n_err;
};

static void problem(struct expo *e, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void problem(struct expo *e, int line, const char *fmt, ...)
{
    size_t used = strlen(e->err);
    va_list ap;

    if (e->n_err++ < 8 && used < sizeof e->err - 64) {
        used += (size_t)snprintf(e->err + used, sizeof e->err - used, "line %d: ", line);
        va_start(ap, fmt);
        vsnprintf(e->err + used, sizeof e->err - used, fmt, ap);
        va_end(ap);
        strncat(e->err, "\n", sizeof e->err - strlen(e->err) - 1);
    }
}

static void expo_free(struct expo *e)
{
    for (size_t i = 0; i < e->n; i++) {
        free(e->s[i].name);
        free(e->s[i].key);
        for (int j = 0; j < e->s[i].nl; j++) {
            free(e->s[i].l[j].name);
            free(e->s[i].l[j].value);
        }
    }
    free(e->s);
    for (size_t i = 0; i < e->nf; i++) {
        free(e->f[i].name);
        free(e->f[i].type);
    }
    memset(e, 0, sizeof *e);
}

static size_t metric_name_len(const char *p)
{
    size_t n = 0;

    if (!(isalpha((unsigned char)p[0]) || p[0] == '_' || p[0] == ':'))
        return 0;
    while (isalnum((unsigned char)p[n]) || p[n] == '_' || p[n] == ':')
        n++;
    return n;
}

static size_t label_name_len(const char *p)
{
    size_t n = 0;

    if (!(isalpha((unsigned char)p[0]) || p[0] == '_'))
        return 0;
    while (isalnum((unsigned char)p[n]) || p[n] == '_')
        n++;
    return n;
}

static struct family *family_of(struct expo *e, const char *name)
{
    for (size_t i = 0; i < e->nf; i++)
        if (!strcmp(e->f[i].name, name))
            return &e->f[i];
    return NULL;
}

static struct family *family_add(struct expo *e, const char *name, size_t len)
{
    struct family *f;
    char *n = strndup(name, len);

    if ((f = family_of(e, n))) {
        free(n);
        return f;
    }
    cr_assert_lt(e->nf, sizeof e->f / sizeof *e->f);
    f = &e->f[e->nf++];
    f->name = n;
    return f;
}

/* The family a sample name belongs to, given the TYPE in force. */
static bool belongs(const struct family *f, const char *name)
{
    size_t n;

    if (!f || !f->type)
        return false;
    if (!strcmp(f->name, name))
        return strcmp(f->type, "histogram") != 0;
    n = strlen(f->name);
    return !strcmp(f->type, "histogram") && !strncmp(name, f->name, n) &&
           (!strcmp(name + n, "_bucket") || !strcmp(name + n, "_sum") ||
            !strcmp(name + n, "_count"));
}

/* "# HELP name text" / "# TYPE name type". */
static void parse_comment(struct expo *e, const char *line, int no,
                          struct family **cur)
{
    bool help = !strncmp(line, "# HELP ", 7), type = !strncmp(line, "# TYPE ", 7);
    const char *p = line + 7;
    size_t n = metric_name_len(p);
    struct family *f;

    if (!help && !type) {
        problem(e, no, "a comment that is neither # HELP nor # TYPE: %s", line);
        return;
    }
    if (!n || p[n] != ' ' || !p[n + 1]) {
        problem(e, no, "malformed %s line: %s", help ? "HELP" : "TYPE", line);
        return;
    }
    f = family_add(e, p, n);
    if (help) {
        if (f->help)
            problem(e, no, "second HELP for %s", f->name);
        f->help = true;
        for (const char *h = p + n + 1; *h; h++)
            if (*h == '\\' && h[1] != '\\' && h[1] != 'n')
                problem(e, no, "bad escape in HELP text: %s", line);
        return;
    }
    if (f->type)
        problem(e, no, "second TYPE for %s", f->name);
    else if (strcmp(p + n + 1, "counter") && strcmp(p + n + 1, "gauge") &&
             strcmp(p + n + 1, "histogram") && strcmp(p + n + 1, "summary") &&
             strcmp(p + n + 1, "untyped"))
        problem(e, no, "unknown type: %s", line);
    else
        f->type = strdup(p + n + 1);
    for (size_t i = 0; i < e->n; i++)
        if (belongs(f, e->s[i].name))
            problem(e, no, "TYPE of %s after its samples", f->name);
    *cur = f;
}

/* name{l="v",...} value */
static void parse_sample(struct expo *e, const char *line, int no,
                         const struct family *cur)
{
    struct sample s = {.line = no};
    const char *p = line;
    size_t n = metric_name_len(p);
    char *end, *v;

    if (!n) {
        problem(e, no, "not a sample: %s", line);
        return;
    }
    s.name = strndup(p, n);
    p += n;
    if (*p == '{') {
        p++;
        while (*p != '}') {
            size_t ln = label_name_len(p);
            char *val, *o;

            if (!ln || p[ln] != '=' || p[ln + 1] != '"') {
                problem(e, no, "malformed label at \"%s\"", p);
                goto bad;
            }
            if (s.nl == 8) {
                problem(e, no, "more than 8 labels");
                goto bad;
            }
            s.l[s.nl].name = strndup(p, ln);
            for (int j = 0; j < s.nl; j++)
                if (!strcmp(s.l[j].name, s.l[s.nl].name))
                    problem(e, no, "label %s twice", s.l[j].name);
            if (!strncmp(s.l[s.nl].name, "__", 2))
                problem(e, no, "reserved label name %s", s.l[s.nl].name);
            p += ln + 2;
            val = o = malloc(strlen(p) + 1);
            while (*p && *p != '"') {
                if (*p == '\\') {
                    if (p[1] != '\\' && p[1] != '"' && p[1] != 'n') {
                        problem(e, no, "bad escape \\%c in a label value", p[1]);
                        break;
                    }
                    *o++ = p[1] == 'n' ? '\n' : p[1];
                    p += 2;
                } else {
                    *o++ = *p++;
                }
            }
            *o = '\0';
            s.l[s.nl++].value = val;
            if (*p != '"') {
                problem(e, no, "unterminated label value");
                goto bad;
            }
            p++;
            if (*p == ',')
                p++;
            else if (*p != '}') {
                problem(e, no, "expected , or } at \"%s\"", p);
                goto bad;
            }
        }
        p++;
    }
    s.key = strndup(line, (size_t)(p - line));
    if (*p != ' ' || !p[1]) {
        problem(e, no, "no single space and value after %s", s.key);
        goto bad;
    }
    v = (char *)p + 1;
    if (!strcmp(v, "+Inf") || !strcmp(v, "-Inf") || !strcmp(v, "NaN")) {
        s.v = !strcmp(v, "NaN") ? NAN : v[0] == '+' ? INFINITY : -INFINITY;
    } else {
        s.v = strtod(v, &end);
        if (end == v || *end) /* a timestamp, or trailing junk */
            problem(e, no, "value \"%s\" is not one float", v);
    }
    if (!belongs(cur, s.name))
        problem(e, no, "%s is not a sample of the family in force (%s %s)", s.name,
                cur ? cur->name : "none", cur && cur->type ? cur->type : "");
    for (size_t i = 0; i < e->n; i++)
        if (!strcmp(e->s[i].key, s.key))
            problem(e, no, "series %s twice", s.key);
    if (e->n == e->cap) {
        e->cap = e->cap ? 2 * e->cap : 256;
        e->s = realloc(e->s, e->cap * sizeof *e->s);
    }
    e->s[e->n++] = s;
    return;
bad:
    free(s.name);
    free(s.key);
    for (int j = 0; j < s.nl; j++) {
        free(s.l[j].name);
        free(s.l[j].value);
    }
    if (s.nl < 8) /* a name parsed without its value */
        free(s.l[s.nl].name);
}

static void parse_expo(const char *text, struct expo *e)
{
    char *copy = strdup(text), *line;
    struct family *cur = NULL;
    size_t len = strlen(text);
    int no = 0;

    memset(e, 0, sizeof *e);
    if (!len || text[len - 1] != '\n')
        problem(e, 0, "the text does not end with a line feed");
    /* strsep keeps empty lines, so a blank line is seen (and refused). */
    for (char *rest = copy; (line = strsep(&rest, "\n")) != NULL;) {
        no++;
        if (!rest) /* what follows the last \n */
            break;
        if (!*line)
            problem(e, no, "blank line");
        else if (line[0] == '#')
            parse_comment(e, line, no, &cur);
        else
            parse_sample(e, line, no, cur);
    }
    free(copy);
}

static const char *label(const struct sample *s, const char *name)
{
    for (int i = 0; i < s->nl; i++)
        if (!strcmp(s->l[i].name, name))
            return s->l[i].value;
    return NULL;
}

/* The value of the series with exactly these labels (NULL-terminated name,
 * value pairs), or -1 when absent. */
static double val(const struct expo *e, const char *name, ...)
{
    const char *pairs[16];
    int np = 0;
    va_list ap;

    va_start(ap, name);
    while (np < 16 && (pairs[np] = va_arg(ap, const char *)) != NULL)
        np++;
    va_end(ap);
    for (size_t i = 0; i < e->n; i++) {
        const struct sample *s = &e->s[i];
        bool match = strcmp(s->name, name) == 0 && s->nl == np / 2;

        for (int j = 0; match && j + 1 < np; j += 2) {
            const char *v = label(s, pairs[j]);
            match = v && !strcmp(v, pairs[j + 1]);
        }
        if (match)
            return s->v;
    }
    return -1;
}

/* ---- talking to sluice -------------------------------------------------- */

static char *scrape(void)
{
    struct h_resp r;
    char *ct, *body;

    cr_assert_eq(h_http(sl.admin_port, "GET", "/metrics", NULL, NULL, 0, &r), 0);
    cr_assert_eq(r.status, 200, "GET /metrics: %d", r.status);
    ct = h_header(&r, "Content-Type");
    cr_expect(ct && !strncmp(ct, "text/plain; version=0.0.4", 25), "Content-Type %s",
              ct ? ct : "(none)");
    free(ct);
    body = r.body;
    r.body = NULL;
    h_resp_free(&r);
    return body;
}

/* Sum of sluice_requests_total over every series but shadow counts. */
static double answers(const struct expo *e)
{
    double sum = 0;

    for (size_t i = 0; i < e->n; i++)
        if (!strcmp(e->s[i].name, "sluice_requests_total") && !label(&e->s[i], "shadow"))
            sum += e->s[i].v;
    return sum;
}

/* Metrics are recorded when an exchange completes, which may be just after
 * the worker has its answer: scrapes until `total` answers are counted (-1:
 * any) and `conns` worker connections are open (-1: any), for up to 5 s. */
static char *scrape_settled(double total, int conns, struct expo *e)
{
    char *text = NULL;

    for (int i = 0; i < 250; i++) {
        free(text);
        text = scrape();
        parse_expo(text, e);
        if ((total < 0 || answers(e) == total) &&
            (conns < 0 || val(e, "sluice_connections", NULL) == conns))
            return text;
        expo_free(e);
        usleep(20000);
    }
    parse_expo(text, e);
    cr_assert_fail("metrics did not settle: %.0f answers of %.0f, %.0f connections\n"
                   "%d format problems:\n%s\n%s", answers(e), total,
                   val(e, "sluice_connections", NULL), e->n_err, e->err, text);
    return text;
}

static void send_req(const char *method, const char *target, const char *headers,
                     const char *body, int status, const char *outcome)
{
    struct h_resp r;
    char *o;

    cr_assert_eq(h_http(sl.port, method, target, headers, body, body ? strlen(body) : 0, &r),
                 0, "%s %s: no answer", method, target);
    o = h_header(&r, "Sluice-Outcome");
    cr_expect_eq(r.status, status, "%s %s: status %d, want %d: %s", method, target,
                 r.status, status, r.body);
    cr_expect(o && !strcmp(o, outcome), "%s %s: outcome %s, want %s", method, target,
              o ? o : "(none)", outcome);
    free(o);
    h_resp_free(&r);
}

static int connect_port(int port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_geq(fd, 0);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

/* Fills limits.max_connections with idle connections, then one more is
 * closed at once: sluice_connections_refused_total. */
static void refuse_one_connection(void)
{
    int fds[MAX_CONNS], extra;
    struct expo e;
    char buf[64];
    struct pollfd p;

    /* The connections of earlier requests are gone first, so that the
     * MAX_CONNS counted are these. */
    free(scrape_settled(-1, 0, &e));
    expo_free(&e);
    for (int i = 0; i < MAX_CONNS; i++)
        fds[i] = connect_port(sl.port);
    free(scrape_settled(-1, MAX_CONNS, &e));
    expo_free(&e);
    extra = connect_port(sl.port);
    p = (struct pollfd){extra, POLLIN, 0};
    cr_expect_eq(poll(&p, 1, 5000), 1, "the connection over the limit was not closed");
    cr_expect_leq(recv(extra, buf, sizeof buf, MSG_DONTWAIT), 0);
    close(extra);
    for (int i = 0; i < MAX_CONNS; i++)
        close(fds[i]);
}

static int post_reload(void)
{
    struct h_resp r;
    int status;

    cr_assert_eq(h_http(sl.admin_port, "POST", "/reload", NULL, "", 0, &r), 0);
    status = r.status;
    h_resp_free(&r);
    return status;
}

/* A reload of the running file (ok), then of a broken one (error); the
 * file is put back. */
static void reload_twice(void)
{
    char *orig = tu_read_file(sl.cfg_path, NULL), *path;

    cr_assert_not_null(orig);
    cr_expect_eq(post_reload(), 200, "reload of the running config");
    free(tu_write_file(sl.dir, "sidecar.yaml", "routes: 5\n"));
    cr_expect_eq(post_reload(), 400, "reload of a broken config");
    path = tu_write_file(sl.dir, "sidecar.yaml", orig);
    cr_assert_str_eq(path, sl.cfg_path);
    free(path);
    free(orig);
}

/* Traffic that makes every family speak: TOTAL_ANSWERS answers, one
 * refused connection, two reloads. */
#define TOTAL_ANSWERS 13

static void drive_all(void)
{
    char h[128];

    /* sync: 3 ok (one keyed), a replay, a requeue and a dead letter. */
    snprintf(h, sizeof h, "Sluice-Enqueued-At: %ld\r\n", (long)time(NULL) - 100);
    send_req("POST", "/v1/sync/1", h, "a", 200, "ok");
    send_req("POST", "/v1/sync/2", "Sluice-Enqueued-At: yesterday\r\n", "b", 200, "ok");
    send_req("POST", "/v1/sync/3", "Idempotency-Key: metrics-k1\r\n", "c", 200, "ok");
    send_req("POST", "/v1/sync/3", "Idempotency-Key: metrics-k1\r\n", "c", 200, "replayed");
    send_req("POST", "/v1/sync/4", "X-Stub-Status: 503\r\n", "d", 503, "requeue");
    send_req("POST", "/v1/sync/5", "X-Stub-Status: 503\r\nSluice-Attempt: 3\r\n", "e", 503,
             "dead_letter");
    /* paced: the bucket holds one permit a minute. */
    send_req("POST", "/v1/paced", NULL, "f", 200, "ok");
    send_req("POST", "/v1/paced", NULL, "g", 429, "requeue");
    /* cool: a 429 with Retry-After pauses the policy for 10 minutes. */
    send_req("POST", "/v1/cool", "X-Stub-Status: 429\r\nX-Stub-Retry-After: 600\r\n", "h", 429,
             "requeue");
    send_req("POST", "/v1/cool", NULL, "i", 429, "requeue");
    /* gone: nothing listens on its upstream. */
    send_req("POST", "/v1/gone", NULL, "j", 503, "requeue");
    send_req("GET", "/v1/weird/x", NULL, NULL, 200, "ok");
    send_req("GET", "/nowhere", NULL, NULL, 404, "rejected");
    refuse_one_connection();
    reload_twice();
}

/* The series of `name` with exactly these labels has the value `want` (-1:
 * absent, as a counter at zero is). */
#define expect_val(e, want, ...)                                                   \
    do {                                                                           \
        double got_ = val(e, __VA_ARGS__, NULL);                                   \
        cr_expect_eq(got_, (double)(want), "%s: %g, want %g", #__VA_ARGS__, got_,  \
                     (double)(want));                                              \
    } while (0)

static const struct {
    const char *name, *type;
    bool spec;  /* listed in docs/contract.md §8 */
} known[] = {
    {"sluice_requests_total", "counter", true},
    {"sluice_upstream_responses_total", "counter", true},
    {"sluice_request_duration_seconds", "histogram", true},
    {"sluice_permit_wait_seconds", "histogram", true},
    {"sluice_upstream_duration_seconds", "histogram", true},
    {"sluice_queue_age_seconds", "histogram", true},
    {"sluice_requeue_delay_seconds", "histogram", true},
    {"sluice_bucket_tokens", "gauge", true},
    {"sluice_inflight", "gauge", true},
    {"sluice_cooldown_seconds", "gauge", true},
    {"sluice_leases_active", "gauge", true},
    {"sluice_store_records", "gauge", true},
    {"sluice_config_reloads_total", "counter", true},
    {"sluice_store_up", "gauge", true},         /* §10 */
    {"sluice_store_duration_seconds", "histogram", true}, /* §10 */
    {"sluice_bucket_fallback", "gauge", true},  /* §10: shared policies only */
    {"sluice_store_replication_timeouts_total", "counter", true}, /* §10 */
    {"sluice_verifications_total", "counter", true}, /* §11 */
    {"sluice_queue_age_invalid_total", "counter", false},
    {"sluice_store_errors_total", "counter", false},
    {"sluice_store_commit_failures_total", "counter", false}, /* §10 */
    {"sluice_connections_refused_total", "counter", false},
    {"sluice_store_notifications_total", "counter", false},
    {"sluice_accept_paused_total", "counter", false},
    {"sluice_connections", "gauge", false},
    {"sluice_ready", "gauge", false},
    {"sluice_build_info", "gauge", false},
    {"sluice_bucket_rate", "gauge", false},
    {"sluice_policy_rate", "gauge", true},
    {"sluice_bucket_burst", "gauge", false},
    {"sluice_config_last_reload_successful", "gauge", false},
    {"sluice_config_last_reload_success_timestamp_seconds", "gauge", false},
    {"sluice_upstream_connections_open", "gauge", false},
    {"sluice_upstream_connections_idle", "gauge", false},
    {"sluice_upstream_connect_duration_seconds", "histogram", false},
    {"sluice_upstream_tls_handshake_duration_seconds", "histogram", false},
    {"sluice_upstream_connect_failures_total", "counter", false},
    /* the Prometheus client libraries' process families */
    {"process_cpu_seconds_total", "counter", false},
    {"process_resident_memory_bytes", "gauge", false},
    {"process_virtual_memory_bytes", "gauge", false},
    {"process_open_fds", "gauge", false},
    {"process_max_fds", "gauge", false},
    {"process_start_time_seconds", "gauge", false},
};

static void check_families(const struct expo *e)
{
    for (size_t i = 0; i < sizeof known / sizeof *known; i++) {
        const struct family *f = family_of((struct expo *)e, known[i].name);

        cr_expect(f && f->type, "no TYPE line for %s", known[i].name);
        if (f && f->type)
            cr_expect_str_eq(f->type, known[i].type, "%s", known[i].name);
        cr_expect(f && f->help, "no HELP line for %s", known[i].name);
    }
    /* Nothing else, and every family has a TYPE. */
    for (size_t i = 0; i < e->nf; i++) {
        bool found = false;

        for (size_t k = 0; k < sizeof known / sizeof *known; k++)
            found |= !strcmp(e->f[i].name, known[k].name);
        cr_expect(found, "unexpected family %s", e->f[i].name);
        cr_expect(e->f[i].type != NULL, "family %s has no TYPE", e->f[i].name);
        if (e->f[i].type && !strcmp(e->f[i].type, "counter"))
            cr_expect(strlen(e->f[i].name) > 6 &&
                          !strcmp(e->f[i].name + strlen(e->f[i].name) - 6, "_total"),
                      "counter %s does not end in _total", e->f[i].name);
    }
}

/* A sample's labels but le, as text: the key of its histogram series. */
static void base_key(const struct sample *s, char *out, size_t len)
{
    size_t used = 0;

    out[0] = '\0';
    for (int i = 0; i < s->nl && used < len; i++)
        if (strcmp(s->l[i].name, "le"))
            used += (size_t)snprintf(out + used, len - used, "%s=%s,", s->l[i].name,
                                     s->l[i].value);
}

static const struct sample *find_part(const struct expo *e, const char *family,
                                      const char *suffix, const char *key)
{
    char name[128], k[512];

    snprintf(name, sizeof name, "%s%s", family, suffix);
    for (size_t i = 0; i < e->n; i++) {
        if (strcmp(e->s[i].name, name))
            continue;
        base_key(&e->s[i], k, sizeof k);
        if (!strcmp(k, key))
            return &e->s[i];
    }
    return NULL;
}

/* Buckets cumulative and in order, ending in +Inf == _count, _sum there. */
static void check_histograms(const struct expo *e)
{
    for (size_t fi = 0; fi < e->nf; fi++) {
        const struct family *f = &e->f[fi];
        char bucket[128], key[512], prev_key[512] = "";
        double prev_le = -INFINITY, prev_v = 0;
        size_t series = 0;

        if (!f->type || strcmp(f->type, "histogram"))
            continue;
        snprintf(bucket, sizeof bucket, "%s_bucket", f->name);
        for (size_t i = 0; i <= e->n; i++) {
            const struct sample *s = i < e->n ? &e->s[i] : NULL;
            const char *le;
            double lev;

            if (s && strcmp(s->name, bucket))
                continue;
            if (s)
                base_key(s, key, sizeof key);
            if (prev_key[0] && (!s || strcmp(key, prev_key))) {
                /* The series before this one is complete. */
                const struct sample *cnt = find_part(e, f->name, "_count", prev_key);
                const struct sample *sum = find_part(e, f->name, "_sum", prev_key);

                cr_expect(isinf(prev_le) && prev_le > 0, "%s{%s}: last bucket is not +Inf",
                          f->name, prev_key);
                cr_expect(cnt && cnt->v == prev_v, "%s{%s}: _count %g, +Inf bucket %g",
                          f->name, prev_key, cnt ? cnt->v : -1, prev_v);
                cr_expect(sum && sum->v >= 0, "%s{%s}: no _sum", f->name, prev_key);
                series++;
                prev_le = -INFINITY;
                prev_v = 0;
            }
            if (!s)
                break;
            snprintf(prev_key, sizeof prev_key, "%s", key);
            le = label(s, "le");
            cr_expect(le != NULL, "line %d: a bucket without le", s->line);
            if (!le)
                continue;
            lev = !strcmp(le, "+Inf") ? INFINITY : strtod(le, NULL);
            cr_expect_gt(lev, prev_le, "line %d: le %s not after %g", s->line, le, prev_le);
            cr_expect_geq(s->v, prev_v, "line %d: bucket %g below the one before (%g)",
                          s->line, s->v, prev_v);
            prev_le = lev;
            prev_v = s->v;
        }
        /* Every _count and _sum belongs to a bucket series. */
        for (size_t i = 0; i < e->n; i++) {
            size_t n = strlen(f->name);

            if (strncmp(e->s[i].name, f->name, n) ||
                (strcmp(e->s[i].name + n, "_count") && strcmp(e->s[i].name + n, "_sum")))
                continue;
            base_key(&e->s[i], key, sizeof key);
            cr_expect(find_part(e, f->name, "_bucket", key), "line %d: %s without buckets",
                      e->s[i].line, e->s[i].name);
        }
        /* drive_all observed every histogram (but TLS: its upstreams are
         * plain; tests/integration/test_upstream.c times a handshake). */
        if (strcmp(f->name, "sluice_upstream_tls_handshake_duration_seconds"))
            cr_expect_gt(series, 0, "histogram %s has no series", f->name);
    }
}

/* Every counter is what the traffic of drive_all adds up to. */
static void check_counters(const struct expo *e)
{
    const char *R = "sluice_requests_total", *U = "sluice_upstream_responses_total";

    expect_val(e, 3, R, "route", "sync", "outcome", "ok", "reason", "none");
    expect_val(e, 1, R, "route", "sync", "outcome", "replayed", "reason", "none");
    expect_val(e, 1, R, "route", "sync", "outcome", "requeue", "reason", "upstream_5xx");
    expect_val(e, 1, R, "route", "sync", "outcome", "dead_letter", "reason", "upstream_5xx");
    expect_val(e, 1, R, "route", "paced", "outcome", "ok", "reason", "none");
    expect_val(e, 1, R, "route", "paced", "outcome", "requeue", "reason", "rate_limited");
    expect_val(e, 1, R, "route", "cool", "outcome", "requeue", "reason", "upstream_429");
    expect_val(e, 1, R, "route", "cool", "outcome", "requeue", "reason", "upstream_cooldown");
    expect_val(e, 1, R, "route", "gone", "outcome", "requeue", "reason", "connect_error");
    expect_val(e, 1, R, "route", WEIRD_ROUTE, "outcome", "ok", "reason", "none");
    expect_val(e, 1, R, "route", "none", "outcome", "rejected", "reason", "no_route");
    /* Nothing else was counted. */
    cr_expect_eq(answers(e), TOTAL_ANSWERS);
    /* Label sets sluice can count are listed at zero, so increase() sees
     * their first event; pairs it never answers with are not. */
    expect_val(e, 0, R, "route", "sync", "outcome", "dead_letter", "reason", "delay_exceeds_max");
    expect_val(e, 0, R, "route", "paced", "outcome", "requeue", "reason", "lease_held");
    expect_val(e, 0, R, "route", "gone", "outcome", "abandoned", "reason", "client_closed");
    expect_val(e, 0, R, "route", "none", "outcome", "rejected", "reason", "malformed_request");
    expect_val(e, -1, R, "route", "none", "outcome", "ok", "reason", "none");
    expect_val(e, -1, R, "route", "sync", "outcome", "rejected", "reason", "no_route");
    expect_val(e, -1, R, "route", "sync", "outcome", "ok", "reason", "upstream_429");
    expect_val(e, -1, R, "route", "sync", "outcome", "requeue", "reason", "rate_limited",
               "shadow", "true");
    expect_val(e, 0, U, "upstream", "dead", "code", "2xx");
    expect_val(e, 0, U, "upstream", "stub", "code", "timeout");
    {
        int zeros = 0;
        for (size_t i = 0; i < e->n; i++)
            zeros += !strcmp(e->s[i].name, R) && e->s[i].v == 0;
        /* 5 routes x 28 pairs + 7 of route="none", less the 11 counted. */
        cr_expect_eq(zeros, 5 * 28 + 7 - 11, "%d zero series of %s", zeros, R);
    }

    expect_val(e, 5, U, "upstream", "stub", "code", "2xx");
    expect_val(e, 2, U, "upstream", "stub", "code", "5xx");
    expect_val(e, 1, U, "upstream", "stub", "code", "429");
    expect_val(e, 1, U, "upstream", "dead", "code", "connect_error");

    expect_val(e, 1, "sluice_queue_age_invalid_total", "route", "sync");
    expect_val(e, 0, "sluice_queue_age_invalid_total", "route", "paced");
    expect_val(e, 1, "sluice_connections_refused_total");
    /* Label-less counters are listed at zero too, so increase() sees the first. */
    expect_val(e, 0, "sluice_store_errors_total");
    expect_val(e, 0, "sluice_store_replication_timeouts_total");
    /* Listed at zero for the policy that verifies, absent for the others. */
    expect_val(e, 0, "sluice_verifications_total", "policy", "open", "result", "found");
    expect_val(e, 0, "sluice_verifications_total", "policy", "open", "result", "absent");
    expect_val(e, 0, "sluice_verifications_total", "policy", "open", "result", "failed");
    expect_val(e, -1, "sluice_verifications_total", "policy", "slow", "result", "found");
    expect_val(e, 1, "sluice_config_reloads_total", "result", "ok");
    expect_val(e, 1, "sluice_config_reloads_total", "result", "error");
}

static void check_histogram_values(const struct expo *e)
{
    const char *D = "sluice_request_duration_seconds_count";
    const char *Q = "sluice_queue_age_seconds";
    double age;

    /* By route and outcome: a replay's or a refusal's microseconds do not
     * hide among forwarded calls. */
    expect_val(e, 3, D, "route", "sync", "outcome", "ok");
    expect_val(e, 1, D, "route", "sync", "outcome", "replayed");
    expect_val(e, 1, D, "route", "sync", "outcome", "requeue");
    expect_val(e, 1, D, "route", "sync", "outcome", "dead_letter");
    expect_val(e, -1, D, "route", "sync", "outcome", "rejected");
    expect_val(e, 1, D, "route", "paced", "outcome", "ok");
    expect_val(e, 1, D, "route", "paced", "outcome", "requeue");
    expect_val(e, 2, D, "route", "cool", "outcome", "requeue");
    expect_val(e, 1, D, "route", "gone", "outcome", "requeue");
    expect_val(e, 1, D, "route", WEIRD_ROUTE, "outcome", "ok");
    expect_val(e, 1, D, "route", "none", "outcome", "rejected");
    /* Connections: the stub's were timed, the dead upstream's failed. */
    cr_expect_geq(val(e, "sluice_upstream_connect_duration_seconds_count", "upstream", "stub",
                      NULL), 1);
    expect_val(e, -1, "sluice_upstream_connect_duration_seconds_count", "upstream", "dead");
    expect_val(e, 1, "sluice_upstream_connect_failures_total", "upstream", "dead", "phase",
               "connect");
    expect_val(e, 0, "sluice_upstream_connect_failures_total", "upstream", "dead", "phase",
               "tls");
    expect_val(e, 0, "sluice_upstream_connect_failures_total", "upstream", "stub", "phase",
               "connect");
    /* The 8 answers the stub gave (the replay and the refusals did not go). */
    expect_val(e, 8, "sluice_upstream_duration_seconds_count", "upstream", "stub");
    /* Forwarded requests waited for a permit: 5 of sync, 1 of paced, 1 of cool. */
    expect_val(e, 5, "sluice_permit_wait_seconds_count", "policy", "open", "lane", "");
    expect_val(e, 1, "sluice_permit_wait_seconds_count", "policy", "slow", "lane", "");
    expect_val(e, 1, "sluice_permit_wait_seconds_count", "policy", "cool", "lane", "");
    /* One job 100 s old: in the bucket up to 300 s, not the one up to 60. */
    expect_val(e, 1, "sluice_queue_age_seconds_count", "route", "sync");
    expect_val(e, 0, "sluice_queue_age_seconds_bucket", "route", "sync", "le", "60");
    expect_val(e, 1, "sluice_queue_age_seconds_bucket", "route", "sync", "le", "300");
    age = val(e, "sluice_queue_age_seconds_sum", "route", "sync", NULL);
    cr_expect(age >= 99 && age < 110, "%s_sum %g, want about 100", Q, age);
    /* Requeue delays: one a reason, the dead letter has none. */
    expect_val(e, 1, "sluice_requeue_delay_seconds_count", "policy", "open", "reason",
               "upstream_5xx");
    expect_val(e, -1, "sluice_requeue_delay_seconds_count", "policy", "open", "reason",
               "delay_exceeds_max");
    expect_val(e, 1, "sluice_requeue_delay_seconds_count", "policy", "slow", "reason",
               "rate_limited");
    /* A minute until the next permit of 1/m. */
    expect_val(e, 1, "sluice_requeue_delay_seconds_bucket", "policy", "slow", "reason",
               "rate_limited", "le", "60");
    expect_val(e, 0, "sluice_requeue_delay_seconds_bucket", "policy", "slow", "reason",
               "rate_limited", "le", "30");
    /* Retry-After: 600 plus jitter. */
    expect_val(e, 0, "sluice_requeue_delay_seconds_bucket", "policy", "cool", "reason",
               "upstream_429", "le", "300");
    expect_val(e, 1, "sluice_requeue_delay_seconds_bucket", "policy", "cool", "reason",
               "upstream_429", "le", "900");
    expect_val(e, 1, "sluice_requeue_delay_seconds_count", "policy", "cool", "reason",
               "upstream_cooldown");
    expect_val(e, 1, "sluice_requeue_delay_seconds_count", "policy", "default", "reason",
               "connect_error");
}

static void check_gauges(const struct expo *e)
{
    double cd = val(e, "sluice_cooldown_seconds", "policy", "cool", NULL);

    /* Buckets exist for policies with a rate; both are empty now. */
    expect_val(e, 0, "sluice_bucket_tokens", "policy", "slow");
    expect_val(e, 0, "sluice_bucket_tokens", "policy", "cool");
    expect_val(e, -1, "sluice_bucket_tokens", "policy", "open");
    expect_val(e, 0, "sluice_inflight", "policy", "open");
    expect_val(e, 0, "sluice_inflight", "policy", "slow");
    expect_val(e, 0, "sluice_inflight", "policy", "cool");
    expect_val(e, 0, "sluice_inflight", "policy", "default");
    cr_expect(cd > 500 && cd <= 700, "sluice_cooldown_seconds{policy=\"cool\"} %g", cd);
    expect_val(e, 0, "sluice_cooldown_seconds", "policy", "slow");
    expect_val(e, 0, "sluice_leases_active");
    cr_expect_geq(val(e, "sluice_store_records", NULL), 0);
    expect_val(e, 0, "sluice_connections");
    expect_val(e, 1, "sluice_ready");
    /* The configured numbers beside the tokens (slow: 1/m, burst 1). */
    cr_expect(fabs(val(e, "sluice_bucket_rate", "policy", "slow", NULL) - 1.0 / 60) < 1e-9);
    expect_val(e, 1, "sluice_bucket_burst", "policy", "slow");
    expect_val(e, -1, "sluice_bucket_rate", "policy", "open");
    /* Pools: idle ones are open ones; the dead upstream has none. */
    cr_expect_geq(val(e, "sluice_upstream_connections_open", "upstream", "stub", NULL),
                  val(e, "sluice_upstream_connections_idle", "upstream", "stub", NULL));
    cr_expect_geq(val(e, "sluice_upstream_connections_idle", "upstream", "stub", NULL), 0);
    expect_val(e, 0, "sluice_upstream_connections_open", "upstream", "dead");
    expect_val(e, 0, "sluice_upstream_connections_idle", "upstream", "dead");
    /* reload_twice ended on a refused file, after one that took. */
    expect_val(e, 0, "sluice_config_last_reload_successful");
    cr_expect(fabs(val(e, "sluice_config_last_reload_success_timestamp_seconds", NULL) -
                   (double)time(NULL)) < 60);
}

/* sluice_build_info names the build `sluice --version` describes. */
static void check_build_info(const struct expo *e)
{
    char *out = NULL, *path, version[64] = "", revision[128] = "";
    const struct sample *bi = NULL;
    FILE *f;

    for (size_t i = 0; i < e->n; i++)
        if (!strcmp(e->s[i].name, "sluice_build_info"))
            bi = &e->s[i];
    cr_assert_not_null(bi, "no sluice_build_info");
    cr_expect_eq(bi->v, 1);
    cr_expect_eq(bi->nl, 2, "labels: version and revision");
    cr_assert(asprintf(&path, "%s/version.txt", sl.dir) > 0);
    cr_assert_eq(h_sh("%s --version > %s", getenv("SLUICE_BIN") ?: SLUICE_BUILD_DIR "/sluice",
                      path), 0);
    out = tu_read_file(path, NULL);
    cr_assert_not_null(out);
    f = fmemopen(out, strlen(out), "r");
    cr_assert_not_null(f);
    cr_expect_eq(fscanf(f, "sluice %63s\nrevision: %127s", version, revision), 2, "%s", out);
    fclose(f);
    cr_expect_str_eq(label(bi, "version") ?: "", version);
    cr_expect_str_eq(label(bi, "revision") ?: "", revision);
    free(out);
    free(path);
}

/* The process families describe this sluice: started moments ago, holding
 * a few descriptors (listeners, the store, connections). */
static void check_process(const struct expo *e)
{
    double start = val(e, "process_start_time_seconds", NULL), now = (double)time(NULL);

    cr_expect(start > now - 300 && start <= now + 1, "start %f, now %f", start, now);
    cr_expect_gt(val(e, "process_cpu_seconds_total", NULL), 0);
    cr_expect_gt(val(e, "process_resident_memory_bytes", NULL), 1 << 20);
    cr_expect_gt(val(e, "process_open_fds", NULL), 5);
    cr_expect_gt(val(e, "process_max_fds", NULL), val(e, "process_open_fds", NULL));
}

Test(metrics, exposition_after_traffic)
{
    struct expo e;
    char *text;

    drive_all();
    text = scrape_settled(TOTAL_ANSWERS, 0, &e);
    cr_expect_eq(e.n_err, 0, "%d format problems:\n%s", e.n_err, e.err);
    check_families(&e);
    check_histograms(&e);
    check_counters(&e);
    check_histogram_values(&e);
    check_gauges(&e);
    check_build_info(&e);
    check_process(&e);
    expo_free(&e);
    free(text);
}

/* ---- label discipline --------------------------------------------------- */

static const char *const allowed_routes[] = {"sync", "paced", "cool", "gone", WEIRD_ROUTE,
                                             "none", NULL};
static const char *const allowed_policies[] = {"open", "slow", "cool", "default", NULL};
static const char *const allowed_upstreams[] = {"stub", "dead", NULL};
static const char *const allowed_outcomes[] = {"ok", "permanent_error", "replayed", "requeue",
                                               "dead_letter", "rejected", "abandoned", NULL};
static const char *const allowed_reasons[] = {
    "none", "no_route", "body_too_large", "headers_too_large", "malformed_request",
    "key_reused", "upstream_429", "upstream_5xx", "connect_error", "connection_lost", "timeout",
    "rate_limited", "upstream_cooldown", "lease_held", "store_unavailable",
    "delay_exceeds_max", "client_closed", "internal_error", NULL};
static const char *const allowed_codes[] = {"2xx", "3xx", "4xx", "429", "5xx", "connect_error",
                                            "connection_lost", "timeout", NULL};
/* sluice_config_reloads_total's, then sluice_verifications_total's. */
static const char *const allowed_results[] = {"ok", "error", "found", "absent", "failed",
                                              NULL};
static const char *const allowed_shadow[] = {"true", NULL};
/* The metrics config has no lanes: every policy's wait is lane="". */
static const char *const allowed_lanes[] = {"", NULL};
static const char *const allowed_ops[] = {"get", "acquire", "complete", "release", "permit",
                                          "slot", NULL};

static const char *const allowed_phases[] = {"connect", "proxy", "tls", NULL};

static const struct {
    const char *name;
    const char *const *values;
} allowed_labels[] = {
    {"route", allowed_routes},       {"policy", allowed_policies},
    {"upstream", allowed_upstreams}, {"outcome", allowed_outcomes},
    {"reason", allowed_reasons},     {"code", allowed_codes},
    {"result", allowed_results},     {"shadow", allowed_shadow},
    {"op", allowed_ops},             {"phase", allowed_phases},
    {"lane", allowed_lanes},
};

static bool in_set(const char *const *set, const char *v)
{
    for (; *set; set++)
        if (!strcmp(*set, v))
            return true;
    return false;
}

static void check_label_values(const struct expo *e)
{
    for (size_t i = 0; i < e->n; i++)
        for (int j = 0; j < e->s[i].nl; j++) {
            /* The build's facts: fixed at build time (check_build_info). */
            if (!strcmp(e->s[i].name, "sluice_build_info"))
                continue;
            const struct label *l = &e->s[i].l[j];
            bool known_name = false;
            char *end;

            if (!strcmp(l->name, "le")) {
                if (strcmp(l->value, "+Inf")) {
                    strtod(l->value, &end);
                    cr_expect(*l->value && !*end, "line %d: le=\"%s\"", e->s[i].line,
                              l->value);
                }
                continue;
            }
            for (size_t k = 0; k < sizeof allowed_labels / sizeof *allowed_labels; k++) {
                if (strcmp(allowed_labels[k].name, l->name))
                    continue;
                known_name = true;
                cr_expect(in_set(allowed_labels[k].values, l->value),
                          "line %d: %s=\"%s\" is not a config name or a fixed value",
                          e->s[i].line, l->name, l->value);
            }
            cr_expect(known_name, "line %d: unexpected label %s", e->s[i].line, l->name);
        }
}

static void send_any(const char *method, const char *target, const char *headers,
                     const char *body)
{
    struct h_resp r;

    cr_assert_eq(h_http(sl.port, method, target, headers, body, body ? strlen(body) : 0, &r),
                 0, "%s %s: no answer", method, target);
    cr_expect(r.status >= 200 && r.status < 600, "%s %s: %d", method, target, r.status);
    h_resp_free(&r);
}

Test(metrics, labels_hold_no_request_data)
{
    char key[64], hdrs[512], *text;
    const char *needles[] = {
        /* "alert(1)", not "script": process_open_fds's standard HELP says
         * "descriptors". */
        "12345", "alert(1)", "67890", key, "evil-host", "tenant-zzq", "agent-yyq",
        "route-qqz", "secret-abc", "quoted", "BREW", "syncpot", "77777", "1e400",
        "with spaces", "/v1/", "zz-body",
    };
    struct expo e;
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(key, sizeof key, "job-%lx-%lx", (unsigned long)ts.tv_sec,
             (unsigned long)ts.tv_nsec ^ (unsigned long)getpid());
    snprintf(hdrs, sizeof hdrs,
             "Idempotency-Key: %s\r\nX-Tenant: tenant-zzq\r\nUser-Agent: agent-yyq\r\n"
             "Sluice-Enqueued-At: 1e400\r\nSluice-Attempt: 77777\r\n", key);
    send_req("POST", "/v1/sync/12345?x=<script>alert(1)</script>", NULL, "zz-body", 200, "ok");
    send_req("POST", "/v1/sync/67890", hdrs, "zz-body", 200, "ok");
    send_req("GET", "/no/such/route-qqz?token=secret-abc", NULL, NULL, 404, "rejected");
    send_req("GET", "/v1/weird/%22%5C%0A?q=%22quoted%22", NULL, NULL, 200, "ok");
    send_req("GET", "/v1/syncpot", NULL, NULL, 404, "rejected");
    send_req("POST", "/v1/sync/9", "Idempotency-Key: bad key with spaces\r\n", "zz-body", 400,
             "rejected");
    send_any("BREW", "/v1/sync/coffee", "Host: evil-host.example\r\n", NULL);

    /* 7 answers: sluice forwards BREW (the stub refuses it). */
    text = scrape_settled(7, 0, &e);
    cr_expect_eq(e.n_err, 0, "%s", e.err);
    check_label_values(&e);
    for (size_t i = 0; i < e.n; i++)
        for (int j = 0; j < e.s[i].nl; j++)
            for (size_t k = 0; k < sizeof needles / sizeof *needles; k++)
                cr_expect(!strstr(e.s[i].l[j].value, needles[k]),
                          "line %d: label %s=\"%s\" holds request data \"%s\"", e.s[i].line,
                          e.s[i].l[j].name, e.s[i].l[j].value, needles[k]);
    /* Not anywhere else either (HELP text is fixed). */
    for (size_t k = 0; k < sizeof needles / sizeof *needles; k++)
        if (isalpha((unsigned char)needles[k][0]))
            cr_expect(!strstr(text, needles[k]), "/metrics holds \"%s\"", needles[k]);
    /* Requests that matched no route are route="none". */
    expect_val(&e, 2, "sluice_requests_total", "route", "none", "outcome", "rejected",
               "reason", "no_route");
    expect_val(&e, 2, "sluice_requests_total", "route", "sync", "outcome", "ok", "reason",
               "none");
    expect_val(&e, 1, "sluice_requests_total", "route", "sync", "outcome", "rejected",
               "reason", "malformed_request");
    expect_val(&e, 1, "sluice_requests_total", "route", WEIRD_ROUTE, "outcome", "ok", "reason",
               "none");
    expect_val(&e, 1, "sluice_queue_age_invalid_total", "route", "sync");
    expo_free(&e);
    free(text);
}

/* ---- the dashboard and the rules against the live families -------------- */

struct names {
    char *v[256];
    size_t n;
};

static void names_add(struct names *ns, const char *s, size_t len)
{
    for (size_t i = 0; i < ns->n; i++)
        if (strlen(ns->v[i]) == len && !strncmp(ns->v[i], s, len))
            return;
    cr_assert_lt(ns->n, 256);
    ns->v[ns->n++] = strndup(s, len);
}

static void names_free(struct names *ns)
{
    for (size_t i = 0; i < ns->n; i++)
        free(ns->v[i]);
    ns->n = 0;
}

static bool ident_char(char c)
{
    return isalnum((unsigned char)c) || c == '_';
}

/* Every sluice_[a-z0-9_]+ token of a query. Recording-rule names
 * (level:metric:operations, e.g. route:sluice_requests:rate5m) are not
 * metric names and are skipped. */
static void scan_names(const char *text, struct names *ns)
{
    for (const char *p = text; (p = strstr(p, "sluice_")); p++) {
        size_t n = 0;

        if (p > text && (ident_char(p[-1]) || p[-1] == ':'))
            continue;
        while (islower((unsigned char)p[n]) || isdigit((unsigned char)p[n]) || p[n] == '_')
            n++;
        names_add(ns, p, n);
    }
}

/* A name a query may use: a family with a TYPE line in the live output, or
 * a histogram family's _bucket, _sum or _count. */
static bool live_name(struct expo *e, const char *name)
{
    static const char *const sfx[] = {"_bucket", "_sum", "_count"};
    const struct family *f = family_of(e, name);
    size_t n = strlen(name);

    if (f && f->type)
        return true;
    for (size_t i = 0; i < 3; i++) {
        size_t sl_ = strlen(sfx[i]);
        char base[128];

        if (n <= sl_ || strcmp(name + n - sl_, sfx[i]) || n - sl_ >= sizeof base)
            continue;
        memcpy(base, name, n - sl_);
        base[n - sl_] = '\0';
        f = family_of(e, base);
        if (f && f->type && !strcmp(f->type, "histogram"))
            return true;
    }
    return false;
}

static char *replace_all(const char *s, const char *from, const char *to)
{
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    const char *p;

    while ((p = strstr(s, from))) {
        fwrite(s, 1, (size_t)(p - s), f);
        fputs(to, f);
        s = p + strlen(from);
    }
    fputs(s, f);
    fclose(f);
    return out;
}

/* Collects the queries of a dashboard: every string under "expr", and the
 * template variables' "query" / "definition". */
static void collect_queries(json_t *j, const char *key, struct names *exprs)
{
    const char *k;
    json_t *v;
    size_t i;

    if (json_is_object(j)) {
        json_object_foreach(j, k, v) collect_queries(v, k, exprs);
    } else if (json_is_array(j)) {
        json_array_foreach(j, i, v) collect_queries(v, key, exprs);
    } else if (json_is_string(j) && key &&
               (!strcmp(key, "expr") || !strcmp(key, "query") || !strcmp(key, "definition"))) {
        const char *s = json_string_value(j);
        if (strstr(s, "sluice_"))
            names_add(exprs, s, strlen(s));
    }
}

/* Whether every metric selector of expr (each "sluice_<name>") carries the
 * job, namespace and pod variables, so that no panel shows every sidecar
 * whatever the dashboard's choice. */
static bool scoped_to_pods(const char *expr)
{
    static const char *const need[] = {
        "job=~\"$job\"", "namespace=~\"$namespace\"", "pod=~\"$pod\"",
    };
    const char *p = expr;

    while ((p = strstr(p, "sluice_"))) {
        const char *close;

        p += strcspn(p, "{[() ,");
        if (*p != '{' || !(close = strchr(p, '}')))
            return false;
        for (size_t i = 0; i < sizeof need / sizeof *need; i++) {
            const char *hit = strstr(p, need[i]);
            if (!hit || hit > close)
                return false;
        }
        p = close;
    }
    return true;
}

static void need_promtool(void)
{
    cr_assert_eq(h_sh("command -v promtool >/dev/null 2>&1"), 0,
                 "promtool not found: it ships in Debian's prometheus package, "
                 "which scripts/deps.sh installs (apt-get install prometheus)");
}

/* Runs promtool with args; fails the test with its output unless it exits
 * 0 (and, when quiet, prints nothing). */
static void promtool(bool quiet, const char *args)
{
    char *out, *text;
    int rc;

    need_promtool();
    cr_assert(asprintf(&out, "%s/promtool.out", sl.dir) > 0);
    rc = h_sh("promtool %s > %s 2>&1", args, out);
    text = tu_read_file(out, NULL);
    cr_expect_eq(rc, 0, "promtool %s: exit %d\n%s", args, rc, text ? text : "");
    if (quiet)
        cr_expect(!text || !*text, "promtool %s complains:\n%s", args, text);
    free(text);
    free(out);
}

static void live_families(struct expo *e)
{
    char *text;

    drive_all();
    text = scrape_settled(TOTAL_ANSWERS, 0, e);
    free(text);
}

Test(metrics, dashboard_queries_live_families)
{
    static const char *const panels_need[] = {
        "sluice_requests_total", "sluice_upstream_responses_total",
        "sluice_permit_wait_seconds_bucket", "sluice_upstream_duration_seconds_bucket",
        "sluice_requeue_delay_seconds_bucket", "sluice_queue_age_seconds_bucket",
        "sluice_bucket_tokens", "sluice_inflight", "sluice_cooldown_seconds",
        "sluice_leases_active", "sluice_store_records", "sluice_config_reloads_total",
        "sluice_store_errors_total",
    };
    struct names exprs = {0}, used = {0};
    json_error_t jerr;
    json_t *d = json_load_file(DASHBOARD, 0, &jerr), *v, *panel;
    struct expo e;
    bool ds = false, route = false, policy = false, job = false, ns = false, pod = false;
    size_t i, n_targets = 0;
    int ids[128] = {0};
    FILE *rf;
    char *rules_path;

    cr_assert_not_null(d, "%s:%d: %s", DASHBOARD, jerr.line, jerr.text);
    cr_expect(json_integer_value(json_object_get(d, "schemaVersion")) >= 36 &&
              json_integer_value(json_object_get(d, "schemaVersion")) <= 39);
    json_array_foreach(json_object_get(json_object_get(d, "templating"), "list"), i, v) {
        const char *name = json_string_value(json_object_get(v, "name"));
        const char *type = json_string_value(json_object_get(v, "type"));
        const char *def = json_string_value(json_object_get(v, "definition"));

        if (!name || !type)
            continue;
        if (!strcmp(name, "datasource"))
            ds = !strcmp(type, "datasource") &&
                 json_is_string(json_object_get(v, "query")) &&
                 !strcmp(json_string_value(json_object_get(v, "query")), "prometheus");
        if (!strcmp(name, "route"))
            route = !strcmp(type, "query") && def && strstr(def, "label_values(") &&
                    strstr(def, ", route)");
        if (!strcmp(name, "policy"))
            policy = !strcmp(type, "query") && def && strstr(def, "label_values(") &&
                     strstr(def, ", policy)");
        /* job, namespace and pod: from the build info every sidecar exports. */
        if (!strcmp(name, "job"))
            job = !strcmp(type, "query") && def &&
                  strstr(def, "label_values(sluice_build_info") && strstr(def, ", job)");
        if (!strcmp(name, "namespace"))
            ns = !strcmp(type, "query") && def &&
                 strstr(def, "label_values(sluice_build_info") && strstr(def, ", namespace)");
        if (!strcmp(name, "pod"))
            pod = !strcmp(type, "query") && def &&
                  strstr(def, "label_values(sluice_build_info") && strstr(def, ", pod)");
    }
    cr_expect(ds, "no datasource variable of type prometheus");
    cr_expect(route, "no route variable from label_values");
    cr_expect(policy, "no policy variable from label_values");
    cr_expect(job && ns && pod, "no job, namespace or pod variable from "
              "label_values(sluice_build_info...)");
    json_array_foreach(json_object_get(d, "panels"), i, panel) {
        json_int_t id = json_integer_value(json_object_get(panel, "id"));
        const char *type = json_string_value(json_object_get(panel, "type"));
        json_t *t;
        size_t k;

        cr_expect(id > 0 && id < 128 && !ids[id], "panel id %lld missing or repeated",
                  (long long)id);
        if (id > 0 && id < 128)
            ids[id] = 1;
        cr_expect(json_is_object(json_object_get(panel, "gridPos")));
        if (type && !strcmp(type, "row"))
            continue;
        cr_expect_str_eq(json_string_value(json_object_get(json_object_get(panel, "datasource"),
                                                           "uid")) ?: "", "${datasource}",
                         "panel %lld does not use the datasource variable", (long long)id);
        cr_expect_gt(json_array_size(json_object_get(panel, "targets")), 0,
                     "panel %lld has no query", (long long)id);
        json_array_foreach(json_object_get(panel, "targets"), k, t) {
            cr_expect(json_string_length(json_object_get(t, "expr")) > 0);
            cr_expect(scoped_to_pods(json_string_value(json_object_get(t, "expr")) ?: ""),
                      "panel %lld: a selector without job, namespace and pod: %s",
                      (long long)id, json_string_value(json_object_get(t, "expr")));
            cr_expect(json_string_length(json_object_get(t, "refId")) > 0);
            n_targets++;
        }
    }
    cr_expect_geq(n_targets, 20);
    collect_queries(d, NULL, &exprs);
    json_decref(d);

    live_families(&e);
    for (i = 0; i < exprs.n; i++)
        scan_names(exprs.v[i], &used);
    for (i = 0; i < used.n; i++)
        cr_expect(live_name(&e, used.v[i]), "the dashboard queries %s, not in /metrics",
                  used.v[i]);
    for (i = 0; i < sizeof panels_need / sizeof *panels_need; i++) {
        bool found = false;
        for (size_t k = 0; k < used.n; k++)
            found |= !strcmp(used.v[k], panels_need[i]);
        cr_expect(found, "no panel queries %s", panels_need[i]);
    }
    expo_free(&e);

    /* The queries are valid PromQL: promtool parses them as recording rules,
     * with Grafana's variables replaced. */
    cr_assert(asprintf(&rules_path, "%s/dashboard-rules.yaml", sl.dir) > 0);
    rf = fopen(rules_path, "w");
    cr_assert_not_null(rf);
    fputs("groups:\n  - name: dashboard\n    rules:\n", rf);
    for (i = 0; i < exprs.n; i++) {
        char *a = replace_all(exprs.v[i], "$__rate_interval", "5m");
        char *b = replace_all(a, "$route", ".*");
        char *c = replace_all(b, "$policy", ".*");
        char *c1 = replace_all(c, "$job", ".*");
        char *c2 = replace_all(c1, "$namespace", ".*");
        char *c3 = replace_all(c2, "$pod", ".*");
        char *q = replace_all(c3, "\n", "\n          ");

        if (strstr(q, "label_values(")) { /* a variable query, not PromQL */
            free(a), free(b), free(c), free(c1), free(c2), free(c3), free(q);
            continue;
        }
        cr_expect(!strchr(q, '$'), "a Grafana variable left in: %s", q);
        fprintf(rf, "      - record: dashboard:query_%zu\n        expr: |\n          %s\n", i, q);
        free(a), free(b), free(c), free(c1), free(c2), free(c3), free(q);
    }
    fclose(rf);
    {
        char *args;
        cr_assert(asprintf(&args, "check rules %s", rules_path) > 0);
        promtool(false, args);
        free(args);
    }
    free(rules_path);
    names_free(&exprs);
    names_free(&used);
}

/* Every alert carries runbook_url "@RUNBOOK_URL@#<alert in lower case>"
 * (render-rules.sh puts the published runbook's address there), and the
 * runbook has that section ("## SluiceDown" is #sluicedown). */
static void check_runbook_links(const char *rules)
{
    char *runbook = tu_read_file(RUNBOOK, NULL);
    const char *p;
    int n = 0;

    cr_assert_not_null(runbook, "cannot read %s", RUNBOOK);
    for (p = rules; (p = strstr(p, "- alert: ")); n++) {
        char name[64], want[160], heading[80];
        const char *next, *found;

        p += strlen("- alert: ");
        cr_assert_eq(sscanf(p, "%63[A-Za-z0-9]", name), 1);
        next = strstr(p, "- alert: ");
        snprintf(heading, sizeof heading, "\n## %s\n", name);
        for (char *c = name; *c; c++)
            *c = (char)tolower((unsigned char)*c);
        snprintf(want, sizeof want, "runbook_url: \"@RUNBOOK_URL@#%s\"", name);
        found = strstr(p, want);
        cr_expect(found && (!next || found < next), "alert %s: no %s", name, want);
        cr_expect(strstr(runbook, heading), "docs/runbook.md has no section%s", heading);
        p = next ? next : p + strlen(p);
    }
    cr_expect_geq(n, 11, "%d alerts", n);
    free(runbook);
}

Test(metrics, rules_query_live_families_and_pass_promtool)
{
    static const char *const alerts[] = {
        "SluiceOldestMessageAgeHigh", "SluiceDeadLetters", "SluiceCooldownSustained",
        "SluiceStoreErrors", "SluiceNotReady", "SluiceConfigReloadFailed",
        "SluiceRateLimitedShareHigh", "SluiceUpstream429ShareHigh", "SluiceConnectionsRefused",
        "SluiceDown", "SluiceAbsent",
    };
    char *text = tu_read_file(RULES, NULL), *p;
    struct names used = {0};
    struct expo e;
    int n_alerts = 0, n_severity = 0;

    cr_assert_not_null(text, "cannot read %s", RULES);
    check_runbook_links(text);
    for (size_t i = 0; i < sizeof alerts / sizeof *alerts; i++) {
        char want[96];
        snprintf(want, sizeof want, "- alert: %s\n", alerts[i]);
        cr_expect(strstr(text, want), "no alert %s", alerts[i]);
    }
    for (p = text; (p = strstr(p, "- alert: ")); p++)
        n_alerts++;
    for (p = text; (p = strstr(p, "severity: ")); p++)
        n_severity++;
    cr_expect_eq(n_alerts, n_severity, "%d alerts, %d severity labels", n_alerts, n_severity);
    scan_names(text, &used);
    free(text);

    live_families(&e);
    cr_expect_geq(used.n, 8);
    for (size_t i = 0; i < used.n; i++)
        cr_expect(live_name(&e, used.v[i]), "the rules query %s, not in /metrics", used.v[i]);
    expo_free(&e);
    names_free(&used);

    promtool(false, "check rules " RULES);
    /* The alerts fire (and stay quiet) on series shaped like sluice's. */
    promtool(false, "test rules " RULES_TEST);
}

/* render-rules.sh makes every runbook_url the published address plus the
 * alert's section, and the result still passes promtool; as a
 * PrometheusRule, too (its groups parse as the same rules). */
Test(metrics, rendered_rules_link_the_runbook)
{
    const char *url = "https://git.example.com/sluice/blob/main/docs/runbook.md";
    char *dir = tu_mkdtemp("rules"), *args, *text, *p;
    int alerts = 0, links = 0;

    cr_assert_eq(h_sh("sh %s/deploy/prometheus/render-rules.sh %s > %s/rules.yaml",
                      SLUICE_SOURCE_DIR, url, dir), 0);
    cr_assert(asprintf(&p, "%s/rules.yaml", dir) > 0);
    text = tu_read_file(p, NULL);
    free(p);
    cr_assert_not_null(text);
    for (p = text; (p = strstr(p, "- alert: ")); p++)
        alerts++;
    for (p = text; (p = strstr(p, "runbook_url: \"https://git.example.com/sluice/blob/main/"
                                  "docs/runbook.md#sluice")); p++)
        links++;
    cr_expect_geq(alerts, 11);
    cr_expect_eq(links, alerts, "%d alerts, %d absolute runbook links", alerts, links);
    cr_expect_null(strstr(text, "@RUNBOOK_URL@"));
    free(text);
    cr_assert(asprintf(&args, "check rules %s/rules.yaml", dir) > 0);
    promtool(false, args);
    free(args);
    cr_expect_eq(h_sh("sh %s/deploy/prometheus/render-rules.sh %s --prometheus-rule monitoring "
                      "| python3 -c 'import sys, yaml; d = yaml.safe_load(sys.stdin); "
                      "g = d[\"spec\"]; yaml.safe_dump(g, open(\"%s/pr.yaml\", \"w\")); "
                      "sys.exit(d[\"kind\"] != \"PrometheusRule\")'", SLUICE_SOURCE_DIR, url, dir),
                 0);
    cr_assert(asprintf(&args, "check rules %s/pr.yaml", dir) > 0);
    promtool(false, args);
    free(args);
    /* A relative address is what this replaces: refused. */
    cr_expect_eq(h_sh("sh %s/deploy/prometheus/render-rules.sh docs/runbook.md >/dev/null "
                      "2>&1; test $? = 2", SLUICE_SOURCE_DIR), 0);
    tu_rm_rf(dir);
    free(dir);
}

Test(metrics, promtool_lints_live_metrics)
{
    struct expo e;
    char *text, *path, *args;

    drive_all();
    text = scrape_settled(TOTAL_ANSWERS, 0, &e);
    expo_free(&e);
    path = tu_write_file(sl.dir, "metrics.txt", text);
    cr_assert(asprintf(&args, "check metrics < %s", path) > 0);
    promtool(true, args);
    free(args);
    free(path);
    free(text);
}
