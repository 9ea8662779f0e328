/*
 * config_keys.c — the value of every configuration key (config.h documents
 * them): numbers, sizes, seconds, the allow lists, paths resolved against
 * the config file's directory, and the dataset declarations.  config.c
 * calls in here once per key line, with the line number set for messages.
 *
 * DESIGN: main thread only, on the parse state config_load keeps on its
 * stack.  No locks.
 */
#include "conf/config_int.h"

#include <ctype.h>
#include <grp.h>
#include <inttypes.h>
#include <math.h>
#include <pwd.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>

const char *const config_daemon_keys[K_COUNT] = {DAEMON_KEYS(KEY_NAME)};

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

/* "auto" (0: the daemon decides) or a size of at least min. */
static int key_size_or_auto(struct parse *st, const char *key, const char *value, uint64_t min,
			    uint64_t *out)
{
	if (strcmp(value, "auto") == 0) {
		*out = 0;
		return 1;
	}
	return key_size(st, key, value, min, UINT64_MAX, out);
}

/* Seconds: more than 0, at most a day. */
static int key_seconds(struct parse *st, const char *key, const char *value, double *out)
{
	if (!key_double(st, key, value, out))
		return 0;
	if (*out <= 0 || *out > 86400)
		return fail(st, "%s: %s is out of range (0 < seconds <= 86400)", key, value);
	return 1;
}

/* read = mmap | pread | direct, [daemon]'s or a dataset's. */
static int key_read(struct parse *st, const char *value, enum config_read *out)
{
	if (strcmp(value, "mmap") == 0)
		*out = CONFIG_READ_MMAP;
	else if (strcmp(value, "pread") == 0)
		*out = CONFIG_READ_PREAD;
	else if (strcmp(value, "direct") == 0)
		*out = CONFIG_READ_DIRECT;
	else
		return fail(st, "read: '%s' is not mmap, pread or direct", value);
	return 1;
}

/* pool_linger: 0 (a pool leaves with its last session) up to a week. */
static int key_linger(struct parse *st, const char *key, const char *value, double *out)
{
	if (!key_double(st, key, value, out))
		return 0;
	if (*out < 0 || *out > 7 * 86400)
		return fail(st, "%s: %s is out of range (0 <= seconds <= 604800)", key, value);
	return 1;
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

int config_daemon_key(struct parse *st, const char *name, const char *value)
{
	struct config *cfg = st->cfg;
	unsigned mode_bits;
	int k;

	for (k = 0; k < K_COUNT; k++)
		if (strcmp(name, config_daemon_keys[k]) == 0)
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
	case K_READERS:
		if (strcmp(value, "auto") == 0) {
			cfg->readers = 0;
			return 1;
		}
		return key_uint(st, name, value, 1, 256, &cfg->readers);
	case K_RING_BYTES: return key_size_or_auto(st, name, value, 4096, &cfg->ring_bytes);
	case K_FILL_BYTES: return key_size_or_auto(st, name, value, 1ULL << 20, &cfg->fill_bytes);
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
	case K_MAX_DEPTH: return key_uint(st, name, value, 1, 65536, &cfg->max_depth);
	case K_SHARE_LAG: return key_uint(st, name, value, 1, 256, &cfg->share_lag);
	case K_IPC:
		if (strcmp(value, "fd") != 0 && strcmp(value, "legacy") != 0)
			return fail(st, "ipc: '%s' is not fd or legacy", value);
		return replace_str(st, &cfg->ipc, strdup(value));
	case K_READ: return key_read(st, value, &cfg->read);
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
	case K_PROBE_INTERVAL: return key_seconds(st, name, value, &cfg->probe_interval);
	case K_POOL: return key_onoff(st, name, value, &cfg->pool);
	case K_POOL_LINGER: return key_linger(st, name, value, &cfg->pool_linger);
	case K_POOL_BYTES: return key_size_or_auto(st, name, value, 1, &cfg->pool_bytes);
	case K_MEMORY_BUDGET:
		/* Below 16M not even one default session's bookkeeping fits. */
		return key_size_or_auto(st, name, value, 16ULL << 20, &cfg->memory_budget);
	case K_MEMORY_PER_UID:
		return key_size_or_auto(st, name, value, 1ULL << 20, &cfg->memory_per_uid);
	case K_MAX_SESSIONS_PER_UID:
		return key_uint(st, name, value, 1, 65536, &cfg->max_sessions_per_uid);
	case K_MAX_CONNS: return key_uint(st, name, value, 1, 65536, &cfg->max_conns);
	case K_MAX_CONNS_PER_UID:
		return key_uint(st, name, value, 1, 65536, &cfg->max_conns_per_uid);
	case K_IDLE_TIMEOUT: return key_seconds(st, name, value, &cfg->idle_timeout);
	case K_FRAME_TIMEOUT: return key_seconds(st, name, value, &cfg->frame_timeout);
	case K_DEPTH_LIMIT: return key_uint(st, name, value, 1, 65536, &cfg->depth_limit);
	case K_KEPT_ORDER_BYTES:
		return key_size(st, name, value, 0, UINT64_MAX, &cfg->kept_order_bytes);
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
bool config_valid_name(const char *s)
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

int config_dataset_key(struct parse *st, const char *name, const char *value)
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
	if (strcmp(name, "read") == 0) {
		if (ds->read_set)
			return fail(st, "read: duplicate key");
		ds->read_set = true;
		return key_read(st, value, &ds->read);
	}
	if (strcmp(name, "pool_linger") == 0) {
		if (ds->pool_linger_set)
			return fail(st, "pool_linger: duplicate key");
		ds->pool_linger_set = true;
		return key_linger(st, name, value, &ds->pool_linger);
	}
	if (strncmp(name, "field.", 6) != 0)
		return fail(st,
			    "unknown key '%s' in [dataset.%s] (expected format, pool, pool_linger, "
			    "read "
			    "or field.NAME)",
			    name, ds->name);
	if (!config_valid_name(name + 6))
		return fail(st, "%s: field names use letters, digits, '_', '-' and '.'", name);
	for (i = 0; i < ds->nfields; i++)
		if (strcmp(ds->fields[i].name, name + 6) == 0)
			return fail(st, "%s: duplicate field", name);
	if (!*value)
		return fail(st, "%s: empty value (expected shard paths)", name);
	f = add_field(ds, name + 6);
	return f ? add_shards(st, f, name, value) : fail_nomem(st);
}

int config_finish_section(struct parse *st)
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

/* The message points at the line of the one the file set (the other is
 * a default). */
int config_keys_ordered(struct parse *st, int lo, uint64_t lo_v, int hi, uint64_t hi_v)
{
	if (lo_v <= hi_v)
		return 1;
	if (st->key_line[hi])
		return fail_at(st, -EINVAL, st->key_line[hi],
			       "%s: %" PRIu64 " is below %s = %" PRIu64, config_daemon_keys[hi],
			       hi_v, config_daemon_keys[lo], lo_v);
	return fail_at(st, -EINVAL, st->key_line[lo],
		       "%s: %" PRIu64 " is above %s = %" PRIu64 " (the default; set %s)",
		       config_daemon_keys[lo], lo_v, config_daemon_keys[hi], hi_v,
		       config_daemon_keys[hi]);
}
