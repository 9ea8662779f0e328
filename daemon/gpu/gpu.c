/*
 * gpu.c — the real GPU back end (CUDA=1): the only file in the daemon that
 * calls CUDA, apart from the launcher of its one kernel (gather.cu).
 *
 * The CUDA runtime is linked statically (cudart_static) and loads libcuda
 * itself at first use; when there is no driver it answers
 * cudaErrorInsufficientDriver / cudaErrorNoDevice instead of failing to
 * start, so one prefetchd binary serves host sessions on CPU-only machines.
 * The driver API calls we need (VMM: cuMemCreate, cuMemMap, export of a POSIX
 * fd) come through cudaGetDriverEntryPointByVersion, never through a
 * link-time -lcuda.  We ask for the ABI of CUDA 12.0: every symbol used here
 * has had the same signature since 10.2 or earlier, and any driver that runs
 * this runtime is at least that new, so the request can never exceed the
 * driver's version (which the call would refuse).
 *
 * CUDA errors stop here: each is logged once with its CUDA name and
 * converted to -errno (see gpu.h).
 *
 * DESIGN: gpu_init runs on the main thread before the loop, reader and
 * transfer threads start, and is the only writer of the globals below;
 * afterwards they are read-only, so no lock is needed.  Every other call may
 * come from any thread and first makes its device current on that thread
 * (cudaSetDevice is per thread and cheap when nothing changes).  Arena
 * allocation and especially freeing can block (cuMemUnmap and cudaFree
 * synchronise with the device): callers keep them off the loop thread.
 */
#include "gpu/gpu.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda.h> /* types only: libcuda is reached through entry points */
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include "base/log.h"

/* The driver ABI we request: see the file comment. */
#define DRIVER_ABI 12000

_Static_assert(sizeof(cudaIpcMemHandle_t) == GPU_IPC_HANDLE_BYTES, "IPC handle size changed");

struct gpu_stream {
	int dev;
	cudaStream_t stream; /* owned */
};

/* The gather kernel's launcher (gather.cu, compiled by nvcc): queues the
 * kernel on a cudaStream_t and returns the launch's cudaError_t. */
int gpu_gather_launch(void *cuda_stream, const struct gpu_gather *g);

struct gpu_event {
	int dev;
	cudaEvent_t event; /* owned */
};

/* Driver entry points.  The first group is required by gpu_init; the VMM
 * group is all-or-nothing (vmm_ok) and only FD arenas need it. */
static struct {
	PFN_cuGetErrorString_v6000 get_error_string;
	PFN_cuDeviceGet_v2000 device_get;
	PFN_cuDeviceGetAttribute_v2000 device_get_attribute;
	PFN_cuDeviceGetName_v2000 device_get_name;

	PFN_cuMemGetAllocationGranularity_v10020 mem_get_allocation_granularity;
	PFN_cuMemCreate_v10020 mem_create;
	PFN_cuMemRelease_v10020 mem_release;
	PFN_cuMemExportToShareableHandle_v10020 mem_export_to_shareable_handle;
	PFN_cuMemAddressReserve_v10020 mem_address_reserve;
	PFN_cuMemAddressFree_v10020 mem_address_free;
	PFN_cuMemMap_v10020 mem_map;
	PFN_cuMemUnmap_v10020 mem_unmap;
	PFN_cuMemSetAccess_v10020 mem_set_access;
} drv;

static int gpu_ndev; /* > 0 once gpu_init has succeeded; 0 means "touch nothing" */
static bool vmm_ok;  /* every VMM entry point was found */

static int rt_errno(cudaError_t e)
{
	switch (e) {
	case cudaErrorMemoryAllocation: return -ENOMEM;
	case cudaErrorNoDevice:
	case cudaErrorInvalidDevice:
	case cudaErrorInsufficientDriver:
	case cudaErrorDevicesUnavailable: return -ENODEV;
	case cudaErrorNotSupported: return -EOPNOTSUPP;
	case cudaErrorNotReady: return -EAGAIN;
	case cudaErrorHostMemoryAlreadyRegistered: return -EEXIST;
	case cudaErrorHostMemoryNotRegistered: return -ENOENT;
	default: return -EIO;
	}
}

/* Logs a runtime failure once and converts it. */
static int rt_fail(cudaError_t e, const char *what, int dev)
{
	log_err("cuda: %s on device %d: %s (%s)", what, dev, cudaGetErrorString(e),
		cudaGetErrorName(e));
	return rt_errno(e);
}

