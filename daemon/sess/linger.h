/*
 * linger.h — the daemon's side of lingering VRAM pools (pool.h): a pool
 * whose last session left keeps its slabs for pool_linger seconds, so the
 * next trainer on the same dataset and GPU starts at pool speed.  Safety
 * comes first: while a pool lingers, the daemon probes the GPU's free
 * memory itself (no trainer is there to do it) every probe_interval, at
 * once when a session opens on that GPU, and whenever a trainer's own
 * probe arrives; any reading under the reserve makes lingering pools give
 * slabs back, newest first, until it would not be.  When its time is up a
 * lingering pool gives everything back.
 *
 * DESIGN: loop thread only.  The probes are XFER_MEMINFO jobs on the GPU's
 * transfer thread (the loop makes no CUDA call), read after every free
 * queued before them; one per GPU at a time.  One timer serves every GPU:
 * it fires at the next probe or the next expiry, whichever comes first,
 * and stops when nothing lingers.
 */
#ifndef PF_LINGER_H
#define PF_LINGER_H

#include <stdint.h>

struct daemon;

/* The timer and the per-GPU probe state (startup, after the GPUs are
 * known).  0 or -ENOMEM. */
int linger_init(struct daemon *d);
/* Stops the timer (shutdown); probes still out are dropped when they
 * come back. */
void linger_stop(struct daemon *d);
/* A pool started lingering on gpu, or a session opened there: probe it
 * now, and keep the timer going while anything lingers. */
void linger_kick(struct daemon *d, int gpu);
/* A trainer's probe of gpu read free_bytes of total_bytes, and its session
 * still wants need bytes for slots: lingering pools give back what the
 * reading is short of the reserve plus need. */
void linger_trainer_probe(struct daemon *d, int gpu, uint64_t free_bytes, uint64_t total_bytes,
			  uint64_t need);
/* Seconds since the daemon last probed gpu for lingering pools (-1: never). */
double linger_probe_age(const struct daemon *d, int gpu);

#endif
