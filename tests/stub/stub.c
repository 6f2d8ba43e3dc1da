/*
 * sluice-stub: a scriptable downstream HTTP/1.1 server, the upstream that sluice's integration
 * tests, benchmarks and demo proxy to.
 *
 *   sluice-stub [--listen HOST:PORT] [--tls-cert FILE --tls-key FILE] [--max-rate R] [--burst B]
 *               [--body-size N] [--threads N] [--delay-ms N] [--honour-idempotency]
 *               [--lookup PREFIX]
 *
 * Once bound it prints one line "listening HOST:PORT" (the actual port: PORT 0 lets the kernel
 * choose) and serves until SIGINT or SIGTERM, then exits 0. Plain requests are echoed; X-Stub-*
 * request headers and a FIFO of answers posted to /_stub/script shape the answer; /_stub/stats,
 * /_stub/keys/<key> and /_stub/arrivals report what arrived; POST /_stub/reset forgets it. With
 * --lookup, GET/HEAD PREFIX<key> answers whether the key had a side effect, as a partner's lookup
 * of an operation by the client's reference does (POST /_stub/lookup-script shapes those answers).
 * tests/stub/README.md is the reference for the whole control surface.
 *
 * Built on bufferevents and http_parser rather than evhttp: the stub must cut an answer in the
 * middle, send bytes that are not HTTP, and report the request target and the header order
 * byte-exact, all of which evhttp hides. The hot path makes no allocation of its own per request:
 * each connection reuses its buffers, and only libevent's evbuffer chains come and go.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <event2/thread.h>
#include <http_parser.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#define MAX_BODY      (64u << 20)    /* bodies are buffered whole for the echo: 413 beyond */
#define MAX_FILL      (1ull << 30)   /* largest X-Stub-Body-Size / --body-size */
#define MAX_DELAY_MS  3600000u
#define MAX_ARRIVALS  1000000u
#define MAX_THREADS   64
#define OUT_HIGH      (1u << 20)     /* parse no pipelined request while this much output waits */
#define IN_HIGH       (1u << 20)     /* read no more while this much input waits behind a delay */
#define LINGER_MS     1000           /* how long a closing connection may keep sending us bytes */
#define RA_MAX        64             /* longest Retry-After value a script line may carry */
#define FILL_BLOCK    65536
#define CHUNK_MAX     16384          /* chunk size of X-Stub-Chunked bodies */

static char fill_block[FILL_BLOCK];  /* 'x' * FILL_BLOCK, the source of every filled body */

/* ---- types ---------------------------------------------------------------------------------- */

/* DROP_UNEXECUTED closes like DROP_BEFORE but leaves no side effect: the request was lost before
 * the partner did the work. */
enum drop { DROP_NONE, DROP_BEFORE, DROP_MID, DROP_GARBAGE, DROP_UNEXECUTED };

/* One line of POST /_stub/script (and of /_stub/lookup-script). */
struct answer {
    int status;
    bool natural;                   /* lookup-script "answer": the lookup's own answer */
    unsigned delay_ms;
    enum drop drop;
    char retry_after[RA_MAX];       /* "" = no Retry-After */
};

struct script {                     /* FIFO ring of scripted answers */
    struct answer *items;
    size_t head, len, cap;
};

struct kentry {                     /* key == NULL: free slot */
    uint64_t hash;
    char *key;
    uint32_t len;
    uint32_t count;
    uint32_t first;                 /* side effects map: 1 + index of its first effect, 0 = none */
    uint32_t dedup;                 /* side effects map: requests --honour-idempotency deduplicated */
};

/* One side effect of a keyed request: when it arrived and when its answer went out, for
 * GET /_stub/keys/<key>; with --honour-idempotency also the answer a repeat gets. */
struct effect {
    uint64_t seq;
    uint64_t recv_ns, done_ns;      /* CLOCK_MONOTONIC; done_ns 0 = still being answered */
    uint32_t next;                  /* 1 + index of the key's next side effect, 0 = last */
    int status;
    bool answered;                  /* the answer (or the drop) was sent, not abandoned */
    bool peer_gone;                 /* the client had closed its side before the answer */
    bool fill;                      /* stored answer: `fill_len` bytes of 'x'... */
    uint64_t fill_len;
    char *saved;                    /* ...or: Content-Type, NUL, body (saved_len bytes) */
    size_t saved_len;
};

struct arena_block {                /* key bytes live here, so 10^6 keys are not 10^6 mallocs */
    struct arena_block *next;
    size_t used, cap;
    char data[];
};

struct keymap {                     /* Idempotency-Key -> side effects; open addressing */
    struct kentry *slots;
    size_t cap, used;
    struct arena_block *arena;
    uint32_t max_count;
    uint64_t duplicates;            /* keys whose count went past 1 */
};

struct counters {
    uint64_t requests, accepted, rejected, side_effects;
    long in_flight, in_flight_max;
};

struct worker;

/* The configuration, plus what all workers share. Fields after `lock` are guarded by it. */
struct stub {
    const char *listen;
    const char *tls_cert, *tls_key;
    const char *client_ca;  /* --tls-client-ca: require a client certificate it signed */
    double max_rate;                /* 0 = no ceiling */
    unsigned burst;
    unsigned quota_window_s;        /* --quota-window: its fixed windows' length */
    int quota_style;                /* --quota-style: enum quota_style */
    long long body_size;            /* -1 = echo */
    int threads;
    unsigned delay_ms;              /* --delay-ms: default answer delay of plain requests */
    bool honour;                    /* --honour-idempotency */
    const char *lookup;             /* --lookup PREFIX: GET/HEAD PREFIX<key> is a lookup; NULL off */
    SSL_CTX *tls;
    struct worker *workers;

    pthread_mutex_t lock;
    struct counters n;
    uint64_t tat_ns;                /* GCRA theoretical arrival time of the --max-rate bucket */
    uint64_t quota;                 /* --quota / POST /_stub/quota: per window; 0 = none */
    uint64_t quota_epoch_ns;        /* windows are counted from here (start, reset) */
    uint64_t quota_window, quota_used; /* the current window's index and its requests */
    uint64_t quota_refused;         /* plain requests refused beyond the quota */
    struct keymap keys;
    struct keymap calls;            /* Idempotency-Key -> plain requests received, any answer */
    struct script script;
    struct answer window;           /* POST /_stub/window: the answer to everything until... */
    uint64_t window_until_ns;       /* ...this CLOCK_MONOTONIC time (0 = no window) */
    uint64_t window_hits;
    uint64_t *arrivals;
    size_t n_arrivals, cap_arrivals;
    bool warned_oom;
    struct effect *effects;         /* every keyed side effect, in order */
    size_t n_effects, cap_effects;
    uint64_t effects_gen;           /* bumped by a reset: older indexes in requests are stale */
    uint64_t dedup_replays, dedup_conflicts;
    struct script lookup_script;    /* POST /_stub/lookup-script */
    struct keymap lookup_keys;      /* key -> lookups made for it */
    uint64_t lookups, lookups_found, lookups_absent;
};

struct conn;

struct worker {                     /* one thread, one loop, one listening socket */
    struct stub *st;
    struct event_base *base;
    struct evconnlistener *listener;
    struct event *resume;           /* re-enables the listener after accept() failed */
    struct event *stop;             /* activated to end the loop, from any thread */
    struct event *sigint, *sigterm; /* worker 0 only */
    struct conn *conns;             /* every open connection, so shutdown can free them */
    pthread_t thread;
};

struct hdr {                        /* offsets into req.buf */
    uint32_t name_off, name_len, val_off, val_len;
};

enum hslot {
    H_HOST, H_CTYPE, H_IKEY, H_EXPECT, H_STATUS, H_DELAY, H_RETRY, H_SET_HEADER, H_ECHO,
    H_BODY_SIZE, H_DROP, H_GARBAGE, H_CHUNKED, H_COUNT
};

enum body_kind { BODY_ECHO, BODY_JSON, BODY_FILL, BODY_TEXT, BODY_TMP /* conn.tmp, req.ctype */ };

/* How a plain request will be answered, decided once the request is complete. */
struct plan {
    int status;
    unsigned delay_ms;
    enum drop drop;
    const char *retry_after;        /* into req.buf or req.ra; NULL = none */
    size_t retry_after_len;
    enum body_kind body;
    uint64_t fill;
    const char *text;               /* BODY_TEXT */
    bool chunked;
    bool set_headers;               /* send the X-Stub-Set-Header lines (all were valid) */
    bool replayed;                  /* --honour-idempotency: a stored answer, no side effect */
    const char *lookup;             /* a lookup's X-Stub-Lookup: found, absent or scripted */
    uint64_t effect_seq;            /* found: the X-Stub-Seq of the key's first side effect */
};

/* The request being read; its buffers are reused by the next request on the connection. */
struct req {
    char *buf;                      /* request target, then header names and values, as received */
    size_t len, cap;
    struct hdr *hdrs;
    size_t nhdrs, hcap;
    size_t head_hdrs;               /* headers before the body; the rest are chunked trailers */
    size_t url_len;                 /* the target is buf[0, url_len) */
    int slot[H_COUNT];              /* first header of each kind, -1 if absent */
    bool in_value;
    bool control, lookup, accepted, in_flight, keep_alive;
    int error;                      /* status for a request we refused while parsing */
    uint64_t seq;
    uint64_t recv_ns;               /* CLOCK_MONOTONIC when the headers were complete */
    bool quota_refused;             /* beyond the window's quota: 429 */
    uint64_t q_limit, q_remaining, q_reset_s; /* the quota headers of its answer; q_limit 0:
                                               * none */
    uint64_t q_end_ns;              /* its window's end, CLOCK_MONOTONIC */
    uint32_t effect;                /* 1 + index of its side effect in stub.effects, 0 = none */
    uint64_t effect_gen;            /* stub.effects_gen when `effect` was set */
    struct evbuffer *body;
    struct plan plan;
    char ra[RA_MAX];                /* Retry-After of a scripted answer */
    char ctype[256];                /* Content-Type of a BODY_TMP answer */
    size_t ctype_len;
};

enum conn_state {
    C_READING,                      /* parsing requests */
    C_PENDING,                      /* a complete request waits for its delayed answer */
    C_CLOSING,                      /* flushing the last bytes before closing */
    C_LINGER                        /* write side shut; discarding input until EOF or timeout */
};

struct conn {
    struct worker *w;
    struct conn *prev, *next;
    struct bufferevent *bev;
    struct event *timer;            /* the delayed answer, then the linger timeout */
    http_parser parser;
    enum conn_state state;
    bool peer_eof;                  /* the peer sent FIN: answer what is pending, then close */
    bool stalled;                   /* parsing stopped until the output drains */
    bool handshaken;                /* TLS: the handshake is done */
    struct req req;
    struct evbuffer *tmp;           /* JSON bodies are built here to learn their length */
};

static void process_input(struct conn *c);
static bool hval(const struct req *r, enum hslot s, const char **v, size_t *n);

/* ---- small helpers -------------------------------------------------------------------------- */

static uint64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void timer_after_ms(struct event *ev, unsigned ms)
{
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (suseconds_t)(ms % 1000) * 1000};

    evtimer_add(ev, &tv);
}

/* Parses n decimal digits (no sign, no spaces) into *out; false if empty, not digits, over max. */
static bool parse_uint(const char *s, size_t n, uint64_t max, uint64_t *out)
{
    uint64_t v = 0;

    if (n == 0 || n > 19)
        return false;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    if (v > max)
        return false;
    *out = v;
    return true;
}

/* A final status the stub may answer with: 1xx would leave the client waiting for another. */
static bool parse_status(const char *s, size_t n, int *status)
{
    uint64_t v;

    if (n != 3 || !parse_uint(s, n, 999, &v) || v < 200)
        return false;
    *status = (int)v;
    return true;
}

