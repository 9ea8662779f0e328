/*
 * reconnect.c — libprefetch's session across daemon restarts: noticing an
 * outage, letting go of the broken connection's state, and connecting
 * again with back-off until reconnect_s runs out.
 *
 * A daemon that goes away is seen as EOF on the socket the moment the
 * kernel closes it, in whatever wait the caller is.  With reconnect_s the
 * session outlives its connection (prefetch.h, "Daemon restart"): the
 * connection's state (receive buffer, queue, pending releases, arenas, slot
 * marks) is dropped at once, but the arenas of batches the trainer still
 * holds are kept mapped in a retired generation (struct pfc_retired) until
 * the last of them is released; then the next call that needs the daemon
 * connects again with back-off, re-opens the session and restarts the
 * epoch at the first batch not taken, under the same epoch number.  Every
 * batch carries the generation of the connection it came on, so a release
 * never crosses from an old connection to a new one.
 *
 * DESIGN: no threads, no locks.  Runs inside whichever public call found
 * the connection broken, on the thread that owns the struct pf_client
 * (prefetch.h: one at a time).  The retired generations belong to the
 * client; each is freed by the release of its last held batch, or by
 * pf_close.  Waiting between tries is a plain sleep: nothing else here
 * needs the thread meanwhile.
 */
#include "client_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* ---- reconnecting ----------------------------------------------------------------- */

/* Back-off between tries: the first at once, then 50 ms doubling to 1 s.
 * A daemon that comes back is found within a second of listening again,
 * and a node without one costs a try a second. */
#define RECONNECT_FIRST_MS 50
#define RECONNECT_MAX_MS   1000

/* Whether a broken connection is to be brought back (or already is being):
 * the trainer asked for it, there is a socket path and a session to
 * re-open, and neither reconnect_s nor a refusal has ended it. */
bool pfc_reconnecting(const struct pf_client *c)
{
	return c->open_opts.reconnect_s > 0 && c->path && c->opened && !c->given_up;
}

/* A held batch of a broken connection is gone: the last one unmaps its
 * generation's arenas. */
void pfc_retired_put(struct pf_client *c, uint64_t gen)
{
	for (struct pfc_retired **pp = &c->retired; *pp; pp = &(*pp)->next) {
		struct pfc_retired *r = *pp;

		if (r->gen != gen)
			continue;
		if (--r->users == 0) {
			*pp = r->next;
			pfc_unmap_arenas(c, r->arenas, r->narenas);
			free(r);
		}
		return;
	}
}

/* Drops what belongs to the current connection only: the queue (never
 * taken, so fetched again), pending releases (their slots die with the
 * daemon; the unmapping of their arenas waits for the device instead) and
 * the arenas, which are kept while the trainer holds batches in them. */
static void drop_connection(struct pf_client *c)
{
	struct pfc_retired *r;
	uint32_t users = 0;

	pfc_release_queue(c);
	/* The lanes' releases of this connection settle unsent (their gen
	 * is no longer the client's); a client copy's buffer still comes
	 * back once the trainer's work on it has run. */
	pfc_settle_forget(c);
	pfc_unmap_slabs(c);
	c->out_len = 0; /* frames corked for the connection that broke */
	for (struct pfc_batch *b = c->held; b; b = b->next)
		users += b->gen == c->gen;
	if (c->narenas && users) {
		r = calloc(1, sizeof(*r));
		/* Without memory to track them the arenas stay mapped until the
		 * process ends: a leak, where unmapping them would fault the
		 * trainer. */
		if (r) {
			r->gen = c->gen;
			r->arenas = c->arenas;
			r->narenas = c->narenas;
			r->users = users;
			r->next = c->retired;
			c->retired = r;
		}
	} else {
		pfc_unmap_arenas(c, c->arenas, c->narenas);
	}
	c->arenas = NULL;
	c->narenas = 0;
	pthread_mutex_lock(&c->send_lock);
	if (c->slot_mine)
		memset(c->slot_mine, 0, c->slots ? c->slots : 1);
	c->gen++;
	pthread_mutex_unlock(&c->send_lock);
}

/* The connection has just been found broken: a reconnecting client
 * starts counting reconnect_s and lets go of the connection's state. */
void pfc_note_outage(struct pf_client *c)
{
	if (!c->dead || c->down || !pfc_reconnecting(c))
		return;
	c->down = true;
	c->outage_rc = c->dead;
	snprintf(c->outage_msg, sizeof(c->outage_msg), "%s", c->dead_msg);
	c->down_since_ns = c->next_try_ns = mono();
	c->backoff_ms = 0;
	c->tries = 0;
	snprintf(c->try_msg, sizeof(c->try_msg), "none yet");
	/* An epoch whose end came and whose batches were all taken is over;
	 * any other live epoch starts again at resume_seq.  Not live until
	 * then: nothing can arrive for it in between anyway. */
	c->resume_pending = c->epoch_live && (c->queue.head || !c->epoch_ended);
	if (c->resume_pending)
		c->epoch_live = false;
	drop_connection(c);
}

