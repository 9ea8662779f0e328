/*
 * npygen — writes a .npy file whose every byte is a documented function of
 * (seed, row, position), for demos, tests and benchmarks.
 *
 *   npygen OUT.npy --rows N [--shape 3x4] [--dtype f4] [--seed S]
 *                  [--version 1|2|3] [--fill random|rowid] [--first-row F]
 *
 * --shape is the shape of one row (omit it for a 1-D array); the array's
 * shape is (N, 3, 4).  The content is defined in npygen.h.
 *
 * DESIGN: single-threaded, libc only.  Rows are generated into an 8 MiB
 * buffer and written with one write(2) per chunk, so a few hundred MB take
 * well under a second of hashing plus the disk's write time.
 */
#include "npygen.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_SAMPLE_DIMS 31 /* NPY_MAX_DIMS less the row axis */
#define CHUNK_BYTES	(8u << 20)

static const struct {
	const char *name;
	const char *descr; /* what NumPy writes: '|' for 1-byte types */
	unsigned itemsize;
	char kind; /* 'b' bool, 'i' signed, 'u' unsigned, 'f' float */
} dtypes[] = {
	{"b1", "|b1", 1, 'b'}, {"i1", "|i1", 1, 'i'}, {"u1", "|u1", 1, 'u'}, {"i2", "<i2", 2, 'i'},
	{"u2", "<u2", 2, 'u'}, {"i4", "<i4", 4, 'i'}, {"u4", "<u4", 4, 'u'}, {"i8", "<i8", 8, 'i'},
	{"u8", "<u8", 8, 'u'}, {"f2", "<f2", 2, 'f'}, {"f4", "<f4", 4, 'f'}, {"f8", "<f8", 8, 'f'},
};

static void usage(FILE *to)
{
	fprintf(to, "usage: npygen OUT.npy --rows N [--shape 3x4] [--dtype f4] [--seed S]\n"
		    "              [--version 1|2|3] [--fill random|rowid] [--first-row F]\n"
		    "dtypes: b1 i1 u1 i2 u2 i4 u4 i8 u8 f2 f4 f8; content: see tools/npygen.h\n");
}

static int parse_u64(const char *s, uint64_t *out)
{
	char *end;

	if (!s[0] || s[0] == '-')
		return -EINVAL;
	errno = 0;
	*out = strtoull(s, &end, 0);
	if (errno || *end)
		return -EINVAL;
	return 0;
}

/* "3x4" -> {3, 4}; "" -> no dimensions. */
static int parse_shape(const char *s, uint64_t *shape, int *ndim)
{
	*ndim = 0;
	while (*s) {
		char *end;

		if (*ndim == MAX_SAMPLE_DIMS || *s < '0' || *s > '9')
			return -EINVAL;
		errno = 0;
		shape[(*ndim)++] = strtoull(s, &end, 10);
		if (errno || (*end && *end != 'x'))
			return -EINVAL;
		s = *end ? end + 1 : end;
		if (*end && !*s)
			return -EINVAL;
	}
	return 0;
}

/* IEEE half of a non-negative integer, rounded to nearest even. */
static uint16_t half_of(uint64_t r)
{
	uint64_t m, rem, halfway;
	int e;

	if (r == 0)
		return 0;
	e = 63 - __builtin_clzll(r);
	if (e <= 10) {
		m = r << (10 - e);
	} else {
		m = r >> (e - 10);
		rem = r & ((1ull << (e - 10)) - 1);
		halfway = 1ull << (e - 11);
		if (rem > halfway || (rem == halfway && (m & 1)))
			m++;
		if (m == 2048) {
			m = 1024;
			e++;
		}
	}
	if (e > 15)
		return 0x7c00;
	return (uint16_t)((unsigned)(e + 15) << 10 | (m & 0x3ff));
}

/* 64 bytes of elements holding row id r, little-endian; 64 is a multiple of
 * every itemsize, so byte pos of the row is out[pos % 64]. */
static void rowid_pattern(int t, uint64_t r, uint8_t *out)
{
	uint64_t bits;
	unsigned i;

	if (dtypes[t].kind == 'b') {
		bits = r & 1;
	} else if (dtypes[t].kind != 'f') {
		bits = r;
	} else if (dtypes[t].itemsize == 2) {
		bits = half_of(r);
	} else if (dtypes[t].itemsize == 4) {
		float f = (float)r;
		uint32_t u;

		memcpy(&u, &f, sizeof(u));
		bits = u;
	} else {
		double d = (double)r;

		memcpy(&bits, &d, sizeof(bits));
	}
	for (i = 0; i < 64; i++)
		out[i] = (uint8_t)(bits >> (8 * (i % dtypes[t].itemsize)));
}

/* Row-id bytes [pos, pos + n) of a row, from its 64-byte pattern. */
static void rowid_range(const uint8_t *pattern, uint64_t pos, size_t n, uint8_t *out)
{
	while (n) {
		size_t off = (size_t)(pos % 64), k = 64 - off < n ? 64 - off : n;

		memcpy(out, pattern + off, k);
		out += k;
		pos += k;
		n -= k;
	}
}

/* Random-fill bytes [pos, pos + n) of the row whose key is row_key. */
static void random_range(uint64_t row_key, uint64_t pos, size_t n, uint8_t *out)
{
	uint64_t end = pos + n;

	while (pos < end) {
		uint64_t w = npygen_word(row_key, pos / 8);
		unsigned b = (unsigned)(pos % 8);

		if (b == 0 && end - pos >= 8) {
			for (b = 0; b < 8; b++)
				out[b] = (uint8_t)(w >> (8 * b));
			out += 8;
			pos += 8;
			continue;
		}
		for (; b < 8 && pos < end; b++, pos++)
			*out++ = (uint8_t)(w >> (8 * b));
	}
}

