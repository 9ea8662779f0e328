/*
 * test_integration_restart.c — a real prefetchd killed under a real
 * consumer: SIGKILL at chosen points (mid-epoch, between epochs, while a
 * reply is awaited, inside a frame), then, for consumers that reconnect,
 * the same daemon started again on the same socket and config.
 *
 * Two promises are checked.  Without reconnect_s every blocking call
 * returns an error within a second of the kill, and a daemon that is only
 * stopped (SIGSTOP) is waited for, not declared dead: the kill lands
 * 300 ms after the call began, while the daemon is stopped, so a call
 * that returned early, or late, fails the test.  With reconnect_s the
 * epoch ends with every sample exactly once, byte for byte, in the order
 * an uninterrupted epoch has.
 *
 * DESIGN: the test's own thread drives the client; a second thread only
 * sends the kill (or kills and restarts) at a set time, so that the main
 * thread can be blocked inside the library when it lands.  The daemon is
 * started fresh for every case.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <pthread.h>
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

#define N	 1000
#define SEED_X	 11
#define SEED_Y	 22
#define BATCH	 32
#define NBATCHES ((N + BATCH - 1) / BATCH)
/* How long the daemon stays stopped before the kill: a call that returns
 * before this declared a stopped daemon dead. */
#define STOPPED_MS 300
/* The promise: an error within this long of the kill. */
#define DETECT_S 1.0

static const char *DATASETS = "[dataset.main]\n"
			      "format = npy\n"
			      "field.x = x.npy\n"
			      "field.y = y.npy\n";
/* What the daemon serves after a restart with another config. */
static const char *OTHER_DATASETS = "[dataset.other]\n"
				    "format = npy\n"
				    "field.x = x.npy\n";

static struct tdaemon td;

static int setup(void **state)
{
	char p[400];
	uint64_t xs[2] = {3, 5};

	if (td_init(&td, "restart"))
		return -1;
	td_path(&td, "x.npy", p, sizeof(p));
	if (td_write_npy(p, 1, "<f4", 4, N, xs, 2, SEED_X, 0))
		return -1;
	td_path(&td, "y.npy", p, sizeof(p));
	if (td_write_npy(p, 1, "<i8", 8, N, NULL, 0, SEED_Y, 0))
		return -1;
	if (td_start(&td, "", DATASETS))
		return -1;
	(void)state;
	return 0;
}

static int teardown(void **state)
{
	td_cleanup(&td);
	(void)state;
	return 0;
}

/* ---- helpers ------------------------------------------------------------------ */

static uint64_t field_seed(const char *name)
{
	return !strcmp(name, "x") ? SEED_X : SEED_Y;
}

static void verify_batch(struct pf_client *c, const struct pf_batch *b)
{
	char why[300];

	assert_int_equal(b->nfields, 2);
	assert_int_equal(pf_num_samples(c), N);
	if (!td_batch_ok(c, b, field_seed, why, sizeof(why)))
		fail_msg("%s", why);
}

static struct pf_client *open_client(double reconnect_s)
{
	struct pf_open_opts oo = {
		.dataset = "main", .batch_size = BATCH, .reconnect_s = reconnect_s};
	struct pf_client *c = NULL;
	int rc;

	rc = pf_connect(td.sock, &c);
	if (rc)
		fail_msg("pf_connect: %s", pf_errmsg(c));
	rc = pf_open(c, &oo);
	if (rc)
		fail_msg("pf_open: %s", pf_errmsg(c));
	return c;
}

static void start(struct pf_client *c, uint64_t seed, uint32_t rank, uint32_t world)
{
	struct pf_epoch_opts eo = {
		.order = PF_ORDER_SHUFFLE, .seed = seed, .rank = rank, .world = world};
	int rc = pf_start_epoch(c, &eo, NULL);

	if (rc)
		fail_msg("pf_start_epoch: %s", pf_errmsg(c));
}

/* An epoch's picks in delivery order. */
struct picks {
	uint64_t v[2 * N];
	size_t n;
	uint64_t batches;
};

