/*
 * test_client.c — libprefetch against a scripted fake daemon.
 *
 * The fake daemon runs in a thread on the other end of a socketpair and
 * speaks the real protocol with the real framing (proto/wire.c): it answers
 * hello, opens a session whose single host arena is a sealed memfd, and
 * pushes batches under the governor's rule (sent − acked < target, a free
 * slot), filling each slot with values derived from its picks so that the
 * tests check the bytes the trainer reads.  Everything the client sends is
 * logged; the tests (main thread, where cmocka may assert) read the log.
 * The script flags make the fake misbehave in one named way each.
 */
#include <errno.h>
#include <fcntl.h>
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
#include "prefetch.h"
#include "prefetch.pb-c.h"
#include "wire.h"

#define BATCH	    8
#define LAST_COUNT  3 /* the last batch of an epoch is partial */
#define NSLOTS	    4
#define SLOT_BYTES  1024
#define SLOT_BASE   512 /* slot s lies at SLOT_BASE + s * SLOT_BYTES: not 0 */
#define ARENA_BYTES 8192
#define X_OFFSET    0	/* field x: f4[4] per sample */
#define Y_OFFSET    512 /* field y: i8 per sample */
#define SESSION_ID  7
#define REFUSAL	    "uid 1000 gid 1000 is not allowed by this daemon's allow_users/allow_groups"

enum ev_kind {
	EV_HELLO,
	EV_OPEN,
	EV_START,
	EV_ACK,
	EV_RELEASE,
	EV_ABANDON,
	EV_SET_DEPTH,
	EV_SENT, /* the fake pushed a BatchReady */
	EV_EOF,
	EV_KINDS
};

struct ev {
	enum ev_kind kind;
	uint64_t epoch;
	uint64_t seq;
	int32_t slot;
	double wait_s;
	double busy_s;
	uint32_t target;
	bool automatic;
};

struct script {
	uint32_t nbatches;	  /* per epoch; the last holds LAST_COUNT */
	uint32_t target;	  /* governor depth */
	int error_seq;		  /* this batch is an error batch; -1 none */
	int delay_ms;		  /* between batches (and before the first) */
	bool silent_hello;	  /* never answer hello */
	bool silent_requests;	  /* never answer set_depth */
	int late_reply_ms;	  /* answer set_depth this late */
	bool wrong_reply;	  /* answer set_depth with EpochEnd's sibling */
	int refuse_start;	  /* answer start with this Error code */
	int close_after;	  /* > 0: close the socket after this many acks */
	int garbage_after;	  /* > 0: after this many batches, write garbage */
	bool huge_frame;	  /* the garbage is an oversized length */
	bool error_on_release;	  /* push an Error after the first release */
	bool stale_after_abandon; /* push a batch of the abandoned epoch */
	bool flood_on_set_depth;  /* 4097 error batches before the Ok */
	bool cuda_arena;	  /* also push a CUDA arena after open */
	bool unsealed_arena;	  /* the memfd is not sealed */
	bool bad_slot;		  /* announce slot 99 */
	int refuse_peer;	  /* 1: push Error and close before hello, 2: after */
	bool deaf;		  /* read nothing more once the session is open */
};

struct fake {
	struct script s;
	int fd; /* owned: the daemon's end of the socketpair */
	pthread_t thread;
	int memfd;	/* owned */
	uint8_t *arena; /* owned mapping, read-write */

	/* Thread state. */
	uint64_t epoch;
	bool running;
	bool end_sent;
	uint64_t next_seq;
	uint64_t sent;
	uint64_t acked;
	int64_t next_send_ns;
	bool slot_busy[NSLOTS];
	bool stale_pending;
	bool garbage_sent;
	bool error_pushed;
	bool opened;

	pthread_mutex_t mu; /* guards everything below */
	pthread_cond_t cv;
	bool stop;
	struct ev log[8192];
	int nlog;
	char hello_client[64];
	char open_name[64];
	bool open_picks_le; /* the client asked for raw picks */
	bool open_narrow;   /* ... and for 4-byte ones */
	char failed[256];   /* non-empty: the fake saw something it did not expect */
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
	pthread_cond_broadcast(&f->cv);
	pthread_mutex_unlock(&f->mu);
}

static void fake_fail(struct fake *f, const char *why)
{
	pthread_mutex_lock(&f->mu);
	if (!f->failed[0])
		snprintf(f->failed, sizeof(f->failed), "%s", why);
	pthread_mutex_unlock(&f->mu);
}

static void fake_send(struct fake *f, Pf__Envelope *env, int pass_fd)
{
	uint8_t *frame;
	size_t len;

	int rc = wire_encode(env, &frame, &len);

	if (!rc) {
		rc = wire_send_all(f->fd, frame, len, pass_fd);
		free(frame);
	}
	/* A client that broke the connection on purpose (the garbage tests)
	 * is gone; only other failures are the fake's. */
	if (rc && rc != -EPIPE && rc != -ECONNRESET)
		fake_fail(f, "send failed");
}

static void fake_reply_ok(struct fake *f, uint64_t id)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__Ok ok = PF__OK__INIT;

	env.id = id;
	env.msg_case = PF__ENVELOPE__MSG_OK;
	env.ok = &ok;
	fake_send(f, &env, -1);
}

static void fake_reply_error(struct fake *f, uint64_t id, int code, const char *msg)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__Error err = PF__ERROR__INIT;

	env.id = id;
	env.msg_case = PF__ENVELOPE__MSG_ERROR;
	env.error = &err;
	err.code = code;
	err.message = (char *)msg;
	fake_send(f, &env, -1);
}

static uint64_t pick_of(uint64_t epoch, uint64_t seq, uint32_t j)
{
	return epoch * 1000 + seq * BATCH + j;
}

static uint32_t count_of(const struct fake *f, uint64_t seq)
{
	return seq + 1 == f->s.nbatches ? LAST_COUNT : BATCH;
}

static void fake_send_batch(struct fake *f, uint64_t epoch, uint64_t seq, int error)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__BatchReady msg = PF__BATCH_READY__INIT;
	uint64_t picks[BATCH];
	uint32_t count = count_of(f, seq);
	int slot = -1;

	for (uint32_t j = 0; j < count; j++)
		picks[j] = pick_of(epoch, seq, j);
	msg.epoch = epoch;
	msg.seq = seq;
	msg.count = count;
	msg.n_picks = count;
	msg.picks = picks;
	if (error) {
		msg.slot = -1;
		msg.error = error;
		msg.message = "x.npy: truncated at row 17";
	} else {
		uint8_t *base;

		for (int i = 0; i < NSLOTS && slot < 0; i++)
			if (!f->slot_busy[i])
				slot = i;
		f->slot_busy[slot] = true;
		base = f->arena + SLOT_BASE + (size_t)slot * SLOT_BYTES;
		memset(base, 0xAB, SLOT_BYTES);
		for (uint32_t j = 0; j < count; j++) {
			float x[4];
			int64_t y = (int64_t)picks[j];

			for (int i = 0; i < 4; i++)
				x[i] = (float)(picks[j] * 10 + (uint64_t)i);
			memcpy(base + X_OFFSET + j * sizeof(x), x, sizeof(x));
			memcpy(base + Y_OFFSET + j * sizeof(y), &y, sizeof(y));
		}
		msg.slot = f->s.bad_slot ? 99 : slot;
		msg.arena = 0;
		msg.offset = SLOT_BASE + (uint64_t)slot * SLOT_BYTES;
	}
	env.msg_case = PF__ENVELOPE__MSG_BATCH;
	env.batch = &msg;
	fake_send(f, &env, -1);
	fake_log(f, (struct ev){.kind = EV_SENT, .epoch = epoch, .seq = seq, .slot = slot});
}