static int write_all(int fd, const uint8_t *buf, size_t n)
{
	while (n) {
		ssize_t w = write(fd, buf, n);

		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		buf += w;
		n -= (size_t)w;
	}
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"rows", required_argument, NULL, 'r'},
		{"shape", required_argument, NULL, 's'},
		{"dtype", required_argument, NULL, 'd'},
		{"seed", required_argument, NULL, 'S'},
		{"version", required_argument, NULL, 'v'},
		{"fill", required_argument, NULL, 'f'},
		{"first-row", required_argument, NULL, 'F'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	uint64_t rows = 0, seed = 0, first_row = 0, version = 1, row_bytes, total;
	uint64_t shape[MAX_SAMPLE_DIMS];
	uint8_t header[4096], pattern[64];
	uint8_t *chunk = NULL; /* owned */
	const char *out = NULL;
	bool have_rows = false, rowid = false;
	struct timespec t0, t1;
	size_t offset, fill = 0;
	int ndim = 0, t = 10 /* f4 */, c, i, li = 0, fd = -1, rc;
	uint64_t r;

	while ((c = getopt_long(argc, argv, "h", opts, &li)) != -1) {
		switch (c) {
		case 'r':
			if (parse_u64(optarg, &rows))
				goto bad_arg;
			have_rows = true;
			break;
		case 's':
			if (parse_shape(optarg, shape, &ndim))
				goto bad_arg;
			break;
		case 'd':
			for (t = 0; t < (int)(sizeof(dtypes) / sizeof(dtypes[0])); t++)
				if (strcmp(optarg, dtypes[t].name) == 0)
					break;
			if (t == (int)(sizeof(dtypes) / sizeof(dtypes[0])))
				goto bad_arg;
			break;
		case 'S':
			if (parse_u64(optarg, &seed))
				goto bad_arg;
			break;
		case 'v':
			if (parse_u64(optarg, &version) || version < 1 || version > 3)
				goto bad_arg;
			break;
		case 'f':
			if (strcmp(optarg, "rowid") == 0)
				rowid = true;
			else if (strcmp(optarg, "random") == 0)
				rowid = false;
			else
				goto bad_arg;
			break;
		case 'F':
			if (parse_u64(optarg, &first_row))
				goto bad_arg;
			break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (optind != argc - 1 || !have_rows) {
		usage(stderr);
		return 2;
	}
	out = argv[optind];

	/* Same bound npy.c enforces: the whole file must fit in an off_t. */
	row_bytes = dtypes[t].itemsize;
	for (i = 0; i < ndim; i++) {
		if (shape[i] && row_bytes > (uint64_t)INT64_MAX / shape[i])
			goto too_big;
		row_bytes *= shape[i];
	}
	if (row_bytes && rows > ((uint64_t)INT64_MAX - sizeof(header)) / row_bytes)
		goto too_big;
	if (first_row > UINT64_MAX - rows)
		goto too_big;
	total = rows * row_bytes;

	offset = npygen_header(header, sizeof(header), (unsigned)version, dtypes[t].descr, rows,
			       shape, ndim);
	if (!offset)
		goto too_big;
	chunk = malloc(CHUNK_BYTES);
	if (!chunk) {
		fprintf(stderr, "npygen: out of memory\n");
		return 1;
	}
	clock_gettime(CLOCK_MONOTONIC, &t0);
	fd = open(out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		fprintf(stderr, "npygen: %s: %s\n", out, strerror(errno));
		free(chunk);
		return 1;
	}
	rc = write_all(fd, header, offset);

	for (r = first_row; !rc && r < first_row + rows; r++) {
		uint64_t key = npygen_row_key(seed, r), pos = 0;

		if (rowid)
			rowid_pattern(t, r, pattern);
		while (pos < row_bytes) {
			size_t n = CHUNK_BYTES - fill;

			if (row_bytes - pos < n)
				n = (size_t)(row_bytes - pos);
			if (rowid)
				rowid_range(pattern, pos, n, chunk + fill);
			else
				random_range(key, pos, n, chunk + fill);
			fill += n;
			pos += n;
			if (fill == CHUNK_BYTES) {
				rc = write_all(fd, chunk, fill);
				if (rc)
					break;
				fill = 0;
			}
		}
	}
	if (!rc)
		rc = write_all(fd, chunk, fill);
	if (close(fd) < 0 && !rc)
		rc = -errno;
	free(chunk);
	if (rc) {
		fprintf(stderr, "npygen: %s: write: %s\n", out, strerror(-rc));
		unlink(out);
		return 1;
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);

	printf("npygen: wrote %s: shape (%llu", out, (unsigned long long)rows);
	for (i = 0; i < ndim; i++)
		printf(", %llu", (unsigned long long)shape[i]);
	printf("%s %s, v%llu.0, %llu bytes (data at %zu), seed %llu, fill %s, rows from %llu, "
	       "%.2f s\n",
	       ndim ? ")" : ",)", dtypes[t].descr, (unsigned long long)version,
	       (unsigned long long)(offset + total), offset, (unsigned long long)seed,
	       rowid ? "rowid" : "random", (unsigned long long)first_row,
	       (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9);
	return 0;

bad_arg:
	fprintf(stderr, "npygen: bad value '%s' for --%s\n", optarg, opts[li].name);
	usage(stderr);
	return 2;
too_big:
	fprintf(stderr, "npygen: array too large\n");
	return 2;
}
