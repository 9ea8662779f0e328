/*
 * sess.c — a session's life (see sess.h): opening it (layout, slots, host
 * arenas, the SessionOpened reply), detaching it from its connection, and
 * freeing it once nothing works on it any more.  Its other parts, each a
 * layer below this one (sess_int.h): sess_epoch.c (epochs and the other
 * session requests), sess_pump.c (the slot state machine and in-order
 * delivery), sess_cuda.c (the CUDA half) and sess_base.c (what they all
 * use).  As the top layer it hands the lower ones, at open, what they
 * reach up for: s->free_fn, s->cuda.pump and the ring's wake.
 *
 * DESIGN: loop thread only; no locks.  A dead session is freed by whichever
 * of its jobs comes back last (sess_maybe_free, through s->free_fn).
 * Replies go to the session's peer (peer.h), never to a socket.
 */
#include "sess/sess_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/bigmem.h"
#include "state/daemon.h"
#include "data/dataset.h"
#include "base/log.h"
#include "util.h"

/* ---- life ------------------------------------------------------------------ */

static void sess_link(struct daemon *d, struct sess *s)
{
	s->prev = NULL;
	s->next = d->sessions;
	if (d->sessions)
		d->sessions->prev = s;
	d->sessions = s;
	d->nsessions++;
	sess_fill_shares(d);
}

static void sess_unlink(struct sess *s)
{
	struct daemon *d = s->d;

	if (s->prev)
		s->prev->next = s->next;
	else if (d->sessions == s)
		d->sessions = s->next;
	if (s->next)
		s->next->prev = s->prev;
	s->next = s->prev = NULL;
	d->nsessions--;
	sess_fill_shares(d);
}

static void free_sess_mem(uv_handle_t *h)
{
	free(h->data);
}

/* Every job is back (s->jobs == 0, the order ahead not busy): nothing reads
 * or writes s's memory. */
static void sess_free(struct sess *s)
{
	/* slots is NULL when sess_open failed before making them. */
	for (uint32_t i = 0; s->slots && i < s->nslots; i++) {
		free(s->slots[i].errmsg);
		/* A batch whose reads came back after the session died never
		 * reached a copy: its pins and admissions end here. */
		if (s->slots[i].plan.active)
			pool_plan_done(s->cuda.pool, &s->slots[i].plan, false);
		pool_plan_free(&s->slots[i].plan);
		free(s->slots[i].stage_off);
		big_free(s->slots[i].rows, (size_t)s->batch_size * sizeof(uint64_t));
	}
	/* How long its orders are kept, while the dataset is still ours. */
	double keep_s = s->ds ? daemon_pool_linger(s->d, s->ds) : 0;

	/* Before the dataset: its last session gone, a retired dataset's
	 * pools may be freed with it. */
	sess_cuda_release(s);
	if (s->ds && s->ds_held)
		daemon_dataset_put(s->d, (struct dataset *)s->ds);
	ahead_cancel(&s->ahead);
	sess_drop_requests(s);
	free(s->reqs);
	/* Everything it held goes back to its uid (paced requests just did). */
	sess_give(s, &s->mem_held, s->mem_held);
	sess_give(s, &s->order_held, s->order_held);
	sess_drop_blocks(s, true);
	sess_give(s, &s->ahead_held, s->ahead_held);
	if (s->counted)
		quota_give(&s->d->quota, s->uid, QUOTA_SESSIONS, 1);
	for (uint32_t i = 0; i < s->narenas; i++)
		arena_destroy(&s->arenas[i]);
	free(s->arenas);
	free(s->slots);
	fill_layout_free(&s->lay);
	/* Every job is back: nothing reads the picks any more. */
	order_keep_put(&s->d->kept, &s->order_spec, s->order_space, s->picks, s->npicks, keep_s,
		       now_ns(), s->d->cfg.kept_order_bytes);
	if (s->cuda.retry_live) {
		s->cuda.retry.data = s;
		uv_close((uv_handle_t *)&s->cuda.retry, free_sess_mem);
		return;
	}
	free(s);
}

static void ahead_back(struct ahead *a)
{
	struct sess *s = container_of(a, struct sess, ahead);

	sess_ahead_back(s);
	sess_maybe_free(s);
}

struct sess *sess_find(struct daemon *d, uint64_t id)
{
	for (struct sess *s = d->sessions; s; s = s->next)
		if (s->id == id)
			return s;
	return NULL;
}

/* ---- opening ------------------------------------------------------------------ */

