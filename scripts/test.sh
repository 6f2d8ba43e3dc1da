#!/bin/sh
# The test command: installs dependencies, builds sluice and runs the whole
# suite twice, once in a normal build and once under AddressSanitizer +
# UndefinedBehaviorSanitizer. Exits non-zero if anything fails.
set -eu
cd "$(dirname "$0")/.."
ROOT=$(pwd)
JOBS=$(nproc 2>/dev/null || echo 2)

sh scripts/deps.sh

run_suite() { # dir, extra cmake args...
    dir=$1; shift
    cmake -S "$ROOT" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
    cmake --build "$dir" -j "$JOBS"
    (cd "$dir" && ctest --output-on-failure -j "$JOBS" --timeout 600)
}

echo "== build and test =="
run_suite "$ROOT/build"
echo "== build and test under ASan + UBSan =="
# Reports from every process (tests, sluice, the stub) land in one folder:
# a child's report would otherwise vanish with its temp dir.
REPORTS="$ROOT/build-asan/sanitizer-reports"
rm -rf "$REPORTS" && mkdir -p "$REPORTS"
ASAN_OPTIONS="detect_leaks=1:log_path=$REPORTS/asan" \
UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$REPORTS/ubsan" \
    run_suite "$ROOT/build-asan" -DSLUICE_SANITIZE=ON
if [ -n "$(ls -A "$REPORTS")" ]; then
    echo "sanitizer reports:" >&2
    cat "$REPORTS"/* >&2
    exit 1
fi
echo "no sanitizer reports"