static bool free_slot(const struct fake *f)
{
	for (int i = 0; i < NSLOTS; i++)
		if (!f->slot_busy[i])
			return true;
	return false;
}

/* Pushes whatever the script allows now.  True when it sent something. */
static bool fake_pump(struct fake *f)
{
	if (!f->running) {
		if (f->stale_pending && free_slot(f)) {
			f->stale_pending = false;
			fake_send_batch(f, f->epoch, f->next_seq, 0);
			return true;
		}
		return false;
	}
	if (f->s.close_after && f->acked == (uint64_t)f->s.close_after) {
		shutdown(f->fd, SHUT_RDWR);
		f->running = false;
		return false;
	}
	if (f->s.garbage_after && f->sent == (uint64_t)f->s.garbage_after && !f->garbage_sent) {
		static const uint8_t bad[] = {5, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff};
		static const uint8_t huge[] = {0xf0, 0xff, 0xff, 0xff, 1, 2, 3};

		f->garbage_sent = true;
		if (f->s.huge_frame)
			wire_send_all(f->fd, huge, sizeof(huge), -1);
		else
			wire_send_all(f->fd, bad, sizeof(bad), -1);
		return true;
	}
	if (f->next_seq < f->s.nbatches && f->sent - f->acked < f->s.target &&
	    mono_ns() >= f->next_send_ns) {
		bool error = (int64_t)f->next_seq == f->s.error_seq;

		if (!error && !free_slot(f))
			return false;
		fake_send_batch(f, f->epoch, f->next_seq, error ? -EIO : 0);
		f->next_seq++;
		f->sent++;
		f->next_send_ns = mono_ns() + (int64_t)f->s.delay_ms * 1000000;
		return true;
	}
	if (f->next_seq == f->s.nbatches && !f->end_sent) {
		Pf__Envelope env = PF__ENVELOPE__INIT;
		Pf__EpochEnd end = PF__EPOCH_END__INIT;

		end.epoch = f->epoch;
		end.batches = f->s.nbatches;
		env.msg_case = PF__ENVELOPE__MSG_END;
		env.end = &end;
		fake_send(f, &env, -1);
		f->end_sent = true;
		return true;
	}
	return false;
}

static void fake_open(struct fake *f, uint64_t id)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__SessionOpened so = PF__SESSION_OPENED__INIT;
	Pf__Field x = PF__FIELD__INIT, y = PF__FIELD__INIT;
	Pf__Field *fields[] = {&x, &y};
	uint64_t xshape[] = {4};
	Pf__Arena arena = PF__ARENA__INIT;

	f->opened = true;
	x.name = "x";
	x.dtype = "f4";
	x.n_shape = 1;
	x.shape = xshape;
	x.sample_bytes = 16;
	x.offset = X_OFFSET;
	y.name = "y";
	y.dtype = "i8";
	y.sample_bytes = 8;
	y.offset = Y_OFFSET;
	so.session = SESSION_ID;
	so.num_samples = 35;
	so.n_fields = 2;
	so.fields = fields;
	so.slot_bytes = SLOT_BYTES;
	so.slots = NSLOTS;
	so.target = f->s.target;
	so.device = "host";
	env.id = id;
	env.msg_case = PF__ENVELOPE__MSG_OPENED;
	env.opened = &so;
	fake_send(f, &env, -1);

	arena.id = 0;
	arena.kind = PF__ARENA_KIND__ARENA_HOST_MEMFD;
	arena.bytes = ARENA_BYTES;
	arena.device = -1;
	env.id = 0;
	env.msg_case = PF__ENVELOPE__MSG_ARENA;
	env.arena = &arena;
	fake_send(f, &env, f->memfd);
	if (f->s.cuda_arena) {
		static uint8_t handle[64];

		arena.id = 1;
		arena.kind = PF__ARENA_KIND__ARENA_CUDA_LEGACY;
		arena.legacy_handle.len = sizeof(handle);
		arena.legacy_handle.data = handle;
		arena.device = 0;
		fake_send(f, &env, -1);
	}
}

