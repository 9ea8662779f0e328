/*
 * test_gather.c — gpu_gather, the VRAM pool's batch assembly, as the fake
 * back end runs it: the bytes of every row of every field come from the
 * record or staged row that desc names, admissions land in their records,
 * and the gather is ordered with the copies around it on its stream.  The
 * real kernel is held to the same semantics by test_cuda_gather.c.
 *
 * The fake's device addresses are host addresses, so the tests write pool
 * records directly and read slots back directly, except where the point is
 * the order of queued work.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpu/gpu.h"

#define MiB (1ull << 20)

#define NREC	64 /* pool records */
#define COUNT	32 /* rows of the batch */
#define NSTAGED 8  /* staged rows */

/* The fields of a sample: a label, a small vector, a token row, an image
 * row; their sizes exercise 4-byte, odd-multiple and large copies. */
static const uint32_t ROW_BYTES[] = {4, 12, 256, 4096};
#define NFIELDS (sizeof(ROW_BYTES) / sizeof(ROW_BYTES[0]))

/* Where the bytes come from, for the reference. */
#define FROM_POOL   1
#define FROM_STAGED 2

struct fx {
	struct gpu_stream *s;
	struct gpu_mem pool;   /* NREC records of stride bytes */
	struct gpu_mem staged; /* NSTAGED staged rows, packed per field */
	struct gpu_mem slot;   /* the batch */
	struct gpu_mem idx;    /* desc (COUNT) then admit (NSTAGED) */
	uint64_t stride;
	struct gpu_gather g;
};

static struct fx fx;

/* Byte b of field f of record or staged row `row`: distinct for every
 * (source, row, field, byte) that a test compares. */
static uint8_t pattern(int from, uint64_t row, uint32_t f, uint64_t b)
{
	uint64_t x = (uint64_t)from * 0x9e3779b97f4a7c15ull ^ row * 0xbf58476d1ce4e5b9ull ^
		     (uint64_t)f * 0x94d049bb133111ebull ^ b * 0x2545f4914f6cdd1dull;

	x ^= x >> 29;
	x *= 0xbf58476d1ce4e5b9ull;
	return (uint8_t)(x >> 56);
}

static uint64_t align_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) / a * a;
}

static uint64_t record(uint64_t r)
{
	return fx.pool.base + r * fx.stride;
}

static uint8_t *host(uint64_t dev_addr)
{
	return (uint8_t *)(uintptr_t)dev_addr;
}

static uint64_t *desc(void)
{
	return (uint64_t *)host(fx.g.desc);
}

static uint64_t *admit(void)
{
	return (uint64_t *)host(fx.g.admit);
}

static void fill_record(uint64_t r, int from, uint64_t tag)
{
	for (uint32_t f = 0; f < NFIELDS; f++)
		for (uint32_t b = 0; b < ROW_BYTES[f]; b++)
			host(record(r) + fx.g.rec_off[f])[b] = pattern(from, tag, f, b);
}

static uint8_t *staged_row(uint8_t *base, uint64_t k, uint32_t f)
{
	return base + fx.g.staged_off[f] + k * ROW_BYTES[f];
}

static void fill_staged(uint8_t *base)
{
	for (uint64_t k = 0; k < NSTAGED; k++)
		for (uint32_t f = 0; f < NFIELDS; f++)
			for (uint32_t b = 0; b < ROW_BYTES[f]; b++)
				staged_row(base, k, f)[b] = pattern(FROM_STAGED, k, f, b);
}

/* Fails unless the bytes at p are field f of (from, row). */
static void expect_field(const uint8_t *p, int from, uint64_t row, uint32_t f, const char *what,
			 uint64_t where)
{
	for (uint32_t b = 0; b < ROW_BYTES[f]; b++)
		if (p[b] != pattern(from, row, f, b))
			fail_msg("%s %llu field %u byte %u: %#x, want %#x (%s row %llu)", what,
				 (unsigned long long)where, f, b, p[b], pattern(from, row, f, b),
				 from == FROM_POOL ? "pool" : "staged", (unsigned long long)row);
}

static void expect_slot_row(uint64_t i, int from, uint64_t row)
{
	for (uint32_t f = 0; f < NFIELDS; f++)
		expect_field(host(fx.g.slot + fx.g.slot_off[f] + i * ROW_BYTES[f]), from, row, f,
			     "slot row", i);
}

static void expect_slot_row_zero(uint64_t i)
{
	for (uint32_t f = 0; f < NFIELDS; f++) {
		const uint8_t *p = host(fx.g.slot + fx.g.slot_off[f] + i * ROW_BYTES[f]);

		for (uint32_t b = 0; b < ROW_BYTES[f]; b++)
			if (p[b])
				fail_msg("slot row %llu field %u byte %u was written",
					 (unsigned long long)i, f, b);
	}
}

