/*
 * test_dataset.c — loading npy datasets and reading samples out of them.
 *
 * Files are written here with the header helper and content function of
 * tools/npygen.h, so byte p of sample s of a field is npygen_byte(seed, s, p)
 * whichever shard holds it; every read is compared against that.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "conf/config.h"
#include "data/dataset.h"
#include "data/direct.h"
#include "npygen.h"
#include "testutil.h"

#define X_SEED 11
#define Y_SEED 22
#define N      1000
/* Field x: f4 rows of (3, 4) in three shards, the middle one a single row,
 * so that runs cross both boundaries. */
#define X_ROW_BYTES 48
#define Y_ROW_BYTES 5
static const uint64_t x_shard_rows[3] = {400, 1, 599};

struct fixture {
	char dir[64];
	char *x_paths[3]; /* owned */
	char *y_paths[1]; /* owned */
	struct config_field fields[2];
	struct config_dataset decl;
};

/* Writes dir/name: a .npy of `rows` rows of shape sample_shape whose row i
 * holds the npygen content of row first_row + i.  Returns the malloc'd path. */
static char *write_npy(struct fixture *fx, const char *name, unsigned version, const char *descr,
		       size_t itemsize, uint64_t seed, uint64_t first_row, uint64_t rows,
		       const uint64_t *sample_shape, int sample_ndim)
{
	uint8_t header[1024];
	uint64_t row_bytes = itemsize, r, p;
	size_t offset;
	uint8_t *row;
	char *path;
	FILE *f;
	int i;

	for (i = 0; i < sample_ndim; i++)
		row_bytes *= sample_shape[i];
	offset = npygen_header(header, sizeof(header), version, descr, rows, sample_shape,
			       sample_ndim);
	assert_true(offset > 0);
	assert_true(asprintf(&path, "%s/%s", fx->dir, name) > 0);
	f = fopen(path, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(header, 1, offset, f), offset);
	row = malloc(row_bytes ? row_bytes : 1);
	assert_non_null(row);
	for (r = first_row; r < first_row + rows; r++) {
		for (p = 0; p < row_bytes; p++)
			row[p] = npygen_byte(seed, r, p);
		assert_int_equal(fwrite(row, 1, row_bytes, f), row_bytes);
	}
	free(row);
	assert_int_equal(fclose(f), 0);
	return path;
}

static const uint64_t x_shape[2] = {3, 4};
static const uint64_t y_shape[1] = {5};

/* The good dataset: x in three shards (versions 1, 3, 1), y in one (v2). */
static void write_good_dataset(struct fixture *fx)
{
	fx->x_paths[0] = write_npy(fx, "x-0.npy", 1, "<f4", 4, X_SEED, 0, 400, x_shape, 2);
	fx->x_paths[1] = write_npy(fx, "x-1.npy", 3, "<f4", 4, X_SEED, 400, 1, x_shape, 2);
	fx->x_paths[2] = write_npy(fx, "x-2.npy", 1, "<f4", 4, X_SEED, 401, 599, x_shape, 2);
	fx->y_paths[0] = write_npy(fx, "y.npy", 2, "|u1", 1, Y_SEED, 0, N, y_shape, 1);
}

