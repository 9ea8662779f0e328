/*
 * mkcorpus.c — writes the fuzz harnesses' seed inputs:
 *
 *   mkcorpus DIR    writes DIR/wire, DIR/sess, DIR/npy and DIR/tokens
 *
 * Seeds are made with the real encoders, at build time, so they follow the
 * proto as it is: every message of the protocol framed by wire_encode (for
 * the frame reader); session scripts in sess_ops.h's language, each within
 * the harness's 64 actions, that walk whole epochs of every order with
 * acks and releases, aborts, refusals, truncated files and several clients
 * (for the session harness); .npy headers as NumPy writes them in versions
 * 1 to 3 (npygen.h) and in the odd forms the parser accepts or refuses; and
 * llm.c token-shard headers.
 *
 * DESIGN: a build-time tool; one thread, exits on the first error.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "npygen.h"
#include "sess_ops.h"
#include "data/tokens.h"
#include "prefetch.pb-c.h"
#include "wire.h"

static const char *out_dir;

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

static void fail(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "mkcorpus: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

/* A growing byte string. */
struct buf {
	uint8_t b[1 << 16];
	size_t n;
};

static void put(struct buf *b, const void *p, size_t n)
{
	if (b->n + n > sizeof(b->b))
		fail("a seed outgrew its buffer");
	memcpy(b->b + b->n, p, n);
	b->n += n;
}

static void put_bytes(struct buf *b, int n, ...)
{
	va_list ap;

	va_start(ap, n);
	for (int i = 0; i < n; i++) {
		uint8_t v = (uint8_t)va_arg(ap, int);

		put(b, &v, 1);
	}
	va_end(ap);
}

static void put_u64(struct buf *b, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		put_bytes(b, 1, (int)(uint8_t)(v >> (8 * i)));
}

static void save(const char *harness, const char *name, const struct buf *b)
{
	char path[512];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", out_dir, harness);
	if (mkdir(path, 0755) < 0 && errno != EEXIST)
		fail("cannot create %s: %s", path, strerror(errno));
	snprintf(path, sizeof(path), "%s/%s/%s", out_dir, harness, name);
	f = fopen(path, "wb");
	if (!f || fwrite(b->b, 1, b->n, f) != b->n || fclose(f) != 0)
		fail("cannot write %s", path);
}

/* ---- wire: every message, framed ------------------------------------------ */

static void put_frame(struct buf *b, Pf__Envelope *env)
{
	uint8_t *frame;
	size_t len;

	if (wire_encode(env, &frame, &len))
		fail("cannot encode %s", wire_msg_name(env->msg_case));
	put(b, frame, len);
	free(frame);
}

/* Calls fn(env) once per message of the protocol, each filled with
 * realistic values. */
