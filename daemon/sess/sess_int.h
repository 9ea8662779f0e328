/*
 * sess_int.h — what the files of a session share.  Not for anyone else:
 * sess.h is the session layer's interface.
 *
 * The files are layers, and a file calls only the files below it (any of
 * them, not only the next):
 *
 *   sess.c        its life: opening, detaching, freeing
 *   sess_epoch.c  the requests: epochs, paced loads, acks, releases, probes
 *   sess_pump.c   the slot state machine and in-order delivery
 *   sess_cuda.c   the CUDA half: device slots, copies, pool sizing
 *   sess_base.c   what they all use: error replies, the quota, error batches
 *
 * What a lower file must reach above it, it reaches through a pointer that
 * sess_open sets once: the CUDA half pumps its session through
 * s->cuda.pump (a copy or an allocation back, an OOM back-off's end), and
 * the last job of a dead session to come back, in whichever file, frees it
 * through s->free_fn (sess_free, in sess.c), which sess_maybe_free calls.
 * The ring wakes the pump through ring.wake, which sess_open sets as well.
 * So no file names a function of a file above it.
 *
 * DESIGN: loop thread only, like everything a session does.
 */
#ifndef PF_SESS_INT_H
#define PF_SESS_INT_H

#include <stdlib.h>
#include <string.h>

#include "sess/sess.h"

/* ---- sess_epoch.c ---- */

/* The order built ahead came back: its quota shrinks to what it keeps. */
void sess_ahead_back(struct sess *s);

/* Stops the current epoch: READY slots are free again at once, FILLING ones
 * become ORPHAN and come free when their reader is done, paced requests go,
 * and an order still being built is thrown away when it is back. */
void sess_stop_epoch(struct sess *s);
/* The running epoch's block cache goes (a new epoch, the session's end);
 * reader jobs still out keep it until they are back. */
void sess_drop_blocks(struct sess *s, bool quota);
/* Paced requests not yet sent go (an epoch ends or the session does). */
void sess_drop_requests(struct sess *s);

/* ---- sess_pump.c ---- */

/* Sends every READY batch whose turn has come, then starts fills while the
 * governor allows and a slot (and, for CUDA sessions, a ring slot) is free.
 * Runs after every event that can unblock it. */
void sess_pump(struct sess *s);
/* The bytes of the frame of a full batch's BatchReady in epoch (of
 * nbatches), at most, for a client of picks_le or picks_le32; 0 for the
 * others, whose frames vary in size with their picks. */
size_t sess_batch_frame_bytes(const struct sess *s, uint64_t epoch, uint64_t nbatches);
/* Slot sl's batch will not be sent (its epoch stopped or was cut short): a
 * READY slot is free again at once, a FILLING or COPYING one becomes ORPHAN
 * and comes free when its job is back. */
void sess_drop_slot(struct sess *s, struct slot *sl);

/* ---- sess_cuda.c ---- */

/* The daemon's ordinal of the GPU req asks for ("cuda:N", or its PCI bus
 * id), or -errno with err saying why. */
int sess_cuda_pick_gpu(struct daemon *d, const Pf__OpenSession *req, int *gpu, char *err,
		       size_t errlen);
/* A CUDA session's transfer thread, pool, ring slots and back-off timer.
 * Device slots come later, an arena at a time (sess_cuda_grow). */
int sess_cuda_setup(struct sess *s, const Pf__OpenSession *req, char *err, size_t errlen);
/* Gives back the ring slots and device arenas (every job is back). */
void sess_cuda_release(struct sess *s);
/* An epoch starts: a client that gathers gets the slabs the pool holds
 * that it does not have yet. */
void sess_cuda_push_pool(struct sess *s);
/* A batch its client gathers is about to be announced: exports the slabs
 * it reads that the client does not have yet (PoolSlab), and fills msg's
 * gather fields (staged_off: room for the dataset's fields). */
int sess_cuda_gather_msg(struct sess *s, struct slot *sl, Pf__BatchReady *msg,
			 uint64_t *staged_off);
/* Announces device arena a to `to` (its fd dup'd for the send). */
int sess_cuda_push_arena(struct sess *s, uint32_t a, const struct peer *to);
/* The slot's batch is done with the pool (released, or dropped unsent). */
void sess_cuda_unpin(struct sess *s, struct slot *sl);
/* The pump is short of slots: ask for another device arena if none is on
 * the way and the target wants more. */
void sess_cuda_grow(struct sess *s);
/* Batch sl is read: queue its copy (or gather) to its device slot. */
void sess_cuda_copy(struct sess *s, struct slot *sl);
/* The honest probe: size the target and the pool from the trainer's free
 * device memory. */
void sess_cuda_probe(struct sess *s, uint64_t free_bytes, uint64_t total_bytes);

/* ---- sess_base.c ---- */

/* Takes n bytes of memory quota for the session's uid, held in *held (one
 * of the session's counters).  0 or -ENOMEM with err naming `what`. */
int sess_take(struct sess *s, uint64_t *held, uint64_t n, const char *what, char *err,
	      size_t errlen);
/* Gives back n of what *held holds (all of it at most). */
void sess_give(struct sess *s, uint64_t *held, uint64_t n);
/* A dead session whose every job is back is freed now (s->free_fn). */
void sess_maybe_free(struct sess *s);
/* Frees a paced request and gives its quota back. */
void sess_req_clear(struct sess *s, struct sess_req *r);
/* Records the error of the batch in sl (its epoch and seq set): the message
 * names the batch, is logged unless the batch was abandoned, and is what
 * the trainer's pf_errmsg will say when the error batch is sent. */
void sess_slot_error(struct sess *s, struct slot *sl, int rc, const char *why);
/* Batch next_fill becomes an error batch in slot sl, READY at once: a
 * paced request that cannot be served, or a batch whose device slot never
 * came.  Nothing is read. */
void sess_fill_error(struct sess *s, struct slot *sl, int rc, const char *why);

/* Paced epochs: the request that is batch seq. */
static inline struct sess_req *sess_paced_req(const struct sess *s, uint64_t seq)
{
	return &s->reqs[seq % SESS_PACED_MAX];
}
/* The picks of batch seq: batch_size, or fewer for a short last batch or a
 * paced request. */
static inline uint32_t sess_batch_count(const struct sess *s, uint64_t seq)
{
	uint64_t first = seq * s->batch_size;
	uint64_t left = s->npicks - first;

	if (s->paced)
		return sess_paced_req(s, seq)->count;
	return left < s->batch_size ? (uint32_t)left : s->batch_size;
}
/* Batch seq's picks (borrowed: valid until it is sent or the epoch ends). */
static inline const uint64_t *sess_batch_picks(const struct sess *s, uint64_t seq)
{
	if (s->paced)
		return sess_paced_req(s, seq)->picks;
	return s->picks + seq * s->batch_size;
}

#endif
