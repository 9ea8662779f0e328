/*
 * test_pool.c — the VRAM sample pool (pool.c) driven as a CUDA session
 * drives it, with the real transfer thread (xfer.c) on the fake GPU: slabs
 * come and go as transfer jobs, each batch is planned against the pool,
 * its staged rows are read from a real dataset into a host "ring slot" laid
 * out as sess.c lays it out, and the gather job assembles the batch's slot
 * from staged rows and pool records.  Every byte of every slot, and of
 * every resident record, is checked against the rows npygen wrote, and
 * pool_check holds after every step.
 *
 * The dataset: N samples of two fields, an 8-byte label and a 1024-byte
 * row.  A record is label at 0, row at 16 (kept 16-aligned), 1040 bytes.
 * How many records a 2 MiB slab holds is pool.c's choice (lay.per, read
 * from the pool); the dataset spans several slabs (lay.need of them).
 *
 * A pool grows on demand: a slab is asked for when a miss found no room
 * (or misses wait to be back-filled, or admissions run the room low), so
 * a test that wants room for its first batch primes the pool with a
 * one-row batch first.  Between batches
 * the driver lets a slab on its way land, so that runs are repeatable; the
 * tests still find out which slab holds what rather than assume it.
 *
 * DESIGN: one thread: the test is the loop thread (pool, completions);
 * the transfer thread is xfer.c's own.  A step that waits for the
 * transfer thread runs the loop until what it waits for has come back.
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
#include <unistd.h>

#include <cmocka.h>
#include <uv.h>

#include "conf/config.h"
#include "data/dataset.h"
#include "sess/fill.h"
#include "gpu/gpu.h"
#include "gpu/pool.h"
#include "testutil.h"
#include "gpu/xfer.h"

#define MiB (1ull << 20)

#define N	  5000u
#define BATCH	  256u
#define STAGE_CAP fill_stage_cap(BATCH) /* a session's stage_cap */
#define MAX_EXTRA (STAGE_CAP - BATCH)
#define NFIELDS	  2
#define SLAB	  (2 * MiB)
#define STRIDE	  1040u
#define NBUF	  2u /* batches in flight at once */

static const uint64_t ROW_BYTES[NFIELDS] = {8, 1024};
static const uint64_t SEED[NFIELDS] = {101, 202};

/* The dataset, written and loaded once for the group. */
static struct {
	char dir[64];
	char *paths[NFIELDS]; /* owned */
	struct config_field fields[NFIELDS];
	struct config_dataset decl;
	struct dataset ds;
} g;

/* The pool's slab geometry, read by setup. */
static struct {
	uint32_t per;  /* records per slab */
	uint64_t slab; /* bytes per slab */
	uint32_t need; /* slabs that hold the whole dataset */
} lay;

/* One batch as a session's slot carries it from planning to completion. */
struct batch {
	uint64_t samples[BATCH];
	uint32_t count;
	struct pool_plan plan;
	uint8_t *ring; /* owned: the host ring slot */
	uint64_t stage_off[NFIELDS];
	uint64_t stage_bytes;
	uint64_t slot;	      /* device address of the batch's slot */
	struct xfer_job *job; /* owned once back (on_done) */
	/* The plan's figures, kept: pool_plan_done clears nmiss and nstaged. */
	uint32_t hits, nmiss, nstaged, admitted;
};

struct fixture {
	struct pool_set set; /* the daemon's pools: the one under test */
	uv_loop_t loop;
	struct xfer *x;
	struct gpu_mem slots; /* NBUF device slots */
	uint64_t slot_off[NFIELDS];
	uint64_t slot_stride;
	struct batch b[NBUF];
	struct xfer_job *warm; /* the staging area's warm-up job, once back */
	struct pool *p;
	int arenas0; /* live arenas besides the pool's: slots and staging */
};

/* ---- group: the dataset ----------------------------------------------------- */

static int group_setup(void **state)
{
	static const char *names[NFIELDS] = {"label", "x"};
	static const uint64_t label_shape[1] = {8}, x_shape[1] = {256};
	int rc;

	(void)state;
	strcpy(g.dir, "/tmp/test_pool.XXXXXX");
	if (!mkdtemp(g.dir))
		return -1;
	for (int f = 0; f < NFIELDS; f++) {
		if (asprintf(&g.paths[f], "%s/%s.npy", g.dir, names[f]) < 0)
			return -1;
		g.fields[f] = (struct config_field){(char *)names[f], &g.paths[f], 1};
	}
	if (td_write_npy(g.paths[0], 1, "|u1", 1, N, label_shape, 1, SEED[0], 0) ||
	    td_write_npy(g.paths[1], 1, "<f4", 4, N, x_shape, 1, SEED[1], 0))
		return -1;
	g.decl = (struct config_dataset){.name = "train",
					 .format = "npy",
					 .fields = g.fields,
					 .nfields = NFIELDS,
					 .read = CONFIG_READ_MMAP,
					 .pool = CONFIG_POOL_DEFAULT};
	rc = ds_load(&g.ds, &g.decl);
	if (rc) {
		fprintf(stderr, "ds_load: %s\n", g.ds.error);
		return -1;
	}
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	ds_close(&g.ds);
	for (int f = 0; f < NFIELDS; f++) {
		if (g.paths[f])
			unlink(g.paths[f]);
		free(g.paths[f]);
	}
	rmdir(g.dir);
	return 0;
}

/* ---- the driver: what sess.c does for one batch ------------------------------ */

static void on_done(struct xfer_job *job, void *arg)
{
	struct fixture *f = arg;
	struct batch *b = job->owner;

	if (b)
		b->job = job;
	else
		f->warm = job;
}

/* One turn of the loop: completions from the transfer thread land. */
static void spin(struct fixture *f)
{
	uv_run(&f->loop, UV_RUN_NOWAIT);
	usleep(200);
}

#define SPIN_UNTIL(f, cond)                                                                        \
	do {                                                                                       \
		for (int spins_ = 0; spins_ < 25000 && !(cond); spins_++)                          \
			spin(f);                                                                   \
		assert_true(cond);                                                                 \
	} while (0)

/* Lets a slab allocation on its way land in the pool. */
static void settle(struct fixture *f)
{
	SPIN_UNTIL(f, !f->p->slab_pending && !f->p->table_pending);
	assert_true(pool_check(f->p));
}

