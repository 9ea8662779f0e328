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
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "dataset.h"
#include "../tools/npygen.h"

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
	fx->decl = (struct config_dataset){"train", "npy", fx->fields, 2};
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
	if (ds_read_field(ds, 0, samples, n, x, err, sizeof(err)) != 0 ||
	    ds_read_field(ds, 1, samples, n, y, err, sizeof(err)) != 0) {
		snprintf(why, whylen, "read failed: %s", err);
		goto out;
	}
	for (k = 0; k < n; k++) {
		for (p = 0; p < X_ROW_BYTES; p++) {
			if (x[k * X_ROW_BYTES + p] != npygen_byte(X_SEED, samples[k], p)) {
				snprintf(why, whylen, "x: sample %llu (at %zu) byte %zu differs",
					 (unsigned long long)samples[k], k, p);
				goto out;
			}
		}
		for (p = 0; p < Y_ROW_BYTES; p++) {
			if (y[k * Y_ROW_BYTES + p] != npygen_byte(Y_SEED, samples[k], p)) {
				snprintf(why, whylen, "y: sample %llu (at %zu) byte %zu differs",
					 (unsigned long long)samples[k], k, p);
				goto out;
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

	assert_reads_match(&ds, across, sizeof(across) / sizeof(across[0]));
	for (i = 0; i < 200; i++) {
		size_t n = random_samples(&rng, samples, 300);

		assert_reads_match(&ds, samples, n);
	}
	/* The whole dataset in order: three preads for x, one for y. */
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

static void tokens_format_is_not_implemented_yet(void **state)
{
	struct fixture *fx = *state;

	fx->decl.format = "tokens";
	assert_load_refused(fx, -ENOTSUP, "format tokens is not implemented yet");
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

static void file_truncated_after_load_reads_as_eio_naming_the_file(void **state)
{
	struct fixture *fx = *state;
	static const uint64_t intact[] = {401, 402, 499, 0, 400};
	/* Shard x-2 begins at sample 401, so samples 499..501 are its rows
	 * 98..100; it keeps rows 0..99 and 10 bytes of row 100. */
	static const uint64_t cut[] = {499, 500, 501};
	uint8_t x[3 * X_ROW_BYTES], y[3 * Y_ROW_BYTES];
	char err[512] = "", want[512];
	struct dataset ds;

	write_good_dataset(fx);
	assert_int_equal(ds_load(&ds, &fx->decl), 0);
	assert_int_equal(truncate(fx->x_paths[2], (off_t)(ds.fields[0].shards[2].data_offset +
							  100 * X_ROW_BYTES + 10)),
			 0);

	assert_int_equal(ds_read_field(&ds, 0, cut, 3, x, err, sizeof(err)), -EIO);
	snprintf(want, sizeof(want), "%s: short read at row 100 (file truncated?)", fx->x_paths[2]);
	assert_string_equal(err, want);
	/* The bytes before the cut and the other files still read. */
	assert_reads_match(&ds, intact, sizeof(intact) / sizeof(intact[0]));
	assert_int_equal(ds_read_field(&ds, 1, cut, 3, y, err, sizeof(err)), 0);
	assert_int_equal(y[2 * Y_ROW_BYTES + 4], npygen_byte(Y_SEED, 501, 4));
	ds_close(&ds);
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
		T(tokens_format_is_not_implemented_yet),
		T(unknown_format_is_refused_naming_it),
		T(dataset_without_fields_is_refused),
		T(empty_dataset_is_refused),
		T(file_truncated_after_load_reads_as_eio_naming_the_file),
		T(out_of_range_sample_is_refused),
		T(close_releases_every_fd),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
