#include "obs/log.h"
#include "util/json_escape.h"

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
    json_text_put(buf, len, pos, t);
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

/* Text that ends in a newline (a reload's summary, every error of a refused
 * file, one a line) would end its "msg" in a literal \u000a: the newline at
 * the end goes, and those between lines become "; ", so a line of the log is
 * one readable line of text too. */
static void one_line(const char *in, char *out, size_t len)
{
    size_t n = strlen(in), o = 0;

    while (n && (in[n - 1] == '\n' || in[n - 1] == '\r' || in[n - 1] == ' '))
        n--;
    for (size_t i = 0; i < n && o + 3 < len; i++) {
        if (in[i] == '\r')
            continue;
        if (in[i] == '\n') {
            out[o++] = ';';
            out[o++] = ' ';
        } else {
            out[o++] = in[i];
        }
    }
    out[o] = '\0';
}

void log_msg(enum sc_log_level level, const char *fmt, ...)
{
    char raw[1024], msg[1100], buf[1400];
    size_t pos = 0;
    va_list ap;

    if (!log_enabled(level))
        return;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    one_line(raw, msg, sizeof msg);
    json_text_put(buf, sizeof buf, &pos, "{\"time\":");
    put_time(buf, sizeof buf, &pos);
    json_text_put(buf, sizeof buf, &pos, ",\"level\":\"");
    json_text_put(buf, sizeof buf, &pos, level_names[level]);
    json_text_put(buf, sizeof buf, &pos, "\",\"msg\":");
    json_escape_append(buf, sizeof buf, &pos, msg, strlen(msg));
    json_text_put(buf, sizeof buf, &pos, "}");
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
    json_text_put(buf, len, pos, ",\"");
    json_text_put(buf, len, pos, name);
    json_text_put(buf, len, pos, "\":");
    json_escape_append(buf, len, pos, v, vlen);
}

void log_access(const struct access_entry *e)
{
    char buf[2048], num[256], kh[17];
    size_t pos = 0, plen = strcspn(e->target, "?");

    json_text_put(buf, sizeof buf, &pos, "{\"time\":");
    put_time(buf, sizeof buf, &pos);
    json_text_put(buf, sizeof buf, &pos, ",\"type\":\"access\"");
    if (e->request_id)
        put_str_field(buf, sizeof buf, &pos, "request_id", e->request_id,
                      strlen(e->request_id));
    put_str_field(buf, sizeof buf, &pos, "route", e->route, strlen(e->route));
    put_str_field(buf, sizeof buf, &pos, "policy", e->policy, strlen(e->policy));
    put_str_field(buf, sizeof buf, &pos, "method", e->method, strlen(e->method));
    put_str_field(buf, sizeof buf, &pos, "path", e->target, plen);
    snprintf(num, sizeof num, ",\"status\":%d", e->status);
    json_text_put(buf, sizeof buf, &pos, num);
    if (e->upstream_status) { /* left out when no status line came */
        snprintf(num, sizeof num, ",\"upstream_status\":%d", e->upstream_status);
        json_text_put(buf, sizeof buf, &pos, num);
    }
    put_str_field(buf, sizeof buf, &pos, "outcome", e->outcome, strlen(e->outcome));
    put_str_field(buf, sizeof buf, &pos, "reason", e->reason, strlen(e->reason));
    snprintf(num, sizeof num,
             ",\"attempt\":%u,\"permit_wait_ms\":%.3f,\"upstream_ms\":%.3f,"
             "\"total_ms\":%.3f,\"bytes_in\":%llu,\"bytes_out\":%llu",
             e->attempt, e->permit_wait_ms, e->upstream_ms, e->total_ms,
             (unsigned long long)e->bytes_in, (unsigned long long)e->bytes_out);
    json_text_put(buf, sizeof buf, &pos, num);
    put_str_field(buf, sizeof buf, &pos, "lane", e->lane ? e->lane : "",
                  e->lane ? strlen(e->lane) : 0);
    if (e->shadow)
        put_str_field(buf, sizeof buf, &pos, "shadow", e->shadow, strlen(e->shadow));
    if (e->key) {
        key_hash(e->key, kh);
        put_str_field(buf, sizeof buf, &pos, "key_hash", kh, strlen(kh));
    }
    json_text_put(buf, sizeof buf, &pos, "}");
    emit(buf, pos, sizeof buf);
}

void log_lookup(const struct lookup_entry *e)
{
    char buf[2048], num[256], kh[17], path[1024];
    size_t pos = 0;
    int plen = snprintf(path, sizeof path, "%s%.*s", e->base_path,
                        (int)strcspn(e->path, "?"), e->path);

    json_text_put(buf, sizeof buf, &pos, "{\"time\":");
    put_time(buf, sizeof buf, &pos);
    json_text_put(buf, sizeof buf, &pos, ",\"type\":\"lookup\",\"verify\":true");
    if (e->request_id)
        put_str_field(buf, sizeof buf, &pos, "request_id", e->request_id,
                      strlen(e->request_id));
    put_str_field(buf, sizeof buf, &pos, "policy", e->policy, strlen(e->policy));
    put_str_field(buf, sizeof buf, &pos, "upstream", e->upstream,
                  strlen(e->upstream));
    put_str_field(buf, sizeof buf, &pos, "method", e->method, strlen(e->method));
    put_str_field(buf, sizeof buf, &pos, "path", path,
                  plen < 0 ? 0 : (size_t)plen < sizeof path ? (size_t)plen
                                                             : sizeof path - 1);
    if (e->upstream_status)
        snprintf(num, sizeof num, ",\"upstream_status\":%d", e->upstream_status);
    else
        snprintf(num, sizeof num, ",\"upstream_status\":null");
    json_text_put(buf, sizeof buf, &pos, num);
    put_str_field(buf, sizeof buf, &pos, "result", e->result, strlen(e->result));
    snprintf(num, sizeof num, ",\"permit_wait_ms\":%.3f,\"upstream_ms\":%.3f",
             e->permit_wait_ms, e->upstream_ms);
    json_text_put(buf, sizeof buf, &pos, num);
    if (e->key) {
        key_hash(e->key, kh);
        put_str_field(buf, sizeof buf, &pos, "key_hash", kh, strlen(kh));
    }
    json_text_put(buf, sizeof buf, &pos, "}");
    emit(buf, pos, sizeof buf);
}
