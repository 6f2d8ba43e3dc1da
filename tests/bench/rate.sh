#!/bin/bash
# Rate benchmark (see tests/bench/README.md, "rate.sh"):
#  1. rate accuracy: closed-loop wrk load through one sluice policy (max_wait 1h, so requests
#     wait instead of being refused) at several rates and client counts; the stub's arrival
#     times give the achieved rate and the worst window overshoot of the docs/contract.md §5 bound
#     (at most burst + rate * t requests start in any interval of length t);
#  2. the bucket's cost on the hot path: pass-through throughput through a policy far above
#     the load vs no policy, next to nginx with and without limit_req, runs interleaved.
# Environment:
#   DURATION_SCALE  multiplies every duration (default 1; 0.2 gives a ~1.5 min smoke run)
#   RATES           default "1 10 100 1000 5000" (requests/s)
#   CONCS           default "1 8 64 512" (wrk connections = closed-loop clients)
#   BURST           default 10
#   COST_SECONDS    seconds per cost run before scaling (default 10); COST_REPS (default 3)
#   SKIP_RATE=1 / SKIP_COST=1   leave a part out
#   SNIFF=1         (root) also stamp sluice's sends to the stub from an AF_PACKET socket on lo,
#                   to tell sluice's timing from the stub's scheduling (costs some CPU)
#   BUILD_DIR       default build-bench-rate/ ; NO_BUILD=1 uses the binaries already there
#   KEEP=1          keep the temp dir (configs, logs, raw wrk output, arrivals)
set -euo pipefail

DURATION_SCALE=${DURATION_SCALE:-1}
RATES=${RATES:-"1 10 100 1000 5000"}
CONCS=${CONCS:-"1 8 64 512"}
BURST=${BURST:-10}
COST_SECONDS=${COST_SECONDS:-10}
COST_REPS=${COST_REPS:-3}
COST_CONNS=64

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BUILD_DIR=${BUILD_DIR:-$REPO/build-bench-rate}
HELPER="python3 $HERE/ratestat.py"

say() { printf '%s\n' "$*" >&2; }
die() { say "rate.sh: $*"; exit 1; }
scaled() { awk -v s="$1" -v k="$DURATION_SCALE" 'BEGIN { v = int(s * k + 0.5); print (v < 1 ? 1 : v) }'; }
rps_of() { awk '/^Requests\/sec:/ { print $2 }' "$1"; }
cpu_ns() {   # CPU time of all threads of PID so far, in ns (schedstat: on-CPU time first)
    cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{ t += $1 } END { printf "%.0f\n", t }'
}

# ---- dependencies and build --------------------------------------------------
sh "$REPO/scripts/deps.sh" --bench
command -v wrk >/dev/null || die "wrk not found after scripts/deps.sh --bench"
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
[ -x "$NGINX" ] || die "nginx not found after scripts/deps.sh --bench"
command -v curl >/dev/null || die "curl not found"

if [ "${NO_BUILD:-0}" != 1 ]; then
    say "building sluice and sluice-stub in $BUILD_DIR"
    cmake -S "$REPO" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSLUICE_TESTS=OFF >/dev/null
    cmake --build "$BUILD_DIR" -j"$(nproc)" --target sluice sluice-stub >/dev/null
fi
SLUICE=$BUILD_DIR/sluice
STUB=$BUILD_DIR/sluice-stub
if [ ! -x "$SLUICE" ] || [ ! -x "$STUB" ]; then die "no sluice / sluice-stub in $BUILD_DIR"; fi

# ---- process bookkeeping: every process started here is stopped by its pid ---
TMP=$(mktemp -d "${TMPDIR:-/tmp}/sluice-rate.XXXXXX")
PIDS=""

stop_pid() {   # stop_pid PID: SIGTERM, SIGKILL after 10 s; exit status in STOP_RC
    local pid=$1 p rest="" _
    for p in $PIDS; do [ "$p" = "$pid" ] || rest="$rest $p"; done
    PIDS=$rest
    STOP_RC=0
    if kill -TERM "$pid" 2>/dev/null; then
        for _ in $(seq 200); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.05
        done
        if kill -0 "$pid" 2>/dev/null; then
            say "warning: pid $pid still running 10 s after SIGTERM: SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
        fi
    fi
    wait "$pid" 2>/dev/null || STOP_RC=$?
}

