/*
 * daemon.c — the daemon's process-wide state (daemon.h): its datasets, and
 * reloading them from the configuration file without touching sessions.
 * Kept out of main.c so unit tests link it with the daemon core.
 *
 * DESIGN: loop thread only.  Datasets are separate allocations because
 * sessions and pools borrow them: a reload never moves or frees a dataset a
 * session still reads.  One taken out of the configuration moves to
 * `retired` and is freed when its last session has gone and its pools
 * have nothing left on a transfer thread (checked again on every tick).
 * A reload also loads anew a dataset declared as before when a file behind
 * it changed on disk, or its shard patterns match other files: a stat,
 * fstat and header read per file, and the globs, as loading does.
 */
#include "state/daemon.h"

#include <errno.h>
#include <sched.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "gpu/pool.h"

struct dataset *daemon_dataset(const struct daemon *d, const char *name)
{
	for (size_t i = 0; i < d->ndatasets; i++)
		if (strcmp(d->datasets[i]->name, name) == 0)
			return d->datasets[i];
	return NULL;
}

/* A dataset loaded from its declaration (kept with its error if the load
 * failed); NULL only when out of memory. */
static struct dataset *load_one(const struct config_dataset *decl)
{
	struct dataset *ds = calloc(1, sizeof(*ds));

	if (!ds)
		return NULL;
	if (ds_load(ds, decl) == 0)
		log_info("dataset %s: %" PRIu64 " samples of %" PRIu64 " bytes in %zu field(s)",
			 ds->name, ds->num_samples, ds->sample_bytes, ds->nfields);
	else
		log_err("dataset %s is not available: %s", ds->name, ds->error);
	return ds;
}

void daemon_load_datasets(struct daemon *d)
{
	d->ndatasets = d->cfg.ndatasets;
	d->datasets = calloc(d->ndatasets ? d->ndatasets : 1, sizeof(*d->datasets));
	if (!d->datasets)
		fatal("out of memory");
	for (size_t i = 0; i < d->ndatasets; i++) {
		d->datasets[i] = load_one(&d->cfg.datasets[i]);
		if (!d->datasets[i])
			fatal("out of memory");
	}
}

static void free_dataset(struct dataset *ds)
{
	ds_close(ds);
	free(ds);
}

/* Frees the retired datasets nobody reads any more. */
static void collect_retired(struct daemon *d)
{
	size_t k = 0;

	for (size_t i = 0; i < d->nretired; i++) {
		struct dataset *ds = d->retired[i];

		if (ds->users == 0 && pool_forget(&d->pools, ds)) {
			log_info("dataset %s: last session gone, files closed", ds->name);
			free_dataset(ds);
		} else {
			d->retired[k++] = ds;
		}
	}
	d->nretired = k;
}

void daemon_dataset_hold(struct dataset *ds)
{
	ds->users++;
}

void daemon_dataset_put(struct daemon *d, struct dataset *ds)
{
	if (--ds->users == 0 && ds->retired)
		collect_retired(d);
}

void daemon_free_datasets(struct daemon *d)
{
	for (size_t i = 0; i < d->ndatasets; i++)
		free_dataset(d->datasets[i]);
	for (size_t i = 0; i < d->nretired; i++)
		free_dataset(d->retired[i]);
	free(d->datasets);
	free(d->retired);
	d->datasets = d->retired = NULL;
	d->ndatasets = d->nretired = 0;
}

static bool same_strings(char *const *a, size_t na, char *const *b, size_t nb)
{
	if (na != nb)
		return false;
	for (size_t i = 0; i < na; i++)
		if (strcmp(a[i], b[i]) != 0)
			return false;
	return true;
}

/* Two declarations that load the same dataset (the pool setting aside:
 * that one applies to a loaded dataset in place). */
static bool same_decl(const struct config_dataset *a, const struct config_dataset *b)
{
	if (strcmp(a->format, b->format) != 0 || a->nfields != b->nfields || a->read != b->read)
		return false;
	for (size_t f = 0; f < a->nfields; f++)
		if (strcmp(a->fields[f].name, b->fields[f].name) != 0 ||
		    !same_strings(a->fields[f].paths, a->fields[f].npaths, b->fields[f].paths,
				  b->fields[f].npaths))
			return false;
	return true;
}

static const struct config_dataset *find_decl(const struct config *cfg, const char *name)
{
	for (size_t i = 0; i < cfg->ndatasets; i++)
		if (strcmp(cfg->datasets[i].name, name) == 0)
			return &cfg->datasets[i];
	return NULL;
}

