/*
 * pfcuda_fake.c — libprefetch's CUDA side for the unit tests: every function
 * of client/pfcuda.h on host memory, so that the client's device paths
 * (pool gathers, grouped launches, client copies, releases behind the
 * trainer's stream, slabs mapped and dropped) run in CI, which has no GPU.
 * The daemon's GPU layer has its own fake (gpu_fake.c), which this one
 * follows; pfcuda_fake.h lists what is kept faithful and the test hooks.
 *
 * The model, in the terms of the real driver:
 *  - a device address is a host address (as uint64_t) inside a live
 *    region: an imported arena or slab (the daemon's memfd mapped shared),
 *    a pfcuda_mem_alloc buffer, or the gather staging (pinned host memory
 *    the device reads where it lies).  Host ranges given to
 *    pfcuda_host_register are the host regions copies may read;
 *  - each stream is a queue of operations run in order: the gather stream
 *    of each struct pfcuda_gather, and one per handle the trainer names.
 *    An event is a mark in one stream's queue (the operations queued before
 *    its record); it is complete once its stream has run that far.  A
 *    stream wait queues the event's mark, and the waiting stream runs
 *    nothing past it until the other stream has got there;
 *  - nothing runs when it is queued.  Queries run a stream up to the
 *    event's mark as far as they can without waiting out the trainer's busy
 *    work; syncs run it all the way, busy work included (counted: the CPU
 *    would have blocked on the trainer's kernel);
 *  - every operation checks, when it runs, that what it reads and writes
 *    lies in live regions.  One that does not is a fault: counted, reported
 *    once on stderr, and skipped, as a wild access on a GPU would have
 *    killed the trainer's context (a test asserts there were none);
 *  - an unmapped or freed device range is kept reserved (PROT_NONE) until
 *    pfcuda_fake_reset, so that no later mapping lands where a stale device
 *    pointer still points: a gather that reads a dropped slab faults here
 *    instead of reading whatever was mapped next.
 *
 * The gather runs gather.cu's kernel in entry mode row by row, reading its
 * index (of 8-byte entries, or 4-byte entry ids with desc32), the slab
 * table and the staged rows when it runs, not when it is queued, as the
 * kernel does; a row the kernel would skip (a slab past the table or not
 * mapped, a staged row past nstaged) is counted in rows_skipped.  Table
 * mode and admissions are the daemon's and never reach this fake.
 *
 * DESIGN: one mutex (fake_lock) guards all state: the trainer's thread
 * calls the client (and so this fake) and the test hooks, the fake daemon's
 * thread calls pfcuda_fake_ipc_handle.  Queued operations run under the lock,
 * on the thread whose call forced them.
 */
#include "pfcuda_fake.h"
#include "gather.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* The driver's allocation granularity on an H200: FD arenas and slabs are
 * whole multiples of it (the daemon rounds them, GPU_MEM_ALIGN). */
#define FAKE_GRANULARITY (2u << 20)
#define FAKE_DEFAULT_MEM (80ull << 30)
/* pfcuda_gather_open's first slab table, as client/cuda_gather.c's. */
#define FAKE_BASES_MIN	 64
#define FAKE_MAX_HANDLES 256
#define FAKE_MAX_TOKENS	 1024
#define FAKE_MAX_SLOTLOG 8192
/* A test that queues this many operations without forcing any is broken. */
#define FAKE_MAX_OPS (1u << 20)

static const char ipc_magic[16] = "pfcuda-fake-ipc";

enum region_kind {
	REGION_DEVICE, /* imports, allocations, staging */
	REGION_HOST,   /* pfcuda_host_register */
};

struct region {
	struct region *next;
	enum region_kind kind;
	bool pinned; /* staging: host memory the device reads too */
	uint64_t base;
	uint64_t bytes;
};

/* A range once mapped, reserved PROT_NONE so that no mapping reuses it. */
struct tombstone {
	struct tombstone *next;
	void *base;
	size_t bytes;
};

enum op_kind {
	OP_COPY,     /* host (registered or pinned) -> device */
	OP_READ,     /* the trainer's read: device -> the test's memory */
	OP_SET_BASE, /* the slab table entry upload of pfcuda_gather_set_slab */
	OP_GATHER,
	OP_GROUP,
	OP_WAIT,
	OP_BUSY,
};

struct fstream;

struct op {
	enum op_kind kind;
	uint64_t dst, src; /* OP_COPY, OP_READ */
	size_t bytes;
	struct pfcuda_gather *g;     /* OP_SET_BASE, OP_GATHER, OP_GROUP: whose table */
	uint32_t slab;		     /* OP_SET_BASE */
	struct gpu_gather *p;	     /* OP_GATHER: owned copy of the parameter */
	struct gpu_gather_group *pg; /* OP_GROUP: owned copy */
	struct fstream *wait;	     /* OP_WAIT: NULL once the stream is gone */
	uint64_t wait_mark;
	int token; /* OP_BUSY */
};

struct fstream {
	struct fstream *next; /* in fake.streams */
	const void *key;      /* the trainer's handle */
	bool trainer;	      /* else a gather stream (no key) */
	struct op *ops;	      /* owned: queued, not run; ops[0] is op number done */
	size_t nops, cap;
	uint64_t queued; /* ops ever queued */
	uint64_t done;	 /* ops ever run */
};

struct fevent {
	struct fevent *next;	/* in fake.events */
	struct fstream *stream; /* NULL: never recorded, or its stream is gone */
	uint64_t mark;		/* the stream's ops before the record */
	int pending;		/* queries left that say -EAGAIN */
};

struct pfcuda_dev {
	int ordinal;
};

