/*
 * sess.c — sessions: layout, arenas, epochs, the slot state machine and the
 * in-order delivery pump (see sess.h).
 *
 * DESIGN: loop thread only; no locks.  Everything a reader thread needs is
 * copied into its job (sample numbers) or borrowed from memory that lives
 * until the job is back (the slot, the field offsets, the dataset).  The
 * pump runs after every event that can unblock it (a job back, an ack, a
 * release, an epoch start) and does two things: send every READY batch whose
 * turn has come, then start fills while the governor allows and a slot is
 * FREE.
 */
#include "sess.h"

#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon.h"
#include "dataset.h"
#include "log.h"
#include "util.h"
#include "order.h"
#include "pool.h"
#include "reader.h"
#include "ring.h"
#include "server.h"
#include "xfer.h"

/* Fields start at this alignment inside a slot: enough for any dtype, for
 * vectorised copies and for CUDA's 256-byte allocation alignment. */
#define FIELD_ALIGN 256u
#define SLOT_ALIGN  4096u

static void sess_link(struct daemon *d, struct sess *s)
{
	s->prev = NULL;
	s->next = d->sessions;
	if (d->sessions)
		d->sessions->prev = s;
	d->sessions = s;
	d->nsessions++;
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
}

static void free_sess_mem(uv_handle_t *h)
{
	free(h->data);
}

static void drop_requests(struct sess *s);

/* Every job is back (s->jobs == 0): nothing reads or writes s's memory. */
static void sess_free(struct sess *s)
{
	/* slots is NULL when sess_open failed before making them. */
	for (uint32_t i = 0; s->slots && i < s->nslots; i++) {
		free(s->slots[i].errmsg);
		/* A batch whose reads came back after the session died never
		 * reached a copy: its pins and admissions end here. */
		if (s->slots[i].plan.active)
			pool_plan_done(s->pool, &s->slots[i].plan, false);
		pool_plan_free(&s->slots[i].plan);
		free(s->slots[i].stage_off);
	}
	if (s->pool)
		pool_put(s->pool);
	if (s->ds && s->ds_held)
		daemon_dataset_put(s->d, (struct dataset *)s->ds);
	free(s->ahead.picks);
	drop_requests(s);
	free(s->reqs);
	for (uint32_t i = 0; i < s->narenas; i++)
		arena_destroy(&s->arenas[i]);
	/* Device arenas are released on their transfer thread (the calls
	 * block); by now every copy into them has completed. */
	for (uint32_t i = 0; i < s->ngarenas; i++)
		xfer_free_mem(s->xfer, &s->garenas[i]);
	if (s->ring_bytes)
		ring_give(&s->d->ring, s->ring_off, s->ring_bytes);
	free(s->ring_busy);
	free(s->garenas);
	free(s->arenas);
	free(s->slots);
	free(s->field_offset);
	free(s->picks);
	if (s->retry_live) {
		s->retry.data = s;
		uv_close((uv_handle_t *)&s->retry, free_sess_mem);
		return;
	}
	free(s);
}

struct sess *sess_find(struct daemon *d, uint64_t id)
{
	for (struct sess *s = d->sessions; s; s = s->next)
		if (s->id == id)
			return s;
	return NULL;
}

/* Slot layout: every field's samples packed, each field starting at a
 * FIELD_ALIGN boundary. */
static int layout(struct sess *s)
{
	const struct dataset *ds = s->ds;
	uint64_t off = 0;

	s->field_offset = calloc(ds->nfields, sizeof(*s->field_offset));
	if (!s->field_offset)
		return -ENOMEM;
	for (size_t f = 0; f < ds->nfields; f++) {
		off = align_up(off, FIELD_ALIGN);
		s->field_offset[f] = off;
		off += ds->fields[f].sample_bytes * s->batch_size;
	}
	s->slot_bytes = off;
	s->slot_stride = align_up(off, SLOT_ALIGN);
	return 0;
}

static int make_host_arenas(struct sess *s, char *err, size_t errlen)
{
	const struct config *cfg = &s->d->cfg;
	uint32_t per_arena = (uint32_t)(cfg->arena_bytes / s->slot_stride);
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
		rc = arena_host_create(&s->arenas[a], a, n * s->slot_stride, label);
		if (rc) {
			snprintf(err, errlen, "cannot create a %.1f MiB host arena: %s",
				 n * s->slot_stride / 1048576.0, strerror(-rc));
			for (uint32_t b = 0; b < a; b++)
				arena_destroy(&s->arenas[b]);
			s->narenas = 0;
			return rc;
		}
		for (uint32_t k = 0; k < n; k++, slot++) {
			s->slots[slot].arena = a;
			s->slots[slot].offset = k * s->slot_stride;
			s->slots[slot].host = s->arenas[a].host + k * s->slot_stride;
			s->slots[slot].present = true;
			s->slots[slot].ring = -1;
		}
	}
	return 0;
}

/* The daemon's ordinal of the GPU a CUDA session asks for: by PCI bus id
 * when the client sent one (its CUDA_VISIBLE_DEVICES may number GPUs
 * differently), else by the N of "cuda:N". */
static int pick_gpu(struct daemon *d, const Pf__OpenSession *req, int *gpu, char *err,
		    size_t errlen)
{
	char *end = NULL;
	long n = -1;

	errno = 0;
	if (strncmp(req->device, "cuda:", 5) == 0)
		n = strtol(req->device + 5, &end, 10);
	if (!end || end == req->device + 5 || *end || n < 0 || errno) {
		snprintf(err, errlen, "unknown device '%s' (use \"host\" or \"cuda:N\")",
			 req->device);
		return -EINVAL;
	}
	if (d->ngpus <= 0) {
		snprintf(err, errlen, "device %s: this daemon serves host sessions only (%.160s)",
			 req->device, d->gpu_desc);
		return -ENODEV;
	}
	if (!d->ring.base) {
		snprintf(err, errlen, "device %s: CUDA sessions are off: %.160s", req->device,
			 d->ring_err);
		return -ENODEV;
	}
	if (req->pci_bus_id && req->pci_bus_id[0]) {
		int dev = gpu_device_by_pci_bus_id(req->pci_bus_id);

		if (dev < 0) {
			snprintf(err, errlen,
				 "device %s (PCI %s) is not one of the daemon's GPUs (%.120s); "
				 "check "
				 "the daemon's CUDA_VISIBLE_DEVICES",
				 req->device, req->pci_bus_id, d->gpu_desc);
			return -ENODEV;
		}
		*gpu = dev;
		return 0;
	}
	if (n >= d->ngpus) {
		snprintf(err, errlen, "device %s: the daemon has %d GPU(s) (%.160s)", req->device,
			 d->ngpus, d->gpu_desc);
		return -ENODEV;
	}
	*gpu = (int)n;
	return 0;
}

/* Where a pooled batch's parts sit in its ring slot: the gather index
 * (count entries), the admission addresses and the staged rows, field by
 * field, each at a FIELD_ALIGN boundary.  Returns the prefix's size, the
 * bytes that cross PCIe. */
static uint64_t stage_layout(const struct sess *s, uint32_t count, uint32_t nstaged,
			     uint64_t *admit_off, uint64_t *stage_off)
{
	uint64_t off = (uint64_t)count * sizeof(uint64_t);

	*admit_off = align_up(off, FIELD_ALIGN);
	off = *admit_off + (uint64_t)nstaged * sizeof(uint64_t);
	for (size_t f = 0; f < s->ds->nfields; f++) {
		off = align_up(off, FIELD_ALIGN);
		if (stage_off)
			stage_off[f] = off;
		off += s->ds->fields[f].sample_bytes * nstaged;
	}
	return off;
}

