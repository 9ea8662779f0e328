#!/bin/bash
# bench/ab.sh — one revision against the working tree, on one GPU machine,
# bench by bench in turn: what "no bench figure worse beyond noise" needs
# on machines whose CPU drifts by tens of percent within minutes
# (bench/NOTES.md, runs 73-77).
#
#   bench/ab.sh pack REV        here: writes .ab/old.tar.gz (git archive of
#                               REV) and .ab/REV, for the device to carry
#   bench/ab.sh [build] SPEC... on the device (run's carry: [".devdeps",
#                               ".ab"]): with build, builds the working tree
#                               in /tmp/ab/new and REV in /tmp/ab/old, side by
#                               side, and runs make check-cuda on the new one;
#                               then each SPEC in the order given
#
# SPEC is TREE:BENCH:SECONDS, TREE new or old, SECONDS the most that run may
# take (the call's own limit is DEADLINE seconds, 570 unless set).  BENCH:
#   eager    eager_step.py --only mlp,gpt-small --epochs 2 --skip-graph
#   gs       eager_step.py --only gpt-small --epochs 3 --skip-graph
#   node     node.py --n 4,16 --steps 10 --tight-s 1.5 (pool off and on)
#   nodeoff  the same, pool off only
#   node16   node.py --n 16, pool off only
#   tight    train_step.py's tight loop alone, warm pool
# The SPECs run in the order given: give the trees in turn and turn the
# order round every pair (old new new old ...), so that the machine's drift
# falls on both.  Each tree runs its own bench scripts: a change to them
# between the two revisions is part of the comparison.  Builds stay in /tmp/ab
# while the machine is warm: a call made within its idle_release_s (30 s)
# of the last one may leave out build.
#
# Everything comes back in $OUT/ab.log (a bench's lines under a "====
# TREE:BENCH" line) and $OUT/build.log: run returns at most 8 files.  The
# first run of each dataset writes it (tens of seconds): give it more time.
set -u
ab_root=$(cd "$(dirname "$0")/.." && pwd)

if [ "${1:-}" = pack ]; then
	rev=$(git -C "$ab_root" rev-parse --verify --quiet "${2:?usage: bench/ab.sh pack REV}^{commit}") || {
		echo "bench/ab.sh: '$2' names no commit here" >&2
		exit 1
	}
	mkdir -p "$ab_root/.ab"
	git -C "$ab_root" archive --format=tar.gz --prefix=old/ -o "$ab_root/.ab/old.tar.gz" "$rev" ||
		exit 1
	echo "$rev" >"$ab_root/.ab/REV"
	echo "bench/ab.sh: .ab/old.tar.gz is $rev; carry .ab"
	exit 0
fi

: "${OUT:?bench/ab.sh runs on the device, where run sets OUT}"
t0=$(date +%s)
elapsed() { echo $(($(date +%s) - t0)); }
left() { echo $((${DEADLINE:-570} - $(elapsed))); }
log=$OUT/ab.log
[ -f "$ab_root/.devdeps/install.sh" ] && source "$ab_root/.devdeps/install.sh" >"$OUT/build.log" 2>&1
{
	nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader 2>&1
	echo "$(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
} >>"$log"

if [ "${1:-}" = build ]; then
	shift
	[ -f "$ab_root/.ab/old.tar.gz" ] || {
		echo "no .ab/old.tar.gz: run bench/ab.sh pack REV here first" >>"$log"
		exit 1
	}
	rm -rf /tmp/ab
	mkdir -p /tmp/ab/new
	cp "$ab_root/.ab/REV" /tmp/ab/REV
	# The new tree without what a build or an earlier call left: the
	# ignored paths of .gitignore, and the carried folders but .devdeps.
	(cd "$ab_root" && tar cf - --exclude=./.git --exclude=./.ab --exclude=./.diag --exclude=./build \
		--exclude=./build-asan --exclude=./build-tsan --exclude=./run --exclude=./python/build \
		--exclude='./python/*.egg-info' --exclude=__pycache__ .) | tar xf - -C /tmp/ab/new
	tar xzf "$ab_root/.ab/old.tar.gz" -C /tmp/ab
	(cd /tmp/ab/old && make -j8 >/tmp/ab/old.log 2>&1; echo "old: make rc=$?" >>/tmp/ab/old.log) &
	(cd /tmp/ab/new && make -j16 >/tmp/ab/new.log 2>&1; echo "new: make rc=$?" >>/tmp/ab/new.log)
	# make check-cuda runs while the old tree may still be compiling: its
	# figures are not for comparing.  It takes at most what the call has
	# left, less a minute for the benches.
	cap=$(($(left) - 60))
	[ "$cap" -gt 300 ] && cap=300
	if [ "$cap" -ge 30 ]; then
		(cd /tmp/ab/new && timeout "$cap" make check-cuda >/tmp/ab/check.log 2>&1
			echo "new: make check-cuda rc=$?" >>/tmp/ab/check.log)
	else
		echo "new: make check-cuda not run: $(left) s left" >/tmp/ab/check.log
	fi
	wait
	cat /tmp/ab/new.log /tmp/ab/old.log /tmp/ab/check.log >>"$OUT/build.log"
	grep -h "rc=\|^tests:" /tmp/ab/new.log /tmp/ab/old.log /tmp/ab/check.log >>"$log"
	echo "built in $(elapsed) s" >>"$log"
fi
echo "old is $(cat /tmp/ab/REV 2>/dev/null || echo '(not built on this machine: give build)')" >>"$log"

for spec in "$@"; do
	IFS=: read -r tree bench secs <<<"$spec"
	case ${secs:-60} in *[!0-9]*)
		echo "$spec: SECONDS is a whole number" >>"$log"
		continue
		;;
	esac
	case $tree in new | old) ;; *)
		echo "$spec: the tree is new or old" >>"$log"
		continue
		;;
	esac
	case $bench in
	eager) cmd=(bench/eager_step.py --only mlp,gpt-small --epochs 2 --skip-graph) ;;
	gs) cmd=(bench/eager_step.py --only gpt-small --epochs 3 --skip-graph) ;;
	node) cmd=(bench/node.py --n 4,16 --steps 10 --tight-s 1.5) ;;
	nodeoff) cmd=(bench/node.py --n 4,16 --steps 10 --tight-s 1.5 --pool off) ;;
	node16) cmd=(bench/node.py --n 16 --steps 10 --tight-s 1.5 --pool off) ;;
	tight) cmd=(bench/train_step.py --skip compute,tight-off,dataloader,sweep,checks --epochs 2
		--cuda-bench none) ;;
	*)
		echo "$spec: no bench '$bench' (eager gs node nodeoff node16 tight)" >>"$log"
		continue
		;;
	esac
	[ -d "/tmp/ab/$tree" ] || {
		echo "$spec: /tmp/ab/$tree is not built (this machine is a fresh one: give build)" >>"$log"
		continue
	}
	[ "$(left)" -lt "${secs:-60}" ] && secs=$(left)
	if [ "${secs:-60}" -lt 20 ]; then
		echo "==== $spec: skipped, $(left) s left" >>"$log"
		continue
	fi
	echo "==== $tree:$bench at $(elapsed) s" >>"$log"
	(cd "/tmp/ab/$tree" && timeout "${secs:-60}" python3 -u "${cmd[@]}" >>"$log" 2>&1
		echo "==== $tree:$bench rc=$?" >>"$log")
done
echo "==== done at $(elapsed) s" >>"$log"
