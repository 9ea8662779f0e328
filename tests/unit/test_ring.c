/*
 * test_ring.c — the pinned reader ring: registered once for its whole life,
 * ranges handed out first fit, page-aligned and disjoint, and given back
 * so that neighbours merge into one range again; sessions' shares admitted
 * by the bytes left unreserved (not by the largest piece), split fairly by
 * GPU and then by session, and slots that wait served first come first.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpu/gpu.h"
#include "mem/ring.h"

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

/* ---- shares ---------------------------------------------------------------- */

/* The owners ring.wake was called for, in order. */
static int woken[64], nwoken;

static void record_wake(void *owner)
{
	assert_true(nwoken < 64);
	woken[nwoken++] = (int)(intptr_t)owner;
}

static void share_ring(struct ring *r, uint64_t bytes)
{
	char err[200];

	assert_int_equal(ring_init(r, bytes, err, sizeof(err)), 0);
	r->wake = record_wake;
	nwoken = 0;
}

static void take(struct ring *r, struct ring_lease *l, int owner, int gpu, uint32_t want,
		 uint32_t min, uint64_t stride)
{
	char err[300];
	int rc = ring_lease_take(r, l, (void *)(intptr_t)owner, gpu, want, min, stride, err,
				 sizeof(err));

	if (rc)
		fail_msg("lease %d refused: %s", owner, err);
	assert_int_equal(ring_check(r), 0);
}

/* Every slot of the lease that holds a piece goes back. */
static void put_all(struct ring_lease *l, int32_t *slots, int n)
{
	for (int i = 0; i < n; i++)
		if (slots[i] >= 0)
			ring_slot_put(l, slots[i]);
	assert_int_equal(ring_check(l->ring), 0);
}

/* The order that refused sessions when each held one range: small and big
 * leases alternate, the small ones close, and the free bytes are in holes
 * smaller than one big slot.  A big session opens all the same (its
 * minimum is reserved), its slot waits for a piece, and gets one as soon
 * as the busy slots come back. */
static void a_session_opens_while_unreserved_bytes_cover_it_however_the_ring_is_cut(void **u)
{
	struct ring r;
	struct ring_lease small[4], big[4];
	int32_t ss[4], bs[4], s;

	(void)u;
	share_ring(&r, 4 * MiB);
	for (int i = 0; i < 4; i++) {
		take(&r, &small[i], i, 0, 1, 1, 256 * 1024);
		take(&r, &big[i], 10 + i, 0, 1, 1, 768 * 1024);
	}
	for (int i = 0; i < 4; i++) {
		ss[i] = ring_slot_get(&small[i]);
		bs[i] = ring_slot_get(&big[i]);
		assert_true(ss[i] >= 0 && bs[i] >= 0);
	}
	assert_int_equal(r.used, 4 * MiB);
	/* The small ones go: 1 MiB free, in four holes of 256 KiB. */
	for (int i = 0; i < 4; i++) {
		put_all(&small[i], &ss[i], 1);
		ring_lease_give(&r, &small[i]);
	}
	assert_int_equal(r.bytes - r.used, MiB);
	assert_int_equal(ring_largest_free(&r), 256 * 1024);
	/* Another big one: 768 KiB of the unreserved 1 MiB.  It opens. */
	struct ring_lease late;

	take(&r, &late, 20, 0, 2, 1, 768 * 1024);
	/* Its slot waits: no piece is big enough yet. */
	assert_int_equal(ring_slot_get(&late), -1);
	assert_true(late.queued);
	/* One big slot comes back, next to a hole: a 1 MiB piece. */
	nwoken = 0;
	put_all(&big[0], &bs[0], 1);
	assert_int_equal(nwoken, 1);
	assert_int_equal(woken[0], 20);
	assert_ptr_equal(r.turn, &late);
	s = ring_slot_get(&late);
	assert_true(s >= 0);
	assert_null(r.turn);
	assert_false(late.queued);
	/* Its bytes are its own: nothing else holds them. */
	memset(ring_slot_mem(&late, s), 0xab, 768 * 1024);
	assert_int_equal(ring_check(&r), 0);
	put_all(&late, &s, 1);
	ring_lease_give(&r, &late);
	for (int i = 0; i < 4; i++) {
		put_all(&big[i], &bs[i], i ? 1 : 0);
		ring_lease_give(&r, &big[i]);
	}
	assert_int_equal(r.used, 0);
	assert_int_equal(r.reserved, 0);
	assert_int_equal(ring_largest_free(&r), 4 * MiB);
	ring_destroy(&r);
}

