#!/bin/bash
# Fleet benchmark (see tests/bench/README.md, "fleet.sh"): SIDECARS sluices on one
# redis-server, each driven by its own wrk with CLIENTS connections, all in front of one stub.
#  1. the fleet's rate: one shared: redis policy at RATE/s (max_wait 1h: requests wait, never
#     refused); the stub's arrival times give the achieved rate and the worst overshoot of
#     burst + rate * t for the fleet's arrivals; beside it the same policy with shared: local,
#     which each sidecar paces alone (the multiplied rate fleet mode removes);
#  2. the cost: a policy far above the load, shared: redis against shared: local, so the
#     difference is the Redis round trip per permit: latency (p50, p99), sluice CPU per
#     request, Redis CPU and commands per request.
# Environment: SIDECARS (4), CLIENTS (64 per sidecar), RATE (500), BURST (20), DURATION (10 s),
# BUILD_DIR (build-bench-fleet/), NO_BUILD=1, KEEP=1 (keep the temp dir).
set -euo pipefail

SIDECARS=${SIDECARS:-4}
CLIENTS=${CLIENTS:-64}
RATE=${RATE:-500}
BURST=${BURST:-20}
SECONDS_RUN=${DURATION:-10}

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BUILD_DIR=${BUILD_DIR:-$REPO/build-bench-fleet}

say() { printf '%s\n' "$*" >&2; }
die() { say "fleet.sh: $*"; exit 1; }
cpu_ns() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{ t += $1 } END { printf "%.0f\n", t }'; }

sh "$REPO/scripts/deps.sh" bench
command -v wrk >/dev/null || die "wrk not found"
command -v redis-server >/dev/null || die "redis-server not found"
if [ "${NO_BUILD:-0}" != 1 ]; then
    say "building sluice and sluice-stub in $BUILD_DIR"
    cmake -S "$REPO" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSLUICE_TESTS=OFF >/dev/null
    cmake --build "$BUILD_DIR" -j"$(nproc)" --target sluice sluice-stub >/dev/null
fi
SLUICE=$BUILD_DIR/sluice
STUB=$BUILD_DIR/sluice-stub

