/*
 * config.c — reads the daemon's INI file (config.h documents the keys).
 *
 * inih does all the lexing; this file adds what inih lacks for a daemon
 * config: line numbers in every message, errors for unknown sections and keys
 * (a typo must not fall back to a default silently) and duplicate detection.
 * inih reads through read_line, which counts lines, keeps the raw one and
 * notes lines that start with '['; ini_parse_stream calls the handler for a
 * line before it reads the next.  inih never reports a header by itself, so
 * a section without keys goes unseen (config.h).
 *
 * Relative paths (dataset shards, the socket) are resolved against the
 * directory that holds the config file, made absolute, so that the daemon's
 * working directory never changes what a config means.
 *
 * DESIGN: called once by the main thread before the loop starts; the parse
 * state lives on the caller's stack.  No locks.  The only globals touched are
 * inih's ini_max_line and ini_stop_on_first_error (see parse_file), saved and
 * restored around the parse.
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <unistd.h>

#include <ini.h>

/* inih copies section names (and the key a continuation line repeats) into
 * fixed 50-byte buffers and silently truncates longer ones; names that long
 * are refused instead. */
#define INIH_MAX_NAME 50
/* Lines up to this long are accepted when the installed inih lets us raise
 * its line buffer (Debian's build exports ini_max_line); otherwise inih's
 * compiled-in 200 applies and read_line says so. */
#define CONFIG_MAX_LINE 4096

#pragma weak ini_max_line
#pragma weak ini_stop_on_first_error

/* The [daemon] keys: K_NAME indexes key_line, daemon_keys[K_NAME] is "name". */
#define DAEMON_KEYS(X)                                                                             \
	X(SOCKET, socket), X(SOCKET_MODE, socket_mode), X(SOCKET_GROUP, socket_group),             \
		X(READERS, readers), X(RING_BYTES, ring_bytes), X(ARENA_BYTES, arena_bytes),       \
		X(SESSION_BYTES, session_bytes), X(MAX_SESSIONS, max_sessions),                    \
		X(MAX_FRAME, max_frame), X(ALLOW_USERS, allow_users),                              \
		X(ALLOW_GROUPS, allow_groups), X(DEPTH, depth), X(MAX_DEPTH, max_depth),           \
		X(IPC, ipc), X(READ, read), X(RESERVE, reserve), X(RESERVE_MIN, reserve_min),      \
		X(PROBE_INTERVAL, probe_interval), X(POOL, pool), X(POOL_BYTES, pool_bytes),       \
		X(POOL_SLAB, pool_slab), X(MAX_EPOCH_PICKS, max_epoch_picks)
#define KEY_ENUM(k, name) K_##k
#define KEY_NAME(k, name) [K_##k] = #name
enum daemon_key { DAEMON_KEYS(KEY_ENUM), K_COUNT };
static const char *const daemon_keys[K_COUNT] = {DAEMON_KEYS(KEY_NAME)};

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
static __attribute__((format(printf, 4, 5))) int fail_at(struct parse *st, int rc, int line,
							 const char *fmt, ...)
{
	va_list ap;
	int n;

	if (st->rc)
		return 0;
	st->rc = rc;
	if (!st->err || st->errlen == 0)
		return 0;
	if (line > 0)
		n = snprintf(st->err, st->errlen, "%s:%d: ", st->path, line);
	else
		n = snprintf(st->err, st->errlen, "%s: ", st->path);
	if (n >= 0 && (size_t)n < st->errlen) {
		va_start(ap, fmt);
		vsnprintf(st->err + n, st->errlen - (size_t)n, fmt, ap);
		va_end(ap);
	}
	return 0;
}

#define fail(st, ...)	      fail_at((st), -EINVAL, (st)->lineno, __VA_ARGS__)
#define fail_nomem(st)	      fail_at((st), -ENOMEM, (st)->lineno, "out of memory")
#define fail_section(st, ...) fail_at((st), -EINVAL, (st)->section_line, __VA_ARGS__)

static char *trim(char *s)
{
	char *end;

	while (isspace((unsigned char)*s))
		s++;
	end = s + strlen(s);
	while (end > s && isspace((unsigned char)end[-1]))
		*--end = '\0';
	return s;
}

