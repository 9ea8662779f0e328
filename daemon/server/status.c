/*
 * status.c — the daemon-wide replies (see status.h): what `prefetchctl
 * status` shows of each session, dataset and pool, and the pool and depth
 * controls.
 *
 * DESIGN: loop thread only.  Each reply is built on the stack and in
 * allocations freed before returning, with strings borrowed from the
 * sessions, datasets and pools it describes.
 */
#include "server/status.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "data/blocks.h"
#include "state/daemon.h"
#include "sess/linger.h"
#include "base/log.h"
#include "sess/sess.h"
#include "sess/share.h"
#include "util.h"

/* Held: batches the trainer has taken (acked) and not yet released;
 * sent-but-untaken ones are still in the client's queue. */
static void session_status(const struct sess *s, Pf__SessionStatus *st)
{
	uint32_t held = 0, ready = 0;

	for (uint32_t i = 0; i < s->nslots; i++) {
		const struct slot *sl = &s->slots[i];

		held += sl->state == SLOT_SENT &&
			(sl->epoch != s->epoch || sl->seq < s->start_batch + s->gov.consumed);
		ready += sl->state == SLOT_READY;
	}
	st->session = s->id;
	st->name = (char *)s->name;
	st->dataset = s->ds->name;
	st->device = (char *)s->device;
	st->uid = s->uid;
	st->pid = s->pid;
	st->epoch = s->epoch;
	st->state = s->running ? "running" : s->had_epoch ? "idle" : "open";
	st->sent = s->sent;
	st->consumed = s->gov.consumed;
	st->held = held;
	st->target = gov_limit(&s->gov);
	st->target_reason =
		(char *)(gov_limit(&s->gov) < s->gov.target ? s->share_why : s->gov.reason);
	st->slots = s->nslots;
	st->ring_fill = ready;
	st->arenas = s->narenas + s->cuda.narenas;
	for (uint32_t i = 0; i < s->narenas; i++)
		st->arena_bytes += s->arenas[i].bytes;
	for (uint32_t i = 0; i < s->cuda.narenas; i++)
		st->device_bytes += s->cuda.arenas[i].bytes;
	st->arena_bytes += st->device_bytes;
	st->bytes_sent = s->bytes_sent;
	st->wait_s = s->wait_s;
	st->busy_s = s->busy_s;
	st->stall_fraction = s->wait_s + s->busy_s > 0 ? s->wait_s / (s->wait_s + s->busy_s) : 0;
	st->errors = s->errors;
	st->age_s = (now_ns() - s->opened_ns) / 1e9;
	/* Host sessions: what the readers moved per second of reading; CUDA
	 * sessions: what the copy stream moved per second of copying. */
	if (s->gpu >= 0)
		st->copy_gbps = s->cuda.copy_ns ? s->cuda.copy_bytes / (double)s->cuda.copy_ns : 0;
	else
		st->copy_gbps = s->read_ns ? s->bytes_sent / (double)s->read_ns : 0;
	st->probe_free = s->gov.probe_free;
	st->probe_total = s->gov.probe_total;
	st->min_depth = s->gov.min_depth;
	st->max_depth = s->gov.max_depth;
	st->batches = s->nbatches - s->start_batch;
	st->h2d_bytes = s->cuda.h2d_bytes;
	st->pool_hits = s->cuda.pool_hits;
	st->index_bytes = s->cuda.index_bytes;
	st->ring_slots = s->cuda.lease.cap;
	st->ring_min = s->cuda.lease.min;
	st->ring_held = s->cuda.lease.held;
	/* What the quota holds for them, so that a user sees what the
	 * daemon charged them and can tell it from what the daemon's RSS
	 * says. */
	st->order_bytes = s->order_held + s->ahead_held + (s->building ? s->building->held : 0);
	if (s->blocks)
		blocks_stats(s->blocks, &st->blocks_read, &st->block_cache_bytes,
			     &st->block_cache_peak);
}

