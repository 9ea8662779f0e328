/*
 * test_config.c — the daemon's INI file: defaults, every key, relative
 * paths, sizes, and one message per kind of mistake, each naming file:line.
 *
 * Every case writes a real file into a fresh temporary directory and loads
 * it with config_load, the same call the daemon makes.
 */
#include <errno.h>
#include <ftw.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* config_int.h's fail() is the parser's; cmocka's is defined below. */
#include "conf/config_int.h" /* config_daemon_keys: every [daemon] key */
#undef fail

#include <cmocka.h>

#include "conf/config.h"

struct fixture {
	char dir[64];	     /* mkdtemp'd */
	char real[PATH_MAX]; /* realpath of dir: what relative paths resolve against */
	char path[PATH_MAX]; /* dir/cfg.ini */
	char err[512];
	struct config cfg;
};

static int setup(void **state)
{
	struct fixture *fx = calloc(1, sizeof(*fx));

	if (!fx)
		return -1;
	strcpy(fx->dir, "/tmp/pf-test-config-XXXXXX");
	if (!mkdtemp(fx->dir) || !realpath(fx->dir, fx->real)) {
		free(fx);
		return -1;
	}
	snprintf(fx->path, sizeof(fx->path), "%s/cfg.ini", fx->dir);
	*state = fx;
	return 0;
}

static int remove_entry(const char *p, const struct stat *sb, int type, struct FTW *ftw)
{
	return remove(p);
}

static int teardown(void **state)
{
	struct fixture *fx = *state;

	config_free(&fx->cfg);
	nftw(fx->dir, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
	free(fx);
	return 0;
}

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	assert_non_null(f);
	assert_int_equal(fputs(text, f) >= 0, 1);
	assert_int_equal(fclose(f), 0);
}

static int load_text(struct fixture *fx, const char *text)
{
	write_file(fx->path, text);
	return config_load(fx->path, &fx->cfg, fx->err, sizeof(fx->err));
}

static bool uid_allowed(const struct config *cfg, uid_t uid)
{
	size_t i;

	for (i = 0; i < cfg->n_allow_uids; i++)
		if (cfg->allow_uids[i] == uid)
			return true;
	return false;
}

static void defaults_are_the_documented_values(void **state)
{
	struct fixture *fx = *state;
	struct config *cfg = &fx->cfg;

	config_defaults(cfg);
	assert_string_equal(cfg->socket_path, "/run/prefetchd/prefetchd.sock");
	assert_int_equal(cfg->socket_mode, 0660);
	assert_null(cfg->socket_group);
	/* auto: the daemon sizes them from the machine (daemon_config_machine). */
	assert_int_equal(cfg->readers, 0);
	assert_int_equal(cfg->ring_bytes, 0);
	assert_int_equal(cfg->arena_bytes, 256ULL << 20);
	assert_int_equal(cfg->session_bytes, 2ULL << 30);
	assert_int_equal(cfg->max_sessions, 64);
	assert_int_equal(cfg->max_epoch_picks, 2ULL << 30);
	assert_int_equal(cfg->max_frame, 16ULL << 20);
	assert_int_equal(cfg->depth, 4);
	assert_int_equal(cfg->max_depth, 16);
	assert_int_equal(cfg->share_lag, 4);
	assert_string_equal(cfg->ipc, "fd");
	assert_int_equal(cfg->read, CONFIG_READ_MMAP);
	assert_true(cfg->reserve_frac == 0.10);
	assert_int_equal(cfg->reserve_min, 2ULL << 30);
	assert_true(cfg->probe_interval == 5.0);
	assert_true(cfg->pool);
	assert_int_equal(cfg->pool_bytes, 0);
	assert_int_equal(cfg->pool_slab, 256ULL << 20);
	assert_false(cfg->allow_any);
	assert_int_equal(cfg->ndatasets, 0);
	/* No allow keys: the daemon's own uid and root. */
	assert_true(uid_allowed(cfg, getuid()));
	assert_true(uid_allowed(cfg, 0));
	assert_int_equal(cfg->n_allow_uids, getuid() == 0 ? 1 : 2);
	assert_int_equal(cfg->n_allow_gids, 0);
}