static int make_host_arenas(struct sess *s, char *err, size_t errlen)
{
	const struct config *cfg = &s->d->cfg;
	uint64_t stride = s->lay.slot_stride;
	uint32_t per_arena = (uint32_t)(cfg->arena_bytes / stride);
	uint32_t slot = 0;
	int rc;

	if (per_arena == 0)
		per_arena = 1; /* one slot larger than arena_bytes gets its own arena */
	s->narenas = (s->nslots + per_arena - 1) / per_arena;
	s->arenas = calloc(s->narenas, sizeof(*s->arenas));
	if (!s->arenas)
		return -ENOMEM;
	for (uint32_t a = 0; a < s->narenas; a++) {
		uint32_t n = s->nslots - slot < per_arena ? s->nslots - slot : per_arena;
		char label[64];

		snprintf(label, sizeof(label), "prefetchd-s%" PRIu64 "-a%u", s->id, a);
		rc = arena_host_create(&s->arenas[a], a, n * stride, label);
		if (rc) {
			snprintf(err, errlen, "cannot create a %.1f MiB host arena: %s",
				 n * stride / 1048576.0, strerror(-rc));
			for (uint32_t b = 0; b < a; b++)
				arena_destroy(&s->arenas[b]);
			s->narenas = 0;
			return rc;
		}
		for (uint32_t k = 0; k < n; k++, slot++) {
			s->slots[slot].arena = a;
			s->slots[slot].offset = k * stride;
			s->slots[slot].host = s->arenas[a].host + k * stride;
			s->slots[slot].present = true;
			s->slots[slot].ring = -1;
		}
	}
	return 0;
}

int sess_send_arenas(struct sess *s, const struct peer *to)
{
	if (s->gpu >= 0) {
		for (uint32_t a = 0; a < s->cuda.narenas; a++) {
			int rc = sess_cuda_push_arena(s, a, to);

			if (rc)
				return rc;
		}
		return 0;
	}
	for (uint32_t a = 0; a < s->narenas; a++) {
		Pf__Envelope env = PF__ENVELOPE__INIT;
		Pf__Arena msg = PF__ARENA__INIT;
		int fd = arena_host_export(&s->arenas[a]);
		int rc;

		if (fd < 0)
			return fd;
		msg.id = a;
		msg.kind = PF__ARENA_KIND__ARENA_HOST_MEMFD;
		msg.bytes = s->arenas[a].bytes;
		msg.device = -1;
		env.msg_case = PF__ENVELOPE__MSG_ARENA;
		env.arena = &msg;
		rc = peer_send(to, &env, fd);
		if (rc)
			return rc;
	}
	return 0;
}

void sess_fields(const struct dataset *ds, const uint64_t *offsets, Pf__Field *fields,
		 Pf__Field **fieldp)
{
	for (size_t f = 0; f < ds->nfields; f++) {
		pf__field__init(&fields[f]);
		fields[f].name = ds->fields[f].name;
		fields[f].dtype = (char *)npy_dtype_name(ds->fields[f].dtype);
		fields[f].n_shape = (size_t)ds->fields[f].sample_ndim;
		fields[f].shape = (uint64_t *)ds->fields[f].sample_shape;
		fields[f].sample_bytes = ds->fields[f].sample_bytes;
		if (offsets)
			fields[f].offset = offsets[f];
		fieldp[f] = &fields[f];
	}
}

int sess_send_opened(struct sess *s, const struct peer *to, uint64_t id, uint64_t session,
		     uint32_t slots, const char *share)
{
	const struct dataset *ds = s->ds;
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__SessionOpened msg = PF__SESSION_OPENED__INIT;
	Pf__Field *fields = calloc(ds->nfields, sizeof(*fields));
	Pf__Field **fieldp = calloc(ds->nfields, sizeof(*fieldp));
	Pf__PoolLayout layout = PF__POOL_LAYOUT__INIT;
	const struct pool *p = s->cuda.pool;
	int rc = -ENOMEM;

	if (!fields || !fieldp)
		goto out;
	sess_fields(ds, s->lay.field_offset, fields, fieldp);
	msg.session = session;
	msg.num_samples = ds->num_samples;
	msg.n_fields = ds->nfields;
	msg.fields = fieldp;
	msg.slot_bytes = s->lay.slot_bytes;
	msg.slots = slots;
	msg.share = (char *)share;
	msg.target = gov_limit(&s->gov);
	msg.device = s->device;
	msg.probe_interval_s = s->gpu >= 0 ? s->d->cfg.probe_interval : 0;
	msg.client_copy = s->client_copy;
	if (s->cuda.gather) {
		layout.n_rec_off = layout.n_row_bytes = p->nfields;
		layout.rec_off = (uint32_t *)p->rec_off;
		layout.row_bytes = (uint32_t *)p->row_bytes;
		layout.rec_stride = p->rec_stride;
		layout.slab_shift = p->slab_shift;
		msg.pool = &layout;
	}
	env.id = id;
	env.msg_case = PF__ENVELOPE__MSG_OPENED;
	env.opened = &msg;
	rc = peer_send(to, &env, -1);
out:
	free(fields);
	free(fieldp);
	return rc;
}

