/*
 * test_pfcuda_fake.c — the fake CUDA side of libprefetch (tests/mocks/
 * pfcuda_fake.c) keeps the contract that test_client_cuda relies on: work
 * runs late, in stream order, after what it waits for; a gather reads a
 * slab when it runs, so one unmapped under it is a fault, never a read of
 * freed memory; busy trainer work holds its stream; imports share the
 * exporter's bytes.  Were any of this false, the client's tests could pass
 * on a client that faults on a GPU.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "gather.h"
#include "pfcuda.h"
#include "pfcuda_fake.h"

#define GRAN	   (2u << 20) /* the fake's allocation granularity */
#define REC_STRIDE 32
#define ROW_X	   16 /* field 0 of a record, at rec_off 0 */
#define ROW_Y	   8  /* field 1, at rec_off 16 */

struct rig {
	struct pfcuda_dev *d;
	struct pfcuda_gather *g;
	int memfd;		 /* the exporter's slab */
	uint8_t *slab;		 /* the exporter's mapping of it */
	struct pfcuda_arena map; /* the client's import */
	uint64_t slot;		 /* device memory for one batch */
};

static int setup(void **state)
{
	static struct rig r;

	pfcuda_fake_reset();
	memset(&r, 0, sizeof(r));
	assert_int_equal(pfcuda_open(0, &r.d, NULL, 0), 0);
	assert_int_equal(pfcuda_gather_open(r.d, &r.g, NULL, 0), 0);
	r.memfd = memfd_create("pf-fake-slab", MFD_CLOEXEC);
	assert_true(r.memfd >= 0);
	assert_int_equal(ftruncate(r.memfd, GRAN), 0);
	r.slab = mmap(NULL, GRAN, PROT_READ | PROT_WRITE, MAP_SHARED, r.memfd, 0);
	assert_true(r.slab != MAP_FAILED);
	/* Record i: x = 16 bytes of i, y = 8 bytes of 100 + i. */
	for (int i = 0; i < 64; i++) {
		memset(r.slab + i * REC_STRIDE, i, ROW_X);
		memset(r.slab + i * REC_STRIDE + 16, 100 + i, ROW_Y);
	}
	assert_int_equal(pfcuda_mem_alloc(r.d, 4096, &r.slot, NULL, 0), 0);
	*state = &r;
	return 0;
}

static int teardown(void **state)
{
	struct rig *r = *state;
	struct pfcuda_fake_counts n;

	pfcuda_mem_free(r->d, r->slot);
	pfcuda_unmap(r->d, &r->map, NULL, 0);
	pfcuda_gather_close(r->g);
	pfcuda_close(r->d);
	munmap(r->slab, GRAN);
	close(r->memfd);
	pfcuda_fake_counts(&n);
	/* Every test gives back what it maps and makes. */
	assert_int_equal(n.live_maps, 0);
	assert_int_equal(n.live_events, 0);
	return 0;
}

/* A batch layout: x at slot + 0, y at slot + 256, records as above,
 * entry ids slab << 6 | index. */
static struct gpu_gather layout(void)
{
	struct gpu_gather g;

	memset(&g, 0, sizeof(g));
	g.nfields = 2;
	g.slot_off[1] = 256;
	g.rec_off[1] = 16;
	g.row_bytes[0] = ROW_X;
	g.row_bytes[1] = ROW_Y;
	g.slab_shift = 6;
	g.rec_stride = REC_STRIDE;
	return g;
}

static void import_slab(struct rig *r, uint32_t id)
{
	int fd = dup(r->memfd);

	assert_int_equal(pfcuda_import_fd(r->d, fd, GRAN, &r->map, NULL, 0), 0);
	assert_int_equal(pfcuda_gather_set_slab(r->g, id, r->map.base, NULL, 0), 0);
}

