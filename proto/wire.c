/*
 * wire.c — length-prefixed protobuf frames and SCM_RIGHTS fd passing.
 *
 * DESIGN: no state beyond struct wire_rx, which belongs to whichever thread
 * owns the socket.  The receive buffer grows only up to max_frame + header:
 * wire_rx_next refuses a frame whose announced length exceeds the cap before
 * anything is allocated for it, so a hostile length costs us nothing.
 */
#include "wire.h"

#include "prefetch.pb-c.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

size_t wire_frame_size(const Pf__Envelope *env)
{
	size_t body = pf__envelope__get_packed_size(env);

	return body > UINT32_MAX ? 0 : WIRE_HDR + body;
}

void wire_encode_into(const Pf__Envelope *env, uint8_t *buf, size_t len)
{
	size_t body = len - WIRE_HDR;

	buf[0] = (uint8_t)body;
	buf[1] = (uint8_t)(body >> 8);
	buf[2] = (uint8_t)(body >> 16);
	buf[3] = (uint8_t)(body >> 24);
	pf__envelope__pack(env, buf + WIRE_HDR);
}

int wire_encode(const Pf__Envelope *env, uint8_t **frame, size_t *len)
{
	size_t n = wire_frame_size(env);
	uint8_t *buf;

	if (!n)
		return -EMSGSIZE;
	buf = malloc(n);
	if (!buf)
		return -ENOMEM;
	wire_encode_into(env, buf, n);
	*frame = buf;
	*len = n;
	return 0;
}

long wire_send_some(int sock, const uint8_t *buf, size_t len, int pass_fd)
{
	struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
	union {
		struct cmsghdr hdr;
		char space[CMSG_SPACE(sizeof(int))];
	} ctl;
	struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
	ssize_t n;

	if (pass_fd >= 0) {
		struct cmsghdr *cm;

		memset(&ctl, 0, sizeof(ctl));
		msg.msg_control = ctl.space;
		msg.msg_controllen = sizeof(ctl.space);
		cm = CMSG_FIRSTHDR(&msg);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(cm), &pass_fd, sizeof(int));
	}
	do
		n = sendmsg(sock, &msg, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return errno == EWOULDBLOCK ? -EAGAIN : -errno;
	return (long)n;
}

int wire_send_all(int sock, const uint8_t *buf, size_t len, int pass_fd)
{
	size_t off = 0;

	while (off < len) {
		long n = wire_send_some(sock, buf + off, len - off, off == 0 ? pass_fd : -1);

		if (n < 0)
			return (int)n;
		off += (size_t)n;
	}
	return 0;
}

void wire_rx_init(struct wire_rx *rx, size_t max_frame)
{
	memset(rx, 0, sizeof(*rx));
	rx->max_frame = max_frame ? max_frame : WIRE_MAX_FRAME_DEFAULT;
}

void wire_rx_free(struct wire_rx *rx)
{
	for (int i = 0; i < rx->nfds; i++)
		close(rx->fds[i]);
	rx->nfds = 0;
	free(rx->buf);
	rx->buf = NULL;
	rx->off = rx->len = rx->cap = 0;
}

/* Room for at least `want` more bytes, never beyond one maximal frame plus
 * its header (a frame longer than that is refused in wire_rx_next before we
 * would need the room). */
static int rx_reserve(struct wire_rx *rx, size_t want)
{
	size_t limit = rx->max_frame + WIRE_HDR;
	size_t cap = rx->cap ? rx->cap : 4096;
	uint8_t *p;

	/* Frames consumed since the last fill leave in one move, not one
	 * each (a flood of tiny frames would be quadratic). */
	if (rx->off) {
		memmove(rx->buf, rx->buf + rx->off, rx->len);
		rx->off = 0;
	}
	if (rx->len + want <= rx->cap)
		return 0;
	while (cap < rx->len + want)
		cap *= 2;
	if (cap > limit)
		cap = limit > rx->len + want ? limit : rx->len + want;
	p = realloc(rx->buf, cap);
	if (!p)
		return -ENOMEM;
	rx->buf = p;
	rx->cap = cap;
	return 0;
}