/* Takes one batch (waiting up to 10 s), checks its seq and bytes and
 * records its picks; the batch is released unless keep.  Returns it, or
 * NULL at the end of the epoch. */
static struct pf_batch *take_one(struct pf_client *c, struct picks *p, bool keep)
{
	struct pf_batch *b;
	int rc = pf_next(c, 10000, &b);

	if (rc)
		fail_msg("pf_next after %llu batches: %d %s", (unsigned long long)p->batches, rc,
			 pf_errmsg(c));
	if (!b)
		return NULL;
	assert_int_equal(b->seq, p->batches);
	verify_batch(c, b);
	memcpy(p->v + p->n, b->picks, b->count * sizeof(uint64_t));
	p->n += b->count;
	p->batches++;
	if (!keep)
		assert_int_equal(pf_release(c, b, NULL), 0);
	return b;
}

/* The whole epoch from a fresh client on a daemon nothing happens to. */
static void reference_epoch(uint64_t seed, uint32_t rank, uint32_t world, struct picks *p)
{
	struct pf_client *c = open_client(0);

	memset(p, 0, sizeof(*p));
	start(c, seed, rank, world);
	while (take_one(c, p, false))
		;
	pf_close(c);
}

static void assert_same_picks(const struct picks *got, const struct picks *want)
{
	assert_int_equal(got->batches, want->batches);
	assert_int_equal(got->n, want->n);
	for (size_t i = 0; i < got->n; i++)
		if (got->v[i] != want->v[i])
			fail_msg("pick %zu is %llu, an uninterrupted epoch has %llu there", i,
				 (unsigned long long)got->v[i], (unsigned long long)want->v[i]);
}

static void assert_each_once(const uint64_t *v, size_t n)
{
	uint8_t seen[N] = {0};

	assert_int_equal(n, N);
	for (size_t i = 0; i < n; i++) {
		assert_true(v[i] < N);
		if (seen[v[i]])
			fail_msg("pick %llu delivered twice", (unsigned long long)v[i]);
		seen[v[i]] = 1;
	}
}

/* This process's mappings of the daemons' host arenas (memfds the daemon
 * names prefetchd-sSESSION-aARENA). */
static int arena_mappings(void)
{
	FILE *maps = fopen("/proc/self/maps", "r");
	char line[512];
	int n = 0;

	assert_non_null(maps);
	while (fgets(line, sizeof(line), maps))
		n += strstr(line, "memfd:prefetchd-s") != NULL;
	fclose(maps);
	return n;
}

static void assert_says_it_went_away(struct pf_client *c)
{
	const char *msg = pf_errmsg(c);

	if (!strstr(msg, td.sock) || !strstr(msg, "went away"))
		fail_msg("pf_errmsg does not name %s and say it went away: \"%s\"", td.sock, msg);
}

/* ---- a killer on a timer --------------------------------------------------------- */

struct killer {
	pthread_t thread;
	pid_t pid;
	int after_ms;	  /* SIGKILL this long after killer_start */
	int restart_ms;	  /* > 0: td_start again this long after the kill */
	double killed_at; /* td_now() just before the kill */
	int restart_rc;
	/* A restarting killer lives until killer_join closes hold[1]: the
	 * daemon it forked gets td_start's parent-death signal when the
	 * forking thread ends, not when the process does. */
	int hold[2];
};

static void *killer_main(void *arg)
{
	struct killer *k = arg;

	usleep(k->after_ms * 1000);
	k->killed_at = td_now();
	kill(k->pid, SIGKILL);
	if (k->restart_ms > 0) {
		waitpid(k->pid, NULL, 0);
		td.pid = 0;
		usleep(k->restart_ms * 1000);
		k->restart_rc = td_start(&td, "", DATASETS);
		while (read(k->hold[0], &(char){0}, 1) < 0 && errno == EINTR)
			;
	}
	return NULL;
}

static void killer_start(struct killer *k, int after_ms, int restart_ms)
{
	memset(k, 0, sizeof(*k));
	k->pid = td.pid;
	k->after_ms = after_ms;
	k->restart_ms = restart_ms;
	assert_int_equal(pipe2(k->hold, O_CLOEXEC), 0);
	assert_int_equal(pthread_create(&k->thread, NULL, killer_main, k), 0);
}

