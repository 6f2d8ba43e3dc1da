/* obs/process.c: the process_* families read from /proc, as the Prometheus
 * client libraries export them. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "obs/process.h"

/* A real line of /proc/PID/stat whose command name holds ") (" and spaces. */
static const char stat_line[] =
    "4242 (we ird) (name) S 1 4242 4242 0 -1 4194560 1234 0 0 0 "
    "150 75 0 0 20 0 5 0 98765 355012608 5155 18446744073709551615 1 1 0 0 0 "
    "0 0 4096 17642 0 0 0 17 1 0 0 0 0 0\n";

Test(process, parses_stat_after_the_last_parenthesis)
{
    struct proc_stat ps = {0};
    struct sc_error err = {0};

    cr_assert_eq(process_parse_stat(stat_line, &ps, &err), 0, "%s", err.text);
    cr_expect_eq(ps.utime_ticks, 150);
    cr_expect_eq(ps.stime_ticks, 75);
    cr_expect_eq(ps.start_ticks, 98765);
    cr_expect_eq(ps.vsize_bytes, 355012608);
    cr_expect_eq(ps.rss_pages, 5155);
}

Test(process, refuses_short_or_garbled_stat)
{
    struct proc_stat ps = {0};
    struct sc_error err = {0};

    cr_expect_eq(process_parse_stat("4242 no parenthesis", &ps, &err), -EINVAL);
    cr_expect_eq(process_parse_stat("4242 (x) S 1 2 3\n", &ps, &err), -EINVAL);
    cr_expect(strstr(err.text, "fields") || strstr(err.text, "number"), "%s", err.text);
    cr_expect_eq(process_parse_stat("4242 (x) S 1 2 x 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 "
                                    "19 20 21 22 23\n", &ps, &err), -EINVAL);
    cr_expect(strstr(err.text, "field 6"), "%s", err.text);
}

Test(process, btime_line)
{
    uint64_t bt = 0;

    cr_expect_eq(process_parse_btime("btime 1764590000\n", &bt), 0);
    cr_expect_eq(bt, 1764590000);
    cr_expect_eq(process_parse_btime("ctxt 123\n", &bt), -EINVAL);
    cr_expect_eq(process_parse_btime("btime\n", &bt), -EINVAL);
}

/* The value of an unlabelled sample in an exposition, or -1. */
static double sample(const char *text, const char *name)
{
    char want[96];
    const char *p;

    snprintf(want, sizeof want, "\n%s ", name);
    p = strstr(text, want);
    return p ? strtod(p + strlen(want), NULL) : -1;
}

Test(process, families_of_this_process)
{
    struct sc_error err = {0};
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    int extra = open("/dev/null", O_RDONLY);
    double start;

    cr_assert_eq(process_metrics_write(f, &err), 0, "%s", err.text);
    fclose(f);
    cr_expect(strstr(text, "# TYPE process_cpu_seconds_total counter\n"), "%s", text);
    cr_expect(strstr(text, "# TYPE process_resident_memory_bytes gauge\n"), "%s", text);
    cr_expect_gt(sample(text, "process_resident_memory_bytes"), 1 << 20);
    cr_expect_gt(sample(text, "process_virtual_memory_bytes"),
                 sample(text, "process_resident_memory_bytes"));
    cr_expect_geq(sample(text, "process_cpu_seconds_total"), 0);
    /* stdin/out/err and the /dev/null above at least. */
    cr_expect_geq(sample(text, "process_open_fds"), 4);
    cr_expect_gt(sample(text, "process_max_fds"), sample(text, "process_open_fds"));
    /* This test process started within the last 10 minutes (clock ticks
     * give 10 ms resolution). */
    start = sample(text, "process_start_time_seconds");
    cr_expect(start > (double)time(NULL) - 600 && start <= (double)time(NULL) + 1,
              "start %f, now %ld", start, (long)time(NULL));
    close(extra);
    free(text);
}
