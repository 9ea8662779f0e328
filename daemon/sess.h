/*
 * sess.h — a consumer's session: its slots, its arenas, its epochs.
 *
 * A slot moves FREE -> FILLING (a reader job writes it) -> READY (complete,
 * waiting for its turn: delivery is in seq order) -> SENT (the client holds
 * it) -> FREE (the client released it).  CUDA sessions have one more step:
 * the reader writes a slot of the pinned ring (ring.h), then the slot is
 * COPYING while the GPU's transfer thread (xfer.h) moves it into the device
 * slot; it is READY only once the copy's event has completed.  A slot whose
 * epoch was abandoned while a job still works on it is ORPHAN and becomes
 * FREE when the job comes back.  The governor (gov.h) decides when a FREE
 * slot may be filled.
 *
 * CUDA sessions allocate device slots lazily, an arena at a time on the
 * transfer thread, as the target grows; an allocation that fails halves the
 * target and is retried a few times with a pause (OOM back-off), after
 * which the batch that needed it becomes an error batch.
 *
 * DESIGN: loop thread only.  A session lives while its connection lives and
 * until its last reader job has come back (`jobs`), so a job's slot memory
 * is never freed under a reader; a dead session leaves status at once.
 */
#ifndef PF_SESS_H
#define PF_SESS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "arena.h"
#include "gpu.h"
#include "gov.h"
#include "pool.h"
#include "prefetch.pb-c.h"

struct conn;
struct daemon;
struct dataset;
struct reader_job;
struct xfer;
struct xfer_job;

enum slot_state { SLOT_FREE, SLOT_FILLING, SLOT_COPYING, SLOT_READY, SLOT_SENT, SLOT_ORPHAN };

struct slot {
	enum slot_state state;
	uint64_t epoch, seq; /* the batch it holds (FILLING..SENT) */
	bool present;	     /* has memory (CUDA slots come with their arena) */
	uint32_t arena;	     /* index into sess->arenas or sess->garenas */
	uint64_t offset;     /* within the arena */
	uint8_t *host;	     /* host sessions: the daemon's mapping of the slot */
	uint64_t dev_addr;   /* CUDA sessions: device address of the slot */
	int32_t ring;	     /* CUDA sessions: ring slot while FILLING/COPYING, else -1 */
	uint32_t parts;	     /* FILLING: reader jobs (parts of the batch) not back */
	int error;	     /* FILLING/READY: 0, or the batch's first read error */
	char *errmsg;	     /* owned, READY with error only */
	/* Pool sessions: the batch's plan (FILLING/COPYING/ORPHAN) and the
	 * offsets of its staged rows' fields within the ring slot, which the
	 * reader jobs borrow. */
	struct pool_plan plan;
	uint64_t *stage_off;  /* owned, ds->nfields */
	uint64_t stage_bytes; /* the ring slot's prefix that goes to the device */
	/* When the batch entered each stage (debug timing). */
	uint64_t t_fill, t_copy, t_ready, t_sent;
};

/* Tries of one device allocation before the batch waiting for it becomes an
 * error batch, and the pause before try k (k * SESS_OOM_PAUSE_MS). */
#define SESS_OOM_TRIES	  4
#define SESS_OOM_PAUSE_MS 50

/* A batch is read in parts of about this many bytes, each its own reader
 * job, so several readers fill one batch at once (at most `readers`
 * parts). */
#define SESS_PART_BYTES (1u << 20)

/* Slots beyond max_depth: what the trainer may hold (taken, not yet
 * released) while the pipeline keeps `target` batches in flight.  Two
 * covers the usual "current step + the batch being moved" pattern. */
#define SESS_HOLD_SLOTS 2

/* The next epoch's shuffle, built ahead on libuv's thread pool under the
 * convention our clients follow (epoch n+1 shuffled with seed + 1, the
 * same rank and world), so that StartEpoch need not build 10 ms of order on
 * the loop thread before the first batch.  Any other request builds its
 * order as before; a guess that missed only cost a pool thread's time. */
struct sess_ahead {
	uv_work_t work;
	uint64_t seed, space;
	uint32_t rank, world;
	uint64_t *picks; /* owned: the order, once ready */
	uint64_t npicks;
	int rc;
	bool busy;  /* queued or running: counts in jobs */
	bool ready; /* picks hold the order for (seed, rank, world, space) */
	/* A newer epoch started while busy: what to build when it is done. */
	bool again;
	uint64_t again_seed, again_space;
	uint32_t again_rank, again_world;
};

/* Paced mode: a batch the client asked for, until it is sent. */
struct sess_req {
	uint64_t *picks; /* owned: count picks */
	uint32_t count;
	int error;    /* 0, or why the request cannot be served (-ERANGE, -EINVAL) */
	char *errmsg; /* owned, with error */
};

/* Paced batches requested and not yet sent, at most: the governor loads
 * target of them ahead; the rest wait here. */
#define SESS_PACED_MAX 1024

