#!/bin/sh
# tools/deps.sh picks exactly the packages of its table for each system it
# knows, and refuses the others before anything runs; it calls apt-get only
# for what is missing, and only as root.  Reports as cmocka does, for
# tests/run.sh.  Nothing is installed: OS_RELEASE points the script at the
# os-release files in tests/os-release/, and dpkg-query, id and apt-get are
# stand-ins on PATH that answer from a list and write down how they were
# called.  README's Set-up section, which lists the packages, must name each.
#   tests/deps.sh REPO
#
# The os-release files are those systems' own:
#   debian-12     /usr/lib/os-release of Debian 12 (base-files 12.4+deb12u11)
#   ubuntu-22.04  Ubuntu 22.04.4 LTS's, ubuntu-24.04 Ubuntu 24.04.1 LTS's
#   pop-22.04     Pop!_OS 22.04 LTS's (ID=pop, ID_LIKE="ubuntu debian",
#                 UBUNTU_CODENAME=jammy)
#   debian-11     Debian 11's: a system deps.sh knows, a release it does not
#   fedora-40     the Fedora 40 container image's: a system it does not know
# the Ubuntu, Pop!_OS, Debian 11 and Fedora ones as each appears, the same,
# in several public copies of `cat /etc/os-release` on those releases.
repo=$1
deps=$repo/tools/deps.sh
fixtures=$repo/tests/os-release
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
bad=""

# The lists the table must give, group by group.  Only clang's runtime
# differs between the three releases (tools/deps.sh says why).
build="build-essential pkg-config libuv1-dev libprotobuf-c-dev protobuf-c-compiler libinih-dev libsystemd-dev liburing-dev python3-numpy"
test="libcmocka-dev systemd man-db groff-base python3-venv python3-pip python3-setuptools python3-wheel"
clang_debian_12="clang libclang-rt-14-dev"
clang_ubuntu_22_04="clang libclang-common-14-dev"
clang_ubuntu_24_04="clang libclang-rt-18-dev"

mkdir "$dir/bin"
# dpkg-query -W -f='${Status}' NAME, as dpkg-query answers for a package
# that the archive has: installed when NAME is a line of $dir/installed.
cat >"$dir/bin/dpkg-query" <<'EOF'
#!/bin/sh
echo "dpkg-query $*" >>"$FAKE_LOG"
for p; do :; done
if grep -qx "$p" "$FAKE_INSTALLED"; then printf 'install ok installed'; else printf 'unknown ok not-installed'; fi
EOF
# apt-get logs how it was called.  With FAKE_APT_SLOW set, an install
# waits (20 s at most) until $dir/go exists, then is installed: the test of
# two runs at once says when.  With FAKE_LISTS_LOCKED=N, the first N
# updates fail as apt-get does while another program holds the lists.
cat >"$dir/bin/apt-get" <<'EOF'
#!/bin/sh
echo "apt-get $*" >>"$FAKE_LOG"
case " $* " in
*" update "*)
	n=$(grep -c "^apt-get update" "$FAKE_LOG")
	if [ "$n" -le "${FAKE_LISTS_LOCKED:-0}" ]; then
		echo "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 1 (apt-get)" >&2
		exit 100
	fi
	exit 0
	;;
*" install "*) ;;
*) exit 0 ;;
esac
[ -n "$FAKE_APT_SLOW" ] || exit 0
waited=0
while [ ! -e "$FAKE_GO" ] && [ $waited -lt 400 ]; do
	sleep 0.05
	waited=$((waited + 1))
done
seen=0
for a; do
	[ $seen = 1 ] && echo "$a" >>"$FAKE_INSTALLED"
	[ "$a" = --no-install-recommends ] && seen=1
done
exit 0
EOF
cat >"$dir/bin/id" <<'EOF'
#!/bin/sh
echo "$FAKE_UID"
EOF
chmod +x "$dir/bin/"*

# deps FIXTURE UID ARG...: tools/deps.sh on that os-release as that user,
# into $rc, $dir/out, $dir/err and $dir/log (what the stand-ins ran).
deps() {
	fixture=$1 uid=$2
	shift 2
	: >"$dir/log"
	OS_RELEASE=$fixtures/$fixture PATH="$dir/bin:$PATH" FAKE_LOG=$dir/log \
		FAKE_INSTALLED=$dir/installed FAKE_UID=$uid DEPS_LOCK=$dir/lock \
		sh "$deps" "$@" >"$dir/out" 2>"$dir/err"
	rc=$?
}

say_run() {
	echo "deps.sh $* -> status $rc"
	sed 's/^/  stdout: /' "$dir/out"
	sed 's/^/  stderr: /' "$dir/err"
	sed 's/^/  ran: /' "$dir/log"
}

