/*
 * pool.c — the VRAM sample pool (see pool.h).
 *
 * DESIGN: loop thread only.  The index (loc, owner, missed) is plain host
 * memory; the device side is slabs, which the transfer thread allocates
 * and frees as jobs whose completions come back here.  The invariants
 * pool_check states: rows counts the samples whose loc names an entry of a
 * live slab (and that entry's owner is the sample); nmissed counts the
 * missed bits; a dying slab is pinned and out of the index.
 */
#include "gpu/pool_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/dataset.h"
#include "base/log.h"
#include "util.h"
#include "gpu/xfer.h"

/* Records start at this alignment so the gather moves them 16 bytes at a
 * time; fields inside a record likewise when their rows allow. */
#define REC_ALIGN 16u

static uint64_t table_free(struct pool *p);

struct pool *pool_get(struct pool_set *set, const struct dataset *ds, int gpu, struct xfer *x,
		      bool enabled, char *why, size_t whylen)
{
	const struct pool_config *cfg = &set->cfg;
	struct pool *p;
	uint64_t off = 0, n = ds->num_samples;

	for (p = set->head; p; p = p->next) {
		if (p->ds == ds && p->gpu == gpu) {
			if (p->sessions++ == 0 && p->idle_ns) {
				log_info("pool %s on cuda:%d: taken up after lingering %.1f s, "
					 "%" PRIu64 " of %" PRIu64 " rows resident (%.0f MiB)",
					 ds->name, gpu, (now_ns() - p->idle_ns) / 1e9, p->rows,
					 ds->num_samples, pool_bytes(p) / 1048576.0);
				p->idle_ns = 0;
			}
			return p;
		}
	}
	if (ds->nfields > GPU_GATHER_MAX_FIELDS) {
		snprintf(why, whylen, "%zu fields (the pool handles up to %d)", ds->nfields,
			 GPU_GATHER_MAX_FIELDS);
		return NULL;
	}
	if (n >= POOL_PENDING) {
		snprintf(why, whylen, "%" PRIu64 " samples (the pool indexes fewer than %u)", n,
			 POOL_PENDING);
		return NULL;
	}
	p = calloc(1, sizeof(*p));
	if (!p)
		goto nomem;
	p->set = set;
	p->ds = ds;
	p->gpu = gpu;
	p->xfer = x;
	p->enabled = enabled;
	p->nfields = (uint32_t)ds->nfields;
	for (uint32_t f = 0; f < p->nfields; f++) {
		uint32_t row = (uint32_t)ds->fields[f].sample_bytes;

		if (row % REC_ALIGN == 0)
			off = align_up(off, REC_ALIGN);
		p->rec_off[f] = (uint32_t)off;
		p->row_bytes[f] = row;
		off += row;
	}
	p->rec_stride = align_up(off ? off : 1, REC_ALIGN);
	/* Entry ids are slab << slab_shift | index, so that finding a record
	 * is a shift and a mask, not two divisions per row (the pool plans
	 * every row of every batch on the loop thread).  A slab holds as many
	 * records as fit in pool_slab, or the whole dataset when that is
	 * smaller. */
	{
		/* A pool_bytes cap below pool_slab makes the slab smaller,
		 * or the pool could never take one. */
		uint64_t slab = cfg->cap_bytes && cfg->cap_bytes < cfg->slab_bytes
					? cfg->cap_bytes
					: cfg->slab_bytes;
		uint64_t cap = slab / p->rec_stride;

		if (cap > n)
			cap = n;
		if (cap < 1)
			cap = 1;
		if (cap > (1u << 30))
			cap = 1u << 30;
		p->per_slab = (uint32_t)cap;
		p->slab_shift = 0;
		while ((1ull << p->slab_shift) < cap)
			p->slab_shift++;
		p->slab_bytes = align_up(cap * p->rec_stride, GPU_MEM_ALIGN);
	}
	p->loc = malloc(n * sizeof(*p->loc));
	p->missed = calloc((n + 63) / 64, sizeof(*p->missed));
	if (!p->loc || !p->missed)
		goto nomem;
	for (uint64_t i = 0; i < n; i++)
		p->loc[i] = POOL_NONE;
	snprintf(p->budget_reason, sizeof(p->budget_reason), "no probe yet");
	p->table.export_fd = -1;
	p->sessions = 1;
	p->next = set->head;
	set->head = p;
	log_info("pool %s on cuda:%d: records of %" PRIu64 " bytes, %u per %.0f MiB slab, %s",
		 ds->name, gpu, p->rec_stride, p->per_slab, p->slab_bytes / 1048576.0,
		 p->enabled ? "on" : "off");
	return p;
nomem:
	if (p) {
		free(p->loc);
		free(p->missed);
		free(p);
	}
	snprintf(why, whylen, "out of memory for the pool's index");
	return NULL;
}

