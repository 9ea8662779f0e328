/*
 * arena.c — the memory batches live in: the daemon's arenas (host memfds
 * mapped read-only, page-locked for the device when this client copies
 * its batches; device arenas imported by fd or legacy IPC handle), and the
 * slabs of the session's VRAM pool that the client's gather reads, mapped
 * as the daemon pushes them and let go of when it drops them.
 *
 * A session that cannot map what it is sent cannot deliver, so every
 * failure here breaks the connection.  An arena is checked against what
 * it claims before it is mapped: reading past the end of a memfd shorter
 * than announced would be SIGBUS in the trainer, not an error.
 *
 * DESIGN: the trainer's thread, inside whichever call reads the push
 * (batch.c).  The arena and slab tables are the struct pf_client's.  An
 * arena's mapping belongs to the arena table, or to a retired generation
 * (reconnect.c) once its connection has broken, and goes only after the
 * device has finished with it (pfc_unmap_arenas synchronises first); a
 * slab goes only once the gather stream is idle, so that no queued gather
 * reads it.
 */
#include "client_int.h"
#include "pfcuda.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- arenas -------------------------------------------------------------- */

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

int pfc_add_arena(struct pf_client *c, const Pf__Arena *msg)
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

/* ---- pool slabs ---------------------------------------------------------- */

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
size_t pfc_staging_bytes(const struct pf_client *c)
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

int pfc_add_pool_slab(struct pf_client *c, const Pf__PoolSlab *m)
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
	(void)pfcuda_gather_staging(c->gather, pfc_staging_bytes(c), &ids, why, sizeof(why));
	return 0;
}

int pfc_pool_slab_gone(struct pf_client *c, const Pf__PoolSlabGone *m)
{
	if (m->id >= c->npool_slabs || c->pool_slabs[m->id].gen != m->gen)
		return 0; /* one we never had, or replaced since */
	return drop_slab(c, m->id);
}
