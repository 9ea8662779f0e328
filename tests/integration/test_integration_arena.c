/*
 * test_integration_arena.c — a client that tries to write into its host
 * arena, against a real prefetchd.
 *
 * A host arena reaches the client as a read-only memfd descriptor.  The
 * hostile client here speaks the protocol itself so that it keeps that
 * descriptor (libprefetch closes it once mapped) and tries every way to
 * write through it: reopening /proc/self/fd/N read-write, as itself and as
 * another user, a writable shared mapping, write(), a hole punch (which
 * would zero the slots), mprotect, and adding F_SEAL_WRITE (which would
 * stop the daemon's own writes).  The memfd is 0400 and sealed against
 * shrinking, growing and future writes, and the seals are sealed: each try
 * fails with the kernel's error, the batch in hand keeps its bytes, and a
 * bystander's epochs beside it stay byte-exact with status answering in
 * time.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "prefetch.h"
#include "prefetch.pb-c.h"
#include "testutil.h"
#include "wire.h"

#define N_ROWS	  4096
#define ROW_BYTES 64
#define SEED	  33
#define BATCH	  64

static struct tdaemon td;

/* The hostile client's side of the protocol: its socket and what came. */
struct raw {
	int fd;
	struct wire_rx rx;
	uint64_t id;
};

