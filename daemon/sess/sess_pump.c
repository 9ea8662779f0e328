/*
 * sess_pump.c — a session's slot state machine and in-order delivery (see
 * sess.h): batches handed to the readers in parts, their completions, and
 * the pump that sends every READY batch whose turn has come and starts
 * fills while the governor allows; and the slots dropped when their batch
 * will not be sent (sess_drop_slot).  Below sess.c and sess_epoch.c; above
 * the CUDA half, which pumps a session only through s->cuda.pump, and
 * sess_base.c (sess_int.h).
 *
 * DESIGN: loop thread only; no locks.  Everything a reader thread needs is
 * copied into its job (sample numbers) or borrowed from memory that lives
 * until the job is back (the slot, the field offsets, the dataset).  The
 * pump runs after every event that can unblock it (a job back, an ack, a
 * release, an epoch start).
 */
#include "sess/sess_int.h"

#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/bigmem.h"
#include "base/streamcopy.h"
#include "data/blocks.h"
#include "state/daemon.h"
#include "data/dataset.h"
#include "base/log.h"
#include "data/reader.h"
#include "util.h"
#include "wire.h"

static struct slot *find_slot(struct sess *s, uint64_t epoch, uint64_t seq, enum slot_state st)
{
	for (uint32_t i = 0; i < s->nslots; i++) {
		struct slot *sl = &s->slots[i];

		if (sl->state == st && sl->epoch == epoch && sl->seq == seq)
			return sl;
	}
	return NULL;
}

static struct slot *free_slot(struct sess *s)
{
	for (uint32_t i = 0; i < s->nslots; i++)
		if (s->slots[i].state == SLOT_FREE && s->slots[i].present)
			return &s->slots[i];
	return NULL;
}

/* The ring slot of sl (CUDA sessions) is free again. */
static void put_ring_slot(struct sess *s, struct slot *sl)
{
	ring_slot_put(&s->cuda.lease, sl->ring);
	sl->ring = -1;
}

/* The loop's scratch for a BatchReady's 4-byte picks: packed just before
 * the frame is encoded, which copies them, so one buffer grown to the
 * largest batch serves every session (a buffer per session would take a
 * client's memory quota for what lives a microsecond).  Loop thread only;
 * kept for the daemon's life. */
static uint32_t *picks32_scratch;
static size_t picks32_cap;

/* picks32_scratch with room for count picks, or NULL (out of memory: the
 * batch's picks then go as the session's 8-byte form). */
static uint32_t *picks32_room(uint32_t count)
{
	if (count > picks32_cap) {
		uint32_t *p = realloc(picks32_scratch, (size_t)count * sizeof(*p));

		if (!p)
			return NULL;
		picks32_scratch = p;
		picks32_cap = count;
	}
	return picks32_scratch;
}

/* The picks of a BatchReady of count picks, from picks (NULL: sized, not
 * filled).  Called last before the frame is encoded: the 4-byte form lies
 * in the loop's scratch until then. */
static void batch_msg_picks(const struct sess *s, Pf__BatchReady *msg, uint32_t count,
			    const uint64_t *picks)
{
	uint32_t *packed;

	msg->count = count;
	if (s->picks32 && (!picks || (packed = picks32_room(count)))) {
		/* Half the bytes of picks_le to encode, send, read, decode
		 * and copy into the batch: the client's CPU per batch is
		 * what bounds a warm pool's tight loop (bench/NOTES.md). */
		uint64_t high = 0;

		msg->picks_le32.len = (size_t)count * sizeof(uint32_t);
		if (!picks)
			return;
		for (uint32_t i = 0; i < count; i++) {
			packed[i] = htole32((uint32_t)picks[i]);
			high |= picks[i] >> 32;
		}
		msg->picks_le32.data = (uint8_t *)packed;
		if (!high)
			return;
		/* A paced error batch echoes the client's picks, in range or
		 * not: those go whole, in the session's 8-byte form. */
		msg->picks_le32.len = 0;
		msg->picks_le32.data = NULL;
	}
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	/* The picks as they lie in memory, for a client that takes them so:
	 * no varint per row on either side. */
	if (s->picks_le) {
		msg->picks_le.len = (size_t)count * sizeof(uint64_t);
		msg->picks_le.data = (uint8_t *)picks;
	} else
#endif
	{
		msg->n_picks = count;
		msg->picks = (uint64_t *)picks;
	}
}

