#!/bin/sh
# Lanes benchmark (tests/bench/README.md, "lanes.sh"): a policy with lanes against the same policy
# without, in one run: 128 batch clients saturating 50/s, 8 interactive clients joining (1 request a
# second each, then back to back): the interactive wait (p50, p99), its share of the permits, the
# overshoot of the bound at the stub, sluice's CPU per permit. About 50 s. Bounded: every phase has a
# fixed length, every process started is stopped by its pid.
# Environment: RATE (50), BATCH (128), INTER (8), PHASE_SECONDS (10), WARM_SECONDS (4),
#   BUILD_DIR (build-bench-lanes/), NO_BUILD=1 to use the binaries already in BUILD_DIR.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BUILD_DIR=${BUILD_DIR:-$REPO/build-bench-lanes}
if [ "${NO_BUILD:-0}" != 1 ]; then
    echo "building sluice and sluice-stub in $BUILD_DIR" >&2
    cmake -S "$REPO" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSLUICE_TESTS=OFF >/dev/null
    cmake --build "$BUILD_DIR" -j2 --target sluice sluice-stub >/dev/null
fi
exec python3 "$HERE/lanes.py" "$BUILD_DIR"
