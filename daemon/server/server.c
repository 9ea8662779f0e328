/*
 * server.c — accepting connections, peer credentials, connection I/O, its
 * limits and the dispatch of decoded requests (see server.h); the listening
 * socket itself is listen.c's.
 *
 * DESIGN: loop thread only.  A connection is torn down in two steps:
 * conn_close() marks it closing and stops its poll handle; the uv_close
 * callback, on a later loop turn, detaches its session and frees it.  So a
 * session or connection pointer held further up the current call chain
 * stays valid until that chain returns, whatever failed underneath it.
 */
#include "server/server.h"

#include <errno.h>
#include <grp.h>
#include <inttypes.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/bigmem.h"
#include "server/closer.h"
#include "state/daemon.h"
#include "server/listen.h"
#include "base/log.h"
#include "prefetch.pb-c.h"
#include "sess/sess.h"
#include "sess/share.h"
#include "server/status.h"
#include "util.h"

static void conn_update_poll(struct conn *c);
static void flush_out(struct conn *c, size_t budget);

/* ---- credentials ---------------------------------------------------------- */

static bool in_list(const unsigned *list, size_t n, unsigned v)
{
	for (size_t i = 0; i < n; i++)
		if (list[i] == v)
			return true;
	return false;
}

/* allow_users / allow_groups: the peer's uid, its primary gid, or any of the
 * supplementary groups of its user (SO_PEERCRED carries only the primary
 * one, so those come from the group database). */
static bool peer_allowed(const struct config *cfg, uid_t uid, gid_t gid)
{
	struct passwd pw, *pwp = NULL;
	char buf[4096];
	gid_t groups[256];
	int ngroups = 256;

	if (cfg->allow_any || in_list(cfg->allow_uids, cfg->n_allow_uids, uid))
		return true;
	if (!cfg->n_allow_gids)
		return false;
	if (in_list(cfg->allow_gids, cfg->n_allow_gids, gid))
		return true;
	if (getpwuid_r(uid, &pw, buf, sizeof(buf), &pwp) != 0 || !pwp)
		return false;
	if (getgrouplist(pw.pw_name, pw.pw_gid, groups, &ngroups) < 0)
		ngroups = 256;
	for (int i = 0; i < ngroups; i++)
		if (in_list(cfg->allow_gids, cfg->n_allow_gids, groups[i]))
			return true;
	return false;
}

/* A connection the daemon will not serve (any more) gets its reason, then
 * the end.  The reason is its last words: queued even when its user's
 * memory quota is spent, since the connection goes anyway. */
static void refuse(struct conn *c, int code, const char *msg, const char *why)
{
	c->last_words = true;
	peer_error(&c->peer, 0, code, "%s", msg);
	flush_out(c, SIZE_MAX);
	conn_close(c, why);
}

/* ---- memory ---------------------------------------------------------------- */

/* A connection's buffers count against its uid's memory quota: what it
 * sent that is not yet a whole frame, and what waits to go to it.  A take
 * that does not fit closes the connection, saying which limit it hit. */
static int conn_take(struct conn *c, uint64_t n, const char *what)
{
	char err[300];
	int rc = quota_take(&c->d->quota, c->peer.uid, QUOTA_MEMORY, n, what, err, sizeof(err));

	if (rc) {
		refuse(c, rc, err, err);
		return rc;
	}
	c->mem_held += n;
	return 0;
}

static void conn_give(struct conn *c, uint64_t n)
{
	quota_give(&c->d->quota, c->peer.uid, QUOTA_MEMORY, n);
	c->mem_held -= n;
}

/* The receive buffer grew or shrank: its quota follows. */
static int rx_account(struct conn *c)
{
	uint64_t cap = c->rx.cap;

	if (cap > c->rx_held) {
		int rc = conn_take(c, cap - c->rx_held, "a frame being received");

		if (rc)
			return rc;
	} else if (cap < c->rx_held) {
		conn_give(c, c->rx_held - cap);
	}
	c->rx_held = cap;
	return 0;
}

/* ---- output ---------------------------------------------------------------- */

static void frame_free(struct out_frame *f)
{
	if (f->fd >= 0)
		close(f->fd);
	big_free(f->buf, f->cap);
	free(f);
}

/* The peer's send (peer.h): queues env, and pass_fd with its first byte.
 * A small frame without a descriptor goes after the last one queued, in
 * its buffer, when there is room. */
