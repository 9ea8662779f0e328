#!/bin/sh
# deploy/container/Containerfile and deploy/kubernetes/prefetchd-daemonset.yaml
# agree with the tree and with each other.  No image can be built here (no
# registry), so this checks what building and running one relies on:
#   - the files the runtime stage copies are what `make install` puts at the
#     build stage's DESTDIR and PREFIX, and its ENTRYPOINT is the daemon;
#   - the runtime stage installs the Debian package of every shared library
#     the installed binaries need, and no other; none of them is CUDA's;
#   - the build stage installs the package behind every pkg-config module
#     the Makefile builds with, and protoc-c's;
#   - the DaemonSet runs this image (tag = the Makefile's version) as the
#     Containerfile's USER, with arguments, configuration and probes the
#     binaries accept;
#   - and, as root, the pod's socket directory set up as its init container
#     does lets the daemon listen as its user, its probes pass, a trainer of
#     the socket's group connects and another user is refused.
# Reports as cmocka does.  The package checks need dpkg (Debian).
#   tests/install/test_container.sh REPO BUILD_DIR [MAKE VARIABLES...]
repo=$1 build=$2
shift 2
make_vars="$*"
. "$repo/tests/install/lib.sh"
cf=$repo/deploy/container/Containerfile
ds=$repo/deploy/kubernetes/prefetchd-daemonset.yaml
version=$(sed -n 's/^VERSION *:= *//p' "$repo/Makefile")

# The Containerfile with continuation lines joined, one instruction a line.
instructions() {
	sed -e ':a' -e '/\\$/{N;s/\\\n//;ba' -e '}' "$cf" | grep -v '^[[:space:]]*#'
}

# The instructions of stage $1 (1: the first FROM), one a line.
stage() {
	instructions | awk -v n="$1" '/^FROM /{s++} s == n'
}

# The packages that stage $1's apt-get install commands name.
stage_packages() {
	stage "$1" | grep '^RUN ' | sed 's/&&/\n/g; s/;/\n/g' | grep 'apt-get install' |
		sed 's/.*apt-get install//' | tr ' ' '\n' | tr -d '"' | grep -v '^-' | grep -v '^$'
}

# The install the build stage runs: "DESTDIR PREFIX".
build_install() {
	line=$(stage 1 | grep '^RUN .*make .*install')
	destdir=$(echo "$line" | sed -n 's/.*DESTDIR=\([^ ]*\).*/\1/p')
	prefix=$(echo "$line" | sed -n 's/.*PREFIX=\([^ ]*\).*/\1/p')
	[ -n "$destdir" ] && [ -n "$prefix" ] || die "the build stage runs no make install DESTDIR= PREFIX="
	echo "$destdir $prefix"
}

# make install as the build stage runs it, into $t_tmp/root.
tree_install() {
	set -- $(build_install)
	prefix=$2
	# shellcheck disable=SC2086 # one word a variable
	out=$(env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -C "$repo" --no-print-directory \
		DESTDIR="$t_tmp/root" PREFIX="$prefix" $make_vars install 2>&1) ||
		die "make install failed: $out"
}

# A DaemonSet value: the first "KEY: VALUE" line (VALUE as written).
ds_value() {
	sed -n "s/^[[:space:]-]*$1: *//p" "$ds" | head -n 1
}

# The words of a flow list like ["a", "b"].
flow_words() {
	echo "$1" | sed 's/^\[//; s/\]$//; s/, */\n/g' | tr -d '"'
}

# The ConfigMap's prefetchd.conf, unindented.
configmap_conf() {
	sed -n '/^  prefetchd.conf: |$/,$p' "$ds" | sed '1d; s/^    //'
}

