/*
 * order.c — the picks one rank receives in one epoch, and their order.
 *
 * The shuffle is a published algorithm (docs/SHUFFLE.md, folded into the
 * README) rather than "whatever libc's rand does", because trainers on other
 * nodes and in other languages must be able to recompute the permutation to
 * resume, to audit, or to key per-sample transforms.  Every step below is
 * therefore spelled out exactly: splitmix64, rejection sampling for an
 * unbiased bounded draw, and Fisher–Yates from the top index down.
 * block_shuffle reuses all three: one generator permutes the blocks, then
 * shuffles each window of the laid-out list, window after window.
 *
 * DESIGN: pure functions with no shared state; the loop thread calls
 * order_build off the loop thread (a session's worker, ahead.c) and owns
 * the array it returns.  No locks: a long shuffle takes its draws from one
 * short-lived thread of its own through a single-producer, single-consumer
 * ring (atomics only), joined before order_shuffle returns.
 */
#include "order/order.h"
#include "util.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sched.h>
#include <sys/resource.h>
#include <string.h>
#include <unistd.h>

uint64_t order_splitmix64(uint64_t *state)
{
	uint64_t z;

	*state += 0x9E3779B97F4A7C15ULL;
	z = *state;
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
	return z ^ (z >> 31);
}

uint64_t order_bounded(uint64_t *state, uint64_t m)
{
	/* (2^64 - m) mod m: the draws below this threshold are the ones that
	 * would make r mod m favour small values, so they are redrawn.  The
	 * threshold is below m, so a draw >= m (all but about m in 2^64 of
	 * them) passes without computing it.  For m = 1 the threshold is 0 and
	 * one draw is consumed. */
	uint64_t r;

	for (;;) {
		r = order_splitmix64(state);
		if (r >= m || r >= (0 - m) % m)
			return r % m;
	}
}

/* In the piped shuffle the swaps prefetch the target of the swap this many
 * draws ahead: the draws do not depend on the array, and a random access
 * into a large array otherwise costs a cache miss per step. */
#define SHUFFLE_AHEAD 64u

/* Lists at least this long get their draws from a second thread, which
 * runs ahead of the swaps through a ring of DRAW_RING entries: on the H200
 * host the draws (two 64-bit divisions each) were 5 of the 11 ms that 2^20
 * picks took, time that the swaps can overlap.  Same draws, same order. */
#define PIPE_MIN  (1u << 16)
#define DRAW_RING (1u << 14)
/* ... on machines where two threads of one build do not take the cores of
 * everything else: with 2 CPUs a build's two threads and the readers
 * would share them. */
#define PIPE_MIN_CPUS 4

#if defined(__x86_64__) || defined(__i386__)
#define cpu_pause() __builtin_ia32_pause()
#else
#define cpu_pause() ((void)0)
#endif

/* A wait for the other thread of a piped shuffle: a pause, and every
 * SPIN_YIELD of them the CPU for whoever else wants it.  Orders are built
 * on a worker pool beside readers and other builds, so a spinning wait must
 * not keep a core from the thread it waits for. */
#define SPIN_YIELD 64u
static void spin_wait(unsigned *spins)
{
	cpu_pause();
	if (++*spins % SPIN_YIELD == 0)
		sched_yield();
}

struct draws {
	uint64_t state;
	uint64_t n;
	uint32_t ring[DRAW_RING];
	/* Each counter on its own cache line, published every DRAW_BATCH
	 * steps, so that the two threads do not trade a line per draw. */
	_Alignas(64) uint64_t made; /* draws written (producer) */
	_Alignas(64) uint64_t used; /* draws consumed (consumer) */
};

#define DRAW_BATCH 256u

static void *draw_main(void *arg)
{
	struct draws *d = arg;
	uint64_t used = 0, total = d->n - 1;
	unsigned spins = 0;

	/* Draw number k (k = 0, 1, ...) is for m = n - k, down to m = 2. */
	for (uint64_t k = 0, m = d->n; m > 1; k++, m--) {
		uint64_t j = order_bounded(&d->state, m);

		while (k - used >= DRAW_RING) {
			spin_wait(&spins);
			used = __atomic_load_n(&d->used, __ATOMIC_ACQUIRE);
		}
		d->ring[k % DRAW_RING] = (uint32_t)j;
		if ((k + 1) % DRAW_BATCH == 0 || k + 1 == total)
			__atomic_store_n(&d->made, k + 1, __ATOMIC_RELEASE);
	}
	return NULL;
}

