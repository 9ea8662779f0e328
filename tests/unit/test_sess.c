/*
 * test_sess.c — the session layer (sess.h) on its own: sessions opened,
 * pumped, acked, released, abandoned and detached by calling the request
 * handlers directly, as the server does, with a fake peer that keeps every
 * reply.  The readers are the real reader threads, the loop a real libuv
 * loop, the GPU the fake one (tests/mocks/gpu_fake.c) with its real
 * transfer thread; nothing is wrapped at link time.
 *
 * Every batch is checked as a trainer would: in order, with the picks the
 * order gives, every row of every field holding its sample's bytes (read
 * through the arena the session pushed: a host memfd, or the fake GPU's
 * memfd standing in for VRAM), and every sample of an epoch exactly once.
 * sess_check holds after every step.
 *
 * DESIGN: one thread is the loop thread (the test); reader and transfer
 * threads are the daemon's own.  A step that waits for them turns the loop
 * until what it waits for has come back, or fails after 5 s.
 */
#include <endian.h>
#include <errno.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>
#include <uv.h>

#include "conf/config.h"
#include "state/daemon.h"
#include "data/dataset.h"
#include "sess/gov.h"
#include "gpu/gpu.h"
#include "sess/linger.h"
#include "order/order.h"
#include "gpu/pool.h"
#include "data/reader.h"
#include "sess/sess.h"
#include "testutil.h"
#include "gpu/xfer.h"

#define N	   300u /* samples */
#define X_BYTES	   1000u
#define Y_BYTES	   8u
#define SEED_X	   11u
#define SEED_Y	   22u
#define MAX_MSGS   512
#define MAX_ARENAS 16

/* The dataset: two fields, a 1000-byte row and an 8-byte label. */
static struct {
	char dir[64];
	char *paths[2]; /* owned */
	struct config_field fields[2];
	struct config_dataset decl;
	struct dataset ds;
	struct dataset *dsp; /* the daemon's list of one */
} g;

/* One message the session sent its peer, the parts the tests look at. */
struct msg {
	int what; /* Pf__Envelope msg_case */
	uint64_t id;
	int32_t code;	  /* Error */
	char text[512];	  /* Error, or an error batch's message */
	uint64_t epoch;	  /* BatchReady, EpochStarted, EpochEnd */
	uint64_t batches; /* EpochStarted, EpochEnd */
	Pf__BatchReady b; /* BatchReady; b.picks owned, b.message unset,
			   * b.staged_off points at staged_off */
	uint64_t staged_off[2];
	uint64_t *ids;	    /* owned: BatchReady.gather_ids(32), NULL when not inline */
	int picks_width;    /* BatchReady: 0 (varints), 8 (picks_le) or 4 (picks_le32) */
	int ids_width;	    /* with ids: 8 (gather_ids) or 4 (gather_ids32) */
	uint32_t slab, gen; /* PoolSlab, PoolSlabGone */
	uint32_t arena;	    /* Arena */
	uint32_t slots;	    /* Opened */
	bool client_copy;   /* Opened */
	int arena_kind;	    /* Arena */
	uint64_t field_offset[2];
};

struct arena_map {
	const uint8_t *base; /* owned mapping */
	uint64_t bytes;
};

/* A pool slab as the client sees it: mapped from its fd, gen 0 once gone. */
struct slab_map {
	const uint8_t *base; /* owned mapping, kept until teardown */
	uint64_t bytes;
	uint32_t gen;
};
#define MAX_SLABS 64

struct fixture {
	uv_loop_t loop;
	struct daemon d;
	/* borrowed: the fixture whose daemon and loop serve this one's peer
	 * (itself, or the test's main fixture for another trainer: client_new) */
	struct fixture *home;
	struct peer peer;
	struct sess *s; /* the peer's session (the connection's, in the server) */
	struct msg msgs[MAX_MSGS];
	int nmsgs, seen; /* seen: taken by next_msg */
	struct arena_map arenas[MAX_ARENAS];
	struct slab_map slabs[MAX_SLABS];
	/* SessionOpened.pool, when the session gathers client-side. */
	bool gathers;
	uint32_t rec_off[2], slab_shift;
	uint64_t rec_stride;
	uint64_t last_id;
};

/* The peer's send: keeps what the tests check, maps every arena. */
static int fake_send(void *conn, const struct Pf__Envelope *penv, int fd)
{
	struct fixture *f = conn;
	const Pf__Envelope *env = (const Pf__Envelope *)penv;
	struct msg *m;

	assert_true(f->nmsgs < MAX_MSGS);
	m = &f->msgs[f->nmsgs++];
	memset(m, 0, sizeof(*m));
	m->what = env->msg_case;
	m->id = env->id;
	switch (env->msg_case) {
	case PF__ENVELOPE__MSG_ERROR:
		m->code = env->error->code;
		snprintf(m->text, sizeof(m->text), "%s", env->error->message);
		break;
	case PF__ENVELOPE__MSG_OPENED:
		m->slots = env->opened->slots;
		m->client_copy = env->opened->client_copy;
		for (size_t i = 0; i < env->opened->n_fields && i < 2; i++)
			m->field_offset[i] = env->opened->fields[i]->offset;
		f->gathers = env->opened->pool != NULL;
		if (f->gathers) {
			const Pf__PoolLayout *pl = env->opened->pool;

			assert_int_equal(pl->n_rec_off, 2);
			assert_int_equal(pl->row_bytes[0], X_BYTES);
			assert_int_equal(pl->row_bytes[1], Y_BYTES);
			f->rec_off[0] = pl->rec_off[0];
			f->rec_off[1] = pl->rec_off[1];
			f->slab_shift = pl->slab_shift;
			f->rec_stride = pl->rec_stride;
		}
		break;
	case PF__ENVELOPE__MSG_POOL_SLAB: {
		const Pf__PoolSlab *ps = env->pool_slab;
		struct slab_map *sm;

		assert_true(f->gathers);
		assert_int_equal(ps->kind, PF__ARENA_KIND__ARENA_CUDA_FD);
		assert_true(fd >= 0 && ps->id < MAX_SLABS && ps->gen > 0);
		sm = &f->slabs[ps->id];
		/* Sent once per allocation: never again while the client has it. */
		assert_int_not_equal(sm->gen, ps->gen);
		if (sm->base)
			munmap((void *)sm->base, sm->bytes);
		sm->base = mmap(NULL, ps->bytes, PROT_READ, MAP_SHARED, fd, 0);
		assert_true(sm->base != MAP_FAILED);
		sm->bytes = ps->bytes;
		sm->gen = ps->gen;
		m->slab = ps->id;
		m->gen = ps->gen;
		close(fd);
		break;
	}
	case PF__ENVELOPE__MSG_POOL_SLAB_GONE:
		assert_true(env->pool_slab_gone->id < MAX_SLABS);
		assert_int_equal(f->slabs[env->pool_slab_gone->id].gen, env->pool_slab_gone->gen);
		f->slabs[env->pool_slab_gone->id].gen = 0;
		m->slab = env->pool_slab_gone->id;
		m->gen = env->pool_slab_gone->gen;
		break;
	case PF__ENVELOPE__MSG_ARENA: {
		const Pf__Arena *a = env->arena;

		assert_true(fd >= 0);
		assert_true(a->id < MAX_ARENAS);
		f->arenas[a->id].base = mmap(NULL, a->bytes, PROT_READ, MAP_SHARED, fd, 0);
		assert_true(f->arenas[a->id].base != MAP_FAILED);
		f->arenas[a->id].bytes = a->bytes;
		m->arena = a->id;
		m->arena_kind = a->kind;
		close(fd);
		break;
	}
	case PF__ENVELOPE__MSG_BATCH: {
		const Pf__BatchReady *b = env->batch;

		m->b = *b;
		m->epoch = m->b.epoch;
		m->b.message = NULL;
		m->b.picks_le.data = m->b.picks_le32.data = m->b.gather_ids32.data = NULL;
		if (b->message)
			snprintf(m->text, sizeof(m->text), "%s", b->message);
		/* The picks in exactly one form, each read as a client does
		 * (little-endian words), into b.picks. */
		m->b.picks = malloc((m->b.count ? m->b.count : 1) * sizeof(uint64_t));
		assert_non_null(m->b.picks);
		if (b->picks_le32.len) {
			const uint32_t *p32 = (const uint32_t *)b->picks_le32.data;

			m->picks_width = 4;
			assert_int_equal(b->picks_le32.len, (size_t)b->count * 4);
			assert_int_equal(b->picks_le.len + b->n_picks, 0);
			for (uint32_t i = 0; i < b->count; i++)
				m->b.picks[i] = le32toh(p32[i]);
		} else if (b->picks_le.len) {
			const uint64_t *p64 = (const uint64_t *)b->picks_le.data;

			m->picks_width = 8;
			assert_int_equal(b->picks_le.len, (size_t)b->count * 8);
			assert_int_equal(b->n_picks, 0);
			for (uint32_t i = 0; i < b->count; i++)
				m->b.picks[i] = le64toh(p64[i]);
		} else {
			assert_int_equal(b->n_picks, b->count);
			memcpy(m->b.picks, b->picks, m->b.count * sizeof(uint64_t));
		}
		if (m->b.gather) {
			assert_true(f->gathers);
			assert_int_equal(m->b.n_staged_off, 2);
			memcpy(m->staged_off, env->batch->staged_off, sizeof(m->staged_off));
			m->b.staged_off = m->staged_off;
		}
		m->b.gather_ids.data = NULL;
		if (b->gather_ids.len || b->gather_ids32.len) {
			const uint32_t *ids32 = (const uint32_t *)b->gather_ids32.data;
			const uint64_t *ids64 = (const uint64_t *)b->gather_ids.data;

			m->ids_width = ids32 ? 4 : 8;
			assert_false(b->gather_ids.len && b->gather_ids32.len);
			assert_int_equal(b->gather_ids.len + b->gather_ids32.len,
					 (size_t)m->b.count * m->ids_width);
			assert_int_equal(m->b.nstaged, 0);
			m->ids = malloc((size_t)m->b.count * sizeof(uint64_t) + 1);
			assert_non_null(m->ids);
			for (uint32_t i = 0; i < b->count; i++)
				m->ids[i] = ids32 ? le32toh(ids32[i]) : le64toh(ids64[i]);
		}
		break;
	}
	case PF__ENVELOPE__MSG_STARTED:
		m->epoch = env->started->epoch;
		m->batches = env->started->batches;
		break;
	case PF__ENVELOPE__MSG_END:
		m->epoch = env->end->epoch;
		m->batches = env->end->batches;
		break;
	default: break;
	}
	return 0;
}

