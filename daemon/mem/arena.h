/*
 * arena.h — the large allocations that hold a session's slots.
 *
 * An arena is exported to the client once; afterwards only (arena, offset)
 * crosses the socket per batch.  Host arenas are memfds: the daemon maps
 * them read-write, the client receives a read-only descriptor of the same
 * memory (a second open of /proc/self/fd/N with O_RDONLY) so it cannot write
 * into slots the daemon may be filling.  The memfd is 0400 and sealed
 * against future writes, so that descriptor cannot be turned into a
 * writable one either (arena.c).  Device arenas (gpu.h) come in the CUDA
 * sessions.
 *
 * DESIGN: created and destroyed on the loop thread; the memory is written
 * by reader threads through slots the session hands them.
 */
#ifndef PF_ARENA_H
#define PF_ARENA_H

#include <stdint.h>

enum arena_kind { ARENA_HOST, ARENA_CUDA_FD, ARENA_CUDA_LEGACY };

struct arena {
	uint32_t id;
	enum arena_kind kind;
	uint64_t bytes;
	int fd;	       /* owned: the memfd (host), -1 otherwise */
	uint8_t *host; /* owned: the daemon's read-write mapping (host) */
};

/* A host arena of `bytes` (rounded up to the page size).  0 or -errno. */
int arena_host_create(struct arena *a, uint32_t id, uint64_t bytes, const char *label);
/* A new read-only descriptor of a host arena, for SCM_RIGHTS; the caller
 * owns it.  -errno on failure. */
int arena_host_export(const struct arena *a);
void arena_destroy(struct arena *a);

#endif
