/*
 * sess_epoch.c — the session requests (see sess.h): StartEpoch (ordered or
 * paced), LoadBatch, Ack, Release, Abandon and Probe.  Each is checked
 * against the session's state and refused with a reply naming the problem,
 * or applied and followed by the pump.  Below sess.c; above the pump, the
 * CUDA half and sess_base.c, which it calls (sess_int.h).
 *
 * DESIGN: loop thread only; no locks.  An epoch's order is built here (or
 * taken from the one built ahead, ahead.h) before the epoch is switched,
 * so a refused start leaves the running epoch as it was.
 */
#include "sess/sess_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/bigmem.h"
#include "data/blocks.h"
#include "state/daemon.h"
#include "data/dataset.h"
#include "base/log.h"
#include "order/order.h"
#include "util.h"

/* What a paced request of n picks holds: its copy of the picks. */
static uint64_t paced_bytes(uint32_t n)
{
	return (uint64_t)(n ? n : 1) * sizeof(uint64_t);
}

/* Paced requests not yet sent go (an epoch ends or the session does). */
void sess_drop_requests(struct sess *s)
{
	if (!s->reqs)
		return;
	for (uint64_t q = s->next_send; q < s->nbatches; q++)
		sess_req_clear(s, sess_paced_req(s, q));
}

/* The running epoch's order, still being built, is not wanted any more:
 * thrown away when it comes back (build_done). */
static void cancel_build(struct sess *s)
{
	if (s->building) {
		s->building->cancelled = true;
		s->building = NULL;
	}
}

void sess_stop_epoch(struct sess *s)
{
	for (uint32_t i = 0; i < s->nslots; i++)
		sess_drop_slot(s, &s->slots[i]);
	sess_drop_requests(s);
	cancel_build(s);
	s->running = false;
}

/* What every epoch start resets, once the request has been accepted. */
static void new_epoch(struct sess *s, uint64_t epoch, uint64_t start_batch)
{
	if (s->running)
		log_info("session %" PRIu64 ": epoch %" PRIu64 " left unfinished by epoch %" PRIu64,
			 s->id, s->epoch, epoch);
	sess_stop_epoch(s);
	s->epoch = epoch;
	s->had_epoch = true;
	s->start_batch = start_batch;
	s->next_fill = s->next_send = start_batch;
	s->sent = 0;
	s->running = true;
	s->timing = (struct sess_timing){0};
	/* Its quota stays: sess_start_epoch sizes it for the new epoch. */
	sess_drop_blocks(s, false);
	gov_new_epoch(&s->gov);
	if (s->cuda.pool)
		pool_new_epoch(s->cuda.pool, s->id, epoch);
}

static void start_free(struct sess_start *st)
{
	/* Present now: the server's next frames of their size take them. */
	for (uint32_t i = 0; i < st->nframes; i++)
		big_free(st->frames[i], st->frame_bytes);
	free(st->picks);
	free((uint64_t *)st->spec.indices);
	free(st->uses);
	free(st);
}

/* An epoch with no order: the client's LoadBatch requests are its batches
 * (sess_load).  The governor loads target of them ahead, as for ordered
 * epochs; the rest wait, up to SESS_PACED_MAX. */
static int start_paced(struct sess *s, uint64_t id, const Pf__StartEpoch *req)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__EpochStarted msg = PF__EPOCH_STARTED__INIT;

	if (req->start_batch || req->n_indices || req->world > 1)
		return peer_error(s->peer, id, -EINVAL,
				  "epoch %" PRIu64 ": a paced epoch takes no start_batch, indices "
				  "or world (the client chooses every batch)",
				  req->epoch);
	if (!s->reqs) {
		char why[300];

		if (sess_take(s, &s->mem_held, SESS_PACED_MAX * sizeof(*s->reqs),
			      "the paced request table", why, sizeof(why)))
			return peer_error(s->peer, id, -ENOMEM, "%s", why);
		s->reqs = calloc(SESS_PACED_MAX, sizeof(*s->reqs));
		if (!s->reqs) {
			sess_give(s, &s->mem_held, SESS_PACED_MAX * sizeof(*s->reqs));
			return peer_error(s->peer, id, -ENOMEM, "out of memory");
		}
	}
	new_epoch(s, req->epoch, 0);
	sess_give(s, &s->blocks_held, s->blocks_held); /* no order, no block cache */
	free(s->picks);
	sess_give(s, &s->order_held, s->order_held);
	s->picks = NULL;
	s->npicks = 0;
	s->nbatches = 0;
	s->paced = true;
	s->paced_end = false;
	s->block_rows = s->window_blocks = 0;
	s->epoch_started_ns = now_ns();
	log_debug("session %" PRIu64 ": epoch %" PRIu64 " paced", s->id, s->epoch);
	msg.epoch = s->epoch;
	env.id = id;
	env.msg_case = PF__ENVELOPE__MSG_STARTED;
	env.started = &msg;
	return peer_send(s->peer, &env, -1);
}

