#define _GNU_SOURCE
#include "support/redis_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "support/testutil.h"

#define READY_WAIT_MS 5000
#define STOP_WAIT_MS 3000
#define POLL_MS 20

/* Binds 127.0.0.1:0 and reads back the port the kernel chose. */
unsigned redis_server_free_port(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET};
    socklen_t len = sizeof a;
    unsigned port = 0;
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    if (fd < 0)
        return 0;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

/* A node's cluster bus listens on its port + 10000: both must be free. */
unsigned redis_server_bus_safe_port(void)
{
    static bool seeded;

    if (!seeded) {
        srand((unsigned)getpid() ^ (unsigned)time(NULL));
        seeded = true;
    }
    for (int tries = 0; tries < 1000; tries++) {
        unsigned p = 20000 + (unsigned)(rand() % 20000);
        struct sockaddr_in a = {.sin_family = AF_INET};
        int fd[2] = {socket(AF_INET, SOCK_STREAM, 0), socket(AF_INET, SOCK_STREAM, 0)};
        bool ok = fd[0] >= 0 && fd[1] >= 0;

        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        for (int k = 0; ok && k < 2; k++) {
            a.sin_port = htons((uint16_t)(p + 10000 * (unsigned)k));
            ok = bind(fd[k], (struct sockaddr *)&a, sizeof a) == 0;
        }
        for (int k = 0; k < 2; k++)
            if (fd[k] >= 0)
                close(fd[k]);
        if (ok)
            return p;
    }
    return 0;
}

static redisContext *connect_to(const struct redis_server *rs)
{
    struct timeval tv = {0, 200000};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", (int)rs->port, tv);

    if (c && !c->err && rs->password[0]) {
        redisReply *r = redisCommand(c, "AUTH %s", rs->password);

        freeReplyObject(r);
    }
    return c;
}

/* Over TLS, through redis-cli (the test's own client stays plain hiredis). */
static bool tls_cmd(const struct redis_server *rs, const char *cmd)
{
    char line[4096], out[256] = "";
    FILE *p;
    bool ok;

    snprintf(line, sizeof line,
             "redis-cli --tls --cacert %s/ca.pem --cert %s/client.pem --key %s/client.key "
             "-h 127.0.0.1 -p %u %s%s %s 2>&1",
             rs->tls_dir, rs->tls_dir, rs->tls_dir, rs->port,
             rs->password[0] ? "--no-auth-warning -a " : "", rs->password, cmd);
    if (!(p = popen(line, "r")))
        return false;
    if (!fgets(out, sizeof out, p))
        out[0] = '\0';
    while (fgets(line, sizeof line, p))
        ;
    ok = pclose(p) == 0 && out[0] && strncmp(out, "ERR", 3) && strncmp(out, "WRONGPASS", 9) &&
         strncmp(out, "NOAUTH", 6) && strncmp(out, "NOPERM", 6) &&
         strncmp(out, "Could not connect", 17) && strncmp(out, "Error", 5);
    return ok;
}

bool redis_server_cmd(const struct redis_server *rs, const char *cmd)
{
    redisContext *c;
    redisReply *r = NULL;
    bool ok = false;
    char buf[256], *save = NULL, *w;
    const char *argv[16];
    int argc = 0;

    if (rs->tls_dir)
        return tls_cmd(rs, cmd);
    c = connect_to(rs);
    snprintf(buf, sizeof buf, "%s", cmd);
    for (w = strtok_r(buf, " ", &save); w && argc < 16; w = strtok_r(NULL, " ", &save))
        argv[argc++] = w;
    if (c && !c->err && argc) {
        r = redisCommandArgv(c, argc, argv, NULL);
        ok = r && r->type != REDIS_REPLY_ERROR;
    }
    freeReplyObject(r);
    redisFree(c);
    return ok;
}