static bool mem_ieq(const char *a, size_t n, const char *lit)
{
    return strlen(lit) == n && strncasecmp(a, lit, n) == 0;
}

static void put(struct evbuffer *o, const char *s)
{
    evbuffer_add(o, s, strlen(s));
}

static void put_u(struct evbuffer *o, uint64_t v)
{
    char b[24], *p = b + sizeof b;

    do {
        *--p = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    evbuffer_add(o, p, (size_t)(b + sizeof b - p));
}

static void put_header(struct evbuffer *o, const char *name, const char *val, size_t len)
{
    put(o, name);
    evbuffer_add(o, ": ", 2);
    evbuffer_add(o, val, len);
    evbuffer_add(o, "\r\n", 2);
}

/* Appends n bytes of 'x'; big bodies are references to one static block, never copies. */
static void put_fill(struct evbuffer *o, uint64_t n)
{
    while (n > 0) {
        size_t k = n < FILL_BLOCK ? (size_t)n : FILL_BLOCK;

        if (k <= 4096)
            evbuffer_add(o, fill_block, k);
        else
            evbuffer_add_reference(o, fill_block, k, NULL, NULL);
        n -= k;
    }
}

/* Length of the well-formed UTF-8 sequence at s (1-4), or 0 if it is not one. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    size_t len;
    uint32_t cp;

    if (s[0] < 0xc2 || s[0] > 0xf4)
        return 0;
    len = s[0] < 0xe0 ? 2 : s[0] < 0xf0 ? 3 : 4;
    if (n < len)
        return 0;
    cp = s[0] & (0x3f >> (len - 1));
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    if (len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff)))
        return 0;                   /* overlong, or a surrogate */
    if (len == 4 && (cp < 0x10000 || cp > 0x10ffff))
        return 0;
    return len;
}

/* Appends s as a JSON string. Bytes that are not UTF-8 become \u00XX (their Latin-1 reading), so
 * the output is always valid JSON, even for obs-text header values. */
static void put_json_str(struct evbuffer *o, const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0;
    char esc[8];

    evbuffer_add(o, "\"", 1);
    while (i < n) {
        size_t k = u[i] >= 0x80 ? utf8_len(u + i, n - i)
                                : (size_t)(u[i] >= 0x20 && u[i] != '"' && u[i] != '\\');

        if (k > 0) {
            i += k;
            continue;
        }
        evbuffer_add(o, s + run, i - run);
        if (u[i] == '"' || u[i] == '\\')
            snprintf(esc, sizeof esc, "\\%c", u[i]);
        else
            snprintf(esc, sizeof esc, "\\u%04x", u[i]);
        put(o, esc);
        run = ++i;
    }
    evbuffer_add(o, s + run, n - run);
    evbuffer_add(o, "\"", 1);
}

static const char *reason(int status)
{
    switch (status) {
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 301: return "Moved Permanently";
    case 302: return "Found";
    case 304: return "Not Modified";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 413: return "Content Too Large";
    case 422: return "Unprocessable Content";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "Status";
    }
}

/* ---- the key map ---------------------------------------------------------------------------- */

