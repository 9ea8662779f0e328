/*
 * config_int.h — what the two halves of the configuration reader share:
 * config.c (inih, sections, loading) and config_keys.c (every key's value).
 *
 * DESIGN: the parse state lives on config_load's stack for one parse; the
 * main thread owns it.  No locks.
 */
#ifndef PF_CONFIG_INT_H
#define PF_CONFIG_INT_H

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>

#include "conf/config.h"

/* inih copies section names (and the key a continuation line repeats) into
 * fixed 50-byte buffers and silently truncates longer ones; names that long
 * are refused instead. */
#define INIH_MAX_NAME 50

/* The [daemon] keys: K_NAME indexes key_line, config_daemon_keys[K_NAME] is
 * "name". */
#define DAEMON_KEYS(X)                                                                             \
	X(SOCKET, socket), X(SOCKET_MODE, socket_mode), X(SOCKET_GROUP, socket_group),             \
		X(READERS, readers), X(RING_BYTES, ring_bytes), X(ARENA_BYTES, arena_bytes),       \
		X(FILL_BYTES, fill_bytes), X(SESSION_BYTES, session_bytes),                        \
		X(MAX_SESSIONS, max_sessions), X(MAX_FRAME, max_frame),                            \
		X(ALLOW_USERS, allow_users), X(ALLOW_GROUPS, allow_groups), X(DEPTH, depth),       \
		X(MAX_DEPTH, max_depth), X(IPC, ipc), X(READ, read), X(RESERVE, reserve),          \
		X(RESERVE_MIN, reserve_min), X(PROBE_INTERVAL, probe_interval), X(POOL, pool),     \
		X(POOL_BYTES, pool_bytes), X(POOL_SLAB, pool_slab), X(POOL_LINGER, pool_linger),   \
		X(MAX_EPOCH_PICKS, max_epoch_picks), X(MEMORY_BUDGET, memory_budget),              \
		X(MEMORY_PER_UID, memory_per_uid), X(MAX_SESSIONS_PER_UID, max_sessions_per_uid),  \
		X(MAX_CONNS, max_conns), X(MAX_CONNS_PER_UID, max_conns_per_uid),                  \
		X(IDLE_TIMEOUT, idle_timeout), X(FRAME_TIMEOUT, frame_timeout),                    \
		X(DEPTH_LIMIT, depth_limit), X(KEPT_ORDER_BYTES, kept_order_bytes),                \
		X(SHARE_LAG, share_lag)
#define KEY_ENUM(k, name) K_##k
#define KEY_NAME(k, name) [K_##k] = #name
enum daemon_key { DAEMON_KEYS(KEY_ENUM), K_COUNT };
extern const char *const config_daemon_keys[K_COUNT];

enum section { SEC_NONE, SEC_DAEMON, SEC_DATASET };

struct parse {
	struct config *cfg; /* borrowed: the caller's */
	const char *path;   /* borrowed: as the caller named it, for messages */
	char *base_dir;	    /* owned: absolute directory of the config file */
	FILE *file;	    /* owned */
	char *buf;	    /* owned: getline buffer */
	size_t buf_cap;
	int lineno;	   /* of the line inih is processing, held raw in buf */
	int call_line;	   /* of the handler's previous call, 0 before the first */
	int header_line;   /* of the last line that starts with '[', 0: none yet */
	bool header_cut;   /* no ']' after its first 49 name bytes: cut, if inih passes 49 */
	bool continuation; /* the current line continues the previous key */
	enum section section;
	char section_name[INIH_MAX_NAME];
	int section_line;
	int key_line[K_COUNT]; /* 0: the key did not appear */
	bool reserve_is_size;
	bool dataset_format_seen;
	bool dataset_shards_seen;
	int rc;	   /* first error, 0 while none; lineno stays at its line */
	char *err; /* borrowed: the caller's buffer */
	size_t errlen;
};

/* Records the first error as "FILE:LINE: message" and returns 0, which is
 * what an inih handler returns to report failure. */
int config_fail_at(struct parse *st, int rc, int line, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

#define fail_at(st, ...)      config_fail_at((st), __VA_ARGS__)
#define fail(st, ...)	      fail_at((st), -EINVAL, (st)->lineno, __VA_ARGS__)
#define fail_nomem(st)	      fail_at((st), -ENOMEM, (st)->lineno, "out of memory")
#define fail_section(st, ...) fail_at((st), -EINVAL, (st)->section_line, __VA_ARGS__)

/* A key of [daemon] or of the current [dataset.NAME] (an inih handler's
 * return: 1, or 0 after failing). */
int config_daemon_key(struct parse *st, const char *name, const char *value);
int config_dataset_key(struct parse *st, const char *name, const char *value);
/* Checks the section that just ended; runs at each header and at EOF. */
int config_finish_section(struct parse *st);
/* Dataset and field names: letters, digits, '_', '-' and '.'. */
bool config_valid_name(const char *s);
/* Key lo's value is not above key hi's (after the whole file is read). */
int config_keys_ordered(struct parse *st, int lo, uint64_t lo_v, int hi, uint64_t hi_v);

#endif
