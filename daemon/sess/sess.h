/*
 * daemon/sess/ — a trainer's session and what it decides: its life,
 * epochs, slot state machine and CUDA half (sess*.c), slot layouts and
 * reader jobs (fill.c), the depth governor (gov.c), lingering pools
 * (linger.c), shares of one read among trainers (share.c), and the
 * client as its request handlers see it (peer.h: the
 * server fills in how to answer).  Loop thread only; readers and transfer
 * threads see only the jobs it submits.  Calls every folder before it;
 * server/ calls it.
 *
 * sess.h — a consumer's session: its slots, its arenas, its epochs.  The
 * session layer is where requests become actions: the server (server.c)
 * decodes frames and hands each session request here with its peer
 * (peer.h); protobuf types stop at this layer, and nothing below it (the
 * pool, the readers, the transfer threads, the layout rules of fill.h)
 * sees one.
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
 * which the batch that needed it becomes an error batch (sess_cuda.c).
 *
 * DESIGN: loop thread only.  A session lives while its connection lives and
 * until its last reader and transfer job, and its order built ahead, have
 * come back, so a job's slot memory is never freed under a worker; a dead
 * session leaves status at once.
 */
#ifndef PF_SESS_H
#define PF_SESS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "order/ahead.h"
#include "mem/arena.h"
#include "sess/fill.h"
#include "sess/gov.h"
#include "gpu/gpu.h"
#include "order/order.h"
#include "sess/peer.h"
#include "gpu/pool.h"
#include "prefetch.pb-c.h"
#include "mem/ring.h"

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
	uint32_t arena;	     /* index into sess->arenas or sess->cuda.arenas */
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
	uint64_t *stage_off; /* owned, ds->nfields */
	/* Sessions without a pool: the batch's sample numbers (batch_size),
	 * which its reader jobs borrow; owned (bigmem), made at the start of
	 * an epoch whose order is built, which makes it present off the loop
	 * (sess_start.rows), or else at the slot's first fill.  A batch its
	 * client gathers that is all hits: its entry ids, which go in the
	 * BatchReady (ids_inline; 4 bytes each in the first half for a client
	 * that takes them so, sess_cuda.ids32), no device work here. */
	uint64_t *rows;
	bool ids_inline;
	uint64_t stage_bytes; /* the ring slot's prefix that goes to the device */
	/* When the batch entered each stage (debug timing). */
	uint64_t t_fill, t_copy, t_ready, t_sent;
};

/* Tries of one device allocation before the batch waiting for it becomes an
 * error batch, and the pause before try k (k * SESS_OOM_PAUSE_MS). */
#define SESS_OOM_TRIES	  4
#define SESS_OOM_PAUSE_MS 50

/* The loop work (picks copied for the readers, picks packed into
 * BatchReady frames) one session's pump does in one turn of the loop; the
 * rest waits for the next turn, after every other client's events: batches
 * of millions of samples slow no one else. */
#define SESS_TURN_BYTES (8u << 20)

/* Samples in one batch at most: its BatchReady carries a pick of 8 bytes
 * each, 64 MiB at most, which a client's receive buffer takes whole
 * (PFC_MAX_RX_FRAME) and a connection's output queue has room for. */
#define SESS_MAX_BATCH (8u << 20)

/* Slots beyond max_depth: what the trainer may hold (taken, not yet
 * released) while the pipeline keeps `target` batches in flight.  Two
 * covers the usual "current step + the batch being moved" pattern. */
#define SESS_HOLD_SLOTS 2

/* Paced mode: a batch the client asked for, until it is sent. */
struct sess_req {
	uint64_t *picks; /* owned: count picks */
	uint32_t count;
	int error;     /* 0, or why the request cannot be served (-ERANGE, -EINVAL) */
	char *errmsg;  /* owned, with error */
	uint64_t held; /* quota taken for it (sess->paced_held) */
};

/* Paced batches requested and not yet sent, at most: the governor loads
 * target of them ahead; the rest wait here (their picks are counted in the
 * uid's memory quota). */
#define SESS_PACED_MAX 1024

/* What an epoch's build makes present ahead of the loop's first write, at
 * most (sess_start): the sample numbers of this many slots (the first
 * fills of a deep session), and this many BatchReady frames (what one
 * connection queues at once: the frame that takes it over CONN_HIGH_WATER,
 * and the one whose tail is still being sent). */
