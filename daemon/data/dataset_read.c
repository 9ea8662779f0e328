/*
 * dataset_read.c — the reads that gather sample rows out of a loaded
 * dataset's shards: copies out of the mappings under the SIGBUS guard,
 * pread for shards that are not mapped, and the size check that catches a
 * file cut inside a page.  dataset.c loads what these read; `read =
 * direct` fields go to direct.c.  The why of each part is in dataset.c's
 * opening comment ("Reads", "A file truncated after load").
 *
 * DESIGN: reader threads call ds_read_field concurrently with no lock: a
 * loaded dataset is immutable, mappings are read-only and pread carries its
 * own offset.  The SIGBUS state is per thread (`guard`, a thread-local
 * pointer to a copy_guard on the reader's stack); sigbus_lock only
 * serialises installing the handler, which ds_load does on the loop thread.
 */
#include "data/dataset_int.h"

#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/streamcopy.h"
#include "data/direct.h"
#include "util.h"

/* ---- the SIGBUS guard ------------------------------------------------------ */

/* One reader's guarded copy, on its stack while copy_mapped runs. */
struct copy_guard {
	sigjmp_buf env;
	/* The shard being copied from: a fault in its mapping is a file cut
	 * short (or an I/O error), any other one is a bug.  Set before each
	 * memcpy; on_sigbus reads it, hence volatile. */
	const struct ds_shard *volatile shard;
	const uint8_t *volatile fault_addr; /* set by on_sigbus before it jumps */
};

/* The calling thread's guard while it copies out of mappings, else NULL.
 * initial-exec: on_sigbus must reach it without __tls_get_addr, which may
 * allocate and is not async-signal-safe; the daemon core is linked into
 * executables only, never dlopen()ed, so static TLS is always there. */
static __thread struct copy_guard *volatile guard __attribute__((tls_model("initial-exec")));

static pthread_mutex_t sigbus_lock = PTHREAD_MUTEX_INITIALIZER;
/* The SIGBUS disposition on_sigbus replaced, which gets every fault that is
 * not ours.  Written under sigbus_lock, only while on_sigbus is not the
 * handler, so no fault can be reading it then. */
static struct sigaction prev_sigbus;

static void on_sigbus(int sig, siginfo_t *si, void *uctx)
{
	struct copy_guard *g = guard;
	const struct ds_shard *shard = g ? g->shard : NULL;
	uintptr_t addr = (uintptr_t)si->si_addr;

	/* si_code > 0: the kernel raised it for a fault, so si_addr is real;
	 * a SIGBUS sent with kill() is never ours, wherever the thread is. */
	if (shard && si->si_code > 0 && addr >= (uintptr_t)shard->map &&
	    addr - (uintptr_t)shard->map < shard->map_len) {
		g->fault_addr = si->si_addr;
		siglongjmp(g->env, 1);
	}
	/* Not one of our copies: put the previous disposition back and let
	 * the signal happen again under it.  A fault does by itself when the
	 * instruction re-executes on return, so a genuine crash still dumps
	 * core where it happened; a sent signal is raised anew (it stays
	 * blocked, hence pending, until this handler returns). */
	sigaction(SIGBUS, &prev_sigbus, NULL);
	if (si->si_code <= 0)
		raise(sig);
}

/*
 * Makes on_sigbus the process's SIGBUS handler unless it already is (ds_load
 * calls it).  Not a
 * pthread_once: whoever handled SIGBUS may put their own handler back later
 * (cmocka does, around every test), and a copy must never fault with ours
 * gone, so each load re-checks.  Loads run on one thread; the lock is for
 * anyone else.
 *
 * Flags: SA_SIGINFO, for si_addr and si_code.  No SA_NODEFER: SIGBUS stays
 * blocked while on_sigbus runs, so a fault inside it (a bug) kills the
 * process at once instead of recursing.  That leaves SIGBUS blocked after
 * the siglongjmp, since copy_mapped's sigsetjmp(env, 0) saves no mask, so
 * copy_mapped unblocks it; saving the mask (sigsetjmp(env, 1)) would cost a
 * sigprocmask system call on every read, the thing mapping is here to avoid.
 * No SA_RESTART (faults interrupt no system call) and no SA_ONSTACK (a
 * SIGBUS leaves the reader's stack usable).
 */
