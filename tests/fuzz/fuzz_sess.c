/*
 * fuzz_sess.c — libFuzzer harness: scripted clients against the daemon's
 * real server, sessions and governor, on tiny real datasets.
 *
 * The input is a script (sess_ops.h) of requests from up to three clients:
 * Hello, OpenSession, StartEpoch with every order and explicit index lists
 * (out-of-range picks included), LoadBatch of paced epochs, Ack, Release of
 * held and of made-up batches, Abandon, Probe, SetDepth, StatusRequest,
 * PoolControl, messages only a daemon sends, raw bytes, disconnects
 * mid-frame; and the two things that happen on other threads in the daemon,
 * done when the script says: a reader job coming back (in any order) and an
 * order built ahead.  The datasets are tiny real .npy files written at start
 * (two fields, 24 KiB rows read in parts, pread, two shards, one that fails
 * to load, two truncated after the load so that a read past the cut finds
 * the file changed on disk: an -ESTALE error batch that ends every epoch
 * of the dataset, which then refuses new sessions, epochs and loads).
 *
 * The transport is real: server.c accepts the clients on its listening
 * socket and they talk over Unix sockets, arenas arrive as memfds with
 * SCM_RIGHTS and are mapped by the client.  What is faked is time and
 * threads, so a script always runs the same way:
 *   - the loop is turned by hand: the daemon's uv_poll and uv_close calls
 *     are replaced at link time (ld --wrap) and the harness calls its
 *     callbacks back when their socket has something (see struct fz_poll),
 *     until nothing moves ("settling") after every action;
 *   - reader_submit and uv_queue_work are replaced at link time (ld
 *     --wrap): jobs wait in a list until a COMPLETE or AHEAD action runs
 *     them on this thread through the real reader_run_job / work callback;
 *   - wire_send_some is wrapped to note who wrote: a client's write makes
 *     the daemon's handle readable, the daemon's makes the clients read;
 *   - the log functions are replaced too: they format (so a bad format
 *     argument is still found) and print only with FUZZ_VERBOSE set.
 * There is no GPU (gpu_none.c): CUDA sessions must be refused cleanly.
 *
 * After every action the harness checks what it can see from both sides:
 * sess_check (with gov_check) of every live session, the slot count the
 * session promises, and that the pump left nothing waiting that it could
 * have sent or started (a trainer would wait forever); that every frame
 * from the daemon decodes; that every request gets exactly one reply of a
 * kind that answers it, and that Opened/Started/Error agree with an
 * independent prediction; that batches arrive in order with the picks the
 * order specification gives, hold the right rows, are never lent in a slot
 * that is still held, and still hold them when released; that the daemon
 * closes a connection only for a reason; and, at the end of the script,
 * that every session was freed and no descriptor or memory leaked.
 *
 * DESIGN: one thread.  The daemon's state (struct daemon) and the datasets
 * are built once; everything a script creates is torn down before the next.
 */
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <uv.h>

#include "server/closer.h"
#include "conf/config.h"
#include "state/daemon.h"
#include "data/dataset.h"
#include "sess/gov.h"
#include "gpu/gpu.h"
#include "npygen.h"
#include "order/order.h"
#include "data/reader.h"
#include "server/server.h"
#include "sess/sess.h"
#include "sess_ops.h"
#include "util.h"
#include "wire.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The daemon under test: its state, built once; its loop is never run. */
static struct daemon d;
static uv_loop_t loop;

/* ---- failures and the link-time seams -------------------------------------- */

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

static void die(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "fuzz_sess: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	abort();
}

static bool verbose;

/* The idle handles that carry work over to the next turn: sessions' pumps
 * (SESS_TURN_BYTES) and connections' frames (CONN_FRAME_BUDGET), turned by
 * turn() while active. */
#define FZ_IDLES 2
static struct fz_idle {
	uv_idle_t *h;
	uv_idle_cb cb; /* NULL: stopped */
} idles[FZ_IDLES];

static struct fz_idle *find_idle(const void *h)
{
	for (int i = 0; i < FZ_IDLES; i++)
		if (idles[i].h && (const void *)idles[i].h == h)
			return &idles[i];
	return NULL;
}

void __wrap_log_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void __wrap_log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void __wrap_log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void __wrap_log_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void __wrap_reader_submit(struct readers *p, struct reader_job *job);
int __wrap_uv_queue_work(uv_loop_t *lp, uv_work_t *req, uv_work_cb work_cb,
			 uv_after_work_cb after_work_cb);
long __real_wire_send_some(int sock, const uint8_t *buf, size_t len, int pass_fd);
long __wrap_wire_send_some(int sock, const uint8_t *buf, size_t len, int pass_fd);
int __wrap_uv_poll_init(uv_loop_t *lp, uv_poll_t *h, int fd);
int __wrap_uv_poll_start(uv_poll_t *h, int events, uv_poll_cb cb);
int __wrap_uv_poll_stop(uv_poll_t *h);
void __wrap_uv_close(uv_handle_t *h, uv_close_cb cb);
int __wrap_uv_timer_init(uv_loop_t *lp, uv_timer_t *t) __attribute__((noreturn));
int __wrap_uv_idle_init(uv_loop_t *lp, uv_idle_t *h);
int __wrap_uv_idle_start(uv_idle_t *h, uv_idle_cb cb);
int __wrap_uv_idle_stop(uv_idle_t *h);

static void vlog_line(const char *fmt, va_list ap)
{
	char line[1024];

	vsnprintf(line, sizeof(line), fmt, ap);
	if (verbose)
		fprintf(stderr, "daemon: %s\n", line);
}

#define WRAP_LOG(name)                                                                             \
	void name(const char *fmt, ...)                                                            \
	{                                                                                          \
		va_list ap;                                                                        \
		va_start(ap, fmt);                                                                 \
		vlog_line(fmt, ap);                                                                \
		va_end(ap);                                                                        \
	}
WRAP_LOG(__wrap_log_err)
WRAP_LOG(__wrap_log_warn)
WRAP_LOG(__wrap_log_info)
WRAP_LOG(__wrap_log_debug)

/* Reader jobs the daemon submitted, not yet run (owned by the daemon's
 * sessions; this list only borrows them until sess_job_done). */
static struct reader_job **jobs;
static size_t njobs, jobs_cap;

void __wrap_reader_submit(struct readers *p, struct reader_job *job)
{
	if (njobs == jobs_cap) {
		jobs_cap = jobs_cap ? 2 * jobs_cap : 64;
		jobs = realloc(jobs, jobs_cap * sizeof(*jobs));
		if (!jobs)
			die("out of memory for the job list");
	}
	jobs[njobs++] = job;
}

/* Order builds queued on "libuv's thread pool". */
struct fz_work {
	uv_work_t *req; /* borrowed: lives in its session until after_cb */
	uv_work_cb work_cb;
	uv_after_work_cb after_cb;
};
static struct fz_work *works;
static size_t nworks, works_cap;

int __wrap_uv_queue_work(uv_loop_t *lp, uv_work_t *req, uv_work_cb work_cb,
			 uv_after_work_cb after_work_cb)
{
	if (nworks == works_cap) {
		works_cap = works_cap ? 2 * works_cap : 16;
		works = realloc(works, works_cap * sizeof(*works));
		if (!works)
			die("out of memory for the work list");
	}
	works[nworks++] = (struct fz_work){req, work_cb, after_work_cb};
	return 0;
}

/* The daemon's poll handles (the listener and its connections), which the
 * harness turns by hand instead of libuv: a handle is called back readable
 * when its client wrote or hung up since, writable whenever it asks to be
 * (the clients read everything, so their sockets always have room), and a
 * closed handle's callback runs on the next turn, as libuv's closing phase
 * would.  The sockets, reads and writes stay real; only epoll is left out,
 * which halves the system calls of a request. */
struct fz_poll {
	uv_handle_t *h; /* borrowed: the daemon's, until its close callback */
	uv_poll_cb cb;
	int events;
	bool active;
	bool readable; /* its client wrote or hung up since the last callback */
};

#define FZ_MAX_POLLS 16
static struct fz_poll polls[FZ_MAX_POLLS];
static size_t npolls;

struct fz_close {
	uv_handle_t *h;
	uv_close_cb cb;
};

static struct fz_close closes[FZ_MAX_POLLS];
static size_t ncloses;

/* Set when the daemon wrote to a client or closed a connection since the
 * clients were last read: they are read only then. */
static bool daemon_wrote;
static bool is_client_fd(int fd);
static void client_wrote(int fd);
static void forget_peer(const uv_handle_t *h);

static struct fz_poll *find_poll(const void *h)
{
	for (size_t i = 0; i < npolls; i++)
		if (polls[i].h == h)
			return &polls[i];
	return NULL;
}

int __wrap_uv_poll_init(uv_loop_t *lp, uv_poll_t *h, int fd)
{
	memset(h, 0, sizeof(*h));
	h->loop = lp;
	h->type = UV_POLL;
	if (npolls == FZ_MAX_POLLS)
		die("more than %d poll handles", FZ_MAX_POLLS);
	polls[npolls++] = (struct fz_poll){.h = (uv_handle_t *)h};
	return 0;
}

int __wrap_uv_poll_start(uv_poll_t *h, int events, uv_poll_cb cb)
{
	struct fz_poll *p = find_poll(h);

	if (!p)
		die("uv_poll_start on a handle never initialised");
	p->cb = cb;
	p->events = events;
	p->active = true;
	return 0;
}

int __wrap_uv_poll_stop(uv_poll_t *h)
{
	struct fz_poll *p = find_poll(h);

	if (p)
		p->active = false;
	return 0;
}

void __wrap_uv_close(uv_handle_t *h, uv_close_cb cb)
{
	struct fz_poll *p = find_poll(h);

	if (p)
		p->active = false;
	if (find_idle(h))
		*find_idle(h) = (struct fz_idle){0};
	if (ncloses == FZ_MAX_POLLS)
		die("more than %d handles closing", FZ_MAX_POLLS);
	closes[ncloses++] = (struct fz_close){h, cb};
}

int __wrap_uv_idle_init(uv_loop_t *lp, uv_idle_t *h)
{
	struct fz_idle *x = NULL;

	memset(h, 0, sizeof(*h));
	h->loop = lp;
	h->type = UV_IDLE;
	for (int i = 0; i < FZ_IDLES && !x; i++)
		if (!idles[i].h)
			x = &idles[i];
	if (!x)
		die("more than %d idle handles", FZ_IDLES);
	*x = (struct fz_idle){.h = h};
	return 0;
}

int __wrap_uv_idle_start(uv_idle_t *h, uv_idle_cb cb)
{
	struct fz_idle *x = find_idle(h);

	if (!x)
		die("uv_idle_start on a handle never initialised");
	x->cb = cb;
	return 0;
}

