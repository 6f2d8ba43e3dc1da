#define _GNU_SOURCE
#include "support/sentinel_server.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "support/redis_server.h"
#include "support/testutil.h"

#define READY_WAIT_MS 5000
#define STOP_WAIT_MS 3000
#define POLL_MS 50

/* One command's reply (free it), or NULL. */
static redisReply *ask(const struct sentinel_server *s, const char *fmt,
                       const char *master)
{
    struct timeval tv = {0, 300000};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", (int)s->port, tv);
    redisReply *r = NULL;

    if (c && !c->err && redisSetTimeout(c, tv) == REDIS_OK)
        r = redisCommand(c, fmt, master);
    redisFree(c);
    return r;
}

/* Whether a TLS sentinel answers PING (through redis-cli --tls). */
static bool tls_up(const struct sentinel_server *s)
{
    char cmd[4096], out[64] = "";
    FILE *p;

    snprintf(cmd, sizeof cmd, "redis-cli --tls --cacert %s/ca.pem -h 127.0.0.1 -p %u PING 2>&1",
             s->tls_dir, s->port);
    if (!(p = popen(cmd, "r")))
        return false;
    if (!fgets(out, sizeof out, p))
        out[0] = '\0';
    while (fgets(cmd, sizeof cmd, p))
        ;
    return pclose(p) == 0 && !strncmp(out, "PONG", 4);
}

/* Sentinel rewrites its config file: it must be its own, writable. The
 * timings make a failover take a few seconds instead of a minute. */
static char *write_conf(const struct sentinel_server *s, const char *master,
                        unsigned primary_port, const char *password)
{
    char text[4096];
    int n = snprintf(text, sizeof text,
        "port %u\nbind 127.0.0.1\ndaemonize no\ndir %s\nlogfile %s/sentinel.log\n"
        "sentinel monitor %s 127.0.0.1 %u 1\n"
        "sentinel down-after-milliseconds %s 1000\n"
        "sentinel failover-timeout %s 5000\n"
        "sentinel parallel-syncs %s 1\n",
        s->port, s->dir, s->dir, master, primary_port, master, master, master);

    if (password && *password)
        n += snprintf(text + n, sizeof text - (size_t)n, "sentinel auth-pass %s %s\n",
                      master, password);
    if (s->tls_dir)
        snprintf(text + n, sizeof text - (size_t)n,
                 "port 0\ntls-port %u\ntls-cert-file %s/server.pem\n"
                 "tls-key-file %s/server.key\ntls-ca-cert-file %s/ca.pem\n"
                 "tls-replication yes\ntls-auth-clients no\n",
                 s->port, s->tls_dir, s->tls_dir, s->tls_dir);
    return tu_write_file(s->dir, "sentinel.conf", text);
}

int sentinel_server_start(struct sentinel_server *s, const char *master,
                          unsigned primary_port, const char *password)
{
    char *conf;

    if (!s->dir && !(s->dir = tu_mkdtemp("sentinel")))
        return -1;
    if (!(s->port = redis_server_free_port()) ||
        !(conf = write_conf(s, master, primary_port, password)))
        return -1;
    s->pid = fork();
    if (s->pid == 0) {
        execlp("redis-sentinel", "redis-sentinel", conf, (char *)NULL);
        _exit(127);
    }
    free(conf);
    if (s->pid < 0) {
        s->pid = 0;
        return -1;
    }
    for (int waited = 0; waited < READY_WAIT_MS; waited += POLL_MS) {
        redisReply *r = s->tls_dir ? NULL : ask(s, "PING", NULL);
        bool up = s->tls_dir ? tls_up(s) : r && r->type != REDIS_REPLY_ERROR;
        int status;

        freeReplyObject(r);
        if (up)
            return 0;
        if (waitpid(s->pid, &status, WNOHANG) == s->pid) {
            s->pid = 0;
            return -1; /* exited: not installed, or the port taken */
        }
        tu_sleep_ms(POLL_MS);
    }
    return -1;
}

unsigned sentinel_server_primary(const struct sentinel_server *s,
                                 const char *master)
{
    redisReply *r = ask(s, "SENTINEL get-master-addr-by-name %s", master);
    unsigned port = 0;

    if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
        r->element[1]->type == REDIS_REPLY_STRING)
        port = (unsigned)strtoul(r->element[1]->str, NULL, 10);
    freeReplyObject(r);
    return port;
}

/* Replicas whose flags are just "slave" (not s_down, not disconnected). */
static unsigned replicas_up(const struct sentinel_server *s, const char *master)
{
    redisReply *r = ask(s, "SENTINEL replicas %s", master);
    unsigned n = 0;

    for (size_t i = 0; r && r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
        const redisReply *kv = r->element[i];

        for (size_t j = 0; kv->type == REDIS_REPLY_ARRAY && j + 1 < kv->elements; j += 2)
            if (kv->element[j]->type == REDIS_REPLY_STRING &&
                strcmp(kv->element[j]->str, "flags") == 0 &&
                kv->element[j + 1]->type == REDIS_REPLY_STRING &&
                strcmp(kv->element[j + 1]->str, "slave") == 0)
                n++;
    }
    freeReplyObject(r);
    return n;
}

bool sentinel_server_wait_replicas(const struct sentinel_server *s,
                                   const char *master, unsigned n, unsigned ms)
{
    for (unsigned waited = 0; waited < ms; waited += POLL_MS) {
        if (replicas_up(s, master) >= n)
            return true;
        tu_sleep_ms(POLL_MS);
    }
    return false;
}

bool sentinel_server_failover(const struct sentinel_server *s, const char *master)
{
    redisReply *r = ask(s, "SENTINEL failover %s", master);
    bool ok = r && r->type != REDIS_REPLY_ERROR;

    freeReplyObject(r);
    return ok;
}

void sentinel_server_destroy(struct sentinel_server *s)
{
    tu_stop_pid(&s->pid, STOP_WAIT_MS);
    if (s->dir) {
        tu_rm_rf(s->dir);
        free(s->dir);
        s->dir = NULL;
    }
}
