/*
 * npy.c — the NumPy .npy header: magic, version, header length, and the
 * Python dict literal that describes the array.
 *
 *   "\x93NUMPY" major minor  HLEN  {'descr': '<f4', 'fortran_order': False, 'shape': (N, 3), }
 *                            u16 LE in 1.0, u32 LE in 2.0 and 3.0
 *
 * The dict is parsed by a small hand-written scanner rather than anything
 * resembling a Python evaluator: it accepts exactly the three keys NumPy
 * writes, in any order, with any whitespace, and refuses everything else
 * with a sentence that says what to do about it.
 *
 * DESIGN: pure functions with no state, so any thread may call them; in
 * practice the loop thread calls npy_read_header at dataset load.  The parser never
 * reads past the length it is given, and every size derived from the header
 * is checked for overflow before use, because the file may be hostile.
 */
#include "data/npy.h"
#include "util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const uint8_t npy_magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

/* The shortest prefix that holds the magic, the version and the header
 * length: 10 bytes in version 1.0, 12 in 2.0 and 3.0. */
#define NPY_PREFIX_MAX 12

static const struct {
	const char *name; /* as in the descr, without the byte-order character */
	size_t itemsize;
} npy_types[NPY_NTYPES] = {
	[NPY_B1] = {"b1", 1}, [NPY_I1] = {"i1", 1}, [NPY_U1] = {"u1", 1}, [NPY_I2] = {"i2", 2},
	[NPY_U2] = {"u2", 2}, [NPY_I4] = {"i4", 4}, [NPY_U4] = {"u4", 4}, [NPY_I8] = {"i8", 8},
	[NPY_U8] = {"u8", 8}, [NPY_F2] = {"f2", 2}, [NPY_F4] = {"f4", 4}, [NPY_F8] = {"f8", 8},
};

/* The longest descr string we keep; anything longer is refused as unknown
 * (and quoted truncated). */
#define DESCR_MAX 32

const char *npy_dtype_name(enum npy_dtype t)
{
	if ((unsigned)t >= NPY_NTYPES)
		return "?";
	return npy_types[t].name;
}

/* Reads the fixed prefix.  Returns 0 with *prefix_len and *header_len set,
 * -EINVAL for a file that is not a supported .npy, -ENODATA when len is too
 * short to tell. */
static int parse_prefix(const uint8_t *buf, size_t len, size_t *prefix_len, uint32_t *header_len,
			char *err, size_t errlen)
{
	size_t cmp = len < sizeof(npy_magic) ? len : sizeof(npy_magic);

	if (memcmp(buf, npy_magic, cmp) != 0) {
		set_err(err, errlen, "not a .npy file (bad magic)");
		return -EINVAL;
	}
	if (len < 8) {
		set_err(err, errlen, "truncated header");
		return -ENODATA;
	}
	if (buf[6] < 1 || buf[6] > 3 || buf[7] != 0) {
		set_err(err, errlen, "unsupported .npy format version %u.%u (1.0, 2.0 and 3.0 are)",
			buf[6], buf[7]);
		return -EINVAL;
	}
	if (buf[6] == 1) {
		*prefix_len = 10;
		if (len < *prefix_len)
			goto short_prefix;
		*header_len = (uint32_t)buf[8] | (uint32_t)buf[9] << 8;
	} else {
		*prefix_len = 12;
		if (len < *prefix_len)
			goto short_prefix;
		*header_len = (uint32_t)buf[8] | (uint32_t)buf[9] << 8 | (uint32_t)buf[10] << 16 |
			      (uint32_t)buf[11] << 24;
	}
	if (*header_len > NPY_MAX_HEADER) {
		set_err(err, errlen, "header length %u exceeds the %u-byte limit (corrupt file?)",
			*header_len, NPY_MAX_HEADER);
		return -EINVAL;
	}
	return 0;

short_prefix:
	set_err(err, errlen, "truncated header");
	return -ENODATA;
}

/* A cursor over the header dict; p never passes end. */
struct scan {
	const char *p;
	const char *end;
};

static void skip_space(struct scan *s)
{
	while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r'))
		s->p++;
}