/* Strings borrow from p and buf (16 bytes). */
static void pool_status(const struct daemon *d, const struct pool *p, Pf__PoolStatus *st, char *buf)
{
	uint64_t now = now_ns();

	snprintf(buf, 16, "cuda:%d", p->gpu);
	st->dataset = p->ds->name;
	st->device = buf;
	st->enabled = p->enabled;
	st->bytes = pool_bytes(p) + p->table.bytes; /* the record table too */
	st->rows = p->rows;
	st->samples = p->ds->num_samples;
	st->budget = p->budget;
	st->budget_reason = (char *)p->budget_reason;
	st->slabs = p->nlive;
	st->slab_bytes = p->slab_bytes;
	st->epoch = p->epoch;
	st->hit_rate = p->lookups_cur ? (double)p->hits_cur / (double)p->lookups_cur : 0;
	st->last_hit_rate = p->have_last ? (double)p->hits_last / (double)p->lookups_last : -1;
	st->hits = p->hits;
	st->lookups = p->lookups;
	st->h2d_saved = p->saved;
	st->slabs_dropped = p->slabs_dropped;
	st->sessions = p->sessions;
	st->lingering = pool_lingering(p);
	st->linger_age_s = pool_linger_age(p, now);
	st->linger_left_s = pool_linger_left(p, now);
	st->linger_reason = (char *)p->linger_reason;
	st->probe_age_s = linger_probe_age(d, p->gpu);
}

static int reply(const struct peer *p, uint64_t id, Pf__Envelope *env)
{
	env->id = id;
	return peer_send(p, env, -1);
}

int status_reply(struct daemon *d, const struct peer *p, uint64_t id)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__StatusReply msg = PF__STATUS_REPLY__INIT;
	Pf__SessionStatus *ss = calloc(d->nsessions + 1, sizeof(*ss));
	Pf__SessionStatus **ssp = calloc(d->nsessions + 1, sizeof(*ssp));
	Pf__DatasetStatus *ds = calloc(d->ndatasets + 1, sizeof(*ds));
	Pf__DatasetStatus **dsp = calloc(d->ndatasets + 1, sizeof(*dsp));
	size_t nfields = 0, k = 0, npools = 0;
	Pf__PoolStatus *ps = NULL, **psp = NULL;
	char(*pool_dev)[16] = NULL;
	Pf__Field *fields = NULL, **fieldp = NULL;
	Pf__ShareStatus **shares = NULL;
	size_t nshares = 0;
	int rc = -ENOMEM;

	for (size_t i = 0; i < d->ndatasets; i++)
		nfields += d->datasets[i]->nfields;
	fields = calloc(nfields + 1, sizeof(*fields));
	fieldp = calloc(nfields + 1, sizeof(*fieldp));
	for (struct pool *pl = d->pools.head; pl; pl = pl->next)
		npools++;
	ps = calloc(npools + 1, sizeof(*ps));
	psp = calloc(npools + 1, sizeof(*psp));
	pool_dev = calloc(npools + 1, sizeof(*pool_dev));
	shares = share_status(d, p->uid, p->uid == 0 || p->uid == getuid(), &nshares);
	if (!ss || !ssp || !ds || !dsp || !fields || !fieldp || !ps || !psp || !pool_dev ||
	    !shares) {
		peer_error(p, id, -ENOMEM, "out of memory");
		goto out;
	}
	/* Another user's sessions (their names, uids, pids) are root's and
	 * the daemon's user's to see; anyone else sees their own. */
	for (struct sess *s = d->sessions; s; s = s->next) {
		if (s->uid != p->uid && p->uid != 0 && p->uid != getuid())
			continue;
		pf__session_status__init(&ss[k]);
		session_status(s, &ss[k]);
		ssp[k] = &ss[k];
		k++;
	}
	msg.n_sessions = k;
	msg.sessions = ssp;
	nfields = 0;
	for (size_t i = 0; i < d->ndatasets; i++) {
		const struct dataset *set = d->datasets[i];

		pf__dataset_status__init(&ds[i]);
		ds[i].name = set->name;
		ds[i].format = set->format ? set->format : "";
		ds[i].samples = set->num_samples;
		ds[i].error = (char *)set->error;
		ds[i].bytes = set->num_samples * set->sample_bytes;
		sess_fields(set, NULL, fields + nfields, fieldp + nfields);
		ds[i].fields = fieldp + nfields;
		ds[i].n_fields = set->nfields;
		nfields += set->nfields;
		dsp[i] = &ds[i];
	}
	msg.n_datasets = d->ndatasets;
	msg.datasets = dsp;
	k = 0;
	for (struct pool *pl = d->pools.head; pl; pl = pl->next, k++) {
		pf__pool_status__init(&ps[k]);
		pool_status(d, pl, &ps[k], pool_dev[k]);
		psp[k] = &ps[k];
	}
	msg.n_pools = npools;
	msg.pools = psp;
	msg.n_shares = nshares;
	msg.shares = shares;
	msg.daemon = "prefetchd " PF_VERSION;
	msg.uptime_s = (now_ns() - d->started_ns) / 1e9;
	msg.readers = d->cfg.readers;
	msg.ring_bytes = d->cfg.ring_bytes;
	msg.ring_used = d->ring.used;
	msg.ring_reserved = d->ring.reserved;
	msg.ring_waits = d->ring.waits;
	msg.gpu = d->gpu_desc;
	msg.kept_orders = d->kept.n;
	msg.kept_order_bytes = d->kept.bytes;
	msg.kept_order_cap = d->cfg.kept_order_bytes;
	env.msg_case = PF__ENVELOPE__MSG_STATUS_REPLY;
	env.status_reply = &msg;
	rc = reply(p, id, &env);