int sess_load(struct sess *s, uint64_t id, const Pf__LoadBatch *req)
{
	struct sess_req *r;
	uint64_t space = s->ds->num_samples * s->augment;
	char why[300] = "";
	uint32_t n;

	/* The change ended this epoch (sess_pump.c): say why, not "over". */
	if (s->ds->changed[0] && s->paced && req->epoch == s->epoch)
		return peer_error(s->peer, id, -ESTALE, "epoch %" PRIu64 ": %s", req->epoch,
				  s->ds->changed);
	if (!s->paced || req->epoch != s->epoch || !s->running || s->paced_end)
		return peer_error(s->peer, id, -EINVAL,
				  "load of epoch %" PRIu64 " refused: epoch %" PRIu64
				  " of session %" PRIu64 " is %s",
				  req->epoch, s->epoch, s->id,
				  !s->paced			? "not paced"
				  : s->running && !s->paced_end ? "another epoch"
								: "over");
	if (req->end) {
		s->paced_end = true;
		sess_pump(s);
		return 0;
	}
	if (s->nbatches - s->next_send >= SESS_PACED_MAX)
		return peer_error(s->peer, id, -ENOBUFS,
				  "more than %d paced batches requested and not yet delivered: "
				  "take some first",
				  SESS_PACED_MAX);
	n = req->n_picks < s->batch_size ? (uint32_t)req->n_picks : s->batch_size;
	/* Admitted only while the quota keeps room for one more request of
	 * its size: the connection's receive buffer, which the quota counts
	 * too, must be able to take the client's next request in order to
	 * refuse it, rather than close the connection for want of room (a
	 * flood in test_integration_limits, where the last admission could
	 * leave the buffer no room to grow). */
	if (sess_take(s, &s->paced_held, 2 * paced_bytes(n),
		      "a paced batch (with room to receive the next)", why, sizeof(why)))
		return peer_error(s->peer, id, -ENOMEM, "%s", why);
	sess_give(s, &s->paced_held, paced_bytes(n));
	r = sess_paced_req(s, s->nbatches);
	memset(r, 0, sizeof(*r));
	r->count = n;
	r->held = paced_bytes(n);
	if (req->n_picks == 0)
		snprintf(why, sizeof(why), "a paced batch needs at least one pick");
	else if (req->n_picks > s->batch_size)
		snprintf(why, sizeof(why), "%zu picks asked for, more than batch_size %u",
			 req->n_picks, s->batch_size);
	for (size_t i = 0; !why[0] && i < req->n_picks; i++)
		if (req->picks[i] >= space)
			snprintf(why, sizeof(why),
				 "pick %" PRIu64
				 " at position %zu is out of range (the dataset has "
				 "%" PRIu64 " picks)",
				 req->picks[i], i, space);
	r->picks = malloc(paced_bytes(r->count));
	if (!r->picks) {
		sess_req_clear(s, r);
		return peer_error(s->peer, id, -ENOMEM, "out of memory");
	}
	if (r->count) /* picks is NULL when there are none */
		memcpy(r->picks, req->picks, r->count * sizeof(*r->picks));
	if (why[0]) {
		r->error = req->n_picks > s->batch_size || req->n_picks == 0 ? -EINVAL : -ERANGE;
		r->errmsg = strdup(why);
	}
	s->nbatches++;
	sess_pump(s);
	return 0;
}

/* After a shuffled or block-shuffled epoch started: the next one's order,
 * built ahead when the uid's quota has room for it (it is only a head
 * start). */
