/*
 * cuda_gather.c — the client's gather on the CUDA side: the kernel module
 * (daemon/gpu/gather.cu, embedded as a fatbin) loaded into the trainer's
 * context, its own non-blocking stream, the table of the pool's slab bases
 * the kernel reads, the pinned staging of inline indices, the launches,
 * and the host-to-device copies of a client that copies its batches.
 * Interface and error rules: pfcuda.h.
 *
 * The stream is ordered with the trainer's only by events: each launch or
 * copy records one, which the trainer's stream waits for on the GPU.  The
 * CPU waits for the stream only where memory the queued work reads is to
 * change (a slab's entry, the staging, the bases), and then on a
 * blocking-sync event, asleep.
 *
 * DESIGN: called from the thread that owns the pf_client; no locks.  A
 * struct pfcuda_gather belongs to its pf_client; each call pushes the
 * device's primary context for its duration (cuda.c).
 */
#include "cuda_int.h"
#include "gather.h"

#include <errno.h>
#include <string.h>

#if PF_CUDA

#include <stdlib.h>

/* The fatbin of daemon/gpu/gather.cu built with GATHER_MODULE (the Makefile
 * embeds it as a byte array). */
extern const unsigned char pf_gather_fatbin[];

/* 128 threads a block, one block a row: gather.cu's GATHER_THREADS. */
#define GATHER_BLOCK 128

struct pfcuda_gather {
	struct pfcuda_dev *d; /* borrowed */
	CUmodule mod;
	CUfunction fn;
	CUfunction fn_group; /* pf_gather_group; NULL: one launch a batch */
	CUstream stream;     /* non-blocking: ordered with the trainer's only by events */
	CUevent idle;	     /* blocking-sync: pfcuda_gather_sync waits on it, asleep */
	uint64_t *hbases;    /* pinned host copy of the slab bases, cap entries */
	CUdeviceptr dbases;
	uint32_t cap;
	/* Pinned, mapped: batches' inline indices, which the kernel reads
	 * over PCIe where they lie (at staging_dev), with no upload. */
	uint8_t *staging;
	CUdeviceptr staging_dev;
	size_t staging_bytes;
};

static int grow_bases(struct pfcuda_gather *g, uint32_t want, char *msg, size_t msglen);

/* Waits, asleep, for the gather stream's work (context pushed).  An event,
 * not cuStreamSynchronize, which spins or yields as the trainer's context
 * was made (PyTorch's: spin while it has cores). */
static CUresult stream_idle(struct pfcuda_gather *g)
{
	CUresult r = pfcuda_drv.event_record(g->idle, g->stream);

	return r == CUDA_SUCCESS ? pfcuda_drv.event_synchronize(g->idle) : r;
}

