/*
 * linger.c — probes and expiry for lingering VRAM pools (see linger.h).
 *
 * DESIGN: loop thread only; the readings come from the transfer threads as
 * XFER_MEMINFO jobs.  d->linger[gpu] is this file's, sized by ngpus.
 */
#include "sess/linger.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "conf/config.h"
#include "state/daemon.h"
#include "sess/gov.h"
#include "base/log.h"
#include "gpu/pool.h"
#include "util.h"
#include "gpu/xfer.h"

struct linger_gpu {
	bool probe_out;		/* an XFER_MEMINFO is on the transfer thread */
	uint64_t last_probe_ns; /* 0: never */
	bool failed;		/* the last probe failed (logged once) */
};

static uint64_t interval_ns(const struct daemon *d)
{
	return (uint64_t)(d->cfg.probe_interval * 1e9);
}

static bool lingers_on(const struct daemon *d, int gpu)
{
	for (const struct pool *p = d->pools.head; p; p = p->next)
		if (p->gpu == gpu && pool_lingering(p))
			return true;
	return false;
}

/* Lingering pools on gpu give back what free memory is short of the
 * reserve plus need. */
static void apply(struct daemon *d, int gpu, uint64_t free_bytes, uint64_t total_bytes,
		  uint64_t need, const char *who)
{
	uint64_t reserve = gov_reserve(total_bytes, d->cfg.reserve_frac, d->cfg.reserve_min);
	char why[160];

	if (free_bytes >= reserve + need || !lingers_on(d, gpu))
		return;
	if (need)
		snprintf(why, sizeof(why),
			 "%s: %.0f MiB free on cuda:%d, under the reserve of %.0f MiB plus "
			 "%.0f MiB for slots",
			 who, free_bytes / 1048576.0, gpu, reserve / 1048576.0, need / 1048576.0);
	else
		snprintf(why, sizeof(why),
			 "%s: %.0f MiB free on cuda:%d, under the reserve of %.0f MiB", who,
			 free_bytes / 1048576.0, gpu, reserve / 1048576.0);
	pool_linger_reclaim(&d->pools, gpu, reserve + need - free_bytes, why);
}

static void schedule(struct daemon *d);

static void probe_done(struct xfer_job *job)
{
	struct daemon *d = job->owner;
	int gpu = (int)job->slot;
	struct linger_gpu *lg = &d->linger[gpu];

	lg->probe_out = false;
	lg->last_probe_ns = now_ns();
	if (d->stopping) {
		free(job); /* the pools go with the daemon */
		return;
	}
	if (job->rc) {
		if (!lg->failed)
			log_warn("cuda:%d: cannot read free device memory for the lingering pools "
				 "(%d); they give everything back",
				 gpu, job->rc);
		lg->failed = true;
		/* Blind, a lingering pool might hold what a process needs. */
		pool_linger_reclaim(&d->pools, gpu, UINT64_MAX, "free device memory unknown");
	} else {
		lg->failed = false;
		apply(d, gpu, job->free_bytes, job->total_bytes, 0, "daemon's probe");
	}
	free(job);
	schedule(d);
}

static void probe(struct daemon *d, int gpu)
{
	struct linger_gpu *lg = &d->linger[gpu];
	struct xfer_job *job;

	if (lg->probe_out || !d->xfers[gpu])
		return;
	job = calloc(1, sizeof(*job));
	if (!job)
		return; /* the next tick tries again */
	job->kind = XFER_MEMINFO;
	job->owner = d;
	job->slot = (uint32_t)gpu;
	job->done = probe_done;
	lg->probe_out = true;
	xfer_submit(d->xfers[gpu], job);
}

static void on_timer(uv_timer_t *t)
{
	schedule(t->data);
}

/* Expires what is due, probes every GPU whose probe is due, and sets the
 * timer for the next of either (stopped when nothing lingers). */
static void schedule(struct daemon *d)
{
	uint64_t now = now_ns(), iv = interval_ns(d), wait_ns;
	double left = pool_linger_expire(&d->pools, now);

	if (left < 0) {
		uv_timer_stop(&d->linger_timer);
		return;
	}
	wait_ns = (uint64_t)(left * 1e9);
	for (int gpu = 0; gpu < d->ngpus; gpu++) {
		struct linger_gpu *lg = &d->linger[gpu];
		uint64_t due;

		if (!lingers_on(d, gpu))
			continue;
		due = lg->last_probe_ns + iv;
		if (!lg->last_probe_ns || due <= now + 1000000) {
			probe(d, gpu);
			due = now + iv;
		}
		if (due - now < wait_ns)
			wait_ns = due - now;
	}
	uv_timer_start(&d->linger_timer, on_timer, wait_ns / 1000000 + 1, 0);
}

int linger_init(struct daemon *d)
{
	uv_timer_init(d->loop, &d->linger_timer);
	d->linger_timer.data = d;
	if (d->ngpus > 0) {
		d->linger = calloc((size_t)d->ngpus, sizeof(*d->linger));
		if (!d->linger)
			return -ENOMEM;
	}
	return 0;
}

void linger_stop(struct daemon *d)
{
	uv_timer_stop(&d->linger_timer);
	uv_close((uv_handle_t *)&d->linger_timer, NULL);
}

void linger_kick(struct daemon *d, int gpu)
{
	if (gpu < 0 || gpu >= d->ngpus || !d->linger || d->stopping)
		return;
	if (lingers_on(d, gpu))
		probe(d, gpu);
	schedule(d);
}

void linger_trainer_probe(struct daemon *d, int gpu, uint64_t free_bytes, uint64_t total_bytes,
			  uint64_t need)
{
	if (gpu >= 0 && gpu < d->ngpus)
		apply(d, gpu, free_bytes, total_bytes, need, "a trainer's probe");
}

double linger_probe_age(const struct daemon *d, int gpu)
{
	if (gpu < 0 || gpu >= d->ngpus || !d->linger || !d->linger[gpu].last_probe_ns)
		return -1;
	return (now_ns() - d->linger[gpu].last_probe_ns) / 1e9;
}