/* The session's slots: the depth bound plus what the trainer may hold,
 * trimmed to the session's memory cap but never below min_depth + 1.
 * Counted in 64 bits: a max_depth near UINT32_MAX (a client's to choose)
 * must not wrap to a session of one slot, or of none.  max_depth comes down
 * with the trim. */
static int count_slots(struct sess *s, uint32_t min_depth, uint32_t *max_depth, uint32_t extra,
		       char *err, size_t errlen)
{
	const struct config *cfg = &s->d->cfg;
	uint64_t want = (uint64_t)*max_depth + SESS_HOLD_SLOTS + extra;
	uint64_t fit = cfg->session_bytes / s->lay.slot_stride;

	if (fit < want) {
		if (fit < (uint64_t)min_depth + 1) {
			snprintf(err, errlen,
				 "a batch takes %.1f MiB; %" PRIu64 " slots (min_depth %u + 1) "
				 "exceed session_bytes (%.1f MiB)",
				 s->lay.slot_stride / 1048576.0, (uint64_t)min_depth + 1, min_depth,
				 cfg->session_bytes / 1048576.0);
			return -E2BIG;
		}
		want = fit;
		*max_depth = want - 1 > *max_depth ? *max_depth : (uint32_t)(want - 1);
		if (*max_depth < min_depth)
			*max_depth = min_depth;
	}
	s->nslots = want < UINT32_MAX ? (uint32_t)want : UINT32_MAX;
	return 0;
}

/* The host memory a session holds from its open: the slot table with each
 * slot's sample numbers, and the slots themselves for a host session (a
 * CUDA session's are device memory and ring slots, bounded apart); every
 * slot of a CUDA session may carry a pool plan and staged-row offsets. */
static uint64_t open_bytes(const struct sess *s)
{
	/* A slot's sample numbers come from big_alloc: whole huge pages from
	 * 2 MiB on (a batch of 300K picks maps 4 MiB). */
	uint64_t rows = big_size((size_t)s->batch_size * sizeof(uint64_t));
	uint64_t per_slot = sizeof(struct slot) + rows, bytes;

	if (s->gpu >= 0)
		per_slot += s->ds->nfields * sizeof(uint64_t) +
			    fill_stage_cap(s->batch_size) * (sizeof(uint64_t) + sizeof(uint32_t));
	else
		per_slot += s->lay.slot_stride;
	/* Saturated: a sum past 2^64 is refused as "more than the budget". */
	return __builtin_mul_overflow((uint64_t)s->nslots, per_slot, &bytes) ? UINT64_MAX : bytes;
}

int sess_open(struct daemon *d, const struct peer *p, struct sess **slot, uint64_t id,
	      const Pf__OpenSession *req)
{
	return sess_open_how(d, p, slot, id, req, NULL);
}

