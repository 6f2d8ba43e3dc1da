#!/bin/bash
# What Redis spends on a keyed request, measured without the fleet's noise (see
# tests/bench/README.md, "redis_replay.sh"): one sidecar (shared: redis, every request a fresh
# Idempotency-Key, as fleet.sh's phase 3) talks to redis-server through a recording proxy
# (resp_replay.py) for DURATION seconds; what it sent is then replayed, alone, into a fresh
# redis-server per round with `redis-cli --pipe`: Redis's CPU per keyed request (schedstat),
# ROUNDS rounds alternating the binaries, and, under valgrind's callgrind, the instructions
# Redis runs per keyed request for the first CALLS commands (exact: the same stream runs the
# same instructions every time). The keyed requests are counted in the stream (the joined
# permit-and-lease calls' records), so a call's cost is spread over the requests it carried.
# Environment: BASE (a second sluice recorded and replayed beside this tree's: a build dir
# holding one, or a git revision, built as fleet.sh does), BUILD_DIR (build-bench-fleet/),
# NO_BUILD=1, CLIENTS (64), DURATION (5 s), ROUNDS (5), CALLS (2000; 0: no callgrind), KEEP=1.
set -euo pipefail

CLIENTS=${CLIENTS:-64}
SECONDS_RUN=${DURATION:-5}
ROUNDS=${ROUNDS:-5}
CALLS=${CALLS:-2000}

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BUILD_DIR=${BUILD_DIR:-$REPO/build-bench-fleet}
# shellcheck disable=SC2034  # NAME and TMP_PREFIX are read by benchlib.sh
NAME=redis_replay.sh TMP_PREFIX=sluice-replay
# shellcheck source-path=SCRIPTDIR source=benchlib.sh
. "$HERE/benchlib.sh"

replay() { python3 "$HERE/resp_replay.py" "$@"; }

deps
command -v redis-server >/dev/null || die "redis-server not found"
command -v redis-cli >/dev/null || die "redis-cli not found"
if [ "$CALLS" -gt 0 ] && ! command -v valgrind >/dev/null; then
    say "valgrind not found: no instruction counts (CALLS=0)"
    CALLS=0
fi
build "$BUILD_DIR"
BINS=("this:$BUILD_DIR/sluice")
if [ -n "${BASE:-}" ]; then
    base_bin=$(base_sluice "$BASE")
    BINS=("base:$base_bin" "${BINS[@]}")
fi

start_redis() {   # start_redis DIR PORT [WRAPPER...] -> RPID, once it answers
    local dir=$1 port=$2 _
    shift 2
    mkdir -p "$dir"
    "$@" redis-server --bind 127.0.0.1 --port "$port" --save '' --appendonly no --dir "$dir" \
        >"$dir/redis.log" 2>&1 &
    RPID=$!
    PIDS="$PIDS $RPID"
    for _ in $(seq 600); do
        redis-cli -p "$port" ping >/dev/null 2>&1 && return 0
        kill -0 "$RPID" 2>/dev/null || die "redis-server exited, see $dir/redis.log"
        sleep 0.05
    done
    die "redis-server on port $port did not answer"
}

# record NAME BINARY: one sidecar's traffic to Redis for SECONDS_RUN s -> $TMP/NAME/loop.resp
record() {
    local d=$TMP/$1 bin=$2 rp pp p a
    mkdir -p "$d/rec"
    read -r rp pp p a <<<"$(free_ports 4 | tr '\n' ' ')"
    start_redis "$d/redis" "$rp"
    python3 "$HERE/resp_replay.py" proxy "$pp" "$rp" "$d/rec" $((SECONDS_RUN + 60)) >"$d/proxy.out" 2>&1 &
    local proxy=$!
    PIDS="$PIDS $proxy"
    for _ in $(seq 100); do grep -q listening "$d/proxy.out" 2>/dev/null && break; sleep 0.05; done
    grep -q listening "$d/proxy.out" || die "the recording proxy did not start: $(cat "$d/proxy.out")"
    cat >"$d/sluice.yaml" <<EOF
listen: 127.0.0.1:$p
admin: 127.0.0.1:$a
threads: 1
log: {level: warn, access: false}
store: {backend: redis, url: "redis://127.0.0.1:$pp/0", fleet_size: 1}
upstreams:
  stub: {url: "http://127.0.0.1:$STUB_PORT", max_connections: $CLIENTS}
policies:
  p: {rate: 1000000/s, burst: 1000, max_wait: 1h, shared: redis, idempotency: {required: false}}
routes:
  - {prefix: /, upstream: stub, policy: p}
EOF
    start_sluice "$bin" "$d" "$a"
    wrk -t1 -c"$CLIENTS" -d"${SECONDS_RUN}s" -s "$HERE/freshkey.lua" "http://127.0.0.1:$p/x" -- "$1" \
        >"$d/wrk.txt" 2>&1 || die "wrk failed: $(cat "$d/wrk.txt")"
    stop_sluice "$SLUICE_PID" "$d"
    stop_pid "$proxy"
    stop_pid "$RPID"
    # The loop's connection carries the keyed requests: the largest stream (names cNNN.resp).
    # shellcheck disable=SC2012
    cp "$(ls -S "$d"/rec/*.resp | head -1)" "$d/loop.resp"
}