static void plan_ahead(struct sess *s, const struct order_spec *spec, uint64_t space)
{
	uint64_t peak, keep;

	if (spec->kind != ORDER_SHUFFLE && spec->kind != ORDER_BLOCK_SHUFFLE)
		return;
	order_memory(spec, space, &peak, &keep);
	if (!s->ahead.busy) /* a finished order nobody took is built anew */
		sess_give(s, &s->ahead_held, s->ahead_held);
	if (s->ahead_held < peak &&
	    sess_take(s, &s->ahead_held, peak - s->ahead_held, "the next epoch's order", NULL, 0))
		return;
	ahead_epoch_started(&s->ahead, spec, space);
}

/* The order ahead is back: it keeps the quota of its share only. */
void sess_ahead_back(struct sess *s)
{
	struct ahead *a = &s->ahead;

	if (!a->busy)
		sess_give(s, &s->ahead_held,
			  s->ahead_held - (a->ready ? a->npicks * sizeof(uint64_t) : 0));
}

/* The order of the running epoch is here (built, or taken from the one
 * built ahead): batches may be filled, and the next epoch's built ahead. */
static void take_order(struct sess *s, struct sess_start *st)
{
	s->picks = st->picks;
	st->picks = NULL;
	s->order_spec = st->spec;
	s->order_space = st->space;
	s->order_held = st->held; /* the same uid's: the counter moves */
	st->held = 0;
	log_debug("session %" PRIu64 ": epoch %" PRIu64 ": order of %" PRIu64
		  " picks ready in %.1f ms",
		  s->id, s->epoch, s->npicks, (now_ns() - st->t_req) / 1e6);
	plan_ahead(s, &st->spec, st->space);
}

/* The big buffers the loop will write first in an epoch whose order is
 * built (a share of nshare picks, nbatches batches from start_batch),
 * mapped now and made present by the build (sess_start.rows, .frames): a
 * first write would otherwise fault them in on the loop, which may cost
 * more than a whole turn (bigmem.h).  The slots that will be filled first
 * get their sample numbers now rather than at their first fill; the first
 * frames are taken against the uid's memory quota until they are back. */
static void plan_warm(struct sess *s, struct sess_start *st, uint64_t epoch, uint64_t nshare,
		      uint64_t nbatches, uint64_t start_batch)
{
	uint64_t left = nbatches - start_batch, full = nshare / s->batch_size;
	size_t fb = sess_batch_frame_bytes(s, epoch, nbatches);
	uint32_t nframes;

	st->rows_bytes = (size_t)s->batch_size * sizeof(uint64_t);
	/* A pool session's readers take the rows its plan stages instead. */
	if (st->rows_bytes >= BIGMEM_MIN && !(s->cuda.pool && s->cuda.pool->enabled)) {
		for (uint32_t i = 0; i < s->nslots && left && st->nrows < SESS_WARM_ROWS; i++) {
			struct slot *sl = &s->slots[i];

			/* The trainer holds a sent slot: the pump takes others. */
			if (!sl->present || sl->state == SLOT_SENT)
				continue;
			left--;
			if (!sl->rows && (sl->rows = big_alloc(st->rows_bytes)))
				st->rows[st->nrows++] = sl->rows;
		}
	}
	full = full > start_batch ? full - start_batch : 0;
	nframes = full < SESS_WARM_FRAMES ? (uint32_t)full : SESS_WARM_FRAMES;
	if (fb < BIGMEM_MIN || !nframes || nframes * big_size(fb) > BIGMEM_CACHE ||
	    sess_take(s, &st->held, nframes * big_size(fb), "the epoch's first BatchReady frames",
		      NULL, 0))
		return;
	st->frame_bytes = fb;
	while (st->nframes < nframes && (st->frames[st->nframes] = big_alloc(fb)))
		st->nframes++;
}

static void build_work(uv_work_t *w)
{
	struct sess_start *st = container_of(w, struct sess_start, work);

	order_lower_priority();
	if (!st->count_only)
		st->rc = order_build(&st->spec, st->space, &st->picks, &st->npicks, st->err,
				     sizeof(st->err));
	if (!st->rc && st->want_uses) {
		uint64_t first, count, nb;

		/* Only the batches this epoch serves read their blocks. */
		order_served(st->npicks, st->batch_size, st->drop_last, st->start_batch, &first,
			     &count);
		if (order_block_uses(st->picks + first, count, st->spec.samples,
				     st->spec.block_rows, &st->uses, &nb))
			st->uses = NULL; /* the epoch goes on reading rows */
	}
	for (uint32_t i = 0; i < st->nrows; i++)
		big_prefault(st->rows[i], st->rows_bytes);
	for (uint32_t i = 0; i < st->nframes; i++)
		big_prefault(st->frames[i], st->frame_bytes);
}