/* Joins the dataset's VRAM pool on this GPU (pool.h).  A batch stages its
 * misses plus up to a quarter of a batch of back-filled rows, so ring slots
 * grow by that much; a dataset that cannot be pooled is served without. */
static int setup_pool(struct sess *s)
{
	char why[160] = "";
	uint64_t admit_off, most;

	s->ring_stride = s->slot_stride;
	s->pool = pool_get(s->d, s->ds, s->gpu, s->xfer, why, sizeof(why));
	if (!s->pool) {
		log_info("session %" PRIu64 ": no VRAM pool for %s: %s", s->id, s->ds->name, why);
		return 0;
	}
	if (!s->pool->enabled) {
		/* Off: this session's ring slots stay the plain size, so it
		 * keeps the plain path even if the pool is turned on later. */
		pool_put(s->pool);
		s->pool = NULL;
		return 0;
	}
	s->stage_cap = s->batch_size + (s->batch_size + 3) / 4;
	most = stage_layout(s, s->batch_size, s->stage_cap, &admit_off, NULL);
	if (align_up(most, SLOT_ALIGN) > s->ring_stride)
		s->ring_stride = align_up(most, SLOT_ALIGN);
	for (uint32_t i = 0; i < s->nslots; i++) {
		s->slots[i].stage_off = calloc(s->ds->nfields, sizeof(uint64_t));
		if (!s->slots[i].stage_off || pool_plan_alloc(&s->slots[i].plan, s->stage_cap))
			return -ENOMEM;
	}
	return 0;
}

/* A CUDA session's transfer thread, ring slots and back-off timer.  Device
 * slots come later, an arena at a time (grow). */
static int setup_cuda(struct sess *s, const Pf__OpenSession *req, char *err, size_t errlen)
{
	struct daemon *d = s->d;
	const struct config *cfg = &d->cfg;
	uint32_t want, n;
	int rc;

	switch (req->ipc) {
	case PF__IPC__IPC_FD: s->ipc = GPU_IPC_FD; break;
	case PF__IPC__IPC_LEGACY: s->ipc = GPU_IPC_LEGACY; break;
	default: s->ipc = cfg->ipc && strcmp(cfg->ipc, "legacy") == 0 ? GPU_IPC_LEGACY : GPU_IPC_FD;
	}
	if (!d->xfers[s->gpu]) {
		rc = xfer_start(&d->xfers[s->gpu], s->gpu, d->loop, sess_xfer_done, d, err, errlen);
		if (rc)
			return rc;
		log_info("GPU %d: transfer thread started", s->gpu);
	}
	s->xfer = d->xfers[s->gpu];
	rc = setup_pool(s);
	if (rc) {
		snprintf(err, errlen, "out of memory for the pool's batch plans");
		return rc;
	}
	/* Ring slots: enough for every reader to work on a batch of this
	 * session plus one being copied, never more than can be in flight. */
	want = cfg->readers + 2;
	if (want > s->gov.max_depth + 1)
		want = s->gov.max_depth + 1;
	for (n = want; n > 0; n--)
		if (ring_take(&d->ring, (uint64_t)n * s->ring_stride, &s->ring_off) == 0)
			break;
	if (n == 0) {
		snprintf(err, errlen,
			 "the pinned ring has no room for one %.1f MiB batch (ring_bytes = %.0f "
			 "MiB, %.1f MiB free in one piece)",
			 s->ring_stride / 1048576.0, d->ring.bytes / 1048576.0,
			 ring_largest_free(&d->ring) / 1048576.0);
		return -ENOSPC;
	}
	s->nring = n;
	s->ring_bytes = (uint64_t)n * s->ring_stride;
	s->ring_busy = calloc(n, 1);
	if (!s->ring_busy)
		return -ENOMEM;
	for (uint32_t i = 0; i < s->nslots; i++)
		s->slots[i].ring = -1;
	uv_timer_init(d->loop, &s->retry);
	s->retry.data = s;
	s->retry_live = true;
	return 0;
}

/* Announces device arena a (its fd goes with it, once). */
static int push_garena(struct sess *s, uint32_t a)
{
	struct gpu_mem *ga = &s->garenas[a];
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__Arena msg = PF__ARENA__INIT;
	int fd = -1;

	msg.id = a;
	msg.bytes = ga->bytes;
	msg.device = s->gpu;
	if (ga->kind == GPU_IPC_FD) {
		msg.kind = PF__ARENA_KIND__ARENA_CUDA_FD;
		fd = ga->export_fd; /* the send queue owns it from here */
		ga->export_fd = -1;
	} else {
		msg.kind = PF__ARENA_KIND__ARENA_CUDA_LEGACY;
		msg.legacy_handle.data = ga->legacy_handle;
		msg.legacy_handle.len = GPU_IPC_HANDLE_BYTES;
	}
	env.msg_case = PF__ENVELOPE__MSG_ARENA;
	env.arena = &msg;
	return conn_send(s->conn, &env, fd);
}

static int push_arenas(struct sess *s)
{
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
		rc = conn_send(s->conn, &env, fd);
		if (rc)
			return rc;
	}
	return 0;
}

static int reply_opened(struct sess *s, uint64_t id)
{
	const struct dataset *ds = s->ds;
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__SessionOpened msg = PF__SESSION_OPENED__INIT;
	Pf__Field *fields = calloc(ds->nfields, sizeof(*fields));
	Pf__Field **fieldp = calloc(ds->nfields, sizeof(*fieldp));
	int rc = -ENOMEM;

	if (!fields || !fieldp)
		goto out;
	for (size_t f = 0; f < ds->nfields; f++) {
		pf__field__init(&fields[f]);
		fields[f].name = ds->fields[f].name;
		fields[f].dtype = (char *)npy_dtype_name(ds->fields[f].dtype);
		fields[f].n_shape = (size_t)ds->fields[f].sample_ndim;
		fields[f].shape = (uint64_t *)ds->fields[f].sample_shape;
		fields[f].sample_bytes = ds->fields[f].sample_bytes;
		fields[f].offset = s->field_offset[f];
		fieldp[f] = &fields[f];
	}
	msg.session = s->id;
	msg.num_samples = ds->num_samples;
	msg.n_fields = ds->nfields;
	msg.fields = fieldp;
	msg.slot_bytes = s->slot_bytes;
	msg.slots = s->nslots;
	msg.target = s->gov.target;
	msg.device = s->device;
	msg.probe_interval_s = s->gpu >= 0 ? s->d->cfg.probe_interval : 0;
	env.id = id;
	env.msg_case = PF__ENVELOPE__MSG_OPENED;
	env.opened = &msg;
	rc = conn_send(s->conn, &env, -1);
out:
	free(fields);
	free(fieldp);
	return rc;
}

