/*
 * test_integration_tokens.c — language-model token shards through real
 * daemons: a whole epoch of windows, over one rank and two; bad shards
 * refused by name while the rest is served; and the two-node simulation,
 * in which two daemons on two sockets serve four ranks of one epoch and
 * one of them is killed and restarted in the middle.
 *
 * Shards are written in the exact llm.c layout by td_write_tokens (256
 * int32 header: magic 20240520, version 1, count; then uint16 tokens),
 * token k of the stream being td_token(SEED, k); the last shard is short.
 * A window w of a shard starting at stream position P holds tokens
 * P + w * SEQ .. P + w * SEQ + SEQ, and every one of them is checked.
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
#include <unistd.h>

#include "prefetch.h"
#include "testutil.h"

#define SEQ	32
#define SEED	2024
#define BATCH	8
#define NSHARDS 4
#define NEXT_MS 10000
/* Tokens per shard: three full ones and a short final one.  Windows per
 * shard are (T - 1) / SEQ: 40 + 40 + 40 + 12 = 132 windows. */
static const uint64_t shard_tokens[NSHARDS] = {1281, 1300, 1290, 400};

static struct tdaemon node[2];
static uint64_t shard_start[NSHARDS]; /* stream position of each shard's token 0 */
static uint64_t window_pos[1024];     /* stream position of window i's token 0 */
static uint64_t nwindows;
static char shard_pattern[400];

static void write_shards(void)
{
	uint64_t pos = 0;

	nwindows = 0;
	for (int i = 0; i < NSHARDS; i++) {
		char p[400];

		snprintf(p, sizeof(p), "%s/train_%06d.bin", node[0].dir, i);
		assert_int_equal(td_write_tokens(p, shard_tokens[i], SEED, pos, 20240520, 1, 0), 0);
		shard_start[i] = pos;
		for (uint64_t w = 0; w < (shard_tokens[i] - 1) / SEQ; w++)
			window_pos[nwindows++] = pos + w * SEQ;
		pos += shard_tokens[i];
	}
	snprintf(shard_pattern, sizeof(shard_pattern), "%s/train_*.bin", node[0].dir);
}

static void start_node(int k, const char *extra_datasets)
{
	char ds[1200];

	snprintf(ds, sizeof(ds), "[dataset.lm]\nformat = tokens\nshards = %s\nseq_len = %d\n%s",
		 shard_pattern, SEQ, extra_datasets ? extra_datasets : "");
	assert_int_equal(td_start(&node[k], NULL, ds), 0);
}

/* Every token of every window of b. */
static void check_windows(const struct pf_batch *b)
{
	const uint16_t *rows = b->data[0];

	assert_int_equal(b->nfields, 1);
	for (uint32_t i = 0; i < b->count; i++) {
		uint64_t w = b->picks[i];

		assert_true(w < nwindows);
		for (uint32_t t = 0; t <= SEQ; t++)
			if (rows[i * (SEQ + 1) + t] != td_token(SEED, window_pos[w] + t))
				fail_msg("window %llu token %u is wrong", (unsigned long long)w, t);
	}
}

/* One rank of an epoch on one daemon. */
struct rank {
	int node;
	uint32_t rank, world;
	struct pf_client *c;
	uint64_t announced, taken;
	bool done;
};

static void rank_open(struct rank *r, uint64_t start_batch)
{
	uint64_t batches = 0;

	assert_int_equal(pf_connect(node[r->node].sock, &r->c), 0);
	assert_int_equal(
		pf_open(r->c, &(struct pf_open_opts){.dataset = "lm", .batch_size = BATCH}), 0);
	assert_int_equal(pf_num_samples(r->c), nwindows);
	assert_int_equal(pf_start_epoch(r->c,
					&(struct pf_epoch_opts){.order = PF_ORDER_SHUFFLE,
								.seed = 99,
								.rank = r->rank,
								.world = r->world,
								.start_batch = start_batch},
					&batches),
			 0);
	if (!start_batch)
		r->announced = batches;
	else
		assert_int_equal(batches, r->announced - start_batch);
}

