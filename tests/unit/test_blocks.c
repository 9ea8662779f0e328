/*
 * test_blocks.c — the block cache of block-shuffled direct epochs
 * (daemon/data/blocks.c): every row served from a block read once, whole, by
 * several reader threads at once; each block's memory gone after its last
 * row; a block that cannot be read fails the rows that need it, with the
 * reason, and nothing else.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/blocks.h"
#include "conf/config.h"
#include "data/dataset.h"
#include "npygen.h"
#include "testutil.h"

#define N	   5000u
#define X_BYTES	   1000u /* two fields, neither a multiple of a block */
#define Y_BYTES	   8u
#define SEED_X	   41u
#define SEED_Y	   42u
#define BLOCK	   256u
#define THREADS	   4
#define PER_THREAD 50u /* batches of 100 rows each thread fills */
#define BATCH	   100u

static struct {
	char dir[64];
	char *paths[2];
	struct config_field fields[2];
	struct config_dataset decl;
	struct dataset ds;
} g;

static int group_setup(void **state)
{
	static const char *names[2] = {"x", "y"};
	static const uint64_t x_shape[1] = {X_BYTES};

	(void)state;
	strcpy(g.dir, "/tmp/test_blocks.XXXXXX");
	if (!mkdtemp(g.dir))
		return -1;
	for (int i = 0; i < 2; i++) {
		if (asprintf(&g.paths[i], "%s/%s.npy", g.dir, names[i]) < 0)
			return -1;
		g.fields[i] = (struct config_field){(char *)names[i], &g.paths[i], 1};
	}
	if (td_write_npy(g.paths[0], 1, "|u1", 1, N, x_shape, 1, SEED_X, 0) ||
	    td_write_npy(g.paths[1], 1, "<u8", 8, N, NULL, 0, SEED_Y, 0))
		return -1;
	g.decl = (struct config_dataset){.name = "ds",
					 .format = "npy",
					 .fields = g.fields,
					 .nfields = 2,
					 .read = CONFIG_READ_DIRECT};
	if (ds_load(&g.ds, &g.decl) || !g.ds.fields[0].direct)
		return -1;
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	ds_close(&g.ds);
	for (int i = 0; i < 2; i++) {
		unlink(g.paths[i]);
		free(g.paths[i]);
	}
	rmdir(g.dir);
	return 0;
}

/* An epoch as a block_shuffle gives it, made here: blocks in a shuffled
 * order, rows shuffled inside windows of 4 blocks. */
static uint64_t *make_epoch(uint64_t seed)
{
	uint64_t nb = (N + BLOCK - 1) / BLOCK, *order = malloc(nb * sizeof(*order));
	uint64_t *picks = malloc(N * sizeof(*picks)), at = 0, x = seed;

	assert_true(order && picks);
	for (uint64_t j = 0; j < nb; j++)
		order[j] = j;
	for (uint64_t j = nb - 1; j > 0; j--) {
		uint64_t k = npygen_mix(++x) % (j + 1), t = order[j];

		order[j] = order[k];
		order[k] = t;
	}
	for (uint64_t w = 0; w < nb; w += 4) {
		uint64_t from = at;

		for (uint64_t j = w; j < w + 4 && j < nb; j++)
			for (uint64_t s = order[j] * BLOCK; s < (order[j] + 1) * BLOCK && s < N;
			     s++)
				picks[at++] = s;
		for (uint64_t i = at - from - 1; i > 0; i--) {
			uint64_t k = npygen_mix(++x) % (i + 1), t = picks[from + i];

			picks[from + i] = picks[from + k];
			picks[from + k] = t;
		}
	}
	assert_int_equal(at, N);
	free(order);
	return picks;
}

static uint32_t *count_uses(const uint64_t *picks, uint64_t n)
{
	uint32_t *uses = calloc((N + BLOCK - 1) / BLOCK, sizeof(*uses));

	assert_non_null(uses);
	for (uint64_t i = 0; i < n; i++)
		uses[picks[i] / BLOCK]++;
	return uses;
}

struct filler {
	struct blocks *b;
	const uint64_t *picks;
	unsigned index;
	int rc;
	char why[300];
};

/* Fills this thread's batches (every THREADS-th one) and checks each row. */
static void *filler_main(void *arg)
{
	struct filler *fl = arg;
	uint64_t off[2] = {0, (uint64_t)BATCH * X_BYTES};
	uint8_t *slot = malloc((uint64_t)BATCH * (X_BYTES + Y_BYTES));
	uint64_t samples[BATCH];

	for (unsigned k = fl->index; k < N / BATCH && !fl->rc; k += THREADS) {
		/* A job covers the second half of its batch first, as a split
		 * batch's parts may. */
		memcpy(samples, fl->picks + (uint64_t)k * BATCH, sizeof(samples));
		fl->rc = blocks_read(fl->b, samples + BATCH / 2, BATCH / 2, slot, off, BATCH / 2,
				     fl->why, sizeof(fl->why));
		if (!fl->rc)
			fl->rc = blocks_read(fl->b, samples, BATCH / 2, slot, off, 0, fl->why,
					     sizeof(fl->why));
		for (uint32_t i = 0; i < BATCH && !fl->rc; i++)
			if (!td_row_ok(slot + i * X_BYTES, X_BYTES, SEED_X, samples[i]) ||
			    !td_row_ok(slot + off[1] + i * Y_BYTES, Y_BYTES, SEED_Y, samples[i])) {
				snprintf(fl->why, sizeof(fl->why),
					 "batch %u row %u (sample %llu) wrong", k, i,
					 (unsigned long long)samples[i]);
				fl->rc = -1;
			}
	}
	free(slot);
	return NULL;
}

