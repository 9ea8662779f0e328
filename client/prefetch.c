/*
 * prefetch.c — libprefetch: the trainer's end of the prefetchd protocol
 * (proto/PROTOCOL.md) and the consumer side of the depth governor.
 *
 * This file is the public API (prefetch.h).  The connection under it (the
 * socket, deadlines, frames, calls and hello) is conn.c.
 *
 * Taking a batch sends its Ack (the daemon may prepare another: the
 * governor's `consumed`), with the stall accounting of this client: time
 * blocked inside pf_next (wait) and time between calls (busy).  Releasing
 * sends Release; CUDA batches wait for the trainer's stream first through
 * the pending-release list (struct pfc_release): an event is recorded on
 * the stream, and the Release goes out from a later call once the event has
 * completed.  CUDA sessions also send the honest-depth Probe: free device
 * memory at each epoch's second batch (its first step has run), every
 * probe_interval_s the daemon asked for, and on pf_probe.
 *
 * A daemon that goes away is seen as EOF on the socket the moment the
 * kernel closes it, in whatever wait the caller is.  With reconnect_s the
 * session outlives its connection (prefetch.h, "Daemon restart"): the
 * connection's state (receive buffer, queue, pending releases, arenas, slot
 * marks) is dropped at once, but the arenas of batches the trainer still
 * holds are kept mapped in a retired generation (struct pfc_retired) until
 * the last of them is released; then the next call that needs the daemon
 * connects again with back-off, re-opens the session and restarts the
 * epoch at the first batch not taken, under the same epoch number.  Every
 * batch carries the generation of the connection it came on, so a release
 * never crosses from an old connection to a new one.
 *
 * DESIGN: no threads, no locks.  A struct pf_client belongs to the thread
 * that calls it, one at a time (prefetch.h says so); its lists, arena
 * mappings and receive buffer have no other owner.
 */
#include "client_int.h"
#include "pfcuda.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* ---- slots, arenas, batches -------------------------------------------------- */

static void free_batch(struct pfc_batch *b)
{
	if (!b)
		return;
	free(b->message);
	free(b);
}

static int send_release(struct pf_client *c, uint64_t epoch, uint64_t seq, int32_t slot)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__Release msg = PF__RELEASE__INIT;

	/* Unmark first: once the Release is out the daemon may announce the
	 * slot again, possibly within the read that follows. */
	if (slot >= 0 && (uint32_t)slot < c->slots)
		c->slot_mine[slot] = 0;
	msg.epoch = epoch;
	msg.seq = seq;
	msg.slot = slot;
	env.msg_case = PF__ENVELOPE__MSG_RELEASE;
	env.release = &msg;
	return pfc_send(c, &env);
}

/* Sends every pending release whose GPU work has retired.  With wait_ms > 0
 * it keeps polling that long for the rest (pf_close). */
static int flush_releases(struct pf_client *c, int wait_ms)
{
	int64_t deadline = pfc_deadline_after(wait_ms);
	int rc = 0;

	for (;;) {
		struct pfc_release **pp = &c->releases;

		while (*pp) {
			struct pfc_release *r = *pp;
			int done = r->done ? r->done(r->event) : 1;

			if (done == 0) {
				pp = &r->next;
				continue;
			}
			*pp = r->next;
			if (!c->dead) {
				int src = send_release(c, r->epoch, r->seq, r->slot);

				if (src && !rc)
					rc = src;
			}
			if (r->free_event)
				r->free_event(r->event);
			free(r);
		}
		if (!c->releases || wait_ms <= 0 || pfc_ms_left(deadline) == 0)
			return rc;
		usleep(100);
	}
}

/* Releases every batch received but not taken (an abandoned or replaced
 * epoch: the daemon expects them back). */
static int release_queue(struct pf_client *c)
{
	struct fifo_node *n;
	int rc = 0;

	while ((n = fifo_pop(&c->queue))) {
		struct pfc_batch *b = container_of(n, struct pfc_batch, queued);

		c->nqueued--;
		if (b->slot >= 0) {
			if (!c->dead) {
				int src = send_release(c, b->pub.epoch, b->pub.seq, b->slot);

				if (src && !rc)
					rc = src;
			} else {
				c->slot_mine[b->slot] = 0;
			}
		}
		free_batch(b);
	}
	return rc;
}

/* A device arena: imported once (its fd arrived with the frame, or its
 * legacy handle is in it) and cached for the session.  A session that
 * cannot map its arenas cannot deliver, so a failure breaks it. */
static int import_cuda_arena(struct pf_client *c, struct pfc_arena *a, const Pf__Arena *msg, int fd)
{
	char why[256];
	int rc;

	if (!c->cuda) {
		if (fd >= 0)
			close(fd);
		return pfc_conn_fail(c, -EPROTO,
				     "device arena %" PRIu32 " pushed to a host session", msg->id);
	}
	if (msg->bytes == 0) {
		if (fd >= 0)
			close(fd);
		return pfc_conn_fail(c, -EPROTO, "device arena %" PRIu32 " has no bytes", msg->id);
	}
	if (msg->kind == PF__ARENA_KIND__ARENA_CUDA_FD) {
		if (fd < 0)
			return pfc_conn_fail(
				c, -EPROTO,
				"device arena %" PRIu32 " arrived without its descriptor", msg->id);
		rc = pfcuda_import_fd(c->cuda, fd, msg->bytes, &a->garena, why, sizeof(why));
	} else {
		if (msg->legacy_handle.len != PFCUDA_IPC_HANDLE_BYTES)
			return pfc_conn_fail(c, -EPROTO,
					     "device arena %" PRIu32 " has a %zu-byte IPC handle",
					     msg->id, msg->legacy_handle.len);
		rc = pfcuda_import_legacy(c->cuda, msg->legacy_handle.data, msg->bytes, &a->garena,
					  why, sizeof(why));
	}
	if (rc)
		return pfc_conn_fail(c, rc,
				     "cannot map device arena %" PRIu32 " (%.1f MiB) of %s: %s",
				     msg->id, msg->bytes / 1048576.0, c->where, why);
	a->base = (void *)(uintptr_t)a->garena.base;
	a->bytes = msg->bytes;
	a->kind = (int)msg->kind;
	a->present = true;
	return 0;
}

static int map_host_arena(struct pf_client *c, struct pfc_arena *a, const Pf__Arena *msg)
{
	int fd = wire_rx_take_fd(&c->rx);
	struct stat st;
	int seals;
	void *base;
	int rc = 0;

	if (fd < 0)
		return pfc_conn_fail(c, -EPROTO,
				     "arena %" PRIu32 " arrived without its file descriptor",
				     msg->id);
	if (msg->bytes == 0 || msg->bytes > SIZE_MAX) {
		rc = pfc_conn_fail(c, -EPROTO,
				   "arena %" PRIu32 " has an impossible size of %" PRIu64 " bytes",
				   msg->id, msg->bytes);
		goto out;
	}
	/* Reading a mapping past the end of its file is SIGBUS, not an error
	 * code: so the memfd must be as large as announced and sealed against
	 * shrinking (the daemon seals it at creation). */
	if (fstat(fd, &st) < 0 || (uint64_t)st.st_size < msg->bytes) {
		rc = pfc_conn_fail(c, -EPROTO,
				   "arena %" PRIu32 " is smaller than the %" PRIu64
				   " bytes announced",
				   msg->id, msg->bytes);
		goto out;
	}
	seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
		rc = pfc_conn_fail(c, -EPROTO, "arena %" PRIu32 " is not sealed against shrinking",
				   msg->id);
		goto out;
	}
	base = mmap(NULL, (size_t)msg->bytes, PROT_READ, MAP_SHARED, fd, 0);
	if (base == MAP_FAILED) {
		rc = pfc_conn_fail(c, -errno,
				   "cannot map arena %" PRIu32 " (%" PRIu64 " bytes): %s", msg->id,
				   msg->bytes, strerror(errno));
		goto out;
	}
	a->base = base;
	a->bytes = msg->bytes;
	a->kind = PF__ARENA_KIND__ARENA_HOST_MEMFD;
	a->present = true;
