/*
 * test_gpu_fake.c — the fake GPU back end keeps the contract of gpu.h, so
 * the daemon's unit tests, which run on it, can trust what they see:
 * accounting of arenas and memory, armed failures, asynchronous copies that
 * land only when an event says so, and FD arenas that really are shared.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "gpu/gpu.h"

#define MiB (1ull << 20)
#define GiB (1ull << 30)

static int setup(void **state)
{
	char desc[128];

	gpu_fake_reset();
	assert_int_equal(gpu_init(desc, sizeof(desc)), 1);
	return 0;
}

static int teardown(void **state)
{
	/* Every test frees what it allocates: a leak here is a test bug. */
	assert_int_equal(gpu_fake_live_allocs(), 0);
	assert_int_equal(gpu_fake_host_registrations(), 0);
	return 0;
}

static void fill(uint8_t *p, size_t n, uint8_t seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(i * 31 + seed);
}

static void nothing_works_before_init(void **state)
{
	struct gpu_stream *s = (void *)1;
	struct gpu_mem a;
	uint64_t f, t;

	gpu_fake_reset();
	assert_int_equal(gpu_device_count(), 0);
	assert_int_equal(gpu_stream_create(0, &s), -ENODEV);
	assert_null(s);
	assert_int_equal(gpu_mem_alloc(0, MiB, GPU_IPC_FD, &a), -ENODEV);
	assert_int_equal(a.export_fd, -1);
	assert_int_equal(gpu_mem_info(0, &f, &t), -ENODEV);
}

static void init_reports_devices_and_no_device_fails(void **state)
{
	char desc[128], name[64];

	gpu_fake_set_devices(3);
	assert_int_equal(gpu_init(desc, sizeof(desc)), 3);
	assert_non_null(strstr(desc, "3"));
	assert_int_equal(gpu_device_count(), 3);
	assert_int_equal(gpu_device_name(2, name, sizeof(name)), 0);
	assert_true(strlen(name) > 0);
	assert_int_equal(gpu_device_name(3, name, sizeof(name)), -ENODEV);

	assert_int_equal(gpu_device_pci_bus_id(2, name, sizeof(name)), 0);
	assert_int_equal(gpu_device_by_pci_bus_id(name), 2);
	assert_int_equal(gpu_device_by_pci_bus_id("0000:ff:00.0"), -ENODEV);
	assert_int_equal(gpu_device_by_pci_bus_id("cuda:0"), -ENODEV);

	gpu_fake_set_devices(0);
	assert_int_equal(gpu_init(desc, sizeof(desc)), -ENODEV);
	assert_true(strlen(desc) > 0);
	assert_int_equal(gpu_device_count(), 0);
}

static void arena_size_is_rounded_to_2mib(void **state)
{
	struct gpu_mem a;

	assert_int_equal(gpu_mem_alloc(0, 2 * MiB + 1, GPU_IPC_FD, &a), 0);
	assert_int_equal(a.bytes, 4 * MiB);
	assert_int_equal(a.dev, 0);
	assert_int_equal(a.kind, GPU_IPC_FD);
	assert_true(a.base != 0);
	assert_int_equal(a.base % 4096, 0);
	gpu_mem_free(&a);

	assert_int_equal(gpu_mem_alloc(0, 2 * MiB, GPU_IPC_LEGACY, &a), 0);
	assert_int_equal(a.bytes, 2 * MiB);
	gpu_mem_free(&a);
}

static void zero_byte_arena_is_refused(void **state)
{
	struct gpu_mem a;

	assert_int_equal(gpu_mem_alloc(0, 0, GPU_IPC_FD, &a), -EINVAL);
	assert_int_equal(gpu_mem_alloc(0, UINT64_MAX, GPU_IPC_FD, &a), -EINVAL);
	assert_int_equal(gpu_mem_alloc(1, MiB, GPU_IPC_FD, &a), -ENODEV);
	assert_int_equal(gpu_fake_live_allocs(), 0);
}

