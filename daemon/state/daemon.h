/*
 * daemon/state/ — the daemon's state: struct daemon with its datasets, what
 * the configuration says of each, and reload (daemon.c), and the per-uid
 * quotas that every session's memory is counted against (quota.c).  Loop
 * thread.  Calls base/, conf/, data/ (loading datasets) and gpu/ (pools
 * turned on or off by a reload).
 *
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

#include "order/ahead.h"
#include "conf/config.h"
#include "data/dataset.h"
#include "gpu/pool.h"
#include "state/quota.h"
#include "mem/ring.h"

struct conn;
struct sess;
struct share;
struct readers;
struct xfer;

struct daemon {
	uv_loop_t *loop;	   /* borrowed: the default loop */
	struct config cfg;	   /* owned */
	const char *config_path;   /* borrowed: argv */
	bool socket_override;	   /* -s given: the config file's socket is not ours */
	struct dataset **datasets; /* owned: the configured ones, in config order */
	size_t ndatasets;
	struct dataset **retired; /* owned: taken out by a reload, still in use */
	size_t nretired;
	struct readers *readers; /* owned */
	struct conn *conns;	 /* owned: every open connection */
	unsigned nconns;
	struct sess *sessions; /* borrowed from conns: live sessions */
	struct share *shares;  /* owned through their members (share.h) */
	unsigned nsessions;
	uint64_t next_session_id;
	uint64_t started_ns;
	int listen_fd;
	bool socket_activated; /* listen_fd came from systemd */
	uv_poll_t listen_poll;
	uv_timer_t accept_timer; /* accepting again after EMFILE (server.c) */
	bool accept_timer_live;
	uv_idle_t pump_idle; /* sessions' pumps carried over to the next turn (sess_pump.c) */
	bool pump_idle_live;
	/* Client-copy fills go with streaming stores (sess_fill_shares): what
	 * the host-arena sessions fill ahead is more than fill_bytes, so a
	 * slot's lines are gone from the L3 before the copy engine reads
	 * them.  Within it, plain stores leave them there for the DMA. */
	bool fill_streamed;
	uv_idle_t conn_idle; /* connections' frames carried over to the next turn (server.c) */
	bool conn_idle_live;
	unsigned accept_pause_ms;
	uv_signal_t sig_term, sig_int, sig_hup;
	uv_timer_t tick;     /* periodic housekeeping (status, retired datasets) */
	uv_timer_t watchdog; /* feeds systemd's watchdog from the loop */
	bool watchdog_live;
	int ngpus; /* < 0: host sessions only */
	char gpu_desc[256];
	struct ring ring;	   /* the pinned reader ring (CUDA sessions) */
	char ring_err[200];	   /* why there is none, when ngpus > 0 */
	struct xfer **xfers;	   /* owned, ngpus entries: started on first use */
	struct pool_set pools;	   /* owned: VRAM pools, one per (dataset, GPU) used */
	uv_timer_t linger_timer;   /* probes and expiry of lingering pools (linger.c) */
	struct linger_gpu *linger; /* owned, ngpus entries (linger.c's) */
	struct quota quota;	   /* what each uid holds, against the limits */
	struct order_keep kept;	   /* orders of sessions gone, for the next (ahead.h) */
	char quota_why[160];	   /* how memory_budget was chosen, for the log */
	char machine_why[200];	   /* how auto readers and ring_bytes were chosen */
	int test_fail_allocs;	   /* PREFETCHD_TEST_FAIL_ALLOCS: forced OOMs left */
	bool stopping;
};

/* A configured dataset by name (retired ones are not found). */
struct dataset *daemon_dataset(const struct daemon *d, const char *name);
/* Loads every dataset of d->cfg (startup).  A dataset that fails to load is
 * kept with its error (status shows it; opening it returns the message). */
void daemon_load_datasets(struct daemon *d);
/* SIGHUP: reads d->config_path again.  Datasets added are loaded, removed
 * ones leave status and can no longer be opened (live sessions keep them
 * until they close), changed ones are replaced for new sessions, and so
 * are those declared as before whose files changed on disk or whose shard
 * patterns match other files (daemon.c says which end their sessions'
 * epochs); the
 * allow lists, depth defaults, reserve, probe interval, pool settings,
 * session limits, ipc and read method apply to what comes next.  Keys that
 * need a restart (socket, readers, ring, arena size, frame cap) are
 * reported, not applied.  0, or -errno with err saying why (the running
 * configuration is then untouched).  summary says what changed. */
int daemon_reload(struct daemon *d, char *summary, size_t len, char *err, size_t errlen);
/* A file behind ds changed on disk (why: "PATH changed on disk (...)"),
 * found by a reload or by a reader after a read failed: ds->changed says
 * so (with DS_CHANGED_FIX), its sessions end their epochs with it, opening
 * it is refused until a reload loads it anew, and the log says it once. */
void daemon_dataset_changed(struct dataset *ds, const char *why);
/* A session starts / stops reading ds: retired datasets are freed with
 * their last session (and their pools). */
void daemon_dataset_hold(struct dataset *ds);
void daemon_dataset_put(struct daemon *d, struct dataset *ds);
/* Whether ds's VRAM pools are on: its [dataset] pool key, else [daemon]'s. */
bool daemon_pool_enabled(const struct daemon *d, const struct dataset *ds);
/* Seconds ds's pools outlive their last session: its [dataset]
 * pool_linger, else [daemon]'s. */
double daemon_pool_linger(const struct daemon *d, const struct dataset *ds);
/* fill_bytes, auto resolved: a quarter of the L3 cache (sysconf), 32 MiB at least;
 * 64 MiB where the cache size is unknown. */
uint64_t daemon_fill_bytes(const struct daemon *d);
/* The pools take the configuration's pool settings (startup, reload): the
 * slab size and cap, and each pool on or off as its dataset now says. */
void daemon_config_pools(struct daemon *d);
/* The limits take the configuration's (startup, reload): memory_budget
 * auto is half the memory the daemon may use (the machine's, or its
 * cgroup's limit when lower), memory_per_uid auto half of the budget. */
void daemon_config_quota(struct daemon *d);
/* readers and ring_bytes set to auto (the default) take values that fit
 * the machine the daemon may use: readers = its usable CPUs (its
 * affinity mask) less a fifth of them (2 at least), at least 2 and at most 32; ring_bytes = 1/256
 * of its memory (the machine's, or its cgroup's limit), 256 MiB .. 1 GiB.  why (may be NULL) says
 * what was chosen from what.  Startup and reload alike, so that a reload of an unchanged file
 * changes nothing. */
void daemon_config_machine(struct config *cfg, char *why, size_t len);
/* Housekeeping tick: frees retired datasets nobody reads any more. */
void daemon_collect(struct daemon *d);
/* Frees every dataset (shutdown, after the sessions and pools). */
void daemon_free_datasets(struct daemon *d);

#endif
