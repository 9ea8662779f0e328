/*
 * sess_cuda.c — the CUDA half of a session (sess.h): its GPU, its device
 * slots, the ring slots that stage its batches, the copies (or pool
 * gathers) into the slots, and the honest probe that sizes its target and
 * its pool.
 *
 * Device slots come an arena at a time, on the GPU's transfer thread, as
 * the target grows.  An allocation that fails halves the target and is
 * tried again after a pause (SESS_OOM_TRIES in all); with the target at 1
 * the pool gives a slab back first.  When the tries run out, a session
 * with no device slot turns the batch that needed one into an error batch,
 * one with some goes on with what it has until the next probe.
 *
 * Below the pump, which it calls only through s->cuda.pump (a copy or an
 * allocation that came back, a back-off's end), and above sess_base.c
 * (sess_int.h).
 *
 * DESIGN: loop thread only.  The transfer thread sees only the jobs queued
 * here, which borrow the ring slot and the device slot of a session that
 * lives until they are back (s->jobs).
 */
#include "sess/sess_int.h"

#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/bigmem.h"
#include "state/daemon.h"
#include "data/dataset.h"
#include "sess/linger.h"
#include "base/log.h"
#include "util.h"
#include "gpu/xfer.h"

/* The daemon's ordinal of the GPU a CUDA session asks for: by PCI bus id
 * when the client sent one (its CUDA_VISIBLE_DEVICES may number GPUs
 * differently), else by the N of "cuda:N". */