static int group_setup(void **state)
{
	static const char *names[2] = {"x", "y"};
	static const uint64_t x_shape[1] = {X_BYTES};

	(void)state;
	strcpy(g.dir, "/tmp/test_sess.XXXXXX");
	if (!mkdtemp(g.dir))
		return -1;
	for (int i = 0; i < 2; i++) {
		if (asprintf(&g.paths[i], "%s/%s.npy", g.dir, names[i]) < 0)
			return -1;
		g.fields[i] = (struct config_field){(char *)names[i], &g.paths[i], 1};
	}
	if (td_write_npy(g.paths[0], 1, "|u1", 1, N, x_shape, 1, SEED_X, 0) ||
	    td_write_npy(g.paths[1], 1, "<u8", 8, N, NULL, 0, SEED_Y, 0))
		return -1;
	g.decl = (struct config_dataset){
		.name = "ds", .format = "npy", .fields = g.fields, .nfields = 2};
	if (ds_load(&g.ds, &g.decl)) {
		fprintf(stderr, "ds_load: %s\n", g.ds.error);
		return -1;
	}
	g.dsp = &g.ds;
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	ds_close(&g.ds);
	for (int i = 0; i < 2; i++) {
		unlink(g.paths[i]);
		free(g.paths[i]);
	}
	rmdir(g.dir);
	return 0;
}

/* GPUs of the fake back end the next setup gives its daemon. */
static int setup_gpus = 1;

static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));
	char err[256];

	assert_non_null(f);
	f->home = f;
	gpu_fake_reset();
	gpu_fake_set_devices(setup_gpus);
	assert_int_equal(uv_loop_init(&f->loop), 0);
	config_defaults(&f->d.cfg);
	f->d.cfg.readers = 2;
	f->d.cfg.depth = 3;
	f->d.loop = &f->loop;
	f->d.datasets = &g.dsp;
	f->d.ndatasets = 1;
	f->d.started_ns = now_ns();
	daemon_config_pools(&f->d);
	daemon_config_quota(&f->d);
	f->d.ngpus = gpu_init(f->d.gpu_desc, sizeof(f->d.gpu_desc));
	assert_int_equal(f->d.ngpus, setup_gpus);
	f->d.xfers = calloc((size_t)setup_gpus, sizeof(*f->d.xfers));
	assert_non_null(f->d.xfers);
	assert_int_equal(ring_init(&f->d.ring, 16u << 20, err, sizeof(err)), 0);
	assert_int_equal(reader_start(&f->d.readers, 2, &f->loop, sess_job_done, &f->d), 0);
	assert_int_equal(linger_init(&f->d), 0);
	f->peer = (struct peer){.conn = f, .send = fake_send, .uid = getuid(), .pid = getpid()};
	snprintf(f->peer.name, sizeof(f->peer.name), "test peer");
	*state = f;
	return 0;
}

/* Turns the loop until pred(f) holds, checking the session on the way. */
static void run_until(struct fixture *f, bool (*pred)(struct fixture *f))
{
	for (int i = 0; i < 5000; i++) {
		uv_run(&f->home->loop, UV_RUN_NOWAIT);
		if (f->s)
			assert_true(sess_check(f->s));
		if (pred(f))
			return;
		usleep(1000);
	}
	fail_msg("timed out waiting (%d messages, %u jobs)", f->nmsgs, f->s ? f->s->jobs : 0);
}

static bool no_jobs(struct fixture *f)
{
	return !f->s || (f->s->jobs == 0 && !f->s->ahead.busy);
}

/* What a fixture's peer was sent and mapped goes, and the fixture. */
static void client_free(struct fixture *f)
{
	for (int i = 0; i < f->nmsgs; i++) {
		free(f->msgs[i].b.picks);
		free(f->msgs[i].ids);
	}
	for (int a = 0; a < MAX_ARENAS; a++)
		if (f->arenas[a].base)
			munmap((void *)f->arenas[a].base, f->arenas[a].bytes);
	for (int j = 0; j < MAX_SLABS; j++)
		if (f->slabs[j].base)
			munmap((void *)f->slabs[j].base, f->slabs[j].bytes);
	free(f);
}

/* Another trainer of home's daemon: its own peer, session and messages. */
static struct fixture *client_new(struct fixture *home)
{
	struct fixture *c = calloc(1, sizeof(*c));

	assert_non_null(c);
	c->home = home;
	c->peer = (struct peer){.conn = c, .send = fake_send, .uid = getuid(), .pid = getpid()};
	snprintf(c->peer.name, sizeof(c->peer.name), "test peer %p", (void *)c);
	return c;
}

/* The trainer leaves: its session is detached, its mappings go. */
static void client_end(struct fixture *c)
{
	if (c->s)
		sess_detach(c->s);
	c->s = NULL;
	client_free(c);
}

static int teardown(void **state)
{
	struct fixture *f = *state;

	if (f->s) {
		sess_detach(f->s);
		f->s = NULL;
	}
	assert_int_equal(f->d.nsessions, 0);
	f->d.stopping = true;
	reader_stop(f->d.readers);
	for (int i = 0; i < f->d.ngpus; i++)
		if (f->d.xfers[i])
			xfer_stop(f->d.xfers[i]);
	linger_stop(&f->d);
	sess_pump_stop(&f->d);
	uv_run(&f->loop, UV_RUN_DEFAULT);
	free(f->d.linger);
	order_keep_purge(&f->d.kept, INT64_MAX);
	/* Pools first, as main.c does: a lingering pool's slabs are freed
	 * through the transfer thread's memory calls (xfer_free_mem). */
	pool_destroy_all(&f->d.pools);
	for (int i = 0; i < f->d.ngpus; i++)
		if (f->d.xfers[i])
			xfer_free(f->d.xfers[i]);
	free(f->d.xfers);
	assert_int_equal(gpu_fake_live_allocs(), 0);
	ring_destroy(&f->d.ring);
	assert_int_equal(uv_loop_close(&f->loop), 0);
	/* Every byte and session the session took went back. */
	assert_true(quota_check(&f->d.quota));
	assert_int_equal(f->d.quota.held[QUOTA_MEMORY], 0);
	assert_int_equal(f->d.quota.held[QUOTA_SESSIONS], 0);
	quota_free(&f->d.quota);
	config_free(&f->d.cfg);
	client_free(f);
	return 0;
}

/* ---- driving ---------------------------------------------------------------- */

static struct msg *last(struct fixture *f)
{
	assert_true(f->nmsgs > 0);
	return &f->msgs[f->nmsgs - 1];
}

static bool open_gather;   /* open_session asks to gather client-side */
static bool open_copy;	   /* open_session says the client can copy batches itself */
static bool open_picks_le; /* ... takes picks as picks_le */
static bool open_narrow;   /* ... takes 4-byte picks and gather ids */
static uint32_t open_augment;

static void open_session(struct fixture *f, const char *device, uint32_t batch, uint32_t max_depth)
{
	Pf__OpenSession req = PF__OPEN_SESSION__INIT;
	int before = f->nmsgs;

	req.gather = open_gather;
	req.client_copy = open_copy;
	req.picks_le = open_picks_le;
	req.narrow = open_narrow;
	req.augment = open_augment;
	req.dataset = "ds";
	req.name = "";
	req.device = (char *)device;
	req.batch_size = batch;
	req.max_depth = max_depth;
	assert_int_equal(sess_open(&f->home->d, &f->peer, &f->s, ++f->last_id, &req), 0);
	assert_non_null(f->s);
	assert_true(f->nmsgs > before);
	assert_int_equal(f->msgs[before].what, PF__ENVELOPE__MSG_OPENED);
	assert_int_equal(f->msgs[before].id, f->last_id);
	assert_int_equal(f->msgs[before].slots, f->s->nslots);
	f->seen = f->nmsgs;
	assert_true(sess_check(f->s));
}

static uint64_t want_epoch;

static bool epoch_started(struct fixture *f)
{
	return f->s->had_epoch && f->s->epoch == want_epoch;
}

/* Starts an epoch; true when its order came at once (built ahead, kept
 * from an earlier epoch or session), with nothing to build.  That is read
 * before the loop runs: a small build can come back on its first turn. */
static bool start_req(struct fixture *f, const Pf__StartEpoch *req)
{
	bool taken;

	assert_int_equal(sess_start_epoch(f->s, ++f->last_id, req), 0);
	assert_true(sess_check(f->s));
	taken = f->s->building == NULL;
	/* The order is built off the loop (or taken from the one built
	 * ahead): the epoch starts when it is back. */
	want_epoch = req->epoch;
	run_until(f, epoch_started);
	return taken;
}

static bool start_epoch(struct fixture *f, uint64_t epoch, Pf__Order order, uint64_t seed)
{
	Pf__StartEpoch req = PF__START_EPOCH__INIT;

	req.epoch = epoch, req.order = order, req.seed = seed;
	return start_req(f, &req);
}

static void ack(struct fixture *f, uint64_t epoch)
{
	Pf__Ack req = PF__ACK__INIT;

	req.epoch = epoch;
	sess_ack(f->s, &req);
	assert_true(sess_check(f->s));
}

static void release(struct fixture *f, int32_t slot, uint64_t epoch, uint64_t seq)
{
	Pf__Release req = PF__RELEASE__INIT;

	req.slot = slot, req.epoch = epoch, req.seq = seq;
	sess_release(f->s, &req);
	assert_true(sess_check(f->s));
}

static bool have_unseen(struct fixture *f)
{
	return f->nmsgs > f->seen;
}

/* A message a test has checked already: next_msg passes over it. */
#define CHECKED (-1)

/* The next message the session sends, waiting for it.  Arenas (mapped as
 * they arrive) come whenever a CUDA session's pump grows: passed over. */
static struct msg *next_msg(struct fixture *f)
{
	for (;;) {
		struct msg *m;

		run_until(f, have_unseen);
		m = &f->msgs[f->seen++];
		if (m->what != PF__ENVELOPE__MSG_ARENA && m->what != CHECKED &&
		    m->what != PF__ENVELOPE__MSG_POOL_SLAB &&
		    m->what != PF__ENVELOPE__MSG_POOL_SLAB_GONE)
			return m;
	}
}

/* Opens a session, starts epoch 1 and returns its first batch. */
static struct msg *first_batch(struct fixture *f, const char *device, uint32_t batch,
			       Pf__Order order, uint64_t seed)
{
	struct msg *m;

	open_session(f, device, batch, 0);
	start_epoch(f, 1, order, seed);
	m = next_msg(f);
	assert_int_equal(m->what, PF__ENVELOPE__MSG_STARTED);
	m = next_msg(f);
	assert_int_equal(m->what, PF__ENVELOPE__MSG_BATCH);
	return m;
}

/* The client's gather, as libprefetch's kernel does it (gather.cu, entry
 * mode), on the CPU: every row of batch m from the pool slab its index
 * entry names or from its staged row, through the client's mappings. */
