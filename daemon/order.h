/*
 * order.h — which picks a rank receives in an epoch, and in what order.
 *
 * The shuffle is specified in README.md ("Shuffle specification") so that a
 * trainer in any language can reproduce it:
 *   splitmix64 state = seed; next(): state += 0x9E3779B97F4A7C15, then the
 *   standard splitmix64 mix of state.  perm = [0..n); for i = n-1 down to 1:
 *   j = bounded(i + 1); swap(perm[i], perm[j]).  bounded(m): draw r = next()
 *   until r >= (2^64 - m) mod m, return r mod m (rejection, unbiased).
 *
 * Sharding follows torch.utils.data.DistributedSampler (drop_last=False): the
 * epoch's pick list is padded by repeating its head until its length is a
 * multiple of world, then rank r takes elements r, r+world, r+2*world, ...
 * Every rank gets the same count; when world divides the list length no pick
 * is repeated.
 *
 * DESIGN: pure functions, no state; called by the loop thread at StartEpoch.
 */
#ifndef PF_ORDER_H
#define PF_ORDER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum order_kind { ORDER_SEQ, ORDER_SHUFFLE, ORDER_EXPLICIT };

struct order_spec {
	enum order_kind kind;
	uint64_t seed;
	const uint64_t *indices; /* borrowed: ORDER_EXPLICIT only */
	uint64_t nindices;
	uint32_t rank;
	uint32_t world; /* 0 is taken as 1 */
};

uint64_t order_splitmix64(uint64_t *state);
/* Unbiased draw in [0, m), m >= 1, as specified above. */
uint64_t order_bounded(uint64_t *state, uint64_t m);
/* perm[0..n) := the documented shuffle of 0..n-1 under seed. */
void order_shuffle(uint64_t *perm, uint64_t n, uint64_t seed);
/* The same shuffle with its draws made ahead on a second thread (2 <= n <=
 * 2^32), which order_shuffle uses for long lists on machines of 4 CPUs or
 * more.  False (perm untouched) if the thread cannot start. */
bool order_shuffle_piped(uint64_t *perm, uint64_t n, uint64_t seed);

/* Lowers the calling thread's CPU priority (nice ORDER_NICE), once per
 * thread: orders are built on libuv's pool beside the loop and the
 * readers, and a build of millions of picks must give them the CPU first. */
#define ORDER_NICE 10
void order_lower_priority(void);

/* What order_build would refuse, without building: 0 and the number of
 * picks the share will hold, or the same -errno and message. */
int order_check(const struct order_spec *spec, uint64_t space, uint64_t *nshare, char *err,
		size_t errlen);
/* This rank's picks for one epoch over a schedule space of `space` picks
 * (augment * N).  *picks is malloc'd (caller frees).  Returns 0, -EINVAL
 * (rank >= world, empty space) or -ERANGE (an explicit index >= space; err
 * names the index and its position), -ENOMEM. */
int order_build(const struct order_spec *spec, uint64_t space, uint64_t **picks, uint64_t *npicks,
		char *err, size_t errlen);

/* The host memory order_build takes for spec over space, in bytes: the most
 * it holds while building (a shuffle permutes the whole schedule before a
 * rank takes its share), and what the share it returns keeps. */
void order_memory(const struct order_spec *spec, uint64_t space, uint64_t *peak, uint64_t *keep);

/* Batches in a share of npicks: ceil, or floor when drop_last. */
uint64_t order_num_batches(uint64_t npicks, uint32_t batch_size, bool drop_last);

#endif