int ds_install_sigbus(void)
{
	struct sigaction sa = {.sa_sigaction = on_sigbus, .sa_flags = SA_SIGINFO}, cur;
	int rc = 0;

	sigemptyset(&sa.sa_mask);
	pthread_mutex_lock(&sigbus_lock);
	if (sigaction(SIGBUS, NULL, &cur) != 0)
		rc = -errno;
	else if ((!(cur.sa_flags & SA_SIGINFO) || cur.sa_sigaction != on_sigbus) &&
		 sigaction(SIGBUS, &sa, &prev_sigbus) != 0)
		rc = -errno;
	pthread_mutex_unlock(&sigbus_lock);
	return rc;
}

/* How many of samples[0..n) are consecutive rows of shard from samples[0]
 * on: a sequential order becomes one memcpy (or pread) per shard. */
static size_t run_length(const struct ds_field *field, const struct ds_shard *shard,
			 const uint64_t *samples, size_t n)
{
	size_t run = 1;

	/* Overlapping rows (token windows) are never copied as one run. */
	if (field->row_stride != field->sample_bytes)
		return 1;
	while (run < n && samples[run] == samples[0] + run &&
	       samples[run] < shard->first_row + shard->rows)
		run++;
	return run;
}

/* The shard's row holding the byte at file offset off (0 inside the header). */
static uint64_t row_at(const struct ds_field *field, const struct ds_shard *shard, uint64_t off)
{
	return off > shard->data_offset ? (off - shard->data_offset) / field->row_stride : 0;
}

/* -EIO for a read of the byte at file offset off, which the file, now
 * `size` bytes long, no longer holds.  The rows it still holds tell the
 * operator where the cut is, which the row that failed does not. */
static int past_end(const struct ds_field *field, const struct ds_shard *shard, uint64_t off,
		    uint64_t size, char *err, size_t errlen)
{
	uint64_t held = row_at(field, shard, size);

	set_err(err, errlen,
		"%s: row %llu is past the end: the file is shorter than when it was loaded "
		"(truncated?) and holds %llu of its %llu rows",
		shard->path, (unsigned long long)row_at(field, shard, off),
		(unsigned long long)(held < shard->rows ? held : shard->rows),
		(unsigned long long)shard->rows);
	return -EIO;
}

/* While a row is copied, the loads of the first cache lines of the row
 * after next are started: a shuffled row is on a page of its own, whose
 * page walk and first lines are a stall the hardware prefetcher cannot
 * hide (it follows a stream inside a page, never into the next random
 * one).  Measured on the H200 machine's 16 Xeon cores with 13 readers
 * (bench/NOTES.md, run 35): make bench-cuda delivered 46.3 and 45.1 GB/s
 * with 4 lines, 46.2 with 16, against 39.9 and 43.1 GB/s without. */
#define ROW_PREFETCH_LINES 4

/* Where sample s of field lies in its mapped shard, or NULL. */
static const uint8_t *mapped_row(const struct ds_field *field, uint64_t s)
{
	const struct ds_shard *shard = ds_find_shard(field, s);

	if (!shard->map)
		return NULL;
	return shard->map + shard->data_offset + (s - shard->first_row) * field->row_stride;
}

/*
 * Copies the runs of samples[0..n) that live in mapped shards to dst; runs
 * of other shards are left to read_unmapped.  Returns 0, or -EIO after a
 * SIGBUS, with g->shard and g->fault_addr saying where.  The guarded region
 * is this loop and nothing else: no allocation, no lock, nothing a jump out
 * of the middle could leave half done.  After a jump only g and the
 * arguments are read, none of them changed since sigsetjmp.
 */
