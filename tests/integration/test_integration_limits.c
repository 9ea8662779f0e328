/*
 * test_integration_limits.c — one client cannot take what the others need:
 * every bound of the README's Limits section, hit on purpose against a
 * real prefetchd (the findings of issue 15 that are about size).
 *
 * Each case starts a daemon with small limits, starts a bystander (an
 * innocent trainer running byte-checked epochs and timing status over its
 * own connection, tests/lib/bystander.c), abuses the daemon, and checks
 * three things: the abuse was refused or bounded with a message naming
 * the limit, the daemon is alive, and the bystander's epochs stayed
 * byte-exact with status answering within a second throughout.  Cases about
 * memory also check that the daemon's RSS stayed within the budget set
 * for them (above what it held before the abuse).
 *
 * The bystander runs as this test's user (root in CI); abuses that fill a
 * memory or session quota run as other users (`nobody`, and uid 65533) in
 * forked children, since a quota is per uid: without root those cases
 * skip and say so.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client_int.h"
#include "npygen.h"
#include "prefetch.h"
#include "testutil.h"
#include "wire.h"

#include "abuse.h"

/* ---- 1: sizes that wrap ----------------------------------------------------- */

/* A sparse .npy of 2 rows of row_bytes bytes: the header says so, the file
 * is that long, and no block is written. */
static void write_sparse(const char *name, uint64_t row_bytes)
{
	char p[400];
	uint8_t hdr[256];
	uint64_t shape[1] = {row_bytes};
	size_t h = npygen_header(hdr, sizeof(hdr), 1, "|u1", 2, shape, 1);
	int fd;

	td_path(&td, name, p, sizeof(p));
	fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	assert_true(fd >= 0 && h > 0);
	assert_int_equal(write(fd, hdr, h), (ssize_t)h);
	assert_int_equal(ftruncate(fd, (off_t)(h + 2 * row_bytes)), 0);
	close(fd);
}

static void write_huge(void)
{
	write_sparse("huge.npy", 64 * MiB); /* rows of 2^26 bytes */
}

static void a_batch_whose_slot_would_wrap_is_refused(void **state)
{
	start_with(NULL, "[dataset.huge]\nfield.x = huge.npy\n", write_huge);
	/* 2^26 bytes x 2^23 samples = 2^49 bytes: past what a slot may be. */
	open_refused("huge", 1u << 23, 0, 0, -E2BIG, "is more than a slot may hold");
	/* The finding's own: 2^31 samples (it wrapped to a slot of 0 bytes
	 * and divided by it). */
	open_refused("huge", 1u << 31, 0, 0, -E2BIG, "batch_size 2147483648 is above 8388608");
	/* A slot that does not wrap but is over session_bytes. */
	open_refused("huge", 64, 0, 0, -E2BIG, "exceed session_bytes");
	finish();
}

/* ---- 4, 16: connections and sessions per user ---------------------------------- */

static void connections_beyond_a_users_share_are_refused_and_idle_ones_closed(void **state)
{
	int fds[20], n = 0, refused = 0, idle = 0;
	char why[400];

	start("max_conns_per_uid = 12\nmax_conns = 40\nidle_timeout = 1\n", NULL);
	/* The bystander holds 2 of this user's 12. */
	for (int i = 0; i < 20; i++)
		fds[n++] = raw_connect();
	usleep(200000);
	for (int i = 0; i < n; i++) {
		char b;

		if (recv(fds[i], &b, 1, MSG_PEEK | MSG_DONTWAIT) > 0) {
			assert_true(closed_with(fds[i], why, sizeof(why)));
			assert_non_null(strstr(why, "max_conns_per_uid = 12"));
			refused++;
			close(fds[i]);
			fds[i] = -1;
		}
	}
	print_message("  %d of 20 refused: %s\n", refused, why);
	assert_int_equal(refused, 10);
	/* The others said nothing and had no session: closed within a tick
	 * after idle_timeout. */
	for (int i = 0; i < n; i++) {
		if (fds[i] < 0)
			continue;
		assert_true(closed_with(fds[i], why, sizeof(why)));
		assert_non_null(strstr(why, "idle_timeout"));
		idle++;
		close(fds[i]);
	}
	assert_int_equal(idle, 10);
	assert_true(td_log_has(&td, "idle for", "with no session"));
	finish();
}

