#!/bin/bash
# Pass-through benchmark: wrk -> {stub | nginx -> stub | sluice -> stub}.
# See tests/bench/README.md. Environment: DURATION (s, default 10), REPS (default 3),
# CONNECTIONS (default 64), SIZES (default "2 4096"), WARMUP (s per target, default 1),
# BUILD_DIR (default build-bench/), KEEP=1 keeps the temp dir (configs, logs, raw wrk output),
# NO_BUILD=1 uses the binaries in BUILD_DIR as they are, REPLAY=1 adds a fourth target: sluice
# answering replays (POST with one Idempotency-Key, primed once, then answered from the store).
set -euo pipefail

DURATION=${DURATION:-10}
REPS=${REPS:-3}
CONNECTIONS=${CONNECTIONS:-64}
SIZES=${SIZES:-"2 4096"}
WARMUP=${WARMUP:-1}
REPLAY=${REPLAY:-0}

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BUILD_DIR=${BUILD_DIR:-$REPO/build-bench}
HELPER="python3 $HERE/benchstat.py"
HZ=$(getconf CLK_TCK)

say() { printf '%s\n' "$*" >&2; }
die() { say "passthrough.sh: $*"; exit 1; }

# ---- dependencies and build --------------------------------------------------
sh "$REPO/scripts/deps.sh" --bench
command -v wrk >/dev/null || die "wrk not found after scripts/deps.sh --bench"
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
[ -x "$NGINX" ] || die "nginx not found after scripts/deps.sh --bench"
command -v curl >/dev/null || die "curl not found"

if [ "${NO_BUILD:-0}" != 1 ]; then
    say "building sluice and sluice-stub in $BUILD_DIR"
    cmake -S "$REPO" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSLUICE_TESTS=OFF >/dev/null
    cmake --build "$BUILD_DIR" -j"$(nproc)" --target sluice sluice-stub >"$BUILD_DIR/bench-build.log" 2>&1 ||
        die "build failed, see $BUILD_DIR/bench-build.log"
fi
SLUICE=$BUILD_DIR/sluice
STUB=$BUILD_DIR/sluice-stub

# ---- process bookkeeping -----------------------------------------------------
TMP=$(mktemp -d "${TMPDIR:-/tmp}/sluice-bench.XXXXXX")
PIDS=""