bool order_shuffle_piped(uint64_t *perm, uint64_t n, uint64_t seed)
{
	struct draws *d = aligned_alloc(64, (sizeof(struct draws) + 63) / 64 * 64);
	uint64_t total = n - 1, k = 0, made = 0;
	unsigned spins = 0;
	pthread_t tid;

	if (!d)
		return false;
	d->state = seed;
	d->n = n;
	d->made = 0;
	d->used = 0;
	if (pthread_create(&tid, NULL, draw_main, d) != 0) {
		free(d);
		return false;
	}
	for (uint64_t i = 0; i < n; i++)
		perm[i] = i;
	for (uint64_t i = n; i > 1; i--, k++) {
		uint64_t want = k + SHUFFLE_AHEAD < total ? k + SHUFFLE_AHEAD + 1 : total;
		uint64_t j, t;

		/* Draw k, and the one SHUFFLE_AHEAD later whose target is
		 * prefetched now (or the last draw). */
		while (made < want) {
			spin_wait(&spins);
			made = __atomic_load_n(&d->made, __ATOMIC_ACQUIRE);
		}
		if (k + SHUFFLE_AHEAD < total)
			__builtin_prefetch(&perm[d->ring[(k + SHUFFLE_AHEAD) % DRAW_RING]], 1);
		j = d->ring[k % DRAW_RING];
		t = perm[i - 1];
		perm[i - 1] = perm[j];
		perm[j] = t;
		if ((k + 1) % DRAW_BATCH == 0)
			__atomic_store_n(&d->used, k + 1, __ATOMIC_RELEASE);
	}
	pthread_join(tid, NULL);
	free(d);
	return true;
}

void order_shuffle(uint64_t *perm, uint64_t n, uint64_t seed)
{
	uint64_t state = seed;
	uint64_t i, j, t;

	/* Long lists: the same algorithm with its draws made ahead on a
	 * second thread.  Short ones fit in cache and gain nothing from it. */
	if (n >= PIPE_MIN && n <= UINT32_MAX && sysconf(_SC_NPROCESSORS_ONLN) >= PIPE_MIN_CPUS &&
	    order_shuffle_piped(perm, n, seed))
		return;
	for (i = 0; i < n; i++)
		perm[i] = i;
	/* i counts down to 1 (not 0): a swap of perm[0] with itself would
	 * still consume a draw and change every later permutation. */
	for (i = n; i > 1; i--) {
		j = order_bounded(&state, i);
		t = perm[i - 1];
		perm[i - 1] = perm[j];
		perm[j] = t;
	}
}

/* The spec's Fisher–Yates over a[0..n), drawing from *state and leaving it
 * where the next draw of the same generator starts (block_shuffle's
 * windows continue the generator of its block permutation). */
static void fisher_yates(uint64_t *a, uint64_t n, uint64_t *state)
{
	for (uint64_t i = n; i > 1; i--) {
		uint64_t j = order_bounded(state, i), t = a[i - 1];

		a[i - 1] = a[j];
		a[j] = t;
	}
}

static uint64_t block_samples(const struct order_spec *spec, uint64_t space)
{
	return spec->samples ? spec->samples : space;
}

/* Blocks of a block_shuffle schedule: ceil(N / B) per copy of the data. */
static uint64_t block_count(const struct order_spec *spec, uint64_t space)
{
	uint64_t n = block_samples(spec, space);

	return space / n * order_sample_blocks(n, spec->block_rows);
}

/* list[0..space) := the block_shuffle list (docs/SHUFFLE.md), given a
 * scratch array of block_count entries for the block permutation.  The
 * spec draws the whole permutation first, then the windows in order;
 * laying each window out just before its shuffle keeps the same draws in
 * the same order, and touches the window while it is still in cache. */
