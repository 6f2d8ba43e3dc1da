/* Integration-test harness: starts the real sluice binary and the real stub
 * on loopback ports, writes configs into a temp dir, and speaks raw HTTP/1.1
 * over sockets (so tests can also send what no well-behaved client would). */
#ifndef SLUICE_TESTS_INTEGRATION_HARNESS_H
#define SLUICE_TESTS_INTEGRATION_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

struct h_stub {
    pid_t pid;
    int port;
};

struct h_sluice {
    pid_t pid;
    int port, admin_port;
    char *dir;          /* temp dir: config, log, data */
    char *cfg_path;
    char *log_path;     /* sluice's stderr */
    unsigned long nofile; /* set before a start: sluice's RLIMIT_NOFILE, soft and
                           * hard (0: the test's own) */
    unsigned long nofile_hard; /* with nofile: a hard limit above it */
};

struct h_resp {
    int status;
    char *head;         /* raw header block after the status line */
    char *body;
    size_t body_len;
};

/* A free loopback TCP port (bound then released). */
int h_free_port(void);

/* Starts the stub with extra args (NULL-terminated, may be NULL). */
int h_stub_start(struct h_stub *s, const char *const *args);
void h_stub_stop(struct h_stub *s);
/* Starts the tests' forward proxy (sluice-fwdproxy, tests/stub/fwdproxy.c)
 * with extra args; stop it with h_stub_stop, read its counters with
 * h_stub_stat ("tunnels", "forwarded", "refused", "connections"). */
int h_fwdproxy_start(struct h_stub *s, const char *const *args);
/* One number of the stub's GET /_stub/stats ("requests", "in_flight_max"
 * ...), or -1 when it cannot be read. */
long long h_stub_stat(const struct h_stub *s, const char *name);
/* The same from GET /_stub/keys/<key> ("side_effects", "calls" ...); the
 * key is put in the path as it is (no escaping). */
long long h_stub_key_stat(const struct h_stub *s, const char *key, const char *name);

/* Writes a config (listen/admin/threads/store are added in front of `body`)
 * and starts sluice; waits until /readyz answers 200. */
int h_sluice_start(struct h_sluice *s, const char *body);
/* Same with a config text used as is (ports must be filled by the caller);
 * yaml NULL restarts on the config file written before. */
int h_sluice_start_raw(struct h_sluice *s, const char *yaml, int port,
                       int admin_port);
/* Writes the config as h_sluice_start does (on free ports) and starts
 * sluice without waiting for it; h_sluice_wait_ready then waits until
 * /readyz answers 200 (0), or the process exits or 10 s pass (-1). */
int h_sluice_spawn(struct h_sluice *s, const char *body);
int h_sluice_wait_ready(struct h_sluice *s);
/* Rewrites the config file (same ports, dir and defaults as at start) with
 * a new body, for reload tests. */
int h_sluice_rewrite(struct h_sluice *s, const char *body);
/* SIGTERM, then waits (up to timeout_s); returns the exit status or -1. */
int h_sluice_stop(struct h_sluice *s, int timeout_s);
void h_sluice_cleanup(struct h_sluice *s);

/* A connected TCP socket to 127.0.0.1:port, or -1. */
int h_connect(int port);
/* Sends all of len bytes (0 or -1). */
int h_send_all(int fd, const char *p, size_t len);

/* Sends raw bytes and reads the response until the server closes (10 s
 * limit). 0 or -1. */
int h_http_raw(int port, const char *req, size_t len, struct h_resp *r);
/* Builds and sends "METHOD target" with extra header lines (each ending in
 * \r\n, may be NULL), a body, Connection: close and Content-Length. */
int h_http(int port, const char *method, const char *target,
           const char *headers, const char *body, size_t body_len,
           struct h_resp *r);
/* First header value (owned copy) or NULL. */
char *h_header(const struct h_resp *r, const char *name);
/* The same value in a static buffer ("(none)" when absent), for asserts
 * that compare it in place: nothing to free, overwritten by the next call. */
const char *h_header_str(const struct h_resp *r, const char *name);
void h_resp_free(struct h_resp *r);

/* Makes sluice's stderr a pipe the test reads instead of a file (call before
 * h_sluice_spawn, which then opens it): while the test stops reading, a loop
 * that logs blocks in write(2), as behind a stalled log collector. size: the
 * pipe's capacity (at least a page). Returns the read end (non-blocking), or
 * -1. */
int h_log_pipe(struct h_sluice *s, int size);
/* Reads and drops what the pipe holds now; the bytes read, or -1 at EOF. */
long h_log_pipe_drain(int fd);

/* Runs a command line via /bin/sh; returns its exit status. */
int h_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* True when the file contains the text. */
bool h_file_contains(const char *path, const char *text);

#endif
