/*
 * batch.c — libprefetch's batches: the arenas they live in (mapped or
 * imported when the daemon pushes them, unmapped once the device is done
 * with them), BatchReady and the other pushes, taking in the frames the
 * connection (conn.c) has received, the queue of batches not taken,
 * taking one, and giving it back.
 *
 * Taking a batch sends its Ack (the daemon may prepare another: the
 * governor's `consumed`), with the stall accounting of this client: time
 * blocked inside pf_next (wait) and time between calls (busy).  Releasing
 * sends Release; a CUDA batch's waits for the trainer's stream first: an
 * event is recorded on the stream and the release handed to a lane of
 * settle.c, whose thread waits for the event and sends the Release.
 * Client copies start up to PFC_COPY_AHEAD batches before they are taken
 * (pfc_copy_ahead).  CUDA sessions also send the honest-depth Probe: free
 * device memory at each epoch's second batch (its first step has run),
 * every probe_interval_s the daemon asked for, and on pf_probe.
 *
 * DESIGN: the trainer's thread only; nothing here waits for the GPU on a
 * batch's way (no synchronize, no event query): a copy or gather is queued
 * on the library's stream and the trainer's stream waits for it on the GPU
 * (cuStreamWaitEvent).  The arena table, the queue, the held list and the
 * idle events are the struct pf_client's.  A batch belongs to the queue
 * until it is taken, then to the held list until pf_release; a release of
 * a device batch then belongs to its lane until pfc_settle_collect.  Arena
 * mappings belong to the arena table, or to a retired generation
 * (reconnect.c) once their connection has broken.
 */
#include "client_int.h"
#include "pfcuda.h"
#include "util.h"

#include <assert.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- slots, arenas, batches -------------------------------------------------- */

static void event_put(void *event);

void pfc_free_batch(struct pfc_batch *b)
{
	if (!b)
		return;
	if (b->gather_ev)
		event_put(b->gather_ev);
	free(b->message);
	free(b);
}

/* An idle event of c, or a new one: 0, or -errno with c's error set. */
static int event_get(struct pf_client *c, const char *what, struct pfc_event **out)
{
	struct pfc_event *e = c->events;
	char why[256];
	int rc;

	if (e) {
		c->events = e->next;
	} else {
		e = calloc(1, sizeof(*e));
		if (!e)
			return pfc_set_err(c, -ENOMEM, "out of memory");
		e->c = c;
		rc = pfcuda_event_create(c->cuda, &e->ev, why, sizeof(why));
		if (rc) {
			free(e);
			return pfc_set_err(c, rc, "%s: %s", what, why);
		}
	}
	e->refs = 1;
	e->use = ++c->event_uses;
	e->next = NULL;
	*out = e;
	return 0;
}

/* Gives back what a settled release held: a client copy's device buffer,
 * or the slot (its Release, when the connection is still the one it came
 * on); then its event and itself. */
static void settle_now(struct pf_client *c, struct pfc_release *r)
{
	if (r->dbuf < 0 && !c->dead && r->gen == c->gen)
		pfc_send_release(c, r->epoch, r->seq, r->slot);
	pfc_release_dispose(c, r);
}

/* Queues r, the release of batch b's slot (dbuf -1) or of its device
 * buffer (client copies), for when event e, recorded on stream, has
 * completed: a lane of settle.c waits for it and sends it.  Should no
 * lane's thread start, the CPU waits here, blocked, instead. */
static void queue_release(struct pf_client *c, struct pfc_release *r, const struct pfc_batch *b,
			  struct pfc_event *e, const void *stream, int32_t dbuf)
{
	r->epoch = b->pub.epoch;
	r->seq = b->pub.seq;
	r->slot = b->slot;
	r->dbuf = dbuf;
	r->event = e;
	r->stream = stream;
	r->gen = c->gen;
	r->free_event = event_put;
	if (pfc_settle_queue(c, r) == 0)
		return;
	pfcuda_event_sync(c->cuda, e->ev, NULL, 0);
	settle_now(c, r);
}

/* Queues the release of batch b (not taken) for when its gather has
 * completed: the gather still writes the slot until then. */
static int release_after_gather(struct pf_client *c, struct pfc_batch *b)
{
	struct pfc_release *r = calloc(1, sizeof(*r));

	if (!r) {
		pfcuda_gather_sync(c->gather, NULL, 0);
		return pfc_send_release(c, b->pub.epoch, b->pub.seq, b->slot);
	}
	queue_release(c, r, b, b->gather_ev, c->gather, -1);
	b->gather_ev = NULL;
	return 0;
}

int pfc_send_release(struct pf_client *c, uint64_t epoch, uint64_t seq, int32_t slot)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__Release msg = PF__RELEASE__INIT;

	/* Unmark first: once the Release is out the daemon may announce the
	 * slot again, possibly within the read that follows. */
	if (slot >= 0 && (uint32_t)slot < c->slots)
		slot_mark(c, slot, false);
	msg.epoch = epoch;
	msg.seq = seq;
	msg.slot = slot;
	env.msg_case = PF__ENVELOPE__MSG_RELEASE;
	env.release = &msg;
	return pfc_send(c, &env);
}

/* A batch off the queue that is not taken after all, with nothing sent for
 * it.  Its device buffer may go back at once: later copies into it queue
 * behind its copy on the same stream, and the trainer never read it.  The
 * slot of one copied already went back with the copy (and may be another
 * batch's by now): it is left as it is. */
static void drop_untaken(struct pf_client *c, struct pfc_batch *b)
{
	if (b->dbuf >= 0)
		c->dbuf_free[c->ndbuf_free++] = (uint32_t)b->dbuf;
	else if (b->slot >= 0)
		slot_mark(c, b->slot, false);
	pfc_free_batch(b);
}

/* Releases every batch received but not taken (an abandoned or replaced
 * epoch: the daemon expects them back). */
