/*
 * cuda_throughput.c — how fast prefetchd hands a shuffled epoch of 4 KiB rows
 * to a consumer on cuda:0, as a fraction of what a raw pinned
 * cudaMemcpyAsync moves to the same GPU in the same run (issue 3); then,
 * with the VRAM sample pool on, how fast a second epoch is served from the
 * pool, against the same raw copy and a device-to-device copy (issue 5).
 *
 *   build/bench/cuda_throughput [--gib G] [--readers N] [--depth N] [--ipc fd|legacy]
 *                               [--pool-batch ROWS] [--pool-depth N] [--no-pool]
 *   build/bench/cuda_throughput --gather-only NPY [--readers N]
 *
 * --gather-only measures only the readers' ceiling below on NPY (an .npy
 * of 4 KiB rows, e.g. bench/train_step.py's), with N threads (default: every
 * CPU online), prints `gather of the shuffled rows, N threads: X GB/s` and
 * exits: no GPU is used (bench/multi_gpu.py's host limit).
 *
 * It writes a dataset of one '<u1' field whose rows are 4096 bytes of
 * npygen's formula (tools/npygen.h), reads the file once so the page cache
 * holds it, and starts a real prefetchd on a temporary socket whose config
 * declares the file twice: as dataset `bench` with `pool = off` (the first
 * phase) and as `bench_pool` with `pool = on` (the pool phase; left out
 * with --no-pool).  The daemon's pool keys are otherwise its defaults
 * (`pool_bytes = auto`: only the honest probe limits the pool).
 *
 * First phase (issue 3): TIMED_EPOCHS (3) shuffled epochs in a row (seeds 4,
 * 5, 6) of `bench` in batches of 1024 rows (4 MiB) on cuda:0 through
 * libprefetch, after a warm-up on epochs 2 and 3 (seeds before them, as a
 * trainer's would be) during which the arenas are imported and the daemon's
 * probe sizes the target.  Timed: the first pf_start_epoch .. the pf_next
 * that ends the last epoch, each next epoch started as the one before ends,
 * pf_next → check → pf_release on the consumer's own stream.  One epoch
 * of 4 GiB lasts about 90 ms: too short a window on a machine whose speed
 * moves from run to run, so three are timed, epoch starts included; and
 * that TIMED_ROUNDS (3) times (seeds 4..12), the median round counting.
 * The pool is off for this dataset, so every byte crosses PCIe and the
 * figure stays comparable with the runs before the pool existed.
 *
 * Checks run as a trainer's work does: queued on the consumer's stream,
 * which pf_release waits for, and verified on the host once the phase has
 * ended.  Every batch: two 16-byte device-to-host copies that straddle row
 * boundaries (last word of row 0 + first word of row 1, last two words of
 * the last row); every 64th batch: the whole batch copied back and the
 * first and last word of every row compared.  Expected bytes are npygen's for row
 * pick % N.  Over each epoch every pick must appear exactly once.  Any
 * mismatch fails the run (exit 1): a figure for bytes that were never
 * delivered would be worthless.
 *
 * Reference, measured BEFORE the daemon starts (the stall phase needs its
 * per-batch copy time, and the GPU and the CPUs are then quiet): the same
 * number of bytes, cudaMemcpyAsync host-to-device in 4 MiB copies from a
 * pinned buffer (cudaHostAlloc, 512 MiB or the dataset if smaller, cycled;
 * as large as the daemon's ring) into a ring of 4 device slots, all queued
 * on one non-blocking stream, synchronised at the end; best of 3 after an
 * untimed pass.  The last line of the first phase's output is
 * `ratio: X.XX`, delivered GB/s over this (issue 3's figure).
 * Diagnostics, not in the ratio: the same copies from cudaHostRegister'ed
 * anonymous memory (the daemon's ring) with 4 KiB and with huge pages, and
 * `readers` threads gathering the shuffled rows from a mapping of the file
 * without the daemon (the readers' ceiling).  GB is 10^9 bytes; only sample
 * bytes count.
 *
 * Also measured, after the timed epoch:
 *   hand-off  300 pf_next calls, the consumer sleeping 2 ms after each
 *             release so that a batch is always queued: p50/p99 of the time
 *             inside pf_next (each epoch's first call, which waits for the
 *             fill, is left out).  Then the same with the consumer spinning
 *             2 ms instead (busy, like a trainer's thread queueing kernels):
 *             a thread woken from a sleep also pays for its core waking up
 *             and for caches the readers have cooled meanwhile.
 *   stall     1000 batches with a CPU spin between pf_next and pf_release as
 *             long as the reference needs to copy one batch: pf_stats' stall
 *             fraction over the phase, from the return of its first pf_next
 *             (that call pays for the epoch start and, in pf_stats, for the
 *             time since the previous phase).  Epochs that end inside the
 *             phase are followed by a new one; their first pf_next is
 *             counted by pf_stats and also reported apart.  No content
 *             checks here: they would add to the compute time.
 *
 * Pool phase (issue 5), after the first phase's session has closed, so the
 * first phase never shares the GPU with a pool: a new session on
 * `bench_pool` (the same file) on cuda:0 in batches of --pool-batch rows
 * (default 16384, 64 MiB), max_depth --pool-depth (default 16, the daemon's own default).
 *   epoch 1   untimed, shuffle seed 300, checked like the first phase's
 *             warm-up.  It is the session's first epoch, so the budget
 *             arrives with the probe after its 2nd batch, as with a real
 *             trainer; rows missed before that are the daemon's to
 *             back-fill within the epoch.  Then status is polled (up to
 *             3 s) until the pool holds N rows; its rows, bytes and budget
 *             are printed either way.
 *   epoch 2   timed exactly like the first phase's epoch (seed 301,
 *             pf_start_epoch .. the pf_next that ends it), with the two
 *             16-byte straddling copies per batch but no whole-batch copy:
 *             a 64 MiB device-to-host copy takes over a millisecond, and
 *             on the in-order consumer stream it would hold back the
 *             release of every later batch, while the whole 4 GiB epoch
 *             should take about 16 ms at the target.  Status before and
 *             after gives the session's h2d_bytes and index_bytes deltas
 *             (target: zero sample bytes over PCIe; 8 index bytes per row
 *             are expected) and the pool's hit rate.
 *   epoch 3   untimed, seed 302: every batch copied back whole and
 *             synchronously, and every word of every row compared, so the
 *             pool's gather is verified byte for byte.
 * Each of the three epochs must deliver every row exactly once.
 *
 * Second reference, measured before the daemon starts (after the first
 * and the diagnostics): cudaMemcpyAsync device-to-device of the same
 * number of bytes in copies of one pool batch, from a device buffer (the
 * pinned buffer's rows, repeated to a multiple of the batch) into a ring of
 * 4 device slots on one non-blocking stream; best of 3 after an untimed
 * pass.  The pool phase prints its own table, then `pool epoch 2 H2D
 * sample bytes: N (index bytes: M, ...)`, `ratio pool/H2D: X.XX  target
 * >= 5: met|NOT met` (over the first reference) and, last,
 * `ratio pool/D2D: X.XX`.  A missed target, a pool that is not full after
 * epoch 1, or a daemon that does not report the pool is printed, not an
 * error.
 *
 * Exit status: 0 done, 1 a failure (wrong bytes, daemon error), 2 usage or
 * no usable GPU.  A build without the CUDA toolkit (PF_CUDA=0) prints that
 * and exits 0.
 *
 * DESIGN: one thread, no locks.  The daemon is a child process (fork+exec
 * via td_start, safe after CUDA init); this process is its only consumer,
 * one session at a time.  The CUDA runtime and libprefetch's pfcuda both
 * use cuda:0's primary context.  Every exit path after the arguments goes
 * through main's one cleanup label, which stops the daemon and removes the
 * temporary directory (set PF_KEEP_TMP=1 to keep it).
 */
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"
#include "npygen.h"
#include "pfcuda.h"
#include "prefetch.h"

#if !PF_CUDA

int main(void)
{
	printf("cuda_throughput: built without CUDA\n");
	return 0;
}

#else

#include <cuda_runtime_api.h>

#define ROW_BYTES	 4096u
#define ROW_WORDS	 (ROW_BYTES / 8)
#define BATCH_ROWS	 1024u
#define BATCH_BYTES	 ((uint64_t)ROW_BYTES * BATCH_ROWS)
#define DATA_SEED	 0x5eedULL
/* Seeds follow the trainers' convention (epoch n+1 shuffled with seed + 1,
 * as the Python Loader and prefetchctl bench do), for which the daemon
 * builds the next epoch's order ahead; the timed epoch comes right after
 * the two warm-up epochs 2 and 3. */
#define WARMUP_SEED	 2u
#define SHUFFLE_SEED	 4u
#define LATENCY_SEED	 100u
#define STALL_SEED	 200u
#define DEFAULT_GIB	 4.0
#define DEFAULT_DEPTH	 32u
/* Whole epochs in the timed phase, one after the other as a trainer runs
 * them: one epoch of 4 GiB lasts about 90 ms, too short a window on a
 * machine whose speed moves between runs. */
#define TIMED_EPOCHS	 3u
/* Rounds of TIMED_EPOCHS, one after the other: the ratio takes the median
 * round (against the best of the raw copy's passes), so that one slow
 * second of a shared machine does not decide it (run 44: 0.83 in the run
 * make bench-train starts, 0.93 a minute later on the same tree). */
#define TIMED_ROUNDS	 3u
/* The daemon's pinned ring, and the pinned buffer the reference copies
 * from: the same size, so both DMA from a working set of one size. */
