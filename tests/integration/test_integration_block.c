/*
 * test_integration_block.c — block_shuffle epochs through a real prefetchd
 * and the real client library.
 *
 * Every delivered sample is checked byte for byte against npygen's formula,
 * every epoch against the order the daemon's own order.c builds for it (so
 * the wire, the daemon's resolution of the block size and the batching are
 * what is tested; order.c itself is checked in test_order.c and against the
 * Python reference), and bad block options must be refused by name while
 * the same daemon goes on serving.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block_order.h"
#include "order/order.h"
#include "prefetch.h"
#include "testutil.h"

/* Not a multiple of any block size below, so every epoch has short blocks. */
#define N_DATA 1003
#define SEED_X 101
#define SEED_Y 202
/* x: f4 (3,) rows (12 bytes), y: i8 (8 bytes). */
#define SAMPLE_BYTES 20

static struct tdaemon td;

static const char *DATASETS = "[dataset.blocks]\n"
			      "format = npy\n"
			      "field.x = x0.npy, x1.npy\n"
			      "field.y = y.npy\n"
			      "[dataset.tiny]\n"
			      "field.y = ty.npy\n"
			      "[dataset.direct]\n"
			      "field.x = x0.npy, x1.npy\n"
			      "field.y = y.npy\n"
			      "read = direct\n";

static int setup(void **state)
{
	uint64_t xs[1] = {3};
	char p[400];

	if (td_init(&td, "block"))
		return -1;
	td_path(&td, "x0.npy", p, sizeof(p));
	td_write_npy(p, 1, "<f4", 4, 600, xs, 1, SEED_X, 0);
	td_path(&td, "x1.npy", p, sizeof(p));
	td_write_npy(p, 1, "<f4", 4, N_DATA - 600, xs, 1, SEED_X, 600);
	td_path(&td, "y.npy", p, sizeof(p));
	td_write_npy(p, 1, "<i8", 8, N_DATA, NULL, 0, SEED_Y, 0);
	td_path(&td, "ty.npy", p, sizeof(p));
	td_write_npy(p, 1, "<i8", 8, 10, NULL, 0, SEED_Y, 0);
	if (td_start(&td, "", DATASETS))
		return -1;
	(void)state;
	return 0;
}

static int teardown(void **state)
{
	int rc = td_stop(&td, 5000);

	td_cleanup(&td);
	(void)state;
	return rc == 0 ? 0 : -1;
}

static uint64_t field_seed(const char *name)
{
	return strcmp(name, "x") ? SEED_Y : SEED_X;
}

static void verify_batch(struct pf_client *c, const struct pf_batch *b)
{
	char why[300];

	assert_int_equal(b->nfields, pf_num_fields(c));
	if (!td_batch_ok(c, b, field_seed, why, sizeof(why)))
		fail_msg("%s", why);
}

struct run {
	uint64_t *picks; /* owned: in delivery order */
	uint64_t npicks, batches, announced;
};

static struct pf_client *open_client(const char *dataset, uint32_t batch, uint32_t augment)
{
	struct pf_open_opts oo = {.dataset = dataset, .batch_size = batch, .augment = augment};
	struct pf_client *c = NULL;

	assert_int_equal(pf_connect(td.sock, &c), 0);
	if (pf_open(c, &oo))
		fail_msg("pf_open: %s", pf_errmsg(c));
	return c;
}

/* Starts eo on c and takes up to stop_after batches, each checked byte for
 * byte and released. */
static void take_epoch(struct pf_client *c, const struct pf_epoch_opts *eo, uint64_t stop_after,
		       struct run *out)
{
	uint64_t room = pf_num_samples(c) * 4 + 64; /* augment <= 4 here */
	struct pf_batch *b;
	int rc;

