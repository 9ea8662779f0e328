/*
 * dataset.c — a named dataset: its fields and their .npy shards (or token
 * shards), loaded and checked.  The reads that gather sample rows out of
 * them are dataset_read.c's; this comment says why they work as they do.
 *
 * A field is a list of shards concatenated on axis 0; shard k begins at
 * field row first_row[k].  Sample s of a field lives in the one shard with
 * first_row <= s < first_row + rows, found by binary search.
 *
 * Reads.  With `read = mmap` (the default) every shard is mapped once at
 * load and ds_read_field copies rows out (memcpy, or streaming stores for a
 * slot a copy engine reads next: streamcopy.h): gathering shuffled
 * 4 KiB rows from the page cache then costs page faults only on first touch
 * (fault-around maps up to 64 KiB per fault), never a system call per row,
 * which is what lets ~13 reader threads reach the ~45 GB/s the CUDA bench
 * needs.  No madvise: MADV_RANDOM gains nothing once the file is cached
 * (measured on Linux 6.18: the same minor faults, fault-around still maps
 * 16 pages each) and on a cold cache it turns off read-around, so every miss
 * becomes its own 4 KiB read (a random pass over 256 MiB took 2.0 s against
 * 0.25 s with the default).  Shards whose mmap failed, and every shard with
 * `read = pread`, are read with pread, one call per run of consecutive rows.
 *
 * A file truncated after load must give -EIO naming it, never a crash:
 *  - A row on a page wholly past the new end of the file raises SIGBUS.
 *    on_sigbus, installed process-wide by ds_load, siglongjmp()s back into
 *    copy_mapped when the faulting thread is inside its guarded copy and the
 *    address lies in the mapping being copied; any other SIGBUS is handed
 *    to whatever handled it before (the default: a crash stays a crash).
 *  - A row on the page that holds the new end reads as zeros past it, with
 *    no signal.  So after its copies ds_read_field fstat()s each shard it
 *    read from, once per call, and fails if the file no longer holds the
 *    furthest byte copied from it.
 *
 * Files that are not what they seem.  Every file is opened as a regular
 * file or not at all, never blocking (ds_open_regular); the matches of a shard
 * pattern also follow no symbolic link below the pattern's fixed
 * directories (ds_open_match), since whoever can write there could point one
 * at a file the trainer may not read.  A field's own paths are the
 * operator's and may be links.  Each shard's identity is taken at load
 * (ds_take_id), and ds_files_changed compares it with the file as it is now:
 * a rename over it, a rewrite in place (size, mtime, or failing those the
 * header), its removal.  Those are dataset_files.c's.
 *
 * DESIGN: ds_load and ds_close run on the loop thread (at startup, reload and
 * shutdown).  Between them a dataset is immutable, so the reader threads call
 * ds_read_field concurrently with no lock: mappings are read-only and pread
 * carries its own offset.  ds_files_changed only reads the shard table and
 * asks the kernel, so the loop (at reload) and readers (after a failed read)
 * may call it at once.  The SIGBUS state is dataset_read.c's.
 */
#include "data/dataset_int.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "conf/config.h"
#include "data/direct.h"
#include "base/log.h"
#include "data/tokens.h"
#include "util.h"

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
			struct ds_shard *shard = &field->shards[k];

			if (shard->map)
				munmap((void *)shard->map, (size_t)shard->map_len);
			if (shard->fd >= 0)
				close(shard->fd);
			if (shard->dfd >= 0)
				close(shard->dfd);
			free(shard->path);
		}
		free(field->shards);
		free(field->name);
	}
	free(ds->fields);
	ds->fields = NULL;
	ds->nfields = 0;
	for (k = 0; k < ds->nmatched; k++)
		free(ds->matched[k]);
	free(ds->matched);
	ds->matched = NULL;
	ds->nmatched = 0;
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
		shard->dfd = -1;
		field->nshards = k + 1;
		shard->path = strdup(decl->paths[k]);
		if (!shard->path)
			goto nomem;
		/* Links are followed: a field's files are named one by one by
		 * the operator, unlike the matches of a shard pattern. */
		rc = ds_open_regular(AT_FDCWD, shard->path, true, shard->path, &shard->fd, msg,
				     sizeof(msg));
		if (!rc)
			rc = npy_read_header(shard->fd, shard->path, &info, msg, sizeof(msg));
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
			field->row_stride = info.row_bytes;
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
		rc = ds_take_id(shard, ds->error, sizeof(ds->error));
		if (rc)
			return rc;
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

