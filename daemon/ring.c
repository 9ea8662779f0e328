/*
 * ring.c — the pinned reader ring and its first-fit range allocator (see
 * ring.h).
 *
 * DESIGN: ranges are few (one per CUDA session), so a sorted singly linked
 * free list with coalescing on give is all the allocator needs.  Loop thread
 * only, apart from init and destroy on the main thread.
 */
#include "ring.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "gpu.h"
#include "log.h"

#define RING_MAP_ALIGN (2u << 20)

static uint64_t round_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) / a * a;
}

int ring_init(struct ring *r, uint64_t bytes, char *err, size_t errlen)
{
	void *p;
	int rc;

	memset(r, 0, sizeof(*r));
	if (bytes == 0) {
		snprintf(err, errlen, "ring_bytes is 0");
		return -EINVAL;
	}
	bytes = round_up(bytes, RING_MAP_ALIGN);
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

	bytes = round_up(bytes ? bytes : 1, RING_ALIGN);
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

	bytes = round_up(bytes ? bytes : 1, RING_ALIGN);
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
