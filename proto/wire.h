/*
 * wire.h — framing of the prefetchd protocol, shared by the daemon, the
 * client library and prefetchctl (the ntpd pattern: one protocol header).
 *
 * A frame is a 4-byte little-endian body length followed by one encoded
 * pf.Envelope (proto/prefetch.proto).  The length is checked against the
 * receiver's cap before any allocation or decoding, so a peer cannot make us
 * allocate more than the cap, and a garbage body is refused by the decoder.
 *
 * File descriptors ride as SCM_RIGHTS on the first byte of a frame.  The
 * receive side keeps every fd it is given in arrival order (struct wire_rx)
 * and the frame that needs one takes the oldest.
 *
 * DESIGN: no threads, no locks: each struct wire_rx belongs to whoever owns the
 * socket (the daemon's loop thread, or the client library's caller).
 */
#ifndef PF_WIRE_H
#define PF_WIRE_H

#include <stddef.h>
#include <stdint.h>

/* The envelope type of prefetch.pb-c.h, which framing code needs only by
 * pointer: including wire.h does not bring the protobuf types along. */
struct Pf__Envelope;

#define WIRE_VERSION 1
#define WIRE_HDR     4
/* 16 MiB: an explicit index list of about two million picks fits in one
 * StartEpoch; everything else is far smaller. */
#define WIRE_MAX_FRAME_DEFAULT (16u << 20)
/* Most fds a receiver keeps waiting to be claimed; a peer sending more is
 * broken or hostile and loses its connection. */
#define WIRE_MAX_FDS 64

/* Encodes env as one frame (header + body) into a malloc'd buffer. */
int wire_encode(const struct Pf__Envelope *env, uint8_t **frame, size_t *len);
/* The same in two steps, for a caller with its own buffers: the frame's
 * size (0 when env is beyond a frame's 4 GiB), then the frame into buf,
 * which holds that many bytes. */
size_t wire_frame_size(const struct Pf__Envelope *env);
void wire_encode_into(const struct Pf__Envelope *env, uint8_t *buf, size_t len);

/* Sends the whole buffer on a blocking socket, retrying on EINTR, without
 * SIGPIPE.  When pass_fd >= 0 it is attached to the first byte.  0 or -errno. */
int wire_send_all(int sock, const uint8_t *buf, size_t len, int pass_fd);

/* One non-blocking-or-blocking send attempt: returns bytes sent (> 0) or
 * -errno (-EAGAIN when the socket is full).  pass_fd as above. */
long wire_send_some(int sock, const uint8_t *buf, size_t len, int pass_fd);

/* The most descriptors one sendmsg can carry (the kernel's SCM_MAX_FD): a
 * receive has room for all of them, so the kernel never closes one that
 * did not fit on the receiving thread (a close may block). */
#define WIRE_SCM_MAX_FD 253

/* Receive buffers above this are freed when drained. */
#define WIRE_RX_KEEP (256u << 10)

struct wire_rx {
	uint8_t *buf; /* owned: received bytes; those not yet consumed at off */
	size_t off;   /* consumed frames before it, moved out at the next fill */
	size_t len;   /* bytes not yet consumed */
	size_t cap;
	size_t max_frame;
	int fds[WIRE_MAX_FDS]; /* owned until taken: fds in arrival order */
	int nfds;
	/* A receiver that takes no descriptors (the daemon): each one that
	 * comes is handed here, which owns it from then on, and the fill
	 * fails with -EPROTO.  NULL: they are kept for wire_rx_take_fd. */
	void (*fd_sink)(int fd);
	/* Bytes one fill asks for: 64 KiB unless set after wire_rx_init
	 * (the client asks for more: a frame of 1024 picks and their gather
	 * ids is 16 KiB, and a read should take in all the daemon has sent
	 * ahead, so that their gathers go in few launches). */
	size_t fill_bytes;
};

void wire_rx_init(struct wire_rx *rx, size_t max_frame);
/* Closes any unclaimed fds and frees the buffer. */
void wire_rx_free(struct wire_rx *rx);
/* One recvmsg: appends bytes and collects fds.  Returns bytes read (> 0),
 * 0 on orderly EOF, or -errno (-EAGAIN on an empty non-blocking socket,
 * -EMFILE/-EPROTO when the peer sends too many fds, or any with fd_sink
 * set). */
long wire_rx_fill(struct wire_rx *rx, int sock);
/* Takes one whole frame out of the buffer if there is one.  Returns 1 and sets
 * *env (free with pf__envelope__free_unpacked(*env, NULL)), 0 when more bytes
 * are needed, -EMSGSIZE when the announced length exceeds max_frame (checked
 * before decoding), -EBADMSG when the body does not decode. */
int wire_rx_next(struct wire_rx *rx, struct Pf__Envelope **env);
/* The oldest received fd not yet taken, or -1.  The caller owns it. */
int wire_rx_take_fd(struct wire_rx *rx);

/* Human name of an envelope's message case, for logs: "open", "batch". */
const char *wire_msg_name(int msg_case);

#endif