/* ---- values ---------------------------------------------------------------- */

static bool all_digits(const char *s)
{
	return *s && s[strspn(s, "0123456789")] == '\0';
}

static int parse_u64(const char *s, uint64_t *out)
{
	unsigned long long v;
	char *end;

	if (!all_digits(s))
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || *end)
		return -EINVAL;
	*out = v;
	return 0;
}

int config_parse_size(const char *s, uint64_t *out)
{
	char digits[32];
	size_t len = strlen(s), ndig = 0;
	unsigned shift = 0;
	uint64_t v;

	while (ndig < len && isdigit((unsigned char)s[ndig]))
		ndig++;
	if (ndig == 0 || ndig >= sizeof(digits))
		return -EINVAL;
	if (len == ndig + 1) {
		const char *units = "KMGT";
		const char *u = strchr(units, toupper((unsigned char)s[ndig]));

		if (!u || !*u)
			return -EINVAL;
		shift = 10 * (unsigned)(u - units + 1);
	} else if (len != ndig) {
		return -EINVAL;
	}
	memcpy(digits, s, ndig);
	digits[ndig] = '\0';
	if (parse_u64(digits, &v))
		return -EINVAL;
	if (shift && v > (UINT64_MAX >> shift))
		return -EINVAL;
	*out = v << shift;
	return 0;
}

static int key_uint(struct parse *st, const char *key, const char *value, uint64_t min,
		    uint64_t max, unsigned *out)
{
	uint64_t v;

	if (parse_u64(value, &v))
		return fail(st, "%s: '%s' is not a number", key, value);
	if (v < min || v > max)
		return fail(st, "%s: %s is out of range (%llu..%llu)", key, value,
			    (unsigned long long)min, (unsigned long long)max);
	*out = (unsigned)v;
	return 1;
}

static int key_size(struct parse *st, const char *key, const char *value, uint64_t min,
		    uint64_t max, uint64_t *out)
{
	uint64_t v;

	if (config_parse_size(value, &v))
		return fail(st, "%s: '%s' is not a size (bytes, or a number with K, M, G or T)",
			    key, value);
	if (v < min || v > max)
		return fail(st, "%s: %s is out of range (%llu..%llu bytes)", key, value,
			    (unsigned long long)min, (unsigned long long)max);
	*out = v;
	return 1;
}

static int key_double(struct parse *st, const char *key, const char *value, double *out)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(value, &end);
	if (errno || end == value || *end || !isfinite(v))
		return fail(st, "%s: '%s' is not a number", key, value);
	*out = v;
	return 1;
}

/* Resolves a path from the file against the config file's directory. */
static char *resolve_path(struct parse *st, const char *p)
{
	char *out;

	if (p[0] == '/')
		return strdup(p);
	return asprintf(&out, "%s/%s", st->base_dir, p) < 0 ? NULL : out;
}

static int replace_str(struct parse *st, char **slot, char *fresh)
{
	if (!fresh)
		return fail_nomem(st);
	free(*slot);
	*slot = fresh;
	return 1;
}

/* Adds id to an allow list unless it is there.  uid_t and gid_t are one
 * type on Linux (the compiler says so where gid lists are passed). */
static int push_id(struct parse *st, uid_t **ids, size_t *n, uid_t id)
{
	uid_t *grown;
	size_t i;

	for (i = 0; i < *n; i++)
		if ((*ids)[i] == id)
			return 1;
	grown = realloc(*ids, (*n + 1) * sizeof(*grown));
	if (!grown)
		return fail_nomem(st);
	grown[(*n)++] = id;
	*ids = grown;
	return 1;
}

/* The first allow_users or allow_groups key replaces the implicit "the
 * daemon's uid and root" rule with exactly what the file lists. */
static void drop_implicit_allow(struct parse *st)
{
	struct config *cfg = st->cfg;

	if (st->key_line[K_ALLOW_USERS] || st->key_line[K_ALLOW_GROUPS])
		return;
	free(cfg->allow_uids);
	free(cfg->allow_gids);
	cfg->allow_uids = cfg->allow_gids = NULL;
	cfg->n_allow_uids = cfg->n_allow_gids = 0;
}