/* Runs the loop for a while, so that a free that should not happen has
 * every chance to. */
static void linger(struct fixture *f)
{
	for (int i = 0; i < 100; i++)
		spin(f);
}

static void wait_arenas(struct fixture *f, int want)
{
	SPIN_UNTIL(f, gpu_fake_live_allocs() == want);
}

static uint64_t entry_addr(const struct pool *p, uint32_t e)
{
	return p->slabs[(e >> p->slab_shift)].mem.base +
	       (uint64_t)(e & ((1u << p->slab_shift) - 1)) * p->rec_stride;
}

static bool resident(const struct pool *p, uint64_t sample)
{
	return p->loc[sample] < POOL_PENDING;
}

static bool missed(const struct pool *p, uint64_t sample)
{
	return (p->missed[sample / 64] >> (sample % 64)) & 1;
}

static bool pinned_by(const struct pool_plan *pl, uint32_t slab)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < pl->npinned; i++)
		n += pl->pinned[i] == slab;
	return n == 1;
}

/* The plan as pool.h promises it: hits name records of live slabs, every
 * miss names its own staged row of the same sample, admissions point at
 * their entry's record, and every slab read or written is pinned, once. */
static void check_plan(const struct fixture *f, const struct batch *b)
{
	const struct pool *p = f->p;
	const struct pool_plan *pl = &b->plan;
	uint64_t admit_off;
	const uint64_t *desc = (const uint64_t *)b->ring;
	const uint64_t *admit;
	uint32_t hits = 0, misses = 0;

	fill_stage_layout(&g.ds, b->count, 0, &admit_off, NULL);
	admit = (const uint64_t *)(b->ring + admit_off);
	assert_true(pl->active);
	assert_int_equal(pl->count, b->count);
	if (pl->table) {
		/* Table mode: the index is the picks, every live slab pinned. */
		uint32_t live = 0;

		assert_int_equal(pl->nstaged, 0);
		assert_int_equal(pl->hits, b->count);
		assert_int_equal(memcmp(desc, b->samples, b->count * sizeof(*desc)), 0);
		for (uint32_t j = 0; j < p->nslabs; j++)
			if (p->slabs[j].live) {
				assert_true(pinned_by(pl, j));
				live++;
			}
		assert_int_equal(pl->npinned, live);
		return;
	}
	assert_true(pl->nmiss <= pl->nstaged && pl->nstaged <= pl->cap);
	for (uint32_t i = 0; i < b->count; i++) {
		if (desc[i] & GPU_GATHER_STAGED) {
			uint64_t k = desc[i] & ~GPU_GATHER_STAGED;

			assert_int_equal(k, misses);
			assert_int_equal(pl->staged[k], b->samples[i]);
			misses++;
		} else {
			uint32_t e = p->loc[b->samples[i]];

			assert_true(e < POOL_PENDING);
			assert_true(p->slabs[(e >> p->slab_shift)].live);
			assert_int_equal(desc[i], entry_addr(p, e));
			assert_true(pinned_by(pl, (e >> p->slab_shift)));
			hits++;
		}
	}
	assert_int_equal(hits, pl->hits);
	assert_int_equal(misses, pl->nmiss);
	for (uint32_t k = 0; k < pl->nstaged; k++) {
		uint32_t e = pl->admit[k];

		if (e == POOL_NONE) {
			assert_int_equal(admit[k], 0);
			assert_true(k < pl->nmiss); /* an admit-only row is admitted */
			continue;
		}
		assert_int_equal(p->loc[pl->staged[k]], POOL_PENDING);
		assert_int_equal(p->owner[e], pl->staged[k]);
		assert_int_equal(admit[k], entry_addr(p, e));
		assert_true(pinned_by(pl, (e >> p->slab_shift)));
	}
	for (uint32_t i = 0; i < pl->npinned; i++)
		assert_true(p->slabs[pl->pinned[i]].pins > 0);
}

/* Plans samples[0..count) into b and stages its rows, as a session's
 * start_fill and the readers do. */
static void batch_plan(struct fixture *f, struct batch *b, const uint64_t *samples, uint32_t count)
{
	char err[256] = "";

	assert_true(count > 0 && count <= BATCH);
	assert_false(b->plan.active);
	memcpy(b->samples, samples, count * sizeof(*samples));
	b->count = count;
	b->stage_bytes = fill_plan(f->p, &g.ds, b->samples, count, STAGE_CAP, false, b->ring,
				   &b->plan, b->stage_off);
	assert_true(pool_check(f->p));
	check_plan(f, b);
	b->hits = b->plan.hits;
	b->nmiss = b->plan.nmiss;
	b->nstaged = b->plan.nstaged;
	b->admitted = 0;
	for (uint32_t k = 0; k < b->plan.nstaged; k++)
		b->admitted += b->plan.admit[k] != POOL_NONE;
	for (int fl = 0; fl < NFIELDS && b->plan.nstaged; fl++)
		if (ds_read_field(&g.ds, (size_t)fl, b->plan.staged, b->plan.nstaged,
				  b->ring + b->stage_off[fl], err, sizeof(err)))
			fail_msg("ds_read_field: %s", err);
}

/* Queues b's copy job as a session's sess_cuda_copy builds it. */
static void batch_submit(struct fixture *f, struct batch *b)
{
	struct xfer_job *job = calloc(1, sizeof(*job));

	assert_non_null(job);
	job->kind = XFER_COPY;
	job->owner = b;
	job->slot = (uint32_t)(b - f->b);
	job->src = b->ring;
	job->dst = b->slot;
	job->gather = true;
	job->bytes = b->stage_bytes;
	fill_gather(&job->g, f->p, &g.ds, &b->plan, f->slot_off, b->stage_off);
	b->job = NULL;
	xfer_submit(f->x, job);
}

static void batch_wait(struct fixture *f, struct batch *b)
{
	SPIN_UNTIL(f, b->job != NULL);
}