/* Consumes c after optional whitespace. */
static bool eat(struct scan *s, char c)
{
	skip_space(s);
	if (s->p < s->end && *s->p == c) {
		s->p++;
		return true;
	}
	return false;
}

/* Consumes the word w (True, False) when it stands alone. */
static bool eat_word(struct scan *s, const char *w)
{
	size_t n = strlen(w);

	skip_space(s);
	if ((size_t)(s->end - s->p) < n || memcmp(s->p, w, n) != 0)
		return false;
	if ((size_t)(s->end - s->p) > n) {
		char next = s->p[n];

		if ((next >= 'A' && next <= 'Z') || (next >= 'a' && next <= 'z') ||
		    (next >= '0' && next <= '9') || next == '_')
			return false;
	}
	s->p += n;
	return true;
}

/* A quoted Python string without escapes (NumPy never writes any in the
 * keys or the descr of a simple dtype).  Copies at most cap - 1 bytes to
 * out; *truncated says whether it had to stop early. */
static bool scan_string(struct scan *s, char *out, size_t cap, bool *truncated)
{
	const char *start;
	char quote;
	size_t n;

	skip_space(s);
	if (s->p >= s->end || (*s->p != '\'' && *s->p != '"'))
		return false;
	quote = *s->p++;
	start = s->p;
	while (s->p < s->end && *s->p != quote) {
		if (*s->p == '\\' || *s->p == '\n')
			return false;
		s->p++;
	}
	if (s->p >= s->end)
		return false;
	n = (size_t)(s->p - start);
	*truncated = n >= cap;
	if (n >= cap)
		n = cap - 1;
	memcpy(out, start, n);
	out[n] = '\0';
	s->p++;
	return true;
}

/* A non-negative decimal that fits in 64 bits, with the "L" suffix Python 2
 * wrote after longs (old files have shapes like (3L, 4L)). */
static bool scan_uint(struct scan *s, uint64_t *v)
{
	uint64_t x = 0;
	const char *start;

	skip_space(s);
	start = s->p;
	while (s->p < s->end && *s->p >= '0' && *s->p <= '9') {
		unsigned d = (unsigned)(*s->p - '0');

		if (x > (UINT64_MAX - d) / 10)
			return false;
		x = x * 10 + d;
		s->p++;
	}
	if (s->p == start)
		return false;
	if (s->p < s->end && *s->p == 'L')
		s->p++;
	*v = x;
	return true;
}

/* "(a, b, c)", "(a,)" or "()".  Returns 0, or -EINVAL with err set. */
static int scan_shape(struct scan *s, struct npy_info *info, char *err, size_t errlen)
{
	info->ndim = 0;
	if (!eat(s, '('))
		goto bad;
	if (eat(s, ')'))
		return 0;
	for (;;) {
		uint64_t dim;

		if (!scan_uint(s, &dim))
			goto bad;
		if (info->ndim == NPY_MAX_DIMS) {
			set_err(err, errlen, "more than %d dimensions", NPY_MAX_DIMS);
			return -EINVAL;
		}
		info->shape[info->ndim++] = dim;
		if (eat(s, ')'))
			return 0;
		if (!eat(s, ','))
			goto bad;
		if (eat(s, ')'))
			return 0;
	}
bad:
	set_err(err, errlen, "malformed 'shape' in header (expected a tuple of integers)");
	return -EINVAL;
}

/* Maps a descr string onto a served dtype, or says why it cannot be one. */
static int parse_descr(const char *descr, bool truncated, struct npy_info *info, char *err,
		       size_t errlen)
{
	char order = descr[0];
	const char *type = descr;
	int t;

	if (order == '<' || order == '>' || order == '|' || order == '=')
		type++;
	else
		order = 0;
	if (type[0] == 'O') {
		set_err(err, errlen,
			"object dtype cannot be served (it holds Python object pointers, not "
			"data)");
		return -EINVAL;
	}
	for (t = 0; !truncated && t < NPY_NTYPES; t++) {
		if (strcmp(type, npy_types[t].name) != 0)
			continue;
		if (order == '>') {
			set_err(err, errlen,
				"big-endian dtype %s is not supported; convert with "
				"arr.astype('<%s')",
				descr, type);
			return -EINVAL;
		}
		if (order == '=' || order == 0) {
			set_err(err, errlen,
				"dtype '%s' has no explicit byte order; save it as '<%s'", descr,
				type);
			return -EINVAL;
		}
		/* '|' means "no byte order", which is only true of 1-byte types. */
		if (order == '|' && npy_types[t].itemsize != 1)
			break;
		info->dtype = (enum npy_dtype)t;
		info->itemsize = npy_types[t].itemsize;
		return 0;
	}
	set_err(err, errlen,
		"unknown dtype '%s%s' (served: b1 i1 u1 i2 u2 i4 u4 i8 u8 f2 f4 f8, little-endian)",
		descr, truncated ? "..." : "");
	return -EINVAL;
}