	memset(out, 0, sizeof(*out));
	out->picks = malloc(room * sizeof(uint64_t));
	assert_non_null(out->picks);
	rc = pf_start_epoch(c, eo, &out->announced);
	if (rc)
		fail_msg("pf_start_epoch: %s", pf_errmsg(c));
	while (out->batches < stop_after) {
		rc = pf_next(c, 10000, &b);
		if (rc)
			fail_msg("pf_next: %d %s", rc, pf_errmsg(c));
		if (!b)
			break;
		assert_int_equal(b->seq, eo->start_batch + out->batches);
		verify_batch(c, b);
		assert_true(out->npicks + b->count <= room);
		memcpy(out->picks + out->npicks, b->picks, b->count * sizeof(uint64_t));
		out->npicks += b->count;
		out->batches++;
		assert_int_equal(pf_release(c, b, NULL), 0);
	}
}

static void run_epoch(const char *dataset, uint32_t batch, uint32_t augment,
		      const struct pf_epoch_opts *eo, uint64_t stop_after, struct run *out)
{
	struct pf_client *c = open_client(dataset, batch, augment);

	take_epoch(c, eo, stop_after, out);
	pf_close(c);
}

static void assert_each_once(const uint64_t *picks, uint64_t n, uint64_t space)
{
	unsigned char *seen = calloc(space, 1);

	for (uint64_t i = 0; i < n; i++) {
		assert_true(picks[i] < space);
		if (seen[picks[i]])
			fail_msg("pick %llu delivered twice", (unsigned long long)picks[i]);
		seen[picks[i]] = 1;
	}
	free(seen);
}

static void block_epoch_is_the_documented_vector(void **state)
{
	/* docs/SHUFFLE.md: N = 10, B = 3, W = 2, seed 42. */
	static const uint64_t want[10] = {0, 1, 7, 8, 2, 6, 9, 5, 4, 3};
	struct pf_epoch_opts eo = {
		.order = PF_ORDER_BLOCK_SHUFFLE, .seed = 42, .block_rows = 3, .window_blocks = 2};
	struct run r;

	run_epoch("tiny", 4, 1, &eo, UINT64_MAX, &r);
	assert_int_equal(r.npicks, 10);
	assert_int_equal(r.batches, 3);
	assert_memory_equal(r.picks, want, sizeof(want));
	free(r.picks);
}

static void one_rank_gets_every_pick_once_in_the_built_order(void **state)
{
	struct pf_epoch_opts eo = {
		.order = PF_ORDER_BLOCK_SHUFFLE, .seed = 7, .block_rows = 50, .window_blocks = 4};
	uint64_t n, *want = td_block_order(N_DATA, 1, 50, 4, 7, 0, 1, &n);
	struct run r;

	run_epoch("blocks", 64, 1, &eo, UINT64_MAX, &r);
	assert_int_equal(r.announced, (N_DATA + 63) / 64);
	assert_int_equal(r.batches, r.announced);
	assert_int_equal(r.npicks, N_DATA);
	assert_memory_equal(r.picks, want, n * sizeof(*want));
	assert_each_once(r.picks, r.npicks, N_DATA);
	free(want);
	free(r.picks);
}

/* read = direct: the same epochs through the block cache, over 1 rank and
 * 4 ranks with a resume; one rank's whole epoch reads each block once. */
