/*
 * prefetch.h — libprefetch, the trainer side of prefetchd.
 *
 * A trainer connects to the node's prefetchd, opens one session on a named
 * dataset, starts an epoch and takes batches.  Batches arrive in slots of
 * arenas the daemon shares with this process (read-only host memory for
 * device "host", device memory for "cuda:N"); per batch only a few numbers
 * cross the socket.
 *
 *   struct pf_client *c;
 *   struct pf_batch *b;
 *   pf_connect(NULL, &c);
 *   pf_open(c, &(struct pf_open_opts){ .dataset = "demo", .batch_size = 256 });
 *   pf_start_epoch(c, &(struct pf_epoch_opts){ .order = PF_ORDER_SHUFFLE, .seed = 1 }, NULL);
 *   while (pf_next(c, -1, &b) == 0 && b) {
 *           ... b->data[field] holds b->count samples of that field ...
 *           pf_release(c, b, NULL);
 *   }
 *   pf_close(c);
 *
 * The consumer side of the prefetch-depth governor runs here: taking a batch
 * acknowledges it (the daemon may prepare another), releasing returns its
 * slot, leaving an epoch early abandons it.  Time blocked in pf_next and
 * time spent between calls are measured and reported (stall accounting).
 *
 * Every function returns 0 or a negative errno-style code; pf_errmsg()
 * describes the last failure on that client.  Nothing here aborts or exits.
 * A client is not thread-safe: use it from one thread at a time.  (A CUDA
 * client runs threads of its own, which only wait for release events and
 * send Releases; see pf_release.)
 *
 * A daemon that dies.  Every wait in this library is a poll() on the
 * daemon's socket, and the kernel closes that socket when the daemon's
 * process ends, however it ends (SIGKILL included): a call blocked on the
 * daemon (pf_connect's hello, pf_open, pf_start_epoch, pf_next with any
 * timeout, -1 included, pf_set_depth, pf_abandon, pf_close's releases)
 * returns -ECONNRESET (or -EPIPE) as soon as the kernel has closed it,
 * measured in milliseconds for a host daemon (tests/integration/test_integration_restart.c),
 * and pf_errmsg() says "prefetchd at PATH went away (...)".  Every later
 * call returns the same error.  A daemon that is alive but does not answer
 * (stopped with SIGSTOP, wedged) is not dead: requests give up after 10 s
 * ($PREFETCHD_TIMEOUT_MS) with -ETIMEDOUT, hello after 5 s, and pf_next
 * waits as long as its timeout says (-1: for ever, as for a slow disk).
 * One that takes nothing the client sends for the request timeout ends the
 * connection with -ECONNABORTED (part of a frame may be out: the stream
 * cannot go on), never with -ETIMEDOUT, which means "call again".
 *
 * Daemon restart.  With pf_open_opts.reconnect_s > 0 a broken connection
 * is not the end of the session: the next call that needs the daemon
 * (pf_next, pf_start_epoch, pf_set_depth, pf_probe) connects to the same
 * socket again, with back-off (at once, then after 50 ms, doubling to 1 s
 * between tries), until reconnect_s have passed since the connection broke.
 * It opens the session again with the same options, maps the new daemon's
 * arenas, and starts the interrupted epoch again with the same order, seed,
 * rank and world at start_batch = the first batch the trainer had not taken
 * (pf_stats.resume_batch), under the same epoch number: pf_next goes on
 * with exactly the batches the trainer has not had, nothing lost or
 * repeated.  pf_next's timeout bounds the waits between tries (it returns
 * -ETIMEDOUT and the next call carries on); one try may take up to the
 * request timeout when a daemon accepts but does not answer.  A daemon that
 * answers but refuses the session (its dataset left the config, or now has
 * another shape) ends the reconnection at once, with its message.  When
 * reconnect_s runs out, every later call fails as without reconnection.
 *
 * Batches taken before the connection broke stay valid until released:
 * host sessions keep the old daemon's arena mapped (its memory is this
 * process's mapping of the memfd, which outlives the daemon) until the
 * last such batch is released.  Releasing one returns 0 and sends nothing
 * (its slot died with its daemon).  CUDA sessions keep the old import
 * mapped the same way, but whether the memory still holds the data depends
 * on the driver (a legacy IPC arena is freed with its exporter): treat a
 * device batch taken before a restart as gone, and only release it.  Without
 * reconnect_s, pf_release of a batch whose connection broke frees it and
 * returns the connection's error.
 */
