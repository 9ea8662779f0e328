/*
 * ring.c — the pinned reader ring and its first-fit range allocator (see
 * ring.h).
 *
 * DESIGN: pieces are few (a handful of batches in flight per CUDA
 * session, each one piece), so a sorted singly linked free list with
 * coalescing on give is all the allocator needs, a lease's slots a linear
 * scan, and the fair shares a quadratic pass over the leases when one is
 * taken or given back.  Loop thread only, apart from init and destroy on
 * the main thread.
 */
#include "mem/ring.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "gpu/gpu.h"
#include "base/log.h"
#include "util.h"

#define RING_MAP_ALIGN (2u << 20)

int ring_init(struct ring *r, uint64_t bytes, char *err, size_t errlen)
{
	void *p;
	int rc;

	memset(r, 0, sizeof(*r));
	if (bytes == 0) {
		snprintf(err, errlen, "ring_bytes is 0");
		return -EINVAL;
	}
	bytes = align_up(bytes, RING_MAP_ALIGN);
	p = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		rc = -errno;
		snprintf(err, errlen, "cannot map a %.0f MiB ring: %s", bytes / 1048576.0,
			 strerror(errno));
		return rc;
	}
	/* Huge pages where the kernel allows: fewer pages for the driver to
	 * pin and for the DMA engine to walk. */
	madvise(p, (size_t)bytes, MADV_HUGEPAGE);
	rc = gpu_host_register(p, (size_t)bytes);
	if (rc) {
		snprintf(err, errlen, "cannot page-lock a %.0f MiB ring: %s", bytes / 1048576.0,
			 strerror(-rc));
		munmap(p, (size_t)bytes);
		return rc;
	}
	r->free = calloc(1, sizeof(*r->free));
	if (!r->free) {
		gpu_host_unregister(p);
		munmap(p, (size_t)bytes);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	r->free->bytes = bytes;
	r->base = p;
	r->bytes = bytes;
	r->registered = true;
	return 0;
}

void ring_destroy(struct ring *r)
{
	while (r->free) {
		struct ring_range *n = r->free->next;

		free(r->free);
		r->free = n;
	}
	if (r->used)
		log_warn("pinned ring destroyed with %.1f MiB still taken", r->used / 1048576.0);
	if (r->base) {
		if (r->registered)
			gpu_host_unregister(r->base);
		munmap(r->base, (size_t)r->bytes);
	}
	memset(r, 0, sizeof(*r));
}

int ring_take(struct ring *r, uint64_t bytes, uint64_t *off)
{
	struct ring_range **pp;

	bytes = align_up(bytes ? bytes : 1, RING_ALIGN);
	for (pp = &r->free; *pp; pp = &(*pp)->next) {
		struct ring_range *f = *pp;

		if (f->bytes < bytes)
			continue;
		*off = f->off;
		f->off += bytes;
		f->bytes -= bytes;
		if (f->bytes == 0) {
			*pp = f->next;
			free(f);
		}
		r->used += bytes;
		return 0;
	}
	return -ENOSPC;
}

void ring_give(struct ring *r, uint64_t off, uint64_t bytes)
{
	struct ring_range **pp, *prev = NULL, *n;

	bytes = align_up(bytes ? bytes : 1, RING_ALIGN);
	r->used -= bytes;
	for (pp = &r->free; *pp && (*pp)->off < off; pp = &(*pp)->next)
		prev = *pp;
	/* Merge with the range before, the one after, or both. */
	if (prev && prev->off + prev->bytes == off) {
		prev->bytes += bytes;
		if (*pp && prev->off + prev->bytes == (*pp)->off) {
			n = *pp;
			prev->bytes += n->bytes;
			prev->next = n->next;
			free(n);
		}
		return;
	}
	if (*pp && off + bytes == (*pp)->off) {
		(*pp)->off = off;
		(*pp)->bytes += bytes;
		return;
	}
	n = malloc(sizeof(*n));
	if (!n) {
		/* Only leaks the range's bytes for the daemon's lifetime. */
		log_err("out of memory giving back %.1f MiB of the pinned ring", bytes / 1048576.0);
		return;
	}
	n->off = off;
	n->bytes = bytes;
	n->next = *pp;
	*pp = n;
}

uint64_t ring_largest_free(const struct ring *r)
{
	uint64_t best = 0;

	for (const struct ring_range *f = r->free; f; f = f->next)
		if (f->bytes > best)
			best = f->bytes;
	return best;
}

/* One claimant of a water-filling: it asks for demand bytes and gets give. */
struct claim {
	uint64_t demand, give;
	int gpu;
	struct ring_lease *lease; /* borrowed: NULL for a GPU's claim */
};

