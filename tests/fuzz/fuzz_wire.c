/*
 * fuzz_wire.c — libFuzzer harness: the frame reader (proto/wire.c).
 *
 * Input: byte 0 picks the receiver's frame cap (bits 0-2) and whether
 * descriptors ride along (bit 3); byte 1 seeds the chunking; the rest is
 * the byte stream a peer sends.  The stream goes through a real Unix
 * socketpair in chunks of pseudo-random sizes (1 byte to 4 KiB, drawn from
 * a generator seeded by byte 1), each taken in with wire_rx_fill and
 * drained with wire_rx_next, exactly as the daemon's on_readable does: it
 * stops at the first oversized frame or descriptor overflow (where the
 * daemon closes the connection) and goes on after a body that does not
 * decode (consumed, so the reader must stay in step).
 *
 * Checks, beyond ASan/UBSan's: the outcome of every frame (decoded,
 * refused as malformed, oversized) and the re-encoding of every decoded one
 * equal those of a reference walk of the whole stream at once, so chunk
 * boundaries change nothing; an oversized frame is refused before anything
 * is consumed; the receive buffer never grows past one maximal frame plus
 * one read; every decoded envelope has a message case with a name and
 * encodes to a frame whose header gives its length; no descriptor leaks.
 *
 * DESIGN: one thread; nothing outlives an input but /dev/null's descriptor.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "prefetch.pb-c.h"
#include "wire.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The most frames one input can hold is one per header's worth of bytes. */
struct outcome {
	int rc;		 /* 1 decoded, -EBADMSG, -EMSGSIZE */
	uint8_t *packed; /* owned: the decoded envelope re-encoded (rc == 1) */
	size_t len;
};

struct outcomes {
	struct outcome *v;
	size_t n, cap;
};

static int null_fd = -1;
static int fd_baseline;

static void die(const char *what) __attribute__((noreturn));

static void die(const char *what)
{
	fprintf(stderr, "fuzz_wire: %s\n", what);
	abort();
}

static void push(struct outcomes *o, int rc, const Pf__Envelope *env)
{
	struct outcome *x;

	if (o->n == o->cap) {
		o->cap = o->cap ? 2 * o->cap : 16;
		o->v = realloc(o->v, o->cap * sizeof(*o->v));
		if (!o->v)
			die("out of memory");
	}
	x = &o->v[o->n++];
	x->rc = rc;
	x->packed = NULL;
	x->len = 0;
	if (rc == 1) {
		x->len = pf__envelope__get_packed_size(env);
		x->packed = malloc(x->len ? x->len : 1);
		if (!x->packed)
			die("out of memory");
		pf__envelope__pack(env, x->packed);
	}
}

static void free_outcomes(struct outcomes *o)
{
	for (size_t i = 0; i < o->n; i++)
		free(o->v[i].packed);
	free(o->v);
}

/* What a decoded envelope must satisfy on its own. */
static void check_envelope(const Pf__Envelope *env)
{
	uint8_t *frame = NULL;
	size_t len = 0, body;
	Pf__Envelope *again;

	if (env->msg_case == PF__ENVELOPE__MSG__NOT_SET)
		die("wire_rx_next returned an envelope without a message");
	if (strcmp(wire_msg_name(env->msg_case), "unknown") == 0)
		die("a decoded message case has no name");
	if (wire_encode(env, &frame, &len))
		die("a decoded envelope does not encode");
	body = (size_t)frame[0] | (size_t)frame[1] << 8 | (size_t)frame[2] << 16 |
	       (size_t)frame[3] << 24;
	if (len != WIRE_HDR + body)
		die("wire_encode's header does not give its body's length");
	/* protobuf-c keeps unknown fields and packs them back as read; one
	 * numbered 0 (which it takes when the tag is spelled with a redundant
	 * varint byte) then does not decode again.  That is the library's
	 * quirk, and the daemon never re-sends what it received: only an
	 * envelope that does decode again is compared. */
	again = pf__envelope__unpack(NULL, body, frame + WIRE_HDR);
	if (again && (again->msg_case != env->msg_case || again->id != env->id ||
		      pf__envelope__get_packed_size(again) != body))
		die("an encoded envelope decodes to another");
	if (again)
		pf__envelope__free_unpacked(again, NULL);
	free(frame);
}

/* The reference: the whole stream walked at once, by the rules wire.h
 * states, without struct wire_rx. */
static void reference(const uint8_t *s, size_t n, size_t max_frame, struct outcomes *o)
{
	while (n >= WIRE_HDR) {
		uint32_t body = (uint32_t)s[0] | (uint32_t)s[1] << 8 | (uint32_t)s[2] << 16 |
				(uint32_t)s[3] << 24;
		Pf__Envelope *env;

		if (body > max_frame) {
			push(o, -EMSGSIZE, NULL);
			return;
		}
		if (n - WIRE_HDR < body)
			return;
		env = pf__envelope__unpack(NULL, body, s + WIRE_HDR);
		if (env && env->msg_case != PF__ENVELOPE__MSG__NOT_SET)
			push(o, 1, env);
		else
			push(o, -EBADMSG, NULL);
		if (env)
			pf__envelope__free_unpacked(env, NULL);
		s += WIRE_HDR + body;
		n -= WIRE_HDR + body;
	}
}

