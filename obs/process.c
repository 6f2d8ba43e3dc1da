#define _GNU_SOURCE
#include "obs/process.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* Reads a small /proc file whole into buf (NUL-terminated). */
static int read_small(const char *path, char *buf, size_t len, struct sc_error *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC), e = errno;
    ssize_t n;

    if (fd < 0) {
        sc_error_set(err, "%s: %s", path, strerror(e));
        return -e;
    }
    n = read(fd, buf, len - 1);
    e = errno;
    close(fd);
    if (n < 0) {
        sc_error_set(err, "%s: %s", path, strerror(e));
        return -e;
    }
    buf[n] = '\0';
    return 0;
}

/* Field 2 (comm) is in parentheses and may contain anything, so counting
 * starts after its last ')': field 3 is then the first. */
int process_parse_stat(const char *text, struct proc_stat *out, struct sc_error *err)
{
    const char *p = strrchr(text, ')');
    uint64_t f[25] = {0};
    int field = 3;

    if (!p) {
        sc_error_set(err, "/proc/self/stat: no command name");
        return -EINVAL;
    }
    for (p++; *p && field <= 24; field++) {
        char *end;

        while (*p == ' ')
            p++;
        if (field == 3) {              /* the state: a letter */
            p += *p ? 1 : 0;
            continue;
        }
        f[field] = strtoull(p, &end, 10);   /* a negative priority wraps: unused */
        if (end == p) {
            sc_error_set(err, "/proc/self/stat: field %d is not a number", field);
            return -EINVAL;
        }
        p = end;
    }
    if (field <= 24) {
        sc_error_set(err, "/proc/self/stat: %d fields, expected at least 24", field - 1);
        return -EINVAL;
    }
    out->utime_ticks = f[14];
    out->stime_ticks = f[15];
    out->start_ticks = f[22];
    out->vsize_bytes = f[23];
    out->rss_pages = f[24];
    return 0;
}

int process_parse_btime(const char *line, uint64_t *btime)
{
    return strncmp(line, "btime ", 6) == 0 && sscanf(line + 6, "%" SCNu64, btime) == 1
               ? 0 : -EINVAL;
}

/* Line by line: on a machine with many CPUs and interrupts the lines before
 * btime take tens of KiB. */
static int read_btime(uint64_t *btime, struct sc_error *err)
{
    FILE *f = fopen("/proc/stat", "re");
    int rc = -EINVAL, e = errno;
    char *line = NULL;
    size_t cap = 0;

    if (!f) {
        sc_error_set(err, "/proc/stat: %s", strerror(e));
        return -e;
    }
    while (rc != 0 && getline(&line, &cap, f) > 0)
        rc = process_parse_btime(line, btime);
    free(line);
    fclose(f);
    if (rc != 0)
        sc_error_set(err, "/proc/stat: no btime line");
    return rc;
}

/* Entries of /proc/self/fd, less the one opendir itself holds. */
static long open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    long n = 0;

    if (!d)
        return -1;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n - 1;
}

/* One family of one unlabelled sample. */
static void family(FILE *f, const char *name, const char *help, const char *type,
                   double v)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n%s %.15g\n", name, help, name, type,
            name, v);
}

int process_metrics_write(FILE *f, struct sc_error *err)
{
    char stat[2048];
    struct proc_stat ps;
    struct rlimit rl;
    uint64_t btime;
    long ticks = sysconf(_SC_CLK_TCK), page = sysconf(_SC_PAGESIZE), fds;
    int rc;

    if ((rc = read_small("/proc/self/stat", stat, sizeof stat, err)) != 0 ||
        (rc = process_parse_stat(stat, &ps, err)) != 0 ||
        (rc = read_btime(&btime, err)) != 0)
        return rc;
    if (ticks <= 0 || page <= 0) {
        sc_error_set(err, "process metrics: no clock tick or page size");
        return -EINVAL;
    }
    if ((fds = open_fds()) < 0 || getrlimit(RLIMIT_NOFILE, &rl) != 0) {
        int e = errno;
        sc_error_set(err, "process metrics: descriptors: %s", strerror(e));
        return -e;
    }
    family(f, "process_cpu_seconds_total", "Total user and system CPU time spent in seconds.",
           "counter", (double)(ps.utime_ticks + ps.stime_ticks) / (double)ticks);
    family(f, "process_resident_memory_bytes", "Resident memory size in bytes.", "gauge",
           (double)ps.rss_pages * (double)page);
    family(f, "process_virtual_memory_bytes", "Virtual memory size in bytes.", "gauge",
           (double)ps.vsize_bytes);
    family(f, "process_open_fds", "Number of open file descriptors.", "gauge", (double)fds);
    family(f, "process_max_fds", "Maximum number of open file descriptors.", "gauge",
           (double)rl.rlim_cur);
    family(f, "process_start_time_seconds",
           "Start time of the process since unix epoch in seconds.", "gauge",
           (double)btime + (double)ps.start_ticks / (double)ticks);
    return 0;
}