int sess_open_how(struct daemon *d, const struct peer *p, struct sess **slot, uint64_t id,
		  const Pf__OpenSession *req, const struct sess_how *how)
{
	static const struct sess_how plain_how;
	const struct config *cfg = &d->cfg;
	const struct dataset *ds;
	struct sess *s;
	char err[300] = "", what[80];
	uint32_t min_depth, max_depth, augment = req->augment ? req->augment : 1;
	uint64_t picks;
	int gpu = -1, copy_gpu = -1;
	bool client_copy = false;
	int rc;

	if (!how)
		how = &plain_how;
	if (*slot)
		return peer_error(p, id, -EBUSY,
				  "this connection already has session %" PRIu64
				  "; open another connection for another session",
				  (*slot)->id);
	ds = daemon_dataset(d, req->dataset);
	if (!ds)
		return peer_error(p, id, -ENOENT,
				  "unknown dataset '%s' (prefetchctl datasets lists them)",
				  req->dataset);
	if (ds->error[0])
		return peer_error(p, id, -EIO, "dataset '%s' is not available: %s", ds->name,
				  ds->error);
	if (ds->changed[0]) /* found by a reader; a reload loads it anew */
		return peer_error(p, id, -ESTALE, "dataset '%s' is not available: %s", ds->name,
				  ds->changed);
	if (req->batch_size == 0)
		return peer_error(p, id, -EINVAL, "batch_size must be at least 1");
	if (req->batch_size > SESS_MAX_BATCH)
		return peer_error(p, id, -E2BIG,
				  "batch_size %u is above %u (a batch's picks travel in one "
				  "message)",
				  req->batch_size, SESS_MAX_BATCH);
	/* StartEpoch builds an order of N x augment picks, 8 bytes each: the
	 * client must not choose how much memory the daemon takes. */
	if (__builtin_mul_overflow(ds->num_samples, (uint64_t)augment, &picks) ||
	    picks > cfg->max_epoch_picks)
		return peer_error(p, id, -E2BIG,
				  "an epoch of '%s' with augment %u is %" PRIu64 " samples x %u "
				  "picks, above max_epoch_picks = %" PRIu64
				  " ([daemon] in the configuration; each pick costs the daemon 8 "
				  "bytes)",
				  ds->name, augment, ds->num_samples, augment,
				  cfg->max_epoch_picks);
	if (req->device[0] && strcmp(req->device, "host") != 0) {
		rc = sess_cuda_pick_gpu(d, req, &gpu, err, sizeof(err));
		if (rc)
			return peer_error(p, id, rc, "%s", err);
		/* Without a pool to serve it, a client that copies batches
		 * itself gets them in host arenas: the daemon's context does
		 * no work on the trainer's GPU. */
		if (req->client_copy && !how->plain &&
		    (!daemon_pool_enabled(d, ds) || ds->nfields > GPU_GATHER_MAX_FIELDS)) {
			client_copy = true;
			copy_gpu = gpu;
			gpu = -1;
		}
	}
	min_depth = req->min_depth ? req->min_depth : 1;
	max_depth = req->max_depth ? req->max_depth : cfg->max_depth;
	if (min_depth > max_depth)
		return peer_error(p, id, -EINVAL, "min_depth %u is above max_depth %u", min_depth,
				  max_depth);
	/* Slots are max_depth + 2, each with its bookkeeping: the client
	 * does not choose how many the daemon scans and keeps. */
	if (max_depth > cfg->depth_limit)
		return peer_error(p, id, -E2BIG,
				  "max_depth %u is above depth_limit = %u ([daemon] in the "
				  "configuration)",
				  max_depth, cfg->depth_limit);
	rc = quota_take(&d->quota, p->uid, QUOTA_SESSIONS, 1, "a new session", err, sizeof(err));
	if (rc)
		return peer_error(p, id, rc, "%s", err);

	s = calloc(1, sizeof(*s));
	if (!s) {
		quota_give(&d->quota, p->uid, QUOTA_SESSIONS, 1);
		return peer_error(p, id, -ENOMEM, "out of memory");
	}
	s->counted = true;
	s->d = d;
	s->free_fn = sess_free;
	s->cuda.pump = sess_pump;
	s->peer = p;
	s->id = ++d->next_session_id;
	s->gpu = gpu;
	s->uid = p->uid;
	s->pid = p->pid;
	s->ds = ds;
	daemon_dataset_hold((struct dataset *)ds);
	s->ds_held = true;
	s->batch_size = req->batch_size;
	s->picks_le = req->picks_le;
	s->narrow = req->narrow;
	/* Picks lie below augment x N in every epoch (orders, explicit
	 * indices and paced requests are all checked against it), so one
	 * look decides for the session; past 2^32 (max_epoch_picks raised
	 * above its default of 2^31) they go as 8 bytes. */
	s->picks32 = req->narrow && picks <= (1ull << 32);
	s->client_copy = client_copy;
	s->augment = augment;
	s->drop_last = req->drop_last;
	s->plain = how->plain;
	s->opened_ns = now_ns();
	ahead_init(&s->ahead, d->loop, ahead_back);
	snprintf(s->name, sizeof(s->name), "%.63s", req->name[0] ? req->name : p->name);
	util_printable(s->name); /* shown by status, on terminals */
	if (gpu >= 0 || client_copy)
		snprintf(s->device, sizeof(s->device), "cuda:%d", client_copy ? copy_gpu : gpu);
	else
		snprintf(s->device, sizeof(s->device), "host");
	rc = fill_layout(&s->lay, ds, s->batch_size, err, sizeof(err));
	if (rc)
		goto fail;
	rc = count_slots(s, min_depth, &max_depth, how->extra_slots, err, sizeof(err));
	if (rc)
		goto fail;
	snprintf(what, sizeof(what), "a session of %u slots of %.1f MiB", s->nslots,
		 s->lay.slot_stride / 1048576.0);
	rc = sess_take(s, &s->mem_held, open_bytes(s), what, err, sizeof(err));
	if (rc)
		goto fail;
	s->slots = calloc(s->nslots, sizeof(*s->slots));
	if (!s->slots) {
		rc = -ENOMEM;
		goto fail;
	}
	/* A client that copies takes a batch's slot back as soon as its copy
	 * is done: max_depth ahead costs host memory only, and keeps a fast
	 * consumer fed. */
	gov_init(&s->gov, min_depth, max_depth, client_copy ? max_depth : cfg->depth);
	if (gpu >= 0) {
		/* The ring wakes the pump of a session it has a slot for; the
		 * CUDA half that takes the ring slots is below the pump and
		 * does not name it (sess_int.h). */
		d->ring.wake = sess_ring_wake;
		rc = sess_cuda_setup(s, req, err, sizeof(err));
	} else {
		rc = make_host_arenas(s, err, sizeof(err));
	}
	if (rc)
		goto fail;

	*slot = s;
	sess_link(d, s);
	rc = sess_send_opened(s, p, id, s->id, s->nslots, "");
	if (!rc)
		rc = sess_send_arenas(s, p);
	if (rc)
		return rc; /* the connection is closing; sess_detach frees s */
	if (gpu >= 0)
		log_info("session %" PRIu64
			 " opened by %s: dataset %s, device %s (ipc %s), batch %u, "
			 "up to %u device slots of %.2f MiB, ring share %u slot(s) of up to %u "
			 "(%u kept), target %u",
			 s->id, p->name, ds->name, s->device,
			 s->cuda.ipc == GPU_IPC_FD ? "fd" : "legacy", s->batch_size, s->nslots,
			 s->lay.slot_bytes / 1048576.0, s->cuda.lease.cap, s->cuda.lease.nslots,
			 s->cuda.lease.min, s->gov.target);
	else
		log_info("session %" PRIu64 " opened by %s: dataset %s, device %s%s, batch %u, %u "
			 "slots of %.2f MiB in %u arena(s), target %u",
			 s->id, p->name, ds->name, s->device,
			 s->client_copy ? " (host arenas, the client copies)" : "", s->batch_size,
			 s->nslots, s->lay.slot_bytes / 1048576.0, s->narenas, s->gov.target);
	return 0;
fail:
	sess_free(s);
	return peer_error(p, id, rc, "cannot open a session on '%s': %s", ds->name,
			  err[0] ? err : strerror(-rc));
}