/* xorshift32: chunk sizes and descriptor placement from the input. */
static uint32_t next_rand(uint32_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 17;
	*x ^= *x << 5;
	return *x;
}

/* Drains whole frames; returns false when the daemon would close. */
static bool drain(struct wire_rx *rx, struct outcomes *o)
{
	for (;;) {
		Pf__Envelope *env = NULL;
		size_t before = rx->len;
		int rc = wire_rx_next(rx, &env);

		if (rc == 0)
			return true;
		if (rc == -EMSGSIZE) {
			if (rx->len != before)
				die("an oversized frame was consumed before it was refused");
			push(o, rc, NULL);
			return false;
		}
		if (rc == -EBADMSG) {
			push(o, rc, NULL);
			continue;
		}
		if (rc != 1 || !env)
			die("wire_rx_next returned something it does not document");
		check_envelope(env);
		push(o, 1, env);
		pf__envelope__free_unpacked(env, NULL);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const size_t caps[8] = {0, 1, 2, 16, 300, 4096, 65536, WIRE_MAX_FRAME_DEFAULT};
	struct outcomes want = {0}, got = {0};
	struct wire_rx rx;
	const uint8_t *stream;
	size_t n, off = 0, max_frame;
	uint32_t x;
	bool with_fds, open = true;
	int sv[2], fds_sent = 0, fd;

	if (size < 2)
		return 0;
	/* The lowest free descriptor now: free again at the end, or a leak. */
	fd_baseline = dup(STDERR_FILENO);
	close(fd_baseline);
	max_frame = caps[data[0] & 7] ? caps[data[0] & 7] : WIRE_MAX_FRAME_DEFAULT;
	with_fds = data[0] & 8;
	x = 0x9e3779b9u ^ data[1] ^ (uint32_t)size << 8;
	stream = data + 2;
	n = size - 2;
	reference(stream, n, max_frame, &want);

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0)
		die("socketpair");
	wire_rx_init(&rx, caps[data[0] & 7]);
	while (off < n && open) {
		size_t chunk = 1 + next_rand(&x) % (next_rand(&x) % 2 ? 16 : 4096);
		int pass = -1;
		long sent;

		if (chunk > n - off)
			chunk = n - off;
		if (with_fds && next_rand(&x) % 4 == 0) {
			pass = null_fd;
			fds_sent++;
		}
		sent = wire_send_some(sv[1], stream + off, chunk, pass);
		if (sent <= 0)
			die("the socketpair refused a chunk");
		off += (size_t)sent;
		for (;;) {
			long got_bytes = wire_rx_fill(&rx, sv[0]);

			if (got_bytes == -EAGAIN)
				break;
			if (got_bytes == -EMFILE) {
				/* More descriptors than WIRE_MAX_FDS: the daemon
				 * closes; the ones kept must be exactly that many. */
				if (rx.nfds != WIRE_MAX_FDS || fds_sent <= WIRE_MAX_FDS)
					die("-EMFILE without WIRE_MAX_FDS descriptors kept");
				open = false;
				break;
			}
			if (got_bytes <= 0)
				die("wire_rx_fill failed on a live socketpair");
			if (rx.cap > rx.max_frame + WIRE_HDR + 64 * 1024)
				die("the receive buffer grew past one frame plus one read");
			if (!drain(&rx, &got)) {
				open = false;
				break;
			}
		}
	}

	/* Frames cut off by an early stop are not compared. */
	if (open ? got.n != want.n : got.n > want.n)
		die("chunked reading found a different number of frames");
	for (size_t i = 0; i < got.n; i++) {
		if (got.v[i].rc != want.v[i].rc || got.v[i].len != want.v[i].len ||
		    (got.v[i].len && memcmp(got.v[i].packed, want.v[i].packed, got.v[i].len)))
			die("chunked reading decoded a frame differently from the whole stream");
	}
	if (open && rx.nfds != (fds_sent < WIRE_MAX_FDS ? fds_sent : WIRE_MAX_FDS))
		die("descriptors were lost or invented");
	/* Take some (the caller owns them), leave the rest to wire_rx_free. */
	while ((fd = wire_rx_take_fd(&rx)) >= 0 && next_rand(&x) % 2)
		close(fd);
	if (fd >= 0)
		close(fd);
	wire_rx_free(&rx);
	if (rx.buf || rx.len || rx.nfds)
		die("wire_rx_free left state behind");
	close(sv[0]);
	close(sv[1]);
	free_outcomes(&want);
	free_outcomes(&got);
	fd = dup(STDERR_FILENO);
	if (fd != fd_baseline)
		die("descriptor leak");
	close(fd);
	return 0;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (null_fd < 0)
		die("cannot open /dev/null");
	return 0;
}
