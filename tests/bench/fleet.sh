#!/bin/bash
# Fleet benchmark (see tests/bench/README.md, "fleet.sh"): SIDECARS sluices on one
# redis-server, each driven by its own wrk with CLIENTS connections, all in front of one stub.
#  1. the fleet's rate: one shared: redis policy at RATE/s (max_wait 1h: requests wait, never
#     refused); the stub's arrival times give the achieved rate and the worst overshoot of
#     burst + rate * t for the fleet's arrivals; beside it the same policy with shared: local,
#     which each sidecar paces alone (the multiplied rate fleet mode removes);
#  2. the cost: a policy far above the load, shared: redis against shared: local, so the
#     difference is the Redis round trip per permit: latency (p50, p99), sluice CPU per
#     request, Redis CPU and commands per request;
#  3. the cost of a keyed request: the same policy with idempotency, every request a fresh
#     Idempotency-Key (leased, forwarded, completed in Redis), shared: redis (its lookup,
#     permit and lease one script) against shared: local (lookup, lease, completion), and
#     against one sidecar's own store: shared: local with store.backend: rocksdb (the
#     reference a Redis fleet's sluice CPU is held to).
# Environment: SIDECARS (4), CLIENTS (64 per sidecar), RATE (500), BURST (20), DURATION (10 s),
# PHASES ("1 2 3": which of the above to run), BUILD_DIR (build-bench-fleet/), NO_BUILD=1,
# KEEP=1 (keep the temp dir), TLS=1 (Redis TLS only, --port 0 --tls-port, with a CA made by
# openssl here; the sidecars connect with rediss:// and store.tls.ca_file), CLUSTER=N (a Redis
# Cluster of N primaries, 1 to 3, without replicas, the slots split evenly; sidecar i runs a
# policy whose hash tag lands on primary i mod N, so the load spreads as policies do; Redis CPU
# and commands are summed over the primaries and also given per primary), BASE (a second
# sluice to compare in the same run: a build dir holding one, or a git revision, built here
# from `git archive` into build-bench-base-<rev>/; each run then goes once per binary, "base"
# and "this"), REPS (1: rounds of each phase's runs, alternating the binaries), REDIS_CORE=1
# (redis-server on a core of its own, below).
set -euo pipefail

SIDECARS=${SIDECARS:-4}
CLIENTS=${CLIENTS:-64}
RATE=${RATE:-500}
BURST=${BURST:-20}
SECONDS_RUN=${DURATION:-10}
PHASES=${PHASES:-1 2 3}
phase() { case " $PHASES " in *" $1 "*) return 0 ;; esac; return 1; }

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BUILD_DIR=${BUILD_DIR:-$REPO/build-bench-fleet}
# shellcheck disable=SC2034  # NAME and TMP_PREFIX are read by benchlib.sh
NAME=fleet.sh TMP_PREFIX=sluice-fleet
# shellcheck source-path=SCRIPTDIR source=benchlib.sh
. "$HERE/benchlib.sh"

# REDIS_CORE=1: redis-server on the last core, the sidecars, wrk and the stub on the others
# (taskset), as Redis runs on a machine of its own in a fleet, so that its CPU per request is
# less what sharing a core with ten busy processes costs it. On the 2-core machine here it
# did not narrow the rounds' spread (tests/bench/README.md, the SET NX round).
PIN_REDIS=""
# shellcheck disable=SC2034  # PIN_SLUICE and PIN_LOAD are read by benchlib.sh
if [ "${REDIS_CORE:-0}" = 1 ]; then
    last=$(($(nproc) - 1))
    [ "$last" -ge 1 ] || die "REDIS_CORE=1 needs 2 cores"
    PIN_REDIS="taskset -c $last" PIN_SLUICE="taskset -c 0-$((last - 1))" PIN_LOAD=$PIN_SLUICE
fi

deps
command -v redis-server >/dev/null || die "redis-server not found"
build "$BUILD_DIR"
SLUICE=$BUILD_DIR/sluice
STUB=$BUILD_DIR/sluice-stub
REPS=${REPS:-1}
# The binaries each run goes with: "this" tree's, and BASE's first when given.
BINS=("this:$SLUICE")
if [ -n "${BASE:-}" ]; then
    base_bin=$(base_sluice "$BASE")
    BINS=("base:$base_bin" "${BINS[@]}")
fi

