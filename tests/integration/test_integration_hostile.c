/*
 * test_integration_hostile.c — one client cannot hold the loop or the log:
 * the findings of issue 15 that are not about size (those are in
 * test_integration_limits.c), against a real prefetchd.
 *
 *   3   a descriptor attached to a frame (a TCP socket lingering for an
 *       hour, or hundreds of descriptors) is closed off the loop: the
 *       connection ends, the socket's peer sees a reset, nothing is kept;
 *   4   with no descriptor left, accept() backs off instead of spinning,
 *       says so a bounded number of times, and recovers;
 *   7   a flood of bad requests gets its replies but a bounded number of
 *       log lines, and the log says that lines were left out;
 *   17  a client's strings cannot forge a log line or reach a terminal,
 *       and a user sees only their own sessions in status.
 *
 * Each case runs next to the bystander (abuse.h): its epochs stay
 * byte-exact and its status answers within a second throughout.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/resource.h>

#include "abuse.h"

/* A Release with no session (or slot) behind it: always refused. */
static Pf__Release no_release = {.base = PROTOBUF_C_MESSAGE_INIT(&pf__release__descriptor),
				 .slot = 12345};
static const Pf__Envelope release = {.base = PROTOBUF_C_MESSAGE_INIT(&pf__envelope__descriptor),
				     .msg_case = PF__ENVELOPE__MSG_RELEASE,
				     .release = &no_release};

/* Descriptors the daemon has open. */
static int daemon_fds(void)
{
	long n = td_fd_count(td.pid);

	assert_true(n >= 0);
	return (int)n;
}

/* The daemon's CPU time so far, in seconds (utime + stime). */
static double daemon_cpu_s(void)
{
	char p[64], buf[1024], *s;
	unsigned long ut, st;
	FILE *f;

	snprintf(p, sizeof(p), "/proc/%d/stat", (int)td.pid);
	f = fopen(p, "r");
	assert_non_null(f);
	assert_non_null(fgets(buf, sizeof(buf), f));
	fclose(f);
	s = strrchr(buf, ')'); /* the command may hold spaces */
	assert_non_null(s);
	/* state ppid pgrp session tty tpgid flags minflt cminflt majflt
	 * cmajflt utime stime */
	assert_int_equal(
		sscanf(s + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st), 2);
	return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* ---- 3: descriptors sent to the daemon --------------------------------------- */

/* A TCP connection to a listener that never reads, its send queue full and
 * SO_LINGER an hour: a blocking close() of it waits for the hour.  *peer
 * is the listener, whose accept() gives the other end. */
static int lingering_socket(int *listener)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t alen = sizeof(a);
	struct linger lg = {.l_onoff = 1, .l_linger = 3600};
	static char junk[1 << 16];
	int small = 4096, l, t;
	size_t queued = 0;

	l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(l >= 0);
	assert_int_equal(setsockopt(l, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small)), 0);
	assert_int_equal(bind(l, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(listen(l, 1), 0);
	assert_int_equal(getsockname(l, (struct sockaddr *)&a, &alen), 0);
	t = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(t >= 0);
	assert_int_equal(setsockopt(t, SOL_SOCKET, SO_SNDBUF, &small, sizeof(small)), 0);
	assert_int_equal(connect(t, (struct sockaddr *)&a, sizeof(a)), 0);
	fcntl(t, F_SETFL, O_NONBLOCK);
	for (;;) {
		ssize_t n = send(t, junk, sizeof(junk), MSG_NOSIGNAL);

		if (n <= 0)
			break;
		queued += (size_t)n;
	}
	assert_true(errno == EAGAIN || errno == EWOULDBLOCK);
	assert_int_equal(setsockopt(t, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)), 0);
	print_message("  TCP socket with %zu bytes it cannot send, SO_LINGER 3600 s\n", queued);
	*listener = l;
	return t;
}

