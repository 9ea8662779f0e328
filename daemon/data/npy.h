/*
 * npy.h — the NumPy .npy header, versions 1.0, 2.0 and 3.0.
 *
 * Accepted: little-endian (or byte-order-free 1-byte) numeric dtypes
 * b1 i1 u1 i2 u2 i4 u4 i8 u8 f2 f4 f8, C order, at least one dimension.
 * Everything else (Fortran order, big-endian, object, structured, strings,
 * complex, datetime) is refused with a message that says why.
 *
 * DESIGN: pure functions, no state; called from the loop thread at dataset
 * load.  npy_parse_header never reads past `len`.
 */
#ifndef PF_NPY_H
#define PF_NPY_H

#include <stddef.h>
#include <stdint.h>

#define NPY_MAX_DIMS 32
/* Largest header we read (NumPy itself caps v1 headers at 64 KiB and writes
 * far smaller ones; a bigger "header" is a corrupt or hostile file). */
#define NPY_MAX_HEADER (1u << 20)

enum npy_dtype {
	NPY_B1,
	NPY_I1,
	NPY_U1,
	NPY_I2,
	NPY_U2,
	NPY_I4,
	NPY_U4,
	NPY_I8,
	NPY_U8,
	NPY_F2,
	NPY_F4,
	NPY_F8,
	NPY_NTYPES
};

struct npy_info {
	enum npy_dtype dtype;
	size_t itemsize;
	unsigned version; /* 1, 2 or 3 */
	int ndim;	  /* >= 1 */
	uint64_t shape[NPY_MAX_DIMS];
	uint64_t data_offset; /* where the array bytes start in the file */
	uint64_t rows;	      /* shape[0] */
	uint64_t row_bytes;   /* itemsize * product(shape[1:]) */
};

/* Parses the magic, version, header length and header dict in buf[0..len).
 * Returns 0, -EINVAL (bad magic, bad dict, refused dtype/order) or -ENODATA
 * when len is too short to hold the header (the caller may read more).  On
 * error, err receives a message without the file name. */
int npy_parse_header(const uint8_t *buf, size_t len, struct npy_info *info, char *err,
		     size_t errlen);

/* Parses the header of the open file fd (named path in messages) and checks
 * that the file holds data_offset + rows * row_bytes bytes (-EINVAL
 * "truncated" otherwise).  How the file is opened is the caller's policy
 * (dataset.c: regular files only, never blocking).  Errors name the file. */
int npy_read_header(int fd, const char *path, struct npy_info *info, char *err, size_t errlen);

/* "f4", "u1", ... */
const char *npy_dtype_name(enum npy_dtype t);

#endif