static void file_of_comments_keeps_the_defaults(void **state)
{
	struct fixture *fx = *state;

	assert_int_equal(load_text(fx, "; nothing here\n# nor here\n\n[daemon]\n"), 0);
	assert_string_equal(fx->err, "");
	assert_int_equal(fx->cfg.readers, 0);
	assert_string_equal(fx->cfg.socket_path, "/run/prefetchd/prefetchd.sock");
	config_free(&fx->cfg);
	assert_int_equal(load_text(fx, "[daemon]\nreaders = auto\nring_bytes = auto\n"), 0);
	assert_int_equal(fx->cfg.readers, 0);
	assert_int_equal(fx->cfg.ring_bytes, 0);
	assert_true(uid_allowed(&fx->cfg, getuid()));
	assert_true(uid_allowed(&fx->cfg, 0));
}

static void full_file_sets_every_key(void **state)
{
	struct fixture *fx = *state;
	struct config *cfg = &fx->cfg;
	const struct config_dataset *a, *b;

	assert_int_equal(load_text(fx, "[daemon]\n"
				       "socket = /tmp/pf/test.sock\n"
				       "socket_mode = 0600\n"
				       "socket_group = root          ; inline comment\n"
				       "readers = 12\n"
				       "ring_bytes = 1G\n"
				       "arena_bytes = 64M\n"
				       "session_bytes = 3G\n"
				       "max_sessions = 7\n"
				       "max_epoch_picks = 5000000000\n"
				       "max_frame = 1048576\n"
				       "allow_users = root, 1001\n"
				       "allow_groups = root,4242\n"
				       "depth = 6\n"
				       "max_depth = 30\n"
				       "ipc = legacy\n"
				       "read = pread\n"
				       "reserve = 15%\n"
				       "reserve_min = 512M\n"
				       "probe_interval = 2.5\n"
				       "\n"
				       "[dataset.imagenet]\n"
				       "format = npy\n"
				       "field.x = /data/x-0.npy, /data/x-1.npy ,/data/x-2.npy\n"
				       "field.y = /data/y.npy\n"
				       "[dataset.tiny]\n"
				       "field.tokens = /t/a.npy,\n"
				       "    /t/b.npy\n"
				       "\t/t/c.npy\n"),
			 0);
	assert_string_equal(cfg->socket_path, "/tmp/pf/test.sock");
	assert_int_equal(cfg->socket_mode, 0600);
	assert_string_equal(cfg->socket_group, "root");
	assert_int_equal(cfg->readers, 12);
	assert_int_equal(cfg->ring_bytes, 1ULL << 30);
	assert_int_equal(cfg->arena_bytes, 64ULL << 20);
	assert_int_equal(cfg->session_bytes, 3ULL << 30);
	assert_int_equal(cfg->max_sessions, 7);
	assert_int_equal(cfg->max_epoch_picks, 5000000000ULL);
	assert_int_equal(cfg->max_frame, 1048576);
	assert_false(cfg->allow_any);
	assert_int_equal(cfg->n_allow_uids, 2);
	assert_int_equal(cfg->allow_uids[0], 0);
	assert_int_equal(cfg->allow_uids[1], 1001);
	assert_int_equal(cfg->n_allow_gids, 2);
	assert_int_equal(cfg->allow_gids[0], 0);
	assert_int_equal(cfg->allow_gids[1], 4242);
	assert_int_equal(cfg->depth, 6);
	assert_int_equal(cfg->max_depth, 30);
	assert_string_equal(cfg->ipc, "legacy");
	assert_int_equal(cfg->read, CONFIG_READ_PREAD);
	assert_true(cfg->reserve_frac == 0.15);
	assert_int_equal(cfg->reserve_min, 512ULL << 20);
	assert_true(cfg->probe_interval == 2.5);

	assert_int_equal(cfg->ndatasets, 2);
	a = &cfg->datasets[0];
	assert_string_equal(a->name, "imagenet");
	assert_string_equal(a->format, "npy");
	assert_int_equal(a->nfields, 2);
	assert_string_equal(a->fields[0].name, "x");
	assert_int_equal(a->fields[0].npaths, 3);
	assert_string_equal(a->fields[0].paths[0], "/data/x-0.npy");
	assert_string_equal(a->fields[0].paths[1], "/data/x-1.npy");
	assert_string_equal(a->fields[0].paths[2], "/data/x-2.npy");
	assert_string_equal(a->fields[1].name, "y");
	assert_int_equal(a->fields[1].npaths, 1);
	assert_string_equal(a->fields[1].paths[0], "/data/y.npy");
	assert_int_equal(a->read, CONFIG_READ_PREAD);

	/* No format key: npy.  Continuation lines extend the shard list. */
	b = &cfg->datasets[1];
	assert_string_equal(b->name, "tiny");
	assert_string_equal(b->format, "npy");
	assert_int_equal(b->nfields, 1);
	assert_string_equal(b->fields[0].name, "tokens");
	assert_int_equal(b->fields[0].npaths, 3);
	assert_string_equal(b->fields[0].paths[0], "/t/a.npy");
	assert_string_equal(b->fields[0].paths[1], "/t/b.npy");
	assert_string_equal(b->fields[0].paths[2], "/t/c.npy");
	assert_int_equal(b->read, CONFIG_READ_PREAD);
}

