/*
 * share.c — a share's producing session, its members and the fan-out
 * between them (see share.h).
 *
 * Numbering.  A member sees one session of 2 x G slots, G the producer's:
 * slots 0..G-1 are the producer's (its arenas keep their ids), slots
 * G..2G-1 the member's own session's (its arenas from SHARE_OWN_ARENA on).
 * The member's batches are numbered in the order it gets them, from its
 * StartEpoch's start_batch: first grp_sent batches of the producer (from
 * the producer's seq grp_first on), then its own session's, whose seq 0 is
 * the member's own_shift.  The client needs nothing of this: it sees a
 * session whose batches come in order and whose slots it releases.
 *
 * What the member does not get from the share, its own session serves as
 * an explicit order of the producer's own picks: the batches it missed
 * (from the producer's start_batch to where it joined) and, once dropped,
 * those after the last one sent to it.  Those picks are the producer's,
 * so the member's epoch is the share's epoch, each pick once.
 *
 * Holds.  holders[i] counts the members holding producer slot i (a bit per
 * member in its holds[]).  The producer's slot goes back (sess_release) at
 * the last release, or when the last holder leaves.
 *
 * DESIGN: loop thread only.  Replies to a member's request go to that
 * member alone: the share sets `asker` around every call into the
 * producer, and the fan-out sends a reply (and an Error) only to it.
 */
#include "sess/share_int.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <uv.h>

#include "base/log.h"
#include "sess/peer.h"
#include "sess/sess.h"
#include "state/daemon.h"
#include "util.h"

/* How long a member may stay more than share_lag behind before it goes on
 * alone: trainers in step look apart for a turn of the loop (judge), and a
 * stalled one holds slots, which the share has share_lag of spare. */
#define SHARE_BEHIND_MS 50

/* ---- helpers ----------------------------------------------------------------- */

static void take_hold(struct share *sh, struct share_member *m, int32_t slot)
{
	if (!m->holds[slot]) {
		m->holds[slot] = 1;
		m->nheld++;
		sh->holders[slot]++;
	}
}

/* m gives back producer slot `slot`: the producer's at the last holder. */
static void drop_hold(struct share *sh, struct share_member *m, int32_t slot)
{
	const struct slot *sl = &sh->src->slots[slot];
	Pf__Release rel = PF__RELEASE__INIT;

	if (!m->holds[slot])
		return;
	m->holds[slot] = 0;
	m->nheld--;
	if (--sh->holders[slot] || sl->state != SLOT_SENT)
		return;
	rel.epoch = sl->epoch;
	rel.seq = sl->seq;
	rel.slot = slot;
	sh->asker = NULL;
	sess_release(sh->src, &rel);
}

/* What the share kept for m of the producer's epoch (expect) goes back. */
static void drop_expected(struct share *sh, struct share_member *m)
{
	m->expect = false;
	for (uint32_t i = 0; i < sh->nslots && m->nheld; i++)
		if (m->holds[i] && sh->src->slots[i].epoch == m->expect_epoch)
			drop_hold(sh, m, (int32_t)i);
}

static int reply_started(struct share_member *m, uint64_t id, uint64_t samples)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__EpochStarted msg = PF__EPOCH_STARTED__INIT;

	msg.epoch = m->epoch;
	msg.batches = m->total;
	msg.samples = samples;
	env.id = id;
	env.msg_case = PF__ENVELOPE__MSG_STARTED;
	env.started = &msg;
	return send_to(m, &env, -1);
}

/* ---- the fan-out (the producer's peer) ------------------------------------- */

/* Batch env of the producer to member m, in m's numbering, if it is the
 * one m gets next: true when it went. */
static bool deliver(struct share *sh, struct share_member *m, const Pf__Envelope *env)
{
	const Pf__BatchReady *in = env->batch;
	Pf__Envelope out = *env;
	Pf__BatchReady b = *in;

	if (m->expect && in->epoch == m->expect_epoch && in->slot >= 0) {
		take_hold(sh, m, in->slot); /* kept for it: it has not asked yet */
		return true;
	}
	if (!receiving(sh, m) || in->epoch != sh->src->epoch ||
	    in->seq != m->grp_first + m->grp_sent)
		return false;
	b.epoch = m->epoch;
	b.seq = m->start + m->grp_sent;
	out.batch = &b;
	if (in->slot >= 0)
		take_hold(sh, m, in->slot);
	m->grp_sent++;
	send_to(m, &out, -1);
	return true;
}

