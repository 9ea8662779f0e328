/*
 * pool.h — the VRAM sample pool: per (dataset, GPU), sample rows kept in
 * device memory so that later epochs are assembled on the device instead of
 * crossing PCIe again.
 *
 * A pool holds *records*, one per resident sample: every field's row of
 * that sample, field f at rec_off[f].  Records live in slabs (device
 * allocations of `pool_slab` bytes, exported to the sessions whose client
 * gathers its batches itself: PoolSlab), so memory is taken and given back
 * a slab at a time.  `loc` maps a sample to its record (entry id = slab <<
 * slab_shift | index), or to POOL_NONE / POOL_PENDING.
 *
 * A CUDA session plans each batch against its pool (pool_plan_batch):
 *   - a hit is a resident sample: the gather kernel (gpu_gather) copies its
 *     record into the batch's slot, on the device;
 *   - a miss is read by the readers into the ring slot's staged rows and
 *     copied over PCIe; if the budget has room it is also admitted: a
 *     record is reserved now (POOL_PENDING) and published by pool_plan_done
 *     once the batch's gather has completed, so no batch ever reads a
 *     record before it has been written;
 *   - samples missed while there was no room (before the first probe, or a
 *     full pool) are remembered and back-filled: later batches stage a few
 *     of them as admit-only rows when room appears, so a dataset that fits
 *     is resident by the end of its first epoch even though the budget is
 *     only known after the trainer's first step.
 * Every slab a batch reads or writes is pinned until the batch's copy job
 * is back: a slab dropped meanwhile leaves the index at once (new batches
 * miss) and is freed when its last pin goes.
 *
 * Budget: the honest probe's free memory minus the reserve and minus the
 * slots the session's target still needs (sess_probe computes it), capped
 * by `pool_bytes`.  Under pressure (a probe below what the pool holds, or a
 * device allocation failing once the target is at its floor) the pool
 * gives back whole slabs, newest first.  A pool lives as long as the
 * daemon.  When its last session goes it *lingers* for pool_linger seconds
 * (pool_put): its slabs and index stay, so the next session on the same
 * dataset and GPU (a restarted trainer, a new Loader) hits from its first
 * batch.  A lingering pool never grows, gives slabs back (newest first)
 * whenever the daemon's own probe of the GPU finds free memory under the
 * reserve (pool_linger_reclaim, called by linger.c), and gives everything
 * back when its time is up (pool_linger_expire).
 *
 * The pools of a daemon live in one struct pool_set with the settings they
 * read (pool_slab, pool_bytes), which the daemon updates on a reload.  The
 * pool layer knows no daemon and no protocol: whether a dataset's pool is
 * on is the caller's to say, and status and control messages are
 * translated above it (status.c).
 *
 * DESIGN: loop thread only, no locks.  Slab allocation and release run on
 * the GPU's transfer thread (xfer.h) as jobs; the gather runs on its copy
 * stream.
 */
#ifndef PF_POOL_H
#define PF_POOL_H

#include <stdbool.h>
#include <stdint.h>

#include "gpu/gpu.h"

struct dataset;
struct xfer;
struct xfer_job;

#define POOL_NONE    UINT32_MAX	      /* loc: not resident */
#define POOL_PENDING (UINT32_MAX - 1) /* loc: admitted by a batch in flight */

struct pool_slab {
	struct gpu_mem mem; /* owned: pool_config.slab_ipc, zeroed when not allocated */
	uint32_t gen;	    /* this allocation's number in the pool (PoolSlab.gen), > 0 */
	uint32_t used;	    /* entries handed out, 0..per_slab */
	uint32_t pins;	    /* batches in flight that read or write it */
	uint64_t stamp;	    /* the last plan that pinned it (pins once per plan) */
	bool live;	    /* in the index: may be hit and handed out */
	bool dying;	    /* dropped while pinned: freed at the last unpin */
};

/* One batch's use of the pool, kept in its session's slot from
 * pool_plan_batch until pool_plan_done. */
struct pool_plan {
	bool active;	  /* planned against the pool (else the plain H2D path) */
	uint32_t count;	  /* rows of the batch */
	uint32_t nmiss;	  /* staged rows 0..nmiss-1 are the batch's misses */
	uint32_t nstaged; /* misses + admit-only rows */
	uint64_t *staged; /* owned, cap: the sample of each staged row */
	uint32_t *admit;  /* owned, cap: the entry each staged row fills, or POOL_NONE */
	uint32_t cap;	  /* staged rows at most */
	uint32_t *pinned; /* owned: slabs pinned, each once */
	uint32_t npinned, pin_cap;
	uint32_t hits;
	uint64_t stamp;	  /* unique per planning, for pinning each slab once */
	bool table;	  /* planned in table mode: desc holds the picks */
	bool ids;	  /* planned in entry mode: desc holds entry ids (client gather) */
	bool published;	  /* its admissions are settled (pool_plan_publish) */
	bool read_failed; /* its rows could not be read: not back-filled */
};