/* ds_load takes the read method from each declaration: [daemon] read must
 * reach datasets declared before [daemon] too. */
static void read_method_reaches_every_dataset(void **state)
{
	struct fixture *fx = *state;

	assert_int_equal(load_text(fx, "[dataset.a]\nfield.x = /a.npy\n"
				       "[daemon]\nread = pread\n"
				       "[dataset.b]\nfield.x = /b.npy\n"),
			 0);
	assert_int_equal(fx->cfg.read, CONFIG_READ_PREAD);
	assert_int_equal(fx->cfg.datasets[0].read, CONFIG_READ_PREAD);
	assert_int_equal(fx->cfg.datasets[1].read, CONFIG_READ_PREAD);
	config_free(&fx->cfg);
	assert_int_equal(load_text(fx, "[daemon]\nread = mmap\n[dataset.a]\nfield.x = /a.npy\n"),
			 0);
	assert_int_equal(fx->cfg.datasets[0].read, CONFIG_READ_MMAP);
}

static void pool_keys_set_the_daemon_default_and_each_dataset_override(void **state)
{
	struct fixture *fx = *state;

	assert_int_equal(load_text(fx, "[daemon]\npool = off\npool_bytes = 40G\npool_slab = 64M\n"
				       "[dataset.a]\nfield.x = /a.npy\npool = on\n"
				       "[dataset.b]\nfield.x = /b.npy\n"),
			 0);
	assert_false(fx->cfg.pool);
	assert_int_equal(fx->cfg.pool_bytes, 40ULL << 30);
	assert_int_equal(fx->cfg.pool_slab, 64ULL << 20);
	assert_int_equal(fx->cfg.datasets[0].pool, CONFIG_POOL_ON);
	assert_int_equal(fx->cfg.datasets[1].pool, CONFIG_POOL_DEFAULT);
	config_free(&fx->cfg);
	assert_int_equal(load_text(fx, "[daemon]\npool_bytes = auto\n"), 0);
	assert_int_equal(fx->cfg.pool_bytes, 0);
}

static void relative_paths_resolve_against_the_config_directory(void **state)
{
	struct fixture *fx = *state;
	char sub[PATH_MAX], path[PATH_MAX], want[PATH_MAX * 2], cwd[PATH_MAX];

	snprintf(sub, sizeof(sub), "%s/etc", fx->dir);
	assert_int_equal(mkdir(sub, 0700), 0);
	snprintf(path, sizeof(path), "%s/etc/pf.ini", fx->dir);
	write_file(path, "[daemon]\n"
			 "socket = run/pf.sock\n"
			 "[dataset.d]\n"
			 "field.x = data/x.npy, /abs/x1.npy, ../up.npy\n");

	/* Load it through a relative name from another directory: the result
	 * must not depend on the working directory. */
	assert_non_null(getcwd(cwd, sizeof(cwd)));
	assert_int_equal(chdir(fx->dir), 0);
	assert_int_equal(config_load("etc/pf.ini", &fx->cfg, fx->err, sizeof(fx->err)), 0);
	assert_int_equal(chdir(cwd), 0);

	snprintf(want, sizeof(want), "%s/etc/run/pf.sock", fx->real);
	assert_string_equal(fx->cfg.socket_path, want);
	assert_int_equal(fx->cfg.datasets[0].fields[0].npaths, 3);
	snprintf(want, sizeof(want), "%s/etc/data/x.npy", fx->real);
	assert_string_equal(fx->cfg.datasets[0].fields[0].paths[0], want);
	assert_string_equal(fx->cfg.datasets[0].fields[0].paths[1], "/abs/x1.npy");
	snprintf(want, sizeof(want), "%s/etc/../up.npy", fx->real);
	assert_string_equal(fx->cfg.datasets[0].fields[0].paths[2], want);
}

