/*
 * call.c — libprefetch's requests: sending one and waiting for the reply
 * that echoes its id, hello, connecting over a socket handed in, and the
 * two requests of a session that a reconnection sends again: OpenSession
 * with pf_open's kept options and StartEpoch for the epoch on record.
 * Those two are here, below reconnect.c and the public API that both send
 * them, so that neither has to call the other.
 *
 * Pushes (Arena, BatchReady, EpochEnd, unsolicited Error) may arrive
 * between a request and its reply, so the call that is reading hands them
 * to batch.c (pfc_handle_push): arenas are mapped when they arrive,
 * batches of the current epoch are queued for pf_next, and batches of any
 * other epoch are released at once and never reach the trainer.  That is
 * why the call sits above the batch code and not with the frames of
 * conn.c.  A reply of the wrong kind breaks the connection; the daemon's
 * Error is the call's error and leaves the connection usable.
 *
 * DESIGN: the thread that owns the struct pf_client, one call at a time
 * (prefetch.h); request ids are the client's (last_id) and only grow, so
 * the late reply to a request that timed out is known and dropped.
 */
#include "client_int.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- requests ------------------------------------------------------------ */

static int call_within(struct pf_client *c, Pf__Envelope *req, int reply_case, Pf__Envelope **reply,
		       int timeout_ms)
{
	int64_t deadline = pfc_deadline_after(timeout_ms);
	uint64_t id;
	int rc;

	if (reply)
		*reply = NULL;
	c->refused = false;
	if (c->dead)
		return pfc_fail_dead(c);
	id = ++c->last_id;
	req->id = id;
	rc = pfc_send_env(c, req, deadline);
	if (rc)
		return rc;
	for (;;) {
		Pf__Envelope *env;

		rc = pfc_read_env(c, deadline, &env);
		if (rc == -ETIMEDOUT)
			return pfc_set_err(c, rc, "%s did not answer %s within %d ms", c->where,
					   wire_msg_name(req->msg_case), timeout_ms);
		if (rc)
			return rc;
		if (env->id == 0) {
			rc = pfc_handle_push(c, env);
			if (rc)
				return rc;
			continue;
		}
		if (env->id != id) {
			/* The reply to an earlier request that timed out. */
			pf__envelope__free_unpacked(env, NULL);
			continue;
		}
		if (env->msg_case == PF__ENVELOPE__MSG_ERROR) {
			rc = pfc_sane_code(env->error->code);
			c->refused = true;
			pfc_set_err(c, rc, "%s",
				    env->error->message && *env->error->message
					    ? env->error->message
					    : strerror(-rc));
			pf__envelope__free_unpacked(env, NULL);
			return rc;
		}
		if ((int)env->msg_case != reply_case) {
			rc = pfc_conn_fail(c, -EPROTO, "%s answered %s with %s", c->where,
					   wire_msg_name(req->msg_case),
					   wire_msg_name(env->msg_case));
			pf__envelope__free_unpacked(env, NULL);
			return rc;
		}
		if (reply)
			*reply = env;
		else
			pf__envelope__free_unpacked(env, NULL);
		return 0;
	}
}

int pfc_call(struct pf_client *c, Pf__Envelope *req, int reply_case, Pf__Envelope **reply)
{
	return call_within(c, req, reply_case, reply, c->timeout_ms);
}

const char *pfc_daemon_version(const struct pf_client *c)
{
	return c->daemon;
}

uint32_t pfc_daemon_max_frame(const struct pf_client *c)
{
	return c->max_frame;
}

/* ---- connecting ---------------------------------------------------------- */

int pfc_hello(struct pf_client *c, int timeout_ms)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__Hello msg = PF__HELLO__INIT;
	Pf__Envelope *reply;
	Pf__HelloReply *hr;
	int rc;

	msg.version = WIRE_VERSION;
	msg.client = c->hello_name;
	env.msg_case = PF__ENVELOPE__MSG_HELLO;
	env.hello = &msg;
	rc = call_within(c, &env, PF__ENVELOPE__MSG_HELLO_REPLY, &reply, timeout_ms);
	if (rc == -ETIMEDOUT)
		return pfc_conn_fail(c, rc, "%s did not answer hello within %g s", c->where,
				     timeout_ms / 1000.0);
	if (rc)
		return pfc_conn_fail(c, rc, "%s", c->err);
	hr = reply->hello_reply;
	if (hr->version != WIRE_VERSION) {
		rc = pfc_conn_fail(c, -EPROTO,
				   "%s speaks protocol version %" PRIu32 "; this library speaks %d",
				   c->where, hr->version, WIRE_VERSION);
		goto out;
	}
	snprintf(c->daemon, sizeof(c->daemon), "%s", hr->daemon ? hr->daemon : "");
	c->greeted = true;
	if (hr->max_frame >= 64)
		c->max_frame = hr->max_frame;