static void client_gather(const struct fixture *f, const struct msg *m, uint8_t *slot)
{
	const struct arena_map *a = &f->arenas[m->b.arena];
	const uint64_t *off = f->msgs[0].field_offset;
	const uint32_t rows[2] = {X_BYTES, Y_BYTES};
	/* The index: in the message (a batch of hits only), else in the
	 * slot's tail, where the daemon copied it. */
	const uint64_t *desc = m->ids ? m->ids : (const uint64_t *)(a->base + m->b.gather_desc);

	assert_true(m->b.gather_desc + (uint64_t)m->b.count * 8 <= a->bytes);
	for (uint64_t i = 0; i < m->b.count; i++) {
		for (int fl = 0; fl < 2; fl++) {
			const uint8_t *src;

			if (desc[i] & GPU_GATHER_STAGED) {
				uint64_t k = desc[i] & ~GPU_GATHER_STAGED;

				assert_true(k < m->b.nstaged);
				src = a->base + m->b.staged_off[fl] + k * rows[fl];
				assert_true(m->b.staged_off[fl] + (k + 1) * rows[fl] <= a->bytes);
			} else {
				uint64_t j = desc[i] >> f->slab_shift;
				uint64_t idx = desc[i] & ((1ull << f->slab_shift) - 1);

				/* A slab the client has, never one announced gone. */
				assert_true(j < MAX_SLABS && f->slabs[j].gen > 0);
				assert_true((idx + 1) * f->rec_stride <= f->slabs[j].bytes);
				src = f->slabs[j].base + idx * f->rec_stride + f->rec_off[fl];
			}
			memcpy(slot + off[fl] + i * rows[fl], src, rows[fl]);
		}
	}
}

/* Every row of batch m holds its sample's bytes, read through the arena
 * (after the client's gather, for a batch the client assembles). */
static void check_rows(const struct fixture *f, const struct msg *m)
{
	const struct arena_map *a = &f->arenas[m->b.arena];
	const uint64_t *off = f->msgs[0].field_offset;
	uint8_t *gathered = NULL;
	const uint8_t *slot;

	assert_non_null(a->base);
	assert_true(m->b.offset + f->s->lay.slot_bytes <= a->bytes);
	slot = a->base + m->b.offset;
	if (m->b.gather) {
		gathered = calloc(1, f->s->lay.slot_bytes);
		assert_non_null(gathered);
		client_gather(f, m, gathered);
		slot = gathered;
	}
	for (uint64_t i = 0; i < m->b.count; i++) {
		uint64_t row = m->b.picks[i] % N;

		if (!td_row_ok(slot + off[0] + i * X_BYTES, X_BYTES, SEED_X, row) ||
		    !td_row_ok(slot + off[1] + i * Y_BYTES, Y_BYTES, SEED_Y, row))
			fail_msg("batch %llu row %llu (sample %llu) holds the wrong bytes",
				 (unsigned long long)m->b.seq, (unsigned long long)i,
				 (unsigned long long)row);
	}
	free(gathered);
}

/* Runs epoch `epoch` to its end as a trainer does: takes each batch (ack),
 * checks it, releases it.  The picks must be the order's, every sample
 * once; returns the number of batches. */
static uint64_t consume_epoch(struct fixture *f, uint64_t epoch, const struct order_spec *spec,
			      uint32_t batch)
{
	uint64_t *want = NULL, nwant = 0, seq = 0, at = 0;
	uint8_t *seen = calloc(N, 1);
	char err[200];
	struct msg *m;

	assert_non_null(seen);
	assert_int_equal(order_build(spec, N, &want, &nwant, err, sizeof(err)), 0);
	m = next_msg(f);
	assert_int_equal(m->what, PF__ENVELOPE__MSG_STARTED);
	assert_int_equal(m->epoch, epoch);
	assert_int_equal(m->batches, (nwant + batch - 1) / batch);
	for (;;) {
		m = next_msg(f);
		if (m->what == PF__ENVELOPE__MSG_END)
			break;
		assert_int_equal(m->what, PF__ENVELOPE__MSG_BATCH);
		assert_int_equal(m->epoch, epoch);
		assert_int_equal(m->b.seq, seq);
		assert_int_equal(m->b.error, 0);
		assert_true(m->b.slot >= 0);
		assert_int_equal(m->b.count, nwant - at < batch ? nwant - at : batch);
		for (uint64_t i = 0; i < m->b.count; i++) {
			assert_int_equal(m->b.picks[i], want[at + i]);
			assert_int_equal(seen[m->b.picks[i]], 0);
			seen[m->b.picks[i]] = 1;
		}
		check_rows(f, m);
		ack(f, epoch);
		release(f, m->b.slot, epoch, m->b.seq);
		at += m->b.count;
		seq++;
	}
	assert_int_equal(m->epoch, epoch);
	assert_int_equal(m->batches, seq);
	assert_int_equal(at, N);
	for (uint64_t i = 0; i < N; i++)
		assert_int_equal(seen[i], 1);
	assert_false(f->s->running);
	free(want);
	free(seen);
	return seq;
}

/* The honest probe sizes the pool; the next epochs (2, 3, ...) fill it:
 * misses are admitted once a slab has come, the rest back-filled. */
static void fill_pool(struct fixture *f, struct order_spec *spec)
{
	Pf__Probe probe = PF__PROBE__INIT;

	probe.free_bytes = 60ull << 30;
	probe.total_bytes = 80ull << 30;
	sess_probe(f->s, &probe);
	for (uint64_t e = 2; f->s->cuda.pool->rows < N; e++) {
		assert_true(e <= 8);
		spec->seed = e;
		start_epoch(f, e, PF__ORDER__ORDER_SHUFFLE, e);
		consume_epoch(f, e, spec, 32);
		assert_true(pool_check(f->s->cuda.pool));
	}
}

/* ---- cases ------------------------------------------------------------------- */

static void a_host_epoch_delivers_every_sample_once_with_its_bytes(void **state)
{
	struct fixture *f = *state;
	struct order_spec spec = {.kind = ORDER_SHUFFLE, .seed = 7};

	open_session(f, "host", 32, 0);
	assert_int_equal(f->s->gpu, -1);
	/* The arenas came right after Opened, each with its memfd. */
	for (int i = 1; i < f->nmsgs; i++)
		assert_int_equal(f->msgs[i].what, PF__ENVELOPE__MSG_ARENA);
	start_epoch(f, 1, PF__ORDER__ORDER_SHUFFLE, 7);
	assert_int_equal(consume_epoch(f, 1, &spec, 32), 10); /* 9 of 32, one of 12 */
	/* The next shuffle was built ahead; epoch 2 takes it. */
	run_until(f, no_jobs);
	spec.seed = 8;
	start_epoch(f, 2, PF__ORDER__ORDER_SHUFFLE, 8);
	assert_int_equal(consume_epoch(f, 2, &spec, 32), 10);
}

/* The order of the epoch that ended goes to the next build ahead, on the
 * pool thread, not freed on the loop in front of the next epoch's first
 * batch: the build writes the next order into it.  An epoch after which
 * nothing is built ahead frees it at once. */
static void the_last_epochs_order_is_freed_by_the_next_build(void **state)
{
	struct fixture *f = *state;
	struct order_spec spec = {.kind = ORDER_SHUFFLE, .seed = 7};
	const uint64_t *first;

	open_session(f, "host", 32, 0);
	start_epoch(f, 1, PF__ORDER__ORDER_SHUFFLE, 7);
	assert_int_equal(consume_epoch(f, 1, &spec, 32), 10);
	run_until(f, no_jobs);
	assert_true(f->s->ahead.ready);
	assert_int_equal(f->s->ahead.freed_off_loop, 0);
	first = f->s->picks;
	assert_non_null(first);
	spec.seed = 8;
	start_epoch(f, 2, PF__ORDER__ORDER_SHUFFLE, 8);
	/* Epoch 1's order went with the build of epoch 3's, which built
	 * into it (consume_epoch checks every order's picks). */
	assert_null(f->s->ahead.garbage);
	assert_int_equal(consume_epoch(f, 2, &spec, 32), 10);
	run_until(f, no_jobs);
	assert_int_equal(f->s->ahead.freed_off_loop, 1);
	assert_true(f->s->ahead.ready);
	assert_ptr_equal(f->s->ahead.picks, first);
	spec.seed = 9;
	start_epoch(f, 3, PF__ORDER__ORDER_SHUFFLE, 9);
	assert_ptr_equal(f->s->picks, first);
	assert_int_equal(consume_epoch(f, 3, &spec, 32), 10);
	run_until(f, no_jobs);
	assert_int_equal(f->s->ahead.freed_off_loop, 2);
	/* Nothing is built after a sequential epoch: epoch 3's order is
	 * freed as the epoch starts, on the loop. */
	spec = (struct order_spec){.kind = ORDER_SEQ};
	start_epoch(f, 4, PF__ORDER__ORDER_SEQUENTIAL, 0);
	assert_null(f->s->ahead.garbage);
	assert_int_equal(consume_epoch(f, 4, &spec, 32), 10);
	run_until(f, no_jobs);
	assert_int_equal(f->s->ahead.freed_off_loop, 2);
}

/* A sequential epoch after a sequential epoch of the same share starts
 * from the last one's order as it is: nothing is built (the trainer would
 * wait for it), the picks are checked whole, and the order's quota stays
 * what it was.  A shuffle after it builds as before. */
static void a_sequential_order_serves_the_next_sequential_epoch_as_it_is(void **state)
{
	struct fixture *f = *state;
	struct order_spec spec = {.kind = ORDER_SEQ};
	const uint64_t *first;
	uint64_t held;

	open_session(f, "host", 32, 0);
	start_epoch(f, 1, PF__ORDER__ORDER_SEQUENTIAL, 0);
	assert_int_equal(consume_epoch(f, 1, &spec, 32), 10);
	run_until(f, no_jobs);
	first = f->s->picks;
	held = f->s->order_held;
	assert_non_null(first);
	assert_int_equal(held, N * sizeof(uint64_t));
	/* No build: the order is there. */
	assert_true(start_epoch(f, 2, PF__ORDER__ORDER_SEQUENTIAL, 0));
	assert_ptr_equal(f->s->picks, first);
	assert_int_equal(f->s->order_held, held);
	assert_int_equal(consume_epoch(f, 2, &spec, 32), 10);
	run_until(f, no_jobs);
	spec = (struct order_spec){.kind = ORDER_SHUFFLE, .seed = 3};
	assert_false(start_epoch(f, 3, PF__ORDER__ORDER_SHUFFLE, 3));
	assert_int_equal(consume_epoch(f, 3, &spec, 32), 10);
	run_until(f, no_jobs);
	assert_int_equal(f->s->order_held, N * sizeof(uint64_t));
}

/* Starts a block-shuffled epoch of blocks of `rows` and windows of
 * `window`; true when its order was the one built ahead (taken at once,
 * nothing to build). */