static void sizes_take_binary_suffixes(void **state)
{
	static const struct {
		const char *text;
		uint64_t bytes;
	} good[] = {
		{"0", 0},
		{"4096", 4096},
		{"1K", 1024},
		{"1k", 1024},
		{"256M", 256ULL << 20},
		{"2G", 2ULL << 30},
		{"3T", 3ULL << 40},
		{"16777215T", 16777215ULL << 40},
		{"18446744073709551615", UINT64_MAX},
	};
	static const char *const bad[] = {
		"",
		"K",
		"1.5G",
		"12KB",
		"-1",
		"+1",
		" 1",
		"1 K",
		"0x10",
		"16777216T",
		"18446744073709551616",
		"1P",
	};
	uint64_t v;
	size_t i;

	for (i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		v = 12345;
		assert_int_equal(config_parse_size(good[i].text, &v), 0);
		assert_int_equal(v, good[i].bytes);
	}
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		v = 12345;
		assert_int_equal(config_parse_size(bad[i], &v), -EINVAL);
		assert_int_equal(v, 12345);
	}
	(void)state;
}

static void reserve_as_a_size_is_the_minimum(void **state)
{
	struct fixture *fx = *state;

	assert_int_equal(load_text(fx, "[daemon]\nreserve = 4G\n"), 0);
	assert_true(fx->cfg.reserve_frac == 0);
	assert_int_equal(fx->cfg.reserve_min, 4ULL << 30);
}

static void star_allows_anyone_and_drops_the_implicit_users(void **state)
{
	struct fixture *fx = *state;

	assert_int_equal(load_text(fx, "[daemon]\nallow_users = *\n"), 0);
	assert_true(fx->cfg.allow_any);
	assert_int_equal(fx->cfg.n_allow_uids, 0);
	config_free(&fx->cfg);

	/* Groups alone: no uid is allowed implicitly any more. */
	assert_int_equal(load_text(fx, "[daemon]\nallow_groups = 0\n"), 0);
	assert_false(fx->cfg.allow_any);
	assert_int_equal(fx->cfg.n_allow_uids, 0);
	assert_int_equal(fx->cfg.n_allow_gids, 1);
	assert_int_equal(fx->cfg.allow_gids[0], 0);
}

static void long_shard_lists_fit_on_one_line(void **state)
{
	struct fixture *fx = *state;
	char text[4096], *p = text;
	int i;

	/* 40 paths of ~50 bytes: far past inih's default 200-byte line. */
	p += sprintf(p, "[dataset.big]\nfield.x = ");
	for (i = 0; i < 40; i++)
		p += sprintf(p, "%s/data/some/long/directory/name/shard-%04d.npy", i ? ", " : "",
			     i);
	strcpy(p, "\n");
	assert_int_equal(load_text(fx, text), 0);
	assert_int_equal(fx->cfg.datasets[0].fields[0].npaths, 40);
	assert_string_equal(fx->cfg.datasets[0].fields[0].paths[39],
			    "/data/some/long/directory/name/shard-0039.npy");
}

static void tokens_dataset_takes_shard_patterns_and_seq_len(void **state)
{
	struct fixture *fx = *state;
	const struct config_dataset *ds;

	assert_int_equal(load_text(fx, "[dataset.fineweb]\n"
				       "format = tokens\n"
				       "shards = /data/train_*.bin,\n"
				       "    /data/extra_*.bin\n"
				       "seq_len = 1024\n"),
			 0);
	ds = &fx->cfg.datasets[0];
	assert_string_equal(ds->format, "tokens");
	assert_int_equal(ds->seq_len, 1024);
	assert_int_equal(ds->nfields, 1);
	assert_string_equal(ds->fields[0].name, "tokens");
	assert_int_equal(ds->fields[0].npaths, 2);
	assert_string_equal(ds->fields[0].paths[0], "/data/train_*.bin");
	assert_string_equal(ds->fields[0].paths[1], "/data/extra_*.bin");
}

static void missing_file_is_enoent(void **state)
{
	struct fixture *fx = *state;
	char want[PATH_MAX + 64];

	snprintf(fx->path, sizeof(fx->path), "%s/absent.ini", fx->dir);
	assert_int_equal(config_load(fx->path, &fx->cfg, fx->err, sizeof(fx->err)), -ENOENT);
	snprintf(want, sizeof(want), "cannot open %s: No such file or directory", fx->path);
	assert_string_equal(fx->err, want);
	/* The failed load leaves nothing to free; freeing again is harmless. */
	assert_null(fx->cfg.socket_path);
	config_free(&fx->cfg);
}

/* Each bad file must fail with -EINVAL and a message that starts with
 * "PATH:LINE: " followed by the given text (which names the key). */