/* Refused only when the minimums would pass the ring, and then with what
 * the ring holds and for how many sessions. */
static void a_session_is_refused_only_when_the_minimums_would_pass_the_ring(void **u)
{
	struct ring r;
	struct ring_lease l[3], no;
	char err[300] = "";

	(void)u;
	share_ring(&r, 2 * MiB);
	take(&r, &l[0], 0, 0, 8, 2, 256 * 1024);
	take(&r, &l[1], 1, 0, 8, 2, 256 * 1024);
	/* 1 MiB reserved, 1 MiB left: 3 slots of 384 KiB do not fit. */
	assert_int_equal(ring_lease_take(&r, &no, (void *)3, 0, 8, 3, 384 * 1024, err, sizeof(err)),
			 -ENOSPC);
	assert_non_null(strstr(err, "no room for 3 batch(es) of 0.4 MiB"));
	assert_non_null(strstr(err, "ring_bytes = 2 MiB"));
	assert_non_null(strstr(err, "2 session(s) keep 1.0 MiB"));
	assert_null(no.ring);
	ring_lease_give(&r, &no); /* a refused lease gives back nothing */
	take(&r, &l[2], 2, 0, 8, 2, 512 * 1024);
	assert_int_equal(r.reserved, 2 * MiB);
	for (int i = 0; i < 3; i++)
		ring_lease_give(&r, &l[i]);
	assert_int_equal(r.reserved, 0);
	ring_destroy(&r);
}

/* Fair shares: the ring split evenly between the GPUs with sessions, a
 * GPU's part evenly between its sessions; what a session cannot use goes
 * to the others; nobody below its minimum; shares grow back on a close. */
static void shares_split_by_gpu_then_by_session_and_what_one_leaves_goes_to_the_others(void **u)
{
	struct ring r;
	struct ring_lease a, b, c, d;

	(void)u;
	share_ring(&r, 16 * MiB);
	take(&r, &a, 0, 0, 32, 2, MiB);
	assert_int_equal(a.cap, 16); /* alone: the whole ring */
	take(&r, &b, 1, 0, 32, 2, MiB);
	assert_int_equal(a.cap, 8);
	assert_int_equal(b.cap, 8);
	/* A session of another GPU gets that GPU's half. */
	take(&r, &c, 2, 1, 32, 2, MiB);
	assert_int_equal(c.cap, 8);
	assert_int_equal(a.cap, 4);
	assert_int_equal(b.cap, 4);
	/* One that wants little leaves the rest to its GPU's neighbours. */
	take(&r, &d, 3, 1, 2, 2, MiB);
	assert_int_equal(d.cap, 2);
	assert_int_equal(c.cap, 6);
	assert_int_equal(a.cap + b.cap + c.cap + d.cap, 16);
	ring_lease_give(&r, &c);
	ring_lease_give(&r, &d);
	assert_int_equal(a.cap, 8);
	assert_int_equal(b.cap, 8);
	/* A lease at its cap takes no more, and does not queue for it. */
	int32_t s[9];

	for (int i = 0; i < 8; i++)
		assert_true((s[i] = ring_slot_get(&a)) >= 0);
	assert_int_equal(ring_slot_get(&a), -1);
	assert_false(a.queued);
	put_all(&a, s, 8);
	ring_lease_give(&r, &a);
	ring_lease_give(&r, &b);
	ring_destroy(&r);
}