/* Queues a gather of the entries into r->slot, the index in the staging. */
static void *launch(struct rig *r, const uint64_t *entries, uint32_t n, void *ev)
{
	struct gpu_gather g = layout();
	void *ids;

	assert_int_equal(pfcuda_gather_staging(r->g, 4096, &ids, NULL, 0), 0);
	memcpy(ids, entries, n * sizeof(uint64_t));
	g.slot = r->slot;
	g.count = n;
	assert_int_equal(pfcuda_gather_launch(r->g, &g, ids, n * sizeof(uint64_t), ev, NULL, 0), 0);
	return ids;
}

static const uint8_t *slot_bytes(const struct rig *r)
{
	return (const uint8_t *)(uintptr_t)r->slot;
}

static void gather_reading_an_unmapped_slab_is_a_fault_and_writes_nothing(void **state)
{
	struct rig *r = *state;
	const uint64_t entries[] = {3, 5};
	struct pfcuda_fake_counts n;
	void *ev;

	assert_int_equal(pfcuda_event_create(r->d, &ev, NULL, 0), 0);
	import_slab(r, 0);
	/* Waited for before the unmap (as drop_slab does): exact. */
	launch(r, entries, 2, ev);
	assert_int_equal(pfcuda_gather_sync(r->g, NULL, 0), 0);
	assert_int_equal(slot_bytes(r)[0], 3);
	assert_int_equal(slot_bytes(r)[ROW_X], 5);
	assert_int_equal(slot_bytes(r)[256], 103);
	/* Unmapped while the gather is still queued: it reads the slab when
	 * it runs, and by then the slab is gone. */
	memset((void *)(uintptr_t)r->slot, 0xEE, 512);
	launch(r, entries, 2, ev);
	assert_int_equal(pfcuda_unmap(r->d, &r->map, NULL, 0), 0);
	assert_int_equal(pfcuda_event_sync(r->d, ev, NULL, 0), 0);
	pfcuda_fake_counts(&n);
	assert_int_equal(n.faults, 2); /* one per row */
	assert_int_equal(n.rows_skipped, 0);
	assert_int_equal(slot_bytes(r)[0], 0xEE);
	assert_int_equal(slot_bytes(r)[256], 0xEE);
	pfcuda_event_destroy(r->d, ev);
}

static void row_of_a_slab_not_in_the_table_is_skipped_as_the_kernel_skips_it(void **state)
{
	struct rig *r = *state;
	const uint64_t entries[] = {2, 1ull << 6 | 2, 1000ull << 6};
	struct pfcuda_fake_counts n;
	void *ev;

	assert_int_equal(pfcuda_event_create(r->d, &ev, NULL, 0), 0);
	import_slab(r, 0);
	/* Slab 1 was never mapped (base 0); slab 1000 is past the table. */
	memset((void *)(uintptr_t)r->slot, 0xEE, 512);
	launch(r, entries, 3, ev);
	assert_int_equal(pfcuda_event_sync(r->d, ev, NULL, 0), 0);
	pfcuda_fake_counts(&n);
	assert_int_equal(n.rows_skipped, 2);
	assert_int_equal(n.faults, 0);
	assert_int_equal(slot_bytes(r)[0], 2);
	assert_int_equal(slot_bytes(r)[ROW_X], 0xEE);
	assert_int_equal(slot_bytes(r)[2 * ROW_X], 0xEE);
	pfcuda_event_destroy(r->d, ev);
}