int sess_cuda_pick_gpu(struct daemon *d, const Pf__OpenSession *req, int *gpu, char *err,
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
				 "check the daemon's CUDA_VISIBLE_DEVICES",
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

/* Joins the dataset's VRAM pool on this GPU (pool.h).  A batch stages its
 * misses plus up to a quarter of a batch of back-filled rows, so ring slots
 * grow by that much; a dataset that cannot be pooled is served without.
 * Returns the ring slots' stride. */
static int setup_pool(struct sess *s, const Pf__OpenSession *req, uint64_t *ring_stride)
{
	struct sess_cuda *c = &s->cuda;
	char why[160] = "";

	*ring_stride = s->lay.slot_stride;
	c->dev_stride = s->lay.slot_stride;
	c->pool = pool_get(&s->d->pools, s->ds, s->gpu, c->xfer, daemon_pool_enabled(s->d, s->ds),
			   why, sizeof(why));
	if (!c->pool) {
		log_info("session %" PRIu64 ": no VRAM pool for %s: %s", s->id, s->ds->name, why);
		return 0;
	}
	if (!c->pool->enabled) {
		/* Off: this session's ring slots stay the plain size, so it
		 * keeps the plain path even if the pool is turned on later. */
		pool_put(c->pool, 0);
		c->pool = NULL;
		return 0;
	}
	c->stage_cap = fill_stage_cap(s->batch_size);
	*ring_stride = fill_pooled_stride(s->ds, s->batch_size, s->lay.slot_stride);
	if (req->gather && c->pool->set->cfg.slab_ipc != GPU_IPC_NONE) {
		uint64_t admit_off;

		/* The client gathers: each device slot carries the largest
		 * staged prefix after its samples. */
		c->gather = true;
		c->ids32 = s->narrow;
		c->tail_off = s->lay.slot_stride;
		c->dev_stride = s->lay.slot_stride +
				align_up(fill_stage_layout(s->ds, s->batch_size, c->stage_cap,
							   &admit_off, NULL),
					 FILL_SLOT_ALIGN);
	} else {
		c->pool->daemon_gathers++; /* sess_cuda_release takes it back */
	}
	for (uint32_t i = 0; i < s->nslots; i++) {
		s->slots[i].stage_off = calloc(s->ds->nfields, sizeof(uint64_t));
		if (!s->slots[i].stage_off || pool_plan_alloc(&s->slots[i].plan, c->stage_cap))
			return -ENOMEM;
	}
	return 0;
}

int sess_cuda_setup(struct sess *s, const Pf__OpenSession *req, char *err, size_t errlen)
{
	struct daemon *d = s->d;
	struct sess_cuda *c = &s->cuda;
	const struct config *cfg = &d->cfg;
	uint64_t ring_stride;
	uint32_t want;
	int rc;

	/* Pools are made by CUDA sessions, so this is before any slab can go:
	 * the pool layer (gpu/) tells the sessions through this pointer, never
	 * by name. */
	d->pools.slab_gone = sess_cuda_slab_gone;
	d->pools.gone_arg = d;
	switch (req->ipc) {
	case PF__IPC__IPC_FD: c->ipc = GPU_IPC_FD; break;
	case PF__IPC__IPC_LEGACY: c->ipc = GPU_IPC_LEGACY; break;
	default: c->ipc = cfg->ipc && strcmp(cfg->ipc, "legacy") == 0 ? GPU_IPC_LEGACY : GPU_IPC_FD;
	}
	if (!d->xfers[s->gpu]) {
		rc = xfer_start(&d->xfers[s->gpu], s->gpu, d->loop, sess_xfer_done, d, err, errlen);
		if (rc)
			return rc;
		log_info("GPU %d: transfer thread started", s->gpu);
	}
	c->xfer = d->xfers[s->gpu];
	rc = setup_pool(s, req, &ring_stride);
	if (rc) {
		snprintf(err, errlen, "out of memory for the pool's batch plans");
		return rc;
	}
	/* Ring slots: enough for every reader to work on a batch of this
	 * session plus one being copied, never more than can be in flight;
	 * min_depth + 1 of them are kept for it whatever the others take. */
	want = cfg->readers + 2;
	if (want > s->gov.max_depth + 1)
		want = s->gov.max_depth + 1;
	rc = ring_lease_take(&d->ring, &c->lease, s, s->gpu, want, s->gov.min_depth + 1,
			     ring_stride, err, errlen);
	if (rc)
		return rc;
	for (uint32_t i = 0; i < s->nslots; i++)
		s->slots[i].ring = -1;
	uv_timer_init(d->loop, &c->retry);
	c->retry.data = s;
	c->retry_live = true;
	/* A pool lingering on this GPU may hold memory this trainer is about
	 * to allocate: look at once, not at the next probe. */
	linger_kick(d, s->gpu);
	return 0;
}

void sess_cuda_release(struct sess *s)
{
	struct sess_cuda *c = &s->cuda;

	if (c->pool && !c->gather)
		c->pool->daemon_gathers--;
	bool lingers = c->pool && pool_put(c->pool, daemon_pool_linger(s->d, s->ds));

	free(c->slab_sent);
	/* Device arenas are released on their transfer thread (the calls
	 * block); by now every copy into them has completed. */
	for (uint32_t i = 0; i < c->narenas; i++)
		xfer_free_mem(c->xfer, &c->arenas[i]);
	/* After the frees: the probe is read behind them (FIFO), so this
	 * session's arenas count as free. */
	if (lingers)
		linger_kick(s->d, s->gpu);
	free(c->arenas);
	ring_lease_give(&s->d->ring, &c->lease);
}

int sess_cuda_push_arena(struct sess *s, uint32_t a, const struct peer *to)
{
	struct gpu_mem *ga = &s->cuda.arenas[a];
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__Arena msg = PF__ARENA__INIT;
	int fd = -1;

	msg.id = a;
	msg.bytes = ga->bytes;
	msg.device = s->gpu;
	if (ga->kind == GPU_IPC_FD) {
		/* A copy for each send: a share's members join later and each
		 * maps the arena (share.c); the arena's own fd goes with it. */
		msg.kind = PF__ARENA_KIND__ARENA_CUDA_FD;
		fd = fcntl(ga->export_fd, F_DUPFD_CLOEXEC, 0);
		if (fd < 0)
			return -errno;
	} else {
		msg.kind = PF__ARENA_KIND__ARENA_CUDA_LEGACY;
		msg.legacy_handle.data = ga->legacy_handle;
		msg.legacy_handle.len = GPU_IPC_HANDLE_BYTES;
	}
	env.msg_case = PF__ENVELOPE__MSG_ARENA;
	env.arena = &msg;
	return peer_send(to, &env, fd);
}

/* Device slots wanted now: the target in flight plus what the trainer may
 * hold, within the session's slot count. */
static uint32_t slots_wanted(const struct sess *s)
{
	uint64_t want = (uint64_t)s->gov.target + SESS_HOLD_SLOTS;

	return want < s->nslots ? (uint32_t)want : s->nslots;
}

void sess_cuda_grow(struct sess *s)
{
	struct sess_cuda *c = &s->cuda;
	struct xfer_job *job;
	uint64_t per_arena, k;

	if (c->alloc_pending || c->grow_blocked || uv_is_active((uv_handle_t *)&c->retry) ||
	    c->npresent >= slots_wanted(s))
		return;
	k = slots_wanted(s) - c->npresent;
	per_arena = s->d->cfg.arena_bytes / c->dev_stride;
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
	job->bytes = k * c->dev_stride;
	job->ipc = c->ipc;
	if (s->d->test_fail_allocs > 0) {
		s->d->test_fail_allocs--;
		job->inject_enomem = true;
	}
	c->alloc_pending = true;
	s->jobs++;
	xfer_submit(c->xfer, job);
}

/* The allocation's tries ran out.  With no device slot at all the batch
 * that needed one becomes an error batch (the epoch goes on, and the next
 * batch tries again); with some, the session goes on with what it has. */
static void give_up_alloc(struct sess *s, const char *why)
{
	struct slot *sl = NULL;
	char why_full[300];

	s->cuda.oom_tries = 0;
	if (s->cuda.npresent > 0) {
		s->cuda.grow_blocked = true;
		log_warn("session %" PRIu64 ": going on with %u device slot(s): %s", s->id,
			 s->cuda.npresent, why);
		return;
	}
	/* Asked for while the order was built (sess_pump): the batch that
	 * needs the slot is not known yet; the pump asks again after the
	 * build, with tries of its own. */
	if (!s->running || s->building || s->next_fill >= s->nbatches)
		return;
	for (uint32_t i = 0; i < s->nslots && !sl; i++)
		if (!s->slots[i].present && s->slots[i].state == SLOT_FREE)
			sl = &s->slots[i];
	if (!sl)
		return;
	snprintf(why_full, sizeof(why_full),
		 "device out of memory on %s: no device slot after %d tries: %s", s->device,
		 SESS_OOM_TRIES, why);
	sess_fill_error(s, sl, -ENOMEM, why_full);
}

static void on_retry(uv_timer_t *t)
{
	struct sess *s = t->data;

	s->cuda.pump(s);
}

static void alloc_done(struct sess *s, struct xfer_job *job)
{
	struct sess_cuda *c = &s->cuda;
	struct gpu_mem *t, *a;
	uint64_t k;

	c->alloc_pending = false;
	if (job->rc && s->gov.target <= 1 && c->pool && c->oom_tries + 1 < SESS_OOM_TRIES &&
	    pool_give_slab(c->pool, "a device slot allocation failed with the target at 1")) {
		/* The try counts: a slab still read by batches in flight is
		 * freed only after them, so a retry can fail again. */
		c->oom_tries++;
		/* The target is at its floor: the pool makes room instead.
		 * The slab's release is queued before the retry, so the
		 * retry sees the memory. */
		log_warn("session %" PRIu64 ": a %.1f MiB device arena on %s failed (%s); the "
			 "pool gave a slab back, retrying",
			 s->id, job->bytes / 1048576.0, s->device, job->err);
		uv_timer_start(&c->retry, on_retry, SESS_OOM_PAUSE_MS, 0);
		return;
	}
	if (job->rc) {
		c->oom_tries++;
		gov_halve(&s->gov);
		log_warn("session %" PRIu64 ": a %.1f MiB device arena on %s failed (%s), try %u "
			 "of %d; target halved to %u",
			 s->id, job->bytes / 1048576.0, s->device, job->err, c->oom_tries,
			 SESS_OOM_TRIES, s->gov.target);
		if (c->oom_tries < SESS_OOM_TRIES)
			uv_timer_start(&c->retry, on_retry, SESS_OOM_PAUSE_MS * c->oom_tries, 0);
		else
			give_up_alloc(s, job->err);
		return;
	}
	t = realloc(c->arenas, (c->narenas + 1) * sizeof(*t));
	if (!t) {
		log_err("session %" PRIu64 ": out of memory keeping a device arena", s->id);
		xfer_free_mem(c->xfer, &job->mem);
		return;
	}
	c->arenas = t;
	a = &c->arenas[c->narenas];
	*a = job->mem;
	job->mem = (struct gpu_mem){.export_fd = -1}; /* the session owns it now */
	c->oom_tries = 0;
	k = a->bytes / c->dev_stride; /* the rounding may hold more */
	if (k > s->nslots - c->npresent)
		k = s->nslots - c->npresent;
	for (uint64_t i = 0; i < k; i++) {
		struct slot *sl = &s->slots[c->npresent + i];

		sl->present = true;
		sl->arena = c->narenas;
		sl->offset = i * c->dev_stride;
		sl->dev_addr = a->base + sl->offset;
	}
	c->npresent += (uint32_t)k;
	c->narenas++;
	log_debug("session %" PRIu64 ": device arena %u, %.1f MiB, %" PRIu64 " slots (%u in all)",
		  s->id, c->narenas - 1, a->bytes / 1048576.0, k, c->npresent);
	sess_cuda_push_arena(s, c->narenas - 1, s->peer);
}

/* A transfer job of a live or dead session came back (loop thread). */
void sess_xfer_done(struct xfer_job *job, void *arg)
{
	struct sess *s = job->owner;
	struct sess_cuda *c = &s->cuda;
	struct slot *sl;

	s->jobs--;
	if (job->kind == XFER_ALLOC) {
		if (s->dead) {
			c->alloc_pending = false;
			xfer_free_mem(c->xfer, &job->mem); /* nobody will use it */
		} else {
			alloc_done(s, job);
		}
		goto out;
	}
	sl = &s->slots[job->slot];
	ring_slot_put(&c->lease, sl->ring);
	sl->ring = -1;
	if (sl->plan.active) {
		/* The gather has completed (or failed): admissions publish
		 * even for an orphan, whose rows were written all the same. */
		if (!job->rc) {
			c->h2d_bytes += (uint64_t)sl->plan.nstaged * s->ds->sample_bytes;
			c->index_bytes +=
				job->bytes - (uint64_t)sl->plan.nstaged * s->ds->sample_bytes;
			c->pool_hits += sl->plan.hits;
		}
		/* A batch its client gathers keeps its slabs pinned until the
		 * client has released it: its kernel reads them till then. */
		if (sl->plan.ids && !job->rc && !s->dead && sl->state != SLOT_ORPHAN)
			pool_plan_publish(c->pool, &sl->plan, true);
		else
			pool_plan_done(c->pool, &sl->plan, job->rc == 0);
	} else if (!job->rc) {
		c->h2d_bytes += job->bytes;
	}
	if (s->dead)
		goto out;
	if (sl->state == SLOT_ORPHAN) {
		sl->state = SLOT_FREE;
	} else if (job->rc) {
		sl->state = SLOT_READY;
		sess_slot_error(s, sl, job->rc, job->err);
	} else {
		sl->state = SLOT_READY;
		sl->t_ready = now_ns();
		c->copy_bytes += job->bytes;
		c->copy_ns += job->copy_ns;
	}
out:
	free(job);
	if (s->dead) {
		sess_maybe_free(s);
		return;
	}
	c->pump(s);
}

/* A narrow client's inline ids are the pool's entry ids cut to 4 bytes
 * (ids_inline): that loses nothing only while the index keeps them so. */
_Static_assert(sizeof(((const struct pool *)0)->loc[0]) == sizeof(uint32_t) &&
		       POOL_PENDING <= UINT32_MAX,
	       "pool entry ids no longer fit the 4 bytes of BatchReady.gather_ids32");

/* A batch its client gathers whose every row is a hit needs nothing of the
 * GPU here: its entry ids leave in the BatchReady and the client uploads
 * them itself, so the daemon's context does no work on the trainer's GPU
 * in steady state (a copy from another context preempts the trainer's
 * kernels: bench/NOTES.md).  False when it is not such a batch. */
static bool ids_inline(struct sess *s, struct slot *sl)
{
	struct sess_cuda *c = &s->cuda;
	const uint64_t *desc;
	uint64_t now;

	if (!sl->plan.active || !sl->plan.ids || sl->plan.nstaged)
		return false;
	desc = (const uint64_t *)ring_slot_mem(&c->lease, sl->ring);
	if (!sl->rows)
		sl->rows = big_alloc((size_t)s->batch_size * sizeof(uint64_t));
	if (!sl->rows)
		return false; /* the copy path still works */
	if (c->ids32) {
		/* Packed into the first half of rows, straight from the
		 * plan's index: its words are entry ids, which the pool keeps
		 * as uint32 below POOL_PENDING (sess_cuda.ids32), so none
		 * loses a bit. */
		uint32_t *ids = (uint32_t *)(void *)sl->rows;

		for (uint32_t i = 0; i < sl->plan.count; i++)
			ids[i] = htole32((uint32_t)desc[i]);
	} else {
		memcpy(sl->rows, desc, (size_t)sl->plan.count * sizeof(uint64_t));
	}
	ring_slot_put(&c->lease, sl->ring);
	sl->ring = -1;
	c->pool_hits += sl->plan.hits;
	sl->ids_inline = true;
	sl->state = SLOT_READY;
	now = now_ns();
	sl->t_copy = sl->t_ready = now;
	return true;
}

void sess_cuda_copy(struct sess *s, struct slot *sl)
{
	struct sess_cuda *c = &s->cuda;
	struct xfer_job *job;

	if (ids_inline(s, sl))
		return;
	job = calloc(1, sizeof(*job));

	if (!job) {
		if (sl->plan.active)
			pool_plan_done(c->pool, &sl->plan, false);
		ring_slot_put(&c->lease, sl->ring);
		sl->ring = -1;
		sl->state = SLOT_READY;
		sess_slot_error(s, sl, -ENOMEM, "out of memory queueing a copy to the device");
		return;
	}
	job->kind = XFER_COPY;
	job->owner = s;
	job->slot = (uint32_t)(sl - s->slots);
	job->epoch = sl->epoch;
	job->seq = sl->seq;
	job->src = ring_slot_mem(&c->lease, sl->ring);
	job->dst = sl->dev_addr;
	job->bytes = s->lay.slot_bytes;
	if (sl->plan.active) {
		job->gather = true;
		job->bytes = sl->stage_bytes;
		fill_gather(&job->g, c->pool, s->ds, &sl->plan, s->lay.field_offset, sl->stage_off);
	}
	if (sl->plan.active && sl->plan.ids) {
		job->client_gather = true;
		job->dst = sl->dev_addr + c->tail_off;
		for (uint32_t k = 0; k < sl->plan.nstaged && !job->admits; k++)
			job->admits = sl->plan.admit[k] != POOL_NONE;
	}
	sl->state = SLOT_COPYING;
	sl->t_copy = now_ns();
	s->jobs++;
	xfer_submit(c->xfer, job);
}

/* The slots this session's target still wants and has not got. */
static uint64_t slots_need(const struct sess *s)
{
	uint32_t want = slots_wanted(s);

	return want > s->cuda.npresent ? (uint64_t)(want - s->cuda.npresent) * s->lay.slot_stride
				       : 0;
}

/* The pool's budget from the same honest figure: what the trainer left
 * free, minus the reserve, minus the device slots the target still needs
 * (the target has first call on memory), plus what the pool holds already
 * (not in the free figure, but its own). */
static void size_pool(struct sess *s, uint64_t free_bytes, uint64_t total_bytes)
{
	const struct config *cfg = &s->d->cfg;
	uint64_t reserve, need, have = pool_bytes(s->cuda.pool), budget, dev_free, dev_total;
	unsigned npools;
	int64_t room;
	char why[160];

	/* The figure comes from a client: no larger than the device. */
	if (gpu_mem_info(s->gpu, &dev_free, &dev_total) == 0 && total_bytes > dev_total)
		total_bytes = dev_total;
	if (free_bytes > total_bytes)
		free_bytes = total_bytes;
	reserve = gov_reserve(total_bytes, cfg->reserve_frac, cfg->reserve_min);
	need = slots_need(s);
	/* Every pool in use on this GPU draws on the same free memory: each
	 * gets its share of the room (or of the shortfall). */
	npools = pool_active_on(&s->d->pools, s->gpu);
	if (npools == 0)
		npools = 1;
	room = ((int64_t)free_bytes - (int64_t)reserve - (int64_t)need) / (int64_t)npools;
	budget = room < 0 && (uint64_t)-room > have ? 0 : (uint64_t)((int64_t)have + room);
	snprintf(why, sizeof(why),
		 "probe: %.2f GiB free, reserve %.2f GiB, %.2f GiB for slots, %.2f GiB held, "
		 "%u pool(s)",
		 free_bytes / 1073741824.0, reserve / 1073741824.0, need / 1073741824.0,
		 have / 1073741824.0, npools);
	pool_set_budget(s->cuda.pool, budget, why);
}

void sess_cuda_probe(struct sess *s, uint64_t free_bytes, uint64_t total_bytes)
{
	const struct config *cfg = &s->d->cfg;
	uint64_t own = 0;
	uint32_t was = s->gov.target;

	/* Our own arenas are not in the trainer's free figure but are ours to
	 * use, so they count as available to this session. */
	for (uint32_t i = 0; i < s->cuda.narenas; i++)
		own += s->cuda.arenas[i].bytes;
	gov_size_from_probe(&s->gov, free_bytes, total_bytes, own, s->lay.slot_stride,
			    cfg->reserve_frac, cfg->reserve_min);
	s->cuda.grow_blocked = false;
	if (s->gov.target != was)
		log_info("session %" PRIu64 ": target %u -> %u (%s)", s->id, was, s->gov.target,
			 s->gov.reason);
	/* Pools lingering on this GPU come after a trainer that is here:
	 * what it is short of, they give back first. */
	linger_trainer_probe(s->d, s->gpu, free_bytes, total_bytes, slots_need(s));
	if (s->cuda.pool)
		size_pool(s, free_bytes, total_bytes);
}

/* ---- the client's gather ---------------------------------------------------- */

/* Sends slab j of the session's pool (its fd, a duplicate, goes with it:
 * the slab keeps its own for the next session). */
static int push_slab(struct sess *s, uint32_t j)
{
	struct sess_cuda *c = &s->cuda;
	const struct pool_slab *sl = &c->pool->slabs[j];
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__PoolSlab msg = PF__POOL_SLAB__INIT;
	int fd = -1, rc;

	if (j >= c->nslab_sent) {
		uint32_t n = c->pool->nslabs > j + 1 ? c->pool->nslabs : j + 1;
		uint32_t *t = realloc(c->slab_sent, n * sizeof(*t));

		if (!t)
			return -ENOMEM;
		memset(t + c->nslab_sent, 0, (n - c->nslab_sent) * sizeof(*t));
		c->slab_sent = t;
		c->nslab_sent = n;
	}
	msg.id = j;
	msg.gen = sl->gen;
	msg.bytes = sl->mem.bytes;
	if (sl->mem.kind == GPU_IPC_FD) {
		msg.kind = PF__ARENA_KIND__ARENA_CUDA_FD;
		fd = fcntl(sl->mem.export_fd, F_DUPFD_CLOEXEC, 0);
		if (fd < 0)
			return -errno;
	} else {
		msg.kind = PF__ARENA_KIND__ARENA_CUDA_LEGACY;
		msg.legacy_handle.data = (uint8_t *)sl->mem.legacy_handle;
		msg.legacy_handle.len = GPU_IPC_HANDLE_BYTES;
	}
	env.msg_case = PF__ENVELOPE__MSG_POOL_SLAB;
	env.pool_slab = &msg;
	/* Marked once it is out: a send that failed (out of memory) leaves it
	 * to the next batch that reads it, never to a batch gathered without
	 * it (the kernel skips rows of slabs it does not have). */
	rc = peer_send(s->peer, &env, fd);
	if (!rc)
		c->slab_sent[j] = sl->gen;
	return rc;
}

void sess_cuda_push_pool(struct sess *s)
{
	struct sess_cuda *c = &s->cuda;

	/* A warm pool (lingering, or another session's): the client maps its
	 * slabs while the epoch's order is built, not in front of the first
	 * batch (16 slabs of 256 MiB for 4 GiB, 0.15 ms each).  At StartEpoch,
	 * not at open: a trainer that opens its Loader and then builds its
	 * model for a minute does not hold slabs the pool may have to give
	 * back meanwhile.  During an epoch, the slabs it fills follow as each
	 * batch goes (sess_pump).  A slab dropped later is announced gone like
	 * any other. */
	if (!c->gather)
		return;
	for (uint32_t j = 0; j < c->pool->nslabs; j++) {
		const struct pool_slab *sl = &c->pool->slabs[j];
		int rc;

		if (!sl->gen || !sl->live || sl->dying || !sl->used ||
		    (j < c->nslab_sent && c->slab_sent[j] == sl->gen))
			continue;
		rc = push_slab(s, j);
		if (rc) {
			/* Only early: the first batch that reads it sends it. */
			log_debug("session %" PRIu64 ": pool slab %u not sent ahead: %s", s->id, j,
				  strerror(-rc));
			return;
		}
	}
}

int sess_cuda_gather_msg(struct sess *s, struct slot *sl, Pf__BatchReady *msg, uint64_t *staged_off)
{
	struct sess_cuda *c = &s->cuda;
	uint64_t base = sl->offset + c->tail_off;
	int rc;

	/* Every slab a row reads is pinned by the plan: the client gets each
	 * once, before the first batch that needs it. */
	for (uint32_t i = 0; i < sl->plan.npinned; i++) {
		uint32_t j = sl->plan.pinned[i];

		if (j < c->nslab_sent && c->slab_sent[j] == c->pool->slabs[j].gen)
			continue;
		rc = push_slab(s, j);
		if (rc)
			return rc;
	}
	for (uint32_t f = 0; f < s->ds->nfields; f++)
		staged_off[f] = base + sl->stage_off[f];
	msg->gather = true;
	msg->gather_desc = base;
	if (sl->ids_inline && c->ids32) {
		msg->gather_ids32.data = (uint8_t *)sl->rows;
		msg->gather_ids32.len = (size_t)sl->plan.count * sizeof(uint32_t);
		sl->ids_inline = false;
	} else if (sl->ids_inline) {
		msg->gather_ids.data = (uint8_t *)sl->rows;
		msg->gather_ids.len = (size_t)sl->plan.count * sizeof(uint64_t);
		sl->ids_inline = false;
	}
	msg->nstaged = sl->plan.nstaged;
	msg->n_staged_off = s->ds->nfields;
	msg->staged_off = staged_off;
	return 0;
}

void sess_cuda_unpin(struct sess *s, struct slot *sl)
{
	if (sl->plan.active)
		pool_plan_done(s->cuda.pool, &sl->plan, true);
}

void sess_cuda_slab_gone(void *arg, const struct pool *p, uint32_t slab, uint32_t gen)
{
	struct daemon *d = arg;

	for (struct sess *s = d->sessions; s; s = s->next) {
		struct sess_cuda *c = &s->cuda;
		Pf__Envelope env = PF__ENVELOPE__INIT;
		Pf__PoolSlabGone msg = PF__POOL_SLAB_GONE__INIT;

		if (c->pool != p || slab >= c->nslab_sent || c->slab_sent[slab] != gen)
			continue;
		c->slab_sent[slab] = 0;
		if (!s->peer)
			continue;
		msg.id = slab;
		msg.gen = gen;
		env.msg_case = PF__ENVELOPE__MSG_POOL_SLAB_GONE;
		env.pool_slab_gone = &msg;
		peer_send(s->peer, &env, -1);
	}
}
