/*
 * share_status.c — StatusReply.shares: each share the caller may see, and
 * its members (share.h).
 *
 * DESIGN: loop thread only.  Strings are borrowed from the shares, which
 * outlive the reply being built.
 */
#include <stdlib.h>

#include "sess/share_int.h"
#include "state/daemon.h"

Pf__ShareStatus **share_status(struct daemon *d, uint32_t who, bool all, size_t *n)
{
	Pf__ShareStatus **out;
	size_t k = 0, count = 0;

	for (struct share *sh = d->shares; sh; sh = sh->next)
		count += all || sh->uid == who;
	*n = 0;
	out = calloc(count + 1, sizeof(*out));
	if (!out)
		return NULL;
	for (struct share *sh = d->shares; sh; sh = sh->next) {
		Pf__ShareStatus *st;
		uint64_t lead = lead_pos(sh);
		size_t j = 0;

		if (!all && sh->uid != who)
			continue;
		st = calloc(1, sizeof(*st));
		if (!st)
			break;
		out[k++] = st;
		pf__share_status__init(st);
		st->name = sh->name;
		st->uid = sh->uid;
		st->dataset = sh->dataset;
		st->device = sh->device;
		st->session = sh->src->id;
		st->epoch = sh->src->epoch;
		st->lag = sh->d->cfg.share_lag;
		st->members = calloc(sh->nmembers + 1, sizeof(*st->members));
		if (!st->members)
			break;
		for (struct share_member *m = sh->members; m; m = m->next) {
			Pf__ShareMember *ms = calloc(1, sizeof(*ms));

			if (!ms)
				break;
			pf__share_member__init(ms);
			ms->session = m->id;
			ms->name = (char *)m->peer->name;
			ms->pid = m->peer->pid;
			ms->epoch = m->epoch;
			ms->state = receiving(sh, m) ? "in the share"
				    : m->own_live    ? "alone"
						     : "idle";
			ms->delivered = m->grp_sent + m->own_sent;
			ms->consumed = m->acked;
			ms->held = m->nheld;
			ms->behind = receiving(sh, m) ? lead - taken_pos(m) : 0;
			ms->own_batches = m->own_sent;
			ms->dropped = m->dropped;
			st->members[j++] = ms;
		}
		st->n_members = j;
	}
	*n = k;
	return out;
}

void share_status_free(Pf__ShareStatus **st, size_t n)
{
	if (!st)
		return;
	for (size_t i = 0; i < n; i++) {
		for (size_t j = 0; j < st[i]->n_members; j++)
			free(st[i]->members[j]);
		free(st[i]->members);
		free(st[i]);
	}
	free(st);
}