out:
	close(fd);
	return rc;
}

static int add_arena(struct pf_client *c, const Pf__Arena *msg)
{
	struct pfc_arena *a;

	if (msg->id >= PFC_MAX_ARENAS)
		return pfc_conn_fail(c, -EPROTO, "arena id %" PRIu32 " is beyond this client's %u",
				     msg->id, PFC_MAX_ARENAS);
	if (msg->id >= c->narenas) {
		struct pfc_arena *t = realloc(c->arenas, (msg->id + 1) * sizeof(*t));

		if (!t)
			return pfc_conn_fail(c, -ENOMEM, "out of memory");
		memset(t + c->narenas, 0, (msg->id + 1 - c->narenas) * sizeof(*t));
		c->arenas = t;
		c->narenas = msg->id + 1;
	}
	a = &c->arenas[msg->id];
	if (a->present)
		return pfc_conn_fail(c, -EPROTO, "arena %" PRIu32 " was announced twice", msg->id);
	switch (msg->kind) {
	case PF__ARENA_KIND__ARENA_HOST_MEMFD: return map_host_arena(c, a, msg);
	case PF__ARENA_KIND__ARENA_CUDA_FD:
		/* Take its fd even though it is refused, so that the fds of
		 * later arenas still pair with their own frames. */
		return import_cuda_arena(c, a, msg, wire_rx_take_fd(&c->rx));
	case PF__ARENA_KIND__ARENA_CUDA_LEGACY: return import_cuda_arena(c, a, msg, -1);
	default:
		return pfc_conn_fail(c, -EPROTO, "arena %" PRIu32 " has unknown kind %d", msg->id,
				     (int)msg->kind);
	}
}

/* Checks a data batch against the session: its slot, its arena, and that
 * every field of `count` samples lies inside the slot, which lies inside the
 * arena.  The trainer dereferences these pointers, so nothing is trusted. */
static int check_data_batch(struct pf_client *c, const Pf__BatchReady *b)
{
	const struct pfc_arena *a;
	uint64_t end;

	if (!c->opened)
		return pfc_conn_fail(c, -EPROTO,
				     "batch %" PRIu64 "/%" PRIu64
				     " arrived before the session opened",
				     b->epoch, b->seq);
	if ((uint32_t)b->slot >= c->slots)
		return pfc_conn_fail(c, -EPROTO,
				     "batch %" PRIu64 "/%" PRIu64 " names slot %" PRId32
				     " of a session with %" PRIu32,
				     b->epoch, b->seq, b->slot, c->slots);
	if (c->slot_mine[b->slot])
		return pfc_conn_fail(c, -EPROTO,
				     "batch %" PRIu64 "/%" PRIu64 " reuses slot %" PRId32
				     " before its release",
				     b->epoch, b->seq, b->slot);
	if (b->arena >= c->narenas || !c->arenas[b->arena].present)
		return pfc_conn_fail(c, -EPROTO,
				     "batch %" PRIu64 "/%" PRIu64 " names arena %" PRIu32
				     ", which was never announced",
				     b->epoch, b->seq, b->arena);
	a = &c->arenas[b->arena];
	if (__builtin_add_overflow(b->offset, c->slot_bytes, &end) || end > a->bytes)
		return pfc_conn_fail(c, -EPROTO,
				     "batch %" PRIu64 "/%" PRIu64 " lies outside arena %" PRIu32,
				     b->epoch, b->seq, b->arena);
	if ((b->picks_le.len ? b->picks_le.len / sizeof(uint64_t) : b->n_picks) != b->count ||
	    b->picks_le.len % sizeof(uint64_t))
		return pfc_conn_fail(
			c, -EPROTO,
			"batch %" PRIu64 "/%" PRIu64 " carries %zu picks for %" PRIu32 " samples",
			b->epoch, b->seq,
			b->picks_le.len ? b->picks_le.len / sizeof(uint64_t) : b->n_picks,
			b->count);
	for (uint32_t f = 0; f < c->nfields; f++) {
		uint64_t bytes;

		if (__builtin_mul_overflow(c->fields[f].sample_bytes, (uint64_t)b->count, &bytes) ||
		    __builtin_add_overflow(bytes, c->fields[f].offset, &end) || end > c->slot_bytes)
			return pfc_conn_fail(c, -EPROTO,
					     "batch %" PRIu64 "/%" PRIu64 ": %" PRIu32
					     " samples of field %s do not fit a slot",
					     b->epoch, b->seq, b->count, c->fields[f].name);
	}
	return 0;
}

/* The batch's picks, from whichever field carries them (picks_le holds
 * little-endian uint64; picks, packed varints). */
static void copy_picks(uint64_t *out, const Pf__BatchReady *b)
{
	if (!b->picks_le.len) {
		memcpy(out, b->picks, b->count * sizeof(uint64_t));
		return;
	}
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	memcpy(out, b->picks_le.data, b->count * sizeof(uint64_t));
#else
	for (uint32_t i = 0; i < b->count; i++) {
		uint64_t v = 0;

		for (int k = 7; k >= 0; k--)
			v = v << 8 | b->picks_le.data[i * 8 + k];
		out[i] = v;
	}
#endif
}

static int add_batch(struct pf_client *c, const Pf__BatchReady *b)
{
	bool data = b->slot >= 0;
	struct pfc_batch *q;
	size_t extra;
	uint8_t *tail;
	int rc;

	if (b->error > 0 || (b->error == 0) != data)
		return pfc_conn_fail(c, -EPROTO,
				     "batch %" PRIu64 "/%" PRIu64 " has slot %" PRId32
				     " and error %" PRId32 " (a batch has a slot or an error < 0)",
				     b->epoch, b->seq, b->slot, b->error);
	if (data) {
		rc = check_data_batch(c, b);
		if (rc)
			return rc;
	}
	if (b->epoch != c->epoch || !c->epoch_live || c->epoch_ended)
		return data ? send_release(c, b->epoch, b->seq, b->slot) : 0;
	if (b->seq != c->next_seq)
		return pfc_conn_fail(c, -EPROTO,
				     "batch %" PRIu64 "/%" PRIu64
				     " arrived out of order (expected batch %" PRIu64 ")",
				     b->epoch, b->seq, c->next_seq);
	if (c->nqueued >= PFC_MAX_QUEUED)
		return pfc_conn_fail(c, -EPROTO, "%s sent more than %d batches that were not taken",
				     c->where, PFC_MAX_QUEUED);

	extra = data ? c->nfields * sizeof(void *) + b->count * sizeof(uint64_t) : 0;
	q = calloc(1, sizeof(*q) + extra);
	if (!q)
		return pfc_conn_fail(c, -ENOMEM, "out of memory");
	tail = (uint8_t *)(q + 1);
	q->gen = c->gen;
	q->pub.epoch = b->epoch;
	q->pub.seq = b->seq;
	q->slot = b->slot;
	q->error = b->error;
	if (data) {
		const struct pfc_arena *a = &c->arenas[b->arena];
		void **ptrs = (void **)tail;
		uint64_t *picks = (uint64_t *)(tail + c->nfields * sizeof(void *));

		for (uint32_t f = 0; f < c->nfields; f++) {
			ptrs[f] = (uint8_t *)a->base + b->offset + c->fields[f].offset;
			q->bytes += c->fields[f].sample_bytes * b->count;
		}
		copy_picks(picks, b);
		q->pub.count = b->count;
		q->pub.picks = picks;
		q->pub.nfields = c->nfields;
		q->pub.data = ptrs;
		q->pub.on_device = a->kind != PF__ARENA_KIND__ARENA_HOST_MEMFD;
		c->slot_mine[b->slot] = 1;
	} else {
		q->message = strdup(b->message ? b->message : "");
		if (!q->message) {
			free(q);
			return pfc_conn_fail(c, -ENOMEM, "out of memory");
		}
	}
	fifo_push(&c->queue, &q->queued);
	c->nqueued++;
	c->next_seq++;
	return 0;
}