/* ---- slabs ----------------------------------------------------------------- */

void pool_slab_free_now(struct pool *p, uint32_t j)
{
	struct pool_slab *sl = &p->slabs[j];

	if (sl->mem.kind != GPU_IPC_NONE && p->set->slab_gone)
		p->set->slab_gone(p->set->gone_arg, p, j, sl->gen);
	xfer_free_mem(p->xfer, &sl->mem);
	sl->used = 0;
	sl->dying = false;
	sl->live = false;
}

/* Takes slab j out of the index; its memory goes when no batch pins it.
 * Returns the record table's bytes if they went with it. */
static uint64_t slab_drop(struct pool *p, uint32_t j)
{
	struct pool_slab *sl = &p->slabs[j];
	uint64_t table_bytes;
	uint32_t first = j << p->slab_shift;

	for (uint32_t e = first; e < first + sl->used; e++) {
		uint64_t sample = p->owner[e];

		if (p->loc[sample] == e) {
			p->loc[sample] = POOL_NONE;
			p->rows--;
			missed_set(p, sample);
		}
	}
	sl->live = false;
	/* The table's entries point into this slab: stale, and its memory
	 * goes too (a slab leaves under pressure, or on request). */
	table_bytes = table_free(p);
	p->nlive--;
	p->bytes -= sl->mem.bytes;
	p->room -= p->per_slab - sl->used;
	p->slabs_dropped++;
	if (sl->pins)
		sl->dying = true;
	else
		pool_slab_free_now(p, j);
	return table_bytes;
}

/* Drops live slabs, newest first, until the pool holds at most `keep`. */
static uint64_t shrink_to(struct pool *p, uint64_t keep)
{
	uint64_t freed = 0;

	for (uint32_t j = p->nslabs; j-- > 0 && p->bytes > keep;) {
		if (!p->slabs[j].live)
			continue;
		freed += p->slabs[j].mem.bytes;
		freed += slab_drop(p, j);
	}
	return freed;
}

static void slab_alloc_done(struct xfer_job *job)
{
	struct pool *p = job->owner;
	uint32_t j = job->slot;

	p->slab_pending = false;
	if (job->rc) {
		/* The device is short: the budget was optimistic.  Stop
		 * growing until the next probe says otherwise. */
		log_warn("pool %s on cuda:%d: a %.0f MiB slab failed (%s); holding at %.0f MiB "
			 "until the next probe",
			 p->ds->name, p->gpu, job->bytes / 1048576.0, job->err,
			 pool_bytes(p) / 1048576.0);
		p->budget = pool_bytes(p);
		snprintf(p->budget_reason, sizeof(p->budget_reason),
			 "held: a slab allocation failed (%.100s)", job->err);
		free(job);
		return;
	}
	if (p->sessions == 0 || !p->enabled || pool_bytes(p) + job->mem.bytes > p->budget) {
		/* Not wanted any more (the last session left, off, or the
		 * budget shrank meanwhile). */
		xfer_free_mem(p->xfer, &job->mem);
		free(job);
		return;
	}
	p->slabs[j].mem = job->mem;
	p->slabs[j].gen = ++p->gens;
	p->slabs[j].used = 0;
	p->slabs[j].pins = 0;
	p->slabs[j].stamp = 0;
	p->slabs[j].live = true;
	p->slabs[j].dying = false;
	p->nlive++;
	p->bytes += job->mem.bytes;
	p->room += p->per_slab;
	p->fill = j;
	p->want_room = false;
	p->slabs_made++;
	log_debug("pool %s on cuda:%d: slab %u, %.0f MiB (%u live, budget %.0f MiB)", p->ds->name,
		  p->gpu, j, job->mem.bytes / 1048576.0, p->nlive, p->budget / 1048576.0);
	free(job);
}