static void batch_out(struct share *sh, const Pf__Envelope *env)
{
	bool held = false;

	for (struct share_member *m = sh->members; m; m = m->next)
		held |= deliver(sh, m, env);
	if (env->batch->slot >= 0 && !held)
		log_err("share '%s': batch %" PRIu64 " went to no member", sh->name,
			env->batch->seq);
}

/* The peer a batch is sent again through, to replay_to only. */
static int again_send(void *conn, const Pf__Envelope *env, int fd)
{
	struct share *sh = conn;

	if (fd >= 0)
		close(fd);
	if (env->msg_case == PF__ENVELOPE__MSG_BATCH && sh->replay_to)
		deliver(sh, sh->replay_to, env);
	return 0;
}

/* The producer's slot holding batch seq of its epoch, sent and still held
 * by a member, or NULL. */
static const struct slot *held_slot(const struct share *sh, uint64_t seq)
{
	const struct sess *src = sh->src;

	for (uint32_t i = 0; i < sh->nslots; i++) {
		const struct slot *sl = &src->slots[i];

		if (sl->state == SLOT_SENT && sl->epoch == src->epoch && sl->seq == seq &&
		    sh->holders[i] && !sl->plan.active)
			return sl;
	}
	return NULL;
}

/* The share's epoch has no batch left for m: its EpochEnd, or first the
 * batches it missed, from its own session. */
static void end_out_one(struct share *sh, struct share_member *m)
{
	(void)sh;
	if (m->miss_lo < m->miss_hi)
		share_go_alone(m, m->miss_lo, m->miss_hi, 0, 0);
	else
		share_send_end(m);
}

static void end_out(struct share *sh, const Pf__EpochEnd *end)
{
	for (struct share_member *m = sh->members; m; m = m->next)
		if (receiving(sh, m) && end->epoch == sh->src->epoch)
			end_out_one(sh, m);
}

static int fan_send(void *conn, const Pf__Envelope *env, int fd)
{
	struct share *sh = conn;

	switch (env->msg_case) {
	case PF__ENVELOPE__MSG_BATCH: batch_out(sh, env); break;
	case PF__ENVELOPE__MSG_END: end_out(sh, env->end); break;
	case PF__ENVELOPE__MSG_OPENED: break; /* the share answers its members */
	case PF__ENVELOPE__MSG_STARTED:
		sh->got_started = true;
		sh->started = env->started->batches;
		sh->samples = env->started->samples;
		break;
	case PF__ENVELOPE__MSG_OK:
		if (env->id && sh->asker)
			send_to(sh->asker, env, -1);
		break;
	case PF__ENVELOPE__MSG_ERROR:
		if (sh->asker)
			send_to(sh->asker, env, -1);
		else if (sh->opener)
			peer_send(sh->opener, env, -1);
		else
			log_warn("share '%s': %s", sh->name, env->error->message);
		break;
	default:
		/* Pushes (arenas): every member maps them. */
		for (struct share_member *m = sh->members; m; m = m->next) {
			int dup_fd = fd >= 0 ? fcntl(fd, F_DUPFD_CLOEXEC, 0) : -1;

			if (fd >= 0 && dup_fd < 0)
				log_err("share '%s': cannot pass an arena to session %" PRIu64
					": %s",
					sh->name, m->id, strerror(errno));
			else
				send_to(m, env, dup_fd);
		}
		break;
	}
	if (fd >= 0)
		close(fd);
	return 0;
}

/* Batches wait while every member receiving them is busy: one that does
 * not read its socket falls behind and is dropped (share_lag), instead of
 * holding up the others. */
static bool fan_busy(void *conn)
{
	struct share *sh = conn;
	bool any = false;

	for (struct share_member *m = sh->members; m; m = m->next) {
		if (!receiving(sh, m))
			continue;
		if (!peer_busy(m->peer))
			return false;
		any = true;
	}
	return any;
}

/* ---- pacing ------------------------------------------------------------------ */