/* Handles one push (id 0); takes env. */
int pfc_handle_push(struct pf_client *c, Pf__Envelope *env)
{
	int rc = 0;

	switch (env->msg_case) {
	case PF__ENVELOPE__MSG_ARENA: rc = add_arena(c, env->arena); break;
	case PF__ENVELOPE__MSG_BATCH: rc = add_batch(c, env->batch); break;
	case PF__ENVELOPE__MSG_END:
		if (env->end->epoch == c->epoch && c->epoch_live)
			c->epoch_ended = true;
		break;
	case PF__ENVELOPE__MSG_ERROR:
		/* A refused Ack or Release.  The first one is kept: it is the
		 * cause, later ones are usually its consequences. */
		if (!c->pending_err) {
			c->pending_err = pfc_sane_code(env->error->code);
			snprintf(c->pending_msg, sizeof(c->pending_msg), "prefetchd: %s",
				 env->error->message ? env->error->message : "");
		}
		break;
	default:
		rc = pfc_conn_fail(c, -EPROTO, "%s pushed an unexpected %s message", c->where,
				   wire_msg_name(env->msg_case));
		break;
	}
	pf__envelope__free_unpacked(env, NULL);
	return rc;
}

/* ---- connecting -------------------------------------------------------------- */

PF_API int pf_connect(const char *path, struct pf_client **out)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int64_t deadline = pfc_deadline_after(PFC_HELLO_TIMEOUT_MS);
	struct pf_client *c;
	char where[sizeof(sa.sun_path) + 32];
	int sock;

	if (!out)
		return -EINVAL;
	if (!path || !*path)
		path = getenv(PF_SOCKET_ENV);
	if (!path || !*path)
		path = PF_DEFAULT_SOCKET;
	snprintf(where, sizeof(where), "prefetchd at %.*s", (int)sizeof(sa.sun_path), path);
	c = pfc_client_new(where);
	*out = c;
	if (!c)
		return -ENOMEM;
	if (strlen(path) >= sizeof(sa.sun_path))
		return pfc_conn_fail(c, -ENAMETOOLONG,
				     "socket path %s is too long (at most %zu bytes)", path,
				     sizeof(sa.sun_path) - 1);
	memcpy(sa.sun_path, path, strlen(path) + 1);
	/* Kept for reconnection: the restarted daemon listens on the same path. */
	c->path = strdup(path);
	if (!c->path)
		return pfc_conn_fail(c, -ENOMEM, "out of memory");
	sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (sock < 0)
		return pfc_conn_fail(c, -errno, "cannot create a socket: %s", strerror(errno));
	c->sock = sock;
	/* A non-blocking connect on a Unix socket fails with EAGAIN while the
	 * daemon's listen backlog is full; retry until the hello deadline
	 * rather than block inside connect() for ever. */
	while (connect(sock, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int e = errno;

		if (e == EINTR)
			continue;
		if (e == EAGAIN && pfc_ms_left(deadline) > 0) {
			usleep(10000);
			continue;
		}
		return pfc_conn_fail(c, -e, "cannot connect to prefetchd at %s: %s%s", path,
				     strerror(e),
				     e == ENOENT || e == ECONNREFUSED ? " (is the daemon running?)"
				     : e == EACCES ? " (is this user allowed to use the socket?)"
						   : "");
	}
	return pfc_hello(c, PFC_HELLO_TIMEOUT_MS);
}

/* ---- session ------------------------------------------------------------------ */

static int keep_session(struct pf_client *c, const Pf__SessionOpened *so)
{
	if (so->slots > PFC_MAX_SLOTS)
		return pfc_conn_fail(c, -EPROTO,
				     "session with %" PRIu32 " slots is over this client's %u",
				     so->slots, PFC_MAX_SLOTS);
	if (so->n_fields > 4096)
		return pfc_conn_fail(c, -EPROTO, "session with %zu fields", so->n_fields);
	c->fields = calloc(so->n_fields ? so->n_fields : 1, sizeof(*c->fields));
	c->slot_mine = calloc(so->slots ? so->slots : 1, 1);
	c->device = strdup(so->device && *so->device ? so->device : "host");
	if (!c->fields || !c->slot_mine || !c->device)
		return pfc_conn_fail(c, -ENOMEM, "out of memory");
	c->nfields = (uint32_t)so->n_fields;
	for (size_t f = 0; f < so->n_fields; f++) {
		const Pf__Field *in = so->fields[f];
		struct pfc_field *out = &c->fields[f];

		out->name = strdup(in->name ? in->name : "");
		out->dtype = strdup(in->dtype ? in->dtype : "");
		out->shape = calloc(in->n_shape ? in->n_shape : 1, sizeof(uint64_t));
		if (!out->name || !out->dtype || !out->shape)
			return pfc_conn_fail(c, -ENOMEM, "out of memory");
		if (in->n_shape > 32)
			return pfc_conn_fail(c, -EPROTO, "field %s has %zu dimensions", out->name,
					     in->n_shape);
		/* A scalar field has no shape, and in->shape is NULL then. */
		if (in->n_shape)
			memcpy(out->shape, in->shape, in->n_shape * sizeof(uint64_t));
		out->ndim = (int)in->n_shape;
		out->sample_bytes = in->sample_bytes;
		out->offset = in->offset;
	}
	c->session = so->session;
	c->num_samples = so->num_samples;
	c->slot_bytes = so->slot_bytes;
	c->slots = so->slots;
	c->probe_interval_s = so->probe_interval_s;
	c->opened = true;
	return 0;
}

/* A session opened again after a restart.  The trainer has read the shape
 * and the epoch goes on with the same picks, so the dataset must be the
 * same; slots, offsets and the session id may differ. */
static int refresh_session(struct pf_client *c, const Pf__SessionOpened *so)
{
	bool same = so->num_samples == c->num_samples && so->n_fields == c->nfields;
	char *device;
	uint8_t *marks;

	for (size_t f = 0; same && f < so->n_fields; f++) {
		const Pf__Field *in = so->fields[f];
		const struct pfc_field *had = &c->fields[f];

		same = !strcmp(in->name ? in->name : "", had->name) &&
		       !strcmp(in->dtype ? in->dtype : "", had->dtype) &&
		       in->n_shape == (size_t)had->ndim &&
		       (!had->ndim ||
			!memcmp(in->shape, had->shape, had->ndim * sizeof(uint64_t))) &&
		       in->sample_bytes == had->sample_bytes;
	}
	if (!same)
		return pfc_set_err(c, -ESTALE,
				   "%s now serves dataset %s with another shape (%" PRIu64
				   " samples, %zu fields; the session had %" PRIu64 " and %" PRIu32
				   "): its epoch cannot go on",
				   c->where, c->open_opts.dataset, so->num_samples, so->n_fields,
				   c->num_samples, c->nfields);
	if (so->slots > PFC_MAX_SLOTS)
		return pfc_conn_fail(c, -EPROTO,
				     "session with %" PRIu32 " slots is over this client's %u",
				     so->slots, PFC_MAX_SLOTS);
	marks = calloc(so->slots ? so->slots : 1, 1);
	device = strdup(so->device && *so->device ? so->device : "host");
	if (!marks || !device) {
		free(marks);
		free(device);
		return pfc_conn_fail(c, -ENOMEM, "out of memory");
	}
	free(c->slot_mine);
	c->slot_mine = marks;
	free(c->device);
	c->device = device;
	for (size_t f = 0; f < so->n_fields; f++)
		c->fields[f].offset = so->fields[f]->offset;
	c->session = so->session;
	c->slot_bytes = so->slot_bytes;
	c->slots = so->slots;
	c->probe_interval_s = so->probe_interval_s;
	return 0;
}