static void direct_reads_serve_block_epochs_from_blocks_read_once(void **state)
{
	enum { WORLD = 4, BATCH = 16, K = 5 };
	struct pf_epoch_opts eo = {
		.order = PF_ORDER_BLOCK_SHUFFLE, .seed = 7, .block_rows = 50, .window_blocks = 4};
	uint64_t n, *want = td_block_order(N_DATA, 1, 50, 4, 7, 0, 1, &n);
	unsigned hits[N_DATA] = {0};
	struct pf_client *c = open_client("direct", 64, 1);
	Pf__SessionStatus *ss;
	struct pf_stats ps;
	Pf__Envelope *st;
	struct run r;

	take_epoch(c, &eo, UINT64_MAX, &r);
	assert_int_equal(r.npicks, N_DATA);
	assert_memory_equal(r.picks, want, n * sizeof(*want));
	st = td_status(td.sock);
	assert_non_null(st);
	assert_int_equal(pf_stats(c, &ps), 0);
	ss = td_session(st, ps.session);
	assert_non_null(ss);
	print_message("direct, 1 rank: %llu blocks read for %d rows, cache peak %llu bytes, "
		      "%llu held at the end\n",
		      (unsigned long long)ss->blocks_read, N_DATA,
		      (unsigned long long)ss->block_cache_peak,
		      (unsigned long long)ss->block_cache_bytes);
	assert_int_equal(ss->blocks_read, (N_DATA + 49) / 50);
	assert_int_equal(ss->block_cache_bytes, 0);
	assert_true(ss->block_cache_peak > 0);
	pf__envelope__free_unpacked(st, NULL);
	pf_close(c);
	free(want);
	free(r.picks);

	/* 4 ranks, rank 2 resumed at batch K from a new client. */
	eo = (struct pf_epoch_opts){.order = PF_ORDER_BLOCK_SHUFFLE,
				    .seed = 8,
				    .block_rows = 40,
				    .window_blocks = 5,
				    .world = WORLD};
	for (uint32_t rank = 0; rank < WORLD; rank++) {
		uint64_t m, *share = td_block_order(N_DATA, 1, 40, 5, 8, rank, WORLD, &m);
		struct run a, b;

		eo.rank = rank;
		eo.start_batch = 0;
		run_epoch("direct", BATCH, 1, &eo, rank == 2 ? K : UINT64_MAX, &a);
		if (rank == 2) {
			eo.start_batch = K;
			run_epoch("direct", BATCH, 1, &eo, UINT64_MAX, &b);
			assert_int_equal(a.npicks + b.npicks, m);
			assert_memory_equal(a.picks, share, a.npicks * sizeof(*share));
			assert_memory_equal(b.picks, share + a.npicks, b.npicks * sizeof(*share));
			for (uint64_t i = 0; i < b.npicks; i++)
				hits[b.picks[i]]++;
			free(b.picks);
		} else {
			assert_int_equal(a.npicks, m);
			assert_memory_equal(a.picks, share, m * sizeof(*share));
		}
		for (uint64_t i = 0; i < a.npicks; i++)
			hits[a.picks[i]]++;
		free(a.picks);
		free(share);
	}
	/* 1003 over 4 ranks: one pick twice (the padded list's head), the
	 * rest once. */
	{
		unsigned twice = 0;

		for (int i = 0; i < N_DATA; i++) {
			assert_true(hits[i] == 1 || hits[i] == 2);
			twice += hits[i] == 2;
		}
		assert_int_equal(twice, 1);
	}
}

static void augmented_epoch_reads_each_sample_once_per_copy(void **state)
{
	struct pf_epoch_opts eo = {
		.order = PF_ORDER_BLOCK_SHUFFLE, .seed = 99, .block_rows = 64, .window_blocks = 3};
	uint64_t n, *want = td_block_order(N_DATA, 3, 64, 3, 99, 0, 1, &n);
	unsigned per_sample[N_DATA] = {0};
	struct run r;

	run_epoch("blocks", 100, 3, &eo, UINT64_MAX, &r);
	assert_int_equal(r.npicks, 3 * N_DATA);
	assert_memory_equal(r.picks, want, n * sizeof(*want));
	assert_each_once(r.picks, r.npicks, 3 * N_DATA);
	for (uint64_t i = 0; i < r.npicks; i++)
		per_sample[r.picks[i] % N_DATA]++;
	for (int i = 0; i < N_DATA; i++)
		assert_int_equal(per_sample[i], 3);
	free(want);
	free(r.picks);
}