/* Splits budget between n claims as water fills vessels: a claim that asks
 * for less than an even share gets what it asks, and what it leaves is
 * shared again by the others. */
static void water_fill(struct claim *c, size_t n, uint64_t budget)
{
	size_t left = n;
	bool settled;

	for (size_t i = 0; i < n; i++)
		c[i].give = UINT64_MAX;
	while (left) {
		uint64_t even = budget / left;

		settled = false;
		for (size_t i = 0; i < n; i++) {
			if (c[i].give != UINT64_MAX || c[i].demand > even)
				continue;
			c[i].give = c[i].demand;
			budget -= c[i].demand;
			left--;
			settled = true;
		}
		if (settled)
			continue;
		for (size_t i = 0; i < n; i++)
			if (c[i].give == UINT64_MAX)
				c[i].give = even;
		break;
	}
}

void ring_rebalance(struct ring *r)
{
	struct claim *gpus, *own;
	size_t n = 0, ngpus = 0;

	for (struct ring_lease *l = r->leases; l; l = l->next)
		n++;
	if (!n)
		return;
	gpus = calloc(2 * n, sizeof(*gpus));
	if (!gpus) {
		/* Only the shares above the minimums are lost, not a slot. */
		log_err("out of memory sharing the pinned ring: every session keeps its minimum");
		for (struct ring_lease *l = r->leases; l; l = l->next)
			l->cap = l->min;
		return;
	}
	own = gpus + n;
	/* First between the GPUs: each has its own link and copy stream,
	 * which one GPU's sessions must not starve. */
	for (struct ring_lease *l = r->leases; l; l = l->next) {
		size_t g;

		for (g = 0; g < ngpus && gpus[g].gpu != l->gpu; g++)
			;
		if (g == ngpus) {
			gpus[g].gpu = l->gpu;
			ngpus++;
		}
		gpus[g].demand += (uint64_t)l->nslots * l->stride;
	}
	water_fill(gpus, ngpus, r->bytes);
	/* Then between the sessions of each GPU. */
	for (size_t g = 0; g < ngpus; g++) {
		size_t m = 0;

		for (struct ring_lease *l = r->leases; l; l = l->next) {
			if (l->gpu != gpus[g].gpu)
				continue;
			own[m].demand = (uint64_t)l->nslots * l->stride;
			own[m].lease = l;
			m++;
		}
		water_fill(own, m, gpus[g].give);
		for (size_t i = 0; i < m; i++) {
			struct ring_lease *l = own[i].lease;
			uint64_t slots = own[i].give / l->stride;

			l->cap = slots < l->min	     ? l->min
				 : slots > l->nslots ? l->nslots
						     : (uint32_t)slots;
		}
	}
	free(gpus);
}

static void unqueue(struct ring *r, struct ring_lease *l)
{
	struct ring_lease **pp, *prev = NULL;

	if (!l->queued)
		return;
	for (pp = &r->wait_head; *pp != l; pp = &(*pp)->next_wait)
		prev = *pp;
	*pp = l->next_wait;
	if (r->wait_tail == l)
		r->wait_tail = prev;
	l->next_wait = NULL;
	l->queued = false;
}

static void enqueue(struct ring *r, struct ring_lease *l, bool first)
{
	if (l->queued)
		return;
	l->queued = true;
	if (first || !r->wait_head) {
		l->next_wait = r->wait_head;
		r->wait_head = l;
		if (!r->wait_tail)
			r->wait_tail = l;
		return;
	}
	l->next_wait = NULL;
	r->wait_tail->next_wait = l;
	r->wait_tail = l;
}

/* The first waiter gets the turn and is told so, unless someone has it. */
static void hand_turn(struct ring *r)
{
	struct ring_lease *l = r->wait_head;

	if (r->turn || !l)
		return;
	unqueue(r, l);
	r->turn = l;
	if (r->wake)
		r->wake(l->owner);
}

/* l wants no slot now: it gives up its place, and its turn if it has one. */
static void step_aside(struct ring *r, struct ring_lease *l)
{
	unqueue(r, l);
	if (r->turn == l) {
		r->turn = NULL;
		hand_turn(r);
	}
}

