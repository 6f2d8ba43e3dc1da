#define _GNU_SOURCE
#include "support/testutil.h"

#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

char *tu_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long n;

    if (!f)
        return NULL;
    if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0)
        goto out;
    buf = malloc((size_t)n + 1);
    if (!buf)
        goto out;
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
        goto out;
    }
    buf[n] = '\0';
    if (len)
        *len = (size_t)n;
out:
    fclose(f);
    return buf;
}

char *tu_mkdtemp(const char *tag)
{
    const char *base = getenv("TMPDIR");
    char *path;

    if (!base || !*base)
        base = "/tmp";
    if (asprintf(&path, "%s/sluice-%s-XXXXXX", base, tag) < 0)
        return NULL;
    if (!mkdtemp(path)) {
        free(path);
        return NULL;
    }
    return path;
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb; (void)flag; (void)ftw;
    return remove(p);
}

void tu_rm_rf(const char *path)
{
    if (path)
        nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

char *tu_write_file(const char *dir, const char *name, const char *text)
{
    char *path;
    FILE *f;

    if (asprintf(&path, "%s/%s", dir, name) < 0)
        return NULL;
    f = fopen(path, "wb");
    if (!f) {
        free(path);
        return NULL;
    }
    fputs(text, f);
    fclose(f);
    return path;
}

void tu_sleep_ms(unsigned ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};

    nanosleep(&ts, NULL);
}

void tu_stop_pid(pid_t *pid, unsigned grace_ms)
{
    int status;

    if (*pid <= 0)
        return;
    kill(*pid, SIGTERM);
    for (unsigned waited = 0; waited < grace_ms; waited += 20) {
        if (waitpid(*pid, &status, WNOHANG) == *pid) {
            *pid = 0;
            return;
        }
        tu_sleep_ms(20);
    }
    kill(*pid, SIGKILL);
    waitpid(*pid, &status, 0);
    *pid = 0;
}