int pfcuda_gather_open(struct pfcuda_dev *d, struct pfcuda_gather **out, char *msg, size_t msglen)
{
	struct pfcuda_gather *g;
	CUresult r = CUDA_SUCCESS;
	const char *what = "";
	int rc;

	*out = NULL;
	if (!pfcuda_drv.gather || !pfcuda_drv.mem_alloc) {
		set_err(msg, msglen, "the CUDA driver lacks the module and launch entry points");
		return -EOPNOTSUPP;
	}
	g = calloc(1, sizeof(*g));
	if (!g) {
		set_err(msg, msglen, "out of memory");
		return -ENOMEM;
	}
	g->d = d;
	rc = pfcuda_push(d, msg, msglen);
	if (rc < 0) {
		free(g);
		return rc;
	}
	if ((r = pfcuda_drv.module_load_data(&g->mod, pf_gather_fatbin)) != CUDA_SUCCESS)
		what = "cuModuleLoadData (the embedded gather kernel)";
	else if ((r = pfcuda_drv.module_get_function(&g->fn, g->mod, "pf_gather")) != CUDA_SUCCESS)
		what = "cuModuleGetFunction(pf_gather)";
	else if ((r = pfcuda_drv.stream_create(&g->stream, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS)
		what = "cuStreamCreate";
	else if ((r = pfcuda_drv.event_create(&g->idle,
					      CU_EVENT_DISABLE_TIMING | CU_EVENT_BLOCKING_SYNC)) !=
		 CUDA_SUCCESS)
		what = "cuEventCreate";
	/* Optional: without it every batch is a launch of its own. */
	if (r == CUDA_SUCCESS &&
	    pfcuda_drv.module_get_function(&g->fn_group, g->mod, "pf_gather_group") != CUDA_SUCCESS)
		g->fn_group = NULL;
	pfcuda_pop();
	if (r != CUDA_SUCCESS) {
		rc = pfcuda_fail(r, what, msg, msglen);
		pfcuda_gather_close(g);
		return rc;
	}
	/* The bases array exists from the start: a launch before the first
	 * slab must see entry mode with no slab mapped, never bases == 0 (the
	 * kernel would take entry ids for addresses). */
	rc = pfcuda_push(d, msg, msglen);
	if (!rc) {
		rc = grow_bases(g, 64, msg, msglen);
		pfcuda_pop();
	}
	if (rc) {
		pfcuda_gather_close(g);
		return rc;
	}
	*out = g;
	return 0;
}

void pfcuda_gather_close(struct pfcuda_gather *g)
{
	if (!g)
		return;
	if (pfcuda_push(g->d, NULL, 0) == 0) {
		if (g->stream) {
			if (g->idle)
				stream_idle(g);
			pfcuda_drv.stream_destroy(g->stream);
		}
		if (g->idle)
			pfcuda_drv.event_destroy(g->idle);
		if (g->dbases)
			pfcuda_drv.mem_free(g->dbases);
		if (g->hbases)
			pfcuda_drv.mem_free_host(g->hbases);
		if (g->staging)
			pfcuda_drv.mem_free_host(g->staging);
		if (g->mod)
			pfcuda_drv.module_unload(g->mod);
		pfcuda_pop();
	}
	free(g);
}

int pfcuda_gather_sync(struct pfcuda_gather *g, char *msg, size_t msglen)
{
	CUresult r;
	int rc = pfcuda_push(g->d, msg, msglen);

	if (rc < 0)
		return rc;
	r = stream_idle(g);
	pfcuda_pop();
	return r == CUDA_SUCCESS ? 0 : pfcuda_fail(r, "cuEventSynchronize", msg, msglen);
}

/* Makes room for slab ids below want (pushed context): a larger pinned
 * copy and device array, the old ones freed once the stream is idle. */
static int grow_bases(struct pfcuda_gather *g, uint32_t want, char *msg, size_t msglen)
{
	uint32_t cap = g->cap ? g->cap : 64;
	uint64_t *h = NULL;
	CUdeviceptr dv = 0;
	CUresult r;

	while (cap < want)
		cap *= 2;
	if ((r = pfcuda_drv.mem_alloc_host((void **)&h, cap * sizeof(*h))) != CUDA_SUCCESS)
		return pfcuda_fail(r, "cuMemAllocHost", msg, msglen);
	if ((r = pfcuda_drv.mem_alloc(&dv, cap * sizeof(*h))) != CUDA_SUCCESS) {
		pfcuda_drv.mem_free_host(h);
		return pfcuda_fail(r, "cuMemAlloc", msg, msglen);
	}
	memset(h, 0, cap * sizeof(*h));
	stream_idle(g);
	if (g->cap)
		memcpy(h, g->hbases, g->cap * sizeof(*h));
	r = pfcuda_drv.memcpy_htod_async(dv, h, cap * sizeof(*h), g->stream);
	if (r != CUDA_SUCCESS) {
		pfcuda_drv.mem_free(dv);
		pfcuda_drv.mem_free_host(h);
		return pfcuda_fail(r, "cuMemcpyHtoDAsync", msg, msglen);
	}
	if (g->dbases)
		pfcuda_drv.mem_free(g->dbases);
	if (g->hbases)
		pfcuda_drv.mem_free_host(g->hbases);
	g->hbases = h;
	g->dbases = dv;
	g->cap = cap;
	return 0;
}

int pfcuda_gather_set_slab(struct pfcuda_gather *g, uint32_t slab, uint64_t base, char *msg,
			   size_t msglen)
{
	CUresult r;
	int rc = pfcuda_push(g->d, msg, msglen);

	if (rc < 0)
		return rc;
	if (slab >= g->cap) {
		rc = grow_bases(g, slab + 1, msg, msglen);
		if (rc < 0) {
			pfcuda_pop();
			return rc;
		}
	}
	/* Ordered before every later gather on the stream; the entry is
	 * changed again only after a pfcuda_gather_sync. */
	g->hbases[slab] = base;
	r = pfcuda_drv.memcpy_htod_async(g->dbases + slab * sizeof(uint64_t), &g->hbases[slab],
					 sizeof(uint64_t), g->stream);
	pfcuda_pop();
	return r == CUDA_SUCCESS ? 0 : pfcuda_fail(r, "cuMemcpyHtoDAsync", msg, msglen);
}

int pfcuda_gather_staging(struct pfcuda_gather *g, size_t bytes, void **host, char *msg,
			  size_t msglen)
{
	const char *what = "cuMemAllocHost";
	CUresult r = CUDA_SUCCESS;
	int rc;

	if (g->staging && g->staging_bytes >= bytes) {
		*host = g->staging;
		return 0;
	}
	rc = pfcuda_push(g->d, msg, msglen);
	if (rc < 0)
		return rc;
	stream_idle(g); /* queued gathers read the old one */
	if (g->staging)
		pfcuda_drv.mem_free_host(g->staging);
	g->staging = NULL;
	g->staging_bytes = 0;
	r = pfcuda_drv.mem_alloc_host((void **)&g->staging, bytes);
	if (r == CUDA_SUCCESS) {
		/* Memory of cuMemAllocHost is mapped for every device with
		 * unified addressing (all that run our kernel). */
		what = "cuMemHostGetDevicePointer";
		r = pfcuda_drv.mem_host_get_device_pointer(&g->staging_dev, g->staging, 0);
		if (r != CUDA_SUCCESS) {
			pfcuda_drv.mem_free_host(g->staging);
			g->staging = NULL;
		}
	}
	pfcuda_pop();
	if (r != CUDA_SUCCESS)
		return pfcuda_fail(r, what, msg, msglen);
	g->staging_bytes = bytes;
	*host = g->staging;
	return 0;
}

int pfcuda_gather_launch(struct pfcuda_gather *g, struct gpu_gather *p, const void *ids,
			 size_t ids_bytes, void *event, char *msg, size_t msglen)
{
	void *args[] = {p};
	CUresult r = CUDA_SUCCESS;
	int rc;

	p->bases = g->dbases;
	p->nbases = g->cap;
	p->admit = 0;
	rc = pfcuda_push(g->d, msg, msglen);
	if (rc < 0)
		return rc;
	/* Inline indices are read from the pinned staging itself: one
	 * driver call less per batch than uploading them first. */
	if (ids_bytes)
		p->desc = g->staging_dev + (CUdeviceptr)((const uint8_t *)ids - g->staging);
	if (p->count)
		r = pfcuda_drv.launch_kernel(g->fn, p->count, 1, 1, GATHER_BLOCK, 1, 1, 0,
					     g->stream, args, NULL);
	if (r == CUDA_SUCCESS)
		r = pfcuda_drv.event_record((CUevent)event, g->stream);
	pfcuda_pop();
	return r == CUDA_SUCCESS ? 0 : pfcuda_fail(r, "cuLaunchKernel(pf_gather)", msg, msglen);
}

bool pfcuda_gather_can_group(const struct pfcuda_gather *g)
{
	return g->fn_group != NULL;
}

int pfcuda_gather_launch_group(struct pfcuda_gather *g, struct gpu_gather_group *p, void *event,
			       char *msg, size_t msglen)
{
	void *args[] = {p};
	CUresult r = CUDA_SUCCESS;
	int rc;

	if (!g->fn_group || p->n == 0 || p->n > GPU_GATHER_GROUP) {
		set_err(msg, msglen, "no group gather of %u batches", p->n);
		return -EINVAL;
	}
	p->g.bases = g->dbases;
	p->g.nbases = g->cap;
	p->g.admit = 0;
	p->g.nstaged = 0;
	/* Each index is read where it lies in the pinned staging. */
	for (uint32_t k = 0; k < p->n; k++)
		p->desc[k] = g->staging_dev +
			     (CUdeviceptr)((const uint8_t *)(uintptr_t)p->desc[k] - g->staging);
	rc = pfcuda_push(g->d, msg, msglen);
	if (rc < 0)
		return rc;
	if (p->first[p->n])
		r = pfcuda_drv.launch_kernel(g->fn_group, p->first[p->n], 1, 1, GATHER_BLOCK, 1, 1,
					     0, g->stream, args, NULL);
	/* One event for the launch, which its batches share: one record, and
	 * the trainer's stream waits on it once for all of them. */
	if (r == CUDA_SUCCESS)
		r = pfcuda_drv.event_record((CUevent)event, g->stream);
	pfcuda_pop();
	return r == CUDA_SUCCESS ? 0
				 : pfcuda_fail(r, "cuLaunchKernel(pf_gather_group)", msg, msglen);
}

int pfcuda_gather_copy(struct pfcuda_gather *g, uint64_t dst, const void *src, size_t bytes,
		       void *event, void *event2, char *msg, size_t msglen)
{
	CUresult r;
	int rc = pfcuda_push(g->d, msg, msglen);

	if (rc < 0)
		return rc;
	r = pfcuda_drv.memcpy_htod_async((CUdeviceptr)dst, src, bytes, g->stream);
	if (r == CUDA_SUCCESS)
		r = pfcuda_drv.event_record((CUevent)event, g->stream);
	if (r == CUDA_SUCCESS && event2)
		r = pfcuda_drv.event_record((CUevent)event2, g->stream);
	pfcuda_pop();
	return r == CUDA_SUCCESS ? 0 : pfcuda_fail(r, "cuMemcpyHtoDAsync", msg, msglen);
}

#else /* !PF_CUDA: built without the CUDA toolkit */

int pfcuda_gather_open(struct pfcuda_dev *d, struct pfcuda_gather **out, char *msg, size_t msglen)
{
	*out = NULL;
	return NO_CUDA(msg, msglen);
}

void pfcuda_gather_close(struct pfcuda_gather *g)
{
}

int pfcuda_gather_sync(struct pfcuda_gather *g, char *msg, size_t msglen)
{
	return NO_CUDA(msg, msglen);
}

int pfcuda_gather_set_slab(struct pfcuda_gather *g, uint32_t slab, uint64_t base, char *msg,
			   size_t msglen)
{
	return NO_CUDA(msg, msglen);
}

int pfcuda_gather_staging(struct pfcuda_gather *g, size_t bytes, void **host, char *msg,
			  size_t msglen)
{
	*host = NULL;
	return NO_CUDA(msg, msglen);
}

int pfcuda_gather_launch(struct pfcuda_gather *g, struct gpu_gather *p, const void *ids,
			 size_t ids_bytes, void *event, char *msg, size_t msglen)
{
	return NO_CUDA(msg, msglen);
}

int pfcuda_gather_copy(struct pfcuda_gather *g, uint64_t dst, const void *src, size_t bytes,
		       void *event, void *event2, char *msg, size_t msglen)
{
	return NO_CUDA(msg, msglen);
}

bool pfcuda_gather_can_group(const struct pfcuda_gather *g)
{
	return false;
}

int pfcuda_gather_launch_group(struct pfcuda_gather *g, struct gpu_gather_group *p, void *event,
			       char *msg, size_t msglen)
{
	return NO_CUDA(msg, msglen);
}
#endif
