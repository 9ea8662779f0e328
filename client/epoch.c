/*
 * epoch.c — libprefetch's public calls of epochs and their batches:
 * starting an epoch (numbered by the session, or by pf_set_epoch), a paced
 * epoch's requests (pf_load), taking the next batch (pf_next,
 * pf_next_stream, pf_release_next), giving one back (pf_release), the
 * honest-depth probe, and abandoning an epoch.  The session's own calls
 * are prefetch.c's.
 *
 * On a client that reconnects (reconnect_s), a call that finds the
 * connection broken brings the session back first (reconnect.c) and then
 * goes on, at most RECONNECTS_PER_CALL times a call; a release of a batch
 * whose daemon went away sends nothing, as its slot went with that daemon.
 *
 * DESIGN: no threads, no locks: the thread that owns the struct pf_client
 * (prefetch.h: one at a time).  A batch pf_next returns is the trainer's,
 * on the held list, until pf_release; a device batch's release then
 * belongs to its lane (settle.c) until it has settled.
 */
#include "client_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* ---- epochs -------------------------------------------------------------- */

static int start_epoch_once(struct pf_client *c, const struct pf_epoch_opts *opts,
			    uint64_t *batches)
{
	/* The daemon abandons a running epoch when the next one starts; here
	 * its queued batches go back, and any still on the way are released
	 * on arrival because their epoch is no longer current. */
	uint64_t epoch, was_epoch = c->epoch, was_last = c->last_epoch;
	bool was_had = c->had_epoch, was_set = c->next_set;
	int rc;

	if (c->next_set) {
		epoch = c->next_epoch;
	} else if (!c->had_epoch) {
		epoch = 0;
	} else if (c->last_epoch == UINT64_MAX) {
		return pfc_set_err(c, -EOVERFLOW, "pf_start_epoch: no epoch number after %" PRIu64,
				   c->last_epoch);
	} else {
		epoch = c->last_epoch + 1;
	}
	c->epoch_live = false;
	rc = pfc_release_queue(c);
	if (rc)
		return rc;
	c->epoch = c->last_epoch = epoch;
	c->had_epoch = true;
	c->next_set = false;
	c->epoch_batches = 0;
	c->paced_requested = 0;
	c->paced_ended = false;
	c->epoch_order = opts->order;
	c->epoch_seed = opts->seed;
	c->epoch_rank = opts->rank;
	c->epoch_world = opts->world;
	c->epoch_block_rows = opts->block_rows;
	c->epoch_block_bytes = opts->block_bytes;
	c->epoch_window_blocks = opts->window_blocks;
	c->resume_seq = opts->start_batch;
	free(c->epoch_indices);
	c->epoch_indices = NULL;
	c->epoch_nindices = 0;
	/* An explicit order is the caller's memory, valid only for this call;
	 * a restart needs it again. */
	if (opts->nindices && pfc_reconnecting(c)) {
		c->epoch_indices = malloc(opts->nindices * sizeof(uint64_t));
		if (!c->epoch_indices)
			return pfc_set_err(c, -ENOMEM, "out of memory for %zu indices",
					   opts->nindices);
		memcpy(c->epoch_indices, opts->indices, opts->nindices * sizeof(uint64_t));
		c->epoch_nindices = opts->nindices;
	}
	rc = pfc_send_start(c, opts->start_batch, opts->indices, opts->nindices, batches);
	if (rc && c->refused) {
		/* The daemon answered no, so it started nothing under this
		 * number: the trainer may use it again (after fixing the
		 * options), as pf_set_epoch had asked. */
		c->epoch = was_epoch;
		c->last_epoch = was_last;
		c->had_epoch = was_had;
		c->next_set = was_set;
	}
	return rc;
}

static int send_load(struct pf_client *c, const uint64_t *picks, size_t n, bool end)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__LoadBatch msg = PF__LOAD_BATCH__INIT;

	if (c->dead)
		return pfc_fail_dead(c);
	if (!c->epoch_live || c->epoch_order != PF_ORDER_PACED || c->paced_ended)
		return pfc_set_err(c, -EINVAL,
				   "%s: no paced epoch is taking requests (pf_start_epoch with "
				   "PF_ORDER_PACED, before pf_load_end)",
				   end ? "pf_load_end" : "pf_load");
	msg.epoch = c->epoch;
	msg.n_picks = n;
	msg.picks = (uint64_t *)picks;
	msg.end = end;
	env.msg_case = PF__ENVELOPE__MSG_LOAD;
	env.load = &msg;
	return pfc_send(c, &env);
}

