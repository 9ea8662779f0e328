#!/bin/sh
# The man pages (man/, installed under MANDIR/man{1,5,8}) render with no
# warning from man-db and groff, and say what the code does: every
# [daemon] key of daemon/conf/config_int.h in prefetchd.conf(5), every option
# of `prefetchd --help` in prefetchd(8), every command and option of
# `prefetchctl --help` in prefetchctl(1), the build's version in each, and
# the example of prefetchd.conf(5) is a file the daemon reads.  Reports as
# cmocka does.  Needs man (Debian: man-db) and groff (groff-base).
#   tests/install/test_man.sh REPO BUILD_DIR [MAKE VARIABLES...]
repo=$1 build=$2
. "$repo/tests/install/lib.sh"
pages="$repo/man/prefetchd.8 $repo/man/prefetchd.conf.5 $repo/man/prefetchctl.1"
daemon=${PREFETCHD_BIN:-$build/prefetchd}
ctl=${PREFETCHCTL_BIN:-$build/prefetchctl}

# The roff of page $1 with its escaped hyphens plain, for greps.
plain() {
	sed 's/\\-/-/g' "$1"
}

man_pages_render_without_a_warning() {
	command -v man >/dev/null || die "man is not installed (Debian: man-db, groff-base)"
	for p in $pages; do
		[ -f "$p" ] || die "missing: $p"
		out=$(MANWIDTH=80 man -l --warnings "$p" 2>&1 >/dev/null)
		rc=$?
		[ "$rc" -eq 0 ] || die "man -l $p exited $rc: $out"
		[ -z "$out" ] || die "man -l --warnings $p:
$out"
		lines=$(MANWIDTH=80 man -l "$p" 2>/dev/null | wc -l)
		[ "$lines" -gt 40 ] || die "$p renders to $lines lines only"
		echo "$(basename "$p"): $lines lines, no warning"
	done
}

conf_page_describes_every_key() {
	page=$repo/man/prefetchd.conf.5
	# DAEMON_KEYS holds several X(K_NAME, name) a line: every one.
	keys=$(grep -o 'X([A-Z_]*, [a-z_]*)' "$repo/daemon/conf/config_int.h" | sed 's/X([A-Z_]*, \([a-z_]*\))/\1/')
	n=$(echo "$keys" | wc -w)
	[ "$n" -ge 30 ] || die "found only $n [daemon] keys in daemon/conf/config_int.h"
	for k in $keys format shards seq_len; do
		grep -Eq "^\.B[IR] \"$k = \"" "$page" || die "prefetchd.conf(5) does not describe $k"
	done
	grep -Eq '^\.BI field\. name " = "' "$page" || die "prefetchd.conf(5) does not describe field.NAME"
	echo "prefetchd.conf(5) describes all $n [daemon] keys and the dataset keys"
}

daemon_page_describes_every_option() {
	help=$("$daemon" --help) || die "prefetchd --help failed"
	opts=$(echo "$help" | grep -o -- '--[a-z-]*' | sort -u)
	[ -n "$opts" ] || die "no options in prefetchd --help"
	for o in $opts -h --help; do
		plain "$repo/man/prefetchd.8" | grep -Eq -- "^\.B.* $o( |\$)" ||
			die "prefetchd(8) does not describe $o"
	done
	echo "prefetchd(8) describes" $opts
}

ctl_page_describes_every_command_and_option() {
	help=$("$ctl" --help) || die "prefetchctl --help failed"
	page=$(plain "$repo/man/prefetchctl.1")
	cmds=$(echo "$help" | sed -n '/^Commands:/,/^$/p' | sed -n 's/^  \([a-z][a-z]*\) .*/\1/p')
	[ "$(echo "$cmds" | wc -w)" -ge 5 ] || die "no commands found in prefetchctl --help"
	for c in $cmds; do
		echo "$page" | grep -Eq "^\.B[R]? \"?$c\b" || die "prefetchctl(1) does not describe $c"
	done
	for o in $(echo "$help" | grep -o -- '--[a-z-]*' | sort -u); do
		echo "$page" | grep -q -- "$o" || die "prefetchctl(1) does not describe $o"
	done
	echo "prefetchctl(1) describes" $cmds
}

pages_carry_the_version_of_the_build() {
	version=$("$daemon" --version | sed -n 's/^prefetchd //p')
	[ -n "$version" ] || die "prefetchd --version says no version"
	for p in $pages; do
		grep -q "^\.TH .* \"prefetchd $version\"" "$p" ||
			die "$(basename "$p") is not marked prefetchd $version: $(grep '^\.TH' "$p")"
	done
	echo "all pages: prefetchd $version"
}

conf_page_example_is_a_file_the_daemon_reads() {
	# The example's group may not exist here: root's stands in for it.
	plain "$repo/man/prefetchd.conf.5" | sed -n '/^\.SH EXAMPLE/,/^\.SH/p' |
		sed -n '/^\.EX/,/^\.EE/p' | sed '1d;$d' |
		sed 's/^allow_groups = prefetch$/allow_groups = root/' >"$t_tmp/example.conf"
	[ -s "$t_tmp/example.conf" ] || die "prefetchd.conf(5) has no example"
	out=$("$daemon" --check -c "$t_tmp/example.conf" 2>"$t_tmp/err")
	echo "$out" | tail -n 1 | grep -Eq "^config $t_tmp/example.conf: (ok|has unusable datasets)$" ||
		die "the example of prefetchd.conf(5) is refused: $(cat "$t_tmp/err")"
	[ "$(echo "$out" | grep -c '^dataset ')" -eq 2 ] || die "the example does not declare 2 datasets"
	echo "$out"
}

echo "[==========] Running 6 test(s)."
t_case man_pages_render_without_a_warning
t_case conf_page_describes_every_key
t_case daemon_page_describes_every_option
t_case ctl_page_describes_every_command_and_option
t_case pages_carry_the_version_of_the_build
t_case conf_page_example_is_a_file_the_daemon_reads
t_end
