/*
 * xfer.h — one transfer thread per GPU in use: it owns that GPU's copy
 * stream, the completion events, and every blocking CUDA call the daemon
 * makes for its sessions (arena allocation and release).
 *
 * Jobs come from the loop thread and go back to it when they are done:
 *   XFER_COPY   host ring slot -> device slot on the stream; done only once
 *               the copy's event has completed, so the loop may announce
 *               the batch and give the ring slot to another read.  With
 *               `gather` set (a batch planned against the VRAM pool,
 *               pool.h) the ring slot's prefix goes to the thread's staging
 *               area instead and the gather kernel assembles the slot from
 *               it and from pool records;
 *   XFER_ALLOC  device memory (gpu_mem_alloc), exported as asked: a
 *               session's arena, a pool slab, a record table;
 *   XFER_MEMINFO the device's free and total memory (gpu_mem_info), read
 *               after every free submitted before it has run: the daemon's
 *               own probe for lingering pools (linger.c).
 * Memory an XFER_ALLOC made is given back with xfer_free_mem, which cannot
 * fail: the job that frees it was allocated along with it.
 * Copies are pipelined: the thread queues every copy it has, records an
 * event after each, and retires them oldest first as their events complete
 * (polled, never blocking: a new copy is queued the moment it arrives).  A copy's event is recorded
 * after the copy from its ring slot, so "done" means the ring slot may be rewritten.
 *
 * DESIGN: threads: the loop thread submits (a mutex-protected queue) and
 * receives (a handback, handback.h); the transfer thread makes every CUDA
 * call for its device.  Locks: x->lock guards the pending queue and the
 * stop flag; the handback has its own.  Nothing else is shared: a job
 * borrows memory (a ring slot, a device slot) that its session keeps alive
 * until the job is back.
 */
#ifndef PF_XFER_H
#define PF_XFER_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "gpu/gpu.h"
#include "util.h"

/* XFER_FREE is xfer.c's own: the loop asks with xfer_free_mem. */
enum xfer_kind { XFER_COPY, XFER_ALLOC, XFER_FREE, XFER_MEMINFO };

struct xfer_job {
	struct fifo_node link; /* of whichever queue holds the job */
	enum xfer_kind kind;
	void *owner; /* borrowed: the session, alive until the job is back */
	uint32_t slot;
	uint64_t epoch, seq;
	/* XFER_COPY */
	const void *src; /* borrowed: the ring slot */
	uint64_t dst;	 /* device address */
	uint64_t bytes;
	uint64_t copy_ns; /* queued -> event completed */
	/* XFER_COPY with gather: g.slot is ignored (dst is the slot); g.desc,
	 * g.admit and g.staged are offsets into the bytes copied, which land
	 * in the thread's staging area.  One staging area per GPU suffices:
	 * its stream runs the copy into it after the previous gather. */
	bool gather;
	struct gpu_gather g;
	/* XFER_COPY of a batch its client gathers (gather set too): the bytes
	 * go to dst, the tail of the batch's own device slot, where the
	 * client's kernel reads the index and the staged rows; g.desc,
	 * g.admit and g.staged are offsets from dst.  The daemon only admits:
	 * when `admits`, it runs the kernel over the staged rows alone, into
	 * their pool records (never in steady state: a full pool admits
	 * nothing). */
	bool client_gather;
	bool admits;
	/* XFER_MEMINFO: out. */
	uint64_t free_bytes, total_bytes;
	/* XFER_ALLOC: bytes and ipc in, mem out.  XFER_FREE: mem in. */
	enum gpu_ipc ipc;
	struct gpu_mem mem;
	bool inject_enomem; /* test hook: fail as a full device would */
	/* Runs instead of xfer_start's done for this job (NULL: that one). */
	void (*done)(struct xfer_job *job);
	int rc; /* 0 or -errno */
	char err[200];
	/* private to the transfer thread */
	struct gpu_event *event;
	uint64_t queued_ns;
};

struct xfer;

typedef void (*xfer_done_fn)(struct xfer_job *job, void *arg);

/* Starts the transfer thread of device dev: its stream is created before
 * this returns.  done runs on the loop thread for every job submitted. */
int xfer_start(struct xfer **out, int dev, uv_loop_t *loop, xfer_done_fn done, void *arg, char *err,
	       size_t errlen);
void xfer_submit(struct xfer *x, struct xfer_job *job);
/* Gives back device memory that an XFER_ALLOC of x made (mem is then
 * zeroed; a zeroed mem is a no-op).  It is released on the transfer thread
 * after every job submitted before this call has been queued on the
 * stream, so a copy or gather queued earlier that reads it still runs
 * first (cudaFree waits for them).  Never blocks and never fails, so the
 * loop thread can always let go of memory. */
void xfer_free_mem(struct xfer *x, struct gpu_mem *mem);
/* Finishes everything queued (copies included), joins the thread, delivers
 * the last completions, destroys the stream.  Frees asked for afterwards
 * (by sessions that end during the shutdown) run on the caller; other jobs
 * come back at once with -ECANCELED. */
void xfer_stop(struct xfer *x);
/* Frees x once the loop has stopped (its async handle is closed). */
void xfer_free(struct xfer *x);

#endif
