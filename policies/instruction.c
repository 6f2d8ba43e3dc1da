#include "policies/instruction.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/json_escape.h"


int instruction_status(enum reason r)
{
    switch (r) {
    case R_LEASE_HELD:
        return 409;
    case R_UPSTREAM_5XX:
    case R_CONNECT_ERROR:
    case R_CONNECTION_LOST:
    case R_TIMEOUT:
    case R_STORE_UNAVAILABLE:
        return 503;
    default:
        return 429;
    }
}

uint64_t instruction_delay_seconds(uint64_t delay_ms)
{
    uint64_t s = (delay_ms + 999) / 1000;
    return s ? s : 1;
}

char *instruction_json(const struct instruction *in, size_t *len)
{
    size_t cap = 512 + (in->key ? 6 * strlen(in->key) : 0), pos;
    char *buf = malloc(cap);
    int n;

    if (!buf)
        return NULL;
    n = snprintf(buf, cap, "{\"action\":\"%s\",\"reason\":\"%s\"",
                 in->outcome == OUT_DEAD_LETTER ? "dead_letter" : "requeue",
                 reason_name(in->reason));
    pos = (size_t)n;
    if (in->outcome == OUT_REQUEUE)
        pos += (size_t)snprintf(buf + pos, cap - pos,
                                ",\"delay_seconds\":%" PRIu64 ",\"delay_ms\":%" PRIu64,
                                instruction_delay_seconds(in->delay_ms),
                                in->delay_ms ? in->delay_ms : 1);
    pos += (size_t)snprintf(buf + pos, cap - pos,
                            ",\"attempt\":%u,\"max_attempts\":%u", in->attempt,
                            in->max_attempts);
    if (in->key) {
        memcpy(buf + pos, ",\"idempotency_key\":", 19);
        pos += 19;
        buf[pos] = '\0';
        json_escape_append(buf, cap, &pos, in->key, strlen(in->key));
    }
    if (in->upstream_status)
        pos += (size_t)snprintf(buf + pos, cap - pos, ",\"upstream_status\":%d",
                                in->upstream_status);
    if (in->verify_pending)
        pos += (size_t)snprintf(buf + pos, cap - pos, ",\"verify\":\"pending\"");
    pos += (size_t)snprintf(buf + pos, cap - pos, "}");
    if (len)
        *len = pos;
    return buf;
}