static void live_arenas_count_allocs_minus_frees(void **state)
{
	struct gpu_mem a[5];
	int i;

	for (i = 0; i < 5; i++) {
		assert_int_equal(gpu_mem_alloc(0, MiB, i % 2 ? GPU_IPC_LEGACY : GPU_IPC_FD, &a[i]),
				 0);
		assert_int_equal(gpu_fake_live_allocs(), i + 1);
	}
	for (i = 0; i < 5; i++) {
		gpu_mem_free(&a[i]);
		assert_int_equal(gpu_fake_live_allocs(), 4 - i);
		/* Freed arenas are zeroed, so a second free is harmless. */
		assert_int_equal(a[i].base, 0);
		assert_int_equal(a[i].export_fd, -1);
		gpu_mem_free(&a[i]);
		assert_int_equal(gpu_fake_live_allocs(), 4 - i);
	}
}

static void fail_next_allocs_fails_exactly_n_times(void **state)
{
	struct gpu_mem a[3];
	int i;

	gpu_fake_fail_next_allocs(3);
	for (i = 0; i < 3; i++) {
		assert_int_equal(gpu_mem_alloc(0, MiB, GPU_IPC_FD, &a[0]), -ENOMEM);
		assert_int_equal(a[0].export_fd, -1);
		assert_int_equal(a[0].base, 0);
	}
	assert_int_equal(gpu_fake_live_allocs(), 0);
	for (i = 0; i < 3; i++)
		assert_int_equal(gpu_mem_alloc(0, MiB, GPU_IPC_LEGACY, &a[i]), 0);
	assert_int_equal(gpu_fake_live_allocs(), 3);
	for (i = 0; i < 3; i++)
		gpu_mem_free(&a[i]);
}

static void failed_alloc_leaves_free_memory_untouched(void **state)
{
	struct gpu_mem a;
	uint64_t f, t;

	gpu_fake_set_mem(10 * MiB, 16 * MiB);
	gpu_fake_fail_next_allocs(1);
	assert_int_equal(gpu_mem_alloc(0, MiB, GPU_IPC_FD, &a), -ENOMEM);
	assert_int_equal(gpu_mem_info(0, &f, &t), 0);
	assert_int_equal(f, 10 * MiB);
	assert_int_equal(t, 16 * MiB);
}

static void mem_info_reports_the_set_figures_minus_live_arenas(void **state)
{
	struct gpu_mem a, b;
	uint64_t f, t;

	assert_int_equal(gpu_mem_info(0, &f, &t), 0);
	assert_int_equal(f, 80 * GiB);
	assert_int_equal(t, 80 * GiB);

	gpu_fake_set_mem(7 * GiB, 8 * GiB);
	assert_int_equal(gpu_mem_info(0, &f, &t), 0);
	assert_int_equal(f, 7 * GiB);
	assert_int_equal(t, 8 * GiB);

	assert_int_equal(gpu_mem_alloc(0, 3 * MiB, GPU_IPC_FD, &a), 0);
	assert_int_equal(gpu_mem_alloc(0, 2 * MiB, GPU_IPC_LEGACY, &b), 0);
	assert_int_equal(gpu_mem_info(0, &f, &t), 0);
	assert_int_equal(f, 7 * GiB - 6 * MiB);
	assert_int_equal(t, 8 * GiB);
	gpu_mem_free(&a);
	gpu_mem_free(&b);
	assert_int_equal(gpu_mem_info(0, &f, &t), 0);
	assert_int_equal(f, 7 * GiB);
}

