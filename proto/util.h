/*
 * util.h — the small machinery every part of prefetchd uses: the monotonic
 * clock, alignment, error text into a caller's buffer, and an intrusive
 * FIFO.  Shared, like wire.h, by the daemon, libprefetch and prefetchctl;
 * header-only, so that a tool linking one daemon file (pforder) needs
 * nothing more.
 *
 * DESIGN: no state, no locks.  A FIFO belongs to whoever holds the lock that
 * guards it (reader.c and xfer.c keep theirs under their own mutex).
 */
#ifndef PF_UTIL_H
#define PF_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

/* The address of the struct that holds member `m` at p. */
#define container_of(p, type, m) ((type *)((char *)(p)-offsetof(type, m)))

/* CLOCK_MONOTONIC in nanoseconds: durations, deadlines, figures for status. */
static inline uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* v rounded up to a multiple of a (a > 0; need not be a power of two). */
static inline uint64_t align_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) / a * a;
}

/* Writes a message into the caller's err buffer, as every function that
 * returns -errno "with err saying why" does.  NULL or 0 bytes: nothing. */
static inline void set_err(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static inline void set_err(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (!err || !errlen)
		return;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

/* Control characters (and DEL) in s become '?': a string from a client
 * stays one line in a log and shows as it is on a terminal. */
static inline void util_printable(char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || *s == 0x7f)
			*s = '?';
}

/* ---- intrusive FIFO ---------------------------------------------------------
 * An item embeds a struct fifo_node and is found again with container_of.
 * The queue never allocates, so pushing cannot fail. */

struct fifo_node {
	struct fifo_node *next;
};

struct fifo {
	struct fifo_node *head, *tail;
};

static inline void fifo_push(struct fifo *q, struct fifo_node *n)
{
	n->next = NULL;
	if (q->tail)
		q->tail->next = n;
	else
		q->head = n;
	q->tail = n;
}

/* The oldest item, taken out; NULL when empty. */
static inline struct fifo_node *fifo_pop(struct fifo *q)
{
	struct fifo_node *n = q->head;

	if (n) {
		q->head = n->next;
		if (!q->head)
			q->tail = NULL;
		n->next = NULL;
	}
	return n;
}

/* Every item, oldest first, as a list linked through next; q is empty. */
static inline struct fifo_node *fifo_take_all(struct fifo *q)
{
	struct fifo_node *n = q->head;

	q->head = q->tail = NULL;
	return n;
}

#endif