/* Joins the killer and reaps the daemon it killed.  One it started again
 * gets SIGTERM as the killer ends: call this once the test is done with
 * it (td_cleanup reaps it). */
static void killer_join(struct killer *k)
{
	close(k->hold[1]);
	pthread_join(k->thread, NULL);
	close(k->hold[0]);
	if (!k->restart_ms)
		td_kill(&td);
	else
		assert_int_equal(k->restart_rc, 0);
}

/* ---- without reconnection: an error within a second ------------------------------- */

enum blocking_call {
	CALL_CONNECT, /* pf_connect: hello awaits its reply */
	CALL_OPEN,
	CALL_START_EPOCH,
	CALL_NEXT_FOREVER, /* pf_next(-1) on an empty queue */
	CALL_SET_DEPTH,
	CALL_ABANDON,
	CALL_COUNT
};

static const char *const CALL_NAME[CALL_COUNT] = {
	"pf_connect", "pf_open", "pf_start_epoch", "pf_next(-1)", "pf_set_depth", "pf_abandon",
};

/* Brings a client to the point just before `call`, stops the daemon, has
 * it killed STOPPED_MS later, makes the call and measures. */
static double kill_during(enum blocking_call call)
{
	struct pf_client *c = NULL;
	struct pf_batch *b;
	struct killer k;
	double t0, t1;
	int rc = 0;

	if (call != CALL_CONNECT) {
		assert_int_equal(pf_connect(td.sock, &c), 0);
		if (call != CALL_OPEN) {
			pf_close(c);
			c = open_client(0);
		}
		if (call == CALL_NEXT_FOREVER || call == CALL_ABANDON)
			start(c, 1, 0, 1);
	}
	kill(td.pid, SIGSTOP);
	if (call == CALL_NEXT_FOREVER) {
		/* Everything sent before the stop is taken, so that the next
		 * call has nothing to return but what the daemon says. */
		while ((rc = pf_next(c, 50, &b)) == 0 && b)
			assert_int_equal(pf_release(c, b, NULL), 0);
		assert_int_equal(rc, -ETIMEDOUT);
	}
	killer_start(&k, STOPPED_MS, 0);
	t0 = td_now();
	switch (call) {
	case CALL_CONNECT: rc = pf_connect(td.sock, &c); break;
	case CALL_OPEN:
		rc = pf_open(c, &(struct pf_open_opts){.dataset = "main", .batch_size = BATCH});
		break;
	case CALL_START_EPOCH:
		rc = pf_start_epoch(c, &(struct pf_epoch_opts){.order = PF_ORDER_SEQUENTIAL}, NULL);
		break;
	case CALL_NEXT_FOREVER: rc = pf_next(c, -1, &b); break;
	case CALL_SET_DEPTH: rc = pf_set_depth(c, 0, 2); break;
	case CALL_ABANDON: rc = pf_abandon(c); break;
	case CALL_COUNT: break;
	}
	t1 = td_now();
	killer_join(&k);
	if (rc != -ECONNRESET && rc != -EPIPE)
		fail_msg("%s returned %d (%s), not -ECONNRESET or -EPIPE", CALL_NAME[call], rc,
			 pf_errmsg(c));
	if (t1 - t0 < STOPPED_MS / 1000.0 - 0.01)
		fail_msg("%s returned after %.3f s, while the daemon was only stopped",
			 CALL_NAME[call], t1 - t0);
	if (t1 - k.killed_at >= DETECT_S)
		fail_msg("%s returned %.3f s after the kill", CALL_NAME[call], t1 - k.killed_at);
	assert_says_it_went_away(c);
	/* And every later call says the same at once. */
	if (call != CALL_CONNECT && call != CALL_OPEN) {
		assert_int_equal(pf_next(c, -1, &b), rc);
		assert_says_it_went_away(c);
	}
	pf_close(c);
	return t1 - k.killed_at;
}

