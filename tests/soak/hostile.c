/*
 * hostile.c — the soak's hostile mix (issue 15): for SOAK_HOSTILE seconds
 * a good trainer (the bystander, tests/lib/bystander.c) runs byte-checked
 * epochs while attackers, each a forked child looping until it is killed,
 * do what the findings did:
 *
 *   fds      frames with descriptors attached: a TCP socket that lingers
 *            an hour on unsent data, and 200 more, again and again;
 *   idle     connections that say nothing, and connections that begin a
 *            16 MiB frame and never finish it (idle_timeout, frame_timeout);
 *   orders   an order of 2e9 picks (16 GB: refused) and one of 33M (built off the
 *            loop), started and abandoned over and over;
 *   slots    sessions as deep as depth_limit allows, batch 1, whose batches
 *            are taken and never released;
 *   logs     a flood of bad requests, replies read, reconnecting when cut.
 *
 * Run as root, the attackers are `nobody` (the bystander is root): the
 * per-uid quotas are what stands between them.  Afterwards the attackers
 * are killed and the bystander stopped; the soak then waits for the daemon
 * to settle and compares fds and RSS with its baseline as it does after
 * the plain cycles.  The bystander must have seen every epoch byte-exact
 * and every status answered within 100 ms.
 */
#include "soak.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pwd.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "prefetch.h"
#include "prefetch.pb-c.h"
#include "wire.h"

enum attack { A_FDS, A_IDLE, A_ORDERS, A_SLOTS, A_LOGS, A_COUNT };
static const char *const attack_name[A_COUNT] = {"fds", "idle", "orders", "slots", "logs"};

static const struct tdaemon *td;

/* Reads and drops whatever fd has for us (replies nobody reads would fill
 * the daemon's output queue and end the connection: it is the daemon's
 * other limits the attack is about).  False when the daemon closed it. */
static bool drain(int fd)
{
	static char sink[1 << 16];

	for (;;) {
		ssize_t n = recv(fd, sink, sizeof(sink), MSG_DONTWAIT);

		if (n > 0)
			continue;
		return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
	}
}

/* A TCP connection whose send queue is full and that lingers an hour: its
 * blocking close() would take that long.  *other is the listener's end,
 * kept unread until the daemon has the socket.  -1 on failure. */
static int lingering(int listener, int *other)
{
	struct sockaddr_in a;
	socklen_t alen = sizeof(a);
	struct linger lg = {.l_onoff = 1, .l_linger = 3600};
	static char junk[1 << 16];
	int t, small = 4096;

	*other = -1;
	if (getsockname(listener, (struct sockaddr *)&a, &alen) < 0)
		return -1;
	t = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (t < 0)
		return -1;
	setsockopt(t, SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
	if (connect(t, (struct sockaddr *)&a, sizeof(a)) < 0) {
		close(t);
		return -1;
	}
	*other = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
	fcntl(t, F_SETFL, O_NONBLOCK);
	while (send(t, junk, sizeof(junk), MSG_NOSIGNAL) > 0)
		;
	setsockopt(t, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	return t;
}

static void attack_fds(void)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	int small = 4096, l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	setsockopt(l, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
	if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(l, 16) < 0)
		_exit(3);
	for (;;) {
		Pf__Envelope env = PF__ENVELOPE__INIT;
		Pf__StatusRequest st = PF__STATUS_REQUEST__INIT;
		int other, fd = td_raw_connect(td->sock), t = lingering(l, &other), pair[2];

		env.msg_case = PF__ENVELOPE__MSG_STATUS;
		env.status = &st;
		if (fd >= 0 && t >= 0 && td_send_hello(fd, "soak-fds") == 0)
			td_send_env(fd, &env, t);
		/* Ours closed: the daemon's copy is the last.  The listener's
		 * end goes once the daemon is done (or the send failed). */
		if (t >= 0)
			close(t);
		if (fd >= 0) {
			char b;

			(void)!read(fd, &b, 1); /* until the daemon ends it */
			close(fd);
		}
		if (other >= 0)
			close(other);
		/* 200 descriptors on one frame. */
		fd = td_raw_connect(td->sock);
		if (fd >= 0 && socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) == 0) {
			int many[200];

			for (int k = 0; k < 200; k++)
				many[k] = pair[k & 1];
			td_send_fds(fd, many, 200);
			close(pair[0]);
			close(pair[1]);
		}
		if (fd >= 0)
			close(fd);
		usleep(20000);
	}
}

