/*
 * handback.c — the worker -> loop queue (see handback.h).
 *
 * DESIGN: hb->lock is held only to push or to take the whole queue, never
 * while an item is delivered, so a delivery may submit new work to the
 * thread that pushes here without any lock order to keep.
 */
#include "base/handback.h"

static void drain_cb(uv_async_t *async)
{
	handback_drain(async->data);
}

int handback_init(struct handback *hb, uv_loop_t *loop, handback_fn deliver, void *arg)
{
	int rc;

	hb->q.head = hb->q.tail = NULL;
	hb->deliver = deliver;
	hb->arg = arg;
	hb->closed = NULL;
	rc = uv_async_init(loop, &hb->async, drain_cb);
	if (rc)
		return rc;
	hb->async.data = hb;
	pthread_mutex_init(&hb->lock, NULL);
	return 0;
}

void handback_push(struct handback *hb, struct fifo_node *item)
{
	pthread_mutex_lock(&hb->lock);
	fifo_push(&hb->q, item);
	pthread_mutex_unlock(&hb->lock);
	uv_async_send(&hb->async);
}

void handback_drain(struct handback *hb)
{
	struct fifo_node *n;

	pthread_mutex_lock(&hb->lock);
	n = fifo_take_all(&hb->q);
	pthread_mutex_unlock(&hb->lock);
	while (n) {
		struct fifo_node *next = n->next;

		hb->deliver(n, hb->arg);
		n = next;
	}
}

static void close_cb(uv_handle_t *h)
{
	struct handback *hb = h->data;

	if (hb->closed)
		hb->closed(hb);
}

void handback_close(struct handback *hb, void (*closed)(struct handback *hb))
{
	pthread_mutex_destroy(&hb->lock);
	hb->closed = closed;
	uv_close((uv_handle_t *)&hb->async, close_cb);
}
