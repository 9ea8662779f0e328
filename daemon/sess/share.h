/*
 * share.h — sessions that share one read and one copy per batch: a sweep's
 * or an ensemble's trainers over the same data in the same order
 * (OpenSession.share).
 *
 * A share is one producing session (struct sess, opened by the share, not
 * by a client) and its members, each a client's connection.  The producer
 * reads every batch once (CUDA: copies it once, into device slots every
 * member maps); its peer is the share's fan-out, which sends each pushed
 * batch to every member receiving the epoch, and each reply only to the
 * member that asked.  A slot is held once per member it went to, and goes
 * back to the producer when the last of them releases it.
 *
 * Pacing: the producer's governor counts the share's fastest member, and a
 * member may trail it by share_lag batches; past that it is dropped from
 * the share and gets the epoch's remaining batches from a session of its
 * own, with a log line.  A member that joins in the middle of an epoch
 * gets the share's batches from its next one, then, from its own session,
 * the ones it missed: every member sees each batch of the epoch once.
 * When the share starts an epoch, its batches are kept (held, not sent)
 * for the members still in the one before, until they start it too or
 * the others need the slots: trainers a few batches apart stay in step.
 * Sessions of its own are plain sessions the share opens for the member;
 * the member sees one session: the share renumbers what they send (seq,
 * slot, arena) into the member's numbering (share.c says how).
 *
 * Shares are per uid: a name is looked up among the caller's uid's shares
 * only, so another user's share is never joined.
 *
 * DESIGN: loop thread only.  The server owns the member (its connection's
 * `member`); the share lives while it has members.
 */
#ifndef PF_SHARE_H
#define PF_SHARE_H

#include <stdbool.h>
#include <stdint.h>

#include "prefetch.pb-c.h"

struct daemon;
struct peer;
struct sess;
struct share_member;

/* The largest member count of one share, and the arena ids at which a
 * member's own session's arenas start (the share's are below). */
#define SHARE_MAX_MEMBERS 64
#define SHARE_OWN_ARENA	  512

/* OpenSession with a share name from peer p: joins the uid's share of that
 * name, or opens it; *slot (NULL before) is the member.  Refusals are
 * replied to `id`.  < 0 only when the connection must close. */
int share_open(struct daemon *d, const struct peer *p, struct share_member **slot, uint64_t id,
	       const Pf__OpenSession *req);
int share_start_epoch(struct share_member *m, uint64_t id, const Pf__StartEpoch *req);
void share_ack(struct share_member *m, const Pf__Ack *req);
void share_release(struct share_member *m, const Pf__Release *req);
int share_abandon(struct share_member *m, uint64_t id, const Pf__Abandon *req);
void share_probe(struct share_member *m, const Pf__Probe *req);
/* The member's connection drained its output queue: batches may go on. */
void share_kick(struct share_member *m);
/* The producing session (SetDepth on the member's own session number). */
struct sess *share_sess(const struct share_member *m);
/* The member's connection is gone: its holds go back now. */
void share_leave(struct share_member *m);

/* StatusReply.shares of what uid `who` may see (all: every uid's): an
 * array of *n, each and its members owned by the array; free it with
 * share_status_free. */
Pf__ShareStatus **share_status(struct daemon *d, uint32_t who, bool all, size_t *n);
void share_status_free(Pf__ShareStatus **st, size_t n);

#endif