static void expect_record(uint64_t r, int from, uint64_t row)
{
	for (uint32_t f = 0; f < NFIELDS; f++)
		expect_field(host(record(r) + fx.g.rec_off[f]), from, row, f, "record", r);
}

/* Pool records hold their own pattern (row r = record r), staged rows
 * theirs; the record layout is packed but 16-aligned per field, as the
 * pool lays them out; slot fields start 256-aligned, as a batch does. */
static int setup(void **state)
{
	uint64_t off = 0;
	char d[128];

	memset(&fx, 0, sizeof(fx));
	gpu_fake_reset();
	assert_int_equal(gpu_init(d, sizeof(d)), 1);
	assert_int_equal(gpu_stream_create(0, &fx.s), 0);

	fx.g.nfields = NFIELDS;
	fx.g.count = COUNT;
	fx.g.nstaged = NSTAGED;
	for (uint32_t f = 0; f < NFIELDS; f++) {
		fx.g.row_bytes[f] = ROW_BYTES[f];
		fx.g.rec_off[f] = (uint32_t)off;
		off = align_up(off + ROW_BYTES[f], 16);
	}
	fx.stride = off;
	off = 0;
	for (uint32_t f = 0; f < NFIELDS; f++) {
		fx.g.slot_off[f] = off;
		off = align_up(off + (uint64_t)COUNT * ROW_BYTES[f], 256);
	}
	assert_int_equal(gpu_mem_alloc(0, off, GPU_IPC_FD, &fx.slot), 0);
	off = 0;
	for (uint32_t f = 0; f < NFIELDS; f++) {
		fx.g.staged_off[f] = off;
		off = align_up(off + (uint64_t)NSTAGED * ROW_BYTES[f], 256);
	}
	assert_int_equal(gpu_mem_alloc(0, off, GPU_IPC_NONE, &fx.staged), 0);
	assert_int_equal(gpu_mem_alloc(0, NREC * fx.stride, GPU_IPC_NONE, &fx.pool), 0);
	assert_int_equal(gpu_mem_alloc(0, (COUNT + NSTAGED) * 8, GPU_IPC_NONE, &fx.idx), 0);

	fx.g.slot = fx.slot.base;
	fx.g.staged = fx.staged.base;
	fx.g.desc = fx.idx.base;
	fx.g.admit = fx.idx.base + COUNT * 8;
	for (uint64_t r = 0; r < NREC; r++)
		fill_record(r, FROM_POOL, r);
	fill_staged(host(fx.staged.base));
	return 0;
}

static int teardown(void **state)
{
	gpu_stream_destroy(fx.s);
	gpu_mem_free(&fx.slot);
	gpu_mem_free(&fx.staged);
	gpu_mem_free(&fx.pool);
	gpu_mem_free(&fx.idx);
	/* Every test frees what it allocates: a leak here is a test bug. */
	assert_int_equal(gpu_fake_live_allocs(), 0);
	return 0;
}

/* Row i of the mix: every third row a miss (staged row (i / 3) % NSTAGED),
 * the rest hits on scattered records of the pool's lower half, so the upper
 * half is free for admissions. */
static bool mix_is_staged(uint64_t i)
{
	return i % 3 == 0;
}

static uint64_t mix_row(uint64_t i)
{
	return mix_is_staged(i) ? (i / 3) % NSTAGED : (i * 7 + 5) % (NREC / 2);
}

static void fill_mix(uint64_t *d)
{
	for (uint64_t i = 0; i < COUNT; i++)
		d[i] = mix_is_staged(i) ? GPU_GATHER_STAGED | mix_row(i) : record(mix_row(i));
}

static void expect_mix(void)
{
	for (uint64_t i = 0; i < COUNT; i++)
		expect_slot_row(i, mix_is_staged(i) ? FROM_STAGED : FROM_POOL, mix_row(i));
}

static void gather_assembles_pool_hits_and_staged_rows_field_by_field(void **state)
{
	fill_mix(desc());
	memset(admit(), 0, NSTAGED * 8);
	assert_int_equal(gpu_gather(fx.s, &fx.g), 0);
	/* Queued, not run: nothing has waited for the stream yet. */
	expect_slot_row_zero(1);
	assert_int_equal(gpu_stream_sync(fx.s), 0);
	expect_mix();
	/* The sources are only read. */
	for (uint64_t r = 0; r < NREC; r++)
		expect_record(r, FROM_POOL, r);
}

