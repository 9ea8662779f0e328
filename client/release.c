/*
 * release.c — how a batch goes back, and what it waits for: the events
 * that mark the end of a gather, a copy or the trainer's work on a batch;
 * Releases sent at once or queued on a lane of settle.c behind such an
 * event; the queue's batches given back when an epoch is dropped; and
 * client copies, with the device buffers they copy into.
 *
 * A client copy is here because it is the first half of a release: the
 * slot's Release is queued behind the copy, and the device buffer the
 * trainer reads comes back, through the same lanes, once the trainer's
 * work on it has retired.  Copies start as a batch arrives, up to
 * PFC_COPY_AHEAD before it is taken (pfc_copy_ahead), or as it is taken.
 *
 * DESIGN: the trainer's thread only.  Nothing here waits for the GPU on a
 * batch's way: a release is recorded on a stream and handed to a lane,
 * whose thread waits.  The CPU waits here, blocked, only when no lane's
 * thread can start or no memory is left for a release, and when the
 * session's device buffers are freed (pfc_free_dbufs).  The idle events,
 * the device buffers and their free stack are the struct pf_client's; a
 * queued release belongs to its lane until pfc_settle_collect hands it
 * back (pfc_release_dispose).
 */
#include "client_int.h"
#include "pfcuda.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>

/* ---- events -------------------------------------------------------------- */

/* Drops one holder's reference; the last makes the event idle. */
void pfc_event_put(void *event)
{
	struct pfc_event *e = event;

	assert(e->refs > 0);
	if (--e->refs)
		return;
	e->next = e->c->events;
	e->c->events = e;
}

/* An idle event of c, or a new one: 0, or -errno with c's error set. */
int pfc_event_get(struct pf_client *c, const char *what, struct pfc_event **out)
{
	struct pfc_event *e = c->events;
	char why[256];
	int rc;

	if (e) {
		c->events = e->next;
	} else {
		e = calloc(1, sizeof(*e));
		if (!e)
			return pfc_set_err(c, -ENOMEM, "out of memory");
		e->c = c;
		rc = pfcuda_event_create(c->cuda, &e->ev, why, sizeof(why));
		if (rc) {
			free(e);
			return pfc_set_err(c, rc, "%s: %s", what, why);
		}
	}
	e->refs = 1;
	e->use = ++c->event_uses;
	e->next = NULL;
	*out = e;
	return 0;
}

/* ---- releases ------------------------------------------------------------ */

void pfc_free_batch(struct pfc_batch *b)
{
	if (!b)
		return;
	if (b->gather_ev)
		pfc_event_put(b->gather_ev);
	free(b->message);
	free(b);
}

/* Gives back what a settled release held: a client copy's device buffer,
 * or the slot (its Release, when the connection is still the one it came
 * on); then its event and itself. */
static void settle_now(struct pf_client *c, struct pfc_release *r)
{
	if (r->dbuf < 0 && !c->dead && r->gen == c->gen)
		pfc_send_release(c, r->epoch, r->seq, r->slot);
	pfc_release_dispose(c, r);
}

/* Queues r, the release of batch b's slot (dbuf -1) or of its device
 * buffer (client copies), for when event e, recorded on stream, has
 * completed: a lane of settle.c waits for it and sends it.  Should no
 * lane's thread start, the CPU waits here, blocked, instead. */
static void queue_release(struct pf_client *c, struct pfc_release *r, const struct pfc_batch *b,
			  struct pfc_event *e, const void *stream, int32_t dbuf)
{
	r->epoch = b->pub.epoch;
	r->seq = b->pub.seq;
	r->slot = b->slot;
	r->dbuf = dbuf;
	r->event = e;
	r->stream = stream;
	r->gen = c->gen;
	r->free_event = pfc_event_put;
	if (pfc_settle_queue(c, r) == 0)
		return;
	pfcuda_event_sync(c->cuda, e->ev, NULL, 0);
	settle_now(c, r);
}

/* Queues the release of batch b (not taken) for when its gather has
 * completed: the gather still writes the slot until then. */
static int release_after_gather(struct pf_client *c, struct pfc_batch *b)
{
	struct pfc_release *r = calloc(1, sizeof(*r));

	if (!r) {
		pfcuda_gather_sync(c->gather, NULL, 0);
		return pfc_send_release(c, b->pub.epoch, b->pub.seq, b->slot);
	}
	queue_release(c, r, b, b->gather_ev, c->gather, -1);
	b->gather_ev = NULL;
	return 0;
}

int pfc_send_release(struct pf_client *c, uint64_t epoch, uint64_t seq, int32_t slot)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__Release msg = PF__RELEASE__INIT;

	/* Unmark first: once the Release is out the daemon may announce the
	 * slot again, possibly within the read that follows. */
	if (slot >= 0 && (uint32_t)slot < c->slots)
		slot_mark(c, slot, false);
	msg.epoch = epoch;
	msg.seq = seq;
	msg.slot = slot;
	env.msg_case = PF__ENVELOPE__MSG_RELEASE;
	env.release = &msg;
	return pfc_send(c, &env);
}

