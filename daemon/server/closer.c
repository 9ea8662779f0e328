/*
 * closer.c — closes, off the loop thread, the descriptors clients send (see
 * closer.h).
 *
 * A close() can block for as long as the file's owner likes: a TCP socket
 * with unsent data and SO_LINGER, a file on a hung NFS or FUSE mount.  The
 * loop thread must never wait on that, so descriptors a client attached to
 * a frame are handed here.  Sockets are made to close at once first (linger
 * off: an abortive close); anything else waits its turn on this thread,
 * which may take as long as it must while the loop goes on.
 *
 * DESIGN: one thread, started at startup and never joined: a close blocked
 * for an hour must not hold up shutdown either (the kernel drops what is
 * left at exit, without lingering).  c->lock guards the queue; it is held
 * only to push and to pop.  The queue grows by doubling; when that fails,
 * the descriptor is closed on the caller after its linger is turned off,
 * which cannot block for a socket.
 */
#include "server/closer.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"

static struct {
	pthread_mutex_t lock;
	pthread_cond_t more;
	int *fds; /* a ring of cap entries, n from head */
	size_t head, n, cap;
	unsigned closing; /* taken off the queue, close() not yet back */
	bool started;
	uint64_t closed;
} c = {.lock = PTHREAD_MUTEX_INITIALIZER, .more = PTHREAD_COND_INITIALIZER};

static void *closer_main(void *arg)
{
	prctl(PR_SET_NAME, "pf-closer");
	pthread_mutex_lock(&c.lock);
	for (;;) {
		int fd;

		while (!c.n)
			pthread_cond_wait(&c.more, &c.lock);
		fd = c.fds[c.head];
		c.head = (c.head + 1) % c.cap;
		c.n--;
		c.closing++;
		pthread_mutex_unlock(&c.lock);
		close(fd);
		pthread_mutex_lock(&c.lock);
		c.closing--;
		c.closed++;
	}
	return arg;
}

int closer_start(void)
{
	pthread_attr_t attr;
	pthread_t tid;
	int rc;

	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	rc = pthread_create(&tid, &attr, closer_main, NULL);
	pthread_attr_destroy(&attr);
	if (rc)
		return -rc;
	c.started = true;
	return 0;
}

/* Room for one more; false when the ring cannot grow. */
static bool reserve(void)
{
	size_t cap = c.cap ? 2 * c.cap : 256;
	int *t;

	if (c.n < c.cap)
		return true;
	t = malloc(cap * sizeof(*t));
	if (!t)
		return false;
	for (size_t i = 0; i < c.n; i++)
		t[i] = c.fds[(c.head + i) % c.cap];
	free(c.fds);
	c.fds = t;
	c.cap = cap;
	c.head = 0;
	return true;
}

void closer_close(int fd)
{
	struct linger off = {.l_onoff = 1, .l_linger = 0};
	struct stat st;
	bool queued = false;

	if (fd < 0)
		return;
	/* A socket's close then resets it at once instead of waiting to
	 * deliver what is unsent. */
	if (fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode))
		setsockopt(fd, SOL_SOCKET, SO_LINGER, &off, sizeof(off));
	pthread_mutex_lock(&c.lock);
	if (c.started && reserve()) {
		c.fds[(c.head + c.n) % c.cap] = fd;
		c.n++;
		queued = true;
		pthread_cond_signal(&c.more);
	}
	pthread_mutex_unlock(&c.lock);
	if (!queued) {
		log_warn("closing a client's descriptor on the loop thread: %s",
			 c.started ? "out of memory for the closer's queue" : "no closer thread");
		close(fd);
	}
}

unsigned closer_pending(void)
{
	unsigned n;

	pthread_mutex_lock(&c.lock);
	n = (unsigned)c.n + c.closing;
	pthread_mutex_unlock(&c.lock);
	return n;
}
