# shellcheck shell=bash
# Shell helpers shared by store.sh and metrics.sh (sourced, not run). Same conventions as
# passthrough.sh: every process started is recorded in PIDS and stopped by its pid on exit;
# nothing is looked up by name. The sourcing script sets HERE, REPO, TMP_PREFIX and NAME.
# $PIN_SLUICE and $PIN_LOAD are left unquoted on purpose: empty, or "taskset -c N".
# shellcheck disable=SC2086

HELPER="python3 $HERE/smstat.py"
HZ=$(getconf CLK_TCK)
# PIN=1: sluice on CPU 1, the stub and wrk on CPU 0 (taskset), so that the scheduler does not
# move the three busy processes around two cores; the sluice CPU/req figures vary less.
PIN_SLUICE="" PIN_LOAD=""
if [ "${PIN:-0}" = 1 ]; then
    [ "$(nproc)" -ge 2 ] || { echo "PIN=1 needs 2 cores" >&2; exit 1; }
    PIN_SLUICE="taskset -c 1" PIN_LOAD="taskset -c 0"
fi

say() { printf '%s\n' "$*" >&2; }
die() { say "$NAME: $*"; exit 1; }

deps() {
    sh "$REPO/scripts/deps.sh" bench
    command -v wrk >/dev/null || die "wrk not found after scripts/deps.sh bench"
    command -v curl >/dev/null || die "curl not found"
}

build() {   # build DIR [extra cmake args...]: sluice and sluice-stub, RelWithDebInfo, no tests
    local dir=$1
    shift
    if [ "${NO_BUILD:-0}" = 1 ]; then
        if [ ! -x "$dir/sluice" ] || [ ! -x "$dir/sluice-stub" ]; then
            die "NO_BUILD=1 but no binaries in $dir"
        fi
        return 0
    fi
    say "building sluice and sluice-stub in $dir $*"
    cmake -S "$REPO" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSLUICE_TESTS=OFF "$@" >/dev/null
    cmake --build "$dir" -j"$(nproc)" --target sluice sluice-stub >"$dir/bench-build.log" 2>&1 ||
        die "build failed, see $dir/bench-build.log"
}

# ---- process bookkeeping -----------------------------------------------------
TMP=$(mktemp -d "${TMPDIR:-/tmp}/$TMP_PREFIX.XXXXXX")
PIDS=""

stop_pid() {   # stop_pid PID: SIGTERM, then SIGKILL after 10 s; exit status in STOP_RC
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

# ---- /proc readings ----------------------------------------------------------
cpu_ticks() {   # utime + stime of PID (all its threads), in clock ticks
    local s rest
    s=$(cat "/proc/$1/stat") || die "process $1 is gone"
    rest=${s##*) }
    # shellcheck disable=SC2086
    set -- $rest
    echo $(( ${12} + ${13} ))   # fields 14 and 15
}

status_kb() {   # status_kb PID FIELD -> value in kB (VmRSS, VmHWM)
    awk -v f="$2:" '$1 == f { print $2 }' "/proc/$1/status"
}

sys_ticks() {   # "busy total" jiffies of the machine (busy leaves out idle, iowait, irq, softirq)
    awk '$1 == "cpu" { print $2 + $3 + $4 + $9, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9 }' /proc/stat
}

children_ticks() {   # user + sys time of this shell's reaped children, from the `times` file $1
    awk -v hz="$HZ" 'NR == 2 {
        t = 0
        for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); t += a[1] * 60 + a[2] }
        printf "%d\n", t * hz + 0.5 }' "$1"
}

wait_http() {   # wait_http URL PID: until URL answers 200, at most 20 s
    local _
    for _ in $(seq 400); do
        kill -0 "$2" 2>/dev/null || die "process $2 exited while starting (see $TMP)"
        [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 "$1" || true)" = 200 ] &&
            return 0
        sleep 0.05
    done
    die "$1 did not answer 200 within 20 s"
}

