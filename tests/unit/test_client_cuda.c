/*
 * test_client_cuda.c — libprefetch's device paths (pool gathers and their
 * group launch, client copies, releases behind the trainer's stream, pool
 * slabs mapped and dropped) against a scripted fake daemon, on the fake
 * CUDA side (tests/mocks/pfcuda_fake.c), so that CI covers them with no GPU.
 *
 * The fake daemon runs in a thread on the other end of a socketpair and
 * speaks the real protocol with the real framing (proto/wire.c), as
 * test_client.c's does for host sessions, but opens CUDA sessions the way
 * daemon/sess/sess_cuda.c does:
 *  - pooled (SessionOpened.pool): one device arena (a memfd, sent as
 *    ARENA_CUDA_FD or as a legacy handle of the fake) whose slots carry a
 *    tail for the batch's index and staged rows; three pool slabs
 *    (PoolSlab at the first StartEpoch) holding every sample's record at a
 *    permuted place; BatchReady{gather} with the ids inline when every row
 *    is a hit, else the index and the misses written into the slot's tail;
 *  - client copies (SessionOpened.client_copy): a sealed host memfd arena,
 *    each slot filled with its batch, for the client to copy.
 * It pushes under the governor's rule (sent - acked < target, a free slot),
 * and every batch it may send at a moment goes out in one write, with the
 * EpochStarted reply for the first ones: batches that arrive together are
 * read together, as from the real daemon's send queue.  It checks that every
 * Release names a slot it holds for that batch, and at the end that every
 * slot came back.
 *
 * The test plays the trainer: it takes batches on its own streams (handles
 * the fake CUDA side keys its streams by), queues its reads of them there,
 * and compares what the reads saw with the samples of the batch's picks.
 * Since the fake runs device work only when something forces it, a read
 * sees the right bytes only if the client ordered it after the batch's
 * gather or copy, and only if nothing rewrote the memory before the read
 * ran.
 */
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "client_int.h"
#include "gather.h"
#include "pfcuda_fake.h"
#include "prefetch.h"
#include "prefetch.pb-c.h"
#include "wire.h"

#define BATCH	    8
#define MAX_SAMPLES 96
#define X_BYTES	    16 /* field x: f4[4] */
#define Y_BYTES	    8  /* field y: i8 */
#define X_OFFSET    0
#define Y_OFFSET    256
#define SLOT_BYTES  (Y_OFFSET + BATCH * Y_BYTES)
/* A device slot of a pooled session: the samples, then the tail where the
 * daemon stages the batch's index and its misses (sess_cuda.c's tail_off):
 * the index at TAIL_OFF, staged x at TAIL_OFF + TAIL_X, staged y at
 * TAIL_OFF + TAIL_Y. */
#define TAIL_OFF    512
#define TAIL_X	    128
#define TAIL_Y	    384
#define DEV_STRIDE  1024
#define HOST_STRIDE 512	       /* a host slot (client copies) */
#define SLOT_BASE   4096       /* slot s at SLOT_BASE + s * stride: not at 0 */
#define ARENA_BYTES (2u << 20) /* one allocation granule */
#define MAX_SLOTS   16
/* The pool: records of 48 bytes, x at 8 and y at 32, 16 to a slab. */
#define REC_STRIDE 48
#define REC_X	   8
#define REC_Y	   32
#define SLAB_SHIFT 4
#define PER_SLAB   (1u << SLAB_SHIFT)
#define NSLABS	   3
#define NO_ENTRY   UINT64_MAX
#define SESSION_ID 9
/* The trainer's streams (handles the fake keys its streams by). */
#define STREAM_S ((void *)0x5100)
#define STREAM_T ((void *)0x5200)

/* ---- the samples ------------------------------------------------------------ */

static void sample_x(uint64_t s, uint8_t out[X_BYTES])
{
	float x[4];

	for (int i = 0; i < 4; i++)
		x[i] = (float)(s * 10 + (uint64_t)i);
	memcpy(out, x, sizeof(x));
}

static void sample_y(uint64_t s, uint8_t out[Y_BYTES])
{
	int64_t y = (int64_t)s * 1000 + 7;

	memcpy(out, &y, sizeof(y));
}

/* Where sample s lies in the pool: permuted, so that an entry id is never
 * the sample's own number. */
static uint64_t first_entry(uint64_t s)
{
	uint64_t pos = (s * 7 + 3) % (NSLABS * PER_SLAB);

	return (pos / PER_SLAB) << SLAB_SHIFT | pos % PER_SLAB;
}

/* ---- the fake daemon ------------------------------------------------------------ */

enum mode {
	POOL_FD,     /* pooled, FD arena and slabs */
	POOL_LEGACY, /* pooled, legacy IPC handles */
	CLIENT_COPY, /* no pool: host arenas the client copies from */
};

enum ev_kind {
	EV_OPEN,
	EV_START,
	EV_ACK,
	EV_RELEASE,
	EV_SENT, /* a BatchReady pushed */
	EV_PROBE,
	EV_SLAB, /* a PoolSlab pushed */
	EV_GONE, /* a PoolSlabGone pushed */
	EV_SET_DEPTH,
	EV_EOF,
	EV_KINDS
};

struct ev {
	enum ev_kind kind;
	uint64_t epoch;
	uint64_t seq;
	int32_t slot;
	uint64_t gathers; /* EV_RELEASE: batches the fake device had gathered by then */
};

/* A rule of the 4-byte forms that the first batch of a narrow fake breaks,
 * for the client to refuse (check_data_batch, check_gather). */
enum bad {
	BAD_NONE,
	BAD_PICKS32_LEN,  /* picks_le32 one pick short */
	BAD_PICKS_BOTH,	  /* picks_le32 and picks_le */
	BAD_IDS32_LEN,	  /* gather_ids32 one id long */
	BAD_IDS32_STAGED, /* gather_ids32 on a batch with a staged row */
	BAD_IDS_BOTH,	  /* gather_ids32 and gather_ids */
};

struct script {
	enum mode mode;
	/* Pooled: picks and inline ids as 4 bytes (picks_le32, gather_ids32),
	 * as the daemon sends them to a client that asked (it must have);
	 * with mixed, only on even batches: batches of both widths arrive
	 * in one read. */
	bool narrow, mixed;
	enum bad bad;
	uint32_t samples;   /* N; default 44: five batches and one of 4 */
	uint32_t target;    /* governor depth; default 4 */
	uint32_t slots;	    /* default 6 */
	uint32_t pool_rows; /* pooled: samples below this are in the pool; default all */
	/* PoolSlabGone of slab 1 right after the epoch's first batches, in
	 * their write: the client reads it in the same pass. */
	bool gone_with_first;
};

struct fake {
	struct script s;
	int fd; /* owned: the daemon's end of the socketpair */
	pthread_t thread;
	int arena_fd;	/* owned: the device arena, or the host arena */
	uint8_t *arena; /* owned mapping, read-write */
	int slab_fd[NSLABS];
	uint8_t *slab[NSLABS];
	uint32_t slab_gen[NSLABS];
	uint64_t entry[MAX_SAMPLES]; /* each sample's pool entry, or NO_ENTRY: a miss */
	uint8_t *obuf;		     /* owned: frames waiting for one write */
	size_t olen, ocap;

	/* Thread state. */
	bool slabs_sent, gone_sent;
	bool running, end_sent;
	uint64_t epoch, next_seq, nbatches, npicks, sent, acked;
	uint64_t picks[MAX_SAMPLES];
	struct {
		bool busy;
		uint64_t epoch, seq;
	} slot[MAX_SLOTS];

	pthread_mutex_t mu; /* guards everything below */
	bool stop;
	int cmd_gone;	 /* the test asks: PoolSlabGone of this slab (-1: no) */
	int cmd_replace; /* ... a new generation of this slab (-1: no) */
	struct ev log[4096];
	int nlog;
	char failed[256]; /* non-empty: the fake saw something it did not expect */
	/* The fake GPU's live counts before the client (a test that failed
	 * half-way leaves its client's behind). */
	int live_maps0, live_events0;
};

static int64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void fake_log(struct fake *f, struct ev e)
{
	pthread_mutex_lock(&f->mu);
	if (f->nlog < (int)(sizeof(f->log) / sizeof(f->log[0])))
		f->log[f->nlog++] = e;
	pthread_mutex_unlock(&f->mu);
}

static void fake_fail(struct fake *f, const char *fmt, ...)
{
	va_list ap;

	pthread_mutex_lock(&f->mu);
	if (!f->failed[0]) {
		va_start(ap, fmt);
		vsnprintf(f->failed, sizeof(f->failed), fmt, ap);
		va_end(ap);
	}
	pthread_mutex_unlock(&f->mu);
}

/* Sends the frames waiting in obuf, in one write. */
static void fake_flush(struct fake *f)
{
	int rc;

	if (!f->olen)
		return;
	rc = wire_send_all(f->fd, f->obuf, f->olen, -1);
	if (rc && rc != -EPIPE && rc != -ECONNRESET)
		fake_fail(f, "send failed: %s", strerror(-rc));
	f->olen = 0;
}

/* Queues env for the next write. */
static void fake_emit(struct fake *f, const Pf__Envelope *env)
{
	size_t len = wire_frame_size(env);

	if (f->olen + len > f->ocap) {
		size_t cap = f->ocap ? f->ocap : 4096;
		uint8_t *t;

		while (cap < f->olen + len)
			cap *= 2;
		t = realloc(f->obuf, cap);
		if (!t) {
			fake_fail(f, "out of memory");
			return;
		}
		f->obuf = t;
		f->ocap = cap;
	}
	wire_encode_into(env, f->obuf + f->olen, len);
	f->olen += len;
}

