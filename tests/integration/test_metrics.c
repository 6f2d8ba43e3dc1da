/* Metrics (SPEC sections 7 and 8) as Prometheus meets them: the exposition
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
        "  open: {retry: {max_attempts: 3}, idempotency: {required: false}}\n"
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
        if (!strncmp(e->s[i].name, f->name, strlen(f->name)))
            problem(e, no, "TYPE of %s after its samples", f->name);
    *cur = f;
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
    cr_assert_fail("metrics did not settle: %.0f answers of %.0f, %.0f connections\n%s",
                   answers(e), total, val(e, "sluice_connections", NULL), text);
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

    for (int i = 0; i < MAX_CONNS; i++)
        fds[i] = connect_port(sl.port);
    free(scrape_settled(-1, MAX_CONNS, &e));
    expo_free(&e);
    extra = connect_port(sl.port);
    p = (struct pollfd){extra, POLLIN, 0};
    cr_expect_eq(poll(&p, 1, 5000), 1, "the connection over the limit was not closed");
    cr_expect_leq(recv(extra, buf, sizeof buf, 0), 0);
    close(extra);
    for (int i = 0; i < MAX_CONNS; i++)
        close(fds[i]);
}
