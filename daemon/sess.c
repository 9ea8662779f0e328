/*
 * sess.c — sessions: layout, arenas, epochs, the slot state machine and the
 * in-order delivery pump (see sess.h).
 *
 * DESIGN: loop thread only; no locks.  Everything a reader thread needs is
 * copied into its job (sample numbers) or borrowed from memory that lives
 * until the job is back (the slot, the field offsets, the dataset).  The
 * pump runs after every event that can unblock it (a job back, an ack, a
 * release, an epoch start) and does two things: send every READY batch whose
 * turn has come, then start fills while the governor allows and a slot is
 * FREE.
 */
#include "sess.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "dataset.h"
#include "log.h"
#include "order.h"
#include "reader.h"
#include "server.h"

/* Fields start at this alignment inside a slot: enough for any dtype, for
 * vectorised copies and for CUDA's 256-byte allocation alignment. */
#define FIELD_ALIGN 256u
#define SLOT_ALIGN  4096u

static uint64_t align_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) / a * a;
}

static void sess_link(struct daemon *d, struct sess *s)
{
	s->prev = NULL;
	s->next = d->sessions;
	if (d->sessions)
		d->sessions->prev = s;
	d->sessions = s;
	d->nsessions++;
}

static void sess_unlink(struct sess *s)
{
	struct daemon *d = s->d;

	if (s->prev)
		s->prev->next = s->next;
	else if (d->sessions == s)
		d->sessions = s->next;
	if (s->next)
		s->next->prev = s->prev;
	s->next = s->prev = NULL;
	d->nsessions--;
}

static void sess_free(struct sess *s)
{
	for (uint32_t i = 0; i < s->nslots; i++)
		free(s->slots[i].errmsg);
	for (uint32_t i = 0; i < s->narenas; i++)
		arena_destroy(&s->arenas[i]);
	free(s->arenas);
	free(s->slots);
	free(s->field_offset);
	free(s->picks);
	free(s);
}

struct sess *sess_find(struct daemon *d, uint64_t id)
{
	for (struct sess *s = d->sessions; s; s = s->next)
		if (s->id == id)
			return s;
	return NULL;
}

/* Slot layout: every field's samples packed, each field starting at a
 * FIELD_ALIGN boundary. */
static int layout(struct sess *s)
{
	const struct dataset *ds = s->ds;
	uint64_t off = 0;

	s->field_offset = calloc(ds->nfields, sizeof(*s->field_offset));
	if (!s->field_offset)
		return -ENOMEM;
	for (size_t f = 0; f < ds->nfields; f++) {
		off = align_up(off, FIELD_ALIGN);
		s->field_offset[f] = off;
		off += ds->fields[f].sample_bytes * s->batch_size;
	}
	s->slot_bytes = off;
	s->slot_stride = align_up(off, SLOT_ALIGN);
	return 0;
}

static int make_host_arenas(struct sess *s, char *err, size_t errlen)
{
	const struct config *cfg = &s->d->cfg;
	uint32_t per_arena = (uint32_t)(cfg->arena_bytes / s->slot_stride);
	uint32_t slot = 0;
	int rc;

	if (per_arena == 0)
		per_arena = 1; /* one slot larger than arena_bytes gets its own arena */
	s->narenas = (s->nslots + per_arena - 1) / per_arena;
	s->arenas = calloc(s->narenas, sizeof(*s->arenas));
	if (!s->arenas)
		return -ENOMEM;
	for (uint32_t a = 0; a < s->narenas; a++) {
		uint32_t n = s->nslots - slot < per_arena ? s->nslots - slot : per_arena;
		char label[64];

		snprintf(label, sizeof(label), "prefetchd-s%" PRIu64 "-a%u", s->id, a);
		rc = arena_host_create(&s->arenas[a], a, n * s->slot_stride, label);
		if (rc) {
			snprintf(err, errlen, "cannot create a %.1f MiB host arena: %s",
				 n * s->slot_stride / 1048576.0, strerror(-rc));
			for (uint32_t b = 0; b < a; b++)
				arena_destroy(&s->arenas[b]);
			s->narenas = 0;
			return rc;
		}
		for (uint32_t k = 0; k < n; k++, slot++) {
			s->slots[slot].arena = a;
			s->slots[slot].offset = k * s->slot_stride;
			s->slots[slot].host = s->arenas[a].host + k * s->slot_stride;
		}
	}
	return 0;
}