size_t sess_batch_frame_bytes(const struct sess *s, uint64_t epoch, uint64_t nbatches)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__BatchReady msg = PF__BATCH_READY__INIT;
	const struct slot *last = &s->slots[s->nslots - 1];

	if (!s->picks32 && (!s->picks_le || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__))
		return 0;
	/* Each field at the most it takes this epoch: the size, rounded as
	 * bigmem rounds it, is every full batch's. */
	msg.epoch = epoch;
	msg.seq = nbatches ? nbatches - 1 : 0;
	msg.slot = (int32_t)(s->nslots - 1);
	msg.arena = last->arena;
	msg.offset = last->offset;
	batch_msg_picks(s, &msg, s->batch_size, NULL);
	env.msg_case = PF__ENVELOPE__MSG_BATCH;
	env.batch = &msg;
	return wire_frame_size(&env);
}

static int send_batch(struct sess *s, struct slot *sl)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__BatchReady msg = PF__BATCH_READY__INIT;
	uint32_t count = sess_batch_count(s, sl->seq);
	uint64_t staged_off[GPU_GATHER_MAX_FIELDS];
	int rc;

	msg.epoch = sl->epoch;
	msg.seq = sl->seq;
	if (sl->error) {
		msg.slot = -1;
		msg.error = sl->error;
		msg.message = sl->errmsg;
	} else {
		msg.slot = (int32_t)(sl - s->slots);
		msg.arena = sl->arena;
		msg.offset = sl->offset;
		if (sl->plan.active && sl->plan.ids) {
			rc = sess_cuda_gather_msg(s, sl, &msg, staged_off);
			if (rc) {
				/* Out of memory or of descriptors: the batch stays
				 * ready and goes with the next kick. */
				log_err("session %" PRIu64
					": cannot export a pool slab for batch %" PRIu64 ": %s",
					s->id, sl->seq, strerror(-rc));
				return rc;
			}
		}
	}
	batch_msg_picks(s, &msg, count, sess_batch_picks(s, sl->seq));
	env.msg_case = PF__ENVELOPE__MSG_BATCH;
	env.batch = &msg;
	rc = peer_send(s->peer, &env, -1);
	if (s->paced)
		sess_req_clear(s, sess_paced_req(s, sl->seq)); /* packed: its picks are sent */
	if (sl->error) {
		s->errors++;
		free(sl->errmsg);
		sl->errmsg = NULL;
		sl->error = 0;
		sl->state = SLOT_FREE;
	} else {
		sl->state = SLOT_SENT;
		s->bytes_sent += (uint64_t)count * s->ds->sample_bytes;
		sl->t_sent = now_ns();
		if (s->gpu >= 0 && sl->t_ready) {
			s->timing.read += sl->t_copy - sl->t_fill;
			s->timing.device += sl->t_ready - sl->t_copy;
			s->timing.turn += sl->t_sent - sl->t_ready;
			s->timing.batches++;
		}
	}
	s->sent++;
	if (!s->timing.first_sent) {
		s->timing.first_sent = true;
		log_debug("session %" PRIu64 ": epoch %" PRIu64 ": first batch sent %.2f ms after "
			  "StartEpoch",
			  s->id, s->epoch, (now_ns() - s->epoch_started_ns) / 1e6);
	}
	return rc;
}

int sess_send_again(struct sess *s, const struct slot *sl, const struct peer *to)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__BatchReady msg = PF__BATCH_READY__INIT;

	/* Plain slots only (a share's producer): a gathered batch's message
	 * also carries its staging, which went with the first send. */
	if (sl->state != SLOT_SENT || sl->plan.active)
		return -EINVAL;
	msg.epoch = sl->epoch;
	msg.seq = sl->seq;
	msg.slot = (int32_t)(sl - s->slots);
	msg.arena = sl->arena;
	msg.offset = sl->offset;
	batch_msg_picks(s, &msg, sess_batch_count(s, sl->seq), sess_batch_picks(s, sl->seq));
	env.msg_case = PF__ENVELOPE__MSG_BATCH;
	env.batch = &msg;
	return peer_send(to, &env, -1);
}

