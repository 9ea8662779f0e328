#!/bin/sh
# `make install` into a DESTDIR gives a tree that works where it lies: its
# libprefetch.pc, read with `pkg-config --define-prefix` or under
# PKG_CONFIG_SYSROOT_DIR, builds a program (consumer.c) that links and runs
# against that tree's libprefetch.so.0 and gets a real answer from it; the
# units' Documentation= names pages and files the tree holds; `make
# uninstall` takes every file away again.  Reports as cmocka does, for
# tests/run.sh.
#   tests/install/test_install.sh REPO BUILD_DIR [MAKE VARIABLES...]
# The make variables (CUDA=0 or 1) keep the install's build the one that
# `make check` made.
repo=$1 build=$2
shift 2
make_vars="$*"
. "$repo/tests/install/lib.sh"
root=$t_tmp/root
prefix=/usr/local
pcdir=$root$prefix/lib/pkgconfig

# The make of the tree, without the parent make's jobserver (its
# descriptors are not this script's).
tree_make() {
	# shellcheck disable=SC2086 # one word a variable
	env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -C "$repo" --no-print-directory \
		DESTDIR="$root" PREFIX="$prefix" $make_vars "$@"
}

need_install() {
	[ -f "$pcdir/libprefetch.pc" ] || die "no install to test: the first case failed"
}

# $1: a tag; the rest: the compile flags pkg-config gave.  Builds
# consumer.c, runs it with the tree's library first on the search path,
# and checks that it ran on that library.
build_and_run() {
	tag=$1
	shift
	exe=$t_tmp/consumer-$tag
	${CC:-cc} -std=c11 -Wall -Wextra -Werror -o "$exe" "$repo/tests/install/consumer.c" "$@" ||
		die "consumer.c does not build with: $*"
	out=$(LD_LIBRARY_PATH=$root$prefix/lib "$exe" "$t_tmp/no-such-dir/prefetchd.sock" 2>&1) ||
		die "the consumer failed: $out"
	echo "$out"
	lib=$(echo "$out" | sed -n 's/^libprefetch: //p')
	case $lib in
	"$root$prefix"/lib/*) ;;
	*) die "the consumer ran on '$lib', not on the installed $root$prefix/lib/libprefetch.so.0" ;;
	esac
}

install_puts_each_piece_in_its_place() {
	out=$(tree_make install 2>&1) || die "make install failed: $out"
	for f in bin/prefetchd bin/prefetchctl; do
		[ -x "$root$prefix/$f" ] || die "not installed or not executable: $prefix/$f"
	done
	[ -L "$root$prefix/lib/libprefetch.so" ] &&
		[ "$(readlink "$root$prefix/lib/libprefetch.so")" = libprefetch.so.0 ] ||
		die "$prefix/lib/libprefetch.so is not a link to libprefetch.so.0"
	for f in lib/libprefetch.so.0 lib/libprefetch.a include/prefetch.h \
		lib/pkgconfig/libprefetch.pc lib/systemd/system/prefetchd.service \
		lib/systemd/system/prefetchd.socket share/man/man1/prefetchctl.1 \
		share/man/man5/prefetchd.conf.5 share/man/man8/prefetchd.8 \
		share/doc/prefetchd/README.md share/doc/prefetchd/docs/DESIGN.md \
		share/doc/prefetchd/docs/SHUFFLE.md share/doc/prefetchd/proto/PROTOCOL.md \
		share/doc/prefetchd/prefetchd.conf.example; do
		[ -f "$root$prefix/$f" ] || die "not installed: $prefix/$f"
	done
	# DESTDIR is where the tree is staged, never a path inside it.
	leak=$(grep -rl "$root" "$root" 2>/dev/null)
	[ -z "$leak" ] || die "installed files name the DESTDIR: $leak"
	exec_start=$(sed -n 's/^ExecStart=\([^ ]*\).*/\1/p' "$root$prefix/lib/systemd/system/prefetchd.service")
	[ "$exec_start" = "$prefix/bin/prefetchd" ] ||
		die "the unit starts '$exec_start', not the installed $prefix/bin/prefetchd"
}