static void every_blocking_call_fails_within_1s_of_a_kill(void **state)
{
	for (int call = 0; call < CALL_COUNT; call++) {
		double dt;

		if (call > 0)
			assert_int_equal(td_start(&td, "", DATASETS), 0);
		dt = kill_during((enum blocking_call)call);
		printf("  %-15s error %.1f ms after the SIGKILL\n", CALL_NAME[call], dt * 1e3);
	}
}

static void close_of_a_client_holding_batches_returns_at_once_after_a_kill(void **state)
{
	struct pf_client *c = open_client(0);
	struct pf_batch *held[2];
	struct picks p = {0};
	double t0;

	start(c, 3, 0, 1);
	held[0] = take_one(c, &p, true);
	held[1] = take_one(c, &p, true);
	td_kill(&td);
	/* Host memory stays mapped until the client lets go of it. */
	verify_batch(c, held[0]);
	t0 = td_now();
	pf_close(c);
	assert_true(td_now() - t0 < DETECT_S);
}

/* A fake daemon in a child: answers hello, sends the first half of its
 * reply to the next request, then dies by SIGKILL 200 ms later, having
 * written the time of its death to wfd. */
static void half_frame_daemon(const char *path, int listen_fd, int wfd)
{
	Pf__Envelope *req = NULL, env = PF__ENVELOPE__INIT;
	Pf__HelloReply hr = PF__HELLO_REPLY__INIT;
	Pf__SessionOpened so = PF__SESSION_OPENED__INIT;
	struct wire_rx rx;
	uint8_t *frame;
	size_t len;
	double t;
	int conn;

	(void)path;
	conn = accept(listen_fd, NULL, NULL);
	wire_rx_init(&rx, WIRE_MAX_FRAME_DEFAULT);
	for (int n = 0; n < 2; n++) {
		while (wire_rx_next(&rx, &req) != 1)
			if (wire_rx_fill(&rx, conn) <= 0)
				_exit(1);
		env.id = req->id;
		if (n == 0) {
			hr.version = WIRE_VERSION;
			hr.daemon = "half-frame fake";
			hr.max_frame = WIRE_MAX_FRAME_DEFAULT;
			env.msg_case = PF__ENVELOPE__MSG_HELLO_REPLY;
			env.hello_reply = &hr;
		} else {
			so.session = 1;
			so.num_samples = N;
			so.device = "host, with a name long enough to split";
			env.msg_case = PF__ENVELOPE__MSG_OPENED;
			env.opened = &so;
		}
		pf__envelope__free_unpacked(req, NULL);
		if (wire_encode(&env, &frame, &len))
			_exit(1);
		/* The reply to open stops halfway through its body. */
		if (wire_send_all(conn, frame, n == 0 ? len : WIRE_HDR + (len - WIRE_HDR) / 2, -1))
			_exit(1);
		free(frame);
	}
	usleep(200000);
	t = td_now();
	if (write(wfd, &t, sizeof(t)) != sizeof(t))
		_exit(1);
	kill(getpid(), SIGKILL);
	_exit(1);
}

static void kill_inside_a_frame_is_seen_as_the_daemon_gone(void **state)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct pf_client *c = NULL;
	char path[sizeof(sa.sun_path)];
	int lfd, pipefd[2], rc;
	double killed_at, t1;
	pid_t pid;

	td_path(&td, "fake.sock", path, sizeof(path));
	memcpy(sa.sun_path, path, sizeof(path));
	lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(lfd >= 0);
	assert_int_equal(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(lfd, 4), 0);
	assert_int_equal(pipe(pipefd), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(pipefd[0]);
		half_frame_daemon(path, lfd, pipefd[1]);
	}
	close(lfd);
	close(pipefd[1]);
	assert_int_equal(pf_connect(path, &c), 0);
	rc = pf_open(c, &(struct pf_open_opts){.dataset = "main", .batch_size = BATCH});
	t1 = td_now();
	assert_int_equal(read(pipefd[0], &killed_at, sizeof(killed_at)), sizeof(killed_at));
	close(pipefd[0]);
	waitpid(pid, NULL, 0);
	/* Half a frame and then EOF: the daemon went away, not a bad frame. */
	if (rc != -ECONNRESET)
		fail_msg("pf_open returned %d (%s)", rc, pf_errmsg(c));
	assert_true(strstr(pf_errmsg(c), path) && strstr(pf_errmsg(c), "went away"));
	printf("  inside a frame: error %.1f ms after the SIGKILL\n", (t1 - killed_at) * 1e3);
	assert_true(t1 - killed_at < DETECT_S);
	pf_close(c);
}