static void each_message(void (*fn)(Pf__Envelope *env, void *arg), void *arg)
{
	static uint64_t shape[] = {3, 32, 32}, indices[] = {5, 3, 0, 36, 17, 2, 2, 9};
	static uint64_t picks_le[] = {4, 8, 15, 16};
	Pf__Envelope env;
	Pf__Hello hello = PF__HELLO__INIT;
	Pf__HelloReply hello_reply = PF__HELLO_REPLY__INIT;
	Pf__OpenSession open = PF__OPEN_SESSION__INIT;
	Pf__Field field = PF__FIELD__INIT, *fields[] = {&field, &field};
	Pf__SessionOpened opened = PF__SESSION_OPENED__INIT;
	Pf__Arena arena = PF__ARENA__INIT;
	Pf__StartEpoch start = PF__START_EPOCH__INIT;
	Pf__LoadBatch load = PF__LOAD_BATCH__INIT;
	Pf__EpochStarted started = PF__EPOCH_STARTED__INIT;
	Pf__BatchReady batch = PF__BATCH_READY__INIT;
	Pf__EpochEnd end = PF__EPOCH_END__INIT;
	Pf__Ack ack = PF__ACK__INIT;
	Pf__Release release = PF__RELEASE__INIT;
	Pf__Probe probe = PF__PROBE__INIT;
	Pf__SetDepth set_depth = PF__SET_DEPTH__INIT;
	Pf__Abandon abandon = PF__ABANDON__INIT;
	Pf__StatusRequest status = PF__STATUS_REQUEST__INIT;
	Pf__SessionStatus sst = PF__SESSION_STATUS__INIT, *ssts[] = {&sst};
	Pf__DatasetStatus dst = PF__DATASET_STATUS__INIT, *dsts[] = {&dst};
	Pf__PoolStatus pst = PF__POOL_STATUS__INIT, *psts[] = {&pst};
	Pf__StatusReply status_reply = PF__STATUS_REPLY__INIT;
	Pf__PoolControl pool = PF__POOL_CONTROL__INIT;
	Pf__PoolControlReply pool_reply = PF__POOL_CONTROL_REPLY__INIT;
	Pf__Ok ok = PF__OK__INIT;
	Pf__Error error = PF__ERROR__INIT;
	static uint8_t handle[64] = {1, 2, 3};

	hello.version = WIRE_VERSION;
	hello.client = "train.py (pid 4242)";
	hello_reply.version = WIRE_VERSION;
	hello_reply.daemon = "prefetchd 0.1.0";
	hello_reply.max_frame = 16u << 20;
	open.dataset = "imagenet";
	open.device = "cuda:0";
	open.batch_size = 256;
	open.drop_last = 1;
	open.augment = 2;
	open.max_depth = 8;
	open.name = "rank0";
	open.pci_bus_id = "0000:3b:00.0";
	field.name = "x";
	field.dtype = "f4";
	field.n_shape = 3;
	field.shape = shape;
	field.sample_bytes = 12288;
	field.offset = 256;
	opened.session = 7;
	opened.num_samples = 1281167;
	opened.n_fields = 2;
	opened.fields = fields;
	opened.slot_bytes = 1 << 22;
	opened.slots = 10;
	opened.target = 4;
	opened.device = "cuda:0";
	opened.probe_interval_s = 5;
	arena.id = 1;
	arena.kind = PF__ARENA_KIND__ARENA_CUDA_LEGACY;
	arena.bytes = 1 << 28;
	arena.legacy_handle.data = handle;
	arena.legacy_handle.len = sizeof(handle);
	start.epoch = 3;
	start.order = PF__ORDER__ORDER_EXPLICIT;
	start.seed = 1234;
	start.rank = 1;
	start.world = 4;
	start.start_batch = 2;
	start.n_indices = 8;
	start.indices = indices;
	load.epoch = 3;
	load.n_picks = 4;
	load.picks = picks_le;
	started.epoch = 3;
	started.batches = 10;
	started.samples = 40;
	batch.epoch = 3;
	batch.seq = 2;
	batch.slot = 1;
	batch.arena = 0;
	batch.offset = 1 << 22;
	batch.count = 4;
	batch.picks_le.data = (uint8_t *)picks_le;
	batch.picks_le.len = sizeof(picks_le);
	end.epoch = 3;
	end.batches = 10;
	ack.epoch = 3;
	ack.seq = 2;
	ack.wait_s = 0.25;
	ack.busy_s = 12.5;
	release.epoch = 3;
	release.seq = 2;
	release.slot = 1;
	probe.free_bytes = 60ull << 30;
	probe.total_bytes = 80ull << 30;
	set_depth.session = 7;
	set_depth.target = 6;
	abandon.epoch = 3;
	sst.session = 7;
	sst.name = "rank0";
	sst.dataset = "imagenet";
	sst.device = "cuda:0";
	sst.state = "running";
	sst.target_reason = "probe";
	sst.sent = 100;
	dst.name = "imagenet";
	dst.format = "npy";
	dst.n_fields = 1;
	dst.fields = fields;
	dst.error = "";
	pst.dataset = "imagenet";
	pst.device = "cuda:0";
	pst.budget_reason = "probe";
	pst.hit_rate = 0.5;
	status_reply.daemon = "prefetchd 0.1.0";
	status_reply.n_sessions = 1;
	status_reply.sessions = ssts;
	status_reply.n_datasets = 1;
	status_reply.datasets = dsts;
	status_reply.n_pools = 1;
	status_reply.pools = psts;
	status_reply.gpu = "1 GPU";
	pool.dataset = "imagenet";
	pool.action = PF__POOL_ACTION__POOL_DROP;
	pool_reply.pools = 1;
	pool_reply.bytes_freed = 1 << 28;
	error.code = -ENOENT;
	error.message = "unknown dataset 'x'";

#define EACH(kind, member, msg)                                                                    \
	do {                                                                                       \
		pf__envelope__init(&env);                                                          \
		env.id = 11;                                                                       \
		env.msg_case = PF__ENVELOPE__MSG_##kind;                                           \
		env.member = &msg;                                                                 \
		fn(&env, arg);                                                                     \
	} while (0)
	EACH(HELLO, hello, hello);
	EACH(HELLO_REPLY, hello_reply, hello_reply);
	EACH(OPEN, open, open);
	EACH(OPENED, opened, opened);
	EACH(ARENA, arena, arena);
	EACH(START, start, start);
	EACH(LOAD, load, load);
	EACH(STARTED, started, started);
	EACH(BATCH, batch, batch);
	EACH(END, end, end);
	EACH(ACK, ack, ack);
	EACH(RELEASE, release, release);
	EACH(PROBE, probe, probe);
	EACH(SET_DEPTH, set_depth, set_depth);
	EACH(ABANDON, abandon, abandon);
	EACH(STATUS, status, status);
	EACH(STATUS_REPLY, status_reply, status_reply);
	EACH(POOL, pool, pool);
	EACH(POOL_REPLY, pool_reply, pool_reply);
	EACH(OK, ok, ok);
	EACH(ERROR, error, error);
#undef EACH
}

