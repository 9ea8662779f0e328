/*
 * abuse.h — what the tests of one client against the others share
 * (test_integration_limits.c, test_integration_hostile.c): a daemon with
 * the bystander's dataset, the bystander (tests/lib/bystander.c) and its
 * verdict, raw connections, and children acting as another user.  Static
 * inline: each test is one program, and uses what it needs of these.
 */
#ifndef PF_ABUSE_H
#define PF_ABUSE_H

#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "prefetch.h"
#include "testutil.h"
#include "wire.h"

#define N_ROWS	  4096u /* the bystander's dataset: rows.npy */
#define ROW_BYTES 512u
#define SEED	  77u
#define MiB	  (1ull << 20)

static struct tdaemon td;
static struct td_bystander *by;
static uid_t nobody = 65534;
#define OTHER_UID 65533 /* a second user that needs no account */

/* Readable by the users the cases become. */
static const char *const open_access = "socket_mode = 0666\nallow_users = *\n";

/* A daemon with the bystander's dataset and `datasets` (whose files
 * write_files puts in td.dir first), and the bystander running. */
static inline void start_with(const char *extra, const char *datasets, void (*write_files)(void))
{
	char p[400], conf[1200];
	uint64_t shape[1] = {ROW_BYTES};
	struct passwd *pw = getpwnam("nobody");

	if (pw)
		nobody = pw->pw_uid;
	assert_int_equal(td_init(&td, "limits"), 0);
	assert_int_equal(chmod(td.dir, 0755), 0); /* other users pass */
	td_path(&td, "rows.npy", p, sizeof(p));
	assert_int_equal(td_write_npy(p, 1, "|u1", 1, N_ROWS, shape, 1, SEED, 0), 0);
	if (write_files)
		write_files();
	snprintf(conf, sizeof(conf), "[dataset.rows]\nfield.x = rows.npy\n%s",
		 datasets ? datasets : "");
	assert_int_equal(td_start(&td, extra, conf), 0);
	by = td_bystander_start(td.sock, "rows", 64, ROW_BYTES, SEED);
	assert_non_null(by);
}

static inline void start(const char *extra, const char *datasets)
{
	start_with(extra, datasets, NULL);
}

/* The bystander saw nothing of the abuse; the daemon stops cleanly. */
static inline void finish(void)
{
	struct td_bystander_report r;
	int rc = td_bystander_stop(by, &r);

	print_message("  bystander: %llu epochs, %llu batches, %llu statuses, slowest %.1f ms "
		      "(at %.3f s%s)%s%s\n",
		      (unsigned long long)r.epochs, (unsigned long long)r.batches,
		      (unsigned long long)r.statuses, r.max_status_ms, r.max_status_at,
		      td_status_limit_ms() > 0 ? "" : "; not judged under TSan",
		      r.error[0] ? ": " : "", r.error);
	assert_int_equal(rc, 0);
	assert_int_equal(td_stop(&td, 5000), 0);
	td_cleanup(&td);
}

static inline void need_root(void)
{
	if (geteuid() != 0) {
		print_message("skipped: needs root to act as other users (running as uid %u)\n",
			      (unsigned)geteuid());
		skip();
	}
}

static inline struct pf_client *connect_open(const char *dataset, uint32_t batch,
					     uint32_t max_depth, uint32_t augment, int *rc)
{
	struct pf_open_opts o = {.dataset = dataset,
				 .batch_size = batch,
				 .max_depth = max_depth,
				 .augment = augment,
				 .name = "abuser"};
	struct pf_client *c = NULL;

	*rc = pf_connect(td.sock, &c);
	if (!*rc)
		*rc = pf_open(c, &o);
	return c;
}

/* Opens a session that must be refused with code and a message holding
 * `text`. */
static inline void open_refused(const char *dataset, uint32_t batch, uint32_t max_depth,
				uint32_t augment, int code, const char *text)
{
	int rc;
	struct pf_client *c = connect_open(dataset, batch, max_depth, augment, &rc);

	print_message("  refused: %d %s\n", rc, pf_errmsg(c));
	assert_int_equal(rc, code);
	assert_non_null(strstr(pf_errmsg(c), text));
	pf_close(c);
}

static inline long rss_kb(void)
{
	long kb = td_rss_kb(td.pid);

	assert_true(kb > 0);
	return kb;
}

/* The daemon's RSS grew by `grew` kB, at most `limit` kB; not judged under
 * a sanitizer (td_sanitizer), where RSS grows by design. */
static inline void assert_rss_grew_within(long grew, long limit)
{
	if (td_sanitizer()) {
		print_message("  RSS +%ld kB not judged under %s (limit %ld kB)\n", grew,
			      td_sanitizer(), limit);
		return;
	}
	assert_true(grew <= limit);
}

static inline int raw_connect(void)
{
	int fd = td_raw_connect(td.sock);

	assert_true(fd >= 0);
	return fd;
}

/* Waits (5 s at most) for the daemon to end fd's connection; what it said
 * last, if it said anything, goes into why. */
static inline bool closed_with(int fd, char *why, size_t len)
{
	struct wire_rx rx;
	Pf__Envelope *env;
	bool closed = false;
	double until = td_now() + 5;

	why[0] = '\0';
	wire_rx_init(&rx, 0);
	fcntl(fd, F_SETFL, O_NONBLOCK);
	while (!closed && td_now() < until) {
		long n = wire_rx_fill(&rx, fd);

		while (n > 0 && wire_rx_next(&rx, &env) == 1) {
			if (env->msg_case == PF__ENVELOPE__MSG_ERROR)
				snprintf(why, len, "%d %s", env->error->code, env->error->message);
			pf__envelope__free_unpacked(env, NULL);
		}
		closed = n == 0 || (n < 0 && n != -EAGAIN);
		if (n == -EAGAIN)
			usleep(5000);
	}
	wire_rx_free(&rx);
	return closed;
}

/* A child that holds something (sessions, batches) as another user while
 * the parent looks: it says when it holds it (child_holds), then waits for
 * the parent's let_go before it lets go. */
static int child_up = -1, child_down = -1; /* the child's pipe ends */

/* In the child: tells the parent whether all went as expected, then waits
 * for its word.  0, or -1 when the parent is gone. */
static inline int child_holds(bool ok)
{
	char b;

	return write(child_up, ok ? "o" : "f", 1) == 1 && read(child_down, &b, 1) == 1 ? 0 : -1;
}

/* Runs fn(arg) as uid in a child; returns once it holds what it holds
 * (asserting that all went as expected), its pid, and in *go the pipe end
 * for let_go. */
static inline pid_t held_as(uid_t uid, int (*fn)(void *), void *arg, int *go)
{
	int up[2], down[2];
	pid_t pid;
	char b;

	assert_int_equal(pipe(up), 0);
	assert_int_equal(pipe(down), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(up[0]);
		close(down[1]);
		child_up = up[1];
		child_down = down[0];
		_exit(td_as_user(uid, fn, arg) == 0 ? 0 : 1);
	}
	close(up[1]);
	close(down[0]);
	assert_int_equal(read(up[0], &b, 1), 1);
	close(up[0]);
	assert_int_equal(b, 'o');
	*go = down[1];
	return pid;
}

/* The child goes on, lets go and must exit 0. */
static inline void let_go(pid_t pid, int go)
{
	int st;

	assert_int_equal(write(go, "g", 1), 1);
	close(go);
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
}

#endif