out:
	free(ss);
	free(ssp);
	free(ds);
	free(dsp);
	free(fields);
	free(fieldp);
	free(ps);
	free(psp);
	free(pool_dev);
	share_status_free(shares, nshares);
	return rc;
}

int status_pool_control(struct daemon *d, const struct peer *p, uint64_t id,
			const Pf__PoolControl *req)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__PoolControlReply msg = PF__POOL_CONTROL_REPLY__INIT;
	enum pool_action action;
	uint64_t freed = 0;
	int n;

	if (p->uid != 0 && p->uid != getuid())
		return peer_error(p, id, -EPERM,
				  "pool control is for root or the daemon's user (uid %u), not "
				  "uid %u: pools are shared by every user's sessions",
				  (unsigned)getuid(), (unsigned)p->uid);
	if (!daemon_dataset(d, req->dataset))
		return peer_error(p, id, -ENOENT,
				  "unknown dataset '%s' (prefetchctl datasets lists them)",
				  req->dataset);
	switch (req->action) {
	case PF__POOL_ACTION__POOL_ON: action = POOL_ON; break;
	case PF__POOL_ACTION__POOL_OFF: action = POOL_OFF; break;
	case PF__POOL_ACTION__POOL_DROP: action = POOL_DROP; break;
	default:
		return peer_error(p, id, -EINVAL,
				  "unknown pool action %d (expected on, off or drop)", req->action);
	}
	n = pool_control(&d->pools, req->dataset, action, &freed);
	if (n == 0)
		return peer_error(p, id, -ENOENT,
				  "dataset '%s' has no VRAM pool yet: one is made when a CUDA "
				  "session opens on it",
				  req->dataset);
	log_info("pool %s: %s on %d GPU(s) by %s, %.0f MiB freed", req->dataset,
		 action == POOL_ON    ? "on"
		 : action == POOL_OFF ? "off"
				      : "drop",
		 n, p->name, freed / 1048576.0);
	msg.pools = (uint32_t)n;
	msg.bytes_freed = freed;
	env.msg_case = PF__ENVELOPE__MSG_POOL_REPLY;
	env.pool_reply = &msg;
	return reply(p, id, &env);
}

int status_set_depth(struct daemon *d, const struct peer *p, struct sess *own, uint64_t id,
		     const Pf__SetDepth *req)
{
	struct sess *s = req->session ? sess_find(d, req->session) : own;
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__Ok ok = PF__OK__INIT;

	if (!s)
		return peer_error(p, id, -ENOENT, "no session %" PRIu64, req->session);
	if (s->uid != p->uid && p->uid != 0 && p->uid != getuid())
		return peer_error(p, id, -EPERM,
				  "session %" PRIu64 " belongs to uid %u; only that user, root or "
				  "the daemon's user may change it",
				  s->id, (unsigned)s->uid);
	if (req->automatic || req->target == 0)
		gov_set_auto(&s->gov, d->cfg.depth);
	else
		gov_set_manual(&s->gov, req->target);
	sess_fill_shares(d); /* a manual target fills more (or less) ahead */
	log_info("session %" PRIu64 ": target %u (%s), by %s", s->id, s->gov.target, s->gov.reason,
		 p->name);
	sess_kick(s);
	env.msg_case = PF__ENVELOPE__MSG_OK;
	env.ok = &ok;
	return reply(p, id, &env);
}