static void exec_server(const struct redis_server *rs)
{
    char port[16], primary[16], log[4096], cert[4096], key[4096], ca[4096];
    const char *argv[48] = {"redis-server", "--bind", "127.0.0.1", "--port",
                            port, "--save", "", "--appendonly", "no",
                            "--daemonize", "no", "--dir", rs->dir,
                            "--logfile", log};
    int n = 15;

    snprintf(port, sizeof port, "%u", rs->port);
    snprintf(primary, sizeof primary, "%u", rs->replicaof);
    snprintf(log, sizeof log, "%s/redis.log", rs->dir);
    if (rs->password[0]) {
        argv[n++] = "--requirepass", argv[n++] = rs->password;
        /* A replica, or a primary demoted by a failover, must log in. */
        argv[n++] = "--masterauth", argv[n++] = rs->password;
    }
    if (rs->replicaof)
        argv[n++] = "--replicaof", argv[n++] = "127.0.0.1", argv[n++] = primary;
    if (rs->cluster) {
        argv[n++] = "--cluster-enabled", argv[n++] = "yes";
        argv[n++] = "--cluster-config-file", argv[n++] = "nodes.conf";
        argv[n++] = "--cluster-node-timeout", argv[n++] = "1000";
        /* The slots of the other primaries stay served while one is down. */
        argv[n++] = "--cluster-require-full-coverage", argv[n++] = "no";
    }
    if (rs->tls_dir) {
        snprintf(cert, sizeof cert, "%s/server.pem", rs->tls_dir);
        snprintf(key, sizeof key, "%s/server.key", rs->tls_dir);
        snprintf(ca, sizeof ca, "%s/ca.pem", rs->tls_dir);
        argv[4] = "0"; /* no plain port */
        argv[n++] = "--tls-port", argv[n++] = port;
        argv[n++] = "--tls-cert-file", argv[n++] = cert;
        argv[n++] = "--tls-key-file", argv[n++] = key;
        argv[n++] = "--tls-ca-cert-file", argv[n++] = ca;
        argv[n++] = "--tls-auth-clients", argv[n++] = rs->tls_auth_clients ? "yes" : "no";
        if (rs->cluster) {
            /* The bus and the replicas over TLS too: no plain port at all. */
            argv[n++] = "--tls-cluster", argv[n++] = "yes";
            argv[n++] = "--tls-replication", argv[n++] = "yes";
        }
    }
    argv[n] = NULL;
    execvp("redis-server", (char *const *)argv);
    _exit(127);
}

static int wait_ready(struct redis_server *rs)
{
    for (int waited = 0; waited < READY_WAIT_MS; waited += POLL_MS) {
        int status;

        if (waitpid(rs->pid, &status, WNOHANG) == rs->pid) {
            rs->pid = 0;
            return -1; /* it exited: a port taken meanwhile, say */
        }
        if (redis_server_cmd(rs, "PING"))
            return 0;
        tu_sleep_ms(POLL_MS);
    }
    redis_server_stop(rs);
    return -1;
}

int redis_server_start(struct redis_server *rs, unsigned port,
                       const char *password)
{
    if (!rs->dir && !(rs->dir = tu_mkdtemp("redis")))
        return -1;
    if (password)
        snprintf(rs->password, sizeof rs->password, "%s", password);
    rs->port = port ? port : rs->cluster ? redis_server_bus_safe_port()
                                         : redis_server_free_port();
    if (!rs->port)
        return -1;
    rs->pid = fork();
    if (rs->pid < 0) {
        rs->pid = 0;
        return -1;
    }
    if (rs->pid == 0)
        exec_server(rs);
    return wait_ready(rs);
}

void redis_server_stop(struct redis_server *rs)
{
    tu_stop_pid(&rs->pid, STOP_WAIT_MS);
}

void redis_server_kill(struct redis_server *rs)
{
    int status;

    if (rs->pid <= 0)
        return;
    kill(rs->pid, SIGKILL);
    waitpid(rs->pid, &status, 0);
    rs->pid = 0;
}

static bool info_has(const struct redis_server *rs, const char *section,
                     const char *text)
{
    redisContext *c = connect_to(rs);
    redisReply *r = NULL;
    bool has = false;

    if (c && !c->err)
        r = redisCommand(c, "INFO %s", section);
    has = r && r->type == REDIS_REPLY_STRING && strstr(r->str, text);
    freeReplyObject(r);
    redisFree(c);
    return has;
}

bool redis_server_wait_info(const struct redis_server *rs, const char *section,
                            const char *text, unsigned ms)
{
    for (unsigned waited = 0; waited < ms; waited += POLL_MS) {
        if (info_has(rs, section, text))
            return true;
        tu_sleep_ms(POLL_MS);
    }
    return false;
}

void redis_server_destroy(struct redis_server *rs)
{
    redis_server_stop(rs);
    if (rs->dir) {
        tu_rm_rf(rs->dir);
        free(rs->dir);
        rs->dir = NULL;
    }
}