struct pfcuda_gather {
	struct pfcuda_dev *d;	/* borrowed */
	struct fstream *stream; /* owned (in fake.streams) */
	uint64_t *hbases;	/* owned: the host copy of the slab table */
	uint64_t *dbases;	/* owned: the device table the kernel reads */
	uint32_t cap;
	uint8_t *staging; /* owned mapping, a pinned region */
	size_t staging_bytes, staging_map;
};

enum token_state {
	TOKEN_FREE,
	TOKEN_BUSY,
	TOKEN_DONE,
};

static pthread_mutex_t fake_lock = PTHREAD_MUTEX_INITIALIZER;
/* Broadcast whenever work that held an event sync may have run: a token
 * freed, or work forced (a context or gather sync).  libprefetch's release
 * lanes wait on it in pfcuda_event_sync, as a thread does on a GPU. */
static pthread_cond_t fake_ran = PTHREAD_COND_INITIALIZER;

static struct {
	bool defaults_set;
	int event_delay;
	bool host_copy;
	bool group;
	int fail_allocs;
	uint64_t free_bytes, total_bytes;
	struct pfcuda_fake_counts n; /* live_maps, live_events: kept current */
	struct region *regions;	     /* owned */
	struct tombstone *tombs;     /* owned */
	struct fstream *streams;     /* owned: trainer streams; gather streams borrowed */
	struct fevent *events;	     /* borrowed: live events */
	struct {
		uint64_t serial;
		int fd; /* owned duplicate */
	} handles[FAKE_MAX_HANDLES];
	int nhandles;
	uint64_t serial;
	uint8_t tokens[FAKE_MAX_TOKENS];
	int ntokens;
	uint64_t slotlog[FAKE_MAX_SLOTLOG];
	int nslotlog;
} fake;

static void set_defaults(void)
{
	fake.defaults_set = true;
	fake.event_delay = 0;
	fake.host_copy = true;
	fake.group = true;
	fake.fail_allocs = 0;
	fake.free_bytes = FAKE_DEFAULT_MEM;
	fake.total_bytes = FAKE_DEFAULT_MEM;
}

static void lock(void)
{
	pthread_mutex_lock(&fake_lock);
	if (!fake.defaults_set)
		set_defaults();
}

static void unlock(void)
{
	pthread_cond_broadcast(&fake_ran);
	pthread_mutex_unlock(&fake_lock);
}

