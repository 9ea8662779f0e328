/*
 * gov.h — the daemon side of the prefetch-depth governor.
 *
 * A session prepares batch k of the current epoch only while
 *     prepared - consumed < target
 * where `prepared` counts batches handed to the pipeline this epoch and
 * `consumed` counts the client's acks of this epoch (acks carrying another
 * epoch id never reach these counters, which closes the seed's lost-batch
 * race).  `target` is either set by hand (prefetchctl depth, SetDepth) or
 * sized automatically: from the configured default for host sessions, from
 * the client's honest free-memory probe for CUDA sessions, and halved on a
 * device allocation failure.  `reason` says, for status, where the current
 * figure came from.
 *
 * DESIGN: plain data owned by its session, touched by the loop thread only.
 */
#ifndef PF_GOV_H
#define PF_GOV_H

#include <stdbool.h>
#include <stdint.h>

struct gov {
	uint32_t target;
	uint32_t min_depth, max_depth; /* bounds of target, 1 <= min <= max */
	bool manual;		       /* set by hand: probes leave it alone */
	char reason[128];
	uint64_t prepared;		  /* batches started this epoch */
	uint64_t consumed;		  /* acks of this epoch */
	uint64_t probe_free, probe_total; /* last honest figure, 0 if none */
	uint64_t probe_budget;		  /* bytes the last sizing allowed */
	unsigned halvings;		  /* OOM back-offs so far */
	/* 0, or the most batches in flight whatever an automatic target
	 * says: the session's even share of fill_bytes (sess_fill_shares).
	 * A target set by hand is the user's: the share leaves it alone. */
	uint32_t share;
};

void gov_init(struct gov *g, uint32_t min_depth, uint32_t max_depth, uint32_t default_depth);
void gov_new_epoch(struct gov *g);
static inline uint64_t gov_in_flight(const struct gov *g)
{
	return g->prepared - g->consumed;
}
/* What fills stop at: target, or the share when that is lower. */
static inline uint32_t gov_limit(const struct gov *g)
{
	return g->share && g->share < g->target && !g->manual ? g->share : g->target;
}
static inline bool gov_may_fill(const struct gov *g)
{
	return gov_in_flight(g) < gov_limit(g);
}
/* prefetchctl depth N: fixes target at N clamped to the bounds. */
void gov_set_manual(struct gov *g, uint32_t target);
/* prefetchctl depth auto: back to default_depth until the next probe. */
void gov_set_auto(struct gov *g, uint32_t default_depth);
/* Honest depth: sizes target from the trainer's free device memory.  The
 * reserve is max(reserve_frac * total, reserve_min); `own_bytes` is device
 * memory this session already holds (it counts as available to itself);
 * `slot_bytes` is the device memory one more batch in flight costs.
 * Returns the new target.  A manual target is left alone. */
uint32_t gov_size_from_probe(struct gov *g, uint64_t free_bytes, uint64_t total_bytes,
			     uint64_t own_bytes, uint64_t slot_bytes, double reserve_frac,
			     uint64_t reserve_min);
/* The device memory left free for the trainer: max(reserve_frac * total,
 * reserve_min).  The pool's budget (sess_cuda.c) leaves the same. */
uint64_t gov_reserve(uint64_t total_bytes, double reserve_frac, uint64_t reserve_min);
/* A device allocation failed: halve target (not below 1).  Returns it. */
uint32_t gov_halve(struct gov *g);
/* Invariants, for asserts and tests: 1 <= min <= target <= max unless an OOM
 * pushed target below min, consumed <= prepared. */
bool gov_check(const struct gov *g);

#endif
