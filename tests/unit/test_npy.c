/*
 * test_npy.c — the .npy header parser and npy_read_header.
 *
 * Headers are written by hand here (not by npygen) so that the parser is
 * checked against the bytes NumPy writes, including the odd forms: other key
 * orders, double quotes, trailing commas, 32-bit header lengths.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/npy.h"

struct fixture {
	char dir[64];
};

/* A .npy image: prefix for `version` with the header length of dict plus
 * NumPy-style padding (spaces and a final newline to a multiple of 64), then
 * data_len bytes of 0xa5.  Returns the malloc'd image and its length. */
static uint8_t *npy_image(unsigned version, const char *dict, size_t data_len, size_t *len)
{
	size_t prefix = version == 1 ? 10 : 12, dlen = strlen(dict);
	size_t total = (prefix + dlen + 1 + 63) / 64 * 64, hlen = total - prefix;
	uint8_t *img = malloc(total + data_len);

	assert_non_null(img);
	memcpy(img, "\x93NUMPY", 6);
	img[6] = (uint8_t)version;
	img[7] = 0;
	img[8] = (uint8_t)hlen;
	img[9] = (uint8_t)(hlen >> 8);
	if (version != 1) {
		img[10] = (uint8_t)(hlen >> 16);
		img[11] = (uint8_t)(hlen >> 24);
	}
	memcpy(img + prefix, dict, dlen);
	memset(img + prefix + dlen, ' ', hlen - dlen - 1);
	img[total - 1] = '\n';
	memset(img + total, 0xa5, data_len);
	*len = total + data_len;
	return img;
}

/* Parses dict as a version-1 header: returns the parser's result. */
static int parse_dict(const char *dict, struct npy_info *info, char *err, size_t errlen)
{
	size_t len;
	uint8_t *img = npy_image(1, dict, 0, &len);
	int rc = npy_parse_header(img, len, info, err, errlen);

	free(img);
	return rc;
}

#define DICT(descr, fortran, shape)                                                                \
	"{'descr': '" descr "', 'fortran_order': " fortran ", 'shape': " shape ", }"

/* Asserts that dict is refused with -EINVAL and a message containing want. */
static void assert_refused(const char *dict, const char *want)
{
	struct npy_info info;
	char err[256] = "";

	assert_int_equal(parse_dict(dict, &info, err, sizeof(err)), -EINVAL);
	if (!strstr(err, want))
		fail_msg("message \"%s\" lacks \"%s\" (header %s)", err, want, dict);
}

static const char *write_file(struct fixture *fx, const char *name, const uint8_t *bytes,
			      size_t len)
{
	static char path[128];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", fx->dir, name);
	f = fopen(path, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(bytes, 1, len, f), len);
	assert_int_equal(fclose(f), 0);
	return path;
}

/* Opens path and reads its header: npy_read_header on a file the test
 * opened (dataset.c's open policy is test_dataset.c's).  *fd is the open
 * file on success, -1 on failure. */
static int open_npy(const char *path, struct npy_info *info, int *fd, char *err, size_t errlen)
{
	int f = open(path, O_RDONLY | O_CLOEXEC), rc;

	assert_true(f >= 0);
	rc = npy_read_header(f, path, info, err, errlen);
	if (rc) {
		close(f);
		f = -1;
	}
	*fd = f;
	return rc;
}

/* npy_read_header errors start with "<path>: ". */
static void assert_names_file(const char *err, const char *path)
{
	size_t n = strlen(path);

	if (strncmp(err, path, n) != 0 || err[n] != ':')
		fail_msg("message \"%s\" does not start with \"%s:\"", err, path);
}

