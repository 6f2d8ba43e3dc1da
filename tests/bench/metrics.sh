#!/bin/bash
# Metrics benchmark (see tests/bench/README.md, "metrics.sh"):
#  1. the price of recording metrics: pass-through throughput and sluice CPU per request of the
#     normal build against a SLUICE_METRICS_OFF build (requests record no metrics), both running
#     on the same stub, runs interleaved on, off, off, on, on, off, ...;
#  2. the time of one scrape of GET /metrics with ROUTES routes and POLICIES policies, once every
#     series exists (traffic with several outcomes on every route first): idle, then during
#     a wrk load.
# Environment:
#   QUICK=1        a fast run (~40 s): DURATION=2, REPS=2, SCRAPES=50
#   DURATION       seconds per wrk run (default 10)
#   REPS           runs of each build (default 6)
#   CONNECTIONS    wrk connections (default 64)
#   SCRAPES        scrapes timed per state (default 200)
#   ROUTES, POLICIES  of the scrape config (default 50 and 20)
#   BUILD_DIR      normal build, default build-bench-sm/
#   NOMETRICS_DIR  -DSLUICE_METRICS_OFF=ON build, default build-bench-nometrics/
#   NO_BUILD=1     use the binaries already there
#   SKIP_THROUGHPUT=1 / SKIP_SCRAPE=1   leave a part out
#   PERF           1: also profile one more run of each build with `perf record` and report the
#                  share of sluice's CPU samples spent where requests record metrics (a figure
#                  the machine's noise hardly moves); 0: not; default: 1 when perf works
#   PIN            1 (default): in part 1, sluice on CPU 1, the stub and wrk on CPU 0 (taskset):
#                  runs vary less; 0: let the scheduler place them (as passthrough.sh does)
#   KEEP=1         keep the temp dir (configs, logs, raw wrk output, scrape output)
set -euo pipefail

if [ "${QUICK:-0}" = 1 ]; then
    : "${DURATION:=2}" "${REPS:=2}" "${SCRAPES:=50}"
fi
DURATION=${DURATION:-10}
REPS=${REPS:-6}
CONNECTIONS=${CONNECTIONS:-64}
SCRAPES=${SCRAPES:-200}
ROUTES=${ROUTES:-50}
POLICIES=${POLICIES:-20}
WARMUP=${WARMUP:-1}

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BUILD_DIR=${BUILD_DIR:-$REPO/build-bench-sm}
NOMETRICS_DIR=${NOMETRICS_DIR:-$REPO/build-bench-nometrics}
# shellcheck disable=SC2034  # NAME and TMP_PREFIX are read by benchlib.sh
NAME=metrics.sh TMP_PREFIX=sluice-metrics
[ "$(nproc)" -ge 2 ] && PIN=${PIN:-1}
# shellcheck source-path=SCRIPTDIR source=benchlib.sh
. "$HERE/benchlib.sh"

deps
if [ "${PERF:-auto}" = auto ]; then
    PERF=0
    command -v perf >/dev/null && perf record -q -o /dev/null -- true >/dev/null 2>&1 && PERF=1
fi
build "$BUILD_DIR"
build "$NOMETRICS_DIR" -DSLUICE_METRICS_OFF=ON
grep -q 'SLUICE_METRICS_OFF:BOOL=ON' "$NOMETRICS_DIR/CMakeCache.txt" ||
    die "$NOMETRICS_DIR is not a SLUICE_METRICS_OFF build"
grep -q 'SLUICE_METRICS_OFF:BOOL=ON' "$BUILD_DIR/CMakeCache.txt" &&
    die "$BUILD_DIR is a SLUICE_METRICS_OFF build"

say "sluice metrics benchmark; source: $REPO ($(source_rev))"
say "machine: $(nproc) cores, $(uname -r), load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
STARTED=$(date -u '+%Y-%m-%d %H:%M UTC')
start_stub "$BUILD_DIR/sluice-stub"

sluice_dir() {   # sluice_dir NAME PORT ADMIN_PORT THREADS_LINE: DIR with sluice.yaml minus routes
    local d=$TMP/$1
    mkdir -p "$d"
    cat >"$d/sluice.yaml" <<EOF
listen: 127.0.0.1:$2
admin: 127.0.0.1:$3
$4
log: {level: warn, access: false}
store: {path: $d/data}
EOF
    echo "$d"
}

