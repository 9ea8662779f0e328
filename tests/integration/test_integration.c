/*
 * test_integration.c — a real prefetchd on a temporary socket, driven by the
 * real client library (and, where a test needs to misbehave, by raw frames).
 *
 * Every delivered sample is checked byte for byte against what npygen's
 * formula says row `pick % N` of each field holds, and every epoch is checked
 * to deliver each pick exactly once.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client_int.h"
#include "prefetch.h"
#include "testutil.h"
#include "prefetch.pb-c.h"
#include "wire.h"

#define N_MAIN 1000
#define SEED_X 11
#define SEED_Y 22
#define SEED_Z 33

static struct tdaemon td;

/* README "Shuffle specification", computed there by the Python reference
 * implementation: the shuffle of 10 picks under seed 42. */
#define SHUFFLE_VECTOR_SEED42_N10                                                                  \
	{                                                                                          \
		0, 9, 5, 8, 6, 4, 7, 2, 1, 3                                                       \
	}

static uint64_t field_seed(const char *name)
{
	if (!strcmp(name, "x"))
		return SEED_X;
	if (!strcmp(name, "y"))
		return SEED_Y;
	return SEED_Z;
}

/* Checks every field of every sample of b against the generator. */
static void verify_batch(struct pf_client *c, const struct pf_batch *b)
{
	char why[300];

	assert_int_equal(b->nfields, pf_num_fields(c));
	if (!td_batch_ok(c, b, field_seed, why, sizeof(why)))
		fail_msg("%s", why);
}

struct run {
	uint64_t *picks; /* in delivery order */
	size_t npicks;
	uint64_t batches;
	uint64_t announced;
};

/* Opens a session, runs one epoch to its end (or `stop_after` batches),
 * verifies every batch, releases it, closes. */
static void run_epoch(const struct pf_open_opts *oo, const struct pf_epoch_opts *eo,
		      uint64_t stop_after, struct run *out)
{
	struct pf_client *c = NULL;
	struct pf_batch *b;
	uint64_t n;
	int rc;

	memset(out, 0, sizeof(*out));
	assert_int_equal(pf_connect(td.sock, &c), 0);
	rc = pf_open(c, oo);
	if (rc)
		fail_msg("pf_open: %s", pf_errmsg(c));
	n = pf_num_samples(c);
	rc = pf_start_epoch(c, eo, &out->announced);
	if (rc)
		fail_msg("pf_start_epoch: %s", pf_errmsg(c));
	out->picks = malloc(sizeof(uint64_t) * (n * (oo->augment ? oo->augment : 1) + 8));
	while (out->batches < stop_after) {
		rc = pf_next(c, 10000, &b);
		if (rc)
			fail_msg("pf_next: %d %s", rc, pf_errmsg(c));
		if (!b)
			break;
		assert_int_equal(b->seq, eo->start_batch + out->batches);
		verify_batch(c, b);
		memcpy(out->picks + out->npicks, b->picks, sizeof(uint64_t) * b->count);
		out->npicks += b->count;
		out->batches++;
		assert_int_equal(pf_release(c, b, NULL), 0);
	}
	pf_close(c);
}

static void assert_each_once(const uint64_t *picks, size_t n, uint64_t space)
{
	uint8_t *seen = calloc(space, 1);

	for (size_t i = 0; i < n; i++) {
		assert_true(picks[i] < space);
		if (seen[picks[i]])
			fail_msg("pick %llu delivered twice", (unsigned long long)picks[i]);
		seen[picks[i]] = 1;
	}
	free(seen);
}

static const char *MAIN_DATASETS = "[dataset.main]\n"
				   "format = npy\n"
				   "field.x = x0.npy, x1.npy, x2.npy\n"
				   "field.y = y.npy\n"
				   "field.z = z.npy\n"
				   "[dataset.tiny]\n"
				   "field.x = tx.npy\n";