void sess_detach(struct sess *s)
{
	uint32_t held = 0;

	for (uint32_t i = 0; i < s->nslots; i++)
		held += s->slots[i].state == SLOT_SENT;
	log_info("session %" PRIu64 " closed: %" PRIu64
		 " bytes sent, %u slot(s) were held, %u read(s) in flight",
		 s->id, s->bytes_sent, held, s->jobs);
	sess_unlink(s);
	/* Its pump runs no more (it is off the session list): a place in the
	 * ring's queue would hold up the others until its reads are back. */
	if (s->gpu >= 0)
		ring_wait_cancel(&s->cuda.lease);
	if (s->counted) /* it leaves the uid's sessions now, its memory when freed */
		quota_give(&s->d->quota, s->uid, QUOTA_SESSIONS, 1);
	s->counted = false;
	s->peer = NULL;
	s->dead = true;
	sess_stop_epoch(s);
	{
		struct order_spec spec;
		uint64_t space, npicks;
		uint64_t *picks = ahead_take_ready(&s->ahead, &spec, &space, &npicks);

		order_keep_put(&s->d->kept, &spec, space, picks, npicks,
			       daemon_pool_linger(s->d, s->ds), now_ns(),
			       s->d->cfg.kept_order_bytes);
	}
	ahead_cancel(&s->ahead);
	sess_maybe_free(s);
}

bool sess_check(const struct sess *s)
{
	uint64_t working = s->cuda.alloc_pending + s->builds;

	if (!gov_check(&s->gov))
		return false;
	for (uint32_t i = 0; i < s->nslots; i++) {
		const struct slot *sl = &s->slots[i];

		/* A filling slot waits for its parts; a copying one (or an
		 * orphan whose parts are all back) for its copy. */
		if (sl->state == SLOT_FILLING || (sl->state == SLOT_ORPHAN && sl->parts))
			working += sl->parts;
		else if (sl->state == SLOT_COPYING || sl->state == SLOT_ORPHAN)
			working++;
	}
	if (working != s->jobs)
		return false;
	if (s->next_send > s->next_fill || s->next_fill > s->nbatches)
		return false;
	return true;
}