# ---- part 1: metrics on vs off ------------------------------------------------------
: >"$TMP/runs.tsv"
if [ "${SKIP_THROUGHPUT:-0}" != 1 ]; then
    # shellcheck disable=SC2046
    set -- $($HELPER ports 4)
    ON_PORT=$1 ON_ADMIN=$2 OFF_PORT=$3 OFF_ADMIN=$4
    for which in on off; do
        if [ "$which" = on ]; then
            d=$(sluice_dir on "$ON_PORT" "$ON_ADMIN" "threads: 1") bin=$BUILD_DIR/sluice admin=$ON_ADMIN
        else
            d=$(sluice_dir off "$OFF_PORT" "$OFF_ADMIN" "threads: 1") bin=$NOMETRICS_DIR/sluice admin=$OFF_ADMIN
        fi
        cat >>"$d/sluice.yaml" <<EOF
upstreams:
  stub: {url: "http://127.0.0.1:$STUB_PORT", max_connections: $CONNECTIONS}
routes:
  - {name: pass, prefix: /, upstream: stub}
EOF
        start_sluice "$bin" "$d" "$admin"
        if [ "$which" = on ]; then ON_PID=$SLUICE_PID; else OFF_PID=$SLUICE_PID; fi
    done
    say "stub :$STUB_PORT (pid $STUB_PID); metrics on: sluice :$ON_PORT (pid $ON_PID);" \
        "metrics off: sluice :$OFF_PORT (pid $OFF_PID)"
    if [ "$WARMUP" -gt 0 ]; then
        for p in "$ON_PORT" "$OFF_PORT"; do
            $PIN_LOAD wrk -t1 -c"$CONNECTIONS" -d"$WARMUP"s "http://127.0.0.1:$p/bench" >"$TMP/warmup.txt" 2>&1 ||
                die "wrk warm-up failed: $(cat "$TMP/warmup.txt")"
        done
    fi
    for rep in $(seq "$REPS"); do
        if [ $((rep % 2)) = 1 ]; then order="on off"; else order="off on"; fi
        for which in $order; do
            if [ "$which" = on ]; then pid=$ON_PID port=$ON_PORT; else pid=$OFF_PID port=$OFF_PORT; fi
            measure "$TMP/runs.tsv" "metrics-$which" "$rep" "$pid" "$CONNECTIONS" "$DURATION" \
                "http://127.0.0.1:$port/bench"
        done
    done
    if [ "$PERF" = 1 ]; then
        for which in on off; do
            if [ "$which" = on ]; then pid=$ON_PID port=$ON_PORT; else pid=$OFF_PID port=$OFF_PORT; fi
            $PIN_LOAD wrk -t1 -c"$CONNECTIONS" -d$((DURATION + 2))s "http://127.0.0.1:$port/bench" \
                >"$TMP/wrk-perf-$which.txt" 2>&1 &
            WRK_PID=$!
            PIDS="$PIDS $WRK_PID"
            sleep 1
            perf record -q -F 1999 -p "$pid" -o "$TMP/perf-$which.data" -- sleep "$DURATION" \
                >"$TMP/perf-$which.log" 2>&1 || die "perf record failed: $(cat "$TMP/perf-$which.log")"
            stop_pid "$WRK_PID"   # it ends by itself about now
            perf report -i "$TMP/perf-$which.data" --stdio --no-children --sort symbol \
                >"$TMP/perf-$which.txt" 2>/dev/null || die "perf report failed"
            say "  perf, metrics $which: $($HELPER perfshare "$TMP/perf-$which.txt")"
        done
    fi
    # The off build must really have recorded nothing.
    curl -sf "http://127.0.0.1:$OFF_ADMIN/metrics" >"$TMP/off-metrics.txt" || die "scrape failed"
    ! grep -q '^sluice_requests_total{' "$TMP/off-metrics.txt" ||
        die "the SLUICE_METRICS_OFF build counted requests"
    curl -sf "http://127.0.0.1:$ON_ADMIN/metrics" >"$TMP/on-metrics.txt" || die "scrape failed"
    grep -q '^sluice_requests_total{route="pass",outcome="ok"' "$TMP/on-metrics.txt" ||
        die "the normal build counted no requests"
    stop_sluice "$ON_PID" "$TMP/on"
    stop_sluice "$OFF_PID" "$TMP/off"
fi

