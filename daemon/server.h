/*
 * server.h — the listening socket and the connections on it.
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
	uid_t uid;
	gid_t gid;
	pid_t pid;
	bool hello_done;
	bool closing;
	char peer[96];	   /* "pid 123 uid 0 (name)" for logs */
	struct sess *sess; /* owned: at most one session per connection */
};

int server_listen(struct daemon *d);
/* Closes the listener and every connection (shutdown). */
void server_stop(struct daemon *d);

/* Queues env for the peer; pass_fd (>= 0) is owned by the queue from now on.
 * 0, or -errno (the connection is then being closed). */
int conn_send(struct conn *c, const Pf__Envelope *env, int pass_fd);
/* Sends Error{code, message} answering request `id` (0 for unsolicited). */
int conn_error(struct conn *c, uint64_t id, int code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
/* Closes the connection, ending its session, after logging why. */
void conn_close(struct conn *c, const char *why);

#endif
