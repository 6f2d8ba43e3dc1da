/* The config reference as Markdown, written from the schema's own rows
 * (schema.c): every key with its type, default, bounds or names, and
 * whether it is required. docs/configuration.md carries it, and a test
 * compares the two, so the reference cannot drift from what sluice reads. */
#define _GNU_SOURCE
#include "config/config.h"
#include "config/config_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const type_names[CT_COUNT] = {
    [CT_STRING] = "string",
    [CT_BOOL] = "true / false",
    [CT_U32] = "whole number",
    [CT_DOUBLE] = "number",
    [CT_DURATION] = "duration",
    [CT_SIZE] = "size",
    [CT_RATE] = "rate",
    [CT_ENUM] = "one of the names",
    [CT_ADDR] = "`host:port`",
    [CT_ADDRS] = "list of `host:port`",
    [CT_URL] = "URL (`http://` or `https://`, with a base path)",
    [CT_METHODS] = "list of HTTP methods",
    [CT_FLAGS] = "list of names",
    [CT_STATUSES] = "list of statuses (`429`, `5xx`)",
    [CT_RETRY_ON] = "list of statuses and failure names",
    [CT_CODES] = "list of status codes (`200`, `404`)",
    [CT_HEADERS] = "mapping of header names to values",
    [CT_BLOCK] = "block",
    [CT_NAMED] = "mapping of names to blocks",
    [CT_LIST] = "list of blocks",
    [CT_UPSTREAM_REF] = "an upstream's name",
    [CT_POLICY_REF] = "a policy's name",
    [CT_PERCENT] = "percentage (`30%`)",
};

/* Value text for a table cell: `|` would end the cell. */
static void cell(FILE *f, const char *s)
{
    for (; *s; s++) {
        if (*s == '|')
            fputc('\\', f);
        fputc(*s, f);
    }
}

static void names(FILE *f, const struct cfg_name *n)
{
    for (size_t i = 0; n && n[i].name; i++)
        fprintf(f, "%s`%s`", i ? ", " : "", n[i].name);
}

static void limits(FILE *f, const struct cfg_key *k)
{
    if (k->names) {
        names(f, k->names);
        return;
    }
    if (k->min && k->max)
        fprintf(f, "%s to %s", k->min, k->max);
    else if (k->min)
        fprintf(f, "at least %s", k->min);
    else if (k->max)
        fprintf(f, "at most %s", k->max);
    if (k->nonempty)
        fprintf(f, "%snot empty", k->min || k->max ? "; " : "");
}

static void row(FILE *f, const char *path, const struct cfg_key *k)
{
    fprintf(f, "| `%s%s` | %s | ", path, k->name, type_names[k->type]);
    if (k->required)
        fputs("required", f);
    else if (k->def_doc)
        cell(f, k->def_doc);
    else if (k->def && *k->def) {
        fputc('`', f);
        cell(f, k->def);
        fputc('`', f);
    } else
        fputs(k->type == CT_STRING ? "`\"\"`" : "—", f);
    fputs(" | ", f);
    limits(f, k);
    fputs(k->secret ? " (hidden in `GET /config`)" : "", f);
    fputs(" |\n", f);
}

static void block(FILE *f, const char *path, const struct cfg_block *b)
{
    char *sub;

    for (size_t i = 0; i < b->n_keys; i++) {
        const struct cfg_key *k = &b->keys[i];

        row(f, path, k);
        if (!k->block)
            continue;
        if (asprintf(&sub, "%s%s%s.", path, k->name,
                     k->type == CT_NAMED ? ".<name>" : k->type == CT_LIST ? "[]" : "") < 0)
            continue;
        block(f, sub, k->block);
        free(sub);
    }
}

char *config_reference_markdown(void)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);

    if (!f)
        return NULL;
    fputs("| key | type | default | bounds / names |\n| --- | --- | --- | --- |\n", f);
    block(f, "", &cfg_root_block);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}