static void kill_between_epochs_fails_the_next_start_at_once(void **state)
{
	struct pf_client *c = open_client(0);
	struct picks p = {0};
	double t0;

	start(c, 4, 0, 1);
	while (take_one(c, &p, false))
		;
	assert_each_once(p.v, p.n);
	td_kill(&td);
	t0 = td_now();
	assert_true(pf_start_epoch(c, &(struct pf_epoch_opts){.seed = 5}, NULL) < 0);
	assert_true(td_now() - t0 < DETECT_S);
	assert_says_it_went_away(c);
	pf_close(c);
}

/* ---- with reconnection: nothing lost, nothing repeated ------------------------------ */

static void reconnecting_consumer_ends_a_killed_epoch_with_every_sample_once(void **state)
{
	struct pf_client *c;
	struct pf_batch *held, *released_first;
	struct picks want, got = {0};
	struct pf_stats st;
	int maps0, maps1, maps2;

	reference_epoch(7, 0, 1, &want);
	maps0 = arena_mappings();
	c = open_client(10);
	start(c, 7, 0, 1);
	take_one(c, &got, false); /* the arenas have arrived */
	maps1 = arena_mappings() - maps0;
	assert_true(maps1 > 0);
	for (int i = 1; i < 8; i++)
		take_one(c, &got, false);
	/* The ninth is released after the kill, before anything noticed it;
	 * the tenth stays in the trainer's hands across the restart. */
	released_first = take_one(c, &got, true);
	held = take_one(c, &got, true);
	td_kill(&td);
	verify_batch(c, released_first);
	assert_int_equal(pf_release(c, released_first, NULL), 0);
	assert_int_equal(td_start(&td, "", DATASETS), 0);
	while (take_one(c, &got, false))
		;
	/* Still mapped, still the right bytes; its release sends nothing
	 * and unmaps the old daemon's arenas, which no batch uses now. */
	verify_batch(c, held);
	maps2 = arena_mappings() - maps0 - maps1;
	assert_true(maps2 > 0);
	assert_int_equal(pf_release(c, held, NULL), 0);
	assert_int_equal(arena_mappings(), maps0 + maps2);
	assert_int_equal(pf_release(c, held, NULL), -EINVAL);
	assert_each_once(got.v, got.n);
	assert_same_picks(&got, &want);
	assert_int_equal(pf_stats(c, &st), 0);
	assert_int_equal(st.reconnects, 1);
	assert_int_equal(st.resume_batch, NBATCHES);
	assert_int_equal(st.held, 0);
	assert_int_equal(st.batches, NBATCHES);
	/* The next epoch runs on the new daemon as on any. */
	memset(&got, 0, sizeof(got));
	start(c, 8, 0, 1);
	while (take_one(c, &got, false))
		;
	assert_each_once(got.v, got.n);
	pf_close(c);
	assert_int_equal(arena_mappings(), maps0);
}