static void four_ranks_cover_the_padded_list_and_resume_exactly(void **state)
{
	/* 1003 picks over 4 ranks: 251 each, 1004 in all; the padded list's
	 * last entry is its first, delivered twice in the epoch. */
	enum { WORLD = 4, BATCH = 16, K = 5 };
	uint64_t len, *list = td_block_order(N_DATA, 1, 40, 5, 31337, 0, 1, &len);
	unsigned hits[N_DATA] = {0};
	struct pf_client *c[WORLD];
	struct run r[WORLD];

	/* Four ranks at once on one daemon, each its whole share. */
	for (uint32_t k = 0; k < WORLD; k++)
		c[k] = open_client("blocks", BATCH, 1);
	for (uint32_t k = 0; k < WORLD; k++) {
		struct pf_epoch_opts eo = {.order = PF_ORDER_BLOCK_SHUFFLE,
					   .seed = 31337,
					   .rank = k,
					   .world = WORLD,
					   .block_bytes = 40 * SAMPLE_BYTES + 19, /* B = 40 */
					   .window_blocks = 5};

		take_epoch(c[k], &eo, UINT64_MAX, &r[k]);
		assert_int_equal(r[k].npicks, 251);
		for (uint64_t i = 0; i < r[k].npicks; i++) {
			assert_int_equal(r[k].picks[i], list[(k + i * WORLD) % N_DATA]);
			hits[r[k].picks[i]]++;
		}
	}
	for (int i = 0; i < N_DATA; i++)
		assert_int_equal(hits[i], (uint64_t)i == list[0] ? 2 : 1);

	/* Rank 2 stops after K batches; a new client resumes at K and gets
	 * exactly the rest. */
	{
		struct pf_epoch_opts eo = {.order = PF_ORDER_BLOCK_SHUFFLE,
					   .seed = 31337,
					   .rank = 2,
					   .world = WORLD,
					   .block_rows = 40,
					   .window_blocks = 5};
		struct run head, rest;

		run_epoch("blocks", BATCH, 1, &eo, K, &head);
		assert_int_equal(head.batches, K);
		eo.start_batch = K;
		run_epoch("blocks", BATCH, 1, &eo, UINT64_MAX, &rest);
		assert_int_equal(rest.announced, r[2].batches - K);
		assert_int_equal(head.npicks + rest.npicks, r[2].npicks);
		assert_memory_equal(head.picks, r[2].picks, head.npicks * sizeof(uint64_t));
		assert_memory_equal(rest.picks, r[2].picks + head.npicks,
				    rest.npicks * sizeof(uint64_t));
		free(head.picks);
		free(rest.picks);
	}
	for (uint32_t k = 0; k < WORLD; k++) {
		pf_close(c[k]);
		free(r[k].picks);
	}
	free(list);
}

static void drop_last_and_resume_serve_the_same_batches(void **state)
{
	/* drop_last: 1003 = 15 * 64 + 43, so 15 batches; a resume at 15
	 * serves none. */
	struct pf_open_opts oo = {.dataset = "blocks", .batch_size = 64, .drop_last = true};
	struct pf_epoch_opts eo = {.order = PF_ORDER_BLOCK_SHUFFLE, .seed = 5, .block_rows = 100};
	uint64_t n, *want = td_block_order(N_DATA, 1, 100, 16, 5, 0, 1, &n);
	struct pf_client *c = NULL;
	struct run r;

	assert_int_equal(pf_connect(td.sock, &c), 0);
	assert_int_equal(pf_open(c, &oo), 0);
	take_epoch(c, &eo, UINT64_MAX, &r);
	assert_int_equal(r.batches, 15);
	assert_int_equal(r.npicks, 15 * 64);
	assert_memory_equal(r.picks, want, r.npicks * sizeof(*want));
	free(r.picks);
	eo.start_batch = 15;
	take_epoch(c, &eo, UINT64_MAX, &r);
	assert_int_equal(r.announced, 0);
	assert_int_equal(r.npicks, 0);
	free(r.picks);
	pf_close(c);
	free(want);
}

static void block_sizes_in_bytes_and_by_default_resolve_as_documented(void **state)
{
	struct pf_epoch_opts rows = {
		.order = PF_ORDER_BLOCK_SHUFFLE, .seed = 11, .block_rows = 50, .window_blocks = 4};
	struct pf_epoch_opts bytes = {.order = PF_ORDER_BLOCK_SHUFFLE,
				      .seed = 11,
				      .block_bytes = 50 * SAMPLE_BYTES + SAMPLE_BYTES - 1,
				      .window_blocks = 4};
	struct pf_epoch_opts neither = {.order = PF_ORDER_BLOCK_SHUFFLE, .seed = 11};
	struct pf_epoch_opts shuffle = {.order = PF_ORDER_SHUFFLE, .seed = 11};
	struct run a, b, d, s;

	/* 1019 bytes of 20-byte samples: 50 a block, as block_rows 50. */
	run_epoch("blocks", 64, 1, &rows, UINT64_MAX, &a);
	run_epoch("blocks", 64, 1, &bytes, UINT64_MAX, &b);
	assert_int_equal(a.npicks, N_DATA);
	assert_int_equal(b.npicks, N_DATA);
	assert_memory_equal(a.picks, b.picks, a.npicks * sizeof(uint64_t));
	/* Neither: 4 MiB of 20-byte samples is more than the dataset, so one
	 * block and one window, which is the shuffle of the same seed. */
	run_epoch("blocks", 64, 1, &neither, UINT64_MAX, &d);
	run_epoch("blocks", 64, 1, &shuffle, UINT64_MAX, &s);
	assert_int_equal(d.npicks, N_DATA);
	assert_memory_equal(d.picks, s.picks, d.npicks * sizeof(uint64_t));
	assert_memory_not_equal(a.picks, d.picks, a.npicks * sizeof(uint64_t));
	free(a.picks);
	free(b.picks);
	free(d.picks);
	free(s.picks);
}