#define RING_BYTES	 (512ull << 20)
#define REF_SLOTS	 4u
#define REF_PASSES	 3
/* Batches taken before waiting for the probe: the client sends it after
 * its 2nd pf_next. */
#define WARMUP_FIRST	 8u
/* How long the probe may take to show in status (CUDA.md: ~3 s). */
#define PROBE_WAIT_S	 3.0
#define FULL_CHECK_EVERY 64u
#define LATENCY_BATCHES	 300u
#define LATENCY_SLEEP_US 2000u
#define STALL_BATCHES	 1000u
/* A pf_next that waits this long means the daemon is stuck, not slow. */
#define NEXT_TIMEOUT_MS	 30000
/* The pool phase.  16384 rows (64 MiB) a batch: at the 5x-H2D target a
 * batch takes about 250 us, so the ~30 us hand-off is a small part of it. */
#define POOL_DATASET	 "bench_pool"
#define POOL_BATCH_ROWS	 16384u
/* Two such batches fill the 512 MiB ring, the least a session can work with. */
#define POOL_BATCH_MAX	 ((unsigned)(RING_BYTES / 2 / ROW_BYTES))
/* The daemon's default max_depth: a trainer with room on its GPU gets this
 * target from the probe. */
#define POOL_DEPTH	 16u
#define POOL_FILL_SEED	 300u
#define POOL_TIMED_SEED	 301u
#define POOL_CHECK_SEED	 302u
/* How long back-filled rows may take to show as resident in status after
 * epoch 1 (admissions are published when their batch's gather completes). */
#define POOL_WAIT_S	 3.0
#define POOL_TARGET	 5.0

static int cuda_fail(const char *what, cudaError_t e)
{
	return td_fail("%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: cuda_throughput [--gib G] [--readers N] [--depth N] [--ipc fd|legacy]\n"
		"                       [--pool-batch ROWS] [--pool-depth N] [--no-pool]\n"
		"  --gib G            dataset size in GiB (default %.1f; rows of %u bytes)\n"
		"  --readers N        daemon reader threads (default: CPUs online - 3, >= 2)\n"
		"  --depth N          session max_depth (default %u)\n"
		"  --ipc KIND         how device arenas are shared: fd (default) or legacy\n"
		"  --pool-batch ROWS  pool phase batch size in rows (default %u, at most %u)\n"
		"  --pool-depth N     pool phase session max_depth (default %u)\n"
		"  --no-pool          skip the pool phase and its device-to-device reference\n"
		"  --gather-only NPY  only the readers' gather of NPY's shuffled 4 KiB rows\n"
		"                     (--readers N threads, default every CPU), then exit\n",
		DEFAULT_GIB, ROW_BYTES, DEFAULT_DEPTH, POOL_BATCH_ROWS, POOL_BATCH_MAX, POOL_DEPTH);
}

static int parse_gib(const char *s, double *out)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	/* 1/8 GiB is 32 batches: enough for the warm-up to mean something. */
	if (errno || end == s || *end || !(v >= 0.125 && v <= 1024))
		return td_fail("--gib: expected a number in 0.125..1024, got '%s'", s);
	*out = v;
	return 0;
}

/*
 * Finds cuda:0, makes its primary context current for the runtime and
 * prints what it is.  Returns 0, or 2 (the exit status) when there is no
 * usable GPU: `make bench-cuda` is only meant for a GPU machine, so that is
 * an error, not a skip.
 */
