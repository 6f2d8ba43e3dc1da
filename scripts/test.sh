#!/bin/sh
# The test command: installs dependencies, builds sluice and runs the whole
# suite twice, once in a normal build and once under AddressSanitizer +
# UndefinedBehaviorSanitizer, then runs each libFuzzer target (tests/fuzz)
# briefly. Exits non-zero if anything fails.
set -eu
cd "$(dirname "$0")/.."
ROOT=$(pwd)
JOBS=$(nproc 2>/dev/null || echo 2)

sh scripts/deps.sh test

run_suite() { # dir, extra cmake args...
    dir=$1; shift
    # SLUICE_TESTS=ON explicitly: scripts/demo.sh configures build/ without
    # the tests (Criterion is not among its packages), and CMake remembers.
    cmake -S "$ROOT" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSLUICE_TESTS=ON "$@" >/dev/null
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

# Each fuzz target for SLUICE_FUZZ_SECONDS (default 20) from a copy of its seed
# corpus, so the repository's corpus never changes. A crash, a leak, a slow
# input or a failed invariant fails the command; the input stays in
# build-fuzz/artifacts/ (reproduce: build-fuzz/tests/fuzz/fuzz_NAME FILE).
FUZZ_SECONDS=${SLUICE_FUZZ_SECONDS:-20}
echo "== fuzz targets (clang + libFuzzer), ${FUZZ_SECONDS}s each =="
cmake -S "$ROOT" -B "$ROOT/build-fuzz" -DCMAKE_C_COMPILER=clang \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSLUICE_FUZZ=ON -DSLUICE_TESTS=OFF >/dev/null
cmake --build "$ROOT/build-fuzz" -j "$JOBS"
ART="$ROOT/build-fuzz/artifacts"
mkdir -p "$ART"
FUZZ_TMP=$(mktemp -d)
trap 'rm -rf "$FUZZ_TMP"' EXIT
for src in "$ROOT"/tests/fuzz/fuzz_*.c; do
    t=$(basename "$src" .c)
    t=${t#fuzz_}
    cp -R "$ROOT/tests/fuzz/corpus/$t" "$FUZZ_TMP/$t"
    if ! UBSAN_OPTIONS=print_stacktrace=1 "$ROOT/build-fuzz/tests/fuzz/fuzz_$t" \
        "$FUZZ_TMP/$t" -max_total_time="$FUZZ_SECONDS" -rss_limit_mb=2048 \
        -timeout=10 -artifact_prefix="$ART/$t-" >"$FUZZ_TMP/$t.log" 2>&1; then
        tail -n 60 "$FUZZ_TMP/$t.log" >&2
        echo "fuzz_$t failed; its input is in $ART/" >&2
        exit 1
    fi
    echo "fuzz_$t: $(grep '^Done' "$FUZZ_TMP/$t.log")"
done
echo "fuzz: $(ls "$ROOT"/tests/fuzz/fuzz_*.c | wc -l) passed, 0 failed"