static void one_frame(Pf__Envelope *env, void *arg)
{
	struct buf b = {.n = 0};
	char name[64];

	put_bytes(&b, 2, 7, 0x35); /* the default cap, no descriptors */
	put_frame(&b, env);
	snprintf(name, sizeof(name), "msg-%s", wire_msg_name(env->msg_case));
	save("wire", name, &b);
}

static void all_frames(Pf__Envelope *env, void *arg)
{
	put_frame(arg, env);
}

static void wire_seeds(void)
{
	struct buf b = {.n = 0};

	each_message(one_frame, NULL);

	/* Everything in one stream: default cap, then with descriptors, then
	 * a 300-byte cap that the status reply exceeds. */
	put_bytes(&b, 2, 7, 0x11);
	each_message(all_frames, &b);
	save("wire", "stream-all", &b);
	b.b[0] = 7 | 8;
	b.b[1] = 0x92;
	save("wire", "stream-all-fds", &b);
	b.b[0] = 4;
	save("wire", "stream-all-cap300", &b);

	/* A body that does not decode, between two that do; an envelope
	 * with no message; a length over every cap; a frame cut short. */
	b.n = 0;
	put_bytes(&b, 2, 7, 0x40);
	put_bytes(&b, 4 + 6, 6, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff);
	put_bytes(&b, 4 + 2, 2, 0, 0, 0, 0x08, 0x01);
	put_bytes(&b, 4, 0, 0, 0, 0);
	save("wire", "bad-bodies", &b);
	b.n = 0;
	put_bytes(&b, 2, 6, 0x41);
	put_bytes(&b, 4, 0xff, 0xff, 0xff, 0x7f);
	save("wire", "oversized", &b);
	b.n = 0;
	put_bytes(&b, 2, 7, 0x42);
	put_bytes(&b, 4 + 3, 100, 0, 0, 0, 0x08, 0x01, 0x52);
	save("wire", "truncated", &b);
}

/* ---- sess: scripts ------------------------------------------------------------ */

#define OP(b, op, client) put_bytes((b), 1, FZ_HDR((op), (client)))

/* OPEN on a dataset (index), host, with batch byte, flags, augment,
 * min and max depth bytes, and no name. */
static void open_host(struct buf *b, int client, int set, int batch, int flags, int augment,
		      int min, int max)
{
	OP(b, FZ_OPEN, client);
	put_bytes(b, 8, set, 1, batch, flags, augment, min, max, 0);
}

/* START of the next epoch: order, seed, world, rank, start_batch, then
 * nidx explicit indices (each < 250). */
static void start_next(struct buf *b, int client, int order, int seed, int world, int rank,
		       int start, int nidx, const uint8_t *idx)
{
	OP(b, FZ_START, client);
	put_bytes(b, 7, 0, order, seed, world, rank, start, nidx);
	put(b, idx, (size_t)nidx);
}

/* Completes every reader job, takes one batch (ack) and gives one back,
 * n times: the trainer's loop. */
static void train(struct buf *b, int client, int n)
{
	for (int i = 0; i < n; i++) {
		OP(b, FZ_COMPLETE, 0);
		put_bytes(b, 1, 255);
		OP(b, FZ_ACK, client);
		put_bytes(b, 3, 0, 0, 3);
		OP(b, FZ_RELEASE, client);
		put_bytes(b, 1, 0);
	}
}