/* A batch off the queue that is not taken after all, with nothing sent for
 * it.  Its device buffer may go back at once: later copies into it queue
 * behind its copy on the same stream, and the trainer never read it.  The
 * slot of one copied already went back with the copy (and may be another
 * batch's by now): it is left as it is. */
void pfc_drop_untaken(struct pf_client *c, struct pfc_batch *b)
{
	if (b->dbuf >= 0)
		c->dbuf_free[c->ndbuf_free++] = (uint32_t)b->dbuf;
	else if (b->slot >= 0)
		slot_mark(c, b->slot, false);
	pfc_free_batch(b);
}

/* Releases every batch received but not taken (an abandoned or replaced
 * epoch: the daemon expects them back). */
int pfc_release_queue(struct pf_client *c)
{
	struct fifo_node *n;
	int rc = 0;

	while ((n = fifo_pop(&c->queue))) {
		struct pfc_batch *b = container_of(n, struct pfc_batch, queued);

		c->nqueued--;
		/* Its slot back, now or once its gather is done; one copied
		 * ahead has its slot's Release queued behind the copy. */
		if (b->slot >= 0 && b->dbuf < 0 && !c->dead) {
			int src = b->gather_ev
					  ? release_after_gather(c, b)
					  : pfc_send_release(c, b->pub.epoch, b->pub.seq, b->slot);

			if (src && !rc)
				rc = src;
			pfc_free_batch(b);
		} else {
			pfc_drop_untaken(c, b);
		}
	}
	return rc;
}

/* Queues the release of a device batch behind the work queued on stream so
 * far.  0, or -errno with the batch still held by the caller. */
int pfc_release_after(struct pf_client *c, struct pfc_batch *b, void *stream)
{
	struct pfc_release *r = calloc(1, sizeof(*r));
	struct pfc_event *e;
	char why[256];
	int64_t t0;
	int rc;

	if (!r)
		return pfc_set_err(c, -ENOMEM, "out of memory");
	rc = pfc_event_get(c, "pf_release", &e);
	if (rc) {
		free(r);
		return rc;
	}
	/* The slot is rewritten after this release: its gather must be done
	 * too, even if the trainer releases it on another stream (on the one
	 * pf_next ordered after the gather, it is already; but the per-thread
	 * default stream is another stream on another thread). */
	t0 = PFC_T0(c);
	if (b->gather_ev &&
	    (!b->waited || b->waited_stream != stream || stream == PFC_STREAM_PER_THREAD)) {
		rc = pfcuda_stream_wait(c->cuda, stream, b->gather_ev->ev, why, sizeof(why));
		c->counts.waits++;
	}
	if (!rc)
		rc = pfcuda_event_record(c->cuda, e->ev, stream, why, sizeof(why));
	PFC_TADD(c, event_ns, t0);
	if (rc) {
		pfc_event_put(e);
		free(r);
		return pfc_set_err(c, rc, "pf_release: cannot record on stream %p: %s", stream,
				   why);
	}
	c->counts.records++;
	queue_release(c, r, b, e, stream, b->dbuf); /* client copies: only the buffer comes back */
	return 0;
}

/* ---- client copies ------------------------------------------------------- */

/* A device buffer is free, or may be made. */
static bool dbuf_available(const struct pf_client *c)
{
	return c->ndbuf_free > 0 || c->ndbufs < c->dbuf_cap || !c->dbufs;
}

bool pfc_can_take(const struct pf_client *c)
{
	const struct pfc_batch *b = container_of(c->queue.head, struct pfc_batch, queued);

	return !c->ccopy || b->slot < 0 || b->dbuf >= 0 || dbuf_available(c);
}

/* A free device buffer for a client that copies: one given back, else a
 * new one while there are fewer than the session's slots (held and copied
 * ahead).  Its index, or -errno.  quiet (a copy ahead): a device too full
 * for one more, with some made already, returns -ENOMEM, leaves the
 * connection as it is, and caps the buffers at those there are. */