static void the_gather_lands_when_an_event_after_it_completes(void **state)
{
	struct gpu_event *e;

	fill_mix(desc());
	memset(admit(), 0, NSTAGED * 8);
	assert_int_equal(gpu_event_create(0, &e), 0);
	gpu_fake_set_event_delay(2);
	assert_int_equal(gpu_gather(fx.s, &fx.g), 0);
	assert_int_equal(gpu_event_record(e, fx.s), 0);
	assert_int_equal(gpu_event_query(e), -EAGAIN);
	assert_int_equal(gpu_event_query(e), -EAGAIN);
	expect_slot_row_zero(0);
	expect_slot_row_zero(COUNT - 1);
	assert_int_equal(gpu_event_query(e), 0);
	expect_mix();
	gpu_event_destroy(e);
}

static void admissions_land_in_their_records_and_zero_entries_are_skipped(void **state)
{
	/* Staged row k goes into record 40 + k when k is even; odd k is a
	 * miss that is not admitted (admit 0). */
	fill_mix(desc());
	for (uint64_t k = 0; k < NSTAGED; k++)
		admit()[k] = k % 2 ? 0 : record(40 + k);
	assert_int_equal(gpu_gather(fx.s, &fx.g), 0);
	assert_int_equal(gpu_stream_sync(fx.s), 0);

	expect_mix();
	for (uint64_t r = 0; r < NREC; r++) {
		bool admitted = r >= 40 && r < 40 + NSTAGED && (r - 40) % 2 == 0;

		if (admitted)
			expect_record(r, FROM_STAGED, r - 40);
		else
			expect_record(r, FROM_POOL, r);
	}
}

static void a_call_of_only_admissions_fills_records_and_no_slot(void **state)
{
	struct gpu_gather g = fx.g;

	g.count = 0;
	g.slot = 0;
	g.desc = 0;
	for (uint64_t k = 0; k < NSTAGED; k++)
		admit()[k] = record(NREC - 1 - k);
	assert_int_equal(gpu_gather(fx.s, &g), 0);
	assert_int_equal(gpu_stream_sync(fx.s), 0);
	for (uint64_t k = 0; k < NSTAGED; k++)
		expect_record(NREC - 1 - k, FROM_STAGED, k);
	for (uint64_t i = 0; i < COUNT; i++)
		expect_slot_row_zero(i);
}

/* The transfer thread's sequence: H2D of the batch's misses and of desc
 * and admit, then the gather, all queued before anything runs.  The
 * device-side desc holds stale entries (all record 0) until the H2D lands,
 * so a gather that read desc when queued would assemble the wrong rows. */
static void gather_reads_what_the_h2d_queued_just_before_it_wrote(void **state)
{
	uint8_t *staged_host = calloc(1, fx.staged.bytes);
	uint64_t *idx_host = calloc(COUNT + NSTAGED, 8);
	struct gpu_event *e;

	assert_non_null(staged_host);
	assert_non_null(idx_host);
	for (uint64_t i = 0; i < COUNT; i++)
		desc()[i] = record(0);
	memset(admit(), 0, NSTAGED * 8);
	memset(host(fx.staged.base), 0, fx.staged.bytes);

	fill_staged(staged_host);
	fill_mix(idx_host);
	idx_host[COUNT + 3] = record(50);
	assert_int_equal(gpu_event_create(0, &e), 0);
	assert_int_equal(gpu_copy_h2d(fx.s, fx.staged.base, staged_host, fx.staged.bytes), 0);
	assert_int_equal(gpu_copy_h2d(fx.s, fx.idx.base, idx_host, (COUNT + NSTAGED) * 8), 0);
	assert_int_equal(gpu_gather(fx.s, &fx.g), 0);
	assert_int_equal(gpu_event_record(e, fx.s), 0);
	assert_int_equal(gpu_event_sync(e), 0);

	expect_mix();
	expect_record(50, FROM_STAGED, 3);
	expect_record(51, FROM_POOL, 51);
	gpu_event_destroy(e);
	free(staged_host);
	free(idx_host);
}

/* Only the work queued before an event runs when it completes: a gather
 * queued after the event stays pending. */
static void gather_after_an_event_waits_for_a_later_one(void **state)
{
	struct gpu_event *e;

	fill_mix(desc());
	memset(admit(), 0, NSTAGED * 8);
	assert_int_equal(gpu_event_create(0, &e), 0);
	assert_int_equal(gpu_event_record(e, fx.s), 0);
	assert_int_equal(gpu_gather(fx.s, &fx.g), 0);
	assert_int_equal(gpu_event_sync(e), 0);
	expect_slot_row_zero(2);
	assert_int_equal(gpu_event_record(e, fx.s), 0);
	assert_int_equal(gpu_event_sync(e), 0);
	expect_mix();
	gpu_event_destroy(e);
}