int __wrap_uv_idle_stop(uv_idle_t *h)
{
	struct fz_idle *x = find_idle(h);

	if (x)
		x->cb = NULL;
	return 0;
}

/* A timer would be linked into the real loop by uv_timer_init, and stay
 * linked after the harness's uv_close (only the loop's closing phase, never
 * run here, unlinks it): the next handle linked would write into its freed
 * memory behind ASan's back, since libuv is not instrumented.  Only GPU
 * sessions have one (the retry of a failed device allocation) and this
 * build has no GPU, so a timer is a finding, before any harm is done. */
int __wrap_uv_timer_init(uv_loop_t *lp, uv_timer_t *t)
{
	(void)lp;
	die("a timer (%p) was initialised: only GPU sessions have one, and this daemon has "
	    "no GPU",
	    (void *)t);
}

/* The closing phase: callbacks of the handles closed before this turn. */
static bool run_closes(void)
{
	size_t n = ncloses;

	for (size_t i = 0; i < n; i++) {
		struct fz_close x = closes[i];
		struct fz_poll *p = find_poll(x.h);

		if (p)
			*p = polls[--npolls];
		forget_peer(x.h);
		daemon_wrote = true; /* its client may now read the end */
		if (x.cb)
			x.cb(x.h);
	}
	memmove(closes, closes + n, (ncloses - n) * sizeof(*closes));
	ncloses -= n;
	return n > 0;
}

/* One turn of the daemon's loop.  Returns whether anything happened. */
static bool turn(void)
{
	bool moved = run_closes();

	for (size_t i = 0; i < npolls; i++) {
		struct fz_poll *p = &polls[i];
		int ev = 0;

		if (!p->active || p->h == (uv_handle_t *)&d.listen_poll)
			continue;
		if (p->readable && (p->events & UV_READABLE))
			ev |= UV_READABLE;
		if (p->events & UV_WRITABLE)
			ev |= UV_WRITABLE;
		if (!ev)
			continue;
		p->readable = false;
		moved = true;
		p->cb((uv_poll_t *)p->h, 0, ev);
	}
	for (int i = 0; i < FZ_IDLES; i++) {
		if (idles[i].cb) {
			moved = true;
			idles[i].cb(idles[i].h);
		}
	}
	return moved;
}

long __wrap_wire_send_some(int sock, const uint8_t *buf, size_t len, int pass_fd)
{
	if (is_client_fd(sock))
		client_wrote(sock);
	else
		daemon_wrote = true;
	return __real_wire_send_some(sock, buf, len, pass_fd);
}

/* ---- the datasets ---------------------------------------------------------- */

#define FZ_ROWS	      37
#define FZ_MAX_FIELDS 2
/* Orders of at most this many times N picks: max_epoch_picks. */
#define FZ_AUGMENT_MAX 1024u

struct fz_field {
	const char *name;
	const char *descr;
	uint64_t sample_shape[2];
	int sample_ndim;
	size_t itemsize;
	unsigned shards; /* files the rows are split over (1 or 2) */
	uint64_t row_bytes;
	uint8_t *rows; /* owned: FZ_ROWS rows, as written to the files */
};

struct fz_set {
	const char *name;
	enum config_read read;
	bool broken; /* declared with a file that does not exist */
	/* Nonzero: the files are cut to this many rows after the load, so
	 * that reading a row past it must find the file changed on disk: an
	 * -ESTALE error batch, the epoch's last (sess_pump.c). */
	uint64_t cut;
	struct fz_field fields[FZ_MAX_FIELDS];
	size_t nfields;
};

#define FIELD(n, d, size, nd, s0, s1, nshards)                                                     \
	{                                                                                          \
		.name = n, .descr = d, .itemsize = size, .sample_ndim = nd,                        \
		.sample_shape = {s0, s1}, .shards = nshards                                        \
	}

static struct fz_set sets[] = {
	{.name = "xy",
	 .read = CONFIG_READ_MMAP,
	 .fields = {FIELD("x", "<f4", 4, 1, 3, 0, 1), FIELD("y", "<i8", 8, 0, 0, 0, 1)},
	 .nfields = 2},
	/* 24 KiB rows: a batch of 43 or more is read in several parts. */
	{.name = "wide",
	 .read = CONFIG_READ_MMAP,
	 .fields = {FIELD("w", "<u2", 2, 1, 12288, 0, 1)},
	 .nfields = 1},
	/* Read with pread; field q lies in two shards. */
	{.name = "pq",
	 .read = CONFIG_READ_PREAD,
	 .fields = {FIELD("p", "|u1", 1, 1, 5, 0, 1), FIELD("q", "<f8", 8, 2, 2, 2, 2)},
	 .nfields = 2},
	{.name = "broken",
	 .read = CONFIG_READ_MMAP,
	 .broken = true,
	 .fields = {FIELD("b", "<f4", 4, 1, 1, 0, 1)},
	 .nfields = 1},
	/* Truncated after load: pread sees a short read; the mapping a
	 * SIGBUS on the 4 KiB rows wholly past the new end. */
	{.name = "cut",
	 .read = CONFIG_READ_PREAD,
	 .cut = 30,
	 .fields = {FIELD("c", "<i4", 4, 1, 2, 0, 1)},
	 .nfields = 1},
	{.name = "cutmap",
	 .read = CONFIG_READ_MMAP,
	 .cut = 30,
	 .fields = {FIELD("m", "|u1", 1, 1, 4096, 0, 1)},
	 .nfields = 1},
};
#define FZ_NSETS (sizeof(sets) / sizeof(sets[0]))
_Static_assert(FZ_NSETS == FZ_UNKNOWN, "sets[] follows enum fz_set_index");

/* OPEN and POOL name a dataset by index: the table, then names the daemon
 * does not serve. */
static const char *set_name(unsigned i)
{
	static const char *const unknown[] = {"nope", ""};

	i %= FZ_NDATASETS;
	return i < FZ_NSETS ? sets[i].name : unknown[(i - FZ_NSETS) % 2];
}

static const char *const devices[FZ_NDEVICES] = {"",	  "host",    "cuda:0", "cuda:1",
						 "cuda:", "cuda:-1", "gpu",    "cuda:0x"};

static char dir[64];
static int fd_baseline;

static int write_file(const char *path, const uint8_t *a, size_t alen, const uint8_t *b,
		      size_t blen)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	int rc = 0;

	if (fd < 0)
		return -errno;
	if (write(fd, a, alen) != (ssize_t)alen || write(fd, b, blen) != (ssize_t)blen)
		rc = -EIO;
	close(fd);
	return rc;
}

/* Writes set's files in dir and fills its config declaration. */
static void make_set(struct fz_set *set, unsigned version, uint64_t seed,
		     struct config_dataset *decl)
{
	decl->name = (char *)set->name;
	decl->format = "npy";
	decl->read = set->read;
	decl->nfields = set->nfields;
	decl->fields = calloc(set->nfields, sizeof(*decl->fields));
	if (!decl->fields)
		die("out of memory");
	for (size_t f = 0; f < set->nfields; f++) {
		struct fz_field *fl = &set->fields[f];
		struct config_field *cf = &decl->fields[f];
		uint64_t first = 0;

		fl->row_bytes = fl->itemsize;
		for (int i = 0; i < fl->sample_ndim; i++)
			fl->row_bytes *= fl->sample_shape[i];
		fl->rows = malloc(FZ_ROWS * fl->row_bytes);
		if (!fl->rows)
			die("out of memory");
		for (uint64_t r = 0; r < FZ_ROWS; r++)
			for (uint64_t pos = 0; pos < fl->row_bytes; pos++)
				fl->rows[r * fl->row_bytes + pos] = npygen_byte(seed + f, r, pos);
		cf->name = (char *)fl->name;
		cf->npaths = fl->shards;
		cf->paths = calloc(fl->shards, sizeof(char *));
		if (!cf->paths)
			die("out of memory");
		for (unsigned s = 0; s < fl->shards; s++) {
			/* Two shards split the rows at 20. */
			uint64_t rows = fl->shards == 1 ? FZ_ROWS : s == 0 ? 20 : FZ_ROWS - 20;
			uint8_t hdr[256];
			size_t hlen = npygen_header(hdr, sizeof(hdr), version, fl->descr, rows,
						    fl->sample_shape, fl->sample_ndim);
			char *path = malloc(128);

			if (!path || !hlen)
				die("cannot make the header of %s", fl->name);
			snprintf(path, 128, "%s/%s-%s%u.npy", dir, set->name, fl->name, s);
			cf->paths[s] = path;
			if (set->broken && f == 0)
				continue; /* declared, never written */
			if (write_file(path, hdr, hlen, fl->rows + first * fl->row_bytes,
				       rows * fl->row_bytes))
				die("cannot write %s", path);
			first += rows;
		}
	}
}

static void cleanup_dir(void)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (dir[0] && system(cmd) != 0)
		fprintf(stderr, "fuzz_sess: could not remove %s\n", dir);
}

/* ---- statistics, printed at exit ------------------------------------------- */

static struct {
	uint64_t sent[FZ_NOPS];
	uint64_t opened, open_refused, started, start_refused, batches, ends, released,
		refused_releases, daemon_closes, jobs_run, ahead_run, fds_sent;
	uint64_t max_held;
} st;

static void print_stats(void)
{
	static const char *const names[FZ_NOPS] = {
		[FZ_COMPLETE] = "complete", [FZ_AHEAD] = "ahead",
		[FZ_HELLO] = "hello",	    [FZ_OPEN] = "open",
		[FZ_START] = "start",	    [FZ_ACK] = "ack",
		[FZ_RELEASE] = "release",   [FZ_RELEASE_ANY] = "release_any",
		[FZ_ABANDON] = "abandon",   [FZ_PROBE] = "probe",
		[FZ_DEPTH] = "depth",	    [FZ_STATUS] = "status",
		[FZ_POOL] = "pool",	    [FZ_UNEXPECTED] = "unexpected",
		[FZ_RAW] = "raw",	    [FZ_CLOSE] = "close",
		[FZ_LOAD] = "load"};

	fprintf(stderr, "fuzz_sess: actions:");
	for (int i = 0; i < FZ_NOPS; i++)
		fprintf(stderr, " %s %" PRIu64, names[i], st.sent[i]);
	fprintf(stderr,
		"\nfuzz_sess: sessions opened %" PRIu64 " (refused %" PRIu64
		"), epochs started %" PRIu64 " (refused %" PRIu64 "), batches %" PRIu64
		", epochs ended %" PRIu64 ", releases %" PRIu64 " (refused %" PRIu64
		"), connections closed by the daemon %" PRIu64 ", reader jobs run %" PRIu64
		", orders built ahead %" PRIu64 ", most held %" PRIu64
		", requests with a descriptor %" PRIu64 "\n",
		st.opened, st.open_refused, st.started, st.start_refused, st.batches, st.ends,
		st.released, st.refused_releases, st.daemon_closes, st.jobs_run, st.ahead_run,
		st.max_held, st.fds_sent);
}