static void free_open_opts(struct pf_client *c)
{
	free((char *)c->open_opts.dataset);
	free((char *)c->open_opts.device);
	free((char *)c->open_opts.name);
	memset(&c->open_opts, 0, sizeof(c->open_opts));
}

/* pf_open's options, kept for opening the session again after a restart. */
static int keep_open_opts(struct pf_client *c, const struct pf_open_opts *opts)
{
	struct pf_open_opts *k = &c->open_opts;

	*k = *opts;
	k->dataset = strdup(opts->dataset);
	k->device = strdup(opts->device ? opts->device : "host");
	k->name = strdup(opts->name ? opts->name : c->hello_name);
	if (!k->dataset || !k->device || !k->name) {
		free_open_opts(c);
		return pfc_set_err(c, -ENOMEM, "out of memory");
	}
	return 0;
}

/* OpenSession with the kept options. */
static int send_open(struct pf_client *c, Pf__Envelope **reply)
{
	const struct pf_open_opts *o = &c->open_opts;
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__OpenSession msg = PF__OPEN_SESSION__INIT;

	msg.dataset = (char *)o->dataset;
	msg.device = (char *)o->device;
	msg.batch_size = o->batch_size;
	msg.picks_le = true; /* copy_picks reads either form */
	msg.drop_last = o->drop_last;
	msg.augment = o->augment;
	msg.min_depth = o->min_depth;
	msg.max_depth = o->max_depth;
	msg.ipc = (Pf__Ipc)o->ipc;
	msg.name = (char *)o->name;
	if (c->pci_bus_id[0])
		msg.pci_bus_id = c->pci_bus_id;
	env.msg_case = PF__ENVELOPE__MSG_OPEN;
	env.open = &msg;
	return pfc_call(c, &env, PF__ENVELOPE__MSG_OPENED, reply);
}

PF_API int pf_open(struct pf_client *c, const struct pf_open_opts *opts)
{
	Pf__Envelope *reply;
	char why[256];
	int rc;

	if (!c)
		return -EINVAL;
	if (c->dead)
		return pfc_fail_dead(c);
	if (!opts || !opts->dataset || !*opts->dataset)
		return pfc_set_err(c, -EINVAL, "pf_open: no dataset named");
	if (c->opened)
		return pfc_set_err(c, -EBUSY, "pf_open: this client already has session %" PRIu64,
				   c->session);
	/* The negation also refuses NaN. */
	if (!(opts->reconnect_s >= 0 && opts->reconnect_s <= 1e9))
		return pfc_set_err(c, -EINVAL, "pf_open: reconnect_s %g is not a number of seconds",
				   opts->reconnect_s);
	if (opts->reconnect_s > 0 && !c->path)
		return pfc_set_err(
			c, -EINVAL,
			"pf_open: reconnect_s needs a client made by pf_connect (a socket "
			"path to connect to again)");
	if (opts->device && strncmp(opts->device, "cuda:", 5) == 0) {
		char *end;
		long n;

		errno = 0;
		n = strtol(opts->device + 5, &end, 10);
		if (end == opts->device + 5 || *end || n < 0 || n > INT_MAX || errno)
			return pfc_set_err(
				c, -EINVAL,
				"pf_open: unknown device '%s' (use \"host\" or \"cuda:N\")",
				opts->device);
		/* The driver is loaded here, on the first CUDA session. */
		rc = pfcuda_open((int)n, &c->cuda, why, sizeof(why));
		if (rc)
			return pfc_set_err(c, rc, "pf_open: %s: %s", opts->device, why);
		if (pfcuda_pci_bus_id(c->cuda, c->pci_bus_id, sizeof(c->pci_bus_id), NULL, 0) != 0)
			c->pci_bus_id[0] = '\0';
	}
	rc = keep_open_opts(c, opts);
	if (!rc)
		rc = send_open(c, &reply);
	if (rc) {
		free_open_opts(c);
		pfcuda_close(c->cuda);
		c->cuda = NULL;
		c->pci_bus_id[0] = '\0';
		return rc;
	}
	rc = keep_session(c, reply->opened);
	pf__envelope__free_unpacked(reply, NULL);
	return rc;
}

PF_API uint64_t pf_num_samples(const struct pf_client *c)
{
	return c && c->opened ? c->num_samples : 0;
}

PF_API uint32_t pf_num_fields(const struct pf_client *c)
{
	return c && c->opened ? c->nfields : 0;
}

PF_API int pf_field_info(const struct pf_client *c, uint32_t i, struct pf_field *out)
{
	if (!c || !out || !c->opened || i >= c->nfields)
		return -EINVAL;
	out->name = c->fields[i].name;
	out->dtype = c->fields[i].dtype;
	out->ndim = c->fields[i].ndim;
	out->shape = c->fields[i].shape;
	out->sample_bytes = c->fields[i].sample_bytes;
	return 0;
}

/*
 * StartEpoch for the epoch on record (c->epoch and how it was started) at
 * start_batch.  Batches that arrive meanwhile for it are queued; if it is
 * refused (or gets no answer) no epoch runs here, and whatever arrived for
 * it goes back.  The daemon's error stays in pf_errmsg: release_queue only
 * sets a message if it fails.
 */
static int send_start(struct pf_client *c, uint64_t start_batch, const uint64_t *indices,
		      size_t nindices, uint64_t *batches)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__StartEpoch msg = PF__START_EPOCH__INIT;
	Pf__Envelope *reply;
	int rc;

	c->epoch_live = true;
	c->epoch_ended = false;
	c->next_seq = start_batch;
	msg.epoch = c->epoch;
	msg.order = (Pf__Order)c->epoch_order;
	msg.seed = c->epoch_seed;
	msg.rank = c->epoch_rank;
	msg.world = c->epoch_world;
	msg.start_batch = start_batch;
	msg.n_indices = nindices;
	msg.indices = (uint64_t *)indices;
	env.msg_case = PF__ENVELOPE__MSG_START;
	env.start = &msg;
	rc = pfc_call(c, &env, PF__ENVELOPE__MSG_STARTED, &reply);
	if (rc) {
		c->epoch_live = false;
		release_queue(c);
		return rc;
	}
	if (reply->started->epoch != c->epoch)
		rc = pfc_conn_fail(c, -EPROTO,
				   "%s started epoch %" PRIu64 " when asked for %" PRIu64, c->where,
				   reply->started->epoch, c->epoch);
	else if (batches)
		*batches = reply->started->batches;
	pf__envelope__free_unpacked(reply, NULL);
	return rc;
}

/* The honest-depth probe: free device memory now, as the trainer sees it. */
static int send_probe(struct pf_client *c)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__Probe msg = PF__PROBE__INIT;
	uint64_t free_b, total_b;
	char err[200];
	int rc;

	c->last_probe_ns = mono();
	rc = pfcuda_mem_info(c->cuda, &free_b, &total_b, err, sizeof(err));
	if (rc)
		return pfc_set_err(c, rc, "probe: %s", err);
	msg.free_bytes = free_b;
	msg.total_bytes = total_b;
	env.msg_case = PF__ENVELOPE__MSG_PROBE;
	env.probe = &msg;
	return pfc_send(c, &env);
}

/* ---- reconnecting ----------------------------------------------------------------- */

/* Back-off between tries: the first at once, then 50 ms doubling to 1 s.
 * A daemon that comes back is found within a second of listening again,
 * and a node without one costs a try a second. */
#define RECONNECT_FIRST_MS 50
#define RECONNECT_MAX_MS   1000
/* One call reconnects at most this often before it returns the error: a
 * daemon that dies on the same request every time must not keep a call
 * spinning for ever (the next call tries again). */