/* Producer slots some member holds.  A member that trails keeps its
 * slots after it is dropped, until it takes and releases those batches:
 * it is dropped while the others still have target + SESS_HOLD_SLOTS
 * slots to go on with, or the share would wait for it (judge). */
static uint32_t held_slots(const struct share *sh)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < sh->nslots; i++)
		n += sh->holders[i] > 0;
	return n;
}

/* What members hold leaves the producer less than its target and the
 * holds of a session: one that trails or is kept for must give way. */
static bool short_of_slots(const struct share *sh)
{
	return held_slots(sh) + sh->src->gov.target + SESS_HOLD_SLOTS >= sh->nslots;
}

/* The producer hears of the fastest member's takes. */
static void pace(struct share *sh)
{
	struct sess *src = sh->src;
	uint64_t lead = lead_pos(sh);

	while (lead && src->start_batch + sh->paced < lead) {
		Pf__Ack ack = PF__ACK__INIT;

		ack.epoch = src->epoch;
		sh->paced++;
		sh->asker = NULL;
		sess_ack(src, &ack);
	}
}

/* A member more than share_lag behind the fastest for SHARE_BEHIND_MS goes
 * on alone, or at once when what it holds leaves the share no slot to
 * fill.  Judged once a turn of the loop, after the turn's frames were
 * read: members' Acks come on their own sockets, read one after the other,
 * so that trainers in step look apart by what one sent since its socket
 * was read; in a tight loop that was 4 batches (tests/integration/
 * test_integration_share.c), gone a turn later. */
static void judge(uv_check_t *h)
{
	struct share *sh = h->data;
	struct sess *src = sh->src;
	uint64_t lead = lead_pos(sh), lag = sh->d->cfg.share_lag, now = 0;

	for (struct share_member *m = sh->members; m; m = m->next) {
		if (!m->expect || !short_of_slots(sh))
			continue;
		log_info("share '%s': session %" PRIu64 " (%s) has not started epoch %" PRIu64
			 " yet, and the others need the slots kept for it: it will get the "
			 "batches it missed from a session of its own",
			 sh->name, m->id, m->peer->name, m->expect_epoch);
		drop_expected(sh, m);
	}
	for (struct share_member *m = sh->members; m && lead; m = m->next) {
		uint64_t next, behind;
		bool tight;

		if (!receiving(sh, m) || (behind = lead - taken_pos(m)) <= lag) {
			m->behind_since_ns = 0;
			continue;
		}
		/* The slack it joined with shrinks as it catches up, and
		 * never holds the others up: short of slots, it goes. */
		if (m->slack > behind - lag)
			m->slack = behind - lag;
		tight = short_of_slots(sh);
		if (behind <= lag + m->slack && !tight) {
			m->behind_since_ns = 0;
			continue;
		}
		if (!now)
			now = now_ns();
		if (!m->behind_since_ns)
			m->behind_since_ns = now;
		if (now - m->behind_since_ns < SHARE_BEHIND_MS * 1000000ull && !tight)
			continue;
		m->behind_since_ns = 0;
		next = m->grp_first + m->grp_sent;
		m->dropped++;
		log_info("share '%s': session %" PRIu64 " (%s) is %" PRIu64
			 " batches behind the fastest (share_lag = %" PRIu64
			 "): it gets the %" PRIu64 " batch(es) left of epoch %" PRIu64
			 " from a session of its own",
			 sh->name, m->id, m->peer->name, lead - taken_pos(m), lag,
			 (src->nbatches - next) + (m->miss_hi - m->miss_lo), m->epoch);
		share_go_alone(m, m->miss_lo, m->miss_hi, next, src->nbatches);
	}
}

/* Nobody receives the producer's epoch any more: it stops filling. */
static void idle_if_unwatched(struct share *sh)
{
	Pf__Abandon ab = PF__ABANDON__INIT;

	for (struct share_member *m = sh->members; m; m = m->next)
		if (receiving(sh, m))
			return;
	if (!sh->src->running)
		return;
	ab.epoch = sh->src->epoch;
	sh->asker = NULL;
	sess_abandon(sh->src, 0, &ab);
}

/* ---- opening ----------------------------------------------------------------- */

static void share_closed(uv_handle_t *h)
{
	free(h->data);
}