# ---- processes: every one started here is stopped by its pid -----------------
TMP=$(mktemp -d "${TMPDIR:-/tmp}/sluice-fleet.XXXXXX")
PIDS=""
stop_pid() {
    local pid=$1 p rest="" _
    for p in $PIDS; do [ "$p" = "$pid" ] || rest="$rest $p"; done
    PIDS=$rest
    kill -TERM "$pid" 2>/dev/null || return 0
    for _ in $(seq 200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}
cleanup() {
    local pid
    for pid in $PIDS; do stop_pid "$pid"; done
    if [ "${KEEP:-0}" = 1 ]; then say "kept $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_ports() { python3 "$HERE/ratestat.py" ports "$1"; }
wait_http() {
    local _
    for _ in $(seq 200); do
        [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 "$1" || true)" = 200 ] && return 0
        sleep 0.05
    done
    die "$1 did not answer 200 within 10 s"
}

# ---- servers -------------------------------------------------------------------
REDIS_PORT=$(free_ports 1)
redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --save '' --appendonly no \
    --dir "$TMP" >"$TMP/redis.log" 2>&1 &
REDIS_PID=$!
PIDS="$PIDS $REDIS_PID"
for _ in $(seq 100); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.05; done
rcli() { redis-cli -p "$REDIS_PORT" "$@"; }

"$STUB" --listen 127.0.0.1:0 --body-size 2 >"$TMP/stub.out" 2>"$TMP/stub.err" &
STUB_PID=$!
PIDS="$PIDS $STUB_PID"
for _ in $(seq 200); do grep -q '^listening ' "$TMP/stub.out" 2>/dev/null && break; sleep 0.05; done
STUB_PORT=$(sed -n 's/^listening 127\.0\.0\.1:\([0-9]*\)$/\1/p' "$TMP/stub.out")
stub() { curl -sf --max-time 10 -X "$1" "http://127.0.0.1:$STUB_PORT$2"; }

SL_PIDS=()
SL_PORTS=()
start_fleet() {   # start_fleet SHARED RATE BURST
    local i ports p a
    SL_PIDS=()
    SL_PORTS=()
    for i in $(seq "$SIDECARS"); do
        read -r p a <<<"$(free_ports 2 | tr '\n' ' ')"
        mkdir -p "$TMP/s$i"
        cat >"$TMP/s$i/sluice.yaml" <<EOF
listen: 127.0.0.1:$p
admin: 127.0.0.1:$a
threads: 1
log: {level: warn, access: false}
store: {backend: redis, url: "redis://127.0.0.1:$REDIS_PORT/0", fleet_size: $SIDECARS}
upstreams:
  stub: {url: "http://127.0.0.1:$STUB_PORT", max_connections: $CLIENTS}
policies:
  p: {rate: $2/s, burst: $3, max_wait: 1h, shared: $1}
routes:
  - {prefix: /, upstream: stub, policy: p}
EOF
        "$SLUICE" -c "$TMP/s$i/sluice.yaml" >"$TMP/s$i/stdout" 2>"$TMP/s$i/stderr" &
        SL_PIDS+=($!)
        PIDS="$PIDS $!"
        SL_PORTS+=("$p")
        wait_http "http://127.0.0.1:$a/readyz"
    done
}
stop_fleet() {
    local pid
    for pid in "${SL_PIDS[@]}"; do stop_pid "$pid"; done
}

# run NAME: wrk against every sidecar at once; per-run files in $TMP/NAME
run() {
    local d=$TMP/$1 i before=() after=() rb ra cmds
    mkdir -p "$d"
    stub POST /_stub/reset >/dev/null
    rcli CONFIG RESETSTAT >/dev/null
    for i in "${!SL_PIDS[@]}"; do before+=("$(cpu_ns "${SL_PIDS[$i]}")"); done
    rb=$(cpu_ns "$REDIS_PID")
    local wrks=()
    for i in "${!SL_PORTS[@]}"; do
        wrk -t1 -c"$CLIENTS" -d"${SECONDS_RUN}s" --latency "http://127.0.0.1:${SL_PORTS[$i]}/x" \
            >"$d/wrk$i.txt" 2>&1 &
        wrks+=($!)
    done
    wait "${wrks[@]}" 2>/dev/null || true
    ra=$(cpu_ns "$REDIS_PID")
    for i in "${!SL_PIDS[@]}"; do after+=("$(cpu_ns "${SL_PIDS[$i]}")"); done
    stub GET /_stub/arrivals >"$d/arrivals.json"
    stub GET /_stub/stats >"$d/stats.json"
    # Round trips: the scripts' EVALSHA calls (the commands a script runs inside count in
    # total_commands_processed too, so that is Redis's work, not trips).
    cmds=$(rcli INFO commandstats | tr -d '\r' |
        awk -F'[:=,]' '/^cmdstat_/ { n += $3 } /^cmdstat_evalsha:/ { e = $3 } END { print e + 0, n + 0 }')
    local sl_cpu=0
    for i in "${!SL_PIDS[@]}"; do sl_cpu=$((sl_cpu + ${after[$i]} - ${before[$i]})); done
    python3 "$HERE/fleetstat.py" "$d" "$SIDECARS" "$2" "$3" "$sl_cpu" "$((ra - rb))" $cmds
}

say "== 1. the fleet's rate: $SIDECARS sidecars x $CLIENTS clients, policy $RATE/s burst $BURST"
start_fleet redis "$RATE" "$BURST"
run rate-redis "$RATE" "$BURST" | sed 's/^/shared: redis  /'
stop_fleet
start_fleet local "$RATE" "$BURST"
run rate-local "$RATE" "$BURST" | sed 's/^/shared: local  /'
stop_fleet

say "== 2. the cost of a Redis permit: a policy far above the load"
start_fleet redis 1000000 1000
run cost-redis 1000000 1000 | sed 's/^/shared: redis  /'
stop_fleet
start_fleet local 1000000 1000
run cost-local 1000000 1000 | sed 's/^/shared: local  /'
stop_fleet
