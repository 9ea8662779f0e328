/*
 * test_order.c — the epoch order: splitmix64, the documented shuffle, the
 * block shuffle, DistributedSampler-style sharding, and what a block cache
 * is told about a block shuffle.
 *
 * The expected vectors were printed by the Python reference implementation
 * in docs/SHUFFLE.md (an independent implementation of the same spec), so a
 * change to either side that breaks cross-language reproducibility fails
 * here.
 */
#include <errno.h>
#include <malloc.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "block_order.h"
#include "order/order.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

static void splitmix64_from_seed_0_gives_the_published_values(void **unused)
{
	uint64_t state = 0;

	assert_int_equal(order_splitmix64(&state), 0xE220A8397B1DCDAFULL);
	assert_int_equal(order_splitmix64(&state), 0x6E789E6AA1B965F4ULL);
	assert_int_equal(order_splitmix64(&state), 0x06C45D188009454FULL);
	assert_int_equal(state, 3 * 0x9E3779B97F4A7C15ULL);
}

static void bounded_redraws_below_the_rejection_threshold(void **unused)
{
	/* m = 2^63 + 1 puts the threshold at 2^63 - 1.  From this state the
	 * next two splitmix64 outputs (0x6E78..., 0x06C4...) lie below it, so
	 * the third is used: three draws, and the value the Python reference
	 * printed. */
	uint64_t state = 0x9E3779B97F4A7C15ULL;

	assert_int_equal(order_bounded(&state, (1ULL << 63) + 1), 8686239339925766635ULL);
	assert_int_equal(state, 4 * 0x9E3779B97F4A7C15ULL);
}

static void bounded_of_one_is_zero_and_costs_one_draw(void **unused)
{
	uint64_t state = 5;

	assert_int_equal(order_bounded(&state, 1), 0);
	assert_int_equal(state, 5 + 0x9E3779B97F4A7C15ULL);
}

static void bounded_stays_below_m_and_reaches_every_value(void **unused)
{
	uint64_t state = 99;
	unsigned seen[7] = {0};
	int i;

	for (i = 0; i < 7000; i++) {
		uint64_t r = order_bounded(&state, 7);

		assert_true(r < 7);
		seen[r]++;
	}
	/* 1000 expected per value; 800 is > 6 sigma below. */
	for (i = 0; i < 7; i++)
		assert_true(seen[i] > 800);
}

static void shuffle_of_10_with_seed_42_matches_the_reference(void **unused)
{
	static const uint64_t want[] = {0, 9, 5, 8, 6, 4, 7, 2, 1, 3};
	uint64_t perm[10];

	order_shuffle(perm, 10, 42);
	assert_memory_equal(perm, want, sizeof(want));
}

static void shuffle_of_16_with_seed_7_matches_the_reference(void **unused)
{
	static const uint64_t want[] = {14, 6, 4, 2, 5, 11, 13, 1, 3, 12, 15, 10, 8, 0, 9, 7};
	uint64_t perm[16];

	order_shuffle(perm, 16, 7);
	assert_memory_equal(perm, want, sizeof(want));
}

static void shuffle_is_a_permutation_for_every_size(void **unused)
{
	static const uint64_t sizes[] = {1, 2, 3, 7, 64, 1000, 4097, 100003};
	size_t s;

	for (s = 0; s < ARRAY_LEN(sizes); s++) {
		uint64_t n = sizes[s], i;
		uint64_t *perm = malloc(n * sizeof(*perm));
		unsigned char *hit = calloc(n, 1);

		assert_non_null(perm);
		assert_non_null(hit);
		order_shuffle(perm, n, 1234 + s);
		for (i = 0; i < n; i++) {
			assert_true(perm[i] < n);
			assert_int_equal(hit[perm[i]], 0);
			hit[perm[i]] = 1;
		}
		free(perm);
		free(hit);
	}
}

/* The spec's Fisher-Yates written as plainly as possible: long lists are
 * shuffled with prefetching and with their draws made on another thread,
 * and must still give exactly this. */
static void plain_shuffle(uint64_t *perm, uint64_t n, uint64_t seed)
{
	uint64_t state = seed;

	for (uint64_t i = 0; i < n; i++)
		perm[i] = i;
	for (uint64_t i = n; i > 1; i--) {
		uint64_t j = order_bounded(&state, i), t = perm[i - 1];

		perm[i - 1] = perm[j];
		perm[j] = t;
	}
}

static void long_shuffles_match_the_plain_algorithm(void **unused)
{
	/* Around the threaded path's threshold (2^16) and its ring (2^14). */
	static const uint64_t sizes[] = {65535, 65536, 65537, 100003, 1u << 20};

	for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
		uint64_t n = sizes[s];
		uint64_t *a = malloc(n * sizeof(*a)), *b = malloc(n * sizeof(*b));

		assert_non_null(a);
		assert_non_null(b);
		for (uint64_t seed = 1; seed <= 2; seed++) {
			plain_shuffle(b, n, seed);
			order_shuffle(a, n, seed);
			assert_memory_equal(a, b, n * sizeof(*a));
			/* The threaded path, whatever this machine's CPUs. */
			memset(a, 0, n * sizeof(*a));
			assert_true(order_shuffle_piped(a, n, seed));
			assert_memory_equal(a, b, n * sizeof(*a));
		}
		free(a);
		free(b);
	}
}

