#!/bin/sh
# ctest entry of the end-to-end tests: builds one worker example (when it needs building) and runs
# a small burst-and-restart experiment with it. Usage: run.sh python|go|typescript BUILD_DIR
# SLUICE_BIN and SLUICE_STUB (set by ctest) name the binaries under test.
set -eu
kind=$1
build=$2
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out="$build/examples"
mkdir -p "$out"
small="--jobs 300 --workers 8 --rate 100 --max-ratio 3"

case "$kind" in
python)
    # Both arms, so the test log shows the comparison table.
    exec /usr/bin/python3 "$here/experiment.py" $small --worker python --arms sluice,baseline
    ;;
go)
    # Offline: redigo comes from Debian's golang-github-gomodule-redigo-dev, found in GOPATH
    # mode under /usr/share/gocode (module mode would want the module proxy).
    (cd "$root/deploy/examples/go" &&
        GOCACHE="$out/go-cache" GO111MODULE=off GOPATH=/usr/share/gocode GOFLAGS= \
            GOTOOLCHAIN=local CGO_ENABLED=0 \
            sh -c 'go vet ./... && go test ./... && go build -o "$1/go-worker" .' - "$out")
    exec /usr/bin/python3 "$here/experiment.py" $small --worker go --arms sluice \
        --go-worker "$out/go-worker"
    ;;
typescript)
    # Built outside the source tree: node_modules and dist stay out of the checkout.
    ts="$out/typescript"
    mkdir -p "$ts"
    cp -r "$root/deploy/examples/typescript/package.json" \
        "$root/deploy/examples/typescript/package-lock.json" \
        "$root/deploy/examples/typescript/tsconfig.json" \
        "$root/deploy/examples/typescript/src" "$ts/"
    (cd "$ts" && npm ci --no-audit --no-fund --loglevel=error && npx tsc -p .)
    exec /usr/bin/python3 "$here/experiment.py" $small --worker typescript --arms sluice \
        --ts-dir "$ts"
    ;;
*)
    echo "usage: run.sh python|go|typescript BUILD_DIR" >&2
    exit 2
    ;;
esac
