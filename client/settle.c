/*
 * settle.c — libprefetch's release lanes: threads that wait, blocked, for
 * the GPU work each release of a CUDA batch is queued behind, and send the
 * slot's Release to the daemon the moment that work has retired.
 *
 * Why threads: a trainer that launches its steps eagerly keeps its CPU
 * queueing kernels ahead of the GPU.  A release recorded on its stream
 * retires only when the GPU gets there, often several steps after the call
 * that queued it.  Settled in the trainer's own calls, a release would wait
 * for a later call, and a pf_next that needed the slot back would have to
 * poll the event, throwing away the CPU's run-ahead (issue 33).  Here the
 * trainer's thread only records the event and queues the release; a lane
 * blocks in cuEventSynchronize (the events are made with
 * CU_EVENT_BLOCKING_SYNC: no spinning), and sends the Release itself, so
 * the daemon can fill the slot again while the trainer is busy elsewhere.
 *
 * Lanes: lane 0 settles the work of the library's own stream (a client
 * copy's slot goes back once its copy is done; a batch dropped untaken once
 * its gather is), lanes 1.. the trainer's streams, one per stream handle
 * seen (the last one shared by any more).  Events of one stream retire in
 * order, so waiting for one lane's releases in order loses nothing; a
 * release on another stream never waits behind them.  A lane's thread
 * starts with its first release and sleeps on its condition when idle.
 *
 * What goes back to the trainer's thread: every settled release, on the
 * done list, which pfc_settle_collect disposes of in the trainer's next
 * call (events back to the idle list, a client copy's device buffer back
 * to the free stack).  A release of a client copy's buffer also writes the
 * wake eventfd, which pf_next polls beside the socket while it waits for a
 * free buffer.
 *
 * A lane sends with base.c's raw write (pfc_send_for_gen), never through
 * the owner's corked frames, so this file calls only base.c (and the
 * CUDA side) and sits below the connection (conn.c), whose waits collect
 * what it settled.
 *
 * DESIGN: the lanes' threads own nothing but their position in the lane.
 * struct pfc_settle's lock guards the lanes, the done list and the
 * counters; pf_client.send_lock guards the socket's writes (base.c,
 * conn.c) and its replacement, and a lane sends only a release of the
 * connection it came on (pfc_release.gen), which it checks under that
 * lock.  Lock order: settle lock, then send lock; a lane never holds the
 * settle lock while it waits for the GPU or sends.
 */
#include "client_int.h"
#include "pfcuda.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

/* Lane 0 (the library's stream) and trainer streams 1..PFC_LANES-1. */
#define PFC_LANES 5

struct pfc_lane {
	struct pf_client *c; /* borrowed: the owner */
	const void *stream;  /* the trainer's stream handle (lanes 1..), NULL while unused */
	struct pfc_release *head, **tail; /* waiting, oldest first; head is being waited on */
	pthread_cond_t work;		  /* a release queued, or stop */
	pthread_t thread;
	bool started;
};

struct pfc_settle {
	pthread_mutex_t lock;
	pthread_cond_t drained; /* pending reached 0 */
	struct pfc_lane lanes[PFC_LANES];
	struct pfc_release *done, **done_tail; /* settled, for pfc_settle_collect */
	uint32_t pending;		       /* queued on a lane, not settled */
	uint32_t ndone;			       /* on the done list (read unlocked: a hint) */
	bool stop;
	int wake_fd; /* eventfd; -1 if none could be made */
};

static void lane_send_release(struct pf_client *c, const struct pfc_release *r, uint64_t gen)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__Release msg = PF__RELEASE__INIT;

	msg.epoch = r->epoch;
	msg.seq = r->seq;
	msg.slot = r->slot;
	env.msg_case = PF__ENVELOPE__MSG_RELEASE;
	env.release = &msg;
	pfc_send_for_gen(c, &env, gen, r->slot);
}