static uint64_t hash_key(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;

    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    /* FNV's low bits are weak and the table indexes with them: finish with a mixer. */
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

/* The slot holding key, or the free slot where it belongs. The table is never full. */
static struct kentry *keymap_slot(const struct keymap *m, const char *k, size_t n, uint64_t h)
{
    size_t mask = m->cap - 1;

    for (size_t i = h & mask;; i = (i + 1) & mask) {
        struct kentry *e = &m->slots[i];

        if (!e->key || (e->hash == h && e->len == n && memcmp(e->key, k, n) == 0))
            return e;
    }
}

static int keymap_grow(struct keymap *m)
{
    struct keymap bigger = *m;

    bigger.cap = m->cap ? m->cap * 2 : 1024;
    bigger.slots = calloc(bigger.cap, sizeof *bigger.slots);
    if (!bigger.slots)
        return -ENOMEM;
    for (size_t i = 0; i < m->cap; i++)
        if (m->slots[i].key)
            *keymap_slot(&bigger, m->slots[i].key, m->slots[i].len, m->slots[i].hash) = m->slots[i];
    free(m->slots);
    *m = bigger;
    return 0;
}

static char *arena_copy(struct keymap *m, const char *k, size_t n)
{
    struct arena_block *b = m->arena;

    if (!b || b->cap - b->used < n) {
        size_t cap = n > (1u << 20) ? n : (1u << 20);

        b = malloc(sizeof *b + cap);
        if (!b)
            return NULL;
        b->next = m->arena;
        b->used = 0;
        b->cap = cap;
        m->arena = b;
    }
    memcpy(b->data + b->used, k, n);
    b->used += n;
    return b->data + b->used - n;
}

/* Counts one more for key; its entry, or NULL when out of memory. */
static struct kentry *keymap_bump(struct keymap *m, const char *k, size_t n)
{
    uint64_t h = hash_key(k, n);
    struct kentry *e;

    if ((m->used + 1) * 4 > m->cap * 3 && keymap_grow(m) < 0)
        return NULL;
    e = keymap_slot(m, k, n, h);
    if (!e->key) {
        e->key = arena_copy(m, k, n);
        if (!e->key)
            return NULL;
        e->hash = h;
        e->len = (uint32_t)n;
        m->used++;
    }
    if (++e->count == 2)
        m->duplicates++;
    if (e->count > m->max_count)
        m->max_count = e->count;
    return e;
}

/* key's entry, or NULL if the key was never counted. */
static struct kentry *keymap_find(const struct keymap *m, const char *k, size_t n)
{
    struct kentry *e = m->cap ? keymap_slot(m, k, n, hash_key(k, n)) : NULL;

    return e && e->key ? e : NULL;
}

static uint32_t keymap_count(const struct keymap *m, const char *k, size_t n)
{
    struct kentry *e = keymap_find(m, k, n);

    return e ? e->count : 0;
}

static void keymap_clear(struct keymap *m)
{
    while (m->arena) {
        struct arena_block *next = m->arena->next;

        free(m->arena);
        m->arena = next;
    }
    free(m->slots);
    memset(m, 0, sizeof *m);
}

/* ---- the script ----------------------------------------------------------------------------- */

static int script_push(struct script *s, const struct answer *a)
{
    if (s->len == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        struct answer *items = malloc(cap * sizeof *items);

        if (!items)
            return -ENOMEM;
        for (size_t i = 0; i < s->len; i++)
            items[i] = s->items[(s->head + i) % s->cap];
        free(s->items);
        s->items = items;
        s->head = 0;
        s->cap = cap;
    }
    s->items[(s->head + s->len) % s->cap] = *a;
    s->len++;
    return 0;
}

static bool script_pop(struct script *s, struct answer *a)
{
    if (s->len == 0)
        return false;
    *a = s->items[s->head];
    s->head = (s->head + 1) % s->cap;
    s->len--;
    return true;
}

static void script_clear(struct script *s)
{
    free(s->items);
    memset(s, 0, sizeof *s);
}

/* Splits the next whitespace-separated token off [*p, end); a double-quoted part may hold spaces
 * (an HTTP-date Retry-After). Returns false at the end of the line. */
static bool next_token(const char **p, const char *end, const char **tok, size_t *len)
{
    const char *s = *p;
    bool quoted = false;

    while (s < end && (*s == ' ' || *s == '\t'))
        s++;
    if (s == end)
        return false;
    *tok = s;
    for (; s < end && (quoted || (*s != ' ' && *s != '\t')); s++)
        if (*s == '"')
            quoted = !quoted;
    *len = (size_t)(s - *tok);
    *p = s;
    return true;
}

/* One option token of a script line (everything after STATUS and DELAY_MS). */
static const char *script_option(const char *t, size_t n, struct answer *a)
{
    if (mem_ieq(t, n, "drop") || mem_ieq(t, n, "drop=before"))
        a->drop = DROP_BEFORE;
    else if (mem_ieq(t, n, "drop=unexecuted"))
        a->drop = DROP_UNEXECUTED;
    else if (mem_ieq(t, n, "drop=mid"))
        a->drop = DROP_MID;
    else if (mem_ieq(t, n, "garbage"))
        a->drop = DROP_GARBAGE;
    else if (n > 12 && strncasecmp(t, "retry-after=", 12) == 0) {
        t += 12;
        n -= 12;
        if (n >= 2 && t[0] == '"' && t[n - 1] == '"') {
            t++;
            n -= 2;
        }
        if (n == 0 || n >= RA_MAX)
            return "retry-after value empty or too long";
        for (size_t i = 0; i < n; i++)
            if ((unsigned char)t[i] < 0x20 || t[i] == '"')
                return "retry-after value has a control character or a quote";
        memcpy(a->retry_after, t, n);
        a->retry_after[n] = '\0';
    } else
        return "unknown option";
    return NULL;
}

/* Parses "STATUS [DELAY_MS] [retry-after=V] [drop[=before|mid|unexecuted]] [garbage]"; NULL or why
 * not. With `natural`, STATUS may be the word "answer" (a lookup's own answer). */
static const char *script_parse_line(const char *s, const char *end, struct answer *a,
                                     bool natural)
{
    const char *t;
    size_t n;
    uint64_t delay;
    const char *err;

    memset(a, 0, sizeof *a);
    if (!next_token(&s, end, &t, &n))
        return "STATUS must be a three-digit status from 200 to 999";
    if (natural && mem_ieq(t, n, "answer"))
        a->natural = true;
    else if (!parse_status(t, n, &a->status))
        return natural ? "STATUS must be 'answer' or a three-digit status from 200 to 999"
                       : "STATUS must be a three-digit status from 200 to 999";
    if (!next_token(&s, end, &t, &n))
        return NULL;
    if (t[0] >= '0' && t[0] <= '9') {
        if (!parse_uint(t, n, MAX_DELAY_MS, &delay))
            return "DELAY_MS must be a number of milliseconds up to 3600000";
        a->delay_ms = (unsigned)delay;
        if (!next_token(&s, end, &t, &n))
            return NULL;
    }
    do {
        if ((err = script_option(t, n, a)))
            return err;
    } while (next_token(&s, end, &t, &n));
    return NULL;
}

/* ---- shared state --------------------------------------------------------------------------- */

/* GCRA: one token per 1/max_rate seconds, at most `burst` banked. */
static bool bucket_take(struct stub *st, uint64_t now)
{
    uint64_t interval = (uint64_t)(1e9 / st->max_rate);
    uint64_t tolerance = interval * (st->burst - 1);

    if (now + tolerance < st->tat_ns)
        return false;
    st->tat_ns = (st->tat_ns > now ? st->tat_ns : now) + interval;
    return true;
}

static void warn_oom(struct stub *st, const char *what)
{
    if (!st->warned_oom)
        fprintf(stderr, "sluice-stub: out of memory: %s no longer recorded exactly\n", what);
    st->warned_oom = true;
}

static void arrivals_push(struct stub *st, uint64_t now)
{
    if (st->n_arrivals == st->cap_arrivals) {
        size_t cap = st->cap_arrivals ? st->cap_arrivals * 2 : 4096;
        uint64_t *v;

        if (cap > MAX_ARRIVALS)
            cap = MAX_ARRIVALS;
        if (cap == st->cap_arrivals)
            return;                 /* full: the README documents the cap */
        v = realloc(st->arrivals, cap * sizeof *v);
        if (!v) {
            warn_oom(st, "arrivals");
            return;
        }
        st->arrivals = v;
        st->cap_arrivals = cap;
    }
    st->arrivals[st->n_arrivals++] = now;
}

/* --quota: fixed windows of quota_window_s from quota_epoch_ns; a plain request counts in its
 * window, or is refused beyond the quota (under st->lock). Its answer tells what remains and
 * when the window ends, as the partners do. */
static void quota_admit(struct stub *st, struct req *r, uint64_t now)
{
    uint64_t w = (uint64_t)st->quota_window_s * 1000000000ull, idx, end;

    r->q_limit = st->quota;
    r->quota_refused = false;
    if (!st->quota)
        return;
    idx = (now - st->quota_epoch_ns) / w;
    end = st->quota_epoch_ns + (idx + 1) * w;
    if (idx != st->quota_window) {
        st->quota_window = idx;
        st->quota_used = 0;
    }
    r->quota_refused = st->quota_used >= st->quota;
    if (!r->quota_refused)
        st->quota_used++;
    else
        st->quota_refused++;
    r->q_remaining = st->quota - (st->quota_used < st->quota ? st->quota_used : st->quota);
    r->q_reset_s = (end - now + 999999999ull) / 1000000000ull;
    r->q_end_ns = end;
}

/* The quota headers of an answer, in the style asked for (--quota-style). */
static void put_quota_headers(struct evbuffer *o, const struct req *r, int style,
                              unsigned window_s)
{
    unsigned long long q = r->q_limit, rem = r->q_remaining, t = r->q_reset_s;
    struct timespec ts;

    if (!q)
        return;
    if (style == 0) {
        evbuffer_add_printf(o, "RateLimit-Policy: \"stub\";q=%llu;w=%u\r\n"
                               "RateLimit: \"stub\";r=%llu;t=%llu\r\n", q, window_s, rem, t);
    } else if (style == 1) {
        evbuffer_add_printf(o, "RateLimit-Limit: %llu;w=%u\r\nRateLimit-Remaining: %llu\r\n"
                               "RateLimit-Reset: %llu\r\n", q, window_s, rem, t);
    } else {
        /* The window's end as a Unix time, rounded up: the stub's windows are not aligned
         * to wall-clock seconds, and a partner's reset is never before its window ends. */
        uint64_t left = r->q_end_ns > now_ns() ? r->q_end_ns - now_ns() : 0;

        clock_gettime(CLOCK_REALTIME, &ts);
        evbuffer_add_printf(o, "X-RateLimit-Limit: %llu\r\nX-RateLimit-Remaining: %llu\r\n"
                               "X-RateLimit-Reset: %llu\r\n", q, rem,
                            (unsigned long long)(((uint64_t)ts.tv_sec * 1000000000ull +
                                                  (uint64_t)ts.tv_nsec + left + 999999999ull) /
                                                 1000000000ull));
        (void)t;
    }
}

/* A plain request's headers are complete: number it, count it as a call of its key (whatever
 * its answer: how an experiment sees the most attempts one job used), apply --max-rate, record
 * its arrival. */
static void stub_admit(struct stub *st, struct req *r)
{
    uint64_t now = now_ns();
    const char *key;
    size_t key_len;

    pthread_mutex_lock(&st->lock);
    r->seq = ++st->n.requests;
    r->recv_ns = now;
    r->effect = 0;
    if (hval(r, H_IKEY, &key, &key_len) && key_len > 0 && !keymap_bump(&st->calls, key, key_len))
        warn_oom(st, "calls per key");
    quota_admit(st, r, now);
    if ((st->max_rate > 0 && !bucket_take(st, now)) || r->quota_refused) {
        st->n.rejected++;
    } else {
        st->n.accepted++;
        r->accepted = r->in_flight = true;
        if (++st->n.in_flight > st->n.in_flight_max)
            st->n.in_flight_max = st->n.in_flight;
        arrivals_push(st, now);
    }
    pthread_mutex_unlock(&st->lock);
}

/* A scripted (or window) answer replaces the plan's status, delay, Retry-After and drop. */
static void apply_answer(struct req *r, const struct answer *a)
{
    struct plan *p = &r->plan;

    p->status = a->status;
    p->delay_ms = a->delay_ms;
    p->drop = a->drop;
    memcpy(r->ra, a->retry_after, sizeof r->ra);
    p->retry_after = r->ra[0] ? r->ra : NULL;
    p->retry_after_len = strlen(r->ra);
}

static void put_echo_json(struct conn *c, struct evbuffer *o);

/* The Content-Type a plain answer of this plan carries (BODY_TEXT's is fixed). */
static void answer_ctype(const struct req *r, const struct plan *p, const char **ct, size_t *n)
{
    *ct = "application/octet-stream";
    *n = 24;
    if (p->body == BODY_JSON) {
        *ct = "application/json";
        *n = 16;
    } else if (p->body == BODY_TMP) {
        *ct = r->ctype;
        *n = r->ctype_len;
    } else {
        hval(r, H_CTYPE, ct, n);
    }
}

/* --honour-idempotency and --lookup: keeps the answer of a side effect, so that a repeat of its key
 * (or a lookup of it) gets it again. Out of memory: the effect is kept without an answer (a repeat
 * then replays no body). */
static void effect_save_answer(struct conn *c, struct effect *f)
{
    struct req *r = &c->req;
    const struct plan *p = &r->plan;
    const char *ct;
    size_t ct_len, len;
    struct evbuffer *src = r->body;

    f->status = p->status;
    if (p->body == BODY_FILL) {
        f->fill = true;
        f->fill_len = p->fill;
        return;
    }
    if (p->body == BODY_JSON) {
        put_echo_json(c, c->tmp);
        src = c->tmp;
    }
    answer_ctype(r, p, &ct, &ct_len);
    if (ct_len >= sizeof r->ctype)
        ct_len = sizeof r->ctype - 1;
    len = evbuffer_get_length(src);
    if ((f->saved = malloc(ct_len + 1 + len + 1))) {
        memcpy(f->saved, ct, ct_len);
        f->saved[ct_len] = '\0';
        evbuffer_copyout(src, f->saved + ct_len + 1, len);
        f->saved_len = len;
    } else {
        warn_oom(c->w->st, "stored answers");
    }
    if (src == c->tmp)
        evbuffer_drain(c->tmp, evbuffer_get_length(c->tmp));
}

/* Records a side effect of key (entry e) for GET /_stub/keys/<key>. Called with the lock held. */
static void effect_add(struct conn *c, struct kentry *e)
{
    struct stub *st = c->w->st;
    struct req *r = &c->req;
    struct effect *f;

    if (st->n_effects == st->cap_effects) {
        size_t cap = st->cap_effects ? st->cap_effects * 2 : 4096;
        struct effect *v = cap <= UINT32_MAX ? realloc(st->effects, cap * sizeof *v) : NULL;

        if (!v) {
            warn_oom(st, "side effect times");
            return;
        }
        st->effects = v;
        st->cap_effects = cap;
    }
    f = &st->effects[st->n_effects++];
    *f = (struct effect){.seq = r->seq, .recv_ns = r->recv_ns, .status = r->plan.status};
    if (!e->first) {
        e->first = (uint32_t)st->n_effects;
    } else {
        struct effect *last = &st->effects[e->first - 1];

        while (last->next)
            last = &st->effects[last->next - 1];
        last->next = (uint32_t)st->n_effects;
    }
    r->effect = (uint32_t)st->n_effects;
    r->effect_gen = st->effects_gen;
    if (st->honour || st->lookup)
        effect_save_answer(c, f);
}

/* The body and Content-Type of side effect f's stored answer, for a replay or a lookup. */
static void plan_stored_body(struct conn *c, const struct effect *f)
{
    struct req *r = &c->req;
    struct plan *p = &r->plan;

    if (f->fill) {
        p->body = BODY_FILL;
        p->fill = f->fill_len;
    } else {
        const char *ct = f->saved ? f->saved : "application/octet-stream";

        p->body = BODY_TMP;
        r->ctype_len = strlen(ct);
        memcpy(r->ctype, ct, r->ctype_len + 1);
        if (f->saved)
            evbuffer_add(c->tmp, f->saved + r->ctype_len + 1, f->saved_len);
    }
}

/* --honour-idempotency, for a request whose key already had a side effect f: the stored answer
 * again if f's answer is out, else 409 "in progress" (Stripe's idempotency_key_in_use). The
 * request's own delay and drop still apply to a replay. */
static void plan_dedup(struct conn *c, const struct effect *f)
{
    static const char busy[] =
        "{\"error\":\"idempotency_key_in_use\",\"message\":\"another request with this "
        "Idempotency-Key is still in progress; retry later\"}";
    struct req *r = &c->req;
    struct plan *p = &r->plan;
    struct stub *st = c->w->st;

    evbuffer_drain(c->tmp, evbuffer_get_length(c->tmp));
    if (!f->done_ns) {
        st->dedup_conflicts++;
        p->status = 409;
        p->delay_ms = 0;
        memcpy(r->ra, "1", 2);
        p->retry_after = r->ra;
        p->retry_after_len = 1;
        p->body = BODY_TMP;
        p->chunked = false;
        evbuffer_add(c->tmp, busy, sizeof busy - 1);
        memcpy(r->ctype, "application/json", 17);
        r->ctype_len = 16;
        return;
    }
    st->dedup_replays++;
    p->status = f->status;
    p->replayed = true;
    plan_stored_body(c, f);
}

/* The request is complete and its plan made: a scripted answer replaces the plan's status, delay,
 * Retry-After and drop; then the side effect, if any, is counted. The work "happens" here: a delay
 * only postpones the answer, so a client that gives up during it still leaves a side effect.
 * With --honour-idempotency, a request whose key already had a side effect has none: it gets the
 * stored answer or a 409 instead (plan_dedup). */
static void stub_commit(struct conn *c, const char *key, size_t key_len)
{
    struct stub *st = c->w->st;
    struct req *r = &c->req;
    struct plan *p = &r->plan;
    struct answer a;
    struct kentry *e;
    bool effect;

    pthread_mutex_lock(&st->lock);
    if (st->window_until_ns && now_ns() < st->window_until_ns) {
        a = st->window;             /* a window outranks the script and leaves it untouched */
        st->window_hits++;
        apply_answer(r, &a);
    } else if (script_pop(&st->script, &a)) {
        apply_answer(r, &a);
    }
    effect = (p->status < 400 || p->drop != DROP_NONE) && p->drop != DROP_UNEXECUTED;
    if (effect && key && st->honour && (e = keymap_find(&st->keys, key, key_len)) && e->first) {
        e->dedup++;
        plan_dedup(c, &st->effects[e->first - 1]);
        effect = false;
    }
    if (effect) {
        st->n.side_effects++;
        if (key && !(e = keymap_bump(&st->keys, key, key_len)))
            warn_oom(st, "idempotency keys");
        else if (key)
            effect_add(c, e);
    }
    pthread_mutex_unlock(&st->lock);
}

/* The request's answer went out, or never will (`answered` false: the connection went first):
 * it is no longer in flight, and its side effect, if any, is done. */
static void stub_done(struct conn *c, bool answered)
{
    struct stub *st = c->w->st;
    struct req *r = &c->req;

    if (!r->in_flight)
        return;
    r->in_flight = false;
    pthread_mutex_lock(&st->lock);
    st->n.in_flight--;
    if (r->effect && r->effect_gen == st->effects_gen && r->effect <= st->n_effects) {
        struct effect *f = &st->effects[r->effect - 1];

        f->done_ns = now_ns();
        f->answered = answered;
        f->peer_gone = c->peer_eof;
    }
    r->effect = 0;
    pthread_mutex_unlock(&st->lock);
}

static void effects_clear(struct stub *st)
{
    for (size_t i = 0; i < st->n_effects; i++)
        free(st->effects[i].saved);
    free(st->effects);
    st->effects = NULL;
    st->n_effects = st->cap_effects = 0;
    st->effects_gen++;
}

static void stub_reset(struct stub *st)
{
    pthread_mutex_lock(&st->lock);
    keymap_clear(&st->keys);
    keymap_clear(&st->calls);
    effects_clear(st);
    st->dedup_replays = st->dedup_conflicts = 0;
    script_clear(&st->script);
    script_clear(&st->lookup_script);
    keymap_clear(&st->lookup_keys);
    st->lookups = st->lookups_found = st->lookups_absent = 0;
    st->window_until_ns = st->window_hits = 0;
    st->quota_refused = 0;
    free(st->arrivals);
    st->arrivals = NULL;
    st->n_arrivals = st->cap_arrivals = 0;
    /* Requests still being answered will decrement in_flight: keep it, restart its maximum. */
    st->n = (struct counters){.in_flight = st->n.in_flight, .in_flight_max = st->n.in_flight};
    st->tat_ns = 0;
    st->warned_oom = false;
    pthread_mutex_unlock(&st->lock);
}

/* ---- request headers ------------------------------------------------------------------------ */

#define KNOWN(name, slot) {name, sizeof name - 1, slot}
static const struct {
    const char *name;               /* lower case */
    size_t len;
    enum hslot slot;
} known_headers[] = {
    KNOWN("host", H_HOST),
    KNOWN("content-type", H_CTYPE),
    KNOWN("idempotency-key", H_IKEY),
    KNOWN("expect", H_EXPECT),
    KNOWN("x-stub-status", H_STATUS),
    KNOWN("x-stub-delay-ms", H_DELAY),
    KNOWN("x-stub-retry-after", H_RETRY),
    KNOWN("x-stub-set-header", H_SET_HEADER),
    KNOWN("x-stub-echo", H_ECHO),
    KNOWN("x-stub-body-size", H_BODY_SIZE),
    KNOWN("x-stub-drop", H_DROP),
    KNOWN("x-stub-garbage", H_GARBAGE),
    KNOWN("x-stub-chunked", H_CHUNKED),
};
#undef KNOWN

/* Trims trailing whitespace off the values and notes where the first header of each kind is. */
static void index_headers(struct req *r)
{
    for (size_t i = 0; i < r->nhdrs; i++) {
        struct hdr *h = &r->hdrs[i];

        while (h->val_len > 0 && (r->buf[h->val_off + h->val_len - 1] == ' ' ||
                                  r->buf[h->val_off + h->val_len - 1] == '\t'))
            h->val_len--;
        for (size_t k = 0; k < sizeof known_headers / sizeof known_headers[0]; k++) {
            if (h->name_len == known_headers[k].len && r->slot[known_headers[k].slot] < 0 &&
                strncasecmp(r->buf + h->name_off, known_headers[k].name, h->name_len) == 0) {
                r->slot[known_headers[k].slot] = (int)i;
                break;
            }
        }
    }
    r->head_hdrs = r->nhdrs;
}

/* The value of the first header of a kind; false if absent. */
static bool hval(const struct req *r, enum hslot s, const char **v, size_t *n)
{
    const struct hdr *h;

    if (r->slot[s] < 0)
        return false;
    h = &r->hdrs[r->slot[s]];
    *v = r->buf + h->val_off;
    *n = h->val_len;
    return true;
}

static bool is_tchar(unsigned char ch)
{
    return ch > 0x20 && ch < 0x7f && !strchr("\"(),/:;<=>?@[\\]{}", ch);
}

/* "Name: value" with a token name: what X-Stub-Set-Header accepts. */
static bool valid_set_header(const char *v, size_t n)
{
    const char *colon = memchr(v, ':', n);

    if (!colon || colon == v)
        return false;
    for (const char *p = v; p < colon; p++)
        if (!is_tchar((unsigned char)*p))
            return false;
    return true;
}

/* ---- the plan of a plain request ------------------------------------------------------------ */

static void plan_error(struct plan *p, const char *text)
{
    *p = (struct plan){.status = 400, .body = BODY_TEXT, .text = text};
}

/* The answer's shape: --body-size, X-Stub-Echo, X-Stub-Body-Size, X-Stub-Chunked. */
static const char *plan_body(const struct stub *st, const struct req *r, struct plan *p)
{
    const char *v;
    size_t n;

    if (st->body_size >= 0) {
        p->body = BODY_FILL;
        p->fill = (uint64_t)st->body_size;
    }
    if (hval(r, H_BODY_SIZE, &v, &n)) {
        if (!parse_uint(v, n, MAX_FILL, &p->fill))
            return "invalid X-Stub-Body-Size\n";
        p->body = BODY_FILL;
    }
    if (hval(r, H_ECHO, &v, &n)) {
        if (!mem_ieq(v, n, "json"))
            return "invalid X-Stub-Echo (only \"json\")\n";
        p->body = BODY_JSON;
    }
    if (hval(r, H_CHUNKED, &v, &n)) {
        if (!mem_ieq(v, n, "1") && !mem_ieq(v, n, "0"))
            return "invalid X-Stub-Chunked (1 or 0)\n";
        p->chunked = v[0] == '1';
    }
    return NULL;
}

/* Status, delay, Retry-After and drop from the headers; a script line may replace them. */
static const char *plan_outcome(const struct req *r, struct plan *p)
{
    const char *v;
    size_t n;
    uint64_t delay;

    if (hval(r, H_STATUS, &v, &n) && !parse_status(v, n, &p->status))
        return "invalid X-Stub-Status (200-999)\n";
    if (hval(r, H_DELAY, &v, &n)) {
        if (!parse_uint(v, n, MAX_DELAY_MS, &delay))
            return "invalid X-Stub-Delay-Ms (0-3600000)\n";
        p->delay_ms = (unsigned)delay;
    }
    if (hval(r, H_RETRY, &p->retry_after, &p->retry_after_len) && p->retry_after_len == 0)
        p->retry_after = NULL;
    if (hval(r, H_DROP, &v, &n)) {
        if (mem_ieq(v, n, "before"))
            p->drop = DROP_BEFORE;
        else if (mem_ieq(v, n, "mid"))
            p->drop = DROP_MID;
        else if (mem_ieq(v, n, "unexecuted"))
            p->drop = DROP_UNEXECUTED;
        else
            return "invalid X-Stub-Drop (before, mid or unexecuted)\n";
    }
    if (hval(r, H_GARBAGE, &v, &n)) {
        if (!mem_ieq(v, n, "1") && !mem_ieq(v, n, "0"))
            return "invalid X-Stub-Garbage (1 or 0)\n";
        if (v[0] == '1')
            p->drop = DROP_GARBAGE;
    }
    return NULL;
}

/* Every X-Stub-Set-Header must be "Name: value". */
static const char *plan_set_headers(const struct req *r, struct plan *p)
{
    if (r->slot[H_SET_HEADER] < 0)
        return NULL;
    p->set_headers = true;
    for (size_t i = (size_t)r->slot[H_SET_HEADER]; i < r->head_hdrs; i++) {
        const struct hdr *h = &r->hdrs[i];

        if (mem_ieq(r->buf + h->name_off, h->name_len, "x-stub-set-header") &&
            !valid_set_header(r->buf + h->val_off, h->val_len))
            return "invalid X-Stub-Set-Header (Name: value)\n";
    }
    return NULL;
}

/* Decides the answer of a complete, accepted plain request and counts its side effect. */
static void plan_request(struct conn *c)
{
    struct stub *st = c->w->st;
    struct req *r = &c->req;
    struct plan *p = &r->plan;
    const char *err, *key = NULL;
    size_t key_len = 0;

    *p = (struct plan){.status = 200, .body = BODY_ECHO, .delay_ms = st->delay_ms};
    if ((err = plan_body(st, r, p)) || (err = plan_outcome(r, p)) ||
        (err = plan_set_headers(r, p))) {
        plan_error(p, err);         /* a test bug: no side effect, no script line consumed */
        return;
    }
    if (!hval(r, H_IKEY, &key, &key_len) || key_len == 0)
        key = NULL;
    stub_commit(c, key, key_len);
}

/* ---- lookups --------------------------------------------------------------------------------- */

static size_t pct_decode(char *s, size_t n);

/* A GET or HEAD whose target starts with the --lookup prefix. */
static bool is_lookup(const struct conn *c)
{
    const struct stub *st = c->w->st;
    const struct req *r = &c->req;
    size_t n = st->lookup ? strlen(st->lookup) : 0;

    return st->lookup && (c->parser.method == HTTP_GET || c->parser.method == HTTP_HEAD) &&
           r->url_len >= n && memcmp(r->buf, st->lookup, n) == 0;
}

/* A short JSON body for a lookup answer that has no stored one. */
static void plan_json(struct conn *c, int status, const char *json)
{
    struct req *r = &c->req;

    r->plan.status = status;
    r->plan.body = BODY_TMP;
    evbuffer_add(c->tmp, json, strlen(json));
    memcpy(r->ctype, "application/json", 17);
    r->ctype_len = 16;
}

/* The lookup's own answer for key: 200 with the stored answer of its first side effect, or 404.
 * Called with the lock held. */
static void plan_lookup_answer(struct conn *c, const char *key, size_t n)
{
    struct stub *st = c->w->st;
    const struct kentry *e = n ? keymap_find(&st->keys, key, n) : NULL;

    if (e && e->first) {
        const struct effect *f = &st->effects[e->first - 1];

        st->lookups_found++;
        c->req.plan.lookup = "found";
        c->req.plan.effect_seq = f->seq;
        plan_stored_body(c, f);
        return;
    }
    st->lookups_absent++;
    c->req.plan.lookup = "absent";
    plan_json(c, 404, "{\"error\":\"not_found\"}");
}

/* The answer of a lookup (the key is the rest of the target up to '?', '&' or '#',
 * percent-decoded): a lookup-script line with a status answers that; otherwise (or with
 * "answer", whose delay and drop still apply) the lookup's own answer. A lookup has no side effect
 * and moves none of the plain requests' counters, the script or the --max-rate bucket. */
static void plan_lookup(struct conn *c)
{
    struct stub *st = c->w->st;
    struct req *r = &c->req;
    size_t plen = strlen(st->lookup), n = 0;
    char *key = malloc(r->url_len - plen + 1);
    struct answer a = {0};

    r->plan = (struct plan){.status = 200, .body = BODY_TMP};
    evbuffer_drain(c->tmp, evbuffer_get_length(c->tmp));
    if (!key) {
        plan_error(&r->plan, "out of memory\n");
        return;
    }
    while (plen + n < r->url_len && !strchr("?&#", r->buf[plen + n]))
        n++;
    memcpy(key, r->buf + plen, n);
    n = pct_decode(key, n);
    pthread_mutex_lock(&st->lock);
    st->lookups++;
    if (n && !keymap_bump(&st->lookup_keys, key, n))
        warn_oom(st, "lookups per key");
    if (script_pop(&st->lookup_script, &a) && !a.natural) {
        apply_answer(r, &a);
        r->plan.lookup = "scripted";
        plan_json(c, a.status, "{\"error\":\"scripted\"}");
    } else {
        plan_lookup_answer(c, key, n);
        if (a.natural) {
            r->plan.delay_ms = a.delay_ms;
            r->plan.drop = a.drop;
        }
    }
    pthread_mutex_unlock(&st->lock);
    free(key);
}

/* ---- writing answers ------------------------------------------------------------------------ */

static bool http10(const struct conn *c)
{
    return c->parser.http_major == 1 && c->parser.http_minor == 0;
}

static void head_start(struct evbuffer *o, int status)
{
    evbuffer_add(o, "HTTP/1.1 ", 9);
    put_u(o, (uint64_t)status);
    evbuffer_add(o, " ", 1);
    put(o, reason(status));
    evbuffer_add(o, "\r\n", 2);
}

/* Framing and connection headers, then the blank line. 204 and 304 have no body to frame. */
static void head_end(struct conn *c, struct evbuffer *o, int status, uint64_t len, bool chunked)
{
    if (chunked) {
        put(o, "Transfer-Encoding: chunked\r\n");
    } else if (status != 204 && status != 304) {
        evbuffer_add(o, "Content-Length: ", 16);
        put_u(o, len);
        evbuffer_add(o, "\r\n", 2);
    }
    if (!c->req.keep_alive)
        put(o, "Connection: close\r\n");
    else if (http10(c))
        put(o, "Connection: keep-alive\r\n");
    evbuffer_add(o, "\r\n", 2);
}

/* The body, from src (moved out of it) or, if src is NULL, `len` bytes of 'x'. */
static void put_body(struct evbuffer *o, struct evbuffer *src, uint64_t len, bool chunked)
{
    while (chunked && len > 0) {
        size_t k = len < CHUNK_MAX ? (size_t)len : CHUNK_MAX;

        evbuffer_add_printf(o, "%zx\r\n", k);
        if (src)
            evbuffer_remove_buffer(src, o, k);
        else
            put_fill(o, k);
        evbuffer_add(o, "\r\n", 2);
        len -= k;
    }
    if (chunked)
        evbuffer_add(o, "0\r\n\r\n", 5);
    else if (src)
        evbuffer_add_buffer(o, src);
    else
        put_fill(o, len);
}

/* A complete answer to any request: what plain answers and control endpoints have in common. */
static void write_answer(struct conn *c, int status, const char *ctype, size_t ctype_len,
                         struct evbuffer *src, uint64_t len, bool chunked)
{
    struct evbuffer *o = bufferevent_get_output(c->bev);
    bool bodiless = status == 204 || status == 304;
    bool has_body = c->parser.method != HTTP_HEAD && !bodiless;

    /* HTTP/1.0 has no chunked coding; a HEAD answer frames the body it does not send. */
    chunked = chunked && !http10(c) && !bodiless;
    if (ctype)
        put_header(o, "Content-Type", ctype, ctype_len);
    head_end(c, o, status, len, chunked);
    if (has_body)
        put_body(o, src, len, chunked);
    if (src)
        evbuffer_drain(src, evbuffer_get_length(src));
}

/* The JSON description of the request, for X-Stub-Echo: json. */
static void put_echo_json(struct conn *c, struct evbuffer *o)
{
    const struct req *r = &c->req;
    const char *method = http_method_str((enum http_method)c->parser.method);

    put(o, "{\"method\":");
    put_json_str(o, method, strlen(method));
    put(o, ",\"target\":");
    put_json_str(o, r->buf, r->url_len);
    put(o, ",\"headers\":[");
    for (size_t i = 0; i < r->head_hdrs; i++) {
        const struct hdr *h = &r->hdrs[i];

        put(o, i ? ",[" : "[");
        put_json_str(o, r->buf + h->name_off, h->name_len);
        put(o, ",");
        put_json_str(o, r->buf + h->val_off, h->val_len);
        put(o, "]");
    }
    put(o, "],\"body_len\":");
    put_u(o, evbuffer_get_length(r->body));
    put(o, "}");
}

/* The X-Stub-* observation headers, Retry-After and every X-Stub-Set-Header. */
static void put_plain_headers(struct conn *c, struct evbuffer *o)
{
    const struct req *r = &c->req;
    const char *method = http_method_str((enum http_method)c->parser.method);
    const char *host = "";
    size_t host_len = 0;

    put_header(o, "X-Stub-Method", method, strlen(method));
    put_header(o, "X-Stub-Target", r->buf, r->url_len);
    hval(r, H_HOST, &host, &host_len);
    put_header(o, "X-Stub-Host", host, host_len);
    if (r->plan.lookup) {
        put_header(o, "X-Stub-Lookup", r->plan.lookup, strlen(r->plan.lookup));
        if (r->plan.effect_seq) {
            evbuffer_add(o, "X-Stub-Effect-Seq: ", 19);
            put_u(o, r->plan.effect_seq);
            evbuffer_add(o, "\r\n", 2);
        }
    } else {
        evbuffer_add(o, "X-Stub-Seq: ", 12);
        put_u(o, r->seq);
        evbuffer_add(o, "\r\n", 2);
    }
    if (r->plan.retry_after)
        put_header(o, "Retry-After", r->plan.retry_after, r->plan.retry_after_len);
    put_quota_headers(o, r, c->w->st->quota_style, c->w->st->quota_window_s);
    if (r->plan.replayed)
        put(o, "Idempotent-Replayed: true\r\n");
    for (size_t i = r->plan.set_headers ? (size_t)r->slot[H_SET_HEADER] : r->head_hdrs;
         i < r->head_hdrs; i++) {
        const struct hdr *h = &r->hdrs[i];

        if (mem_ieq(r->buf + h->name_off, h->name_len, "x-stub-set-header")) {
            evbuffer_add(o, r->buf + h->val_off, h->val_len);
            evbuffer_add(o, "\r\n", 2);
        }
    }
}

static void conn_close_soon(struct conn *c);

/* Answers that are not answers: nothing, half a head, or bytes that are not HTTP. */
static void send_drop(struct conn *c, enum drop drop)
{
    struct evbuffer *o = bufferevent_get_output(c->bev);

    if (drop == DROP_MID) {
        head_start(o, c->req.plan.status);
        put(o, "Content-Type: application/oc");
    } else if (drop == DROP_GARBAGE) {
        put(o, "NOT HTTP\r\n\r\n");
    }
    evbuffer_drain(c->req.body, evbuffer_get_length(c->req.body));
    conn_close_soon(c);
}

/* After an answer: read the next request (process_input closes once a half-closed peer's input
 * is used up), or close if this was the last one. */
static void answer_done(struct conn *c)
{
    stub_done(c, true);
    if (c->state == C_CLOSING || c->state == C_LINGER)
        return;
    if (c->req.keep_alive)
        c->state = C_READING;
    else
        conn_close_soon(c);
}

/* Sends the planned answer of a plain request (now that its delay, if any, is over). */
static void send_plain(struct conn *c)
{
    struct req *r = &c->req;
    const struct plan *p = &r->plan;
    struct evbuffer *o = bufferevent_get_output(c->bev), *src = r->body;
    const char *ctype = "application/octet-stream";
    size_t ctype_len = 24;

    if (p->drop != DROP_NONE) {
        send_drop(c, p->drop);
        answer_done(c);
        return;
    }
    hval(r, H_CTYPE, &ctype, &ctype_len);
    if (p->body == BODY_JSON) {
        put_echo_json(c, c->tmp);
        src = c->tmp;
        ctype = "application/json";
        ctype_len = 16;
    } else if (p->body == BODY_TEXT) {
        put(c->tmp, p->text);
        src = c->tmp;
        ctype = "text/plain";
        ctype_len = 10;
    } else if (p->body == BODY_FILL) {
        src = NULL;
    } else if (p->body == BODY_TMP) {
        src = c->tmp;
        ctype = r->ctype;
        ctype_len = r->ctype_len;
    }
    head_start(o, p->status);
    put_plain_headers(c, o);
    write_answer(c, p->status, ctype, ctype_len, src, src ? evbuffer_get_length(src) : p->fill,
                 p->chunked);
    evbuffer_drain(r->body, evbuffer_get_length(r->body));
    answer_done(c);
}

/* A short text answer: --max-rate's 429, unknown endpoints, refused requests. The caller has
 * written the status line and any extra header. */
static void send_text(struct conn *c, int status, const char *text)
{
    evbuffer_drain(c->req.body, evbuffer_get_length(c->req.body));
    evbuffer_add(c->tmp, text, strlen(text));
    write_answer(c, status, "text/plain", 10, c->tmp, strlen(text), false);
}

/* ---- control endpoints ---------------------------------------------------------------------- */

static int ctl_stats(struct conn *c, struct evbuffer *out)
{
    struct stub *st = c->w->st;

    pthread_mutex_lock(&st->lock);
    evbuffer_add_printf(out,
                        "{\"requests\":%llu,\"accepted\":%llu,\"rejected\":%llu,"
                        "\"side_effects\":%llu,\"keys\":%zu,\"max_per_key\":%u,\"duplicates\":%llu,"
                        "\"in_flight\":%ld,\"in_flight_max\":%ld,\"script_pending\":%zu,"
                        "\"arrivals\":%zu,\"max_calls_per_key\":%u,\"window_hits\":%llu,"
                        "\"dedup_hits\":%llu,\"dedup_replays\":%llu,\"dedup_conflicts\":%llu,"
                        "\"lookups\":%llu,\"lookups_found\":%llu,\"lookups_absent\":%llu,"
                        "\"lookup_script_pending\":%zu,\"quota_refused\":%llu,"
                        "\"quota_window\":%llu,\"quota_used\":%llu}",
                        (unsigned long long)st->n.requests, (unsigned long long)st->n.accepted,
                        (unsigned long long)st->n.rejected, (unsigned long long)st->n.side_effects,
                        st->keys.used, st->keys.max_count, (unsigned long long)st->keys.duplicates,
                        st->n.in_flight, st->n.in_flight_max, st->script.len, st->n_arrivals,
                        st->calls.max_count, (unsigned long long)st->window_hits,
                        (unsigned long long)(st->dedup_replays + st->dedup_conflicts),
                        (unsigned long long)st->dedup_replays,
                        (unsigned long long)st->dedup_conflicts,
                        (unsigned long long)st->lookups, (unsigned long long)st->lookups_found,
                        (unsigned long long)st->lookups_absent, st->lookup_script.len,
                        (unsigned long long)st->quota_refused,
                        (unsigned long long)st->quota_window,
                        (unsigned long long)st->quota_used);
    pthread_mutex_unlock(&st->lock);
    return 200;
}

static int hexval(char ch)
{
    return ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
                                             : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
}

/* Percent-decodes s[0, n) in place; returns the new length. Invalid escapes stay as they are. */
static size_t pct_decode(char *s, size_t n)
{
    size_t o = 0;

    for (size_t i = 0; i < n; i++) {
        if (s[i] == '%' && i + 2 < n && hexval(s[i + 1]) >= 0 && hexval(s[i + 2]) >= 0) {
            s[o++] = (char)(hexval(s[i + 1]) << 4 | hexval(s[i + 2]));
            i += 2;
        } else {
            s[o++] = s[i];
        }
    }
    return o;
}

/* GET /_stub/keys/<key>: the key is the rest of the path, percent-decoded. */
static int ctl_key(struct conn *c, struct evbuffer *out)
{
    struct stub *st = c->w->st;
    struct req *r = &c->req;
    size_t plen = sizeof "/_stub/keys/" - 1;
    char *key = r->buf + plen;
    char *q = memchr(r->buf, '?', r->url_len);
    size_t n = pct_decode(key, (size_t)((q ? q : r->buf + r->url_len) - key));
    const struct kentry *e;

    pthread_mutex_lock(&st->lock);
    e = keymap_find(&st->keys, key, n);
    put(out, "{\"key\":");
    put_json_str(out, key, n);
    put(out, ",\"side_effects\":");
    put_u(out, e ? e->count : 0);
    put(out, ",\"calls\":");
    put_u(out, keymap_count(&st->calls, key, n));
    put(out, ",\"dedup_hits\":");
    put_u(out, e ? e->dedup : 0);
    put(out, ",\"lookups\":");
    put_u(out, keymap_count(&st->lookup_keys, key, n));
    put(out, ",\"effects\":[");
    for (uint32_t i = e ? e->first : 0; i; i = st->effects[i - 1].next) {
        const struct effect *f = &st->effects[i - 1];

        evbuffer_add_printf(out, "%s{\"seq\":%llu,\"recv_ns\":%llu,\"done_ns\":%llu,"
                            "\"status\":%d,\"answered\":%s,\"peer_gone\":%s}",
                            i == e->first ? "" : ",", (unsigned long long)f->seq,
                            (unsigned long long)f->recv_ns, (unsigned long long)f->done_ns,
                            f->status, f->answered ? "true" : "false",
                            f->peer_gone ? "true" : "false");
    }
    pthread_mutex_unlock(&st->lock);
    put(out, "]}");
    return 200;
}

static int ctl_arrivals(struct conn *c, struct evbuffer *out)
{
    struct stub *st = c->w->st;

    pthread_mutex_lock(&st->lock);
    evbuffer_add(out, "[", 1);
    for (size_t i = 0; i < st->n_arrivals; i++) {
        if (i)
            evbuffer_add(out, ",", 1);
        put_u(out, st->arrivals[i] - st->arrivals[0]);
    }
    evbuffer_add(out, "]", 1);
    pthread_mutex_unlock(&st->lock);
    return 200;
}

/* Parses a whole script into v (room for one answer per line); *line is the line of any error.
 * Blank lines and lines starting with '#' are skipped. */
static const char *script_parse(const char *s, size_t len, struct answer *v, size_t *n,
                                size_t *line, bool natural)
{
    const char *end = s + len, *err = NULL;

    for (*n = *line = 0; s < end && !err;) {
        const char *eol = memchr(s, '\n', (size_t)(end - s)), *e = eol ? eol : end, *t = s;

        ++*line;
        while (t < e && (*t == ' ' || *t == '\t' || *t == '\r'))
            t++;
        if (t < e && *t != '#') {
            if (e[-1] == '\r')
                e--;
            err = script_parse_line(t, e, &v[(*n)++], natural);
        }
        s = eol ? eol + 1 : end;
    }
    return err;
}

/* POST /_stub/script and /_stub/lookup-script: all lines or none are queued on dst. */
static int queue_script(struct conn *c, struct evbuffer *out, struct script *dst, bool natural)
{
    struct stub *st = c->w->st;
    size_t len = evbuffer_get_length(c->req.body), lines = 1, n = 0, line = 0;
    const char *s = len ? (const char *)evbuffer_pullup(c->req.body, -1) : "", *err = NULL;
    struct answer *v = NULL;
    int status = 200;

    for (size_t i = 0; i < len; i++)
        lines += s[i] == '\n';
    if (!s || !(v = malloc(lines * sizeof *v))) {
        put(out, "{\"error\":\"out of memory\"}");
        return 500;
    }
    if ((err = script_parse(s, len, v, &n, &line, natural))) {
        evbuffer_add_printf(out, "{\"error\":\"line %zu: %s\"}", line, err);
        status = 400;
        goto cleanup;
    }
    pthread_mutex_lock(&st->lock);
    for (size_t i = 0; i < n && status == 200; i++)
        if (script_push(dst, &v[i]) < 0)
            status = 500;
    evbuffer_add_printf(out, "{\"queued\":%zu,\"pending\":%zu}", n, dst->len);
    pthread_mutex_unlock(&st->lock);
cleanup:
    free(v);
    return status;
}

static int ctl_script(struct conn *c, struct evbuffer *out)
{
    return queue_script(c, out, &c->w->st->script, false);
}

/* Answers for the coming lookups, one per line: a status (and options) replaces a lookup's own
 * answer, "answer" keeps it (with its delay and drop: a stalled or lost lookup). */
static int ctl_lookup_script(struct conn *c, struct evbuffer *out)
{
    return queue_script(c, out, &c->w->st->lookup_script, true);
}

/* POST /_stub/window, body "MS LINE": for the next MS milliseconds every accepted plain request
 * gets the answer LINE (script syntax), whatever the script holds. How an experiment models an
 * outage or a 429 burst by time rather than by request count. "0" alone ends a window. */
static int ctl_window(struct conn *c, struct evbuffer *out)
{
    struct stub *st = c->w->st;
    size_t len = evbuffer_get_length(c->req.body);
    const char *s = len ? (const char *)evbuffer_pullup(c->req.body, -1) : "", *end = s + len;
    const char *t, *err = NULL;
    struct answer a = {0};
    uint64_t ms = 0;
    size_t n;

    while (end > s && (end[-1] == '\n' || end[-1] == '\r' || end[-1] == ' '))
        end--;
    if (!next_token(&s, end, &t, &n) || !parse_uint(t, n, MAX_DELAY_MS, &ms))
        err = "MS must be a number of milliseconds up to 3600000";
    else if (ms > 0)
        err = script_parse_line(s, end, &a, false);
    if (err) {
        evbuffer_add_printf(out, "{\"error\":\"%s\"}", err);
        return 400;
    }
    pthread_mutex_lock(&st->lock);
    st->window = a;
    st->window_until_ns = ms ? now_ns() + ms * 1000000ull : 0;
    pthread_mutex_unlock(&st->lock);
    evbuffer_add_printf(out, "{\"window_ms\":%llu}", (unsigned long long)ms);
    return 200;
}

/* POST /_stub/quota with "N": the quota of every window from the current one on (a partner
 * that lowers a tenant's quota). */
static int ctl_quota(struct conn *c, struct evbuffer *out)
{
    struct stub *st = c->w->st;
    size_t len = evbuffer_get_length(c->req.body);
    const char *s = len ? (const char *)evbuffer_pullup(c->req.body, -1) : "";
    uint64_t q;

    while (len && (s[len - 1] == '\n' || s[len - 1] == '\r' || s[len - 1] == ' '))
        len--;
    if (!st->quota_window_s || !parse_uint(s, len, 1000000000, &q) || q < 1) {
        evbuffer_add_printf(out, "{\"error\":\"N must be 1..1000000000, with --quota-window\"}");
        return 400;
    }
    pthread_mutex_lock(&st->lock);
    st->quota = q;
    pthread_mutex_unlock(&st->lock);
    evbuffer_add_printf(out, "{\"quota\":%llu}", (unsigned long long)q);
    return 200;
}

static int ctl_reset(struct conn *c, struct evbuffer *out)
{
    stub_reset(c->w->st);
    put(out, "{\"reset\":true}");
    return 200;
}

static const struct {
    enum http_method method;
    const char *path;
    bool prefix;
    int (*handler)(struct conn *c, struct evbuffer *out);
} ctl_routes[] = {
    {HTTP_GET, "/_stub/stats", false, ctl_stats},
    {HTTP_GET, "/_stub/keys/", true, ctl_key},
    {HTTP_GET, "/_stub/arrivals", false, ctl_arrivals},
    {HTTP_POST, "/_stub/script", false, ctl_script},
    {HTTP_POST, "/_stub/lookup-script", false, ctl_lookup_script},
    {HTTP_POST, "/_stub/window", false, ctl_window},
    {HTTP_POST, "/_stub/reset", false, ctl_reset},
    {HTTP_POST, "/_stub/quota", false, ctl_quota},
};

/* Routes a /_stub/ request; these never count, wait or consume the script. */
static void ctl_dispatch(struct conn *c)
{
    struct req *r = &c->req;
    const char *q = memchr(r->buf, '?', r->url_len);
    size_t plen = q ? (size_t)(q - r->buf) : r->url_len;
    enum http_method m = (enum http_method)c->parser.method;
    int status = 404;

    for (size_t i = 0; i < sizeof ctl_routes / sizeof ctl_routes[0]; i++) {
        size_t n = strlen(ctl_routes[i].path);

        if (!(ctl_routes[i].prefix ? plen >= n && !memcmp(r->buf, ctl_routes[i].path, n)
                                   : plen == n && !memcmp(r->buf, ctl_routes[i].path, n)))
            continue;
        if (ctl_routes[i].method != m && !(ctl_routes[i].method == HTTP_GET && m == HTTP_HEAD)) {
            status = 405;
            continue;
        }
        status = ctl_routes[i].handler(c, c->tmp);
        head_start(bufferevent_get_output(c->bev), status);
        write_answer(c, status, "application/json", 16, c->tmp, evbuffer_get_length(c->tmp), false);
        evbuffer_drain(r->body, evbuffer_get_length(r->body));
        answer_done(c);
        return;
    }
    head_start(bufferevent_get_output(c->bev), status);
    send_text(c, status, status == 404 ? "no such /_stub/ endpoint\n" : "method not allowed\n");
    answer_done(c);
}

/* ---- request handling ----------------------------------------------------------------------- */

/* Over --max-rate: 429 at once, no side effect, no script line consumed. */
static void send_rejected(struct conn *c)
{
    struct evbuffer *o = bufferevent_get_output(c->bev);

    head_start(o, 429);
    if (c->req.quota_refused) {
        /* The partner's way: the reset says when to come back. */
        put_quota_headers(o, &c->req, c->w->st->quota_style, c->w->st->quota_window_s);
        put(o, "X-Stub-Seq: ");
    } else {
        put(o, "Retry-After: 1\r\nX-Stub-Seq: ");
    }
    put_u(o, c->req.seq);
    evbuffer_add(o, "\r\n", 2);
    send_text(c, 429, c->req.quota_refused ? "over --quota\n" : "over --max-rate\n");
    answer_done(c);
}

static void handle_request(struct conn *c)
{
    struct req *r = &c->req;

    if (r->control) {
        ctl_dispatch(c);
    } else if (!r->lookup && !r->accepted) {
        send_rejected(c);
    } else {
        if (r->lookup)
            plan_lookup(c);
        else
            plan_request(c);
        if (r->plan.delay_ms == 0) {
            send_plain(c);
            return;
        }
        c->state = C_PENDING;
        timer_after_ms(c->timer, r->plan.delay_ms);
    }
}

/* The parser gave up on the input: answer why, then close. */
static void refuse_request(struct conn *c)
{
    enum http_errno e = HTTP_PARSER_ERRNO(&c->parser);
    int status = c->req.error ? c->req.error : e == HPE_HEADER_OVERFLOW ? 431 : 400;

    c->req.keep_alive = false;
    head_start(bufferevent_get_output(c->bev), status);
    send_text(c, status, status == 400 ? "malformed request\n" : "request refused\n");
    answer_done(c);
}

/* ---- parser callbacks ----------------------------------------------------------------------- */

static int req_append(struct req *r, const char *at, size_t n)
{
    if (r->len + n > r->cap) {
        size_t cap = r->cap ? r->cap : 1024;
        char *p;

        while (cap < r->len + n)
            cap *= 2;
        if (!(p = realloc(r->buf, cap))) {
            r->error = 500;
            return -1;
        }
        r->buf = p;
        r->cap = cap;
    }
    memcpy(r->buf + r->len, at, n);
    r->len += n;
    return 0;
}

static int on_message_begin(http_parser *hp)
{
    struct conn *c = hp->data;
    struct req *r = &c->req;

    r->len = r->nhdrs = r->head_hdrs = r->url_len = 0;
    memset(r->slot, 0xff, sizeof r->slot);
    r->in_value = r->control = r->lookup = r->accepted = r->in_flight = r->keep_alive = false;
    r->error = 0;
    r->seq = 0;
    return 0;
}

static int on_url(http_parser *hp, const char *at, size_t n)
{
    struct conn *c = hp->data;

    c->req.url_len += n;
    return req_append(&c->req, at, n);
}

/* Names and values may come in pieces split across reads; pieces of one field are adjacent in buf.
 * Trailers of a chunked body arrive here too, after the headers: they only land in the list. */
static int on_header_field(http_parser *hp, const char *at, size_t n)
{
    struct req *r = &((struct conn *)hp->data)->req;

    if (r->nhdrs == 0 || r->in_value) {
        if (r->nhdrs == r->hcap) {
            size_t cap = r->hcap ? r->hcap * 2 : 16;
            struct hdr *h = realloc(r->hdrs, cap * sizeof *h);

            if (!h) {
                r->error = 500;
                return -1;
            }
            r->hdrs = h;
            r->hcap = cap;
        }
        r->hdrs[r->nhdrs++] = (struct hdr){.name_off = (uint32_t)r->len,
                                           .val_off = (uint32_t)r->len};
        r->in_value = false;
    }
    r->hdrs[r->nhdrs - 1].name_len += (uint32_t)n;
    return req_append(r, at, n);
}

static int on_header_value(http_parser *hp, const char *at, size_t n)
{
    struct req *r = &((struct conn *)hp->data)->req;
    struct hdr *h = &r->hdrs[r->nhdrs - 1];

    if (!r->in_value) {
        h->val_off = (uint32_t)r->len;
        r->in_value = true;
    }
    h->val_len += (uint32_t)n;
    return req_append(r, at, n);
}

/* Expect: 100-continue is answered, or curl would wait a second before sending the body. */
static void maybe_continue(struct conn *c)
{
    const char *v;
    size_t n;
    bool has_body = (c->parser.flags & F_CHUNKED) ||
                    (c->parser.content_length > 0 && c->parser.content_length != ULLONG_MAX);

    if (has_body && !http10(c) && hval(&c->req, H_EXPECT, &v, &n) && mem_ieq(v, n, "100-continue"))
        put(bufferevent_get_output(c->bev), "HTTP/1.1 100 Continue\r\n\r\n");
}

static int on_headers_complete(http_parser *hp)
{
    struct conn *c = hp->data;
    struct req *r = &c->req;

    index_headers(r);
    r->in_value = true;             /* a trailer's name starts a new entry */
    r->control = r->url_len >= 7 && memcmp(r->buf, "/_stub/", 7) == 0;
    r->lookup = !r->control && is_lookup(c);
    if (!r->control && !r->lookup)
        stub_admit(c->w->st, r);
    maybe_continue(c);
    return 0;
}

static int on_body(http_parser *hp, const char *at, size_t n)
{
    struct req *r = &((struct conn *)hp->data)->req;

    if (evbuffer_get_length(r->body) + n > MAX_BODY) {
        r->error = 413;
        return -1;
    }
    if (evbuffer_add(r->body, at, n) < 0) {
        r->error = 500;
        return -1;
    }
    return 0;
}

/* Pauses the parser so the request is answered before the next one (pipelined) is read. */
static int on_message_complete(http_parser *hp)
{
    struct conn *c = hp->data;

    c->req.keep_alive = http_should_keep_alive(hp) && !hp->upgrade;
    http_parser_pause(hp, 1);
    return 0;
}

static const http_parser_settings parser_settings = {
    .on_message_begin = on_message_begin,
    .on_url = on_url,
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

/* ---- connections ---------------------------------------------------------------------------- */

static void conn_free(struct conn *c)
{
    struct req *r = &c->req;

    stub_done(c, false);
    if (c->prev)
        c->prev->next = c->next;
    else
        c->w->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    if (c->timer)
        event_free(c->timer);
    if (c->bev)
        bufferevent_free(c->bev);
    if (r->body)
        evbuffer_free(r->body);
    if (c->tmp)
        evbuffer_free(c->tmp);
    free(r->buf);
    free(r->hdrs);
    free(c);
}

/* The output is flushed: shut our side and discard what the peer still sends, so that closing with
 * unread input does not turn into a reset that destroys the answer in flight. Frees from the timer,
 * never here, because callers may still be on the stack. */
static void conn_linger(struct conn *c)
{
    evutil_socket_t fd = bufferevent_getfd(c->bev);
    SSL *ssl = bufferevent_openssl_get_ssl(c->bev);

    c->state = C_LINGER;
    if (ssl)
        SSL_shutdown(ssl);
    if (fd >= 0)
        shutdown(fd, SHUT_WR);
    evtimer_del(c->timer);
    timer_after_ms(c->timer, c->peer_eof ? 0 : LINGER_MS);
}

static void conn_close_soon(struct conn *c)
{
    c->state = C_CLOSING;
    evtimer_del(c->timer);
    if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0)
        conn_linger(c);
    /* else on_write lingers once the output is out */
}

/* Feeds buffered input to the parser and answers each complete request, until the input runs out,
 * a request must wait, or the connection closes. */
static void process_input(struct conn *c)
{
    struct evbuffer *in = bufferevent_get_input(c->bev);
    struct evbuffer_iovec v;
    size_t used;

    while (c->state == C_READING) {
        if (evbuffer_get_length(bufferevent_get_output(c->bev)) > OUT_HIGH) {
            c->stalled = true;      /* on_write resumes when the client has read its answers */
            return;
        }
        if (evbuffer_peek(in, -1, NULL, &v, 1) < 1 || v.iov_len == 0) {
            if (c->peer_eof)
                conn_close_soon(c);     /* nothing more will come */
            return;
        }
        used = http_parser_execute(&c->parser, &parser_settings, v.iov_base, v.iov_len);
        evbuffer_drain(in, used);
        if (HTTP_PARSER_ERRNO(&c->parser) == HPE_PAUSED) {
            http_parser_pause(&c->parser, 0);
            handle_request(c);
        } else if (HTTP_PARSER_ERRNO(&c->parser) != HPE_OK || used < v.iov_len) {
            refuse_request(c);      /* used < len without an error: a protocol switch we refuse */
        }
    }
}

static void on_read(struct bufferevent *bev, void *arg)
{
    struct conn *c = arg;

    if (c->state == C_READING)
        process_input(c);
    else if (c->state == C_LINGER)
        evbuffer_drain(bufferevent_get_input(bev), evbuffer_get_length(bufferevent_get_input(bev)));
    /* C_PENDING and C_CLOSING: input waits (bounded by the read watermark) */
}

static void on_write(struct bufferevent *bev, void *arg)
{
    struct conn *c = arg;

    if (c->state == C_CLOSING) {
        conn_linger(c);
    } else if (c->state == C_READING && c->stalled) {
        c->stalled = false;
        process_input(c);
    }
}

/* A TLS handshake that failed (a client certificate refused, with TLS 1.3 after the client's
 * handshake ended): OpenSSL has written its alert to the socket; closing at once, with the
 * client's request unread, would send a reset that destroys the alert in flight. Shut our side
 * and close a little later. */
static void tls_refused(struct conn *c)
{
    evutil_socket_t fd = bufferevent_getfd(c->bev);

    bufferevent_disable(c->bev, EV_READ | EV_WRITE);
    if (fd >= 0)
        shutdown(fd, SHUT_WR);
    c->state = C_LINGER;
    evtimer_del(c->timer);
    timer_after_ms(c->timer, LINGER_MS);
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
    struct conn *c = arg;

    if (what & BEV_EVENT_CONNECTED) {
        c->handshaken = true;       /* the TLS handshake is done */
        return;
    }
    if ((what & BEV_EVENT_ERROR) && !c->handshaken && bufferevent_openssl_get_ssl(bev) &&
        c->state != C_LINGER) {
        tls_refused(c);
        return;
    }
    if ((what & BEV_EVENT_EOF) && c->state != C_LINGER) {
        /* Half-closed peers still get the answers to everything they sent. */
        c->peer_eof = true;
        if (c->state == C_READING && !c->stalled)
            process_input(c);
        return;
    }
    conn_free(c);                   /* errors, and EOF while lingering */
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    struct conn *c = arg;

    if (c->state == C_LINGER) {
        conn_free(c);
    } else if (c->state == C_PENDING) {
        c->state = C_READING;
        send_plain(c);
        process_input(c);
    }
}

static struct bufferevent *conn_bev_new(struct worker *w, evutil_socket_t fd)
{
    struct bufferevent *bev;
    SSL *ssl;

    if (!w->st->tls)
        return bufferevent_socket_new(w->base, fd, BEV_OPT_CLOSE_ON_FREE);
    if (!(ssl = SSL_new(w->st->tls)))
        return NULL;
    bev = bufferevent_openssl_socket_new(w->base, fd, ssl, BUFFEREVENT_SSL_ACCEPTING,
                                         BEV_OPT_CLOSE_ON_FREE);
    if (!bev) {
        SSL_free(ssl);              /* libevent 2.1 leaves it to us on failure */
        return NULL;
    }
    /* Clients that close without close_notify are ordinary EOFs, not errors. */
    bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
    return bev;
}

/* A new connection, owned by its worker's list; NULL (and fd closed) on failure. */
static struct conn *conn_new(struct worker *w, evutil_socket_t fd)
{
    struct conn *c = calloc(1, sizeof *c);

    if (!c)
        goto fail;
    c->w = w;
    c->next = w->conns;
    if (w->conns)
        w->conns->prev = c;
    w->conns = c;
    if (!(c->bev = conn_bev_new(w, fd)))
        goto fail;
    fd = -1;                        /* the bufferevent owns it now */
    c->timer = evtimer_new(w->base, on_timer, c);
    c->req.body = evbuffer_new();
    c->tmp = evbuffer_new();
    if (!c->timer || !c->req.body || !c->tmp)
        goto fail;
    http_parser_init(&c->parser, HTTP_REQUEST);
    c->parser.data = c;
    bufferevent_setcb(c->bev, on_read, on_write, on_event, c);
    bufferevent_setwatermark(c->bev, EV_READ, 0, IN_HIGH);
    bufferevent_enable(c->bev, EV_READ | EV_WRITE);
    return c;
fail:
    if (c)
        conn_free(c);
    if (fd >= 0)
        close(fd);
    return NULL;
}

/* ---- listening ------------------------------------------------------------------------------ */

static void on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int salen,
                      void *arg)
{
    int one = 1;

    /* Head and body leave in one write, but a lone small write must not wait for a delayed ACK. */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    conn_new(arg, fd);
}

