/*
 * config.c — reads the daemon's INI file (config.h documents the keys;
 * config_keys.c parses their values).
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
#include "conf/config_int.h"

#include <ctype.h>
#include <errno.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <ini.h>

/* Lines up to this long are accepted when the installed inih lets us raise
 * its line buffer (Debian's build exports ini_max_line); otherwise inih's
 * compiled-in 200 applies and read_line says so. */
#define CONFIG_MAX_LINE 4096

#pragma weak ini_max_line
#pragma weak ini_stop_on_first_error

int config_fail_at(struct parse *st, int rc, int line, const char *fmt, ...)
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

static int enter_section(struct parse *st, const char *name)
{
	struct config *cfg = st->cfg;
	struct config_dataset *ds;
	size_t i;

	if (!config_finish_section(st))
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
	if (!config_valid_name(name))
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
	return st->section == SEC_DAEMON ? config_daemon_key(st, name, value)
					 : config_dataset_key(st, name, value);
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
		config_finish_section(st);
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
	cfg->readers = 0;    /* auto: daemon_config_machine */
	cfg->ring_bytes = 0; /* auto: daemon_config_machine */
	cfg->arena_bytes = 256ULL << 20;
	cfg->session_bytes = 2ULL << 30;
	cfg->max_sessions = 64;
	/* A quarter each: four users can fill the daemon, none can fill it
	 * alone; 16 sessions are a node of 8 GPUs twice over. */
	cfg->max_sessions_per_uid = 16;
	/* A trainer holds one connection per session plus a status poll now
	 * and then; 256 connections hold 256 descriptors, well inside the
	 * 1024 of the default RLIMIT_NOFILE with the datasets' own. */
	cfg->max_conns = 256;
	cfg->max_conns_per_uid = 64;
	/* 0: auto, from the memory the machine (or its cgroup) has: see
	 * daemon.c's daemon_config_quota. */
	cfg->memory_budget = 0;
	cfg->memory_per_uid = 0;
	/* A connection with no session that sends nothing for a minute is a
	 * leftover; a frame whose first byte came must be whole in 10 s (a
	 * 16 MiB frame over a Unix socket takes milliseconds). */
	cfg->idle_timeout = 60;
	cfg->frame_timeout = 10;
	/* Slots are depth + 2; 256 deep is far more than any pipeline needs
	 * (the honest probe settles at tens), and caps a session's slot
	 * table at a few hundred entries. */
	cfg->depth_limit = 256;
	/* A 16 GiB order (and as much again while the next epoch's is built
	 * ahead): far above ImageNet's 1.3M or a 10B-token corpus's 10M
	 * windows, and far below what one client may make the daemon take. */
	cfg->max_epoch_picks = 2ULL << 30;
	cfg->max_frame = 16ULL << 20;
	cfg->depth = 4;
	cfg->max_depth = 16;
	/* A sweep's trainers step at nearly the same pace; a few batches
	 * cover the jitter of processes time-sliced on one GPU, and each
	 * batch of lag is one more slot the group holds. */
	cfg->share_lag = 4;
	cfg->ipc = strdup("fd");
	cfg->read = CONFIG_READ_MMAP;
	cfg->reserve_frac = 0.10;
	cfg->reserve_min = 2ULL << 30;
	cfg->probe_interval = 5;
	cfg->pool = true;
	cfg->pool_bytes = 0;
	cfg->pool_slab = 256ULL << 20;
	cfg->pool_linger = CONFIG_POOL_LINGER_DEFAULT;
	/* 16 orders of 2M picks, or one of 32M: the shuffles of a node's
	 * restarted trainers (ahead.h), at a small part of a training
	 * node's memory. */
	cfg->kept_order_bytes = 256ULL << 20;
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

	if (!config_keys_ordered(&st, K_DEPTH, cfg->depth, K_MAX_DEPTH, cfg->max_depth) ||
	    !config_keys_ordered(&st, K_MAX_DEPTH, cfg->max_depth, K_DEPTH_LIMIT,
				 cfg->depth_limit) ||
	    (cfg->memory_budget && !config_keys_ordered(&st, K_MEMORY_PER_UID, cfg->memory_per_uid,
							K_MEMORY_BUDGET, cfg->memory_budget))) {
		rc = st.rc;
		goto out;
	}
	/* [daemon] may come after the datasets, so the copy waits for EOF. */
	for (size_t d = 0; d < cfg->ndatasets; d++)
		if (!cfg->datasets[d].read_set)
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
