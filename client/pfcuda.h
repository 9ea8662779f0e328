/*
 * pfcuda.h — libprefetch's CUDA side (internal, not installed): opens the
 * device arenas the daemon exports, in the device's primary context (the
 * one PyTorch and the CUDA runtime use, so the pointers are valid there),
 * records and polls the release events on the trainer's stream, and reads
 * free device memory for the governor's honest probe.
 *
 * libcuda.so.1 is loaded with dlopen on the first pfcuda_open, so a program
 * that only opens host sessions needs no CUDA at all, and libprefetch has no
 * link-time CUDA dependency.  Builds without the toolkit (PF_CUDA=0) keep
 * the same functions; they fail with -ENOSYS.
 *
 * Every function returns 0 or -errno (-ENODEV: no driver or device,
 * -ENOMEM: device memory, -EOPNOTSUPP: the driver or device cannot do it,
 * -EIO: any other CUDA failure) and then writes a one-line reason into
 * msg[msglen] (msg may be NULL).  Nothing here aborts.
 *
 * (Named pfcuda.h, not cuda.h: with -Iclient on the include path a
 * client/cuda.h would shadow the toolkit's <cuda.h> in every file.)
 *
 * DESIGN: no threads of its own.  The driver is loaded once per process
 * under pthread_once; after that its function table is read-only.  A
 * struct pfcuda_dev and the arenas and events made from it belong to one
 * pf_client, used from one thread at a time.  Each call pushes the primary
 * context for its duration and pops it again, so the caller's current
 * context (PyTorch's current device) is never changed.
 */
#ifndef PF_CLIENT_CUDA_H
#define PF_CLIENT_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PFCUDA_IPC_HANDLE_BYTES 64

enum pfcuda_kind {
	PFCUDA_ARENA_FD,     /* imported from a cuMemCreate POSIX fd */
	PFCUDA_ARENA_LEGACY, /* opened from a cudaIpcMemHandle_t */
};

/* One device's retained primary context. */
struct pfcuda_dev;

/* One imported arena.  base is a device pointer valid in every context of
 * this process that uses the primary context of the arena's device. */
struct pfcuda_arena {
	enum pfcuda_kind kind;
	uint64_t base; /* 0 when not mapped */
	uint64_t bytes;
};

/* Loads the driver if needed and retains device ordinal's primary context
 * (ordinals as the CUDA runtime numbers them, CUDA_VISIBLE_DEVICES
 * applied). */
int pfcuda_open(int ordinal, struct pfcuda_dev **out, char *msg, size_t msglen);
/* Releases the primary context.  Unmap every arena and destroy every event
 * of d first.  NULL is a no-op. */
void pfcuda_close(struct pfcuda_dev *d);
int pfcuda_ordinal(const struct pfcuda_dev *d);
/* The device's PCI bus id ("0000:3b:00.0"): unlike an ordinal it names the
 * same GPU in the daemon, whose CUDA_VISIBLE_DEVICES may differ. */
int pfcuda_pci_bus_id(struct pfcuda_dev *d, char *buf, size_t len, char *msg, size_t msglen);

/* Maps an FD arena of bytes (the daemon's rounded size, a multiple of the
 * allocation granularity) read-write for d's device.  Always consumes fd:
 * it is closed on success and on failure alike. */
int pfcuda_import_fd(struct pfcuda_dev *d, int fd, uint64_t bytes, struct pfcuda_arena *out,
		     char *msg, size_t msglen);
/* Opens a legacy IPC arena from the daemon's 64-byte handle. */
int pfcuda_import_legacy(struct pfcuda_dev *d, const uint8_t handle[PFCUDA_IPC_HANDLE_BYTES],
			 uint64_t bytes, struct pfcuda_arena *out, char *msg, size_t msglen);
/* Unmaps an arena of either kind; a is zeroed.  The caller must know that
 * no queued GPU work still reads it (its release events have completed).
 * A zeroed arena is a no-op. */
int pfcuda_unmap(struct pfcuda_dev *d, struct pfcuda_arena *a, char *msg, size_t msglen);

/* Release events: *ev receives a CUevent with timing disabled. */
int pfcuda_event_create(struct pfcuda_dev *d, void **ev, char *msg, size_t msglen);
/* Records ev on stream, a CUstream / cudaStream_t of d's device in the
 * primary context; NULL means the legacy default stream. */
int pfcuda_event_record(struct pfcuda_dev *d, void *ev, void *stream, char *msg, size_t msglen);
/* 0 when the work before the record has completed, -EAGAIN while pending.
 * Never blocks. */
int pfcuda_event_query(struct pfcuda_dev *d, void *ev, char *msg, size_t msglen);
/* Waits on the CPU, asleep (the events are made with blocking sync),
 * until the work before the record has completed.  Any thread may wait. */
int pfcuda_event_sync(struct pfcuda_dev *d, void *ev, char *msg, size_t msglen);
/* NULL is a no-op. */
void pfcuda_event_destroy(struct pfcuda_dev *d, void *ev);

/* Waits for all work queued in d's primary context (pf_close, before it
 * unmaps arenas that queued work might still read). */