static int setup(void **state)
{
	struct fixture *fx = calloc(1, sizeof(*fx));

	if (!fx)
		return -1;
	strcpy(fx->dir, "/tmp/test_npy.XXXXXX");
	if (!mkdtemp(fx->dir)) {
		free(fx);
		return -1;
	}
	*state = fx;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *fx = *state;
	struct dirent *e;
	char path[512];
	DIR *d = opendir(fx->dir);

	while (d && (e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%s", fx->dir, e->d_name);
		unlink(path);
	}
	if (d)
		closedir(d);
	rmdir(fx->dir);
	free(fx);
	return 0;
}

static void version_1_header_is_parsed(void **state)
{
	struct npy_info info;
	char err[256] = "";
	size_t len;
	uint8_t *img = npy_image(1, DICT("<f4", "False", "(1000, 3, 4)"), 0, &len);

	assert_int_equal(npy_parse_header(img, len, &info, err, sizeof(err)), 0);
	assert_int_equal(info.version, 1);
	assert_int_equal(info.dtype, NPY_F4);
	assert_int_equal(info.itemsize, 4);
	assert_int_equal(info.ndim, 3);
	assert_int_equal(info.shape[0], 1000);
	assert_int_equal(info.shape[1], 3);
	assert_int_equal(info.shape[2], 4);
	assert_int_equal(info.rows, 1000);
	assert_int_equal(info.row_bytes, 48);
	assert_int_equal(info.data_offset, 128); /* 10 + 65-byte dict, padded to 64 */
	assert_int_equal(info.data_offset, len);
	free(img);
}

static void version_2_header_length_is_32_bits(void **state)
{
	/* A header longer than 65535 bytes only fits a 32-bit length: if the
	 * parser read 16 bits it would see 70016 mod 65536 and fail. */
	char *dict = malloc(70000);
	struct npy_info info;
	char err[256] = "";
	size_t len, n;
	uint8_t *img;

	assert_non_null(dict);
	n = (size_t)sprintf(dict, "%s", DICT("<i8", "False", "(5, 2)"));
	memset(dict + n, ' ', 70000 - n - 1);
	dict[70000 - 1] = '\0';
	img = npy_image(2, dict, 0, &len);
	assert_true(len > 65536);
	assert_int_equal(npy_parse_header(img, len, &info, err, sizeof(err)), 0);
	assert_int_equal(info.version, 2);
	assert_int_equal(info.dtype, NPY_I8);
	assert_int_equal(info.rows, 5);
	assert_int_equal(info.row_bytes, 16);
	assert_int_equal(info.data_offset, len);
	free(img);
	free(dict);
}

static void version_3_header_is_parsed(void **state)
{
	struct npy_info info;
	char err[256] = "";
	size_t len;
	uint8_t *img = npy_image(3, DICT("<u2", "False", "(7, 2, 2, 2)"), 0, &len);

	assert_int_equal(npy_parse_header(img, len, &info, err, sizeof(err)), 0);
	assert_int_equal(info.version, 3);
	assert_int_equal(info.dtype, NPY_U2);
	assert_int_equal(info.ndim, 4);
	assert_int_equal(info.row_bytes, 16);
	assert_int_equal(info.data_offset, len);
	free(img);
}

static void every_accepted_dtype_is_parsed(void **state)
{
	static const struct {
		const char *descr;
		enum npy_dtype dtype;
		size_t itemsize;
		const char *name;
	} cases[] = {
		{"<b1", NPY_B1, 1, "b1"}, {"|b1", NPY_B1, 1, "b1"}, {"<i1", NPY_I1, 1, "i1"},
		{"|i1", NPY_I1, 1, "i1"}, {"<u1", NPY_U1, 1, "u1"}, {"|u1", NPY_U1, 1, "u1"},
		{"<i2", NPY_I2, 2, "i2"}, {"<u2", NPY_U2, 2, "u2"}, {"<i4", NPY_I4, 4, "i4"},
		{"<u4", NPY_U4, 4, "u4"}, {"<i8", NPY_I8, 8, "i8"}, {"<u8", NPY_U8, 8, "u8"},
		{"<f2", NPY_F2, 2, "f2"}, {"<f4", NPY_F4, 4, "f4"}, {"<f8", NPY_F8, 8, "f8"},
	};
	size_t i;

	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct npy_info info;
		char dict[128], err[256] = "";

		snprintf(dict, sizeof(dict),
			 "{'descr': '%s', 'fortran_order': False, "
			 "'shape': (10, 3), }",
			 cases[i].descr);
		if (parse_dict(dict, &info, err, sizeof(err)) != 0)
			fail_msg("%s refused: %s", cases[i].descr, err);
		assert_int_equal(info.dtype, cases[i].dtype);
		assert_int_equal(info.itemsize, cases[i].itemsize);
		assert_int_equal(info.row_bytes, 3 * cases[i].itemsize);
		assert_string_equal(npy_dtype_name(info.dtype), cases[i].name);
	}
	assert_string_equal(npy_dtype_name(NPY_NTYPES), "?");
}