/* allow_users / allow_groups: "name, 1001, *". */
static int key_allow(struct parse *st, const char *key, const char *value, bool users)
{
	struct config *cfg = st->cfg;
	uid_t **ids = users ? &cfg->allow_uids : &cfg->allow_gids;
	size_t *n = users ? &cfg->n_allow_uids : &cfg->n_allow_gids;
	char *list = strdup(value), *rest = list, *item;
	int ok = list ? 1 : fail_nomem(st);

	while (ok && (item = strsep(&rest, ","))) {
		uint64_t id;

		item = trim(item);
		if (!*item) {
			ok = fail(st, "%s: empty entry in list", key);
		} else if (strcmp(item, "*") == 0) {
			cfg->allow_any = true;
		} else if (all_digits(item)) {
			/* uid_t and gid_t are 32 bits; -1 means "no id" to chown. */
			if (parse_u64(item, &id) || id >= UINT32_MAX)
				ok = fail(st, "%s: id %s is out of range", key, item);
			else
				ok = push_id(st, ids, n, (uid_t)id);
		} else if (users) {
			struct passwd *pw = getpwnam(item);

			ok = pw ? push_id(st, ids, n, pw->pw_uid)
				: fail(st, "%s: no such user '%s'", key, item);
		} else {
			struct group *gr = getgrnam(item);

			ok = gr ? push_id(st, ids, n, gr->gr_gid)
				: fail(st, "%s: no such group '%s'", key, item);
		}
	}
	free(list);
	return ok;
}

static int key_reserve(struct parse *st, const char *value)
{
	struct config *cfg = st->cfg;
	size_t len = strlen(value);

	if (len > 1 && value[len - 1] == '%') {
		char num[32];
		double pct;

		if (len - 1 >= sizeof(num))
			return fail(st, "reserve: '%s' is not a percentage", value);
		memcpy(num, value, len - 1);
		num[len - 1] = '\0';
		if (!key_double(st, "reserve", num, &pct))
			return 0;
		if (pct < 0 || pct >= 100)
			return fail(st, "reserve: %s is out of range (0%%..<100%%)", value);
		cfg->reserve_frac = pct / 100;
		st->reserve_is_size = false;
		return 1;
	}
	if (!key_size(st, "reserve", value, 0, UINT64_MAX, &cfg->reserve_min))
		return 0;
	cfg->reserve_frac = 0;
	st->reserve_is_size = true;
	return 1;
}

static int key_onoff(struct parse *st, const char *name, const char *value, bool *out)
{
	if (strcmp(value, "on") == 0)
		*out = true;
	else if (strcmp(value, "off") == 0)
		*out = false;
	else
		return fail(st, "%s: '%s' is not on or off", name, value);
	return 1;
}

