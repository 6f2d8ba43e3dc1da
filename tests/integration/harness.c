#define _GNU_SOURCE
#include "integration/harness.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "support/testutil.h"

#define IO_TIMEOUT_MS 10000

static const char *env_or(const char *name, const char *def)
{
    const char *v = getenv(name);
    return v && *v ? v : def;
}

/* The low end of the kernel's ephemeral range, from which it picks the
 * local ports of outgoing connections. */
static int ephemeral_low(void)
{
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    int low = 32768;

    if (f) {
        if (fscanf(f, "%d", &low) != 1)
            low = 32768;
        fclose(f);
    }
    return low;
}

/* A port from below the ephemeral range, bound once to see it is free, and
 * handed out once per process: a port the kernel picked for us (bind to 0)
 * lies in the ephemeral range, where an outgoing connection of any test can
 * take it between this check and sluice's bind ("Address already in use"). */
int h_free_port(void)
{
    enum { LOW = 10000 };
    static unsigned char given[65536 / 8];
    static unsigned seed;
    int high = ephemeral_low() - 1;

    if (high < LOW + 1000)
        high = LOW + 1000; /* a tiny range: overlap rather than fail */
    if (!seed)
        seed = (unsigned)getpid() ^ (unsigned)time(NULL);
    for (int tries = 0; tries < 1000; tries++) {
        int port = LOW + (int)(rand_r(&seed) % (unsigned)(high - LOW + 1));
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        int fd, ok;

        if (given[port / 8] & (1u << (port % 8)))
            continue;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if ((fd = socket(AF_INET, SOCK_STREAM, 0)) < 0)
            return -1;
        ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
        close(fd);
        if (ok) {
            given[port / 8] |= (unsigned char)(1u << (port % 8));
            return port;
        }
    }
    return -1;
}

static long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

/* ---- the stub ----------------------------------------------------------- */

