/*
 * test_cuda.c — CUDA sessions end to end: a real prefetchd with a GPU on a
 * temporary socket, and trainers that are separate processes opening
 * "cuda:0" through the real client library.
 *
 * Every sample a trainer receives is copied back from the device
 * (pfcuda_copy_dtoh) and checked byte for byte against what npygen's
 * formula says row `pick % N` of its field holds; every epoch is checked to
 * deliver each pick exactly once.  Beyond the data path the tests cover
 * what only a GPU shows: device memory coming back when a trainer is
 * killed holding batches, the honest probe sizing the target from the
 * trainer's free device memory, and the back-off after a device allocation
 * fails (forced with PREFETCHD_TEST_FAIL_ALLOCS).
 *
 * With no GPU every case skips and says why: the test process cannot open
 * CUDA device 0, or the daemon refuses cuda:0 (-ENODEV).  PF_REQUIRE_GPU=1
 * (make check-cuda) turns those skips into failures.  The two-GPU cases
 * (issue 20: a trainer per GPU, each with its own CUDA_VISIBLE_DEVICES) run
 * only when the test process can open device 1, and say so when not.
 *
 * DESIGN: one binary, two roles.  Run plainly it is the cmocka test
 * process: it starts a daemon per case and spawns trainers.  Run as
 * `test_cuda --trainer key=value ...` (main() checks this before cmocka
 * starts) it is one trainer.  Trainers are started with fork() and an
 * immediate execv("/proc/self/exe"): the test process has initialised CUDA
 * (to find the device and read free memory), and a forked copy of a CUDA
 * process cannot use CUDA itself; exec gives the child a fresh one.  A
 * trainer reports through its exit status (0 passed, 1 failed, 77 the
 * daemon has no GPU), its stderr (a log file the test prints), and lines
 * on its stdout, a pipe the test reads ("streaming", "holding <session>").
 * Its stdin is a pipe too: when the test closes it (or dies), long-lived
 * trainers stop.  Single-threaded; every wait has a deadline, and the
 * teardown kills whatever trainer is left.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pfcuda.h"
#include "prefetch.h"
#include "testutil.h"

#define MiB (1ull << 20)
#define GiB (1ull << 30)

/* The dataset: x '<f4' (64,) in two shards, y '<i8' scalars.  20000 is not
 * a multiple of BATCH, so every epoch ends with a partial batch of 32. */
#define N_ROWS	 20000
#define X_SHARD0 12000
#define X_DIM	 64
#define SEED_X	 101
#define SEED_Y	 202
#define BATCH	 256

/* pf_next never waits longer than this: a stuck pipeline fails, not hangs. */
#define NEXT_TIMEOUT_MS 30000
/* Exit status of a trainer whose daemon refused cuda:0 with -ENODEV. */
#define EXIT_NO_GPU 77
#define MAX_FIELDS  4
#define MAX_KIDS    8

static const char *DATASETS = "[dataset.d]\n"
			      "format = npy\n"
			      "field.x = x0.npy, x1.npy\n"
			      "field.y = y.npy\n";

/* ======================================================================
 * Trainer side: runs in a child process, never inside cmocka.
 * ====================================================================== */

struct topts {
	const char *sock;
	const char *mode; /* epochs | stream | hold | restart | probe | oom | pool | lag |
			   * poolkill */
	enum pf_ipc ipc;
	uint32_t epochs;
	uint64_t seed;
	uint32_t min_depth, max_depth;
	uint32_t batch;	      /* samples per batch (BATCH unless batch=N) */
	bool alloc;	      /* probe: fill the GPU before the probe */
	bool halved;	      /* epochs: expect an OOM-halved target after batch 1 */
	const char *pool;     /* pool: all | part | evict | pressure */
	double reconnect_s;   /* pf_open_opts.reconnect_s */
	uint32_t step_us;     /* restart: the "training step" after each batch */
	uint32_t reconnects;  /* restart: reconnections the run must see */
	uint32_t rank, world; /* epochs: this rank's share (world 0: all); N % world == 0 */
	uint32_t gpu;	      /* the daemon's ordinal of our cuda:0 (status shows cuda:gpu) */
	const char *seen_out; /* epochs: the last epoch's picks as N flag bytes, to this file */
};

/* What one epoch delivered, by batch seq. */
struct epoch_log {
	uint64_t announced; /* batches this epoch delivers */
	uint64_t *picks;    /* owned: announced * BATCH, the picks of batch s at s * BATCH */
	uint32_t *count;    /* owned: samples of batch s, 0 while not delivered */
	uint64_t delivered; /* picks delivered */
};

struct trainer {
	struct topts o;
	struct pf_client *c;	/* owned */
	struct pfcuda_dev *dev; /* owned: our own handle on device 0, for copies back */
	uint64_t n;
	uint32_t nfields;
	struct pf_field field[MAX_FIELDS]; /* borrowed from c: valid until pf_close */
	uint64_t field_seed[MAX_FIELDS];
	uint8_t *host; /* owned: one field of one batch, copied back */
	uint8_t *seen; /* owned: n flags, pick delivered in this epoch */
	struct epoch_log ep;
	uint64_t batches, samples; /* verified, over all epochs */
};

static __attribute__((format(printf, 1, 2), noreturn)) void tfail(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "FAIL [%d]: ", (int)getpid());
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