#ifndef PREFETCH_H
#define PREFETCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define PF_API __attribute__((visibility("default")))
#else
#define PF_API
#endif

#define PF_DEFAULT_SOCKET "/run/prefetchd/prefetchd.sock"
/* Environment variable that overrides the default socket path. */
#define PF_SOCKET_ENV "PREFETCHD_SOCKET"

struct pf_client;

/* PF_ORDER_PACED: the epoch has no order; each batch is what the trainer
 * asks for with pf_load (custom samplers, weighted sampling, curricula),
 * delivered in request order; pf_load_end ends the epoch.
 * PF_ORDER_BLOCK_SHUFFLE: for datasets larger than memory, read from disk
 * in blocks of consecutive samples.  The blocks are shuffled, then the
 * samples of each window of window_blocks blocks among themselves, so a
 * sample stays within its window of the epoch (docs/SHUFFLE.md, "Block
 * shuffle", specifies it and says how well it mixes). */
enum pf_order {
	PF_ORDER_SEQUENTIAL = 0,
	PF_ORDER_SHUFFLE = 1,
	PF_ORDER_EXPLICIT = 2,
	PF_ORDER_PACED = 3,
	PF_ORDER_BLOCK_SHUFFLE = 4
};
enum pf_ipc { PF_IPC_DEFAULT = 0, PF_IPC_FD = 1, PF_IPC_LEGACY = 2 };

struct pf_open_opts {
	const char *dataset; /* a name from the daemon's config */
	const char *device;  /* NULL or "host": host memory; "cuda:N": GPU N */
	uint32_t batch_size;
	bool drop_last;	    /* drop the last, partial batch of each epoch */
	uint32_t augment;   /* 0/1: plain; k: picks range over k*N, sample = pick % N;
			     * k*N above the daemon's max_epoch_picks: -E2BIG */
	uint32_t min_depth; /* 0: daemon default */
	uint32_t max_depth; /* 0: daemon default */
	enum pf_ipc ipc;    /* CUDA sessions: how device arenas are shared */
	const char *name;   /* shown by prefetchctl status; NULL: program name */
	/* Longest time, in seconds, to keep trying to get the session back
	 * after the connection to the daemon broke (see "Daemon restart"
	 * above); 0: never, the first error is final. */
	double reconnect_s;
	/* Non-NULL and not "": join this uid's share of that name (or start
	 * it).  Sessions of one share get the same batches from one read (and
	 * on a GPU one device copy); see "Shares" below. */
	const char *share;
};

struct pf_epoch_opts {
	enum pf_order order;
	uint64_t seed;		 /* PF_ORDER_SHUFFLE: README's shuffle, this seed */
	uint32_t rank, world;	 /* DistributedSampler-style share; world 0 = 1 */
	uint64_t start_batch;	 /* resume: skip this many batches of the share */
	const uint64_t *indices; /* PF_ORDER_EXPLICIT: the picks, in order */
	size_t nindices;
	/* PF_ORDER_BLOCK_SHUFFLE only (set with another order: -EINVAL).  0
	 * is "not set", so no size can be 0.  The block size in samples
	 * (block_rows) or in bytes of a sample's fields (block_bytes, rounded
	 * down to whole samples, at least one), not both (-EINVAL); neither:
	 * 4 MiB of samples.  A block larger than the dataset is one block per
	 * copy of it.  window_blocks: blocks shuffled together, 0 = 16. */
	uint64_t block_rows;
	uint64_t block_bytes;
	uint64_t window_blocks;
};

