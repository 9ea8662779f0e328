/*
 * gpu_fake.c — the GPU back end of the unit tests: host memory stands in for
 * device memory, so the daemon's transfer stage, arenas, governor and OOM
 * handling run on a machine with no GPU.
 *
 * What it keeps faithful, so that a test passing here means something:
 *  - device pointers are host addresses (as uint64_t) inside live allocations,
 *    and a copy touching bytes outside every live allocation of its stream's
 *    device fails with -EFAULT instead of scribbling;
 *  - copies are asynchronous: they are queued on their stream and run only
 *    when an event recorded after them completes (gpu_event_query returning
 *    0, gpu_event_sync) or the stream is synchronised or destroyed.  A
 *    caller that rewrites a host source before its copy has retired, or
 *    reads an arena before the event fired, sees wrong bytes here as it
 *    would on a GPU;
 *  - gpu_gather is queued like a copy and, when it runs, assembles the batch
 *    with the kernel's semantics on host memory.  It reads desc, admit and
 *    the staged rows at run time (an H2D queued just before it wrote them),
 *    and checks each range it reads or writes against the live allocations: a
 *    row that leaves them is logged and skipped, so the test sees wrong
 *    bytes.  An admission into a record that a row of the same call reads
 *    (or another admission writes) is a race on a GPU, where the blocks run
 *    concurrently: it is logged and skipped too;
 *  - FD allocations are memfds, so the SCM_RIGHTS path and a client's mmap of the
 *    fd see the very bytes the daemon copied; LEGACY and NONE ones are
 *    anonymous mappings;
 *  - allocations draw from a settable free-memory figure per device and can
 *    be made to fail (-ENOMEM), for the governor's OOM path;
 *  - nothing works before gpu_init, as with the real back end.
 *
 * DESIGN: one mutex (fake_lock) guards all state, so loop, reader and
 * transfer threads of a test daemon may call in at once.  Queued copies and
 * gathers run under the lock.
 */
#include "gpu/gpu.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/log.h"

#define FAKE_MAX_DEV	 16
#define FAKE_MAX_REGIONS 64
/* A test that queues this many copies without ever waiting is broken. */
#define FAKE_MAX_OPS	 (1u << 20)
#define FAKE_DEFAULT_MEM (80ull << 30) /* an 80 GiB card */

struct fake_mem {
	struct fake_mem *next;
	int dev;
	void *base; /* owned: mmap of bytes */
	uint64_t bytes;
};

enum fake_op_kind {
	FAKE_COPY,   /* H2D or D2D: a memmove */
	FAKE_GATHER, /* gpu_gather */
};

struct fake_op {
	enum fake_op_kind kind;
	/* FAKE_COPY */
	uint64_t dst;
	const void *src; /* borrowed: the caller keeps it intact until the op runs */
	size_t bytes;
	/* FAKE_GATHER: the caller's struct, copied (as the kernel parameter
	 * is); what its addresses point to is read only when the op runs. */
	struct gpu_gather *gather; /* owned, freed when the op has run */
};

struct gpu_stream {
	struct gpu_stream *next; /* in fake.streams */
	int dev;
	struct fake_op *ops; /* owned: queued, not yet run */
	size_t nops, cap;
	uint64_t queued; /* ops ever queued */
	uint64_t done;	 /* ops ever run; ops[0] is op number done */
};

struct gpu_event {
	struct gpu_event *next; /* in fake.events */
	int dev;
	struct gpu_stream *stream; /* borrowed: cleared when the stream goes */
	uint64_t mark;		   /* ops of stream before the record */
	int pending;		   /* queries left that report -EAGAIN */
};

static pthread_mutex_t fake_lock = PTHREAD_MUTEX_INITIALIZER;