int sess_open(struct conn *c, uint64_t id, const Pf__OpenSession *req)
{
	struct daemon *d = c->d;
	const struct config *cfg = &d->cfg;
	const struct dataset *ds;
	struct sess *s;
	char err[256] = "";
	uint32_t min_depth, max_depth, augment = req->augment ? req->augment : 1;
	uint64_t fit, want, picks;
	int gpu = -1;
	int rc;

	if (c->sess)
		return conn_error(c, id, -EBUSY,
				  "this connection already has session %" PRIu64
				  "; open another connection for another session",
				  c->sess->id);
	if (d->nsessions >= cfg->max_sessions)
		return conn_error(c, id, -EMFILE, "too many sessions (max_sessions = %u)",
				  cfg->max_sessions);
	ds = daemon_dataset(d, req->dataset);
	if (!ds)
		return conn_error(c, id, -ENOENT,
				  "unknown dataset '%s' (prefetchctl datasets lists them)",
				  req->dataset);
	if (ds->error[0])
		return conn_error(c, id, -EIO, "dataset '%s' is not available: %s", ds->name,
				  ds->error);
	if (req->batch_size == 0)
		return conn_error(c, id, -EINVAL, "batch_size must be at least 1");
	/* StartEpoch builds an order of N x augment picks, 8 bytes each: the
	 * client must not choose how much memory the daemon takes. */
	if (__builtin_mul_overflow(ds->num_samples, (uint64_t)augment, &picks) ||
	    picks > cfg->max_epoch_picks)
		return conn_error(c, id, -E2BIG,
				  "an epoch of '%s' with augment %u is %" PRIu64 " samples x %u "
				  "picks, above max_epoch_picks = %" PRIu64
				  " ([daemon] in the configuration; each pick costs the daemon 8 "
				  "bytes)",
				  ds->name, augment, ds->num_samples, augment,
				  cfg->max_epoch_picks);
	if (req->device[0] && strcmp(req->device, "host") != 0) {
		rc = pick_gpu(d, req, &gpu, err, sizeof(err));
		if (rc)
			return conn_error(c, id, rc, "%s", err);
	}
	min_depth = req->min_depth ? req->min_depth : 1;
	max_depth = req->max_depth ? req->max_depth : cfg->max_depth;
	if (min_depth > max_depth)
		return conn_error(c, id, -EINVAL, "min_depth %u is above max_depth %u", min_depth,
				  max_depth);

	s = calloc(1, sizeof(*s));
	if (!s)
		return conn_error(c, id, -ENOMEM, "out of memory");
	s->d = d;
	s->conn = c;
	s->id = ++d->next_session_id;
	s->gpu = gpu;
	s->uid = c->uid;
	s->pid = c->pid;
	s->ds = ds;
	daemon_dataset_hold((struct dataset *)ds);
	s->ds_held = true;
	s->batch_size = req->batch_size;
	s->picks_le = req->picks_le;
	s->augment = augment;
	s->drop_last = req->drop_last;
	s->opened_ns = now_ns();
	snprintf(s->name, sizeof(s->name), "%.63s", req->name[0] ? req->name : c->peer);
	if (gpu >= 0)
		snprintf(s->device, sizeof(s->device), "cuda:%d", gpu);
	else
		snprintf(s->device, sizeof(s->device), "host");
	rc = layout(s);
	if (rc)
		goto fail;

	/* Slots: the depth bound plus what the trainer may hold, trimmed to
	 * the session's memory cap but never below min_depth + 1.  Counted in
	 * 64 bits: a max_depth near UINT32_MAX (a client's to choose) must not
	 * wrap to a session of one slot, or of none. */
	want = (uint64_t)max_depth + SESS_HOLD_SLOTS;
	fit = cfg->session_bytes / s->slot_stride;
	if (fit < want) {
		if (fit < (uint64_t)min_depth + 1) {
			snprintf(err, sizeof(err),
				 "a batch takes %.1f MiB; %" PRIu64 " slots (min_depth %u + 1) "
				 "exceed session_bytes (%.1f MiB)",
				 s->slot_stride / 1048576.0, (uint64_t)min_depth + 1, min_depth,
				 cfg->session_bytes / 1048576.0);
			rc = -E2BIG;
			goto fail;
		}
		want = fit;
		max_depth = want - 1 > max_depth ? max_depth : (uint32_t)(want - 1);
		if (max_depth < min_depth)
			max_depth = min_depth;
	}
	s->nslots = want < UINT32_MAX ? (uint32_t)want : UINT32_MAX;
	s->slots = calloc(s->nslots, sizeof(*s->slots));
	if (!s->slots) {
		rc = -ENOMEM;
		goto fail;
	}
	gov_init(&s->gov, min_depth, max_depth, cfg->depth);
	if (gpu >= 0)
		rc = setup_cuda(s, req, err, sizeof(err));
	else
		rc = make_host_arenas(s, err, sizeof(err));
	if (rc)
		goto fail;

	c->sess = s;
	sess_link(d, s);
	rc = reply_opened(s, id);
	if (!rc)
		rc = push_arenas(s);
	if (rc)
		return rc; /* the connection is closing; sess_detach frees s */
	if (gpu >= 0)
		log_info("session %" PRIu64
			 " opened by %s: dataset %s, device %s (ipc %s), batch %u, "
			 "up to %u device slots of %.2f MiB, %u ring slot(s), target %u",
			 s->id, c->peer, ds->name, s->device,
			 s->ipc == GPU_IPC_FD ? "fd" : "legacy", s->batch_size, s->nslots,
			 s->slot_bytes / 1048576.0, s->nring, s->gov.target);
	else
		log_info("session %" PRIu64 " opened by %s: dataset %s, device %s, batch %u, %u "
			 "slots of %.2f MiB in %u arena(s), target %u",
			 s->id, c->peer, ds->name, s->device, s->batch_size, s->nslots,
			 s->slot_bytes / 1048576.0, s->narenas, s->gov.target);
	return 0;
fail:
	sess_free(s);
	return conn_error(c, id, rc, "cannot open a session on '%s': %s", ds->name,
			  err[0] ? err : strerror(-rc));
}

/* ---- the pump ------------------------------------------------------------ */

static void grow(struct sess *s);

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

static int32_t free_ring_slot(const struct sess *s)
{
	for (uint32_t i = 0; i < s->nring; i++)
		if (!s->ring_busy[i])
			return (int32_t)i;
	return -1;
}

static uint8_t *ring_slot_mem(const struct sess *s, int32_t r)
{
	return s->d->ring.base + s->ring_off + (uint64_t)r * s->ring_stride;
}

static void ring_slot_put(struct sess *s, struct slot *sl)
{
	if (sl->ring >= 0)
		s->ring_busy[sl->ring] = 0;
	sl->ring = -1;
}

/* Records the error of the batch in sl (its epoch and seq set): the message
 * names the batch, is logged unless the batch was abandoned, and is what
 * the trainer's pf_errmsg will say when the error batch is sent. */
static void slot_set_error(struct sess *s, struct slot *sl, int rc, const char *why)
{
	char msg[400];

	snprintf(msg, sizeof(msg), "epoch %" PRIu64 " batch %" PRIu64 ": %s", sl->epoch, sl->seq,
		 why);
	if (sl->state != SLOT_ORPHAN)
		log_warn("session %" PRIu64 ": %s", s->id, msg);
	free(sl->errmsg);
	sl->errmsg = strdup(msg);
	sl->error = sl->errmsg ? rc : -ENOMEM;
}

static struct sess_req *paced_req(const struct sess *s, uint64_t seq)
{
	return &s->reqs[seq % SESS_PACED_MAX];
}

static uint32_t batch_count(const struct sess *s, uint64_t seq)
{
	uint64_t first = seq * s->batch_size;
	uint64_t left = s->npicks - first;

	if (s->paced)
		return paced_req(s, seq)->count;
	return left < s->batch_size ? (uint32_t)left : s->batch_size;
}

/* Batch seq's picks (borrowed: valid until it is sent or the epoch ends). */
static const uint64_t *batch_picks(const struct sess *s, uint64_t seq)
{
	if (s->paced)
		return paced_req(s, seq)->picks;
	return s->picks + seq * s->batch_size;
}

static void req_clear(struct sess_req *r)
{
	free(r->picks);
	free(r->errmsg);
	memset(r, 0, sizeof(*r));
}

/* Paced requests not yet sent go (an epoch ends or the session does). */
static void drop_requests(struct sess *s)
{
	if (!s->reqs)
		return;
	for (uint64_t q = s->next_send; q < s->nbatches; q++)
		req_clear(paced_req(s, q));
}