struct pf_field {
	const char *name;
	const char *dtype; /* numpy type string: "f4", "u1", ... */
	int ndim;	   /* dimensions of one sample */
	const uint64_t *shape;
	uint64_t sample_bytes;
};

struct pf_batch {
	uint64_t epoch;	       /* the epoch's number (see pf_start_epoch) */
	uint64_t seq;	       /* batch number within the epoch's share */
	uint32_t count;	       /* samples in this batch */
	const uint64_t *picks; /* count picks (schedule-space indices) */
	uint32_t nfields;
	/* Per field, `count` samples packed back to back.  Host sessions: a
	 * read-only host pointer.  CUDA sessions: a device pointer in this
	 * process's context, valid until pf_release. */
	void *const *data;
	bool on_device;
};

struct pf_stats {
	uint64_t session;      /* the daemon's id for this session */
	uint64_t batches;      /* taken by pf_next */
	uint64_t bytes;	       /* sample bytes taken */
	uint64_t held;	       /* taken and not yet released */
	double wait_s;	       /* time blocked inside pf_next */
	double busy_s;	       /* time between pf_next calls */
	double stall_fraction; /* wait / (wait + busy) */
	uint64_t reconnects;   /* times the session was opened again after the
				* daemon went away (reconnect_s) */
	uint64_t resume_batch; /* the first batch of the current epoch's share
				* not taken yet: the start_batch that resumes it
				* (what a reconnection uses; a trainer that starts
				* a new client itself can use it too) */
};

/* Connects and says hello.  path NULL: $PREFETCHD_SOCKET, else the default. */
PF_API int pf_connect(const char *path, struct pf_client **out);
/* Opens the session.  One session per client. */
PF_API int pf_open(struct pf_client *c, const struct pf_open_opts *opts);
/* Dataset shape, valid after pf_open until pf_close. */
PF_API uint64_t pf_num_samples(const struct pf_client *c);
PF_API uint32_t pf_num_fields(const struct pf_client *c);
PF_API int pf_field_info(const struct pf_client *c, uint32_t i, struct pf_field *out);
/* Starts an epoch (abandoning an unfinished one).  *batches (may be NULL)
 * receives the number of batches this share will deliver from start_batch.
 *
 * Epoch numbers.  A session's first epoch is epoch 0 and each later one is
 * one more than the last, unless pf_set_epoch chose the next one's number.
 * That number is the one pf_batch.epoch carries, `prefetchctl status`
 * shows and the daemon's messages name ("epoch 3 batch 7: ..."), and the
 * Python binding passes its own: Loader.epoch(n) and set_epoch(n) are
 * epoch n everywhere.  Numbers only grow within a session (the protocol's
 * rule, which keeps a straggling message of an earlier epoch from counting
 * against a later one); a start the daemon refused leaves its number
 * unused. */
PF_API int pf_start_epoch(struct pf_client *c, const struct pf_epoch_opts *opts, uint64_t *batches);
/* The number the next pf_start_epoch gives its epoch (a trainer's own
 * epoch counter, as DistributedSampler.set_epoch takes it).  -EINVAL when
 * it is not above the last epoch this session started. */
PF_API int pf_set_epoch(struct pf_client *c, uint64_t epoch);
/* Takes the next batch.  timeout_ms < 0 waits for ever.  A CUDA batch is
 * complete when this returns, whatever stream reads it: a copy or gather
 * this library ran for it (pf_next_stream) has been waited for on the CPU.
 * A trainer that names its stream with pf_next_stream waits on the GPU
 * instead.  Returns 0 with
 * *batch set, 0 with *batch NULL at the end of the epoch, -ETIMEDOUT, the
 * error of an error batch (e.g. -EIO; pf_errmsg says which file and which
 * batch; the epoch goes on with the next call), or the connection's error
 * (-ECONNRESET when the daemon went away and reconnect_s is 0 or spent). */
PF_API int pf_next(struct pf_client *c, int timeout_ms, struct pf_batch **batch);
/* Whether the last pf_next, pf_next_stream or pf_release_next failed with
 * an error batch (a read error, a file changed on disk, a paced request
 * out of range): the epoch goes on with the next call, and a trainer may
 * skip it.  False after any other failure (the connection's, a timeout,
 * a bad argument) and after a success. */
