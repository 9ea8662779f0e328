/*
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

#include "peer.h"
#include "wire.h"

struct daemon;
struct sess;

struct out_frame {
	struct out_frame *next;
	uint8_t *buf; /* owned */
	size_t len, off;
	int fd; /* owned: passed with the first byte, closed once sent */
};

/* Most bytes waiting to be sent to one peer.  The governor bounds pushes,
 * so only a peer that floods requests without reading replies gets here. */
#define CONN_MAX_QUEUED (64u << 20)

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
	struct peer peer;  /* who it is (SO_PEERCRED), and how handlers answer it */
	struct sess *sess; /* owned: at most one session per connection */
};

int server_listen(struct daemon *d);
/* Closes the listener and every connection (shutdown). */
void server_stop(struct daemon *d);

/* Closes the connection, ending its session, after logging why. */
void conn_close(struct conn *c, const char *why);

#endif