static int conn_send(void *conn, const Pf__Envelope *env, int pass_fd)
{
	struct conn *c = conn;
	struct out_frame *f, *t = c->out_tail;
	size_t len;
	int rc;

	if (c->closing) {
		rc = -EPIPE;
		goto fail;
	}
	len = wire_frame_size(env);
	if (!len) {
		rc = -EMSGSIZE;
		goto fail;
	}
	if (c->out_bytes + len > CONN_MAX_QUEUED) {
		rc = -ENOBUFS;
		conn_close(c, "peer does not read its replies (output queue full)");
		goto fail;
	}
	if (pass_fd < 0 && t && t->fd < 0 && t->cap - t->len >= len) {
		wire_encode_into(env, t->buf + t->len, len);
		t->len += len;
		c->out_bytes += len;
		conn_update_poll(c);
		return 0;
	}
	f = calloc(1, sizeof(*f));
	if (!f) {
		rc = -ENOMEM;
		goto fail;
	}
	/* A big frame (the BatchReady of a batch of millions) comes in huge
	 * pages: its first touch would otherwise hold the loop. */
	f->cap = pass_fd < 0 && len < CONN_OUT_CHUNK ? CONN_OUT_CHUNK : len;
	/* Counted as what it maps (big_size), as given back when sent. */
	if (!c->last_words && (rc = conn_take(c, big_size(f->cap), "a reply waiting to be sent"))) {
		free(f);
		goto fail;
	}
	f->buf = big_alloc(f->cap);
	if (!f->buf) {
		if (!c->last_words)
			conn_give(c, big_size(f->cap));
		free(f);
		rc = -ENOMEM;
		goto fail;
	}
	wire_encode_into(env, f->buf, len);
	f->len = len;
	f->fd = pass_fd;
	if (t)
		t->next = f;
	else
		c->out_head = f;
	c->out_tail = f;
	c->out_bytes += len;
	conn_update_poll(c);
	return 0;
fail:
	if (pass_fd >= 0)
		close(pass_fd);
	return rc;
}

/* What one connection may write per turn of the loop: a sendmsg of a
 * whole 32 MiB BatchReady to a peer that reads as fast as it comes held
 * the loop 110 ms in one call.  The rest goes at the next POLLOUT (libuv
 * polls level-triggered). */
#define CONN_WRITE_BUDGET (1u << 20)

/* Sends what is queued, budget bytes at most (SIZE_MAX: all the socket
 * takes, for the last words of a connection about to close). */
static void flush_out(struct conn *c, size_t budget)
{
	while (c->out_head && budget) {
		struct out_frame *f = c->out_head;
		size_t want = f->len - f->off < budget ? f->len - f->off : budget;
		long n = wire_send_some(c->fd, f->buf + f->off, want, f->off == 0 ? f->fd : -1);

		if (n == -EAGAIN)
			break;
		if (n < 0) {
			conn_close(c, strerror((int)-n));
			return;
		}
		if (f->fd >= 0) {
			close(f->fd);
			f->fd = -1;
		}
		f->off += (size_t)n;
		c->out_bytes -= (size_t)n;
		budget -= (size_t)n;
		if (f->off < f->len)
			break;
		c->out_head = f->next;
		if (!c->out_head)
			c->out_tail = NULL;
		if (!c->last_words)
			conn_give(c, big_size(f->cap));
		frame_free(f);
	}
	conn_update_poll(c);
	if (c->drain_kick && c->out_bytes <= CONN_LOW_WATER && !c->closing) {
		c->drain_kick = false;
		if (c->sess)
			sess_kick(c->sess);
		if (c->member)
			share_kick(c->member);
	}
}

/* The peer's busy (peer.h): batches wait while the queue is above the high
 * water; flush_out kicks the session once it is down to the low. */
static bool conn_busy(void *conn)
{
	struct conn *c = conn;

	if (c->out_bytes < CONN_HIGH_WATER)
		return false;
	c->drain_kick = true;
	return true;
}

/* ---- requests -------------------------------------------------------------- */

