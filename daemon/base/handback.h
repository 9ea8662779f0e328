/*
 * handback.h — results going back from worker threads to the loop thread.
 *
 * A mutex-protected FIFO plus one uv_async: a worker pushes an item and
 * wakes the loop; the async callback takes the whole queue at once and
 * delivers every item, oldest first, on the loop thread (libuv's
 * threadpool pattern).  uv_async_send coalesces, so one wake-up may deliver
 * many items.  The reader threads (reader.h) and each GPU's transfer thread
 * (xfer.h) hand their finished jobs back through one each.
 *
 * DESIGN: handback_push from any thread; init, drain and close on the loop
 * thread.  hb->lock guards the FIFO and nothing else, so a worker never
 * holds its own module's lock while it hands a job back.
 */
#ifndef PF_HANDBACK_H
#define PF_HANDBACK_H

#include <pthread.h>
#include <uv.h>

#include "util.h"

struct handback;

typedef void (*handback_fn)(struct fifo_node *item, void *arg);

struct handback {
	pthread_mutex_t lock;
	struct fifo q; /* under lock: pushed, not yet delivered */
	uv_async_t async;
	handback_fn deliver; /* loop thread, once per item */
	void *arg;
	void (*closed)(struct handback *hb); /* after handback_close */
};

/* 0 or a libuv error (the handle could not be made; nothing to close). */
int handback_init(struct handback *hb, uv_loop_t *loop, handback_fn deliver, void *arg);
/* Any thread: queues item and wakes the loop.  Never fails. */
void handback_push(struct handback *hb, struct fifo_node *item);
/* Loop thread: delivers everything queued now (the async callback; owners
 * also call it when their threads are gone, to finish what they did). */
void handback_drain(struct handback *hb);
/* Loop thread: closes the async handle; closed(hb), when not NULL, runs
 * once libuv has let go of it (hb may be freed there).  The lock is
 * destroyed now: nothing may push after this. */
void handback_close(struct handback *hb, void (*closed)(struct handback *hb));

#endif