/* Parses the dict in [p, end) into info (dtype, itemsize, ndim, shape). */
static int parse_dict(const char *p, const char *end, struct npy_info *info, char *err,
		      size_t errlen)
{
	struct scan s = {p, end};
	char descr[DESCR_MAX];
	bool have_descr = false, have_order = false, have_shape = false;
	bool fortran = false, descr_truncated = false;
	int rc;

	if (!eat(&s, '{'))
		goto malformed;
	while (!eat(&s, '}')) {
		char key[32];
		bool key_truncated;

		if (!scan_string(&s, key, sizeof(key), &key_truncated) || !eat(&s, ':'))
			goto malformed;
		if (!key_truncated && strcmp(key, "descr") == 0 && !have_descr) {
			skip_space(&s);
			if (s.p < s.end && *s.p == '[') {
				set_err(err, errlen,
					"structured dtype (a list of fields) is not supported; "
					"save each field as its own .npy");
				return -EINVAL;
			}
			if (!scan_string(&s, descr, sizeof(descr), &descr_truncated))
				goto malformed;
			have_descr = true;
		} else if (!key_truncated && strcmp(key, "fortran_order") == 0 && !have_order) {
			if (eat_word(&s, "True"))
				fortran = true;
			else if (eat_word(&s, "False"))
				fortran = false;
			else
				goto malformed;
			have_order = true;
		} else if (!key_truncated && strcmp(key, "shape") == 0 && !have_shape) {
			rc = scan_shape(&s, info, err, errlen);
			if (rc)
				return rc;
			have_shape = true;
		} else {
			set_err(err, errlen, "unexpected or repeated key '%s%s' in header", key,
				key_truncated ? "..." : "");
			return -EINVAL;
		}
		/* Python allows a trailing comma before the closing brace. */
		if (!eat(&s, ',')) {
			if (!eat(&s, '}'))
				goto malformed;
			break;
		}
	}
	/* NumPy pads the header with spaces up to a newline. */
	skip_space(&s);
	if (s.p != s.end)
		goto malformed;
	if (!have_descr || !have_order || !have_shape) {
		set_err(err, errlen, "header lacks '%s'",
			!have_descr   ? "descr"
			: !have_order ? "fortran_order"
				      : "shape");
		return -EINVAL;
	}

	rc = parse_descr(descr, descr_truncated, info, err, errlen);
	if (rc)
		return rc;
	if (fortran) {
		set_err(err, errlen,
			"Fortran order is not supported; save with np.ascontiguousarray");
		return -EINVAL;
	}
	if (info->ndim == 0) {
		set_err(err, errlen,
			"scalar array (shape ()) cannot be served: needs at least one dimension");
		return -EINVAL;
	}
	return 0;

malformed:
	set_err(err, errlen, "malformed header dict near offset %zu", (size_t)(s.p - p));
	return -EINVAL;
}