#define RECONNECTS_PER_CALL 3

/* Whether a broken connection is to be brought back (or already is being):
 * the trainer asked for it, there is a socket path and a session to
 * re-open, and neither reconnect_s nor a refusal has ended it. */
static bool reconnecting(const struct pf_client *c)
{
	return c->open_opts.reconnect_s > 0 && c->path && c->opened && !c->given_up;
}

/* Unmaps an arena table and frees it.  Device arenas go after every queued
 * kernel has finished: the trainer's released work may still read them. */
static void unmap_arenas(struct pf_client *c, struct pfc_arena *arenas, uint32_t n)
{
	bool synced = false;

	for (uint32_t a = 0; a < n; a++) {
		struct pfc_arena *ar = &arenas[a];

		if (!ar->present)
			continue;
		if (ar->kind == PF__ARENA_KIND__ARENA_HOST_MEMFD) {
			munmap(ar->base, (size_t)ar->bytes);
			continue;
		}
		if (!synced)
			pfcuda_sync(c->cuda, NULL, 0);
		synced = true;
		pfcuda_unmap(c->cuda, &ar->garena, NULL, 0);
	}
	free(arenas);
}

/* A held batch of a broken connection is gone: the last one unmaps its
 * generation's arenas. */
static void retired_put(struct pf_client *c, uint64_t gen)
{
	for (struct pfc_retired **pp = &c->retired; *pp; pp = &(*pp)->next) {
		struct pfc_retired *r = *pp;

		if (r->gen != gen)
			continue;
		if (--r->users == 0) {
			*pp = r->next;
			unmap_arenas(c, r->arenas, r->narenas);
			free(r);
		}
		return;
	}
}

/* Drops what belongs to the current connection only: the queue (never
 * taken, so fetched again), pending releases (their slots die with the
 * daemon; the unmapping of their arenas waits for the device instead) and
 * the arenas, which are kept while the trainer holds batches in them. */
static void drop_connection(struct pf_client *c)
{
	struct pfc_retired *r;
	uint32_t users = 0;

	release_queue(c);
	while (c->releases) {
		struct pfc_release *rel = c->releases;

		c->releases = rel->next;
		if (rel->free_event)
			rel->free_event(rel->event);
		free(rel);
	}
	for (struct pfc_batch *b = c->held; b; b = b->next)
		users += b->gen == c->gen;
	if (c->narenas && users) {
		r = calloc(1, sizeof(*r));
		/* Without memory to track them the arenas stay mapped until the
		 * process ends: a leak, where unmapping them would fault the
		 * trainer. */
		if (r) {
			r->gen = c->gen;
			r->arenas = c->arenas;
			r->narenas = c->narenas;
			r->users = users;
			r->next = c->retired;
			c->retired = r;
		}
	} else {
		unmap_arenas(c, c->arenas, c->narenas);
	}
	c->arenas = NULL;
	c->narenas = 0;
	if (c->slot_mine)
		memset(c->slot_mine, 0, c->slots ? c->slots : 1);
	c->gen++;
}

/* The connection has just been found broken: a reconnecting client
 * starts counting reconnect_s and lets go of the connection's state. */
static void note_outage(struct pf_client *c)
{
	if (!c->dead || c->down || !reconnecting(c))
		return;
	c->down = true;
	c->outage_rc = c->dead;
	snprintf(c->outage_msg, sizeof(c->outage_msg), "%s", c->dead_msg);
	c->down_since_ns = c->next_try_ns = mono();
	c->backoff_ms = 0;
	c->tries = 0;
	snprintf(c->try_msg, sizeof(c->try_msg), "none yet");
	/* An epoch whose end came and whose batches were all taken is over;
	 * any other live epoch starts again at resume_seq.  Not live until
	 * then: nothing can arrive for it in between anyway. */
	c->resume_pending = c->epoch_live && (c->queue.head || !c->epoch_ended);
	if (c->resume_pending)
		c->epoch_live = false;
	drop_connection(c);
}

/* One try: a new socket, hello, the session opened again with pf_open's
 * options, its depth if the trainer set one, and the interrupted epoch
 * started again.  0; or -errno, with *final when trying again cannot help
 * (the daemon refused, or now serves another shape). */
static int reconnect_once(struct pf_client *c, int64_t giveup, bool *final)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int sock, rc, left;

	*final = false;
	/* pf_connect checked that the path fits. */
	memcpy(sa.sun_path, c->path, strlen(c->path) + 1);
	sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (sock < 0)
		return pfc_set_err(c, -errno, "cannot create a socket: %s", strerror(errno));
	while (connect(sock, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		rc = -errno;
		if (rc == -EINTR)
			continue;
		close(sock);
		/* ENOENT and ECONNREFUSED while the daemon is down; EAGAIN
		 * while its backlog is full; even EACCES for a moment between
		 * its bind and its chmod.  All worth another try. */
		return pfc_set_err(c, rc, "cannot connect to %s: %s", c->path, strerror(-rc));
	}
	/* A fresh connection: what the broken one left unread goes with it. */
	wire_rx_free(&c->rx);
	wire_rx_init(&c->rx, WIRE_MAX_FRAME_DEFAULT);
	c->sock = sock;
	c->dead = 0;
	c->dead_msg[0] = '\0';
	c->greeted = false;
	c->pending_err = 0;
	c->max_frame = WIRE_MAX_FRAME_DEFAULT;
	left = pfc_ms_left(giveup);
	rc = pfc_hello(c, left < 1 ? 1 : left < PFC_HELLO_TIMEOUT_MS ? left : PFC_HELLO_TIMEOUT_MS);
	if (!rc) {
		Pf__Envelope *reply;

		rc = send_open(c, &reply);
		if (!rc) {
			rc = refresh_session(c, reply->opened);
			pf__envelope__free_unpacked(reply, NULL);
		}
	}
	if (!rc && c->own_target_set) {
		Pf__Envelope env = PF__ENVELOPE__INIT;
		Pf__SetDepth msg = PF__SET_DEPTH__INIT;

		msg.target = c->own_target;
		msg.automatic = c->own_target == 0;
		env.msg_case = PF__ENVELOPE__MSG_SET_DEPTH;
		env.set_depth = &msg;
		rc = pfc_call(c, &env, PF__ENVELOPE__MSG_OK, NULL);
	}
	if (!rc && c->resume_pending && c->epoch_order == PF_ORDER_PACED) {
		/* The requests not yet delivered lived in the old daemon. */
		c->resume_pending = false;
		c->refused = true;
		rc = pfc_set_err(c, -ECONNRESET,
				 "prefetchd at %s restarted: a paced epoch's requests went with it "
				 "(start a new epoch)",
				 c->path);
	}
	if (!rc && c->resume_pending) {
		rc = send_start(c, c->resume_seq, c->epoch_indices, c->epoch_nindices, NULL);
		if (!rc)
			c->resume_pending = false;
	}
	if (!rc) {
		/* The new daemon knows nothing of this trainer's memory yet; the
		 * trainer is past its first step, so the figure is honest now.
		 * Best effort, as every probe. */
		if (c->cuda)
			send_probe(c);
		return 0;
	}
	/* The daemon's own refusal, a dataset of another shape or another
	 * protocol will be the same next time; a connection that broke or
	 * timed out may not. */
	*final = c->refused ||
		 !(rc == -ECONNRESET || rc == -EPIPE || rc == -ETIMEDOUT || rc == -ENOMEM);
	if (!c->dead)
		pfc_conn_fail(c, rc, "%s", c->err);
	drop_connection(c);
	return rc;
}

static void sleep_until(int64_t t)
{
	int64_t left = t - mono();
	struct timespec ts;

	if (left <= 0)
		return;
	ts.tv_sec = left / 1000000000;
	ts.tv_nsec = left % 1000000000;
	nanosleep(&ts, NULL); /* EINTR: the caller's loop looks at the clock again */
}