int pfcuda_sync(struct pfcuda_dev *d, char *msg, size_t msglen);
/* Free and total memory of d's device now (cuMemGetInfo): the honest probe. */
int pfcuda_mem_info(struct pfcuda_dev *d, uint64_t *free_bytes, uint64_t *total_bytes, char *msg,
		    size_t msglen);
/* Synchronous device-to-host copy, for tests and tools. */
int pfcuda_copy_dtoh(struct pfcuda_dev *d, void *dst, uint64_t src, size_t bytes, char *msg,
		     size_t msglen);

/* Plain device memory in d's primary context (cuMemAlloc), for tests that
 * must fill the GPU to see the honest probe react.  pfcuda_mem_free of 0
 * is a no-op; it returns 0 or -errno without a message. */
int pfcuda_mem_alloc(struct pfcuda_dev *d, uint64_t bytes, uint64_t *devptr, char *msg,
		     size_t msglen);
int pfcuda_mem_free(struct pfcuda_dev *d, uint64_t devptr);

/* ---- the client's gather ----
 * Pool hits are assembled in the trainer's own context (docs/DESIGN.md,
 * "The VRAM pool": no SM work in the daemon's context on a trainer's GPU):
 * the kernel of
 * daemon/gpu/gather.cu in entry mode, from a module embedded in the library,
 * on a non-blocking stream of its own.  The trainer's stream waits on the
 * event each launch records (pfcuda_stream_wait), so the CPU never blocks. */
struct gpu_gather;
struct pfcuda_gather;
/* Loads the module and makes the stream.  -EOPNOTSUPP when the driver
 * lacks an entry point (the daemon then gathers for this client). */
int pfcuda_gather_open(struct pfcuda_dev *d, struct pfcuda_gather **out, char *msg, size_t msglen);
/* Waits for the stream's work, then frees everything.  NULL is a no-op. */
void pfcuda_gather_close(struct pfcuda_gather *g);
/* Blocks, asleep, until every queued gather has finished. */
int pfcuda_gather_sync(struct pfcuda_gather *g, char *msg, size_t msglen);
/* Slab `slab` is mapped at base (0: no longer): later launches see it.
 * Call pfcuda_gather_sync before changing an entry a queued launch reads. */
int pfcuda_gather_set_slab(struct pfcuda_gather *g, uint32_t slab, uint64_t base, char *msg,
			   size_t msglen);
/* A pinned, device-mapped host buffer of at least bytes, owned by g (one
 * at a time: a larger one replaces it once queued launches are done). */
int pfcuda_gather_staging(struct pfcuda_gather *g, size_t bytes, void **host, char *msg,
			  size_t msglen);
/* Queues one batch (p in entry mode: bases, nbases and admit are filled
 * in here) and records event (a pfcuda_event_create event) after it.
 * When ids_bytes is not 0, the kernel reads the index from ids (inside
 * the staging buffer, left alone until the event) instead of p->desc:
 * count entries of 8 bytes, or of 4 with p->desc32 (ids_bytes says which
 * bytes the kernel reads). */
int pfcuda_gather_launch(struct pfcuda_gather *g, struct gpu_gather *p, const void *ids,
			 size_t ids_bytes, void *event, char *msg, size_t msglen);
/* Whether g's module has the group kernel (pfcuda_gather_launch_group). */
struct gpu_gather_group;
bool pfcuda_gather_can_group(const struct pfcuda_gather *g);
/* Queues p->n batches of pool hits in one launch (gather.h's struct
 * gpu_gather_group: p->g in entry mode, its bases, nbases, admit and
 * nstaged filled in here; each desc[k] the host address of batch k's index
 * inside the staging buffer, its entries 4 bytes with p->g.desc32, else 8,
 * left alone until the event), then records event after it, once for all
 * the batches.  -EINVAL without the group kernel. */
int pfcuda_gather_launch_group(struct pfcuda_gather *g, struct gpu_gather_group *p, void *event,
			       char *msg, size_t msglen);
/* Makes stream (NULL: the legacy default stream) wait for event. */
int pfcuda_stream_wait(struct pfcuda_dev *d, void *stream, void *event, char *msg, size_t msglen);

/* ---- client copies ----
 * A CUDA session without a pool may come in host arenas (SessionOpened.
 * client_copy): the library registers each (page-locked, read-only for the
 * device) and copies every batch to the GPU itself, on the gather stream,
 * in the trainer's own context. */
/* Whether the device can be fed from read-only registered host memory. */
bool pfcuda_can_copy_from_host(struct pfcuda_dev *d);
int pfcuda_host_register(struct pfcuda_dev *d, void *p, size_t bytes, char *msg, size_t msglen);
void pfcuda_host_unregister(struct pfcuda_dev *d, void *p);
/* Queues bytes from src (registered host memory) to device address dst
 * on g's stream, then records event (and event2, unless NULL) after it. */
int pfcuda_gather_copy(struct pfcuda_gather *g, uint64_t dst, const void *src, size_t bytes,
		       void *event, void *event2, char *msg, size_t msglen);

#endif