static int setup_main(void **state)
{
	char p[400];
	uint64_t xs[2] = {3, 5}, zs[1] = {7};

	if (td_init(&td, "integ"))
		return -1;
	/* x: three shards of f4 (3, 5) rows, header v1; y: i8 scalars, v2;
	 * z: u1 (7,) rows, v3. */
	td_path(&td, "x0.npy", p, sizeof(p));
	td_write_npy(p, 1, "<f4", 4, 400, xs, 2, SEED_X, 0);
	td_path(&td, "x1.npy", p, sizeof(p));
	td_write_npy(p, 1, "<f4", 4, 300, xs, 2, SEED_X, 400);
	td_path(&td, "x2.npy", p, sizeof(p));
	td_write_npy(p, 1, "<f4", 4, 300, xs, 2, SEED_X, 700);
	td_path(&td, "y.npy", p, sizeof(p));
	td_write_npy(p, 2, "<i8", 8, N_MAIN, NULL, 0, SEED_Y, 0);
	td_path(&td, "z.npy", p, sizeof(p));
	td_write_npy(p, 3, "|u1", 1, N_MAIN, zs, 1, SEED_Z, 0);
	td_path(&td, "tx.npy", p, sizeof(p));
	td_write_npy(p, 1, "<f4", 4, 10, xs, 2, SEED_X, 0);
	if (td_start(&td, "", MAIN_DATASETS))
		return -1;
	(void)state;
	return 0;
}

static int teardown_main(void **state)
{
	int rc = td_stop(&td, 5000);

	td_cleanup(&td);
	(void)state;
	return rc == 0 ? 0 : -1;
}

static void sequential_epoch_delivers_every_sample_once(void **state)
{
	struct pf_open_opts oo = {.dataset = "main", .batch_size = 64};
	struct pf_epoch_opts eo = {.order = PF_ORDER_SEQUENTIAL};
	struct run r;

	run_epoch(&oo, &eo, UINT64_MAX, &r);
	assert_int_equal(r.npicks, N_MAIN);
	assert_int_equal(r.batches, (N_MAIN + 63) / 64);
	assert_int_equal(r.announced, r.batches);
	for (size_t i = 0; i < r.npicks; i++)
		assert_int_equal(r.picks[i], i);
	free(r.picks);
}

static void drop_last_drops_only_the_partial_batch(void **state)
{
	struct pf_open_opts oo = {.dataset = "main", .batch_size = 64, .drop_last = true};
	struct pf_epoch_opts eo = {.order = PF_ORDER_SHUFFLE, .seed = 5};
	struct run r, full;

	run_epoch(&oo, &eo, UINT64_MAX, &r);
	assert_int_equal(r.batches, N_MAIN / 64);
	assert_int_equal(r.npicks, N_MAIN / 64 * 64);
	assert_each_once(r.picks, r.npicks, N_MAIN);
	/* The same epoch without drop_last is the same order plus the tail. */
	oo.drop_last = false;
	run_epoch(&oo, &eo, UINT64_MAX, &full);
	assert_int_equal(full.npicks, N_MAIN);
	assert_memory_equal(full.picks, r.picks, r.npicks * sizeof(uint64_t));
	assert_each_once(full.picks, full.npicks, N_MAIN);
	free(r.picks);
	free(full.picks);
}

static void shuffled_order_is_the_documented_vector(void **state)
{
	/* README "Shuffle specification": seed 42 over 10 picks. */
	static const uint64_t want[10] = SHUFFLE_VECTOR_SEED42_N10;
	struct pf_open_opts oo = {.dataset = "tiny", .batch_size = 3};
	struct pf_epoch_opts eo = {.order = PF_ORDER_SHUFFLE, .seed = 42};
	struct run r;

	run_epoch(&oo, &eo, UINT64_MAX, &r);
	assert_int_equal(r.npicks, 10);
	assert_memory_equal(r.picks, want, sizeof(want));
	free(r.picks);
}

static void shuffled_epoch_delivers_every_sample_once(void **state)
{
	struct pf_open_opts oo = {.dataset = "main", .batch_size = 50};
	struct pf_epoch_opts eo = {.order = PF_ORDER_SHUFFLE, .seed = 1234};
	struct run r, again;
	size_t in_place = 0;

	run_epoch(&oo, &eo, UINT64_MAX, &r);
	assert_int_equal(r.npicks, N_MAIN);
	assert_each_once(r.picks, r.npicks, N_MAIN);
	for (size_t i = 0; i < r.npicks; i++)
		in_place += r.picks[i] == i;
	assert_true(in_place < N_MAIN / 10); /* it is shuffled */
	/* Deterministic: the same seed gives the same order. */
	run_epoch(&oo, &eo, UINT64_MAX, &again);
	assert_memory_equal(again.picks, r.picks, r.npicks * sizeof(uint64_t));
	free(r.picks);
	free(again.picks);
}