/* A fault: counted, the first one since the reset described on stderr. */
static __attribute__((format(printf, 1, 2))) void fault(const char *fmt, ...)
{
	va_list ap;

	if (fake.n.faults++)
		return;
	fprintf(stderr, "pfcuda_fake: fault: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "; skipped\n");
}

/* ---- regions ----------------------------------------------------------------- */

static int region_add(enum region_kind kind, bool pinned, uint64_t base, uint64_t bytes)
{
	struct region *r = calloc(1, sizeof(*r));

	if (!r)
		return -ENOMEM;
	r->kind = kind;
	r->pinned = pinned;
	r->base = base;
	r->bytes = bytes;
	r->next = fake.regions;
	fake.regions = r;
	fake.n.live_maps++;
	return 0;
}

/* Takes the region of kind that starts at base out of the list; its size,
 * or 0 when there is none. */
static uint64_t region_take(enum region_kind kind, uint64_t base)
{
	for (struct region **pp = &fake.regions; *pp; pp = &(*pp)->next) {
		struct region *r = *pp;
		uint64_t bytes;

		if (r->kind != kind || r->base != base)
			continue;
		*pp = r->next;
		bytes = r->bytes;
		free(r);
		fake.n.live_maps--;
		return bytes;
	}
	return 0;
}

static const struct region *region_of(enum region_kind kind, uint64_t p, uint64_t bytes)
{
	for (const struct region *r = fake.regions; r; r = r->next)
		if (r->kind == kind && p >= r->base && bytes <= r->bytes &&
		    p - r->base <= r->bytes - bytes)
			return r;
	return NULL;
}

/* What a kernel or a copy engine may touch: a device region. */
static bool device_ok(uint64_t p, uint64_t bytes)
{
	return bytes == 0 || region_of(REGION_DEVICE, p, bytes) != NULL;
}

/* Whether the pages of [p, p + bytes) are mapped in this process now: a
 * registered range the client unmapped without unregistering it must not
 * be read (mincore fails with ENOMEM on a hole). */
static bool mapped(uint64_t p, uint64_t bytes)
{
	const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
	uint64_t a = p & ~(page - 1), end = p + bytes;
	unsigned char vec[64];

	while (a < end) {
		uint64_t n = (end - a + page - 1) / page;

		if (n > sizeof(vec))
			n = sizeof(vec);
		if (mincore((void *)(uintptr_t)a, n * page, vec) < 0)
			return false;
		a += n * page;
	}
	return true;
}

/* What a copy may read from: registered host memory, or pinned staging. */
static bool host_ok(uint64_t p, uint64_t bytes)
{
	const struct region *r = region_of(REGION_HOST, p, bytes);

	if (r)
		return mapped(p, bytes);
	r = region_of(REGION_DEVICE, p, bytes);
	return r && r->pinned;
}

/* Unmaps a range this fake mapped and keeps it reserved: one mmap over it,
 * so that no other thread's mapping can slip in between. */
static void bury(void *base, size_t bytes)
{
	struct tombstone *t = calloc(1, sizeof(*t));
	void *p = mmap(base, bytes, PROT_NONE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);

	if (p == MAP_FAILED || !t) {
		/* Out of memory: given back instead, which only weakens the
		 * stale-pointer check. */
		if (p != MAP_FAILED)
			munmap(p, bytes);
		else
			munmap(base, bytes);
		free(t);
		return;
	}
	t->base = base;
	t->bytes = bytes;
	t->next = fake.tombs;
	fake.tombs = t;
}

/* ---- streams and events ------------------------------------------------------ */

static struct fstream *stream_new(const void *key, bool trainer)
{
	struct fstream *s = calloc(1, sizeof(*s));

	if (!s)
		return NULL;
	s->key = key;
	s->trainer = trainer;
	s->next = fake.streams;
	fake.streams = s;
	return s;
}

/* The trainer's stream of handle key, made on first use. */
static struct fstream *trainer_stream(const void *key)
{
	for (struct fstream *s = fake.streams; s; s = s->next)
		if (s->trainer && s->key == key)
			return s;
	return stream_new(key, true);
}

static int queue_op(struct fstream *s, const struct op *op)
{
	if (s->nops == s->cap) {
		size_t cap = s->cap ? 2 * s->cap : 16;
		struct op *t;

		if (cap > FAKE_MAX_OPS)
			return -ENOMEM;
		t = realloc(s->ops, cap * sizeof(*t));
		if (!t)
			return -ENOMEM;
		s->ops = t;
		s->cap = cap;
	}
	s->ops[s->nops++] = *op;
	s->queued++;
	return 0;
}

static void op_free(struct op *op)
{
	free(op->p);
	free(op->pg);
	op->p = NULL;
	op->pg = NULL;
}

static void record(struct fevent *e, struct fstream *s)
{
	e->stream = s;
	e->mark = s->queued;
	e->pending = fake.event_delay;
}

/* ---- the gather kernel ------------------------------------------------------- */

/* Row b of a batch whose slot is at slot and whose index is at desc, as
 * gather.cu's assemble_row builds it in entry mode. */
static void gather_row(const struct pfcuda_gather *g, const struct gpu_gather *p, uint64_t slot,
		       uint64_t desc, uint64_t b)
{
	const uint32_t nf = p->nfields < GPU_GATHER_MAX_FIELDS ? p->nfields : GPU_GATHER_MAX_FIELDS;
	const uint64_t width = p->desc32 ? sizeof(uint32_t) : sizeof(uint64_t);
	uint64_t src[GPU_GATHER_MAX_FIELDS], dst[GPU_GATHER_MAX_FIELDS], e;

	if (!device_ok(desc + b * width, width)) {
		fault("gather index entry %llu at %#llx lies outside device memory",
		      (unsigned long long)b, (unsigned long long)(desc + b * width));
		return;
	}
	if (p->table || p->admit) {
		fault("a client gather in table mode or with admissions (the daemon's)");
		return;
	}
	if (p->desc32) {
		/* 4-byte entry ids: entry mode only, as the kernel reads them
		 * (without the slab table it skips the row). */
		if (!p->bases) {
			fake.n.rows_skipped++;
			return;
		}
		e = ((const uint32_t *)(uintptr_t)desc)[b];
	} else {
		e = ((const uint64_t *)(uintptr_t)desc)[b];
	}
	if (e & GPU_GATHER_STAGED) {
		const uint64_t k = e & ~GPU_GATHER_STAGED;

		if (k >= p->nstaged) {
			fake.n.rows_skipped++;
			return;
		}
		for (uint32_t f = 0; f < nf; f++)
			src[f] = p->staged + p->staged_off[f] + k * p->row_bytes[f];
	} else if (p->bases) {
		const uint64_t slab = e >> p->slab_shift;
		uint64_t rec;

		if (slab >= p->nbases) {
			fake.n.rows_skipped++;
			return;
		}
		/* The table the launch named must still be the one there
		 * is (it is replaced only after a sync). */
		if (p->bases != (uint64_t)(uintptr_t)g->dbases || p->nbases > g->cap) {
			fault("the slab table of a queued gather was freed under it");
			return;
		}
		rec = g->dbases[slab];
		if (!rec) {
			fake.n.rows_skipped++;
			return;
		}
		rec += (e & ((1ull << p->slab_shift) - 1)) * p->rec_stride;
		for (uint32_t f = 0; f < nf; f++)
			src[f] = rec + p->rec_off[f];
	} else {
		fault("a client gather not in entry mode (no slab table)");
		return;
	}
	for (uint32_t f = 0; f < nf; f++) {
		dst[f] = slot + p->slot_off[f] + b * p->row_bytes[f];
		if (!device_ok(src[f], p->row_bytes[f]) || !device_ok(dst[f], p->row_bytes[f])) {
			fault("gather row %llu field %u: %u bytes %#llx -> %#llx leave device "
			      "memory (a slab or an arena unmapped under a queued gather?)",
			      (unsigned long long)b, f, p->row_bytes[f], (unsigned long long)src[f],
			      (unsigned long long)dst[f]);
			return; /* a row is all or nothing */
		}
	}
	for (uint32_t f = 0; f < nf; f++)
		if (p->row_bytes[f])
			memmove((void *)(uintptr_t)dst[f], (const void *)(uintptr_t)src[f],
				p->row_bytes[f]);
}

/* One block per row, as pf_gather_group: block b finds its batch k. */
static void run_group(const struct pfcuda_gather *g, const struct gpu_gather_group *pg)
{
	const uint32_t n = pg->n < GPU_GATHER_GROUP ? pg->n : GPU_GATHER_GROUP;

	for (uint64_t b = 0; b < pg->first[n]; b++) {
		uint32_t k = 0;

		while (k + 1 < n && b >= pg->first[k + 1])
			k++;
		if (b < pg->first[k] || b >= pg->first[k + 1]) {
			fake.n.rows_skipped++;
			continue;
		}
		gather_row(g, &pg->g, pg->slot[k], pg->desc[k], b - pg->first[k]);
	}
	fake.n.gathers_run += n;
}

static void exec(struct op *op)
{
	switch (op->kind) {
	case OP_COPY:
		fake.n.copies_run++;
		if (!host_ok(op->src, op->bytes) || !device_ok(op->dst, op->bytes)) {
			fault("copy of %zu bytes %#llx -> %#llx: the source is not registered host "
			      "memory or the destination not device memory (unregistered or "
			      "freed under a queued copy?)",
			      op->bytes, (unsigned long long)op->src, (unsigned long long)op->dst);
			break;
		}
		memmove((void *)(uintptr_t)op->dst, (const void *)(uintptr_t)op->src, op->bytes);
		break;
	case OP_READ:
		if (!device_ok(op->src, op->bytes)) {
			fault("the trainer's read of %zu bytes at %#llx leaves device memory",
			      op->bytes, (unsigned long long)op->src);
			break;
		}
		memcpy((void *)(uintptr_t)op->dst, (const void *)(uintptr_t)op->src, op->bytes);
		break;
	case OP_SET_BASE: op->g->dbases[op->slab] = op->g->hbases[op->slab]; break;
	case OP_GATHER:
		for (uint64_t b = 0; b < op->p->count; b++)
			gather_row(op->g, op->p, op->p->slot, op->p->desc, b);
		fake.n.gathers_run++;
		break;
	case OP_GROUP: run_group(op->g, op->pg); break;
	case OP_WAIT: break;
	case OP_BUSY: fake.tokens[op->token] = TOKEN_DONE; break;
	}
	op_free(op);
}

/* Runs s until mark ops have run: those it waits for on other streams
 * first.  Without force it stops at busy work that has not ended (a query
 * does not wait); with force it waits that out (a sync would).  True when
 * s got there. */
static bool run_to(struct fstream *s, uint64_t mark, bool force)
{
	while (s->done < mark && s->nops) {
		struct op *op = &s->ops[0];

		/* Events of the stream waited for were recorded before this
		 * wait was queued, so they never wait for s past here. */
		if (op->kind == OP_WAIT && op->wait && !run_to(op->wait, op->wait_mark, force))
			return false;
		op = &s->ops[0];
		if (op->kind == OP_BUSY && fake.tokens[op->token] == TOKEN_BUSY) {
			if (!force)
				return false;
			fake.n.busy_waits++;
		}
		exec(op);
		s->nops--;
		memmove(s->ops, s->ops + 1, s->nops * sizeof(*s->ops));
		s->done++;
	}
	return s->done >= mark;
}

static void run_all(void)
{
	for (struct fstream *s = fake.streams; s; s = s->next)
		run_to(s, s->queued, true);
}

/* A gather stream that goes: its work is done (the caller ran it), so
 * waits and events that name it are complete. */
static void stream_drop(struct fstream *gone)
{
	for (struct fstream **pp = &fake.streams; *pp; pp = &(*pp)->next) {
		if (*pp == gone) {
			*pp = gone->next;
			break;
		}
	}
	for (struct fstream *s = fake.streams; s; s = s->next)
		for (size_t i = 0; i < s->nops; i++)
			if (s->ops[i].kind == OP_WAIT && s->ops[i].wait == gone)
				s->ops[i].wait = NULL;
	for (struct fevent *e = fake.events; e; e = e->next)
		if (e->stream == gone)
			e->stream = NULL;
	for (size_t i = 0; i < gone->nops; i++)
		op_free(&gone->ops[i]);
	free(gone->ops);
	free(gone);
}

/* ---- test hooks -------------------------------------------------------------- */

void pfcuda_fake_reset(void)
{
	lock();
	set_defaults();
	/* The trainer's streams go with their queued work unrun: a read
	 * queued by an earlier test writes into memory that is gone.  A gather
	 * stream still here is a client that a failed test never closed: its
	 * work is dropped too, or the next test's syncs would run it (and
	 * count its faults). */
	for (struct fstream **pp = &fake.streams; *pp;) {
		struct fstream *s = *pp;

		if (s->trainer) {
			stream_drop(s);
			continue;
		}
		for (size_t i = 0; i < s->nops; i++)
			op_free(&s->ops[i]);
		s->done += s->nops;
		s->nops = 0;
		pp = &s->next;
	}
	while (fake.tombs) {
		struct tombstone *t = fake.tombs;

		fake.tombs = t->next;
		munmap(t->base, t->bytes);
		free(t);
	}
	for (int i = 0; i < fake.nhandles; i++)
		close(fake.handles[i].fd);
	fake.nhandles = 0;
	{
		int maps = fake.n.live_maps, events = fake.n.live_events;

		memset(&fake.n, 0, sizeof(fake.n));
		fake.n.live_maps = maps;
		fake.n.live_events = events;
	}
	memset(fake.tokens, 0, sizeof(fake.tokens));
	fake.ntokens = 0;
	fake.nslotlog = 0;
	unlock();
}

void pfcuda_fake_counts(struct pfcuda_fake_counts *out)
{
	lock();
	*out = fake.n;
	unlock();
}

void pfcuda_fake_set_event_delay(int queries)
{
	lock();
	fake.event_delay = queries < 0 ? 0 : queries;
	unlock();
}

void pfcuda_fake_set_host_copy(int yes)
{
	lock();
	fake.host_copy = yes != 0;
	unlock();
}

void pfcuda_fake_set_group(int yes)
{
	lock();
	fake.group = yes != 0;
	unlock();
}

void pfcuda_fake_fail_next_allocs(int n)
{
	lock();
	fake.fail_allocs = n < 0 ? 0 : n;
	unlock();
}

void pfcuda_fake_set_mem(uint64_t free_bytes, uint64_t total_bytes)
{
	lock();
	fake.free_bytes = free_bytes;
	fake.total_bytes = total_bytes;
	unlock();
}

int pfcuda_fake_ipc_handle(int fd, uint8_t handle[PFCUDA_IPC_HANDLE_BYTES])
{
	int dup_fd, rc = 0;

	lock();
	if (fake.nhandles == FAKE_MAX_HANDLES) {
		rc = -ENOSPC;
		goto out;
	}
	dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	if (dup_fd < 0) {
		rc = -errno;
		goto out;
	}
	fake.handles[fake.nhandles].serial = ++fake.serial;
	fake.handles[fake.nhandles].fd = dup_fd;
	fake.nhandles++;
	memset(handle, 0, PFCUDA_IPC_HANDLE_BYTES);
	memcpy(handle, ipc_magic, sizeof(ipc_magic));
	memcpy(handle + sizeof(ipc_magic), &fake.serial, sizeof(fake.serial));
out:
	unlock();
	return rc;
}

int pfcuda_fake_busy(void *stream)
{
	struct op op = {.kind = OP_BUSY};
	int rc;

	lock();
	if (fake.ntokens + 1 >= FAKE_MAX_TOKENS) {
		rc = -ENOSPC;
		goto out;
	}
	op.token = ++fake.ntokens;
	fake.tokens[op.token] = TOKEN_BUSY;
	rc = queue_op(trainer_stream(stream), &op);
	if (!rc)
		rc = op.token;
out:
	unlock();
	return rc;
}

void pfcuda_fake_unbusy(int token)
{
	lock();
	if (token > 0 && token <= fake.ntokens && fake.tokens[token] == TOKEN_BUSY)
		fake.tokens[token] = TOKEN_DONE;
	unlock();
}

int pfcuda_fake_read(void *stream, void *dst, uint64_t src, size_t bytes)
{
	struct op op = {
		.kind = OP_READ, .dst = (uint64_t)(uintptr_t)dst, .src = src, .bytes = bytes};
	struct fstream *s;
	int rc;

	lock();
	s = trainer_stream(stream);
	rc = s ? queue_op(s, &op) : -ENOMEM;
	unlock();
	return rc;
}

int pfcuda_fake_stream_sync(void *stream)
{
	int rc = 0;

	lock();
	for (struct fstream *s = fake.streams; s; s = s->next)
		if (s->trainer && s->key == stream && !run_to(s, s->queued, false))
			rc = -EAGAIN;
	unlock();
	return rc;
}

int pfcuda_fake_pending(void)
{
	int n = 0;

	lock();
	for (const struct fstream *s = fake.streams; s; s = s->next)
		n += (int)s->nops;
	unlock();
	return n;
}

int pfcuda_fake_gather_slots(uint64_t *out, int max)
{
	int n;

	lock();
	n = fake.nslotlog;
	for (int i = 0; i < n && i < max; i++)
		out[i] = fake.slotlog[i];
	unlock();
	return n;
}

static void log_slot(uint64_t slot)
{
	if (fake.nslotlog < FAKE_MAX_SLOTLOG)
		fake.slotlog[fake.nslotlog++] = slot;
}

/* ---- pfcuda.h: devices and arenas ---------------------------------------------- */

int pfcuda_open(int ordinal, struct pfcuda_dev **out, char *msg, size_t msglen)
{
	struct pfcuda_dev *d;

	*out = NULL;
	if (ordinal != 0) {
		set_err(msg, msglen, "fake CUDA: no device %d (there is one)", ordinal);
		return -ENODEV;
	}
	d = calloc(1, sizeof(*d));
	if (!d) {
		set_err(msg, msglen, "out of memory");
		return -ENOMEM;
	}
	d->ordinal = ordinal;
	*out = d;
	return 0;
}

void pfcuda_close(struct pfcuda_dev *d)
{
	free(d);
}

int pfcuda_ordinal(const struct pfcuda_dev *d)
{
	return d->ordinal;
}

/* The bus gpu_fake.c puts its device 0 on. */
int pfcuda_pci_bus_id(struct pfcuda_dev *d, char *buf, size_t len, char *msg, size_t msglen)
{
	if (len == 0)
		return -EINVAL;
	snprintf(buf, len, "0000:%02x:00.0", 0x10 + d->ordinal);
	return 0;
}

/* Maps bytes of fd shared and read-write as a device region. */
static int map_device(int fd, uint64_t bytes, struct pfcuda_arena *out, enum pfcuda_kind kind,
		      char *msg, size_t msglen)
{
	struct stat st;
	void *p;
	int rc;

	if (fstat(fd, &st) < 0) {
		rc = -errno;
		set_err(msg, msglen, "fake CUDA: fstat: %s", strerror(errno));
		return rc;
	}
	/* A mapping past the end of the file would be SIGBUS, not a fault. */
	if (bytes == 0 || (uint64_t)st.st_size < bytes) {
		set_err(msg, msglen, "fake CUDA: %llu bytes announced, the allocation has %llu",
			(unsigned long long)bytes, (unsigned long long)st.st_size);
		return -EINVAL;
	}
	p = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		rc = -errno;
		set_err(msg, msglen, "fake CUDA: mmap: %s", strerror(errno));
		return rc;
	}
	lock();
	rc = region_add(REGION_DEVICE, false, (uint64_t)(uintptr_t)p, bytes);
	unlock();
	if (rc) {
		munmap(p, (size_t)bytes);
		set_err(msg, msglen, "out of memory");
		return rc;
	}
	out->kind = kind;
	out->base = (uint64_t)(uintptr_t)p;
	out->bytes = bytes;
	return 0;
}

