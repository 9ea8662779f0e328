/*
 * daemon/conf/ — the configuration file: its keys, their defaults and
 * ranges, and its parsing (config.c, config_keys.c).  Loop thread, at
 * startup and reload.  Calls base/ only; data/ and later folders read its
 * declarations.
 *
 * config.h — the daemon's INI configuration file, parsed with inih.
 *
 *   [daemon]
 *   socket = /run/prefetchd/prefetchd.sock
 *   socket_mode = 0660
 *   socket_group = prefetch         ; group owning the socket (optional)
 *   readers = auto                  ; reader threads (auto: usable CPUs less a fifth, >= 2)
 *   ring_bytes = auto               ; pinned reader ring (CUDA sessions; auto:
 *                                   ; 1/256 of the memory, 256M .. 1G)
 *   fill_bytes = auto               ; host slots all sessions may fill ahead (auto:
 *                                   ; a quarter of the L3 cache, 32M at least)
 *   arena_bytes = 256M              ; largest single arena
 *   session_bytes = 2G              ; most slot memory one session may hold
 *   max_sessions = 64
 *   max_sessions_per_uid = 16
 *   max_conns = 256
 *   max_conns_per_uid = 64
 *   memory_budget = auto            ; all clients' host memory (auto: half of RAM
 *                                   ; or of the cgroup's limit when lower)
 *   memory_per_uid = auto           ; one uid's share (auto: half the budget)
 *   idle_timeout = 60               ; s: a connection with no session, silent
 *   frame_timeout = 10              ; s: a frame begun must be whole within
 *   depth_limit = 256               ; the largest max_depth a client may ask
 *   max_epoch_picks = 2G            ; most picks in one epoch's order (N x augment);
 *                                   ; each costs the daemon 8 bytes
 *   max_frame = 16M
 *   allow_users = root, alice, 1001 ; names or uids; * = anyone
 *   allow_groups = prefetch         ; names or gids
 *   depth = 4                       ; default target when not sized by a probe
 *   max_depth = 16                  ; default upper bound of a session's target
 *   share_lag = 4                   ; batches a shared session may fall behind its
 *                                   ; group's fastest before it goes on alone
 *   ipc = fd                        ; fd | legacy (CUDA arenas)
 *   read = mmap                     ; mmap | pread | direct: how readers gather rows
 *   reserve = 10%                   ; device memory left free (at least reserve_min)
 *   reserve_min = 2G
 *   probe_interval = 5              ; seconds between honest-depth probes
 *   pool = on                       ; VRAM sample pool for CUDA sessions: on | off
 *   pool_bytes = auto               ; cap of each pool (auto: the probe's budget only)
 *   pool_slab = 256M                ; the pool's unit of allocation and of release
 *   pool_linger = 300               ; s a pool stays resident after its last session
 *                                   ; (0: given back at once); README, "VRAM pool"
 *   kept_order_bytes = 256M         ; orders kept after their sessions, for
 *                                   ; pool_linger (0: none kept)
 *
 *   [dataset.NAME]
 *   format = npy
 *   field.x = /data/x.npy
 *   field.y = /data/y-0.npy, /data/y-1.npy   ; shards, in order
 *   pool = off                      ; overrides [daemon] pool for this dataset
 *   pool_linger = 0                 ; overrides [daemon] pool_linger
 *   read = direct                   ; overrides [daemon] read for this dataset
 *
 *   [dataset.fineweb]               ; llm.c / modded-nanogpt token shards
 *   format = tokens
 *   shards = /data/fineweb_train_*.bin   ; glob patterns, comma-separated
 *   seq_len = 1024                  ; sample i: tokens [i*1024, i*1024 + 1024]
 *
 * `read = mmap` maps each shard once and copies rows out with memcpy, no
 * system call per row; a file truncated after load still gives an error
 * batch, never a crash.  `read = pread` makes one pread per run of
 * consecutive rows, for file systems whose mappings misbehave.
 *
 * The limits and what a client gets when it meets one: README, "Limits".
 * For users the same keys are in prefetchd.conf(5) (man/prefetchd.conf.5)
 * and deploy/prefetchd.conf.example; a key added here goes there too
 * (test_config.c and tests/install/test_man.sh fail until it does).
 *
 * Sizes take K/M/G/T suffixes (powers of 1024).  Unknown keys and sections
 * are errors that name the line, so a typo never silently falls back to a
 * default.  A section that holds no keys is ignored, whatever its name:
 * inih, which reads the file, reports keys and never a header alone.  So an
 * empty [dataset.x] declares no dataset, and an empty [deamon] is no error
 * (it sets nothing).  Until issue 14 both were refused ("[dataset.x]
 * declares no fields", "unknown section [deamon]"); with a key in them they
 * still are.
 *
 * DESIGN: parsed once by the main thread before the loop starts.
 */
