/*
 * daemon.h — the daemon's process-wide state.
 *
 * DESIGN: one struct daemon, owned by the loop thread.  Reader (and transfer)
 * threads never see it: they get jobs that borrow what they need.
 */
#ifndef PF_DAEMON_H
#define PF_DAEMON_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "config.h"
#include "dataset.h"
#include "ring.h"

struct conn;
struct sess;
struct reader_pool;
struct xfer;
struct pool;

struct daemon {
	uv_loop_t *loop;	  /* borrowed: the default loop */
	struct config cfg;	  /* owned */
	const char *config_path;  /* borrowed: argv */
	struct dataset *datasets; /* owned, cfg.ndatasets of them */
	size_t ndatasets;
	struct reader_pool *readers; /* owned */
	struct conn *conns;	     /* owned: every open connection */
	unsigned nconns;
	struct sess *sessions; /* borrowed from conns: live sessions */
	unsigned nsessions;
	uint64_t next_session_id;
	uint64_t started_ns;
	int listen_fd;
	bool socket_activated; /* listen_fd came from systemd */
	uv_poll_t listen_poll;
	uv_signal_t sig_term, sig_int;
	uv_timer_t tick; /* periodic housekeeping (probes) */
	int ngpus;	 /* < 0: host sessions only */
	char gpu_desc[256];
	struct ring ring;     /* the pinned reader ring (CUDA sessions) */
	char ring_err[200];   /* why there is none, when ngpus > 0 */
	struct xfer **xfers;  /* owned, ngpus entries: started on first use */
	struct pool *pools;   /* owned: VRAM pools, one per (dataset, GPU) used */
	int test_fail_allocs; /* PREFETCHD_TEST_FAIL_ALLOCS: forced OOMs left */
	bool stopping;
};

uint64_t now_ns(void);
const struct dataset *daemon_dataset(const struct daemon *d, const char *name);

#endif