static void sess_seeds(void)
{
	static const uint8_t idx[] = {0, 36, 5, 5, 17, 2, 30, 31, 1, 9, 12, 20, 21, 3, 4, 6, 8, 7};
	struct buf b = {.n = 0};

	/* A sequential epoch to its end, batch 4 of 37 samples. */
	open_host(&b, 0, FZ_XY, 4, 0, 0, 0, 0);
	start_next(&b, 0, 0, 0, 0, 0, 0, 0, NULL);
	train(&b, 0, 14);
	save("sess", "epoch-sequential", &b);

	/* Shuffled, rank 1 of 2, resumed at batch 2, drop_last, augment 2,
	 * jobs back out of order; then the next epoch with seed + 1, whose
	 * order was built ahead. */
	b.n = 0;
	open_host(&b, 0, FZ_PQ, 3, 1, 2, 2, 6);
	start_next(&b, 0, 1, 7, 2, 1, 2, 0, NULL);
	OP(&b, FZ_AHEAD, 0);
	put_bytes(&b, 1, 0);
	for (int i = 0; i < 11; i++) {
		OP(&b, FZ_COMPLETE, 0);
		put_bytes(&b, 3, 1, 1, 0);
		OP(&b, FZ_ACK, 0);
		put_bytes(&b, 3, 0, 0, 3);
		OP(&b, FZ_RELEASE, 0);
		put_bytes(&b, 1, 1);
	}
	start_next(&b, 0, 1, 8, 2, 1, 4, 0, NULL);
	train(&b, 0, 9);
	save("sess", "epoch-shuffle-sharded", &b);

	/* The wide dataset: batches of 65 rows of 24 KiB (augment 3), each
	 * read in two parts that come back in either order. */
	b.n = 0;
	open_host(&b, 0, FZ_WIDE, 212, 0, 3, 0, 0);
	start_next(&b, 0, 0, 0, 0, 0, 0, 0, NULL);
	for (int i = 0; i < 4; i++) {
		OP(&b, FZ_COMPLETE, 0);
		put_bytes(&b, 3, 1, 1, 0);
		OP(&b, FZ_ACK, 0);
		put_bytes(&b, 3, 0, 0, 3);
		OP(&b, FZ_RELEASE, 0);
		put_bytes(&b, 1, 0);
	}
	save("sess", "epoch-wide-parts", &b);

	/* Explicit indices, repeated and out of order, in two ranks' shares;
	 * then a list with an index out of range (refused). */
	b.n = 0;
	open_host(&b, 0, FZ_XY, 3, 0, 0, 0, 0);
	start_next(&b, 0, 2, 0, 2, 1, 0, sizeof(idx), idx);
	train(&b, 0, 5);
	start_next(&b, 0, 2, 0, 0, 0, 0, 3, (const uint8_t *)"\x01\x25\x02");
	save("sess", "epoch-explicit", &b);

	/* An epoch abandoned with reads in flight, the next started over
	 * it, the orphans coming back late; made-up releases. */
	b.n = 0;
	open_host(&b, 0, FZ_XY, 5, 0, 0, 0, 0);
	start_next(&b, 0, 0, 0, 0, 0, 0, 0, NULL);
	OP(&b, FZ_COMPLETE, 0);
	put_bytes(&b, 2, 0, 1);
	OP(&b, FZ_ABANDON, 0);
	put_bytes(&b, 1, 0);
	start_next(&b, 0, 1, 3, 0, 0, 0, 0, NULL);
	OP(&b, FZ_RELEASE, 0);
	put_bytes(&b, 1, 0);
	train(&b, 0, 4);
	OP(&b, FZ_RELEASE_ANY, 0);
	put_bytes(&b, 3, 0x7f, 0, 3);
	OP(&b, FZ_RELEASE_ANY, 0);
	put_bytes(&b, 2, 0xff, 255);
	put_u64(&b, 1ull << 63);
	put_bytes(&b, 1, 0);
	train(&b, 0, 6);
	save("sess", "abandon-restart", &b);

	/* Three clients, two sessions at most: status, depth changed from
	 * another connection, pool control, the third refused until the
	 * first leaves. */
	b.n = 0;
	open_host(&b, 0, FZ_XY, 4, 0, 0, 0, 0);
	start_next(&b, 0, 0, 0, 0, 0, 0, 0, NULL);
	OP(&b, FZ_STATUS, 1);
	OP(&b, FZ_DEPTH, 2);
	put_bytes(&b, 3, 2, 8, 0);
	OP(&b, FZ_POOL, 1);
	put_bytes(&b, 2, FZ_XY, 1);
	open_host(&b, 1, FZ_PQ, 2, 0, 0, 0, 0);
	open_host(&b, 2, FZ_WIDE, 1, 0, 0, 0, 0);
	train(&b, 0, 3);
	OP(&b, FZ_CLOSE, 0);
	put_bytes(&b, 1, 0);
	open_host(&b, 2, FZ_WIDE, 1, 0, 0, 0, 0);
	OP(&b, FZ_STATUS, 1);
	save("sess", "three-clients", &b);

	/* Refusals: a CUDA device on a daemon without GPUs, a broken and an
	 * unknown dataset, batch 0, a message only daemons send; a client
	 * that skips Hello, one with the wrong version. */
	b.n = 0;
	OP(&b, FZ_OPEN, 0);
	put_bytes(&b, 8, FZ_XY, 2, 4, 0, 0, 0, 0, 0);
	open_host(&b, 0, FZ_BROKEN, 4, 0, 0, 0, 0);
	open_host(&b, 0, FZ_UNKNOWN, 4, 0, 0, 0, 0);
	open_host(&b, 0, FZ_XY, 0, 0, 0, 0, 0);
	OP(&b, FZ_UNEXPECTED, 0);
	put_bytes(&b, 1, 4);
	put_bytes(&b, 1, FZ_HDR(FZ_START, 1) | FZ_NO_HELLO);
	put_bytes(&b, 7, 0, 0, 0, 0, 0, 0, 0);
	put_bytes(&b, 1, FZ_HDR(FZ_HELLO, 2) | FZ_NO_HELLO);
	put_bytes(&b, 2, 245, 0);
	save("sess", "refusals", &b);

	/* Raw bytes (a Hello frame, then garbage), half a frame then close,
	 * a shutdown of the writing side. */
	b.n = 0;
	put_bytes(&b, 1, FZ_HDR(FZ_RAW, 0) | FZ_NO_HELLO);
	put_bytes(&b, 1, 16);
	put_bytes(&b, 16, 6, 0, 0, 0, 0x52, 0x02, 0x08, 0x01, 0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4);
	open_host(&b, 1, FZ_XY, 4, 0, 0, 0, 0);
	OP(&b, FZ_CLOSE, 1);
	put_bytes(&b, 1, 1);
	open_host(&b, 2, FZ_XY, 4, 0, 0, 0, 0);
	start_next(&b, 2, 0, 0, 0, 0, 0, 0, NULL);
	OP(&b, FZ_CLOSE, 2);
	put_bytes(&b, 1, 2);
	OP(&b, FZ_COMPLETE, 0);
	put_bytes(&b, 1, 255);
	/* A request with a descriptor attached, from a client in a session. */
	open_host(&b, 0, FZ_XY, 4, 0, 0, 0, 0);
	start_next(&b, 0, 0, 0, 0, 0, 0, 0, NULL);
	OP(&b, FZ_CLOSE, 0);
	put_bytes(&b, 1, 3);
	save("sess", "raw-and-disconnects", &b);

	/* A paced epoch: good requests, one too large, one out of range,
	 * then the end. */
	b.n = 0;
	open_host(&b, 0, FZ_XY, 4, 0, 0, 0, 0);
	start_next(&b, 0, 3, 0, 0, 0, 0, 0, NULL);
	OP(&b, FZ_LOAD, 0);
	put_bytes(&b, 7, 0, 0, 4, 1, 2, 3, 36);
	OP(&b, FZ_LOAD, 0);
	put_bytes(&b, 8, 0, 0, 5, 1, 2, 3, 4, 5);
	OP(&b, FZ_LOAD, 0);
	put_bytes(&b, 5, 0, 0, 2, 36, 37);
	OP(&b, FZ_LOAD, 0);
	put_bytes(&b, 6, 0, 0, 3, 9, 9, 9);
	OP(&b, FZ_LOAD, 0);
	put_bytes(&b, 3, 0, 7, 0);
	train(&b, 0, 5);
	save("sess", "paced", &b);

	/* Files cut short after the load: batches over the lost rows come
	 * back as error batches in their place, read with pread and through
	 * the mapping (SIGBUS), in order and shuffled. */
	b.n = 0;
	open_host(&b, 0, FZ_CUT, 4, 0, 0, 0, 0);
	start_next(&b, 0, 0, 0, 0, 0, 0, 0, NULL);
	train(&b, 0, 11);
	open_host(&b, 1, FZ_CUTMAP, 6, 0, 0, 0, 0);
	start_next(&b, 1, 1, 5, 0, 0, 0, 0, NULL);
	train(&b, 1, 8);
	save("sess", "truncated-files", &b);

	/* Regressions, one per bug the harness found in sess.c. */
	b.n = 0; /* a batch too large for session_bytes: sess_free on no slots */
	OP(&b, FZ_OPEN, 0);
	put_bytes(&b, 3, FZ_PQ, 1, 0xf6);
	put_u64(&b, 65528);
	put_bytes(&b, 5, 0, 0, 0, 0, 0);
	save("sess", "regress-open-too-large-frees-no-slots", &b);
	b.n = 0; /* max_depth UINT32_MAX, then UINT32_MAX - 1: the slot count wrapped */
	open_host(&b, 0, FZ_XY, 1, 0, 0, 0, 240);
	OP(&b, FZ_CLOSE, 0);
	put_bytes(&b, 1, 0);
	open_host(&b, 0, FZ_XY, 1, 0, 0, 0, 241);
	start_next(&b, 0, 0, 0, 0, 0, 0, 0, NULL);
	train(&b, 0, 3);
	save("sess", "regress-max-depth-wraps-slot-count", &b);
	b.n = 0; /* a LoadBatch with no picks: memcpy from NULL */
	open_host(&b, 0, FZ_XY, 4, 0, 0, 0, 0);
	start_next(&b, 0, 3, 0, 0, 0, 0, 0, NULL);
	OP(&b, FZ_LOAD, 0);
	put_bytes(&b, 3, 0, 0, 0);
	train(&b, 0, 1);
	save("sess", "regress-paced-load-without-picks", &b);

	/* Depth bounds at the edges of uint32, probes, automatic depth. */
	b.n = 0;
	open_host(&b, 0, FZ_XY, 1, 0, 0, 240, 240);
	open_host(&b, 0, FZ_XY, 1, 0, 0, 0, 241);
	open_host(&b, 1, FZ_XY, 1, 0, 0, 1, 243);
	OP(&b, FZ_PROBE, 1);
	put_bytes(&b, 2, 4, 8);
	OP(&b, FZ_DEPTH, 1);
	put_bytes(&b, 2, 0, 250);
	put_u64(&b, 0xffffffffu);
	put_bytes(&b, 1, 0);
	OP(&b, FZ_DEPTH, 1);
	put_bytes(&b, 3, 0, 0, 1);
	start_next(&b, 1, 0, 0, 0, 0, 0, 0, NULL);
	train(&b, 1, 6);
	OP(&b, FZ_STATUS, 1);
	save("sess", "depth-edges", &b);
}

