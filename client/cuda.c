/*
 * cuda.c — libprefetch's CUDA side: imports the daemon's device arenas into
 * the trainer process, records and polls release events, probes free device
 * memory.  Interface and error rules: pfcuda.h.
 *
 * The driver is reached without any link-time CUDA dependency: libcuda.so.1
 * is dlopen'ed on the first pfcuda_open, cuInit and cuGetProcAddress_v2 are
 * the only symbols taken with dlsym, and every other entry point comes from
 * cuGetProcAddress_v2 at the ABI of CUDA 12.0 with legacy-stream semantics.
 * We do not dlsym each function: libcuda exports several ABIs under related
 * names (plain dlsym("cuMemGetInfo") is the 32-bit CUDA 2.0 version, the
 * current one is "cuMemGetInfo_v2"), and cuGetProcAddress is the driver's
 * own answer to "the version of this function matching this header".  12.0
 * is the oldest driver with cuGetProcAddress_v2, every function used here
 * has kept its 12.0 signature through CUDA 13, and asking for a newer ABI
 * would fail on a 12.x driver that PyTorch still supports.
 *
 * DESIGN: called from the thread that owns the pf_client; no locks beyond
 * the pthread_once that loads the driver (several clients in one process
 * may race to it).  The driver is never unloaded: libcuda does not support
 * dlclose while it has contexts and threads.
 */
#include "pfcuda.h"
#include "gather.h"
#include "util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#if PF_CUDA

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include <cuda.h> /* types only: the driver is dlopen'ed */
#include <cudaTypedefs.h>

#define DRIVER_ABI 12000

_Static_assert(sizeof(CUipcMemHandle) == PFCUDA_IPC_HANDLE_BYTES, "IPC handle size changed");

struct pfcuda_dev {
	int ordinal;
	CUdevice dev;
	CUcontext ctx; /* retained primary context: released by pfcuda_close */
};

static pthread_once_t load_once = PTHREAD_ONCE_INIT;

/* Written once by load() under load_once, read-only afterwards. */
static struct {
	int rc;	       /* 0 when loaded and initialised, else -errno */
	char msg[256]; /* why rc < 0 */
	bool vmm;      /* the FD-import entry points were all found */

	PFN_cuGetErrorString_v6000 get_error_string;
	PFN_cuGetErrorName_v6000 get_error_name;
	PFN_cuInit_v2000 init;
	PFN_cuDeviceGet_v2000 device_get;
	PFN_cuDeviceGetPCIBusId_v4010 device_get_pci_bus_id;
	PFN_cuDevicePrimaryCtxRetain_v7000 primary_ctx_retain;
	PFN_cuDevicePrimaryCtxRelease_v11000 primary_ctx_release;
	PFN_cuCtxPushCurrent_v4000 ctx_push_current;
	PFN_cuCtxPopCurrent_v4000 ctx_pop_current;
	PFN_cuIpcOpenMemHandle_v11000 ipc_open_mem_handle;
	PFN_cuIpcCloseMemHandle_v4010 ipc_close_mem_handle;
	PFN_cuEventCreate_v2000 event_create;
	PFN_cuEventRecord_v2000 event_record;
	PFN_cuEventQuery_v2000 event_query;
	PFN_cuEventSynchronize_v2000 event_synchronize;
	PFN_cuEventDestroy_v4000 event_destroy;
	PFN_cuMemGetInfo_v3020 mem_get_info;
	PFN_cuCtxSynchronize_v2000 ctx_synchronize;
	PFN_cuMemcpyDtoH_v3020 memcpy_dtoh;
	/* Tests only (pfcuda_mem_alloc): optional, NULL when not found. */
	PFN_cuMemAlloc_v3020 mem_alloc;
	PFN_cuMemFree_v3020 mem_free;

	PFN_cuMemGetAllocationGranularity_v10020 mem_get_allocation_granularity;
	PFN_cuMemImportFromShareableHandle_v10020 mem_import_from_shareable_handle;
	PFN_cuMemAddressReserve_v10020 mem_address_reserve;
	PFN_cuMemAddressFree_v10020 mem_address_free;
	PFN_cuMemMap_v10020 mem_map;
	PFN_cuMemUnmap_v10020 mem_unmap;
	PFN_cuMemSetAccess_v10020 mem_set_access;
	PFN_cuMemRelease_v10020 mem_release;

