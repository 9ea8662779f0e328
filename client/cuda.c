/*
 * cuda.c — libprefetch's CUDA side, its base: loads the driver, holds the
 * device's primary context, records, polls and waits for events, and
 * probes and allocates device memory.  The daemon's memory imported here is
 * cuda_ipc.c's, the client's gather cuda_gather.c's; both call this file
 * only (cuda_int.h).  Interface and error rules: pfcuda.h.
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
#include "cuda_int.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#if PF_CUDA

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>

#define DRIVER_ABI 12000

static pthread_once_t load_once = PTHREAD_ONCE_INIT;

struct pfcuda_driver pfcuda_drv;

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
int pfcuda_fail(CUresult r, const char *what, char *msg, size_t len)
{
	const char *str = NULL, *name = NULL;

	if (pfcuda_drv.get_error_string)
		pfcuda_drv.get_error_string(r, &str);
	if (pfcuda_drv.get_error_name)
		pfcuda_drv.get_error_name(r, &name);
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
			pfcuda_drv.field = (__typeof__(pfcuda_drv.field))fn;                       \
		}                                                                                  \
	} while (0)

	lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		pfcuda_drv.rc = -ENODEV;
		set_err(pfcuda_drv.msg, sizeof(pfcuda_drv.msg), "no CUDA driver: %s", dlerror());
		return;
	}
	get_proc = (PFN_cuGetProcAddress_v12000)dlsym(lib, "cuGetProcAddress_v2");
	pfcuda_drv.init = (PFN_cuInit_v2000)dlsym(lib, "cuInit");
	pfcuda_drv.get_error_string = (PFN_cuGetErrorString_v6000)dlsym(lib, "cuGetErrorString");
	pfcuda_drv.get_error_name = (PFN_cuGetErrorName_v6000)dlsym(lib, "cuGetErrorName");
	if (!get_proc || !pfcuda_drv.init) {
		pfcuda_drv.rc = -ENODEV;
		set_err(pfcuda_drv.msg, sizeof(pfcuda_drv.msg),
			"CUDA driver too old: libcuda.so.1 lacks cuGetProcAddress_v2 (need 12.0+)");
		return;
	}
	r = pfcuda_drv.init(0);
	if (r != CUDA_SUCCESS) {
		pfcuda_drv.rc = pfcuda_fail(r, "cuInit", pfcuda_drv.msg, sizeof(pfcuda_drv.msg));
		if (pfcuda_drv.rc == -EIO)
			pfcuda_drv.rc = -ENODEV; /* whatever the reason, there is no usable GPU */
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
		pfcuda_drv.rc = -EOPNOTSUPP;
		set_err(pfcuda_drv.msg, sizeof(pfcuda_drv.msg), "CUDA driver lacks %s", missing);
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
	pfcuda_drv.vmm = !missing;
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
	pfcuda_drv.gather = !missing;
	SYM(mem_host_register, "cuMemHostRegister");
	SYM(mem_host_unregister, "cuMemHostUnregister");
	SYM(device_get_attribute, "cuDeviceGetAttribute");
	pfcuda_drv.rc = 0;
#undef SYM
}

/* Makes d's primary context current for one call; pfcuda_pop() restores the
 * caller's. */
int pfcuda_push(struct pfcuda_dev *d, char *msg, size_t len)
{
	CUresult r = pfcuda_drv.ctx_push_current(d->ctx);

	return r == CUDA_SUCCESS ? 0 : pfcuda_fail(r, "cuCtxPushCurrent", msg, len);
}

void pfcuda_pop(void)
{
	CUcontext ctx;

	pfcuda_drv.ctx_pop_current(&ctx);
}

