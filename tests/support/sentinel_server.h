/* A real redis-sentinel for tests: on 127.0.0.1, a free port, its config
 * file in a temp dir, watching one primary (quorum 1, down after 1 s), so
 * a kill -9 of the primary is followed by a failover within seconds.
 * Started and stopped by its pid. Linked only by the tests that need it
 * (tests/CMakeLists.txt). */
#ifndef SLUICE_TESTS_SUPPORT_SENTINEL_SERVER_H
#define SLUICE_TESTS_SUPPORT_SENTINEL_SERVER_H

#include <stdbool.h>
#include <sys/types.h>

struct sentinel_server {
    pid_t pid;              /* 0: not running */
    unsigned port;
    char *dir;              /* its config file and log */
    const char *tls_dir;    /* set before start: TLS only (no plain port),
                               to clients and to the primary it watches,
                               with tls_dir/{ca.pem,server.pem,server.key};
                               then only start and destroy work */
};

/* Starts one watching master (the primary on 127.0.0.1:primary_port,
 * logged into with password, NULL: none) and waits (at most 5 s) until it
 * answers PING. 0 or -1. */
int sentinel_server_start(struct sentinel_server *s, const char *master,
                          unsigned primary_port, const char *password);

/* The port of the primary it names for master; 0 when it names none or
 * does not answer. */
unsigned sentinel_server_primary(const struct sentinel_server *s,
                                 const char *master);

/* Waits (at most ms) until it knows n replicas of master that are up. */
bool sentinel_server_wait_replicas(const struct sentinel_server *s,
                                   const char *master, unsigned n, unsigned ms);

/* SENTINEL FAILOVER master: the replica is promoted, the primary demoted,
 * both alive. True when Sentinel accepted it. */
bool sentinel_server_failover(const struct sentinel_server *s, const char *master);

/* Stops it if running (SIGTERM, then SIGKILL) and removes its dir. */
void sentinel_server_destroy(struct sentinel_server *s);

#endif
