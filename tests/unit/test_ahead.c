/*
 * test_ahead.c — the orders kept after their sessions (ahead.h's
 * order_keep): what they are counted by, and the cap on it.  The order
 * built ahead itself is tested through a session (test_sess.c).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "order/ahead.h"

static uint64_t *picks_of(uint64_t n)
{
	uint64_t *p = calloc(n, sizeof(*p));

	assert_non_null(p);
	return p;
}

static void keep(struct order_keep *k, uint64_t seed, uint64_t n, uint64_t cap)
{
	struct order_spec spec = {.kind = ORDER_SHUFFLE, .seed = seed, .world = 16};

	order_keep_put(k, &spec, 16 * n, picks_of(n), n, 60, 0, cap);
	assert_true(order_keep_check(k));
}

/* The cap is on bytes held: the oldest go until the newest fits, and one
 * larger than the cap is not kept at all. */
static void kept_orders_stay_under_their_cap_in_bytes(void **unused)
{
	struct order_keep k = {0};
	struct order_spec spec = {.kind = ORDER_SHUFFLE, .seed = 1, .world = 16};
	uint64_t n;

	keep(&k, 1, 1000, 24000);
	keep(&k, 2, 1000, 24000);
	keep(&k, 3, 1000, 24000);
	assert_int_equal(k.n, 3);
	assert_int_equal(k.bytes, 24000);
	/* A fourth: the first goes. */
	keep(&k, 4, 1000, 24000);
	assert_int_equal(k.n, 3);
	assert_int_equal(k.bytes, 24000);
	assert_null(order_keep_take(&k, &spec, 16000, &n));
	/* One of 2000 picks: two more go. */
	keep(&k, 5, 2000, 24000);
	assert_int_equal(k.n, 2);
	assert_int_equal(k.bytes, 24000);
	/* One past the cap is freed at once; a cap of 0 keeps nothing. */
	keep(&k, 6, 3001, 24000);
	assert_int_equal(k.n, 2);
	keep(&k, 7, 1, 0);
	assert_int_equal(k.n, 2);
	order_keep_purge(&k, INT64_MAX);
	assert_int_equal(k.n, 0);
	assert_int_equal(k.bytes, 0);
}

/* Taken, an order leaves the count with its bytes. */
static void a_kept_order_taken_leaves_the_count(void **unused)
{
	struct order_keep k = {0};
	struct order_spec spec = {.kind = ORDER_SHUFFLE, .seed = 2, .world = 16};
	uint64_t *p, n;

	keep(&k, 1, 1000, 1 << 20);
	keep(&k, 2, 500, 1 << 20);
	p = order_keep_take(&k, &spec, 16 * 500, &n);
	assert_non_null(p);
	assert_int_equal(n, 500);
	assert_int_equal(k.n, 1);
	assert_int_equal(k.bytes, 8000);
	assert_true(order_keep_check(&k));
	free(p);
	order_keep_purge(&k, INT64_MAX);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(kept_orders_stay_under_their_cap_in_bytes),
		cmocka_unit_test(a_kept_order_taken_leaves_the_count),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
