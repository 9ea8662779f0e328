/*
 * daemon/server/ — the process and its socket: startup, signals and the
 * loop (main.c), the listening socket and its directory (listen.c),
 * connections, frames and dispatch (server.c), status, pool and depth
 * replies (status.c), and the closer thread that closes client descriptors
 * off the loop (closer.c).  Loop thread, plus the closer.  The top: nothing
 * else calls into it.
 *
 * server.h — the listening socket and the connections on it.
 *
 * The server is the daemon's only part that sees sockets and frames.  It
 * answers Hello itself and hands every other request, decoded, to the
 * session layer (sess.h, status.h) with the connection's peer (peer.h),
 * through which the replies come back to its output queue.
 *
 * DESIGN: loop thread only.  Each connection is a non-blocking Unix socket
 * watched by a uv_poll_t (not a uv_pipe_t: we need sendmsg with SCM_RIGHTS
 * for arbitrary descriptors, which uv_write2 does not offer).  Incoming
 * bytes are framed by proto/wire.c with the configured max_frame cap;
 * outgoing frames wait in a bounded queue.  A connection that breaks the
 * protocol is closed with a logged reason; nothing else is disturbed.
 */
#ifndef PF_SERVER_H
#define PF_SERVER_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "sess/peer.h"
#include "wire.h"

struct daemon;
struct sess;

/* Queued output: one frame, or small frames back to back in one buffer of
 * CONN_OUT_CHUNK (a client that does not read the replies to a flood of
 * tiny requests would otherwise queue a million small allocations, which
 * took 0.4 s of the loop to free). */
struct out_frame {
	struct out_frame *next;
	uint8_t *buf; /* owned (bigmem), cap bytes */
	size_t len, off, cap;
	int fd; /* owned: passed with the first byte, closed once sent */
};
#define CONN_OUT_CHUNK (64u << 10)

/* Flow control: while this much waits to be sent to a peer, its session
 * sends no more batches; it goes on once the queue is down to
 * CONN_LOW_WATER.  So a client of big batches is slowed to its own reading
 * pace instead of being cut off. */
#define CONN_HIGH_WATER (4u << 20)
#define CONN_LOW_WATER	(1u << 20)
/* Most bytes waiting to be sent to one peer: the high water, plus the
 * largest BatchReady (SESS_MAX_BATCH picks of 8 bytes), plus room for
 * replies.  Only a peer that floods requests without reading the replies
 * gets here, and is closed. */
#define CONN_MAX_QUEUED (96u << 20)

struct conn {
	struct conn *next, *prev; /* daemon->conns */
	struct daemon *d;	  /* borrowed */
	int fd;			  /* owned */
	uv_poll_t poll;
	int poll_events;
	struct wire_rx rx;
	struct out_frame *out_head, *out_tail; /* owned */
	size_t out_bytes;
	bool hello_done;
	bool closing;
	bool counted;		 /* holds one of its uid's connections (quota.h) */
	bool drain_kick;	 /* its session waits for the output queue to drain */
	bool rx_later;		 /* whole frames wait in rx for the next turn */
	bool last_words;	 /* refused: its last replies are queued outside the quota */
	uint64_t mem_held;	 /* memory quota held for its buffers: rx.cap + queued frames */
	uint64_t rx_held;	 /* of it, for the receive buffer */
	uint64_t last_rx_ns;	 /* when it last sent something (idle_timeout) */
	uint64_t frame_since_ns; /* when the frame now incomplete began, 0: none (frame_timeout) */
	struct log_limit log_limit;
	struct peer peer;  /* who it is (SO_PEERCRED), and how handlers answer it */
	struct sess *sess; /* owned: at most one session per connection */
	/* owned: or, instead, its membership of a share (share.h) */
	struct share_member *member;
};

int server_listen(struct daemon *d);
/* Housekeeping (the daemon's 1 s tick): closes connections idle with no
 * session for idle_timeout, and those whose frame has been incomplete for
 * frame_timeout. */
void server_tick(struct daemon *d);
/* Closes the listener and every connection (shutdown). */
void server_stop(struct daemon *d);

/* Closes the connection, ending its session, after logging why. */
void conn_close(struct conn *c, const char *why);

#endif
