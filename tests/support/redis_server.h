/* A real redis-server for tests: on 127.0.0.1, a free port, a temp dir, no
 * persistence; started and stopped by its pid. Linked only by the tests
 * that need it (tests/CMakeLists.txt). */
#ifndef SLUICE_TESTS_REDIS_SERVER_H
#define SLUICE_TESTS_REDIS_SERVER_H

#include <stdbool.h>
#include <sys/types.h>

struct redis_server {
    pid_t pid;              /* 0: not running */
    unsigned port;
    char *dir;              /* its working dir and log */
    char password[64];      /* "" : none (requirepass) */
};

/* Starts one and waits (at most 5 s) until it answers PING. port 0 picks a
 * free one; a given port restarts a server on the same one. 0 or -1. */
int redis_server_start(struct redis_server *rs, unsigned port,
                       const char *password);

/* Stops it (SIGTERM, then SIGKILL after 3 s) and reaps it; keeps port and
 * dir for a restart. */
void redis_server_stop(struct redis_server *rs);

/* Stops it if running and removes its dir. */
void redis_server_destroy(struct redis_server *rs);

/* Runs one command (space-separated words) on it; true if the reply is not
 * an error. For test set-up: SCRIPT FLUSH, CONFIG SET, ... */
bool redis_server_cmd(const struct redis_server *rs, const char *cmd);

#endif
