/*
 * arena.c — host arenas backed by memfd_create (see arena.h).
 *
 * DESIGN: loop thread only.  The memfd is sealed against shrinking so that
 * no holder of a descriptor can truncate it under a mapping (which would
 * turn reads into SIGBUS in the daemon or the client).  It is also sealed
 * against future writes once the daemon's own read-write mapping exists,
 * and made 0400: a client holding the read-only descriptor cannot get a
 * writable one (reopening /proc/self/fd/N O_RDWR is refused by the mode,
 * and for root by the seal: no writable shared mapping, no write(), no
 * hole punch), so it cannot change or zero the slots the daemon fills.
 * The daemon's mapping made before the seal keeps writing.
 */
#include "mem/arena.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int arena_host_create(struct arena *a, uint32_t id, uint64_t bytes, const char *label)
{
	long page = sysconf(_SC_PAGESIZE);
	int rc;

	*a = (struct arena){.id = id, .kind = ARENA_HOST, .fd = -1};
	bytes = (bytes + (uint64_t)page - 1) / (uint64_t)page * (uint64_t)page;
	a->fd = memfd_create(label, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (a->fd < 0)
		return -errno;
	if (ftruncate(a->fd, (off_t)bytes) < 0)
		goto fail;
	a->host = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, a->fd, 0);
	if (a->host == MAP_FAILED) {
		a->host = NULL;
		goto fail;
	}
	a->bytes = bytes;
	/* After the mapping: F_SEAL_FUTURE_WRITE refuses writable mappings
	 * made from now on, the daemon's included.  F_SEAL_SEAL goes in the
	 * same call, so no one can add F_SEAL_WRITE later and stop the
	 * daemon's own writes.  The memfd is 0777 when made; the export
	 * below reopens it read-only, which 0400 still allows its owner. */
	if (fchmod(a->fd, 0400) < 0 ||
	    fcntl(a->fd, F_ADD_SEALS,
		  F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) < 0)
		goto fail;
	return 0;
fail:
	rc = -errno;
	arena_destroy(a);
	return rc;
}

int arena_host_export(const struct arena *a)
{
	char path[64];
	int fd;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", a->fd);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	return fd < 0 ? -errno : fd;
}

void arena_destroy(struct arena *a)
{
	if (a->host)
		munmap(a->host, a->bytes);
	if (a->fd >= 0)
		close(a->fd);
	a->host = NULL;
	a->fd = -1;
}