static void build_done(uv_work_t *w, int status)
{
	struct sess_start *st = container_of(w, struct sess_start, work);
	struct sess *s = st->s;

	s->jobs--;
	s->builds--;
	if (st->cancelled || s->dead) {
		sess_give(s, &st->held, st->held);
		start_free(st);
		sess_maybe_free(s);
		return;
	}
	s->building = NULL;
	if (status || st->rc) {
		/* Every check passed when the epoch started, so only memory
		 * can fail here: the epoch ends with an error batch saying
		 * so, in the place of its first. */
		struct slot *sl = NULL;

		for (uint32_t i = 0; i < s->nslots && !sl; i++)
			if (s->slots[i].state == SLOT_FREE)
				sl = &s->slots[i];
		if (sl) {
			s->nbatches = s->next_fill + 1;
			sess_fill_error(s, sl, status ? status : st->rc,
					st->err[0] ? st->err : "building the epoch's order failed");
		} else {
			s->nbatches = s->next_send;
		}
		sess_give(s, &st->held, st->held);
		start_free(st);
		sess_pump(s);
		return;
	}
	/* Built: the share is what stays. */
	sess_give(s, &st->held, st->held - st->npicks * sizeof(uint64_t));
	take_order(s, st);
	if (st->want_uses) {
		s->blocks = st->uses ? blocks_new(s->ds, s->block_rows, st->uses) : NULL;
		st->uses = NULL; /* blocks_new took it, whatever came of it */
		if (!s->blocks)
			log_warn("session %" PRIu64 ": epoch %" PRIu64 ": no block cache (out of "
				 "memory): its rows are read one by one",
				 s->id, s->epoch);
	}
	start_free(st);
	sess_pump(s);
}

/* The last epoch's order, taken (with its quota, into *held) when it is
 * the sequential order spec asks for: the same share of the same space is
 * the same list every epoch, so the epoch starts without a build for the
 * trainer to wait for (1.6-6.6 ms for 1M picks, bench/NOTES.md run 54).
 * Else NULL. */
static uint64_t *same_sequential(struct sess *s, const struct order_spec *spec, uint64_t space,
				 uint64_t *npicks, uint64_t *held)
{
	const struct order_spec *o = &s->order_spec;
	uint64_t *picks = s->picks;

	if (spec->kind != ORDER_SEQ || !picks || o->kind != ORDER_SEQ || s->order_space != space ||
	    o->rank != spec->rank || (o->world ? o->world : 1) != (spec->world ? spec->world : 1))
		return NULL;
	*npicks = s->npicks;
	*held = s->order_held;
	s->order_held = 0;
	s->picks = NULL;
	return picks;
}

/* Whether an epoch of spec reads its rows through a block cache: a block
 * shuffle of a dataset read with O_DIRECT, whose every pick the readers
 * read (no pool takes some of them, no augment reads a block once per
 * copy, far apart in the epoch). */
static bool wants_blocks(const struct sess *s, const struct order_spec *spec)
{
	bool direct = false;

	for (size_t f = 0; f < s->ds->nfields; f++)
		direct |= s->ds->fields[f].direct;
	return spec->kind == ORDER_BLOCK_SHUFFLE && direct && s->augment <= 1 &&
	       s->ds->nfields <= BLOCKS_MAX_FIELDS && !(s->cuda.pool && s->cuda.pool->enabled);
}

void sess_drop_blocks(struct sess *s, bool quota)
{
	blocks_put(s->blocks);
	s->blocks = NULL;
	if (quota)
		sess_give(s, &s->blocks_held, s->blocks_held);
}

/* Every check is made here, on the request, and the epoch starts at once:
 * its EpochStarted goes out now, with the counts the order will have.  Only
 * the order's build (a shuffle of up to max_epoch_picks) goes to libuv's
 * thread pool, so no client's order holds the loop thread; its batches are
 * filled once it is back.  The order built ahead, when it is the one asked
 * for, is used at once. */