PF_API int pf_load(struct pf_client *c, const uint64_t *picks, size_t n)
{
	int rc;

	if (!c || (n && !picks))
		return -EINVAL;
	if (c->paced_requested - c->epoch_batches >= PF_PACED_MAX)
		return pfc_set_err(c, -EAGAIN,
				   "pf_load: %d batches requested and not taken; take one first",
				   PF_PACED_MAX);
	rc = send_load(c, picks, n, false);
	if (!rc)
		c->paced_requested++;
	return rc;
}

PF_API int pf_load_end(struct pf_client *c)
{
	int rc;

	if (!c)
		return -EINVAL;
	rc = send_load(c, NULL, 0, true);
	if (!rc)
		c->paced_ended = true;
	return rc;
}

PF_API int pf_start_epoch(struct pf_client *c, const struct pf_epoch_opts *opts, uint64_t *batches)
{
	int revived = 0, rc;

	if (!c)
		return -EINVAL;
	if (c->dead && !pfc_reconnecting(c))
		return pfc_fail_dead(c);
	if (!c->opened)
		return pfc_set_err(c, -EINVAL, "pf_start_epoch: no session (call pf_open first)");
	if (!opts || (opts->nindices && !opts->indices))
		return pfc_set_err(c, -EINVAL, "pf_start_epoch: %s",
				   opts ? "nindices without indices" : "no options");
	if (opts->order != PF_ORDER_EXPLICIT && opts->nindices)
		return pfc_set_err(c, -EINVAL,
				   "pf_start_epoch: indices given without "
				   "PF_ORDER_EXPLICIT");
	if (opts->order == PF_ORDER_PACED && (opts->start_batch || opts->world > 1))
		return pfc_set_err(c, -EINVAL,
				   "pf_start_epoch: a paced epoch takes no start_batch or world "
				   "(pf_load chooses every batch)");
	for (;;) {
		if (c->dead) {
			/* This epoch replaces the interrupted one, which is
			 * therefore not started again. */
			pfc_note_outage(c);
			c->resume_pending = false;
			rc = pfc_revive(c, -1);
			if (rc)
				return rc;
		}
		rc = start_epoch_once(c, opts, batches);
		if (!rc || !c->dead || !pfc_reconnecting(c) || ++revived > RECONNECTS_PER_CALL)
			return rc;
	}
}

PF_API int pf_set_epoch(struct pf_client *c, uint64_t epoch)
{
	if (!c)
		return -EINVAL;
	if (c->had_epoch && epoch <= c->last_epoch)
		return pfc_set_err(c, -EINVAL,
				   "pf_set_epoch: epoch %" PRIu64 " is not after epoch %" PRIu64
				   ", the last this session started (epoch numbers must grow; "
				   "a new session may start at any)",
				   epoch, c->last_epoch);
	c->next_epoch = epoch;
	c->next_set = true;
	return 0;
}

PF_API int pf_probe(struct pf_client *c)
{
	int revived = 0, rc;

	if (!c)
		return -EINVAL;
	if (!c->cuda)
		return pfc_set_err(c, -EINVAL, "pf_probe: not a CUDA session");
	for (;;) {
		rc = pfc_revive(c, -1);
		if (rc)
			return rc;
		rc = pfc_send_probe(c);
		if (!rc || !c->dead || !pfc_reconnecting(c) || ++revived > RECONNECTS_PER_CALL)
			return rc;
	}
}

/* ---- batches ------------------------------------------------------------- */

static int next_batch(struct pf_client *c, int timeout_ms, struct pf_batch **batch)
{
	int64_t deadline = pfc_deadline_after(timeout_ms);
	int revived = 0;
	int rc;

	if (c->dead && !pfc_reconnecting(c))
		return pfc_fail_dead(c);
	if (!c->opened)
		return pfc_set_err(c, -EINVAL, "pf_next: no session (call pf_open first)");
	for (;;) {
		int64_t blocked_since = 0;

		rc = pfc_wait_batch(c, deadline, timeout_ms, &blocked_since);
		/* Counted before the Ack, which carries the total. */
		if (blocked_since)
			c->wait_s += (mono() - blocked_since) / 1e9;
		if (!rc && c->queue.head)
			rc = pfc_take(c, batch);
		if (!rc || !c->dead || !pfc_reconnecting(c) || revived++ == RECONNECTS_PER_CALL)
			return rc;
		/* The daemon went away: get the session back, then wait on for
		 * the batch the trainer asked for.  The trainer waits for data
		 * meanwhile, so that is wait time too. */
		blocked_since = mono();
		rc = pfc_revive(c, deadline);
		c->wait_s += (mono() - blocked_since) / 1e9;
		if (rc)
			return rc;
	}
}

