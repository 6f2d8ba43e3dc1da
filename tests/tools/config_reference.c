/* Keeps docs/configuration.md's key table equal to the schema:
 *   config_reference DOC          exit 1 (and say so) when the table differs
 *   config_reference DOC --write  rewrite the table in place
 * The table lies between the two marker lines below. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"

#define BEGIN "<!-- the key table is generated from the schema: tests/tools/config_reference.c -->\n"
#define END "<!-- end of the generated key table -->\n"

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    char *buf = NULL;
    size_t cap = 0;
    ssize_t n;

    if (!f)
        return NULL;
    n = getdelim(&buf, &cap, '\0', f);
    fclose(f);
    if (n < 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

int main(int argc, char **argv)
{
    char *doc, *table, *a, *b;
    int rc = 1;

    if (argc < 2 || !(doc = slurp(argv[1]))) {
        fprintf(stderr, "usage: config_reference DOC [--write]\n");
        return 2;
    }
    table = config_reference_markdown();
    a = strstr(doc, BEGIN);
    b = a ? strstr(a, END) : NULL;
    if (!table || !a || !b) {
        fprintf(stderr, "%s: no generated table between the markers\n", argv[1]);
        goto out;
    }
    a += strlen(BEGIN);
    if (argc > 2 && strcmp(argv[2], "--write") == 0) {
        FILE *f = fopen(argv[1], "w");

        if (!f)
            goto out;
        fprintf(f, "%.*s%s%s", (int)(a - doc), doc, table, b);
        rc = fclose(f) == 0 ? 0 : 1;
        goto out;
    }
    if ((size_t)(b - a) == strlen(table) && memcmp(a, table, strlen(table)) == 0) {
        rc = 0;
        goto out;
    }
    fprintf(stderr, "%s: the key table differs from the schema; run "
            "config_reference %s --write and review the change\n", argv[1], argv[1]);
out:
    free(table);
    free(doc);
    return rc;
}