struct hold {
	int want, code; /* sessions to open; the refusal expected after them */
	const char *text;
	uint32_t batch;
};

/* Child: opens h->want sessions, holding their first batches (taken,
 * never released), expects the next to be refused, tells the parent and
 * waits for its word before it lets go.  0 when all went as expected. */
static int hold_sessions(void *arg)
{
	struct hold *h = arg;
	struct pf_client *c[64];
	int rc = 0, n;

	for (n = 0; n < h->want && !rc; n++) {
		struct pf_batch *batch;
		struct pf_epoch_opts eo = {.order = PF_ORDER_SHUFFLE, .seed = 1};

		c[n] = connect_open("rows", h->batch, 0, 0, &rc);
		if (!rc) /* every slot filled: the memory is touched */
			rc = pf_set_depth(c[n], 0, 16);
		if (!rc)
			rc = pf_start_epoch(c[n], &eo, NULL);
		if (!rc) /* taken and kept */
			rc = pf_next(c[n], (int)(5000 * td_patience()), &batch);
		if (rc)
			fprintf(stderr, "  [uid %u] session %d: %d %s\n", (unsigned)getuid(), n, rc,
				pf_errmsg(c[n]));
	}
	if (!rc) {
		int r;
		struct pf_client *x = connect_open("rows", h->batch, 0, 0, &r);

		fprintf(stderr, "  [uid %u] session %d refused: %d %s\n", (unsigned)getuid(), n, r,
			pf_errmsg(x));
		if (r != h->code || !strstr(pf_errmsg(x), h->text))
			rc = 1;
		pf_close(x);
	}
	if (child_holds(rc == 0))
		rc = 2;
	while (n-- > 0)
		pf_close(c[n]);
	return rc ? 1 : 0;
}

static void one_user_cannot_take_every_session(void **state)
{
	struct hold h = {
		.want = 3, .code = -EMFILE, .text = "max_sessions_per_uid = 3", .batch = 16};
	struct pf_client *mine[2];
	pid_t pid;
	int go, rc;
	char extra[300];

	need_root();
	snprintf(extra, sizeof(extra), "%smax_sessions = 8\nmax_sessions_per_uid = 3\n",
		 open_access);
	start(extra, NULL);
	pid = held_as(nobody, hold_sessions, &h, &go);
	/* nobody holds its 3; this user (the bystander's) still opens two. */
	for (int i = 0; i < 2; i++) {
		mine[i] = connect_open("rows", 16, 0, 0, &rc);
		assert_int_equal(rc, 0);
	}
	for (int i = 0; i < 2; i++)
		pf_close(mine[i]);
	let_go(pid, go);
	finish();
}

/* ---- 8: memory a user holds ------------------------------------------------------ */

static void sessions_that_never_release_are_held_to_the_memory_budget(void **state)
{
	/* Sessions of 18 slots of 1 MiB (batch 2048 of 512-byte rows). */
	struct hold a = {.want = 5, .code = -ENOMEM, .text = "memory_per_uid", .batch = 2048};
	struct hold b = {.want = 3, .code = -ENOMEM, .text = "memory_budget", .batch = 2048};
	const uint64_t budget = 160 * MiB;
	char extra[300];
	long before, after;
	pid_t pa, pb;
	int ga, gb;

	need_root();
	snprintf(extra, sizeof(extra), "%smemory_budget = 160M\nmemory_per_uid = 96M\n",
		 open_access);
	start(extra, NULL);
	usleep(200000);
	before = rss_kb();
	/* One user: five sessions (90 MiB), the sixth over its 96 MiB. */
	pa = held_as(nobody, hold_sessions, &a, &ga);
	/* Another: three more (54 MiB), the fourth over the 160 MiB of all. */
	pb = held_as(OTHER_UID, hold_sessions, &b, &gb);
	usleep(300000); /* their readers fill the slots: the memory is touched */
	after = rss_kb();
	print_message("  daemon RSS %ld kB before, %ld kB with 8 sessions held (budget %llu kB)\n",
		      before, after, (unsigned long long)(budget >> 10));
	assert_rss_grew_within(after - before, (long)(budget >> 10));
	assert_true(td_log_has(&td, "memory_budget = 160.0 MiB", NULL));
	let_go(pa, ga);
	let_go(pb, gb);
	finish();
}

