/*
 * test_cuda_gather.c — the real gather kernel (gather.cu, through gpu.c's
 * gpu_gather) on a real GPU, held to the semantics that test_gather.c
 * checks on the fake back end.
 *
 * Pool records and staged rows are random bytes (seeded, so a failure
 * repeats), written to the device with gpu_copy_h2d; the slot is prefilled
 * with a marker byte.  After the gather the whole slot and the whole pool
 * come back with cudaMemcpy and are compared byte for byte with a reference
 * built on the host: every row of every field, the bytes between fields and
 * rows that must stay untouched, and the records that admissions overwrite
 * (and those they must not).  Field sizes 1, 4, 12, 256, 4096 and 65536
 * bytes in three layouts (16-byte aligned, 4-byte aligned only, odd
 * offsets) drive each of the kernel's three access widths.  One case times
 * the gather of 4 KiB rows against a plain device-to-device copy of the same
 * bytes and prints both.
 *
 * Linked with gpu.o, gather.o and log.o only: no daemon.  Without a usable
 * GPU (gpu_init fails, or a CUDA=0 build where gpu_none answers) every case
 * skips and says why; PF_REQUIRE_GPU=1 (make check-cuda) turns the skips
 * into failures.
 *
 * DESIGN: single-threaded; one stream on device 0, synchronised before
 * anything is read back.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#if PF_CUDA
#include <cuda_runtime_api.h>
#endif

#include "gpu/gpu.h"

#define MiB (1ull << 20)

static const uint32_t ROW_BYTES[] = {1, 4, 12, 256, 4096, 65536};
#define NFIELDS (sizeof(ROW_BYTES) / sizeof(ROW_BYTES[0]))

#define COUNT	300 /* rows of the batch: not a multiple of anything useful */
#define NSTAGED 40
#define NREC	512
#define MARKER	0xee /* slot bytes that no row may write */

static int gpu_rc = 1; /* 1: gpu_init not tried yet; else its result */
static char gpu_msg[256];

static bool gpu_required(void)
{
	const char *v = getenv("PF_REQUIRE_GPU");

	return v && *v && strcmp(v, "0");
}

static void need_gpu(void)
{
	if (gpu_rc == 1)
		gpu_rc = gpu_init(gpu_msg, sizeof(gpu_msg));
	if (gpu_rc > 0)
		return;
	if (gpu_required())
		fail_msg("PF_REQUIRE_GPU is set but there is no CUDA device: %s", gpu_msg);
	print_message("skipped: no CUDA device: %s\n", gpu_msg);
	skip();
}

/* Copies device memory back; the stream has been synchronised. */
static void copy_back(void *dst, uint64_t src, size_t bytes)
{
#if PF_CUDA
	cudaError_t e =
		cudaMemcpy(dst, (const void *)(uintptr_t)src, bytes, cudaMemcpyDeviceToHost);

	if (e != cudaSuccess)
		fail_msg("cudaMemcpy D2H of %zu bytes: %s", bytes, cudaGetErrorString(e));
#else
	fail_msg("built without CUDA: nothing to copy back");
#endif
}

static uint64_t rng_state;

static uint64_t rng(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static void fill_random(uint8_t *p, size_t n)
{
	size_t i = 0;

	for (; i + 8 <= n; i += 8) {
		uint64_t v = rng();

		memcpy(p + i, &v, 8);
	}
	for (; i < n; i++)
		p[i] = (uint8_t)rng();
}

static uint64_t align_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) / a * a;
}

/* Where each field goes.  skew 0: every offset 16-aligned (the 16-byte
 * path wherever the row size allows it); 4: offsets 4 past a multiple of
 * 16 (the 4-byte path); 1: odd offsets and an odd record stride (bytes). */
struct layout {
	uint64_t stride; /* of pool records */
	uint64_t slot_bytes, staged_bytes;
	struct gpu_gather g; /* offsets and sizes only */
};

static uint64_t place(uint64_t *end, uint64_t bytes, unsigned skew)
{
	uint64_t off = align_up(*end, 16) + skew;

	*end = off + bytes;
	return off;
}