static __attribute__((format(printf, 1, 2))) void tlog(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

/* A line for the test process (stdout is its pipe). */
static __attribute__((format(printf, 1, 2))) void tsay(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
}

/* True once the test process closed our stdin (or died). */
static bool told_to_stop(void)
{
	struct pollfd p = {.fd = 0, .events = POLLIN};

	return poll(&p, 1, 0) > 0;
}

static void t_open(struct trainer *t, uint32_t min_depth, uint32_t max_depth)
{
	struct pf_open_opts oo = {.dataset = "d",
				  .device = "cuda:0",
				  .batch_size = t->o.batch,
				  .min_depth = min_depth,
				  .max_depth = max_depth,
				  .ipc = t->o.ipc,
				  .reconnect_s = t->o.reconnect_s,
				  .name = t->o.mode};
	uint64_t most = 0;
	char msg[256] = "";
	int rc;

	rc = pfcuda_open(0, &t->dev, msg, sizeof(msg));
	if (rc)
		tfail("pfcuda_open(0): %d %s", rc, msg);
	rc = pf_connect(t->o.sock, &t->c);
	if (rc)
		tfail("pf_connect %s: %d %s", t->o.sock, rc, pf_errmsg(t->c));
	rc = pf_open(t->c, &oo);
	if (rc == -ENODEV) {
		/* The daemon has no GPU (or not this one): the test skips. */
		tsay("nogpu: %s", pf_errmsg(t->c));
		tlog("nogpu: %s", pf_errmsg(t->c));
		exit(EXIT_NO_GPU);
	}
	if (rc)
		tfail("pf_open cuda:0: %d %s", rc, pf_errmsg(t->c));
	t->n = pf_num_samples(t->c);
	if (t->n != N_ROWS)
		tfail("dataset has %" PRIu64 " samples, want %d", t->n, N_ROWS);
	t->nfields = pf_num_fields(t->c);
	if (t->nfields != 2)
		tfail("dataset has %u fields, want 2", t->nfields);
	for (uint32_t f = 0; f < t->nfields; f++) {
		if (pf_field_info(t->c, f, &t->field[f]))
			tfail("pf_field_info %u: %s", f, pf_errmsg(t->c));
		if (!strcmp(t->field[f].name, "x"))
			t->field_seed[f] = SEED_X;
		else if (!strcmp(t->field[f].name, "y"))
			t->field_seed[f] = SEED_Y;
		else
			tfail("unexpected field '%s'", t->field[f].name);
		if (t->field[f].sample_bytes > most)
			most = t->field[f].sample_bytes;
	}
	t->host = malloc(most * t->o.batch);
	t->seen = calloc(t->n, 1);
	if (!t->host || !t->seen)
		tfail("out of host memory");
}

static void t_close(struct trainer *t)
{
	pf_close(t->c);
	t->c = NULL;
	pfcuda_close(t->dev);
	t->dev = NULL;
	free(t->host);
	free(t->seen);
	free(t->ep.picks);
	free(t->ep.count);
	memset(&t->ep, 0, sizeof(t->ep));
}

static uint64_t t_session(const struct trainer *t)
{
	struct pf_stats s;

	if (pf_stats(t->c, &s))
		tfail("pf_stats: %s", pf_errmsg(t->c));
	return s.session;
}

/* Starts a shuffled epoch; the previous epoch's log is freed (take it
 * first to keep it). */
/* Picks of this trainer's share of an epoch (N % world == 0: no padding). */
static uint64_t t_share(const struct trainer *t)
{
	return t->o.world > 1 ? t->n / t->o.world : t->n;
}

static void t_start(struct trainer *t, uint64_t seed)
{
	struct pf_epoch_opts eo = {
		.order = PF_ORDER_SHUFFLE, .seed = seed, .rank = t->o.rank, .world = t->o.world};
	uint64_t want = (t_share(t) + t->o.batch - 1) / t->o.batch;
	int rc;

	free(t->ep.picks);
	free(t->ep.count);
	memset(&t->ep, 0, sizeof(t->ep));
	rc = pf_start_epoch(t->c, &eo, &t->ep.announced);
	if (rc)
		tfail("pf_start_epoch seed %" PRIu64 ": %d %s", seed, rc, pf_errmsg(t->c));
	if (t->ep.announced != want)
		tfail("epoch announces %" PRIu64 " batches, want %" PRIu64, t->ep.announced, want);
	t->ep.picks = calloc(t->ep.announced * t->o.batch, sizeof(uint64_t));
	t->ep.count = calloc(t->ep.announced, sizeof(uint32_t));
	if (!t->ep.picks || !t->ep.count)
		tfail("out of host memory");
	memset(t->seen, 0, t->n);
}

/* Copies every field of b back from the device and checks every byte of
 * every sample; books its picks into the epoch. */
static void t_check(struct trainer *t, const struct pf_batch *b)
{
	uint32_t want;
	char msg[256] = "";

	if (!b->on_device)
		tfail("batch %" PRIu64 " of a cuda:0 session is not on the device", b->seq);
	if (b->nfields != t->nfields)
		tfail("batch %" PRIu64 " has %u fields, want %u", b->seq, b->nfields, t->nfields);
	if (b->seq >= t->ep.announced)
		tfail("batch seq %" PRIu64 " beyond the %" PRIu64 " announced", b->seq,
		      t->ep.announced);
	if (t->ep.count[b->seq])
		tfail("batch seq %" PRIu64 " delivered twice", b->seq);
	/* drop_last is off: only the last batch is short. */
	want = b->seq + 1 < t->ep.announced
		       ? t->o.batch
		       : (uint32_t)(t_share(t) - (t->ep.announced - 1) * t->o.batch);
	if (b->count != want)
		tfail("batch %" PRIu64 " holds %u samples, want %u", b->seq, b->count, want);
	for (uint32_t f = 0; f < t->nfields; f++) {
		uint64_t sb = t->field[f].sample_bytes;
		int rc;

		if (!b->data[f])
			tfail("batch %" PRIu64 " field %s has no device pointer", b->seq,
			      t->field[f].name);
		rc = pfcuda_copy_dtoh(t->dev, t->host, (uint64_t)(uintptr_t)b->data[f],
				      b->count * sb, msg, sizeof(msg));
		if (rc)
			tfail("copying batch %" PRIu64 " field %s back: %d %s", b->seq,
			      t->field[f].name, rc, msg);
		for (uint32_t k = 0; k < b->count; k++)
			if (!td_row_ok(t->host + k * sb, sb, t->field_seed[f], b->picks[k] % t->n))
				tfail("field %s of pick %" PRIu64 " (batch %" PRIu64
				      ", position %u) has wrong bytes",
				      t->field[f].name, b->picks[k], b->seq, k);
	}
	for (uint32_t k = 0; k < b->count; k++) {
		uint64_t p = b->picks[k];

		if (p >= t->n)
			tfail("pick %" PRIu64 " out of range (N = %" PRIu64 ")", p, t->n);
		if (t->seen[p])
			tfail("pick %" PRIu64 " delivered twice in one epoch (batch %" PRIu64 ")",
			      p, b->seq);
		t->seen[p] = 1;
		t->ep.picks[b->seq * t->o.batch + k] = p;
	}
	t->ep.count[b->seq] = b->count;
	t->ep.delivered += b->count;
	t->batches++;
	t->samples += b->count;
}

/* pf_next with a deadline; a delivered batch is checked at once.  Returns
 * pf_next's code (0 with *b NULL at the end of the epoch). */
static int t_next(struct trainer *t, struct pf_batch **b)
{
	int rc = pf_next(t->c, NEXT_TIMEOUT_MS, b);

	if (rc == 0 && *b)
		t_check(t, *b);
	return rc;
}

static void t_release(struct trainer *t, struct pf_batch *b)
{
	int rc = pf_release(t->c, b, NULL);

	if (rc)
		tfail("pf_release: %d %s", rc, pf_errmsg(t->c));
}

/* After the end of an epoch: every batch came, so (no pick twice, none out
 * of range) the picks were exactly 0..N-1. */
static void t_epoch_complete(struct trainer *t)
{
	for (uint64_t s = 0; s < t->ep.announced; s++)
		if (!t->ep.count[s])
			tfail("epoch ended without batch %" PRIu64, s);
	if (t->ep.delivered != t_share(t))
		tfail("epoch delivered %" PRIu64 " picks, want %" PRIu64, t->ep.delivered,
		      t_share(t));
	if (t->o.seen_out) {
		FILE *f = fopen(t->o.seen_out, "wb");

		if (!f || fwrite(t->seen, 1, t->n, f) != t->n || fclose(f))
			tfail("cannot write %s", t->o.seen_out);
	}
}

/* Takes batches to the end of the epoch, releasing each. */
static void t_finish_epoch(struct trainer *t)
{
	struct pf_batch *b;
	int rc;

	for (;;) {
		rc = t_next(t, &b);
		if (rc)
			tfail("pf_next: %d %s", rc, pf_errmsg(t->c));
		if (!b)
			break;
		t_release(t, b);
	}
	t_epoch_complete(t);
}

/* Our own session's status entry; free *env with pf__envelope__free_unpacked. */
static Pf__SessionStatus *t_status(struct trainer *t, Pf__Envelope **env)
{
	uint64_t id = t_session(t);
	Pf__SessionStatus *ss;

	*env = td_status(t->o.sock);
	if (!*env)
		tfail("no status from the daemon");
	ss = td_session(*env, id);
	if (!ss)
		tfail("session %" PRIu64 " is missing from status", id);
	return ss;
}

static void log_status(const char *when, const Pf__SessionStatus *ss)
{
	tlog("%s: device %s target %u (%s) min %u max %u held %" PRIu64 " slots %u arenas %u "
	     "(%" PRIu64 " bytes) probe_free %.2f GiB of %.2f errors %" PRIu64,
	     when, ss->device, ss->target, ss->target_reason, ss->min_depth, ss->max_depth,
	     ss->held, ss->slots, ss->arenas, ss->arena_bytes, ss->probe_free / (double)GiB,
	     ss->probe_total / (double)GiB, ss->errors);
}

/* mode=epochs: `epochs` shuffled epochs, seeds seed, seed+1, ... */
#if PF_CUDA
#include <cuda_runtime_api.h>

/* mode=lag: the trainer runs ahead of its GPU, as one that never syncs
 * does: after each batch it queues ~0.5 ms of device copies on its own
 * stream and releases the batch behind them.  With max_depth 2 every slot
 * is soon waiting for such a release, so pf_next must send each release as
 * its work retires while it waits; otherwise the daemon has no free slot
 * and pf_next times out. */
static void mode_lag(struct trainer *t)
{
	const size_t big = 256u << 20;
	cudaStream_t st;
	void *a = NULL, *b2 = NULL;
	struct pf_batch *b;
	double t0;
	int rc;

	if (cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess ||
	    cudaMalloc(&a, big) != cudaSuccess || cudaMalloc(&b2, big) != cudaSuccess)
		tfail("CUDA runtime: cannot make a stream and 2 x 256 MiB");
	t_open(t, 1, 2);
	t0 = td_now();
	t_start(t, t->o.seed);
	for (;;) {
		rc = t_next(t, &b);
		if (rc)
			tfail("pf_next with releases waiting for the GPU: %d %s", rc,
			      pf_errmsg(t->c));
		if (!b)
			break;
		for (int k = 0; k < 4; k++)
			if (cudaMemcpyAsync(a, b2, big, cudaMemcpyDeviceToDevice, st) !=
			    cudaSuccess)
				tfail("cudaMemcpyAsync D2D failed");
		rc = pf_release(t->c, b, (void *)st);
		if (rc)
			tfail("pf_release on a busy stream: %d %s", rc, pf_errmsg(t->c));
	}
	t_epoch_complete(t);
	tlog("epoch with the GPU lagging: %" PRIu64 " batches, %" PRIu64
	     " picks once each, every byte checked, %.2f s",
	     t->ep.announced, t->ep.delivered, td_now() - t0);
	t_close(t);
	cudaStreamSynchronize(st);
	cudaFree(a);
	cudaFree(b2);
	cudaStreamDestroy(st);
}

/* A batch taken on stream st: the stream synchronised, then every byte
 * checked (t_check's synchronous copy does not wait for st itself). */
static struct pf_batch *t_next_on(struct trainer *t, cudaStream_t st, struct pf_batch *release)
{
	struct pf_batch *b = NULL;
	int rc = pf_release_next(t->c, release, (void *)st, NEXT_TIMEOUT_MS, &b);

	if (rc)
		tfail("pf_release_next on the trainer's stream: %d %s", rc, pf_errmsg(t->c));
	if (b) {
		if (cudaStreamSynchronize(st) != cudaSuccess)
			tfail("cudaStreamSynchronize failed");
		t_check(t, b);
	}
	return b;
}

/* mode=nowait (issue 33): the per-batch calls never wait for the GPU on
 * the CPU.  Epoch 1 is drained (with pool = on it fills the pool, so epoch
 * 2's batches are gathered in this process).  In epoch 2, after a batch is
 * taken and the next ones have had time to arrive, about 100 ms of device
 * copies are queued on the trainer's stream; pf_release_next (the batch
 * in hand given back behind that work, the next taken on the same stream),
 * pf_next and pf_release must each return while that work still runs:
 * cudaStreamQuery says it is.  Not a timing bound: a call that waited for
 * the stream, by a synchronize or by polling an event, would find it done.
 * The rest of the epoch is then checked byte for byte. */
static void mode_nowait(struct trainer *t)
{
	const size_t big = 256u << 20;
	struct pf_batch *b = NULL, *b2 = NULL, *b3 = NULL;
	Pf__SessionStatus *ss;
	Pf__Envelope *env;
	cudaStream_t st;
	void *a = NULL, *a2 = NULL;
	uint64_t hits;
	double t0;
	int rc, copies = 0;

	if (cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess ||
	    cudaMalloc(&a, big) != cudaSuccess || cudaMalloc(&a2, big) != cudaSuccess)
		tfail("CUDA runtime: cannot make a stream and 2 x 256 MiB");
	t_open(t, 1, 4);
	t_start(t, t->o.seed);
	while ((b = t_next_on(t, st, b)))
		;
	t_epoch_complete(t);
	/* Give the pool time to take in the rows it admitted. */
	usleep(300000);
	t_start(t, t->o.seed + 1);
	if (!(b = t_next_on(t, st, NULL)))
		tfail("epoch 2 is empty");
	usleep(100000); /* the daemon sends the next batches ahead */
	t0 = td_now();
	/* ~100 ms of work on the trainer's stream: each copy moves 512 MiB
	 * through device memory (about 0.25 ms on an H100 or H200). */
	while (td_now() - t0 < 0.002 || copies < 400) {
		if (cudaMemcpyAsync(a, a2, big, cudaMemcpyDeviceToDevice, st) != cudaSuccess)
			tfail("cudaMemcpyAsync D2D failed");
		copies++;
	}
	if (cudaStreamQuery(st) != cudaErrorNotReady)
		tfail("the %d copies finished before the test could use them", copies);
	rc = pf_release_next(t->c, b, (void *)st, NEXT_TIMEOUT_MS, &b2);
	if (rc || !b2)
		tfail("pf_release_next behind a busy stream: %d %s", rc, pf_errmsg(t->c));
	if (cudaStreamQuery(st) != cudaErrorNotReady)
		tfail("pf_release_next returned only after the trainer's stream work had finished "
		      "(%.1f ms after it was queued): it waited for the GPU",
		      (td_now() - t0) * 1e3);
	rc = pf_next_stream(t->c, NEXT_TIMEOUT_MS, (void *)st, &b3);
	if (rc || !b3)
		tfail("pf_next behind a busy stream: %d %s", rc, pf_errmsg(t->c));
	if (cudaStreamQuery(st) != cudaErrorNotReady)
		tfail("pf_next returned only after the trainer's stream work had finished: it "
		      "waited for the GPU");
	rc = pf_release(t->c, b3, (void *)st);
	if (rc)
		tfail("pf_release behind a busy stream: %d %s", rc, pf_errmsg(t->c));
	if (cudaStreamQuery(st) != cudaErrorNotReady)
		tfail("pf_release returned only after the trainer's stream work had finished: it "
		      "waited for the GPU");
	tlog("pf_release_next, pf_next and pf_release returned %.1f ms after %d copies were "
	     "queued, the stream still busy",
	     (td_now() - t0) * 1e3, copies);
	/* b2, still held, is checked once the stream is done with it; b3 went
	 * back unread (its bytes are the one batch this test does not see). */
	if (cudaStreamSynchronize(st) != cudaSuccess)
		tfail("cudaStreamSynchronize failed");
	t_check(t, b2);
	b = b2;
	while ((b = t_next_on(t, st, b)))
		;
	ss = t_status(t, &env);
	hits = ss->pool_hits;
	pf__envelope__free_unpacked(env, NULL);
	if (t->o.pool && !strcmp(t->o.pool, "on") && hits == 0)
		tfail("pool = on, but no row came from the pool: the gather path was not tested");
	tlog("epoch 2 with the stream busy: %" PRIu64 " batches, no pick twice, every byte "
	     "checked but one batch's; %" PRIu64 " pool hits",
	     t->ep.announced, hits);
	t_close(t);
	cudaFree(a);
	cudaFree(a2);
	cudaStreamDestroy(st);
}

/* mode=ahead (pool = off: the trainer copies): libprefetch starts copies
 * of batches before they are asked for.  Epoch 1: 5 batches on a stream of
 * the trainer's, then a pause (the copies ahead finish, more batches
 * arrive), then the next epoch starts: batches copied ahead and never
 * taken go back, each slot once.  Epoch 2: to its end with pf_release_next,
 * AHEAD_HOLD batches held at once in the middle (gradient accumulation),
 * while the daemon gets back the slots their copies are done with.  Every
 * byte checked; then no error and no slot held in status. */
#define AHEAD_HOLD 8
static void mode_ahead(struct trainer *t)
{
	struct pf_batch *b = NULL, *hold[AHEAD_HOLD];
	Pf__SessionStatus *ss;
	Pf__Envelope *env;
	cudaStream_t st;
	uint64_t taken = 0, slots_held = 0;
	double deadline;

	if (cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess)
		tfail("CUDA runtime: cannot make a stream");
	t_open(t, t->o.min_depth, t->o.max_depth);
	t_start(t, t->o.seed);
	for (int i = 0; i < 5; i++)
		if (!(b = t_next_on(t, st, b)))
			tfail("epoch 1 ended after %d batches", i);
	if (pf_release(t->c, b, (void *)st))
		tfail("pf_release: %s", pf_errmsg(t->c));
	usleep(50000);
	t_start(t, t->o.seed + 1);
	b = NULL;
	while ((b = t_next_on(t, st, b))) {
		if (++taken != 10)
			continue;
		hold[0] = b;
		for (int i = 1; i < AHEAD_HOLD; i++)
			if (!(hold[i] = t_next_on(t, st, NULL)))
				tfail("epoch 2 ended with batches held");
		for (int i = 0; i < AHEAD_HOLD; i++)
			for (int j = 0; j < i; j++)
				if (hold[i]->data[0] == hold[j]->data[0])
					tfail("batches held at once share a device buffer");
		/* The daemon counts a taken batch held until its slot comes
		 * back, which for these is once its copy is done: while the
		 * trainer holds them, at most the last few may be pending. */
		ss = t_status(t, &env);
		slots_held = ss->held;
		pf__envelope__free_unpacked(env, NULL);
		if (slots_held > 4)
			tfail("%d batches held: the daemon still counts %" PRIu64
			      " slots held (want at most 4)",
			      AHEAD_HOLD, slots_held);
		for (int i = 0; i < AHEAD_HOLD - 1; i++)
			if (pf_release(t->c, hold[i], (void *)st))
				tfail("pf_release: %s", pf_errmsg(t->c));
		b = hold[AHEAD_HOLD - 1];
		taken += AHEAD_HOLD - 1;
	}
	t_epoch_complete(t);
	deadline = td_now() + 2;
	for (;;) {
		ss = t_status(t, &env);
		if ((ss->held == 0 && ss->errors == 0) || td_now() > deadline)
			break;
		pf__envelope__free_unpacked(env, NULL);
		usleep(10000);
	}
	if (ss->held || ss->errors)
		tfail("after epoch 2: %" PRIu64 " slots held, %" PRIu64 " errors (want none)",
		      ss->held, ss->errors);
	pf__envelope__free_unpacked(env, NULL);
	tlog("epoch 1 left after 5 batches; epoch 2: %" PRIu64 " batches, %" PRIu64
	     " picks once each, %d held at once with %" PRIu64
	     " slots held at the daemon, every byte checked; nothing held after",
	     t->ep.announced, t->ep.delivered, AHEAD_HOLD, slots_held);
	t_close(t);
	cudaStreamDestroy(st);
}
#endif

static void mode_epochs(struct trainer *t)
{
	char want_dev[32];

	if (t->o.world > 1 && N_ROWS % t->o.world)
		tfail("world %u does not divide the %d rows", t->o.world, N_ROWS);
	t_open(t, t->o.min_depth, t->o.max_depth);
	for (uint32_t e = 0; e < t->o.epochs; e++) {
		struct pf_batch *b;
		Pf__Envelope *env;
		Pf__SessionStatus *ss;
		int rc;

		t_start(t, t->o.seed + e);
		rc = t_next(t, &b);
		if (rc || !b)
			tfail("first pf_next of epoch %u: %d %s", e, rc, pf_errmsg(t->c));
		if (e == 0) {
			/* Before the 2nd pf_next: no probe can have resized it yet. */
			ss = t_status(t, &env);
			log_status("after batch 1", ss);
			snprintf(want_dev, sizeof(want_dev), "cuda:%u", t->o.gpu);
			if (strcmp(ss->device, want_dev))
				tfail("status says device '%s', want %s", ss->device, want_dev);
			if (ss->arenas == 0)
				tfail("a cuda:0 session with a batch taken shows no arenas");
			if (t->o.halved &&
			    (ss->target != 2 || !strstr(ss->target_reason, "halved")))
				tfail("after one forced OOM: target %u (%s), want 2 and "
				      "\"halved\"",
				      ss->target, ss->target_reason);
			pf__envelope__free_unpacked(env, NULL);
		}
		t_release(t, b);
		t_finish_epoch(t);
		tlog("epoch %u (seed %" PRIu64 "): %" PRIu64 " batches, %" PRIu64
		     " picks, each once, every byte checked",
		     e, t->o.seed + e, t->ep.announced, t->ep.delivered);
	}
	t_close(t);
}

/* mode=stream: shuffled epochs until stdin closes; says "streaming" once
 * 10 batches were consumed. */
static void mode_stream(struct trainer *t)
{
	uint64_t epochs = 0;
	bool said = false, stop = false;

	t_open(t, t->o.min_depth, t->o.max_depth);
	while (!stop) {
		t_start(t, t->o.seed + epochs);
		for (;;) {
			struct pf_batch *b;
			int rc;

			if (told_to_stop()) {
				stop = true;
				break;
			}
			rc = t_next(t, &b);
			if (rc)
				tfail("pf_next after %" PRIu64 " batches: %d %s", t->batches, rc,
				      pf_errmsg(t->c));
			if (!b) {
				t_epoch_complete(t);
				epochs++;
				break;
			}
			t_release(t, b);
			if (!said && t->batches >= 10) {
				tsay("streaming");
				said = true;
			}
		}
	}
	tlog("stream: %" PRIu64 " complete epochs, %" PRIu64 " batches, %" PRIu64
	     " samples, every byte checked, no error",
	     epochs, t->batches, t->samples);
	t_close(t);
}

/*
 * mode=restart: a trainer that reconnects (reconnect_s) and, like a real
 * one, keeps the batch it is training on while it asks for the next, so
 * that it holds a batch of the old daemon when the test SIGKILLs it.  Each
 * batch is followed by a step_us "training step"; "streaming" after 10
 * batches is the test's cue.  Every batch is checked as always (bytes
 * copied back, each pick once); at the end the reconnections must number
 * `reconnects`, each must resume at the batch after the last one taken, and
 * the trainer says "restarted <reconnects> <resumed at> <longest wait ms>".
 */
static void mode_restart(struct trainer *t)
{
	uint64_t reconnects = 0, resumed_at = 0;
	double longest = 0;
	bool said = false;
	struct pf_stats st;

	t_open(t, t->o.min_depth, t->o.max_depth);
	for (uint32_t e = 0; e < t->o.epochs; e++) {
		struct pf_batch *prev = NULL, *b;
		uint64_t last_seq = 0;

		t_start(t, t->o.seed + e);
		for (;;) {
			double t0 = td_now(), waited;
			int rc = t_next(t, &b);

			waited = td_now() - t0;
			if (rc)
				tfail("pf_next after %" PRIu64 " batches: %d %s", t->batches, rc,
				      pf_errmsg(t->c));
			if (waited > longest)
				longest = waited;
			if (pf_stats(t->c, &st))
				tfail("pf_stats: %s", pf_errmsg(t->c));
			if (st.reconnects != reconnects) {
				/* The first batch since the session was opened
				 * again: the one after the last one taken. */
				if (!b)
					tfail("the epoch ended at the reconnection, after "
					      "batch %" PRIu64 " of %" PRIu64,
					      last_seq, t->ep.announced);
				if (b->seq != last_seq + 1)
					tfail("reconnected at batch %" PRIu64 ", want %" PRIu64,
					      b->seq, last_seq + 1);
				tlog("reconnection %" PRIu64 ": epoch %u resumed at batch %" PRIu64
				     " after a %.0f ms wait, the batch taken before it still held",
				     st.reconnects, e, b->seq, waited * 1000);
				reconnects = st.reconnects;
				resumed_at = b->seq;
			}
			/* The batch it trained on is released once the next one
			 * is in hand; after a reconnection it belongs to the
			 * dead daemon, and pf_release only lets go of it. */
			if (prev)
				t_release(t, prev);
			prev = b;
			if (!b)
				break;
			last_seq = b->seq;
			if (!said && t->batches >= 10) {
				tsay("streaming");
				said = true;
			}
			if (t->o.step_us)
				usleep(t->o.step_us);
		}
		t_epoch_complete(t);
		tlog("epoch %u (seed %" PRIu64 "): %" PRIu64 " batches, %" PRIu64
		     " picks, each once, every byte checked",
		     e, t->o.seed + e, t->ep.announced, t->ep.delivered);
	}
	if (pf_stats(t->c, &st))
		tfail("pf_stats: %s", pf_errmsg(t->c));
	if (st.reconnects != t->o.reconnects)
		tfail("%" PRIu64 " reconnections, want %u", st.reconnects, t->o.reconnects);
	if (st.held != 0)
		tfail("%" PRIu64 " batches still held at the end", st.held);
	tsay("restarted %" PRIu64 " %" PRIu64 " %.0f", st.reconnects, resumed_at, longest * 1000);
	t_close(t);
}

/* mode=hold: takes 3 batches, keeps them, says "holding <session>" and
 * waits to be killed (or for stdin to close). */
static void mode_hold(struct trainer *t)
{
	struct pf_batch *held[3];
	char c;

	t_open(t, t->o.min_depth, t->o.max_depth);
	t_start(t, t->o.seed);
	for (int i = 0; i < 3; i++) {
		int rc = t_next(t, &held[i]);

		if (rc || !held[i])
			tfail("pf_next %d: %d %s", i, rc, pf_errmsg(t->c));
	}
	tsay("holding %" PRIu64, t_session(t));
	while (read(0, &c, 1) > 0)
		;
	t_close(t);
}

static uint64_t t_pool_settled(struct trainer *t);

/* mode=poolkill: epoch 1 fills the pool, then epochs stream from it (each
 * batch gathered here, in this process's context, by libprefetch) until
 * the test SIGKILLs the trainer; "gathering <session>" once epoch 2 is
 * under way is its cue. */
static void mode_poolkill(struct trainer *t)
{
	bool said = false;

	t_open(t, t->o.min_depth, t->o.max_depth);
	t_start(t, t->o.seed);
	t_finish_epoch(t);
	t_pool_settled(t);
	for (uint64_t e = 1;; e++) {
		struct pf_batch *b;
		int rc;

		t_start(t, t->o.seed + e);
		while ((rc = t_next(t, &b)) == 0 && b) {
			t_release(t, b);
			if (!said && t->ep.delivered >= 5 * t->o.batch) {
				tsay("gathering %" PRIu64, t_session(t));
				said = true;
			}
		}
		if (rc)
			tfail("pf_next in epoch %" PRIu64 ": %d %s", e + 1, rc, pf_errmsg(t->c));
		t_epoch_complete(t);
		if (told_to_stop())
			break;
	}
	t_close(t);
}

/* Takes device memory in this process until about 3.5 GiB are left.
 * Returns the number of allocations stored in ptrs. */
static size_t fill_gpu(struct trainer *t, uint64_t *ptrs, size_t cap)
{
	uint64_t free_b = 0, total = 0, first;
	size_t n = 0;
	char msg[256] = "";
	int rc;

	if (pfcuda_mem_info(t->dev, &free_b, &total, msg, sizeof(msg)))
		tfail("pfcuda_mem_info: %s", msg);
	first = free_b;
	while (free_b >= 5 * GiB && n < cap) {
		rc = pfcuda_mem_alloc(t->dev, GiB, &ptrs[n], msg, sizeof(msg));
		if (rc == -ENOMEM)
			break;
		if (rc)
			tfail("pfcuda_mem_alloc 1 GiB: %d %s", rc, msg);
		n++;
		if (pfcuda_mem_info(t->dev, &free_b, &total, msg, sizeof(msg)))
			tfail("pfcuda_mem_info: %s", msg);
	}
	if (free_b > 4 * GiB && n < cap) {
		uint64_t rest = (free_b - 3 * GiB - GiB / 2) & ~(2 * MiB - 1);

		if (pfcuda_mem_alloc(t->dev, rest, &ptrs[n], msg, sizeof(msg)) == 0)
			n++;
		if (pfcuda_mem_info(t->dev, &free_b, &total, msg, sizeof(msg)))
			tfail("pfcuda_mem_info: %s", msg);
	}
	tlog("filled the GPU: %.2f GiB free of %.2f before, %.2f after (%zu allocations)",
	     first / (double)GiB, total / (double)GiB, free_b / (double)GiB, n);
	if (free_b >= 8 * GiB)
		tfail("could not fill the GPU: %.2f GiB still free", free_b / (double)GiB);
	return n;
}

/* mode=probe: batch 1, then (alloc=1) fill the GPU, then batch 2 sends the
 * probe; the target must follow the free memory the probe saw. */
static void mode_probe(struct trainer *t)
{
	static uint64_t ptrs[512];
	size_t nptrs = 0;
	struct pf_batch *b;
	Pf__Envelope *env;
	Pf__SessionStatus *ss;
	uint32_t pre_target;
	double deadline;
	bool probed = false;
	int rc;

	t_open(t, t->o.min_depth, t->o.max_depth);
	t_start(t, t->o.seed);
	rc = t_next(t, &b);
	if (rc || !b)
		tfail("pf_next 1: %d %s", rc, pf_errmsg(t->c));
	t_release(t, b);
	ss = t_status(t, &env);
	log_status("before the probe", ss);
	pre_target = ss->target;
	if (!strncmp(ss->target_reason, "probe:", 6) || ss->probe_total)
		tfail("a probe came before the 2nd pf_next: %s", ss->target_reason);
	if (pre_target != 4)
		tfail("target before the probe is %u, want the configured depth 4", pre_target);
	pf__envelope__free_unpacked(env, NULL);

	if (t->o.alloc)
		nptrs = fill_gpu(t, ptrs, sizeof(ptrs) / sizeof(ptrs[0]));
	/* The 2nd pf_next sends the probe (one-way): poll status for it. */
	for (int i = 0; i < 4; i++) {
		rc = t_next(t, &b);
		if (rc || !b)
			tfail("pf_next %d: %d %s", i + 2, rc, pf_errmsg(t->c));
		t_release(t, b);
	}
	deadline = td_now() + 5;
	do {
		ss = t_status(t, &env);
		probed = !strncmp(ss->target_reason, "probe:", 6) && ss->probe_total > 0;
		if (probed)
			break;
		pf__envelope__free_unpacked(env, NULL);
		usleep(20000);
	} while (td_now() < deadline);
	if (!probed)
		tfail("no probe reached the daemon within 5 s of the 2nd pf_next");
	log_status("after the probe", ss);
	if (t->o.alloc) {
		/* Free memory (about 3.5 GiB) is below the reserve (>= 2 GiB
		 * and 10% of the device): nothing more fits than one batch. */
		if (ss->target >= pre_target || ss->target != 1)
			tfail("GPU nearly full: target %u after the probe (was %u), want 1",
			      ss->target, pre_target);
		if (ss->probe_free >= 8 * GiB)
			tfail("probe_free %.2f GiB, want < 8 with the GPU filled",
			      ss->probe_free / (double)GiB);
	} else {
		if (ss->target != t->o.max_depth)
			tfail("GPU free: target %u after the probe, want max_depth %u", ss->target,
			      t->o.max_depth);
	}
	if (ss->probe_total < ss->probe_free)
		tfail("probe says %" PRIu64 " free of %" PRIu64, ss->probe_free, ss->probe_total);
	pf__envelope__free_unpacked(env, NULL);

	/* The rest of the epoch still arrives whole, with the GPU full. */
	t_finish_epoch(t);
	tlog("epoch: %" PRIu64 " batches, %" PRIu64 " picks, each once, every byte checked",
	     t->ep.announced, t->ep.delivered);
	for (size_t i = 0; i < nptrs; i++)
		pfcuda_mem_free(t->dev, ptrs[i]);
	t_close(t);
}

/* mode=oom: the daemon fails 4 allocations in a row: the first batch is an
 * error batch (-ENOMEM), the epoch goes on.  A second epoch with the same
 * seed shows what every batch should have held. */
static void mode_oom(struct trainer *t)
{
	struct epoch_log hurt;
	struct pf_batch *b;
	uint64_t errors = 1, missing = 0, lost = 0;
	int rc;

	t_open(t, t->o.min_depth, t->o.max_depth);
	t_start(t, t->o.seed);
	rc = pf_next(t->c, NEXT_TIMEOUT_MS, &b);
	if (rc != -ENOMEM)
		tfail("first pf_next: %d (%s), want -ENOMEM", rc, rc ? pf_errmsg(t->c) : "a batch");
	if (!strstr(pf_errmsg(t->c), "out of memory"))
		tfail("error batch says \"%s\", want \"out of memory\"", pf_errmsg(t->c));
	tlog("first pf_next: -ENOMEM \"%s\"", pf_errmsg(t->c));
	for (;;) {
		rc = t_next(t, &b);
		if (rc == -ENOMEM && errors < t->ep.announced) {
			tlog("another error batch: %s", pf_errmsg(t->c));
			errors++;
			continue;
		}
		if (rc)
			tfail("pf_next: %d %s", rc, pf_errmsg(t->c));
		if (!b)
			break;
		t_release(t, b);
	}
	if (errors != 1)
		tfail("%" PRIu64 " error batches, want exactly 1", errors);
	hurt = t->ep;
	memset(&t->ep, 0, sizeof(t->ep));

	t_start(t, t->o.seed);
	t_finish_epoch(t);
	for (uint64_t s = 0; s < t->ep.announced; s++) {
		if (!hurt.count[s]) {
			missing++;
			lost += t->ep.count[s];
			continue;
		}
		if (hurt.count[s] != t->ep.count[s] ||
		    memcmp(hurt.picks + s * t->o.batch, t->ep.picks + s * t->o.batch,
			   hurt.count[s] * sizeof(uint64_t)))
			tfail("batch %" PRIu64 " differs between the two epochs of seed %" PRIu64,
			      s, t->o.seed);
	}
	if (missing != errors || !hurt.count || hurt.count[0])
		tfail("%" PRIu64 " batches missing (batch 0 %s), want exactly batch 0", missing,
		      hurt.count[0] ? "delivered" : "missing");
	if (hurt.delivered + lost != t->n)
		tfail("%" PRIu64 " delivered + %" PRIu64 " lost != %" PRIu64, hurt.delivered, lost,
		      t->n);
	tlog("error epoch: %" PRIu64 " picks delivered once each, the %" PRIu64
	     " of the error batch missing; the same seed again delivered all %" PRIu64,
	     hurt.delivered, lost, t->ep.delivered);
	free(hurt.picks);
	free(hurt.count);
	t_close(t);
}

/* The pool of dataset d in a fresh status; free *env afterwards. */
static Pf__PoolStatus *t_pool(struct trainer *t, Pf__Envelope **env)
{
	Pf__PoolStatus *p;
	char dev[32];

	*env = td_status(t->o.sock);
	if (!*env)
		tfail("no status from the daemon");
	snprintf(dev, sizeof(dev), "cuda:%u", t->o.gpu);
	p = td_pool_on(*env, "d", dev);
	if (!p)
		tfail("status shows no VRAM pool for dataset d on %s", dev);
	return p;
}

static void log_pool(const char *when, const Pf__PoolStatus *p)
{
	tlog("%s: pool %s %s: %s, %.2f MiB in %u slab(s), %" PRIu64 "/%" PRIu64
	     " rows, hit rate %.3f (last %.3f), budget %.2f MiB (%s), %" PRIu64
	     " slabs dropped, %.2f MiB saved",
	     when, p->dataset, p->device, p->enabled ? "on" : "off", p->bytes / (double)MiB,
	     p->slabs, p->rows, p->samples, p->hit_rate, p->last_hit_rate, p->budget / (double)MiB,
	     p->budget_reason, p->slabs_dropped, p->h2d_saved / (double)MiB);
}

/* Waits (5 s at most) until the pool's rows stop changing for 200 ms, and
 * returns the figure. */
static uint64_t t_pool_settled(struct trainer *t)
{
	uint64_t rows = UINT64_MAX, same = 0;
	double deadline = td_now() + 5;

	while (td_now() < deadline && same < 10) {
		Pf__Envelope *env;
		Pf__PoolStatus *p = t_pool(t, &env);

		same = p->rows == rows ? same + 1 : 0;
		rows = p->rows;
		pf__envelope__free_unpacked(env, NULL);
		usleep(20000);
	}
	return rows;
}

/* mode=pool: epoch 1 fills the dataset's VRAM pool; epoch 2 must come
 * byte-exact with the pool holding every row (pool=all: zero sample bytes
 * over PCIe, every row a hit), part of them (pool=part: hits are exactly
 * the resident rows, the rest crosses PCIe), or losing slabs mid-epoch
 * (pool=evict: a probe below the pool's size, then a drop; pool=pressure:
 * the trainer grabs the GPU after the epoch's first step). */
static void mode_pool(struct trainer *t)
{
	static uint64_t ptrs[512];
	size_t nptrs = 0;
	const char *how = t->o.pool ? t->o.pool : "all";
	uint64_t rows, h2d0, hits0, sb = 0;
	uint64_t pool_before;
	Pf__Envelope *env;
	Pf__SessionStatus *ss;
	Pf__PoolStatus *p;
	struct pf_batch *b;
	char msg[256] = "";
	int rc;

	t_open(t, t->o.min_depth, t->o.max_depth);
	for (uint32_t f = 0; f < t->nfields; f++)
		sb += t->field[f].sample_bytes;
	t_start(t, t->o.seed);
	t_finish_epoch(t);
	rows = t_pool_settled(t);
	p = t_pool(t, &env);
	log_pool("after epoch 1", p);
	pool_before = p->bytes;
	if (!strcmp(how, "part")) {
		if (rows == 0 || rows >= t->n)
			tfail("pool capped below the dataset holds %" PRIu64 " of %" PRIu64
			      " rows, want some but not all",
			      rows, t->n);
	} else if (rows != t->n) {
		tfail("after epoch 1 the pool holds %" PRIu64 " of %" PRIu64
		      " rows: back-fill did not finish",
		      rows, t->n);
	}
	pf__envelope__free_unpacked(env, NULL);
	ss = t_status(t, &env);
	h2d0 = ss->h2d_bytes;
	hits0 = ss->pool_hits;
	log_status("after epoch 1", ss);
	pf__envelope__free_unpacked(env, NULL);

	t_start(t, t->o.seed + 1);
	if (!strcmp(how, "evict")) {
		uint64_t free_b, total, reserve, grab, dropped, freed = 0;

		for (int i = 0; i < 10; i++) {
			if (t_next(t, &b) || !b)
				tfail("pf_next %d of epoch 2: %s", i, pf_errmsg(t->c));
			t_release(t, b);
		}
		/* Mid-epoch, with batches in flight that read the slabs: drop
		 * them all; the rest of the epoch fills the pool again. */
		if (td_pool_control(t->o.sock, "d", PF__POOL_ACTION__POOL_DROP, &freed))
			tfail("pool drop refused");
		p = t_pool(t, &env);
		log_pool("after prefetchctl pool d drop", p);
		/* The pool may refill at once (its budget allows), so judge the
		 * drop by what it gave back. */
		if (freed < pool_before || p->slabs_dropped == 0)
			tfail("pool drop freed %" PRIu64 " of %" PRIu64 " bytes, %" PRIu64
			      " slabs dropped",
			      freed, pool_before, p->slabs_dropped);
		dropped = p->slabs_dropped;
		pf__envelope__free_unpacked(env, NULL);
		for (int i = 0; i < 20; i++) {
			if (t_next(t, &b) || !b)
				tfail("pf_next %d of epoch 2: %s", 10 + i, pf_errmsg(t->c));
			t_release(t, b);
		}
		p = t_pool(t, &env);
		log_pool("refilled", p);
		pool_before = p->bytes;
		if (pool_before == 0)
			tfail("the pool did not refill after the drop");
		pf__envelope__free_unpacked(env, NULL);
		/* Leave free memory half the pool below the reserve: the next
		 * probe's budget is then about half what the pool holds. */
		if (pfcuda_mem_info(t->dev, &free_b, &total, msg, sizeof(msg)))
			tfail("pfcuda_mem_info: %s", msg);
		reserve = total / 10 > 2 * GiB ? total / 10 : 2 * GiB;
		grab = (free_b - reserve + pool_before / 2) & ~(2 * MiB - 1);
		rc = pfcuda_mem_alloc(t->dev, grab, &ptrs[nptrs], msg, sizeof(msg));
		if (rc)
			tfail("pfcuda_mem_alloc %.2f GiB: %d %s", grab / (double)GiB, rc, msg);
		nptrs++;
		if (pf_probe(t->c))
			tfail("pf_probe: %s", pf_errmsg(t->c));
		for (int i = 0; i < 10; i++) {
			if (t_next(t, &b) || !b)
				tfail("pf_next %d of epoch 2: %s", 30 + i, pf_errmsg(t->c));
			t_release(t, b);
		}
		p = t_pool(t, &env);
		log_pool("after a probe half the pool short", p);
		if (p->bytes >= pool_before || p->slabs_dropped <= dropped)
			tfail("the pool did not shrink: %.2f MiB, was %.2f", p->bytes / (double)MiB,
			      pool_before / (double)MiB);
		pf__envelope__free_unpacked(env, NULL);
	} else if (!strcmp(how, "pressure")) {
		if (t_next(t, &b) || !b)
			tfail("first pf_next of epoch 2: %s", pf_errmsg(t->c));
		t_release(t, b);
		/* The trainer's "first step" grabs all but ~3.5 GiB, far below
		 * the reserve; the probe at the epoch's 2nd batch reports it. */
		nptrs = fill_gpu(t, ptrs, sizeof(ptrs) / sizeof(ptrs[0]));
	}
	t_finish_epoch(t);
	tlog("epoch 2 (%s): %" PRIu64 " batches, %" PRIu64 " picks, each once, every byte "
	     "checked",
	     how, t->ep.announced, t->ep.delivered);
	p = t_pool(t, &env);
	log_pool("after epoch 2", p);
	ss = td_session(env, t_session(t));
	if (!ss)
		tfail("own session missing from status");
	log_status("after epoch 2", ss);
	tlog("epoch 2: %" PRIu64 " sample bytes over PCIe, %" PRIu64 " pool hits, %" PRIu64
	     " index bytes in all",
	     ss->h2d_bytes - h2d0, ss->pool_hits - hits0, ss->index_bytes);
	if (ss->errors)
		tfail("%" PRIu64 " error batches", ss->errors);
	if (!strcmp(how, "all")) {
		if (ss->h2d_bytes != h2d0 || ss->pool_hits - hits0 != t->n || p->hit_rate != 1.0)
			tfail("epoch 2 from a full pool: %" PRIu64
			      " sample bytes over PCIe, %" PRIu64
			      " hits, hit rate %.4f; want 0, %" PRIu64 ", 1",
			      ss->h2d_bytes - h2d0, ss->pool_hits - hits0, p->hit_rate, t->n);
	} else if (!strcmp(how, "part")) {
		if (ss->pool_hits - hits0 != rows || ss->h2d_bytes - h2d0 != (t->n - rows) * sb)
			tfail("epoch 2 from a partial pool of %" PRIu64 " rows: %" PRIu64
			      " hits, %" PRIu64 " bytes over PCIe; want %" PRIu64 " and %" PRIu64,
			      rows, ss->pool_hits - hits0, ss->h2d_bytes - h2d0, rows,
			      (t->n - rows) * sb);
	} else if (!strcmp(how, "pressure")) {
		if (p->bytes >= pool_before || ss->target != 1)
			tfail("under pressure: pool %.2f MiB (was %.2f), target %u; want smaller "
			      "and 1",
			      p->bytes / (double)MiB, pool_before / (double)MiB, ss->target);
	}
	pf__envelope__free_unpacked(env, NULL);
	for (size_t i = 0; i < nptrs; i++)
		pfcuda_mem_free(t->dev, ptrs[i]);
	t_close(t);
}

/* mode=warm: the first epoch of a new trainer on a pool another trainer
 * filled: every row a hit, no sample byte over PCIe, every byte checked. */
static void mode_warm(struct trainer *t)
{
	Pf__Envelope *env;
	Pf__SessionStatus *ss;
	Pf__PoolStatus *p;

	t_open(t, t->o.min_depth, t->o.max_depth);
	t_start(t, t->o.seed);
	t_finish_epoch(t);
	p = t_pool(t, &env);
	log_pool("after the first epoch", p);
	ss = td_session(env, t_session(t));
	if (!ss)
		tfail("own session missing from status");
	tlog("first epoch: %" PRIu64 " sample bytes over PCIe, %" PRIu64 " pool hits of %" PRIu64
	     ", hit rate %.4f, every byte checked",
	     ss->h2d_bytes, ss->pool_hits, t->n, p->hit_rate);
	if (ss->h2d_bytes != 0 || ss->pool_hits != t->n || p->hit_rate != 1.0 || ss->errors)
		tfail("first epoch from a lingering pool: %" PRIu64 " sample bytes over PCIe, "
		      "%" PRIu64 " hits, hit rate %.4f, %" PRIu64 " errors; want 0, %" PRIu64
		      ", 1, 0",
		      ss->h2d_bytes, ss->pool_hits, p->hit_rate, ss->errors, t->n);
	pf__envelope__free_unpacked(env, NULL);
	t_close(t);
}

static int trainer_main(int argc, char **argv)
{
	struct trainer t = {.o = {.mode = "epochs", .epochs = 1, .seed = 1, .batch = BATCH}};

	setvbuf(stderr, NULL, _IOLBF, 0);
	for (int i = 0; i < argc; i++) {
		const char *a = argv[i], *v = strchr(a, '=');

		if (!v)
			tfail("bad trainer argument '%s'", a);
		v++;
		if (!strncmp(a, "sock=", 5))
			t.o.sock = v;
		else if (!strncmp(a, "mode=", 5))
			t.o.mode = v;
		else if (!strncmp(a, "ipc=", 4))
			t.o.ipc = !strcmp(v, "fd")	 ? PF_IPC_FD
				  : !strcmp(v, "legacy") ? PF_IPC_LEGACY
							 : PF_IPC_DEFAULT;
		else if (!strncmp(a, "epochs=", 7))
			t.o.epochs = (uint32_t)strtoul(v, NULL, 10);
		else if (!strncmp(a, "seed=", 5))
			t.o.seed = strtoull(v, NULL, 10);
		else if (!strncmp(a, "min_depth=", 10))
			t.o.min_depth = (uint32_t)strtoul(v, NULL, 10);
		else if (!strncmp(a, "max_depth=", 10))
			t.o.max_depth = (uint32_t)strtoul(v, NULL, 10);
		else if (!strncmp(a, "batch=", 6))
			t.o.batch = (uint32_t)strtoul(a + 6, NULL, 10);
		else if (!strncmp(a, "alloc=", 6))
			t.o.alloc = atoi(v) != 0;
		else if (!strncmp(a, "halved=", 7))
			t.o.halved = atoi(v) != 0;
		else if (!strncmp(a, "pool=", 5))
			t.o.pool = v;
		else if (!strncmp(a, "reconnect_s=", 12))
			t.o.reconnect_s = strtod(v, NULL);
		else if (!strncmp(a, "step_us=", 8))
			t.o.step_us = (uint32_t)strtoul(v, NULL, 10);
		else if (!strncmp(a, "reconnects=", 11))
			t.o.reconnects = (uint32_t)strtoul(v, NULL, 10);
		else if (!strncmp(a, "rank=", 5))
			t.o.rank = (uint32_t)strtoul(v, NULL, 10);
		else if (!strncmp(a, "world=", 6))
			t.o.world = (uint32_t)strtoul(v, NULL, 10);
		else if (!strncmp(a, "gpu=", 4))
			t.o.gpu = (uint32_t)strtoul(v, NULL, 10);
		else if (!strncmp(a, "seen_out=", 9))
			t.o.seen_out = v;
		else
			tfail("unknown trainer argument '%s'", a);
	}
	if (!t.o.sock)
		tfail("trainer needs sock=PATH");
	if (!strcmp(t.o.mode, "epochs"))
		mode_epochs(&t);
#if PF_CUDA
	else if (!strcmp(t.o.mode, "lag"))
		mode_lag(&t);
	else if (!strcmp(t.o.mode, "ahead"))
		mode_ahead(&t);
	else if (!strcmp(t.o.mode, "nowait"))
		mode_nowait(&t);
#endif
	else if (!strcmp(t.o.mode, "stream"))
		mode_stream(&t);
	else if (!strcmp(t.o.mode, "hold"))
		mode_hold(&t);
	else if (!strcmp(t.o.mode, "restart"))
		mode_restart(&t);
	else if (!strcmp(t.o.mode, "probe"))
		mode_probe(&t);
	else if (!strcmp(t.o.mode, "oom"))
		mode_oom(&t);
	else if (!strcmp(t.o.mode, "pool"))
		mode_pool(&t);
	else if (!strcmp(t.o.mode, "poolkill"))
		mode_poolkill(&t);
	else if (!strcmp(t.o.mode, "warm"))
		mode_warm(&t);
	else
		tfail("unknown mode '%s'", t.o.mode);
	return 0;
}

/* ======================================================================
 * Test side: the cmocka process.
 * ====================================================================== */

/* A trainer process. */
struct kid {
	pid_t pid;  /* 0 once reaped */
	int status; /* wait status once reaped */
	int out;    /* owned: read end of its stdout, -1 when closed */
	int in;	    /* owned: write end of its stdin, -1 when closed */
	char name[32];
	char log[400];	/* its stderr */
	bool shown;	/* its log was printed already */
	char buf[4096]; /* stdout read but not yet consumed as lines */
	size_t len;
};

static struct {
	struct tdaemon td;
	struct kid kids[MAX_KIDS];
	bool done;    /* the case ran to its end */
	bool skipped; /* the case skipped */
} fx;

/* Device 0 as the test process sees it: opened once, on first need. */
static struct pfcuda_dev *gpu; /* owned, closed in main */
static int gpu_rc = 1;	       /* 1: not tried yet; else pfcuda_open's result */
static char gpu_msg[256];

static bool gpu_required(void)
{
	const char *v = getenv("PF_REQUIRE_GPU");

	return v && *v && strcmp(v, "0");
}

static __attribute__((format(printf, 1, 2))) void skip_because(const char *fmt, ...)
{
	char why[600];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	if (gpu_required())
		fail_msg("PF_REQUIRE_GPU is set but %s", why);
	print_message("skipped: %s\n", why);
	fx.skipped = true;
	skip();
}

static void need_gpu(void)
{
	if (gpu_rc == 1)
		gpu_rc = pfcuda_open(0, &gpu, gpu_msg, sizeof(gpu_msg));
	if (gpu_rc < 0)
		skip_because("no CUDA device: %s", gpu_msg);
}

/* Prints the last `lines` lines of a log, leaving out the daemon's
 * per-epoch lines (a streaming trainer makes thousands). */
static void show_log(const char *title, const char *path, int lines)
{
	static char ring[64][512];
	char line[512];
	FILE *f = fopen(path, "r");
	long n = 0, chatter = 0;

	if (!f)
		return;
	if (lines > 64)
		lines = 64;
	while (fgets(line, sizeof(line), f)) {
		if (strstr(line, ": epoch ") && strstr(line, " done, ")) {
			chatter++;
			continue;
		}
		snprintf(ring[n++ % lines], sizeof(ring[0]), "%s", line);
	}
	fclose(f);
	print_message("---- %s (%s; %ld per-epoch lines left out) ----\n", title, path, chatter);
	for (long i = n > lines ? n - lines : 0; i < n; i++) {
		const char *l = ring[i % lines];

		print_message("%s%s", l, l[0] && l[strlen(l) - 1] == '\n' ? "" : "\n");
	}
	print_message("---- end of %s ----\n", title);
	fflush(stdout);
}

static int setup(void **state)
{
	memset(&fx, 0, sizeof(fx));
	for (int i = 0; i < MAX_KIDS; i++)
		fx.kids[i].out = fx.kids[i].in = -1;
	return td_init(&fx.td, "cuda") ? -1 : 0;
}

static void kid_close_fds(struct kid *k)
{
	if (k->out >= 0)
		close(k->out);
	if (k->in >= 0)
		close(k->in);
	k->out = k->in = -1;
}

/* Kills every trainer still running, stops the daemon, and on a failure
 * shows what the daemon and the trainers logged. */
static int teardown(void **state)
{
	bool failed = !fx.done && !fx.skipped;

	for (int i = 0; i < MAX_KIDS; i++) {
		struct kid *k = &fx.kids[i];

		if (k->pid > 0) {
			kill(k->pid, SIGKILL);
			waitpid(k->pid, NULL, 0);
			k->pid = 0;
		}
		kid_close_fds(k);
	}
	if (fx.td.pid > 0)
		td_stop(&fx.td, 5000);
	if (failed) {
		for (int i = 0; i < MAX_KIDS; i++)
			if (fx.kids[i].name[0] && !fx.kids[i].shown)
				show_log(fx.kids[i].name, fx.kids[i].log, 30);
		show_log("daemon log", fx.td.log, 60);
	}
	td_cleanup(&fx.td);
	return 0;
}

/* Writes the dataset and starts a daemon with these [daemon] lines;
 * fail_allocs, when not NULL, goes to PREFETCHD_TEST_FAIL_ALLOCS. */
static void start_daemon(const char *extra, const char *fail_allocs)
{
	uint64_t xs[1] = {X_DIM};
	char p[400];
	int rc;

	td_path(&fx.td, "x0.npy", p, sizeof(p));
	assert_int_equal(td_write_npy(p, 1, "<f4", 4, X_SHARD0, xs, 1, SEED_X, 0), 0);
	td_path(&fx.td, "x1.npy", p, sizeof(p));
	assert_int_equal(td_write_npy(p, 1, "<f4", 4, N_ROWS - X_SHARD0, xs, 1, SEED_X, X_SHARD0),
			 0);
	td_path(&fx.td, "y.npy", p, sizeof(p));
	assert_int_equal(td_write_npy(p, 2, "<i8", 8, N_ROWS, NULL, 0, SEED_Y, 0), 0);
	if (fail_allocs)
		setenv("PREFETCHD_TEST_FAIL_ALLOCS", fail_allocs, 1);
	rc = td_start(&fx.td, extra, DATASETS);
	unsetenv("PREFETCHD_TEST_FAIL_ALLOCS");
	if (rc)
		fail_msg("td_start: %d (%s)", rc, strerror(-rc));
}

static void stop_daemon(void)
{
	int rc = td_stop(&fx.td, 10000);

	if (rc != 0)
		fail_msg("the daemon did not exit cleanly (status %d)", rc);
}

/* Starts `/proc/self/exe --trainer sock=... args...` with its stdin and
 * stdout on pipes and its stderr in a log file of the test directory. */
static struct kid *spawn(const char *name, const char *const *args)
{
	const char *argv[24];
	char sock[400];
	int in[2], out[2], logfd, n = 0;
	struct kid *k = NULL;

	for (int i = 0; i < MAX_KIDS && !k; i++)
		if (fx.kids[i].pid == 0 && fx.kids[i].out < 0 && fx.kids[i].in < 0)
			k = &fx.kids[i];
	if (!k)
		fail_msg("more than %d trainers at once", MAX_KIDS);
	memset(k, 0, sizeof(*k));
	k->out = k->in = -1;
	snprintf(k->name, sizeof(k->name), "%s", name);
	td_path(&fx.td, name, k->log, sizeof(k->log));
	strncat(k->log, ".log", sizeof(k->log) - strlen(k->log) - 1);
	snprintf(sock, sizeof(sock), "sock=%s", fx.td.sock);
	argv[n++] = "test_cuda-trainer"; /* its name in the daemon's log */
	argv[n++] = "--trainer";
	argv[n++] = sock;
	for (int i = 0; args[i] && n < 23; i++)
		argv[n++] = args[i];
	argv[n] = NULL;
	logfd = open(k->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	assert_true(logfd >= 0);
	assert_int_equal(pipe2(in, O_CLOEXEC), 0);
	assert_int_equal(pipe2(out, O_CLOEXEC), 0);
	fflush(stdout);
	fflush(stderr);
	k->pid = fork();
	if (k->pid == 0) {
		/* Nothing but dup2 and exec: this process may hold a CUDA
		 * context that a forked copy must not touch. */
		if (dup2(in[0], 0) < 0 || dup2(out[1], 1) < 0 || dup2(logfd, 2) < 0)
			_exit(126);
		execv("/proc/self/exe", (char *const *)argv);
		_exit(127);
	}
	close(in[0]);
	close(out[1]);
	close(logfd);
	k->in = in[1];
	k->out = out[0];
	if (k->pid < 0) {
		k->pid = 0;
		kid_close_fds(k);
		fail_msg("fork: %s", strerror(errno));
	}
	return k;
}

/* Reaps k if it has exited (wait_ms 0) or within wait_ms; on a timeout it
 * is killed.  Returns true once reaped. */
static bool kid_reap(struct kid *k, int wait_ms)
{
	double deadline = td_now() + wait_ms / 1000.0;

	if (k->pid <= 0)
		return true;
	for (;;) {
		pid_t r = waitpid(k->pid, &k->status, WNOHANG);

		if (r == k->pid) {
			k->pid = 0;
			return true;
		}
		if (td_now() >= deadline)
			break;
		usleep(5000);
	}
	if (wait_ms > 0) {
		kill(k->pid, SIGKILL);
		waitpid(k->pid, &k->status, 0);
		k->pid = 0;
		print_message("%s did not exit within %d ms: killed\n", k->name, wait_ms);
	}
	return false;
}

/* Prints k's log, indented. */
static void kid_show(struct kid *k)
{
	char line[1024];
	FILE *f = fopen(k->log, "r");

	if (!f)
		return;
	k->shown = true;
	while (fgets(line, sizeof(line), f))
		print_message("  [%s] %s%s", k->name, line,
			      line[0] && line[strlen(line) - 1] == '\n' ? "" : "\n");
	fclose(f);
}

/* k has exited: passes when it exited 0; with may_skip, exit 77 (the
 * daemon refused cuda:0) skips the case with the daemon's message. */
static void kid_verdict(struct kid *k, bool may_skip)
{
	int st = k->status;

	kid_close_fds(k);
	if (WIFEXITED(st) && WEXITSTATUS(st) == EXIT_NO_GPU && may_skip) {
		char line[1024], why[1024] = "(no message)";
		FILE *f = fopen(k->log, "r");

		while (f && fgets(line, sizeof(line), f))
			if (!strncmp(line, "nogpu: ", 7)) {
				line[strcspn(line, "\n")] = '\0';
				snprintf(why, sizeof(why), "%s", line + 7);
			}
		if (f)
			fclose(f);
		skip_because("daemon has no GPU: %s", why);
	}
	kid_show(k);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		if (WIFSIGNALED(st))
			fail_msg("trainer %s died of signal %d", k->name, WTERMSIG(st));
		fail_msg("trainer %s exited with status %d", k->name, WEXITSTATUS(st));
	}
}

/* Waits up to timeout_ms for a stdout line of k starting with prefix and
 * copies it to line.  If k exits first, it is judged (kid_verdict) and a
 * trainer that exited 0 without the line fails the case. */
static void kid_line(struct kid *k, const char *prefix, int timeout_ms, bool may_skip, char *line,
		     size_t len)
{
	double deadline = td_now() + timeout_ms / 1000.0;

	for (;;) {
		char *nl;
		struct pollfd p = {.fd = k->out, .events = POLLIN};
		ssize_t r;
		int left;

		while ((nl = memchr(k->buf, '\n', k->len))) {
			size_t l = (size_t)(nl - k->buf) + 1;
			bool hit = !strncmp(k->buf, prefix, strlen(prefix));

			if (hit) {
				snprintf(line, len, "%.*s", (int)(l - 1), k->buf);
			}
			memmove(k->buf, k->buf + l, k->len - l);
			k->len -= l;
			if (hit)
				return;
		}
		left = (int)((deadline - td_now()) * 1000);
		if (left <= 0) {
			kid_reap(k, 1); /* kills it */
			kid_show(k);
			fail_msg("no \"%s\" from trainer %s within %d ms", prefix, k->name,
				 timeout_ms);
		}
		if (poll(&p, 1, left > 200 ? 200 : left) <= 0)
			continue;
		if (k->len == sizeof(k->buf))
			k->len = 0; /* a line longer than the buffer: drop it */
		r = read(k->out, k->buf + k->len, sizeof(k->buf) - k->len);
		if (r > 0) {
			k->len += (size_t)r;
			continue;
		}
		/* End of file: the trainer is gone (or going). */
		kid_reap(k, 10000);
		kid_verdict(k, may_skip);
		fail_msg("trainer %s exited without saying \"%s\"", k->name, prefix);
	}
}

/* Runs one trainer to its end and judges it. */
static void run_trainer(const char *name, const char *const *args, int timeout_ms)
{
	struct kid *k = spawn(name, args);
	double t0 = td_now();

	kid_reap(k, timeout_ms);
	kid_verdict(k, true);
	print_message("trainer %s passed in %.1f s\n", name, td_now() - t0);
}

/* Device 1 as the test process sees it, for the two-GPU cases (main opens
 * it, and runs them only if it opens). */
static struct pfcuda_dev *gpu1; /* owned, closed in main */

/* Free memory of the device the test's memory checks look at: device 0,
 * or device 1 while a two-GPU case sets watch_gpu1. */
static bool watch_gpu1;

static uint64_t gpu_free(void)
{
	uint64_t free_b = 0, total = 0;
	char msg[256] = "";
	int rc = pfcuda_mem_info(watch_gpu1 ? gpu1 : gpu, &free_b, &total, msg, sizeof(msg));

	if (rc)
		fail_msg("pfcuda_mem_info: %d %s", rc, msg);
	return free_b;
}

/* The free-memory baseline: two equal readings 100 ms apart (within 2 s). */
static uint64_t settled_gpu_free(void)
{
	uint64_t base = gpu_free(), prev;

	for (int i = 0; i < 20; i++) {
		usleep(100000);
		prev = base;
		base = gpu_free();
		if (prev == base)
			break;
	}
	return base;
}

static uint64_t absdiff(uint64_t a, uint64_t b)
{
	return a > b ? a - b : b - a;
}

/* Status of a session: held (or -1 when the session is gone). */
/* held (or, with arena_bytes, the device arena bytes) of a session in
 * status; -1 once the session is gone. */
static int64_t session_figure(uint64_t session, bool arena_bytes)
{
	Pf__Envelope *st = td_status(fx.td.sock);
	Pf__SessionStatus *ss;
	int64_t v;

	if (!st)
		fail_msg("no status from the daemon");
	ss = td_session(st, session);
	v = !ss ? -1 : arena_bytes ? (int64_t)ss->arena_bytes : (int64_t)ss->held;
	pf__envelope__free_unpacked(st, NULL);
	return v;
}

static int64_t session_held(uint64_t session)
{
	return session_figure(session, false);
}

/* After the kill of cycle's trainer: its session leaves status within 5 s,
 * then free device memory comes within 2 MiB of base within 5 s more
 * (fails the case otherwise).  Returns the last free-memory reading. */
static uint64_t wait_gone_and_memory_back(uint64_t session, uint64_t base, int cycle)
{
	double deadline = td_now() + 5;
	uint64_t now;

	while (session_held(session) >= 0 && td_now() < deadline)
		usleep(2000);
	if (session_held(session) >= 0)
		fail_msg("cycle %d: killed session %" PRIu64 " still in status after 5 s", cycle,
			 session);
	deadline = td_now() + 5;
	do {
		now = gpu_free();
		if (absdiff(now, base) <= 2 * MiB)
			break;
		usleep(10000);
	} while (td_now() < deadline);
	if (absdiff(now, base) > 2 * MiB)
		fail_msg("cycle %d: free device memory %.1f MiB, baseline %.1f MiB (%+.1f MiB) 5 s "
			 "after the kill",
			 cycle, now / (double)MiB, base / (double)MiB,
			 ((double)now - (double)base) / MiB);
	return now;
}

static void epochs_test(const char *daemon_extra, const char *ipc_arg)
{
	const char *args[] = {"mode=epochs", "epochs=2", "seed=7", ipc_arg, NULL};

	need_gpu();
	start_daemon(daemon_extra, NULL);
	run_trainer("trainer", args, 120000);
	stop_daemon();
	fx.done = true;
}

static void shuffled_epochs_reach_a_trainer_process_byte_exact_over_fd(void **state)
{
	epochs_test("ipc = fd\n", "ipc=fd");
}

static void shuffled_epochs_reach_a_trainer_process_byte_exact_over_legacy_ipc(void **state)
{
	epochs_test("ipc = legacy\n", "ipc=default");
}

/* No pool: the batches come in host arenas and libprefetch copies each to
 * the GPU itself, in the trainer's context (SessionOpened.client_copy). */
static void shuffled_epochs_copied_by_the_trainer_itself_are_byte_exact(void **state)
{
	epochs_test("pool = off\n", "ipc=default");
}

/* Copies ahead of the trainer: an epoch left with batches copied and not
 * taken, then one with 8 batches held at once (mode=ahead). */
static void copies_ahead_of_the_trainer_survive_a_left_epoch_and_batches_held_at_once(void **state)
{
	const char *args[] = {"mode=ahead", "seed=61", "max_depth=8", NULL};

	need_gpu();
	start_daemon("pool = off\n", NULL);
	run_trainer("ahead", args, 120000);
	stop_daemon();
	fx.done = true;
}

/* $PREFETCH_CLIENT_COPY=0: the same with the daemon's copies. */
static void
shuffled_epochs_copied_by_the_daemon_for_a_client_that_will_not_are_byte_exact(void **state)
{
	setenv("PREFETCH_CLIENT_COPY", "0", 1);
	epochs_test("pool = off\n", "ipc=default");
	unsetenv("PREFETCH_CLIENT_COPY");
}

static void trainer_asking_for_legacy_ipc_gets_exact_epochs_from_an_fd_daemon(void **state)
{
	epochs_test("", "ipc=legacy");
}

/*
 * While a long-lived trainer streams (fixed depth, so its device memory
 * stays put), trainers are started, take 3 batches, hold them and are
 * SIGKILLed.  Each time the daemon must drop the session and the device
 * memory must come back to the baseline within 2 MiB (the driver's page
 * size), and the survivor must never see an error or a wrong byte.
 */
static void killed_trainers_test(const char *daemon_extra, const char *ipc_arg, int cycles)
{
	const char *stream_args[] = {"mode=stream", "min_depth=4", "max_depth=4",
				     "seed=1000",   ipc_arg,	   NULL};
	struct kid *streamer;
	uint64_t base, worst = 0, victim_arenas = 0;
	double worst_cycle = 0, sum_cycle = 0, worst_back = 0;
	char line[256];

	need_gpu();
	start_daemon(daemon_extra, NULL);
	streamer = spawn("streamer", stream_args);
	kid_line(streamer, "streaming", 60000, true, line, sizeof(line));

	base = settled_gpu_free();
	print_message("baseline: %.1f MiB free, streamer running\n", base / (double)MiB);

	for (int cycle = 0; cycle < cycles; cycle++) {
		char seed[32], name[32];
		/* Batches of 8192 rows (2 MiB slots): the victim's arenas are
		 * well over the 2 MiB tolerance, so a leaked one would show. */
		const char *args[] = {"mode=hold", "batch=8192", seed, ipc_arg, NULL};
		double t0 = td_now(), deadline, settled, killed;
		uint64_t session = 0, now = 0, dev;
		int64_t held = -1;
		struct kid *v;

		snprintf(seed, sizeof(seed), "seed=%d", 5000 + cycle);
		snprintf(name, sizeof(name), "victim%d", cycle);
		v = spawn(name, args);
		kid_line(v, "holding ", 60000, false, line, sizeof(line));
		session = strtoull(line + strlen("holding "), NULL, 10);
		assert_true(session > 0);

		deadline = td_now() + 2;
		while ((held = session_held(session)) < 3 && td_now() < deadline)
			usleep(5000);
		if (held < 3)
			fail_msg("cycle %d: session %" PRIu64 " shows held %" PRId64 ", want >= 3",
				 cycle, session, held);

		held = session_figure(session, true);
		if (held < (int64_t)(8 * MiB))
			fail_msg("cycle %d: the victim's session holds %.1f MiB of device arenas, "
				 "want >= 8 MiB",
				 cycle, held / (double)MiB);
		if (held > (int64_t)victim_arenas)
			victim_arenas = (uint64_t)held;

		killed = td_now();
		kill(v->pid, SIGKILL);
		kid_reap(v, 10000);
		kid_close_fds(v);
		v->name[0] = '\0'; /* its log says nothing a failure below needs */

		now = wait_gone_and_memory_back(session, base, cycle);
		settled = td_now();
		dev = absdiff(now, base);
		if (dev > worst)
			worst = dev;
		if (kid_reap(streamer, 0)) {
			kid_verdict(streamer, false);
			fail_msg("the streaming trainer exited during cycle %d", cycle);
		}
		if (settled - killed > worst_back)
			worst_back = settled - killed;
		if (settled - t0 > worst_cycle)
			worst_cycle = settled - t0;
		sum_cycle += settled - t0;
	}

	/* Closing its stdin tells the streamer to stop. */
	close(streamer->in);
	streamer->in = -1;
	kid_reap(streamer, 30000);
	kid_verdict(streamer, false);
	print_message("%d kills of trainers holding up to %.1f MiB of device arenas: worst "
		      "deviation from baseline %.2f MiB, memory back at most %.0f ms after the "
		      "kill; cycle %.0f ms average, %.0f ms worst\n",
		      cycles, victim_arenas / (double)MiB, worst / (double)MiB, worst_back * 1000,
		      sum_cycle / cycles * 1000, worst_cycle * 1000);
	stop_daemon();
	fx.done = true;
}

static void killed_trainers_give_back_all_device_memory_over_fd(void **state)
{
	killed_trainers_test("ipc = fd\n", "ipc=fd", 50);
}

static void killed_trainers_give_back_all_device_memory_over_legacy_ipc(void **state)
{
	killed_trainers_test("ipc = legacy\n", "ipc=default", 10);
}

static void probe_on_a_nearly_full_gpu_lowers_the_target_to_one(void **state)
{
	const char *args[] = {"mode=probe", "alloc=1", "max_depth=8", "seed=21", NULL};

	need_gpu();
	start_daemon("depth = 4\nreserve = 10%\nreserve_min = 2G\n", NULL);
	run_trainer("prober", args, 120000);
	stop_daemon();
	fx.done = true;
}

static void probe_on_a_free_gpu_raises_the_target_to_max_depth(void **state)
{
	const char *args[] = {"mode=probe", "alloc=0", "max_depth=8", "seed=22", NULL};

	need_gpu();
	start_daemon("depth = 4\n", NULL);
	run_trainer("prober", args, 120000);
	stop_daemon();
	fx.done = true;
}

/* Issue 33: pf_next, pf_release_next and pf_release return while ~100 ms
 * of the trainer's work is still queued on its stream, with the client's
 * copies (pool off) and with its gathers from a warm pool. */
static void nowait_test(const char *daemon_extra, const char *pool, const char *seed)
{
	const char *args[] = {"mode=nowait", pool, seed, NULL};

	need_gpu();
	start_daemon(daemon_extra, NULL);
	run_trainer("nowait", args, 120000);
	stop_daemon();
	fx.done = true;
}

static void per_batch_calls_return_before_the_trainers_queued_work_with_copies(void **state)
{
	nowait_test("pool = off\n", "pool=off", "seed=71");
}

static void per_batch_calls_return_before_the_trainers_queued_work_with_gathers(void **state)
{
	nowait_test("pool = on\n", "pool=on", "seed=72");
}

static void trainer_ahead_of_its_gpu_gets_every_batch_as_releases_retire(void **state)
{
	const char *args[] = {"mode=lag", "seed=51", NULL};

	need_gpu();
	start_daemon(NULL, NULL);
	run_trainer("lagger", args, 120000);
	stop_daemon();
	fx.done = true;
}

static void failed_device_allocation_halves_the_target_and_loses_no_sample(void **state)
{
	const char *args[] = {"mode=epochs", "epochs=1", "halved=1",
			      "max_depth=4", "seed=31",	 NULL};

	need_gpu();
	start_daemon("depth = 4\n", "1");
	run_trainer("trainer", args, 120000);
	stop_daemon();
	fx.done = true;
}

static void allocation_failing_four_times_is_one_error_batch_and_the_epoch_goes_on(void **state)
{
	const char *args[] = {"mode=oom", "max_depth=4", "seed=41", NULL};

	need_gpu();
	start_daemon("depth = 4\n", "4");
	run_trainer("trainer", args, 120000);
	stop_daemon();
	fx.done = true;
}

/*
 * Trainers streaming from a full pool, so that the gather kernel runs in
 * their own context, are SIGKILLed: each time the session goes, the pool
 * (its last session gone) gives its slabs back, and the device's free
 * memory comes back to what it was before the trainer started, within
 * 2 MiB, although the dead process may have had gathers in flight that
 * read the slabs.
 */
static void pooled_trainers_killed_mid_gather_test(const char *daemon_extra, const char *ipc_arg)
{
	const char *args[] = {"mode=poolkill", "seed=700", ipc_arg, NULL};
	uint64_t base, now = 0, worst = 0;
	double worst_back = 0;
	char line[256];

	need_gpu();
	start_daemon(daemon_extra, NULL);
	base = settled_gpu_free();
	print_message("baseline: %.1f MiB free, daemon idle\n", base / (double)MiB);
	for (int cycle = 0; cycle < 3; cycle++) {
		uint64_t session;
		double killed;
		struct kid *v;
		char name[32];

		snprintf(name, sizeof(name), "gatherer%d", cycle);
		v = spawn(name, args);
		kid_line(v, "gathering ", 120000, false, line, sizeof(line));
		session = strtoull(line + strlen("gathering "), NULL, 10);
		assert_true(session > 0);
		usleep(20000 + 10000 * cycle);
		killed = td_now();
		kill(v->pid, SIGKILL);
		kid_reap(v, 10000);
		kid_close_fds(v);
		v->name[0] = '\0';
		now = wait_gone_and_memory_back(session, base, cycle);
		if (absdiff(now, base) > worst)
			worst = absdiff(now, base);
		if (td_now() - killed > worst_back)
			worst_back = td_now() - killed;
	}
	print_message("3 trainers killed while gathering from the pool: worst deviation from "
		      "baseline %.2f MiB, memory back at most %.0f ms after the kill\n",
		      worst / (double)MiB, worst_back * 1000);
	stop_daemon();
	fx.done = true;
}

/* pool_linger 0: the pool goes with the killed trainer, so all of its
 * memory must come back (the lingering case has its own tests below). */
static void pooled_trainers_killed_mid_gather_give_back_all_device_memory_over_fd(void **state)
{
	pooled_trainers_killed_mid_gather_test("pool = on\npool_linger = 0\nipc = fd\n", "ipc=fd");
}

static void pooled_trainers_killed_mid_gather_give_back_all_device_memory_over_legacy(void **state)
{
	pooled_trainers_killed_mid_gather_test("pool = on\npool_linger = 0\nipc = legacy\n",
					       "ipc=default");
}

/* The pool of dataset d in status (fails the case when there is none);
 * free *env with pf__envelope__free_unpacked. */
static Pf__PoolStatus *test_pool(Pf__Envelope **env)
{
	Pf__PoolStatus *p;

	*env = td_status(fx.td.sock);
	if (!*env)
		fail_msg("no status from the daemon");
	p = td_pool(*env, "d");
	if (!p)
		fail_msg("status shows no pool for dataset d");
	return p;
}

static void a_trainer_killed_in_epoch_two_leaves_a_warm_pool_for_the_next_one(void **state)
{
	const char *kill_args[] = {"mode=poolkill", "seed=800", "ipc=fd", NULL};
	const char *warm_args[] = {"mode=warm", "seed=900", "ipc=fd", NULL};
	Pf__PoolStatus *p;
	Pf__Envelope *env;
	uint64_t session;
	struct kid *v;
	char line[256];

	need_gpu();
	start_daemon("pool = on\npool_linger = 60\n", NULL);
	v = spawn("filler", kill_args);
	kid_line(v, "gathering ", 120000, false, line, sizeof(line));
	session = strtoull(line + strlen("gathering "), NULL, 10);
	kill(v->pid, SIGKILL);
	kid_reap(v, 10000);
	kid_close_fds(v);
	v->name[0] = '\0';
	for (double deadline = td_now() + 5; session_held(session) >= 0 && td_now() < deadline;)
		usleep(2000);
	p = test_pool(&env);
	print_message("after the kill: pool %s, %u session(s), %" PRIu64 "/%" PRIu64
		      " rows, %.1f MiB, %.1f s left\n",
		      p->lingering ? "lingering" : "NOT lingering", p->sessions, p->rows,
		      p->samples, p->bytes / (double)MiB, p->linger_left_s);
	assert_true(p->lingering);
	assert_int_equal(p->sessions, 0);
	assert_int_equal(p->rows, p->samples);
	assert_true(p->linger_left_s > 50);
	pf__envelope__free_unpacked(env, NULL);
	/* The next trainer: hit rate 1 and no PCIe bytes from batch one on. */
	run_trainer("warm", warm_args, 120000);
	stop_daemon();
	fx.done = true;
}

#define LINGER_S 8
static void a_lingering_pool_gives_way_to_a_process_filling_the_gpu_then_leaves(void **state)
{
	const char *args[] = {"mode=pool", "pool=all", "seed=1000", NULL};
	uint64_t base, before, free_b, total = 0, reserve, grab, ptr = 0, now_free;
	double t_alloc, took = -1, ended = 0;
	char msg[256] = "";
	Pf__PoolStatus *p;
	Pf__Envelope *env;

	need_gpu();
	/* 2 MiB slabs: the pool is a few of them, so it can give back some. */
	start_daemon("pool = on\npool_slab = 2M\nprobe_interval = 1\npool_linger = 8\n", NULL);
	base = settled_gpu_free();
	print_message("baseline: %.1f MiB free, daemon idle\n", base / (double)MiB);
	run_trainer("pooler", args, 120000);
	ended = td_now();
	p = test_pool(&env);
	before = p->bytes;
	print_message("lingering: %s, %.1f MiB in %u slabs\n", p->lingering ? "yes" : "NO",
		      before / (double)MiB, p->slabs);
	assert_true(p->lingering);
	assert_true(p->slabs >= 2);
	pf__envelope__free_unpacked(env, NULL);

	/* Another process takes all but a little under the daemon's reserve. */
	free_b = gpu_free();
	assert_int_equal(pfcuda_mem_info(gpu, &free_b, &total, msg, sizeof(msg)), 0);
	reserve = total / 10 > 2 * GiB ? total / 10 : 2 * GiB;
	grab = (free_b - reserve + 3 * MiB) & ~(2 * MiB - 1);
	t_alloc = td_now();
	assert_int_equal(pfcuda_mem_alloc(gpu, grab, &ptr, msg, sizeof(msg)), 0);
	do {
		now_free = gpu_free();
		if (now_free >= reserve) {
			took = td_now() - t_alloc;
			break;
		}
		usleep(5000);
	} while (td_now() - t_alloc < 3);
	p = test_pool(&env);
	print_message("filled to %.1f MiB under the reserve: free back at the reserve after %.0f "
		      "ms; pool %.1f MiB (%s), why: %s\n",
		      (reserve - (free_b - grab)) / (double)MiB, took * 1000,
		      p->bytes / (double)MiB, p->lingering ? "lingering" : "gone",
		      p->linger_reason);
	assert_true(took >= 0);
	assert_true(took <= 1.0 + 0.1); /* probe_interval + 100 ms */
	assert_true(p->bytes < before);
	assert_non_null(strstr(p->linger_reason, "under the reserve"));
	pf__envelope__free_unpacked(env, NULL);
	pfcuda_mem_free(gpu, ptr);

	/* The pressure may have taken the whole pool: a second trainer fills
	 * it again and leaves, and this time nothing presses.  pool_linger
	 * after it left, everything goes back. */
	run_trainer("pooler2", args, 120000);
	ended = td_now();
	p = test_pool(&env);
	print_message("lingering again: %s, %.1f MiB\n", p->lingering ? "yes" : "NO",
		      p->bytes / (double)MiB);
	assert_true(p->lingering && p->bytes > 0);
	pf__envelope__free_unpacked(env, NULL);
	do {
		p = test_pool(&env);
		if (!p->lingering)
			break;
		pf__envelope__free_unpacked(env, NULL);
		env = NULL;
		usleep(50000);
	} while (td_now() - ended < LINGER_S + 3);
	assert_false(p->lingering);
	print_message("pool_linger over %.1f s after the session left: pool %.1f MiB (%s)\n",
		      td_now() - ended, p->bytes / (double)MiB, p->budget_reason);
	assert_int_equal(p->bytes, 0);
	pf__envelope__free_unpacked(env, NULL);
	now_free = settled_gpu_free();
	print_message("free device memory %.1f MiB, baseline %.1f MiB (%+.2f MiB)\n",
		      now_free / (double)MiB, base / (double)MiB,
		      ((double)now_free - (double)base) / MiB);
	assert_true(absdiff(now_free, base) <= 2 * MiB);
	stop_daemon();
	fx.done = true;
}

static void pool_test(const char *daemon_extra, const char *how, const char *seed)
{
	const char *args[] = {"mode=pool", how, seed, NULL};

	need_gpu();
	start_daemon(daemon_extra, NULL);
	run_trainer("pooler", args, 120000);
	stop_daemon();
	fx.done = true;
}

static void pool_holding_every_row_serves_epoch_two_with_no_pcie_sample_bytes(void **state)
{
	pool_test("pool = on\n", "pool=all", "seed=61");
}

static void pool_holding_every_row_is_gathered_byte_exact_over_legacy_ipc(void **state)
{
	pool_test("pool = on\nipc = legacy\n", "pool=all", "seed=65");
}

/* $PREFETCH_CLIENT_GATHER=0: a client that does not gather; the daemon's
 * own kernel assembles its pooled batches, as for an old libprefetch. */
static void pool_gathered_by_the_daemon_for_a_client_that_cannot_is_byte_exact(void **state)
{
	setenv("PREFETCH_CLIENT_GATHER", "0", 1);
	pool_test("pool = on\npool_slab = 2M\npool_bytes = 2M\n", "pool=part", "seed=66");
	unsetenv("PREFETCH_CLIENT_GATHER");
}

static void pool_holding_part_of_the_rows_serves_hits_and_misses_byte_exact(void **state)
{
	pool_test("pool = on\npool_slab = 2M\npool_bytes = 2M\n", "pool=part", "seed=62");
}

static void pool_losing_slabs_mid_epoch_loses_no_sample(void **state)
{
	pool_test("pool = on\npool_slab = 2M\nreserve = 10%\nreserve_min = 2G\n", "pool=evict",
		  "seed=63");
}

static void trainer_grabbing_the_gpu_shrinks_the_pool_and_its_epoch_completes(void **state)
{
	pool_test("pool = on\npool_slab = 2M\nreserve = 10%\nreserve_min = 2G\n", "pool=pressure",
		  "seed=64");
}

/*
 * The daemon is SIGKILLed while a trainer that reconnects streams, holding
 * the batch it trains on, and started again on the same socket 300 ms
 * later.  The trainer must ride through: its pf_next returns the batch
 * after the last one it took, from the new daemon's freshly imported
 * arenas, the epoch ends with every pick once and every byte right, the
 * held batch of the dead daemon is let go of, and the next epoch runs.
 */
static void restart_test(const char *daemon_extra, const char *ipc_arg)
{
	const char *args[] = {"mode=restart", "epochs=2",     "seed=11",
			      "batch=64",     "step_us=2000", "reconnect_s=30",
			      "reconnects=1", ipc_arg,	      NULL};
	struct kid *k;
	char line[256];
	unsigned long long reconnects = 0, resumed = 0, longest = 0;
	double killed;
	int rc;

	need_gpu();
	start_daemon(daemon_extra, NULL);
	k = spawn("trainer", args);
	kid_line(k, "streaming", 60000, true, line, sizeof(line));
	killed = td_now();
	assert_int_equal(td_kill(&fx.td), 0);
	usleep(300 * 1000);
	rc = td_start(&fx.td, daemon_extra, DATASETS);
	if (rc)
		fail_msg("td_start again: %d (%s)", rc, strerror(-rc));
	print_message("daemon SIGKILLed mid-epoch, started again %.0f ms later\n",
		      (td_now() - killed) * 1000);
	kid_line(k, "restarted", 120000, false, line, sizeof(line));
	if (sscanf(line, "restarted %llu %llu %llu", &reconnects, &resumed, &longest) != 3)
		fail_msg("trainer said \"%s\"", line);
	kid_reap(k, 60000);
	kid_verdict(k, false);
	print_message("trainer: %llu reconnection, epoch resumed at batch %llu, longest pf_next "
		      "wait %llu ms; 2 epochs, every pick once, every byte checked\n",
		      reconnects, resumed, longest);
	assert_int_equal(reconnects, 1);
	/* "streaming" came after batch 9: the kill was later. */
	assert_true(resumed >= 10);
	stop_daemon();
	fx.done = true;
}

static void killed_daemon_is_ridden_through_by_a_reconnecting_trainer_over_fd(void **state)
{
	restart_test("ipc = fd\n", "ipc=fd");
}

static void killed_daemon_is_ridden_through_by_a_reconnecting_trainer_over_legacy_ipc(void **state)
{
	restart_test("ipc = legacy\n", "ipc=default");
}

/* ---- two GPUs (issue 20): run only when the test process sees two -------- */

/* A trainer on one GPU: CUDA_VISIBLE_DEVICES=g, so that its cuda:0 is the
 * daemon's cuda:g, found by PCI bus id. */
static struct kid *spawn_on(int g, const char *name, const char *const *args)
{
	char v[16];
	struct kid *k;

	snprintf(v, sizeof(v), "%d", g);
	setenv("CUDA_VISIBLE_DEVICES", v, 1); /* the child's; ours is set up already */
	k = spawn(name, args);
	unsetenv("CUDA_VISIBLE_DEVICES");
	return k;
}

static void wait_trainer(struct kid *k, const char *name, double t0)
{
	kid_reap(k, 180000);
	kid_verdict(k, false);
	print_message("trainer %s passed in %.1f s\n", name, td_now() - t0);
}

/* Ranks 0 and 1 of world 2 on the daemon's cuda:g0 and cuda:g1. */
static void ranks_test(int g0, int g1)
{
	char seen0[400], seen1[400], out0[420], out1[420], gpu0[16], gpu1_arg[16];
	const char *a0[] = {"mode=epochs", "epochs=2", "seed=31", gpu0,
			    "rank=0",	   "world=2",  out0,	  NULL};
	const char *a1[] = {"mode=epochs", "epochs=2", "seed=31", gpu1_arg,
			    "rank=1",	   "world=2",  out1,	  NULL};
	/* Static: a skip or a failure leaves the case by longjmp. */
	static uint8_t s0[N_ROWS], s1[N_ROWS];
	struct kid *k0, *k1;
	uint64_t both = 0, none = 0;
	double t0 = td_now();
	FILE *f;

	need_gpu();
	snprintf(gpu0, sizeof(gpu0), "gpu=%d", g0);
	snprintf(gpu1_arg, sizeof(gpu1_arg), "gpu=%d", g1);
	start_daemon("", NULL);
	td_path(&fx.td, "seen0", seen0, sizeof(seen0));
	td_path(&fx.td, "seen1", seen1, sizeof(seen1));
	snprintf(out0, sizeof(out0), "seen_out=%s", seen0);
	snprintf(out1, sizeof(out1), "seen_out=%s", seen1);
	k0 = spawn_on(g0, "rank0", a0);
	k1 = spawn_on(g1, "rank1", a1);
	wait_trainer(k0, "rank0", t0);
	wait_trainer(k1, "rank1", t0);
	/* Each rank checked its share byte by byte; together they are the
	 * epoch, every pick once. */
	f = fopen(seen0, "rb");
	assert_non_null(f);
	assert_int_equal(fread(s0, 1, N_ROWS, f), N_ROWS);
	fclose(f);
	f = fopen(seen1, "rb");
	assert_non_null(f);
	assert_int_equal(fread(s1, 1, N_ROWS, f), N_ROWS);
	fclose(f);
	for (uint32_t i = 0; i < N_ROWS; i++) {
		both += s0[i] && s1[i];
		none += !s0[i] && !s1[i];
	}
	print_message("ranks 0 and 1 of world 2 on cuda:%d and cuda:%d: %" PRIu64
		      " picks in both, %" PRIu64 " in neither, of %d\n",
		      g0, g1, both, none, N_ROWS);
	assert_int_equal(both, 0);
	assert_int_equal(none, 0);
	stop_daemon();
	fx.done = true;
}

static void ranks_of_world_two_on_one_gpu_are_byte_exact_and_one_epoch(void **state)
{
	ranks_test(0, 0);
}

static void two_trainers_on_two_gpus_get_byte_exact_epochs_and_ranks_cover_one(void **state)
{
	ranks_test(0, 1);
}

static void a_trainer_killed_on_one_gpu_leaves_the_other_gpus_session_byte_exact(void **state)
{
	const char *stream_args[] = {"mode=stream", "min_depth=4", "max_depth=4", "seed=1100",
				     NULL};
	const char *victim_args[] = {"mode=hold", "batch=8192", "seed=1200", NULL};
	struct kid *streamer, *v;
	uint64_t base, session, now;
	double deadline;
	char line[256];

	need_gpu();
	start_daemon("", NULL);
	streamer = spawn_on(0, "streamer", stream_args);
	kid_line(streamer, "streaming", 60000, false, line, sizeof(line));
	watch_gpu1 = true;
	base = settled_gpu_free();
	v = spawn_on(1, "victim", victim_args);
	kid_line(v, "holding ", 60000, false, line, sizeof(line));
	session = strtoull(line + strlen("holding "), NULL, 10);
	assert_true(session > 0);
	deadline = td_now() + 2;
	while (session_held(session) < 3 && td_now() < deadline)
		usleep(5000);
	assert_true(session_held(session) >= 3);
	assert_true(session_figure(session, true) >= (int64_t)(8 * MiB));
	kill(v->pid, SIGKILL);
	kid_reap(v, 10000);
	kid_close_fds(v);
	v->name[0] = '\0';
	now = wait_gone_and_memory_back(session, base, 0);
	watch_gpu1 = false;
	print_message("victim on cuda:1 killed: free memory there %.1f MiB, baseline %.1f MiB "
		      "(%+.2f MiB)\n",
		      now / (double)MiB, base / (double)MiB, ((double)now - (double)base) / MiB);
	if (kid_reap(streamer, 0)) {
		kid_verdict(streamer, false);
		fail_msg("the trainer on cuda:0 exited when the one on cuda:1 was killed");
	}
	/* It streamed on, every byte checked; stdin closed, it stops. */
	close(streamer->in);
	streamer->in = -1;
	kid_reap(streamer, 30000);
	kid_verdict(streamer, false);
	stop_daemon();
	fx.done = true;
}

static void pools_on_two_gpus_fill_and_serve_each_from_its_own_gpu(void **state)
{
	const char *a0[] = {"mode=pool", "pool=all", "seed=1300", "gpu=0", NULL};
	const char *a1[] = {"mode=pool", "pool=all", "seed=1400", "gpu=1", NULL};
	struct kid *k0, *k1;
	double t0 = td_now();
	Pf__Envelope *env;

	need_gpu();
	start_daemon("", NULL);
	k0 = spawn_on(0, "pooler0", a0);
	k1 = spawn_on(1, "pooler1", a1);
	wait_trainer(k0, "pooler0 (cuda:0)", t0);
	wait_trainer(k1, "pooler1 (cuda:1)", t0);
	/* One pool per GPU, each holding every row: each trainer checked that
	 * its second epoch moved no sample byte over PCIe. */
	env = td_status(fx.td.sock);
	assert_non_null(env);
	for (int g = 0; g < 2; g++) {
		char dev[16];
		Pf__PoolStatus *p;

		snprintf(dev, sizeof(dev), "cuda:%d", g);
		p = td_pool_on(env, "d", dev);
		if (!p)
			fail_msg("status shows no pool for dataset d on %s", dev);
		print_message("pool on %s: %" PRIu64 "/%" PRIu64 " rows, %.2f MiB\n", dev, p->rows,
			      p->samples, p->bytes / (double)MiB);
		assert_int_equal(p->rows, N_ROWS);
	}
	pf__envelope__free_unpacked(env, NULL);
	stop_daemon();
	fx.done = true;
}

#define CASE(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		CASE(shuffled_epochs_reach_a_trainer_process_byte_exact_over_fd),
		CASE(shuffled_epochs_reach_a_trainer_process_byte_exact_over_legacy_ipc),
		CASE(trainer_asking_for_legacy_ipc_gets_exact_epochs_from_an_fd_daemon),
		CASE(shuffled_epochs_copied_by_the_trainer_itself_are_byte_exact),
		CASE(copies_ahead_of_the_trainer_survive_a_left_epoch_and_batches_held_at_once),
		CASE(shuffled_epochs_copied_by_the_daemon_for_a_client_that_will_not_are_byte_exact),
		CASE(killed_trainers_give_back_all_device_memory_over_fd),
		CASE(killed_trainers_give_back_all_device_memory_over_legacy_ipc),
		CASE(probe_on_a_nearly_full_gpu_lowers_the_target_to_one),
		CASE(probe_on_a_free_gpu_raises_the_target_to_max_depth),
		CASE(trainer_ahead_of_its_gpu_gets_every_batch_as_releases_retire),
		CASE(per_batch_calls_return_before_the_trainers_queued_work_with_copies),
		CASE(per_batch_calls_return_before_the_trainers_queued_work_with_gathers),
		CASE(failed_device_allocation_halves_the_target_and_loses_no_sample),
		CASE(allocation_failing_four_times_is_one_error_batch_and_the_epoch_goes_on),
		CASE(pool_holding_every_row_serves_epoch_two_with_no_pcie_sample_bytes),
		CASE(pool_holding_every_row_is_gathered_byte_exact_over_legacy_ipc),
		CASE(pool_gathered_by_the_daemon_for_a_client_that_cannot_is_byte_exact),
		CASE(pool_holding_part_of_the_rows_serves_hits_and_misses_byte_exact),
		CASE(pool_losing_slabs_mid_epoch_loses_no_sample),
		CASE(trainer_grabbing_the_gpu_shrinks_the_pool_and_its_epoch_completes),
		CASE(pooled_trainers_killed_mid_gather_give_back_all_device_memory_over_fd),
		CASE(pooled_trainers_killed_mid_gather_give_back_all_device_memory_over_legacy),
		CASE(a_trainer_killed_in_epoch_two_leaves_a_warm_pool_for_the_next_one),
		CASE(a_lingering_pool_gives_way_to_a_process_filling_the_gpu_then_leaves),
		CASE(killed_daemon_is_ridden_through_by_a_reconnecting_trainer_over_fd),
		CASE(killed_daemon_is_ridden_through_by_a_reconnecting_trainer_over_legacy_ipc),
		CASE(ranks_of_world_two_on_one_gpu_are_byte_exact_and_one_epoch),
	};
	int rc;

	if (argc >= 2 && !strcmp(argv[1], "--trainer"))
		return trainer_main(argc - 2, argv + 2);
	/* A trainer that dies must not take the test process with it. */
	signal(SIGPIPE, SIG_IGN);
	rc = cmocka_run_group_tests(tests, NULL, NULL);
	{
		const struct CMUnitTest two[] = {
			CASE(two_trainers_on_two_gpus_get_byte_exact_epochs_and_ranks_cover_one),
			CASE(a_trainer_killed_on_one_gpu_leaves_the_other_gpus_session_byte_exact),
			CASE(pools_on_two_gpus_fill_and_serve_each_from_its_own_gpu),
		};
		char msg[256] = "";

		/* Two-GPU cases only where there are two (not a skip: make
		 * check-cuda on one GPU must pass). */
		if (pfcuda_open(1, &gpu1, msg, sizeof(msg)) == 0)
			rc |= cmocka_run_group_tests(two, NULL, NULL);
		else
			printf("two-GPU cases not run: the test process cannot open CUDA device 1 "
			       "(%s)\n",
			       msg);
	}
	pfcuda_close(gpu1);
	pfcuda_close(gpu);
	return rc;
}
