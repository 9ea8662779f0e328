/*
 * soak.c — the leak soak: one real prefetchd and SOAK_CYCLES (default 2000)
 * clients in a row.  Each connects, opens a host session, starts an epoch,
 * takes a few batches (every byte of every field checked against the
 * formula that wrote it), keeps the last one and then ends one of four ways,
 * drawn at random:
 *
 *   close      pf_close, the orderly ending;
 *   sigkill    the client runs in a forked child, which the soak SIGKILLs
 *              while it holds its batch (a crashed or OOM-killed trainer);
 *   abandon    pf_abandon, then pf_close (a trainer that leaves early);
 *   midframe   the child writes the first half of a real frame on its
 *              session's socket and exits (a trainer killed inside a
 *              write): the daemon holds a partial frame of a live session.
 *
 * After the warm-up (the first SOAK_WARMUP = 100 cycles, which let the
 * daemon's allocator and caches reach their working size) the daemon's open
 * fds (/proc/PID/fd) and RSS (VmRSS) are the baseline; both are taken, as
 * at the end, once `status` shows no session and the fd count has stopped
 * moving (a session's teardown runs on the daemon's loop after the socket
 * closes).  The soak passes when the final fd count equals the baseline
 * exactly, the final RSS is within 5% of the baseline, every batch held the
 * right bytes and the daemon exits with status 0 on SIGTERM (under ASan its
 * LeakSanitizer runs then).
 *
 * Then, for SOAK_HOSTILE seconds (default 30, 0 skips it), the hostile mix
 * (hostile.c): attackers of every kind next to a byte-checked trainer.  It
 * has a warm-up of its own (a round of half the time, at least 5 s:
 * the threads it wakes make their malloc arenas, the bystander's dataset is
 * mapped), after which fds and RSS are its baseline, taken and judged as
 * for the cycles; the fds must also be the cycles' baseline.
 *
 * SOAK_SEED fixes the random draws (the seed in use is printed first, so a
 * failing run can be replayed); SOAK_CYCLES the number of cycles;
 * SOAK_RSS_LIMIT the RSS allowance in percent, or "off" (`make soak-asan`:
 * ASan keeps freed blocks in a quarantine of up to 256 MiB, so RSS grows
 * by design there and LeakSanitizer at the daemon's exit is the leak check);
 * $PREFETCHD_BIN the daemon (td_start).  `make soak` builds and runs it.
 *
 * DESIGN: one thread.  The children are forked from it and talk back
 * through a pipe, one status byte each; nothing is shared otherwise.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "npygen.h"
#include "prefetch.h"
#include "prefetch.pb-c.h"
#include "soak.h"
#include "testutil.h"
#include "wire.h"

/* The dataset: two fields of different shapes, so a batch is more than one
 * contiguous run of rows, and one of them a scalar per sample. */
#define ROWS	    509 /* prime: batches of any size leave a partial last one */
#define SEED_X	    0x50a4
#define SEED_Y	    0x50a5
#define SOAK_WARMUP 100
/* The RSS allowance of the issue: within 5% of the post-warm-up baseline
 * ($SOAK_RSS_LIMIT percent overrides it; "off" reports without judging). */
#define RSS_LIMIT_PCT 5
/* A child that has not reported by then is stuck: the soak fails. */
#define CHILD_TIMEOUT_MS 30000

enum ending { END_CLOSE, END_SIGKILL, END_ABANDON, END_MIDFRAME, END_COUNT };
static const char *const ending_name[END_COUNT] = {"close", "sigkill", "abandon", "midframe"};

/* What a child writes on its pipe: it holds its batches and is ready to be
 * killed (or has written its partial frame), or it failed (and said why on
 * stderr). */
#define CHILD_READY  'r'
#define CHILD_FAILED 'x'

static struct tdaemon td;

static uint64_t rng_state;

static uint64_t rng_next(void)
{
	rng_state += 0x9e3779b97f4a7c15ull;
	return npygen_mix(rng_state);
}

/* Uniform in lo..hi; the modulo bias of a 64-bit draw over a few values is
 * far below anything the soak could notice. */
static unsigned rng_range(unsigned lo, unsigned hi)
{
	return lo + (unsigned)(rng_next() % (hi - lo + 1));
}

/* A cycle's failure: message on stderr, -1 to return. */
static int cycle_fail(unsigned cycle, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int cycle_fail(unsigned cycle, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "soak: cycle %u: ", cycle);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	return -1;
}