/* Rows whose source leaves the arenas, or name a staged row that does not
 * exist, are skipped whole (and logged); the other rows still land. */
static void rows_with_a_bad_source_are_skipped_and_the_rest_land(void **state)
{
	uint8_t *outside = calloc(1, fx.stride);

	assert_non_null(outside);
	fill_mix(desc());
	memset(admit(), 0, NSTAGED * 8);
	desc()[4] = (uint64_t)(uintptr_t)outside;		 /* host memory, no arena */
	desc()[5] = 0;						 /* no source at all */
	desc()[6] = GPU_GATHER_STAGED | NSTAGED;		 /* one past the staged rows */
	desc()[7] = GPU_GATHER_STAGED | (GPU_GATHER_STAGED - 1); /* far past them */
	assert_int_equal(gpu_gather(fx.s, &fx.g), 0);
	assert_int_equal(gpu_stream_sync(fx.s), 0);
	for (uint64_t i = 0; i < COUNT; i++) {
		if (i >= 4 && i <= 7)
			expect_slot_row_zero(i);
		else
			expect_slot_row(i, mix_is_staged(i) ? FROM_STAGED : FROM_POOL, mix_row(i));
	}
	free(outside);
}

/* On a GPU the admission blocks run alongside the row blocks: an admission
 * into a record that a row of the same call reads, or that another
 * admission writes, is a race.  The fake refuses it (the record keeps its
 * bytes), so a pool that does it fails its tests here. */
static void admission_racing_a_row_of_the_same_call_is_refused(void **state)
{
	fill_mix(desc());
	memset(admit(), 0, NSTAGED * 8);
	admit()[0] = desc()[1];	 /* row 1 reads this record */
	admit()[1] = record(60); /* no conflict */
	admit()[2] = record(61);
	admit()[3] = record(61); /* written twice */
	assert_int_equal(gpu_gather(fx.s, &fx.g), 0);
	assert_int_equal(gpu_stream_sync(fx.s), 0);
	expect_mix();
	expect_record(mix_row(1), FROM_POOL, mix_row(1));
	expect_record(60, FROM_STAGED, 1);
	expect_record(61, FROM_STAGED, 2);
}

static void bad_arguments_are_refused_before_anything_is_queued(void **state)
{
	struct gpu_gather g;

	fill_mix(desc());
	memset(admit(), 0, NSTAGED * 8);

	g = fx.g;
	g.nfields = GPU_GATHER_MAX_FIELDS + 1;
	assert_int_equal(gpu_gather(fx.s, &g), -EINVAL);
	g = fx.g;
	g.slot = 0;
	assert_int_equal(gpu_gather(fx.s, &g), -EINVAL);
	g = fx.g;
	g.admit = 0;
	assert_int_equal(gpu_gather(fx.s, &g), -EINVAL);
	/* The slot's last field runs past its arena. */
	g = fx.g;
	g.slot_off[NFIELDS - 1] = fx.slot.bytes - ROW_BYTES[NFIELDS - 1];
	assert_int_equal(gpu_gather(fx.s, &g), -EFAULT);
	/* desc outside device memory. */
	g = fx.g;
	g.desc = (uint64_t)(uintptr_t)&g;
	assert_int_equal(gpu_gather(fx.s, &g), -EFAULT);
	/* Nothing to do is no error, and does nothing. */
	g = fx.g;
	g.count = 0;
	g.nstaged = 0;
	assert_int_equal(gpu_gather(fx.s, &g), 0);

	assert_int_equal(gpu_stream_sync(fx.s), 0);
	for (uint64_t i = 0; i < COUNT; i++)
		expect_slot_row_zero(i);
}

/* Entry mode as the client's gather runs it (bases, no staged rows) with
 * 4-byte entry ids: the pool's records as two slabs of 32, a third slab
 * named but not mapped (base 0) and a fourth past nbases.  Rows naming
 * those are skipped, as with 8-byte ids; the rest land byte for byte. */
#define ENTRY_SHIFT 5

static uint64_t entry_row(uint64_t i)
{
	return (i * 7 + 5) % NREC; /* records of both slabs */
}

static uint32_t entry_id(uint64_t i)
{
	if (i == 4)
		return 2u << ENTRY_SHIFT | 1; /* slab 2: not mapped */
	if (i == 9)
		return 3u << ENTRY_SHIFT; /* slab 3: past nbases */
	/* Record r is entry r: slab r >> ENTRY_SHIFT, the rest its index. */
	return (uint32_t)entry_row(i);
}

