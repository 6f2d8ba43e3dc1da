#!/bin/sh
# Quota benchmark (tests/bench/README.md, "quota.sh"): a stub partner with a fixed-window quota,
# advertised in each header style; sluice at 10 x the quota with quota.follow, the same without it,
# and a hand-tuned exact rate: partner 429s, share of the quota used, p99 wait, and 429s after the
# partner halves its quota mid-run. About 3 x 3 x 18 s. Bounded: fixed windows, every process stopped
# by its pid.
# Environment: QUOTA (20), WINDOW (2 s), CLIENTS (64), WINDOWS_BEFORE (5), WINDOWS_AFTER (4),
#   DELAY_MS (0: the partner's answer time),
#   SIDECARS (1; N > 1: fleet mode, N sluices with shared: redis on one redis-server),
#   ARMS ("follow guess exact"),
#   STYLES ("draft old x"), BUILD_DIR (build-bench-lanes/), NO_BUILD=1.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BUILD_DIR=${BUILD_DIR:-$REPO/build-bench-lanes}
if [ "${NO_BUILD:-0}" != 1 ]; then
    echo "building sluice and sluice-stub in $BUILD_DIR" >&2
    cmake -S "$REPO" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSLUICE_TESTS=OFF >/dev/null
    cmake --build "$BUILD_DIR" -j2 --target sluice sluice-stub >/dev/null
fi
exec python3 "$HERE/quota.py" "$BUILD_DIR"