static int daemon_key(struct parse *st, const char *name, const char *value)
{
	struct config *cfg = st->cfg;
	unsigned mode_bits;
	int k;

	for (k = 0; k < K_COUNT; k++)
		if (strcmp(name, daemon_keys[k]) == 0)
			break;
	if (k == K_COUNT)
		return fail(st, "unknown key '%s' in [daemon]", name);
	if (st->key_line[k])
		return fail(st, "%s: duplicate key (first set on line %d)", name, st->key_line[k]);
	if (!*value)
		return fail(st, "%s: empty value", name);
	if (k == K_ALLOW_USERS || k == K_ALLOW_GROUPS)
		drop_implicit_allow(st);
	st->key_line[k] = st->lineno;

	switch ((enum daemon_key)k) {
	case K_SOCKET: {
		char *p = resolve_path(st, value);

		if (p && strlen(p) >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
			free(p);
			return fail(st, "socket: path is longer than %zu bytes",
				    sizeof(((struct sockaddr_un *)0)->sun_path) - 1);
		}
		return replace_str(st, &cfg->socket_path, p);
	}
	case K_SOCKET_MODE:
		if (strspn(value, "01234567") != strlen(value) ||
		    sscanf(value, "%o", &mode_bits) != 1 || mode_bits > 0777)
			return fail(st, "socket_mode: '%s' is not an octal mode (0000..0777)",
				    value);
		cfg->socket_mode = (mode_t)mode_bits;
		return 1;
	case K_SOCKET_GROUP:
		if (!all_digits(value) && !getgrnam(value))
			return fail(st, "socket_group: no such group '%s'", value);
		return replace_str(st, &cfg->socket_group, strdup(value));
	case K_READERS: return key_uint(st, name, value, 1, 256, &cfg->readers);
	case K_RING_BYTES: return key_size(st, name, value, 4096, UINT64_MAX, &cfg->ring_bytes);
	case K_ARENA_BYTES: return key_size(st, name, value, 4096, UINT64_MAX, &cfg->arena_bytes);
	case K_SESSION_BYTES:
		return key_size(st, name, value, 4096, UINT64_MAX, &cfg->session_bytes);
	case K_MAX_SESSIONS: return key_uint(st, name, value, 1, 65536, &cfg->max_sessions);
	case K_MAX_EPOCH_PICKS:
		/* A count, with the size suffixes: 2G is 2^31 picks. */
		if (config_parse_size(value, &cfg->max_epoch_picks))
			return fail(
				st,
				"max_epoch_picks: '%s' is not a count (a number, or one with K, "
				"M, G or T)",
				value);
		if (cfg->max_epoch_picks == 0)
			return fail(st, "max_epoch_picks: must be at least 1");
		return 1;
	case K_MAX_FRAME:
		/* The wire length prefix is 32 bits; 1G is far above any sane
		 * frame and keeps a hostile length from reserving 4G. */
		return key_size(st, name, value, 4096, 1ULL << 30, &cfg->max_frame);
	case K_ALLOW_USERS: return key_allow(st, name, value, true);
	case K_ALLOW_GROUPS: return key_allow(st, name, value, false);
	case K_DEPTH: return key_uint(st, name, value, 1, 4096, &cfg->depth);
	case K_MAX_DEPTH: return key_uint(st, name, value, 1, 4096, &cfg->max_depth);
	case K_IPC:
		if (strcmp(value, "fd") != 0 && strcmp(value, "legacy") != 0)
			return fail(st, "ipc: '%s' is not fd or legacy", value);
		return replace_str(st, &cfg->ipc, strdup(value));
	case K_READ:
		if (strcmp(value, "mmap") == 0)
			cfg->read = CONFIG_READ_MMAP;
		else if (strcmp(value, "pread") == 0)
			cfg->read = CONFIG_READ_PREAD;
		else
			return fail(st, "read: '%s' is not mmap or pread", value);
		return 1;
	case K_RESERVE:
		if (st->key_line[K_RESERVE_MIN] && config_parse_size(value, &(uint64_t){0}) == 0)
			return fail(st,
				    "reserve: a size conflicts with reserve_min on line %d "
				    "(a size is the minimum itself)",
				    st->key_line[K_RESERVE_MIN]);
		return key_reserve(st, value);
	case K_RESERVE_MIN:
		if (st->reserve_is_size)
			return fail(st,
				    "reserve_min: conflicts with reserve = SIZE on line %d "
				    "(a size is the minimum itself)",
				    st->key_line[K_RESERVE]);
		return key_size(st, name, value, 0, UINT64_MAX, &cfg->reserve_min);
	case K_PROBE_INTERVAL:
		if (!key_double(st, name, value, &cfg->probe_interval))
			return 0;
		if (cfg->probe_interval <= 0 || cfg->probe_interval > 86400)
			return fail(st, "probe_interval: %s is out of range (0 < seconds <= 86400)",
				    value);
		return 1;
	case K_POOL: return key_onoff(st, name, value, &cfg->pool);
	case K_POOL_BYTES:
		if (strcmp(value, "auto") == 0) {
			cfg->pool_bytes = 0;
			return 1;
		}
		return key_size(st, name, value, 1, UINT64_MAX, &cfg->pool_bytes);
	case K_POOL_SLAB:
		/* Below 2M a slab is smaller than the allocation granularity;
		 * 64G is far above any sane slab and keeps counts small. */
		return key_size(st, name, value, 2ULL << 20, 64ULL << 30, &cfg->pool_slab);
	case K_COUNT: break;
	}
	return fail(st, "%s: unhandled key", name);
}