static struct {
	bool defaults_set;
	int ndev;   /* what gpu_init will report */
	int inited; /* devices since the last successful gpu_init, else 0 */
	int fail_allocs;
	int event_delay;
	bool hold_events; /* gpu_fake_hold_events */
	uint64_t free_bytes[FAKE_MAX_DEV];
	uint64_t total_bytes[FAKE_MAX_DEV];
	struct fake_mem *mems; /* owned: live allocations */
	int live_mems;
	int gathers_run; /* gather kernels run (gpu_fake_gathers_run) */
	uint64_t serial;
	struct {
		char *p;
		size_t bytes;
	} regions[FAKE_MAX_REGIONS];
	int nregions;
	struct gpu_stream *streams; /* borrowed: every live stream */
	struct gpu_event *events;   /* borrowed: every live event */
} fake;

static void set_defaults(void)
{
	int i;

	fake.defaults_set = true;
	fake.ndev = 1;
	fake.inited = 0;
	fake.fail_allocs = 0;
	fake.event_delay = 0;
	fake.hold_events = false;
	for (i = 0; i < FAKE_MAX_DEV; i++) {
		fake.free_bytes[i] = FAKE_DEFAULT_MEM;
		fake.total_bytes[i] = FAKE_DEFAULT_MEM;
	}
}

/* Locks and applies the defaults on first use. */
static void lock(void)
{
	pthread_mutex_lock(&fake_lock);
	if (!fake.defaults_set)
		set_defaults();
}

static void unlock(void)
{
	pthread_mutex_unlock(&fake_lock);
}

static bool dev_ok(int dev)
{
	return dev >= 0 && dev < fake.inited;
}

/* ---- test hooks ----------------------------------------------------------- */

void gpu_fake_reset(void)
{
	lock();
	set_defaults();
	unlock();
}

void gpu_fake_set_devices(int n)
{
	lock();
	fake.ndev = n < 0 ? 0 : n > FAKE_MAX_DEV ? FAKE_MAX_DEV : n;
	unlock();
}

void gpu_fake_fail_next_allocs(int n)
{
	lock();
	fake.fail_allocs = n < 0 ? 0 : n;
	unlock();
}

void gpu_fake_set_mem(uint64_t free_bytes, uint64_t total_bytes)
{
	int i;

	lock();
	for (i = 0; i < FAKE_MAX_DEV; i++) {
		fake.free_bytes[i] = free_bytes;
		fake.total_bytes[i] = total_bytes;
	}
	unlock();
}

void gpu_fake_set_event_delay(int queries)
{
	lock();
	fake.event_delay = queries < 0 ? 0 : queries;
	unlock();
}

void gpu_fake_hold_events(bool hold)
{
	lock();
	fake.hold_events = hold;
	unlock();
}

int gpu_fake_live_allocs(void)
{
	int n;

	lock();
	n = fake.live_mems;
	unlock();
	return n;
}

int gpu_fake_gathers_run(void)
{
	int n;

	lock();
	n = fake.gathers_run;
	unlock();
	return n;
}

int gpu_fake_host_registrations(void)
{
	int n;

	lock();
	n = fake.nregions;
	unlock();
	return n;
}

/* ---- devices ------------------------------------------------------------- */

int gpu_init(char *desc, size_t len)
{
	int n;

	lock();
	n = fake.ndev;
	fake.inited = n;
	unlock();
	if (n <= 0) {
		snprintf(desc, len, "no CUDA device (fake)");
		return -ENODEV;
	}
	snprintf(desc, len, "%d fake CUDA device%s (host memory)", n, n == 1 ? "" : "s");
	return n;
}

int gpu_device_count(void)
{
	int n;

	lock();
	n = fake.inited;
	unlock();
	return n;
}

int gpu_device_name(int dev, char *buf, size_t len)
{
	int rc = 0;

	if (len == 0)
		return -EINVAL;
	lock();
	if (!dev_ok(dev)) {
		buf[0] = '\0';
		rc = -ENODEV;
	} else {
		snprintf(buf, len, "Fake GPU %d", dev);
	}
	unlock();
	return rc;
}