static void every_row_comes_from_a_block_read_once_by_readers_at_once(void **state)
{
	uint64_t *picks = make_epoch(7), loads, held, peak;
	struct blocks *b = blocks_new(&g.ds, BLOCK, count_uses(picks, N));
	struct filler fl[THREADS];
	pthread_t t[THREADS];

	(void)state;
	assert_non_null(b);
	for (unsigned i = 0; i < THREADS; i++) {
		fl[i] = (struct filler){.b = blocks_ref(b), .picks = picks, .index = i};
		assert_int_equal(pthread_create(&t[i], NULL, filler_main, &fl[i]), 0);
	}
	for (unsigned i = 0; i < THREADS; i++) {
		pthread_join(t[i], NULL);
		if (fl[i].rc)
			fail_msg("thread %u: %s", i, fl[i].why);
		blocks_put(fl[i].b);
	}
	blocks_stats(b, &loads, &held, &peak);
	print_message("%llu blocks read for %u rows; peak %.1f KiB held (dataset %.1f KiB)\n",
		      (unsigned long long)loads, N, peak / 1024.0,
		      N * (X_BYTES + Y_BYTES) / 1024.0);
	/* Each block once; all gone at the end; never much more than the
	 * windows in flight (4 threads x a window of 4 blocks, and the next). */
	assert_int_equal(loads, (N + BLOCK - 1) / BLOCK);
	assert_int_equal(held, 0);
	assert_true(peak <= 2ull * THREADS * 4 * BLOCK * (X_BYTES + Y_BYTES));
	blocks_put(b);
	free(picks);
}

static void a_block_that_cannot_be_read_fails_the_rows_that_need_it_and_no_other(void **state)
{
	uint64_t picks[4] = {0, 1, N - 1, N - 2}, off[2] = {0, 4 * X_BYTES};
	uint32_t *uses = calloc((N + BLOCK - 1) / BLOCK, sizeof(*uses));
	uint8_t slot[4 * (X_BYTES + Y_BYTES)];
	struct blocks *b;
	char err[300] = "";

	(void)state;
	assert_non_null(uses);
	uses[0] = 2;
	uses[(N - 1) / BLOCK] = 2;
	b = blocks_new(&g.ds, BLOCK, uses);
	assert_non_null(b);
	assert_int_equal(blocks_read(b, picks, 2, slot, off, 0, err, sizeof(err)), 0);
	/* The last block's rows are cut off the file. */
	assert_int_equal(truncate(g.paths[0], 128 + (uint64_t)(N - 10) * X_BYTES), 0);
	assert_int_not_equal(blocks_read(b, picks + 2, 2, slot, off, 2, err, sizeof(err)), 0);
	print_message("the cut block: %s\n", err);
	assert_non_null(strstr(err, "x.npy"));
	/* The first block was whole and read: its rows are right. */
	assert_true(td_row_ok(slot, X_BYTES, SEED_X, 0));
	assert_true(td_row_ok(slot + X_BYTES, X_BYTES, SEED_X, 1));
	blocks_put(b);

	/* A job that fails on one block counts its other rows off too, and a
	 * batch that is never read (blocks_skip) does: nothing stays held. */
	{
		uint64_t job[2] = {5, N - 1}, other[1] = {6}, skipped[1] = {2 * BLOCK + 1};
		uint64_t loads, held, peak;

		uses = calloc((N + BLOCK - 1) / BLOCK, sizeof(*uses));
		assert_non_null(uses);
		uses[0] = 2;
		uses[2] = 1;
		uses[(N - 1) / BLOCK] = 1;
		b = blocks_new(&g.ds, BLOCK, uses);
		assert_non_null(b);
		assert_int_not_equal(blocks_read(b, job, 2, slot, off, 0, err, sizeof(err)), 0);
		assert_int_equal(blocks_read(b, other, 1, slot, off, 0, err, sizeof(err)), 0);
		assert_true(td_row_ok(slot, X_BYTES, SEED_X, 6));
		blocks_skip(b, skipped, 1);
		blocks_stats(b, &loads, &held, &peak);
		print_message("after a failed job: %llu block(s) read, %llu bytes held\n",
			      (unsigned long long)loads, (unsigned long long)held);
		assert_int_equal(held, 0);
		assert_true(peak > 0);
		blocks_put(b);
	}
	/* Restore the file for any later case. */
	assert_int_equal(
		td_write_npy(g.paths[0], 1, "|u1", 1, N, (uint64_t[]){X_BYTES}, 1, SEED_X, 0), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(every_row_comes_from_a_block_read_once_by_readers_at_once),
		cmocka_unit_test(
			a_block_that_cannot_be_read_fails_the_rows_that_need_it_and_no_other),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