/* A session opened again after a restart.  The trainer has read the shape
 * and the epoch goes on with the same picks, so the dataset must be the
 * same; slots, offsets and the session id may differ. */
static int refresh_session(struct pf_client *c, const Pf__SessionOpened *so)
{
	bool same = so->num_samples == c->num_samples && so->n_fields == c->nfields;
	char *device;
	uint8_t *marks;

	for (size_t f = 0; same && f < so->n_fields; f++) {
		const Pf__Field *in = so->fields[f];
		const struct pfc_field *had = &c->fields[f];

		same = !strcmp(in->name ? in->name : "", had->name) &&
		       !strcmp(in->dtype ? in->dtype : "", had->dtype) &&
		       in->n_shape == (size_t)had->ndim &&
		       (!had->ndim ||
			!memcmp(in->shape, had->shape, had->ndim * sizeof(uint64_t))) &&
		       in->sample_bytes == had->sample_bytes;
	}
	if (!same)
		return pfc_set_err(c, -ESTALE,
				   "%s now serves dataset %s with another shape (%" PRIu64
				   " samples, %zu fields; the session had %" PRIu64 " and %" PRIu32
				   "): its epoch cannot go on",
				   c->where, c->open_opts.dataset, so->num_samples, so->n_fields,
				   c->num_samples, c->nfields);
	if (so->slots > PFC_MAX_SLOTS)
		return pfc_conn_fail(c, -EPROTO,
				     "session with %" PRIu32 " slots is over this client's %u",
				     so->slots, PFC_MAX_SLOTS);
	marks = calloc(so->slots ? so->slots : 1, 1);
	device = strdup(so->device && *so->device ? so->device : "host");
	if (!marks || !device) {
		free(marks);
		free(device);
		return pfc_conn_fail(c, -ENOMEM, "out of memory");
	}
	pthread_mutex_lock(&c->send_lock);
	free(c->slot_mine);
	c->slot_mine = marks;
	pthread_mutex_unlock(&c->send_lock);
	free(c->device);
	c->device = device;
	for (size_t f = 0; f < so->n_fields; f++)
		c->fields[f].offset = so->fields[f]->offset;
	c->session = so->session;
	c->slot_bytes = so->slot_bytes;
	c->slots = so->slots;
	c->probe_interval_s = so->probe_interval_s;
	if (so->client_copy && !c->gather)
		return pfc_conn_fail(c, -EPROTO,
				     "%s sent host arenas to copy to a client that "
				     "cannot",
				     c->where);
	c->ccopy = so->client_copy;
	return pfc_keep_pool(c, so);
}

/* One try: a new socket, hello, the session opened again with pf_open's
 * options, its depth if the trainer set one, and the interrupted epoch
 * started again.  0; or -errno, with *final when trying again cannot help
 * (the daemon refused, or now serves another shape). */
static int reconnect_once(struct pf_client *c, int64_t giveup, bool *final)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int sock, rc, left;

	*final = false;
	/* pf_connect checked that the path fits. */
	memcpy(sa.sun_path, c->path, strlen(c->path) + 1);
	sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (sock < 0)
		return pfc_set_err(c, -errno, "cannot create a socket: %s", strerror(errno));
	while (connect(sock, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		rc = -errno;
		if (rc == -EINTR)
			continue;
		close(sock);
		/* ENOENT and ECONNREFUSED while the daemon is down; EAGAIN
		 * while its backlog is full; even EACCES for a moment between
		 * its bind and its chmod.  All worth another try. */
		return pfc_set_err(c, rc, "cannot connect to %s: %s", c->path, strerror(-rc));
	}
	/* A fresh connection: what the broken one left unread goes with it. */
	wire_rx_free(&c->rx);
	wire_rx_init(&c->rx, PFC_MAX_RX_FRAME);
	c->rx.fill_bytes = PFC_RX_FILL;
	pthread_mutex_lock(&c->send_lock);
	c->sock = sock;
	c->dead = 0;
	pthread_mutex_unlock(&c->send_lock);
	c->dead_msg[0] = '\0';
	c->greeted = false;
	c->pending_err = 0;
	c->max_frame = WIRE_MAX_FRAME_DEFAULT;
	left = pfc_ms_left(giveup);
	rc = pfc_hello(c, left < 1 ? 1 : left < PFC_HELLO_TIMEOUT_MS ? left : PFC_HELLO_TIMEOUT_MS);
	if (!rc) {
		Pf__Envelope *reply;

		rc = pfc_send_open(c, &reply);
		if (!rc) {
			rc = refresh_session(c, reply->opened);
			pf__envelope__free_unpacked(reply, NULL);
		}
	}
	if (!rc && c->own_target_set) {
		Pf__Envelope env = PF__ENVELOPE__INIT;
		Pf__SetDepth msg = PF__SET_DEPTH__INIT;

		msg.target = c->own_target;
		msg.automatic = c->own_target == 0;
		env.msg_case = PF__ENVELOPE__MSG_SET_DEPTH;
		env.set_depth = &msg;
		rc = pfc_call(c, &env, PF__ENVELOPE__MSG_OK, NULL);
	}
	if (!rc && c->resume_pending && c->epoch_order == PF_ORDER_PACED) {
		/* The requests not yet delivered lived in the old daemon. */
		c->resume_pending = false;
		c->refused = true;
		rc = pfc_set_err(c, -ECONNRESET,
				 "prefetchd at %s restarted: a paced epoch's requests went with it "
				 "(start a new epoch)",
				 c->path);
	}
	if (!rc && c->resume_pending) {
		rc = pfc_send_start(c, c->resume_seq, c->epoch_indices, c->epoch_nindices, NULL);
		if (!rc)
			c->resume_pending = false;
	}
	if (!rc) {
		/* The new daemon knows nothing of this trainer's memory yet; the
		 * trainer is past its first step, so the figure is honest now.
		 * Best effort, as every probe. */
		if (c->cuda)
			pfc_send_probe(c);
		return 0;
	}
	/* The daemon's own refusal, a dataset of another shape or another
	 * protocol will be the same next time; a connection that broke or
	 * timed out may not. */
	*final = c->refused ||
		 !(rc == -ECONNRESET || rc == -EPIPE || rc == -ETIMEDOUT || rc == -ENOMEM);
	if (!c->dead)
		pfc_conn_fail(c, rc, "%s", c->err);
	drop_connection(c);
	return rc;
}