uint64_t pool_table(const struct pool *p)
{
	return p->enabled && p->table_valid ? p->table.base : 0;
}

static void table_upload_done(struct xfer_job *job)
{
	struct pool *p = job->owner;

	p->table_pending = false;
	free(p->table_host);
	p->table_host = NULL;
	/* Valid only if nothing changed while it was on its way: every row
	 * still resident (no slab left, which also clears table_valid's
	 * precondition), and the upload landed. */
	p->table_valid = !job->rc && p->rows == p->ds->num_samples && job->seq == p->slabs_dropped;
	if (p->sessions == 0 || !p->enabled)
		table_free(p); /* not wanted any more */
	if (job->rc)
		log_warn("pool %s on cuda:%d: the record table did not reach the device (%s); "
			 "batches keep being planned row by row",
			 p->ds->name, p->gpu, job->err);
	else if (p->table_valid)
		log_debug("pool %s on cuda:%d: record table of %" PRIu64
			  " samples on the device: batches need no lookups",
			  p->ds->name, p->gpu, p->ds->num_samples);
	free(job);
}

/* Uploads the record table of a whole pool; the transfer thread copies it
 * in stream order, after every batch already queued. */
static void table_upload(struct pool *p)
{
	uint64_t n = p->ds->num_samples;
	struct xfer_job *job;

	p->table_host = malloc(n * sizeof(*p->table_host));
	job = calloc(1, sizeof(*job));
	if (!p->table_host || !job) {
		free(p->table_host);
		p->table_host = NULL;
		free(job);
		return;
	}
	for (uint64_t i = 0; i < n; i++)
		p->table_host[i] = entry_addr(p, p->loc[i]);
	job->kind = XFER_COPY;
	job->owner = p;
	job->src = p->table_host;
	job->dst = p->table.base;
	job->bytes = n * sizeof(*p->table_host);
	job->seq = p->slabs_dropped; /* a drop meanwhile makes it stale */
	job->done = table_upload_done;
	p->table_pending = true;
	xfer_submit(p->xfer, job);
}

static void table_alloc_done(struct xfer_job *job)
{
	struct pool *p = job->owner;

	p->table_pending = false;
	if (job->rc) {
		log_warn("pool %s on cuda:%d: no %.1f MiB for the record table (%s); batches keep "
			 "being planned row by row",
			 p->ds->name, p->gpu, job->bytes / 1048576.0, job->err);
		free(job);
		return;
	}
	if (p->sessions == 0 || !p->enabled) {
		xfer_free_mem(p->xfer, &job->mem);
		free(job);
		return;
	}
	p->table = job->mem;
	free(job);
	pool_maybe_table(p);
}

/* Once the pool holds every sample, builds the device record table. */
void pool_maybe_table(struct pool *p)
{
	uint64_t n = p->ds->num_samples;
	struct xfer_job *job;

	/* The table takes 8 bytes a sample, within the budget. */
	if (!p->enabled || p->table_valid || p->table_pending || p->daemon_gathers == 0 ||
	    p->rows != n || (!p->table.base && p->bytes + n * sizeof(uint64_t) > p->budget))
		return;
	if (p->table.base) {
		table_upload(p);
		return;
	}
	job = calloc(1, sizeof(*job));
	if (!job)
		return;
	job->kind = XFER_ALLOC;
	job->owner = p;
	job->bytes = n * sizeof(uint64_t);
	job->ipc = GPU_IPC_NONE;
	job->done = table_alloc_done;
	p->table_pending = true;
	xfer_submit(p->xfer, job);
}

/* Asks for another slab when rows want room (a miss found no entry, or
 * rows missed earlier wait to be back-filled) or, so that admission never
 * waits for an allocation, when rows are being admitted and less than a
 * slab of room is left; within the budget, one request at a time.
 * Growth follows demand: a pool never holds more slabs than its rows need.
 * The slab's index is reserved now (slot) so entry ids stay below
 * nslabs << slab_shift. */
