/*
 * test_integration_access.c — who may reach a real prefetchd, and what one
 * user may do to another's session.
 *
 * The daemon runs as this test's user (root in CI); the second user is
 * `nobody`, reached by a forked child that drops to its uid and gid before
 * it touches the socket.  Cases:
 *   - the daemon makes its runtime directory 0750 and the socket 0660, both
 *     in the configured group, so a user outside that group cannot even
 *     reach the socket;
 *   - with the socket reachable (0666 in a 0755 directory) but `nobody` not
 *     in allow_users, the daemon refuses the connection and logs why;
 *   - with `nobody` allowed, its session works and is isolated: it may set
 *     its own depth but not root's, and root (the daemon's user) may set
 *     nobody's.
 * Without root (no way to become another user) every case skips and says
 * so.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "prefetch.h"
#include "testutil.h"

#define N_ROWS 512
#define SEED   9

static struct tdaemon td;
static uid_t other_uid;
static gid_t other_gid;

static void skip_msg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Skips unless this process can become `nobody`. */
static void need_root(void)
{
	struct passwd *pw = getpwnam("nobody");

	if (geteuid() != 0)
		skip_msg("skipped: needs root to act as a second user (running as uid %u)",
			 (unsigned)geteuid());
	if (!pw)
		skip_msg("skipped: no user 'nobody' on this machine");
	other_uid = pw->pw_uid;
	other_gid = pw->pw_gid;
}

static void start(const char *extra)
{
	char p[400], conf_extra[600];
	uint64_t shape[1] = {4};

	assert_int_equal(td_init(&td, "access"), 0);
	/* The test directory itself must let `nobody` pass. */
	assert_int_equal(chmod(td.dir, 0755), 0);
	td_path(&td, "x.npy", p, sizeof(p));
	assert_int_equal(td_write_npy(p, 1, "<f4", 4, N_ROWS, shape, 1, SEED, 0), 0);
	snprintf(conf_extra, sizeof(conf_extra), "%s", extra);
	assert_int_equal(td_start(&td, conf_extra, "[dataset.x]\nfield.x = x.npy\n"), 0);
}

static void stop(void)
{
	assert_int_equal(td_stop(&td, 5000), 0);
}

/* Runs fn as `nobody` in a child; returns its exit status. */
static int as_other(int (*fn)(void *), void *arg)
{
	pid_t pid = fork();
	int st;

	assert_true(pid >= 0);
	if (pid == 0) {
		if (setgroups(0, NULL) || setgid(other_gid) || setuid(other_uid))
			_exit(99);
		_exit(fn(arg));
	}
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	return WEXITSTATUS(st);
}

static bool log_has(const char *a, const char *b)
{
	char line[800];
	bool found = false;
	FILE *f = fopen(td.log, "r");

	assert_non_null(f);
	while (!found && fgets(line, sizeof(line), f))
		found = strstr(line, a) && (!b || strstr(line, b));
	fclose(f);
	return found;
}

/* Child: 0 when connecting failed with `want` (EACCES: the file system or
 * the daemon said no), 1 when it connected, 2 otherwise. */
static int try_connect(void *arg)
{
	struct pf_client *c = NULL;
	int rc = pf_connect(td.sock, &c), want = *(int *)arg;

	fprintf(stderr, "  [nobody] pf_connect: %d %s\n", rc, rc ? pf_errmsg(c) : "");
	pf_close(c);
	return rc == want ? 0 : rc == 0 ? 1 : 2;
}

static void runtime_dir_and_socket_keep_other_users_out(void **state)
{
	struct stat st;
	char dir[400];
	int want = -EACCES;
	struct group *gr;

	need_root();
	gr = getgrgid(0);
	assert_non_null(gr);
	start("");
	stop();
	/* Again with the socket in a directory the daemon makes, given to
	 * the group of gid 0 (which `nobody` is not in). */
	snprintf(dir, sizeof(dir), "%s/run", td.dir);
	snprintf(td.sock, sizeof(td.sock), "%.280s/prefetchd.sock", dir);
	{
		char extra[300];

		snprintf(extra, sizeof(extra), "socket_group = %s\n", gr->gr_name);
		assert_int_equal(td_start(&td, extra, "[dataset.x]\nfield.x = x.npy\n"), 0);
	}
	assert_int_equal(stat(dir, &st), 0);
	print_message("runtime dir %s: mode %04o gid %u\n", dir, st.st_mode & 07777,
		      (unsigned)st.st_gid);
	assert_int_equal(st.st_mode & 07777, 0750);
	assert_int_equal(st.st_gid, gr->gr_gid);
	assert_int_equal(stat(td.sock, &st), 0);
	print_message("socket %s: mode %04o gid %u\n", td.sock, st.st_mode & 07777,
		      (unsigned)st.st_gid);
	assert_int_equal(st.st_mode & 07777, 0660);
	assert_int_equal(st.st_gid, gr->gr_gid);
	assert_int_equal(as_other(try_connect, &want), 0);
	stop();
	td_cleanup(&td);
	(void)state;
}