	/* The client's gather (pfcuda_gather_*): optional, gather is false
	 * when one is missing and the daemon then gathers itself. */
	bool gather;
	PFN_cuModuleLoadData_v2000 module_load_data;
	PFN_cuModuleGetFunction_v2000 module_get_function;
	PFN_cuModuleUnload_v2000 module_unload;
	PFN_cuLaunchKernel_v4000 launch_kernel;
	PFN_cuStreamCreate_v2000 stream_create;
	PFN_cuStreamDestroy_v4000 stream_destroy;
	PFN_cuStreamWaitEvent_v3020 stream_wait_event;
	PFN_cuMemcpyHtoDAsync_v3020 memcpy_htod_async;
	PFN_cuMemAllocHost_v3020 mem_alloc_host;
	PFN_cuMemHostGetDevicePointer_v3020 mem_host_get_device_pointer;
	PFN_cuMemFreeHost_v2000 mem_free_host;
	/* Client copies (pfcuda_host_register): optional too. */
	PFN_cuMemHostRegister_v6050 mem_host_register;
	PFN_cuMemHostUnregister_v4000 mem_host_unregister;
	PFN_cuDeviceGetAttribute_v2000 device_get_attribute;
} drv;

static int cu_errno(CUresult r)
{
	switch (r) {
	case CUDA_SUCCESS: return 0;
	case CUDA_ERROR_OUT_OF_MEMORY: return -ENOMEM;
	case CUDA_ERROR_NO_DEVICE:
	case CUDA_ERROR_INVALID_DEVICE: return -ENODEV;
	case CUDA_ERROR_NOT_READY: return -EAGAIN;
	case CUDA_ERROR_NOT_SUPPORTED: return -EOPNOTSUPP;
	case CUDA_ERROR_NOT_PERMITTED: return -EPERM;
	default: return -EIO;
	}
}

/* Describes a failed driver call in msg and converts it. */
static int cu_fail(CUresult r, const char *what, char *msg, size_t len)
{
	const char *str = NULL, *name = NULL;

	if (drv.get_error_string)
		drv.get_error_string(r, &str);
	if (drv.get_error_name)
		drv.get_error_name(r, &name);
	set_err(msg, len, "%s: %s (%s)", what, str ? str : "unknown CUDA error", name ? name : "?");
	return cu_errno(r);
}

static void load(void)
{
	PFN_cuGetProcAddress_v12000 get_proc;
	void *lib;
	CUresult r;
	const char *missing = NULL;

#define SYM(field, name)                                                                           \
	do {                                                                                       \
		CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;          \
		void *fn = NULL;                                                                   \
		if (get_proc(name, &fn, DRIVER_ABI, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &st) !=     \
			    CUDA_SUCCESS ||                                                        \
		    st != CU_GET_PROC_ADDRESS_SUCCESS || !fn) {                                    \
			if (!missing)                                                              \
				missing = name;                                                    \
		} else {                                                                           \
			drv.field = (__typeof__(drv.field))fn;                                     \
		}                                                                                  \
	} while (0)

	lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		drv.rc = -ENODEV;
		set_err(drv.msg, sizeof(drv.msg), "no CUDA driver: %s", dlerror());
		return;
	}
	get_proc = (PFN_cuGetProcAddress_v12000)dlsym(lib, "cuGetProcAddress_v2");
	drv.init = (PFN_cuInit_v2000)dlsym(lib, "cuInit");
	drv.get_error_string = (PFN_cuGetErrorString_v6000)dlsym(lib, "cuGetErrorString");
	drv.get_error_name = (PFN_cuGetErrorName_v6000)dlsym(lib, "cuGetErrorName");
	if (!get_proc || !drv.init) {
		drv.rc = -ENODEV;
		set_err(drv.msg, sizeof(drv.msg),
			"CUDA driver too old: libcuda.so.1 lacks cuGetProcAddress_v2 (need 12.0+)");
		return;
	}
	r = drv.init(0);
	if (r != CUDA_SUCCESS) {
		drv.rc = cu_fail(r, "cuInit", drv.msg, sizeof(drv.msg));
		if (drv.rc == -EIO)
			drv.rc = -ENODEV; /* whatever the reason, there is no usable GPU */
		return;
	}

	SYM(device_get, "cuDeviceGet");
	SYM(device_get_pci_bus_id, "cuDeviceGetPCIBusId");
	SYM(primary_ctx_retain, "cuDevicePrimaryCtxRetain");
	SYM(primary_ctx_release, "cuDevicePrimaryCtxRelease");
	SYM(ctx_push_current, "cuCtxPushCurrent");
	SYM(ctx_pop_current, "cuCtxPopCurrent");
	SYM(ipc_open_mem_handle, "cuIpcOpenMemHandle");
	SYM(ipc_close_mem_handle, "cuIpcCloseMemHandle");
	SYM(event_create, "cuEventCreate");
	SYM(event_record, "cuEventRecord");
	SYM(event_query, "cuEventQuery");
	SYM(event_synchronize, "cuEventSynchronize");
	SYM(event_destroy, "cuEventDestroy");
	SYM(mem_get_info, "cuMemGetInfo");
	SYM(ctx_synchronize, "cuCtxSynchronize");
	SYM(memcpy_dtoh, "cuMemcpyDtoH");
	if (missing) {
		drv.rc = -EOPNOTSUPP;
		set_err(drv.msg, sizeof(drv.msg), "CUDA driver lacks %s", missing);
		return;
	}
	/* Only FD arenas need these; a driver without VMM can still open
	 * legacy ones. */
	SYM(mem_get_allocation_granularity, "cuMemGetAllocationGranularity");
	SYM(mem_import_from_shareable_handle, "cuMemImportFromShareableHandle");
	SYM(mem_address_reserve, "cuMemAddressReserve");
	SYM(mem_address_free, "cuMemAddressFree");
	SYM(mem_map, "cuMemMap");
	SYM(mem_unmap, "cuMemUnmap");
	SYM(mem_set_access, "cuMemSetAccess");
	SYM(mem_release, "cuMemRelease");
	drv.vmm = !missing;
	/* Plain allocations are for tests that fill the device; a trainer
	 * never needs them, so their absence must not fail pfcuda_open. */
	missing = NULL;
	SYM(mem_alloc, "cuMemAlloc");
	SYM(mem_free, "cuMemFree");
	SYM(module_load_data, "cuModuleLoadData");
	SYM(module_get_function, "cuModuleGetFunction");
	SYM(module_unload, "cuModuleUnload");
	SYM(launch_kernel, "cuLaunchKernel");
	SYM(stream_create, "cuStreamCreate");
	SYM(stream_destroy, "cuStreamDestroy");
	SYM(stream_wait_event, "cuStreamWaitEvent");
	SYM(memcpy_htod_async, "cuMemcpyHtoDAsync");
	SYM(mem_alloc_host, "cuMemAllocHost");
	SYM(mem_free_host, "cuMemFreeHost");
	SYM(mem_host_get_device_pointer, "cuMemHostGetDevicePointer");
	drv.gather = !missing;
	SYM(mem_host_register, "cuMemHostRegister");
	SYM(mem_host_unregister, "cuMemHostUnregister");
	SYM(device_get_attribute, "cuDeviceGetAttribute");
	drv.rc = 0;