void pool_maybe_grow(struct pool *p)
{
	struct xfer_job *job;
	uint32_t j;
	bool want;

	if (!p->enabled || p->slab_pending || !p->budget_known || p->sessions == 0 ||
	    p->bytes + p->slab_bytes > p->budget)
		return;
	/* Ahead of need only while the rows not yet placed outnumber the
	 * room left: a dataset smaller than a slab gets one slab. */
	want = p->room == 0 ? p->want_room || p->nmissed > 0
			    : p->room < p->per_slab && p->admits > 0 &&
				      p->rows + p->pending + p->room < p->ds->num_samples;
	if (!want)
		return;
	for (j = 0; j < p->nslabs; j++)
		if (!p->slabs[j].live && !p->slabs[j].dying)
			break;
	if (j == p->nslabs) {
		struct pool_slab *ns;
		uint64_t *no;
		uint64_t entries = (uint64_t)(p->nslabs + 1) << p->slab_shift;

		if (entries >= POOL_PENDING)
			return; /* the entry ids would overflow: full */
		ns = realloc(p->slabs, (p->nslabs + 1) * sizeof(*ns));
		if (!ns)
			return;
		p->slabs = ns;
		no = realloc(p->owner, entries * sizeof(*no));
		if (!no)
			return;
		p->owner = no;
		memset(&p->slabs[j], 0, sizeof(p->slabs[j]));
		p->slabs[j].mem.export_fd = -1;
		p->nslabs++;
	}
	job = calloc(1, sizeof(*job));
	if (!job)
		return;
	job->kind = XFER_ALLOC;
	job->owner = p;
	job->slot = j;
	job->bytes = p->slab_bytes;
	job->ipc = p->set->cfg.slab_ipc;
	job->done = slab_alloc_done;
	p->slab_pending = true;
	p->admits = 0;
	xfer_submit(p->xfer, job);
}

uint64_t pool_bytes(const struct pool *p)
{
	return p->bytes;
}

/* ---- budget, control, status ----------------------------------------------- */

void pool_new_epoch(struct pool *p, uint64_t session, uint64_t epoch)
{
	/* Another session's epochs count from their own start (a trainer
	 * that took over a lingering pool begins again at 0). */
	if (epoch <= p->epoch && session == p->epoch_session)
		return;
	p->epoch = epoch;
	p->epoch_session = session;
	if (p->lookups_cur) {
		p->hits_last = p->hits_cur;
		p->lookups_last = p->lookups_cur;
		p->have_last = true;
	}
	p->hits_cur = p->lookups_cur = 0;
}

void pool_set_budget(struct pool *p, uint64_t budget, const char *why)
{
	uint64_t cap = p->set->cfg.cap_bytes;

	if (cap && budget > cap) {
		budget = cap;
		snprintf(p->budget_reason, sizeof(p->budget_reason), "pool_bytes cap (%s)", why);
	} else {
		snprintf(p->budget_reason, sizeof(p->budget_reason), "%s", why);
	}
	p->budget = budget;
	p->budget_known = true;
	if (pool_bytes(p) > budget) {
		uint64_t was = pool_bytes(p);

		shrink_to(p, budget);
		log_info("pool %s on cuda:%d: %.0f -> %.0f MiB (%s)", p->ds->name, p->gpu,
			 was / 1048576.0, pool_bytes(p) / 1048576.0, p->budget_reason);
	}
	pool_maybe_grow(p);
}

bool pool_give_slab(struct pool *p, const char *why)
{
	uint64_t was = pool_bytes(p);

	if (!p->nlive)
		return false;
	shrink_to(p, was - 1);
	p->budget = pool_bytes(p);
	snprintf(p->budget_reason, sizeof(p->budget_reason), "gave a slab back: %s", why);
	log_warn("pool %s on cuda:%d: gave a %.0f MiB slab back (%s)", p->ds->name, p->gpu,
		 (was - pool_bytes(p)) / 1048576.0, why);
	return true;
}