/* While a slot waits, nobody jumps the queue: a small slot that would fit
 * waits behind the big one, the ring drains until the big one fits, and
 * the turn then goes down the queue in order.  (The minimums may make the
 * shares add up to more than the ring: here 2.5 MiB of caps share 2.) */
static void a_waiting_big_slot_is_not_starved_by_small_ones(void **u)
{
	struct ring r;
	struct ring_lease s1, s2, big;
	int32_t a[2], b[2], bs;

	(void)u;
	share_ring(&r, 2 * MiB);
	take(&r, &s1, 1, 0, 8, 1, 256 * 1024);
	take(&r, &s2, 2, 0, 8, 1, 256 * 1024);
	take(&r, &big, 3, 0, 1, 1, 1536 * 1024);
	assert_int_equal(s1.cap, 2);
	assert_int_equal(s2.cap, 2);
	assert_int_equal(big.cap, 1);
	assert_true((a[0] = ring_slot_get(&s1)) >= 0);
	assert_true((a[1] = ring_slot_get(&s1)) >= 0);
	assert_true((b[0] = ring_slot_get(&s2)) >= 0);
	/* 1.25 MiB free: the big slot waits. */
	assert_int_equal(ring_slot_get(&big), -1);
	assert_true(big.queued);
	/* A small slot would fit, but waits behind it. */
	assert_int_equal(ring_slot_get(&s2), -1);
	assert_true(s2.queued);
	assert_int_equal(ring_check(&r), 0);
	/* Each piece back is the big one's turn; it tries, does not fit yet
	 * (the free bytes are in two pieces) and keeps its place. */
	nwoken = 0;
	put_all(&s1, &a[0], 1);
	assert_int_equal(nwoken, 1);
	assert_int_equal(woken[0], 3);
	assert_int_equal(ring_slot_get(&big), -1);
	assert_ptr_equal(r.wait_head, &big);
	assert_int_equal(ring_slot_get(&s2), -1); /* still behind it */
	put_all(&s1, &a[1], 1);
	assert_int_equal(ring_slot_get(&big), -1);
	put_all(&s2, &b[0], 1);
	assert_int_equal(woken[nwoken - 1], 3);
	bs = ring_slot_get(&big);
	assert_true(bs >= 0);
	/* Then the small one's turn, with the 512 KiB left. */
	assert_int_equal(woken[nwoken - 1], 2);
	assert_true((b[0] = ring_slot_get(&s2)) >= 0);
	assert_true((b[1] = ring_slot_get(&s2)) >= 0);
	assert_null(r.wait_head);
	assert_null(r.turn);
	put_all(&s2, b, 2);
	put_all(&big, &bs, 1);
	ring_lease_give(&r, &s1);
	ring_lease_give(&r, &s2);
	ring_lease_give(&r, &big);
	ring_destroy(&r);
}

/* A woken owner that wants nothing after all passes its turn on, and a
 * waiter that closes gives up its place: the queue never waits for a
 * session that will not come. */
