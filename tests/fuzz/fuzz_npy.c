/*
 * fuzz_npy.c — libFuzzer harness: the .npy header parser (daemon/data/npy.c).
 *
 * The input is a whole file.  It is parsed in memory with
 * npy_parse_header, and read as a file with npy_read_header (a memfd, so no
 * disk is touched), and the two must agree.
 *
 * Checks, beyond ASan/UBSan's (which also catch any read past the buffer:
 * the parser is handed exactly `size` bytes of libFuzzer's allocation):
 *   - an accepted header describes a servable array: a known dtype with its
 *     itemsize, 1..NPY_MAX_DIMS dimensions, rows and row_bytes that are the
 *     shape's, data_offset inside the input, and a size that fits off_t;
 *   - the parse depends on the header's bytes only: the same header cut at
 *     data_offset parses identically, and cut one byte shorter asks for
 *     more (-ENODATA);
 *   - a refusal says why (a non-empty message);
 *   - npy_read_header accepts exactly the files whose header parses and
 *     whose length holds the data, gives the same description, names the
 *     file in every refusal, and leaks no descriptor.
 *
 * DESIGN: one thread, no state between inputs.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "data/npy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int fd_baseline;

static void die(const char *what) __attribute__((noreturn));

static void die(const char *what)
{
	fprintf(stderr, "fuzz_npy: %s\n", what);
	abort();
}

static bool same_info(const struct npy_info *a, const struct npy_info *b)
{
	if (a->dtype != b->dtype || a->itemsize != b->itemsize || a->version != b->version ||
	    a->ndim != b->ndim || a->data_offset != b->data_offset || a->rows != b->rows ||
	    a->row_bytes != b->row_bytes)
		return false;
	return memcmp(a->shape, b->shape, sizeof(a->shape[0]) * (size_t)a->ndim) == 0;
}

static void check_accepted(const struct npy_info *info, size_t size)
{
	static const size_t itemsize[NPY_NTYPES] = {1, 1, 1, 2, 2, 4, 4, 8, 8, 2, 4, 8};
	uint64_t row = info->itemsize;

	if ((unsigned)info->dtype >= NPY_NTYPES || info->itemsize != itemsize[info->dtype] ||
	    strcmp(npy_dtype_name(info->dtype), "?") == 0)
		die("accepted a dtype that is not served");
	if (info->ndim < 1 || info->ndim > NPY_MAX_DIMS)
		die("accepted a dimension count out of range");
	if (info->version < 1 || info->version > 3)
		die("accepted an unknown version");
	if (info->data_offset > size || info->data_offset < 10)
		die("data_offset lies outside the header");
	if (info->rows != info->shape[0])
		die("rows is not shape[0]");
	for (int i = 1; i < info->ndim; i++)
		if (__builtin_mul_overflow(row, info->shape[i], &row))
			die("row_bytes overflows yet was accepted");
	if (row != info->row_bytes)
		die("row_bytes is not itemsize times the row's shape");
	if (info->row_bytes &&
	    info->rows > ((uint64_t)INT64_MAX - info->data_offset) / info->row_bytes)
		die("the array does not fit in a file offset yet was accepted");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct npy_info info, cut, opened;
	char err[256], path[64];
	int rc, rc_open, mfd, fd;

	/* The lowest free descriptor now: free again at the end, or a leak. */
	fd_baseline = dup(STDERR_FILENO);
	close(fd_baseline);
	err[0] = '\0';
	rc = npy_parse_header(data, size, &info, err, sizeof(err));
	if (rc != 0 && rc != -EINVAL && rc != -ENODATA)
		die("npy_parse_header returned an undocumented error");
	if (rc != 0 && (!err[0] || !memchr(err, '\0', sizeof(err))))
		die("a refusal without a message");
	if (rc == 0) {
		check_accepted(&info, size);
		if (npy_parse_header(data, info.data_offset, &cut, err, sizeof(err)) != 0 ||
		    !same_info(&info, &cut))
			die("the parse depends on bytes after the header");
		if (npy_parse_header(data, info.data_offset - 1, &cut, err, sizeof(err)) !=
		    -ENODATA)
			die("a header cut short does not ask for more");
	}

	/* The same bytes as a file. */
	mfd = memfd_create("fuzz_npy", MFD_CLOEXEC);
	if (mfd < 0)
		die("memfd_create");
	if (size && write(mfd, data, size) != (ssize_t)size)
		die("write to the memfd");
	snprintf(path, sizeof(path), "/proc/self/fd/%d", mfd);
	err[0] = '\0';
	rc_open = npy_read_header(mfd, path, &opened, err, sizeof(err));
	if (rc == 0 && size - info.data_offset >= info.rows * info.row_bytes) {
		if (rc_open != 0 || !same_info(&info, &opened))
			die("npy_read_header refused a complete file whose header parses");
	} else {
		if (rc_open != -EINVAL)
			die("npy_read_header accepted a file the parser refuses, or a short one");
		if (strncmp(err, path, strlen(path)) != 0)
			die("npy_read_header's refusal does not name the file");
	}
	close(mfd);
	fd = dup(STDERR_FILENO);
	if (fd != fd_baseline)
		die("descriptor leak");
	close(fd);
	return 0;
}
