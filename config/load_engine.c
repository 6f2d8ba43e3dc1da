/* The sidecar.yaml loader's engine: libyaml's document API -> struct
 * sc_config, driven by the schema tables it is given (schema.c's, by
 * load.c; one row per key, see config_internal.h). It knows value types, not keys: which keys exist, their
 * defaults and bounds are rows; the rules between keys are the block checks
 * of checks.c, which the rows name; the rules of an upstream's url and
 * headers are upstream_url.c and upstream_headers.c. load_internal.h is what
 * they share.
 *
 * Each mapping is read in two passes: the first matches the document's keys
 * to rows (unknown and duplicate keys are reported there), the second walks
 * the rows in table order, parsing the given value or applying the default.
 * Table order therefore decides dependencies (schema.c says which), whatever
 * order the file uses.
 *
 * Every problem is collected, with file:line:col, rather than stopping at
 * the first; errors are sorted by position at the end. */
#define _GNU_SOURCE
#include "config/config.h"
#include "config/config_internal.h"
#include "config/load_internal.h"
#include "config/units.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>


/* ---- errors and positions -------------------------------------------- */

struct sc_pos cfg_pos_of(const yaml_node_t *n)
{
    struct sc_pos p = {0, 0};

    if (n) {
        p.line = (int)n->start_mark.line + 1;
        p.col = (int)n->start_mark.column + 1;
    }
    return p;
}

/* Control characters of s (a value quoted in a message may hold a newline:
 * a block scalar, an escaped "\n") written as C escapes, so that every
 * message is one line: tools read --check-config output line by line. */
static void one_line(const char *s, char *out, size_t len)
{
    static const char esc[] = "\a\b\t\n\v\f\r";
    size_t used = 0;

    for (; *s && used + 5 < len; s++) {
        unsigned char c = (unsigned char)*s;
        const char *e = c && c < ' ' ? strchr(esc, c) : NULL;

        if (e)
            used += (size_t)snprintf(out + used, len - used, "\\%c",
                                     "abtnvfr"[e - esc]);
        else if (c < ' ' || c == 0x7f)
            used += (size_t)snprintf(out + used, len - used, "\\x%02x", c);
        else
            out[used++] = (char)c;
    }
    out[used] = '\0';
}

/* A block check's problem at the place of a value that did not parse (or
 * was out of bounds) is about what was left in its stead ("0s is less than
 * pause" after "must be at most 1h"): the first message there is the cause,
 * so the check's is dropped. Other checks' messages at one place (a lease
 * too short for two routes) all stay. */
static bool value_failed_at(const struct cfg_loader *lc, struct sc_pos p)
{
    for (size_t i = 0; p.line && i < lc->n_bad; i++)
        if (lc->bad[i].line == p.line && lc->bad[i].col == p.col)
            return true;
    return false;
}

static void note_failed_value(struct cfg_loader *lc, struct sc_pos p)
{
    struct sc_pos *v;

    if (!p.line || lc->in_check)
        return;
    if (lc->n_bad == lc->cap_bad) {
        size_t cap = lc->cap_bad ? lc->cap_bad * 2 : 16;
        if (!(v = realloc(lc->bad, cap * sizeof *v))) {
            lc->oom = true;
            return;
        }
        lc->bad = v;
        lc->cap_bad = cap;
    }
    lc->bad[lc->n_bad++] = p;
}

void cfg_err_at(struct cfg_loader *lc, struct sc_pos p, const char *fmt, ...)
{
    char text[SC_ERROR_TEXT_MAX], line[SC_ERROR_TEXT_MAX];
    va_list ap;

    if (lc->in_check && value_failed_at(lc, p))
        return;
    note_failed_value(lc, p);
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    one_line(text, line, sizeof line);
    if (sc_errors_add(lc->errs, lc->file, p.line, p.col, "%s", line) != 0)
        lc->oom = true;
}

/* "PATH: text" at node n: a problem with the value being parsed. */
void cfg_err_val(struct cfg_loader *lc, const yaml_node_t *n, const char *fmt, ...)
{
    char text[SC_ERROR_TEXT_MAX];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    cfg_err_at(lc, cfg_pos_of(n), "%s: %s", lc->path, text);
}

/* "PATH.key: text" at p: a block check about one of the block's keys. */
void cfg_err_sub(struct cfg_loader *lc, struct sc_pos p, const char *key,
             const char *fmt, ...)
{
    char text[SC_ERROR_TEXT_MAX];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    cfg_err_at(lc, p, "%s.%s: %s", lc->path, key, text);
}

/* " in PATH", or "" at the top level. */
static const char *in_path(const struct cfg_loader *lc, char *buf, size_t len)
{
    if (!lc->path[0])
        return "";
    snprintf(buf, len, " in %s", lc->path);
    return buf;
}

static size_t path_push(struct cfg_loader *lc, const char *seg)
{
    size_t len = strlen(lc->path);
    const char *dot = len && seg[0] != '[' ? "." : "";

    snprintf(lc->path + len, sizeof lc->path - len, "%s%s", dot, seg);
    return len;
}

static void path_pop(struct cfg_loader *lc, size_t len)
{
    lc->path[len] = '\0';
}

/* ---- suggestions ----------------------------------------------------- */

/* Optimal string alignment distance, ignoring case, so that a transposition
 * ("burts") is one edit. Words over 63 bytes are never close. */
static size_t edit_distance(const char *a, const char *b)
{
    unsigned short d[64][64];
    size_t la = strlen(a), lb = strlen(b), i, j;

    if (la > 63 || lb > 63)
        return SIZE_MAX;
    for (i = 0; i <= la; i++)
        d[i][0] = (unsigned short)i;
    for (j = 0; j <= lb; j++)
        d[0][j] = (unsigned short)j;
    for (i = 1; i <= la; i++) {
        for (j = 1; j <= lb; j++) {
            int ca = tolower((unsigned char)a[i - 1]);
            int cb = tolower((unsigned char)b[j - 1]);
            unsigned v = d[i - 1][j - 1] + (ca != cb);
            if (d[i - 1][j] + 1u < v)
                v = d[i - 1][j] + 1u;
            if (d[i][j - 1] + 1u < v)
                v = d[i][j - 1] + 1u;
            if (i > 1 && j > 1 && ca == tolower((unsigned char)b[j - 2]) &&
                tolower((unsigned char)a[i - 2]) == cb && d[i - 2][j - 2] + 1u < v)
                v = d[i - 2][j - 2] + 1u;
            d[i][j] = (unsigned short)v;
        }
    }
    return d[la][lb];
}

struct suggest {
    const char *word;
    const char *best;
    size_t limit;   /* candidates must be closer than this */
};

static void suggest_init(struct suggest *sg, const char *word)
{
    size_t len = strlen(word);

    sg->word = word;
    sg->best = NULL;
    sg->limit = (len / 3 > 1 ? len / 3 : 1) + 1;
}