static void block_larger_than_the_dataset_is_clamped_and_logged_once(void **state)
{
	struct pf_epoch_opts big = {.order = PF_ORDER_BLOCK_SHUFFLE,
				    .seed = 3,
				    .block_rows = 5000,
				    .window_blocks = 1000};
	struct pf_epoch_opts exact = {.order = PF_ORDER_BLOCK_SHUFFLE,
				      .seed = 3,
				      .block_rows = N_DATA,
				      .window_blocks = 2};
	struct pf_client *c = open_client("blocks", 128, 2);
	struct run a, b;

	/* Two copies: two blocks, one window; the same picks as B = N. */
	take_epoch(c, &big, UINT64_MAX, &a);
	big.seed = 3; /* the same order again, logged no more */
	take_epoch(c, &big, UINT64_MAX, &b);
	assert_int_equal(a.npicks, 2 * N_DATA);
	assert_memory_equal(a.picks, b.picks, a.npicks * sizeof(uint64_t));
	free(b.picks);
	take_epoch(c, &exact, UINT64_MAX, &b);
	assert_memory_equal(a.picks, b.picks, a.npicks * sizeof(uint64_t));
	assert_each_once(a.picks, a.npicks, 2 * N_DATA);
	pf_close(c);
	assert_int_equal(td_log_count(&td,
				      "block_rows 5000 is more than the dataset's 1003 samples",
				      "logged once", 10),
			 1);
	free(a.picks);
	free(b.picks);
}

/* pf_start_epoch of eo on c is refused with -EINVAL and a message holding
 * `want`. */
static void assert_refused(struct pf_client *c, const struct pf_epoch_opts *eo, const char *want)
{
	int rc = pf_start_epoch(c, eo, NULL);

	assert_int_equal(rc, -EINVAL);
	if (!strstr(pf_errmsg(c), want))
		fail_msg("refused with \"%s\", not with \"%s\"", pf_errmsg(c), want);
}

static void bad_block_options_are_refused_and_the_daemon_serves_on(void **state)
{
	struct pf_epoch_opts both = {
		.order = PF_ORDER_BLOCK_SHUFFLE, .seed = 1, .block_rows = 64, .block_bytes = 4096};
	struct pf_epoch_opts on_shuffle = {.order = PF_ORDER_SHUFFLE, .seed = 1, .block_rows = 64};
	struct pf_epoch_opts on_paced = {.order = PF_ORDER_PACED, .window_blocks = 4};
	struct pf_epoch_opts rank = {
		.order = PF_ORDER_BLOCK_SHUFFLE, .rank = 4, .world = 4, .block_rows = 8};
	struct pf_epoch_opts good = {
		.order = PF_ORDER_BLOCK_SHUFFLE, .seed = 8, .block_rows = 30, .window_blocks = 2};
	struct pf_client *c = open_client("blocks", 32, 1);
	struct pf_client *other = open_client("blocks", 50, 1);
	uint64_t n, *want = td_block_order(N_DATA, 1, 30, 2, 8, 0, 1, &n);
	struct pf_batch *b;
	struct run r, rest;

	/* Another trainer is mid-epoch while this one sends bad starts. */
	take_epoch(other, &good, 3, &r);
	assert_int_equal(r.batches, 3);

	assert_refused(c, &both,
		       "block_rows (64) and block_bytes (4096) are both set: give one of them");
	assert_refused(c, &on_shuffle,
		       "block_rows, block_bytes and window_blocks are for the block_shuffle "
		       "order only");
	assert_refused(c, &on_paced, "for the block_shuffle order only");
	assert_refused(c, &rank, "rank 4 is out of range (world is 4)");

	/* The same session starts a good epoch and gets all of it. */
	take_epoch(c, &good, UINT64_MAX, &rest);
	assert_int_equal(rest.npicks, N_DATA);
	assert_memory_equal(rest.picks, want, n * sizeof(*want));
	free(rest.picks);

	/* The other trainer's epoch went on untouched. */
	for (;;) {
		assert_int_equal(pf_next(other, 10000, &b), 0);
		if (!b)
			break;
		verify_batch(other, b);
		memcpy(r.picks + r.npicks, b->picks, b->count * sizeof(uint64_t));
		r.npicks += b->count;
		assert_int_equal(pf_release(other, b, NULL), 0);
	}
	assert_int_equal(r.npicks, N_DATA);
	assert_memory_equal(r.picks, want, n * sizeof(*want));
	free(r.picks);
	pf_close(c);
	pf_close(other);
	free(want);
}

