/*
 * direct.c — O_DIRECT reads of a batch's rows (see direct.h).
 *
 * DESIGN: reader threads only.  Each thread keeps a context (ring, bounce
 * buffer, scratch arrays) in thread-local storage, made at its first
 * direct read and freed by a pthread key destructor when the thread ends.
 * No locks: the shards' descriptors are shared read-only, and pread and
 * io_uring reads carry their own offsets.
 */
#include "data/direct.h"

#include <errno.h>
#include <inttypes.h>
#include <liburing.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/dataset_int.h"
#include "base/log.h"
#include "util.h"

/* The bounce buffer: the runs of one submission.  Coalesced runs are at
 * most DIRECT_RUN_MAX plus their alignment, so it holds several; a single
 * row larger than it (images of tens of MiB) grows it to fit. */
#define BOUNCE_BYTES (16u << 20)

/* One row to read: where it lies, and where it goes in the batch. */
struct drow {
	uint64_t off; /* file offset of its first byte */
	uint32_t shard;
	uint32_t pos; /* index in the batch */
};

/* One read: rows [first, first + nrows) of the sorted rows, from the
 * aligned extent [start, start + len) of shard's file, into bounce + at. */
struct drun {
	uint64_t start, len;
	uint32_t shard, first, nrows;
	size_t at;
	ssize_t got; /* bytes read, or -errno */
};

struct direct_ctx {
	bool ring_tried, have_ring;
	struct io_uring ring;
	uint8_t *bounce; /* owned, DIRECT_ALIGN-aligned, bounce_cap bytes */
	size_t bounce_cap;
	struct drow *rows;
	size_t rows_cap;
	struct drun *runs;
	size_t runs_cap;
};

static pthread_key_t ctx_key;
static pthread_once_t ctx_once = PTHREAD_ONCE_INIT;

static void ctx_free(void *arg)
{
	struct direct_ctx *x = arg;

	if (x->have_ring)
		io_uring_queue_exit(&x->ring);
	free(x->bounce);
	free(x->rows);
	free(x->runs);
	free(x);
}

static void ctx_key_make(void)
{
	pthread_key_create(&ctx_key, ctx_free);
}

static struct direct_ctx *ctx_get(void)
{
	struct direct_ctx *x;

	pthread_once(&ctx_once, ctx_key_make);
	x = pthread_getspecific(ctx_key);
	if (x)
		return x;
	x = calloc(1, sizeof(*x));
	if (!x)
		return NULL;
	if (posix_memalign((void **)&x->bounce, DIRECT_ALIGN, BOUNCE_BYTES)) {
		free(x);
		return NULL;
	}
	x->bounce_cap = BOUNCE_BYTES;
	pthread_setspecific(ctx_key, x);
	return x;
}

/* The ring, once per thread: where io_uring is refused (a seccomp profile,
 * io_uring_disabled, an old kernel) this thread reads with pread. */
static void uring_init(struct direct_ctx *x)
{
	const char *no = getenv("PREFETCHD_NO_IO_URING");
	int rc;

	x->ring_tried = true;
	if (no && *no && strcmp(no, "0") != 0)
		return;
	rc = io_uring_queue_init(DIRECT_QD, &x->ring, 0);
	if (rc < 0) {
		static bool said;

		if (!__atomic_exchange_n(&said, true, __ATOMIC_RELAXED))
			log_warn("read = direct: io_uring is not available (%s); readers use "
				 "pread, one run at a time each",
				 strerror(-rc));
		return;
	}
	x->have_ring = true;
}

int direct_uses_io_uring(void)
{
	struct direct_ctx *x = ctx_get();

	return x && x->have_ring;
}

static int cmp_row(const void *a, const void *b)
{
	const struct drow *x = a, *y = b;

	if (x->shard != y->shard)
		return x->shard < y->shard ? -1 : 1;
	return x->off < y->off ? -1 : x->off > y->off;
}

static int grow(void **p, size_t *cap, size_t want, size_t size)
{
	void *t;

	if (want <= *cap)
		return 0;
	t = realloc(*p, want * size);
	if (!t)
		return -ENOMEM;
	*p = t;
	*cap = want;
	return 0;
}

