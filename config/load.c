/* The configuration loaded: the schema's tables (schema.c) run by the
 * generic engine (load_engine.c), the model resolved (config_model.c). The
 * one file that knows all three, so that none of them names another. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config_internal.h"
#include "config/load_internal.h"

#define CFG_MAX_FILE (16u << 20)   /* a config larger than this is a mistake */

int config_load_string(const char *name, const char *yaml, size_t len,
                       struct sc_config **out, struct sc_errors *errs)
{
    int rc = cfg_engine_load(name, yaml, len, &cfg_root_block, &cfg_policy_block,
                             out, errs);

    if (rc == 0)
        config_resolve(*out);
    return rc;
}

void config_free(struct sc_config *cfg)
{
    cfg_config_free(cfg, &cfg_root_block, &cfg_policy_block);
}

/* Reads a whole file; a negative errno on failure. */
static int read_file(const char *path, char **buf, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *p = NULL, *grown;
    size_t n = 0, cap = 0, got;
    int rc = 0;

    if (!f)
        return -errno;
    do {
        if (n == cap) {
            cap = cap ? cap * 2 : 4096;
            if (cap > CFG_MAX_FILE || !(grown = realloc(p, cap))) {
                rc = cap > CFG_MAX_FILE ? -EFBIG : -ENOMEM;
                break;
            }
            p = grown;
        }
        got = fread(p + n, 1, cap - n, f);
        n += got;
    } while (got > 0);
    if (rc == 0 && ferror(f))
        rc = errno ? -errno : -EIO;
    fclose(f);
    if (rc) {
        free(p);
        return rc;
    }
    *buf = p;
    *len = n;
    return 0;
}

int config_load_file(const char *path, struct sc_config **out,
                     struct sc_errors *errs)
{
    char *buf = NULL;
    size_t len = 0;
    int rc;

    if (!out || !path)
        return -EINVAL;
    *out = NULL;
    rc = read_file(path, &buf, &len);
    if (rc) {
        if (errs)
            sc_errors_add(errs, path, 0, 0, "cannot read the configuration: "
                          "%s", strerror(-rc));
        return rc;
    }
    rc = config_load_string(path, buf, len, out, errs);
    free(buf);
    return rc;
}
