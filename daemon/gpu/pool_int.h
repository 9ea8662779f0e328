/*
 * pool_int.h — what pool.c (slabs, budget, life) and pool_plan.c (a batch's
 * plan) share.  Not for the rest of the daemon: pool.h is the pool's
 * interface.  Calls go one way: pool_plan.c -> pool.c.
 *
 * DESIGN: loop thread only.
 */
#ifndef PF_POOL_INT_H
#define PF_POOL_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "gpu/pool.h"

static inline uint64_t entry_addr(const struct pool *p, uint32_t e)
{
	return p->slabs[e >> p->slab_shift].mem.base +
	       (uint64_t)(e & ((1u << p->slab_shift) - 1)) * p->rec_stride;
}

static inline void missed_set(struct pool *p, uint64_t sample)
{
	uint64_t bit = 1ull << (sample % 64);

	if (!(p->missed[sample / 64] & bit)) {
		p->missed[sample / 64] |= bit;
		p->nmissed++;
	}
}

static inline void missed_clear(struct pool *p, uint64_t sample)
{
	uint64_t bit = 1ull << (sample % 64);

	if (p->missed[sample / 64] & bit) {
		p->missed[sample / 64] &= ~bit;
		p->nmissed--;
	}
}

static inline bool has_room(const struct pool *p)
{
	return p->room > 0;
}

/* Frees slab j now (no batch reads it). */
void pool_slab_free_now(struct pool *p, uint32_t j);
/* Asks the transfer thread for another slab while the budget allows and
 * none is on the way. */
void pool_maybe_grow(struct pool *p);
/* Uploads the slab table (or allocates its device copy) when it changed. */
void pool_maybe_table(struct pool *p);

#endif
