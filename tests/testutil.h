/*
 * testutil.h — what integration tests and benchmarks share: a real
 * prefetchd started on a temporary socket, .npy files whose every byte is
 * known (tools/npygen.h), and status read through the real protocol.
 */
#ifndef PF_TESTUTIL_H
#define PF_TESTUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "prefetch.pb-c.h"

struct tdaemon {
	char dir[256]; /* temporary directory, removed by td_cleanup */
	char sock[320];
	char conf[320];
	char log[320];
	pid_t pid;
};

/* A fresh temporary directory in t->dir.  0 or -errno. */
int td_init(struct tdaemon *t, const char *tag);
/* Writes t->conf: a [daemon] section with the socket in t->dir plus
 * `daemon_extra` lines, then `datasets` verbatim; starts build/prefetchd
 * (or $PREFETCHD_BIN) with stderr to t->log and waits up to 10 s until it
 * answers.  0 or -errno. */
int td_start(struct tdaemon *t, const char *daemon_extra, const char *datasets);
/* SIGTERM and wait (at most timeout_ms, then SIGKILL).  Returns the exit
 * status, or -1 if it had to be killed or died of a signal. */
int td_stop(struct tdaemon *t, int timeout_ms);
/* Removes t->dir and everything in it. */
void td_cleanup(struct tdaemon *t);
/* Path of a file inside t->dir (static buffer per call site is the caller's). */
void td_path(const struct tdaemon *t, const char *name, char *out, size_t len);

/* Writes a C-order little-endian .npy of `rows` rows whose row r (counted
 * from first_row) holds npygen's random bytes under seed.  descr like "<f4";
 * sample_shape/ndim describe one row.  0 or -errno. */
int td_write_npy(const char *path, unsigned version, const char *descr, size_t itemsize,
		 uint64_t rows, const uint64_t *sample_shape, int sample_ndim, uint64_t seed,
		 uint64_t first_row);
/* True when p holds row `row`'s bytes under seed.  */
bool td_row_ok(const uint8_t *p, uint64_t row_bytes, uint64_t seed, uint64_t row);

/* StatusReply from the daemon at sock, through libprefetch's own call path.
 * Free with pf__envelope__free_unpacked(env, NULL); NULL on failure. */
Pf__Envelope *td_status(const char *sock);
/* The status entry of a session, or NULL. */
Pf__SessionStatus *td_session(Pf__Envelope *status, uint64_t session);

double td_now(void);

#endif
