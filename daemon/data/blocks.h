/*
 * blocks.h — the block cache of a block-shuffled epoch read with
 * `read = direct`: each block of consecutive samples is read once, whole,
 * and the epoch's rows are served from it.
 *
 * A block_shuffle epoch (docs/SHUFFLE.md) delivers the rows of a window of
 * W blocks of B samples, shuffled among themselves, before the next
 * window's.  Read row by row with O_DIRECT that is a random read per row,
 * whatever the order; read a block at a time it is one sequential read of
 * B rows, at the disk's bandwidth.  So the first reader that needs a row of
 * block j reads the whole block (every field, O_DIRECT, direct.h), others
 * that need it meanwhile wait for that read, and every row comes out of
 * memory.  Each block counts the rows the epoch still takes from it (this
 * rank's picks from start_batch on); at zero its memory goes.  Blocks are
 * used within their window, so the cache holds about the blocks of the
 * windows that batches in flight read: two windows, W·B samples each.
 *
 * DESIGN: built on the loop thread at the epoch's start, then shared by the
 * reader threads that fill its batches; its own mutex guards the block
 * states (never held across a read), and a reference count (the session's
 * and one per reader job) frees it after the last job that uses it.
 */
#ifndef PF_BLOCKS_H
#define PF_BLOCKS_H

#include <stddef.h>
#include <stdint.h>

struct dataset;
struct blocks;

/* Fields a cached dataset may have (the block layout's offsets). */
#define BLOCKS_MAX_FIELDS 8

/* A cache for ds in blocks of block_rows samples, the rows the epoch takes
 * from each given by uses[ceil(N / block_rows)] (taken over).  NULL when
 * out of memory. */
struct blocks *blocks_new(const struct dataset *ds, uint64_t block_rows, uint32_t *uses);
struct blocks *blocks_ref(struct blocks *b);
void blocks_put(struct blocks *b);
/* Reads samples[0..n) (sample numbers < N) of every field into the slot: row
 * i of field f at dst + field_offset[f] + (first + i) * the field's
 * sample_bytes (a reader job's part of its batch).
 * 0, or -errno with err (a block that could not be read fails every batch
 * that needs it, with the same message). */
int blocks_read(struct blocks *b, const uint64_t *samples, size_t n, uint8_t *dst,
		const uint64_t *field_offset, uint32_t first, char *err, size_t errlen);
/* A batch of these picks will not be read through the cache (it became an
 * error batch before its read, or the pool serves it): its rows are counted
 * off their blocks. */
void blocks_skip(struct blocks *b, const uint64_t *picks, size_t n);
/* Figures for status and tests: blocks read from disk, bytes held now, the
 * most held at once. */
void blocks_stats(struct blocks *b, uint64_t *loads, uint64_t *held, uint64_t *peak);

#endif
