/*
 * test_integration_reload.c — SIGHUP (systemctl reload) against a real
 * prefetchd: datasets added and removed while a session streams, and the
 * session never notices.
 *
 * The daemon starts with datasets `a` and `b`.  A session opens on `a` and
 * takes part of a shuffled epoch; the config is rewritten without `a` and
 * with a new `c`, and the daemon gets SIGHUP.  Then: status lists b and c,
 * opening `a` is refused, opening `c` works, and the session on `a` takes
 * the rest of its epoch with every sample once and the right bytes.  A
 * config with a mistake leaves the running one in place.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "prefetch.h"
#include "testutil.h"

#define N_ROWS 3000
#define BATCH  64
#define SEED_A 5
#define SEED_B 6
#define SEED_C 7

static struct tdaemon td;

static void write_set(const char *name, uint64_t seed)
{
	char p[400];
	uint64_t shape[1] = {8};

	td_path(&td, name, p, sizeof(p));
	assert_int_equal(td_write_npy(p, 1, "<f4", 4, N_ROWS, shape, 1, seed, 0), 0);
}

/* Rewrites the config td_start wrote, with other datasets. */
static void rewrite_config(const char *datasets)
{
	FILE *f = fopen(td.conf, "w");

	assert_non_null(f);
	fprintf(f, "[daemon]\nsocket = %s\nreaders = 2\n%s", td.sock, datasets);
	fclose(f);
}

/* Sends SIGHUP and waits (5 s at most) until status shows `want` datasets
 * and the first is `first`. */
static Pf__Envelope *reload_and_wait(size_t want, const char *first)
{
	double deadline = td_now() + 5;

	assert_int_equal(kill(td.pid, SIGHUP), 0);
	while (td_now() < deadline) {
		Pf__Envelope *st = td_status(td.sock);

		if (st && st->status_reply->n_datasets == want &&
		    !strcmp(st->status_reply->datasets[0]->name, first))
			return st;
		if (st)
			pf__envelope__free_unpacked(st, NULL);
		usleep(20000);
	}
	fail_msg("status did not show the reloaded datasets within 5 s");
	return NULL;
}

static int open_set(struct pf_client **c, const char *name)
{
	int rc;

	assert_int_equal(pf_connect(td.sock, c), 0);
	rc = pf_open(*c, &(struct pf_open_opts){.dataset = name, .batch_size = BATCH});
	return rc;
}

/* Takes up to `limit` batches of the running epoch, checking every byte;
 * returns how many it took (0 at the end). */
static int take(struct pf_client *c, uint64_t seed, uint8_t *seen, int limit)
{
	struct pf_batch *b;
	int n = 0;

	while (n < limit && pf_next(c, 10000, &b) == 0 && b) {
		for (uint32_t k = 0; k < b->count; k++) {
			uint64_t p = b->picks[k];

			assert_true(p < N_ROWS);
			assert_false(seen[p]);
			seen[p] = 1;
			assert_true(td_row_ok((const uint8_t *)b->data[0] + k * 32, 32, seed, p));
		}
		assert_int_equal(pf_release(c, b, NULL), 0);
		n++;
	}
	return n;
}

static void reload_adds_and_removes_datasets_under_a_live_session(void **state)
{
	struct pf_client *a = NULL, *other = NULL;
	uint8_t seen[N_ROWS] = {0}, seen_c[N_ROWS] = {0};
	Pf__Envelope *st;
	uint64_t delivered = 0;
	int rc;

	assert_int_equal(td_init(&td, "reload"), 0);
	write_set("a.npy", SEED_A);
	write_set("b.npy", SEED_B);
	write_set("c.npy", SEED_C);
	assert_int_equal(
		td_start(&td, NULL, "[dataset.a]\nfield.x = a.npy\n[dataset.b]\nfield.x = b.npy\n"),
		0);

	assert_int_equal(open_set(&a, "a"), 0);
	assert_int_equal(
		pf_start_epoch(a, &(struct pf_epoch_opts){.order = PF_ORDER_SHUFFLE, .seed = 3},
			       NULL),
		0);
	assert_int_equal(take(a, SEED_A, seen, 10), 10);

	/* a goes, c comes, b stays. */
	rewrite_config("[dataset.b]\nfield.x = b.npy\n[dataset.c]\nfield.x = c.npy\n");
	st = reload_and_wait(2, "b");
	assert_string_equal(st->status_reply->datasets[1]->name, "c");
	assert_int_equal(st->status_reply->n_sessions, 1); /* the session on a */
	pf__envelope__free_unpacked(st, NULL);

	rc = open_set(&other, "a");
	print_message("open a after the reload: %d %s\n", rc, pf_errmsg(other));
	assert_int_equal(rc, -ENOENT);
	assert_non_null(strstr(pf_errmsg(other), "unknown dataset 'a'"));
	pf_close(other);

	assert_int_equal(open_set(&other, "c"), 0);
	assert_int_equal(
		pf_start_epoch(other, &(struct pf_epoch_opts){.order = PF_ORDER_SEQUENTIAL}, NULL),
		0);
	while (take(other, SEED_C, seen_c, 1000) > 0)
		;
	pf_close(other);
	for (uint64_t i = 0; i < N_ROWS; i++)
		assert_true(seen_c[i]);

	/* The session on the removed dataset never noticed. */
	while (take(a, SEED_A, seen, 1000) > 0)
		;
	for (uint64_t i = 0; i < N_ROWS; i++)
		delivered += seen[i];
	assert_int_equal(delivered, N_ROWS);
	pf_close(a);

	/* A config with a mistake: the running one stays. */
	rewrite_config("[dataset.b]\nfield.x = b.npy\nshape = 3\n");
	assert_int_equal(kill(td.pid, SIGHUP), 0);
	usleep(200000);
	st = td_status(td.sock);
	assert_non_null(st);
	assert_int_equal(st->status_reply->n_datasets, 2);
	pf__envelope__free_unpacked(st, NULL);
	assert_int_equal(open_set(&other, "c"), 0);
	pf_close(other);

	assert_int_equal(td_stop(&td, 5000), 0);
	{
		/* The log says what changed, what failed, and that a's files
		 * closed with its last session. */
		char line[600];
		int removed = 0, failed = 0, closed = 0;
		FILE *f = fopen(td.log, "r");

		assert_non_null(f);
		while (fgets(line, sizeof(line), f)) {
			removed += strstr(line, "dataset a removed") &&
				   strstr(line, "dataset c added");
			failed += strstr(line, "reload of") && strstr(line, "unknown key 'shape'");
			closed +=
				strstr(line, "dataset a: last session gone, files closed") != NULL;
		}
		fclose(f);
		assert_int_equal(removed, 1);
		assert_int_equal(failed, 1);
		assert_int_equal(closed, 1);
	}
	td_cleanup(&td);
	(void)state;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(reload_adds_and_removes_datasets_under_a_live_session),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
