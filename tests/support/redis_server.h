/* A real redis-server for tests: on 127.0.0.1, a free port, a temp dir, no
 * persistence; started and stopped by its pid; a primary, or a replica of
 * one. Linked only by the tests that need it (tests/CMakeLists.txt). */
#ifndef SLUICE_TESTS_SUPPORT_REDIS_SERVER_H
#define SLUICE_TESTS_SUPPORT_REDIS_SERVER_H

#include <stdbool.h>
#include <sys/types.h>

struct redis_server {
    pid_t pid;              /* 0: not running */
    unsigned port;
    char *dir;              /* its working dir and log */
    char password[64];      /* "" : none (requirepass, and masterauth) */
    unsigned replicaof;     /* set before start: a replica of the server on
                               that port (0: a primary) */
    const char *tls_dir;    /* set before start: TLS only (no plain port),
                               on port, with tls_dir/{ca.pem,server.pem,
                               server.key}; the test's own commands go
                               through redis-cli --tls with client.pem */
    bool tls_auth_clients;  /* with tls_dir: a client certificate required */
    bool cluster;           /* set before start: --cluster-enabled, its
                               nodes.conf in dir, node timeout 1 s, full
                               coverage not required; with tls_dir, its
                               bus and replication over TLS too */
};

/* Starts one and waits (at most 5 s) until it answers PING. port 0 picks a
 * free one (for a cluster node, with its bus port free too); a given port restarts a server on the same one. 0 or -1. */
int redis_server_start(struct redis_server *rs, unsigned port,
                       const char *password);

/* Stops it (SIGTERM, then SIGKILL after 3 s) and reaps it; keeps port and
 * dir for a restart. */
void redis_server_stop(struct redis_server *rs);

/* kill -9, and reaps it. */
void redis_server_kill(struct redis_server *rs);

/* Waits (at most ms) until INFO's section holds text, e.g.
 * "master_link_status:up" in "replication". */
bool redis_server_wait_info(const struct redis_server *rs, const char *section,
                            const char *text, unsigned ms);

/* A free port on 127.0.0.1 (0 if none), for the sentinel's. */
unsigned redis_server_free_port(void);

/* A free port on 127.0.0.1 whose port + 10000 (a cluster node's bus) is
 * free too (20000..39999; 0 if none found in 1000 tries). */
unsigned redis_server_bus_safe_port(void);

/* Stops it if running and removes its dir. */
void redis_server_destroy(struct redis_server *rs);

/* Runs one command (space-separated words) on it; true if the reply is not
 * an error. For test set-up: SCRIPT FLUSH, CONFIG SET, ... (INFO and the
 * waits on it need a plain server.) */
bool redis_server_cmd(const struct redis_server *rs, const char *cmd);

#endif