static int send_end(struct sess *s)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__EpochEnd msg = PF__EPOCH_END__INIT;
	const struct sess_timing *t = &s->timing;

	if (t->batches)
		log_debug("session %" PRIu64 ": epoch %" PRIu64 " per batch: read %.1f us, "
			  "device %.1f us, waiting its turn %.1f us, with the client %.1f "
			  "us, pool planning %.1f us (%" PRIu64 " batches)",
			  s->id, s->epoch, t->read / 1e3 / t->batches, t->device / 1e3 / t->batches,
			  t->turn / 1e3 / t->batches, t->client / 1e3 / t->batches,
			  t->plan / 1e3 / t->batches, t->batches);
	log_debug("session %" PRIu64 ": epoch %" PRIu64 " done, %" PRIu64 " batches", s->id,
		  s->epoch, s->nbatches - s->start_batch);
	msg.epoch = s->epoch;
	msg.batches = s->nbatches - s->start_batch;
	env.msg_case = PF__ENVELOPE__MSG_END;
	env.end = &msg;
	return peer_send(s->peer, &env, -1);
}

void sess_drop_slot(struct sess *s, struct slot *sl)
{
	if (sl->state == SLOT_READY) {
		sess_cuda_unpin(s, sl);
		free(sl->errmsg);
		sl->errmsg = NULL;
		sl->error = 0;
		sl->state = SLOT_FREE;
	} else if (sl->state == SLOT_FILLING || sl->state == SLOT_COPYING) {
		sl->state = SLOT_ORPHAN;
	}
}

/*
 * A file of the session's dataset changed on disk (ds->changed): batch
 * `last`, an error batch saying so, is the epoch's last.  Batches after it
 * are not sent (sess_drop_slot), and paced requests after it go.  Batches
 * before it are delivered: they were read before the change was found, as
 * batches already sent were.  Only ever shortens the epoch, so the first
 * such batch in stream order is the one the trainer sees last.
 *
 * The session keeps the dataset it opened, so its later epochs are
 * refused with the same message (sess_start_epoch); new sessions read the
 * files as they are now, once a reload has loaded them anew.
 */
static void end_epoch_at(struct sess *s, uint64_t last)
{
	if (last >= s->nbatches)
		return;
	for (uint32_t i = 0; i < s->nslots; i++)
		if (s->slots[i].epoch == s->epoch && s->slots[i].seq > last)
			sess_drop_slot(s, &s->slots[i]);
	if (s->paced) {
		for (uint64_t q = last + 1; q < s->nbatches; q++)
			sess_req_clear(s, sess_paced_req(s, q));
		s->paced_end = true;
	}
	s->nbatches = last + 1;
	if (s->next_fill > s->nbatches)
		s->next_fill = s->nbatches;
}

/* Hands batch next_fill to the readers (fill_split).  The slot is FILLING
 * until every part is back.  A pooled batch reads only its staged rows
 * (none when every row is a hit: it goes straight to the transfer
 * thread). */
