/* The process metrics every Prometheus client library exports
 * (process_cpu_seconds_total, process_resident_memory_bytes, ...), read from
 * /proc/self at scrape time, so dashboards and alerts written for any other
 * exporter work on sluice too. Linux only. */
#ifndef SLUICE_OBS_PROCESS_H
#define SLUICE_OBS_PROCESS_H

#include <stdint.h>
#include <stdio.h>

#include "util/error.h"

/* What /proc/self/stat says, in its own units. */
struct proc_stat {
    uint64_t utime_ticks, stime_ticks;   /* fields 14, 15 */
    uint64_t start_ticks;                /* field 22: since boot */
    uint64_t vsize_bytes;                /* field 23 */
    uint64_t rss_pages;                  /* field 24 */
};

/* Parses the text of /proc/PID/stat (its command name may hold spaces and
 * parentheses). 0 or -EINVAL with err filled. */
int process_parse_stat(const char *text, struct proc_stat *out, struct sc_error *err);

/* One line of /proc/stat: its boot time in Unix seconds when the line is
 * "btime N". 0 or -EINVAL (another line). */
int process_parse_btime(const char *line, uint64_t *btime);

/* Writes the process_* families in the text format 0.0.4. 0, or a negative
 * errno with err filled when /proc could not be read (nothing is written
 * then, so a scrape never holds half a family). */
int process_metrics_write(FILE *f, struct sc_error *err);

#endif
