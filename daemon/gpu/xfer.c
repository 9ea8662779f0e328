/*
 * xfer.c — the per-GPU transfer thread (see xfer.h).
 *
 * The thread's loop: take every queued job; queue each copy on the stream
 * with an event behind it; run allocations and frees as they come; then
 * retire the copies whose events have completed, oldest first.  With copies
 * in flight and nothing queued it waits on its condition variable for at
 * most XFER_POLL_NS, so a new job is queued at once and a completion is
 * seen within that time.  A retired
 * copy goes back to the loop thread, and its event to the thread's idle
 * events.  A free runs when the thread takes it from the pending queue,
 * so it follows every job submitted before it.
 *
 * DESIGN: the transfer thread makes every CUDA call of its device; the loop
 * thread only submits and drains.  x->lock guards the pending queue and the
 * stop flag; finished jobs go back through the handback.
 */
#include "gpu/xfer.h"

#include <errno.h>
#include <pthread.h>
#include <sys/prctl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/handback.h"
#include "base/log.h"
#include "util.h"

struct xfer {
	int dev;
	struct gpu_stream *stream; /* owned, transfer thread's */
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t more;
	struct fifo pending; /* under lock: loop -> thread */
	bool stop;
	bool stopped;	      /* joined: frees run inline, other jobs are cancelled */
	struct handback back; /* thread -> loop */
	xfer_done_fn done;
	void *arg;
	/* Transfer thread only. */
	uint64_t last_retire_ns;
	struct gpu_event **idle; /* events not recorded on anything */
	unsigned nidle, idle_cap;
	struct gpu_mem stage; /* owned: gather staging (GPU_IPC_NONE), grown on demand */
};

static int get_event(struct xfer *x, struct gpu_event **out)
{
	if (x->nidle) {
		*out = x->idle[--x->nidle];
		return 0;
	}
	return gpu_event_create(x->dev, out);
}

static void put_event(struct xfer *x, struct gpu_event *e)
{
	if (x->nidle == x->idle_cap) {
		unsigned cap = x->idle_cap ? x->idle_cap * 2 : 16;
		struct gpu_event **p = realloc(x->idle, cap * sizeof(*p));

		if (!p) {
			gpu_event_destroy(e);
			return;
		}
		x->idle = p;
		x->idle_cap = cap;
	}
	x->idle[x->nidle++] = e;
}

/* Back to the loop thread. */
static void finish(struct xfer *x, struct xfer_job *job)
{
	handback_push(&x->back, &job->link);
}

/* The memory comes with the job that will free it (gpu_mem.release), so
 * that giving it back never needs an allocation: a loop thread that is
 * short of host memory can still let go of device memory. */
static void run_alloc(struct xfer *x, struct xfer_job *job)
{
	struct xfer_job *release;

	if (job->inject_enomem) {
		job->rc = -ENOMEM;
		snprintf(job->err, sizeof(job->err),
			 "out of memory (forced by PREFETCHD_TEST_FAIL_ALLOCS)");
		return;
	}
	release = calloc(1, sizeof(*release));
	if (!release) {
		job->rc = -ENOMEM;
		snprintf(job->err, sizeof(job->err), "out of host memory");
		return;
	}
	job->rc = gpu_mem_alloc(x->dev, job->bytes, job->ipc, &job->mem);
	if (job->rc) {
		free(release);
		snprintf(job->err, sizeof(job->err), "%s",
			 job->rc == -ENOMEM ? "out of memory" : strerror(-job->rc));
		return;
	}
	release->kind = XFER_FREE;
	job->mem.release = release;
}

/* Makes the staging area at least bytes large.  Growing waits for the
 * stream: queued copies and gathers may still use the old area. */
static int stage_reserve(struct xfer *x, uint64_t bytes)
{
	uint64_t want;
	int rc;

	if (x->stage.base && x->stage.bytes >= bytes)
		return 0;
	/* Exactly what is asked (rounded to the arena granularity): the
	 * largest ring slot prefix bounds it, so it grows a few times at most. */
	want = bytes;
	gpu_stream_sync(x->stream);
	gpu_mem_free(&x->stage);
	rc = gpu_mem_alloc(x->dev, want, GPU_IPC_NONE, &x->stage);
	return rc;
}

/* The pool path of a copy: index and staged rows to the staging area, then
 * the gather kernel into the slot. */
static int queue_gather(struct xfer *x, struct xfer_job *job, char *err, size_t errlen)
{
	struct gpu_gather g = job->g;
	int rc;

	rc = stage_reserve(x, job->bytes);
	if (rc) {
		snprintf(err, errlen, "no %.1f MiB gather staging area on the device: %s",
			 job->bytes / 1048576.0, rc == -ENOMEM ? "out of memory" : strerror(-rc));
		return rc;
	}
	g.slot = job->dst;
	g.desc += x->stage.base;
	g.admit += x->stage.base;
	g.staged += x->stage.base;
	rc = gpu_copy_h2d(x->stream, x->stage.base, job->src, (size_t)job->bytes);
	if (!rc)
		rc = gpu_gather(x->stream, &g);
	if (rc)
		snprintf(err, errlen, "pool gather on the device failed: %s", strerror(-rc));
	return rc;
}