static void descriptors_sent_to_the_daemon_are_closed_off_the_loop(void **state)
{
	int l, t, fd, other, base, most = 0;
	char why[400];
	double t0;
	ssize_t n = 0;

	start(NULL, NULL);
	base = daemon_fds();

	/* The finding's: the lingering socket, attached to hello. */
	t = lingering_socket(&l);
	fd = raw_connect();
	assert_int_equal(td_send_hello(fd, "lingering"), 0);
	t0 = td_now();
	{
		Pf__Envelope env = PF__ENVELOPE__INIT;
		Pf__StatusRequest st = PF__STATUS_REQUEST__INIT;

		env.id = 2;
		env.msg_case = PF__ENVELOPE__MSG_STATUS;
		env.status = &st;
		assert_int_equal(td_send_env(fd, &env, t), 0);
	}
	close(t); /* ours: the daemon's copy is the last */
	assert_true(closed_with(fd, why, sizeof(why)));
	close(fd);
	print_message("  connection ended after %.3f s\n", td_now() - t0);
	assert_true(td_now() - t0 < 2);
	/* Closed at once with its linger off: the other end sees a reset,
	 * not an hour of nothing. */
	other = accept(l, NULL, NULL);
	assert_true(other >= 0);
	fcntl(other, F_SETFL, O_NONBLOCK);
	for (t0 = td_now(); td_now() - t0 < 5;) {
		static char sink[1 << 16];

		n = recv(other, sink, sizeof(sink), 0);
		if (n < 0 && errno == EAGAIN) {
			usleep(10000);
			continue;
		}
		if (n <= 0)
			break;
	}
	print_message("  the socket's other end: %s\n", n < 0 ? strerror(errno) : "end of file");
	assert_true(n < 0 && errno == ECONNRESET);
	close(other);
	close(l);
	assert_true(td_log_has(&td, "peer sent descriptors", NULL));

	/* Hundreds of descriptors a frame, from many connections: none
	 * kept. */
	for (int i = 0; i < 20; i++) {
		int many[253], pair[2];

		assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair), 0);
		for (int k = 0; k < 253; k++)
			many[k] = pair[k % 2];
		fd = raw_connect();
		assert_int_equal(td_send_hello(fd, "many"), 0);
		assert_int_equal(td_send_fds(fd, many, 253), 0);
		close(pair[0]);
		close(pair[1]);
		assert_true(closed_with(fd, why, sizeof(why)));
		close(fd);
		if (daemon_fds() - base > most)
			most = daemon_fds() - base;
	}
	/* Back to what it had before, once the closer is done. */
	for (t0 = td_now(); daemon_fds() > base && td_now() - t0 < 5;)
		usleep(10000);
	print_message("  20 x 253 descriptors: daemon had %d above its %d at most, %d after\n",
		      most, base, daemon_fds() - base);
	assert_true(daemon_fds() <= base);
	/* The lingering socket's connection and the 20 others, each ended. */
	assert_int_equal(td_log_count(&td, "peer sent descriptors", NULL, 100), 21);
	finish();
}

/* ---- 4: no descriptor left for accept() ----------------------------------------- */