/* ---- datasets ---------------------------------------------------------------- */

/* Dataset and field names travel in protocol messages and status output:
 * keep them to characters that need no quoting anywhere. */
static bool valid_name(const char *s)
{
	if (!*s)
		return false;
	for (; *s; s++)
		if (!isalnum((unsigned char)*s) && !strchr("_-.", *s))
			return false;
	return true;
}

/* Appends the comma-separated shard paths in value to field f.  A trailing
 * comma is allowed so that a list can continue on the next line. */
static int add_shards(struct parse *st, struct config_field *f, const char *key, const char *value)
{
	char *list = strdup(value), *rest = list, *item;
	int ok = list ? 1 : fail_nomem(st);

	while (ok && (item = strsep(&rest, ","))) {
		char **grown;

		item = trim(item);
		if (!*item) {
			/* The last item may be empty, unless it is the only one. */
			if (rest || item == list)
				ok = fail(st, "%s: empty shard path in list", key);
			continue;
		}
		grown = realloc(f->paths, (f->npaths + 1) * sizeof(*grown));
		if (grown)
			f->paths = grown;
		if (!grown || !(f->paths[f->npaths] = resolve_path(st, item)))
			ok = fail_nomem(st);
		else
			f->npaths++;
	}
	free(list);
	return ok;
}

/* Appends an empty field to ds; NULL when out of memory. */
static struct config_field *add_field(struct config_dataset *ds, const char *name)
{
	struct config_field *f = realloc(ds->fields, (ds->nfields + 1) * sizeof(*f));

	if (!f)
		return NULL;
	ds->fields = f;
	f = &ds->fields[ds->nfields];
	memset(f, 0, sizeof(*f));
	f->name = strdup(name);
	if (!f->name)
		return NULL;
	ds->nfields++;
	return f;
}

static int dataset_key(struct parse *st, const char *name, const char *value)
{
	struct config *cfg = st->cfg;
	struct config_dataset *ds = &cfg->datasets[cfg->ndatasets - 1];
	struct config_field *f;
	size_t i;

	/* The handler lets only shards and field.NAME continue, and a key line
	 * that fails ends the parse: the field continued is the last one. */
	if (st->continuation)
		return add_shards(st, &ds->fields[ds->nfields - 1], name, value);
	if (strcmp(name, "format") == 0) {
		if (st->dataset_format_seen)
			return fail(st, "format: duplicate key");
		st->dataset_format_seen = true;
		if (strcmp(value, "npy") != 0 && strcmp(value, "tokens") != 0)
			return fail(st, "format: '%s' is not npy or tokens", value);
		return replace_str(st, &ds->format, strdup(value));
	}
	if (strcmp(name, "seq_len") == 0) {
		if (ds->seq_len)
			return fail(st, "seq_len: duplicate key");
		return key_uint(st, name, value, 1, 1u << 24, &ds->seq_len);
	}
	if (strcmp(name, "shards") == 0) {
		/* tokens: shard file patterns (glob), as one field "tokens". */
		st->dataset_shards_seen = true;
		if (ds->nfields)
			return fail(st, "shards: duplicate key, or given with field.NAME");
		f = add_field(ds, "tokens");
		return f ? add_shards(st, f, name, value) : fail_nomem(st);
	}
	if (strcmp(name, "pool") == 0) {
		if (ds->pool != CONFIG_POOL_DEFAULT)
			return fail(st, "pool: duplicate key");
		if (!key_onoff(st, name, value, &(bool){false}))
			return 0;
		ds->pool = strcmp(value, "on") == 0 ? CONFIG_POOL_ON : CONFIG_POOL_OFF;
		return 1;
	}
	if (strncmp(name, "field.", 6) != 0)
		return fail(
			st,
			"unknown key '%s' in [dataset.%s] (expected format, pool or field.NAME)",
			name, ds->name);
	if (!valid_name(name + 6))
		return fail(st, "%s: field names use letters, digits, '_', '-' and '.'", name);
	for (i = 0; i < ds->nfields; i++)
		if (strcmp(ds->fields[i].name, name + 6) == 0)
			return fail(st, "%s: duplicate field", name);
	if (!*value)
		return fail(st, "%s: empty value (expected shard paths)", name);
	f = add_field(ds, name + 6);
	return f ? add_shards(st, f, name, value) : fail_nomem(st);
}

