#!/bin/sh
# Installs the Debian 12 packages prefetchd builds and tests with, when any is
# missing.  `make deps` runs it; `make run` and `make check` depend on it.
set -e
pkgs="build-essential pkg-config libuv1-dev libprotobuf-c-dev protobuf-c-compiler libcmocka-dev libinih-dev libsystemd-dev python3-numpy clang libclang-rt-14-dev systemd"
missing=""
for p in $pkgs; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "deps: installing$missing"
if [ "$(id -u)" != 0 ]; then
	echo "deps: missing packages:$missing; run 'make deps' as root (or install them with apt-get)" >&2
	exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends $missing