static const struct {
	const char *text;
	int line;
	const char *msg;
} bad_files[] = {
	{"[daemon]\nreaders = 2\n[deamon]\nreaders = 3\n", 3, "unknown section [deamon]"},
	{"[daemon]\nreadres = 2\n", 2, "unknown key 'readres' in [daemon]"},
	{"[daemon]\n\nreaders = four\n", 3, "readers: 'four' is not a number"},
	{"[daemon]\nreaders = 0\n", 2, "readers: 0 is out of range (1..256)"},
	{"[daemon]\nreaders = 257\n", 2, "readers: 257 is out of range (1..256)"},
	{"[daemon]\nreaders = -1\n", 2, "readers: '-1' is not a number"},
	{"[daemon]\nreaders = 2\nreaders = 3\n", 3, "readers: duplicate key (first set on line 2)"},
	{"[daemon]\nreaders = 2\n   3\n", 3, "readers: a continuation line"},
	{"[daemon]\nring_bytes = 12Q\n", 2, "ring_bytes: '12Q' is not a size"},
	{"[daemon]\nmax_frame = 2G\n", 2, "max_frame: 2G is out of range"},
	{"[daemon]\nsocket_mode = 0999\n", 2, "socket_mode: '0999' is not an octal mode"},
	{"[daemon]\nsocket_mode = 01777\n", 2, "socket_mode: '01777' is not an octal mode"},
	{"[daemon]\nsocket_group = no-such-group-pf\n", 2,
	 "socket_group: no such group 'no-such-group-pf'"},
	{"[daemon]\nipc = shm\n", 2, "ipc: 'shm' is not fd or legacy"},
	{"[daemon]\n\nread = MMAP\n", 3, "read: 'MMAP' is not mmap, pread or direct"},
	{"[daemon]\ndepth = 0\n", 2, "depth: 0 is out of range"},
	{"[daemon]\ndepth = 8\nmax_depth = 2\n", 3, "max_depth: 2 is below depth = 8"},
	{"[daemon]\ndepth = 32\n", 2, "depth: 32 is above max_depth = 16"},
	{"[daemon]\nreserve = 100%\n", 2, "reserve: 100% is out of range"},
	{"[daemon]\nreserve = lots%\n", 2, "reserve: 'lots' is not a number"},
	{"[daemon]\nreserve = 4G\nreserve_min = 1G\n", 3,
	 "reserve_min: conflicts with reserve = SIZE on line 2"},
	{"[daemon]\nreserve_min = 1G\nreserve = 4G\n", 3,
	 "reserve: a size conflicts with reserve_min on line 2"},
	{"[daemon]\nmax_epoch_picks = 0\n", 2, "max_epoch_picks: must be at least 1"},
	{"[daemon]\nmax_epoch_picks = lots\n", 2, "max_epoch_picks: 'lots' is not a count"},
	{"[daemon]\nprobe_interval = 0\n", 2, "probe_interval: 0 is out of range"},
	{"[daemon]\npool = yes\n", 2, "pool: 'yes' is not on or off"},
	{"[daemon]\npool_slab = 1M\n", 2, "pool_slab: 1M is out of range"},
	{"[daemon]\npool_bytes = lots\n", 2, "pool_bytes: 'lots' is not a size"},
	{"[dataset.a]\nfield.x = /x\npool = maybe\n", 3, "pool: 'maybe' is not on or off"},
	{"[daemon]\nprobe_interval = 5s\n", 2, "probe_interval: '5s' is not a number"},
	{"[daemon]\nallow_users = root, no-such-user-pf\n", 2,
	 "allow_users: no such user 'no-such-user-pf'"},
	{"[daemon]\nallow_users = root,,1\n", 2, "allow_users: empty entry in list"},
	{"[daemon]\nallow_groups = 4294967295\n", 2, "allow_groups: id 4294967295 is out of range"},
	{"[daemon]\nsocket =\n", 2, "socket: empty value"},
	{"readers = 2\n", 1, "readers: key outside any section"},
	{"[daemon]\nreaders 2\n", 2, "expected 'key = value'"},
	{"[daemon\n", 1, "section header without ']'"},
	/* inih's own syntax errors come first, even when keys follow. */
	{"[daemon]\nreaders = 2\n\nbogus line\nreaders = 3\n", 4, "expected 'key = value'"},
	{"[daemon]\nreaders = 2\n[dataset.a\nfield.x = /x\n[daemon]\n", 3,
	 "section header without ']'"},
	{"[daemon]\n= 2\n", 2, "missing key before '='"},
	{"[daemon]\nreaders = 2\n  readers = 3\n", 3, "readers: a continuation line"},
	{"[dataset.a]\nformat = npy\n  npy\nfield.x = /x\n", 3, "format: a continuation line"},
	{"[daemon]\nabcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwx = 1\n", 2,
	 "key 'abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwx' is longer than 49 characters"},
	{"[dataset.abcdefghijklmnopqrstuvwxyzabcdefghijklmnop]\nfield.x = /x\n", 1,
	 "section name 'dataset.abcdefghijklmnopqrstuvwxyzabcdefghijklmno...' is longer than 49 "
	 "characters"},
	/* A section's mistakes name its header, not its first key. */
	{"[daemon]\n[deamon]\n; a comment\n\nreaders = 2\n", 2, "unknown section [deamon]"},
	{"\xEF\xBB\xBF[deamon]\nreaders = 2\n", 1, "unknown section [deamon]"},
	{"[dataset.a]\nfield.x = /x.npy\n[dataset.a]\nfield.y = /y.npy\n", 3,
	 "[dataset.a]: duplicate dataset"},
	/* After a header an indented line is a key, never a continuation. */
	{"[dataset.a]\nfield.x = /x.npy\n[dataset.a]\n  field.y = /y.npy\n", 3,
	 "[dataset.a]: duplicate dataset"},
	{"[dataset.a b]\nfield.x = /x.npy\n", 1, "[dataset.a b]: dataset names use"},
	{"[dataset.a]\nformat = npy\n[dataset.b]\nfield.x = /x\n", 1,
	 "[dataset.a] declares no fields"},
	{"[dataset.a]\nformat = csv\nfield.x = /x\n", 2, "format: 'csv' is not npy or tokens"},
	{"[dataset.t]\nformat = tokens\nseq_len = 8\n", 1,
	 "[dataset.t] is a tokens dataset: give its files as shards = PATTERN (not field.NAME)"},
	{"[dataset.t]\nformat = tokens\nfield.x = /x\nseq_len = 8\n[daemon]\nreaders = 2\n", 1,
	 "[dataset.t] is a tokens dataset: give its files as shards = PATTERN (not field.NAME)"},
	{"[dataset.t]\nformat = tokens\nshards = /t-*.bin\n", 1,
	 "[dataset.t] is a tokens dataset: give seq_len = N (tokens per sample, plus one for the "
	 "target)"},
	{"[dataset.n]\nfield.x = /x\nseq_len = 8\n", 1,
	 "[dataset.n]: shards and seq_len are for format = tokens (npy datasets use field.NAME = "
	 "PATH)"},
	{"[dataset.n]\nshards = /t-*.bin\n", 1, "[dataset.n]: shards and seq_len are for format"},
	{"[dataset.t]\nformat = tokens\nshards = /t-*.bin\nshards = /u-*.bin\n", 4,
	 "shards: duplicate key, or given with field.NAME"},
	{"[dataset.t]\nformat = tokens\nshards = /t-*.bin\nseq_len = 8\n  9\n", 5,
	 "seq_len: a continuation line"},
	{"[dataset.a]\nfield.x = /x\nshape = 3\n", 3,
	 "unknown key 'shape' in [dataset.a] (expected format, pool, pool_linger, read or "
	 "field.NAME)"},
	{"[dataset.a]\nfield.x = /x\nfield.x = /y\n", 3, "field.x: duplicate field"},
	{"[dataset.a]\nfield.x = /a.npy,,/b.npy\n", 2, "field.x: empty shard path in list"},
	{"[dataset.a]\nfield. = /a.npy\n", 2, "field.: field names use"},
	{"[dataset.a]\nfield.x =\n", 2, "field.x: empty value"},
};

