/*
 * direct.h — `read = direct`: rows read with O_DIRECT, for datasets the page
 * cache cannot hold.
 *
 * A batch's rows are sorted by file offset, each widened to whole aligned
 * blocks (DIRECT_ALIGN), and rows whose blocks touch or lie within
 * DIRECT_GAP of each other are read as one run, up to DIRECT_RUN_MAX bytes.
 * A sequential or block-shuffled batch becomes a few large reads, a
 * shuffled one a read per row.  The runs of a batch go to the device
 * together: through io_uring (DIRECT_QD in flight per reader thread) where
 * the kernel allows it, otherwise (containers often forbid io_uring, and
 * PREFETCHD_NO_IO_URING=1 forces it) one pread per run, so that only the
 * reader threads' count is in flight.  The rows are then copied from the
 * aligned bounce buffer into the slot.  Nothing goes through the page
 * cache, so reading a dataset larger than memory evicts nobody's pages.
 *
 * DESIGN: reader threads only, each with its own ring and bounce buffer
 * (thread-local, freed when the thread ends); the shards' O_DIRECT
 * descriptors are read-only after load and shared.
 */
#ifndef PF_DIRECT_H
#define PF_DIRECT_H

#include <stddef.h>
#include <stdint.h>

struct ds_field;

/* O_DIRECT's alignment of offsets, lengths and buffers: 4096 covers every
 * logical block size in use (512 and 4096). */
#define DIRECT_ALIGN 4096u
/* Blocks this close are read through rather than apart: one IO of up to
 * 64 KiB more costs less than a second IO on the devices we measured
 * (random 4 KiB reads ~37,000/s, sequential 1.3 GB/s: ~35 KiB a read). */
#define DIRECT_GAP     (32u << 10)
#define DIRECT_RUN_MAX (4u << 20)
#define DIRECT_QD      64u

/* Reads field's rows samples[0..n) (rows of the field, in range) into dst,
 * row i at dst + i * sample_bytes, through the shards' direct descriptors.
 * 0, or -errno with err naming the file and row. */
int direct_read_field(const struct ds_field *field, const uint64_t *samples, size_t n, uint8_t *dst,
		      char *err, size_t errlen);
/* Whether this thread's reads go through io_uring (after its first read). */
int direct_uses_io_uring(void);

#endif
