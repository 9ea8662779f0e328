/*
 * cuda_int.h — what libprefetch's CUDA files share: cuda.c (the driver, the
 * device's primary context, events, memory), cuda_ipc.c (the daemon's
 * memory in this process) and cuda_gather.c (the gather module and its
 * stream).  Not for the rest of the library, whose interface is pfcuda.h:
 * the unit tests' fake CUDA side (tests/mocks/pfcuda_fake.c) stands in for
 * all three files at once.  Calls go one way: cuda_ipc.c and cuda_gather.c
 * -> cuda.c.
 *
 * DESIGN: pfcuda_drv is written once, by cuda.c's loader under its
 * pthread_once, before the first device exists; every file reads it only
 * through a device pfcuda_open returned, so no lock is needed after that.
 */
#ifndef PF_CLIENT_CUDA_INT_H
#define PF_CLIENT_CUDA_INT_H

#include <stdbool.h>
#include <stddef.h>

#include "pfcuda.h"
#include "util.h"

#if PF_CUDA

#include <cuda.h> /* types only: the driver is dlopen'ed */
#include <cudaTypedefs.h>

struct pfcuda_dev {
	int ordinal;
	CUdevice dev;
	CUcontext ctx; /* retained primary context: released by pfcuda_close */
};

/* The driver's entry points.  Written once by cuda.c's loader under its
 * pthread_once, before pfcuda_open returns the first device; read-only
 * afterwards. */
struct pfcuda_driver {
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
};

extern struct pfcuda_driver pfcuda_drv;

/* Describes a failed driver call in msg and converts it. */
int pfcuda_fail(CUresult r, const char *what, char *msg, size_t len);
/* Makes d's primary context current for one call; pfcuda_pop() restores
 * the caller's. */
int pfcuda_push(struct pfcuda_dev *d, char *msg, size_t len);
void pfcuda_pop(void);

#else /* !PF_CUDA: built without the CUDA toolkit */

#define NO_CUDA(msg, len) (set_err(msg, len, "libprefetch was built without CUDA support"), -ENOSYS)

#endif
#endif