static bool start_block_epoch(struct fixture *f, uint64_t epoch, uint64_t seed, uint64_t rows,
			      uint64_t window)
{
	Pf__StartEpoch req = PF__START_EPOCH__INIT;
	bool taken;

	req.epoch = epoch, req.order = PF__ORDER__ORDER_BLOCK_SHUFFLE, req.seed = seed;
	req.block_rows = rows, req.window_blocks = window;
	taken = start_req(f, &req);
	assert_int_equal(f->s->block_rows, rows);
	assert_int_equal(f->s->window_blocks, window);
	return taken;
}

static void a_block_shuffled_epoch_has_its_successor_built_ahead(void **state)
{
	struct fixture *f = *state;
	struct order_spec spec = {.kind = ORDER_BLOCK_SHUFFLE,
				  .seed = 7,
				  .samples = N,
				  .block_rows = 16,
				  .window_blocks = 3};

	open_session(f, "host", 32, 0);
	assert_false(start_block_epoch(f, 1, 7, 16, 3));
	assert_int_equal(consume_epoch(f, 1, &spec, 32), 10);
	run_until(f, no_jobs);
	assert_true(f->s->ahead.ready);
	/* The next seed with the same blocks: the order built ahead. */
	spec.seed = 8;
	assert_true(start_block_epoch(f, 2, 8, 16, 3));
	assert_int_equal(consume_epoch(f, 2, &spec, 32), 10);
	run_until(f, no_jobs);
	/* Other blocks: built anew, and the right order for them. */
	spec.seed = 9;
	spec.block_rows = 17;
	assert_false(start_block_epoch(f, 3, 9, 17, 3));
	assert_int_equal(consume_epoch(f, 3, &spec, 32), 10);
	run_until(f, no_jobs);
	/* A shuffle of the same seed is not the block order built ahead. */
	spec = (struct order_spec){.kind = ORDER_SHUFFLE, .seed = 10};
	start_epoch(f, 4, PF__ORDER__ORDER_SHUFFLE, 10);
	assert_int_equal(consume_epoch(f, 4, &spec, 32), 10);
}

/* A session that runs one shuffled epoch, checked, and goes; taken: its
 * order must (not) have come at once. */
static void session_of_one_epoch(struct fixture *f, uint64_t epoch, uint64_t seed, bool taken)
{
	struct order_spec spec = {.kind = ORDER_SHUFFLE, .seed = seed};

	open_session(f, "host", 32, 0);
	assert_int_equal(start_epoch(f, epoch, PF__ORDER__ORDER_SHUFFLE, seed), taken);
	assert_int_equal(consume_epoch(f, epoch, &spec, 32), 10);
	run_until(f, no_jobs);
	sess_detach(f->s);
	f->s = NULL;
}

static void an_order_outlives_its_session_for_the_trainer_that_comes_back(void **state)
{
	struct fixture *f = *state;
	struct order_spec spec = {.kind = ORDER_SHUFFLE, .seed = 7};

	open_session(f, "host", 32, 0);
	assert_false(start_epoch(f, 1, PF__ORDER__ORDER_SHUFFLE, 7));
	consume_epoch(f, 1, &spec, 32);
	run_until(f, no_jobs);
	assert_true(f->s->ahead.ready); /* seed 8 */
	/* The trainer goes: its epoch's order and the one built ahead stay,
	 * held by no uid's quota. */
	sess_detach(f->s);
	f->s = NULL;
	assert_int_equal(f->d.kept.n, 2);
	assert_int_equal(f->d.kept.bytes, 2 * N * sizeof(uint64_t));
	assert_int_equal(f->d.quota.held[QUOTA_MEMORY], 0);

	/* Restarted, it redoes epoch 1: the kept order, at once, and the
	 * right one (every sample once, in seed 7's order). */
	open_session(f, "host", 32, 0);
	assert_true(start_epoch(f, 1, PF__ORDER__ORDER_SHUFFLE, 7));
	assert_int_equal(f->d.kept.n, 1);
	assert_int_equal(consume_epoch(f, 1, &spec, 32), 10);
	run_until(f, no_jobs);
	sess_detach(f->s);
	f->s = NULL;

	/* A Loader per epoch: the next session's epoch 2 (seed 8) is the
	 * order the first one built ahead. */
	session_of_one_epoch(f, 2, 8, true);
	/* Another rank's share is another order: built anew. */
	open_session(f, "host", 32, 0);
	{
		Pf__StartEpoch req = PF__START_EPOCH__INIT;

		req.epoch = 2, req.order = PF__ORDER__ORDER_SHUFFLE, req.seed = 8;
		req.rank = 1, req.world = 2;
		assert_false(start_req(f, &req));
	}
	run_until(f, no_jobs);
	sess_detach(f->s);
	f->s = NULL;
	/* They expire with pool_linger; with pool_linger = 0 none is kept. */
	assert_true(f->d.kept.n > 0);
	order_keep_purge(&f->d.kept, now_ns() + (int64_t)(f->d.cfg.pool_linger * 1e9) + 1);
	assert_int_equal(f->d.kept.n, 0);
	assert_int_equal(f->d.kept.bytes, 0);
	f->d.cfg.pool_linger = 0;
	session_of_one_epoch(f, 3, 9, false);
	assert_int_equal(f->d.kept.n, 0);
}

static uint64_t want_sent;

static bool all_sent(struct fixture *f)
{
	return f->s->sent == want_sent && f->s->jobs == 0;
}

static void the_pump_keeps_target_batches_ahead_and_no_more(void **state)
{
	struct fixture *f = *state;
	uint64_t sent;

	open_session(f, "host", 10, 0);
	assert_int_equal(f->s->gov.target, 3);
	start_epoch(f, 1, PF__ORDER__ORDER_SEQUENTIAL, 0);
	want_sent = 3;
	run_until(f, all_sent);
	/* Nothing taken: nothing more is read, however long we wait. */
	for (int i = 0; i < 50; i++) {
		uv_run(&f->loop, UV_RUN_NOWAIT);
		usleep(1000);
	}
	assert_int_equal(f->s->sent, 3);
	assert_int_equal(f->s->jobs, 0);
	assert_int_equal(f->s->next_fill, 3);
	/* One taken: one more goes out. */
	ack(f, 1);
	sent = f->s->sent;
	assert_true(sent == 3 || sent == 4);
	want_sent = 4;
	run_until(f, all_sent);
	assert_int_equal(f->s->gov.consumed, 1);
	assert_int_equal(f->s->next_fill, 4);
	for (int i = 0; i < 50; i++) {
		uv_run(&f->loop, UV_RUN_NOWAIT);
		usleep(1000);
	}
	assert_int_equal(f->s->sent, 4);
}

static void a_release_of_a_batch_not_held_is_refused_and_the_epoch_goes_on(void **state)
{
	struct fixture *f = *state;
	struct msg *m, *held;

	held = first_batch(f, "host", 50, PF__ORDER__ORDER_SEQUENTIAL, 0);
	release(f, (int32_t)f->s->nslots, 1, 0);
	m = last(f);
	assert_int_equal(m->what, PF__ENVELOPE__MSG_ERROR);
	assert_int_equal(m->code, -EINVAL);
	assert_non_null(strstr(m->text, "has slots 0.."));
	m->what = CHECKED;
	release(f, held->b.slot, 1, 5); /* the right slot, another batch */
	m = last(f);
	assert_int_equal(m->what, PF__ENVELOPE__MSG_ERROR);
	assert_int_equal(m->code, -EPERM);
	assert_non_null(strstr(m->text, "does not hold that batch"));
	m->what = CHECKED;
	/* The batch is still held; taken and released properly, the rest of
	 * the epoch comes. */
	check_rows(f, held);
	ack(f, 1);
	release(f, held->b.slot, 1, 0);
	for (uint64_t seq = 1; seq < N / 50; seq++) {
		m = next_msg(f);
		assert_int_equal(m->what, PF__ENVELOPE__MSG_BATCH);
		assert_int_equal(m->b.seq, seq);
		assert_int_equal(m->b.picks[0], seq * 50);
		check_rows(f, m);
		ack(f, 1);
		release(f, m->b.slot, 1, m->b.seq);
	}
	m = next_msg(f);
	assert_int_equal(m->what, PF__ENVELOPE__MSG_END);
}

static void an_abandoned_epoch_frees_its_slots_and_the_next_one_starts_clean(void **state)
{
	struct fixture *f = *state;
	struct order_spec spec = {.kind = ORDER_SEQ};
	Pf__Abandon ab = PF__ABANDON__INIT;
	int after;

	first_batch(f, "host", 16, PF__ORDER__ORDER_SHUFFLE, 3);
	ack(f, 1); /* taken, and held */
	ab.epoch = 1;
	assert_int_equal(sess_abandon(f->s, ++f->last_id, &ab), 0);
	assert_int_equal(last(f)->what, PF__ENVELOPE__MSG_OK);
	after = f->nmsgs;
	assert_false(f->s->running);
	run_until(f, no_jobs);
	/* Nothing of epoch 1 is sent after the abandon.  What went out
	 * before it goes back, as the client releases stale batches. */
	for (int i = after; i < f->nmsgs; i++)
		assert_int_not_equal(f->msgs[i].what, PF__ENVELOPE__MSG_BATCH);
	for (int i = 0; i < after; i++)
		if (f->msgs[i].what == PF__ENVELOPE__MSG_BATCH)
			release(f, f->msgs[i].b.slot, 1, f->msgs[i].b.seq);
	for (uint32_t i = 0; i < f->s->nslots; i++)
		assert_int_equal(f->s->slots[i].state, SLOT_FREE);
	f->seen = f->nmsgs;
	start_epoch(f, 2, PF__ORDER__ORDER_SEQUENTIAL, 0);
	ack(f, 1); /* a straggler of epoch 1: it must not count */
	assert_int_equal(f->s->gov.consumed, 0);
	assert_int_equal(consume_epoch(f, 2, &spec, 16), (N + 15) / 16);
}

static void a_detached_session_is_freed_once_its_reads_are_back(void **state)
{
	struct fixture *f = *state;

	open_session(f, "host", 64, 0);
	start_epoch(f, 1, PF__ORDER__ORDER_SHUFFLE, 1);
	assert_true(f->s->jobs > 0); /* reads in flight */
	sess_detach(f->s);
	f->s = NULL;
	assert_int_equal(f->d.nsessions, 0);
	assert_int_equal(g.ds.users, 1); /* still held by the dead session */
	for (int i = 0; i < 5000 && g.ds.users; i++) {
		uv_run(&f->loop, UV_RUN_NOWAIT);
		usleep(1000);
	}
	assert_int_equal(g.ds.users, 0);
}