static int on_hello(struct conn *c, uint64_t id, const Pf__Hello *req)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__HelloReply msg = PF__HELLO_REPLY__INIT;

	if (req->version != WIRE_VERSION) {
		peer_error(&c->peer, id, -EPROTONOSUPPORT,
			   "protocol version %u is not supported (this daemon speaks %u)",
			   req->version, WIRE_VERSION);
		return -EPROTONOSUPPORT;
	}
	if (req->client[0]) {
		char who[48];

		snprintf(who, sizeof(who), "%.47s", req->client);
		util_printable(who); /* it goes into log lines and status */
		snprintf(c->peer.name, sizeof(c->peer.name), "%s (pid %d uid %u)", who,
			 (int)c->peer.pid, (unsigned)c->peer.uid);
	}
	c->hello_done = true;
	msg.version = WIRE_VERSION;
	msg.daemon = "prefetchd " PF_VERSION;
	msg.max_frame = (uint32_t)c->d->cfg.max_frame;
	env.id = id;
	env.msg_case = PF__ENVELOPE__MSG_HELLO_REPLY;
	env.hello_reply = &msg;
	return conn_send(c, &env, -1);
}

/* A share's member's requests (share.h). */
static int member_dispatch(struct conn *c, Pf__Envelope *env)
{
	uint64_t id = env->id;

	switch (env->msg_case) {
	case PF__ENVELOPE__MSG_START: return share_start_epoch(c->member, id, env->start);
	case PF__ENVELOPE__MSG_ACK: share_ack(c->member, env->ack); return 0;
	case PF__ENVELOPE__MSG_RELEASE: share_release(c->member, env->release); return 0;
	case PF__ENVELOPE__MSG_ABANDON: return share_abandon(c->member, id, env->abandon);
	case PF__ENVELOPE__MSG_PROBE: share_probe(c->member, env->probe); return 0;
	case PF__ENVELOPE__MSG_LOAD:
		return peer_error(
			&c->peer, id, -EINVAL,
			"paced epochs cannot be shared: open the session without a share");
	default:
		return peer_error(&c->peer, id, -EPROTO, "unexpected message %s from a client",
				  wire_msg_name(env->msg_case));
	}
}

/* Returns < 0 when the connection must close. */
static int dispatch(struct conn *c, Pf__Envelope *env)
{
	uint64_t id = env->id;

	if (!c->hello_done) {
		if (env->msg_case != PF__ENVELOPE__MSG_HELLO) {
			peer_error(&c->peer, id, -EPROTO, "the first message must be hello, not %s",
				   wire_msg_name(env->msg_case));
			return -EPROTO;
		}
		return on_hello(c, id, env->hello);
	}
	switch (env->msg_case) {
	case PF__ENVELOPE__MSG_STATUS: return status_reply(c->d, &c->peer, id);
	case PF__ENVELOPE__MSG_SET_DEPTH:
		return status_set_depth(c->d, &c->peer, c->member ? share_sess(c->member) : c->sess,
					id, env->set_depth);
	case PF__ENVELOPE__MSG_POOL: return status_pool_control(c->d, &c->peer, id, env->pool);
	case PF__ENVELOPE__MSG_OPEN:
		if (c->member || (c->sess && env->open->share[0]))
			return peer_error(&c->peer, id, -EBUSY,
					  "this connection already has session %" PRIu64
					  "; open another connection for another session",
					  c->sess ? c->sess->id : share_sess(c->member)->id);
		if (env->open->share[0])
			return share_open(c->d, &c->peer, &c->member, id, env->open);
		return sess_open(c->d, &c->peer, &c->sess, id, env->open);
	default: break;
	}
	if (c->member)
		return member_dispatch(c, env);
	if (!c->sess)
		return peer_error(&c->peer, id, -ENOTCONN, "%s needs an open session",
				  wire_msg_name(env->msg_case));
	switch (env->msg_case) {
	case PF__ENVELOPE__MSG_START: return sess_start_epoch(c->sess, id, env->start);
	case PF__ENVELOPE__MSG_ACK: sess_ack(c->sess, env->ack); return 0;
	case PF__ENVELOPE__MSG_RELEASE: sess_release(c->sess, env->release); return 0;
	case PF__ENVELOPE__MSG_ABANDON: return sess_abandon(c->sess, id, env->abandon);
	case PF__ENVELOPE__MSG_PROBE: sess_probe(c->sess, env->probe); return 0;
	case PF__ENVELOPE__MSG_LOAD: return sess_load(c->sess, id, env->load);
	default:
		return peer_error(&c->peer, id, -EPROTO, "unexpected message %s from a client",
				  wire_msg_name(env->msg_case));
	}
}