/* ---- the script ------------------------------------------------------------- */

struct script {
	const uint8_t *p;
	size_t n;
};

static uint8_t next_u8(struct script *in)
{
	if (!in->n)
		return 0;
	in->n--;
	return *in->p++;
}

static uint64_t next_u64(struct script *in)
{
	uint64_t v = 0;

	for (int i = 0; i < 8; i++)
		v |= (uint64_t)next_u8(in) << (8 * i);
	return v;
}

/* ---- clients ---------------------------------------------------------------- */

#define FZ_MAX_REQS 8
/* Actions per script: enough for a whole epoch of 14 batches (three
 * actions a batch) and its setup. */
#define FZ_MAX_ACTIONS 64

struct fz_held {
	uint64_t epoch, seq;
	int32_t slot;
	uint32_t arena;
	uint64_t offset;
	uint32_t count;
	uint64_t *picks; /* owned */
};

/* The harness's prediction of a request's fate. */
enum fz_expect { FZ_EITHER, FZ_ACCEPT, FZ_REFUSE };

struct fz_req {
	uint64_t id;
	enum fz_op op;
	enum fz_expect expect_ok;
	uint64_t epoch;	   /* START, ABANDON */
	uint64_t *expect;  /* START: owned, the share the order gives */
	uint64_t nexpect;  /* START */
	uint64_t nbatches; /* START: batches of the share, start_batch included */
	uint64_t start_batch;
	bool paced;	       /* START: a paced epoch */
	bool cuda;	       /* OPEN */
	bool picks_le, narrow; /* OPEN: the forms of picks asked for */
	const struct fz_set *set;
};

/* A paced batch the client asked for (LoadBatch). */
struct fz_load {
	uint64_t *picks; /* owned */
	uint32_t count;
	bool bad; /* to come back as an error batch */
};

struct fz_arena {
	const uint8_t *map; /* owned: the client's read-only mapping */
	uint64_t bytes;
};

struct fz_client {
	int fd; /* owned, -1: not connected */
	/* borrowed: the daemon's poll handle of this connection, until its
	 * close callback */
	uv_handle_t *peer;
	struct wire_rx rx;
	/* False once something left that the harness cannot model (raw
	 * bytes): only checks that need no model stay on. */
	bool modeled;
	/* Something left that the daemon closes the connection for. */
	bool may_close;
	bool hello_sent; /* a Hello with the right version */

	/* The session, from SessionOpened. */
	uint64_t session;
	const struct fz_set *set;
	uint32_t slots, batch_size, augment;
	bool drop_last;
	/* How its batches' picks must come: 4 (picks_le32: it asked narrow
	 * and augment x N fits 32 bits), 8 (picks_le) or 0 (varints); -1:
	 * not known (the open was not the harness's own request), any one
	 * form of them. */
	int picks_width;
	uint64_t slot_bytes;
	uint64_t field_off[FZ_MAX_FIELDS];
	struct fz_arena *arenas; /* owned */
	uint32_t narenas;

	/* The epoch, from EpochStarted. */
	uint64_t epoch;
	bool running;
	uint64_t start_batch, next_seq, nbatches;
	uint64_t *expect; /* owned: the share's picks */
	uint64_t nexpect;
	uint64_t next_ack;
	bool paced, paced_end;
	struct fz_load *loads; /* owned: paced batches 0 .. nbatches - 1 */
	size_t loads_cap;

	struct fz_held *held; /* owned: batches sent and not released */
	size_t nheld, held_cap;
	struct fz_req reqs[FZ_MAX_REQS];
	size_t nreqs;
	/* Errors of id 0 due: refusals of messages without an id (a made-up
	 * Release, an Ack or Probe without a session, a LoadBatch of no
	 * paced epoch). */
	unsigned refusals_due;
};

static struct fz_client clients[FZ_CLIENTS];
static uint64_t next_id;

static bool is_client_fd(int fd)
{
	for (int i = 0; i < FZ_CLIENTS; i++)
		if (clients[i].fd == fd)
			return true;
	return false;
}

/* The daemon's side of fd's connection has something to read. */
static void client_wrote(int fd)
{
	for (int i = 0; i < FZ_CLIENTS; i++) {
		struct fz_poll *p;

		if (clients[i].fd != fd || !clients[i].peer)
			continue;
		p = find_poll(clients[i].peer);
		if (p)
			p->readable = true;
	}
}

static void forget_peer(const uv_handle_t *h)
{
	for (int i = 0; i < FZ_CLIENTS; i++)
		if (clients[i].peer == h)
			clients[i].peer = NULL;
}

static void free_loads(struct fz_client *c)
{
	for (uint64_t i = 0; c->loads && i < c->nbatches; i++)
		free(c->loads[i].picks);
	free(c->loads);
	c->loads = NULL;
	c->loads_cap = 0;
}

static void client_reset(struct fz_client *c)
{
	free_loads(c);
	for (uint32_t a = 0; a < c->narenas; a++)
		munmap((void *)c->arenas[a].map, c->arenas[a].bytes);
	free(c->arenas);
	for (size_t i = 0; i < c->nheld; i++)
		free(c->held[i].picks);
	free(c->held);
	for (size_t i = 0; i < c->nreqs; i++)
		free(c->reqs[i].expect);
	free(c->expect);
	if (c->fd >= 0) {
		client_wrote(c->fd); /* the daemon reads the end */
		wire_rx_free(&c->rx);
		close(c->fd);
	}
	memset(c, 0, sizeof(*c));
	c->fd = -1;
}

static struct sess *daemon_sess(const struct fz_client *c)
{
	return c->session ? sess_find(&d, c->session) : NULL;
}

static void settle(void);
static void client_read(struct fz_client *c);

static void client_connect(struct fz_client *c)
{
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	struct fz_poll *listener;
	size_t before;

	client_reset(c);
	c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (c->fd < 0)
		die("socket: %s", strerror(errno));
	snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", d.cfg.socket_path);
	if (connect(c->fd, (struct sockaddr *)&addr, sizeof(addr)) < 0)
		die("connect: %s", strerror(errno));
	wire_rx_init(&c->rx, 0);
	c->modeled = true;
	/* The listener is readable: the daemon accepts, and the handle it
	 * makes is this connection's. */
	listener = find_poll(&d.listen_poll);
	if (!listener || !listener->active)
		die("the daemon does not listen");
	before = npolls;
	listener->cb((uv_poll_t *)listener->h, 0, UV_READABLE);
	if (npolls != before + 1)
		die("the daemon accepted %zu connection(s), not one", npolls - before);
	c->peer = polls[npolls - 1].h;
}

/* Writes buf whole, letting the daemon read when its socket is full. */
static void client_write(struct fz_client *c, const uint8_t *buf, size_t len)
{
	size_t off = 0;

	for (unsigned spins = 0; off < len && c->fd >= 0; spins++) {
		long n = wire_send_some(c->fd, buf + off, len - off, -1);

		if (n == -EAGAIN) {
			if (spins > 100000)
				die("the daemon stopped reading");
			turn();
			client_read(c);
			continue;
		}
		if (n < 0)
			return; /* the daemon closed it: client_read sees why */
		off += (size_t)n;
	}
}

static void client_send(struct fz_client *c, Pf__Envelope *env)
{
	uint8_t *frame;
	size_t len;

	if (wire_encode(env, &frame, &len))
		die("cannot encode a request");
	client_write(c, frame, len);
	free(frame);
}

/* Sends a request that must get exactly one reply (while modeled). */
static struct fz_req *client_request(struct fz_client *c, Pf__Envelope *env, enum fz_op op)
{
	static struct fz_req unmodeled;
	struct fz_req *r = &unmodeled;

	/* Replies to an unmodeled client are not matched to requests. */
	if (c->modeled) {
		if (c->nreqs == FZ_MAX_REQS)
			die("%zu requests without a reply", c->nreqs);
		r = &c->reqs[c->nreqs++];
	}
	memset(r, 0, sizeof(*r));
	r->id = ++next_id;
	r->op = op;
	env->id = r->id;
	return r;
}

static struct fz_req *find_req(struct fz_client *c, uint64_t id)
{
	for (size_t i = 0; i < c->nreqs; i++)
		if (c->reqs[i].id == id)
			return &c->reqs[i];
	return NULL;
}

static void drop_req(struct fz_client *c, struct fz_req *r)
{
	free(r->expect);
	*r = c->reqs[--c->nreqs];
}

static uint32_t batch_count(const struct fz_client *c, uint64_t seq)
{
	uint64_t left = c->nexpect - seq * c->batch_size;

	return left < c->batch_size ? (uint32_t)left : c->batch_size;
}

/* Every row of a batch in its slot is the row its pick names. */
static void check_rows(const struct fz_client *c, const struct fz_held *b, const char *when)
{
	const uint8_t *slot = c->arenas[b->arena].map + b->offset;

	for (size_t f = 0; f < c->set->nfields; f++) {
		const struct fz_field *fl = &c->set->fields[f];

		for (uint32_t k = 0; k < b->count; k++) {
			uint64_t row = b->picks[k] % FZ_ROWS;

			if (memcmp(slot + c->field_off[f] + k * fl->row_bytes,
				   fl->rows + row * fl->row_bytes, fl->row_bytes) != 0)
				die("%s: epoch %" PRIu64 " batch %" PRIu64 " slot %d: sample %u "
				    "of field %s is not row %" PRIu64,
				    when, b->epoch, b->seq, b->slot, k, fl->name, row);
		}
	}
}

/* ---- what the daemon sends ------------------------------------------------ */