/* Ten rows of 8 bytes: the smallest schedule, for orders and paced requests
 * far larger than the dataset (augment, repeated picks). */
static const char *const ten_dataset = "[dataset.ten]\nfield.x = ten.npy\n";

static void write_ten(void)
{
	char p[400];
	uint64_t shape[1] = {8};

	td_path(&td, "ten.npy", p, sizeof(p));
	assert_int_equal(td_write_npy(p, 1, "|u1", 1, 10, shape, 1, SEED, 0), 0);
}

/* ---- 9: paced requests -------------------------------------------------------- */

static int flood_paced(void *arg)
{
	uint64_t *picks = malloc(100000 * sizeof(*picks));
	struct pf_epoch_opts eo = {.order = PF_ORDER_PACED};
	struct pf_client *c;
	struct pf_batch *b;
	int rc, refused = 0;

	(void)arg;
	for (uint64_t i = 0; i < 100000; i++)
		picks[i] = i % 10;
	c = connect_open("ten", 100000, 0, 0, &rc);
	if (!rc)
		rc = pf_start_epoch(c, &eo, NULL);
	/* 200 requests of 100000 picks: 153 MiB asked for, never taken. */
	for (int i = 0; i < 200 && !rc; i++)
		rc = pf_load(c, picks, 100000);
	if (rc) {
		fprintf(stderr, "  [nobody] pf_load: %d %s\n", rc, pf_errmsg(c));
		goto out;
	}
	/* The refusals come back as the session's errors, then the batches
	 * that were accepted. */
	for (int i = 0; i < 400; i++) {
		rc = pf_next(c, (int)(5000 * td_patience()), &b);
		if (rc == -ENOMEM && strstr(pf_errmsg(c), "memory_per_uid")) {
			refused++;
			continue;
		}
		if (rc || !b)
			break;
		pf_release(c, b, NULL);
		if (refused)
			break;
	}
	fprintf(stderr, "  [nobody] %d paced request(s) refused: %s\n", refused, pf_errmsg(c));
	rc = refused > 0 ? 0 : 1;
out:
	pf_close(c);
	free(picks);
	return rc;
}

static void paced_requests_are_held_to_the_memory_quota(void **state)
{
	char extra[300];
	long before, after;

	need_root();
	snprintf(extra, sizeof(extra), "%smemory_per_uid = 64M\n", open_access);
	start_with(extra, ten_dataset, write_ten);
	before = rss_kb();
	assert_int_equal(td_as_user(nobody, flood_paced, NULL), 0);
	after = rss_kb();
	print_message("  daemon RSS %ld kB before, %ld kB after (memory_per_uid 65536 kB)\n",
		      before, after);
	assert_rss_grew_within(after - before, 64 * 1024 + 4 * 1024);
	finish();
}

/* ---- 10: frames begun and never finished ----------------------------------------- */

static int half_frames(void *arg)
{
	enum { NCONN = 8 };
	static uint8_t body[6 << 20];
	int fds[NCONN], closed = 0, quota = 0, timed = 0;
	char why[400];

	(void)arg;
	for (int i = 0; i < NCONN; i++) {
		uint8_t hdr[4] = {0xf0, 0xff, 0xff, 0x00}; /* a 16 MiB frame announced */

		fds[i] = raw_connect();
		if (write(fds[i], hdr, 4) != 4)
			return 2;
		fcntl(fds[i], F_SETFL, O_NONBLOCK);
		/* 6 MiB of it, and no more: the daemon holds what came. */
		for (size_t off = 0; off < sizeof(body);) {
			ssize_t n = write(fds[i], body + off, sizeof(body) - off);

			if (n > 0)
				off += (size_t)n;
			else if (errno == EAGAIN)
				usleep(1000);
			else
				break;
		}
	}
	for (int i = 0; i < NCONN; i++) {
		if (closed_with(fds[i], why, sizeof(why))) {
			closed++;
			quota += strstr(why, "memory_per_uid") != NULL;
			timed += strstr(why, "frame_timeout") != NULL;
		}
		fprintf(stderr, "  [nobody] connection %d: %s\n", i, why);
		close(fds[i]);
	}
	return closed == NCONN && quota > 0 && timed > 0 ? 0 : 1;
}

