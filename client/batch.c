/*
 * batch.c — libprefetch's batches from frame to trainer: the pushes read
 * from the connection (BatchReady, Arena, PoolSlab, EpochEnd, Error),
 * each BatchReady checked against the session and queued, with its gather
 * launched (in one launch with the others of the same read where it can
 * be) or its client copy started; then taking the head of the queue.
 *
 * Taking a batch sends its Ack (the daemon may prepare another: the
 * governor's `consumed`), with the stall accounting of this client: time
 * blocked inside pf_next (wait) and time between calls (busy).  CUDA
 * sessions also send the honest-depth Probe: free device memory at each
 * epoch's second batch (its first step has run), every probe_interval_s
 * the daemon asked for, and on pf_probe.  The memory batches live in is
 * arena.c's; giving them back, and client copies, release.c's.
 *
 * DESIGN: the trainer's thread only.  Nothing here waits for the GPU on a
 * batch's way (no synchronize, no event query) unless the trainer named
 * no stream (pf_next): a copy or gather is queued on the library's stream
 * and the trainer's stream waits for it on the GPU (cuStreamWaitEvent).
 * The queue, the held list and the gathers waiting for one launch are the
 * struct pf_client's.  A batch belongs to the queue until it is taken,
 * then to the held list until pf_release.
 */
#include "client_int.h"
#include "pfcuda.h"
#include "util.h"

#include <assert.h>
#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- checks -------------------------------------------------------------- */

/* Checks a data batch against the session: its slot, its arena, and that
 * every field of `count` samples lies inside the slot, which lies inside the
 * arena.  The trainer dereferences these pointers, so nothing is trusted. */
static int check_data_batch(struct pf_client *c, const Pf__BatchReady *b)
{
	const struct pfc_arena *a;
	uint64_t end;

	if (!c->opened)
		return pfc_conn_fail(c, -EPROTO,
				     "epoch %" PRIu64 " batch %" PRIu64
				     " arrived before the session opened",
				     b->epoch, b->seq);
	if ((uint32_t)b->slot >= c->slots)
		return pfc_conn_fail(c, -EPROTO,
				     "epoch %" PRIu64 " batch %" PRIu64 " names slot %" PRId32
				     " of a session with %" PRIu32,
				     b->epoch, b->seq, b->slot, c->slots);
	if (slot_marked(c, b->slot))
		return pfc_conn_fail(c, -EPROTO,
				     "epoch %" PRIu64 " batch %" PRIu64 " reuses slot %" PRId32
				     " before its release",
				     b->epoch, b->seq, b->slot);
	if (b->arena >= c->narenas || !c->arenas[b->arena].present)
		return pfc_conn_fail(c, -EPROTO,
				     "epoch %" PRIu64 " batch %" PRIu64 " names arena %" PRIu32
				     ", which was never announced",
				     b->epoch, b->seq, b->arena);
	a = &c->arenas[b->arena];
	if (__builtin_add_overflow(b->offset, c->slot_bytes, &end) || end > a->bytes)
		return pfc_conn_fail(c, -EPROTO,
				     "epoch %" PRIu64 " batch %" PRIu64
				     " lies outside arena %" PRIu32,
				     b->epoch, b->seq, b->arena);
	if (b->picks_le32.len && (b->picks_le.len || b->n_picks))
		return pfc_conn_fail(c, -EPROTO,
				     "epoch %" PRIu64 " batch %" PRIu64
				     " carries its picks both as picks_le32 and as %s",
				     b->epoch, b->seq, b->picks_le.len ? "picks_le" : "picks");
	if (b->picks_le32.len && b->picks_le32.len != (size_t)b->count * sizeof(uint32_t))
		return pfc_conn_fail(c, -EPROTO,
				     "epoch %" PRIu64 " batch %" PRIu64
				     " carries %zu bytes of picks_le32 for %" PRIu32
				     " samples (4 bytes a pick)",
				     b->epoch, b->seq, b->picks_le32.len, b->count);
	if (!b->picks_le32.len &&
	    ((b->picks_le.len ? b->picks_le.len / sizeof(uint64_t) : b->n_picks) != b->count ||
	     b->picks_le.len % sizeof(uint64_t)))
		return pfc_conn_fail(c, -EPROTO,
				     "epoch %" PRIu64 " batch %" PRIu64
				     " carries %zu picks for %" PRIu32 " samples",
				     b->epoch, b->seq,
				     b->picks_le.len ? b->picks_le.len / sizeof(uint64_t)
						     : b->n_picks,
				     b->count);
	for (uint32_t f = 0; f < c->nfields; f++) {
		uint64_t bytes;

		if (__builtin_mul_overflow(c->fields[f].sample_bytes, (uint64_t)b->count, &bytes) ||
		    __builtin_add_overflow(bytes, c->fields[f].offset, &end) || end > c->slot_bytes)
			return pfc_conn_fail(c, -EPROTO,
					     "epoch %" PRIu64 " batch %" PRIu64 ": %" PRIu32
					     " samples of field %s do not fit a slot",
					     b->epoch, b->seq, b->count, c->fields[f].name);
	}
	return 0;
}

