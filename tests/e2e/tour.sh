#!/bin/sh
# The demo's tour, tested (ctest e2e_tour): the README shows the tour that
# scripts/demo.sh prints, and every command of it, run against the real sluice
# on the repository's sidecar.yaml and the real stub, gets the answer the tour
# says (scripts/tour.sh check).
#
# sluice and the stub listen on free loopback ports: the config is a copy of
# sidecar.yaml with its three addresses changed and nothing else, and sluice
# runs in a temp dir so that its store (./data) is fresh. Both are stopped by
# their pid; sluice must drain and exit 0 on SIGTERM.
#
#   sh tests/e2e/tour.sh     (SLUICE_BIN, SLUICE_STUB: the binaries; default build/)
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SLUICE=${SLUICE_BIN:-$ROOT/build/sluice}
STUB=${SLUICE_STUB:-$ROOT/build/sluice-stub}
TMP=$(mktemp -d)
SLUICE_PID="" STUB_PID=""

stop() { # PID: SIGTERM, then up to 15 s to exit; its exit status in STOPPED
    # (not printed: wait must run in this shell, the process's parent)
    kill -TERM "$1" 2>/dev/null || true
    i=0
    while kill -0 "$1" 2>/dev/null && [ "$i" -lt 150 ]; do
        sleep 0.1
        i=$((i + 1))
    done
    kill -KILL "$1" 2>/dev/null || true
    STOPPED=0
    wait "$1" || STOPPED=$?
}
cleanup() {
    [ -n "$SLUICE_PID" ] && stop "$SLUICE_PID"
    [ -n "$STUB_PID" ] && stop "$STUB_PID"
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
die() {
    echo "FAIL  $*" >&2
    if [ -s "$TMP/sluice.log" ]; then
        echo "      --- sluice's log (last 20 lines):" >&2
        tail -n 20 "$TMP/sluice.log" | sed 's/^/      /' >&2
    fi
    exit 1
}

# ---- the README holds the tour the demo prints ------------------------------
# Between the lines '<!-- tour: begin -->' and '<!-- tour: end -->', inside a
# fenced block.
sh "$ROOT/scripts/tour.sh" print >"$TMP/tour.printed"
awk '/^<!-- tour: end -->/ { f = 0 } f { print } /^<!-- tour: begin -->/ { f = 1 }' \
    "$ROOT/README.md" | sed '1{/^```/d}; ${/^```$/d}' >"$TMP/tour.readme"
[ -s "$TMP/tour.readme" ] || die "README.md has no tour between <!-- tour: begin --> and <!-- tour: end -->"
if ! diff -u "$TMP/tour.readme" "$TMP/tour.printed" >"$TMP/tour.diff"; then
    cat "$TMP/tour.diff" >&2
    die "the README's tour differs from 'sh scripts/tour.sh print' (above: - README, + printed)"
fi
echo "ok    README.md shows the tour scripts/demo.sh prints"

# ---- the stub, on a port the kernel chooses -----------------------------------
"$STUB" --listen 127.0.0.1:0 >"$TMP/stub.out" 2>"$TMP/stub.err" &
STUB_PID=$!
i=0
until grep -q '^listening ' "$TMP/stub.out"; do
    i=$((i + 1))
    if [ "$i" -gt 100 ] || ! kill -0 "$STUB_PID" 2>/dev/null; then
        die "the stub did not start: $(cat "$TMP/stub.err")"
    fi
    sleep 0.05
done
SPORT=$(sed -n 's/^listening 127\.0\.0\.1:\([0-9]*\)$/\1/p' "$TMP/stub.out")

# ---- sluice on the demo config, on free ports ---------------------------------
# sluice takes its ports from the config, so pick two at random and try again
# when one is taken (sluice then exits at once).
random_port() { echo $((20000 + $(od -An -N2 -tu2 /dev/urandom | tr -d ' ') % 40000)); }
tries=0
while :; do
    tries=$((tries + 1))
    [ "$tries" -le 5 ] || die "sluice did not start in 5 tries"
    WPORT=$(random_port) APORT=$(random_port)
    [ "$WPORT" != "$APORT" ] || continue
    sed -e "s/^listen: 127\.0\.0\.1:8080 /listen: 127.0.0.1:$WPORT /" \
        -e "s/^admin: 127\.0\.0\.1:9901 /admin: 127.0.0.1:$APORT /" \
        -e "s|url: http://127\.0\.0\.1:9000 |url: http://127.0.0.1:$SPORT |" \
        "$ROOT/sidecar.yaml" >"$TMP/sidecar.yaml"
    # The copy is sidecar.yaml itself but for those three lines.
    changed=$(diff "$ROOT/sidecar.yaml" "$TMP/sidecar.yaml" | grep -c '^>' || true)
    [ "$changed" -eq 3 ] || die "expected 3 addresses to change in the copy of sidecar.yaml, $changed did"
    "$SLUICE" --check-config "$TMP/sidecar.yaml" >/dev/null || die "the copy of sidecar.yaml is invalid"
    (cd "$TMP" && exec "$SLUICE" -c sidecar.yaml) 2>"$TMP/sluice.log" &
    SLUICE_PID=$!
    i=0
    while [ "$i" -lt 100 ]; do
        curl -fs -o /dev/null "http://127.0.0.1:$APORT/readyz" && break 2
        kill -0 "$SLUICE_PID" 2>/dev/null || break
        sleep 0.1
        i=$((i + 1))
    done
    stop "$SLUICE_PID"
    SLUICE_PID=""
    echo "sluice on ports $WPORT/$APORT did not become ready (exit $STOPPED); trying others" >&2
done
echo "ok    sluice ready on 127.0.0.1:$WPORT (admin $APORT), the stub on $SPORT"

# ---- every step of the tour ----------------------------------------------------
sh "$ROOT/scripts/tour.sh" check "$WPORT" "$APORT" "$SPORT" || die "the tour failed (above)"

stop "$SLUICE_PID"
SLUICE_PID=""
[ "$STOPPED" -eq 0 ] || die "sluice exited $STOPPED on SIGTERM, expected 0 (drained)"
echo "ok    sluice drained and exited 0 on SIGTERM"