/* Sends env with fd on its first byte, after what waits (fds go on the
 * frame that names them, in order). */
static void fake_emit_fd(struct fake *f, const Pf__Envelope *env, int fd)
{
	uint8_t *frame;
	size_t len;
	int rc;

	fake_flush(f);
	rc = wire_encode(env, &frame, &len);
	if (!rc) {
		rc = wire_send_all(f->fd, frame, len, fd);
		free(frame);
	}
	if (rc && rc != -EPIPE && rc != -ECONNRESET)
		fake_fail(f, "send with an fd failed: %s", strerror(-rc));
}

static bool pooled(const struct fake *f)
{
	return f->s.mode != CLIENT_COPY;
}

static int new_memfd(const char *name, bool seal, uint8_t **map)
{
	int fd = memfd_create(name, MFD_CLOEXEC | (seal ? MFD_ALLOW_SEALING : 0));

	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, ARENA_BYTES), 0);
	if (seal)
		assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
	*map = mmap(NULL, ARENA_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	assert_true(*map != MAP_FAILED);
	return fd;
}

/* Writes the record of sample s at entry e of slab memory base. */
static void write_record(uint8_t *base, uint64_t e, uint64_t s)
{
	uint8_t *rec = base + (e & (PER_SLAB - 1)) * REC_STRIDE;

	sample_x(s, rec + REC_X);
	sample_y(s, rec + REC_Y);
}

static void push_slab(struct fake *f, uint32_t j)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__PoolSlab msg = PF__POOL_SLAB__INIT;
	uint8_t handle[PFCUDA_IPC_HANDLE_BYTES];

	msg.id = j;
	msg.gen = f->slab_gen[j];
	msg.bytes = ARENA_BYTES;
	env.msg_case = PF__ENVELOPE__MSG_POOL_SLAB;
	env.pool_slab = &msg;
	if (f->s.mode == POOL_FD) {
		msg.kind = PF__ARENA_KIND__ARENA_CUDA_FD;
		fake_emit_fd(f, &env, f->slab_fd[j]);
	} else {
		msg.kind = PF__ARENA_KIND__ARENA_CUDA_LEGACY;
		if (pfcuda_fake_ipc_handle(f->slab_fd[j], handle))
			fake_fail(f, "no IPC handle for slab %u", j);
		msg.legacy_handle.data = handle;
		msg.legacy_handle.len = sizeof(handle);
		fake_emit(f, &env);
	}
	fake_log(f, (struct ev){.kind = EV_SLAB, .seq = j, .slot = (int32_t)msg.gen});
}

/* The pool gives slab j back: its samples are misses from now on. */
static void slab_gone(struct fake *f, uint32_t j)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__PoolSlabGone msg = PF__POOL_SLAB_GONE__INIT;

	msg.id = j;
	msg.gen = f->slab_gen[j];
	env.msg_case = PF__ENVELOPE__MSG_POOL_SLAB_GONE;
	env.pool_slab_gone = &msg;
	fake_emit(f, &env);
	for (uint32_t s = 0; s < f->s.samples; s++)
		if (f->entry[s] != NO_ENTRY && f->entry[s] >> SLAB_SHIFT == j)
			f->entry[s] = NO_ENTRY;
	fake_log(f, (struct ev){.kind = EV_GONE, .seq = j});
}

/* A new allocation in place of slab j, its records at other places: a
 * client that still read the old one would read other samples.  The old
 * memfd lives on in the client's mapping until it lets go. */
static void slab_replace(struct fake *f, uint32_t j)
{
	uint8_t *map;
	int fd = new_memfd("pf-fake-slab", false, &map);

	memset(map, 0xCD, ARENA_BYTES);
	for (uint32_t s = 0; s < f->s.samples; s++) {
		if (f->entry[s] == NO_ENTRY || f->entry[s] >> SLAB_SHIFT != j)
			continue;
		f->entry[s] = (uint64_t)j << SLAB_SHIFT | ((f->entry[s] + 5) & (PER_SLAB - 1));
		write_record(map, f->entry[s], s);
	}
	munmap(f->slab[j], ARENA_BYTES);
	close(f->slab_fd[j]);
	f->slab[j] = map;
	f->slab_fd[j] = fd;
	f->slab_gen[j]++;
	push_slab(f, j);
}

static int free_slot(const struct fake *f)
{
	for (uint32_t i = 0; i < f->s.slots; i++)
		if (!f->slot[i].busy)
			return (int)i;
	return -1;
}

static uint32_t count_of(const struct fake *f, uint64_t seq)
{
	uint64_t left = f->npicks - seq * BATCH;

	return left < BATCH ? (uint32_t)left : BATCH;
}

/* Fills a free slot with batch next_seq (as a real daemon's copy would
 * have by now) and queues its BatchReady. */
static void emit_batch(struct fake *f, int slot)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__BatchReady msg = PF__BATCH_READY__INIT;
	const uint64_t seq = f->next_seq, *picks = &f->picks[seq * BATCH];
	const uint32_t count = count_of(f, seq);
	const bool narrow = f->s.narrow && (!f->s.mixed || seq % 2 == 0);
	uint64_t desc[BATCH], staged_off[2];
	/* One more: BAD_IDS32_LEN sends 4 bytes past the batch's ids. */
	uint32_t picks32[BATCH], desc32[BATCH + 1] = {0};
	uint32_t nstaged = 0;
	uint64_t off;

	f->slot[slot].busy = true;
	f->slot[slot].epoch = f->epoch;
	f->slot[slot].seq = seq;
	msg.epoch = f->epoch;
	msg.seq = seq;
	msg.slot = slot;
	msg.arena = 0;
	msg.count = count;
	if (narrow) {
		for (uint32_t j = 0; j < count; j++)
			picks32[j] = htole32((uint32_t)picks[j]);
		msg.picks_le32.data = (uint8_t *)picks32;
		msg.picks_le32.len = count * sizeof(uint32_t);
	} else {
		msg.picks_le.data = (uint8_t *)picks;
		msg.picks_le.len = count * sizeof(uint64_t);
	}
	if (pooled(f)) {
		uint8_t *tail;

		off = SLOT_BASE + (uint64_t)slot * DEV_STRIDE;
		tail = f->arena + off + TAIL_OFF;
		/* What the slot held means nothing now: only the client's
		 * gather may make it this batch. */
		memset(f->arena + off, 0xAB, SLOT_BYTES);
		for (uint32_t j = 0; j < count; j++) {
			uint64_t s = picks[j];

			if (f->entry[s] != NO_ENTRY) {
				desc[j] = f->entry[s];
				continue;
			}
			desc[j] = GPU_GATHER_STAGED | nstaged;
			sample_x(s, tail + TAIL_X + nstaged * X_BYTES);
			sample_y(s, tail + TAIL_Y + nstaged * Y_BYTES);
			nstaged++;
		}
		staged_off[0] = off + TAIL_OFF + TAIL_X;
		staged_off[1] = off + TAIL_OFF + TAIL_Y;
		msg.gather = true;
		msg.gather_desc = off + TAIL_OFF;
		msg.nstaged = nstaged;
		msg.n_staged_off = 2;
		msg.staged_off = staged_off;
		if (nstaged) {
			memcpy(tail, desc, count * sizeof(uint64_t));
		} else {
			/* The ids travel in the message: the tail holds
			 * nothing the client may read instead. */
			memset(tail, 0xFF, count * sizeof(uint64_t));
			for (uint32_t j = 0; narrow && j < count; j++)
				desc32[j] = htole32((uint32_t)desc[j]);
			if (narrow) {
				msg.gather_ids32.data = (uint8_t *)desc32;
				msg.gather_ids32.len = count * sizeof(uint32_t);
			} else {
				msg.gather_ids.data = (uint8_t *)desc;
				msg.gather_ids.len = count * sizeof(uint64_t);
			}
		}
	} else {
		off = SLOT_BASE + (uint64_t)slot * HOST_STRIDE;
		memset(f->arena + off, 0xAB, SLOT_BYTES);
		for (uint32_t j = 0; j < count; j++) {
			sample_x(picks[j], f->arena + off + X_OFFSET + j * X_BYTES);
			sample_y(picks[j], f->arena + off + Y_OFFSET + j * Y_BYTES);
		}
	}
	msg.offset = off;
	if (seq == 0) {
		switch (f->s.bad) {
		case BAD_NONE: break;
		case BAD_PICKS32_LEN: msg.picks_le32.len -= sizeof(uint32_t); break;
		case BAD_PICKS_BOTH:
			msg.picks_le.data = (uint8_t *)picks;
			msg.picks_le.len = count * sizeof(uint64_t);
			break;
		case BAD_IDS32_LEN: msg.gather_ids32.len += sizeof(uint32_t); break;
		case BAD_IDS32_STAGED: msg.nstaged = 1; break;
		case BAD_IDS_BOTH:
			msg.gather_ids.data = (uint8_t *)desc;
			msg.gather_ids.len = count * sizeof(uint64_t);
			break;
		}
	}
	env.msg_case = PF__ENVELOPE__MSG_BATCH;
	env.batch = &msg;
	fake_emit(f, &env);
	fake_log(f, (struct ev){.kind = EV_SENT, .epoch = f->epoch, .seq = seq, .slot = slot});
	f->next_seq++;
	f->sent++;
}

/* Pushes what the test asked for and what the governor allows now, in
 * one write.  True when it sent something. */