static void accept_backs_off_when_descriptors_run_out(void **state)
{
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	struct rlimit lim;
	int fds[200], n = 0, lines;
	double cpu0, t0, idle_cpu, cpu;
	struct pf_client *c = NULL;
	int rc = -1;

	start("idle_timeout = 4\n", NULL);
	memcpy(a.sun_path, td.sock, strlen(td.sock) + 1);
	/* What the daemon spends serving the bystander alone, for 2 s. */
	cpu0 = daemon_cpu_s();
	sleep(2);
	idle_cpu = daemon_cpu_s() - cpu0;
	/* The daemon's own limit, lowered from outside: a few dozen above
	 * what it holds now. */
	lim.rlim_cur = lim.rlim_max = (rlim_t)daemon_fds() + 24;
	assert_int_equal(prlimit(td.pid, RLIMIT_NOFILE, &lim, NULL), 0);
	cpu0 = daemon_cpu_s();
	t0 = td_now();
	/* Connections that say nothing, more than it can take: the rest wait
	 * in the backlog while accept() fails with EMFILE (until the backlog
	 * is full too). */
	while (n < 200) {
		int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);

		assert_true(fd >= 0);
		if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
			assert_int_equal(errno, EAGAIN);
			close(fd);
			break;
		}
		fds[n++] = fd;
	}
	sleep(2);
	cpu = daemon_cpu_s() - cpu0;
	lines = (int)td_log_count(&td, "accept:", "not accepting", 1000);
	print_message("  %d connections, 2 s out of descriptors: %.2f s of daemon CPU (%.2f s "
		      "before), %d log line(s)\n",
		      n, cpu, idle_cpu, lines);
	assert_true(lines >= 1);
	assert_true(lines <= 8);	   /* one a pause: 50 ms doubling to 2 s */
	assert_true(cpu < idle_cpu + 1.0); /* a spin would be 2 s more */
	/* The idle ones are closed (idle_timeout), the waiting ones get
	 * their turn, and a new client is served again. */
	for (int i = 0; i < n; i++)
		close(fds[i]);
	for (double until = td_now() + 15; td_now() < until;) {
		rc = pf_connect(td.sock, &c);
		if (rc == 0)
			break;
		pf_close(c);
		c = NULL;
		usleep(200000);
	}
	print_message("  a new client connects %.1f s after the attack began: %d\n", td_now() - t0,
		      rc);
	assert_int_equal(rc, 0);
	pf_close(c);
	finish();
}

/* ---- 7: a flood of bad requests ---------------------------------------------- */

static void a_flood_of_bad_requests_gets_a_bounded_number_of_log_lines(void **state)
{
	uint8_t *frame, *chunk;
	size_t flen, per, sent = 0, total = 2600000;
	int fd, lines;
	double t0;

	start(NULL, NULL);
	fd = raw_connect();
	assert_int_equal(td_send_hello(fd, "flood"), 0);
	/* The finding's: Release frames the daemon must refuse (these
	 * without a session), 2.6 MB of them. */
	assert_int_equal(wire_encode(&release, &frame, &flen), 0);
	per = 65536 / flen;
	chunk = malloc(per * flen);
	assert_non_null(chunk);
	for (size_t k = 0; k < per; k++)
		memcpy(chunk + k * flen, frame, flen);
	fcntl(fd, F_SETFL, O_NONBLOCK);
	t0 = td_now();
	while (sent < total && td_now() - t0 < 30) {
		static char sink[1 << 16];
		size_t off = sent % (per * flen); /* whole frames, whatever send took */
		ssize_t n = send(fd, chunk + off, per * flen - off, MSG_NOSIGNAL);

		if (n > 0)
			sent += (size_t)n;
		/* Its replies are read, so that it is the log, not the output
		 * queue, that is tested. */
		while (recv(fd, sink, sizeof(sink), 0) > 0)
			;
		if (n < 0 && errno != EAGAIN)
			break;
		if (n < 0)
			usleep(1000);
	}
	print_message("  %zu bytes of bad Release frames (%zu frames) in %.2f s\n", sent,
		      sent / flen, td_now() - t0);
	assert_true(sent >= total);
	while (sent % (per * flen)) { /* the last chunk finished */
		ssize_t n = send(fd, chunk + sent % (per * flen), per * flen - sent % (per * flen),
				 MSG_NOSIGNAL);

		if (n > 0)
			sent += (size_t)n;
		else if (errno != EAGAIN)
			break;
	}
	free(chunk);
	/* One more refusal after a pause (a line passes every 0.5 s): its
	 * line says that lines were left out. */
	usleep(700000);
	assert_int_equal(send(fd, frame, flen, MSG_NOSIGNAL), (ssize_t)flen);
	free(frame);
	usleep(200000);
	close(fd);
	/* Every line about it names it ("flood (pid ...)"). */
	lines = (int)td_log_count(&td, "flood (pid", NULL, 1u << 30);
	print_message("  log lines about it: %d, for %zu refusals\n", lines, sent / flen + 1);
	/* 20 at once, then 2 a second, plus its connection's own lines. */
	assert_true(lines <= 20 + 2 * (td_now() - t0) + 4);
	assert_true(td_log_has(&td, "needs an open session",
			       "earlier refusals of this peer not "
			       "logged"));
	finish();
}

