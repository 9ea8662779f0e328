/*
 * bystander_main.c — the bystander of tests/lib/bystander.c as a program,
 * for the tests that are not written in C (tests/python/pfutil.py): the
 * same innocent trainer and status watcher that the C cases run beside an
 * attack, with its verdict as an exit status.
 *
 *   bystander write OUT.npy ROWS ROW_BYTES SEED
 *   bystander run SOCKET DATASET BATCH ROW_BYTES SEED
 *
 * write: the dataset a bystander checks, one '|u1' field of ROW_BYTES a
 * row holding td_write_npy's bytes under SEED, for the test to declare in
 * its daemon's config.
 *
 * run: starts the bystander on DATASET of the daemon at SOCKET and prints
 * "bystander: started" once its connections and session are open (or
 * failed to open: the report then says so, and the exit status is 1); runs
 * until its stdin ends (the test closes it, or dies) or a SIGINT or
 * SIGTERM; then prints the report line and exits 0 when every epoch was
 * byte-exact and every status answered within TD_STATUS_MAX_MS, 1 when
 * not (the line says what went wrong first), 2 on a usage error.
 *
 * DESIGN: the main thread waits on stdin and the signals; the bystander's
 * two threads are its own (bystander.c).  A process of its own, not a
 * Python thread: a thread of the test's interpreter would time status
 * through the interpreter's lock, held by the case it watches.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

static int usage(void)
{
	fprintf(stderr, "usage: bystander write OUT.npy ROWS ROW_BYTES SEED\n"
			"       bystander run SOCKET DATASET BATCH ROW_BYTES SEED\n");
	return 2;
}

static int write_rows(char **argv)
{
	unsigned rows, row_bytes, seed;
	uint64_t shape[1];
	int rc;

	if (td_parse_uint("ROWS", argv[1], 1, 1u << 30, &rows) ||
	    td_parse_uint("ROW_BYTES", argv[2], 1, 1u << 20, &row_bytes) ||
	    td_parse_uint("SEED", argv[3], 0, ~0u, &seed))
		return 2;
	shape[0] = row_bytes;
	rc = td_write_npy(argv[0], 1, "|u1", 1, rows, shape, 1, seed, 0);
	if (rc) {
		td_fail("%s: %s", argv[0], strerror(-rc));
		return 1;
	}
	return 0;
}

/* Until stdin ends or a signal comes.  The poll's timeout bounds the wait
 * of a signal that lands between the check of td_interrupted and the
 * poll, which then sleeps through it. */
static void wait_for_the_end(void)
{
	char buf[256];

	while (!td_interrupted) {
		struct pollfd p = {.fd = 0, .events = POLLIN};
		int n = poll(&p, 1, 100);
		ssize_t got;

		if (n < 0 && errno != EINTR)
			return;
		if (n <= 0)
			continue;
		got = read(0, buf, sizeof(buf));
		if (got == 0 || (got < 0 && errno != EINTR))
			return;
	}
}

static int run(char **argv)
{
	struct td_bystander_report r;
	struct td_bystander *b;
	unsigned batch, row_bytes, seed;
	int rc;

	if (td_parse_uint("BATCH", argv[2], 1, 1u << 20, &batch) ||
	    td_parse_uint("ROW_BYTES", argv[3], 1, 1u << 20, &row_bytes) ||
	    td_parse_uint("SEED", argv[4], 0, ~0u, &seed))
		return 2;
	/* A daemon that dies under the bystander is an EPIPE in its report,
	 * not the end of this process before it could say so. */
	td_catch_signals();
	b = td_bystander_start(argv[0], argv[1], batch, row_bytes, seed);
	if (!b) {
		td_fail("cannot start the bystander's threads");
		return 1;
	}
	printf("bystander: started on %s, dataset %s\n", argv[0], argv[1]);
	fflush(stdout);
	wait_for_the_end();
	rc = td_bystander_stop(b, &r);
	printf("bystander: %llu epochs, %llu batches, %llu statuses, slowest %.1f ms (at %.3f "
	       "s)%s%s\n",
	       (unsigned long long)r.epochs, (unsigned long long)r.batches,
	       (unsigned long long)r.statuses, r.max_status_ms, r.max_status_at,
	       r.error[0] ? ": " : "", r.error);
	fflush(stdout);
	return rc == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
	if (argc == 6 && !strcmp(argv[1], "write"))
		return write_rows(argv + 2);
	if (argc == 7 && !strcmp(argv[1], "run"))
		return run(argv + 2);
	return usage();
}
