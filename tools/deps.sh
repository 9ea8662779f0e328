#!/bin/sh
# Installs the packages a make target needs, with apt-get, when any of them
# is missing.  The Makefile runs it first in each target that builds or
# tests, naming the groups that target needs:
#
#   build   compiling prefetchd, prefetchctl, libprefetch and the tools
#           (make run, make soak, make soak-tsan)
#   test    what make check adds: cmocka, numpy, systemd-analyze, man, and
#           python3's venv, pip and setuptools for the offline install test
#           (make check, make check-tsan)
#   clang   clang with its sanitizer and libFuzzer runtime (make check-asan,
#           make soak-asan, make fuzz-smoke, make fuzz-long)
#
#   tools/deps.sh GROUP...          install what is missing (as root)
#   tools/deps.sh --list GROUP...   print the packages it would want here, one
#                                   a line, and install nothing
#   OS_RELEASE=FILE                 read FILE instead of /etc/os-release (the
#                                   tests give it tests/os-release/*)
#
# DESIGN: the systems it knows are Debian 12, Ubuntu 22.04 and Ubuntu 24.04,
# and a system built on one of those Ubuntu releases that says so in
# os-release (ID_LIKE has ubuntu, UBUNTU_CODENAME is jammy or noble: Pop!_OS,
# Linux Mint), since it installs from that release's archive.  The release
# picks a column of the table below; the groups pick its rows.  Anything
# else (another system, another release, no os-release) gets the list of
# what each group needs in words, with Debian 12's package names, and exit
# status 1 before anything is installed: NO_DEPS=1 on the make command line
# then skips this script once the packages are in place by hand.
#
# Only missing packages are installed, in one apt-get install, which resolves
# every name before it unpacks anything: a name the archive lacks installs
# nothing at all rather than half a list.  As another user than root it only
# names what is missing.  --no-install-recommends keeps it to the table, so
# a package that a target needs and its Depends do not pull in (clang's
# runtime: on Debian 12 only a Recommends of libclang-common-14-dev names
# libclang-rt-14-dev) has its own row.
set -e

usage() {
	echo "usage: tools/deps.sh [--list] build|test|clang..." >&2
	exit 2
}

list=0
if [ "$1" = --list ]; then
	list=1
	shift
fi
[ $# -gt 0 ] || usage
for g in "$@"; do
	case $g in
	build | test | clang) ;;
	*)
		echo "deps: unknown group '$g'" >&2
		usage
		;;
	esac
done