struct sess {
	struct sess *next, *prev; /* daemon->sessions while alive */
	struct daemon *d;	  /* borrowed */
	struct conn *conn;	  /* borrowed: NULL once the socket is gone */
	uint64_t id;
	char name[64];
	char device[16];
	int gpu; /* -1: host session */
	uid_t uid;
	pid_t pid;
	const struct dataset *ds; /* borrowed, held (daemon_dataset_hold) while ds_held */
	bool ds_held;
	uint32_t batch_size;
	bool picks_le; /* the client takes BatchReady.picks_le */
	uint32_t augment;
	bool drop_last;
	uint64_t *field_offset; /* owned: ds->nfields offsets within a slot */
	uint64_t slot_bytes, slot_stride;
	struct slot *slots; /* owned */
	uint32_t nslots;
	struct arena *arenas; /* owned */
	uint32_t narenas;
	struct gov gov;

	/* CUDA sessions (gpu >= 0). */
	struct xfer *xfer; /* borrowed: the daemon's transfer thread of gpu */
	enum gpu_ipc ipc;
	struct gpu_mem *garenas; /* owned: device arenas, in id order */
	uint32_t ngarenas;
	uint32_t npresent;   /* slots with device memory: 0 .. npresent-1 */
	bool alloc_pending;  /* an XFER_ALLOC is out */
	bool grow_blocked;   /* OOM tries ran out while slots exist */
	unsigned oom_tries;  /* failed tries of the current allocation */
	uv_timer_t retry;    /* OOM back-off pause */
	bool retry_live;     /* retry is initialised (closed by sess_free) */
	uint64_t ring_off;   /* our range of the daemon's pinned ring */
	uint64_t ring_bytes; /* 0: none */
	uint32_t nring;	     /* ring slots of slot_stride bytes */
	uint8_t *ring_busy;  /* owned, nring flags */
	uint64_t copy_bytes; /* H2D totals, for status */
	uint64_t copy_ns;
	uint64_t ring_stride; /* bytes per ring slot (>= slot_stride) */
	struct pool *pool;    /* borrowed (counted): NULL when not pooled */
	uint32_t stage_cap;   /* staged rows per batch at most */
	uint64_t h2d_bytes;   /* sample bytes that crossed PCIe */
	uint64_t index_bytes; /* gather indices that crossed PCIe */
	uint64_t pool_hits;   /* rows served from the pool */

	/* The current epoch. */
	uint64_t epoch;
	bool running;	 /* batches remain to be sent */
	uint64_t *picks; /* owned: this rank's picks */
	uint64_t npicks;
	uint64_t nbatches;
	uint64_t start_batch;
	uint64_t next_fill; /* next seq to hand to a reader */
	uint64_t next_send; /* next seq to send */
	/* Paced epochs (ORDER_PACED): no picks list; batch seq is request
	 * reqs[seq % SESS_PACED_MAX], nbatches counts requests so far, and
	 * the epoch ends once `end` came and every request was sent. */
	bool paced, paced_end;
	struct sess_req *reqs; /* owned, SESS_PACED_MAX, made on first use */

	struct sess_ahead ahead;
	unsigned jobs; /* reader and transfer jobs (and the order ahead) not yet back */
	bool dead;     /* connection gone, waiting for jobs */

	/* Figures for status. */
	uint64_t sent, bytes_sent, errors, read_ns;
	double wait_s, busy_s;
	uint64_t opened_ns, epoch_started_ns;
	bool first_sent; /* this epoch's first batch went out (debug timing) */
	/* This epoch's time per stage, summed over batches (debug timing):
	 * reading (fill -> copy), the device (copy -> ready), waiting for
	 * its turn (ready -> sent), the client (sent -> release), and the
	 * loop thread's planning against the pool. */
	uint64_t ns_read, ns_device, ns_turn, ns_client, ns_plan, timed;
};

/* OpenSession on connection c: creates c->sess, replies SessionOpened and
 * pushes the arenas.  Errors are replied to `id` and leave c as it was. */
int sess_open(struct conn *c, uint64_t id, const Pf__OpenSession *req);
int sess_start_epoch(struct sess *s, uint64_t id, const Pf__StartEpoch *req);
void sess_ack(struct sess *s, const Pf__Ack *req);
void sess_release(struct sess *s, const Pf__Release *req);
int sess_abandon(struct sess *s, uint64_t id, const Pf__Abandon *req);
void sess_probe(struct sess *s, const Pf__Probe *req);
/* LoadBatch: one paced batch's picks, or the end of the paced epoch. */
int sess_load(struct sess *s, uint64_t id, const Pf__LoadBatch *req);
/* Something outside changed (target): fill and send what is now allowed. */
void sess_kick(struct sess *s);
/* The connection is gone: leave status now, free once jobs are back. */
void sess_detach(struct sess *s);
/* A reader job came back (loop thread). */
void sess_job_done(struct reader_job *job, void *arg);
/* A transfer job came back (loop thread). */
void sess_xfer_done(struct xfer_job *job, void *arg);
/* Fills one SessionStatus; strings borrow from s. */
void sess_status(const struct sess *s, Pf__SessionStatus *st);
struct sess *sess_find(struct daemon *d, uint64_t id);
/* Invariants, for asserts and tests. */
bool sess_check(const struct sess *s);

#endif
