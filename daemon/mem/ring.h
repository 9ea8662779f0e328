/*
 * daemon/mem/ — host memory the daemon fills for others to read: the pinned
 * reader ring and the CUDA sessions' shares of it (ring.c), and host
 * arenas, the memfd slots of host and client-copy sessions (arena.c).  The
 * loop thread hands pieces out and takes them back; reader threads write
 * into them; the ring is page-locked through gpu/.  Calls base/ and gpu/.
 *
 * ring.h — the pinned reader ring: one block of host memory, registered
 * with CUDA once at startup, from which CUDA sessions take their staging
 * slots.
 *
 * Readers write a batch into a ring slot; the GPU's transfer thread copies
 * it from there to a device slot with no intermediate copy (the memory is
 * page-locked, so the DMA engine reads it directly).  The ring is bounded
 * (`ring_bytes`), so pinned memory never grows with the number of sessions
 * or the depth of their pipelines.
 *
 * A session's lease (struct ring_lease) is a *share* of the ring, not a
 * range of it: a ring slot is a piece of the ring taken when the session
 * hands a batch to the readers and given back when its copy has retired
 * (a few milliseconds later), so a session holds ring memory only while
 * its batches are on their way.  What a lease keeps for its whole life is
 * a reservation of `min` slots, counted against the ring when the session
 * opens: a session opens while the ring's unreserved bytes cover its
 * minimum, whatever the pieces in use look like (a range per session, as
 * before, let seven sessions take the ring in pieces and refused the
 * eighth).  Each lease may hold up to `cap` slots at once; caps are fair
 * shares (ring_rebalance): the ring is split evenly between the GPUs that
 * have sessions, a GPU's part evenly between its sessions, and what a lease
 * cannot use (its `want` is lower) goes to the others.  A lease never gets
 * less than its `min`, so the caps may add up to more than the ring: then
 * a slot waits for another to come back, which it always does.
 *
 * A slot that finds no piece (the ring full, or free bytes only in pieces
 * too small) waits in a FIFO, and while anyone waits, nobody jumps the
 * queue: the ring drains until the first waiter fits, so a session of big
 * batches is never starved by sessions of small ones.  A piece given back
 * hands the *turn* to the first waiter and wakes its owner (ring.wake); the
 * owner either takes its slot or passes the turn on (ring_turn_pass).
 *
 * DESIGN: ring_init and ring_destroy run on the main thread before and after
 * the loop; everything else on the loop thread only.  No locks: the free
 * list, the leases and the wait queue are the loop thread's.  Reader and
 * transfer threads only touch the bytes of slots their session holds.
 */
#ifndef PF_RING_H
#define PF_RING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Ranges start at this alignment (a page: a reader's pread lands aligned). */
#define RING_ALIGN 4096u
/* A lease's slot that holds no piece of the ring. */
#define RING_NO_PIECE UINT64_MAX

struct ring_range {
	uint64_t off, bytes;
	struct ring_range *next;
};

struct ring_lease;

struct ring {
	uint8_t *base;				  /* owned mapping, NULL when there is no ring */
	uint64_t bytes;				  /* size of the mapping */
	uint64_t used;				  /* bytes in pieces taken */
	uint64_t reserved;			  /* sum of the leases' min * stride: <= bytes */
	bool registered;			  /* page-locked through gpu_host_register */
	struct ring_range *free;		  /* owned: free ranges sorted by offset */
	struct ring_lease *leases;		  /* borrowed: every lease taken */
	struct ring_lease *wait_head, *wait_tail; /* borrowed: FIFO of waiters */
	struct ring_lease *turn; /* borrowed: woken waiter, the only one that may take */
	uint64_t waits;		 /* times a slot had to queue (status) */
	/* Called (loop thread) when a lease's owner may take a slot it waited
	 * for: the owner tries again soon or calls ring_turn_pass.  Must not
	 * call back into the ring at once (defer: the pump's idle turn). */
	void (*wake)(void *owner);
};

/* Maps `bytes` (rounded up to 2 MiB) and registers them with CUDA.  0 or
 * -errno with err saying why; r is then empty and every ring_take fails. */
int ring_init(struct ring *r, uint64_t bytes, char *err, size_t errlen);
/* Unregisters and unmaps.  Every range must have been given back. */
void ring_destroy(struct ring *r);
/* Takes `bytes` (rounded up to RING_ALIGN), first fit.  Returns 0 and the
 * range's offset, or -ENOSPC when no free range is large enough. */
int ring_take(struct ring *r, uint64_t bytes, uint64_t *off);
/* Gives back a range that ring_take returned, with the same size. */
void ring_give(struct ring *r, uint64_t off, uint64_t bytes);
/* The largest range ring_take could return now (for messages). */
uint64_t ring_largest_free(const struct ring *r);

/* A session's share of the ring: up to cap slots of stride bytes at once,
 * min of them reserved. */
struct ring_lease {
	struct ring *ring; /* borrowed: NULL while the lease is not taken */
	void *owner;	   /* borrowed: passed to ring.wake */
	int gpu;	   /* shares are split by GPU first */
	uint64_t stride;
	uint32_t nslots;	      /* slot numbers 0..nslots-1: the most it will ever want */
	uint32_t min;		      /* reserved; cap never goes below it */
	uint32_t cap;		      /* slots it may hold now (ring_rebalance) */
	uint32_t held;		      /* slots holding a piece */
	uint64_t *off;		      /* owned, nslots: each slot's piece, or RING_NO_PIECE */
	bool queued;		      /* in the ring's wait queue */
	struct ring_lease *next;      /* in ring.leases */
	struct ring_lease *next_wait; /* in the wait queue */
};

/* Takes a share of up to want slots of stride bytes, min of them reserved
 * (1 <= min <= want).  0, or -ENOSPC when the ring's unreserved bytes do
 * not cover min slots (err says what the ring holds and for whom), or
 * -ENOMEM.  The other leases' caps shrink to make room. */
int ring_lease_take(struct ring *r, struct ring_lease *l, void *owner, int gpu, uint32_t want,
		    uint32_t min, uint64_t stride, char *err, size_t errlen);
/* Gives the share back, and any piece it still holds (a zeroed lease:
 * nothing).  The others' caps grow; a waiter is woken. */
void ring_lease_give(struct ring *r, struct ring_lease *l);
/* A slot of the lease that now holds a piece of the ring, or -1: the lease
 * holds its cap, or it waits in the queue (its owner is woken when it may
 * try again). */
int32_t ring_slot_get(struct ring_lease *l);
/* Slot i's piece goes back to the ring (-1: nothing); the first waiter
 * gets the turn. */
void ring_slot_put(struct ring_lease *l, int32_t i);
/* l's owner was woken (ring.wake) and took nothing: the turn, if l has it,
 * goes to the next waiter, and l leaves the queue. */
void ring_turn_pass(struct ring_lease *l);
/* l's owner will ask for no more slots (its session is closing): l leaves
 * the queue and passes the turn on, so that nobody waits for it. */
void ring_wait_cancel(struct ring_lease *l);
/* Recomputes every lease's cap (fair shares; see the top of this file). */
void ring_rebalance(struct ring *r);
/* The ring's invariants (bytes used = pieces held, reserved = sum of the
 * leases' minimums, the queue and turn consistent); 0 or -EINVAL. */
int ring_check(const struct ring *r);
static inline uint8_t *ring_slot_mem(const struct ring_lease *l, int32_t i)
{
	return l->ring->base + l->off[i];
}

#endif