static void work_runs_only_when_an_event_after_it_is_asked_about(void **state)
{
	struct rig *r = *state;
	struct pfcuda_fake_counts n;
	uint8_t *host = r->slab; /* the exporter's mapping stands for a host arena */
	void *ev;

	assert_int_equal(pfcuda_event_create(r->d, &ev, NULL, 0), 0);
	assert_int_equal(pfcuda_host_register(r->d, host, 4096, NULL, 0), 0);
	memset((void *)(uintptr_t)r->slot, 0, 64);
	pfcuda_fake_set_event_delay(2);
	assert_int_equal(
		pfcuda_gather_copy(r->g, r->slot, host + 7 * REC_STRIDE, 16, ev, NULL, NULL, 0), 0);
	assert_int_equal(pfcuda_fake_pending(), 1);
	assert_int_equal(slot_bytes(r)[0], 0);
	assert_int_equal(pfcuda_event_query(r->d, ev, NULL, 0), -EAGAIN);
	assert_int_equal(pfcuda_event_query(r->d, ev, NULL, 0), -EAGAIN);
	assert_int_equal(slot_bytes(r)[0], 0);
	assert_int_equal(pfcuda_event_query(r->d, ev, NULL, 0), 0);
	assert_int_equal(slot_bytes(r)[0], 7);
	pfcuda_fake_counts(&n);
	assert_int_equal(n.copies, 1);
	assert_int_equal(n.copies_run, 1);
	assert_int_equal(n.event_queries, 3);
	assert_int_equal(pfcuda_fake_pending(), 0);
	pfcuda_host_unregister(r->d, host);
	pfcuda_event_destroy(r->d, ev);
}

static void copy_from_memory_no_longer_registered_is_a_fault(void **state)
{
	struct rig *r = *state;
	struct pfcuda_fake_counts n;
	void *ev;

	assert_int_equal(pfcuda_event_create(r->d, &ev, NULL, 0), 0);
	assert_int_equal(pfcuda_host_register(r->d, r->slab, 4096, NULL, 0), 0);
	assert_int_equal(pfcuda_host_register(r->d, r->slab + 1024, 16, NULL, 0), -EEXIST);
	memset((void *)(uintptr_t)r->slot, 0, 64);
	assert_int_equal(
		pfcuda_gather_copy(r->g, r->slot, r->slab + REC_STRIDE, 16, ev, NULL, NULL, 0), 0);
	pfcuda_host_unregister(r->d, r->slab);
	assert_int_equal(pfcuda_event_query(r->d, ev, NULL, 0), 0);
	pfcuda_fake_counts(&n);
	assert_int_equal(n.faults, 1);
	assert_int_equal(slot_bytes(r)[0], 0);
	pfcuda_event_destroy(r->d, ev);
}

/* Set by unbusy_later once it has freed the token. */
static volatile bool unbusied;

/* A thread standing for the GPU: finishes the busy work 50 ms later. */
static void *unbusy_later(void *arg)
{
	usleep(50000);
	unbusied = true;
	pfcuda_fake_unbusy(*(int *)arg);
	return NULL;
}