stop_pid() {   # stop_pid PID: SIGTERM, then SIGKILL after 5 s; exit status in STOP_RC
    local pid=$1 p rest="" _
    for p in $PIDS; do [ "$p" = "$pid" ] || rest="$rest $p"; done
    PIDS=$rest
    STOP_RC=0
    if ! kill -TERM "$pid" 2>/dev/null; then wait "$pid" 2>/dev/null || STOP_RC=$?; return 0; fi
    for _ in $(seq 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || STOP_RC=$?
}

stop_all() {
    local pid
    for pid in $PIDS; do stop_pid "$pid"; done
}

cleanup() {
    stop_all
    if [ "${KEEP:-0}" = 1 ]; then say "kept $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- /proc readings ----------------------------------------------------------
cpu_ticks() {   # utime + stime of PID, in clock ticks
    local s rest
    s=$(cat "/proc/$1/stat") || die "process $1 is gone"
    rest=${s##*) }   # fields after "(comm) ": rest[0] = state (field 3)
    # shellcheck disable=SC2086
    set -- $rest
    echo $(( ${12} + ${13} ))   # fields 14 and 15
}

status_kb() {   # status_kb PID FIELD -> value in kB
    awk -v f="$2:" '$1 == f { print $2 }' "/proc/$1/status"
}

wait_http() {   # wait_http URL PID: until URL answers 200, at most 10 s
    local _
    for _ in $(seq 100); do
        kill -0 "$2" 2>/dev/null || die "process $2 exited while starting (see $TMP)"
        [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 "$1" || true)" = 200 ] &&
            return 0
        sleep 0.1
    done
    die "$1 did not answer 200 within 10 s"
}

# ---- starting the three servers ----------------------------------------------
start_stub() {   # start_stub SIZE -> sets STUB_PID, STUB_PORT
    "$STUB" --listen 127.0.0.1:0 --body-size "$1" >"$TMP/stub-$1.out" 2>"$TMP/stub-$1.err" &
    STUB_PID=$!
    PIDS="$PIDS $STUB_PID"
    local _
    for _ in $(seq 100); do
        grep -q '^listening ' "$TMP/stub-$1.out" 2>/dev/null && break
        kill -0 "$STUB_PID" 2>/dev/null || die "stub exited: $(cat "$TMP/stub-$1.err")"
        sleep 0.1
    done
    STUB_PORT=$(sed -n 's/^listening 127\.0\.0\.1:\([0-9]*\)$/\1/p' "$TMP/stub-$1.out")
    [ -n "$STUB_PORT" ] || die "stub did not print its port"
}

start_nginx() {   # start_nginx PORT -> sets NGINX_PID (master), NGINX_WORKER
    local d=$TMP/nginx-$SIZE user_line=""
    mkdir -p "$d"
    # As root the master would switch its worker to "nobody": keep the current user.
    [ "$(id -u)" -eq 0 ] && user_line="user $(id -un) $(id -gn);"
    cat >"$d/nginx.conf" <<EOF
daemon off;
master_process on;
worker_processes 1;
$user_line
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
    upstream stub {
        server 127.0.0.1:$STUB_PORT;
        keepalive 64;
    }
    server {
        listen 127.0.0.1:$1;
        location / {
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
    wait_http "http://127.0.0.1:$1/" "$NGINX_PID"
    NGINX_WORKER=$(tr ' ' '\n' <"/proc/$NGINX_PID/task/$NGINX_PID/children" | grep -m1 .) ||
        die "no nginx worker process found"
}

start_sluice() {   # start_sluice PORT ADMIN_PORT -> sets SLUICE_PID
    local d=$TMP/sluice-$SIZE
    mkdir -p "$d"
    cat >"$d/sluice.yaml" <<EOF
listen: 127.0.0.1:$1
admin: 127.0.0.1:$2
threads: 1
log: {level: warn, access: false}
store: {path: $d/data}
upstreams:
  stub: {url: "http://127.0.0.1:$STUB_PORT", max_connections: 64}
policies:
  replay: {idempotency: {required: false}}
routes:
  - {prefix: /replay/, upstream: stub, policy: replay}
  - {prefix: /, upstream: stub}
EOF
    "$SLUICE" -c "$d/sluice.yaml" >"$d/stdout" 2>"$d/stderr" &
    SLUICE_PID=$!
    PIDS="$PIDS $SLUICE_PID"
    wait_http "http://127.0.0.1:$2/readyz" "$SLUICE_PID"
    wait_http "http://127.0.0.1:$1/" "$SLUICE_PID"
}

# ---- one measured run --------------------------------------------------------
RUNS=$TMP/runs.tsv
RSS=$TMP/rss.tsv
: >"$RUNS"
: >"$RSS"

REPLAY_KEY=bench-replay
REPLAY_LUA=$TMP/replay.lua
cat >"$REPLAY_LUA" <<EOF
wrk.method = "POST"
wrk.body = "{}"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Idempotency-Key"] = "$REPLAY_KEY"
EOF

run_wrk() {   # run_wrk PORT SECONDS OUTFILE [replay]
    local url="http://127.0.0.1:$1/bench" script=()
    if [ "${4:-}" = replay ]; then url="http://127.0.0.1:$1/replay/bench" script=(-s "$REPLAY_LUA"); fi
    timeout $(( $2 + 30 )) wrk -t1 -c"$CONNECTIONS" -d"$2"s --latency "${script[@]}" \
        "$url" >"$3" 2>&1 || die "wrk failed: $(cat "$3")"
}

prime_replay() {   # prime_replay PORT: the one request that reaches the stub and is stored
    curl -sf -o /dev/null -X POST -H "Idempotency-Key: $REPLAY_KEY" \
        -H 'Content-Type: application/json' -d '{}' "http://127.0.0.1:$1/replay/bench" ||
        die "the priming request for replays failed"
}

sys_ticks() {   # "busy total" jiffies of the machine; busy leaves out irq and softirq time,
                # which (with IRQ time accounting) no process's utime + stime includes either
    awk '$1 == "cpu" { print $2 + $3 + $4 + $9, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9 }' /proc/stat
}

children_ticks() {   # user + sys time of this shell's reaped children, from the `times` file $1
    awk -v hz="$HZ" 'NR == 2 {
        t = 0
        for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); t += a[1] * 60 + a[2] }
        printf "%d\n", t * hz + 0.5 }' "$1"
}

measure() {   # measure SIZE TARGET REP PORT PROXY_PID
    local out=$TMP/wrk-$1-$2-$3.txt p0=0 p1=0 s0 s1 m0 m1 w0 w1
    [ "$5" = - ] || p0=$(cpu_ticks "$5")
    s0=$(cpu_ticks "$STUB_PID")
    m0=$(sys_ticks)
    times >"$TMP/times0"   # a builtin: no fork, so only wrk is reaped in between
    run_wrk "$4" "$DURATION" "$out" "$2"
    times >"$TMP/times1"
    m1=$(sys_ticks)
    [ "$5" = - ] || p1=$(cpu_ticks "$5")
    s1=$(cpu_ticks "$STUB_PID")
    w0=$(children_ticks "$TMP/times0")
    w1=$(children_ticks "$TMP/times1")
    # shellcheck disable=SC2086
    set -- "$1" "$2" "$3" "$out" $((p1 - p0)) $((s1 - s0)) $((w1 - w0)) \
        $(( ${m1% *} - ${m0% *} )) $(( ${m1#* } - ${m0#* } ))
    $HELPER record "$RUNS" "$HZ" "$(nproc)" "$@" >&2
}

# ---- main ---------------------------------------------------------------------
say "sluice pass-through benchmark: wrk -t1 -c$CONNECTIONS -d${DURATION}s, $REPS rep(s), bodies: $SIZES"
if rev=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null); then
    [ -z "$(git -C "$REPO" --no-optional-locks status --porcelain --untracked-files=no 2>/dev/null)" ] ||
        rev="$rev + uncommitted changes"
else
    rev="not a git checkout"
fi
say "source: $REPO ($rev)"
say "machine: $(nproc) cores, $(uname -r), load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"

for size in $SIZES; do
    SIZE=$size
    # shellcheck disable=SC2046
    set -- $($HELPER ports 3)
    NGINX_PORT=$1 SLUICE_PORT=$2 ADMIN_PORT=$3
    start_stub "$size"
    start_nginx "$NGINX_PORT"
    start_sluice "$SLUICE_PORT" "$ADMIN_PORT"
    sluice_idle="$(status_kb "$SLUICE_PID" VmRSS) $(status_kb "$SLUICE_PID" RssAnon)"
    nginx_idle="$(status_kb "$NGINX_WORKER" VmRSS) $(status_kb "$NGINX_WORKER" RssAnon)"
    say "body $size B: stub :$STUB_PORT (pid $STUB_PID), nginx :$NGINX_PORT (worker pid $NGINX_WORKER)," \
        "sluice :$SLUICE_PORT (pid $SLUICE_PID); idle RSS (anon) sluice ${sluice_idle% *} (${sluice_idle#* }) kB, nginx ${nginx_idle% *} (${nginx_idle#* }) kB"

    if [ "$WARMUP" -gt 0 ]; then   # fill pools and caches; not recorded
        for p in "$STUB_PORT" "$NGINX_PORT" "$SLUICE_PORT"; do
            run_wrk "$p" "$WARMUP" "$TMP/warmup.txt"
        done
    fi
    if [ "$REPLAY" = 1 ]; then
        prime_replay "$SLUICE_PORT"
        if [ "$WARMUP" -gt 0 ]; then run_wrk "$SLUICE_PORT" "$WARMUP" "$TMP/warmup.txt" replay; fi
    fi
    for rep in $(seq "$REPS"); do
        measure "$size" direct "$rep" "$STUB_PORT" -
        measure "$size" nginx "$rep" "$NGINX_PORT" "$NGINX_WORKER"
        measure "$size" sluice "$rep" "$SLUICE_PORT" "$SLUICE_PID"
        if [ "$REPLAY" = 1 ]; then measure "$size" replay "$rep" "$SLUICE_PORT" "$SLUICE_PID"; fi
    done

    # size who idle_rss idle_anon peak_rss after_rss after_anon (kB)
    # shellcheck disable=SC2086
    for w in "sluice $SLUICE_PID $sluice_idle" "nginx $NGINX_WORKER $nginx_idle"; do
        set -- $w   # word splitting wanted
        echo "$size $1 $3 $4 $(status_kb "$2" VmHWM) $(status_kb "$2" VmRSS) $(status_kb "$2" RssAnon)" >>"$RSS"
    done
    stop_pid "$SLUICE_PID"
    [ "$STOP_RC" -eq 0 ] ||
        say "warning: sluice exited with status $STOP_RC on SIGTERM (see $TMP/sluice-$SIZE/stderr)"
    stop_all
done

say "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); $(nproc) cores; wrk -t1 -c$CONNECTIONS -d${DURATION}s; CPU from /proc/PID/stat (CLK_TCK $HZ)"
$HELPER table "$RUNS" "$RSS"
