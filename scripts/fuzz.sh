#!/bin/sh
# A long fuzz run of one libFuzzer target (tests/fuzz/README.md):
#   sh scripts/fuzz.sh TARGET [MINUTES [JOBS]]
# MINUTES defaults to 10, JOBS to 1 and is capped at nproc. Builds the
# targets with clang in build-fuzz/, starts from the seed corpus
# (tests/fuzz/corpus/TARGET, never written) and keeps what it finds in a
# scratch corpus, build-fuzz/corpus/TARGET, that the next run resumes from.
# A crashing input lands in build-fuzz/artifacts/ and the exit status is
# non-zero.
set -eu
cd "$(dirname "$0")/.."
ROOT=$(pwd)

if [ $# -lt 1 ] || [ ! -f "$ROOT/tests/fuzz/fuzz_$1.c" ]; then
    echo "usage: sh scripts/fuzz.sh TARGET [MINUTES [JOBS]]; targets:" \
        "$(cd "$ROOT/tests/fuzz" && ls fuzz_*.c | sed 's/^fuzz_//; s/\.c$//' | tr '\n' ' ')" >&2
    exit 2
fi
TARGET=$1
MINUTES=${2:-10}
JOBS=${3:-1}
CORES=$(nproc 2>/dev/null || echo 1)
[ "$JOBS" -gt "$CORES" ] && JOBS=$CORES

sh scripts/deps.sh test
cmake -S "$ROOT" -B "$ROOT/build-fuzz" -DCMAKE_C_COMPILER=clang \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSLUICE_FUZZ=ON -DSLUICE_TESTS=OFF >/dev/null
cmake --build "$ROOT/build-fuzz" -j "$JOBS" --target "fuzz_$TARGET"

SCRATCH="$ROOT/build-fuzz/corpus/$TARGET"
ART="$ROOT/build-fuzz/artifacts"
LOGS="$ROOT/build-fuzz/logs/$TARGET"
mkdir -p "$SCRATCH" "$ART" "$LOGS"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"

# New inputs go to the first corpus directory only. With JOBS > 1 each job
# runs the whole time and logs to $LOGS/fuzz-N.log (libFuzzer writes them in
# its working directory).
set -- "$SCRATCH" "$ROOT/tests/fuzz/corpus/$TARGET" \
    -max_total_time=$((MINUTES * 60)) -rss_limit_mb=2048 -timeout=10 \
    -artifact_prefix="$ART/$TARGET-" -print_final_stats=1
[ "$JOBS" -gt 1 ] && set -- "$@" -jobs="$JOBS" -workers="$JOBS"
cd "$LOGS"
exec "$ROOT/build-fuzz/tests/fuzz/fuzz_$TARGET" "$@"