/* Takes one batch of r; records its picks in seen (counts). */
static int rank_step(struct rank *r, uint32_t *seen)
{
	struct pf_batch *b;
	int rc = pf_next(r->c, NEXT_MS, &b);

	if (rc)
		return rc;
	if (!b) {
		r->done = true;
		return 0;
	}
	check_windows(b);
	for (uint32_t i = 0; i < b->count; i++)
		seen[b->picks[i]]++;
	r->taken++;
	assert_int_equal(pf_release(r->c, b, NULL), 0);
	return 0;
}

static void setup_nodes(void)
{
	assert_int_equal(td_init(&node[0], "tok-a"), 0);
	assert_int_equal(td_init(&node[1], "tok-b"), 0);
	write_shards();
}

static void teardown_nodes(void)
{
	for (int k = 0; k < 2; k++) {
		if (node[k].pid > 0)
			assert_int_equal(td_stop(&node[k], 5000), 0);
		td_cleanup(&node[k]);
	}
}

static void epoch_test(uint32_t world)
{
	struct rank r[2] = {{.rank = 0, .world = world}, {.rank = 1, .world = world}};
	uint32_t seen[1024] = {0};
	uint64_t total = 0;

	setup_nodes();
	start_node(0, NULL);
	for (uint32_t k = 0; k < world; k++)
		rank_open(&r[k], 0);
	while (!r[0].done || (world > 1 && !r[1].done))
		for (uint32_t k = 0; k < world; k++)
			if (!r[k].done)
				assert_int_equal(rank_step(&r[k], seen), 0);
	for (uint64_t w = 0; w < nwindows; w++) {
		if (seen[w] != 1)
			fail_msg("window %llu delivered %u times", (unsigned long long)w, seen[w]);
		total += seen[w];
	}
	print_message("%u rank(s): %llu windows of %d+1 tokens from %d shards (the last short), "
		      "each once, every token checked\n",
		      world, (unsigned long long)total, SEQ, NSHARDS);
	for (uint32_t k = 0; k < world; k++)
		pf_close(r[k].c);
	teardown_nodes();
}

static void every_window_of_the_shards_arrives_once_with_its_tokens(void **state)
{
	epoch_test(1);
	(void)state;
}

static void two_ranks_split_the_windows_between_them(void **state)
{
	epoch_test(2);
	(void)state;
}

/* Bad shards in other datasets: each refused naming its file and what is
 * wrong; lm is served all the while. */
static void bad_shards_are_refused_by_name_and_the_rest_is_served(void **state)
{
	static const struct {
		const char *name;
		int32_t magic, version;
		uint64_t count;
		long cut;
		const char *says;
	} bad[] = {
		{"magic", 1234, 1, 0, 0, "bad magic 1234"},
		{"version", 20240520, 7, 0, 0, "version 7"},
		{"truncated", 20240520, 1, 0, 600, "shorter than the 1024-byte header"},
		{"toolong", 20240520, 1, 5000, 0, "says 5000 tokens but the file holds 300"},
	};
	char extra[2000] = "";
	size_t n = 0;

	setup_nodes();
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char p[400];

		snprintf(p, sizeof(p), "%s/%s_000.bin", node[0].dir, bad[i].name);
		assert_int_equal(
			td_write_tokens(p, 300, 1, 0, bad[i].magic, bad[i].version, bad[i].count),
			0);
		if (bad[i].cut)
			assert_int_equal(truncate(p, bad[i].cut), 0);
		n += (size_t)snprintf(extra + n, sizeof(extra) - n,
				      "[dataset.%s]\nformat = tokens\nshards = %s/%s_*.bin\n"
				      "seq_len = 16\n",
				      bad[i].name, node[0].dir, bad[i].name);
	}
	start_node(0, extra);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct pf_client *c = NULL;
		int rc;

		assert_int_equal(pf_connect(node[0].sock, &c), 0);
		rc = pf_open(c, &(struct pf_open_opts){.dataset = bad[i].name, .batch_size = 4});
		print_message("open %s: %d %s\n", bad[i].name, rc, pf_errmsg(c));
		assert_int_equal(rc, -EIO);
		if (!strstr(pf_errmsg(c), "_000.bin") || !strstr(pf_errmsg(c), bad[i].says))
			fail_msg("%s: \"%s\" does not name the file and say \"%s\"", bad[i].name,
				 pf_errmsg(c), bad[i].says);
		pf_close(c);
	}
	{
		/* The good one still serves a whole epoch. */
		struct rank r = {.rank = 0, .world = 1};
		uint32_t seen[1024] = {0};

		rank_open(&r, 0);
		while (!r.done)
			assert_int_equal(rank_step(&r, seen), 0);
		for (uint64_t w = 0; w < nwindows; w++)
			assert_int_equal(seen[w], 1);
		pf_close(r.c);
	}
	teardown_nodes();
	(void)state;
}

