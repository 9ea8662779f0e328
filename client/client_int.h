/*
 * client_int.h — libprefetch internals.  First the calls that prefetchctl
 * and the unit tests build on; then, for the library's own files only,
 * struct pf_client and what those files call across each other, file by
 * file from the bottom up.  Not installed: prefetch.h is the only public
 * header.
 *
 * The files are layers: a file calls only the files below it, never one
 * above it or beside it, so each reads (and is tested) with what lies
 * under it and no circle of calls holds two files together.
 *   prefetch.c, epoch.c  the public API: sessions; epochs and batches
 *   reconnect.c          the session across daemon restarts
 *   call.c               requests and replies, hello, OpenSession and
 *                        StartEpoch (which a reconnection sends again)
 *   batch.c              pushes taken in, gathers launched, batches taken
 *   release.c            events, releases, client copies
 *   arena.c              the arenas and pool slabs batches live in
 *   conn.c               frames out and in, waits with a deadline
 *   settle.c             the release lanes (threads)
 *   base.c               deadlines, error texts, the raw write
 * The CUDA side (pfcuda.h) is below them all and calls none of them:
 * cuda_ipc.c and cuda_gather.c (imports; the gather module and its
 * stream) over cuda.c (the driver, contexts, events, device memory).
 * What a lower file would have needed from a higher one lives low: the
 * lanes' raw write in base.c, the session's two requests in call.c.  Where
 * the order goes the other way, the caller moved up instead: a request's
 * wait hands the pushes it reads to batch.c, so the request/reply call
 * (call.c) sits above batch.c, and taking in the frames received
 * (pfc_take_in) is batch.c's, not conn.c's.  The one callback is an old
 * one: a settled release gives its event back to release.c through
 * pfc_release.free_event, so settle.c never calls up.
 * (prefetchctl's files, prefetchctl.c and ctl_*.c, are a program of their
 * own on top of the calls below.)
 *
 * Everything declared here has hidden visibility (the library is compiled
 * with -fvisibility=hidden), so it links from libprefetch.a but is not
 * exported from libprefetch.so.
 *
 * DESIGN: a struct pf_client is used by one thread at a time (the
 * trainer's, or prefetchctl's main thread), which owns its receive buffer
 * and every list below.  The one exception is settle.c's release lanes of
 * a CUDA client: threads that wait for the GPU and write Releases to the
 * socket.  They share with the owner only what settle.c's DESIGN names:
 * the settle lock's lists, and, under send_lock, the socket's writes,
 * sock, gen, dead and the slot marks (read with atomics: slot_marked).
 */
#ifndef PF_CLIENT_INT_H
#define PF_CLIENT_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "gather.h"
#include "pfcuda.h"
#include "prefetch.h"
#include "prefetch.pb-c.h"
#include "util.h"
#include "wire.h"

/* Replies to requests: how long a reply may take before the call gives up
 * with -ETIMEDOUT.  The daemon answers from its loop thread, which never
 * blocks, so 10 s means it is wedged or gone.  $PREFETCHD_TIMEOUT_MS
 * overrides it. */
#define PFC_TIMEOUT_MS_DEFAULT 10000
#define PFC_TIMEOUT_ENV	       "PREFETCHD_TIMEOUT_MS"
/* Set and not "0": pf_close prints what the client did (struct pfc_counts). */
#define PFC_COUNTERS_ENV "PREFETCH_CLIENT_COUNTERS"
/* Hello gets its own, shorter limit: a socket that accepts but never answers
 * (a stale path, the wrong program) should fail pf_connect quickly. */
#define PFC_HELLO_TIMEOUT_MS 5000
/* The largest frame the client receives: a BatchReady of the daemon's
 * largest batch (8M picks of 8 bytes) with room to spare.  The daemon's
 * max_frame bounds what the daemon receives, not this. */
#define PFC_MAX_RX_FRAME (128u << 20)
/* Bytes one read of the socket asks for: the 16 frames of 16 KiB a
 * daemon sends ahead at its default depth, in one read. */
#define PFC_RX_FILL (256u << 10)
/* Batches received but not yet taken.  The daemon's target bounds this far
 * lower (a few slots); more than this is a daemon bug, treated as a protocol
 * error rather than as a reason to grow without limit. */