static void on_resume(evutil_socket_t fd, short what, void *arg)
{
    evconnlistener_enable(((struct worker *)arg)->listener);
}

/* accept() failed (out of descriptors, most likely): pause rather than spin on the ready socket. */
static void on_accept_error(struct evconnlistener *l, void *arg)
{
    struct worker *w = arg;

    fprintf(stderr, "sluice-stub: accept: %s; pausing 100 ms\n", strerror(errno));
    evconnlistener_disable(l);
    timer_after_ms(w->resume, 100);
}

/* Splits "HOST:PORT" or "[V6]:PORT" and resolves it into *ss. */
static int resolve_listen(const char *spec, struct sockaddr_storage *ss, socklen_t *len)
{
    char host[256];
    const char *colon = strrchr(spec, ':');
    size_t hlen;
    struct addrinfo hints = {.ai_flags = AI_PASSIVE | AI_NUMERICSERV, .ai_socktype = SOCK_STREAM};
    struct addrinfo *ai = NULL;
    int rc;

    if (!colon || colon == spec || (hlen = (size_t)(colon - spec)) >= sizeof host) {
        fprintf(stderr, "sluice-stub: --listen wants HOST:PORT or [V6]:PORT, not %s\n", spec);
        return -EINVAL;
    }
    if (spec[0] == '[' && colon[-1] == ']') {
        spec++;
        hlen -= 2;
    }
    memcpy(host, spec, hlen);
    host[hlen] = '\0';
    if ((rc = getaddrinfo(host, colon + 1, &hints, &ai)) != 0) {
        fprintf(stderr, "sluice-stub: --listen %s: %s\n", host, gai_strerror(rc));
        return -EINVAL;
    }
    memcpy(ss, ai->ai_addr, ai->ai_addrlen);
    *len = ai->ai_addrlen;
    freeaddrinfo(ai);
    return 0;
}