static void two_ranks_blocked_in_next_ride_through_a_restart(void **state)
{
	struct pf_client *c[2];
	struct picks want[2], got[2];
	struct killer k;
	bool done[2] = {false, false};
	uint64_t all[N];
	size_t nall = 0;

	memset(got, 0, sizeof(got));
	for (uint32_t r = 0; r < 2; r++)
		reference_epoch(9, r, 2, &want[r]);
	for (uint32_t r = 0; r < 2; r++) {
		c[r] = open_client(10);
		start(c[r], 9, r, 2);
	}
	/* Killed 60 ms in, restarted 200 ms later: a trainer taking a batch
	 * every 10 ms is in the middle of its epoch, and waits in pf_next
	 * through the restart. */
	killer_start(&k, 60, 200);
	while (!done[0] || !done[1]) {
		for (int r = 0; r < 2; r++)
			if (!done[r] && !take_one(c[r], &got[r], false))
				done[r] = true;
		usleep(10000);
	}
	killer_join(&k);
	for (int r = 0; r < 2; r++) {
		struct pf_stats st;

		assert_same_picks(&got[r], &want[r]);
		memcpy(all + nall, got[r].v, got[r].n * sizeof(uint64_t));
		nall += got[r].n;
		assert_int_equal(pf_stats(c[r], &st), 0);
		assert_int_equal(st.reconnects, 1);
		pf_close(c[r]);
	}
	assert_each_once(all, nall);
}

static void explicit_order_goes_on_across_a_restart(void **state)
{
	struct pf_epoch_opts eo = {.order = PF_ORDER_EXPLICIT};
	uint64_t *order = malloc(N * sizeof(uint64_t)), *want = malloc(N * sizeof(uint64_t));
	struct pf_client *c = open_client(10);
	struct picks got = {0};

	/* Every third sample backwards, then the rest forwards. */
	eo.nindices = 0;
	for (uint64_t i = N; i-- > 0;)
		if (i % 3 == 0)
			order[eo.nindices++] = i;
	for (uint64_t i = 0; i < N; i++)
		if (i % 3)
			order[eo.nindices++] = i;
	eo.indices = order;
	memcpy(want, order, N * sizeof(uint64_t));
	assert_int_equal(pf_start_epoch(c, &eo, NULL), 0);
	/* The caller's list is only borrowed for the call. */
	memset(order, 0xff, N * sizeof(uint64_t));
	for (int i = 0; i < 5; i++)
		take_one(c, &got, false);
	td_kill(&td);
	assert_int_equal(td_start(&td, "", DATASETS), 0);
	while (take_one(c, &got, false))
		;
	assert_int_equal(got.n, N);
	assert_memory_equal(got.v, want, N * sizeof(uint64_t));
	free(want);
	free(order);
	pf_close(c);
}

static void reconnecting_consumer_starts_the_next_epoch_after_a_kill_between_epochs(void **state)
{
	struct pf_client *c = open_client(10);
	struct picks want, got = {0};
	struct pf_batch *b;
	struct pf_stats st;

	reference_epoch(12, 0, 1, &want);
	start(c, 11, 0, 1);
	while (take_one(c, &got, false))
		;
	td_kill(&td);
	assert_int_equal(td_start(&td, "", DATASETS), 0);
	/* The epoch that ended stays ended (nothing to ask the daemon). */
	assert_int_equal(pf_next(c, 5000, &b), 0);
	assert_null(b);
	/* Starting the next one finds the daemon gone and reconnects. */
	memset(&got, 0, sizeof(got));
	start(c, 12, 0, 1);
	assert_int_equal(pf_stats(c, &st), 0);
	assert_int_equal(st.reconnects, 1);
	while (take_one(c, &got, false))
		;
	assert_same_picks(&got, &want);
	pf_close(c);
}

static void reconnection_gives_up_after_reconnect_s(void **state)
{
	struct pf_client *c = open_client(0.5);
	struct picks got = {0};
	struct pf_batch *b;
	double t0;
	int rc;

	start(c, 13, 0, 1);
	take_one(c, &got, false);
	td_kill(&td);
	/* A short timeout ends the call, not the reconnection; each says
	 * how the last try went. */
	t0 = td_now();
	assert_int_equal(pf_next(c, 100, &b), -ETIMEDOUT);
	assert_true(td_now() - t0 < 0.4);
	assert_int_equal(pf_next(c, 100, &b), -ETIMEDOUT);
	assert_says_it_went_away(c);
	assert_non_null(strstr(pf_errmsg(c), "reconnecting"));
	assert_non_null(strstr(pf_errmsg(c), "cannot connect"));
	assert_null(strstr(strstr(pf_errmsg(c), "reconnecting") + 1, "reconnecting"));
	rc = pf_next(c, -1, &b);
	assert_int_equal(rc, -ECONNRESET);
	/* reconnect_s counts from the first call that saw it gone. */
	assert_true(td_now() - t0 >= 0.45 && td_now() - t0 < 0.5 + DETECT_S);
	assert_says_it_went_away(c);
	assert_non_null(strstr(pf_errmsg(c), "no daemon took the session back"));
	/* Final: a daemon that comes back now is not used. */
	assert_int_equal(td_start(&td, "", DATASETS), 0);
	assert_int_equal(pf_next(c, 1000, &b), -ECONNRESET);
	pf_close(c);
}