static void frames_begun_and_never_finished_time_out_within_the_quota(void **state)
{
	char extra[300];
	long before, after, most = 0;
	pid_t pid;
	int st;

	need_root();
	snprintf(extra, sizeof(extra), "%smemory_per_uid = 32M\nframe_timeout = 2\n", open_access);
	start(extra, NULL);
	before = rss_kb();
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0)
		_exit(td_as_user(nobody, half_frames, NULL));
	/* The daemon's RSS while the frames are held. */
	while (waitpid(pid, &st, WNOHANG) == 0) {
		long kb = rss_kb();

		most = kb > most ? kb : most;
		usleep(50000);
	}
	after = rss_kb();
	print_message("  daemon RSS %ld kB before, %ld kB at most, %ld kB after\n", before, most,
		      after);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	assert_rss_grew_within(most - before, 32 * 1024 + 8 * 1024);
	finish();
}

/* ---- 5, 6: orders and depth -------------------------------------------------------- */

static void a_huge_order_is_refused_and_a_big_one_built_off_the_loop(void **state)
{
	struct pf_epoch_opts eo = {.order = PF_ORDER_SHUFFLE, .seed = 3};
	struct pf_client *c;
	struct pf_batch *b;
	uint64_t batches = 0;
	long before;
	int rc;
	double t0;

	start_with("memory_budget = 1G\nmemory_per_uid = 512M\n", ten_dataset, write_ten);
	before = rss_kb();
	/* The finding's: augment 2e8 on 10 rows, a 16 GB order. */
	c = connect_open("ten", 1024, 0, 200000000, &rc);
	assert_int_equal(rc, 0);
	rc = pf_start_epoch(c, &eo, NULL);
	print_message("  huge order: %d %s\n", rc, pf_errmsg(c));
	assert_int_equal(rc, -ENOMEM);
	assert_non_null(strstr(pf_errmsg(c), "order of 2000000000 picks"));
	assert_non_null(strstr(pf_errmsg(c), "memory_per_uid"));
	pf_close(c);
	/* 32M picks (256 MiB): built on the thread pool while the bystander
	 * is served, then delivered. */
	c = connect_open("ten", 1u << 20, 4, 3200000, &rc);
	assert_int_equal(rc, 0);
	t0 = td_now();
	rc = pf_start_epoch(c, &eo, &batches);
	/* Answered at once, with the counts; the first batch comes once the
	 * order is built. */
	print_message("  32M-pick order: StartEpoch %d after %.3f s, %llu batches %s\n", rc,
		      td_now() - t0, (unsigned long long)batches, rc ? pf_errmsg(c) : "");
	assert_int_equal(rc, 0);
	assert_int_equal(batches, 31);
	assert_int_equal(pf_next(c, (int)(30000 * td_patience()), &b), 0);
	assert_non_null(b);
	print_message("  its first batch after %.2f s; daemon RSS then +%ld kB (memory_per_uid "
		      "524288 kB)\n",
		      td_now() - t0, rss_kb() - before);
	for (uint32_t i = 0; i < b->count; i += 997)
		assert_true(
			td_row_ok((const uint8_t *)b->data[0] + i * 8, 8, SEED, b->picks[i] % 10));
	assert_rss_grew_within(rss_kb() - before, 512 * 1024);
	pf_release(c, b, NULL);
	pf_close(c);
	assert_rss_grew_within(rss_kb() - before, 512 * 1024);
	finish();
}