/* Appends to summary, as "a, b" lists do. */
static void say(char *summary, size_t len, const char *fmt, const char *name)
{
	size_t n = strlen(summary);

	if (n + 2 < len)
		snprintf(summary + n, len - n, fmt, n ? "; " : "", name);
}

/* Keys a running daemon cannot take over without a restart. */
static void restart_keys(const struct config *old, const struct config *cfg, bool socket_override,
			 char *summary, size_t len)
{
	if ((!socket_override && strcmp(old->socket_path, cfg->socket_path)) ||
	    old->socket_mode != cfg->socket_mode ||
	    (old->socket_group == NULL) != (cfg->socket_group == NULL) ||
	    (old->socket_group && strcmp(old->socket_group, cfg->socket_group)))
		say(summary, len, "%ssocket settings changed: %s", "they take effect at restart");
	if (old->readers != cfg->readers || old->ring_bytes != cfg->ring_bytes ||
	    old->arena_bytes != cfg->arena_bytes || old->max_frame != cfg->max_frame)
		say(summary, len, "%sreaders/ring_bytes/arena_bytes/max_frame changed: %s",
		    "they take effect at restart");
}

void daemon_dataset_changed(struct dataset *ds, const char *why)
{
	if (ds->changed[0])
		return; /* the first change found is the one its sessions hear of */
	snprintf(ds->changed, sizeof(ds->changed), "%s" DS_CHANGED_FIX, why);
	log_warn("dataset %s: %s", ds->name, ds->changed);
}

/*
 * Whether ds, declared as before, must still be loaded anew: a file behind
 * it changed on disk (found now, or by a reader since: ds->changed), or its
 * shard patterns match other files.  A changed file also ends the epochs of
 * ds's sessions (daemon_dataset_changed); new matches do not, since what
 * those sessions read is still what they opened.  why says which.
 */
static bool files_changed(struct dataset *ds, const struct config_dataset *decl, char *why,
			  size_t len)
{
	if (ds->changed[0]) {
		snprintf(why, len, "%s", ds->changed);
		return true;
	}
	if (ds_files_changed(ds, why, len)) {
		daemon_dataset_changed(ds, why);
		return true;
	}
	return ds_matches_changed(ds, decl, why, len);
}