#ifndef PF_CONFIG_H
#define PF_CONFIG_H

/* pool_linger's default, 5 minutes: long enough for what re-opens a
 * dataset soon after its last session left (a new Loader each epoch, an
 * evaluation run, a crash or preemption restarted by torchrun or Slurm,
 * whose rendezvous takes tens of seconds to minutes), short enough that an
 * idle node gives its GPUs back soon.  Meanwhile the daemon's own probes
 * give memory back to any process that needs it (README, "VRAM pool"). */
#define CONFIG_POOL_LINGER_DEFAULT 300.0

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct config_field {
	char *name;   /* owned */
	char **paths; /* owned: shards in order */
	size_t npaths;
};

enum config_read {
	CONFIG_READ_MMAP, /* the default: zero, so a zeroed declaration maps */
	CONFIG_READ_PREAD,
	CONFIG_READ_DIRECT, /* O_DIRECT runs, io_uring where allowed (direct.c) */
};

enum config_pool {
	CONFIG_POOL_DEFAULT, /* [daemon] pool decides: zero, so a zeroed declaration maps */
	CONFIG_POOL_ON,
	CONFIG_POOL_OFF,
};

struct config_dataset {
	char *name;		     /* owned */
	char *format;		     /* owned */
	struct config_field *fields; /* owned, in file order */
	size_t nfields;
	/* [daemon] read, copied here by config_load so that ds_load needs
	 * nothing but the declaration. */
	enum config_read read;
	bool read_set; /* the dataset's own `read`, else [daemon]'s is copied */
	enum config_pool pool;
	double pool_linger; /* seconds, when pool_linger_set: overrides [daemon] */
	bool pool_linger_set;
	/* format = tokens: fields[0] is "tokens", its paths are the shard
	 * patterns (`shards`, expanded with glob at load); seq_len tokens a
	 * sample, plus one (the next-token target). */
	uint32_t seq_len;
};

struct config {
	char *socket_path; /* owned */
	mode_t socket_mode;
	char *socket_group;  /* owned, NULL: leave the group alone */
	unsigned readers;    /* 0: auto until daemon_config_machine */
	uint64_t ring_bytes; /* 0: auto until daemon_config_machine */
	uint64_t fill_bytes; /* host-arena batches filled ahead, all sessions; 0: auto */
	uint64_t arena_bytes;
	uint64_t session_bytes;
	unsigned max_sessions;
	unsigned max_sessions_per_uid;
	unsigned max_conns, max_conns_per_uid;
	uint64_t memory_budget;	  /* all clients' host memory, 0: auto */
	uint64_t memory_per_uid;  /* one uid's share, 0: auto (half the budget) */
	double idle_timeout;	  /* s: a connection with no session and no traffic */
	double frame_timeout;	  /* s: a frame begun must be whole within */
	unsigned depth_limit;	  /* most max_depth a client may ask for */
	uint64_t max_epoch_picks; /* N x augment of an OpenSession, at most */
	uint64_t max_frame;
	bool allow_any;	   /* allow_users = * */
	uid_t *allow_uids; /* owned */
	size_t n_allow_uids;
	gid_t *allow_gids; /* owned */
	size_t n_allow_gids;
	unsigned depth;
	unsigned max_depth;
	unsigned share_lag; /* batches a share's member may trail its fastest */
	char *ipc;	    /* owned: "fd" or "legacy" */
	enum config_read read;
	double reserve_frac;
	uint64_t reserve_min;
	double probe_interval;
	bool pool;			 /* VRAM pool for CUDA sessions (datasets may override) */
	uint64_t pool_bytes;		 /* cap per pool, 0: only the probe's budget */
	uint64_t pool_slab;		 /* bytes per slab */
	double pool_linger;		 /* s a pool outlives its last session (0: none) */
	uint64_t kept_order_bytes;	 /* the kept orders' cap (ahead.h), by what they hold */
	struct config_dataset *datasets; /* owned, in file order */
	size_t ndatasets;
};

/* Fills cfg with defaults, then reads path.  When allow_users and
 * allow_groups are both absent, the daemon's own uid and root are allowed.
 * Returns 0 or -errno with err naming the file, line and key. */
int config_load(const char *path, struct config *cfg, char *err, size_t errlen);
void config_defaults(struct config *cfg);
void config_free(struct config *cfg);
/* "256M" -> 268435456.  0 or -EINVAL. */
int config_parse_size(const char *s, uint64_t *out);

#endif