/* Gives the record table back.  Batches that read it were queued on the
 * stream before this free, which waits for them (cudaFree does). */
static uint64_t table_free(struct pool *p)
{
	uint64_t bytes = p->table.bytes;

	p->table_valid = false;
	if (!p->table.base || p->table_pending)
		return 0;
	xfer_free_mem(p->xfer, &p->table);
	return bytes;
}

static uint64_t drop_all(struct pool *p)
{
	uint64_t freed = shrink_to(p, 0);

	freed += table_free(p);

	/* Nothing is left to back-fill into. */
	memset(p->missed, 0, (p->ds->num_samples + 63) / 64 * sizeof(*p->missed));
	p->nmissed = 0;
	return freed;
}

/* Gives everything back: the pool is as if no session had used it.
 * Returns the bytes freed. */
static uint64_t empty_idle(struct pool *p, const char *why)
{
	uint64_t freed = drop_all(p);

	p->idle_ns = 0;
	p->budget = 0;
	p->budget_known = false;
	snprintf(p->budget_reason, sizeof(p->budget_reason), "%s", why);
	return freed;
}

/* Empties p; a lingering one ends its lingering too, saying why. */
static uint64_t empty(struct pool *p, const char *why_lingering)
{
	return pool_lingering(p) ? empty_idle(p, why_lingering) : drop_all(p);
}

bool pool_put(struct pool *p, double linger_s)
{
	if (--p->sessions > 0)
		return false;
	if (linger_s > 0 && p->enabled && p->nlive) {
		/* The budget stays as the last probe left it: a lingering pool
		 * does not grow (maybe_grow wants a session), it only shrinks. */
		p->idle_ns = now_ns();
		p->linger_s = linger_s;
		p->linger_reason[0] = '\0';
		log_info("pool %s on cuda:%d: last session gone, lingering %g s with %.0f MiB "
			 "(%" PRIu64 " of %" PRIu64 " rows)",
			 p->ds->name, p->gpu, linger_s, pool_bytes(p) / 1048576.0, p->rows,
			 p->ds->num_samples);
		return true;
	}
	if (p->nlive)
		log_info("pool %s on cuda:%d: last session gone, %.0f MiB given back", p->ds->name,
			 p->gpu, pool_bytes(p) / 1048576.0);
	empty_idle(p, "no session");
	return false;
}

bool pool_lingering(const struct pool *p)
{
	return p->sessions == 0 && p->idle_ns != 0;
}

double pool_linger_age(const struct pool *p, uint64_t now)
{
	return pool_lingering(p) && now > p->idle_ns ? (now - p->idle_ns) / 1e9 : 0;
}

double pool_linger_left(const struct pool *p, uint64_t now)
{
	double left = p->linger_s - pool_linger_age(p, now);

	return pool_lingering(p) && left > 0 ? left : 0;
}

uint64_t pool_linger_reclaim(struct pool_set *set, int gpu, uint64_t bytes, const char *why)
{
	uint64_t given = 0;

	for (struct pool *p = set->head; p && given < bytes; p = p->next) {
		uint64_t was = pool_bytes(p), want = bytes - given;

		if (!pool_lingering(p) || p->gpu != gpu || !was)
			continue;
		shrink_to(p, want >= was ? 0 : was - want);
		given += was - pool_bytes(p);
		snprintf(p->linger_reason, sizeof(p->linger_reason), "gave back %.0f MiB: %s",
			 (was - pool_bytes(p)) / 1048576.0, why);
		p->budget = pool_bytes(p);
		snprintf(p->budget_reason, sizeof(p->budget_reason), "lingering; %.140s",
			 p->linger_reason);
		log_warn("pool %s on cuda:%d (lingering): %.0f -> %.0f MiB: %s", p->ds->name,
			 p->gpu, was / 1048576.0, pool_bytes(p) / 1048576.0, why);
		if (!p->nlive) {
			char reason[sizeof(p->budget_reason)];

			snprintf(reason, sizeof(reason), "%s", p->budget_reason);
			empty_idle(p, reason);
		}
	}
	return given;
}