/* What one connection may have read and dispatched per turn of the loop:
 * a client that sends faster than its requests are handled gets its turn
 * again after everyone else's, instead of holding the loop for its whole
 * backlog.  Bytes bound the reading (libuv polls level-triggered: the rest
 * waits in the socket), frames the dispatching (a flood of tiny bad
 * requests costs per frame: 2.6 MB of them held the loop 0.9 s); frames
 * left in the buffer are dispatched from an idle handle in the next turn. */
#define CONN_READ_BUDGET  (1u << 20)
#define CONN_FRAME_BUDGET 512u

static void on_readable(struct conn *c);

static void on_conn_idle(uv_idle_t *h)
{
	struct daemon *d = h->data;
	bool more = false;

	for (struct conn *c = d->conns, *next; c; c = next) {
		next = c->next;
		if (c->rx_later && !c->closing)
			on_readable(c);
	}
	for (struct conn *c = d->conns; c && !more; c = c->next)
		more = c->rx_later && !c->closing;
	if (!more)
		uv_idle_stop(h);
}

static void rx_later(struct conn *c)
{
	struct daemon *d = c->d;

	c->rx_later = true;
	if (!d->conn_idle_live) {
		uv_idle_init(d->loop, &d->conn_idle);
		d->conn_idle.data = d;
		d->conn_idle_live = true;
	}
	uv_idle_start(&d->conn_idle, on_conn_idle);
}

/* Dispatches the whole frames in c's buffer, *frames at most: 0 when none
 * is left, 1 when the budget ran out first, -1 when c is closing. */
static int dispatch_buffered(struct conn *c, unsigned *frames)
{
	Pf__Envelope *env;
	int rc;

	while (!c->closing) {
		char why[96];

		if (!*frames)
			return 1;
		rc = wire_rx_next(&c->rx, &env);
		if (rc == 0)
			return 0;
		if (rc == -EMSGSIZE) {
			snprintf(why, sizeof(why),
				 "oversized frame (announced length over max_frame %" PRIu64 ")",
				 c->d->cfg.max_frame);
			conn_close(c, why);
			return -1;
		}
		if (rc < 0) {
			conn_close(c, "malformed frame (does not decode as a request)");
			return -1;
		}
		(*frames)--;
		rc = dispatch(c, env);
		pf__envelope__free_unpacked(env, NULL);
		/* Replies went out; protocol violations end the connection
		 * once they are flushed. */
		if (rc < 0 && !c->closing && (rc == -EPROTO || rc == -EPROTONOSUPPORT)) {
			flush_out(c, SIZE_MAX);
			conn_close(c, "protocol violation");
		}
	}
	return -1;
}

static void on_readable(struct conn *c)
{
	size_t budget = CONN_READ_BUDGET;
	unsigned frames = CONN_FRAME_BUDGET;

	c->rx_later = false;
	for (;;) {
		int rc = dispatch_buffered(c, &frames);
		long n;

		if (rc < 0)
			return;
		if (rc > 0) {
			rx_later(c);
			return;
		}
		/* A frame begun and not whole is timed (frame_timeout). */
		if (!c->rx.len)
			c->frame_since_ns = 0;
		else if (!c->frame_since_ns)
			c->frame_since_ns = c->last_rx_ns;
		if (rx_account(c) || !budget)
			return;
		n = wire_rx_fill(&c->rx, c->fd);
		if (n == -EAGAIN)
			return;
		if (n == 0) {
			conn_close(c, NULL);
			return;
		}
		if (n < 0) {
			/* Its descriptors went to the closer already (wire_rx's
			 * fd_sink): none is held, none closed here. */
			conn_close(c, n == -EMFILE || n == -EPROTO ? "peer sent descriptors"
								   : strerror((int)-n));
			return;
		}
		c->last_rx_ns = now_ns();
		budget = (size_t)n < budget ? budget - (size_t)n : 0;
		if (rx_account(c))
			return;
	}
}