static void shuffle_of_nothing_writes_nothing(void **unused)
{
	uint64_t canary = 0xDEADBEEF;

	order_shuffle(&canary, 0, 42);
	assert_int_equal(canary, 0xDEADBEEF);
}

static void shuffle_depends_on_the_seed_only(void **unused)
{
	uint64_t a[64], b[64], c[64];

	order_shuffle(a, 64, 1);
	order_shuffle(b, 64, 1);
	order_shuffle(c, 64, 2);
	assert_memory_equal(a, b, sizeof(a));
	assert_memory_not_equal(a, c, sizeof(a));
}

static void sequential_order_is_the_identity(void **unused)
{
	struct order_spec spec = {.kind = ORDER_SEQ};
	uint64_t *picks, n, i;

	assert_int_equal(order_build(&spec, 5, &picks, &n, NULL, 0), 0);
	assert_int_equal(n, 5);
	for (i = 0; i < n; i++)
		assert_int_equal(picks[i], i);
	free(picks);
}

static void shuffle_order_of_one_rank_is_the_full_permutation(void **unused)
{
	static const uint64_t want[] = {0, 9, 5, 8, 6, 4, 7, 2, 1, 3};
	struct order_spec spec = {.kind = ORDER_SHUFFLE, .seed = 42, .world = 1};
	uint64_t *picks, n;

	assert_int_equal(order_build(&spec, 10, &picks, &n, NULL, 0), 0);
	assert_int_equal(n, 10);
	assert_memory_equal(picks, want, sizeof(want));
	free(picks);
}

/* order_build_into writes the order into the buffer it is given when the
 * order fits (the whole shuffle of one rank, or a rank's share), with the
 * same picks as order_build; a buffer too small is freed (ASan and
 * valgrind see a leak or a double free) and the order built anew. */
static void build_into_reuses_a_buffer_that_fits_and_frees_one_that_does_not(void **unused)
{
	struct order_spec one = {.kind = ORDER_SHUFFLE, .seed = 42, .world = 1};
	struct order_spec rank = {.kind = ORDER_SHUFFLE, .seed = 5, .rank = 1, .world = 3};
	struct order_spec seq = {.kind = ORDER_SEQ};
	uint64_t *want, *buf, *picks, nwant, n;

	/* One rank: the whole list goes into the buffer. */
	assert_int_equal(order_build(&one, 10, &want, &nwant, NULL, 0), 0);
	buf = malloc(10 * sizeof(*buf));
	assert_non_null(buf);
	memset(buf, 0xff, 10 * sizeof(*buf));
	assert_int_equal(order_build_into(&one, 10, buf, 10, &picks, &n, NULL, 0), 0);
	assert_ptr_equal(picks, buf);
	assert_int_equal(n, nwant);
	assert_memory_equal(picks, want, nwant * sizeof(*want));
	free(want);
	/* Too small for 11: built elsewhere, the buffer freed. */
	assert_int_equal(order_build(&one, 11, &want, &nwant, NULL, 0), 0);
	assert_int_equal(order_build_into(&one, 11, picks, 10, &buf, &n, NULL, 0), 0);
	assert_int_equal(n, 11);
	assert_memory_equal(buf, want, 11 * sizeof(*want));
	free(want);
	/* A rank's share of 4 (of 10 in 3 ranks) goes into a buffer of 4. */
	assert_int_equal(order_build(&rank, 10, &want, &nwant, NULL, 0), 0);
	assert_int_equal(nwant, 4);
	assert_int_equal(order_build_into(&rank, 10, buf, 4, &picks, &n, NULL, 0), 0);
	assert_ptr_equal(picks, buf);
	assert_memory_equal(picks, want, 4 * sizeof(*want));
	free(want);
	/* A sequential order, and a refused build, take the buffer too. */
	assert_int_equal(order_build_into(&seq, 4, picks, 4, &buf, &n, NULL, 0), 0);
	for (uint64_t i = 0; i < n; i++)
		assert_int_equal(buf[i], i);
	rank.rank = 3;
	assert_int_equal(order_build_into(&rank, 10, buf, 4, &picks, &n, NULL, 0), -EINVAL);
	assert_null(picks);
}

/* A buffer longer than the order built into it keeps no more than the
 * order (a page of slack, the allocator's rounding): whoever holds an
 * order counts it by its length (issue 37).  Built into a share of 2^20
 * picks, once as a world-16 share, once as one rank's whole list. */