static void trainer_stream_waits_for_the_gather_and_busy_work_holds_it(void **state)
{
	struct rig *r = *state;
	void *stream = (void *)0x5000; /* the trainer's handle */
	const uint64_t entries[] = {9};
	struct pfcuda_fake_counts n;
	uint8_t seen[ROW_X];
	void *gathered, *after;
	int token;

	assert_int_equal(pfcuda_event_create(r->d, &gathered, NULL, 0), 0);
	assert_int_equal(pfcuda_event_create(r->d, &after, NULL, 0), 0);
	import_slab(r, 0);
	memset(seen, 0, sizeof(seen));
	token = pfcuda_fake_busy(stream);
	assert_true(token > 0);
	launch(r, entries, 1, gathered);
	assert_int_equal(pfcuda_stream_wait(r->d, stream, gathered, NULL, 0), 0);
	assert_int_equal(pfcuda_fake_read(stream, seen, r->slot, sizeof(seen)), 0);
	assert_int_equal(pfcuda_event_record(r->d, after, stream, NULL, 0), 0);
	/* Held by the busy work: nothing past it runs, the gather neither
	 * (nothing else asked for it). */
	assert_int_equal(pfcuda_fake_stream_sync(stream), -EAGAIN);
	assert_int_equal(pfcuda_event_query(r->d, after, NULL, 0), -EAGAIN);
	pfcuda_fake_counts(&n);
	assert_int_equal(n.gathers_run, 0);
	assert_int_equal(seen[0], 0);
	pfcuda_fake_unbusy(token);
	/* The read runs after the gather it waits for. */
	assert_int_equal(pfcuda_event_query(r->d, after, NULL, 0), 0);
	assert_int_equal(seen[0], 9);
	pfcuda_fake_counts(&n);
	assert_int_equal(n.gathers_run, 1);
	assert_int_equal(n.busy_waits, 0);
	/* An event sync behind busy work sleeps until the work is done (as
	 * a release lane's does on a GPU), never finishing it early. */
	token = pfcuda_fake_busy(stream);
	assert_true(token > 0);
	assert_int_equal(pfcuda_event_record(r->d, after, stream, NULL, 0), 0);
	{
		pthread_t th;

		assert_int_equal(pthread_create(&th, NULL, unbusy_later, &token), 0);
		assert_int_equal(pfcuda_event_sync(r->d, after, NULL, 0), 0);
		pthread_join(th, NULL);
	}
	assert_true(unbusied);
	pfcuda_fake_counts(&n);
	assert_int_equal(n.busy_waits, 0);
	/* A context sync must get past busy work: it waits it out, and says
	 * so. */
	assert_true(pfcuda_fake_busy(stream) > 0);
	assert_int_equal(pfcuda_sync(r->d, NULL, 0), 0);
	pfcuda_fake_counts(&n);
	assert_int_equal(n.busy_waits, 1);
	pfcuda_event_destroy(r->d, gathered);
	pfcuda_event_destroy(r->d, after);
}

static void group_gather_builds_each_batch_from_its_own_index(void **state)
{
	struct rig *r = *state;
	struct gpu_gather_group p;
	struct pfcuda_fake_counts n;
	uint64_t *ids, slots[4];
	void *ev;

	import_slab(r, 2);
	assert_int_equal(pfcuda_event_create(r->d, &ev, NULL, 0), 0);
	assert_int_equal(pfcuda_gather_staging(r->g, 4096, (void **)&ids, NULL, 0), 0);
	/* Batch 0: entries 1, 2 of slab 2; batch 1 (at slot + 1024): 4, 5, 6. */
	ids[0] = 2 << 6 | 1;
	ids[1] = 2 << 6 | 2;
	ids[8] = 2 << 6 | 4;
	ids[9] = 2 << 6 | 5;
	ids[10] = 2 << 6 | 6;
	memset(&p, 0, sizeof(p));
	p.g = layout();
	p.n = 2;
	p.first[1] = 2;
	p.first[2] = 5;
	p.slot[0] = r->slot;
	p.slot[1] = r->slot + 1024;
	p.desc[0] = (uint64_t)(uintptr_t)ids;
	p.desc[1] = (uint64_t)(uintptr_t)(ids + 8);
	assert_true(pfcuda_gather_can_group(r->g));
	assert_int_equal(pfcuda_gather_launch_group(r->g, &p, ev, NULL, 0), 0);
	/* The one event marks the end of both batches. */
	assert_int_equal(pfcuda_event_query(r->d, ev, NULL, 0), 0);
	assert_int_equal(slot_bytes(r)[0], 1);
	assert_int_equal(slot_bytes(r)[ROW_X], 2);
	assert_int_equal(slot_bytes(r)[256 + ROW_Y], 102);
	assert_int_equal(slot_bytes(r)[1024], 4);
	assert_int_equal(slot_bytes(r)[1024 + 2 * ROW_X], 6);
	assert_int_equal(slot_bytes(r)[1024 + 256 + 2 * ROW_Y], 106);
	pfcuda_fake_counts(&n);
	assert_int_equal(n.group_launches, 1);
	assert_int_equal(n.group_batches, 2);
	assert_int_equal(n.launches, 0);
	assert_int_equal(n.faults + n.rows_skipped, 0);
	assert_int_equal(pfcuda_fake_gather_slots(slots, 4), 2);
	assert_true(slots[0] == r->slot && slots[1] == r->slot + 1024);
	/* An index outside the staging is a wild pointer on a GPU. */
	p.desc[1] = r->slot + 2048;
	assert_int_equal(pfcuda_gather_launch_group(r->g, &p, ev, NULL, 0), 0);
	assert_int_equal(pfcuda_gather_sync(r->g, NULL, 0), 0);
	pfcuda_fake_counts(&n);
	assert_int_equal(n.faults, 3);
	pfcuda_fake_set_group(0);
	assert_false(pfcuda_gather_can_group(r->g));
	assert_int_equal(pfcuda_gather_launch_group(r->g, &p, ev, NULL, 0), -EINVAL);
	pfcuda_event_destroy(r->d, ev);
}