/* Every row of every field of the slot holds its sample's bytes. */
static void batch_check_bytes(const struct fixture *f, const struct batch *b)
{
	assert_int_equal(b->job->rc, 0);
	for (uint32_t i = 0; i < b->count; i++) {
		for (int fl = 0; fl < NFIELDS; fl++) {
			const uint8_t *row =
				(const uint8_t *)(uintptr_t)(b->slot + f->slot_off[fl] +
							     i * ROW_BYTES[fl]);

			if (!td_row_ok(row, ROW_BYTES[fl], SEED[fl], b->samples[i]))
				fail_msg("row %u (sample %llu) field %d of the slot differs", i,
					 (unsigned long long)b->samples[i], fl);
		}
	}
}

/* The copy job is back: what sess_xfer_done does. */
static void batch_finish(struct fixture *f, struct batch *b)
{
	pool_plan_done(f->p, &b->plan, b->job->rc == 0);
	assert_true(pool_check(f->p));
	assert_false(b->plan.active);
	free(b->job);
	b->job = NULL;
}

/* One whole batch on buffer 0, then any slab on its way lands. */
static struct batch *run_batch(struct fixture *f, const uint64_t *samples, uint32_t count)
{
	struct batch *b = &f->b[0];

	batch_plan(f, b, samples, count);
	batch_submit(f, b);
	batch_wait(f, b);
	batch_check_bytes(f, b);
	batch_finish(f, b);
	settle(f);
	return b;
}

struct totals {
	uint64_t batches, hits, nmiss, nstaged;
	uint64_t mixed; /* batches with both hits and misses */
};

/* Batches over samples[0..n) in order. */
static struct totals run_pass(struct fixture *f, const uint64_t *samples, uint64_t n)
{
	struct totals t = {0};

	for (uint64_t i = 0; i < n; i += BATCH) {
		uint32_t count = (uint32_t)(n - i < BATCH ? n - i : BATCH);
		const struct batch *b = run_batch(f, samples + i, count);

		t.batches++;
		t.hits += b->hits;
		t.nmiss += b->nmiss;
		t.nstaged += b->nstaged;
		t.mixed += b->hits > 0 && b->hits < count;
	}
	return t;
}

/* samples first..first+n-1 in order. */
static uint64_t *range(uint64_t first, uint64_t n)
{
	uint64_t *s = malloc(n * sizeof(*s));

	assert_non_null(s);
	for (uint64_t i = 0; i < n; i++)
		s[i] = first + i;
	return s;
}

/* The same samples in another order (7919 is prime, so coprime with n
 * unless n is a multiple of it). */
static uint64_t *shuffled(uint64_t first, uint64_t n)
{
	uint64_t *s = malloc(n * sizeof(*s));

	assert_non_null(s);
	assert_true(n % 7919 != 0);
	for (uint64_t i = 0; i < n; i++)
		s[i] = first + (i * 7919 + 13) % n;
	return s;
}

/* Every resident sample's record holds its rows; returns how many are
 * resident. */
static uint64_t check_records(const struct fixture *f)
{
	const struct pool *p = f->p;
	uint64_t n = 0;

	for (uint64_t s = 0; s < N; s++) {
		uint32_t e = p->loc[s];
		uint64_t rec;

		if (e >= POOL_PENDING)
			continue;
		assert_true(p->slabs[(e >> p->slab_shift)].live);
		assert_int_equal(p->owner[e], s);
		rec = entry_addr(p, e);
		for (int fl = 0; fl < NFIELDS; fl++)
			if (!td_row_ok((const uint8_t *)(uintptr_t)(rec + p->rec_off[fl]),
				       ROW_BYTES[fl], SEED[fl], s))
				fail_msg("record %u of sample %llu: field %d differs", e,
					 (unsigned long long)s, fl);
		n++;
	}
	assert_int_equal(n, p->rows);
	return n;
}

/* Slabs that hold device memory (live or dying). */
static int slabs_held(const struct pool *p)
{
	int n = 0;

	for (uint32_t j = 0; j < p->nslabs; j++)
		n += p->slabs[j].mem.base != 0;
	return n;
}

/* The live slab of highest index: the newest while no index is reused. */
static uint32_t newest_live(const struct pool *p)
{
	for (uint32_t j = p->nslabs; j-- > 0;)
		if (p->slabs[j].live)
			return j;
	fail_msg("no live slab");
	return 0;
}

/* The resident samples whose records lie in slab j, into out (may be NULL). */
static uint64_t rows_in(const struct pool *p, uint32_t j, uint64_t *out)
{
	uint64_t n = 0;

	for (uint64_t s = 0; s < N; s++) {
		if (resident(p, s) && (p->loc[s] >> p->slab_shift) == j) {
			if (out)
				out[n] = s;
			n++;
		}
	}
	return n;
}

/* Sets the budget and lets a slab it asks for land. */
static void budget(struct fixture *f, uint64_t bytes)
{
	pool_set_budget(f->p, bytes, "test");
	assert_true(pool_check(f->p));
	settle(f);
}

/* An empty pool asks for its first slab when a miss finds no room: a
 * one-row batch of `sample` does that, and the slab lands.  The sample is
 * remembered as missed and admitted by the next batch that holds it. */
static void prime(struct fixture *f, uint64_t sample)
{
	const struct batch *b;

	assert_int_equal(f->p->nlive, 0);
	b = run_batch(f, &sample, 1);
	assert_int_equal(b->hits, 0);
	assert_int_equal(f->p->nlive, 1);
	assert_true(missed(f->p, sample));
}

/* ---- fixture ------------------------------------------------------------------ */

