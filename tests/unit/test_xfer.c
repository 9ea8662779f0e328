/*
 * test_xfer.c — the per-GPU transfer thread on the fake GPU: arenas come
 * back from it allocated (or with the failure a full device gives), a copy
 * is reported done only once its event says the bytes landed, many copies
 * queued at once all land in order, stopping drains what was queued, and
 * memory given back (xfer_free_mem) is freed after the copies before it.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <uv.h>

#include "gpu/gpu.h"
#include "gpu/xfer.h"

#define MiB (1ull << 20)

/* What came back, in order. */
struct seen {
	struct xfer_job *jobs[64];
	int n;
};

static void on_done(struct xfer_job *job, void *arg)
{
	struct seen *s = arg;

	assert_true(s->n < 64);
	s->jobs[s->n++] = job;
}

/* Runs the loop until `want` jobs have come back (or 5 s pass). */
static void wait_for(uv_loop_t *loop, struct seen *s, int want)
{
	for (int i = 0; i < 5000 && s->n < want; i++) {
		uv_run(loop, UV_RUN_NOWAIT);
		if (s->n < want)
			usleep(1000);
	}
	assert_int_equal(s->n, want);
}

struct fixture {
	uv_loop_t loop;
	struct xfer *x;
	struct seen seen;
};

static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));
	char desc[128], err[200];

	gpu_fake_reset();
	assert_int_equal(gpu_init(desc, sizeof(desc)), 1);
	assert_int_equal(uv_loop_init(&f->loop), 0);
	assert_int_equal(xfer_start(&f->x, 0, &f->loop, on_done, &f->seen, err, sizeof(err)), 0);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;

	xfer_stop(f->x);
	uv_run(&f->loop, UV_RUN_DEFAULT);
	xfer_free(f->x);
	assert_int_equal(uv_loop_close(&f->loop), 0);
	for (int i = 0; i < f->seen.n; i++)
		free(f->seen.jobs[i]);
	assert_int_equal(gpu_fake_live_allocs(), 0);
	free(f);
	return 0;
}

static struct xfer_job *alloc_job(uint64_t bytes, bool fail)
{
	struct xfer_job *j = calloc(1, sizeof(*j));

	j->kind = XFER_ALLOC;
	j->bytes = bytes;
	j->ipc = GPU_IPC_FD;
	j->inject_enomem = fail;
	return j;
}

static void allocation_comes_back_with_an_exportable_arena(void **state)
{
	struct fixture *f = *state;
	struct xfer_job *j;

	xfer_submit(f->x, alloc_job(3 * MiB, false));
	wait_for(&f->loop, &f->seen, 1);
	j = f->seen.jobs[0];
	assert_int_equal(j->rc, 0);
	assert_true(j->mem.bytes >= 3 * MiB);
	assert_true(j->mem.export_fd >= 0);
	assert_int_equal(gpu_fake_live_allocs(), 1);
	xfer_free_mem(f->x, &j->mem);
}

static void a_full_device_is_reported_as_out_of_memory(void **state)
{
	struct fixture *f = *state;

	gpu_fake_set_mem(MiB, 80ull << 30);
	xfer_submit(f->x, alloc_job(64 * MiB, false));
	xfer_submit(f->x, alloc_job(2 * MiB, true)); /* the test hook */
	wait_for(&f->loop, &f->seen, 2);
	assert_int_equal(f->seen.jobs[0]->rc, -ENOMEM);
	assert_int_equal(f->seen.jobs[1]->rc, -ENOMEM);
	assert_non_null(strstr(f->seen.jobs[1]->err, "PREFETCHD_TEST_FAIL_ALLOCS"));
	assert_int_equal(gpu_fake_live_allocs(), 0);
}

static void copies_are_done_only_with_their_bytes_on_the_device(void **state)
{
	struct fixture *f = *state;
	enum { N = 32, SZ = 64 * 1024 };
	uint8_t *src = malloc((size_t)N * SZ);
	struct gpu_mem a;

	/* Events stay pending for a while: the thread must poll, not assume. */
	gpu_fake_set_event_delay(3);
	xfer_submit(f->x, alloc_job((uint64_t)N * SZ, false));
	wait_for(&f->loop, &f->seen, 1);
	a = f->seen.jobs[0]->mem;
	for (int i = 0; i < N; i++) {
		struct xfer_job *j = calloc(1, sizeof(*j));

		memset(src + (size_t)i * SZ, i + 1, SZ);
		j->kind = XFER_COPY;
		j->seq = (uint64_t)i;
		j->src = src + (size_t)i * SZ;
		j->dst = a.base + (uint64_t)i * SZ;
		j->bytes = SZ;
		xfer_submit(f->x, j);
	}
	wait_for(&f->loop, &f->seen, 1 + N);
	for (int i = 0; i < N; i++) {
		const struct xfer_job *j = f->seen.jobs[1 + i];
		const uint8_t *dev = (const uint8_t *)(uintptr_t)a.base + (size_t)i * SZ;

		assert_int_equal(j->rc, 0);
		assert_int_equal(j->seq, (uint64_t)i); /* retired in order */
		/* When it is reported, the copy has landed. */
		assert_int_equal(dev[0], i + 1);
		assert_int_equal(dev[SZ - 1], i + 1);
	}
	xfer_free_mem(f->x, &a);
	free(src);
}