static int push_arenas(struct sess *s)
{
	for (uint32_t a = 0; a < s->narenas; a++) {
		Pf__Envelope env = PF__ENVELOPE__INIT;
		Pf__Arena msg = PF__ARENA__INIT;
		int fd = arena_host_export(&s->arenas[a]);
		int rc;

		if (fd < 0)
			return fd;
		msg.id = a;
		msg.kind = PF__ARENA_KIND__ARENA_HOST_MEMFD;
		msg.bytes = s->arenas[a].bytes;
		msg.device = -1;
		env.msg_case = PF__ENVELOPE__MSG_ARENA;
		env.arena = &msg;
		rc = conn_send(s->conn, &env, fd);
		if (rc)
			return rc;
	}
	return 0;
}

static int reply_opened(struct sess *s, uint64_t id)
{
	const struct dataset *ds = s->ds;
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__SessionOpened msg = PF__SESSION_OPENED__INIT;
	Pf__Field *fields = calloc(ds->nfields, sizeof(*fields));
	Pf__Field **fieldp = calloc(ds->nfields, sizeof(*fieldp));
	int rc = -ENOMEM;

	if (!fields || !fieldp)
		goto out;
	for (size_t f = 0; f < ds->nfields; f++) {
		pf__field__init(&fields[f]);
		fields[f].name = ds->fields[f].name;
		fields[f].dtype = (char *)npy_dtype_name(ds->fields[f].dtype);
		fields[f].n_shape = (size_t)ds->fields[f].sample_ndim;
		fields[f].shape = (uint64_t *)ds->fields[f].sample_shape;
		fields[f].sample_bytes = ds->fields[f].sample_bytes;
		fields[f].offset = s->field_offset[f];
		fieldp[f] = &fields[f];
	}
	msg.session = s->id;
	msg.num_samples = ds->num_samples;
	msg.n_fields = ds->nfields;
	msg.fields = fieldp;
	msg.slot_bytes = s->slot_bytes;
	msg.slots = s->nslots;
	msg.target = s->gov.target;
	msg.device = s->device;
	env.id = id;
	env.msg_case = PF__ENVELOPE__MSG_OPENED;
	env.opened = &msg;
	rc = conn_send(s->conn, &env, -1);
out:
	free(fields);
	free(fieldp);
	return rc;
}

