/*
 * Big transient buffers on the loop thread: a BatchReady of a 4M-sample
 * batch is a 32 MiB frame, and a batch's sample numbers another 32 MiB.
 * From malloc each would be a fresh mapping whose first touch takes a page
 * fault per 4 KiB (tens of ms on the loop, every batch, more under a memory
 * cgroup).  These come in transparent huge pages where the kernel allows
 * (madvise mode), and a freed one is kept for the next of its size, up to
 * BIGMEM_CACHE bytes for at most two ticks: a stream of big batches reuses
 * memory that is already there.  Smaller buffers are plain malloc.
 *
 * A huge page is not always cheap to fault in: in a VM whose balloon
 * reports free 2 MiB blocks back to the host (free page reporting), every
 * new huge page is also a fault on the host, 3 to 6 ms each, so the first
 * touch of a fresh 32 MiB buffer held the loop 60 to 180 ms.  Buffers the
 * loop will fill can be made present beforehand on libuv's thread pool
 * (big_prefault).
 *
 * Loop thread only (the cache is not locked), but for big_prefault.
 */
#ifndef PREFETCHD_BIGMEM_H
#define PREFETCHD_BIGMEM_H

#include <stddef.h>

/* From this size on a buffer is its own huge-page mapping. */
#define BIGMEM_MIN ((size_t)2 << 20)
/* Freed buffers kept for reuse, in all. */
#define BIGMEM_CACHE ((size_t)128 << 20)

/* n bytes, not zeroed; NULL when out of memory. */
void *big_alloc(size_t n);
/* The memory big_alloc(n) holds: n, in whole huge pages from BIGMEM_MIN
 * on.  What a quota counts for the buffer: a 2 MiB + 1 byte frame maps
 * 4 MiB. */
size_t big_size(size_t n);
/* Frees what big_alloc(n) gave, with the same n.  NULL is a no-op. */
void big_free(void *p, size_t n);
/* Any thread: makes the n bytes at p (from big_alloc) present and
 * writable, their content kept (MADV_POPULATE_WRITE), so that the next
 * write to them takes no page fault.  Nothing where the kernel cannot
 * (before Linux 5.14) or n is below BIGMEM_MIN. */
void big_prefault(void *p, size_t n);
/* Housekeeping (the daemon's tick): what was kept and not reused since the
 * last call goes back to the system; all of it when all is true. */
void big_trim(int all);

#endif