static void suggest_try(struct suggest *sg, const char *cand)
{
    size_t d;

    if (!cand)
        return;
    d = edit_distance(sg->word, cand);
    if (d < sg->limit) {
        sg->limit = d;
        sg->best = cand;
    }
}

/* " (did you mean "x"?)" or "". */
static const char *hint(const struct suggest *sg, char *buf, size_t len)
{
    if (!sg->best)
        return "";
    snprintf(buf, len, " (did you mean \"%s\"?)", sg->best);
    return buf;
}

/* ---- scalars --------------------------------------------------------- */

static yaml_node_t *node_at(struct cfg_loader *lc, int index)
{
    return yaml_document_get_node(&lc->doc, index);
}

static const char *raw(const yaml_node_t *n)
{
    return (const char *)n->data.scalar.value;
}

/* A plain empty, "~" or "null" scalar: YAML's way of writing nothing. */
bool cfg_is_null(const yaml_node_t *n)
{
    const char *v;

    if (!n || n->type != YAML_SCALAR_NODE ||
        n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return false;
    v = raw(n);
    return !*v || !strcmp(v, "~") || !strcmp(v, "null") ||
           !strcmp(v, "Null") || !strcmp(v, "NULL");
}

static void type_error(struct cfg_loader *lc, const yaml_node_t *n,
                       const char *what)
{
    if (n->type == YAML_SCALAR_NODE)
        cfg_err_val(lc, n, "expected %s, got \"%s\"", what, raw(n));
    else
        cfg_err_val(lc, n, "expected %s, got %s", what,
                n->type == YAML_MAPPING_NODE ? "a mapping" : "a list");
}

/* Takes ownership of s until the loader ends. */
static const char *keep(struct cfg_loader *lc, char *s)
{
    if (s && lc->n_scratch == lc->cap_scratch) {
        size_t cap = lc->cap_scratch ? lc->cap_scratch * 2 : 16;
        char **v = realloc(lc->scratch, cap * sizeof *v);
        if (!v) {
            free(s);
            s = NULL;
        } else {
            lc->scratch = v;
            lc->cap_scratch = cap;
        }
    }
    if (!s) {
        lc->oom = true;
        return NULL;
    }
    lc->scratch[lc->n_scratch++] = s;
    return s;
}

struct sbuf {
    char *p;
    size_t n, cap;
    bool oom;
};

static void sb_add(struct sbuf *b, const char *s, size_t n)
{
    if (b->oom || n == 0)
        return;
    if (b->n + n > b->cap) {
        size_t cap = (b->n + n) * 2 + 16;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

static bool is_env_name(const char *s, size_t n)
{
    size_t i;

    if (n == 0 || isdigit((unsigned char)s[0]))
        return false;
    for (i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '_')
            return false;
    return true;
}

/* ${NAME:?} and ${NAME:?text}, as in sh: set but empty is refused too (an
 * empty secret would send "Bearer " to the partner), with text as the
 * reason. Sets *msg to the text (may be ""), or NULL for a plain ${NAME}. */
static size_t split_required(const char *s, size_t len, const char **msg,
                             size_t *msg_len)
{
    const char *q = memchr(s, ':', len);

    *msg = NULL;
    *msg_len = 0;
    if (!q || (size_t)(q - s) + 1 >= len || q[1] != '?')
        return len;
    *msg = q + 2;
    *msg_len = len - (size_t)(q + 2 - s);
    return (size_t)(q - s);
}

/* Appends the value of ${NAME} (or ${NAME:?...}) at *s (just past "${") and
 * advances *s past the "}". False, with the error recorded, when it cannot. */
static bool expand_one(struct cfg_loader *lc, const yaml_node_t *n,
                       const char **s, struct sbuf *b)
{
    const char *close = strchr(*s, '}');
    const char *val, *msg;
    char name[256];
    size_t len, msg_len;

    if (!close) {
        cfg_err_val(lc, n, "unterminated \"${\" in \"%s\"", raw(n));
        return false;
    }
    len = split_required(*s, (size_t)(close - *s), &msg, &msg_len);
    if (!is_env_name(*s, len) || len >= sizeof name) {
        cfg_err_val(lc, n, "invalid variable name \"${%.*s}\"", (int)(close - *s), *s);
        return false;
    }
    memcpy(name, *s, len);
    name[len] = '\0';
    val = getenv(name);
    if (!val) {
        cfg_err_val(lc, n, "environment variable \"%s\" is not set%s%.*s", name,
                msg_len ? ": " : "", (int)msg_len, msg ? msg : "");
        return false;
    }
    if (msg && !*val) {
        cfg_err_val(lc, n, "environment variable \"%s\" is set but empty, which "
                "${%s:?} refuses%s%.*s", name, name, msg_len ? ": " : "",
                (int)msg_len, msg);
        return false;
    }
    sb_add(b, val, strlen(val));
    *s = close + 1;
    return true;
}

/* The scalar's text with every ${NAME} replaced from the environment; NULL
 * (error recorded) when a variable is unset or the text is malformed. */
static const char *expand_env(struct cfg_loader *lc, const yaml_node_t *n)
{
    const char *s = raw(n), *open;
    struct sbuf b = {0};

    if (strlen(s) != n->data.scalar.length) {
        cfg_err_val(lc, n, "contains a NUL character");
        return NULL;
    }
    if (!strstr(s, "${"))
        return s;
    while ((open = strstr(s, "${"))) {
        sb_add(&b, s, (size_t)(open - s));
        s = open + 2;
        if (!expand_one(lc, n, &s, &b)) {
            free(b.p);
            return NULL;
        }
    }
    sb_add(&b, s, strlen(s) + 1);
    if (b.oom) {
        free(b.p);
        lc->oom = true;
        return NULL;
    }
    return keep(lc, b.p);
}

/* The text of a scalar value after ${NAME} expansion (owned by the loader),
 * or NULL with an error recorded. */
static const char *scalar_text(struct cfg_loader *lc, const yaml_node_t *n,
                               const char *what)
{
    if (n->type != YAML_SCALAR_NODE) {
        type_error(lc, n, what);
        return NULL;
    }
    return expand_env(lc, n);
}

/* A mapping key: a scalar taken as written (no ${} expansion), or NULL. */
static const char *key_name(struct cfg_loader *lc, const yaml_node_t *key)
{
    char in[600];

    if (key->type == YAML_SCALAR_NODE)
        return raw(key);
    cfg_err_at(lc, cfg_pos_of(key), "invalid key%s: expected a string, got %s",
           in_path(lc, in, sizeof in),
           key->type == YAML_MAPPING_NODE ? "a mapping" : "a list");
    return NULL;
}

void cfg_set_string(struct cfg_loader *lc, char **field, const char *s)
{
    char *copy = strdup(s);

    if (!copy) {
        lc->oom = true;
        return;
    }
    free(*field);
    *field = copy;
}

/* ---- value types ----------------------------------------------------- */

/* A text handler parses one scalar (or one list element) s into its field in
 * obj; `at` is the node for errors, NULL when s is the row's default. */
typedef void (*text_fn)(struct cfg_loader *lc, const struct cfg_key *k,
                        const char *s, void *obj, const yaml_node_t *at);
typedef int (*num_fn)(const char *s, double *v);

static int num_whole(const char *s, double *v)
{
    const char *p = s + (*s == '-');
    double x = 0;

    if (!*p)
        return -EINVAL;
    for (; *p; p++) {
        if (!isdigit((unsigned char)*p))
            return -EINVAL;
        x = x * 10 + (*p - '0');
    }
    *v = *s == '-' ? -x : x;
    return 0;
}

static int num_decimal(const char *s, double *v)
{
    const char *p = s + (*s == '-');
    size_t digits = strspn(p, "0123456789");

    if (!digits || (p[digits] && (p[digits] != '.' || !p[digits + 1] ||
                                  strspn(p + digits + 1, "0123456789") !=
                                      strlen(p + digits + 1))))
        return -EINVAL;
    *v = strtod(s, NULL);
    return 0;
}

static int num_duration(const char *s, double *v)
{
    uint64_t ms;
    int rc = units_parse_duration(s, &ms, NULL, 0);

    if (rc == 0)
        *v = (double)ms;
    return rc;
}

static int num_size(const char *s, double *v)
{
    uint64_t b;
    int rc = units_parse_size(s, &b, NULL, 0);

    if (rc == 0)
        *v = (double)b;
    return rc;
}

/* Bounds are written in the key's own syntax, so the message can quote them
 * as the operator would write them. */
static bool in_bounds(struct cfg_loader *lc, const yaml_node_t *at, num_fn num,
                      double v, const char *s, const char *min,
                      const char *max)
{
    double b;

    if (min && num(min, &b) == 0 && v < b) {
        cfg_err_val(lc, at, "must be at least %s, got \"%s\"", min, s);
        return false;
    }
    if (max && num(max, &b) == 0 && v > b) {
        cfg_err_val(lc, at, "must be at most %s, got \"%s\"", max, s);
        return false;
    }
    return true;
}

static void text_string(struct cfg_loader *lc, const struct cfg_key *k,
                        const char *s, void *obj, const yaml_node_t *at)
{
    char why[160] = "";

    if (k->valid && !k->valid(s, why, sizeof why)) {
        /* A secret is never echoed: errors end up in logs and in the
         * answer to POST /reload. */
        if (k->secret != CFG_PUBLIC)
            cfg_err_val(lc, at, "invalid value (%s)", why);
        else
            cfg_err_val(lc, at, "invalid value \"%s\" (%s)", s, why);
        return;
    }
    cfg_set_string(lc, CFG_FIELD(obj, k->off), s);
}

static void text_bool(struct cfg_loader *lc, const struct cfg_key *k,
                      const char *s, void *obj, const yaml_node_t *at)
{
    bool *f = CFG_FIELD(obj, k->off);

    if (!strcmp(s, "true"))
        *f = true;
    else if (!strcmp(s, "false"))
        *f = false;
    else
        cfg_err_val(lc, at, "invalid boolean \"%s\" (only true or false are "
                "accepted)", s);
}

static void text_u32(struct cfg_loader *lc, const struct cfg_key *k,
                     const char *s, void *obj, const yaml_node_t *at)
{
    double v;

    if (num_whole(s, &v) != 0) {
        cfg_err_val(lc, at, "invalid number \"%s\" (expected a whole number)", s);
        return;
    }
    if (in_bounds(lc, at, num_whole, v, s, k->min ? k->min : "0",
                  k->max ? k->max : "4294967295"))
        *(uint32_t *)CFG_FIELD(obj, k->off) = (uint32_t)v;
}

static void text_double(struct cfg_loader *lc, const struct cfg_key *k,
                        const char *s, void *obj, const yaml_node_t *at)
{
    double v;

    if (num_decimal(s, &v) != 0) {
        cfg_err_val(lc, at, "invalid number \"%s\" (expected a number such as 2 "
                "or 1.5)", s);
        return;
    }
    if (in_bounds(lc, at, num_decimal, v, s, k->min, k->max))
        *(double *)CFG_FIELD(obj, k->off) = v;
}

/* A duration or a size: a whole unit count parsed by its units.h parser,
 * named `what` in the message, bounded as its key says. */
static void text_count(struct cfg_loader *lc, const struct cfg_key *k,
                       const char *s, void *obj, const yaml_node_t *at,
                       int (*parse)(const char *, uint64_t *, char *, size_t),
                       int (*num)(const char *, double *), const char *what)
{
    char why[160];
    uint64_t v;

    if (parse(s, &v, why, sizeof why) != 0) {
        cfg_err_val(lc, at, "invalid %s \"%s\" (%s)", what, s, why);
        return;
    }
    if (in_bounds(lc, at, num, (double)v, s, k->min, k->max))
        *(uint64_t *)CFG_FIELD(obj, k->off) = v;
}

static void text_duration(struct cfg_loader *lc, const struct cfg_key *k,
                          const char *s, void *obj, const yaml_node_t *at)
{
    text_count(lc, k, s, obj, at, units_parse_duration, num_duration,
               "duration");
}

static void text_size(struct cfg_loader *lc, const struct cfg_key *k,
                      const char *s, void *obj, const yaml_node_t *at)
{
    text_count(lc, k, s, obj, at, units_parse_size, num_size, "size");
}

static void text_rate(struct cfg_loader *lc, const struct cfg_key *k,
                      const char *s, void *obj, const yaml_node_t *at)
{
    char why[160];
    double r;

    if (units_parse_rate(s, &r, why, sizeof why) != 0)
        cfg_err_val(lc, at, "invalid rate \"%s\" (%s)", s, why);
    else
        *(double *)CFG_FIELD(obj, k->off) = r;
}

/* "30%", "12.5%": a decimal number and a percent sign, nothing else. */
static int num_percent(const char *s, double *v)
{
    size_t n = strlen(s);
    char num[32];

    if (n < 2 || n >= sizeof num || s[n - 1] != '%')
        return -EINVAL;
    memcpy(num, s, n - 1);
    num[n - 1] = '\0';
    return num_decimal(num, v);
}

static void text_percent(struct cfg_loader *lc, const struct cfg_key *k,
                         const char *s, void *obj, const yaml_node_t *at)
{
    double v;

    if (num_percent(s, &v) != 0) {
        cfg_err_val(lc, at, "invalid percentage \"%s\" (expected a number and "
                "%%, such as 30%%)", s);
        return;
    }
    if (in_bounds(lc, at, num_percent, v, s, k->min, k->max))
        *(double *)CFG_FIELD(obj, k->off) = v;
}

/* "a, b or c" */
static const char *join_names(const struct cfg_name *names, char *buf,
                              size_t len)
{
    size_t used = 0;

    buf[0] = '\0';
    for (; names->name && used < len; names++) {
        const char *sep = !used ? "" : names[1].name ? ", " : " or ";
        used += (size_t)snprintf(buf + used, len - used, "%s%s", sep,
                                 names->name);
    }
    return buf;
}

static const struct cfg_name *find_name(const struct cfg_name *names,
                                        const char *s)
{
    for (; names->name; names++)
        if (!strcmp(names->name, s))
            return names;
    return NULL;
}

/* "invalid value "x" (expected EXPECT; did you mean "y"?)", suggesting the
 * nearest of names. */
static void bad_value(struct cfg_loader *lc, const struct cfg_name *names,
                      const char *s, const char *expect, const yaml_node_t *at)
{
    const struct cfg_name *n;
    struct suggest sg;
    char mean[120] = "";

    suggest_init(&sg, s);
    for (n = names; n->name; n++)
        suggest_try(&sg, n->name);
    if (sg.best)
        snprintf(mean, sizeof mean, "; did you mean \"%s\"?", sg.best);
    cfg_err_val(lc, at, "invalid value \"%s\" (expected %s%s)", s, expect, mean);
}

static void bad_name(struct cfg_loader *lc, const struct cfg_name *names,
                     const char *s, const yaml_node_t *at)
{
    char list[200];

    bad_value(lc, names, s, join_names(names, list, sizeof list), at);
}

static void text_enum(struct cfg_loader *lc, const struct cfg_key *k,
                      const char *s, void *obj, const yaml_node_t *at)
{
    const struct cfg_name *n = find_name(k->names, s);

    if (n)
        *(int *)CFG_FIELD(obj, k->off) = n->value;
    else
        bad_name(lc, k->names, s, at);
}

static void text_addr(struct cfg_loader *lc, const struct cfg_key *k,
                      const char *s, void *obj, const yaml_node_t *at)
{
    struct sc_addr *a = CFG_FIELD(obj, k->off);
    char why[160], *host;
    uint16_t port;

    a->pos = cfg_pos_of(at);
    if (units_parse_hostport(s, &host, &port, why, sizeof why) != 0) {
        cfg_err_val(lc, at, "invalid address \"%s\" (%s)", s, why);
        return;
    }
    free(a->host);
    a->host = host;
    a->port = port;
}

static void elem_addr(struct cfg_loader *lc, const struct cfg_key *k,
                      const char *s, void *obj, const yaml_node_t *at)
{
    struct sc_addr_list *l = CFG_FIELD(obj, k->off);
    char why[160], *host;
    uint16_t port;

    if (l->n == SC_ADDR_LIST_MAX) {
        cfg_err_val(lc, at, "too many addresses (at most %d)", SC_ADDR_LIST_MAX);
        return;
    }
    if (units_parse_hostport(s, &host, &port, why, sizeof why) != 0) {
        cfg_err_val(lc, at, "invalid address \"%s\" (%s)", s, why);
        return;
    }
    l->v[l->n].host = host;
    l->v[l->n].port = port;
    l->v[l->n].pos = cfg_pos_of(at);
    l->n++;
}

static void reset_addrs(void *f)
{
    struct sc_addr_list *l = f;

    for (uint32_t i = 0; i < l->n; i++)
        free(l->v[i].host);
    memset(l, 0, sizeof *l);
}

/* ---- upstream URL (the rule: upstream_url.c) ---------------------- */

static void text_url(struct cfg_loader *lc, const struct cfg_key *k,
                     const char *s, void *obj, const yaml_node_t *at)
{
    struct sc_upstream *u = CFG_FIELD(obj, k->off);
    char why[160];

    free(u->url);
    free(u->host);
    free(u->authority);
    free(u->base_path);
    u->url = u->host = u->authority = u->base_path = NULL;
    if (config_upstream_url_parse(s, u, why, sizeof why) != 0)
        cfg_err_val(lc, at, "invalid URL \"%s\" (%s)", s, why);
    else if (!u->url || !u->authority || !u->base_path)
        lc->oom = true;
}

/* ---- references between sections ------------------------------------- */

static void text_upstream_ref(struct cfg_loader *lc, const struct cfg_key *k,
                              const char *s, void *obj, const yaml_node_t *at)
{
    const struct sc_config *cfg = lc->cfg;
    const struct sc_upstream *u = config_upstream(cfg, s);
    size_t *f = CFG_FIELD(obj, k->off), i;
    struct suggest sg;
    char h[120];

    /* SIZE_MAX marks a route whose upstream did not resolve, so the cross
     * checks skip it instead of reading a wrong upstream. */
    *f = u ? (size_t)(u - cfg->upstreams) : SIZE_MAX;
    if (u)
        return;
    suggest_init(&sg, s);
    for (i = 0; i < cfg->n_upstreams; i++)
        suggest_try(&sg, cfg->upstreams[i].name);
    cfg_err_val(lc, at, "unknown upstream \"%s\"%s", s, hint(&sg, h, sizeof h));
}

static void text_policy_ref(struct cfg_loader *lc, const struct cfg_key *k,
                            const char *s, void *obj, const yaml_node_t *at)
{
    const struct sc_config *cfg = lc->cfg;
    long *f = CFG_FIELD(obj, k->off);
    struct suggest sg;
    char h[120];
    size_t i;

    /* "" and "default" name the built-in default policy. */
    *f = !*s || !strcmp(s, "default") ? -1 : config_policy_index(cfg, s);
    if (*f >= 0 || !*s || !strcmp(s, "default"))
        return;
    suggest_init(&sg, s);
    for (i = 0; i < cfg->n_policies; i++)
        suggest_try(&sg, cfg->policies[i].name);
    cfg_err_val(lc, at, "unknown policy \"%s\"%s", s, hint(&sg, h, sizeof h));
}

/* ---- list elements --------------------------------------------------- */

static bool has_lower(const char *s)
{
    for (; *s; s++)
        if (islower((unsigned char)*s))
            return true;
    return false;
}

static void elem_method(struct cfg_loader *lc, const struct cfg_key *k,
                        const char *s, void *obj, const yaml_node_t *at)
{
    unsigned *mask = CFG_FIELD(obj, k->off);
    char up[32];
    size_t i;

    if (!units_is_token(s)) {
        cfg_err_val(lc, at, "invalid method \"%s\" (expected an HTTP method "
                "such as GET or POST)", s);
        return;
    }
    if (!has_lower(s)) {
        *mask |= sc_method_bit(s);
        return;
    }
    for (i = 0; s[i] && i + 1 < sizeof up; i++)
        up[i] = (char)toupper((unsigned char)s[i]);
    up[i] = '\0';
    if (!s[i] && sc_method_bit(up) != SC_M_OTHER)
        cfg_err_val(lc, at, "unknown method \"%s\" (methods are case-sensitive; "
                "did you mean \"%s\"?)", s, up);
    else
        cfg_err_val(lc, at, "unknown method \"%s\" (methods are upper-case "
                "tokens such as GET or POST)", s);
}

static void elem_flag(struct cfg_loader *lc, const struct cfg_key *k,
                      const char *s, void *obj, const yaml_node_t *at)
{
    const struct cfg_name *n = find_name(k->names, s);

    if (n)
        *(unsigned *)CFG_FIELD(obj, k->off) |= (unsigned)n->value;
    else
        bad_name(lc, k->names, s, at);
}

/* Exactly three digits from 100 to 599, else -1. */
static int status_code(const char *s)
{
    if (strlen(s) != 3 || strspn(s, "0123456789") != 3)
        return -1;
    int v = atoi(s);
    return v >= 100 && v <= 599 ? v : -1;
}

static void elem_status(struct cfg_loader *lc, const struct cfg_key *k,
                        const char *s, void *obj, const yaml_node_t *at)
{
    uint64_t *set = CFG_FIELD(obj, k->off);
    int code = status_code(s), c;

    if (code > 0) {
        cfg_bit_set(set, code);
        return;
    }
    if (strlen(s) == 3 && s[0] >= '2' && s[0] <= '5' && !strcmp(s + 1, "xx")) {
        for (c = (s[0] - '0') * 100; c < (s[0] - '0' + 1) * 100; c++)
            cfg_bit_set(set, c);
        return;
    }
    cfg_err_val(lc, at, "invalid status \"%s\" (expected 2xx, 3xx, 4xx, 5xx or "
            "a status code from 100 to 599)", s);
}

/* An exact status, where a class such as 2xx would be a guess (verify's
 * found and absent name what a lookup's answer means). */
static void elem_code(struct cfg_loader *lc, const struct cfg_key *k,
                      const char *s, void *obj, const yaml_node_t *at)
{
    int code = status_code(s);

    if (code > 0)
        cfg_bit_set(CFG_FIELD(obj, k->off), code);
    else
        cfg_err_val(lc, at, "invalid status \"%s\" (expected a status code from "
                "100 to 599, such as 200 or 404)", s);
}

static const struct cfg_name transport_names[] = {
    {"connect_error", SC_T_CONNECT_ERROR},
    {"connection_lost", SC_T_CONNECTION_LOST},
    {"timeout", SC_T_TIMEOUT},
    {NULL, 0},
};

static void elem_retry_on(struct cfg_loader *lc, const struct cfg_key *k,
                          const char *s, void *obj, const yaml_node_t *at)
{
    struct sc_retry *r = CFG_FIELD(obj, k->off);
    const struct cfg_name *n = find_name(transport_names, s);
    int code = status_code(s);

    if (code > 0)
        cfg_bit_set(r->on_status, code);
    else if (n)
        r->on_transport |= (unsigned)n->value;
    else
        bad_value(lc, transport_names, s, "a status code from 100 to 599, "
                  "connect_error, connection_lost or timeout", at);
}

static void reset_mask(void *f)
{
    *(unsigned *)f = 0;
}

static void reset_statuses(void *f)
{
    memset(f, 0, sizeof ((struct sc_retry *)0)->on_status);
}

static void reset_retry_on(void *f)
{
    struct sc_retry *r = f;

    memset(r->on_status, 0, sizeof r->on_status);
    r->on_transport = 0;
}

/* ---- dispatch -------------------------------------------------------- */

typedef void (*node_fn)(struct cfg_loader *lc, const struct cfg_key *k,
                        yaml_node_t *n, void *obj, struct sc_pos at_key);

static void parse_headers(struct cfg_loader *, const struct cfg_key *,
                          yaml_node_t *, void *, struct sc_pos);
static void parse_subblock(struct cfg_loader *, const struct cfg_key *,
                           yaml_node_t *, void *, struct sc_pos);
static void parse_named(struct cfg_loader *, const struct cfg_key *,
                        yaml_node_t *, void *, struct sc_pos);
static void parse_seq(struct cfg_loader *, const struct cfg_key *,
                      yaml_node_t *, void *, struct sc_pos);

/* How each type is read: a scalar text handler, a list (element handler +
 * reset) or a structure (node handler). */
struct type_ops {
    const char *what;      /* for "expected WHAT, got ..." */
    text_fn text;
    void (*reset)(void *field);
    node_fn node;
};

static const struct type_ops types[CT_COUNT] = {
    [CT_STRING] = {"a string", text_string, NULL, NULL},
    [CT_BOOL] = {"true or false", text_bool, NULL, NULL},
    [CT_U32] = {"a whole number", text_u32, NULL, NULL},
    [CT_DOUBLE] = {"a number", text_double, NULL, NULL},
    [CT_DURATION] = {"a duration such as 250ms or 30s", text_duration, NULL, NULL},
    [CT_SIZE] = {"a size such as 512 or 16KiB", text_size, NULL, NULL},
    [CT_RATE] = {"a rate such as 10/s", text_rate, NULL, NULL},
    [CT_ENUM] = {"a name", text_enum, NULL, NULL},
    [CT_ADDR] = {"host:port", text_addr, NULL, NULL},
    [CT_ADDRS] = {"host:port", elem_addr, reset_addrs, NULL},
    [CT_URL] = {"a URL", text_url, NULL, NULL},
    [CT_METHODS] = {"an HTTP method", elem_method, reset_mask, NULL},
    [CT_FLAGS] = {"a name", elem_flag, reset_mask, NULL},
    [CT_STATUSES] = {"a status", elem_status, reset_statuses, NULL},
    [CT_RETRY_ON] = {"a status code or a failure name", elem_retry_on,
                     reset_retry_on, NULL},
    [CT_CODES] = {"a status code", elem_code, reset_statuses, NULL},
    [CT_HEADERS] = {"a mapping of header names to values", NULL, NULL,
                    parse_headers},
    [CT_BLOCK] = {"a mapping", NULL, NULL, parse_subblock},
    [CT_NAMED] = {"a mapping of names", NULL, NULL, parse_named},
    [CT_LIST] = {"a list", NULL, NULL, parse_seq},
    [CT_UPSTREAM_REF] = {"an upstream name", text_upstream_ref, NULL, NULL},
    [CT_POLICY_REF] = {"a policy name", text_policy_ref, NULL, NULL},
    [CT_PERCENT] = {"a percentage such as 30%", text_percent, NULL, NULL},
};

static void parse_list(struct cfg_loader *lc, const struct cfg_key *k,
                       yaml_node_t *n, void *obj)
{
    const struct type_ops *t = &types[k->type];
    yaml_node_item_t *it;

    t->reset(CFG_FIELD(obj, k->off));
    if (n->type != YAML_SEQUENCE_NODE) {
        type_error(lc, n, "a list such as [a, b]");
        return;
    }
    if (k->nonempty && n->data.sequence.items.start == n->data.sequence.items.top) {
        cfg_err_val(lc, n, "must not be empty");
        return;
    }
    for (it = n->data.sequence.items.start; it < n->data.sequence.items.top; it++) {
        yaml_node_t *e = node_at(lc, *it);
        const char *s = scalar_text(lc, e, t->what);
        if (s)
            t->text(lc, k, s, obj, e);
    }
}

static bool is_collection(const struct cfg_key *k)
{
    return k->type == CT_NAMED || k->type == CT_LIST;
}

static void parse_value(struct cfg_loader *lc, const struct cfg_key *k,
                        yaml_node_t *n, void *obj, struct sc_pos at_key)
{
    const struct type_ops *t = &types[k->type];
    const char *s;

    if (t->node)
        t->node(lc, k, n, obj, at_key);
    else if (t->reset)
        parse_list(lc, k, n, obj);
    else if ((s = scalar_text(lc, n, t->what)))
        t->text(lc, k, s, obj, n);
    /* A collection's key: a block list or mapping starts on the next line,
     * and a problem with the collection as a whole is the key's. */
    if (k->pos_off)
        *(struct sc_pos *)CFG_FIELD(obj, k->pos_off - 1) =
            is_collection(k) ? at_key : cfg_pos_of(n);
    if (k->flag_off)
        *(bool *)CFG_FIELD(obj, k->flag_off - 1) = true;
}

static void parse_block(struct cfg_loader *lc, const struct cfg_block *b,
                        yaml_node_t *map, void *obj, struct sc_pos where);

/* The default of a key that was not given: its def text goes through the
 * same handler as a value would (lists: one element per comma). */
static void apply_default(struct cfg_loader *lc, const struct cfg_key *k,
                          void *obj)
{
    const struct type_ops *t = &types[k->type];
    char item[64];
    const char *p;
    size_t n;

    if (k->type == CT_BLOCK) {
        parse_block(lc, k->block, NULL, CFG_FIELD(obj, k->off),
                    (struct sc_pos){0, 0});
    } else if (t->reset) {
        t->reset(CFG_FIELD(obj, k->off));
        for (p = k->def; p && *p; p += n + (p[n] == ',')) {
            n = strcspn(p, ",");
            snprintf(item, sizeof item, "%.*s", (int)n, p);
            t->text(lc, k, item, obj, NULL);
        }
    } else if (k->def && t->text) {
        t->text(lc, k, k->def, obj, NULL);
    }
}

/* An optional scalar (a row with a flag, such as a route's timeout) written
 * as "": the contract's way of showing it unset, so it counts as not given. */
static bool blank_optional(const struct cfg_key *k, const yaml_node_t *val)
{
    const struct type_ops *t = &types[k->type];

    return k->flag_off && t->text && !t->reset &&
           val->type == YAML_SCALAR_NODE && val->data.scalar.length == 0;
}

/* One row of a block: the given value, or the default. A null value counts
 * as not given (collections read it as empty, to say what is missing). */
static void parse_key(struct cfg_loader *lc, const struct cfg_key *k,
                      yaml_node_t *key, yaml_node_t *val, void *obj,
                      bool given, struct sc_pos where)
{
    char in[600];
    size_t mark;

    if (k->required && given && !key)
        cfg_err_at(lc, where, "missing required key \"%s\"%s", k->name,
               in_path(lc, in, sizeof in));
    mark = path_push(lc, k->name);
    if (val && (!cfg_is_null(val) || is_collection(k)) && !blank_optional(k, val))
        parse_value(lc, k, val, obj, cfg_pos_of(key));
    else if (val && k->required)
        cfg_err_val(lc, val, "missing value");
    else
        apply_default(lc, k, obj);
    path_pop(lc, mark);
}

static long find_key(const struct cfg_block *b, const char *name)
{
    size_t i;

    for (i = 0; i < b->n_keys; i++)
        if (!strcmp(b->keys[i].name, name))
            return (long)i;
    return -1;
}

static void unknown_key(struct cfg_loader *lc, const struct cfg_block *b,
                        const yaml_node_t *key, const char *name)
{
    struct suggest sg;
    char in[600], h[120];
    size_t i;

    if (!strcmp(name, "<<")) {
        cfg_err_at(lc, cfg_pos_of(key), "YAML merge keys (\"<<\") are not "
               "supported%s", in_path(lc, in, sizeof in));
        return;
    }
    suggest_init(&sg, name);
    for (i = 0; i < b->n_keys; i++)
        suggest_try(&sg, b->keys[i].name);
    cfg_err_at(lc, cfg_pos_of(key), "unknown key \"%s\"%s%s", name,
           in_path(lc, in, sizeof in), hint(&sg, h, sizeof h));
}

static void duplicate_key(struct cfg_loader *lc, const yaml_node_t *key,
                          const char *name, struct sc_pos first)
{
    char in[600];

    cfg_err_at(lc, cfg_pos_of(key), "duplicate key \"%s\"%s (first given at line %d)",
           name, in_path(lc, in, sizeof in), first.line);
}

/* Pass one: the document's keys matched to the block's rows. */
static void collect_keys(struct cfg_loader *lc, const struct cfg_block *b,
                         yaml_node_t *map, yaml_node_t **keys,
                         yaml_node_t **vals)
{
    yaml_node_pair_t *p;

    for (p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++) {
        yaml_node_t *key = node_at(lc, p->key);
        const char *name = key_name(lc, key);
        long i;

        if (!name)
            continue;
        i = find_key(b, name);
        if (i < 0)
            unknown_key(lc, b, key, name);
        else if (keys[i])
            duplicate_key(lc, key, name, cfg_pos_of(keys[i]));
        else {
            keys[i] = key;
            vals[i] = node_at(lc, p->value);
        }
    }
}

/* Parses a mapping described by b into obj; map NULL applies the defaults.
 * A null map is an empty one (so required keys are reported). `where` is
 * the block's position for "missing key" errors. */
static void parse_block(struct cfg_loader *lc, const struct cfg_block *b,
                        yaml_node_t *map, void *obj, struct sc_pos where)
{
    yaml_node_t *keys[CFG_MAX_KEYS] = {0}, *vals[CFG_MAX_KEYS] = {0};
    bool given = map != NULL;
    size_t i;

    if (b->pos_off)
        *(struct sc_pos *)CFG_FIELD(obj, b->pos_off - 1) = where;
    if (map && !cfg_is_null(map) && map->type != YAML_MAPPING_NODE) {
        type_error(lc, map, "a mapping");
        given = false;
    } else if (map && map->type == YAML_MAPPING_NODE) {
        collect_keys(lc, b, map, keys, vals);
    }
    for (i = 0; i < b->n_keys; i++)
        parse_key(lc, &b->keys[i], keys[i], vals[i], obj, given, where);
    if (given && b->check) {
        bool outer = lc->in_check;

        lc->in_check = true;
        b->check(lc, obj, vals, where);
        lc->in_check = outer;
    }
}

static void parse_subblock(struct cfg_loader *lc, const struct cfg_key *k,
                           yaml_node_t *n, void *obj, struct sc_pos at_key)
{
    parse_block(lc, k->block, n, CFG_FIELD(obj, k->off), at_key);
}

/* ---- collections ----------------------------------------------------- */

/* Collection elements and their arrays, as described by a CT_NAMED/CT_LIST
 * row; the count grows as elements are added so config_free sees only
 * initialised ones. */
struct coll {
    const struct cfg_block *b;
    char *arr;
    size_t *count;
};

static bool coll_open(struct cfg_loader *lc, const struct cfg_key *k,
                      void *obj, size_t cap, struct coll *c)
{
    c->b = k->block;
    c->count = CFG_FIELD(obj, k->n_off);
    c->arr = calloc(cap, k->block->size);
    *(void **)CFG_FIELD(obj, k->off) = c->arr;
    if (!c->arr)
        lc->oom = true;
    return c->arr != NULL;
}

static void *coll_elem(const struct coll *c, size_t i)
{
    return c->arr + i * c->b->size;
}

static bool valid_name(const char *s)
{
    size_t n = strlen(s);

    return n > 0 && n <= 64 &&
           strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                     "0123456789-_.") == n;
}

static long coll_find(const struct coll *c, const char *name)
{
    size_t i;

    for (i = 0; i < *c->count; i++) {
        const char *n = *(char **)CFG_FIELD(coll_elem(c, i), c->b->name_off - 1);
        if (n && !strcmp(n, name))
            return (long)i;
    }
    return -1;
}

static const char *article(const char *noun)
{
    return strchr("aeiou", noun[0]) ? "an" : "a";
}

/* "idempotency:" at the level of the policies' names is most often the
 * policy above it missing an indent, not a policy called idempotency. A
 * name may be a key's (a policy called "shared" is fine), so this is said
 * only when the entry does not work as a block of its own: its value is no
 * mapping, or the block had errors (then after them: they show what went
 * wrong, this says why). */
static void key_as_name(struct cfg_loader *lc, const struct coll *c,
                        const yaml_node_t *key, const char *name)
{
    cfg_err_at(lc, cfg_pos_of(key), "%s: \"%s\" is a key of %s %s, read here as the name of "
           "one: if it belongs to the %s above, indent it one level deeper", lc->path,
           name, article(c->b->what), c->b->what, c->b->what);
}

/* One "name: {block}" entry of upstreams or policies. */
static void named_entry(struct cfg_loader *lc, struct coll *c,
                        yaml_node_t *key, yaml_node_t *val)
{
    const char *name = key_name(lc, key);
    void *elem;
    size_t mark, errs;
    long dup;

    if (!name)
        return;
    if (!valid_name(name)) {
        cfg_err_at(lc, cfg_pos_of(key), "%s: invalid %s name \"%s\" (use up to 64 "
               "letters, digits, \"-\", \"_\" and \".\")", lc->path,
               c->b->what, name);
        return;
    }
    if (find_key(c->b, name) >= 0 && (!val || val->type != YAML_MAPPING_NODE)) {
        key_as_name(lc, c, key, name);
        return;
    }
    if ((dup = coll_find(c, name)) >= 0) {
        duplicate_key(lc, key, name, *(struct sc_pos *)CFG_FIELD(
                          coll_elem(c, (size_t)dup), c->b->pos_off - 1));
        return;
    }
    elem = coll_elem(c, (*c->count)++);
    cfg_set_string(lc, CFG_FIELD(elem, c->b->name_off - 1), name);
    mark = path_push(lc, name);
    errs = lc->errs->n;
    parse_block(lc, c->b, val, elem, cfg_pos_of(key));
    path_pop(lc, mark);
    if (lc->errs->n > errs && find_key(c->b, name) >= 0)
        key_as_name(lc, c, key, name);
}

static void parse_named(struct cfg_loader *lc, const struct cfg_key *k,
                        yaml_node_t *n, void *obj, struct sc_pos at_key)
{
    yaml_node_pair_t *p;
    struct coll c;
    size_t cap = 0;

    if (n->type == YAML_MAPPING_NODE)
        cap = (size_t)(n->data.mapping.pairs.top - n->data.mapping.pairs.start);
    else if (!cfg_is_null(n)) {
        type_error(lc, n, "a mapping of names");
        return;
    }
    if (cap == 0) {
        if (k->nonempty)
            cfg_err_val(lc, n, "at least one %s is required", k->block->what);
        return;
    }
    if (!coll_open(lc, k, obj, cap, &c))
        return;
    for (p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++)
        named_entry(lc, &c, node_at(lc, p->key), node_at(lc, p->value));
}

static void parse_seq(struct cfg_loader *lc, const struct cfg_key *k,
                      yaml_node_t *n, void *obj, struct sc_pos at_key)
{
    yaml_node_item_t *it;
    struct coll c;
    size_t cap = 0, mark;
    char seg[32];

    if (n->type == YAML_SEQUENCE_NODE)
        cap = (size_t)(n->data.sequence.items.top - n->data.sequence.items.start);
    else if (!cfg_is_null(n)) {
        type_error(lc, n, "a list");
        return;
    }
    if (cap == 0) {
        if (k->nonempty)
            cfg_err_val(lc, n, "at least one %s is required", k->block->what);
        return;
    }
    if (!coll_open(lc, k, obj, cap, &c))
        return;
    for (it = n->data.sequence.items.start; it < n->data.sequence.items.top; it++) {
        yaml_node_t *item = node_at(lc, *it);
        snprintf(seg, sizeof seg, "[%zu]", *c.count);
        mark = path_push(lc, seg);
        parse_block(lc, c.b, item, coll_elem(&c, (*c.count)++), cfg_pos_of(item));
        path_pop(lc, mark);
    }
}

/* ---- upstream headers (the rules: upstream_headers.c) --------------- */

static void header_entry(struct cfg_loader *lc, struct sc_header *hs,
                         size_t *count, yaml_node_t *key, yaml_node_t *val)
{
    const char *name = key_name(lc, key), *v, *bad;
    struct sc_header *h;
    size_t i, mark;

    if (!name)
        return;
    if ((bad = config_header_name_problem(name))) {
        cfg_err_at(lc, cfg_pos_of(key), "%s: %s header name \"%s\"%s", lc->path, bad, name,
               !strcmp(bad, "reserved") ? " (sluice sets it itself)" : "");
        return;
    }
    for (i = 0; i < *count; i++)
        if (!strcasecmp(hs[i].name, name))
            break;
    mark = path_push(lc, name);
    v = cfg_is_null(val) ? "" : scalar_text(lc, val, "a string");
    if (i < *count)
        cfg_err_at(lc, cfg_pos_of(key), "duplicate header \"%s\" in %.*s", name,
               (int)mark, lc->path);
    else if (v && (bad = config_header_value_problem(v)))
        cfg_err_val(lc, val, "%s", bad);
    else if (v) {
        h = &hs[(*count)++];
        h->from_env = val->type == YAML_SCALAR_NODE && strstr(raw(val), "${");
        h->name = strdup(name);
        h->value = strdup(v);
        if (!h->name || !h->value)
            lc->oom = true;
    }
    path_pop(lc, mark);
}

static void parse_headers(struct cfg_loader *lc, const struct cfg_key *k,
                          yaml_node_t *n, void *obj, struct sc_pos at_key)
{
    struct sc_header **hs = CFG_FIELD(obj, k->off);
    size_t *count = CFG_FIELD(obj, k->n_off), cap;
    yaml_node_pair_t *p;

    if (n->type != YAML_MAPPING_NODE) {
        type_error(lc, n, types[k->type].what);
        return;
    }
    cap = (size_t)(n->data.mapping.pairs.top - n->data.mapping.pairs.start);
    if (cap == 0)
        return;
    *hs = calloc(cap, sizeof **hs);
    if (!*hs) {
        lc->oom = true;
        return;
    }
    for (p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++)
        header_entry(lc, *hs, count, node_at(lc, p->key), node_at(lc, p->value));
}

/* ---- loading --------------------------------------------------------- */

static void syntax_error(struct cfg_loader *lc, const yaml_parser_t *p)
{
    struct sc_pos pos = {(int)p->problem_mark.line + 1,
                         (int)p->problem_mark.column + 1};

    if (p->error == YAML_MEMORY_ERROR)
        lc->oom = true;
    else if (p->context)
        cfg_err_at(lc, pos, "invalid YAML: %s (%s at line %zu)",
               p->problem ? p->problem : "syntax error", p->context,
               p->context_mark.line + 1);
    else
        cfg_err_at(lc, pos, "invalid YAML: %s",
               p->problem ? p->problem : "syntax error");
}

/* Loads the one document of the stream into lc->doc. */
static int load_document(struct cfg_loader *lc, const char *yaml, size_t len)
{
    yaml_parser_t parser;
    yaml_document_t extra;
    int rc = -EINVAL;

    if (!yaml_parser_initialize(&parser))
        return -ENOMEM;
    yaml_parser_set_input_string(&parser, (const unsigned char *)yaml, len);
    if (!yaml_parser_load(&parser, &lc->doc)) {
        syntax_error(lc, &parser);
        goto out;
    }
    lc->have_doc = true;
    if (!yaml_parser_load(&parser, &extra)) {
        syntax_error(lc, &parser);
        goto out;
    }
    if (yaml_document_get_root_node(&extra))
        cfg_err_at(lc, (struct sc_pos){(int)extra.start_mark.line + 1,
                                   (int)extra.start_mark.column + 1},
               "only one YAML document is allowed");
    else
        rc = 0;
    yaml_document_delete(&extra);
out:
    yaml_parser_delete(&parser);
    return rc;
}

static void load_root(struct cfg_loader *lc, const struct cfg_block *block)
{
    yaml_node_t *root = yaml_document_get_root_node(&lc->doc);

    if (!root || cfg_is_null(root)) {
        cfg_err_at(lc, (struct sc_pos){1, 1}, "the configuration is empty: "
               "upstreams and routes are required");
        return;
    }
    if (root->type != YAML_MAPPING_NODE) {
        cfg_err_at(lc, cfg_pos_of(root), "expected a mapping of keys at the top "
               "level, got %s", root->type == YAML_SEQUENCE_NODE
                                    ? "a list" : "a scalar");
        return;
    }
    parse_block(lc, block, root, lc->cfg, cfg_pos_of(root));
}

static bool error_before(const struct sc_error *a, const struct sc_error *b)
{
    return a->line < b->line || (a->line == b->line && a->col < b->col);
}

/* Stable (insertion) sort by position of the errors this load added:
 * checks run in table order, not file order. */
static void sort_errors(struct sc_errors *e, size_t from)
{
    size_t i, j;

    for (i = from + 1; i < e->n; i++) {
        struct sc_error x = e->v[i];
        for (j = i; j > from && error_before(&x, &e->v[j - 1]); j--)
            e->v[j] = e->v[j - 1];
        e->v[j] = x;
    }
}

static int loader_start(struct cfg_loader *lc, const char *name,
                        const struct cfg_block *policy)
{
    struct sc_config *cfg = calloc(1, sizeof *cfg);

    if (!cfg)
        return -ENOMEM;
    lc->cfg = cfg;
    cfg->file = strdup(name);
    cfg->default_policy.name = strdup("default");
    if (!cfg->file || !cfg->default_policy.name)
        return -ENOMEM;
    parse_block(lc, policy, NULL, &cfg->default_policy, (struct sc_pos){0, 0});
    return 0;
}

static int loader_end(struct cfg_loader *lc, int rc)
{
    size_t i;

    for (i = 0; i < lc->n_scratch; i++)
        free(lc->scratch[i]);
    free(lc->scratch);
    free(lc->bad);
    if (lc->have_doc)
        yaml_document_delete(&lc->doc);
    if (lc->oom || rc == -ENOMEM) {
        sc_errors_add(lc->errs, lc->file, 0, 0, "out of memory");
        rc = -ENOMEM;
    } else if (rc == 0 && lc->errs->n > lc->first_err) {
        rc = -EINVAL;
    }
    sort_errors(lc->errs, lc->first_err);
    return rc;
}

int cfg_engine_load(const char *name, const char *yaml, size_t len,
                    const struct cfg_block *root, const struct cfg_block *policy,
                    struct sc_config **out, struct sc_errors *errs)
{
    struct sc_errors local = {0};
    struct cfg_loader lc = {0};
    int rc;

    if (!out)
        return -EINVAL;
    *out = NULL;
    lc.file = name ? name : "<config>";
    lc.errs = errs ? errs : &local;
    lc.first_err = lc.errs->n;
    rc = loader_start(&lc, lc.file, policy);
    if (rc == 0 && yaml)
        rc = load_document(&lc, yaml, len);
    if (rc == 0)
        load_root(&lc, root);
    rc = loader_end(&lc, rc);
    if (rc == 0)
        *out = lc.cfg;
    else
        cfg_config_free(lc.cfg, root, policy);
    sc_errors_free(&local);
    return rc;
}