#define PFC_MAX_QUEUED 4096
/* Client copies started before the trainer asks for their batches (as a
 * batch arrives, or when the trainer gives one back): pf_next then hands
 * over a batch already on the device, and its host slot goes back sooner.
 * Each costs one more device buffer of a slot's size. */
#define PFC_COPY_AHEAD 2
/* A release (pf_release, pf_release_next) that finds fewer batches than
 * this queued reads the socket without waiting, so that the next batches'
 * copies or gathers start there and not in the trainer's next pf_next
 * (bench/NOTES.md, run 33: every slow hand-off found the queue empty and
 * received, handled and copied its batch itself). */
#define PFC_READ_AHEAD PFC_COPY_AHEAD
/* CU_STREAM_PER_THREAD: one handle, a different stream on each thread. */
#define PFC_STREAM_PER_THREAD ((const void *)0x2)
/* Arena ids index a table; the daemon makes a handful per session. */
#define PFC_MAX_ARENAS 1024
/* Slots per session; the bitmap of slots this client holds is this big at
 * most. */
#define PFC_MAX_SLOTS (1u << 20)

/*
 * Takes ownership of sock (a connected stream socket; closed on failure too),
 * says hello and waits up to hello_timeout_ms for the reply.  `where` names
 * the peer in messages ("prefetchd at /run/...").  Like pf_connect, on
 * failure *out is still set when the client struct could be allocated, so
 * that pf_errmsg(*out) can say why; the caller pf_close()s it.
 */
int pfc_connect_fd(int sock, const char *where, int hello_timeout_ms, struct pf_client **out);

/*
 * Sends req (its id is overwritten with a fresh one) and waits for the reply
 * that echoes that id.  Pushes read meanwhile are handled as usual (batches
 * queued, arenas mapped, stale batches released).  Returns 0 and, when reply
 * is not NULL, the reply envelope (free it with
 * pf__envelope__free_unpacked(*reply, NULL)) if its case is reply_case;
 * the daemon's Error code (message in pf_errmsg) if it refused; -ETIMEDOUT
 * after the client's request timeout; -EPROTO for a reply of another case;
 * or the connection's error once it is broken.
 */
int pfc_call(struct pf_client *c, Pf__Envelope *req, int reply_case, Pf__Envelope **reply);

/* Sends a one-way message (Ack, Release, Probe): id 0, no reply.  While
 * the client is corked it is only queued. */
int pfc_send(struct pf_client *c, Pf__Envelope *msg);
/* pf_next and pf_release cork the client for their duration: the Releases
 * pf_next flushes leave with the Ack of the batch it takes, in one write
 * (pfc_take uncorks), or before the client waits to read, before a
 * request, or when the call returns. */
void pfc_cork(struct pf_client *c);
int pfc_uncork(struct pf_client *c);

/* Request timeout of this client, in ms (> 0). */
void pfc_set_timeout(struct pf_client *c, int timeout_ms);

/* Whether the connection is broken (EOF, a protocol error): every later call
 * fails.  A timeout or an error batch leaves it usable. */
bool pfc_broken(const struct pf_client *c);

/* What the daemon said in HelloReply; borrowed, valid until pf_close. */
const char *pfc_daemon_version(const struct pf_client *c);
uint32_t pfc_daemon_max_frame(const struct pf_client *c);

/* Sets pf_errmsg(c) from a printf format and returns rc, for callers that
 * build on the internal API (prefetchctl). */