static int setup(void **state)
{
	struct fixture *fx = calloc(1, sizeof(*fx));

	if (!fx)
		return -1;
	strcpy(fx->dir, "/tmp/test_dataset.XXXXXX");
	if (!mkdtemp(fx->dir)) {
		free(fx);
		return -1;
	}
	fx->fields[0] = (struct config_field){"x", fx->x_paths, 3};
	fx->fields[1] = (struct config_field){"y", fx->y_paths, 1};
	fx->decl = (struct config_dataset){
		.name = "train", .format = "npy", .fields = fx->fields, .nfields = 2};
	*state = fx;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *fx = *state;
	struct dirent *e;
	char path[512];
	DIR *d = opendir(fx->dir);
	size_t i;

	while (d && (e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%s", fx->dir, e->d_name);
		unlink(path);
	}
	if (d)
		closedir(d);
	rmdir(fx->dir);
	for (i = 0; i < 3; i++)
		free(fx->x_paths[i]);
	free(fx->y_paths[0]);
	free(fx);
	return 0;
}

static int count_open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

	assert_non_null(d);
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

/* Reads both fields of samples[0..n) and compares every byte.  Returns 0,
 * or -1 with why set: no cmocka asserts, so reader threads may call it. */
static int check_reads(const struct dataset *ds, const uint64_t *samples, size_t n, char *why,
		       size_t whylen)
{
	uint8_t *x = malloc(n * X_ROW_BYTES + 1), *y = malloc(n * Y_ROW_BYTES + 1);
	char err[256] = "";
	size_t k, p;
	int rc = -1;

	if (!x || !y) {
		snprintf(why, whylen, "out of memory");
		goto out;
	}
	/* Both kinds of read: plain stores, and the streaming stores of a
	 * slot that a copy engine reads next.  The buffers are poisoned
	 * between them, so the second cannot pass on the first's bytes. */
	for (int next = DS_FOR_CPU; next <= DS_FOR_DMA; next++) {
		memset(x, 0xa5, n * X_ROW_BYTES + 1);
		memset(y, 0xa5, n * Y_ROW_BYTES + 1);
		if (ds_read_field_for(ds, 0, samples, n, x, next, err, sizeof(err)) != 0 ||
		    ds_read_field_for(ds, 1, samples, n, y, next, err, sizeof(err)) != 0) {
			snprintf(why, whylen, "read (%s) failed: %s", next ? "streamed" : "plain",
				 err);
			goto out;
		}
		if (x[n * X_ROW_BYTES] != 0xa5 || y[n * Y_ROW_BYTES] != 0xa5) {
			snprintf(why, whylen, "a read (%s) wrote past its %zu rows",
				 next ? "streamed" : "plain", n);
			goto out;
		}
		for (k = 0; k < n; k++) {
			for (p = 0; p < X_ROW_BYTES; p++) {
				if (x[k * X_ROW_BYTES + p] != npygen_byte(X_SEED, samples[k], p)) {
					snprintf(why, whylen,
						 "x: sample %llu (at %zu) byte %zu differs",
						 (unsigned long long)samples[k], k, p);
					goto out;
				}
			}
			for (p = 0; p < Y_ROW_BYTES; p++) {
				if (y[k * Y_ROW_BYTES + p] != npygen_byte(Y_SEED, samples[k], p)) {
					snprintf(why, whylen,
						 "y: sample %llu (at %zu) byte %zu differs",
						 (unsigned long long)samples[k], k, p);
					goto out;
				}
			}
		}
	}
	rc = 0;
out:
	free(x);
	free(y);
	return rc;
}

static void assert_reads_match(const struct dataset *ds, const uint64_t *samples, size_t n)
{
	char why[512];

	if (check_reads(ds, samples, n, why, sizeof(why)) != 0)
		fail_msg("%s", why);
}

/* A deterministic mix of the lists a reader sees: shuffled picks, long
 * sequential runs (which coalesce, and cross shard boundaries), repeats. */
static size_t random_samples(uint64_t *rng, uint64_t *out, size_t cap)
{
	size_t n = 1 + (size_t)(npygen_mix(++*rng) % cap), k = 0;

	while (k < n) {
		uint64_t r = npygen_mix(++*rng), start = r % N;
		size_t run = 1, i;

		switch ((r >> 32) % 4) {
		case 0: /* a run, often across the 400 / 401 boundaries */
			start = 380 + (r >> 40) % 40;
			/* fallthrough */
		case 1: run = 1 + (size_t)((r >> 48) % 64); break;
		case 2: /* a repeat of the previous pick */
			if (k)
				start = out[k - 1];
			break;
		}
		for (i = 0; i < run && k < n && start + i < N; i++)
			out[k++] = start + i;
	}
	return n;
}

static void two_fields_with_a_sharded_field_read_back_every_byte(void **state)
{
	struct fixture *fx = *state;
	static const uint64_t across[] = {398, 399, 400, 401, 402, 999, 0, 0, 400, 5, 4, 3};
	uint64_t samples[300], rng = 1;
	struct dataset ds;
	int i;

	write_good_dataset(fx);
	assert_int_equal(ds_load(&ds, &fx->decl), 0);
	assert_string_equal(ds.error, "");
	assert_true(ds_check(&ds));
	assert_string_equal(ds.name, "train");
	assert_string_equal(ds.format, "npy");
	assert_int_equal(ds.num_samples, N);
	assert_int_equal(ds.nfields, 2);
	assert_int_equal(ds.sample_bytes, X_ROW_BYTES + Y_ROW_BYTES);
	assert_string_equal(ds.fields[0].name, "x");
	assert_int_equal(ds.fields[0].dtype, NPY_F4);
	assert_int_equal(ds.fields[0].sample_ndim, 2);
	assert_int_equal(ds.fields[0].sample_shape[1], 4);
	assert_int_equal(ds.fields[0].nshards, 3);
	assert_int_equal(ds.fields[0].shards[1].first_row, 400);
	assert_int_equal(ds.fields[0].shards[2].first_row, 401);
	assert_int_equal(ds.fields[0].shards[2].rows, x_shard_rows[2]);
	assert_int_equal(ds.fields[1].dtype, NPY_U1);
	assert_int_equal(ds.fields[1].sample_bytes, Y_ROW_BYTES);
	/* read = mmap is the default: every shard is mapped, so the reads
	 * below go through the mappings. */
	assert_int_equal(ds.fields[0].nmapped, 3);
	assert_int_equal(ds.fields[1].nmapped, 1);
	assert_non_null(ds.fields[0].shards[1].map);
	assert_int_equal(ds.fields[0].shards[2].map_len,
			 ds.fields[0].shards[2].data_offset + x_shard_rows[2] * X_ROW_BYTES);

	assert_reads_match(&ds, across, sizeof(across) / sizeof(across[0]));
	for (i = 0; i < 200; i++) {
		size_t n = random_samples(&rng, samples, 300);

		assert_reads_match(&ds, samples, n);
	}
	/* The whole dataset in order: three runs for x, one for y. */
	{
		uint64_t *all = malloc(N * sizeof(*all));

		assert_non_null(all);
		for (i = 0; i < N; i++)
			all[i] = (uint64_t)i;
		assert_reads_match(&ds, all, N);
		free(all);
	}
	ds_close(&ds);
}

/* 200 lists of random picks, runs across shard boundaries and repeats. */
static void assert_random_reads_match(const struct dataset *ds, uint64_t seed)
{
	uint64_t samples[300], rng = seed;
	int i;

	for (i = 0; i < 200; i++) {
		size_t n = random_samples(&rng, samples, 300);

		assert_reads_match(ds, samples, n);
	}
}

static void pread_mode_maps_nothing_and_reads_every_byte(void **state)
{
	struct fixture *fx = *state;
	struct dataset ds;

	write_good_dataset(fx);
	fx->decl.read = CONFIG_READ_PREAD;
	assert_int_equal(ds_load(&ds, &fx->decl), 0);
	assert_true(ds_check(&ds));
	assert_int_equal(ds.fields[0].nmapped, 0);
	assert_int_equal(ds.fields[1].nmapped, 0);
	assert_null(ds.fields[0].shards[0].map);
	assert_int_equal(ds.fields[0].shards[0].map_rc, 0);
	assert_random_reads_match(&ds, 7);
	ds_close(&ds);
}

/* read = direct: the reads the other modes do, through O_DIRECT (rows of
 * 48 and 5 bytes behind headers of 128 and more bytes: nothing aligned),
 * and a field of rows larger than a block, over more runs than one
 * submission holds.  Once through io_uring (this thread) and once with
 * pread (a thread that starts with PREFETCHD_NO_IO_URING=1). */
struct direct_case {
	const struct dataset *ds;
	uint64_t seed;
	int uring; /* direct_uses_io_uring() afterwards */
	char why[512];
	int rc;
};

#define BIG_ROWS  5000
#define BIG_BYTES 4097
#define BIG_SEED  33

static int big_reads_match(const struct dataset *ds, const uint64_t *samples, size_t n, char *why,
			   size_t len)
{
	uint8_t *b = malloc(n * BIG_BYTES);
	char err[256] = "";
	int rc = 0;

	if (!b || ds_read_field(ds, 0, samples, n, b, err, sizeof(err)) != 0) {
		snprintf(why, len, "big read failed: %s", err);
		free(b);
		return -1;
	}
	for (size_t k = 0; k < n && !rc; k++)
		for (size_t q = 0; q < BIG_BYTES; q++)
			if (b[k * BIG_BYTES + q] != npygen_byte(BIG_SEED, samples[k], q)) {
				snprintf(why, len, "big: sample %llu byte %zu differs",
					 (unsigned long long)samples[k], q);
				rc = -1;
				break;
			}
	free(b);
	return rc;
}

/* Pages of path in the page cache. */
static size_t cached_pages(const char *path)
{
	int fd = open(path, O_RDONLY);
	struct stat st;
	size_t pages, n = 0;
	unsigned char *vec;
	void *m;

	assert_true(fd >= 0 && fstat(fd, &st) == 0);
	pages = ((size_t)st.st_size + 4095) / 4096;
	m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
	vec = malloc(pages);
	assert_true(m != MAP_FAILED && vec);
	assert_int_equal(mincore(m, (size_t)st.st_size, vec), 0);
	for (size_t i = 0; i < pages; i++)
		n += vec[i] & 1;
	munmap(m, (size_t)st.st_size);
	free(vec);
	close(fd);
	return n;
}

static void *direct_case_main(void *arg)
{
	struct direct_case *c = arg;
	uint64_t samples[300], rng = c->seed;

	for (int i = 0; i < 200 && !c->rc; i++) {
		size_t n = random_samples(&rng, samples, 300);

		c->rc = check_reads(c->ds, samples, n, c->why, sizeof(c->why));
	}
	c->uring = direct_uses_io_uring();
	return NULL;
}

static void direct_mode_reads_every_byte_with_o_direct_through_io_uring_and_pread(void **state)
{
	struct fixture *fx = *state;
	struct dataset ds, big;
	struct direct_case c = {.ds = &ds, .seed = 9};
	char *big_paths[1];
	struct config_field big_field;
	struct config_dataset big_decl;
	uint64_t *all = malloc(BIG_ROWS * sizeof(*all));
	uint64_t big_shape[1] = {BIG_BYTES}, rng = 5;
	char why[512] = "";
	pthread_t t;

	assert_non_null(all);
	write_good_dataset(fx);
	fx->decl.read = CONFIG_READ_DIRECT;
	assert_int_equal(ds_load(&ds, &fx->decl), 0);
	assert_true(ds_check(&ds));
	assert_true(ds.fields[0].direct && ds.fields[1].direct);
	assert_int_equal(ds.fields[0].nmapped, 0);
	for (size_t k = 0; k < 3; k++)
		assert_true(ds.fields[0].shards[k].dfd >= 0);
	/* This thread: io_uring (the kernel here allows it). */
	direct_case_main(&c);
	if (c.rc)
		fail_msg("io_uring: %s", c.why);
	print_message("direct reads through %s\n", c.uring ? "io_uring" : "pread");
	/* A new thread with the ring refused: pread, the same bytes. */
	setenv("PREFETCHD_NO_IO_URING", "1", 1);
	c = (struct direct_case){.ds = &ds, .seed = 10};
	assert_int_equal(pthread_create(&t, NULL, direct_case_main, &c), 0);
	pthread_join(t, NULL);
	unsetenv("PREFETCHD_NO_IO_URING");
	if (c.rc)
		fail_msg("pread: %s", c.why);
	assert_false(c.uring);
	ds_close(&ds);

	/* Rows of 4097 bytes (each across two or three blocks), 20 MB: in
	 * order it is runs of DIRECT_RUN_MAX over more than one bounce
	 * buffer; shuffled, more runs than one submission takes. */
	big_paths[0] = write_npy(fx, "big.npy", 1, "|u1", 1, BIG_SEED, 0, BIG_ROWS, big_shape, 1);
	{
		/* Out of the page cache first, so that what is there after the
		 * reads is what they brought in. */
		int fd = open(big_paths[0], O_RDONLY);

		assert_true(fd >= 0);
		assert_int_equal(fdatasync(fd), 0);
		assert_int_equal(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
		close(fd);
	}
	big_field = (struct config_field){"b", big_paths, 1};
	big_decl = (struct config_dataset){.name = "big",
					   .format = "npy",
					   .fields = &big_field,
					   .nfields = 1,
					   .read = CONFIG_READ_DIRECT};
	assert_int_equal(ds_load(&big, &big_decl), 0);
	assert_true(big.fields[0].direct);
	for (uint64_t i = 0; i < BIG_ROWS; i++)
		all[i] = i;
	if (big_reads_match(&big, all, BIG_ROWS, why, sizeof(why)))
		fail_msg("in order: %s", why);
	for (uint64_t i = BIG_ROWS - 1; i > 0; i--) {
		uint64_t j = npygen_mix(++rng) % (i + 1), tmp = all[i];

		all[i] = all[j];
		all[j] = tmp;
	}
	if (big_reads_match(&big, all, 700, why, sizeof(why)))
		fail_msg("shuffled: %s", why);
	/* The last rows: the file's size is no multiple of a block. */
	all[0] = BIG_ROWS - 1, all[1] = BIG_ROWS - 2, all[2] = 0;
	if (big_reads_match(&big, all, 3, why, sizeof(why)))
		fail_msg("the tail: %s", why);
	/* 20 MB read, and the page cache holds only what the load read (the
	 * header), not the rows. */
	{
		size_t cached = cached_pages(big_paths[0]);

		print_message("after the direct reads of %d rows: %zu of %d pages cached\n",
			      BIG_ROWS, cached, (BIG_ROWS * BIG_BYTES + 128 + 4095) / 4096);
		assert_true(cached <= 16);
	}
	ds_close(&big);
	free(big_paths[0]);

	/* Rows larger than the readers' 16 MiB bounce buffer (an image of
	 * 20 MiB): each is a run of its own, the buffer grows to fit it. */
	{
		uint64_t huge_shape[1] = {(20u << 20) + 3}, picks[4] = {2, 0, 1, 2};
		size_t row = (size_t)huge_shape[0];
		uint8_t *got = malloc(4 * row);
		char err[256] = "";

		assert_non_null(got);
		big_paths[0] =
			write_npy(fx, "huge.npy", 1, "|u1", 1, BIG_SEED, 0, 3, huge_shape, 1);
		big_field = (struct config_field){"h", big_paths, 1};
		big_decl = (struct config_dataset){.name = "huge",
						   .format = "npy",
						   .fields = &big_field,
						   .nfields = 1,
						   .read = CONFIG_READ_DIRECT};
		assert_int_equal(ds_load(&big, &big_decl), 0);
		assert_int_equal(ds_read_field(&big, 0, picks, 4, got, err, sizeof(err)), 0);
		for (size_t k = 0; k < 4; k++)
			for (size_t q = 0; q < row; q += 4099)
				if (got[k * row + q] != npygen_byte(BIG_SEED, picks[k], q))
					fail_msg("huge row %llu byte %zu differs",
						 (unsigned long long)picks[k], q);
		ds_close(&big);
		free(big_paths[0]);
		free(got);
	}
	free(all);
}

/* A shard whose mmap failed at load is read with pread, next to mapped ones
 * in the same field and the same read.  The failure is made here by hand:
 * nothing makes mmap fail on demand for one file. */
static void shard_without_mapping_is_read_with_pread_beside_mapped_ones(void **state)
{
	struct fixture *fx = *state;
	struct ds_shard *middle;
	struct dataset ds;

	write_good_dataset(fx);
	assert_int_equal(ds_load(&ds, &fx->decl), 0);
	middle = &ds.fields[0].shards[1];
	assert_int_equal(munmap((void *)middle->map, (size_t)middle->map_len), 0);
	middle->map = NULL;
	middle->map_len = 0;
	middle->map_rc = -ENOMEM;
	ds.fields[0].nmapped--;
	assert_true(ds_check(&ds));
	assert_random_reads_match(&ds, 8);
	ds_close(&ds);
}

struct reader_arg {
	const struct dataset *ds;
	uint64_t seed;
	char why[512]; /* empty when every read matched */
};

static void *reader_main(void *p)
{
	struct reader_arg *a = p;
	uint64_t samples[128], rng = a->seed;
	int i;

	for (i = 0; i < 100; i++) {
		size_t n = random_samples(&rng, samples, 128);

		if (check_reads(a->ds, samples, n, a->why, sizeof(a->why)) != 0)
			break;
	}
	return NULL;
}

static void concurrent_readers_read_correct_bytes(void **state)
{
	struct fixture *fx = *state;
	struct reader_arg args[4];
	pthread_t threads[4];
	struct dataset ds;
	int i;

	write_good_dataset(fx);
	assert_int_equal(ds_load(&ds, &fx->decl), 0);
	for (i = 0; i < 4; i++) {
		args[i] = (struct reader_arg){.ds = &ds, .seed = 1000u * (uint64_t)(i + 1)};
		assert_int_equal(pthread_create(&threads[i], NULL, reader_main, &args[i]), 0);
	}
	for (i = 0; i < 4; i++) {
		assert_int_equal(pthread_join(threads[i], NULL), 0);
		if (args[i].why[0])
			fail_msg("reader %d: %s", i, args[i].why);
	}
	ds_close(&ds);
}

/* Load must fail with rc, keep name and format, hold no fds, and say want. */
static void assert_load_refused(struct fixture *fx, int rc, const char *want)
{
	int fds = count_open_fds();
	struct dataset ds;

	assert_int_equal(ds_load(&ds, &fx->decl), rc);
	if (!strstr(ds.error, want))
		fail_msg("error \"%s\" lacks \"%s\"", ds.error, want);
	assert_string_equal(ds.name, fx->decl.name);
	assert_string_equal(ds.format, fx->decl.format);
	assert_int_equal(ds.nfields, 0);
	assert_true(ds_check(&ds));
	assert_int_equal(count_open_fds(), fds);
	ds_close(&ds);
}

static void mismatched_field_lengths_are_refused_naming_the_field(void **state)
{
	struct fixture *fx = *state;

	write_good_dataset(fx);
	free(fx->y_paths[0]);
	fx->y_paths[0] = write_npy(fx, "y-short.npy", 1, "|u1", 1, Y_SEED, 0, 999, y_shape, 1);
	assert_load_refused(fx, -EINVAL, "field 'y' has 999 rows but field 'x' has 1000");
}

static void mismatched_shard_dtype_is_refused_naming_both_files(void **state)
{
	struct fixture *fx = *state;
	char want[512];

	write_good_dataset(fx);
	free(fx->x_paths[2]);
	fx->x_paths[2] = write_npy(fx, "x-2i.npy", 1, "<i4", 4, X_SEED, 401, 599, x_shape, 2);
	snprintf(want, sizeof(want), "field 'x': %s has dtype i4 but %s has f4", fx->x_paths[2],
		 fx->x_paths[0]);
	assert_load_refused(fx, -EINVAL, want);
}

static void mismatched_shard_row_shape_is_refused_naming_both_files(void **state)
{
	struct fixture *fx = *state;
	static const uint64_t transposed[2] = {4, 3};
	char want[512];

	write_good_dataset(fx);
	free(fx->x_paths[1]);
	fx->x_paths[1] = write_npy(fx, "x-1t.npy", 1, "<f4", 4, X_SEED, 400, 1, transposed, 2);
	snprintf(want, sizeof(want), "%s has rows of shape (4, 3) but %s has (3, 4)",
		 fx->x_paths[1], fx->x_paths[0]);
	assert_load_refused(fx, -EINVAL, want);
}

static void refused_shard_is_named_in_the_error(void **state)
{
	struct fixture *fx = *state;
	char want[512];

	write_good_dataset(fx);
	free(fx->x_paths[2]);
	fx->x_paths[2] = write_npy(fx, "x-2be.npy", 1, ">f4", 4, X_SEED, 401, 599, x_shape, 2);
	snprintf(want, sizeof(want), "field 'x': %s: big-endian dtype >f4", fx->x_paths[2]);
	assert_load_refused(fx, -EINVAL, want);
}

static void missing_shard_is_named_in_the_error(void **state)
{
	struct fixture *fx = *state;

	write_good_dataset(fx);
	unlink(fx->y_paths[0]);
	assert_load_refused(fx, -ENOENT, fx->y_paths[0]);
}

/* Token shards: three of 1000, 1500 and 700 tokens (the last a short
 * final shard) and one of 40 (no window of 65 tokens: it adds none). */
#define TOK_SEQ	 64
#define TOK_SEED 77
static const uint64_t tok_sizes[] = {1000, 1500, 700, 40};

static void write_token_shards(struct fixture *fx, char *pattern, size_t len)
{
	uint64_t first = 0;
	char path[128];

	for (size_t i = 0; i < sizeof(tok_sizes) / sizeof(tok_sizes[0]); i++) {
		snprintf(path, sizeof(path), "%s/tok_%03zu.bin", fx->dir, i);
		assert_int_equal(
			td_write_tokens(path, tok_sizes[i], TOK_SEED, first, 20240520, 1, 0), 0);
		first += tok_sizes[i];
	}
	snprintf(pattern, len, "%s/tok_*.bin", fx->dir);
}

/* A tokens declaration (seq_len TOK_SEQ) of the one pattern in paths[0],
 * its field in *field. */
static struct config_dataset tokens_decl(struct config_field *field, char **paths)
{
	*field = (struct config_field){"tokens", paths, 1};
	return (struct config_dataset){.name = "tok",
				       .format = "tokens",
				       .fields = field,
				       .nfields = 1,
				       .seq_len = TOK_SEQ};
}

static void tokens_load_with_config(struct fixture *fx, char *pattern, struct dataset *ds,
				    enum config_read read)
{
	char *paths[1] = {pattern};
	struct config_field field = {"tokens", paths, 1};
	struct config_dataset decl = {.name = "tok",
				      .format = "tokens",
				      .fields = &field,
				      .nfields = 1,
				      .read = read,
				      .seq_len = TOK_SEQ};

	(void)fx;
	assert_int_equal(ds_load(ds, &decl), 0);
}

static void token_windows_stay_in_their_shard_and_hold_the_right_tokens(void **state)
{
	struct fixture *fx = *state;
	char pattern[128];
	enum config_read modes[] = {CONFIG_READ_MMAP, CONFIG_READ_PREAD, CONFIG_READ_DIRECT};
	static const char *const names[] = {"mmap", "pread", "direct"};

	write_token_shards(fx, pattern, sizeof(pattern));
	for (size_t m = 0; m < 3; m++) {
		struct dataset ds;
		uint64_t want = 0, shard_first[4] = {0}, start = 0, sample = 0;
		uint16_t row[TOK_SEQ + 1];
		char err[256];

		tokens_load_with_config(fx, pattern, &ds, modes[m]);
		assert_true(ds_check(&ds));
		for (size_t i = 0; i < 4; i++) {
			want += (tok_sizes[i] - 1) / TOK_SEQ * (tok_sizes[i] > TOK_SEQ);
			shard_first[i] = start;
			start += tok_sizes[i];
		}
		assert_int_equal(ds.num_samples, want); /* 15 + 23 + 10 + 0 */
		assert_int_equal(ds.nfields, 1);
		assert_int_equal(ds.fields[0].sample_bytes, (TOK_SEQ + 1) * 2);
		assert_int_equal(ds.fields[0].nshards, 3); /* the 40-token shard adds none */
		/* Every window, in a shuffled-ish order (reverse), one read each. */
		for (size_t i = 0; i < 3; i++) {
			uint64_t windows = (tok_sizes[i] - 1) / TOK_SEQ;

			for (uint64_t w = 0; w < windows; w++, sample++) {
				uint64_t s = sample;

				assert_int_equal(ds_read_field(&ds, 0, &s, 1, (uint8_t *)row, err,
							       sizeof(err)),
						 0);
				for (uint64_t t = 0; t <= TOK_SEQ; t++)
					if (row[t] !=
					    td_token(TOK_SEED, shard_first[i] + w * TOK_SEQ + t))
						fail_msg("%s: sample %llu token %llu is wrong",
							 names[m], (unsigned long long)s,
							 (unsigned long long)t);
			}
		}
		/* A batch read of many windows at once, across shards. */
		{
			uint64_t samples[6] = {0, 1, 14, 15, 38, 47};
			uint16_t rows[6][TOK_SEQ + 1];

			assert_int_equal(ds_read_field(&ds, 0, samples, 6, (uint8_t *)rows, err,
						       sizeof(err)),
					 0);
			assert_int_equal(rows[1][0], rows[0][TOK_SEQ]); /* windows overlap */
			assert_int_equal(rows[3][0], td_token(TOK_SEED, 1000));
			assert_int_equal(rows[5][TOK_SEQ],
					 td_token(TOK_SEED, 2500 + 9 * TOK_SEQ + TOK_SEQ));
		}
		ds_close(&ds);
	}
}

static void bad_token_shards_are_refused_naming_the_file(void **state)
{
	struct fixture *fx = *state;
	static const struct {
		int32_t magic, version;
		uint64_t tokens, count;
		bool cut; /* file shorter than its header */
		const char *says;
	} cases[] = {
		{20240521, 1, 500, 0, false, "magic"},
		{20240520, 2, 500, 0, false, "version"},
		{20240520, 1, 500, 0, true, "header"},
		{20240520, 1, 500, 900, false, "900"},
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char good[128], bad[128], pattern[128];
		char *paths[1] = {pattern};
		struct config_field field = {"tokens", paths, 1};
		struct config_dataset decl = {.name = "tok",
					      .format = "tokens",
					      .fields = &field,
					      .nfields = 1,
					      .seq_len = TOK_SEQ};
		struct dataset ds;
		int fds = count_open_fds();

		snprintf(good, sizeof(good), "%s/b%zu_000.bin", fx->dir, i);
		snprintf(bad, sizeof(bad), "%s/b%zu_001.bin", fx->dir, i);
		snprintf(pattern, sizeof(pattern), "%s/b%zu_*.bin", fx->dir, i);
		assert_int_equal(td_write_tokens(good, 300, 1, 0, 20240520, 1, 0), 0);
		assert_int_equal(td_write_tokens(bad, cases[i].tokens, 1, 300, cases[i].magic,
						 cases[i].version, cases[i].count),
				 0);
		if (cases[i].cut)
			assert_int_equal(truncate(bad, 500), 0);
		assert_int_equal(ds_load(&ds, &decl), -EINVAL);
		print_message("case %zu: %s\n", i, ds.error);
		if (!strstr(ds.error, bad) || !strstr(ds.error, cases[i].says))
			fail_msg("error \"%s\" does not name %s and \"%s\"", ds.error, bad,
				 cases[i].says);
		assert_int_equal(count_open_fds(), fds);
		ds_close(&ds);
	}
}

static void token_pattern_matching_nothing_is_refused(void **state)
{
	struct fixture *fx = *state;
	char pattern[128];
	char *paths[1] = {pattern};
	struct config_field field = {"tokens", paths, 1};
	struct config_dataset decl = {
		.name = "tok", .format = "tokens", .fields = &field, .nfields = 1, .seq_len = 8};
	struct dataset ds;

	snprintf(pattern, sizeof(pattern), "%s/none_*.bin", fx->dir);
	assert_int_equal(ds_load(&ds, &decl), -ENOENT);
	assert_non_null(strstr(ds.error, "matches no file"));
	ds_close(&ds);
}

/* A pattern whose directory is missing says so, naming the directory (not
 * glob's bare "read error"). */
static void token_pattern_in_a_missing_directory_names_it(void **state)
{
	struct fixture *fx = *state;
	char pattern[128];
	char *paths[1] = {pattern};
	struct config_field field = {"tokens", paths, 1};
	struct config_dataset decl = {
		.name = "tok", .format = "tokens", .fields = &field, .nfields = 1, .seq_len = 8};
	struct dataset ds;

	snprintf(pattern, sizeof(pattern), "%s/gone/none_*.bin", fx->dir);
	assert_int_equal(ds_load(&ds, &decl), -ENOENT);
	print_message("  %s\n", ds.error);
	if (!strstr(ds.error, "/gone: No such file or directory"))
		fail_msg("error \"%s\" does not name the missing directory", ds.error);
	ds_close(&ds);
}

static void unknown_format_is_refused_naming_it(void **state)
{
	struct fixture *fx = *state;

	fx->decl.format = "csv";
	assert_load_refused(fx, -EINVAL, "unknown format 'csv'");
}

static void dataset_without_fields_is_refused(void **state)
{
	struct fixture *fx = *state;

	fx->decl.nfields = 0;
	assert_load_refused(fx, -EINVAL, "no fields");
}

static void empty_dataset_is_refused(void **state)
{
	struct fixture *fx = *state;

	fx->y_paths[0] = write_npy(fx, "y0.npy", 1, "|u1", 1, Y_SEED, 0, 0, y_shape, 1);
	fx->decl.fields = &fx->fields[1];
	fx->decl.nfields = 1;
	assert_load_refused(fx, -EINVAL, "0 rows");
}

/* Shard x-2 begins at sample 401: sample 401 + r is its row r.  Its rows
 * start at data_offset 128 (a v1 header), 48 bytes each, so row 82 straddles
 * the page boundary at byte 4096 and row 100 lies inside the page 4096..8191. */
#define X2(r) (401 + (uint64_t)(r))

static void truncate_x2(struct fixture *fx, const struct dataset *ds, uint64_t size)
{
	assert_int_equal(ds->fields[0].shards[2].data_offset, 128);
	assert_int_equal(truncate(fx->x_paths[2], (off_t)size), 0);
}

/* Field x of samples fails with -EIO, the message naming x-2, the row that
 * failed and how many of its 599 rows the file still holds. */
static void assert_x_read_past_end(const struct dataset *ds, const struct fixture *fx,
				   const uint64_t *samples, size_t n, uint64_t row, uint64_t held)
{
	uint8_t x[8 * X_ROW_BYTES];
	char err[512] = "", want[512];

	assert_true(n <= 8);
	snprintf(want, sizeof(want),
		 "%s: row %llu is past the end: the file is shorter than when it was loaded "
		 "(truncated?) and holds %llu of its 599 rows",
		 fx->x_paths[2], (unsigned long long)row, (unsigned long long)held);
	/* The same with plain and with streaming stores (a fault inside a
	 * streamed run, too: see the 8-row run of the page-aligned case). */
	for (int next = DS_FOR_CPU; next <= DS_FOR_DMA; next++) {
		err[0] = '\0';
		assert_int_equal(ds_read_field_for(ds, 0, samples, n, x, next, err, sizeof(err)),
				 -EIO);
		assert_string_equal(err, want);
	}
}

static void file_truncated_after_load_reads_as_eio_naming_the_file_with_pread(void **state)
{
	struct fixture *fx = *state;
	static const uint64_t intact[] = {401, 402, 499, 0, 400};
	/* Rows 98..100 of x-2; it keeps rows 0..99 and 10 bytes of row 100. */
	static const uint64_t cut[] = {X2(98), X2(99), X2(100)};
	uint8_t x[3 * X_ROW_BYTES], y[3 * Y_ROW_BYTES];
	char err[512] = "", want[512];
	struct dataset ds;

	write_good_dataset(fx);
	fx->decl.read = CONFIG_READ_PREAD;
	assert_int_equal(ds_load(&ds, &fx->decl), 0);
	truncate_x2(fx, &ds, 128 + 100 * X_ROW_BYTES + 10);

	assert_int_equal(ds_read_field(&ds, 0, cut, 3, x, err, sizeof(err)), -EIO);
	snprintf(want, sizeof(want), "%s: short read at row 100 (file truncated?)", fx->x_paths[2]);
	assert_string_equal(err, want);
	/* The bytes before the cut and the other files still read. */
	assert_reads_match(&ds, intact, sizeof(intact) / sizeof(intact[0]));
	assert_int_equal(ds_read_field(&ds, 1, cut, 3, y, err, sizeof(err)), 0);
	assert_int_equal(y[2 * Y_ROW_BYTES + 4], npygen_byte(Y_SEED, 501, 4));
	ds_close(&ds);
}

static void direct_read_of_a_file_cut_after_load_is_eio_naming_it(void **state)
{
	struct fixture *fx = *state;
	static const uint64_t cut[] = {X2(98), X2(99), X2(100)};
	uint8_t x[3 * X_ROW_BYTES];
	char err[512] = "", want[512];
	struct dataset ds;

	write_good_dataset(fx);
	fx->decl.read = CONFIG_READ_DIRECT;
	assert_int_equal(ds_load(&ds, &fx->decl), 0);
	truncate_x2(fx, &ds, 128 + 100 * X_ROW_BYTES + 10);
	assert_int_equal(ds_read_field(&ds, 0, cut, 3, x, err, sizeof(err)), -EIO);
	snprintf(want, sizeof(want), "%s: short read at row 100 (file truncated?)", fx->x_paths[2]);
	assert_string_equal(err, want);
	ds_close(&ds);
}

/* Cut inside a page: the rest of that page reads as zeros with no SIGBUS,
 * so only the size check after the copies can see it. */
static void mid_page_truncation_after_load_is_eio_naming_the_file(void **state)
{
	struct fixture *fx = *state;
	static const uint64_t intact[] = {X2(0), X2(1), X2(98), 0, 400, X2(99)};
	static const uint64_t cut[] = {X2(98), X2(99), X2(100)};
	static const uint64_t zero_tail_only[] = {5, X2(100)};
	static const uint64_t beyond[] = {X2(200), X2(99)};
	uint8_t y[3 * Y_ROW_BYTES];
	char err[512] = "";
	struct dataset ds;

	write_good_dataset(fx);
	assert_int_equal(ds_load(&ds, &fx->decl), 0);
	assert_non_null(ds.fields[0].shards[2].map);
	truncate_x2(fx, &ds, 128 + 100 * X_ROW_BYTES + 10);

	assert_x_read_past_end(&ds, fx, cut, 3, 100, 100);
	assert_x_read_past_end(&ds, fx, zero_tail_only, 2, 100, 100);
	/* Row 200 is on a page wholly past the end: a SIGBUS, same error. */
	assert_x_read_past_end(&ds, fx, beyond, 2, 200, 100);
	/* The rows before the cut and the other files still read. */
	assert_reads_match(&ds, intact, sizeof(intact) / sizeof(intact[0]));
	assert_int_equal(ds_read_field(&ds, 1, cut, 3, y, err, sizeof(err)), 0);
	assert_int_equal(y[2 * Y_ROW_BYTES + 4], npygen_byte(Y_SEED, X2(100), 4));
	ds_close(&ds);
}

/* Cut at a page boundary: a row past it raises SIGBUS inside the copy, which
 * must come back as -EIO, as often as it happens, leaving SIGBUS unblocked
 * (were it left blocked, the next fault would kill the test outright). */
static void page_aligned_truncation_after_load_is_eio_not_a_crash(void **state)
{
	struct fixture *fx = *state;
	static const uint64_t straddling[] = {X2(80), X2(81), X2(82)};
	/* 384 bytes in one run: long enough to be streamed (streamcopy.c). */
	static const uint64_t streamed_run[] = {X2(75), X2(76), X2(77), X2(78),
						X2(79), X2(80), X2(81), X2(82)};
	static const uint64_t whole_page_past[] = {3, X2(83)};
	static const uint64_t last_row[] = {X2(598)};
	static const uint64_t intact[] = {X2(0), X2(81), 400, 300, 0};
	sigset_t mask;
	struct dataset ds;
	int round;

	write_good_dataset(fx);
	assert_int_equal(ds_load(&ds, &fx->decl), 0);
	truncate_x2(fx, &ds, 4096);

	for (round = 0; round < 3; round++) {
		/* The copy of rows 80..82 faults at byte 4096, in row 82. */
		assert_x_read_past_end(&ds, fx, straddling, 3, 82, 82);
		assert_x_read_past_end(&ds, fx, streamed_run, 8, 82, 82);
		assert_x_read_past_end(&ds, fx, whole_page_past, 2, 83, 82);
		assert_x_read_past_end(&ds, fx, last_row, 1, 598, 82);
		assert_int_equal(pthread_sigmask(SIG_BLOCK, NULL, &mask), 0);
		assert_false(sigismember(&mask, SIGBUS));
		assert_reads_match(&ds, intact, sizeof(intact) / sizeof(intact[0]));
	}
	/* Cut to nothing, header included: still an error, not a crash. */
	truncate_x2(fx, &ds, 0);
	assert_x_read_past_end(&ds, fx, last_row, 1, 598, 0);
	ds_close(&ds);
}

struct cut_reader_arg {
	const struct dataset *ds;
	uint64_t seed;
	int eio;       /* reads of cut rows that failed as they should */
	char why[512]; /* empty when every read behaved */
};

/* Alternates reads of rows past the cut (SIGBUS or zeros) with reads of
 * intact ones, so that guards of several threads are armed at once. */
static void *cut_reader_main(void *p)
{
	struct cut_reader_arg *a = p;
	uint64_t rng = a->seed, samples[64];
	uint8_t x[64 * X_ROW_BYTES];
	char err[400];
	int i;

	for (i = 0; i < 200 && !a->why[0]; i++) {
		uint64_t r = npygen_mix(++rng);
		size_t n = 1 + (size_t)(r % 64), k;
		int rc;

		for (k = 0; k < n; k++)
			samples[k] = npygen_mix(++rng) % 401; /* x-0 and x-1: intact */
		if (i % 2) {
			/* One row of x-2 past the cut, at a random place. */
			samples[r % n] = X2(100 + (r >> 16) % 499);
			rc = ds_read_field(a->ds, 0, samples, n, x, err, sizeof(err));
			if (rc != -EIO || !strstr(err, "x-2.npy: row ") ||
			    !strstr(err, "shorter than when it was loaded"))
				snprintf(a->why, sizeof(a->why), "cut read gave %d: %s", rc, err);
			a->eio++;
			continue;
		}
		if (check_reads(a->ds, samples, n, a->why, sizeof(a->why)) != 0)
			break;
	}
	return NULL;
}

static void concurrent_readers_of_a_truncated_file_all_get_eio(void **state)
{
	struct fixture *fx = *state;
	struct cut_reader_arg args[4];
	pthread_t threads[4];
	struct dataset ds;
	int i;

	write_good_dataset(fx);
	assert_int_equal(ds_load(&ds, &fx->decl), 0);
	truncate_x2(fx, &ds, 128 + 100 * X_ROW_BYTES + 10);
	for (i = 0; i < 4; i++) {
		args[i] = (struct cut_reader_arg){.ds = &ds, .seed = 77u * (uint64_t)(i + 1)};
		assert_int_equal(pthread_create(&threads[i], NULL, cut_reader_main, &args[i]), 0);
	}
	for (i = 0; i < 4; i++) {
		assert_int_equal(pthread_join(threads[i], NULL), 0);
		if (args[i].why[0])
			fail_msg("reader %d: %s", i, args[i].why);
		assert_int_equal(args[i].eio, 100);
	}
	ds_close(&ds);
}

/* Runs body in a child with SIGBUS at its default, as in the daemon, and
 * returns the signal that killed it, or fails the test if it exited. */
static int child_death_signal(struct fixture *fx, void (*body)(struct fixture *))
{
	int status;
	pid_t pid = fork();

	assert_true(pid >= 0);
	if (pid == 0) {
		struct rlimit no_core = {0, 0};

		/* cmocka's own handler would catch the fault and go on running
		 * tests in the child. */
		signal(SIGBUS, SIG_DFL);
		setrlimit(RLIMIT_CORE, &no_core);
		body(fx);
		_exit(0);
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	if (!WIFSIGNALED(status))
		fail_msg("child exited with %d instead of dying of a signal",
			 WIFEXITED(status) ? WEXITSTATUS(status) : -1);
	return WTERMSIG(status);
}

/* A page of a file past its end: reading or writing it raises SIGBUS. */
static uint8_t *map_past_end(struct fixture *fx, int prot)
{
	char *path;
	void *p;
	int fd;

	if (asprintf(&path, "%s/empty", fx->dir) < 0)
		_exit(20);
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
	free(path);
	p = fd < 0 ? MAP_FAILED : mmap(NULL, 4096, prot, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		_exit(21);
	return p;
}

static void fault_outside_a_read(struct fixture *fx)
{
	volatile const uint8_t *p;
	struct dataset ds;

	if (ds_load(&ds, &fx->decl) != 0)
		_exit(10);
	p = map_past_end(fx, PROT_READ);
	(void)p[0];
}

static void fault_on_the_destination_of_a_read(struct fixture *fx)
{
	static const uint64_t samples[] = {7, 8};
	struct dataset ds;
	char err[256];

	if (ds_load(&ds, &fx->decl) != 0)
		_exit(10);
	/* The fault happens inside the guarded copy, but not in the shard's
	 * mapping: a bug of the caller's, not a truncated dataset file. */
	if (ds_read_field(&ds, 0, samples, 2, map_past_end(fx, PROT_READ | PROT_WRITE), err,
			  sizeof(err)) == -EIO)
		_exit(11);
}

/* The handler catches only faults in a shard's mapping inside a read's
 * copy; any other SIGBUS must still kill the process. */
static void sigbus_outside_a_read_still_kills(void **state)
{
	struct fixture *fx = *state;

	write_good_dataset(fx);
	assert_int_equal(child_death_signal(fx, fault_outside_a_read), SIGBUS);
}

static void sigbus_on_the_destination_of_a_read_still_kills(void **state)
{
	struct fixture *fx = *state;

	write_good_dataset(fx);
	assert_int_equal(child_death_signal(fx, fault_on_the_destination_of_a_read), SIGBUS);
}

static void out_of_range_sample_is_refused(void **state)
{
	struct fixture *fx = *state;
	static const uint64_t samples[] = {3, N};
	uint8_t x[2 * X_ROW_BYTES];
	char err[256] = "";
	struct dataset ds;

	write_good_dataset(fx);
	assert_int_equal(ds_load(&ds, &fx->decl), 0);
	assert_int_equal(ds_read_field(&ds, 0, samples, 2, x, err, sizeof(err)), -ERANGE);
	assert_non_null(strstr(err, "sample 1000 is out of range"));
	assert_int_equal(ds_read_field(&ds, 2, samples, 1, x, err, sizeof(err)), -EINVAL);
	ds_close(&ds);
}

/* Mappings of files under the fixture's directory, from /proc/self/maps. */
static int count_mappings(const struct fixture *fx)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[1024];
	int n = 0;

	assert_non_null(f);
	while (fgets(line, sizeof(line), f))
		n += strstr(line, fx->dir) != NULL;
	fclose(f);
	return n;
}

static void close_unmaps_every_shard(void **state)
{
	struct fixture *fx = *state;
	struct dataset ds;

	write_good_dataset(fx);
	assert_int_equal(count_mappings(fx), 0);
	assert_int_equal(ds_load(&ds, &fx->decl), 0);
	assert_int_equal(count_mappings(fx), 4);
	ds_close(&ds);
	assert_int_equal(count_mappings(fx), 0);
}

static void close_releases_every_fd(void **state)
{
	struct fixture *fx = *state;
	struct dataset ds;
	int fds;

	write_good_dataset(fx);
	fds = count_open_fds();
	assert_int_equal(ds_load(&ds, &fx->decl), 0);
	assert_int_equal(count_open_fds(), fds + 4);
	ds_close(&ds);
	assert_int_equal(count_open_fds(), fds);
}

/* z.npy: 100 rows of 64 '<u1' under a v1 header of 128 bytes, or (pad 64)
 * 99 rows behind a header 64 bytes longer: the same size, rows moved. */
static char *write_z(struct fixture *fx, uint64_t rows, size_t pad)
{
	uint64_t shape[1] = {64};
	uint8_t img[8192];
	size_t off = npygen_header(img, sizeof(img), 1, "<u1", rows, shape, 1);
	char *path;
	FILE *f;

	assert_int_equal(off, 128);
	if (pad) {
		memset(img + off - 1, ' ', pad);
		img[off - 1 + pad] = '\n';
		img[8] = (uint8_t)(off + pad - 10);
		off += pad;
	}
	memset(img + off, 0x5a, rows * 64);
	assert_true(asprintf(&path, "%s/z.npy", fx->dir) > 0);
	f = fopen(path, "r+b"); /* in place when it exists */
	if (!f)
		f = fopen(path, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(img, 1, off + rows * 64, f), off + rows * 64);
	assert_int_equal(fclose(f), 0);
	return path;
}

static void assert_changed(const struct dataset *ds, const char *path, const char *how)
{
	char why[512] = "";

	assert_true(ds_files_changed(ds, why, sizeof(why)));
	print_message("%s\n", why);
	if (strncmp(why, path, strlen(path)) != 0 || !strstr(why, " changed on disk (") ||
	    !strstr(why, how))
		fail_msg("\"%s\" does not say %s changed (%s)", why, path, how);
}

/* Each step makes a change the one before it could not hide, and the
 * check names the strongest: the header, then the mtime, the size, the
 * inode, and last the file's removal. */
static void file_changed_on_disk_is_told_by_header_mtime_size_inode(void **state)
{
	struct fixture *fx = *state;
	char *paths[1], *other, why[512] = "";
	struct config_field field = {"z", paths, 1};
	struct config_dataset decl = {.name = "z", .format = "npy", .fields = &field, .nfields = 1};
	struct timespec times[2];
	struct dataset ds;
	struct stat st;

	paths[0] = write_z(fx, 100, 0);
	assert_int_equal(ds_load(&ds, &decl), 0);
	assert_false(ds_files_changed(&ds, why, sizeof(why)));
	assert_string_equal(why, "");

	/* Rewritten in place with a longer header, same size, mtime set back. */
	assert_int_equal(stat(paths[0], &st), 0);
	free(write_z(fx, 99, 64));
	times[0] = st.st_atim;
	times[1] = st.st_mtim;
	assert_int_equal(utimensat(AT_FDCWD, paths[0], times, 0), 0);
	assert_changed(&ds, paths[0], "its header was rewritten");
	times[1].tv_sec += 7;
	assert_int_equal(utimensat(AT_FDCWD, paths[0], times, 0), 0);
	assert_changed(&ds, paths[0], "mtime ");
	assert_int_equal(truncate(paths[0], 6000), 0);
	assert_changed(&ds, paths[0], "size 6528 -> 6000 bytes");
	assert_true(asprintf(&other, "%s/z-new.npy", fx->dir) > 0);
	assert_int_equal(link(paths[0], other), 0); /* another name, same inode */
	assert_int_equal(unlink(paths[0]), 0);
	free(write_z(fx, 100, 0));
	assert_changed(&ds, paths[0], "(inode ");
	assert_int_equal(unlink(paths[0]), 0);
	assert_changed(&ds, paths[0], "(removed)");
	ds_close(&ds);
	free(other);
	free(paths[0]);
}

static void shard_patterns_matching_other_files_are_told(void **state)
{
	struct fixture *fx = *state;
	char pattern[128], path[160], why[512] = "";
	char *paths[1] = {pattern};
	struct config_field field;
	struct config_dataset decl = tokens_decl(&field, paths);
	struct dataset ds;

	write_token_shards(fx, pattern, sizeof(pattern));
	assert_int_equal(ds_load(&ds, &decl), 0);
	assert_int_equal(ds.nmatched, 4); /* the 40-token shard too */
	assert_false(ds_matches_changed(&ds, &decl, why, sizeof(why)));
	assert_false(ds_files_changed(&ds, why, sizeof(why)));

	snprintf(path, sizeof(path), "%s/tok_002a.bin", fx->dir);
	assert_int_equal(td_write_tokens(path, 100, TOK_SEED, 0, 20240520, 1, 0), 0);
	assert_true(ds_matches_changed(&ds, &decl, why, sizeof(why)));
	print_message("%s\n", why);
	assert_non_null(strstr(why, "tok_002a.bin is new"));
	assert_false(ds_files_changed(&ds, why, sizeof(why))); /* none it reads */
	assert_int_equal(unlink(path), 0);
	/* The shard too short for a window is read by nobody, but it was
	 * matched: its going is a change of what the pattern means. */
	snprintf(path, sizeof(path), "%s/tok_003.bin", fx->dir);
	assert_int_equal(unlink(path), 0);
	assert_true(ds_matches_changed(&ds, &decl, why, sizeof(why)));
	assert_non_null(strstr(why, "tok_003.bin is gone"));
	ds_close(&ds);
}

/* A FIFO or a symlink where a shard pattern matches: refused by name at
 * once (no open() waits for a writer), and nothing is left open. */
static void fifo_and_symlink_shards_are_refused_without_blocking(void **state)
{
	struct fixture *fx = *state;
	char pattern[128], fifo[160], link_path[160], target[160];
	char *paths[1] = {pattern};
	struct config_field field;
	struct config_dataset decl = tokens_decl(&field, paths);
	struct dataset ds;
	int fds = count_open_fds();

	write_token_shards(fx, pattern, sizeof(pattern));
	snprintf(fifo, sizeof(fifo), "%s/tok_001a.bin", fx->dir);
	assert_int_equal(mkfifo(fifo, 0600), 0);
	assert_int_equal(ds_load(&ds, &decl), -EINVAL);
	print_message("%s\n", ds.error);
	assert_non_null(strstr(ds.error, "tok_001a.bin is a FIFO, not a regular file"));
	ds_close(&ds);
	assert_int_equal(unlink(fifo), 0);

	/* Even a link to a shard in the same directory: the target need not
	 * match the pattern, so nothing about it is safe to serve. */
	snprintf(target, sizeof(target), "%s/tok_000.bin", fx->dir);
	snprintf(link_path, sizeof(link_path), "%s/tok_009.bin", fx->dir);
	assert_int_equal(symlink(target, link_path), 0);
	assert_int_equal(ds_load(&ds, &decl), -EINVAL);
	print_message("%s\n", ds.error);
	assert_non_null(strstr(ds.error, "tok_009.bin is a symbolic link"));
	ds_close(&ds);
	assert_int_equal(count_open_fds(), fds);
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		T(two_fields_with_a_sharded_field_read_back_every_byte),
		T(concurrent_readers_read_correct_bytes),
		T(mismatched_field_lengths_are_refused_naming_the_field),
		T(mismatched_shard_dtype_is_refused_naming_both_files),
		T(mismatched_shard_row_shape_is_refused_naming_both_files),
		T(refused_shard_is_named_in_the_error),
		T(missing_shard_is_named_in_the_error),
		T(token_windows_stay_in_their_shard_and_hold_the_right_tokens),
		T(bad_token_shards_are_refused_naming_the_file),
		T(token_pattern_matching_nothing_is_refused),
		T(token_pattern_in_a_missing_directory_names_it),
		T(unknown_format_is_refused_naming_it),
		T(dataset_without_fields_is_refused),
		T(empty_dataset_is_refused),
		T(pread_mode_maps_nothing_and_reads_every_byte),
		T(direct_mode_reads_every_byte_with_o_direct_through_io_uring_and_pread),
		T(direct_read_of_a_file_cut_after_load_is_eio_naming_it),
		T(shard_without_mapping_is_read_with_pread_beside_mapped_ones),
		T(file_truncated_after_load_reads_as_eio_naming_the_file_with_pread),
		T(mid_page_truncation_after_load_is_eio_naming_the_file),
		T(page_aligned_truncation_after_load_is_eio_not_a_crash),
		T(concurrent_readers_of_a_truncated_file_all_get_eio),
		T(sigbus_outside_a_read_still_kills),
		T(sigbus_on_the_destination_of_a_read_still_kills),
		T(out_of_range_sample_is_refused),
		T(close_unmaps_every_shard),
		T(close_releases_every_fd),
		T(file_changed_on_disk_is_told_by_header_mtime_size_inode),
		T(shard_patterns_matching_other_files_are_told),
		T(fifo_and_symlink_shards_are_refused_without_blocking),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