static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));
	char desc[128], err[200], why[160] = "";
	struct slot_layout slot_lay;
	uint64_t ring_bytes;
	struct xfer_job *warm;

	assert_non_null(f);
	gpu_fake_reset();
	assert_int_equal(gpu_init(desc, sizeof(desc)), 1);
	assert_int_equal(gpu_fake_live_allocs(), 0);
	f->set.cfg.slab_bytes = SLAB;
	assert_int_equal(uv_loop_init(&f->loop), 0);
	assert_int_equal(xfer_start(&f->x, 0, &f->loop, on_done, f, err, sizeof(err)), 0);

	/* A session's slot layout for BATCH rows. */
	assert_int_equal(fill_layout(&slot_lay, &g.ds, BATCH, NULL, 0), 0);
	memcpy(f->slot_off, slot_lay.field_offset, sizeof(f->slot_off));
	f->slot_stride = slot_lay.slot_stride;
	fill_layout_free(&slot_lay);
	assert_int_equal(gpu_mem_alloc(0, NBUF * f->slot_stride, GPU_IPC_FD, &f->slots), 0);
	ring_bytes = fill_pooled_stride(&g.ds, BATCH, f->slot_stride);
	for (uint32_t i = 0; i < NBUF; i++) {
		struct batch *b = &f->b[i];

		b->ring = aligned_alloc(4096, ring_bytes);
		assert_non_null(b->ring);
		assert_int_equal(pool_plan_alloc(&b->plan, STAGE_CAP), 0);
		b->slot = f->slots.base + i * f->slot_stride;
	}

	/* The transfer thread makes its staging area at its first gather; an
	 * empty gather makes it now, so that the arenas counted from here on
	 * are the pool's slabs alone.  (Its size covers a whole ring slot's
	 * prefix, so it never grows.) */
	warm = calloc(1, sizeof(*warm));
	assert_non_null(warm);
	warm->kind = XFER_COPY;
	warm->src = f->b[0].ring;
	warm->dst = f->b[0].slot;
	warm->gather = true;
	warm->bytes = ring_bytes;
	xfer_submit(f->x, warm);
	SPIN_UNTIL(f, f->warm != NULL);
	assert_int_equal(f->warm->rc, 0);
	free(f->warm);
	f->warm = NULL;
	f->arenas0 = gpu_fake_live_allocs();
	assert_int_equal(f->arenas0, 2); /* the slots and the staging area */

	f->p = pool_get(&f->set, &g.ds, 0, f->x, true, why, sizeof(why));
	assert_non_null(f->p);
	/* These batches are gathered by the daemon (the record table's
	 * users); test_sess covers the client's gather. */
	f->p->daemon_gathers = 1;
	assert_ptr_equal(f->set.head, f->p);
	/* The record layout the header of this file describes. */
	assert_true(f->p->enabled);
	assert_int_equal(f->p->nfields, NFIELDS);
	assert_int_equal(f->p->rec_off[0], 0);
	assert_int_equal(f->p->rec_off[1], 16);
	assert_int_equal(f->p->rec_stride, STRIDE);
	lay.per = f->p->per_slab;
	lay.slab = f->p->slab_bytes;
	lay.need = (N + lay.per - 1) / lay.per;
	assert_true(lay.slab <= SLAB && (uint64_t)lay.per * STRIDE <= lay.slab);
	assert_true(lay.per >= 2 * BATCH);
	assert_true(lay.need >= 3);
	assert_true(pool_check(f->p));
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;

	/* The daemon's shutdown order: the transfer thread first, so that
	 * an allocation still on its way comes back before the pools go;
	 * their slab frees then run inline. */
	xfer_stop(f->x);
	pool_destroy_all(&f->set);
	uv_run(&f->loop, UV_RUN_DEFAULT);
	xfer_free(f->x);
	assert_int_equal(uv_loop_close(&f->loop), 0);
	for (uint32_t i = 0; i < NBUF; i++) {
		free(f->b[i].job);
		pool_plan_free(&f->b[i].plan);
		free(f->b[i].ring);
	}
	free(f->warm);
	gpu_mem_free(&f->slots);
	assert_int_equal(gpu_fake_live_allocs(), 0);
	free(f);
	return 0;
}

/* ---- cases --------------------------------------------------------------------- */

static void a_pool_with_room_admits_every_miss_and_serves_it_again_as_a_hit(void **state)
{
	struct fixture *f = *state;
	uint64_t *first = range(0, lay.per), *again = shuffled(0, lay.per);
	struct totals t;

	budget(f, lay.need * lay.slab);
	assert_int_equal(f->p->nlive, 0); /* no demand yet */
	prime(f, 0);

	/* One slab's worth of samples: every miss is admitted. */
	for (uint64_t i = 0; i < lay.per; i += BATCH) {
		uint32_t count = (uint32_t)(lay.per - i < BATCH ? lay.per - i : BATCH);
		const struct batch *b = run_batch(f, first + i, count);

		assert_int_equal(b->hits, 0);
		assert_int_equal(b->nmiss, count);
		assert_int_equal(b->nstaged, count);
		assert_int_equal(f->p->rows, i + count);
	}
	assert_int_equal(f->p->nmissed, 0);
	assert_in_range(f->p->nlive, 1, 2); /* a slab's worth, and one ahead at most */
	assert_false(f->p->slab_pending);
	assert_int_equal(pool_bytes(f->p), f->p->nlive * lay.slab);
	assert_int_equal(gpu_fake_live_allocs(), f->arenas0 + (int)f->p->nlive);
	assert_int_equal(check_records(f), lay.per);

	/* The same samples again, in another order: all hits. */
	for (uint64_t i = 0; i < lay.per; i += BATCH) {
		uint32_t count = (uint32_t)(lay.per - i < BATCH ? lay.per - i : BATCH);
		const struct batch *b = run_batch(f, again + i, count);

		assert_int_equal(b->hits, count);
		assert_int_equal(b->nstaged, 0);
	}
	t = run_pass(f, first, BATCH); /* and a batch in file order */
	assert_int_equal(t.hits, BATCH);
	assert_int_equal(f->p->rows, lay.per);

	/* The figures status reports (status.c's pool_status). */
	assert_true(f->p->enabled);
	assert_int_equal(f->p->rows, lay.per);
	assert_int_equal(pool_bytes(f->p), f->p->nlive * lay.slab);
	assert_int_equal(f->p->table.bytes, 0);
	assert_int_equal(f->p->budget, lay.need * lay.slab);
	assert_int_equal(f->p->hits, lay.per + BATCH);
	assert_int_equal(f->p->lookups, 1 + 2 * lay.per + BATCH); /* the prime's row too */
	assert_int_equal(f->p->saved, (lay.per + BATCH) * (ROW_BYTES[0] + ROW_BYTES[1]));
	free(first);
	free(again);
}