static void explicit_order_is_followed_exactly(void **state)
{
	uint64_t idx[300];
	struct pf_open_opts oo = {.dataset = "main", .batch_size = 32};
	struct pf_epoch_opts eo = {.order = PF_ORDER_EXPLICIT, .indices = idx, .nindices = 300};
	struct run r;

	for (int i = 0; i < 300; i++)
		idx[i] = (uint64_t)(i * 7919) % N_MAIN; /* repeats allowed, any order */
	idx[5] = idx[6] = 999;
	run_epoch(&oo, &eo, UINT64_MAX, &r);
	assert_int_equal(r.npicks, 300);
	assert_memory_equal(r.picks, idx, sizeof(idx));
	free(r.picks);
}

static void augment_covers_k_times_n_picks(void **state)
{
	struct pf_open_opts oo = {.dataset = "main", .batch_size = 100, .augment = 3};
	struct pf_epoch_opts eo = {.order = PF_ORDER_SHUFFLE, .seed = 9};
	struct run r;
	unsigned per_sample[N_MAIN] = {0};

	run_epoch(&oo, &eo, UINT64_MAX, &r);
	assert_int_equal(r.npicks, 3 * N_MAIN);
	assert_each_once(r.picks, r.npicks, 3 * N_MAIN);
	for (size_t i = 0; i < r.npicks; i++)
		per_sample[r.picks[i] % N_MAIN]++;
	for (int i = 0; i < N_MAIN; i++)
		assert_int_equal(per_sample[i], 3);
	free(r.picks);
}

static void four_ranks_cover_one_epoch_without_repeats(void **state)
{
	struct pf_client *c[4] = {0};
	uint64_t *all = calloc(N_MAIN, sizeof(uint64_t));
	size_t n = 0;
	bool done[4] = {0};
	int live = 4;

	/* Four consumers at once on one daemon, interleaved. */
	for (int r = 0; r < 4; r++) {
		struct pf_open_opts oo = {.dataset = "main", .batch_size = 16};
		struct pf_epoch_opts eo = {
			.order = PF_ORDER_SHUFFLE, .seed = 77, .rank = (uint32_t)r, .world = 4};
		uint64_t batches;

		assert_int_equal(pf_connect(td.sock, &c[r]), 0);
		assert_int_equal(pf_open(c[r], &oo), 0);
		assert_int_equal(pf_start_epoch(c[r], &eo, &batches), 0);
		assert_int_equal(batches, (N_MAIN / 4 + 15) / 16);
	}
	while (live) {
		for (int r = 0; r < 4; r++) {
			struct pf_batch *b;

			if (done[r])
				continue;
			assert_int_equal(pf_next(c[r], 10000, &b), 0);
			if (!b) {
				done[r] = true;
				live--;
				continue;
			}
			verify_batch(c[r], b);
			assert_true(n + b->count <= N_MAIN);
			memcpy(all + n, b->picks, b->count * sizeof(uint64_t));
			n += b->count;
			pf_release(c[r], b, NULL);
		}
	}
	assert_int_equal(n, N_MAIN);
	assert_each_once(all, n, N_MAIN);
	for (int r = 0; r < 4; r++)
		pf_close(c[r]);
	free(all);
}

static void resume_at_start_batch_receives_exactly_the_rest(void **state)
{
	struct pf_open_opts oo = {.dataset = "main", .batch_size = 30};
	struct pf_epoch_opts eo = {.order = PF_ORDER_SHUFFLE, .seed = 31337, .rank = 1, .world = 2};
	struct run full, head, rest;
	const uint64_t k = 6;

	run_epoch(&oo, &eo, UINT64_MAX, &full);
	assert_int_equal(full.npicks, N_MAIN / 2);
	run_epoch(&oo, &eo, k, &head); /* stops after k batches and closes */
	assert_int_equal(head.batches, k);
	eo.start_batch = k;
	run_epoch(&oo, &eo, UINT64_MAX, &rest);
	assert_int_equal(rest.announced, full.batches - k);
	assert_int_equal(head.npicks + rest.npicks, full.npicks);
	assert_memory_equal(head.picks, full.picks, head.npicks * sizeof(uint64_t));
	assert_memory_equal(rest.picks, full.picks + head.npicks, rest.npicks * sizeof(uint64_t));
	free(full.picks);
	free(head.picks);
	free(rest.picks);
}