static void layout_init(struct layout *l, uint32_t count, uint32_t nstaged, unsigned skew)
{
	uint64_t rec = 0, slot = 0, staged = 0;

	memset(l, 0, sizeof(*l));
	l->g.nfields = NFIELDS;
	l->g.count = count;
	l->g.nstaged = nstaged;
	for (uint32_t f = 0; f < NFIELDS; f++) {
		l->g.row_bytes[f] = ROW_BYTES[f];
		l->g.rec_off[f] = (uint32_t)place(&rec, ROW_BYTES[f], skew);
		l->g.slot_off[f] = place(&slot, (uint64_t)count * ROW_BYTES[f], skew);
		l->g.staged_off[f] = place(&staged, (uint64_t)nstaged * ROW_BYTES[f], skew);
	}
	l->stride = align_up(rec, 16) + skew;
	/* With no rows or no staged rows the region is empty, but the arena
	 * and the host image must exist all the same. */
	l->slot_bytes = slot > 16 ? slot : 16;
	l->staged_bytes = staged > 16 ? staged : 16;
}

/* The device side of one case, and its host images. */
struct rig {
	struct gpu_stream *s;
	struct gpu_mem pool, staged, slot, idx;
	uint8_t *pool_img, *staged_img; /* owned: what was copied to the device */
};

static struct rig rig;

static int teardown(void **state)
{
	gpu_stream_destroy(rig.s);
	gpu_mem_free(&rig.pool);
	gpu_mem_free(&rig.staged);
	gpu_mem_free(&rig.slot);
	gpu_mem_free(&rig.idx);
	free(rig.pool_img);
	free(rig.staged_img);
	memset(&rig, 0, sizeof(rig));
	rig.pool.export_fd = rig.staged.export_fd = rig.slot.export_fd = rig.idx.export_fd = -1;
	return 0;
}

static int setup(void **state)
{
	memset(&rig, 0, sizeof(rig));
	rig.pool.export_fd = rig.staged.export_fd = rig.slot.export_fd = rig.idx.export_fd = -1;
	return 0;
}

/* The slot is what a client maps, so it is exported as in production (an FD
 * arena), unless the driver cannot: then the daemon's own kind of memory. */
static void alloc_slot(uint64_t bytes)
{
	int rc = gpu_mem_alloc(0, bytes, GPU_IPC_FD, &rig.slot);

	if (rc == -EOPNOTSUPP)
		rc = gpu_mem_alloc(0, bytes, GPU_IPC_NONE, &rig.slot);
	assert_int_equal(rc, 0);
}

/* Fails with the place of the first difference.  where() names an offset
 * of the region (field, row, byte) for the message. */
static void expect_same(const char *what, const uint8_t *got, const uint8_t *want, uint64_t n,
			const struct layout *l,
			void (*where)(char *, size_t, const struct layout *, uint64_t))
{
	uint64_t bad = 0, first = 0;
	char place_of[128];

	for (uint64_t i = 0; i < n; i++)
		if (got[i] != want[i] && !bad++)
			first = i;
	if (!bad)
		return;
	where(place_of, sizeof(place_of), l, first);
	fail_msg("%s: %llu of %llu bytes differ, the first at %llu (%s): %#x, want %#x", what,
		 (unsigned long long)bad, (unsigned long long)n, (unsigned long long)first,
		 place_of, got[first], want[first]);
}

static void slot_place(char *buf, size_t len, const struct layout *l, uint64_t off)
{
	for (uint32_t f = 0; f < NFIELDS; f++) {
		uint64_t start = l->g.slot_off[f];

		if (off >= start && off < start + (uint64_t)l->g.count * ROW_BYTES[f]) {
			snprintf(buf, len, "row %llu field %u byte %llu",
				 (unsigned long long)((off - start) / ROW_BYTES[f]), f,
				 (unsigned long long)((off - start) % ROW_BYTES[f]));
			return;
		}
	}
	snprintf(buf, len, "between fields");
}

