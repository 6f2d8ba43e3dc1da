/* Parsers for the config's value syntaxes (docs/contract.md §2). Each returns 0 or
 * -EINVAL / -ERANGE and writes a short reason into why (may be NULL). */
#ifndef SLUICE_CONFIG_UNITS_H
#define SLUICE_CONFIG_UNITS_H

#include <stddef.h>
#include <stdint.h>

/* "250ms", "2s", "5m", "24h", "7d"; a bare "0" is zero. Fractions like
 * "1.5s" are accepted, and sums from the largest unit down: "1m30s",
 * "1h5m", "2s500ms" (a fraction only in the last part). Result in
 * milliseconds. */
int units_parse_duration(const char *s, uint64_t *ms, char *why, size_t wlen);

/* "10/s", "600/m", "36000/h", "0.5/s". Result in events per second, > 0. */
int units_parse_rate(const char *s, double *per_sec, char *why, size_t wlen);

/* "512", "16KiB", "8MiB", "1GiB" (also KB/MB/GB as powers of ten, k/K). */
int units_parse_size(const char *s, uint64_t *bytes, char *why, size_t wlen);

/* "host:port", "[v6]:port". host is allocated (free()). */
int units_parse_hostport(const char *s, char **host, uint16_t *port,
                         char *why, size_t wlen);

#endif