static void on_opened(struct fz_client *c, const Pf__SessionOpened *m, struct fz_req *r)
{
	struct sess *s;
	uint64_t end = 0;

	st.opened++;
	if (r && r->expect_ok == FZ_REFUSE)
		die("a session was opened that must have been refused (%s)",
		    r->cuda ? "CUDA device, no GPU" : "bad request");
	if (c->session)
		die("a second SessionOpened on one connection");
	c->session = m->session;
	s = daemon_sess(c);
	if (!s) {
		c->modeled = false; /* gone already: the connection is closing */
		return;
	}
	for (size_t i = 0; i < FZ_NSETS; i++)
		if (strcmp(s->ds->name, sets[i].name) == 0)
			c->set = &sets[i];
	if (!c->set || c->set->broken)
		die("a session on dataset %s", s->ds->name);
	if (r && r->set != c->set)
		die("the session is on %s, not the dataset asked for", c->set->name);
	c->batch_size = s->batch_size;
	c->augment = s->augment;
	c->drop_last = s->drop_last;
	if (!r)
		c->picks_width = -1;
	else if (r->narrow && (uint64_t)FZ_ROWS * c->augment <= (1ull << 32))
		c->picks_width = 4;
	else
		c->picks_width = r->narrow || r->picks_le ? 8 : 0;
	c->slots = m->slots;
	c->slot_bytes = m->slot_bytes;
	if (m->num_samples != FZ_ROWS || m->n_fields != c->set->nfields || m->slots < 1 ||
	    m->target < 1 || m->target > m->slots || strcmp(m->device, "host") != 0)
		die("SessionOpened does not describe the session");
	for (size_t f = 0; f < m->n_fields; f++) {
		const Pf__Field *pf = m->fields[f];
		const struct fz_field *fd = &c->set->fields[f];

		if (strcmp(pf->name, fd->name) != 0 || pf->sample_bytes != fd->row_bytes ||
		    strcmp(pf->dtype, fd->descr + 1) != 0 || pf->n_shape != (size_t)fd->sample_ndim)
			die("field %zu of SessionOpened is not field %s", f, fd->name);
		/* Fields lie in order, apart, inside the slot. */
		if (pf->offset < end)
			die("field %s overlaps the one before it", fd->name);
		end = pf->offset + fd->row_bytes * c->batch_size;
		c->field_off[f] = pf->offset;
	}
	if (end > m->slot_bytes)
		die("the fields do not fit the %" PRIu64 "-byte slot", m->slot_bytes);
}