int daemon_reload(struct daemon *d, char *summary, size_t len, char *err, size_t errlen)
{
	struct config cfg;
	struct dataset **next;
	size_t n = 0;
	int rc;

	summary[0] = '\0';
	rc = config_load(d->config_path, &cfg, err, errlen);
	if (rc)
		return rc;
	next = calloc(cfg.ndatasets ? cfg.ndatasets : 1, sizeof(*next));
	if (!next) {
		config_free(&cfg);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	/* Kept or replaced, in the new order. */
	for (size_t i = 0; i < cfg.ndatasets; i++) {
		const struct config_dataset *decl = &cfg.datasets[i];
		const struct config_dataset *was = find_decl(&d->cfg, decl->name);
		struct dataset *cur = daemon_dataset(d, decl->name);
		char why[sizeof(cur->changed)] = "";

		if (cur && was && same_decl(was, decl) && !cur->error[0] &&
		    !files_changed(cur, decl, why, sizeof(why))) {
			next[n++] = cur;
			continue;
		}
		next[n] = load_one(decl);
		if (!next[n])
			goto nomem;
		if (why[0]) {
			char what[sizeof(why) + 64];

			snprintf(what, sizeof(what), "%s reloaded: %s", decl->name, why);
			say(summary, len, "%sdataset %s", what);
		} else {
			say(summary, len, cur ? "%sdataset %s reloaded" : "%sdataset %s added",
			    decl->name);
		}
		n++;
	}
	/* Room to retire every old dataset, so that nothing below can fail
	 * once the switch has begun. */
	{
		struct dataset **r =
			realloc(d->retired, (d->nretired + d->ndatasets + 1) * sizeof(*r));

		if (!r)
			goto nomem;
		d->retired = r;
	}
	/* Old ones not kept: retired (freed once unused). */
	for (size_t i = 0; i < d->ndatasets; i++) {
		struct dataset *ds = d->datasets[i];
		bool kept = false;

		for (size_t k = 0; k < n && !kept; k++)
			kept = next[k] == ds;
		if (kept)
			continue;
		if (!find_decl(&cfg, ds->name))
			say(summary, len, "%sdataset %s removed", ds->name);
		ds->retired = true;
		d->retired[d->nretired++] = ds;
	}
	daemon_config_machine(&cfg, NULL, 0);
	restart_keys(&d->cfg, &cfg, d->socket_override, summary, len);
	/* The running values of the restart-only keys stay. */
	cfg.readers = d->cfg.readers;
	cfg.ring_bytes = d->cfg.ring_bytes;
	cfg.arena_bytes = d->cfg.arena_bytes;
	cfg.max_frame = d->cfg.max_frame;
	cfg.socket_mode = d->cfg.socket_mode;
	free(cfg.socket_path);
	cfg.socket_path = d->cfg.socket_path;
	d->cfg.socket_path = NULL;
	free(cfg.socket_group);
	cfg.socket_group = d->cfg.socket_group;
	d->cfg.socket_group = NULL;
	config_free(&d->cfg);
	d->cfg = cfg;
	free(d->datasets);
	d->datasets = next;
	d->ndatasets = n;
	/* Pools of kept datasets follow the (maybe changed) pool settings;
	 * the limits apply to what is taken from now on. */
	daemon_config_pools(d);
	daemon_config_quota(d);
	collect_retired(d);
	if (!summary[0])
		snprintf(summary, len, "no dataset changed");
	return 0;
nomem:
	/* Nothing is switched yet: new loads are freed, the old set stays. */
	for (size_t k = 0; k < n; k++) {
		bool old = false;

		for (size_t i = 0; i < d->ndatasets && !old; i++)
			old = d->datasets[i] == next[k];
		if (!old)
			free_dataset(next[k]);
	}
	free(next);
	config_free(&cfg);
	snprintf(err, errlen, "out of memory");
	return -ENOMEM;
}

bool daemon_pool_enabled(const struct daemon *d, const struct dataset *ds)
{
	const struct config_dataset *decl = find_decl(&d->cfg, ds->name);

	if (decl && decl->pool != CONFIG_POOL_DEFAULT)
		return decl->pool == CONFIG_POOL_ON;
	return d->cfg.pool;
}

double daemon_pool_linger(const struct daemon *d, const struct dataset *ds)
{
	const struct config_dataset *decl = find_decl(&d->cfg, ds->name);

	return decl && decl->pool_linger_set ? decl->pool_linger : d->cfg.pool_linger;
}

uint64_t daemon_fill_bytes(const struct daemon *d)
{
	long l3;

	if (d->cfg.fill_bytes)
		return d->cfg.fill_bytes;
	/* The slots the readers rewrite stay in the last-level cache while
	 * all sessions' read-ahead fits a quarter of it (the rows they read
	 * pass through it too): on the H100 machine (300 MiB L3), 4 sessions
	 * of 5 MiB batches 4 deep (80 MiB) delivered 51 GB/s against 41 at
	 * 16 deep, the readers' CPU per GB down from 0.32 to 0.19 s; half
	 * the L3 left 8 sessions at 0.79 of the pinned limit, a quarter at
	 * 0.86 (bench/NOTES.md, runs 66-68). */
	l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
	if (l3 <= 0)
		return 64ULL << 20;
	return (uint64_t)l3 / 4 > (32ULL << 20) ? (uint64_t)l3 / 4 : 32ULL << 20;
}

void daemon_config_pools(struct daemon *d)
{
	d->pools.cfg.slab_bytes = d->cfg.pool_slab;
	d->pools.cfg.cap_bytes = d->cfg.pool_bytes;
	/* Slabs are exported so that clients gather in their own context;
	 * new slabs follow a reloaded `ipc`, old ones keep their kind. */
	d->pools.cfg.slab_ipc =
		d->cfg.ipc && strcmp(d->cfg.ipc, "legacy") == 0 ? GPU_IPC_LEGACY : GPU_IPC_FD;
	for (struct pool *p = d->pools.head; p; p = p->next) {
		bool on = !p->ds->retired && daemon_pool_enabled(d, p->ds);

		if (p->ds->retired || on == p->enabled)
			continue;
		log_info("pool %s on cuda:%d: %s by the reloaded configuration", p->ds->name,
			 p->gpu, on ? "on" : "off");
		pool_set_enabled(p, on);
	}
}

/* The memory this process may use: MemTotal, or its cgroup's limit when
 * lower (cgroup v2 memory.max, else v1 memory.limit_in_bytes).  0 when
 * neither can be read. */
static uint64_t memory_limit(char *why, size_t len)
{
	char line[512], path[600];
	uint64_t total = 0, cg = 0;
	FILE *f = fopen("/proc/meminfo", "re");

	if (f) {
		while (fgets(line, sizeof(line), f))
			if (sscanf(line, "MemTotal: %" SCNu64 " kB", &total) == 1)
				break;
		fclose(f);
		total *= 1024;
	}
	f = fopen("/proc/self/cgroup", "re");
	while (f && fgets(line, sizeof(line), f)) {
		char *cgpath = strrchr(line, ':');
		const char *file = strncmp(line, "0::", 3) == 0 ? "memory.max" : NULL;
		FILE *m;

		if (!file && strstr(line, ":memory:"))
			file = "memory.limit_in_bytes";
		if (!file || !cgpath)
			continue;
		cgpath[strcspn(cgpath, "\n")] = '\0';
		snprintf(path, sizeof(path), "/sys/fs/cgroup%s%s/%s",
			 file[7] == 'm' ? "" : "/memory", cgpath + 1, file);
		m = fopen(path, "re");
		if (m) {
			if (fscanf(m, "%" SCNu64, &cg) != 1)
				cg = 0; /* "max": no limit */
			fclose(m);
		}
		if (cg)
			break;
	}
	if (f)
		fclose(f);
	if (cg && (!total || cg < total)) {
		snprintf(why, len, "cgroup limit %.1f GiB", cg / 1073741824.0);
		return cg;
	}
	snprintf(why, len, "MemTotal %.1f GiB", total / 1073741824.0);
	return total;
}

void daemon_config_machine(struct config *cfg, char *why, size_t len)
{
	char memwhy[100] = "";
	cpu_set_t set;
	int cpus = 0;
	uint64_t mem, ring;
	char rwhy[100] = "", bwhy[140] = "";

	if (!cfg->readers) {
		cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 0;
		if (cpus <= 0)
			cpus = (int)sysconf(_SC_NPROCESSORS_ONLN);
		/* All but a fifth of the CPUs (at least 2 left for the trainer,
		 * the loop and the transfer threads): 13 on the 16-core H200,
		 * where the sweep of bench/train_step.py put 13 readers first
		 * in every call of run 22 (16 were slower again), and where,
		 * since the client copies and gathers itself, 13 readers cost
		 * a compute-bound step +0.84% against 4's +0.65% (run 21,
		 * bench/NOTES.md). */
		cfg->readers = cpus >= 4 ? (unsigned)(cpus - (cpus / 5 > 2 ? cpus / 5 : 2)) : 2;
		if (cfg->readers > 32)
			cfg->readers = 32;
		snprintf(rwhy, sizeof(rwhy), "readers = %u (auto: %d usable CPUs)", cfg->readers,
			 cpus);
	}
	if (!cfg->ring_bytes) {
		mem = memory_limit(memwhy, sizeof(memwhy));
		ring = mem / 256;
		if (ring < (256ULL << 20))
			ring = 256ULL << 20;
		if (ring > (1ULL << 30))
			ring = 1ULL << 30;
		cfg->ring_bytes = ring & ~((2ULL << 20) - 1);
		snprintf(bwhy, sizeof(bwhy), "ring_bytes = %.0f MiB (auto: 1/256 of %s)",
			 cfg->ring_bytes / 1048576.0, mem ? memwhy : "an unknown total");
	}
	if (why && len)
		snprintf(why, len, "%s%s%s", rwhy, rwhy[0] && bwhy[0] ? ", " : "", bwhy);
}

void daemon_config_quota(struct daemon *d)
{
	const struct config *cfg = &d->cfg;
	struct quota_limits *l = &d->quota.lim;

	l->all[QUOTA_MEMORY] = cfg->memory_budget;
	if (!l->all[QUOTA_MEMORY]) {
		char why[100];
		uint64_t mem = memory_limit(why, sizeof(why));

		/* Half: the daemon's own memory (datasets' mapped pages, the
		 * pinned ring) and the machine's other work need the rest. */
		l->all[QUOTA_MEMORY] = mem ? mem / 2 : 4ULL << 30;
		snprintf(d->quota_why, sizeof(d->quota_why), "auto: half of %s",
			 mem ? why : "an unknown total (4 GiB assumed)");
	} else {
		snprintf(d->quota_why, sizeof(d->quota_why), "memory_budget");
	}
	l->per_uid[QUOTA_MEMORY] =
		cfg->memory_per_uid ? cfg->memory_per_uid : l->all[QUOTA_MEMORY] / 2;
	if (l->per_uid[QUOTA_MEMORY] > l->all[QUOTA_MEMORY])
		l->per_uid[QUOTA_MEMORY] = l->all[QUOTA_MEMORY];
	l->all[QUOTA_CONNS] = cfg->max_conns;
	l->per_uid[QUOTA_CONNS] = cfg->max_conns_per_uid;
	l->all[QUOTA_SESSIONS] = cfg->max_sessions;
	l->per_uid[QUOTA_SESSIONS] = cfg->max_sessions_per_uid;
}

void daemon_collect(struct daemon *d)
{
	if (d->nretired)
		collect_retired(d);
}