static void share_free(struct share *sh)
{
	struct share **pp = &sh->d->shares;

	while (*pp && *pp != sh)
		pp = &(*pp)->next;
	if (*pp)
		*pp = sh->next;
	if (sh->src)
		sess_detach(sh->src);
	if (sh->spec)
		pf__start_epoch__free_unpacked(sh->spec, NULL);
	free(sh->holders);
	free(sh->dataset);
	free(sh->device);
	uv_close((uv_handle_t *)&sh->judge, share_closed);
}

static struct share *share_new(struct daemon *d, const struct peer *p, uint64_t id,
			       const Pf__OpenSession *req)
{
	struct share *sh = calloc(1, sizeof(*sh));
	Pf__OpenSession preq = *req;
	/* Beyond a session's slots: share_lag for the members that trail,
	 * and max_depth more, so that one dropped with its holds leaves the
	 * others a whole target to go on with. */
	struct sess_how how = {.extra_slots = d->cfg.share_lag + d->cfg.max_depth, .plain = true};
	char name[96];

	if (!sh) {
		peer_error(p, id, -ENOMEM, "out of memory");
		return NULL;
	}
	sh->d = d;
	uv_check_init(d->loop, &sh->judge);
	sh->judge.data = sh;
	if (!(sh->dataset = strdup(req->dataset)) ||
	    !(sh->device = strdup(req->device[0] ? req->device : "host"))) {
		share_free(sh);
		peer_error(p, id, -ENOMEM, "out of memory");
		return NULL;
	}
	snprintf(sh->name, sizeof(sh->name), "%s", req->share);
	sh->uid = p->uid;
	sh->batch_size = req->batch_size;
	sh->augment = req->augment ? req->augment : 1;
	sh->drop_last = req->drop_last;
	sh->picks_le = req->picks_le;
	sh->narrow = req->narrow;
	sh->fan = *p;
	sh->fan.conn = sh;
	sh->fan.send = fan_send;
	sh->fan.busy = fan_busy;
	snprintf(sh->fan.name, sizeof(sh->fan.name), "share %s", sh->name);
	sh->again = sh->fan;
	sh->again.send = again_send;
	sh->again.busy = NULL;
	snprintf(name, sizeof(name), "share %s", sh->name);
	/* One copy (pool on: one gather, the daemon's) into device slots
	 * each member maps: no client copies, and no client gathers (a
	 * client's gather writes the slot from one member's context). */
	preq.share = "";
	preq.name = name;
	preq.client_copy = false;
	preq.gather = false;
	/* Its refusals go to p (opener): the fan-out has no members yet. */
	sh->opener = p;
	sess_open_how(d, &sh->fan, &sh->src, id, &preq, &how);
	sh->opener = NULL;
	if (!sh->src) {
		share_free(sh);
		return NULL;
	}
	uv_check_start(&sh->judge, judge);
	sh->nslots = sh->src->nslots;
	sh->holders = calloc(sh->nslots, sizeof(*sh->holders));
	if (!sh->holders) {
		peer_error(p, id, -ENOMEM, "out of memory");
		share_free(sh);
		return NULL;
	}
	sh->next = d->shares;
	d->shares = sh;
	log_info("share '%s' of uid %u opened: session %" PRIu64 " reads and copies for it",
		 sh->name, (unsigned)sh->uid, sh->src->id);
	return sh;
}

