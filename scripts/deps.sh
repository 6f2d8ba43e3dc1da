#!/bin/sh
# Installs with apt-get, on Debian 12, what one of the README's commands needs:
#
#   sh scripts/deps.sh build   compile sluice and the demo upstream, run the demo
#                              (scripts/demo.sh)
#   sh scripts/deps.sh test    build + what the test suite and the fuzz targets run
#                              (scripts/test.sh, scripts/fuzz.sh); the default
#   sh scripts/deps.sh bench   test + wrk and nginx (tests/bench); --bench also works
#
# Idempotent: when every package is there it does nothing and needs no network.
set -eu

# Only libraries and tools the compiler and the demo use: a machine that just
# wants to run sluice gets no database, no monitoring server and no other
# language toolchain. curl: the demo waits for /readyz with it, and its tour is
# curl commands. tests/deploy/check_deploy.py reads this line: the -dev
# packages here are what deploy/Dockerfile's build stage must install.
BUILD_PKGS="build-essential cmake pkg-config libmicrohttpd-dev libevent-dev
librocksdb-dev libjansson-dev libyaml-dev libssl-dev libhttp-parser-dev
libsystemd-dev libhiredis-dev curl"

# Criterion runs the unit and integration tests; openssl makes their
# certificates; promtool (only in Debian's prometheus package) checks the metrics
# output and the alert rules; redis-server (and redis-sentinel, its own package
# on Debian 12, for the failover test), Python, Go and Node.js run the
# burst-and-restart experiment with each worker example (the Go one
# on Debian's redigo, built offline in GOPATH mode); systemd brings
# systemd-analyze for the unit file check. clang builds the fuzz targets:
# libFuzzer and the sanitizer runtimes are in libclang-rt-14-dev, which clang
# only recommends; llvm-14 brings llvm-symbolizer for readable stacks.
TEST_PKGS="libcriterion-dev openssl prometheus redis-server redis-sentinel python3 python3-redis
python3-yaml golang-go golang-github-gomodule-redigo-dev systemd clang libclang-rt-14-dev llvm-14"

# tests/bench drives load with wrk and compares with nginx.
BENCH_PKGS="wrk nginx-light"

# Services that Debian starts when it installs their package, and that no
# command of ours uses: the tests start redis-server and redis-sentinel as their
# own processes, on their own ports (promtool is all they take from prometheus,
# whose server would listen on every interface).
UNWANTED_SERVICES="redis-server redis-sentinel prometheus"

# No argument means test: what callers written before the split got.
case "${1:-test}" in
    build) PKGS=$BUILD_PKGS ;;
    test) PKGS="$BUILD_PKGS $TEST_PKGS" ;;
    bench | --bench) PKGS="$BUILD_PKGS $TEST_PKGS $BENCH_PKGS" ;;
    *) echo "usage: sh scripts/deps.sh [build | test | bench]" >&2; exit 2 ;;
esac
# The TypeScript worker example (a test) needs Node.js and npm; a machine that
# already has them (say from NodeSource) keeps its own.
if [ "${1:-test}" != build ] &&
    { ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; }; then
    PKGS="$PKGS nodejs npm"
fi

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

# Debian has just started (and enabled) the services of the packages above, if
# an init system runs. Stop and disable those this run installed, and only
# those: a service the machine had before is its owner's business.
for s in $UNWANTED_SERVICES; do
    case " $missing " in *" $s "*) ;; *) continue ;; esac
    if [ -d /run/systemd/system ]; then
        $SUDO systemctl disable --now "$s" >/dev/null 2>&1 || continue
        back="systemctl enable --now $s"
    elif [ -x "/etc/init.d/$s" ]; then
        # No systemd (a container, say): invoke-rc.d may still have started it.
        $SUDO "/etc/init.d/$s" stop >/dev/null 2>&1 || true
        $SUDO update-rc.d "$s" disable >/dev/null 2>&1 || true
        back="update-rc.d $s enable && service $s start"
    else
        continue
    fi
    echo "stopped and disabled the $s service Debian started on install;" \
        "the tests start their own processes (to bring it back: $back)" >&2
done