static void user_outside_allow_users_is_refused_and_logged(void **state)
{
	int want = -EACCES;

	need_root();
	start("socket_mode = 0666\nallow_users = root\n");
	assert_int_equal(as_other(try_connect, &want), 0);
	stop();
	{
		char who[64];

		snprintf(who, sizeof(who), "uid %u gid %u is not in allow_users", other_uid,
			 other_gid);
		if (!log_has("peer refused", who))
			fail_msg("the daemon log does not say why it refused uid %u", other_uid);
	}
	td_cleanup(&td);
	(void)state;
}

/* Child: opens a session, prints its id on fd 1 of the pipe in arg, then
 * waits for a line telling it the id of root's session; tries to set both
 * depths; exits 0 when its own is accepted and root's refused with EPERM. */
struct other_ctx {
	int to_parent, from_parent;
};

static int other_user_session(void *arg)
{
	struct other_ctx *x = arg;
	struct pf_client *c = NULL;
	struct pf_stats ps;
	char buf[64] = "";
	uint64_t root_session;
	int rc, own, theirs;

	if (pf_connect(td.sock, &c) ||
	    pf_open(c, &(struct pf_open_opts){.dataset = "x", .batch_size = 16}))
		return 2;
	pf_stats(c, &ps);
	dprintf(x->to_parent, "%llu\n", (unsigned long long)ps.session);
	if (read(x->from_parent, buf, sizeof(buf) - 1) <= 0)
		return 3;
	root_session = strtoull(buf, NULL, 10);
	own = pf_set_depth(c, 0, 2);
	theirs = pf_set_depth(c, root_session, 2);
	fprintf(stderr, "  [nobody] own depth: %d; root's session %llu: %d %s\n", own,
		(unsigned long long)root_session, theirs, pf_errmsg(c));
	rc = own == 0 && theirs == -EPERM && strstr(pf_errmsg(c), "only that user") ? 0 : 1;
	/* Stay until root has changed our depth. */
	(void)!read(x->from_parent, buf, sizeof(buf));
	pf_close(c);
	return rc;
}

static void allowed_second_user_is_isolated_from_root_sessions(void **state)
{
	int up[2], down[2];
	struct other_ctx x;
	struct pf_client *c = NULL;
	struct pf_stats ps;
	pid_t pid;
	char buf[64] = "";
	uint64_t other_session;
	int st;

	need_root();
	{
		char extra[200];

		snprintf(extra, sizeof(extra), "socket_mode = 0666\nallow_users = root, %u\n",
			 other_uid);
		start(extra);
	}
	assert_int_equal(pf_connect(td.sock, &c), 0);
	assert_int_equal(pf_open(c, &(struct pf_open_opts){.dataset = "x", .batch_size = 16}), 0);
	pf_stats(c, &ps);
	assert_int_equal(pipe(up), 0);
	assert_int_equal(pipe(down), 0);
	x.to_parent = up[1];
	x.from_parent = down[0];
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		if (setgroups(0, NULL) || setgid(other_gid) || setuid(other_uid))
			_exit(99);
		_exit(other_user_session(&x));
	}
	assert_true(read(up[0], buf, sizeof(buf) - 1) > 0);
	other_session = strtoull(buf, NULL, 10);
	assert_true(other_session > 0);
	dprintf(down[1], "%llu\n", (unsigned long long)ps.session);
	/* Give the child time to try both, then change its depth as root. */
	usleep(300000);
	assert_int_equal(pf_set_depth(c, other_session, 3), 0);
	{
		Pf__Envelope *env = td_status(td.sock);
		Pf__SessionStatus *ss = td_session(env, other_session);

		assert_non_null(ss);
		print_message("nobody's session %llu: uid %u, target %u (%s)\n",
			      (unsigned long long)other_session, ss->uid, ss->target,
			      ss->target_reason);
		assert_int_equal(ss->uid, other_uid);
		assert_int_equal(ss->target, 3);
		pf__envelope__free_unpacked(env, NULL);
	}
	dprintf(down[1], "done\n");
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	pf_close(c);
	close(up[0]);
	close(up[1]);
	close(down[0]);
	close(down[1]);
	stop();
	td_cleanup(&td);
	(void)state;
}

static void skip_msg(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	skip();
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(runtime_dir_and_socket_keep_other_users_out),
		cmocka_unit_test(user_outside_allow_users_is_refused_and_logged),
		cmocka_unit_test(allowed_second_user_is_isolated_from_root_sessions),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