#undef SYM
}

/* Makes d's primary context current for one call; pop() restores the
 * caller's. */
static int push(struct pfcuda_dev *d, char *msg, size_t len)
{
	CUresult r = drv.ctx_push_current(d->ctx);

	return r == CUDA_SUCCESS ? 0 : cu_fail(r, "cuCtxPushCurrent", msg, len);
}

static void pop(void)
{
	CUcontext ctx;

	drv.ctx_pop_current(&ctx);
}

int pfcuda_open(int ordinal, struct pfcuda_dev **out, char *msg, size_t msglen)
{
	struct pfcuda_dev *d;
	CUdevice dev;
	CUresult r;
	int rc;

	*out = NULL;
	pthread_once(&load_once, load);
	if (drv.rc < 0) {
		set_err(msg, msglen, "%s", drv.msg);
		return drv.rc;
	}
	r = drv.device_get(&dev, ordinal);
	if (r != CUDA_SUCCESS)
		return cu_fail(r, "cuDeviceGet", msg, msglen);
	d = calloc(1, sizeof(*d));
	if (!d) {
		set_err(msg, msglen, "out of memory");
		return -ENOMEM;
	}
	d->ordinal = ordinal;
	d->dev = dev;
	/* The primary context is the one the CUDA runtime (and so PyTorch)
	 * uses: pointers we map in it are valid in the trainer's tensors. */
	r = drv.primary_ctx_retain(&d->ctx, dev);
	if (r != CUDA_SUCCESS) {
		rc = cu_fail(r, "cuDevicePrimaryCtxRetain", msg, msglen);
		goto fail;
	}
	*out = d;
	return 0;
fail:
	free(d);
	return rc;
}

void pfcuda_close(struct pfcuda_dev *d)
{
	if (!d)
		return;
	drv.primary_ctx_release(d->dev);
	free(d);
}

int pfcuda_ordinal(const struct pfcuda_dev *d)
{
	return d->ordinal;
}

int pfcuda_pci_bus_id(struct pfcuda_dev *d, char *buf, size_t len, char *msg, size_t msglen)
{
	CUresult r;

	if (len == 0)
		return -EINVAL;
	r = drv.device_get_pci_bus_id(buf, len > 64 ? 64 : (int)len, d->dev);
	if (r != CUDA_SUCCESS) {
		buf[0] = '\0';
		return cu_fail(r, "cuDeviceGetPCIBusId", msg, msglen);
	}
	buf[len - 1] = '\0';
	return 0;
}