int sess_open(struct conn *c, uint64_t id, const Pf__OpenSession *req)
{
	struct daemon *d = c->d;
	const struct config *cfg = &d->cfg;
	const struct dataset *ds;
	struct sess *s;
	char err[256] = "";
	uint32_t min_depth, max_depth;
	uint64_t fit;
	int rc;

	if (c->sess)
		return conn_error(c, id, -EBUSY,
				  "this connection already has session %" PRIu64
				  "; open another connection for another session",
				  c->sess->id);
	if (d->nsessions >= cfg->max_sessions)
		return conn_error(c, id, -EMFILE, "too many sessions (max_sessions = %u)",
				  cfg->max_sessions);
	ds = daemon_dataset(d, req->dataset);
	if (!ds)
		return conn_error(c, id, -ENOENT,
				  "unknown dataset '%s' (prefetchctl datasets lists them)",
				  req->dataset);
	if (ds->error[0])
		return conn_error(c, id, -EIO, "dataset '%s' is not available: %s", ds->name,
				  ds->error);
	if (req->batch_size == 0)
		return conn_error(c, id, -EINVAL, "batch_size must be at least 1");
	if (req->device[0] && strcmp(req->device, "host") != 0) {
		if (strncmp(req->device, "cuda:", 5) != 0)
			return conn_error(c, id, -EINVAL,
					  "unknown device '%s' (use \"host\" or \"cuda:N\")",
					  req->device);
		return conn_error(c, id, -ENODEV,
				  "device %s: this daemon serves host sessions only (%s)",
				  req->device, d->gpu_desc);
	}
	min_depth = req->min_depth ? req->min_depth : 1;
	max_depth = req->max_depth ? req->max_depth : cfg->max_depth;
	if (min_depth > max_depth)
		return conn_error(c, id, -EINVAL, "min_depth %u is above max_depth %u", min_depth,
				  max_depth);

	s = calloc(1, sizeof(*s));
	if (!s)
		return conn_error(c, id, -ENOMEM, "out of memory");
	s->d = d;
	s->conn = c;
	s->id = ++d->next_session_id;
	s->gpu = -1;
	s->uid = c->uid;
	s->pid = c->pid;
	s->ds = ds;
	s->batch_size = req->batch_size;
	s->augment = req->augment ? req->augment : 1;
	s->drop_last = req->drop_last;
	s->opened_ns = now_ns();
	snprintf(s->name, sizeof(s->name), "%.63s", req->name[0] ? req->name : c->peer);
	snprintf(s->device, sizeof(s->device), "host");
	rc = layout(s);
	if (rc)
		goto fail;

	/* Slots: the depth bound plus what the trainer may hold, trimmed to
	 * the session's memory cap but never below min_depth + 1. */
	s->nslots = max_depth + SESS_HOLD_SLOTS;
	fit = cfg->session_bytes / s->slot_stride;
	if (fit < s->nslots) {
		if (fit < (uint64_t)min_depth + 1) {
			snprintf(err, sizeof(err),
				 "a batch takes %.1f MiB; %u slots (min_depth %u + 1) exceed "
				 "session_bytes (%.1f MiB)",
				 s->slot_stride / 1048576.0, min_depth + 1, min_depth,
				 cfg->session_bytes / 1048576.0);
			rc = -E2BIG;
			goto fail;
		}
		s->nslots = (uint32_t)fit;
		max_depth = s->nslots - 1 > max_depth ? max_depth : s->nslots - 1;
		if (max_depth < min_depth)
			max_depth = min_depth;
	}
	s->slots = calloc(s->nslots, sizeof(*s->slots));
	if (!s->slots) {
		rc = -ENOMEM;
		goto fail;
	}
	gov_init(&s->gov, min_depth, max_depth, cfg->depth);
	rc = make_host_arenas(s, err, sizeof(err));
	if (rc)
		goto fail;

	c->sess = s;
	sess_link(d, s);
	rc = reply_opened(s, id);
	if (!rc)
		rc = push_arenas(s);
	if (rc)
		return rc; /* the connection is closing; sess_detach frees s */
	log_info("session %" PRIu64 " opened by %s: dataset %s, device %s, batch %u, %u slots of "
				    "%.2f MiB in %u arena(s), target %u",
		 s->id, c->peer, ds->name, s->device, s->batch_size, s->nslots,
		 s->slot_bytes / 1048576.0, s->narenas, s->gov.target);
	return 0;
fail:
	sess_free(s);
	return conn_error(c, id, rc, "cannot open a session on '%s': %s", ds->name,
			  err[0] ? err : strerror(-rc));
}

/* ---- the pump ------------------------------------------------------------ */

static struct slot *find_slot(struct sess *s, uint64_t epoch, uint64_t seq, enum slot_state st)
{
	for (uint32_t i = 0; i < s->nslots; i++) {
		struct slot *sl = &s->slots[i];

		if (sl->state == st && sl->epoch == epoch && sl->seq == seq)
			return sl;
	}
	return NULL;
}

static struct slot *free_slot(struct sess *s)
{
	for (uint32_t i = 0; i < s->nslots; i++)
		if (s->slots[i].state == SLOT_FREE)
			return &s->slots[i];
	return NULL;
}

static uint32_t batch_count(const struct sess *s, uint64_t seq)
{
	uint64_t first = seq * s->batch_size;
	uint64_t left = s->npicks - first;

	return left < s->batch_size ? (uint32_t)left : s->batch_size;
}