static int gpu_init(void)
{
	struct cudaDeviceProp prop;
	int count = 0, drv = 0, rt = 0;
	size_t free_b = 0, total_b = 0;
	char bus[32] = "?";
	cudaError_t e;

	e = cudaGetDeviceCount(&count);
	if (e != cudaSuccess || count == 0) {
		td_fail("no usable GPU: cudaGetDeviceCount: %s (this bench needs cuda:0)",
			e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
		return 2;
	}
	e = cudaSetDevice(0);
	if (e == cudaSuccess)
		e = cudaFree(NULL); /* creates the primary context now, not in a timed loop */
	if (e == cudaSuccess)
		e = cudaGetDeviceProperties(&prop, 0);
	if (e != cudaSuccess) {
		td_fail("cuda:0 is not usable: %s", cudaGetErrorString(e));
		return 2;
	}
	cudaDriverGetVersion(&drv);
	cudaRuntimeGetVersion(&rt);
	cudaDeviceGetPCIBusId(bus, sizeof(bus), 0);
	cudaMemGetInfo(&free_b, &total_b);
	printf("gpu: cuda:0 of %d: %s, sm_%d%d, bus %s, %.1f GiB (%.1f GiB free); driver %d.%d, "
	       "runtime %d.%d\n",
	       count, prop.name, prop.major, prop.minor, bus, total_b / 1073741824.0,
	       free_b / 1073741824.0, drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10);
	return 0;
}

/*
 * The references: `bytes` in cudaMemcpyAsync calls of `chunk` bytes from
 * src (src_bytes, a multiple of chunk, cycled) into REF_SLOTS device slots,
 * all queued at once on one non-blocking stream (in-order, so reusing a
 * slot is safe) and synchronised at the end.  One untimed pass, then the
 * best of REF_PASSES in *best_s.  Afterwards the last slot's first word is
 * read back and compared, so the figure is for bytes that arrived: src's
 * byte o holds the dataset's byte o % period (period: a multiple of
 * ROW_BYTES).
 */
static int ref_copy(const uint8_t *src, uint64_t src_bytes, uint64_t period,
		    enum cudaMemcpyKind kind, uint64_t chunk, uint64_t bytes, double *best_s)
{
	void *slot[REF_SLOTS] = {NULL};
	cudaStream_t stream = NULL;
	uint64_t last = 0, got = 0, want;
	cudaError_t e;
	int rc = 0;

	e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
	if (e != cudaSuccess) {
		rc = cuda_fail("cudaStreamCreateWithFlags", e);
		goto out;
	}
	for (unsigned i = 0; i < REF_SLOTS; i++) {
		e = cudaMalloc(&slot[i], chunk);
		if (e != cudaSuccess) {
			rc = cuda_fail("cudaMalloc", e);
			goto out;
		}
	}
	*best_s = 0;
	for (int pass = -1; pass < REF_PASSES; pass++) {
		double t0 = td_now(), dt;
		uint64_t i = 0;

		for (uint64_t off = 0; off < bytes; off += chunk, i++) {
			uint64_t n = bytes - off < chunk ? bytes - off : chunk;

			last = off % src_bytes;
			e = cudaMemcpyAsync(slot[i % REF_SLOTS], src + last, n, kind, stream);
			if (e != cudaSuccess) {
				rc = cuda_fail("cudaMemcpyAsync", e);
				goto out;
			}
		}
		e = cudaStreamSynchronize(stream);
		dt = td_now() - t0;
		if (e != cudaSuccess) {
			rc = cuda_fail("cudaStreamSynchronize", e);
			goto out;
		}
		if (pass >= 0 && (pass == 0 || dt < *best_s))
			*best_s = dt;
		if (td_interrupted) {
			rc = td_fail("interrupted");
			goto out;
		}
	}
	e = cudaMemcpy(&got, slot[((bytes + chunk - 1) / chunk - 1) % REF_SLOTS], sizeof(got),
		       cudaMemcpyDeviceToHost);
	if (e != cudaSuccess) {
		rc = cuda_fail("cudaMemcpy (reference check)", e);
		goto out;
	}
	want = npygen_word(npygen_row_key(DATA_SEED, last % period / ROW_BYTES), 0);
	if (got != want)
		rc = td_fail("reference: the last copy left %016" PRIx64 " on the device, expected "
			     "%016" PRIx64 " (row %" PRIu64 ")",
			     got, want, last % period / ROW_BYTES);
out:
	for (unsigned i = 0; i < REF_SLOTS; i++)
		if (slot[i])
			cudaFree(slot[i]);
	if (stream)
		cudaStreamDestroy(stream);
	return rc;
}

/* The reference of the ratio: host-to-device in 4 MiB copies from the
 * pinned buffer (pin_bytes, a multiple of 4 MiB). */
static int ref_h2d(const uint8_t *pinned, uint64_t pin_bytes, uint64_t bytes, double *best_s)
{
	return ref_copy(pinned, pin_bytes, pin_bytes, cudaMemcpyHostToDevice, BATCH_BYTES, bytes,
			best_s);
}

/*
 * The pool phase's second reference: device-to-device in copies of one
 * pool batch (chunk bytes).  The source is the pinned buffer's rows
 * uploaded once and repeated up to a multiple of chunk (at least one
 * chunk), so it is larger than the L2 cache as the pool is, and its bytes
 * are known.
 */
static int ref_d2d(const uint8_t *pinned, uint64_t pin_bytes, uint64_t chunk, uint64_t bytes,
		   double *best_s)
{
	uint64_t src_bytes = (pin_bytes > chunk ? pin_bytes / chunk : 1) * chunk;
	uint8_t *src = NULL;
	cudaError_t e;
	int rc = 0;

	e = cudaMalloc((void **)&src, src_bytes);
	if (e != cudaSuccess) {
		src = NULL;
		rc = cuda_fail("cudaMalloc (device-to-device source)", e);
		goto out;
	}
	for (uint64_t off = 0; off < src_bytes; off += pin_bytes) {
		uint64_t n = src_bytes - off < pin_bytes ? src_bytes - off : pin_bytes;

		e = cudaMemcpy(src + off, pinned, n, cudaMemcpyHostToDevice);
		if (e != cudaSuccess) {
			rc = cuda_fail("cudaMemcpy (device-to-device source)", e);
			goto out;
		}
	}
	rc = ref_copy(src, src_bytes, pin_bytes, cudaMemcpyDeviceToDevice, chunk, bytes, best_s);
out:
	if (src)
		cudaFree(src);
	return rc;
}

/*
 * Diagnostic reference: the same copies from host memory mapped the way the
 * daemon maps its ring (anonymous, page-locked with cudaHostRegister once),
 * with or without transparent huge pages.  Shows whether registered memory
 * copies as fast as cudaHostAlloc's.
 */
static int ref_h2d_registered(const uint8_t *src, uint64_t pin_bytes, uint64_t bytes, bool huge,
			      double *best_s)
{
	uint8_t *p =
		mmap(NULL, pin_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	cudaError_t e;
	int rc;

	if (p == MAP_FAILED)
		return td_fail("mmap %" PRIu64 " bytes: %s", pin_bytes, strerror(errno));
	if (huge)
		madvise(p, pin_bytes, MADV_HUGEPAGE);
	memcpy(p, src, pin_bytes);
	e = cudaHostRegister(p, pin_bytes, cudaHostRegisterPortable);
	if (e != cudaSuccess) {
		munmap(p, pin_bytes);
		return cuda_fail("cudaHostRegister", e);
	}
	rc = ref_h2d(p, pin_bytes, bytes, best_s);
	cudaHostUnregister(p);
	munmap(p, pin_bytes);
	return rc;
}

/* Diagnostic reference: the readers' work without the daemon.  `threads`
 * threads take 4 MiB batches of shuffled rows in turn and memcpy each row
 * from a read-only mapping of the file into a batch buffer of their own,
 * prefetching as the readers do. */
struct gather {
	const uint8_t *file; /* mapping: header, then rows */
	uint64_t data_off;
	const uint32_t *perm; /* rows entries */
	uint64_t rows;
	uint64_t next; /* next batch, atomically taken */
	uint8_t *bufs; /* threads * BATCH_BYTES */
};

struct gather_arg {
	struct gather *g;
	unsigned index;
};

static void *gather_main(void *arg)
{
	struct gather_arg *a = arg;
	struct gather *g = a->g;
	uint8_t *dst = g->bufs + (uint64_t)a->index * BATCH_BYTES;
	uint64_t nb = (g->rows + BATCH_ROWS - 1) / BATCH_ROWS, k;

	while ((k = __atomic_fetch_add(&g->next, 1, __ATOMIC_RELAXED)) < nb) {
		uint64_t first = k * BATCH_ROWS;
		uint64_t n = g->rows - first < BATCH_ROWS ? g->rows - first : BATCH_ROWS;

		for (uint64_t i = 0; i < n; i++) {
			/* As the readers do (daemon/data/dataset.c): the first
			 * lines of the row after next are loaded meanwhile. */
			if (i + 2 < n)
				for (int l = 0; l < 4; l++)
					__builtin_prefetch(g->file + g->data_off +
							   (uint64_t)g->perm[first + i + 2] *
								   ROW_BYTES +
							   l * 64);
			memcpy(dst + i * ROW_BYTES,
			       g->file + g->data_off + (uint64_t)g->perm[first + i] * ROW_BYTES,
			       ROW_BYTES);
		}
	}
	return NULL;
}

static int ref_gather(const char *path, uint64_t rows, unsigned threads, double *secs)
{
	struct gather g = {.rows = rows};
	struct gather_arg *args = calloc(threads, sizeof(*args));
	pthread_t *tids = calloc(threads, sizeof(*tids));
	uint32_t *perm = malloc(rows * sizeof(*perm));
	uint64_t x = 0x9e3779b97f4a7c15ull, map_bytes = 0;
	struct stat st;
	double t0;
	int fd = open(path, O_RDONLY), rc = 0;

	if (fd < 0 || fstat(fd, &st) < 0 || !args || !tids || !perm) {
		rc = td_fail("gather reference: %s: %s", path, strerror(errno));
		goto out;
	}
	map_bytes = (uint64_t)st.st_size;
	g.data_off = map_bytes - rows * ROW_BYTES;
	g.file = mmap(NULL, map_bytes, PROT_READ, MAP_SHARED, fd, 0);
	if (g.file == MAP_FAILED) {
		g.file = NULL;
		rc = td_fail("gather reference: mmap: %s", strerror(errno));
		goto out;
	}
	g.bufs = malloc((uint64_t)threads * BATCH_BYTES);
	if (!g.bufs) {
		rc = td_fail("out of memory");
		goto out;
	}
	memset(g.bufs, 0, (uint64_t)threads * BATCH_BYTES);
	for (uint64_t i = 0; i < rows; i++)
		perm[i] = (uint32_t)i;
	for (uint64_t i = rows - 1; i > 0; i--) {
		uint64_t j, t;

		x = npygen_mix(x);
		j = x % (i + 1);
		t = perm[i];
		perm[i] = perm[j];
		perm[j] = (uint32_t)t;
	}
	g.perm = perm;
	/* One untimed pass maps every page, as the daemon's warm-up does. */
	for (int pass = 0; pass < 2; pass++) {
		g.next = 0;
		t0 = td_now();
		for (unsigned i = 0; i < threads; i++) {
			args[i] = (struct gather_arg){.g = &g, .index = i};
			pthread_create(&tids[i], NULL, gather_main, &args[i]);
		}
		for (unsigned i = 0; i < threads; i++)
			pthread_join(tids[i], NULL);
		*secs = td_now() - t0;
	}
out:
	if (g.file)
		munmap((void *)g.file, map_bytes);
	if (fd >= 0)
		close(fd);
	free(g.bufs);
	free(perm);
	free(tids);
	free(args);
	return rc;
}

/* A batch's checks, queued on the stream, verified at the end of a phase. */
struct pending_check {
	uint64_t seq, epoch;
	uint32_t count;
	uint64_t pick[3];     /* of row 0, row 1 (or 0), the last row */
	int full;	      /* index into bench.full, -1: none */
	uint64_t *full_picks; /* owned: the batch's picks when full >= 0 */
};

/* What the consuming phases share. */
struct bench {
	struct pf_client *c;
	struct pfcuda_dev *dev;	    /* owned: our own retain of cuda:0's primary context */
	uint64_t rows;		    /* N, the dataset's samples */
	uint32_t batch_rows;	    /* the open session's batch_size */
	uint64_t batch_bytes;	    /* batch_rows * ROW_BYTES: a place in full */
	cudaStream_t stream;	    /* owned: the consumer's stream, which checks run on */
	struct pending_check *pend; /* owned, cap: checks queued, not yet verified */
	size_t npend, cap;
	uint64_t *spans; /* owned, pinned, cap * SPAN_WORDS words */
	uint8_t *full;	 /* owned, pinned, full_cap * batch_bytes */
	unsigned nfull, full_cap;
	uint64_t verified; /* batches whose checks passed */
};

enum check_kind {
	CHECK_NONE,
	CHECK_SPANS,	  /* per batch the straddling words, queued on the stream */
	CHECK_SAMPLED,	  /* CHECK_SPANS, and every FULL_CHECK_EVERY-th batch whole */
	CHECK_EVERY_WORD, /* every batch copied back at once, every word compared */
};

struct phase_opts {
	const char *name;
	uint64_t seed;	 /* the first epoch's; later ones (roll) take seed + 1, ... */
	uint64_t limit;	 /* batches; UINT64_MAX: one whole epoch */
	bool roll;	 /* start another epoch when one ends before limit */
	uint64_t epochs; /* roll: stop when this many have ended (0: no such end) */
	enum check_kind check;
	double spin_s; /* CPU spin between pf_next and pf_release */
	unsigned sleep_us;
	unsigned busy_us; /* CPU spin after pf_release (a trainer's thread at work) */
	uint64_t *picks;  /* NULL or room for rows per epoch (epochs, or 1): their picks in
			   * order, epoch after epoch */
	double *next_s;	  /* NULL or room for limit: pf_next durations, epoch starts left out */
};

struct phase_result {
	uint64_t batches, rows; /* rows: of the epochs whose picks are kept (see picks) */
	uint64_t epochs;	/* started by this phase */
	uint64_t expected;	/* batches pf_start_epoch announced for the first epoch */
	uint64_t nnext;		/* entries written to opts->next_s */
	double seconds;		/* wall time, pf_start_epoch .. the end */
	double start_s;		/* time in the first pf_next of each epoch after the first */
	double wait_s;		/* pf_stats differences, from the first pf_next's return */
	double busy_s;
};

/*
 * Checks run the way a trainer's work does: as copies queued on the
 * consumer's own stream, which pf_release then waits for (so the slot is
 * not rewritten under them), verified on the host when the phase ends.  A
 * synchronous copy per batch would stall the consumer on every batch and
 * measure the checks, not the daemon.
 *
 * Per batch: the last word of row 0 with the first of row 1 (a row shifted
 * or taken from the wrong pick) and the last two words of the last row (a
 * batch shorter than its count).  Every FULL_CHECK_EVERY-th batch whole:
 * first and last word of every row.
 */
#define SPAN_WORDS	 4u

static int queue_copy_back(struct bench *bn, void *dst, const uint8_t *src, size_t bytes)
{
	cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, bn->stream);

	return e == cudaSuccess ? 0 : cuda_fail("cudaMemcpyAsync (check)", e);
}

static int check_batch(struct bench *bn, const struct pf_batch *b, bool sampled)
{
	struct pending_check *pc;
	const uint8_t *base = b->data[0];
	uint64_t *w;
	uint32_t last = b->count - 1;

	if (bn->npend == bn->cap)
		return td_fail("check: more than %zu batches in one phase", bn->cap);
	pc = &bn->pend[bn->npend];
	w = bn->spans + bn->npend * SPAN_WORDS;
	memset(pc, 0, sizeof(*pc));
	pc->seq = b->seq;
	pc->epoch = b->epoch;
	pc->count = b->count;
	pc->pick[0] = b->picks[0];
	pc->pick[1] = b->picks[b->count >= 2 ? 1 : 0];
	pc->pick[2] = b->picks[last];
	pc->full = -1;
	if (b->count >= 2) {
		if (queue_copy_back(bn, w, base + ROW_BYTES - 8, 16))
			return -1;
	} else if (queue_copy_back(bn, w + 1, base, 8)) {
		return -1;
	}
	if (queue_copy_back(bn, w + 2, base + (uint64_t)last * ROW_BYTES + ROW_BYTES - 16, 16))
		return -1;
	if (sampled && b->seq % FULL_CHECK_EVERY == 0 && bn->nfull < bn->full_cap) {
		pc->full_picks = malloc(b->count * sizeof(uint64_t));
		if (!pc->full_picks)
			return td_fail("out of memory");
		pc->full = (int)bn->nfull++;
		memcpy(pc->full_picks, b->picks, b->count * sizeof(uint64_t));
		if (queue_copy_back(bn, bn->full + (uint64_t)pc->full * bn->batch_bytes, base,
				    (size_t)b->count * ROW_BYTES))
			return -1;
	}
	bn->npend++;
	return 0;
}

static int word_ok(const struct bench *bn, const struct pending_check *pc, uint64_t pick,
		   uint32_t w, uint64_t got, const char *what)
{
	uint64_t want = npygen_word(npygen_row_key(DATA_SEED, pick % bn->rows), w);

	if (got == want)
		return 0;
	return td_fail("batch %" PRIu64 " (epoch %" PRIu64 "), %s (pick %" PRIu64 "), word %u: "
		       "got %016" PRIx64 ", expected %016" PRIx64,
		       pc->seq, pc->epoch, what, pick, w, got, want);
}

/* Waits for the queued check copies and verifies them all. */
static int verify_checks(struct bench *bn)
{
	cudaError_t e = cudaStreamSynchronize(bn->stream);
	int rc = 0;

	if (e != cudaSuccess)
		return cuda_fail("cudaStreamSynchronize (checks)", e);
	for (size_t i = 0; i < bn->npend && !rc; i++) {
		const struct pending_check *pc = &bn->pend[i];
		const uint64_t *w = bn->spans + i * SPAN_WORDS;

		if (pc->count >= 2)
			rc = word_ok(bn, pc, pc->pick[0], ROW_WORDS - 1, w[0], "row 0") ||
			     word_ok(bn, pc, pc->pick[1], 0, w[1], "row 1");
		else
			rc = word_ok(bn, pc, pc->pick[0], 0, w[1], "row 0");
		if (!rc)
			rc = word_ok(bn, pc, pc->pick[2], ROW_WORDS - 2, w[2], "last row") ||
			     word_ok(bn, pc, pc->pick[2], ROW_WORDS - 1, w[3], "last row");
		for (uint32_t k = 0; !rc && pc->full >= 0 && k < pc->count; k++) {
			const uint8_t *row = bn->full + (uint64_t)pc->full * bn->batch_bytes +
					     (uint64_t)k * ROW_BYTES;
			uint64_t first, lastw;

			memcpy(&first, row, 8);
			memcpy(&lastw, row + ROW_BYTES - 8, 8);
			rc = word_ok(bn, pc, pc->full_picks[k], 0, first, "full check") ||
			     word_ok(bn, pc, pc->full_picks[k], ROW_WORDS - 1, lastw, "full check");
		}
		if (!rc)
			bn->verified++;
	}
	for (size_t i = 0; i < bn->npend; i++)
		free(bn->pend[i].full_picks);
	bn->npend = 0;
	bn->nfull = 0;
	return rc ? -1 : 0;
}

/*
 * CHECK_EVERY_WORD: the whole batch copied into full on the consumer's
 * stream, waited for, and every word of every row compared before the
 * batch is released.  Slow (a synchronous copy and 512 hashes a row), so
 * only for an untimed epoch.
 */
static int check_every_word(struct bench *bn, const struct pf_batch *b)
{
	cudaError_t e;

	if (bn->full_cap == 0)
		return td_fail("check: no room to copy a batch back");
	e = cudaMemcpyAsync(bn->full, b->data[0], (size_t)b->count * ROW_BYTES,
			    cudaMemcpyDeviceToHost, bn->stream);
	if (e == cudaSuccess)
		e = cudaStreamSynchronize(bn->stream);
	if (e != cudaSuccess)
		return cuda_fail("cudaMemcpyAsync (whole batch)", e);
	for (uint32_t k = 0; k < b->count; k++) {
		const uint8_t *row = bn->full + (uint64_t)k * ROW_BYTES;
		uint64_t key = npygen_row_key(DATA_SEED, b->picks[k] % bn->rows);

		for (uint32_t w = 0; w < ROW_WORDS; w++) {
			uint64_t got, want = npygen_word(key, w);

			memcpy(&got, row + (uint64_t)w * 8, 8);
			if (got != want)
				return td_fail("batch %" PRIu64 " (epoch %" PRIu64 "), row %u "
					       "(pick %" PRIu64 "), word %u: got %016" PRIx64
					       ", expected %016" PRIx64,
					       b->seq, b->epoch, k, b->picks[k], w, got, want);
		}
	}
	bn->verified++;
	return 0;
}

static int start_epoch(struct bench *bn, uint64_t seed, uint64_t *expected)
{
	struct pf_epoch_opts eo = {.order = PF_ORDER_SHUFFLE, .seed = seed};
	int rc = pf_start_epoch(bn->c, &eo, expected);

	if (rc)
		return td_fail("pf_start_epoch (seed %" PRIu64 "): %s (%s)", seed, pf_errmsg(bn->c),
			       strerror(-rc));
	return 0;
}

static void spin_until(double t)
{
	while (td_now() < t)
		;
}

/*
 * Takes batches per `o` (see struct phase_opts) and fills *res.  Leaves no
 * batch held; abandons an epoch it stops in the middle of.
 */
static int run_phase(struct bench *bn, const struct phase_opts *o, struct phase_result *res)
{
	struct pf_stats s0 = {0}, s1;
	struct pf_batch *b;
	struct td_progress pg;
	uint64_t in_epoch = 0, in_epoch_rows = 0, expected = 0;
	bool open_epoch;
	double t0;
	int rc;

	memset(res, 0, sizeof(*res));
	td_progress_start(&pg, o->name);
	t0 = td_now();
	if (start_epoch(bn, o->seed, &expected))
		return -1;
	res->expected = expected;
	res->epochs = 1;
	open_epoch = true;
	while (res->batches < o->limit) {
		double tn, dt;

		if (td_interrupted)
			return td_fail("interrupted");
		tn = td_now();
		/* The consumer's stream is ordered after the batch (a copy or
		 * gather libprefetch runs in this process): no CPU wait. */
		rc = pf_next_stream(bn->c, NEXT_TIMEOUT_MS, bn->stream, &b);
		dt = td_now() - tn;
		if (rc)
			return td_fail("%s: pf_next after %" PRIu64 " batches: %s (%s)", o->name,
				       res->batches, pf_errmsg(bn->c), strerror(-rc));
		if (!b) {
			open_epoch = false;
			if (in_epoch != expected)
				return td_fail("%s: epoch ended after %" PRIu64 " batches; "
					       "pf_start_epoch announced %" PRIu64,
					       o->name, in_epoch, expected);
			if (!o->roll || (o->epochs && res->epochs == o->epochs))
				break;
			if (start_epoch(bn, o->seed + res->epochs, &expected))
				return -1;
			res->epochs++;
			open_epoch = true;
			in_epoch = 0;
			in_epoch_rows = 0;
			continue;
		}
		if (res->batches == 0)
			pf_stats(bn->c, &s0);
		else if (in_epoch == 0)
			res->start_s += dt;
		else if (o->next_s)
			o->next_s[res->nnext++] = dt;
		if (b->nfields != 1 || b->count == 0 || b->count > bn->batch_rows ||
		    !b->on_device || !b->data[0] || in_epoch_rows + b->count > bn->rows) {
			rc = td_fail("%s: batch %" PRIu64
				     ": %u fields, %u rows, %s, data %p (after "
				     "%" PRIu64 " rows)",
				     o->name, b->seq, b->nfields, b->count,
				     b->on_device ? "on device" : "NOT on device",
				     b->nfields ? b->data[0] : NULL, in_epoch_rows);
			pf_release(bn->c, b, NULL);
			return rc;
		}
		for (uint32_t k = 0; k < b->count; k++) {
			if (b->picks[k] < bn->rows)
				continue;
			rc = td_fail("%s: batch %" PRIu64 ": pick %" PRIu64
				     " is not below %" PRIu64,
				     o->name, b->seq, b->picks[k], bn->rows);
			pf_release(bn->c, b, NULL);
			return rc;
		}
		if (o->check == CHECK_EVERY_WORD ? check_every_word(bn, b)
		    : o->check != CHECK_NONE	 ? check_batch(bn, b, o->check == CHECK_SAMPLED)
						 : 0) {
			pf_release(bn->c, b, NULL);
			return -1;
		}
		if (o->spin_s > 0)
			spin_until(tn + dt + o->spin_s);
		if (res->epochs <= (o->epochs ? o->epochs : 1)) {
			if (o->picks)
				memcpy(o->picks + res->rows, b->picks,
				       b->count * sizeof(*o->picks));
			res->rows += b->count;
		}
		in_epoch_rows += b->count;
		res->batches++;
		in_epoch++;
		/* Released behind the check copies queued on our stream. */
		rc = pf_release(bn->c, b, (void *)bn->stream);
		if (rc)
			return td_fail("%s: pf_release: %s (%s)", o->name, pf_errmsg(bn->c),
				       strerror(-rc));
		if (o->sleep_us)
			usleep(o->sleep_us);
		if (o->busy_us)
			spin_until(td_now() + o->busy_us / 1e6);
		td_progress(&pg, res->batches, o->limit == UINT64_MAX ? expected : o->limit,
			    "batches");
	}
	res->seconds = td_now() - t0;
	if (o->check != CHECK_NONE && verify_checks(bn))
		return -1;
	if (open_epoch && in_epoch < expected) {
		rc = pf_abandon(bn->c);
		if (rc)
			return td_fail("%s: pf_abandon: %s (%s)", o->name, pf_errmsg(bn->c),
				       strerror(-rc));
	}
	pf_stats(bn->c, &s1);
	if (res->batches) {
		res->wait_s = s1.wait_s - s0.wait_s;
		res->busy_s = s1.busy_s - s0.busy_s;
	}
	return 0;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/*
 * Polls the daemon's status until the session reports a probe (or
 * PROBE_WAIT_S passes) and prints its target.  Not fatal: a daemon that
 * never probes still gets measured, and the output says so.
 */
static void wait_for_probe(const char *sock, uint64_t session)
{
	double deadline = td_now() + PROBE_WAIT_S;

	for (;;) {
		Pf__Envelope *env = td_status(sock);
		Pf__SessionStatus *ss = td_session(env, session);
		bool done = ss && ss->probe_total > 0;

		if (done || td_now() >= deadline) {
			if (ss)
				printf("warm-up: %s; target %u (%s)\n",
				       done ? "probe seen" : "NO probe within 3 s", ss->target,
				       ss->target_reason);
			else
				printf("warm-up: session %" PRIu64 " not in the daemon's status\n",
				       session);
			if (env)
				pf__envelope__free_unpacked(env, NULL);
			return;
		}
		if (env)
			pf__envelope__free_unpacked(env, NULL);
		usleep(50000);
	}
}

static void describe_pool(const Pf__PoolStatus *p, char *buf, size_t len)
{
	snprintf(buf, len,
		 "%s %s, %" PRIu64 " of %" PRIu64 " rows resident, %.1f MiB in %u slabs of "
		 "%.0f MiB, budget %.2f GiB (%s), hit rate %.3f (epoch before %.3f), %.2f GB saved",
		 p->device ? p->device : "?", p->enabled ? "on" : "off", p->rows, p->samples,
		 p->bytes / 1048576.0, p->slabs, p->slab_bytes / 1048576.0,
		 p->budget / 1073741824.0, p->budget_reason ? p->budget_reason : "", p->hit_rate,
		 p->last_hit_rate, p->h2d_saved / 1e9);
}

/* The daemon's own view of the session, printed just before pf_close. */
static void print_status(const char *sock, uint64_t session)
{
	Pf__Envelope *env = td_status(sock);
	Pf__SessionStatus *ss = td_session(env, session);
	Pf__PoolStatus *pool;
	char words[400];

	if (!ss) {
		printf("status: session %" PRIu64 " not found (%s)\n", session,
		       env ? "no such session" : "status request failed");
	} else {
		printf("status: session %" PRIu64 " on %s, state %s: target %u (%s), depth "
		       "%u..%u, slots %u, held %" PRIu64 ", arenas %u (%.1f MiB)\n",
		       session, ss->device, ss->state, ss->target, ss->target_reason, ss->min_depth,
		       ss->max_depth, ss->slots, ss->held, ss->arenas, ss->arena_bytes / 1048576.0);
		printf("status: probe free/total %.1f/%.1f GiB, copy %.2f GB/s, sent %.2f GB, "
		       "errors %" PRIu64 ", stall %.3f\n",
		       ss->probe_free / 1073741824.0, ss->probe_total / 1073741824.0, ss->copy_gbps,
		       ss->bytes_sent / 1e9, ss->errors, ss->stall_fraction);
		/* One GPU in this bench: a dataset's first pool is cuda:0's. */
		pool = td_pool(env, ss->dataset);
		if (pool)
			describe_pool(pool, words, sizeof(words));
		else
			snprintf(words, sizeof(words), "none listed for %s", ss->dataset);
		printf("status: H2D %.2f GB, pool hits %" PRIu64
		       " rows, index %.1f MiB; pool: %s\n",
		       ss->h2d_bytes / 1e9, ss->pool_hits, ss->index_bytes / 1048576.0, words);
		printf("status: daemon ring %.0f MiB, gpu: %s\n",
		       env->status_reply->ring_bytes / 1048576.0, env->status_reply->gpu);
	}
	if (env)
		pf__envelope__free_unpacked(env, NULL);
}

/* What the pool phase reads from status around its epochs. */
struct pool_snap {
	uint64_t h2d, hits, index; /* the session's cumulative h2d_bytes, pool_hits, index_bytes */
	bool have_pool;		   /* the daemon lists a pool for bench_pool */
	uint64_t rows, samples;
	double hit_rate, last_hit_rate;
	char words[400]; /* describe_pool's, or why there is none */
};

/* A status request is a daemon round trip like any other: its failure, or
 * an open session missing from the reply, fails the run.  A missing pool
 * does not (the output says so). */
static int pool_snapshot(const char *sock, uint64_t session, struct pool_snap *out)
{
	Pf__Envelope *env = td_status(sock);
	Pf__SessionStatus *ss = td_session(env, session);
	Pf__PoolStatus *p;
	int rc = 0;

	memset(out, 0, sizeof(*out));
	if (!ss) {
		rc = td_fail("status: %s", env ? "the pool phase's session is not listed"
					       : "the status request failed");
		goto out;
	}
	out->h2d = ss->h2d_bytes;
	out->hits = ss->pool_hits;
	out->index = ss->index_bytes;
	p = td_pool(env, POOL_DATASET);
	if (!p) {
		snprintf(out->words, sizeof(out->words), "the daemon's status lists no pool for %s",
			 POOL_DATASET);
		goto out;
	}
	out->have_pool = true;
	out->rows = p->rows;
	out->samples = p->samples;
	out->hit_rate = p->hit_rate;
	out->last_hit_rate = p->last_hit_rate;
	describe_pool(p, out->words, sizeof(out->words));
out:
	if (env)
		pf__envelope__free_unpacked(env, NULL);
	return rc;
}

/* The pool phase's figures (see the top of the file). */
struct pool_result {
	struct phase_result fill, timed, full;
	struct pool_snap after_fill, after_timed;
	double fill_wait_s;   /* status polled after epoch 1 until the pool held N rows */
	uint64_t verified[3]; /* per epoch, batches whose checks passed */
};

static int whole_epoch(struct bench *bn, const struct phase_opts *o, struct phase_result *res)
{
	if (run_phase(bn, o, res))
		return -1;
	if (res->batches != res->expected || !td_is_permutation(o->picks, res->rows, bn->rows))
		return td_fail("%s did not deliver every row exactly once (%" PRIu64 " rows in "
			       "%" PRIu64 " of %" PRIu64 " batches)",
			       o->name, res->rows, res->batches, res->expected);
	return 0;
}

/*
 * The pool phase: its own session on bench_pool, three whole epochs (see
 * the top of the file).  On success the session is closed; on failure
 * main's cleanup closes it.  picks: room for N.
 */
static int run_pool(struct bench *bn, const char *sock, enum pf_ipc ipc, unsigned batch_rows,
		    unsigned depth, uint64_t *picks, struct pool_result *pr)
{
	uint64_t nbatches = (bn->rows + batch_rows - 1) / batch_rows, v0 = bn->verified;
	struct pf_stats ps;
	struct pf_field fi;
	double t0, deadline;
	cudaError_t e;
	int st;

	memset(pr, 0, sizeof(*pr));
	/* Whole-batch copies of epoch 1 (every 64th batch) and epoch 3 (one
	 * at a time) land here, a pool batch apart. */
	bn->batch_rows = batch_rows;
	bn->batch_bytes = (uint64_t)batch_rows * ROW_BYTES;
	if (bn->full)
		cudaFreeHost(bn->full);
	bn->full_cap = (unsigned)(nbatches / FULL_CHECK_EVERY + 2);
	e = cudaHostAlloc((void **)&bn->full, (uint64_t)bn->full_cap * bn->batch_bytes,
			  cudaHostAllocPortable);
	if (e != cudaSuccess) {
		bn->full = NULL;
		bn->full_cap = 0;
		return cuda_fail("cudaHostAlloc (pool phase checks)", e);
	}

	st = pf_connect(sock, &bn->c);
	if (st)
		return td_fail("pf_connect %s: %s (%s)", sock, pf_errmsg(bn->c), strerror(-st));
	st = pf_open(bn->c, &(struct pf_open_opts){.dataset = POOL_DATASET,
						   .device = "cuda:0",
						   .batch_size = batch_rows,
						   .max_depth = depth,
						   .ipc = ipc,
						   .name = "cuda_throughput pool"});
	if (st)
		return td_fail("pf_open %s on cuda:0: %s (%s)", POOL_DATASET, pf_errmsg(bn->c),
			       strerror(-st));
	if (pf_num_samples(bn->c) != bn->rows || pf_num_fields(bn->c) != 1 ||
	    pf_field_info(bn->c, 0, &fi) != 0 || fi.sample_bytes != ROW_BYTES)
		return td_fail("daemon serves %" PRIu64
			       " samples in %u fields of %s; wrote %" PRIu64 " rows of %u B in 1",
			       pf_num_samples(bn->c), pf_num_fields(bn->c), POOL_DATASET, bn->rows,
			       ROW_BYTES);
	pf_stats(bn->c, &ps);

	if (whole_epoch(bn,
			&(struct phase_opts){.name = "pool epoch 1 (fills the pool)",
					     .seed = POOL_FILL_SEED,
					     .limit = UINT64_MAX,
					     .check = CHECK_SAMPLED,
					     .picks = picks},
			&pr->fill))
		return -1;
	pr->verified[0] = bn->verified - v0;
	t0 = td_now();
	deadline = t0 + POOL_WAIT_S;
	for (;;) {
		struct pool_snap *s = &pr->after_fill;

		if (pool_snapshot(sock, ps.session, s))
			return -1;
		if ((s->have_pool && s->samples > 0 && s->rows >= s->samples) ||
		    td_now() >= deadline)
			break;
		if (td_interrupted)
			return td_fail("interrupted");
		usleep(50000);
	}
	pr->fill_wait_s = td_now() - t0;

	v0 = bn->verified;
	if (whole_epoch(bn,
			&(struct phase_opts){.name = "pool epoch 2 (timed)",
					     .seed = POOL_TIMED_SEED,
					     .limit = UINT64_MAX,
					     .check = CHECK_SPANS,
					     .picks = picks},
			&pr->timed))
		return -1;
	pr->verified[1] = bn->verified - v0;
	if (pool_snapshot(sock, ps.session, &pr->after_timed))
		return -1;

	v0 = bn->verified;
	if (whole_epoch(bn,
			&(struct phase_opts){.name = "pool epoch 3 (every word checked)",
					     .seed = POOL_CHECK_SEED,
					     .limit = UINT64_MAX,
					     .check = CHECK_EVERY_WORD,
					     .picks = picks},
			&pr->full))
		return -1;
	pr->verified[2] = bn->verified - v0;

	print_status(sock, ps.session);
	pf_close(bn->c);
	bn->c = NULL;
	return 0;
}

/* The pool phase's lines, after its session has closed. */
static void print_pool(const struct pool_result *pr, uint64_t rows, uint64_t bytes,
		       uint64_t batch_bytes, double t_ref, double t_d2d)
{
	const struct pool_snap *a = &pr->after_fill, *b = &pr->after_timed;
	const struct phase_result *ep = &pr->timed;
	double gbs = bytes / 1e9 / ep->seconds, ref_gbs = bytes / 1e9 / t_ref;
	double d2d_gbs = bytes / 1e9 / t_d2d;
	/* Epoch 1 started with an empty pool, so its rows crossed PCIe: a
	 * session whose h2d_bytes is still 0 after it does not report them,
	 * and a 0 after epoch 2 would say nothing. */
	bool reported = a->h2d > 0;
	uint64_t h2d = b->h2d - a->h2d, index = b->index - a->index, hits = b->hits - a->hits;
	const char *full = !a->have_pool			     ? "NO POOL"
			   : a->samples > 0 && a->rows >= a->samples ? "full"
								     : "NOT full";
	char label[64];

	printf("pool after epoch 1 (status polled for %.2f s): %s: %s\n", pr->fill_wait_s, full,
	       a->words);
	printf("checked: pool epoch 1 as the warm-up, epoch 2 two straddling 16-byte copies a "
	       "batch, epoch 3 every word of every row (%" PRIu64 ", %" PRIu64 " and %" PRIu64
	       " batches); each epoch delivered each of %" PRIu64 " rows once\n",
	       pr->verified[0], pr->verified[1], pr->verified[2], rows);
	printf("consumer: pool epoch 2 waited %.3f s in pf_next, busy %.3f s between calls\n",
	       ep->wait_s, ep->busy_s);
	printf("\n%-40s %8s %11s %7s %9s\n", "", "GB/s", "batches/s", "stall", "seconds");
	printf("%-40s %8.2f %11.1f %7.3f %9.3f\n", "pool epoch 2 delivered on cuda:0", gbs,
	       ep->batches / ep->seconds,
	       ep->wait_s + ep->busy_s > 0 ? ep->wait_s / (ep->wait_s + ep->busy_s) : 0.0,
	       ep->seconds);
	printf("%-40s %8.2f %11.1f %7s %9.3f\n", "raw pinned H2D 4 MiB, 1 stream", ref_gbs,
	       ep->batches / t_ref, "-", t_ref);
	snprintf(label, sizeof(label), "device-to-device copy %.0f MiB, 1 stream",
		 batch_bytes / 1048576.0);
	printf("%-40s %8.2f %11.1f %7s %9.3f\n", label, d2d_gbs, ep->batches / t_d2d, "-", t_d2d);
	printf("\n");
	if (reported)
		printf("pool epoch 2 H2D sample bytes: %" PRIu64 " (index bytes: %" PRIu64
		       ", %.2f a row)  target 0: %s\n",
		       h2d, index, (double)index / (double)rows, h2d == 0 ? "met" : "NOT met");
	else
		printf("pool epoch 2 H2D sample bytes: not reported (the session's h2d_bytes was "
		       "0 after epoch 1; index bytes: %" PRIu64 ")  target 0: NOT met\n",
		       index);
	if (b->have_pool)
		printf("pool epoch 2 rows from the pool: %" PRIu64 " of %" PRIu64
		       "; pool hit rate %.3f (epoch 1: %.3f)\n",
		       hits, rows, b->hit_rate, b->last_hit_rate);
	else
		printf("pool epoch 2 rows from the pool: %" PRIu64 " of %" PRIu64 "; %s\n", hits,
		       rows, b->words);
	printf("ratio pool/H2D: %.2f  target >= %.0f: %s\n", gbs / ref_gbs, POOL_TARGET,
	       gbs >= POOL_TARGET * ref_gbs ? "met" : "NOT met");
	printf("ratio pool/D2D: %.2f\n", gbs / d2d_gbs);
}

/* PF_BENCH_LOG=1: the daemon's own account of each epoch (its debug lines
 * on the time per stage, the order and the pool), for finding where the
 * time goes. */
static void show_daemon_timing(const char *log)
{
	FILE *f = fopen(log, "re");
	char line[1024];

	if (!f)
		return;
	printf("\ndaemon log (PF_BENCH_LOG):\n");
	while (fgets(line, sizeof(line), f))
		if (strstr(line, "per batch") || strstr(line, "picks ready") ||
		    strstr(line, "first batch") || strstr(line, "pool "))
			fputs(line, stdout);
	fclose(f);
}

/* --gather-only: the readers' ceiling on an existing .npy of 4 KiB rows. */
static int gather_only_main(const char *path, unsigned threads)
{
	struct stat st;
	double secs = 0;

	if (stat(path, &st) < 0) {
		td_fail("--gather-only %s: %s", path, strerror(errno));
		return 1;
	}
	if ((uint64_t)st.st_size < 2 * BATCH_BYTES) {
		td_fail("--gather-only %s: %lld bytes is not a file of 4 KiB rows to gather", path,
			(long long)st.st_size);
		return 1;
	}
	/* The header (under 4 KiB) comes first: the rows are the last
	 * size / 4096 of them. */
	if (ref_gather(path, (uint64_t)st.st_size / ROW_BYTES, threads, &secs) || secs <= 0)
		return 1;
	printf("gather of the shuffled rows, %u threads: %.2f GB/s\n", threads,
	       (double)((uint64_t)st.st_size / ROW_BYTES * ROW_BYTES) / 1e9 / secs);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"gib", required_argument, NULL, 'g'},
		{"readers", required_argument, NULL, 'r'},
		{"depth", required_argument, NULL, 'd'},
		{"ipc", required_argument, NULL, 'i'},
		{"pool-batch", required_argument, NULL, 'b'},
		{"pool-depth", required_argument, NULL, 'p'},
		{"no-pool", no_argument, NULL, 'n'},
		{"gather-only", required_argument, NULL, 'G'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	long online = sysconf(_SC_NPROCESSORS_ONLN);
	/* The consumer, the daemon's loop thread and its transfer thread each
	 * want a CPU of their own; the readers get the rest. */
	unsigned readers = online > 5 ? (unsigned)online - 3 : 2, depth = DEFAULT_DEPTH;
	unsigned pool_rows = POOL_BATCH_ROWS, pool_depth = POOL_DEPTH;
	bool pool = true;
	double gib = DEFAULT_GIB, t_ref = 0, gbs, ref_gbs, batch_s;
	double t_reg = 0, t_reg_huge = 0, t_gather = 0, t_d2d = 0;
	struct pool_result pr;
	enum pf_ipc ipc = PF_IPC_FD;
	struct tdaemon td = {0};
	struct bench bn = {0};
	struct phase_result warm, ep, lat, lat_busy, stall, rounds[TIMED_ROUNDS];
	double round_gbs[TIMED_ROUNDS];
	unsigned order[TIMED_ROUNDS];
	struct pf_stats ps;
	struct pf_field fi;
	uint8_t *pinned = NULL;
	uint64_t *picks = NULL, rows, bytes, pin_bytes, session_bytes, pool_batch_bytes;
	double *next_s = NULL, *busy_s = NULL;
	char data_path[400], extra[512], datasets[1200], msg[256] = "";
	bool started = false; /* the daemon was launched: its log is worth showing */
	bool readers_set = false;
	const char *gather_only = NULL;
	int opt, rc = 1, st;
	cudaError_t e;

	while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (opt) {
		case 'g':
			if (parse_gib(optarg, &gib))
				return 2;
			break;
		case 'r':
			if (td_parse_uint("--readers", optarg, 1, 256, &readers))
				return 2;
			readers_set = true;
			break;
		case 'd':
			if (td_parse_uint("--depth", optarg, 1, 4096, &depth))
				return 2;
			break;
		case 'i':
			if (strcmp(optarg, "fd") == 0) {
				ipc = PF_IPC_FD;
			} else if (strcmp(optarg, "legacy") == 0) {
				ipc = PF_IPC_LEGACY;
			} else {
				td_fail("--ipc: expected fd or legacy, got '%s'", optarg);
				return 2;
			}
			break;
		case 'b':
			/* From the first phase's batch (the check buffers are sized
			 * for its batch count) to what two ring slots can hold. */
			if (td_parse_uint("--pool-batch", optarg, BATCH_ROWS, POOL_BATCH_MAX,
					  &pool_rows))
				return 2;
			break;
		case 'p':
			if (td_parse_uint("--pool-depth", optarg, 1, 4096, &pool_depth))
				return 2;
			break;
		case 'n': pool = false; break;
		case 'G': gather_only = optarg; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (optind != argc) {
		usage(stderr);
		return 2;
	}
	if (gather_only)
		return gather_only_main(gather_only, readers_set ? readers : (unsigned)online);
	td_catch_signals();

	rows = (uint64_t)(gib * 1073741824.0) / ROW_BYTES;
	bytes = rows * ROW_BYTES;
	/* A multiple of BATCH_BYTES (rows >= 32768), so a 4 MiB copy from
	 * any multiple of 4 MiB stays inside it. */
	pin_bytes = bytes / BATCH_BYTES * BATCH_BYTES;
	if (pin_bytes > RING_BYTES)
		pin_bytes = RING_BYTES;
	/* The session's slots are max_depth in flight plus what the consumer
	 * may hold (sess.h's SESS_HOLD_SLOTS = 2); twice that, so the session
	 * is never trimmed by session_bytes whatever a slot's padding. */
	session_bytes = 2 * ((uint64_t)depth + 2) * BATCH_BYTES;
	/* The same for the pool phase's session.  The first session's slot
	 * count depends on session_bytes only when it does not fit (sess.c),
	 * so raising the cap for the pool phase leaves the first phase as it
	 * was. */
	pool_batch_bytes = (uint64_t)pool_rows * ROW_BYTES;
	if (pool && 2 * ((uint64_t)pool_depth + 2) * pool_batch_bytes > session_bytes)
		session_bytes = 2 * ((uint64_t)pool_depth + 2) * pool_batch_bytes;

	td_print_machine(online);
	st = gpu_init();
	if (st)
		return st;
	printf("dataset: %" PRIu64 " rows x %u B = %.2f GiB, one '<u1' field; batch %u rows "
	       "(%.0f MiB); readers %u, max_depth %u, ipc %s, ring %llu MiB\n",
	       rows, ROW_BYTES, bytes / 1073741824.0, BATCH_ROWS, BATCH_BYTES / 1048576.0, readers,
	       depth, ipc == PF_IPC_FD ? "fd" : "legacy", RING_BYTES >> 20);
	if (pool)
		printf("pool phase: the same file as dataset %s with pool = on, batch %u rows "
		       "(%.0f MiB), max_depth %u\n",
		       POOL_DATASET, pool_rows, pool_batch_bytes / 1048576.0, pool_depth);
	else
		printf("pool phase: skipped (--no-pool)\n");
	fflush(stdout);

	e = cudaHostAlloc((void **)&pinned, pin_bytes, cudaHostAllocDefault);
	if (e != cudaSuccess) {
		pinned = NULL;
		cuda_fail("cudaHostAlloc (reference source)", e);
		goto out;
	}
	/* Portable: pinned for every context, whichever one pfcuda's copies
	 * run in. */
	/* The consumer's stream and the pinned landing places of its checks
	 * (portable: pinned for every context). */
	e = cudaStreamCreateWithFlags(&bn.stream, cudaStreamNonBlocking);
	if (e != cudaSuccess) {
		bn.stream = NULL;
		cuda_fail("cudaStreamCreateWithFlags (consumer)", e);
		goto out;
	}
	bn.batch_rows = BATCH_ROWS;
	bn.batch_bytes = BATCH_BYTES;
	bn.cap = TIMED_EPOCHS * (rows / BATCH_ROWS + 1) + 2 * ((uint64_t)depth + 2) + 64;
	bn.full_cap = (unsigned)(TIMED_EPOCHS * (rows / BATCH_ROWS / FULL_CHECK_EVERY + 1) + 2);
	bn.pend = calloc(bn.cap, sizeof(*bn.pend));
	e = cudaHostAlloc((void **)&bn.spans, bn.cap * SPAN_WORDS * 8, cudaHostAllocPortable);
	if (e != cudaSuccess) {
		bn.spans = NULL;
		cuda_fail("cudaHostAlloc (check words)", e);
		goto out;
	}
	e = cudaHostAlloc((void **)&bn.full, (uint64_t)bn.full_cap * BATCH_BYTES,
			  cudaHostAllocPortable);
	if (e != cudaSuccess) {
		bn.full = NULL;
		cuda_fail("cudaHostAlloc (full checks)", e);
		goto out;
	}
	picks = malloc(TIMED_EPOCHS * rows * sizeof(*picks));
	next_s = malloc((LATENCY_BATCHES + 1) * sizeof(*next_s));
	busy_s = malloc((LATENCY_BATCHES + 1) * sizeof(*busy_s));
	if (!picks || !next_s || !busy_s || !bn.pend) {
		td_fail("out of memory");
		goto out;
	}

	if (td_bench_dataset(&td,
			     &(struct td_rows){.rows = rows,
					       .row_bytes = ROW_BYTES,
					       .seed = DATA_SEED,
					       .progress = true},
			     data_path, sizeof(data_path), pinned, pin_bytes))
		goto out;
	fflush(stdout);

	fprintf(stderr, "cuda_throughput: reference: pinned cudaMemcpyAsync ...\n");
	if (ref_h2d(pinned, pin_bytes, bytes, &t_ref))
		goto out;
	ref_gbs = bytes / 1e9 / t_ref;
	batch_s = BATCH_BYTES / (ref_gbs * 1e9);
	fprintf(stderr, "cuda_throughput: diagnostics: registered memory, gather ...\n");
	if (ref_h2d_registered(pinned, pin_bytes, bytes, false, &t_reg) ||
	    ref_h2d_registered(pinned, pin_bytes, bytes, true, &t_reg_huge) ||
	    ref_gather(data_path, rows, readers, &t_gather))
		goto out;
	if (pool) {
		fprintf(stderr,
			"cuda_throughput: reference: device-to-device cudaMemcpyAsync ...\n");
		if (ref_d2d(pinned, pin_bytes, pool_batch_bytes, bytes, &t_d2d))
			goto out;
	}
	/* The daemon's ring and arenas get the memory the reference used. */
	cudaFreeHost(pinned);
	pinned = NULL;

	st = pfcuda_open(0, &bn.dev, msg, sizeof(msg));
	if (st) {
		td_fail("pfcuda_open(0): %s (%s)", msg, strerror(-st));
		goto out;
	}
	bn.rows = rows;

	snprintf(extra, sizeof(extra),
		 "readers = %u\nipc = %s\nring_bytes = %llu\nsession_bytes = %" PRIu64 "\n"
		 "depth = %u\nmax_depth = %u\n",
		 readers, ipc == PF_IPC_FD ? "fd" : "legacy", RING_BYTES, session_bytes,
		 depth < 4 ? depth : 4, depth);
	/* Two datasets over one file: the pool is per dataset, so the first
	 * phase's figure stays a pure H2D one, comparable with the runs
	 * before the pool existed. */
	if (pool)
		snprintf(datasets, sizeof(datasets),
			 "[dataset.bench]\nformat = npy\nfield.rows = %s\npool = off\n\n"
			 "[dataset.%s]\nformat = npy\nfield.rows = %s\npool = on\n",
			 data_path, POOL_DATASET, data_path);
	else
		snprintf(datasets, sizeof(datasets),
			 "[dataset.bench]\nformat = npy\nfield.rows = %s\npool = off\n", data_path);
	started = true;
	st = td_start(&td, extra, datasets);
	if (st) {
		td_fail("td_start: %s (prefetchd %s)", strerror(-st),
			st == -ECHILD ? "exited at start" : "did not answer within 10 s");
		goto out;
	}
	st = pf_connect(td.sock, &bn.c);
	if (st) {
		td_fail("pf_connect %s: %s (%s)", td.sock, pf_errmsg(bn.c), strerror(-st));
		goto out;
	}
	st = pf_open(bn.c, &(struct pf_open_opts){.dataset = "bench",
						  .device = "cuda:0",
						  .batch_size = BATCH_ROWS,
						  .max_depth = depth,
						  .ipc = ipc,
						  .name = "cuda_throughput"});
	if (st) {
		td_fail("pf_open cuda:0: %s (%s)", pf_errmsg(bn.c), strerror(-st));
		goto out;
	}
	if (pf_num_samples(bn.c) != rows || pf_num_fields(bn.c) != 1 ||
	    pf_field_info(bn.c, 0, &fi) != 0 || fi.sample_bytes != ROW_BYTES) {
		td_fail("daemon serves %" PRIu64 " samples in %u fields; wrote %" PRIu64
			" rows of %u B in 1",
			pf_num_samples(bn.c), pf_num_fields(bn.c), rows, ROW_BYTES);
		goto out;
	}
	pf_stats(bn.c, &ps);

	/* Not timed: imports the arenas, lets the probe size the target, then
	 * takes enough batches for every slot of that target to be used once. */
	if (run_phase(&bn,
		      &(struct phase_opts){.name = "warm-up before the probe",
					   .seed = WARMUP_SEED,
					   .limit = WARMUP_FIRST,
					   .check = CHECK_SAMPLED},
		      &warm))
		goto out;
	wait_for_probe(td.sock, ps.session);
	if (run_phase(&bn,
		      &(struct phase_opts){.name = "warm-up after the probe",
					   .seed = WARMUP_SEED + 1,
					   .limit = 2 * ((uint64_t)depth + 2) + 16,
					   .check = CHECK_SAMPLED},
		      &warm))
		goto out;

	for (unsigned r = 0; r < TIMED_ROUNDS; r++) {
		struct phase_result *rp = &rounds[r];

		if (run_phase(&bn,
			      &(struct phase_opts){.name = "timed epochs",
						   .seed = SHUFFLE_SEED + r * TIMED_EPOCHS,
						   .limit = UINT64_MAX,
						   .roll = true,
						   .epochs = TIMED_EPOCHS,
						   .check = CHECK_SAMPLED,
						   .picks = picks},
			      rp))
			goto out;
		if (rp->epochs != TIMED_EPOCHS || rp->batches != TIMED_EPOCHS * rp->expected ||
		    rp->rows != TIMED_EPOCHS * rows) {
			td_fail("timed round %u took %" PRIu64 " rows in %" PRIu64
				" batches over %" PRIu64 " epochs; expected %u epochs of %" PRIu64
				" rows in %" PRIu64 " batches",
				r + 1, rp->rows, rp->batches, rp->epochs, TIMED_EPOCHS, rows,
				rp->expected);
			goto out;
		}
		for (unsigned k = 0; k < TIMED_EPOCHS; k++)
			if (!td_is_permutation(picks + k * rows, rows, rows)) {
				td_fail("timed round %u, epoch %u of %u did not deliver every row "
					"exactly once",
					r + 1, k + 1, TIMED_EPOCHS);
				goto out;
			}
		round_gbs[r] = TIMED_EPOCHS * bytes / 1e9 / rp->seconds;
		order[r] = r;
	}
	/* The median round (insertion sort of three). */
	for (unsigned i = 1; i < TIMED_ROUNDS; i++)
		for (unsigned j = i; j > 0 && round_gbs[order[j]] < round_gbs[order[j - 1]]; j--) {
			unsigned t = order[j];

			order[j] = order[j - 1];
			order[j - 1] = t;
		}
	ep = rounds[order[TIMED_ROUNDS / 2]];

	if (run_phase(&bn,
		      &(struct phase_opts){.name = "hand-off latency",
					   .seed = LATENCY_SEED,
					   .limit = LATENCY_BATCHES + 1,
					   .roll = true,
					   .check = CHECK_SAMPLED,
					   .sleep_us = LATENCY_SLEEP_US,
					   .next_s = next_s},
		      &lat))
		goto out;
	if (lat.nnext == 0) {
		td_fail("hand-off latency: no pf_next to time");
		goto out;
	}
	qsort(next_s, lat.nnext, sizeof(*next_s), cmp_double);
	/* The same with the consumer's thread busy instead of asleep, as a
	 * trainer's is while it queues and waits for its kernels: a thread
	 * woken from a 2 ms sleep also pays for a cold core and caches. */
	if (run_phase(&bn,
		      &(struct phase_opts){.name = "hand-off latency, busy consumer",
					   .seed = LATENCY_SEED + 50,
					   .limit = LATENCY_BATCHES + 1,
					   .roll = true,
					   .check = CHECK_SAMPLED,
					   .busy_us = LATENCY_SLEEP_US,
					   .next_s = busy_s},
		      &lat_busy))
		goto out;
	if (lat_busy.nnext == 0) {
		td_fail("hand-off latency, busy consumer: no pf_next to time");
		goto out;
	}
	qsort(busy_s, lat_busy.nnext, sizeof(*busy_s), cmp_double);

	if (run_phase(&bn,
		      &(struct phase_opts){.name = "stall at compute = copy time",
					   .seed = STALL_SEED,
					   .limit = STALL_BATCHES,
					   .roll = true,
					   .spin_s = batch_s},
		      &stall))
		goto out;

	print_status(td.sock, ps.session);
	pf_close(bn.c);
	bn.c = NULL;

	gbs = TIMED_EPOCHS * bytes / 1e9 / ep.seconds;
	printf("checked: every batch (2 straddling 16-byte copies on the consumer's stream, "
	       "released behind them), every %uth batch in full "
	       "(first and last word of each row); each of the %u timed epochs delivered each "
	       "of %" PRIu64 " rows once\n",
	       FULL_CHECK_EVERY, TIMED_ROUNDS * TIMED_EPOCHS, rows);
	printf("timed: %u rounds of %u epochs in a row (seeds %u..%u):", TIMED_ROUNDS, TIMED_EPOCHS,
	       SHUFFLE_SEED, SHUFFLE_SEED + TIMED_ROUNDS * TIMED_EPOCHS - 1);
	for (unsigned r = 0; r < TIMED_ROUNDS; r++)
		printf(" %.2f", round_gbs[r]);
	printf(" GB/s; the median round (%u) below: %.3f s, of which %.4f s in the first "
	       "pf_next of its 2nd and later epochs\n",
	       order[TIMED_ROUNDS / 2] + 1, ep.seconds, ep.start_s);
	printf("consumer: waited %.3f s in pf_next, busy %.3f s between calls (pf_stats, from "
	       "the 1st batch's return)\n",
	       ep.wait_s, ep.busy_s);
	printf("\n%-32s %8s %11s %7s %9s\n", "", "GB/s", "batches/s", "stall", "seconds");
	printf("%-32s %8.2f %11.1f %7.3f %9.3f\n", "prefetchd delivered on cuda:0", gbs,
	       ep.batches / ep.seconds,
	       ep.wait_s + ep.busy_s > 0 ? ep.wait_s / (ep.wait_s + ep.busy_s) : 0.0, ep.seconds);
	printf("%-32s %8.2f %11.1f %7s %9.3f\n", "raw pinned H2D 4 MiB, 1 stream", ref_gbs,
	       ep.expected / t_ref, "-", t_ref);
	printf("(seconds: prefetchd's for the %u epochs of its median round; the raw copy's for "
	       "one epoch's bytes, the best of %d passes)\n",
	       TIMED_EPOCHS, REF_PASSES);
	printf("diagnostics (not part of the ratio):\n");
	printf("  %-44s %8.2f GB/s\n", "raw H2D from cudaHostRegister'd 4 KiB pages",
	       bytes / 1e9 / t_reg);
	printf("  %-44s %8.2f GB/s\n", "raw H2D from cudaHostRegister'd huge pages",
	       bytes / 1e9 / t_reg_huge);
	printf("  %-44s %8.2f GB/s\n", "gather of the shuffled rows, readers threads",
	       bytes / 1e9 / t_gather);
	printf("\nhand-off of a ready batch (%" PRIu64 " pf_next, %u ms apart): p50 %.1f us, "
	       "p99 %.1f us, max %.1f us\n",
	       lat.nnext, LATENCY_SLEEP_US / 1000, next_s[lat.nnext / 2] * 1e6,
	       next_s[lat.nnext * 99 / 100] * 1e6, next_s[lat.nnext - 1] * 1e6);
	printf("hand-off of a ready batch, consumer busy (%" PRIu64 " pf_next, %u ms of CPU spin "
	       "apart): p50 %.1f us, p99 %.1f us, max %.1f us\n",
	       lat_busy.nnext, LATENCY_SLEEP_US / 1000, busy_s[lat_busy.nnext / 2] * 1e6,
	       busy_s[lat_busy.nnext * 99 / 100] * 1e6, busy_s[lat_busy.nnext - 1] * 1e6);
	printf("compute = raw copy time (%.1f us/batch), %" PRIu64 " batches: stall fraction "
	       "%.3f (wait %.3f s, busy %.3f s); %" PRIu64 " epoch start(s) inside, %.3f s in "
	       "their first pf_next\n",
	       batch_s * 1e6, stall.batches,
	       stall.wait_s + stall.busy_s > 0 ? stall.wait_s / (stall.wait_s + stall.busy_s) : 0.0,
	       stall.wait_s, stall.busy_s, stall.epochs - 1, stall.start_s);
	/* Issue 3's figure: the first phase (pool off) over the raw pinned copy. */
	printf("ratio: %.2f\n", gbs / ref_gbs);
	fflush(stdout);

	if (pool) {
		printf("\npool phase (issue 5): dataset %s, pool = on\n", POOL_DATASET);
		fflush(stdout);
		if (run_pool(&bn, td.sock, ipc, pool_rows, pool_depth, picks, &pr))
			goto out;
		print_pool(&pr, rows, bytes, pool_batch_bytes, t_ref, t_d2d);
	}

	if (getenv("PF_BENCH_LOG"))
		show_daemon_timing(td.log);
	st = td_stop(&td, 10000);
	if (st != 0) {
		td_fail("prefetchd did not exit cleanly on SIGTERM (status %d)", st);
		goto out;
	}
	rc = 0;
out:
	pf_close(bn.c);
	td_bench_end(&td, rc && started);
	pfcuda_close(bn.dev);
	if (pinned)
		cudaFreeHost(pinned);
	if (bn.spans)
		cudaFreeHost(bn.spans);
	if (bn.full)
		cudaFreeHost(bn.full);
	if (bn.stream)
		cudaStreamDestroy(bn.stream);
	for (size_t i = 0; i < bn.npend; i++)
		free(bn.pend[i].full_picks);
	free(bn.pend);
	free(picks);
	free(next_s);
	free(busy_s);
	return rc;
}

#endif
