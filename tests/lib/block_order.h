/*
 * block_order.h — the share daemon/order/order.c builds for a block_shuffle, for
 * the tests that check it (unit and integration).  Include after cmocka.h:
 * a build that fails fails the case.
 */
#ifndef PF_TEST_BLOCK_ORDER_H
#define PF_TEST_BLOCK_ORDER_H

#include <stdint.h>

#include "order/order.h"

/* Rank's share of a block_shuffle of augment copies of n samples, blocks of
 * rows, windows of window blocks; its length in *npicks.  Owned by the
 * caller. */
static inline uint64_t *td_block_order(uint64_t n, uint32_t augment, uint64_t rows, uint64_t window,
				       uint64_t seed, uint32_t rank, uint32_t world,
				       uint64_t *npicks)
{
	struct order_spec spec = {.kind = ORDER_BLOCK_SHUFFLE,
				  .seed = seed,
				  .rank = rank,
				  .world = world,
				  .samples = n,
				  .block_rows = rows,
				  .window_blocks = window};
	uint64_t *picks = NULL;
	char err[200] = "";

	if (order_build(&spec, n * augment, &picks, npicks, err, sizeof(err)))
		fail_msg("order_build: %s", err);
	return picks;
}

#endif