int pfcuda_import_fd(struct pfcuda_dev *d, int fd, uint64_t bytes, struct pfcuda_arena *out,
		     char *msg, size_t msglen)
{
	int rc;

	memset(out, 0, sizeof(*out));
	if (fd < 0) {
		set_err(msg, msglen, "no fd came with the arena");
		return -EBADF;
	}
	if (bytes % FAKE_GRANULARITY) {
		set_err(msg, msglen,
			"arena of %llu bytes is not a multiple of the %u-byte allocation "
			"granularity",
			(unsigned long long)bytes, FAKE_GRANULARITY);
		close(fd);
		return -EINVAL;
	}
	rc = map_device(fd, bytes, out, PFCUDA_ARENA_FD, msg, msglen);
	close(fd);
	return rc;
}

int pfcuda_import_legacy(struct pfcuda_dev *d, const uint8_t handle[PFCUDA_IPC_HANDLE_BYTES],
			 uint64_t bytes, struct pfcuda_arena *out, char *msg, size_t msglen)
{
	uint64_t serial;
	int fd = -1;

	memset(out, 0, sizeof(*out));
	memcpy(&serial, handle + sizeof(ipc_magic), sizeof(serial));
	lock();
	if (memcmp(handle, ipc_magic, sizeof(ipc_magic)) == 0)
		for (int i = 0; i < fake.nhandles; i++)
			if (fake.handles[i].serial == serial)
				fd = fake.handles[i].fd;
	unlock();
	if (fd < 0) {
		set_err(msg, msglen, "fake CUDA: not an IPC handle of this fake (invalid handle)");
		return -EIO;
	}
	return map_device(fd, bytes, out, PFCUDA_ARENA_LEGACY, msg, msglen);
}