# ---- part 2: one scrape with many routes and policies ----------------------------------
if [ "${SKIP_SCRAPE:-0}" != 1 ]; then
    # shellcheck disable=SC2046
    set -- $($HELPER ports 2)
    PORT=$1 ADMIN=$2
    d=$(sluice_dir scrape "$PORT" "$ADMIN" "threads: 0   # one loop per core")
    # shellcheck disable=SC2034  # read by start_sluice
    PIN_SLUICE=""   # its loops and the admin thread may use every core
    {
        echo "upstreams:"
        for u in 0 1 2 3 4; do
            echo "  u$u: {url: \"http://127.0.0.1:$STUB_PORT\", max_connections: 16, timeout: 5s}"
        done
        echo "policies:"
        for p in $(seq 0 $((POLICIES - 1))); do
            echo "  p$p: {rate: 100000/s, burst: 1000, concurrency: 64, retry: {base: 1s, max_attempts: 5}}"
        done
        echo "routes:"
        for r in $(seq 0 $((ROUTES - 1))); do
            # routes share the policies round-robin; every 5th route has none (the default)
            if [ $((r % 5)) = 4 ]; then pol=""; else pol=", policy: p$((r % POLICIES))"; fi
            echo "  - {name: r$r, prefix: /r$r/, upstream: u$((r % 5))$pol}"
        done
    } >>"$d/sluice.yaml"
    "$BUILD_DIR/sluice" --check-config "$d/sluice.yaml" >&2 || die "generated config is invalid"
    start_sluice "$BUILD_DIR/sluice" "$d" "$ADMIN"
    SCRAPE_PID=$SLUICE_PID
    say "scrape: sluice :$PORT (pid $SCRAPE_PID), $ROUTES routes, $POLICIES policies"
    # Every route: answers ok, permanent_error (404, 500), requeue (503, 429: cooldown), with
    # Sluice-Enqueued-At (queue age); then one request that matches no route.
    for status in 200 404 500 503 429; do
        curl -s -o /dev/null -H "X-Stub-Status: $status" -H "Sluice-Enqueued-At: $(( $(date +%s) - 30 ))" \
            "http://127.0.0.1:$PORT/r[0-$((ROUTES - 1))]/x" || die "traffic to the routes failed"
    done
    curl -s -o /dev/null "http://127.0.0.1:$PORT/nowhere" || true
    curl -sf "http://127.0.0.1:$ADMIN/metrics" >"$TMP/scrape.txt" || die "scrape failed"
    echo "routes=$ROUTES policies=$POLICIES lines=$(wc -l <"$TMP/scrape.txt")" \
        "series=$(grep -vc '^#' "$TMP/scrape.txt") bytes=$(wc -c <"$TMP/scrape.txt")" >"$TMP/scrape-info.txt"
    say "  /metrics: $(cat "$TMP/scrape-info.txt")"
    for r in 0 $((ROUTES - 1)); do
        grep -q "^sluice_requests_total{route=\"r$r\",outcome=\"requeue\"" "$TMP/scrape.txt" ||
            die "route r$r has no requeue series: the traffic did not reach every route"
    done

    scrape_series() {   # scrape_series OUT: SCRAPES scrapes on one keep-alive connection
        curl -s -o /dev/null -w '%{time_total} %{size_download}\n' \
            "http://127.0.0.1:$ADMIN/metrics?n=[1-$SCRAPES]" >"$1" || die "scrapes failed"
    }
    scrape_series "$TMP/scrape-warm.txt"   # not recorded
    scrape_series "$TMP/scrape-idle.txt"
    # Under load: wrk on a route without a policy for the time of the scrapes, plus 1 s before
    # and about 2 s after.
    secs=$(awk -v n="$SCRAPES" 'BEGIN { s = int(n * 0.01 + 0.999) + 3; print s }')
    $PIN_LOAD wrk -t1 -c"$CONNECTIONS" -d"$secs"s "http://127.0.0.1:$PORT/r4/x" >"$TMP/wrk-scrape.txt" 2>&1 &
    WRK_PID=$!
    PIDS="$PIDS $WRK_PID"
    sleep 1
    scrape_series "$TMP/scrape-load.txt"
    wait "$WRK_PID" || die "wrk failed: $(cat "$TMP/wrk-scrape.txt")"
    PIDS=${PIDS% "$WRK_PID"}
    say "  load during the scrapes: $(awk '/^Requests\/sec:/ { print $2 }' "$TMP/wrk-scrape.txt") req/s on /r4/"
    stop_sluice "$SCRAPE_PID" "$d"
fi

say "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
pinned=""
[ -z "$PIN_LOAD" ] || pinned=" (part 1 pinned: sluice on CPU 1, stub and wrk on CPU 0)"
echo "metrics.sh — started $STARTED, $(nproc) cores ($(uname -m)); sluice threads: 1 (part 1)$pinned," \
    "threads: 0 = $(nproc) loops (scrapes); wrk -t1 -c$CONNECTIONS -d${DURATION}s, $REPS run(s) per build;" \
    "CPU from /proc/PID/stat (CLK_TCK $HZ)"
$HELPER metrics-report "$TMP"