int sess_start_epoch(struct sess *s, uint64_t id, const Pf__StartEpoch *req)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__EpochStarted msg = PF__EPOCH_STARTED__INIT;
	uint64_t space = s->ds->num_samples * s->augment, nshare, nbatches, peak, keep;
	struct order_spec spec = {0};
	struct sess_start *st;
	char err[300] = "", what[120];
	bool ahead, clamped = false, want_uses;
	uint64_t blocks_held = 0, cache_bytes;
	int rc;

	/* Each epoch's number is above the last one's, so that a straggling
	 * Ack or Release of an earlier epoch never counts against this one. */
	if (s->had_epoch && req->epoch <= s->epoch)
		return peer_error(s->peer, id, -EINVAL,
				  "epoch %" PRIu64 " is not after epoch %" PRIu64
				  ", the session's last (epoch numbers must grow)",
				  req->epoch, s->epoch);
	/* A session keeps the dataset it opened (sess_pump.c). */
	if (s->ds->changed[0])
		return peer_error(s->peer, id, -ESTALE, "epoch %" PRIu64 ": %s", req->epoch,
				  s->ds->changed);
	/* A block size meant for a block shuffle but sent with another order
	 * is a client's mistake, which a silent ignore would hide. */
	if (req->order != PF__ORDER__ORDER_BLOCK_SHUFFLE &&
	    (req->block_rows || req->block_bytes || req->window_blocks))
		return peer_error(s->peer, id, -EINVAL,
				  "epoch %" PRIu64 ": block_rows, block_bytes and window_blocks "
				  "are for the block_shuffle order only",
				  req->epoch);
	switch (req->order) {
	case PF__ORDER__ORDER_SEQUENTIAL: spec.kind = ORDER_SEQ; break;
	case PF__ORDER__ORDER_SHUFFLE: spec.kind = ORDER_SHUFFLE; break;
	case PF__ORDER__ORDER_EXPLICIT: spec.kind = ORDER_EXPLICIT; break;
	case PF__ORDER__ORDER_PACED: return start_paced(s, id, req);
	case PF__ORDER__ORDER_BLOCK_SHUFFLE:
		spec.kind = ORDER_BLOCK_SHUFFLE;
		spec.samples = s->ds->num_samples;
		rc = order_block_params(req->block_rows, req->block_bytes, req->window_blocks,
					s->ds->num_samples, s->augment, s->ds->sample_bytes,
					&spec.block_rows, &spec.window_blocks, &clamped, err,
					sizeof(err));
		if (rc)
			return peer_error(s->peer, id, rc, "epoch %" PRIu64 ": %s", req->epoch,
					  err);
		break;
	default: return peer_error(s->peer, id, -EINVAL, "unknown order %d", req->order);
	}
	spec.seed = req->seed;
	spec.indices = req->indices;
	spec.nindices = req->n_indices;
	spec.rank = req->rank;
	spec.world = req->world;
	rc = order_check(&spec, space, &nshare, err, sizeof(err));
	if (rc)
		return peer_error(s->peer, id, rc, "epoch %" PRIu64 ": %s", req->epoch, err);
	nbatches = order_num_batches(nshare, s->batch_size, s->drop_last);
	if (req->start_batch > nbatches)
		return peer_error(s->peer, id, -ERANGE,
				  "start_batch %" PRIu64 " is beyond the %" PRIu64
				  " batches of this share",
				  req->start_batch, nbatches);
	/* A block cache holds about two windows at a time (blocks.h). */
	want_uses = wants_blocks(s, &spec);
	cache_bytes =
		want_uses ? 2 * spec.window_blocks * spec.block_rows * s->ds->sample_bytes : 0;
	if (want_uses) {
		snprintf(what, sizeof(what),
			 "epoch %" PRIu64 "'s block cache (2 windows of %" PRIu64
			 " blocks of %" PRIu64 " rows)",
			 req->epoch, spec.window_blocks, spec.block_rows);
		/* What the running epoch's cache holds is this one's once it
		 * starts: only the difference is asked for. */
		rc = sess_take(s, &blocks_held,
			       cache_bytes > s->blocks_held ? cache_bytes - s->blocks_held : 0,
			       what, err, sizeof(err));
		if (rc)
			return peer_error(s->peer, id, rc, "epoch %" PRIu64 ": %s", req->epoch,
					  err);
	}
	st = calloc(1, sizeof(*st));
	if (!st) {
		sess_give(s, &blocks_held, blocks_held);
		return peer_error(s->peer, id, -ENOMEM, "out of memory");
	}
	*st = (struct sess_start){.s = s,
				  .epoch = req->epoch,
				  .t_req = now_ns(),
				  .spec = spec,
				  .space = space,
				  .want_uses = want_uses,
				  .batch_size = s->batch_size,
				  .drop_last = s->drop_last,
				  .start_batch = req->start_batch};
	st->spec.indices = NULL;
	st->picks = ahead_take(&s->ahead, &spec, space, &st->npicks);
	if (st->picks) {
		/* Its quota moves with it: all the order ahead kept. */
		st->held = s->ahead_held;
		s->ahead_held = 0;
	} else if ((st->picks = same_sequential(s, &spec, space, &st->npicks, &st->held))) {
		log_debug("session %" PRIu64 ": epoch %" PRIu64
			  ": the last epoch's sequential order, as it is",
			  s->id, req->epoch);
	} else if ((st->picks = order_keep_take(&s->d->kept, &spec, space, &st->npicks))) {
		/* An earlier session's (a trainer that came back): this one's
		 * quota holds it from now on. */
		snprintf(what, sizeof(what), "epoch %" PRIu64 "'s order of %" PRIu64 " picks",
			 req->epoch, st->npicks);
		if (sess_take(s, &st->held, st->npicks * sizeof(uint64_t), what, err,
			      sizeof(err))) {
			free(st->picks);
			st->picks = NULL;
			err[0] = 0; /* built as any other, under the same quota */
		} else {
			log_debug("session %" PRIu64 ": epoch %" PRIu64
				  ": order kept from an earlier session",
				  s->id, req->epoch);
		}
	}
	/* Read now: once queued, st belongs to the build's thread. */
	ahead = st->picks != NULL;
	if (ahead) {
		if (want_uses) {
			/* Its block counts come from a build of their own, off
			 * the loop like any build. */
			st->count_only = true;
			if (uv_queue_work(s->d->loop, &st->work, build_work, build_done)) {
				/* Rows one by one, then. */
				st->count_only = st->want_uses = want_uses = false;
				sess_give(s, &blocks_held, blocks_held);
			}
		}
	} else {
		order_memory(&spec, space, &peak, &keep);
		snprintf(what, sizeof(what), "epoch %" PRIu64 "'s order of %" PRIu64 " picks",
			 req->epoch, nshare);
		rc = sess_take(s, &st->held, peak, what, err, sizeof(err));
		if (!rc && spec.kind == ORDER_EXPLICIT) {
			uint64_t *copy = malloc(spec.nindices * sizeof(*copy));

			if (copy)
				memcpy(copy, spec.indices, spec.nindices * sizeof(*copy));
			else
				rc = -ENOMEM;
			st->spec.indices = copy;
		}
		if (!rc) {
			plan_warm(s, st, req->epoch, nshare, nbatches, req->start_batch);
			rc = uv_queue_work(s->d->loop, &st->work, build_work, build_done);
			if (rc)
				snprintf(err, sizeof(err), "cannot queue the order's build: %s",
					 uv_strerror(rc));
		}
		if (rc) {
			sess_give(s, &st->held, st->held);
			sess_give(s, &blocks_held, blocks_held);
			start_free(st);
			return peer_error(s->peer, id, rc, "epoch %" PRIu64 ": %s", req->epoch,
					  err[0] ? err : strerror(-rc));
		}
	}

	/* Accepted: the epoch switches now. */
	new_epoch(s, req->epoch, req->start_batch);
	s->paced = false;
	/* The last epoch's order goes with the next build ahead, off the
	 * loop (ahead_discard; freed below if no build takes it). */
	ahead_discard(&s->ahead, s->picks, s->npicks);
	s->picks = NULL;
	sess_give(s, &s->order_held, s->order_held);
	s->npicks = nshare;
	s->nbatches = nbatches;
	s->epoch_started_ns = st->t_req; /* when the request came */
	s->block_rows = spec.kind == ORDER_BLOCK_SHUFFLE ? spec.block_rows : 0;
	s->window_blocks = spec.kind == ORDER_BLOCK_SHUFFLE ? spec.window_blocks : 0;
	if (clamped && !s->block_clamp_logged) {
		/* Once: a trainer asks the same of every epoch. */
		log_info("session %" PRIu64 ": epoch %" PRIu64 ": block_%s %" PRIu64
			 " is more than the dataset's %" PRIu64
			 " samples: one block per copy of it (logged once)",
			 s->id, req->epoch, req->block_rows ? "rows" : "bytes",
			 req->block_rows ? req->block_rows : req->block_bytes, s->ds->num_samples);
		s->block_clamp_logged = true;
	}
	/* The counter moves (the same uid's), down to this epoch's need. */
	s->blocks_held += blocks_held;
	if (!want_uses)
		cache_bytes = 0; /* its count-only build could not be queued */
	if (s->blocks_held > cache_bytes)
		sess_give(s, &s->blocks_held, s->blocks_held - cache_bytes);
	if (ahead && !st->count_only) {
		take_order(s, st);
		start_free(st);
	} else {
		s->building = st;
		s->jobs++;
		s->builds++;
	}
	ahead_discard_now(&s->ahead);
	msg.epoch = s->epoch;
	msg.batches = nbatches - req->start_batch;
	msg.samples = nshare;
	env.id = id;
	env.msg_case = PF__ENVELOPE__MSG_STARTED;
	env.started = &msg;
	rc = peer_send(s->peer, &env, -1);
	if (rc)
		return rc;
	if (s->gpu >= 0)
		sess_cuda_push_pool(s);
	sess_pump(s);
	return 0;
}