int share_open(struct daemon *d, const struct peer *p, struct share_member **slot, uint64_t id,
	       const Pf__OpenSession *req)
{
	struct share *sh;
	struct share_member *m;
	char err[200], why[160];
	size_t len = strlen(req->share);
	int rc;

	if (*slot)
		return peer_error(p, id, -EBUSY,
				  "this connection already has session %" PRIu64
				  "; open another connection for another session",
				  (*slot)->id);
	if (len >= sizeof(sh->name))
		return peer_error(p, id, -ENAMETOOLONG, "share name of %zu bytes: at most %zu", len,
				  sizeof(sh->name) - 1);
	for (size_t i = 0; i < len; i++)
		if ((unsigned char)req->share[i] < 0x20 || req->share[i] == 0x7f)
			return peer_error(p, id, -EINVAL,
					  "share name has a control character at byte %zu", i);
	for (sh = d->shares; sh; sh = sh->next)
		if (sh->uid == p->uid && strcmp(sh->name, req->share) == 0)
			break;
	if (sh && share_open_differs(sh, req, why, sizeof(why)))
		return peer_error(p, id, -EINVAL,
				  "cannot join share '%s': it is %s (every session of a share "
				  "asks for the same dataset, device, batch_size, drop_last and "
				  "augment)",
				  sh->name, why);
	if (sh && sh->nmembers >= SHARE_MAX_MEMBERS)
		return peer_error(p, id, -EUSERS, "share '%s' has %u members, the most it may have",
				  sh->name, SHARE_MAX_MEMBERS);
	rc = quota_take(&d->quota, p->uid, QUOTA_SESSIONS, 1, "a new session", err, sizeof(err));
	if (rc)
		return peer_error(p, id, rc, "%s", err);
	if (!sh && !(sh = share_new(d, p, id, req))) {
		quota_give(&d->quota, p->uid, QUOTA_SESSIONS, 1);
		return 0; /* refused, and said so */
	}
	m = calloc(1, sizeof(*m));
	if (m)
		m->holds = calloc(sh->nslots, 1);
	if (!m || !m->holds) {
		free(m);
		quota_give(&d->quota, p->uid, QUOTA_SESSIONS, 1);
		if (!sh->members)
			share_free(sh);
		return peer_error(p, id, -ENOMEM, "out of memory");
	}
	m->sh = sh;
	m->peer = p;
	m->counted = true;
	m->id = ++d->next_session_id;
	m->next = sh->members;
	sh->members = m;
	sh->nmembers++;
	*slot = m;
	log_info("share '%s': session %" PRIu64 " of %s joined (%u member(s))", sh->name, m->id,
		 p->name, sh->nmembers);
	rc = sess_send_opened(sh->src, p, id, m->id, 2 * sh->nslots, sh->name);
	if (!rc)
		rc = sess_send_arenas(sh->src, p);
	return rc;
}

/* ---- epochs ------------------------------------------------------------------ */

/* The member starts its epoch alone: the share runs another. */
static int start_alone(struct share_member *m, uint64_t id, const Pf__StartEpoch *req,
		       const char *why)
{
	m->in_group = false;
	m->grp_sent = 0;
	if (share_open_own(m))
		return peer_error(m->peer, id, -EIO,
				  "share '%s': epoch %" PRIu64 ": no session of its own could be "
				  "opened for it",
				  m->sh->name, req->epoch);
	log_info("share '%s': session %" PRIu64 " runs epoch %" PRIu64 " alone: %s", m->sh->name,
		 m->id, req->epoch, why);
	m->own_shift = 0;
	m->own_sent = 0;
	m->own_started = false;
	m->own_live = true;
	sess_start_epoch(m->own, id, req);
	if (!m->own_started) {
		m->own_live = false;
		return 0; /* refused: the Error went to the member */
	}
	m->total = m->own_batches;
	return reply_started(m, id, m->own->npicks);
}