/* The batch's picks, from whichever field carries them (picks_le32 holds
 * little-endian uint32, widened here; picks_le, little-endian uint64;
 * picks, packed varints). */
static void copy_picks(uint64_t *out, const Pf__BatchReady *b)
{
	if (b->picks_le32.len) {
		for (uint32_t i = 0; i < b->count; i++) {
			uint32_t v;

			memcpy(&v, b->picks_le32.data + (size_t)i * sizeof(v), sizeof(v));
			out[i] = le32toh(v);
		}
		return;
	}
	if (!b->picks_le.len) {
		memcpy(out, b->picks, b->count * sizeof(uint64_t));
		return;
	}
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	memcpy(out, b->picks_le.data, b->count * sizeof(uint64_t));
#else
	for (uint32_t i = 0; i < b->count; i++) {
		uint64_t v = 0;

		for (int k = 7; k >= 0; k--)
			v = v << 8 | b->picks_le.data[i * 8 + k];
		out[i] = v;
	}
#endif
}

/* ---- the client's gather ------------------------------------------------- */

/* Checks a batch the client is to gather: its index and staged rows lie
 * in its arena (the kernel reads them in this process's context). */
static int check_gather(struct pf_client *c, const Pf__BatchReady *b, const struct pfc_arena *a)
{
	size_t width = b->gather_ids32.len ? sizeof(uint32_t) : sizeof(uint64_t);
	size_t ids = b->gather_ids32.len ? b->gather_ids32.len : b->gather_ids.len;
	uint64_t end;

	/* Inline ids are copied into the slot's part of the staging, which
	 * has room for batch_size of them, and name pool entries only. */
	if (b->gather_ids32.len && b->gather_ids.len)
		return pfc_conn_fail(c, -EPROTO,
				     "epoch %" PRIu64 " batch %" PRIu64
				     " carries its gather ids both as gather_ids32 and gather_ids",
				     b->epoch, b->seq);
	if (ids &&
	    (ids != (size_t)b->count * width || b->nstaged || b->count > c->open_opts.batch_size))
		return pfc_conn_fail(
			c, -EPROTO,
			"epoch %" PRIu64 " batch %" PRIu64 " carries %zu bytes of %s for %" PRIu32
			" rows with %" PRIu32 " staged (%zu bytes an id, only for a "
			"batch of hits of at most %" PRIu32 " rows)",
			b->epoch, b->seq, ids, b->gather_ids32.len ? "gather_ids32" : "gather_ids",
			b->count, b->nstaged, width, c->open_opts.batch_size);
	if (!c->gathers || a->kind == PF__ARENA_KIND__ARENA_HOST_MEMFD || b->gather_desc % 8 ||
	    b->n_staged_off != c->nfields || b->nstaged > INT32_MAX ||
	    __builtin_add_overflow(b->gather_desc, (uint64_t)b->count * 8, &end) || end > a->bytes)
		return pfc_conn_fail(c, -EPROTO,
				     "epoch %" PRIu64 " batch %" PRIu64
				     " asks for a gather this session "
				     "cannot do",
				     b->epoch, b->seq);
	for (uint32_t f = 0; f < c->nfields; f++)
		if (__builtin_add_overflow(b->staged_off[f],
					   (uint64_t)b->nstaged * c->layout.row_bytes[f], &end) ||
		    end > a->bytes)
			return pfc_conn_fail(c, -EPROTO,
					     "epoch %" PRIu64 " batch %" PRIu64
					     ": staged rows of field %s lie outside arena %" PRIu32,
					     b->epoch, b->seq, c->fields[f].name, b->arena);
	return 0;
}