static void prefetchctl_bench_runs_block_shuffle_epochs(void **state)
{
	char cmd[1200], out[4096];

	snprintf(cmd, sizeof(cmd),
		 "%s -s %s bench blocks --order block_shuffle --block-rows 50 --window 4 "
		 "--epochs 2 --batch-size 64 2>/dev/null",
		 td_prefetchctl(), td.sock);
	assert_int_equal(td_capture(cmd, out, sizeof(out)), 0);
	if (!strstr(out, "samples/s") || !strstr(out, "(2006 samples)"))
		fail_msg("bench printed:\n%s", out);
	snprintf(cmd, sizeof(cmd),
		 "%s -s %s bench blocks --order block_shuffle --block-bytes 4096 2>/dev/null",
		 td_prefetchctl(), td.sock);
	assert_int_equal(td_capture(cmd, out, sizeof(out)), 0);
	/* What the wire cannot carry, or carries for another order, is a
	 * usage error here. */
	snprintf(cmd, sizeof(cmd),
		 "%s -s %s bench blocks --order block_shuffle --block-rows 0 2>&1 >/dev/null",
		 td_prefetchctl(), td.sock);
	assert_int_equal(td_capture(cmd, out, sizeof(out)), 2);
	assert_non_null(strstr(out, "--block-rows needs a positive number, not '0'"));
	snprintf(cmd, sizeof(cmd),
		 "%s -s %s bench blocks --order block_shuffle --block-rows 8 --block-bytes 64 "
		 "2>&1 >/dev/null",
		 td_prefetchctl(), td.sock);
	assert_int_equal(td_capture(cmd, out, sizeof(out)), 2);
	assert_non_null(strstr(out, "exclude each other"));
	snprintf(cmd, sizeof(cmd), "%s -s %s bench blocks --window 8 2>&1 >/dev/null",
		 td_prefetchctl(), td.sock);
	assert_int_equal(td_capture(cmd, out, sizeof(out)), 2);
	assert_non_null(strstr(out, "are for --order block_shuffle"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(block_epoch_is_the_documented_vector),
		cmocka_unit_test(one_rank_gets_every_pick_once_in_the_built_order),
		cmocka_unit_test(direct_reads_serve_block_epochs_from_blocks_read_once),
		cmocka_unit_test(augmented_epoch_reads_each_sample_once_per_copy),
		cmocka_unit_test(four_ranks_cover_the_padded_list_and_resume_exactly),
		cmocka_unit_test(drop_last_and_resume_serve_the_same_batches),
		cmocka_unit_test(block_sizes_in_bytes_and_by_default_resolve_as_documented),
		cmocka_unit_test(block_larger_than_the_dataset_is_clamped_and_logged_once),
		cmocka_unit_test(bad_block_options_are_refused_and_the_daemon_serves_on),
		cmocka_unit_test(prefetchctl_bench_runs_block_shuffle_epochs),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
