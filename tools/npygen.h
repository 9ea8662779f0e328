/*
 * npygen.h — what tools/npygen writes, as pure functions that tests and
 * benchmarks include to recompute any byte of a generated file without
 * reading it back from anywhere else.
 *
 * Random fill (the default).  Byte `pos` of row `row` (pos counts from the
 * start of the row, 0 .. row_bytes - 1) under seed `seed` is
 *
 *     key  = mix(mix(seed) ^ row)
 *     word = mix(key ^ (pos / 8))
 *     byte = (word >> (8 * (pos % 8))) & 0xff
 *
 * where mix(z) is splitmix64's step: z += 0x9e3779b97f4a7c15, then the
 * finaliser (xor-shift 30, * 0xbf58476d1ce4e5b9, xor-shift 27,
 * * 0x94d049bb133111eb, xor-shift 31).  Rows are numbered by `--first-row`
 * (default 0) + their index in the file, so the shards of one field written
 * with consecutive first rows hold exactly the bytes of one big file.  The
 * bytes ignore the dtype: float fields contain NaNs and infinities.
 *
 * Row-id fill (`--fill rowid`).  Every element of row r holds r converted
 * to the dtype: integers modulo 2^bits, b1 as r & 1, f2 rounded to nearest
 * even (inf above 65519), f4/f8 as C's conversion from uint64_t.  Useful to
 * see which row a consumer got.
 *
 * DESIGN: header-only and libc-only, so npygen stays a standalone tool.
 */
#ifndef PF_NPYGEN_H
#define PF_NPYGEN_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

static inline uint64_t npygen_mix(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* The per-row key: computed once per row when generating in bulk. */
static inline uint64_t npygen_row_key(uint64_t seed, uint64_t row)
{
	return npygen_mix(npygen_mix(seed) ^ row);
}

/* Bytes 8 * word .. 8 * word + 7 of a row, little-endian. */
static inline uint64_t npygen_word(uint64_t row_key, uint64_t word)
{
	return npygen_mix(row_key ^ word);
}

static inline uint8_t npygen_byte(uint64_t seed, uint64_t row, uint64_t pos)
{
	return (uint8_t)(npygen_word(npygen_row_key(seed, row), pos / 8) >> (8 * (pos % 8)));
}

/* Writes the magic, version, header length and header dict of a C-order
 * array of shape (rows, sample_shape...) with the given descr ("<f4") into
 * buf.  The dict is padded with spaces and a newline so the data starts at a
 * multiple of 64 bytes, as NumPy does.  Returns the data offset, or 0 when
 * the header does not fit in cap (or, for version 1, in 65535 bytes). */
static inline size_t npygen_header(uint8_t *buf, size_t cap, unsigned version, const char *descr,
				   uint64_t rows, const uint64_t *sample_shape, int sample_ndim)
{
	size_t prefix = version == 1 ? 10 : 12;
	size_t len, total, hlen;
	char *dict;
	int i, n;

	if (cap <= prefix)
		return 0;
	dict = (char *)buf + prefix;
	n = snprintf(dict, cap - prefix, "{'descr': '%s', 'fortran_order': False, 'shape': (%llu",
		     descr, (unsigned long long)rows);
	if (n < 0 || (size_t)n >= cap - prefix)
		return 0;
	len = (size_t)n;
	for (i = 0; i < sample_ndim; i++) {
		n = snprintf(dict + len, cap - prefix - len, ", %llu",
			     (unsigned long long)sample_shape[i]);
		if (n < 0 || (size_t)n >= cap - prefix - len)
			return 0;
		len += (size_t)n;
	}
	/* A 1-tuple keeps its comma, as Python writes it: "(5,)". */
	n = snprintf(dict + len, cap - prefix - len, "%s), }", sample_ndim ? "" : ",");
	if (n < 0 || (size_t)n >= cap - prefix - len)
		return 0;
	len += (size_t)n;
	total = (prefix + len + 1 + 63) / 64 * 64;
	if (total > cap)
		return 0;
	memset(dict + len, ' ', total - prefix - len - 1);
	buf[total - 1] = '\n';
	hlen = total - prefix;
	if (version == 1 && hlen > 0xffff)
		return 0;
	memcpy(buf, "\x93NUMPY", 6);
	buf[6] = (uint8_t)version;
	buf[7] = 0;
	buf[8] = (uint8_t)hlen;
	buf[9] = (uint8_t)(hlen >> 8);
	if (version != 1) {
		buf[10] = (uint8_t)(hlen >> 16);
		buf[11] = (uint8_t)(hlen >> 24);
	}
	return total;
}

#endif
