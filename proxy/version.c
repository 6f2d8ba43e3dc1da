#include "proxy/version.h"

#include <errno.h>

#include <event2/event.h>
#include <hiredis/hiredis.h>
#include <http_parser.h>
#include <jansson.h>
#include <microhttpd.h>
#include <openssl/crypto.h>
#include <yaml.h>

/* The macros come from CMake (the top CMakeLists.txt); the fallbacks keep
 * a build by other means compiling. */
#ifndef SLUICE_REVISION
#define SLUICE_REVISION "unknown"
#endif
#ifndef SLUICE_BUILD_TYPE
#define SLUICE_BUILD_TYPE "unknown"
#endif
#ifndef SLUICE_ROCKSDB_VERSION
#define SLUICE_ROCKSDB_VERSION "unknown"
#endif
#ifndef SLUICE_SYSTEMD_VERSION
#define SLUICE_SYSTEMD_VERSION "unknown"
#endif

const char *version_sluice(void)
{
    return SLUICE_VERSION;
}

const char *version_revision(void)
{
    return *SLUICE_REVISION ? SLUICE_REVISION : "unknown";
}

const char *version_build_type(void)
{
    return *SLUICE_BUILD_TYPE ? SLUICE_BUILD_TYPE : "unknown";
}

/* Runtime versions where the library can say (a distribution upgrade
 * changes them under an unchanged binary); RocksDB's, jansson's, hiredis's
 * and libsystemd's are those built against, since none offers a C call. */
int version_report(FILE *f)
{
    unsigned long hp = http_parser_version();

    fprintf(f, "sluice %s\n", version_sluice());
    fprintf(f, "revision: %s\n", version_revision());
    fprintf(f, "build type: %s\n", version_build_type());
    fprintf(f, "libraries:\n");
    fprintf(f, "  libmicrohttpd %s\n", MHD_get_version());
    fprintf(f, "  libevent %s\n", event_get_version());
    fprintf(f, "  RocksDB %s (built against)\n", SLUICE_ROCKSDB_VERSION);
    fprintf(f, "  jansson %s (built against)\n", JANSSON_VERSION);
    fprintf(f, "  libyaml %s\n", yaml_get_version_string());
    fprintf(f, "  %s\n", OpenSSL_version(OPENSSL_VERSION));
    fprintf(f, "  hiredis %d.%d.%d (built against)\n", HIREDIS_MAJOR, HIREDIS_MINOR,
            HIREDIS_PATCH);
    fprintf(f, "  http-parser %lu.%lu.%lu\n", (hp >> 16) & 255, (hp >> 8) & 255, hp & 255);
    fprintf(f, "  libsystemd %s (built against)\n", SLUICE_SYSTEMD_VERSION);
    return ferror(f) ? -EIO : 0;
}
