/*
 * client_int.h — libprefetch internals shared by the library's own files,
 * prefetchctl and the unit tests.  Not installed: prefetch.h is the only
 * public header.
 *
 * Everything declared here has hidden visibility (the library is compiled
 * with -fvisibility=hidden), so it links from libprefetch.a but is not
 * exported from libprefetch.so.
 *
 * DESIGN: no threads and no locks.  A struct pf_client is used by one thread
 * at a time (the trainer's, or prefetchctl's main thread), which owns its
 * socket, its receive buffer and every list below.
 */
#ifndef PF_CLIENT_INT_H
#define PF_CLIENT_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "prefetch.h"
#include "prefetch.pb-c.h"
#include "wire.h"

/* Replies to requests: how long a reply may take before the call gives up
 * with -ETIMEDOUT.  The daemon answers from its loop thread, which never
 * blocks, so 10 s means it is wedged or gone.  $PREFETCHD_TIMEOUT_MS
 * overrides it. */
#define PFC_TIMEOUT_MS_DEFAULT 10000
#define PFC_TIMEOUT_ENV	       "PREFETCHD_TIMEOUT_MS"
/* Hello gets its own, shorter limit: a socket that accepts but never answers
 * (a stale path, the wrong program) should fail pf_connect quickly. */
#define PFC_HELLO_TIMEOUT_MS 5000
/* Batches received but not yet taken.  The daemon's target bounds this far
 * lower (a few slots); more than this is a daemon bug, treated as a protocol
 * error rather than as a reason to grow without limit. */
#define PFC_MAX_QUEUED 4096
/* While releases wait for the GPU, pf_next checks them this often. */
#define PFC_RELEASE_POLL_NS 200000
/* Arena ids index a table; the daemon makes a handful per session. */
#define PFC_MAX_ARENAS 1024
/* Slots per session; the bitmap of slots this client holds is this big at
 * most. */
#define PFC_MAX_SLOTS (1u << 20)

/*
 * Takes ownership of sock (a connected stream socket; closed on failure too),
 * says hello and waits up to hello_timeout_ms for the reply.  `where` names
 * the peer in messages ("prefetchd at /run/...").  Like pf_connect, on
 * failure *out is still set when the client struct could be allocated, so
 * that pf_errmsg(*out) can say why; the caller pf_close()s it.
 */
int pfc_connect_fd(int sock, const char *where, int hello_timeout_ms, struct pf_client **out);

/*
 * Sends req (its id is overwritten with a fresh one) and waits for the reply
 * that echoes that id.  Pushes read meanwhile are handled as usual (batches
 * queued, arenas mapped, stale batches released).  Returns 0 and, when reply
 * is not NULL, the reply envelope (free it with
 * pf__envelope__free_unpacked(*reply, NULL)) if its case is reply_case;
 * the daemon's Error code (message in pf_errmsg) if it refused; -ETIMEDOUT
 * after the client's request timeout; -EPROTO for a reply of another case;
 * or the connection's error once it is broken.
 */
int pfc_call(struct pf_client *c, Pf__Envelope *req, int reply_case, Pf__Envelope **reply);

/* Sends a one-way message (Ack, Release, Probe): id 0, no reply. */
int pfc_send(struct pf_client *c, Pf__Envelope *msg);

/* Request timeout of this client, in ms (> 0). */
void pfc_set_timeout(struct pf_client *c, int timeout_ms);

/* Whether the connection is broken (EOF, a protocol error): every later call
 * fails.  A timeout or an error batch leaves it usable. */
bool pfc_broken(const struct pf_client *c);

/* What the daemon said in HelloReply; borrowed, valid until pf_close. */
const char *pfc_daemon_version(const struct pf_client *c);
uint32_t pfc_daemon_max_frame(const struct pf_client *c);

/* Sets pf_errmsg(c) from a printf format and returns rc, for callers that
 * build on the internal API (prefetchctl). */
int pfc_set_err(struct pf_client *c, int rc, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/*
 * A release waiting for the trainer's queued GPU work.  Host batches are
 * released at once (done == NULL).  CUDA batches (client/cuda.c) record an
 * event on the trainer's stream and set done/event; pf_next, pf_release and
 * pf_close poll the list and send each Release whose done(event) returns 1,
 * so the trainer never blocks on it.  done returns 1 when the work has
 * retired, 0 while pending, -errno on failure (the release is sent anyway:
 * the batch is unusable either way).  free_event, when set, disposes event.
 */
struct pfc_release {
	uint64_t epoch;
	uint64_t seq;
	int32_t slot;
	void *event; /* owned through free_event */
	int (*done)(void *event);
	void (*free_event)(void *event);
	struct pfc_release *next;
};

#endif