/* What pools read of the daemon's configuration. */
struct pool_config {
	uint64_t slab_bytes; /* pool_slab: unit of allocation and of release */
	uint64_t cap_bytes;  /* pool_bytes: most one pool may hold, 0: the budget only */
	/* How slabs are allocated: exportable (GPU_IPC_FD, the daemon's
	 * `ipc`, or GPU_IPC_LEGACY), so that clients gather from them in their
	 * own context, or GPU_IPC_NONE (the daemon gathers for everyone). */
	enum gpu_ipc slab_ipc;
};

/* Every pool of a daemon, and their settings (updated by a reload). */
struct pool_set {
	struct pool *head; /* owned */
	struct pool_config cfg;
	/* Called (loop thread) when an exported slab's memory is given back,
	 * after every batch that read it was done: the sessions it was sent
	 * to tell their clients to unmap it.  NULL: nobody to tell. */
	void (*slab_gone)(void *arg, const struct pool *p, uint32_t slab, uint32_t gen);
	void *gone_arg;
};

enum pool_action { POOL_ON, POOL_OFF, POOL_DROP };

struct pool {
	struct pool *next;	  /* set->head */
	struct pool_set *set;	  /* borrowed: the set that owns it */
	const struct dataset *ds; /* borrowed */
	int gpu;
	struct xfer *xfer; /* borrowed: the GPU's transfer thread */
	bool enabled;
	uint32_t nfields;
	uint32_t rec_off[GPU_GATHER_MAX_FIELDS];
	uint32_t row_bytes[GPU_GATHER_MAX_FIELDS];
	uint64_t rec_stride; /* bytes per record */
	uint64_t slab_bytes;
	uint32_t per_slab;	 /* records per slab */
	uint32_t slab_shift;	 /* entry id = slab << slab_shift | index */
	struct pool_slab *slabs; /* owned, nslabs (live, dying or free) */
	uint32_t nslabs;	 /* array length */
	uint32_t nlive;		 /* live slabs */
	uint64_t bytes;		 /* device memory of the live slabs */
	uint64_t room;		 /* entries not yet handed out in live slabs */
	uint32_t fill;		 /* a live slab with room, when room > 0 (a hint) */
	bool want_room;		 /* a miss found no entry since the last slab came */
	uint64_t admits;	 /* rows admitted since the last slab was asked for */
	uint64_t pending;	 /* entries reserved by batches in flight */
	/* The device table of every sample's record (gpu_gather's table
	 * mode), built once the pool holds every sample: batches then need no
	 * lookup per row on the loop thread.  Any slab leaving makes it
	 * stale; it is built again when the pool is whole again. */
	struct gpu_mem table;	/* owned: GPU_IPC_NONE, num_samples addresses */
	uint64_t *table_host;	/* owned while an upload is out */
	bool table_pending;	/* an allocation or upload is on the transfer thread */
	bool table_valid;	/* batches may use it */
	uint64_t stamps;	/* plans made, for pool_plan.stamp */
	uint32_t gens;		/* slab allocations made, for pool_slab.gen */
	uint32_t *loc;		/* owned, ds->num_samples entries */
	uint64_t *owner;	/* owned, nslabs << slab_shift: sample of each entry */
	uint64_t *missed;	/* owned bitmap: samples to back-fill */
	uint64_t nmissed, scan; /* bits set; back-fill cursor */
	uint64_t rows;		/* resident samples */
	uint64_t budget;	/* bytes the pool may hold */
	bool budget_known;	/* a probe has sized it */
	char budget_reason[160];
	bool slab_pending; /* an allocation is on the transfer thread */
	unsigned sessions; /* sessions using it */
	/* Lingering: sessions is 0 and slabs are live.  Since idle_ns (0:
	 * not lingering), for linger_s. */
	uint64_t idle_ns;
	double linger_s;
	char linger_reason[160]; /* what the lingering pool last gave back and why */
	/* Of those, the ones whose batches the daemon gathers (their clients
	 * cannot): only they use the record table, so it is built for them. */
	unsigned daemon_gathers;
	/* Figures for status. */
	uint64_t epoch;		/* the epoch its sessions started last */
	uint64_t epoch_session; /* the session that started it */
	uint64_t hits_cur, lookups_cur, hits_last, lookups_last;
	bool have_last;
	uint64_t hits, lookups, saved, slabs_dropped, slabs_made;
};

/* The pool of (ds, gpu), made on first use (on or off as `enabled` says),
 * with one more session on it.  NULL when the dataset cannot be pooled (too
 * many fields; why says so) or out of memory. */