static void a_paced_request_that_cannot_be_served_is_an_error_batch_in_its_place(void **state)
{
	struct fixture *f = *state;
	Pf__LoadBatch req = PF__LOAD_BATCH__INIT;
	uint64_t good[3] = {5, 9, 2}, bad[2] = {1, N + 4};
	struct msg *m;

	open_session(f, "host", 4, 0);
	start_epoch(f, 1, PF__ORDER__ORDER_PACED, 0);
	req.epoch = 1;
	req.picks = good;
	req.n_picks = 3;
	assert_int_equal(sess_load(f->s, ++f->last_id, &req), 0);
	req.picks = bad;
	req.n_picks = 2;
	assert_int_equal(sess_load(f->s, ++f->last_id, &req), 0);
	req.picks = good;
	req.n_picks = 1;
	assert_int_equal(sess_load(f->s, ++f->last_id, &req), 0);
	req.n_picks = 0;
	req.end = true;
	assert_int_equal(sess_load(f->s, ++f->last_id, &req), 0);
	m = next_msg(f);
	assert_int_equal(m->what, PF__ENVELOPE__MSG_STARTED);
	m = next_msg(f);
	assert_int_equal(m->b.seq, 0);
	assert_int_equal(m->b.count, 3);
	assert_memory_equal(m->b.picks, good, sizeof(good));
	check_rows(f, m);
	ack(f, 1);
	release(f, m->b.slot, 1, 0);
	m = next_msg(f);
	assert_int_equal(m->b.seq, 1);
	assert_int_equal(m->b.slot, -1);
	assert_int_equal(m->b.error, -ERANGE);
	assert_non_null(strstr(m->text, "out of range"));
	ack(f, 1);
	m = next_msg(f);
	assert_int_equal(m->b.seq, 2);
	assert_int_equal(m->b.picks[0], 5);
	check_rows(f, m);
	ack(f, 1);
	release(f, m->b.slot, 1, 2);
	m = next_msg(f);
	assert_int_equal(m->what, PF__ENVELOPE__MSG_END);
	assert_int_equal(m->batches, 3);
}

static void a_cuda_epoch_on_the_fake_gpu_is_byte_exact_through_device_arenas(void **state)
{
	struct fixture *f = *state;
	struct order_spec spec = {.kind = ORDER_SHUFFLE, .seed = 5};
	uint64_t hits, h2d;

	open_session(f, "cuda:0", 32, 0);
	assert_int_equal(f->s->gpu, 0);
	assert_true(f->s->cuda.lease.nslots > 0);
	start_epoch(f, 1, PF__ORDER__ORDER_SHUFFLE, 5);
	/* Device arenas come as the pump asks for them; batches only after. */
	assert_int_equal(consume_epoch(f, 1, &spec, 32), 10);
	assert_true(f->s->cuda.narenas > 0);
	assert_true(f->s->cuda.h2d_bytes >= (uint64_t)N * (X_BYTES + Y_BYTES));
	/* Once the pool holds every sample an epoch is served from it: all
	 * hits, no sample byte over PCIe, byte for byte the same. */
	fill_pool(f, &spec);
	hits = f->s->cuda.pool_hits;
	h2d = f->s->cuda.h2d_bytes;
	spec.seed = 100;
	start_epoch(f, 100, PF__ORDER__ORDER_SHUFFLE, 100);
	consume_epoch(f, 100, &spec, 32);
	assert_int_equal(f->s->cuda.pool_hits - hits, N);
	assert_int_equal(f->s->cuda.h2d_bytes, h2d);
}

static int count_inline(const struct fixture *f)
{
	int n = 0;

	for (int i = 0; i < f->nmsgs; i++)
		n += f->msgs[i].what == PF__ENVELOPE__MSG_BATCH && f->msgs[i].ids != NULL;
	return n;
}

/* The client gathers its pooled batches (OpenSession.gather): the daemon
 * copies each batch's index and misses into the slot's tail and admits,
 * but once the pool holds every sample it runs no kernel at all; each slab
 * is exported once, before the first batch that reads it; a slab dropped
 * while a batch that reads it is held stays allocated (and its bytes
 * right) until that batch is released, and only then is the client told
 * it is gone. */
static void client_gather_epoch(struct fixture *f, bool narrow)
{
	struct order_spec spec = {.kind = ORDER_SHUFFLE, .seed = 5};
	uint64_t hits, h2d, freed = 0, index_bytes;
	int gathers, live, slabs_out = 0, gone = 0, drop_at, inline_before;
	struct msg *held;

	open_gather = true;
	open_picks_le = true;
	open_narrow = narrow;
	open_session(f, "cuda:0", 32, 0);
	open_gather = open_picks_le = open_narrow = false;
	assert_true(f->gathers);
	assert_true(f->s->cuda.gather);
	assert_true(f->s->cuda.dev_stride > f->s->lay.slot_stride);
	start_epoch(f, 1, PF__ORDER__ORDER_SHUFFLE, 5);
	assert_int_equal(consume_epoch(f, 1, &spec, 32), 10);
	fill_pool(f, &spec);
	/* A whole pool: every row a hit, gathered by the client alone, its
	 * index in the message: no copy and no kernel in the daemon. */
	hits = f->s->cuda.pool_hits;
	h2d = f->s->cuda.h2d_bytes;
	index_bytes = f->s->cuda.index_bytes;
	inline_before = count_inline(f);
	gathers = gpu_fake_gathers_run();
	spec.seed = 100;
	start_epoch(f, 100, PF__ORDER__ORDER_SHUFFLE, 100);
	consume_epoch(f, 100, &spec, 32);
	assert_int_equal(f->s->cuda.pool_hits - hits, N);
	assert_int_equal(f->s->cuda.h2d_bytes, h2d);
	assert_int_equal(gpu_fake_gathers_run(), gathers);
	assert_int_equal(f->s->cuda.index_bytes, index_bytes);
	assert_int_equal(count_inline(f) - inline_before, 10);
	for (int i = 0; i < f->nmsgs; i++)
		slabs_out += f->msgs[i].what == PF__ENVELOPE__MSG_POOL_SLAB;
	assert_int_equal(slabs_out, (int)f->s->cuda.pool->nlive);

	/* Hold the first batch of the next epoch and drop the pool. */
	start_epoch(f, 101, PF__ORDER__ORDER_SHUFFLE, 101);
	held = next_msg(f);
	assert_int_equal(held->what, PF__ENVELOPE__MSG_STARTED);
	held = next_msg(f);
	assert_int_equal(held->what, PF__ENVELOPE__MSG_BATCH);
	assert_true(held->b.gather);
	ack(f, 101);
	live = gpu_fake_live_allocs();
	assert_int_equal(pool_control(&f->d.pools, "ds", POOL_DROP, &freed), 1);
	assert_true(freed > 0);
	run_until(f, no_jobs);
	/* The slabs left the index, but the held batch still reads them:
	 * nothing freed, nothing announced gone, its bytes still right. */
	assert_int_equal(f->s->cuda.pool->rows, 0);
	for (int i = f->seen; i < f->nmsgs; i++)
		assert_int_not_equal(f->msgs[i].what, PF__ENVELOPE__MSG_POOL_SLAB_GONE);
	assert_true(gpu_fake_live_allocs() >= live);
	check_rows(f, held);
	drop_at = f->nmsgs;
	release(f, held->b.slot, 101, held->b.seq);
	/* The rest of the epoch: misses again, staged, gathered by the
	 * client from the slot's tail; every byte right.  Once the batches
	 * sent before the drop are back, every old slab is announced gone. */
	for (uint64_t seq = 1;; seq++) {
		struct msg *m = next_msg(f);

		if (m->what == PF__ENVELOPE__MSG_END)
			break;
		assert_int_equal(m->what, PF__ENVELOPE__MSG_BATCH);
		assert_int_equal(m->b.seq, seq);
		check_rows(f, m);
		ack(f, 101);
		release(f, m->b.slot, 101, m->b.seq);
	}
	run_until(f, no_jobs);
	for (int i = drop_at; i < f->nmsgs; i++)
		gone += f->msgs[i].what == PF__ENVELOPE__MSG_POOL_SLAB_GONE;
	assert_int_equal(gone, slabs_out);
	/* Every batch's picks, and every inline index, in the width the
	 * client asked for; the gathers above read them byte-exact. */
	for (int i = 0; i < f->nmsgs; i++) {
		if (f->msgs[i].what != PF__ENVELOPE__MSG_BATCH)
			continue;
		assert_int_equal(f->msgs[i].picks_width, narrow ? 4 : 8);
		if (f->msgs[i].ids)
			assert_int_equal(f->msgs[i].ids_width, narrow ? 4 : 8);
	}
}

static void
a_client_gather_epoch_is_byte_exact_and_slabs_outlive_the_batches_that_read_them(void **state)
{
	client_gather_epoch(*state, false);
}

/* The same with a narrow client: 4-byte picks and inline entry ids. */
static void a_narrow_client_gather_epoch_is_byte_exact_with_4_byte_picks_and_ids(void **state)
{
	client_gather_epoch(*state, true);
}

/* ---- lingering pools ---------------------------------------------------------- */

/* The session goes as a killed trainer's does (its connection closes);
 * waits until it is freed.  The "client" loses its slab mappings with it. */
static void end_session(struct fixture *f)
{
	sess_detach(f->s);
	f->s = NULL;
	for (int i = 0; i < 5000 && g.ds.users; i++) {
		uv_run(&f->loop, UV_RUN_NOWAIT);
		usleep(1000);
	}
	assert_int_equal(g.ds.users, 0);
	for (int j = 0; j < MAX_SLABS; j++)
		f->slabs[j].gen = 0;
}

/* A gathering session fills the pool (every sample resident) and ends. */
static struct pool *fill_and_leave(struct fixture *f)
{
	struct order_spec spec = {.kind = ORDER_SHUFFLE, .seed = 5};
	struct pool *p;

	open_gather = true;
	open_session(f, "cuda:0", 32, 0);
	open_gather = false;
	start_epoch(f, 1, PF__ORDER__ORDER_SHUFFLE, 5);
	consume_epoch(f, 1, &spec, 32);
	fill_pool(f, &spec);
	p = f->s->cuda.pool;
	end_session(f);
	return p;
}

static bool pool_left(struct fixture *f)
{
	return !pool_lingering(f->d.pools.head);
}

