/*
 * pool_plan.c — a batch's plan against the VRAM pool (see pool.h): which
 * of its rows the pool holds (hits, gathered from their slabs), which it
 * misses (read and staged, and admitted into free entries where the budget
 * allows), and what becomes of the plan once its copy is done or dropped.
 * The pool's slabs, budget and life are pool.c's.
 *
 * DESIGN: loop thread only, like the pool.  A plan pins the slabs it reads
 * until it is done, so a slab it names is never freed under its gather.
 */
#include "gpu/pool_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "data/dataset.h"
#include "util.h"

/* Rows ahead whose index entry planning prefetches: enough misses in
 * flight to cover a memory latency of ~100-200 ns (a VM's) at a few ns a
 * row. */
#define PLAN_PREFETCH 64

/* A free entry in a live slab, or POOL_NONE (and the pool wants room). */
static uint32_t take_entry(struct pool *p)
{
	if (!p->room) {
		p->want_room = true;
		return POOL_NONE;
	}
	for (uint32_t k = 0; k < p->nslabs; k++) {
		uint32_t j = (p->fill + k) % p->nslabs;
		struct pool_slab *sl = &p->slabs[j];

		if (sl->live && sl->used < p->per_slab) {
			p->fill = j;
			p->room--;
			return (j << p->slab_shift) + sl->used++;
		}
	}
	return POOL_NONE; /* not reached: room counts these entries */
}

static void pin(struct pool *p, struct pool_plan *plan, uint32_t slab)
{
	if (p->slabs[slab].stamp == plan->stamp)
		return;
	p->slabs[slab].stamp = plan->stamp;
	if (plan->npinned == plan->pin_cap) {
		uint32_t cap = plan->pin_cap ? plan->pin_cap * 2 : 8;
		uint32_t *t = realloc(plan->pinned, cap * sizeof(*t));

		if (!t) {
			/* Cannot happen in practice (a few dozen bytes); a
			 * slab left unpinned could be freed under the batch,
			 * so keep every slab alive by pinning none twice. */
			log_err("pool %s: out of memory pinning a slab", p->ds->name);
			abort();
		}
		plan->pinned = t;
		plan->pin_cap = cap;
	}
	plan->pinned[plan->npinned++] = slab;
	p->slabs[slab].pins++;
}

int pool_plan_alloc(struct pool_plan *plan, uint32_t cap)
{
	memset(plan, 0, sizeof(*plan));
	plan->staged = malloc(cap * sizeof(*plan->staged));
	plan->admit = malloc(cap * sizeof(*plan->admit));
	if (!plan->staged || !plan->admit) {
		pool_plan_free(plan);
		return -ENOMEM;
	}
	plan->cap = cap;
	return 0;
}

void pool_plan_free(struct pool_plan *plan)
{
	free(plan->staged);
	free(plan->admit);
	free(plan->pinned);
	memset(plan, 0, sizeof(*plan));
}

/* Reserves a record for staged row k of sample `sample`, if there is room. */
static void admit_row(struct pool *p, struct pool_plan *plan, uint32_t k, uint64_t sample,
		      uint64_t *admit_addr)
{
	uint32_t e = p->loc[sample] == POOL_NONE ? take_entry(p) : POOL_NONE;

	plan->admit[k] = e;
	admit_addr[k] = 0;
	if (e == POOL_NONE) {
		if (p->loc[sample] == POOL_NONE)
			missed_set(p, sample);
		return;
	}
	p->owner[e] = sample;
	p->loc[sample] = POOL_PENDING;
	p->admits++;
	p->pending++;
	missed_clear(p, sample);
	admit_addr[k] = entry_addr(p, e);
	pin(p, plan, e >> p->slab_shift);
}