struct pool *pool_get(struct pool_set *set, const struct dataset *ds, int gpu, struct xfer *x,
		      bool enabled, char *why, size_t whylen);
/* A session leaves.  After the last one the pool lingers linger_s
 * seconds holding its slabs (true), or gives them back at once (false:
 * linger_s is 0, or it is off or empty). */
bool pool_put(struct pool *p, double linger_s);
/* Whether p lingers (no session, slabs held). */
bool pool_lingering(const struct pool *p);
/* Seconds p has lingered and has left (0 when it does not linger). */
double pool_linger_age(const struct pool *p, uint64_t now_ns);
double pool_linger_left(const struct pool *p, uint64_t now_ns);
/* Gives back at least `bytes` of the lingering pools on gpu, newest slabs
 * first, and says why in each one's status.  Returns the bytes given. */
uint64_t pool_linger_reclaim(struct pool_set *set, int gpu, uint64_t bytes, const char *why);
/* Empties every lingering pool whose time is up.  Returns the seconds
 * until the next one's is (-1: none lingers). */
double pool_linger_expire(struct pool_set *set, uint64_t now_ns);
/* Frees the pools of a dataset a reload retired, once no session and no
 * transfer job uses them.  True when none is left. */
bool pool_forget(struct pool_set *set, const struct dataset *ds);
/* Frees every pool (daemon shutdown, after the sessions and after
 * xfer_stop: a slab allocation still on its way would land in a freed
 * pool). */
void pool_destroy_all(struct pool_set *set);

/* Planning: plan->cap must be at least count.  picks are the batch's picks
 * in order (sample = pick mod N).  Writes desc[0..count) (a record's
 * device address, or with ids its entry id, else GPU_GATHER_STAGED | k),
 * admit_addr[k] for the staged rows, and fills plan.  Up to max_extra
 * admit-only rows are added when room allows.  ids: the batch is
 * gathered by the client (entry mode, never table mode): every slab a row
 * reads is in plan->pinned, for the session to export. */
void pool_plan_batch(struct pool *p, const uint64_t *picks, uint32_t count, uint32_t max_extra,
		     bool ids, struct pool_plan *plan, uint64_t *restrict desc,
		     uint64_t *admit_addr);
/* The batch's admissions have been written (ok) or will not be: publishes
 * or cancels them.  The slabs stay pinned: a client gather may still read
 * them until the batch is released. */
void pool_plan_publish(struct pool *p, struct pool_plan *plan, bool ok);
/* The batch is done with the pool: its copy (and gather) is back and, for
 * a client gather, the client released it; or it was dropped before (ok
 * false).  Publishes what pool_plan_publish has not, then unpins. */
void pool_plan_done(struct pool *p, struct pool_plan *plan, bool ok);
/* Admit-only rows k in [first, first + n) of an in-flight plan could not be
 * read: they are not admitted (nor back-filled again), and admit_addr[k]
 * is zeroed so the gather skips them; the batch itself is not at fault. */
void pool_plan_drop_rows(struct pool *p, struct pool_plan *plan, uint32_t first, uint32_t n,
			 uint64_t *admit_addr);
int pool_plan_alloc(struct pool_plan *plan, uint32_t cap);
void pool_plan_free(struct pool_plan *plan);

/* Session `session` started epoch `epoch`: the hit-rate figures roll over
 * when it is the pool's newest, or the session is not the one that started
 * the last (a new trainer numbers its epochs afresh). */
void pool_new_epoch(struct pool *p, uint64_t session, uint64_t epoch);
/* Sets the budget (capped by pool_bytes) and gives back slabs above it. */
void pool_set_budget(struct pool *p, uint64_t budget, const char *why);
/* Device memory is short and the target is at its floor: gives back one
 * slab.  False when there was none. */
bool pool_give_slab(struct pool *p, const char *why);
/* The device address of the record table when batches may use it, else 0
 * (table mode: see gpu_gather). */
uint64_t pool_table(const struct pool *p);
/* Device memory the pool holds (live slabs). */
uint64_t pool_bytes(const struct pool *p);

/* On: the pool may fill again.  Off: it stops being used and gives its
 * memory back (a reload, or prefetchctl).  Returns the bytes freed. */
uint64_t pool_set_enabled(struct pool *p, bool on);
/* prefetchctl pool DATASET on|off|drop, on every GPU's pool of dataset.
 * Returns pools reached (0: none yet) or -EINVAL for an unknown action. */
int pool_control(struct pool_set *set, const char *dataset, enum pool_action action,
		 uint64_t *bytes_freed);
/* Pools of gpu in use (a session on them, and on): they share its memory. */
unsigned pool_active_on(const struct pool_set *set, int gpu);

/* Invariants, for asserts and tests. */
bool pool_check(const struct pool *p);

#endif