#define SESS_WARM_ROWS	 64
#define SESS_WARM_FRAMES 2

/* The order of an epoch that started, being built on libuv's thread pool
 * (every check was made when the epoch started, and answered): its batches
 * are filled once it is back, unless a newer epoch, an abandon or the
 * session's end came first. */
struct sess_start {
	uv_work_t work;
	struct sess *s; /* borrowed: alive until the build is back (counted in jobs) */
	uint64_t epoch, t_req;
	struct order_spec spec; /* spec.indices: owned copy (explicit orders) */
	uint64_t space;
	uint64_t *picks, npicks; /* owned: the built share */
	uint64_t held;		 /* quota taken for the build (order_memory's peak, the frames) */
	int rc;
	char err[200];
	bool cancelled; /* not wanted any more: thrown away when back */
	/* A block-shuffled epoch read with read = direct (sess_start_epoch
	 * says): the build also counts the rows the epoch takes from each
	 * sample block, for its block cache (blocks.h); count_only when the
	 * order itself was built ahead.  Copied here: the build's thread
	 * reads no session. */
	bool want_uses, count_only;
	uint32_t batch_size;
	bool drop_last;
	uint64_t start_batch;
	uint32_t *uses; /* owned until blocks_new takes it */
	/* The big buffers the loop will write first in this epoch (bigmem),
	 * made present by the build (big_prefault) so that their page faults
	 * are not the loop's: the slots' sample numbers (borrowed: the
	 * slots', freed with the session, which waits for the build) and
	 * the first BatchReady frames (owned: into bigmem's cache when back,
	 * where the server's next frames of that size come from). */
	uint64_t *rows[SESS_WARM_ROWS];
	uint32_t nrows;
	size_t rows_bytes;
	void *frames[SESS_WARM_FRAMES];
	uint32_t nframes;
	size_t frame_bytes;
};

/* The CUDA half of a session (gpu >= 0): device slots, the ring slots that
 * stage batches for them, and what crossed PCIe. */
struct sess_cuda {
	struct xfer *xfer; /* borrowed: the daemon's transfer thread of gpu */
	/* Pumps the session: sess_pump, set at open.  A copy or an
	 * allocation that came back, or an OOM back-off's end, may unblock
	 * it; this half is below the pump and calls nothing above it
	 * (sess_int.h). */
	void (*pump)(struct sess *s);
	enum gpu_ipc ipc;
	struct gpu_mem *arenas; /* owned: device arenas, in id order */
	uint32_t narenas;
	uint32_t npresent;	 /* slots with device memory: 0 .. npresent-1 */
	bool alloc_pending;	 /* an XFER_ALLOC is out */
	bool grow_blocked;	 /* OOM tries ran out while slots exist */
	unsigned oom_tries;	 /* failed tries of the current allocation */
	uv_timer_t retry;	 /* OOM back-off pause */
	bool retry_live;	 /* retry is initialised (closed by sess_free) */
	struct ring_lease lease; /* ring slots of ring_stride bytes (>= slot_stride) */
	struct pool *pool;	 /* borrowed (counted): NULL when not pooled */
	uint32_t stage_cap;	 /* staged rows per batch at most */
	/* The client gathers its pooled batches (OpenSession.gather): each
	 * device slot has a tail at tail_off where the batch's index and
	 * staged rows land, and the pool's slabs are exported to it once
	 * (slab_sent[j]: the gen of slab j it has, 0: none). */
	bool gather;
	/* Its client takes the entry ids of a batch of hits as 4 bytes
	 * (OpenSession.narrow): every entry id fits, since the pool's index
	 * holds them as uint32 below POOL_PENDING (pool_maybe_grow stops
	 * growing before an id would not). */
	bool ids32;
	uint64_t dev_stride; /* device slot stride: slot_stride, plus the tail */
	uint64_t tail_off;
	uint32_t *slab_sent; /* owned, nslab_sent */
	uint32_t nslab_sent;
	/* Figures for status. */
	uint64_t copy_bytes, copy_ns; /* H2D totals */
	uint64_t h2d_bytes;	      /* sample bytes that crossed PCIe */
	uint64_t index_bytes;	      /* gather indices that crossed PCIe */
	uint64_t pool_hits;	      /* rows served from the pool */
};

