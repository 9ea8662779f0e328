/*
 * quota.c — per-user holdings against the daemon's limits (see quota.h).
 *
 * DESIGN: loop thread only.  A take checks the user's limit first, then the
 * total, so the message names the tighter one that was hit.
 */
#include "quota.h"

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
	if (!u->memory && !u->conns && !u->sessions)
		*u = q->users[--q->nusers];
}

static uint64_t held(const struct quota_user *u, enum quota_kind kind)
{
	return kind == QUOTA_MEMORY ? u->memory : kind == QUOTA_CONNS ? u->conns : u->sessions;
}

static void add(struct quota *q, struct quota_user *u, enum quota_kind kind, uint64_t n, bool take)
{
	switch (kind) {
	case QUOTA_MEMORY:
		u->memory = take ? u->memory + n : u->memory - n;
		q->memory = take ? q->memory + n : q->memory - n;
		break;
	case QUOTA_CONNS:
		u->conns = take ? u->conns + (unsigned)n : u->conns - (unsigned)n;
		q->conns = take ? q->conns + (unsigned)n : q->conns - (unsigned)n;
		break;
	case QUOTA_SESSIONS:
		u->sessions = take ? u->sessions + (unsigned)n : u->sessions - (unsigned)n;
		q->sessions = take ? q->sessions + (unsigned)n : q->sessions - (unsigned)n;
		break;
	}
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
	const struct quota_limits *l = &q->lim;
	uint64_t per = kind == QUOTA_MEMORY  ? l->memory_per_uid
		       : kind == QUOTA_CONNS ? l->conns_per_uid
					     : l->sessions_per_uid;
	uint64_t all = kind == QUOTA_MEMORY  ? l->memory
		       : kind == QUOTA_CONNS ? l->conns
					     : l->sessions;
	uint64_t total = kind == QUOTA_MEMORY  ? q->memory
			 : kind == QUOTA_CONNS ? q->conns
					       : q->sessions;
	struct quota_user *u = find_or_add(q, uid);
	uint64_t mine;

	if (!u) {
		set_err(err, errlen, "%s refused: out of memory", what);
		return -ENOMEM;
	}
	mine = held(u, kind);
	if (n > per || mine > per - n || n > all || total > all - n) {
		bool mine_hit = n > per || mine > per - n;
		int rc = refuse(kind, !mine_hit, n, mine_hit ? mine : total, mine_hit ? per : all,
				what, err, errlen);

		drop_if_empty(q, u);
		return rc;
	}
	add(q, u, kind, n, true);
	return 0;
}

void quota_give(struct quota *q, uid_t uid, enum quota_kind kind, uint64_t n)
{
	struct quota_user *u = find(q, uid);

	if (!u)
		return;
	add(q, u, kind, n, false);
	drop_if_empty(q, u);
}

struct quota_user quota_of(const struct quota *q, uid_t uid)
{
	const struct quota_user *u = find(q, uid);

	return u ? *u : (struct quota_user){.uid = uid};
}

void quota_free(struct quota *q)
{
	free(q->users);
	q->users = NULL;
	q->nusers = q->cap = 0;
}

int quota_check(const struct quota *q)
{
	uint64_t memory = 0;
	unsigned conns = 0, sessions = 0;

	for (size_t i = 0; i < q->nusers; i++) {
		memory += q->users[i].memory;
		conns += q->users[i].conns;
		sessions += q->users[i].sessions;
	}
	return memory == q->memory && conns == q->conns && sessions == q->sessions;
}
