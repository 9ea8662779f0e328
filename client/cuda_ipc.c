/*
 * cuda_ipc.c — the daemon's memory in the trainer's process: device arenas
 * imported by POSIX fd (cuMemImportFromShareableHandle and a mapping of
 * our own) or by legacy IPC handle (cuIpcOpenMemHandle), unmapped again;
 * and host arenas page-locked, read-only, for the copy engine of a client
 * that copies its batches itself.  Interface and error rules: pfcuda.h.
 *
 * Everything is mapped in the device's primary context, the one the CUDA
 * runtime (and so PyTorch) uses, so the pointers are valid in the
 * trainer's tensors.
 *
 * DESIGN: called from the thread that owns the pf_client; no locks.  Each
 * call pushes the primary context for its duration (cuda.c) and reads the
 * driver table, written once before the first device existed.
 */
#include "cuda_int.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

#if PF_CUDA

_Static_assert(sizeof(CUipcMemHandle) == PFCUDA_IPC_HANDLE_BYTES, "IPC handle size changed");

/* ---- device arenas ------------------------------------------------------- */

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
	if (!pfcuda_drv.vmm) {
		set_err(msg, msglen, "CUDA driver has no VMM entry points: use ipc legacy");
		rc = -EOPNOTSUPP;
		goto out;
	}
	rc = pfcuda_push(d, msg, msglen);
	if (rc < 0)
		goto out;
	pushed = true;

	memset(&prop, 0, sizeof(prop));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = d->dev;
	r = pfcuda_drv.mem_get_allocation_granularity(&gran, &prop,
						      CU_MEM_ALLOC_GRANULARITY_MINIMUM);
	if (r != CUDA_SUCCESS) {
		rc = pfcuda_fail(r, "cuMemGetAllocationGranularity", msg, msglen);
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
	r = pfcuda_drv.mem_import_from_shareable_handle(&h, (void *)(uintptr_t)fd,
							CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	if (r != CUDA_SUCCESS) {
		rc = pfcuda_fail(r, "cuMemImportFromShareableHandle", msg, msglen);
		goto out;
	}
	imported = true;
	r = pfcuda_drv.mem_address_reserve(&va, bytes, 0, 0, 0);
	if (r != CUDA_SUCCESS) {
		rc = pfcuda_fail(r, "cuMemAddressReserve", msg, msglen);
		goto out;
	}
	reserved = true;
	r = pfcuda_drv.mem_map(va, bytes, 0, h, 0);
	if (r != CUDA_SUCCESS) {
		rc = pfcuda_fail(r, "cuMemMap", msg, msglen);
		goto out;
	}
	mapped = true;
	memset(&access, 0, sizeof(access));
	access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	access.location.id = d->dev;
	access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	r = pfcuda_drv.mem_set_access(va, bytes, &access, 1);
	if (r != CUDA_SUCCESS) {
		rc = pfcuda_fail(r, "cuMemSetAccess", msg, msglen);
		goto out;
	}
	out->kind = PFCUDA_ARENA_FD;
	out->base = (uint64_t)va;
	out->bytes = bytes;
out:
	if (rc < 0) {
		if (mapped)
			pfcuda_drv.mem_unmap(va, bytes);
		if (reserved)
			pfcuda_drv.mem_address_free(va, bytes);
	}
	/* Every import pairs with a release; the mapping alone keeps the
	 * memory alive until pfcuda_unmap. */
	if (imported)
		pfcuda_drv.mem_release(h);
	if (pushed)
		pfcuda_pop();
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
	rc = pfcuda_push(d, msg, msglen);
	if (rc < 0)
		return rc;
	/* The only flag the driver accepts; it also lets the mapping reach a
	 * peer device should the arena live on another GPU. */
	r = pfcuda_drv.ipc_open_mem_handle(&p, ipc, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
	pfcuda_pop();
	if (r != CUDA_SUCCESS)
		return pfcuda_fail(r, "cuIpcOpenMemHandle", msg, msglen);
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
	rc = pfcuda_push(d, msg, msglen);
	if (rc < 0)
		return rc;
	if (a->kind == PFCUDA_ARENA_FD) {
		what = "cuMemUnmap";
		r = pfcuda_drv.mem_unmap((CUdeviceptr)a->base, a->bytes);
		if (r == CUDA_SUCCESS) {
			what = "cuMemAddressFree";
			r = pfcuda_drv.mem_address_free((CUdeviceptr)a->base, a->bytes);
		}
	} else {
		what = "cuIpcCloseMemHandle";
		r = pfcuda_drv.ipc_close_mem_handle((CUdeviceptr)a->base);
	}
	pfcuda_pop();
	memset(a, 0, sizeof(*a));
	return r == CUDA_SUCCESS ? 0 : pfcuda_fail(r, what, msg, msglen);
}

/* ---- host arenas --------------------------------------------------------- */

bool pfcuda_can_copy_from_host(struct pfcuda_dev *d)
{
	int ok = 0;

	/* The arenas are mapped read-only here, so they can be registered
	 * only with CU_MEMHOSTREGISTER_READ_ONLY, which not every system
	 * supports. */
	if (!pfcuda_drv.mem_host_register || !pfcuda_drv.mem_host_unregister ||
	    !pfcuda_drv.device_get_attribute ||
	    pfcuda_drv.device_get_attribute(&ok,
					    CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED,
					    d->dev) != CUDA_SUCCESS)
		return false;
	return ok != 0;
}

int pfcuda_host_register(struct pfcuda_dev *d, void *p, size_t bytes, char *msg, size_t msglen)
{
	CUresult r;
	int rc;

	if (!pfcuda_drv.mem_host_register || !pfcuda_drv.mem_host_unregister) {
		set_err(msg, msglen, "the CUDA driver lacks cuMemHostRegister");
		return -EOPNOTSUPP;
	}
	rc = pfcuda_push(d, msg, msglen);
	if (rc < 0)
		return rc;
	/* Read-only: the daemon's arenas are mapped read-only here. */
	r = pfcuda_drv.mem_host_register(
		p, bytes, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_READ_ONLY);
	pfcuda_pop();
	return r == CUDA_SUCCESS ? 0 : pfcuda_fail(r, "cuMemHostRegister", msg, msglen);
}

void pfcuda_host_unregister(struct pfcuda_dev *d, void *p)
{
	if (!pfcuda_drv.mem_host_unregister || pfcuda_push(d, NULL, 0) < 0)
		return;
	pfcuda_drv.mem_host_unregister(p);
	pfcuda_pop();
}

#else /* !PF_CUDA: built without the CUDA toolkit */

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

int pfcuda_host_register(struct pfcuda_dev *d, void *p, size_t bytes, char *msg, size_t msglen)
{
	return NO_CUDA(msg, msglen);
}

void pfcuda_host_unregister(struct pfcuda_dev *d, void *p)
{
}

bool pfcuda_can_copy_from_host(struct pfcuda_dev *d)
{
	return false;
}
#endif