static void pool_place(char *buf, size_t len, const struct layout *l, uint64_t off)
{
	uint64_t in = off % l->stride;

	for (uint32_t f = 0; f < NFIELDS; f++) {
		if (in >= l->g.rec_off[f] && in < l->g.rec_off[f] + ROW_BYTES[f]) {
			snprintf(buf, len, "record %llu field %u byte %llu",
				 (unsigned long long)(off / l->stride), f,
				 (unsigned long long)(in - l->g.rec_off[f]));
			return;
		}
	}
	snprintf(buf, len, "record %llu, between fields", (unsigned long long)(off / l->stride));
}

/* Allocates the rig for layout l and nrec records, fills pool and staged
 * rows with random bytes and the slot with MARKER, all through the stream. */
static void rig_init(const struct layout *l, uint32_t nrec)
{
	uint64_t pool_bytes = (uint64_t)nrec * l->stride;
	uint8_t *marker;

	assert_int_equal(gpu_stream_create(0, &rig.s), 0);
	assert_int_equal(gpu_mem_alloc(0, pool_bytes, GPU_IPC_NONE, &rig.pool), 0);
	assert_int_equal(gpu_mem_alloc(0, l->staged_bytes, GPU_IPC_NONE, &rig.staged), 0);
	assert_int_equal(
		gpu_mem_alloc(0, (l->g.count + l->g.nstaged + 2) * 8ull, GPU_IPC_NONE, &rig.idx),
		0);
	alloc_slot(l->slot_bytes);
	assert_int_equal(rig.pool.kind, GPU_IPC_NONE);
	assert_int_equal(rig.pool.export_fd, -1);

	rig.pool_img = malloc(pool_bytes);
	rig.staged_img = malloc(l->staged_bytes);
	marker = malloc(l->slot_bytes);
	assert_non_null(rig.pool_img);
	assert_non_null(rig.staged_img);
	assert_non_null(marker);
	fill_random(rig.pool_img, pool_bytes);
	fill_random(rig.staged_img, l->staged_bytes);
	memset(marker, MARKER, l->slot_bytes);
	assert_int_equal(gpu_copy_h2d(rig.s, rig.pool.base, rig.pool_img, pool_bytes), 0);
	assert_int_equal(gpu_copy_h2d(rig.s, rig.staged.base, rig.staged_img, l->staged_bytes), 0);
	assert_int_equal(gpu_copy_h2d(rig.s, rig.slot.base, marker, l->slot_bytes), 0);
	assert_int_equal(gpu_stream_sync(rig.s), 0);
	free(marker);
}

static uint64_t rec_addr(const struct layout *l, uint64_t r)
{
	return rig.pool.base + r * l->stride;
}

/* One random batch on layout l: a quarter of the rows are staged, the rest
 * read random records (some more than once) of the pool's first half; every
 * third staged row is admitted into a record of the second half, the others
 * have admit 0.  Checks slot and pool against the host reference. */