static void a_depth_beyond_the_limit_is_refused_and_deep_sessions_slow_nobody(void **state)
{
	struct pf_epoch_opts eo = {.order = PF_ORDER_SHUFFLE, .seed = 4};
	struct pf_client *c[3];
	int rc;

	start("depth_limit = 256\n", NULL);
	/* The finding's: max_depth 10^9, batch 1. */
	open_refused("rows", 1, 1000000000, 0, -E2BIG, "above depth_limit = 256");
	/* Three sessions as deep as allowed, batch 1, filling every slot. */
	for (int i = 0; i < 3; i++) {
		c[i] = connect_open("rows", 1, 256, 0, &rc);
		assert_int_equal(rc, 0);
		assert_int_equal(pf_set_depth(c[i], 0, 256), 0);
		assert_int_equal(pf_start_epoch(c[i], &eo, NULL), 0);
	}
	usleep(500000);
	for (int i = 0; i < 3; i++)
		pf_close(c[i]);
	finish();
}

/* ---- issue 37: orders kept after their sessions ---------------------------------- */

/* The schedule of the kept-orders case: the ten rows 900000 times over,
 * 9M picks; a world-2 share of them is 36 MB, a world-16 one 4.5 MB.  The
 * cap of the kept orders holds eight world-16 shares, not one more.  The
 * schedule and the world-2 share are above 32 MiB, glibc's mmap threshold
 * at its highest, so each is a mapping of its own and goes back to the
 * system when freed: smaller ones come from a thread's heap once the
 * threshold has grown, and a heap's free top stays resident (malloc_trim
 * trims only the main heap's), which the RSS below would take for kept
 * memory. */
#define KEEP_AUGMENT 900000u
#define KEEP_SPACE   (10ull * KEEP_AUGMENT)
#define KEEP_BIG     (KEEP_SPACE / 2 * 8)
#define KEEP_SMALL   (KEEP_SPACE / 16 * 8)
#define KEEP_CAP     (36ull << 20)
#define KEEP_ROUNDS  7u

/* Waits (30 s at most, td_patience() times that under a sanitizer) until
 * status counts `want` bytes for session's orders: the one the epoch runs
 * and the next one's, once built ahead (while that is being built its peak
 * is counted, which is more). */
static void wait_order_bytes(uint64_t session, uint64_t want)
{
	double until = td_now() + 30 * td_patience();
	uint64_t got = 0;

	while (td_now() < until) {
		Pf__Envelope *env = td_status(td.sock);
		Pf__SessionStatus *st = td_session(env, session);

		got = st ? st->order_bytes : 0;
		pf__envelope__free_unpacked(env, NULL);
		if (got == want)
			return;
		usleep(2000);
	}
	fail_msg("session %llu: order_bytes %llu, never %llu", (unsigned long long)session,
		 (unsigned long long)got, (unsigned long long)want);
}

/* Waits (10 s at most, td_patience() times that) until status no longer
 * lists session: it has been detached, and its order built ahead is kept. */
static void wait_session_gone(uint64_t session)
{
	double until = td_now() + 10 * td_patience();

	for (;;) {
		Pf__Envelope *env = td_status(td.sock);
		bool gone = env && !td_session(env, session);

		pf__envelope__free_unpacked(env, NULL);
		if (gone)
			return;
		assert_true(td_now() < until);
		usleep(2000);
	}
}

/* Starts an epoch of shuffle seed, share rank 0 of world, and waits for
 * its order and the next one's, built ahead, to be there: each counted
 * as `share` bytes. */
static void keep_epoch(struct pf_client *c, uint64_t seed, uint32_t world, uint64_t share)
{
	struct pf_epoch_opts eo = {.order = PF_ORDER_SHUFFLE, .seed = seed, .world = world};
	struct pf_stats ps;
	struct pf_batch *b;

	assert_int_equal(pf_start_epoch(c, &eo, NULL), 0);
	assert_int_equal(pf_next(c, (int)(30000 * td_patience()), &b), 0);
	assert_non_null(b);
	assert_int_equal(pf_release(c, b, NULL), 0);
	assert_int_equal(pf_stats(c, &ps), 0);
	wait_order_bytes(ps.session, 2 * share);
}