/* ---- npy: headers ------------------------------------------------------------ */

static void npy_seeds(void)
{
	static const struct {
		const char *descr;
		size_t itemsize;
	} types[] = {{"<f4", 4}, {"<i8", 8}, {"|u1", 1}, {"|b1", 1}, {"<f2", 2}, {"<u2", 2}};
	static const uint64_t shapes[][2] = {{0, 0}, {4, 0}, {2, 3}};
	static const char *const odd[] = {
		"{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (3,)}",
		"{'shape': (2, 2), 'fortran_order': False, 'descr': '<i4',}",
		"{'descr':'<u8','fortran_order':False,'shape':(3L, 2L)}",
		"{'descr': '<f8', 'fortran_order': True, 'shape': (2, 2), }",
		"{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }",
		"{'descr': 'f4', 'fortran_order': False, 'shape': (2,), }",
		"{'descr': '|O', 'fortran_order': False, 'shape': (2,), }",
		"{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }",
		"{'descr': '<f4', 'fortran_order': False, 'shape': (), }",
		"{'descr': '<f4', 'fortran_order': False, 'shape': (18446744073709551615, 2), }",
	};
	struct buf b;
	char name[64];

	for (unsigned v = 1; v <= 3; v++) {
		for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
			for (int s = 0; s < 3; s++) {
				size_t hlen = npygen_header(b.b, sizeof(b.b), v, types[t].descr, 3,
							    shapes[s], s);
				uint64_t data = 3 * types[t].itemsize;

				if (!hlen)
					fail("cannot make a .npy header");
				for (int i = 0; i < s; i++)
					data *= shapes[s][i];
				memset(b.b + hlen, 0xa5, data);
				b.n = hlen + data;
				snprintf(name, sizeof(name), "v%u-%s-%dd", v, types[t].descr + 1,
					 s + 1);
				save("npy", name, &b);
			}
		}
	}
	for (size_t i = 0; i < sizeof(odd) / sizeof(odd[0]); i++) {
		size_t dlen = strlen(odd[i]), total = (10 + dlen + 1 + 63) / 64 * 64;

		memcpy(b.b, "\x93NUMPY\x01\x00", 8);
		b.b[8] = (uint8_t)(total - 10);
		b.b[9] = (uint8_t)((total - 10) >> 8);
		memcpy(b.b + 10, odd[i], dlen);
		memset(b.b + 10 + dlen, ' ', total - 10 - dlen - 1);
		b.b[total - 1] = '\n';
		memset(b.b + total, 0, 64);
		b.n = total + 64;
		snprintf(name, sizeof(name), "odd-%zu", i);
		save("npy", name, &b);
	}
}