/* A listening, non-blocking socket on sa; SO_REUSEPORT when several workers share the port. */
static int listen_on(const struct sockaddr *sa, socklen_t len, bool reuseport)
{
    int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;

    if (fd < 0)
        return -errno;
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
        (reuseport && setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) < 0) ||
        bind(fd, sa, len) < 0 || listen(fd, 4096) < 0) {
        int err = -errno;

        close(fd);
        return err;
    }
    return fd;
}

static void print_listening(int fd)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    char ip[INET6_ADDRSTRLEN];

    getsockname(fd, (struct sockaddr *)&ss, &len);
    if (ss.ss_family == AF_INET6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;

        inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip);
        printf("listening [%s]:%u\n", ip, ntohs(a->sin6_port));
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;

        inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
        printf("listening %s:%u\n", ip, ntohs(a->sin_port));
    }
    fflush(stdout);
}

/* ---- workers -------------------------------------------------------------------------------- */

static void on_stop(evutil_socket_t fd, short what, void *arg)
{
    event_base_loopbreak(((struct worker *)arg)->base);
}

/* Stops every loop. Through an activated event rather than event_base_loopbreak() from here: a loop
 * that has not started yet would clear the break flag when it starts, and never stop. */
static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    struct stub *st = arg;

    for (int i = 0; i < st->threads; i++)
        event_active(st->workers[i].stop, 0, 0);
}