/* desc32: each batch's index is 4-byte entry ids, read at that width, and
 * one that ends where the staging ends lies inside it (sized as 8-byte
 * entries it would not). */
static void group_gather_of_4_byte_ids_reads_each_index_at_its_width(void **state)
{
	struct rig *r = *state;
	struct gpu_gather_group p;
	struct pfcuda_fake_counts n;
	uint32_t *ids;
	void *ev;

	import_slab(r, 2);
	assert_int_equal(pfcuda_event_create(r->d, &ev, NULL, 0), 0);
	assert_int_equal(pfcuda_gather_staging(r->g, 4096, (void **)&ids, NULL, 0), 0);
	/* Batch 0: entries 1, 2 of slab 2; batch 1, its index the staging's
	 * last 12 bytes: 4, 5, 6. */
	ids[0] = 2 << 6 | 1;
	ids[1] = 2 << 6 | 2;
	ids[1021] = 2 << 6 | 4;
	ids[1022] = 2 << 6 | 5;
	ids[1023] = 2 << 6 | 6;
	memset(&p, 0, sizeof(p));
	p.g = layout();
	p.g.desc32 = 1;
	p.n = 2;
	p.first[1] = 2;
	p.first[2] = 5;
	p.slot[0] = r->slot;
	p.slot[1] = r->slot + 1024;
	p.desc[0] = (uint64_t)(uintptr_t)ids;
	p.desc[1] = (uint64_t)(uintptr_t)(ids + 1021);
	assert_int_equal(pfcuda_gather_launch_group(r->g, &p, ev, NULL, 0), 0);
	assert_int_equal(pfcuda_gather_sync(r->g, NULL, 0), 0);
	assert_int_equal(slot_bytes(r)[0], 1);
	assert_int_equal(slot_bytes(r)[ROW_X], 2);
	assert_int_equal(slot_bytes(r)[256 + ROW_Y], 102);
	assert_int_equal(slot_bytes(r)[1024], 4);
	assert_int_equal(slot_bytes(r)[1024 + 2 * ROW_X], 6);
	assert_int_equal(slot_bytes(r)[1024 + 256 + 2 * ROW_Y], 106);
	pfcuda_fake_counts(&n);
	assert_int_equal(n.group_batches, 2);
	assert_int_equal(n.faults + n.rows_skipped, 0);
	pfcuda_event_destroy(r->d, ev);
}

/* One batch launched alone with 4-byte ids reads them as such. */
static void gather_of_4_byte_ids_reads_them_at_their_width(void **state)
{
	struct rig *r = *state;
	struct gpu_gather g = layout();
	struct pfcuda_fake_counts n;
	uint32_t *ids;
	void *ev;

	import_slab(r, 1);
	assert_int_equal(pfcuda_event_create(r->d, &ev, NULL, 0), 0);
	assert_int_equal(pfcuda_gather_staging(r->g, 4096, (void **)&ids, NULL, 0), 0);
	ids[0] = 1 << 6 | 7;
	ids[1] = 1 << 6 | 3;
	ids[2] = 1 << 6 | 9;
	g.slot = r->slot;
	g.count = 3;
	g.desc32 = 1;
	assert_int_equal(pfcuda_gather_launch(r->g, &g, ids, 3 * sizeof(uint32_t), ev, NULL, 0), 0);
	assert_int_equal(pfcuda_event_sync(r->d, ev, NULL, 0), 0);
	assert_int_equal(slot_bytes(r)[0], 7);
	assert_int_equal(slot_bytes(r)[ROW_X], 3);
	assert_int_equal(slot_bytes(r)[2 * ROW_X], 9);
	assert_int_equal(slot_bytes(r)[256 + 2 * ROW_Y], 109);
	pfcuda_fake_counts(&n);
	assert_int_equal(n.faults + n.rows_skipped, 0);
	pfcuda_event_destroy(r->d, ev);
}

