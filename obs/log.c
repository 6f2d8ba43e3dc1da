#include "obs/log.h"

#include <openssl/sha.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static atomic_int log_level = SC_LOG_INFO;

static const char *const level_names[] = {"error", "warn", "info", "debug"};

void log_set_level(enum sc_log_level level)
{
    atomic_store(&log_level, (int)level);
}

bool log_enabled(enum sc_log_level level)
{
    return (int)level <= atomic_load_explicit(&log_level, memory_order_relaxed);
}

static void put(char *buf, size_t len, size_t *pos, const char *s)
{
    size_t n = strlen(s);

    if (*pos + n >= len)
        n = *pos < len ? len - *pos - 1 : 0;
    memcpy(buf + *pos, s, n);
    *pos += n;
    buf[*pos] = '\0';
}

/* Length of a valid UTF-8 sequence at p (2 to 4), or 0. */
static size_t utf8_len(const unsigned char *p, size_t left)
{
    size_t n = p[0] >= 0xf0 && p[0] <= 0xf4 ? 4 : p[0] >= 0xe0 ? 3
             : p[0] >= 0xc2 && p[0] <= 0xdf ? 2 : 0;

    if (n == 0 || n > left)
        return 0;
    for (size_t i = 1; i < n; i++)
        if ((p[i] & 0xc0) != 0x80)
            return 0;
    /* No overlong forms, no surrogates, nothing above U+10FFFF. */
    if ((p[0] == 0xe0 && p[1] < 0xa0) || (p[0] == 0xed && p[1] > 0x9f) ||
        (p[0] == 0xf0 && p[1] < 0x90) || (p[0] == 0xf4 && p[1] > 0x8f))
        return 0;
    return n;
}

void json_escape_append(char *buf, size_t len, size_t *pos, const char *s,
                        size_t slen)
{
    char esc[8];

    put(buf, len, pos, "\"");
    for (size_t i = 0; i < slen && *pos + 8 < len; i++) {
        unsigned char c = (unsigned char)s[i];
        size_t u = c >= 0x80 ? utf8_len((const unsigned char *)s + i, slen - i) : 0;

        if (u) {
            /* Valid UTF-8 passes through; stray bytes become U+FFFD below,
             * so the line stays valid JSON whatever the input was. */
            memcpy(esc, s + i, u);
            esc[u] = '\0';
            i += u - 1;
        } else if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            esc[2] = '\0';
        } else if (c >= 0x80) {
            snprintf(esc, sizeof esc, "\\ufffd");
        } else if (c < 0x20 || c == 0x7f) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
        } else {
            esc[0] = (char)c;
            esc[1] = '\0';
        }
        put(buf, len, pos, esc);
    }
    put(buf, len, pos, "\"");
}

static void put_time(char *buf, size_t len, size_t *pos)
{
    struct timespec ts;
    struct tm tm;
    char t[64];

    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    snprintf(t, sizeof t, "\"%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ\"",
             tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
             tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
    put(buf, len, pos, t);
}

static void emit(char *buf, size_t pos, size_t len)
{
    if (pos + 2 > len)
        pos = len - 2;
    buf[pos++] = '\n';
    /* One write per line: stderr is unbuffered and lines must not interleave. */
    if (write(STDERR_FILENO, buf, pos) < 0) {
        /* Nowhere left to report it. */
    }
}

void log_msg(enum sc_log_level level, const char *fmt, ...)
{
    char msg[1024], buf[1400];
    size_t pos = 0;
    va_list ap;

    if (!log_enabled(level))
        return;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    put(buf, sizeof buf, &pos, "{\"time\":");
    put_time(buf, sizeof buf, &pos);
    put(buf, sizeof buf, &pos, ",\"level\":\"");
    put(buf, sizeof buf, &pos, level_names[level]);
    put(buf, sizeof buf, &pos, "\",\"msg\":");
    json_escape_append(buf, sizeof buf, &pos, msg, strlen(msg));
    put(buf, sizeof buf, &pos, "}");
    emit(buf, pos, sizeof buf);
}

/* A short, stable, non-reversible tag for a key: enough to correlate log
 * lines of one job without writing the key (which may carry ids). */
static void key_hash(const char *key, char out[17])
{
    unsigned char md[SHA256_DIGEST_LENGTH];

    SHA256((const unsigned char *)key, strlen(key), md);
    for (int i = 0; i < 8; i++)
        snprintf(out + 2 * i, 3, "%02x", md[i]);
}

static void put_str_field(char *buf, size_t len, size_t *pos,
                          const char *name, const char *v, size_t vlen)
{
    put(buf, len, pos, ",\"");
    put(buf, len, pos, name);
    put(buf, len, pos, "\":");
    json_escape_append(buf, len, pos, v, vlen);
}

void log_access(const struct access_entry *e)
{
    char buf[2048], num[256], kh[17];
    size_t pos = 0, plen = strcspn(e->target, "?");

    put(buf, sizeof buf, &pos, "{\"time\":");
    put_time(buf, sizeof buf, &pos);
    put(buf, sizeof buf, &pos, ",\"type\":\"access\"");
    put_str_field(buf, sizeof buf, &pos, "route", e->route, strlen(e->route));
    put_str_field(buf, sizeof buf, &pos, "policy", e->policy, strlen(e->policy));
    put_str_field(buf, sizeof buf, &pos, "method", e->method, strlen(e->method));
    put_str_field(buf, sizeof buf, &pos, "path", e->target, plen);
    snprintf(num, sizeof num, ",\"status\":%d", e->status);
    put(buf, sizeof buf, &pos, num);
    put_str_field(buf, sizeof buf, &pos, "outcome", e->outcome, strlen(e->outcome));
    put_str_field(buf, sizeof buf, &pos, "reason", e->reason, strlen(e->reason));
    snprintf(num, sizeof num,
             ",\"attempt\":%u,\"permit_wait_ms\":%.3f,\"upstream_ms\":%.3f,"
             "\"total_ms\":%.3f",
             e->attempt, e->permit_wait_ms, e->upstream_ms, e->total_ms);
    put(buf, sizeof buf, &pos, num);
    if (e->shadow)
        put_str_field(buf, sizeof buf, &pos, "shadow", e->shadow, strlen(e->shadow));
    if (e->key) {
        key_hash(e->key, kh);
        put_str_field(buf, sizeof buf, &pos, "key_hash", kh, strlen(kh));
    }
    put(buf, sizeof buf, &pos, "}");
    emit(buf, pos, sizeof buf);
}