static int start_fill(struct sess *s, struct slot *sl, int32_t ring)
{
	uint32_t count = sess_batch_count(s, s->next_fill);
	const uint64_t *picks = sess_batch_picks(s, s->next_fill);
	const uint64_t *rows = NULL; /* NULL: the picks themselves */
	const uint64_t *field_offset = s->lay.field_offset;
	uint32_t main_rows = count, extra = 0;
	struct reader_job *jobs[FILL_MAX_PARTS + 1];
	uint8_t *dst;
	int nparts;

	if (s->ds->changed[0]) {
		ring_slot_put(&s->cuda.lease, ring); /* nothing more is read */
		sess_fill_error(s, sl, -ESTALE, s->ds->changed);
		end_epoch_at(s, sl->seq);
		return 0;
	}
	if (s->paced && sess_paced_req(s, s->next_fill)->error) {
		const struct sess_req *r = sess_paced_req(s, s->next_fill);

		ring_slot_put(&s->cuda.lease, ring); /* nothing to stage */
		sess_fill_error(s, sl, r->error, r->errmsg ? r->errmsg : "bad request");
		return 0;
	}
	sl->ring = ring;
	sl->ids_inline = false;
	sl->t_fill = now_ns();
	if (s->cuda.pool && s->cuda.pool->enabled) {
		sl->stage_bytes = fill_plan(s->cuda.pool, s->ds, picks, count, s->cuda.stage_cap,
					    s->cuda.gather, ring_slot_mem(&s->cuda.lease, ring),
					    &sl->plan, sl->stage_off);
		rows = sl->plan.staged;
		main_rows = sl->plan.nstaged;
		field_offset = sl->stage_off;
		s->timing.plan += now_ns() - sl->t_fill;
		/* Admit-only rows (back-fill) are read as a part of their
		 * own: if they cannot be read the batch's own rows still go
		 * out. */
		if (sl->plan.nstaged > sl->plan.nmiss) {
			extra = sl->plan.nstaged - sl->plan.nmiss;
			main_rows = sl->plan.nmiss;
		}
	}
	/* A pool turned on during a block-cached epoch: this batch's rows
	 * are hits or staged misses, not the cache's. */
	if (s->blocks && sl->plan.active)
		blocks_skip(s->blocks, picks, count);
	if (!rows && !sl->rows) {
		sl->rows = big_alloc((size_t)s->batch_size * sizeof(uint64_t));
		if (!sl->rows) {
			put_ring_slot(s, sl);
			return -ENOMEM;
		}
	}
	nparts = fill_split(jobs, s->ds, rows, picks, main_rows, extra, s->d->cfg.readers, sl->rows,
			    s->augment > 1);
	if (nparts < 0) {
		if (sl->plan.active)
			pool_plan_done(s->cuda.pool, &sl->plan, false);
		put_ring_slot(s, sl);
		return nparts;
	}
	dst = s->gpu >= 0 ? ring_slot_mem(&s->cuda.lease, ring) : sl->host;
	sl->state = SLOT_FILLING;
	sl->epoch = s->epoch;
	sl->seq = s->next_fill;
	sl->parts = (uint32_t)nparts;
	sl->error = 0;
	for (int p = 0; p < nparts; p++) {
		struct reader_job *job = jobs[p];

		job->owner = s;
		job->ds = s->ds;
		job->dst = dst;
		/* A client-copy arena's slot, read next by the trainer's copy
		 * engine, while the sessions fill more ahead than stays cached
		 * (sess_fill_shares).  The ring's slots are few and reused
		 * within milliseconds: they stay cached for their DMA. */
		job->dma = s->client_copy && s->d->fill_streamed;
		job->field_offset = field_offset;
		job->slot = (uint32_t)(sl - s->slots);
		job->epoch = s->epoch;
		job->seq = s->next_fill;
		/* Pooled batches read staged rows, never through the cache
		 * (their picks were counted off above). */
		job->blocks = s->blocks && !sl->plan.active ? blocks_ref(s->blocks) : NULL;
		s->jobs++;
		reader_submit(s->d->readers, job);
	}
	s->next_fill++;
	s->gov.prepared++;
	if (nparts == 0)
		sess_cuda_copy(s, sl); /* every row is in the pool */
	return 0;
}

static void on_pump_idle(uv_idle_t *h)
{
	struct daemon *d = h->data;
	bool more = false;

	for (struct sess *s = d->sessions, *next; s; s = next) {
		next = s->next;
		if (s->pump_later) {
			s->pump_later = false;
			sess_pump(s);
			/* Woken for a ring slot and took none (it wanted none
			 * after all): the next waiter's turn, or the ring would
			 * wait for it forever. */
			if (!s->pump_later && s->gpu >= 0)
				ring_turn_pass(&s->cuda.lease);
		}
	}
	for (struct sess *s = d->sessions; s && !more; s = s->next)
		more = s->pump_later;
	if (!more)
		uv_idle_stop(h);
}

/* s's turn is over: its pump goes on in the next turn of the loop, after
 * the events that came meanwhile. */
