#!/bin/sh
# The large burst-and-restart experiment (issue #6's benchmark): 10^4 jobs, 64 worker slots,
# a downstream accepting 200/s, through sluice and through the sleep-on-429 baseline.
# Target: drain within 10 % of the lower bound, zero duplicates, zero jobs past budget, no
# worker slot asleep after a 429/5xx. Prints the table; extra arguments go to experiment.py
# (for example --worker go --go-worker PATH, or --max-wait-ms 0).
set -eu
cd "$(dirname "$0")/../.."
sh scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc 2>/dev/null || echo 2)" --target sluice sluice-stub
exec /usr/bin/python3 tests/e2e/experiment.py --jobs 10000 --workers 64 --threads 8 \
    --rate 200 --max-ratio 1.1 --json "${JSON:-/tmp/sluice-experiment.json}" "$@"