static int take_dbuf(struct pf_client *c, bool quiet)
{
	char why[256];
	uint64_t p;
	int rc;

	if (!c->dbufs) {
		c->dbuf_cap = c->slots ? c->slots : 1;
		c->dbuf_bytes = (c->slot_bytes + 511) & ~(uint64_t)511;
		c->dbufs = calloc(c->dbuf_cap, sizeof(*c->dbufs));
		c->dbuf_free = calloc(c->dbuf_cap, sizeof(*c->dbuf_free));
		if (!c->dbufs || !c->dbuf_free) {
			pfc_free_dbufs(c);
			return pfc_conn_fail(c, -ENOMEM, "out of memory");
		}
	}
	/* A restarted daemon whose slots grew: the buffers made for the old
	 * ones are too small (a copy would overrun them). */
	if (c->slot_bytes > c->dbuf_bytes)
		return pfc_conn_fail(c, -ESTALE,
				     "%s now serves slots of %.1f MiB, larger than this client's "
				     "device buffers of %.1f MiB: the session cannot go on",
				     c->where, c->slot_bytes / 1048576.0,
				     c->dbuf_bytes / 1048576.0);
	if (c->ndbuf_free)
		return (int)c->dbuf_free[--c->ndbuf_free];
	if (c->ndbufs >= c->dbuf_cap)
		return pfc_conn_fail(c, -EPROTO, "no device buffer free for a batch");
	rc = pfcuda_mem_alloc(c->cuda, c->dbuf_bytes, &p, why, sizeof(why));
	if (rc == -ENOMEM && quiet && c->ndbufs) {
		/* The device is full: make do with the buffers there are (a
		 * take waits for one to come back rather than fail). */
		c->dbuf_cap = c->ndbufs;
		return -ENOMEM;
	}
	if (rc)
		return pfc_conn_fail(c, rc, "a device buffer of %.1f MiB for a batch: %s",
				     c->dbuf_bytes / 1048576.0, why);
	c->dbufs[c->ndbufs] = p;
	return (int)c->ndbufs++;
}

void pfc_free_dbufs(struct pf_client *c)
{
	if (c->ndbufs)
		pfcuda_sync(c->cuda, NULL, 0); /* queued work may still read them */
	for (uint32_t i = 0; i < c->ndbufs; i++)
		pfcuda_mem_free(c->cuda, c->dbufs[i]);
	free(c->dbufs);
	free(c->dbuf_free);
	c->dbufs = NULL;
	c->dbuf_free = NULL;
	c->ndbufs = c->ndbuf_free = c->dbuf_cap = 0;
}

/* A batch of a client that copies, queued: its slot is copied into a free
 * device buffer on the gather stream.  b->gather_ev marks the copy's end,
 * which the trainer's stream waits for when it takes the batch (pfc_take),
 * and the slot goes back to the daemon as soon as the copy is done (the
 * trainer reads the buffer, not the slot).  ahead: see take_dbuf's quiet. */
int pfc_copy_batch(struct pf_client *c, struct pfc_batch *b, bool ahead)
{
	void **ptrs = (void **)(b + 1);
	struct pfc_event *e, *done;
	struct pfc_release *r;
	uint64_t dst;
	char why[256];
	int rc, j;

	j = take_dbuf(c, ahead);
	if (j < 0)
		return j;
	r = calloc(1, sizeof(*r));
	if (!r) {
		c->dbuf_free[c->ndbuf_free++] = (uint32_t)j;
		return pfc_conn_fail(c, -ENOMEM, "out of memory");
	}
	/* Two events behind the copy: the batch's, which a stream may wait on
	 * after the slot's Release (which owns the other) has gone. */
	rc = pfc_event_get(c, "copy", &e);
	if (!rc) {
		rc = pfc_event_get(c, "copy", &done);
		if (rc)
			pfc_event_put(e);
	}
	if (rc) {
		c->dbuf_free[c->ndbuf_free++] = (uint32_t)j;
		free(r);
		return pfc_conn_fail(c, rc, "%s", c->err);
	}
	dst = c->dbufs[j];
	rc = pfcuda_gather_copy(c->gather, dst, b->host, (size_t)c->slot_bytes, e->ev, done->ev,
				why, sizeof(why));
	c->counts.copies += rc == 0;
	if (rc) {
		/* Later copies into it queue behind this one on the same
		 * stream: it may go back at once. */
		c->dbuf_free[c->ndbuf_free++] = (uint32_t)j;
		pfc_event_put(e);
		pfc_event_put(done);
		free(r);
		return pfc_conn_fail(c, rc, "batch %" PRIu64 ": copy to the device: %s", b->pub.seq,
				     why);
	}
	b->dbuf = j;
	b->gather_ev = e;
	for (uint32_t f = 0; f < c->nfields; f++)
		ptrs[f] = (void *)(uintptr_t)(dst + c->fields[f].offset);
	b->pub.on_device = true;
	/* The slot's Release, once the copy has retired. */
	queue_release(c, r, b, done, c->gather, -1);
	b->host = NULL;
	return 0;
}

int pfc_copy_ahead(struct pf_client *c)
{
	uint32_t ahead = 0;

	if (!c->ccopy)
		return 0;
	for (struct fifo_node *n = c->queue.head; n && ahead < PFC_COPY_AHEAD; n = n->next) {
		struct pfc_batch *b = container_of(n, struct pfc_batch, queued);
		int rc;

		if (b->slot < 0)
			continue; /* an error batch: nothing to copy */
		if (b->host) {
			if (c->dead || !dbuf_available(c))
				return 0;
			rc = pfc_copy_batch(c, b, true);
			if (rc == -ENOMEM && !c->dead)
				return 0; /* no buffer for now: pf_next copies it */
			if (rc)
				return rc;
		}
		ahead++;
	}
	return 0;
}