# lists FIXTURE GROUPS WANT: --list GROUPS prints WANT, one a line, and
# runs nothing.
lists() {
	deps "$1" 0 --list $2
	got=$(tr '\n' ' ' <"$dir/out" | sed 's/ $//')
	if [ "$rc" -ne 0 ] || [ "$got" != "$3" ] || [ -s "$dir/log" ]; then
		say_run "--list $2 on $1"
		echo "  want: $3"
		return 1
	fi
}

# quiet: the last call said nothing on stderr.
quiet() {
	[ ! -s "$dir/err" ] && return 0
	sed 's/^/  unexpected stderr: /' "$dir/err"
	return 1
}

# refused FIXTURE NAME: every way of calling deps.sh there fails at once,
# runs nothing, says what the system is and what to install, by capability
# and with Debian 12's names.
refused() {
	for call in "--list build" "build test clang"; do
		deps "$1" 0 $call
		if [ "$rc" -eq 0 ] || [ -s "$dir/out" ] || [ -s "$dir/log" ] ||
			! grep -q "this is $2" "$dir/err" ||
			! grep -q "knows the package names of Debian 12, Ubuntu 22.04 and Ubuntu 24.04" "$dir/err" ||
			! grep -q "Nothing was installed" "$dir/err" ||
			! grep -q "NO_DEPS=1" "$dir/err" ||
			! grep -q "build  protoc-c, protobuf-c's code generator \[protobuf-c-compiler\]" "$dir/err"; then
			say_run "$call on $1"
			return 1
		fi
	done
	# One line per package a group needs: the build group's 7 for --list
	# build, all 19 for the three groups.
	lines=$(grep -c "^deps:   [a-z]" "$dir/err")
	if [ "$lines" -ne 19 ]; then
		say_run "build test clang on $1"
		echo "  $lines lines of what to install, want 19"
		return 1
	fi
}

t_debian_12_gets_its_packages() {
	lists debian-12 build "$build" && lists debian-12 test "$test" &&
		lists debian-12 clang "$clang_debian_12" && quiet
}

t_ubuntu_22_04_gets_its_packages() {
	lists ubuntu-22.04 build "$build" && lists ubuntu-22.04 test "$test" &&
		lists ubuntu-22.04 clang "$clang_ubuntu_22_04" && quiet
}

t_ubuntu_24_04_gets_its_packages() {
	lists ubuntu-24.04 build "$build" && lists ubuntu-24.04 test "$test" &&
		lists ubuntu-24.04 clang "$clang_ubuntu_24_04" && quiet
}

t_pop_os_22_04_gets_ubuntu_22_04s_packages() {
	lists pop-22.04 "build test clang" "$build $test $clang_ubuntu_22_04" || return 1
	grep -q "Pop!_OS 22.04 LTS is built on Ubuntu 22.04" "$dir/err" || {
		say_run "--list on pop-22.04"
		return 1
	}
}

t_groups_join_in_table_order_once_each() {
	lists debian-12 "clang test build clang" "$build $test $clang_debian_12"
}

t_debian_11_is_refused_with_what_it_needs() {
	refused debian-11 "Debian GNU/Linux 11 (bullseye)"
}

t_fedora_40_is_refused_with_what_it_needs() {
	refused fedora-40 "Fedora Linux 40 (Container Image)"
}

t_no_os_release_is_refused() {
	deps no-such-file 0 build
	if [ "$rc" -eq 0 ] || [ -s "$dir/log" ] || ! grep -q "cannot read .*no-such-file" "$dir/err"; then
		say_run "build with no os-release"
		return 1
	fi
}

t_unknown_group_is_refused() {
	deps debian-12 0 --list tests
	if [ "$rc" -eq 0 ] || [ -s "$dir/out" ] || ! grep -q "unknown group 'tests'" "$dir/err"; then
		say_run "--list tests"
		return 1
	fi
}

t_nothing_missing_runs_no_apt_get() {
	echo "$build" | tr ' ' '\n' >"$dir/installed"
	deps debian-12 1000 build
	if [ "$rc" -ne 0 ] || [ -s "$dir/out" ] || [ -s "$dir/err" ] || grep -q apt-get "$dir/log"; then
		say_run "build with all of it installed"
		return 1
	fi
}

t_non_root_is_told_what_is_missing() {
	echo "$build" | tr ' ' '\n' | grep -v -e libuv1-dev -e libinih-dev >"$dir/installed"
	deps ubuntu-24.04 1000 build
	if [ "$rc" -eq 0 ] || grep -q apt-get "$dir/log" ||
		! grep -q "missing Ubuntu 24.04 packages for build: libuv1-dev libinih-dev" "$dir/err"; then
		say_run "build as uid 1000 without libuv1-dev, libinih-dev"
		return 1
	fi
}