static int send_batch(struct sess *s, struct slot *sl)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__BatchReady msg = PF__BATCH_READY__INIT;
	uint32_t count = batch_count(s, sl->seq);
	int rc;

	msg.epoch = sl->epoch;
	msg.seq = sl->seq;
	msg.count = count;
	msg.n_picks = count;
	msg.picks = s->picks + sl->seq * s->batch_size;
	if (sl->error) {
		msg.slot = -1;
		msg.error = sl->error;
		msg.message = sl->errmsg;
	} else {
		msg.slot = (int32_t)(sl - s->slots);
		msg.arena = sl->arena;
		msg.offset = sl->offset;
	}
	env.msg_case = PF__ENVELOPE__MSG_BATCH;
	env.batch = &msg;
	rc = conn_send(s->conn, &env, -1);
	if (sl->error) {
		s->errors++;
		free(sl->errmsg);
		sl->errmsg = NULL;
		sl->error = 0;
		sl->state = SLOT_FREE;
	} else {
		sl->state = SLOT_SENT;
		s->bytes_sent += (uint64_t)count * s->ds->sample_bytes;
	}
	s->sent++;
	return rc;
}

static int send_end(struct sess *s)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__EpochEnd msg = PF__EPOCH_END__INIT;

	msg.epoch = s->epoch;
	msg.batches = s->nbatches - s->start_batch;
	env.msg_case = PF__ENVELOPE__MSG_END;
	env.end = &msg;
	return conn_send(s->conn, &env, -1);
}

static int start_fill(struct sess *s, struct slot *sl)
{
	struct reader_job *job = calloc(1, sizeof(*job));
	uint32_t count = batch_count(s, s->next_fill);
	const uint64_t *picks = s->picks + s->next_fill * s->batch_size;

	if (!job)
		return -ENOMEM;
	job->samples = malloc(sizeof(uint64_t) * count);
	if (!job->samples) {
		free(job);
		return -ENOMEM;
	}
	for (uint32_t k = 0; k < count; k++)
		job->samples[k] = picks[k] % s->ds->num_samples;
	job->owner = s;
	job->ds = s->ds;
	job->count = count;
	job->dst = sl->host;
	job->field_offset = s->field_offset;
	job->slot = (uint32_t)(sl - s->slots);
	job->epoch = s->epoch;
	job->seq = s->next_fill;
	sl->state = SLOT_FILLING;
	sl->epoch = s->epoch;
	sl->seq = s->next_fill;
	s->next_fill++;
	s->gov.prepared++;
	s->jobs++;
	reader_submit(s->d->readers, job);
	return 0;
}

static void pump(struct sess *s)
{
	struct slot *sl;

	if (s->dead || !s->conn || !s->running || s->d->stopping)
		return;
	while (s->next_send < s->nbatches &&
	       (sl = find_slot(s, s->epoch, s->next_send, SLOT_READY))) {
		if (send_batch(s, sl))
			return;
		s->next_send++;
	}
	if (s->next_send == s->nbatches) {
		s->running = false;
		log_debug("session %" PRIu64 ": epoch %" PRIu64 " done, %" PRIu64 " batches", s->id,
			  s->epoch, s->nbatches - s->start_batch);
		send_end(s);
		return;
	}
	while (s->next_fill < s->nbatches && gov_may_fill(&s->gov) && (sl = free_slot(s))) {
		if (start_fill(s, sl)) {
			log_err("session %" PRIu64 ": out of memory starting a read", s->id);
			return;
		}
	}
}

void sess_kick(struct sess *s)
{
	pump(s);
}

void sess_job_done(struct reader_job *job, void *arg)
{
	struct sess *s = job->owner;
	struct slot *sl = &s->slots[job->slot];

	s->jobs--;
	s->read_ns += job->read_ns;
	if (s->dead) {
		if (s->jobs == 0)
			sess_free(s);
		goto out;
	}
	if (sl->state == SLOT_ORPHAN) {
		sl->state = SLOT_FREE;
	} else {
		sl->state = SLOT_READY;
		sl->error = job->rc;
		if (job->rc) {
			char msg[400];

			snprintf(msg, sizeof(msg), "epoch %" PRIu64 " batch %" PRIu64 ": %s",
				 job->epoch, job->seq, job->err);
			log_warn("session %" PRIu64 ": %s", s->id, msg);
			sl->errmsg = strdup(msg);
			if (!sl->errmsg)
				sl->error = -ENOMEM;
		}
	}
	pump(s);
out:
	free(job->samples);
	free(job);
}

