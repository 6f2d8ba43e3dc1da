#!/bin/sh
# The burst-and-restart experiment, fleet edition (issue #12's): 10^4 jobs, 64 worker slots in
# 8 processes spread over 4 sluices that share one redis-server, a downstream accepting 200/s,
# one sluice killed -9 during the 429 burst and restarted; beside it the same run with each
# sluice on its own RocksDB store (shared: local). Target (fleet): drain within 10 % of the
# lower bound, zero duplicates, zero jobs over their attempt budget; the per-pod run must show
# duplicates and calls over the partner's rate. Prints the table; extra arguments go to
# tests/e2e/fleet_experiment.py. Environment: BUILD_DIR (build), NO_BUILD=1 (use the binaries
# already in BUILD_DIR), JSON (where the results go, /tmp/sluice-fleet-experiment.json).
set -eu
cd "$(dirname "$0")/../.."
BUILD_DIR=${BUILD_DIR:-build}
if [ "${NO_BUILD:-0}" != 1 ]; then
    sh scripts/deps.sh
    cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
    cmake --build "$BUILD_DIR" -j "$(nproc 2>/dev/null || echo 2)" --target sluice sluice-stub
fi
command -v redis-server >/dev/null || { echo "fleet_experiment.sh: redis-server not found" >&2; exit 1; }
SLUICE_BIN=${SLUICE_BIN:-$BUILD_DIR/sluice} SLUICE_STUB=${SLUICE_STUB:-$BUILD_DIR/sluice-stub} \
    exec /usr/bin/python3 tests/e2e/fleet_experiment.py --jobs 10000 --workers 64 --threads 8 \
    --rate 200 --max-ratio 1.1 --check-local --json "${JSON:-/tmp/sluice-fleet-experiment.json}" "$@"