static uint64_t session_of(struct pf_client *c)
{
	struct pf_stats ps;

	assert_int_equal(pf_stats(c, &ps), 0);
	return ps.session;
}

/* The sequence: a session runs a world-2 epoch (a share of half
 * the picks), then starts an epoch whose order an earlier session left in
 * the kept cache, and goes.  The order built ahead for that epoch used to
 * be built into the world-2 share's buffer and kept with it, counted by
 * its own picks (an eighth of the buffer here): round after round, the
 * daemon held 36 MB per 4.5 MB counted, outside every quota. */
static void kept_orders_are_counted_by_what_they_hold(void **state)
{
	char extra[200], cmd[700], out[16384], want[100];
	uint64_t seed = 1000, id;
	struct pf_client *c;
	Pf__Envelope *env;
	long before, after = 0;
	double until;
	int rc;

	snprintf(extra, sizeof(extra), "kept_order_bytes = %llu\n", (unsigned long long)KEEP_CAP);
	start_with(extra, ten_dataset, write_ten);
	before = rss_kb();
	/* An earlier session leaves the world-16 order of seed 1001, built
	 * ahead, in the cache. */
	c = connect_open("ten", 1000, 0, KEEP_AUGMENT, &rc);
	assert_int_equal(rc, 0);
	id = session_of(c);
	keep_epoch(c, seed, 16, KEEP_SMALL);
	pf_close(c);
	wait_session_gone(id);
	for (unsigned r = 0; r < KEEP_ROUNDS; r++) {
		c = connect_open("ten", 1000, 0, KEEP_AUGMENT, &rc);
		assert_int_equal(rc, 0);
		id = session_of(c);
		keep_epoch(c, 10 * r + 1, 2, KEEP_BIG);
		/* Kept: taken at once, and the next one built ahead. */
		keep_epoch(c, ++seed, 16, KEEP_SMALL);
		pf_close(c);
		wait_session_gone(id);
	}
	/* Each round keeps two world-16 orders and takes one: the cache is
	 * full, eight of them (the oldest dropped for the ninth), and counts
	 * each by its 4.5 MB. */
	env = td_status(td.sock);
	assert_non_null(env);
	print_message("  kept: %u orders, %llu bytes of %llu\n", env->status_reply->kept_orders,
		      (unsigned long long)env->status_reply->kept_order_bytes,
		      (unsigned long long)env->status_reply->kept_order_cap);
	assert_int_equal(env->status_reply->kept_orders, 8);
	assert_int_equal(env->status_reply->kept_order_bytes, 8 * KEEP_SMALL);
	assert_int_equal(env->status_reply->kept_order_cap, KEEP_CAP);
	pf__envelope__free_unpacked(env, NULL);
	/* prefetchctl says the same, in both forms. */
	snprintf(cmd, sizeof(cmd), "%s -s %s status --json", td_prefetchctl(), td.sock);
	assert_int_equal(td_capture(cmd, out, sizeof(out)), 0);
	snprintf(want, sizeof(want), "\"kept_orders\":8,\"kept_order_bytes\":%llu,",
		 (unsigned long long)(8 * KEEP_SMALL));
	assert_non_null(strstr(out, want));
	snprintf(cmd, sizeof(cmd), "%s -s %s status", td_prefetchctl(), td.sock);
	assert_int_equal(td_capture(cmd, out, sizeof(out)), 0);
	assert_non_null(strstr(out, "\nkept orders: 8, 34.3 MiB of 36.0 MiB\n"));
	/* What the daemon holds: the bystander's as before, the kept
	 * orders, and freed memory until the daemon's tick trims its heap
	 * (once a second), so it is looked at until then. */
	until = td_now() + 5;
	do {
		usleep(100000);
		after = rss_kb();
	} while (after - before > (long)((KEEP_CAP + 16 * MiB) >> 10) && td_now() < until);
	print_message("  daemon RSS %ld kB before, %ld kB after %u rounds (+%ld kB; kept "
		      "orders' cap %llu kB, margin 16384 kB)\n",
		      before, after, KEEP_ROUNDS, after - before,
		      (unsigned long long)(KEEP_CAP >> 10));
	assert_rss_grew_within(after - before, (long)((KEEP_CAP + 16 * MiB) >> 10));
	/* ... and they are what it grew by: what status counts is there. */
	if (!td_sanitizer())
		assert_true(after - before >= (long)((8 * KEEP_SMALL - 8 * MiB) >> 10));
	finish();
}

