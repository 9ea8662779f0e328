/*
 * pfcuda_fake.h — the test hooks of tests/mocks/pfcuda_fake.c, the fake
 * CUDA side of libprefetch (client/pfcuda.h with no GPU).  The library's
 * own calls are pfcuda.h's; these are for the test that plays the trainer
 * (its stream work, its view of the counters) and the fake daemon (legacy
 * IPC handles).
 *
 * What the fake keeps faithful, so that a passing test means something:
 *  - device pointers are host addresses inside live mappings: an FD import
 *    maps the daemon's memfd shared and read-write, so the client sees the
 *    very bytes the fake daemon wrote, and a legacy import opens a memfd the
 *    fake daemon registered (pfcuda_fake_ipc_handle);
 *  - work is asynchronous: copies, gathers, slab table updates and stream
 *    waits are queued per stream and run only when forced (an event query
 *    that finds them before the event, an event sync, a stream or context
 *    sync, pfcuda_gather_sync, pfcuda_fake_stream_sync);
 *  - an operation that reads or writes outside live mappings when it runs
 *    (a slab unmapped under a queued gather, a host arena unregistered under
 *    a queued copy) is counted as a fault and skipped, never dereferenced;
 *  - an address once mapped is never mapped again while the fake lives
 *    (until pfcuda_fake_reset): a stale pointer cannot land in the next
 *    mapping and read its bytes unnoticed.
 *
 * Streams: the trainer's streams are whatever handles the test passes (NULL
 * is the legacy default stream), each a stream of its own; the fake does
 * not model the legacy stream's implicit ordering with blocking streams.
 * Every call here takes the fake's lock, so the fake daemon's thread may
 * call pfcuda_fake_ipc_handle while the trainer's thread runs the client.
 */
#ifndef PF_PFCUDA_FAKE_H
#define PF_PFCUDA_FAKE_H

#include <stddef.h>
#include <stdint.h>

#include "pfcuda.h"

/* What the fake has seen since the last pfcuda_fake_reset. */
struct pfcuda_fake_counts {
	uint64_t launches;	 /* pfcuda_gather_launch kernels (count > 0) */
	uint64_t group_launches; /* pfcuda_gather_launch_group kernels */
	uint64_t group_batches;	 /* batches in those group launches */
	uint64_t group_most;	 /* the most batches one group launch held */
	uint64_t copies;	 /* pfcuda_gather_copy calls (queued) */
	uint64_t copies_run;	 /* of those, run */
	uint64_t gathers_run;	 /* batches gathered (alone or in a group) */
	uint64_t event_queries;
	uint64_t event_syncs;
	uint64_t stream_waits;
	uint64_t syncs;	       /* pfcuda_sync and pfcuda_gather_sync */
	uint64_t unmaps;       /* pfcuda_unmap of a mapped arena or slab */
	uint64_t faults;       /* operations that left live mappings: skipped */
	uint64_t rows_skipped; /* gather rows the kernel skips (no slab, bad index) */
	uint64_t busy_waits;   /* syncs that had to wait out the trainer's busy work */
	int live_maps;	       /* imports, allocations, registrations, staging */
	int live_events;
};

/* Back to the defaults: no event delay, host copies possible, the group
 * kernel present, 80 GiB free of 80 GiB; counters zeroed, trainer streams
 * and their queued work dropped, registered IPC handles closed, reserved
 * addresses given back.  Call it with no client open. */
void pfcuda_fake_reset(void);
void pfcuda_fake_counts(struct pfcuda_fake_counts *out);
/* Every event recorded from now on reports -EAGAIN to this many queries
 * before it may complete. */
void pfcuda_fake_set_event_delay(int queries);
/* Whether pfcuda_can_copy_from_host says yes (client copies offered). */
void pfcuda_fake_set_host_copy(int yes);
/* Whether the module has the group kernel (pfcuda_gather_can_group). */
void pfcuda_fake_set_group(int yes);
/* The next n pfcuda_mem_alloc calls fail with -ENOMEM. */
void pfcuda_fake_fail_next_allocs(int n);
/* What pfcuda_mem_info reports. */
void pfcuda_fake_set_mem(uint64_t free_bytes, uint64_t total_bytes);

/* A legacy IPC handle for memfd fd (the exporter's allocation): the fake
 * keeps a duplicate of fd, so the handle stays valid however the caller's
 * fd fares, until pfcuda_fake_reset.  0 or -errno. */
int pfcuda_fake_ipc_handle(int fd, uint8_t handle[PFCUDA_IPC_HANDLE_BYTES]);

/* ---- the trainer's stream work ----
 * Work the trainer queues on one of its streams (stream as it passes it to
 * pf_next_stream and pf_release, NULL the legacy default stream). */

/* Queues work that does not complete until pfcuda_fake_unbusy(token): the
 * trainer's long kernel.  Returns the token (> 0) or -errno.  A context or
 * gather sync that must get past it waits it out, as the GPU would, and
 * counts a busy_wait; an event sync (libprefetch's release lanes) sleeps
 * until pfcuda_fake_unbusy or such a sync; a query does not wait. */
int pfcuda_fake_busy(void *stream);
void pfcuda_fake_unbusy(int token);
/* Queues the trainer's read of bytes at device address src into dst (its
 * kernel consuming the batch).  0 or -errno. */
int pfcuda_fake_read(void *stream, void *dst, uint64_t src, size_t bytes);
/* Runs stream's queued work (and what it waits for) as far as it can
 * without waiting out busy work: 0 when all of it ran, -EAGAIN when busy
 * work holds it. */
int pfcuda_fake_stream_sync(void *stream);
/* Operations queued on every stream and not run yet. */
int pfcuda_fake_pending(void);
/* The slot addresses of the batches gathered so far, in the order their
 * gathers were queued on the gather stream: up to max into out; returns
 * how many there are. */
int pfcuda_fake_gather_slots(uint64_t *out, int max);

#endif