/* Starts bin --listen 127.0.0.1:0 args... and reads its "listening" line. */
static int start_listener(struct h_stub *s, const char *bin, const char *const *args)
{
    const char *argv[32] = {bin, "--listen", "127.0.0.1:0"};
    int n = 3, pfd[2];
    char line[128] = {0};
    size_t got = 0;

    for (; args && *args && n < 30; args++)
        argv[n++] = *args;
    argv[n] = NULL;
    if (pipe(pfd) != 0)
        return -1;
    s->pid = fork();
    if (s->pid == 0) {
        /* A test that dies must not leave its servers behind. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(pfd[1], STDOUT_FILENO);
        close(pfd[0]);
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    close(pfd[1]);
    while (got < sizeof line - 1 && !strchr(line, '\n')) {
        struct pollfd p = {pfd[0], POLLIN, 0};
        ssize_t r;
        if (poll(&p, 1, IO_TIMEOUT_MS) <= 0)
            break;
        r = read(pfd[0], line + got, sizeof line - 1 - got);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(pfd[0]);
    s->port = -1;
    if (strncmp(line, "listening ", 10) == 0 && strrchr(line, ':'))
        s->port = atoi(strrchr(line, ':') + 1);
    return s->port > 0 ? 0 : -1;
}

int h_stub_start(struct h_stub *s, const char *const *args)
{
    return start_listener(s, env_or("SLUICE_STUB", SLUICE_BUILD_DIR "/sluice-stub"), args);
}

int h_fwdproxy_start(struct h_stub *s, const char *const *args)
{
    return start_listener(s, env_or("SLUICE_FWDPROXY", SLUICE_BUILD_DIR "/sluice-fwdproxy"),
                          args);
}

void h_stub_stop(struct h_stub *s)
{
    if (s->pid > 0) {
        kill(s->pid, SIGTERM);
        waitpid(s->pid, NULL, 0);
        s->pid = 0;
    }
}

/* One integer member of the JSON the stub answers at path, or -1. */
static long long stub_number(const struct h_stub *s, const char *path, const char *name)
{
    struct h_resp r;
    json_t *j = NULL, *v;
    long long n = -1;

    if (h_http(s->port, "GET", path, NULL, NULL, 0, &r) == 0)
        j = json_loads(r.body ? r.body : "", 0, NULL);
    h_resp_free(&r);
    if (j && json_is_integer(v = json_object_get(j, name)))
        n = json_integer_value(v);
    json_decref(j);
    return n;
}

long long h_stub_stat(const struct h_stub *s, const char *name)
{
    return stub_number(s, "/_stub/stats", name);
}

long long h_stub_key_stat(const struct h_stub *s, const char *key, const char *name)
{
    char path[512];

    snprintf(path, sizeof path, "/_stub/keys/%s", key);
    return stub_number(s, path, name);
}

/* ---- sluice ------------------------------------------------------------- */

static bool ready(int admin_port)
{
    struct h_resp r = {0};
    bool ok = h_http(admin_port, "GET", "/readyz", NULL, NULL, 0, &r) == 0 &&
              r.status == 200;
    h_resp_free(&r);
    return ok;
}

/* Forks and execs sluice on s->cfg_path, its stderr and stdout to the log. */
static int spawn(struct h_sluice *s)
{
    const char *bin = env_or("SLUICE_BIN", SLUICE_BUILD_DIR "/sluice");

    if (!s->log_path && asprintf(&s->log_path, "%s/sluice.log", s->dir) < 0)
        return -1;
    s->pid = fork();
    if (s->pid == 0) {
        int fd;

        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (s->nofile) {
            struct rlimit rl = {s->nofile, s->nofile_hard ? s->nofile_hard : s->nofile};
            if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
                _exit(125);
        }
        fd = open(s->log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
        dup2(fd, STDERR_FILENO);
        dup2(fd, STDOUT_FILENO);
        if (chdir(s->dir) != 0)
            _exit(126);
        execl(bin, bin, "-c", s->cfg_path, (char *)NULL);
        _exit(127);
    }
    return s->pid > 0 ? 0 : -1;
}

int h_log_pipe(struct h_sluice *s, int size)
{
    int fd;

    if (!s->dir)
        s->dir = tu_mkdtemp("it");
    free(s->log_path);
    if (asprintf(&s->log_path, "%s/sluice.log", s->dir) < 0 ||
        mkfifo(s->log_path, 0600) != 0)
        return -1;
    /* Non-blocking, so the open does not wait for sluice's end. */
    fd = open(s->log_path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0)
        fcntl(fd, F_SETPIPE_SZ, size);
    return fd;
}

long h_log_pipe_drain(int fd)
{
    char buf[4096];
    long total = 0;
    ssize_t n;

    while ((n = read(fd, buf, sizeof buf)) > 0)
        total += n;
    return n == 0 && total == 0 ? -1 : total;
}

int h_sluice_wait_ready(struct h_sluice *s)
{
    long deadline = now_ms() + IO_TIMEOUT_MS;
    int status;

    while (now_ms() < deadline) {
        if (waitpid(s->pid, &status, WNOHANG) == s->pid) {
            s->pid = 0;
            return -1;
        }
        if (ready(s->admin_port))
            return 0;
        usleep(20000);
    }
    return -1;
}

int h_sluice_start_raw(struct h_sluice *s, const char *yaml, int port,
                       int admin_port)
{
    if (!s->dir)
        s->dir = tu_mkdtemp("it");
    if (yaml) { /* NULL: restart on the config written before */
        free(s->cfg_path);
        s->cfg_path = tu_write_file(s->dir, "sidecar.yaml", yaml);
    }
    s->port = port;
    s->admin_port = admin_port;
    if (spawn(s) != 0)
        return -1;
    return h_sluice_wait_ready(s);
}

static char *full_config(const struct h_sluice *s, int port, int admin,
                         const char *body)
{
    char *yaml;

    /* Two loops by default, so cross-thread paths are exercised; a body
     * with its own store block (fleet tests: Redis) keeps it. */
    bool own_store = !strncmp(body, "store:", 6) || strstr(body, "\nstore:");

    if (asprintf(&yaml,
                 "listen: 127.0.0.1:%d\nadmin: 127.0.0.1:%d\n%s"
                 "%s%s%s%s",
                 port, admin,
                 strncmp(body, "threads:", 8) && !strstr(body, "\nthreads:")
                     ? "threads: 2\n" : "",
                 own_store ? "" : "store: {path: ", own_store ? "" : s->dir,
                 own_store ? "" : "/data}\n", body) < 0)
        return NULL;
    return yaml;
}

int h_sluice_rewrite(struct h_sluice *s, const char *body)
{
    char *yaml = full_config(s, s->port, s->admin_port, body);
    char *path;

    if (!yaml)
        return -1;
    path = tu_write_file(s->dir, "sidecar.yaml", yaml);
    free(yaml);
    free(path);
    return 0;
}

int h_sluice_start(struct h_sluice *s, const char *body)
{
    int rc = -1;

    if (!s->dir)
        s->dir = tu_mkdtemp("it");
    /* A port found free can be taken before sluice binds it (by another
     * test's outgoing connections, say): then try again with new ports. */
    for (int attempt = 0; attempt < 5 && rc != 0; attempt++) {
        int port = h_free_port(), admin = h_free_port();
        char *yaml = full_config(s, port, admin, body);

        if (!yaml)
            return -1;
        rc = h_sluice_start_raw(s, yaml, port, admin);
        free(yaml);
        if (rc != 0 && !(s->log_path && h_file_contains(s->log_path, "already in use")))
            break;
    }
    return rc;
}

int h_sluice_spawn(struct h_sluice *s, const char *body)
{
    char *yaml;

    if (!s->dir)
        s->dir = tu_mkdtemp("it");
    s->port = h_free_port();
    s->admin_port = h_free_port();
    yaml = full_config(s, s->port, s->admin_port, body);
    if (!yaml)
        return -1;
    free(s->cfg_path);
    s->cfg_path = tu_write_file(s->dir, "sidecar.yaml", yaml);
    free(yaml);
    return spawn(s);
}

int h_sluice_stop(struct h_sluice *s, int timeout_s)
{
    long deadline = now_ms() + timeout_s * 1000L;
    int status;

    if (s->pid <= 0)
        return -1;
    kill(s->pid, SIGTERM);
    while (now_ms() < deadline) {
        if (waitpid(s->pid, &status, WNOHANG) == s->pid) {
            s->pid = 0;
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        }
        usleep(10000);
    }
    kill(s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
    s->pid = 0;
    return -1;
}

void h_sluice_cleanup(struct h_sluice *s)
{
    /* A clean stop, so a sanitizer build checks for leaks at exit. */
    if (s->pid > 0)
        h_sluice_stop(s, 10);
    if (s->dir && !getenv("SLUICE_KEEP_TMP"))
        tu_rm_rf(s->dir);
    free(s->dir);
    free(s->cfg_path);
    free(s->log_path);
    memset(s, 0, sizeof *s);
}

/* ---- raw HTTP ----------------------------------------------------------- */

int h_connect(int port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

int h_send_all(int fd, const char *p, size_t len)
{
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static char *read_all(int fd, size_t *len)
{
    size_t cap = 65536, got = 0;
    char *buf = malloc(cap);
    long deadline = now_ms() + IO_TIMEOUT_MS;

    while (buf && now_ms() < deadline) {
        struct pollfd p = {fd, POLLIN, 0};
        ssize_t n;

        if (poll(&p, 1, (int)(deadline - now_ms())) <= 0)
            break;
        if (got + 4096 > cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) {
                free(buf);
                return NULL;
            }
            buf = nb;
        }
        n = recv(fd, buf + got, cap - got - 1, 0);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    if (buf)
        buf[got] = '\0';
    *len = got;
    return buf;
}

/* De-chunks in place; returns the body length. */
static size_t dechunk(char *b, size_t len)
{
    size_t in = 0, out = 0;

    while (in < len) {
        char *end;
        unsigned long n = strtoul(b + in, &end, 16);
        char *crlf = strstr(end, "\r\n");
        if (!crlf || n == 0)
            break;
        in = (size_t)(crlf + 2 - b);
        memmove(b + out, b + in, n);
        out += n;
        in += n + 2;
    }
    return out;
}

static int parse_response(char *raw, size_t len, struct h_resp *r)
{
    char *eoh = strstr(raw, "\r\n\r\n"), *te;
    size_t hl;

    if (strncmp(raw, "HTTP/1.", 7) != 0 || !eoh)
        return -1;
    r->status = atoi(raw + 9);
    hl = (size_t)(eoh - raw);
    r->head = strndup(raw, hl + 2);
    r->body_len = len - hl - 4;
    r->body = malloc(r->body_len + 1);
    memcpy(r->body, eoh + 4, r->body_len);
    r->body[r->body_len] = '\0';
    te = h_header(r, "Transfer-Encoding");
    if (te && strcasecmp(te, "chunked") == 0)
        r->body_len = dechunk(r->body, r->body_len);
    free(te);
    return 0;
}

int h_http_raw(int port, const char *req, size_t len, struct h_resp *r)
{
    int fd = h_connect(port), rc = -1;
    char *raw = NULL;
    size_t got = 0;

    memset(r, 0, sizeof *r);
    if (fd < 0)
        return -1;
    if (h_send_all(fd, req, len) == 0 && (raw = read_all(fd, &got)))
        rc = parse_response(raw, got, r);
    free(raw);
    close(fd);
    return rc;
}

int h_http(int port, const char *method, const char *target,
           const char *headers, const char *body, size_t body_len,
           struct h_resp *r)
{
    char *head, *full, len[48] = "";
    int n, rc;

    if (body)
        snprintf(len, sizeof len, "Content-Length: %zu\r\n", body_len);
    n = asprintf(&head, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                        "Connection: close\r\n%s%s\r\n",
                 method, target, headers ? headers : "", len);
    if (n < 0)
        return -1;
    full = malloc((size_t)n + body_len + 1);
    if (!full) {
        free(head);
        return -1;
    }
    memcpy(full, head, (size_t)n);
    if (body && body_len)
        memcpy(full + n, body, body_len);
    rc = h_http_raw(port, full, (size_t)n + (body ? body_len : 0), r);
    free(full);
    free(head);
    return rc;
}

char *h_header(const struct h_resp *r, const char *name)
{
    size_t nl = strlen(name);

    for (const char *p = r->head; p && *p;) {
        const char *eol = strstr(p, "\r\n");
        if (!eol)
            break;
        if (strncasecmp(p, name, nl) == 0 && p[nl] == ':') {
            const char *v = p + nl + 1;
            while (*v == ' ')
                v++;
            return strndup(v, (size_t)(eol - v));
        }
        p = eol + 2;
    }
    return NULL;
}

const char *h_header_str(const struct h_resp *r, const char *name)
{
    static char keep[256];
    char *v = h_header(r, name);

    snprintf(keep, sizeof keep, "%s", v ? v : "(none)");
    free(v);
    return keep;
}

void h_resp_free(struct h_resp *r)
{
    free(r->head);
    free(r->body);
    memset(r, 0, sizeof *r);
}

int h_sh(const char *fmt, ...)
{
    char *cmd;
    va_list ap;
    int rc;

    va_start(ap, fmt);
    rc = vasprintf(&cmd, fmt, ap);
    va_end(ap);
    if (rc < 0)
        return -1;
    rc = system(cmd);
    free(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

bool h_file_contains(const char *path, const char *text)
{
    size_t len;
    char *buf = tu_read_file(path, &len);
    bool found = buf && memmem(buf, len, text, strlen(text));

    free(buf);
    return found;
}
