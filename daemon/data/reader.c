/*
 * reader.c — the reader thread pool (see reader.h).
 *
 * DESIGN: owner threads: N reader threads plus the loop thread.  r->lock
 * guards the pending queue and the stop flag; the readers sleep on `more`
 * when nothing is pending.  Finished jobs go back through the handback,
 * whose lock a reader takes without holding r->lock.  Readers never touch sessions:
 * a job carries everything it needs, borrowed from owners that outlive it.
 */
#include "data/reader.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>
#include <time.h>

#include "data/blocks.h"
#include "data/dataset.h"
#include "base/handback.h"
#include "base/log.h"
#include "util.h"

/* The readers' nice value: below the threads that feed the GPU. */
#define READER_NICE 5

struct readers {
	pthread_mutex_t lock;
	pthread_cond_t more;
	struct fifo pending; /* under lock */
	unsigned npending;
	bool stop;
	struct handback back; /* finished jobs, to the loop thread */
	reader_done_fn done;
	void *arg;
	pthread_t *threads;
	unsigned nthreads;
};

void reader_run_job(struct reader_job *job)
{
	const struct dataset *ds = job->ds;
	uint64_t t0 = now_ns();

	job->rc = 0;
	job->err[0] = '\0';
	if (job->wrap) {
		for (uint32_t k = 0; k < job->count; k++)
			job->samples[k] %= job->wrap;
		job->wrap = 0;
	}
	if (job->blocks)
		job->rc = blocks_read(job->blocks, job->samples, job->count, job->dst,
				      job->field_offset, job->first, job->err, sizeof(job->err));
	for (size_t f = 0; !job->blocks && f < ds->nfields && job->rc == 0; f++)
		job->rc = ds_read_field_for(
			ds, f, job->samples, job->count,
			job->dst + job->field_offset[f] +
				(uint64_t)job->first * ds->fields[f].sample_bytes,
			job->dma ? DS_FOR_DMA : DS_FOR_CPU, job->err, sizeof(job->err));
	/* A read that failed (a file cut short, say) may be a file changed on
	 * disk: then that is what the batch says, -ESTALE, and its sessions
	 * end their epochs (sess_job_done tells the dataset, on the loop
	 * thread).  Checked here, off the loop, and only after a failure:
	 * it costs a stat, an fstat and a header read per file. */
	if (job->rc && job->rc != -ERANGE && ds_files_changed(ds, job->err, sizeof(job->err)))
		job->rc = -ESTALE;
	job->read_ns = now_ns() - t0;
}

static void *reader_main(void *arg)
{
	struct readers *r = arg;

	/* Below the trainer, the loop and the transfer threads: on a node
	 * whose CPUs the readers can fill, a batch read a little later costs
	 * nothing while the trainer's thread or the copy that feeds its GPU
	 * waiting for a CPU costs its step.  Per thread on Linux: PRIO_PROCESS
	 * with a thread id. */
	setpriority(PRIO_PROCESS, (id_t)gettid(), READER_NICE);
	pthread_mutex_lock(&r->lock);
	for (;;) {
		struct fifo_node *n;

		while (!r->pending.head && !r->stop)
			pthread_cond_wait(&r->more, &r->lock);
		if (r->stop)
			break;
		n = fifo_pop(&r->pending);
		r->npending--;
		pthread_mutex_unlock(&r->lock);

		reader_run_job(container_of(n, struct reader_job, link));
		handback_push(&r->back, n);

		pthread_mutex_lock(&r->lock);
	}
	pthread_mutex_unlock(&r->lock);
	return NULL;
}

static void deliver(struct fifo_node *n, void *arg)
{
	struct readers *r = arg;

	r->done(container_of(n, struct reader_job, link), r->arg);
}

int reader_start(struct readers **out, unsigned nthreads, uv_loop_t *loop, reader_done_fn done,
		 void *arg)
{
	struct readers *r = calloc(1, sizeof(*r));
	int rc;

	if (!r)
		return -ENOMEM;
	r->threads = calloc(nthreads, sizeof(*r->threads));
	if (!r->threads) {
		free(r);
		return -ENOMEM;
	}
	r->done = done;
	r->arg = arg;
	rc = handback_init(&r->back, loop, deliver, r);
	if (rc) {
		free(r->threads);
		free(r);
		return rc;
	}
	pthread_mutex_init(&r->lock, NULL);
	pthread_cond_init(&r->more, NULL);
	for (unsigned i = 0; i < nthreads; i++) {
		rc = pthread_create(&r->threads[i], NULL, reader_main, r);
		if (rc) {
			log_err("cannot start reader thread %u: %s", i, strerror(rc));
			break;
		}
		r->nthreads++;
	}
	if (!r->nthreads) {
		reader_stop(r);
		return -rc;
	}
	*out = r;
	return 0;
}

void reader_submit(struct readers *r, struct reader_job *job)
{
	pthread_mutex_lock(&r->lock);
	fifo_push(&r->pending, &job->link);
	r->npending++;
	pthread_cond_signal(&r->more);
	pthread_mutex_unlock(&r->lock);
}

unsigned reader_queued(struct readers *r)
{
	unsigned n;

	pthread_mutex_lock(&r->lock);
	n = r->npending;
	pthread_mutex_unlock(&r->lock);
	return n;
}

static void free_readers(struct handback *hb)
{
	struct readers *r = container_of(hb, struct readers, back);

	free(r->threads);
	free(r);
}

void reader_stop(struct readers *r)
{
	struct fifo_node *n;

	pthread_mutex_lock(&r->lock);
	r->stop = true;
	pthread_cond_broadcast(&r->more);
	pthread_mutex_unlock(&r->lock);
	for (unsigned i = 0; i < r->nthreads; i++)
		pthread_join(r->threads[i], NULL);

	/* Threads are gone: finish what they did, then cancel the rest, so
	 * every owner sees each of its jobs come back exactly once. */
	handback_drain(&r->back);
	n = fifo_take_all(&r->pending);
	while (n) {
		struct fifo_node *next = n->next;
		struct reader_job *job = container_of(n, struct reader_job, link);

		job->rc = -ECANCELED;
		snprintf(job->err, sizeof(job->err), "daemon shutting down");
		r->done(job, r->arg);
		n = next;
	}
	pthread_mutex_destroy(&r->lock);
	pthread_cond_destroy(&r->more);
	handback_close(&r->back, free_readers);
}
