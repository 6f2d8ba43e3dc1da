#!/bin/bash
# Instructions per pass-through request, deterministic where wall-clock CPU on a shared machine is
# not (see tests/bench/README.md, "Second A/B of 2026-12-01"): sluice (one loop) under
# valgrind --tool=callgrind in front of the stub, FEW then MANY sequential keep-alive requests
# (curl), and (Ir(MANY) - Ir(FEW)) / (MANY - FEW), so start-up and shutdown cancel out.
# Usage: bash tests/bench/instructions.sh [BUILD_DIR]   (default build-bench/, RelWithDebInfo)
# Environment: SIZE (response body bytes, 4096), FEW (500), MANY (2500), NO_BUILD=1, KEEP=1,
# REPLAY=1 (replays instead: a route with idempotency, one priming POST, then the same POST with
# the same Idempotency-Key FEW or MANY times, each answered from the store).
set -euo pipefail

SIZE=${SIZE:-4096}
REPLAY=${REPLAY:-0}
FEW=${FEW:-500}
MANY=${MANY:-2500}

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BUILD_DIR=${1:-$REPO/build-bench}
# shellcheck disable=SC2034  # NAME and TMP_PREFIX are read by benchlib.sh
NAME=instructions.sh TMP_PREFIX=sluice-instr
# shellcheck source-path=SCRIPTDIR source=benchlib.sh
. "$HERE/benchlib.sh"

command -v valgrind >/dev/null || die "valgrind not found (apt-get install valgrind)"
command -v curl >/dev/null || die "curl not found"
build "$BUILD_DIR"

"$BUILD_DIR/sluice-stub" --listen 127.0.0.1:0 --body-size "$SIZE" >"$TMP/stub.out" 2>"$TMP/stub.err" &
STUB_PID=$!
PIDS="$PIDS $STUB_PID"
for _ in $(seq 200); do grep -q '^listening ' "$TMP/stub.out" 2>/dev/null && break; sleep 0.05; done
STUB_PORT=$(sed -n 's/^listening 127\.0\.0\.1:\([0-9]*\)$/\1/p' "$TMP/stub.out")
[ -n "$STUB_PORT" ] || die "stub did not print its port"

# instructions N: total Ir of sluice serving N requests, start-up and shutdown included.
instructions() {
    local n=$1 ports p a pid
    ports=$(python3 "$HERE/ratestat.py" ports 2 | tr '\n' ' ')
    read -r p a <<<"$ports"
    cat >"$TMP/c$n.yaml" <<EOF
listen: 127.0.0.1:$p
admin: 127.0.0.1:$a
threads: 1
store: {path: $TMP/data$n}
log: {level: error, access: false}
upstreams: {stub: {url: "http://127.0.0.1:$STUB_PORT"}}
routes: [{prefix: /, upstream: stub$(if [ "$REPLAY" = 1 ]; then echo ", policy: idem"; fi)}]
EOF
    if [ "$REPLAY" = 1 ]; then
        echo "policies: {idem: {idempotency: {required: false}}}" >>"$TMP/c$n.yaml"
    fi
    valgrind --tool=callgrind --callgrind-out-file="$TMP/cg$n.out" \
        "$BUILD_DIR/sluice" -c "$TMP/c$n.yaml" >"$TMP/sl$n.log" 2>&1 &
    pid=$!
    PIDS="$PIDS $pid"
    wait_http "http://127.0.0.1:$a/readyz" "$pid"
    if [ "$REPLAY" = 1 ]; then
        # The fragment is curl's counter only: it is not sent, so every request is the same.
        curl -s -o /dev/null -X POST -H 'Idempotency-Key: bench-replay' -d '{}' \
            "http://127.0.0.1:$p/x"
        curl -s -o /dev/null -X POST -H 'Idempotency-Key: bench-replay' -d '{}' \
            "http://127.0.0.1:$p/x#[1-$n]"
    else
        curl -s -o /dev/null "http://127.0.0.1:$p/x?[1-$n]"
    fi
    stop_pid "$pid"
    awk '/^(summary|totals):/ { print $2; exit }' "$TMP/cg$n.out"
}

few=$(instructions "$FEW")
many=$(instructions "$MANY")
what=""
if [ "$REPLAY" = 1 ]; then what="replay, "; fi
echo "$(( (many - few) / (MANY - FEW) )) instructions per request (${what}$SIZE-byte body;" \
    "$FEW requests: $few, $MANY requests: $many)"