/* reconnect_s has run out, or the daemon refused: the error is final. */
static int give_up(struct pf_client *c, bool refused)
{
	char msg[PFC_ERRMSG_LEN];
	int rc = refused && c->dead ? c->dead : c->outage_rc;

	if (refused)
		snprintf(msg, sizeof(msg),
			 "%.200s; the daemon there now refuses the session: %.250s", c->outage_msg,
			 c->try_msg);
	else
		snprintf(msg, sizeof(msg),
			 "%.200s; no daemon took the session back within %g s (%u tries, the "
			 "last: %.200s)",
			 c->outage_msg, c->open_opts.reconnect_s, c->tries, c->try_msg);
	c->given_up = true;
	c->dead = rc;
	snprintf(c->dead_msg, sizeof(c->dead_msg), "%s", msg);
	snprintf(c->err, sizeof(c->err), "%s", msg);
	return rc;
}

/*
 * Brings a broken connection back, trying until deadline (-1: none) at the
 * latest; 0 once the session is open again (and its epoch restarted).  A
 * client that does not reconnect gets the connection's error; one whose
 * deadline comes first gets -ETIMEDOUT and stays down, to go on with the
 * next call, until reconnect_s has passed since the connection broke.
 */
static int revive(struct pf_client *c, int64_t deadline)
{
	int64_t giveup;

	if (!c->dead)
		return 0;
	if (!reconnecting(c))
		return pfc_fail_dead(c);
	note_outage(c);
	giveup = c->down_since_ns + (int64_t)(c->open_opts.reconnect_s * 1e9);
	for (;;) {
		int64_t now = mono(), wake;
		bool final;
		int rc;

		if (now >= giveup)
			return give_up(c, false);
		if (now >= c->next_try_ns) {
			rc = reconnect_once(c, giveup, &final);
			if (!rc) {
				c->down = false;
				c->reconnects++;
				return 0;
			}
			c->tries++;
			snprintf(c->try_msg, sizeof(c->try_msg), "%s", c->err);
			if (final)
				return give_up(c, true);
			c->backoff_ms = c->backoff_ms ? c->backoff_ms * 2 : RECONNECT_FIRST_MS;
			if (c->backoff_ms > RECONNECT_MAX_MS)
				c->backoff_ms = RECONNECT_MAX_MS;
			c->next_try_ns = mono() + (int64_t)c->backoff_ms * 1000000;
			continue;
		}
		wake = c->next_try_ns < giveup ? c->next_try_ns : giveup;
		if (deadline >= 0 && deadline < wake) {
			sleep_until(deadline);
			return pfc_set_err(c, -ETIMEDOUT,
					   "%.200s; reconnecting for %.1f s (%u tries, the last: "
					   "%.200s)",
					   c->outage_msg, (mono() - c->down_since_ns) / 1e9,
					   c->tries, c->try_msg);
		}
		sleep_until(wake);
	}
}

/* ---- epochs ------------------------------------------------------------------- */

static int start_epoch_once(struct pf_client *c, const struct pf_epoch_opts *opts,
			    uint64_t *batches)
{
	int rc;

	/* The daemon abandons a running epoch when the next one starts; here
	 * its queued batches go back, and any still on the way are released
	 * on arrival because their epoch is no longer current. */
	c->epoch_live = false;
	rc = release_queue(c);
	if (rc)
		return rc;
	c->epoch = ++c->last_epoch;
	c->epoch_batches = 0;
	c->paced_requested = 0;
	c->paced_ended = false;
	c->epoch_order = opts->order;
	c->epoch_seed = opts->seed;
	c->epoch_rank = opts->rank;
	c->epoch_world = opts->world;
	c->resume_seq = opts->start_batch;
	free(c->epoch_indices);
	c->epoch_indices = NULL;
	c->epoch_nindices = 0;
	/* An explicit order is the caller's memory, valid only for this call;
	 * a restart needs it again. */
	if (opts->nindices && reconnecting(c)) {
		c->epoch_indices = malloc(opts->nindices * sizeof(uint64_t));
		if (!c->epoch_indices)
			return pfc_set_err(c, -ENOMEM, "out of memory for %zu indices",
					   opts->nindices);
		memcpy(c->epoch_indices, opts->indices, opts->nindices * sizeof(uint64_t));
		c->epoch_nindices = opts->nindices;
	}
	return send_start(c, opts->start_batch, opts->indices, opts->nindices, batches);
}

static int send_load(struct pf_client *c, const uint64_t *picks, size_t n, bool end)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__LoadBatch msg = PF__LOAD_BATCH__INIT;

	if (c->dead)
		return pfc_fail_dead(c);
	if (!c->epoch_live || c->epoch_order != PF_ORDER_PACED || c->paced_ended)
		return pfc_set_err(c, -EINVAL,
				   "%s: no paced epoch is taking requests (pf_start_epoch with "
				   "PF_ORDER_PACED, before pf_load_end)",
				   end ? "pf_load_end" : "pf_load");
	msg.epoch = c->epoch;
	msg.n_picks = n;
	msg.picks = (uint64_t *)picks;
	msg.end = end;
	env.msg_case = PF__ENVELOPE__MSG_LOAD;
	env.load = &msg;
	return pfc_send(c, &env);
}

PF_API int pf_load(struct pf_client *c, const uint64_t *picks, size_t n)
{
	int rc;

	if (!c || (n && !picks))
		return -EINVAL;
	if (c->paced_requested - c->epoch_batches >= PF_PACED_MAX)
		return pfc_set_err(c, -EAGAIN,
				   "pf_load: %d batches requested and not taken; take one first",
				   PF_PACED_MAX);
	rc = send_load(c, picks, n, false);
	if (!rc)
		c->paced_requested++;
	return rc;
}

PF_API int pf_load_end(struct pf_client *c)
{
	int rc;

	if (!c)
		return -EINVAL;
	rc = send_load(c, NULL, 0, true);
	if (!rc)
		c->paced_ended = true;
	return rc;
}

PF_API int pf_start_epoch(struct pf_client *c, const struct pf_epoch_opts *opts, uint64_t *batches)
{
	int revived = 0, rc;

	if (!c)
		return -EINVAL;
	if (c->dead && !reconnecting(c))
		return pfc_fail_dead(c);
	if (!c->opened)
		return pfc_set_err(c, -EINVAL, "pf_start_epoch: no session (call pf_open first)");
	if (!opts || (opts->nindices && !opts->indices))
		return pfc_set_err(c, -EINVAL, "pf_start_epoch: %s",
				   opts ? "nindices without indices" : "no options");
	if (opts->order != PF_ORDER_EXPLICIT && opts->nindices)
		return pfc_set_err(c, -EINVAL,
				   "pf_start_epoch: indices given without "
				   "PF_ORDER_EXPLICIT");
	if (opts->order == PF_ORDER_PACED && (opts->start_batch || opts->world > 1))
		return pfc_set_err(c, -EINVAL,
				   "pf_start_epoch: a paced epoch takes no start_batch or world "
				   "(pf_load chooses every batch)");
	for (;;) {
		if (c->dead) {
			/* This epoch replaces the interrupted one, which is
			 * therefore not started again. */
			note_outage(c);
			c->resume_pending = false;
			rc = revive(c, -1);
			if (rc)
				return rc;
		}
		rc = start_epoch_once(c, opts, batches);
		if (!rc || !c->dead || !reconnecting(c) || ++revived > RECONNECTS_PER_CALL)
			return rc;
	}
}

/* Probes at every epoch's second batch (the trainer's first step of the
 * epoch has run: an evaluation pass or a grown model shows), and in between
 * every probe_interval_s.  Best effort: a failed read only skips this one. */