static void alloc_larger_than_free_memory_is_enomem(void **state)
{
	struct gpu_mem a, b;

	gpu_fake_set_mem(5 * MiB, 8 * MiB);
	assert_int_equal(gpu_mem_alloc(0, 6 * MiB, GPU_IPC_FD, &a), -ENOMEM);
	assert_int_equal(gpu_mem_alloc(0, 4 * MiB, GPU_IPC_FD, &a), 0);
	/* Only 1 MiB is left: the next 2 MiB arena does not fit. */
	assert_int_equal(gpu_mem_alloc(0, 1, GPU_IPC_LEGACY, &b), -ENOMEM);
	gpu_mem_free(&a);
	assert_int_equal(gpu_mem_alloc(0, 1, GPU_IPC_LEGACY, &b), 0);
	gpu_mem_free(&b);
}

static void copy_lands_only_when_its_event_completes(void **state)
{
	struct gpu_stream *s;
	struct gpu_event *e;
	struct gpu_mem a;
	uint8_t src[4096];
	uint8_t *dev;

	assert_int_equal(gpu_stream_create(0, &s), 0);
	assert_int_equal(gpu_event_create(0, &e), 0);
	assert_int_equal(gpu_mem_alloc(0, MiB, GPU_IPC_FD, &a), 0);
	dev = (uint8_t *)(uintptr_t)a.base;
	fill(src, sizeof(src), 7);

	assert_int_equal(gpu_copy_h2d(s, a.base + 8192, src, sizeof(src)), 0);
	assert_int_equal(gpu_event_record(e, s), 0);
	/* Queued, not yet done: the arena still holds zeros. */
	assert_int_equal(dev[8192], 0);
	assert_int_equal(gpu_event_query(e), 0);
	assert_memory_equal(dev + 8192, src, sizeof(src));

	gpu_mem_free(&a);
	gpu_event_destroy(e);
	gpu_stream_destroy(s);
}

static void source_rewritten_before_the_event_is_what_lands(void **state)
{
	struct gpu_stream *s;
	struct gpu_event *e;
	struct gpu_mem a;
	uint8_t src[256], early[256];

	assert_int_equal(gpu_stream_create(0, &s), 0);
	assert_int_equal(gpu_event_create(0, &e), 0);
	assert_int_equal(gpu_mem_alloc(0, MiB, GPU_IPC_LEGACY, &a), 0);
	fill(src, sizeof(src), 1);
	memcpy(early, src, sizeof(src));

	assert_int_equal(gpu_copy_h2d(s, a.base, src, sizeof(src)), 0);
	assert_int_equal(gpu_event_record(e, s), 0);
	/* A daemon that reuses a ring slot before its copy retired must see
	 * corrupted data in tests, as it would on a GPU. */
	memset(src, 0xee, sizeof(src));
	assert_int_equal(gpu_event_sync(e), 0);
	assert_memory_equal((void *)(uintptr_t)a.base, src, sizeof(src));
	assert_memory_not_equal((void *)(uintptr_t)a.base, early, sizeof(early));

	gpu_mem_free(&a);
	gpu_event_destroy(e);
	gpu_stream_destroy(s);
}

static void event_completes_only_the_copies_before_it(void **state)
{
	struct gpu_stream *s;
	struct gpu_event *e1, *e2;
	struct gpu_mem a;
	uint8_t one[64], two[64];
	uint8_t *dev;

	assert_int_equal(gpu_stream_create(0, &s), 0);
	assert_int_equal(gpu_event_create(0, &e1), 0);
	assert_int_equal(gpu_event_create(0, &e2), 0);
	assert_int_equal(gpu_mem_alloc(0, MiB, GPU_IPC_FD, &a), 0);
	dev = (uint8_t *)(uintptr_t)a.base;
	memset(one, 1, sizeof(one));
	memset(two, 2, sizeof(two));

	assert_int_equal(gpu_copy_h2d(s, a.base, one, sizeof(one)), 0);
	assert_int_equal(gpu_event_record(e1, s), 0);
	assert_int_equal(gpu_copy_h2d(s, a.base + 64, two, sizeof(two)), 0);
	assert_int_equal(gpu_event_record(e2, s), 0);

	assert_int_equal(gpu_event_query(e1), 0);
	assert_memory_equal(dev, one, sizeof(one));
	assert_int_equal(dev[64], 0);
	assert_int_equal(gpu_event_query(e2), 0);
	assert_memory_equal(dev + 64, two, sizeof(two));

	gpu_mem_free(&a);
	gpu_event_destroy(e1);
	gpu_event_destroy(e2);
	gpu_stream_destroy(s);
}