# ---- servers -------------------------------------------------------------------
REDIS_PORT=$(free_ports 1)
REDIS_LISTEN=(--port "$REDIS_PORT")
RCLI_TLS=()
SCHEME=redis
STORE_TLS=""
if [ "${TLS:-0}" = 1 ]; then
    (cd "$TMP" &&
        openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 \
            -subj /CN=bench-ca &&
        openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=redis &&
        printf 'subjectAltName=IP:127.0.0.1' >server.ext &&
        openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial \
            -out server.pem -days 2 -extfile server.ext) >"$TMP/openssl.log" 2>&1 ||
        die "openssl failed, see $TMP/openssl.log"
    REDIS_LISTEN=(--port 0 --tls-port "$REDIS_PORT" --tls-cert-file "$TMP/server.pem"
        --tls-key-file "$TMP/server.key" --tls-ca-cert-file "$TMP/ca.pem" --tls-auth-clients no)
    RCLI_TLS=(--tls --cacert "$TMP/ca.pem")
    SCHEME=rediss
    STORE_TLS=", tls: {ca_file: \"$TMP/ca.pem\"}"
fi
CLUSTER=${CLUSTER:-0}
REDIS_PIDS=()
REDIS_PORTS=()
if [ "$CLUSTER" -gt 0 ]; then
    [ "${TLS:-0}" = 1 ] && die "CLUSTER and TLS together are not scripted here"
    # Each node's cluster bus listens on its port + 10000: both bind-tested free.
    read -r -a BUS_SAFE <<<"$(python3 "$HERE/ratestat.py" bus-ports "$CLUSTER" | tr '\n' ' ')"
    for i in $(seq "$CLUSTER"); do
        p=${BUS_SAFE[$((i - 1))]}
        mkdir -p "$TMP/r$i"
        $PIN_REDIS redis-server --bind 127.0.0.1 --port "$p" --save '' --appendonly no --dir "$TMP/r$i" \
            --cluster-enabled yes --cluster-config-file nodes.conf >"$TMP/r$i/redis.log" 2>&1 &
        REDIS_PIDS+=($!)
        REDIS_PORTS+=("$p")
        PIDS="$PIDS $!"
    done
    REDIS_PORT=${REDIS_PORTS[0]}
else
    $PIN_REDIS redis-server --bind 127.0.0.1 "${REDIS_LISTEN[@]}" --save '' --appendonly no \
        --dir "$TMP" >"$TMP/redis.log" 2>&1 &
    REDIS_PIDS=($!)
    REDIS_PORTS=("$REDIS_PORT")
    PIDS="$PIDS $!"
fi
REDIS_PID=${REDIS_PIDS[0]}
rcli() { redis-cli "${RCLI_TLS[@]}" -p "$REDIS_PORT" "$@"; }
rcli_at() { local p=$1; shift; redis-cli "${RCLI_TLS[@]}" -p "$p" "$@"; }
for p in "${REDIS_PORTS[@]}"; do
    for _ in $(seq 100); do rcli_at "$p" ping >/dev/null 2>&1 && break; sleep 0.05; done
    rcli_at "$p" ping >/dev/null 2>&1 || die "redis-server on port $p did not start (taken?): run again"
done
POLICY=(p)
STORE_CLUSTER=""
if [ "$CLUSTER" -gt 0 ]; then
    for i in "${!REDIS_PORTS[@]}"; do
        rcli_at "${REDIS_PORTS[$i]}" CLUSTER ADDSLOTSRANGE $((16384 * i / CLUSTER)) \
            $((16384 * (i + 1) / CLUSTER - 1)) >/dev/null
        [ "$i" -gt 0 ] && rcli CLUSTER MEET 127.0.0.1 "${REDIS_PORTS[$i]}" >/dev/null
    done
    for _ in $(seq 200); do
        ok=1
        for p in "${REDIS_PORTS[@]}"; do
            rcli_at "$p" CLUSTER INFO | grep -q cluster_state:ok || ok=0
        done
        [ $ok = 1 ] && break
        sleep 0.1
    done
    [ $ok = 1 ] || die "the cluster did not become ok"
    # A policy name per primary: the first pN whose slot that primary owns.
    POLICY=()
    for i in "${!REDIS_PORTS[@]}"; do
        for n in $(seq 0 200); do
            s=$(rcli CLUSTER KEYSLOT "p$n" | tr -d '\r')
            if [ "$s" -ge $((16384 * i / CLUSTER)) ] && [ "$s" -lt $((16384 * (i + 1) / CLUSTER)) ]; then
                POLICY+=("p$n")
                break
            fi
        done
    done
    STORE_CLUSTER=", cluster: true"
    say "cluster of $CLUSTER primaries on ${REDIS_PORTS[*]}, policies ${POLICY[*]}"