static bool fake_pump(struct fake *f)
{
	bool did = false;
	int gone, replace, slot;

	pthread_mutex_lock(&f->mu);
	gone = f->cmd_gone;
	replace = f->cmd_replace;
	f->cmd_gone = f->cmd_replace = -1;
	pthread_mutex_unlock(&f->mu);
	if (gone >= 0) {
		slab_gone(f, (uint32_t)gone);
		did = true;
	}
	if (replace >= 0) {
		slab_replace(f, (uint32_t)replace);
		did = true;
	}
	while (f->running && f->next_seq < f->nbatches && f->sent - f->acked < f->s.target &&
	       (slot = free_slot(f)) >= 0) {
		emit_batch(f, slot);
		did = true;
	}
	if (f->s.gone_with_first && !f->gone_sent && f->sent) {
		f->gone_sent = true;
		slab_gone(f, 1);
	}
	if (f->running && f->next_seq == f->nbatches && !f->end_sent) {
		Pf__Envelope env = PF__ENVELOPE__INIT;
		Pf__EpochEnd end = PF__EPOCH_END__INIT;

		end.epoch = f->epoch;
		end.batches = f->nbatches;
		env.msg_case = PF__ENVELOPE__MSG_END;
		env.end = &end;
		fake_emit(f, &env);
		f->end_sent = true;
		did = true;
	}
	fake_flush(f);
	return did;
}

static void fake_open(struct fake *f, const Pf__OpenSession *req, uint64_t id)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__SessionOpened so = PF__SESSION_OPENED__INIT;
	Pf__Field x = PF__FIELD__INIT, y = PF__FIELD__INIT;
	Pf__Field *fields[] = {&x, &y};
	Pf__PoolLayout pl = PF__POOL_LAYOUT__INIT;
	uint32_t rec_off[] = {REC_X, REC_Y}, row_bytes[] = {X_BYTES, Y_BYTES};
	uint64_t xshape[] = {4};
	Pf__Arena arena = PF__ARENA__INIT;
	uint8_t handle[PFCUDA_IPC_HANDLE_BYTES];

	if (strcmp(req->device, "cuda:0") || strcmp(req->pci_bus_id, "0000:10:00.0") ||
	    !req->gather)
		fake_fail(f, "open of %s (%s), gather %d: not the fake GPU's CUDA session",
			  req->device, req->pci_bus_id, req->gather);
	if (f->s.mode == CLIENT_COPY && !req->client_copy)
		fake_fail(f, "the client did not offer to copy");
	if (f->s.narrow && !req->narrow)
		fake_fail(f, "the client did not ask for 4-byte picks and ids");
	x.name = "x";
	x.dtype = "f4";
	x.n_shape = 1;
	x.shape = xshape;
	x.sample_bytes = X_BYTES;
	x.offset = X_OFFSET;
	y.name = "y";
	y.dtype = "i8";
	y.sample_bytes = Y_BYTES;
	y.offset = Y_OFFSET;
	so.session = SESSION_ID;
	so.num_samples = f->s.samples;
	so.n_fields = 2;
	so.fields = fields;
	so.slot_bytes = SLOT_BYTES;
	so.slots = f->s.slots;
	so.target = f->s.target;
	so.device = "cuda:0";
	if (pooled(f)) {
		pl.n_rec_off = pl.n_row_bytes = 2;
		pl.rec_off = rec_off;
		pl.row_bytes = row_bytes;
		pl.rec_stride = REC_STRIDE;
		pl.slab_shift = SLAB_SHIFT;
		so.pool = &pl;
	} else {
		so.client_copy = true;
	}
	env.id = id;
	env.msg_case = PF__ENVELOPE__MSG_OPENED;
	env.opened = &so;
	fake_emit(f, &env);

	arena.id = 0;
	arena.bytes = ARENA_BYTES;
	env.id = 0;
	env.msg_case = PF__ENVELOPE__MSG_ARENA;
	env.arena = &arena;
	if (f->s.mode == POOL_LEGACY) {
		arena.kind = PF__ARENA_KIND__ARENA_CUDA_LEGACY;
		arena.device = 0;
		if (pfcuda_fake_ipc_handle(f->arena_fd, handle))
			fake_fail(f, "no IPC handle for the arena");
		arena.legacy_handle.data = handle;
		arena.legacy_handle.len = sizeof(handle);
		fake_emit(f, &env);
	} else {
		arena.kind = f->s.mode == POOL_FD ? PF__ARENA_KIND__ARENA_CUDA_FD
						  : PF__ARENA_KIND__ARENA_HOST_MEMFD;
		arena.device = f->s.mode == POOL_FD ? 0 : -1;
		fake_emit_fd(f, &env, f->arena_fd);
	}
}

/* The fake's own shuffle (the daemon's is not the point here). */
static void shuffle(uint64_t *picks, uint64_t n, uint64_t seed)
{
	uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;

	for (uint64_t i = n; i > 1; i--) {
		uint64_t j, t;

		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		j = x % i;
		t = picks[i - 1];
		picks[i - 1] = picks[j];
		picks[j] = t;
	}
}

static void fake_start_epoch(struct fake *f, const Pf__StartEpoch *st, uint64_t id)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__EpochStarted reply = PF__EPOCH_STARTED__INIT;

	fake_log(f, (struct ev){.kind = EV_START, .epoch = st->epoch});
	if (st->order == PF__ORDER__ORDER_EXPLICIT) {
		if (st->n_indices > MAX_SAMPLES)
			fake_fail(f, "too many indices");
		f->npicks = st->n_indices < MAX_SAMPLES ? st->n_indices : MAX_SAMPLES;
		memcpy(f->picks, st->indices, f->npicks * sizeof(uint64_t));
	} else {
		f->npicks = f->s.samples;
		for (uint64_t i = 0; i < f->npicks; i++)
			f->picks[i] = i;
		if (st->order == PF__ORDER__ORDER_SHUFFLE)
			shuffle(f->picks, f->npicks, st->seed);
	}
	for (uint64_t i = 0; i < f->npicks; i++)
		if (f->picks[i] >= f->s.samples)
			fake_fail(f, "pick %llu out of range", (unsigned long long)f->picks[i]);
	/* The slabs go at the first StartEpoch (sess_cuda_push_pool), before
	 * the reply: every batch that reads them comes after. */
	if (pooled(f) && !f->slabs_sent) {
		f->slabs_sent = true;
		for (uint32_t j = 0; j < NSLABS; j++)
			push_slab(f, j);
	}
	/* A running epoch is abandoned; its slots come back as released. */
	f->epoch = st->epoch;
	f->nbatches = (f->npicks + BATCH - 1) / BATCH;
	f->next_seq = st->start_batch;
	f->sent = f->acked = 0;
	f->running = true;
	f->end_sent = false;
	reply.epoch = st->epoch;
	reply.batches = f->nbatches - st->start_batch;
	reply.samples = f->npicks;
	env.id = id;
	env.msg_case = PF__ENVELOPE__MSG_STARTED;
	env.started = &reply;
	fake_emit(f, &env);
}

static void fake_handle(struct fake *f, const Pf__Envelope *env)
{
	Pf__Envelope out = PF__ENVELOPE__INIT;

	switch (env->msg_case) {
	case PF__ENVELOPE__MSG_HELLO: {
		Pf__HelloReply hr = PF__HELLO_REPLY__INIT;

		hr.version = WIRE_VERSION;
		hr.daemon = "fake 0.0";
		hr.max_frame = 1 << 20;
		out.id = env->id;
		out.msg_case = PF__ENVELOPE__MSG_HELLO_REPLY;
		out.hello_reply = &hr;
		fake_emit(f, &out);
		break;
	}
	case PF__ENVELOPE__MSG_OPEN:
		fake_log(f, (struct ev){.kind = EV_OPEN});
		fake_open(f, env->open, env->id);
		break;
	case PF__ENVELOPE__MSG_START: fake_start_epoch(f, env->start, env->id); break;
	case PF__ENVELOPE__MSG_ACK:
		fake_log(f, (struct ev){.kind = EV_ACK,
					.epoch = env->ack->epoch,
					.seq = env->ack->seq});
		if (env->ack->epoch == f->epoch)
			f->acked++;
		break;
	case PF__ENVELOPE__MSG_RELEASE: {
		const Pf__Release *r = env->release;
		struct pfcuda_fake_counts k;

		pfcuda_fake_counts(&k);
		fake_log(f, (struct ev){.kind = EV_RELEASE,
					.epoch = r->epoch,
					.seq = r->seq,
					.slot = r->slot,
					.gathers = k.gathers_run});
		if (r->slot < 0 || (uint32_t)r->slot >= f->s.slots || !f->slot[r->slot].busy ||
		    f->slot[r->slot].epoch != r->epoch || f->slot[r->slot].seq != r->seq)
			fake_fail(f,
				  "release of slot %d (epoch %llu batch %llu), which the client "
				  "does not hold for that batch",
				  r->slot, (unsigned long long)r->epoch,
				  (unsigned long long)r->seq);
		else
			f->slot[r->slot].busy = false;
		break;
	}
	case PF__ENVELOPE__MSG_PROBE: fake_log(f, (struct ev){.kind = EV_PROBE}); break;
	case PF__ENVELOPE__MSG_ABANDON:
	case PF__ENVELOPE__MSG_SET_DEPTH: {
		Pf__Ok ok = PF__OK__INIT;

		if (env->msg_case == PF__ENVELOPE__MSG_ABANDON)
			f->running = false;
		else
			fake_log(f, (struct ev){.kind = EV_SET_DEPTH});
		out.id = env->id;
		out.msg_case = PF__ENVELOPE__MSG_OK;
		out.ok = &ok;
		fake_emit(f, &out);
		break;
	}
	default: fake_fail(f, "unexpected %s from the client", wire_msg_name(env->msg_case)); break;
	}
}