/* Checks the section that just ended; runs at each header and at EOF. */
static int finish_section(struct parse *st)
{
	const struct config_dataset *ds;
	const char *why = NULL; /* what is wrong, after "[dataset.NAME]" */

	if (st->section != SEC_DATASET)
		return 1;
	ds = &st->cfg->datasets[st->cfg->ndatasets - 1];
	if (strcmp(ds->format, "tokens") != 0) {
		if (ds->seq_len || st->dataset_shards_seen)
			why = ": shards and seq_len are for format = tokens (npy datasets use "
			      "field.NAME = PATH)";
		else if (ds->nfields == 0)
			why = " declares no fields (add field.NAME = PATH)";
	} else if (ds->nfields != 1 || strcmp(ds->fields[0].name, "tokens") != 0) {
		why = " is a tokens dataset: give its files as shards = PATTERN (not field.NAME)";
	} else if (!ds->seq_len) {
		why = " is a tokens dataset: give seq_len = N (tokens per sample, plus one for the "
		      "target)";
	}
	return why ? fail_section(st, "[%s]%s", st->section_name, why) : 1;
}

static int enter_section(struct parse *st, const char *name)
{
	struct config *cfg = st->cfg;
	struct config_dataset *ds;
	size_t i;

	if (!finish_section(st))
		return 0;
	st->section_line = st->header_line;
	if (strlen(name) == INIH_MAX_NAME - 1 && st->header_cut)
		return fail_section(st, "section name '%s...' is longer than %d characters", name,
				    INIH_MAX_NAME - 1);
	strcpy(st->section_name, name);
	if (strcmp(name, "daemon") == 0) {
		st->section = SEC_DAEMON;
		return 1;
	}
	if (strncmp(name, "dataset.", 8) != 0)
		return fail_section(
			st, "unknown section [%s] (expected [daemon] or [dataset.NAME])", name);
	name += 8;
	if (!valid_name(name))
		return fail_section(
			st, "[dataset.%s]: dataset names use letters, digits, '_', '-' and '.'",
			name);
	for (i = 0; i < cfg->ndatasets; i++)
		if (strcmp(cfg->datasets[i].name, name) == 0)
			return fail_section(st, "[dataset.%s]: duplicate dataset", name);
	ds = realloc(cfg->datasets, (cfg->ndatasets + 1) * sizeof(*ds));
	if (!ds)
		return fail_nomem(st);
	cfg->datasets = ds;
	ds = &cfg->datasets[cfg->ndatasets];
	memset(ds, 0, sizeof(*ds));
	ds->name = strdup(name);
	ds->format = strdup("npy");
	cfg->ndatasets++;
	if (!ds->name || !ds->format)
		return fail_nomem(st);
	st->section = SEC_DATASET;
	st->dataset_format_seen = false;
	st->dataset_shards_seen = false;
	return 1;
}

/* ---- inih glue ---------------------------------------------------------------- */

/* An ini_reader: fgets semantics on top of getline, counting lines and
 * keeping the raw line in st->buf for the handler. */