/* Fake device i sits on bus 0x10 + i. */
int gpu_device_pci_bus_id(int dev, char *buf, size_t len)
{
	int rc = 0;

	if (len == 0)
		return -EINVAL;
	lock();
	if (!dev_ok(dev)) {
		buf[0] = '\0';
		rc = -ENODEV;
	} else {
		snprintf(buf, len, "0000:%02x:00.0", 0x10 + dev);
	}
	unlock();
	return rc;
}

int gpu_device_by_pci_bus_id(const char *bus_id)
{
	unsigned int domain, bus, slot, fn;
	int dev = -ENODEV;
	char end;

	if (sscanf(bus_id, "%x:%x:%x.%x%c", &domain, &bus, &slot, &fn, &end) != 4)
		return -ENODEV;
	lock();
	if (domain == 0 && slot == 0 && fn == 0 && bus >= 0x10 && dev_ok((int)bus - 0x10))
		dev = (int)bus - 0x10;
	unlock();
	return dev;
}

int gpu_mem_info(int dev, uint64_t *free_bytes, uint64_t *total_bytes)
{
	int rc = 0;

	lock();
	if (!dev_ok(dev)) {
		rc = -ENODEV;
	} else {
		*free_bytes = fake.free_bytes[dev];
		*total_bytes = fake.total_bytes[dev];
	}
	unlock();
	return rc;
}

int gpu_host_register(void *p, size_t bytes)
{
	char *c = p;
	int i, rc = 0;

	lock();
	if (!fake.inited) {
		rc = -ENODEV;
		goto out;
	}
	if (!p || bytes == 0) {
		rc = -EINVAL;
		goto out;
	}
	for (i = 0; i < fake.nregions; i++) {
		if (c < fake.regions[i].p + fake.regions[i].bytes &&
		    fake.regions[i].p < c + bytes) {
			rc = -EEXIST; /* overlaps, as cudaErrorHostMemoryAlreadyRegistered */
			goto out;
		}
	}
	if (fake.nregions == FAKE_MAX_REGIONS) {
		rc = -ENOMEM;
		goto out;
	}
	fake.regions[fake.nregions].p = c;
	fake.regions[fake.nregions].bytes = bytes;
	fake.nregions++;
out:
	unlock();
	return rc;
}

int gpu_host_unregister(void *p)
{
	int i, rc = -ENOENT;

	lock();
	if (!fake.inited) {
		rc = -ENODEV;
		goto out;
	}
	for (i = 0; i < fake.nregions; i++) {
		if (fake.regions[i].p == p) {
			fake.regions[i] = fake.regions[--fake.nregions];
			rc = 0;
			break;
		}
	}
out:
	unlock();
	return rc;
}

/* ---- streams and copies -------------------------------------------------- */

/* True when [p, p + bytes) lies inside one live allocation of dev. */
static bool in_live_mem(int dev, uint64_t p, size_t bytes)
{
	struct fake_mem *a;

	for (a = fake.mems; a; a = a->next) {
		uint64_t base = (uint64_t)(uintptr_t)a->base;

		if (a->dev == dev && p >= base && bytes <= a->bytes && p - base <= a->bytes - bytes)
			return true;
	}
	return false;
}

/* The problems one gather met when it ran: the first is logged in full, the
 * rest only counted, so a broken test does not drown its own output. */
struct gather_report {
	int dev;
	int problems;
};

static __attribute__((format(printf, 2, 3))) void gather_problem(struct gather_report *r,
								 const char *fmt, ...)
{
	char msg[256];
	va_list ap;

	if (r->problems++)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	log_err("gpu_fake: gather on device %d: %s; skipped", r->dev, msg);
}

