/*
 * sess_epoch.c — the session requests (see sess.h): StartEpoch (ordered or
 * paced), LoadBatch, Ack, Release, Abandon and Probe.  Each is checked
 * against the session's state and refused with a reply naming the problem,
 * or applied and followed by the pump.
 *
 * DESIGN: loop thread only; no locks.  An epoch's order is built here (or
 * taken from the one built ahead, ahead.h) before the epoch is switched,
 * so a refused start leaves the running epoch as it was.
 */
#include "sess_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataset.h"
#include "log.h"
#include "order.h"
#include "util.h"

/* Paced requests not yet sent go (an epoch ends or the session does). */
void sess_drop_requests(struct sess *s)
{
	if (!s->reqs)
		return;
	for (uint64_t q = s->next_send; q < s->nbatches; q++)
		sess_req_clear(sess_paced_req(s, q));
}

void sess_drop_slot(struct slot *sl)
{
	if (sl->state == SLOT_READY) {
		free(sl->errmsg);
		sl->errmsg = NULL;
		sl->error = 0;
		sl->state = SLOT_FREE;
	} else if (sl->state == SLOT_FILLING || sl->state == SLOT_COPYING) {
		sl->state = SLOT_ORPHAN;
	}
}

void sess_stop_epoch(struct sess *s)
{
	for (uint32_t i = 0; i < s->nslots; i++)
		sess_drop_slot(&s->slots[i]);
	sess_drop_requests(s);
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
	s->start_batch = start_batch;
	s->next_fill = s->next_send = start_batch;
	s->sent = 0;
	s->running = true;
	s->timing = (struct sess_timing){0};
	gov_new_epoch(&s->gov);
	if (s->cuda.pool)
		pool_new_epoch(s->cuda.pool, epoch);
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
		s->reqs = calloc(SESS_PACED_MAX, sizeof(*s->reqs));
		if (!s->reqs)
			return peer_error(s->peer, id, -ENOMEM, "out of memory");
	}
	new_epoch(s, req->epoch, 0);
	free(s->picks);
	s->picks = NULL;
	s->npicks = 0;
	s->nbatches = 0;
	s->paced = true;
	s->paced_end = false;
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
	char why[200] = "";

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
	r = sess_paced_req(s, s->nbatches);
	memset(r, 0, sizeof(*r));
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
	r->count = (uint32_t)(req->n_picks < s->batch_size ? req->n_picks : s->batch_size);
	r->picks = malloc((r->count ? r->count : 1) * sizeof(*r->picks));
	if (!r->picks)
		return peer_error(s->peer, id, -ENOMEM, "out of memory");
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

int sess_start_epoch(struct sess *s, uint64_t id, const Pf__StartEpoch *req)
{
	struct order_spec spec = {0};
	uint64_t *picks = NULL, npicks = 0, nbatches, space = s->ds->num_samples * s->augment;
	char err[256] = "";
	uint64_t t_req = now_ns(), t_order;
	int rc;

	if (req->epoch <= s->epoch && s->epoch != 0)
		return peer_error(s->peer, id, -EINVAL,
				  "epoch %" PRIu64 " is not after epoch %" PRIu64, req->epoch,
				  s->epoch);
	/* A session keeps the dataset it opened (sess_pump.c). */
	if (s->ds->changed[0])
		return peer_error(s->peer, id, -ESTALE, "epoch %" PRIu64 ": %s", req->epoch,
				  s->ds->changed);
	switch (req->order) {
	case PF__ORDER__ORDER_SEQUENTIAL: spec.kind = ORDER_SEQ; break;
	case PF__ORDER__ORDER_SHUFFLE: spec.kind = ORDER_SHUFFLE; break;
	case PF__ORDER__ORDER_EXPLICIT: spec.kind = ORDER_EXPLICIT; break;
	case PF__ORDER__ORDER_PACED: return start_paced(s, id, req);
	default: return peer_error(s->peer, id, -EINVAL, "unknown order %d", req->order);
	}
	spec.seed = req->seed;
	spec.indices = req->indices;
	spec.nindices = req->n_indices;
	spec.rank = req->rank;
	spec.world = req->world;
	t_order = now_ns();
	picks = ahead_take(&s->ahead, &spec, space, &npicks);
	rc = picks ? 0 : order_build(&spec, space, &picks, &npicks, err, sizeof(err));
	t_order = now_ns() - t_order;
	if (rc)
		return peer_error(s->peer, id, rc, "epoch %" PRIu64 ": %s", req->epoch,
				  err[0] ? err : strerror(-rc));
	nbatches = order_num_batches(npicks, s->batch_size, s->drop_last);
	if (req->start_batch > nbatches) {
		free(picks);
		return peer_error(s->peer, id, -ERANGE,
				  "start_batch %" PRIu64 " is beyond the %" PRIu64
				  " batches of this share",
				  req->start_batch, nbatches);
	}

	new_epoch(s, req->epoch, req->start_batch);
	s->paced = false;
	free(s->picks);
	s->picks = picks;
	s->npicks = npicks;
	s->nbatches = nbatches;
	s->epoch_started_ns = t_req; /* when the request came */
	log_debug("session %" PRIu64 ": epoch %" PRIu64 ": order of %" PRIu64
		  " picks ready in %.1f ms",
		  s->id, s->epoch, npicks, t_order / 1e6);
	ahead_epoch_started(&s->ahead, &spec, space);
	{
		Pf__Envelope env = PF__ENVELOPE__INIT;
		Pf__EpochStarted msg = PF__EPOCH_STARTED__INIT;

		msg.epoch = s->epoch;
		msg.batches = nbatches - req->start_batch;
		msg.samples = npicks;
		env.id = id;
		env.msg_case = PF__ENVELOPE__MSG_STARTED;
		env.started = &msg;
		rc = peer_send(s->peer, &env, -1);
		if (rc)
			return rc;
	}
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
	if (s->gpu < 0) {
		/* Host sessions have no device memory to size against. */
		s->gov.probe_free = req->free_bytes;
		s->gov.probe_total = req->total_bytes;
		return;
	}
	sess_cuda_probe(s, req->free_bytes, req->total_bytes);
	sess_pump(s);
}