static void *fake_main(void *arg)
{
	struct fake *f = arg;
	struct wire_rx rx;

	wire_rx_init(&rx, 0);
	for (;;) {
		struct pollfd pfd = {.fd = f->fd, .events = POLLIN};
		Pf__Envelope *env;
		bool stop;
		long got;
		int rc;

		pthread_mutex_lock(&f->mu);
		stop = f->stop;
		pthread_mutex_unlock(&f->mu);
		if (stop)
			break;
		if (fake_pump(f))
			continue;
		if (poll(&pfd, 1, 2) <= 0)
			continue;
		got = wire_rx_fill(&rx, f->fd);
		if (got == -EAGAIN)
			continue;
		if (got <= 0) {
			fake_log(f, (struct ev){.kind = EV_EOF});
			break;
		}
		/* Every frame of the read, then one write for all they (and
		 * the governor) have to say. */
		while ((rc = wire_rx_next(&rx, &env)) == 1) {
			fake_handle(f, env);
			pf__envelope__free_unpacked(env, NULL);
		}
		if (rc < 0) {
			fake_fail(f, "the client sent a frame that does not decode");
			break;
		}
	}
	wire_rx_free(&rx);
	return NULL;
}

/* One fake per test, static so that its log stays readable after
 * fake_finish (test_client.c's the_fake_sync says why the lock outlives
 * it). */
static struct fake the_fake;
static bool the_fake_sync;
/* Whether its thread runs: a test that failed half-way left it so, and the
 * next one stops it before it reuses the struct (that client is lost). */
static bool the_fake_running;

/* Starts the fake and a client on it, with its CUDA session open. */
static struct fake *fake_session(const struct script *sc, struct pf_client **c)
{
	struct fake *f = &the_fake;
	int sv[2];

	if (the_fake_running) {
		pthread_mutex_lock(&f->mu);
		f->stop = true;
		pthread_mutex_unlock(&f->mu);
		pthread_join(f->thread, NULL);
		the_fake_running = false;
	}
	pfcuda_fake_reset();
	if (the_fake_sync)
		pthread_mutex_destroy(&f->mu);
	memset(f, 0, sizeof(*f));
	f->s = *sc;
	{
		struct pfcuda_fake_counts n;

		pfcuda_fake_counts(&n);
		f->live_maps0 = n.live_maps;
		f->live_events0 = n.live_events;
	}
	if (!f->s.samples)
		f->s.samples = 44;
	if (!f->s.target)
		f->s.target = 4;
	if (!f->s.slots)
		f->s.slots = 6;
	if (!f->s.pool_rows)
		f->s.pool_rows = f->s.samples;
	assert_true(f->s.samples <= MAX_SAMPLES && f->s.slots <= MAX_SLOTS);
	assert_true(!pooled(f) || f->s.samples <= NSLABS * PER_SLAB);
	f->cmd_gone = f->cmd_replace = -1;
	pthread_mutex_init(&f->mu, NULL);
	the_fake_sync = true;
	f->arena_fd =
		new_memfd(pooled(f) ? "pf-fake-arena" : "pf-test-arena", !pooled(f), &f->arena);
	for (uint32_t j = 0; pooled(f) && j < NSLABS; j++) {
		f->slab_fd[j] = new_memfd("pf-fake-slab", false, &f->slab[j]);
		memset(f->slab[j], 0xCD, ARENA_BYTES);
		f->slab_gen[j] = 1;
	}
	for (uint32_t s = 0; s < f->s.samples; s++) {
		f->entry[s] = NO_ENTRY;
		if (!pooled(f) || s >= f->s.pool_rows)
			continue;
		f->entry[s] = first_entry(s);
		write_record(f->slab[f->entry[s] >> SLAB_SHIFT], f->entry[s], s);
	}
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	f->fd = sv[1];
	assert_int_equal(pthread_create(&f->thread, NULL, fake_main, f), 0);
	the_fake_running = true;
	assert_int_equal(pfc_connect_fd(sv[0], "fake prefetchd", 2000, c), 0);
	assert_int_equal(pf_open(*c, &(struct pf_open_opts){.dataset = "demo",
							    .device = "cuda:0",
							    .batch_size = BATCH}),
			 0);
	return f;
}

static int count_ev(struct fake *f, enum ev_kind kind)
{
	int n = 0;

	pthread_mutex_lock(&f->mu);
	for (int k = 0; k < f->nlog; k++)
		n += f->log[k].kind == kind;
	pthread_mutex_unlock(&f->mu);
	return n;
}

/* Waits up to 2 s for at least n events of a kind; how many came, at most n. */
static int wait_ev(struct fake *f, enum ev_kind kind, int n)
{
	int64_t deadline = mono_ns() + 2000000000LL;
	int have;

	while ((have = count_ev(f, kind)) < n && mono_ns() < deadline)
		usleep(500);
	return have < n ? have : n;
}

/* The i-th event of a kind (copied under the lock). */
static struct ev nth_ev(struct fake *f, enum ev_kind kind, int i)
{
	struct ev e = {.kind = EV_KINDS};

	pthread_mutex_lock(&f->mu);
	for (int k = 0; k < f->nlog; k++)
		if (f->log[k].kind == kind && i-- == 0) {
			e = f->log[k];
			break;
		}
	pthread_mutex_unlock(&f->mu);
	return e;
}

/* The Release of batch seq of epoch, as the fake logged it (kind EV_KINDS:
 * none yet). */
static struct ev release_ev(struct fake *f, uint64_t epoch, uint64_t seq)
{
	struct ev e = {.kind = EV_KINDS};

	pthread_mutex_lock(&f->mu);
	for (int k = 0; k < f->nlog; k++)
		if (f->log[k].kind == EV_RELEASE && f->log[k].epoch == epoch &&
		    f->log[k].seq == seq) {
			e = f->log[k];
			break;
		}
	pthread_mutex_unlock(&f->mu);
	return e;
}

/* Whether the fake has seen the Release of batch seq of epoch. */
static bool released(struct fake *f, uint64_t epoch, uint64_t seq)
{
	return release_ev(f, epoch, seq).kind == EV_RELEASE;
}

static bool wait_released(struct fake *f, uint64_t epoch, uint64_t seq)
{
	int64_t deadline = mono_ns() + 2000000000LL;

	while (!released(f, epoch, seq) && mono_ns() < deadline)
		usleep(500);
	return released(f, epoch, seq);
}

/* The device address of slot s in the client's mapping of the arena,
 * found from a batch b of the session in slot bs. */
static uint64_t slot_addr(const struct pf_batch *b, int32_t bs, int32_t s)
{
	uint64_t base =
		(uint64_t)(uintptr_t)b->data[0] - X_OFFSET - SLOT_BASE - (uint64_t)bs * DEV_STRIDE;

	return base + SLOT_BASE + (uint64_t)s * DEV_STRIDE;
}

static void command(struct fake *f, int *cmd, int value)
{
	pthread_mutex_lock(&f->mu);
	*cmd = value;
	pthread_mutex_unlock(&f->mu);
}

/* Closes the client, stops the fake, and checks what both saw: the fake
 * daemon nothing unexpected and every slot back, the fake GPU no fault, no
 * row skipped, and nothing left mapped or made. */
static void fake_finish(struct fake *f, struct pf_client *c)
{
	struct pfcuda_fake_counts n;

	pf_close(c);
	wait_ev(f, EV_EOF, 1);
	pthread_mutex_lock(&f->mu);
	f->stop = true;
	pthread_mutex_unlock(&f->mu);
	pthread_join(f->thread, NULL);
	the_fake_running = false;
	close(f->fd);
	munmap(f->arena, ARENA_BYTES);
	close(f->arena_fd);
	for (uint32_t j = 0; pooled(f) && j < NSLABS; j++) {
		munmap(f->slab[j], ARENA_BYTES);
		close(f->slab_fd[j]);
	}
	free(f->obuf);
	f->obuf = NULL;
	if (f->failed[0])
		fail_msg("fake daemon: %s", f->failed);
	/* A connection the client broke returns its slots by closing. */
	for (uint32_t i = 0; f->s.bad == BAD_NONE && i < f->s.slots; i++)
		if (f->slot[i].busy)
			fail_msg("slot %u (epoch %llu batch %llu) never came back", i,
				 (unsigned long long)f->slot[i].epoch,
				 (unsigned long long)f->slot[i].seq);
	pfcuda_fake_counts(&n);
	assert_int_equal(n.faults, 0);
	assert_int_equal(n.rows_skipped, 0);
	assert_int_equal(n.busy_waits, 0);
	assert_int_equal(n.live_maps, f->live_maps0);
	assert_int_equal(n.live_events, f->live_events0);
}

/* ---- the trainer ---------------------------------------------------------------- */

/* What the trainer's kernel read of a batch, and what it needs to judge it
 * once the batch is released. */
struct seen {
	uint64_t epoch, seq;
	uint32_t count;
	uint64_t picks[BATCH];
	uint8_t x[BATCH * X_BYTES];
	uint8_t y[BATCH * Y_BYTES];
};

/* Queues the trainer's reads of b's fields on stream. */
static void use_batch(const struct pf_batch *b, void *stream, struct seen *sn)
{
	assert_non_null(b);
	assert_true(b->on_device);
	assert_int_equal(b->nfields, 2);
	assert_true(b->count >= 1 && b->count <= BATCH);
	memset(sn, 0, sizeof(*sn));
	sn->epoch = b->epoch;
	sn->seq = b->seq;
	sn->count = b->count;
	memcpy(sn->picks, b->picks, b->count * sizeof(uint64_t));
	assert_int_equal(pfcuda_fake_read(stream, sn->x, (uint64_t)(uintptr_t)b->data[0],
					  b->count * X_BYTES),
			 0);
	assert_int_equal(pfcuda_fake_read(stream, sn->y, (uint64_t)(uintptr_t)b->data[1],
					  b->count * Y_BYTES),
			 0);
}