static void keys_in_any_order_and_loose_whitespace_are_accepted(void **state)
{
	struct npy_info info;
	char err[256] = "";

	assert_int_equal(parse_dict("{ \"shape\" :( 7 ,  2 , ) ,'fortran_order':False,"
				    "\t'descr' : \"<u2\"}",
				    &info, err, sizeof(err)),
			 0);
	assert_int_equal(info.dtype, NPY_U2);
	assert_int_equal(info.ndim, 2);
	assert_int_equal(info.shape[0], 7);
	assert_int_equal(info.shape[1], 2);
	assert_int_equal(info.row_bytes, 4);
}

static void one_dimensional_shape_with_trailing_comma_is_accepted(void **state)
{
	struct npy_info info;
	char err[256] = "";

	assert_int_equal(parse_dict(DICT("<i4", "False", "(5,)"), &info, err, sizeof(err)), 0);
	assert_int_equal(info.ndim, 1);
	assert_int_equal(info.rows, 5);
	assert_int_equal(info.row_bytes, 4);
	/* Python 2 wrote longs with an L suffix. */
	assert_int_equal(parse_dict(DICT("<i4", "False", "(5L, 2L)"), &info, err, sizeof(err)), 0);
	assert_int_equal(info.row_bytes, 8);
}

static void short_buffer_asks_for_more(void **state)
{
	struct npy_info info;
	char err[256];
	size_t len, cut;
	uint8_t *img = npy_image(2, DICT("<f4", "False", "(4, 4)"), 0, &len);

	/* Every proper prefix is "not enough yet", never a verdict. */
	for (cut = 0; cut < len; cut++)
		assert_int_equal(npy_parse_header(img, cut, &info, err, sizeof(err)), -ENODATA);
	assert_int_equal(npy_parse_header(img, len, &info, err, sizeof(err)), 0);
	free(img);
}

static void truncated_header_is_refused_naming_the_file(void **state)
{
	struct fixture *fx = *state;
	struct npy_info info;
	char err[256] = "";
	const char *path;
	size_t len;
	uint8_t *img = npy_image(1, DICT("<f4", "False", "(4, 4)"), 0, &len);
	int fd = 123;

	path = write_file(fx, "cut.npy", img, 40);
	assert_int_equal(open_npy(path, &info, &fd, err, sizeof(err)), -EINVAL);
	assert_names_file(err, path);
	assert_non_null(strstr(err, "truncated header"));
	assert_int_equal(fd, -1);

	path = write_file(fx, "stub.npy", img, 7);
	assert_int_equal(open_npy(path, &info, &fd, err, sizeof(err)), -EINVAL);
	assert_names_file(err, path);
	assert_non_null(strstr(err, "truncated header"));
	free(img);
}

static void truncated_data_is_refused_naming_the_file(void **state)
{
	struct fixture *fx = *state;
	struct npy_info info;
	char err[256] = "", want[512];
	const char *path;
	size_t len;
	uint8_t *img = npy_image(1, DICT("<f4", "False", "(10, 4)"), 100, &len);
	int fd = 123;

	path = write_file(fx, "short.npy", img, len);
	assert_int_equal(open_npy(path, &info, &fd, err, sizeof(err)), -EINVAL);
	snprintf(want, sizeof(want),
		 "%s: truncated: header says 10 rows of 16 bytes (160 bytes of data), file has 100",
		 path);
	if (strncmp(err, want, strlen(want)) != 0)
		fail_msg("got \"%s\", want \"%s...\"", err, want);
	assert_int_equal(fd, -1);
	free(img);
}

static void complete_file_opens_with_data_at_data_offset(void **state)
{
	struct fixture *fx = *state;
	struct npy_info info;
	char err[256] = "";
	const char *path;
	uint8_t row[16];
	size_t len;
	uint8_t *img = npy_image(3, DICT("<f4", "False", "(10, 4)"), 160, &len);
	int fd = -1;

	img[len - 1] = 0x5a; /* last byte of the last row */
	path = write_file(fx, "ok.npy", img, len);
	assert_int_equal(open_npy(path, &info, &fd, err, sizeof(err)), 0);
	assert_true(fd >= 0);
	assert_int_equal(info.rows, 10);
	assert_int_equal(info.data_offset, len - 160);
	assert_int_equal(
		pread(fd, row, sizeof(row), (off_t)(info.data_offset + 9 * info.row_bytes)), 16);
	assert_memory_equal(row, img + len - 16, 16);
	assert_int_equal(row[15], 0x5a);
	close(fd);
	free(img);
}

