/*
 * status.h — the requests about the daemon rather than one's own session:
 * StatusRequest (every session, dataset and pool), PoolControl, and
 * SetDepth, which may name another user's session.  Part of the session
 * layer: the server hands them here decoded, with the asking peer, and the
 * replies go back through it (peer.h).
 *
 * DESIGN: loop thread only.  A reply borrows every string from the daemon's
 * state, which does not change while it is encoded.
 */
#ifndef PF_STATUS_H
#define PF_STATUS_H

#include <stdint.h>

struct daemon;
struct peer;
struct sess;
struct Pf__PoolControl;
struct Pf__SetDepth;

int status_reply(struct daemon *d, const struct peer *p, uint64_t id);
/* prefetchctl pool DATASET on|off|drop: root or the daemon's user only,
 * since pools serve every user's sessions of a dataset. */
int status_pool_control(struct daemon *d, const struct peer *p, uint64_t id,
			const struct Pf__PoolControl *req);
/* prefetchctl depth SESSION N|auto, or the client's own pf_set_depth
 * (session 0: `own`, the peer's session, may be NULL). */
int status_set_depth(struct daemon *d, const struct peer *p, struct sess *own, uint64_t id,
		     const struct Pf__SetDepth *req);

#endif
