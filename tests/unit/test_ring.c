/*
 * test_ring.c — the pinned reader ring: registered once for its whole life,
 * ranges handed out first fit, page-aligned and disjoint, and given back
 * so that neighbours merge into one range again.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "gpu.h"
#include "ring.h"

#define MiB (1ull << 20)

static int setup(void **state)
{
	char desc[128];

	gpu_fake_reset();
	assert_int_equal(gpu_init(desc, sizeof(desc)), 1);
	return 0;
}

static void ring_is_registered_once_and_unregistered_at_destroy(void **unused)
{
	struct ring r;
	char err[200];

	assert_int_equal(ring_init(&r, 3 * MiB, err, sizeof(err)), 0);
	assert_int_equal(gpu_fake_host_registrations(), 1);
	assert_true(r.bytes >= 3 * MiB && r.bytes % (2 * MiB) == 0);
	assert_int_equal(ring_largest_free(&r), r.bytes);
	ring_destroy(&r);
	assert_int_equal(gpu_fake_host_registrations(), 0);
}

static void ranges_are_page_aligned_disjoint_and_writable(void **unused)
{
	struct ring r;
	uint64_t off[3];
	char err[200];

	assert_int_equal(ring_init(&r, 4 * MiB, err, sizeof(err)), 0);
	assert_int_equal(ring_take(&r, 1000, &off[0]), 0);
	assert_int_equal(ring_take(&r, 5000, &off[1]), 0);
	assert_int_equal(ring_take(&r, MiB, &off[2]), 0);
	for (int i = 0; i < 3; i++)
		assert_int_equal(off[i] % RING_ALIGN, 0);
	assert_int_equal(off[0], 0);
	assert_int_equal(off[1], 4096);	    /* 1000 rounded up to a page */
	assert_int_equal(off[2], 3 * 4096); /* 5000 took two pages */
	assert_int_equal(r.used, 3 * 4096 + MiB);
	memset(r.base + off[2], 0xab, MiB);
	assert_int_equal(r.base[off[0]], 0);
	ring_give(&r, off[0], 1000);
	ring_give(&r, off[1], 5000);
	ring_give(&r, off[2], MiB);
	assert_int_equal(r.used, 0);
	ring_destroy(&r);
}

static void a_full_ring_refuses_and_takes_again_after_a_give(void **unused)
{
	struct ring r;
	uint64_t a, b, c;
	char err[200];

	assert_int_equal(ring_init(&r, 2 * MiB, err, sizeof(err)), 0);
	assert_int_equal(ring_take(&r, MiB, &a), 0);
	assert_int_equal(ring_take(&r, MiB, &b), 0);
	assert_int_equal(ring_take(&r, 4096, &c), -ENOSPC);
	assert_int_equal(ring_largest_free(&r), 0);
	ring_give(&r, a, MiB);
	assert_int_equal(ring_take(&r, MiB, &c), 0);
	assert_int_equal(c, a);
	ring_give(&r, b, MiB);
	ring_give(&r, c, MiB);
	ring_destroy(&r);
}

static void given_back_neighbours_merge_into_one_range(void **unused)
{
	struct ring r;
	uint64_t o[4], big;
	char err[200];

	assert_int_equal(ring_init(&r, 2 * MiB, err, sizeof(err)), 0);
	for (int i = 0; i < 4; i++)
		assert_int_equal(ring_take(&r, MiB / 2, &o[i]), 0);
	/* Out of order: middle ones first, then the ends. */
	ring_give(&r, o[1], MiB / 2);
	ring_give(&r, o[2], MiB / 2);
	assert_int_equal(ring_largest_free(&r), MiB);
	ring_give(&r, o[3], MiB / 2);
	ring_give(&r, o[0], MiB / 2);
	assert_int_equal(ring_largest_free(&r), 2 * MiB);
	assert_int_equal(ring_take(&r, 2 * MiB, &big), 0);
	assert_int_equal(big, 0);
	ring_give(&r, big, 2 * MiB);
	ring_destroy(&r);
}

static void a_failed_registration_leaves_no_ring(void **unused)
{
	struct ring r;
	uint64_t off;
	char err[200] = "";

	gpu_fake_reset();
	gpu_fake_set_devices(0); /* no device: registration fails */
	{
		char desc[128];

		assert_int_equal(gpu_init(desc, sizeof(desc)), -ENODEV);
	}
	assert_true(ring_init(&r, MiB, err, sizeof(err)) < 0);
	assert_non_null(strstr(err, "cannot page-lock"));
	assert_null(r.base);
	assert_int_equal(ring_take(&r, 4096, &off), -ENOSPC);
	ring_destroy(&r);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(ring_is_registered_once_and_unregistered_at_destroy, setup),
		cmocka_unit_test_setup(ranges_are_page_aligned_disjoint_and_writable, setup),
		cmocka_unit_test_setup(a_full_ring_refuses_and_takes_again_after_a_give, setup),
		cmocka_unit_test_setup(given_back_neighbours_merge_into_one_range, setup),
		cmocka_unit_test_setup(a_failed_registration_leaves_no_ring, setup),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