static void each_mistake_names_file_line_and_key(void **state)
{
	struct fixture *fx = *state;
	char want[PATH_MAX + 256];
	size_t i;

	for (i = 0; i < sizeof(bad_files) / sizeof(bad_files[0]); i++) {
		int rc = load_text(fx, bad_files[i].text);

		snprintf(want, sizeof(want), "%s:%d: %s", fx->path, bad_files[i].line,
			 bad_files[i].msg);
		if (rc != -EINVAL || strncmp(fx->err, want, strlen(want)) != 0)
			fail_msg("case %zu: rc %d, got \"%s\", want \"%s...\"", i, rc, fx->err,
				 want);
		/* A failed load has already freed everything. */
		assert_null(fx->cfg.socket_path);
		assert_null(fx->cfg.datasets);
	}
}

/* inih's rule for continuation lines: leading whitespace after a key line of
 * the same section; after a header (or at the top) it is a key line. */
static void indented_lines_continue_only_a_key_of_their_section(void **state)
{
	struct fixture *fx = *state;
	const struct config_field *f;
	char want[PATH_MAX + 16];

	assert_int_equal(load_text(fx, "\xEF\xBB\xBF[daemon]\n  readers = 3\n"
				       "[dataset.a]\n"
				       "  field.x = /a.npy,\n"
				       "  [b].npy\n"
				       "; a comment between\n"
				       "\n"
				       "\t/c.npy\n"
				       "[dataset.b]\n"
				       "\tfield.y = /y.npy\n"),
			 0);
	assert_int_equal(fx->cfg.readers, 3);
	assert_int_equal(fx->cfg.ndatasets, 2);
	f = &fx->cfg.datasets[0].fields[0];
	assert_int_equal(fx->cfg.datasets[0].nfields, 1);
	assert_int_equal(f->npaths, 3);
	assert_string_equal(f->paths[0], "/a.npy");
	snprintf(want, sizeof(want), "%s/[b].npy", fx->real);
	assert_string_equal(f->paths[1], want);
	assert_string_equal(f->paths[2], "/c.npy");
	assert_string_equal(fx->cfg.datasets[1].fields[0].name, "y");
}