/* Two nodes, one daemon each, four ranks (two per node), one epoch.  Node
 * B's daemon is SIGKILLed with its ranks a third of the way through and
 * started again; they reopen and resume with start_batch = what they had
 * taken.  The union of every rank's picks is the epoch, once. */
static void two_daemons_serve_four_ranks_and_a_restart_loses_nothing(void **state)
{
	struct rank r[4];
	uint32_t seen[1024] = {0};
	uint64_t total = 0;
	bool killed = false;

	setup_nodes();
	start_node(0, NULL);
	start_node(1, NULL); /* its own config, the same files */
	for (uint32_t k = 0; k < 4; k++) {
		r[k] = (struct rank){.node = k < 2 ? 0 : 1, .rank = k, .world = 4};
		rank_open(&r[k], 0);
	}
	for (;;) {
		bool all = true;

		for (uint32_t k = 0; k < 4; k++) {
			int rc;

			if (r[k].done)
				continue;
			all = false;
			rc = rank_step(&r[k], seen);
			if (rc == 0)
				continue;
			/* Only node B's ranks, only after the kill. */
			assert_true(killed && r[k].node == 1);
			print_message("rank %u: pf_next after the kill: %d %s\n", k, rc,
				      pf_errmsg(r[k].c));
			pf_close(r[k].c);
			r[k].c = NULL;
			rank_open(&r[k], r[k].taken);
			print_message("rank %u: resumed at batch %llu of %llu\n", k,
				      (unsigned long long)r[k].taken,
				      (unsigned long long)r[k].announced);
		}
		if (all)
			break;
		if (!killed && r[2].taken >= r[2].announced / 3) {
			assert_int_equal(td_kill(&node[1]), 0);
			start_node(1, NULL);
			killed = true;
			print_message("node B's daemon killed and restarted with rank 2 at batch "
				      "%llu, rank 3 at %llu\n",
				      (unsigned long long)r[2].taken,
				      (unsigned long long)r[3].taken);
		}
	}
	assert_true(killed);
	for (uint64_t w = 0; w < nwindows; w++) {
		if (seen[w] != 1)
			fail_msg("window %llu delivered %u times across the four ranks",
				 (unsigned long long)w, seen[w]);
		total += seen[w];
	}
	print_message("4 ranks on 2 daemons: %llu windows, each exactly once\n",
		      (unsigned long long)total);
	for (uint32_t k = 0; k < 4; k++)
		pf_close(r[k].c);
	teardown_nodes();
	(void)state;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(every_window_of_the_shards_arrives_once_with_its_tokens),
		cmocka_unit_test(two_ranks_split_the_windows_between_them),
		cmocka_unit_test(bad_shards_are_refused_by_name_and_the_rest_is_served),
		cmocka_unit_test(two_daemons_serve_four_ranks_and_a_restart_loses_nothing),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