static void restarted_daemon_without_the_dataset_ends_the_reconnection_with_its_reason(void **state)
{
	struct pf_client *c = open_client(10);
	struct picks got = {0};
	struct pf_batch *b;
	double t0;
	int rc;

	start(c, 14, 0, 1);
	take_one(c, &got, false);
	td_kill(&td);
	assert_int_equal(td_start(&td, "", OTHER_DATASETS), 0);
	t0 = td_now();
	rc = pf_next(c, -1, &b);
	/* At once, not after reconnect_s. */
	assert_true(td_now() - t0 < DETECT_S);
	assert_true(rc < 0 && rc != -ETIMEDOUT);
	assert_non_null(strstr(pf_errmsg(c), "refuses the session"));
	assert_non_null(strstr(pf_errmsg(c), "main"));
	pf_close(c);
}

static void abandoned_epoch_is_not_started_again_by_the_reconnection(void **state)
{
	struct pf_client *c = open_client(10);
	struct picks got = {0};
	struct pf_batch *b;
	Pf__Envelope *status;
	Pf__SessionStatus *ss;
	struct pf_stats st;

	start(c, 15, 0, 1);
	take_one(c, &got, false);
	td_kill(&td);
	assert_int_equal(pf_abandon(c), 0);
	assert_int_equal(td_start(&td, "", DATASETS), 0);
	assert_int_equal(pf_next(c, 5000, &b), 0);
	assert_null(b);
	assert_int_equal(pf_stats(c, &st), 0);
	assert_int_equal(st.reconnects, 1);
	/* The new daemon has the session, and no epoch runs in it. */
	status = td_status(td.sock);
	assert_non_null(status);
	ss = td_session(status, st.session);
	assert_non_null(ss);
	assert_int_equal(ss->epoch, 0);
	assert_int_equal(ss->sent, 0);
	pf__envelope__free_unpacked(status, NULL);
	pf_close(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(every_blocking_call_fails_within_1s_of_a_kill,
						setup, teardown),
		cmocka_unit_test_setup_teardown(
			close_of_a_client_holding_batches_returns_at_once_after_a_kill, setup,
			teardown),
		cmocka_unit_test_setup_teardown(kill_inside_a_frame_is_seen_as_the_daemon_gone,
						setup, teardown),
		cmocka_unit_test_setup_teardown(kill_between_epochs_fails_the_next_start_at_once,
						setup, teardown),
		cmocka_unit_test_setup_teardown(
			reconnecting_consumer_ends_a_killed_epoch_with_every_sample_once, setup,
			teardown),
		cmocka_unit_test_setup_teardown(two_ranks_blocked_in_next_ride_through_a_restart,
						setup, teardown),
		cmocka_unit_test_setup_teardown(explicit_order_goes_on_across_a_restart, setup,
						teardown),
		cmocka_unit_test_setup_teardown(
			reconnecting_consumer_starts_the_next_epoch_after_a_kill_between_epochs,
			setup, teardown),
		cmocka_unit_test_setup_teardown(reconnection_gives_up_after_reconnect_s, setup,
						teardown),
		cmocka_unit_test_setup_teardown(
			restarted_daemon_without_the_dataset_ends_the_reconnection_with_its_reason,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			abandoned_epoch_is_not_started_again_by_the_reconnection, setup, teardown),
	};

	/* A daemon that died is an EPIPE from the library, not the test's
	 * death (the library sends with MSG_NOSIGNAL; this covers the rest). */
	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
