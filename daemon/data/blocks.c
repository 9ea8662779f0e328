/*
 * blocks.c — the block cache of a block-shuffled direct epoch (blocks.h).
 *
 * DESIGN: b->lock guards every block's state, buffer and waiters; a reader
 * that loads a block marks it LOADING and reads with the lock dropped, so
 * no lock is ever held across IO.  Rows left and references are atomics.
 */
#include "data/blocks.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/dataset.h"
#include "data/direct.h"
#include "util.h"

enum bstate { B_ABSENT, B_LOADING, B_READY, B_FAILED, B_DONE };

struct block {
	uint32_t left; /* rows the epoch still takes from it (atomic) */
	uint8_t state; /* enum bstate, under lock */
	uint8_t *buf;  /* owned while READY: field f at b->foff[f] * rows */
	char *err;     /* owned when FAILED */
};

struct blocks {
	const struct dataset *ds; /* borrowed: outlives the session */
	uint64_t block_rows, nblocks;
	uint64_t foff[BLOCKS_MAX_FIELDS]; /* the fields' offsets in a block, per row of it */
	uint64_t row_bytes;		  /* all fields of one sample */
	struct block *blk;		  /* owned, nblocks */
	uint32_t *uses;			  /* owned: the counts blocks_new took */
	pthread_mutex_t lock;
	pthread_cond_t loaded;
	unsigned refs;		    /* atomic */
	uint64_t loads, held, peak; /* under lock */
};

struct blocks *blocks_new(const struct dataset *ds, uint64_t block_rows, uint32_t *uses)
{
	struct blocks *b = calloc(1, sizeof(*b));

	if (!b || ds->nfields > sizeof(b->foff) / sizeof(b->foff[0]) || block_rows == 0)
		goto fail;
	b->ds = ds;
	b->block_rows = block_rows;
	b->nblocks = (ds->num_samples + block_rows - 1) / block_rows;
	b->blk = calloc(b->nblocks, sizeof(*b->blk));
	if (!b->blk)
		goto fail;
	for (size_t f = 0; f < ds->nfields; f++) {
		b->foff[f] = b->row_bytes;
		b->row_bytes += ds->fields[f].sample_bytes;
	}
	for (uint64_t j = 0; j < b->nblocks; j++)
		b->blk[j].left = uses[j];
	b->uses = uses;
	pthread_mutex_init(&b->lock, NULL);
	pthread_cond_init(&b->loaded, NULL);
	b->refs = 1;
	return b;
fail:
	if (b)
		free(b->blk);
	free(b);
	free(uses);
	return NULL;
}

struct blocks *blocks_ref(struct blocks *b)
{
	__atomic_add_fetch(&b->refs, 1, __ATOMIC_RELAXED);
	return b;
}

void blocks_put(struct blocks *b)
{
	if (!b || __atomic_sub_fetch(&b->refs, 1, __ATOMIC_ACQ_REL) > 0)
		return;
	for (uint64_t j = 0; j < b->nblocks; j++) {
		free(b->blk[j].buf);
		free(b->blk[j].err);
	}
	pthread_mutex_destroy(&b->lock);
	pthread_cond_destroy(&b->loaded);
	free(b->blk);
	free(b->uses);
	free(b);
}

/* Rows of block j (the last one may be short). */
static uint64_t rows_of(const struct blocks *b, uint64_t j)
{
	uint64_t first = j * b->block_rows, n = b->ds->num_samples - first;

	return n < b->block_rows ? n : b->block_rows;
}

/* Reads block j whole, every field, into a new buffer (no lock held). */
static int load(struct blocks *b, uint64_t j, uint8_t **out, char *err, size_t errlen)
{
	uint64_t rows = rows_of(b, j), first = j * b->block_rows;
	uint64_t *samples = malloc(rows * sizeof(*samples));
	uint8_t *buf = malloc(rows * b->row_bytes > 0 ? rows * b->row_bytes : 1);
	int rc = 0;

	if (!samples || !buf) {
		set_err(err, errlen, "out of memory for a block of %" PRIu64 " rows", rows);
		rc = -ENOMEM;
		goto out;
	}
	for (uint64_t i = 0; i < rows; i++)
		samples[i] = first + i;
	for (size_t f = 0; f < b->ds->nfields && !rc; f++)
		rc = ds_read_field(b->ds, f, samples, rows, buf + b->foff[f] * rows, err, errlen);
out:
	free(samples);
	if (rc) {
		free(buf);
		buf = NULL;
	}
	*out = buf;
	return rc;
}

/* Block j ready for copying (loaded here if nobody has), or -errno; with
 * wait false, -EAGAIN while another reader loads it. */
static int acquire(struct blocks *b, uint64_t j, bool wait, char *err, size_t errlen)
{
	struct block *k = &b->blk[j];
	uint8_t *buf;
	int rc;

	pthread_mutex_lock(&b->lock);
	if (!wait && k->state == B_LOADING) {
		pthread_mutex_unlock(&b->lock);
		return -EAGAIN;
	}
	while (k->state == B_LOADING)
		pthread_cond_wait(&b->loaded, &b->lock);
	if (k->state == B_ABSENT) {
		k->state = B_LOADING;
		pthread_mutex_unlock(&b->lock);
		rc = load(b, j, &buf, err, errlen);
		pthread_mutex_lock(&b->lock);
		if (rc) {
			k->state = B_FAILED;
			k->err = strdup(err);
		} else {
			k->state = B_READY;
			k->buf = buf;
			b->loads++;
			b->held += rows_of(b, j) * b->row_bytes;
			if (b->held > b->peak)
				b->peak = b->held;
		}
		pthread_cond_broadcast(&b->loaded);
	}
	rc = k->state == B_READY ? 0 : -EIO;
	if (k->state == B_FAILED)
		set_err(err, errlen, "%s", k->err ? k->err : "a block could not be read");
	else if (k->state == B_DONE)
		/* Its count said no row was left: the order and the count disagree. */
		set_err(err, errlen, "block %" PRIu64 " was read out already", j);
	pthread_mutex_unlock(&b->lock);
	return rc;
}

