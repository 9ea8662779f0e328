/*
 * share_int.h — what the files of shares share: the share and its
 * members (share.c makes and runs them, share_status.c describes them).
 * Not for anyone else: share.h is the interface.
 *
 * DESIGN: loop thread only.
 */
#ifndef PF_SHARE_INT_H
#define PF_SHARE_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "sess/peer.h"
#include "sess/sess.h"
#include "sess/share.h"

struct share_member {
	struct share *sh;	 /* borrowed: its share, alive while it has members */
	const struct peer *peer; /* borrowed: the member's connection */
	uint64_t id;		 /* its session number (status, SessionOpened) */
	uint8_t *holds;		 /* owned: 1 for each producer slot it holds */
	uint32_t nheld;
	bool counted; /* holds one of its uid's sessions (quota) */
	/* Its epoch, in its own numbering (share.c's header). */
	bool had_epoch;
	uint64_t epoch;
	uint64_t start;	    /* its first seq: StartEpoch.start_batch */
	uint64_t total;	    /* batches of its epoch */
	bool in_group;	    /* the producer's batches of this epoch come to it */
	uint64_t grp_first; /* the producer's seq of the first it got */
	uint64_t grp_sent;  /* producer batches sent to it this epoch */
	uint64_t acked;	    /* batches it took this epoch */
	/* How far ahead of the share's fastest it joined: a member that joins
	 * late starts at the share's next batch, ahead of the others by what
	 * they have queued, which is not their lag. */
	uint64_t bias;
	/* How far behind the fastest it joined, replaying what the others
	 * still held (or what the share kept for it: expect): it is let trail
	 * by this much more than share_lag. */
	uint64_t slack;
	/* The share started the epoch after this member's while the member was
	 * still in its own: the batches it will want are held for it, not
	 * sent, until it starts that epoch too, or until the others need the
	 * slots (judge), so that a member that finished an epoch a little
	 * after the others gets the next one from the share whole. */
	bool expect;
	uint64_t expect_epoch;	   /* the producer's epoch kept for it */
	uint64_t behind_since_ns;  /* behind by more than share_lag since, or 0 */
	uint64_t miss_lo, miss_hi; /* producer seqs it joined too late for */
	/* Its own session: opened the first time it needs one, kept. */
	struct sess *own;
	struct peer own_peer; /* own's peer: renumbers, then sends to peer */
	bool own_live;	      /* own serves this epoch's rest */
	uint64_t own_shift;   /* member seq = own seq + own_shift */
	uint64_t own_sent;    /* own's batches sent this epoch */
	bool own_started;     /* own's EpochStarted came (own_batches: its count) */
	uint64_t own_batches;
	uint64_t dropped; /* times it trailed by more than share_lag */
	struct share_member *next;
};

struct share {
	struct share *next; /* d->shares */
	struct daemon *d;
	char name[64];
	uid_t uid;
	/* What every member must ask for alike (OpenSession), owned strings. */
	char *dataset, *device;
	uint32_t batch_size, augment;
	bool drop_last, picks_le, narrow;
	struct sess *src; /* the producer; owned: detached when the last member goes */
	struct peer fan;  /* src's peer */
	struct share_member *members;
	uint32_t nmembers;
	uint32_t nslots;   /* src's: G */
	uint16_t *holders; /* owned, nslots */
	/* The member whose request is being handled: replies go to it.  While
	 * the share opens, opener: the peer that asked for it. */
	struct share_member *asker;
	const struct peer *opener;
	/* Batches that others still hold go again to a member that joins
	 * (replay_to) through `again`. */
	struct peer again;
	struct share_member *replay_to;
	/* The producer's epoch, as its first member asked for it. */
	Pf__StartEpoch *spec; /* owned copy (indices included) */
	uint64_t samples;     /* EpochStarted.samples */
	bool got_started;     /* the producer's EpochStarted came (started: its count) */
	uint64_t started;
	uint64_t paced;	  /* acks handed to the producer this epoch */
	uv_check_t judge; /* judge(): lags, once a turn */
};

static inline bool receiving(const struct share *sh, const struct share_member *m)
{
	return m->in_group && m->had_epoch && m->epoch == sh->src->epoch;
}

/* The producer's seq after the last batch m has taken of the share's,
 * less the bias it joined with. */
static inline uint64_t taken_pos(const struct share_member *m)
{
	return m->grp_first + (m->acked < m->grp_sent ? m->acked : m->grp_sent) - m->bias;
}

/* The fastest receiving member's taken_pos (0: none receives). */
static inline uint64_t lead_pos(const struct share *sh)
{
	uint64_t lead = 0;

	for (const struct share_member *m = sh->members; m; m = m->next)
		if (receiving(sh, m) && taken_pos(m) > lead)
			lead = taken_pos(m);
	return lead;
}

static inline int send_to(const struct share_member *m, const Pf__Envelope *env, int fd)
{
	return peer_send(m->peer, env, fd);
}

/* share_own.c: m's EpochEnd (it leaves the share's epoch); its own session;
 * and the rest of
 * m's epoch from its own session, opened the first time: the producer's
 * batches [lo1, hi1) and then [lo2, hi2) (none: its EpochEnd). */
int share_send_end(struct share_member *m);
/* m's own session, opened now if it has none: 0, or -EIO (the Error went
 * to the member). */
int share_open_own(struct share_member *m);
void share_go_alone(struct share_member *m, uint64_t lo1, uint64_t hi1, uint64_t lo2, uint64_t hi2);

/* share_key.c: the first difference between what req asks and share sh
 * (an open), or between two starts of one epoch, written to why; NULL
 * when there is none. */
const char *share_open_differs(const struct share *sh, const Pf__OpenSession *req, char *why,
			       size_t len);
const char *share_start_differs(const Pf__StartEpoch *a, const Pf__StartEpoch *b, char *why,
				size_t len);

#endif
