/*
 * host_throughput.c — how fast prefetchd hands a shuffled epoch of 4 KiB rows
 * to a host consumer, as a fraction of what one thread's memcpy moves on the
 * same machine in the same run.
 *
 *   build/bench/host_throughput [--mib N] [--readers N] [--depth N] [--read mmap|pread]
 *
 * It writes a dataset of one '<u1' field whose rows are 4096 bytes of
 * npygen's formula (tools/npygen.h), reads the file once so the page cache
 * holds it, starts a real prefetchd on a temporary socket and consumes one
 * shuffled epoch in batches of 1024 rows (4 MiB) through libprefetch, the
 * way a trainer does.  The consumer reads the first 8 bytes of every row and
 * compares them with the formula for row pick % N: a figure for bytes that
 * were never delivered would be worthless, so any mismatch fails the run.
 *
 * References, measured after the daemon has stopped so that they have the
 * machine to themselves:
 *   memcpy  the same number of bytes in 4 MiB chunks, from an in-memory copy
 *           of the dataset into a ring of slot-sized buffers as large as the
 *           session's slots, one thread, best of 3.  The last line of the
 *           output is `ratio: X`, delivered GB/s over this.
 *   gather  the same shuffled rows, in the order the daemon delivered them,
 *           4 KiB memcpy per row from the in-memory copy into that ring: the
 *           daemon's work without the system calls, the socket or the
 *           hand-off.
 * GB is 10^9 bytes.  Only sample bytes count, never headers.
 *
 * DESIGN: one thread, no locks.  The daemon is a child process; this
 * process is its only consumer.  Every exit path goes through main's one
 * cleanup label, which stops the daemon and removes the temporary
 * directory (set PF_KEEP_TMP=1 to keep it).
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"
#include "npygen.h"
#include "prefetch.h"

#define ROW_BYTES    4096u
#define BATCH_ROWS   1024u
#define BATCH_BYTES  ((uint64_t)ROW_BYTES * BATCH_ROWS)
#define DATA_SEED    0x5eedULL
#define SHUFFLE_SEED 1u
#define WARMUP_SEED  2u
/* Enough batches for the pipeline to reach its steady depth and for every
 * slot to have been mapped and touched once before the timed epoch. */
#define WARMUP_BATCHES 32u
#define REF_PASSES     3
/* A pf_next that waits this long means the daemon is stuck, not slow. */
#define NEXT_TIMEOUT_MS 30000
#define DEFAULT_MIB	1024u
#define DEFAULT_DEPTH	8u

/* Keeps the reference copies observable so they cannot be optimised away. */
static volatile uint8_t sink;

static void usage(FILE *f)
{
	fprintf(f,
		"usage: host_throughput [--mib N] [--readers N] [--depth N] [--read M]\n"
		"  --mib N      dataset size in MiB (default %u; rows of %u bytes)\n"
		"  --readers N  daemon reader threads (default: online CPUs)\n"
		"  --depth N    session max_depth (default %u)\n"
		"  --read M     the daemon's read method: mmap (default) or pread\n",
		DEFAULT_MIB, ROW_BYTES, DEFAULT_DEPTH);
}

/*
 * Starts prefetchd like td_start does, but for a run by hand: the child
 * ignores SIGINT, so Ctrl-C reaches only the bench, which stops the daemon
 * through its cleanup; the wait gives up on td_interrupted; a missing
 * binary or an early exit is said on stderr.  Leaves t->pid set (td_stop /
 * td_cleanup stop it) or 0 when it never ran.
 */
