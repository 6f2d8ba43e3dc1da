#!/bin/bash
# Idempotency store benchmark (see tests/bench/README.md, "store.sh"):
#  1. replays from the store vs pass-through, with KEYS stored records: wrk POSTs with a random
#     stored Idempotency-Key (replayed by sluice) against the same POSTs on a route without a
#     policy (forwarded to the stub), interleaved, wrk -c64 for throughput and -c1 for latency
#     (with the stub alone at -c1 as the machine's floor); sluice's RSS at each size;
#  2. store_acquire + store_complete pairs on fresh keys, sync false / true, 1 and 2 threads
#     (storebench, straight on the store API);
#  3. the store's size on disk before and after the ttl expiry of its records (part 1's store,
#     the largest KEYS), reclaimed by sluice's sweep (bounded batches), or by a compaction alone.
# Environment:
#   QUICK=1          a fast run (~1 min): KEYS="10000 100000", DURATION=2, LAT_DURATION=2,
#                    REPS=1, LEASE_SECONDS=1, LEASE_REPS=1
#   KEYS             stored keys, ascending (default "100000 1000000"); the store is filled
#                    up to each size in turn and sluice restarted on it
#   DURATION         seconds per -c64 wrk run (default 10); LAT_DURATION per -c1 run (default 5)
#   REPS             repetitions of the interleaved replay / pass pairs (default 3)
#   CONNECTIONS      wrk connections of the throughput runs (default 64)
#   LEASE_SECONDS    per lease run (default 3); LEASE_REPS (default 3)
#   EXPIRE_COUNT     records for part 3 when part 1 is skipped (default 1000000)
#   SWEEP_BATCH      records per store_sweep call (default 2000, sluice's SWEEP_MAX)
#   SKIP_REPLAY=1 / SKIP_LEASE=1 / SKIP_EXPIRE=1   leave a part out
#   BUILD_DIR        default build-bench-sm/ ; NO_BUILD=1 uses what is there (storebench is
#                    always recompiled: it takes a second)
#   PIN=1            sluice on CPU 1, the stub and wrk on CPU 0 (taskset); default 0
#   KEEP=1           keep the temp dir (configs, logs, raw wrk output, storebench output)
set -euo pipefail

if [ "${QUICK:-0}" = 1 ]; then
    : "${KEYS:=10000 100000}" "${DURATION:=2}" "${LAT_DURATION:=2}" "${REPS:=1}"
    : "${LEASE_SECONDS:=1}" "${LEASE_REPS:=1}" "${EXPIRE_COUNT:=100000}"
fi
KEYS=${KEYS:-"100000 1000000"}
DURATION=${DURATION:-10}
LAT_DURATION=${LAT_DURATION:-5}
REPS=${REPS:-3}
CONNECTIONS=${CONNECTIONS:-64}
LEASE_SECONDS=${LEASE_SECONDS:-3}
LEASE_REPS=${LEASE_REPS:-3}
EXPIRE_COUNT=${EXPIRE_COUNT:-1000000}
SWEEP_BATCH=${SWEEP_BATCH:-2000}
WARMUP=${WARMUP:-1}

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BUILD_DIR=${BUILD_DIR:-$REPO/build-bench-sm}
# shellcheck disable=SC2034  # NAME and TMP_PREFIX are read by benchlib.sh
NAME=store.sh TMP_PREFIX=sluice-store
# shellcheck source-path=SCRIPTDIR source=benchlib.sh
. "$HERE/benchlib.sh"

deps
build "$BUILD_DIR"
SLUICE=$BUILD_DIR/sluice
STUB=$BUILD_DIR/sluice-stub
BENCH=$BUILD_DIR/storebench
say "compiling $BENCH"
gcc -O2 -g -Wall -Wextra -Wno-unused-parameter -I"$REPO" -o "$BENCH" "$HERE/storebench.c" \
    "$BUILD_DIR/libsluice_store.a" "$BUILD_DIR/libsluice_policies.a" \
    "$BUILD_DIR/libsluice_config.a" "$BUILD_DIR/libsluice_util.a" \
    -lrocksdb -levent -lyaml -ljansson -lssl -lcrypto -lpthread -lm ||
    die "cannot compile storebench.c"