/* Logs a driver failure once and converts it. */
static int cu_fail(CUresult r, const char *what, int dev)
{
	const char *msg = NULL;

	if (!drv.get_error_string || drv.get_error_string(r, &msg) != CUDA_SUCCESS || !msg)
		msg = "unknown driver error";
	log_err("cuda: %s on device %d: %s (CUresult %d)", what, dev, msg, (int)r);
	switch (r) {
	case CUDA_ERROR_OUT_OF_MEMORY: return -ENOMEM;
	case CUDA_ERROR_NO_DEVICE:
	case CUDA_ERROR_INVALID_DEVICE: return -ENODEV;
	case CUDA_ERROR_NOT_SUPPORTED: return -EOPNOTSUPP;
	default: return -EIO;
	}
}

/* Makes dev current on the calling thread. */
static int use_dev(int dev)
{
	cudaError_t e;

	if (gpu_ndev <= 0 || dev < 0 || dev >= gpu_ndev)
		return -ENODEV;
	e = cudaSetDevice(dev);
	if (e != cudaSuccess)
		return rt_fail(e, "cudaSetDevice", dev);
	return 0;
}

static void *entry(const char *symbol)
{
	enum cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
	void *fn = NULL;
	cudaError_t e;

	e = cudaGetDriverEntryPointByVersion(symbol, &fn, DRIVER_ABI, cudaEnableDefault, &status);
	if (e != cudaSuccess || status != cudaDriverEntryPointSuccess)
		return NULL;
	return fn;
}

#define ENTRY(field, symbol) (drv.field = (__typeof__(drv.field))entry(symbol))

static void describe_version(char *buf, size_t len, int v)
{
	snprintf(buf, len, "%d.%d", v / 1000, (v % 1000) / 10);
}

static const char *mps_state(void);

int gpu_init(char *desc, size_t len)
{
	char dv[16], rv[16];
	int drv_ver = 0, rt_ver = 0, n = 0;
	cudaError_t e;

	if (gpu_ndev > 0) {
		snprintf(desc, len, "%d CUDA device%s", gpu_ndev, gpu_ndev == 1 ? "" : "s");
		return gpu_ndev;
	}
	/* Neither call needs a driver: with none the driver version reads 0. */
	cudaRuntimeGetVersion(&rt_ver);
	describe_version(rv, sizeof(rv), rt_ver);
	e = cudaDriverGetVersion(&drv_ver);
	if (e != cudaSuccess || drv_ver == 0) {
		snprintf(desc, len, "no CUDA driver: libcuda.so.1 is missing or cannot be loaded");
		return -ENODEV;
	}
	describe_version(dv, sizeof(dv), drv_ver);
	e = cudaGetDeviceCount(&n);
	if (e == cudaErrorNoDevice || (e == cudaSuccess && n <= 0)) {
		snprintf(desc, len, "no CUDA device (driver %s)", dv);
		return -ENODEV;
	}
	if (e == cudaErrorInsufficientDriver) {
		snprintf(desc, len, "no usable CUDA driver: driver %s is older than runtime %s", dv,
			 rv);
		return -ENODEV;
	}
	if (e != cudaSuccess) {
		snprintf(desc, len, "CUDA unavailable: %s (%s)", cudaGetErrorString(e),
			 cudaGetErrorName(e));
		return -ENODEV;
	}

	if (!ENTRY(get_error_string, "cuGetErrorString") || !ENTRY(device_get, "cuDeviceGet") ||
	    !ENTRY(device_get_attribute, "cuDeviceGetAttribute") ||
	    !ENTRY(device_get_name, "cuDeviceGetName")) {
		snprintf(desc, len, "CUDA driver %s lacks basic entry points", dv);
		memset(&drv, 0, sizeof(drv));
		return -ENODEV;
	}
	vmm_ok = ENTRY(mem_get_allocation_granularity, "cuMemGetAllocationGranularity") &&
		 ENTRY(mem_create, "cuMemCreate") && ENTRY(mem_release, "cuMemRelease") &&
		 ENTRY(mem_export_to_shareable_handle, "cuMemExportToShareableHandle") &&
		 ENTRY(mem_address_reserve, "cuMemAddressReserve") &&
		 ENTRY(mem_address_free, "cuMemAddressFree") && ENTRY(mem_map, "cuMemMap") &&
		 ENTRY(mem_unmap, "cuMemUnmap") && ENTRY(mem_set_access, "cuMemSetAccess");

	gpu_ndev = n;
	snprintf(desc, len, "%d CUDA device%s, driver %s, runtime %s%s%s", n, n == 1 ? "" : "s", dv,
		 rv, vmm_ok ? "" : ", no VMM entry points (ipc = legacy only)", mps_state());
	return n;
}