/* What the trainer read is the samples of the batch's picks, byte for
 * byte; with seen_picks, no pick came before in the epoch. */
static void check_seen(const struct seen *sn, bool *seen_picks)
{
	for (uint32_t j = 0; j < sn->count; j++) {
		uint8_t x[X_BYTES], y[Y_BYTES];
		uint64_t s = sn->picks[j];

		assert_true(s < MAX_SAMPLES);
		sample_x(s, x);
		sample_y(s, y);
		if (memcmp(sn->x + j * X_BYTES, x, X_BYTES) ||
		    memcmp(sn->y + j * Y_BYTES, y, Y_BYTES))
			fail_msg("epoch %llu batch %llu row %u: the trainer read other bytes than "
				 "sample %llu's",
				 (unsigned long long)sn->epoch, (unsigned long long)sn->seq, j,
				 (unsigned long long)s);
		if (seen_picks) {
			if (seen_picks[s])
				fail_msg("pick %llu came twice", (unsigned long long)s);
			seen_picks[s] = true;
		}
	}
}

/* Takes the next batch on stream (NULL: with pf_next), reads it there,
 * waits for the read, checks it.  NULL at the epoch's end. */
static struct pf_batch *take_checked(struct pf_client *c, void *stream, bool *seen_picks)
{
	struct pf_batch *b;
	struct seen sn;

	if (stream)
		assert_int_equal(pf_next_stream(c, 2000, stream, &b), 0);
	else
		assert_int_equal(pf_next(c, 2000, &b), 0);
	if (!b)
		return NULL;
	use_batch(b, stream, &sn);
	assert_int_equal(pfcuda_fake_stream_sync(stream), 0);
	check_seen(&sn, seen_picks);
	return b;
}

/* The rest of the epoch, each batch checked and released on stream.
 * Returns how many batches that was. */
static int drain_epoch(struct pf_client *c, void *stream, bool *seen_picks)
{
	struct pf_batch *b;
	int n = 0;

	while ((b = take_checked(c, stream, seen_picks))) {
		assert_int_equal(pf_release(c, b, stream), 0);
		n++;
	}
	return n;
}

static void assert_every_pick_once(const bool *seen_picks, uint32_t samples)
{
	for (uint32_t s = 0; s < samples; s++)
		if (!seen_picks[s])
			fail_msg("pick %u never came", s);
}

static int start(struct pf_client *c, enum pf_order order, uint64_t seed)
{
	return pf_start_epoch(c, &(struct pf_epoch_opts){.order = order, .seed = seed}, NULL);
}

/* ---- pooled sessions --------------------------------------------------------------- */

/* A pooled epoch the client gathers: every batch exact, every pick once,
 * and the first batches, which arrive together, in one group launch. */
static void pooled_epoch(enum mode mode, int event_delay, bool narrow)
{
	bool seen[MAX_SAMPLES] = {false};
	struct pfcuda_fake_counts n;
	struct pf_client *c;
	struct fake *f = fake_session(&(struct script){.mode = mode, .narrow = narrow}, &c);
	struct pf_batch *b;
	int taken = 1;

	pfcuda_fake_set_event_delay(event_delay);
	assert_int_equal(start(c, PF_ORDER_SHUFFLE, 5), 0);
	b = take_checked(c, STREAM_S, seen);
	assert_non_null(b);
	/* Batches 0..3 came with EpochStarted: one launch for the four. */
	pfcuda_fake_counts(&n);
	assert_int_equal(n.group_launches, 1);
	assert_int_equal(n.group_batches, 4);
	assert_int_equal(n.launches, 0);
	assert_int_equal(pf_release(c, b, STREAM_S), 0);
	taken += drain_epoch(c, STREAM_S, seen);
	assert_int_equal(taken, 6);
	assert_every_pick_once(seen, 44);
	pfcuda_fake_counts(&n);
	assert_int_equal(n.gathers_run, 6);
	assert_true(n.launches + n.group_launches < 6);
	assert_int_equal(n.copies, 0);
	/* The honest probe, once the trainer took its second batch. */
	assert_int_equal(wait_ev(f, EV_PROBE, 1), 1);
	fake_finish(f, c);
	assert_int_equal(count_ev(f, EV_PROBE), 1);
}

static void pooled_epoch_over_fd_arenas_is_exact_once_per_pick_in_fewer_launches(void **unused)
{
	pooled_epoch(POOL_FD, 0, false);
}

static void pooled_epoch_over_legacy_arenas_is_exact_once_per_pick_in_fewer_launches(void **unused)
{
	/* And events that are not done at the first query. */
	pooled_epoch(POOL_LEGACY, 2, false);
}

/* The daemon's 4-byte picks and entry ids (the client asked for them):
 * widened into the batch's picks, gathered by the kernel at 4 bytes an
 * id, every byte right. */
static void pooled_epoch_over_narrow_ids_is_exact_once_per_pick_in_fewer_launches(void **unused)
{
	pooled_epoch(POOL_FD, 0, true);
}

/* Batches of both widths in one read (as from a daemon that falls back to
 * 8 bytes for some): no launch mixes them, each is gathered at its own
 * width. */
static void batches_of_both_id_widths_in_one_read_are_each_gathered_at_their_own(void **unused)
{
	bool seen[MAX_SAMPLES] = {false};
	struct pfcuda_fake_counts n;
	struct pf_client *c;
	struct fake *f =
		fake_session(&(struct script){.mode = POOL_FD, .narrow = true, .mixed = true}, &c);
	struct pf_batch *b;

	assert_int_equal(start(c, PF_ORDER_SHUFFLE, 9), 0);
	b = take_checked(c, STREAM_S, seen);
	assert_non_null(b);
	/* Batches 0..3 came together, of widths 4, 8, 4, 8. */
	pfcuda_fake_counts(&n);
	assert_int_equal(n.group_launches, 4);
	assert_int_equal(n.group_most, 1);
	assert_int_equal(pf_release(c, b, STREAM_S), 0);
	assert_int_equal(drain_epoch(c, STREAM_S, seen), 5);
	assert_every_pick_once(seen, 44);
	fake_finish(f, c);
}

/* A BatchReady that breaks a rule of the 4-byte forms breaks the
 * connection, saying which rule. */
static void batch_with_a_wrong_4_byte_field_is_refused_naming_it(void **unused)
{
	static const struct {
		enum bad bad;
		const char *says;
	} cases[] = {
		{BAD_PICKS32_LEN,
		 "epoch 0 batch 0 carries 28 bytes of picks_le32 for 8 samples (4 bytes a pick)"},
		{BAD_PICKS_BOTH,
		 "epoch 0 batch 0 carries its picks both as picks_le32 and as picks_le"},
		{BAD_IDS32_LEN,
		 "epoch 0 batch 0 carries 36 bytes of gather_ids32 for 8 rows with 0 "
		 "staged"},
		{BAD_IDS32_STAGED,
		 "epoch 0 batch 0 carries 32 bytes of gather_ids32 for 8 rows with "
		 "1 staged"},
		{BAD_IDS_BOTH,
		 "epoch 0 batch 0 carries its gather ids both as gather_ids32 and gather_ids"},
	};

	for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
		struct pf_client *c;
		struct fake *f = fake_session(
			&(struct script){.mode = POOL_FD, .narrow = true, .bad = cases[k].bad}, &c);
		struct pf_batch *b;

		assert_int_equal(start(c, PF_ORDER_SEQUENTIAL, 0), 0);
		assert_int_equal(pf_next_stream(c, 2000, STREAM_S, &b), -EPROTO);
		assert_null(b);
		if (!strstr(pf_errmsg(c), cases[k].says))
			fail_msg("case %zu: the client said \"%s\", not \"%s\"", k, pf_errmsg(c),
				 cases[k].says);
		fake_finish(f, c);
	}
}

/* A batch taken for one stream and released on another: the release's
 * stream waits for the batch's gather first, so the slot does not go back
 * while the gather may still write it (nothing else ran the gather here:
 * the stream it was taken for never ran). */
static void pooled_batch_released_on_another_stream_waits_for_its_gather(void **unused)
{
	bool seen[MAX_SAMPLES] = {false};
	struct pfcuda_fake_counts n;
	struct pf_client *c;
	struct fake *f = fake_session(&(struct script){.mode = POOL_FD}, &c);
	struct pf_batch *b0;

	assert_int_equal(start(c, PF_ORDER_SEQUENTIAL, 0), 0);
	assert_int_equal(pf_next_stream(c, 2000, STREAM_S, &b0), 0);
	assert_non_null(b0);
	pfcuda_fake_counts(&n);
	assert_int_equal(n.gathers_run, 0);
	for (uint32_t k = 0; k < b0->count; k++)
		seen[b0->picks[k]] = true; /* its bytes are not this test's */
	assert_int_equal(pf_release(c, b0, STREAM_T), 0);
	assert_true(wait_released(f, 0, 0));
	assert_true(release_ev(f, 0, 0).gathers >= 1);
	assert_int_equal(drain_epoch(c, STREAM_S, seen), 5);
	assert_every_pick_once(seen, 44);
	fake_finish(f, c);
}

/* An epoch abandoned with batches received and their gathers still queued
 * (one launch each): each goes back to the daemon only once its gather has
 * run, and the next epoch is exact. */