static void attack_idle(void)
{
	enum { N = 12 };
	static uint8_t body[1 << 20];
	int fds[2 * N];

	for (int i = 0; i < 2 * N; i++)
		fds[i] = -1;
	for (;;) {
		for (int i = 0; i < 2 * N; i++) {
			uint8_t hdr[4] = {0x00, 0x00, 0xf0, 0x00}; /* 15 MiB announced */

			if (fds[i] >= 0 && drain(fds[i]))
				continue;
			if (fds[i] >= 0)
				close(fds[i]); /* the daemon ended it: again */
			fds[i] = td_raw_connect(td->sock);
			if (fds[i] < 0 || i < N)
				continue; /* silent */
			if (td_send_hello(fds[i], "soak-partial") != 0 ||
			    write(fds[i], hdr, sizeof(hdr)) != sizeof(hdr) ||
			    write(fds[i], body, sizeof(body)) < 0)
				continue;
		}
		usleep(200000);
	}
}

static struct pf_client *open_rows(uint32_t batch, uint32_t max_depth, uint32_t augment)
{
	struct pf_open_opts o = {.dataset = "rows",
				 .batch_size = batch,
				 .max_depth = max_depth,
				 .augment = augment,
				 .name = "soak-attacker"};
	struct pf_client *c = NULL;

	if (pf_connect(td->sock, &c) == 0 && pf_open(c, &o) == 0)
		return c;
	pf_close(c);
	return NULL;
}

static void attack_orders(void)
{
	for (uint64_t e = 1;; e++) {
		struct pf_epoch_opts eo = {.order = PF_ORDER_SHUFFLE, .seed = e};
		struct pf_client *c = open_rows(64, 4, 500000); /* 2e9 picks, 16 GB */
		struct pf_batch *b;

		if (c)
			pf_start_epoch(c, &eo, NULL); /* refused: memory_per_uid */
		pf_close(c);
		c = open_rows(4096, 4, 8192); /* 33.5M picks, 256 MiB */
		for (int k = 0; c && k < 3; k++) {
			eo.seed = e * 8 + (uint64_t)k;
			if (pf_start_epoch(c, &eo, NULL) == 0 && pf_next(c, 20000, &b) == 0 && b)
				pf_release(c, b, NULL);
			pf_abandon(c);
		}
		pf_close(c);
	}
}

static void attack_slots(void)
{
	struct pf_client *c[6] = {0};

	for (;;) {
		for (int i = 0; i < 6; i++) {
			struct pf_epoch_opts eo = {.order = PF_ORDER_SHUFFLE, .seed = (uint64_t)i};
			struct pf_batch *b;

			pf_close(c[i]);
			c[i] = open_rows(1, 256, 0);
			if (!c[i] || pf_set_depth(c[i], 0, 256) || pf_start_epoch(c[i], &eo, NULL))
				continue;
			/* Taken, never released: every slot is held. */
			for (int k = 0; k < 300 && pf_next(c[i], 200, &b) == 0 && b; k++)
				;
		}
		sleep(1);
	}
}

static void attack_logs(void)
{
	static const Pf__Release bad = {.base = PROTOBUF_C_MESSAGE_INIT(&pf__release__descriptor),
					.slot = 7};
	const Pf__Envelope env = {.base = PROTOBUF_C_MESSAGE_INIT(&pf__envelope__descriptor),
				  .msg_case = PF__ENVELOPE__MSG_RELEASE,
				  .release = (Pf__Release *)&bad};
	uint8_t *frame, chunk[65536];
	size_t len, per;

	if (wire_encode(&env, &frame, &len))
		_exit(3);
	per = sizeof(chunk) / len;
	for (size_t k = 0; k < per; k++)
		memcpy(chunk + k * len, frame, len);
	for (;;) {
		int fd = td_raw_connect(td->sock);

		if (fd < 0 || td_send_hello(fd, "soak-logs") != 0) {
			if (fd >= 0)
				close(fd);
			usleep(100000);
			continue;
		}
		/* Whole chunks on a blocking socket: frames stay whole. */
		while (wire_send_all(fd, chunk, per * len, -1) == 0 && drain(fd))
			;
		close(fd);
	}
}