/* Every sample of every field of b holds the bytes td_write_npy wrote. */
static int check_batch(unsigned cycle, struct pf_client *c, const struct pf_batch *b)
{
	for (uint32_t f = 0; f < b->nfields; f++) {
		const uint8_t *base = b->data[f];
		struct pf_field fi;
		uint64_t seed;

		if (pf_field_info(c, f, &fi) != 0)
			return cycle_fail(cycle, "pf_field_info %u: %s", f, pf_errmsg(c));
		seed = !strcmp(fi.name, "x") ? SEED_X : SEED_Y;
		for (uint32_t k = 0; k < b->count; k++) {
			uint64_t pick = b->picks[k];

			if (pick >= ROWS)
				return cycle_fail(cycle, "pick %" PRIu64 " out of range", pick);
			if (!td_row_ok(base + k * fi.sample_bytes, fi.sample_bytes, seed, pick))
				return cycle_fail(cycle,
						  "field %s of pick %" PRIu64 " (batch %" PRIu64
						  ", position %u) has wrong bytes",
						  fi.name, pick, b->seq, k);
		}
	}
	return 0;
}

/*
 * Connects, opens, starts an epoch and takes `take` batches, checking each
 * and releasing all but the last, which *held keeps.  0, or -1 after saying
 * why; *out is the client either way (NULL only when none was allocated).
 */
static int run_client(unsigned cycle, unsigned batch_size, unsigned take, bool shuffle,
		      struct pf_client **out, struct pf_batch **held)
{
	struct pf_open_opts oo = {.dataset = "soak", .batch_size = batch_size, .name = "soak"};
	struct pf_epoch_opts eo = {.order = shuffle ? PF_ORDER_SHUFFLE : PF_ORDER_SEQUENTIAL,
				   .seed = cycle};
	struct pf_client *c = NULL;
	struct pf_batch *b = NULL;
	uint64_t batches = 0;
	int rc;

	*held = NULL;
	rc = pf_connect(td.sock, &c);
	*out = c;
	if (rc)
		return cycle_fail(cycle, "pf_connect: %s", pf_errmsg(c));
	if (pf_open(c, &oo) != 0)
		return cycle_fail(cycle, "pf_open: %s", pf_errmsg(c));
	if (pf_num_samples(c) != ROWS)
		return cycle_fail(cycle, "%" PRIu64 " samples, expected %d", pf_num_samples(c),
				  ROWS);
	if (pf_start_epoch(c, &eo, &batches) != 0)
		return cycle_fail(cycle, "pf_start_epoch: %s", pf_errmsg(c));
	if (batches != (ROWS + batch_size - 1) / batch_size)
		return cycle_fail(cycle, "%" PRIu64 " batches announced for %u of %d", batches,
				  batch_size, ROWS);
	for (unsigned i = 0; i < take; i++) {
		rc = pf_next(c, 10000, &b);
		if (rc || !b)
			return cycle_fail(cycle, "pf_next %u: %d %s", i, rc, pf_errmsg(c));
		if (b->seq != i || b->count != batch_size)
			return cycle_fail(cycle, "batch %u: seq %" PRIu64 ", %u samples", i, b->seq,
					  b->count);
		if (!shuffle && b->picks[0] != (uint64_t)i * batch_size)
			return cycle_fail(cycle, "sequential batch %u starts at pick %" PRIu64, i,
					  b->picks[0]);
		if (check_batch(cycle, c, b))
			return -1;
		if (i + 1 < take && pf_release(c, b, NULL) != 0)
			return cycle_fail(cycle, "pf_release: %s", pf_errmsg(c));
	}
	*held = b;
	return 0;
}

/* The client's one socket, found among this process's fds (a child's: the
 * only socket it has, the pipe to the parent being a pipe).  -1 if not
 * exactly one. */
static int only_socket(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int found = -1, n = 0;

	while (d && (e = readdir(d))) {
		int fd = atoi(e->d_name);
		struct stat st;

		if (e->d_name[0] == '.' || fd == dirfd(d))
			continue;
		if (fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode)) {
			found = fd;
			n++;
		}
	}
	if (d)
		closedir(d);
	return n == 1 ? found : -1;
}

/*
 * The first half of a real Release frame for the held batch, written on the
 * session's socket: the daemon has read the length and part of the body
 * when the connection ends.
 */