/* inih keeps 49 bytes of a section name: that many are fine. */
static void section_name_of_49_bytes_is_kept(void **state)
{
	struct fixture *fx = *state;

	assert_int_equal(load_text(fx, "[dataset.abcdefghijklmnopqrstuvwxyzabcdefghijklmno] ; c\n"
				       "field.x = /x.npy\n"),
			 0);
	assert_string_equal(fx->cfg.datasets[0].name, "abcdefghijklmnopqrstuvwxyzabcdefghijklmno");
}

/* inih reports keys, never a header: a section that holds none is not seen,
 * whatever its name. */
static void sections_without_keys_are_ignored(void **state)
{
	struct fixture *fx = *state;

	assert_int_equal(load_text(fx, "[daemon]\n[dataset.z]\n; only a comment\n"
				       "[deamon]\n[dataset.a b]\n"),
			 0);
	assert_string_equal(fx->err, "");
	assert_int_equal(fx->cfg.ndatasets, 0);
}

static void overlong_line_is_refused_with_its_number(void **state)
{
	struct fixture *fx = *state;
	char *text = malloc(8192), want[PATH_MAX + 64];

	assert_non_null(text);
	strcpy(text, "[dataset.a]\nfield.x = /");
	memset(text + strlen(text), 'a', 5000);
	strcpy(text + strlen("[dataset.a]\nfield.x = /") + 5000, "\n");
	assert_int_equal(load_text(fx, text), -EINVAL);
	snprintf(want, sizeof(want), "%s:2: line is longer than", fx->path);
	assert_non_null(strstr(fx->err, want));
	free(text);
}

/* deploy/prefetchd.conf.example (installed next to the README) lists every
 * [daemon] key, and each value it shows commented out is the default: the
 * file loads as it is, and again with those lines uncommented, both times
 * to exactly config_defaults.  Run from the repository's root, as make
 * check does. */
#define EXAMPLE_CONF "deploy/prefetchd.conf.example"

static void assert_same_config(const struct config *a, const struct config *b, const char *what)
{
#define SAME(field)                                                                                \
	do {                                                                                       \
		if (a->field != b->field)                                                          \
			fail_msg("%s: " #field " is %g, the default %g", what, (double)a->field,   \
				 (double)b->field);                                                \
	} while (0)
	assert_string_equal(a->socket_path, b->socket_path);
	assert_string_equal(a->ipc, b->ipc);
	assert_true(a->socket_group == NULL && b->socket_group == NULL);
	SAME(socket_mode);
	SAME(readers);
	SAME(ring_bytes);
	SAME(fill_bytes);
	SAME(arena_bytes);
	SAME(session_bytes);
	SAME(max_sessions);
	SAME(max_sessions_per_uid);
	SAME(max_conns);
	SAME(max_conns_per_uid);
	SAME(memory_budget);
	SAME(memory_per_uid);
	SAME(idle_timeout);
	SAME(frame_timeout);
	SAME(depth_limit);
	SAME(max_epoch_picks);
	SAME(max_frame);
	SAME(allow_any);
	SAME(n_allow_uids);
	SAME(n_allow_gids);
	SAME(depth);
	SAME(max_depth);
	SAME(read);
	SAME(reserve_frac);
	SAME(reserve_min);
	SAME(probe_interval);
	SAME(pool);
	SAME(pool_bytes);
	SAME(pool_slab);
	SAME(pool_linger);
	SAME(kept_order_bytes);
#undef SAME
}