fi

start_stub "$STUB"
stub() { curl -sf --max-time 10 -X "$1" "http://127.0.0.1:$STUB_PORT$2"; }

SL_PIDS=()
SL_PORTS=()
SL_ADMIN=()
STORE_REDIS="{backend: redis, url: \"$SCHEME://127.0.0.1:$REDIS_PORT/0\", fleet_size: $SIDECARS$STORE_TLS$STORE_CLUSTER}"
STORE=$STORE_REDIS   # or each sidecar's own RocksDB: "rocksdb" (start_fleet writes its path)
start_fleet() {   # start_fleet SHARED RATE BURST [POLICY_EXTRA]
    local i p a store
    SL_PIDS=()
    SL_PORTS=()
    SL_ADMIN=()
    for i in $(seq "$SIDECARS"); do
        local pol=${POLICY[$(((i - 1) % ${#POLICY[@]}))]}
        read -r p a <<<"$(free_ports 2 | tr '\n' ' ')"
        rm -rf "$TMP/s$i/data" # a RocksDB arm starts empty, as Redis's fresh keys do
        mkdir -p "$TMP/s$i"
        store=$STORE
        [ "$STORE" = rocksdb ] && store="{backend: rocksdb, path: \"$TMP/s$i/data\"}"
        cat >"$TMP/s$i/sluice.yaml" <<EOF
listen: 127.0.0.1:$p
admin: 127.0.0.1:$a
threads: 1
log: {level: warn, access: false}
store: $store
upstreams:
  stub: {url: "http://127.0.0.1:$STUB_PORT", max_connections: $CLIENTS}
policies:
  $pol: {rate: $2/s, burst: $3, max_wait: 1h, shared: $1${4:-}}
routes:
  - {prefix: /, upstream: stub, policy: $pol}
EOF
        start_sluice "$SLUICE" "$TMP/s$i" "$a"
        SL_PIDS+=("$SLUICE_PID")
        SL_PORTS+=("$p")
        SL_ADMIN+=("$a")
    done
}
stop_fleet() {
    local i
    for i in "${!SL_PIDS[@]}"; do stop_sluice "${SL_PIDS[$i]}" "$TMP/s$((i + 1))"; done
}

# run NAME RATE BURST [keyed]: wrk against every sidecar at once (keyed: a fresh
# Idempotency-Key per request); per-run files in $TMP/NAME
run() {
    local d=$TMP/$1 i before=() after=() rb ra cmds script=()
    mkdir -p "$d"
    stub POST /_stub/reset >/dev/null
    local rbs=() per=""
    for p in "${REDIS_PORTS[@]}"; do rcli_at "$p" CONFIG RESETSTAT >/dev/null; done
    for i in "${!SL_PIDS[@]}"; do before+=("$(cpu_ns "${SL_PIDS[$i]}")"); done
    for i in "${!REDIS_PIDS[@]}"; do rbs+=("$(cpu_ns "${REDIS_PIDS[$i]}")"); done
    local wrks=()
    for i in "${!SL_PORTS[@]}"; do
        [ "${4:-}" = keyed ] && script=(-s "$HERE/freshkey.lua")
        $PIN_LOAD wrk -t1 -c"$CLIENTS" -d"${SECONDS_RUN}s" --latency "${script[@]}" \
            "http://127.0.0.1:${SL_PORTS[$i]}/x" ${script[@]:+-- "$1-s$i"} \
            >"$d/wrk$i.txt" 2>&1 &
        wrks+=($!)
    done
    wait "${wrks[@]}" 2>/dev/null || true
    rb=0 ra=0
    for i in "${!REDIS_PIDS[@]}"; do
        local x
        x=$(cpu_ns "${REDIS_PIDS[$i]}")
        per="$per $(((x - ${rbs[$i]}) / 1000000))ms"
        rb=$((rb + ${rbs[$i]})) ra=$((ra + x))
    done
    for i in "${!SL_PIDS[@]}"; do after+=("$(cpu_ns "${SL_PIDS[$i]}")"); done
    stub GET /_stub/arrivals >"$d/arrivals.json"
    stub GET /_stub/stats >"$d/stats.json"
    # Round trips: the store calls the sidecars' requests waited for (each fresh fleet's
    # sluice_store_duration_seconds counts, summed); Redis's commands include what its
    # scripts run inside (a GET in a script counts as a GET), so that is Redis's work.
    local trips=0 a
    for a in "${SL_ADMIN[@]}"; do
        trips=$((trips + $(curl -sf --max-time 10 "http://127.0.0.1:$a/metrics" |
            awk '/^sluice_store_duration_seconds_count/ { s += $2 } END { print s + 0 }')))
    done
    # cmds: every command (EVALSHA itself too, as in earlier tables); inner: the ones that
    # do the work, what the scripts run and plain commands, without EVALSHA and CONFIG.
    # script_us: Redis's own time inside EVALSHA (commandstats' usec, the scripts' commands
    # included), the part of its CPU the scripts are; the rest is reading and writing sockets.
    # reads: the sockets' reads Redis made (INFO stats, reset with the rest): round trips per
    # read above 1 is pipelining, several calls of the sidecars' loops in one read; each read
    # and its reply's write cost Redis a few µs of its own, whatever they carry.
    cmds=0 inner=0 script_us=0 reads=0
    for p in "${REDIS_PORTS[@]}"; do
        reads=$((reads + $(rcli_at "$p" INFO stats | tr -d '\r' |
            awk -F: '/^total_reads_processed:/ { print $2 + 0 }')))
        rcli_at "$p" INFO commandstats | tr -d '\r' >"$d/commandstats.txt"
        cmds=$((cmds + $(awk -F'[:=,]' '/^cmdstat_/ { n += $3 } END { print n + 0 }' "$d/commandstats.txt")))
        inner=$((inner + $(awk -F'[:=,]' '/^cmdstat_/ && !/^cmdstat_(evalsha|eval|config)[:|]/ { n += $3 }
            END { print n + 0 }' "$d/commandstats.txt")))
        script_us=$((script_us + $(awk -F'[:=,]' '/^cmdstat_evalsha:/ { n += $5 } END { print n + 0 }' \
            "$d/commandstats.txt")))
    done
    [ "${#REDIS_PIDS[@]}" -gt 1 ] && echo "Redis CPU per primary:$per" >&2
    local sl_cpu=0
    for i in "${!SL_PIDS[@]}"; do sl_cpu=$((sl_cpu + ${after[$i]} - ${before[$i]})); done
    python3 "$HERE/fleetstat.py" "$d" "$SIDECARS" "$2" "$3" "$sl_cpu" "$((ra - rb))" "$trips" "$cmds" "$inner" "$script_us" "$reads"
}

if phase 1; then
    say "== 1. the fleet's rate: $SIDECARS sidecars x $CLIENTS clients, policy $RATE/s burst $BURST"
    start_fleet redis "$RATE" "$BURST"
    run rate-redis "$RATE" "$BURST" | sed 's/^/shared: redis  /'
    stop_fleet
    start_fleet local "$RATE" "$BURST"
    run rate-local "$RATE" "$BURST" | sed 's/^/shared: local  /'
    stop_fleet
fi

if phase 2; then
    say "== 2. the cost of a Redis permit: a policy far above the load"
    start_fleet redis 1000000 1000
    run cost-redis 1000000 1000 | sed 's/^/shared: redis  /'
    stop_fleet
    start_fleet local 1000000 1000
    run cost-local 1000000 1000 | sed 's/^/shared: local  /'
    stop_fleet
fi

if phase 3; then
    say "== 3. the cost of a keyed request: fresh Idempotency-Keys, records and leases in Redis"
    KEYED=", idempotency: {required: false}"
    for rep in $(seq "$REPS"); do
        for bin in "${BINS[@]}"; do
            # The run's name prefixes its keys: a name of its own per binary and round, so
            # no run meets another's records (Redis keeps them across runs).
            SLUICE=${bin#*:} tag="${bin%%:*} " sfx="-${bin%%:*}-$rep"
            [ "${#BINS[@]}" = 1 ] && tag=""
            STORE=$STORE_REDIS
            start_fleet redis 1000000 1000 "$KEYED"
            run "keyed-redis$sfx" 1000000 1000 keyed | sed "s/^/${tag}shared: redis   /"
            stop_fleet
            start_fleet local 1000000 1000 "$KEYED"
            run "keyed-local$sfx" 1000000 1000 keyed | sed "s/^/${tag}shared: local   /"
            stop_fleet
            STORE=rocksdb
            start_fleet local 1000000 1000 "$KEYED"
            run "keyed-rocksdb$sfx" 1000000 1000 keyed | sed "s/^/${tag}local+rocksdb  /"
            stop_fleet
        done
    done
fi
