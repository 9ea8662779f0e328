/*
 * reader.h — the shared pool of reader threads.
 *
 * A reader job gathers `count` samples of every field of a dataset into one
 * slot's memory (fields at their offsets, samples packed), starting at
 * sample `first` of the slot: a large batch is split into parts that
 * several readers fill at once.  Jobs run in
 * submission order on any of N threads, so they may finish out of order;
 * the session delivers in order.  Finished jobs go back to the loop thread
 * through a handback (handback.h).
 *
 * DESIGN: threads: the loop thread submits and receives; reader threads
 * only read files and write slot memory.  Locks: r->lock guards the pending
 * queue and the stop flag; the handback has its own.  Nothing else is
 * shared.  No CUDA here.
 */
#ifndef PF_READER_H
#define PF_READER_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "util.h"

struct dataset;

struct reader_job {
	struct fifo_node link;	  /* of whichever queue holds the job */
	void *owner;		  /* borrowed: the session; it outlives its jobs */
	const struct dataset *ds; /* borrowed: datasets live as long as the daemon */
	uint64_t *samples;	  /* borrowed (the slot's): count sample numbers */
	uint32_t count;
	uint64_t wrap;		      /* nonzero: samples are picks, taken mod wrap first */
	uint32_t first;		      /* index of samples[0] within the slot's batch */
	uint8_t *dst;		      /* borrowed: the slot, valid while owner lives */
	bool dma;		      /* DS_FOR_DMA: streamed (ds_read_field_for) */
	const uint64_t *field_offset; /* borrowed: owner's per-field offsets */
	uint32_t slot;
	uint64_t epoch, seq;
	int rc; /* 0, or -errno with err set; -ESTALE: a file of ds changed on disk */
	char err[256];
	uint64_t read_ns; /* time the reads took */
	/* A block-shuffled direct epoch's block cache (blocks.h), or NULL:
	 * a reference the owner took for the job and puts when it is back. */
	struct blocks *blocks;
};

/* The reader threads, shared by every session. */
struct readers;

typedef void (*reader_done_fn)(struct reader_job *job, void *arg);

/* Starts nthreads readers.  done runs on the loop thread for every job. */
int reader_start(struct readers **out, unsigned nthreads, uv_loop_t *loop, reader_done_fn done,
		 void *arg);
void reader_submit(struct readers *r, struct reader_job *job);
/* Stops and joins the threads.  Jobs not yet run finish with -ECANCELED;
 * done is called for every outstanding job before this returns. */
void reader_stop(struct readers *r);
/* Jobs waiting for a thread (for status). */
unsigned reader_queued(struct readers *r);

/* Runs one job on the calling thread (the readers' body; tests use it). */
void reader_run_job(struct reader_job *job);

#endif