/* This epoch's time per stage, summed over batches (debug timing): reading
 * (fill -> copy), the device (copy -> ready), waiting for its turn (ready ->
 * sent), the client (sent -> release), and the loop thread's planning
 * against the pool. */
struct sess_timing {
	uint64_t read, device, turn, client, plan;
	uint64_t batches;
	bool first_sent; /* this epoch's first batch went out */
};

struct sess {
	struct sess *next, *prev; /* daemon->sessions while alive */
	struct daemon *d;	  /* borrowed */
	const struct peer *peer;  /* borrowed: NULL once the connection is gone */
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
	bool narrow;   /* ... and picks_le32 and gather_ids32 (OpenSession.narrow) */
	/* The client is narrow and every pick of the session is below 2^32
	 * (augment x N <= 2^32, decided at open, as picks stay below it in
	 * every epoch, paced ones included): its
	 * BatchReady carries picks_le32, packed into the loop's scratch as
	 * each is encoded (sess_pump.c). */
	bool picks32;
	/* A CUDA session (device names its GPU) whose client copies each
	 * batch to the GPU itself, in its own context, from host arenas it
	 * registers: to the daemon it is a host session (gpu is -1).  A copy
	 * from the daemon's context with its readers busy cost a
	 * compute-bound step 4-11%, the client's own copy 0.3% (issue 16). */
	bool client_copy;
	/* No client copies and no client gathers: the daemon fills every
	 * device slot itself (its copy, or with the pool on its gather), and
	 * any number of clients may map them (a share's producer, share.c;
	 * sess_how.plain). */
	bool plain;
	uint32_t augment;
	bool drop_last;
	struct slot_layout lay;
	struct slot *slots; /* owned */
	uint32_t nslots;
	struct arena *arenas; /* owned: host sessions' arenas */
	uint32_t narenas;
	struct gov gov;
	char share_why[120]; /* status: why gov.share is what it is */
	struct sess_cuda cuda;

	/* The current epoch.  Epoch numbers are the trainer's own (Python's
	 * epoch(n), libprefetch's from 0), so 0 is a real epoch: had_epoch,
	 * not epoch != 0, says whether one was started. */
	uint64_t epoch;
	bool had_epoch;
	bool running;	 /* batches remain to be sent */
	uint64_t *picks; /* owned: this rank's picks */
	uint64_t npicks;
	uint64_t nbatches;
	uint64_t start_batch;
	uint64_t next_fill; /* next seq to hand to a reader */
	uint64_t next_send; /* next seq to send */
	/* ORDER_BLOCK_SHUFFLE: the epoch's block size B (samples) and window
	 * W (blocks), as resolved (order_block_params); 0 for other orders.
	 * A block cache maps picks to blocks with order_sample_block(pick,
	 * ds->num_samples, block_rows). */
	uint64_t block_rows, window_blocks;
	bool block_clamp_logged; /* a block above N was logged (once a session) */
	/* The running epoch's block cache (read = direct and block_shuffle:
	 * every row comes from a block read once), or NULL; the session's
	 * reference, and the quota taken for its two windows. */
	struct blocks *blocks;
	uint64_t blocks_held;
	/* Paced epochs (ORDER_PACED): no picks list; batch seq is request
	 * reqs[seq % SESS_PACED_MAX], nbatches counts requests so far, and
	 * the epoch ends once `end` came and every request was sent. */
	bool paced, paced_end;
	struct sess_req *reqs; /* owned, SESS_PACED_MAX, made on first use */

	struct ahead ahead; /* the next epoch's order */
	/* What the running epoch's picks were built from, so that they can
	 * be kept for the next session once this one is gone (ahead.h). */
	struct order_spec order_spec;
	uint64_t order_space;
	struct sess_start *building; /* the running epoch's order, still being built, or NULL */
	unsigned jobs;		     /* reader, transfer and order-building jobs not yet back */
	unsigned builds;	     /* of them, order builds (the running epoch's or cancelled) */
	bool dead;		     /* connection gone, waiting for jobs */
	bool pump_later;	     /* its turn's work was done: the pump goes on next turn */
	/* Frees the session once it is dead and every job is back: sess.c's
	 * sess_free, set at open.  The job that comes back last may be any
	 * file's, and the files below sess.c call nothing above them
	 * (sess_int.h): they reach it through sess_maybe_free. */
	void (*free_fn)(struct sess *s);