t_root_installs_only_what_is_missing_at_once() {
	echo "$build $test clang" | tr ' ' '\n' | grep -v -e libuv1-dev -e python3-numpy >"$dir/installed"
	deps ubuntu-24.04 0 build test clang
	want="apt-get update -qq
apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends libuv1-dev python3-numpy libclang-rt-18-dev"
	if [ "$rc" -ne 0 ] || [ "$(grep apt-get "$dir/log")" != "$want" ]; then
		say_run "build test clang as root without libuv1-dev, python3-numpy, libclang-rt-18-dev"
		echo "  want: $want"
		return 1
	fi
}

# two_at_once I: run I of that case, in the background.
two_at_once() {
	OS_RELEASE=$fixtures/debian-12 PATH="$dir/bin:$PATH" FAKE_LOG=$dir/log \
		FAKE_INSTALLED=$dir/installed FAKE_UID=0 DEPS_LOCK=$dir/lock FAKE_APT_SLOW=1 \
		FAKE_GO=$dir/go sh "$deps" build >"$dir/out$1" 2>"$dir/err$1" &
}

# wait_for PATTERN FILE: until FILE has a line of PATTERN, 10 s at most.
wait_for() {
	waited=0
	while [ $waited -lt 200 ] && ! grep -q "$1" "$2" 2>/dev/null; do
		sleep 0.05
		waited=$((waited + 1))
	done
}

# Two make targets at once on a fresh machine: the second run waits for the
# first's install instead of failing on dpkg's lock, then finds nothing
# missing and installs nothing.  The first's install lasts until the second
# has said it waits.
t_a_second_run_waits_for_the_first() {
	command -v flock >/dev/null || {
		echo "flock (util-linux) is not here: tools/deps.sh cannot lock"
		return 1
	}
	echo "$build" | tr ' ' '\n' | grep -v -e libuv1-dev -e libinih-dev >"$dir/installed"
	: >"$dir/log"
	rm -f "$dir/go"
	two_at_once 1
	pid1=$!
	wait_for "^apt-get.* install " "$dir/log" # the first is installing, the lock its
	two_at_once 2
	pid2=$!
	wait_for "waiting for it" "$dir/out2"
	touch "$dir/go"
	wait $pid1
	rc1=$?
	wait $pid2
	rc2=$?
	installs=$(grep -c "^apt-get.* install " "$dir/log")
	if [ $rc1 -ne 0 ] || [ $rc2 -ne 0 ] || [ "$installs" -ne 1 ] ||
		! grep -q "waiting for it" "$dir/out2" ||
		! grep -q "another run installed what build needs" "$dir/out2"; then
		echo "two runs at once: status $rc1 and $rc2, $installs installs"
		for i in 1 2; do
			sed "s/^/  run $i stdout: /" "$dir/out$i"
			sed "s/^/  run $i stderr: /" "$dir/err$i"
		done
		sed 's/^/  ran: /' "$dir/log"
		return 1
	fi
}

# Another program holds apt's package lists (the daily apt timer at boot):
# update is tried again until they are free, and the install goes on.
t_update_waits_for_the_package_lists() {
	echo "$build" | tr ' ' '\n' | grep -v -e libuv1-dev >"$dir/installed"
	: >"$dir/log"
	OS_RELEASE=$fixtures/debian-12 PATH="$dir/bin:$PATH" FAKE_LOG=$dir/log \
		FAKE_INSTALLED=$dir/installed FAKE_UID=0 DEPS_LOCK=$dir/lock FAKE_LISTS_LOCKED=2 \
		DEPS_RETRY_S=0 sh "$deps" build >"$dir/out" 2>"$dir/err"
	rc=$?
	updates=$(grep -c "^apt-get update" "$dir/log")
	if [ "$rc" -ne 0 ] || [ "$updates" -ne 3 ] || ! grep -q "^apt-get.* install " "$dir/log" ||
		! grep -q "another program holds apt's package lists; waiting" "$dir/out"; then
		say_run "build with the lists locked for two updates"
		return 1
	fi
}

t_readme_set_up_names_every_package() {
	setup=$(sed -n '/^## Set-up/,/^## [^S]/p' "$repo/README.md")
	for p in $build $test $clang_debian_12 $clang_ubuntu_22_04 $clang_ubuntu_24_04; do
		echo "$setup" | grep -qw -- "$p" || {
			echo "README's Set-up section does not name $p"
			return 1
		}
	done
}

cases=$(sed -n 's/^\(t_[a-z0-9_]*\)() {$/\1/p' "$0")
n=$(echo $cases | wc -w)
echo "[==========] Running $n test(s)."
for t in $cases; do
	name=${t#t_}
	echo "[ RUN      ] $name"
	: >"$dir/installed"
	if $t; then
		echo "[       OK ] $name"
	else
		echo "[  FAILED  ] $name"
		bad="$bad $name"
	fi
done
n_bad=$(echo $bad | wc -w)
echo "[==========] $n test(s) run."
echo "[  PASSED  ] $((n - n_bad)) test(s)."
for t in $bad; do echo "[  FAILED  ] $t"; done
[ -z "$bad" ]