static void bad_magic_is_refused(void **state)
{
	struct fixture *fx = *state;
	struct npy_info info;
	char err[256] = "";
	const char *path;
	size_t len;
	uint8_t *img = npy_image(1, DICT("<f4", "False", "(4, 4)"), 64, &len);
	int fd;

	img[1] = 'n';
	assert_int_equal(npy_parse_header(img, len, &info, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "bad magic"));
	/* Decided from the first bytes alone: a text file is not "short". */
	assert_int_equal(npy_parse_header((const uint8_t *)"x,y", 3, &info, err, sizeof(err)),
			 -EINVAL);
	path = write_file(fx, "csv.npy", img, len);
	assert_int_equal(open_npy(path, &info, &fd, err, sizeof(err)), -EINVAL);
	assert_names_file(err, path);
	assert_non_null(strstr(err, "bad magic"));
	free(img);
}

static void unsupported_version_is_refused(void **state)
{
	struct npy_info info;
	char err[256] = "";
	size_t len;
	uint8_t *img = npy_image(2, DICT("<f4", "False", "(4, 4)"), 0, &len);

	img[6] = 4;
	assert_int_equal(npy_parse_header(img, len, &info, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "version 4.0"));
	img[6] = 1;
	img[7] = 1;
	assert_int_equal(npy_parse_header(img, len, &info, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "version 1.1"));
	free(img);
}

static void fortran_order_is_refused(void **state)
{
	struct fixture *fx = *state;
	struct npy_info info;
	char err[256] = "";
	const char *path;
	size_t len;
	uint8_t *img = npy_image(1, DICT("<f4", "True", "(4, 4)"), 64, &len);
	int fd;

	assert_refused(DICT("<f4", "True", "(4, 4)"),
		       "Fortran order is not supported; save with np.ascontiguousarray");
	path = write_file(fx, "fortran.npy", img, len);
	assert_int_equal(open_npy(path, &info, &fd, err, sizeof(err)), -EINVAL);
	assert_names_file(err, path);
	assert_non_null(strstr(err, "Fortran order"));
	assert_int_equal(fd, -1);
	free(img);
}

static void big_endian_dtype_is_refused(void **state)
{
	assert_refused(DICT(">f4", "False", "(4, 4)"),
		       "big-endian dtype >f4 is not supported; convert with arr.astype('<f4')");
	assert_refused(DICT(">i8", "False", "(4,)"), "arr.astype('<i8')");
}

static void native_or_missing_byte_order_is_refused(void **state)
{
	/* '=' means "this machine's order", which the file cannot tell us. */
	assert_refused(DICT("=f4", "False", "(4,)"), "'=f4'");
	assert_refused(DICT("f4", "False", "(4,)"), "'f4'");
	assert_refused(DICT("|f4", "False", "(4,)"), "unknown dtype '|f4'");
}

static void object_dtype_is_refused(void **state)
{
	assert_refused(DICT("|O", "False", "(4,)"), "object dtype cannot be served");
	assert_refused(DICT("O", "False", "(4,)"), "object dtype cannot be served");
}

static void unknown_dtype_is_refused(void **state)
{
	assert_refused(DICT("<c8", "False", "(4,)"), "unknown dtype '<c8'");
	assert_refused(DICT("<U10", "False", "(4,)"), "unknown dtype '<U10'");
	assert_refused(DICT("|S5", "False", "(4,)"), "unknown dtype '|S5'");
	assert_refused(DICT("<M8[ns]", "False", "(4,)"), "unknown dtype '<M8[ns]'");
	assert_refused(DICT("xyz", "False", "(4,)"), "unknown dtype 'xyz'");
}

static void structured_dtype_is_refused(void **state)
{
	assert_refused("{'descr': [('a', '<f4'), ('b', '<i4')], 'fortran_order': False, "
		       "'shape': (4,), }",
		       "structured dtype");
}

static void scalar_shape_is_refused(void **state)
{
	assert_refused(DICT("<f4", "False", "()"), "needs at least one dimension");
}