static void pump_later(struct sess *s)
{
	struct daemon *d = s->d;

	s->pump_later = true;
	if (!d->pump_idle_live) {
		uv_idle_init(d->loop, &d->pump_idle);
		d->pump_idle.data = d;
		d->pump_idle_live = true;
	}
	uv_idle_start(&d->pump_idle, on_pump_idle);
}

void sess_ring_wake(void *owner)
{
	pump_later(owner);
}

void sess_fill_shares(struct daemon *d)
{
	uint64_t budget = daemon_fill_bytes(d), n = 0, ahead = 0;
	bool streamed;

	for (struct sess *s = d->sessions; s; s = s->next)
		n += s->gpu < 0;
	for (struct sess *s = d->sessions; s; s = s->next) {
		uint64_t share;
		uint32_t was = gov_limit(&s->gov);

		if (s->gpu >= 0)
			continue;
		share = budget / n / (s->lay.slot_stride ? s->lay.slot_stride : 1);
		if (share < s->gov.min_depth)
			share = s->gov.min_depth;
		s->gov.share = share < UINT32_MAX ? (uint32_t)share : UINT32_MAX;
		snprintf(s->share_why, sizeof(s->share_why),
			 "fill_bytes = %.0f MiB shared by %" PRIu64
			 " session(s): %u batch(es) each",
			 budget / 1048576.0, n, s->gov.share);
		/* Room it did not have: it fills in the loop's next turn (not
		 * here, inside another session's open or close). */
		if (gov_limit(&s->gov) > was && s->running)
			pump_later(s);
		ahead += (uint64_t)gov_limit(&s->gov) * s->lay.slot_stride;
	}
	/* What they fill ahead together, manual targets included: past the
	 * budget (the shares' floor of min_depth, or a depth set by hand),
	 * slot lines no longer stay cached until their copy, and a streamed
	 * store saves the read of each one.  Measured (bench/NOTES.md, runs
	 * 34, 70-71): 16 client-copy sessions (80 MiB ahead of a 75 MiB
	 * budget) +10% with streaming; 4 (60 MiB) no difference; one session
	 * whose slots stay cached -10 to -20% (daemon copies, run 34). */
	streamed = ahead > budget && copy_streaming();
	if (streamed != d->fill_streamed)
		log_info("client-copy fills: %s stores (host sessions fill %.0f MiB ahead, "
			 "fill_bytes %.0f MiB)",
			 streamed ? "streaming" : "plain", ahead / 1048576.0, budget / 1048576.0);
	d->fill_streamed = streamed;
}

void sess_pump_stop(struct daemon *d)
{
	if (d->pump_idle_live) {
		uv_idle_stop(&d->pump_idle);
		uv_close((uv_handle_t *)&d->pump_idle, NULL);
		d->pump_idle_live = false;
	}
}

