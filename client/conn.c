/*
 * conn.c — libprefetch's connection to the daemon: frames out (corked or
 * at once) and frames in (read, decoded, waited for with a deadline).
 * What a frame says is for the files above: batch.c takes pushes in,
 * call.c matches replies to requests.  Deadlines, error texts and the raw
 * write are base.c's.
 *
 * A client is one socket.  Every wait is a poll() with a deadline, so a
 * wedged daemon costs a caller at most its timeout and a dead one (EOF) is
 * noticed at once; nothing here waits on anything the daemon owns.  A
 * frame that does not decode breaks the connection: the socket is closed,
 * so the daemon takes every slot back, and every later call returns the
 * same error.  While a wait has nothing to read, it hands the corked
 * frames to the socket and collects what the release lanes (settle.c)
 * settled; a wait for a client copy's buffer also polls the lanes' eventfd.
 *
 * DESIGN: the socket, the receive buffer and the error texts are the
 * struct pf_client's, used by one thread at a time (prefetch.h says so),
 * with one exception: the release lanes of a CUDA client (settle.c) write
 * Releases from their threads (base.c's pfc_send_for_gen).  So every write
 * of a frame holds send_lock, and so do the changes a lane must see whole:
 * closing the socket (pfc_conn_fail, the one place that closes it),
 * installing a new one (pfc_connect_fd, pf_connect, a reconnection) and
 * the connection's gen.
 */
#include "client_int.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- frames out ---------------------------------------------------------- */

/* The daemon closed the connection.  A daemon that refuses a peer
 * (SO_PEERCRED) pushes an Error and closes before hello, possibly before our
 * hello is even sent: so read what it left, and prefer its reason to a bare
 * "closed". */
static int peer_closed(struct pf_client *c)
{
	Pf__Envelope *env;

	for (;;) {
		int rc = wire_rx_next(&c->rx, &env);

		if (rc == 1) {
			if (env->id == 0 && env->msg_case == PF__ENVELOPE__MSG_ERROR &&
			    !c->pending_err) {
				c->pending_err = pfc_sane_code(env->error->code);
				snprintf(c->pending_msg, sizeof(c->pending_msg), "prefetchd: %s",
					 env->error->message ? env->error->message : "");
			}
			pf__envelope__free_unpacked(env, NULL);
			continue;
		}
		if (rc < 0 || wire_rx_fill(&c->rx, c->sock) <= 0)
			break;
	}
	if (c->pending_err && !c->greeted)
		return pfc_conn_fail(c, c->pending_err, "%s", c->pending_msg);
	/* The daemon's end closed: it exited, crashed or was killed (a daemon
	 * that drops one client on purpose pushes an Error first, caught
	 * above before hello and by pending_err after it). */
	return pfc_conn_fail(c, -ECONNRESET, "%s went away (the connection closed)", c->where);
}

static int send_bytes_now(struct pf_client *c, const uint8_t *frame, size_t len, int64_t deadline,
			  const char *what);

/* Writes len bytes of frames, waiting until deadline; what names them in an
 * error.  A partial write is the end of the connection. */
static int send_bytes(struct pf_client *c, const uint8_t *frame, size_t len, int64_t deadline,
		      const char *what)
{
	int64_t t0 = PFC_T0(c);
	int rc;

	/* Whole frames only: a lane's Release must not land inside one. */
	pthread_mutex_lock(&c->send_lock);
	rc = send_bytes_now(c, frame, len, deadline, what);
	pthread_mutex_unlock(&c->send_lock);
	PFC_TADD(c, send_ns, t0);
	return rc;
}

static int send_bytes_now(struct pf_client *c, const uint8_t *frame, size_t len, int64_t deadline,
			  const char *what)
{
	int rc = pfc_write_all(c->sock, frame, len, deadline, &c->counts.sends);

	if (rc == -EPIPE || rc == -ECONNRESET)
		return peer_closed(c);
	if (rc == -ETIMEDOUT)
		/* Part of a frame may be on the wire: the stream cannot be
		 * resynchronised, so the connection is over.  Not -ETIMEDOUT,
		 * which pf_next returns for "no batch yet, call again": a
		 * caller (the Python loop) would retry a dead connection for
		 * ever. */
		return pfc_conn_fail(c, -ECONNABORTED, "%s did not take %s in time", c->where,
				     what);
	if (rc)
		return pfc_conn_fail(c, rc, "cannot send to %s: %s", c->where, strerror(-rc));
	return 0;
}

