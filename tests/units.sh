#!/bin/sh
# The systemd units as `make install` writes them pass `systemd-analyze
# verify` (which runs man(1) on the pages their Documentation= names: it
# needs man-db), and the service's `systemd-analyze security` exposure
# stays at most 1.0 (0.7 when written; README records it).  Reports as
# cmocka does, for tests/run.sh.  Without systemd-analyze both cases skip
# and say why.
#   tests/units.sh REPO BUILD_DIR
repo=$1 build=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# As `make install` writes them (tests/install/test_install.sh checks the
# installed ones), with the daemon and documents of this tree.
sed -e "s|@BINDIR@|$build|g" -e "s|@DOCDIR@|$repo|g" "$repo/systemd/prefetchd.service" \
	>"$dir/prefetchd.service"
cp "$repo/systemd/prefetchd.socket" "$dir/"
# verify runs man(1) for each man: in Documentation=: the tree's pages,
# laid out as make install lays them out.
for page in "$repo"/man/*.[158]; do
	mkdir -p "$dir/man/man${page##*.}" && cp "$page" "$dir/man/man${page##*.}/"
done
export MANPATH="$dir/man"
bad="" skipped=""

start() { echo "[ RUN      ] $1"; }
ok() { echo "[       OK ] $1"; }
fail() { echo "$2"; echo "[  FAILED  ] $1"; bad="$bad $1"; }
skip() { echo "$2"; echo "[  SKIPPED ] $1"; skipped="$skipped $1"; }

echo "[==========] Running 2 test(s)."
for t in units_pass_systemd_analyze_verify service_exposure_is_at_most_1_0; do
	start "$t"
	if ! command -v systemd-analyze >/dev/null 2>&1; then
		skip "$t" "skipped: systemd-analyze is not installed"
		continue
	fi
	case $t in
	units_pass_systemd_analyze_verify)
		if ! command -v man >/dev/null 2>&1; then
			fail "$t" "man is not installed (Debian: man-db): verify checks Documentation=man:"
			continue
		fi
		if out=$(systemd-analyze verify "$dir/prefetchd.service" "$dir/prefetchd.socket" 2>&1) &&
			[ -z "$out" ]; then
			ok "$t"
		else
			fail "$t" "systemd-analyze verify: $out"
		fi
		;;
	service_exposure_is_at_most_1_0)
		line=$(systemd-analyze security --offline=true "$dir/prefetchd.service" 2>&1 |
			grep 'Overall exposure level')
		score=$(echo "$line" | sed -n 's/.*prefetchd.service: \([0-9.]*\).*/\1/p')
		echo "$line"
		if [ -n "$score" ] && awk "BEGIN { exit !($score <= 1.0) }"; then
			ok "$t"
		else
			fail "$t" "exposure '$score' is above 1.0 (or could not be read)"
		fi
		;;
	esac
done
n_bad=$(echo $bad | wc -w)
n_skip=$(echo $skipped | wc -w)
echo "[==========] 2 test(s) run."
echo "[  PASSED  ] $((2 - n_bad - n_skip)) test(s)."
for t in $skipped; do echo "[  SKIPPED ] $t"; done
for t in $bad; do echo "[  FAILED  ] $t"; done
[ -z "$bad" ]
