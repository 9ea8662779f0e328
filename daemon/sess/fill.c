/*
 * fill.c — batch layout and splitting (see fill.h).
 *
 * DESIGN: pure functions of a dataset's fields, a batch's size and a pool's
 * geometry; loop thread only because their callers are.  Allocation is
 * limited to the layout's offsets and the reader jobs, both owned by the
 * caller afterwards.
 */
#include "sess/fill.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "data/dataset.h"
#include "gpu/pool.h"
#include "data/reader.h"
#include "util.h"

int fill_layout(struct slot_layout *lay, const struct dataset *ds, uint32_t batch_size, char *err,
		size_t errlen)
{
	uint64_t off = 0, field;

	lay->field_offset = calloc(ds->nfields ? ds->nfields : 1, sizeof(*lay->field_offset));
	if (!lay->field_offset)
		return -ENOMEM;
	for (size_t f = 0; f < ds->nfields; f++) {
		off = align_up(off, FILL_FIELD_ALIGN);
		lay->field_offset[f] = off;
		/* Sizes come from a file and a client: checked, never wrapped. */
		if (__builtin_mul_overflow(ds->fields[f].sample_bytes, (uint64_t)batch_size,
					   &field) ||
		    field > FILL_MAX_SLOT || off + field > FILL_MAX_SLOT) {
			set_err(err, errlen,
				"a batch of %u samples of %llu bytes (field %s) is more than a "
				"slot "
				"may hold (%llu TiB)",
				batch_size, (unsigned long long)ds->fields[f].sample_bytes,
				ds->fields[f].name, FILL_MAX_SLOT >> 40);
			fill_layout_free(lay);
			return -E2BIG;
		}
		off += field;
	}
	lay->slot_bytes = off;
	/* A dataset of empty samples still gets slots that take room. */
	lay->slot_stride = align_up(off ? off : 1, FILL_SLOT_ALIGN);
	return 0;
}

void fill_layout_free(struct slot_layout *lay)
{
	free(lay->field_offset);
	lay->field_offset = NULL;
}

uint32_t fill_stage_cap(uint32_t batch_size)
{
	return batch_size + (batch_size + 3) / 4;
}

uint64_t fill_stage_layout(const struct dataset *ds, uint32_t count, uint32_t nstaged,
			   uint64_t *admit_off, uint64_t *stage_off)
{
	uint64_t off = (uint64_t)count * sizeof(uint64_t);

	*admit_off = align_up(off, FILL_FIELD_ALIGN);
	off = *admit_off + (uint64_t)nstaged * sizeof(uint64_t);
	for (size_t f = 0; f < ds->nfields; f++) {
		off = align_up(off, FILL_FIELD_ALIGN);
		if (stage_off)
			stage_off[f] = off;
		off += ds->fields[f].sample_bytes * nstaged;
	}
	return off;
}

uint64_t fill_pooled_stride(const struct dataset *ds, uint32_t batch_size, uint64_t slot_stride)
{
	uint64_t admit_off;
	uint64_t most = align_up(
		fill_stage_layout(ds, batch_size, fill_stage_cap(batch_size), &admit_off, NULL),
		FILL_SLOT_ALIGN);

	return most > slot_stride ? most : slot_stride;
}

uint64_t fill_plan(struct pool *p, const struct dataset *ds, const uint64_t *picks, uint32_t count,
		   uint32_t stage_cap, bool ids, uint8_t *ring_slot, struct pool_plan *plan,
		   uint64_t *stage_off)
{
	uint64_t admit_off;

	fill_stage_layout(ds, count, 0, &admit_off, NULL);
	pool_plan_batch(p, picks, count, stage_cap - count, ids, plan, (uint64_t *)ring_slot,
			(uint64_t *)(ring_slot + admit_off));
	return fill_stage_layout(ds, count, plan->nstaged, &admit_off, stage_off);
}

int fill_split(struct reader_job **jobs, const struct dataset *ds, const uint64_t *rows,
	       const uint64_t *picks, uint32_t main_rows, uint32_t extra, unsigned readers,
	       uint64_t *scratch, bool augmented)
{
	uint32_t parts, nparts;
	uint64_t *base = (uint64_t *)rows, wrap = 0;

	parts = (uint32_t)(((uint64_t)main_rows * ds->sample_bytes + FILL_PART_BYTES - 1) /
			   FILL_PART_BYTES);
	if (parts > readers)
		parts = readers;
	if (parts > FILL_MAX_PARTS)
		parts = FILL_MAX_PARTS;
	if (parts > main_rows)
		parts = main_rows;
	nparts = parts + (extra ? 1 : 0);
	if (!rows && nparts) {
		/* One plain copy on this thread, no per-row work (4M rows of
		 * a byte each are 32 MiB of picks): the picks of an
		 * augmented share wrap to their sample on the readers, and
		 * only those (a pick of any other is its sample). */
		memcpy(scratch, picks, sizeof(uint64_t) * ((uint64_t)main_rows + extra));
		base = scratch;
		wrap = augmented ? ds->num_samples : 0;
	}
	for (uint32_t p = 0; p < nparts; p++) {
		uint32_t first =
			p < parts ? (uint32_t)((uint64_t)main_rows * p / parts) : main_rows;
		uint32_t n = p < parts ? (uint32_t)((uint64_t)main_rows * (p + 1) / parts) - first
				       : extra;

		jobs[p] = calloc(1, sizeof(*jobs[p]));
		if (!jobs[p]) {
			while (p--)
				free(jobs[p]);
			return -ENOMEM;
		}
		jobs[p]->samples = base + first;
		jobs[p]->wrap = wrap;
		jobs[p]->first = first;
		jobs[p]->count = n;
	}
	return (int)nparts;
}

void fill_gather(struct gpu_gather *g, const struct pool *p, const struct dataset *ds,
		 const struct pool_plan *plan, const uint64_t *field_offset,
		 const uint64_t *stage_off)
{
	uint64_t admit_off;

	fill_stage_layout(ds, plan->count, plan->nstaged, &admit_off, NULL);
	memset(g, 0, sizeof(*g));
	g->count = plan->count;
	g->nstaged = plan->nstaged;
	g->desc = 0;
	g->admit = admit_off;
	g->staged = 0;
	g->nfields = p->nfields;
	if (plan->table) {
		g->table = p->table.base;
		g->table_n = ds->num_samples;
	}
	for (uint32_t f = 0; f < p->nfields; f++) {
		g->slot_off[f] = field_offset[f];
		g->staged_off[f] = stage_off[f];
		g->rec_off[f] = p->rec_off[f];
		g->row_bytes[f] = p->row_bytes[f];
	}
}