int pfcuda_unmap(struct pfcuda_dev *d, struct pfcuda_arena *a, char *msg, size_t msglen)
{
	uint64_t bytes;

	if (!a->base)
		return 0;
	lock();
	/* Not a sync: queued work that still reads the range faults when
	 * it runs (the caller must have waited for it). */
	bytes = region_take(REGION_DEVICE, a->base);
	if (bytes) {
		bury((void *)(uintptr_t)a->base, (size_t)bytes);
		fake.n.unmaps++;
	}
	unlock();
	memset(a, 0, sizeof(*a));
	if (!bytes) {
		set_err(msg, msglen, "fake CUDA: unmap of a range that is not mapped");
		return -EINVAL;
	}
	return 0;
}

/* ---- pfcuda.h: events, syncs, memory ---------------------------------------- */

int pfcuda_event_create(struct pfcuda_dev *d, void **ev, char *msg, size_t msglen)
{
	struct fevent *e = calloc(1, sizeof(*e));

	*ev = NULL;
	if (!e) {
		set_err(msg, msglen, "out of memory");
		return -ENOMEM;
	}
	lock();
	e->next = fake.events;
	fake.events = e;
	fake.n.live_events++;
	unlock();
	*ev = e;
	return 0;
}

int pfcuda_event_record(struct pfcuda_dev *d, void *ev, void *stream, char *msg, size_t msglen)
{
	struct fstream *s;

	lock();
	s = trainer_stream(stream);
	if (s)
		record(ev, s);
	unlock();
	if (!s) {
		set_err(msg, msglen, "out of memory");
		return -ENOMEM;
	}
	return 0;
}