/* The copy of a batch its client gathers: index and staged rows to the
 * slot's tail, then the admissions alone when there are any. */
static int queue_client_copy(struct xfer *x, struct xfer_job *job, char *err, size_t errlen)
{
	struct gpu_gather g = job->g;
	int rc;

	rc = gpu_copy_h2d(x->stream, job->dst, job->src, (size_t)job->bytes);
	if (rc || !job->admits)
		return rc;
	g.count = 0;
	g.slot = 0;
	g.desc = 0;
	g.table = 0;
	g.admit += job->dst;
	g.staged += job->dst;
	rc = gpu_gather(x->stream, &g);
	if (rc)
		snprintf(err, errlen, "pool admission on the device failed: %s", strerror(-rc));
	return rc;
}

/* Queues one copy and its event; on failure the job is finished at once. */
static void queue_copy(struct xfer *x, struct xfer_job *job, struct fifo *inflight)
{
	int rc;

	job->queued_ns = now_ns();
	job->err[0] = '\0';
	rc = get_event(x, &job->event);
	if (!rc && job->client_gather)
		rc = queue_client_copy(x, job, job->err, sizeof(job->err));
	else if (!rc && job->gather)
		rc = queue_gather(x, job, job->err, sizeof(job->err));
	else if (!rc)
		rc = gpu_copy_h2d(x->stream, job->dst, job->src, (size_t)job->bytes);
	if (!rc)
		rc = gpu_event_record(job->event, x->stream);
	if (rc) {
		job->rc = rc;
		if (!job->err[0])
			snprintf(job->err, sizeof(job->err), "copy to the device failed: %s",
				 strerror(-rc));
		if (job->event) {
			/* Its copy may still be queued: wait before reuse. */
			gpu_stream_sync(x->stream);
			put_event(x, job->event);
			job->event = NULL;
		}
		finish(x, job);
		return;
	}
	fifo_push(inflight, &job->link);
}

/* Retires the oldest copy if its event has completed.  Returns 1 when one
 * was retired. */
static int retire_one(struct xfer *x, struct fifo *inflight)
{
	struct xfer_job *job;
	int rc;

	if (!inflight->head)
		return 0;
	job = container_of(inflight->head, struct xfer_job, link);
	rc = gpu_event_query(job->event);
	if (rc == -EAGAIN)
		return 0;
	fifo_pop(inflight);
	if (rc) {
		job->rc = rc;
		snprintf(job->err, sizeof(job->err), "copy to the device failed: %s",
			 strerror(-rc));
		gpu_stream_sync(x->stream);
	}
	/* The stream runs copies in order: this one had the engine from when
	 * it was queued or the one before it finished, whichever came last. */
	{
		uint64_t now = now_ns();
		uint64_t from =
			job->queued_ns > x->last_retire_ns ? job->queued_ns : x->last_retire_ns;

		job->copy_ns = now - from;
		x->last_retire_ns = now;
	}
	put_event(x, job->event);
	job->event = NULL;
	finish(x, job);
	return 1;
}

/* While copies are in flight the thread polls their events this often,
 * waking at once for new jobs: blocking on an event instead would leave a
 * copy that arrives meanwhile unqueued until the one before it finished,
 * and the copy engine idle for the wake-up. */
#define XFER_POLL_NS 20000

static void *xfer_main(void *arg)
{
	struct xfer *x = arg;
	struct fifo inflight = {0}; /* copies queued on the stream, oldest first */

	/* Timed waits of 20 us mean little with the default 50 us slack. */
	prctl(PR_SET_TIMERSLACK, 1000UL);
	for (;;) {
		struct fifo_node *n;

		pthread_mutex_lock(&x->lock);
		while (!x->pending.head) {
			if (inflight.head) {
				struct timespec ts;

				clock_gettime(CLOCK_MONOTONIC, &ts);
				ts.tv_nsec += XFER_POLL_NS;
				if (ts.tv_nsec >= 1000000000L) {
					ts.tv_sec++;
					ts.tv_nsec -= 1000000000L;
				}
				pthread_cond_timedwait(&x->more, &x->lock, &ts);
				break;
			}
			if (x->stop)
				break;
			pthread_cond_wait(&x->more, &x->lock);
		}
		if (!x->pending.head && !inflight.head && x->stop) {
			pthread_mutex_unlock(&x->lock);
			break;
		}
		n = fifo_take_all(&x->pending);
		pthread_mutex_unlock(&x->lock);

		while (n) {
			struct xfer_job *job = container_of(n, struct xfer_job, link);

			n = n->next;
			switch (job->kind) {
			case XFER_COPY: queue_copy(x, job, &inflight); break;
			case XFER_ALLOC:
				run_alloc(x, job);
				finish(x, job);
				break;
			case XFER_MEMINFO:
				job->rc = gpu_mem_info(x->dev, &job->free_bytes, &job->total_bytes);
				finish(x, job);
				break;
			case XFER_FREE:
				/* Everything submitted before it is queued on the
				 * stream by now, and cudaFree waits for it. */
				gpu_mem_free(&job->mem);
				free(job);
				break;
			}
		}
		while (retire_one(x, &inflight))
			;
	}
	return NULL;
}

