/*
 * test_integration_paced.c — paced epochs (the seed's coordinator-paced
 * LoadBatch) against a real prefetchd: the trainer chooses every batch's
 * picks, the daemon loads them ahead and delivers them in request order.
 *
 * Requests are explicit lists, lists with repeats and lists out of order;
 * every delivered sample's bytes are checked.  A request with a pick out of
 * range, or with more picks than batch_size, comes back as an error batch
 * in its place and the epoch goes on.  The governor loads no more than
 * `target` requested batches ahead of what the trainer has taken.
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

#define N     500
#define SEED  31
#define BATCH 8
#define ROW   24 /* bytes: 6 x f4 */

static struct tdaemon td;

static int setup(void **state)
{
	char p[400];
	uint64_t shape[1] = {6};

	if (td_init(&td, "paced"))
		return -1;
	td_path(&td, "x.npy", p, sizeof(p));
	if (td_write_npy(p, 1, "<f4", 4, N, shape, 1, SEED, 0))
		return -1;
	(void)state;
	return td_start(&td, NULL, "[dataset.x]\nfield.x = x.npy\n");
}

static int teardown(void **state)
{
	int rc = td_stop(&td, 5000);

	td_cleanup(&td);
	(void)state;
	return rc;
}

static struct pf_client *open_paced(void)
{
	struct pf_client *c = NULL;
	uint64_t batches = 99;

	assert_int_equal(pf_connect(td.sock, &c), 0);
	assert_int_equal(pf_open(c, &(struct pf_open_opts){.dataset = "x", .batch_size = BATCH}),
			 0);
	assert_int_equal(
		pf_start_epoch(c, &(struct pf_epoch_opts){.order = PF_ORDER_PACED}, &batches), 0);
	assert_int_equal(batches, 0); /* no order: the trainer decides */
	return c;
}

/* Takes the next batch and checks it is exactly `want`, bytes included. */
static void expect_batch(struct pf_client *c, uint64_t seq, const uint64_t *want, uint32_t n)
{
	struct pf_batch *b = NULL;

	assert_int_equal(pf_next(c, 10000, &b), 0);
	assert_non_null(b);
	assert_int_equal(b->seq, seq);
	assert_int_equal(b->count, n);
	for (uint32_t i = 0; i < n; i++) {
		assert_int_equal(b->picks[i], want[i]);
		assert_true(td_row_ok((const uint8_t *)b->data[0] + i * ROW, ROW, SEED, want[i]));
	}
	assert_int_equal(pf_release(c, b, NULL), 0);
}

static void paced_batches_arrive_in_request_order_with_their_rows(void **state)
{
	static const uint64_t reqs[][BATCH] = {
		{5, 3, 9},		   /* explicit */
		{1, 1, 1, 1},		   /* repeating */
		{499, 0, 250, 17, 16, 15}, /* out of order, both ends */
		{42},			   /* a batch of one */
		{7, 6, 5, 4, 3, 2, 1, 0},  /* a full batch, descending */
	};
	static const uint32_t lens[] = {3, 4, 6, 1, 8};
	struct pf_client *c = open_paced();
	struct pf_batch *b = NULL;

	/* All requested before any is taken: they come back in this order. */
	for (size_t r = 0; r < 5; r++)
		assert_int_equal(pf_load(c, reqs[r], lens[r]), 0);
	for (size_t r = 0; r < 5; r++)
		expect_batch(c, r, reqs[r], lens[r]);
	/* Requests after deliveries go on numbering. */
	assert_int_equal(pf_load(c, reqs[0], lens[0]), 0);
	expect_batch(c, 5, reqs[0], lens[0]);
	assert_int_equal(pf_load_end(c), 0);
	assert_int_equal(pf_next(c, 10000, &b), 0);
	assert_null(b); /* the epoch is over */
	assert_int_equal(pf_load(c, reqs[0], 1), -EINVAL);
	pf_close(c);
	(void)state;
}

static void bad_requests_become_error_batches_in_place(void **state)
{
	uint64_t good[2] = {10, 20}, range[3] = {1, N + 5, 2}, many[BATCH + 1];
	struct pf_client *c = open_paced();
	struct pf_batch *b = NULL;
	int rc;

	for (uint32_t i = 0; i < BATCH + 1; i++)
		many[i] = i;
	assert_int_equal(pf_load(c, good, 2), 0);
	assert_int_equal(pf_load(c, range, 3), 0);
	assert_int_equal(pf_load(c, many, BATCH + 1), 0);
	assert_int_equal(pf_load(c, good, 2), 0);
	assert_int_equal(pf_load_end(c), 0);

	expect_batch(c, 0, good, 2);
	rc = pf_next(c, 10000, &b);
	print_message("request 1: %d %s\n", rc, pf_errmsg(c));
	assert_int_equal(rc, -ERANGE);
	assert_non_null(strstr(pf_errmsg(c), "pick 505 at position 1 is out of range"));
	rc = pf_next(c, 10000, &b);
	print_message("request 2: %d %s\n", rc, pf_errmsg(c));
	assert_int_equal(rc, -EINVAL);
	assert_non_null(strstr(pf_errmsg(c), "9 picks asked for, more than batch_size 8"));
	expect_batch(c, 3, good, 2); /* the epoch went on */
	assert_int_equal(pf_next(c, 10000, &b), 0);
	assert_null(b);
	pf_close(c);
	(void)state;
}

static uint64_t status_sent(uint64_t session)
{
	Pf__Envelope *env = td_status(td.sock);
	Pf__SessionStatus *ss = td_session(env, session);
	uint64_t sent;

	assert_non_null(ss);
	sent = ss->sent;
	pf__envelope__free_unpacked(env, NULL);
	return sent;
}

static void governor_loads_only_target_requests_ahead(void **state)
{
	struct pf_client *c = open_paced();
	struct pf_stats ps;
	uint64_t picks[4];

	pf_stats(c, &ps);
	assert_int_equal(pf_set_depth(c, 0, 2), 0);
	for (uint64_t r = 0; r < 40; r++) {
		for (uint64_t k = 0; k < 4; k++)
			picks[k] = (r * 4 + k) % N;
		assert_int_equal(pf_load(c, picks, 4), 0);
	}
	usleep(300000);
	/* Nothing taken: the daemon has prepared (and sent) at most 2. */
	print_message("40 requested, none taken: %llu sent\n",
		      (unsigned long long)status_sent(ps.session));
	assert_true(status_sent(ps.session) <= 2);
	for (uint64_t r = 0; r < 40; r++) {
		for (uint64_t k = 0; k < 4; k++)
			picks[k] = (r * 4 + k) % N;
		expect_batch(c, r, picks, 4);
	}
	assert_int_equal(status_sent(ps.session), 40);
	pf_close(c);
	(void)state;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(paced_batches_arrive_in_request_order_with_their_rows),
		cmocka_unit_test(bad_requests_become_error_batches_in_place),
		cmocka_unit_test(governor_loads_only_target_requests_ahead),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