static void on_poll(uv_poll_t *h, int status, int events)
{
	struct conn *c = h->data;

	if (c->closing)
		return;
	if (status < 0) {
		int err = 0;
		socklen_t len = sizeof(err);

		/* libuv reports EPOLLERR as UV_EBADF; the socket's own error
		 * says what happened.  A peer that died with replies still
		 * unread (a killed trainer) resets the connection: an ordinary
		 * disconnect, not a fault. */
		if (status == UV_EBADF &&
		    getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 &&
		    (err == 0 || err == ECONNRESET || err == EPIPE)) {
			conn_close(c, NULL);
			return;
		}
		conn_close(c, err ? strerror(err) : uv_strerror(status));
		return;
	}
	if (events & UV_WRITABLE)
		flush_out(c, CONN_WRITE_BUDGET);
	if (!c->closing && (events & (UV_READABLE | UV_DISCONNECT)))
		on_readable(c);
}

static void conn_update_poll(struct conn *c)
{
	int want = UV_READABLE | UV_DISCONNECT | (c->out_head ? UV_WRITABLE : 0);

	if (c->closing || want == c->poll_events)
		return;
	c->poll_events = want;
	uv_poll_start(&c->poll, want, on_poll);
}

static void conn_free(uv_handle_t *h)
{
	struct conn *c = h->data;
	struct daemon *d = c->d;

	if (c->sess)
		sess_detach(c->sess);
	if (c->member)
		share_leave(c->member);
	while (c->out_head) {
		struct out_frame *f = c->out_head;

		c->out_head = f->next;
		frame_free(f);
	}
	wire_rx_free(&c->rx);
	close(c->fd);
	if (c->mem_held)
		conn_give(c, c->mem_held);
	if (c->counted)
		quota_give(&d->quota, c->peer.uid, QUOTA_CONNS, 1);
	if (c->prev)
		c->prev->next = c->next;
	else
		d->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	d->nconns--;
	free(c);
}

void conn_close(struct conn *c, const char *why)
{
	if (c->closing)
		return;
	c->closing = true;
	if (why)
		log_warn("closing connection of %s: %s", c->peer.name, why);
	else
		log_debug("%s disconnected", c->peer.name);
	/* Stop reading now: the descriptor is closed in conn_free, after the
	 * session has let go of everything it shared through it. */
	uv_poll_stop(&c->poll);
	shutdown(c->fd, SHUT_RDWR);
	uv_close((uv_handle_t *)&c->poll, conn_free);
}

/* ---- accept ---------------------------------------------------------------- */

static void on_accept(uv_poll_t *h, int status, int events);

static void accept_again(uv_timer_t *t)
{
	struct daemon *d = t->data;

	if (!d->stopping && d->listen_fd >= 0)
		uv_poll_start(&d->listen_poll, UV_READABLE, on_accept);
}

/* accept() failed for want of descriptors (ours or the system's): the
 * listener is readable all the while, so it is not polled for a pause, or
 * the loop would spin on it.  The pause doubles to ACCEPT_PAUSE_MAX_MS
 * while the shortage lasts; one line a pause says so. */
#define ACCEPT_PAUSE_MS	    50
#define ACCEPT_PAUSE_MAX_MS 2000

static void pause_accepting(struct daemon *d, int err)
{
	if (!d->accept_timer_live) {
		uv_timer_init(d->loop, &d->accept_timer);
		d->accept_timer.data = d;
		d->accept_timer_live = true;
	}
	d->accept_pause_ms = d->accept_pause_ms ? d->accept_pause_ms * 2 : ACCEPT_PAUSE_MS;
	if (d->accept_pause_ms > ACCEPT_PAUSE_MAX_MS)
		d->accept_pause_ms = ACCEPT_PAUSE_MAX_MS;
	log_warn("accept: %s; not accepting for %u ms (%u connection(s) open)", strerror(err),
		 d->accept_pause_ms, d->nconns);
	uv_poll_stop(&d->listen_poll);
	uv_timer_start(&d->accept_timer, accept_again, d->accept_pause_ms, 0);
}