static void pooled_epoch_abandoned_with_gathers_queued_gives_slots_back_after_them(void **unused)
{
	bool seen[MAX_SAMPLES] = {false};
	struct pfcuda_fake_counts n;
	struct pf_client *c;
	struct fake *f = fake_session(&(struct script){.mode = POOL_FD}, &c);
	struct pf_batch *b0;

	pfcuda_fake_set_group(0);
	assert_int_equal(start(c, PF_ORDER_SEQUENTIAL, 0), 0);
	b0 = take_checked(c, STREAM_S, NULL); /* runs batch 0's gather, not the others' */
	assert_non_null(b0);
	pfcuda_fake_counts(&n);
	assert_int_equal(n.gathers_run, 1);
	assert_int_equal(pf_release(c, b0, STREAM_S), 0);
	assert_int_equal(pf_abandon(c), 0);
	/* A Release sent at the abandon, before its gather, reaches the fake
	 * daemon while nothing runs the gather stream: none may be there. */
	usleep(50000);
	for (uint64_t seq = 1; seq <= 3; seq++) {
		struct ev e = release_ev(f, 0, seq);

		if (e.kind == EV_RELEASE && e.gathers < seq + 1)
			fail_msg("batch %llu went back at the abandon, before its gather ran",
				 (unsigned long long)seq);
	}
	assert_int_equal(start(c, PF_ORDER_SHUFFLE, 3), 0);
	assert_int_equal(drain_epoch(c, STREAM_S, seen), 6);
	assert_every_pick_once(seen, 44);
	/* Batches 1..3 of the abandoned epoch had come with batch 0. */
	for (uint64_t seq = 1; seq <= 3; seq++) {
		struct ev e = release_ev(f, 0, seq);

		if (e.kind != EV_RELEASE)
			fail_msg("batch %llu of the abandoned epoch never went back",
				 (unsigned long long)seq);
		if (e.gathers < seq + 1)
			fail_msg("batch %llu went back with %llu batches gathered: before its "
				 "gather ran",
				 (unsigned long long)seq, (unsigned long long)e.gathers);
	}
	fake_finish(f, c);
}

/* $PREFETCH_CLIENT_COUNTERS: the line pf_close prints counts what the
 * device side saw (launches, batches a launch, stream waits, queries), one
 * frame a batch, and no copies for a pooled session. */
static void client_counters_say_what_the_device_side_saw(void **unused)
{
	bool seen[MAX_SAMPLES] = {false};
	struct pfcuda_fake_counts n;
	struct pf_client *c;
	struct fake *f;
	struct pf_batch *b;
	char line[1024] = "";
	unsigned long long batches = 0;
	double v[16] = {0};
	FILE *out = tmpfile();
	int saved, got;

	assert_non_null(out);
	setenv("PREFETCH_CLIENT_COUNTERS", "1", 1);
	f = fake_session(&(struct script){.mode = POOL_FD}, &c);
	unsetenv("PREFETCH_CLIENT_COUNTERS");
	assert_int_equal(start(c, PF_ORDER_SHUFFLE, 5), 0);
	b = take_checked(c, STREAM_S, seen);
	assert_non_null(b);
	assert_int_equal(pf_release(c, b, STREAM_S), 0);
	assert_int_equal(drain_epoch(c, STREAM_S, seen), 5);
	/* pf_close prints before it lets anything go. */
	pfcuda_fake_counts(&n);
	fflush(stderr);
	saved = dup(2);
	assert_true(saved >= 0);
	assert_int_equal(dup2(fileno(out), 2), 2);
	pf_close(c);
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	fake_finish(f, NULL); /* its checks with stderr back */
	rewind(out);
	while (fgets(line, sizeof(line), out) && !strstr(line, "libprefetch:"))
		;
	fclose(out);
	got = sscanf(line,
		     "libprefetch: %llu batches taken; per batch: %lf sends (%lf us), %lf reads "
		     "(%lf empty; %lf us), %lf polls, %lf frames (decoded in %lf us, handled in "
		     "%lf us), %lf gather launches (%lf batches a launch; %lf us), %lf copies, %lf "
		     "event records, %lf stream waits, %lf event queries",
		     &batches, &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9],
		     &v[10], &v[11], &v[12], &v[13], &v[14], &v[15]);
	if (got != 17)
		fail_msg("pf_close printed no counters line (%d fields of 17): %s", got, line);
	assert_int_equal(batches, 6);
	/* Per batch, to 2 decimals: times 6 within 0.03 of the count. */
#define ASSERT_PER_BATCH(x, count)                                                                 \
	do {                                                                                       \
		if (fabs((x)*6 - (double)(count)) > 0.031)                                         \
			fail_msg("%s: %.2f a batch, the device side saw %llu in 6", #count, (x),   \
				 (unsigned long long)(count));                                     \
	} while (0)
	ASSERT_PER_BATCH(v[6], 6);
	ASSERT_PER_BATCH(v[9], n.launches + n.group_launches);
	ASSERT_PER_BATCH(v[12], n.copies);
	ASSERT_PER_BATCH(v[14], n.stream_waits);
	ASSERT_PER_BATCH(v[15], n.event_queries);
#undef ASSERT_PER_BATCH
	assert_true(fabs(v[10] - 6.0 / (double)(n.launches + n.group_launches)) < 0.006);
	/* Every release on the trainer's stream waits for an event. */
	assert_true(v[0] > 0 && v[2] > 0 && v[13] >= 1.0);
	assert_every_pick_once(seen, 44);
}

/* A batch with misses cannot join a group (its index and staged rows are
 * in the slot's tail): the hits before it go first, it goes alone, the
 * hits after it follow, in the order the batches came. */
static void batch_with_staged_rows_between_hits_keeps_stream_order_and_is_exact(void **unused)
{
	static const uint64_t order[] = {0,  1,	 2,  3,	 4,  5,	 6,  7,	 8,  9,	 10, 11, 12, 13, 14,
					 15, 40, 16, 41, 17, 42, 18, 43, 19, 20, 21, 22, 23, 24, 25,
					 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39};
	bool seen[MAX_SAMPLES] = {false};
	struct pfcuda_fake_counts n;
	struct pf_client *c;
	/* Samples 40..43 are not in the pool: batch 2 stages four rows. */
	struct fake *f = fake_session(
		&(struct script){.mode = POOL_FD, .target = 5, .slots = 7, .pool_rows = 40}, &c);
	struct pf_batch *b;
	uint64_t slots[8];

	assert_int_equal(pf_start_epoch(c,
					&(struct pf_epoch_opts){.order = PF_ORDER_EXPLICIT,
								.indices = order,
								.nindices = 44},
					NULL),
			 0);
	b = take_checked(c, STREAM_S, seen);
	assert_non_null(b);
	pfcuda_fake_counts(&n);
	assert_int_equal(n.group_launches, 2);
	assert_int_equal(n.group_batches, 4);
	assert_int_equal(n.launches, 1);
	/* On the gather stream: batch 0, 1 (a group), 2 (alone), 3, 4. */
	assert_int_equal(pfcuda_fake_gather_slots(slots, 8), 5);
	for (int i = 0; i < 5; i++)
		assert_true(slots[i] ==
			    slot_addr(b, nth_ev(f, EV_SENT, 0).slot, nth_ev(f, EV_SENT, i).slot));
	assert_int_equal(pf_release(c, b, STREAM_S), 0);
	assert_int_equal(drain_epoch(c, STREAM_S, seen), 5);
	assert_every_pick_once(seen, 44);
	fake_finish(f, c);
}

static void pooled_release_waits_for_the_trainers_stream_work_on_it(void **unused)
{
	bool seen[MAX_SAMPLES] = {false};
	struct pfcuda_fake_counts n;
	struct pf_client *c;
	/* Three slots: were batch 0's released early, the daemon would fill
	 * it again while the trainer's read of it is still queued. */
	struct fake *f =
		fake_session(&(struct script){.mode = POOL_FD, .target = 2, .slots = 3}, &c);
	struct pf_batch *b0, *b;
	struct seen sn0;
	int token;

	assert_int_equal(start(c, PF_ORDER_SEQUENTIAL, 0), 0);
	assert_int_equal(pf_next_stream(c, 2000, STREAM_S, &b0), 0);
	token = pfcuda_fake_busy(STREAM_S); /* the trainer's long step */
	assert_true(token > 0);
	use_batch(b0, STREAM_S, &sn0);
	assert_int_equal(pf_release(c, b0, STREAM_S), 0);
	/* The trainer goes on with batches 1..4 on another stream. */
	for (int i = 1; i <= 4; i++) {
		b = take_checked(c, STREAM_T, seen);
		assert_non_null(b);
		assert_int_equal(pf_release(c, b, STREAM_T), 0);
	}
	/* Releases leave in order: once batch 4's is in, an early one of
	 * batch 0 would be too. */
	assert_true(wait_released(f, 0, 4));
	assert_false(released(f, 0, 0));
	assert_int_equal(pfcuda_fake_stream_sync(STREAM_S), -EAGAIN);
	pfcuda_fake_unbusy(token);
	/* It goes with the next release that looks. */
	b = take_checked(c, STREAM_T, seen);
	assert_non_null(b);
	assert_int_equal(pf_release(c, b, STREAM_T), 0);
	assert_true(wait_released(f, 0, 0));
	/* And the slot held batch 0 until the trainer's read of it ran. */
	assert_int_equal(pfcuda_fake_stream_sync(STREAM_S), 0);
	check_seen(&sn0, seen);
	assert_null(take_checked(c, STREAM_T, seen));
	assert_every_pick_once(seen, 44);
	pfcuda_fake_counts(&n);
	assert_int_equal(n.busy_waits, 0); /* nothing waited on the CPU for it */
	fake_finish(f, c);
}