static char *read_line(char *str, int num, void *stream)
{
	struct parse *st = stream;
	const char *p;
	ssize_t n;

	if (st->rc)
		return NULL;
	errno = 0;
	n = getline(&st->buf, &st->buf_cap, st->file);
	if (n < 0) {
		if (ferror(st->file))
			fail_at(st, errno ? -errno : -EIO, st->lineno, "read error: %s",
				strerror(errno ? errno : EIO));
		return NULL;
	}
	st->lineno++;
	if (memchr(st->buf, '\0', (size_t)n)) {
		fail(st, "NUL byte in line");
		return NULL;
	}
	if (n >= num - 1) {
		fail(st, "line is longer than %d bytes", num - 2);
		return NULL;
	}
	/* inih calls the handler for keys only, never for a [section] line:
	 * note where lines starting with '[' are (after the BOM inih skips on
	 * line 1), so the handler can tell when a header came in between. */
	p = st->buf + (st->lineno == 1 && strncmp(st->buf, "\xEF\xBB\xBF", 3) == 0 ? 3 : 0);
	p += strspn(p, " \t\n\v\f\r");
	if (*p == '[') {
		st->header_line = st->lineno;
		st->header_cut =
			strnlen(p, INIH_MAX_NAME + 1) > INIH_MAX_NAME && p[INIH_MAX_NAME] != ']';
	}
	return memcpy(str, st->buf, (size_t)n + 1);
}

/* An ini_handler: inih calls it for each key line and each continuation
 * line, before it reads the next line. */
static int handler(void *user, const char *section, const char *name, const char *value)
{
	struct parse *st = user;
	/* A line starting with '[' that no call came for is a section header
	 * (a continuation line starting with '[' gets its call). */
	bool new_section = st->header_line > st->call_line && st->header_line < st->lineno;

	/* inih's rule: a line starting with whitespace continues the value of
	 * the section's previous key line, if it has one (inih forgets it at
	 * each header); blank and comment lines never get here. */
	st->continuation = !new_section && st->call_line && isspace((unsigned char)st->buf[0]);
	st->call_line = st->lineno;
	if (new_section && !enter_section(st, section))
		return 0;
	if (st->continuation) {
		if (strcmp(name, "shards") != 0 && strncmp(name, "field.", 6) != 0)
			return fail(st,
				    "%s: a continuation line (leading whitespace) is only allowed "
				    "for field.NAME",
				    name);
	} else if (!*name) {
		return fail(st, "missing key before '='");
	} else if (strlen(name) >= INIH_MAX_NAME) {
		return fail(st, "key '%s' is longer than %d characters", name, INIH_MAX_NAME - 1);
	} else if (st->section == SEC_NONE) {
		return fail(st, "%s: key outside any section (start with [daemon])", name);
	}
	return st->section == SEC_DAEMON ? daemon_key(st, name, value)
					 : dataset_key(st, name, value);
}

static int parse_file(struct parse *st)
{
	/* Debian's libinih exports its options as globals (weak here: NULL in
	 * an inih without them).  ini_max_line sizes its stack line buffer,
	 * whose default 200 bytes is short for a list of shard paths; stopping
	 * at the first error leaves the bad line the last one read.  Without
	 * them read_line refuses lines over 198 bytes, and inih reads on. */
	int saved_max_line = &ini_max_line ? ini_max_line : 0;
	bool saved_stop = &ini_stop_on_first_error ? ini_stop_on_first_error : false;
	int ret;

	if (&ini_max_line)
		ini_max_line = CONFIG_MAX_LINE;
	if (&ini_stop_on_first_error)
		ini_stop_on_first_error = true;
	ret = ini_parse_stream(read_line, st, handler, st);
	if (&ini_max_line)
		ini_max_line = saved_max_line;
	if (&ini_stop_on_first_error)
		ini_stop_on_first_error = saved_stop;

	/* ret is the first line that failed: inih's own syntax error (no '='
	 * or ':', or a header without ']') unless a handler failed there.  An
	 * inih that reads on may see a later '[' line and call a bad header a
	 * bad key line. */
	if (ret > 0 && (!st->rc || ret < st->lineno)) {
		st->rc = 0;
		fail_at(st, -EINVAL, ret, "%s",
			ret == st->header_line ? "section header without ']'"
					       : "expected 'key = value'");
	} else if (ret == -2) {
		fail_nomem(st);
	} else if (!st->rc) {
		finish_section(st);
	}
	return st->rc;
}

/* ---- public ---------------------------------------------------------------- */

