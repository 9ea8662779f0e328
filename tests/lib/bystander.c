/*
 * bystander.c — an innocent trainer beside an attack (testutil.h): while a
 * test abuses the daemon, one thread runs shuffled host epochs of a
 * dataset through libprefetch and checks every row of every batch, and
 * another asks for status every STATUS_EVERY_MS over a connection of its
 * own, timing each answer.  What one client does must not reach the others: the
 * epochs stay byte-exact and status answers in time.
 *
 * DESIGN: two threads of their own, each with its own pf_client (a client
 * is used by one thread at a time); they share only the report, under
 * b->lock, and the stop flag.  Nothing here calls cmocka: the test asserts
 * on the report in its own thread.
 */
#include "testutil.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client_int.h"
#include "prefetch.h"

#define STATUS_EVERY_MS 20

struct td_bystander {
	char sock[320];
	char dataset[64];
	uint32_t batch;
	uint64_t row_bytes, seed;
	pthread_t trainer, watcher;
	pthread_mutex_t lock;
	atomic_int stop;	      /* set by the test's thread, read by both of ours */
	atomic_int ready;	      /* threads connected (the trainer: its session open) */
	bool status_judged;	      /* the test's thread's */
	struct td_bystander_report r; /* under lock */
};

static void fail(struct td_bystander *b, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void fail(struct td_bystander *b, const char *fmt, ...)
{
	va_list ap;

	pthread_mutex_lock(&b->lock);
	if (!b->r.error[0]) {
		va_start(ap, fmt);
		vsnprintf(b->r.error, sizeof(b->r.error), fmt, ap);
		va_end(ap);
	}
	pthread_mutex_unlock(&b->lock);
}

/* One shuffled epoch, every row checked, every sample once.  0, 1 when
 * stopped part-way, -1 on a failure (reported). */
static int one_epoch(struct td_bystander *b, struct pf_client *c, uint64_t epoch, uint8_t *seen,
		     uint64_t n)
{
	struct pf_epoch_opts eo = {.order = PF_ORDER_SHUFFLE, .seed = epoch};
	struct pf_batch *batch;
	uint64_t got = 0;
	int rc;

	memset(seen, 0, n);
	rc = pf_start_epoch(c, &eo, NULL);
	if (rc) {
		fail(b, "epoch %llu: pf_start_epoch: %d %s", (unsigned long long)epoch, rc,
		     pf_errmsg(c));
		return -1;
	}
	for (;;) {
		rc = pf_next(c, 10000, &batch);
		if (rc) {
			fail(b, "epoch %llu: pf_next: %d %s", (unsigned long long)epoch, rc,
			     pf_errmsg(c));
			return -1;
		}
		if (!batch)
			break;
		for (uint32_t i = 0; i < batch->count; i++) {
			uint64_t s = batch->picks[i];
			const uint8_t *row = (const uint8_t *)batch->data[0] + i * b->row_bytes;

			if (s >= n || seen[s]++) {
				fail(b, "epoch %llu: sample %llu delivered twice or out of range",
				     (unsigned long long)epoch, (unsigned long long)s);
				pf_release(c, batch, NULL);
				return -1;
			}
			if (!td_row_ok(row, b->row_bytes, b->seed, s)) {
				fail(b, "epoch %llu: sample %llu holds the wrong bytes",
				     (unsigned long long)epoch, (unsigned long long)s);
				pf_release(c, batch, NULL);
				return -1;
			}
		}
		got += batch->count;
		pthread_mutex_lock(&b->lock);
		b->r.batches++;
		pthread_mutex_unlock(&b->lock);
		pf_release(c, batch, NULL);
		if (b->stop)
			return 1;
	}
	if (got != n) {
		fail(b, "epoch %llu: %llu samples of %llu", (unsigned long long)epoch,
		     (unsigned long long)got, (unsigned long long)n);
		return -1;
	}
	return 0;
}

static void *trainer(void *arg)
{
	struct td_bystander *b = arg;
	struct pf_open_opts oo = {
		.dataset = b->dataset, .batch_size = b->batch, .name = "bystander"};
	struct pf_client *c = NULL;
	uint8_t *seen = NULL;
	uint64_t n;
	int rc;

	rc = pf_connect(b->sock, &c);
	if (!rc)
		rc = pf_open(c, &oo);
	if (rc) {
		fail(b, "open: %d %s", rc, pf_errmsg(c));
		goto out;
	}
	b->ready++;
	n = pf_num_samples(c);
	seen = malloc(n ? n : 1);
	if (!seen) {
		fail(b, "out of memory");
		goto out;
	}
	for (uint64_t e = 1; !b->stop; e++) {
		rc = one_epoch(b, c, e, seen, n);
		if (rc < 0)
			break;
		if (rc == 0) {
			pthread_mutex_lock(&b->lock);
			b->r.epochs++;
			pthread_mutex_unlock(&b->lock);
		}
	}
out:
	free(seen);
	pf_close(c);
	return NULL;
}

/* Status over a connection of its own, opened before the attack: what is
 * timed is the daemon's loop answering, which no client may hold up, even
 * one that leaves the daemon no descriptor for a new connection. */
static void *watcher(void *arg)
{
	struct td_bystander *b = arg;
	struct pf_client *c = NULL;
	int rc = pf_connect(b->sock, &c);

	if (rc) {
		fail(b, "status connection: %d %s", rc, pf_errmsg(c));
		pf_close(c);
		return NULL;
	}
	b->ready++;
	while (!b->stop) {
		Pf__Envelope req = PF__ENVELOPE__INIT, *reply = NULL;
		Pf__StatusRequest st = PF__STATUS_REQUEST__INIT;
		double t0 = td_now(), ms;

		req.msg_case = PF__ENVELOPE__MSG_STATUS;
		req.status = &st;
		rc = pfc_call(c, &req, PF__ENVELOPE__MSG_STATUS_REPLY, &reply);
		ms = (td_now() - t0) * 1e3;
		if (rc) {
			fail(b, "status did not answer (%d %s, after %.1f ms)", rc, pf_errmsg(c),
			     ms);
			break;
		}
		pf__envelope__free_unpacked(reply, NULL);
		pthread_mutex_lock(&b->lock);
		b->r.statuses++;
		if (ms > b->r.max_status_ms) {
			b->r.max_status_ms = ms;
			b->r.max_status_at = t0;
		}
		pthread_mutex_unlock(&b->lock);
		usleep(STATUS_EVERY_MS * 1000);
	}
	pf_close(c);
	return NULL;
}

void td_bystander_status_not_judged(struct td_bystander *b)
{
	b->status_judged = false;
}

struct td_bystander *td_bystander_start(const char *sock, const char *dataset, uint32_t batch,
					uint64_t row_bytes, uint64_t seed)
{
	struct td_bystander *b = calloc(1, sizeof(*b));

	if (!b)
		return NULL;
	snprintf(b->sock, sizeof(b->sock), "%s", sock);
	snprintf(b->dataset, sizeof(b->dataset), "%s", dataset);
	b->batch = batch;
	b->row_bytes = row_bytes;
	b->seed = seed;
	b->status_judged = true;
	pthread_mutex_init(&b->lock, NULL);
	if (pthread_create(&b->trainer, NULL, trainer, b) != 0) {
		free(b);
		return NULL;
	}
	if (pthread_create(&b->watcher, NULL, watcher, b) != 0) {
		b->stop = 1;
		pthread_join(b->trainer, NULL);
		free(b);
		return NULL;
	}
	/* Connected before the attack, so that its connections and session
	 * are not the ones an attack on the limits meets. */
	for (int i = 0; i < 1000 && b->ready < 2; i++) {
		pthread_mutex_lock(&b->lock);
		if (b->r.error[0])
			i = 1000;
		pthread_mutex_unlock(&b->lock);
		usleep(10000);
	}
	return b;
}

int td_bystander_stop(struct td_bystander *b, struct td_bystander_report *out)
{
	double until = td_now() + 20;
	int rc;

	/* At least one whole epoch after the start, so that the abuse had a
	 * victim to hurt. */
	for (;;) {
		bool done;

		pthread_mutex_lock(&b->lock);
		done = b->r.epochs > 0 || b->r.error[0];
		pthread_mutex_unlock(&b->lock);
		if (done || td_now() > until)
			break;
		usleep(10000);
	}
	b->stop = 1;
	pthread_join(b->trainer, NULL);
	pthread_join(b->watcher, NULL);
	*out = b->r;
	if (!out->error[0] && !out->epochs)
		snprintf(out->error, sizeof(out->error), "no whole epoch in 20 s (%llu batches)",
			 (unsigned long long)out->batches);
	if (!out->error[0] && b->status_judged && td_status_limit_ms() > 0 &&
	    out->max_status_ms > td_status_limit_ms())
		snprintf(out->error, sizeof(out->error),
			 "status took %.1f ms at worst (more than %.0f ms%s%s, asked at %.3f s of "
			 "CLOCK_MONOTONIC)",
			 out->max_status_ms, td_status_limit_ms(), td_sanitizer() ? " under " : "",
			 td_sanitizer() ? td_sanitizer() : "", out->max_status_at);
	rc = out->error[0] ? -1 : 0;
	pthread_mutex_destroy(&b->lock);
	free(b);
	return rc;
}
