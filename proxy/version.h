/* What this build is: sluice's own version, the git revision and build type
 * it was configured from, and the versions of the libraries it runs with
 * (`sluice --version`, the sluice_build_info metric). */
#ifndef SLUICE_PROXY_VERSION_H
#define SLUICE_PROXY_VERSION_H

#include <stdio.h>

const char *version_sluice(void);    /* "0.1.0" */
const char *version_revision(void);  /* git describe at configure time, or "unknown" */
const char *version_build_type(void);

/* The nginx -V / haproxy -vv style report, one fact per line. Returns 0 or
 * -EIO when f could not be written. */
int version_report(FILE *f);

#endif