/* Whether this process's contexts go through MPS (the daemon's and, on the
 * same node with the same pipe directory, its trainers'): with MPS the
 * GPU runs every client's kernels in one shared context instead of
 * time-slicing between contexts.  Told in the description status shows. */
static const char *mps_state(void)
{
	CUdevice cd;
	int on = 0;

	if (drv.device_get(&cd, 0) != CUDA_SUCCESS ||
	    drv.device_get_attribute(&on, CU_DEVICE_ATTRIBUTE_MPS_ENABLED, cd) != CUDA_SUCCESS)
		return ", MPS unknown";
	return on ? ", MPS on" : ", MPS off";
}

int gpu_device_count(void)
{
	return gpu_ndev;
}

int gpu_device_name(int dev, char *buf, size_t len)
{
	CUdevice cd;
	CUresult r;
	int rc;

	if (len == 0)
		return -EINVAL;
	buf[0] = '\0';
	rc = use_dev(dev);
	if (rc < 0)
		return rc;
	r = drv.device_get(&cd, dev);
	if (r != CUDA_SUCCESS)
		return cu_fail(r, "cuDeviceGet", dev);
	r = drv.device_get_name(buf, len > 1024 ? 1024 : (int)len, cd);
	if (r != CUDA_SUCCESS)
		return cu_fail(r, "cuDeviceGetName", dev);
	buf[len - 1] = '\0';
	return 0;
}

int gpu_device_pci_bus_id(int dev, char *buf, size_t len)
{
	cudaError_t e;
	int rc;

	if (len == 0)
		return -EINVAL;
	buf[0] = '\0';
	rc = use_dev(dev);
	if (rc < 0)
		return rc;
	e = cudaDeviceGetPCIBusId(buf, len > 64 ? 64 : (int)len, dev);
	if (e != cudaSuccess)
		return rt_fail(e, "cudaDeviceGetPCIBusId", dev);
	buf[len - 1] = '\0';
	return 0;
}

int gpu_device_by_pci_bus_id(const char *bus_id)
{
	cudaError_t e;
	int dev = -1;

	if (gpu_ndev <= 0)
		return -ENODEV;
	e = cudaDeviceGetByPCIBusId(&dev, bus_id);
	/* An unknown id is the client's problem, not a CUDA failure: no log. */
	if (e != cudaSuccess || dev < 0 || dev >= gpu_ndev)
		return -ENODEV;
	return dev;
}

int gpu_mem_info(int dev, uint64_t *free_bytes, uint64_t *total_bytes)
{
	size_t f = 0, t = 0;
	cudaError_t e;
	int rc;

	rc = use_dev(dev);
	if (rc < 0)
		return rc;
	e = cudaMemGetInfo(&f, &t);
	if (e != cudaSuccess)
		return rt_fail(e, "cudaMemGetInfo", dev);
	*free_bytes = f;
	*total_bytes = t;
	return 0;
}

int gpu_host_register(void *p, size_t bytes)
{
	cudaError_t e;
	int rc;

	/* Portable: the ring feeds the copy streams of every device, and
	 * page-locked memory registered in one context counts as pinned in all
	 * of them only with this flag. */
	rc = use_dev(0);
	if (rc < 0)
		return rc;
	e = cudaHostRegister(p, bytes, cudaHostRegisterPortable);
	if (e != cudaSuccess)
		return rt_fail(e, "cudaHostRegister", 0);
	return 0;
}

int gpu_host_unregister(void *p)
{
	cudaError_t e;
	int rc;

	rc = use_dev(0);
	if (rc < 0)
		return rc;
	e = cudaHostUnregister(p);
	if (e != cudaSuccess)
		return rt_fail(e, "cudaHostUnregister", 0);
	return 0;
}