static void on_arena(struct fz_client *c, const Pf__Arena *m)
{
	int fd = wire_rx_take_fd(&c->rx);
	struct fz_arena *t;
	struct stat sb;
	void *map;

	if (fd < 0 || m->kind != PF__ARENA_KIND__ARENA_HOST_MEMFD || m->device != -1 || !c->session)
		die("arena %u: not a host memfd of this session (fd %d)", m->id, fd);
	if (m->id != c->narenas || m->bytes == 0)
		die("arena %u arrived as arena %u", m->id, c->narenas);
	if (fstat(fd, &sb) < 0 || (uint64_t)sb.st_size < m->bytes)
		die("arena %u is smaller than announced", m->id);
	/* The descriptor is read-only: the client cannot write the slots. */
	if (mmap(NULL, m->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) != MAP_FAILED)
		die("arena %u can be mapped writable by the client", m->id);
	map = mmap(NULL, m->bytes, PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	if (map == MAP_FAILED)
		die("cannot map arena %u: %s", m->id, strerror(errno));
	t = realloc(c->arenas, (c->narenas + 1) * sizeof(*t));
	if (!t)
		die("out of memory");
	c->arenas = t;
	c->arenas[c->narenas++] = (struct fz_arena){map, m->bytes};
}

static void on_started(struct fz_client *c, const Pf__EpochStarted *m, struct fz_req *r)
{
	st.started++;
	if (!r) {
		c->modeled = false; /* started by raw bytes */
		return;
	}
	if (r->expect_ok == FZ_REFUSE)
		die("epoch %" PRIu64 " started but must have been refused", r->epoch);
	if (m->epoch != r->epoch || m->samples != r->nexpect ||
	    m->batches != r->nbatches - r->start_batch)
		die("EpochStarted says epoch %" PRIu64 ", %" PRIu64 " samples, %" PRIu64
		    " batches; expected %" PRIu64 ", %" PRIu64 ", %" PRIu64,
		    m->epoch, m->samples, m->batches, r->epoch, r->nexpect,
		    r->nbatches - r->start_batch);
	free(c->expect);
	free_loads(c);
	c->paced = r->paced;
	c->paced_end = false;
	c->expect = r->expect;
	r->expect = NULL;
	c->nexpect = r->nexpect;
	c->epoch = r->epoch;
	c->nbatches = r->nbatches;
	c->start_batch = r->start_batch;
	c->next_seq = r->start_batch;
	c->next_ack = r->start_batch;
	c->running = true;
}

/* A batch that reads a row the truncation removed. */
static bool hits_cut(const struct fz_client *c, const uint64_t *picks, uint32_t count)
{
	for (uint32_t k = 0; c->set->cut && k < count; k++)
		if (picks[k] % FZ_ROWS >= c->set->cut)
			return true;
	return false;
}

/* A read found c's dataset changed on disk (daemon_dataset_changed). */
static bool set_changed(const struct fz_set *set)
{
	for (size_t i = 0; set && i < d.ndatasets; i++)
		if (strcmp(d.datasets[i]->name, set->name) == 0)
			return d.datasets[i]->changed[0] != '\0';
	return false;
}

/* The daemon ends c's epoch with error batch seq, its dataset having
 * changed on disk: nothing after it comes, paced requests after it go. */
static void end_changed_epoch(struct fz_client *c, uint64_t seq)
{
	if (c->paced) {
		for (uint64_t i = seq + 1; i < c->nbatches; i++)
			free(c->loads[i].picks);
		c->paced_end = true;
	}
	c->nbatches = seq + 1;
}

static void on_batch(struct fz_client *c, const Pf__BatchReady *m)
{
	struct fz_held b = {m->epoch, m->seq, m->slot, m->arena, m->offset, m->count, NULL};

	st.batches++;
	if (!c->session || !c->set)
		die("a batch without a session");
	if (m->slot < 0) {
		/* Error batches: a paced request that cannot be served
		 * (-EINVAL, -ERANGE), or, once a read past the cut found the
		 * file changed, -ESTALE naming it; never anything else. */
		bool ok = m->error == -EINVAL || m->error == -ERANGE ||
			  (m->error == -ESTALE && c->set->cut && set_changed(c->set) &&
			   strstr(m->message, ".npy changed on disk ("));

		if (c->modeled) {
			bool turn = m->epoch == c->epoch && c->running && m->seq == c->next_seq &&
				    m->seq < c->nbatches;

			if (!turn)
				ok = false;
			else if (m->error == -ESTALE)
				end_changed_epoch(c, m->seq); /* in place of whatever it was */
			else
				ok &= c->paced && c->loads[m->seq].bad;
		}
		if (!ok || !m->message[0])
			die("error batch %" PRIu64 "/%" PRIu64 ": %d %s", m->epoch, m->seq,
			    m->error, m->message);
		c->next_seq += c->modeled;
		return;
	}
	if ((uint32_t)m->slot >= c->slots || m->arena >= c->narenas || m->count == 0 ||
	    m->count > c->batch_size || m->offset > c->arenas[m->arena].bytes ||
	    c->arenas[m->arena].bytes - m->offset < c->slot_bytes)
		die("batch %" PRIu64 "/%" PRIu64 ": slot %d arena %u offset %" PRIu64
		    " count %u lies outside the session",
		    m->epoch, m->seq, m->slot, m->arena, m->offset, m->count);
	b.picks = malloc(sizeof(uint64_t) * m->count);
	if (!b.picks)
		die("out of memory");
	/* In the one form the client's OpenSession calls for, and no other. */
	if ((c->picks_width == 4 || c->picks_width < 0) &&
	    m->picks_le32.len == 4 * (size_t)m->count && !m->picks_le.len && !m->n_picks) {
		for (uint32_t k = 0; k < m->count; k++) {
			uint32_t v;

			memcpy(&v, m->picks_le32.data + 4 * (size_t)k, sizeof(v));
			b.picks[k] = le32toh(v);
		}
	} else if ((c->picks_width == 8 || c->picks_width < 0) &&
		   m->picks_le.len == 8 * (size_t)m->count && !m->picks_le32.len && !m->n_picks) {
		memcpy(b.picks, m->picks_le.data, m->picks_le.len);
	} else if (c->picks_width <= 0 && m->n_picks == m->count && !m->picks_le.len &&
		   !m->picks_le32.len) {
		memcpy(b.picks, m->picks, sizeof(uint64_t) * m->count);
	} else {
		die("batch with %u samples carries %zu varint picks, %zu bytes of picks_le and %zu "
		    "of picks_le32 for a client of %d-byte picks",
		    m->count, m->n_picks, m->picks_le.len, m->picks_le32.len, c->picks_width);
	}
	for (uint32_t k = 0; k < m->count; k++)
		if (b.picks[k] >= (uint64_t)FZ_ROWS * c->augment)
			die("pick %" PRIu64 " is outside the schedule", b.picks[k]);
	if (c->modeled) {
		if (m->epoch != c->epoch || !c->running || m->seq != c->next_seq ||
		    m->seq >= c->nbatches)
			die("batch %" PRIu64 "/%" PRIu64 " out of turn: expected %" PRIu64
			    "/%" PRIu64 "%s",
			    m->epoch, m->seq, c->epoch, c->next_seq,
			    c->running ? "" : " (no epoch running)");
		const uint64_t *want =
			c->paced ? c->loads[m->seq].picks : c->expect + m->seq * c->batch_size;
		uint32_t count = c->paced ? c->loads[m->seq].count : batch_count(c, m->seq);

		if ((c->paced && c->loads[m->seq].bad) || hits_cut(c, want, count))
			die("batch %" PRIu64 "/%" PRIu64 " was served but asks for what cannot be",
			    m->epoch, m->seq);
		if (m->count != count || memcmp(b.picks, want, sizeof(uint64_t) * count) != 0)
			die("batch %" PRIu64 "/%" PRIu64 " does not carry the picks of the order",
			    m->epoch, m->seq);
		for (size_t i = 0; i < c->nheld; i++)
			if (c->held[i].slot == m->slot)
				die("slot %d lent for batch %" PRIu64 "/%" PRIu64
				    " while still held by batch %" PRIu64 "/%" PRIu64,
				    m->slot, m->epoch, m->seq, c->held[i].epoch, c->held[i].seq);
		check_rows(c, &b, "on arrival");
		c->next_seq++;
	}
	if (c->nheld == c->held_cap) {
		c->held_cap = c->held_cap ? 2 * c->held_cap : 8;
		c->held = realloc(c->held, c->held_cap * sizeof(*c->held));
		if (!c->held)
			die("out of memory");
	}
	c->held[c->nheld++] = b;
	if (c->nheld > st.max_held)
		st.max_held = c->nheld;
}

static void on_end(struct fz_client *c, const Pf__EpochEnd *m)
{
	st.ends++;
	if (!c->modeled)
		return;
	if (m->epoch != c->epoch || !c->running || c->next_seq != c->nbatches ||
	    m->batches != c->nbatches - c->start_batch || (c->paced && !c->paced_end))
		die("EpochEnd %" PRIu64 " after %" PRIu64 " of %" PRIu64 " batches", m->epoch,
		    c->next_seq, c->nbatches);
	c->running = false;
}

/* Which replies answer which request. */
static bool answers(enum fz_op op, int msg_case)
{
	if (msg_case == PF__ENVELOPE__MSG_ERROR)
		return true;
	switch (op) {
	case FZ_HELLO: return msg_case == PF__ENVELOPE__MSG_HELLO_REPLY;
	case FZ_OPEN: return msg_case == PF__ENVELOPE__MSG_OPENED;
	case FZ_START: return msg_case == PF__ENVELOPE__MSG_STARTED;
	case FZ_ABANDON:
	case FZ_DEPTH: return msg_case == PF__ENVELOPE__MSG_OK;
	case FZ_STATUS: return msg_case == PF__ENVELOPE__MSG_STATUS_REPLY;
	case FZ_POOL: return msg_case == PF__ENVELOPE__MSG_POOL_REPLY;
	default: return false;
	}
}

static void on_message(struct fz_client *c, const Pf__Envelope *env)
{
	struct fz_req *r = env->id ? find_req(c, env->id) : NULL;

	if (env->id && !r && c->modeled)
		die("reply %s to request %" PRIu64 ", which was never sent",
		    wire_msg_name(env->msg_case), env->id);
	if (r && !answers(r->op, env->msg_case))
		die("%s does not answer request %" PRIu64, wire_msg_name(env->msg_case), r->id);
	switch (env->msg_case) {
	case PF__ENVELOPE__MSG_HELLO_REPLY:
		if (env->hello_reply->version != WIRE_VERSION ||
		    env->hello_reply->max_frame != d.cfg.max_frame)
			die("HelloReply: version %u, max_frame %u", env->hello_reply->version,
			    env->hello_reply->max_frame);
		break;
	case PF__ENVELOPE__MSG_OPENED: on_opened(c, env->opened, r); break;
	case PF__ENVELOPE__MSG_ARENA: on_arena(c, env->arena); break;
	case PF__ENVELOPE__MSG_STARTED: on_started(c, env->started, r); break;
	case PF__ENVELOPE__MSG_BATCH: on_batch(c, env->batch); break;
	case PF__ENVELOPE__MSG_END: on_end(c, env->end); break;
	case PF__ENVELOPE__MSG_STATUS_REPLY:
		if (env->status_reply->n_datasets != FZ_NSETS ||
		    env->status_reply->n_sessions != d.nsessions)
			die("status lists %zu datasets and %zu sessions, not %zu and %u",
			    env->status_reply->n_datasets, env->status_reply->n_sessions, FZ_NSETS,
			    d.nsessions);
		break;
	case PF__ENVELOPE__MSG_OK:
		if (r && r->op == FZ_ABANDON && r->epoch == c->epoch)
			c->running = false;
		if (r && r->expect_ok == FZ_REFUSE)
			die("request %" PRIu64 " was accepted but must have been refused", r->id);
		break;
	case PF__ENVELOPE__MSG_ERROR:
		if (env->error->code >= 0 || !env->error->message[0])
			die("Error with code %d and message \"%s\"", env->error->code,
			    env->error->message);
		if (!env->id && c->modeled) {
			if (!c->refusals_due)
				die("unasked refusal: %s", env->error->message);
			c->refusals_due--;
			st.refused_releases++;
		}
		if (r && r->op == FZ_OPEN)
			st.open_refused++;
		if (r && r->op == FZ_START)
			st.start_refused++;
		if (r && r->expect_ok == FZ_ACCEPT && c->modeled)
			die("request %" PRIu64 " (%d) was refused but must have been accepted: %s",
			    r->id, r->op, env->error->message);
		break;
	case PF__ENVELOPE__MSG_POOL_REPLY: die("a pool reply from a daemon without GPUs");
	default: die("the daemon sent %s, a client's message", wire_msg_name(env->msg_case));
	}
	if (r)
		drop_req(c, r);
}

/* Reads everything the daemon has sent c. */
static void client_read(struct fz_client *c)
{
	while (c->fd >= 0) {
		Pf__Envelope *env;
		long n = wire_rx_fill(&c->rx, c->fd);
		int rc;

		if (n == -EAGAIN)
			return;
		if (n == -EMFILE || n == -EPROTO)
			die("the daemon sent too many descriptors");
		while ((rc = wire_rx_next(&c->rx, &env)) == 1) {
			on_message(c, env);
			pf__envelope__free_unpacked(env, NULL);
		}
		if (rc < 0)
			die("the daemon sent a frame that does not decode (%d)", rc);
		if (n <= 0) {
			/* EOF or a reset: the daemon closed the connection. */
			if (!c->may_close)
				die("the daemon closed a connection that gave no reason (%s)",
				    n ? strerror((int)-n) : "EOF");
			st.daemon_closes++;
			client_reset(c);
			return;
		}
	}
}

/* ---- the daemon side ------------------------------------------------------- */

/* What the pump leaves behind once it has run (after every event that can
 * unblock it): no complete batch whose turn has come still waits, no fill
 * the governor allows waits while a slot is free, and an epoch whose every
 * batch went out has ended.  Without these, a trainer waits forever. */
static void check_pumped(const struct sess *s)
{
	bool free_slot = false;

	if (s->dead || !s->peer || ((const struct conn *)s->peer->conn)->closing || !s->running ||
	    s->gpu >= 0 || peer_busy(s->peer) || s->pump_later)
		return;
	for (uint32_t i = 0; i < s->nslots; i++) {
		const struct slot *sl = &s->slots[i];

		if (sl->state == SLOT_READY && sl->epoch == s->epoch && sl->seq == s->next_send)
			die("session %" PRIu64 ": batch %" PRIu64 " is complete and its turn has "
			    "come, but it was not sent",
			    s->id, sl->seq);
		free_slot |= sl->state == SLOT_FREE && sl->present;
	}
	/* An order still building fills nothing until it is back. */
	if (!s->building && s->next_fill < s->nbatches && gov_may_fill(&s->gov) && free_slot)
		die("session %" PRIu64 ": batch %" PRIu64 " may be filled and a slot is free, but "
		    "no read started",
		    s->id, s->next_fill);
	if (s->next_send == s->nbatches && (!s->paced || s->paced_end))
		die("session %" PRIu64 ": every batch of epoch %" PRIu64 " went out, but it has "
		    "not ended",
		    s->id, s->epoch);
}

/* What the harness knows of the daemon's connections, for a failure's
 * message: each one's peer text, state, poll entry, the client that drives
 * it, and what the kernel says of its socket (readable, peer gone). */
static const char *describe_conns(void)
{
	static char buf[2048];
	size_t len = 0;

	buf[0] = '\0';
	for (struct conn *c = d.conns; c && len < sizeof(buf) - 200; c = c->next) {
		const struct fz_poll *p = find_poll(&c->poll);
		struct pollfd k = {.fd = c->fd, .events = POLLIN | POLLRDHUP};
		int owner = -1;

		for (int i = 0; i < FZ_CLIENTS; i++)
			if (clients[i].peer == (uv_handle_t *)&c->poll)
				owner = i;
		if (poll(&k, 1, 0) < 0)
			k.revents = -1;
		len += (size_t)snprintf(
			buf + len, sizeof(buf) - len,
			"; conn fd %d (%s)%s%s, poll %s events %d%s, client %d, kernel revents %#x",
			c->fd, c->peer.name, c->closing ? " closing" : "",
			c->out_head ? " output queued" : "",
			!p	    ? "gone"
			: p->active ? "active"
				    : "stopped",
			p ? p->events : 0, p && p->readable ? " readable" : "", owner, k.revents);
	}
	return buf;
}

/* After settling, every connected client drives exactly one open
 * connection whose poll handle the harness still turns: else the client's
 * writes (and its hang-up at the end of the script) reach nothing.  With
 * quiet()'s count, every open connection then has its client. */
static void check_peers(void)
{
	for (int i = 0; i < FZ_CLIENTS; i++) {
		const struct fz_client *c = &clients[i];
		const struct fz_poll *p;

		if (c->fd < 0)
			continue;
		p = c->peer ? find_poll(c->peer) : NULL;
		if (!p || !p->active)
			die("client %d (fd %d) drives no open connection (peer %p %s)%s", i, c->fd,
			    (const void *)c->peer,
			    !c->peer ? "none"
			    : !p     ? "not polled"
				     : "stopped",
			    describe_conns());
		for (int k = 0; k < i; k++)
			if (clients[k].fd >= 0 && clients[k].peer == c->peer)
				die("clients %d and %d drive one connection%s", k, i,
				    describe_conns());
	}
}

static void check_daemon(void)
{
	unsigned n = 0;

	check_peers();

	for (struct sess *s = d.sessions; s; s = s->next, n++) {
		if (!sess_check(s))
			die("sess_check fails for session %" PRIu64, s->id);
		check_pumped(s);
		/* sess_open: "never below min_depth + 1" slots, so that the
		 * governor's smallest target fits next to a held batch. */
		if (s->nslots < (uint64_t)s->gov.min_depth + 1)
			die("session %" PRIu64 " has %u slots for min_depth %u", s->id, s->nslots,
			    s->gov.min_depth);
	}
	if (n != d.nsessions)
		die("%u sessions listed, %u counted", n, d.nsessions);
}

static bool quiet(void)
{
	unsigned connected = 0, n = 0;

	for (int i = 0; i < FZ_CLIENTS; i++)
		connected += clients[i].fd >= 0;
	for (struct conn *c = d.conns; c; c = c->next, n++)
		if (c->closing || c->out_head)
			return false;
	return n == connected && n == d.nconns;
}

/* Turns the loop and reads the clients until nothing moves. */
static void settle(void)
{
	for (int i = 0; i < 1000; i++) {
		bool moved = turn();

		if (daemon_wrote) {
			daemon_wrote = false;
			moved = true;
			for (int k = 0; k < FZ_CLIENTS; k++)
				client_read(&clients[k]);
		}
		if (!moved) {
			if (!quiet())
				die("the daemon stopped with work left (output queued, or a "
				    "connection neither open nor gone)");
			check_daemon();
			return;
		}
	}
	die("the daemon did not settle");
}

/* Runs pending reader job i on this thread and hands it back, as a reader
 * thread and the loop's async callback would. */
static void complete_job(size_t i)
{
	struct reader_job *job = jobs[i];

	memmove(jobs + i, jobs + i + 1, (njobs - i - 1) * sizeof(*jobs));
	njobs--;
	reader_run_job(job);
	if (job->rc &&
	    (job->rc != -ESTALE || !strstr(job->err, ".npy changed on disk (") ||
	     !(strcmp(job->ds->name, "cut") == 0 || strcmp(job->ds->name, "cutmap") == 0)))
		die("reader job of batch %" PRIu64 "/%" PRIu64 " failed: %d %s", job->epoch,
		    job->seq, job->rc, job->err);
	st.jobs_run++;
	sess_job_done(job, &d);
}

static void complete_work(size_t i)
{
	struct fz_work w = works[i];

	memmove(works + i, works + i + 1, (nworks - i - 1) * sizeof(*works));
	nworks--;
	st.ahead_run++;
	w.work_cb(w.req);
	w.after_cb(w.req, 0);
}

/* ---- actions ---------------------------------------------------------------- */

static uint64_t pick_epoch(struct fz_client *c, struct script *in)
{
	uint8_t b = next_u8(in);

	if (b < 200)
		return c->epoch;
	if (b < 230)
		return c->epoch - 1;
	return next_u64(in);
}

static uint32_t pick_depth(struct script *in)
{
	static const uint32_t big[] = FZ_BIG_DEPTHS;
	uint8_t b = next_u8(in);

	if (b < 240)
		return b % 20;
	return big[(b - 240) % (sizeof(big) / sizeof(big[0]))];
}

static void fill_name(char *buf, size_t cap, struct script *in)
{
	size_t n = next_u8(in) % cap;

	for (size_t i = 0; i < n; i++) {
		uint8_t ch = next_u8(in);

		buf[i] = ch ? (char)ch : '_';
	}
	buf[n] = '\0';
}

/* Something went out that the daemon answers with an Error of id 0 (a
 * message without an id: Ack, Release, Probe), or closes for. */
static void expect_unasked_refusal(struct fz_client *c)
{
	if (!c->hello_sent)
		c->may_close = true;
	c->refusals_due++;
}

static void do_hello(struct fz_client *c, struct script *in)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__Hello msg = PF__HELLO__INIT;
	uint8_t v = next_u8(in);
	struct fz_req *r;
	char name[48];

	msg.version = v < 240 ? WIRE_VERSION : v - 240u;
	fill_name(name, sizeof(name), in);
	msg.client = name;
	env.msg_case = PF__ENVELOPE__MSG_HELLO;
	env.hello = &msg;
	r = client_request(c, &env, FZ_HELLO);
	/* A second Hello is refused (it needs a session, or is unexpected in
	 * one); a wrong version ends the connection. */
	if (c->hello_sent || msg.version != WIRE_VERSION) {
		r->expect_ok = FZ_REFUSE;
		c->may_close = true;
	} else {
		r->expect_ok = FZ_ACCEPT;
		c->hello_sent = true;
	}
	client_send(c, &env);
}