/* Takes ownership of the listening fd, even on failure. */
static int worker_init(struct worker *w, struct stub *st, int fd)
{
    struct event_config *cfg = event_config_new();

    w->st = st;
    if (cfg)    /* batches epoll_ctl calls: measurably cheaper per request */
        event_config_set_flag(cfg, EVENT_BASE_FLAG_EPOLL_USE_CHANGELIST);
    w->base = cfg ? event_base_new_with_config(cfg) : NULL;
    if (cfg)
        event_config_free(cfg);
    if (!w->base || !(w->resume = evtimer_new(w->base, on_resume, w)) ||
        !(w->stop = event_new(w->base, -1, 0, on_stop, w)))
        goto fail;
    w->listener = evconnlistener_new(w->base, on_accept, w, LEV_OPT_CLOSE_ON_FREE, 0, fd);
    if (!w->listener)
        goto fail;
    evconnlistener_set_error_cb(w->listener, on_accept_error);
    return 0;
fail:
    close(fd);
    return -ENOMEM;
}

static void worker_free(struct worker *w)
{
    while (w->conns)
        conn_free(w->conns);
    if (w->listener)
        evconnlistener_free(w->listener);
    if (w->resume)
        event_free(w->resume);
    if (w->stop)
        event_free(w->stop);
    if (w->sigint)
        event_free(w->sigint);
    if (w->sigterm)
        event_free(w->sigterm);
    if (w->base)
        event_base_free(w->base);
}

