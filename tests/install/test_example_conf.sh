#!/bin/sh
# The example configuration (deploy/prefetchd.conf.example, installed as
# DOCDIR/prefetchd.conf.example) is one `prefetchd --check` accepts: as
# shipped it parses and only its dataset files are missing; with its
# defaults uncommented and its datasets written where it says, everything
# loads and --check says ok; and a mistake in it is refused with the line
# named (so the check would notice one).  test_config.c checks that the
# values it shows are the defaults.  Reports as cmocka does.
#   tests/install/test_example_conf.sh REPO BUILD_DIR [MAKE VARIABLES...]
repo=$1 build=$2
. "$repo/tests/install/lib.sh"
example=$repo/deploy/prefetchd.conf.example
daemon=${PREFETCHD_BIN:-$build/prefetchd}

# The example with every "; key = default" line made a key, and its
# datasets under $1 instead of /mnt/datasets.
uncommented() {
	sed -e 's/^; \([a-z_]* = \)/\1/' -e "s|/mnt/datasets/|$1/|g" "$example"
}

# An llm.c token shard of $2 tokens at $1.
write_shard() {
	perl -e 'my $n = shift; print pack("l<256", 20240520, 1, $n, (0) x 253);
		print pack("S<*", map { ($_ * 7) % 50257 } 0 .. $n - 1);' "$2" >"$1" ||
		die "cannot write the token shard $1"
}

check_reads_the_example_as_shipped_and_finds_only_missing_files() {
	out=$("$daemon" --check -c "$example" 2>"$t_tmp/err")
	rc=$?
	echo "$out"
	case $rc in 0 | 1) ;; *) die "--check exited $rc: $(cat "$t_tmp/err")" ;; esac
	echo "$out" | tail -n 1 | grep -Eq "^config $example: (ok|has unusable datasets)$" ||
		die "--check did not get past the configuration: $(cat "$t_tmp/err")"
	[ "$(echo "$out" | grep -c '^dataset ')" -eq 2 ] || die "--check did not report both datasets"
	# A dataset may be unusable only because its files are not on this
	# machine, never because of how the example declares it.
	bad=$(echo "$out" | grep '^dataset .*: ERROR' | grep -v 'No such file or directory')
	[ -z "$bad" ] || die "a dataset of the example fails for another reason: $bad"
}

check_passes_the_example_with_its_datasets_in_place() {
	data=$t_tmp/datasets
	mkdir -p "$data/imagenet" "$data/fineweb10B"
	"$build/npygen" "$data/imagenet/images.npy" --rows 100 --shape 3x8x8 --dtype u1 >/dev/null &&
		"$build/npygen" "$data/imagenet/labels.npy" --rows 100 --dtype i8 >/dev/null ||
		die "npygen failed"
	# Five windows of seq_len = 1024 (plus the target token) in each shard.
	write_shard "$data/fineweb10B/fineweb_train_000001.bin" $((5 * 1024 + 1))
	write_shard "$data/fineweb10B/fineweb_train_000002.bin" $((5 * 1024 + 1))
	uncommented "$data" >"$t_tmp/prefetchd.conf"
	grep -q '^pool_linger = 300$' "$t_tmp/prefetchd.conf" || die "the defaults were not uncommented"
	out=$("$daemon" --check -c "$t_tmp/prefetchd.conf" 2>"$t_tmp/err") ||
		die "--check refused it: $out $(cat "$t_tmp/err")"
	echo "$out"
	echo "$out" | grep -q '^dataset imagenet: 100 samples, 2 field(s)' &&
		echo "$out" | grep -q '^dataset fineweb: 10 samples, 1 field(s)' &&
		echo "$out" | grep -q "^config $t_tmp/prefetchd.conf: ok$" ||
		die "--check did not load both datasets"
}

check_refuses_a_mistake_in_the_example_naming_its_line() {
	sed 's/^; depth = 4$/depth = four/' "$example" >"$t_tmp/typo.conf"
	line=$(grep -n '^depth = four$' "$t_tmp/typo.conf" | cut -d: -f1)
	[ -n "$line" ] || die "the example has no '; depth = 4' line to break"
	if "$daemon" --check -c "$t_tmp/typo.conf" >/dev/null 2>"$t_tmp/err"; then
		die "--check accepted depth = four"
	fi
	grep -q "$t_tmp/typo.conf:$line: depth: 'four' is not a number" "$t_tmp/err" ||
		die "the refusal does not name the file and line: $(cat "$t_tmp/err")"
	cat "$t_tmp/err"
}

echo "[==========] Running 3 test(s)."
t_case check_reads_the_example_as_shipped_and_finds_only_missing_files
t_case check_passes_the_example_with_its_datasets_in_place
t_case check_refuses_a_mistake_in_the_example_naming_its_line
t_end