runtime_stage_copies_what_make_install_puts_there() {
	set -- $(build_install)
	destdir=$1 prefix=$2
	tree_install
	copies=$(stage 2 | grep '^COPY --from=build ')
	[ -n "$copies" ] || die "the runtime stage copies nothing from the build stage"
	dests=""
	echo "$copies" | while read -r _ _ args; do
		set -- $args
		while [ $# -gt 1 ]; do
			case $1 in
			"$destdir"/*) ;;
			*) die "COPY takes $1, which is not under the build stage's DESTDIR $destdir" ;;
			esac
			[ -e "$t_tmp/root${1#"$destdir"}" ] ||
				die "COPY takes $1, but make install DESTDIR=$destdir PREFIX=$prefix puts no ${1#"$destdir"}"
			echo "copied: ${1#"$destdir"}"
			shift
		done
	done || exit 1
	entry=$(stage 2 | sed -n 's/^ENTRYPOINT \["\([^"]*\)".*/\1/p')
	[ "$entry" = "$prefix/bin/prefetchd" ] ||
		die "ENTRYPOINT is '$entry', not the installed $prefix/bin/prefetchd"
	stage 2 | grep "^COPY --from=build .*$destdir$prefix/bin/prefetchd .*$prefix/bin/" >/dev/null ||
		die "the runtime stage does not copy prefetchd to $prefix/bin/"
}

runtime_stage_installs_the_libraries_the_binaries_need() {
	command -v dpkg-query >/dev/null || skip "dpkg-query is not here (not Debian)"
	command -v readelf >/dev/null || die "readelf is not installed (binutils)"
	set -- $(build_install)
	prefix=$2
	tree_install
	want=""
	for bin in "$t_tmp/root$prefix/bin/prefetchd" "$t_tmp/root$prefix/bin/prefetchctl"; do
		for so in $(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
			case $so in
			*cuda* | *nvidia*) die "$(basename "$bin") links $so: the driver must come from the node" ;;
			libc.so.* | libm.so.* | libdl.so.* | libpthread.so.* | librt.so.* | ld-linux*) continue ;;
			esac
			path=$(ldconfig -p | sed -n "s/^[[:space:]]*$so (.*x86-64.*) => //p" | head -n 1)
			[ -n "$path" ] || path=$(ldconfig -p | sed -n "s/^[[:space:]]*$so .* => //p" | head -n 1)
			[ -n "$path" ] || die "cannot find $so on this machine"
			pkg=$(dpkg-query -S "$(readlink -f "$path")" 2>/dev/null | head -n 1 | cut -d: -f1)
			[ -n "$pkg" ] || pkg=$(dpkg-query -S "$path" 2>/dev/null | head -n 1 | cut -d: -f1)
			[ -n "$pkg" ] || die "no Debian package holds $path ($so)"
			echo "$(basename "$bin"): $so from $pkg"
			want="$want $pkg"
		done
	done
	have=$(stage_packages 2 | sort -u)
	for pkg in $(echo $want | tr ' ' '\n' | sort -u); do
		echo "$have" | grep -qx "$pkg" || die "the runtime stage does not install $pkg"
	done
	for pkg in $have; do
		echo " $want " | grep -q " $pkg " || die "the runtime stage installs $pkg, which no binary needs"
	done
}

build_stage_installs_what_the_build_needs() {
	command -v dpkg-query >/dev/null || skip "dpkg-query is not here (not Debian)"
	have=$(stage_packages 1 | sort -u)
	modules=$(sed -n 's/^PKGS *:= *//p' "$repo/Makefile")
	[ -n "$modules" ] || die "no PKGS in the Makefile"
	for m in $modules; do
		pc=$(pkg-config --variable=pcfiledir "$m")/$m.pc
		pkg=$(dpkg-query -S "$pc" 2>/dev/null | head -n 1 | cut -d: -f1)
		[ -n "$pkg" ] || die "no Debian package holds $pc"
		echo "$have" | grep -qx "$pkg" || die "the build stage does not install $pkg ($m)"
		echo "$m: $pkg"
	done
	for tool in protoc-c pkg-config make cc; do
		path=$(command -v "$tool") || die "$tool is not installed here"
		# The package named for it (as tools/deps.sh names them), where
		# the file's own is a dependency of that one.
		case $tool in
		make | cc) pkg=build-essential ;;
		pkg-config) pkg=pkg-config ;;
		*) pkg=$(dpkg-query -S "$(readlink -f "$path")" 2>/dev/null | head -n 1 | cut -d: -f1) ;;
		esac
		[ -n "$pkg" ] || die "no Debian package holds $path"
		echo "$have" | grep -qx "$pkg" || die "the build stage does not install $pkg ($tool)"
		echo "$tool: $pkg"
	done
}

daemonset_runs_this_image_as_built() {
	image=registry.example.com/prefetchd:$version
	n=$(grep -c 'image: ' "$ds")
	[ "$(grep -c "image: $image\$" "$ds")" -eq "$n" ] || die "the DaemonSet's images are not all $image"
	grep -q "build -f deploy/container/Containerfile -t $image " "$cf" ||
		die "the Containerfile does not say it builds $image"
	user=$(stage 2 | sed -n 's/^USER //p')
	[ "$user" = "$(ds_value runAsUser):$(ds_value runAsGroup)" ] ||
		die "USER $user is not the DaemonSet's runAsUser:runAsGroup"
	# args, after the ENTRYPOINT: the configuration the ConfigMap mounts.
	args=$(flow_words "$(ds_value args)")
	conf=$(echo "$args" | sed -n '/^-c$/{n;p}')
	[ -n "$conf" ] || die "the DaemonSet gives the daemon no -c"
	[ "$(dirname "$conf")" = "$(sed -n 's/.*{name: config, mountPath: \([^,]*\),.*/\1/p' "$ds")" ] ||
		die "$conf is not in the config volume's mountPath"
	configmap_conf >"$t_tmp/$(basename "$conf")"
	# shellcheck disable=SC2086
	out=$("$build/prefetchd" $(echo "$args" | sed "s|^$conf\$|$t_tmp/$(basename "$conf")|") \
		--check 2>"$t_tmp/err")
	echo "$out"
	echo "$out" | tail -n 1 | grep -Eq ": (ok|has unusable datasets)$" ||
		die "prefetchd $args refuses the ConfigMap's configuration: $(cat "$t_tmp/err")"
	bad=$(echo "$out" | grep '^dataset .*: ERROR' | grep -v 'No such file or directory')
	[ -z "$bad" ] || die "a dataset of the ConfigMap fails for another reason: $bad"
	# The probes: prefetchctl, on the socket the configuration names.
	sock=$(configmap_conf | sed -n 's/^socket = //p')
	[ "$(dirname "$sock")" = "/run/prefetchd" ] || die "the ConfigMap's socket $sock is not in /run/prefetchd"
	grep -q '{name: run, mountPath: /run/prefetchd}' "$ds" || die "the run volume is not at /run/prefetchd"
	grep 'command: \["prefetchctl"' "$ds" | while read -r _ list; do
		set -- $(flow_words "$list")
		[ "$1" = prefetchctl ] && [ "$2" = -s ] && [ "$3" = "$sock" ] ||
			die "a probe does not ask prefetchctl -s $sock: $list"
		stage 2 | grep -q "^COPY --from=build .*/bin/prefetchctl .*/usr/local/bin/" ||
			die "the image has no prefetchctl on PATH"
		shift 3
		# A daemon that is not there: the command line must parse (1, not 2).
		"$build/prefetchctl" -s "$t_tmp/none.sock" "$@" >/dev/null 2>&1
		[ $? -eq 1 ] || die "prefetchctl does not take the probe's command '$*'"
		echo "probe: prefetchctl -s $sock $*"
	done || exit 1
}

