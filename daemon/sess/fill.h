/*
 * fill.h — how a batch is laid out and split for the readers: where each
 * field sits in a slot, how a batch planned against the VRAM pool lays out
 * its ring slot (the gather index, the admission addresses, the staged
 * rows), how the rows are cut into reader jobs, and the gather that
 * assembles a pooled batch on the device.
 *
 * Pure arithmetic over a dataset's fields and a pool's geometry: it knows
 * no session, so sessions and the pool's tests (test_pool.c) lay batches out
 * by the same rules.
 *
 * DESIGN: no state and no threads of its own; called on the loop thread.
 */
#ifndef PF_FILL_H
#define PF_FILL_H

#include <stdbool.h>
#include <stdint.h>

#include "gpu/gpu.h"

struct dataset;
struct pool;
struct pool_plan;
struct reader_job;

/* Fields start at this alignment inside a slot (and inside a ring slot's
 * staged rows): enough for any dtype, for vectorised copies and for CUDA's
 * 256-byte allocation alignment. */
#define FILL_FIELD_ALIGN 256u
/* Slots (and ring slots) start at page boundaries. */
#define FILL_SLOT_ALIGN 4096u
/* A batch is read in parts of about this many bytes, each its own reader
 * job, so several readers fill one batch at once (at most `readers` parts,
 * and at most FILL_MAX_PARTS). */
#define FILL_PART_BYTES (1u << 20)
#define FILL_MAX_PARTS	63u

/* Where one batch's fields lie in its slot: every field's samples packed,
 * each field at a FILL_FIELD_ALIGN boundary. */
struct slot_layout {
	uint64_t *field_offset; /* owned: one per field */
	uint64_t slot_bytes;	/* the batch's bytes, padding between fields included */
	uint64_t slot_stride;	/* slot_bytes rounded up to FILL_SLOT_ALIGN */
};

/* Slots larger than this are refused whatever the configuration says: the
 * arithmetic of every offset in one then stays far from 64-bit overflow. */
#define FILL_MAX_SLOT (1ull << 48)

/* 0, -E2BIG (a batch of batch_size samples would pass FILL_MAX_SLOT, err
 * says so) or -ENOMEM. */
int fill_layout(struct slot_layout *lay, const struct dataset *ds, uint32_t batch_size, char *err,
		size_t errlen);
void fill_layout_free(struct slot_layout *lay);

/* A pooled batch stages its misses plus up to a quarter of a batch of
 * back-filled rows: the staged rows one batch has room for. */
uint32_t fill_stage_cap(uint32_t batch_size);
/* Where a pooled batch's parts sit in its ring slot: the gather index
 * (count entries) at 0, the admission addresses at *admit_off, then the
 * nstaged staged rows field by field (stage_off[f], may be NULL), each at a
 * FILL_FIELD_ALIGN boundary.  Returns the prefix's size: the bytes that
 * cross PCIe. */
uint64_t fill_stage_layout(const struct dataset *ds, uint32_t count, uint32_t nstaged,
			   uint64_t *admit_off, uint64_t *stage_off);
/* The ring slot stride of a pooled session: the larger of the plain slot
 * and its largest staged prefix. */
uint64_t fill_pooled_stride(const struct dataset *ds, uint32_t batch_size, uint64_t slot_stride);

/* Plans the batch of picks against pool p (pool_plan_batch): writes the
 * gather index and the admission addresses into ring_slot, the staged rows'
 * offsets into stage_off, and returns the bytes of the ring slot that go to
 * the device.  plan->staged[0..plan->nstaged) are the rows to read. */
uint64_t fill_plan(struct pool *p, const struct dataset *ds, const uint64_t *picks, uint32_t count,
		   uint32_t stage_cap, bool ids, uint8_t *ring_slot, struct pool_plan *plan,
		   uint64_t *stage_off);

/* Cuts a batch's rows into reader jobs: main_rows of the batch's own in up
 * to min(readers, FILL_MAX_PARTS) parts of about FILL_PART_BYTES, then the
 * `extra` admit-only rows (back-fill) as a part of their own, so that rows
 * read only for the pool cannot fail the batch.  The jobs borrow the rows:
 * rows[k], or when rows is NULL the picks, copied into scratch (room for
 * main_rows + extra) and, when augmented (picks range over k * N), taken
 * mod N by the readers.  Each job gets samples,
 * wrap, first and count; the caller fills the rest.  Returns the number of
 * jobs (0 when there are no rows) or -ENOMEM, with nothing left allocated. */
int fill_split(struct reader_job **jobs, const struct dataset *ds, const uint64_t *rows,
	       const uint64_t *picks, uint32_t main_rows, uint32_t extra, unsigned readers,
	       uint64_t *scratch, bool augmented);

/* The device assembly of a planned batch whose ring slot prefix (laid out
 * by fill_stage_layout) lands at offset 0 of the transfer thread's staging
 * area: field offsets of the slot and the staged rows, the pool's records,
 * and the record table when the plan uses it. */
void fill_gather(struct gpu_gather *g, const struct pool *p, const struct dataset *ds,
		 const struct pool_plan *plan, const uint64_t *field_offset,
		 const uint64_t *stage_off);

#endif