/* ---- 17: strings from clients, and whose sessions a user sees --------------------- */

#define ESC_NAME "bad\x1b[2Jname"

/* As nobody: a session named with an escape sequence; status shows this
 * user's sessions only (the bystander's, root's, are not among them). */
static int nobodys_session(void *arg)
{
	struct pf_open_opts o = {.dataset = "rows", .batch_size = 16, .name = ESC_NAME};
	struct pf_client *c = NULL;
	Pf__Envelope *st;
	int rc = pf_connect(td.sock, &c), mine = 0, others = 0;

	(void)arg;
	if (!rc)
		rc = pf_open(c, &o);
	st = rc ? NULL : td_status(td.sock);
	for (size_t i = 0; st && i < st->status_reply->n_sessions; i++) {
		const Pf__SessionStatus *s = st->status_reply->sessions[i];

		if (s->uid == getuid() && strcmp(s->name, "bad?[2Jname") == 0)
			mine++;
		else
			others++;
	}
	fprintf(stderr, "  [nobody] open %d; status lists %d session(s) of mine, %d of others\n",
		rc, mine, others);
	if (st)
		pf__envelope__free_unpacked(st, NULL);
	rc = child_holds(rc == 0 && mine == 1 && others == 0);
	pf_close(c);
	return rc;
}

static void client_strings_cannot_forge_lines_or_reach_a_terminal(void **state)
{
	char cmd[800], out[8192];
	Pf__Envelope *st;
	int fd, go, uids = 0;
	pid_t pid;

	need_root();
	start(open_access, NULL);
	/* The finding's: a newline in hello's client string, then a request
	 * that gets the client's name into a log line. */
	fd = raw_connect();
	assert_int_equal(td_send_hello(fd, "x\n<3>prefetchd: forged line"), 0);
	assert_int_equal(td_send_env(fd, &release, -1), 0);
	usleep(200000);
	close(fd);
	assert_true(td_log_has(&td, "x?<3>prefetchd: forged line", NULL));
	assert_false(td_log_has(&td, "\n<3>prefetchd: forged", NULL));
	{
		/* No line of the log begins with the forgery. */
		FILE *f = fopen(td.log, "r");
		char line[2048];

		assert_non_null(f);
		while (fgets(line, sizeof(line), f))
			assert_true(strncmp(line, "<3>prefetchd: forged", 20) != 0);
		fclose(f);
	}

	/* An escape sequence in a session name, as nobody. */
	pid = held_as(nobody, nobodys_session, NULL, &go);
	/* Root sees every user's sessions... */
	st = td_status(td.sock);
	assert_non_null(st);
	for (size_t i = 0; i < st->status_reply->n_sessions; i++)
		uids |= st->status_reply->sessions[i]->uid == nobody ? 1 : 2;
	pf__envelope__free_unpacked(st, NULL);
	assert_int_equal(uids, 3);
	/* ...and prefetchctl shows the name with no escape byte. */
	snprintf(cmd, sizeof(cmd), "%s -s %s status 2>&1", td_prefetchctl(), td.sock);
	assert_int_equal(td_capture(cmd, out, sizeof(out)), 0);
	print_message("  prefetchctl status:\n%s", out);
	assert_null(strchr(out, '\x1b'));
	assert_non_null(strstr(out, "bad?[2Jname"));
	let_go(pid, go);
	finish();
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(descriptors_sent_to_the_daemon_are_closed_off_the_loop),
		cmocka_unit_test(accept_backs_off_when_descriptors_run_out),
		cmocka_unit_test(a_flood_of_bad_requests_gets_a_bounded_number_of_log_lines),
		cmocka_unit_test(client_strings_cannot_forge_lines_or_reach_a_terminal),
	};

	signal(SIGPIPE, SIG_IGN);
	if (getenv("PF_TEST_FILTER")) /* one case, by glob, for a developer */
		cmocka_set_test_filter(getenv("PF_TEST_FILTER"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
