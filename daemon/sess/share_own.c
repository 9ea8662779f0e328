/*
 * share_own.c — a share member's session of its own: what it serves (the
 * batches the member missed, or, once it trailed, the rest of its epoch,
 * as an explicit order of the producer's picks) and its renumbering into
 * the member's numbering (share.c's header says how), and the member's
 * EpochEnd.
 *
 * DESIGN: loop thread only.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sess/share_int.h"
#include "state/daemon.h"

int share_send_end(struct share_member *m)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__EpochEnd msg = PF__EPOCH_END__INIT;

	msg.epoch = m->epoch;
	msg.batches = m->total;
	env.msg_case = PF__ENVELOPE__MSG_END;
	env.end = &msg;
	m->in_group = false;
	m->own_live = false;
	return send_to(m, &env, -1);
}

/* ---- the member's own session ---------------------------------------------- */

/* own's peer (share.h): what its session sends, in the member's numbering. */
static int own_send(void *conn, const Pf__Envelope *env, int fd)
{
	struct share_member *m = conn;
	Pf__Envelope out = *env;
	Pf__BatchReady b;
	Pf__Arena a;

	switch (env->msg_case) {
	case PF__ENVELOPE__MSG_OPENED:
	case PF__ENVELOPE__MSG_OK: return 0; /* answers to the share's own requests */
	case PF__ENVELOPE__MSG_STARTED:
		m->own_started = true;
		m->own_batches = env->started->batches;
		return 0;
	case PF__ENVELOPE__MSG_ARENA:
		a = *env->arena;
		a.id += SHARE_OWN_ARENA;
		out.arena = &a;
		return send_to(m, &out, fd);
	case PF__ENVELOPE__MSG_BATCH:
		b = *env->batch;
		if (b.epoch != m->epoch)
			return 0; /* cannot be: own runs the member's epoch */
		b.seq += m->own_shift;
		if (b.slot >= 0) {
			b.slot += (int32_t)m->sh->nslots;
			b.arena += SHARE_OWN_ARENA;
		}
		m->own_sent++;
		out.batch = &b;
		return send_to(m, &out, fd);
	case PF__ENVELOPE__MSG_END:
		if (env->end->epoch != m->epoch || !m->own_live)
			return 0;
		return share_send_end(m);
	default: return send_to(m, &out, fd);
	}
}

static bool own_busy(void *conn)
{
	const struct share_member *m = conn;

	return peer_busy(m->peer);
}

int share_open_own(struct share_member *m)
{
	struct share *sh = m->sh;
	Pf__OpenSession req = PF__OPEN_SESSION__INIT;
	struct sess_how how = {.extra_slots = 0, .plain = true};
	char name[96];

	if (m->own)
		return 0;
	m->own_peer = *m->peer;
	m->own_peer.conn = m;
	m->own_peer.send = own_send;
	m->own_peer.busy = own_busy;
	snprintf(name, sizeof(name), "%.80s alone", m->peer->name);
	req.dataset = sh->dataset;
	req.device = sh->device;
	req.batch_size = sh->batch_size;
	req.drop_last = sh->drop_last;
	req.augment = sh->augment;
	req.min_depth = sh->src->gov.min_depth;
	req.max_depth = sh->src->gov.max_depth;
	req.name = name;
	req.picks_le = sh->picks_le;
	req.narrow = sh->narrow;
	req.ipc = sh->src->gpu >= 0 && sh->src->cuda.ipc == GPU_IPC_LEGACY ? PF__IPC__IPC_LEGACY
									   : PF__IPC__IPC_FD;
	if (sh->src->gpu < 0)
		req.ipc = PF__IPC__IPC_DEFAULT;
	/* An Error goes to the member as a push: its next pf_next says it. */
	sess_open_how(sh->d, &m->own_peer, &m->own, 0, &req, &how);
	return m->own ? 0 : -EIO;
}

/* m gets the rest of its epoch from its own session: the producer's
 * batches [lo1, hi1) and then [lo2, hi2), as one explicit order of the
 * producer's picks. */
void share_go_alone(struct share_member *m, uint64_t lo1, uint64_t hi1, uint64_t lo2, uint64_t hi2)
{
	struct share *sh = m->sh;
	const struct sess *src = sh->src;
	Pf__StartEpoch st = PF__START_EPOCH__INIT;
	uint64_t n1, n2, *picks;

	m->in_group = false;
	if (lo1 >= hi1 && lo2 >= hi2) {
		share_send_end(m); /* it has had every batch */
		return;
	}
	n1 = lo1 < hi1 ? (hi1 * sh->batch_size < src->npicks ? hi1 * sh->batch_size : src->npicks) -
				 lo1 * sh->batch_size
		       : 0;
	n2 = lo2 < hi2 ? (hi2 * sh->batch_size < src->npicks ? hi2 * sh->batch_size : src->npicks) -
				 lo2 * sh->batch_size
		       : 0;
	picks = malloc((n1 + n2) * sizeof(*picks));
	if (!picks || share_open_own(m)) {
		free(picks);
		peer_error(m->peer, 0, -ENOMEM,
			   "share '%s': epoch %" PRIu64 ": no session of its own could be opened "
			   "for the batches this session has not had",
			   sh->name, m->epoch);
		return;
	}
	if (n1)
		memcpy(picks, src->picks + lo1 * sh->batch_size, n1 * sizeof(*picks));
	if (n2)
		memcpy(picks + n1, src->picks + lo2 * sh->batch_size, n2 * sizeof(*picks));
	st.epoch = m->epoch;
	st.order = PF__ORDER__ORDER_EXPLICIT;
	st.n_indices = n1 + n2;
	st.indices = picks;
	m->own_shift = m->start + m->grp_sent;
	m->own_sent = 0;
	m->own_started = false;
	m->own_live = true;
	sess_start_epoch(m->own, 0, &st);
	free(picks);
	if (!m->own_started)
		m->own_live = false; /* refused: the Error went to the member */
}