static void deliver(struct fifo_node *n, void *arg)
{
	struct xfer *x = arg;
	struct xfer_job *job = container_of(n, struct xfer_job, link);

	if (job->done)
		job->done(job);
	else
		x->done(job, x->arg);
}

static void free_xfer(struct handback *hb)
{
	free(container_of(hb, struct xfer, back));
}

int xfer_start(struct xfer **out, int dev, uv_loop_t *loop, xfer_done_fn done, void *arg, char *err,
	       size_t errlen)
{
	struct xfer *x = calloc(1, sizeof(*x));
	int rc;

	if (!x) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	x->dev = dev;
	x->stage.export_fd = -1;
	x->done = done;
	x->arg = arg;
	rc = gpu_stream_create(dev, &x->stream);
	if (rc) {
		snprintf(err, errlen, "cannot create a copy stream on GPU %d: %s", dev,
			 strerror(-rc));
		free(x);
		return rc;
	}
	rc = handback_init(&x->back, loop, deliver, x);
	if (rc) {
		snprintf(err, errlen, "uv_async_init: %s", uv_strerror(rc));
		gpu_stream_destroy(x->stream);
		free(x);
		return rc;
	}
	pthread_mutex_init(&x->lock, NULL);
	{
		pthread_condattr_t ca;

		/* Timed waits count on the monotonic clock. */
		pthread_condattr_init(&ca);
		pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
		pthread_cond_init(&x->more, &ca);
		pthread_condattr_destroy(&ca);
	}
	rc = pthread_create(&x->thread, NULL, xfer_main, x);
	if (rc) {
		snprintf(err, errlen, "cannot start the transfer thread of GPU %d: %s", dev,
			 strerror(rc));
		gpu_stream_destroy(x->stream);
		pthread_mutex_destroy(&x->lock);
		pthread_cond_destroy(&x->more);
		handback_close(&x->back, free_xfer); /* frees x */
		return -rc;
	}
	*out = x;
	return 0;
}

void xfer_submit(struct xfer *x, struct xfer_job *job)
{
	if (x->stopped) {
		/* The thread is gone (shutdown): it comes back cancelled. */
		job->rc = -ECANCELED;
		snprintf(job->err, sizeof(job->err), "daemon shutting down");
		deliver(&job->link, x);
		return;
	}
	pthread_mutex_lock(&x->lock);
	fifo_push(&x->pending, &job->link);
	pthread_cond_signal(&x->more);
	pthread_mutex_unlock(&x->lock);
}

void xfer_free_mem(struct xfer *x, struct gpu_mem *mem)
{
	struct xfer_job *job = mem->release;

	if (!job) {
		/* Zeroed (never allocated, or given back already): nothing
		 * to free.  Memory of any other origin never comes here. */
		if (mem->base)
			log_err("xfer: device memory at %#llx was not allocated by a transfer "
				"thread; it is not freed",
				(unsigned long long)mem->base);
		return;
	}
	job->mem = *mem;
	job->mem.release = NULL;
	memset(mem, 0, sizeof(*mem));
	mem->export_fd = -1;
	if (x->stopped) {
		/* Shutdown, after the thread's last copy: nothing is in flight. */
		gpu_mem_free(&job->mem);
		free(job);
		return;
	}
	pthread_mutex_lock(&x->lock);
	fifo_push(&x->pending, &job->link);
	pthread_cond_signal(&x->more);
	pthread_mutex_unlock(&x->lock);
}

void xfer_stop(struct xfer *x)
{
	pthread_mutex_lock(&x->lock);
	x->stop = true;
	pthread_cond_signal(&x->more);
	pthread_mutex_unlock(&x->lock);
	pthread_join(x->thread, NULL);
	x->stopped = true;
	handback_drain(&x->back);
	while (x->nidle)
		gpu_event_destroy(x->idle[--x->nidle]);
	free(x->idle);
	gpu_stream_destroy(x->stream);
	gpu_mem_free(&x->stage);
	/* x stays allocated: sessions freed later in this shutdown (their
	 * connections close after this) still give their device memory
	 * back, which now runs inline.  xfer_free releases it after the loop. */
	handback_close(&x->back, NULL);
}

void xfer_free(struct xfer *x)
{
	if (!x)
		return;
	pthread_mutex_destroy(&x->lock);
	pthread_cond_destroy(&x->more);
	free(x);
}