int pfcuda_import_fd(struct pfcuda_dev *d, int fd, uint64_t bytes, struct pfcuda_arena *out,
		     char *msg, size_t msglen)
{
	CUmemAllocationProp prop;
	CUmemAccessDesc access;
	CUmemGenericAllocationHandle h = 0;
	CUdeviceptr va = 0;
	CUresult r;
	size_t gran = 0;
	bool pushed = false, imported = false, reserved = false, mapped = false;
	int rc = 0;

	memset(out, 0, sizeof(*out));
	if (fd < 0) {
		set_err(msg, msglen, "no fd came with the arena");
		return -EBADF;
	}
	if (!drv.vmm) {
		set_err(msg, msglen, "CUDA driver has no VMM entry points: use ipc legacy");
		rc = -EOPNOTSUPP;
		goto out;
	}
	rc = push(d, msg, msglen);
	if (rc < 0)
		goto out;
	pushed = true;

	memset(&prop, 0, sizeof(prop));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = d->dev;
	r = drv.mem_get_allocation_granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
	if (r != CUDA_SUCCESS) {
		rc = cu_fail(r, "cuMemGetAllocationGranularity", msg, msglen);
		goto out;
	}
	/* The daemon rounded the arena to this granularity; a size that is
	 * not a multiple cannot be mapped whole and means a protocol bug. */
	if (bytes == 0 || gran == 0 || bytes % gran) {
		set_err(msg, msglen,
			"arena of %llu bytes is not a multiple of the %zu-byte "
			"allocation granularity",
			(unsigned long long)bytes, gran);
		rc = -EINVAL;
		goto out;
	}
	/* The POSIX-fd convention: the fd itself, by value, in the pointer. */
	r = drv.mem_import_from_shareable_handle(&h, (void *)(uintptr_t)fd,
						 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	if (r != CUDA_SUCCESS) {
		rc = cu_fail(r, "cuMemImportFromShareableHandle", msg, msglen);
		goto out;
	}
	imported = true;
	r = drv.mem_address_reserve(&va, bytes, 0, 0, 0);
	if (r != CUDA_SUCCESS) {
		rc = cu_fail(r, "cuMemAddressReserve", msg, msglen);
		goto out;
	}
	reserved = true;
	r = drv.mem_map(va, bytes, 0, h, 0);
	if (r != CUDA_SUCCESS) {
		rc = cu_fail(r, "cuMemMap", msg, msglen);
		goto out;
	}
	mapped = true;
	memset(&access, 0, sizeof(access));
	access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	access.location.id = d->dev;
	access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	r = drv.mem_set_access(va, bytes, &access, 1);
	if (r != CUDA_SUCCESS) {
		rc = cu_fail(r, "cuMemSetAccess", msg, msglen);
		goto out;
	}
	out->kind = PFCUDA_ARENA_FD;
	out->base = (uint64_t)va;
	out->bytes = bytes;
out:
	if (rc < 0) {
		if (mapped)
			drv.mem_unmap(va, bytes);
		if (reserved)
			drv.mem_address_free(va, bytes);
	}
	/* Every import pairs with a release; the mapping alone keeps the
	 * memory alive until pfcuda_unmap. */
	if (imported)
		drv.mem_release(h);
	if (pushed)
		pop();
	close(fd);
	return rc;
}

int pfcuda_import_legacy(struct pfcuda_dev *d, const uint8_t handle[PFCUDA_IPC_HANDLE_BYTES],
			 uint64_t bytes, struct pfcuda_arena *out, char *msg, size_t msglen)
{
	CUipcMemHandle ipc;
	CUdeviceptr p = 0;
	CUresult r;
	int rc;

	memset(out, 0, sizeof(*out));
	memcpy(&ipc, handle, sizeof(ipc));
	rc = push(d, msg, msglen);
	if (rc < 0)
		return rc;
	/* The only flag the driver accepts; it also lets the mapping reach a
	 * peer device should the arena live on another GPU. */
	r = drv.ipc_open_mem_handle(&p, ipc, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
	pop();
	if (r != CUDA_SUCCESS)
		return cu_fail(r, "cuIpcOpenMemHandle", msg, msglen);
	out->kind = PFCUDA_ARENA_LEGACY;
	out->base = (uint64_t)p;
	out->bytes = bytes;
	return 0;
}

int pfcuda_unmap(struct pfcuda_dev *d, struct pfcuda_arena *a, char *msg, size_t msglen)
{
	CUresult r = CUDA_SUCCESS;
	const char *what = "";
	int rc;

	if (!a->base)
		return 0;
	rc = push(d, msg, msglen);
	if (rc < 0)
		return rc;
	if (a->kind == PFCUDA_ARENA_FD) {
		what = "cuMemUnmap";
		r = drv.mem_unmap((CUdeviceptr)a->base, a->bytes);
		if (r == CUDA_SUCCESS) {
			what = "cuMemAddressFree";
			r = drv.mem_address_free((CUdeviceptr)a->base, a->bytes);
		}
	} else {
		what = "cuIpcCloseMemHandle";
		r = drv.ipc_close_mem_handle((CUdeviceptr)a->base);
	}
	pop();
	memset(a, 0, sizeof(*a));
	return r == CUDA_SUCCESS ? 0 : cu_fail(r, what, msg, msglen);
}

int pfcuda_event_create(struct pfcuda_dev *d, void **ev, char *msg, size_t msglen)
{
	CUevent e = NULL;
	CUresult r;
	int rc;

	*ev = NULL;
	rc = push(d, msg, msglen);
	if (rc < 0)
		return rc;
	/* Blocking sync: a lane (settle.c) or pf_close waiting for one
	 * sleeps until the GPU gets there instead of spinning a core. */
	r = drv.event_create(&e, CU_EVENT_DISABLE_TIMING | CU_EVENT_BLOCKING_SYNC);
	pop();
	if (r != CUDA_SUCCESS)
		return cu_fail(r, "cuEventCreate", msg, msglen);
	*ev = e;
	return 0;
}

int pfcuda_event_record(struct pfcuda_dev *d, void *ev, void *stream, char *msg, size_t msglen)
{
	CUresult r;
	int rc;

	/* With a NULL stream the driver records on the legacy default stream
	 * of the current context, which must therefore be the primary one. */
	rc = push(d, msg, msglen);
	if (rc < 0)
		return rc;
	r = drv.event_record((CUevent)ev, (CUstream)stream);
	pop();
	return r == CUDA_SUCCESS ? 0 : cu_fail(r, "cuEventRecord", msg, msglen);
}

int pfcuda_event_query(struct pfcuda_dev *d, void *ev, char *msg, size_t msglen)
{
	CUresult r;
	int rc;

	rc = push(d, msg, msglen);
	if (rc < 0)
		return rc;
	r = drv.event_query((CUevent)ev);
	pop();
	if (r == CUDA_SUCCESS)
		return 0;
	if (r == CUDA_ERROR_NOT_READY)
		return -EAGAIN;
	return cu_fail(r, "cuEventQuery", msg, msglen);
}

int pfcuda_event_sync(struct pfcuda_dev *d, void *ev, char *msg, size_t msglen)
{
	CUresult r;
	int rc;

	rc = push(d, msg, msglen);
	if (rc < 0)
		return rc;
	r = drv.event_synchronize((CUevent)ev);
	pop();
	return r == CUDA_SUCCESS ? 0 : cu_fail(r, "cuEventSynchronize", msg, msglen);
}

void pfcuda_event_destroy(struct pfcuda_dev *d, void *ev)
{
	if (!ev || push(d, NULL, 0) < 0)
		return;
	drv.event_destroy((CUevent)ev);
	pop();
}

int pfcuda_sync(struct pfcuda_dev *d, char *msg, size_t msglen)
{
	CUresult r;
	int rc;

	rc = push(d, msg, msglen);
	if (rc < 0)
		return rc;
	r = drv.ctx_synchronize();
	pop();
	return r == CUDA_SUCCESS ? 0 : cu_fail(r, "cuCtxSynchronize", msg, msglen);
}

int pfcuda_mem_info(struct pfcuda_dev *d, uint64_t *free_bytes, uint64_t *total_bytes, char *msg,
		    size_t msglen)
{
	size_t f = 0, t = 0;
	CUresult r;
	int rc;

	rc = push(d, msg, msglen);
	if (rc < 0)
		return rc;
	r = drv.mem_get_info(&f, &t);
	pop();
	if (r != CUDA_SUCCESS)
		return cu_fail(r, "cuMemGetInfo", msg, msglen);
	*free_bytes = f;
	*total_bytes = t;
	return 0;
}

int pfcuda_copy_dtoh(struct pfcuda_dev *d, void *dst, uint64_t src, size_t bytes, char *msg,
		     size_t msglen)
{
	CUresult r;
	int rc;

	rc = push(d, msg, msglen);
	if (rc < 0)
		return rc;
	r = drv.memcpy_dtoh(dst, (CUdeviceptr)src, bytes);
	pop();
	return r == CUDA_SUCCESS ? 0 : cu_fail(r, "cuMemcpyDtoH", msg, msglen);
}

int pfcuda_mem_alloc(struct pfcuda_dev *d, uint64_t bytes, uint64_t *devptr, char *msg,
		     size_t msglen)
{
	CUdeviceptr p = 0;
	CUresult r;
	int rc;

	*devptr = 0;
	if (!drv.mem_alloc || !drv.mem_free) {
		set_err(msg, msglen, "CUDA driver lacks cuMemAlloc/cuMemFree");
		return -EOPNOTSUPP;
	}
	rc = push(d, msg, msglen);
	if (rc < 0)
		return rc;
	r = drv.mem_alloc(&p, (size_t)bytes);
	pop();
	if (r != CUDA_SUCCESS)
		return cu_fail(r, "cuMemAlloc", msg, msglen);
	*devptr = (uint64_t)p;
	return 0;
}

int pfcuda_mem_free(struct pfcuda_dev *d, uint64_t devptr)
{
	CUresult r;
	int rc;

	if (!devptr)
		return 0;
	if (!drv.mem_free)
		return -EOPNOTSUPP;
	rc = push(d, NULL, 0);
	if (rc < 0)
		return rc;
	r = drv.mem_free((CUdeviceptr)devptr);
	pop();
	return cu_errno(r);
}

/* ---- the client's gather --------------------------------------------------- */

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
	CUresult r = drv.event_record(g->idle, g->stream);

	return r == CUDA_SUCCESS ? drv.event_synchronize(g->idle) : r;
}

int pfcuda_gather_open(struct pfcuda_dev *d, struct pfcuda_gather **out, char *msg, size_t msglen)
{
	struct pfcuda_gather *g;
	CUresult r = CUDA_SUCCESS;
	const char *what = "";
	int rc;

	*out = NULL;
	if (!drv.gather || !drv.mem_alloc) {
		set_err(msg, msglen, "the CUDA driver lacks the module and launch entry points");
		return -EOPNOTSUPP;
	}
	g = calloc(1, sizeof(*g));
	if (!g) {
		set_err(msg, msglen, "out of memory");
		return -ENOMEM;
	}
	g->d = d;
	rc = push(d, msg, msglen);
	if (rc < 0) {
		free(g);
		return rc;
	}
	if ((r = drv.module_load_data(&g->mod, pf_gather_fatbin)) != CUDA_SUCCESS)
		what = "cuModuleLoadData (the embedded gather kernel)";
	else if ((r = drv.module_get_function(&g->fn, g->mod, "pf_gather")) != CUDA_SUCCESS)
		what = "cuModuleGetFunction(pf_gather)";
	else if ((r = drv.stream_create(&g->stream, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS)
		what = "cuStreamCreate";
	else if ((r = drv.event_create(&g->idle, CU_EVENT_DISABLE_TIMING |
							 CU_EVENT_BLOCKING_SYNC)) != CUDA_SUCCESS)
		what = "cuEventCreate";
	/* Optional: without it every batch is a launch of its own. */
	if (r == CUDA_SUCCESS &&
	    drv.module_get_function(&g->fn_group, g->mod, "pf_gather_group") != CUDA_SUCCESS)
		g->fn_group = NULL;
	pop();
	if (r != CUDA_SUCCESS) {
		rc = cu_fail(r, what, msg, msglen);
		pfcuda_gather_close(g);
		return rc;
	}
	/* The bases array exists from the start: a launch before the first
	 * slab must see entry mode with no slab mapped, never bases == 0 (the
	 * kernel would take entry ids for addresses). */
	rc = push(d, msg, msglen);
	if (!rc) {
		rc = grow_bases(g, 64, msg, msglen);
		pop();
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
	if (push(g->d, NULL, 0) == 0) {
		if (g->stream) {
			if (g->idle)
				stream_idle(g);
			drv.stream_destroy(g->stream);
		}
		if (g->idle)
			drv.event_destroy(g->idle);
		if (g->dbases)
			drv.mem_free(g->dbases);
		if (g->hbases)
			drv.mem_free_host(g->hbases);
		if (g->staging)
			drv.mem_free_host(g->staging);
		if (g->mod)
			drv.module_unload(g->mod);
		pop();
	}
	free(g);
}

int pfcuda_gather_sync(struct pfcuda_gather *g, char *msg, size_t msglen)
{
	CUresult r;
	int rc = push(g->d, msg, msglen);

	if (rc < 0)
		return rc;
	r = stream_idle(g);
	pop();
	return r == CUDA_SUCCESS ? 0 : cu_fail(r, "cuEventSynchronize", msg, msglen);
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
	if ((r = drv.mem_alloc_host((void **)&h, cap * sizeof(*h))) != CUDA_SUCCESS)
		return cu_fail(r, "cuMemAllocHost", msg, msglen);
	if ((r = drv.mem_alloc(&dv, cap * sizeof(*h))) != CUDA_SUCCESS) {
		drv.mem_free_host(h);
		return cu_fail(r, "cuMemAlloc", msg, msglen);
	}
	memset(h, 0, cap * sizeof(*h));
	stream_idle(g);
	if (g->cap)
		memcpy(h, g->hbases, g->cap * sizeof(*h));
	r = drv.memcpy_htod_async(dv, h, cap * sizeof(*h), g->stream);
	if (r != CUDA_SUCCESS) {
		drv.mem_free(dv);
		drv.mem_free_host(h);
		return cu_fail(r, "cuMemcpyHtoDAsync", msg, msglen);
	}
	if (g->dbases)
		drv.mem_free(g->dbases);
	if (g->hbases)
		drv.mem_free_host(g->hbases);
	g->hbases = h;
	g->dbases = dv;
	g->cap = cap;
	return 0;
}

int pfcuda_gather_set_slab(struct pfcuda_gather *g, uint32_t slab, uint64_t base, char *msg,
			   size_t msglen)
{
	CUresult r;
	int rc = push(g->d, msg, msglen);

	if (rc < 0)
		return rc;
	if (slab >= g->cap) {
		rc = grow_bases(g, slab + 1, msg, msglen);
		if (rc < 0) {
			pop();
			return rc;
		}
	}
	/* Ordered before every later gather on the stream; the entry is
	 * changed again only after a pfcuda_gather_sync. */
	g->hbases[slab] = base;
	r = drv.memcpy_htod_async(g->dbases + slab * sizeof(uint64_t), &g->hbases[slab],
				  sizeof(uint64_t), g->stream);
	pop();
	return r == CUDA_SUCCESS ? 0 : cu_fail(r, "cuMemcpyHtoDAsync", msg, msglen);
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
	rc = push(g->d, msg, msglen);
	if (rc < 0)
		return rc;
	stream_idle(g); /* queued gathers read the old one */
	if (g->staging)
		drv.mem_free_host(g->staging);
	g->staging = NULL;
	g->staging_bytes = 0;
	r = drv.mem_alloc_host((void **)&g->staging, bytes);
	if (r == CUDA_SUCCESS) {
		/* Memory of cuMemAllocHost is mapped for every device with
		 * unified addressing (all that run our kernel). */
		what = "cuMemHostGetDevicePointer";
		r = drv.mem_host_get_device_pointer(&g->staging_dev, g->staging, 0);
		if (r != CUDA_SUCCESS) {
			drv.mem_free_host(g->staging);
			g->staging = NULL;
		}
	}
	pop();
	if (r != CUDA_SUCCESS)
		return cu_fail(r, what, msg, msglen);
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
	rc = push(g->d, msg, msglen);
	if (rc < 0)
		return rc;
	/* Inline indices are read from the pinned staging itself: one
	 * driver call less per batch than uploading them first. */
	if (ids_bytes)
		p->desc = g->staging_dev + (CUdeviceptr)((const uint8_t *)ids - g->staging);
	if (p->count)
		r = drv.launch_kernel(g->fn, p->count, 1, 1, GATHER_BLOCK, 1, 1, 0, g->stream, args,
				      NULL);
	if (r == CUDA_SUCCESS)
		r = drv.event_record((CUevent)event, g->stream);
	pop();
	return r == CUDA_SUCCESS ? 0 : cu_fail(r, "cuLaunchKernel(pf_gather)", msg, msglen);
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
	rc = push(g->d, msg, msglen);
	if (rc < 0)
		return rc;
	if (p->first[p->n])
		r = drv.launch_kernel(g->fn_group, p->first[p->n], 1, 1, GATHER_BLOCK, 1, 1, 0,
				      g->stream, args, NULL);
	/* One event for the launch, which its batches share: one record, and
	 * the trainer's stream waits on it once for all of them. */
	if (r == CUDA_SUCCESS)
		r = drv.event_record((CUevent)event, g->stream);
	pop();
	return r == CUDA_SUCCESS ? 0 : cu_fail(r, "cuLaunchKernel(pf_gather_group)", msg, msglen);
}

bool pfcuda_can_copy_from_host(struct pfcuda_dev *d)
{
	int ok = 0;

	/* The arenas are mapped read-only here, so they can be registered
	 * only with CU_MEMHOSTREGISTER_READ_ONLY, which not every system
	 * supports. */
	if (!drv.mem_host_register || !drv.mem_host_unregister || !drv.device_get_attribute ||
	    drv.device_get_attribute(&ok, CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED,
				     d->dev) != CUDA_SUCCESS)
		return false;
	return ok != 0;
}

int pfcuda_host_register(struct pfcuda_dev *d, void *p, size_t bytes, char *msg, size_t msglen)
{
	CUresult r;
	int rc;

	if (!drv.mem_host_register || !drv.mem_host_unregister) {
		set_err(msg, msglen, "the CUDA driver lacks cuMemHostRegister");
		return -EOPNOTSUPP;
	}
	rc = push(d, msg, msglen);
	if (rc < 0)
		return rc;
	/* Read-only: the daemon's arenas are mapped read-only here. */
	r = drv.mem_host_register(p, bytes,
				  CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_READ_ONLY);
	pop();
	return r == CUDA_SUCCESS ? 0 : cu_fail(r, "cuMemHostRegister", msg, msglen);
}

void pfcuda_host_unregister(struct pfcuda_dev *d, void *p)
{
	if (!drv.mem_host_unregister || push(d, NULL, 0) < 0)
		return;
	drv.mem_host_unregister(p);
	pop();
}

int pfcuda_gather_copy(struct pfcuda_gather *g, uint64_t dst, const void *src, size_t bytes,
		       void *event, void *event2, char *msg, size_t msglen)
{
	CUresult r;
	int rc = push(g->d, msg, msglen);

	if (rc < 0)
		return rc;
	r = drv.memcpy_htod_async((CUdeviceptr)dst, src, bytes, g->stream);
	if (r == CUDA_SUCCESS)
		r = drv.event_record((CUevent)event, g->stream);
	if (r == CUDA_SUCCESS && event2)
		r = drv.event_record((CUevent)event2, g->stream);
	pop();
	return r == CUDA_SUCCESS ? 0 : cu_fail(r, "cuMemcpyHtoDAsync", msg, msglen);
}

int pfcuda_stream_wait(struct pfcuda_dev *d, void *stream, void *event, char *msg, size_t msglen)
{
	CUresult r;
	int rc = push(d, msg, msglen);

	if (rc < 0)
		return rc;
	r = drv.stream_wait_event((CUstream)stream, (CUevent)event, 0);
	pop();
	return r == CUDA_SUCCESS ? 0 : cu_fail(r, "cuStreamWaitEvent", msg, msglen);
}

#else /* !PF_CUDA: built without the CUDA toolkit */

#include <unistd.h>

#define NO_CUDA(msg, len) (set_err(msg, len, "libprefetch was built without CUDA support"), -ENOSYS)

int pfcuda_open(int ordinal, struct pfcuda_dev **out, char *msg, size_t msglen)
{
	*out = NULL;
	return NO_CUDA(msg, msglen);
}

void pfcuda_close(struct pfcuda_dev *d)
{
}

int pfcuda_ordinal(const struct pfcuda_dev *d)
{
	return -1;
}

int pfcuda_pci_bus_id(struct pfcuda_dev *d, char *buf, size_t len, char *msg, size_t msglen)
{
	if (len)
		buf[0] = '\0';
	return NO_CUDA(msg, msglen);
}

int pfcuda_import_fd(struct pfcuda_dev *d, int fd, uint64_t bytes, struct pfcuda_arena *out,
		     char *msg, size_t msglen)
{
	memset(out, 0, sizeof(*out));
	if (fd >= 0)
		close(fd);
	return NO_CUDA(msg, msglen);
}

int pfcuda_import_legacy(struct pfcuda_dev *d, const uint8_t handle[PFCUDA_IPC_HANDLE_BYTES],
			 uint64_t bytes, struct pfcuda_arena *out, char *msg, size_t msglen)
{
	memset(out, 0, sizeof(*out));
	return NO_CUDA(msg, msglen);
}

int pfcuda_unmap(struct pfcuda_dev *d, struct pfcuda_arena *a, char *msg, size_t msglen)
{
	memset(a, 0, sizeof(*a));
	return 0;
}

int pfcuda_event_create(struct pfcuda_dev *d, void **ev, char *msg, size_t msglen)
{
	*ev = NULL;
	return NO_CUDA(msg, msglen);
}

int pfcuda_event_record(struct pfcuda_dev *d, void *ev, void *stream, char *msg, size_t msglen)
{
	return NO_CUDA(msg, msglen);
}

int pfcuda_event_query(struct pfcuda_dev *d, void *ev, char *msg, size_t msglen)
{
	return NO_CUDA(msg, msglen);
}

int pfcuda_event_sync(struct pfcuda_dev *d, void *ev, char *msg, size_t msglen)
{
	return NO_CUDA(msg, msglen);
}

void pfcuda_event_destroy(struct pfcuda_dev *d, void *ev)
{
}

int pfcuda_sync(struct pfcuda_dev *d, char *msg, size_t msglen)
{
	return NO_CUDA(msg, msglen);
}

int pfcuda_mem_info(struct pfcuda_dev *d, uint64_t *free_bytes, uint64_t *total_bytes, char *msg,
		    size_t msglen)
{
	return NO_CUDA(msg, msglen);
}

int pfcuda_copy_dtoh(struct pfcuda_dev *d, void *dst, uint64_t src, size_t bytes, char *msg,
		     size_t msglen)
{
	return NO_CUDA(msg, msglen);
}

int pfcuda_mem_alloc(struct pfcuda_dev *d, uint64_t bytes, uint64_t *devptr, char *msg,
		     size_t msglen)
{
	*devptr = 0;
	return NO_CUDA(msg, msglen);
}

int pfcuda_mem_free(struct pfcuda_dev *d, uint64_t devptr)
{
	return devptr ? -ENOSYS : 0;
}

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

int pfcuda_stream_wait(struct pfcuda_dev *d, void *stream, void *event, char *msg, size_t msglen)
{
	return NO_CUDA(msg, msglen);
}

int pfcuda_host_register(struct pfcuda_dev *d, void *p, size_t bytes, char *msg, size_t msglen)
{
	return NO_CUDA(msg, msglen);
}

void pfcuda_host_unregister(struct pfcuda_dev *d, void *p)
{
}

int pfcuda_gather_copy(struct pfcuda_gather *g, uint64_t dst, const void *src, size_t bytes,
		       void *event, void *event2, char *msg, size_t msglen)
{
	return NO_CUDA(msg, msglen);
}

bool pfcuda_can_copy_from_host(struct pfcuda_dev *d)
{
	return false;
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