say "sluice store benchmark; source: $REPO ($(source_rev))"
say "machine: $(nproc) cores, $(uname -r), $(df -T "$TMP" | awk 'NR == 2 { print $2 }') under $TMP," \
    "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
STARTED=$(date -u '+%Y-%m-%d %H:%M UTC')

# ---- part 2 first (small, no servers): lease acquire + complete ------------------
if [ "${SKIP_LEASE:-0}" != 1 ]; then
    say "lease acquire + complete, fresh keys, ${LEASE_SECONDS}s per run, $LEASE_REPS rep(s)"
    for rep in $(seq "$LEASE_REPS"); do
        for cfg in "0 1" "1 1" "0 2" "1 2"; do
            # shellcheck disable=SC2086
            set -- $cfg
            d=$TMP/lease-$1-$2-$rep
            "$BENCH" lease "$d" "$1" "$2" "$LEASE_SECONDS" | tee -a "$TMP/lease.txt" >&2 ||
                die "storebench lease failed"
            rm -rf "$d"
        done
    done
fi

# ---- part 1: replays vs pass-through ----------------------------------------------
scrape() {   # scrape FILE: sluice's /metrics
    curl -sf --max-time 10 "http://127.0.0.1:$ADMIN_PORT/metrics" >"$1" || die "scrape failed"
}

stub_requests() {
    curl -sf --max-time 10 "http://127.0.0.1:$STUB_PORT/_stub/stats" |
        sed -n 's/.*"requests":\([0-9]*\).*/\1/p'
}

if [ "${SKIP_REPLAY:-0}" != 1 ]; then
    : >"$TMP/runs.tsv"
    : >"$TMP/rss.tsv"
    start_stub "$STUB"
    d=$TMP/replay
    mkdir -p "$d"
    filled=0
    for keys in $KEYS; do
        [ "$keys" -gt "$filled" ] || die "KEYS must ascend"
        say "filling the store to $keys keys (storebench fill, keys k$filled .. k$((keys - 1)))"
        "$BENCH" fill "$d/data" replay "$filled" $((keys - filled)) 3600000 /replay '{}' |
            tee -a "$TMP/fill.txt" >&2 || die "storebench fill failed"
        filled=$keys
        # shellcheck disable=SC2046
        set -- $($HELPER ports 2)
        SLUICE_PORT=$1 ADMIN_PORT=$2
        cat >"$d/sluice.yaml" <<EOF
listen: 127.0.0.1:$SLUICE_PORT
admin: 127.0.0.1:$ADMIN_PORT
threads: 1
log: {level: warn, access: false}
store: {path: $d/data}
upstreams:
  stub: {url: "http://127.0.0.1:$STUB_PORT", max_connections: $CONNECTIONS}
policies:
  replay:
    idempotency: {ttl: 1h, methods: [POST]}
routes:
  - {name: replay, prefix: /replay, methods: [POST], upstream: stub, policy: replay}
  - {name: pass, prefix: /, upstream: stub}