static void sleep_until(int64_t t)
{
	int64_t left = t - mono();
	struct timespec ts;

	if (left <= 0)
		return;
	ts.tv_sec = left / 1000000000;
	ts.tv_nsec = left % 1000000000;
	nanosleep(&ts, NULL); /* EINTR: the caller's loop looks at the clock again */
}

/* reconnect_s has run out, or the daemon refused: the error is final. */
static int give_up(struct pf_client *c, bool refused)
{
	char msg[PFC_ERRMSG_LEN];
	int rc = refused && c->dead ? c->dead : c->outage_rc;

	if (refused)
		snprintf(msg, sizeof(msg),
			 "%.200s; the daemon there now refuses the session: %.250s", c->outage_msg,
			 c->try_msg);
	else
		snprintf(msg, sizeof(msg),
			 "%.200s; no daemon took the session back within %g s (%u tries, the "
			 "last: %.200s)",
			 c->outage_msg, c->open_opts.reconnect_s, c->tries, c->try_msg);
	c->given_up = true;
	c->dead = rc;
	snprintf(c->dead_msg, sizeof(c->dead_msg), "%s", msg);
	snprintf(c->err, sizeof(c->err), "%s", msg);
	return rc;
}

/*
 * Brings a broken connection back, trying until deadline (-1: none) at the
 * latest; 0 once the session is open again (and its epoch restarted).  A
 * client that does not reconnect gets the connection's error; one whose
 * deadline comes first gets -ETIMEDOUT and stays down, to go on with the
 * next call, until reconnect_s has passed since the connection broke.
 */
int pfc_revive(struct pf_client *c, int64_t deadline)
{
	int64_t giveup;

	if (!c->dead)
		return 0;
	if (!pfc_reconnecting(c))
		return pfc_fail_dead(c);
	pfc_note_outage(c);
	giveup = c->down_since_ns + (int64_t)(c->open_opts.reconnect_s * 1e9);
	for (;;) {
		int64_t now = mono(), wake;
		bool final;
		int rc;

		if (now >= giveup)
			return give_up(c, false);
		if (now >= c->next_try_ns) {
			rc = reconnect_once(c, giveup, &final);
			if (!rc) {
				c->down = false;
				c->reconnects++;
				return 0;
			}
			c->tries++;
			snprintf(c->try_msg, sizeof(c->try_msg), "%s", c->err);
			if (final)
				return give_up(c, true);
			c->backoff_ms = c->backoff_ms ? c->backoff_ms * 2 : RECONNECT_FIRST_MS;
			if (c->backoff_ms > RECONNECT_MAX_MS)
				c->backoff_ms = RECONNECT_MAX_MS;
			c->next_try_ns = mono() + (int64_t)c->backoff_ms * 1000000;
			continue;
		}
		wake = c->next_try_ns < giveup ? c->next_try_ns : giveup;
		if (deadline >= 0 && deadline < wake) {
			sleep_until(deadline);
			return pfc_set_err(c, -ETIMEDOUT,
					   "%.200s; reconnecting for %.1f s (%u tries, the last: "
					   "%.200s)",
					   c->outage_msg, (mono() - c->down_since_ns) / 1e9,
					   c->tries, c->try_msg);
		}
		sleep_until(wake);
	}
}