/* ---- requests ------------------------------------------------------------ */

/* Stops the current epoch: READY slots are free again at once, FILLING ones
 * become ORPHAN and come free when their reader is done. */
static void stop_epoch(struct sess *s)
{
	for (uint32_t i = 0; i < s->nslots; i++) {
		struct slot *sl = &s->slots[i];

		if (sl->state == SLOT_READY) {
			free(sl->errmsg);
			sl->errmsg = NULL;
			sl->error = 0;
			sl->state = SLOT_FREE;
		} else if (sl->state == SLOT_FILLING) {
			sl->state = SLOT_ORPHAN;
		}
	}
	s->running = false;
}

int sess_start_epoch(struct sess *s, uint64_t id, const Pf__StartEpoch *req)
{
	struct conn *c = s->conn;
	struct order_spec spec = {0};
	uint64_t *picks = NULL, npicks = 0, nbatches;
	char err[256] = "";
	int rc;

	if (req->epoch <= s->epoch && s->epoch != 0)
		return conn_error(c, id, -EINVAL, "epoch %" PRIu64 " is not after epoch %" PRIu64,
				  req->epoch, s->epoch);
	switch (req->order) {
	case PF__ORDER__ORDER_SEQUENTIAL: spec.kind = ORDER_SEQ; break;
	case PF__ORDER__ORDER_SHUFFLE: spec.kind = ORDER_SHUFFLE; break;
	case PF__ORDER__ORDER_EXPLICIT: spec.kind = ORDER_EXPLICIT; break;
	default: return conn_error(c, id, -EINVAL, "unknown order %d", req->order);
	}
	spec.seed = req->seed;
	spec.indices = req->indices;
	spec.nindices = req->n_indices;
	spec.rank = req->rank;
	spec.world = req->world;
	rc = order_build(&spec, s->ds->num_samples * s->augment, &picks, &npicks, err, sizeof(err));
	if (rc)
		return conn_error(c, id, rc, "epoch %" PRIu64 ": %s", req->epoch,
				  err[0] ? err : strerror(-rc));
	nbatches = order_num_batches(npicks, s->batch_size, s->drop_last);
	if (req->start_batch > nbatches) {
		free(picks);
		return conn_error(c, id, -ERANGE,
				  "start_batch %" PRIu64 " is beyond the %" PRIu64
				  " batches of this share",
				  req->start_batch, nbatches);
	}

	if (s->running)
		log_info("session %" PRIu64 ": epoch %" PRIu64 " left unfinished by epoch %" PRIu64,
			 s->id, s->epoch, req->epoch);
	stop_epoch(s);
	free(s->picks);
	s->picks = picks;
	s->npicks = npicks;
	s->nbatches = nbatches;
	s->epoch = req->epoch;
	s->start_batch = req->start_batch;
	s->next_fill = s->next_send = req->start_batch;
	s->sent = 0;
	s->running = true;
	s->epoch_started_ns = now_ns();
	gov_new_epoch(&s->gov);

	{
		Pf__Envelope env = PF__ENVELOPE__INIT;
		Pf__EpochStarted msg = PF__EPOCH_STARTED__INIT;

		msg.epoch = s->epoch;
		msg.batches = nbatches - req->start_batch;
		msg.samples = npicks;
		env.id = id;
		env.msg_case = PF__ENVELOPE__MSG_STARTED;
		env.started = &msg;
		rc = conn_send(c, &env, -1);
		if (rc)
			return rc;
	}
	pump(s);
	return 0;
}

void sess_ack(struct sess *s, const Pf__Ack *req)
{
	/* Acks of another epoch (a straggler from before an abandon or a new
	 * start) must not count against this one. */
	if (req->epoch != s->epoch || s->gov.consumed >= s->sent)
		return;
	s->gov.consumed++;
	s->wait_s = req->wait_s;
	s->busy_s = req->busy_s;
	pump(s);
}