static void event_delay_reports_pending_for_that_many_queries(void **state)
{
	struct gpu_stream *s;
	struct gpu_event *e;
	int i;

	assert_int_equal(gpu_stream_create(0, &s), 0);
	assert_int_equal(gpu_event_create(0, &e), 0);
	/* Never recorded: complete, as cudaEventQuery says. */
	assert_int_equal(gpu_event_query(e), 0);

	gpu_fake_set_event_delay(3);
	assert_int_equal(gpu_event_record(e, s), 0);
	for (i = 0; i < 3; i++)
		assert_int_equal(gpu_event_query(e), -EAGAIN);
	assert_int_equal(gpu_event_query(e), 0);
	assert_int_equal(gpu_event_query(e), 0);

	/* Re-recording arms it again; sync completes it at once. */
	assert_int_equal(gpu_event_record(e, s), 0);
	assert_int_equal(gpu_event_query(e), -EAGAIN);
	assert_int_equal(gpu_event_sync(e), 0);
	assert_int_equal(gpu_event_query(e), 0);

	gpu_event_destroy(e);
	gpu_stream_destroy(s);
}

static void event_and_stream_of_different_devices_are_refused(void **state)
{
	struct gpu_stream *s;
	struct gpu_event *e;
	char desc[64];

	gpu_fake_set_devices(2);
	assert_int_equal(gpu_init(desc, sizeof(desc)), 2);
	assert_int_equal(gpu_stream_create(0, &s), 0);
	assert_int_equal(gpu_event_create(1, &e), 0);
	assert_int_equal(gpu_event_record(e, s), -EINVAL);
	gpu_event_destroy(e);
	gpu_stream_destroy(s);
}

static void copy_outside_every_arena_is_efault(void **state)
{
	struct gpu_stream *s;
	struct gpu_mem a;
	uint8_t src[64] = {0};
	char desc[64];

	gpu_fake_set_devices(2);
	assert_int_equal(gpu_init(desc, sizeof(desc)), 2);
	assert_int_equal(gpu_stream_create(0, &s), 0);
	assert_int_equal(gpu_mem_alloc(0, MiB, GPU_IPC_FD, &a), 0);

	/* The last byte fits, one more does not. */
	assert_int_equal(gpu_copy_h2d(s, a.base + a.bytes - 64, src, 64), 0);
	assert_int_equal(gpu_copy_h2d(s, a.base + a.bytes - 63, src, 64), -EFAULT);
	assert_int_equal(gpu_copy_h2d(s, (uint64_t)(uintptr_t)src, src, 64), -EFAULT);
	assert_int_equal(gpu_copy_d2d(s, a.base, a.base + a.bytes, 1), -EFAULT);
	gpu_mem_free(&a);

	/* An arena of another device is not reachable from this stream. */
	assert_int_equal(gpu_mem_alloc(1, MiB, GPU_IPC_FD, &a), 0);
	assert_int_equal(gpu_copy_h2d(s, a.base, src, 64), -EFAULT);
	gpu_mem_free(&a);
	gpu_stream_destroy(s);
}