int pfc_gather_flush(struct pf_client *c)
{
	struct gpu_gather_group p;
	struct pfc_event *ev;
	uint32_t n = c->ngroup, k;
	char why[256];
	int64_t t0;
	int rc = 0;

	if (!n)
		return 0;
	c->ngroup = 0;
	/* A broken connection's queue is dropped, never taken. */
	if (c->dead)
		return pfc_fail_dead(c);
	/* One event for the launch, shared by its batches (each holds a
	 * reference): the trainer's stream then waits once for them all
	 * (pfc_take). */
	rc = pfc_event_get(c, "gather", &ev);
	if (rc)
		return pfc_conn_fail(c, rc, "gather of %u batches: %s", n, c->err);
	memset(&p, 0, sizeof(p));
	p.g = c->layout;
	p.g.desc32 = c->group_ids32;
	p.n = n;
	for (k = 0; k < n; k++) {
		p.slot[k] = c->group_slot[k];
		p.desc[k] = (uint64_t)(uintptr_t)c->group_ids[k];
		p.first[k + 1] = p.first[k] + c->group[k]->pub.count;
	}
	t0 = PFC_T0(c);
	rc = pfcuda_gather_launch_group(c->gather, &p, ev->ev, why, sizeof(why));
	PFC_TADD(c, launch_ns, t0);
	if (rc) {
		pfc_event_put(ev);
		return pfc_conn_fail(c, rc, "gather of %u batches: %s", n, why);
	}
	c->counts.launches++;
	c->counts.grouped += n;
	ev->refs = n;
	for (k = 0; k < n; k++)
		c->group[k]->gather_ev = ev;
	return 0;
}

/* Queues the batch's assembly on the gather stream, with its end event;
 * while grouping, a batch of hits waits in c->group for one launch with
 * the others of the pass (pfc_gather_flush). */
static int launch_gather(struct pf_client *c, struct pfc_batch *q, const Pf__BatchReady *b,
			 const struct pfc_arena *a)
{
	struct gpu_gather g = c->layout;
	/* Inline ids, 4 or 8 bytes each (check_gather allowed one form). */
	const bool ids32 = b->gather_ids32.len != 0;
	const ProtobufCBinaryData *inline_ids = ids32 ? &b->gather_ids32 : &b->gather_ids;
	struct pfc_event *e;
	void *ids = NULL;
	char why[256];
	int64_t t0;
	int rc;

	if (inline_ids->len) {
		/* A batch of hits only: its index came in the message; the
		 * kernel reads it from the slot's own part of the pinned
		 * staging, which the slot's next batch reuses only after this
		 * one's release (which waits for the gather).  Each part has
		 * room for 8-byte ids: a session may get either width. */
		size_t per = (size_t)c->open_opts.batch_size * sizeof(uint64_t);

		/* The size asked for changes only with the session (pf_open, a
		 * reconnection), never inside a pass: a staging buffer the
		 * waiting group's indices lie in is never replaced here. */
		rc = pfcuda_gather_staging(c->gather, pfc_staging_bytes(c), &ids, why, sizeof(why));
		if (rc)
			return pfc_conn_fail(c, rc, "gather staging: %s", why);
		ids = (uint8_t *)ids + per * (size_t)b->slot;
		/* As they came: little-endian, as the kernel reads them. */
		memcpy(ids, inline_ids->data, inline_ids->len);
		if (c->grouping && pfcuda_gather_can_group(c->gather)) {
			/* One launch reads entries of one width. */
			if (c->ngroup && c->group_ids32 != ids32) {
				rc = pfc_gather_flush(c);
				if (rc)
					return rc;
			}
			c->group_ids32 = ids32;
			c->group[c->ngroup] = q;
			c->group_ids[c->ngroup] = ids;
			c->group_slot[c->ngroup] = a->garena.base + b->offset;
			if (++c->ngroup == GPU_GATHER_GROUP)
				return pfc_gather_flush(c);
			return 0;
		}
	}
	/* Launched alone, after those waiting (the stream keeps the order
	 * the batches arrived in). */
	rc = pfc_gather_flush(c);
	if (rc)
		return rc;
	rc = pfc_event_get(c, "gather", &e);
	if (rc)
		return pfc_conn_fail(c, rc, "%s", c->err);
	g.slot = a->garena.base + b->offset;
	g.desc = a->garena.base + b->gather_desc;
	g.count = b->count;
	g.nstaged = b->nstaged;
	g.staged = a->garena.base;
	g.desc32 = ids32;
	for (uint32_t f = 0; f < c->nfields; f++)
		g.staged_off[f] = b->staged_off[f];
	t0 = PFC_T0(c);
	rc = pfcuda_gather_launch(c->gather, &g, ids, inline_ids->len, e->ev, why, sizeof(why));
	PFC_TADD(c, launch_ns, t0);
	if (rc) {
		pfc_event_put(e);
		return pfc_conn_fail(c, rc, "epoch %" PRIu64 " batch %" PRIu64 ": gather: %s",
				     b->epoch, b->seq, why);
	}
	c->counts.launches++;
	c->counts.grouped++;
	q->gather_ev = e;
	return 0;
}