/* Counts the daemon's memfds whose name carries this session's label. */
static int session_memfds(pid_t daemon, uint64_t session)
{
	char dir[64], link[512], path[600], want[64];
	struct dirent *e;
	DIR *d;
	int n = 0;

	snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)daemon);
	snprintf(want, sizeof(want), "/memfd:prefetchd-s%llu-", (unsigned long long)session);
	d = opendir(dir);
	if (!d)
		return -1;
	while ((e = readdir(d))) {
		ssize_t len;

		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		len = readlink(path, link, sizeof(link) - 1);
		if (len <= 0)
			continue;
		link[len] = '\0';
		n += strncmp(link, want, strlen(want)) == 0;
	}
	closedir(d);
	return n;
}

static void killed_consumer_is_reclaimed_within_100ms(void **state)
{
	int pipefd[2];
	pid_t child;
	uint64_t victim = 0;
	struct pf_client *c = NULL;
	struct pf_open_opts oo = {.dataset = "main", .batch_size = 20};
	struct pf_epoch_opts eo = {.order = PF_ORDER_SHUFFLE, .seed = 3};
	uint64_t *picks = calloc(N_MAIN, sizeof(uint64_t));
	size_t n = 0;
	struct pf_batch *b;
	Pf__Envelope *st;
	Pf__SessionStatus *ss;
	double t0, gone = -1;

	assert_int_equal(pipe(pipefd), 0);
	child = fork();
	if (child == 0) {
		struct pf_client *k = NULL;
		struct pf_batch *held[3];
		struct pf_stats s;

		if (pf_connect(td.sock, &k) || pf_open(k, &oo) || pf_start_epoch(k, &eo, NULL))
			_exit(1);
		for (int i = 0; i < 3; i++)
			if (pf_next(k, 10000, &held[i]) || !held[i])
				_exit(2);
		pf_stats(k, &s);
		if (write(pipefd[1], &s.session, sizeof(s.session)) != sizeof(s.session))
			_exit(3);
		pause(); /* holding three batches until killed */
		_exit(0);
	}
	close(pipefd[1]);
	assert_int_equal(read(pipefd[0], &victim, sizeof(victim)), sizeof(victim));
	close(pipefd[0]);

	/* A second consumer is mid-epoch when the first dies. */
	assert_int_equal(pf_connect(td.sock, &c), 0);
	assert_int_equal(pf_open(c, &oo), 0);
	assert_int_equal(pf_start_epoch(c, &eo, NULL), 0);
	for (int i = 0; i < 5; i++) {
		assert_int_equal(pf_next(c, 10000, &b), 0);
		assert_non_null(b);
		verify_batch(c, b);
		memcpy(picks + n, b->picks, b->count * sizeof(uint64_t));
		n += b->count;
		pf_release(c, b, NULL);
	}

	st = td_status(td.sock);
	ss = td_session(st, victim);
	assert_non_null(ss);
	assert_int_equal(ss->held, 3);
	pf__envelope__free_unpacked(st, NULL);
	assert_true(session_memfds(td.pid, victim) > 0);

	kill(child, SIGKILL);
	t0 = td_now();
	waitpid(child, NULL, 0);
	while (td_now() - t0 < 2.0) {
		st = td_status(td.sock);
		assert_non_null(st);
		ss = td_session(st, victim);
		pf__envelope__free_unpacked(st, NULL);
		if (!ss && session_memfds(td.pid, victim) == 0) {
			gone = td_now() - t0;
			break;
		}
		usleep(2000);
	}
	print_message("killed session %llu: slots and arenas gone after %.1f ms\n",
		      (unsigned long long)victim, gone * 1000);
	assert_true(gone >= 0);
	assert_true(gone < 0.100);

	/* The survivor finishes its epoch, every sample once, right bytes. */
	for (;;) {
		assert_int_equal(pf_next(c, 10000, &b), 0);
		if (!b)
			break;
		verify_batch(c, b);
		memcpy(picks + n, b->picks, b->count * sizeof(uint64_t));
		n += b->count;
		pf_release(c, b, NULL);
	}
	assert_int_equal(n, N_MAIN);
	assert_each_once(picks, n, N_MAIN);
	pf_close(c);
	free(picks);
}