static void raw_connect(struct raw *r)
{
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	struct timeval tv = {.tv_sec = 10};

	memset(r, 0, sizeof(*r));
	r->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(r->fd >= 0);
	assert_true(strlen(td.sock) < sizeof(a.sun_path));
	memcpy(a.sun_path, td.sock, strlen(td.sock));
	assert_int_equal(connect(r->fd, (struct sockaddr *)&a, sizeof(a)), 0);
	/* A daemon that never answers fails the test instead of hanging it. */
	assert_int_equal(setsockopt(r->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
	wire_rx_init(&r->rx, WIRE_MAX_FRAME_DEFAULT);
}

static void raw_send(struct raw *r, Pf__Envelope *env)
{
	uint8_t *frame;
	size_t len;

	env->id = ++r->id;
	assert_int_equal(wire_encode(env, &frame, &len), 0);
	assert_int_equal(wire_send_all(r->fd, frame, len, -1), 0);
	free(frame);
}

/* The next frame of kind msg_case; frames of other kinds before it are
 * dropped (an Error among them fails the test, saying what it said). */
static Pf__Envelope *raw_expect(struct raw *r, int msg_case)
{
	for (;;) {
		Pf__Envelope *env;
		int rc = wire_rx_next(&r->rx, &env);

		if (rc == 1) {
			if ((int)env->msg_case == msg_case)
				return env;
			if (env->msg_case == PF__ENVELOPE__MSG_ERROR)
				fail_msg("the daemon refused: %s", env->error->message);
			pf__envelope__free_unpacked(env, NULL);
			continue;
		}
		assert_int_equal(rc, 0);
		assert_true(wire_rx_fill(&r->rx, r->fd) > 0);
	}
}

/* Hello, a host session on "x" and its first arena: the descriptor the
 * client keeps.  field_off: where the field sits in a slot. */
static int raw_open(struct raw *r, uint64_t *arena_bytes, uint64_t *field_off)
{
	Pf__Envelope env = PF__ENVELOPE__INIT, *got;
	Pf__Hello hello = PF__HELLO__INIT;
	Pf__OpenSession open = PF__OPEN_SESSION__INIT;
	int fd;

	hello.version = WIRE_VERSION;
	hello.client = "hostile[arena]";
	env.msg_case = PF__ENVELOPE__MSG_HELLO;
	env.hello = &hello;
	raw_send(r, &env);
	pf__envelope__free_unpacked(raw_expect(r, PF__ENVELOPE__MSG_HELLO_REPLY), NULL);
	open.dataset = "x";
	open.device = "host";
	open.batch_size = BATCH;
	open.name = "hostile";
	env = (Pf__Envelope)PF__ENVELOPE__INIT;
	env.msg_case = PF__ENVELOPE__MSG_OPEN;
	env.open = &open;
	raw_send(r, &env);
	got = raw_expect(r, PF__ENVELOPE__MSG_OPENED);
	assert_int_equal(got->opened->n_fields, 1);
	*field_off = got->opened->fields[0]->offset;
	pf__envelope__free_unpacked(got, NULL);
	got = raw_expect(r, PF__ENVELOPE__MSG_ARENA);
	assert_int_equal(got->arena->id, 0);
	assert_int_equal(got->arena->kind, PF__ARENA_KIND__ARENA_HOST_MEMFD);
	*arena_bytes = got->arena->bytes;
	pf__envelope__free_unpacked(got, NULL);
	fd = wire_rx_take_fd(&r->rx);
	assert_true(fd >= 0);
	return fd;
}

/* A sequential epoch's first batch, which lies in arena 0. */
static Pf__Envelope *raw_first_batch(struct raw *r)
{
	Pf__Envelope env = PF__ENVELOPE__INIT, *got;
	Pf__StartEpoch start = PF__START_EPOCH__INIT;

	start.epoch = 1;
	start.order = PF__ORDER__ORDER_SEQUENTIAL;
	env.msg_case = PF__ENVELOPE__MSG_START;
	env.start = &start;
	raw_send(r, &env);
	got = raw_expect(r, PF__ENVELOPE__MSG_BATCH);
	assert_int_equal(got->batch->error, 0);
	assert_int_equal(got->batch->arena, 0);
	assert_int_equal(got->batch->count, BATCH);
	assert_int_equal(got->batch->n_picks, BATCH);
	return got;
}

static void assert_batch_intact(const uint8_t *arena, uint64_t field_off, const Pf__BatchReady *b)
{
	for (uint32_t k = 0; k < b->count; k++)
		assert_true(td_row_ok(arena + b->offset + field_off + (uint64_t)k * ROW_BYTES,
				      ROW_BYTES, SEED, b->picks[k]));
}

static const char *err_name(int rc, int e)
{
	return rc < 0 ? strerror(e) : "succeeded";
}

/* Child, as `nobody`: reopening the arena read-write is refused by its
 * mode.  Exits 0 when open failed with EACCES. */
static int reopen_as_other(int fd, uid_t uid, gid_t gid)
{
	char path[64];
	int rw;

	if (setgroups(0, NULL) || setgid(gid) || setuid(uid))
		return 99;
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	rw = open(path, O_RDWR | O_CLOEXEC);
	fprintf(stderr, "  [nobody] open(%s, O_RDWR): %s\n", path, err_name(rw, errno));
	return rw < 0 && errno == EACCES ? 0 : 1;
}

static void client_cannot_reopen_or_punch_its_arena(void **state)
{
	struct td_bystander_report rep;
	struct td_bystander *by;
	struct raw r;
	Pf__Envelope *batch;
	uint64_t bytes, field_off;
	uint8_t *arena;
	struct stat st;
	char path[64];
	int fd, rw, rc, seals, want;

	(void)state;
	raw_connect(&r);
	by = td_bystander_start(td.sock, "x", 32, ROW_BYTES, SEED);
	assert_non_null(by);
	fd = raw_open(&r, &bytes, &field_off);
	batch = raw_first_batch(&r);
	arena = mmap(NULL, bytes, PROT_READ, MAP_SHARED, fd, 0);
	assert_true(arena != MAP_FAILED);
	assert_batch_intact(arena, field_off, batch->batch);

	/* What the descriptor says about itself. */
	assert_int_equal(fstat(fd, &st), 0);
	seals = fcntl(fd, F_GET_SEALS);
	print_message("arena memfd: mode %04o, seals 0x%x\n", (unsigned)(st.st_mode & 07777),
		      (unsigned)seals);
	assert_int_equal(st.st_mode & 07777, 0400);
	want = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL;
	assert_int_equal(seals & want, want);

	/* The descriptor as sent: read-only. */
	rc = fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, (off_t)bytes);
	print_message("punch through the sent fd: %s\n", err_name(rc, errno));
	assert_int_equal(rc, -1);
	assert_int_equal(errno, EBADF);
	rc = mprotect(arena, bytes, PROT_READ | PROT_WRITE);
	print_message("mprotect(PROT_WRITE) of the client's mapping: %s\n", err_name(rc, errno));
	assert_int_equal(rc, -1);
	assert_int_equal(errno, EACCES);
	rc = fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE);
	print_message("F_ADD_SEALS F_SEAL_WRITE (would stop the daemon's writes): %s\n",
		      err_name(rc, errno));
	assert_int_equal(rc, -1);
	assert_int_equal(errno, EPERM);

	/* Reopened read-write through /proc: refused by the mode, except to
	 * root, whom the mode does not stop; the seal stops root's writes. */
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	rw = open(path, O_RDWR | O_CLOEXEC);
	print_message("open(%s, O_RDWR) as uid %u: %s\n", path, (unsigned)geteuid(),
		      err_name(rw, errno));
	if (geteuid() != 0) {
		assert_int_equal(rw, -1);
		assert_int_equal(errno, EACCES);
	} else {
		struct passwd *pw = getpwnam("nobody");
		void *w;

		assert_true(rw >= 0);
		w = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0);
		print_message("writable shared mapping: %s\n",
			      err_name(w == MAP_FAILED ? -1 : 0, errno));
		assert_true(w == MAP_FAILED);
		assert_int_equal(errno, EPERM);
		rc = (int)pwrite(rw, "\0", 1, (off_t)batch->batch->offset);
		print_message("pwrite: %s\n", err_name(rc, errno));
		assert_int_equal(rc, -1);
		assert_int_equal(errno, EPERM);
		rc = fallocate(rw, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, (off_t)bytes);
		print_message("hole punch: %s\n", err_name(rc, errno));
		assert_int_equal(rc, -1);
		assert_int_equal(errno, EPERM);
		close(rw);
		if (pw) {
			pid_t pid = fork();
			int status;

			assert_true(pid >= 0);
			if (pid == 0)
				_exit(reopen_as_other(fd, pw->pw_uid, pw->pw_gid));
			assert_int_equal(waitpid(pid, &status, 0), pid);
			assert_true(WIFEXITED(status));
			assert_int_equal(WEXITSTATUS(status), 0);
		}
	}

	/* Keep at it for a while, so that the bystander's epochs and status
	 * requests run beside the attack rather than after it. */
	for (double end = td_now() + 0.5; td_now() < end;) {
		int again = open(path, O_RDWR | O_CLOEXEC);

		if (again >= 0) {
			assert_int_equal(fallocate(again,
						   FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
						   (off_t)bytes),
					 -1);
			close(again);
		}
		assert_int_equal(
			fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, (off_t)bytes),
			-1);
	}

	/* Nothing reached the slot: the batch still holds its rows. */
	assert_batch_intact(arena, field_off, batch->batch);
	pf__envelope__free_unpacked(batch, NULL);
	munmap(arena, bytes);
	close(fd);
	close(r.fd);
	wire_rx_free(&r.rx);

	rc = td_bystander_stop(by, &rep);
	print_message("bystander: %llu epochs, %llu batches, %llu statuses, slowest %.1f ms%s%s\n",
		      (unsigned long long)rep.epochs, (unsigned long long)rep.batches,
		      (unsigned long long)rep.statuses, rep.max_status_ms, rep.error[0] ? ": " : "",
		      rep.error);
	assert_int_equal(rc, 0);
	{
		Pf__Envelope *status = td_status(td.sock);

		assert_non_null(status);
		pf__envelope__free_unpacked(status, NULL);
	}
}

static int setup(void **state)
{
	char p[400];
	uint64_t shape[1] = {ROW_BYTES};

	(void)state;
	assert_int_equal(td_init(&td, "arena"), 0);
	td_path(&td, "x.npy", p, sizeof(p));
	assert_int_equal(td_write_npy(p, 1, "<u1", 1, N_ROWS, shape, 1, SEED, 0), 0);
	assert_int_equal(td_start(&td, NULL, "[dataset.x]\nfield.x = x.npy\n"), 0);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	assert_int_equal(td_stop(&td, 5000), 0);
	td_cleanup(&td);
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(client_cannot_reopen_or_punch_its_arena),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
