/*
 * base.c — the bottom of libprefetch: deadlines, error texts, breaking the
 * connection, and the raw write of whole frames to the socket.
 *
 * Everything above builds on these, and they call nothing of the library's
 * own: a failure anywhere is told with pfc_set_err (the call's error) or
 * pfc_conn_fail (the connection's, for good).  The raw write is here, and
 * not with the frames of conn.c, because the release lanes (settle.c) send
 * their Releases with it, straight to the socket and never through the
 * owner's corked buffer: the lanes then sit below the connection, whose
 * waits collect what they settled.
 *
 * DESIGN: the error texts and the dead state are the struct pf_client's,
 * used by the thread that owns it (prefetch.h: one at a time).  The lanes'
 * threads call pfc_send_for_gen, which holds send_lock for its whole write
 * and reads only what that lock guards (sock, gen, dead, the slot marks);
 * pfc_conn_fail closes the socket under the same lock, so that a lane
 * never writes to a closed or reused descriptor.
 */
#include "client_int.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- time and errors ----------------------------------------------------- */

/* -1: no deadline. */
int64_t pfc_deadline_after(int timeout_ms)
{
	return timeout_ms < 0 ? -1 : mono() + (int64_t)timeout_ms * 1000000;
}

/* Milliseconds left for poll(), rounded up so that a deadline 0.3 ms away
 * is not polled with 0 and spun on; -1 without a deadline. */
int pfc_ms_left(int64_t deadline)
{
	int64_t left;

	if (deadline < 0)
		return -1;
	left = deadline - mono();
	if (left <= 0)
		return 0;
	left = (left + 999999) / 1000000;
	return left > INT_MAX ? INT_MAX : (int)left;
}

static int vset_err(struct pf_client *c, int rc, const char *fmt, va_list ap)
{
	vsnprintf(c->err, sizeof(c->err), fmt, ap);
	return rc;
}

int pfc_set_err(struct pf_client *c, int rc, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vset_err(c, rc, fmt, ap);
	va_end(ap);
	return rc;
}

/* Breaks the connection: closes the socket (the daemon then takes back
 * every slot and frees the session) and makes every later call return rc
 * with this message.  The first failure wins. */
int pfc_conn_fail(struct pf_client *c, int rc, const char *fmt, ...)
{
	va_list ap;

	if (c->dead) {
		snprintf(c->err, sizeof(c->err), "%s", c->dead_msg);
		return c->dead;
	}
	va_start(ap, fmt);
	vsnprintf(c->dead_msg, sizeof(c->dead_msg), fmt, ap);
	va_end(ap);
	snprintf(c->err, sizeof(c->err), "%s", c->dead_msg);
	pthread_mutex_lock(&c->send_lock);
	c->dead = rc;
	if (c->sock >= 0)
		close(c->sock);
	c->sock = -1;
	pthread_mutex_unlock(&c->send_lock);
	return rc;
}

int pfc_fail_dead(struct pf_client *c)
{
	snprintf(c->err, sizeof(c->err), "%s", c->dead_msg);
	return c->dead;
}

/* A daemon's error code must be a -errno; anything else is its bug. */
int pfc_sane_code(int32_t code)
{
	return code < 0 && code > -4096 ? code : -EPROTO;
}

/* ---- the raw write ------------------------------------------------------- */

/* Writes len bytes to sock, waiting until deadline for room: 0, or -errno
 * (-ETIMEDOUT when the deadline passed, with part of the bytes possibly
 * on the wire).  *sends counts the system calls.  Touches nothing else, so
 * a release lane may use it too (send_lock held). */
int pfc_write_all(int sock, const uint8_t *frame, size_t len, int64_t deadline, uint64_t *sends)
{
	size_t off = 0;

	while (off < len) {
		long n = wire_send_some(sock, frame + off, len - off, -1);
		struct pollfd pfd = {.fd = sock, .events = POLLOUT};
		int ready;

		(*sends)++;
		if (n > 0) {
			off += (size_t)n;
			continue;
		}
		if (n != -EAGAIN)
			return (int)n;
		ready = poll(&pfd, 1, pfc_ms_left(deadline));
		if (ready < 0 && errno == EINTR)
			continue;
		if (ready == 0)
			return -ETIMEDOUT;
		if (ready < 0)
			return -errno;
	}
	return 0;
}

void pfc_send_for_gen(struct pf_client *c, Pf__Envelope *msg, uint64_t gen, int32_t slot)
{
	int64_t deadline = pfc_deadline_after(c->timeout_ms);
	uint8_t *frame = NULL;
	uint64_t sends = 0; /* not counted: c->counts is the owner's */
	size_t len;

	msg->id = 0;
	if (wire_encode(msg, &frame, &len))
		return; /* out of memory: the slot comes back with the socket */
	pthread_mutex_lock(&c->send_lock);
	if (c->dead || c->sock < 0 || c->gen != gen)
		goto out;
	/* Unmarked before the Release is out: the daemon may announce the
	 * slot again at once, and the owner's read of that must not find it
	 * still marked. */
	if (slot >= 0 && (uint32_t)slot < c->slots)
		slot_mark(c, slot, false);
	/* Broken, or part of a frame on the wire: the stream is over, and
	 * the owner's next read finds it so and says why. */
	if (pfc_write_all(c->sock, frame, len, deadline, &sends))
		shutdown(c->sock, SHUT_RDWR);
out:
	pthread_mutex_unlock(&c->send_lock);
	free(frame);
}