# group|what it is, for someone installing it by hand|Debian 12|Ubuntu 22.04|Ubuntu 24.04
#
# How each name was checked: Debian 12's column with apt-cache policy/show and
# dpkg -L on Debian 12 itself (CI's system).  The Ubuntu columns differ only
# in clang's runtime:
#  - Debian moved clang's compiler-rt (ASan/UBSan runtimes, libFuzzer) out of
#    libclang-common-X-dev into a new libclang-rt-X-dev in llvm-toolchain-14
#    1:14.0.6-10~exp4 (Dec 2022; libclang-rt-14-dev's changelog on Debian 12
#    says so).  Ubuntu 22.04 released with 1:14.0.0-1ubuntu1, before that
#    split, so its clang-14 has the runtime in libclang-common-14-dev (a
#    Depends of clang-14) and there is no libclang-rt-14-dev.
#  - Ubuntu 24.04's default clang is 18 (clang 1:18.0-59~exp2 ->
#    clang-18 1:18.1.3-1ubuntu1), split like Debian's: libclang-rt-18-dev.
#    Its files stay under lib/clang/18/lib/linux/*-x86_64.*, the layout
#    tests/sanitize.mk's ASAN_RT asks clang for.
#  `clang` itself is the unversioned package on all three: it is what puts
#  /usr/bin/clang there (SAN_ASAN_CC and FUZZ_CC), and its version is the
#  release's default, which the runtime row must match.
# The other names are the same Debian sources on all three releases, each
# in Debian before Ubuntu 22.04 took its packages from it (libinih 53-1 in
# Feb 2021, cmocka 1.1.5, protobuf-c 1.3.x, libuv1 1.43.0-1 in Jan 2022, by
# their changelogs here); systemd-analyze is in Ubuntu 24.04's systemd
# package as in Debian's.  pkg-config is a transitional package for pkgconf
# on Debian 12 and Ubuntu 24.04 and pkg-config itself on 22.04: the name
# installs on all three.  gcc's TSan runtime (make check-tsan) comes with
# build-essential: gcc-N -> libgcc-N-dev -> libtsan0/libtsan2.
table() {
	cat <<'EOF'
build|a C compiler, make and libc headers|build-essential|build-essential|build-essential
build|pkg-config (the Makefile asks it for every library's flags)|pkg-config|pkg-config|pkg-config
build|libuv 1.x headers and library|libuv1-dev|libuv1-dev|libuv1-dev
build|protobuf-c headers and library|libprotobuf-c-dev|libprotobuf-c-dev|libprotobuf-c-dev
build|protoc-c, protobuf-c's code generator|protobuf-c-compiler|protobuf-c-compiler|protobuf-c-compiler
build|inih headers and library (pkg-config name inih)|libinih-dev|libinih-dev|libinih-dev
build|libsystemd headers and library|libsystemd-dev|libsystemd-dev|libsystemd-dev
build|liburing headers and library (read = direct's io_uring)|liburing-dev|liburing-dev|liburing-dev
build|numpy for python3 (the Python binding: the quick start's trainer)|python3-numpy|python3-numpy|python3-numpy
test|cmocka headers and library (the C tests)|libcmocka-dev|libcmocka-dev|libcmocka-dev
test|systemd-analyze (the systemd units test)|systemd|systemd|systemd
test|man (the man page test)|man-db|man-db|man-db
test|groff, which man renders with|groff-base|groff-base|groff-base
test|python3's venv module (the offline pip install test)|python3-venv|python3-venv|python3-venv
test|pip for python3 (the offline pip install test)|python3-pip|python3-pip|python3-pip
test|setuptools for python3 (the offline pip install test)|python3-setuptools|python3-setuptools|python3-setuptools
test|wheel for python3 (setuptools builds the offline install's wheel with it)|python3-wheel|python3-wheel|python3-wheel
clang|clang, as the command clang|clang|clang|clang
clang|clang's ASan, UBSan and libFuzzer runtime (compiler-rt)|libclang-rt-14-dev|libclang-common-14-dev|libclang-rt-18-dev
EOF
}

# One os-release(5) field, without its quotes; empty when absent.
osr=${OS_RELEASE:-/etc/os-release}
if [ -z "$OS_RELEASE" ] && [ ! -r /etc/os-release ]; then
	osr=/usr/lib/os-release
fi
field() {
	[ -r "$osr" ] || return 0
	sed -n "s/^$1=//p" "$osr" | tail -n 1 | sed -e 's/^"\(.*\)"$/\1/' -e "s/^'\(.*\)'$/\1/"
}

id=$(field ID)
version=$(field VERSION_ID)
like=$(field ID_LIKE)
name=$(field PRETTY_NAME)
column="" release="" note=""
case "$id $version" in
"debian 12") column=3 release="Debian 12" ;;
"ubuntu 22.04") column=4 release="Ubuntu 22.04" ;;
"ubuntu 24.04") column=5 release="Ubuntu 24.04" ;;
*)
	case " $like " in
	*" ubuntu "*)
		codename=$(field UBUNTU_CODENAME)
		case $codename in
		jammy) column=4 release="Ubuntu 22.04" ;;
		noble) column=5 release="Ubuntu 24.04" ;;
		esac
		[ -z "$column" ] ||
			note="deps: ${name:-$id} is built on $release (ID_LIKE=$like, UBUNTU_CODENAME=$codename): using its packages"
		;;
	esac
	;;
esac