static void a_pool_grows_no_further_than_its_dataset_needs(void **state)
{
	struct fixture *f = *state;
	uint64_t *all = range(0, N), *again = shuffled(0, N);
	uint64_t seen = 0;
	struct totals t;

	/* Room for 32 slabs; the dataset fills lay.need.  Slabs past what every
	 * sample needs would hold device memory no record can use. */
	budget(f, 64 * MiB);
	prime(f, 0);
	for (uint64_t i = 0; i < N; i += BATCH) {
		uint32_t count = (uint32_t)(N - i < BATCH ? N - i : BATCH);
		const struct batch *b = run_batch(f, all + i, count);

		assert_int_equal(b->hits, 0);
		seen += count;
		/* Every sample seen is resident or remembered for back-fill. */
		assert_int_equal(f->p->rows + f->p->nmissed, seen);
	}
	assert_int_equal(f->p->rows, N);
	assert_int_equal(f->p->nmissed, 0);
	t = run_pass(f, again, N);
	assert_int_equal(t.hits, N);
	assert_int_equal(check_records(f), N);
	/* lay.need slabs hold every sample; one more may have been asked
	 * for ahead of need, never more. */
	assert_in_range(f->p->nlive, lay.need, lay.need + 1);
	assert_int_equal(pool_bytes(f->p), f->p->nlive * lay.slab);
	assert_int_equal(gpu_fake_live_allocs(),
			 f->arenas0 + (int)f->p->nlive +
				 (f->p->table.base != 0)); /* and the table */
	free(all);
	free(again);
}

/* Once every sample is resident the device gets the record table and
 * batches are planned without a lookup per row; a slab leaving takes the
 * pool back to planning row by row, and both give the right bytes. */
static void a_whole_pool_plans_batches_from_the_device_table(void **state)
{
	struct fixture *f = *state;
	uint64_t *all = range(0, N), *again = shuffled(0, N);
	struct totals t;
	uint32_t tabled = 0;

	budget(f, 64 * MiB);
	prime(f, 0);
	run_pass(f, all, N);
	assert_int_equal(f->p->rows, N);
	settle(f);
	assert_true(f->p->table_valid);
	assert_true(pool_table(f->p) != 0);
	for (uint64_t i = 0; i < N; i += BATCH) {
		uint32_t count = (uint32_t)(N - i < BATCH ? N - i : BATCH);
		const struct batch *b = run_batch(f, again + i, count);

		assert_int_equal(b->hits, count);
		tabled += b->plan.table;
	}
	/* batch_finish has cleared plan.active but not plan.table. */
	assert_int_equal(tabled, (N + BATCH - 1) / BATCH);

	/* One slab fewer: the table is stale at once, rows miss again. */
	budget(f, pool_bytes(f->p) - 1);
	assert_false(f->p->table_valid);
	assert_int_equal(pool_table(f->p), 0);
	t = run_pass(f, again, N);
	assert_true(t.nmiss > 0);
	assert_true(t.hits > 0);
	assert_true(pool_check(f->p));
	free(all);
	free(again);
}

static void samples_missed_before_the_budget_is_known_are_back_filled_later(void **state)
{
	struct fixture *f = *state;
	enum { EARLY = 2 * BATCH };
	uint64_t *early = range(0, EARLY), *later = range(EARLY, N - EARLY);
	uint64_t backfilled = 0, batches = 0;
	bool all_in = false;
	struct totals t;

	/* No probe yet: every row is staged, none admitted, all remembered. */
	for (uint32_t i = 0; i < EARLY; i += BATCH) {
		struct batch *b = &f->b[0];

		batch_plan(f, b, early + i, BATCH);
		assert_int_equal(b->hits, 0);
		assert_int_equal(b->nstaged, BATCH);
		for (uint32_t k = 0; k < b->nstaged; k++)
			assert_int_equal(b->plan.admit[k], POOL_NONE);
		assert_int_equal(b->plan.npinned, 0);
		batch_submit(f, b);
		batch_wait(f, b);
		batch_check_bytes(f, b);
		batch_finish(f, b);
		assert_false(f->p->slab_pending);
	}
	assert_int_equal(f->p->rows, 0);
	assert_int_equal(f->p->nlive, 0);
	assert_int_equal(f->p->nmissed, EARLY);
	assert_int_equal(gpu_fake_live_allocs(), f->arenas0);

	/* The probe: the waiting samples are demand enough for a slab. */
	pool_set_budget(f->p, lay.need * lay.slab, "test");
	assert_true(f->p->slab_pending);
	SPIN_UNTIL(f, f->p->nlive > 0);

	/* Later batches carry admit-only rows of the early samples until all
	 * of them are resident. */
	for (uint64_t i = 0; i < N - EARLY && !all_in; i += BATCH) {
		uint32_t count = (uint32_t)(N - EARLY - i < BATCH ? N - EARLY - i : BATCH);
		const struct batch *b = run_batch(f, later + i, count);

		assert_int_equal(b->hits, 0);
		assert_int_equal(b->nmiss, count);
		if (batches == 0)
			assert_int_equal(b->nstaged, count + MAX_EXTRA);
		assert_true(b->nstaged <= count + MAX_EXTRA);
		backfilled += b->nstaged - b->nmiss;
		batches++;
		all_in = true;
		for (uint64_t s = 0; s < EARLY; s++)
			all_in = all_in && resident(f->p, s);
	}
	assert_true(all_in);
	assert_true(backfilled >= EARLY);
	for (uint64_t s = 0; s < EARLY; s++)
		assert_false(missed(f->p, s));
	assert_int_equal(check_records(f), f->p->rows);

	/* The back-filled records are served as hits, byte-exact. */
	t = run_pass(f, early, EARLY);
	assert_int_equal(t.hits, EARLY);
	assert_int_equal(t.nmiss, 0);
	free(early);
	free(later);
}

static void a_pool_capped_at_one_slab_serves_mixed_batches_byte_exact(void **state)
{
	struct fixture *f = *state;
	uint64_t *first = range(0, N), *again = shuffled(0, N);
	uint64_t n = 0;
	struct totals t;

	f->set.cfg.cap_bytes = lay.slab;
	budget(f, 64 * MiB);
	assert_int_equal(f->p->budget, lay.slab);
	assert_non_null(strstr(f->p->budget_reason, "pool_bytes"));

	t = run_pass(f, first, N);
	assert_int_equal(t.hits, 0);
	assert_int_equal(f->p->rows, lay.per);
	assert_int_equal(f->p->room, 0);
	assert_int_equal(f->p->nlive, 1);
	assert_false(f->p->slab_pending);
	assert_int_equal(pool_bytes(f->p), lay.slab);
	assert_int_equal(f->p->nmissed, N - lay.per);
	assert_int_equal(gpu_fake_live_allocs(), f->arenas0 + 1);
	for (uint64_t s = 0; s < N; s++) {
		assert_true(resident(f->p, s) != missed(f->p, s));
		n += resident(f->p, s);
	}
	assert_int_equal(n, lay.per);
	assert_int_equal(check_records(f), lay.per);

	t = run_pass(f, again, N);
	assert_int_equal(t.hits, lay.per);
	assert_int_equal(t.nmiss, N - lay.per);
	assert_int_equal(t.nstaged, t.nmiss); /* no room: nothing back-filled */
	assert_true(t.mixed >= t.batches - 1);
	assert_int_equal(f->p->rows, lay.per);
	assert_int_equal(f->p->nlive, 1);
	assert_int_equal(check_records(f), lay.per);
	free(first);
	free(again);
}