static void the_example_configuration_shows_every_key_with_its_default(void **state)
{
	struct fixture *fx = *state;
	struct config def;
	char line[1024], *text = NULL;
	size_t text_len = 0;
	FILE *in = fopen(EXAMPLE_CONF, "r"), *out;

	if (!in)
		fail_msg("cannot open %s (run from the repository's root)", EXAMPLE_CONF);
	out = open_memstream(&text, &text_len);
	assert_non_null(out);
	/* "; key = value" is a default shown; "; e.g. key = value" is not. */
	while (fgets(line, sizeof(line), in)) {
		size_t name = strspn(line + 2, "abcdefghijklmnopqrstuvwxyz_");

		if (strncmp(line, "; ", 2) == 0 && name && strncmp(line + 2 + name, " = ", 3) == 0)
			fputs(line + 2, out);
		else
			fputs(line, out);
	}
	fclose(in);
	fclose(out);
	for (int k = 0; k < K_COUNT; k++) {
		char shown[80], example[80];

		snprintf(shown, sizeof(shown), "\n%s = ", config_daemon_keys[k]);
		snprintf(example, sizeof(example), "\n; e.g. %s = ", config_daemon_keys[k]);
		if (!strstr(text, shown) && !strstr(text, example))
			fail_msg("%s does not show [daemon] %s", EXAMPLE_CONF,
				 config_daemon_keys[k]);
	}
	config_defaults(&def);

	assert_int_equal(config_load(EXAMPLE_CONF, &fx->cfg, fx->err, sizeof(fx->err)), 0);
	assert_same_config(&fx->cfg, &def, EXAMPLE_CONF);
	config_free(&fx->cfg);

	if (load_text(fx, text) != 0)
		fail_msg("%s with its defaults uncommented: %s", EXAMPLE_CONF, fx->err);
	assert_same_config(&fx->cfg, &def, "the example uncommented");
	assert_int_equal(fx->cfg.ndatasets, 2);
	assert_string_equal(fx->cfg.datasets[0].name, "imagenet");
	assert_string_equal(fx->cfg.datasets[0].format, "npy");
	assert_int_equal(fx->cfg.datasets[0].nfields, 2);
	assert_int_equal(fx->cfg.datasets[0].pool, CONFIG_POOL_ON);
	assert_true(fx->cfg.datasets[0].pool_linger_set);
	assert_true(fx->cfg.datasets[0].pool_linger == def.pool_linger);
	assert_true(fx->cfg.datasets[0].read_set);
	assert_int_equal(fx->cfg.datasets[0].read, def.read);
	assert_string_equal(fx->cfg.datasets[1].name, "fineweb");
	assert_string_equal(fx->cfg.datasets[1].format, "tokens");
	assert_int_equal(fx->cfg.datasets[1].seq_len, 1024);
	config_free(&def);
	free(text);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(defaults_are_the_documented_values, setup,
						teardown),
		cmocka_unit_test_setup_teardown(file_of_comments_keeps_the_defaults, setup,
						teardown),
		cmocka_unit_test_setup_teardown(full_file_sets_every_key, setup, teardown),
		cmocka_unit_test_setup_teardown(read_method_reaches_every_dataset, setup, teardown),
		cmocka_unit_test_setup_teardown(
			pool_keys_set_the_daemon_default_and_each_dataset_override, setup,
			teardown),
		cmocka_unit_test_setup_teardown(relative_paths_resolve_against_the_config_directory,
						setup, teardown),
		cmocka_unit_test(sizes_take_binary_suffixes),
		cmocka_unit_test_setup_teardown(reserve_as_a_size_is_the_minimum, setup, teardown),
		cmocka_unit_test_setup_teardown(star_allows_anyone_and_drops_the_implicit_users,
						setup, teardown),
		cmocka_unit_test_setup_teardown(long_shard_lists_fit_on_one_line, setup, teardown),
		cmocka_unit_test_setup_teardown(tokens_dataset_takes_shard_patterns_and_seq_len,
						setup, teardown),
		cmocka_unit_test_setup_teardown(missing_file_is_enoent, setup, teardown),
		cmocka_unit_test_setup_teardown(each_mistake_names_file_line_and_key, setup,
						teardown),
		cmocka_unit_test_setup_teardown(indented_lines_continue_only_a_key_of_their_section,
						setup, teardown),
		cmocka_unit_test_setup_teardown(section_name_of_49_bytes_is_kept, setup, teardown),
		cmocka_unit_test_setup_teardown(sections_without_keys_are_ignored, setup, teardown),
		cmocka_unit_test_setup_teardown(
			the_example_configuration_shows_every_key_with_its_default, setup,
			teardown),
		cmocka_unit_test_setup_teardown(overlong_line_is_refused_with_its_number, setup,
						teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
