/*
 * gov.c — target sizing for the prefetch-depth governor (see gov.h).
 *
 * DESIGN: pure bookkeeping on a struct owned by one session; loop thread
 * only, no locks.
 */
#include "sess/gov.h"

#include <stdio.h>

static uint32_t clamp_depth(const struct gov *g, uint64_t t)
{
	if (t < g->min_depth)
		return g->min_depth;
	if (t > g->max_depth)
		return g->max_depth;
	return (uint32_t)t;
}

void gov_init(struct gov *g, uint32_t min_depth, uint32_t max_depth, uint32_t default_depth)
{
	*g = (struct gov){0};
	g->min_depth = min_depth ? min_depth : 1;
	g->max_depth = max_depth >= g->min_depth ? max_depth : g->min_depth;
	gov_set_auto(g, default_depth);
}

void gov_new_epoch(struct gov *g)
{
	g->prepared = 0;
	g->consumed = 0;
}

void gov_set_manual(struct gov *g, uint32_t target)
{
	g->manual = true;
	g->target = clamp_depth(g, target);
	snprintf(g->reason, sizeof(g->reason), "set by hand to %u%s", target,
		 g->target != target ? " (clamped to the session's bounds)" : "");
}

void gov_set_auto(struct gov *g, uint32_t default_depth)
{
	g->manual = false;
	g->target = clamp_depth(g, default_depth);
	snprintf(g->reason, sizeof(g->reason), "default depth %u (no probe yet)", default_depth);
}

uint32_t gov_size_from_probe(struct gov *g, uint64_t free_bytes, uint64_t total_bytes,
			     uint64_t own_bytes, uint64_t slot_bytes, double reserve_frac,
			     uint64_t reserve_min)
{
	uint64_t reserve = gov_reserve(total_bytes, reserve_frac, reserve_min);
	uint64_t avail = free_bytes + own_bytes;
	uint64_t budget, fit;

	budget = avail > reserve ? avail - reserve : 0;
	g->probe_free = free_bytes;
	g->probe_total = total_bytes;
	g->probe_budget = budget;
	if (g->manual)
		return g->target;
	fit = slot_bytes ? budget / slot_bytes : g->max_depth;
	g->target = clamp_depth(g, fit);
	if (fit < g->min_depth)
		g->target = fit ? (uint32_t)fit : 1;
	snprintf(g->reason, sizeof(g->reason),
		 "probe: %.2f GiB free of %.2f, reserve %.2f GiB -> %llu batches fit",
		 free_bytes / 1073741824.0, total_bytes / 1073741824.0, reserve / 1073741824.0,
		 (unsigned long long)fit);
	return g->target;
}

uint64_t gov_reserve(uint64_t total_bytes, double reserve_frac, uint64_t reserve_min)
{
	uint64_t reserve = (uint64_t)(reserve_frac * (double)total_bytes);

	return reserve < reserve_min ? reserve_min : reserve;
}

uint32_t gov_halve(struct gov *g)
{
	uint32_t was = g->target;

	g->target = was > 1 ? was / 2 : 1;
	g->halvings++;
	snprintf(g->reason, sizeof(g->reason), "halved %u -> %u after a device allocation failed",
		 was, g->target);
	return g->target;
}

bool gov_check(const struct gov *g)
{
	if (g->min_depth < 1 || g->min_depth > g->max_depth)
		return false;
	if (g->target < 1 || g->target > g->max_depth)
		return false;
	if (g->target < g->min_depth && !g->halvings && !g->probe_total)
		return false;
	return g->consumed <= g->prepared;
}
