/*
 * streamcopy.h — copies whose next reader is a copy engine, not a CPU.
 *
 * A reader thread writes every batch of a CUDA session into a slot of the
 * pinned ring or of a client's host arena, and the next thing to read those
 * bytes is a DMA engine (the daemon's copy or gather, the client's copy).  With
 * ordinary stores, every cache line of the slot that is no longer cached is
 * first read from memory (the store's read for ownership) and then fills
 * the shared L3, evicting the trainer's own lines.  Run 66 of
 * bench/NOTES.md measured the first cost: the readers' CPU per GB rose
 * 1.65x once the slots filled ahead no longer fit the L3.  Non-temporal
 * (streaming) stores write whole lines to memory through the
 * write-combining buffers: no read, no eviction.  They win only where the
 * lines would not have stayed cached: where they would, the DMA reads them
 * from the L3 and plain stores are 10-20% faster (run 34, one session's
 * ring slots).  So the session layer streams only client-copy slots, and
 * only while the sessions fill more ahead than fill_bytes
 * (sess_fill_shares).  Measured (runs 70-71, one H100 machine): 16 pool-off
 * trainers got 37.1-38.9 GB/s against 33.3-35.5 with plain stores, the
 * readers 0.244-0.252 CPU-s per GB against 0.267-0.277; 4 trainers, no
 * difference beyond noise.
 *
 * copy_streamed is memcpy with streaming stores for the bulk on x86-64
 * (SSE2, which every x86-64 has), and plain memcpy elsewhere or below a few
 * lines.  Streaming stores are weakly ordered: the copying thread calls
 * copy_streamed_fence before anything tells another thread (or a DMA
 * engine) that the bytes are there.
 *
 * PREFETCHD_CACHED_FILLS=1 in the daemon's environment turns streaming off
 * (bench comparisons): copy_streaming says whether the session layer may
 * ask for it, which it decides once per change of sessions, not per copy.
 *
 * DESIGN: no state but a flag read once (pthread_once); any thread.
 */
#ifndef PF_STREAMCOPY_H
#define PF_STREAMCOPY_H

#include <stdbool.h>
#include <stddef.h>

/* memcpy(dst, src, n), with streaming stores for the bulk (x86-64). */
void copy_streamed(void *dst, const void *src, size_t n);
/* Orders the calling thread's streaming stores before its later stores. */
void copy_streamed_fence(void);
/* False when PREFETCHD_CACHED_FILLS is set (not "0") or the machine has no
 * streaming stores (copy_streamed is memcpy there). */
bool copy_streaming(void);

#endif