static int write_half_frame(unsigned cycle, const struct pf_batch *held)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__Release rel = PF__RELEASE__INIT;
	uint8_t *frame = NULL;
	size_t len = 0;
	int sock = only_socket(), rc = -1;

	if (sock < 0)
		return cycle_fail(cycle, "the child does not have exactly one socket");
	rel.epoch = held->epoch;
	rel.seq = held->seq;
	/* The slot number is the client library's secret; any value does for
	 * a frame that never completes. */
	rel.slot = 0;
	env.msg_case = PF__ENVELOPE__MSG_RELEASE;
	env.release = &rel;
	if (wire_encode(&env, &frame, &len) != 0 || len <= WIRE_HDR + 1) {
		cycle_fail(cycle, "wire_encode failed");
		goto out;
	}
	if (wire_send_all(sock, frame, WIRE_HDR + (len - WIRE_HDR) / 2, -1) != 0) {
		cycle_fail(cycle, "writing half a frame: %s", strerror(errno));
		goto out;
	}
	rc = 0;
out:
	free(frame);
	return rc;
}

/*
 * The abrupt endings: the client runs in a child that reports on a pipe,
 * then is SIGKILLed (sigkill) or exits without closing anything after its
 * half frame (midframe).  0, or -1 after saying why.
 */
static int cycle_in_child(unsigned cycle, enum ending how, unsigned batch_size, unsigned take,
			  bool shuffle)
{
	struct pollfd pfd;
	char status = 0;
	int p[2], wstatus, rc = -1;
	pid_t pid;

	if (pipe(p) != 0)
		return cycle_fail(cycle, "pipe: %s", strerror(errno));
	fflush(NULL);
	pid = fork();
	if (pid < 0) {
		close(p[0]);
		close(p[1]);
		return cycle_fail(cycle, "fork: %s", strerror(errno));
	}
	if (pid == 0) {
		struct pf_client *c;
		struct pf_batch *held;
		char ok = CHILD_READY, bad = CHILD_FAILED;

		close(p[0]);
		if (run_client(cycle, batch_size, take, shuffle, &c, &held) ||
		    (how == END_MIDFRAME && write_half_frame(cycle, held))) {
			(void)!write(p[1], &bad, 1);
			_exit(1);
		}
		(void)!write(p[1], &ok, 1);
		/* _exit, not exit: nothing is closed or freed, as when a process
		 * dies (and LeakSanitizer has nothing to say about it). */
		if (how == END_MIDFRAME)
			_exit(0);
		for (;;)
			pause();
	}
	close(p[1]);
	pfd = (struct pollfd){.fd = p[0], .events = POLLIN};
	if (poll(&pfd, 1, CHILD_TIMEOUT_MS) != 1 || read(p[0], &status, 1) != 1) {
		cycle_fail(cycle, "the child (%s) did not report within %d ms", ending_name[how],
			   CHILD_TIMEOUT_MS);
		kill(pid, SIGKILL);
	} else if (status != CHILD_READY) {
		cycle_fail(cycle, "the child (%s) failed", ending_name[how]);
	} else {
		rc = 0;
	}
	if (how == END_SIGKILL)
		kill(pid, SIGKILL);
	waitpid(pid, &wstatus, 0);
	close(p[0]);
	if (rc == 0 && how == END_MIDFRAME && !(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0))
		rc = cycle_fail(cycle, "the midframe child ended with status 0x%x", wstatus);
	return rc;
}

static int cycle_in_process(unsigned cycle, enum ending how, unsigned batch_size, unsigned take,
			    bool shuffle)
{
	struct pf_client *c = NULL;
	struct pf_batch *held;
	int rc;

	rc = run_client(cycle, batch_size, take, shuffle, &c, &held);
	if (rc == 0 && how == END_ABANDON && pf_abandon(c) != 0)
		rc = cycle_fail(cycle, "pf_abandon: %s", pf_errmsg(c));
	/* pf_close releases the held batch, unmaps the arena and closes. */
	pf_close(c);
	return rc;
}

static long daemon_fds(void)
{
	return td_fd_count(td.pid);
}

static long daemon_rss_kb(void)
{
	return td_rss_kb(td.pid);
}

/*
 * Waits (at most 10 s) until status shows no session, then until the fd
 * count reads the same three times 50 ms apart (the status connection
 * itself is torn down on the daemon's loop after we close it), or equals
 * `want` when want >= 0.  Returns 0 and the figures, or -1.
 */