if [ -z "$column" ]; then
	if [ -r "$osr" ]; then
		echo "deps: this is ${name:-an unnamed system} (ID=$id, VERSION_ID=$version${like:+, ID_LIKE=$like}, from $osr)," >&2
	else
		echo "deps: cannot read $osr to tell which system this is," >&2
	fi
	echo "deps: and tools/deps.sh knows the package names of Debian 12, Ubuntu 22.04 and Ubuntu 24.04 only" >&2
	echo "deps: (or of a system built on one of those Ubuntu releases: ID_LIKE=ubuntu, UBUNTU_CODENAME=jammy|noble)." >&2
	echo "deps: Nothing was installed.  Install by hand what \"$*\" needs (Debian 12's names in brackets):" >&2
	table | awk -F'|' -v groups=" $* " 'index(groups, " " $1 " ") { printf "deps:   %-5s  %s [%s]\n", $1, $2, $3 }' >&2
	echo "deps: then run make with NO_DEPS=1, which skips this step." >&2
	exit 1
fi

# The union of the groups' rows, in the table's order, each package once.
pkgs=$(table | awk -F'|' -v groups=" $* " -v col="$column" \
	'index(groups, " " $1 " ") && !seen[$col]++ { print $col }')

if [ "$list" = 1 ]; then
	[ -z "$note" ] || echo "$note" >&2
	echo "$pkgs"
	exit 0
fi

# $missing: the packages of $pkgs not installed here.
find_missing() {
	missing=""
	for p in $pkgs; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
			missing="$missing $p"
	done
}

find_missing
[ -n "$missing" ] || exit 0
[ -z "$note" ] || echo "$note" >&2
if [ "$(id -u)" != 0 ]; then
	echo "deps: missing $release packages for $*:$missing" >&2
	echo "deps: install them as root (apt-get install --no-install-recommends$missing)," >&2
	echo "deps: or run this make target as root" >&2
	exit 1
fi

# Two make targets at once on a fresh machine (make check beside a CI run,
# or in two terminals) would both install, and the second apt-get would fail
# on dpkg's lock ("Could not get lock /var/lib/dpkg/lock-frontend"): a run
# takes a lock of its own first, so the second waits for the first (and
# says so), then installs only what is still missing, usually nothing.  The
# lock is a file in /run, which only root may write (a file in /run/lock or
# /tmp anyone could make a link to /etc/shadow, or hold), opened without
# truncating it; DEPS_LOCK names another (the test's).  Where it cannot be
# opened, or flock is missing, the install goes on without it.  Another
# program's apt (unattended-upgrades, the daily apt timer) is waited for
# too: dpkg's lock by apt-get itself (DPkg::Lock::Timeout), the package
# lists' lock, which update does not wait for, by apt_update.
lock=${DEPS_LOCK:-/run/prefetchd-deps.lock}
if command -v flock >/dev/null 2>&1 && { command exec 9>>"$lock"; } 2>/dev/null; then
	if ! flock -n 9; then
		echo "deps: another tools/deps.sh is installing packages; waiting for it (up to 30 min, $lock)"
		if ! flock -w 1800 9; then
			echo "deps: the other tools/deps.sh still holds $lock after 30 min: giving up" >&2
			exit 1
		fi
	fi
	# Again under the lock: a run that finished since the first look
	# may have installed them.
	find_missing
	if [ -z "$missing" ]; then
		echo "deps: another run installed what $* needs"
		exit 0
	fi
else
	echo "deps: cannot lock $lock: installing without waiting for other runs" >&2
fi

# apt-get update, waiting up to 10 min while another program holds the
# package lists' lock (60 tries, DEPS_RETRY_S apart: 10 s, or the test's);
# any other failure is reported as apt-get said it.
apt_update() {
	tries=0
	while :; do
		if err=$(apt-get update -qq 2>&1 >/dev/null); then
			[ -z "$err" ] || printf '%s\n' "$err" >&2
			return 0
		fi
		case $err in
		*"Could not get lock"*) ;;
		*)
			printf '%s\n' "$err" >&2
			return 1
			;;
		esac
		tries=$((tries + 1))
		if [ "$tries" -ge 60 ]; then
			printf '%s\n' "$err" >&2
			return 1
		fi
		[ "$tries" != 1 ] ||
			echo "deps: another program holds apt's package lists; waiting for it (up to 10 min)"
		sleep "${DEPS_RETRY_S:-10}"
	done
}

echo "deps: installing$missing ($release, for $*)"
export DEBIAN_FRONTEND=noninteractive
apt_update
apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends $missing
