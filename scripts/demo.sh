#!/bin/sh
# The run command: installs what building and running need (no test tools),
# builds sluice, starts the demo upstream (the test stub) on 127.0.0.1:9000 and
# sluice on the default sidecar.yaml (workers: 127.0.0.1:8080, admin:
# 127.0.0.1:9901). Ctrl-C stops both.
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
trap 'kill $STUB 2>/dev/null; wait $STUB 2>/dev/null || true' EXIT INT TERM

cat <<MSG

sluice is starting on 127.0.0.1:8080 with the demo upstream on 127.0.0.1:9000.
Try, in another terminal:

  curl -i -X POST http://127.0.0.1:8080/demo/hello -H 'Content-Type: text/plain' --data 'hi sluice'
  curl -s http://127.0.0.1:9901/config

Ctrl-C stops sluice (it drains in-flight requests first) and the stub.

MSG
"$ROOT/build/sluice" -c sidecar.yaml