static int add_batch(struct pf_client *c, const Pf__BatchReady *b)
{
	bool data = b->slot >= 0;
	struct pfc_batch *q;
	size_t extra;
	uint8_t *tail;
	int rc;

	if (b->error > 0 || (b->error == 0) != data)
		return pfc_conn_fail(c, -EPROTO,
				     "epoch %" PRIu64 " batch %" PRIu64 " has slot %" PRId32
				     " and error %" PRId32 " (a batch has a slot or an error < 0)",
				     b->epoch, b->seq, b->slot, b->error);
	if (data) {
		rc = check_data_batch(c, b);
		if (!rc && b->gather)
			rc = check_gather(c, b, &c->arenas[b->arena]);
		if (rc)
			return rc;
	}
	if (b->epoch != c->epoch || !c->epoch_live || c->epoch_ended)
		return data ? pfc_send_release(c, b->epoch, b->seq, b->slot) : 0;
	if (b->seq != c->next_seq)
		return pfc_conn_fail(c, -EPROTO,
				     "epoch %" PRIu64 " batch %" PRIu64
				     " arrived out of order (expected batch %" PRIu64 ")",
				     b->epoch, b->seq, c->next_seq);
	if (c->nqueued >= PFC_MAX_QUEUED)
		return pfc_conn_fail(c, -EPROTO, "%s sent more than %d batches that were not taken",
				     c->where, PFC_MAX_QUEUED);

	extra = data ? c->nfields * sizeof(void *) + b->count * sizeof(uint64_t) : 0;
	/* The tail (field pointers, picks) is written whole below: only the
	 * struct is zeroed, not 8 KiB of picks a batch. */
	q = malloc(sizeof(*q) + extra);
	if (!q)
		return pfc_conn_fail(c, -ENOMEM, "out of memory");
	memset(q, 0, sizeof(*q));
	tail = (uint8_t *)(q + 1);
	q->gen = c->gen;
	q->dbuf = -1;
	q->pub.epoch = b->epoch;
	q->pub.seq = b->seq;
	q->slot = b->slot;
	q->error = b->error;
	if (data) {
		const struct pfc_arena *a = &c->arenas[b->arena];
		void **ptrs = (void **)tail;
		uint64_t *picks = (uint64_t *)(tail + c->nfields * sizeof(void *));

		for (uint32_t f = 0; f < c->nfields; f++) {
			ptrs[f] = (uint8_t *)a->base + b->offset + c->fields[f].offset;
			q->bytes += c->fields[f].sample_bytes * b->count;
		}
		copy_picks(picks, b);
		if (c->ccopy && (a->kind != PF__ARENA_KIND__ARENA_HOST_MEMFD || !a->registered)) {
			free(q);
			return pfc_conn_fail(
				c, -EPROTO,
				"epoch %" PRIu64 " batch %" PRIu64 " of a session this client "
				"copies is in arena %" PRIu32 ", not a registered host arena",
				b->epoch, b->seq, b->arena);
		}
		q->host = c->ccopy ? (const uint8_t *)a->base + b->offset : NULL;
		q->pub.count = b->count;
		q->pub.picks = picks;
		q->pub.nfields = c->nfields;
		q->pub.data = ptrs;
		q->pub.on_device = a->kind != PF__ARENA_KIND__ARENA_HOST_MEMFD;
		if (b->gather) {
			rc = launch_gather(c, q, b, a);
			if (rc) {
				free(q);
				return rc;
			}
		}
		slot_mark(c, b->slot, true);
	} else {
		q->message = strdup(b->message ? b->message : "");
		if (!q->message) {
			free(q);
			return pfc_conn_fail(c, -ENOMEM, "out of memory");
		}
	}
	fifo_push(&c->queue, &q->queued);
	c->nqueued++;
	c->next_seq++;
	return data && c->ccopy ? pfc_copy_ahead(c) : 0;
}