static void *worker_run(void *arg)
{
    struct worker *w = arg;

    event_base_dispatch(w->base);
    return NULL;
}

/* SIGINT and SIGTERM end every loop; worker 0's loop catches them. */
static int signals_add(struct stub *st)
{
    struct worker *w0 = &st->workers[0];

    w0->sigint = evsignal_new(w0->base, SIGINT, on_signal, st);
    w0->sigterm = evsignal_new(w0->base, SIGTERM, on_signal, st);
    if (!w0->sigint || !w0->sigterm || evsignal_add(w0->sigint, NULL) < 0 ||
        evsignal_add(w0->sigterm, NULL) < 0)
        return -ENOMEM;
    return 0;
}

/* Binds every worker's socket: the first learns the port (0 -> the kernel's), the rest share it. */
static int workers_start(struct stub *st)
{
    struct sockaddr_storage ss;
    socklen_t len;
    int fd, rc;

    if ((rc = resolve_listen(st->listen, &ss, &len)) < 0)
        return rc;
    for (int i = 0; i < st->threads; i++) {
        if ((fd = listen_on((struct sockaddr *)&ss, len, st->threads > 1)) < 0) {
            fprintf(stderr, "sluice-stub: listen on %s: %s\n", st->listen, strerror(-fd));
            return fd;
        }
        if (i == 0) {
            len = sizeof ss;
            getsockname(fd, (struct sockaddr *)&ss, &len);
        }
        if ((rc = worker_init(&st->workers[i], st, fd)) < 0)
            return rc;
    }
    return 0;
}