pod_socket_directory_lets_the_daemon_listen_and_the_socket_group_in() {
	[ "$(id -u)" -eq 0 ] || skip "needs root (to be the kubelet, the init container and the users)"
	command -v setpriv >/dev/null || skip "setpriv is not installed (util-linux)"
	uid=$(ds_value runAsUser) gid=$(ds_value runAsGroup)
	chmod 0755 "$t_tmp"
	mkdir -p "$t_tmp/bin" "$t_tmp/etc" && cp "$build/prefetchd" "$build/prefetchctl" "$t_tmp/bin/" ||
		die "cannot copy the binaries"
	# The kubelet's hostPath, DirectoryOrCreate: root's, 0755.
	node=$t_tmp/node/run
	mkdir -p -m 0755 "$node"
	# The init container's command, on that directory.
	set -- $(flow_words "$(sed -n '/- name: socket-dir/,/volumeMounts/p' "$ds" | sed -n 's/^ *command: //p')")
	[ "$1" = install ] || die "no init container making the socket's directory"
	# Its mount path, /run/prefetchd, is the node directory here.
	cmd=$(echo "$*" | sed "s|/run/prefetchd\$|$node|")
	case $cmd in *"$node") ;; *) die "the init container's command is not on /run/prefetchd: $*" ;; esac
	# shellcheck disable=SC2086
	$cmd || die "the init container's command failed: $cmd"
	stat -c 'socket directory: %a %u:%g' "$node"
	configmap_conf | sed "s|/run/prefetchd/|$node/|" >"$t_tmp/etc/prefetchd.conf"
	sock=$(sed -n 's/^socket = //p' "$t_tmp/etc/prefetchd.conf")
	case $sock in "$node"/*) ;; *) die "the ConfigMap's socket $sock is not in /run/prefetchd" ;; esac
	setpriv --reuid="$uid" --regid="$gid" --clear-groups \
		"$t_tmp/bin/prefetchd" -c "$t_tmp/etc/prefetchd.conf" 2>"$t_tmp/daemon.log" &
	pid=$!
	i=0
	while [ ! -S "$sock" ] && [ $i -lt 100 ] && kill -0 $pid 2>/dev/null; do
		sleep 0.1
		i=$((i + 1))
	done
	as() { setpriv --reuid="$1" --regid="$2" --clear-groups "$t_tmp/bin/prefetchctl" -s "$sock" datasets; }
	ok=1
	if [ ! -S "$sock" ]; then
		echo "the daemon did not listen as $uid:$gid:"
		ok=0
	elif ! as "$uid" "$gid" >/dev/null; then
		echo "the probes fail as the daemon's user"
		ok=0
	elif ! as 3000 "$gid" >/dev/null; then
		echo "a trainer whose group is the socket's ($gid) cannot connect"
		ok=0
	elif out=$(as 3001 3001 2>&1); then
		echo "a trainer of another group connected"
		ok=0
	else
		echo "another user: $out"
	fi
	kill $pid 2>/dev/null
	wait $pid
	[ $ok -eq 1 ] || die "$(cat "$t_tmp/daemon.log")"
	echo "the daemon listened as $uid:$gid; the probes and a trainer of group $gid got in"
}

echo "[==========] Running 5 test(s)."
t_case runtime_stage_copies_what_make_install_puts_there
t_case runtime_stage_installs_the_libraries_the_binaries_need
t_case build_stage_installs_what_the_build_needs
t_case daemonset_runs_this_image_as_built
t_case pod_socket_directory_lets_the_daemon_listen_and_the_socket_group_in
t_end
