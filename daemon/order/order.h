/*
 * daemon/order/ — what an epoch reads, and in what order: the orders
 * themselves (order.c), and the next epoch's order built ahead on libuv's
 * thread pool, with the orders kept for sessions that come back (ahead.c).
 * The loop thread asks; the pool's threads build.  Calls base/ and data/.
 *
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
 * block_shuffle (docs/SHUFFLE.md, "Block shuffle") is the order for datasets
 * read from disk in blocks: the schedule is cut into blocks of B consecutive
 * picks (restarting at each copy of the dataset), the blocks are permuted
 * with the same Fisher-Yates, laid out each in ascending order, and each
 * window of W consecutive blocks of that layout is shuffled in place,
 * continuing the same generator.  A pick never leaves its window, so a
 * reader that reads whole blocks reads each one once per epoch and holds W
 * of them at a time.
 *
 * DESIGN: pure functions, no state; called by the loop thread at StartEpoch.
 */
#ifndef PF_ORDER_H
#define PF_ORDER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum order_kind { ORDER_SEQ, ORDER_SHUFFLE, ORDER_EXPLICIT, ORDER_BLOCK_SHUFFLE };

struct order_spec {
	enum order_kind kind;
	uint64_t seed;
	const uint64_t *indices; /* borrowed: ORDER_EXPLICIT only */
	uint64_t nindices;
	uint32_t rank;
	uint32_t world; /* 0 is taken as 1 */
	/* ORDER_BLOCK_SHUFFLE only: the dataset's N (the schedule space is a
	 * whole number of copies of it; 0 is taken as the space itself), the
	 * block size B >= 1 in samples and the window W >= 1 in blocks, as
	 * order_block_params resolves them.  B above N and W above the
	 * number of blocks give the same order as N and that number. */
	uint64_t samples;
	uint64_t block_rows;
	uint64_t window_blocks;
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
/* order_build, into reuse (reuse_len picks, malloc'd; NULL for none) where
 * the order fits it: the last epoch's order, whose pages are already
 * there, in place of a new allocation to fault in and an old one to
 * unmap.  Takes reuse: what it does not build into, it frees.  Like
 * order_build's, *picks holds *npicks picks and no more (a longer reuse
 * is shrunk to the order), so an order counted by its length is counted
 * by the memory it holds. */
int order_build_into(const struct order_spec *spec, uint64_t space, uint64_t *reuse,
		     uint64_t reuse_len, uint64_t **picks, uint64_t *npicks, char *err,
		     size_t errlen);

/* The host memory order_build takes for spec over space, in bytes: the most
 * it holds while building (a shuffle permutes the whole schedule before a
 * rank takes its share), and what the share it returns keeps. */
void order_memory(const struct order_spec *spec, uint64_t space, uint64_t *peak, uint64_t *keep);

/* Batches in a share of npicks: ceil, or floor when drop_last. */
uint64_t order_num_batches(uint64_t npicks, uint32_t batch_size, bool drop_last);

/* ---- block_shuffle ------------------------------------------------------------ */

/* StartEpoch without a block size or a window: blocks of 4 MiB of samples
 * and 16 blocks a window.  Not measured here: 4 MiB is where a read's
 * fixed cost (~0.1 ms on NVMe, more on network file systems) is a few
 * percent of its transfer at 2-4 GB/s, and 16 such blocks (64 MiB a
 * session) are cheap to hold while a window is served. */
#define ORDER_BLOCK_DEFAULT_BYTES  (4ULL << 20)
#define ORDER_BLOCK_DEFAULT_WINDOW 16

/* B and W of a block_shuffle epoch over augment copies of `samples` samples
 * of sample_bytes each (all fields), from StartEpoch's block_rows,
 * block_bytes and window_blocks, where 0 means "not set": B = block_rows,
 * or max(1, block_bytes / sample_bytes), or the default bytes' worth;
 * clamped to samples (*clamped says so, when a size was asked for);
 * W = window_blocks or the default, clamped to the number of blocks.
 * Returns 0, or -EINVAL with err naming the problem (both sizes set, no
 * samples). */
int order_block_params(uint64_t block_rows, uint64_t block_bytes, uint64_t window_blocks,
		       uint64_t samples, uint32_t augment, uint64_t sample_bytes, uint64_t *rows,
		       uint64_t *window, bool *clamped, char *err, size_t errlen);

/*
 * What a block cache needs to read each block of a block_shuffle epoch
 * once (read = direct): a pick reads sample block
 * order_sample_block(pick, N, B), which holds samples b*B .. min((b+1)*B,
 * N) - 1 of the dataset.  Copies of a sample (augment > 1: picks s, N + s,
 * 2N + s, ...) read the same block, though their picks lie in different
 * blocks of the order; padded duplicates (world not dividing the list)
 * read it again.  order_block_uses counts, per sample block, the picks of
 * the share that read it: a cache that counts down as it serves rows may
 * free a block at zero, and never reads it again in the epoch.
 */
static inline uint64_t order_sample_block(uint64_t pick, uint64_t samples, uint64_t block_rows)
{
	return pick % samples / block_rows;
}

/* Sample blocks of a dataset: ceil(samples / block_rows). */
static inline uint64_t order_sample_blocks(uint64_t samples, uint64_t block_rows)
{
	return samples / block_rows + (samples % block_rows != 0);
}

/* The part of a share of npicks that an epoch serves: from start_batch on,
 * and without the short last batch when drop_last.  *first and *count,
 * for order_block_uses; *count is 0 when start_batch is at or past the
 * end. */
void order_served(uint64_t npicks, uint32_t batch_size, bool drop_last, uint64_t start_batch,
		  uint64_t *first, uint64_t *count);

/* uses[b], for each sample block b < order_sample_blocks(samples,
 * block_rows): how many of picks[0..npicks) read it (pass the served part,
 * order_served).  *uses is malloc'd, *nblocks long (caller frees).
 * Returns 0, -EINVAL (no samples or block_rows 0), -ENOMEM, or -EOVERFLOW
 * when a count would pass UINT32_MAX (shares of more than 2^32 picks
 * only). */
int order_block_uses(const uint64_t *picks, uint64_t npicks, uint64_t samples, uint64_t block_rows,
		     uint32_t **uses, uint64_t *nblocks);

#endif