/* Reads runs[0..n) with pread, each into its place in the bounce buffer. */
static void read_pread(const struct ds_field *field, struct drun *runs, size_t n, uint8_t *bounce)
{
	for (size_t i = 0; i < n; i++) {
		struct drun *r = &runs[i];
		int fd = field->shards[r->shard].dfd;
		uint64_t done = 0;

		r->got = 0;
		while (done < r->len) {
			ssize_t k = pread(fd, bounce + r->at + done, r->len - done,
					  (off_t)(r->start + done));

			if (k < 0 && errno == EINTR)
				continue;
			if (k < 0) {
				r->got = -errno;
				break;
			}
			done += (uint64_t)k;
			r->got = (ssize_t)done;
			/* The end of the file (k == 0, or a count O_DIRECT cannot
			 * go on from): copy_out checks the rows are covered. */
			if (k == 0 || k % DIRECT_ALIGN)
				break;
		}
	}
}

/* The same through the ring: all of them in flight at once (n <= QD).  A
 * short completion is continued like a short pread. */
static int read_ring(struct direct_ctx *x, const struct ds_field *field, struct drun *runs,
		     size_t n)
{
	size_t inflight = 0;

	for (size_t i = 0; i < n; i++) {
		struct io_uring_sqe *sqe = io_uring_get_sqe(&x->ring);

		if (!sqe)
			return -EAGAIN; /* cannot happen: n <= the ring's entries */
		runs[i].got = 0;
		io_uring_prep_read(sqe, field->shards[runs[i].shard].dfd, x->bounce + runs[i].at,
				   (unsigned)runs[i].len, runs[i].start);
		io_uring_sqe_set_data(sqe, (void *)(uintptr_t)i);
		inflight++;
	}
	while (inflight) {
		struct io_uring_cqe *cqe;
		int rc = io_uring_submit_and_wait(&x->ring, 1);

		if (rc < 0 && rc != -EINTR)
			return rc;
		while (io_uring_peek_cqe(&x->ring, &cqe) == 0) {
			/* Pointer-sized data: liburing 2.1 (Ubuntu 22.04) has no
			 * io_uring_cqe_get_data64. */
			struct drun *r = &runs[(uintptr_t)io_uring_cqe_get_data(cqe)];
			int res = cqe->res;

			io_uring_cqe_seen(&x->ring, cqe);
			inflight--;
			if (res == -EINTR || res == -EAGAIN ||
			    (res > 0 && res % DIRECT_ALIGN == 0 &&
			     (uint64_t)(r->got + res) < r->len)) {
				/* Continue it: interrupted, or short but not at the end
				 * of the file (which gives a count O_DIRECT cannot go
				 * on from, or 0). */
				struct io_uring_sqe *sqe = io_uring_get_sqe(&x->ring);

				if (res > 0)
					r->got += res;
				if (!sqe)
					return -EAGAIN;
				io_uring_prep_read(sqe, field->shards[r->shard].dfd,
						   x->bounce + r->at + r->got,
						   (unsigned)(r->len - (uint64_t)r->got),
						   r->start + (uint64_t)r->got);
				io_uring_sqe_set_data(sqe, (void *)(uintptr_t)(r - runs));
				inflight++;
				continue;
			}
			if (res < 0)
				r->got = res;
			else
				r->got += res;
		}
	}
	return 0;
}

/* Copies each run's rows out of the bounce buffer into the batch, or says
 * which read failed or came up short. */
static int copy_out(const struct ds_field *field, const struct direct_ctx *x,
		    const struct drun *runs, size_t n, uint8_t *dst, char *err, size_t errlen)
{
	for (size_t i = 0; i < n; i++) {
		const struct drun *r = &runs[i];
		const struct ds_shard *shard = &field->shards[r->shard];

		for (uint32_t k = r->first; k < r->first + r->nrows; k++) {
			const struct drow *row = &x->rows[k];
			uint64_t in = row->off - r->start;

			if (r->got < 0 || (uint64_t)r->got < in + field->sample_bytes) {
				uint64_t at = row->off > shard->data_offset
						      ? (row->off - shard->data_offset) /
								field->row_stride
						      : 0;

				if (r->got < 0)
					set_err(err, errlen,
						"%s: O_DIRECT read at row %" PRIu64 ": %s",
						shard->path, at, strerror((int)-r->got));
				else
					set_err(err, errlen,
						"%s: short read at row %" PRIu64
						" (file truncated?)",
						shard->path, at);
				return r->got < 0 ? (int)r->got : -EIO;
			}
			memcpy(dst + (uint64_t)row->pos * field->sample_bytes,
			       x->bounce + r->at + in, field->sample_bytes);
		}
	}
	return 0;
}