/* The bytes of a slot: at least the batch's rows, at most those plus the
 * alignment the daemon may add (256 per field, 4096 per slot). */
static void slot_bounds(const struct fz_set *set, uint32_t batch, uint64_t *lo, uint64_t *hi)
{
	*lo = 0;
	for (size_t f = 0; f < set->nfields; f++)
		*lo += set->fields[f].row_bytes * batch;
	*hi = *lo + 256 * set->nfields + 4096;
}

static void do_open(struct fz_client *c, struct script *in)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__OpenSession msg = PF__OPEN_SESSION__INIT;
	unsigned set = next_u8(in) % FZ_NDATASETS;
	const char *device = devices[next_u8(in) % FZ_NDEVICES];
	uint8_t b = next_u8(in), flags;
	char name[80];
	struct fz_req *r;

	msg.dataset = (char *)set_name(set);
	msg.device = (char *)device;
	msg.batch_size = b < 200   ? b % 17u
			 : b < 240 ? 17u + 4u * (b - 200u)
				   : (uint32_t)next_u64(in);
	flags = next_u8(in);
	msg.drop_last = flags & 1;
	msg.ipc = (Pf__Ipc)((flags >> 1) & 3);
	if (flags & 8)
		msg.pci_bus_id = "0000:3b:00.0";
	msg.picks_le = flags & 16;
	msg.narrow = flags & 32;
	b = next_u8(in);
	/* The daemon refuses an order above max_epoch_picks (FZ_AUGMENT_MAX
	 * times N here): small ones, the edge, and any 32-bit value. */
	msg.augment = b < 240	? b % 9u
		      : b < 248 ? FZ_AUGMENT_MAX - 3u + (b - 240u)
				: (uint32_t)next_u64(in);
	msg.min_depth = pick_depth(in);
	msg.max_depth = pick_depth(in);
	fill_name(name, sizeof(name), in);
	msg.name = name;
	env.msg_case = PF__ENVELOPE__MSG_OPEN;
	env.open = &msg;
	r = client_request(c, &env, FZ_OPEN);
	r->cuda = strncmp(device, "cuda", 4) == 0;
	r->picks_le = msg.picks_le;
	r->narrow = msg.narrow;
	r->set = set < FZ_NSETS ? &sets[set] : NULL;
	r->expect_ok = FZ_REFUSE;
	if (c->hello_sent && !c->session && r->set && !r->set->broken && !set_changed(r->set) &&
	    msg.batch_size > 0 && (!device[0] || strcmp(device, "host") == 0) &&
	    d.nsessions < d.cfg.max_sessions && (msg.augment ? msg.augment : 1) <= FZ_AUGMENT_MAX &&
	    (msg.max_depth ? msg.max_depth : d.cfg.max_depth) <= d.cfg.depth_limit) {
		uint64_t min = msg.min_depth ? msg.min_depth : 1;
		uint64_t max = msg.max_depth ? msg.max_depth : d.cfg.max_depth;
		uint64_t lo, hi;

		/* Refused: inverted bounds, or not even min_depth + 1 slots in
		 * session_bytes.  Near that edge the slot's rounding decides. */
		slot_bounds(r->set, msg.batch_size, &lo, &hi);
		if (min > max || (min + 1) * lo > d.cfg.session_bytes)
			r->expect_ok = FZ_REFUSE;
		else if ((min + 1) * hi <= d.cfg.session_bytes)
			r->expect_ok = FZ_ACCEPT;
		else
			r->expect_ok = FZ_EITHER;
	}
	if (!c->hello_sent)
		c->may_close = true;
	client_send(c, &env);
}

/* The share StartEpoch gives, computed from the order specification in
 * order.h, independently of order_build (the shuffle itself excepted: its
 * known vectors are test_order's). */
static void predict_start(struct fz_client *c, struct fz_req *r, const Pf__StartEpoch *m)
{
	struct sess *s = daemon_sess(c);
	uint64_t space, len, world = m->world ? m->world : 1, *list = NULL;

	r->expect_ok = FZ_REFUSE;
	if (!c->hello_sent || !s || !c->modeled)
		return;
	if ((s->had_epoch && m->epoch <= s->epoch) || (unsigned)m->order > 3 || s->ds->changed[0])
		return;
	if (m->order == PF__ORDER__ORDER_PACED) {
		/* No order: the client sends each batch (LoadBatch). */
		if (m->start_batch || m->n_indices || m->world > 1)
			return;
		r->expect_ok = FZ_ACCEPT;
		r->paced = true;
		r->epoch = m->epoch;
		return;
	}
	if (m->rank >= world)
		return;
	space = (uint64_t)FZ_ROWS * s->augment;
	if (m->order == PF__ORDER__ORDER_EXPLICIT) {
		if (!m->n_indices)
			return;
		for (size_t i = 0; i < m->n_indices; i++)
			if (m->indices[i] >= space)
				return;
		len = m->n_indices;
	} else {
		len = space;
	}
	r->nexpect = (len + world - 1) / world;
	r->nbatches = s->drop_last ? r->nexpect / s->batch_size
				   : (r->nexpect + s->batch_size - 1) / s->batch_size;
	if (m->start_batch > r->nbatches)
		return;
	r->expect_ok = FZ_ACCEPT;
	r->epoch = m->epoch;
	r->start_batch = m->start_batch;
	r->expect = malloc(sizeof(uint64_t) * (r->nexpect ? r->nexpect : 1));
	if (m->order == PF__ORDER__ORDER_SHUFFLE) {
		list = malloc(sizeof(uint64_t) * len);
		if (list)
			order_shuffle(list, len, m->seed);
	}
	if (!r->expect || (m->order == PF__ORDER__ORDER_SHUFFLE && !list))
		die("out of memory");
	/* DistributedSampler: rank r takes r, r + world, ... of the list
	 * padded by cycling from its head. */
	for (uint64_t k = 0; k < r->nexpect; k++) {
		uint64_t p = (m->rank + k * world) % len;

		r->expect[k] = m->order == PF__ORDER__ORDER_SEQUENTIAL ? p
			       : m->order == PF__ORDER__ORDER_SHUFFLE  ? list[p]
								       : m->indices[p];
	}
	free(list);
}

static void do_start(struct fz_client *c, struct script *in)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__StartEpoch msg = PF__START_EPOCH__INIT;
	uint64_t indices[32];
	uint8_t b = next_u8(in);
	struct fz_req *r;

	msg.epoch = b < 200 ? c->epoch + 1 : b < 220 ? c->epoch : b < 240 ? 0 : next_u64(in);
	b = next_u8(in);
	msg.order = (Pf__Order)(b < 240 ? b % 4 : b);
	b = next_u8(in);
	msg.seed = b < 255 ? b : next_u64(in);
	msg.world = next_u8(in) % 5;
	msg.rank = next_u8(in) % 6;
	b = next_u8(in);
	msg.start_batch = b < 240 ? b % 6 : next_u64(in);
	msg.n_indices = next_u8(in) % 33;
	for (size_t i = 0; i < msg.n_indices; i++) {
		b = next_u8(in);
		indices[i] = b < 250 ? b : next_u64(in);
	}
	msg.indices = indices;
	env.msg_case = PF__ENVELOPE__MSG_START;
	env.start = &msg;
	r = client_request(c, &env, FZ_START);
	predict_start(c, r, &msg);
	if (!c->modeled && r->expect_ok == FZ_REFUSE)
		r->expect_ok = FZ_EITHER;
	if (!c->hello_sent)
		c->may_close = true;
	client_send(c, &env);
}

static void do_ack(struct fz_client *c, struct script *in)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__Ack msg = PF__ACK__INIT;
	uint8_t b;

	msg.epoch = pick_epoch(c, in);
	b = next_u8(in);
	msg.seq = b < 250 ? c->next_ack++ : next_u64(in);
	b = next_u8(in);
	if (b < 250) {
		msg.wait_s = b / 10.0;
		msg.busy_s = b / 5.0;
	} else {
		uint64_t bits = next_u64(in);

		memcpy(&msg.wait_s, &bits, sizeof(bits)); /* NaN and infinities too */
		msg.busy_s = -msg.wait_s;
	}
	env.msg_case = PF__ENVELOPE__MSG_ACK;
	env.ack = &msg;
	if (!c->session)
		expect_unasked_refusal(c);
	client_send(c, &env);
}