EOF
        start_sluice "$SLUICE" "$d" "$ADMIN_PORT"
        idle=$(status_kb "$SLUICE_PID" VmRSS)
        idle_hwm=$(status_kb "$SLUICE_PID" VmHWM)
        say "$keys keys: sluice :$SLUICE_PORT (pid $SLUICE_PID), idle RSS $idle kB; stub :$STUB_PORT"
        base=http://127.0.0.1:$SLUICE_PORT
        lua=(-s "$HERE/idemkey.lua")
        if [ "$WARMUP" -gt 0 ]; then   # pools, page cache; not recorded
            for path in replay pass; do
                $PIN_LOAD wrk -t1 -c"$CONNECTIONS" -d"$WARMUP"s "${lua[@]}" "$base/$path" -- "$keys" 7 \
                    >"$TMP/warmup.txt" 2>&1 || die "wrk warm-up failed: $(cat "$TMP/warmup.txt")"
            done
        fi
        stub0=$(stub_requests)
        within=0 count=0 stub_hits=0
        for rep in $(seq "$REPS"); do
            s0=$(stub_requests)
            measure "$TMP/runs.tsv" "replay-$keys-c$CONNECTIONS" "$rep" "$SLUICE_PID" \
                "$CONNECTIONS" "$DURATION" "${lua[@]}" "$base/replay" -- "$keys" "$rep"
            s1=$(stub_requests)
            stub_hits=$((stub_hits + s1 - s0))
            measure "$TMP/runs.tsv" "pass-$keys-c$CONNECTIONS" "$rep" "$SLUICE_PID" \
                "$CONNECTIONS" "$DURATION" "${lua[@]}" "$base/pass" -- "$keys" "$rep"
        done
        for rep in $(seq "$REPS"); do
            s0=$(stub_requests)
            scrape "$TMP/m0"
            measure "$TMP/runs.tsv" "replay-$keys-c1" "$rep" "$SLUICE_PID" 1 "$LAT_DURATION" \
                "${lua[@]}" "$base/replay" -- "$keys" $((rep + 100))
            scrape "$TMP/m1"
            s1=$(stub_requests)
            stub_hits=$((stub_hits + s1 - s0))
            # shellcheck disable=SC2046
            set -- $($HELPER hist "$TMP/m0" "$TMP/m1" replay)
            within=$((within + $1)) count=$((count + $2))
            measure "$TMP/runs.tsv" "pass-$keys-c1" "$rep" "$SLUICE_PID" 1 "$LAT_DURATION" \
                "${lua[@]}" "$base/pass" -- "$keys" $((rep + 100))
            # The machine's floor: the same requests straight to the stub (CPU/req is the stub's).
            stub_pid=$STUB_PID
            STUB_PID=""
            measure "$TMP/runs.tsv" "direct-$keys-c1" "$rep" "$stub_pid" 1 "$LAT_DURATION" \
                "${lua[@]}" "http://127.0.0.1:$STUB_PORT/replay" -- "$keys" $((rep + 100))
            STUB_PID=$stub_pid
        done
        scrape "$TMP/metrics-$keys.txt"
        echo "$keys $idle $idle_hwm $(status_kb "$SLUICE_PID" VmHWM) $(status_kb "$SLUICE_PID" VmRSS)" \
            "$(du -sb "$d/data" | cut -f1) $within $count $stub_hits" >>"$TMP/rss.tsv"
        stop_sluice "$SLUICE_PID" "$d"
        say "  stub requests during the whole $keys-key round: $(( $(stub_requests) - stub0 ))" \
            "(of which during replay runs: $stub_hits)"
    done
    stop_pid "$STUB_PID"
    unset STUB_PID
fi

# ---- part 3: size on disk before and after expiry --------------------------------
# The store part 1 left (the largest KEYS, written with ttl 1h), or a fresh one of EXPIRE_COUNT
# records when part 1 was skipped; a copy of it for the compaction-only case.
if [ "${SKIP_EXPIRE:-0}" != 1 ]; then
    d=$TMP/expire
    mkdir -p "$d"
    if [ -d "$TMP/replay/data" ]; then
        mv "$TMP/replay/data" "$d/sweep"
        count=$filled
    else
        say "filling a store with $EXPIRE_COUNT keys (ttl 1h)"
        "$BENCH" fill "$d/sweep" expire 0 "$EXPIRE_COUNT" 3600000 /replay '{}' |
            tee -a "$TMP/fill.txt" >&2 || die "storebench fill failed"
        count=$EXPIRE_COUNT
    fi
    cp -a "$d/sweep" "$d/compact"
    say "expiry of $count records: swept in batches of $SWEEP_BATCH, then compacted"
    { echo "records count=$count"; "$BENCH" sweep "$d/sweep" 3600000 "$SWEEP_BATCH"; } |
        tee "$TMP/expire.txt" >&2 || die "storebench sweep failed"
    say "expiry of $count records: a compaction alone (its filter drops expired records)"
    "$BENCH" compact "$d/compact" 3600000 | tee "$TMP/expire-compact.txt" >&2 ||
        die "storebench compact failed"
    rm -rf "$d"
fi

say "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "store.sh — started $STARTED, $(nproc) cores ($(uname -m)), $(df -T "$TMP" | awk 'NR == 2 { print $2 }')" \
    "for the stores; sluice threads: 1; wrk -t1 -c$CONNECTIONS -d${DURATION}s and -c1 -d${LAT_DURATION}s," \
    "$REPS rep(s); CPU from /proc/PID/stat (CLK_TCK $HZ)"
$HELPER store-report "$TMP"