/* The bytes of a record that some field touches: [rec + lo, rec + hi). */
static void record_extent(const struct gpu_gather *g, uint64_t *lo, uint64_t *hi)
{
	uint32_t f;

	*lo = UINT64_MAX;
	*hi = 0;
	for (f = 0; f < g->nfields; f++) {
		if (!g->row_bytes[f])
			continue;
		if (g->rec_off[f] < *lo)
			*lo = g->rec_off[f];
		if ((uint64_t)g->rec_off[f] + g->row_bytes[f] > *hi)
			*hi = (uint64_t)g->rec_off[f] + g->row_bytes[f];
	}
	if (*lo > *hi)
		*lo = *hi = 0;
}

static bool records_overlap(uint64_t a, uint64_t b, uint64_t lo, uint64_t hi)
{
	return hi > lo && a + lo < b + hi && b + lo < a + hi;
}

/* Copies field by field from the sources to the destinations of one row,
 * or nothing when any range leaves device memory: a row is all or nothing. */
static void gather_row(struct gather_report *r, const struct gpu_gather *g, const char *what,
		       uint64_t row, const uint64_t *dst, const uint64_t *src)
{
	uint32_t f;

	for (f = 0; f < g->nfields; f++) {
		if (!g->row_bytes[f])
			continue;
		if (!in_live_mem(r->dev, src[f], g->row_bytes[f]) ||
		    !in_live_mem(r->dev, dst[f], g->row_bytes[f])) {
			gather_problem(
				r, "%s %llu field %u: %u bytes %#llx -> %#llx leave device memory",
				what, (unsigned long long)row, f, g->row_bytes[f],
				(unsigned long long)src[f], (unsigned long long)dst[f]);
			return;
		}
	}
	for (f = 0; f < g->nfields; f++)
		if (g->row_bytes[f])
			memmove((void *)(uintptr_t)dst[f], (const void *)(uintptr_t)src[f],
				g->row_bytes[f]);
}

/* Row i's desc entry: 8 bytes, or a 4-byte entry id (desc32). */
static uint64_t desc_entry(const struct gpu_gather *g, const uint8_t *desc, uint64_t i)
{
	if (g->desc32)
		return ((const uint32_t *)desc)[i];
	return ((const uint64_t *)desc)[i];
}

/* Runs one gather as the kernel would, rows before admissions (the order a
 * race-free call cannot tell from the kernel's). */