static int start_daemon(struct tdaemon *t, unsigned readers, const char *read,
			uint64_t session_bytes, unsigned max_depth, const char *data_path)
{
	const char *bin = getenv("PREFETCHD_BIN") ? getenv("PREFETCHD_BIN") : "build/prefetchd";
	FILE *f = fopen(t->conf, "w");
	double deadline;
	int status;

	if (!f)
		return td_fail("%s: %s", t->conf, strerror(errno));
	fprintf(f,
		"[daemon]\nsocket = %s\nreaders = %u\nread = %s\nsession_bytes = %" PRIu64 "\n"
		"max_depth = %u\n\n[dataset.bench]\nformat = npy\nfield.rows = %s\n",
		t->sock, readers, read, session_bytes, max_depth, data_path);
	if (fclose(f) != 0)
		return td_fail("%s: %s", t->conf, strerror(errno));
	if (access(bin, X_OK) != 0)
		return td_fail("%s: %s (run from the repository root, or set PREFETCHD_BIN)", bin,
			       strerror(errno));
	t->pid = fork();
	if (t->pid < 0) {
		t->pid = 0;
		return td_fail("fork: %s", strerror(errno));
	}
	if (t->pid == 0) {
		int fd = open(t->log, O_WRONLY | O_CREAT | O_APPEND, 0644);

		/* Ctrl-C goes to the bench, which stops the daemon itself. */
		signal(SIGINT, SIG_IGN);
		if (fd >= 0) {
			dup2(fd, 2);
			close(fd);
		}
		execl(bin, bin, "-v", "-c", t->conf, (char *)NULL);
		fprintf(stderr, "exec %s: %s\n", bin, strerror(errno));
		_exit(127);
	}
	deadline = td_now() + 10;
	while (td_now() < deadline && !td_interrupted) {
		struct pf_client *c = NULL;

		if (waitpid(t->pid, &status, WNOHANG) == t->pid) {
			t->pid = 0;
			return td_fail("prefetchd exited at start (status %d)",
				       WIFEXITED(status) ? WEXITSTATUS(status) : -1);
		}
		if (pf_connect(t->sock, &c) == 0) {
			pf_close(c);
			return 0;
		}
		pf_close(c);
		usleep(10000);
	}
	return td_fail(td_interrupted ? "interrupted" : "prefetchd did not answer within 10 s");
}

struct epoch_result {
	uint64_t batches, rows;
	uint64_t mismatches;	 /* rows whose first 8 bytes were wrong */
	uint64_t first_bad_pick; /* valid when mismatches */
	double seconds;
	double wait_s, busy_s; /* pf_stats over this epoch only */
};

/*
 * Takes one shuffled epoch (or its first `limit` batches, then abandons it),
 * touching every row.  `picks` (cap rows) receives the picks in delivery
 * order when not NULL.
 */
static int run_epoch(struct pf_client *c, uint64_t seed, uint64_t limit, uint64_t rows,
		     uint64_t *picks, struct epoch_result *res)
{
	struct pf_epoch_opts eo = {.order = PF_ORDER_SHUFFLE, .seed = seed};
	struct pf_stats s0, s1;
	struct pf_batch *b;
	uint64_t expected;
	double t0;
	int rc;

	memset(res, 0, sizeof(*res));
	pf_stats(c, &s0);
	t0 = td_now();
	rc = pf_start_epoch(c, &eo, &expected);
	if (rc)
		return td_fail("pf_start_epoch: %s (%s)", pf_errmsg(c), strerror(-rc));
	while (res->batches < limit) {
		const uint8_t *base;

		if (td_interrupted)
			return td_fail("interrupted");
		rc = pf_next(c, NEXT_TIMEOUT_MS, &b);
		if (rc)
			return td_fail("pf_next after %" PRIu64 " batches: %s (%s)", res->batches,
				       pf_errmsg(c), strerror(-rc));
		if (!b)
			break;
		if (b->nfields != 1 || b->count == 0 || b->count > BATCH_ROWS ||
		    res->rows + b->count > rows) {
			rc = td_fail("batch %" PRIu64 ": %u fields, %u rows (after %" PRIu64
				     " rows)",
				     b->seq, b->nfields, b->count, res->rows);
			pf_release(c, b, NULL);
			return rc;
		}
		base = b->data[0];
		for (uint32_t k = 0; k < b->count; k++) {
			uint64_t pick = b->picks[k], got;

			memcpy(&got, base + (uint64_t)k * ROW_BYTES, sizeof(got));
			if (got == npygen_word(npygen_row_key(DATA_SEED, pick % rows), 0))
				continue;
			if (!res->mismatches)
				res->first_bad_pick = pick;
			res->mismatches++;
		}
		if (picks)
			memcpy(picks + res->rows, b->picks, b->count * sizeof(*picks));
		res->rows += b->count;
		res->batches++;
		rc = pf_release(c, b, NULL);
		if (rc)
			return td_fail("pf_release: %s (%s)", pf_errmsg(c), strerror(-rc));
	}
	res->seconds = td_now() - t0;
	if (res->batches < limit) {
		if (res->batches != expected)
			return td_fail("epoch ended after %" PRIu64 " batches; pf_start_epoch "
				       "announced %" PRIu64,
				       res->batches, expected);
	} else if (res->batches < expected) {
		rc = pf_abandon(c);
		if (rc)
			return td_fail("pf_abandon: %s (%s)", pf_errmsg(c), strerror(-rc));
	}
	pf_stats(c, &s1);
	res->wait_s = s1.wait_s - s0.wait_s;
	res->busy_s = s1.busy_s - s0.busy_s;
	return 0;
}

