/*
 * daemon/gpu/ — the GPU side: every CUDA call, behind this header (gpu.c,
 * gpu_none.c, the tests' gpu_fake.c); the gather kernel (gather.cu); one
 * transfer thread per GPU that makes the copies, gathers, allocations and
 * frees (xfer.c); and the VRAM sample pool, whose index the loop thread
 * keeps (pool.c, pool_plan.c).  Calls base/ and data/.
 *
 * gpu.h — the daemon's only window onto CUDA: devices, the pinned reader
 * ring's registration, one copy stream per GPU, completion events and
 * device memory (struct gpu_mem): the session arenas exported to clients,
 * and the daemon's own pool slabs, record tables and staging areas.
 *
 * Three interchangeable back ends implement it, chosen at link time:
 *   gpu.c       the real one (CUDA=1): runtime linked statically, driver
 *               entry points fetched at run time, so no link-time libcuda;
 *   gpu_none.c  CUDA=0 builds: every call fails with -ENODEV;
 *   gpu_fake.c  the unit tests' (tests/mocks/): host memory stands in for
 *               VRAM, plus the test hooks at the end of this header.
 *
 * Every function returns 0 (or a count) or -errno: -ENOMEM when the device is
 * out of memory, -ENODEV when there is no usable device (or gpu_init has not
 * succeeded), -EOPNOTSUPP when the driver or device lacks a feature (e.g. FD
 * export without VMM), -EAGAIN from gpu_event_query while work is pending,
 * -EIO for any other CUDA failure.  The CUDA error has then been logged once.
 *
 * DESIGN: gpu_init runs once on the main thread before any other thread
 * starts; afterwards the back end's global state is read-only.  Any thread
 * may call the rest: each call that touches a device first makes that device
 * current on the calling thread.  A stream or event is used by one thread at
 * a time (its transfer thread).  Device memory may be allocated and freed
 * from any thread, but the calls block on the device, so the daemon makes
 * them on its transfer threads (xfer.h), never on the loop thread.
 */
#ifndef PF_GPU_H
#define PF_GPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gather.h"

#define GPU_IPC_HANDLE_BYTES 64
/* Allocation sizes are rounded up to this (and to the allocation granularity):
 * the VMM granularity on current GPUs, and large enough that a legacy
 * cudaMalloc is an allocation of its own, never a sub-allocation. */
#define GPU_MEM_ALIGN (2u << 20)

enum gpu_ipc {
	GPU_IPC_FD,	/* cuMemCreate + POSIX fd export (VMM) */
	GPU_IPC_LEGACY, /* cudaMalloc + cudaIpcGetMemHandle */
	GPU_IPC_NONE,	/* cudaMalloc, not exported: the daemon's own memory
			 * (VRAM pool slabs, the gather staging area) */
};

struct gpu_stream; /* one device's non-blocking copy stream */
struct gpu_event;  /* a completion marker on a stream */

/* One device allocation, exported to clients (a session's arena) or not (the
 * daemon's own memory, GPU_IPC_NONE).  Filled by gpu_mem_alloc. */
struct gpu_mem {
	int dev;
	uint64_t bytes; /* rounded size: >= the size asked for */
	enum gpu_ipc kind;
	uint64_t base; /* device pointer of byte 0, in the daemon's context */
	/* GPU_IPC_FD: the exported POSIX fd, owned by this struct.  The session
	 * sends it over SCM_RIGHTS, then may close it and set -1; otherwise
	 * gpu_mem_free closes it.  -1 for GPU_IPC_LEGACY. */
	int export_fd;
	/* GPU_IPC_LEGACY: cudaIpcMemHandle_t of base, sent as bytes. */
	uint8_t legacy_handle[GPU_IPC_HANDLE_BYTES];
	uint64_t handle; /* private to the back end */
	/* The transfer thread's job that will free this memory, allocated
	 * with it (xfer.c; NULL for memory allocated elsewhere).  Opaque here:
	 * gpu_mem_alloc and gpu_mem_free zero it with the rest. */
	void *release;
};

/* Initialises CUDA and counts devices.  Returns the device count (> 0) or
 * -errno; desc always receives a one-line human description, e.g.
 * "2 CUDA devices, driver 13.0" or "no CUDA driver: ...".  Safe to call on a
 * machine with no GPU and no driver; when it fails, no other call touches
 * CUDA and each returns -ENODEV. */
int gpu_init(char *desc, size_t len);
/* Devices found by gpu_init; 0 before it or when it failed. */
int gpu_device_count(void);
/* The device's product name ("NVIDIA H200"), for status. */
int gpu_device_name(int dev, char *buf, size_t len);
/* The device's PCI bus id ("0000:3b:00.0"), and the reverse look-up (device
 * ordinal or -ENODEV).  A client names its GPU by bus id because its
 * CUDA_VISIBLE_DEVICES, and so its ordinals, may differ from the daemon's. */