PF_API bool pf_error_batch(const struct pf_client *c);
/* pf_next for a CUDA session whose trainer uses its batches on `stream`
 * (a cudaStream_t; NULL: the legacy default stream, which every blocking
 * stream waits for).  This library assembles a pooled batch (the gather)
 * or copies a batch from host arenas (a session without a pool) in the
 * trainer's context, on a stream of its own: `stream` is made to wait for
 * that (cuStreamWaitEvent; the CPU does not block), so work queued on it
 * after this returns sees the data.  Use the batch on another
 * non-blocking stream only after making that one wait for `stream`.
 * Copies from host arenas and gathers start ahead of the trainer (as
 * batches arrive, and when one is released: a release reads the socket
 * without waiting when fewer than two batches are queued), so a ready
 * batch is usually on the device already when this is called. */
PF_API int pf_next_stream(struct pf_client *c, int timeout_ms, void *stream,
			  struct pf_batch **batch);
/* pf_release(c, release, stream) when release is not NULL, then
 * pf_next_stream(c, timeout_ms, stream, batch): the loop of a trainer that
 * gives back the batch it trained on as it takes the next, in one call
 * (the Python binding's).  A failed release returns its error and takes
 * nothing. */
PF_API int pf_release_next(struct pf_client *c, struct pf_batch *release, void *stream,
			   int timeout_ms, struct pf_batch **batch);
/* Gives the batch's slot back.  stream: the cudaStream_t whose queued work
 * still reads the batch (CUDA sessions; NULL = the legacy default stream),
 * ignored for host sessions.  The batch must not be used afterwards.  A
 * CUDA release never waits for the GPU: an event is recorded on stream,
 * and a thread of this library (one per stream released on, started with
 * the first release there) waits for it asleep and sends the Release when
 * the work has retired, whether or not the trainer calls in.  A batch of a
 * connection that broke: see "Daemon restart" above. */
PF_API int pf_release(struct pf_client *c, struct pf_batch *batch, void *stream);
/* Target depth of a session: target 0 means automatic.  session 0: own. */
PF_API int pf_set_depth(struct pf_client *c, uint64_t session, uint32_t target);
/* CUDA sessions: reports the device's free memory now, as the periodic
 * probe does.  Call it when the trainer's own memory use has changed (a
 * larger model, an evaluation pass): the daemon resizes the depth and the
 * VRAM pool at once.  -EINVAL for a host session. */
PF_API int pf_probe(struct pf_client *c);
/* Paced epochs: asks for one batch of these picks (1 .. batch_size of
 * them, each below augment * N).  Returns at once; the daemon loads
 * `target` requested batches ahead and pf_next delivers them in request
 * order.  A request the daemon cannot serve (a pick out of range, too many
 * picks) arrives as an error batch in its place.  -EAGAIN when
 * PF_PACED_MAX batches are requested and not yet taken: take one first.
 * Paced epochs are not resumed after a daemon restart (their requests went
 * with it): the next call fails, even with reconnect_s. */
#define PF_PACED_MAX 1024
PF_API int pf_load(struct pf_client *c, const uint64_t *picks, size_t n);
/* Paced epochs: no more requests; pf_next returns NULL after the last. */
PF_API int pf_load_end(struct pf_client *c);
/* Leaves the current epoch early: the daemon stops filling at once.  While
 * a reconnecting client is cut off it only forgets the epoch (0): the
 * daemon that was filling it is gone. */
PF_API int pf_abandon(struct pf_client *c);
PF_API int pf_stats(const struct pf_client *c, struct pf_stats *out);
/* Releases everything, unmaps every arena, closes the socket, frees c. */
PF_API void pf_close(struct pf_client *c);
/* The last failure on c, or "" ("out of memory" when c is NULL). */
PF_API const char *pf_errmsg(const struct pf_client *c);

#ifdef __cplusplus
}
#endif
#endif
