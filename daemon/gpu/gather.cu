/*
 * gather.cu — the VRAM pool's batch assembly: one kernel that builds a
 * batch's slot from pool records (hits) and staged rows (misses that came
 * over PCIe), and copies the staged rows that are to be admitted into their
 * pool records, all in one launch on the copy stream.
 *
 * Why a kernel of our own: a batch of B samples with F fields is B * F small
 * scattered copies (typically 256 B .. 64 KiB each).  As cudaMemcpyAsync
 * calls that is thousands of launches per batch, and even a batched memcpy
 * needs its pointer arrays built on the host.  Here the host sends only the
 * per-row source (desc) and the per-field layout, and every row is one
 * thread block, so the whole batch costs one launch and runs at close to
 * device-to-device copy speed.
 *
 * Block b < count assembles batch row b: for every field f it copies
 * row_bytes[f] bytes from its source (a record, or a staged row) to the
 * slot.  Block count + k admits staged row k into admit[k] when that is
 * nonzero.  The two kinds of blocks run concurrently, so a record that a row
 * of the call reads must not be admitted into by the same call (gpu.h).  A
 * staged index >= nstaged is skipped rather than read out of bounds: a wild
 * read would poison the whole CUDA context of the daemon, every session
 * with it, while a skipped row shows up as wrong bytes in one batch.
 *
 * DESIGN: gpu_gather_launch is called only by gpu.c's gpu_gather, on the
 * transfer thread that owns the stream (the device is already current on
 * that thread).  No state, no locks; the struct gpu_gather is passed by value
 * as the kernel's parameter, so the caller's copy may change as soon as the
 * launch returns.
 */
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

extern "C" {
#include "gather.h"
}

/* Built twice: into the daemon (gpu_gather_launch below, a static kernel),
 * and, with GATHER_MODULE defined, as the fatbin that libprefetch embeds,
 * where the kernel is an extern "C" entry the driver API finds by name. */
#ifdef GATHER_MODULE
#define GATHER_LINKAGE extern "C"
#define gather_kernel  pf_gather
#else
#define GATHER_LINKAGE static
#endif

/* 128 threads x 4 loads of 16 B in flight = 8 KiB per block per round: a
 * 4 KiB row is one round, 2 loads per thread.  The kernel uses 40 registers
 * (ptxas, sm_90), so 12 blocks fit an SM: ~48 KiB of reads in flight per SM
 * for 4 KiB rows, more than the ~25 KiB that H200's bandwidth-delay product
 * asks for.  Capping it at 32 registers for 16 blocks made ptxas spill. */
#define GATHER_THREADS 128
#define GATHER_UNROLL  4

/* Copies n elements of T with the whole block: each thread issues
 * GATHER_UNROLL independent loads before its first store, so a thread has
 * several reads in flight instead of one.  The addresses are plain integers,
 * so without __ldg/__stwb the accesses would be generic ones; these make
 * them global.  __ldg's non-coherent path is safe because nothing this
 * kernel reads is written by the same launch (gpu.h's no-overlap rule). */
template <typename T>
static __device__ __forceinline__ void copy_elems(T *__restrict__ dst, const T *__restrict__ src,
						  uint64_t n)
{
	const uint64_t step = (uint64_t)blockDim.x * GATHER_UNROLL;

	for (uint64_t base = threadIdx.x; base < n; base += step) {
		T v[GATHER_UNROLL];

#pragma unroll
		for (int u = 0; u < GATHER_UNROLL; u++) {
			uint64_t j = base + (uint64_t)u * blockDim.x;

			if (j < n)
				v[u] = __ldg(src + j);
		}
#pragma unroll
		for (int u = 0; u < GATHER_UNROLL; u++) {
			uint64_t j = base + (uint64_t)u * blockDim.x;

			if (j < n)
				__stwb(dst + j, v[u]);
		}
	}
}

/* The widest access that src, dst and bytes all allow.  The choice is the
 * same for every thread of the block, so it never diverges. */
static __device__ __forceinline__ void copy_row(uint64_t dst, uint64_t src, uint32_t bytes)
{
	uint64_t a = dst | src | bytes;

	if (!(a & 15))
		copy_elems((uint4 *)dst, (const uint4 *)src, bytes / 16);
	else if (!(a & 3))
		copy_elems((unsigned int *)dst, (const unsigned int *)src, bytes / 4);
	else
		copy_elems((unsigned char *)dst, (const unsigned char *)src, bytes);
}

/* Row b of a batch whose slot is at slot and whose sources are desc[]: one
 * block copies every field of it.  g is a kernel parameter (never copied
 * to local memory: the field loop indexes its arrays in place). */
