#!/bin/sh
# run.sh — runs libFuzzer harnesses on scratch copies of their corpora and
# prints one line per harness: its name, executions, rate and result.
#
#   tests/fuzz/run.sh [-j JOBS] DIR LIMIT NAME...
#
# DIR holds fuzz_NAME and seeds/NAME (build/fuzz); LIMIT is the libFuzzer
# option that ends a run (-max_total_time=60, -runs=10000000).  Inputs
# committed in tests/fuzz/corpus/NAME join the seeds.  Up to JOBS harnesses
# run at once.  Exits 1 if any harness found a crash, a leak or a timeout
# (libFuzzer's exit status), after every harness has run.
set -u

jobs=1
if [ "${1:-}" = "-j" ]; then
	jobs=$2
	shift 2
fi
[ $# -ge 3 ] || { echo "usage: run.sh [-j JOBS] DIR LIMIT NAME..." >&2; exit 2; }
dir=$1
limit=$2
shift 2

# One harness, start to end; its verdict goes to $dir/log/NAME.result.
run_one() {
	name=$1
	corpus=$dir/corpus/$name
	art=$dir/artifacts/$name
	log=$dir/log/$name.log
	rm -rf "$corpus" "$art"
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
	"$dir/fuzz_$name" "$limit" $extra -print_final_stats=1 -timeout=25 \
		-artifact_prefix="$art/" "$corpus" >"$log" 2>&1
	rc=$?
	secs=$(( $(date +%s) - start ))
	[ "$secs" -gt 0 ] || secs=1
	execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
	execs=${execs:-0}
	if [ "$rc" -eq 0 ]; then
		verdict="no crash"
	else
		verdict="FAILED (exit $rc), see $log and $art/"
	fi
	printf 'fuzz %-6s %10s executions in %4d s (%d/s), corpus %d -> %d inputs: %s\n' \
		"$name" "$execs" "$secs" $((execs / secs)) "$seeds" "$(ls "$corpus" | wc -l)" \
		"$verdict" >"$dir/log/$name.result"
	# The session harness says what its scripts reached.
	sed -n 's/^fuzz_sess: /    /p' "$log" >>"$dir/log/$name.result"
	if [ "$rc" -ne 0 ]; then
		echo "---- last lines of $log:" >>"$dir/log/$name.result"
		grep -v '^#[0-9]' "$log" | tail -n 40 >>"$dir/log/$name.result"
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