static double json_number(const char *json, const char *key)
{
	char pat[64];
	const char *p;

	snprintf(pat, sizeof(pat), "\"%s\":", key);
	p = strstr(json, pat);
	if (!p)
		fail_msg("status --json has no \"%s\"", key);
	p += strlen(pat);
	while (*p == ' ')
		p++;
	return strtod(p, NULL);
}

static void status_json_matches_what_the_consumer_did(void **state)
{
	struct pf_client *c = NULL;
	struct pf_open_opts oo = {
		.dataset = "main", .batch_size = 10, .max_depth = 6, .name = "status-probe"};
	struct pf_epoch_opts eo = {.order = PF_ORDER_SEQUENTIAL};
	struct pf_batch *held[2], *b;
	struct pf_stats s;
	char cmd[512], json[16384];
	const char *sess;

	assert_int_equal(pf_connect(td.sock, &c), 0);
	assert_int_equal(pf_open(c, &oo), 0);
	assert_int_equal(pf_set_depth(c, 0, 4), 0);
	assert_int_equal(pf_start_epoch(c, &eo, NULL), 0);
	/* Take 7 batches, release 5, hold 2; busy 30 ms between calls. */
	for (int i = 0; i < 7; i++) {
		assert_int_equal(pf_next(c, 10000, &b), 0);
		assert_non_null(b);
		usleep(30000);
		if (i < 5)
			pf_release(c, b, NULL);
		else
			held[i - 5] = b;
	}
	/* Let the daemon refill up to target and hear the last ack. */
	usleep(200000);
	assert_int_equal(pf_stats(c, &s), 0);

	snprintf(cmd, sizeof(cmd), "%s -s %s status --json", td_prefetchctl(), td.sock);
	assert_int_equal(td_capture(cmd, json, sizeof(json)), 0);
	sess = strstr(json, "status-probe");
	assert_non_null(sess);
	/* The object of our session starts before its name. */
	while (sess > json && *sess != '{')
		sess--;
	assert_int_equal((uint64_t)json_number(sess, "session"), s.session);
	assert_int_equal((uint64_t)json_number(sess, "consumed"), 7);
	assert_int_equal((uint64_t)json_number(sess, "held"), 2);
	assert_int_equal((uint64_t)json_number(sess, "target"), 4);
	/* consumed 7 with target 4 in flight: 11 sent (ready ones are sent at once). */
	assert_int_equal((uint64_t)json_number(sess, "sent"), 11);
	assert_int_equal((uint64_t)json_number(sess, "ring_fill"), 0);
	assert_true(json_number(sess, "busy_s") > 0.15);
	assert_true(fabs(json_number(sess, "wait_s") - s.wait_s) < 0.05);
	assert_true(json_number(sess, "stall_fraction") >= 0 &&
		    json_number(sess, "stall_fraction") < 0.5);
	pf_release(c, held[0], NULL);
	pf_release(c, held[1], NULL);
	pf_close(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(sequential_epoch_delivers_every_sample_once),
		cmocka_unit_test(drop_last_drops_only_the_partial_batch),
		cmocka_unit_test(shuffled_order_is_the_documented_vector),
		cmocka_unit_test(shuffled_epoch_delivers_every_sample_once),
		cmocka_unit_test(explicit_order_is_followed_exactly),
		cmocka_unit_test(augment_covers_k_times_n_picks),
		cmocka_unit_test(four_ranks_cover_one_epoch_without_repeats),
		cmocka_unit_test(resume_at_start_batch_receives_exactly_the_rest),
		cmocka_unit_test(killed_consumer_is_reclaimed_within_100ms),
		cmocka_unit_test(status_json_matches_what_the_consumer_did),
	};

	return cmocka_run_group_tests(tests, setup_main, teardown_main);
}