int pfc_set_err(struct pf_client *c, int rc, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/*
 * A release waiting for the trainer's queued GPU work.  Host batches are
 * released at once.  CUDA batches record an event on the stream their
 * work is on and hand the release to a lane of settle.c, whose thread
 * waits, blocked, for the event and then sends the Release (or, for a
 * client copy's device buffer, only gives the buffer back); the trainer's
 * thread never waits for it and never asks about it.
 */
struct pfc_release {
	uint64_t epoch;
	uint64_t seq;
	int32_t slot;
	/* Client copies: the device buffer the trainer was given, back to the
	 * free list when done; nothing is sent (the slot went back after its
	 * copy).  -1 otherwise. */
	int32_t dbuf;
	void *event; /* owned through free_event: a struct pfc_event */
	/* The stream the event was recorded on: the lane that waits for it
	 * (settle.c), in which events retire in the order recorded. */
	const void *stream;
	/* The connection the slot belongs to (pf_client.gen); 0: send
	 * nothing (the connection is going).  Written under the settle lock
	 * once queued. */
	uint64_t gen;
	void (*free_event)(void *event);
	int64_t queued_ns; /* when it was queued ($PREFETCH_CLIENT_COUNTERS) */
	struct pfc_release *next;
};

/* ---- the library's own ------------------------------------------------------
 * What follows is for libprefetch's files only: prefetchctl and the tests
 * use the calls above and never look inside a struct pf_client.  Each
 * function below is described at its definition. */

/* Error texts: pf_errmsg and what a broken connection or an outage said. */
#define PFC_ERRMSG_LEN 512

struct pfc_field {
	char *name;	 /* owned */
	char *dtype;	 /* owned */
	uint64_t *shape; /* owned, ndim entries */
	int ndim;
	uint64_t sample_bytes;
	uint64_t offset; /* inside a slot */
};

struct pfc_arena {
	bool present;
	int kind; /* Pf__ArenaKind */
	uint64_t bytes;
	void *base;		    /* host: owned mapping, munmap'd by pf_close;
				     * CUDA: the device address of garena */
	bool registered;	    /* host, client copies: page-locked for the device */
	struct pfcuda_arena garena; /* CUDA: owned import, unmapped by pf_close */
};

/* A slab of the session's VRAM pool, mapped for the client's gather. */
struct pfc_slab {
	uint32_t gen; /* 0: not mapped */
	struct pfcuda_arena map;
};

/* A release event of a CUDA batch: recorded on the trainer's stream, kept
 * for reuse once done.  The same events mark the end of a batch's gather. */
struct pfc_event {
	struct pf_client *c; /* borrowed: its owner */
	void *ev;	     /* owned CUevent */
	/* Holders (batches, releases): the batches of one group launch
	 * share its event.  Idle (in c->events) at 0. */
	uint32_t refs;
	/* Which use this is (pf_client.event_uses when taken): a wait on
	 * this record is known by (event, use), not by the event alone, which
	 * is recorded again after it goes back idle. */
	uint64_t use;
	struct pfc_event *next;
};

/*
 * A batch from the moment its BatchReady arrives until it is released (data
 * batches) or taken (error batches).  One allocation: the struct, then the
 * nfields data pointers, then the count picks.
 */
struct pfc_batch {
	struct pf_batch pub;	     /* first: pf_release is handed &pub */
	int32_t slot;		     /* -1: error batch */
	int32_t error;		     /* 0, or the -errno of an error batch */
	char *message;		     /* owned: an error batch's text */
	uint64_t bytes;		     /* sample bytes of all fields */
	uint64_t gen;		     /* the connection it came on (pf_client.gen) */
	struct pfc_event *gather_ev; /* one reference (shared by a group launch's batches): the
					 end of its gather or copy */
	bool waited;		     /* waited_stream waits for gather_ev (pfc_take) */
	bool acked;		     /* its Ack went at the release before (pfc_ack_ahead) */
	const void *waited_stream;
	const uint8_t *host;	 /* client copies: the slot in its host arena */
	int32_t dbuf;		 /* client copies: its device buffer once copied, else -1 */
	struct fifo_node queued; /* in pf_client.queue until taken */
	struct pfc_batch *next;	 /* in pf_client.held once taken */
};

/* The arenas of a connection that broke while the trainer held batches in
 * them (reconnect_s): kept mapped until the last such batch is released. */
struct pfc_retired {
	uint64_t gen;
	struct pfc_arena *arenas; /* owned: mappings, unmapped when users is 0 */
	uint32_t narenas;
	uint32_t users; /* held batches of gen */
	struct pfc_retired *next;
};

struct pf_client {
	int sock; /* owned; -1 once the connection is broken; changed under send_lock */
	/* Recursive: a failed send breaks the connection (pfc_conn_fail)
	 * with the lock held.  Guards every write to sock, and sock, gen,
	 * dead and slot_mine's replacement (settle.c's lanes write too). */
	pthread_mutex_t send_lock;
	char *where; /* owned: "prefetchd at PATH", for messages */
	struct wire_rx rx;
	bool corked;  /* pfc_cork: one-way messages wait in out */
	uint8_t *out; /* owned: frames waiting for pfc_uncork */
	size_t out_len, out_cap;
	uint64_t last_id;   /* ids of requests: last_id + 1 is the next */
	int timeout_ms;	    /* for replies to requests, > 0 */
	char daemon[64];    /* HelloReply.daemon */
	uint32_t max_frame; /* largest frame the daemon accepts */
	int dead;	    /* 0, or the error that broke the connection */
	char dead_msg[PFC_ERRMSG_LEN];
	char err[PFC_ERRMSG_LEN];
	char hello_name[64]; /* "prog[pid]" */
	bool greeted;	     /* HelloReply received */
	bool refused;	     /* the last request got the daemon's Error */
	char *path;	     /* owned: the socket (pf_connect), NULL otherwise */
	uint64_t gen;	     /* connections so far, this one included */

	/* Session: set once by pf_open. */
	bool opened;
	uint64_t session;
	uint64_t num_samples;
	struct pfc_field *fields; /* owned, nfields */
	uint32_t nfields;
	uint64_t slot_bytes;
	uint32_t slots;
	/* owned, slots entries: 1 while the slot is queued, held or waiting
	 * for its release here.  The daemon may announce a slot again only
	 * after its release, so an announcement of a marked slot is a protocol
	 * error rather than two batches aliasing one buffer. */
	uint8_t *slot_mine;
	char *device;		  /* owned: what the daemon granted */
	struct pfcuda_dev *cuda;  /* owned: CUDA sessions' device, else NULL */
	struct pfc_event *events; /* owned: idle events */
	/* The client's gather (SessionOpened.pool): the kernel and its stream
	 * (made at pf_open unless $PREFETCH_CLIENT_GATHER is 0), the pool's
	 * record layout in a parameter block each batch starts from, and the
	 * pool's slabs mapped here, by id. */
	struct pfcuda_gather *gather; /* owned: NULL when the daemon gathers */
	bool gathers;		      /* this connection's session sends gathers */
	struct gpu_gather layout;
	struct pfc_slab *pool_slabs; /* owned, npool_slabs */
	uint32_t npool_slabs;
	/* Batches of pool hits taken in by one pass over the received frames
	 * (pfc_take_in, while grouping) wait here to be gathered in one
	 * launch (pfc_gather_flush, at the latest when the pass ends):
	 * borrowed, queued batches, with the host addresses of their indices
	 * in the staging buffer. */
	bool grouping;
	uint32_t ngroup;
	bool group_ids32; /* their indices are 4-byte entry ids (gather_ids32) */
	struct pfc_batch *group[GPU_GATHER_GROUP];
	const void *group_ids[GPU_GATHER_GROUP];
	uint64_t group_slot[GPU_GATHER_GROUP]; /* device address of each one's slot */
	uint64_t event_uses;		       /* events taken so far (pfc_event.use) */
	/* The last gather event a take made a stream wait on: a batch of the
	 * same launch used on the same stream needs no wait of its own. */
	const struct pfc_event *waited_ev; /* borrowed: compared, never read */
	uint64_t waited_use;
	const void *waited_on;
	void *use_stream; /* pf_next_stream: the stream the next batch is used on */
	bool sync_take;	  /* pf_next: wait on the CPU for the batch's copy or gather */
	/* Client copies (SessionOpened.client_copy): batches come in host
	 * arenas, page-locked here; each one taken is copied, on the gather
	 * stream, into a device buffer of this process (made one at a time as
	 * the trainer holds more, up to the session's slots), which goes back
	 * to the free stack once the trainer's work on it retired.  The
	 * copies of up to PFC_COPY_AHEAD batches not taken yet start early
	 * (pfc_copy_ahead). */
	bool ccopy;
	uint64_t *dbufs;     /* owned: the buffers' device addresses, ndbufs of dbuf_cap */
	uint64_t dbuf_bytes; /* each buffer's size */
	uint32_t *dbuf_free; /* owned: stack of free buffer indices */
	uint32_t ndbuf_free, ndbufs, dbuf_cap;
	double probe_interval_s;  /* CUDA: 0 = only the first probe */
	int64_t last_probe_ns;	  /* 0: not probed yet */
	struct pfc_arena *arenas; /* owned, indexed by arena id */
	uint32_t narenas;
	struct pfc_retired *retired; /* owned: arenas of broken connections */

	/* What re-opening the session after a restart needs: pf_open's
	 * options (strings owned) and the device's PCI bus id. */
	struct pf_open_opts open_opts;
	char pci_bus_id[32];
	bool own_target_set; /* pf_set_depth on this session: sent again */
	uint32_t own_target;

	/* Reconnection (open_opts.reconnect_s > 0).  down: the connection
	 * broke and the session waits to be re-opened; outage_rc/msg: how it
	 * broke; given_up: reconnect_s ran out or the daemon refused, so the
	 * error is final. */
	bool down;
	bool given_up;
	int outage_rc;
	char outage_msg[PFC_ERRMSG_LEN];
	int64_t down_since_ns;
	int64_t next_try_ns;
	int backoff_ms;
	unsigned tries;
	char try_msg[PFC_ERRMSG_LEN]; /* why the last try failed */
	uint64_t reconnects;
	/* The interrupted epoch is started again on the next connection. */
	bool resume_pending;

	/* Epoch.  Batches are accepted only while epoch_live and !epoch_ended
	 * and only for `epoch`; anything else is stale and released at once. */
	uint64_t epoch; /* current epoch (the trainer's number), once had_epoch */
	/* Epoch ids only grow, even past a start that failed without a
	 * refusal (its batches may still come): last_epoch is the highest
	 * used, valid once had_epoch.  next_epoch: pf_set_epoch's, for the
	 * next start, while next_set. */
	uint64_t last_epoch, next_epoch;
	bool had_epoch, next_set;
	bool epoch_live;
	bool epoch_ended;  /* its EpochEnd arrived */
	uint64_t next_seq; /* seq the next accepted batch must carry */
	/* How the current epoch was started, for its restart at resume_seq,
	 * the seq after the last batch taken.  epoch_indices: owned copy of
	 * an explicit order, kept only when the client reconnects. */
	enum pf_order epoch_order;
	uint64_t epoch_seed;
	uint32_t epoch_rank, epoch_world;
	uint64_t epoch_block_rows, epoch_block_bytes, epoch_window_blocks;
	uint64_t *epoch_indices;
	size_t epoch_nindices;
	uint64_t resume_seq;

	struct fifo queue; /* owned: struct pfc_batch (queued), received, not taken */
	uint32_t nqueued;
	struct pfc_batch *held; /* owned: taken, not released */
	uint32_t nheld;
	struct pfc_settle *settle; /* owned: the release lanes (settle.c), made on first use */
	uint32_t nreleases;	   /* queued on a lane and not collected yet */

	/* An Error pushed with id 0 (a refused Ack or Release); pf_next
	 * returns it once. */
	int pending_err;
	char pending_msg[PFC_ERRMSG_LEN];

	/* Stall accounting and totals (pf_stats). */
	uint64_t batches;
	bool error_batch;	  /* the last take failed with an error batch */
	uint64_t epoch_batches;	  /* taken in the current epoch */
	uint64_t paced_requested; /* paced epochs: pf_load calls this epoch */
	bool paced_ended;	  /* paced epochs: pf_load_end was called */
	uint64_t bytes;
	double wait_s;
	double busy_s;
	bool have_last_return;
	int64_t last_return_ns;

	/* What the client did, counted for $PREFETCH_CLIENT_COUNTERS (printed
	 * by pf_close): where a batch's time goes, without a profiler. */
	struct pfc_counts {
		uint64_t sends, reads, empty_reads, polls; /* system calls */
		uint64_t frames;			   /* BatchReady taken in */
		uint64_t launches, grouped;		   /* gathers: launches, batches */
		uint64_t copies, records, waits, queries;  /* copies, event calls */
		/* Time in them (only with $PREFETCH_CLIENT_COUNTERS): sends,
		 * reads, frames decoded, BatchReady handled (its gather or
		 * copy included), gather launches, event records, waits and
		 * queries. */
		uint64_t send_ns, read_ns, decode_ns, batch_ns, launch_ns, event_ns;
		uint64_t wait_ns; /* in poll, waiting for the daemon */
		/* Releases settled by the lanes, and their time from queued to
		 * sent (lanes' threads: atomic adds). */
		uint64_t settled, settle_ns;
	} counts;
	bool timing; /* $PREFETCH_CLIENT_COUNTERS: counts' times are kept */
};

/* The start of a timed span of counts (0 when c keeps no times). */
#define PFC_T0(c) ((c)->timing ? mono() : 0)
/* Adds the span since t0 to counts.field. */
#define PFC_TADD(c, field, t0)                                                                     \
	do {                                                                                       \
		if ((c)->timing)                                                                   \
			(c)->counts.field += (uint64_t)(mono() - (t0));                            \
	} while (0)

/* util.h's clock, signed: deadlines here are int64_t with -1 for none, and
 * differences of two readings may be taken either way round. */
static inline int64_t mono(void)
{
	return (int64_t)now_ns();
}

/* The slot marks (pf_client.slot_mine), which a lane clears as it sends a
 * Release: atomics, so that the owner's test of a slot the daemon just
 * announced again sees the lane's clearing. */
static inline bool slot_marked(const struct pf_client *c, int32_t slot)
{
	return __atomic_load_n(&c->slot_mine[slot], __ATOMIC_ACQUIRE) != 0;
}

static inline void slot_mark(struct pf_client *c, int32_t slot, bool mine)
{
	__atomic_store_n(&c->slot_mine[slot], (uint8_t)mine, __ATOMIC_RELEASE);
}

/* ---- base.c: deadlines, errors, the raw write ---------------------------- */

int64_t pfc_deadline_after(int timeout_ms);
int pfc_ms_left(int64_t deadline);
int pfc_conn_fail(struct pf_client *c, int rc, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
int pfc_fail_dead(struct pf_client *c);
int pfc_sane_code(int32_t code);
int pfc_write_all(int sock, const uint8_t *frame, size_t len, int64_t deadline, uint64_t *sends);
/* From a release lane (settle.c): sends msg, unmarking slot first (when
 * >= 0), if the connection is still gen's and whole.  A send that fails
 * shuts the socket down, so that the owner's next read says the
 * connection broke; the lane touches nothing else of c. */
void pfc_send_for_gen(struct pf_client *c, Pf__Envelope *msg, uint64_t gen, int32_t slot);

/* ---- settle.c: the release lanes ----------------------------------------- */

/* Hands r (its event recorded, free_event set) to the lane of r->stream,
 * whose thread sends its Release once the event has completed.  0, or
 * -errno (no thread could start) with r still the caller's. */
int pfc_settle_queue(struct pf_client *c, struct pfc_release *r);
/* What a settled release held goes back: a client copy's device buffer to
 * the free stack, the event to the idle list; r is freed.  Trainer's
 * thread; the Release itself was sent (or is not to be). */
void pfc_release_dispose(struct pf_client *c, struct pfc_release *r);
/* Disposes of the settled releases: buffers and events back.  Cheap when
 * there are none (one atomic load). */
void pfc_settle_collect(struct pf_client *c);
/* The same after pfc_settle_fd polled readable: the eventfd is read too. */
void pfc_settle_woken(struct pf_client *c);
/* Blocks (no spinning) up to wait_ms, < 0 for no limit, until every queued
 * release has settled, then collects: 0, or -ETIMEDOUT. */
int pfc_settle_drain(struct pf_client *c, int wait_ms);
/* The releases still queued will settle without sending anything. */
void pfc_settle_forget(struct pf_client *c);
/* The eventfd written when a lane gives a device buffer back; -1: none. */
int pfc_settle_fd(const struct pf_client *c);
/* Stops the lanes, once what they wait for has run (pf_close synchronises
 * the device first), collects, and frees them. */
void pfc_settle_close(struct pf_client *c);

/* ---- conn.c: frames in and out ------------------------------------------- */

/* Sends env as it is, its id included (0: corked while the client is),
 * waiting until deadline for room: 0, or -errno. */
int pfc_send_env(struct pf_client *c, Pf__Envelope *env, int64_t deadline);
int pfc_next_frame(struct pf_client *c, Pf__Envelope **env);
/* Reads what the socket holds now into the receive buffer, without
 * waiting: 0 (nothing there is 0 too), or the error that broke the
 * connection. */
int pfc_fill_now(struct pf_client *c);
int pfc_read_env(struct pf_client *c, int64_t deadline, Pf__Envelope **env);
/* pfc_read_env that also returns -EAGAIN, with no frame, as soon as a
 * release lane has given a device buffer back (pfc_settle_fd): pf_next
 * waiting for a free buffer looks again. */
int pfc_read_env_or_buffer(struct pf_client *c, int64_t deadline, Pf__Envelope **env);
/* Whether the daemon's end of the socket is still open, asked without
 * waiting and without writing: 0, or the error that broke the connection
 * (as a failed write would have said). */
int pfc_check_peer(struct pf_client *c);
struct pf_client *pfc_client_new(const char *where);

/* ---- arena.c: arenas and pool slabs -------------------------------------- */

int pfc_add_arena(struct pf_client *c, const Pf__Arena *msg);
void pfc_unmap_arenas(struct pf_client *c, struct pfc_arena *arenas, uint32_t n);
int pfc_keep_pool(struct pf_client *c, const Pf__SessionOpened *so);
size_t pfc_staging_bytes(const struct pf_client *c);
void pfc_unmap_slabs(struct pf_client *c);
int pfc_add_pool_slab(struct pf_client *c, const Pf__PoolSlab *m);
int pfc_pool_slab_gone(struct pf_client *c, const Pf__PoolSlabGone *m);

/* ---- release.c: events, releases, client copies -------------------------- */

int pfc_event_get(struct pf_client *c, const char *what, struct pfc_event **out);
void pfc_event_put(void *event);
void pfc_free_batch(struct pfc_batch *b);
int pfc_send_release(struct pf_client *c, uint64_t epoch, uint64_t seq, int32_t slot);
void pfc_drop_untaken(struct pf_client *c, struct pfc_batch *b);
int pfc_release_queue(struct pf_client *c);
int pfc_release_after(struct pf_client *c, struct pfc_batch *b, void *stream);
bool pfc_can_take(const struct pf_client *c);
void pfc_free_dbufs(struct pf_client *c);
int pfc_copy_batch(struct pf_client *c, struct pfc_batch *b, bool ahead);
/* Client copies: starts the copies of the batches at the head of the queue,
 * up to PFC_COPY_AHEAD not taken yet.  0, or the error that broke the
 * connection. */
int pfc_copy_ahead(struct pf_client *c);

/* ---- batch.c: pushes, gathers, taking batches ---------------------------- */

int pfc_handle_push(struct pf_client *c, Pf__Envelope *env);
/* A frame no request waits for, taken: a push is handled, the late reply to
 * a request that timed out dropped. */
int pfc_handle_unasked(struct pf_client *c, Pf__Envelope *env);
/* Handles first (when not NULL; taken) and then every frame already
 * received, without a system call, the gathers of the batches among them
 * grouped into as few launches as may be: 0, or the error that broke the
 * connection. */
int pfc_take_in(struct pf_client *c, Pf__Envelope *first);
/* pfc_take_in(c, NULL). */
int pfc_read_buffered(struct pf_client *c);
/* Reads what the socket holds now, without waiting, and takes it in (as
 * pfc_read_buffered): 0, or the error that broke the connection. */
int pfc_read_now(struct pf_client *c);
/* Launches the gathers waiting in c->group (none on a broken connection,
 * whose queue is never taken from): 0, or the error that broke it. */
int pfc_gather_flush(struct pf_client *c);
int pfc_send_probe(struct pf_client *c);
/* CUDA sessions, at a release: acks the head of the queue now, with the
 * release's write, when it is a batch on the device (or on its way there),
 * so that the pf_next that takes it writes nothing (pfc_take).  The daemon
 * hears of the take one call early, as a trainer that releases a batch
 * takes the next at once.  0, or the error of a failed encoding. */
int pfc_ack_ahead(struct pf_client *c);
int pfc_take(struct pf_client *c, struct pf_batch **batch);
int pfc_wait_batch(struct pf_client *c, int64_t deadline, int timeout_ms, int64_t *blocked_since);

/* ---- call.c: requests and replies, hello, the session's requests --------- */

int pfc_hello(struct pf_client *c, int timeout_ms);
bool pfc_env_says_no(const char *name);
int pfc_send_open(struct pf_client *c, Pf__Envelope **reply);
int pfc_send_start(struct pf_client *c, uint64_t start_batch, const uint64_t *indices,
		   size_t nindices, uint64_t *batches);

/* One call reconnects at most this often before it returns the error: a
 * daemon that dies on the same request every time must not keep a call
 * spinning for ever (the next call tries again). */
#define RECONNECTS_PER_CALL 3

/* ---- reconnect.c: the session across daemon restarts --------------------- */

bool pfc_reconnecting(const struct pf_client *c);
void pfc_retired_put(struct pf_client *c, uint64_t gen);
void pfc_note_outage(struct pf_client *c);
int pfc_revive(struct pf_client *c, int64_t deadline);

#endif