static void maybe_probe(struct pf_client *c)
{
	int64_t now;

	if (!c->cuda || c->epoch_batches < 2)
		return;
	if (c->epoch_batches == 2) {
		send_probe(c);
		return;
	}
	now = mono();
	if (c->last_probe_ns &&
	    (c->probe_interval_s <= 0 || now - c->last_probe_ns < c->probe_interval_s * 1e9))
		return;
	send_probe(c);
}

PF_API int pf_probe(struct pf_client *c)
{
	int revived = 0, rc;

	if (!c)
		return -EINVAL;
	if (!c->cuda)
		return pfc_set_err(c, -EINVAL, "pf_probe: not a CUDA session");
	for (;;) {
		rc = revive(c, -1);
		if (rc)
			return rc;
		rc = send_probe(c);
		if (!rc || !c->dead || !reconnecting(c) || ++revived > RECONNECTS_PER_CALL)
			return rc;
	}
}

static int event_done(void *event)
{
	struct pfc_event *e = event;
	int rc = pfcuda_event_query(e->c->cuda, e->ev, NULL, 0);

	return rc == 0 ? 1 : rc == -EAGAIN ? 0 : rc;
}

static void event_put(void *event)
{
	struct pfc_event *e = event;

	e->next = e->c->events;
	e->c->events = e;
}

/* Queues the release of a device batch behind the work queued on stream so
 * far.  0, or -errno with the batch still held by the caller. */
static int release_after(struct pf_client *c, struct pfc_batch *b, void *stream)
{
	struct pfc_release *r = calloc(1, sizeof(*r));
	struct pfc_event *e = c->events;
	char why[256];
	int rc;

	if (!r)
		return pfc_set_err(c, -ENOMEM, "out of memory");
	if (e) {
		c->events = e->next;
	} else {
		e = calloc(1, sizeof(*e));
		if (!e) {
			free(r);
			return pfc_set_err(c, -ENOMEM, "out of memory");
		}
		e->c = c;
		rc = pfcuda_event_create(c->cuda, &e->ev, why, sizeof(why));
		if (rc) {
			free(e);
			free(r);
			return pfc_set_err(c, rc, "pf_release: %s", why);
		}
	}
	rc = pfcuda_event_record(c->cuda, e->ev, stream, why, sizeof(why));
	if (rc) {
		event_put(e);
		free(r);
		return pfc_set_err(c, rc, "pf_release: cannot record on stream %p: %s", stream,
				   why);
	}
	r->epoch = b->pub.epoch;
	r->seq = b->pub.seq;
	r->slot = b->slot;
	r->event = e;
	r->done = event_done;
	r->free_event = event_put;
	r->next = c->releases;
	c->releases = r;
	return 0;
}

/* Takes the head of the queue: acks it and hands it to the trainer. */
static int take(struct pf_client *c, struct pf_batch **batch)
{
	struct pfc_batch *b = container_of(fifo_pop(&c->queue), struct pfc_batch, queued);
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__Ack ack = PF__ACK__INIT;
	int rc;

	c->nqueued--;

	ack.epoch = b->pub.epoch;
	ack.seq = b->pub.seq;
	ack.wait_s = c->wait_s;
	ack.busy_s = c->busy_s;
	env.msg_case = PF__ENVELOPE__MSG_ACK;
	env.ack = &ack;
	rc = pfc_send(c, &env);
	if (rc) {
		/* Not taken: a restarted epoch delivers it again. */
		if (b->slot >= 0)
			c->slot_mine[b->slot] = 0;
		free_batch(b);
		return rc;
	}
	c->resume_seq = b->pub.seq + 1;
	if (b->error) {
		c->epoch_batches++; /* taken, as far as paced requests go */
		rc = pfc_set_err(c, b->error, "batch %" PRIu64 "/%" PRIu64 ": %s", b->pub.epoch,
				 b->pub.seq, b->message);
		free_batch(b);
		return rc;
	}
	b->next = c->held;
	c->held = b;
	c->nheld++;
	c->batches++;
	c->epoch_batches++;
	c->bytes += b->bytes;
	*batch = &b->pub;
	maybe_probe(c);
	return 0;
}

/* Waits until deadline for the queue to have a batch or the epoch to end
 * (0 either way), or for an error. */
static int wait_batch(struct pf_client *c, int64_t deadline, int timeout_ms, int64_t *blocked_since)
{
	int rc;

	if (c->dead)
		return pfc_fail_dead(c);
	rc = flush_releases(c, 0);
	if (rc)
		return rc;
	for (;;) {
		Pf__Envelope *env;

		if (c->pending_err) {
			rc = pfc_set_err(c, c->pending_err, "%s", c->pending_msg);
			c->pending_err = 0;
			return rc;
		}
		if (c->queue.head || !c->epoch_live || c->epoch_ended)
			return 0;
		if (!*blocked_since)
			*blocked_since = mono();
		/* Releases waiting for the GPU may be what the daemon needs to
		 * send the next batch (every slot can be held by them): wait in
		 * short slices and send each one as its work retires. */
		if (c->releases) {
			int64_t slice = mono() + PFC_RELEASE_POLL_NS;

			rc = pfc_read_env(c, deadline >= 0 && deadline < slice ? deadline : slice,
					  &env);
			if (rc == -ETIMEDOUT && (deadline < 0 || mono() < deadline)) {
				rc = flush_releases(c, 0);
				if (rc)
					return rc;
				continue;
			}
		} else {
			rc = pfc_read_env(c, deadline, &env);
		}
		if (rc == -ETIMEDOUT)
			return pfc_set_err(c, rc, "no batch from %s within %d ms", c->where,
					   timeout_ms);
		if (rc)
			return rc;
		if (env->id != 0) {
			/* The reply to a request that timed out earlier. */
			pf__envelope__free_unpacked(env, NULL);
			continue;
		}
		rc = pfc_handle_push(c, env);
		if (rc)
			return rc;
	}
}

static int next_batch(struct pf_client *c, int timeout_ms, struct pf_batch **batch)
{
	int64_t deadline = pfc_deadline_after(timeout_ms);
	int revived = 0;
	int rc;

	if (c->dead && !reconnecting(c))
		return pfc_fail_dead(c);
	if (!c->opened)
		return pfc_set_err(c, -EINVAL, "pf_next: no session (call pf_open first)");
	for (;;) {
		int64_t blocked_since = 0;

		rc = wait_batch(c, deadline, timeout_ms, &blocked_since);
		/* Counted before the Ack, which carries the total. */
		if (blocked_since)
			c->wait_s += (mono() - blocked_since) / 1e9;
		if (!rc && c->queue.head)
			rc = take(c, batch);
		if (!rc || !c->dead || !reconnecting(c) || revived++ == RECONNECTS_PER_CALL)
			return rc;
		/* The daemon went away: get the session back, then wait on for
		 * the batch the trainer asked for.  The trainer waits for data
		 * meanwhile, so that is wait time too. */
		blocked_since = mono();
		rc = revive(c, deadline);
		c->wait_s += (mono() - blocked_since) / 1e9;
		if (rc)
			return rc;
	}
}

PF_API int pf_next(struct pf_client *c, int timeout_ms, struct pf_batch **batch)
{
	int64_t entry = mono();
	int rc;

	if (!c || !batch)
		return -EINVAL;
	*batch = NULL;
	if (c->have_last_return)
		c->busy_s += (entry - c->last_return_ns) / 1e9;
	rc = next_batch(c, timeout_ms, batch);
	/* The time after an epoch's end (evaluation, checkpointing) is not
	 * time spent consuming batches, so it does not count as busy. */
	c->have_last_return = rc != 0 || *batch != NULL;
	c->last_return_ns = mono();
	return rc;
}