/* The batches of one group launch share its event: the trainer's stream
 * waits on it once for all of them, and a batch of that launch taken on
 * another stream makes that stream wait too. */
static void batches_of_one_launch_make_each_stream_wait_once(void **unused)
{
	bool seen[MAX_SAMPLES] = {false};
	struct pfcuda_fake_counts n;
	struct pf_client *c;
	struct fake *f = fake_session(&(struct script){.mode = POOL_FD}, &c);
	struct pf_batch *b[4];
	void *on[4] = {STREAM_S, STREAM_S, STREAM_S, STREAM_T};

	assert_int_equal(start(c, PF_ORDER_SHUFFLE, 5), 0);
	for (int k = 0; k < 4; k++) {
		b[k] = take_checked(c, on[k], seen);
		assert_non_null(b[k]);
	}
	pfcuda_fake_counts(&n);
	/* Batches 0..3 came with EpochStarted: one launch, one event. */
	assert_int_equal(n.group_launches, 1);
	assert_int_equal(n.group_batches, 4);
	assert_int_equal(n.stream_waits, 2);
	for (int k = 0; k < 4; k++)
		assert_int_equal(pf_release(c, b[k], on[k]), 0);
	/* Released on the streams they were taken for: no more waits. */
	pfcuda_fake_counts(&n);
	assert_int_equal(n.stream_waits, 2);
	assert_int_equal(drain_epoch(c, STREAM_S, seen), 2);
	assert_every_pick_once(seen, 44);
	fake_finish(f, c);
}

/* pf_release_next in a loop that keeps up with the daemon, the release of
 * each batch in the call that takes the next: with one slot, the client
 * waits behind the release it sends; by the epoch's end every Ack has
 * arrived, and every slot comes back. */
static void tight_loop(uint32_t target, uint32_t slots)
{
	bool seen[MAX_SAMPLES] = {false};
	struct pf_client *c;
	struct fake *f = fake_session(
		&(struct script){.mode = POOL_FD, .target = target, .slots = slots}, &c);
	struct pf_batch *b = NULL, *prev = NULL;
	int taken = 0;

	assert_int_equal(start(c, PF_ORDER_SHUFFLE, 3), 0);
	for (;;) {
		struct seen sn;

		assert_int_equal(pf_release_next(c, prev, STREAM_S, 2000, &b), 0);
		if (!b)
			break;
		use_batch(b, STREAM_S, &sn);
		assert_int_equal(pfcuda_fake_stream_sync(STREAM_S), 0);
		check_seen(&sn, seen);
		prev = b;
		taken++;
	}
	assert_int_equal(taken, 6);
	assert_every_pick_once(seen, 44);
	assert_int_equal(wait_ev(f, EV_ACK, 6), 6);
	/* The releases still waiting for the trainer's stream go with the
	 * next call, here pf_close: fake_finish fails on a slot that never
	 * came back. */
	fake_finish(f, c);
}

static void tight_loop_on_one_slot_sends_the_release_it_waits_behind(void **unused)
{
	tight_loop(1, 1);
}

static void tight_loop_with_batches_ahead_loses_no_release_or_ack(void **unused)
{
	tight_loop(4, 6);
}

/* Releases behind the trainer's long step go back as soon as it is done,
 * with no call of the trainer's to carry them and no event ever queried:
 * the lanes wait for the GPU, asleep, and send the Releases themselves. */
static void releases_go_back_when_the_step_retires_with_no_call_and_no_query(void **unused)
{
	bool seen[MAX_SAMPLES] = {false};
	struct pfcuda_fake_counts before, after;
	struct pf_client *c;
	struct fake *f = fake_session(&(struct script){.mode = POOL_FD}, &c);
	struct pf_batch *b[3];
	struct seen sn[3];
	int token = 0;

	assert_int_equal(start(c, PF_ORDER_SEQUENTIAL, 0), 0);
	pfcuda_fake_counts(&before);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(pf_next_stream(c, 2000, STREAM_S, &b[i]), 0);
		if (i == 0)
			token = pfcuda_fake_busy(STREAM_S);
		use_batch(b[i], STREAM_S, &sn[i]);
	}
	for (int i = 0; i < 3; i++)
		assert_int_equal(pf_release(c, b[i], STREAM_S), 0);
	/* The step is still running: nothing may go back yet. */
	usleep(20000);
	for (int i = 0; i < 3; i++)
		assert_false(released(f, 0, (uint64_t)i));
	pfcuda_fake_unbusy(token);
	/* No call of the trainer's from here until all three are in. */
	for (int i = 0; i < 3; i++) {
		assert_true(wait_released(f, 0, (uint64_t)i));
		check_seen(&sn[i], seen);
	}
	pfcuda_fake_counts(&after);
	assert_int_equal(after.event_queries - before.event_queries, 0);
	assert_int_equal(after.busy_waits - before.busy_waits, 0);
	assert_int_equal(drain_epoch(c, STREAM_S, seen), 3);
	assert_every_pick_once(seen, 44);
	fake_finish(f, c);
}

/* The test asks the fake daemon for slab 1's PoolSlabGone (or a new
 * generation of it) after the first batches, which read it, and has the
 * client read it while their gathers are queued and not run. */
static void slab_goes_under_queued_gathers(bool replace)
{
	bool seen[MAX_SAMPLES] = {false};
	struct pfcuda_fake_counts n;
	struct pf_client *c;
	struct fake *f = fake_session(&(struct script){.mode = POOL_FD}, &c);
	struct pf_batch *b;
	struct seen sn;

	assert_int_equal(start(c, PF_ORDER_SEQUENTIAL, 0), 0);
	/* Sent after batches 0..3, read only at the next look at the socket. */
	command(f, replace ? &f->cmd_replace : &f->cmd_gone, 1);
	assert_int_equal(wait_ev(f, replace ? EV_SLAB : EV_GONE, replace ? NSLABS + 1 : 1),
			 replace ? NSLABS + 1 : 1);
	assert_int_equal(pf_next_stream(c, 2000, STREAM_S, &b), 0);
	use_batch(b, STREAM_S, &sn);
	pfcuda_fake_counts(&n);
	assert_int_equal(n.group_batches, 4);
	assert_int_equal(n.gathers_run, 0);
	assert_true(pfcuda_fake_pending() > 0);
	assert_int_equal(n.unmaps, 0);
	/* A request reads the socket: the slab goes now. */
	assert_int_equal(pf_set_depth(c, 0, 4), 0);
	pfcuda_fake_counts(&n);
	assert_int_equal(n.unmaps, 1);
	assert_true(n.gathers_run >= 4);
	assert_int_equal(n.faults, 0);
	assert_int_equal(pfcuda_fake_stream_sync(STREAM_S), 0);
	check_seen(&sn, seen);
	assert_int_equal(pf_release(c, b, STREAM_S), 0);
	/* The later batches read slab 1's samples as misses, or from its new
	 * generation. */
	assert_int_equal(drain_epoch(c, STREAM_S, seen), 5);
	assert_every_pick_once(seen, 44);
	fake_finish(f, c);
}

static void slab_gone_while_gathers_that_read_it_are_queued_faults_nothing(void **unused)
{
	slab_goes_under_queued_gathers(false);
}

static void slab_replaced_while_gathers_read_the_old_one_faults_nothing(void **unused)
{
	slab_goes_under_queued_gathers(true);
}

static void slab_gone_in_the_read_of_its_batches_launches_their_gathers_first(void **unused)
{
	bool seen[MAX_SAMPLES] = {false};
	struct pfcuda_fake_counts n;
	struct pf_client *c;
	struct fake *f =
		fake_session(&(struct script){.mode = POOL_FD, .gone_with_first = true}, &c);
	struct pf_batch *b;

	assert_int_equal(start(c, PF_ORDER_SEQUENTIAL, 0), 0);
	/* Batches 0..3 wait for one launch when the PoolSlabGone behind them
	 * is taken in: they are launched, and run, before the slab goes. */
	b = take_checked(c, STREAM_S, seen);
	assert_non_null(b);
	pfcuda_fake_counts(&n);
	assert_int_equal(n.group_launches, 1);
	assert_int_equal(n.group_batches, 4);
	assert_int_equal(n.unmaps, 1);
	assert_int_equal(n.faults, 0);
	assert_int_equal(pf_release(c, b, STREAM_S), 0);
	assert_int_equal(drain_epoch(c, STREAM_S, seen), 5);
	assert_every_pick_once(seen, 44);
	fake_finish(f, c);
}

/* ---- client copies ------------------------------------------------------------ */

static void client_copied_epoch_is_exact_once_per_pick(void **unused)
{
	bool seen[MAX_SAMPLES] = {false};
	struct pfcuda_fake_counts n;
	struct pf_client *c;
	struct fake *f =
		fake_session(&(struct script){.mode = CLIENT_COPY, .target = 2, .slots = 4}, &c);

	assert_int_equal(start(c, PF_ORDER_SHUFFLE, 3), 0);
	/* pf_next: no stream named, the copy is done when it returns, for
	 * work on any stream (the legacy default one here). */
	assert_int_equal(drain_epoch(c, NULL, seen), 6);
	assert_every_pick_once(seen, 44);
	pfcuda_fake_counts(&n);
	assert_int_equal(n.copies, 6); /* each batch once */
	assert_int_equal(n.launches + n.group_launches, 0);
	assert_int_equal(wait_ev(f, EV_RELEASE, 6), 6);
	fake_finish(f, c);
}