static void gather_and_check(const struct layout *l, uint32_t nrec, uint64_t seed)
{
	const uint32_t count = l->g.count, nstaged = l->g.nstaged;
	uint64_t pool_bytes = (uint64_t)nrec * l->stride;
	uint64_t *idx = calloc(count + nstaged, 8);
	uint8_t *slot_ref = malloc(l->slot_bytes), *slot_got = malloc(l->slot_bytes);
	uint8_t *pool_ref = malloc(pool_bytes), *pool_got = malloc(pool_bytes);
	struct gpu_gather g = l->g;

	assert_non_null(idx);
	assert_non_null(slot_ref);
	assert_non_null(slot_got);
	assert_non_null(pool_ref);
	assert_non_null(pool_got);
	rng_state = seed;
	rig_init(l, nrec);

	memset(slot_ref, MARKER, l->slot_bytes);
	memcpy(pool_ref, rig.pool_img, pool_bytes);
	for (uint32_t i = 0; i < count; i++) {
		bool staged = nstaged && rng() % 4 == 0;
		uint64_t row = staged ? rng() % nstaged : rng() % (nrec / 2);

		idx[i] = staged ? GPU_GATHER_STAGED | row : rec_addr(l, row);
		for (uint32_t f = 0; f < NFIELDS; f++) {
			const uint8_t *src =
				staged ? rig.staged_img + l->g.staged_off[f] + row * ROW_BYTES[f]
				       : rig.pool_img + row * l->stride + l->g.rec_off[f];

			memcpy(slot_ref + l->g.slot_off[f] + (uint64_t)i * ROW_BYTES[f], src,
			       ROW_BYTES[f]);
		}
	}
	for (uint32_t k = 0; k < nstaged; k++) {
		/* Distinct records of the second half, which no row reads. */
		uint64_t r = nrec / 2 + (k * 7 + 3) % (nrec / 2);

		if (k % 3)
			continue;
		idx[count + k] = rec_addr(l, r);
		for (uint32_t f = 0; f < NFIELDS; f++)
			memcpy(pool_ref + r * l->stride + l->g.rec_off[f],
			       rig.staged_img + l->g.staged_off[f] + (uint64_t)k * ROW_BYTES[f],
			       ROW_BYTES[f]);
	}

	g.slot = rig.slot.base;
	g.staged = rig.staged.base;
	g.desc = rig.idx.base;
	g.admit = rig.idx.base + count * 8ull;
	/* desc and admit travel as they will in the daemon: an H2D queued just
	 * before the gather, with no wait between them. */
	assert_int_equal(gpu_copy_h2d(rig.s, rig.idx.base, idx, (count + nstaged) * 8ull), 0);
	assert_int_equal(gpu_gather(rig.s, &g), 0);
	assert_int_equal(gpu_stream_sync(rig.s), 0);

	copy_back(slot_got, rig.slot.base, l->slot_bytes);
	copy_back(pool_got, rig.pool.base, pool_bytes);
	expect_same("slot", slot_got, slot_ref, l->slot_bytes, l, slot_place);
	expect_same("pool", pool_got, pool_ref, pool_bytes, l, pool_place);

	free(idx);
	free(slot_ref);
	free(slot_got);
	free(pool_ref);
	free(pool_got);
}

static void aligned_rows_match_the_host_reference(void **state)
{
	struct layout l;

	need_gpu();
	layout_init(&l, COUNT, NSTAGED, 0);
	gather_and_check(&l, NREC, 1);
}

static void rows_aligned_to_4_bytes_match_the_host_reference(void **state)
{
	struct layout l;

	need_gpu();
	layout_init(&l, COUNT, NSTAGED, 4);
	gather_and_check(&l, NREC, 2);
}

static void rows_at_odd_offsets_match_the_host_reference(void **state)
{
	struct layout l;

	need_gpu();
	layout_init(&l, COUNT, NSTAGED, 1);
	gather_and_check(&l, NREC, 3);
}

static void batch_of_only_pool_hits_matches_the_host_reference(void **state)
{
	struct layout l;

	need_gpu();
	layout_init(&l, COUNT, 0, 0);
	gather_and_check(&l, NREC, 4);
}

static void call_of_only_admissions_fills_records_and_no_slot(void **state)
{
	struct layout l;

	need_gpu();
	/* count 0: the slot keeps its marker bytes, admissions still land. */
	layout_init(&l, 0, NSTAGED, 1);
	gather_and_check(&l, NREC, 5);
}

static void empty_and_malformed_gathers_are_refused_or_do_nothing(void **state)
{
	struct layout l;
	struct gpu_gather g;

	need_gpu();
	layout_init(&l, 4, 2, 0);
	rng_state = 6;
	rig_init(&l, 8);
	g = l.g;
	g.slot = rig.slot.base;
	g.staged = rig.staged.base;
	g.desc = rig.idx.base;
	g.admit = rig.idx.base + 32;

	g.nfields = GPU_GATHER_MAX_FIELDS + 1;
	assert_int_equal(gpu_gather(rig.s, &g), -EINVAL);
	g.nfields = NFIELDS;
	g.slot = 0;
	assert_int_equal(gpu_gather(rig.s, &g), -EINVAL);
	g.slot = rig.slot.base;
	g.admit = 0;
	assert_int_equal(gpu_gather(rig.s, &g), -EINVAL);
	g.count = 0;
	g.nstaged = 0;
	assert_int_equal(gpu_gather(rig.s, &g), 0);
	/* Nothing launched, nothing broken: the stream still works. */
	assert_int_equal(gpu_stream_sync(rig.s), 0);
}