int npy_parse_header(const uint8_t *buf, size_t len, struct npy_info *info, char *err,
		     size_t errlen)
{
	size_t prefix_len = 0;
	uint32_t header_len = 0;
	uint64_t data_bytes;
	int rc, i;

	memset(info, 0, sizeof(*info));
	rc = parse_prefix(buf, len, &prefix_len, &header_len, err, errlen);
	if (rc)
		return rc;
	if (len - prefix_len < header_len) {
		set_err(err, errlen, "truncated header");
		return -ENODATA;
	}
	rc = parse_dict((const char *)buf + prefix_len, (const char *)buf + prefix_len + header_len,
			info, err, errlen);
	if (rc)
		return rc;

	info->version = buf[6];
	info->data_offset = prefix_len + header_len;
	info->rows = info->shape[0];
	info->row_bytes = info->itemsize;
	for (i = 1; i < info->ndim; i++) {
		if (info->shape[i] && info->row_bytes > UINT64_MAX / info->shape[i])
			goto overflow;
		info->row_bytes *= info->shape[i];
	}
	/* The whole array must be addressable as a file offset (off_t is
	 * signed 64-bit), so later arithmetic on rows never wraps. */
	if (info->row_bytes && info->rows > (uint64_t)INT64_MAX / info->row_bytes)
		goto overflow;
	data_bytes = info->rows * info->row_bytes;
	if (data_bytes > (uint64_t)INT64_MAX - info->data_offset)
		goto overflow;
	return 0;

overflow:
	set_err(err, errlen, "shape is too large (array size overflows 64 bits)");
	return -EINVAL;
}

/* pread until n bytes or end of file; returns the count read or -errno. */
static ssize_t pread_full(int fd, void *buf, size_t n, off_t off)
{
	size_t done = 0;

	while (done < n) {
		ssize_t r = pread(fd, (uint8_t *)buf + done, n - done, off + (off_t)done);

		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (r == 0)
			break;
		done += (size_t)r;
	}
	return (ssize_t)done;
}

int npy_read_header(int f, const char *path, struct npy_info *info, char *err, size_t errlen)
{
	uint8_t prefix[NPY_PREFIX_MAX];
	uint8_t *header = NULL; /* owned */
	size_t prefix_len = 0;
	uint32_t header_len = 0;
	char why[256];
	struct stat st;
	ssize_t got;
	int rc;

	memset(info, 0, sizeof(*info));
	/* Read the prefix first: it says how long the header is. */
	got = pread_full(f, prefix, sizeof(prefix), 0);
	if (got < 0) {
		rc = (int)got;
		set_err(err, errlen, "%s: read: %s", path, strerror(-rc));
		goto out;
	}
	rc = parse_prefix(prefix, (size_t)got, &prefix_len, &header_len, why, sizeof(why));
	if (rc == -ENODATA) {
		rc = -EINVAL;
		set_err(err, errlen, "%s: truncated header (file is %zd bytes)", path, got);
		goto out;
	}
	if (rc) {
		set_err(err, errlen, "%s: %s", path, why);
		goto out;
	}

	header = malloc(prefix_len + header_len);
	if (!header) {
		rc = -ENOMEM;
		set_err(err, errlen, "%s: out of memory for a %u-byte header", path, header_len);
		goto out;
	}
	got = pread_full(f, header, prefix_len + header_len, 0);
	if (got < 0) {
		rc = (int)got;
		set_err(err, errlen, "%s: read: %s", path, strerror(-rc));
		goto out;
	}
	if ((size_t)got < prefix_len + header_len) {
		rc = -EINVAL;
		set_err(err, errlen, "%s: truncated header (says %u bytes, file has %zd in all)",
			path, header_len, got);
		goto out;
	}
	rc = npy_parse_header(header, (size_t)got, info, why, sizeof(why));
	if (rc) {
		rc = -EINVAL;
		set_err(err, errlen, "%s: %s", path, why);
		goto out;
	}

	if (fstat(f, &st) < 0) {
		rc = -errno;
		set_err(err, errlen, "%s: fstat: %s", path, strerror(-rc));
		goto out;
	}
	/* npy_parse_header bounded data_offset + rows * row_bytes by INT64_MAX. */
	if ((uint64_t)st.st_size < info->data_offset + info->rows * info->row_bytes) {
		uint64_t have = (uint64_t)st.st_size > info->data_offset
					? (uint64_t)st.st_size - info->data_offset
					: 0;

		rc = -EINVAL;
		set_err(err, errlen,
			"%s: truncated: header says %llu rows of %llu bytes (%llu bytes of data), "
			"file has %llu after the header",
			path, (unsigned long long)info->rows, (unsigned long long)info->row_bytes,
			(unsigned long long)(info->rows * info->row_bytes),
			(unsigned long long)have);
		goto out;
	}
	rc = 0;
out:
	free(header);
	return rc;
}
