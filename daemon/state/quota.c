/*
 * quota.c — per-user holdings against the daemon's limits (see quota.h).
 *
 * DESIGN: loop thread only.  A take checks the user's limit first, then the
 * total, so the message names the tighter one that was hit.
 */
#include "state/quota.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "util.h"

static struct quota_user *find(const struct quota *q, uid_t uid)
{
	for (size_t i = 0; i < q->nusers; i++)
		if (q->users[i].uid == uid)
			return &q->users[i];
	return NULL;
}

static struct quota_user *find_or_add(struct quota *q, uid_t uid)
{
	struct quota_user *u = find(q, uid);

	if (u)
		return u;
	if (q->nusers == q->cap) {
		size_t cap = q->cap ? 2 * q->cap : 8;
		struct quota_user *t = realloc(q->users, cap * sizeof(*t));

		if (!t)
			return NULL;
		q->users = t;
		q->cap = cap;
	}
	u = &q->users[q->nusers++];
	*u = (struct quota_user){.uid = uid};
	return u;
}

/* An entry that holds nothing goes (users come and go with their
 * connections). */
static void drop_if_empty(struct quota *q, struct quota_user *u)
{
	for (int k = 0; k < QUOTA_KINDS; k++)
		if (u->held[k])
			return;
	*u = q->users[--q->nusers];
}

/* The message of a refused take: "WHAT needs N: uid U holds H of its
 * KEY = L" (or the total's). */
static int refuse(enum quota_kind kind, bool total, uint64_t n, uint64_t have, uint64_t limit,
		  const char *what, char *err, size_t errlen)
{
	static const char *const keys[][2] = {
		[QUOTA_MEMORY] = {"memory_per_uid", "memory_budget"},
		[QUOTA_CONNS] = {"max_conns_per_uid", "max_conns"},
		[QUOTA_SESSIONS] = {"max_sessions_per_uid", "max_sessions"},
	};
	const char *key = keys[kind][total];

	if (kind == QUOTA_MEMORY)
		set_err(err, errlen,
			"%s needs %.1f MiB, but %s %.1f MiB of %s = %.1f MiB ([daemon] in the "
			"configuration)",
			what, n / 1048576.0, total ? "all users hold" : "this user holds",
			have / 1048576.0, key, limit / 1048576.0);
	else
		set_err(err, errlen,
			"%s refused: %s %" PRIu64 " of %s = %" PRIu64 " ([daemon] in the "
			"configuration)",
			what, total ? "the daemon has" : "this user has", have, key, limit);
	return kind == QUOTA_MEMORY ? -ENOMEM : -EMFILE;
}

int quota_take(struct quota *q, uid_t uid, enum quota_kind kind, uint64_t n, const char *what,
	       char *err, size_t errlen)
{
	uint64_t per = q->lim.per_uid[kind], all = q->lim.all[kind], total = q->held[kind];
	struct quota_user *u = find_or_add(q, uid);
	uint64_t mine;

	if (!u) {
		set_err(err, errlen, "%s refused: out of memory", what);
		return -ENOMEM;
	}
	mine = u->held[kind];
	if (n > per || mine > per - n || n > all || total > all - n) {
		bool mine_hit = n > per || mine > per - n;
		int rc = refuse(kind, !mine_hit, n, mine_hit ? mine : total, mine_hit ? per : all,
				what, err, errlen);

		drop_if_empty(q, u);
		return rc;
	}
	u->held[kind] += n;
	q->held[kind] += n;
	return 0;
}

void quota_give(struct quota *q, uid_t uid, enum quota_kind kind, uint64_t n)
{
	struct quota_user *u = find(q, uid);

	if (!u)
		return;
	u->held[kind] -= n;
	q->held[kind] -= n;
	drop_if_empty(q, u);
}

void quota_free(struct quota *q)
{
	free(q->users);
	q->users = NULL;
	q->nusers = q->cap = 0;
}

int quota_check(const struct quota *q)
{
	for (int k = 0; k < QUOTA_KINDS; k++) {
		uint64_t sum = 0;

		for (size_t i = 0; i < q->nusers; i++)
			sum += q->users[i].held[k];
		if (sum != q->held[k])
			return 0;
	}
	return 1;
}
