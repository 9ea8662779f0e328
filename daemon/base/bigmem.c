/* Big transient buffers in huge pages, with a small reuse cache (bigmem.h). */
#include "base/bigmem.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "util.h"

#define BIGMEM_KEPT 16

static struct kept {
	void *p;
	size_t len; /* mapped: a multiple of BIGMEM_MIN */
	bool fresh; /* freed since the last trim */
} kept[BIGMEM_KEPT];
static unsigned nkept;
static size_t kept_bytes;

static void *map_new(size_t len)
{
	size_t lead;
	uint8_t *p;

	/* Aligned to a huge page, so that every 2 MiB of it can be one. */
	p = mmap(NULL, len + BIGMEM_MIN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
		 0);
	if (p == MAP_FAILED)
		return NULL;
	lead = align_up((uintptr_t)p, BIGMEM_MIN) - (uintptr_t)p;
	if (lead)
		munmap(p, lead);
	munmap(p + lead + len, BIGMEM_MIN - lead);
	p += lead;
	madvise(p, len, MADV_HUGEPAGE);
	return p;
}

/* Takes entry i out, the order (oldest first) kept. */
static void *take(unsigned i)
{
	void *p = kept[i].p;

	kept_bytes -= kept[i].len;
	nkept--;
	memmove(kept + i, kept + i + 1, (nkept - i) * sizeof(*kept));
	return p;
}

static void drop(unsigned i)
{
	size_t len = kept[i].len;

	munmap(take(i), len);
}

size_t big_size(size_t n)
{
	return n < BIGMEM_MIN ? n : align_up(n, BIGMEM_MIN);
}

void *big_alloc(size_t n)
{
	size_t len;

	if (n < BIGMEM_MIN)
		return malloc(n ? n : 1);
	len = big_size(n);
	for (unsigned i = 0; i < nkept; i++) {
		if (kept[i].len == len)
			return take(i);
	}
	return map_new(len);
}

void big_free(void *p, size_t n)
{
	size_t len;

	if (!p)
		return;
	if (n < BIGMEM_MIN) {
		free(p);
		return;
	}
	len = align_up(n, BIGMEM_MIN);
	if (len > BIGMEM_CACHE) {
		munmap(p, len);
		return;
	}
	/* Room made by dropping the oldest kept. */
	while (nkept && (nkept == BIGMEM_KEPT || kept_bytes + len > BIGMEM_CACHE))
		drop(0);
	kept[nkept++] = (struct kept){.p = p, .len = len, .fresh = true};
	kept_bytes += len;
}

void big_prefault(void *p, size_t n)
{
#ifdef MADV_POPULATE_WRITE
	size_t len = align_up(n, BIGMEM_MIN);

	if (!p || n < BIGMEM_MIN)
		return;
	/* The faults a first write would take, taken here; a buffer being
	 * written meanwhile keeps what is written.  A huge page per call:
	 * the call holds the process's mmap lock (for reading) throughout,
	 * and an mmap or munmap waiting for it, and every fault and madvise
	 * queued behind that one, the loop's too, would wait for all of it. */
	for (size_t off = 0; off < len; off += BIGMEM_MIN)
		if (madvise((uint8_t *)p + off, BIGMEM_MIN, MADV_POPULATE_WRITE) < 0)
			return;
#else
	(void)p;
	(void)n;
#endif
}

void big_trim(int all)
{
	for (unsigned i = nkept; i-- > 0;) {
		if (all || !kept[i].fresh)
			drop(i);
		else
			kept[i].fresh = false;
	}
}