static void a_turn_not_taken_passes_on_and_a_closed_waiter_leaves_the_queue(void **u)
{
	struct ring r;
	struct ring_lease hog, a, b, c;
	int32_t h, s[3];

	(void)u;
	share_ring(&r, 2 * MiB);
	take(&r, &hog, 9, 0, 1, 1, 1280 * 1024);
	take(&r, &a, 1, 0, 3, 1, 256 * 1024);
	take(&r, &b, 2, 0, 1, 1, 256 * 1024);
	take(&r, &c, 3, 0, 1, 1, 256 * 1024);
	assert_true((h = ring_slot_get(&hog)) >= 0);
	for (int i = 0; i < 3; i++)
		assert_true((s[i] = ring_slot_get(&a)) >= 0);
	assert_int_equal(r.used, r.bytes);
	assert_int_equal(ring_slot_get(&b), -1);
	assert_int_equal(ring_slot_get(&c), -1);
	nwoken = 0;
	put_all(&a, &s[0], 1);
	assert_int_equal(nwoken, 1);
	assert_int_equal(woken[0], 2);
	ring_turn_pass(&b);
	assert_int_equal(nwoken, 2);
	assert_int_equal(woken[1], 3);
	assert_ptr_equal(r.turn, &c);
	/* c closes with its turn; b (no longer queued) is not woken. */
	ring_lease_give(&r, &c);
	assert_int_equal(nwoken, 2);
	assert_null(r.turn);
	assert_null(r.wait_head);
	assert_true((s[0] = ring_slot_get(&b)) >= 0);
	put_all(&b, &s[0], 1);
	put_all(&a, &s[1], 2);
	put_all(&hog, &h, 1);
	ring_lease_give(&r, &a);
	ring_lease_give(&r, &b);
	ring_lease_give(&r, &hog);
	assert_int_equal(ring_check(&r), 0);
	ring_destroy(&r);
}

/* A session that closes while its slots wait leaves the queue at once, and
 * its turn goes on: the others do not wait for its reads to come back. */
static void a_closing_waiter_leaves_the_queue_and_passes_its_turn(void **u)
{
	struct ring r;
	struct ring_lease hog, a, b;
	int32_t h, sa, sb;

	(void)u;
	share_ring(&r, 2 * MiB);
	take(&r, &hog, 9, 0, 1, 1, 1536 * 1024);
	take(&r, &a, 1, 0, 2, 1, 256 * 1024);
	take(&r, &b, 2, 0, 1, 1, 256 * 1024);
	assert_int_equal(a.cap, 2);
	assert_true((h = ring_slot_get(&hog)) >= 0);
	assert_true((sa = ring_slot_get(&a)) >= 0);
	assert_true((sb = ring_slot_get(&b)) >= 0);
	assert_int_equal(r.used, r.bytes);
	/* Queued: it leaves the queue. */
	assert_int_equal(ring_slot_get(&a), -1);
	assert_true(a.queued);
	ring_wait_cancel(&a);
	assert_false(a.queued);
	assert_null(r.wait_head);
	/* With the turn: nobody keeps it. */
	assert_int_equal(ring_slot_get(&a), -1);
	nwoken = 0;
	ring_slot_put(&b, sb);
	assert_int_equal(nwoken, 1);
	assert_ptr_equal(r.turn, &a);
	ring_wait_cancel(&a);
	assert_null(r.turn);
	assert_int_equal(ring_check(&r), 0);
	assert_true((sb = ring_slot_get(&b)) >= 0); /* anyone may take now */
	ring_slot_put(&b, sb);
	ring_slot_put(&a, sa);
	ring_slot_put(&hog, h);
	ring_lease_give(&r, &a);
	ring_lease_give(&r, &b);
	ring_lease_give(&r, &hog);
	assert_int_equal(ring_check(&r), 0);
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
		cmocka_unit_test_setup(
			a_session_opens_while_unreserved_bytes_cover_it_however_the_ring_is_cut,
			setup),
		cmocka_unit_test_setup(
			a_session_is_refused_only_when_the_minimums_would_pass_the_ring, setup),
		cmocka_unit_test_setup(
			shares_split_by_gpu_then_by_session_and_what_one_leaves_goes_to_the_others,
			setup),
		cmocka_unit_test_setup(a_waiting_big_slot_is_not_starved_by_small_ones, setup),
		cmocka_unit_test_setup(a_closing_waiter_leaves_the_queue_and_passes_its_turn,
				       setup),
		cmocka_unit_test_setup(
			a_turn_not_taken_passes_on_and_a_closed_waiter_leaves_the_queue, setup),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