static int send_batch(struct sess *s, struct slot *sl)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__BatchReady msg = PF__BATCH_READY__INIT;
	uint32_t count = batch_count(s, sl->seq);
	int rc;

	msg.epoch = sl->epoch;
	msg.seq = sl->seq;
	msg.count = count;
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	/* The picks as they lie in memory, for a client that takes them so:
	 * no varint per row on either side. */
	if (s->picks_le) {
		msg.picks_le.len = (size_t)count * sizeof(uint64_t);
		msg.picks_le.data = (uint8_t *)batch_picks(s, sl->seq);
	} else
#endif
	{
		msg.n_picks = count;
		msg.picks = (uint64_t *)batch_picks(s, sl->seq);
	}
	if (sl->error) {
		msg.slot = -1;
		msg.error = sl->error;
		msg.message = sl->errmsg;
	} else {
		msg.slot = (int32_t)(sl - s->slots);
		msg.arena = sl->arena;
		msg.offset = sl->offset;
	}
	env.msg_case = PF__ENVELOPE__MSG_BATCH;
	env.batch = &msg;
	rc = conn_send(s->conn, &env, -1);
	if (s->paced)
		req_clear(paced_req(s, sl->seq)); /* packed: its picks are sent */
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
			s->ns_read += sl->t_copy - sl->t_fill;
			s->ns_device += sl->t_ready - sl->t_copy;
			s->ns_turn += sl->t_sent - sl->t_ready;
			s->timed++;
		}
	}
	s->sent++;
	if (!s->first_sent) {
		s->first_sent = true;
		log_debug("session %" PRIu64 ": epoch %" PRIu64 ": first batch sent %.2f ms after "
			  "StartEpoch",
			  s->id, s->epoch, (now_ns() - s->epoch_started_ns) / 1e6);
	}
	return rc;
}

static int send_end(struct sess *s)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__EpochEnd msg = PF__EPOCH_END__INIT;

	msg.epoch = s->epoch;
	msg.batches = s->nbatches - s->start_batch;
	env.msg_case = PF__ENVELOPE__MSG_END;
	env.end = &msg;
	return conn_send(s->conn, &env, -1);
}

static void start_copy(struct sess *s, struct slot *sl);

/* Plans a batch against the pool: fills the ring slot's gather index and
 * admission addresses, and returns the rows the readers must stage. */
static const uint64_t *plan_batch(struct sess *s, struct slot *sl, const uint64_t *picks,
				  uint32_t count, uint32_t *nrows)
{
	uint8_t *rs = ring_slot_mem(s, sl->ring);
	uint64_t admit_off;

	stage_layout(s, count, 0, &admit_off, NULL);
	pool_plan_batch(s->pool, picks, count, s->stage_cap - count, &sl->plan, (uint64_t *)rs,
			(uint64_t *)(rs + admit_off));
	sl->stage_bytes = stage_layout(s, count, sl->plan.nstaged, &admit_off, sl->stage_off);
	*nrows = sl->plan.nstaged;
	return sl->plan.staged;
}

/* Hands batch next_fill to the readers, in parts of about SESS_PART_BYTES.
 * The slot is FILLING until every part is back.  A pooled batch reads only
 * its staged rows (none when every row is a hit: it goes straight to the
 * transfer thread). */
static int start_fill(struct sess *s, struct slot *sl, int32_t ring)
{
	uint32_t count = batch_count(s, s->next_fill);
	const uint64_t *picks = batch_picks(s, s->next_fill);
	const uint64_t *rows = NULL; /* NULL: the picks themselves */
	const uint64_t *field_offset = s->field_offset;
	uint32_t nrows = count, parts, nparts, main_rows, extra = 0;
	struct reader_job *jobs[64];
	uint8_t *dst;

	if (s->paced && paced_req(s, s->next_fill)->error) {
		/* A request that cannot be served is an error batch in its
		 * place: nothing is read. */
		const struct sess_req *r = paced_req(s, s->next_fill);

		sl->state = SLOT_READY;
		sl->epoch = s->epoch;
		sl->seq = s->next_fill;
		slot_set_error(s, sl, r->error, r->errmsg ? r->errmsg : "bad request");
		s->next_fill++;
		s->gov.prepared++;
		return 0;
	}
	if (s->gpu >= 0) {
		sl->ring = ring;
		s->ring_busy[ring] = 1;
	}
	sl->t_fill = now_ns();
	if (s->pool && s->pool->enabled) {
		rows = plan_batch(s, sl, picks, count, &nrows);
		field_offset = sl->stage_off;
		s->ns_plan += now_ns() - sl->t_fill;
	}
	main_rows = nrows;
	/* Admit-only rows (back-fill) are read as a part of their own: if
	 * they cannot be read the batch's own rows still go out. */
	if (sl->plan.active && sl->plan.nstaged > sl->plan.nmiss) {
		extra = sl->plan.nstaged - sl->plan.nmiss;
		main_rows = sl->plan.nmiss;
	}
	parts = (uint32_t)(((uint64_t)main_rows * s->ds->sample_bytes + SESS_PART_BYTES - 1) /
			   SESS_PART_BYTES);
	if (parts > s->d->cfg.readers)
		parts = s->d->cfg.readers;
	if (parts > 63)
		parts = 63;
	if (parts > main_rows)
		parts = main_rows;
	nparts = parts + (extra ? 1 : 0);
	for (uint32_t p = 0; p < nparts; p++) {
		uint32_t first =
			p < parts ? (uint32_t)((uint64_t)main_rows * p / parts) : main_rows;
		uint32_t n = p < parts ? (uint32_t)((uint64_t)main_rows * (p + 1) / parts) - first
				       : extra;

		jobs[p] = calloc(1, sizeof(*jobs[p]));
		if (jobs[p])
			jobs[p]->samples = malloc(sizeof(uint64_t) * (n ? n : 1));
		if (!jobs[p] || !jobs[p]->samples) {
			free(jobs[p]);
			while (p--) {
				free(jobs[p]->samples);
				free(jobs[p]);
			}
			if (sl->plan.active)
				pool_plan_done(s->pool, &sl->plan, false);
			ring_slot_put(s, sl);
			return -ENOMEM;
		}
		for (uint32_t k = 0; k < n; k++)
			jobs[p]->samples[k] =
				rows ? rows[first + k] : picks[first + k] % s->ds->num_samples;
		jobs[p]->first = first;
		jobs[p]->count = n;
	}
	dst = s->gpu >= 0 ? ring_slot_mem(s, sl->ring) : sl->host;
	sl->state = SLOT_FILLING;
	sl->epoch = s->epoch;
	sl->seq = s->next_fill;
	sl->parts = nparts;
	sl->error = 0;
	for (uint32_t p = 0; p < nparts; p++) {
		struct reader_job *job = jobs[p];

		job->owner = s;
		job->ds = s->ds;
		job->dst = dst;
		job->field_offset = field_offset;
		job->slot = (uint32_t)(sl - s->slots);
		job->epoch = s->epoch;
		job->seq = s->next_fill;
		s->jobs++;
		reader_submit(s->d->readers, job);
	}
	s->next_fill++;
	s->gov.prepared++;
	if (nparts == 0)
		start_copy(s, sl); /* every row is in the pool */
	return 0;
}

