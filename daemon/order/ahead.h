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

#include "order/order.h"

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
	/* An order the session is done with (ahead_discard): built into, or
	 * freed, by the next build, on the pool thread, not on the loop.  A
	 * free() of 8 MiB of picks is a munmap of 0.4-0.7 ms (glibc maps big
	 * blocks of its own until its threshold has grown), which held the
	 * first batch of the 2nd and 3rd epochs (bench/NOTES.md, run 45);
	 * built into, it spares the build a new 8 MiB to fault in as well.
	 * garbage: the loop's, until a build is queued; freeing: that
	 * build's, which starts at once (a pool thread is free between
	 * epochs), so the bytes go uncharged to the quota only that long. */
	uint64_t *garbage;
	uint64_t *freeing;
	uint64_t garbage_n, freeing_n; /* their lengths, in picks */
	/* Orders a build took (read once it is back): built into, where the
	 * next order fits (order_build_into), else freed. */
	uint64_t freed_off_loop;
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
/* Hands over picks (an order of npicks the caller is done with; NULL is a
 * no-op), for the next build ahead_epoch_started queues to build into or
 * free, off the loop; freed at once while a build is busy (it would wait
 * for that build and the next one, uncharged to anyone's quota
 * meanwhile).  Then call
 * ahead_discard_now, after ahead_epoch_started where the epoch starts at
 * once: what no build took is freed there, on the loop (an epoch whose
 * order is still being built waits for that build anyway). */
void ahead_discard(struct ahead *a, uint64_t *picks, uint64_t npicks);
/* Frees what ahead_discard kept and no build took. */
void ahead_discard_now(struct ahead *a);
/* No more builds; frees the order kept.  Call again once not busy. */
void ahead_cancel(struct ahead *a);
/* The order ready ahead, taken by a session that is going (kept for the
 * next one: order_keep_put); else NULL.  Not while busy. */
uint64_t *ahead_take_ready(struct ahead *a, struct order_spec *spec, uint64_t *space,
			   uint64_t *npicks);

/*
 * Orders kept after their session: a trainer that comes back (a restart
 * after a crash redoing its epoch, a script that makes a Loader per epoch
 * and so starts the next one in a new session) asks for an order a session
 * just had or had built ahead.  An order is a function of (spec, space)
 * alone, so any session may take it.  Kept for the dataset's pool_linger,
 * ORDER_KEEP_MAX of them and kept_order_bytes in all (outside the quota:
 * nobody's), oldest dropped first.
 *
 * The cap is on what the orders hold, not on what they are worth: every
 * order's buffer holds exactly its npicks picks (order_build_into shrinks
 * a reused one to the order it builds), so npicks * 8 is the memory it
 * keeps.  Before that, a world-2 share of 32M picks (128 MiB) reused for
 * a share of a few picks was kept counted as those few, and a user parked
 * 900 MiB here while the cap read a few KiB (issue 37).
 *
 * DESIGN: loop thread only; the kept picks are owned by the cache and
 * referenced by no reader (a session's own go only once its jobs are
 * back).
 */
#define ORDER_KEEP_MAX 16 /* 2 for each of 8 ranks restarted together */

struct order_kept {
	struct order_spec spec;
	uint64_t space;
	uint64_t *picks; /* owned */
	uint64_t npicks;
	int64_t until_ns; /* dropped after this */
};

struct order_keep {
	struct order_kept e[ORDER_KEEP_MAX]; /* oldest first */
	uint32_t n;
	uint64_t bytes;
};

/* Keeps picks (ownership moves, freed at once when it cannot be kept: a
 * kind not built ahead, keep_s <= 0, larger than cap) for keep_s, making
 * room under cap bytes (kept_order_bytes) by dropping the oldest. */
void order_keep_put(struct order_keep *k, const struct order_spec *spec, uint64_t space,
		    uint64_t *picks, uint64_t npicks, double keep_s, int64_t now, uint64_t cap);
/* The kept order for (spec, space), its ownership to the caller; else NULL. */
uint64_t *order_keep_take(struct order_keep *k, const struct order_spec *spec, uint64_t space,
			  uint64_t *npicks);
/* Drops what has expired by now (every orders with now = INT64_MAX). */
void order_keep_purge(struct order_keep *k, int64_t now);
/* The invariant: bytes is the sum of the kept orders' npicks * 8.  True
 * when it holds. */
bool order_keep_check(const struct order_keep *k);

#endif
