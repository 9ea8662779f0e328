/*
 * ring.h — the pinned reader ring: one block of host memory, registered
 * with CUDA once at startup, from which CUDA sessions take their staging
 * slots.
 *
 * Readers write a batch into a ring slot; the GPU's transfer thread copies
 * it from there to a device slot with no intermediate copy (the memory is
 * page-locked, so the DMA engine reads it directly).  The ring is bounded
 * (`ring_bytes`): a session takes a contiguous range of it when it opens
 * and gives it back when it is freed, so pinned memory never grows with the
 * number of sessions or the depth of their pipelines.  A session's range is
 * its lease (struct ring_lease): a few ring slots of one stride, each
 * holding one batch on its way from the readers to the copy stream.
 *
 * DESIGN: ring_init and ring_destroy run on the main thread before and after
 * the loop; everything else on the loop thread only.  No locks: the free
 * list and the leases' busy flags are the loop thread's.  Reader and transfer threads only touch
 * the bytes of ranges their session holds.
 */
#ifndef PF_RING_H
#define PF_RING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Ranges start at this alignment (a page: a reader's pread lands aligned). */
#define RING_ALIGN 4096u

struct ring_range {
	uint64_t off, bytes;
	struct ring_range *next;
};

struct ring {
	uint8_t *base;		 /* owned mapping, NULL when there is no ring */
	uint64_t bytes;		 /* size of the mapping */
	uint64_t used;		 /* bytes held by sessions */
	bool registered;	 /* page-locked through gpu_host_register */
	struct ring_range *free; /* owned: free ranges sorted by offset */
};

/* Maps `bytes` (rounded up to 2 MiB) and registers them with CUDA.  0 or
 * -errno with err saying why; r is then empty and every ring_take fails. */
int ring_init(struct ring *r, uint64_t bytes, char *err, size_t errlen);
/* Unregisters and unmaps.  Every range must have been given back. */
void ring_destroy(struct ring *r);
/* Takes `bytes` (rounded up to RING_ALIGN), first fit.  Returns 0 and the
 * range's offset, or -ENOSPC when no free range is large enough. */
int ring_take(struct ring *r, uint64_t bytes, uint64_t *off);
/* Gives back a range that ring_take returned, with the same size. */
void ring_give(struct ring *r, uint64_t off, uint64_t bytes);
/* The largest range ring_take could return now (for messages). */
uint64_t ring_largest_free(const struct ring *r);

/* A session's lease: nslots ring slots of stride bytes from off. */
struct ring_lease {
	uint8_t *base; /* borrowed: the ring's mapping + off */
	uint64_t off, bytes, stride;
	uint32_t nslots;
	uint8_t *busy; /* owned, nslots flags: the slot holds a batch */
};

/* Takes a lease of up to want slots of stride bytes, fewer if the ring has
 * no room for want (at least one).  0, -ENOSPC when not even one fits (err
 * says how much is free), or -ENOMEM. */
int ring_lease_take(struct ring *r, struct ring_lease *l, uint32_t want, uint64_t stride, char *err,
		    size_t errlen);
/* Gives the lease's range back (a zeroed lease: nothing). */
void ring_lease_give(struct ring *r, struct ring_lease *l);
/* A free slot of the lease, now busy, or -1 when every one is. */
int32_t ring_slot_get(struct ring_lease *l);
/* Slot i is free again (-1: nothing). */
void ring_slot_put(struct ring_lease *l, int32_t i);
static inline uint8_t *ring_slot_mem(const struct ring_lease *l, int32_t i)
{
	return l->base + (uint64_t)i * l->stride;
}

#endif