static void run_gather(int dev, const struct gpu_gather *g)
{
	struct gather_report r = {.dev = dev};
	uint64_t dst[GPU_GATHER_MAX_FIELDS], src[GPU_GATHER_MAX_FIELDS];
	const uint8_t *desc = (const uint8_t *)(uintptr_t)g->desc;
	const uint64_t *admit = (const uint64_t *)(uintptr_t)g->admit;
	const size_t width = g->desc32 ? sizeof(uint32_t) : sizeof(uint64_t);
	uint64_t i, j, k, lo, hi, e;
	uint32_t f;

	if (g->count && !in_live_mem(dev, g->desc, (size_t)g->count * width)) {
		gather_problem(&r, "desc %#llx leaves device memory", (unsigned long long)g->desc);
		desc = NULL;
	}
	if (g->nstaged && g->admit &&
	    !in_live_mem(dev, g->admit, (size_t)g->nstaged * sizeof(*admit))) {
		gather_problem(&r, "admit %#llx leaves device memory",
			       (unsigned long long)g->admit);
		admit = NULL;
	}
	if (g->table && !in_live_mem(dev, g->table, (size_t)g->table_n * sizeof(uint64_t))) {
		gather_problem(&r, "table %#llx leaves device memory",
			       (unsigned long long)g->table);
		desc = NULL;
	}
	for (i = 0; desc && i < g->count; i++) {
		e = desc_entry(g, desc, i);
		if (g->table && !g->desc32) {
			/* Table mode: desc holds picks. */
			uint64_t rec = ((const uint64_t *)(uintptr_t)g->table)[e % g->table_n];

			for (f = 0; f < g->nfields; f++)
				src[f] = rec + g->rec_off[f];
		} else if (e & GPU_GATHER_STAGED) {
			k = e & ~GPU_GATHER_STAGED;
			if (k >= g->nstaged) {
				gather_problem(&r, "row %llu names staged row %llu of %u",
					       (unsigned long long)i, (unsigned long long)k,
					       g->nstaged);
				continue;
			}
			for (f = 0; f < g->nfields; f++)
				src[f] = g->staged + g->staged_off[f] + k * g->row_bytes[f];
		} else if (g->bases) {
			/* Entry mode (the client's gather): the slab's base
			 * from the bases array, as the kernel reads it. */
			uint64_t slab = e >> g->slab_shift, rec;

			if (slab >= g->nbases ||
			    !in_live_mem(dev, g->bases + slab * sizeof(uint64_t),
					 sizeof(uint64_t)) ||
			    !(rec = ((const uint64_t *)(uintptr_t)g->bases)[slab])) {
				gather_problem(&r,
					       "row %llu names entry %#llx of a slab not mapped",
					       (unsigned long long)i, (unsigned long long)e);
				continue;
			}
			rec += (e & ((1ull << g->slab_shift) - 1)) * g->rec_stride;
			for (f = 0; f < g->nfields; f++)
				src[f] = rec + g->rec_off[f];
		} else {
			for (f = 0; f < g->nfields; f++)
				src[f] = e + g->rec_off[f];
		}
		for (f = 0; f < g->nfields; f++)
			dst[f] = g->slot + g->slot_off[f] + i * g->row_bytes[f];
		gather_row(&r, g, "row", i, dst, src);
	}

	record_extent(g, &lo, &hi);
	for (k = 0; admit && k < g->nstaged; k++) {
		bool race = false;

		if (!admit[k])
			continue;
		for (i = 0; desc && !g->table && !g->bases && i < g->count && !race; i++)
			race = !(desc_entry(g, desc, i) & GPU_GATHER_STAGED) &&
			       records_overlap(desc_entry(g, desc, i), admit[k], lo, hi);
		for (j = 0; j < k && !race; j++)
			race = admit[j] && records_overlap(admit[j], admit[k], lo, hi);
		if (race) {
			gather_problem(&r,
				       "staged row %llu is admitted into record %#llx, which "
				       "another row of the call reads or writes (a race on a GPU)",
				       (unsigned long long)k, (unsigned long long)admit[k]);
			continue;
		}
		for (f = 0; f < g->nfields; f++) {
			src[f] = g->staged + g->staged_off[f] + k * g->row_bytes[f];
			dst[f] = admit[k] + g->rec_off[f];
		}
		gather_row(&r, g, "admission of staged row", k, dst, src);
	}
	if (r.problems > 1)
		log_err("gpu_fake: gather on device %d: %d more problems skipped", dev,
			r.problems - 1);
}

/* Runs the queued ops of s up to op number mark (exclusive). */
static void run_ops(struct gpu_stream *s, uint64_t mark)
{
	size_t n = 0, i;

	while (s->done < mark && n < s->nops) {
		struct fake_op *op = &s->ops[n++];

		switch (op->kind) {
		case FAKE_COPY: memmove((void *)(uintptr_t)op->dst, op->src, op->bytes); break;
		case FAKE_GATHER:
			fake.gathers_run++;
			run_gather(s->dev, op->gather);
			free(op->gather);
			op->gather = NULL;
			break;
		}
		s->done++;
	}
	for (i = n; i < s->nops; i++)
		s->ops[i - n] = s->ops[i];
	s->nops -= n;
}

static int queue_op(struct gpu_stream *s, const struct fake_op *op)
{
	struct fake_op *ops;
	size_t cap;

	if (s->nops == s->cap) {
		if (s->cap >= FAKE_MAX_OPS)
			return -ENOMEM;
		cap = s->cap ? s->cap * 2 : 16;
		ops = realloc(s->ops, cap * sizeof(*ops));
		if (!ops)
			return -ENOMEM;
		s->ops = ops;
		s->cap = cap;
	}
	s->ops[s->nops] = *op;
	s->nops++;
	s->queued++;
	return 0;
}