static void pump(struct sess *s)
{
	struct slot *sl;
	int32_t ring;

	if (s->dead || !s->conn || !s->running || s->d->stopping)
		return;
again:
	while (s->next_send < s->nbatches &&
	       (sl = find_slot(s, s->epoch, s->next_send, SLOT_READY))) {
		if (send_batch(s, sl))
			return;
		s->next_send++;
	}
	if (s->next_send == s->nbatches && (!s->paced || s->paced_end)) {
		s->running = false;
		if (s->timed)
			log_debug("session %" PRIu64 ": epoch %" PRIu64 " per batch: read %.1f us, "
				  "device %.1f us, waiting its turn %.1f us, with the client %.1f "
				  "us, pool planning %.1f us (%" PRIu64 " batches)",
				  s->id, s->epoch, s->ns_read / 1e3 / s->timed,
				  s->ns_device / 1e3 / s->timed, s->ns_turn / 1e3 / s->timed,
				  s->ns_client / 1e3 / s->timed, s->ns_plan / 1e3 / s->timed,
				  s->timed);
		log_debug("session %" PRIu64 ": epoch %" PRIu64 " done, %" PRIu64 " batches", s->id,
			  s->epoch, s->nbatches - s->start_batch);
		send_end(s);
		return;
	}
	while (s->next_fill < s->nbatches && gov_may_fill(&s->gov)) {
		sl = free_slot(s);
		if (!sl) {
			if (s->gpu >= 0)
				grow(s);
			break;
		}
		ring = s->gpu >= 0 ? free_ring_slot(s) : -1;
		if (s->gpu >= 0 && ring < 0)
			break;
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

static void on_retry(uv_timer_t *t)
{
	pump(t->data);
}

/* Device slots wanted now: the target in flight plus what the trainer may
 * hold, within the session's slot count. */
static uint32_t slots_wanted(const struct sess *s)
{
	uint64_t want = (uint64_t)s->gov.target + SESS_HOLD_SLOTS;

	return want < s->nslots ? (uint32_t)want : s->nslots;
}

/* Asks the transfer thread for another device arena when the pump is short
 * of slots and none is on the way. */
static void grow(struct sess *s)
{
	const struct config *cfg = &s->d->cfg;
	struct xfer_job *job;
	uint64_t per_arena, k;

	if (s->alloc_pending || s->grow_blocked || uv_is_active((uv_handle_t *)&s->retry) ||
	    s->npresent >= slots_wanted(s))
		return;
	k = slots_wanted(s) - s->npresent;
	per_arena = cfg->arena_bytes / s->slot_stride;
	if (per_arena == 0)
		per_arena = 1; /* one slot larger than arena_bytes: an arena of its own */
	if (k > per_arena)
		k = per_arena;
	job = calloc(1, sizeof(*job));
	if (!job) {
		log_err("session %" PRIu64 ": out of memory asking for a device arena", s->id);
		return;
	}
	job->kind = XFER_ALLOC;
	job->owner = s;
	job->bytes = k * s->slot_stride;
	job->ipc = s->ipc;
	if (s->d->test_fail_allocs > 0) {
		s->d->test_fail_allocs--;
		job->inject_enomem = true;
	}
	s->alloc_pending = true;
	s->jobs++;
	xfer_submit(s->xfer, job);
}

/* The allocation's tries ran out.  With no device slot at all the batch
 * that needed one becomes an error batch (the epoch goes on, and the next
 * batch tries again); with some, the session goes on with what it has. */
static void give_up_alloc(struct sess *s, const char *why)
{
	struct slot *sl = NULL;
	char why_full[300];

	s->oom_tries = 0;
	if (s->npresent > 0) {
		s->grow_blocked = true;
		log_warn("session %" PRIu64 ": going on with %u device slot(s): %s", s->id,
			 s->npresent, why);
		return;
	}
	if (!s->running || s->next_fill >= s->nbatches)
		return;
	for (uint32_t i = 0; i < s->nslots && !sl; i++)
		if (!s->slots[i].present && s->slots[i].state == SLOT_FREE)
			sl = &s->slots[i];
	if (!sl)
		return;
	snprintf(why_full, sizeof(why_full),
		 "device out of memory on %s: no device slot after %d tries: %s", s->device,
		 SESS_OOM_TRIES, why);
	sl->state = SLOT_READY;
	sl->epoch = s->epoch;
	sl->seq = s->next_fill;
	slot_set_error(s, sl, -ENOMEM, why_full);
	s->next_fill++;
	s->gov.prepared++;
}

static void alloc_done(struct sess *s, struct xfer_job *job)
{
	struct gpu_mem *t;
	uint64_t k;

	s->alloc_pending = false;
	if (job->rc && s->gov.target <= 1 && s->pool && s->oom_tries + 1 < SESS_OOM_TRIES &&
	    pool_give_slab(s->pool, "a device slot allocation failed with the target at 1")) {
		/* The try counts: a slab still read by batches in flight is
		 * freed only after them, so a retry can fail again. */
		s->oom_tries++;
		/* The target is at its floor: the pool makes room instead.
		 * The slab's release is queued before the retry, so the
		 * retry sees the memory. */
		log_warn("session %" PRIu64 ": a %.1f MiB device arena on %s failed (%s); the "
			 "pool gave a slab back, retrying",
			 s->id, job->bytes / 1048576.0, s->device, job->err);
		uv_timer_start(&s->retry, on_retry, SESS_OOM_PAUSE_MS, 0);
		return;
	}
	if (job->rc) {
		s->oom_tries++;
		gov_halve(&s->gov);
		log_warn("session %" PRIu64 ": a %.1f MiB device arena on %s failed (%s), try %u "
			 "of %d; target halved to %u",
			 s->id, job->bytes / 1048576.0, s->device, job->err, s->oom_tries,
			 SESS_OOM_TRIES, s->gov.target);
		if (s->oom_tries < SESS_OOM_TRIES)
			uv_timer_start(&s->retry, on_retry, SESS_OOM_PAUSE_MS * s->oom_tries, 0);
		else
			give_up_alloc(s, job->err);
		return;
	}
	t = realloc(s->garenas, (s->ngarenas + 1) * sizeof(*t));
	if (!t) {
		log_err("session %" PRIu64 ": out of memory keeping a device arena", s->id);
		xfer_free_mem(s->xfer, &job->mem);
		return;
	}
	s->garenas = t;
	s->garenas[s->ngarenas] = job->mem;
	job->mem = (struct gpu_mem){.export_fd = -1}; /* the session owns it now */
	s->oom_tries = 0;
	k = s->garenas[s->ngarenas].bytes / s->slot_stride; /* the rounding may hold more */
	if (k > s->nslots - s->npresent)
		k = s->nslots - s->npresent;
	for (uint64_t i = 0; i < k; i++) {
		struct slot *sl = &s->slots[s->npresent + i];

		sl->present = true;
		sl->arena = s->ngarenas;
		sl->offset = i * s->slot_stride;
		sl->dev_addr = s->garenas[s->ngarenas].base + sl->offset;
	}
	s->npresent += (uint32_t)k;
	s->ngarenas++;
	log_debug("session %" PRIu64 ": device arena %u, %.1f MiB, %" PRIu64 " slots (%u in all)",
		  s->id, s->ngarenas - 1, s->garenas[s->ngarenas - 1].bytes / 1048576.0, k, s->npresent);
	push_garena(s, s->ngarenas - 1);
}

/* A transfer job of a live or dead session came back (loop thread). */
void sess_xfer_done(struct xfer_job *job, void *arg)
{
	struct sess *s = job->owner;
	struct slot *sl;

	s->jobs--;
	if (job->kind == XFER_ALLOC) {
		if (s->dead) {
			s->alloc_pending = false;
			xfer_free_mem(s->xfer, &job->mem); /* nobody will use it */
		} else {
			alloc_done(s, job);
		}
		goto out;
	}
	sl = &s->slots[job->slot];
	ring_slot_put(s, sl);
	if (sl->plan.active) {
		/* The gather has completed (or failed): admissions publish
		 * even for an orphan, whose rows were written all the same. */
		if (!job->rc) {
			s->h2d_bytes += (uint64_t)sl->plan.nstaged * s->ds->sample_bytes;
			s->index_bytes +=
				job->bytes - (uint64_t)sl->plan.nstaged * s->ds->sample_bytes;
			s->pool_hits += sl->plan.hits;
		}
		pool_plan_done(s->pool, &sl->plan, job->rc == 0);
	} else if (!job->rc) {
		s->h2d_bytes += job->bytes;
	}
	if (s->dead)
		goto out;
	if (sl->state == SLOT_ORPHAN) {
		sl->state = SLOT_FREE;
	} else if (job->rc) {
		sl->state = SLOT_READY;
		slot_set_error(s, sl, job->rc, job->err);
	} else {
		sl->state = SLOT_READY;
		sl->t_ready = now_ns();
		s->copy_bytes += job->bytes;
		s->copy_ns += job->copy_ns;
	}
out:
	free(job);
	if (s->dead) {
		if (s->jobs == 0)
			sess_free(s);
		return;
	}
	pump(s);
}

static void start_copy(struct sess *s, struct slot *sl)
{
	struct xfer_job *job = calloc(1, sizeof(*job));

	if (!job) {
		if (sl->plan.active)
			pool_plan_done(s->pool, &sl->plan, false);
		ring_slot_put(s, sl);
		sl->state = SLOT_READY;
		slot_set_error(s, sl, -ENOMEM, "out of memory queueing a copy to the device");
		return;
	}
	job->kind = XFER_COPY;
	job->owner = s;
	job->slot = (uint32_t)(sl - s->slots);
	job->epoch = sl->epoch;
	job->seq = sl->seq;
	job->src = ring_slot_mem(s, sl->ring);
	job->dst = sl->dev_addr;
	job->bytes = s->slot_bytes;
	if (sl->plan.active) {
		const struct pool *p = s->pool;
		struct gpu_gather *g = &job->g;
		uint64_t admit_off;

		stage_layout(s, sl->plan.count, sl->plan.nstaged, &admit_off, NULL);
		job->gather = true;
		job->bytes = sl->stage_bytes;
		g->count = sl->plan.count;
		g->nstaged = sl->plan.nstaged;
		g->desc = 0;
		g->admit = admit_off;
		g->staged = 0;
		g->nfields = p->nfields;
		if (sl->plan.table) {
			g->table = p->table.base;
			g->table_n = s->ds->num_samples;
		}
		for (uint32_t f = 0; f < p->nfields; f++) {
			g->slot_off[f] = s->field_offset[f];
			g->staged_off[f] = sl->stage_off[f];
			g->rec_off[f] = p->rec_off[f];
			g->row_bytes[f] = p->row_bytes[f];
		}
	}
	sl->state = SLOT_COPYING;
	sl->t_copy = now_ns();
	s->jobs++;
	xfer_submit(s->xfer, job);
}

void sess_kick(struct sess *s)
{
	pump(s);
}

void sess_job_done(struct reader_job *job, void *arg)
{
	struct sess *s = job->owner;
	struct slot *sl = &s->slots[job->slot];

	s->jobs--;
	s->read_ns += job->read_ns;
	sl->parts--;
	if (job->rc && !s->dead && sl->plan.active && job->first >= sl->plan.nmiss &&
	    sl->plan.nstaged > sl->plan.nmiss) {
		/* Only back-fill rows failed: they stay out of the pool, the
		 * batch's own rows are fine. */
		uint64_t admit_off;

		stage_layout(s, sl->plan.count, 0, &admit_off, NULL);
		log_warn("session %" PRIu64 ": %u row(s) read for the pool only were not "
			 "admitted: %s",
			 s->id, job->count, job->err);
		pool_plan_drop_rows(s->pool, &sl->plan, job->first, job->count,
				    (uint64_t *)(ring_slot_mem(s, sl->ring) + admit_off));
	} else if (job->rc && !sl->error && !s->dead) {
		slot_set_error(s, sl, job->rc, job->err); /* the first part's error wins */
	}
	if (s->dead) {
		if (s->jobs == 0)
			sess_free(s);
		goto out;
	}
	if (sl->parts > 0)
		goto out; /* the rest of the batch is still being read */
	if (sl->state == SLOT_ORPHAN || sl->error) {
		/* No copy follows: the batch's admissions are cancelled (and,
		 * after a read error, not tried again by back-fill). */
		if (sl->plan.active) {
			sl->plan.read_failed = sl->error != 0;
			pool_plan_done(s->pool, &sl->plan, false);
		}
	}
	if (sl->state == SLOT_ORPHAN) {
		ring_slot_put(s, sl);
		free(sl->errmsg);
		sl->errmsg = NULL;
		sl->error = 0;
		sl->state = SLOT_FREE;
	} else if (s->gpu >= 0 && !sl->error) {
		start_copy(s, sl);
	} else {
		ring_slot_put(s, sl);
		sl->state = SLOT_READY;
	}
	pump(s);
out:
	free(job->samples);
	free(job);
}

/* ---- requests ------------------------------------------------------------ */

static void ahead_work(uv_work_t *w)
{
	struct sess_ahead *a = w->data;
	struct order_spec spec = {
		.kind = ORDER_SHUFFLE, .seed = a->seed, .rank = a->rank, .world = a->world};
	char err[200];

	a->rc = order_build(&spec, a->space, &a->picks, &a->npicks, err, sizeof(err));
}

static void queue_ahead(struct sess *s, uint64_t seed, uint32_t rank, uint32_t world,
			uint64_t space);

static void ahead_done(uv_work_t *w, int status)
{
	struct sess *s = (struct sess *)((char *)w->data - offsetof(struct sess, ahead));
	struct sess_ahead *a = &s->ahead;

	s->jobs--;
	a->busy = false;
	a->ready = status == 0 && a->rc == 0;
	if (!a->ready) {
		free(a->picks);
		a->picks = NULL;
	}
	if (s->dead) {
		if (s->jobs == 0)
			sess_free(s);
		return;
	}
	/* Epochs left early (a warm-up, an abandon) can start faster than an
	 * order is built: build the one for the newest epoch now. */
	if (a->again && !(a->ready && a->seed == a->again_seed && a->rank == a->again_rank &&
			  a->world == a->again_world && a->space == a->again_space))
		queue_ahead(s, a->again_seed, a->again_rank, a->again_world, a->again_space);
	a->again = false;
}

static void queue_ahead(struct sess *s, uint64_t seed, uint32_t rank, uint32_t world,
			uint64_t space)
{
	struct sess_ahead *a = &s->ahead;

	free(a->picks);
	a->picks = NULL;
	a->ready = false;
	a->seed = seed;
	a->rank = rank;
	a->world = world;
	a->space = space;
	a->work.data = a;
	if (uv_queue_work(s->d->loop, &a->work, ahead_work, ahead_done) == 0) {
		a->busy = true;
		s->jobs++;
	}
}

/* After a shuffled epoch starts: the next one's order, built ahead (or
 * noted, when a build is still running, to follow it). */
static void build_ahead(struct sess *s, const struct order_spec *spec, uint64_t space)
{
	struct sess_ahead *a = &s->ahead;

	if (spec->kind != ORDER_SHUFFLE)
		return;
	if (a->busy) {
		a->again = true;
		a->again_seed = spec->seed + 1;
		a->again_rank = spec->rank;
		a->again_world = spec->world;
		a->again_space = space;
		return;
	}
	queue_ahead(s, spec->seed + 1, spec->rank, spec->world, space);
}

/* The order built ahead, when it is the one spec asks for (ownership moves
 * to the caller); else NULL. */
static uint64_t *take_ahead(struct sess *s, const struct order_spec *spec, uint64_t space,
			    uint64_t *npicks)
{
	struct sess_ahead *a = &s->ahead;
	uint64_t *picks;

	/* While busy the pool thread owns a->picks: look only when ready. */
	if (spec->kind != ORDER_SHUFFLE || a->busy || !a->ready || a->seed != spec->seed ||
	    a->rank != spec->rank || (a->world ? a->world : 1) != (spec->world ? spec->world : 1) ||
	    a->space != space)
		return NULL;
	picks = a->picks;
	*npicks = a->npicks;
	a->picks = NULL;
	a->ready = false;
	return picks;
}

/* Stops the current epoch: READY slots are free again at once, FILLING ones
 * become ORPHAN and come free when their reader is done. */
static void stop_epoch(struct sess *s)
{
	for (uint32_t i = 0; i < s->nslots; i++) {
		struct slot *sl = &s->slots[i];

		if (sl->state == SLOT_READY) {
			free(sl->errmsg);
			sl->errmsg = NULL;
			sl->error = 0;
			sl->state = SLOT_FREE;
		} else if (sl->state == SLOT_FILLING || sl->state == SLOT_COPYING) {
			sl->state = SLOT_ORPHAN;
		}
	}
	drop_requests(s);
	s->running = false;
}

/* An epoch with no order: the client's LoadBatch requests are its batches
 * (sess_load).  The governor loads target of them ahead, as for ordered
 * epochs; the rest wait, up to SESS_PACED_MAX. */
static int start_paced(struct sess *s, uint64_t id, const Pf__StartEpoch *req)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__EpochStarted msg = PF__EPOCH_STARTED__INIT;

	if (req->start_batch || req->n_indices || req->world > 1)
		return conn_error(s->conn, id, -EINVAL,
				  "epoch %" PRIu64 ": a paced epoch takes no start_batch, indices "
				  "or world (the client chooses every batch)",
				  req->epoch);
	if (!s->reqs) {
		s->reqs = calloc(SESS_PACED_MAX, sizeof(*s->reqs));
		if (!s->reqs)
			return conn_error(s->conn, id, -ENOMEM, "out of memory");
	}
	if (s->running)
		log_info("session %" PRIu64 ": epoch %" PRIu64 " left unfinished by epoch %" PRIu64,
			 s->id, s->epoch, req->epoch);
	stop_epoch(s);
	free(s->picks);
	s->picks = NULL;
	s->npicks = 0;
	s->nbatches = 0;
	s->paced = true;
	s->paced_end = false;
	s->epoch = req->epoch;
	s->start_batch = 0;
	s->next_fill = s->next_send = 0;
	s->sent = 0;
	s->running = true;
	s->epoch_started_ns = now_ns();
	s->first_sent = false;
	gov_new_epoch(&s->gov);
	s->ns_read = s->ns_device = s->ns_turn = s->ns_client = s->ns_plan = s->timed = 0;
	if (s->pool)
		pool_new_epoch(s->pool, s->epoch);
	log_debug("session %" PRIu64 ": epoch %" PRIu64 " paced", s->id, s->epoch);
	msg.epoch = s->epoch;
	env.id = id;
	env.msg_case = PF__ENVELOPE__MSG_STARTED;
	env.started = &msg;
	return conn_send(s->conn, &env, -1);
}

int sess_load(struct sess *s, uint64_t id, const Pf__LoadBatch *req)
{
	struct sess_req *r;
	uint64_t space = s->ds->num_samples * s->augment;
	char why[200] = "";

	if (!s->paced || req->epoch != s->epoch || !s->running || s->paced_end)
		return conn_error(s->conn, id, -EINVAL,
				  "load of epoch %" PRIu64 " refused: epoch %" PRIu64
				  " of session %" PRIu64 " is %s",
				  req->epoch, s->epoch, s->id,
				  !s->paced			? "not paced"
				  : s->running && !s->paced_end ? "another epoch"
								: "over");
	if (req->end) {
		s->paced_end = true;
		pump(s);
		return 0;
	}
	if (s->nbatches - s->next_send >= SESS_PACED_MAX)
		return conn_error(s->conn, id, -ENOBUFS,
				  "more than %d paced batches requested and not yet delivered: "
				  "take some first",
				  SESS_PACED_MAX);
	r = paced_req(s, s->nbatches);
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
		return conn_error(s->conn, id, -ENOMEM, "out of memory");
	if (r->count) /* picks is NULL when there are none */
		memcpy(r->picks, req->picks, r->count * sizeof(*r->picks));
	if (why[0]) {
		r->error = req->n_picks > s->batch_size || req->n_picks == 0 ? -EINVAL : -ERANGE;
		r->errmsg = strdup(why);
	}
	s->nbatches++;
	pump(s);
	return 0;
}

int sess_start_epoch(struct sess *s, uint64_t id, const Pf__StartEpoch *req)
{
	struct conn *c = s->conn;
	struct order_spec spec = {0};
	uint64_t *picks = NULL, npicks = 0, nbatches;
	char err[256] = "";
	uint64_t t_req = now_ns(), t_order;
	int rc;

	if (req->epoch <= s->epoch && s->epoch != 0)
		return conn_error(c, id, -EINVAL, "epoch %" PRIu64 " is not after epoch %" PRIu64,
				  req->epoch, s->epoch);
	switch (req->order) {
	case PF__ORDER__ORDER_SEQUENTIAL: spec.kind = ORDER_SEQ; break;
	case PF__ORDER__ORDER_SHUFFLE: spec.kind = ORDER_SHUFFLE; break;
	case PF__ORDER__ORDER_EXPLICIT: spec.kind = ORDER_EXPLICIT; break;
	case PF__ORDER__ORDER_PACED: return start_paced(s, id, req);
	default: return conn_error(c, id, -EINVAL, "unknown order %d", req->order);
	}
	spec.seed = req->seed;
	spec.indices = req->indices;
	spec.nindices = req->n_indices;
	spec.rank = req->rank;
	spec.world = req->world;
	t_order = now_ns();
	picks = take_ahead(s, &spec, s->ds->num_samples * s->augment, &npicks);
	rc = picks ? 0
		   : order_build(&spec, s->ds->num_samples * s->augment, &picks, &npicks, err,
				 sizeof(err));
	t_order = now_ns() - t_order;
	if (rc)
		return conn_error(c, id, rc, "epoch %" PRIu64 ": %s", req->epoch,
				  err[0] ? err : strerror(-rc));
	nbatches = order_num_batches(npicks, s->batch_size, s->drop_last);
	if (req->start_batch > nbatches) {
		free(picks);
		return conn_error(c, id, -ERANGE,
				  "start_batch %" PRIu64 " is beyond the %" PRIu64
				  " batches of this share",
				  req->start_batch, nbatches);
	}

	if (s->running)
		log_info("session %" PRIu64 ": epoch %" PRIu64 " left unfinished by epoch %" PRIu64,
			 s->id, s->epoch, req->epoch);
	stop_epoch(s);
	s->paced = false;
	free(s->picks);
	s->picks = picks;
	s->npicks = npicks;
	s->nbatches = nbatches;
	s->epoch = req->epoch;
	s->start_batch = req->start_batch;
	s->next_fill = s->next_send = req->start_batch;
	s->sent = 0;
	s->running = true;
	s->epoch_started_ns = t_req; /* when the request came */
	s->first_sent = false;
	log_debug("session %" PRIu64 ": epoch %" PRIu64 ": order of %" PRIu64
		  " picks ready in %.1f ms",
		  s->id, s->epoch, npicks, t_order / 1e6);
	build_ahead(s, &spec, s->ds->num_samples * s->augment);
	gov_new_epoch(&s->gov);
	s->ns_read = s->ns_device = s->ns_turn = s->ns_client = s->ns_plan = s->timed = 0;
	if (s->pool)
		pool_new_epoch(s->pool, s->epoch);

	{
		Pf__Envelope env = PF__ENVELOPE__INIT;
		Pf__EpochStarted msg = PF__EPOCH_STARTED__INIT;

		msg.epoch = s->epoch;
		msg.batches = nbatches - req->start_batch;
		msg.samples = npicks;
		env.id = id;
		env.msg_case = PF__ENVELOPE__MSG_STARTED;
		env.started = &msg;
		rc = conn_send(c, &env, -1);
		if (rc)
			return rc;
	}
	pump(s);
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
	pump(s);
}

void sess_release(struct sess *s, const Pf__Release *req)
{
	struct slot *sl;

	if (req->slot < 0 || (uint32_t)req->slot >= s->nslots) {
		conn_error(s->conn, 0, -EINVAL,
			   "release of slot %d refused: session %" PRIu64 " has slots 0..%u",
			   req->slot, s->id, s->nslots - 1);
		return;
	}
	sl = &s->slots[req->slot];
	if (sl->state != SLOT_SENT || sl->epoch != req->epoch || sl->seq != req->seq) {
		conn_error(s->conn, 0, -EPERM,
			   "release of slot %d (epoch %" PRIu64 " batch %" PRIu64
			   ") refused: this session does not hold that batch in that slot",
			   req->slot, req->epoch, req->seq);
		return;
	}
	sl->state = SLOT_FREE;
	if (sl->t_sent && sl->epoch == s->epoch)
		s->ns_client += now_ns() - sl->t_sent;
	sl->t_sent = 0;
	pump(s);
}

int sess_abandon(struct sess *s, uint64_t id, const Pf__Abandon *req)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__Ok ok = PF__OK__INIT;

	if (req->epoch == s->epoch && s->running) {
		log_debug("session %" PRIu64 ": epoch %" PRIu64 " abandoned after %" PRIu64
			  " of %" PRIu64 " batches",
			  s->id, s->epoch, s->gov.consumed, s->nbatches - s->start_batch);
		stop_epoch(s);
	}
	env.id = id;
	env.msg_case = PF__ENVELOPE__MSG_OK;
	env.ok = &ok;
	return conn_send(s->conn, &env, -1);
}