/* Best of REF_PASSES: copies `bytes` from src in 4 MiB chunks into the ring. */
static double ref_memcpy(const uint8_t *src, uint64_t bytes, uint8_t *ring, unsigned nslots)
{
	double best = 0;

	for (int pass = 0; pass < REF_PASSES; pass++) {
		double t0 = td_now(), dt;
		unsigned slot = 0;

		for (uint64_t off = 0; off < bytes; off += BATCH_BYTES) {
			uint64_t n = bytes - off < BATCH_BYTES ? bytes - off : BATCH_BYTES;

			memcpy(ring + (uint64_t)slot * BATCH_BYTES, src + off, n);
			sink ^= ring[(uint64_t)slot * BATCH_BYTES];
			slot = (slot + 1) % nslots;
		}
		dt = td_now() - t0;
		if (!pass || dt < best)
			best = dt;
	}
	return best;
}

/* Best of REF_PASSES: gathers rows `picks` (in order) from src into the ring,
 * BATCH_ROWS per slot. */
static double ref_gather(const uint8_t *src, const uint64_t *picks, uint64_t n, uint8_t *ring,
			 unsigned nslots)
{
	double best = 0;

	for (int pass = 0; pass < REF_PASSES; pass++) {
		double t0 = td_now(), dt;
		unsigned slot = 0;

		for (uint64_t i = 0; i < n; i += BATCH_ROWS) {
			uint8_t *dst = ring + (uint64_t)slot * BATCH_BYTES;
			uint64_t m = n - i < BATCH_ROWS ? n - i : BATCH_ROWS;

			for (uint64_t k = 0; k < m; k++)
				memcpy(dst + k * ROW_BYTES, src + picks[i + k] * ROW_BYTES,
				       ROW_BYTES);
			sink ^= dst[0];
			slot = (slot + 1) % nslots;
		}
		dt = td_now() - t0;
		if (!pass || dt < best)
			best = dt;
	}
	return best;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"mib", required_argument, NULL, 'm'},
		{"readers", required_argument, NULL, 'r'},
		{"depth", required_argument, NULL, 'd'},
		{"read", required_argument, NULL, 'R'}, /* the daemon's read = mmap | pread */
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	unsigned mib = DEFAULT_MIB, depth = DEFAULT_DEPTH, nslots;
	long online = sysconf(_SC_NPROCESSORS_ONLN);
	unsigned readers = online > 0 ? (unsigned)online : 1;
	const char *read_method = "mmap";
	struct tdaemon td = {0};
	struct pf_client *c = NULL;
	struct epoch_result warm, ep;
	uint8_t *copy = NULL, *ring = NULL;
	uint64_t *picks = NULL, rows, bytes;
	char data_path[400];
	double t_memcpy, t_gather, gbs, memcpy_gbs, gather_gbs;
	bool started = false; /* the daemon was launched: its log is worth showing */
	int opt, rc = 1, st;

	while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (opt) {
		case 'm':
			if (td_parse_uint("--mib", optarg, 4, 1u << 20, &mib))
				return 2;
			break;
		case 'r':
			if (td_parse_uint("--readers", optarg, 1, 256, &readers))
				return 2;
			break;
		case 'd':
			if (td_parse_uint("--depth", optarg, 1, 4096, &depth))
				return 2;
			break;
		case 'R':
			if (strcmp(optarg, "mmap") != 0 && strcmp(optarg, "pread") != 0) {
				td_fail("--read: expected mmap or pread, got '%s'", optarg);
				return 2;
			}
			read_method = optarg;
			break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (optind != argc) {
		usage(stderr);
		return 2;
	}
	td_catch_signals();

	rows = (uint64_t)mib * (1u << 20) / ROW_BYTES;
	bytes = rows * ROW_BYTES;
	/* The session's slots: max_depth in flight plus what the consumer may
	 * hold (sess.h's SESS_HOLD_SLOTS = 2).  The reference ring has as many. */
	nslots = depth + 2;
	td_print_machine(online);
	printf("dataset: %" PRIu64 " rows x %u B = %u MiB, one '<u1' field; batch %u rows "
	       "(%.0f MiB); readers %u (read = %s), max_depth %u\n",
	       rows, ROW_BYTES, mib, BATCH_ROWS, BATCH_BYTES / 1048576.0, readers, read_method,
	       depth);
	fflush(stdout);

	copy = malloc(bytes);
	ring = malloc((uint64_t)nslots * BATCH_BYTES);
	picks = malloc(rows * sizeof(*picks));
	if (!copy || !ring || !picks) {
		td_fail("cannot allocate %.0f MiB for the in-memory copy and references",
			(bytes + nslots * BATCH_BYTES + rows * 8) / 1048576.0);
		goto out;
	}
	/* Faulted in now so that no reference pays for its first touch. */
	memset(ring, 0, (uint64_t)nslots * BATCH_BYTES);

	if (td_bench_dataset(
		    &td, &(struct td_rows){.rows = rows, .row_bytes = ROW_BYTES, .seed = DATA_SEED},
		    data_path, sizeof(data_path), copy, bytes))
		goto out;

	/* Twice the slots it needs, so a session of this depth is never
	 * trimmed by session_bytes. */
	started = true;
	if (start_daemon(&td, readers, read_method, 2 * (uint64_t)nslots * BATCH_BYTES, depth,
			 data_path))
		goto out;
	st = pf_connect(td.sock, &c);
	if (st) {
		td_fail("pf_connect %s: %s (%s)", td.sock, pf_errmsg(c), strerror(-st));
		goto out;
	}
	st = pf_open(c, &(struct pf_open_opts){.dataset = "bench",
					       .batch_size = BATCH_ROWS,
					       .max_depth = depth,
					       .name = "host_throughput"});
	if (st) {
		td_fail("pf_open: %s (%s)", pf_errmsg(c), strerror(-st));
		goto out;
	}
	if (pf_num_samples(c) != rows || pf_num_fields(c) != 1) {
		td_fail("daemon serves %" PRIu64 " samples in %u fields; wrote %" PRIu64 " in 1",
			pf_num_samples(c), pf_num_fields(c), rows);
		goto out;
	}

	/* Not timed: maps the arenas, touches every slot, wakes the readers. */
	if (run_epoch(c, WARMUP_SEED, WARMUP_BATCHES, rows, NULL, &warm))
		goto out;
	if (warm.mismatches) {
		td_fail("warm-up: %" PRIu64 " rows had wrong bytes (first: pick %" PRIu64 ")",
			warm.mismatches, warm.first_bad_pick);
		goto out;
	}
	if (run_epoch(c, SHUFFLE_SEED, UINT64_MAX, rows, picks, &ep))
		goto out;
	if (ep.mismatches) {
		td_fail("%" PRIu64 " of %" PRIu64 " delivered rows had wrong bytes (first: pick "
			"%" PRIu64 ")",
			ep.mismatches, ep.rows, ep.first_bad_pick);
		goto out;
	}
	if (!td_is_permutation(picks, ep.rows, rows)) {
		td_fail("the epoch did not deliver every row exactly once (%" PRIu64 " rows taken)",
			ep.rows);
		goto out;
	}
	pf_close(c);
	c = NULL;
	st = td_stop(&td, 10000);
	if (st != 0) {
		td_fail("prefetchd did not exit cleanly on SIGTERM (status %d)", st);
		goto out;
	}

	t_memcpy = ref_memcpy(copy, bytes, ring, nslots);
	t_gather = ref_gather(copy, picks, rows, ring, nslots);
	gbs = bytes / 1e9 / ep.seconds;
	memcpy_gbs = bytes / 1e9 / t_memcpy;
	gather_gbs = bytes / 1e9 / t_gather;

	printf("checked: first 8 bytes of all %" PRIu64 " delivered rows match npygen, each row "
	       "once\n",
	       ep.rows);
	printf("consumer: waited %.3f s in pf_next, busy %.3f s between calls\n", ep.wait_s,
	       ep.busy_s);
	printf("\n%-28s %8s %11s %7s %9s\n", "", "GB/s", "batches/s", "stall", "seconds");
	printf("%-28s %8.2f %11.1f %7.3f %9.3f\n", "prefetchd delivered", gbs,
	       ep.batches / ep.seconds,
	       ep.wait_s + ep.busy_s > 0 ? ep.wait_s / (ep.wait_s + ep.busy_s) : 0.0, ep.seconds);
	printf("%-28s %8.2f %11.1f %7s %9.3f\n", "memcpy 4 MiB, 1 thread", memcpy_gbs,
	       ep.batches / t_memcpy, "-", t_memcpy);
	printf("%-28s %8.2f %11.1f %7s %9.3f\n", "gather 4 KiB rows, 1 thread", gather_gbs,
	       ep.batches / t_gather, "-", t_gather);
	printf("ratio: %.2f\n", gbs / memcpy_gbs);
	rc = 0;
out:
	pf_close(c);
	td_bench_end(&td, rc && started);
	free(copy);
	free(ring);
	free(picks);
	return rc;
}