int pfc_handle_unasked(struct pf_client *c, Pf__Envelope *env)
{
	if (env->id != 0) {
		/* The reply to a request that timed out earlier. */
		pf__envelope__free_unpacked(env, NULL);
		return 0;
	}
	return pfc_handle_push(c, env);
}

/* Handles one push (id 0); takes env. */
int pfc_handle_push(struct pf_client *c, Pf__Envelope *env)
{
	int rc = 0;

	/* Gathers waiting for a group launch go first: a slab dropped or
	 * replaced next must not change what they read. */
	if (c->ngroup && env->msg_case != PF__ENVELOPE__MSG_BATCH) {
		rc = pfc_gather_flush(c);
		if (rc) {
			pf__envelope__free_unpacked(env, NULL);
			return rc;
		}
	}
	switch (env->msg_case) {
	case PF__ENVELOPE__MSG_ARENA: rc = pfc_add_arena(c, env->arena); break;
	case PF__ENVELOPE__MSG_BATCH: {
		int64_t t0 = PFC_T0(c);

		c->counts.frames++;
		rc = add_batch(c, env->batch);
		PFC_TADD(c, batch_ns, t0);
		break;
	}
	case PF__ENVELOPE__MSG_POOL_SLAB: rc = pfc_add_pool_slab(c, env->pool_slab); break;
	case PF__ENVELOPE__MSG_POOL_SLAB_GONE:
		rc = pfc_pool_slab_gone(c, env->pool_slab_gone);
		break;
	case PF__ENVELOPE__MSG_END:
		if (env->end->epoch == c->epoch && c->epoch_live)
			c->epoch_ended = true;
		break;
	case PF__ENVELOPE__MSG_ERROR:
		/* A refused Ack or Release.  The first one is kept: it is the
		 * cause, later ones are usually its consequences. */
		if (!c->pending_err) {
			c->pending_err = pfc_sane_code(env->error->code);
			snprintf(c->pending_msg, sizeof(c->pending_msg), "prefetchd: %s",
				 env->error->message ? env->error->message : "");
		}
		break;
	default:
		rc = pfc_conn_fail(c, -EPROTO, "%s pushed an unexpected %s message", c->where,
				   wire_msg_name(env->msg_case));
		break;
	}
	pf__envelope__free_unpacked(env, NULL);
	return rc;
}

int pfc_take_in(struct pf_client *c, Pf__Envelope *first)
{
	int rc = 0, frc;

	c->grouping = true;
	if (first)
		rc = pfc_handle_unasked(c, first);
	while (!rc) {
		Pf__Envelope *env;

		if (c->dead) {
			rc = pfc_fail_dead(c);
			break;
		}
		rc = pfc_next_frame(c, &env);
		if (rc <= 0)
			break;
		rc = pfc_handle_unasked(c, env);
	}
	c->grouping = false;
	frc = pfc_gather_flush(c);
	return rc ? rc : frc;
}

int pfc_read_buffered(struct pf_client *c)
{
	return pfc_take_in(c, NULL);
}

int pfc_read_now(struct pf_client *c)
{
	int rc = pfc_fill_now(c);

	return rc ? rc : pfc_take_in(c, NULL);
}