static void send_release(struct fz_client *c, uint64_t epoch, uint64_t seq, int32_t slot)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__Release msg = PF__RELEASE__INIT;

	msg.epoch = epoch;
	msg.seq = seq;
	msg.slot = slot;
	env.msg_case = PF__ENVELOPE__MSG_RELEASE;
	env.release = &msg;
	client_send(c, &env);
}

/* Gives held batch k back, after checking that its slot was not touched
 * while the client held it. */
static void release_held(struct fz_client *c, size_t k)
{
	struct fz_held b = c->held[k];

	if (c->modeled)
		check_rows(c, &b, "at release");
	c->held[k] = c->held[--c->nheld];
	st.released++;
	send_release(c, b.epoch, b.seq, b.slot);
	free(b.picks);
}

static bool do_release(struct fz_client *c, struct script *in)
{
	uint8_t k = next_u8(in);

	if (!c->nheld)
		return false;
	release_held(c, k % c->nheld);
	return true;
}

static void do_release_any(struct fz_client *c, struct script *in)
{
	int32_t slot = (int8_t)next_u8(in);
	uint8_t b = next_u8(in);
	uint64_t epoch = b < 250 ? c->epoch : next_u64(in), seq;

	b = next_u8(in);
	seq = b < 250 ? b : next_u64(in);
	for (size_t k = 0; k < c->nheld; k++) {
		if (c->held[k].slot == slot && c->held[k].epoch == epoch && c->held[k].seq == seq) {
			release_held(c, k); /* made up, but right */
			return;
		}
	}
	expect_unasked_refusal(c);
	send_release(c, epoch, seq, slot);
}

static void do_abandon(struct fz_client *c, struct script *in)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__Abandon msg = PF__ABANDON__INIT;
	struct fz_req *r;

	msg.epoch = pick_epoch(c, in);
	env.msg_case = PF__ENVELOPE__MSG_ABANDON;
	env.abandon = &msg;
	r = client_request(c, &env, FZ_ABANDON);
	r->epoch = msg.epoch;
	r->expect_ok = c->hello_sent && c->session ? FZ_ACCEPT : FZ_REFUSE;
	if (!c->hello_sent)
		c->may_close = true;
	client_send(c, &env);
}

static void do_probe(struct fz_client *c, struct script *in)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__Probe msg = PF__PROBE__INIT;
	uint8_t b = next_u8(in);

	msg.free_bytes = b < 255 ? (uint64_t)b << 28 : next_u64(in);
	b = next_u8(in);
	msg.total_bytes = b < 255 ? (uint64_t)b << 28 : next_u64(in);
	env.msg_case = PF__ENVELOPE__MSG_PROBE;
	env.probe = &msg;
	if (!c->session)
		expect_unasked_refusal(c);
	client_send(c, &env);
}

static void do_depth(struct fz_client *c, struct script *in)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__SetDepth msg = PF__SET_DEPTH__INIT;
	uint8_t who = next_u8(in) % 4, b;
	const struct fz_client *other = &clients[(c - clients + 1) % FZ_CLIENTS];
	struct fz_req *r;
	bool found;

	msg.session = who == 0	 ? 0
		      : who == 1 ? c->session
		      : who == 2 ? other->session
				 : next_u64(in);
	b = next_u8(in);
	msg.target = b < 240 ? b % 20u : (uint32_t)next_u64(in);
	msg.automatic = next_u8(in) & 1;
	env.msg_case = PF__ENVELOPE__MSG_SET_DEPTH;
	env.set_depth = &msg;
	r = client_request(c, &env, FZ_DEPTH);
	/* Every client has the harness's uid, so only existence matters;
	 * session 0 is the caller's own. */
	found = msg.session ? sess_find(&d, msg.session) != NULL : daemon_sess(c) != NULL;
	r->expect_ok = c->hello_sent && found ? FZ_ACCEPT : FZ_REFUSE;
	if (!c->hello_sent)
		c->may_close = true;
	client_send(c, &env);
}

static void do_status(struct fz_client *c)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__StatusRequest msg = PF__STATUS_REQUEST__INIT;
	struct fz_req *r;

	env.msg_case = PF__ENVELOPE__MSG_STATUS;
	env.status = &msg;
	r = client_request(c, &env, FZ_STATUS);
	r->expect_ok = c->hello_sent ? FZ_ACCEPT : FZ_REFUSE;
	if (!c->hello_sent)
		c->may_close = true;
	client_send(c, &env);
}

static void do_pool(struct fz_client *c, struct script *in)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__PoolControl msg = PF__POOL_CONTROL__INIT;
	struct fz_req *r;
	uint8_t b;

	msg.dataset = (char *)set_name(next_u8(in));
	b = next_u8(in);
	msg.action = (Pf__PoolAction)(b < 240 ? b % 3 : b);
	env.msg_case = PF__ENVELOPE__MSG_POOL;
	env.pool = &msg;
	r = client_request(c, &env, FZ_POOL);
	r->expect_ok = FZ_REFUSE; /* no GPU, so no pool */
	if (!c->hello_sent)
		c->may_close = true;
	client_send(c, &env);
}

/* A message only the daemon sends, with every field at its default. */
static void do_unexpected(struct fz_client *c, struct script *in)
{
	static const int cases[] = {
		PF__ENVELOPE__MSG_HELLO_REPLY,	PF__ENVELOPE__MSG_OPENED,
		PF__ENVELOPE__MSG_ARENA,	PF__ENVELOPE__MSG_STARTED,
		PF__ENVELOPE__MSG_BATCH,	PF__ENVELOPE__MSG_END,
		PF__ENVELOPE__MSG_STATUS_REPLY, PF__ENVELOPE__MSG_POOL_REPLY,
		PF__ENVELOPE__MSG_OK,		PF__ENVELOPE__MSG_ERROR,
	};
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__HelloReply hello_reply = PF__HELLO_REPLY__INIT;
	Pf__SessionOpened opened = PF__SESSION_OPENED__INIT;
	Pf__Arena arena = PF__ARENA__INIT;
	Pf__EpochStarted started = PF__EPOCH_STARTED__INIT;
	Pf__BatchReady batch = PF__BATCH_READY__INIT;
	Pf__EpochEnd end = PF__EPOCH_END__INIT;
	Pf__StatusReply status_reply = PF__STATUS_REPLY__INIT;
	Pf__PoolControlReply pool_reply = PF__POOL_CONTROL_REPLY__INIT;
	Pf__Ok ok = PF__OK__INIT;
	Pf__Error error = PF__ERROR__INIT;
	struct fz_req *r;

	env.msg_case = (Pf__Envelope__MsgCase)cases[next_u8(in) % 10];
	switch (env.msg_case) {
	case PF__ENVELOPE__MSG_HELLO_REPLY: env.hello_reply = &hello_reply; break;
	case PF__ENVELOPE__MSG_OPENED: env.opened = &opened; break;
	case PF__ENVELOPE__MSG_ARENA: env.arena = &arena; break;
	case PF__ENVELOPE__MSG_STARTED: env.started = &started; break;
	case PF__ENVELOPE__MSG_BATCH: env.batch = &batch; break;
	case PF__ENVELOPE__MSG_END: env.end = &end; break;
	case PF__ENVELOPE__MSG_STATUS_REPLY: env.status_reply = &status_reply; break;
	case PF__ENVELOPE__MSG_POOL_REPLY: env.pool_reply = &pool_reply; break;
	case PF__ENVELOPE__MSG_OK: env.ok = &ok; break;
	default: env.error = &error; break;
	}
	r = client_request(c, &env, FZ_UNEXPECTED);
	r->expect_ok = FZ_REFUSE;
	c->may_close = true;
	client_send(c, &env);
}

static void do_raw(struct fz_client *c, struct script *in)
{
	size_t n = next_u8(in);

	if (n > in->n)
		n = in->n;
	c->modeled = false;
	c->may_close = true;
	client_write(c, in->p, n);
	in->p += n;
	in->n -= n;
}

static void do_close(struct fz_client *c, unsigned mode)
{
	if (mode == 1) {
		/* Half of a StartEpoch: the daemon holds a partial frame. */
		Pf__Envelope env = PF__ENVELOPE__INIT;
		Pf__StartEpoch msg = PF__START_EPOCH__INIT;
		uint8_t *frame;
		size_t len;

		msg.epoch = c->epoch + 1;
		env.msg_case = PF__ENVELOPE__MSG_START;
		env.start = &msg;
		if (wire_encode(&env, &frame, &len))
			die("cannot encode a request");
		client_write(c, frame, len / 2);
		free(frame);
	}
	if (mode == 3 && c->fd >= 0) {
		/* A Status request carrying one end of a socket pair, whose
		 * other end has data the first end never read: the daemon
		 * must keep no client descriptor, close it off its loop, and
		 * end the connection. */
		Pf__Envelope env = PF__ENVELOPE__INIT;
		Pf__StatusRequest req = PF__STATUS_REQUEST__INIT;
		uint8_t *frame;
		size_t len;
		int sv[2];

		env.msg_case = PF__ENVELOPE__MSG_STATUS;
		env.status = &req;
		if (wire_encode(&env, &frame, &len) ||
		    socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
			die("cannot make a request with a descriptor");
		if (write(sv[1], "unread", 6) != 6)
			die("cannot fill the socket pair");
		c->modeled = false;
		c->may_close = true;
		if (wire_send_some(c->fd, frame, len, sv[0]) != (long)len)
			die("cannot send a request with a descriptor");
		close(sv[0]);
		close(sv[1]);
		free(frame);
		st.fds_sent++;
		client_wrote(c->fd);
		settle();
		return;
	}
	if (mode == 2 && c->fd >= 0) {
		/* The daemon sees EOF and closes its side first. */
		c->may_close = true;
		shutdown(c->fd, SHUT_WR);
		client_wrote(c->fd);
		settle();
		return;
	}
	client_reset(c);
}

static bool do_complete(struct script *in)
{
	uint8_t b = next_u8(in);
	bool ran = njobs > 0;

	if (b == 255) {
		while (njobs)
			complete_job(0);
		return ran;
	}
	/* Every index byte is read, jobs or not, so that a script's later
	 * actions do not shift with the number of jobs pending. */
	for (unsigned k = 0; k <= b % 4u; k++) {
		uint8_t i = next_u8(in);

		if (njobs)
			complete_job(i % njobs);
	}
	return ran;
}

static void do_load(struct fz_client *c, struct script *in)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__LoadBatch msg = PF__LOAD_BATCH__INIT;
	uint64_t picks[24];
	uint8_t b;
	bool bad;

	msg.epoch = pick_epoch(c, in);
	msg.end = next_u8(in) % 8 == 7;
	msg.n_picks = next_u8(in) % 24;
	for (size_t i = 0; i < msg.n_picks; i++) {
		b = next_u8(in);
		picks[i] = b < 250 ? b : next_u64(in);
	}
	msg.picks = picks;
	env.msg_case = PF__ENVELOPE__MSG_LOAD;
	env.load = &msg;
	/* Refused outright: no paced epoch of that id running, or one whose
	 * end was sent, or SESS_PACED_MAX requests waiting, or a dataset
	 * changed on disk. */
	if (!c->session || !c->paced || msg.epoch != c->epoch || !c->running || c->paced_end ||
	    (!msg.end && c->nbatches - c->next_seq >= SESS_PACED_MAX) || set_changed(c->set)) {
		expect_unasked_refusal(c);
	} else if (msg.end) {
		c->paced_end = true;
	} else {
		struct fz_load *l;

		bad = msg.n_picks == 0 || msg.n_picks > c->batch_size;
		for (size_t i = 0; i < msg.n_picks; i++)
			bad |= picks[i] >= (uint64_t)FZ_ROWS * c->augment;
		if (c->nbatches == c->loads_cap) {
			c->loads_cap = c->loads_cap ? 2 * c->loads_cap : 16;
			c->loads = realloc(c->loads, c->loads_cap * sizeof(*c->loads));
			if (!c->loads)
				die("out of memory");
		}
		l = &c->loads[c->nbatches++];
		l->count = (uint32_t)(msg.n_picks < c->batch_size ? msg.n_picks : c->batch_size);
		l->bad = bad;
		l->picks = malloc(sizeof(uint64_t) * (l->count ? l->count : 1));
		if (!l->picks)
			die("out of memory");
		memcpy(l->picks, picks, sizeof(uint64_t) * l->count);
	}
	client_send(c, &env);
}