/* Entry mode, as the client's gather runs it: the pool as two slabs of
 * NREC / 2 records, a third slab named but not mapped (base 0), a fourth
 * past nbases.  The same rows with 8-byte and with 4-byte entry ids
 * (desc32) give the same slot, rows naming the missing slabs skipped
 * (their marker bytes kept). */
static void entry_ids_of_4_bytes_gather_as_those_of_8_and_skip_slabs_not_mapped(void **state)
{
	const uint32_t half = NREC / 2, shift = 8;
	struct layout l;
	struct gpu_gather g;
	struct gpu_mem bases_mem;
	uint64_t wide[COUNT], bases[3];
	uint32_t narrow[COUNT];
	uint8_t *slot_ref, *slot_got;

	need_gpu();
	assert_true(half == 1u << shift);
	layout_init(&l, COUNT, 0, 0);
	rng_state = 7;
	rig_init(&l, NREC);
	assert_int_equal(gpu_mem_alloc(0, sizeof(bases), GPU_IPC_NONE, &bases_mem), 0);
	slot_ref = malloc(l.slot_bytes);
	slot_got = malloc(l.slot_bytes);
	assert_non_null(slot_ref);
	assert_non_null(slot_got);
	memset(slot_ref, MARKER, l.slot_bytes);
	for (uint32_t i = 0; i < COUNT; i++) {
		uint64_t r = rng() % NREC;

		wide[i] = r; /* record r: slab r >> shift, index r & (half - 1) */
		if (i % 7 == 3) {
			wide[i] = 2ull << shift | (r & (half - 1)); /* base 0 */
			continue;
		}
		if (i % 11 == 5) {
			wide[i] = 3ull << shift; /* past nbases */
			continue;
		}
		for (uint32_t f = 0; f < NFIELDS; f++)
			memcpy(slot_ref + l.g.slot_off[f] + (uint64_t)i * ROW_BYTES[f],
			       rig.pool_img + r * l.stride + l.g.rec_off[f], ROW_BYTES[f]);
	}
	for (uint32_t i = 0; i < COUNT; i++)
		narrow[i] = (uint32_t)wide[i];
	bases[0] = rig.pool.base;
	bases[1] = rig.pool.base + half * l.stride;
	bases[2] = 0;
	assert_int_equal(gpu_copy_h2d(rig.s, bases_mem.base, bases, sizeof(bases)), 0);
	g = l.g;
	g.slot = rig.slot.base;
	g.desc = rig.idx.base;
	g.bases = bases_mem.base;
	g.nbases = 3;
	g.slab_shift = shift;
	g.rec_stride = l.stride;
	for (int narrow_ids = 0; narrow_ids < 2; narrow_ids++) {
		uint8_t *marker = malloc(l.slot_bytes);

		assert_non_null(marker);
		memset(marker, MARKER, l.slot_bytes);
		assert_int_equal(gpu_copy_h2d(rig.s, rig.slot.base, marker, l.slot_bytes), 0);
		g.desc32 = (uint32_t)narrow_ids;
		assert_int_equal(gpu_copy_h2d(rig.s, rig.idx.base,
					      narrow_ids ? (void *)narrow : (void *)wide,
					      COUNT * (narrow_ids ? 4ull : 8ull)),
				 0);
		assert_int_equal(gpu_gather(rig.s, &g), 0);
		assert_int_equal(gpu_stream_sync(rig.s), 0);
		free(marker);
		copy_back(slot_got, rig.slot.base, l.slot_bytes);
		expect_same(narrow_ids ? "slot (4-byte ids)" : "slot (8-byte ids)", slot_got,
			    slot_ref, l.slot_bytes, &l, slot_place);
	}
	gpu_mem_free(&bases_mem);
	free(slot_ref);
	free(slot_got);
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The gather of one field of rb-byte rows from random records of a 512 MiB
 * pool into a 128 MiB slot, against cudaMemcpyAsync D2D of the same bytes
 * (contiguous: the best a copy can do).  Returns gather / copy speed. */
static double gather_speed_ratio(uint32_t rb)
{
	const uint64_t slot_bytes = 128 * MiB, pool_bytes = 512 * MiB;
	const uint32_t count = (uint32_t)(slot_bytes / rb), nrec = (uint32_t)(pool_bytes / rb);
	const int iters = 20;
	uint64_t *desc = malloc(count * 8ull);
	struct gpu_mem pool, slot, idx;
	struct gpu_stream *s;
	struct gpu_gather g;
	double t0, t_gather, t_copy;

	assert_non_null(desc);
	assert_int_equal(gpu_stream_create(0, &s), 0);
	assert_int_equal(gpu_mem_alloc(0, pool_bytes, GPU_IPC_NONE, &pool), 0);
	assert_int_equal(gpu_mem_alloc(0, slot_bytes, GPU_IPC_NONE, &slot), 0);
	assert_int_equal(gpu_mem_alloc(0, count * 8ull, GPU_IPC_NONE, &idx), 0);
	rng_state = rb;
	for (uint32_t i = 0; i < count; i++)
		desc[i] = pool.base + (rng() % nrec) * rb;
	assert_int_equal(gpu_copy_h2d(s, idx.base, desc, count * 8ull), 0);
	memset(&g, 0, sizeof(g));
	g.slot = slot.base;
	g.desc = idx.base;
	g.count = count;
	g.nfields = 1;
	g.row_bytes[0] = rb;

	for (int i = 0; i < 3; i++) {
		assert_int_equal(gpu_gather(s, &g), 0);
		assert_int_equal(gpu_copy_d2d(s, slot.base, pool.base, slot_bytes), 0);
	}
	assert_int_equal(gpu_stream_sync(s), 0);
	t0 = now_s();
	for (int i = 0; i < iters; i++)
		assert_int_equal(gpu_gather(s, &g), 0);
	assert_int_equal(gpu_stream_sync(s), 0);
	t_gather = now_s() - t0;
	t0 = now_s();
	for (int i = 0; i < iters; i++)
		assert_int_equal(
			gpu_copy_d2d(s, slot.base, pool.base + (i % 4) * slot_bytes, slot_bytes),
			0);
	assert_int_equal(gpu_stream_sync(s), 0);
	t_copy = now_s() - t0;

	print_message("gather of %6u B rows: %7.1f GB/s; D2D copy %7.1f GB/s; ratio %.2f\n", rb,
		      iters * slot_bytes / t_gather * 1e-9, iters * slot_bytes / t_copy * 1e-9,
		      t_copy / t_gather);
	gpu_stream_destroy(s);
	gpu_mem_free(&pool);
	gpu_mem_free(&slot);
	gpu_mem_free(&idx);
	free(desc);
	return t_copy / t_gather;
}

/* The pool exists to be faster than PCIe (~50 GB/s); a gather near copy
 * speed is the aim (see the printed ratio), and one below a quarter of it
 * means a broken access path (bytes where 16-byte accesses fit, say). */
static void gather_of_4k_rows_runs_near_copy_speed(void **state)
{
	double r4k;

	need_gpu();
	gather_speed_ratio(256);
	r4k = gather_speed_ratio(4096);
	gather_speed_ratio(65536);
	if (r4k < 0.25)
		fail_msg("the gather of 4 KiB rows ran at %.2f of copy speed", r4k);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(aligned_rows_match_the_host_reference, setup,
						teardown),
		cmocka_unit_test_setup_teardown(rows_aligned_to_4_bytes_match_the_host_reference,
						setup, teardown),
		cmocka_unit_test_setup_teardown(rows_at_odd_offsets_match_the_host_reference, setup,
						teardown),
		cmocka_unit_test_setup_teardown(batch_of_only_pool_hits_matches_the_host_reference,
						setup, teardown),
		cmocka_unit_test_setup_teardown(call_of_only_admissions_fills_records_and_no_slot,
						setup, teardown),
		cmocka_unit_test_setup_teardown(
			empty_and_malformed_gathers_are_refused_or_do_nothing, setup, teardown),
		cmocka_unit_test_setup_teardown(
			entry_ids_of_4_bytes_gather_as_those_of_8_and_skip_slabs_not_mapped, setup,
			teardown),
		cmocka_unit_test_setup_teardown(gather_of_4k_rows_runs_near_copy_speed, setup,
						teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
