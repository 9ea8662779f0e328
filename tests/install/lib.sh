# tests/install/lib.sh — what the shell tests share: cmocka's report format
# (tests/run.sh counts the "[       OK ]" lines, and each failed or skipped
# case twice, as cmocka prints them), a scratch directory removed at exit,
# and die() for a case's first failed check.
#
# A case is a shell function that t_case runs in a subshell: it returns 0
# when it passed, 77 when it cannot run here (after saying why), anything
# else when it failed (after saying why).  What it prints is shown under
# its name.
#   . tests/install/lib.sh; t_case name_that_reads_as_a_fact; ...; t_end
t_bad="" t_skipped="" t_n=0
t_tmp=$(mktemp -d)
trap 'rm -rf "$t_tmp"' EXIT

# Prints the message and ends the case (its subshell) as failed.
die() {
	printf '%s\n' "$*"
	exit 1
}

# Ends the case as skipped, saying why.
skip() {
	printf 'skipped: %s\n' "$*"
	exit 77
}

t_case() {
	t_n=$((t_n + 1))
	echo "[ RUN      ] $1"
	t_out=$( ("$1") 2>&1)
	t_rc=$?
	[ -n "$t_out" ] && printf '%s\n' "$t_out"
	if [ "$t_rc" -eq 0 ]; then
		echo "[       OK ] $1"
	elif [ "$t_rc" -eq 77 ]; then
		echo "[  SKIPPED ] $1"
		t_skipped="$t_skipped $1"
	else
		echo "[  FAILED  ] $1"
		t_bad="$t_bad $1"
	fi
}

# The closing lines; the script's status: 0 unless a case failed.
t_end() {
	n_bad=$(echo $t_bad | wc -w)
	n_skip=$(echo $t_skipped | wc -w)
	echo "[==========] $t_n test(s) run."
	echo "[  PASSED  ] $((t_n - n_bad - n_skip)) test(s)."
	for t in $t_skipped; do echo "[  SKIPPED ] $t"; done
	for t in $t_bad; do echo "[  FAILED  ] $t"; done
	[ -z "$t_bad" ]
}