static void block_shuffle(uint64_t *list, uint64_t *bperm, const struct order_spec *spec,
			  uint64_t space)
{
	uint64_t n = block_samples(spec, space), rows = spec->block_rows;
	uint64_t per_copy = order_sample_blocks(n, rows), nb = block_count(spec, space);
	uint64_t state = spec->seed, pos = 0, w = 0;

	for (uint64_t k = 0; k < nb; k++)
		bperm[k] = k;
	fisher_yates(bperm, nb, &state);
	while (w < nb) {
		/* Written so that a W of up to 2^64 - 1 does not wrap. */
		uint64_t end = nb - w > spec->window_blocks ? w + spec->window_blocks : nb;
		uint64_t start = pos;

		for (; w < end; w++) {
			uint64_t copy = bperm[w] / per_copy, j = bperm[w] % per_copy;
			uint64_t first = copy * n + j * rows;
			uint64_t count = j + 1 < per_copy ? rows : n - j * rows;

			for (uint64_t r = 0; r < count; r++)
				list[pos++] = first + r;
		}
		fisher_yates(list + start, pos - start, &state);
	}
}

void order_lower_priority(void)
{
	static __thread bool lowered;

	if (!lowered) {
		/* Per thread on Linux: PRIO_PROCESS with a thread id. */
		setpriority(PRIO_PROCESS, (id_t)gettid(), ORDER_NICE);
		lowered = true;
	}
}

/* Every rank gets ceil(len / world) picks (order_build says how). */
static uint64_t share_len(uint64_t len, uint32_t world)
{
	return len / world + (len % world != 0);
}

void order_memory(const struct order_spec *spec, uint64_t space, uint64_t *peak, uint64_t *keep)
{
	uint32_t world = spec->world ? spec->world : 1;
	uint64_t len = spec->kind == ORDER_EXPLICIT ? spec->nindices : space;
	uint64_t nshare = share_len(len, world);

	*keep = nshare * sizeof(uint64_t);
	*peak = *keep;
	/* A shuffle permutes the whole schedule first; an explicit list is
	 * copied off the request it came in. */
	if (((spec->kind == ORDER_SHUFFLE || spec->kind == ORDER_BLOCK_SHUFFLE) && world > 1) ||
	    spec->kind == ORDER_EXPLICIT)
		*peak += len * sizeof(uint64_t);
	/* ... and a block shuffle permutes its blocks before that. */
	if (spec->kind == ORDER_BLOCK_SHUFFLE && space && spec->block_rows &&
	    space % block_samples(spec, space) == 0)
		*peak += block_count(spec, space) * sizeof(uint64_t);
}

uint64_t order_num_batches(uint64_t npicks, uint32_t batch_size, bool drop_last)
{
	if (batch_size == 0)
		return 0;
	if (drop_last)
		return npicks / batch_size;
	return npicks / batch_size + (npicks % batch_size != 0);
}

int order_check(const struct order_spec *spec, uint64_t space, uint64_t *nshare, char *err,
		size_t errlen)
{
	uint32_t world = spec->world ? spec->world : 1;
	uint64_t len;

	if (spec->rank >= world) {
		set_err(err, errlen, "rank %u is out of range (world is %u)", spec->rank, world);
		return -EINVAL;
	}
	switch (spec->kind) {
	case ORDER_SEQ:
	case ORDER_SHUFFLE:
		if (space == 0) {
			set_err(err, errlen, "the schedule is empty (the dataset has no samples)");
			return -EINVAL;
		}
		len = space;
		break;
	case ORDER_BLOCK_SHUFFLE:
		if (space == 0) {
			set_err(err, errlen, "the schedule is empty (the dataset has no samples)");
			return -EINVAL;
		}
		if (space % block_samples(spec, space) != 0) {
			set_err(err, errlen,
				"a schedule of %llu picks is not a whole number of copies of "
				"%llu samples",
				(unsigned long long)space, (unsigned long long)spec->samples);
			return -EINVAL;
		}
		if (spec->block_rows == 0 || spec->window_blocks == 0) {
			set_err(err, errlen, "block_shuffle with %s 0 (it must be at least 1)",
				spec->block_rows == 0 ? "block_rows" : "window_blocks");
			return -EINVAL;
		}
		len = space;
		break;
	case ORDER_EXPLICIT:
		if (spec->nindices == 0 || !spec->indices) {
			set_err(err, errlen, "explicit order with an empty index list");
			return -EINVAL;
		}
		for (uint64_t i = 0; i < spec->nindices; i++) {
			if (spec->indices[i] >= space) {
				set_err(err, errlen,
					"index %llu at position %llu is out of range "
					"(schedule has %llu picks)",
					(unsigned long long)spec->indices[i], (unsigned long long)i,
					(unsigned long long)space);
				return -ERANGE;
			}
		}
		len = spec->nindices;
		break;
	default: set_err(err, errlen, "unknown order kind %d", (int)spec->kind); return -EINVAL;
	}
	*nshare = share_len(len, world);
	return 0;
}

