/* obs/log.c: one JSON object a line on stderr, whatever the message holds (the lookup line: test_log.c). */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "obs/log.h"

/* Runs one log call with stderr on a temporary file; returns what was
 * written (owned). */
static char *captured(void (*emit)(void))
{
    char path[] = "/tmp/sluice-test-log-XXXXXX";
    int fd = mkstemp(path), saved = dup(STDERR_FILENO);
    char *text = calloc(1, 4096);
    ssize_t n;

    cr_assert(fd >= 0 && saved >= 0 && text);
    cr_assert(dup2(fd, STDERR_FILENO) >= 0);
    emit();
    dup2(saved, STDERR_FILENO);
    close(saved);
    n = pread(fd, text, 4095, 0);
    cr_assert(n > 0);
    close(fd);
    unlink(path);
    return text;
}

static void reload_refused(void)
{
    /* As app_reload logs a refused file: every error, one a line. */
    log_error("config reload refused; the running config is kept: %s",
              "a.yaml:1:1: one\na.yaml:2:3: two\n");
}

static void summary(void)
{
    log_info("config reloaded: %s", "a.yaml: reloaded (1 upstreams, 1 policies, 1 routes)\n");
}

Test(log, messages_with_newlines_stay_one_readable_line)
{
    char *a = captured(reload_refused), *b = captured(summary);

    cr_expect(strstr(a, "\\u000a") == NULL && strstr(a, "\\n") == NULL, "%s", a);
    cr_expect(strstr(a, "\"msg\":\"config reload refused; the running config is kept: "
                        "a.yaml:1:1: one; a.yaml:2:3: two\"}\n") != NULL, "%s", a);
    cr_expect(strstr(b, "\"msg\":\"config reloaded: a.yaml: reloaded (1 upstreams, 1 "
                        "policies, 1 routes)\"}\n") != NULL, "%s", b);
    cr_expect_eq(strchr(a, '\n'), a + strlen(a) - 1, "one line: %s", a);
    free(a);
    free(b);
}