int pfcuda_event_query(struct pfcuda_dev *d, void *ev, char *msg, size_t msglen)
{
	struct fevent *e = ev;
	int rc = 0;

	lock();
	fake.n.event_queries++;
	if (!e->stream)
		rc = 0; /* never recorded: complete, as cuEventQuery says */
	else if (e->pending > 0) {
		e->pending--;
		rc = -EAGAIN;
	} else if (!run_to(e->stream, e->mark, false)) {
		rc = -EAGAIN;
	}
	unlock();
	return rc;
}

int pfcuda_event_sync(struct pfcuda_dev *d, void *ev, char *msg, size_t msglen)
{
	struct fevent *e = ev;

	lock();
	fake.n.event_syncs++;
	/* Asleep until the trainer's busy work before the mark is done (a
	 * pfcuda_fake_unbusy, or a sync that forces it): as on a GPU, a wait
	 * never finishes the trainer's work early. */
	while (e->stream && !run_to(e->stream, e->mark, false))
		pthread_cond_wait(&fake_ran, &fake_lock);
	e->pending = 0;
	unlock();
	return 0;
}

void pfcuda_event_destroy(struct pfcuda_dev *d, void *ev)
{
	if (!ev)
		return;
	lock();
	for (struct fevent **pp = &fake.events; *pp; pp = &(*pp)->next) {
		if (*pp == ev) {
			*pp = ((struct fevent *)ev)->next;
			fake.n.live_events--;
			break;
		}
	}
	unlock();
	free(ev);
}

int pfcuda_sync(struct pfcuda_dev *d, char *msg, size_t msglen)
{
	lock();
	fake.n.syncs++;
	run_all();
	unlock();
	return 0;
}

int pfcuda_mem_info(struct pfcuda_dev *d, uint64_t *free_bytes, uint64_t *total_bytes, char *msg,
		    size_t msglen)
{
	lock();
	*free_bytes = fake.free_bytes;
	*total_bytes = fake.total_bytes;
	unlock();
	return 0;
}

int pfcuda_copy_dtoh(struct pfcuda_dev *d, void *dst, uint64_t src, size_t bytes, char *msg,
		     size_t msglen)
{
	int rc = 0;

	lock();
	/* Synchronous on the legacy default stream: its work first. */
	{
		struct fstream *s = trainer_stream(NULL);

		if (s)
			run_to(s, s->queued, true);
	}
	if (!device_ok(src, bytes)) {
		fault("pfcuda_copy_dtoh of %zu bytes at %#llx leaves device memory", bytes,
		      (unsigned long long)src);
		set_err(msg, msglen, "fake CUDA: an illegal address");
		rc = -EIO;
	} else {
		memcpy(dst, (const void *)(uintptr_t)src, bytes);
	}
	unlock();
	return rc;
}