/* Fills the pool in sample order over 0..n-1 (see the top of the file). */
static void fill_in_order(struct fixture *f, uint64_t budget_bytes, uint64_t n)
{
	uint64_t *s = range(0, n);

	budget(f, budget_bytes);
	prime(f, 0);
	run_pass(f, s, n);
	free(s);
}

static void shrinking_drops_slabs_and_frees_a_pinned_one_after_its_batch(void **state)
{
	struct fixture *f = *state;
	enum { HALF = BATCH / 2 };
	uint64_t *in_j = malloc(N * sizeof(*in_j)), *seen = range(0, N);
	uint64_t inflight[BATCH], n_j, filled = 0, nseen;
	uint32_t j, into_j = 0;
	struct batch *b = &f->b[1];
	const struct batch *c;
	struct pool_slab *sl;

	/* Fill in sample order until the budget's last slab has come and
	 * holds a batch or more, with room left: the slab being filled. */
	assert_non_null(in_j);
	budget(f, lay.need * lay.slab);
	prime(f, 0);
	while (f->p->nlive < lay.need || f->p->slabs[newest_live(f->p)].used < BATCH) {
		assert_true(filled + BATCH <= N - HALF);
		run_batch(f, seen + filled, BATCH);
		filled += BATCH;
	}
	nseen = filled + HALF;
	assert_int_equal(f->p->rows, filled);
	assert_int_equal(f->p->nmissed, 0);
	assert_int_equal(f->p->nlive, lay.need);
	assert_int_equal(gpu_fake_live_allocs(), f->arenas0 + (int)lay.need);
	j = newest_live(f->p);
	assert_true(f->p->slabs[j].used <= lay.per - HALF);
	n_j = rows_in(f->p, j, in_j);
	assert_true(n_j >= BATCH);

	/* A batch in flight reads the newest slab (HALF of its samples) and
	 * admits HALF fresh samples; the newest slab is the one being filled,
	 * so some of them go into it. */
	memcpy(inflight, in_j, HALF * sizeof(*inflight));
	for (uint32_t i = 0; i < HALF; i++)
		inflight[HALF + i] = filled + i;
	batch_plan(f, b, inflight, BATCH);
	assert_int_equal(b->hits, HALF);
	assert_int_equal(b->nmiss, HALF);
	assert_int_equal(b->admitted, HALF);
	for (uint32_t k = 0; k < b->nstaged; k++)
		into_j += b->plan.admit[k] / lay.per == j;
	assert_true(into_j > 0);
	sl = &f->p->slabs[j];
	assert_int_equal(sl->pins, 1);
	batch_submit(f, b);

	/* The budget shrinks under it: the newest slab leaves the index at
	 * once but keeps its memory. */
	pool_set_budget(f->p, (lay.need - 1) * lay.slab, "test shrink");
	assert_true(pool_check(f->p));
	assert_false(sl->live);
	assert_true(sl->dying);
	assert_int_equal(f->p->nlive, lay.need - 1);
	assert_int_equal(pool_bytes(f->p), (lay.need - 1) * lay.slab);
	assert_int_equal(f->p->rows, filled - n_j);
	for (uint64_t i = 0; i < n_j; i++) {
		assert_false(resident(f->p, in_j[i]));
		assert_true(missed(f->p, in_j[i]));
	}
	assert_int_equal(f->p->nmissed, n_j);
	linger(f);
	assert_int_equal(gpu_fake_live_allocs(), f->arenas0 + (int)lay.need);
	assert_true(sl->dying);

	/* Its samples miss again, and the budget has no room for another
	 * slab. */
	c = run_batch(f, in_j + HALF, (uint32_t)(n_j - HALF < BATCH ? n_j - HALF : BATCH));
	assert_int_equal(c->hits, 0);
	assert_false(f->p->slab_pending);
	assert_int_equal(gpu_fake_live_allocs(), f->arenas0 + (int)lay.need);
	assert_true(sl->dying);

	/* The batch in flight comes back with the right bytes; its
	 * admissions into the dropped slab are cancelled and the slab goes. */
	batch_wait(f, b);
	batch_check_bytes(f, b);
	batch_finish(f, b);
	assert_false(sl->dying);
	assert_false(sl->live);
	assert_int_equal(sl->pins, 0);
	wait_arenas(f, f->arenas0 + (int)lay.need - 1);
	assert_int_equal(sl->mem.base, 0);
	for (uint32_t k = 0; k < b->nstaged; k++) {
		uint64_t s = b->plan.staged[k];

		if (b->plan.admit[k] / lay.per == j)
			assert_true(!resident(f->p, s) && missed(f->p, s));
		else
			assert_true(resident(f->p, s));
	}
	/* Every sample seen is resident or waits to be back-filled. */
	assert_int_equal(f->p->rows + f->p->nmissed, nseen);
	assert_int_equal(check_records(f), f->p->rows);

	/* Room again: the slab's index is reused and every dropped sample is
	 * back-filled, byte-exact. */
	budget(f, lay.need * lay.slab);
	for (int pass = 0; pass < 4 && f->p->nmissed; pass++)
		run_pass(f, seen, nseen);
	assert_int_equal(f->p->nmissed, 0);
	assert_int_equal(f->p->rows, nseen);
	assert_int_equal(f->p->nslabs, lay.need);
	assert_int_equal(f->p->nlive, lay.need);
	assert_int_equal(check_records(f), nseen);
	free(in_j);
	free(seen);
}

