#!/bin/sh
# Installs what sluice needs to build, test and benchmark on Debian 12.
# Idempotent: does nothing (and needs no network) when all is there.
set -eu
PKGS="build-essential cmake pkg-config libmicrohttpd-dev libevent-dev
librocksdb-dev libjansson-dev libyaml-dev libssl-dev libhttp-parser-dev libsystemd-dev
libhiredis-dev
libcriterion-dev openssl curl prometheus
redis-server python3 python3-redis python3-yaml golang-go systemd
clang libclang-rt-14-dev llvm-14"
# clang builds the fuzz targets (tests/fuzz); libFuzzer and the sanitizer
# runtimes are in libclang-rt-14-dev, which clang only recommends;
# llvm-14 brings llvm-symbolizer for readable stacks.

# The TypeScript worker example needs Node.js and npm; a machine that already
# has them (say from NodeSource) keeps its own.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    PKGS="$PKGS nodejs npm"
fi
[ "${1:-}" = "--bench" ] && PKGS="$PKGS wrk nginx-light"

missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" ||
        missing="$missing $p"
done
[ -z "$missing" ] && exit 0

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
echo "installing:$missing" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
# shellcheck disable=SC2086
$SUDO apt-get install -y -q --no-install-recommends $missing