static void header_longer_than_the_limit_is_refused(void **state)
{
	struct fixture *fx = *state;
	uint8_t prefix[12] = {0x93, 'N', 'U', 'M', 'P', 'Y', 2, 0};
	uint32_t hlen = NPY_MAX_HEADER + 1;
	struct npy_info info;
	char err[256] = "";
	const char *path;
	int fd;

	prefix[8] = (uint8_t)hlen;
	prefix[9] = (uint8_t)(hlen >> 8);
	prefix[10] = (uint8_t)(hlen >> 16);
	prefix[11] = (uint8_t)(hlen >> 24);
	/* Refused from the prefix alone, not "give me 1 MiB more". */
	assert_int_equal(npy_parse_header(prefix, sizeof(prefix), &info, err, sizeof(err)),
			 -EINVAL);
	assert_non_null(strstr(err, "exceeds"));
	path = write_file(fx, "huge.npy", prefix, sizeof(prefix));
	assert_int_equal(open_npy(path, &info, &fd, err, sizeof(err)), -EINVAL);
	assert_names_file(err, path);
	assert_non_null(strstr(err, "exceeds"));
}

static void malformed_dicts_are_refused(void **state)
{
	assert_refused("{'descr': '<f4', 'fortran_order': False, }", "lacks 'shape'");
	assert_refused("{'fortran_order': False, 'shape': (3,)}", "lacks 'descr'");
	assert_refused(DICT("<f4", "False", "(3,)") "x", "malformed");
	assert_refused("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), 'extra': 1}",
		       "'extra'");
	assert_refused("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (3,)}",
		       "repeated key 'descr'");
	assert_refused(DICT("<f4", "false", "(3,)"), "malformed");
	assert_refused(DICT("<f4", "Falsey", "(3,)"), "malformed");
	assert_refused(DICT("<f4", "False", "(-3,)"), "malformed 'shape'");
	assert_refused(DICT("<f4", "False", "(3.5,)"), "malformed 'shape'");
	assert_refused(DICT("<f4", "False", "(3,,)"), "malformed 'shape'");
	assert_refused(DICT("<f4", "False", "(99999999999999999999,)"), "malformed 'shape'");
	assert_refused("{'descr': '<f4, 'fortran_order': False, 'shape': (3,)}", "malformed");
	assert_refused("", "malformed");
}

static void shapes_whose_size_overflows_are_refused(void **state)
{
	/* row_bytes = 8 * 2^62 * 8 wraps 64 bits. */
	assert_refused(DICT("<f8", "False", "(2, 4611686018427387904, 8)"), "too large");
	/* rows * row_bytes wraps, though each is small. */
	assert_refused(DICT("<f8", "False", "(9223372036854775807, 2)"), "too large");
	assert_refused(DICT("<f4", "False",
			    "(1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, "
			    "1, 1, 1, 1, 1, 1, 1, 1, 1, 1)"),
		       "more than 32 dimensions");
}

static void empty_array_is_parsed(void **state)
{
	struct npy_info info;
	char err[256] = "";

	assert_int_equal(parse_dict(DICT("<f4", "False", "(0, 3)"), &info, err, sizeof(err)), 0);
	assert_int_equal(info.rows, 0);
	assert_int_equal(info.row_bytes, 12);
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		T(version_1_header_is_parsed),
		T(version_2_header_length_is_32_bits),
		T(version_3_header_is_parsed),
		T(every_accepted_dtype_is_parsed),
		T(keys_in_any_order_and_loose_whitespace_are_accepted),
		T(one_dimensional_shape_with_trailing_comma_is_accepted),
		T(short_buffer_asks_for_more),
		T(truncated_header_is_refused_naming_the_file),
		T(truncated_data_is_refused_naming_the_file),
		T(complete_file_opens_with_data_at_data_offset),
		T(bad_magic_is_refused),
		T(unsupported_version_is_refused),
		T(fortran_order_is_refused),
		T(big_endian_dtype_is_refused),
		T(native_or_missing_byte_order_is_refused),
		T(object_dtype_is_refused),
		T(unknown_dtype_is_refused),
		T(structured_dtype_is_refused),
		T(scalar_shape_is_refused),
		T(header_longer_than_the_limit_is_refused),
		T(malformed_dicts_are_refused),
		T(shapes_whose_size_overflows_are_refused),
		T(empty_array_is_parsed),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