void sess_pump(struct sess *s)
{
	struct slot *sl;
	int32_t ring = -1;
	uint64_t work = 0; /* bytes of picks copied or packed this turn */

	if (s->dead || !s->peer || !s->running || s->d->stopping || s->pump_later)
		return;
again:
	while (s->next_send < s->nbatches &&
	       (sl = find_slot(s, s->epoch, s->next_send, SLOT_READY))) {
		bool fills;

		/* Flow control: a client that reads slower than its batches
		 * come (big batches of small samples) gets them as fast as
		 * it reads; the server kicks the pump when it has read. */
		if (peer_busy(s->peer))
			return;
		if (work >= SESS_TURN_BYTES) {
			pump_later(s);
			return;
		}
		work += (uint64_t)sess_batch_count(s, sl->seq) * sizeof(uint64_t);
		/* A batch with staged rows may have admitted some into new
		 * slabs: those go to a client that gathers as they fill, not
		 * all at the next StartEpoch.  Each costs the trainer 0.15-0.4
		 * ms to map (16 of 256 MiB for 4 GiB), which the filling epoch
		 * hides and the first warm one would pay (bench/NOTES.md, run
		 * 37: 24 ms against 17 for the next). */
		fills = s->gpu >= 0 && sl->plan.nstaged > 0;
		if (send_batch(s, sl))
			return;
		s->next_send++;
		if (fills)
			sess_cuda_push_pool(s);
	}
	if (s->next_send == s->nbatches && (!s->paced || s->paced_end)) {
		s->running = false;
		send_end(s);
		return;
	}
	/* An epoch whose order is still being built fills nothing yet; its
	 * first device arena is asked for meanwhile, so that the first batch
	 * does not wait for the order and then for the arena. */
	if (s->building && s->gpu >= 0 && !s->cuda.npresent)
		sess_cuda_grow(s);
	while (!s->building && s->next_fill < s->nbatches && gov_may_fill(&s->gov)) {
		sl = free_slot(s);
		if (!sl) {
			if (s->gpu >= 0)
				sess_cuda_grow(s);
			break;
		}
		if (work >= SESS_TURN_BYTES) {
			pump_later(s);
			return;
		}
		if (s->gpu >= 0 && (ring = ring_slot_get(&s->cuda.lease)) < 0)
			break;
		work += (uint64_t)sess_batch_count(s, s->next_fill) * sizeof(uint64_t);
		if (start_fill(s, sl, ring)) {
			log_err("session %" PRIu64 ": out of memory starting a read", s->id);
			return;
		}
	}
	/* A paced request that cannot be served became an error batch right
	 * in start_fill: when its turn has come, it goes now, not at whatever
	 * event comes next (a trainer waiting for it would wait forever). */
	if (s->next_send < s->nbatches && find_slot(s, s->epoch, s->next_send, SLOT_READY))
		goto again;
}

void sess_kick(struct sess *s)
{
	sess_pump(s);
}

void sess_job_done(struct reader_job *job, void *arg)
{
	struct sess *s = job->owner;
	struct slot *sl = &s->slots[job->slot];

	s->jobs--;
	s->read_ns += job->read_ns;
	sl->parts--;
	blocks_put(job->blocks);
	job->blocks = NULL;
	/* The reader found a file changed on disk: that ends the epochs of
	 * every session of the dataset (start_fill), whatever this one does. */
	if (job->rc == -ESTALE)
		daemon_dataset_changed((struct dataset *)s->ds, job->err);
	if (job->rc && !s->dead && sl->plan.active && job->first >= sl->plan.nmiss &&
	    sl->plan.nstaged > sl->plan.nmiss) {
		/* Only back-fill rows failed: they stay out of the pool, the
		 * batch's own rows are fine. */
		uint64_t admit_off;

		fill_stage_layout(s->ds, sl->plan.count, 0, &admit_off, NULL);
		log_warn("session %" PRIu64 ": %u row(s) read for the pool only were not "
			 "admitted: %s",
			 s->id, job->count, job->err);
		pool_plan_drop_rows(
			s->cuda.pool, &sl->plan, job->first, job->count,
			(uint64_t *)(ring_slot_mem(&s->cuda.lease, sl->ring) + admit_off));
	} else if (job->rc && !sl->error && !s->dead) {
		/* The first part's error wins. */
		sess_slot_error(s, sl, job->rc, job->rc == -ESTALE ? s->ds->changed : job->err);
		if (job->rc == -ESTALE && sl->state == SLOT_FILLING)
			end_epoch_at(s, sl->seq);
	}
	if (s->dead) {
		sess_maybe_free(s);
		goto out;
	}
	if (sl->parts > 0)
		goto out; /* the rest of the batch is still being read */
	if (sl->state == SLOT_ORPHAN || sl->error) {
		/* No copy follows: the batch's admissions are cancelled (and,
		 * after a read error, not tried again by back-fill). */
		if (sl->plan.active) {
			sl->plan.read_failed = sl->error != 0;
			pool_plan_done(s->cuda.pool, &sl->plan, false);
		}
	}
	if (sl->state == SLOT_ORPHAN) {
		put_ring_slot(s, sl);
		free(sl->errmsg);
		sl->errmsg = NULL;
		sl->error = 0;
		sl->state = SLOT_FREE;
	} else if (s->gpu >= 0 && !sl->error) {
		sess_cuda_copy(s, sl);
	} else {
		put_ring_slot(s, sl);
		sl->state = SLOT_READY;
	}
	sess_pump(s);
out:
	free(job);
}
