/* Small helpers shared by the unit and integration tests. */
#ifndef SLUICE_TESTS_SUPPORT_TESTUTIL_H
#define SLUICE_TESTS_SUPPORT_TESTUTIL_H

#include <stddef.h>
#include <sys/types.h>

/* Reads a whole file into a NUL-terminated buffer (free()); NULL on error. */
char *tu_read_file(const char *path, size_t *len);

/* Creates a fresh directory under $TMPDIR (or /tmp); returns an owned path. */
char *tu_mkdtemp(const char *tag);

/* Removes a directory tree (best effort). */
void tu_rm_rf(const char *path);

/* Writes text to dir/name and returns the owned full path. */
char *tu_write_file(const char *dir, const char *name, const char *text);

/* Sleeps ms milliseconds. */
void tu_sleep_ms(unsigned ms);

/* Stops the child *pid (nothing when <= 0): SIGTERM, then SIGKILL if it
 * has not exited within grace_ms; reaps it and sets *pid to 0. */
void tu_stop_pid(pid_t *pid, unsigned grace_ms);

#endif