pc_relocates_with_define_prefix() {
	need_install
	command -v pkg-config >/dev/null || die "pkg-config is not installed"
	grep -q '^libdir=${prefix}/lib$' "$pcdir/libprefetch.pc" &&
		grep -q '^includedir=${prefix}/include$' "$pcdir/libprefetch.pc" ||
		die "libprefetch.pc's libdir and includedir are not relative to \${prefix}:
$(cat "$pcdir/libprefetch.pc")"
	pc() { PKG_CONFIG_PATH=$pcdir pkg-config --define-prefix "$@" libprefetch; }
	libdir=$(pc --variable=libdir) || die "pkg-config --define-prefix cannot read libprefetch.pc"
	[ "$libdir" = "$root$prefix/lib" ] ||
		die "pkg-config --define-prefix gives libdir '$libdir', not $root$prefix/lib"
	flags=$(pc --cflags --libs) || die "pkg-config --define-prefix --cflags --libs failed"
	echo "pkg-config --define-prefix: $flags"
	case " $flags " in
	*" -I$root$prefix/include "*" -L$root$prefix/lib "*) ;;
	*) die "the flags do not name the tree's include and lib directories" ;;
	esac
	# shellcheck disable=SC2086 # pkg-config's words are meant to split
	build_and_run define-prefix $flags
}

pc_works_under_a_sysroot() {
	need_install
	command -v pkg-config >/dev/null || die "pkg-config is not installed"
	pc() { PKG_CONFIG_PATH=$pcdir PKG_CONFIG_SYSROOT_DIR=$root pkg-config "$@" libprefetch; }
	flags=$(pc --cflags --libs) || die "pkg-config under PKG_CONFIG_SYSROOT_DIR failed"
	echo "pkg-config, PKG_CONFIG_SYSROOT_DIR=\$DESTDIR: $flags"
	case " $flags " in
	*" -I$root$prefix/include "*" -L$root$prefix/lib "*) ;;
	*) die "the flags do not name the tree's include and lib directories" ;;
	esac
	# shellcheck disable=SC2086
	build_and_run sysroot $flags
}

units_name_documentation_that_is_installed() {
	need_install
	for unit in prefetchd.service prefetchd.socket; do
		docs=$(sed -n 's/^Documentation=//p' "$root$prefix/lib/systemd/system/$unit")
		[ -n "$docs" ] || die "$unit has no Documentation="
		for uri in $docs; do
			case $uri in
			man:*)
				name=${uri#man:}
				sec=${name#*\(}
				sec=${sec%\)}
				name=${name%%\(*}
				page=$root$prefix/share/man/man$sec/$name.$sec
				[ -f "$page" ] || die "$unit: $uri is not installed ($prefix/share/man/man$sec/$name.$sec)"
				if command -v man >/dev/null; then
					MANPATH=$root$prefix/share/man man -w "$sec" "$name" >/dev/null 2>&1 ||
						die "$unit: man cannot find $uri in the installed MANPATH"
				fi
				;;
			file://*)
				[ -f "$root${uri#file://}" ] || die "$unit: $uri is not installed"
				;;
			*) die "$unit: Documentation=$uri is neither a man page nor an installed file" ;;
			esac
			echo "$unit: $uri is installed"
		done
	done
}

uninstall_removes_every_file_install_put() {
	need_install
	out=$(tree_make uninstall 2>&1) || die "make uninstall failed: $out"
	left=$(find "$root" ! -type d)
	[ -z "$left" ] || die "make uninstall left:
$left"
	[ ! -e "$root$prefix/share/doc/prefetchd" ] ||
		die "make uninstall left the directory $prefix/share/doc/prefetchd"
}

echo "[==========] Running 5 test(s)."
t_case install_puts_each_piece_in_its_place
t_case pc_relocates_with_define_prefix
t_case pc_works_under_a_sysroot
t_case units_name_documentation_that_is_installed
t_case uninstall_removes_every_file_install_put
t_end