static void fake_handle(struct fake *f, const Pf__Envelope *env)
{
	Pf__Envelope out = PF__ENVELOPE__INIT;

	switch (env->msg_case) {
	case PF__ENVELOPE__MSG_HELLO: {
		Pf__HelloReply hr = PF__HELLO_REPLY__INIT;

		pthread_mutex_lock(&f->mu);
		snprintf(f->hello_client, sizeof(f->hello_client), "%s", env->hello->client);
		pthread_mutex_unlock(&f->mu);
		fake_log(f, (struct ev){.kind = EV_HELLO});
		if (f->s.refuse_peer == 2) {
			fake_reply_error(f, 0, -EACCES, REFUSAL);
			shutdown(f->fd, SHUT_RDWR);
			break;
		}
		if (f->s.silent_hello)
			break;
		hr.version = WIRE_VERSION;
		hr.daemon = "fake 0.0";
		hr.max_frame = 1 << 20;
		out.id = env->id;
		out.msg_case = PF__ENVELOPE__MSG_HELLO_REPLY;
		out.hello_reply = &hr;
		fake_send(f, &out, -1);
		break;
	}
	case PF__ENVELOPE__MSG_OPEN:
		pthread_mutex_lock(&f->mu);
		snprintf(f->open_name, sizeof(f->open_name), "%s", env->open->name);
		f->open_picks_le = env->open->picks_le;
		f->open_narrow = env->open->narrow;
		pthread_mutex_unlock(&f->mu);
		fake_log(f, (struct ev){.kind = EV_OPEN});
		fake_open(f, env->id);
		break;
	case PF__ENVELOPE__MSG_START: {
		Pf__EpochStarted st = PF__EPOCH_STARTED__INIT;

		fake_log(f, (struct ev){.kind = EV_START, .epoch = env->start->epoch});
		if (f->s.refuse_start) {
			fake_reply_error(f, env->id, f->s.refuse_start,
					 "index 99 is out of range (N = 35)");
			break;
		}
		f->epoch = env->start->epoch;
		f->running = true;
		f->end_sent = false;
		f->next_seq = env->start->start_batch;
		f->sent = f->acked = 0;
		f->next_send_ns = mono_ns() + (int64_t)f->s.delay_ms * 1000000;
		st.epoch = f->epoch;
		st.batches = f->s.nbatches - env->start->start_batch;
		st.samples = 35;
		out.id = env->id;
		out.msg_case = PF__ENVELOPE__MSG_STARTED;
		out.started = &st;
		fake_send(f, &out, -1);
		break;
	}
	case PF__ENVELOPE__MSG_ACK:
		fake_log(f, (struct ev){.kind = EV_ACK,
					.epoch = env->ack->epoch,
					.seq = env->ack->seq,
					.wait_s = env->ack->wait_s,
					.busy_s = env->ack->busy_s});
		if (env->ack->epoch == f->epoch)
			f->acked++;
		if (env->id != 0)
			fake_fail(f, "ack with an id");
		break;
	case PF__ENVELOPE__MSG_RELEASE: {
		int32_t slot = env->release->slot;

		fake_log(f, (struct ev){.kind = EV_RELEASE,
					.epoch = env->release->epoch,
					.seq = env->release->seq,
					.slot = slot});
		if (slot < 0 || slot >= NSLOTS || !f->slot_busy[slot])
			fake_fail(f, "release of a slot the client does not hold");
		else
			f->slot_busy[slot] = false;
		if (f->s.error_on_release && !f->error_pushed) {
			f->error_pushed = true;
			fake_reply_error(
				f, 0, -EPERM,
				"release of slot 3 (epoch 1 batch 9) refused: this session "
				"does not hold that batch in that slot");
		}
		break;
	}
	case PF__ENVELOPE__MSG_ABANDON:
		fake_log(f, (struct ev){.kind = EV_ABANDON, .epoch = env->abandon->epoch});
		if (env->abandon->epoch == f->epoch)
			f->running = false;
		fake_reply_ok(f, env->id);
		if (f->s.stale_after_abandon)
			f->stale_pending = true;
		break;
	case PF__ENVELOPE__MSG_SET_DEPTH:
		fake_log(f, (struct ev){.kind = EV_SET_DEPTH,
					.target = env->set_depth->target,
					.automatic = env->set_depth->automatic});
		if (f->s.silent_requests)
			break;
		if (f->s.late_reply_ms)
			usleep(f->s.late_reply_ms * 1000);
		if (f->s.flood_on_set_depth) {
			for (int i = 0; i <= PFC_MAX_QUEUED; i++)
				fake_send_batch(f, f->epoch, f->next_seq++, -EIO);
		}
		if (f->s.wrong_reply) {
			Pf__EpochStarted st = PF__EPOCH_STARTED__INIT;

			out.id = env->id;
			out.msg_case = PF__ENVELOPE__MSG_STARTED;
			out.started = &st;
			fake_send(f, &out, -1);
			break;
		}
		fake_reply_ok(f, env->id);
		break;
	default: fake_fail(f, "unexpected message from the client"); break;
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
		if (f->s.deaf && f->opened) {
			usleep(5000); /* the socket's buffer fills up */
			continue;
		}
		if (poll(&pfd, 1, 5) <= 0)
			continue;
		got = wire_rx_fill(&rx, f->fd);
		if (got == -EAGAIN)
			continue;
		if (got <= 0) {
			fake_log(f, (struct ev){.kind = EV_EOF});
			break;
		}
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

/* One fake per test, static so that a test may read its log after
 * fake_finish. */
static struct fake the_fake;
/* Whether the_fake's lock and condition are initialised.  They outlive
 * fake_finish (count_ev and nth_ev take the lock to read the log after it)
 * and are destroyed by the next fake_start, before it initialises them
 * again: locking a destroyed mutex is undefined (TSan reports it). */
static bool the_fake_sync;

/* Starts the fake and connects a client to it (hello only). */
static struct fake *fake_start(const struct script *s, struct pf_client **c, int *rc)
{
	struct fake *f = &the_fake;
	int sv[2];
	int seals = F_SEAL_SHRINK | F_SEAL_GROW;

	if (the_fake_sync) {
		pthread_mutex_destroy(&f->mu);
		pthread_cond_destroy(&f->cv);
	}
	memset(f, 0, sizeof(*f));
	f->s = *s;
	if (!f->s.target)
		f->s.target = 2;
	if (!f->s.nbatches)
		f->s.nbatches = 5;
	pthread_mutex_init(&f->mu, NULL);
	pthread_cond_init(&f->cv, NULL);
	the_fake_sync = true;
	f->memfd = memfd_create("pf-test-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	assert_true(f->memfd >= 0);
	assert_int_equal(ftruncate(f->memfd, ARENA_BYTES), 0);
	if (!s->unsealed_arena)
		assert_int_equal(fcntl(f->memfd, F_ADD_SEALS, seals), 0);
	f->arena = mmap(NULL, ARENA_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, f->memfd, 0);
	assert_true(f->arena != MAP_FAILED);
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	f->fd = sv[1];
	if (s->refuse_peer == 1) {
		/* Before the thread and the client exist: the client's hello
		 * meets a closed socket (EPIPE) with the reason unread. */
		fake_reply_error(f, 0, -EACCES, REFUSAL);
		shutdown(f->fd, SHUT_RDWR);
	}
	assert_int_equal(pthread_create(&f->thread, NULL, fake_main, f), 0);
	*rc = pfc_connect_fd(sv[0], "fake prefetchd", s->silent_hello ? 200 : 2000, c);
	return f;
}

/* Starts the fake, connects and opens a session; asserts all went well. */
static struct fake *fake_session(const struct script *s, struct pf_client **c)
{
	int rc;
	struct fake *f = fake_start(s, c, &rc);

	assert_int_equal(rc, 0);
	rc = pf_open(*c, &(struct pf_open_opts){.dataset = "demo", .batch_size = BATCH});
	assert_int_equal(rc, 0);
	return f;
}

/* Closes the client, waits for the fake to see EOF and stops it.  The log
 * stays readable, its lock too (see the_fake_sync). */
static void fake_finish(struct fake *f, struct pf_client *c)
{
	pf_close(c);
	/* The fake exits on EOF; stop covers a fake that closed first. */
	for (int i = 0; i < 200; i++) {
		bool eof = false;

		pthread_mutex_lock(&f->mu);
		for (int k = 0; k < f->nlog; k++)
			eof |= f->log[k].kind == EV_EOF;
		pthread_mutex_unlock(&f->mu);
		if (eof)
			break;
		usleep(5000);
	}
	pthread_mutex_lock(&f->mu);
	f->stop = true;
	pthread_mutex_unlock(&f->mu);
	pthread_join(f->thread, NULL);
	if (f->failed[0])
		fail_msg("fake daemon: %s", f->failed);
	close(f->fd);
	munmap(f->arena, ARENA_BYTES);
	close(f->memfd);
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

/* Waits up to 2 s for at least n events of a kind.  Returns n once there
 * are that many (more may follow: count_ev checks exact numbers), else how
 * many came. */
static int wait_ev(struct fake *f, enum ev_kind kind, int n)
{
	int64_t deadline = mono_ns() + 2000000000LL;
	int have;

	while ((have = count_ev(f, kind)) < n && mono_ns() < deadline)
		usleep(1000);
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

/* Position of the i-th event of a kind in the whole log, -1 if none. */
static int pos_ev(struct fake *f, enum ev_kind kind, int i)
{
	int pos = -1;

	pthread_mutex_lock(&f->mu);
	for (int k = 0; k < f->nlog; k++)
		if (f->log[k].kind == kind && i-- == 0) {
			pos = k;
			break;
		}
	pthread_mutex_unlock(&f->mu);
	return pos;
}

static void assert_batch_bytes(const struct pf_batch *b, uint64_t epoch, uint64_t seq,
			       uint32_t count)
{
	assert_non_null(b);
	assert_int_equal(b->epoch, epoch);
	assert_int_equal(b->seq, seq);
	assert_int_equal(b->count, count);
	assert_int_equal(b->nfields, 2);
	assert_false(b->on_device);
	for (uint32_t j = 0; j < count; j++) {
		const float *x = (const float *)b->data[0] + 4 * j;
		const int64_t *y = (const int64_t *)b->data[1] + j;
		uint64_t pick = pick_of(epoch, seq, j);

		assert_int_equal(b->picks[j], pick);
		for (int i = 0; i < 4; i++)
			assert_true(x[i] == (float)(pick * 10 + (uint64_t)i));
		assert_int_equal(*y, (int64_t)pick);
	}
}

static int start(struct pf_client *c, uint64_t *batches)
{
	return pf_start_epoch(c, &(struct pf_epoch_opts){.order = PF_ORDER_SEQUENTIAL}, batches);
}

/* ---- tests ------------------------------------------------------------------- */

static void hello_names_program_and_pid_and_open_keeps_the_shape(void **unused)
{
	struct pf_client *c;
	struct fake *f = fake_session(&(struct script){.error_seq = -1}, &c);
	struct pf_field fi;
	char want[64];

	snprintf(want, sizeof(want), "%s[%d]", program_invocation_short_name, (int)getpid());
	assert_string_equal(f->hello_client, want);
	assert_string_equal(f->open_name, want);
	/* Raw little-endian picks: at 16384 rows a batch, varints cost the
	 * daemon and the client ~100 us each (bench/NOTES.md). */
	assert_true(f->open_picks_le);
	/* It asks for 4-byte picks too; this fake, like a daemon that does
	 * not know them, sends picks_le, which every case here takes. */
	assert_true(f->open_narrow);
	assert_string_equal(pfc_daemon_version(c), "fake 0.0");
	assert_int_equal(pfc_daemon_max_frame(c), 1 << 20);
	assert_int_equal(pf_num_samples(c), 35);
	assert_int_equal(pf_num_fields(c), 2);
	assert_int_equal(pf_field_info(c, 0, &fi), 0);
	assert_string_equal(fi.name, "x");
	assert_string_equal(fi.dtype, "f4");
	assert_int_equal(fi.ndim, 1);
	assert_int_equal(fi.shape[0], 4);
	assert_int_equal(fi.sample_bytes, 16);
	assert_int_equal(pf_field_info(c, 1, &fi), 0);
	assert_string_equal(fi.name, "y");
	assert_int_equal(fi.ndim, 0);
	assert_int_equal(pf_field_info(c, 2, &fi), -EINVAL);
	assert_int_equal(pf_open(c, &(struct pf_open_opts){.dataset = "demo"}), -EBUSY);
	fake_finish(f, c);
}

static void an_epoch_delivers_every_batch_in_order_with_the_daemons_bytes(void **unused)
{
	struct pf_client *c;
	struct fake *f = fake_session(&(struct script){.error_seq = -1, .target = 2}, &c);
	struct pf_batch *b;
	struct pf_stats st;
	uint64_t batches = 0;

	assert_int_equal(start(c, &batches), 0);
	assert_int_equal(batches, 5);
	for (uint64_t seq = 0; seq < 5; seq++) {
		assert_int_equal(pf_next(c, 2000, &b), 0);
		assert_batch_bytes(b, 0, seq, seq == 4 ? LAST_COUNT : BATCH);
		assert_int_equal(pf_release(c, b, NULL), 0);
	}
	assert_int_equal(pf_next(c, 2000, &b), 0);
	assert_null(b);
	/* The end is sticky until a new epoch starts. */
	assert_int_equal(pf_next(c, 0, &b), 0);
	assert_null(b);
	assert_int_equal(pf_stats(c, &st), 0);
	assert_int_equal(st.session, SESSION_ID);
	assert_int_equal(st.batches, 5);
	assert_int_equal(st.bytes, (4 * BATCH + LAST_COUNT) * (16 + 8));
	assert_int_equal(st.held, 0);
	fake_finish(f, c);
}

static void taking_a_batch_acks_it_once_and_the_governor_moves_on(void **unused)
{
	/* With target 1 the fake pushes batch n+1 only after the ack of n:
	 * an epoch that completes proves every take was acked. */
	struct pf_client *c;
	struct fake *f = fake_session(&(struct script){.error_seq = -1, .target = 1}, &c);
	struct pf_batch *b;

	assert_int_equal(start(c, NULL), 0);
	for (int seq = 0; seq < 5; seq++) {
		assert_int_equal(pf_next(c, 2000, &b), 0);
		assert_non_null(b);
		assert_int_equal(pf_release(c, b, NULL), 0);
	}
	assert_int_equal(wait_ev(f, EV_ACK, 5), 5);
	for (int i = 0; i < 5; i++) {
		struct ev e = nth_ev(f, EV_ACK, i);

		assert_int_equal(e.epoch, 0);
		assert_int_equal(e.seq, i);
	}
	fake_finish(f, c);
	assert_int_equal(count_ev(f, EV_ACK), 5);
}

static void release_sends_epoch_seq_and_the_announced_slot(void **unused)
{
	struct pf_client *c;
	struct fake *f = fake_session(&(struct script){.error_seq = -1, .target = 3}, &c);
	struct pf_batch *b[3];

	assert_int_equal(start(c, NULL), 0);
	for (int i = 0; i < 3; i++)
		assert_int_equal(pf_next(c, 2000, &b[i]), 0);
	assert_int_equal(wait_ev(f, EV_SENT, 3), 3);
	assert_int_equal(count_ev(f, EV_RELEASE), 0);
	/* Out of order on purpose: releases name their own slot. */
	assert_int_equal(pf_release(c, b[1], NULL), 0);
	assert_int_equal(pf_release(c, b[0], NULL), 0);
	assert_int_equal(wait_ev(f, EV_RELEASE, 2), 2);
	for (int i = 0; i < 2; i++) {
		struct ev r = nth_ev(f, EV_RELEASE, i);
		struct ev s = nth_ev(f, EV_SENT, 1 - i);

		assert_int_equal(r.epoch, 0);
		assert_int_equal(r.seq, 1 - i);
		assert_int_equal(r.slot, s.slot);
	}
	fake_finish(f, c);
	/* pf_close released the batch still held. */
	assert_int_equal(count_ev(f, EV_RELEASE), 3);
	assert_int_equal(nth_ev(f, EV_RELEASE, 2).seq, 2);
}

static void release_of_a_batch_not_held_is_refused(void **unused)
{
	struct pf_client *c;
	struct fake *f = fake_session(&(struct script){.error_seq = -1}, &c);
	struct pf_batch *b, foreign = {0};

	assert_int_equal(start(c, NULL), 0);
	assert_int_equal(pf_next(c, 2000, &b), 0);
	assert_int_equal(pf_release(c, b, NULL), 0);
	assert_int_equal(pf_release(c, b, NULL), -EINVAL);
	assert_non_null(strstr(pf_errmsg(c), "not held"));
	assert_int_equal(pf_release(c, &foreign, NULL), -EINVAL);
	fake_finish(f, c);
	assert_int_equal(count_ev(f, EV_RELEASE), 1);
}

static void stall_accounting_counts_blocked_and_busy_time(void **unused)
{
	/* Batches every 100 ms, a trainer that works 50 ms per batch: it
	 * waits about 100 ms for the first and 50 ms for each later one. */
	struct pf_client *c;
	struct fake *f =
		fake_session(&(struct script){.error_seq = -1, .target = 1, .delay_ms = 100}, &c);
	struct pf_batch *b;
	struct pf_stats st;
	struct ev ack;

	assert_int_equal(start(c, NULL), 0);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(pf_next(c, 2000, &b), 0);
		assert_non_null(b);
		assert_int_equal(pf_release(c, b, NULL), 0);
		if (i < 2)
			usleep(50000);
	}
	assert_int_equal(pf_stats(c, &st), 0);
	assert_true(st.wait_s >= 0.15 && st.wait_s < 1.0);
	assert_true(st.busy_s >= 0.1 && st.busy_s < 0.5);
	assert_true(st.stall_fraction > 0.2 && st.stall_fraction < 0.9);
	assert_true(st.stall_fraction == st.wait_s / (st.wait_s + st.busy_s));
	/* The third ack carried the totals as they stood when it was taken. */
	assert_int_equal(wait_ev(f, EV_ACK, 3), 3);
	ack = nth_ev(f, EV_ACK, 2);
	assert_true(ack.wait_s == st.wait_s);
	assert_true(ack.busy_s == st.busy_s);
	/* And acks are cumulative. */
	assert_true(nth_ev(f, EV_ACK, 1).wait_s <= ack.wait_s);
	assert_true(nth_ev(f, EV_ACK, 0).busy_s == 0);
	fake_finish(f, c);
}

static void error_batch_returns_its_code_and_message_and_the_epoch_goes_on(void **unused)
{
	struct pf_client *c;
	struct fake *f = fake_session(&(struct script){.error_seq = 1, .target = 2}, &c);
	struct pf_batch *b;

	assert_int_equal(start(c, NULL), 0);
	assert_int_equal(pf_next(c, 2000, &b), 0);
	assert_batch_bytes(b, 0, 0, BATCH);
	assert_int_equal(pf_release(c, b, NULL), 0);
	assert_false(pf_error_batch(c));
	assert_int_equal(pf_next(c, 2000, &b), -EIO);
	assert_null(b);
	assert_string_equal(pf_errmsg(c), "epoch 0 batch 1: x.npy: truncated at row 17");
	/* An error batch, which a trainer may skip: not the connection's. */
	assert_true(pf_error_batch(c));
	assert_int_equal(pf_next(c, 2000, &b), 0);
	assert_false(pf_error_batch(c));
	assert_batch_bytes(b, 0, 2, BATCH);
	assert_int_equal(pf_release(c, b, NULL), 0);
	/* The error batch was acked (it counts) and never released (no slot). */
	assert_int_equal(wait_ev(f, EV_ACK, 3), 3);
	assert_int_equal(nth_ev(f, EV_ACK, 1).seq, 1);
	assert_int_equal(wait_ev(f, EV_RELEASE, 2), 2);
	assert_int_equal(nth_ev(f, EV_RELEASE, 0).seq, 0);
	assert_int_equal(nth_ev(f, EV_RELEASE, 1).seq, 2);
	fake_finish(f, c);
}

static void next_times_out_with_etimedout_and_the_client_stays_usable(void **unused)
{
	struct pf_client *c;
	struct fake *f = fake_session(&(struct script){.error_seq = -1, .delay_ms = 5000}, &c);
	struct pf_batch *b;
	int64_t t0;
	double took;

	assert_int_equal(start(c, NULL), 0);
	t0 = mono_ns();
	assert_int_equal(pf_next(c, 100, &b), -ETIMEDOUT);
	took = (mono_ns() - t0) / 1e9;
	assert_null(b);
	assert_true(took >= 0.095 && took < 1.0);
	assert_non_null(strstr(pf_errmsg(c), "within 100 ms"));
	assert_false(pf_error_batch(c));
	assert_int_equal(pf_next(c, 0, &b), -ETIMEDOUT);
	assert_int_equal(pf_set_depth(c, 0, 3), 0);
	assert_int_equal(wait_ev(f, EV_SET_DEPTH, 1), 1);
	assert_int_equal(nth_ev(f, EV_SET_DEPTH, 0).target, 3);
	assert_false(nth_ev(f, EV_SET_DEPTH, 0).automatic);
	fake_finish(f, c);
}

/* A daemon that takes nothing the client sends: the send times out and the
 * connection is over, with -ECONNABORTED, not the -ETIMEDOUT that means
 * "call again" (a Python loop would retry it for ever). */
static void daemon_that_takes_nothing_ends_the_connection_with_econnaborted(void **unused)
{
	struct pf_client *c;
	struct fake *f = fake_session(&(struct script){.error_seq = -1, .deaf = true}, &c);
	static uint64_t picks[100000]; /* 800 KB: more than the socket buffers hold */
	struct pf_epoch_opts eo = {
		.order = PF_ORDER_EXPLICIT, .indices = picks, .nindices = 100000};
	struct pf_batch *b;
	int64_t t0 = mono_ns();
	int rc, tries = 0;

	pfc_set_timeout(c, 200);
	/* The first requests may fit the socket's buffers (and then time out
	 * waiting for the reply, the connection still usable); one does not. */
	while ((rc = pf_start_epoch(c, &eo, NULL)) == -ETIMEDOUT && ++tries < 20)
		;
	assert_int_equal(rc, -ECONNABORTED);
	assert_true((mono_ns() - t0) / 1e9 < 10.0);
	assert_non_null(strstr(pf_errmsg(c), "did not take"));
	assert_int_equal(pf_next(c, 100, &b), -ECONNABORTED);
	assert_null(b);
	fake_finish(f, c);
}

static void request_without_an_answer_times_out(void **unused)
{
	struct pf_client *c;
	struct fake *f =
		fake_session(&(struct script){.error_seq = -1, .silent_requests = true}, &c);
	int64_t t0 = mono_ns();

	pfc_set_timeout(c, 150);
	assert_int_equal(pf_set_depth(c, 0, 0), -ETIMEDOUT);
	assert_true((mono_ns() - t0) / 1e9 < 1.0);
	assert_string_equal(pf_errmsg(c), "fake prefetchd did not answer set_depth within 150 ms");
	assert_true(nth_ev(f, EV_SET_DEPTH, 0).automatic);
	fake_finish(f, c);
}

static void late_reply_to_a_timed_out_request_is_ignored(void **unused)
{
	struct pf_client *c;
	struct fake *f = fake_session(&(struct script){.error_seq = -1, .late_reply_ms = 300}, &c);

	pfc_set_timeout(c, 100);
	assert_int_equal(pf_set_depth(c, 0, 2), -ETIMEDOUT);
	/* The Ok of the first arrives while this one waits; only its own
	 * reply (another id) may end the wait. */
	pfc_set_timeout(c, 2000);
	assert_int_equal(pf_set_depth(c, 0, 4), 0);
	assert_int_equal(count_ev(f, EV_SET_DEPTH), 2);
	fake_finish(f, c);
}

static void hello_without_an_answer_fails_connect_with_etimedout(void **unused)
{
	struct pf_client *c = NULL;
	int rc;
	int64_t t0 = mono_ns();
	struct fake *f =
		fake_start(&(struct script){.error_seq = -1, .silent_hello = true}, &c, &rc);

	assert_int_equal(rc, -ETIMEDOUT);
	assert_true((mono_ns() - t0) / 1e9 < 1.5);
	assert_non_null(c);
	assert_string_equal(pf_errmsg(c), "fake prefetchd did not answer hello within 0.2 s");
	assert_int_equal(pf_open(c, &(struct pf_open_opts){.dataset = "demo"}), -ETIMEDOUT);
	fake_finish(f, c);
}

static void refused_peer_learns_why_even_when_its_hello_cannot_be_sent(void **unused)
{
	for (int when = 1; when <= 2; when++) {
		struct pf_client *c = NULL;
		int rc;
		struct fake *f =
			fake_start(&(struct script){.error_seq = -1, .refuse_peer = when}, &c, &rc);

		assert_int_equal(rc, -EACCES);
		assert_string_equal(pf_errmsg(c), "prefetchd: " REFUSAL);
		assert_int_equal(count_ev(f, EV_HELLO), when == 1 ? 0 : 1);
		fake_finish(f, c);
	}
}

static void connect_to_a_missing_socket_names_the_path_and_a_hint(void **unused)
{
	struct pf_client *c = NULL;

	assert_int_equal(pf_connect("/nonexistent/prefetchd.sock", &c), -ENOENT);
	assert_non_null(c);
	assert_string_equal(pf_errmsg(c), "cannot connect to prefetchd at "
					  "/nonexistent/prefetchd.sock: No such file or directory "
					  "(is the daemon running?)");
	pf_close(c);
	assert_string_equal(pf_errmsg(NULL), "out of memory");
}

static void connect_without_a_path_uses_the_environment(void **unused)
{
	struct pf_client *c = NULL;

	setenv(PF_SOCKET_ENV, "/nonexistent/from-env.sock", 1);
	assert_int_equal(pf_connect(NULL, &c), -ENOENT);
	unsetenv(PF_SOCKET_ENV);
	assert_non_null(strstr(pf_errmsg(c), "/nonexistent/from-env.sock"));
	pf_close(c);
}

static void refused_request_returns_the_daemons_code_and_message(void **unused)
{
	struct pf_client *c;
	struct fake *f =
		fake_session(&(struct script){.error_seq = -1, .refuse_start = -ERANGE}, &c);
	struct pf_batch *b;

	assert_int_equal(pf_set_epoch(c, 4), 0);
	assert_int_equal(start(c, NULL), -ERANGE);
	assert_string_equal(pf_errmsg(c), "index 99 is out of range (N = 35)");
	/* No epoch runs: the end, not a wait. */
	assert_int_equal(pf_next(c, 2000, &b), 0);
	assert_null(b);
	/* The daemon started nothing under epoch 4: the retry uses it again. */
	assert_int_equal(start(c, NULL), -ERANGE);
	assert_int_equal(nth_ev(f, EV_START, 0).epoch, 4);
	assert_int_equal(nth_ev(f, EV_START, 1).epoch, 4);
	fake_finish(f, c);
}

/* The first epoch is 0 and each next one the last plus one, unless
 * pf_set_epoch names it (a trainer's own epoch counter); numbers only
 * grow, and the batches carry the number. */
static void set_epoch_names_the_next_epoch_and_numbers_only_grow(void **unused)
{
	struct pf_client *c;
	struct fake *f =
		fake_session(&(struct script){.error_seq = -1, .target = 2, .nbatches = 3}, &c);
	struct pf_batch *b;

	assert_int_equal(start(c, NULL), 0);
	assert_int_equal(nth_ev(f, EV_START, 0).epoch, 0);
	assert_int_equal(pf_set_epoch(c, 7), 0);
	assert_int_equal(start(c, NULL), 0);
	assert_int_equal(nth_ev(f, EV_START, 1).epoch, 7);
	assert_int_equal(pf_next(c, 2000, &b), 0);
	assert_batch_bytes(b, 7, 0, BATCH);
	assert_int_equal(pf_release(c, b, NULL), 0);
	assert_int_equal(pf_set_epoch(c, 7), -EINVAL);
	assert_non_null(strstr(pf_errmsg(c), "epoch 7 is not after epoch 7"));
	assert_int_equal(pf_set_epoch(c, 3), -EINVAL);
	assert_int_equal(start(c, NULL), 0);
	assert_int_equal(nth_ev(f, EV_START, 2).epoch, 8);
	assert_int_equal(pf_next(c, 2000, &b), 0);
	assert_batch_bytes(b, 8, 0, BATCH);
	assert_int_equal(pf_release(c, b, NULL), 0);
	fake_finish(f, c);
}

static void unsolicited_error_surfaces_on_the_next_call(void **unused)
{
	struct pf_client *c;
	struct fake *f = fake_session(
		&(struct script){.error_seq = -1, .target = 1, .error_on_release = true}, &c);
	struct pf_batch *b;

	assert_int_equal(start(c, NULL), 0);
	assert_int_equal(pf_next(c, 2000, &b), 0);
	assert_int_equal(pf_release(c, b, NULL), 0);
	/* The fake pushes the Error while handling the release, so it is
	 * read by this call, which it does not concern... */
	assert_int_equal(pf_set_depth(c, 0, 1), 0);
	/* ...and surfaces on the next pf_next, ahead of batch 1. */
	assert_int_equal(pf_next(c, 2000, &b), -EPERM);
	assert_null(b);
	assert_non_null(strstr(pf_errmsg(c), "prefetchd: release of slot 3"));
	assert_int_equal(pf_next(c, 2000, &b), 0);
	assert_batch_bytes(b, 0, 1, BATCH);
	fake_finish(f, c);
}

static void abandon_releases_the_queued_batches_of_that_epoch(void **unused)
{
	struct pf_client *c;
	struct fake *f =
		fake_session(&(struct script){.error_seq = -1, .target = 4, .nbatches = 10}, &c);
	struct pf_batch *b, *held;
	int abandon_pos;

	assert_int_equal(start(c, NULL), 0);
	assert_int_equal(pf_next(c, 2000, &held), 0);
	/* All four slots: batch 0 held, 1..3 pushed; the set_depth call reads
	 * them into the queue while it waits for its Ok. */
	assert_int_equal(wait_ev(f, EV_SENT, 4), 4);
	assert_int_equal(pf_set_depth(c, 0, 4), 0);
	assert_int_equal(count_ev(f, EV_RELEASE), 0);
	assert_int_equal(pf_abandon(c), 0);
	assert_int_equal(wait_ev(f, EV_RELEASE, 3), 3);
	abandon_pos = pos_ev(f, EV_ABANDON, 0);
	assert_true(abandon_pos >= 0);
	assert_int_equal(nth_ev(f, EV_ABANDON, 0).epoch, 0);
	for (int i = 0; i < 3; i++) {
		struct ev r = nth_ev(f, EV_RELEASE, i);

		assert_int_equal(r.epoch, 0);
		assert_int_equal(r.seq, 1 + i);
		assert_int_equal(r.slot, nth_ev(f, EV_SENT, 1 + i).slot);
		assert_true(pos_ev(f, EV_RELEASE, i) > abandon_pos);
	}
	/* Only the taken batch was acked. */
	assert_int_equal(count_ev(f, EV_ACK), 1);
	assert_int_equal(pf_next(c, 2000, &b), 0);
	assert_null(b);
	/* The taken batch stays valid until the trainer releases it. */
	assert_batch_bytes(held, 0, 0, BATCH);
	assert_int_equal(pf_release(c, held, NULL), 0);
	assert_int_equal(pf_abandon(c), 0);
	fake_finish(f, c);
	assert_int_equal(count_ev(f, EV_ABANDON), 1);
	assert_int_equal(count_ev(f, EV_RELEASE), 4);
}

static void batch_of_an_old_epoch_is_released_on_arrival_and_never_returned(void **unused)
{
	struct pf_client *c;
	struct fake *f = fake_session(
		&(struct script){
			.error_seq = -1, .target = 2, .nbatches = 10, .stale_after_abandon = true},
		&c);
	struct pf_batch *b;

	assert_int_equal(start(c, NULL), 0);
	assert_int_equal(pf_next(c, 2000, &b), 0);
	assert_int_equal(pf_release(c, b, NULL), 0);
	assert_int_equal(wait_ev(f, EV_SENT, 3), 3);
	assert_int_equal(pf_abandon(c), 0);
	/* The fake pushes a batch of epoch 0 once a slot is back; the next
	 * read (inside this start) meets it. */
	assert_int_equal(wait_ev(f, EV_SENT, 4), 4);
	assert_int_equal(start(c, NULL), 0);
	assert_int_equal(pf_next(c, 2000, &b), 0);
	assert_batch_bytes(b, 1, 0, BATCH);
	assert_int_equal(wait_ev(f, EV_RELEASE, 4), 4);
	{
		struct ev stale = nth_ev(f, EV_SENT, 3);
		struct ev r = nth_ev(f, EV_RELEASE, 3);

		assert_int_equal(stale.epoch, 0);
		assert_int_equal(r.epoch, 0);
		assert_int_equal(r.seq, stale.seq);
		assert_int_equal(r.slot, stale.slot);
	}
	fake_finish(f, c);
	/* Acks: batch 0 of epoch 0 and batch 0 of epoch 1, nothing else. */
	assert_int_equal(count_ev(f, EV_ACK), 2);
	assert_int_equal(nth_ev(f, EV_ACK, 1).epoch, 1);
}

static void starting_an_epoch_releases_the_queue_of_the_running_one(void **unused)
{
	struct pf_client *c;
	struct fake *f =
		fake_session(&(struct script){.error_seq = -1, .target = 4, .nbatches = 10}, &c);
	struct pf_batch *held, *b;
	int start2;

	assert_int_equal(start(c, NULL), 0);
	assert_int_equal(pf_next(c, 2000, &held), 0);
	assert_int_equal(wait_ev(f, EV_SENT, 4), 4);
	assert_int_equal(pf_set_depth(c, 0, 4), 0); /* queues 1..3 */
	assert_int_equal(start(c, NULL), 0);
	start2 = pos_ev(f, EV_START, 1);
	assert_true(start2 >= 0);
	assert_int_equal(nth_ev(f, EV_START, 1).epoch, 1);
	assert_int_equal(count_ev(f, EV_ABANDON), 0);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(nth_ev(f, EV_RELEASE, i).epoch, 0);
		assert_int_equal(nth_ev(f, EV_RELEASE, i).seq, 1 + i);
		assert_true(pos_ev(f, EV_RELEASE, i) < start2);
	}
	assert_int_equal(pf_next(c, 2000, &b), 0);
	assert_batch_bytes(b, 1, 0, BATCH);
	assert_batch_bytes(held, 0, 0, BATCH);
	assert_int_equal(pf_release(c, held, NULL), 0);
	assert_int_equal(pf_release(c, b, NULL), 0);
	fake_finish(f, c);
}

static void daemon_closing_the_socket_gives_econnreset_at_once(void **unused)
{
	struct pf_client *c;
	struct fake *f =
		fake_session(&(struct script){.error_seq = -1, .target = 1, .close_after = 1}, &c);
	struct pf_batch *b;
	int64_t t0;

	struct pf_batch *held;

	assert_int_equal(start(c, NULL), 0);
	assert_int_equal(pf_next(c, 2000, &held), 0);
	t0 = mono_ns();
	assert_int_equal(pf_next(c, 5000, &b), -ECONNRESET);
	assert_true((mono_ns() - t0) / 1e9 < 1.0);
	assert_string_equal(pf_errmsg(c), "fake prefetchd went away (the connection closed)");
	assert_false(pf_error_batch(c)); /* the connection's: not to be skipped */
	assert_int_equal(pf_next(c, -1, &b), -ECONNRESET);
	assert_int_equal(pf_release(c, held, NULL), -ECONNRESET);
	assert_int_equal(start(c, NULL), -ECONNRESET);
	assert_string_equal(pf_errmsg(c), "fake prefetchd went away (the connection closed)");
	fake_finish(f, c);
}

static void undecodable_frame_is_an_error_not_a_crash(void **unused)
{
	struct pf_client *c;
	struct fake *f = fake_session(&(struct script){.error_seq = -1, .garbage_after = 1}, &c);
	struct pf_batch *b, *held;

	assert_int_equal(start(c, NULL), 0);
	assert_int_equal(pf_next(c, 2000, &held), 0);
	assert_int_equal(pf_next(c, 2000, &b), -EPROTO);
	assert_null(b);
	assert_string_equal(pf_errmsg(c), "fake prefetchd sent a frame that does not decode; "
					  "connection closed");
	/* Sticky, and it closed the socket: the fake sees EOF. */
	assert_int_equal(pf_set_depth(c, 0, 1), -EPROTO);
	assert_int_equal(wait_ev(f, EV_EOF, 1), 1);
	/* A held host batch is still readable; its release reports the
	 * broken connection. */
	assert_batch_bytes(held, 0, 0, BATCH);
	assert_int_equal(pf_release(c, held, NULL), -EPROTO);
	fake_finish(f, c);
}

static void oversized_frame_is_refused_before_decoding(void **unused)
{
	struct pf_client *c;
	struct fake *f = fake_session(
		&(struct script){.error_seq = -1, .garbage_after = 1, .huge_frame = true}, &c);
	struct pf_batch *b;

	assert_int_equal(start(c, NULL), 0);
	assert_int_equal(pf_next(c, 2000, &b), 0);
	assert_int_equal(pf_release(c, b, NULL), 0);
	assert_int_equal(pf_next(c, 2000, &b), -EPROTO);
	{
		char want[64];

		snprintf(want, sizeof(want), "sent a frame longer than %u bytes", PFC_MAX_RX_FRAME);
		assert_non_null(strstr(pf_errmsg(c), want));
	}
	fake_finish(f, c);
}

static void batch_naming_a_foreign_slot_breaks_the_connection(void **unused)
{
	struct pf_client *c;
	struct fake *f = fake_session(&(struct script){.error_seq = -1, .bad_slot = true}, &c);
	struct pf_batch *b;

	assert_int_equal(start(c, NULL), 0);
	assert_int_equal(pf_next(c, 2000, &b), -EPROTO);
	assert_null(b);
	assert_string_equal(pf_errmsg(c), "epoch 0 batch 0 names slot 99 of a session with 4");
	fake_finish(f, c);
}

static void reply_of_the_wrong_type_breaks_the_connection(void **unused)
{
	struct pf_client *c;
	struct fake *f = fake_session(&(struct script){.error_seq = -1, .wrong_reply = true}, &c);

	assert_int_equal(pf_set_depth(c, 0, 1), -EPROTO);
	assert_string_equal(pf_errmsg(c), "fake prefetchd answered set_depth with started");
	fake_finish(f, c);
}

static void more_queued_batches_than_the_cap_is_a_protocol_error(void **unused)
{
	struct pf_client *c;
	struct fake *f = fake_session(&(struct script){.error_seq = -1,
						       .target = 1,
						       .nbatches = 2 * PFC_MAX_QUEUED,
						       .flood_on_set_depth = true},
				      &c);

	assert_int_equal(start(c, NULL), 0);
	assert_int_equal(pf_set_depth(c, 0, 1), -EPROTO);
	assert_non_null(strstr(pf_errmsg(c), "more than 4096 batches"));
	fake_finish(f, c);
}

static void device_arena_pushed_to_a_host_session_breaks_it(void **unused)
{
	struct pf_client *c;
	struct fake *f = fake_session(&(struct script){.error_seq = -1, .cuda_arena = true}, &c);

	assert_int_equal(start(c, NULL), -EPROTO);
	assert_non_null(strstr(pf_errmsg(c), "pushed to a host session"));
	fake_finish(f, c);
}

static void arena_not_sealed_against_shrinking_is_refused(void **unused)
{
	struct pf_client *c;
	struct fake *f =
		fake_session(&(struct script){.error_seq = -1, .unsealed_arena = true}, &c);

	assert_int_equal(start(c, NULL), -EPROTO);
	assert_string_equal(pf_errmsg(c), "arena 0 is not sealed against shrinking");
	fake_finish(f, c);
}

static int count_fds(void)
{
	int n = 0;
	char path[64];

	for (int fd = 0; fd < 1024; fd++) {
		snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
		n += access(path, F_OK) == 0;
	}
	return n;
}

static int count_arena_mappings(void)
{
	FILE *maps = fopen("/proc/self/maps", "r");
	char line[512];
	int n = 0;

	assert_non_null(maps);
	while (fgets(line, sizeof(line), maps))
		n += strstr(line, "pf-test-arena") != NULL;
	fclose(maps);
	return n;
}

static void close_leaves_no_fd_and_no_mapping_behind(void **unused)
{
	int fds = count_fds();
	int maps = count_arena_mappings();
	struct pf_client *c;
	struct fake *f = fake_session(&(struct script){.error_seq = -1}, &c);
	struct pf_batch *b;

	assert_int_equal(start(c, NULL), 0);
	assert_int_equal(pf_next(c, 2000, &b), 0);
	/* The fake's mapping and the client's. */
	assert_int_equal(count_arena_mappings(), maps + 2);
	/* socketpair (2) and the fake's memfd; the client closed its copy
	 * of the memfd right after mapping it. */
	assert_int_equal(count_fds(), fds + 3);
	fake_finish(f, c);
	assert_int_equal(count_fds(), fds);
	assert_int_equal(count_arena_mappings(), maps);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(hello_names_program_and_pid_and_open_keeps_the_shape),
		cmocka_unit_test(an_epoch_delivers_every_batch_in_order_with_the_daemons_bytes),
		cmocka_unit_test(taking_a_batch_acks_it_once_and_the_governor_moves_on),
		cmocka_unit_test(release_sends_epoch_seq_and_the_announced_slot),
		cmocka_unit_test(release_of_a_batch_not_held_is_refused),
		cmocka_unit_test(stall_accounting_counts_blocked_and_busy_time),
		cmocka_unit_test(error_batch_returns_its_code_and_message_and_the_epoch_goes_on),
		cmocka_unit_test(next_times_out_with_etimedout_and_the_client_stays_usable),
		cmocka_unit_test(request_without_an_answer_times_out),
		cmocka_unit_test(daemon_that_takes_nothing_ends_the_connection_with_econnaborted),
		cmocka_unit_test(late_reply_to_a_timed_out_request_is_ignored),
		cmocka_unit_test(hello_without_an_answer_fails_connect_with_etimedout),
		cmocka_unit_test(refused_peer_learns_why_even_when_its_hello_cannot_be_sent),
		cmocka_unit_test(connect_to_a_missing_socket_names_the_path_and_a_hint),
		cmocka_unit_test(connect_without_a_path_uses_the_environment),
		cmocka_unit_test(refused_request_returns_the_daemons_code_and_message),
		cmocka_unit_test(unsolicited_error_surfaces_on_the_next_call),
		cmocka_unit_test(abandon_releases_the_queued_batches_of_that_epoch),
		cmocka_unit_test(batch_of_an_old_epoch_is_released_on_arrival_and_never_returned),
		cmocka_unit_test(starting_an_epoch_releases_the_queue_of_the_running_one),
		cmocka_unit_test(set_epoch_names_the_next_epoch_and_numbers_only_grow),
		cmocka_unit_test(daemon_closing_the_socket_gives_econnreset_at_once),
		cmocka_unit_test(undecodable_frame_is_an_error_not_a_crash),
		cmocka_unit_test(oversized_frame_is_refused_before_decoding),
		cmocka_unit_test(batch_naming_a_foreign_slot_breaks_the_connection),
		cmocka_unit_test(reply_of_the_wrong_type_breaks_the_connection),
		cmocka_unit_test(more_queued_batches_than_the_cap_is_a_protocol_error),
		cmocka_unit_test(device_arena_pushed_to_a_host_session_breaks_it),
		cmocka_unit_test(arena_not_sealed_against_shrinking_is_refused),
		cmocka_unit_test(close_leaves_no_fd_and_no_mapping_behind),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
