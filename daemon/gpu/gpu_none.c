/*
 * gpu_none.c — the GPU back end of builds without the CUDA toolkit (CUDA=0):
 * there are no devices, gpu_init says why, and every other call fails with
 * -ENODEV.  Such a prefetchd serves host sessions only.
 *
 * DESIGN: stateless, so any thread may call it.
 */
#include "gpu/gpu.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

int gpu_init(char *desc, size_t len)
{
	snprintf(desc, len, "built without CUDA");
	return -ENODEV;
}

int gpu_device_count(void)
{
	return 0;
}

int gpu_device_name(int dev, char *buf, size_t len)
{
	if (len)
		buf[0] = '\0';
	return -ENODEV;
}

int gpu_device_pci_bus_id(int dev, char *buf, size_t len)
{
	if (len)
		buf[0] = '\0';
	return -ENODEV;
}

int gpu_device_by_pci_bus_id(const char *bus_id)
{
	return -ENODEV;
}

int gpu_mem_info(int dev, uint64_t *free_bytes, uint64_t *total_bytes)
{
	return -ENODEV;
}

int gpu_host_register(void *p, size_t bytes)
{
	return -ENODEV;
}

int gpu_host_unregister(void *p)
{
	return -ENODEV;
}

int gpu_stream_create(int dev, struct gpu_stream **out)
{
	*out = NULL;
	return -ENODEV;
}

void gpu_stream_destroy(struct gpu_stream *s)
{
}

int gpu_stream_sync(struct gpu_stream *s)
{
	return -ENODEV;
}

int gpu_copy_h2d(struct gpu_stream *s, uint64_t dst, const void *src, size_t bytes)
{
	return -ENODEV;
}

int gpu_copy_d2d(struct gpu_stream *s, uint64_t dst, uint64_t src, size_t bytes)
{
	return -ENODEV;
}

int gpu_gather(struct gpu_stream *s, const struct gpu_gather *g)
{
	return -ENODEV;
}

int gpu_event_create(int dev, struct gpu_event **out)
{
	*out = NULL;
	return -ENODEV;
}

int gpu_event_record(struct gpu_event *e, struct gpu_stream *s)
{
	return -ENODEV;
}

int gpu_event_query(struct gpu_event *e)
{
	return -ENODEV;
}

int gpu_event_sync(struct gpu_event *e)
{
	return -ENODEV;
}

void gpu_event_destroy(struct gpu_event *e)
{
}

int gpu_mem_alloc(int dev, uint64_t bytes, enum gpu_ipc kind, struct gpu_mem *out)
{
	memset(out, 0, sizeof(*out));
	out->export_fd = -1;
	return -ENODEV;
}

void gpu_mem_free(struct gpu_mem *a)
{
	memset(a, 0, sizeof(*a));
	a->export_fd = -1;
}