int pfc_send_env(struct pf_client *c, Pf__Envelope *env, int64_t deadline)
{
	uint8_t *frame = NULL;
	size_t len;
	int rc;

	if (c->dead)
		return pfc_fail_dead(c);
	rc = wire_encode(env, &frame, &len);
	if (rc)
		return pfc_set_err(c, rc, "cannot encode %s: %s", wire_msg_name(env->msg_case),
				   strerror(-rc));
	if (len - WIRE_HDR > c->max_frame) {
		rc = pfc_set_err(
			c, -EMSGSIZE,
			"%s message of %zu bytes is over the %" PRIu32 "-byte frame limit of %s",
			wire_msg_name(env->msg_case), len - WIRE_HDR, c->max_frame, c->where);
		goto out;
	}
	if (c->corked && env->id == 0) {
		/* One-way messages wait for pfc_uncork, to go out in one write. */
		if (c->out_len + len > c->out_cap) {
			size_t cap = c->out_cap ? c->out_cap : 4096;
			uint8_t *t;

			while (cap < c->out_len + len)
				cap *= 2;
			t = realloc(c->out, cap);
			if (!t) {
				rc = pfc_set_err(c, -ENOMEM, "out of memory");
				goto out;
			}
			c->out = t;
			c->out_cap = cap;
		}
		memcpy(c->out + c->out_len, frame, len);
		c->out_len += len;
		goto out;
	}
	rc = pfc_uncork(c);
	if (!rc)
		rc = send_bytes(c, frame, len, deadline, wire_msg_name(env->msg_case));
out:
	free(frame);
	return rc;
}

void pfc_cork(struct pf_client *c)
{
	c->corked = true;
}

int pfc_uncork(struct pf_client *c)
{
	size_t len = c->out_len;

	c->corked = false;
	if (!len)
		return 0;
	c->out_len = 0;
	if (c->dead)
		return pfc_fail_dead(c);
	return send_bytes(c, c->out, len, pfc_deadline_after(c->timeout_ms), "messages");
}

int pfc_send(struct pf_client *c, Pf__Envelope *msg)
{
	msg->id = 0;
	return pfc_send_env(c, msg, pfc_deadline_after(c->timeout_ms));
}

/* ---- frames in ----------------------------------------------------------- */

/* The next frame already received: 1 with *env, 0 for none, or the error
 * that broke the connection. */
int pfc_next_frame(struct pf_client *c, Pf__Envelope **env)
{
	int64_t t0 = PFC_T0(c);
	int rc = wire_rx_next(&c->rx, env);

	PFC_TADD(c, decode_ns, t0);
	if (rc >= 0)
		return rc;
	if (rc == -EMSGSIZE)
		return pfc_conn_fail(c, -EPROTO,
				     "%s sent a frame longer than %zu bytes; connection closed",
				     c->where, c->rx.max_frame);
	return pfc_conn_fail(c, -EPROTO, "%s sent a frame that does not decode; connection closed",
			     c->where);
}

/* A failed fill of the receive buffer (n < 0, not -EAGAIN): the error that
 * breaks the connection. */
static int fill_failed(struct pf_client *c, long n)
{
	if (n == -ECONNRESET)
		return peer_closed(c);
	if (n == -EMFILE || n == -EPROTO)
		return pfc_conn_fail(c, -EPROTO,
				     "%s sent more file descriptors than this client keeps",
				     c->where);
	return pfc_conn_fail(c, (int)n, "cannot receive from %s: %s", c->where, strerror((int)-n));
}

/* One read of what the socket holds (wire_rx_fill), counted. */
static long rx_fill(struct pf_client *c)
{
	int64_t t0 = PFC_T0(c);
	long n = wire_rx_fill(&c->rx, c->sock);

	PFC_TADD(c, read_ns, t0);
	c->counts.reads++;
	if (n == -EAGAIN)
		c->counts.empty_reads++;
	return n;
}

int pfc_check_peer(struct pf_client *c)
{
	struct pollfd pfd = {.fd = c->sock, .events = POLLRDHUP};
	int n;

	if (c->dead)
		return pfc_fail_dead(c);
	c->counts.polls++;
	do
		n = poll(&pfd, 1, 0);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return pfc_conn_fail(c, -errno, "poll: %s", strerror(errno));
	/* A unix socket whose peer has closed polls as hung up at once, even
	 * with frames of it still unread. */
	if (pfd.revents & (POLLHUP | POLLRDHUP | POLLERR))
		return peer_closed(c);
	return 0;
}

int pfc_fill_now(struct pf_client *c)
{
	long n;

	if (c->dead)
		return pfc_fail_dead(c);
	n = rx_fill(c);
	if (n == 0)
		return peer_closed(c);
	if (n < 0 && n != -EAGAIN)
		return fill_failed(c, n);
	return 0;
}

/* poll() of n fds with a deadline to the nanosecond (poll's own timeout
 * counts in milliseconds). */
static int poll_until(struct pollfd *pfd, nfds_t n, int64_t deadline)
{
	struct timespec ts;
	int64_t left;

	if (deadline < 0)
		return ppoll(pfd, n, NULL, NULL);
	left = deadline - mono();
	if (left < 0)
		left = 0;
	ts.tv_sec = (time_t)(left / 1000000000);
	ts.tv_nsec = (long)(left % 1000000000);
	return ppoll(pfd, n, &ts, NULL);
}