void config_defaults(struct config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	/* Allocation failures leave these NULL; config_load reports them. */
	cfg->socket_path = strdup("/run/prefetchd/prefetchd.sock");
	cfg->socket_mode = 0660;
	cfg->readers = 4;
	cfg->ring_bytes = 256ULL << 20;
	cfg->arena_bytes = 256ULL << 20;
	cfg->session_bytes = 2ULL << 30;
	cfg->max_sessions = 64;
	/* A 16 GiB order (and as much again while the next epoch's is built
	 * ahead): far above ImageNet's 1.3M or a 10B-token corpus's 10M
	 * windows, and far below what one client may make the daemon take. */
	cfg->max_epoch_picks = 2ULL << 30;
	cfg->max_frame = 16ULL << 20;
	cfg->depth = 4;
	cfg->max_depth = 16;
	cfg->ipc = strdup("fd");
	cfg->read = CONFIG_READ_MMAP;
	cfg->reserve_frac = 0.10;
	cfg->reserve_min = 2ULL << 30;
	cfg->probe_interval = 5;
	cfg->pool = true;
	cfg->pool_bytes = 0;
	cfg->pool_slab = 256ULL << 20;
	/* No allow keys: the daemon's own uid and root. */
	cfg->allow_uids = malloc(2 * sizeof(*cfg->allow_uids));
	if (cfg->allow_uids) {
		cfg->allow_uids[cfg->n_allow_uids++] = getuid();
		if (getuid() != 0)
			cfg->allow_uids[cfg->n_allow_uids++] = 0;
	}
}

void config_free(struct config *cfg)
{
	size_t d, f, p;

	free(cfg->socket_path);
	free(cfg->socket_group);
	free(cfg->allow_uids);
	free(cfg->allow_gids);
	free(cfg->ipc);
	for (d = 0; d < cfg->ndatasets; d++) {
		struct config_dataset *ds = &cfg->datasets[d];

		for (f = 0; f < ds->nfields; f++) {
			for (p = 0; p < ds->fields[f].npaths; p++)
				free(ds->fields[f].paths[p]);
			free(ds->fields[f].paths);
			free(ds->fields[f].name);
		}
		free(ds->fields);
		free(ds->name);
		free(ds->format);
	}
	free(cfg->datasets);
	memset(cfg, 0, sizeof(*cfg));
}

/* The absolute directory holding path, so relative paths in the file mean
 * the same whatever the daemon's working directory. */
static char *config_dir(const char *path)
{
	char *copy = strdup(path), *dir;

	if (!copy)
		return NULL;
	dir = realpath(dirname(copy), NULL);
	free(copy);
	return dir;
}

int config_load(const char *path, struct config *cfg, char *err, size_t errlen)
{
	struct parse st = {.cfg = cfg, .path = path, .err = err, .errlen = errlen};
	int rc;

	if (err && errlen)
		err[0] = '\0';
	config_defaults(cfg);
	if (!cfg->socket_path || !cfg->ipc || !cfg->allow_uids) {
		fail_at(&st, -ENOMEM, 0, "out of memory");
		rc = st.rc;
		goto out;
	}
	st.file = fopen(path, "re");
	st.base_dir = st.file ? config_dir(path) : NULL;
	if (!st.base_dir) {
		rc = -errno;
		if (err && errlen)
			snprintf(err, errlen,
				 st.file ? "cannot resolve the directory of %s: %s"
					 : "cannot open %s: %s",
				 path, strerror(-rc));
		goto out;
	}
	rc = parse_file(&st);
	if (rc)
		goto out;

	if (cfg->max_depth < cfg->depth) {
		if (st.key_line[K_MAX_DEPTH])
			fail_at(&st, -EINVAL, st.key_line[K_MAX_DEPTH],
				"max_depth: %u is below depth = %u", cfg->max_depth, cfg->depth);
		else
			fail_at(&st, -EINVAL, st.key_line[K_DEPTH],
				"depth: %u is above max_depth = %u (the default; set max_depth)",
				cfg->depth, cfg->max_depth);
		rc = st.rc;
		goto out;
	}
	/* [daemon] may come after the datasets, so the copy waits for EOF. */
	for (size_t d = 0; d < cfg->ndatasets; d++)
		cfg->datasets[d].read = cfg->read;
out:
	if (st.file)
		fclose(st.file);
	free(st.buf);
	free(st.base_dir);
	if (rc)
		config_free(cfg);
	return rc;
}