/* ---- taking batches ------------------------------------------------------ */

/* The honest-depth probe: free device memory now, as the trainer sees it. */
int pfc_send_probe(struct pf_client *c)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__Probe msg = PF__PROBE__INIT;
	uint64_t free_b, total_b;
	char err[200];
	int rc;

	c->last_probe_ns = mono();
	rc = pfcuda_mem_info(c->cuda, &free_b, &total_b, err, sizeof(err));
	if (rc)
		return pfc_set_err(c, rc, "probe: %s", err);
	msg.free_bytes = free_b;
	msg.total_bytes = total_b;
	env.msg_case = PF__ENVELOPE__MSG_PROBE;
	env.probe = &msg;
	return pfc_send(c, &env);
}

/* Probes at every epoch's second batch (the trainer's first step of the
 * epoch has run: an evaluation pass or a grown model shows), and in between
 * every probe_interval_s.  Best effort: a failed read only skips this one. */
static void maybe_probe(struct pf_client *c)
{
	int64_t now;

	if (!c->cuda || c->epoch_batches < 2)
		return;
	if (c->epoch_batches == 2) {
		pfc_send_probe(c);
		return;
	}
	now = mono();
	if (c->last_probe_ns &&
	    (c->probe_interval_s <= 0 || now - c->last_probe_ns < c->probe_interval_s * 1e9))
		return;
	pfc_send_probe(c);
}

/* Queues the Ack of batch b (corked, it waits for the next write). */
static int send_ack(struct pf_client *c, struct pfc_batch *b)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__Ack ack = PF__ACK__INIT;

	ack.epoch = b->pub.epoch;
	ack.seq = b->pub.seq;
	ack.wait_s = c->wait_s;
	ack.busy_s = c->busy_s;
	env.msg_case = PF__ENVELOPE__MSG_ACK;
	env.ack = &ack;
	return pfc_send(c, &env);
}

int pfc_ack_ahead(struct pf_client *c)
{
	struct pfc_batch *b;
	int rc;

	if (!c->queue.head || c->dead)
		return 0;
	b = container_of(c->queue.head, struct pfc_batch, queued);
	if (b->acked || b->slot < 0 || (c->ccopy && b->dbuf < 0))
		return 0;
	rc = send_ack(c, b);
	if (!rc)
		b->acked = true;
	return rc;
}