static void build_into_a_longer_buffer_holds_no_more_than_the_order(void **unused)
{
	struct order_spec share = {.kind = ORDER_SHUFFLE, .seed = 9, .world = 16};
	struct order_spec one = {.kind = ORDER_SHUFFLE, .seed = 9, .world = 1};
	const uint64_t big = 1u << 20, slack = 4096 + 64;
	uint64_t *want, *buf, *picks, nwant, n;

	assert_int_equal(order_build(&share, big, &want, &nwant, NULL, 0), 0);
	assert_int_equal(nwant, big / 16);
	buf = malloc(big * sizeof(*buf));
	assert_non_null(buf);
	memset(buf, 0xff, big * sizeof(*buf)); /* its pages are there */
	assert_int_equal(order_build_into(&share, big, buf, big, &picks, &n, NULL, 0), 0);
	assert_int_equal(n, nwant);
	assert_memory_equal(picks, want, n * sizeof(*want));
	assert_true(malloc_usable_size(picks) <= n * sizeof(*picks) + slack);
	free(want);
	free(picks);

	assert_int_equal(order_build(&one, 1000, &want, &nwant, NULL, 0), 0);
	buf = malloc(big * sizeof(*buf));
	assert_non_null(buf);
	memset(buf, 0xff, big * sizeof(*buf));
	assert_int_equal(order_build_into(&one, 1000, buf, big, &picks, &n, NULL, 0), 0);
	assert_int_equal(n, 1000);
	assert_memory_equal(picks, want, n * sizeof(*want));
	assert_true(malloc_usable_size(picks) <= n * sizeof(*picks) + slack);
	free(want);
	free(picks);
}

static void world_zero_is_taken_as_one(void **unused)
{
	struct order_spec spec = {.kind = ORDER_SHUFFLE, .seed = 42, .world = 0};
	uint64_t *picks, n, perm[10];

	order_shuffle(perm, 10, 42);
	assert_int_equal(order_build(&spec, 10, &picks, &n, NULL, 0), 0);
	assert_int_equal(n, 10);
	assert_memory_equal(picks, perm, sizeof(perm));
	free(picks);
}

static void shards_pad_by_repeating_the_head(void **unused)
{
	/* n = 10, world = 4: the permutation is padded to 12 with its first two
	 * entries (0, 9); the shares are the ones docs/SHUFFLE.md lists. */
	static const uint64_t want[4][3] = {
		{0, 6, 1},
		{9, 4, 3},
		{5, 7, 0},
		{8, 2, 9},
	};
	uint32_t r;

	for (r = 0; r < 4; r++) {
		struct order_spec spec = {.kind = ORDER_SHUFFLE, .seed = 42, .rank = r, .world = 4};
		uint64_t *picks, n;

		assert_int_equal(order_build(&spec, 10, &picks, &n, NULL, 0), 0);
		assert_int_equal(n, 3);
		assert_memory_equal(picks, want[r], sizeof(want[r]));
		free(picks);
	}
}

static void shards_cover_every_pick_once_when_world_divides(void **unused)
{
	enum { N = 1008, WORLD = 8 };
	unsigned char hit[N] = {0};
	uint32_t r;

	for (r = 0; r < WORLD; r++) {
		struct order_spec spec = {
			.kind = ORDER_SHUFFLE, .seed = 3, .rank = r, .world = WORLD};
		uint64_t *picks, n, i;

		assert_int_equal(order_build(&spec, N, &picks, &n, NULL, 0), 0);
		assert_int_equal(n, N / WORLD);
		for (i = 0; i < n; i++) {
			assert_true(picks[i] < N);
			assert_int_equal(hit[picks[i]], 0);
			hit[picks[i]] = 1;
		}
		free(picks);
	}
}

static void shards_are_equal_and_cover_everything_when_padded(void **unused)
{
	/* 1000 = 7 * 142 + 6: each rank gets 143, and exactly one pick per
	 * padding slot (the permutation's first) appears twice. */
	enum { N = 1000, WORLD = 7 };
	unsigned hits[N] = {0};
	uint64_t perm[N], i, total = 0;
	uint32_t r;

	order_shuffle(perm, N, 11);
	for (r = 0; r < WORLD; r++) {
		struct order_spec spec = {
			.kind = ORDER_SHUFFLE, .seed = 11, .rank = r, .world = WORLD};
		uint64_t *picks, n;

		assert_int_equal(order_build(&spec, N, &picks, &n, NULL, 0), 0);
		assert_int_equal(n, 143);
		for (i = 0; i < n; i++) {
			/* Strided positions of the padded list, by definition. */
			assert_int_equal(picks[i], perm[(r + i * WORLD) % N]);
			hits[picks[i]]++;
		}
		total += n;
		free(picks);
	}
	assert_int_equal(total, 1001);
	for (i = 0; i < N; i++)
		assert_int_equal(hits[i], i == perm[0] ? 2 : 1);
}