/* ---- tokens: shard headers ------------------------------------------------------ */

static void shard_header(struct buf *b, int32_t magic, int32_t version, int32_t count)
{
	const int32_t v[3] = {magic, version, count};
	size_t at = b->n;

	memset(b->b + at, 0, TOKENS_HEADER_BYTES);
	for (int i = 0; i < 3; i++)
		for (int k = 0; k < 4; k++)
			b->b[at + 4 * i + k] = (uint8_t)((uint32_t)v[i] >> (8 * k));
	b->n += TOKENS_HEADER_BYTES;
}

static void tokens_seeds(void)
{
	struct buf b;

	/* Mode 0: the file is as long as the count says (slack 0). */
	b.n = 0;
	put_bytes(&b, 1, 0);
	put_u64(&b, 0);
	shard_header(&b, TOKENS_MAGIC, 1, 100000000);
	save("tokens", "exact-100M", &b);
	b.n = 0;
	put_bytes(&b, 1, 0);
	put_u64(&b, 0xff);
	shard_header(&b, TOKENS_MAGIC, 1, 1);
	save("tokens", "short-by-one", &b);
	/* Mode 1: the rest of the input is the whole file, a short final
	 * shard of 7 GPT-2 end-of-text tokens. */
	b.n = 0;
	put_bytes(&b, 1, 1);
	put_u64(&b, 0);
	shard_header(&b, TOKENS_MAGIC, 1, 7);
	for (int i = 0; i < 7; i++)
		put_bytes(&b, 2, 0x50, 0xc4);
	save("tokens", "whole-short-shard", &b);
	/* Mode 2: the file's length given; wrong magic, version, count. */
	b.n = 0;
	put_bytes(&b, 1, 2);
	put_u64(&b, 1044);
	shard_header(&b, 20240801, 7, 10);
	save("tokens", "llama3", &b);
	b.n = 0;
	put_bytes(&b, 1, 2);
	put_u64(&b, 1044);
	shard_header(&b, TOKENS_MAGIC, 2, 10);
	save("tokens", "version-2", &b);
	b.n = 0;
	put_bytes(&b, 1, 2);
	put_u64(&b, 1024);
	shard_header(&b, TOKENS_MAGIC, 1, -1);
	save("tokens", "negative-count", &b);
	b.n = 0;
	put_bytes(&b, 1, 2);
	put_u64(&b, 4096);
	put(&b, "\x93NUMPY\x01\x00", 8);
	memset(b.b + b.n, 0, TOKENS_HEADER_BYTES - 8);
	b.n += TOKENS_HEADER_BYTES - 8;
	save("tokens", "npy", &b);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: mkcorpus DIR\n");
		return 2;
	}
	out_dir = argv[1];
	if (mkdir(out_dir, 0755) < 0 && errno != EEXIST)
		fail("cannot create %s: %s", out_dir, strerror(errno));
	wire_seeds();
	sess_seeds();
	npy_seeds();
	tokens_seeds();
	return 0;
}