/* Maps shard for read = mmap, unless rc already says why it cannot be.  A
 * failure is no load error: the shard is read with pread, map_rc says why. */
static void map_shard(struct ds_field *field, struct ds_shard *shard, int rc)
{
	/* The length comes from the header, which npy_open checked against
	 * the file's size.  Mapping what fstat says now could map less if the
	 * file were cut in between, and a copy past the end of a mapping is
	 * a SIGSEGV or someone else's bytes; past the end of the file inside
	 * a mapping, it is a SIGBUS that on_sigbus turns into -EIO. */
	uint64_t len = shard->data_offset + ds_row_end(field, shard->rows - 1, 1);
	void *p;

	if (!rc && len > SIZE_MAX)
		rc = -EFBIG;
	if (!rc) {
		p = mmap(NULL, (size_t)len, PROT_READ, MAP_SHARED, shard->fd, 0);
		if (p == MAP_FAILED)
			rc = -errno;
	}
	shard->map_rc = rc;
	if (rc)
		return;
	shard->map = p;
	shard->map_len = len;
	field->nmapped++;
}

/* read = direct: every shard of field opened again with O_DIRECT, through
 * /proc/self/fd so that it is the very file loaded (a path could have been
 * renamed over since).  A file system that refuses O_DIRECT (tmpfs, some
 * FUSE) leaves the field on pread, which the log says. */
static void open_direct(const struct dataset *ds, struct ds_field *field)
{
	for (size_t k = 0; k < field->nshards; k++) {
		struct ds_shard *shard = &field->shards[k];
		char proc[64];

		snprintf(proc, sizeof(proc), "/proc/self/fd/%d", shard->fd);
		shard->dfd = open(proc, O_RDONLY | O_DIRECT | O_CLOEXEC);
		if (shard->dfd < 0) {
			log_warn("dataset %s: %s cannot be opened with O_DIRECT (%s): field %s is "
				 "read with pread (through the page cache)",
				 ds->name, shard->path, strerror(errno), field->name);
			for (size_t j = 0; j < k; j++) {
				close(field->shards[j].dfd);
				field->shards[j].dfd = -1;
			}
			return;
		}
	}
	field->direct = true;
}

/* Appends shard `path` (a token shard, already known to hold `windows`
 * samples) to field; fd becomes the shard's. */
static int add_token_shard(struct ds_field *field, const char *path, int fd, uint64_t data_offset,
			   uint64_t windows)
{
	/* Read before the realloc, which may free the old array. */
	uint64_t first = field->nshards ? field->shards[field->nshards - 1].first_row +
						  field->shards[field->nshards - 1].rows
					: 0;
	struct ds_shard *grown = realloc(field->shards, (field->nshards + 1) * sizeof(*grown));
	struct ds_shard *shard;

	if (!grown)
		return -ENOMEM;
	field->shards = grown;
	shard = &field->shards[field->nshards];
	memset(shard, 0, sizeof(*shard));
	shard->dfd = -1;
	shard->fd = fd;
	shard->path = strdup(path);
	if (!shard->path)
		return -ENOMEM;
	shard->first_row = first;
	shard->rows = windows;
	shard->data_offset = data_offset;
	field->nshards++;
	return 0;
}

/* Appends path to ds->matched.  0 or -ENOMEM. */
static int add_match(struct dataset *ds, const char *path)
{
	char **grown = realloc(ds->matched, (ds->nmatched + 1) * sizeof(*grown));

	if (!grown)
		return -ENOMEM;
	ds->matched = grown;
	ds->matched[ds->nmatched] = strdup(path);
	if (!ds->matched[ds->nmatched])
		return -ENOMEM;
	ds->nmatched++;
	return 0;
}

/*
 * format = tokens: one field, "tokens", of uint16 windows of seq_len + 1
 * tokens at a stride of seq_len (a window's last token is the next one's
 * first: the target of its last position).  The shards are the files that
 * match each pattern of `shards`, in name order within a pattern; windows
 * never cross shards, so a shard of T tokens holds (T - 1) / seq_len of
 * them, and one too short for a single window adds none.  Every header is
 * checked (tokens.h) and a bad one refuses the dataset, naming the file.
 */
