/*
 * ahead.h — the next epoch's shuffle, built ahead on libuv's thread pool.
 *
 * Our clients start epoch n+1 shuffled with seed + 1, the same rank and
 * world, so once a shuffled epoch starts its successor's order is built off
 * the loop thread, and StartEpoch need not build 10 ms of order on the loop
 * before the first batch.  The same goes for block shuffles, with the same
 * block size and window.  Any other request builds its order as before; a
 * guess that missed only cost a pool thread's time.
 *
 * DESIGN: loop thread, except the build itself, which runs on a libuv pool
 * thread and touches only `work`'s inputs and outputs.  While busy, that
 * thread owns picks; the loop looks at them only once the build is back.
 * The owner is told through done() when a build comes back, and must not
 * free the struct while busy.
 */
#ifndef PF_AHEAD_H
#define PF_AHEAD_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "order.h"

struct ahead {
	uv_loop_t *loop; /* borrowed */
	uv_work_t work;
	/* What is (being) built: a shuffle or a block shuffle (no indices),
	 * world 0 taken as 1. */
	struct order_spec spec;
	uint64_t space;
	uint64_t *picks; /* owned: the order, once ready */
	uint64_t npicks;
	int rc;
	bool busy;	/* queued or running on the pool thread */
	bool ready;	/* picks hold the order for (spec, space) */
	bool cancelled; /* the owner is going: build nothing more */
	/* A newer epoch started while busy: what to build when it is done. */
	bool again;
	struct order_spec again_spec;
	uint64_t again_space;
	/* Loop thread: a build came back (busy is false unless another one
	 * was queued after it). */
	void (*done)(struct ahead *a);
};

void ahead_init(struct ahead *a, uv_loop_t *loop, void (*done)(struct ahead *a));
/* A shuffled or block-shuffled epoch of `space` picks started as spec
 * says: build the next one's order (or note it, to follow the build still
 * running). */
void ahead_epoch_started(struct ahead *a, const struct order_spec *spec, uint64_t space);
/* The order built ahead, when it is the one spec asks for (ownership moves
 * to the caller, with its length in *npicks); else NULL. */
uint64_t *ahead_take(struct ahead *a, const struct order_spec *spec, uint64_t space,
		     uint64_t *npicks);
/* No more builds; frees the order kept.  Call again once not busy. */
void ahead_cancel(struct ahead *a);

#endif