int gpu_stream_create(int dev, struct gpu_stream **out)
{
	struct gpu_stream *s;
	cudaError_t e;
	int rc;

	*out = NULL;
	rc = use_dev(dev);
	if (rc < 0)
		return rc;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->dev = dev;
	/* Non-blocking: our copies must not serialise with work a library in
	 * this process might queue on the legacy default stream. */
	e = cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking);
	if (e != cudaSuccess) {
		rc = rt_fail(e, "cudaStreamCreateWithFlags", dev);
		goto fail;
	}
	*out = s;
	return 0;
fail:
	free(s);
	return rc;
}

int gpu_stream_sync(struct gpu_stream *s)
{
	cudaError_t e;
	int rc;

	rc = use_dev(s->dev);
	if (rc < 0)
		return rc;
	e = cudaStreamSynchronize(s->stream);
	if (e != cudaSuccess)
		return rt_fail(e, "cudaStreamSynchronize", s->dev);
	return 0;
}

void gpu_stream_destroy(struct gpu_stream *s)
{
	cudaError_t e;

	if (!s)
		return;
	if (use_dev(s->dev) == 0) {
		/* cudaStreamDestroy returns at once and lets queued work finish;
		 * we wait so that no copy still reads a ring slot or writes an
		 * arena the caller is about to free. */
		cudaStreamSynchronize(s->stream);
		e = cudaStreamDestroy(s->stream);
		if (e != cudaSuccess)
			rt_fail(e, "cudaStreamDestroy", s->dev);
	}
	free(s);
}

int gpu_copy_h2d(struct gpu_stream *s, uint64_t dst, const void *src, size_t bytes)
{
	cudaError_t e;
	int rc;

	rc = use_dev(s->dev);
	if (rc < 0)
		return rc;
	e = cudaMemcpyAsync((void *)(uintptr_t)dst, src, bytes, cudaMemcpyHostToDevice, s->stream);
	if (e != cudaSuccess)
		return rt_fail(e, "cudaMemcpyAsync(H2D)", s->dev);
	return 0;
}