void sess_release(struct sess *s, const Pf__Release *req)
{
	struct slot *sl;

	if (req->slot < 0 || (uint32_t)req->slot >= s->nslots) {
		conn_error(s->conn, 0, -EINVAL,
			   "release of slot %d refused: session %" PRIu64 " has slots 0..%u",
			   req->slot, s->id, s->nslots - 1);
		return;
	}
	sl = &s->slots[req->slot];
	if (sl->state != SLOT_SENT || sl->epoch != req->epoch || sl->seq != req->seq) {
		conn_error(s->conn, 0, -EPERM,
			   "release of slot %d (epoch %" PRIu64 " batch %" PRIu64
			   ") refused: this session does not hold that batch in that slot",
			   req->slot, req->epoch, req->seq);
		return;
	}
	sl->state = SLOT_FREE;
	pump(s);
}

int sess_abandon(struct sess *s, uint64_t id, const Pf__Abandon *req)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__Ok ok = PF__OK__INIT;

	if (req->epoch == s->epoch && s->running) {
		log_debug("session %" PRIu64 ": epoch %" PRIu64 " abandoned after %" PRIu64
			  " of %" PRIu64 " batches",
			  s->id, s->epoch, s->gov.consumed, s->nbatches - s->start_batch);
		stop_epoch(s);
	}
	env.id = id;
	env.msg_case = PF__ENVELOPE__MSG_OK;
	env.ok = &ok;
	return conn_send(s->conn, &env, -1);
}

void sess_probe(struct sess *s, const Pf__Probe *req)
{
	/* Host sessions have no device memory to size against; CUDA sessions
	 * size their target here (gov_size_from_probe). */
	s->gov.probe_free = req->free_bytes;
	s->gov.probe_total = req->total_bytes;
}

void sess_detach(struct sess *s)
{
	uint32_t held = 0;

	for (uint32_t i = 0; i < s->nslots; i++)
		held += s->slots[i].state == SLOT_SENT;
	log_info("session %" PRIu64 " closed: %" PRIu64
		 " bytes sent, %u slot(s) were held, %u read(s) in flight",
		 s->id, s->bytes_sent, held, s->jobs);
	sess_unlink(s);
	s->conn = NULL;
	s->dead = true;
	stop_epoch(s);
	if (s->jobs == 0)
		sess_free(s);
}

/* ---- status -------------------------------------------------------------- */

void sess_status(const struct sess *s, Pf__SessionStatus *st)
{
	uint32_t held = 0, ready = 0;
	double age = (now_ns() - s->opened_ns) / 1e9;

	/* Held: batches the trainer has taken (acked) and not yet released;
	 * sent-but-untaken ones are still in the client's queue. */
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
	st->state = s->running ? "running" : s->epoch ? "idle" : "open";
	st->sent = s->sent;
	st->consumed = s->gov.consumed;
	st->held = held;
	st->target = s->gov.target;
	st->target_reason = (char *)s->gov.reason;
	st->slots = s->nslots;
	st->ring_fill = ready;
	st->arenas = s->narenas;
	for (uint32_t i = 0; i < s->narenas; i++)
		st->arena_bytes += s->arenas[i].bytes;
	st->bytes_sent = s->bytes_sent;
	st->wait_s = s->wait_s;
	st->busy_s = s->busy_s;
	st->stall_fraction = s->wait_s + s->busy_s > 0 ? s->wait_s / (s->wait_s + s->busy_s) : 0;
	st->errors = s->errors;
	st->age_s = age;
	st->copy_gbps = s->read_ns ? s->bytes_sent / (double)s->read_ns : 0;
	st->probe_free = s->gov.probe_free;
	st->probe_total = s->gov.probe_total;
	st->min_depth = s->gov.min_depth;
	st->max_depth = s->gov.max_depth;
	st->batches = s->nbatches - s->start_batch;
}

bool sess_check(const struct sess *s)
{
	uint64_t filling = 0;

	if (!gov_check(&s->gov))
		return false;
	for (uint32_t i = 0; i < s->nslots; i++)
		filling += s->slots[i].state == SLOT_FILLING || s->slots[i].state == SLOT_ORPHAN;
	if (filling != s->jobs)
		return false;
	if (s->next_send > s->next_fill || s->next_fill > s->nbatches)
		return false;
	return true;
}
