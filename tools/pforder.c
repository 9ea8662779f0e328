/*
 * pforder.c — prints epoch orders as the daemon builds them (daemon/order.c),
 * so that other implementations can be checked against the real one
 * (tests/python/test_host.py checks python/prefetch/order.py).
 *
 *   build/pforder < cases
 *
 * Each input line is `SEED N RANK WORLD`; each output line is that share's
 * picks, space-separated, or `error: MESSAGE`.
 *
 * DESIGN: one thread, reads stdin to its end.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "order.h"

int main(void)
{
	uint64_t seed, n;
	unsigned rank, world;

	while (scanf("%" SCNu64 " %" SCNu64 " %u %u", &seed, &n, &rank, &world) == 4) {
		struct order_spec spec = {
			.kind = ORDER_SHUFFLE, .seed = seed, .rank = rank, .world = world};
		uint64_t *picks = NULL, npicks = 0;
		char err[200] = "";
		int rc = order_build(&spec, n, &picks, &npicks, err, sizeof(err));

		if (rc) {
			printf("error: %s\n", err);
			continue;
		}
		for (uint64_t i = 0; i < npicks; i++)
			printf(i ? " %" PRIu64 : "%" PRIu64, picks[i]);
		putchar('\n');
		free(picks);
	}
	return ferror(stdout) ? 1 : 0;
}
