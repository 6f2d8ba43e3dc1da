#!/bin/sh
# Every header's include guard names its own path (ctest source_guards):
# config/units.h is guarded by SLUICE_CONFIG_UNITS_H. A header moved to
# another folder keeps working with its old guard, so nothing else would
# notice a stale one until two headers share a name.
#
#   sh tests/tools/check_guards.sh REPO_ROOT
set -eu
cd "${1:-$(dirname "$0")/../..}"
bad=0 n=0
for f in $(find config obs policies proxy store util tests -name '*.h' | sort); do
    n=$((n + 1))
    want=SLUICE_$(printf '%s' "$f" | tr 'a-z/.' 'A-Z__')
    got=$(sed -n 's/^#ifndef \([A-Z0-9_]*\)$/\1/p' "$f" | head -n 1)
    if [ "$got" != "$want" ]; then
        echo "$f: include guard ${got:-(none)}, expected $want"
        bad=$((bad + 1))
    fi
done
[ "$n" -gt 20 ] || { echo "found only $n headers: run from the repository root"; exit 1; }
echo "include guards: $n headers, $bad wrong"
[ "$bad" -eq 0 ]