out:
	pf__envelope__free_unpacked(reply, NULL);
	return rc;
}

static int set_nonblocking(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -errno;
	return 0;
}

int pfc_connect_fd(int sock, const char *where, int hello_timeout_ms, struct pf_client **out)
{
	struct pf_client *c = pfc_client_new(where ? where : "prefetchd");
	int rc;

	*out = c;
	if (!c) {
		close(sock);
		return -ENOMEM;
	}
	c->sock = sock;
	rc = set_nonblocking(sock);
	if (rc)
		return pfc_conn_fail(c, rc, "cannot set up the socket: %s", strerror(-rc));
	return pfc_hello(c, hello_timeout_ms);
}

/* ---- the session's requests ---------------------------------------------- */

/* $name is "0": the trainer turned that off. */
bool pfc_env_says_no(const char *name)
{
	const char *v = getenv(name);

	return v && strcmp(v, "0") == 0;
}

/* OpenSession with the kept options. */
int pfc_send_open(struct pf_client *c, Pf__Envelope **reply)
{
	const struct pf_open_opts *o = &c->open_opts;
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__OpenSession msg = PF__OPEN_SESSION__INIT;

	msg.dataset = (char *)o->dataset;
	msg.device = (char *)o->device;
	msg.batch_size = o->batch_size;
	msg.picks_le = true; /* copy_picks reads every form */
	/* 4-byte picks and inline gather ids where they fit: half the bytes
	 * of a BatchReady to read, decode and copy, on the trainer's CPU,
	 * which bounds a warm pool's tight loop (bench/NOTES.md);
	 * $PREFETCH_CLIENT_NARROW=0 asks for 8 bytes, to compare. */
	msg.narrow = !pfc_env_says_no("PREFETCH_CLIENT_NARROW");
	msg.drop_last = o->drop_last;
	msg.augment = o->augment;
	msg.min_depth = o->min_depth;
	msg.max_depth = o->max_depth;
	msg.ipc = (Pf__Ipc)o->ipc;
	msg.name = (char *)o->name;
	msg.share = (char *)(o->share ? o->share : "");
	msg.gather = c->gather != NULL;
	/* Without a pool, batches come in host arenas for this process to copy
	 * ($PREFETCH_CLIENT_COPY=0: the daemon copies them). */
	msg.client_copy = c->gather != NULL && pfcuda_can_copy_from_host(c->cuda) &&
			  !pfc_env_says_no("PREFETCH_CLIENT_COPY");
	if (c->pci_bus_id[0])
		msg.pci_bus_id = c->pci_bus_id;
	env.msg_case = PF__ENVELOPE__MSG_OPEN;
	env.open = &msg;
	return pfc_call(c, &env, PF__ENVELOPE__MSG_OPENED, reply);
}

/*
 * StartEpoch for the epoch on record (c->epoch and how it was started) at
 * start_batch.  Batches that arrive meanwhile for it are queued; if it is
 * refused (or gets no answer) no epoch runs here, and whatever arrived for
 * it goes back.  The daemon's error stays in pf_errmsg: pfc_release_queue only
 * sets a message if it fails.
 */
int pfc_send_start(struct pf_client *c, uint64_t start_batch, const uint64_t *indices,
		   size_t nindices, uint64_t *batches)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__StartEpoch msg = PF__START_EPOCH__INIT;
	Pf__Envelope *reply;
	int rc;

	c->epoch_live = true;
	c->epoch_ended = false;
	c->next_seq = start_batch;
	msg.epoch = c->epoch;
	msg.order = (Pf__Order)c->epoch_order;
	msg.seed = c->epoch_seed;
	msg.rank = c->epoch_rank;
	msg.world = c->epoch_world;
	msg.start_batch = start_batch;
	msg.block_rows = c->epoch_block_rows;
	msg.block_bytes = c->epoch_block_bytes;
	msg.window_blocks = c->epoch_window_blocks;
	msg.n_indices = nindices;
	msg.indices = (uint64_t *)indices;
	env.msg_case = PF__ENVELOPE__MSG_START;
	env.start = &msg;
	rc = pfc_call(c, &env, PF__ENVELOPE__MSG_STARTED, &reply);
	if (rc) {
		c->epoch_live = false;
		pfc_release_queue(c);
		return rc;
	}
	if (reply->started->epoch != c->epoch)
		rc = pfc_conn_fail(c, -EPROTO,
				   "%s started epoch %" PRIu64 " when asked for %" PRIu64, c->where,
				   reply->started->epoch, c->epoch);
	else if (batches)
		*batches = reply->started->batches;
	pf__envelope__free_unpacked(reply, NULL);
	return rc;
}