int pfc_release_queue(struct pf_client *c)
{
	struct fifo_node *n;
	int rc = 0;

	while ((n = fifo_pop(&c->queue))) {
		struct pfc_batch *b = container_of(n, struct pfc_batch, queued);

		c->nqueued--;
		/* Its slot back, now or once its gather is done; one copied
		 * ahead has its slot's Release queued behind the copy. */
		if (b->slot >= 0 && b->dbuf < 0 && !c->dead) {
			int src = b->gather_ev
					  ? release_after_gather(c, b)
					  : pfc_send_release(c, b->pub.epoch, b->pub.seq, b->slot);

			if (src && !rc)
				rc = src;
			pfc_free_batch(b);
		} else {
			drop_untaken(c, b);
		}
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
	if (c->ccopy) {
		char why[256];

		/* Batches are copied from here by the GPU's copy engine. */
		rc = pfcuda_host_register(c->cuda, base, (size_t)msg->bytes, why, sizeof(why));
		if (rc)
			rc = pfc_conn_fail(c, rc,
					   "cannot page-lock arena %" PRIu32 " (%.1f MiB): %s",
					   msg->id, msg->bytes / 1048576.0, why);
		a->registered = rc == 0;
	}
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

/* Unmaps an arena table and frees it.  Device arenas go after every queued
 * kernel has finished: the trainer's released work may still read them. */
void pfc_unmap_arenas(struct pf_client *c, struct pfc_arena *arenas, uint32_t n)
{
	bool synced = false;

	for (uint32_t a = 0; a < n; a++) {
		struct pfc_arena *ar = &arenas[a];

		if (!ar->present)
			continue;
		if (ar->kind == PF__ARENA_KIND__ARENA_HOST_MEMFD) {
			if (ar->registered) {
				/* Copies from it may still be queued. */
				if (c->gather)
					pfcuda_gather_sync(c->gather, NULL, 0);
				pfcuda_host_unregister(c->cuda, ar->base);
			}
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

/* Checks a data batch against the session: its slot, its arena, and that
 * every field of `count` samples lies inside the slot, which lies inside the
 * arena.  The trainer dereferences these pointers, so nothing is trusted. */
static int check_data_batch(struct pf_client *c, const Pf__BatchReady *b)
{
	const struct pfc_arena *a;
	uint64_t end;

	if (!c->opened)
		return pfc_conn_fail(c, -EPROTO,
				     "epoch %" PRIu64 " batch %" PRIu64
				     " arrived before the session opened",
				     b->epoch, b->seq);
	if ((uint32_t)b->slot >= c->slots)
		return pfc_conn_fail(c, -EPROTO,
				     "epoch %" PRIu64 " batch %" PRIu64 " names slot %" PRId32
				     " of a session with %" PRIu32,
				     b->epoch, b->seq, b->slot, c->slots);
	if (slot_marked(c, b->slot))
		return pfc_conn_fail(c, -EPROTO,
				     "epoch %" PRIu64 " batch %" PRIu64 " reuses slot %" PRId32
				     " before its release",
				     b->epoch, b->seq, b->slot);
	if (b->arena >= c->narenas || !c->arenas[b->arena].present)
		return pfc_conn_fail(c, -EPROTO,
				     "epoch %" PRIu64 " batch %" PRIu64 " names arena %" PRIu32
				     ", which was never announced",
				     b->epoch, b->seq, b->arena);
	a = &c->arenas[b->arena];
	if (__builtin_add_overflow(b->offset, c->slot_bytes, &end) || end > a->bytes)
		return pfc_conn_fail(c, -EPROTO,
				     "epoch %" PRIu64 " batch %" PRIu64
				     " lies outside arena %" PRIu32,
				     b->epoch, b->seq, b->arena);
	if (b->picks_le32.len && (b->picks_le.len || b->n_picks))
		return pfc_conn_fail(c, -EPROTO,
				     "epoch %" PRIu64 " batch %" PRIu64
				     " carries its picks both as picks_le32 and as %s",
				     b->epoch, b->seq, b->picks_le.len ? "picks_le" : "picks");
	if (b->picks_le32.len && b->picks_le32.len != (size_t)b->count * sizeof(uint32_t))
		return pfc_conn_fail(c, -EPROTO,
				     "epoch %" PRIu64 " batch %" PRIu64
				     " carries %zu bytes of picks_le32 for %" PRIu32
				     " samples (4 bytes a pick)",
				     b->epoch, b->seq, b->picks_le32.len, b->count);
	if (!b->picks_le32.len &&
	    ((b->picks_le.len ? b->picks_le.len / sizeof(uint64_t) : b->n_picks) != b->count ||
	     b->picks_le.len % sizeof(uint64_t)))
		return pfc_conn_fail(c, -EPROTO,
				     "epoch %" PRIu64 " batch %" PRIu64
				     " carries %zu picks for %" PRIu32 " samples",
				     b->epoch, b->seq,
				     b->picks_le.len ? b->picks_le.len / sizeof(uint64_t)
						     : b->n_picks,
				     b->count);
	for (uint32_t f = 0; f < c->nfields; f++) {
		uint64_t bytes;

		if (__builtin_mul_overflow(c->fields[f].sample_bytes, (uint64_t)b->count, &bytes) ||
		    __builtin_add_overflow(bytes, c->fields[f].offset, &end) || end > c->slot_bytes)
			return pfc_conn_fail(c, -EPROTO,
					     "epoch %" PRIu64 " batch %" PRIu64 ": %" PRIu32
					     " samples of field %s do not fit a slot",
					     b->epoch, b->seq, b->count, c->fields[f].name);
	}
	return 0;
}

/* The batch's picks, from whichever field carries them (picks_le32 holds
 * little-endian uint32, widened here; picks_le, little-endian uint64;
 * picks, packed varints). */
static void copy_picks(uint64_t *out, const Pf__BatchReady *b)
{
	if (b->picks_le32.len) {
		for (uint32_t i = 0; i < b->count; i++) {
			uint32_t v;

			memcpy(&v, b->picks_le32.data + (size_t)i * sizeof(v), sizeof(v));
			out[i] = le32toh(v);
		}
		return;
	}
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

/* ---- the client's gather ------------------------------------------------------ */

/* Pool slab ids index a table; the daemon's slabs number a few hundred. */
#define PFC_MAX_POOL_SLABS (1u << 20)

int pfc_keep_pool(struct pf_client *c, const Pf__SessionOpened *so)
{
	const Pf__PoolLayout *pl = so->pool;

	memset(&c->layout, 0, sizeof(c->layout));
	c->gathers = false;
	if (!pl)
		return 0;
	if (!c->gather)
		return pfc_conn_fail(c, -EPROTO,
				     "%s sent a pool layout to a client that does not gather",
				     c->where);
	if (c->nfields > GPU_GATHER_MAX_FIELDS || pl->n_rec_off != c->nfields ||
	    pl->n_row_bytes != c->nfields || pl->slab_shift >= 32 || pl->rec_stride == 0)
		return pfc_conn_fail(
			c, -EPROTO,
			"%s sent a pool layout that does not fit the session's %" PRIu32 " fields",
			c->where, c->nfields);
	for (uint32_t f = 0; f < c->nfields; f++) {
		if (pl->row_bytes[f] != c->fields[f].sample_bytes ||
		    (uint64_t)pl->rec_off[f] + pl->row_bytes[f] > pl->rec_stride)
			return pfc_conn_fail(c, -EPROTO,
					     "%s sent a pool layout whose field %s does not fit "
					     "its records",
					     c->where, c->fields[f].name);
		c->layout.slot_off[f] = c->fields[f].offset;
		c->layout.rec_off[f] = pl->rec_off[f];
		c->layout.row_bytes[f] = pl->row_bytes[f];
	}
	c->layout.nfields = c->nfields;
	c->layout.slab_shift = pl->slab_shift;
	c->layout.rec_stride = pl->rec_stride;
	c->gathers = true;
	return 0;
}

/* The pinned staging of inline gather ids: a part of batch_size 8-byte ids
 * for each slot (a session may get either width). */
static size_t staging_bytes(const struct pf_client *c)
{
	return (size_t)c->open_opts.batch_size * sizeof(uint64_t) * c->slots;
}

/* Unmaps slab id once no queued gather can read it. */
static int drop_slab(struct pf_client *c, uint32_t id)
{
	struct pfc_slab *sl = &c->pool_slabs[id];
	char why[256];
	int rc;

	rc = pfcuda_gather_sync(c->gather, why, sizeof(why));
	if (!rc)
		rc = pfcuda_gather_set_slab(c->gather, id, 0, why, sizeof(why));
	if (!rc)
		rc = pfcuda_unmap(c->cuda, &sl->map, why, sizeof(why));
	sl->gen = 0;
	return rc ? pfc_conn_fail(c, rc, "cannot let go of pool slab %" PRIu32 ": %s", id, why) : 0;
}

void pfc_unmap_slabs(struct pf_client *c)
{
	if (c->npool_slabs)
		pfcuda_gather_sync(c->gather, NULL, 0);
	for (uint32_t j = 0; j < c->npool_slabs; j++) {
		if (!c->pool_slabs[j].gen)
			continue;
		pfcuda_gather_set_slab(c->gather, j, 0, NULL, 0);
		pfcuda_unmap(c->cuda, &c->pool_slabs[j].map, NULL, 0);
	}
	free(c->pool_slabs);
	c->pool_slabs = NULL;
	c->npool_slabs = 0;
}

static int add_pool_slab(struct pf_client *c, const Pf__PoolSlab *m)
{
	bool fd_kind = m->kind == PF__ARENA_KIND__ARENA_CUDA_FD;
	int fd = fd_kind ? wire_rx_take_fd(&c->rx) : -1;
	struct pfc_slab *sl;
	char why[256];
	void *ids;
	int rc;

	if (!c->gathers || m->id >= PFC_MAX_POOL_SLABS || !m->gen || !m->bytes ||
	    (!fd_kind && m->kind != PF__ARENA_KIND__ARENA_CUDA_LEGACY) ||
	    (fd_kind ? fd < 0 : m->legacy_handle.len != PFCUDA_IPC_HANDLE_BYTES)) {
		if (fd >= 0)
			close(fd);
		return pfc_conn_fail(c, -EPROTO,
				     "%s pushed pool slab %" PRIu32 " (gen %" PRIu32
				     ", kind %d, %" PRIu64 " bytes) that this session cannot take",
				     c->where, m->id, m->gen, (int)m->kind, m->bytes);
	}
	if (m->id >= c->npool_slabs) {
		uint32_t n = m->id + 1 > 2 * c->npool_slabs ? m->id + 1 : 2 * c->npool_slabs;
		struct pfc_slab *t = realloc(c->pool_slabs, n * sizeof(*t));

		if (!t) {
			if (fd >= 0)
				close(fd);
			return pfc_conn_fail(c, -ENOMEM, "out of memory");
		}
		memset(t + c->npool_slabs, 0, (n - c->npool_slabs) * sizeof(*t));
		c->pool_slabs = t;
		c->npool_slabs = n;
	}
	sl = &c->pool_slabs[m->id];
	if (sl->gen) {
		/* A new allocation in place of one whose end we have not
		 * heard of: the old one is gone all the same. */
		rc = drop_slab(c, m->id);
		if (rc) {
			if (fd >= 0)
				close(fd);
			return rc;
		}
	}
	rc = fd_kind ? pfcuda_import_fd(c->cuda, fd, m->bytes, &sl->map, why, sizeof(why))
		     : pfcuda_import_legacy(c->cuda, m->legacy_handle.data, m->bytes, &sl->map, why,
					    sizeof(why));
	if (!rc) {
		sl->gen = m->gen;
		rc = pfcuda_gather_set_slab(c->gather, m->id, sl->map.base, why, sizeof(why));
	}
	if (rc)
		return pfc_conn_fail(c, rc, "cannot map pool slab %" PRIu32 " (%.1f MiB) of %s: %s",
				     m->id, m->bytes / 1048576.0, c->where, why);
	/* The pinned staging that batches of hits take their inline ids
	 * through (launch_gather), made with the pool's first slab rather
	 * than in front of the first warm epoch's first batch.  Best effort:
	 * launch_gather tries again, and says what failed. */
	(void)pfcuda_gather_staging(c->gather, staging_bytes(c), &ids, why, sizeof(why));
	return 0;
}

static int pool_slab_gone(struct pf_client *c, const Pf__PoolSlabGone *m)
{
	if (m->id >= c->npool_slabs || c->pool_slabs[m->id].gen != m->gen)
		return 0; /* one we never had, or replaced since */
	return drop_slab(c, m->id);
}

/* Checks a batch the client is to gather: its index and staged rows lie
 * in its arena (the kernel reads them in this process's context). */
static int check_gather(struct pf_client *c, const Pf__BatchReady *b, const struct pfc_arena *a)
{
	size_t width = b->gather_ids32.len ? sizeof(uint32_t) : sizeof(uint64_t);
	size_t ids = b->gather_ids32.len ? b->gather_ids32.len : b->gather_ids.len;
	uint64_t end;

	/* Inline ids are copied into the slot's part of the staging, which
	 * has room for batch_size of them, and name pool entries only. */
	if (b->gather_ids32.len && b->gather_ids.len)
		return pfc_conn_fail(c, -EPROTO,
				     "epoch %" PRIu64 " batch %" PRIu64
				     " carries its gather ids both as gather_ids32 and gather_ids",
				     b->epoch, b->seq);
	if (ids &&
	    (ids != (size_t)b->count * width || b->nstaged || b->count > c->open_opts.batch_size))
		return pfc_conn_fail(
			c, -EPROTO,
			"epoch %" PRIu64 " batch %" PRIu64 " carries %zu bytes of %s for %" PRIu32
			" rows with %" PRIu32 " staged (%zu bytes an id, only for a "
			"batch of hits of at most %" PRIu32 " rows)",
			b->epoch, b->seq, ids, b->gather_ids32.len ? "gather_ids32" : "gather_ids",
			b->count, b->nstaged, width, c->open_opts.batch_size);
	if (!c->gathers || a->kind == PF__ARENA_KIND__ARENA_HOST_MEMFD || b->gather_desc % 8 ||
	    b->n_staged_off != c->nfields || b->nstaged > INT32_MAX ||
	    __builtin_add_overflow(b->gather_desc, (uint64_t)b->count * 8, &end) || end > a->bytes)
		return pfc_conn_fail(c, -EPROTO,
				     "epoch %" PRIu64 " batch %" PRIu64
				     " asks for a gather this session "
				     "cannot do",
				     b->epoch, b->seq);
	for (uint32_t f = 0; f < c->nfields; f++)
		if (__builtin_add_overflow(b->staged_off[f],
					   (uint64_t)b->nstaged * c->layout.row_bytes[f], &end) ||
		    end > a->bytes)
			return pfc_conn_fail(c, -EPROTO,
					     "epoch %" PRIu64 " batch %" PRIu64
					     ": staged rows of field %s lie outside arena %" PRIu32,
					     b->epoch, b->seq, c->fields[f].name, b->arena);
	return 0;
}

int pfc_gather_flush(struct pf_client *c)
{
	struct gpu_gather_group p;
	struct pfc_event *ev;
	uint32_t n = c->ngroup, k;
	char why[256];
	int64_t t0;
	int rc = 0;

	if (!n)
		return 0;
	c->ngroup = 0;
	/* A broken connection's queue is dropped, never taken. */
	if (c->dead)
		return pfc_fail_dead(c);
	/* One event for the launch, shared by its batches (each holds a
	 * reference): the trainer's stream then waits once for them all
	 * (pfc_take). */
	rc = event_get(c, "gather", &ev);
	if (rc)
		return pfc_conn_fail(c, rc, "gather of %u batches: %s", n, c->err);
	memset(&p, 0, sizeof(p));
	p.g = c->layout;
	p.g.desc32 = c->group_ids32;
	p.n = n;
	for (k = 0; k < n; k++) {
		p.slot[k] = c->group_slot[k];
		p.desc[k] = (uint64_t)(uintptr_t)c->group_ids[k];
		p.first[k + 1] = p.first[k] + c->group[k]->pub.count;
	}
	t0 = PFC_T0(c);
	rc = pfcuda_gather_launch_group(c->gather, &p, ev->ev, why, sizeof(why));
	PFC_TADD(c, launch_ns, t0);
	if (rc) {
		event_put(ev);
		return pfc_conn_fail(c, rc, "gather of %u batches: %s", n, why);
	}
	c->counts.launches++;
	c->counts.grouped += n;
	ev->refs = n;
	for (k = 0; k < n; k++)
		c->group[k]->gather_ev = ev;
	return 0;
}

/* Queues the batch's assembly on the gather stream, with its end event;
 * while grouping, a batch of hits waits in c->group for one launch with
 * the others of the pass (pfc_gather_flush). */
static int launch_gather(struct pf_client *c, struct pfc_batch *q, const Pf__BatchReady *b,
			 const struct pfc_arena *a)
{
	struct gpu_gather g = c->layout;
	/* Inline ids, 4 or 8 bytes each (check_gather allowed one form). */
	const bool ids32 = b->gather_ids32.len != 0;
	const ProtobufCBinaryData *inline_ids = ids32 ? &b->gather_ids32 : &b->gather_ids;
	struct pfc_event *e;
	void *ids = NULL;
	char why[256];
	int64_t t0;
	int rc;

	if (inline_ids->len) {
		/* A batch of hits only: its index came in the message; the
		 * kernel reads it from the slot's own part of the pinned
		 * staging, which the slot's next batch reuses only after this
		 * one's release (which waits for the gather).  Each part has
		 * room for 8-byte ids: a session may get either width. */
		size_t per = (size_t)c->open_opts.batch_size * sizeof(uint64_t);

		/* The size asked for changes only with the session (pf_open, a
		 * reconnection), never inside a pass: a staging buffer the
		 * waiting group's indices lie in is never replaced here. */
		rc = pfcuda_gather_staging(c->gather, staging_bytes(c), &ids, why, sizeof(why));
		if (rc)
			return pfc_conn_fail(c, rc, "gather staging: %s", why);
		ids = (uint8_t *)ids + per * (size_t)b->slot;
		/* As they came: little-endian, as the kernel reads them. */
		memcpy(ids, inline_ids->data, inline_ids->len);
		if (c->grouping && pfcuda_gather_can_group(c->gather)) {
			/* One launch reads entries of one width. */
			if (c->ngroup && c->group_ids32 != ids32) {
				rc = pfc_gather_flush(c);
				if (rc)
					return rc;
			}
			c->group_ids32 = ids32;
			c->group[c->ngroup] = q;
			c->group_ids[c->ngroup] = ids;
			c->group_slot[c->ngroup] = a->garena.base + b->offset;
			if (++c->ngroup == GPU_GATHER_GROUP)
				return pfc_gather_flush(c);
			return 0;
		}
	}
	/* Launched alone, after those waiting (the stream keeps the order
	 * the batches arrived in). */
	rc = pfc_gather_flush(c);
	if (rc)
		return rc;
	rc = event_get(c, "gather", &e);
	if (rc)
		return pfc_conn_fail(c, rc, "%s", c->err);
	g.slot = a->garena.base + b->offset;
	g.desc = a->garena.base + b->gather_desc;
	g.count = b->count;
	g.nstaged = b->nstaged;
	g.staged = a->garena.base;
	g.desc32 = ids32;
	for (uint32_t f = 0; f < c->nfields; f++)
		g.staged_off[f] = b->staged_off[f];
	t0 = PFC_T0(c);
	rc = pfcuda_gather_launch(c->gather, &g, ids, inline_ids->len, e->ev, why, sizeof(why));
	PFC_TADD(c, launch_ns, t0);
	if (rc) {
		event_put(e);
		return pfc_conn_fail(c, rc, "epoch %" PRIu64 " batch %" PRIu64 ": gather: %s",
				     b->epoch, b->seq, why);
	}
	c->counts.launches++;
	c->counts.grouped++;
	q->gather_ev = e;
	return 0;
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
				     "epoch %" PRIu64 " batch %" PRIu64 " has slot %" PRId32
				     " and error %" PRId32 " (a batch has a slot or an error < 0)",
				     b->epoch, b->seq, b->slot, b->error);
	if (data) {
		rc = check_data_batch(c, b);
		if (!rc && b->gather)
			rc = check_gather(c, b, &c->arenas[b->arena]);
		if (rc)
			return rc;
	}
	if (b->epoch != c->epoch || !c->epoch_live || c->epoch_ended)
		return data ? pfc_send_release(c, b->epoch, b->seq, b->slot) : 0;
	if (b->seq != c->next_seq)
		return pfc_conn_fail(c, -EPROTO,
				     "epoch %" PRIu64 " batch %" PRIu64
				     " arrived out of order (expected batch %" PRIu64 ")",
				     b->epoch, b->seq, c->next_seq);
	if (c->nqueued >= PFC_MAX_QUEUED)
		return pfc_conn_fail(c, -EPROTO, "%s sent more than %d batches that were not taken",
				     c->where, PFC_MAX_QUEUED);

	extra = data ? c->nfields * sizeof(void *) + b->count * sizeof(uint64_t) : 0;
	/* The tail (field pointers, picks) is written whole below: only the
	 * struct is zeroed, not 8 KiB of picks a batch. */
	q = malloc(sizeof(*q) + extra);
	if (!q)
		return pfc_conn_fail(c, -ENOMEM, "out of memory");
	memset(q, 0, sizeof(*q));
	tail = (uint8_t *)(q + 1);
	q->gen = c->gen;
	q->dbuf = -1;
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
		if (c->ccopy && (a->kind != PF__ARENA_KIND__ARENA_HOST_MEMFD || !a->registered)) {
			free(q);
			return pfc_conn_fail(
				c, -EPROTO,
				"epoch %" PRIu64 " batch %" PRIu64 " of a session this client "
				"copies is in arena %" PRIu32 ", not a registered host arena",
				b->epoch, b->seq, b->arena);
		}
		q->host = c->ccopy ? (const uint8_t *)a->base + b->offset : NULL;
		q->pub.count = b->count;
		q->pub.picks = picks;
		q->pub.nfields = c->nfields;
		q->pub.data = ptrs;
		q->pub.on_device = a->kind != PF__ARENA_KIND__ARENA_HOST_MEMFD;
		if (b->gather) {
			rc = launch_gather(c, q, b, a);
			if (rc) {
				free(q);
				return rc;
			}
		}
		slot_mark(c, b->slot, true);
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
	return data && c->ccopy ? pfc_copy_ahead(c) : 0;
}

int pfc_handle_unasked(struct pf_client *c, Pf__Envelope *env)
{
	if (env->id != 0) {
		/* The reply to a request that timed out earlier. */
		pf__envelope__free_unpacked(env, NULL);
		return 0;
	}
	return pfc_handle_push(c, env);
}

/* Handles one push (id 0); takes env. */
int pfc_handle_push(struct pf_client *c, Pf__Envelope *env)
{
	int rc = 0;

	/* Gathers waiting for a group launch go first: a slab dropped or
	 * replaced next must not change what they read. */
	if (c->ngroup && env->msg_case != PF__ENVELOPE__MSG_BATCH) {
		rc = pfc_gather_flush(c);
		if (rc) {
			pf__envelope__free_unpacked(env, NULL);
			return rc;
		}
	}
	switch (env->msg_case) {
	case PF__ENVELOPE__MSG_ARENA: rc = add_arena(c, env->arena); break;
	case PF__ENVELOPE__MSG_BATCH: {
		int64_t t0 = PFC_T0(c);

		c->counts.frames++;
		rc = add_batch(c, env->batch);
		PFC_TADD(c, batch_ns, t0);
		break;
	}
	case PF__ENVELOPE__MSG_POOL_SLAB: rc = add_pool_slab(c, env->pool_slab); break;
	case PF__ENVELOPE__MSG_POOL_SLAB_GONE: rc = pool_slab_gone(c, env->pool_slab_gone); break;
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

int pfc_take_in(struct pf_client *c, Pf__Envelope *first)
{
	int rc = 0, frc;

	c->grouping = true;
	if (first)
		rc = pfc_handle_unasked(c, first);
	while (!rc) {
		Pf__Envelope *env;

		if (c->dead) {
			rc = pfc_fail_dead(c);
			break;
		}
		rc = pfc_next_frame(c, &env);
		if (rc <= 0)
			break;
		rc = pfc_handle_unasked(c, env);
	}
	c->grouping = false;
	frc = pfc_gather_flush(c);
	return rc ? rc : frc;
}

int pfc_read_buffered(struct pf_client *c)
{
	return pfc_take_in(c, NULL);
}

int pfc_read_now(struct pf_client *c)
{
	int rc = pfc_fill_now(c);

	return rc ? rc : pfc_take_in(c, NULL);
}

/* ---- taking and releasing batches ------------------------------------------- */

/* The honest-depth probe: free device memory now, as the trainer sees it. */
int pfc_send_probe(struct pf_client *c)
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

/* Probes at every epoch's second batch (the trainer's first step of the
 * epoch has run: an evaluation pass or a grown model shows), and in between
 * every probe_interval_s.  Best effort: a failed read only skips this one. */
static void maybe_probe(struct pf_client *c)
{
	int64_t now;

	if (!c->cuda || c->epoch_batches < 2)
		return;
	if (c->epoch_batches == 2) {
		pfc_send_probe(c);
		return;
	}
	now = mono();
	if (c->last_probe_ns &&
	    (c->probe_interval_s <= 0 || now - c->last_probe_ns < c->probe_interval_s * 1e9))
		return;
	pfc_send_probe(c);
}

/* Drops one holder's reference; the last makes the event idle. */
static void event_put(void *event)
{
	struct pfc_event *e = event;

	assert(e->refs > 0);
	if (--e->refs)
		return;
	e->next = e->c->events;
	e->c->events = e;
}

/* Queues the release of a device batch behind the work queued on stream so
 * far.  0, or -errno with the batch still held by the caller. */
int pfc_release_after(struct pf_client *c, struct pfc_batch *b, void *stream)
{
	struct pfc_release *r = calloc(1, sizeof(*r));
	struct pfc_event *e;
	char why[256];
	int64_t t0;
	int rc;

	if (!r)
		return pfc_set_err(c, -ENOMEM, "out of memory");
	rc = event_get(c, "pf_release", &e);
	if (rc) {
		free(r);
		return rc;
	}
	/* The slot is rewritten after this release: its gather must be done
	 * too, even if the trainer releases it on another stream (on the one
	 * pf_next ordered after the gather, it is already; but the per-thread
	 * default stream is another stream on another thread). */
	t0 = PFC_T0(c);
	if (b->gather_ev &&
	    (!b->waited || b->waited_stream != stream || stream == PFC_STREAM_PER_THREAD)) {
		rc = pfcuda_stream_wait(c->cuda, stream, b->gather_ev->ev, why, sizeof(why));
		c->counts.waits++;
	}
	if (!rc)
		rc = pfcuda_event_record(c->cuda, e->ev, stream, why, sizeof(why));
	PFC_TADD(c, event_ns, t0);
	if (rc) {
		event_put(e);
		free(r);
		return pfc_set_err(c, rc, "pf_release: cannot record on stream %p: %s", stream,
				   why);
	}
	c->counts.records++;
	queue_release(c, r, b, e, stream, b->dbuf); /* client copies: only the buffer comes back */
	return 0;
}

/* ---- client copies ---------------------------------------------------------- */

/* A device buffer is free, or may be made. */
static bool dbuf_available(const struct pf_client *c)
{
	return c->ndbuf_free > 0 || c->ndbufs < c->dbuf_cap || !c->dbufs;
}

bool pfc_can_take(const struct pf_client *c)
{
	const struct pfc_batch *b = container_of(c->queue.head, struct pfc_batch, queued);

	return !c->ccopy || b->slot < 0 || b->dbuf >= 0 || dbuf_available(c);
}

/* A free device buffer for a client that copies: one given back, else a
 * new one while there are fewer than the session's slots (held and copied
 * ahead).  Its index, or -errno.  quiet (a copy ahead): a device too full
 * for one more, with some made already, returns -ENOMEM, leaves the
 * connection as it is, and caps the buffers at those there are. */
static int take_dbuf(struct pf_client *c, bool quiet)
{
	char why[256];
	uint64_t p;
	int rc;

	if (!c->dbufs) {
		c->dbuf_cap = c->slots ? c->slots : 1;
		c->dbuf_bytes = (c->slot_bytes + 511) & ~(uint64_t)511;
		c->dbufs = calloc(c->dbuf_cap, sizeof(*c->dbufs));
		c->dbuf_free = calloc(c->dbuf_cap, sizeof(*c->dbuf_free));
		if (!c->dbufs || !c->dbuf_free) {
			pfc_free_dbufs(c);
			return pfc_conn_fail(c, -ENOMEM, "out of memory");
		}
	}
	/* A restarted daemon whose slots grew: the buffers made for the old
	 * ones are too small (a copy would overrun them). */
	if (c->slot_bytes > c->dbuf_bytes)
		return pfc_conn_fail(c, -ESTALE,
				     "%s now serves slots of %.1f MiB, larger than this client's "
				     "device buffers of %.1f MiB: the session cannot go on",
				     c->where, c->slot_bytes / 1048576.0,
				     c->dbuf_bytes / 1048576.0);
	if (c->ndbuf_free)
		return (int)c->dbuf_free[--c->ndbuf_free];
	if (c->ndbufs >= c->dbuf_cap)
		return pfc_conn_fail(c, -EPROTO, "no device buffer free for a batch");
	rc = pfcuda_mem_alloc(c->cuda, c->dbuf_bytes, &p, why, sizeof(why));
	if (rc == -ENOMEM && quiet && c->ndbufs) {
		/* The device is full: make do with the buffers there are (a
		 * take waits for one to come back rather than fail). */
		c->dbuf_cap = c->ndbufs;
		return -ENOMEM;
	}
	if (rc)
		return pfc_conn_fail(c, rc, "a device buffer of %.1f MiB for a batch: %s",
				     c->dbuf_bytes / 1048576.0, why);
	c->dbufs[c->ndbufs] = p;
	return (int)c->ndbufs++;
}

void pfc_free_dbufs(struct pf_client *c)
{
	if (c->ndbufs)
		pfcuda_sync(c->cuda, NULL, 0); /* queued work may still read them */
	for (uint32_t i = 0; i < c->ndbufs; i++)
		pfcuda_mem_free(c->cuda, c->dbufs[i]);
	free(c->dbufs);
	free(c->dbuf_free);
	c->dbufs = NULL;
	c->dbuf_free = NULL;
	c->ndbufs = c->ndbuf_free = c->dbuf_cap = 0;
}

/* A batch of a client that copies, queued: its slot is copied into a free
 * device buffer on the gather stream.  b->gather_ev marks the copy's end,
 * which the trainer's stream waits for when it takes the batch (pfc_take),
 * and the slot goes back to the daemon as soon as the copy is done (the
 * trainer reads the buffer, not the slot).  ahead: see take_dbuf's quiet. */
static int copy_batch(struct pf_client *c, struct pfc_batch *b, bool ahead)
{
	void **ptrs = (void **)(b + 1);
	struct pfc_event *e, *done;
	struct pfc_release *r;
	uint64_t dst;
	char why[256];
	int rc, j;

	j = take_dbuf(c, ahead);
	if (j < 0)
		return j;
	r = calloc(1, sizeof(*r));
	if (!r) {
		c->dbuf_free[c->ndbuf_free++] = (uint32_t)j;
		return pfc_conn_fail(c, -ENOMEM, "out of memory");
	}
	/* Two events behind the copy: the batch's, which a stream may wait on
	 * after the slot's Release (which owns the other) has gone. */
	rc = event_get(c, "copy", &e);
	if (!rc) {
		rc = event_get(c, "copy", &done);
		if (rc)
			event_put(e);
	}
	if (rc) {
		c->dbuf_free[c->ndbuf_free++] = (uint32_t)j;
		free(r);
		return pfc_conn_fail(c, rc, "%s", c->err);
	}
	dst = c->dbufs[j];
	rc = pfcuda_gather_copy(c->gather, dst, b->host, (size_t)c->slot_bytes, e->ev, done->ev,
				why, sizeof(why));
	c->counts.copies += rc == 0;
	if (rc) {
		/* Later copies into it queue behind this one on the same
		 * stream: it may go back at once. */
		c->dbuf_free[c->ndbuf_free++] = (uint32_t)j;
		event_put(e);
		event_put(done);
		free(r);
		return pfc_conn_fail(c, rc, "batch %" PRIu64 ": copy to the device: %s", b->pub.seq,
				     why);
	}
	b->dbuf = j;
	b->gather_ev = e;
	for (uint32_t f = 0; f < c->nfields; f++)
		ptrs[f] = (void *)(uintptr_t)(dst + c->fields[f].offset);
	b->pub.on_device = true;
	/* The slot's Release, once the copy has retired. */
	queue_release(c, r, b, done, c->gather, -1);
	b->host = NULL;
	return 0;
}

int pfc_copy_ahead(struct pf_client *c)
{
	uint32_t ahead = 0;

	if (!c->ccopy)
		return 0;
	for (struct fifo_node *n = c->queue.head; n && ahead < PFC_COPY_AHEAD; n = n->next) {
		struct pfc_batch *b = container_of(n, struct pfc_batch, queued);
		int rc;

		if (b->slot < 0)
			continue; /* an error batch: nothing to copy */
		if (b->host) {
			if (c->dead || !dbuf_available(c))
				return 0;
			rc = copy_batch(c, b, true);
			if (rc == -ENOMEM && !c->dead)
				return 0; /* no buffer for now: pf_next copies it */
			if (rc)
				return rc;
		}
		ahead++;
	}
	return 0;
}

/* Queues the Ack of batch b (corked, it waits for the next write). */
static int send_ack(struct pf_client *c, struct pfc_batch *b)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__Ack ack = PF__ACK__INIT;

	ack.epoch = b->pub.epoch;
	ack.seq = b->pub.seq;
	ack.wait_s = c->wait_s;
	ack.busy_s = c->busy_s;
	env.msg_case = PF__ENVELOPE__MSG_ACK;
	env.ack = &ack;
	return pfc_send(c, &env);
}

int pfc_ack_ahead(struct pf_client *c)
{
	struct pfc_batch *b;
	int rc;

	if (!c->queue.head || c->dead)
		return 0;
	b = container_of(c->queue.head, struct pfc_batch, queued);
	if (b->acked || b->slot < 0 || (c->ccopy && b->dbuf < 0))
		return 0;
	rc = send_ack(c, b);
	if (!rc)
		b->acked = true;
	return rc;
}

/* Takes the head of the queue: acks it and hands it to the trainer. */
int pfc_take(struct pf_client *c, struct pf_batch **batch)
{
	struct pfc_batch *b = container_of(fifo_pop(&c->queue), struct pfc_batch, queued);
	int rc;

	c->nqueued--;
	/* Every pass that takes frames in launches its group before it
	 * returns: a batch here is never still waiting for its gather. */
	assert(c->ngroup == 0);
	/* Before the Ack: a batch that cannot be copied is not taken (a
	 * reconnection delivers it again).  Most were copied ahead. */
	if (c->ccopy && b->slot >= 0 && b->host) {
		rc = copy_batch(c, b, false);
		if (rc) {
			drop_untaken(c, b);
			return rc;
		}
	}

	/* With the Releases pf_next has corked, in one write, now: a batch
	 * whose Ack cannot go is not taken.  One acked at the release before
	 * it (pfc_ack_ahead) needs no Ack of its own: whatever is corked goes
	 * now, and with nothing to write a poll, which asks nothing of the
	 * daemon, says whether it is still there, as the write would have. */
	if (b->acked) {
		rc = c->out_len ? pfc_uncork(c) : pfc_check_peer(c);
	} else {
		rc = send_ack(c, b);
		if (!rc)
			rc = pfc_uncork(c);
	}
	if (rc) {
		/* Not taken: a restarted epoch delivers it again. */
		drop_untaken(c, b);
		return rc;
	}
	c->resume_seq = b->pub.seq + 1;
	if (b->error) {
		char head[64];

		c->epoch_batches++; /* taken, as far as paced requests go */
		c->error_batch = true;
		/* The daemon's own text already names the batch (sess_pump.c):
		 * the prefix goes only on a message that does not. */
		snprintf(head, sizeof(head), "epoch %" PRIu64 " batch %" PRIu64 ": ", b->pub.epoch,
			 b->pub.seq);
		rc = pfc_set_err(c, b->error, "%s%s",
				 strncmp(b->message, head, strlen(head)) ? head : "", b->message);
		pfc_free_batch(b);
		return rc;
	}
	if (b->gather_ev) {
		/* The trainer's stream waits for the batch's assembly, a gather
		 * or a copy (should the wait fail, the CPU waits instead).  The
		 * event stays with the batch: its release waits for it too, on
		 * whatever stream the trainer releases it (pfc_release_after).
		 * A batch of the launch the stream last waited for needs no
		 * wait of its own: that wait covers the whole launch. */
		char why[256];
		int64_t t0 = PFC_T0(c);
		bool waited = !c->sync_take && c->use_stream != PFC_STREAM_PER_THREAD &&
			      c->waited_ev == b->gather_ev && c->waited_use == b->gather_ev->use &&
			      c->waited_on == c->use_stream;

		why[0] = '\0';
		if (!waited && !c->sync_take) {
			c->counts.waits++;
			waited = !pfcuda_stream_wait(c->cuda, c->use_stream, b->gather_ev->ev, NULL,
						     0);
			PFC_TADD(c, event_ns, t0);
			if (waited) {
				c->waited_ev = b->gather_ev;
				c->waited_use = b->gather_ev->use;
				c->waited_on = c->use_stream;
			}
		}
		if (!waited)
			rc = pfcuda_event_sync(c->cuda, b->gather_ev->ev, why, sizeof(why));
		else {
			b->waited = true;
			b->waited_stream = c->use_stream;
		}
		if (rc) {
			uint64_t seq = b->pub.seq;

			drop_untaken(c, b);
			return pfc_conn_fail(c, rc,
					     "batch %" PRIu64
					     ": the copy or gather that assembles it failed: %s",
					     seq, why);
		}
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
int pfc_wait_batch(struct pf_client *c, int64_t deadline, int timeout_ms, int64_t *blocked_since)
{
	int rc;

	if (c->dead)
		return pfc_fail_dead(c);
	/* Releases the lanes have settled since the last call: their device
	 * buffers are free again (client copies), their events idle. */
	pfc_settle_collect(c);
	for (;;) {
		Pf__Envelope *env;

		if (c->pending_err) {
			rc = pfc_set_err(c, c->pending_err, "%s", c->pending_msg);
			c->pending_err = 0;
			return rc;
		}
		/* A client that copies also needs a free device buffer, which
		 * a lane gives back once the trainer's work on it retired. */
		if (c->queue.head ? pfc_can_take(c) : !c->epoch_live || c->epoch_ended)
			return 0;
		if (!*blocked_since)
			*blocked_since = mono();
		/* Blocked in poll until a frame comes or, for a client waiting
		 * for a buffer, a lane gives one back: the Releases the daemon
		 * needs to send more go from the lanes themselves, so nothing
		 * here polls the GPU. */
		rc = c->ccopy && c->queue.head ? pfc_read_env_or_buffer(c, deadline, &env)
					       : pfc_read_env(c, deadline, &env);
		if (rc == -EAGAIN) {
			pfc_settle_woken(c);
			continue;
		}
		if (rc == -ETIMEDOUT)
			return pfc_set_err(c, rc, "no batch from %s within %d ms", c->where,
					   timeout_ms);
		if (rc)
			return rc;
		/* A session whose batches this client gathers takes this frame
		 * and the others of the same read in one pass, so that their
		 * gathers go in one launch.  Others take one frame at a time: a
		 * frame after a batch is only read once that batch is taken. */
		rc = c->gathers ? pfc_take_in(c, env) : pfc_handle_unasked(c, env);
		if (rc)
			return rc;
	}
}