	/* Quota (quota.h) held for the session's host memory, by uid: its
	 * slots and their tables (taken at open), its order (npicks * 8),
	 * the order built ahead, and the paced requests not yet sent. */
	bool counted; /* holds one of the uid's sessions (until detached) */
	uint64_t mem_held, order_held, ahead_held, paced_held;

	/* Figures for status. */
	uint64_t sent, bytes_sent, errors, read_ns;
	double wait_s, busy_s;
	uint64_t opened_ns, epoch_started_ns;
	struct sess_timing timing;
};

/* OpenSession from peer p: creates the session, stores it in *slot (the
 * connection's; it must be NULL, else the request is refused), replies
 * SessionOpened and pushes the arenas.  Errors are replied to `id` and
 * leave *slot as it was.  Returns < 0 only when the connection must close. */
int sess_open(struct daemon *d, const struct peer *p, struct sess **slot, uint64_t id,
	      const Pf__OpenSession *req);
/* How a session the daemon opens for itself (share.c) differs from a
 * client's: extra_slots beyond max_depth + SESS_HOLD_SLOTS (a share's
 * members that trail its fastest hold them), and plain (sess.plain). */
struct sess_how {
	uint32_t extra_slots;
	bool plain;
};
/* sess_open, as how says (NULL: as a client's). */
int sess_open_how(struct daemon *d, const struct peer *p, struct sess **slot, uint64_t id,
		  const Pf__OpenSession *req, const struct sess_how *how);
/* SessionOpened for s, answering `id` of `to`, as the session numbered
 * `session` of `slots` slots in share `share` ("" for none): s's own
 * open, or a share's member (share.c).  Then the arenas: every one s has
 * now, each fd dup'd for `to`. */
int sess_send_opened(struct sess *s, const struct peer *to, uint64_t id, uint64_t session,
		     uint32_t slots, const char *share);
int sess_send_arenas(struct sess *s, const struct peer *to);
/* The BatchReady of SENT slot sl of the running epoch once more, to `to`
 * (a share's member that joins while others hold it).  Plain slots only:
 * 0, or -EINVAL. */
int sess_send_again(struct sess *s, const struct slot *sl, const struct peer *to);
int sess_start_epoch(struct sess *s, uint64_t id, const Pf__StartEpoch *req);
void sess_ack(struct sess *s, const Pf__Ack *req);
void sess_release(struct sess *s, const Pf__Release *req);
int sess_abandon(struct sess *s, uint64_t id, const Pf__Abandon *req);
void sess_probe(struct sess *s, const Pf__Probe *req);
/* LoadBatch: one paced batch's picks, or the end of the paced epoch. */
int sess_load(struct sess *s, uint64_t id, const Pf__LoadBatch *req);
/* Something outside changed (target): fill and send what is now allowed. */
void sess_kick(struct sess *s);
/* ring.wake: the ring has a slot for session owner's next batch; its pump
 * runs in the loop's next turn (sess_pump.c). */
void sess_ring_wake(void *owner);
/* Every host-arena session's gov.share: an even part of fill_bytes, never
 * below its min_depth (sess_pump.c).  On every open and close. */
void sess_fill_shares(struct daemon *d);
/* Shutdown: the handle that carries pumps over to the next turn closes. */
void sess_pump_stop(struct daemon *d);
/* The connection is gone: leave status now, free once jobs are back. */
void sess_detach(struct sess *s);
/* A reader job came back (loop thread). */
void sess_job_done(struct reader_job *job, void *arg);
/* A transfer job came back (loop thread). */
void sess_xfer_done(struct xfer_job *job, void *arg);
/* Fills fields[0..ds->nfields) (and the pointer array) with ds's fields;
 * strings and shapes borrow from ds.  offsets, when not NULL, are the
 * fields' offsets within a slot. */
void sess_fields(const struct dataset *ds, const uint64_t *offsets, Pf__Field *fields,
		 Pf__Field **fieldp);
struct sess *sess_find(struct daemon *d, uint64_t id);
/* Invariants, for asserts and tests. */
bool sess_check(const struct sess *s);

/* pool_set.slab_gone (arg: the daemon): tells the clients that were sent
 * slab `slab` of p that it went (PoolSlabGone). */
struct pool;
void sess_cuda_slab_gone(void *arg, const struct pool *p, uint32_t slab, uint32_t gen);

#endif