int pfcuda_open(int ordinal, struct pfcuda_dev **out, char *msg, size_t msglen)
{
	struct pfcuda_dev *d;
	CUdevice dev;
	CUresult r;
	int rc;

	*out = NULL;
	pthread_once(&load_once, load);
	if (pfcuda_drv.rc < 0) {
		set_err(msg, msglen, "%s", pfcuda_drv.msg);
		return pfcuda_drv.rc;
	}
	r = pfcuda_drv.device_get(&dev, ordinal);
	if (r != CUDA_SUCCESS)
		return pfcuda_fail(r, "cuDeviceGet", msg, msglen);
	d = calloc(1, sizeof(*d));
	if (!d) {
		set_err(msg, msglen, "out of memory");
		return -ENOMEM;
	}
	d->ordinal = ordinal;
	d->dev = dev;
	/* The primary context is the one the CUDA runtime (and so PyTorch)
	 * uses: pointers we map in it are valid in the trainer's tensors. */
	r = pfcuda_drv.primary_ctx_retain(&d->ctx, dev);
	if (r != CUDA_SUCCESS) {
		rc = pfcuda_fail(r, "cuDevicePrimaryCtxRetain", msg, msglen);
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
	pfcuda_drv.primary_ctx_release(d->dev);
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
	r = pfcuda_drv.device_get_pci_bus_id(buf, len > 64 ? 64 : (int)len, d->dev);
	if (r != CUDA_SUCCESS) {
		buf[0] = '\0';
		return pfcuda_fail(r, "cuDeviceGetPCIBusId", msg, msglen);
	}
	buf[len - 1] = '\0';
	return 0;
}

/* ---- events -------------------------------------------------------------- */

int pfcuda_event_create(struct pfcuda_dev *d, void **ev, char *msg, size_t msglen)
{
	CUevent e = NULL;
	CUresult r;
	int rc;

	*ev = NULL;
	rc = pfcuda_push(d, msg, msglen);
	if (rc < 0)
		return rc;
	/* Blocking sync: a lane (settle.c) or pf_close waiting for one
	 * sleeps until the GPU gets there instead of spinning a core. */
	r = pfcuda_drv.event_create(&e, CU_EVENT_DISABLE_TIMING | CU_EVENT_BLOCKING_SYNC);
	pfcuda_pop();
	if (r != CUDA_SUCCESS)
		return pfcuda_fail(r, "cuEventCreate", msg, msglen);
	*ev = e;
	return 0;
}

int pfcuda_event_record(struct pfcuda_dev *d, void *ev, void *stream, char *msg, size_t msglen)
{
	CUresult r;
	int rc;

	/* With a NULL stream the driver records on the legacy default stream
	 * of the current context, which must therefore be the primary one. */
	rc = pfcuda_push(d, msg, msglen);
	if (rc < 0)
		return rc;
	r = pfcuda_drv.event_record((CUevent)ev, (CUstream)stream);
	pfcuda_pop();
	return r == CUDA_SUCCESS ? 0 : pfcuda_fail(r, "cuEventRecord", msg, msglen);
}

int pfcuda_event_query(struct pfcuda_dev *d, void *ev, char *msg, size_t msglen)
{
	CUresult r;
	int rc;

	rc = pfcuda_push(d, msg, msglen);
	if (rc < 0)
		return rc;
	r = pfcuda_drv.event_query((CUevent)ev);
	pfcuda_pop();
	if (r == CUDA_SUCCESS)
		return 0;
	if (r == CUDA_ERROR_NOT_READY)
		return -EAGAIN;
	return pfcuda_fail(r, "cuEventQuery", msg, msglen);
}

int pfcuda_event_sync(struct pfcuda_dev *d, void *ev, char *msg, size_t msglen)
{
	CUresult r;
	int rc;

	rc = pfcuda_push(d, msg, msglen);
	if (rc < 0)
		return rc;
	r = pfcuda_drv.event_synchronize((CUevent)ev);
	pfcuda_pop();
	return r == CUDA_SUCCESS ? 0 : pfcuda_fail(r, "cuEventSynchronize", msg, msglen);
}

void pfcuda_event_destroy(struct pfcuda_dev *d, void *ev)
{
	if (!ev || pfcuda_push(d, NULL, 0) < 0)
		return;
	pfcuda_drv.event_destroy((CUevent)ev);
	pfcuda_pop();
}

int pfcuda_sync(struct pfcuda_dev *d, char *msg, size_t msglen)
{
	CUresult r;
	int rc;

	rc = pfcuda_push(d, msg, msglen);
	if (rc < 0)
		return rc;
	r = pfcuda_drv.ctx_synchronize();
	pfcuda_pop();
	return r == CUDA_SUCCESS ? 0 : pfcuda_fail(r, "cuCtxSynchronize", msg, msglen);
}

int pfcuda_stream_wait(struct pfcuda_dev *d, void *stream, void *event, char *msg, size_t msglen)
{
	CUresult r;
	int rc = pfcuda_push(d, msg, msglen);

	if (rc < 0)
		return rc;
	r = pfcuda_drv.stream_wait_event((CUstream)stream, (CUevent)event, 0);
	pfcuda_pop();
	return r == CUDA_SUCCESS ? 0 : pfcuda_fail(r, "cuStreamWaitEvent", msg, msglen);
}

/* ---- device memory ------------------------------------------------------- */

int pfcuda_mem_info(struct pfcuda_dev *d, uint64_t *free_bytes, uint64_t *total_bytes, char *msg,
		    size_t msglen)
{
	size_t f = 0, t = 0;
	CUresult r;
	int rc;

	rc = pfcuda_push(d, msg, msglen);
	if (rc < 0)
		return rc;
	r = pfcuda_drv.mem_get_info(&f, &t);
	pfcuda_pop();
	if (r != CUDA_SUCCESS)
		return pfcuda_fail(r, "cuMemGetInfo", msg, msglen);
	*free_bytes = f;
	*total_bytes = t;
	return 0;
}

int pfcuda_copy_dtoh(struct pfcuda_dev *d, void *dst, uint64_t src, size_t bytes, char *msg,
		     size_t msglen)
{
	CUresult r;
	int rc;

	rc = pfcuda_push(d, msg, msglen);
	if (rc < 0)
		return rc;
	r = pfcuda_drv.memcpy_dtoh(dst, (CUdeviceptr)src, bytes);
	pfcuda_pop();
	return r == CUDA_SUCCESS ? 0 : pfcuda_fail(r, "cuMemcpyDtoH", msg, msglen);
}

int pfcuda_mem_alloc(struct pfcuda_dev *d, uint64_t bytes, uint64_t *devptr, char *msg,
		     size_t msglen)
{
	CUdeviceptr p = 0;
	CUresult r;
	int rc;

	*devptr = 0;
	if (!pfcuda_drv.mem_alloc || !pfcuda_drv.mem_free) {
		set_err(msg, msglen, "CUDA driver lacks cuMemAlloc/cuMemFree");
		return -EOPNOTSUPP;
	}
	rc = pfcuda_push(d, msg, msglen);
	if (rc < 0)
		return rc;
	r = pfcuda_drv.mem_alloc(&p, (size_t)bytes);
	pfcuda_pop();
	if (r != CUDA_SUCCESS)
		return pfcuda_fail(r, "cuMemAlloc", msg, msglen);
	*devptr = (uint64_t)p;
	return 0;
}

int pfcuda_mem_free(struct pfcuda_dev *d, uint64_t devptr)
{
	CUresult r;
	int rc;

	if (!devptr)
		return 0;
	if (!pfcuda_drv.mem_free)
		return -EOPNOTSUPP;
	rc = pfcuda_push(d, NULL, 0);
	if (rc < 0)
		return rc;
	r = pfcuda_drv.mem_free((CUdeviceptr)devptr);
	pfcuda_pop();
	return cu_errno(r);
}

#else /* !PF_CUDA: built without the CUDA toolkit */

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

int pfcuda_stream_wait(struct pfcuda_dev *d, void *stream, void *event, char *msg, size_t msglen)
{
	return NO_CUDA(msg, msglen);
}
#endif
