/*
 * ahead.c — the next epoch's order, built ahead (see ahead.h).
 *
 * DESIGN: one build at a time per owner.  The pool thread runs
 * order_build into a->picks; the after-work callback, on the loop thread,
 * publishes it (ready) or throws it away, queues the newest epoch's build if
 * one was asked for meanwhile, and tells the owner.
 */
#include "order/ahead.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

static void ahead_queue(struct ahead *a, const struct order_spec *spec, uint64_t space);

static void work(uv_work_t *w)
{
	struct ahead *a = container_of(w, struct ahead, work);
	char err[200];

	order_lower_priority();
	if (a->freeing)
		a->freed_off_loop++;
	/* The last epoch's order, built into when it is big enough (it is,
	 * epoch after epoch of one session), else freed: no new pages to
	 * fault in and no old ones to unmap. */
	a->rc = order_build_into(&a->spec, a->space, a->freeing, a->freeing_n, &a->picks,
				 &a->npicks, err, sizeof(err));
	a->freeing = NULL;
}

static bool builds_ahead(const struct order_spec *spec)
{
	return spec->kind == ORDER_SHUFFLE || spec->kind == ORDER_BLOCK_SHUFFLE;
}

/* The part of a spec that decides the order (world 0 being 1). */
static struct order_spec order_of(const struct order_spec *spec)
{
	struct order_spec o = {.kind = spec->kind,
			       .seed = spec->seed,
			       .rank = spec->rank,
			       .world = spec->world ? spec->world : 1};

	if (spec->kind == ORDER_BLOCK_SHUFFLE) {
		o.samples = spec->samples;
		o.block_rows = spec->block_rows;
		o.window_blocks = spec->window_blocks;
	}
	return o;
}

static bool same_order(const struct order_spec *x, uint64_t xspace, const struct order_spec *y,
		       uint64_t yspace)
{
	struct order_spec a = order_of(x), b = order_of(y);

	return xspace == yspace && a.kind == b.kind && a.seed == b.seed && a.rank == b.rank &&
	       a.world == b.world && a.samples == b.samples && a.block_rows == b.block_rows &&
	       a.window_blocks == b.window_blocks;
}

static void work_done(uv_work_t *w, int status)
{
	struct ahead *a = container_of(w, struct ahead, work);

	a->busy = false;
	free(a->freeing); /* the build never ran (cancelled): here, then */
	a->freeing = NULL;
	a->ready = status == 0 && a->rc == 0;
	if (!a->ready) {
		free(a->picks);
		a->picks = NULL;
	}
	/* Epochs left early (a warm-up, an abandon) can start faster than an
	 * order is built: build the one for the newest epoch now. */
	if (!a->cancelled && a->again &&
	    !(a->ready && same_order(&a->spec, a->space, &a->again_spec, a->again_space)))
		ahead_queue(a, &a->again_spec, a->again_space);
	a->again = false;
	a->done(a);
}

static void ahead_queue(struct ahead *a, const struct order_spec *spec, uint64_t space)
{
	free(a->picks);
	a->picks = NULL;
	a->ready = false;
	a->spec = order_of(spec);
	a->space = space;
	a->freeing = a->garbage;
	a->freeing_n = a->garbage_n;
	a->garbage = NULL;
	if (uv_queue_work(a->loop, &a->work, work, work_done) == 0) {
		a->busy = true;
	} else {
		free(a->freeing);
		a->freeing = NULL;
	}
}

void ahead_discard(struct ahead *a, uint64_t *picks, uint64_t npicks)
{
	if (!picks)
		return;
	if (a->busy || a->cancelled) {
		free(picks);
		return;
	}
	assert(!a->garbage); /* ahead_discard_now follows every discard */
	a->garbage = picks;
	a->garbage_n = npicks;
}

void ahead_discard_now(struct ahead *a)
{
	free(a->garbage);
	a->garbage = NULL;
}

void ahead_init(struct ahead *a, uv_loop_t *loop, void (*done)(struct ahead *a))
{
	*a = (struct ahead){.loop = loop, .done = done};
}