static void copies_of_the_next_batches_start_at_the_release(void **unused)
{
	bool seen[MAX_SAMPLES] = {false};
	struct pfcuda_fake_counts n;
	struct pf_client *c;
	struct fake *f =
		fake_session(&(struct script){.mode = CLIENT_COPY, .target = 2, .slots = 4}, &c);
	struct pf_batch *b;

	assert_int_equal(start(c, PF_ORDER_SEQUENTIAL, 0), 0);
	/* Batches 0 and 1 came together, but a session the client does not
	 * gather for takes one frame at a time: batch 1 waits unread. */
	b = take_checked(c, STREAM_S, seen);
	assert_non_null(b);
	pfcuda_fake_counts(&n);
	assert_int_equal(n.copies, 1);
	/* Batch 0's Ack let the daemon send batch 2, not received yet. */
	assert_int_equal(wait_ev(f, EV_SENT, 3), 3);
	assert_int_equal(pf_release(c, b, STREAM_S), 0);
	/* The release took both in and started their copies: pf_next will
	 * find them on the device. */
	pfcuda_fake_counts(&n);
	assert_int_equal(n.copies, 3);
	assert_int_equal(drain_epoch(c, STREAM_S, seen), 5);
	assert_every_pick_once(seen, 44);
	pfcuda_fake_counts(&n);
	assert_int_equal(n.copies, 6);
	fake_finish(f, c);
}

static void trainer_holding_eight_batches_reads_each_one_exact(void **unused)
{
	bool seen[MAX_SAMPLES] = {false};
	struct pfcuda_fake_counts n;
	struct pf_client *c;
	struct fake *f = fake_session(
		&(struct script){.mode = CLIENT_COPY, .samples = 88, .target = 4, .slots = 12}, &c);
	struct pf_batch *b[8];
	struct seen sn[8];

	assert_int_equal(start(c, PF_ORDER_SHUFFLE, 11), 0);
	/* Gradient accumulation: eight batches taken before any goes back. */
	for (int i = 0; i < 8; i++) {
		assert_int_equal(pf_next_stream(c, 2000, STREAM_S, &b[i]), 0);
		use_batch(b[i], STREAM_S, &sn[i]);
	}
	pfcuda_fake_counts(&n);
	assert_true(n.live_maps - f->live_maps0 >= 1 + 8 &&
		    n.live_maps - f->live_maps0 <= 1 + 12); /* the arena, the buffers */
	assert_int_equal(pfcuda_fake_stream_sync(STREAM_S), 0);
	for (int i = 0; i < 8; i++) {
		check_seen(&sn[i], seen);
		assert_int_equal(pf_release(c, b[i], STREAM_S), 0);
	}
	assert_int_equal(drain_epoch(c, STREAM_S, seen), 3);
	assert_every_pick_once(seen, 88);
	fake_finish(f, c);
}

static void epoch_left_with_copies_ahead_then_the_next_epoch_is_clean(void **unused)
{
	bool seen[MAX_SAMPLES] = {false};
	struct pfcuda_fake_counts n;
	struct pf_client *c;
	struct fake *f =
		fake_session(&(struct script){.mode = CLIENT_COPY, .target = 3, .slots = 5}, &c);
	struct pf_batch *b;

	assert_int_equal(start(c, PF_ORDER_SEQUENTIAL, 0), 0);
	for (int i = 0; i < 2; i++) {
		b = take_checked(c, STREAM_S, NULL);
		assert_non_null(b);
		/* The batch its Ack let the daemon send is there when the
		 * release looks (batch 3, then 4). */
		assert_int_equal(wait_ev(f, EV_SENT, 4 + i), 4 + i);
		assert_int_equal(pf_release(c, b, STREAM_S), 0);
	}
	/* Batches 2 and 3 copied ahead, which the trainer never takes (and
	 * batch 4 unread). */
	pfcuda_fake_counts(&n);
	assert_int_equal(n.copies, 4);
	assert_int_equal(start(c, PF_ORDER_SHUFFLE, 7), 0);
	assert_int_equal(drain_epoch(c, STREAM_S, seen), 6);
	assert_every_pick_once(seen, 44);
	pfcuda_fake_counts(&n);
	assert_true(n.live_maps - f->live_maps0 <=
		    1 + 5); /* no buffer lost with the dropped copies */
	assert_int_equal(nth_ev(f, EV_START, 1).epoch, 1);
	fake_finish(f, c);
}

static void device_buffer_is_not_reused_while_the_trainers_stream_reads_it(void **unused)
{
	bool seen[MAX_SAMPLES] = {false};
	struct pf_client *c;
	struct fake *f =
		fake_session(&(struct script){.mode = CLIENT_COPY, .target = 2, .slots = 4}, &c);
	struct pf_batch *b0, *b;
	struct seen sn0;
	int token;

	assert_int_equal(start(c, PF_ORDER_SEQUENTIAL, 0), 0);
	assert_int_equal(pf_next_stream(c, 2000, STREAM_S, &b0), 0);
	token = pfcuda_fake_busy(STREAM_S);
	use_batch(b0, STREAM_S, &sn0);
	assert_int_equal(pf_release(c, b0, STREAM_S), 0);
	/* Every later batch is copied, and read, while batch 0's read waits:
	 * a copy into its buffer would run first. */
	for (int i = 1; i <= 5; i++) {
		b = take_checked(c, STREAM_T, seen);
		assert_non_null(b);
		assert_int_equal(pf_release(c, b, STREAM_T), 0);
	}
	assert_null(take_checked(c, STREAM_T, seen));
	assert_int_equal(pfcuda_fake_stream_sync(STREAM_S), -EAGAIN);
	pfcuda_fake_unbusy(token);
	assert_int_equal(pfcuda_fake_stream_sync(STREAM_S), 0);
	check_seen(&sn0, seen);
	assert_every_pick_once(seen, 44);
	fake_finish(f, c);
}

static void device_too_full_for_another_buffer_makes_do_with_those_there_are(void **unused)
{
	bool seen[MAX_SAMPLES] = {false};
	struct pfcuda_fake_counts n;
	struct pf_client *c;
	struct fake *f =
		fake_session(&(struct script){.mode = CLIENT_COPY, .target = 2, .slots = 4}, &c);
	struct pf_batch *b0, *b;

	assert_int_equal(start(c, PF_ORDER_SEQUENTIAL, 0), 0);
	b0 = take_checked(c, STREAM_S, seen);
	assert_non_null(b0);
	/* The trainer's model took the rest of the device. */
	pfcuda_fake_fail_next_allocs(1000);
	/* Batch 1 finds no buffer: a wait, not a broken connection. */
	assert_int_equal(pf_next_stream(c, 100, STREAM_S, &b), -ETIMEDOUT);
	assert_null(b);
	assert_false(pfc_broken(c));
	/* The buffer of batch 0 serves every later one. */
	assert_int_equal(pf_release(c, b0, STREAM_S), 0);
	assert_int_equal(drain_epoch(c, STREAM_S, seen), 5);
	assert_every_pick_once(seen, 44);
	pfcuda_fake_counts(&n);
	assert_int_equal(n.live_maps - f->live_maps0, 1 + 1); /* the arena, one buffer */
	assert_int_equal(n.copies, 6);
	fake_finish(f, c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(
			pooled_epoch_over_fd_arenas_is_exact_once_per_pick_in_fewer_launches),
		cmocka_unit_test(
			pooled_epoch_over_legacy_arenas_is_exact_once_per_pick_in_fewer_launches),
		cmocka_unit_test(
			batch_with_staged_rows_between_hits_keeps_stream_order_and_is_exact),
		cmocka_unit_test(
			pooled_epoch_over_narrow_ids_is_exact_once_per_pick_in_fewer_launches),
		cmocka_unit_test(
			batches_of_both_id_widths_in_one_read_are_each_gathered_at_their_own),
		cmocka_unit_test(batch_with_a_wrong_4_byte_field_is_refused_naming_it),
		cmocka_unit_test(pooled_release_waits_for_the_trainers_stream_work_on_it),
		cmocka_unit_test(pooled_batch_released_on_another_stream_waits_for_its_gather),
		cmocka_unit_test(
			pooled_epoch_abandoned_with_gathers_queued_gives_slots_back_after_them),
		cmocka_unit_test(client_counters_say_what_the_device_side_saw),
		cmocka_unit_test(releases_go_back_when_the_step_retires_with_no_call_and_no_query),
		cmocka_unit_test(batches_of_one_launch_make_each_stream_wait_once),
		cmocka_unit_test(tight_loop_on_one_slot_sends_the_release_it_waits_behind),
		cmocka_unit_test(tight_loop_with_batches_ahead_loses_no_release_or_ack),
		cmocka_unit_test(slab_gone_while_gathers_that_read_it_are_queued_faults_nothing),
		cmocka_unit_test(slab_replaced_while_gathers_read_the_old_one_faults_nothing),
		cmocka_unit_test(slab_gone_in_the_read_of_its_batches_launches_their_gathers_first),
		cmocka_unit_test(client_copied_epoch_is_exact_once_per_pick),
		cmocka_unit_test(copies_of_the_next_batches_start_at_the_release),
		cmocka_unit_test(trainer_holding_eight_batches_reads_each_one_exact),
		cmocka_unit_test(epoch_left_with_copies_ahead_then_the_next_epoch_is_clean),
		cmocka_unit_test(device_buffer_is_not_reused_while_the_trainers_stream_reads_it),
		cmocka_unit_test(device_too_full_for_another_buffer_makes_do_with_those_there_are),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