double pool_linger_expire(struct pool_set *set, uint64_t now)
{
	double next = -1;

	for (struct pool *p = set->head; p; p = p->next) {
		double left;

		if (!pool_lingering(p))
			continue;
		left = pool_linger_left(p, now);
		if (left > 0) {
			if (next < 0 || left < next)
				next = left;
			continue;
		}
		log_info("pool %s on cuda:%d: lingered %g s with no session, %.0f MiB given back",
			 p->ds->name, p->gpu, p->linger_s, pool_bytes(p) / 1048576.0);
		empty_idle(p, "no session (pool_linger over)");
	}
	return next;
}

uint64_t pool_set_enabled(struct pool *p, bool on)
{
	uint64_t freed = 0;

	p->enabled = on;
	if (on)
		pool_maybe_grow(p);
	else
		freed = empty(p, "no session (pool off)");
	return freed;
}

int pool_control(struct pool_set *set, const char *dataset, enum pool_action action,
		 uint64_t *bytes_freed)
{
	int n = 0;

	*bytes_freed = 0;
	if (action != POOL_ON && action != POOL_OFF && action != POOL_DROP)
		return -EINVAL;
	for (struct pool *p = set->head; p; p = p->next) {
		if (strcmp(p->ds->name, dataset) != 0)
			continue;
		n++;
		if (action == POOL_DROP)
			*bytes_freed += empty(p, "no session (dropped by prefetchctl)");
		else
			*bytes_freed += pool_set_enabled(p, action == POOL_ON);
		log_info("pool %s on cuda:%d: %s by prefetchctl", p->ds->name, p->gpu,
			 action == POOL_ON    ? "on"
			 : action == POOL_OFF ? "off"
					      : "dropped");
	}
	return n;
}

unsigned pool_active_on(const struct pool_set *set, int gpu)
{
	unsigned n = 0;

	for (const struct pool *p = set->head; p; p = p->next)
		n += p->gpu == gpu && p->sessions > 0 && p->enabled;
	return n;
}

/* Frees pool p (out of set->head already): its slabs and table. */
static void pool_free(struct pool *p)
{
	for (uint32_t j = 0; j < p->nslabs; j++)
		if (p->slabs[j].mem.base)
			pool_slab_free_now(p, j);
	xfer_free_mem(p->xfer, &p->table);
	free(p->table_host);
	free(p->slabs);
	free(p->owner);
	free(p->loc);
	free(p->missed);
	free(p);
}

bool pool_forget(struct pool_set *set, const struct dataset *ds)
{
	bool all = true;

	for (struct pool **pp = &set->head; *pp;) {
		struct pool *p = *pp;

		if (p->ds != ds) {
			pp = &p->next;
			continue;
		}
		/* A job still on its way holds p (slab or table allocation,
		 * table upload): try again on the next tick. */
		if (p->sessions || p->slab_pending || p->table_pending) {
			all = false;
			pp = &p->next;
			continue;
		}
		*pp = p->next;
		table_free(p);
		pool_free(p);
	}
	return all;
}

void pool_destroy_all(struct pool_set *set)
{
	while (set->head) {
		struct pool *p = set->head;

		set->head = p->next;
		pool_free(p);
	}
}

bool pool_check(const struct pool *p)
{
	uint64_t rows = 0, missed = 0, bytes = 0, room = 0;

	for (uint32_t j = 0; j < p->nslabs; j++) {
		const struct pool_slab *sl = &p->slabs[j];

		if (sl->dying && (sl->live || !sl->pins))
			return false;
		if (!sl->live)
			continue;
		bytes += sl->mem.bytes;
		room += p->per_slab - sl->used;
		/* An entry whose admission was cancelled stays used (its
		 * sample may live elsewhere since): only count, per entry,
		 * the samples that point back at it. */
		for (uint32_t e = j << p->slab_shift; e < (j << p->slab_shift) + sl->used; e++)
			rows += p->loc[p->owner[e]] == e;
	}
	for (uint64_t w = 0; w < (p->ds->num_samples + 63) / 64; w++)
		missed += (uint64_t)__builtin_popcountll(p->missed[w]);
	return rows == p->rows && missed == p->nmissed && bytes == p->bytes && room == p->room;
}