void ahead_epoch_started(struct ahead *a, const struct order_spec *spec, uint64_t space)
{
	struct order_spec next;

	if (!builds_ahead(spec) || a->cancelled)
		return;
	next = order_of(spec);
	next.seed++;
	if (a->busy) {
		a->again = true;
		a->again_spec = next;
		a->again_space = space;
		return;
	}
	ahead_queue(a, &next, space);
}

uint64_t *ahead_take(struct ahead *a, const struct order_spec *spec, uint64_t space,
		     uint64_t *npicks)
{
	uint64_t *picks;

	/* While busy the pool thread owns a->picks: look only when ready. */
	if (!builds_ahead(spec) || a->busy || !a->ready ||
	    !same_order(&a->spec, a->space, spec, space))
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
	free(a->garbage);
	a->garbage = NULL;
	if (!a->busy) {
		free(a->picks);
		a->picks = NULL;
		a->ready = false;
	}
}

uint64_t *ahead_take_ready(struct ahead *a, struct order_spec *spec, uint64_t *space,
			   uint64_t *npicks)
{
	uint64_t *picks;

	if (a->busy || !a->ready)
		return NULL;
	picks = a->picks;
	*spec = a->spec;
	*space = a->space;
	*npicks = a->npicks;
	a->picks = NULL;
	a->ready = false;
	return picks;
}

/* ---- orders kept after their session ---------------------------------------- */

static void keep_drop(struct order_keep *k, uint32_t i)
{
	k->bytes -= k->e[i].npicks * sizeof(uint64_t);
	free(k->e[i].picks);
	memmove(&k->e[i], &k->e[i + 1], (k->n - i - 1) * sizeof(k->e[0]));
	k->n--;
}

void order_keep_put(struct order_keep *k, const struct order_spec *spec, uint64_t space,
		    uint64_t *picks, uint64_t npicks, double keep_s, int64_t now, uint64_t cap)
{
	uint64_t bytes = npicks * sizeof(uint64_t);

	if (!picks)
		return;
	if (!builds_ahead(spec) || keep_s <= 0 || bytes > cap) {
		free(picks);
		return;
	}
	/* The same order twice (two ranks' sessions cannot share one: rank is
	 * in the spec): the newer copy replaces the older. */
	for (uint32_t i = 0; i < k->n; i++)
		if (same_order(&k->e[i].spec, k->e[i].space, spec, space)) {
			keep_drop(k, i);
			break;
		}
	while (k->n && (k->n == ORDER_KEEP_MAX || k->bytes + bytes > cap))
		keep_drop(k, 0);
	k->e[k->n++] = (struct order_kept){.spec = order_of(spec),
					   .space = space,
					   .picks = picks,
					   .npicks = npicks,
					   .until_ns = now + (int64_t)(keep_s * 1e9)};
	k->bytes += bytes;
	assert(order_keep_check(k) && k->bytes <= cap);
}

uint64_t *order_keep_take(struct order_keep *k, const struct order_spec *spec, uint64_t space,
			  uint64_t *npicks)
{
	if (!builds_ahead(spec))
		return NULL;
	for (uint32_t i = 0; i < k->n; i++) {
		uint64_t *picks;

		if (!same_order(&k->e[i].spec, k->e[i].space, spec, space))
			continue;
		picks = k->e[i].picks;
		*npicks = k->e[i].npicks;
		k->e[i].picks = NULL;
		keep_drop(k, i);
		return picks;
	}
	return NULL;
}

void order_keep_purge(struct order_keep *k, int64_t now)
{
	for (uint32_t i = 0; i < k->n;)
		if (k->e[i].until_ns <= now)
			keep_drop(k, i);
		else
			i++;
}

bool order_keep_check(const struct order_keep *k)
{
	uint64_t bytes = 0;

	if (k->n > ORDER_KEEP_MAX)
		return false;
	for (uint32_t i = 0; i < k->n; i++) {
		if (!k->e[i].picks)
			return false;
		bytes += k->e[i].npicks * sizeof(uint64_t);
	}
	return bytes == k->bytes;
}