static void on_accept(uv_poll_t *h, int status, int events)
{
	struct daemon *d = h->data;

	for (;;) {
		struct ucred cred;
		socklen_t len = sizeof(cred);
		struct conn *c;
		char why[300];
		int fd = accept4(d->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (fd < 0) {
			if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
			    errno == ENOMEM)
				pause_accepting(d, errno);
			else if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
				log_warn("accept: %s", strerror(errno));
			return;
		}
		d->accept_pause_ms = 0;
		c = calloc(1, sizeof(*c));
		if (!c || getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
			log_err("cannot take a connection: %s",
				c ? strerror(errno) : "out of memory");
			free(c);
			close(fd);
			continue;
		}
		c->d = d;
		c->fd = fd;
		c->peer.conn = c;
		c->peer.send = conn_send;
		c->peer.busy = conn_busy;
		c->peer.limit = &c->log_limit;
		c->last_rx_ns = now_ns();
		c->peer.uid = cred.uid;
		c->peer.gid = cred.gid;
		c->peer.pid = cred.pid;
		snprintf(c->peer.name, sizeof(c->peer.name), "pid %d uid %u", (int)cred.pid,
			 (unsigned)cred.uid);
		wire_rx_init(&c->rx, d->cfg.max_frame);
		c->rx.fd_sink = closer_close; /* the daemon takes none (closer.h) */
		uv_poll_init(d->loop, &c->poll, fd);
		c->poll.data = c;
		c->next = d->conns;
		if (d->conns)
			d->conns->prev = c;
		d->conns = c;
		d->nconns++;
		if (!peer_allowed(&d->cfg, cred.uid, cred.gid)) {
			char msg[160];

			snprintf(why, sizeof(why),
				 "peer refused: uid %u gid %u is not in allow_users/allow_groups",
				 (unsigned)cred.uid, (unsigned)cred.gid);
			snprintf(msg, sizeof(msg),
				 "uid %u gid %u is not allowed by this daemon's "
				 "allow_users/allow_groups",
				 (unsigned)cred.uid, (unsigned)cred.gid);
			refuse(c, -EACCES, msg, why);
			continue;
		}
		if (quota_take(&d->quota, cred.uid, QUOTA_CONNS, 1, "a new connection", why,
			       sizeof(why))) {
			refuse(c, -EMFILE, why, why);
			continue;
		}
		c->counted = true;
		conn_update_poll(c);
		log_debug("connection from %s", c->peer.name);
	}
}

int server_listen(struct daemon *d)
{
	int rc;

	d->listen_fd = listen_open(&d->cfg, &d->socket_activated);
	if (d->listen_fd < 0)
		return d->listen_fd;
	rc = uv_poll_init(d->loop, &d->listen_poll, d->listen_fd);
	if (rc)
		return rc;
	d->listen_poll.data = d;
	return uv_poll_start(&d->listen_poll, UV_READABLE, on_accept);
}

void server_tick(struct daemon *d)
{
	uint64_t now = now_ns();

	for (struct conn *c = d->conns; c; c = c->next) {
		char why[160];

		if (c->closing)
			continue;
		if (c->frame_since_ns && now - c->frame_since_ns > d->cfg.frame_timeout * 1e9) {
			snprintf(why, sizeof(why),
				 "a frame begun %.0f s ago is still not whole (frame_timeout = %g "
				 "s)",
				 (now - c->frame_since_ns) / 1e9, d->cfg.frame_timeout);
			refuse(c, -ETIMEDOUT, why, why);
		} else if (!c->sess && !c->member &&
			   now - c->last_rx_ns > d->cfg.idle_timeout * 1e9) {
			snprintf(why, sizeof(why),
				 "idle for %.0f s with no session (idle_timeout = %g s)",
				 (now - c->last_rx_ns) / 1e9, d->cfg.idle_timeout);
			refuse(c, -ETIMEDOUT, why, why);
		}
	}
}

void server_stop(struct daemon *d)
{
	sess_pump_stop(d);
	if (d->conn_idle_live) {
		uv_idle_stop(&d->conn_idle);
		uv_close((uv_handle_t *)&d->conn_idle, NULL);
		d->conn_idle_live = false;
	}
	if (d->accept_timer_live) {
		uv_timer_stop(&d->accept_timer);
		uv_close((uv_handle_t *)&d->accept_timer, NULL);
		d->accept_timer_live = false;
	}
	if (d->listen_fd >= 0) {
		uv_poll_stop(&d->listen_poll);
		uv_close((uv_handle_t *)&d->listen_poll, NULL);
		close(d->listen_fd);
		if (!d->socket_activated)
			listen_unlink(d->cfg.socket_path);
		d->listen_fd = -1;
	}
	for (struct conn *c = d->conns; c; c = c->next)
		conn_close(c, NULL);
}