static void a_lingering_pool_serves_the_next_session_from_its_first_batch(void **state)
{
	struct fixture *f = *state;
	struct order_spec spec = {.kind = ORDER_SHUFFLE, .seed = 40};
	struct pool *p = fill_and_leave(f);
	uint64_t bytes = pool_bytes(p);
	int inline_before, gathers, opened_at, live = 0, slabs_at_open = 0, slabs_at_start = 0;

	/* No session, everything kept, and it says so. */
	assert_true(pool_lingering(p));
	assert_int_equal(p->sessions, 0);
	assert_int_equal(p->rows, N);
	assert_true(bytes > 0);
	assert_true(pool_linger_left(p, now_ns()) > CONFIG_POOL_LINGER_DEFAULT - 5);
	/* A new trainer on the same dataset and GPU: every batch of its first
	 * epoch is all hits, byte-exact, with nothing over PCIe. */
	opened_at = f->nmsgs;
	open_gather = true;
	open_session(f, "cuda:0", 32, 0);
	open_gather = false;
	assert_ptr_equal(f->s->cuda.pool, p);
	assert_false(pool_lingering(p));
	/* No slab at open: a trainer that builds its model now holds none. */
	for (int i = opened_at; i < f->nmsgs; i++)
		slabs_at_open += f->msgs[i].what == PF__ENVELOPE__MSG_POOL_SLAB;
	assert_int_equal(slabs_at_open, 0);
	for (uint32_t j = 0; j < p->nslabs; j++)
		live += p->slabs[j].live && p->slabs[j].used;
	assert_true(live > 0);
	inline_before = count_inline(f);
	gathers = gpu_fake_gathers_run();
	opened_at = f->nmsgs;
	start_epoch(f, 40, PF__ORDER__ORDER_SHUFFLE, 40);
	/* Every slab holding rows came with the epoch's start, each once,
	 * before its first batch (mapped while the order is built). */
	for (int i = opened_at; i < f->nmsgs && f->msgs[i].what != PF__ENVELOPE__MSG_BATCH; i++)
		slabs_at_start += f->msgs[i].what == PF__ENVELOPE__MSG_POOL_SLAB;
	assert_int_equal(slabs_at_start, live);
	assert_int_equal(consume_epoch(f, 40, &spec, 32), 10);
	assert_int_equal(f->s->cuda.pool_hits, N);
	assert_int_equal(f->s->cuda.h2d_bytes, 0);
	/* Every batch all hits, its index in the message: no daemon kernel. */
	assert_int_equal(count_inline(f) - inline_before, 10);
	assert_int_equal(gpu_fake_gathers_run(), gathers);
	assert_int_equal(pool_bytes(p), bytes);
}

static void a_lingering_pool_gives_back_what_free_memory_lacks_of_the_reserve(void **state)
{
	struct fixture *f = *state;
	struct pool *p;
	uint64_t bytes, reserve, total = 80ull << 30, slab;
	int live;

	f->d.cfg.probe_interval = 0.05;
	f->d.cfg.pool_slab = 64u << 10; /* 65 records a slab: 5 slabs */
	daemon_config_pools(&f->d);
	p = fill_and_leave(f);
	bytes = pool_bytes(p);
	slab = p->slab_bytes;
	assert_true(bytes >= 2 * slab);
	/* The session's arenas go on the transfer thread after it: wait for
	 * the count to settle before taking it. */
	live = gpu_fake_live_allocs();
	for (int same = 0, i = 0; same < 50 && i < 5000; i++) {
		uv_run(&f->loop, UV_RUN_NOWAIT);
		usleep(1000);
		same = gpu_fake_live_allocs() == live ? same + 1 : 0;
		live = gpu_fake_live_allocs();
	}
	/* Another process takes memory: free is now a slab and a half under
	 * the reserve.  The next probe (50 ms) gives back two slabs, newest
	 * first, and no more. */
	reserve = gov_reserve(total, f->d.cfg.reserve_frac, f->d.cfg.reserve_min);
	gpu_fake_set_mem(reserve - slab - slab / 2, total);
	for (int i = 0; i < 2000 && pool_bytes(p) == bytes; i++) {
		uv_run(&f->loop, UV_RUN_NOWAIT);
		usleep(1000);
	}
	assert_int_equal(pool_bytes(p), bytes - 2 * slab);
	assert_true(pool_lingering(p));
	assert_non_null(strstr(p->linger_reason, "under the reserve"));
	assert_non_null(strstr(p->linger_reason, "daemon's probe"));
	assert_true(linger_probe_age(&f->d, 0) >= 0);
	for (int i = 0; i < 2000 && gpu_fake_live_allocs() > live - 2; i++) {
		uv_run(&f->loop, UV_RUN_NOWAIT);
		usleep(1000);
	}
	assert_int_equal(gpu_fake_live_allocs(), live - 2);
	/* Far below: everything goes, and the pool no longer lingers. */
	gpu_fake_set_mem(1ull << 30, total);
	run_until(f, pool_left);
	assert_int_equal(pool_bytes(p), 0);
	assert_int_equal(p->rows, 0);
}

static void a_lingering_pool_is_given_back_when_pool_linger_is_over(void **state)
{
	struct fixture *f = *state;
	int before = gpu_fake_live_allocs();
	struct pool *p;
	uint64_t t0;

	f->d.cfg.pool_linger = 0.3;
	p = fill_and_leave(f);
	t0 = now_ns();
	assert_true(pool_lingering(p));
	run_until(f, pool_left);
	assert_true(now_ns() - t0 > 200000000ull);
	assert_int_equal(pool_bytes(p), 0);
	assert_non_null(strstr(p->budget_reason, "pool_linger over"));
	for (int i = 0; i < 2000 && gpu_fake_live_allocs() > before; i++) {
		uv_run(&f->loop, UV_RUN_NOWAIT);
		usleep(1000);
	}
	assert_int_equal(gpu_fake_live_allocs(), before);
}

static void pool_linger_zero_gives_a_pool_back_with_its_last_session(void **state)
{
	struct fixture *f = *state;
	struct pool *p;

	f->d.cfg.pool_linger = 0;
	p = fill_and_leave(f);
	assert_false(pool_lingering(p));
	assert_int_equal(pool_bytes(p), 0);
	assert_int_equal(p->rows, 0);
}

static void a_lingering_pool_dropped_by_prefetchctl_empties_at_once(void **state)
{
	struct fixture *f = *state;
	struct pool *p = fill_and_leave(f);
	uint64_t bytes = pool_bytes(p), freed = 0;

	assert_int_equal(pool_control(&f->d.pools, "ds", POOL_DROP, &freed), 1);
	assert_true(freed >= bytes);
	assert_false(pool_lingering(p));
	assert_int_equal(pool_bytes(p), 0);
	assert_non_null(strstr(p->budget_reason, "dropped by prefetchctl"));
}

/* A CUDA session of a client that copies batches itself, on a dataset with
 * no pool: host arenas, SessionOpened.client_copy, no device work at all in
 * the daemon; with the pool on, the same request gets the device path. */
/* The width of every BatchReady's picks since message `from`. */
static void expect_picks_width(const struct fixture *f, int from, int width)
{
	int batches = 0;

	for (int i = from; i < f->nmsgs; i++) {
		if (f->msgs[i].what != PF__ENVELOPE__MSG_BATCH)
			continue;
		assert_int_equal(f->msgs[i].picks_width, width);
		batches++;
	}
	assert_true(batches > 0);
}

/* A narrow client of a host session gets every batch's picks as 4 bytes
 * (consume_epoch checks each one against the order); a client that takes
 * picks_le but did not ask narrow gets them as 8, as before. */
static void picks_go_as_4_bytes_only_to_a_client_that_asks(void **state)
{
	struct fixture *f = *state;
	struct order_spec spec = {.kind = ORDER_SHUFFLE, .seed = 7};
	int from;

	open_picks_le = open_narrow = true;
	open_session(f, "host", 32, 0);
	open_picks_le = open_narrow = false;
	assert_true(f->s->picks32);
	from = f->nmsgs;
	start_epoch(f, 1, PF__ORDER__ORDER_SHUFFLE, 7);
	assert_int_equal(consume_epoch(f, 1, &spec, 32), 10);
	expect_picks_width(f, from, 4);
	end_session(f);

	open_picks_le = true;
	open_session(f, "host", 32, 0);
	open_picks_le = false;
	assert_false(f->s->picks32);
	from = f->nmsgs;
	start_epoch(f, 1, PF__ORDER__ORDER_SHUFFLE, 7);
	assert_int_equal(consume_epoch(f, 1, &spec, 32), 10);
	expect_picks_width(f, from, 8);
}

/* Picks lie below augment x N: a session where that passes 2^32 sends
 * 8-byte picks to a narrow client, even for a batch whose picks would
 * fit, and one where it does not sends 4-byte ones. */
static void a_session_whose_picks_may_pass_32_bits_sends_them_as_8_bytes(void **state)
{
	struct fixture *f = *state;
	Pf__LoadBatch req = PF__LOAD_BATCH__INIT;
	uint64_t picks[3] = {5, (1ull << 32) + 7, 299};
	const uint32_t fits = (uint32_t)((1ull << 32) / N); /* N x fits <= 2^32 */
	struct msg *m;

	f->d.cfg.max_epoch_picks = 1ull << 40;
	open_picks_le = open_narrow = true;
	open_augment = fits;
	open_session(f, "host", 4, 0);
	assert_true(f->s->picks32);
	end_session(f);

	open_augment = fits + 1;
	open_session(f, "host", 4, 0);
	open_picks_le = open_narrow = false;
	open_augment = 0;
	assert_false(f->s->picks32);
	start_epoch(f, 1, PF__ORDER__ORDER_PACED, 0);
	req.epoch = 1;
	req.picks = picks;
	req.n_picks = 3;
	assert_int_equal(sess_load(f->s, ++f->last_id, &req), 0);
	req.picks = picks;
	req.n_picks = 1;
	assert_int_equal(sess_load(f->s, ++f->last_id, &req), 0);
	req.n_picks = 0;
	req.end = true;
	assert_int_equal(sess_load(f->s, ++f->last_id, &req), 0);
	m = next_msg(f);
	assert_int_equal(m->what, PF__ENVELOPE__MSG_STARTED);
	for (uint64_t seq = 0; seq < 2; seq++) {
		m = next_msg(f);
		assert_int_equal(m->what, PF__ENVELOPE__MSG_BATCH);
		assert_int_equal(m->b.seq, seq);
		assert_int_equal(m->picks_width, 8);
		assert_int_equal(m->b.count, seq ? 1 : 3);
		assert_memory_equal(m->b.picks, picks, m->b.count * sizeof(uint64_t));
		check_rows(f, m);
		ack(f, 1);
		release(f, m->b.slot, 1, seq);
	}
	m = next_msg(f);
	assert_int_equal(m->what, PF__ENVELOPE__MSG_END);
}

static void a_client_that_copies_gets_host_arenas_when_no_pool_serves_it(void **state)
{
	struct fixture *f = *state;
	struct order_spec spec = {.kind = ORDER_SHUFFLE, .seed = 9};
	int allocs = gpu_fake_live_allocs(), arenas = 0;

	f->d.cfg.pool = false;
	open_copy = true;
	open_session(f, "cuda:0", 32, 0);
	open_copy = false;
	assert_true(f->msgs[0].client_copy);
	assert_true(f->s->client_copy);
	assert_int_equal(f->s->gpu, -1);
	assert_string_equal(f->s->device, "cuda:0");
	start_epoch(f, 1, PF__ORDER__ORDER_SHUFFLE, 9);
	assert_int_equal(consume_epoch(f, 1, &spec, 32), 10);
	for (int i = 0; i < f->nmsgs; i++)
		if (f->msgs[i].what == PF__ENVELOPE__MSG_ARENA) {
			assert_int_equal(f->msgs[i].arena_kind, PF__ARENA_KIND__ARENA_HOST_MEMFD);
			arenas++;
		}
	assert_true(arenas > 0);
	/* Nothing allocated on the device, no transfer thread started. */
	assert_int_equal(gpu_fake_live_allocs(), allocs);
	assert_null(f->d.xfers[0]);
}