/* The pool's budget from the same honest figure: what the trainer left
 * free, minus the reserve, minus the device slots the target still needs
 * (the target has first call on memory), plus what the pool holds already
 * (not in the free figure, but its own). */
static void size_pool(struct sess *s, uint64_t free_bytes, uint64_t total_bytes)
{
	const struct config *cfg = &s->d->cfg;
	uint64_t reserve, need = 0, have = pool_bytes(s->pool), budget, dev_free, dev_total;
	unsigned npools = 0;
	int64_t room;
	char why[160];

	/* The figure comes from a client: no larger than the device. */
	if (gpu_mem_info(s->gpu, &dev_free, &dev_total) == 0 && total_bytes > dev_total)
		total_bytes = dev_total;
	if (free_bytes > total_bytes)
		free_bytes = total_bytes;
	reserve = (uint64_t)(cfg->reserve_frac * (double)total_bytes);
	if (reserve < cfg->reserve_min)
		reserve = cfg->reserve_min;
	if (slots_wanted(s) > s->npresent)
		need = (uint64_t)(slots_wanted(s) - s->npresent) * s->slot_stride;
	/* Every pool in use on this GPU draws on the same free memory: each
	 * gets its share of the room (or of the shortfall). */
	for (const struct pool *p = s->d->pools; p; p = p->next)
		npools += p->gpu == s->gpu && p->sessions > 0 && p->enabled;
	if (npools == 0)
		npools = 1;
	room = ((int64_t)free_bytes - (int64_t)reserve - (int64_t)need) / (int64_t)npools;
	budget = room < 0 && (uint64_t)-room > have ? 0 : (uint64_t)((int64_t)have + room);
	snprintf(why, sizeof(why),
		 "probe: %.2f GiB free, reserve %.2f GiB, %.2f GiB for slots, %.2f GiB held, "
		 "%u pool(s)",
		 free_bytes / 1073741824.0, reserve / 1073741824.0, need / 1073741824.0,
		 have / 1073741824.0, npools);
	pool_set_budget(s->pool, budget, why);
}