static void d2d_copy_moves_bytes_between_arenas(void **state)
{
	struct gpu_stream *s;
	struct gpu_event *e;
	struct gpu_mem a, b;
	uint8_t src[1000];

	assert_int_equal(gpu_stream_create(0, &s), 0);
	assert_int_equal(gpu_event_create(0, &e), 0);
	assert_int_equal(gpu_mem_alloc(0, MiB, GPU_IPC_FD, &a), 0);
	assert_int_equal(gpu_mem_alloc(0, MiB, GPU_IPC_LEGACY, &b), 0);
	fill(src, sizeof(src), 9);

	assert_int_equal(gpu_copy_h2d(s, a.base + 100, src, sizeof(src)), 0);
	assert_int_equal(gpu_copy_d2d(s, b.base + 5, a.base + 100, sizeof(src)), 0);
	assert_int_equal(gpu_event_record(e, s), 0);
	assert_int_equal(gpu_event_sync(e), 0);
	assert_memory_equal((void *)(uintptr_t)(b.base + 5), src, sizeof(src));

	gpu_mem_free(&a);
	gpu_mem_free(&b);
	gpu_event_destroy(e);
	gpu_stream_destroy(s);
}

static void stream_sync_and_arena_free_run_queued_copies(void **state)
{
	struct gpu_stream *s;
	struct gpu_mem a, b;
	uint8_t src[32];

	assert_int_equal(gpu_stream_create(0, &s), 0);
	assert_int_equal(gpu_mem_alloc(0, MiB, GPU_IPC_FD, &a), 0);
	assert_int_equal(gpu_mem_alloc(0, MiB, GPU_IPC_FD, &b), 0);
	memset(src, 0x5a, sizeof(src));

	assert_int_equal(gpu_copy_h2d(s, a.base, src, sizeof(src)), 0);
	assert_int_equal(gpu_stream_sync(s), 0);
	assert_memory_equal((void *)(uintptr_t)a.base, src, sizeof(src));

	/* Freeing another arena waits for the device, as cudaFree does. */
	assert_int_equal(gpu_copy_h2d(s, a.base + 64, src, sizeof(src)), 0);
	gpu_mem_free(&b);
	assert_memory_equal((void *)(uintptr_t)(a.base + 64), src, sizeof(src));

	gpu_mem_free(&a);
	gpu_stream_destroy(s);
}

static void fd_arena_is_shared_memory_behind_its_fd(void **state)
{
	struct gpu_stream *s;
	struct gpu_event *e;
	struct gpu_mem a;
	uint8_t src[512];
	uint8_t *peer;
	uint64_t bytes;
	int sv[2], fd;
	char byte = 'a';
	struct msghdr mh = {0};
	struct iovec iov = {&byte, 1};
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} ctl;
	struct cmsghdr *cm;

	assert_int_equal(gpu_stream_create(0, &s), 0);
	assert_int_equal(gpu_event_create(0, &e), 0);
	assert_int_equal(gpu_mem_alloc(0, 3 * MiB, GPU_IPC_FD, &a), 0);
	assert_true(a.export_fd >= 0);

	/* Pass the fd the way the session does, then close our copy. */
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	mh.msg_iov = &iov;
	mh.msg_iovlen = 1;
	mh.msg_control = ctl.buf;
	mh.msg_controllen = sizeof(ctl.buf);
	cm = CMSG_FIRSTHDR(&mh);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &a.export_fd, sizeof(int));
	assert_int_equal(sendmsg(sv[0], &mh, 0), 1);
	close(a.export_fd);
	a.export_fd = -1;

	memset(&mh, 0, sizeof(mh));
	mh.msg_iov = &iov;
	mh.msg_iovlen = 1;
	mh.msg_control = ctl.buf;
	mh.msg_controllen = sizeof(ctl.buf);
	assert_int_equal(recvmsg(sv[1], &mh, 0), 1);
	cm = CMSG_FIRSTHDR(&mh);
	assert_non_null(cm);
	memcpy(&fd, CMSG_DATA(cm), sizeof(int));
	peer = mmap(NULL, a.bytes, PROT_READ, MAP_SHARED, fd, 0);
	assert_true(peer != MAP_FAILED);
	close(fd);

	fill(src, sizeof(src), 3);
	assert_int_equal(gpu_copy_h2d(s, a.base + a.bytes - sizeof(src), src, sizeof(src)), 0);
	assert_int_equal(gpu_event_record(e, s), 0);
	assert_int_equal(gpu_event_query(e), 0);
	assert_memory_equal(peer + a.bytes - sizeof(src), src, sizeof(src));

	/* The peer's mapping outlives the daemon's free, as VMM memory does. */
	bytes = a.bytes;
	gpu_mem_free(&a);
	assert_memory_equal(peer + bytes - sizeof(src), src, sizeof(src));
	munmap(peer, bytes);
	close(sv[0]);
	close(sv[1]);
	gpu_event_destroy(e);
	gpu_stream_destroy(s);
}