static int copy_mapped(const struct ds_field *field, const uint64_t *samples, size_t n,
		       uint8_t *dst, bool dma, struct copy_guard *g)
{
	uint64_t row_bytes = field->sample_bytes;
	const uint8_t *src;
	size_t i, run;

	g->shard = NULL;
	if (sigsetjmp(g->env, 0)) {
		sigset_t bus;

		guard = NULL;
		/* on_sigbus ran with SIGBUS blocked and the jump restored no
		 * mask.  It was unblocked before the fault (else the kernel
		 * kills instead), so unblocking it restores the old mask. */
		sigemptyset(&bus);
		sigaddset(&bus, SIGBUS);
		pthread_sigmask(SIG_UNBLOCK, &bus, NULL);
		if (dma)
			copy_streamed_fence(); /* the rows before the fault */
		return -EIO;
	}
	guard = g;
	for (i = 0; i < n; i += run) {
		const struct ds_shard *shard = ds_find_shard(field, samples[i]);

		run = run_length(field, shard, samples + i, n - i);
		if (!shard->map)
			continue;
		g->shard = shard;
		/* The handler must see the shard before the copy's first load;
		 * volatile alone would not stop memcpy moving above it.  A
		 * prefetch never faults, so it may name a row past a cut. */
		__atomic_signal_fence(__ATOMIC_SEQ_CST);
		if (i + run + 1 < n) {
			const uint8_t *next = mapped_row(field, samples[i + run + 1]);

			for (int l = 0;
			     next && l < ROW_PREFETCH_LINES && (uint64_t)l * 64 < row_bytes; l++)
				__builtin_prefetch(next + l * 64);
		}
		src = shard->map + shard->data_offset +
		      (samples[i] - shard->first_row) * field->row_stride;
		if (dma)
			copy_streamed(dst + i * row_bytes, src, run * row_bytes);
		else
			memcpy(dst + i * row_bytes, src, run * row_bytes);
	}
	if (dma)
		copy_streamed_fence();
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	guard = NULL;
	g->shard = NULL;
	return 0;
}

/* The message for a SIGBUS at g->fault_addr. */
static int fault_error(const struct ds_field *field, const struct copy_guard *g, char *err,
		       size_t errlen)
{
	const struct ds_shard *shard = g->shard;
	uint64_t off = (uint64_t)(g->fault_addr - shard->map);
	struct stat st;

	/* A SIGBUS at a byte the file still holds is a failed page-in (an
	 * I/O error), not a truncation. */
	if (fstat(shard->fd, &st) != 0 || (uint64_t)st.st_size > off) {
		set_err(err, errlen, "%s: I/O error at row %llu (reading its mapping)", shard->path,
			(unsigned long long)row_at(field, shard, off));
		return -EIO;
	}
	return past_end(field, shard, off, (uint64_t)st.st_size, err, errlen);
}

/* 0 when shard's file still holds its first `end` bytes. */
static int check_size(const struct ds_field *field, const struct ds_shard *shard, uint64_t end,
		      char *err, size_t errlen)
{
	struct stat st;

	if (fstat(shard->fd, &st) != 0) {
		int rc = -errno;

		set_err(err, errlen, "%s: fstat: %s", shard->path, strerror(-rc));
		return rc;
	}
	if ((uint64_t)st.st_size >= end)
		return 0;
	return past_end(field, shard, end - 1, (uint64_t)st.st_size, err, errlen);
}

/* Shards one check_mapped call tracks at a time, by index in the field mod
 * this: a field of up to 64 shards gets each fstat()ed exactly once per
 * read; past that, a collision checks the shard it evicts early, and that
 * shard may be checked again later in the same read. */
#define SEEN_SHARDS 64

/*
 * After copy_mapped: a row on the page that holds a file's new end copied
 * zeros instead of faulting, so fstat each mapped shard read from (once)
 * and fail if it no longer holds the furthest byte copied from it.  A
 * truncation after this check is the next read's to see.
 */