static void padding_cycles_when_world_exceeds_the_list(void **unused)
{
	/* torch repeats the whole list as often as needed: [5, 8] over world 5
	 * pads to [5, 8, 5, 8, 5]. */
	static const uint64_t idx[] = {5, 8};
	static const uint64_t want[] = {5, 8, 5, 8, 5};
	uint32_t r;

	for (r = 0; r < 5; r++) {
		struct order_spec spec = {.kind = ORDER_EXPLICIT,
					  .indices = idx,
					  .nindices = 2,
					  .rank = r,
					  .world = 5};
		uint64_t *picks, n;

		assert_int_equal(order_build(&spec, 10, &picks, &n, NULL, 0), 0);
		assert_int_equal(n, 1);
		assert_int_equal(picks[0], want[r]);
		free(picks);
	}
}

static void explicit_order_keeps_the_given_picks_in_order(void **unused)
{
	static const uint64_t idx[] = {7, 7, 0, 29, 3};
	struct order_spec spec = {.kind = ORDER_EXPLICIT, .indices = idx, .nindices = 5};
	uint64_t *picks, n;

	assert_int_equal(order_build(&spec, 30, &picks, &n, NULL, 0), 0);
	assert_int_equal(n, 5);
	assert_memory_equal(picks, idx, sizeof(idx));
	free(picks);
}

static void explicit_index_out_of_range_names_index_and_position(void **unused)
{
	uint64_t idx[8] = {1, 2, 3, 4, 5, 6, 7, 123456};
	struct order_spec spec = {.kind = ORDER_EXPLICIT, .indices = idx, .nindices = 8};
	uint64_t *picks = (uint64_t *)&spec, n = 99;
	char err[128];

	assert_int_equal(order_build(&spec, 1000, &picks, &n, err, sizeof(err)), -ERANGE);
	assert_string_equal(err,
			    "index 123456 at position 7 is out of range (schedule has 1000 picks)");
	assert_null(picks);
	assert_int_equal(n, 0);

	/* The bound is exclusive: space itself is already out of range. */
	idx[7] = 1000;
	assert_int_equal(order_build(&spec, 1000, &picks, &n, err, sizeof(err)), -ERANGE);
	idx[7] = 999;
	assert_int_equal(order_build(&spec, 1000, &picks, &n, err, sizeof(err)), 0);
	free(picks);
}

static void empty_explicit_list_is_refused(void **unused)
{
	static const uint64_t idx[] = {1};
	struct order_spec spec = {.kind = ORDER_EXPLICIT, .indices = idx, .nindices = 0};
	uint64_t *picks, n;
	char err[128] = "";

	assert_int_equal(order_build(&spec, 10, &picks, &n, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "empty"));
	assert_null(picks);
}

static void empty_schedule_is_refused(void **unused)
{
	struct order_spec spec = {.kind = ORDER_SHUFFLE, .seed = 1};
	uint64_t *picks, n;
	char err[128] = "";

	assert_int_equal(order_build(&spec, 0, &picks, &n, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "empty"));
	assert_null(picks);
}