static void legacy_handles_are_distinct_per_arena(void **state)
{
	struct gpu_mem a, b;

	assert_int_equal(gpu_mem_alloc(0, MiB, GPU_IPC_LEGACY, &a), 0);
	assert_int_equal(gpu_mem_alloc(0, MiB, GPU_IPC_LEGACY, &b), 0);
	assert_int_equal(a.export_fd, -1);
	assert_memory_not_equal(a.legacy_handle, b.legacy_handle, GPU_IPC_HANDLE_BYTES);
	gpu_mem_free(&a);
	gpu_mem_free(&b);
}

static void host_register_refuses_overlap_and_unknown_unregister(void **state)
{
	static char ring[3 * 4096];

	assert_int_equal(gpu_host_register(ring, 2 * 4096), 0);
	assert_int_equal(gpu_fake_host_registrations(), 1);
	assert_int_equal(gpu_host_register(ring + 4096, 2 * 4096), -EEXIST);
	assert_int_equal(gpu_host_unregister(ring + 4096), -ENOENT);
	assert_int_equal(gpu_host_unregister(ring), 0);
	assert_int_equal(gpu_host_unregister(ring), -ENOENT);
	assert_int_equal(gpu_fake_host_registrations(), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(nothing_works_before_init, setup, teardown),
		cmocka_unit_test_setup_teardown(init_reports_devices_and_no_device_fails, setup,
						teardown),
		cmocka_unit_test_setup_teardown(arena_size_is_rounded_to_2mib, setup, teardown),
		cmocka_unit_test_setup_teardown(zero_byte_arena_is_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(live_arenas_count_allocs_minus_frees, setup,
						teardown),
		cmocka_unit_test_setup_teardown(fail_next_allocs_fails_exactly_n_times, setup,
						teardown),
		cmocka_unit_test_setup_teardown(failed_alloc_leaves_free_memory_untouched, setup,
						teardown),
		cmocka_unit_test_setup_teardown(mem_info_reports_the_set_figures_minus_live_arenas,
						setup, teardown),
		cmocka_unit_test_setup_teardown(alloc_larger_than_free_memory_is_enomem, setup,
						teardown),
		cmocka_unit_test_setup_teardown(copy_lands_only_when_its_event_completes, setup,
						teardown),
		cmocka_unit_test_setup_teardown(source_rewritten_before_the_event_is_what_lands,
						setup, teardown),
		cmocka_unit_test_setup_teardown(event_completes_only_the_copies_before_it, setup,
						teardown),
		cmocka_unit_test_setup_teardown(event_delay_reports_pending_for_that_many_queries,
						setup, teardown),
		cmocka_unit_test_setup_teardown(event_and_stream_of_different_devices_are_refused,
						setup, teardown),
		cmocka_unit_test_setup_teardown(copy_outside_every_arena_is_efault, setup,
						teardown),
		cmocka_unit_test_setup_teardown(d2d_copy_moves_bytes_between_arenas, setup,
						teardown),
		cmocka_unit_test_setup_teardown(stream_sync_and_arena_free_run_queued_copies, setup,
						teardown),
		cmocka_unit_test_setup_teardown(fd_arena_is_shared_memory_behind_its_fd, setup,
						teardown),
		cmocka_unit_test_setup_teardown(legacy_handles_are_distinct_per_arena, setup,
						teardown),
		cmocka_unit_test_setup_teardown(
			host_register_refuses_overlap_and_unknown_unregister, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