int order_build(const struct order_spec *spec, uint64_t space, uint64_t **picks, uint64_t *npicks,
		char *err, size_t errlen)
{
	return order_build_into(spec, space, NULL, 0, picks, npicks, err, errlen);
}

/* reuse, holding no more than n picks: what is beyond them goes back now.
 * Whoever owns an order counts it by its length (the quota, the kept
 * orders' cap), so a buffer of a longer order must not pass for a shorter
 * one: a world-2 share reused for a world-16 one held 8 times what was
 * counted, for as long as it was kept (issue 37).  A shrink moves nothing
 * (glibc remaps a mapped block smaller, or splits a heap one), so the
 * pages the reuse is for stay.  NULL when it cannot be shrunk: the caller
 * makes a new one. */
static uint64_t *fit(uint64_t *reuse, uint64_t reuse_len, uint64_t n)
{
	uint64_t *p;

	if (reuse_len == n)
		return reuse;
	p = realloc(reuse, (size_t)n * sizeof(*p));
	if (!p)
		free(reuse);
	return p;
}

int order_build_into(const struct order_spec *spec, uint64_t space, uint64_t *reuse,
		     uint64_t reuse_len, uint64_t **picks, uint64_t *npicks, char *err,
		     size_t errlen)
{
	uint32_t world = spec->world ? spec->world : 1;
	uint64_t *list = NULL; /* owned: the whole epoch, before sharding */
	uint64_t *share = NULL;
	uint64_t len = spec->kind == ORDER_EXPLICIT ? spec->nindices : space, nshare, k;
	int rc;

	*picks = NULL;
	*npicks = 0;
	rc = order_check(spec, space, &nshare, err, errlen);
	if (rc)
		goto out;
	/* A reuse too short for the share (and so for the list) goes now,
	 * before the build makes memory of its own: the quota counts the
	 * build's peak, not a buffer it was handed (ahead.h, freeing). */
	if (reuse && reuse_len < (nshare ? nshare : 1)) {
		free(reuse);
		reuse = NULL;
	}

	/* Every rank gets ceil(len / world) picks: the list is virtually padded
	 * to a multiple of world by cycling from its head, exactly as
	 * DistributedSampler(drop_last=False) does, so that all ranks run the
	 * same number of steps and none waits forever in a collective. */
	if (nshare > SIZE_MAX / sizeof(*share)) {
		rc = -ENOMEM;
		goto out;
	}
	if (spec->kind == ORDER_SHUFFLE || spec->kind == ORDER_BLOCK_SHUFFLE) {
		if (len > SIZE_MAX / sizeof(*list)) {
			rc = -ENOMEM;
			goto out;
		}
		/* The whole list is written below: a buffer that holds it
		 * needs nothing more.  With one rank the list is the order,
		 * and holds no more than it; with more it is freed below. */
		if (reuse && reuse_len >= len) {
			list = world == 1 ? fit(reuse, reuse_len, len) : reuse;
			reuse = NULL;
		} else if (reuse) {
			/* The share's, shrunk to it before the list is made. */
			share = fit(reuse, reuse_len, nshare ? nshare : 1);
			reuse = NULL;
		}
		if (!list)
			list = malloc((size_t)len * sizeof(*list));
		if (!list) {
			rc = -ENOMEM;
			goto out;
		}
		if (spec->kind == ORDER_SHUFFLE) {
			order_shuffle(list, len, spec->seed);
		} else {
			/* At most one block per pick: no overflow past len's. */
			uint64_t *bperm = malloc((size_t)block_count(spec, len) * sizeof(*bperm));

			if (!bperm) {
				rc = -ENOMEM;
				goto out;
			}
			block_shuffle(list, bperm, spec, len);
			free(bperm);
		}
		if (world == 1) {
			/* One rank: the share is the whole list, as is. */
			*picks = list;
			*npicks = len;
			free(reuse);
			return 0;
		}
	}
	if (reuse) {
		/* A rank's share, as the last epoch's was, or a smaller one. */
		share = fit(reuse, reuse_len, nshare ? nshare : 1);
		reuse = NULL;
	}
	if (!share)
		share = malloc((size_t)(nshare ? nshare : 1) * sizeof(*share));
	if (!share) {
		rc = -ENOMEM;
		goto out;
	}

	/* Position p of the padded list holds list[p mod len]; rank r takes
	 * positions r, r + world, r + 2 world, ... (all below nshare * world). */
	for (k = 0; k < nshare; k++) {
		uint64_t p = (uint64_t)spec->rank + k * world;

		if (p >= len) /* only the padding wraps: no division per pick */
			p %= len;

		if (spec->kind == ORDER_SEQ)
			share[k] = p;
		else if (spec->kind == ORDER_EXPLICIT)
			share[k] = spec->indices[p];
		else
			share[k] = list[p];
	}

	*picks = share;
	*npicks = nshare;
	share = NULL;
	rc = 0;
out:
	free(reuse);
	free(list);
	free(share);
	return rc;
}