void sess_probe(struct sess *s, const Pf__Probe *req)
{
	const struct config *cfg = &s->d->cfg;
	uint64_t own = 0;
	uint32_t was = s->gov.target;

	if (s->gpu < 0) {
		/* Host sessions have no device memory to size against. */
		s->gov.probe_free = req->free_bytes;
		s->gov.probe_total = req->total_bytes;
		return;
	}
	/* Our own arenas are not in the trainer's free figure but are ours to
	 * use, so they count as available to this session. */
	for (uint32_t i = 0; i < s->ngarenas; i++)
		own += s->garenas[i].bytes;
	gov_size_from_probe(&s->gov, req->free_bytes, req->total_bytes, own, s->slot_stride,
			    cfg->reserve_frac, cfg->reserve_min);
	s->grow_blocked = false;
	if (s->gov.target != was)
		log_info("session %" PRIu64 ": target %u -> %u (%s)", s->id, was, s->gov.target,
			 s->gov.reason);
	if (s->pool)
		size_pool(s, req->free_bytes, req->total_bytes);
	pump(s);
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
	s->conn = NULL;
	s->dead = true;
	stop_epoch(s);
	if (s->jobs == 0)
		sess_free(s);
}

/* ---- status -------------------------------------------------------------- */

void sess_status(const struct sess *s, Pf__SessionStatus *st)
{
	uint32_t held = 0, ready = 0;
	double age = (now_ns() - s->opened_ns) / 1e9;

	/* Held: batches the trainer has taken (acked) and not yet released;
	 * sent-but-untaken ones are still in the client's queue. */
	for (uint32_t i = 0; i < s->nslots; i++) {
		const struct slot *sl = &s->slots[i];

		held += sl->state == SLOT_SENT &&
			(sl->epoch != s->epoch || sl->seq < s->start_batch + s->gov.consumed);
		ready += sl->state == SLOT_READY;
	}
	st->session = s->id;
	st->name = (char *)s->name;
	st->dataset = s->ds->name;
	st->device = (char *)s->device;
	st->uid = s->uid;
	st->pid = s->pid;
	st->epoch = s->epoch;
	st->state = s->running ? "running" : s->epoch ? "idle" : "open";
	st->sent = s->sent;
	st->consumed = s->gov.consumed;
	st->held = held;
	st->target = s->gov.target;
	st->target_reason = (char *)s->gov.reason;
	st->slots = s->nslots;
	st->ring_fill = ready;
	st->arenas = s->narenas;
	st->arenas += s->ngarenas;
	for (uint32_t i = 0; i < s->narenas; i++)
		st->arena_bytes += s->arenas[i].bytes;
	for (uint32_t i = 0; i < s->ngarenas; i++)
		st->arena_bytes += s->garenas[i].bytes;
	st->bytes_sent = s->bytes_sent;
	st->wait_s = s->wait_s;
	st->busy_s = s->busy_s;
	st->stall_fraction = s->wait_s + s->busy_s > 0 ? s->wait_s / (s->wait_s + s->busy_s) : 0;
	st->errors = s->errors;
	st->age_s = age;
	/* Host sessions: what the readers moved per second of reading; CUDA
	 * sessions: what the copy stream moved per second of copying. */
	if (s->gpu >= 0)
		st->copy_gbps = s->copy_ns ? s->copy_bytes / (double)s->copy_ns : 0;
	else
		st->copy_gbps = s->read_ns ? s->bytes_sent / (double)s->read_ns : 0;
	st->probe_free = s->gov.probe_free;
	st->probe_total = s->gov.probe_total;
	st->min_depth = s->gov.min_depth;
	st->max_depth = s->gov.max_depth;
	st->batches = s->nbatches - s->start_batch;
	st->h2d_bytes = s->h2d_bytes;
	st->pool_hits = s->pool_hits;
	st->index_bytes = s->index_bytes;
}

bool sess_check(const struct sess *s)
{
	uint64_t working = s->alloc_pending + s->ahead.busy;

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