PF_API int pf_next(struct pf_client *c, int timeout_ms, struct pf_batch **batch)
{
	int rc;

	if (!c || !batch)
		return -EINVAL;
	/* No stream named: the batch is complete when this returns, for work
	 * on any stream (a copy or gather of this library waited for). */
	c->sync_take = true;
	rc = pf_next_stream(c, timeout_ms, NULL, batch);
	c->sync_take = false;
	return rc;
}

PF_API int pf_next_stream(struct pf_client *c, int timeout_ms, void *stream,
			  struct pf_batch **batch)
{
	int64_t entry = mono();
	int rc;

	if (!c || !batch)
		return -EINVAL;
	c->use_stream = stream;
	c->error_batch = false;
	pfc_cork(c);
	*batch = NULL;
	if (c->have_last_return)
		c->busy_s += (entry - c->last_return_ns) / 1e9;
	rc = next_batch(c, timeout_ms, batch);
	/* The time after an epoch's end (evaluation, checkpointing) is not
	 * time spent consuming batches, so it does not count as busy. */
	c->have_last_return = rc != 0 || *batch != NULL;
	/* Releases still corked (no batch was taken, which sends them with
	 * its Ack): a failure is the connection's, as pfc_flush_releases'. */
	if (pfc_uncork(c) && !rc && !*batch)
		rc = pfc_fail_dead(c);
	c->last_return_ns = mono();
	return rc;
}

static int release_batch(struct pf_client *c, struct pf_batch *batch, void *stream);

/* rc of a release's sends: when they failed because the daemon died, on a
 * client that reconnects, the slot went with the daemon (as for a batch of
 * an older connection): an outage, and 0. */
static int release_outage(struct pf_client *c, int rc)
{
	if (rc && c->dead && pfc_reconnecting(c)) {
		pfc_note_outage(c);
		return 0;
	}
	return rc;
}

PF_API int pf_release_next(struct pf_client *c, struct pf_batch *release, void *stream,
			   int timeout_ms, struct pf_batch **batch)
{
	int rc;

	if (!c || !batch)
		return -EINVAL;
	*batch = NULL;
	c->error_batch = false;
	if (release) {
		/* Corked: a host batch's Release goes out with the next one's
		 * Ack, in one write; the settled pending releases are flushed
		 * here, once. */
		pfc_cork(c);
		rc = release_batch(c, release, stream);
		if (rc) {
			if (pfc_uncork(c) && !c->dead)
				pfc_fail_dead(c);
			return rc;
		}
	}
	return pf_next_stream(c, timeout_ms, stream, batch);
}

PF_API bool pf_error_batch(const struct pf_client *c)
{
	return c && c->error_batch;
}

PF_API int pf_release(struct pf_client *c, struct pf_batch *batch, void *stream)
{
	int rc, urc;

	if (!c || !batch)
		return -EINVAL;
	pfc_cork(c);
	rc = release_batch(c, batch, stream);
	/* This call's Releases, in one write. */
	urc = release_outage(c, pfc_uncork(c));
	return rc ? rc : urc;
}

/* After a release: the lanes' settled releases are disposed of; then, for
 * a CUDA session, the frames already received are taken in, and the
 * socket read without waiting while fewer than PFC_READ_AHEAD batches are
 * queued, which starts their gathers and copies, so that the pf_next after
 * it hands over a batch that is on the device already. */
static int after_release(struct pf_client *c)
{
	pfc_settle_collect(c);
	/* What goes wrong in there (a frame, another batch's copy) is the
	 * connection's: the next pf_next says so, this release went well. */
	if (c->cuda && !c->dead &&
	    !(c->nqueued < PFC_READ_AHEAD ? pfc_read_now(c) : pfc_read_buffered(c)) &&
	    !pfc_copy_ahead(c))
		pfc_ack_ahead(c);
	return 0;
}