static void a_client_that_copies_gets_the_device_path_from_a_pool(void **state)
{
	struct fixture *f = *state;
	struct order_spec spec = {.kind = ORDER_SHUFFLE, .seed = 10};

	open_copy = true;
	open_session(f, "cuda:0", 32, 0);
	open_copy = false;
	assert_false(f->msgs[0].client_copy);
	assert_int_equal(f->s->gpu, 0);
	start_epoch(f, 1, PF__ORDER__ORDER_SHUFFLE, 10);
	assert_int_equal(consume_epoch(f, 1, &spec, 32), 10);
	assert_true(f->s->cuda.narenas > 0);
}

static void a_device_allocation_failing_every_try_is_an_error_batch(void **state)
{
	struct fixture *f = *state;
	struct msg *m;

	f->d.test_fail_allocs = SESS_OOM_TRIES;
	m = first_batch(f, "cuda:0", 100, PF__ORDER__ORDER_SEQUENTIAL, 0);
	assert_int_equal(m->b.seq, 0);
	assert_int_equal(m->b.slot, -1);
	assert_int_equal(m->b.error, -ENOMEM);
	assert_non_null(strstr(m->text, "no device slot after 4 tries"));
	ack(f, 1);
	/* The epoch goes on: the next allocation succeeds. */
	for (uint64_t seq = 1; seq < 3; seq++) {
		m = next_msg(f);
		assert_int_equal(m->what, PF__ENVELOPE__MSG_BATCH);
		assert_int_equal(m->b.seq, seq);
		assert_int_equal(m->b.error, 0);
		check_rows(f, m);
		ack(f, 1);
		release(f, m->b.slot, 1, seq);
	}
	m = next_msg(f);
	assert_int_equal(m->what, PF__ENVELOPE__MSG_END);
}

static void a_request_that_cannot_be_met_is_refused_with_the_reason(void **state)
{
	struct fixture *f = *state;
	Pf__OpenSession req = PF__OPEN_SESSION__INIT;
	struct sess *none = NULL;

	req.dataset = "nope";
	req.name = "";
	req.device = "";
	req.batch_size = 4;
	assert_int_equal(sess_open(&f->d, &f->peer, &none, 1, &req), 0);
	assert_null(none);
	assert_int_equal(last(f)->code, -ENOENT);
	assert_non_null(strstr(last(f)->text, "unknown dataset 'nope'"));
	req.dataset = "ds";
	req.device = "cuda:7";
	assert_int_equal(sess_open(&f->d, &f->peer, &none, 2, &req), 0);
	assert_null(none);
	assert_int_equal(last(f)->code, -ENODEV);
	assert_non_null(strstr(last(f)->text, "the daemon has 1 GPU(s)"));
	open_session(f, "host", 4, 0);
	/* One session per connection. */
	assert_int_equal(sess_open(&f->d, &f->peer, &f->s, 3, &req), 0);
	assert_int_equal(last(f)->code, -EBUSY);
	assert_int_equal(f->d.nsessions, 1);
	/* Epochs only grow. */
	start_epoch(f, 2, PF__ORDER__ORDER_SEQUENTIAL, 0);
	{
		Pf__StartEpoch se = PF__START_EPOCH__INIT;

		se.epoch = 1;
		assert_int_equal(sess_start_epoch(f->s, 9, &se), 0);
		assert_int_equal(last(f)->code, -EINVAL);
		assert_non_null(strstr(last(f)->text, "is not after epoch 2"));
	}
	assert_true(f->s->running);
	assert_int_equal(f->s->epoch, 2);
}

/* Epoch numbers are the trainer's own and start at 0 (Python's epoch(0),
 * libprefetch's first): 0 is an epoch like any, and once it started it is
 * not started again. */
static void epoch_zero_is_a_first_epoch_and_is_not_started_twice(void **state)
{
	struct fixture *f = *state;
	Pf__StartEpoch se = PF__START_EPOCH__INIT;
	struct msg *m;

	open_session(f, "host", 4, 0);
	assert_false(f->s->had_epoch);
	start_epoch(f, 0, PF__ORDER__ORDER_SEQUENTIAL, 0);
	assert_true(f->s->running);
	m = next_msg(f);
	assert_int_equal(m->what, PF__ENVELOPE__MSG_STARTED);
	m = next_msg(f);
	assert_int_equal(m->what, PF__ENVELOPE__MSG_BATCH);
	assert_int_equal(m->b.epoch, 0);
	se.epoch = 0;
	assert_int_equal(sess_start_epoch(f->s, 9, &se), 0);
	assert_int_equal(last(f)->code, -EINVAL);
	assert_non_null(strstr(last(f)->text, "epoch 0 is not after epoch 0"));
	assert_true(f->s->running);
	start_epoch(f, 1, PF__ORDER__ORDER_SEQUENTIAL, 0);
	assert_int_equal(f->s->epoch, 1);
}

/* readers and ring_bytes left at auto fit the machine; set ones stay. */
static void auto_readers_and_ring_fit_the_machine_and_set_values_stay(void **state)
{
	struct config cfg;
	cpu_set_t set;
	int cpus, want;
	char why[200];

	(void)state;
	assert_int_equal(sched_getaffinity(0, sizeof(set), &set), 0);
	cpus = CPU_COUNT(&set);
	config_defaults(&cfg);
	daemon_config_machine(&cfg, why, sizeof(why));
	want = cpus >= 4 ? cpus - (cpus / 5 > 2 ? cpus / 5 : 2) : 2;
	assert_int_equal(cfg.readers, want > 32 ? 32 : want);
	assert_true(cfg.ring_bytes >= (256ULL << 20) && cfg.ring_bytes <= (1ULL << 30));
	assert_int_equal(cfg.ring_bytes % (2ULL << 20), 0);
	assert_non_null(strstr(why, "readers = "));
	assert_non_null(strstr(why, "ring_bytes = "));
	cfg.readers = 7;
	cfg.ring_bytes = 64ULL << 20;
	daemon_config_machine(&cfg, why, sizeof(why));
	assert_int_equal(cfg.readers, 7);
	assert_int_equal(cfg.ring_bytes, 64ULL << 20);
	assert_string_equal(why, "");
	config_free(&cfg);
}

/* ---- many sessions on one ring ------------------------------------------------ */

static bool no_sessions_left(struct fixture *f)
{
	return f->d.nsessions == 0 && g.ds.users == 0;
}

static uint64_t lease_bytes(const struct fixture *c)
{
	return (uint64_t)c->s->cuda.lease.nslots * c->s->cuda.lease.stride;
}

static bool a_slot_waits(struct fixture *f)
{
	return f->d.ring.wait_head || f->d.ring.turn;
}

/* Every one of n trainers starts epoch `epoch` at once.  With held=true
 * each may hold every slot it wants, past the ring (as the minimums can
 * make the shares), and the copies are held in flight until a slot waits
 * for ring space; then they are let go, and the waiters get their turns.
 * Then each takes its whole epoch in turn, every batch checked row by
 * row. */
static void all_take_an_epoch(struct fixture **c, int n, uint64_t epoch, bool held)
{
	struct order_spec spec = {.kind = ORDER_SHUFFLE};
	struct ring *r = &c[0]->home->d.ring;

	if (held) {
		for (int i = 0; i < n; i++)
			c[i]->s->cuda.lease.cap = c[i]->s->cuda.lease.nslots;
		gpu_fake_hold_events(true);
	}
	for (int i = 0; i < n; i++) {
		Pf__StartEpoch req = PF__START_EPOCH__INIT;

		req.epoch = epoch, req.order = PF__ORDER__ORDER_SHUFFLE, req.seed = epoch * 100 + i;
		assert_int_equal(sess_start_epoch(c[i]->s, ++c[i]->last_id, &req), 0);
	}
	if (held) {
		run_until(c[0]->home, a_slot_waits);
		for (int i = 0; i < n; i++)
			assert_true(c[i]->s->cuda.lease.held <= c[i]->s->cuda.lease.cap);
		assert_int_equal(ring_check(r), 0);
		assert_true(r->bytes - r->used < (r->turn ? r->turn : r->wait_head)->stride ||
			    ring_largest_free(r) < (r->turn ? r->turn : r->wait_head)->stride);
		gpu_fake_hold_events(false);
	}
	for (int i = 0; i < n; i++) {
		spec.seed = epoch * 100 + i;
		want_epoch = epoch;
		run_until(c[i], epoch_started);
		assert_int_equal(consume_epoch(c[i], epoch, &spec, c[i]->s->batch_size),
				 (N + c[i]->s->batch_size - 1) / c[i]->s->batch_size);
		assert_int_equal(ring_check(&c[0]->home->d.ring), 0);
	}
}

/* The order that refused the eighth trainer when each session took one
 * range of the ring: sessions of small and big batches alternate, all
 * take epochs, the small ones leave, and big ones come in their place.
 * Together they want far more of the ring than it has; every one opens
 * (the ring counts only their minimums) and delivers every sample once,
 * byte for byte, with their slots waiting their turn for ring space. */
static void
sessions_past_what_the_ring_holds_all_open_and_deliver_in_the_order_that_cut_it(void **state)
{
	struct fixture *f = *state, *c[16];
	char err[256];
	int n = 0, nbig = 0;
	uint64_t wanted = 0, waits;

	/* Up to 4 batches each in flight (the big ones' epochs have 3):
	 * 2.4 MiB of a ring of 2. */
	f->d.cfg.depth = 4;
	ring_destroy(&f->d.ring);
	assert_int_equal(ring_init(&f->d.ring, 2u << 20, err, sizeof(err)), 0);
	for (int i = 0; i < 8; i++) {
		c[n] = client_new(f);
		open_session(c[n], "cuda:0", i % 2 ? 128 : 16, 0);
		wanted += lease_bytes(c[n]);
		n++;
	}
	assert_true(wanted > f->d.ring.bytes);
	all_take_an_epoch(c, n, 1, true);
	waits = f->d.ring.waits;
	/* The small ones leave; big ones take their place. */
	for (int i = 0, k = 0; i < n; i++) {
		if (c[i]->s->batch_size == 16)
			client_end(c[i]);
		else
			c[k++] = c[i];
	}
	n = 4;
	wanted = 0;
	for (;;) {
		struct fixture *b = client_new(f);
		Pf__OpenSession req = PF__OPEN_SESSION__INIT;
		uint64_t before = f->d.ring.reserved;

		req.dataset = "ds", req.name = "", req.device = "cuda:0", req.batch_size = 128;
		assert_int_equal(sess_open(&f->d, &b->peer, &b->s, ++b->last_id, &req), 0);
		if (!b->s) {
			/* Refused only once the minimums fill the ring, and
			 * the reason says so. */
			assert_int_equal(b->msgs[0].what, PF__ENVELOPE__MSG_ERROR);
			assert_non_null(strstr(b->msgs[0].text, "the pinned ring has no room"));
			assert_true(before + 2 * c[0]->s->cuda.lease.stride > f->d.ring.bytes);
			client_free(b);
			break;
		}
		b->seen = b->nmsgs;
		c[n++] = b;
		nbig++;
		assert_true(n < 16);
	}
	assert_true(nbig >= 1);
	for (int i = 0; i < n; i++)
		wanted += lease_bytes(c[i]);
	assert_true(wanted > f->d.ring.bytes);
	all_take_an_epoch(c, n, 2, true);
	assert_true(f->d.ring.waits > waits);
	for (int i = 0; i < n; i++)
		client_end(c[i]);
	run_until(f, no_sessions_left);
	assert_int_equal(f->d.ring.used, 0);
	assert_int_equal(f->d.ring.reserved, 0);
}