static int settle(long want, long *fds, long *rss_kb)
{
	double deadline = td_now() + 10;
	long last = -1;
	int same = 0;

	for (;;) {
		Pf__Envelope *st = td_status(td.sock);
		size_t n = st && st->status_reply ? st->status_reply->n_sessions : SIZE_MAX;

		if (st)
			pf__envelope__free_unpacked(st, NULL);
		if (n == 0)
			break;
		if (td_now() > deadline) {
			fprintf(stderr, "soak: the daemon still shows %zu session(s) after 10 s\n",
				n);
			return -1;
		}
		usleep(20000);
	}
	while (td_now() < deadline) {
		long now = daemon_fds();

		if (now < 0)
			return -1;
		same = now == last ? same + 1 : 0;
		last = now;
		if (want >= 0 ? now == want : same >= 2)
			break;
		usleep(50000);
	}
	*fds = last;
	*rss_kb = daemon_rss_kb();
	/* Memory freed comes back to the system a little later (the daemon
	 * keeps big freed buffers for two ticks, bigmem.h, and trims its heap
	 * every tick): at the end RSS is the lowest of 5 s of reads. */
	for (double until = td_now() + 5; want >= 0 && *rss_kb >= 0 && td_now() < until;) {
		long now;

		usleep(500000);
		now = daemon_rss_kb();
		if (now >= 0 && now < *rss_kb)
			*rss_kb = now;
	}
	return *fds >= 0 && *rss_kb >= 0 ? 0 : -1;
}

/* Prints fds and RSS against their baselines and says whether they hold:
 * the fds exactly, the RSS within limit_pct (0: not judged). */
static bool judge(const char *phase, long base_fds, long base_rss, long fds, long rss,
		  unsigned limit_pct)
{
	bool ok = true;

	printf("soak: %s: fds: baseline %ld, final %ld\n", phase, base_fds, fds);
	printf("soak: %s: VmRSS: baseline %ld kB, final %ld kB (%+.2f%%, ", phase, base_rss, rss,
	       100.0 * (double)(rss - base_rss) / (double)base_rss);
	if (limit_pct)
		printf("allowed +-%u%%)\n", limit_pct);
	else
		printf("not judged: SOAK_RSS_LIMIT=off)\n");
	if (fds != base_fds) {
		td_fail("%s: the daemon holds %ld fds, %ld at the baseline", phase, fds, base_fds);
		ok = false;
	}
	if (limit_pct && (double)labs(rss - base_rss) * 100 > limit_pct * (double)base_rss) {
		td_fail("%s: the daemon's RSS moved by more than %u%%", phase, limit_pct);
		ok = false;
	}
	return ok;
}

static int write_dataset(void)
{
	const uint64_t xs[2] = {4, 6}, rs[1] = {SOAK_BY_ROW_BYTES};
	char x[320], y[320], r[320];

	td_path(&td, "x.npy", x, sizeof(x));
	td_path(&td, "y.npy", y, sizeof(y));
	td_path(&td, "rows.npy", r, sizeof(r));
	if (td_write_npy(x, 1, "<f4", 4, ROWS, xs, 2, SEED_X, 0) ||
	    td_write_npy(y, 2, "<i8", 8, ROWS, NULL, 0, SEED_Y, 0) ||
	    td_write_npy(r, 1, "|u1", 1, SOAK_BY_ROWS, rs, 1, SOAK_BY_SEED, 0))
		return td_fail("writing the dataset failed");
	return 0;
}

static unsigned env_unsigned(const char *name, unsigned dflt)
{
	const char *s = getenv(name);
	unsigned v;

	if (!s || !*s)
		return dflt;
	if (td_parse_uint(name, s, 1, 100000000, &v))
		exit(2);
	return v;
}