static void *lane_main(void *arg)
{
	struct pfc_lane *l = arg;
	struct pf_client *c = l->c;
	struct pfc_settle *s = c->settle;

	pthread_mutex_lock(&s->lock);
	for (;;) {
		struct pfc_release *r;
		uint64_t one = 1, gen;

		while (!l->head && !s->stop)
			pthread_cond_wait(&l->work, &s->lock);
		if (!l->head)
			break; /* stopping, and nothing left to wait for */
		r = l->head;
		pthread_mutex_unlock(&s->lock);
		/* Blocks until the GPU has run the work recorded before the
		 * event; a failure (a faulted context) settles it too: the
		 * batch is unusable either way, and the daemon must have its
		 * slot back. */
		pfcuda_event_sync(c->cuda, ((struct pfc_event *)r->event)->ev, NULL, 0);
		/* gen is read under the lock: pfc_settle_forget may clear it
		 * while we waited. */
		pthread_mutex_lock(&s->lock);
		gen = r->gen;
		pthread_mutex_unlock(&s->lock);
		if (r->dbuf < 0 && gen)
			lane_send_release(c, r, gen);
		if (c->timing) {
			__atomic_add_fetch(&c->counts.settled, 1, __ATOMIC_RELAXED);
			__atomic_add_fetch(&c->counts.settle_ns, (uint64_t)(mono() - r->queued_ns),
					   __ATOMIC_RELAXED);
		}
		pthread_mutex_lock(&s->lock);
		l->head = r->next;
		if (!l->head)
			l->tail = &l->head;
		r->next = NULL;
		*s->done_tail = r;
		s->done_tail = &r->next;
		__atomic_add_fetch(&s->ndone, 1, __ATOMIC_RELEASE);
		if (--s->pending == 0)
			pthread_cond_broadcast(&s->drained);
		/* A client copy's buffer is what a waiting pf_next may need. */
		if (r->dbuf >= 0 && s->wake_fd >= 0 && write(s->wake_fd, &one, sizeof(one)) < 0) {
			/* The counter cannot overflow at one a release. */
		}
	}
	pthread_mutex_unlock(&s->lock);
	return NULL;
}

static int settle_open(struct pf_client *c)
{
	struct pfc_settle *s;

	if (c->settle)
		return 0;
	s = calloc(1, sizeof(*s));
	if (!s)
		return pfc_set_err(c, -ENOMEM, "out of memory");
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->drained, NULL);
	s->done_tail = &s->done;
	for (int i = 0; i < PFC_LANES; i++) {
		s->lanes[i].c = c;
		s->lanes[i].tail = &s->lanes[i].head;
		pthread_cond_init(&s->lanes[i].work, NULL);
	}
	/* Without it a waiting pf_next still learns of a freed buffer, a
	 * poll slice later (pfc_settle_fd returns -1). */
	s->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	c->settle = s;
	return 0;
}

/* The lane for releases recorded on stream (settle lock held). */
static struct pfc_lane *lane_for(struct pf_client *c, const void *stream)
{
	struct pfc_settle *s = c->settle;
	int i;

	if (stream == (const void *)c->gather)
		return &s->lanes[0];
	for (i = 1; i < PFC_LANES; i++)
		if (s->lanes[i].started && s->lanes[i].stream == stream)
			return &s->lanes[i];
	for (i = 1; i < PFC_LANES; i++)
		if (!s->lanes[i].started) {
			s->lanes[i].stream = stream;
			return &s->lanes[i];
		}
	return &s->lanes[PFC_LANES - 1];
}

int pfc_settle_queue(struct pf_client *c, struct pfc_release *r)
{
	struct pfc_settle *s;
	struct pfc_lane *l;
	int rc;

	if (!c->settle && (rc = settle_open(c)) != 0)
		return rc;
	s = c->settle;
	r->next = NULL;
	r->queued_ns = PFC_T0(c);
	pthread_mutex_lock(&s->lock);
	l = lane_for(c, r->stream);
	if (!l->started) {
		rc = pthread_create(&l->thread, NULL, lane_main, l);
		if (rc) {
			if (l != &s->lanes[0])
				l->stream = NULL;
			pthread_mutex_unlock(&s->lock);
			return pfc_set_err(c, -rc, "cannot start a release thread: %s",
					   strerror(rc));
		}
		l->started = true;
	}
	*l->tail = r;
	l->tail = &r->next;
	s->pending++;
	pthread_cond_signal(&l->work);
	pthread_mutex_unlock(&s->lock);
	c->nreleases++;
	return 0;
}