int share_start_epoch(struct share_member *m, uint64_t id, const Pf__StartEpoch *req)
{
	struct share *sh = m->sh;
	struct sess *src = sh->src;
	char why[160];
	bool busy = false;
	uint64_t lead;

	/* What the share kept for it (expect) serves it only if it now starts
	 * the share's epoch, alike. */
	if (m->expect && (req->order == PF__ORDER__ORDER_PACED || req->epoch != src->epoch ||
			  !sh->spec || share_start_differs(sh->spec, req, why, sizeof(why)) ||
			  req->start_batch != sh->spec->start_batch))
		drop_expected(sh, m);
	m->expect = false;
	if (req->order == PF__ORDER__ORDER_PACED)
		return peer_error(m->peer, id, -EINVAL,
				  "share '%s': paced epochs cannot be shared (each trainer "
				  "sends its own batches)",
				  sh->name);
	if (m->had_epoch && req->epoch <= m->epoch)
		return peer_error(m->peer, id, -ESTALE,
				  "epoch %" PRIu64 ": epochs must grow (this session's last was "
				  "%" PRIu64 ")",
				  req->epoch, m->epoch);
	/* What it had of the epoch before: its holds stay until released;
	 * its own session stops filling. */
	if (m->own_live) {
		Pf__Abandon ab = PF__ABANDON__INIT;

		ab.epoch = m->epoch;
		sess_abandon(m->own, 0, &ab);
	}
	m->in_group = false;
	m->own_live = false;
	m->had_epoch = true;
	m->epoch = req->epoch;
	m->start = req->start_batch;
	m->acked = 0;
	m->grp_sent = 0;
	m->own_sent = 0;
	m->bias = 0;
	m->slack = 0;
	m->miss_lo = m->miss_hi = 0;
	for (struct share_member *o = sh->members; o; o = o->next)
		busy |= o != m && receiving(sh, o);
	if (!src->had_epoch || (req->epoch > src->epoch && !busy)) {
		Pf__StartEpoch *copy;
		size_t n = pf__start_epoch__get_packed_size(req);
		uint8_t *buf = malloc(n ? n : 1);

		if (!buf)
			return peer_error(m->peer, id, -ENOMEM, "out of memory");
		pf__start_epoch__pack(req, buf);
		copy = pf__start_epoch__unpack(NULL, n, buf);
		free(buf);
		if (!copy)
			return peer_error(m->peer, id, -ENOMEM, "out of memory");
		/* Members still in the epoch the share leaves will likely want
		 * this one too: it is kept for them (expect). */
		for (struct share_member *o = sh->members; o; o = o->next)
			if (o->expect)
				drop_expected(sh, o); /* it never came to the last one */
		for (struct share_member *o = sh->members; o; o = o->next) {
			o->expect_epoch = req->epoch;
			o->expect =
				o != m && src->had_epoch && o->had_epoch && o->epoch == src->epoch;
		}
		sh->got_started = false;
		sh->asker = m;
		sess_start_epoch(src, id, req);
		sh->asker = NULL;
		if (!sh->got_started) {
			for (struct share_member *o = sh->members; o; o = o->next)
				o->expect = false; /* the producer's epoch did not change */
			pf__start_epoch__free_unpacked(copy, NULL);
			return 0; /* refused: the Error went to m */
		}
		if (sh->spec)
			pf__start_epoch__free_unpacked(sh->spec, NULL);
		sh->spec = copy;
		sh->paced = 0;
		m->in_group = true;
		m->grp_first = src->start_batch;
		m->total = sh->started;
		return reply_started(m, id, sh->samples);
	}
	if (req->epoch != src->epoch)
		return start_alone(m, id, req,
				   req->epoch < src->epoch ? "the share is past that epoch"
							   : "the share's epoch is not over");
	if (share_start_differs(sh->spec, req, why, sizeof(why)))
		return peer_error(m->peer, id, -EINVAL,
				  "share '%s': epoch %" PRIu64 " was started with %s (every "
				  "session of a share starts an epoch alike)",
				  sh->name, req->epoch, why);
	if (req->start_batch != sh->spec->start_batch) {
		snprintf(why, sizeof(why), "start_batch %" PRIu64 ", the share's %" PRIu64,
			 req->start_batch, sh->spec->start_batch);
		return start_alone(m, id, req, why);
	}
	/* Late: the batches the others still hold come to it too, then the
	 * share's next ones; those before, released already, come from a
	 * session of its own at the epoch's end. */
	lead = lead_pos(sh);
	if (!lead)
		lead = src->start_batch + sh->paced;
	m->grp_first = src->next_send;
	while (m->grp_first > src->start_batch && held_slot(sh, m->grp_first - 1))
		m->grp_first--;
	/* What was kept for it before a gap (an error batch holds no slot)
	 * comes from its own session with the rest it missed. */
	for (uint32_t i = 0; i < sh->nslots && m->nheld; i++)
		if (m->holds[i] && src->slots[i].epoch == src->epoch &&
		    src->slots[i].seq < m->grp_first)
			drop_hold(sh, m, (int32_t)i);
	m->bias = m->grp_first > lead ? m->grp_first - lead : 0;
	m->slack = m->grp_first < lead ? lead - m->grp_first : 0;
	m->miss_lo = src->start_batch;
	m->miss_hi = m->grp_first;
	m->total = src->nbatches - src->start_batch;
	m->in_group = true;
	if (m->miss_hi > m->miss_lo)
		log_info("share '%s': session %" PRIu64 " joins epoch %" PRIu64 " at batch %" PRIu64
			 "; the %" PRIu64 " before come from a session of its own",
			 sh->name, m->id, req->epoch, m->grp_first, m->miss_hi - m->miss_lo);
	reply_started(m, id, sh->samples);
	sh->replay_to = m;
	for (uint64_t q = m->grp_first; q < src->next_send; q++)
		sess_send_again(src, held_slot(sh, q), &sh->again);
	sh->replay_to = NULL;
	if (!src->running && src->next_send >= src->nbatches)
		end_out_one(sh, m); /* the share sent its last batch already */
	else if (!src->running)
		/* Abandoned by all the others: it gets the rest alone. */
		share_go_alone(m, m->miss_lo, m->miss_hi, src->next_send, src->nbatches);
	return 0;
}