/* n rows of block j were taken: its memory goes with the last. */
static void release(struct blocks *b, uint64_t j, uint32_t n)
{
	struct block *k = &b->blk[j];

	/* Never below zero: a pick the counts did not know (a bug) leaves
	 * the block to the cache's end rather than wrapping its count. */
	uint32_t left = __atomic_load_n(&k->left, __ATOMIC_RELAXED);

	do {
		if (left < n)
			return;
	} while (!__atomic_compare_exchange_n(&k->left, &left, left - n, false, __ATOMIC_ACQ_REL,
					      __ATOMIC_RELAXED));
	if (left != n)
		return;
	pthread_mutex_lock(&b->lock);
	if (k->state == B_READY) {
		free(k->buf);
		k->buf = NULL;
		k->state = B_DONE;
		b->held -= rows_of(b, j) * b->row_bytes;
	}
	pthread_mutex_unlock(&b->lock);
}

struct brow {
	uint64_t block;
	uint32_t pos;
};

static int cmp_brow(const void *x, const void *y)
{
	const struct brow *a = x, *c = y;

	if (a->block != c->block)
		return a->block < c->block ? -1 : 1;
	return a->pos < c->pos ? -1 : a->pos > c->pos;
}

static int copy_blocks(struct blocks *b, struct brow *rows, size_t n, const uint64_t *samples,
		       uint8_t *dst, const uint64_t *field_offset, uint32_t first, bool wait,
		       char *err, size_t errlen);
static void count_off(struct blocks *b, const struct brow *rows, size_t n);

int blocks_read(struct blocks *b, const uint64_t *samples, size_t n, uint8_t *dst,
		const uint64_t *field_offset, uint32_t first, char *err, size_t errlen)
{
	struct brow *rows = malloc((n ? n : 1) * sizeof(*rows));
	int rc = 0;

	if (!rows) {
		set_err(err, errlen, "out of memory");
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++) {
		rows[i].block = samples[i] / b->block_rows;
		rows[i].pos = (uint32_t)i;
	}
	/* One acquire per block of the job, not per row.  The first pass
	 * passes over blocks another reader is loading and loads the absent
	 * ones itself, so that readers whose batches draw from the same
	 * window load its blocks side by side rather than queueing behind one
	 * another's; the second waits for the ones passed over. */
	qsort(rows, n, sizeof(*rows), cmp_brow);
	for (int pass = 0; pass < 2 && !rc; pass++)
		rc = copy_blocks(b, rows, n, samples, dst, field_offset, first, pass == 1, err,
				 errlen);
	if (rc)
		/* The rows not copied are not read again this epoch either
		 * (their batch is an error batch): count them off, or their
		 * blocks would be held to the epoch's end. */
		count_off(b, rows, n);
	free(rows);
	return rc;
}

/* Counts off rows (sorted by block) not marked done, without copying. */
static void count_off(struct blocks *b, const struct brow *rows, size_t n)
{
	for (size_t i = 0, run; i < n; i += run) {
		uint32_t left = 0;

		for (run = 0; i + run < n && rows[i + run].block == rows[i].block; run++)
			left += rows[i + run].pos != UINT32_MAX;
		if (left)
			release(b, rows[i].block, left);
	}
}

void blocks_skip(struct blocks *b, const uint64_t *picks, size_t n)
{
	uint64_t samples = b->ds->num_samples;

	for (size_t i = 0; i < n; i++)
		release(b, picks[i] % samples / b->block_rows, 1);
}

/* One pass of blocks_read over the job's rows, sorted by block: the blocks
 * it can have now (all of them when wait), their rows copied and counted
 * off, and those rows marked done (pos UINT32_MAX). */
static int copy_blocks(struct blocks *b, struct brow *rows, size_t n, const uint64_t *samples,
		       uint8_t *dst, const uint64_t *field_offset, uint32_t first, bool wait,
		       char *err, size_t errlen)
{
	const struct dataset *ds = b->ds;
	int rc = 0;

	for (size_t i = 0, run; i < n && !rc; i += run) {
		uint64_t j = rows[i].block, brows = rows_of(b, j);
		const uint8_t *buf;

		for (run = 1; i + run < n && rows[i + run].block == j; run++)
			;
		if (rows[i].pos == UINT32_MAX)
			continue; /* copied in the first pass */
		rc = acquire(b, j, wait, err, errlen);
		if (rc == -EAGAIN) {
			rc = 0;
			continue;
		}
		if (rc)
			break;
		buf = b->blk[j].buf; /* stays until this job's rows are released */
		for (size_t k = i; k < i + run; k++) {
			uint32_t pos = rows[k].pos;
			uint64_t in = samples[pos] - j * b->block_rows;

			for (size_t f = 0; f < ds->nfields; f++) {
				uint64_t sb = ds->fields[f].sample_bytes;

				memcpy(dst + field_offset[f] + ((uint64_t)first + pos) * sb,
				       buf + b->foff[f] * brows + in * sb, sb);
			}
			rows[k].pos = UINT32_MAX;
		}
		release(b, j, (uint32_t)run);
	}
	return rc;
}

void blocks_stats(struct blocks *b, uint64_t *loads, uint64_t *held, uint64_t *peak)
{
	pthread_mutex_lock(&b->lock);
	*loads = b->loads;
	*held = b->held;
	*peak = b->peak;
	pthread_mutex_unlock(&b->lock);
}