int gpu_device_pci_bus_id(int dev, char *buf, size_t len);
int gpu_device_by_pci_bus_id(const char *bus_id);
/* Free and total device memory as the driver sees it now. */
int gpu_mem_info(int dev, uint64_t *free_bytes, uint64_t *total_bytes);

/* Page-locks a host range for all devices (portable).  The reader ring does
 * this once at start; -EEXIST if the range is already registered. */
int gpu_host_register(void *p, size_t bytes);
/* -ENOENT if p was not registered. */
int gpu_host_unregister(void *p);

int gpu_stream_create(int dev, struct gpu_stream **out);
/* Waits for the stream's queued work, then destroys it.  NULL is a no-op. */
void gpu_stream_destroy(struct gpu_stream *s);
/* Blocks until everything queued on s has finished. */
int gpu_stream_sync(struct gpu_stream *s);

/* Queues an async copy of bytes from host src (pinned for full speed) to
 * device address dst on s.  src must stay untouched until an event recorded
 * after the copy has completed. */
int gpu_copy_h2d(struct gpu_stream *s, uint64_t dst, const void *src, size_t bytes);
/* Queues a device-to-device copy on s (both addresses on s's device). */
int gpu_copy_d2d(struct gpu_stream *s, uint64_t dst, uint64_t src, size_t bytes);

/* ---- batch assembly from the VRAM pool (gather.cu) ---- */

/* struct gpu_gather, the kernel's parameter block: proto/gather.h, shared
 * with libprefetch, which launches the same kernel in the trainer. */

/* Queues the assembly of one batch on s, ordered after everything queued
 * before (so desc, admit and the staged rows may come from an H2D copy
 * queued just before it): row i of the slot is copied from desc[i]'s
 * source, and each staged row with a nonzero admit entry is copied into
 * that record.  Rows and admissions run concurrently, in no order: the
 * destinations of one call must not overlap each other, nor any record a
 * row of the same call reads (so a hit's record cannot be re-admitted into
 * by the batch that reads it).  Runs our own kernel (gather.cu). */
int gpu_gather(struct gpu_stream *s, const struct gpu_gather *g);

/* Events have timing disabled and block (rather than spin) in
 * gpu_event_sync, so a waiting transfer thread does not burn a core. */
int gpu_event_create(int dev, struct gpu_event **out);
/* Marks the point on s after everything queued so far.  e and s must be on
 * the same device.  Re-recording an event moves its mark. */
int gpu_event_record(struct gpu_event *e, struct gpu_stream *s);
/* 0 when the work before the mark has completed (or e was never
 * recorded), -EAGAIN while it is pending, another -errno on failure. */
int gpu_event_query(struct gpu_event *e);
int gpu_event_sync(struct gpu_event *e);
/* NULL is a no-op. */
void gpu_event_destroy(struct gpu_event *e);

/* Allocates at least bytes of device memory on dev, exportable as kind.
 * The size is rounded up to the allocation granularity and GPU_MEM_ALIGN.
 * On failure *out is left with export_fd -1 and base 0, and nothing leaks. */
int gpu_mem_alloc(int dev, uint64_t bytes, enum gpu_ipc kind, struct gpu_mem *out);
/* Unmaps and releases a.  The physical memory lives on while a client still
 * maps it (the driver refcounts it); a is zeroed (export_fd -1).  Calling it
 * on a zeroed or failed allocation is a no-op. */
void gpu_mem_free(struct gpu_mem *a);

/* test hooks (gpu_fake.c only) */

/* Restores the defaults: 1 device, 80 GiB free of 80 GiB per device, no
 * failures armed, events complete at once; gpu_init must be called again.
 * Live allocations, streams and events are kept.
 * Copies are asynchronous, as on a GPU: a queued copy runs only when an
 * event recorded after it completes, its stream is synchronised or
 * destroyed, or memory is freed.  A copy outside every live allocation of its
 * device fails with -EFAULT. */
void gpu_fake_reset(void);
/* Number of devices gpu_init will report (0: it fails with -ENODEV). */
void gpu_fake_set_devices(int n);
/* The next n device allocations fail with -ENOMEM (later ones succeed). */
void gpu_fake_fail_next_allocs(int n);
/* What gpu_mem_info reports on every device from now on.  Each allocation
 * made afterwards is taken out of free (and given back when freed); an
 * allocation larger than the free figure fails with -ENOMEM. */
void gpu_fake_set_mem(uint64_t free_bytes, uint64_t total_bytes);
/* A recorded event reports -EAGAIN for this many queries before it
 * completes (gpu_event_sync completes it at once). */
void gpu_fake_set_event_delay(int queries);
/* While held, gpu_event_query says every event is still pending (copies
 * stay in flight, holding what they read); gpu_event_sync still waits
 * them out. */
void gpu_fake_hold_events(bool hold);
/* Device allocations made and not yet freed, on all devices. */
int gpu_fake_live_allocs(void);
/* Gather kernels the fake GPU has run (compare two readings). */
int gpu_fake_gathers_run(void);
/* Host ranges currently registered with gpu_host_register. */
int gpu_fake_host_registrations(void);

#endif