cleanup() {
    local pid
    for pid in $PIDS; do stop_pid "$pid"; done
    if [ "${KEEP:-0}" = 1 ]; then say "kept $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

wait_http() {   # wait_http URL PID: until URL answers 200, at most 10 s
    local _
    for _ in $(seq 200); do
        kill -0 "$2" 2>/dev/null || die "process $2 exited while starting (see $TMP)"
        [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 "$1" || true)" = 200 ] &&
            return 0
        sleep 0.05
    done
    die "$1 did not answer 200 within 10 s"
}

# ---- servers -----------------------------------------------------------------
start_stub() {   # -> STUB_PID, STUB_PORT
    "$STUB" --listen 127.0.0.1:0 --body-size 2 >"$TMP/stub.out" 2>"$TMP/stub.err" &
    STUB_PID=$!
    PIDS="$PIDS $STUB_PID"
    local _
    for _ in $(seq 200); do
        grep -q '^listening ' "$TMP/stub.out" 2>/dev/null && break
        kill -0 "$STUB_PID" 2>/dev/null || die "stub exited: $(cat "$TMP/stub.err")"
        sleep 0.05
    done
    STUB_PORT=$(sed -n 's/^listening 127\.0\.0\.1:\([0-9]*\)$/\1/p' "$TMP/stub.out")
    [ -n "$STUB_PORT" ] || die "stub did not print its port"
}

stub() {   # stub METHOD PATH: a control request to the stub, body on stdout
    curl -sf --max-time 10 -X "$1" "http://127.0.0.1:$STUB_PORT$2" ||
        die "stub control request $1 $2 failed"
}

sluice_config() {   # sluice_config DIR THREADS UPSTREAM_CONNS, policies and routes on stdin
    mkdir -p "$1"
    {
        cat <<EOF
listen: 127.0.0.1:$SLUICE_PORT
admin: 127.0.0.1:$ADMIN_PORT
threads: $2
log: {level: warn, access: false}
store: {path: $1/data}
limits: {drain_timeout: 100ms}
upstreams:
  stub: {url: "http://127.0.0.1:$STUB_PORT", max_connections: $3}
EOF
        cat
    } >"$1/sluice.yaml"
}

start_sluice() {   # start_sluice DIR (config in DIR/sluice.yaml) -> SLUICE_PID
    "$SLUICE" -c "$1/sluice.yaml" >"$1/stdout" 2>"$1/stderr" &
    SLUICE_PID=$!
    PIDS="$PIDS $SLUICE_PID"
    # The admin port only: a request to the proxy port would take a permit.
    wait_http "http://127.0.0.1:$ADMIN_PORT/readyz" "$SLUICE_PID"
}

stop_sluice() {   # stop_sluice DIR
    stop_pid "$SLUICE_PID"
    [ "$STOP_RC" -eq 0 ] || say "warning: sluice exited with status $STOP_RC on SIGTERM (see $1/stderr)"
}

start_nginx() {   # -> NGINX_PID; / plain, /limited/ through limit_req
    local d=$TMP/nginx
    mkdir -p "$d"
    cat >"$d/nginx.conf" <<EOF
daemon off;
master_process off;
worker_processes 1;
pid $d/nginx.pid;
error_log $d/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $d/client_body;
    proxy_temp_path $d/proxy;
    fastcgi_temp_path $d/fastcgi;
    uwsgi_temp_path $d/uwsgi;
    scgi_temp_path $d/scgi;
    limit_req_zone \$binary_remote_addr zone=fast:1m rate=10000000r/s;
    upstream stub {
        server 127.0.0.1:$STUB_PORT;
        keepalive 64;
    }
    server {
        listen 127.0.0.1:$NGINX_PORT;
        location / {
            proxy_pass http://stub;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
        location /limited/ {
            limit_req zone=fast burst=1000000 nodelay;
            proxy_pass http://stub;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
}
EOF
    "$NGINX" -p "$d/" -e "$d/error.log" -c "$d/nginx.conf" >"$d/stdout" 2>&1 &
    NGINX_PID=$!
    PIDS="$PIDS $NGINX_PID"
    wait_http "http://127.0.0.1:$NGINX_PORT/" "$NGINX_PID"
}

run_wrk() {   # run_wrk OUT CONNS THREADS SECONDS URL
    # wrk sizes its latency histogram by --timeout (8 bytes per µs): keep it just above the
    # run. A request still waiting for its permit when the run ends is never answered to wrk;
    # wrk counts it as a timeout, which is no error in part 1.
    timeout $(( $4 + 30 )) wrk -t"$3" -c"$2" -d"$4"s --timeout "$(( $4 + 1 ))s" --latency "$5" \
        >"$1" 2>&1 || die "wrk failed: $(cat "$1")"
}

# ---- part 1: rate accuracy ------------------------------------------------------
RATE_ROWS=$TMP/rate.tsv
CEILINGS=$TMP/ceilings.tsv
: >"$RATE_ROWS"
: >"$CEILINGS"

calibrate() {   # closed-loop ceiling through sluice with no policy, for 1 and 8 clients
    local d=$TMP/calibrate c secs rps
    secs=$(scaled 2)
    sluice_config "$d" 2 512 <<EOF
routes:
  - {prefix: /, upstream: stub}
EOF
    start_sluice "$d"
    for c in 1 8; do
        run_wrk "$d/wrk-c$c.txt" "$c" "$(( c < 2 ? c : 2 ))" "$secs" "http://127.0.0.1:$SLUICE_PORT/c"
        rps=$(rps_of "$d/wrk-c$c.txt")
        echo "$c $rps" >>"$CEILINGS"
        say "  no policy, $c client(s): $rps req/s (the closed loop's ceiling)"
    done
    stop_sluice "$d"
}

start_sniffer() {   # start_sniffer DIR -> SNIFF_PID; writes DIR/sent.json when stopped
    local _
    $HELPER sniff "$STUB_PORT" "$1/sent.json" "GET /rate" >"$1/sniff.out" 2>"$1/sniff.err" &
    SNIFF_PID=$!
    PIDS="$PIDS $SNIFF_PID"
    for _ in $(seq 200); do
        grep -q '^ready' "$1/sniff.out" 2>/dev/null && return 0
        kill -0 "$SNIFF_PID" 2>/dev/null || die "the sniffer exited: $(cat "$1/sniff.err")"
        sleep 0.05
    done
    die "the sniffer did not start within 10 s"
}

rate_cell() {   # rate_cell RATE CLIENTS SECONDS
    local rate=$1 c=$2 secs=$3 d=$TMP/rate-$1-$2
    sluice_config "$d" 2 512 <<EOF
policies:
  p: {rate: $rate/s, burst: $BURST, max_wait: 1h}
routes:
  - {prefix: /, upstream: stub, policy: p}
  - {prefix: /warm/, upstream: stub}
EOF
    start_sluice "$d"
    # Open upstream connections first (an unpaced route to the same upstream), so that the
    # first paced requests do not pay a TCP connect that later ones skip.
    curl -sf --parallel --parallel-immediate --parallel-max 16 \
        "http://127.0.0.1:$SLUICE_PORT/warm/[1-16]" >/dev/null 2>"$d/warm.err" ||
        die "warm-up through sluice failed: $(cat "$d/warm.err")"
    [ "${SNIFF:-0}" = 1 ] && start_sniffer "$d"
    stub POST /_stub/reset >/dev/null
    run_wrk "$d/wrk.txt" "$c" "$(( c < 2 ? c : 2 ))" "$secs" "http://127.0.0.1:$SLUICE_PORT/rate"
    # Requests still waiting for their permit would keep arriving: stop sluice first (drain
    # 100 ms, then the waiters are answered requeue), so that every arrival is of this cell.
    stop_sluice "$d"
    if [ "${SNIFF:-0}" = 1 ]; then
        stop_pid "$SNIFF_PID"
        [ "$STOP_RC" -eq 0 ] || die "the sniffer failed: $(cat "$d/sniff.err")"
    fi
    stub GET /_stub/arrivals >"$d/arrivals.json"
    stub GET /_stub/stats >"$d/stats.json"
    $HELPER cell "$d" "$rate" "$c" "$secs" "$BURST" >>"$RATE_ROWS"
}

# ---- part 2: cost of the bucket on the hot path -------------------------------
COST_RUNS=$TMP/cost.list
: >"$COST_RUNS"

cost_part() {
    local secs warm d=$TMP/cost rep t out
    secs=$(scaled "$COST_SECONDS")
    warm=$(scaled 1)
    sluice_config "$d" 1 "$COST_CONNS" <<EOF
policies:
  fast: {rate: 10000000/s, burst: 1000000}
routes:
  - {prefix: /, upstream: stub}
  - {prefix: /paced/, upstream: stub, policy: fast}
EOF
    start_sluice "$d"
    start_nginx
    local -A url=(
        [sluice-nopolicy]="http://127.0.0.1:$SLUICE_PORT/plain/x"
        [sluice-policy]="http://127.0.0.1:$SLUICE_PORT/paced/x"
        [nginx-plain]="http://127.0.0.1:$NGINX_PORT/plain/x"
        [nginx-limit_req]="http://127.0.0.1:$NGINX_PORT/limited/x"
    )
    local order="sluice-nopolicy sluice-policy nginx-plain nginx-limit_req"
    for t in $order; do   # fill pools and caches; not recorded
        run_wrk "$d/warmup-$t.txt" "$COST_CONNS" 1 "$warm" "${url[$t]}"
    done
    local pid c0 c1
    for rep in $(seq "$COST_REPS"); do
        for t in $order; do
            out=$d/wrk-$t-$rep.txt
            pid=$SLUICE_PID
            [ "${t#nginx}" = "$t" ] || pid=$NGINX_PID
            c0=$(cpu_ns "$pid")
            run_wrk "$out" "$COST_CONNS" 1 "$secs" "${url[$t]}"
            c1=$(cpu_ns "$pid")
            echo "$t $rep $out $(( c1 - c0 ))" >>"$COST_RUNS"
            say "  $(printf '%-16s rep %s: %9s req/s, proxy CPU %5.2f s' "$t" "$rep" \
                "$(rps_of "$out")" "$(awk -v n=$(( c1 - c0 )) 'BEGIN { print n / 1e9 }')")"
        done
    done
    stop_pid "$NGINX_PID"
    stop_sluice "$d"
}

# ---- main ---------------------------------------------------------------------
START=$(date +%s)
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
say "sluice rate benchmark; $(nproc) cores, $(uname -r); DURATION_SCALE=$DURATION_SCALE;" \
    "load average at start: $LOAD_START"
# shellcheck disable=SC2046
set -- $($HELPER ports 3)
SLUICE_PORT=$1 ADMIN_PORT=$2 NGINX_PORT=$3
start_stub
say "stub :$STUB_PORT (pid $STUB_PID), sluice :$SLUICE_PORT admin :$ADMIN_PORT, nginx :$NGINX_PORT"

if [ "${SKIP_RATE:-0}" != 1 ]; then
    say "part 1: rate accuracy (burst $BURST, max_wait 1h, closed loop, sluice threads: 2)"
    calibrate
    mapfile -t PLAN < <($HELPER cells "$DURATION_SCALE" "$RATES" "$CONCS")
    for cell in "${PLAN[@]}"; do
        # shellcheck disable=SC2086
        rate_cell $cell
    done
fi
if [ "${SKIP_COST:-0}" != 1 ]; then
    say "part 2: cost of the bucket (wrk -t1 -c$COST_CONNS -d$(scaled "$COST_SECONDS")s," \
        "sluice threads: 1, $COST_REPS interleaved reps)"
    cost_part
fi

echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); $(nproc) cores; DURATION_SCALE=$DURATION_SCALE;" \
    "load average at start $LOAD_START, at end $(cut -d' ' -f1-3 /proc/loadavg);" \
    "total $(( $(date +%s) - START )) s"
$HELPER report "$RATE_ROWS" "$CEILINGS" "$COST_RUNS" "$BURST" "$(scaled "$COST_SECONDS")" "$COST_CONNS"