/* Reads the nruns runs queued in x and copies their rows out. */
static int read_runs(struct direct_ctx *x, const struct ds_field *field, size_t nruns, uint8_t *dst,
		     char *err, size_t errlen)
{
	int rc;

	if (x->have_ring && (rc = read_ring(x, field, x->runs, nruns)) < 0) {
		set_err(err, errlen, "io_uring: %s", strerror(-rc));
		return rc;
	}
	if (!x->have_ring)
		read_pread(field, x->runs, nruns, x->bounce);
	return copy_out(field, x, x->runs, nruns, dst, err, errlen);
}

int direct_read_field(const struct ds_field *field, const uint64_t *samples, size_t n, uint8_t *dst,
		      char *err, size_t errlen)
{
	struct direct_ctx *x = ctx_get();
	size_t nruns = 0, used = 0, i;
	int rc;

	if (!x || grow((void **)&x->rows, &x->rows_cap, n, sizeof(*x->rows)) ||
	    grow((void **)&x->runs, &x->runs_cap, n, sizeof(*x->runs))) {
		set_err(err, errlen, "out of memory for direct reads");
		return -ENOMEM;
	}
	if (!x->ring_tried)
		uring_init(x);
	for (i = 0; i < n; i++) {
		const struct ds_shard *shard = ds_find_shard(field, samples[i]);

		x->rows[i].shard = (uint32_t)(shard - field->shards);
		x->rows[i].off =
			shard->data_offset + (samples[i] - shard->first_row) * field->row_stride;
		x->rows[i].pos = (uint32_t)i;
	}
	qsort(x->rows, n, sizeof(*x->rows), cmp_row);
	/* Runs, and reads of as many of them as the bounce buffer and the
	 * ring hold at once. */
	for (i = 0; i < n;) {
		const struct drow *row = &x->rows[i];
		uint64_t start = row->off & ~(uint64_t)(DIRECT_ALIGN - 1);
		uint64_t end = align_up(row->off + field->sample_bytes, DIRECT_ALIGN);
		uint32_t first = (uint32_t)i;
		struct drun *r;

		for (i++; i < n; i++) {
			const struct drow *next = &x->rows[i];
			uint64_t nstart = next->off & ~(uint64_t)(DIRECT_ALIGN - 1);
			uint64_t nend = align_up(next->off + field->sample_bytes, DIRECT_ALIGN);

			if (next->shard != row->shard || nstart > end + DIRECT_GAP ||
			    (nend > end ? nend : end) - start > DIRECT_RUN_MAX)
				break;
			if (nend > end)
				end = nend;
		}
		if (end - start > x->bounce_cap - used || nruns == DIRECT_QD) {
			/* Full: read what is queued, then start again. */
			rc = nruns ? read_runs(x, field, nruns, dst, err, errlen) : 0;
			if (rc)
				return rc;
			nruns = used = 0;
		}
		if (end - start > x->bounce_cap) {
			/* One row larger than the buffer: a buffer that fits it. */
			uint8_t *big;

			if (posix_memalign((void **)&big, DIRECT_ALIGN, end - start)) {
				set_err(err, errlen,
					"out of memory for a direct read of %" PRIu64 " bytes",
					end - start);
				return -ENOMEM;
			}
			free(x->bounce);
			x->bounce = big;
			x->bounce_cap = end - start;
		}
		r = &x->runs[nruns++];
		r->start = start;
		r->len = end - start;
		r->shard = row->shard;
		r->first = first;
		r->nrows = (uint32_t)(i - first);
		r->at = used;
		used += r->len;
	}
	return nruns ? read_runs(x, field, nruns, dst, err, errlen) : 0;
}
