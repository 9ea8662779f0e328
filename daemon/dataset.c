/*
 * dataset.c — a named dataset: its fields, their .npy shards, and the reads
 * that gather sample rows out of them.
 *
 * A field is a list of shards concatenated on axis 0; shard k begins at
 * field row first_row[k].  Sample s of a field lives in the one shard with
 * first_row <= s < first_row + rows, found by binary search.
 *
 * DESIGN: ds_load and ds_close run on the loop thread (at startup and at
 * shutdown).  Between them a dataset is immutable, so the reader threads call
 * ds_read_field concurrently with no lock: it uses only pread on the fds
 * opened at load, which carries its own offset.  A file truncated after load
 * yields -EIO and a message, never SIGBUS as an mmap would.
 */
#include "dataset.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"

static void set_err(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (!err || !errlen)
		return;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

/* "(3, 4)", "()" for a field of scalars; used in mismatch messages. */
static void format_shape(char *out, size_t cap, const uint64_t *shape, int ndim)
{
	size_t n = 0;
	int i;

	n += (size_t)snprintf(out, cap, "(");
	for (i = 0; i < ndim && n < cap; i++)
		n += (size_t)snprintf(out + n, cap - n, "%s%llu", i ? ", " : "",
				      (unsigned long long)shape[i]);
	if (n < cap)
		snprintf(out + n, cap - n, ndim == 1 ? ",)" : ")");
}

static void free_fields(struct dataset *ds)
{
	size_t f, k;

	for (f = 0; f < ds->nfields; f++) {
		struct ds_field *field = &ds->fields[f];

		for (k = 0; k < field->nshards; k++) {
			if (field->shards[k].fd >= 0)
				close(field->shards[k].fd);
			free(field->shards[k].path);
		}
		free(field->shards);
		free(field->name);
	}
	free(ds->fields);
	ds->fields = NULL;
	ds->nfields = 0;
	ds->num_samples = 0;
	ds->sample_bytes = 0;
}

/* Opens every shard of decl into field, checking that they agree on dtype
 * and row shape.  Returns 0 or -errno with ds->error set. */
static int load_field(struct dataset *ds, struct ds_field *field, const struct config_field *decl)
{
	struct npy_info info;
	char msg[sizeof(ds->error)];
	size_t k;
	int rc;

	field->name = strdup(decl->name);
	if (!field->name)
		goto nomem;
	if (decl->npaths == 0) {
		set_err(ds->error, sizeof(ds->error), "field '%s' has no files", decl->name);
		return -EINVAL;
	}
	field->shards = calloc(decl->npaths, sizeof(*field->shards));
	if (!field->shards)
		goto nomem;
	/* Count shards as they are created so that free_fields sees only
	 * initialised ones, whatever fails below. */
	for (k = 0; k < decl->npaths; k++) {
		struct ds_shard *shard = &field->shards[k];
		uint64_t first_row = k ? shard[-1].first_row + shard[-1].rows : 0;

		shard->fd = -1;
		field->nshards = k + 1;
		shard->path = strdup(decl->paths[k]);
		if (!shard->path)
			goto nomem;
		rc = npy_open(shard->path, &info, &shard->fd, msg, sizeof(msg));
		if (rc) {
			set_err(ds->error, sizeof(ds->error), "field '%s': %s", decl->name, msg);
			return rc;
		}
		if (k == 0) {
			field->dtype = info.dtype;
			field->itemsize = info.itemsize;
			field->sample_ndim = info.ndim - 1;
			memcpy(field->sample_shape, info.shape + 1,
			       (size_t)field->sample_ndim * sizeof(info.shape[0]));
			field->sample_bytes = info.row_bytes;
		} else if (info.dtype != field->dtype) {
			set_err(ds->error, sizeof(ds->error),
				"field '%s': %s has dtype %s but %s has %s", decl->name,
				shard->path, npy_dtype_name(info.dtype), field->shards[0].path,
				npy_dtype_name(field->dtype));
			return -EINVAL;
		} else if (info.ndim - 1 != field->sample_ndim ||
			   memcmp(info.shape + 1, field->sample_shape,
				  (size_t)field->sample_ndim * sizeof(info.shape[0])) != 0) {
			char have[128], want[128];

			format_shape(have, sizeof(have), info.shape + 1, info.ndim - 1);
			format_shape(want, sizeof(want), field->sample_shape, field->sample_ndim);
			set_err(ds->error, sizeof(ds->error),
				"field '%s': %s has rows of shape %s but %s has %s", decl->name,
				shard->path, have, field->shards[0].path, want);
			return -EINVAL;
		}
		/* Each shard's rows are bounded by INT64_MAX / row_bytes, but
		 * many shards together could still wrap the row count. */
		if (info.rows > UINT64_MAX - first_row) {
			set_err(ds->error, sizeof(ds->error),
				"field '%s': %s: too many rows in all", decl->name, shard->path);
			return -EINVAL;
		}
		shard->first_row = first_row;
		shard->rows = info.rows;
		shard->data_offset = info.data_offset;
	}
	return 0;

nomem:
	set_err(ds->error, sizeof(ds->error), "out of memory");
	return -ENOMEM;
}

static uint64_t field_rows(const struct ds_field *field)
{
	const struct ds_shard *last = &field->shards[field->nshards - 1];

	return last->first_row + last->rows;
}

int ds_load(struct dataset *ds, const struct config_dataset *decl)
{
	size_t f, g;
	int rc;

	memset(ds, 0, sizeof(*ds));
	ds->name = strdup(decl->name ? decl->name : "");
	ds->format = strdup(decl->format ? decl->format : "");
	if (!ds->name || !ds->format) {
		rc = -ENOMEM;
		set_err(ds->error, sizeof(ds->error), "out of memory");
		goto fail;
	}
	if (strcmp(ds->format, "tokens") == 0) {
		rc = -ENOTSUP;
		set_err(ds->error, sizeof(ds->error), "format tokens is not implemented yet");
		goto fail;
	}
	if (strcmp(ds->format, "npy") != 0) {
		rc = -EINVAL;
		set_err(ds->error, sizeof(ds->error),
			"unknown format '%s' (expected npy or tokens)", ds->format);
		goto fail;
	}
	if (decl->nfields == 0) {
		rc = -EINVAL;
		set_err(ds->error, sizeof(ds->error), "no fields (declare field.NAME = PATH)");
		goto fail;
	}

	ds->fields = calloc(decl->nfields, sizeof(*ds->fields));
	if (!ds->fields) {
		rc = -ENOMEM;
		set_err(ds->error, sizeof(ds->error), "out of memory");
		goto fail;
	}
	for (f = 0; f < decl->nfields; f++) {
		ds->nfields = f + 1;
		for (g = 0; g < f; g++) {
			if (strcmp(decl->fields[g].name, decl->fields[f].name) == 0) {
				rc = -EINVAL;
				set_err(ds->error, sizeof(ds->error),
					"field '%s' is declared twice", decl->fields[f].name);
				goto fail;
			}
		}
		rc = load_field(ds, &ds->fields[f], &decl->fields[f]);
		if (rc)
			goto fail;
		if (field_rows(&ds->fields[f]) != field_rows(&ds->fields[0])) {
			rc = -EINVAL;
			set_err(ds->error, sizeof(ds->error),
				"field '%s' has %llu rows but field '%s' has %llu",
				ds->fields[f].name, (unsigned long long)field_rows(&ds->fields[f]),
				ds->fields[0].name, (unsigned long long)field_rows(&ds->fields[0]));
			goto fail;
		}
		if (ds->fields[f].sample_bytes > UINT64_MAX - ds->sample_bytes) {
			rc = -EINVAL;
			set_err(ds->error, sizeof(ds->error), "samples are too large");
			goto fail;
		}
		ds->sample_bytes += ds->fields[f].sample_bytes;
	}
	ds->num_samples = field_rows(&ds->fields[0]);
	/* An empty dataset has no batch to serve, and the order module would
	 * divide by N; refuse it here where the message can name the file. */
	if (ds->num_samples == 0) {
		rc = -EINVAL;
		set_err(ds->error, sizeof(ds->error), "field '%s': %s has 0 rows",
			ds->fields[0].name, ds->fields[0].shards[0].path);
		goto fail;
	}
	return 0;

fail:
	free_fields(ds);
	return rc;
}

void ds_close(struct dataset *ds)
{
	free_fields(ds);
	free(ds->name);
	free(ds->format);
	ds->name = NULL;
	ds->format = NULL;
}

bool ds_check(const struct dataset *ds)
{
	uint64_t bytes = 0;
	size_t f, k;

	if (ds->error[0])
		return ds->nfields == 0 && ds->num_samples == 0;
	if (ds->nfields == 0 || ds->num_samples == 0)
		return false;
	for (f = 0; f < ds->nfields; f++) {
		const struct ds_field *field = &ds->fields[f];

		if (field->nshards == 0 || field->shards[0].first_row != 0)
			return false;
		if (field->sample_ndim < 0 || field->sample_ndim >= NPY_MAX_DIMS)
			return false;
		for (k = 0; k < field->nshards; k++) {
			if (field->shards[k].fd < 0)
				return false;
			if (k && field->shards[k].first_row !=
					 field->shards[k - 1].first_row + field->shards[k - 1].rows)
				return false;
		}
		if (field_rows(field) != ds->num_samples)
			return false;
		bytes += field->sample_bytes;
	}
	return bytes == ds->sample_bytes;
}

/* The shard of field holding row s (s < field_rows). */
static const struct ds_shard *find_shard(const struct ds_field *field, uint64_t s)
{
	size_t lo = 0, hi = field->nshards;

	/* Invariant: shards[lo].first_row <= s < shards[hi].first_row. */
	while (hi - lo > 1) {
		size_t mid = lo + (hi - lo) / 2;

		if (field->shards[mid].first_row <= s)
			lo = mid;
		else
			hi = mid;
	}
	return &field->shards[lo];
}

int ds_read_field(const struct dataset *ds, size_t field_index, const uint64_t *samples, size_t n,
		  uint8_t *dst, char *err, size_t errlen)
{
	const struct ds_field *field;
	size_t i, run;

	if (field_index >= ds->nfields) {
		set_err(err, errlen, "%s: no field %zu (dataset has %zu)", ds->name, field_index,
			ds->nfields);
		return -EINVAL;
	}
	field = &ds->fields[field_index];
	for (i = 0; i < n; i += run) {
		const struct ds_shard *shard;
		uint64_t row, bytes, done = 0;
		off_t off;

		if (samples[i] >= ds->num_samples) {
			set_err(err, errlen, "%s: sample %llu is out of range (dataset has %llu)",
				ds->name, (unsigned long long)samples[i],
				(unsigned long long)ds->num_samples);
			return -ERANGE;
		}
		shard = find_shard(field, samples[i]);
		/* Coalesce a run of consecutive samples that stays in this
		 * shard: sequential order turns a batch into one pread. */
		run = 1;
		while (i + run < n && samples[i + run] == samples[i] + run &&
		       samples[i + run] < shard->first_row + shard->rows)
			run++;
		row = samples[i] - shard->first_row;
		/* Bounded: rows * sample_bytes + data_offset <= INT64_MAX (npy.c). */
		off = (off_t)(shard->data_offset + row * field->sample_bytes);
		bytes = run * field->sample_bytes;
		while (done < bytes) {
			ssize_t r = pread(shard->fd, dst + i * field->sample_bytes + done,
					  (size_t)(bytes - done), off + (off_t)done);

			if (r < 0) {
				int rc = -errno;

				if (rc == -EINTR)
					continue;
				set_err(err, errlen, "%s: read at row %llu: %s", shard->path,
					(unsigned long long)(row + done / field->sample_bytes),
					strerror(-rc));
				return rc;
			}
			if (r == 0) {
				set_err(err, errlen, "%s: short read at row %llu (file truncated?)",
					shard->path,
					(unsigned long long)(row + done / field->sample_bytes));
				return -EIO;
			}
			done += (uint64_t)r;
		}
	}
	return 0;
}