int gpu_stream_create(int dev, struct gpu_stream **out)
{
	struct gpu_stream *s = NULL;
	int rc = 0;

	*out = NULL;
	lock();
	if (!dev_ok(dev)) {
		rc = -ENODEV;
		goto out;
	}
	s = calloc(1, sizeof(*s));
	if (!s) {
		rc = -ENOMEM;
		goto out;
	}
	s->dev = dev;
	s->next = fake.streams;
	fake.streams = s;
	*out = s;
out:
	unlock();
	return rc;
}

int gpu_stream_sync(struct gpu_stream *s)
{
	lock();
	run_ops(s, s->queued);
	unlock();
	return 0;
}

void gpu_stream_destroy(struct gpu_stream *s)
{
	struct gpu_stream **pp;
	struct gpu_event *e;

	if (!s)
		return;
	lock();
	run_ops(s, s->queued);
	for (pp = &fake.streams; *pp; pp = &(*pp)->next) {
		if (*pp == s) {
			*pp = s->next;
			break;
		}
	}
	for (e = fake.events; e; e = e->next)
		if (e->stream == s)
			e->stream = NULL;
	unlock();
	free(s->ops);
	free(s);
}

int gpu_copy_h2d(struct gpu_stream *s, uint64_t dst, const void *src, size_t bytes)
{
	int rc;

	lock();
	if (!dev_ok(s->dev)) {
		rc = -ENODEV;
	} else if (!in_live_mem(s->dev, dst, bytes)) {
		log_err("gpu_fake: H2D of %zu bytes to %#llx is outside device %d's allocations",
			bytes, (unsigned long long)dst, s->dev);
		rc = -EFAULT;
	} else {
		struct fake_op op = {.kind = FAKE_COPY, .dst = dst, .src = src, .bytes = bytes};

		rc = queue_op(s, &op);
	}
	unlock();
	return rc;
}

int gpu_copy_d2d(struct gpu_stream *s, uint64_t dst, uint64_t src, size_t bytes)
{
	int rc;

	lock();
	if (!dev_ok(s->dev)) {
		rc = -ENODEV;
	} else if (!in_live_mem(s->dev, dst, bytes) || !in_live_mem(s->dev, src, bytes)) {
		log_err("gpu_fake: D2D of %zu bytes %#llx -> %#llx leaves device %d's memory",
			bytes, (unsigned long long)src, (unsigned long long)dst, s->dev);
		rc = -EFAULT;
	} else {
		struct fake_op op = {.kind = FAKE_COPY,
				     .dst = dst,
				     .src = (const void *)(uintptr_t)src,
				     .bytes = bytes};

		rc = queue_op(s, &op);
	}
	unlock();
	return rc;
}

/* Checks the ranges a gather covers whatever desc and admit will say: the
 * slot, the staged rows and the two index arrays.  Returns 0 when they lie
 * in live allocations, else -EFAULT with what does not in what (a message). */
static int gather_ranges_check(int dev, const struct gpu_gather *g, char *what, size_t len)
{
	uint32_t f;

	if (g->count &&
	    !in_live_mem(dev, g->desc,
			 (size_t)g->count * (g->desc32 ? sizeof(uint32_t) : sizeof(uint64_t)))) {
		snprintf(what, len, "desc %#llx", (unsigned long long)g->desc);
		return -EFAULT;
	}
	if (g->nstaged && g->admit &&
	    !in_live_mem(dev, g->admit, (size_t)g->nstaged * sizeof(uint64_t))) {
		snprintf(what, len, "admit %#llx", (unsigned long long)g->admit);
		return -EFAULT;
	}
	for (f = 0; f < g->nfields; f++) {
		uint64_t in_slot = (uint64_t)g->count * g->row_bytes[f];
		uint64_t staged = (uint64_t)g->nstaged * g->row_bytes[f];

		if (in_slot && !in_live_mem(dev, g->slot + g->slot_off[f], in_slot)) {
			snprintf(what, len, "field %u of slot %#llx", f,
				 (unsigned long long)g->slot);
			return -EFAULT;
		}
		if (staged && !in_live_mem(dev, g->staged + g->staged_off[f], staged)) {
			snprintf(what, len, "field %u of the staged rows %#llx", f,
				 (unsigned long long)g->staged);
			return -EFAULT;
		}
	}
	return 0;
}

