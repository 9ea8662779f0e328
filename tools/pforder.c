/*
 * pforder.c — prints epoch orders as the daemon builds them (daemon/order/order.c),
 * so that other implementations can be checked against the real one
 * (tests/python/test_order.py checks python/prefetch/order.py).
 *
 *   build/pforder < cases
 *
 * Each input line is one case:
 *
 *   SEED N RANK WORLD
 *       a shuffle of N picks; the output line is that share's picks,
 *       space-separated.
 *   block SEED N AUGMENT SAMPLE_BYTES BLOCK_ROWS BLOCK_BYTES WINDOW RANK WORLD
 *         BATCH DROP_LAST START_BATCH
 *       a block_shuffle epoch as StartEpoch asks for it (BLOCK_ROWS,
 *       BLOCK_BYTES and WINDOW as on the wire, 0 for "not set") over a
 *       dataset of N samples of SAMPLE_BYTES; the output line is `B W`, the
 *       block size and window the daemon resolved, then for every batch the
 *       epoch delivers from START_BATCH on ` |` and its picks.
 *
 * A case that the daemon refuses prints `error: MESSAGE`.
 *
 * DESIGN: one thread, reads stdin to its end.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "order/order.h"

static void print_picks(const uint64_t *picks, uint64_t n)
{
	for (uint64_t i = 0; i < n; i++)
		printf(i ? " %" PRIu64 : "%" PRIu64, picks[i]);
}

static void shuffle_case(uint64_t seed, uint64_t n, unsigned rank, unsigned world)
{
	struct order_spec spec = {
		.kind = ORDER_SHUFFLE, .seed = seed, .rank = rank, .world = world};
	uint64_t *picks = NULL, npicks = 0;
	char err[200] = "";

	if (order_build(&spec, n, &picks, &npicks, err, sizeof(err))) {
		printf("error: %s\n", err);
		return;
	}
	print_picks(picks, npicks);
	putchar('\n');
	free(picks);
}

/* What sess_start_epoch and the pump do with a block_shuffle StartEpoch:
 * resolve B and W, build the share, deliver its batches from start_batch. */
static void block_case(const char *line)
{
	uint64_t seed, n, sample_bytes, block_rows, block_bytes, window, start_batch;
	unsigned augment, rank, world, batch, drop_last;
	struct order_spec spec = {.kind = ORDER_BLOCK_SHUFFLE};
	uint64_t *picks = NULL, npicks = 0, first, count;
	char err[200] = "";
	bool clamped;

	if (sscanf(line,
		   "block %" SCNu64 " %" SCNu64 " %u %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64
		   " %u %u %u %u %" SCNu64,
		   &seed, &n, &augment, &sample_bytes, &block_rows, &block_bytes, &window, &rank,
		   &world, &batch, &drop_last, &start_batch) != 12 ||
	    batch == 0) {
		printf("error: cannot read the case\n");
		return;
	}
	spec.seed = seed;
	spec.rank = rank;
	spec.world = world;
	spec.samples = n;
	if (order_block_params(block_rows, block_bytes, window, n, augment, sample_bytes,
			       &spec.block_rows, &spec.window_blocks, &clamped, err, sizeof(err)) ||
	    order_build(&spec, n * (augment ? augment : 1), &picks, &npicks, err, sizeof(err))) {
		printf("error: %s\n", err);
		return;
	}
	if (start_batch > order_num_batches(npicks, batch, drop_last)) {
		printf("error: start_batch %" PRIu64 " is beyond the share\n", start_batch);
		free(picks);
		return;
	}
	order_served(npicks, batch, drop_last, start_batch, &first, &count);
	printf("%" PRIu64 " %" PRIu64, spec.block_rows, spec.window_blocks);
	for (uint64_t k = 0; k < count; k += batch) {
		printf(" | ");
		print_picks(picks + first + k, count - k < batch ? count - k : batch);
	}
	putchar('\n');
	free(picks);
}

int main(void)
{
	char *line = NULL;
	size_t cap = 0;

	while (getline(&line, &cap, stdin) > 0) {
		uint64_t seed, n;
		unsigned rank, world;

		if (!strncmp(line, "block ", 6))
			block_case(line);
		else if (sscanf(line, "%" SCNu64 " %" SCNu64 " %u %u", &seed, &n, &rank, &world) ==
			 4)
			shuffle_case(seed, n, rank, world);
		else if (line[strspn(line, " \t\n")])
			printf("error: cannot read the case\n");
	}
	free(line);
	return ferror(stdout) ? 1 : 0;
}