static void a_slab_given_back_leaves_the_index_and_the_device(void **state)
{
	struct fixture *f = *state;
	uint64_t *in_j = malloc(N * sizeof(*in_j)), n_j;
	uint32_t j, nlive;
	int given = 0;
	const struct batch *b;

	assert_non_null(in_j);
	fill_in_order(f, lay.need * lay.slab, N);
	assert_int_equal(f->p->rows, N);
	nlive = f->p->nlive;
	assert_int_equal(nlive, lay.need);
	j = newest_live(f->p);
	n_j = rows_in(f->p, j, in_j);

	assert_true(pool_give_slab(f->p, "test"));
	assert_true(pool_check(f->p));
	assert_false(f->p->slabs[j].live); /* the newest went */
	assert_int_equal(f->p->nlive, nlive - 1);
	assert_int_equal(f->p->budget, (nlive - 1) * lay.slab);
	assert_non_null(strstr(f->p->budget_reason, "gave a slab back"));
	assert_int_equal(f->p->rows, N - n_j);
	assert_int_equal(f->p->nmissed, n_j);
	for (uint64_t i = 0; i < n_j; i++)
		assert_true(missed(f->p, in_j[i]));
	wait_arenas(f, f->arenas0 + (int)nlive - 1);
	assert_int_equal(slabs_held(f->p), nlive - 1);

	/* The pool does not grow back before the next probe. */
	b = run_batch(f, in_j, n_j < BATCH ? (uint32_t)n_j : BATCH);
	assert_int_equal(b->hits, 0);
	assert_false(f->p->slab_pending);
	assert_int_equal(f->p->nlive, nlive - 1);

	while (pool_give_slab(f->p, "test"))
		given++;
	assert_int_equal(given, nlive - 1);
	assert_int_equal(f->p->nlive, 0);
	assert_int_equal(f->p->rows, 0);
	assert_int_equal(pool_bytes(f->p), 0);
	assert_true(pool_check(f->p));
	wait_arenas(f, f->arenas0);
	free(in_j);
}

static void pool_control_turns_a_pool_off_drops_it_and_turns_it_on(void **state)
{
	struct fixture *f = *state;
	uint64_t *all = range(0, N);
	uint64_t freed = 1, held;
	const struct batch *b;

	/* Unknown dataset: no pool reached. */
	assert_int_equal(pool_control(&f->set, "nope", POOL_DROP, &freed), 0);
	assert_int_equal(freed, 0);

	fill_in_order(f, lay.need * lay.slab, N);
	assert_int_equal(f->p->rows, N);

	/* drop: empty now, still on, fills again. */
	assert_int_equal(pool_control(&f->set, "train", POOL_DROP, &freed), 1);
	assert_true(pool_check(f->p));
	assert_int_equal(freed, lay.need * lay.slab);
	assert_true(f->p->enabled);
	assert_int_equal(f->p->rows, 0);
	assert_int_equal(f->p->nlive, 0);
	assert_int_equal(f->p->nmissed, 0);
	wait_arenas(f, f->arenas0);
	b = run_batch(f, all, BATCH); /* its misses ask for a slab again */
	assert_int_equal(b->hits, 0);
	assert_int_equal(f->p->nlive, 1);
	b = run_batch(f, all + BATCH, BATCH);
	assert_int_equal(b->nstaged, BATCH + MAX_EXTRA); /* the first batch is back-filled */
	assert_int_equal(f->p->rows, BATCH + MAX_EXTRA);

	/* off: no memory, and none taken while off. */
	held = pool_bytes(f->p);
	assert_true(held > 0);
	assert_int_equal(pool_control(&f->set, "train", POOL_OFF, &freed), 1);
	assert_true(pool_check(f->p));
	assert_false(f->p->enabled);
	assert_int_equal(freed, held);
	assert_int_equal(f->p->nlive, 0);
	assert_int_equal(f->p->rows, 0);
	assert_int_equal(pool_bytes(f->p), 0);
	wait_arenas(f, f->arenas0);
	pool_set_budget(f->p, lay.need * lay.slab, "test");
	assert_false(f->p->slab_pending);
	linger(f);
	assert_int_equal(f->p->nlive, 0);
	assert_int_equal(gpu_fake_live_allocs(), f->arenas0);

	/* on: it serves and grows again. */
	assert_int_equal(pool_control(&f->set, "train", POOL_ON, &freed), 1);
	assert_int_equal(freed, 0);
	assert_true(f->p->enabled);
	run_batch(f, all, BATCH);
	assert_true(f->p->nlive >= 1);
	b = run_batch(f, all + BATCH, BATCH);
	assert_int_equal(b->nstaged, BATCH + MAX_EXTRA);
	wait_arenas(f, f->arenas0 + (int)f->p->nlive);

	assert_int_equal(pool_control(&f->set, "train", (enum pool_action)99, &freed), -EINVAL);
	free(all);
}

static void the_last_session_leaving_gives_every_slab_back(void **state)
{
	struct fixture *f = *state;
	uint64_t *all = range(0, N);
	char why[160] = "";
	struct batch *b = &f->b[1];

	assert_ptr_equal(pool_get(&f->set, &g.ds, 0, f->x, true, why, sizeof(why)), f->p);
	assert_int_equal(f->p->sessions, 2);
	fill_in_order(f, 2 * lay.slab, N);
	assert_int_equal(f->p->nlive, 2);
	assert_int_equal(f->p->room, 0);
	assert_int_equal(f->p->nmissed, N - 2 * lay.per);

	/* One of two sessions leaves: nothing changes. */
	pool_put(f->p, 0);
	assert_int_equal(f->p->sessions, 1);
	assert_int_equal(f->p->nlive, 2);
	assert_int_equal(f->p->rows, 2 * lay.per);

	/* The last leaves with a batch of slab 0 in flight and a third slab
	 * on its way (a probe found room for the samples waiting). */
	batch_plan(f, b, all, BATCH);
	assert_int_equal(b->hits, BATCH);
	batch_submit(f, b);
	pool_set_budget(f->p, lay.need * lay.slab, "test");
	assert_true(f->p->slab_pending);
	pool_put(f->p, 0);
	assert_true(pool_check(f->p));
	assert_int_equal(f->p->sessions, 0);
	assert_int_equal(f->p->nlive, 0);
	assert_int_equal(f->p->rows, 0);
	assert_false(f->p->budget_known);
	assert_true(f->p->slabs[0].dying);
	settle(f); /* the late slab is given back too */
	assert_int_equal(f->p->nlive, 0);
	wait_arenas(f, f->arenas0 + 1); /* slab 0, pinned */

	batch_wait(f, b);
	batch_check_bytes(f, b);
	batch_finish(f, b);
	wait_arenas(f, f->arenas0);
	assert_int_equal(slabs_held(f->p), 0);

	/* A new session finds the pool empty until its first probe. */
	assert_ptr_equal(pool_get(&f->set, &g.ds, 0, f->x, true, why, sizeof(why)), f->p);
	run_batch(f, all, BATCH);
	assert_false(f->p->slab_pending);
	assert_int_equal(f->p->nlive, 0);
	free(all);
}