int gpu_gather(struct gpu_stream *s, const struct gpu_gather *g)
{
	struct fake_op op = {.kind = FAKE_GATHER};
	char what[96];
	int rc = 0;

	lock();
	if (!dev_ok(s->dev)) {
		rc = -ENODEV;
		goto out;
	}
	/* The argument checks of gpu.c, then ours: what can be checked before
	 * desc and admit are known fails at once, as a bad copy does. */
	if (g->nfields > GPU_GATHER_MAX_FIELDS || (uint64_t)g->count + g->nstaged > INT32_MAX ||
	    (g->count && (!g->slot || !g->desc)) ||
	    (g->nstaged && (!g->staged || (!g->admit && !g->bases))) ||
	    (g->table && (!g->table_n || g->nstaged)) ||
	    (g->desc32 && (!g->bases || g->nstaged || g->table))) {
		rc = -EINVAL;
		goto out;
	}
	if (g->count + g->nstaged == 0 || g->nfields == 0)
		goto out; /* the kernel is not even launched */
	rc = gather_ranges_check(s->dev, g, what, sizeof(what));
	if (rc < 0) {
		log_err("gpu_fake: gather of %u rows (%u staged): %s leaves device memory of "
			"device %d",
			g->count, g->nstaged, what, s->dev);
		goto out;
	}
	op.gather = malloc(sizeof(*op.gather));
	if (!op.gather) {
		rc = -ENOMEM;
		goto out;
	}
	*op.gather = *g;
	rc = queue_op(s, &op);
	if (rc < 0)
		free(op.gather);
out:
	unlock();
	return rc;
}

/* ---- events -------------------------------------------------------------- */

int gpu_event_create(int dev, struct gpu_event **out)
{
	struct gpu_event *e = NULL;
	int rc = 0;

	*out = NULL;
	lock();
	if (!dev_ok(dev)) {
		rc = -ENODEV;
		goto out;
	}
	e = calloc(1, sizeof(*e));
	if (!e) {
		rc = -ENOMEM;
		goto out;
	}
	e->dev = dev;
	e->next = fake.events;
	fake.events = e;
	*out = e;
out:
	unlock();
	return rc;
}

int gpu_event_record(struct gpu_event *e, struct gpu_stream *s)
{
	if (e->dev != s->dev)
		return -EINVAL;
	lock();
	e->stream = s;
	e->mark = s->queued;
	e->pending = fake.event_delay;
	unlock();
	return 0;
}

/* Completes e: the copies before its mark run now. */
static void complete(struct gpu_event *e)
{
	e->pending = 0;
	if (e->stream)
		run_ops(e->stream, e->mark);
}

int gpu_event_query(struct gpu_event *e)
{
	int rc = 0;

	lock();
	if (fake.hold_events) {
		rc = -EAGAIN;
	} else if (e->pending > 0) {
		e->pending--;
		rc = -EAGAIN;
	} else {
		complete(e);
	}
	unlock();
	return rc;
}

int gpu_event_sync(struct gpu_event *e)
{
	lock();
	complete(e);
	unlock();
	return 0;
}

void gpu_event_destroy(struct gpu_event *e)
{
	struct gpu_event **pp;

	if (!e)
		return;
	lock();
	for (pp = &fake.events; *pp; pp = &(*pp)->next) {
		if (*pp == e) {
			*pp = e->next;
			break;
		}
	}
	unlock();
	free(e);
}

/* ---- allocations -------------------------------------------------------------- */