int main(void)
{
	unsigned cycles = env_unsigned("SOAK_CYCLES", 2000), done = 0;
	unsigned hostile = getenv("SOAK_HOSTILE") && !strcmp(getenv("SOAK_HOSTILE"), "0")
				   ? 0
				   : env_unsigned("SOAK_HOSTILE", 30);
	unsigned ends[END_COUNT] = {0};
	long base_fds = -1, base_rss = -1, fds = -1, rss = -1;
	bool failed = true;
	const char *seed_env = getenv("SOAK_SEED"), *rss_env = getenv("SOAK_RSS_LIMIT");
	bool rss_judged = !rss_env || strcmp(rss_env, "off") != 0;
	unsigned rss_limit = rss_judged ? env_unsigned("SOAK_RSS_LIMIT", RSS_LIMIT_PCT) : 0;
	uint64_t seed;
	double t0;
	int rc;

	seed = seed_env && *seed_env ? strtoull(seed_env, NULL, 0)
				     : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
	rng_state = seed;
	/* A child's socket closing under a write must not kill us. */
	signal(SIGPIPE, SIG_IGN);
	printf("soak: seed %" PRIu64 " (SOAK_SEED), %u cycles (SOAK_CYCLES), warm-up %u\n", seed,
	       cycles, SOAK_WARMUP);
	rc = td_init(&td, "soak");
	if (rc) {
		td_fail("td_init: %s", strerror(-rc));
		return 1;
	}
	if (write_dataset())
		goto out;
	/* The hostile mix's attackers are another user, with the timeouts
	 * short enough to matter within it. */
	chmod(td.dir, 0755);
	rc = td_start(&td,
		      "socket_mode = 0666\nallow_users = *\nidle_timeout = 2\nframe_timeout = 2\n",
		      "[dataset.soak]\nformat = npy\nfield.x = x.npy\nfield.y = y.npy\n"
		      "[dataset.rows]\nfield.x = rows.npy\n");
	if (rc) {
		td_fail("td_start: %s", strerror(-rc));
		goto out;
	}
	printf("soak: daemon pid %d on %s\n", (int)td.pid, td.sock);
	fflush(stdout);
	t0 = td_now();
	for (done = 0; done < cycles; done++) {
		enum ending how = (enum ending)rng_range(0, END_COUNT - 1);
		unsigned batch_size = rng_range(4, 48), take = rng_range(1, 4);
		bool shuffle = rng_range(0, 1);

		if (done == SOAK_WARMUP || (cycles <= SOAK_WARMUP && done == 0)) {
			if (settle(-1, &base_fds, &base_rss)) {
				td_fail("the daemon did not settle after the warm-up");
				goto out;
			}
			printf("soak: baseline after %u cycles: %ld fds, VmRSS %ld kB\n", done,
			       base_fds, base_rss);
			fflush(stdout);
		}
		if (how == END_SIGKILL || how == END_MIDFRAME)
			rc = cycle_in_child(done, how, batch_size, take, shuffle);
		else
			rc = cycle_in_process(done, how, batch_size, take, shuffle);
		if (rc)
			goto out;
		ends[how]++;
		if ((done + 1) % 250 == 0)
			fprintf(stderr,
				"soak: %u/%u cycles, %.1f s, daemon %ld fds, VmRSS %ld kB\n",
				done + 1, cycles, td_now() - t0, daemon_fds(), daemon_rss_kb());
	}
	if (settle(base_fds, &fds, &rss)) {
		td_fail("the daemon did not settle at the end");
		goto out;
	}
	printf("soak: %u cycles in %.1f s; endings: close %u, sigkill %u, abandon %u, "
	       "midframe %u\n",
	       done, td_now() - t0, ends[END_CLOSE], ends[END_SIGKILL], ends[END_ABANDON],
	       ends[END_MIDFRAME]);
	failed = !judge("cycles", base_fds, base_rss, fds, rss, rss_judged ? rss_limit : 0);
	if (hostile) {
		unsigned warm = hostile / 2 > 5 ? hostile / 2 : 5;

		if (soak_hostile(&td, warm, "warm-up") || settle(base_fds, &fds, &base_rss)) {
			failed = true;
			goto out;
		}
		printf("soak: baseline after the hostile warm-up: %ld fds, VmRSS %ld kB\n", fds,
		       base_rss);
		if (soak_hostile(&td, hostile, "judged (SOAK_HOSTILE)") ||
		    settle(base_fds, &fds, &rss)) {
			td_fail("the hostile mix failed or the daemon did not settle after it");
			failed = true;
			goto out;
		}
		failed |= !judge("hostile mix", base_fds, base_rss, fds, rss,
				 rss_judged ? rss_limit : 0);
	}
	rc = td_stop(&td, 10000);
	printf("soak: daemon exit status on SIGTERM: %d\n", rc);
	if (rc != 0) {
		td_fail("the daemon did not exit cleanly");
		failed = true;
	}
out:
	if (failed && done < cycles)
		fprintf(stderr, "soak: stopped after %u of %u cycles (seed %" PRIu64 ")\n", done,
			cycles, seed);
	printf("soak: %s\n", failed ? "FAILED" : "passed");
	td_bench_end(&td, failed);
	return failed ? 1 : 0;
}