/* A default ring holds about 100 batches of 5 MiB (502 MiB); here the same
 * ratio, 100 batches of this dataset's 256 rows.  Sixteen trainers on one
 * GPU all open and deliver. */
static void sixteen_sessions_share_a_ring_of_a_hundred_batches_on_one_gpu(void **state)
{
	struct fixture *f = *state, *c[16];
	char err[256];

	for (int i = 0; i < 16; i++) {
		c[i] = client_new(f);
		open_session(c[i], "cuda:0", 256, 0);
		if (i == 0) {
			uint64_t stride = c[0]->s->lay.slot_stride;

			client_end(c[0]);
			run_until(f, no_sessions_left);
			ring_destroy(&f->d.ring);
			assert_int_equal(ring_init(&f->d.ring, 100 * stride, err, sizeof(err)), 0);
			c[0] = client_new(f);
			open_session(c[0], "cuda:0", 256, 0);
		}
	}
	for (int i = 1; i < 16; i++)
		assert_int_equal(c[i]->s->cuda.lease.cap, c[0]->s->cuda.lease.cap);
	all_take_an_epoch(c, 16, 1, false);
	for (int i = 0; i < 16; i++)
		client_end(c[i]);
	run_until(f, no_sessions_left);
	assert_int_equal(f->d.ring.reserved, 0);
}

/* Eight GPUs, a session on each, and a second on GPU 0: the ring is
 * shared by GPU first (each GPU has its own link and copy stream), so the
 * lone sessions of GPUs 1-7 get twice the share of GPU 0's two. */
static void eight_gpus_share_the_ring_by_gpu_then_by_session(void **state)
{
	struct fixture *f = *state, *c[9];
	char dev[16];

	assert_int_equal(f->d.ngpus, 8);
	for (int i = 0; i < 9; i++) {
		c[i] = client_new(f);
		snprintf(dev, sizeof(dev), "cuda:%d", i % 8);
		open_session(c[i], dev, 16, 0);
		assert_int_equal(c[i]->s->gpu, i % 8);
	}
	/* Every session wants all it may (readers + 2 slots) and the ring
	 * is big enough for that: shares are what they asked. */
	for (int i = 0; i < 9; i++)
		assert_int_equal(c[i]->s->cuda.lease.cap, c[i]->s->cuda.lease.nslots);
	all_take_an_epoch(c, 9, 1, false);
	for (int i = 0; i < 9; i++)
		client_end(c[i]);
	run_until(f, no_sessions_left);
	assert_int_equal(f->d.ring.reserved, 0);
}

static struct fixture *share_probe; /* the session whose fills settle */

static bool fills_settled(struct fixture *f)
{
	(void)f;
	return share_probe->s->jobs == 0 &&
	       gov_in_flight(&share_probe->s->gov) == gov_limit(&share_probe->s->gov);
}

/* Host sessions (and clients that copy) share fill_bytes: each fills ahead
 * only its even part of it, never below min_depth; when one leaves, the
 * others fill deeper at once; every epoch is still whole and byte-exact. */
static void host_sessions_fill_ahead_an_even_share_of_fill_bytes(void **state)
{
	struct fixture *f = *state, *c[3];
	struct order_spec spec = {.kind = ORDER_SHUFFLE};
	uint64_t stride;

	f->d.cfg.depth = 8;
	c[0] = client_new(f);
	open_session(c[0], "host", 16, 0);
	stride = c[0]->s->lay.slot_stride;
	assert_int_equal(c[0]->s->gov.share, daemon_fill_bytes(&f->d) / stride);
	f->d.cfg.fill_bytes = 12 * stride;
	sess_fill_shares(&f->d);
	assert_int_equal(c[0]->s->gov.share, 12);
	assert_int_equal(gov_limit(&c[0]->s->gov), 8); /* the target is lower */
	c[1] = client_new(f);
	open_session(c[1], "host", 16, 0);
	c[2] = client_new(f);
	open_session(c[2], "host", 16, 0);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(c[i]->s->gov.share, 4);
		assert_int_equal(gov_limit(&c[i]->s->gov), 4);
	}
	/* 3 x 4 batches ahead: the budget, no more, so slots stay cached
	 * for their copy and client-copy fills keep plain stores. */
	assert_false(f->d.fill_streamed);
	for (int i = 0; i < 3; i++) {
		Pf__StartEpoch req = PF__START_EPOCH__INIT;

		req.epoch = 1, req.order = PF__ORDER__ORDER_SHUFFLE, req.seed = 10 + i;
		assert_int_equal(sess_start_epoch(c[i]->s, ++c[i]->last_id, &req), 0);
		want_epoch = 1;
		run_until(c[i], epoch_started);
	}
	for (int i = 0; i < 3; i++) {
		share_probe = c[i];
		run_until(f, fills_settled);
		assert_int_equal(gov_in_flight(&c[i]->s->gov), 4);
	}
	/* One leaves: the other two fill 6 ahead, without being asked. */
	client_end(c[2]);
	for (int i = 0; i < 2; i++) {
		assert_int_equal(gov_limit(&c[i]->s->gov), 6);
		share_probe = c[i];
		run_until(f, fills_settled);
		assert_int_equal(gov_in_flight(&c[i]->s->gov), 6);
	}
	assert_false(f->d.fill_streamed); /* 2 x 6: the budget again */
	/* A target set by hand is the user's.  With it the two fill 14
	 * batches ahead, past the 12 of fill_bytes: client-copy fills now
	 * stream (status.c recounts after `prefetchctl depth`). */
	gov_set_manual(&c[1]->s->gov, 8);
	sess_fill_shares(&f->d);
	assert_int_equal(gov_limit(&c[1]->s->gov), 8);
	assert_true(f->d.fill_streamed);
	for (int i = 0; i < 2; i++) {
		spec.seed = 10 + i;
		assert_int_equal(consume_epoch(c[i], 1, &spec, 16), (N + 15) / 16);
	}
	for (int i = 0; i < 2; i++)
		client_end(c[i]);
	run_until(f, no_sessions_left);
	assert_false(f->d.fill_streamed); /* nobody fills ahead */
}

static int setup8(void **state)
{
	int rc;

	setup_gpus = 8;
	rc = setup(state);
	setup_gpus = 1;
	return rc;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(auto_readers_and_ring_fit_the_machine_and_set_values_stay),
		cmocka_unit_test_setup_teardown(
			sessions_past_what_the_ring_holds_all_open_and_deliver_in_the_order_that_cut_it,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			sixteen_sessions_share_a_ring_of_a_hundred_batches_on_one_gpu, setup,
			teardown),
		cmocka_unit_test_setup_teardown(eight_gpus_share_the_ring_by_gpu_then_by_session,
						setup8, teardown),
		cmocka_unit_test_setup_teardown(
			host_sessions_fill_ahead_an_even_share_of_fill_bytes, setup, teardown),
		cmocka_unit_test_setup_teardown(
			a_host_epoch_delivers_every_sample_once_with_its_bytes, setup, teardown),
		cmocka_unit_test_setup_teardown(
			a_block_shuffled_epoch_has_its_successor_built_ahead, setup, teardown),
		cmocka_unit_test_setup_teardown(the_last_epochs_order_is_freed_by_the_next_build,
						setup, teardown),
		cmocka_unit_test_setup_teardown(
			a_sequential_order_serves_the_next_sequential_epoch_as_it_is, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			an_order_outlives_its_session_for_the_trainer_that_comes_back, setup,
			teardown),
		cmocka_unit_test_setup_teardown(the_pump_keeps_target_batches_ahead_and_no_more,
						setup, teardown),
		cmocka_unit_test_setup_teardown(
			a_release_of_a_batch_not_held_is_refused_and_the_epoch_goes_on, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			an_abandoned_epoch_frees_its_slots_and_the_next_one_starts_clean, setup,
			teardown),
		cmocka_unit_test_setup_teardown(a_detached_session_is_freed_once_its_reads_are_back,
						setup, teardown),
		cmocka_unit_test_setup_teardown(
			a_paced_request_that_cannot_be_served_is_an_error_batch_in_its_place, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			a_cuda_epoch_on_the_fake_gpu_is_byte_exact_through_device_arenas, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			a_client_gather_epoch_is_byte_exact_and_slabs_outlive_the_batches_that_read_them,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			a_narrow_client_gather_epoch_is_byte_exact_with_4_byte_picks_and_ids, setup,
			teardown),
		cmocka_unit_test_setup_teardown(picks_go_as_4_bytes_only_to_a_client_that_asks,
						setup, teardown),
		cmocka_unit_test_setup_teardown(
			a_session_whose_picks_may_pass_32_bits_sends_them_as_8_bytes, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			a_client_that_copies_gets_host_arenas_when_no_pool_serves_it, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			a_client_that_copies_gets_the_device_path_from_a_pool, setup, teardown),
		cmocka_unit_test_setup_teardown(
			a_lingering_pool_serves_the_next_session_from_its_first_batch, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			a_lingering_pool_gives_back_what_free_memory_lacks_of_the_reserve, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			a_lingering_pool_is_given_back_when_pool_linger_is_over, setup, teardown),
		cmocka_unit_test_setup_teardown(
			pool_linger_zero_gives_a_pool_back_with_its_last_session, setup, teardown),
		cmocka_unit_test_setup_teardown(
			a_lingering_pool_dropped_by_prefetchctl_empties_at_once, setup, teardown),
		cmocka_unit_test_setup_teardown(
			a_device_allocation_failing_every_try_is_an_error_batch, setup, teardown),
		cmocka_unit_test_setup_teardown(
			a_request_that_cannot_be_met_is_refused_with_the_reason, setup, teardown),
		cmocka_unit_test_setup_teardown(
			epoch_zero_is_a_first_epoch_and_is_not_started_twice, setup, teardown),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