/* pf_release; then after_release. */
static int release_batch(struct pf_client *c, struct pf_batch *batch, void *stream)
{
	struct pfc_batch **pp, *b;
	int rc;

	/* Find it by address before touching it: a batch released twice, or
	 * one from another client, is an error here, never a double free. */
	for (pp = &c->held; *pp && &(*pp)->pub != batch; pp = &(*pp)->next)
		;
	if (!*pp)
		return pfc_set_err(c, -EINVAL,
				   "pf_release: this batch is not held by this client "
				   "(released twice?)");
	b = *pp;
	/* Client copies: the trainer read our own device buffer, whose slot
	 * went back after its copy; only the buffer waits for the stream,
	 * whatever became of the connection. */
	if (b->dbuf >= 0) {
		rc = pfc_release_after(c, b, stream);
		if (rc)
			return rc; /* still held: the caller may retry */
		*pp = b->next;
		c->nheld--;
		if (b->gen != c->gen)
			pfc_retired_put(c, b->gen);
		pfc_free_batch(b);
		return release_outage(c, c->dead ? 0 : after_release(c));
	}
	/* A batch of a connection that broke, on a client that reconnects:
	 * its slot died with that daemon, so there is nothing to send, only
	 * its arenas to let go of once no batch points into them. */
	pfc_note_outage(c);
	if (b->gen != c->gen) {
		*pp = b->next;
		c->nheld--;
		pfc_retired_put(c, b->gen);
		pfc_free_batch(b);
		return 0;
	}
	if (c->dead) {
		*pp = b->next;
		c->nheld--;
		slot_mark(c, b->slot, false);
		pfc_free_batch(b);
		return pfc_fail_dead(c);
	}
	/* Device batches wait for the work queued on the trainer's stream;
	 * host memory is read synchronously by the trainer, so its release is
	 * immediate. */
	if (b->pub.on_device) {
		rc = pfc_release_after(c, b, stream);
		if (rc)
			return rc; /* still held: the caller may retry */
		*pp = b->next;
		c->nheld--;
		pfc_free_batch(b);
	} else {
		*pp = b->next;
		c->nheld--;
		rc = pfc_send_release(c, b->pub.epoch, b->pub.seq, b->slot);
		pfc_free_batch(b);
	}
	if (!rc)
		rc = after_release(c);
	return release_outage(c, rc);
}

/* ---- abandoning an epoch ------------------------------------------------- */

PF_API int pf_abandon(struct pf_client *c)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__Abandon msg = PF__ABANDON__INIT;
	bool tell;
	int rc = 0, qrc;

	if (!c)
		return -EINVAL;
	if (c->dead && pfc_reconnecting(c)) {
		/* The daemon that was filling the epoch is gone: forget the
		 * epoch, so that the next connection does not start it again. */
		pfc_note_outage(c);
		c->resume_pending = false;
		c->epoch_live = false;
		return 0;
	}
	if (c->dead)
		return pfc_fail_dead(c);
	if (!c->opened)
		return pfc_set_err(c, -EINVAL, "pf_abandon: no session (call pf_open first)");
	if (!c->epoch_live)
		return 0;
	/* Not live from here on: batches still on the way during the call
	 * are released as they arrive.  An epoch whose end already came has
	 * nothing left to stop in the daemon, only queued batches to return. */
	tell = !c->epoch_ended;
	c->epoch_live = false;
	if (tell) {
		msg.epoch = c->epoch;
		env.msg_case = PF__ENVELOPE__MSG_ABANDON;
		env.abandon = &msg;
		rc = pfc_call(c, &env, PF__ENVELOPE__MSG_OK, NULL);
	}
	/* Released after the daemon has stopped filling, so that a freed slot
	 * is not filled again for the epoch being abandoned. */
	qrc = pfc_release_queue(c);
	/* Batches the trainer released behind its stream go back too, from
	 * their lanes, as that work retires: nothing to wait for here. */
	pfc_settle_collect(c);
	if ((rc || qrc) && c->dead && pfc_reconnecting(c)) {
		/* It broke on the way: the epoch is not live, so it is not
		 * started again, and there is nothing left to stop. */
		pfc_note_outage(c);
		return 0;
	}
	return rc ? rc : qrc;
}
