/*
 * quota.h — what each user holds of the daemon, against its limits.
 *
 * Clients make the daemon hold host memory (session slots and their
 * bookkeeping, epoch orders, paced requests, frames received and replies
 * waiting to be sent), connections and sessions.  Every such holding is
 * taken here, by uid, before it is made, and given back when it goes:
 *   - memory: memory_budget for all users together, memory_per_uid for one;
 *   - connections: max_conns, max_conns_per_uid;
 *   - sessions: max_sessions, max_sessions_per_uid.
 * A take that would pass a limit is refused with a message naming the
 * limit, its key and what is held; nothing is taken then.  So one user
 * cannot take what the others need, and all of them together cannot take
 * the daemon's memory.
 *
 * DESIGN: loop thread only, no locks.  Users are few (those in allow_users
 * and allow_groups that are connected): a small array, searched linearly.
 * An entry whose holdings are all zero is dropped.
 */
#ifndef PF_QUOTA_H
#define PF_QUOTA_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

enum quota_kind { QUOTA_MEMORY, QUOTA_CONNS, QUOTA_SESSIONS, QUOTA_KINDS };

/* Indexed by kind: bytes for memory, counts otherwise. */
struct quota_limits {
	uint64_t all[QUOTA_KINDS];     /* memory_budget, max_conns, max_sessions */
	uint64_t per_uid[QUOTA_KINDS]; /* memory_per_uid, max_conns_per_uid, ... */
};

struct quota_user {
	uid_t uid;
	uint64_t held[QUOTA_KINDS];
};

struct quota {
	struct quota_limits lim;    /* the configuration's (a reload updates it) */
	uint64_t held[QUOTA_KINDS]; /* all users */
	struct quota_user *users;   /* owned */
	size_t nusers, cap;
};

/* Takes n of kind for uid (bytes for memory, a count otherwise).  0, or
 * -ENOMEM (memory) / -EMFILE (connections, sessions) with err saying which
 * limit, what `what` asked for, and what is held. */
int quota_take(struct quota *q, uid_t uid, enum quota_kind kind, uint64_t n, const char *what,
	       char *err, size_t errlen);
/* Gives back what a take of the same uid and kind took. */
void quota_give(struct quota *q, uid_t uid, enum quota_kind kind, uint64_t n);
void quota_free(struct quota *q);
/* The invariant: the totals are the sums over users.  1 when it holds. */
int quota_check(const struct quota *q);

#endif