void sess_ack(struct sess *s, const Pf__Ack *req)
{
	/* Acks of another epoch (a straggler from before an abandon or a new
	 * start) must not count against this one. */
	if (req->epoch != s->epoch || s->gov.consumed >= s->sent)
		return;
	s->gov.consumed++;
	s->wait_s = req->wait_s;
	s->busy_s = req->busy_s;
	sess_pump(s);
}

void sess_release(struct sess *s, const Pf__Release *req)
{
	struct slot *sl;

	if (req->slot < 0 || (uint32_t)req->slot >= s->nslots) {
		peer_error(s->peer, 0, -EINVAL,
			   "release of slot %d refused: session %" PRIu64 " has slots 0..%u",
			   req->slot, s->id, s->nslots - 1);
		return;
	}
	sl = &s->slots[req->slot];
	if (sl->state != SLOT_SENT || sl->epoch != req->epoch || sl->seq != req->seq) {
		peer_error(s->peer, 0, -EPERM,
			   "release of slot %d (epoch %" PRIu64 " batch %" PRIu64
			   ") refused: this session does not hold that batch in that slot",
			   req->slot, req->epoch, req->seq);
		return;
	}
	sess_cuda_unpin(s, sl);
	sl->state = SLOT_FREE;
	if (sl->t_sent && sl->epoch == s->epoch)
		s->timing.client += now_ns() - sl->t_sent;
	sl->t_sent = 0;
	sess_pump(s);
}

int sess_abandon(struct sess *s, uint64_t id, const Pf__Abandon *req)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__Ok ok = PF__OK__INIT;

	if (req->epoch == s->epoch && s->running) {
		log_debug("session %" PRIu64 ": epoch %" PRIu64 " abandoned after %" PRIu64
			  " of %" PRIu64 " batches",
			  s->id, s->epoch, s->gov.consumed, s->nbatches - s->start_batch);
		sess_stop_epoch(s);
	}
	env.id = id;
	env.msg_case = PF__ENVELOPE__MSG_OK;
	env.ok = &ok;
	return peer_send(s->peer, &env, -1);
}

void sess_probe(struct sess *s, const Pf__Probe *req)
{
	uint64_t t0;

	if (s->gpu < 0) {
		/* Host sessions have no device memory to size against. */
		s->gov.probe_free = req->free_bytes;
		s->gov.probe_total = req->total_bytes;
		return;
	}
	/* On the loop, once an epoch: the time it takes holds every batch. */
	t0 = now_ns();
	sess_cuda_probe(s, req->free_bytes, req->total_bytes);
	log_debug("session %" PRIu64 ": probe handled in %.1f us", s->id, (now_ns() - t0) / 1e3);
	sess_pump(s);
}