# ---- servers -----------------------------------------------------------------
start_stub() {   # start_stub STUB_BINARY -> STUB_PID, STUB_PORT (body: 2 bytes)
    $PIN_LOAD "$1" --listen 127.0.0.1:0 --body-size 2 >"$TMP/stub.out" 2>"$TMP/stub.err" &
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

start_sluice() {   # start_sluice BINARY DIR ADMIN_PORT (config in DIR/sluice.yaml) -> SLUICE_PID
    $PIN_SLUICE "$1" -c "$2/sluice.yaml" >"$2/stdout" 2>"$2/stderr" &
    SLUICE_PID=$!
    PIDS="$PIDS $SLUICE_PID"
    wait_http "http://127.0.0.1:$3/readyz" "$SLUICE_PID"
}

stop_sluice() {   # stop_sluice PID DIR
    stop_pid "$1"
    [ "$STOP_RC" -eq 0 ] || say "warning: sluice exited with status $STOP_RC on SIGTERM (see $2/stderr)"
}

# schedstat's on-CPU time of PID's threads, in ns: finer than clock ticks over short runs.
cpu_ns() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{ t += $1 } END { printf "%.0f\n", t }'; }

free_ports() { python3 "$HERE/ratestat.py" ports "$1"; }   # free_ports N: N free loopback ports

# base_sluice BASE: the sluice binary BASE names, a build dir holding one or a git revision,
# built here from `git archive` into build-bench-base-<rev>/ (kept for the next run).
base_sluice() {
    local rev dir
    if [ -x "$1/sluice" ]; then
        echo "$1/sluice"
        return 0
    fi
    rev=$(git -C "$REPO" rev-parse --short "$1^{commit}") || die "BASE=$1: no build dir, no revision"
    dir=$REPO/build-bench-base-$rev
    if [ ! -x "$dir/sluice" ]; then
        say "building BASE $rev into $dir"
        mkdir -p "$dir/src"
        git -C "$REPO" archive "$rev" | tar -x -C "$dir/src"
        cmake -S "$dir/src" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
            -DSLUICE_TESTS=OFF -DSLUICE_REVISION="$rev" >/dev/null
        cmake --build "$dir" -j"$(nproc)" --target sluice >"$dir/bench-build.log" 2>&1 ||
            die "the BASE build failed, see $dir/bench-build.log"
    fi
    echo "$dir/sluice"
}

source_rev() {
    local rev
    if rev=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null); then
        [ -z "$(git -C "$REPO" --no-optional-locks status --porcelain --untracked-files=no 2>/dev/null)" ] ||
            rev="$rev + uncommitted changes"
    else
        rev="not a git checkout"
    fi
    echo "$rev"
}

# ---- one measured wrk run ------------------------------------------------------
# measure OUT_TSV LABEL REP PID CONNS SECONDS WRK_ARGS...: runs wrk -t1 -cCONNS -dSECONDS
# --latency WRK_ARGS (the URL, and a script with its arguments, are in WRK_ARGS), appends
# "label rep rps p50_us p99_us requests errors proc_ticks wrk_ticks busy total stub_ticks"
# (stub_ticks 0 when STUB_PID is unset) to OUT_TSV and prints a progress line.
measure() {
    local tsv=$1 label=$2 rep=$3 pid=$4 conns=$5 secs=$6 out p0 p1 s0=0 s1=0 m0 m1 w0 w1
    shift 6
    out=$TMP/wrk-$label-$rep.txt
    p0=$(cpu_ticks "$pid")
    [ -z "${STUB_PID:-}" ] || s0=$(cpu_ticks "$STUB_PID")
    m0=$(sys_ticks)
    times >"$TMP/times0"   # a builtin: no fork, so only wrk is reaped in between
    timeout $(( secs + 30 )) $PIN_LOAD wrk -t1 -c"$conns" -d"$secs"s --latency "$@" >"$out" 2>&1 ||
        die "wrk failed: $(cat "$out")"
    times >"$TMP/times1"
    m1=$(sys_ticks)
    p1=$(cpu_ticks "$pid")
    [ -z "${STUB_PID:-}" ] || s1=$(cpu_ticks "$STUB_PID")
    w0=$(children_ticks "$TMP/times0")
    w1=$(children_ticks "$TMP/times1")
    $HELPER record "$tsv" "$HZ" "$(nproc)" "$label" "$rep" "$out" $((p1 - p0)) $((w1 - w0)) \
        $(( ${m1% *} - ${m0% *} )) $(( ${m1#* } - ${m0#* } )) $((s1 - s0)) >&2
}