void pfc_release_dispose(struct pf_client *c, struct pfc_release *r)
{
	if (r->dbuf >= 0 && c->dbuf_free)
		c->dbuf_free[c->ndbuf_free++] = (uint32_t)r->dbuf;
	if (r->free_event)
		r->free_event(r->event);
	free(r);
}

/* Disposes of every settled release: device buffers back to the free
 * stack, events back to the idle list.  Trainer's thread only. */
void pfc_settle_collect(struct pf_client *c)
{
	struct pfc_settle *s = c->settle;
	struct pfc_release *r;

	if (!s || !__atomic_load_n(&s->ndone, __ATOMIC_ACQUIRE))
		return;
	pthread_mutex_lock(&s->lock);
	r = s->done;
	s->done = NULL;
	s->done_tail = &s->done;
	__atomic_store_n(&s->ndone, 0, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&s->lock);
	while (r) {
		struct pfc_release *next = r->next;

		c->nreleases--;
		pfc_release_dispose(c, r);
		r = next;
	}
}

void pfc_settle_woken(struct pf_client *c)
{
	uint64_t n;

	/* Read before the list is taken: a buffer given back after this
	 * read writes the eventfd again, so a later poll cannot miss it. */
	if (c->settle && c->settle->wake_fd >= 0 && read(c->settle->wake_fd, &n, sizeof(n)) < 0) {
		/* EAGAIN: nothing was written since the last read. */
	}
	pfc_settle_collect(c);
}

int pfc_settle_fd(const struct pf_client *c)
{
	return c->settle ? c->settle->wake_fd : -1;
}

/* Waits, blocked, up to wait_ms (< 0: no limit) for every queued release
 * to settle; then collects.  0, or -ETIMEDOUT with some still waiting for
 * the GPU. */
int pfc_settle_drain(struct pf_client *c, int wait_ms)
{
	struct pfc_settle *s = c->settle;
	struct timespec until;
	int rc = 0;

	if (!s)
		return 0;
	if (wait_ms >= 0) {
		clock_gettime(CLOCK_MONOTONIC, &until);
		until.tv_sec += wait_ms / 1000;
		until.tv_nsec += (long)(wait_ms % 1000) * 1000000L;
		if (until.tv_nsec >= 1000000000L) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000L;
		}
	}
	pthread_mutex_lock(&s->lock);
	while (s->pending && rc == 0)
		rc = wait_ms < 0 ? pthread_cond_wait(&s->drained, &s->lock)
				 : pthread_cond_clockwait(&s->drained, &s->lock, CLOCK_MONOTONIC,
							  &until);
	rc = s->pending ? -ETIMEDOUT : 0;
	pthread_mutex_unlock(&s->lock);
	pfc_settle_collect(c);
	return rc;
}

/* The releases still waiting are not sent (the connection is going): each
 * settles without a Release.  A client copy's buffer still comes back. */
void pfc_settle_forget(struct pf_client *c)
{
	struct pfc_settle *s = c->settle;

	if (!s)
		return;
	pthread_mutex_lock(&s->lock);
	for (int i = 0; i < PFC_LANES; i++)
		for (struct pfc_release *r = s->lanes[i].head; r; r = r->next)
			r->gen = 0;
	pthread_mutex_unlock(&s->lock);
}

/* pf_close: waits for every lane to settle what it holds (the caller has
 * synchronised the device, so that is at once), stops the threads and
 * collects.  The struct goes too. */
void pfc_settle_close(struct pf_client *c)
{
	struct pfc_settle *s = c->settle;

	if (!s)
		return;
	pthread_mutex_lock(&s->lock);
	s->stop = true;
	for (int i = 0; i < PFC_LANES; i++)
		pthread_cond_signal(&s->lanes[i].work);
	pthread_mutex_unlock(&s->lock);
	for (int i = 0; i < PFC_LANES; i++)
		if (s->lanes[i].started)
			pthread_join(s->lanes[i].thread, NULL);
	pfc_settle_collect(c);
	for (int i = 0; i < PFC_LANES; i++)
		pthread_cond_destroy(&s->lanes[i].work);
	pthread_cond_destroy(&s->drained);
	pthread_mutex_destroy(&s->lock);
	if (s->wake_fd >= 0)
		close(s->wake_fd);
	free(s);
	c->settle = NULL;
}