PF_API int pf_release(struct pf_client *c, struct pf_batch *batch, void *stream)
{
	struct pfc_batch **pp, *b;
	int rc;

	if (!c || !batch)
		return -EINVAL;
	/* Find it by address before touching it: a batch released twice, or
	 * one from another client, is an error here, never a double free. */
	for (pp = &c->held; *pp && &(*pp)->pub != batch; pp = &(*pp)->next)
		;
	if (!*pp)
		return pfc_set_err(c, -EINVAL,
				   "pf_release: this batch is not held by this client "
				   "(released twice?)");
	b = *pp;
	/* A batch of a connection that broke, on a client that reconnects:
	 * its slot died with that daemon, so there is nothing to send, only
	 * its arenas to let go of once no batch points into them. */
	note_outage(c);
	if (b->gen != c->gen) {
		*pp = b->next;
		c->nheld--;
		retired_put(c, b->gen);
		free_batch(b);
		return 0;
	}
	if (c->dead) {
		*pp = b->next;
		c->nheld--;
		c->slot_mine[b->slot] = 0;
		free_batch(b);
		return pfc_fail_dead(c);
	}
	/* Device batches wait for the work queued on the trainer's stream;
	 * host memory is read synchronously by the trainer, so its release is
	 * immediate. */
	if (b->pub.on_device) {
		rc = release_after(c, b, stream);
		if (rc)
			return rc; /* still held: the caller may retry */
		*pp = b->next;
		c->nheld--;
		free_batch(b);
	} else {
		*pp = b->next;
		c->nheld--;
		rc = send_release(c, b->pub.epoch, b->pub.seq, b->slot);
		free_batch(b);
	}
	if (!rc)
		rc = flush_releases(c, 0);
	if (rc && c->dead && reconnecting(c)) {
		/* The daemon died before this release could reach it: the slot
		 * went with it, as for a batch of an older connection. */
		note_outage(c);
		return 0;
	}
	return rc;
}

PF_API int pf_set_depth(struct pf_client *c, uint64_t session, uint32_t target)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__SetDepth msg = PF__SET_DEPTH__INIT;
	int revived = 0, rc;

	if (!c)
		return -EINVAL;
	msg.session = session;
	msg.target = target;
	msg.automatic = target == 0;
	env.msg_case = PF__ENVELOPE__MSG_SET_DEPTH;
	env.set_depth = &msg;
	for (;;) {
		rc = revive(c, -1);
		if (rc)
			return rc;
		rc = pfc_call(c, &env, PF__ENVELOPE__MSG_OK, NULL);
		if (!rc || !c->dead || !reconnecting(c) || ++revived > RECONNECTS_PER_CALL)
			break;
	}
	/* The session's own depth is set again on a restarted daemon. */
	if (!rc && c->opened && (session == 0 || session == c->session)) {
		c->own_target_set = true;
		c->own_target = target;
	}
	return rc;
}

/* How long pf_abandon waits for released batches' GPU work (ms). */
#define ABANDON_FLUSH_MS 20

PF_API int pf_abandon(struct pf_client *c)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__Abandon msg = PF__ABANDON__INIT;
	bool tell;
	int rc = 0, qrc;

	if (!c)
		return -EINVAL;
	if (c->dead && reconnecting(c)) {
		/* The daemon that was filling the epoch is gone: forget the
		 * epoch, so that the next connection does not start it again. */
		note_outage(c);
		c->resume_pending = false;
		c->epoch_live = false;
		return 0;
	}
	if (c->dead)
		return pfc_fail_dead(c);
	if (!c->opened)
		return pfc_set_err(c, -EINVAL, "pf_abandon: no session (call pf_open first)");
	if (!c->epoch_live)
		return 0;
	/* Not live from here on: batches still on the way during the call
	 * are released as they arrive.  An epoch whose end already came has
	 * nothing left to stop in the daemon, only queued batches to return. */
	tell = !c->epoch_ended;
	c->epoch_live = false;
	if (tell) {
		msg.epoch = c->epoch;
		env.msg_case = PF__ENVELOPE__MSG_ABANDON;
		env.abandon = &msg;
		rc = pfc_call(c, &env, PF__ENVELOPE__MSG_OK, NULL);
	}
	/* Released after the daemon has stopped filling, so that a freed slot
	 * is not filled again for the epoch being abandoned. */
	qrc = release_queue(c);
	/* Batches the trainer released behind its stream go back too once
	 * that work retires; a short wait covers the usual case (the work
	 * is microseconds from done), and longer work keeps its slot until
	 * the next call, as in pf_next, rather than blocking the trainer. */
	if (!qrc)
		qrc = flush_releases(c, ABANDON_FLUSH_MS);
	if ((rc || qrc) && c->dead && reconnecting(c)) {
		/* It broke on the way: the epoch is not live, so it is not
		 * started again, and there is nothing left to stop. */
		note_outage(c);
		return 0;
	}
	return rc ? rc : qrc;
}

PF_API int pf_stats(const struct pf_client *c, struct pf_stats *out)
{
	double total;

	if (!c || !out)
		return -EINVAL;
	memset(out, 0, sizeof(*out));
	out->session = c->session;
	out->batches = c->batches;
	out->bytes = c->bytes;
	out->held = c->nheld;
	out->wait_s = c->wait_s;
	out->busy_s = c->busy_s;
	total = c->wait_s + c->busy_s;
	out->stall_fraction = total > 0 ? c->wait_s / total : 0;
	out->reconnects = c->reconnects;
	out->resume_batch = c->resume_seq;
	return 0;
}

PF_API void pf_close(struct pf_client *c)
{
	if (!c)
		return;
	/* Closing the socket returns every slot anyway; the explicit releases
	 * keep the daemon's accounting exact until then.  Pending device
	 * releases get a bounded wait so that the daemon does not rewrite a
	 * slot the trainer's GPU work still reads. */
	release_queue(c);
	while (c->held) {
		struct pfc_batch *b = c->held;

		c->held = b->next;
		/* A batch of a broken connection has no slot to give back; its
		 * arenas are unmapped below with the rest. */
		if (b->gen != c->gen) {
			free_batch(b);
			continue;
		}
		/* A device batch still held may be read by queued work on a
		 * stream we do not know: wait for the legacy default stream,
		 * which waits for every blocking stream. */
		if (b->pub.on_device && !c->dead && release_after(c, b, NULL) == 0) {
			free_batch(b);
			continue;
		}
		if (!c->dead)
			send_release(c, b->pub.epoch, b->pub.seq, b->slot);
		free_batch(b);
	}
	flush_releases(c, c->timeout_ms);
	/* Work that has not retired by now still gets its release dropped
	 * (the socket is closing, which returns every slot), but its events
	 * are disposed of, and the arenas are unmapped only after the device
	 * has finished with them (unmap_arenas): a queued kernel must not
	 * fault. */
	while (c->releases) {
		struct pfc_release *r = c->releases;

		c->releases = r->next;
		if (r->free_event)
			r->free_event(r->event);
		free(r);
	}
	unmap_arenas(c, c->arenas, c->narenas);
	while (c->retired) {
		struct pfc_retired *r = c->retired;

		c->retired = r->next;
		unmap_arenas(c, r->arenas, r->narenas);
		free(r);
	}
	while (c->events) {
		struct pfc_event *e = c->events;

		c->events = e->next;
		pfcuda_event_destroy(c->cuda, e->ev);
		free(e);
	}
	pfcuda_close(c->cuda);
	if (c->sock >= 0)
		close(c->sock);
	wire_rx_free(&c->rx);
	for (uint32_t f = 0; f < c->nfields; f++) {
		free(c->fields[f].name);
		free(c->fields[f].dtype);
		free(c->fields[f].shape);
	}
	free(c->fields);
	free(c->slot_mine);
	free(c->device);
	free(c->epoch_indices);
	free_open_opts(c);
	free(c->path);
	free(c->where);
	free(c);
}

PF_API const char *pf_errmsg(const struct pf_client *c)
{
	return c ? c->err : "out of memory";
}
