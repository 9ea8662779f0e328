#!/bin/sh
# Runs cmocka test binaries, shows their output, and ends with one line
# "tests: N passed, N failed, N skipped" summing every case of every binary.
# A binary that crashes or exits non-zero without reporting counts as failed.
# PF_REQUIRE_GPU=1 (make check-cuda) turns skips into failures.
passed=0 failed=0 skipped=0 bad=""
log=$(mktemp)
for t in "$@"; do
	[ -x "$t" ] || continue
	echo "== $t"
	"$t" >"$log" 2>&1
	rc=$?
	cat "$log"
	p=$(grep -c '^\[       OK \]' "$log")
	# cmocka prints each failed or skipped case twice (as it runs, then in
	# its closing list): count case lines, halve.
	f=$(( $(grep '^\[  FAILED  \] ' "$log" | grep -vc 'test(s)') / 2 ))
	s=$(( $(grep '^\[  SKIPPED \] ' "$log" | grep -vc 'test(s)') / 2 ))
	if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
		f=1
		echo "!! $t exited with status $rc"
	fi
	[ "$f" -gt 0 ] && bad="$bad $(basename "$t")"
	passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
done
rm -f "$log"
if [ -n "$PF_REQUIRE_GPU" ] && [ "$skipped" -gt 0 ]; then
	echo "!! $skipped test(s) skipped but a GPU is required here"
	failed=$((failed + skipped))
fi
[ -n "$bad" ] && echo "failing:$bad"
echo "tests: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