static int check_mapped(const struct ds_field *field, const uint64_t *samples, size_t n, char *err,
			size_t errlen)
{
	struct {
		const struct ds_shard *shard;
		uint64_t end; /* of the furthest row copied, in file bytes */
	} seen[SEEN_SHARDS];
	size_t i, k, run;
	int rc;

	memset(seen, 0, sizeof(seen));
	for (i = 0; i < n; i += run) {
		const struct ds_shard *shard = ds_find_shard(field, samples[i]);
		uint64_t end;

		run = run_length(field, shard, samples + i, n - i);
		if (!shard->map)
			continue;
		end = shard->data_offset + ds_row_end(field, samples[i] - shard->first_row, run);
		k = (size_t)(shard - field->shards) % SEEN_SHARDS;
		if (seen[k].shard != shard) {
			if (seen[k].shard) {
				rc = check_size(field, seen[k].shard, seen[k].end, err, errlen);
				if (rc)
					return rc;
			}
			seen[k].shard = shard;
			seen[k].end = end;
		} else if (end > seen[k].end) {
			seen[k].end = end;
		}
	}
	for (k = 0; k < SEEN_SHARDS; k++) {
		if (!seen[k].shard)
			continue;
		rc = check_size(field, seen[k].shard, seen[k].end, err, errlen);
		if (rc)
			return rc;
	}
	return 0;
}

/* Reads the runs of samples[0..n) that live in shards without a mapping,
 * one pread per run. */
static int read_unmapped(const struct ds_field *field, const uint64_t *samples, size_t n,
			 uint8_t *dst, char *err, size_t errlen)
{
	size_t i, run;

	for (i = 0; i < n; i += run) {
		const struct ds_shard *shard = ds_find_shard(field, samples[i]);
		uint64_t row, bytes, done = 0;
		off_t off;

		run = run_length(field, shard, samples + i, n - i);
		if (shard->map)
			continue;
		row = samples[i] - shard->first_row;
		/* Bounded: rows * sample_bytes + data_offset <= INT64_MAX (npy.c). */
		off = (off_t)(shard->data_offset + row * field->row_stride);
		bytes = run * field->sample_bytes;
		while (done < bytes) {
			ssize_t r = pread(shard->fd, dst + i * field->sample_bytes + done,
					  (size_t)(bytes - done), off + (off_t)done);

			if (r < 0) {
				int rc = -errno;

				if (rc == -EINTR)
					continue;
				set_err(err, errlen, "%s: read at row %llu: %s", shard->path,
					(unsigned long long)(row + done / field->sample_bytes),
					strerror(-rc));
				return rc;
			}
			if (r == 0) {
				set_err(err, errlen, "%s: short read at row %llu (file truncated?)",
					shard->path,
					(unsigned long long)(row + done / field->sample_bytes));
				return -EIO;
			}
			done += (uint64_t)r;
		}
	}
	return 0;
}

int ds_read_field(const struct dataset *ds, size_t field_index, const uint64_t *samples, size_t n,
		  uint8_t *dst, char *err, size_t errlen)
{
	return ds_read_field_for(ds, field_index, samples, n, dst, DS_FOR_CPU, err, errlen);
}

int ds_read_field_for(const struct dataset *ds, size_t field_index, const uint64_t *samples,
		      size_t n, uint8_t *dst, enum ds_reader next, char *err, size_t errlen)
{
	const struct ds_field *field;
	struct copy_guard g;
	size_t i;
	int rc;

	if (field_index >= ds->nfields) {
		set_err(err, errlen, "%s: no field %zu (dataset has %zu)", ds->name, field_index,
			ds->nfields);
		return -EINVAL;
	}
	field = &ds->fields[field_index];
	/* All up front: the guarded copy must have nothing left to refuse. */
	for (i = 0; i < n; i++) {
		if (samples[i] >= ds->num_samples) {
			set_err(err, errlen, "%s: sample %llu is out of range (dataset has %llu)",
				ds->name, (unsigned long long)samples[i],
				(unsigned long long)ds->num_samples);
			return -ERANGE;
		}
	}
	if (n == 0 || field->sample_bytes == 0)
		return 0;
	if (field->direct)
		return direct_read_field(field, samples, n, dst, err, errlen);
	if (field->nmapped) {
		rc = copy_mapped(field, samples, n, dst, next == DS_FOR_DMA, &g);
		if (rc)
			return fault_error(field, &g, err, errlen);
	}
	if (field->nmapped < field->nshards) {
		rc = read_unmapped(field, samples, n, dst, err, errlen);
		if (rc)
			return rc;
	}
	if (field->nmapped)
		return check_mapped(field, samples, n, err, errlen);
	return 0;
}
