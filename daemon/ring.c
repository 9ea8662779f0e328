/*
 * ring.c — the pinned reader ring and its first-fit range allocator (see
 * ring.h).
 *
 * DESIGN: ranges are few (one per CUDA session), so a sorted singly linked
 * free list with coalescing on give is all the allocator needs, and a
 * lease's handful of slots a linear scan.  Loop thread only, apart from
 * init and destroy on the main thread.
 */
#include "ring.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "gpu.h"
#include "log.h"
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

int ring_lease_take(struct ring *r, struct ring_lease *l, uint32_t want, uint64_t stride, char *err,
		    size_t errlen)
{
	uint32_t n;

	memset(l, 0, sizeof(*l));
	for (n = want; n > 0; n--)
		if (ring_take(r, (uint64_t)n * stride, &l->off) == 0)
			break;
	if (n == 0) {
		set_err(err, errlen,
			"the pinned ring has no room for one %.1f MiB batch (ring_bytes = %.0f "
			"MiB, "
			"%.1f MiB free in one piece)",
			stride / 1048576.0, r->bytes / 1048576.0, ring_largest_free(r) / 1048576.0);
		return -ENOSPC;
	}
	l->bytes = (uint64_t)n * stride;
	l->busy = calloc(n, 1);
	if (!l->busy) {
		ring_give(r, l->off, l->bytes);
		memset(l, 0, sizeof(*l));
		set_err(err, errlen, "out of memory");
		return -ENOMEM;
	}
	l->base = r->base + l->off;
	l->stride = stride;
	l->nslots = n;
	return 0;
}

void ring_lease_give(struct ring *r, struct ring_lease *l)
{
	if (l->bytes)
		ring_give(r, l->off, l->bytes);
	free(l->busy);
	memset(l, 0, sizeof(*l));
}

int32_t ring_slot_get(struct ring_lease *l)
{
	for (uint32_t i = 0; i < l->nslots; i++) {
		if (!l->busy[i]) {
			l->busy[i] = 1;
			return (int32_t)i;
		}
	}
	return -1;
}

void ring_slot_put(struct ring_lease *l, int32_t i)
{
	if (i >= 0)
		l->busy[i] = 0;
}