static void a_batch_that_fails_on_the_device_admits_nothing(void **state)
{
	struct fixture *f = *state;
	uint64_t *all = range(0, N);
	struct batch *b = &f->b[0];
	uint64_t slot = b->slot;
	struct totals t;

	budget(f, lay.need * lay.slab);
	prime(f, 0);
	/* A slot outside device memory: the gather is refused. */
	b->slot = 0x1000;
	batch_plan(f, b, all, BATCH);
	assert_int_equal(b->nstaged, BATCH);
	batch_submit(f, b);
	batch_wait(f, b);
	b->slot = slot;
	assert_int_equal(b->job->rc, -EFAULT);
	batch_finish(f, b);
	assert_int_equal(f->p->rows, 0);
	assert_int_equal(f->p->nmissed, BATCH);
	for (uint64_t s = 0; s < BATCH; s++)
		assert_true(missed(f->p, s));

	/* They are back-filled by later batches, byte-exact. */
	t = run_pass(f, all + BATCH, 4 * BATCH);
	assert_int_equal(t.nstaged - t.nmiss, BATCH);
	assert_int_equal(f->p->nmissed, 0);
	assert_int_equal(check_records(f), 5 * BATCH);
	t = run_pass(f, all, BATCH);
	assert_int_equal(t.hits, BATCH);
	free(all);
}

static void a_sample_twice_in_a_batch_is_admitted_once(void **state)
{
	struct fixture *f = *state;
	static const uint64_t twice[8] = {5, 5, 9, 5, 9, 11, 11, 5};
	const struct batch *b;
	uint32_t admitted = 0;

	budget(f, lay.need * lay.slab);
	prime(f, 5);
	batch_plan(f, &f->b[0], twice, 8);
	b = &f->b[0];
	assert_int_equal(b->hits, 0);
	assert_int_equal(b->nmiss, 8);
	assert_int_equal(b->nstaged, 8);
	for (uint32_t k = 0; k < b->nstaged; k++)
		admitted += b->plan.admit[k] != POOL_NONE;
	assert_int_equal(admitted, 3);
	batch_submit(f, &f->b[0]);
	batch_wait(f, &f->b[0]);
	batch_check_bytes(f, b);
	batch_finish(f, &f->b[0]);
	assert_int_equal(f->p->rows, 3);
	assert_int_equal(f->p->nmissed, 0);
	assert_int_equal(check_records(f), 3);

	b = run_batch(f, twice, 8);
	assert_int_equal(b->hits, 8);
	assert_int_equal(b->nstaged, 0);
}

static void a_dataset_smaller_than_a_slab_gets_one_slab_no_larger_than_it_needs(void **state)
{
	struct fixture *f = *state;
	/* Room for the whole dataset in one allocation. */
	const uint64_t fits = align_up((uint64_t)N * STRIDE, GPU_MEM_ALIGN);
	uint64_t *all = range(0, N);
	char why[160] = "";
	struct totals t;

	/* A pool made with slabs larger than the dataset. */
	pool_destroy_all(&f->set);
	f->set.cfg.slab_bytes = fits;
	f->p = pool_get(&f->set, &g.ds, 0, f->x, true, why, sizeof(why));
	assert_non_null(f->p);
	assert_true(f->p->per_slab >= N);
	assert_true((uint64_t)f->p->per_slab * STRIDE <= f->p->slab_bytes);
	/* pool_slab is the unit of allocation: a slab is never larger, and
	 * one that holds the whole dataset is no larger than that takes. */
	assert_in_range(f->p->slab_bytes, 0, fits);

	/* A budget of exactly what the dataset takes holds all of it. */
	budget(f, fits);
	prime(f, 0);
	t = run_pass(f, all, N);
	assert_int_equal(t.hits, 0);
	assert_int_equal(f->p->rows, N);
	assert_int_equal(f->p->nlive, 1);
	assert_int_equal(check_records(f), N);
	free(all);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(
			a_pool_with_room_admits_every_miss_and_serves_it_again_as_a_hit, setup,
			teardown),
		cmocka_unit_test_setup_teardown(a_whole_pool_plans_batches_from_the_device_table,
						setup, teardown),
		cmocka_unit_test_setup_teardown(a_pool_grows_no_further_than_its_dataset_needs,
						setup, teardown),
		cmocka_unit_test_setup_teardown(
			samples_missed_before_the_budget_is_known_are_back_filled_later, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			a_pool_capped_at_one_slab_serves_mixed_batches_byte_exact, setup, teardown),
		cmocka_unit_test_setup_teardown(
			shrinking_drops_slabs_and_frees_a_pinned_one_after_its_batch, setup,
			teardown),
		cmocka_unit_test_setup_teardown(a_slab_given_back_leaves_the_index_and_the_device,
						setup, teardown),
		cmocka_unit_test_setup_teardown(
			pool_control_turns_a_pool_off_drops_it_and_turns_it_on, setup, teardown),
		cmocka_unit_test_setup_teardown(the_last_session_leaving_gives_every_slab_back,
						setup, teardown),
		cmocka_unit_test_setup_teardown(a_batch_that_fails_on_the_device_admits_nothing,
						setup, teardown),
		cmocka_unit_test_setup_teardown(a_sample_twice_in_a_batch_is_admitted_once, setup,
						teardown),
		cmocka_unit_test_setup_teardown(
			a_dataset_smaller_than_a_slab_gets_one_slab_no_larger_than_it_needs, setup,
			teardown),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