/*
 * Reads one frame, waiting until deadline.  Returns 0 with *env, -ETIMEDOUT
 * (the connection stays usable; no message set), -EAGAIN when wake_fd
 * (>= 0) became readable first, or the error that broke the connection.
 */
static int read_env(struct pf_client *c, int64_t deadline, Pf__Envelope **env, int wake_fd)
{
	bool polled = false;

	for (;;) {
		struct pollfd pfd[2];
		int64_t t0;
		long n;
		int rc;

		if (c->dead)
			return pfc_fail_dead(c);
		rc = pfc_next_frame(c, env);
		if (rc == 1)
			return 0;
		if (rc < 0)
			return rc;
		/* A frame that is already there needs no poll: one system call
		 * instead of two on the hand-off of a ready batch. */
		if (!polled) {
			polled = true;
			n = rx_fill(c);
			if (n > 0)
				continue;
			if (n == 0)
				return peer_closed(c);
			if (n != -EAGAIN)
				return fill_failed(c, n);
		}
		/* Nothing to read: what waits corked goes out before we wait,
		 * and the lanes' settled releases are disposed of. */
		pfc_settle_collect(c);
		rc = pfc_uncork(c);
		if (rc)
			return rc;
		pfd[0].fd = c->sock;
		pfd[0].events = POLLIN;
		pfd[0].revents = 0;
		pfd[1].fd = wake_fd;
		pfd[1].events = POLLIN;
		pfd[1].revents = 0;
		c->counts.polls++;
		t0 = PFC_T0(c);
		rc = poll_until(pfd, wake_fd >= 0 ? 2 : 1, deadline);
		PFC_TADD(c, wait_ns, t0);
		if (rc < 0 && errno == EINTR)
			continue;
		if (rc < 0)
			return pfc_conn_fail(c, -errno, "poll: %s", strerror(errno));
		if (rc == 0)
			return -ETIMEDOUT;
		if (wake_fd >= 0 && (pfd[1].revents & POLLIN) && !pfd[0].revents)
			return -EAGAIN;
		n = rx_fill(c);
		if (n == 0)
			return peer_closed(c);
		if (n < 0 && n != -EAGAIN)
			return fill_failed(c, n);
	}
}

int pfc_read_env(struct pf_client *c, int64_t deadline, Pf__Envelope **env)
{
	return read_env(c, deadline, env, -1);
}

int pfc_read_env_or_buffer(struct pf_client *c, int64_t deadline, Pf__Envelope **env)
{
	int fd = pfc_settle_fd(c);

	/* Without an eventfd, look again every millisecond: rare (eventfd
	 * failed), and a wait for a buffer only. */
	if (fd < 0) {
		int64_t slice = mono() + 1000000;
		int rc = read_env(c, deadline >= 0 && deadline < slice ? deadline : slice, env, -1);

		return rc == -ETIMEDOUT && (deadline < 0 || mono() < deadline) ? -EAGAIN : rc;
	}
	return read_env(c, deadline, env, fd);
}

void pfc_set_timeout(struct pf_client *c, int timeout_ms)
{
	c->timeout_ms = timeout_ms > 0 ? timeout_ms : PFC_TIMEOUT_MS_DEFAULT;
}

bool pfc_broken(const struct pf_client *c)
{
	return c->dead != 0;
}

/* ---- making a client ----------------------------------------------------- */

struct pf_client *pfc_client_new(const char *where)
{
	struct pf_client *c = calloc(1, sizeof(*c));
	const char *env = getenv(PFC_TIMEOUT_ENV);
	const char *counters = getenv(PFC_COUNTERS_ENV);
	pthread_mutexattr_t ma;
	char *end;
	long ms;

	if (!c)
		return NULL;
	c->sock = -1;
	/* Recursive: send_bytes holds it when a failed send breaks the
	 * connection (pfc_conn_fail takes it again to close the socket). */
	pthread_mutexattr_init(&ma);
	pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE);
	pthread_mutex_init(&c->send_lock, &ma);
	pthread_mutexattr_destroy(&ma);
	c->timing = counters && *counters && strcmp(counters, "0") != 0;
	c->where = strdup(where);
	if (!c->where) {
		free(c);
		return NULL;
	}
	wire_rx_init(&c->rx, PFC_MAX_RX_FRAME);
	c->rx.fill_bytes = PFC_RX_FILL;
	c->max_frame = WIRE_MAX_FRAME_DEFAULT;
	c->timeout_ms = PFC_TIMEOUT_MS_DEFAULT;
	c->gen = 1;
	if (env && *env) {
		errno = 0;
		ms = strtol(env, &end, 10);
		if (!errno && !*end && ms > 0 && ms <= INT_MAX)
			c->timeout_ms = (int)ms;
	}
	snprintf(c->hello_name, sizeof(c->hello_name), "%s[%d]", program_invocation_short_name,
		 (int)getpid());
	return c;
}