static void rank_not_below_world_is_refused(void **unused)
{
	struct order_spec spec = {.kind = ORDER_SEQ, .rank = 4, .world = 4};
	uint64_t *picks, n;
	char err[128] = "";

	assert_int_equal(order_build(&spec, 10, &picks, &n, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "rank 4 is out of range (world is 4)");
	assert_null(picks);

	/* world 0 means 1, so only rank 0 exists. */
	spec.rank = 1;
	spec.world = 0;
	assert_int_equal(order_build(&spec, 10, &picks, &n, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "rank 1 is out of range (world is 1)");
}

static void num_batches_rounds_up_unless_drop_last(void **unused)
{
	assert_int_equal(order_num_batches(10, 4, false), 3);
	assert_int_equal(order_num_batches(10, 4, true), 2);
	assert_int_equal(order_num_batches(12, 4, false), 3);
	assert_int_equal(order_num_batches(12, 4, true), 3);
	assert_int_equal(order_num_batches(3, 4, false), 1);
	assert_int_equal(order_num_batches(3, 4, true), 0);
	assert_int_equal(order_num_batches(0, 4, false), 0);
	assert_int_equal(order_num_batches(10, 0, false), 0);
}

/* ---- block_shuffle ------------------------------------------------------------ */

static void block_shuffle_matches_the_documented_vectors(void **unused)
{
	/* docs/SHUFFLE.md, "Block shuffle": printed by its Python reference. */
	static const struct {
		uint64_t n;
		uint32_t augment;
		uint64_t rows, window, seed;
		uint64_t want[20];
	} v[] = {
		{10, 1, 3, 2, 42, {0, 1, 7, 8, 2, 6, 9, 5, 4, 3}},
		{8, 2, 3, 3, 7, {5, 15, 14, 2, 1, 3, 0, 4, 13, 7, 11, 10, 8, 6, 12, 9}},
		{20, 1, 4, 2, 2026, {15, 3,  0,	 1, 2,	12, 14, 13, 19, 10,
				     11, 18, 17, 9, 16, 8,  6,	4,  5,	7}},
		/* B = 1, W = 1 and B = N are shuffle(seed) by the text. */
		{10, 1, 1, 1, 42, {0, 9, 5, 8, 6, 4, 7, 2, 1, 3}},
		{10, 1, 10, 1, 42, {0, 9, 5, 8, 6, 4, 7, 2, 1, 3}},
	};

	for (size_t i = 0; i < ARRAY_LEN(v); i++) {
		uint64_t n, *picks = td_block_order(v[i].n, v[i].augment, v[i].rows, v[i].window,
						    v[i].seed, 0, 1, &n);

		assert_int_equal(n, v[i].n * v[i].augment);
		assert_memory_equal(picks, v[i].want, n * sizeof(*picks));
		free(picks);
	}
}

static void block_shuffle_of_4_ranks_matches_the_documented_shares(void **unused)
{
	static const uint64_t want[4][3] = {{0, 2, 4}, {1, 6, 3}, {7, 9, 0}, {8, 5, 1}};

	for (uint32_t r = 0; r < 4; r++) {
		uint64_t n, *picks = td_block_order(10, 1, 3, 2, 42, r, 4, &n);

		assert_int_equal(n, 3);
		assert_memory_equal(picks, want[r], sizeof(want[r]));
		free(picks);
	}
}

/* True when list[0..len) is block_shuffle-shaped for (n, augment, rows,
 * window): it cuts into consecutive windows, each holding every pick of
 * `window` whole blocks (the last one fewer) and nothing else, where the
 * blocks are those of the spec (restarting at each copy). */
static bool windows_hold_whole_blocks(const uint64_t *list, uint64_t len, uint64_t n,
				      uint32_t augment, uint64_t rows, uint64_t window)
{
	uint64_t per_copy = order_sample_blocks(n, rows), nb = augment * per_copy;
	uint64_t *left = calloc(nb, sizeof(*left)); /* picks of a block not yet seen */
	bool *done = calloc(nb, sizeof(*done)), ok = true;
	uint64_t in_window = 0, open = 0, closed = 0;

	for (uint64_t b = 0; b < nb; b++) {
		uint64_t j = b % per_copy;

		left[b] = j + 1 < per_copy ? rows : n - j * rows;
	}
	for (uint64_t i = 0; i < len && ok; i++) {
		uint64_t b = list[i] / n * per_copy + list[i] % n / rows;

		if (list[i] >= n * augment || done[b]) {
			ok = false;
			break;
		}
		if (left[b] == (b % per_copy + 1 < per_copy ? rows : n - b % per_copy * rows)) {
			/* A block's first pick: it joins the window. */
			if (in_window == window) {
				ok = false;
				break;
			}
			in_window++;
			open++;
		}
		if (--left[b] == 0) {
			done[b] = true;
			open--;
			closed++;
			if (in_window == window && open == 0)
				in_window = 0;
		}
	}
	ok = ok && closed == nb && open == 0;
	free(left);
	free(done);
	return ok;
}

static void block_shuffle_keeps_every_pick_in_its_window(void **unused)
{
	static const struct {
		uint64_t n;
		uint32_t augment;
		uint64_t rows, window;
	} c[] = {
		{1000, 1, 64, 4},  {1000, 1, 7, 16}, {1000, 3, 64, 5}, {97, 2, 10, 3},
		{4096, 1, 512, 8}, {5, 4, 2, 1},     {1, 1, 1, 1},     {100003, 1, 1000, 16},
	};

	for (size_t i = 0; i < ARRAY_LEN(c); i++) {
		uint64_t n, *picks = td_block_order(c[i].n, c[i].augment, c[i].rows, c[i].window,
						    1000 + i, 0, 1, &n);
		unsigned char *hit = calloc(n, 1);

		assert_int_equal(n, c[i].n * c[i].augment);
		for (uint64_t k = 0; k < n; k++) {
			assert_true(picks[k] < n);
			assert_int_equal(hit[picks[k]], 0);
			hit[picks[k]] = 1;
		}
		if (!windows_hold_whole_blocks(picks, n, c[i].n, c[i].augment, c[i].rows,
					       c[i].window))
			fail_msg("case %zu: a window holds other than whole blocks", i);
		free(hit);
		free(picks);
	}
}

static void block_shuffle_mixes_within_windows(void **unused)
{
	/* 1024 picks in 16 blocks of 64, windows of 4: a window's positions
	 * hold its picks in a shuffled order, not block after block. */
	uint64_t n, in_run = 0, *picks = td_block_order(1024, 1, 64, 4, 5, 0, 1, &n);

	for (uint64_t k = 1; k < n; k++)
		in_run += picks[k] == picks[k - 1] + 1;
	assert_true(in_run < n / 10);
	free(picks);
}

static void block_shards_of_4_ranks_are_the_padded_list(void **unused)
{
	/* 1001 picks over 4 ranks: 251 each, the padded list's last three
	 * entries being its first three (delivered twice in the epoch). */
	enum { N = 1001, WORLD = 4 };
	uint64_t len, *list = td_block_order(N, 1, 37, 3, 9, 0, 1, &len), total = 0;
	unsigned hits[N] = {0};

	for (uint32_t r = 0; r < WORLD; r++) {
		uint64_t n, *picks = td_block_order(N, 1, 37, 3, 9, r, WORLD, &n);

		assert_int_equal(n, 251);
		for (uint64_t k = 0; k < n; k++) {
			assert_int_equal(picks[k], list[(r + k * WORLD) % N]);
			hits[picks[k]]++;
		}
		total += n;
		free(picks);
	}
	assert_int_equal(total, 1004);
	for (uint64_t i = 0; i < N; i++) {
		bool head = i == list[0] || i == list[1] || i == list[2];

		assert_int_equal(hits[i], head ? 2 : 1);
	}
	free(list);
}

static void block_resume_at_start_batch_serves_the_same_suffix(void **unused)
{
	/* The order does not depend on where an epoch resumes: batch k of a
	 * resumed epoch is batch k of the whole one. */
	uint64_t n, *a = td_block_order(999, 2, 16, 5, 77, 1, 3, &n), first, count, first0, count0;
	uint64_t m, *b = td_block_order(999, 2, 16, 5, 77, 1, 3, &m);

	assert_int_equal(n, 666);
	assert_int_equal(m, n);
	order_served(n, 50, false, 0, &first0, &count0);
	assert_int_equal(first0, 0);
	assert_int_equal(count0, 666);
	order_served(m, 50, false, 7, &first, &count);
	assert_int_equal(first, 350);
	assert_int_equal(count, 316);
	assert_memory_equal(a + first0 + 350, b + first, count * sizeof(*a));
	/* drop_last serves 13 batches of 50; resuming at 13 serves nothing. */
	order_served(n, 50, true, 7, &first, &count);
	assert_int_equal(first, 350);
	assert_int_equal(count, 300);
	order_served(n, 50, true, 13, &first, &count);
	assert_int_equal(count, 0);
	order_served(n, 50, false, 14, &first, &count);
	assert_int_equal(count, 0);
	free(a);
	free(b);
}

static void block_larger_than_the_dataset_is_one_block_per_copy(void **unused)
{
	uint64_t rows, window, n1, n2;
	bool clamped;
	uint64_t *a, *b;

	assert_int_equal(
		order_block_params(5000, 0, 0, 1000, 3, 8, &rows, &window, &clamped, NULL, 0), 0);
	assert_int_equal(rows, 1000);
	assert_int_equal(window, 3); /* 16 clamped to the 3 blocks */
	assert_true(clamped);
	/* The clamp changes no pick. */
	a = td_block_order(1000, 3, 5000, 16, 4, 0, 1, &n1);
	b = td_block_order(1000, 3, 1000, 3, 4, 0, 1, &n2);
	assert_int_equal(n1, n2);
	assert_memory_equal(a, b, n1 * sizeof(*a));
	assert_true(windows_hold_whole_blocks(a, n1, 1000, 3, 1000, 3));
	free(a);
	free(b);
	/* In bytes too. */
	assert_int_equal(
		order_block_params(0, 1 << 30, 0, 1000, 1, 8, &rows, &window, &clamped, NULL, 0),
		0);
	assert_int_equal(rows, 1000);
	assert_true(clamped);
	/* The default exceeding a small dataset is clamped without news. */
	assert_int_equal(order_block_params(0, 0, 0, 1000, 1, 8, &rows, &window, &clamped, NULL, 0),
			 0);
	assert_int_equal(rows, 1000);
	assert_int_equal(window, 1);
	assert_false(clamped);
}

static void window_larger_than_the_blocks_is_all_of_them(void **unused)
{
	uint64_t rows, window, n1, n2, *a, *b;
	bool clamped;

	/* 1000 samples in blocks of 64: 16 blocks. */
	assert_int_equal(
		order_block_params(64, 0, 1000, 1000, 1, 8, &rows, &window, &clamped, NULL, 0), 0);
	assert_int_equal(rows, 64);
	assert_int_equal(window, 16);
	assert_false(clamped);
	a = td_block_order(1000, 1, 64, 1000, 8, 0, 1, &n1);
	b = td_block_order(1000, 1, 64, 16, 8, 0, 1, &n2);
	assert_memory_equal(a, b, n1 * sizeof(*a));
	free(b);
	/* ... and so is a window of 2^64 - 1 blocks, which must not wrap. */
	b = td_block_order(1000, 1, 64, UINT64_MAX, 8, 0, 1, &n2);
	assert_memory_equal(a, b, n1 * sizeof(*a));
	free(a);
	free(b);
}

static void block_size_in_bytes_rounds_down_to_whole_samples(void **unused)
{
	uint64_t rows, window;
	bool clamped;

	/* 24-byte samples: 10000 bytes hold 416 of them. */
	assert_int_equal(
		order_block_params(0, 10000, 0, 1000000, 1, 24, &rows, &window, &clamped, NULL, 0),
		0);
	assert_int_equal(rows, 416);
	assert_int_equal(window, 16);
	/* Less than a sample: one a block. */
	assert_int_equal(
		order_block_params(0, 10, 7, 1000000, 1, 24, &rows, &window, &clamped, NULL, 0), 0);
	assert_int_equal(rows, 1);
	assert_int_equal(window, 7);
	/* Neither size: 4 MiB of samples. */
	assert_int_equal(
		order_block_params(0, 0, 0, 1000000, 1, 24, &rows, &window, &clamped, NULL, 0), 0);
	assert_int_equal(rows, (4 << 20) / 24);
	assert_int_equal(order_block_params(0, 0, 0, 1ULL << 40, 1, 64ULL << 20, &rows, &window,
					    &clamped, NULL, 0),
			 0);
	assert_int_equal(rows, 1); /* samples above 4 MiB */
}

static void block_size_in_rows_and_bytes_at_once_is_refused(void **unused)
{
	uint64_t rows = 99, window = 99;
	bool clamped;
	char err[200] = "";

	assert_int_equal(order_block_params(64, 4096, 0, 1000, 1, 8, &rows, &window, &clamped, err,
					    sizeof(err)),
			 -EINVAL);
	assert_string_equal(
		err, "block_rows (64) and block_bytes (4096) are both set: give one of them");
	assert_int_equal(
		order_block_params(64, 0, 0, 0, 1, 8, &rows, &window, &clamped, err, sizeof(err)),
		-EINVAL);
	assert_non_null(strstr(err, "empty"));
}

static void block_spec_without_a_size_or_a_whole_copy_is_refused(void **unused)
{
	struct order_spec spec = {
		.kind = ORDER_BLOCK_SHUFFLE, .samples = 10, .block_rows = 0, .window_blocks = 1};
	uint64_t *picks, n;
	char err[200] = "";

	assert_int_equal(order_build(&spec, 10, &picks, &n, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "block_shuffle with block_rows 0 (it must be at least 1)");
	assert_null(picks);
	spec.block_rows = 3;
	spec.window_blocks = 0;
	assert_int_equal(order_build(&spec, 10, &picks, &n, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "block_shuffle with window_blocks 0 (it must be at least 1)");
	spec.window_blocks = 2;
	assert_int_equal(order_build(&spec, 25, &picks, &n, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "not a whole number of copies"));
	assert_int_equal(order_build(&spec, 0, &picks, &n, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "empty"));
	assert_int_equal(order_build(&spec, 30, &picks, &n, err, sizeof(err)), 0);
	assert_int_equal(n, 30);
	free(picks);
}

static void augmented_block_shuffle_keeps_copies_apart(void **unused)
{
	/* 100 samples, B = 30 (blocks of 30, 30, 30, 10 per copy), 4 copies:
	 * every sample 4 times, and no block runs from one copy into the
	 * next (windows_hold_whole_blocks checks the blocks of the spec). */
	uint64_t n, *picks = td_block_order(100, 4, 30, 3, 21, 0, 1, &n);
	unsigned per_sample[100] = {0};

	assert_int_equal(n, 400);
	for (uint64_t k = 0; k < n; k++)
		per_sample[picks[k] % 100]++;
	for (int i = 0; i < 100; i++)
		assert_int_equal(per_sample[i], 4);
	assert_true(windows_hold_whole_blocks(picks, n, 100, 4, 30, 3));
	free(picks);
}

static void block_uses_count_every_served_read_of_a_sample_block(void **unused)
{
	/* 103 samples, augment 2, blocks of 10 (the last of 3), 3 ranks:
	 * 206 picks pad to 207, 69 a rank. */
	enum { N = 103, AUG = 2, B = 10, WORLD = 3 };
	uint64_t sum[11] = {0}, len, *list = td_block_order(N, AUG, B, 4, 3, 0, 1, &len);

	assert_int_equal(order_sample_blocks(N, B), 11);
	assert_int_equal(order_sample_block(0, N, B), 0);
	assert_int_equal(order_sample_block(102, N, B), 10);
	assert_int_equal(order_sample_block(103 + 15, N, B), 1); /* copy 1 of sample 15 */
	for (uint32_t r = 0; r < WORLD; r++) {
		uint64_t n, nb, *picks = td_block_order(N, AUG, B, 4, 3, r, WORLD, &n);
		uint32_t *uses;

		assert_int_equal(order_block_uses(picks, n, N, B, &uses, &nb), 0);
		assert_int_equal(nb, 11);
		for (uint64_t b = 0; b < nb; b++)
			sum[b] += uses[b];
		free(uses);
		free(picks);
	}
	/* Over the ranks: each sample block AUG times its rows, plus the one
	 * padded pick (the list's first) once more. */
	for (uint64_t b = 0; b < 11; b++) {
		uint64_t rows = b < 10 ? B : N - 10 * B;

		assert_int_equal(sum[b], AUG * rows + (b == order_sample_block(list[0], N, B)));
	}
	free(list);
}

static void block_uses_of_block_size_0_are_refused(void **unused)
{
	uint32_t canary, *uses = &canary;
	uint64_t nb = 5;

	assert_int_equal(order_block_uses(NULL, 0, 103, 0, &uses, &nb), -EINVAL);
	assert_null(uses);
	assert_int_equal(nb, 0);
}

static void block_order_memory_counts_the_block_permutation(void **unused)
{
	struct order_spec spec = {.kind = ORDER_BLOCK_SHUFFLE,
				  .world = 1,
				  .samples = 1000,
				  .block_rows = 10,
				  .window_blocks = 4};
	uint64_t peak, keep;

	order_memory(&spec, 2000, &peak, &keep);
	assert_int_equal(keep, 2000 * 8);
	assert_int_equal(peak, 2000 * 8 + 200 * 8);
	spec.world = 4;
	order_memory(&spec, 2000, &peak, &keep);
	assert_int_equal(keep, 500 * 8);
	assert_int_equal(peak, 500 * 8 + 2000 * 8 + 200 * 8);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(splitmix64_from_seed_0_gives_the_published_values),
		cmocka_unit_test(bounded_redraws_below_the_rejection_threshold),
		cmocka_unit_test(bounded_of_one_is_zero_and_costs_one_draw),
		cmocka_unit_test(bounded_stays_below_m_and_reaches_every_value),
		cmocka_unit_test(shuffle_of_10_with_seed_42_matches_the_reference),
		cmocka_unit_test(build_into_reuses_a_buffer_that_fits_and_frees_one_that_does_not),
		cmocka_unit_test(build_into_a_longer_buffer_holds_no_more_than_the_order),
		cmocka_unit_test(shuffle_of_16_with_seed_7_matches_the_reference),
		cmocka_unit_test(shuffle_is_a_permutation_for_every_size),
		cmocka_unit_test(long_shuffles_match_the_plain_algorithm),
		cmocka_unit_test(shuffle_of_nothing_writes_nothing),
		cmocka_unit_test(shuffle_depends_on_the_seed_only),
		cmocka_unit_test(sequential_order_is_the_identity),
		cmocka_unit_test(shuffle_order_of_one_rank_is_the_full_permutation),
		cmocka_unit_test(world_zero_is_taken_as_one),
		cmocka_unit_test(shards_pad_by_repeating_the_head),
		cmocka_unit_test(shards_cover_every_pick_once_when_world_divides),
		cmocka_unit_test(shards_are_equal_and_cover_everything_when_padded),
		cmocka_unit_test(padding_cycles_when_world_exceeds_the_list),
		cmocka_unit_test(explicit_order_keeps_the_given_picks_in_order),
		cmocka_unit_test(explicit_index_out_of_range_names_index_and_position),
		cmocka_unit_test(empty_explicit_list_is_refused),
		cmocka_unit_test(empty_schedule_is_refused),
		cmocka_unit_test(rank_not_below_world_is_refused),
		cmocka_unit_test(num_batches_rounds_up_unless_drop_last),
		cmocka_unit_test(block_shuffle_matches_the_documented_vectors),
		cmocka_unit_test(block_shuffle_of_4_ranks_matches_the_documented_shares),
		cmocka_unit_test(block_shuffle_keeps_every_pick_in_its_window),
		cmocka_unit_test(block_shuffle_mixes_within_windows),
		cmocka_unit_test(block_shards_of_4_ranks_are_the_padded_list),
		cmocka_unit_test(block_resume_at_start_batch_serves_the_same_suffix),
		cmocka_unit_test(block_larger_than_the_dataset_is_one_block_per_copy),
		cmocka_unit_test(window_larger_than_the_blocks_is_all_of_them),
		cmocka_unit_test(block_size_in_bytes_rounds_down_to_whole_samples),
		cmocka_unit_test(block_size_in_rows_and_bytes_at_once_is_refused),
		cmocka_unit_test(block_spec_without_a_size_or_a_whole_copy_is_refused),
		cmocka_unit_test(augmented_block_shuffle_keeps_copies_apart),
		cmocka_unit_test(block_uses_count_every_served_read_of_a_sample_block),
		cmocka_unit_test(block_uses_of_block_size_0_are_refused),
		cmocka_unit_test(block_order_memory_counts_the_block_permutation),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
