/*
 * gather.h — the parameter block of the pool's gather kernel (gather.cu),
 * shared by the daemon, which assembles batches of sessions whose client
 * cannot, and libprefetch, which launches the same kernel in the trainer's
 * own context from a module embedded in the library (docs/DESIGN.md, "The
 * VRAM pool": no SM work in the daemon's context on a trainer's GPU).
 * Plain C, no CUDA types: the struct is passed by value as the kernel's
 * only parameter.
 */
#ifndef PF_GATHER_H
#define PF_GATHER_H

#include <stdint.h>

/* Datasets with more fields than this are served without the pool. */
#define GPU_GATHER_MAX_FIELDS 16
/* A desc entry with this bit set names staged row k (its low bits); one
 * without it is the device address of a pool record (or, in entry mode, a
 * pool entry id). */
#define GPU_GATHER_STAGED (1ull << 63)

/* One batch's assembly.  Every address is a device address on the stream's
 * device.  A pool record holds one sample: field f at record + rec_off[f].
 * Staged rows (a batch's misses, plus rows staged only to be admitted) are
 * packed field by field: field f of staged row k at
 * staged + staged_off[f] + k * row_bytes[f]. */
struct gpu_gather {
	uint64_t slot;	  /* the batch's slot: field f of row i at slot + slot_off[f] + i *
			     row_bytes[f] */
	uint64_t desc;	  /* count uint64 (uint32 with desc32): row i's source (a record, or
			     GPU_GATHER_STAGED | k) */
	uint32_t count;	  /* rows of the batch */
	uint32_t nstaged; /* staged rows */
	uint64_t staged;  /* the staged rows */
	uint64_t admit;	  /* nstaged uint64: the record staged row k is copied into, or 0 */
	uint32_t nfields;
	/* Entry mode only (bases != 0, nstaged 0): desc holds count uint32
	 * entry ids, not uint64, as a client of 4-byte ids gets them inline
	 * (BatchReady.gather_ids32) and stages them: half the bytes to copy
	 * and for the kernel to read over PCIe.  Such an entry names no
	 * staged row.  It sits in what was padding, so the parameter block
	 * keeps its size. */
	uint32_t desc32;
	uint64_t slot_off[GPU_GATHER_MAX_FIELDS];
	uint64_t staged_off[GPU_GATHER_MAX_FIELDS];
	uint32_t rec_off[GPU_GATHER_MAX_FIELDS];
	uint32_t row_bytes[GPU_GATHER_MAX_FIELDS];
	/* Table mode (table != 0), for a pool that holds every sample: desc
	 * holds the batch's picks instead, and row i's source is the record
	 * table[desc[i] mod table_n] (a device array of table_n addresses),
	 * so the host looks nothing up per row.  nstaged must be 0. */
	uint64_t table;
	uint64_t table_n;
	/* Entry mode (bases != 0), the client's gather: a desc entry without
	 * GPU_GATHER_STAGED is a pool entry id e (slab << slab_shift | index),
	 * whose record is at bases[e >> slab_shift] + index * rec_stride;
	 * bases is a device array of nbases slab addresses in the gathering
	 * process's context.  A row naming a slab at or past nbases, or one
	 * whose base is 0 (not mapped), is skipped: a wild read would kill the
	 * trainer's context.  admit must be 0 (the client admits nothing). */
	uint64_t bases;
	uint32_t nbases;
	uint32_t slab_shift;
	uint64_t rec_stride;
};

/* Batches one launch of the client's group kernel assembles at most. */
#define GPU_GATHER_GROUP 8

/*
 * Several batches of pool hits gathered in one launch (libprefetch's
 * pf_gather_group): a launch costs the trainer's thread 3.5-4.6 us on an
 * H200 (bench/NOTES.md, run 19), about as much as the rest of a batch's
 * hand-off, while the batches that arrive in one read of the socket are
 * often several.  g holds the layout and the slab bases (entry mode, as for
 * one batch); its slot, desc and count are unused, and its desc32 says the
 * width of every batch's entries (a group is of one width).  Batch k's rows
 * are the blocks first[k] .. first[k+1] - 1: row b - first[k] of slot[k],
 * its source entry desc[k][b - first[k]].  Staged rows are not allowed (a
 * batch with misses is launched on its own).
 */
struct gpu_gather_group {
	struct gpu_gather g;
	uint32_t n;			      /* batches, 1 .. GPU_GATHER_GROUP */
	uint32_t first[GPU_GATHER_GROUP + 1]; /* first[n]: blocks of the launch */
	uint64_t slot[GPU_GATHER_GROUP];
	uint64_t desc[GPU_GATHER_GROUP];
};

#ifndef __cplusplus
/* Each is passed by value as a kernel's only parameter, which may be 4 KiB
 * at most on the drivers and GPUs the kernel is built for. */
_Static_assert(sizeof(struct gpu_gather_group) <= 4096,
	       "the group gather's parameter block is over the kernel parameter limit");
#endif

#endif