static __device__ __forceinline__ void assemble_row(const struct gpu_gather &g, uint64_t slot,
						    uint64_t desc, uint64_t b, uint32_t nfields)
{
	uint64_t src;

	if (g.desc32) {
		/* A 4-byte entry id means entry mode: without the slab bases
		 * it would be taken for an address, and a wild read kills the
		 * context.  It can name no staged row (no bit 63), so it goes
		 * through the same slab checks as an 8-byte id below. */
		if (!g.bases)
			return;
		src = ((const uint32_t *)desc)[b];
	} else {
		src = ((const uint64_t *)desc)[b];
	}
	if (g.table && !g.desc32) {
		/* src is a pick: its sample's record comes from the table (an
		 * out-of-range entry is never staged). */
		if (src >= g.table_n)
			src %= g.table_n;
		src = ((const uint64_t *)g.table)[src] & ~GPU_GATHER_STAGED;
	}

	if (src & GPU_GATHER_STAGED) {
		const uint64_t k = src & ~GPU_GATHER_STAGED;

		if (k >= g.nstaged)
			return;
		for (uint32_t f = 0; f < nfields; f++)
			copy_row(slot + g.slot_off[f] + b * g.row_bytes[f],
				 g.staged + g.staged_off[f] + k * g.row_bytes[f], g.row_bytes[f]);
	} else if (g.bases) {
		const uint64_t slab = src >> g.slab_shift;
		uint64_t rec;

		if (slab >= g.nbases)
			return;
		rec = ((const uint64_t *)g.bases)[slab];
		if (!rec)
			return;
		rec += (src & ((1ull << g.slab_shift) - 1)) * g.rec_stride;
		for (uint32_t f = 0; f < nfields; f++)
			copy_row(slot + g.slot_off[f] + b * g.row_bytes[f], rec + g.rec_off[f],
				 g.row_bytes[f]);
	} else if (src) {
		for (uint32_t f = 0; f < nfields; f++)
			copy_row(slot + g.slot_off[f] + b * g.row_bytes[f], src + g.rec_off[f],
				 g.row_bytes[f]);
	}
}

/* __grid_constant__: g stays in the kernel parameter space and is indexed
 * there (the field loop indexes its arrays), never copied to local memory. */
GATHER_LINKAGE __global__ void __launch_bounds__(GATHER_THREADS)
	gather_kernel(const __grid_constant__ struct gpu_gather g)
{
	const uint32_t nfields =
		g.nfields < GPU_GATHER_MAX_FIELDS ? g.nfields : GPU_GATHER_MAX_FIELDS;
	const uint64_t b = blockIdx.x;

	if (b < g.count) {
		assemble_row(g, g.slot, g.desc, b, nfields);
	} else if (g.admit) {
		const uint64_t k = b - g.count;
		const uint64_t rec = ((const uint64_t *)g.admit)[k];

		if (!rec)
			return;
		for (uint32_t f = 0; f < nfields; f++)
			copy_row(rec + g.rec_off[f],
				 g.staged + g.staged_off[f] + k * g.row_bytes[f], g.row_bytes[f]);
	}
}

#ifdef GATHER_MODULE
/* Several batches of hits in one launch (gather.h's struct
 * gpu_gather_group): block b finds its batch among at most
 * GPU_GATHER_GROUP in the parameter space, then assembles its row as the
 * one-batch kernel does.  A group with staged rows or admissions is not
 * made (the host launches those batches on their own). */
extern "C" __global__ void __launch_bounds__(GATHER_THREADS)
	pf_gather_group(const __grid_constant__ struct gpu_gather_group gg)
{
	const uint32_t nfields =
		gg.g.nfields < GPU_GATHER_MAX_FIELDS ? gg.g.nfields : GPU_GATHER_MAX_FIELDS;
	const uint32_t n = gg.n < GPU_GATHER_GROUP ? gg.n : GPU_GATHER_GROUP;
	const uint32_t b = blockIdx.x;
	uint32_t k = 0;

	while (k + 1 < n && b >= gg.first[k + 1])
		k++;
	if (b < gg.first[k] || b >= gg.first[k + 1])
		return;
	assemble_row(gg.g, gg.slot[k], gg.desc[k], b - gg.first[k], nfields);
}
#endif

#ifndef GATHER_MODULE
/* Queues the kernel on cuda_stream (a cudaStream_t); returns the launch's
 * cudaError_t (0: queued).  Errors of the kernel's execution surface later,
 * at the next event or synchronisation on the stream. */
extern "C" int gpu_gather_launch(void *cuda_stream, const struct gpu_gather *g)
{
	const uint64_t blocks = (uint64_t)g->count + g->nstaged;

	if (blocks == 0 || g->nfields == 0)
		return cudaSuccess;
	if (blocks > INT32_MAX || g->nfields > GPU_GATHER_MAX_FIELDS)
		return cudaErrorInvalidValue;
	/* Clear an error left by an earlier call on this thread (already
	 * reported by that call), so what we return is this launch's. */
	(void)cudaGetLastError();
	gather_kernel<<<(unsigned int)blocks, GATHER_THREADS, 0, (cudaStream_t)cuda_stream>>>(*g);
	return (int)cudaGetLastError();
}
#endif
