/*
 * ahead.c — the next epoch's order, built ahead (see ahead.h).
 *
 * DESIGN: one build at a time per owner.  The pool thread runs
 * order_build into a->picks; the after-work callback, on the loop thread,
 * publishes it (ready) or throws it away, queues the newest epoch's build if
 * one was asked for meanwhile, and tells the owner.
 */
#include "ahead.h"

#include <stdlib.h>

#include "order.h"
#include "util.h"

static void ahead_queue(struct ahead *a, uint64_t seed, uint32_t rank, uint32_t world,
			uint64_t space);

static void work(uv_work_t *w)
{
	struct ahead *a = container_of(w, struct ahead, work);
	struct order_spec spec = {
		.kind = ORDER_SHUFFLE, .seed = a->seed, .rank = a->rank, .world = a->world};
	char err[200];

	order_lower_priority();
	a->rc = order_build(&spec, a->space, &a->picks, &a->npicks, err, sizeof(err));
}

static void work_done(uv_work_t *w, int status)
{
	struct ahead *a = container_of(w, struct ahead, work);

	a->busy = false;
	a->ready = status == 0 && a->rc == 0;
	if (!a->ready) {
		free(a->picks);
		a->picks = NULL;
	}
	/* Epochs left early (a warm-up, an abandon) can start faster than an
	 * order is built: build the one for the newest epoch now. */
	if (!a->cancelled && a->again &&
	    !(a->ready && a->seed == a->again_seed && a->rank == a->again_rank &&
	      a->world == a->again_world && a->space == a->again_space))
		ahead_queue(a, a->again_seed, a->again_rank, a->again_world, a->again_space);
	a->again = false;
	a->done(a);
}

static void ahead_queue(struct ahead *a, uint64_t seed, uint32_t rank, uint32_t world,
			uint64_t space)
{
	free(a->picks);
	a->picks = NULL;
	a->ready = false;
	a->seed = seed;
	a->rank = rank;
	a->world = world;
	a->space = space;
	if (uv_queue_work(a->loop, &a->work, work, work_done) == 0)
		a->busy = true;
}

void ahead_init(struct ahead *a, uv_loop_t *loop, void (*done)(struct ahead *a))
{
	*a = (struct ahead){.loop = loop, .done = done};
}

void ahead_epoch_started(struct ahead *a, const struct order_spec *spec, uint64_t space)
{
	if (spec->kind != ORDER_SHUFFLE || a->cancelled)
		return;
	if (a->busy) {
		a->again = true;
		a->again_seed = spec->seed + 1;
		a->again_rank = spec->rank;
		a->again_world = spec->world;
		a->again_space = space;
		return;
	}
	ahead_queue(a, spec->seed + 1, spec->rank, spec->world, space);
}

uint64_t *ahead_take(struct ahead *a, const struct order_spec *spec, uint64_t space,
		     uint64_t *npicks)
{
	uint64_t *picks;

	/* While busy the pool thread owns a->picks: look only when ready. */
	if (spec->kind != ORDER_SHUFFLE || a->busy || !a->ready || a->seed != spec->seed ||
	    a->rank != spec->rank || (a->world ? a->world : 1) != (spec->world ? spec->world : 1) ||
	    a->space != space)
		return NULL;
	picks = a->picks;
	*npicks = a->npicks;
	a->picks = NULL;
	a->ready = false;
	return picks;
}

void ahead_cancel(struct ahead *a)
{
	a->cancelled = true;
	a->again = false;
	if (!a->busy) {
		free(a->picks);
		a->picks = NULL;
		a->ready = false;
	}
}