int order_block_params(uint64_t block_rows, uint64_t block_bytes, uint64_t window_blocks,
		       uint64_t samples, uint32_t augment, uint64_t sample_bytes, uint64_t *rows,
		       uint64_t *window, bool *clamped, char *err, size_t errlen)
{
	uint64_t b, nb;

	*clamped = false;
	/* 0 is "not set" on the wire, so only both set can be told wrong. */
	if (block_rows && block_bytes) {
		set_err(err, errlen,
			"block_rows (%llu) and block_bytes (%llu) are both set: give one of them",
			(unsigned long long)block_rows, (unsigned long long)block_bytes);
		return -EINVAL;
	}
	if (samples == 0) {
		set_err(err, errlen, "the schedule is empty (the dataset has no samples)");
		return -EINVAL;
	}
	if (sample_bytes == 0) /* no fields: every size is that many rows */
		sample_bytes = 1;
	if (block_rows)
		b = block_rows;
	else
		b = (block_bytes ? block_bytes : ORDER_BLOCK_DEFAULT_BYTES) / sample_bytes;
	if (b == 0) /* a block smaller than one sample */
		b = 1;
	if (b > samples) {
		/* The default is bigger than any small dataset: no news. */
		*clamped = block_rows || block_bytes;
		b = samples;
	}
	nb = (uint64_t)(augment ? augment : 1) * order_sample_blocks(samples, b);
	*rows = b;
	*window = window_blocks ? window_blocks : ORDER_BLOCK_DEFAULT_WINDOW;
	if (*window > nb)
		*window = nb;
	return 0;
}

void order_served(uint64_t npicks, uint32_t batch_size, bool drop_last, uint64_t start_batch,
		  uint64_t *first, uint64_t *count)
{
	uint64_t nbatches = order_num_batches(npicks, batch_size, drop_last), end;

	*first = *count = 0;
	if (start_batch >= nbatches)
		return;
	/* Both below npicks + batch_size: start_batch < nbatches. */
	*first = start_batch * batch_size;
	end = nbatches * batch_size < npicks ? nbatches * batch_size : npicks;
	*count = end - *first;
}

int order_block_uses(const uint64_t *picks, uint64_t npicks, uint64_t samples, uint64_t block_rows,
		     uint32_t **uses, uint64_t *nblocks)
{
	uint64_t nb;
	uint32_t *u;

	*uses = NULL;
	*nblocks = 0;
	if (samples == 0 || block_rows == 0)
		return -EINVAL;
	nb = order_sample_blocks(samples, block_rows);
	if (nb > SIZE_MAX / sizeof(*u))
		return -ENOMEM;
	u = calloc((size_t)nb, sizeof(*u));
	if (!u)
		return -ENOMEM;
	for (uint64_t i = 0; i < npicks; i++) {
		uint32_t *c = &u[order_sample_block(picks[i], samples, block_rows)];

		/* Only a share of more than 2^32 picks can get here. */
		if (*c == UINT32_MAX) {
			free(u);
			return -EOVERFLOW;
		}
		(*c)++;
	}
	*uses = u;
	*nblocks = nb;
	return 0;
}
