/*
 * test_order.c — the epoch order: splitmix64, the documented shuffle, and
 * DistributedSampler-style sharding.
 *
 * The expected vectors were printed by the Python reference implementation
 * in docs/SHUFFLE.md (an independent implementation of the same spec), so a
 * change to either side that breaks cross-language reproducibility fails
 * here.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "order.h"

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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(splitmix64_from_seed_0_gives_the_published_values),
		cmocka_unit_test(bounded_redraws_below_the_rejection_threshold),
		cmocka_unit_test(bounded_of_one_is_zero_and_costs_one_draw),
		cmocka_unit_test(bounded_stays_below_m_and_reaches_every_value),
		cmocka_unit_test(shuffle_of_10_with_seed_42_matches_the_reference),
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
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