int pfcuda_mem_alloc(struct pfcuda_dev *d, uint64_t bytes, uint64_t *devptr, char *msg,
		     size_t msglen)
{
	const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
	uint64_t size = align_up(bytes ? bytes : 1, page);
	void *p;
	int rc;

	*devptr = 0;
	lock();
	if (fake.fail_allocs > 0 || size > fake.free_bytes) {
		if (fake.fail_allocs > 0)
			fake.fail_allocs--;
		unlock();
		set_err(msg, msglen, "fake CUDA: out of memory");
		return -ENOMEM;
	}
	p = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	rc = p == MAP_FAILED ? -ENOMEM
			     : region_add(REGION_DEVICE, false, (uint64_t)(uintptr_t)p, size);
	if (!rc)
		fake.free_bytes -= size;
	else if (p != MAP_FAILED)
		munmap(p, (size_t)size);
	unlock();
	if (rc) {
		set_err(msg, msglen, "out of memory");
		return rc;
	}
	*devptr = (uint64_t)(uintptr_t)p;
	return 0;
}

int pfcuda_mem_free(struct pfcuda_dev *d, uint64_t devptr)
{
	uint64_t bytes;

	if (!devptr)
		return 0;
	lock();
	/* No implicit sync: work still queued on the buffer faults. */
	bytes = region_take(REGION_DEVICE, devptr);
	if (bytes) {
		bury((void *)(uintptr_t)devptr, (size_t)bytes);
		fake.free_bytes += bytes;
	}
	unlock();
	return bytes ? 0 : -EINVAL;
}

/* ---- pfcuda.h: the client's gather ------------------------------------------- */

int pfcuda_gather_open(struct pfcuda_dev *d, struct pfcuda_gather **out, char *msg, size_t msglen)
{
	struct pfcuda_gather *g = calloc(1, sizeof(*g));

	*out = NULL;
	if (!g) {
		set_err(msg, msglen, "out of memory");
		return -ENOMEM;
	}
	g->d = d;
	g->cap = FAKE_BASES_MIN;
	g->hbases = calloc(g->cap, sizeof(*g->hbases));
	g->dbases = calloc(g->cap, sizeof(*g->dbases));
	lock();
	g->stream = stream_new(NULL, false);
	unlock();
	if (!g->hbases || !g->dbases || !g->stream) {
		pfcuda_gather_close(g);
		set_err(msg, msglen, "out of memory");
		return -ENOMEM;
	}
	*out = g;
	return 0;
}

void pfcuda_gather_close(struct pfcuda_gather *g)
{
	if (!g)
		return;
	lock();
	if (g->stream) {
		run_to(g->stream, g->stream->queued, true);
		stream_drop(g->stream);
	}
	if (g->staging) {
		region_take(REGION_DEVICE, (uint64_t)(uintptr_t)g->staging);
		bury(g->staging, g->staging_map);
	}
	unlock();
	free(g->hbases);
	free(g->dbases);
	free(g);
}

int pfcuda_gather_sync(struct pfcuda_gather *g, char *msg, size_t msglen)
{
	lock();
	fake.n.syncs++;
	run_to(g->stream, g->stream->queued, true);
	unlock();
	return 0;
}

int pfcuda_gather_set_slab(struct pfcuda_gather *g, uint32_t slab, uint64_t base, char *msg,
			   size_t msglen)
{
	struct op op = {.kind = OP_SET_BASE, .g = g, .slab = slab};
	int rc;

	lock();
	if (slab >= g->cap) {
		uint32_t cap = g->cap;
		uint64_t *h, *dv;

		while (cap <= slab)
			cap *= 2;
		h = calloc(cap, sizeof(*h));
		dv = calloc(cap, sizeof(*dv));
		if (!h || !dv) {
			unlock();
			free(h);
			free(dv);
			set_err(msg, msglen, "out of memory");
			return -ENOMEM;
		}
		/* As client/cuda_gather.c's grow_bases: the stream is idle before
		 * the old table goes, and the new one starts as the host's. */
		run_to(g->stream, g->stream->queued, true);
		memcpy(h, g->hbases, g->cap * sizeof(*h));
		memcpy(dv, g->hbases, g->cap * sizeof(*dv));
		free(g->hbases);
		free(g->dbases);
		g->hbases = h;
		g->dbases = dv;
		g->cap = cap;
	}
	/* The upload reads the host entry when it runs, as a copy from
	 * pinned memory does. */
	g->hbases[slab] = base;
	rc = queue_op(g->stream, &op);
	unlock();
	if (rc)
		set_err(msg, msglen, "out of memory");
	return rc;
}

int pfcuda_gather_staging(struct pfcuda_gather *g, size_t bytes, void **host, char *msg,
			  size_t msglen)
{
	const size_t page = (size_t)sysconf(_SC_PAGESIZE);
	size_t map;
	void *p;
	int rc;

	if (g->staging && g->staging_bytes >= bytes) {
		*host = g->staging;
		return 0;
	}
	map = align_up(bytes ? bytes : 1, page);
	lock();
	/* Queued launches read the old one. */
	run_to(g->stream, g->stream->queued, true);
	if (g->staging) {
		region_take(REGION_DEVICE, (uint64_t)(uintptr_t)g->staging);
		bury(g->staging, g->staging_map);
		g->staging = NULL;
		g->staging_bytes = g->staging_map = 0;
	}
	p = mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	rc = p == MAP_FAILED ? -ENOMEM
			     : region_add(REGION_DEVICE, true, (uint64_t)(uintptr_t)p, map);
	if (rc && p != MAP_FAILED)
		munmap(p, map);
	if (!rc) {
		g->staging = p;
		g->staging_bytes = bytes;
		g->staging_map = map;
	}
	unlock();
	if (rc) {
		set_err(msg, msglen, "fake CUDA: out of pinned memory");
		return rc;
	}
	*host = p;
	return 0;
}

/* The device address of a host address inside the staging, as the real
 * launch computes it; 0 (never device memory) for one outside it, which
 * the real launch would turn into a wild pointer. */
static uint64_t staging_dev(const struct pfcuda_gather *g, uint64_t host, uint64_t bytes)
{
	uint64_t base = (uint64_t)(uintptr_t)g->staging;

	if (!g->staging || host < base || bytes > g->staging_bytes ||
	    host - base > g->staging_bytes - bytes)
		return 0;
	return host;
}