static int load_tokens(struct dataset *ds, const struct config_dataset *decl)
{
	const struct config_field *patterns = &decl->fields[0];
	uint64_t seq = decl->seq_len;
	struct ds_field *field;
	int rc = 0;

	ds->fields = calloc(1, sizeof(*ds->fields));
	if (!ds->fields)
		goto nomem;
	ds->nfields = 1;
	field = &ds->fields[0];
	field->name = strdup("tokens");
	if (!field->name)
		goto nomem;
	field->dtype = NPY_U2;
	field->itemsize = TOKENS_TOKEN_BYTES;
	field->sample_ndim = 1;
	field->sample_shape[0] = seq + 1;
	field->sample_bytes = (seq + 1) * TOKENS_TOKEN_BYTES;
	field->row_stride = seq * TOKENS_TOKEN_BYTES;
	for (size_t p = 0; p < patterns->npaths && !rc; p++) {
		glob_t gl;

		rc = ds_glob_shards(patterns->paths[p], &gl, ds->error, sizeof(ds->error));
		if (rc)
			return rc;
		for (size_t k = 0; k < gl.gl_pathc && !rc; k++) {
			const char *path = gl.gl_pathv[k];
			uint8_t head[TOKENS_HEADER_BYTES];
			struct tokens_header h;
			char msg[200];
			struct stat st;
			ssize_t got;
			int fd = -1;

			rc = add_match(ds, path);
			if (rc) {
				set_err(ds->error, sizeof(ds->error), "out of memory");
				break;
			}
			rc = ds_open_match(patterns->paths[p], path, &fd, ds->error,
					   sizeof(ds->error));
			if (rc)
				break;
			if (fstat(fd, &st) < 0) {
				rc = -errno;
				set_err(ds->error, sizeof(ds->error), "%s: %s", path,
					strerror(-rc));
				close(fd);
				break;
			}
			got = pread(fd, head, sizeof(head), 0);
			if (got < 0) {
				rc = -errno;
				set_err(ds->error, sizeof(ds->error), "%s: read: %s", path,
					strerror(-rc));
				close(fd);
				break;
			}
			rc = tokens_parse_header(head, (size_t)got, (uint64_t)st.st_size, &h, msg,
						 sizeof(msg));
			if (rc) {
				set_err(ds->error, sizeof(ds->error), "%s: %s", path, msg);
				close(fd);
				break;
			}
			if (h.tokens < seq + 1) {
				close(fd); /* not one window: adds nothing */
				continue;
			}
			rc = add_token_shard(field, path, fd, h.data_offset, (h.tokens - 1) / seq);
			if (rc) {
				close(fd);
				set_err(ds->error, sizeof(ds->error), "out of memory");
				break;
			}
			rc = ds_take_id(&field->shards[field->nshards - 1], ds->error,
					sizeof(ds->error));
		}
		globfree(&gl);
	}
	if (rc)
		return rc;
	if (field->nshards == 0) {
		set_err(ds->error, sizeof(ds->error),
			"no shard holds a window of seq_len + 1 = %llu tokens",
			(unsigned long long)(seq + 1));
		return -EINVAL;
	}
	ds->sample_bytes = field->sample_bytes;
	ds->num_samples = field_rows(field);
	return 0;
nomem:
	set_err(ds->error, sizeof(ds->error), "out of memory");
	return -ENOMEM;
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
		rc = load_tokens(ds, decl);
		if (rc)
			goto fail;
		goto map;
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
map:
	if (decl->read == CONFIG_READ_DIRECT)
		for (f = 0; f < ds->nfields; f++)
			open_direct(ds, &ds->fields[f]);
	if (decl->read == CONFIG_READ_MMAP) {
		int map_rc = ds_install_sigbus();

		for (f = 0; f < ds->nfields; f++)
			for (g = 0; g < ds->fields[f].nshards; g++)
				map_shard(&ds->fields[f], &ds->fields[f].shards[g], map_rc);
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
		size_t mapped = 0;

		for (k = 0; k < field->nshards; k++) {
			const struct ds_shard *shard = &field->shards[k];

			if (shard->fd < 0)
				return false;
			if (k && shard->first_row != shard[-1].first_row + shard[-1].rows)
				return false;
			if (shard->map &&
			    (shard->map_rc ||
			     shard->map_len !=
				     shard->data_offset + ds_row_end(field, shard->rows - 1, 1)))
				return false;
			mapped += shard->map != NULL;
		}
		if (mapped != field->nmapped)
			return false;
		for (k = 0; field->direct && k < field->nshards; k++)
			if (field->shards[k].dfd < 0)
				return false;
		if (field_rows(field) != ds->num_samples)
			return false;
		bytes += field->sample_bytes;
	}
	return bytes == ds->sample_bytes;
}