# cpu_per_request FILE REQUESTS: Redis's CPU (µs) per keyed request replaying FILE into a fresh server.
# Replayed within minutes of its recording: the records' expiries (PXAT) are absolute times, and
# a stream replayed after them would find every lease gone (another path, another cost).
cpu_per_request() {
    local d=$TMP/round port b a
    rm -rf "$d"
    port=$(free_ports 1)
    start_redis "$d" "$port"
    b=$(cpu_ns "$RPID")
    redis-cli -p "$port" --pipe <"$1" >"$d/pipe.out" 2>&1 || die "replay failed: $(cat "$d/pipe.out")"
    grep -q "errors: 0," "$d/pipe.out" || die "the replay had errors: $(cat "$d/pipe.out")"
    a=$(cpu_ns "$RPID")
    stop_pid "$RPID"
    awk -v a="$a" -v b="$b" -v n="$2" 'BEGIN { printf "%.2f\n", (a - b) / 1000 / n }'
}

# instructions FILE: what redis-server runs (callgrind) for FILE, from its start to its shutdown
instructions() {
    local d=$TMP/cg port out
    rm -rf "$d"
    mkdir -p "$d"
    port=$(free_ports 1)
    out=$d/callgrind.out
    start_redis "$d" "$port" valgrind --tool=callgrind --callgrind-out-file="$out"
    redis-cli -p "$port" --pipe <"$1" >"$d/pipe.out" 2>&1 || die "replay failed: $(cat "$d/pipe.out")"
    redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
    wait "$RPID" 2>/dev/null || true
    awk '/^summary:/ { print $2 }' "$out"
}

start_stub "$BUILD_DIR/sluice-stub"
declare -A REQS CALLS_PL CALLS_C CPU INSTR
for b in "${BINS[@]}"; do
    name=${b%%:*}
    say "recording $name (${b#*:}) for ${SECONDS_RUN}s"
    record "$name" "${b#*:}"
    read -r "REQS[$name]" "CALLS_PL[$name]" "CALLS_C[$name]" <<<"$(replay count "$TMP/$name/loop.resp")"
    [ "${REQS[$name]}" -gt 0 ] || die "$name: no keyed requests in its stream"
    CPU[$name]=""
done
for r in $(seq "$ROUNDS"); do
    for b in "${BINS[@]}"; do
        name=${b%%:*}
        CPU[$name]="${CPU[$name]} $(cpu_per_request "$TMP/$name/loop.resp" "${REQS[$name]}")"
    done
    say "round $r of $ROUNDS done"
done
if [ "$CALLS" -gt 0 ]; then
    printf '*1\r\n\044%s\r\nPING\r\n' 4 >"$TMP/ping.resp"
    idle=$(instructions "$TMP/ping.resp")
    for b in "${BINS[@]}"; do
        name=${b%%:*}
        read -r n _ _ <<<"$(replay cut "$TMP/$name/loop.resp" "$TMP/$name/cut.resp" "$CALLS")"
        total=$(instructions "$TMP/$name/cut.resp")
        INSTR[$name]=$(awk -v t="$total" -v i="$idle" -v n="$n" 'BEGIN { printf "%.0f", (t - i) / n }')
    done
fi
say "sluice $(source_rev); redis-server $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/')"
for b in "${BINS[@]}"; do
    name=${b%%:*}
    med=$(echo "${CPU[$name]}" | tr ' ' '\n' | grep . | sort -n |
        awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')
    printf '%s  %d keyed requests, %.1f per permit-and-lease call, %.1f per completion call | Redis CPU %s µs/keyed req (median; rounds:%s) | %s instructions/keyed req\n' \
        "$name" "${REQS[$name]}" "$(awk -v r="${REQS[$name]}" -v c="${CALLS_PL[$name]}" 'BEGIN { print r / c }')" \
        "$(awk -v r="${REQS[$name]}" -v c="${CALLS_C[$name]}" 'BEGIN { print r / c }')" \
        "$med" "${CPU[$name]}" "${INSTR[$name]:-(not counted)}"
done