void share_ack(struct share_member *m, const Pf__Ack *req)
{
	if (!m->had_epoch || req->epoch != m->epoch)
		return;
	if (m->acked < m->grp_sent) {
		m->acked++;
		pace(m->sh);
		return;
	}
	if (m->own && m->acked < m->grp_sent + m->own_sent) {
		Pf__Ack ack = *req;

		m->acked++;
		sess_ack(m->own, &ack);
	}
}

void share_release(struct share_member *m, const Pf__Release *req)
{
	struct share *sh = m->sh;

	if (req->slot >= 0 && (uint32_t)req->slot < sh->nslots && m->holds[req->slot]) {
		drop_hold(sh, m, req->slot);
		return;
	}
	if (m->own && req->slot >= (int32_t)sh->nslots &&
	    (uint32_t)req->slot - sh->nslots < m->own->nslots) {
		const struct slot *sl = &m->own->slots[req->slot - sh->nslots];
		Pf__Release rel = *req;

		rel.slot = req->slot - (int32_t)sh->nslots;
		rel.seq = sl->seq;
		if (sl->state == SLOT_SENT && sl->epoch == req->epoch) {
			sess_release(m->own, &rel);
			return;
		}
	}
	peer_error(m->peer, 0, -EPERM,
		   "release of slot %d (epoch %" PRIu64 " batch %" PRIu64
		   ") refused: this session does not hold that batch in that slot",
		   req->slot, req->epoch, req->seq);
}

int share_abandon(struct share_member *m, uint64_t id, const Pf__Abandon *req)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__Ok ok = PF__OK__INIT;

	if (m->had_epoch && req->epoch == m->epoch) {
		m->in_group = false;
		if (m->own_live) {
			sess_abandon(m->own, 0, req);
			m->own_live = false;
		}
		idle_if_unwatched(m->sh);
	}
	env.id = id;
	env.msg_case = PF__ENVELOPE__MSG_OK;
	env.ok = &ok;
	return send_to(m, &env, -1);
}

void share_probe(struct share_member *m, const Pf__Probe *req)
{
	m->sh->asker = NULL;
	sess_probe(m->sh->src, req);
	if (m->own)
		sess_probe(m->own, req);
}

void share_kick(struct share_member *m)
{
	sess_kick(m->sh->src);
	if (m->own)
		sess_kick(m->own);
}

struct sess *share_sess(const struct share_member *m)
{
	return m->sh->src;
}

void share_leave(struct share_member *m)
{
	struct share *sh = m->sh;
	struct share_member **pp = &sh->members;

	while (*pp != m)
		pp = &(*pp)->next;
	*pp = m->next;
	sh->nmembers--;
	log_info("share '%s': session %" PRIu64 " left (%u slot(s) held), %u member(s) left",
		 sh->name, m->id, m->nheld, sh->nmembers);
	for (uint32_t i = 0; i < sh->nslots && m->nheld; i++)
		drop_hold(sh, m, (int32_t)i);
	if (m->own)
		sess_detach(m->own);
	if (m->counted)
		quota_give(&sh->d->quota, m->peer->uid, QUOTA_SESSIONS, 1);
	free(m->holds);
	free(m);
	if (!sh->members) {
		log_info("share '%s' closed: its last member left", sh->name);
		share_free(sh);
		return;
	}
	pace(sh);
	idle_if_unwatched(sh);
}