/* Takes the head of the queue: acks it and hands it to the trainer. */
int pfc_take(struct pf_client *c, struct pf_batch **batch)
{
	struct pfc_batch *b = container_of(fifo_pop(&c->queue), struct pfc_batch, queued);
	int rc;

	c->nqueued--;
	/* Every pass that takes frames in launches its group before it
	 * returns: a batch here is never still waiting for its gather. */
	assert(c->ngroup == 0);
	/* Before the Ack: a batch that cannot be copied is not taken (a
	 * reconnection delivers it again).  Most were copied ahead. */
	if (c->ccopy && b->slot >= 0 && b->host) {
		rc = pfc_copy_batch(c, b, false);
		if (rc) {
			pfc_drop_untaken(c, b);
			return rc;
		}
	}

	/* With the Releases pf_next has corked, in one write, now: a batch
	 * whose Ack cannot go is not taken.  One acked at the release before
	 * it (pfc_ack_ahead) needs no Ack of its own: whatever is corked goes
	 * now, and with nothing to write a poll, which asks nothing of the
	 * daemon, says whether it is still there, as the write would have. */
	if (b->acked) {
		rc = c->out_len ? pfc_uncork(c) : pfc_check_peer(c);
	} else {
		rc = send_ack(c, b);
		if (!rc)
			rc = pfc_uncork(c);
	}
	if (rc) {
		/* Not taken: a restarted epoch delivers it again. */
		pfc_drop_untaken(c, b);
		return rc;
	}
	c->resume_seq = b->pub.seq + 1;
	if (b->error) {
		char head[64];

		c->epoch_batches++; /* taken, as far as paced requests go */
		c->error_batch = true;
		/* The daemon's own text already names the batch (sess_base.c):
		 * the prefix goes only on a message that does not. */
		snprintf(head, sizeof(head), "epoch %" PRIu64 " batch %" PRIu64 ": ", b->pub.epoch,
			 b->pub.seq);
		rc = pfc_set_err(c, b->error, "%s%s",
				 strncmp(b->message, head, strlen(head)) ? head : "", b->message);
		pfc_free_batch(b);
		return rc;
	}
	if (b->gather_ev) {
		/* The trainer's stream waits for the batch's assembly, a gather
		 * or a copy (should the wait fail, the CPU waits instead).  The
		 * event stays with the batch: its release waits for it too, on
		 * whatever stream the trainer releases it (pfc_release_after).
		 * A batch of the launch the stream last waited for needs no
		 * wait of its own: that wait covers the whole launch. */
		char why[256];
		int64_t t0 = PFC_T0(c);
		bool waited = !c->sync_take && c->use_stream != PFC_STREAM_PER_THREAD &&
			      c->waited_ev == b->gather_ev && c->waited_use == b->gather_ev->use &&
			      c->waited_on == c->use_stream;

		why[0] = '\0';
		if (!waited && !c->sync_take) {
			c->counts.waits++;
			waited = !pfcuda_stream_wait(c->cuda, c->use_stream, b->gather_ev->ev, NULL,
						     0);
			PFC_TADD(c, event_ns, t0);
			if (waited) {
				c->waited_ev = b->gather_ev;
				c->waited_use = b->gather_ev->use;
				c->waited_on = c->use_stream;
			}
		}
		if (!waited)
			rc = pfcuda_event_sync(c->cuda, b->gather_ev->ev, why, sizeof(why));
		else {
			b->waited = true;
			b->waited_stream = c->use_stream;
		}
		if (rc) {
			uint64_t seq = b->pub.seq;

			pfc_drop_untaken(c, b);
			return pfc_conn_fail(c, rc,
					     "batch %" PRIu64
					     ": the copy or gather that assembles it failed: %s",
					     seq, why);
		}
	}
	b->next = c->held;
	c->held = b;
	c->nheld++;
	c->batches++;
	c->epoch_batches++;
	c->bytes += b->bytes;
	*batch = &b->pub;
	maybe_probe(c);
	return 0;
}

/* Waits until deadline for the queue to have a batch or the epoch to end
 * (0 either way), or for an error. */
int pfc_wait_batch(struct pf_client *c, int64_t deadline, int timeout_ms, int64_t *blocked_since)
{
	int rc;

	if (c->dead)
		return pfc_fail_dead(c);
	/* Releases the lanes have settled since the last call: their device
	 * buffers are free again (client copies), their events idle. */
	pfc_settle_collect(c);
	for (;;) {
		Pf__Envelope *env;

		if (c->pending_err) {
			rc = pfc_set_err(c, c->pending_err, "%s", c->pending_msg);
			c->pending_err = 0;
			return rc;
		}
		/* A client that copies also needs a free device buffer, which
		 * a lane gives back once the trainer's work on it retired. */
		if (c->queue.head ? pfc_can_take(c) : !c->epoch_live || c->epoch_ended)
			return 0;
		if (!*blocked_since)
			*blocked_since = mono();
		/* Blocked in poll until a frame comes or, for a client waiting
		 * for a buffer, a lane gives one back: the Releases the daemon
		 * needs to send more go from the lanes themselves, so nothing
		 * here polls the GPU. */
		rc = c->ccopy && c->queue.head ? pfc_read_env_or_buffer(c, deadline, &env)
					       : pfc_read_env(c, deadline, &env);
		if (rc == -EAGAIN) {
			pfc_settle_woken(c);
			continue;
		}
		if (rc == -ETIMEDOUT)
			return pfc_set_err(c, rc, "no batch from %s within %d ms", c->where,
					   timeout_ms);
		if (rc)
			return rc;
		/* A session whose batches this client gathers takes this frame
		 * and the others of the same read in one pass, so that their
		 * gathers go in one launch.  Others take one frame at a time: a
		 * frame after a batch is only read once that batch is taken. */
		rc = c->gathers ? pfc_take_in(c, env) : pfc_handle_unasked(c, env);
		if (rc)
			return rc;
	}
}
