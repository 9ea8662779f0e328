/*
 * reader.c — the reader thread pool (see reader.h).
 *
 * DESIGN: owner threads: N reader threads plus the loop thread.  One mutex
 * guards the pending queue, the done queue and the stop flag; the readers
 * sleep on `more` when nothing is pending.  Readers never touch sessions:
 * a job carries everything it needs, borrowed from owners that outlive it.
 */
#include "reader.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dataset.h"
#include "log.h"
#include "util.h"

struct reader_pool {
	pthread_mutex_t lock;
	pthread_cond_t more;
	struct reader_job *pending_head, *pending_tail; /* FIFO, under lock */
	struct reader_job *done_head, *done_tail;	/* FIFO, under lock */
	unsigned npending;
	bool stop;
	uv_async_t async; /* wakes the loop to drain done */
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
	for (size_t f = 0; f < ds->nfields && job->rc == 0; f++)
		job->rc = ds_read_field(ds, f, job->samples, job->count,
					job->dst + job->field_offset[f] +
						(uint64_t)job->first * ds->fields[f].sample_bytes,
					job->err, sizeof(job->err));
	job->read_ns = now_ns() - t0;
}

static void push(struct reader_job **head, struct reader_job **tail, struct reader_job *job)
{
	job->next = NULL;
	if (*tail)
		(*tail)->next = job;
	else
		*head = job;
	*tail = job;
}

static void *reader_main(void *arg)
{
	struct reader_pool *p = arg;

	pthread_mutex_lock(&p->lock);
	for (;;) {
		struct reader_job *job;

		while (!p->pending_head && !p->stop)
			pthread_cond_wait(&p->more, &p->lock);
		if (p->stop)
			break;
		job = p->pending_head;
		p->pending_head = job->next;
		if (!p->pending_head)
			p->pending_tail = NULL;
		p->npending--;
		pthread_mutex_unlock(&p->lock);

		reader_run_job(job);

		pthread_mutex_lock(&p->lock);
		push(&p->done_head, &p->done_tail, job);
		/* uv_async_send coalesces: one wake-up drains everything. */
		uv_async_send(&p->async);
	}
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

static void drain_done(uv_async_t *async)
{
	struct reader_pool *p = async->data;
	struct reader_job *job;

	pthread_mutex_lock(&p->lock);
	job = p->done_head;
	p->done_head = p->done_tail = NULL;
	pthread_mutex_unlock(&p->lock);
	while (job) {
		struct reader_job *next = job->next;

		p->done(job, p->arg);
		job = next;
	}
}

int reader_pool_start(struct reader_pool **out, unsigned nthreads, uv_loop_t *loop,
		      reader_done_fn done, void *arg)
{
	struct reader_pool *p = calloc(1, sizeof(*p));
	int rc;

	if (!p)
		return -ENOMEM;
	p->threads = calloc(nthreads, sizeof(*p->threads));
	if (!p->threads) {
		free(p);
		return -ENOMEM;
	}
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->more, NULL);
	p->done = done;
	p->arg = arg;
	rc = uv_async_init(loop, &p->async, drain_done);
	if (rc) {
		free(p->threads);
		free(p);
		return rc;
	}
	p->async.data = p;
	for (unsigned i = 0; i < nthreads; i++) {
		rc = pthread_create(&p->threads[i], NULL, reader_main, p);
		if (rc) {
			log_err("cannot start reader thread %u: %s", i, strerror(rc));
			break;
		}
		p->nthreads++;
	}
	if (!p->nthreads) {
		reader_pool_stop(p);
		return -rc;
	}
	*out = p;
	return 0;
}

void reader_submit(struct reader_pool *p, struct reader_job *job)
{
	pthread_mutex_lock(&p->lock);
	push(&p->pending_head, &p->pending_tail, job);
	p->npending++;
	pthread_cond_signal(&p->more);
	pthread_mutex_unlock(&p->lock);
}

unsigned reader_pool_queued(struct reader_pool *p)
{
	unsigned n;

	pthread_mutex_lock(&p->lock);
	n = p->npending;
	pthread_mutex_unlock(&p->lock);
	return n;
}

static void free_pool(uv_handle_t *h)
{
	struct reader_pool *p = h->data;

	free(p->threads);
	free(p);
}

void reader_pool_stop(struct reader_pool *p)
{
	struct reader_job *job;

	pthread_mutex_lock(&p->lock);
	p->stop = true;
	pthread_cond_broadcast(&p->more);
	pthread_mutex_unlock(&p->lock);
	for (unsigned i = 0; i < p->nthreads; i++)
		pthread_join(p->threads[i], NULL);

	/* Threads are gone: finish what they did, then cancel the rest, so
	 * every owner sees each of its jobs come back exactly once. */
	drain_done(&p->async);
	job = p->pending_head;
	p->pending_head = p->pending_tail = NULL;
	while (job) {
		struct reader_job *next = job->next;

		job->rc = -ECANCELED;
		snprintf(job->err, sizeof(job->err), "daemon shutting down");
		p->done(job, p->arg);
		job = next;
	}
	pthread_mutex_destroy(&p->lock);
	pthread_cond_destroy(&p->more);
	uv_close((uv_handle_t *)&p->async, free_pool);
}