static void four_byte_entry_ids_gather_their_records_and_skip_slabs_not_mapped(void **state)
{
	struct gpu_gather g = fx.g;
	uint32_t *ids = (uint32_t *)host(fx.idx.base);
	uint64_t *bases = (uint64_t *)host(fx.idx.base + COUNT * sizeof(uint32_t));

	assert_true(NREC == 2u << ENTRY_SHIFT);
	for (uint64_t i = 0; i < COUNT; i++)
		ids[i] = entry_id(i);
	bases[0] = record(0);
	bases[1] = record(1u << ENTRY_SHIFT);
	bases[2] = 0;
	g.desc32 = 1;
	g.nstaged = 0;
	g.admit = 0;
	g.bases = fx.idx.base + COUNT * sizeof(uint32_t);
	g.nbases = 3;
	g.slab_shift = ENTRY_SHIFT;
	g.rec_stride = fx.stride;
	assert_int_equal(gpu_gather(fx.s, &g), 0);
	assert_int_equal(gpu_stream_sync(fx.s), 0);
	for (uint64_t i = 0; i < COUNT; i++) {
		if (i == 4 || i == 9)
			expect_slot_row_zero(i);
		else
			expect_slot_row(i, FROM_POOL, entry_row(i));
	}
	/* 4-byte entries name pool entries only: without the slab bases, or
	 * with staged rows or a record table, the call is refused. */
	g.bases = 0;
	assert_int_equal(gpu_gather(fx.s, &g), -EINVAL);
	g.bases = fx.idx.base + COUNT * sizeof(uint32_t);
	g.nstaged = NSTAGED;
	assert_int_equal(gpu_gather(fx.s, &g), -EINVAL);
	g.nstaged = 0;
	g.table = fx.pool.base;
	g.table_n = 1;
	assert_int_equal(gpu_gather(fx.s, &g), -EINVAL);
}

static void unexported_arena_is_counted_and_has_no_fd_or_handle(void **state)
{
	static const uint8_t zero[GPU_IPC_HANDLE_BYTES];
	struct gpu_mem a;
	uint64_t before, after, total;

	assert_int_equal(gpu_mem_info(0, &before, &total), 0);
	assert_int_equal(gpu_mem_alloc(0, MiB + 1, GPU_IPC_NONE, &a), 0);
	assert_int_equal(a.kind, GPU_IPC_NONE);
	assert_int_equal(a.export_fd, -1);
	assert_int_equal(a.bytes, 2 * MiB);
	assert_memory_equal(a.legacy_handle, zero, sizeof(zero));
	assert_int_equal(gpu_fake_live_allocs(), 5); /* the fixture's four, and a */
	assert_int_equal(gpu_mem_info(0, &after, &total), 0);
	assert_int_equal(before - after, 2 * MiB);
	host(a.base)[a.bytes - 1] = 0x5a; /* writable to its last byte */
	gpu_mem_free(&a);
	assert_int_equal(gpu_fake_live_allocs(), 4);
	assert_int_equal(gpu_mem_info(0, &after, &total), 0);
	assert_int_equal(after, before);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(
			gather_assembles_pool_hits_and_staged_rows_field_by_field, setup, teardown),
		cmocka_unit_test_setup_teardown(the_gather_lands_when_an_event_after_it_completes,
						setup, teardown),
		cmocka_unit_test_setup_teardown(
			admissions_land_in_their_records_and_zero_entries_are_skipped, setup,
			teardown),
		cmocka_unit_test_setup_teardown(a_call_of_only_admissions_fills_records_and_no_slot,
						setup, teardown),
		cmocka_unit_test_setup_teardown(
			gather_reads_what_the_h2d_queued_just_before_it_wrote, setup, teardown),
		cmocka_unit_test_setup_teardown(gather_after_an_event_waits_for_a_later_one, setup,
						teardown),
		cmocka_unit_test_setup_teardown(
			rows_with_a_bad_source_are_skipped_and_the_rest_land, setup, teardown),
		cmocka_unit_test_setup_teardown(admission_racing_a_row_of_the_same_call_is_refused,
						setup, teardown),
		cmocka_unit_test_setup_teardown(bad_arguments_are_refused_before_anything_is_queued,
						setup, teardown),
		cmocka_unit_test_setup_teardown(
			four_byte_entry_ids_gather_their_records_and_skip_slabs_not_mapped, setup,
			teardown),
		cmocka_unit_test_setup_teardown(unexported_arena_is_counted_and_has_no_fd_or_handle,
						setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
