#!/bin/bash
# Keyed completions per second through sluice with `store.sync` false and true (see
# tests/bench/README.md, "groupcommit.sh"): wrk -c64 POSTs with a fresh Idempotency-Key each
# (freshkey.lua), so every request is a lease, a forward to the stub and a completion; the
# same runs on a second sluice binary (BASE, e.g. a build of main) for a before/after table,
# interleaved. Each run starts sluice on a fresh RocksDB store.
# Environment:
#   BASE         a build dir with the "before" sluice (optional; without it, this tree only)
#   BUILD_DIR    this tree's build (default build-bench-gc/); NO_BUILD=1 uses what is there
#   DURATION     seconds per wrk run (default 10); REPS repetitions (default 3)
#   CONNECTIONS  wrk connections (default 64); THREADS sluice's threads (default 2)
#   SYNCS        the store.sync values to run (default "false true")
#   PIN=1        sluice on CPU 1, the stub and wrk on CPU 0 (taskset); default 0
#   KEEP=1       keep the temp dir (configs, logs, raw wrk output)
set -euo pipefail

DURATION=${DURATION:-10}
REPS=${REPS:-3}
CONNECTIONS=${CONNECTIONS:-64}
THREADS=${THREADS:-2}
SYNCS=${SYNCS:-false true}

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BUILD_DIR=${BUILD_DIR:-$REPO/build-bench-gc}
# shellcheck disable=SC2034  # NAME and TMP_PREFIX are read by benchlib.sh
NAME=groupcommit.sh TMP_PREFIX=sluice-gc
# shellcheck source-path=SCRIPTDIR source=benchlib.sh
. "$HERE/benchlib.sh"

deps
build "$BUILD_DIR"
BUILDS="after:$BUILD_DIR/sluice"
if [ -n "${BASE:-}" ]; then
    [ -x "$BASE/sluice" ] || die "no sluice in BASE=$BASE"
    BUILDS="before:$BASE/sluice $BUILDS"
fi
say "keyed completions, fresh keys, -c$CONNECTIONS, ${DURATION}s per run, $REPS rep(s);" \
    "source: $REPO ($(source_rev))"
say "machine: $(nproc) cores, $(uname -r), $(df -T "$TMP" | awk 'NR == 2 { print $2 }') under $TMP," \
    "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"

stub_requests() {
    curl -s "http://127.0.0.1:$STUB_PORT/_stub/stats" |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["requests"])'
}

start_stub "$BUILD_DIR/sluice-stub"
for rep in $(seq "$REPS"); do
    for build in $BUILDS; do
        for sync in $SYNCS; do
            label=${build%%:*}-sync-$sync
            d=$TMP/$label-$rep
            mkdir -p "$d"
            # shellcheck disable=SC2046
            set -- $($HELPER ports 2)
            cat >"$d/sluice.yaml" <<YAML
listen: 127.0.0.1:$1
admin: 127.0.0.1:$2
threads: $THREADS
log: {level: warn, access: false}
store: {path: $d/data, sync: $sync}
upstreams:
  stub: {url: "http://127.0.0.1:$STUB_PORT", max_connections: $CONNECTIONS}
policies:
  keyed:
    idempotency: {ttl: 1h, methods: [POST]}
routes:
  - {name: keyed, prefix: /keyed, methods: [POST], upstream: stub, policy: keyed}
YAML
            start_sluice "${build#*:}" "$d" "$2"
            s0=$(stub_requests)
            measure "$TMP/runs.tsv" "$label" "$rep" "$SLUICE_PID" "$CONNECTIONS" "$DURATION" \
                -s "$HERE/freshkey.lua" "http://127.0.0.1:$1/keyed" -- "$label-$rep"
            echo "$label $rep $(( $(stub_requests) - s0 ))" >>"$TMP/forwarded.tsv"
            stop_sluice "$SLUICE_PID" "$d"
            rm -rf "$d/data"
        done
    done
done
$HELPER gc-report "$TMP"
