/*
 * closer.h — descriptors that clients sent, closed off the loop thread.
 *
 * Clients never have a reason to send the daemon a descriptor; one that
 * comes attached to a frame ends that connection.  Its close is handed to
 * a thread of its own, because a close() may block for as long as whoever
 * made the file likes (a lingering socket, a hung network mount), and the
 * loop thread must not wait for any client.
 *
 * DESIGN: closer_start once on the main thread; closer_close from the loop
 * thread (any thread would do).  closer.c says how it never blocks.
 */
#ifndef PF_CLOSER_H
#define PF_CLOSER_H

#include <stdbool.h>
#include <stdint.h>

/* 0 or -errno (no thread: closer_close then closes inline). */
int closer_start(void);
/* fd is the closer's from now on. */
void closer_close(int fd);
/* Descriptors handed over and not yet closed (for status and tests). */
unsigned closer_pending(void);

#endif
