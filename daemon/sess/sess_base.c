/*
 * sess_base.c — what every file of a session stands on: error replies to
 * a peer, the uid's memory quota taken and given back, a paced request's
 * end, the check that frees a dead session, and the error batches (a slot
 * whose batch failed, a batch that is an error from the start).  The files
 * above it (sess_cuda.c, sess_pump.c, sess_epoch.c, sess.c) all call these;
 * this file calls none of them, and frees a session only through
 * s->free_fn, which sess_open sets (sess_int.h).
 *
 * DESIGN: loop thread only; no locks.  Nothing here keeps state of its
 * own: each function changes the session or slot it is handed.
 */
#include "sess/sess_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "state/daemon.h"
#include "data/blocks.h"
#include "base/log.h"
#include "util.h"

/* Refusals one peer may have logged: a burst of 20, then 2 a second. */
#define PEER_LOG_PER_S 2.0
#define PEER_LOG_BURST 20.0

int peer_error(const struct peer *p, uint64_t id, int code, const char *fmt, ...)
{
	Pf__Envelope env = PF__ENVELOPE__INIT;
	Pf__Error err = PF__ERROR__INIT;
	char msg[512];
	va_list ap;

	uint64_t dropped = 0;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	util_printable(msg); /* it may quote what a client sent */
	/* A client can be refused as fast as it asks: its lines are limited,
	 * its replies are not. */
	if (!p->limit || log_limit_pass(p->limit, PEER_LOG_PER_S, PEER_LOG_BURST, &dropped))
		log_info("%s: error %d: %s%s", p->name, code, msg,
			 dropped ? " (earlier refusals of this peer not logged)" : "");
	err.code = code;
	err.message = msg;
	env.id = id;
	env.msg_case = PF__ENVELOPE__MSG_ERROR;
	env.error = &err;
	return peer_send(p, &env, -1);
}

/* ---- the uid's memory quota ------------------------------------------------- */

int sess_take(struct sess *s, uint64_t *held, uint64_t n, const char *what, char *err,
	      size_t errlen)
{
	int rc = n ? quota_take(&s->d->quota, s->uid, QUOTA_MEMORY, n, what, err, errlen) : 0;

	if (!rc)
		*held += n;
	return rc;
}

void sess_give(struct sess *s, uint64_t *held, uint64_t n)
{
	if (n > *held)
		n = *held;
	quota_give(&s->d->quota, s->uid, QUOTA_MEMORY, n);
	*held -= n;
}

void sess_req_clear(struct sess *s, struct sess_req *r)
{
	sess_give(s, &s->paced_held, r->held);
	free(r->picks);
	free(r->errmsg);
	memset(r, 0, sizeof(*r));
}

/* Whichever job of a dead session comes back last frees it, and the jobs
 * come back in every file: the check is made here, at the bottom, and the
 * free, which undoes sess_open, is sess.c's, reached through s->free_fn. */
void sess_maybe_free(struct sess *s)
{
	if (s->dead && s->jobs == 0 && !s->ahead.busy)
		s->free_fn(s);
}

/* ---- error batches ----------------------------------------------------------- */

void sess_slot_error(struct sess *s, struct slot *sl, int rc, const char *why)
{
	char msg[400];

	snprintf(msg, sizeof(msg), "epoch %" PRIu64 " batch %" PRIu64 ": %s", sl->epoch, sl->seq,
		 why);
	if (sl->state != SLOT_ORPHAN)
		log_warn("session %" PRIu64 ": %s", s->id, msg);
	free(sl->errmsg);
	sl->errmsg = strdup(msg);
	sl->error = sl->errmsg ? rc : -ENOMEM;
}

void sess_fill_error(struct sess *s, struct slot *sl, int rc, const char *why)
{
	/* Its rows are never read: off the block cache's counts. */
	if (s->blocks && !s->paced && s->picks && s->next_fill < s->nbatches)
		blocks_skip(s->blocks, sess_batch_picks(s, s->next_fill),
			    sess_batch_count(s, s->next_fill));
	sl->state = SLOT_READY;
	sl->epoch = s->epoch;
	sl->seq = s->next_fill;
	sess_slot_error(s, sl, rc, why);
	s->next_fill++;
	s->gov.prepared++;
}