int gpu_copy_d2d(struct gpu_stream *s, uint64_t dst, uint64_t src, size_t bytes)
{
	cudaError_t e;
	int rc;

	rc = use_dev(s->dev);
	if (rc < 0)
		return rc;
	e = cudaMemcpyAsync((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, bytes,
			    cudaMemcpyDeviceToDevice, s->stream);
	if (e != cudaSuccess)
		return rt_fail(e, "cudaMemcpyAsync(D2D)", s->dev);
	return 0;
}

int gpu_gather(struct gpu_stream *s, const struct gpu_gather *g)
{
	cudaError_t e;
	int rc;

	rc = use_dev(s->dev);
	if (rc < 0)
		return rc;
	/* The kernel cannot report a bad argument, and a wild address there
	 * is a fault that poisons the daemon's whole context: refuse what we
	 * can see is wrong before launching. */
	if (g->nfields > GPU_GATHER_MAX_FIELDS || (uint64_t)g->count + g->nstaged > INT32_MAX)
		return -EINVAL;
	if ((g->count && (!g->slot || !g->desc)) || (g->nstaged && (!g->staged || !g->admit)) ||
	    (g->table && (!g->table_n || g->nstaged)) ||
	    (g->desc32 && (!g->bases || g->nstaged || g->table)))
		return -EINVAL;
	e = (cudaError_t)gpu_gather_launch(s->stream, g);
	if (e != cudaSuccess)
		return rt_fail(e, "gather kernel launch", s->dev);
	return 0;
}

int gpu_event_create(int dev, struct gpu_event **out)
{
	struct gpu_event *ev;
	cudaError_t e;
	int rc;

	*out = NULL;
	rc = use_dev(dev);
	if (rc < 0)
		return rc;
	ev = calloc(1, sizeof(*ev));
	if (!ev)
		return -ENOMEM;
	ev->dev = dev;
	e = cudaEventCreateWithFlags(&ev->event, cudaEventDisableTiming | cudaEventBlockingSync);
	if (e != cudaSuccess) {
		rc = rt_fail(e, "cudaEventCreateWithFlags", dev);
		goto fail;
	}
	*out = ev;
	return 0;
fail:
	free(ev);
	return rc;
}

int gpu_event_record(struct gpu_event *ev, struct gpu_stream *s)
{
	cudaError_t e;
	int rc;

	if (ev->dev != s->dev)
		return -EINVAL;
	rc = use_dev(s->dev);
	if (rc < 0)
		return rc;
	e = cudaEventRecord(ev->event, s->stream);
	if (e != cudaSuccess)
		return rt_fail(e, "cudaEventRecord", s->dev);
	return 0;
}

int gpu_event_query(struct gpu_event *ev)
{
	cudaError_t e;
	int rc;

	rc = use_dev(ev->dev);
	if (rc < 0)
		return rc;
	e = cudaEventQuery(ev->event);
	if (e == cudaSuccess)
		return 0;
	if (e == cudaErrorNotReady)
		return -EAGAIN; /* not an error: nothing to log */
	return rt_fail(e, "cudaEventQuery", ev->dev);
}

int gpu_event_sync(struct gpu_event *ev)
{
	cudaError_t e;
	int rc;

	rc = use_dev(ev->dev);
	if (rc < 0)
		return rc;
	e = cudaEventSynchronize(ev->event);
	if (e != cudaSuccess)
		return rt_fail(e, "cudaEventSynchronize", ev->dev);
	return 0;
}

void gpu_event_destroy(struct gpu_event *ev)
{
	cudaError_t e;

	if (!ev)
		return;
	if (use_dev(ev->dev) == 0) {
		e = cudaEventDestroy(ev->event);
		if (e != cudaSuccess)
			rt_fail(e, "cudaEventDestroy", ev->dev);
	}
	free(ev);
}

static uint64_t gcd_u64(uint64_t a, uint64_t b)
{
	while (b) {
		uint64_t t = a % b;
		a = b;
		b = t;
	}
	return a;
}

/* Rounds bytes up to a multiple of both gran and GPU_MEM_ALIGN; 0 when
 * that overflows. */
static uint64_t mem_size(uint64_t bytes, uint64_t gran)
{
	uint64_t align = GPU_MEM_ALIGN;

	if (gran > 1)
		align = gran / gcd_u64(gran, align) * align;
	if (bytes == 0 || bytes > UINT64_MAX - align + 1)
		return 0;
	return (bytes + align - 1) / align * align;
}

static void mem_reset(struct gpu_mem *a)
{
	memset(a, 0, sizeof(*a));
	a->export_fd = -1;
}

static int mem_alloc_fd(int dev, uint64_t bytes, struct gpu_mem *a)
{
	CUmemAllocationProp prop;
	CUmemAccessDesc access;
	CUmemGenericAllocationHandle h = 0;
	CUdeviceptr va = 0;
	CUdevice cd;
	CUresult r;
	size_t gran = 0;
	uint64_t size = 0;
	bool created = false, reserved = false, mapped = false;
	int fd = -1, supported = 0, rc;

	if (!vmm_ok) {
		log_err("cuda: device %d: the driver has no VMM entry points; set ipc = legacy",
			dev);
		return -EOPNOTSUPP;
	}
	r = drv.device_get(&cd, dev);
	if (r != CUDA_SUCCESS)
		return cu_fail(r, "cuDeviceGet", dev);
	r = drv.device_get_attribute(
		&supported, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, cd);
	if (r != CUDA_SUCCESS)
		return cu_fail(r, "cuDeviceGetAttribute", dev);
	if (!supported) {
		log_err("cuda: device %d cannot export memory as a POSIX fd; set ipc = legacy",
			dev);
		return -EOPNOTSUPP;
	}

	memset(&prop, 0, sizeof(prop));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = cd;
	r = drv.mem_get_allocation_granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
	if (r != CUDA_SUCCESS)
		return cu_fail(r, "cuMemGetAllocationGranularity", dev);
	size = mem_size(bytes, gran);
	if (size == 0)
		return -EINVAL;

	r = drv.mem_create(&h, size, &prop, 0);
	if (r != CUDA_SUCCESS) {
		rc = cu_fail(r, "cuMemCreate", dev);
		goto fail;
	}
	created = true;
	r = drv.mem_address_reserve(&va, size, 0, 0, 0);
	if (r != CUDA_SUCCESS) {
		rc = cu_fail(r, "cuMemAddressReserve", dev);
		goto fail;
	}
	reserved = true;
	r = drv.mem_map(va, size, 0, h, 0);
	if (r != CUDA_SUCCESS) {
		rc = cu_fail(r, "cuMemMap", dev);
		goto fail;
	}
	mapped = true;
	/* A fresh mapping is inaccessible even to its own device. */
	memset(&access, 0, sizeof(access));
	access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	access.location.id = cd;
	access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	r = drv.mem_set_access(va, size, &access, 1);
	if (r != CUDA_SUCCESS) {
		rc = cu_fail(r, "cuMemSetAccess", dev);
		goto fail;
	}
	/* For POSIX fds the shareable handle is an int written through the
	 * void * argument. */
	r = drv.mem_export_to_shareable_handle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
	if (r != CUDA_SUCCESS) {
		rc = cu_fail(r, "cuMemExportToShareableHandle", dev);
		goto fail;
	}

	a->dev = dev;
	a->bytes = size;
	a->kind = GPU_IPC_FD;
	a->base = (uint64_t)va;
	a->export_fd = fd;
	a->handle = (uint64_t)h;
	return 0;
fail:
	if (mapped)
		drv.mem_unmap(va, size);
	if (reserved)
		drv.mem_address_free(va, size);
	if (created)
		drv.mem_release(h);
	return rc;
}

static int mem_alloc_legacy(int dev, uint64_t bytes, struct gpu_mem *a)
{
	cudaIpcMemHandle_t ipc;
	cudaError_t e;
	void *p = NULL;
	uint64_t size;
	int rc;

	size = mem_size(bytes, 1);
	if (size == 0)
		return -EINVAL;
	e = cudaMalloc(&p, size);
	if (e != cudaSuccess)
		return rt_fail(e, "cudaMalloc", dev);
	e = cudaIpcGetMemHandle(&ipc, p);
	if (e != cudaSuccess) {
		rc = rt_fail(e, "cudaIpcGetMemHandle", dev);
		goto fail;
	}
	a->dev = dev;
	a->bytes = size;
	a->kind = GPU_IPC_LEGACY;
	a->base = (uint64_t)(uintptr_t)p;
	a->export_fd = -1;
	memcpy(a->legacy_handle, &ipc, sizeof(a->legacy_handle));
	a->handle = (uint64_t)(uintptr_t)p;
	return 0;
fail:
	cudaFree(p);
	return rc;
}

/* The daemon's own memory (pool slabs, staging): never exported, so a plain
 * cudaMalloc, rounded like the others so that the free-memory accounting
 * of every kind agrees. */
static int mem_alloc_none(int dev, uint64_t bytes, struct gpu_mem *a)
{
	cudaError_t e;
	void *p = NULL;
	uint64_t size;

	size = mem_size(bytes, 1);
	if (size == 0)
		return -EINVAL;
	e = cudaMalloc(&p, size);
	if (e != cudaSuccess)
		return rt_fail(e, "cudaMalloc", dev);
	a->dev = dev;
	a->bytes = size;
	a->kind = GPU_IPC_NONE;
	a->base = (uint64_t)(uintptr_t)p;
	a->export_fd = -1;
	a->handle = (uint64_t)(uintptr_t)p;
	return 0;
}

int gpu_mem_alloc(int dev, uint64_t bytes, enum gpu_ipc kind, struct gpu_mem *out)
{
	int rc;

	mem_reset(out);
	rc = use_dev(dev);
	if (rc < 0)
		return rc;
	switch (kind) {
	case GPU_IPC_FD: return mem_alloc_fd(dev, bytes, out);
	case GPU_IPC_LEGACY: return mem_alloc_legacy(dev, bytes, out);
	case GPU_IPC_NONE: return mem_alloc_none(dev, bytes, out);
	}
	return -EINVAL;
}

void gpu_mem_free(struct gpu_mem *a)
{
	CUresult r;
	cudaError_t e;

	if (a->export_fd >= 0)
		close(a->export_fd);
	if (a->base && use_dev(a->dev) == 0) {
		if (a->kind == GPU_IPC_FD) {
			/* The physical memory outlives this while a client
			 * still maps it: the driver refcounts mappings, the
			 * handle and exported fds. */
			r = drv.mem_unmap((CUdeviceptr)a->base, a->bytes);
			if (r != CUDA_SUCCESS)
				cu_fail(r, "cuMemUnmap", a->dev);
			r = drv.mem_release((CUmemGenericAllocationHandle)a->handle);
			if (r != CUDA_SUCCESS)
				cu_fail(r, "cuMemRelease", a->dev);
			r = drv.mem_address_free((CUdeviceptr)a->base, a->bytes);
			if (r != CUDA_SUCCESS)
				cu_fail(r, "cuMemAddressFree", a->dev);
		} else {
			e = cudaFree((void *)(uintptr_t)a->base);
			if (e != cudaSuccess)
				rt_fail(e, "cudaFree", a->dev);
		}
	}
	mem_reset(a);
}