static void a_copy_outside_every_arena_fails_without_scribbling(void **state)
{
	struct fixture *f = *state;
	uint8_t src[4096] = {0};
	struct xfer_job *j = calloc(1, sizeof(*j));

	j->kind = XFER_COPY;
	j->src = src;
	j->dst = 0x1000;
	j->bytes = sizeof(src);
	xfer_submit(f->x, j);
	wait_for(&f->loop, &f->seen, 1);
	assert_int_equal(f->seen.jobs[0]->rc, -EFAULT);
	assert_non_null(strstr(f->seen.jobs[0]->err, "copy to the device failed"));
}

static void stopping_drains_queued_copies_and_frees(void **state)
{
	struct fixture *f = *state;
	uint8_t *src = malloc(MiB);
	struct gpu_mem a;

	xfer_submit(f->x, alloc_job(2 * MiB, false));
	wait_for(&f->loop, &f->seen, 1);
	a = f->seen.jobs[0]->mem;
	memset(src, 7, MiB);
	gpu_fake_set_event_delay(5);
	for (int i = 0; i < 2; i++) {
		struct xfer_job *j = calloc(1, sizeof(*j));

		j->kind = XFER_COPY;
		j->src = src;
		j->dst = a.base + (uint64_t)i * MiB;
		j->bytes = MiB;
		xfer_submit(f->x, j);
	}
	xfer_free_mem(f->x, &a);
	/* Stop at once: both copies still come back, the arena is freed. */
	xfer_stop(f->x);
	assert_int_equal(f->seen.n, 3);
	assert_int_equal(f->seen.jobs[1]->rc, 0);
	assert_int_equal(f->seen.jobs[2]->rc, 0);
	assert_int_equal(gpu_fake_live_allocs(), 0);
	/* After the stop, a new job comes back at once, cancelled. */
	xfer_submit(f->x, alloc_job(MiB, false));
	assert_int_equal(f->seen.n, 4);
	assert_int_equal(f->seen.jobs[3]->rc, -ECANCELED);
	uv_run(&f->loop, UV_RUN_DEFAULT);
	xfer_free(f->x);
	assert_int_equal(uv_loop_close(&f->loop), 0);
	for (int i = 0; i < f->seen.n; i++)
		free(f->seen.jobs[i]);
	free(src);
	free(f);
	*state = NULL;
}

static void memory_given_back_after_the_stop_is_freed_at_once(void **state)
{
	struct fixture *f = *state;
	struct gpu_mem a, zero = {.export_fd = -1};

	xfer_submit(f->x, alloc_job(2 * MiB, false));
	wait_for(&f->loop, &f->seen, 1);
	a = f->seen.jobs[0]->mem;
	/* It carries the job that frees it: giving it back cannot fail. */
	assert_non_null(a.release);
	xfer_stop(f->x);
	assert_int_equal(gpu_fake_live_allocs(), 1);
	xfer_free_mem(f->x, &a);
	assert_int_equal(gpu_fake_live_allocs(), 0);
	assert_int_equal(a.base, 0);
	assert_null(a.release);
	/* A zeroed one is a no-op. */
	xfer_free_mem(f->x, &zero);
	uv_run(&f->loop, UV_RUN_DEFAULT);
	xfer_free(f->x);
	assert_int_equal(uv_loop_close(&f->loop), 0);
	free(f->seen.jobs[0]);
	free(f);
	*state = NULL;
}

static int teardown_unless_done(void **state)
{
	return *state ? teardown(state) : 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(allocation_comes_back_with_an_exportable_arena,
						setup, teardown),
		cmocka_unit_test_setup_teardown(a_full_device_is_reported_as_out_of_memory, setup,
						teardown),
		cmocka_unit_test_setup_teardown(copies_are_done_only_with_their_bytes_on_the_device,
						setup, teardown),
		cmocka_unit_test_setup_teardown(a_copy_outside_every_arena_fails_without_scribbling,
						setup, teardown),
		cmocka_unit_test_setup_teardown(stopping_drains_queued_copies_and_frees, setup,
						teardown_unless_done),
		cmocka_unit_test_setup_teardown(memory_given_back_after_the_stop_is_freed_at_once,
						setup, teardown_unless_done),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
