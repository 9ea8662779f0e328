/*
 * peer.h — a client as the request handlers see it: who it is, and how to
 * answer it.
 *
 * The server (server.c) makes one per connection and hands it to the
 * handlers (sess_epoch.c, sess.c, status.c) with every request; a session keeps it,
 * borrowed, until its connection goes.  Nothing below the server sees a
 * socket: replies go out through send, which queues them on the
 * connection.
 *
 * DESIGN: loop thread only.  The struct lives inside the server's
 * connection and dies with it (sess_detach tells the session first).
 */
#ifndef PF_PEER_H
#define PF_PEER_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "base/log.h"

struct Pf__Envelope;

struct peer {
	void *conn; /* borrowed: the server's connection, passed back to send */
	/* Queues env for the peer; pass_fd (>= 0) is sent with it and is the
	 * connection's from now on (closed on failure too).  0, or -errno:
	 * the connection is then being closed. */
	int (*send)(void *conn, const struct Pf__Envelope *env, int pass_fd);
	/* Is the connection's output queue so full that batches should
	 * wait?  When it returns true, the server kicks the session
	 * (sess_kick) once the queue has drained (flow control). */
	bool (*busy)(void *conn);
	uid_t uid; /* SO_PEERCRED */
	gid_t gid;
	pid_t pid;
	char name[96];		 /* "pid 123 uid 0", or the client's own name (printable) */
	struct log_limit *limit; /* the connection's: its refusals' log lines */
};

static inline bool peer_busy(const struct peer *p)
{
	return p->busy && p->busy(p->conn);
}

static inline int peer_send(const struct peer *p, const struct Pf__Envelope *env, int pass_fd)
{
	return p->send(p->conn, env, pass_fd);
}

/* Sends Error{code, message} answering request `id` (0 for unsolicited),
 * and logs it with the peer's name (a few a second at most per peer: the
 * rest are counted in the next line).  Returns what the send returned. */
int peer_error(const struct peer *p, uint64_t id, int code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

#endif