int ring_lease_take(struct ring *r, struct ring_lease *l, void *owner, int gpu, uint32_t want,
		    uint32_t min, uint64_t stride, char *err, size_t errlen)
{
	uint32_t nsess = 0;

	memset(l, 0, sizeof(*l));
	stride = align_up(stride ? stride : 1, RING_ALIGN);
	if (min < 1)
		min = 1;
	if (want < min)
		want = min;
	for (struct ring_lease *o = r->leases; o; o = o->next)
		nsess++;
	if (!r->base || (uint64_t)min * stride > r->bytes - r->reserved) {
		set_err(err, errlen,
			"the pinned ring has no room for %u batch(es) of %.1f MiB (min_depth + 1): "
			"ring_bytes = %.0f MiB, of which %u session(s) keep %.1f MiB for their own "
			"minimums",
			min, stride / 1048576.0, r->bytes / 1048576.0, nsess,
			r->reserved / 1048576.0);
		return -ENOSPC;
	}
	l->off = malloc((size_t)want * sizeof(*l->off));
	if (!l->off) {
		set_err(err, errlen, "out of memory");
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < want; i++)
		l->off[i] = RING_NO_PIECE;
	l->ring = r;
	l->owner = owner;
	l->gpu = gpu;
	l->stride = stride;
	l->nslots = want;
	l->min = min;
	l->next = r->leases;
	r->leases = l;
	r->reserved += (uint64_t)min * stride;
	ring_rebalance(r);
	return 0;
}

void ring_lease_give(struct ring *r, struct ring_lease *l)
{
	struct ring_lease **pp;

	if (!l->ring)
		return;
	if (l->held)
		log_warn("a session gave back its share of the pinned ring with %u slot(s) still "
			 "held",
			 l->held);
	for (uint32_t i = 0; i < l->nslots; i++)
		if (l->off[i] != RING_NO_PIECE)
			ring_give(r, l->off[i], l->stride);
	for (pp = &r->leases; *pp != l; pp = &(*pp)->next)
		;
	*pp = l->next;
	unqueue(r, l);
	if (r->turn == l)
		r->turn = NULL;
	r->reserved -= (uint64_t)l->min * l->stride;
	free(l->off);
	memset(l, 0, sizeof(*l));
	ring_rebalance(r);
	hand_turn(r);
}

int32_t ring_slot_get(struct ring_lease *l)
{
	struct ring *r = l->ring;
	uint64_t off;
	uint32_t i;

	if (l->held >= l->cap) {
		/* Its own slots come back soon and pump it: it needs no place. */
		step_aside(r, l);
		return -1;
	}
	if (r->turn ? r->turn != l : r->wait_head && r->wait_head != l) {
		r->waits += !l->queued;
		enqueue(r, l, false);
		return -1;
	}
	if (ring_take(r, l->stride, &off)) {
		/* The turn's holder keeps its place at the front (the next
		 * piece given back is its): the same wait, not a new one. */
		if (r->turn == l)
			r->turn = NULL;
		else
			r->waits += !l->queued;
		enqueue(r, l, true);
		return -1;
	}
	for (i = 0; l->off[i] != RING_NO_PIECE; i++)
		;
	l->off[i] = off;
	l->held++;
	unqueue(r, l);
	if (r->turn == l)
		r->turn = NULL;
	/* What is left may fit the next waiter too. */
	hand_turn(r);
	return (int32_t)i;
}

void ring_slot_put(struct ring_lease *l, int32_t i)
{
	struct ring *r = l->ring;

	if (i < 0 || !r)
		return;
	ring_give(r, l->off[i], l->stride);
	l->off[i] = RING_NO_PIECE;
	l->held--;
	hand_turn(r);
}

void ring_turn_pass(struct ring_lease *l)
{
	if (l->ring && l->ring->turn == l)
		step_aside(l->ring, l);
}

void ring_wait_cancel(struct ring_lease *l)
{
	if (l->ring)
		step_aside(l->ring, l);
}

int ring_check(const struct ring *r)
{
	uint64_t used = 0, reserved = 0, freeb = 0;
	uint32_t queued = 0, inq = 0;

	for (const struct ring_range *f = r->free; f; f = f->next) {
		if (f->next && f->off + f->bytes >= f->next->off)
			return -EINVAL; /* unsorted, overlapping or not merged */
		freeb += f->bytes;
	}
	if (r->base && freeb + r->used != r->bytes)
		return -EINVAL;
	for (const struct ring_lease *l = r->leases; l; l = l->next) {
		uint32_t held = 0;

		for (uint32_t i = 0; i < l->nslots; i++)
			if (l->off[i] != RING_NO_PIECE)
				held++;
		if (held != l->held || l->ring != r || l->cap < l->min || l->cap > l->nslots)
			return -EINVAL;
		if (l->queued && l == r->turn)
			return -EINVAL;
		used += (uint64_t)held * l->stride;
		reserved += (uint64_t)l->min * l->stride;
		queued += l->queued;
	}
	for (const struct ring_lease *l = r->wait_head; l; l = l->next_wait) {
		if (!l->queued || (!l->next_wait && r->wait_tail != l))
			return -EINVAL;
		inq++;
	}
	if (used != r->used || reserved != r->reserved || reserved > r->bytes || queued != inq)
		return -EINVAL;
	return 0;
}
