#!/bin/sh
# The run command: installs what building and running need (no test tools),
# builds sluice and the stub, starts the demo upstream (the stub) on
# 127.0.0.1:9000 and sluice on the default sidecar.yaml (workers:
# 127.0.0.1:8080, admin: 127.0.0.1:9901), and once sluice is ready prints the
# tour (scripts/tour.sh). Ctrl-C stops both.
set -eu
cd "$(dirname "$0")/.."
ROOT=$(pwd)

sh scripts/deps.sh build
# No tests: Criterion is a test package. scripts/test.sh turns them back on.
cmake -S "$ROOT" -B "$ROOT/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSLUICE_TESTS=OFF >/dev/null
cmake --build "$ROOT/build" -j "$(nproc 2>/dev/null || echo 2)" --target sluice sluice-stub

"$ROOT/build/sluice" --check-config sidecar.yaml
"$ROOT/build/sluice-stub" --listen 127.0.0.1:9000 >/dev/null &
STUB=$!
SLUICE=""
# This shell has no job control, so its background processes ignore the
# terminal's Ctrl-C: pass it on to sluice (which drains, then exits) and stop
# the stub once sluice is gone.
trap '[ -n "$SLUICE" ] && kill -TERM "$SLUICE" 2>/dev/null; :' INT TERM
trap 'kill "$STUB" 2>/dev/null; wait "$STUB" 2>/dev/null || true' EXIT

"$ROOT/build/sluice" -c sidecar.yaml &
SLUICE=$!
i=0
until curl -fs -o /dev/null http://127.0.0.1:9901/readyz; do
    if ! kill -0 "$SLUICE" 2>/dev/null || [ "$i" -ge 100 ]; then
        echo "sluice did not become ready: its log is above" >&2
        exit 1
    fi
    sleep 0.1
    i=$((i + 1))
done

cat <<MSG

sluice is ready on 127.0.0.1:8080 (admin 127.0.0.1:9901), with the demo upstream on
127.0.0.1:9000 and the demo policy of sidecar.yaml: 2 requests/s, a burst of 2,
idempotency by Idempotency-Key. A tour, to run in another terminal (sluice's access
log of each request appears here):

MSG
sh scripts/tour.sh print
cat <<MSG

Ctrl-C stops sluice (it drains in-flight requests first) and the stub.

MSG
# wait returns early when Ctrl-C runs the trap; wait again until sluice has
# drained and exited.
while kill -0 "$SLUICE" 2>/dev/null; do
    wait "$SLUICE" || true
done