void pool_plan_batch(struct pool *p, const uint64_t *picks, uint32_t count, uint32_t max_extra,
		     bool ids, struct pool_plan *plan, uint64_t *restrict desc,
		     uint64_t *admit_addr)
{
	const uint64_t n = p->ds->num_samples;
	const uint32_t *restrict loc = p->loc;
	const uint32_t shift = p->slab_shift, mask = (1u << p->slab_shift) - 1;
	const uint64_t stride = p->rec_stride;
	const uint64_t stamp = ++p->stamps;
	uint32_t k = 0, hits = 0;

	plan->active = true;
	plan->count = count;
	plan->npinned = 0;
	plan->stamp = stamp;
	plan->table = false;
	plan->ids = ids;
	plan->published = false;
	if (!ids && pool_table(p)) {
		/* Every sample is resident and the device has the table: the
		 * picks themselves are the index.  Every live slab is pinned
		 * (a batch may read any of them). */
		memcpy(desc, picks, (size_t)count * sizeof(*desc));
		for (uint32_t j = 0; j < p->nslabs; j++)
			if (p->slabs[j].live)
				pin(p, plan, j);
		plan->table = true;
		plan->hits = count;
		plan->nmiss = plan->nstaged = 0;
		p->hits += count;
		p->lookups += count;
		p->hits_cur += count;
		p->lookups_cur += count;
		p->saved += (uint64_t)count * p->ds->sample_bytes;
		return;
	}
	pool_maybe_grow(p);
	/* The hot loop of a pooled epoch: one random read of loc per row, so
	 * it asks for a later row's entry early (a miss to DRAM costs ~100 ns
	 * on the machines we measured; a hit row, a few). */
	for (uint32_t i = 0; i < count; i++) {
		uint64_t sample = picks[i] < n ? picks[i] : picks[i] % n;
		uint32_t e;

		if (i + PLAN_PREFETCH < count) {
			uint64_t ahead = picks[i + PLAN_PREFETCH];

			__builtin_prefetch(&loc[ahead < n ? ahead : ahead % n]);
		}
		e = loc[sample];
		if (e < POOL_PENDING) {
			struct pool_slab *sl = &p->slabs[e >> shift];

			desc[i] = ids ? e : sl->mem.base + (uint64_t)(e & mask) * stride;
			if (sl->stamp != stamp)
				pin(p, plan, e >> shift);
			hits++;
			continue;
		}
		desc[i] = GPU_GATHER_STAGED | k;
		plan->staged[k] = sample;
		admit_row(p, plan, k, sample, admit_addr);
		k++;
	}
	plan->hits = hits;
	plan->nmiss = k;
	/* Back-fill: rows missed while there was no room, staged only to be
	 * admitted, while room remains.  Bits at or past N are never set, so
	 * a nonzero word always leads to a sample below N. */
	for (uint64_t scanned = 0;
	     p->nmissed && max_extra && k < plan->cap && scanned < n && has_room(p);) {
		uint64_t w = p->missed[p->scan / 64] >> (p->scan % 64);
		uint64_t sample;

		if (!w) {
			uint64_t step = 64 - p->scan % 64;

			scanned += step;
			p->scan = p->scan + step >= n ? 0 : p->scan + step;
			continue;
		}
		p->scan += (uint64_t)__builtin_ctzll(w);
		scanned += (uint64_t)__builtin_ctzll(w) + 1;
		sample = p->scan;
		if (p->loc[sample] != POOL_NONE) {
			missed_clear(p, sample); /* resident or on its way */
		} else {
			plan->staged[k] = sample;
			admit_row(p, plan, k, sample, admit_addr);
			k++;
			max_extra--;
		}
		p->scan = p->scan + 1 >= n ? 0 : p->scan + 1;
	}
	plan->nstaged = k;
	p->hits += plan->hits;
	p->lookups += count;
	p->hits_cur += plan->hits;
	p->lookups_cur += count;
	p->saved += plan->hits * p->ds->sample_bytes;
}

void pool_plan_publish(struct pool *p, struct pool_plan *plan, bool ok)
{
	if (!plan->active || plan->published)
		return;
	plan->published = true;
	for (uint32_t k = 0; k < plan->nstaged; k++) {
		uint32_t e = plan->admit[k];
		uint64_t sample = plan->staged[k];

		if (e == POOL_NONE)
			continue;
		p->pending--;
		/* A slab dropped while the batch was in flight has already
		 * taken its samples out of the index. */
		if (p->loc[sample] != POOL_PENDING)
			continue;
		if (ok && p->slabs[e >> p->slab_shift].live) {
			p->loc[sample] = e;
			p->rows++;
		} else {
			p->loc[sample] = POOL_NONE;
			/* Rows that could not be read are not tried again by
			 * back-fill: a bad sector must not fail batch after
			 * batch (the sample is admitted when it next misses
			 * in a batch of its own). */
			if (!plan->read_failed)
				missed_set(p, sample);
		}
	}
}

void pool_plan_done(struct pool *p, struct pool_plan *plan, bool ok)
{
	if (!plan->active)
		return;
	pool_plan_publish(p, plan, ok);
	for (uint32_t i = 0; i < plan->npinned; i++) {
		uint32_t j = plan->pinned[i];
		struct pool_slab *sl = &p->slabs[j];

		if (--sl->pins == 0 && sl->dying)
			pool_slab_free_now(p, j);
	}
	plan->active = false;
	plan->published = false;
	plan->read_failed = false;
	plan->npinned = 0;
	plan->nstaged = plan->nmiss = 0;
	pool_maybe_grow(p);
	pool_maybe_table(p);
}

void pool_plan_drop_rows(struct pool *p, struct pool_plan *plan, uint32_t first, uint32_t n,
			 uint64_t *admit_addr)
{
	for (uint32_t k = first; k < first + n && k < plan->nstaged; k++) {
		uint32_t e = plan->admit[k];

		admit_addr[k] = 0;
		if (e == POOL_NONE)
			continue;
		plan->admit[k] = POOL_NONE;
		p->pending--;
		if (p->loc[plan->staged[k]] == POOL_PENDING)
			p->loc[plan->staged[k]] = POOL_NONE;
	}
}