long wire_rx_fill(struct wire_rx *rx, int sock)
{
	union {
		struct cmsghdr hdr;
		char space[CMSG_SPACE(sizeof(int) * WIRE_SCM_MAX_FD)];
	} ctl;
	struct iovec iov;
	struct msghdr msg = {0};
	size_t want = rx->fill_bytes ? rx->fill_bytes : 64 * 1024;
	ssize_t n;
	int rc;

	/* 64 KiB (or fill_bytes) per read takes many small pushes at once;
	 * the buffer stays below one maximal frame plus this, since the
	 * caller drains whole frames after every fill. */
	rc = rx_reserve(rx, want);
	if (rc)
		return rc;
	iov.iov_base = rx->buf + rx->len;
	iov.iov_len = rx->cap - rx->len;
	msg.msg_iov = &iov;
	msg.msg_iovlen = 1;
	msg.msg_control = ctl.space;
	msg.msg_controllen = sizeof(ctl.space);
	do
		n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return errno == EWOULDBLOCK ? -EAGAIN : -errno;

	rc = 0;
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
		int *fds;
		size_t nfd;

		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		fds = (int *)CMSG_DATA(cm);
		nfd = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < nfd; i++) {
			if (rx->fd_sink) {
				rx->fd_sink(fds[i]);
				rc = -EPROTO;
			} else if (rx->nfds < WIRE_MAX_FDS) {
				rx->fds[rx->nfds++] = fds[i];
			} else {
				close(fds[i]);
				rc = -EMFILE;
			}
		}
	}
	if (msg.msg_flags & MSG_CTRUNC)
		rc = -EPROTO;
	if (rc)
		return rc;
	rx->len += (size_t)n;
	return (long)n;
}

int wire_rx_next(struct wire_rx *rx, Pf__Envelope **env)
{
	const uint8_t *p;
	uint32_t body;
	Pf__Envelope *e;

	if (rx->len < WIRE_HDR)
		return 0;
	p = rx->buf + rx->off;
	body = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
	if (body > rx->max_frame)
		return -EMSGSIZE;
	if (rx->len < WIRE_HDR + (size_t)body)
		return 0;
	e = pf__envelope__unpack(NULL, body, p + WIRE_HDR);
	/* Consume the frame whether or not it decoded: the caller closes the
	 * connection on -EBADMSG anyway, and the buffer stays consistent. */
	rx->len -= WIRE_HDR + body;
	rx->off = rx->len ? rx->off + WIRE_HDR + body : 0;
	/* A large frame's buffer goes once it is drained: a connection keeps
	 * only what everyday frames need. */
	if (!rx->len && rx->cap > WIRE_RX_KEEP) {
		free(rx->buf);
		rx->buf = NULL;
		rx->cap = 0;
	}
	if (!e)
		return -EBADMSG;
	if (e->msg_case == PF__ENVELOPE__MSG__NOT_SET) {
		pf__envelope__free_unpacked(e, NULL);
		return -EBADMSG;
	}
	*env = e;
	return 1;
}

int wire_rx_take_fd(struct wire_rx *rx)
{
	int fd;

	if (rx->nfds == 0)
		return -1;
	fd = rx->fds[0];
	memmove(rx->fds, rx->fds + 1, sizeof(int) * (size_t)(rx->nfds - 1));
	rx->nfds--;
	return fd;
}

const char *wire_msg_name(int msg_case)
{
	switch (msg_case) {
	case PF__ENVELOPE__MSG_HELLO: return "hello";
	case PF__ENVELOPE__MSG_HELLO_REPLY: return "hello_reply";
	case PF__ENVELOPE__MSG_OPEN: return "open";
	case PF__ENVELOPE__MSG_OPENED: return "opened";
	case PF__ENVELOPE__MSG_ARENA: return "arena";
	case PF__ENVELOPE__MSG_START: return "start";
	case PF__ENVELOPE__MSG_STARTED: return "started";
	case PF__ENVELOPE__MSG_BATCH: return "batch";
	case PF__ENVELOPE__MSG_END: return "end";
	case PF__ENVELOPE__MSG_ACK: return "ack";
	case PF__ENVELOPE__MSG_RELEASE: return "release";
	case PF__ENVELOPE__MSG_PROBE: return "probe";
	case PF__ENVELOPE__MSG_SET_DEPTH: return "set_depth";
	case PF__ENVELOPE__MSG_ABANDON: return "abandon";
	case PF__ENVELOPE__MSG_STATUS: return "status";
	case PF__ENVELOPE__MSG_STATUS_REPLY: return "status_reply";
	case PF__ENVELOPE__MSG_POOL: return "pool";
	case PF__ENVELOPE__MSG_LOAD: return "load";
	case PF__ENVELOPE__MSG_POOL_SLAB: return "pool_slab";
	case PF__ENVELOPE__MSG_POOL_SLAB_GONE: return "pool_slab_gone";
	case PF__ENVELOPE__MSG_POOL_REPLY: return "pool_reply";
	case PF__ENVELOPE__MSG_OK: return "ok";
	case PF__ENVELOPE__MSG_ERROR: return "error";
	default: return "unknown";
	}
}
