#!/bin/sh
# run.sh — runs libFuzzer harnesses on scratch copies of their corpora and
# prints one line per harness: its name, executions, rate and result.
#
#   tests/fuzz/run.sh [-j JOBS] [-w WORKERS] DIR LIMIT NAME...
#
# DIR holds fuzz_NAME and seeds/NAME (build/fuzz); LIMIT is the libFuzzer
# option that ends a run (-max_total_time=60, -runs=10000000).  Inputs
# committed in tests/fuzz/corpus/NAME join the seeds.  Up to JOBS harnesses
# run at once.  With WORKERS > 1 each harness runs as that many processes
# on one shared corpus, each with its own seed (libFuzzer picks up what the
# others add to the directory); -runs=N is split between them, and the line
# printed gives the sum and each worker's count.  FUZZ_FLAGS in the
# environment adds libFuzzer options to every process (a time cap beside
# -runs, say: -max_total_time=530); FUZZ_SEED_BASE offsets the workers'
# seeds, so that a second run explores anew.  Exits 1 if any harness
# found a crash, a leak or a timeout (libFuzzer's exit status), after every
# harness has run.
set -u

jobs=1
workers=1
while [ $# -gt 0 ]; do
	case $1 in
	-j) jobs=$2; shift 2 ;;
	-w) workers=$2; shift 2 ;;
	*) break ;;
	esac
done
[ $# -ge 3 ] || { echo "usage: run.sh [-j JOBS] [-w WORKERS] DIR LIMIT NAME..." >&2; exit 2; }
case $workers in
''|*[!0-9]*|0) echo "run.sh: -w wants a count of processes, not '$workers'" >&2; exit 2 ;;
esac
dir=$1
limit=$2
shift 2
# -runs=N is the total: each of the workers runs its share.
wlimit=$limit
case $limit in
-runs=*)
	n=${limit#-runs=}
	wlimit=-runs=$(( (n + workers - 1) / workers ))
	;;
esac

# The log of worker $2 of harness $1: NAME.log for the first (the only one
# without -w), NAME.W.log for the others.
worker_log() {
	if [ "$2" -eq 1 ]; then
		echo "$dir/log/$1.log"
	else
		echo "$dir/log/$1.$2.log"
	fi
}

# One harness, start to end; its verdict goes to $dir/log/NAME.result.
run_one() {
	name=$1
	corpus=$dir/corpus/$name
	art=$dir/artifacts/$name
	log=$dir/log/$name.log
	rm -rf "$corpus" "$art" "$dir/log/$name".*.log
	mkdir -p "$corpus" "$art" "$dir/log"
	cp "$dir/seeds/$name/"* "$corpus/" 2>/dev/null
	if [ -d "tests/fuzz/corpus/$name" ]; then
		cp "tests/fuzz/corpus/$name/"* "$corpus/" 2>/dev/null
	fi
	seeds=$(ls "$corpus" | wc -l)
	# Session scripts cost a few socket round trips an action: longer
	# ones than 320 bytes (about 64 actions, all a script runs) add
	# time, not depth.
	extra=
	[ "$name" = sess ] && extra=-max_len=320
	start=$(date +%s)
	# -timeout: one input running 25 s is a hang; the others are
	# libFuzzer's defaults (2 GiB RSS, leak detection on).
	rc=0
	failed_log=$log
	wpids=""
	w=1
	while [ "$w" -le "$workers" ]; do
		seed=
		[ "$workers" -eq 1 ] || seed=-seed=$((${FUZZ_SEED_BASE:-0} + w))
		"$dir/fuzz_$name" "$wlimit" $extra $seed ${FUZZ_FLAGS:-} -print_final_stats=1 -timeout=25 \
			-artifact_prefix="$art/" "$corpus" >"$(worker_log "$name" "$w")" 2>&1 &
		wpids="$wpids $!"
		w=$((w + 1))
	done
	# The first worker that failed gives the status and the log shown,
	# but one that found something wins over one stopped by hand (72).
	w=1
	for p in $wpids; do
		s=0
		wait "$p" || s=$?
		if [ "$s" -ne 0 ] && { [ "$rc" -eq 0 ] || { [ "$rc" -eq 72 ] && [ "$s" -ne 72 ]; }; }; then
			rc=$s
			failed_log=$(worker_log "$name" "$w")
		fi
		w=$((w + 1))
	done
	secs=$(( $(date +%s) - start ))
	[ "$secs" -gt 0 ] || secs=1
	execs=0
	each=
	w=1
	while [ "$w" -le "$workers" ]; do
		n=$(sed -n 's/^stat::number_of_executed_units: *//p' "$(worker_log "$name" "$w")" |
			tail -n 1)
		execs=$((execs + ${n:-0}))
		each="$each${each:+ + }${n:-0}"
		w=$((w + 1))
	done
	[ "$workers" -eq 1 ] && each= || each=" ($each in $workers workers)"
	if [ "$rc" -eq 0 ]; then
		verdict="no crash"
	else
		verdict="FAILED (exit $rc), see $failed_log and $art/"
	fi
	printf 'fuzz %-6s %10s executions%s in %4d s (%d/s), corpus %d -> %d inputs: %s\n' \
		"$name" "$execs" "$each" "$secs" $((execs / secs)) "$seeds" "$(ls "$corpus" | wc -l)" \
		"$verdict" >"$dir/log/$name.result"
	# The session harness says what its scripts reached.
	sed -n 's/^fuzz_sess: /    /p' "$log" >>"$dir/log/$name.result"
	if [ "$rc" -ne 0 ]; then
		echo "---- last lines of $failed_log:" >>"$dir/log/$name.result"
		grep -v '^#[0-9]' "$failed_log" | tail -n 40 >>"$dir/log/$name.result"
	fi
	return "$rc"
}

status=0
running=0
pids=""
for name in "$@"; do
	if [ ! -x "$dir/fuzz_$name" ]; then
		echo "fuzz $name: $dir/fuzz_$name is missing" >&2
		status=1
		continue
	fi
	run_one "$name" &
	pids="$pids $!:$name"
	running=$((running + 1))
	if [ "$running" -ge "$jobs" ]; then
		# Wait for the oldest; with jobs = 1 this runs them in order.
		first=${pids# }
		first=${first%% *}
		wait "${first%%:*}" || status=1
		cat "$dir/log/${first#*:}.result"
		pids=${pids#" $first"}
		running=$((running - 1))
	fi
done
for p in $pids; do
	wait "${p%%:*}" || status=1
	cat "$dir/log/${p#*:}.result"
done
exit $status