int pfcuda_gather_launch(struct pfcuda_gather *g, struct gpu_gather *p, const void *ids,
			 size_t ids_bytes, void *event, char *msg, size_t msglen)
{
	struct op op = {.kind = OP_GATHER, .g = g};
	int rc = 0;

	lock();
	p->bases = (uint64_t)(uintptr_t)g->dbases;
	p->nbases = g->cap;
	p->admit = 0;
	if (ids_bytes)
		p->desc = staging_dev(g, (uint64_t)(uintptr_t)ids, ids_bytes);
	if (p->count) {
		op.p = malloc(sizeof(*op.p));
		if (!op.p) {
			rc = -ENOMEM;
			goto out;
		}
		*op.p = *p; /* by value, as the kernel parameter */
		rc = queue_op(g->stream, &op);
		if (rc) {
			free(op.p);
			goto out;
		}
		fake.n.launches++;
		log_slot(p->slot);
	}
	record(event, g->stream);
out:
	unlock();
	if (rc)
		set_err(msg, msglen, "out of memory");
	return rc;
}

bool pfcuda_gather_can_group(const struct pfcuda_gather *g)
{
	bool yes;

	lock();
	yes = fake.group;
	unlock();
	return yes;
}

int pfcuda_gather_launch_group(struct pfcuda_gather *g, struct gpu_gather_group *p, void *event,
			       char *msg, size_t msglen)
{
	struct op op = {.kind = OP_GROUP, .g = g};
	int rc = 0;

	lock();
	if (!fake.group || p->n == 0 || p->n > GPU_GATHER_GROUP) {
		unlock();
		set_err(msg, msglen, "no group gather of %u batches", p->n);
		return -EINVAL;
	}
	p->g.bases = (uint64_t)(uintptr_t)g->dbases;
	p->g.nbases = g->cap;
	p->g.admit = 0;
	p->g.nstaged = 0;
	for (uint32_t k = 0; k < p->n; k++)
		p->desc[k] =
			staging_dev(g, p->desc[k],
				    (uint64_t)(p->first[k + 1] - p->first[k]) *
					    (p->g.desc32 ? sizeof(uint32_t) : sizeof(uint64_t)));
	if (p->first[p->n]) {
		op.pg = malloc(sizeof(*op.pg));
		if (!op.pg) {
			rc = -ENOMEM;
			goto out;
		}
		*op.pg = *p;
		rc = queue_op(g->stream, &op);
		if (rc) {
			free(op.pg);
			goto out;
		}
		fake.n.group_launches++;
		fake.n.group_batches += p->n;
		if (p->n > fake.n.group_most)
			fake.n.group_most = p->n;
		for (uint32_t k = 0; k < p->n; k++)
			log_slot(p->slot[k]);
	}
	/* One event for the launch. */
	record(event, g->stream);
out:
	unlock();
	if (rc)
		set_err(msg, msglen, "out of memory");
	return rc;
}

int pfcuda_stream_wait(struct pfcuda_dev *d, void *stream, void *event, char *msg, size_t msglen)
{
	struct fevent *e = event;
	struct fstream *s;
	int rc = 0;

	lock();
	fake.n.stream_waits++;
	s = trainer_stream(stream);
	if (!s) {
		rc = -ENOMEM;
	} else if (e->stream && e->stream != s) {
		/* The event's latest record, as cuStreamWaitEvent takes it:
		 * a later record does not move this wait. */
		struct op op = {.kind = OP_WAIT, .wait = e->stream, .wait_mark = e->mark};

		rc = queue_op(s, &op);
	}
	unlock();
	if (rc)
		set_err(msg, msglen, "out of memory");
	return rc;
}

/* ---- pfcuda.h: client copies ---------------------------------------------------- */

bool pfcuda_can_copy_from_host(struct pfcuda_dev *d)
{
	bool yes;

	lock();
	yes = fake.host_copy;
	unlock();
	return yes;
}

int pfcuda_host_register(struct pfcuda_dev *d, void *p, size_t bytes, char *msg, size_t msglen)
{
	uint64_t a = (uint64_t)(uintptr_t)p;
	int rc = 0;

	lock();
	if (!p || !bytes || !mapped(a, bytes)) {
		rc = -EINVAL;
		set_err(msg, msglen, "fake CUDA: registering memory that is not mapped");
		goto out;
	}
	for (const struct region *r = fake.regions; r; r = r->next) {
		if (r->kind == REGION_HOST && a < r->base + r->bytes && r->base < a + bytes) {
			/* cudaErrorHostMemoryAlreadyRegistered */
			rc = -EEXIST;
			set_err(msg, msglen, "fake CUDA: the range is registered already");
			goto out;
		}
	}
	rc = region_add(REGION_HOST, false, a, bytes);
	if (rc)
		set_err(msg, msglen, "out of memory");
out:
	unlock();
	return rc;
}

void pfcuda_host_unregister(struct pfcuda_dev *d, void *p)
{
	lock();
	/* Not a sync: a copy still queued from it faults when it runs. */
	region_take(REGION_HOST, (uint64_t)(uintptr_t)p);
	unlock();
}

int pfcuda_gather_copy(struct pfcuda_gather *g, uint64_t dst, const void *src, size_t bytes,
		       void *event, void *event2, char *msg, size_t msglen)
{
	struct op op = {
		.kind = OP_COPY, .dst = dst, .src = (uint64_t)(uintptr_t)src, .bytes = bytes};
	int rc;

	lock();
	rc = queue_op(g->stream, &op);
	if (!rc) {
		fake.n.copies++;
		record(event, g->stream);
		if (event2)
			record(event2, g->stream);
	}
	unlock();
	if (rc)
		set_err(msg, msglen, "out of memory");
	return rc;
}