/* Connects c when it is not, and says Hello unless told not to. */
static void ensure_connected(struct fz_client *c, bool no_hello)
{
	struct fz_req *r;
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__Hello msg = PF__HELLO__INIT;

	if (c->fd >= 0)
		return;
	client_connect(c);
	settle();
	if (no_hello)
		return;
	msg.version = WIRE_VERSION;
	msg.client = "fuzz_sess";
	env.msg_case = PF__ENVELOPE__MSG_HELLO;
	env.hello = &msg;
	r = client_request(c, &env, FZ_HELLO);
	r->expect_ok = FZ_ACCEPT;
	c->hello_sent = true;
	client_send(c, &env);
	settle();
}

/* Does one action; returns whether it did anything (else nothing needs
 * settling). */
static bool act(struct fz_client *c, enum fz_op op, bool no_hello, struct script *in)
{
	switch (op) {
	case FZ_COMPLETE: return do_complete(in);
	case FZ_AHEAD: {
		uint8_t i = next_u8(in);

		if (!nworks)
			return false;
		complete_work(i % nworks);
		return true;
	}
	case FZ_CLOSE: {
		uint8_t mode = next_u8(in);

		if (c->fd < 0)
			return false;
		do_close(c, mode % 4);
		return true;
	}
	default: break;
	}
	ensure_connected(c, no_hello);
	if (c->fd < 0)
		return false;
	switch (op) {
	case FZ_HELLO: do_hello(c, in); break;
	case FZ_OPEN: do_open(c, in); break;
	case FZ_START: do_start(c, in); break;
	case FZ_ACK: do_ack(c, in); break;
	case FZ_RELEASE: return do_release(c, in);
	case FZ_RELEASE_ANY: do_release_any(c, in); break;
	case FZ_ABANDON: do_abandon(c, in); break;
	case FZ_PROBE: do_probe(c, in); break;
	case FZ_DEPTH: do_depth(c, in); break;
	case FZ_STATUS: do_status(c); break;
	case FZ_POOL: do_pool(c, in); break;
	case FZ_UNEXPECTED: do_unexpected(c, in); break;
	case FZ_RAW: do_raw(c, in); break;
	case FZ_LOAD: do_load(c, in); break;
	default: break;
	}
	return true;
}

/* After settling, a modeled client has its answers. */
static void check_answered(const struct fz_client *c)
{
	if (c->fd < 0 || !c->modeled)
		return;
	if (c->nreqs)
		die("request %" PRIu64 " (op %d) got no reply", c->reqs[0].id, c->reqs[0].op);
	if (c->refusals_due)
		die("%u made-up message(s) were not refused", c->refusals_due);
}

/* Every client leaves; every job comes back; nothing may remain. */
static void end_script(void)
{
	int fd;

	for (int i = 0; i < FZ_CLIENTS; i++)
		client_reset(&clients[i]);
	for (int i = 0; i < 1000 && (d.nconns || ncloses); i++)
		turn();
	if (d.nconns)
		die("%u connection(s) outlived their clients%s", d.nconns, describe_conns());
	/* Descriptors clients sent are closed on the closer's thread. */
	for (int i = 0; i < 10000 && closer_pending(); i++)
		usleep(100);
	if (closer_pending())
		die("%u descriptor(s) a client sent were not closed", closer_pending());
	while (njobs || nworks) {
		if (njobs)
			complete_job(0);
		else
			complete_work(0);
	}
	if (d.nsessions || d.sessions)
		die("%u session(s) outlived their connections", d.nsessions);
	/* Nothing of this script may reach the next one, where a failure
	 * would depend on what ran before and not replay alone: the harness
	 * turns only the listener, and no session holds a dataset.  (Pools
	 * come from CUDA sessions, datasets retire on a reload: neither
	 * happens here.) */
	if (npolls != 1 || polls[0].h != (uv_handle_t *)&d.listen_poll || !polls[0].active ||
	    ncloses)
		die("the harness still turns %zu poll handle(s) (%zu closing), not the listener "
		    "alone%s",
		    npolls, ncloses, describe_conns());
	for (size_t i = 0; i < d.ndatasets; i++)
		if (d.datasets[i]->users)
			die("dataset %s is still held by %u session(s)", d.datasets[i]->name,
			    d.datasets[i]->users);
	fd = dup(STDERR_FILENO);
	if (fd != fd_baseline)
		die("descriptor leak: the lowest free descriptor is %d, was %d", fd, fd_baseline);
	close(fd);
	d.next_session_id = 0;
	next_id = 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct script in = {data, size};

	/* The lowest free descriptor now (libFuzzer opens its own between
	 * inputs): end_script finds it free again, or something leaked. */
	fd_baseline = dup(STDERR_FILENO);
	close(fd_baseline);
	/* Each script starts with the datasets as loaded, whatever the one
	 * before found changed on disk, so that it always runs the same way. */
	for (size_t i = 0; i < d.ndatasets; i++)
		d.datasets[i]->changed[0] = '\0';
	for (unsigned n = 0; in.n && n < FZ_MAX_ACTIONS; n++) {
		uint8_t h = next_u8(&in);
		enum fz_op op = (enum fz_op)(((h & 15) | (h & 0x80) >> 3) % FZ_NOPS);
		struct fz_client *c = &clients[((h >> 4) & 3) % FZ_CLIENTS];

		st.sent[op]++;
		if (act(c, op, h & FZ_NO_HELLO, &in))
			settle();
		for (int i = 0; i < FZ_CLIENTS; i++)
			check_answered(&clients[i]);
	}
	end_script();
	return 0;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	static const unsigned versions[FZ_NSETS] = {1, 2, 3, 1, 2, 1};
	struct config_dataset decl;
	char path[128];
	int rc;

	verbose = getenv("FUZZ_VERBOSE") != NULL;
	signal(SIGPIPE, SIG_IGN);
	snprintf(dir, sizeof(dir), "/tmp/fuzz_sess.XXXXXX");
	if (!mkdtemp(dir))
		die("mkdtemp: %s", strerror(errno));
	atexit(cleanup_dir);
	atexit(print_stats);

	config_defaults(&d.cfg);
	snprintf(path, sizeof(path), "%s/sock", dir);
	free(d.cfg.socket_path);
	d.cfg.socket_path = strdup(path);
	/* Small enough that every limit is within a script's reach: three
	 * clients against two sessions, several arenas per session, a batch
	 * of the wide dataset over session_bytes, a frame over max_frame. */
	d.cfg.readers = 3;
	d.cfg.arena_bytes = 256 << 10;
	d.cfg.session_bytes = 4 << 20;
	d.cfg.max_sessions = 2;
	d.cfg.max_frame = 64 << 10;
	d.cfg.max_epoch_picks = (uint64_t)FZ_ROWS * FZ_AUGMENT_MAX;
	/* Memory quotas are the integration tests' (test_integration_limits):
	 * out of this model's reach, they never refuse here. */
	d.cfg.memory_budget = d.cfg.memory_per_uid = 1ull << 40;
	daemon_config_quota(&d);
	d.datasets = calloc(FZ_NSETS, sizeof(*d.datasets));
	if (!d.cfg.socket_path || !d.datasets)
		die("out of memory");
	d.ndatasets = FZ_NSETS;
	for (size_t i = 0; i < FZ_NSETS; i++) {
		d.datasets[i] = calloc(1, sizeof(**d.datasets));
		if (!d.datasets[i])
			die("out of memory");
		make_set(&sets[i], versions[i], 0x5eed + 16 * i, &decl);
		rc = ds_load(d.datasets[i], &decl);
		if ((rc != 0) != sets[i].broken)
			die("dataset %s: %s", sets[i].name, d.datasets[i]->error);
		if (sets[i].cut && truncate(decl.fields[0].paths[0],
					    (off_t)(d.datasets[i]->fields[0].shards[0].data_offset +
						    sets[i].cut * sets[i].fields[0].row_bytes)))
			die("cannot truncate %s", decl.fields[0].paths[0]);
		for (size_t f = 0; f < decl.nfields; f++) {
			for (size_t p = 0; p < decl.fields[f].npaths; p++)
				free(decl.fields[f].paths[p]);
			free(decl.fields[f].paths);
		}
		free(decl.fields);
	}
	d.ngpus = gpu_init(d.gpu_desc, sizeof(d.gpu_desc));
	if (d.ngpus > 0)
		die("fuzz_sess is built with gpu_none.c, yet found %d GPU(s)", d.ngpus);
	if (uv_loop_init(&loop))
		die("uv_loop_init");
	d.loop = &loop;
	d.listen_fd = -1;
	d.started_ns = now_ns();
	/* Never dereferenced: reader_submit is the harness's. */
	d.readers = (struct readers *)&d;
	rc = closer_start();
	if (rc)
		die("closer_start: %s", strerror(-rc));
	rc = server_listen(&d);
	if (rc)
		die("server_listen: %s", strerror(-rc));
	for (int i = 0; i < FZ_CLIENTS; i++)
		clients[i].fd = -1;
	return 0;
}