static void mem_reset(struct gpu_mem *a)
{
	memset(a, 0, sizeof(*a));
	a->export_fd = -1;
}

int gpu_mem_alloc(int dev, uint64_t bytes, enum gpu_ipc kind, struct gpu_mem *out)
{
	struct fake_mem *fa = NULL;
	uint64_t size;
	void *p = MAP_FAILED;
	int fd = -1, rc = 0;

	mem_reset(out);
	lock();
	if (!dev_ok(dev)) {
		rc = -ENODEV;
		goto fail;
	}
	if (kind != GPU_IPC_FD && kind != GPU_IPC_LEGACY && kind != GPU_IPC_NONE) {
		rc = -EINVAL;
		goto fail;
	}
	if (bytes == 0 || bytes > UINT64_MAX - GPU_MEM_ALIGN) {
		rc = -EINVAL;
		goto fail;
	}
	size = (bytes + GPU_MEM_ALIGN - 1) / GPU_MEM_ALIGN * GPU_MEM_ALIGN;
	if (fake.fail_allocs > 0) {
		fake.fail_allocs--;
		rc = -ENOMEM;
		goto fail;
	}
	if (size > fake.free_bytes[dev]) {
		rc = -ENOMEM;
		goto fail;
	}
	fa = calloc(1, sizeof(*fa));
	if (!fa) {
		rc = -ENOMEM;
		goto fail;
	}
	if (kind == GPU_IPC_FD) {
		fd = memfd_create("prefetchd-fake-mem", MFD_CLOEXEC);
		if (fd < 0 || ftruncate(fd, (off_t)size) < 0) {
			rc = -errno;
			goto fail;
		}
		p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	} else {
		p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	}
	if (p == MAP_FAILED) {
		rc = -ENOMEM;
		goto fail;
	}

	fa->dev = dev;
	fa->base = p;
	fa->bytes = size;
	fa->next = fake.mems;
	fake.mems = fa;
	fake.live_mems++;
	fake.free_bytes[dev] -= size;
	fake.serial++;

	out->dev = dev;
	out->bytes = size;
	out->kind = kind;
	out->base = (uint64_t)(uintptr_t)p;
	out->export_fd = fd;
	out->handle = (uint64_t)(uintptr_t)fa;
	if (kind == GPU_IPC_LEGACY) {
		/* Unique and recognisable; no client can open it. */
		memcpy(out->legacy_handle, "FAKEIPC", 8);
		memcpy(out->legacy_handle + 8, &fake.serial, sizeof(fake.serial));
		memcpy(out->legacy_handle + 16, &out->base, sizeof(out->base));
	}
	unlock();
	return 0;
fail:
	unlock();
	if (fd >= 0)
		close(fd);
	free(fa);
	return rc;
}

void gpu_mem_free(struct gpu_mem *a)
{
	struct fake_mem **pp, *fa = NULL;
	struct gpu_stream *s;

	if (a->export_fd >= 0)
		close(a->export_fd);
	if (!a->handle) {
		mem_reset(a);
		return;
	}
	lock();
	for (pp = &fake.mems; *pp; pp = &(*pp)->next) {
		if ((uint64_t)(uintptr_t)*pp == a->handle) {
			fa = *pp;
			*pp = fa->next;
			break;
		}
	}
	if (fa) {
		/* cudaFree and cuMemUnmap wait for the device; likewise every
		 * queued copy runs before the memory goes. */
		for (s = fake.streams; s; s = s->next)
			run_ops(s, s->queued);
		fake.live_mems--;
		fake.free_bytes[fa->dev] += fa->bytes;
		if (fake.free_bytes[fa->dev] > fake.total_bytes[fa->dev])
			fake.free_bytes[fa->dev] = fake.total_bytes[fa->dev];
	} else {
		log_err("gpu_fake: free of memory that is not live (double free?)");
	}
	unlock();
	if (fa) {
		munmap(fa->base, fa->bytes);
		free(fa);
	}
	mem_reset(a);
}