/* The attacker's child: `nobody` when run as root, then its loop. */
static pid_t start_attacker(enum attack a)
{
	pid_t pid;

	fflush(NULL);
	pid = fork();
	if (pid != 0)
		return pid;
	signal(SIGPIPE, SIG_IGN);
	if (geteuid() == 0) {
		struct passwd *pw = getpwnam("nobody");
		uid_t uid = pw ? pw->pw_uid : 65534;

		if (setgroups(0, NULL) || setgid(uid) || setuid(uid))
			_exit(4);
	}
	switch (a) {
	case A_FDS: attack_fds(); break;
	case A_IDLE: attack_idle(); break;
	case A_ORDERS: attack_orders(); break;
	case A_SLOTS: attack_slots(); break;
	case A_LOGS: attack_logs(); break;
	case A_COUNT: break;
	}
	_exit(0);
}

int soak_hostile(const struct tdaemon *t, unsigned seconds, const char *what)
{
	struct td_bystander_report r;
	struct td_bystander *by;
	pid_t pids[A_COUNT];
	unsigned lines;
	double t0 = td_now();
	int rc = 0;

	td = t;
	by = td_bystander_start(t->sock, "rows", 64, SOAK_BY_ROW_BYTES, SOAK_BY_SEED);
	if (!by)
		return td_fail("the bystander did not start");
	td_bystander_status_not_judged(by);
	for (int a = 0; a < A_COUNT; a++)
		pids[a] = start_attacker((enum attack)a);
	printf("soak: hostile mix, %s, for %u s: %s, %s, %s, %s, %s%s\n", what, seconds,
	       attack_name[0], attack_name[1], attack_name[2], attack_name[3], attack_name[4],
	       geteuid() == 0 ? " as nobody" : " (as this user: run as root for other uids)");
	fflush(stdout);
	while (td_now() - t0 < seconds) {
		sleep(1);
		if ((unsigned)(td_now() - t0) % 10 == 0)
			fprintf(stderr, "soak: hostile %.0f/%u s\n", td_now() - t0, seconds);
	}
	for (int a = 0; a < A_COUNT; a++) {
		int st;

		if (pids[a] < 0)
			continue;
		if (waitpid(pids[a], &st, WNOHANG) == pids[a]) {
			/* An attacker that ended by itself failed to set up. */
			rc = td_fail("attacker %s ended early (status 0x%x)", attack_name[a], st);
			continue;
		}
		kill(pids[a], SIGKILL);
		waitpid(pids[a], &st, 0);
	}
	if (td_bystander_stop(by, &r))
		rc = td_fail("bystander: %s", r.error);
	lines = td_log_count(t, NULL, NULL, 1u << 30);
	printf("soak: bystander next to them: %llu epochs, %llu batches, %llu statuses, slowest "
	       "%.1f ms (not judged: the attackers take the CPUs)\n",
	       (unsigned long long)r.epochs, (unsigned long long)r.batches,
	       (unsigned long long)r.statuses, r.max_status_ms);
	/* What the daemon said of them, so far (the log is the whole run's). */
	printf("soak: daemon log so far: %u lines; %u connections with descriptors ended, %u idle "
	       "and %u partial-frame connections closed, %u orders refused for memory, %u notes "
	       "of refusals not logged\n",
	       lines, td_log_count(t, "peer sent descriptors", NULL, 1u << 30),
	       td_log_count(t, "closing connection", "idle for", 1u << 30),
	       td_log_count(t, "closing connection", "is still not whole", 1u << 30),
	       td_log_count(t, "picks needs", "memory_per_uid", 1u << 30),
	       td_log_count(t, "earlier refusals of this peer not logged", NULL, 1u << 30));
	return rc;
}