/* ---- setup ---------------------------------------------------------------------------------- */

static SSL_CTX *tls_new(const char *cert, const char *key, const char *client_ca)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());

    if (!ctx)
        goto fail;
    if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1 ||
        SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(ctx) != 1)
        goto fail;
    /* Mutual TLS: a client without a certificate this CA signed is refused in the handshake. */
    if (client_ca) {
        if (SSL_CTX_load_verify_locations(ctx, client_ca, NULL) != 1)
            goto fail;
        SSL_CTX_set_client_CA_list(ctx, SSL_load_client_CA_file(client_ca));
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
    }
    return ctx;
fail:
    fprintf(stderr, "sluice-stub: TLS setup with %s and %s failed:\n", cert, key);
    ERR_print_errors_fp(stderr);
    SSL_CTX_free(ctx);
    return NULL;
}

static void usage(FILE *f)
{
    fputs("usage: sluice-stub [--listen HOST:PORT] [--tls-cert FILE --tls-key FILE]\n"
          "                   [--tls-client-ca FILE]\n"
          "                   [--max-rate R] [--burst B] [--body-size N] [--threads N]\n"
          "                   [--delay-ms N] [--honour-idempotency] [--lookup PREFIX]\n"
          "  --listen HOST:PORT  address to serve on (default 127.0.0.1:9000; PORT 0 = any)\n"
          "  --tls-cert FILE     serve HTTPS with this PEM certificate chain (needs --tls-key)\n"
          "  --tls-key FILE      PEM private key of --tls-cert\n"
          "  --tls-client-ca FILE  require a client certificate signed by this PEM CA\n"
          "  --max-rate R        accept at most R plain requests/s (float); the rest get 429\n"
          "  --burst B           requests --max-rate lets through back to back (default 1)\n"
          "  --quota N --quota-window S [--quota-style draft|old|x]\n"
          "                      N plain requests per fixed window of S seconds, advertised\n"
          "                      on every answer; beyond: 429 (POST /_stub/quota N changes N)\n"
          "  --body-size N       answer plain requests with N bytes of 'x' instead of the echo\n"
          "  --threads N         event loops sharing the port (default 1)\n"
          "  --delay-ms N        answer plain requests after N ms (default 0; headers, script\n"
          "                      and windows override it)\n"
          "  --honour-idempotency  a repeated Idempotency-Key gets the stored answer, or 409\n"
          "                      while the first request is still being answered; no side effect\n"
          "  --lookup PREFIX     GET/HEAD PREFIX<key> (e.g. '/lookup?client_ref=') answers 200 with\n"
          "                      the stored answer of the key's first side effect, or 404\n"
          "See tests/stub/README.md for the X-Stub-* headers and the /_stub/ endpoints.\n",
          f);
}

static bool bad_arg(const char *what)
{
    fprintf(stderr, "sluice-stub: %s (--help for usage)\n", what);
    return false;
}

/* Fills the configuration from argv; false (after saying why) if it is not usable. */
static bool parse_args(struct stub *st, int argc, char **argv)
{
    static const struct option opts[] = {
        {"listen", required_argument, NULL, 'l'},   {"tls-cert", required_argument, NULL, 'c'},
        {"tls-key", required_argument, NULL, 'k'},  {"max-rate", required_argument, NULL, 'r'},
        {"burst", required_argument, NULL, 'b'},    {"body-size", required_argument, NULL, 's'},
        {"threads", required_argument, NULL, 't'},  {"help", no_argument, NULL, 'h'},
        {"delay-ms", required_argument, NULL, 'd'}, {"honour-idempotency", no_argument, NULL, 'i'},
        {"tls-client-ca", required_argument, NULL, 'C'},
        {"lookup", required_argument, NULL, 'L'},
        {"quota", required_argument, NULL, 'Q'},
        {"quota-window", required_argument, NULL, 'W'},
        {"quota-style", required_argument, NULL, 'S'},
        {NULL, 0, NULL, 0},
    };
    uint64_t v;
    char *end;
    int ch;

    while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        size_t n = optarg ? strlen(optarg) : 0;

        switch (ch) {
        case 'l': st->listen = optarg; break;
        case 'c': st->tls_cert = optarg; break;
        case 'k': st->tls_key = optarg; break;
        case 'C': st->client_ca = optarg; break;
        case 'r':
            st->max_rate = strtod(optarg, &end);
            if (*end || !(st->max_rate > 0 && st->max_rate <= 1e9))
                return bad_arg("--max-rate wants a number of requests per second > 0");
            break;
        case 'b':
            if (!parse_uint(optarg, n, 1000000, &v) || v < 1)
                return bad_arg("--burst wants 1..1000000");
            st->burst = (unsigned)v;
            break;
        case 's':
            if (!parse_uint(optarg, n, MAX_FILL, &v))
                return bad_arg("--body-size wants 0..1073741824");
            st->body_size = (long long)v;
            break;
        case 't':
            if (!parse_uint(optarg, n, MAX_THREADS, &v) || v < 1)
                return bad_arg("--threads wants 1..64");
            st->threads = (int)v;
            break;
        case 'd':
            if (!parse_uint(optarg, n, MAX_DELAY_MS, &v))
                return bad_arg("--delay-ms wants 0..3600000");
            st->delay_ms = (unsigned)v;
            break;
        case 'i': st->honour = true; break;
        case 'Q':
            if (!parse_uint(optarg, n, 1000000000, &v) || v < 1)
                return bad_arg("--quota wants 1..1000000000 requests per window");
            st->quota = v;
            break;
        case 'W':
            if (!parse_uint(optarg, n, 86400, &v) || v < 1)
                return bad_arg("--quota-window wants 1..86400 seconds");
            st->quota_window_s = (unsigned)v;
            break;
        case 'S':
            if (!strcmp(optarg, "draft")) st->quota_style = 0;
            else if (!strcmp(optarg, "old")) st->quota_style = 1;
            else if (!strcmp(optarg, "x")) st->quota_style = 2;
            else return bad_arg("--quota-style wants draft, old or x");
            break;
        case 'L':
            if (optarg[0] != '/' || !strncmp(optarg, "/_stub/", 7))
                return bad_arg("--lookup wants a path prefix starting with / (not /_stub/)");
            st->lookup = optarg;
            break;
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); return false;
        }
    }
    if (optind < argc)
        return bad_arg("unexpected argument");
    if (!st->tls_cert != !st->tls_key)
        return bad_arg("--tls-cert and --tls-key go together");
    if (st->client_ca && !st->tls_cert)
        return bad_arg("--tls-client-ca needs --tls-cert and --tls-key");
    if (!st->quota != !st->quota_window_s)
        return bad_arg("--quota and --quota-window go together");
    st->quota_epoch_ns = now_ns();
    return true;
}

int main(int argc, char **argv)
{
    struct stub st = {.listen = "127.0.0.1:9000", .burst = 1, .body_size = -1, .threads = 1,
                      .lock = PTHREAD_MUTEX_INITIALIZER};
    struct worker *w0;
    int rc = 1, started = 0;

    if (!parse_args(&st, argc, argv))
        return 2;
    signal(SIGPIPE, SIG_IGN);       /* a peer gone mid-answer is an error event, not a death */
    memset(fill_block, 'x', sizeof fill_block);
    if (st.tls_cert && !(st.tls = tls_new(st.tls_cert, st.tls_key, st.client_ca)))
        goto cleanup;
    /* libevent's internal locks cost on every event: take them only when other threads' loops
     * must be woken (by event_active on their stop event). */
    if (st.threads > 1 && evthread_use_pthreads() < 0)
        goto cleanup;
    if (!(st.workers = calloc((size_t)st.threads, sizeof *st.workers)) || workers_start(&st) < 0)
        goto cleanup;
    w0 = &st.workers[0];
    if (signals_add(&st) < 0)
        goto cleanup;
    /* Only now: a harness may send SIGTERM as soon as it has read the port. */
    print_listening(evconnlistener_get_fd(w0->listener));
    for (started = 1; started < st.threads; started++)
        if (pthread_create(&st.workers[started].thread, NULL, worker_run,
                           &st.workers[started]) != 0)
            break;
    if (started == st.threads)
        rc = event_base_dispatch(w0->base) < 0;
    on_signal(SIGTERM, 0, &st);
    while (--started > 0)
        pthread_join(st.workers[started].thread, NULL);
cleanup:
    for (int i = 0; st.workers && i < st.threads; i++)
        worker_free(&st.workers[i]);
    free(st.workers);
    keymap_clear(&st.keys);
    keymap_clear(&st.calls);
    effects_clear(&st);
    script_clear(&st.script);
    script_clear(&st.lookup_script);
    keymap_clear(&st.lookup_keys);
    free(st.arrivals);
    SSL_CTX_free(st.tls);
    return rc;
}