/* ---- 11: big batches of small samples ------------------------------------------------ */

static void one_epoch(struct pf_client *c, uint64_t n)
{
	struct pf_epoch_opts eo = {.order = PF_ORDER_SHUFFLE, .seed = 5};
	uint8_t *seen = calloc(n, 1);
	struct pf_batch *b;
	uint64_t got = 0;

	assert_non_null(seen);
	assert_int_equal(pf_start_epoch(c, &eo, NULL), 0);
	for (;;) {
		int rc = pf_next(c, (int)(30000 * td_patience()), &b);

		if (rc)
			fail_msg("pf_next: %d %s", rc, pf_errmsg(c));
		if (!b)
			break;
		for (uint32_t i = 0; i < b->count; i++) {
			uint64_t s = b->picks[i];

			assert_true(s < n && !seen[s]);
			seen[s] = 1;
			if (i % 4099 == 0)
				assert_true(td_row_ok((const uint8_t *)b->data[0] + i, 1, SEED, s));
		}
		got += b->count;
		pf_release(c, b, NULL);
	}
	assert_int_equal(got, n);
	free(seen);
}

static void write_bytes(void)
{
	char p[400];
	uint64_t shape[1] = {1};

	td_path(&td, "bytes.npy", p, sizeof(p));
	assert_int_equal(td_write_npy(p, 1, "|u1", 1, 8u << 20, shape, 1, SEED, 0), 0);
}

static void big_batches_of_small_samples_are_slowed_to_the_reader_not_cut_off(void **state)
{
	const uint64_t n = 8u << 20;
	struct pf_client *c;
	int rc;

	start_with(NULL, "[dataset.bytes]\nfield.x = bytes.npy\n", write_bytes);
	/* The finding's: batch 4M, and 600K at depth 16, of 1-byte rows. */
	c = connect_open("bytes", 4u << 20, 0, 0, &rc);
	assert_int_equal(rc, 0);
	one_epoch(c, n);
	pf_close(c);
	c = connect_open("bytes", 600000, 16, 0, &rc);
	assert_int_equal(rc, 0);
	assert_int_equal(pf_set_depth(c, 0, 16), 0);
	one_epoch(c, n);
	pf_close(c);
	finish();
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(a_batch_whose_slot_would_wrap_is_refused),
		cmocka_unit_test(connections_beyond_a_users_share_are_refused_and_idle_ones_closed),
		cmocka_unit_test(one_user_cannot_take_every_session),
		cmocka_unit_test(sessions_that_never_release_are_held_to_the_memory_budget),
		cmocka_unit_test(paced_requests_are_held_to_the_memory_quota),
		cmocka_unit_test(frames_begun_and_never_finished_time_out_within_the_quota),
		cmocka_unit_test(a_huge_order_is_refused_and_a_big_one_built_off_the_loop),
		cmocka_unit_test(a_depth_beyond_the_limit_is_refused_and_deep_sessions_slow_nobody),
		cmocka_unit_test(kept_orders_are_counted_by_what_they_hold),
		cmocka_unit_test(big_batches_of_small_samples_are_slowed_to_the_reader_not_cut_off),
	};

	/* A connection the daemon closes while a case still writes to it is
	 * an EPIPE, not this test's death. */
	signal(SIGPIPE, SIG_IGN);
	if (getenv("PF_TEST_FILTER")) /* one case, by glob, for a developer */
		cmocka_set_test_filter(getenv("PF_TEST_FILTER"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