static void legacy_handle_opens_the_registered_memfd_shared(void **state)
{
	struct rig *r = *state;
	uint8_t handle[PFCUDA_IPC_HANDLE_BYTES];
	struct pfcuda_arena a;

	assert_int_equal(pfcuda_fake_ipc_handle(r->memfd, handle), 0);
	assert_int_equal(pfcuda_import_legacy(r->d, handle, GRAN, &a, NULL, 0), 0);
	assert_int_equal(a.kind, PFCUDA_ARENA_LEGACY);
	assert_int_equal(((uint8_t *)(uintptr_t)a.base)[REC_STRIDE * 4], 4);
	((uint8_t *)(uintptr_t)a.base)[1] = 0x42;
	assert_int_equal(r->slab[1], 0x42);
	assert_int_equal(pfcuda_unmap(r->d, &a, NULL, 0), 0);
	assert_int_equal(a.base, 0);
	/* A handle the fake never gave out opens nothing. */
	handle[20] ^= 0xff;
	assert_int_equal(pfcuda_import_legacy(r->d, handle, GRAN, &a, NULL, 0), -EIO);
	/* FD imports: whole granules only, and the fd is consumed. */
	assert_int_equal(pfcuda_import_fd(r->d, dup(r->memfd), 4096, &a, NULL, 0), -EINVAL);
	assert_int_equal(pfcuda_import_fd(r->d, -1, GRAN, &a, NULL, 0), -EBADF);
}

static void unmapped_device_address_is_never_mapped_again(void **state)
{
	struct rig *r = *state;
	uint64_t seen[8];

	for (int i = 0; i < 8; i++) {
		struct pfcuda_arena a;

		assert_int_equal(pfcuda_import_fd(r->d, dup(r->memfd), GRAN, &a, NULL, 0), 0);
		seen[i] = a.base;
		for (int j = 0; j < i; j++)
			assert_true(seen[j] != a.base);
		assert_int_equal(pfcuda_unmap(r->d, &a, NULL, 0), 0);
	}
	assert_int_equal(pfcuda_unmap(r->d, &(struct pfcuda_arena){.base = seen[0]}, NULL, 0),
			 -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(
			gather_reading_an_unmapped_slab_is_a_fault_and_writes_nothing, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			row_of_a_slab_not_in_the_table_is_skipped_as_the_kernel_skips_it, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			work_runs_only_when_an_event_after_it_is_asked_about, setup, teardown),
		cmocka_unit_test_setup_teardown(copy_from_memory_no_longer_registered_is_a_fault,
						setup, teardown),
		cmocka_unit_test_setup_teardown(
			trainer_stream_waits_for_the_gather_and_busy_work_holds_it, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			group_gather_of_4_byte_ids_reads_each_index_at_its_width, setup, teardown),
		cmocka_unit_test_setup_teardown(gather_of_4_byte_ids_reads_them_at_their_width,
						setup, teardown),
		cmocka_unit_test_setup_teardown(group_gather_builds_each_batch_from_its_own_index,
						setup, teardown),
		cmocka_unit_test_setup_teardown(legacy_handle_opens_the_registered_memfd_shared,
						setup, teardown),
		cmocka_unit_test_setup_teardown(unmapped_device_address_is_never_mapped_again,
						setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
